"""PowerFS (raftwal/chaos/powerfs.py) against a real FUSE mount: what a power cut keeps
and what it drops.

Every test mounts a fresh PowerFS over a backing directory in tmp_path, writes through the
mount, closes everything (the "node" is dead), calls `crash()` and looks at what is left.
The mount is unmounted in the fixture's teardown even when a test fails. Skips only where
FUSE cannot be mounted (no /dev/fuse, no fusermount3, no libfuse), saying which.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.chaos.powerfs import STASH_NAME, PowerMount, fuse_unavailable, is_mounted
from tests.timing import scaled

_UNAVAILABLE = fuse_unavailable()
pytestmark = pytest.mark.skipif(bool(_UNAVAILABLE), reason=f"FUSE cannot mount: {_UNAVAILABLE}")


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[tuple[PowerMount, Path]]:
    power = PowerMount(tmp_path / "backing", tmp_path / "mnt", tmp_path / "powerfs.log")
    power.start()
    try:
        yield power, tmp_path / "mnt"
    finally:
        power.close()
        assert not is_mounted(tmp_path / "mnt"), "the mount outlived the test"


def _write(
    path: Path, data: bytes, *, sync: bool, flags: int = 0, offset: int | None = None
) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
    try:
        if offset is None:
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_unsynced_write_is_dropped_and_counted(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "f", b"durable", sync=True)
    _sync_dir(root)
    _write(root / "f", b"DUR", sync=False, offset=0)  # overwrites 3 durable bytes
    _write(root / "f", b"+appended", sync=False, offset=7)  # 9 bytes past the durable end
    assert (root / "f").read_bytes() == b"DURable+appended"
    result = power.crash()
    assert (root / "f").read_bytes() == b"durable"
    assert result.bytes_dropped == 3 + 9
    assert result.files_reverted == 1
    assert power.crashes == 1 and power.crashes_dropping == 1


def test_synced_write_is_kept(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "f", b"one", sync=True)
    _sync_dir(root)
    _write(root / "f", b"ONE, two", sync=True, offset=0)
    result = power.crash()
    assert (root / "f").read_bytes() == b"ONE, two"
    assert result.bytes_dropped == 0


def test_fdatasync_counts_as_a_sync(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "f", b"", sync=True)
    _sync_dir(root)
    fd = os.open(root / "f", os.O_WRONLY)
    try:
        os.pwrite(fd, b"record-1", 0)
        os.fdatasync(fd)
        os.pwrite(fd, b"record-2", 8)
    finally:
        os.close(fd)
    result = power.crash()
    assert (root / "f").read_bytes() == b"record-1"
    assert result.bytes_dropped == 8


def test_file_created_without_a_directory_fsync_vanishes(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "kept", b"k" * 10, sync=True)
    _sync_dir(root)
    _write(root / "lost", b"l" * 100, sync=True)  # the data is synced, its name is not
    result = power.crash()
    assert sorted(os.listdir(root)) == ["kept"]
    assert result.bytes_dropped == 100
    assert result.entries_reverted == 1


def test_a_synced_name_with_unsynced_data_comes_back_empty(
    mount: tuple[PowerMount, Path],
) -> None:
    power, root = mount
    _write(root / "f", b"data", sync=False)
    _sync_dir(root)
    power.crash()
    assert (root / "f").read_bytes() == b""


def test_rename_without_a_directory_fsync_is_reverted(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "target", b"old content", sync=True)
    _write(root / "target.tmp", b"new content", sync=True)
    _sync_dir(root)
    os.replace(root / "target.tmp", root / "target")
    assert sorted(os.listdir(root)) == ["target"]
    power.crash()
    # Both names are back, each with its own durable content: the rename never happened.
    assert (root / "target").read_bytes() == b"old content"
    assert (root / "target.tmp").read_bytes() == b"new content"


def test_rename_with_a_directory_fsync_is_kept(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "target", b"old content", sync=True)
    _write(root / "target.tmp", b"new content", sync=True)
    _sync_dir(root)
    os.replace(root / "target.tmp", root / "target")
    _sync_dir(root)
    result = power.crash()
    assert sorted(os.listdir(root)) == ["target"]
    assert (root / "target").read_bytes() == b"new content"
    assert result.entries_reverted == 0
    # The replaced file was purged from the stash, which the mount never shows.
    assert STASH_NAME not in os.listdir(root)
    assert os.listdir(power.backing / STASH_NAME) == []


def test_unlink_without_a_directory_fsync_is_reverted(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "a", b"aaa", sync=True)
    _sync_dir(root)
    os.unlink(root / "a")
    assert os.listdir(root) == []
    power.crash()
    assert (root / "a").read_bytes() == b"aaa"
    os.unlink(root / "a")
    _sync_dir(root)  # now the removal is durable
    power.crash()
    assert os.listdir(root) == []
    assert os.listdir(power.backing / STASH_NAME) == []


def test_truncation_is_reverted(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    _write(root / "f", b"0123456789", sync=True)
    _sync_dir(root)
    _write(root / "f", b"xy", sync=False, flags=os.O_TRUNC)
    assert (root / "f").read_bytes() == b"xy"
    power.crash()
    assert (root / "f").read_bytes() == b"0123456789"
    fd = os.open(root / "f", os.O_RDWR)
    try:
        os.ftruncate(fd, 4)
        os.pwrite(fd, b"AB", 6)  # a hole at 4..5, then AB
    finally:
        os.close(fd)
    assert (root / "f").read_bytes() == b"0123\0\0AB"
    power.crash()
    assert (root / "f").read_bytes() == b"0123456789"


def test_new_directory_vanishes_with_its_synced_content(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    (root / "wal").mkdir(mode=0o700)
    (root / "wal" / "p1").mkdir(mode=0o700)
    _write(root / "wal" / "p1" / "1.seg", b"s" * 50, sync=True)
    _sync_dir(root / "wal" / "p1")
    _sync_dir(root / "wal")
    # The root was never fsynced: "wal" itself is not durable, so nothing under it is.
    result = power.crash()
    assert os.listdir(root) == []
    assert result.bytes_dropped == 50
    (root / "wal").mkdir(mode=0o700)
    _sync_dir(root)
    (root / "wal" / "p1").mkdir(mode=0o700)
    _sync_dir(root / "wal")
    _write(root / "wal" / "p1" / "1.seg", b"s" * 50, sync=True)
    _sync_dir(root / "wal" / "p1")
    power.crash()
    assert (root / "wal" / "p1" / "1.seg").read_bytes() == b"s" * 50


def test_modes_and_inodes_pass_through(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    (root / "d").mkdir(mode=0o700)
    _write(root / "d" / "f", b"x", sync=True)
    assert oct(os.stat(root / "d").st_mode & 0o777) == oct(0o700)
    assert oct(os.stat(root / "d" / "f").st_mode & 0o777) == oct(0o600)
    inode = os.stat(root / "d" / "f").st_ino
    os.rename(root / "d" / "f", root / "d" / "g")
    assert os.stat(root / "d" / "g").st_ino == inode
    assert os.stat(power.backing / "d" / "g").st_ino == inode


_SQLITE_WRITER = textwrap.dedent(
    """
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={sys.argv[2]}")
    db.execute("PRAGMA wal_autocheckpoint=50")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body BLOB)")
    n = db.execute("SELECT coalesce(max(id), 0) FROM t").fetchone()[0]
    while True:
        n += 1
        db.execute("BEGIN")
        db.execute("INSERT INTO t VALUES (?, ?)", (n, bytes(300) + n.to_bytes(4, "big")))
        db.execute("COMMIT")
        print(n, flush=True)
    """
)


def _commit_then_kill(database: Path, synchronous: str, until: int) -> int:
    """Run a writer process until it reports commit `until`, SIGKILL it, and return the
    last commit it reported (acknowledged)."""
    writer = subprocess.Popen(
        [sys.executable, "-c", _SQLITE_WRITER, str(database), synchronous],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    committed = 0
    try:
        assert writer.stdout is not None
        for line in writer.stdout:
            committed = int(line)
            if committed >= until:
                break
    finally:
        writer.kill()
        writer.wait(timeout=scaled(30))
    assert committed >= until, f"the writer stopped at {committed} (expected {until})"
    return committed


def _surviving_rows(database: Path) -> tuple[int, int]:
    """(max id, row count) of an intact database (0, 0 when the table is gone)."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        try:
            highest, count = db.execute("SELECT max(id), count(*) FROM t").fetchone()
        except sqlite3.OperationalError:
            return 0, 0
    return highest or 0, count


