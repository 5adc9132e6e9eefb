"""Injected disk and network faults on a real three-node cluster (`raftwal.node.faults`).

Each test starts a fresh cluster with fault injection enabled (``RAFTWAL_ENABLE_FAULTS=1``
and a faults file the test rewrites to switch faults on and off while the nodes run), and
checks what was acknowledged against what a consumer reads back and what the segment files
on every node hold:

- ENOSPC on the WAL appends of one pchannel at its owner: producers get a typed,
  retryable RESOURCE_EXHAUSTED (with the disk detail) and no acknowledgement, the node
  stays up and serves its other work, no segment is corrupted, and writes resume when
  space returns;
- an fdatasync failure of the owner's WAL: the owner stops (never acknowledges from a copy
  it cannot trust) and the pchannel recovers at a new term, on another node while the
  fault lasts;
- a Raft leader whose journal fsync fails steps down by exiting (status 70, with a
  CRITICAL log line saying why; a supervisor restarts it, and a restart with a working
  disk rejoins), and another leader is elected within a bound;
- dropped replication messages are resent (log matching finds the gap);
- a slow disk only slows.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api, converged, leader_id
from tests.cluster.test_wal_faults import _check_history
from tests.cluster.wal_helpers import (
    History,
    Producer,
    consume_all,
    setup_channels,
    wait_assigned,
)
from tests.timing import scaled, wait_for
from wal_segments.segment import SegmentReader, list_segment_files, open_segment

pytestmark = pytest.mark.cluster
E = errors_pb2
SEED = int(os.environ.get("RAFTWAL_TEST_SEED", random.randrange(1 << 30)))


@dataclass
class FaultCluster:
    cluster: dev.LocalCluster
    client: Api
    faults_file: Path

    def set_faults(self, rules: list[dict[str, object]]) -> None:
        """Switch the rules on every node (atomically: the nodes never read half a file)."""
        temporary = self.faults_file.with_name("faults.json.tmp")
        temporary.write_text(json.dumps({"faults": rules}))
        os.replace(temporary, self.faults_file)
        # Nodes look at the file at most every 100 ms.
        time.sleep(0.3)


@pytest.fixture()
def fault_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    print(f"seed {SEED}")
    directory: Path = tmp_path_factory.mktemp("faultcluster")
    faults_file = directory / "faults.json"
    env = {
        **os.environ,
        "RAFTWAL_ENABLE_FAULTS": "1",
        "RAFTWAL_FAULTS_FILE": str(faults_file),
        "RAFTWAL_SEGMENT_MAX_BYTES": str(64 * 1024),
        "RAFTWAL_NODE_TIMEOUT_MS": "2000",
        "RAFTWAL_ASSIGN_TIMEOUT_MS": "4000",
    }
    local = dev.up(directory, 3, timeout_s=60, env=env)
    client = Api(local.endpoints)
    try:
        yield FaultCluster(local, client, faults_file)
    finally:
        client.close()
        local.stop_all()


def _healthy(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=scaled(5))
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _produce_raw(address: str, pchannel: str, vchannel: str, payload: bytes) -> wire.ProduceResult:
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        request = wire.ProduceRequest(
            request_id=1,
            pchannel=pchannel,
            messages=[wire.Message(vchannel=vchannel, payload=payload)],
        )
        (result,) = list(stub.Produce(iter([request]), timeout=scaled(15)))
    return result


def _send_batches(
    producer: Producer, vchannel: str, prefix: str, batches: int, history: History
) -> None:
    for index in range(batches):
        payloads = [b"%s-%04d-%02d-" % (prefix.encode(), index, i) + b"x" * 300 for i in range(10)]
        assert producer.send(vchannel, payloads, history, budget_s=60), (prefix, index)


def _check_segment_files(cluster: dev.LocalCluster) -> int:
    """Every segment file on every node opens cleanly: no torn tail, no corruption, and a
    sealed one verifies block by block. Returns how many files were checked."""
    checked = 0
    for node in cluster.config.nodes:
        wal_dir = node.data_dir / "wal"
        for directory in sorted(p for p in wal_dir.iterdir() if p.is_dir()):
            for _, path in list_segment_files(directory):
                recovered = open_segment(path, repair=False, verify_blocks=True)
                assert recovered.truncated is None, f"{path}: {recovered.truncated}"
                if recovered.sealed:
                    SegmentReader.open(path).close()
                checked += 1
    return checked


def _segment_files_whole(cluster: dev.LocalCluster, at_least: int) -> int:
    """`_check_segment_files` once the replicas' last writes and fsyncs have landed: a
    replica still appending shows a tail in flight, which is not a torn one. Bounded by the
    scaled deadline; the last check's failure is what a timeout reports."""
    last: list[BaseException | int] = []

    def check() -> int:
        try:
            checked = _check_segment_files(cluster)
        except AssertionError as error:
            last[:] = [error]
            return 0
        last[:] = [checked]
        return checked if checked >= at_least else 0

    try:
        return wait_for(f"{at_least} whole segment files", check, timeout_s=20)
    except AssertionError:
        if last and isinstance(last[0], BaseException):
            raise last[0] from None
        raise


