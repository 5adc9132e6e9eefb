"""Regression tests for what a power cut (or a kill during a seal) exposed in the data
plane, each failing without its fix:

- a restarted node re-ran tail recovery at a term it had already recovered at (two
  incarnations then wrote different entries at one (lsn, term)): it now asks for term + 1;
- a log reopened after a crash in the middle of a background seal kept appending after a
  seal marker that ended its last file (every replica then refused the batch with the
  marker in its middle, and recovery failed at every new term);
- a pchannel directory created without an fsync of its parent vanished in a power cut
  with every segment under it, however well the segments were synced;
- an append whose previous entry lies below the log's retained start was taken as
  matching (or raised KeyError): it is now checked by the batch's own entries.

The power cut here is `raftwal.sim.runtime.SimDisk`, the disk of ``raftwal simulate``:
every file change is undone at a crash unless an fsync made it durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from pathlib import Path
from typing import Any

from raftwal.sim.runtime import SimDisk
from wal_segments.catalog import Catalog
from wal_segments.format import Entry, EntryFlags, MsgType, encode_batch
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import Mismatch, PChannelLog
from wal_segments.owner import OwnerConfig
from wal_segments.plane import Assignment, DataPlane
from wal_segments.segment import SegmentWriter, list_segment_files, open_segment

PCHANNEL = "p_cut"


def entry(lsn: int, term: int, *, seal: bool = False) -> Entry:
    plain = Entry(
        lsn=lsn,
        term=term,
        time_tick=100 * lsn + term,
        msg_type=int(MsgType.MESSAGE),
        vchannel_id=1,
        payload=f"{lsn}@{term}".encode(),
    )
    if seal:
        return dataclasses.replace(
            plain, msg_type=int(MsgType.SEAL), flags=int(EntryFlags.SEAL_MARKER), payload=b""
        )
    return plain


async def open_log(root: Path, catalog: Catalog) -> PChannelLog:
    return await PChannelLog.open(root / PCHANNEL, PCHANNEL, catalog, parse_fsync_policy("always"))


async def write(log: PChannelLog, term: int, entries: list[Entry]) -> None:
    prev = entries[0].lsn - 1
    result = await log.append(
        term, prev, log.term_at(prev) if prev >= log.first_lsn else 0, encode_batch(entries).data
    )
    await log.wait_durable(result)


def terms(log: PChannelLog) -> list[tuple[int, int]]:
    return [(e.lsn, e.term) for e in log.iter_entries(log.first_lsn, log.last_lsn)]


# -- item 1: never two recoveries at one term on a node --------------------------------------


class _View:
    def __init__(self, assignment: Assignment) -> None:
        self._assignment = assignment
        self.reassigned: list[tuple[str, int]] = []

    def assignments(self) -> dict[str, Assignment]:
        return {self._assignment.pchannel: self._assignment}

    async def reassign_to_self(self, pchannel: str, term: int) -> None:
        self.reassigned.append((pchannel, term))


async def test_a_restarted_owner_never_recovers_again_at_the_term_it_recovered_at(tmp_path: Path):
    """An earlier incarnation of n1 began recovery at term 7 (its log is fenced at 7, its
    first act) and then lost power. The pchannel is still ASSIGNING at term 7 with n1 as
    the owner. What it wrote at term 7 may live on another replica and not here: a second
    recovery at 7 could write other entries at the same (lsn, term). The restarted node
    must ask for term 8 and start no owner at 7."""
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.raise_fenced_term(PCHANNEL, 7)
    catalog.close()
    view = _View(Assignment(PCHANNEL, 7, "n1", "ASSIGNING", ("n1", "n2", "n3")))
    nothing: Any = None
    plane = DataPlane(
        node_id="n1",
        data_dir=tmp_path,
        policy=parse_fsync_policy("always"),
        owner_config=OwnerConfig(),
        transport=nothing,
        proposer=nothing,
        view=view,
    )
    try:
        await plane.reconcile()
        assert plane.owners == {}
        assert view.reassigned == [(PCHANNEL, 7)]
        # A fresh assignment at a term this node never fenced still starts an owner.
        view._assignment = Assignment(PCHANNEL, 8, "n1", "ASSIGNING", ("n1", "n2", "n3"))
        owner_started = asyncio.Event()
        original = plane._start_owner

        async def spy(assignment: Assignment) -> None:
            owner_started.set()
            plane.owners[assignment.pchannel] = None  # type: ignore[assignment]

        plane._start_owner = spy  # type: ignore[method-assign]
        await plane.reconcile()
        assert owner_started.is_set()
        plane._start_owner = original  # type: ignore[method-assign]
        plane.owners.clear()
    finally:
        await plane.close()


# -- a crash in the middle of a background seal ---------------------------------------------


async def test_a_last_segment_ending_with_a_seal_marker_is_sealed_on_open(tmp_path: Path):
    """The append that writes a seal marker hands the segment to a background seal; a kill
    before the footer leaves the marker as the last entry of the last, unsealed file (the
    next segment does not exist yet). Reopened, the log must finish that seal: the next
    append opens a new segment. Before the fix it appended after the marker, and every
    replica then refused the batch ("a seal marker must be the last entry of a batch")."""
    directory = tmp_path / PCHANNEL
    directory.mkdir(mode=0o700)
    writer = SegmentWriter.create(directory, PCHANNEL, 1, 1)
    batch = encode_batch([entry(1, 1), entry(2, 1), entry(3, 1, seal=True)])
    writer.append_encoded(batch.data, batch.meta)
    writer.sync()
    writer.close()  # killed here: no footer
    assert not open_segment(directory / list_segment_files(directory)[0][1].name).sealed
    catalog = Catalog(tmp_path / "catalog.db")
    log = await open_log(tmp_path, catalog)
    try:
        assert [s.first_lsn for s in log.sealed_segments()] == [1]
        assert log.open_segment_first_lsn() is None
        await write(log, 1, [entry(4, 1), entry(5, 1)])
        assert [first for first, _ in list_segment_files(directory)] == [1, 4]
        assert terms(log) == [(lsn, 1) for lsn in range(1, 6)]
    finally:
        await log.close()
        catalog.close()


# -- the pchannel directory survives a power cut ---------------------------------------------


async def test_a_new_pchannel_directory_survives_a_power_cut(tmp_path: Path):
    """Segments synced into a directory whose own entry was never synced are lost with it
    in a power cut. The log now fsyncs the parent of every directory it creates."""
    root = tmp_path / "disk"
    root.mkdir()
    node = root / "n1"
    node.mkdir()
    disk = SimDisk(root, random.Random(1))
    catalog = Catalog(tmp_path / "catalog.db")
    disk.install()
    try:
        log = await open_log(node / "wal", catalog)
        await write(log, 1, [entry(1, 1), entry(2, 1)])
        await log.close()
        disk.crash("n1")
    finally:
        disk.uninstall()
    log = await open_log(node / "wal", catalog)
    try:
        assert terms(log) == [(1, 1), (2, 1)]
    finally:
        await log.close()
        catalog.close()


async def test_the_sim_disk_drops_what_was_not_synced(tmp_path: Path):
    """The fault layer itself: a write without fsync is dropped, a synced one kept; a file
    created without a directory fsync vanishes; an unlink without one is undone."""
    root = tmp_path / "disk"
    (root / "n1").mkdir(parents=True)
    disk = SimDisk(root, random.Random(2))
    base = root / "n1"
    disk.install()
    try:
        fd = os.open(base / "kept", os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, b"synced", 0)
        os.fsync(fd)
        os.pwrite(fd, b"-lost", 6)
        os.close(fd)
        directory = os.open(base, os.O_RDONLY)
        os.fsync(directory)
        fd = os.open(base / "new", os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, b"data", 0)
        os.fsync(fd)
        os.close(fd)
        os.unlink(base / "kept")
        assert disk.unsynced_bytes("n1") == 5
        assert disk.crash("n1") == 5
        os.close(directory)
    finally:
        disk.uninstall()
    assert (base / "kept").read_bytes() == b"synced"
    assert not (base / "new").exists()


# -- appends whose previous entry is below the retained log -----------------------------------


async def _retained(tmp_path: Path, catalog: Catalog) -> PChannelLog:
    """A log of 1..20 at term 2 that retains only 11..20."""
    log = await open_log(tmp_path, catalog)
    await log.fence(2)
    await write(log, 2, [entry(lsn, 2) for lsn in range(1, 10)] + [entry(10, 2, seal=True)])
    await log.wait_sealed()
    await write(log, 2, [entry(lsn, 2) for lsn in range(11, 21)])
    log.committed_lsn = 20
    await log.delete_before(11)
    assert log.first_lsn == 11
    return log


async def test_an_append_below_the_retained_start_is_checked_by_its_entries(tmp_path: Path):
    """The log retains 11..20. A batch 6..15 whose entry 11 has our term matches (Log
    Matching): nothing is dropped and 16..20 stay. A batch whose entry 11 has another term
    proves this log diverged from 11 on: it starts again at the batch. Before the fix the
    first raised KeyError (reading below the log) and a heartbeat below it was reported as
    matching."""
    catalog = Catalog(tmp_path / "catalog.db")
    log = await _retained(tmp_path, catalog)
    try:
        with_ours = encode_batch([entry(lsn, 2) for lsn in range(6, 16)]).data
        result = await log.append(3, 5, 2, with_ours)
        await log.wait_durable(result)
        assert terms(log) == [(lsn, 2) for lsn in range(11, 21)]
        try:
            log.check_match(5, 2)
        except Mismatch as error:
            assert (error.conflict_term, error.conflict_first_lsn) == (2, 11)
        else:
            raise AssertionError("an entry below the retained log was taken as matching")
        log.committed_lsn = 10  # (as if only what retention deleted was committed)
        theirs = encode_batch([entry(lsn, 3) for lsn in range(6, 14)]).data
        result = await log.append(3, 5, 0, theirs)
        await log.wait_durable(result)
        assert terms(log) == [(lsn, 3) for lsn in range(6, 14)]
    finally:
        await log.close()
        catalog.close()


async def test_a_log_reopened_after_a_kill_syncs_what_its_writer_never_synced(tmp_path: Path):
    """A node killed between a write and its fdatasync leaves the bytes in the page cache;
    restarted, it reads them back. The log used to take them as durable as it found them:
    a replica then answered a resent append it already held as durable, the owner counted
    it, and a power cut before the kernel wrote the pages back lost an acknowledged entry
    (the simulation's seed 5405). Reopening now syncs them first."""
    root = tmp_path / "disk"
    node = root / "n1"
    node.mkdir(parents=True)
    disk = SimDisk(root, random.Random(3))
    catalog = Catalog(tmp_path / "catalog.db")
    disk.install()
    try:
        # The writer's fdatasyncs never happen: it is killed before each.
        unsynced = await PChannelLog.open(
            node / "wal" / PCHANNEL, PCHANNEL, catalog, parse_fsync_policy("never")
        )
        await write(unsynced, 1, [entry(1, 1), entry(2, 1), entry(3, 1)])
        assert disk.unsynced_bytes("n1") > 0
        # Restarted: the page cache still holds the entries, and the log reads them.
        log = await open_log(node / "wal", catalog)
        assert terms(log) == [(1, 1), (2, 1), (3, 1)]
        disk.crash("n1")  # the power goes before any later sync
    finally:
        disk.uninstall()
    log = await open_log(node / "wal", catalog)
    try:
        assert terms(log) == [(1, 1), (2, 1), (3, 1)]
    finally:
        await log.close()
        catalog.close()
