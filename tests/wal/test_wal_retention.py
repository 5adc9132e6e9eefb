"""Retention in `PChannelLog`: `delete_before` deletes whole sealed segments below a floor
(files, catalog rows), never the last one; reads below it fail while the rest stays
readable; the floor is recorded in the catalog before any file goes, so a deletion a
crash cut short (files left behind) is finished when the log is opened again; a repeat is
a no-op."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.wal.test_wal_log import (
    PCHANNEL,
    Node,
    append,
    log_view,
    run,
    segment_firsts,
    view,
)
from wal_segments import faults
from wal_segments.catalog import Catalog
from wal_segments.log import PChannelLog


@pytest.fixture
async def node(tmp_path: Path):
    node = Node(tmp_path)
    await node.open()
    yield node
    await node.close()


async def _four_segments(log: PChannelLog) -> list:
    """Segments [1, 5], [6, 10], [11, 15] sealed and [16, 17] open, term 1."""
    entries = []
    for first in (1, 6, 11):
        batch = run(first, first + 4, 1, seal_at=(first + 4,))
        await append(log, 1, first - 1, log.term_at(first - 1), batch)
        entries += batch
    tail = run(16, 17, 1)
    await append(log, 1, 15, 1, tail)
    return entries + tail


async def test_delete_before_drops_whole_segments_and_their_rows(node: Node):
    log = node.log
    assert log is not None
    entries = await _four_segments(log)
    assert segment_firsts(node.directory) == [1, 6, 11, 16]
    # lsn 8 is inside [6, 10]: only [1, 5] ends below it.
    assert await log.delete_before(8) == 1
    assert segment_firsts(node.directory) == [6, 11, 16]
    assert log.first_lsn == 6
    assert log_view(log) == view(entries[5:])
    assert [r.first_lsn for r in log.catalog.segments(PCHANNEL)] == [6, 11]
    assert log.catalog.retention_floor(PCHANNEL) == 6
    with pytest.raises(KeyError):
        log.read_frames(3, 1 << 20)
    # A repeat, or a lower floor, deletes nothing.
    assert await log.delete_before(8) == 0
    assert await log.delete_before(2) == 0
    # Never the last (open) segment, even with a floor past the end.
    assert await log.delete_before(1000) == 2
    assert segment_firsts(node.directory) == [16]
    assert log_view(log) == view(entries[15:])
    log = await node.reopen()
    assert log.first_lsn == 16 and log.last_lsn == 17
    assert log_view(log) == view(entries[15:])
    # Appends go on after the deletion.
    await append(log, 1, 17, 1, run(18, 19, 1))
    assert log.last_lsn == 19


async def test_a_deletion_cut_short_is_finished_on_open(node: Node):
    log = node.log
    assert log is not None
    entries = await _four_segments(log)
    calls: list[str] = []

    def crash_on_second(point: str, subject: str) -> None:
        if point == "wal.delete":
            calls.append(subject)
            if len(calls) == 2:
                raise OSError("injected crash mid-delete")

    faults.install(crash_on_second)
    try:
        with pytest.raises(OSError, match="mid-delete"):
            await log.delete_before(16)
    finally:
        faults.install(None)
    # One file went, the next did not: the floor was recorded first.
    assert segment_firsts(node.directory) == [6, 11, 16]
    assert log.first_lsn == 16
    catalog = Catalog(node.root / "catalog.db")
    assert catalog.retention_floor(PCHANNEL) == 16
    catalog.close()
    log = await node.reopen()
    assert segment_firsts(node.directory) == [16]
    assert [r.first_lsn for r in log.catalog.segments(PCHANNEL)] == []
    assert log.first_lsn == 16
    assert log_view(log) == view(entries[15:])
    assert log.retained_below(16) == 0


async def test_files_a_failed_unlink_left_are_swept_by_the_next_round(node: Node):
    log = node.log
    assert log is not None
    await _four_segments(log)

    def fail_once(point: str, subject: str) -> None:
        if point == "wal.delete":
            faults.install(None)
            raise OSError("injected unlink failure")

    faults.install(fail_once)
    try:
        with pytest.raises(OSError, match="unlink failure"):
            await log.delete_before(16)
    finally:
        faults.install(None)
    assert segment_firsts(node.directory) == [1, 6, 11, 16]
    # Without a reopen: the next round (nothing left to delete in the log) sweeps them.
    assert await log.delete_before(16) == 0
    assert segment_firsts(node.directory) == [16]
    assert [r.first_lsn for r in log.catalog.segments(PCHANNEL)] == []