def test_enospc_on_wal_append_fails_clearly_and_writes_resume(fault_cluster) -> None:
    cluster, client = fault_cluster.cluster, fault_cluster.client
    full, other = setup_channels(client, "enospc", {"full_v": 0, "other_v": 1})
    owner, term, address = wait_assigned(client, full)
    history, other_history = History(), History()
    producer = Producer(client, full, f"p-{uuid.uuid4().hex[:8]}")
    other_producer = Producer(client, other, "other")
    try:
        _send_batches(producer, "full_v", "before", 15, history)
        fault_cluster.set_faults(
            [
                {
                    "point": "wal.append",
                    "action": "error",
                    "errno": "ENOSPC",
                    "nodes": [owner],
                    "match": f"/wal/{full}/",
                }
            ]
        )
        acked_before = len(history.acked)
        for attempt in range(5):
            # 20 KB: beyond what the open segment has left, so the owner first tries to seal
            # it (the seal marker's append fails too), then the batch.
            payload = b"refused-%d-" % attempt + b"r" * 20_000
            result = _produce_raw(address, full, "full_v", payload)
            print(f"while the disk is full: {result.error}")
            assert result.HasField("error"), f"acknowledged while the disk is full: {result}"
            assert result.error.code == E.RESOURCE_EXHAUSTED, result.error
            assert "No space left on device" in result.error.message, result.error.message
            assert f"node {owner}" in result.error.message
            assert result.error.disk.node_id == owner and result.error.disk.mark == "full"
        # The node is up: health, its view of the cluster, reads of what was acknowledged,
        # and the other pchannel (it holds a replica of it, or owns it) takes writes.
        # (The owner's data worker and its control process: the node is up.)
        assert _healthy(address)
        node_address = cluster.config.node(owner).grpc_address
        assert _healthy(node_address)
        status = client.status(endpoint=node_address)
        assert {m.node_id for m in status.members if m.reachable} == {"n1", "n2", "n3"}
        entries = consume_all(client, "full_v", full, expect=acked_before)
        _check_history(history, entries)
        _send_batches(other_producer, "other_v", "other", 5, other_history)
        # Space returns: writes resume at the same owner (the batch failed, the log did not).
        fault_cluster.set_faults([])
        _send_batches(producer, "full_v", "after", 15, history)
        assert wait_assigned(client, full)[:2] == (owner, term)
    finally:
        producer.close()
        other_producer.close()
    entries = consume_all(client, "full_v", full, expect=len(history.acked))
    _check_history(history, entries)
    assert len(entries) == len(history.acked) == 300
    assert not [e for e in entries if e.payload.startswith(b"refused-")]
    other_entries = consume_all(client, "other_v", other, expect=len(other_history.acked))
    _check_history(other_history, other_entries)
    _segment_files_whole(cluster, at_least=6)


def test_wal_fsync_failure_stops_the_owner_and_the_pchannel_recovers(fault_cluster) -> None:
    cluster, client = fault_cluster.cluster, fault_cluster.client
    (pchannel,) = setup_channels(client, "fsyncfail", {"ff_v": 0})
    owner, term, _ = wait_assigned(client, pchannel)
    history = History()
    producer = Producer(client, pchannel, "fsync")
    try:
        _send_batches(producer, "ff_v", "before", 10, history)
        fault_cluster.set_faults(
            [
                {
                    "point": "wal.fsync",
                    "action": "error",
                    "errno": "EIO",
                    "nodes": [owner],
                    "match": f"/wal/{pchannel}/",
                }
            ]
        )
        # The retrying producer gets through: the owner stops, and the pchannel moves on to
        # a new term (on another node while the fault lasts).
        _send_batches(producer, "ff_v", "during", 10, history)
        new_owner, new_term, _ = wait_assigned(client, pchannel, min_term=term + 1)
        assert new_term > term
        fault_cluster.set_faults([])
        _send_batches(producer, "ff_v", "after", 10, history)
    finally:
        producer.close()
    print(f"owner {owner} at term {term} -> {new_owner} at term {new_term}")
    log_text = (cluster.directory / f"{owner}.log").read_text(errors="replace")
    assert "local write failed" in log_text
    entries = consume_all(client, "ff_v", pchannel, expect=len(history.acked))
    _check_history(history, entries)
    assert len(entries) == len(history.acked) == 300
    # The faulty node's copy is whole again once it replicates (it reopened its log).
    converged(client, expect_members=3, timeout_s=30)
    _segment_files_whole(cluster, at_least=3)


