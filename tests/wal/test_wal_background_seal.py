"""Seals finish in the background: the append that writes a seal marker returns at once and
the next append opens the next segment while the sealed one's entries are synced and its
footer written. What must still hold, checked here against the files: no append is
reported durable before every entry before it is (a later segment's sync does not cover
an earlier file), a failed seal stops the log and a reopen finds a consistent prefix, and
recovery moves aside segments that follow a gap. A slow or failing disk is made with the
``wal.fsync`` fault point, on the first segment's file only."""

from __future__ import annotations

import asyncio
import errno
import random
import threading
from pathlib import Path

import pytest

from tests.wal.test_wal_log import (
    PCHANNEL,
    Node,
    append,
    disk_view,
    frames_of,
    log_view,
    run,
    segment_firsts,
    view,
)
from wal_segments import faults
from wal_segments.log import ORPHAN_SUFFIX, LogError
from wal_segments.segment import SegmentCorrupted, SegmentWriter, open_segment, segment_file_name

#: bounds every wait on the gated fsync thread
WAIT_S = 10.0


@pytest.fixture
async def node(tmp_path: Path):
    node = Node(tmp_path)
    await node.open()
    yield node
    faults.install(None)
    await node.close()


class Gate:
    """Holds every fdatasync of one file until opened; optionally fails the n-th one."""

    def __init__(self, path: Path, *, fail_call: int | None = None) -> None:
        self.path = str(path)
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        self.fail_call = fail_call

    def __call__(self, point: str, subject: str) -> None:
        if point != "wal.fsync" or subject != self.path:
            return
        self.calls += 1
        self.entered.set()
        if not self.opened.wait(WAIT_S):
            raise OSError(errno.ETIMEDOUT, "gate never opened (test bug)", subject)
        if self.calls == self.fail_call:
            raise OSError(errno.EIO, "Input/output error (test)", subject)


def first_segment(node: Node) -> Path:
    return node.directory / segment_file_name(1)


