"""Replica repair against a real three-node cluster: a pchannel with two replicas loses
one, then the other, of its original replicas, and nothing acknowledged is lost.

With `replica_replace_after_ms`, a node DOWN for that long is replaced in replica sets by
an UP node outside them (the balancer's rule 3); the new replica copies the pchannel's log
(sealed segments and the open one) as part of the new term's recovery, which also
consults the last ready set. With two replicas a single dead one stops writes (both must
hold each entry): they go on once the set is repaired. Then the original owner dies too:
its move to the survivor cannot recover alone (it needs both members), so the dead owner
is replaced by the node that came back, and the survivor's log (the only copy of the
acknowledged entries) is what the new term adopts.
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
from wal_segments.segment import list_segment_files

pytestmark = pytest.mark.cluster

SEGMENT_BYTES = 32 * 1024
TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def repair_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dev.LocalCluster, Api]]:
    directory: Path = tmp_path_factory.mktemp("repair")
    env = {
        **os.environ,
        "RAFTWAL_NODE_TIMEOUT_MS": "2000",
        "RAFTWAL_REPLICA_REPLACE_AFTER_MS": "3000",
        "RAFTWAL_SEGMENT_MAX_BYTES": str(SEGMENT_BYTES),
    }
    with running_cluster(directory, env) as running:
        yield running


def _channel(client: Api, name: str) -> pb.PChannel:
    for channel in client.status().pchannels:
        if channel.name == name:
            return channel
    raise AssertionError(f"{name} not in the status")


def _wait_set(client: Api, name: str, members: set[str], what: str) -> pb.PChannel:
    """`name` ASSIGNED (ready) with replica set `members`."""
    deadline = time.monotonic() + scaled(TIMEOUT_S)
    last = None
    while time.monotonic() < deadline:
        try:
            last = _channel(client, name)
        except Exception as error:  # noqa: BLE001 - a node is down: ask again
            last = error
        else:
            if last.state == pb.PCHANNEL_STATE_ASSIGNED and set(last.replica_node_ids) == members:
                return last
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}: {last}")


def _produce(producer: Producer, vchannel: str, batches: int, history: History, tag: str) -> None:
    for index in range(batches):
        payloads = [b"%s-%04d-%02d-" % (tag.encode(), index, i) + b"x" * 400 for i in range(8)]
        assert producer.send(vchannel, payloads, history, budget_s=TIMEOUT_S), (tag, index)


def _segment_firsts(cluster: dev.LocalCluster, node_id: str, pchannel: str) -> list[int]:
    directory = cluster.node(node_id).data_dir / "wal" / pchannel
    if not directory.exists():
        return []
    return [first for first, _ in list_segment_files(directory)]


def test_dead_replicas_are_replaced_and_every_acknowledged_entry_survives(
    repair_cluster: tuple[dev.LocalCluster, Api],
) -> None:
    cluster, client = repair_cluster
    wait_nodes_up(client)
    created = client.call(
        "CreateChannels",
        api.CreateChannelsRequest(request_id=rid(), prefix="rep", count=1, replica_count=2),
    )
    (pchannel,) = created.pchannels
    client.call("CreateVChannel", api.CreateVChannelRequest(name="rep_v", pchannel=pchannel))
    history = History()
    producer = Producer(client, pchannel, "repair-producer")
    try:
        _produce(producer, "rep_v", 30, history, "a")  # ~100 KiB: a few sealed segments
        channel = _channel(client, pchannel)
        owner = channel.owner_node_id
        (victim,) = [n for n in channel.replica_node_ids if n != owner]
        (spare,) = [n.id for n in cluster.config.nodes if n.id not in channel.replica_node_ids]
        term = channel.term

        # 1. The other replica dies: writes stop (both members must hold each entry) and
        # go on once the spare has replaced it and copied the log.
        cluster.kill(victim, signal.SIGKILL)
        _produce(producer, "rep_v", 5, history, "b")
        repaired = _wait_set(client, pchannel, {owner, spare}, f"{victim} replaced by {spare}")
        assert repaired.owner_node_id == owner and repaired.term > term
        assert set(repaired.stable_replica_node_ids) == {owner, spare}
        firsts = _segment_firsts(cluster, spare, pchannel)
        assert firsts and firsts[0] == 1, firsts  # the sealed segments were copied
        _produce(producer, "rep_v", 10, history, "c")

        # 2. The victim comes back (an UP node outside the set); the original owner dies:
        # the survivor alone holds the acknowledged entries.
        cluster.start_node(victim)
        wait_nodes_up(client)
        cluster.kill(owner, signal.SIGKILL)
        _produce(producer, "rep_v", 5, history, "d")
        final = _wait_set(client, pchannel, {spare, victim}, f"{owner} replaced by {victim}")
        assert final.owner_node_id == spare
        _produce(producer, "rep_v", 5, history, "e")

        entries = consume_all(client, "rep_v", pchannel, expect=len(history.acked), timeout_s=60)
        payloads = [e.payload for e in entries]
        acked = [a.payload for a in history.acked]
        assert set(acked) <= set(payloads), len(set(acked) - set(payloads))
        assert len(payloads) == len(set(payloads)), "an entry was delivered twice"
        # In the order they were acknowledged.
        position = {payload: index for index, payload in enumerate(payloads)}
        assert [position[p] for p in acked] == sorted(position[p] for p in acked)
    finally:
        producer.close()
        for node in cluster.config.nodes:
            if cluster.processes.get(node.id) is None:
                cluster.start_node(node.id)
