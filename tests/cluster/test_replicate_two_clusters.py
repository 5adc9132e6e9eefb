"""Cross-cluster replication between two real dev clusters, east -> west
(docs/replication.md): produce on east, kill -9 the node that owns east's pchannel (and so
runs its replicator) mid-stream, then the node that owns west's pchannel (the target's
writer), keep producing, and check that west's matching pchannel
holds exactly east's committed entries, in order, once each, each with its source
position (the killed east node restarts meanwhile), and that GetReplicateCheckpoint on west says it holds the last of them.

History check: every batch east acknowledged is in east's committed log, and west holds
that log entry for entry."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2 as E
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import (
    History,
    Producer,
    consume_all,
    setup_channels,
    wait_assigned,
    wait_nodes_up,
)
from tests.timing import scaled

pytestmark = pytest.mark.cluster

SEED = random.randrange(1 << 30)
BATCHES = 40
PER_BATCH = 10
KILL_AFTER = 12
KILL_TARGET_AFTER = 25
CREATE_AFTER = 18
# A made-up pchannel of east for the target-side test (a producer of its own on west).
SOURCE = "rp_9"


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


def _recorded_checkpoints(client: Api, *, deadline_s: float, until: int) -> list[int]:
    """The source LSNs east's Raft recorded for west, in revision order, once one
    reaches `until` (or the time runs out)."""
    deadline = time.monotonic() + deadline_s
    recorded: list[int] = []
    attempt = 0
    while time.monotonic() < deadline:
        recorded = []
        # Each endpoint in turn: one of them may be the node the test killed.
        endpoint = client.endpoints[attempt % len(client.endpoints)]
        attempt += 1
        stream = client.stub(endpoint).WatchEvents(
            api.WatchEventsRequest(from_revision=1, kinds=["replicate_checkpoint_recorded"]),
            timeout=5,
        )
        try:
            for batch in stream:
                recorded += [e.replicate_checkpoint_recorded.source_lsn for e in batch.events]
                if not batch.events and batch.next_revision > batch.applied_revision:
                    break
        except grpc.RpcError:
            pass
        if recorded and recorded[-1] >= until:
            return recorded
        time.sleep(0.5)
    return recorded


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
        # West gets its vchannels from the replicator.
        wait_nodes_up(west_api)
        west_api.call("CreateChannels", api.CreateChannelsRequest(names=[pchannel]))
        # `raftwal replicate set FILE` applies the file to both clusters.
        (tmp_path / "replicate.toml").write_text(
            "\n".join(
                f'[[clusters]]\nid = "{name}"\nendpoints = {json.dumps(local.endpoints)}\n'
                f'pchannels = ["{pchannel}"]\n'
                for name, local in (("east", east), ("west", west))
            )
            + '\n[[topology]]\nsource = "east"\ntarget = "west"\n'
        )
        done = subprocess.run(
            [sys.executable, "-m", "raftwal.cli", "replicate", "set", "--json",
             str(tmp_path / "replicate.toml")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        applied = json.loads(done.stdout)["clusters"]
        assert [(a["cluster_id"], a["changed"]) for a in applied] == [
            ("east", True),
            ("west", True),
        ]
        for client in (east_api, west_api):
            answer = client.call(
                "GetReplicateConfiguration", api.GetReplicateConfigurationRequest()
            )
            assert answer.configuration == _configuration(east, west, pchannel)

        history = History()
        producer = Producer(east_api, pchannel, f"app-{SEED}")
        killed = killed_target = ""
        for number in range(BATCHES):
            payloads = [f"{number}.{k}.{rng.random():.6f}".encode() for k in range(PER_BATCH)]
            if number == CREATE_AFTER:
                east_api.call(
                    "CreateVChannel", api.CreateVChannelRequest(name="refunds", pchannel=pchannel)
                )
            vchannel = "refunds" if number > CREATE_AFTER and number % 2 else "orders"
            assert producer.send(vchannel, payloads, history, budget_s=60), history.failed[-3:]
            if number == KILL_AFTER:
                # The replicator runs with the owner: kill it while it is replicating.
                killed, _, _ = wait_assigned(east_api, pchannel)
                east.kill(killed)
            if number == KILL_TARGET_AFTER:
                # ... and the target's owner, whose producer table holds the checkpoint.
                killed_target, _, _ = wait_assigned(west_api, pchannel)
                west.kill(killed_target)
                # The source node comes back (rebalancing may give it the pchannel, and
                # so the replicator, again).
                east.start_node(killed)
        producer.close()
        assert killed and killed_target

        acknowledged = [a.payload for a in history.acked]
        refunds = sum(1 for n in range(BATCHES) if n > CREATE_AFTER and n % 2) * PER_BATCH
        source_refunds = consume_all(east_api, "refunds", pchannel, expect=refunds, timeout_s=60)
        source = consume_all(
            east_api, "orders", pchannel, expect=len(acknowledged) - refunds, timeout_s=90
        )
        source = sorted([*source, *source_refunds], key=lambda e: e.lsn)
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

        target = consume_all(
            west_api, "orders", pchannel, expect=len(source) - refunds, timeout_s=90
        )
        target += consume_all(west_api, "refunds", pchannel, expect=refunds, timeout_s=60)
        target.sort(key=lambda e: e.lsn)
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
        assert len(again) == len(source) - refunds
        assert checkpoint.target_lsn == target[-1].lsn
        # East's retention hold follows: the replicator reports where west stands.
        recorded = _recorded_checkpoints(east_api, deadline_s=30, until=last_source_lsn)
        assert recorded and recorded[-1] == last_source_lsn, recorded
        assert recorded == sorted(recorded), "a recorded checkpoint went back"
        status = subprocess.run(
            [sys.executable, "-m", "raftwal.cli", "replicate", "status", "--json",
             "--endpoints", ",".join(east.endpoints)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)["pchannels"]
        assert (row["pchannel"], row["target_cluster_id"], row["target_checkpoint_lsn"]) == (
            pchannel,
            "west",
            last_source_lsn,
        )
        assert (row["lag_entries"], row["lag_s"]) == (0, 0.0), row
        # The source owner's metric says the same (the RaftwalReplicationLagHigh alert's).
        owner_id = wait_assigned(east_api, pchannel)[0]
        port = east.node(owner_id).metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            lags = {
                (s.labels["pchannel"], s.labels["target"]): s.value
                for family in text_string_to_metric_families(page.read().decode())
                for s in family.samples
                if s.name == "raftwal_replicate_lag_entries"
            }
        assert lags == {(pchannel, "west"): 0.0}, lags

        # A vchannel dropped on the source is dropped on the target once replicated.
        east_api.call("DropVChannel", api.DropVChannelRequest(name="refunds"))
        deadline = time.monotonic() + 30
        states: dict[str, int] = {}
        while time.monotonic() < deadline:
            described = west_api.call(
                "DescribeChannels", api.DescribeChannelsRequest(pchannels=[pchannel])
            )
            # (A dropped vchannel is no longer described.)
            states = {v.name: v.state for v in described.vchannels}
            if states.get("refunds") != pb.VCHANNEL_STATE_NORMAL:
                break
            time.sleep(0.5)
        assert states.get("refunds") != pb.VCHANNEL_STATE_NORMAL
        assert states["orders"] == pb.VCHANNEL_STATE_NORMAL
    finally:
        east_api.close()
        west_api.close()


def _replicate_status(east: dev.LocalCluster) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "raftwal.cli", "replicate", "status", "--json",
         "--endpoints", ",".join(east.endpoints)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["pchannels"]
    return row  # type: ignore[no-any-return]


def test_a_stalled_standby_says_so_in_one_line(
    clusters: tuple[dev.LocalCluster, dev.LocalCluster],
) -> None:
    """West stops answering (every node paused) while east takes writes: east's
    replicator says in one line that it is stalled and how far behind (ClusterStatus
    warnings, `replicate status`); once west answers again it catches up, the line goes
    away and the figures say caught up."""
    east, west = clusters
    east_api, west_api = Api(east.endpoints), Api(west.endpoints)
    paused: list[int] = []
    try:
        answer = east_api.call("GetReplicateConfiguration", api.GetReplicateConfigurationRequest())
        (pchannel,) = answer.configuration.clusters[0].pchannels
        for node in west.config.nodes:
            pid = west.pid(node.id)
            if pid is not None:
                dev.signal_node(pid, signal.SIGSTOP)  # every process of the node
                paused.append(pid)
        history = History()
        producer = Producer(east_api, pchannel, f"stall-{SEED}")
        for number in range(5):
            payloads = [f"stall.{number}.{k}".encode() for k in range(PER_BATCH)]
            assert producer.send("orders", payloads, history, budget_s=60), history.failed[-3:]
        producer.close()
        deadline = time.monotonic() + scaled(60)
        lines: list[str] = []
        while time.monotonic() < deadline and not lines:
            status = east_api.call("ClusterStatus", api.ClusterStatusRequest())
            lines = [w for w in status.warnings if f"replication of pchannel {pchannel}" in w]
            time.sleep(0.5)
        assert lines, list(status.warnings)
        (line,) = lines
        assert f"replication of pchannel {pchannel} to west/{pchannel} is stalled:" in line, line
        assert "entries (" in line and "behind" in line, line
        row = _replicate_status(east)
        measured = row["replicator"]
        assert isinstance(measured, dict), row
        assert measured["keeping_up"] is False and measured["lag_entries"] > 0, measured
        assert measured["lag_s"] >= 5 and measured["lag_bytes"] > 0, measured
    finally:
        for pid in paused:
            dev.signal_node(pid, signal.SIGCONT)
    try:
        deadline = time.monotonic() + scaled(90)
        measured = {}
        while time.monotonic() < deadline:
            measured = _replicate_status(east)["replicator"]  # type: ignore[assignment]
            if measured and measured["lag_entries"] == 0 and measured["keeping_up"]:
                break
            time.sleep(1.0)
        assert measured and measured["lag_entries"] == 0, measured
        assert (measured["summary"], measured["lag_bytes"], measured["lag_s"]) == ("", 0, 0)
        status = east_api.call("ClusterStatus", api.ClusterStatusRequest())
        assert not [w for w in status.warnings if "is stalled" in w], list(status.warnings)
        checkpoint = _checkpoint(west_api, pchannel)
        assert checkpoint is not None and checkpoint.source_lsn == measured["target_lsn"]
    finally:
        east_api.close()
        west_api.close()


def _produce(client: Api, pchannel: str, request: wire.ProduceRequest) -> wire.ProduceResult:
    _, _, address = wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, "unused")
    try:
        return producer.produce_once(request, address, timeout_s=10)
    finally:
        producer.close()


def _replicated(pchannel: str, lsns: list[int], previous: int, **fields) -> wire.ProduceRequest:
    request = wire.ProduceRequest(
        request_id=1,
        pchannel=pchannel,
        messages=[wire.Message(vchannel="orders", payload=f"r{n}".encode()) for n in lsns],
        producer_id=f"rw.replicate/east/{SOURCE}",
        sequence=lsns[-1],
        previous_sequence=previous,
        replicate_source=wire.ReplicateSource(
            cluster_id="east", pchannel=SOURCE, lsns=lsns, time_ticks=[7] * len(lsns)
        ),
    )
    for name, value in fields.items():
        setattr(request, name, value)
    return request


def test_a_replicated_batch_must_continue_the_targets_sequence(
    clusters: tuple[dev.LocalCluster, dev.LocalCluster],
) -> None:
    """The target side alone, on west: batches of a made-up pchannel of east (its own
    producer, beside the real replicator's). What was acknowledged is what
    GetReplicateCheckpoint answers and what the log holds."""
    _, west = clusters
    client = Api(west.endpoints)
    try:
        pchannel = "rp_0"
        wait_assigned(client, pchannel)

        def checkpoint() -> int:
            """The last source LSN of SOURCE that west's log holds (GetReplicateCheckpoint
            answers only the configured pair, east/rp_0)."""
            held = [
                int(e.properties["rw.src.lsn"])
                for e in consume_all(client, "orders", pchannel, expect=1_000_000, timeout_s=2)
                if e.properties.get("rw.src.pchannel") == SOURCE
            ]
            return held[-1] if held else 0

        _, _, address = wait_assigned(client, pchannel)
        channel = client.security.channel(address)
        try:
            with pytest.raises(grpc.RpcError) as raised:
                streaming_pb2_grpc.StreamingNodeStub(channel).GetReplicateCheckpoint(
                    wire.GetReplicateCheckpointRequest(
                        pchannel=pchannel, source_cluster_id="east", source_pchannel=SOURCE
                    ),
                    timeout=10,
                )
        finally:
            channel.close()
        assert "does not replicate east/rp_9 (got that pair; expected east/rp_0)" in str(
            raised.value.details()
        )
        assert checkpoint() == 0
        first = _produce(client, pchannel, _replicated(pchannel, [3, 5], previous=0))
        assert first.error.code == 0 and not first.duplicate, first.error
        assert checkpoint() == 5
        # A retry of the same batch is answered from the producer table: same positions.
        retry = _produce(client, pchannel, _replicated(pchannel, [3, 5], previous=0))
        assert retry.duplicate and list(retry.positions) == list(first.positions)
        # A batch that does not continue at 5 (a second, stale replicator) is refused.
        stale = _produce(client, pchannel, _replicated(pchannel, [4, 6], previous=3))
        assert stale.error.code == E.INVALID_REQUEST_SEQ
        assert "got previous_sequence 3; expected 5" in stale.error.message
        assert checkpoint() == 5
        assert _produce(client, pchannel, _replicated(pchannel, [9], previous=5)).error.code == 0
        assert checkpoint() == 9

        for request, expected in (
            (_replicated(pchannel, [12, 11], previous=9), "strictly increasing source LSNs"),
            (_replicated(pchannel, [12], previous=9, sequence=13), "expected 12, the source LSN"),
            (
                _replicated(pchannel, [12], previous=9, producer_id="rw.replicate/x/y"),
                "expected 'rw.replicate/east/rp_9'",
            ),
            (
                wire.ProduceRequest(
                    pchannel=pchannel,
                    messages=[wire.Message(vchannel="orders", payload=b"x")],
                    producer_id="rw.replicate/east/rp_9",
                    sequence=20,
                ),
                "is reserved for replicated batches",
            ),
        ):
            refused = _produce(client, pchannel, request)
            assert refused.error.code == E.INVALID_ARGUMENT, refused
            assert expected in refused.error.message and "expected" in refused.error.message
        assert checkpoint() == 9
        replicated = [
            e
            for e in consume_all(client, "orders", pchannel, expect=1_000_000, timeout_s=5)
            if e.properties.get("rw.src.pchannel") == SOURCE
        ]
        assert [int(e.properties["rw.src.lsn"]) for e in replicated] == [3, 5, 9]
        # Only the configured source may write: a batch from another cluster is refused.
        north = _replicated(pchannel, [12], previous=9)
        north.producer_id = f"rw.replicate/north/{SOURCE}"
        north.replicate_source.cluster_id = "north"
        refused = _produce(client, pchannel, north)
        assert refused.error.code == E.IGNORED_OPERATION
        assert "expected batches from east" in refused.error.message
    finally:
        client.close()


def test_the_target_refuses_client_writes_naming_its_source(
    clusters: tuple[dev.LocalCluster, dev.LocalCluster],
) -> None:
    """West is east's target: a plain Produce, a transaction and `raftwal produce` there
    are refused with an error that names east; nothing is written."""
    _, west = clusters
    client = Api(west.endpoints)
    try:
        pchannel = "rp_0"
        before = consume_all(client, "orders", pchannel, expect=1_000_000, timeout_s=3)
        plain = wire.ProduceRequest(
            request_id=1,
            pchannel=pchannel,
            messages=[wire.Message(vchannel="orders", payload=b"not here")],
        )
        refused = _produce(client, pchannel, plain)
        assert refused.error.code == E.IGNORED_OPERATION, refused
        assert "replication target of cluster east (got a Produce" in refused.error.message
        _, _, address = wait_assigned(client, pchannel)
        channel = client.security.channel(address)
        try:
            with pytest.raises(grpc.RpcError) as raised:
                streaming_pb2_grpc.StreamingNodeStub(channel).BeginTxn(
                    wire.BeginTxnRequest(vchannel="orders"), timeout=10
                )
        finally:
            channel.close()
        assert "replication target of cluster east (got a BeginTxn" in str(raised.value.details())
        done = subprocess.run(
            [sys.executable, "-m", "raftwal.cli", "produce", "--vchannel", "orders", "--count", "1",
             "--endpoints", ",".join(west.endpoints), "--timeout-s", "10"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert "cluster east" in done.stderr
        after = consume_all(client, "orders", pchannel, expect=1_000_000, timeout_s=3)
        assert [e.lsn for e in after] == [e.lsn for e in before]
    finally:
        client.close()


def test_promote_makes_the_target_writable_and_says_what_it_holds(
    clusters: tuple[dev.LocalCluster, dev.LocalCluster],
) -> None:
    """Runs last: west stops being east's target. It reports the last source LSN it holds
    of east's pchannel (the replicator's checkpoint), and takes client writes again."""
    east, west = clusters
    client = Api(west.endpoints)
    try:
        pchannel = "rp_0"
        _, _, address = wait_assigned(client, pchannel)
        channel = client.security.channel(address)
        try:
            held = streaming_pb2_grpc.StreamingNodeStub(channel).GetReplicateCheckpoint(
                wire.GetReplicateCheckpointRequest(
                    pchannel=pchannel, source_cluster_id="east", source_pchannel=pchannel
                ),
                timeout=10,
            )
        finally:
            channel.close()
        assert held.source_lsn > 0
        # East is gone: no more replicated entries may arrive while west is promoted.
        for node in east.config.nodes:
            east.kill(node.id)
        done = subprocess.run(
            [sys.executable, "-m", "raftwal.cli", "replicate", "promote", "--json",
             "--endpoints", ",".join(west.endpoints)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["source_cluster_id"] == "east"
        assert report["pchannels"] == [
            {"pchannel": pchannel, "source_pchannel": pchannel, "last_source_lsn": held.source_lsn}
        ]
        answer = client.call("GetReplicateConfiguration", api.GetReplicateConfigurationRequest())
        assert list(answer.configuration.topology) == []
        written = _produce(
            client,
            pchannel,
            wire.ProduceRequest(
                request_id=1,
                pchannel=pchannel,
                messages=[wire.Message(vchannel="orders", payload=b"after promote")],
            ),
        )
        assert written.error.code == 0, written.error
        entries = consume_all(client, "orders", pchannel, expect=1_000_000, timeout_s=3)
        assert entries[-1].payload == b"after promote"
        # A second promote has nothing to do and says so.
        again = subprocess.run(
            [sys.executable, "-m", "raftwal.cli", "replicate", "promote",
             "--endpoints", ",".join(west.endpoints)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert again.returncode == 2 and "is not a replication target" in again.stderr
    finally:
        client.close()
