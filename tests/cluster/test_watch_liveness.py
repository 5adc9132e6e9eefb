"""Watch streams on a real three-node cluster stay live across a stopped or cut-off node.

A node stopped with SIGSTOP keeps its TCP connections open and never ends a stream, and a
node cut off from the majority keeps serving a view that no longer moves. Nodes send
progress notifications on quiet watch streams and end them when they have known no Raft
leader for a few seconds (``WATCH_LEADERLESS_S``); the SDK moves a watch that hears nothing
for ``watch_idle_timeout_s`` to another node. Every signal sent here goes to a node this
module started, by pid, and is undone before the test ends.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from raftwal.services.coordinator import WATCH_LEADERLESS_S
from rpc.client import CoordinatorClient
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from tests.cluster.conftest import Api, converged, leader_id, running_cluster
from tests.timing import scaled

pytestmark = pytest.mark.cluster
E = errors_pb2
IDLE_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    directory: Path = tmp_path_factory.mktemp("watch-liveness")
    with running_cluster(directory) as running:
        yield running


def grant_lease(client: Api, endpoint: str) -> int:
    """A write whose event every watch sees; returns its revision."""
    response = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=60_000), endpoint=endpoint)
    return int(response.revision)


async def test_watch_moves_off_a_stopped_node(watched: tuple[dev.LocalCluster, Api]) -> None:
    cluster, client = watched
    leader = leader_id(client)
    # Watch a follower, so the writes below need no election.
    victim = next(n for n in cluster.config.nodes if n.id != leader)
    others = [n.grpc_address for n in cluster.config.nodes if n.id != victim.id]
    endpoints = [victim.grpc_address, *others]
    async with CoordinatorClient(
        endpoints, watch_idle_timeout_s=IDLE_TIMEOUT_S, timeout_s=30
    ) as sdk:
        first = await asyncio.to_thread(grant_lease, client, others[0])
        stream = sdk.watch_events(from_revision=first)
        assert (await asyncio.wait_for(anext(stream), 15)).revision == first
        # Quiet for longer than the idle timeout: progress notifications keep it in place.
        await asyncio.sleep(IDLE_TIMEOUT_S * 2)
        cluster.kill(victim.id, signal.SIGSTOP)
        try:
            second = await asyncio.to_thread(grant_lease, client, others[0])
            # Other events may come first (the coordinator marking the stopped node DOWN).
            revisions = [(await asyncio.wait_for(anext(stream), IDLE_TIMEOUT_S + 15)).revision]
            for _ in range(100):
                if revisions[-1] >= second:
                    break
                revisions.append((await asyncio.wait_for(anext(stream), 15)).revision)
        finally:
            cluster.kill(victim.id, signal.SIGCONT)
            await stream.aclose()  # type: ignore[attr-defined]
    # Nothing skipped or repeated across the move.
    assert revisions == list(range(first + 1, second + 1)), (first, second, revisions)
    converged(client)


def test_cut_off_node_ends_its_watches(watched: tuple[dev.LocalCluster, Api]) -> None:
    cluster, client = watched
    converged(client)
    lonely, *stopped = cluster.config.nodes
    stream = client.stub(lonely.grpc_address).WatchEvents(
        api.WatchEventsRequest(from_revision=0), timeout=scaled(60)
    )
    started = time.monotonic()
    seen: list[api.WatchEventsResponse] = []
    progress = 0
    for response in stream:
        seen.append(response)
        if len(seen) > 1 and not response.events:
            progress += 1
        if progress == 2 or len(seen) >= 50:
            break
    # The first response says where the watch starts; then progress notifications about a
    # second apart. An event may come between them (the cluster is not frozen: a node the
    # previous test stopped can still be changing state), but notifications must come.
    assert len(seen[0].events) == 0
    assert progress == 2, [len(r.events) for r in seen]
    assert 1.0 <= time.monotonic() - started < 10, time.monotonic() - started
    for node in stopped:
        cluster.kill(node.id, signal.SIGSTOP)
    try:
        cut_at = time.monotonic()
        with pytest.raises(grpc.RpcError) as ended:
            for _ in range(100):
                next(stream)
        ended_after_s = time.monotonic() - cut_at
    finally:
        for node in stopped:
            cluster.kill(node.id, signal.SIGCONT)
    info = from_rpc_error(ended.value)
    assert info.code == E.NOT_LEADER and "no Raft leader" in info.message, info
    assert info.leader_hint == ""
    # An election timeout to notice, WATCH_LEADERLESS_S, a stream poll: well under 15 s.
    assert WATCH_LEADERLESS_S <= ended_after_s < 15, ended_after_s
    converged(client)
    # Back in touch: a new watch on the same node works again.
    again = client.stub(lonely.grpc_address).WatchEvents(
        api.WatchEventsRequest(from_revision=0), timeout=scaled(10)
    )
    assert len(next(again).events) == 0
    again.cancel()
