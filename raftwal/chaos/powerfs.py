"""A power-cut filesystem for real node processes (LazyFS-style, FUSE through mfusepy).

``PowerFS`` passes every operation through to a backing directory and keeps an UNDO log
of what is not durable yet, so that a "power cut" can put the backing directory back to
exactly what a crash of the machine would have left on disk:

- file data: before a write or a truncate changes bytes of a file that its durable image
  covers (the first ``durable_size`` bytes), the old bytes are saved, once per byte;
  bytes past the durable size are simply cut off. ``fsync``/``fdatasync`` of the file
  makes its current content and size durable (its undo records are dropped);
- directory entries: create, mknod, mkdir, symlink, link, unlink, rmdir and rename
  (a replaced target included) are undone unless a directory they changed was fsynced
  since (``fsyncdir``). Unlinked, removed and replaced entries wait in a hidden stash
  inside the backing directory (``.powerfs-stash``, invisible through the mount) so that
  they can be put back; a directory fsync purges the stash entries it made final.

A crash is: the node's process is already SIGKILLed by the caller; the filesystem is
unmounted (so that the kernel's page cache can never serve a reverted page again), the
undo log is applied (data first, then directory entries in reverse order), the bytes
dropped are counted, and a fresh mount takes its place (``PowerMount.crash``).

Each mount is served by a daemon process of its own (``python -m raftwal.chaos.powerfs
serve``), which the test or the chaos runner controls over its stdin/stdout: ``crash`` or
``stop`` in, one JSON line out. What it does not model (RELIABILITY.md says so too): torn
writes within one write call or one page; reordering between writes before a sync (a cut
drops every unsynced write of every file, never a subset); the kernel's own metadata
journaling (only a directory fsync makes its entries durable, as POSIX says, though ext4
would usually commit them with any fsync); file modes and times (not reverted). An fsync
does not reach the host's disk: the host does not crash, only the simulated machine does.

Disk faults (`DiskFaults`, switched at runtime: ``faults {json}`` on the daemon's stdin,
`PowerMount.set_faults`), for ``raftwal chaos --faults disk-full,slow-disk,fsync-error``
and the disk tests:

- ``budget_bytes``: the filesystem holds that many bytes of file data (the sizes of the
  regular files under the mount) and no more. A write or an extension past it writes what
  fits and fails with ENOSPC, as a full disk does; ``statfs`` (``df``, ``os.statvfs``)
  reports the budget as the size and what is left as free. Deleting files frees space.
- ``fsync_delay_ms``: every fsync, fdatasync and directory fsync takes that much longer (a
  slow disk); other operations are not delayed;
- ``fsync_errors``: the next so many file fsyncs (of files whose path, as they were
  opened, contains ``match``) fail with
  EIO, and the file's writes since its last successful fsync are lost at once: its
  content goes back to its durable image, as a disk that failed to write the dirty pages
  and a kernel that dropped them. A later fsync that succeeds does not bring them back.

Must never: let an operation through without its undo record (one lock covers the
bookkeeping and the operation), follow a path outside the backing directory, show the
stash through the mount, or leave a mount behind (the daemon unmounts on ``stop``, on a
closed stdin and on SIGTERM; ``PowerMount.close`` falls back to ``fusermount3 -uz``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

STASH_NAME = ".powerfs-stash"
#: How long a daemon may take to mount, and to unmount and revert: generous bounds (each
#: wait ends as soon as its condition holds), multiplied by RAFTWAL_TIMEOUT_SCALE on a
#: slow or loaded machine.
TIMEOUT_SCALE = max(1.0, float(os.environ.get("RAFTWAL_TIMEOUT_SCALE", "1") or 1))
MOUNT_TIMEOUT_S = 30.0 * TIMEOUT_SCALE
UNMOUNT_TIMEOUT_S = 60.0 * TIMEOUT_SCALE
#: Attempts at a plain unmount (EBUSY while the kernel still holds the last references of
#: a killed process) before a lazy one.
UNMOUNT_ATTEMPTS = 30


def fusermount() -> str:
    """The fusermount binary (FUSE 3 first)."""
    for name in ("fusermount3", "fusermount"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError("fusermount3 not found: run scripts/install-fuse.sh")


def fuse_unavailable() -> str:
    """Why a PowerFS cannot be mounted here ("" when it can): for tests to skip on."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    try:
        fusermount()
    except FileNotFoundError as error:
        return str(error)
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as error:
        return f"mfusepy cannot load libfuse: {error}"
    return ""


