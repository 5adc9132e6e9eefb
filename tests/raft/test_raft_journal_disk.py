"""The Raft journal on a failing or full disk, and Raft's disk reserve (raft/reserve.py), on
real files through the journal's fault points (``raft.journal.write``/``.fsync``).

- A failed fsync (EIO) is never followed by an acknowledgement of what it covered: the
  journal stops (every later sync raises) and cuts the file back to its last synced size,
  so a restarted peer does not read back, and acknowledge, records that may never have
  reached the disk (the kernel can keep serving pages whose write-back failed).
- A write that meets a full disk releases the reserve and is tried once more; without a
  reserve to release, the journal stops as before.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from raft import _faults
from raft.errors import FatalPeerError
from raft.journal import JOURNAL_FILE_NAME, DurableJournal
from raft.reserve import RESERVE_FILE_NAME, DiskReserve, is_disk_full


def _fill(journal: DurableJournal, first: int, last: int, term: int = 1) -> None:
    for index in range(first, last + 1):
        journal.add(f"cmd-{index}".encode(), index, term)


def _indexes(journal: DurableJournal) -> list[int]:
    return [journal[position][1] for position in range(len(journal))]


@pytest.fixture
def hook() -> Iterator[list[str]]:
    """The fault points the journal passed; the installed hook is removed afterwards."""
    seen: list[str] = []
    yield seen
    _faults.install_io_fault_hook(None)


def test_a_failed_fsync_is_cut_back_and_never_read_back(tmp_path: Path, hook) -> None:
    journal = DurableJournal(tmp_path)
    _fill(journal, 1, 10)
    journal.sync()
    synced_size = (tmp_path / JOURNAL_FILE_NAME).stat().st_size
    _fill(journal, 11, 20)

    def broken_disk(point: str, subject: str) -> None:
        hook.append(point)
        if point == "raft.journal.fsync":
            raise OSError(errno.EIO, "Input/output error (test)", subject)

    _faults.install_io_fault_hook(broken_disk)
    with pytest.raises(FatalPeerError, match="journal sync failed"):
        journal.sync()
    assert hook == ["raft.journal.write", "raft.journal.fsync"]
    # The records whose fsync failed were written (pwrite succeeded): what a restart would
    # have read back, from the page cache, and acknowledged to the leader. They are gone.
    assert (tmp_path / JOURNAL_FILE_NAME).stat().st_size == synced_size
    # Never retried: the journal stays broken (the peer stops).
    _faults.install_io_fault_hook(None)
    with pytest.raises(FatalPeerError, match="broken"):
        journal.sync()
    assert journal.synced_index == 10
    restarted = DurableJournal(tmp_path)
    assert _indexes(restarted) == list(range(1, 11))
    assert restarted.synced_index == 10
    restarted.close()


def test_a_full_disk_releases_the_reserve_and_the_write_is_retried(tmp_path: Path, hook) -> None:
    reserve = DiskReserve(tmp_path / RESERVE_FILE_NAME, 1 << 20)
    assert reserve.ensure() and reserve.held and not reserve.released
    assert (tmp_path / RESERVE_FILE_NAME).stat().st_size == 1 << 20
    journal = DurableJournal(tmp_path, reserve=reserve)
    _fill(journal, 1, 5)
    journal.sync()
    full = {"left": 1}

    def full_disk(point: str, subject: str) -> None:
        hook.append(point)
        if point == "raft.journal.write" and full["left"]:
            full["left"] -= 1
            raise OSError(errno.ENOSPC, "No space left on device (test)", subject)

    _faults.install_io_fault_hook(full_disk)
    _fill(journal, 6, 9)
    journal.sync()
    assert hook == ["raft.journal.write", "raft.journal.write", "raft.journal.fsync"]
    assert journal.synced_index == 9
    assert reserve.released and not reserve.held and reserve.releases == 1
    assert not (tmp_path / RESERVE_FILE_NAME).exists()
    journal.close()
    reopened = DurableJournal(tmp_path)
    assert _indexes(reopened) == list(range(1, 10))
    reopened.close()
    # Space returned: the reserve is taken again.
    assert reserve.ensure() and reserve.held and not reserve.released


def test_a_full_disk_without_a_reserve_stops_the_journal(tmp_path: Path, hook) -> None:
    journal = DurableJournal(tmp_path, reserve=DiskReserve(tmp_path / RESERVE_FILE_NAME, 0))
    _fill(journal, 1, 3)
    journal.sync()

    def full_disk(point: str, subject: str) -> None:
        if point == "raft.journal.write":
            raise OSError(errno.ENOSPC, "No space left on device (test)", subject)

    _faults.install_io_fault_hook(full_disk)
    _fill(journal, 4, 6)
    with pytest.raises(FatalPeerError, match="No space left"):
        journal.sync()
    _faults.install_io_fault_hook(None)
    restarted = DurableJournal(tmp_path)
    assert _indexes(restarted) == [1, 2, 3]
    restarted.close()


def test_the_reserve_is_released_only_for_a_full_disk(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path / "raft" / RESERVE_FILE_NAME, 64 << 10)
    assert not reserve.held and not reserve.released and reserve.held_bytes == 0
    assert reserve.ensure()
    assert reserve.held_bytes == 64 << 10
    # Not a full disk: nothing released, the caller fails as before.
    assert not reserve.release_for(OSError(errno.EIO, "Input/output error"))
    assert not reserve.release_for(ValueError("no"))
    assert reserve.held
    # A full disk (ENOSPC, a quota, SQLite's "database or disk is full").
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert reserve.release_for(OSError(errno.ENOSPC, "No space left on device"))
    assert not reserve.held and reserve.released and reserve.held_bytes == 0
    # A second writer meeting the full disk in the same moment retries too.
    assert reserve.release_for(OSError(errno.ENOSPC, "No space left on device"))
    assert reserve.releases == 1
    # A new process finds the reserve file and knows it holds it.
    assert reserve.ensure()
    again = DiskReserve(tmp_path / "raft" / RESERVE_FILE_NAME, 64 << 10)
    assert again.held and not again.released
    # None configured: never held, never released, nothing on disk.
    none = DiskReserve(tmp_path / "none", 0)
    assert not none.ensure() and not none.release_for(OSError(errno.ENOSPC, "full"))
    assert not os.path.exists(tmp_path / "none")
