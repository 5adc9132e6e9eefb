"""Raft's own disk reserve: preallocated space that Raft gives back to itself when the disk
is full, so that coordination keeps working after something else filled it.

Lives here: `DiskReserve`, one preallocated file (``raft/reserve`` in the node's data
directory; CockroachDB's "emergency ballast" is the same idea). The Raft journal, its
metadata, snapshots and the event store (events.db) call `release_for(error)` when a
write fails with ENOSPC (or EDQUOT): the file goes, its blocks are free again, and the
failed write is tried once more; only then does a full disk stop the peer. The WAL never
uses it: the data plane refuses Produce above its hard watermark long before (see
`raftwal.node.disks`), and a WAL append that meets ENOSPC only fails its own batch. The
node's disk watch calls `ensure()` to take the reserve again once its filesystem is back
under the soft watermark.

A write that failed with ENOSPC wrote nothing or a prefix that the retry overwrites at the
same offset; no fsync failed, so retrying it is safe. A failed fsync is never retried
(raft/journal.py): ENOSPC from fsync is not released for here.

Must never: import `raftwal` or `wal_segments`; block without a bound; release for an
error that is not a full disk; raise from `ensure()` (a disk too full to take the reserve
back is logged and tried again later).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

RESERVE_FILE_NAME = "reserve"
#: errno values that mean "the disk is full" (a quota counts as full for this user).
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` says that the filesystem (or the user's quota) is full: an OSError
    with ENOSPC/EDQUOT, or SQLite's SQLITE_FULL ("database or disk is full")."""
    if isinstance(error, OSError):
        return error.errno in FULL_ERRNOS
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or "disk is full" in str(error)
    return False


class DiskReserve:
    """`size_bytes` preallocated in `path`; thread-safe (the tick thread, the event store's
    writer and the node's disk watch use it). `size_bytes` 0 keeps no reserve at all."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        if size_bytes < 0:
            raise ValueError(f"invalid reserve size ({size_bytes}; expected >= 0)")
        self.path = path
        self.size_bytes = size_bytes
        self._lock = threading.Lock()
        # Whether the whole reserve is on disk: read on every client write (the disk watch
        # refuses writes while it is released), so kept here rather than asked of the disk.
        try:
            self._held = size_bytes > 0 and path.stat().st_size >= size_bytes
        except OSError:
            self._held = False
        # Released for a full disk and not taken again since (a reserve never taken, for
        # lack of room at the start, is not "released": nothing was living on it).
        self._released = False
        #: times the reserve was released for a full disk
        self.releases = 0

    @property
    def held_bytes(self) -> int:
        """Bytes of the reserve on disk now (0: released, or none configured)."""
        return self.size_bytes if self._held else 0

    @property
    def held(self) -> bool:
        return self._held

    @property
    def released(self) -> bool:
        """A full disk made Raft give the reserve back, and it was not taken again yet."""
        return self._released

    def ensure(self) -> bool:
        """Take the reserve (create and preallocate the file, make it durable) unless it is
        held already; True when it is held afterwards. A disk too full for it is logged and
        left for a later call."""
        if self.size_bytes == 0:
            return False
        with self._lock:
            if self._held:
                return True
            temporary = self.path.with_name(self.path.name + ".tmp")
            try:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.posix_fallocate(fd, 0, self.size_bytes)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temporary, self.path)
                _fsync_directory(self.path.parent)
                self._held = True
                self._released = False
            except OSError as error:
                with contextlib.suppress(OSError):
                    temporary.unlink()
                logger.warning(
                    "cannot take the Raft disk reserve of %d bytes at %s (tried again later): %s",
                    self.size_bytes,
                    self.path,
                    error,
                )
                return False
            logger.info("Raft disk reserve of %d bytes held at %s", self.size_bytes, self.path)
            return True

    def release_for(self, error: BaseException) -> bool:
        """A write failed with `error`: when it is a full disk, give the reserve's space
        back (delete the file) if it is held, and return True so that the caller tries its
        write once more; also True when another writer released it already (the space may
        have come free just now: the journal and the event store meet a full disk at the
        same moment). False otherwise: not a full disk, or no reserve to live on."""
        if not is_disk_full(error):
            return False
        with self._lock:
            if not self._held:
                return self._released
            try:
                self.path.unlink()
            except FileNotFoundError:
                self._held = False
                return False
            except OSError as unlink_error:
                logger.error("cannot release the Raft disk reserve %s: %s", self.path, unlink_error)
                return False
            self._held = False
            self._released = True
            self.releases += 1
            try:
                # Some filesystems (ext4) hand freed blocks out again only once the
                # transaction that freed them commits: a directory fsync commits it now.
                _fsync_directory(self.path.parent)
            except OSError as sync_error:
                logger.warning(
                    "fsync of %s after the release failed: %s", self.path.parent, sync_error
                )
        logger.critical(
            "disk full (%s): released the Raft disk reserve of %d bytes at %s so that Raft "
            "keeps writing; free space on this node's data disk (docs/operations.md, Disks)",
            error,
            self.size_bytes,
            self.path,
        )
        return True


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
