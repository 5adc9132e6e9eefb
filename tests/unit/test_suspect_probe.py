"""The coordinator's early DOWN verdict on a suspected node (its peers' streams from it
broke) needs evidence that the process is gone: its gRPC port must refuse the leader's
own connection. Late heartbeats and broken streams alone are what a starved host shows
too (on a loaded 2-core machine they moved pchannels to new terms a dozen times a
minute); such a node goes DOWN only after the full node timeout.

Real sockets on 127.0.0.1 stand in for the suspected node's gRPC port: one listening
(alive, however slow: the kernel accepts for it), one closed (the process is gone)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from raftwal.node.coordinator import Coordinator, refuses_connections
from rpc.protos import coordinator_pb2 as api
from tests.unit.test_handover_coordinator import (  # no_assign_calls: an autouse fixture
    NODES,
    FakeHost,
    _state,
    no_assign_calls,  # noqa: F401
)


@pytest.fixture
def listening() -> Iterator[str]:
    """The address of a socket that listens and never answers (a stopped process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def closed() -> str:
    """The address of a port nothing listens on (a process that is gone)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


async def test_a_listening_port_is_not_a_refusal(listening: str, closed: str) -> None:
    assert await refuses_connections(listening) is False
    assert await refuses_connections(closed) is True
    assert await refuses_connections("no port here") is False


async def _suspected_late(address: str) -> tuple[FakeHost, Coordinator]:
    """A leader of 10 s that heard n2 1.5 s ago (late by more than the grace, within the
    3 s node timeout), after n1 reported n2's streams broken."""
    state = _state()
    state.nodes["n2"].address = address
    host = FakeHost(state)
    coordinator = Coordinator(host)  # type: ignore[arg-type]
    await coordinator._take_over()
    host.proposed.clear()
    for node_id in NODES:
        coordinator.record_heartbeat(
            api.HeartbeatRequest(
                node_id=node_id,
                address=address if node_id == "n2" else f"{node_id}:1",
                incarnation=1,
            )
        )
    now = time.monotonic()
    coordinator._leading_since = now - 10
    coordinator._heartbeats["n2"].seen_at = now - 1.5
    coordinator.record_heartbeat(
        api.HeartbeatRequest(node_id="n1", address="n1:1", incarnation=1, suspect_node_ids=["n2"])
    )
    return host, coordinator


def _downs(host: FakeHost) -> list[str]:
    return [
        c.mark_node_down.node_id for c in host.proposed if c.WhichOneof("body") == "mark_node_down"
    ]


async def _tick_and_probe(coordinator: Coordinator) -> None:
    await coordinator.tick()
    await asyncio.gather(*coordinator._background)
    await coordinator.tick()


async def test_a_suspected_node_that_accepts_connections_stays_up(listening: str) -> None:
    host, coordinator = await _suspected_late(listening)
    await _tick_and_probe(coordinator)
    assert _downs(host) == []


async def test_a_suspected_node_whose_port_refuses_goes_down_before_the_timeout(
    closed: str,
) -> None:
    host, coordinator = await _suspected_late(closed)
    await _tick_and_probe(coordinator)
    assert _downs(host) == ["n2"]


async def test_an_unsuspected_late_node_waits_for_the_timeout(closed: str) -> None:
    host, coordinator = await _suspected_late(closed)
    coordinator._suspected.clear()
    await _tick_and_probe(coordinator)
    assert _downs(host) == []
