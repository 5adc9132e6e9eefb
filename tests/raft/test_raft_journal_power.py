"""DurableJournal across power cuts (issue 34, item 4): a torn last record, and directory
entries lost because the crash came before the directory fsync.

The power-cut tests run the journal on a PowerFS mount (raftwal/chaos/powerfs.py), which
drops every byte and directory entry not fsynced when `crash()` is called; the "node" is
dead by then (the journal's file descriptor is closed without a final sync, as SIGKILL
would). They skip only where FUSE cannot be mounted. The torn-record tests write the
damaged file directly, as a disk that persisted part of a write would leave it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import raft.journal
from raft.journal import JOURNAL_FILE_NAME, META_FILE_NAME, DurableJournal, encode_record
from raft.snapshot import remove_stale_temp_files
from raftwal.chaos.powerfs import PowerMount, fuse_unavailable, is_mounted

_UNAVAILABLE = fuse_unavailable()
needs_fuse = pytest.mark.skipif(bool(_UNAVAILABLE), reason=f"FUSE cannot mount: {_UNAVAILABLE}")


@pytest.fixture
def power(tmp_path: Path) -> Iterator[tuple[PowerMount, Path]]:
    mount = PowerMount(tmp_path / "backing", tmp_path / "data", tmp_path / "powerfs.log")
    mount.start()
    try:
        yield mount, tmp_path / "data"
    finally:
        mount.close()
        assert not is_mounted(tmp_path / "data")


def _fill(journal: DurableJournal, first: int, last: int, term: int = 1) -> None:
    for index in range(first, last + 1):
        journal.add(f"cmd-{index}".encode(), index, term)


def _indexes(journal: DurableJournal) -> list[int]:
    return [journal[position][1] for position in range(len(journal))]


def _kill(journal: DurableJournal) -> None:
    """What SIGKILL does to the journal: its descriptor closes, nothing more is written."""
    os.close(journal._fd)
    journal._closed = True


def _written_not_synced(
    journal: DurableJournal, first: int, last: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries written to the file, the crash before their fdatasync."""
    _fill(journal, first, last)
    with monkeypatch.context() as patched:
        patched.setattr(os, "fdatasync", lambda _fd: None)
        journal.sync()


def _indexes_after_reopen(directory: Path) -> list[int]:
    journal = _reopen(directory)
    try:
        return _indexes(journal)
    finally:
        journal.close()


def _reopen(directory: Path) -> DurableJournal:
    # The peer removes stale temp files before it opens the journal (raft/peer.py).
    remove_stale_temp_files(directory)
    return DurableJournal(directory)