def test_sqlite_with_synchronous_full_keeps_every_committed_transaction(
    mount: tuple[PowerMount, Path],
) -> None:
    power, root = mount
    database = root / "events.db"
    dropped = 0
    for round_number in range(3):
        # A few hundred commits each (checkpoints run every 50 pages), then the cut.
        committed = _commit_then_kill(database, "FULL", 400 * (round_number + 1))
        dropped += power.crash().bytes_dropped
        highest, count = _surviving_rows(database)
        assert highest >= committed, (
            f"round {round_number}: {committed} acknowledged, {highest} kept"
        )
        assert highest == count
    assert power.crashes == 3
    # The shared-memory index (mmapped, never fsynced) at least is dropped each time.
    assert dropped > 0


def test_sqlite_without_fsync_loses_committed_transactions(
    mount: tuple[PowerMount, Path],
) -> None:
    # The control experiment: the same writer with synchronous=OFF never fsyncs, so a
    # power cut takes acknowledged commits with it (here all of them).
    power, root = mount
    database = root / "events.db"
    committed = _commit_then_kill(database, "OFF", 400)
    result = power.crash()
    highest, _count = _surviving_rows(database)
    assert highest < committed
    assert result.bytes_dropped > 400 * 300


def test_close_unmounts_after_the_daemon_died(tmp_path: Path) -> None:
    power = PowerMount(tmp_path / "backing", tmp_path / "mnt", tmp_path / "powerfs.log")
    power.start()
    try:
        assert power.pid is not None
        os.kill(power.pid, signal.SIGKILL)
        power.process.wait(timeout=scaled(30))  # type: ignore[union-attr]
    finally:
        power.close()
    assert not is_mounted(tmp_path / "mnt")