def is_mounted(path: Path) -> bool:
    """True when `path` is a mount point (read from /proc/self/mountinfo, which does not
    touch the filesystem itself: a dead FUSE daemon would make os.path.ismount fail)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 4 and _unescape_mount_path(fields[4]) == target:
                    return True
    except OSError:
        return os.path.ismount(path)
    return False


def _unescape_mount_path(text: str) -> str:
    return (
        text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


# ---------------------------------------------------------------------------------------
# The filesystem
# ---------------------------------------------------------------------------------------


@dataclass
class _FileUndo:
    """What a crash must do to one inode's data: restore `saved` and cut at `durable_size`."""

    durable_size: int
    #: (offset, old bytes): disjoint ranges inside [0, durable_size)
    saved: list[tuple[int, bytes]] = field(default_factory=list)
    #: merged [start, end) ranges already saved (a byte is saved once)
    covered: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _EntryUndo:
    """One directory-entry change not yet durable (see module doc)."""

    kind: str  # create | remove | rename | link
    #: directories (relative to the root, "/" for the root) whose fsync makes it durable
    dirs: frozenset[str]
    path: str
    #: rename: the new name
    new: str = ""
    #: remove: where the entry waits; rename: where the replaced target waits ("" if none)
    stash: str = ""


@dataclass
class CrashResult:
    """What one power cut undid."""

    bytes_dropped: int = 0
    files_reverted: int = 0
    entries_reverted: int = 0
    undo_conflicts: int = 0

    def as_json(self) -> dict[str, int]:
        return {
            "bytes_dropped": self.bytes_dropped,
            "files_reverted": self.files_reverted,
            "entries_reverted": self.entries_reverted,
            "undo_conflicts": self.undo_conflicts,
        }


#: The keys of a `faults` command and their bounds.
DISK_FAULT_LIMITS = {
    "budget_bytes": (0, 1 << 50),
    "fsync_delay_ms": (0, 60_000),
    "fsync_errors": (0, 1_000_000),
}
#: statfs block size of a mount with a budget.
BUDGET_BLOCK_BYTES = 4096


@dataclass
class DiskFaults:
    """What a mount injects besides power cuts (see the module doc); zeros: nothing."""

    budget_bytes: int = 0
    fsync_delay_ms: int = 0
    fsync_errors: int = 0
    #: fsync_errors hit only files whose path (under the mount) contains this
    match: str = ""

    @classmethod
    def parse(cls, raw: object) -> DiskFaults:
        """From a `faults` command's JSON object; ValueError saying what was expected."""
        if not isinstance(raw, dict):
            raise ValueError(f"invalid disk faults ({raw!r}; expected an object)")
        unknown = set(raw) - {*DISK_FAULT_LIMITS, "match"}
        if unknown:
            raise ValueError(
                f"invalid disk fault keys {sorted(unknown)} (expected "
                f"{sorted({*DISK_FAULT_LIMITS, 'match'})})"
            )
        values: dict[str, Any] = {}
        for key, (low, high) in DISK_FAULT_LIMITS.items():
            value = raw.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"invalid {key} ({value!r}; expected {low}..{high})")
            values[key] = value
        match = raw.get("match", "")
        if not isinstance(match, str):
            raise ValueError(f"invalid match ({match!r}; expected a string)")
        return cls(match=match, **values)


def _parent(path: str) -> str:
    parent = os.path.dirname(path.rstrip("/")) or "/"
    return parent


