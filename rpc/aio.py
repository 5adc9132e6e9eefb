"""asyncio helpers shared by the SDK, the node and the WAL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class Signal:
    """An ``asyncio.Event`` for hot paths: ``set``, ``clear``, ``is_set`` and ``wait`` as
    there, and a timed wait (``wait_event``) that costs one future and one timer instead
    of a task and ``asyncio.wait``'s bookkeeping. The WAL owner's writers and replica
    senders wait on these once or twice per batch.

    A waiter is a plain future awaited directly, so a cancelled caller always raises
    CancelledError (the reason ``wait_event`` avoids ``wait_for``), and a timed-out or
    cancelled waiter is removed at once: an idle signal waited on with a timeout for
    months holds nothing. Waiters wake in the order they began to wait, as with
    ``asyncio.Event`` (the WAL owner relies on it: writers of one Produce stream that
    wait for room resume, and so write, in their stream's order)."""

    __slots__ = ("_flag", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        self._waiters: dict[asyncio.Future[None], None] = {}

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    async def wait(self) -> bool:
        return await self.wait_within(None)

    async def wait_within(self, timeout_s: float | None) -> bool:
        """Wait until set or `timeout_s` passes (None: no limit); True when it is set."""
        if self._flag:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters[waiter] = None
        timer = None if timeout_s is None else loop.call_later(max(0.0, timeout_s), _expire, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.pop(waiter, None)
        return self._flag


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def wait_event(event: asyncio.Event | Signal, timeout_s: float | None) -> bool:
    """Wait until `event` is set or `timeout_s` passes (None: no limit); True when it is set.

    Use this instead of ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 that can
    swallow a cancellation of the caller arriving just as the event is set (the wait
    returns normally), and a loop waiting on an event set by every append or commit then
    outlives its cancel (the chaos suite caught a WAL replica sender doing so).
    ``asyncio.wait`` neither cancels nor awaits the waiter on the way out, so the caller's
    CancelledError always propagates. A `Signal` waits its own, cheaper way."""
    if isinstance(event, Signal):
        return await event.wait_within(timeout_s)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter,), timeout=None if timeout_s is None else max(0.0, timeout_s))
    finally:
        if not waiter.done():
            waiter.cancel()
    return event.is_set()


async def wait_within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``asyncio.wait_for(awaitable, timeout_s)`` without Python 3.11's lost cancellation
    (see ``wait_event``): the result, or TimeoutError after `timeout_s` (the work is then
    cancelled, as wait_for does). A cancelled caller cancels the work and always raises."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((task,), timeout=max(0.0, timeout_s))
    except BaseException:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise TimeoutError(f"no result within {timeout_s:.3g} s")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    # Work abandoned on a timeout or a cancel may still fail: nobody wants its error, and
    # asyncio would otherwise log it as never retrieved.
    if not task.cancelled():
        task.exception()
