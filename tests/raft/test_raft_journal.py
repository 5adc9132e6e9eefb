"""DurableJournal and the snapshot codec, on real files (no pysyncobj running).

A "crash" here is opening a second journal on the same directory without closing the
first: only what `sync()` wrote is in the file, exactly as after `kill -9`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raft.errors import JournalCorrupted, SnapshotCorrupted
from raft.journal import JOURNAL_FILE_NAME, META_FILE_NAME, DurableJournal, encode_record
from raft.snapshot import (
    Snapshot,
    align_journal_with_snapshot,
    decode_snapshot,
    encode_snapshot,
)


def _fill(journal: DurableJournal, first: int, last: int, term: int = 1) -> None:
    for index in range(first, last + 1):
        journal.add(f"cmd-{index}".encode(), index, term)


def _indexes(journal: DurableJournal) -> list[int]:
    return [journal[position][1] for position in range(len(journal))]


def test_entries_and_metadata_survive_reopen(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 100)
    journal.sync()
    journal.setCurrentTerm(3, "127.0.0.1:1")
    journal.setRaftCommitIndex(50)
    journal.close()

    reopened = DurableJournal(tmp_path)
    assert _indexes(reopened) == list(range(1, 101))
    assert reopened[99] == (b"cmd-100", 100, 1)
    assert reopened.getCurrentTerm() == 3
    assert reopened.getVotedForNodeId() == "127.0.0.1:1"
    assert reopened.getRaftCommitIndex() == 50
    assert reopened.synced_index == 100
    reopened.close()


def test_only_synced_entries_survive_a_crash(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 10)
    journal.sync()
    _fill(journal, 11, 20)
    assert journal.synced_index == 10 and journal.has_unsynced()
    after_crash = DurableJournal(tmp_path)  # the first one never synced 11..20
    assert _indexes(after_crash) == list(range(1, 11))
    after_crash.close()
    journal.close()


def test_group_commit_is_one_sync_for_many_entries(tmp_path: Path) -> None:
    synced: list[int] = []
    journal = DurableJournal(tmp_path, on_synced=synced.append)
    before = journal.sync_count
    _fill(journal, 1, 1000)
    journal.sync()
    journal.sync()  # nothing new: no second fsync
    assert journal.sync_count == before + 1
    assert synced == [1000]
    journal.close()


def test_torn_tail_is_cut_and_appends_continue(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 5)
    journal.sync()
    journal.close()
    path = tmp_path / JOURNAL_FILE_NAME
    good_size = path.stat().st_size
    torn = encode_record(b"cmd-6", 6, 1)[:-3]  # a record cut short by the crash
    with open(path, "ab") as file:
        file.write(torn)

    reopened = DurableJournal(tmp_path)
    assert _indexes(reopened) == [1, 2, 3, 4, 5]
    assert path.stat().st_size == good_size
    _fill(reopened, 6, 7)
    reopened.sync()
    reopened.close()
    assert _indexes(DurableJournal(tmp_path)) == list(range(1, 8))


def test_checksum_failure_in_last_record_drops_it(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 3)
    journal.sync()
    journal.close()
    path = tmp_path / JOURNAL_FILE_NAME
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert _indexes(DurableJournal(tmp_path)) == [1, 2]


def test_non_contiguous_records_are_corruption(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 2)
    journal.sync()
    journal.close()
    with open(tmp_path / JOURNAL_FILE_NAME, "ab") as file:
        file.write(encode_record(b"cmd-4", 4, 1))
    with pytest.raises(JournalCorrupted, match="contiguous"):
        DurableJournal(tmp_path)


def test_resend_of_held_entries_writes_nothing(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 10)
    journal.sync()
    size = (tmp_path / JOURNAL_FILE_NAME).stat().st_size
    syncs = journal.sync_count
    # What pysyncobj does on an overlapping AppendEntries: delete after prev, re-add.
    journal.deleteEntriesFrom(5)
    assert len(journal) == 5  # pysyncobj's view shrinks at once
    _fill(journal, 6, 10)
    assert not journal.has_unsynced()
    journal.sync()
    assert journal.sync_count == syncs
    assert (tmp_path / JOURNAL_FILE_NAME).stat().st_size == size
    assert _indexes(journal) == list(range(1, 11))
    journal.close()


def test_conflicting_entry_truncates_for_real(tmp_path: Path) -> None:
    truncated_from: list[int] = []
    journal = DurableJournal(tmp_path, before_truncate=truncated_from.append)
    _fill(journal, 1, 10, term=1)
    journal.sync()
    journal.deleteEntriesFrom(5)
    _fill(journal, 6, 7, term=1)  # identical so far
    journal.add(b"new-leader", 8, 2)  # a different entry at index 8: conflict
    assert truncated_from == [8]
    assert journal.has_unsynced()
    assert journal.synced_index == 7
    journal.sync()
    journal.close()
    reopened = DurableJournal(tmp_path)
    assert _indexes(reopened) == list(range(1, 9))
    assert reopened[7] == (b"new-leader", 8, 2)
    reopened.close()


def test_refused_truncation_leaves_the_journal_unchanged(tmp_path: Path) -> None:
    def refuse(index: int) -> None:
        raise RuntimeError(f"refused at {index}")

    journal = DurableJournal(tmp_path, before_truncate=refuse)
    _fill(journal, 1, 4)
    journal.sync()
    journal.deleteEntriesFrom(2)
    with pytest.raises(RuntimeError, match="refused at 3"):
        journal.add(b"other", 3, 2)
    journal.close()
    assert _indexes(DurableJournal(tmp_path)) == [1, 2, 3, 4]


def test_compaction_replaces_the_file_atomically(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 50)
    journal.sync()
    _fill(journal, 51, 60)  # unsynced entries are carried into the new file
    journal.deleteEntriesTo(40)
    assert _indexes(journal) == list(range(41, 61))
    assert journal.synced_index == 60
    assert not (tmp_path / (JOURNAL_FILE_NAME + ".tmp")).exists()
    after_crash = DurableJournal(tmp_path)
    assert _indexes(after_crash) == list(range(41, 61))
    after_crash.close()
    journal.close()


def test_corrupt_metadata_refuses_to_open(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    journal.setCurrentTerm(7, None)
    journal.close()
    path = tmp_path / META_FILE_NAME
    document = json.loads(path.read_text())
    document["body"]["current_term"] = 8  # checksum no longer matches
    path.write_text(json.dumps(document))
    with pytest.raises(JournalCorrupted, match="checksum"):
        DurableJournal(tmp_path)


def test_snapshot_codec_round_trip_and_corruption() -> None:
    last = (b"last", 10, 3)
    prev = (b"prev", 9, 3)
    blob = encode_snapshot(last, prev, ("127.0.0.1:1", "127.0.0.1:2"), b"\x00app state\xff")
    assert decode_snapshot(blob) == Snapshot(
        10, 3, last, prev, ("127.0.0.1:1", "127.0.0.1:2"), b"\x00app state\xff"
    )
    assert b"pickle" not in blob and blob.startswith(b"RWSNAP")
    for position in (0, 20, len(blob) // 2, len(blob) - 1):
        damaged = bytearray(blob)
        damaged[position] ^= 0x01
        with pytest.raises(SnapshotCorrupted):
            decode_snapshot(bytes(damaged))
    with pytest.raises(SnapshotCorrupted):
        decode_snapshot(blob[:-7])
    with pytest.raises(TypeError):
        encode_snapshot(last, prev, (), "not bytes")  # type: ignore[arg-type]


def test_align_keeps_entries_after_a_snapshot_whose_compaction_was_lost(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 20)
    journal.sync()
    snapshot = Snapshot(10, 1, journal[9], journal[8], (), b"state")
    align_journal_with_snapshot(journal, snapshot)
    # pysyncobj keeps a journal whose first two entries are the snapshot's (prev, last).
    assert journal[0] == snapshot.prev_entry and journal[1] == snapshot.last_entry
    assert _indexes(journal) == list(range(9, 21))
    journal.close()
    assert _indexes(DurableJournal(tmp_path)) == list(range(9, 21))


def test_align_leaves_a_journal_the_snapshot_does_not_match(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 8)
    journal.sync()
    ahead = Snapshot(10, 1, (b"x", 10, 1), (b"y", 9, 1), (), b"")
    align_journal_with_snapshot(journal, ahead)
    other_term = Snapshot(5, 2, (b"cmd-5", 5, 2), (b"cmd-4", 4, 2), (), b"")
    align_journal_with_snapshot(journal, other_term)
    assert _indexes(journal) == list(range(1, 9))
    journal.close()
