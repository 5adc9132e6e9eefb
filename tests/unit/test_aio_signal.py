"""rpc.aio.Signal: the asyncio.Event the WAL owner's writers and senders wait on."""

from __future__ import annotations

import asyncio

import pytest

from rpc.aio import Signal, wait_event


async def test_set_wakes_every_waiter_and_stays_set() -> None:
    signal = Signal()
    waiters = [asyncio.create_task(wait_event(signal, None)) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    signal.set()
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert signal.is_set()
    assert await wait_event(signal, 0.0) is True
    signal.clear()
    assert not signal.is_set()


async def test_timeout_returns_false_and_leaves_no_waiter_behind() -> None:
    signal = Signal()
    for _ in range(50):
        assert await wait_event(signal, 0.001) is False
    assert not signal._waiters


async def test_a_cancelled_waiter_raises_even_when_set_at_the_same_moment() -> None:
    # The case asyncio.wait_for gets wrong on 3.11: set and cancel in the same iteration.
    signal = Signal()
    waiter = asyncio.create_task(wait_event(signal, 5.0))
    await asyncio.sleep(0)
    signal.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not signal._waiters


async def test_a_cancelled_waiter_is_removed_at_once() -> None:
    signal = Signal()
    waiter = asyncio.create_task(signal.wait())
    await asyncio.sleep(0)
    assert len(signal._waiters) == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not signal._waiters


async def test_waiters_resume_in_the_order_they_began_to_wait() -> None:
    # As asyncio.Event: the WAL owner's writers waiting for room must resume (and write)
    # in their Produce stream's order.
    signal = Signal()
    order: list[int] = []

    async def waiter(index: int) -> None:
        await wait_event(signal, 5.0)
        order.append(index)

    tasks = [asyncio.create_task(waiter(i)) for i in range(200)]
    await asyncio.sleep(0)
    signal.set()
    await asyncio.gather(*tasks)
    assert order == list(range(200))
