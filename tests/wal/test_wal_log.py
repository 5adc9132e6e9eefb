"""`PChannelLog`, one pchannel's log on one node: appends and reopen, the fenced term, Raft
log matching (gap, term mismatch, resend, divergent suffix), the committed-LSN floor of
truncation, the segment roll after a seal marker, recovery (mid-file corruption vs torn
tail) and bounded reads. Every test checks what is read back, from the log and from the
segment files themselves, not just that nothing raised."""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path

import pytest

from wal_segments.catalog import Catalog
from wal_segments.format import (
    ENTRY_HEADER_SIZE,
    Entry,
    EntryFlags,
    MsgType,
    crc32c,
    encode_batch,
)
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import (
    ORPHAN_SUFFIX,
    AppendResult,
    BadBatch,
    Fenced,
    LogError,
    Mismatch,
    PChannelLog,
)
from wal_segments.segment import (
    SegmentCorrupted,
    SegmentReader,
    SegmentWriter,
    list_segment_files,
    open_segment,
    read_unsealed,
    segment_file_name,
)

PCHANNEL = "p_log"

# -- builders -------------------------------------------------------------------------------


def tick_of(lsn: int, term: int) -> int:
    """Time ticks strictly increasing along any log these tests build (terms stay < 10)."""
    return 10 * lsn + term


def payload_of(lsn: int, term: int) -> bytes:
    # Varying sizes, and content that says which (lsn, term) wrote it.
    return f"{lsn}@{term};".encode() * (1 + (lsn * 7) % 5)


def entry(lsn: int, term: int, *, seal: bool = False) -> Entry:
    if seal:
        return Entry(
            lsn=lsn,
            term=term,
            time_tick=tick_of(lsn, term),
            msg_type=int(MsgType.SEAL),
            flags=int(EntryFlags.SEAL_MARKER),
        )
    return Entry(
        lsn=lsn,
        term=term,
        time_tick=tick_of(lsn, term),
        msg_type=int(MsgType.MESSAGE),
        vchannel_id=1,
        payload=payload_of(lsn, term),
    )


def run(first: int, last: int, term: int, *, seal_at: tuple[int, ...] = ()) -> list[Entry]:
    return [entry(lsn, term, seal=lsn in seal_at) for lsn in range(first, last + 1)]


def frames_of(entries: list[Entry]) -> bytes:
    return encode_batch(entries).data


def view(entries: list[Entry]) -> list[tuple[int, int, bytes, int]]:
    return [(e.lsn, e.term, e.payload, e.flags) for e in entries]


def log_view(log: PChannelLog) -> list[tuple[int, int, bytes, int]]:
    return view(list(log.iter_entries(log.first_lsn, log.last_lsn)))


def disk_view(directory: Path) -> list[tuple[int, int, bytes, int]]:
    """The entries of every segment file, read by the segment layer, not by the log."""
    found: list[Entry] = []
    for _, path in list_segment_files(directory):
        if open_segment(path, repair=False).sealed:
            with SegmentReader.open(path) as reader:
                found.extend(reader.entries())
        else:
            found.extend(read_unsealed(path))
    return view(found)


def segment_firsts(directory: Path) -> list[int]:
    return [first for first, _ in list_segment_files(directory)]


