"""Cross-cluster replication between two real dev clusters, east -> west
(docs/replication.md): produce on east, kill -9 the node that owns east's pchannel (and so
runs its replicator) mid-stream, keep producing, and check that west's matching pchannel
holds exactly east's committed entries, in order, once each, each with its source
position, and that GetReplicateCheckpoint on west says it holds the last of them.

History check: every batch east acknowledged is in east's committed log, and west holds
that log entry for entry."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, consume_all, setup_channels, wait_assigned

pytestmark = pytest.mark.cluster

SEED = random.randrange(1 << 30)
BATCHES = 40
PER_BATCH = 10
KILL_AFTER = 12


@pytest.fixture(scope="module")
def clusters(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dev.LocalCluster, dev.LocalCluster]]:
    east = dev.up(tmp_path_factory.mktemp("east"), 3, timeout_s=120, cluster_id="east")
    try:
        west = dev.up(tmp_path_factory.mktemp("west"), 3, timeout_s=120, cluster_id="west")
        try:
            yield east, west
        finally:
            west.stop_all()
    finally:
        east.stop_all()


def _configuration(east: dev.LocalCluster, west: dev.LocalCluster, pchannel: str):
    return pb.ReplicateConfiguration(
        clusters=[
            pb.ReplicateCluster(cluster_id="east", endpoints=east.endpoints, pchannels=[pchannel]),
            pb.ReplicateCluster(cluster_id="west", endpoints=west.endpoints, pchannels=[pchannel]),
        ],
        topology=[pb.ReplicateTopologyEdge(source_cluster_id="east", target_cluster_id="west")],
    )


def _checkpoint(client: Api, pchannel: str) -> wire.GetReplicateCheckpointResponse | None:
    _, _, address = wait_assigned(client, pchannel)
    channel = client.security.channel(address)
    try:
        return streaming_pb2_grpc.StreamingNodeStub(channel).GetReplicateCheckpoint(
            wire.GetReplicateCheckpointRequest(
                pchannel=pchannel, source_cluster_id="east", source_pchannel=pchannel
            ),
            timeout=10,
        )
    except grpc.RpcError:
        return None
    finally:
        channel.close()


def test_the_target_holds_the_sources_committed_entries_exactly_once(
    clusters: tuple[dev.LocalCluster, dev.LocalCluster], tmp_path: Path
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    east, west = clusters
    east_api, west_api = Api(east.endpoints), Api(west.endpoints)
    try:
        (pchannel,) = setup_channels(east_api, "rp", {"orders": 0})
        assert setup_channels(west_api, "rp", {"orders": 0}) == [pchannel]
        configuration = _configuration(east, west, pchannel)
        for client in (east_api, west_api):
            client.call(
                "UpdateReplicateConfiguration",
                api.UpdateReplicateConfigurationRequest(configuration=configuration),
            )

        history = History()
        producer = Producer(east_api, pchannel, f"app-{SEED}")
        killed = ""
        for number in range(BATCHES):
            payloads = [f"{number}.{k}.{rng.random():.6f}".encode() for k in range(PER_BATCH)]
            assert producer.send("orders", payloads, history, budget_s=60), history.failed[-3:]
            if number == KILL_AFTER:
                # The replicator runs with the owner: kill it while it is replicating.
                killed, _, _ = wait_assigned(east_api, pchannel)
                east.kill(killed)
        producer.close()
        assert killed

        acknowledged = [a.payload for a in history.acked]
        source = consume_all(east_api, "orders", pchannel, expect=len(acknowledged), timeout_s=90)
        source_payloads = [e.payload for e in source]
        assert len(set(source_payloads)) == len(source_payloads), "duplicates on the source"
        assert set(acknowledged) <= set(source_payloads), "an acknowledged entry was lost"
        last_source_lsn = source[-1].lsn

        deadline = time.monotonic() + 180
        checkpoint = None
        while time.monotonic() < deadline:
            checkpoint = _checkpoint(west_api, pchannel)
            if checkpoint is not None and checkpoint.source_lsn >= last_source_lsn:
                break
            time.sleep(0.5)
        assert checkpoint is not None and checkpoint.source_lsn == last_source_lsn, (
            checkpoint,
            last_source_lsn,
        )

        target = consume_all(west_api, "orders", pchannel, expect=len(source), timeout_s=90)
        assert [
            (
                e.payload,
                e.properties["rw.src.cluster"],
                e.properties["rw.src.pchannel"],
                int(e.properties["rw.src.lsn"]),
                int(e.properties["rw.src.tick"]),
            )
            for e in target
        ] == [(e.payload, "east", pchannel, e.lsn, e.time_tick) for e in source]
        # Nothing more arrives later (no duplicate behind the checkpoint).
        time.sleep(2)
        again = consume_all(west_api, "orders", pchannel, expect=len(source) + 1, timeout_s=5)
        assert len(again) == len(source)
        assert checkpoint.target_lsn == target[-1].lsn
    finally:
        east_api.close()
        west_api.close()
