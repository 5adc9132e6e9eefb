"""asyncio helpers shared by the SDK, the node and the WAL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until `event` is set or `timeout_s` passes (None: no limit); True when it is set.

    Use this instead of ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 that can
    swallow a cancellation of the caller arriving just as the event is set (the wait
    returns normally), and a loop waiting on an event set by every append or commit then
    outlives its cancel (the chaos suite caught a WAL replica sender doing so).
    ``asyncio.wait`` neither cancels nor awaits the waiter on the way out, so the caller's
    CancelledError always propagates."""
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