def _missing_ranges(covered: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) that `covered` (sorted, disjoint) does not cover."""
    missing = []
    position = start
    for low, high in covered:
        if high <= position:
            continue
        if low >= end:
            break
        if low > position:
            missing.append((position, low))
        position = max(position, high)
        if position >= end:
            break
    if position < end:
        missing.append((position, end))
    return missing


def _merge(covered: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    ranges = sorted([*covered, (start, end)])
    merged: list[tuple[int, int]] = []
    for low, high in ranges:
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _operations_base() -> type:
    import mfusepy

    return mfusepy.Operations  # type: ignore[no-any-return]


class PowerFS(_operations_base()):  # type: ignore[misc]
    """Passthrough to `backing` with an undo log of everything not yet durable."""

    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.backing = str(Path(backing).resolve())
        self.stash = os.path.join(self.backing, STASH_NAME)
        os.makedirs(self.stash, mode=0o700, exist_ok=True)
        self._lock = threading.RLock()
        self._files: dict[int, _FileUndo] = {}
        self._entries: list[_EntryUndo] = []
        self._stash_serial = 0
        self.writes = 0
        self.fsyncs = 0
        self.dir_fsyncs = 0
        self.faults = DiskFaults()
        #: open file handle -> the path it was opened or created under
        self._opened_as: dict[int, str] = {}
        #: bytes of regular files under the mount (the stash excluded): what a budget counts
        self.used_bytes = self._usage()
        #: writes refused for lack of space, fsyncs failed and fsyncs delayed, so far
        self.enospc = 0
        self.failed_fsyncs = 0
        self.delayed_fsyncs = 0

    # ------------------------------------------------------------------ paths

    def _real(self, path: str) -> str:
        if path is None:
            raise OSError(errno.EBADF, "no path")
        parts = [p for p in path.split("/") if p]
        if parts and parts[0] == STASH_NAME:
            raise OSError(errno.ENOENT, path)
        if any(p == ".." for p in parts):
            raise OSError(errno.EACCES, path)
        return os.path.join(self.backing, *parts) if parts else self.backing

    def _stash_path(self) -> str:
        self._stash_serial += 1
        return os.path.join(self.stash, f"{self._stash_serial:012d}")

    # ------------------------------------------------------------- bookkeeping

    def _state(self, ino: int, size: int) -> _FileUndo:
        """The undo state of an inode; one seen for the first time is durable as it is."""
        state = self._files.get(ino)
        if state is None:
            state = self._files[ino] = _FileUndo(durable_size=size)
        return state

    def _save(self, fd: int, state: _FileUndo, start: int, end: int) -> None:
        """Save the durable bytes of [start, end) that are about to change."""
        end = min(end, state.durable_size)
        if start >= end:
            return
        for low, high in _missing_ranges(state.covered, start, end):
            old = _pread_all(fd, high - low, low)
            # Bytes past the file's current end are zeros of a truncation already saved.
            state.saved.append((low, old))
            state.covered = _merge(state.covered, low, high)

    def _record(self, change: _EntryUndo) -> None:
        self._entries.append(change)

    # ----------------------------------------------------------- disk faults

    def _usage(self) -> int:
        """Bytes of the regular files under the backing directory, the stash excluded."""
        total = 0
        for directory, dirs, files in os.walk(self.backing):
            if directory == self.backing and STASH_NAME in dirs:
                dirs.remove(STASH_NAME)
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(directory, name))
                    if stat.S_ISREG(st.st_mode):
                        total += st.st_size
        return total

    def set_faults(self, faults: DiskFaults) -> dict[str, Any]:
        """Switch the disk faults (the counts and usage so far are kept)."""
        with self._lock:
            self.faults = faults
            self.used_bytes = self._usage()
            return self.fault_report()

    def fault_report(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.faults.budget_bytes,
            "fsync_delay_ms": self.faults.fsync_delay_ms,
            "fsync_errors_left": self.faults.fsync_errors,
            "match": self.faults.match,
            "used_bytes": self.used_bytes,
            "enospc": self.enospc,
            "failed_fsyncs": self.failed_fsyncs,
            "delayed_fsyncs": self.delayed_fsyncs,
        }

    def _fit(self, size: int, offset: int, length: int) -> int:
        """How many of `length` bytes written at `offset` of a file of `size` bytes fit
        the budget (all of them without one); raises ENOSPC when none does."""
        budget = self.faults.budget_bytes
        growth = max(0, offset + length - size)
        if not budget or growth <= budget - self.used_bytes:
            return length
        room = max(0, budget - self.used_bytes)
        fits = length - (growth - room)
        if fits <= 0:
            self.enospc += 1
            raise OSError(errno.ENOSPC, "no space left on the budget of this mount")
        return fits

    def _grown(self, before: int, after: int) -> None:
        self.used_bytes = max(0, self.used_bytes + after - before)

    def _drop_unsynced(self, fd: int, ino: int) -> None:
        """A failed fsync: the file's writes since its last successful one are lost (its
        content goes back to its durable image now)."""
        state = self._files.get(ino)
        if state is None:
            return
        size = os.fstat(fd).st_size
        for offset, old in state.saved:
            _pwrite_all(fd, old, offset)
        os.ftruncate(fd, state.durable_size)
        self._grown(size, state.durable_size)
        self._files[ino] = _FileUndo(durable_size=state.durable_size)

    def _slow_sync(self) -> None:
        delay_ms = self.faults.fsync_delay_ms
        if delay_ms:
            self.delayed_fsyncs += 1
            time.sleep(delay_ms / 1000)

    # ----------------------------------------------------------- attributes

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._lock:
            st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        return {
            key: getattr(st, key)
            for key in (
                "st_mode",
                "st_ino",
                "st_nlink",
                "st_uid",
                "st_gid",
                "st_size",
                "st_blocks",
                "st_blksize",
            )
        } | {
            "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
        }

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, path)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.lchown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        try:
            os.utime(self._real(path), ns=times, follow_symlinks=False)
        except (OverflowError, ValueError):
            # UTIME_NOW / UTIME_OMIT arrive folded into nanoseconds: take "now".
            os.utime(self._real(path), follow_symlinks=False)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.backing)
        budget = self.faults.budget_bytes
        if budget:
            blocks = budget // BUDGET_BLOCK_BYTES
            free = max(0, budget - self.used_bytes) // BUDGET_BLOCK_BYTES
            return {
                "f_bsize": BUDGET_BLOCK_BYTES,
                "f_frsize": BUDGET_BLOCK_BYTES,
                "f_blocks": blocks,
                "f_bfree": free,
                "f_bavail": free,
                "f_files": st.f_files,
                "f_ffree": st.f_ffree,
                "f_favail": st.f_favail,
                "f_flag": st.f_flag,
                "f_namemax": st.f_namemax,
            }
        return {
            key: getattr(st, key)
            for key in (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
        }

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # With use_ino each entry needs its inode number: an entry of inode 0 reads as a
        # deleted one and `ls` skips it.
        real = self._real(path)
        entries = []
        for name in (".", "..", *os.listdir(real)):
            if name == STASH_NAME and real == self.backing:
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(real, name))
                entries.append((name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
        return entries

    # ------------------------------------------------------------ file data

    def open(self, path: str, flags: int) -> int:
        with self._lock:
            real = self._real(path)
            if flags & os.O_TRUNC:
                self._truncate_path(real, 0)
                flags &= ~os.O_TRUNC
            fd = self._open_backing(real, flags, 0)
            self._opened_as[fd] = path
            return fd

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        with self._lock:
            real = self._real(path)
            existed = os.path.lexists(real)
            if existed and flags & os.O_TRUNC:
                self._truncate_path(real, 0)
            fd = self._open_backing(real, (flags | os.O_CREAT) & ~os.O_TRUNC, mode)
            self._opened_as[fd] = path
            if not existed:
                self._files[os.fstat(fd).st_ino] = _FileUndo(durable_size=0)
                self._record(_EntryUndo("create", frozenset({_parent(path)}), path))
            return fd

    @staticmethod
    def _open_backing(real: str, flags: int, mode: int) -> int:
        # Writes arrive with the kernel's offsets (it resolves O_APPEND itself), and the
        # undo log must read what a write replaces: open read-write, without O_APPEND.
        flags &= ~os.O_APPEND
        if flags & os.O_ACCMODE == os.O_WRONLY:
            with contextlib.suppress(PermissionError):
                return os.open(real, (flags & ~os.O_ACCMODE) | os.O_RDWR, mode)
        return os.open(real, flags, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._lock:
            st = os.fstat(fh)
            fits = self._fit(st.st_size, offset, len(data))
            if fits < len(data):
                data = data[:fits]  # a short write; the next one gets ENOSPC
            state = self._state(st.st_ino, st.st_size)
            self._save(fh, state, offset, offset + len(data))
            self.writes += 1
            written = _pwrite_all(fh, data, offset)
            self._grown(st.st_size, max(st.st_size, offset + written))
            return written

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode != 0:
            raise OSError(errno.EOPNOTSUPP, "only plain fallocate (mode 0) is supported")
        with self._lock:
            st = os.fstat(fh)
            if self._fit(st.st_size, offset, size) < size:
                self.enospc += 1
                raise OSError(errno.ENOSPC, "no space left on the budget of this mount")
            self._state(st.st_ino, st.st_size)
            os.posix_fallocate(fh, offset, size)
            self._grown(st.st_size, max(st.st_size, offset + size))
        return 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._lock:
            if fh is not None:
                st = os.fstat(fh)
                if length > st.st_size:
                    self._fit(st.st_size, st.st_size, length - st.st_size)
                state = self._state(st.st_ino, st.st_size)
                if length < st.st_size:
                    self._save(fh, state, length, st.st_size)
                os.ftruncate(fh, length)
                self._grown(st.st_size, length)
            else:
                self._truncate_path(self._real(path), length)
        return 0

    def _truncate_path(self, real: str, length: int) -> None:
        fd = os.open(real, os.O_RDWR)
        try:
            st = os.fstat(fd)
            if length > st.st_size:
                self._fit(st.st_size, st.st_size, length - st.st_size)
            state = self._state(st.st_ino, st.st_size)
            if length < st.st_size:
                self._save(fd, state, length, st.st_size)
            os.ftruncate(fd, length)
            self._grown(st.st_size, length)
        finally:
            os.close(fd)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        # A slow disk: outside the lock, so that the other operations go on meanwhile.
        self._slow_sync()
        with self._lock:
            st = os.fstat(fh)
            faults = self.faults
            # The name the file was opened under: a file whose name was unlinked since (a
            # WAL segment written through its temporary name) comes without a path.
            name = path or self._opened_as.get(fh, "")
            if faults.fsync_errors and faults.match in name:
                faults.fsync_errors -= 1
                self.failed_fsyncs += 1
                self._drop_unsynced(fh, st.st_ino)
                raise OSError(errno.EIO, "injected fsync failure (the unsynced writes are lost)")
            self._files[st.st_ino] = _FileUndo(durable_size=st.st_size)
            self.fsyncs += 1
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            self._opened_as.pop(fh, None)
        os.close(fh)
        return 0

    # ----------------------------------------------------- directory entries

    def mkdir(self, path: str, mode: int) -> int:
        with self._lock:
            os.mkdir(self._real(path), mode)
            self._record(_EntryUndo("create", frozenset({_parent(path)}), path))
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        with self._lock:
            os.mknod(self._real(path), mode, dev)
            if stat.S_ISREG(mode):
                self._files[os.lstat(self._real(path)).st_ino] = _FileUndo(durable_size=0)
            self._record(_EntryUndo("create", frozenset({_parent(path)}), path))
        return 0

    def symlink(self, target: str, source: str) -> int:
        # mfusepy: `target` is the new link's path, `source` what it points to.
        with self._lock:
            os.symlink(source, self._real(target))
            self._record(_EntryUndo("create", frozenset({_parent(target)}), target))
        return 0

    def link(self, target: str, source: str) -> int:
        # mfusepy: `target` is the new name, `source` the existing file.
        with self._lock:
            os.link(self._real(source), self._real(target), follow_symlinks=False)
            self._record(_EntryUndo("link", frozenset({_parent(target)}), target))
        return 0

    def unlink(self, path: str) -> int:
        with self._lock:
            real = self._real(path)
            st = os.lstat(real)
            if stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EISDIR, path)
            stash = self._stash_path()
            os.rename(real, stash)
            if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
                self._grown(st.st_size, 0)
            self._record(_EntryUndo("remove", frozenset({_parent(path)}), path, stash=stash))
        return 0

    def rmdir(self, path: str) -> int:
        with self._lock:
            real = self._real(path)
            if not stat.S_ISDIR(os.lstat(real).st_mode):
                raise OSError(errno.ENOTDIR, path)
            if os.listdir(real):
                raise OSError(errno.ENOTEMPTY, path)
            stash = self._stash_path()
            os.rename(real, stash)
            self._record(_EntryUndo("remove", frozenset({_parent(path)}), path, stash=stash))
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._lock:
            real_old, real_new = self._real(old), self._real(new)
            old_st = os.lstat(real_old)
            if os.path.samefile(os.path.dirname(real_old), os.path.dirname(real_new)) and (
                os.path.basename(real_old) == os.path.basename(real_new)
            ):
                return 0
            stash = ""
            if os.path.lexists(real_new):
                new_st = os.lstat(real_new)
                if new_st.st_ino == old_st.st_ino:
                    return 0  # two names of one file: rename does nothing
                if stat.S_ISDIR(new_st.st_mode):
                    if not stat.S_ISDIR(old_st.st_mode):
                        raise OSError(errno.EISDIR, new)
                    if os.listdir(real_new):
                        raise OSError(errno.ENOTEMPTY, new)
                elif stat.S_ISDIR(old_st.st_mode):
                    raise OSError(errno.ENOTDIR, new)
                stash = self._stash_path()
                os.rename(real_new, stash)
                if stat.S_ISREG(new_st.st_mode) and new_st.st_nlink <= 1:
                    self._grown(new_st.st_size, 0)
            try:
                os.rename(real_old, real_new)
            except OSError:
                if stash:
                    os.rename(stash, real_new)
                raise
            self._record(
                _EntryUndo(
                    "rename",
                    frozenset({_parent(old), _parent(new)}),
                    old,
                    new=new,
                    stash=stash,
                )
            )
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        directory = "/" + "/".join(p for p in (path or "/").split("/") if p)
        self._slow_sync()
        with self._lock:
            kept = []
            for change in self._entries:
                if directory in change.dirs:
                    if change.stash:
                        self._purge(change.stash)
                else:
                    kept.append(change)
            self._entries = kept
            self.dir_fsyncs += 1
        return 0

    def _purge(self, stash: str) -> None:
        """A removal became durable: the stashed entry is gone for good."""
        try:
            st = os.lstat(stash)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(stash, ignore_errors=True)
            return
        if st.st_nlink <= 1:
            self._files.pop(st.st_ino, None)
        os.unlink(stash)

    # ------------------------------------------------------------------ crash

    def revert(self) -> CrashResult:
        """Apply the undo log to the backing directory (call with the filesystem unmounted):
        afterwards it holds exactly what was durable."""
        result = CrashResult()
        with self._lock:
            paths = self._inode_paths()
            for ino, state in self._files.items():
                path = paths.get(ino)
                if path is None:
                    continue  # removed for good (a durable unlink)
                fd = os.open(path, os.O_RDWR)
                try:
                    size = os.fstat(fd).st_size
                    changed = size != state.durable_size
                    result.bytes_dropped += max(0, size - state.durable_size)
                    for offset, old in state.saved:
                        current = os.pread(fd, len(old), offset)
                        if current != old:
                            result.bytes_dropped += len(old)
                            changed = True
                        _pwrite_all(fd, old, offset)
                    os.ftruncate(fd, state.durable_size)
                    result.files_reverted += int(changed)
                    if changed:
                        logger.info(
                            "crash: %s back to its durable %d bytes (was %d, %d ranges restored)",
                            os.path.relpath(path, self.backing),
                            state.durable_size,
                            size,
                            len(state.saved),
                        )
                finally:
                    os.close(fd)
            for change in reversed(self._entries):
                try:
                    dropped = self._undo(change)
                    result.bytes_dropped += dropped
                    result.entries_reverted += 1
                    logger.info(
                        "crash: undid %s %s%s (%d bytes of data with it)",
                        change.kind,
                        change.path,
                        f" -> {change.new}" if change.new else "",
                        dropped,
                    )
                except OSError as error:
                    # A later change was made durable on top of this one (e.g. the entry
                    # it created was renamed away and that directory fsynced): what is on
                    # disk is the durable outcome.
                    result.undo_conflicts += 1
                    logger.info("undo of %s left as is: %s", change, error)
            self._entries = []
            self._files = {}
            shutil.rmtree(self.stash, ignore_errors=True)
            os.makedirs(self.stash, mode=0o700, exist_ok=True)
            self.used_bytes = self._usage()
        return result

    def _inode_paths(self) -> dict[int, str]:
        found: dict[int, str] = {}
        for directory, _dirs, files in os.walk(self.backing):
            for name in files:
                path = os.path.join(directory, name)
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode):
                        found.setdefault(st.st_ino, path)
        return found

    def _undo(self, change: _EntryUndo) -> int:
        """Undo one entry change; returns the bytes of file data it took away."""
        if change.kind in ("create", "link"):
            real = self._real(change.path)
            st = os.lstat(real)
            if stat.S_ISDIR(st.st_mode):
                dropped = sum(
                    os.lstat(os.path.join(d, f)).st_size
                    for d, _, files in os.walk(real)
                    for f in files
                )
                shutil.rmtree(real)
                return dropped
            os.unlink(real)
            # A new name of a file that stays (a link) drops no data.
            return st.st_size if change.kind == "create" and st.st_nlink <= 1 else 0
        if change.kind == "remove":
            real = self._real(change.path)
            if os.path.lexists(real):
                raise OSError(errno.EEXIST, f"{change.path} exists again")
            os.rename(change.stash, real)
            return 0
        assert change.kind == "rename", change
        real_old, real_new = self._real(change.path), self._real(change.new)
        os.lstat(real_new)
        if os.path.lexists(real_old):
            raise OSError(errno.EEXIST, f"{change.path} exists again")
        os.rename(real_new, real_old)
        if change.stash:
            os.rename(change.stash, real_new)
        return 0


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    data = b"".join(chunks)
    # Past the end of the file a read returns nothing; the bytes there are zeros (a hole or
    # a truncation), and the restore writes them back as zeros.
    return data + bytes(size)


def _pwrite_all(fd: int, data: bytes, offset: int) -> int:
    view = memoryview(data)
    total = 0
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {written} bytes")
        total += written
        offset += written
        view = view[written:]
    return total


# ---------------------------------------------------------------------------------------
# The daemon (one process per mount)
# ---------------------------------------------------------------------------------------


def _unmount(mountpoint: str) -> None:
    """Unmount `mountpoint`: plain first (bounded retries while busy), lazy at last."""
    binary = fusermount()
    for _ in range(UNMOUNT_ATTEMPTS):
        done = subprocess.run(
            [binary, "-u", mountpoint], capture_output=True, text=True, check=False
        )
        if done.returncode == 0 or not is_mounted(Path(mountpoint)):
            return
        time.sleep(0.1)
    subprocess.run([binary, "-u", "-z", mountpoint], capture_output=True, check=False)


def _fuse_class() -> type:
    import mfusepy

    class FUSE(mfusepy.FUSE):  # type: ignore[misc]
        """mfusepy's FUSE, with `ftruncate` passing the open file's handle: mfusepy drops
        it, so an ftruncate of a file whose name was unlinked since it was opened (a WAL
        segment is created under a temporary name, linked under its final one, and the
        temporary name removed) arrived with no path and no handle, and failed with EBADF.
        (An fstat of such a file still fails, with ESTALE: libfuse's high-level API asks
        for a path there; nothing here relies on it.)"""

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            fh = fip.contents.fh if fip else None
            name = None if path is None else path.decode(self.encoding, self.errors)
            return int(self.operations.truncate(name, length, fh))

    return FUSE


def serve(backing: Path, mountpoint: Path, out: IO[str]) -> int:
    """Mount PowerFS at `mountpoint` and serve it until stdin says `crash` or `stop` (or
    closes: then stop). Prints one JSON line when mounted and one when done."""
    _FUSE = _fuse_class()
    os.umask(0)
    operations = PowerFS(backing)
    mode = {"command": "stop"}
    mount = str(mountpoint.resolve())

    def announce(_path: str) -> None:
        print(json.dumps({"event": "mounted", "pid": os.getpid()}), file=out, flush=True)

    operations.init = announce

    def control() -> None:
        for line in sys.stdin:
            command = line.strip()
            if command in ("crash", "stop"):
                mode["command"] = command
                break
            if command == "faults" or command.startswith("faults "):
                # Disk faults: switched while mounted, answered with one JSON line.
                try:
                    faults = DiskFaults.parse(json.loads(command[len("faults") :] or "{}"))
                    answer = {"event": "faults", **operations.set_faults(faults)}
                except ValueError as error:
                    answer = {"event": "error", "error": str(error)}
                print(json.dumps(answer), file=out, flush=True)
            elif command == "usage":
                with operations._lock:
                    report = operations.fault_report()
                print(json.dumps({"event": "usage", **report}), file=out, flush=True)
        _unmount(mount)

    threading.Thread(target=control, name="powerfs-control", daemon=True).start()
    _FUSE(
        operations,
        mount,
        foreground=True,
        nothreads=False,
        use_ino=True,
        hard_remove=True,
        # Coherence: libfuse's high-level API gives a hard link (a WAL segment is written
        # through its temporary name, then linked under its final one) an inode of its own
        # in the kernel, so the final name's cached size and pages could lag behind the
        # writes made through the other: no attribute or entry caching, and page cache
        # invalidated whenever the attributes show a change.
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        auto_cache=True,
        fsname=f"powerfs:{backing}",
        subtype="powerfs",
    )
    result = operations.revert() if mode["command"] == "crash" else CrashResult()
    print(
        json.dumps({"event": mode["command"], **result.as_json(), "writes": operations.writes}),
        file=out,
        flush=True,
    )
    return 0


class PowerMount:
    """A PowerFS daemon serving `backing` at `mountpoint`, controlled by its pid and pipes.

    `crash()` (the node using it already SIGKILLed) drops what was not durable and mounts
    afresh; `close()` unmounts without dropping anything (a clean shutdown)."""

    def __init__(self, backing: Path, mountpoint: Path, log_path: Path | None = None) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self.crashes = 0
        self.bytes_dropped = 0
        self.crashes_dropping = 0
        # One question to the daemon at a time (its answers come on one pipe).
        self._asking = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, timeout_s: float = MOUNT_TIMEOUT_S) -> None:
        self.backing.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.mountpoint.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = (
            open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 (the child keeps it)
            if self.log_path is not None
            else subprocess.DEVNULL
        )
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "raftwal.chaos.powerfs",
                    "serve",
                    str(self.backing),
                    str(self.mountpoint),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        line = self._read_line(timeout_s)
        if json.loads(line or "{}").get("event") != "mounted":
            self._kill()
            raise RuntimeError(
                f"PowerFS did not mount {self.mountpoint} within {timeout_s:.0f} s "
                f"(said {line!r}; log {self.log_path})"
            )
        deadline = time.monotonic() + timeout_s
        while not is_mounted(self.mountpoint):
            if time.monotonic() > deadline:
                self._kill()
                raise RuntimeError(f"{self.mountpoint} is not a mount point after 'mounted'")
            time.sleep(0.01)

    def _read_line(self, timeout_s: float) -> str:
        assert self.process is not None and self.process.stdout is not None
        box: list[str] = []
        reader = threading.Thread(
            target=lambda: box.append(self.process.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout_s)
        return box[0].strip() if box else ""

    def _command(self, command: str, timeout_s: float) -> dict[str, Any]:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._read_line(timeout_s)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
        self.process = None
        if not line:
            raise RuntimeError(f"PowerFS at {self.mountpoint} did not answer {command!r}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _ask(self, command: str, timeout_s: float) -> dict[str, Any]:
        """One command the daemon answers with one JSON line and keeps serving."""
        with self._asking:
            assert self.process is not None and self.process.stdin is not None
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
            line = self._read_line(timeout_s)
        if not line:
            raise RuntimeError(f"PowerFS at {self.mountpoint} did not answer {command!r}")
        answer: dict[str, Any] = json.loads(line)
        if answer.get("event") == "error":
            raise ValueError(answer.get("error", "refused"))
        return answer

    def set_faults(self, timeout_s: float = MOUNT_TIMEOUT_S, **faults: Any) -> dict[str, Any]:
        """Switch the mount's disk faults (`DiskFaults`: budget_bytes, fsync_delay_ms,
        fsync_errors, match; what is not given is off). Returns the daemon's report: the
        faults now in force, the bytes used, and the ENOSPC, failed and delayed fsync
        counts so far. Raises ValueError for bad faults."""
        DiskFaults.parse(faults)
        return self._ask("faults " + json.dumps(faults), timeout_s)

    def usage(self, timeout_s: float = MOUNT_TIMEOUT_S) -> dict[str, Any]:
        """The daemon's report (as `set_faults` returns it) without changing anything."""
        return self._ask("usage", timeout_s)

    def crash(self, timeout_s: float = UNMOUNT_TIMEOUT_S) -> CrashResult:
        """Power cut: unmount, drop what was not durable, mount again. The processes
        using the mount must be dead already."""
        answer = self._command("crash", timeout_s)
        result = CrashResult(
            bytes_dropped=int(answer.get("bytes_dropped", 0)),
            files_reverted=int(answer.get("files_reverted", 0)),
            entries_reverted=int(answer.get("entries_reverted", 0)),
            undo_conflicts=int(answer.get("undo_conflicts", 0)),
        )
        self.crashes += 1
        self.bytes_dropped += result.bytes_dropped
        self.crashes_dropping += int(result.bytes_dropped > 0)
        self.start()
        return result

    def close(self, timeout_s: float = UNMOUNT_TIMEOUT_S) -> None:
        """Unmount keeping everything (idempotent; never leaves a mount or a daemon)."""
        if self.process is not None:
            try:
                self._command("stop", timeout_s)
            except (RuntimeError, OSError, ValueError) as error:
                logger.warning("PowerFS at %s did not stop cleanly: %s", self.mountpoint, error)
                self._kill()
        self._lazy_unmount()

    def _lazy_unmount(self) -> None:
        """Detach the mount if it is still there (``fusermount -u -z``)."""
        if is_mounted(self.mountpoint):
            with contextlib.suppress(FileNotFoundError):
                subprocess.run(
                    [fusermount(), "-u", "-z", str(self.mountpoint)],
                    capture_output=True,
                    check=False,
                    timeout=30,
                )

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            # SIGTERM: libfuse's handler leaves its loop and unmounts.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self._lazy_unmount()

    def __enter__(self) -> PowerMount:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftwal.chaos.powerfs")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="mount and serve until told on stdin")
    serve_parser.add_argument("backing", type=Path)
    serve_parser.add_argument("mountpoint", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("mfusepy").setLevel(logging.WARNING)
    # Tell the FUSE loop's output apart from the protocol: stdout carries JSON lines only.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(args.backing, args.mountpoint, out)


if __name__ == "__main__":
    sys.exit(main())
