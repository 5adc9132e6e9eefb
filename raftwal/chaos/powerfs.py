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
would usually commit them with any fsync); file modes and times (not reverted); a failing
fsync. An fsync does not reach the host's disk: the host does not crash, only the
simulated machine does.

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
            return self._open_backing(real, flags, 0)

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        with self._lock:
            real = self._real(path)
            existed = os.path.lexists(real)
            if existed and flags & os.O_TRUNC:
                self._truncate_path(real, 0)
            fd = self._open_backing(real, (flags | os.O_CREAT) & ~os.O_TRUNC, mode)
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
            state = self._state(st.st_ino, st.st_size)
            self._save(fh, state, offset, offset + len(data))
            self.writes += 1
            return _pwrite_all(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._lock:
            if fh is not None:
                st = os.fstat(fh)
                state = self._state(st.st_ino, st.st_size)
                if length < st.st_size:
                    self._save(fh, state, length, st.st_size)
                os.ftruncate(fh, length)
            else:
                self._truncate_path(self._real(path), length)
        return 0

    def _truncate_path(self, real: str, length: int) -> None:
        fd = os.open(real, os.O_RDWR)
        try:
            st = os.fstat(fd)
            state = self._state(st.st_ino, st.st_size)
            if length < st.st_size:
                self._save(fd, state, length, st.st_size)
            os.ftruncate(fd, length)
        finally:
            os.close(fd)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._lock:
            st = os.fstat(fh)
            self._files[st.st_ino] = _FileUndo(durable_size=st.st_size)
            self.fsyncs += 1
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
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
            if stat.S_ISDIR(os.lstat(real).st_mode):
                raise OSError(errno.EISDIR, path)
            stash = self._stash_path()
            os.rename(real, stash)
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


def serve(backing: Path, mountpoint: Path, out: IO[str]) -> int:
    """Mount PowerFS at `mountpoint` and serve it until stdin says `crash` or `stop` (or
    closes: then stop). Prints one JSON line when mounted and one when done."""
    import mfusepy

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
        _unmount(mount)

    threading.Thread(target=control, name="powerfs-control", daemon=True).start()
    mfusepy.FUSE(
        operations,
        mount,
        foreground=True,
        nothreads=False,
        use_ino=True,
        hard_remove=True,
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