class Node:
    """A log and its catalog under `root`, reopened the way a restarted node opens them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.directory = root / "segments"
        self.log: PChannelLog | None = None

    async def open(self) -> PChannelLog:
        catalog = Catalog(self.root / "catalog.db")
        try:
            self.log = await PChannelLog.open(
                self.directory, PCHANNEL, catalog, parse_fsync_policy("always")
            )
        except BaseException:
            catalog.close()
            raise
        return self.log

    async def close(self) -> None:
        if self.log is not None:
            await self.log.close()
            self.log.catalog.close()
            self.log = None

    async def reopen(self) -> PChannelLog:
        await self.close()
        return await self.open()


@pytest.fixture
async def node(tmp_path: Path):
    node = Node(tmp_path)
    await node.open()
    yield node
    await node.close()


async def append(log: PChannelLog, term: int, prev_lsn: int, prev_term: int, entries: list[Entry]):
    """Append and wait durable; after a seal marker also wait for the background seal, so
    that the tests below see the sealed segment (the seal itself is tested on its own)."""
    result = await log.append(term, prev_lsn, prev_term, frames_of(entries))
    await log.wait_durable(result)
    if result.sealed:
        await log.wait_sealed()
    return result


async def fill(log: PChannelLog, batches: list[list[Entry]]) -> list[AppendResult]:
    """Append each batch after the log's end, at the batch's highest term."""
    results = []
    for batch in batches:
        prev_lsn = batch[0].lsn - 1
        results.append(await append(log, batch[-1].term, prev_lsn, log.term_at(prev_lsn), batch))
    return results


# -- append and reopen ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batch_sizes",
    [
        pytest.param([1] * 12, id="one-entry-batches"),
        pytest.param([3, 1, 5, 3], id="mixed-batches"),
        pytest.param([12], id="one-batch-two-terms"),
    ],
)
async def test_append_contiguous_batches_then_reopen(node: Node, batch_sizes: list[int]):
    log = node.log
    assert log is not None
    # lsn 1..9 at term 1, 10..12 at term 2 (a batch may straddle the term change).
    everything = run(1, 9, 1) + run(10, 12, 2)
    batches, start = [], 0
    for size in batch_sizes:
        batches.append(everything[start : start + size])
        start += size
    results = await fill(log, batches)
    assert [r.last_lsn for r in results] == list(itertools.accumulate(batch_sizes))
    for result in results:
        assert result.writer is not None and result.writer.durable_offset >= result.sync_offset
    assert (log.fenced_term, log.last_lsn, log.last_term) == (2, 12, 2)
    await log.fence(3)

    async def check(log: PChannelLog) -> None:
        assert log_view(log) == view(everything)
        assert disk_view(node.directory) == view(everything)
        position = log.position()
        assert (position.last_lsn, position.last_term, position.last_time_tick) == (
            12,
            2,
            tick_of(12, 2),
        )
        assert [log.term_at(lsn) for lsn in range(0, 13)] == [0] + [1] * 9 + [2] * 3
        assert log.first_lsn_of_term(2, 12) == 10
        assert log.first_lsn_of_term(1, 12) == 1
        assert [log.last_lsn_of_term_at_most(t) for t in (0, 1, 2, 3)] == [0, 9, 12, 12]
        assert log.fenced_term == 3
        assert segment_firsts(node.directory) == [1]

    await check(log)
    log = await node.reopen()
    await check(log)
    # The fence survived the restart, and the log continues where it ended.
    with pytest.raises(Fenced) as raised:
        await append(log, 2, 12, 2, run(13, 13, 2))
    assert (raised.value.term, raised.value.fenced_term) == (2, 3)
    await append(log, 3, 12, 2, run(13, 14, 3))
    log = await node.reopen()
    assert log_view(log) == view(everything + run(13, 14, 3))
    assert (log.last_lsn, log.last_term, log.fenced_term) == (14, 3, 3)


async def test_append_local_continues_the_log_and_checks_its_rules(node: Node):
    log = node.log
    assert log is not None
    first = encode_batch(run(1, 3, 1))
    result = await log.append_local(first.data, first.meta, 1)
    await log.wait_durable(result)
    assert (result.last_lsn, log.last_lsn, log.fenced_term) == (3, 3, 1)
    # Not the next lsn, below the fence, time tick not increasing, seal marker not last.
    gap = encode_batch(run(5, 5, 1))
    with pytest.raises(BadBatch, match="expected 4"):
        await log.append_local(gap.data, gap.meta, 1)
    await log.fence(2)
    stale = encode_batch(run(4, 4, 1))
    with pytest.raises(Fenced):
        await log.append_local(stale.data, stale.meta, 1)
    old_tick = encode_batch([Entry(lsn=4, term=2, time_tick=5, msg_type=int(MsgType.MESSAGE))])
    with pytest.raises(BadBatch, match="time tick"):
        await log.append_local(old_tick.data, old_tick.meta, 2)
    seal_inside = encode_batch(run(4, 6, 2, seal_at=(5,)))
    with pytest.raises(BadBatch, match="seal marker"):
        await log.append_local(seal_inside.data, seal_inside.meta, 2)
    assert log_view(log) == view(run(1, 3, 1))
    assert disk_view(node.directory) == view(run(1, 3, 1))
    sealed = encode_batch(run(4, 6, 2, seal_at=(6,)))
    result = await log.append_local(sealed.data, sealed.meta, 2)
    assert result.sealed and result.after is not None
    await log.wait_durable(result)
    assert log.open_segment_first_lsn() is None
    assert log_view(log) == view(run(1, 3, 1) + run(4, 6, 2, seal_at=(6,)))


async def test_replicated_batch_with_a_seal_marker_inside_is_refused(node: Node):
    """The seal rule on the replica's path: scan_batch records the flagged rows in its one
    pass, and append refuses a marker anywhere but on the last entry (with and without a
    batch crc, and for a BatchMeta that carries no seal rows, which is walked)."""
    log = node.log
    assert log is not None
    await append(log, 1, 0, 0, run(1, 3, 1))
    for seal_at in ((4,), (5,), (4, 6), (4, 5, 6)):
        frames = frames_of(run(4, 6, 1, seal_at=seal_at))
        for batch_crc in (None, crc32c(frames)):
            with pytest.raises(BadBatch, match="a seal marker must be the last entry"):
                await log.append(1, 3, 1, frames, batch_crc=batch_crc)
        batch = encode_batch(run(4, 6, 1, seal_at=seal_at))
        unrecorded = dataclasses.replace(batch.meta, seal_rows=None)
        with pytest.raises(BadBatch, match="a seal marker must be the last entry"):
            await log.append(1, 3, 1, batch.data, unrecorded)
    assert log_view(log) == view(run(1, 3, 1))
    assert disk_view(node.directory) == view(run(1, 3, 1))
    assert log.open_segment_first_lsn() == 1
    # A marker on the last entry is the rule: the segment rolls after it.
    frames = frames_of(run(4, 6, 1, seal_at=(6,)))
    result = await log.append(1, 3, 1, frames, batch_crc=crc32c(frames))
    assert result.sealed
    await log.wait_durable(result)
    await log.wait_sealed()
    assert log.open_segment_first_lsn() is None
    await append(log, 1, 6, 1, run(7, 7, 1))
    assert log_view(log) == view(run(1, 6, 1, seal_at=(6,)) + run(7, 7, 1))
    assert disk_view(node.directory) == view(run(1, 6, 1, seal_at=(6,)) + run(7, 7, 1))


# -- fencing ----------------------------------------------------------------------------------

# (operation, term, expected error's fenced_term or None, fenced term afterwards)
FENCE_STEPS = {
    "append below the fence": [("fence", 5, None, 5), ("append", 4, 5, 5)],
    "fence below the fence": [("fence", 5, None, 5), ("fence", 4, 5, 5)],
    "fence again is idempotent": [("fence", 5, None, 5), ("fence", 5, None, 5)],
    "fence goes up": [("fence", 5, None, 5), ("fence", 6, None, 6), ("append", 5, 6, 6)],
    "append above the fence raises it": [
        ("fence", 2, None, 2),
        ("append", 4, None, 4),
        ("fence", 3, 4, 4),
    ],
    "append at the fence": [("fence", 5, None, 5), ("append", 5, None, 5)],
}


@pytest.mark.parametrize("steps", list(FENCE_STEPS.values()), ids=list(FENCE_STEPS))
async def test_fencing(node: Node, steps):
    log = node.log
    assert log is not None
    await fill(log, [run(1, 3, 1)])
    expected = run(1, 3, 1)
    for operation, term, fenced_error, fenced_after in steps:
        if operation == "fence":
            call = log.fence(term)
        else:
            batch = run(log.last_lsn + 1, log.last_lsn + 2, term)
            call = append(log, term, log.last_lsn, log.last_term, batch)
        if fenced_error is None:
            outcome = await call
            if operation == "fence":
                assert (outcome.last_lsn, outcome.last_term) == (
                    expected[-1].lsn,
                    expected[-1].term,
                )
            else:
                expected += batch
        else:
            with pytest.raises(Fenced) as raised:
                await call
            assert (raised.value.term, raised.value.fenced_term) == (term, fenced_error)
        assert log.fenced_term == fenced_after
        assert log.catalog.fenced_term(PCHANNEL) == fenced_after
        assert log_view(log) == view(expected)
    log = await node.reopen()
    assert log.fenced_term == steps[-1][3]
    assert log_view(log) == view(expected)


# -- log matching -----------------------------------------------------------------------------

#: lsn 1..3 at term 1, 4..6 at term 2, 7..8 at term 4
MATCHING_LOG = [run(1, 3, 1), run(4, 6, 2), run(7, 8, 4)]

# (prev_lsn, prev_term, conflict_term, conflict_first_lsn)
MISMATCHES = {
    "gap one past the end": (9, 4, 4, 7),
    "gap far past the end": (20, 5, 4, 7),
    "gap with an older prev_term": (10, 2, 4, 7),
    "prev_term lower at a term-2 entry": (5, 1, 2, 4),
    "prev_term higher at a term-2 entry": (6, 3, 2, 4),
    "prev_term wrong at the first lsn": (1, 2, 1, 1),
    "prev_term wrong at the last lsn": (8, 3, 4, 7),
    "prev_term wrong at a term's first lsn": (7, 3, 4, 7),
}


@pytest.mark.parametrize("case", list(MISMATCHES.values()), ids=list(MISMATCHES))
async def test_mismatch_carries_the_back_up_hint(node: Node, case):
    prev_lsn, prev_term, conflict_term, conflict_first = case
    log = node.log
    assert log is not None
    await fill(log, MATCHING_LOG)
    before = log_view(log)
    files_before = {p.name: p.read_bytes() for _, p in list_segment_files(node.directory)}
    with pytest.raises(Mismatch) as raised:
        await append(log, 5, prev_lsn, prev_term, run(prev_lsn + 1, prev_lsn + 2, 5))
    assert (raised.value.conflict_term, raised.value.conflict_first_lsn) == (
        conflict_term,
        conflict_first,
    )
    assert log_view(log) == before
    assert {p.name: p.read_bytes() for _, p in list_segment_files(node.directory)} == files_before
    # The hint leads the owner to a prev that matches: retrying from there succeeds.
    retry_prev = conflict_first - 1
    retry = [e for batch in MATCHING_LOG for e in batch if e.lsn > retry_prev]
    result = await append(log, 5, retry_prev, log.term_at(retry_prev), retry)
    assert result.last_lsn == 8
    assert log_view(log) == before


async def test_mismatch_on_an_empty_log(node: Node):
    log = node.log
    assert log is not None
    with pytest.raises(Mismatch) as raised:
        await append(log, 1, 3, 1, run(4, 4, 1))
    assert (raised.value.conflict_term, raised.value.conflict_first_lsn) == (0, 1)
    assert (log.last_lsn, segment_firsts(node.directory)) == (0, [])


@pytest.mark.parametrize(
    "name, prev_lsn, resent, log_after",
    [
        ("same batch again", 3, run(4, 6, 2), MATCHING_LOG),
        ("prefix of a batch", 3, run(4, 5, 2), MATCHING_LOG),
        ("whole log", 0, run(1, 3, 1) + run(4, 6, 2) + run(7, 8, 4), MATCHING_LOG),
        ("old batch while the log is longer", 1, run(2, 3, 1), MATCHING_LOG),
        (
            "overlap then new entries",
            6,
            run(7, 8, 4) + run(9, 11, 4),
            [*MATCHING_LOG, run(9, 11, 4)],
        ),
    ],
)
async def test_resend_is_skipped(node: Node, name, prev_lsn, resent, log_after):
    log = node.log
    assert log is not None
    await fill(log, MATCHING_LOG)
    sizes_before = {p.name: p.stat().st_size for _, p in list_segment_files(node.directory)}
    result = await append(log, 4, prev_lsn, log.term_at(prev_lsn), resent)
    expected = view([e for batch in log_after for e in batch])
    assert log_view(log) == expected
    assert disk_view(node.directory) == expected  # no duplicate frame in the file
    assert expected[-1][0] == log.last_lsn
    # What matches the sender ends with its batch, whatever this log holds after it (a
    # replica must never report a suffix the sender did not send as durable).
    assert result.last_lsn == resent[-1].lsn
    await log.wait_durable(result)
    if log_after is MATCHING_LOG:
        sizes_after = {p.name: p.stat().st_size for _, p in list_segment_files(node.directory)}
        assert sizes_after == sizes_before
    log = await node.reopen()
    assert log_view(log) == expected


async def check_resend_reports_its_batch_end(node: Node) -> None:
    """A resend of entries this log holds is durable up to the resent batch's end, not
    to this log's end: what lies beyond may be a suffix the sender never wrote. (With the
    fence a heartbeat raises, no such suffix can appear behind a newer owner's back:
    `check_heartbeat_fences`; this rule is the other layer.)"""
    log = node.log
    assert log is not None
    await fill(log, MATCHING_LOG)
    result = await append(log, 4, 3, 1, run(4, 6, 2))
    assert (result.last_lsn, log.last_lsn) == (6, 8)


async def test_a_resend_is_durable_to_its_own_end(node: Node):
    await check_resend_reports_its_batch_end(node)


async def check_heartbeat_fences(node: Node) -> None:
    """A newer owner's heartbeat raises the fence whether the log matches or not (Raft's
    term rule), durably: once the newer owner has an answer from this log, a deposed
    owner's request held up in the network cannot extend it behind the newer owner's
    back."""
    log = node.log
    assert log is not None
    await fill(log, [run(1, 3, 1)])
    # The newer owner's first probe, past this log's end: a mismatch, and fenced.
    with pytest.raises(Mismatch):
        await log.heartbeat(2, 9, 2)
    assert (log.fenced_term, log.catalog.fenced_term(PCHANNEL)) == (2, 2)
    # The deposed owner's append, sent before and delivered now, is refused.
    with pytest.raises(Fenced) as raised:
        await append(log, 1, 3, 1, run(4, 6, 1))
    assert (raised.value.term, raised.value.fenced_term) == (1, 2)
    # A matching heartbeat of a newer term still raises it; an older one is refused.
    await log.heartbeat(3, 3, 1)
    assert log.fenced_term == 3
    with pytest.raises(Fenced):
        await log.heartbeat(2, 3, 1)
    log = await node.reopen()
    assert log.fenced_term == 3
    assert log_view(log) == view(run(1, 3, 1))


async def test_a_heartbeat_raises_the_fence(node: Node):
    await check_heartbeat_fences(node)


# -- divergent suffix -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, prev_lsn, sent, expected_after",
    [
        ("shorter replacement", 5, run(6, 8, 2), run(1, 5, 1) + run(6, 8, 2)),
        ("same length", 5, run(6, 10, 2), run(1, 5, 1) + run(6, 10, 2)),
        ("longer replacement", 5, run(6, 13, 2), run(1, 5, 1) + run(6, 13, 2)),
        (
            "matching prefix then conflict",
            3,
            run(4, 5, 1) + run(6, 8, 2),
            run(1, 5, 1) + run(6, 8, 2),
        ),
    ],
)
async def test_divergent_suffix_is_replaced(node: Node, name, prev_lsn, sent, expected_after):
    log = node.log
    assert log is not None
    await fill(log, [run(1, 5, 1), run(6, 10, 1)])
    result = await append(log, 2, prev_lsn, 1, sent)
    assert result.last_lsn == expected_after[-1].lsn
    assert log_view(log) == view(expected_after)
    assert disk_view(node.directory) == view(expected_after)
    assert (log.last_lsn, log.last_term) == (expected_after[-1].lsn, 2)
    assert log.position().last_time_tick == expected_after[-1].time_tick
    log = await node.reopen()
    assert log_view(log) == view(expected_after)
    # The log keeps working at the new term.
    next_lsn = log.last_lsn + 1
    await append(log, 2, log.last_lsn, 2, run(next_lsn, next_lsn + 1, 2))
    assert log_view(log) == view(expected_after + run(next_lsn, next_lsn + 1, 2))


@pytest.mark.parametrize(
    "name, operation, refused, expected_after",
    [
        ("append conflicting below committed", ("append", 5), True, run(1, 10, 1)),
        ("truncate below committed", ("truncate", 6), True, run(1, 10, 1)),
        ("truncate far below committed", ("truncate", 0), True, run(1, 10, 1)),
        ("truncate at committed", ("truncate", 7), False, run(1, 7, 1)),
        ("append conflicting at committed", ("append", 7), False, run(1, 7, 1) + run(8, 9, 2)),
    ],
)
async def test_truncation_never_drops_committed_entries(
    node: Node, name, operation, refused, expected_after
):
    log = node.log
    assert log is not None
    await fill(log, [run(1, 5, 1), run(6, 10, 1)])
    log.committed_lsn = 7
    kind, lsn = operation
    if kind == "append":
        call = append(log, 2, lsn, 1, run(lsn + 1, lsn + 2, 2))
    else:
        call = log.truncate_after(lsn)
    if refused:
        with pytest.raises(BadBatch, match="committed"):
            await call
    else:
        await call
    assert log_view(log) == view(expected_after)
    assert disk_view(node.directory) == view(expected_after)
    assert (log.last_lsn, log.last_term) == (expected_after[-1].lsn, expected_after[-1].term)


@pytest.mark.parametrize("how", ["append", "truncate_after"])
async def test_a_log_cut_back_to_empty_takes_entries_of_any_time_tick(node: Node, how: str):
    """A log whose every entry is a divergent suffix, cut back to nothing: it must then
    take the best log's entries whatever their time ticks, as it would after a reopen.
    Found by ``raftwal simulate`` (seed 5979 of the issue 50 run): a deposed owner's
    uncommitted entry at lsn 1 was written after the new owner's (a higher time tick at a
    lower term); the cut kept the removed entry's tick as the log's last, so the best log's
    lsn 1 was refused ("time tick ... not above the log's"), at every new term: the
    pchannel stayed ASSIGNING for good."""
    log = node.log
    assert log is not None
    stale = dataclasses.replace(entry(1, 2), time_tick=tick_of(9, 2))
    await append(log, 2, 0, 0, [stale])
    await log.fence(3)
    best = run(1, 2, 3)
    assert best[0].time_tick < stale.time_tick
    if how == "append":
        # Log matching finds the conflict at lsn 1 and cuts it.
        await append(log, 3, 0, 0, best)
    else:
        # A recovering owner cuts its own log back first, then fetches (`_adopt`).
        await log.truncate_after(0)
        await append(log, 3, 0, 0, best)
    assert log_view(log) == view(best)
    assert disk_view(node.directory) == view(best)
    assert log.position().last_time_tick == best[-1].time_tick
    assert log.position() == (await node.reopen()).position()


async def test_committed_segment_from_the_catalog_bounds_truncation_after_reopen(node: Node):
    log = node.log
    assert log is not None
    await fill(log, [run(1, 4, 1, seal_at=(4,)), run(5, 6, 1)])
    log.catalog.mark_committed(PCHANNEL, 1)
    log = await node.reopen()
    assert log.committed_lsn == 4
    with pytest.raises(BadBatch, match="committed"):
        await log.truncate_after(3)
    with pytest.raises(BadBatch, match="committed"):
        await append(log, 2, 2, 1, run(3, 3, 2))
    assert log_view(log) == view(run(1, 4, 1, seal_at=(4,)) + run(5, 6, 1))
    await log.truncate_after(4)
    assert log_view(log) == view(run(1, 4, 1, seal_at=(4,)))
    assert segment_firsts(node.directory) == [1]


async def test_wait_durable_of_truncated_entries_raises(node: Node):
    log = node.log
    assert log is not None
    await fill(log, [run(1, 3, 1)])
    result = await log.append(1, 3, 1, frames_of(run(4, 6, 1)))
    await log.truncate_after(3)
    with pytest.raises(LogError, match="truncated"):
        await log.wait_durable(result)
    assert log_view(log) == view(run(1, 3, 1))


# -- seal roll --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batches",
    [
        pytest.param([run(1, 4, 1, seal_at=(4,))], id="seal-in-one-batch"),
        pytest.param([run(1, 2, 1), run(3, 3, 1), run(4, 4, 1, seal_at=(4,))], id="seal-alone"),
        pytest.param([run(1, 2, 1), run(3, 4, 2, seal_at=(4,))], id="two-terms"),
    ],
)
async def test_seal_marker_rolls_the_segment(node: Node, batches):
    log = node.log
    assert log is not None
    results = await fill(log, batches)
    assert [r.sealed for r in results] == [False] * (len(batches) - 1) + [True]
    sealed_entries = [e for batch in batches for e in batch]
    path = list_segment_files(node.directory)[0][1]
    assert segment_firsts(node.directory) == [1]
    assert log.open_segment_first_lsn() is None
    assert [(s.first_lsn, s.last_lsn) for s in log.sealed_segments()] == [(1, 4)]
    with SegmentReader.open(path) as reader:
        assert view(list(reader.entries())) == view(sealed_entries)
        assert (reader.first_lsn, reader.last_lsn, reader.entry_count) == (1, 4, 4)
        # The digest covers the entry bytes only: the concatenated frames as sent.
        digest = crc32c(b"".join(frames_of(batch) for batch in batches))
        assert reader.digest == digest
    rows = log.catalog.segments(PCHANNEL)
    assert [(r.first_lsn, r.last_lsn, r.count, r.digest, r.state) for r in rows] == [
        (1, 4, 4, digest, "sealed")
    ]
    last_term = sealed_entries[-1].term
    result = await append(log, last_term, 4, last_term, run(5, 6, last_term))
    assert not result.sealed and result.writer is not None
    assert segment_firsts(node.directory) == [1, 5]
    assert log.open_segment_first_lsn() == 5
    expected = sealed_entries + run(5, 6, last_term)
    assert log_view(log) == view(expected)
    log = await node.reopen()
    assert log_view(log) == view(expected)
    assert [(s.first_lsn, s.last_lsn) for s in log.sealed_segments()] == [(1, 4)]
    assert log.open_segment_first_lsn() == 5


@pytest.mark.parametrize(
    "seal_at",
    [
        pytest.param((4,), id="first-of-three"),
        pytest.param((5,), id="middle-of-three"),
        pytest.param((5, 6), id="two-markers-last-one-last"),
        pytest.param((4, 6), id="first-and-last"),
    ],
)
async def test_seal_marker_must_be_last_of_its_batch(node: Node, seal_at):
    log = node.log
    assert log is not None
    await fill(log, [run(1, 3, 1)])
    with pytest.raises(BadBatch, match="seal marker"):
        await append(log, 1, 3, 1, run(4, 6, 1, seal_at=seal_at))
    assert log_view(log) == view(run(1, 3, 1))
    assert disk_view(node.directory) == view(run(1, 3, 1))
    assert log.sealed_segments() == [] and log.catalog.segments(PCHANNEL) == []


# -- divergent suffix across seal markers -----------------------------------------------------

#: [1..4] sealed, [5..8] sealed, [9..10] open, all at term 1
SEALED_LOG = [run(1, 4, 1, seal_at=(4,)), run(5, 8, 1, seal_at=(8,)), run(9, 10, 1)]


@pytest.mark.parametrize(
    "prev_lsn, files_after, sealed_after",
    [
        pytest.param(3, [1], [], id="into-the-first-sealed-segment"),
        pytest.param(4, [1, 5], [(1, 4)], id="right-after-a-seal-marker"),
        pytest.param(6, [1, 5], [(1, 4)], id="into-the-second-sealed-segment"),
        pytest.param(8, [1, 5, 9], [(1, 4), (5, 8)], id="into-the-open-segment"),
    ],
)
async def test_divergent_suffix_across_seal_markers(
    node: Node, prev_lsn, files_after, sealed_after
):
    log = node.log
    assert log is not None
    await fill(log, SEALED_LOG)
    assert segment_firsts(node.directory) == [1, 5, 9]
    old = [e for batch in SEALED_LOG for e in batch]
    kept = [e for e in old if e.lsn <= prev_lsn]
    replacement = run(prev_lsn + 1, prev_lsn + 3, 2)
    await append(log, 2, prev_lsn, 1, replacement)
    expected = kept + replacement
    assert segment_firsts(node.directory) == files_after
    assert [(s.first_lsn, s.last_lsn) for s in log.sealed_segments()] == sealed_after
    # The catalog lists exactly the sealed segments the log still has.
    assert [(r.first_lsn, r.last_lsn) for r in log.catalog.segments(PCHANNEL)] == sealed_after
    assert log_view(log) == view(expected)
    assert disk_view(node.directory) == view(expected)
    # It keeps working: seal the open segment with a marker, then start another one.
    next_lsn = expected[-1].lsn + 1
    sealing = run(next_lsn, next_lsn + 1, 2, seal_at=(next_lsn + 1,))
    result = await append(log, 2, next_lsn - 1, 2, sealing)
    assert result.sealed
    after = run(next_lsn + 2, next_lsn + 2, 2)
    await append(log, 2, next_lsn + 1, 2, after)
    expected += sealing + after
    assert segment_firsts(node.directory) == [*files_after, next_lsn + 2]
    resealed_first = files_after[-1]
    assert [(s.first_lsn, s.last_lsn) for s in log.sealed_segments()] == [
        *sealed_after,
        (resealed_first, next_lsn + 1),
    ]
    log = await node.reopen()
    assert log_view(log) == view(expected)
    assert disk_view(node.directory) == view(expected)
    assert (log.last_lsn, log.last_term) == (next_lsn + 2, 2)
    with SegmentReader.open(log.segment_path(resealed_first)) as reader:
        assert view(list(reader.entries())) == view(
            [e for e in expected if resealed_first <= e.lsn <= next_lsn + 1]
        )


# -- recovery ---------------------------------------------------------------------------------


def frame_offset(path: Path, lsn: int) -> int:
    recovered = open_segment(path, repair=False)
    return recovered.frame_offsets[lsn - recovered.header.first_lsn]


#: [1..4] sealed, then the open segment [5..12] written in four batches
RECOVERY_LOG = [
    run(1, 4, 1, seal_at=(4,)),
    run(5, 6, 1),
    run(7, 8, 1),
    run(9, 10, 2),
    run(11, 12, 2),
]


@pytest.mark.parametrize(
    "segment_first, lsn, where",
    [
        pytest.param(1, 2, "payload", id="sealed-payload"),
        pytest.param(1, 2, "term", id="sealed-header"),
        pytest.param(1, 1, "payload", id="sealed-first-entry"),
        pytest.param(5, 7, "payload", id="unsealed-payload"),
        pytest.param(5, 7, "term", id="unsealed-header"),
        pytest.param(5, 5, "payload", id="unsealed-first-entry"),
    ],
)
async def test_corrupt_byte_mid_segment_refuses_to_open(node: Node, segment_first, lsn, where):
    log = node.log
    assert log is not None
    await fill(log, RECOVERY_LOG)
    await node.close()
    path = dict(list_segment_files(node.directory))[segment_first]
    offset = frame_offset(path, lsn) + (ENTRY_HEADER_SIZE + 2 if where == "payload" else 16)
    size_before = path.stat().st_size
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x5A]))
    with pytest.raises(SegmentCorrupted) as raised:
        await node.open()
    assert raised.value.path == os.fspath(path)
    assert path.stat().st_size == size_before  # nothing cut or skipped
    assert segment_firsts(node.directory) == [1, 5]


@pytest.mark.parametrize(
    "cut_bytes, last_lsn_after",
    [
        pytest.param(1, 11, id="one-byte"),
        pytest.param(7, 11, id="seven-bytes"),
        pytest.param(ENTRY_HEADER_SIZE + 4, 11, id="into-the-header"),
        pytest.param("last-frame", 11, id="exactly-the-last-frame"),
        pytest.param("last-frame+3", 10, id="into-the-previous-frame"),
    ],
)
async def test_torn_tail_is_repaired_on_open(node: Node, cut_bytes, last_lsn_after):
    log = node.log
    assert log is not None
    await fill(log, RECOVERY_LOG)
    await node.close()
    path = dict(list_segment_files(node.directory))[5]
    size = path.stat().st_size
    last_frame = size - frame_offset(path, 12)
    if cut_bytes == "last-frame":
        cut_bytes = last_frame
    elif cut_bytes == "last-frame+3":
        cut_bytes = last_frame + 3
    os.truncate(path, size - cut_bytes)
    log = await node.open()
    everything = [e for batch in RECOVERY_LOG for e in batch]
    kept = [e for e in everything if e.lsn <= last_lsn_after]
    assert log_view(log) == view(kept)
    assert disk_view(node.directory) == view(kept)
    assert (log.last_lsn, log.last_term, log.last_time_tick) == (
        last_lsn_after,
        kept[-1].term,
        kept[-1].time_tick,
    )
    # The owner resends what was lost; the log continues and survives another restart.
    resent = [e for e in everything if e.lsn > last_lsn_after]
    await append(log, 2, last_lsn_after, kept[-1].term, resent)
    log = await node.reopen()
    assert log_view(log) == view(everything)


async def test_torn_tail_that_empties_the_open_segment(node: Node):
    log = node.log
    assert log is not None
    await fill(log, [run(1, 4, 1, seal_at=(4,)), run(5, 5, 1)])
    await node.close()
    path = dict(list_segment_files(node.directory))[5]
    os.truncate(path, path.stat().st_size - 3)
    log = await node.open()
    expected = run(1, 4, 1, seal_at=(4,))
    assert log_view(log) == view(expected)
    assert (log.last_lsn, log.last_term, log.last_time_tick) == (4, 1, tick_of(4, 1))
    assert log.term_at(4) == 1
    await append(log, 1, 4, 1, run(5, 6, 1))
    log = await node.reopen()
    assert log_view(log) == view(expected + run(5, 6, 1))


# -- reads ------------------------------------------------------------------------------------

#: [1..10] sealed (10 is the marker), [11..20] open; payload sizes vary with the lsn
READ_LOG = [run(1, 6, 1), run(7, 10, 1, seal_at=(10,)), run(11, 15, 2), run(16, 20, 2)]
READ_ENTRIES = {e.lsn: e for batch in READ_LOG for e in batch}


def frame_size(lsn: int) -> int:
    return len(frames_of([READ_ENTRIES[lsn]]))


HUGE = 1 << 20


@pytest.mark.parametrize(
    "from_lsn, max_bytes, to_lsn, expected_lsns",
    [
        pytest.param(1, HUGE, None, range(1, 11), id="stops-at-the-segment-end"),
        pytest.param(1, 1, None, [1], id="at-least-one-frame"),
        pytest.param(1, 0, None, [1], id="zero-budget-still-one-frame"),
        pytest.param(1, ((1, 2), 0), None, [1, 2], id="exact-fit"),
        pytest.param(1, ((1, 2), -1), None, [1], id="one-byte-short"),
        pytest.param(1, ((1, 2), 1), None, [1, 2], id="one-byte-over"),
        pytest.param(8, HUGE, None, [8, 9, 10], id="to-the-seal-marker"),
        pytest.param(3, HUGE, 5, [3, 4, 5], id="to-lsn"),
        pytest.param(3, ((3,), 0), 5, [3], id="to-lsn-and-budget"),
        pytest.param(11, HUGE, None, range(11, 21), id="open-segment"),
        pytest.param(12, ((12, 13), 0), None, [12, 13], id="open-segment-budget"),
        pytest.param(12, (tuple(range(12, 21)), 0), None, range(12, 21), id="open-exact-end"),
        pytest.param(20, 1, None, [20], id="last-frame"),
        pytest.param(10, HUGE, 30, [10], id="to-lsn-past-the-end"),
        pytest.param(21, HUGE, None, [], id="past-the-end"),
        pytest.param(5, HUGE, 4, [], id="to-before-from"),
    ],
)
async def test_read_frames(node: Node, from_lsn, max_bytes, to_lsn, expected_lsns):
    log = node.log
    assert log is not None
    await fill(log, READ_LOG)
    if isinstance(max_bytes, tuple):
        # (lsns, delta): the sizes of those frames plus delta bytes
        lsns, delta = max_bytes
        max_bytes = sum(frame_size(lsn) for lsn in lsns) + delta
    expected = b"".join(frames_of([READ_ENTRIES[lsn]]) for lsn in expected_lsns)
    assert log.read_frames(from_lsn, max_bytes, to_lsn) == expected
    data, last = log.read_frames_range(from_lsn, max_bytes, to_lsn)
    assert data == expected
    assert last == (list(expected_lsns)[-1] if expected_lsns else from_lsn - 1)
    assert view(log.entries(from_lsn, max_bytes, to_lsn)) == view(
        [READ_ENTRIES[lsn] for lsn in expected_lsns]
    )
    # The same after a restart (sealed offsets come from the footer, open ones from a walk).
    log = await node.reopen()
    assert log.read_frames(from_lsn, max_bytes, to_lsn) == expected


async def test_a_file_left_where_a_new_segment_goes_is_moved_aside(node: Node):
    """A segment creation whose caller was cancelled leaves a file the log does not track;
    the next creation at that LSN must not fail for good (it did: a replica stayed behind
    its owner for good in the chaos suite)."""
    log = node.log
    assert log is not None
    await fill(log, [run(1, 4, 1, seal_at=(4,))])
    orphan = SegmentWriter.create(node.directory, PCHANNEL, 5, 1)
    orphan.close()
    await fill(log, [run(5, 7, 1)])
    before = log_view(log)
    assert before == view(run(1, 4, 1, seal_at=(4,)) + run(5, 7, 1))
    assert (node.directory / (segment_file_name(5) + ORPHAN_SUFFIX)).exists()
    reopened = await node.reopen()
    assert log_view(reopened) == disk_view(node.directory) == before


@pytest.mark.parametrize(
    "from_lsn, to_lsn, expected_lsns",
    [
        pytest.param(1, 20, range(1, 21), id="whole-log-across-the-seal"),
        pytest.param(3, 5, [3, 4, 5], id="sealed-segment"),
        pytest.param(9, 13, range(9, 14), id="across-the-seal"),
        pytest.param(12, 20, range(12, 21), id="open-segment-to-its-end"),
        pytest.param(20, 20, [20], id="last-entry"),
        pytest.param(15, 40, range(15, 21), id="clamped-to-the-end"),
        pytest.param(6, 5, [], id="empty-range"),
    ],
)
async def test_bytes_between(node: Node, from_lsn, to_lsn, expected_lsns):
    """The bytes of a range's frames (the replicator's lag in bytes), from the offset
    indexes: the same as the frames read back, before and after a restart."""
    log = node.log
    assert log is not None
    await fill(log, READ_LOG)
    expected = sum(len(frames_of([READ_ENTRIES[lsn]])) for lsn in expected_lsns)
    assert log.bytes_between(from_lsn, to_lsn) == expected
    log = await node.reopen()
    assert log.bytes_between(from_lsn, to_lsn) == expected