# -- disk faults (PowerMount.set_faults): a full disk, a slow one, failing fsyncs ---------


def test_a_budget_makes_a_small_disk_that_fills_up(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    report = power.set_faults(budget_bytes=1 << 20)
    assert report["budget_bytes"] == 1 << 20 and report["used_bytes"] == 0
    st = os.statvfs(root)
    assert (st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize) == (1 << 20, 1 << 20)
    fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    written = 0
    try:
        with pytest.raises(OSError) as raised:
            while True:
                written += os.write(fd, b"x" * 300_000)
    finally:
        os.close(fd)
    assert raised.value.errno == errno.ENOSPC
    # A short write took what fitted, then the next write failed: exactly the budget.
    assert written == 1 << 20 == (root / "f").stat().st_size
    assert os.statvfs(root).f_bavail == 0
    with pytest.raises(OSError) as raised:
        os.truncate(root / "f", (1 << 20) + 1)
    assert raised.value.errno == errno.ENOSPC
    (root / "f").unlink()
    assert os.statvfs(root).f_bavail * os.statvfs(root).f_frsize == 1 << 20
    assert power.usage()["enospc"] == 2


def test_a_failed_fsync_loses_the_unsynced_writes(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"durable")
        os.fsync(fd)
        _sync_dir(root)
        power.set_faults(fsync_errors=1, match="/f")
        os.write(fd, b"-lost")
        with pytest.raises(OSError) as raised:
            os.fsync(fd)
        assert raised.value.errno == errno.EIO
        # Lost at once; a later fsync that succeeds does not bring them back.
        os.fsync(fd)
    finally:
        os.close(fd)
    assert (root / "f").read_bytes() == b"durable"
    assert power.usage()["failed_fsyncs"] == 1
    power.crash()
    assert (root / "f").read_bytes() == b"durable"


def test_a_slow_disk_delays_every_fsync(mount: tuple[PowerMount, Path]) -> None:
    power, root = mount
    power.set_faults(fsync_delay_ms=300)
    fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"slow")
        started = time.monotonic()
        os.fsync(fd)
        assert time.monotonic() - started >= 0.3
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="fsync_delay_ms"):
        power.set_faults(fsync_delay_ms=-1)
    assert power.usage()["delayed_fsyncs"] == 1


def test_ftruncate_of_a_file_whose_name_was_unlinked(mount: tuple[PowerMount, Path]) -> None:
    """A WAL segment is written through its temporary name, linked under its final name,
    and the temporary name removed: cutting a failed append back then truncates a file
    open under a name that is gone (libfuse passes no path; this failed with EBADF), and
    the final name must show what was written through the other (it showed a stale size)."""
    _power, root = mount
    fd = os.open(root / "t.tmp", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"header", 0)
        os.fdatasync(fd)
        os.link(root / "t.tmp", root / "t.seg")
        os.unlink(root / "t.tmp")
        os.pwrite(fd, b"+more", 6)
        assert (root / "t.seg").read_bytes() == b"header+more"
        os.ftruncate(fd, 6)
        assert (root / "t.seg").read_bytes() == b"header"
    finally:
        os.close(fd)