def test_leader_whose_journal_fsync_fails_steps_down(fault_cluster) -> None:
    cluster, client = fault_cluster.cluster, fault_cluster.client
    old_leader = leader_id(client)
    fault_cluster.set_faults(
        [{"point": "raft.journal.fsync", "action": "error", "errno": "EIO", "nodes": [old_leader]}]
    )
    started = time.monotonic()
    # A write makes the leader sync its journal; the client follows the new leader.
    client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=60_000, holder="fsync"), timeout_s=30)
    process = cluster.processes[old_leader]
    assert process is not None
    # The faulty leader stops at once instead of hanging: it exits with status 70.
    assert process.wait(timeout=scaled(20)) == 70
    survivors = Api([n.grpc_address for n in cluster.config.nodes if n.id != old_leader])
    try:
        new_leader = old_leader
        while new_leader == old_leader and time.monotonic() - started < scaled(30):
            new_leader = leader_id(survivors, timeout_s=20)
            time.sleep(0.1)
        elapsed_s = time.monotonic() - started
        print(f"leader {old_leader} -> {new_leader} in {elapsed_s:.1f} s")
        assert new_leader != old_leader
        assert elapsed_s < 25
        # Writes go through the cluster without it.
        lease = survivors.call("GrantLease", api.GrantLeaseRequest(ttl_ms=60_000, holder="after"))
        assert lease.lease_id > 0
        (pchannel,) = setup_channels_with(survivors, "afterfsync", {"af_v": 0})
        history = History()
        producer = Producer(survivors, pchannel, "after")
        try:
            _send_batches(producer, "af_v", "after", 3, history)
        finally:
            producer.close()
    finally:
        survivors.close()
    log_text = (cluster.directory / f"{old_leader}.log").read_text(errors="replace")
    assert "fatal Raft error, exiting" in log_text and "injected fault" in log_text
    # With a working disk again, the node restarts from its journal and rejoins.
    fault_cluster.set_faults([])
    cluster.start_node(old_leader)
    status = converged(client, expect_members=3, timeout_s=60)
    assert status.leader_node_id


def setup_channels_with(client: Api, prefix: str, vchannels: dict[str, int]) -> list[str]:
    """`setup_channels` for a cluster where one node is down (two nodes UP)."""
    created = client.call("CreateChannels", api.CreateChannelsRequest(prefix=prefix, count=1))
    names = list(created.pchannels)
    for vchannel, index in vchannels.items():
        client.call(
            "CreateVChannel", api.CreateVChannelRequest(name=vchannel, pchannel=names[index])
        )
    return names


def test_dropped_replication_messages_are_resent(fault_cluster) -> None:
    cluster, client = fault_cluster.cluster, fault_cluster.client
    (pchannel,) = setup_channels(client, "drops", {"dr_v": 0})
    owner, term, _ = wait_assigned(client, pchannel)
    history = History()
    producer = Producer(client, pchannel, "drops")
    try:
        _send_batches(producer, "dr_v", "before", 5, history)
        fault_cluster.set_faults(
            [
                {
                    "point": "replication.send",
                    "action": "drop",
                    "probability": 0.3,
                    "nodes": [owner],
                    "match": pchannel,
                }
            ]
        )
        started = time.monotonic()
        _send_batches(producer, "dr_v", "during", 25, history)
        print(f"25 batches with 30% of Append messages dropped: {time.monotonic() - started:.1f} s")
        fault_cluster.set_faults([])
    finally:
        producer.close()
    log_text = (cluster.directory / f"{owner}.log").read_text(errors="replace")
    assert "replication.send:drop" in log_text, "no Append message was dropped"
    # Dropping is not a failover: the same owner, the same term.
    assert wait_assigned(client, pchannel)[:2] == (owner, term)
    entries = consume_all(client, "dr_v", pchannel, expect=len(history.acked))
    _check_history(history, entries)
    assert len(entries) == len(history.acked) == 300
    # Every replica catches up completely.
    deadline = time.monotonic() + scaled(20)
    positions: dict[str, int] = {}
    while time.monotonic() < deadline:
        member = next(m for m in client.status().members if m.node_id == owner)
        (owner_status,) = [o for o in member.owners if o.pchannel == pchannel]
        positions = {r.node_id: r.durable_lsn for r in owner_status.replicas}
        if len(set(positions.values())) == 1 and len(positions) == 3:
            break
        time.sleep(0.2)
    assert len(set(positions.values())) == 1, positions
    assert _check_segment_files(cluster) >= 3


def test_slow_disk_only_slows(fault_cluster) -> None:
    cluster, client = fault_cluster.cluster, fault_cluster.client
    (pchannel,) = setup_channels(client, "slow", {"sl_v": 0})
    wait_assigned(client, pchannel)
    history = History()
    producer = Producer(client, pchannel, "slow")
    try:
        fault_cluster.set_faults(
            [{"point": "wal.fsync", "action": "delay", "delay_ms": 40, "match": pchannel}]
        )
        started = time.monotonic()
        _send_batches(producer, "sl_v", "slow", 10, history)
        elapsed_s = time.monotonic() - started
        fault_cluster.set_faults([])
    finally:
        producer.close()
    print(f"10 batches with a 40 ms fdatasync everywhere: {elapsed_s:.2f} s")
    # Every acknowledgement waited for at least one slow fdatasync on a majority.
    assert elapsed_s >= 10 * 0.04
    assert not history.failed, history.failed[:3]
    entries = consume_all(client, "sl_v", pchannel, expect=len(history.acked))
    _check_history(history, entries)
    assert len(entries) == 100
    assert _check_segment_files(cluster) >= 3
