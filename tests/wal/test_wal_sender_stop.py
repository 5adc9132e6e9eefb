"""Regression: an owner's replica sender stops when its append stream ends, even after
Python 3.11's ``asyncio.wait_for`` swallowed the cancellation (the wait it was in ended at
the same moment). The chaos suite found the old single ``cancel()`` leaving the sender
blocked on its full window for good: the owner never heard from that replica again."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from tests.timing import scaled
from wal_segments.owner import _stop_sender


async def test_sender_stops_although_wait_for_swallowed_the_cancel() -> None:
    wake, window = asyncio.Event(), asyncio.Semaphore(0)

    async def sender() -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 1.0)
            await window.acquire()

    task = asyncio.create_task(sender())
    await asyncio.sleep(0)
    wake.set()  # the wake-up and the first cancel land in the same loop iteration
    await asyncio.wait_for(_stop_sender(task), 10)
    assert task.cancelled()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for no longer swallows")
async def test_one_cancel_alone_is_swallowed_on_python_3_11() -> None:
    """The premise of the test above, on the Python that has the flaw."""
    wake, window = asyncio.Event(), asyncio.Semaphore(0)

    async def sender() -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 1.0)
            await window.acquire()

    task = asyncio.create_task(sender())
    await asyncio.sleep(0)
    wake.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.5)
    stuck = not done
    task.cancel()
    await asyncio.wait({task}, timeout=scaled(1.0))
    assert stuck and task.cancelled()
