"""Local I/O failures of one pchannel's log, through the ``wal.append`` / ``wal.fsync`` fault
points: a failed append (ENOSPC, with part of the batch already in the file) leaves the
segment as it was and the log appendable; a failed fdatasync makes the log refuse appends
until it is reopened, and closing it cuts the segment back to its last synced offset. Every
test reads back what the files hold, not just what raised."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.wal.test_wal_log import Node, append, disk_view, frames_of, log_view, run, view
from wal_segments import faults
from wal_segments.log import LogError
from wal_segments.segment import list_segment_files, open_segment, segment_file_name


@pytest.fixture
async def node(tmp_path: Path):
    node = Node(tmp_path)
    await node.open()
    yield node
    await node.close()


@pytest.fixture
def hook() -> Iterator[list[tuple[str, str]]]:
    """Calls seen by the installed hook; the hook is removed after the test."""
    calls: list[tuple[str, str]] = []
    yield calls
    faults.install(None)


def _segment_size(directory: Path) -> int:
    (_, path), *_ = list_segment_files(directory)
    return path.stat().st_size


async def test_failed_append_is_cut_back_and_the_log_continues(node: Node, hook) -> None:
    log = node.log
    assert log is not None
    await append(log, 1, 0, 0, run(1, 5, 1))
    size_before = _segment_size(node.directory)

    def disk_full(point: str, subject: str) -> None:
        hook.append((point, subject))
        if point == "wal.append":
            # A short write before ENOSPC: part of the batch reaches the file.
            with open(subject, "ab") as file:
                file.write(b"\xab" * 100)
            raise OSError(errno.ENOSPC, "No space left on device (test)", subject)

    faults.install(disk_full)
    with pytest.raises(OSError) as raised:
        await append(log, 1, 5, 1, run(6, 8, 1))
    assert raised.value.errno == errno.ENOSPC
    assert ("wal.append", str(list_segment_files(node.directory)[0][1])) in hook
    assert log.failure is None
    assert (log.last_lsn, log.last_term) == (5, 1)
    assert _segment_size(node.directory) == size_before
    assert disk_view(node.directory) == view(run(1, 5, 1))

    faults.install(None)
    await append(log, 1, 5, 1, run(6, 8, 1))
    log = await node.reopen()
    assert disk_view(node.directory) == view(run(1, 8, 1))
    assert log.last_lsn == 8


async def test_failed_fsync_stops_the_log_until_it_is_reopened(node: Node, hook) -> None:
    log = node.log
    assert log is not None
    await append(log, 1, 0, 0, run(1, 5, 1))
    synced_size = _segment_size(node.directory)

    def broken_disk(point: str, subject: str) -> None:
        hook.append((point, subject))
        if point == "wal.fsync":
            raise OSError(errno.EIO, "Input/output error (test)", subject)

    faults.install(broken_disk)
    result = await log.append(1, 5, 1, frames_of(run(6, 8, 1)))
    with pytest.raises(OSError) as raised:
        await log.wait_durable(result)
    assert raised.value.errno == errno.EIO
    assert isinstance(log.failure, OSError)
    # Never retried, and nothing more is written until the log is reopened.
    with pytest.raises(LogError, match="must be reopened"):
        await log.append(1, 8, 1, frames_of(run(9, 9, 1)))
    assert _segment_size(node.directory) > synced_size

    faults.install(None)
    log = await node.reopen()
    # Closing cut the unsynced entries: what the page cache showed past the last
    # successful fdatasync was never reported durable.
    assert _segment_size(node.directory) == synced_size
    assert disk_view(node.directory) == view(run(1, 5, 1))
    assert log.failure is None and log.last_lsn == 5
    await append(log, 1, 5, 1, run(6, 8, 1))
    assert disk_view(node.directory) == view(run(1, 8, 1))


async def test_failed_segment_creation_leaves_no_file_behind(tmp_path: Path, hook) -> None:
    node = Node(tmp_path)
    log = await node.open()

    def disk_full(point: str, subject: str) -> None:
        hook.append((point, subject))
        raise OSError(errno.ENOSPC, "No space left on device (test)", subject)

    faults.install(disk_full)
    try:
        with pytest.raises(OSError):
            await append(log, 1, 0, 0, run(1, 3, 1))
        assert os.listdir(node.directory) == []
        faults.install(None)
        await append(log, 1, 0, 0, run(1, 3, 1))
        log = await node.reopen()
        assert disk_view(node.directory) == view(run(1, 3, 1))
        (_, path), *_ = list_segment_files(node.directory)
        assert open_segment(path, repair=False).truncated is None
    finally:
        await node.close()


@pytest.mark.parametrize("sealed", [False, True], ids=["open-segment", "sealed-segment"])
async def test_a_truncation_whose_fdatasync_fails_stops_the_log_until_it_is_reopened(
    node: Node, hook, sealed: bool
) -> None:
    """A replica truncating a divergent suffix (log matching found term 2 where it holds
    term 1) whose fdatasync of the cut fails. Found by ``raftwal simulate`` (seeds 1585
    and 2686 of the issue 50 run): the truncation had closed the segment's writer and cut
    the file, then the failed sync left the log without a writer, its last LSN still the
    old one and the segment's frame index shorter than that. `failure` said nothing, so
    the log went on: every later read of its tail (Consume, Fetch) raised IndexError.

    Now a truncation that fails or is cut short once it began changing the files stops
    the log like a failed fdatasync of an append: it refuses appends and reads until it is
    reopened, and the reopened log holds what the files hold."""
    log = node.log
    assert log is not None
    if sealed:
        await append(log, 1, 0, 0, run(1, 7, 1, seal_at=(7,)))
    else:
        await append(log, 1, 0, 0, run(1, 7, 1))

    def broken_disk(point: str, subject: str) -> None:
        hook.append((point, subject))
        if point == "wal.fsync":
            raise OSError(errno.EIO, "Input/output error (test)", subject)

    faults.install(broken_disk)
    with pytest.raises(OSError) as raised:
        await append(log, 2, 3, 1, run(4, 5, 2))
    assert raised.value.errno == errno.EIO
    assert isinstance(log.failure, OSError)
    with pytest.raises(LogError, match="must be reopened"):
        await log.append(2, 3, 1, frames_of(run(4, 5, 2)))
    with pytest.raises(LogError, match="must be reopened"):
        log.read_frames_range(1, 1 << 20)

    faults.install(None)
    log = await node.reopen()
    assert log.failure is None
    # Whatever the failed cut left in the files, the reopened log is what they hold, and it
    # takes the owner's entries from lsn 4 on.
    assert log_view(log) == disk_view(node.directory)
    assert log.read_frames_range(1, 1 << 20)[1] == log.last_lsn
    await append(log, 2, 3, 1, run(4, 5, 2))
    assert disk_view(node.directory) == view(run(1, 3, 1) + run(4, 5, 2))


async def test_an_append_that_a_failing_seal_overtakes_is_never_durable(node: Node, hook) -> None:
    """A background seal's fdatasync fails (EIO) while an append into the next segment is
    being written: that append passed the log's usability check before the failure, and
    its entries follow the seal's, which are not durable. It used to wait for nothing
    (the failed seal was already done) and be reported durable after its own segment's
    sync: an owner counted itself durable past a hole, and an entry committed that way
    was lost (the simulation's seed 841). It now fails with the seal."""
    log = node.log
    assert log is not None
    sealing = threading.Event()

    def faulty(point: str, subject: str) -> None:
        hook.append((point, subject))
        if point == "wal.fsync" and subject.endswith(segment_file_name(1)):
            # The seal's sync of segment 1 fails, once the next append is under way.
            sealing.wait(10)
            raise OSError(errno.EIO, "Input/output error")
        if point == "wal.append" and segment_file_name(6) in subject and not sealing.is_set():
            # The append creates segment 6 (a worker thread writes its header): the seal
            # fails meanwhile.
            sealing.set()
            time.sleep(0.3)

    faults.install(faulty)
    sealed = await log.append(1, 0, 0, frames_of(run(1, 5, 1, seal_at=(5,))))
    after = await log.append(1, 5, 1, frames_of(run(6, 8, 1)))
    with pytest.raises(LogError):
        await log.wait_durable(sealed)
    with pytest.raises(LogError):
        await log.wait_durable(after)
    assert log.failure is not None


async def test_a_fence_answer_reports_only_durable_entries(node: Node, hook) -> None:
    """A new owner adopts the longest log its fence quorum reports and cuts its own to
    match: an end that counted entries not yet durable could vanish after the answer
    (simulation seed 2513: a replica's fsyncs failed after its answer, the new owner
    fetched from it and cut committed entries of its own)."""
    log = node.log
    assert log is not None
    await append(log, 1, 0, 0, run(1, 5, 1))

    def recording(point: str, subject: str) -> None:
        hook.append((point, subject))

    # The entries of an append still in its group commit are synced before the answer.
    faults.install(recording)
    await log.append(1, 5, 1, frames_of(run(6, 8, 1)))
    syncs = sum(1 for point, _ in hook if point == "wal.fsync")
    position = await log.fence(2)
    assert position.last_lsn == 8
    assert sum(1 for point, _ in hook if point == "wal.fsync") > syncs

    # When they cannot be made durable, there is no answer at all.
    def broken_disk(point: str, subject: str) -> None:
        if point == "wal.fsync":
            raise OSError(errno.EIO, "Input/output error (test)", subject)

    faults.install(broken_disk)
    await log.append(2, 8, 1, frames_of(run(9, 11, 2)))
    with pytest.raises(OSError):
        await log.fence(3)
    faults.install(None)
    log = await node.reopen()
    assert log.last_lsn == 8
    assert disk_view(node.directory) == view(run(1, 8, 1))
