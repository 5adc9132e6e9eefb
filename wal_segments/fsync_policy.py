"""When WAL bytes reach the disk: the fsync policy and the group commit.

What lives here:
- `FsyncPolicy` and `parse_fsync_policy("always" | "interval:<ms>" | "never")`.
  * ``always`` (the default): an append is acknowledged only after an fdatasync covering
    it. Concurrent appenders share fdatasyncs (group commit).
  * ``interval:<ms>``: fdatasync at most every `<ms>` milliseconds in the background;
    appends are acknowledged without waiting. A power loss (or kernel crash) of a majority
    within the window loses acknowledged entries. A process crash loses nothing, since the
    bytes are in the page cache.
  * ``never``: **unsafe**. The WAL never calls fdatasync and relies on the OS writeback;
    acknowledged entries can be lost on power loss for as long as the kernel keeps dirty
    pages (tens of seconds by default). For benchmarks and throwaway clusters only; using
    it logs a warning.
- `GroupCommit`: the asyncio helper the owner's write path awaits:
  ``end = writer.append_encoded(...); await group.sync_through(end)``. At most one
  fdatasync is in flight; callers arriving while one runs wait for the next one, which
  covers all of them, so N concurrent appenders cost about two fdatasyncs, not N.

What must never happen here: retrying a failed fdatasync (after one fails, what the page
cache holds is unknown; the group fails every waiter and stays failed until the segment is
reopened and recovered), an unbounded wait, or an import of `raft` or `raftwal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from wal_segments import mutations

logger = logging.getLogger(__name__)

# Deliberate bugs for the simulation's mutation suite (`wal_segments.mutations`).
SHARED_SYNC_ONCE = mutations.declare(
    "shared-sync-once", "an appender returns after an fdatasync that began before its write"
)

DEFAULT_FSYNC_POLICY = "always"
MIN_FSYNC_INTERVAL_MS = 1
MAX_FSYNC_INTERVAL_MS = 60_000
_EXPECTED = "expected always|interval:<ms>|never"
_INTERVAL_RE = re.compile(r"interval:(-?\d+)")

FsyncKind = Literal["always", "interval", "never"]


@dataclass(frozen=True, slots=True)
class FsyncPolicy:
    kind: FsyncKind
    #: only for kind "interval"
    interval_ms: int = 0

    def __str__(self) -> str:
        return f"interval:{self.interval_ms}" if self.kind == "interval" else self.kind

    @property
    def unsafe(self) -> bool:
        return self.kind == "never"


def parse_fsync_policy(text: str) -> FsyncPolicy:
    """Parse ``always``, ``interval:<ms>`` (1..60000) or ``never``; ValueError saying what
    was got and what was expected."""
    value = text.strip() if isinstance(text, str) else text
    if value == "always":
        return FsyncPolicy("always")
    if value == "never":
        return FsyncPolicy("never")
    if isinstance(value, str):
        match = _INTERVAL_RE.fullmatch(value)
        if match:
            interval_ms = int(match.group(1))
            if not MIN_FSYNC_INTERVAL_MS <= interval_ms <= MAX_FSYNC_INTERVAL_MS:
                raise ValueError(
                    f"invalid fsync policy {text!r} (interval {interval_ms} ms; expected "
                    f"{MIN_FSYNC_INTERVAL_MS}..{MAX_FSYNC_INTERVAL_MS})"
                )
            return FsyncPolicy("interval", interval_ms)
    raise ValueError(f"invalid fsync policy {text!r} ({_EXPECTED})")


class SyncTarget(Protocol):
    """What the group commit syncs: a `SegmentWriter` fits.

    `end_offset` is how much has been written; `durable_offset` how much is on disk;
    `sync()` blocks in fdatasync and returns the new durable offset (it raises OSError when
    the fdatasync fails, and keeps failing after that)."""

    @property
    def end_offset(self) -> int: ...

    @property
    def durable_offset(self) -> int: ...

    def sync(self) -> int: ...


RunBlocking = Callable[[Callable[[], int]], Awaitable[int]]


async def _to_thread(function: Callable[[], int]) -> int:
    return await asyncio.to_thread(function)


class GroupCommit:
    """Shares fdatasyncs among concurrent appenders of one segment (see the module doc).

    One instance per open segment; create it on the event loop that appends. `start()`
    launches the background flusher of an interval policy; `close()` stops it and syncs
    what is left (except under ``never``). `run_blocking` runs `target.sync` off the event
    loop (a worker thread by default)."""

    def __init__(
        self,
        target: SyncTarget,
        policy: FsyncPolicy,
        *,
        run_blocking: RunBlocking = _to_thread,
    ) -> None:
        self._target = target
        self._policy = policy
        self._run_blocking = run_blocking
        self._inflight: asyncio.Future[int] | None = None
        self._failure: BaseException | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False
        # Set once close() has synced what it syncs: a waiter that raced the close (a seal
        # closes the group while appenders still wait) waits for it instead of failing.
        self._close_done = asyncio.Event()
        #: fdatasyncs this group asked for (for metrics and tests)
        self.sync_count = 0
        if policy.unsafe:
            logger.warning(
                "fsync policy 'never' is UNSAFE: acknowledged WAL entries can be lost on "
                "power loss; use it for benchmarks and throwaway clusters only"
            )

    @property
    def policy(self) -> FsyncPolicy:
        return self._policy

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _sync_once(self) -> int:
        try:
            self.sync_count += 1
            return await self._run_blocking(self._target.sync)
        except BaseException as error:
            # (The mutation is declared beside SegmentWriter.sync, which it breaks too.)
            if not isinstance(error, asyncio.CancelledError) and not mutations.active(
                "retry-failed-fsync"
            ):
                self._failure = error
                logger.error("fdatasync failed; the segment must be reopened: %r", error)
            raise
        finally:
            self._inflight = None

    async def _sync_shared(self) -> None:
        future = self._inflight
        if future is None:
            future = self._inflight = asyncio.ensure_future(self._sync_once())
        # shield: one waiter being cancelled must not cancel the fsync the others wait on.
        await asyncio.shield(future)

    async def sync_through(self, offset: int) -> None:
        """Return once `offset` is durable (``always``), or at once (``interval``,
        ``never``). Raises the fdatasync error if a sync failed, now or before."""
        self._raise_if_failed()
        if self._closed:
            await self._close_done.wait()
            self._raise_if_failed()
            if self._policy.kind != "always" or self._target.durable_offset >= offset:
                return
            raise RuntimeError(
                f"group commit is closed at durable offset {self._target.durable_offset}, "
                f"before {offset}"
            )
        if self._policy.kind != "always":
            return
        while self._target.durable_offset < offset:
            if offset > self._target.end_offset:
                raise ValueError(
                    f"sync_through({offset}) beyond the written end {self._target.end_offset}"
                )
            await self._sync_shared()
            self._raise_if_failed()
            if mutations.active(SHARED_SYNC_ONCE):
                return

    def start(self) -> None:
        """Start the background flusher of an ``interval`` policy (no-op otherwise)."""
        if self._policy.kind == "interval" and self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        interval_s = self._policy.interval_ms / 1000
        while self._failure is None:
            await asyncio.sleep(interval_s)
            if self._target.durable_offset < self._target.end_offset:
                try:
                    await self._sync_shared()
                except BaseException as error:
                    # A failed sync is recorded in _failure, raised to every later caller
                    # and ends the flusher; anything else (cancellation) propagates.
                    if error is not self._failure:
                        raise

    async def close(self) -> None:
        """Stop the flusher, wait for an in-flight sync, and sync the rest (``always`` and
        ``interval``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._close()
        finally:
            self._close_done.set()

    async def _close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if self._inflight is not None:
            try:
                await asyncio.shield(self._inflight)
            except BaseException as error:
                if error is not self._failure:
                    raise
        self._raise_if_failed()
        if self._policy.kind != "never" and self._target.durable_offset < self._target.end_offset:
            await self._sync_shared()