async def pending(awaitable, seconds: float = 0.3) -> asyncio.Task:
    """Start `awaitable` and check that it is still running after `seconds`."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if done:
        pytest.fail(f"finished within {seconds} s: {task!r}")
    return task


async def test_appends_continue_while_a_seal_finishes(node: Node) -> None:
    log = node.log
    assert log is not None
    await append(log, 1, 0, 0, run(1, 3, 1))
    gate = Gate(first_segment(node))
    faults.install(gate)

    sealing = await log.append(1, 3, 1, frames_of(run(4, 4, 1, seal_at=(4,))))
    assert sealing.sealed
    seal_durable = await pending(log.wait_durable(sealing))
    assert await asyncio.to_thread(gate.entered.wait, WAIT_S)
    # The next segment opens at once, and its entries are readable with the old ones.
    later = await log.append(1, 4, 1, frames_of(run(5, 6, 1)))
    assert log.open_segment_first_lsn() == 5 and segment_firsts(node.directory) == [1, 5]
    assert log_view(log) == view(run(1, 4, 1, seal_at=(4,)) + run(5, 6, 1))
    assert log.sealed_segments() == []
    # Segment 5's own sync is done, but its entries come after segment 1's.
    later_durable = await pending(log.wait_durable(later))
    assert not seal_durable.done()

    gate.opened.set()
    await asyncio.wait_for(seal_durable, WAIT_S)
    await asyncio.wait_for(later_durable, WAIT_S)
    await log.wait_sealed()
    assert [(s.first_lsn, s.last_lsn) for s in log.sealed_segments()] == [(1, 4)]
    assert [(r.first_lsn, r.last_lsn, r.state) for r in log.catalog.segments(PCHANNEL)] == [
        (1, 4, "sealed")
    ]
    assert open_segment(first_segment(node), repair=False).sealed
    assert disk_view(node.directory) == view(run(1, 4, 1, seal_at=(4,)) + run(5, 6, 1))


async def test_back_to_back_seals_finish_in_order(node: Node) -> None:
    log = node.log
    assert log is not None
    gate = Gate(first_segment(node))
    await append(log, 1, 0, 0, run(1, 2, 1))
    faults.install(gate)
    first = await log.append(1, 2, 1, frames_of(run(3, 3, 1, seal_at=(3,))))
    second = await log.append(1, 3, 1, frames_of(run(4, 5, 1, seal_at=(5,))))
    third = await log.append(1, 5, 1, frames_of(run(6, 6, 1)))
    assert segment_firsts(node.directory) == [1, 4, 6]
    waits = [await pending(log.wait_durable(r)) for r in (first, second, third)]
    sealed = await pending(log.wait_sealed())
    # The second segment's seal waits for the first one's, footer included.
    assert log.sealed_segments() == []
    gate.opened.set()
    await asyncio.wait_for(asyncio.gather(*waits, sealed), WAIT_S)
    assert [(s.first_lsn, s.last_lsn) for s in log.sealed_segments()] == [(1, 3), (4, 5)]
    log = await node.reopen()
    assert log_view(log) == view(
        run(1, 3, 1, seal_at=(3,)) + run(4, 5, 1, seal_at=(5,)) + run(6, 6, 1)
    )
    assert log.open_segment_first_lsn() == 6


async def test_a_failed_seal_sync_loses_only_what_was_never_durable(node: Node) -> None:
    log = node.log
    assert log is not None
    await append(log, 1, 0, 0, run(1, 3, 1))
    synced_size = first_segment(node).stat().st_size
    gate = Gate(first_segment(node), fail_call=1)
    faults.install(gate)

    # Entry 4 is not waited for: only the seal's sync (held, then failing) covers it.
    unsynced = await log.append(1, 3, 1, frames_of(run(4, 4, 1)))
    sealing = await log.append(1, 4, 1, frames_of(run(5, 5, 1, seal_at=(5,))))
    assert await asyncio.to_thread(gate.entered.wait, WAIT_S)
    later = await log.append(1, 5, 1, frames_of(run(6, 7, 1)))
    gate.opened.set()
    for result in (unsynced, sealing, later):
        with pytest.raises(LogError, match="not durable"):
            await asyncio.wait_for(log.wait_durable(result), WAIT_S)
    assert isinstance(log.failure, OSError)
    with pytest.raises(LogError, match="must be reopened"):
        await log.append(1, 7, 1, frames_of(run(8, 8, 1)))
    with pytest.raises(LogError, match="seal failed"):
        await log.wait_sealed()

    faults.install(None)
    closed = log
    log = await node.reopen()
    # Waiting after the close still fails: these entries were never durable.
    for result in (unsynced, later):
        with pytest.raises(LogError, match="not durable"):
            await asyncio.wait_for(closed.wait_durable(result), WAIT_S)
    # Under "always": segment 1 is cut back to its last sync, and segment 6 (whose entries
    # waited for it) is moved aside, not deleted.
    assert first_segment(node).stat().st_size == synced_size
    assert segment_firsts(node.directory) == [1]
    assert (node.directory / (segment_file_name(6) + ORPHAN_SUFFIX)).exists()
    assert log_view(log) == view(run(1, 3, 1))
    assert log.failure is None and log.open_segment_first_lsn() == 1
    await append(log, 1, 3, 1, run(4, 5, 1, seal_at=(5,)))
    await append(log, 1, 5, 1, run(6, 6, 1))
    assert disk_view(node.directory) == view(run(1, 5, 1, seal_at=(5,)) + run(6, 6, 1))


async def test_a_failed_footer_keeps_the_durable_entries(node: Node) -> None:
    log = node.log
    assert log is not None
    await append(log, 1, 0, 0, run(1, 3, 1))
    # Call 1 is the entries' sync (it passes); call 2 is the footer's.
    gate = Gate(first_segment(node), fail_call=2)
    gate.opened.set()
    faults.install(gate)
    sealing = await log.append(1, 3, 1, frames_of(run(4, 4, 1, seal_at=(4,))))
    later = await log.append(1, 4, 1, frames_of(run(5, 6, 1)))
    await asyncio.wait_for(log.wait_durable(sealing), WAIT_S)
    await asyncio.wait_for(log.wait_durable(later), WAIT_S)
    with pytest.raises(LogError, match="seal failed"):
        await log.wait_sealed()
    assert isinstance(log.failure, OSError)

    faults.install(None)
    log = await node.reopen()
    # Nothing durable was lost; recovery sealed segment 1 again.
    expected = run(1, 4, 1, seal_at=(4,)) + run(5, 6, 1)
    assert segment_firsts(node.directory) == [1, 5]
    assert log_view(log) == view(expected)
    assert disk_view(node.directory) == view(expected)
    assert [(s.first_lsn, s.last_lsn) for s in log.sealed_segments()] == [(1, 4)]
    assert open_segment(first_segment(node), repair=False).sealed
    assert [(r.first_lsn, r.last_lsn, r.state) for r in log.catalog.segments(PCHANNEL)] == [
        (1, 4, "sealed")
    ]


async def test_recovery_moves_aside_segments_after_a_gap(tmp_path: Path) -> None:
    """Segment 1 lost its last entries (its seal marker among them) while segment 5 was
    already written: segment 5 goes aside and segment 1 stays open."""
    node = Node(tmp_path)
    node.directory.mkdir(parents=True)
    with SegmentWriter.create(node.directory, PCHANNEL, 1, 1) as writer:
        writer.append(run(1, 3, 1))
        writer.sync()
    with SegmentWriter.create(node.directory, PCHANNEL, 5, 1) as writer:
        writer.append(run(5, 6, 1))
        writer.sync()
    log = await node.open()
    try:
        assert segment_firsts(node.directory) == [1]
        assert (node.directory / (segment_file_name(5) + ORPHAN_SUFFIX)).exists()
        assert log_view(log) == view(run(1, 3, 1))
        assert log.open_segment_first_lsn() == 1
        await append(log, 1, 3, 1, run(4, 5, 1, seal_at=(5,)))
        await append(log, 1, 5, 1, run(6, 6, 1))
        assert disk_view(node.directory) == view(run(1, 5, 1, seal_at=(5,)) + run(6, 6, 1))
    finally:
        await node.close()


@pytest.mark.parametrize("kind", ["random-bytes", "other-pchannel", "overlapping"])
async def test_recovery_reports_what_is_not_a_lost_tail(tmp_path: Path, kind: str) -> None:
    """After an open segment, a file that is not a later segment of this pchannel is
    reported by name, and the open segment is left exactly as it was (not sealed)."""
    node = Node(tmp_path)
    node.directory.mkdir(parents=True)
    with SegmentWriter.create(node.directory, PCHANNEL, 1, 1) as writer:
        writer.append(run(1, 3, 1))
        writer.sync()
    before = first_segment(node).read_bytes()
    junk = node.directory / segment_file_name(9)
    if kind == "random-bytes":
        junk.write_bytes(random.Random(7).randbytes(5000))
    else:
        first = 9 if kind == "other-pchannel" else 3
        junk = node.directory / segment_file_name(first)
        with SegmentWriter.create(
            node.directory, "p_other" if kind == "other-pchannel" else PCHANNEL, first, 1
        ) as writer:
            writer.append(run(first, first + 1, 1))
            writer.sync()
    with pytest.raises(SegmentCorrupted, match=junk.name):
        await node.open()
    await node.close()
    assert first_segment(node).read_bytes() == before
    assert junk.exists()