@needs_fuse
def test_a_new_journal_directory_survives_a_power_cut(
    power: tuple[PowerMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mount, data_dir = power
    # As raft/peer.py does: mkdir, no fsync of the parent.
    (data_dir / "raft").mkdir(mode=0o700)
    journal = DurableJournal(data_dir / "raft")
    _fill(journal, 1, 10)
    journal.sync()  # acknowledged from here on
    journal.setCurrentTerm(5, "127.0.0.1:2")  # a vote sent
    _written_not_synced(journal, 11, 15, monkeypatch)  # never acknowledged
    _kill(journal)
    result = mount.crash()
    assert result.bytes_dropped > 0
    # Without the parent fsync on open, the whole raft/ directory vanished here.
    assert (data_dir / "raft").is_dir(), "the journal's directory was lost in the power cut"
    reopened = _reopen(data_dir / "raft")
    assert _indexes(reopened) == list(range(1, 11))
    assert reopened.getCurrentTerm() == 5
    assert reopened.getVotedForNodeId() == "127.0.0.1:2"
    reopened.close()


@needs_fuse
def test_a_meta_rename_whose_directory_entry_was_lost(
    power: tuple[PowerMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mount, data_dir = power
    (data_dir / "raft").mkdir(mode=0o700)
    journal = DurableJournal(data_dir / "raft")
    _fill(journal, 1, 5)
    journal.sync()
    journal.setCurrentTerm(5, "127.0.0.1:2")
    # The crash comes after journal.meta.tmp was renamed into place, before the directory
    # fsync: the new term never left the node (setCurrentTerm had not returned).
    monkeypatch.setattr(raft.journal, "fsync_directory", lambda _directory: None)
    journal.setCurrentTerm(6, "127.0.0.1:3")
    _kill(journal)
    mount.crash()
    monkeypatch.undo()
    assert sorted(os.listdir(data_dir / "raft")) == [JOURNAL_FILE_NAME, META_FILE_NAME]
    reopened = _reopen(data_dir / "raft")
    assert reopened.getCurrentTerm() == 5
    assert reopened.getVotedForNodeId() == "127.0.0.1:2"
    assert _indexes(reopened) == list(range(1, 6))
    # And it goes on: the next term change is durable.
    reopened.setCurrentTerm(6, "127.0.0.1:3")
    _kill(reopened)
    mount.crash()
    again = _reopen(data_dir / "raft")
    assert again.getCurrentTerm() == 6
    again.close()


@needs_fuse
def test_the_first_meta_and_journal_files_whose_entries_were_lost(
    power: tuple[PowerMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mount, data_dir = power
    (data_dir / "raft").mkdir(mode=0o700)
    # The crash comes before any directory fsync of the new journal: journal.log and
    # journal.meta were renamed into place (their data synced), their names were not.
    monkeypatch.setattr(raft.journal, "fsync_directory", lambda _directory: None)
    journal = DurableJournal(data_dir / "raft")
    journal.setCurrentTerm(1, None)
    _kill(journal)
    mount.crash()
    monkeypatch.undo()
    assert not (data_dir / "raft").exists() or os.listdir(data_dir / "raft") == []
    (data_dir / "raft").mkdir(mode=0o700, exist_ok=True)
    reopened = _reopen(data_dir / "raft")
    assert len(reopened) == 0 and reopened.getCurrentTerm() == 0
    _fill(reopened, 1, 3)
    reopened.sync()
    _kill(reopened)
    mount.crash()
    assert _indexes_after_reopen(data_dir / "raft") == [1, 2, 3]


@needs_fuse
def test_a_compaction_whose_rename_was_lost_keeps_the_old_journal(
    power: tuple[PowerMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mount, data_dir = power
    (data_dir / "raft").mkdir(mode=0o700)
    journal = DurableJournal(data_dir / "raft")
    _fill(journal, 1, 50)
    journal.sync()
    monkeypatch.setattr(raft.journal, "fsync_directory", lambda _directory: None)
    journal.compact_to(40)
    assert _indexes(journal) == list(range(41, 51))
    _kill(journal)
    mount.crash()
    monkeypatch.undo()
    # The old file is back, whole: a superset that the snapshot alignment trims later.
    reopened = _reopen(data_dir / "raft")
    assert _indexes(reopened) == list(range(1, 51))
    assert not (data_dir / "raft" / (JOURNAL_FILE_NAME + ".tmp")).exists()
    reopened.close()


@needs_fuse
def test_unsynced_appends_are_dropped_and_synced_ones_kept(
    power: tuple[PowerMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mount, data_dir = power
    (data_dir / "raft").mkdir(mode=0o700)
    journal = DurableJournal(data_dir / "raft")
    for batch in range(5):
        _fill(journal, batch * 10 + 1, batch * 10 + 10)
        journal.sync()
    _written_not_synced(journal, 51, 60, monkeypatch)
    _kill(journal)
    assert mount.crash().bytes_dropped > 0
    reopened = _reopen(data_dir / "raft")
    assert _indexes(reopened) == list(range(1, 51))
    # Appends continue right after the last durable record.
    _fill(reopened, 51, 52)
    reopened.sync()
    _kill(reopened)
    mount.crash()
    assert _indexes_after_reopen(data_dir / "raft") == list(range(1, 53))


def _journal_with(tmp_path: Path, last: int) -> Path:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, last)
    journal.sync()
    journal.close()
    return tmp_path / JOURNAL_FILE_NAME


@pytest.mark.parametrize(
    "tear",
    [
        "header-cut",  # the last record's length/crc header only partly on disk
        "payload-cut",  # header whole, payload cut short
        "zero-filled",  # the size grew but the data blocks never arrived (zeros)
        "zero-filled-beyond",  # whole record lost as zeros, and a further zero page
        "garbage-length",  # a length pointing far past the end of the file
    ],
)
def test_a_torn_last_record_is_cut_and_the_journal_goes_on(tmp_path: Path, tear: str) -> None:
    path = _journal_with(tmp_path, 5)
    good = path.read_bytes()
    record = encode_record(b"cmd-6", 6, 1)
    torn = {
        "header-cut": record[:5],
        "payload-cut": record[: len(record) - 4],
        "zero-filled": bytes(len(record)),
        "zero-filled-beyond": bytes(len(record) + 4096),
        "garbage-length": b"\xff\xff\xff\x7f" + record[4:],
    }[tear]
    path.write_bytes(good + torn)
    reopened = DurableJournal(tmp_path)
    assert _indexes(reopened) == [1, 2, 3, 4, 5]
    assert path.read_bytes() == good  # cut off durably before anything is appended
    _fill(reopened, 6, 8)
    reopened.sync()
    reopened.close()
    assert _indexes(DurableJournal(tmp_path)) == list(range(1, 9))


@needs_fuse
def test_a_journal_reopened_after_a_kill_syncs_what_its_writer_never_synced(
    power: tuple[PowerMount, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer killed between a write and its fdatasync reads the records back from the
    page cache when it restarts, and takes them as durable: it acknowledges them to a
    leader. They used to stay unsynced, so a power cut soon after lost records this peer
    had acknowledged. Reopening now syncs them."""
    mount, data_dir = power
    (data_dir / "raft").mkdir(mode=0o700)
    journal = DurableJournal(data_dir / "raft")
    _fill(journal, 1, 10)
    journal.sync()
    _written_not_synced(journal, 11, 20, monkeypatch)
    _kill(journal)
    reopened = _reopen(data_dir / "raft")  # the page cache still holds 11..20
    assert _indexes(reopened) == list(range(1, 21))
    assert reopened.synced_index == 20  # what it would acknowledge
    _kill(reopened)
    mount.crash()
    assert _indexes_after_reopen(data_dir / "raft") == list(range(1, 21))
