"""The deterministic runtime under ``raftwal simulate``: a virtual clock, an event loop that
never waits for real time, and a disk that loses what was not synced when a node crashes.

What lives here:
- `SimClock` and `SimLoop`: an asyncio event loop whose ``time()`` is the virtual clock.
  When nothing is ready, the clock jumps to the next timer (no real sleeping), so a run of
  many virtual seconds takes what its callbacks cost. ``run_in_executor`` (and so
  ``asyncio.to_thread``) runs the function on the loop, never on a thread (one seed, one
  order of events), somewhere inside a simulated latency drawn from the run's random
  generator, and hands its result back at the latency's end: as a worker thread does
  the work as soon as it picks the job and the caller learns of it later. So an
  fdatasync covers what was written when it began, not what was written while it ran.
- `Incarnation` and `NODE`: the context variable that says which incarnation of which
  node the running code belongs to (every task a node creates inherits it). A crashed
  incarnation's code can no longer touch the disk: every file call it makes fails with
  EIO, so nothing it does after the crash instant becomes durable.
- `SimDisk`: a fault layer under ``os`` for the files under the run's root. Every write,
  truncate, create, link, unlink, rename and mkdir is applied to the real (tmpfs) file
  and recorded in an undo log until what makes it durable: ``fsync``/``fdatasync`` of the
  file for its data, ``fsync`` of the directory for its entries. `crash` reverts a node's
  unrecorded-as-durable changes in reverse order, counts the bytes dropped, and
  `sync_failure_rate` makes an fsync fail now and then (`fail_syncs`: one node's, at its
  own rate for a while, a brown-out). What a power cut keeps of the
  unsynced changes is drawn per crash, as a disk and a journaling file system may leave
  them: for each file independently a prefix of its unsynced writes (pages the kernel
  had written back), the last of them possibly **torn** (only its first bytes reached
  the disk, or the file grew but the new bytes read as zeros), or, for a power cut in
  the middle of a write (`arm_write`), that write's first bytes; and a prefix, in journal
  order, of the unsynced directory changes (creates, renames, unlinks), independently
  of the data. So writes to different files, and a file's data and its directory entry,
  reach the disk in any order before a sync. A **failed fsync** is Linux's: the pages it
  failed to write are marked clean, so a later successful fsync does not make them
  durable, and a power cut loses them (only code that never retries a failed fsync over
  the same pages is safe), unless a later write dirtied the same page again (4 KiB: the
  page is written back whole). A lost page below a size that later syncs made durable
  leaves a hole of what the disk held there, not a shorter file.

What it does not model: SQLite's own files (the simulation keeps each node's catalog in
memory with the durability its ``synchronous`` setting gives: ``raftwal.sim.world``),
and reordering inside one file beyond the prefix rule.

Must never: touch a path outside the run's root, read the real clock inside a run, or
use a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import heapq
import os
import random
import selectors
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# BaseEventLoop's (asyncio/base_events.py) limits, which `SimLoop._run_once` keeps.
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
_MAXIMUM_SELECT_TIMEOUT = 24 * 3600


class SimDeadlock(RuntimeError):
    """Nothing is ready and no timer is due: every task waits for something that never
    comes (a bug in the run's driver)."""


@dataclass(eq=False)
class Incarnation:
    """One run of one node process, from its start to its crash."""

    node_id: str
    number: int
    alive: bool = True
    #: in creation order (a crash cancels them in that order: one seed, one history);
    #: finished ones are dropped now and then (`track`), not one by one
    tasks: dict[asyncio.Task[Any], None] = field(default_factory=dict)
    fds: set[int] = field(default_factory=set)
    _prune_at: int = 64

    def track(self, task: asyncio.Task[Any]) -> None:
        """Remember `task` (a done callback per task would cost a loop turn each)."""
        tasks = self.tasks
        tasks[task] = None
        if len(tasks) >= self._prune_at:
            self.tasks = {t: None for t in tasks if not t.done()}
            self._prune_at = 2 * len(self.tasks) + 64

    def __str__(self) -> str:
        return f"{self.node_id}#{self.number}"


#: The incarnation whose code is running (None: the simulation's own driver).
NODE: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar(
    "raftwal_sim_node", default=None
)


class SimClock:
    def __init__(self, start_s: float = 1_000_000.0) -> None:
        self.now = start_s

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        # A fixed epoch, so that hybrid time ticks are the same in every run of a seed.
        return 1_800_000_000.0 + self.now


class _Selector(selectors.BaseSelector):
    """Holds registrations (the loop's self-pipe) and never reports one ready: a select
    with a timeout moves the virtual clock by it."""

    def __init__(self, clock: SimClock) -> None:
        self._clock = clock
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd_of(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self._keys.pop(fileobj, None)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise SimDeadlock("no task is ready and no timer is due")
        if timeout > 0:
            self._clock.now += timeout
        return []

    def get_map(self) -> Any:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


def _fd_of(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on `clock` whose executor is the loop itself: a function handed to it
    runs after `start_fraction()` of `latency_s()` and its result is handed back at the
    end of that latency."""

    def __init__(
        self,
        clock: SimClock,
        latency_s: Callable[[], float],
        start_fraction: Callable[[], float] = lambda: 1.0,
    ) -> None:
        super().__init__(_Selector(clock))
        #: paused incarnations (`pause`) -> their callbacks that became ready meanwhile
        self._held: dict[Incarnation, list[asyncio.Handle]] = {}
        self._sim_clock = clock
        self._latency_s = latency_s
        self._start_fraction = start_fraction
        self.set_task_factory(_task_factory)

    def time(self) -> float:
        return self._sim_clock.now

    # The scheduling below is BaseEventLoop's (Python 3.11), with what a virtual clock
    # makes dead cut out: no selector poll, no debug checks. Timers are kept in the heap
    # as (when, handle) pairs, so that heap comparisons are float ones in C instead of
    # `TimerHandle.__lt__` calls; a tie falls back to that method, which says "not less"
    # as before, so the heap holds the same order as BaseEventLoop's: the same seed runs
    # the same callbacks in the same order.

    def call_at(
        self,
        when: float,
        callback: Callable[..., Any],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, timer))  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def _run_once(self) -> None:
        scheduled: list[tuple[float, asyncio.TimerHandle]] = self._scheduled  # type: ignore[has-type]
        count = len(scheduled)
        if (
            count > _MIN_SCHEDULED_TIMER_HANDLES
            and self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION  # type: ignore[attr-defined]
        ):
            kept = []
            for entry in scheduled:
                if entry[1]._cancelled:  # type: ignore[attr-defined]
                    entry[1]._scheduled = False  # type: ignore[attr-defined]
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][1]._cancelled:  # type: ignore[attr-defined]
                self._timer_cancelled_count -= 1
                handle = heapq.heappop(scheduled)[1]
                handle._scheduled = False  # type: ignore[attr-defined]
        ready = self._ready  # type: ignore[attr-defined]
        clock = self._sim_clock
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            if not scheduled:
                raise SimDeadlock("no task is ready and no timer is due")
            timeout = min(scheduled[0][0] - clock.now, _MAXIMUM_SELECT_TIMEOUT)
            if timeout > 0:
                clock.now += timeout
        end_time = clock.now + self._clock_resolution  # type: ignore[attr-defined]
        while scheduled and scheduled[0][0] < end_time:
            handle = heapq.heappop(scheduled)[1]
            handle._scheduled = False  # type: ignore[attr-defined]
            ready.append(handle)
        held = self._held
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                if held:
                    incarnation = handle._context.get(NODE)  # type: ignore[attr-defined]
                    if incarnation is not None and incarnation in held:
                        held[incarnation].append(handle)
                        continue
                handle._run()
        handle = None  # breaks a reference cycle when a callback raised

    def pause(self, incarnation: Incarnation) -> None:
        """Stop running `incarnation`'s code (SIGSTOP, a VM frozen, a long garbage
        collection): its callbacks wait, in the order they became ready, until `resume`.
        The clock goes on; what others send it waits in its socket buffers."""
        self._held.setdefault(incarnation, [])

    def resume(self, incarnation: Incarnation) -> None:
        """Run `incarnation`'s code again, from what became ready first."""
        handles = self._held.pop(incarnation, None)
        if handles:
            self._ready.extend(handles)  # type: ignore[attr-defined]

    def paused(self, incarnation: Incarnation | None) -> bool:
        return incarnation is not None and incarnation in self._held

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> Any:
        future = self.create_future()
        latency = self._latency_s()
        start = latency * self._start_fraction()

        def run() -> None:
            # A job not yet picked up is dropped when its caller gives up on it; once it
            # runs, it runs to its end whatever the caller does (a thread cannot be
            # stopped), and the caller learns its outcome only at the latency's end.
            if future.cancelled():
                return
            try:
                outcome: tuple[bool, Any] = (True, func(*args))
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting task
                outcome = (False, error)
            if latency > start:
                self.call_later(latency - start, settle, outcome)
            else:
                settle(outcome)

        def settle(outcome: tuple[bool, Any]) -> None:
            if future.cancelled():
                return
            ok, value = outcome
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        self.call_later(start, run)
        return future


def _task_factory(
    loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context | None = None
) -> asyncio.Task[Any]:
    task = asyncio.Task(coro, loop=loop, context=context)
    incarnation = context.get(NODE) if context is not None else NODE.get()
    if incarnation is not None:
        incarnation.track(task)
    return task


# -- the disk ---------------------------------------------------------------------------------

_REAL = {
    name: getattr(os, name)
    for name in (
        "open",
        "close",
        "write",
        "pwrite",
        "pwritev",
        "ftruncate",
        "truncate",
        "fsync",
        "fdatasync",
        "link",
        "unlink",
        "rename",
        "replace",
        "mkdir",
    )
}


@dataclass
class _Open:
    path: str
    node: str
    inode: int
    is_dir: bool


@dataclass
class _Undo:
    """One change not yet durable. kind: data (bytes of a file), create, unlink, rename,
    mkdir (entries of `directory`)."""

    kind: str
    node: str
    path: str
    inode: int = 0
    directory: str = ""
    offset: int = 0
    old: bytes = b""
    old_size: int = 0
    written: int = 0
    source: str = ""
    stash: str = ""
    replaced_stash: str = ""
    #: a failed fsync of its file marked its pages clean: no later sync makes it durable
    doomed: bool = False
    #: the write a power cut interrupted (`SimDisk.arm_write`): its first bytes reached the
    #: disk, and so did every unsynced write of its file before it
    forced: bool = False


#: The page cache's unit: a failed sync's pages are lost unless a later write dirties them
#: again (and a later sync writes them back whole).
_PAGE = 4096


def _durable_view(data: bytes, base: int, size: int, doomed: list[_Undo]) -> tuple[bytes, int]:
    """The bytes from `base` of a file of `size` whose page cache holds `data` there, as
    the disk holds them once the `doomed` writes (a failed sync's, all at or above `base`,
    oldest first) are lost: `SimDisk._undo_data` applied to them, newest first."""
    buf = bytearray(data)
    for undo in reversed(doomed):
        start = undo.offset - base
        if undo.old:
            if start + len(undo.old) > len(buf):
                buf.extend(bytes(start + len(undo.old) - len(buf)))
            buf[start : start + len(undo.old)] = undo.old
            size = max(size, undo.offset + len(undo.old))
        end = undo.offset + undo.written
        if size > end:
            grown_from = max(undo.offset, undo.old_size)
            if end > grown_from:
                buf[grown_from - base : end - base] = bytes(end - grown_from)
        else:
            size = undo.old_size
            del buf[max(0, size - base) :]
    return bytes(buf[: max(0, size - base)]), size


def _eio(what: str) -> OSError:
    return OSError(errno.EIO, f"simulated: {what} after the node crashed")


class SimDisk:
    """See the module doc. `install()` patches ``os`` for the run; `uninstall()` undoes it."""

    def __init__(self, root: Path, rng: random.Random, sync_failure_rate: float = 0.0) -> None:
        self.root = str(root.resolve())
        self._stash_dir = os.path.join(self.root, ".stash")
        self._rng = rng
        self.sync_failure_rate = sync_failure_rate
        self._fds: dict[int, _Open] = {}
        self._undo: list[_Undo] = []
        self._paths: dict[int, str] = {}
        self._stash_count = 0
        self.sync_failures = 0
        self._installed = False
        #: node -> (syncs to let pass, what to call at the next one, whether that sync
        #: still happens: False for a crash, True for a fault that leaves the node up,
        #: and what the path of a file whose syncs count holds: `arm`)
        self._armed: dict[str, tuple[int, Callable[[], None], bool, str]] = {}
        #: node -> what to call in the middle of its next write to a file (a power cut),
        #: and what the file's path must hold for its writes to count (`arm_write`)
        self._armed_writes: dict[str, tuple[Callable[[], None], str]] = {}
        #: node -> the rate its file syncs fail at for now (a brown-out), instead of
        #: `sync_failure_rate`
        self._failing: dict[str, float] = {}

    def fail_syncs(self, node: str, rate: float) -> None:
        """Make `node`'s file syncs fail (EIO) at `rate` until `heal_syncs(node)`: a disk
        whose power sags, or that is failing."""
        self._failing[node] = rate

    def heal_syncs(self, node: str) -> None:
        self._failing.pop(node, None)

    def arm(
        self,
        node: str,
        crash: Callable[[], None],
        skip: int = 0,
        *,
        sync: bool = False,
        under: str = "",
    ) -> None:
        """Call `crash` at `node`'s file sync after the next `skip` ones, before it takes
        effect (a crash in the window between a write and its fsync). With `sync`, the
        call is a fault that leaves the node running (a partition, say) and the sync then
        happens as usual; with `under`, only the syncs of files whose path holds it count
        (one pchannel's log)."""
        self._armed[node] = (skip, crash, sync, under)

    def arm_write(self, node: str, crash: Callable[[], None], *, under: str = "") -> None:
        """Cut `node`'s power in the middle of its next write to a file: only the write's
        first bytes (at least one, never all) reach the disk, with every unsynced write of
        that file before it; `crash` (which must cut the power) runs then, and the write
        fails (the process is gone). With `under`, only writes to files whose path holds
        it count (one pchannel's log)."""
        self._armed_writes[node] = (crash, under)

    def disarm(self) -> None:
        """The faults stop: nothing armed, and no sync fails any more."""
        self._armed.clear()
        self._armed_writes.clear()
        self._failing.clear()
        self.sync_failure_rate = 0.0

    # -- plumbing -------------------------------------------------------------------------

    def install(self) -> None:
        _REAL["mkdir"](self._stash_dir, 0o700)
        for name in _REAL:
            setattr(os, name, getattr(self, f"_{name}"))
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            for name, function in _REAL.items():
                setattr(os, name, function)
            self._installed = False

    def _node_of(self, path: str) -> str | None:
        if not path.startswith(self.root + os.sep):
            return None
        rest = path[len(self.root) + 1 :]
        node = rest.split(os.sep, 1)[0]
        return None if node == ".stash" else node

    @staticmethod
    def _abs(path: Any) -> str:
        return os.path.abspath(os.fsdecode(path))

    @staticmethod
    def _check_alive(what: str) -> None:
        incarnation = NODE.get()
        if incarnation is not None and not incarnation.alive:
            raise _eio(what)

    def _stash(self, path: str) -> str:
        self._stash_count += 1
        stash = os.path.join(self._stash_dir, str(self._stash_count))
        _REAL["rename"](path, stash)
        return stash

    # -- patched calls ------------------------------------------------------------------------

    def _open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        self._check_alive("open")
        if dir_fd is not None:  # fd-relative calls (shutil.rmtree): not tracked
            return _REAL["open"](path, flags, mode, dir_fd=dir_fd)
        full = self._abs(path)
        node = self._node_of(full)
        if node is None:
            return _REAL["open"](path, flags, mode)
        existed = os.path.lexists(full)
        old_size = os.stat(full).st_size if existed and flags & os.O_TRUNC else 0
        old = b""
        if old_size:
            with open(full, "rb") as file:
                old = file.read()
        fd = _REAL["open"](full, flags, mode)
        info = os.fstat(fd)
        is_dir = stat.S_ISDIR(info.st_mode)
        self._fds[fd] = _Open(full, node, info.st_ino, is_dir)
        self._paths[info.st_ino] = full
        incarnation = NODE.get()
        if incarnation is not None:
            incarnation.fds.add(fd)
        if not existed:
            self._undo.append(
                _Undo("create", node, full, info.st_ino, directory=os.path.dirname(full))
            )
        elif old_size:
            self._undo.append(
                _Undo("data", node, full, info.st_ino, offset=0, old=old, old_size=old_size)
            )
        return fd

    def _close(self, fd: int) -> None:
        self._check_alive("close")
        self._fds.pop(fd, None)
        incarnation = NODE.get()
        if incarnation is not None:
            incarnation.fds.discard(fd)
        _REAL["close"](fd)

    def _record_write(self, fd: int, offset: int, length: int) -> None:
        opened = self._fds.get(fd)
        if opened is None:
            return
        size = os.fstat(fd).st_size
        old = os.pread(fd, min(length, size - offset), offset) if offset < size else b""
        self._undo.append(
            _Undo(
                "data",
                opened.node,
                opened.path,
                opened.inode,
                offset=offset,
                old=old,
                old_size=size,
                written=length,
            )
        )

    def _write(self, fd: int, data: Any) -> int:
        self._check_alive("write")
        if fd in self._fds:
            self._record_write(fd, os.lseek(fd, 0, os.SEEK_CUR), len(data))
        return _REAL["write"](fd, data)

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._check_alive("pwrite")
        if self._armed_writes and len(data) > 1:
            self._interrupt_write(fd, bytes(data), offset)
        self._record_write(fd, offset, len(data))
        return _REAL["pwrite"](fd, data, offset)

    def _pwritev(self, fd: int, buffers: Any, offset: int, *flags: int) -> int:
        self._check_alive("pwritev")
        buffers = list(buffers)
        size = sum(len(memoryview(b)) for b in buffers)
        if self._armed_writes and size > 1:
            self._interrupt_write(fd, b"".join(bytes(b) for b in buffers), offset)
        self._record_write(fd, offset, size)
        return _REAL["pwritev"](fd, buffers, offset, *flags)

    def _interrupt_write(self, fd: int, data: bytes, offset: int) -> None:
        """The power cut `arm_write` asked for, if this write is the one: write a prefix of
        `data`, keep it through the crash, cut the power, and fail the write."""
        opened = self._fds.get(fd)
        if opened is None or opened.is_dir:
            return
        armed = self._armed_writes.get(opened.node)
        if armed is None or armed[1] not in opened.path:
            return
        crash = armed[0]
        del self._armed_writes[opened.node]
        cut = self._rng.randint(1, len(data) - 1)
        self._record_write(fd, offset, cut)
        self._undo[-1].forced = True
        _REAL["pwrite"](fd, data[:cut], offset)
        crash()
        raise _eio("write")

    def _ftruncate(self, fd: int, length: int) -> None:
        self._check_alive("ftruncate")
        opened = self._fds.get(fd)
        if opened is not None:
            size = os.fstat(fd).st_size
            old = os.pread(fd, size - length, length) if length < size else b""
            # Pages a failed fsync doomed are gone once the file is cut below them: what
            # is written there later is new data, made durable by the next sync. So their
            # undos go; but a power cut that undoes this cut must not bring their bytes
            # back (the page cache's, in `old`): it restores what the disk holds there.
            cut = [
                u
                for u in self._undo
                if u.doomed and u.kind == "data" and u.inode == opened.inode and u.offset >= length
            ]
            if cut:
                old, size = _durable_view(old, length, size, cut)
            self._undo = [u for u in self._undo if not any(u is c for c in cut)]
            self._undo.append(
                _Undo(
                    "data",
                    opened.node,
                    opened.path,
                    opened.inode,
                    offset=min(length, size),
                    old=old,
                    old_size=size,
                )
            )
        _REAL["ftruncate"](fd, length)

    def _truncate(self, path: Any, length: int) -> None:
        self._check_alive("truncate")
        full = self._abs(path)
        if self._node_of(full) is None:
            _REAL["truncate"](path, length)
            return
        fd = self._open(full, os.O_RDWR)
        try:
            self._ftruncate(fd, length)
        finally:
            self._close(fd)

    def _sync(self, fd: int, what: str) -> None:
        self._check_alive(what)
        opened = self._fds.get(fd)
        if opened is None:
            _REAL[what](fd)
            return
        armed = None if opened.is_dir else self._armed.get(opened.node)
        if armed is not None and armed[3] in opened.path:
            skip, crash, goes_on, under = armed
            if skip > 0:
                self._armed[opened.node] = (skip - 1, crash, goes_on, under)
            else:
                del self._armed[opened.node]
                crash()
                if not goes_on:
                    raise _eio(what)  # the node crashed: this sync never happens
        failure_rate = self._failing.get(opened.node, self.sync_failure_rate)
        if not opened.is_dir and failure_rate and (self._rng.random() < failure_rate):
            # Linux marks the pages it failed to write clean: what they held is lost at
            # the next power cut, whatever later fsyncs say.
            self.sync_failures += 1
            for undo in self._undo:
                if undo.kind == "data" and undo.inode == opened.inode:
                    undo.doomed = True
            raise OSError(errno.EIO, f"simulated: {what} failed")
        if opened.is_dir:
            directory = opened.path
            kept = []
            for undo in self._undo:
                if undo.kind != "data" and undo.directory == directory:
                    for stash in (undo.stash, undo.replaced_stash):
                        if stash and os.path.lexists(stash):
                            _REAL["unlink"](stash)
                else:
                    kept.append(undo)
            self._undo = kept
        else:
            inode = opened.inode
            # Pages a later write dirtied again are written back whole, the bytes of a
            # failed sync's write on them included: that write is durable now as well.
            pages: set[int] = set()
            for u in self._undo:
                if u.kind == "data" and u.inode == inode and not u.doomed and u.written:
                    pages.update(range(u.offset // _PAGE, (u.offset + u.written - 1) // _PAGE + 1))
            self._undo = [
                u
                for u in self._undo
                if not (
                    u.kind == "data"
                    and u.inode == inode
                    and (
                        not u.doomed
                        or not u.written
                        or all(
                            page in pages
                            for page in range(
                                u.offset // _PAGE, (u.offset + u.written - 1) // _PAGE + 1
                            )
                        )
                    )
                )
            ]

    def _fsync(self, fd: int) -> None:
        self._sync(fd, "fsync")

    def _fdatasync(self, fd: int) -> None:
        self._sync(fd, "fdatasync")

    def _link(self, source: Any, target: Any, **kwargs: Any) -> None:
        self._check_alive("link")
        full = self._abs(target)
        node = self._node_of(full)
        _REAL["link"](source, target, **kwargs)
        if node is not None:
            inode = os.stat(full).st_ino
            self._paths[inode] = full
            self._undo.append(_Undo("create", node, full, inode, directory=os.path.dirname(full)))

    def _unlink(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._check_alive("unlink")
        if dir_fd is not None:
            _REAL["unlink"](path, dir_fd=dir_fd)
            return
        full = self._abs(path)
        node = self._node_of(full)
        if node is None:
            _REAL["unlink"](path)
            return
        inode = os.lstat(full).st_ino
        stash = self._stash(full)
        if self._paths.get(inode, full) == full:
            # The data is found through the stash now; a file that keeps another name
            # (a hard link: a sealed segment's final name) is still found through that.
            self._paths[inode] = stash
        self._undo.append(
            _Undo("unlink", node, full, inode, directory=os.path.dirname(full), stash=stash)
        )

    def _rename(self, source: Any, target: Any, **kwargs: Any) -> None:
        self._move(source, target, "rename", **kwargs)

    def _replace(self, source: Any, target: Any, **kwargs: Any) -> None:
        self._move(source, target, "replace", **kwargs)

    def _move(self, source: Any, target: Any, how: str, **kwargs: Any) -> None:
        self._check_alive(how)
        full_source, full_target = self._abs(source), self._abs(target)
        node = self._node_of(full_target)
        if node is None or self._node_of(full_source) is None:
            _REAL[how](source, target, **kwargs)
            return
        inode = os.lstat(full_source).st_ino
        replaced = self._stash(full_target) if os.path.lexists(full_target) else ""
        _REAL["rename"](full_source, full_target)
        self._paths[inode] = full_target
        self._undo.append(
            _Undo(
                "rename",
                node,
                full_target,
                inode,
                directory=os.path.dirname(full_target),
                source=full_source,
                replaced_stash=replaced,
            )
        )

    def _mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        self._check_alive("mkdir")
        if dir_fd is not None:
            _REAL["mkdir"](path, mode, dir_fd=dir_fd)
            return
        full = self._abs(path)
        _REAL["mkdir"](path, mode)
        node = self._node_of(full)
        if node is not None and os.path.dirname(full) != self.root:
            # A node's own root stands for its disk: it is there before the node starts.
            self._undo.append(_Undo("mkdir", node, full, directory=os.path.dirname(full)))

    # -- crash --------------------------------------------------------------------------------

    def unsynced_bytes(self, node: str) -> int:
        return sum(u.written for u in self._undo if u.node == node and u.kind == "data")

    def crash(
        self,
        node: str,
        keep_prefix_rate: float = 0.0,
        torn_rate: float = 0.0,
        keep_entries_rate: float = 0.0,
    ) -> int:
        """Revert what `node` had not made durable; returns the bytes of file data dropped.
        With probability `keep_prefix_rate` per file, a random prefix of its unsynced
        writes survives (the kernel had written those pages back), and with `torn_rate`
        the last write of that prefix is torn; with `keep_entries_rate`, a prefix of the
        node's unsynced directory changes survives (in the order they were made). The
        node's incarnation must be dead already (its fds are closed by the caller)."""
        rng = self._rng
        mine = [u for u in self._undo if u.node == node]
        self._undo = [u for u in self._undo if u.node != node]
        kept: set[int] = set()
        torn: dict[int, int] = {}
        by_inode: dict[int, list[int]] = {}
        entries: list[int] = []
        for index, undo in enumerate(mine):
            if undo.kind == "data":
                if not undo.doomed:
                    by_inode.setdefault(undo.inode, []).append(index)
            else:
                entries.append(index)
        for inode in sorted(by_inode):
            indexes = by_inode[inode]
            # An interrupted write reached the disk, and so did its file's writes before it.
            forced = max((n + 1 for n, i in enumerate(indexes) if mine[i].forced), default=0)
            if keep_prefix_rate and rng.random() < keep_prefix_rate:
                count = max(forced, rng.randint(0, len(indexes)))
                kept.update(indexes[:count])
                last = mine[indexes[count - 1]] if count else None
                if (
                    last is not None
                    and not last.forced
                    and torn_rate
                    and rng.random() < torn_rate
                    and last.written > 1
                ):
                    torn[indexes[count - 1]] = rng.randint(1, last.written - 1)
            elif forced:
                kept.update(indexes[:forced])
        if entries and keep_entries_rate and rng.random() < keep_entries_rate:
            kept.update(entries[: rng.randint(0, len(entries))])
        dropped = 0
        for index in range(len(mine) - 1, -1, -1):
            undo = mine[index]
            if index in torn:
                dropped += undo.written - torn[index]
                self._tear(undo, torn[index], zeros=rng.random() < 0.5)
                continue
            if index in kept:
                continue
            if undo.kind == "data":
                dropped += undo.written
                self._undo_data(undo)
            elif undo.kind == "create":
                if os.path.lexists(undo.path) and os.lstat(undo.path).st_ino == undo.inode:
                    _REAL["unlink"](undo.path)
            elif undo.kind == "unlink":
                if os.path.lexists(undo.stash):
                    _REAL["rename"](undo.stash, undo.path)
                    self._paths[undo.inode] = undo.path
            elif undo.kind == "rename":
                if os.path.lexists(undo.path):
                    _REAL["rename"](undo.path, undo.source)
                    self._paths[undo.inode] = undo.source
                if undo.replaced_stash and os.path.lexists(undo.replaced_stash):
                    _REAL["rename"](undo.replaced_stash, undo.path)
            elif undo.kind == "mkdir":
                shutil.rmtree(undo.path, ignore_errors=True)
        return dropped

    def _tear(self, undo: _Undo, keep: int, zeros: bool) -> None:
        """Keep only the first `keep` bytes of a write: the rest reads as before it, or
        (`zeros`, a file that grew) as zeros."""
        path = self._paths.get(undo.inode)
        if path is None or not os.path.lexists(path) or os.lstat(path).st_ino != undo.inode:
            return
        fd = _REAL["open"](path, os.O_RDWR)
        try:
            start = undo.offset + keep
            end = undo.offset + undo.written
            old_tail = undo.old[keep:]
            if old_tail:
                _REAL["pwrite"](fd, old_tail, start)
            grown_from = undo.offset + len(undo.old)
            if end > grown_from:
                if zeros:
                    _REAL["pwrite"](fd, bytes(end - max(start, grown_from)), max(start, grown_from))
                elif os.fstat(fd).st_size <= end:
                    _REAL["ftruncate"](fd, max(undo.old_size, start))
        finally:
            _REAL["close"](fd)

    def _undo_data(self, undo: _Undo) -> None:
        path = self._paths.get(undo.inode)
        if path is None or not os.path.lexists(path) or os.lstat(path).st_ino != undo.inode:
            return
        fd = _REAL["open"](path, os.O_RDWR)
        try:
            if undo.old:
                _REAL["pwrite"](fd, undo.old, undo.offset)
            end = undo.offset + undo.written
            if undo.doomed and os.fstat(fd).st_size > end:
                # Pages a failed sync marked clean, below a size later syncs made
                # durable: the file keeps that size, with what the disk held there (a
                # hole of zeros where the file had grown).
                grown_from = max(undo.offset, undo.old_size)
                if end > grown_from:
                    _REAL["pwrite"](fd, bytes(end - grown_from), grown_from)
            else:
                _REAL["ftruncate"](fd, undo.old_size)
        finally:
            _REAL["close"](fd)

    def close_all(self) -> None:
        """Close every file the run left open (at its end)."""
        for fd in sorted(self._fds):
            with contextlib.suppress(OSError):
                _REAL["close"](fd)
        self._fds.clear()

    def close_fds(self, incarnation: Incarnation) -> None:
        """Close what a crashed incarnation left open (the process is gone)."""
        for fd in sorted(incarnation.fds):
            self._fds.pop(fd, None)
            with contextlib.suppress(OSError):
                _REAL["close"](fd)
        incarnation.fds.clear()
