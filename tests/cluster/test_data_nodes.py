"""A cluster larger than its Raft membership: five nodes, three of them voters and two data
nodes (`role = "data"`: they follow the Raft log without voting), on real processes.

A producer on eight pchannels spread over all five nodes: the balancer places owners and
replica sets on the data nodes too. A data node is killed (its pchannels move to other
members of their replica sets) and restarted, then the Raft leader is killed (a voter
takes over; the data nodes follow it); every acknowledged message is read back once, in
order, and no data node ever leads.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api, rid, running_cluster
from tests.cluster.wal_helpers import History, Producer, consume_all, wait_nodes_up
from tests.timing import scaled

pytestmark = pytest.mark.cluster

PCHANNELS = 8
VOTERS = {"n1", "n2", "n3"}
DATA = {"n4", "n5"}
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def five(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    directory: Path = tmp_path_factory.mktemp("five")
    env = {**os.environ, "RAFTWAL_NODE_TIMEOUT_MS": "2000"}
    with running_cluster(directory, env, nodes=5, data_nodes=2, timeout_s=90) as running:
        yield running


def _placed(client: Api, names: list[str]) -> dict[str, pb.PChannel]:
    """The pchannels once every one of them is ASSIGNED."""
    deadline = time.monotonic() + scaled(TIMEOUT_S)
    last: object = None
    while time.monotonic() < deadline:
        try:
            status = client.status()
        except Exception as error:  # noqa: BLE001 - a node is down: ask again
            last = error
            time.sleep(0.3)
            continue
        assert status.leader_node_id in VOTERS | {""}, status.leader_node_id
        channels = {c.name: c for c in status.pchannels if c.name in names}
        if len(channels) == len(names) and all(
            c.state == pb.PCHANNEL_STATE_ASSIGNED for c in channels.values()
        ):
            return channels
        last = {n: (c.state, c.owner_node_id) for n, c in channels.items()}
        time.sleep(0.3)
    raise AssertionError(f"pchannels not all ASSIGNED: {last}")


def _produce_round(
    producers: dict[str, Producer], history: dict[str, History], tag: str, batches: int = 3
) -> None:
    for index in range(batches):
        for name, producer in producers.items():
            payloads = [
                b"%s-%s-%03d-%d" % (name.encode(), tag.encode(), index, i) for i in range(5)
            ]
            assert producer.send(f"{name}_v", payloads, history[name], budget_s=TIMEOUT_S), (
                name,
                tag,
                index,
            )


def test_five_nodes_three_voters_a_producer_over_all_of_them(
    five: tuple[dev.LocalCluster, Api],
) -> None:
    cluster, client = five
    status = client.status()
    roles = {m.node_id: m.role for m in status.members}
    assert roles == {"n1": "voter", "n2": "voter", "n3": "voter", "n4": "data", "n5": "data"}
    assert status.leader_node_id in VOTERS
    assert all(m.reachable for m in status.members)

    created = client.call(
        "CreateChannels", api.CreateChannelsRequest(request_id=rid(), prefix="big", count=PCHANNELS)
    )
    names = list(created.pchannels)
    for name in names:
        client.call("CreateVChannel", api.CreateVChannelRequest(name=f"{name}_v", pchannel=name))
    placed = _placed(client, names)
    owners = {c.owner_node_id for c in placed.values()}
    assert owners == VOTERS | DATA, {n: c.owner_node_id for n, c in placed.items()}
    holders = {n for c in placed.values() for n in c.replica_node_ids}
    assert holders >= DATA

    producers = {name: Producer(client, name, f"p-{name}") for name in names}
    history = {name: History() for name in names}
    leader = ""
    try:
        _produce_round(producers, history, "a")

        # A data node dies: what it owned moves within its replica sets; writes go on.
        cluster.kill("n5", signal.SIGKILL)
        _produce_round(producers, history, "b")
        placed = _placed(client, names)
        assert "n5" not in {c.owner_node_id for c in placed.values()}

        # n5 comes back (with three replicas per pchannel, a second dead node could take a
        # majority of some set); then the Raft leader dies: a voter takes over, the data
        # nodes follow it.
        cluster.start_node("n5")
        wait_nodes_up(client, count=5)
        leader = client.status().leader_node_id
        assert leader in VOTERS
        cluster.kill(leader, signal.SIGKILL)
        _produce_round(producers, history, "c")
        placed = _placed(client, names)
        status = client.status()
        assert status.leader_node_id in VOTERS - {leader}
        follower = {m.node_id: m for m in status.members}["n4"]
        assert follower.reachable and follower.applied_index > 0

        for name in names:
            acked = [a.payload for a in history[name].acked]
            entries = consume_all(client, f"{name}_v", name, expect=len(acked), timeout_s=60)
            payloads = [e.payload for e in entries]
            assert payloads[: len(acked)] == acked, name
    finally:
        for producer in producers.values():
            producer.close()
        for node_id in ("n5", leader):
            if node_id and cluster.processes.get(node_id) is None:
                cluster.start_node(node_id)
