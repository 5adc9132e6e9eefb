"""rpc.aio.wait_event: the event wait that never loses its caller's cancellation."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from rpc.aio import wait_event, wait_within
from tests.timing import scaled


async def _cancel_as_the_event_is_set(wait) -> str:
    """A loop waiting on an event that is set just as the loop's task is cancelled (a
    replica sender woken by an append while its stream is torn down)."""
    event = asyncio.Event()

    async def loop() -> str:
        for _ in range(3):
            await wait(event)
            event.clear()
        return "finished"

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    for _ in range(2):
        await asyncio.sleep(0.02)
        event.set()
    try:
        return f"ran on: {await asyncio.wait_for(task, 1.0)}"
    except asyncio.CancelledError:
        return "cancelled"


async def test_cancellation_is_never_lost() -> None:
    assert await _cancel_as_the_event_is_set(lambda e: wait_event(e, 10)) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for was rewritten in 3.12")
async def test_asyncio_wait_for_loses_it_on_python_3_11() -> None:
    # Why wait_event exists (and why the replacement matters on the Python we ship on).
    outcome = await _cancel_as_the_event_is_set(lambda e: asyncio.wait_for(e.wait(), 10))
    assert outcome == "ran on: finished"


async def test_returns_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    started = time.monotonic()
    assert await wait_event(event, 0.05) is False
    assert 0.04 <= time.monotonic() - started < 1.0
    asyncio.get_running_loop().call_later(0.02, event.set)
    assert await wait_event(event, 5) is True
    assert await wait_event(event, 0) is True  # already set
    assert await wait_event(event, -1) is True  # negative timeouts count as zero
    assert len(asyncio.all_tasks()) == 1  # no waiter left behind


async def test_wait_within_returns_times_out_and_never_loses_a_cancel() -> None:
    async def answer(value: int, after_s: float) -> int:
        await asyncio.sleep(after_s)
        return value

    assert await wait_within(answer(7, 0.01), 5) == 7
    slow = asyncio.ensure_future(answer(8, 10))
    with pytest.raises(TimeoutError):
        await wait_within(slow, 0.05)
    await asyncio.sleep(0)
    assert slow.cancelled()  # abandoned work is cancelled, as wait_for does

    def wait_for_set(event: asyncio.Event):
        return wait_within(event.wait(), 10)

    assert await _cancel_as_the_event_is_set(wait_for_set) == "cancelled"


async def test_a_pack_consumer_waiting_for_a_pack_keeps_its_cancellation() -> None:
    """The hang `raftwal consume --packs --timeout-s 3` met in CI: the CLI's wait_for
    cancelled `anext(reader)` just as the consumer's wait for its wake-up event ended, the
    cancellation was swallowed, and the wait_for waited for that task for ever."""
    from rpc.streaming.packs import PackAssembler, PackConsumer

    consumer = PackConsumer(None, "s")  # type: ignore[arg-type] (never reaches the client)
    consumer._assembler = PackAssembler(["v"])  # started, with nothing to cut
    task = asyncio.create_task(anext(consumer))
    await asyncio.sleep(0.01)
    consumer._wake.set()
    task.cancel()
    for _ in range(2):
        await asyncio.sleep(0.02)
        consumer._wake.set()
    done, _ = await asyncio.wait({task}, timeout=scaled(1.0))
    if not done:  # the lost cancellation: stop the loop for good, then fail
        consumer._closed = True
        consumer._wake.set()
        await asyncio.wait({task}, timeout=scaled(2.0))
    assert done and task.cancelled()
