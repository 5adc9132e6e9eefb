"""A leader whose process was frozen (SIGSTOP, a VM pause, a starved host) judges nobody on
the silence it saw: the heartbeats sent to it meanwhile are still unread when its
coordinator wakes. It takes over afresh, as a new leader does (every node gets a full
timeout from now), instead of marking the nodes DOWN whose heartbeats it missed.

The freeze is real: the test blocks the event loop the coordinator runs on (as SIGSTOP
does) for longer than the node timeout, with heartbeats arriving before and after it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from raftwal.node.coordinator import FROZEN_S, Coordinator
from tests.timing import scaled
from tests.unit.test_handover_coordinator import (  # no_assign_calls: an autouse fixture
    NODES,
    FakeHost,
    _beat,
    _state,
    no_assign_calls,  # noqa: F401
)

NODE_TIMEOUT_MS = 1000
TICK_MS = 50


async def _beating(coordinator: Coordinator) -> None:
    while True:
        for node_id in NODES:
            _beat(coordinator, node_id)
        await asyncio.sleep(0.05)


def _downs(host: FakeHost) -> list[str]:
    return [
        c.mark_node_down.node_id for c in host.proposed if c.WhichOneof("body") == "mark_node_down"
    ]


def _fast_host() -> FakeHost:
    """A leader's host with a short node timeout and a fast coordinator tick."""
    host = FakeHost(_state())
    host.config = dataclasses.replace(
        host.config, node_timeout_ms=NODE_TIMEOUT_MS, coordinator_tick_ms=TICK_MS
    )
    return host


async def _run_through_a_freeze(freeze_s: float) -> FakeHost:
    host = _fast_host()
    coordinator = Coordinator(host)  # type: ignore[arg-type]
    loop = asyncio.create_task(coordinator.run())
    beats = asyncio.create_task(_beating(coordinator))
    try:
        deadline = time.monotonic() + scaled(10)
        while coordinator._leading_since is None:
            assert time.monotonic() < deadline, "the coordinator did not take over"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        # The heartbeats stop reaching the loop, then the whole process stops: nothing
        # runs, neither the coordinator nor the handling of the heartbeats sent meanwhile.
        beats.cancel()
        time.sleep(freeze_s)  # noqa: ASYNC251 - the freeze itself
        # Resumed: the coordinator's overdue tick runs before any heartbeat is read.
        await asyncio.sleep(0.2)
        beats = asyncio.create_task(_beating(coordinator))
        await asyncio.sleep(0.5)
    finally:
        for task in (loop, beats):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return host


async def test_a_frozen_leader_marks_nobody_down_for_its_own_silence() -> None:
    assert NODE_TIMEOUT_MS / 1000 + 0.5 > FROZEN_S
    host = await _run_through_a_freeze(NODE_TIMEOUT_MS / 1000 + 0.5)
    assert _downs(host) == []


async def test_a_node_silent_past_the_timeout_is_still_marked_down() -> None:
    # The guard does not blind the leader: with no freeze, a node that stops beating is
    # marked DOWN after the timeout.
    host = _fast_host()
    coordinator = Coordinator(host)  # type: ignore[arg-type]
    loop = asyncio.create_task(coordinator.run())
    try:
        deadline = time.monotonic() + scaled(10)
        while "n3" not in _downs(host):
            assert time.monotonic() < deadline, f"n3 not marked DOWN: {_downs(host)}"
            _beat(coordinator, "n1")
            _beat(coordinator, "n2")
            await asyncio.sleep(0.05)
        assert _downs(host) == ["n3"]
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
