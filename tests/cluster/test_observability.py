"""Observability on a real three-node cluster: each node's Prometheus endpoint, the warnings
of ClusterStatus and `raftwal status`, and JSON logs.

The metrics are checked against what the test did and against what the cluster reports
elsewhere (acknowledged batches, ListSegments, lease and lock counts); the warnings against
real faults: a SIGSTOPped replica that falls behind while its owner keeps writing, and a
node killed with SIGKILL. One cluster for the module (started with JSON logs, small
segments and a low replica-lag threshold); the kill comes last.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal import __version__
from raftwal.cli import dev
from raftwal.cli.main import JsonLogFormatter
from rpc.errors import from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from tests.cluster.conftest import Api, converged, running_cluster
from tests.cluster.wal_helpers import (
    History,
    Producer,
    list_segments,
    setup_channels,
    wait_assigned,
    wait_nodes_up,
)
from tests.timing import scaled, wait_for

pytestmark = pytest.mark.cluster
E = errors_pb2
EXCLUSIVE = pb.LOCK_MODE_EXCLUSIVE

LAG_WARN_ENTRIES = 200
NODE_TIMEOUT_MS = 2000
SEGMENT_MAX_BYTES = 64 * 1024
SCRAPE_TIMEOUT_S = scaled(5.0)
CLI_TIMEOUT_S = scaled(30.0)


@pytest.fixture(scope="module")
def obs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    directory: Path = tmp_path_factory.mktemp("observability")
    env = dict(os.environ)
    env["RAFTWAL_LOG_FORMAT"] = "json"
    env["RAFTWAL_SEGMENT_MAX_BYTES"] = str(SEGMENT_MAX_BYTES)
    env["RAFTWAL_REPLICA_LAG_WARN_ENTRIES"] = str(LAG_WARN_ENTRIES)
    env["RAFTWAL_NODE_TIMEOUT_MS"] = str(NODE_TIMEOUT_MS)
    with running_cluster(directory, env) as running:
        yield running


class Scrape:
    """One /metrics page, parsed: samples by name and labels."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                # A node's page merges its data workers' pages, whose samples carry a
                # `worker` label: a pchannel's series come from one worker only.
                labels = {k: v for k, v in sample.labels.items() if k != "worker"}
                key = (sample.name, frozenset(labels.items()))
                self.samples[key] = self.samples.get(key, 0.0) + sample.value

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def sum(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


def scrape(cluster: dev.LocalCluster, node_id: str) -> Scrape:
    port = cluster.node(node_id).metrics_port
    assert port > 0, f"node {node_id} has no metrics port"
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S
    ) as response:
        assert response.status == 200
        return Scrape(response.read().decode())


def node_ids(cluster: dev.LocalCluster) -> list[str]:
    return [n.id for n in cluster.config.nodes]


def status_at(client: Api, endpoint: str) -> api.ClusterStatusResponse:
    """ClusterStatus answered by `endpoint` (one call, bounded)."""
    return client.stub(endpoint).ClusterStatus(api.ClusterStatusRequest(), timeout=scaled(10))


def warnings_at(client: Api, endpoint: str) -> list[str] | None:
    """The warnings `endpoint` reports, None when it cannot answer right now."""
    try:
        return list(status_at(client, endpoint).warnings)
    except grpc.RpcError:
        return None


def run_status_cli(endpoints: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", "status", "--endpoints", ",".join(endpoints)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_raft_and_state_gauges_follow_what_happened(obs: tuple[dev.LocalCluster, Api]) -> None:
    cluster, client = obs
    ids = node_ids(cluster)
    pages = {n: scrape(cluster, n) for n in ids}
    for node_id, page in pages.items():
        assert page.get("raftwal_node_info", node_id=node_id, version=__version__) == 1

    def one_term() -> dict[str, Scrape] | None:
        now = {n: scrape(cluster, n) for n in ids}
        terms = {page.get("raftwal_raft_term") for page in now.values()}
        leaders = sum(page.get("raftwal_raft_is_leader") or 0 for page in now.values())
        return now if len(terms) == 1 and leaders == 1 else None

    pages = wait_for("one Raft term and one leader on every node", one_term, timeout_s=15)
    assert all((p.get("raftwal_raft_term") or 0) >= 1 for p in pages.values())
    commit_before = {n: p.get("raftwal_raft_commit_index") or 0 for n, p in pages.items()}
    proposed_before = sum(p.sum("raftwal_proposals_total", kind="lock") for p in pages.values())
    timed_before = sum(
        p.sum("raftwal_proposal_duration_seconds_count", kind="lock") for p in pages.values()
    )
    rejected_before = sum(
        p.sum("raftwal_proposal_rejections_total", kind="lock", code="RESOURCE_ACQUIRED")
        for p in pages.values()
    )

    first = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=60_000, holder="obs-a"))
    second = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=60_000, holder="obs-b"))
    client.call("Lock", api.LockRequest(key="obs-lock", mode=EXCLUSIVE, lease_id=first.lease_id))
    with pytest.raises(grpc.RpcError) as refused:
        client.call(
            "Lock", api.LockRequest(key="obs-lock", mode=EXCLUSIVE, lease_id=second.lease_id)
        )
    assert from_rpc_error(refused.value).code == E.RESOURCE_ACQUIRED

    def applied_everywhere() -> dict[str, Scrape] | None:
        now = {n: scrape(cluster, n) for n in ids}
        ok = all(
            page.get("raftwal_leases") == 2
            and page.get("raftwal_locks") == 1
            and (page.get("raftwal_raft_commit_index") or 0) > commit_before[n]
            and page.get("raftwal_raft_applied_index") == page.get("raftwal_raft_commit_index")
            for n, page in now.items()
        )
        return now if ok else None

    pages = wait_for("two leases and one lock on every node", applied_everywhere)
    assert all(p.get("raftwal_raft_apply_lag_entries") == 0 for p in pages.values())
    # Both Lock calls were proposed (by whichever node received them); the second was
    # rejected by the state machine, with its code.
    assert sum(p.sum("raftwal_proposals_total", kind="lock") for p in pages.values()) == (
        proposed_before + 2
    )
    assert (
        sum(
            p.sum("raftwal_proposal_rejections_total", kind="lock", code="RESOURCE_ACQUIRED")
            for p in pages.values()
        )
        == rejected_before + 1
    )
    # Both got an outcome (an acceptance, a rejection), each timed once.
    assert sum(
        p.sum("raftwal_proposal_duration_seconds_count", kind="lock") for p in pages.values()
    ) == (timed_before + 2)
    for page in pages.values():
        # Every member fsynced its journal for those entries, and timed every fsync.
        fsyncs = page.get("raftwal_raft_journal_fsync_seconds_count") or 0
        assert 0 < fsyncs <= (page.get("raftwal_raft_journal_syncs_total") or 0)
        assert page.get("raftwal_raft_journal_fsync_seconds_bucket", le="+Inf") == fsyncs
        assert (page.get("raftwal_raft_journal_fsync_seconds_sum") or 0) > 0
    status = converged(client)
    assert (status.leases, status.locks) == (2, 1)
    for page in pages.values():
        assert page.get("raftwal_nodes", state="UP") == 3
        assert page.get("raftwal_nodes", state="DOWN") == 0

    # The event store holds one event per revision (nothing compacted yet).
    def events_stored() -> bool:
        now = {n: scrape(cluster, n) for n in ids}
        return all(
            p.get("raftwal_event_store_events") == status.revision
            and p.get("raftwal_state_revision") == status.revision
            and (p.get("raftwal_event_store_bytes") or 0) > 0
            for p in now.values()
        )

    wait_for(f"{status.revision} events stored on every node", events_stored)

    client.call("RevokeLease", api.RevokeLeaseRequest(lease_id=first.lease_id))
    client.call("RevokeLease", api.RevokeLeaseRequest(lease_id=second.lease_id))
    wait_for(
        "no lease and no lock left on any node",
        lambda: all(
            (page := scrape(cluster, n)).get("raftwal_leases") == 0
            and page.get("raftwal_locks") == 0
            for n in ids
        ),
    )


def test_wal_metrics_match_acknowledged_batches_and_manifest(
    obs: tuple[dev.LocalCluster, Api],
) -> None:
    cluster, client = obs
    ids = node_ids(cluster)
    (pchannel,) = setup_channels(client, "obswal", {"obswal_v": 0})
    owner, term, _ = wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, "obs-producer")
    history = History()
    batches, per_batch, payload_bytes = 40, 50, 200
    try:
        acknowledged = sum(
            producer.send(
                "obswal_v",
                [f"{b:04d}-{m:04d}".encode().ljust(payload_bytes, b".") for m in range(per_batch)],
                history,
            )
            for b in range(batches)
        )
    finally:
        producer.close()
    assert acknowledged == batches, history.failed[:5]
    last_acked = max(a.lsn for a in history.acked)

    page = scrape(cluster, owner)
    labels = {"pchannel": pchannel}
    assert page.get("raftwal_wal_append_batches_total", **labels) == batches
    assert page.get("raftwal_wal_append_messages_total", **labels) == batches * per_batch
    assert page.get("raftwal_wal_append_latency_seconds_count", **labels) == batches
    assert (page.get("raftwal_wal_append_latency_seconds_sum", **labels) or 0) > 0
    assert (page.get("raftwal_wal_append_bytes_total", **labels) or 0) > (
        batches * per_batch * payload_bytes
    )
    assert page.get("raftwal_wal_owner_serving", **labels) == 1
    assert page.get("raftwal_wal_owner_term", **labels) == term
    assert (page.get("raftwal_wal_committed_lsn", **labels) or 0) >= last_acked
    for other in ids:
        if other != owner:
            # Only the owner writes, so only the owner counts.
            assert scrape(cluster, other).get("raftwal_wal_append_batches_total", **labels) is None

    # Writes stopped: every replica reports everything committed, lag 0.
    def replicas_caught_up() -> bool:
        now = scrape(cluster, owner)
        committed = now.get("raftwal_wal_committed_lsn", **labels)
        return all(
            now.get("raftwal_wal_replica_durable_lsn", pchannel=pchannel, replica=n) == committed
            and now.get("raftwal_wal_replica_lag_entries", pchannel=pchannel, replica=n) == 0
            for n in ids
        )

    wait_for("every replica durable at the committed LSN", replicas_caught_up)

    # The manifest gauges agree with ListSegments on every node once they applied it.
    def manifest_matches() -> tuple[int, int] | None:
        segments = list_segments(client, pchannel).segments
        count, size = len(segments), sum(s.bytes for s in segments)
        # ~400 KB written into 64 KiB segments: several are sealed, and committed a moment
        # later (the seal finishes in the background, then the owner proposes the commit).
        if count < 3:
            return None
        for node_id in ids:
            now = scrape(cluster, node_id)
            if (
                now.get("raftwal_segments_committed", **labels) != count
                or now.get("raftwal_segments_committed_bytes", **labels) != size
            ):
                return None
        return count, size

    count, size = wait_for("segment gauges equal to ListSegments on every node", manifest_matches)
    assert count >= 3 and size >= count * SEGMENT_MAX_BYTES // 2


def test_lagging_replica_is_flagged_and_clears(obs: tuple[dev.LocalCluster, Api]) -> None:
    cluster, client = obs
    (pchannel,) = setup_channels(client, "obslag", {"obslag_v": 0})
    owner, _, _ = wait_assigned(client, pchannel)
    # The owner node's control port (Coordinator), not its data worker's.
    owner_address = cluster.config.node(owner).grpc_address
    status = status_at(client, owner_address)
    channel = next(c for c in status.pchannels if c.name == pchannel)
    candidates = [n for n in channel.replica_node_ids if n not in (owner, status.leader_node_id)]
    assert candidates, (owner, status.leader_node_id, list(channel.replica_node_ids))
    victim = candidates[0]
    expected = f"replica {victim} of pchannel {pchannel} is lagging"
    assert not any(expected in w for w in status.warnings), list(status.warnings)
    producer = Producer(client, pchannel, "obs-lag")
    producer.owner_address = owner_address
    history = History()
    cluster.kill(victim, signal.SIGSTOP)
    try:
        # Twice the threshold, written while the victim cannot acknowledge anything: the
        # owner and the third replica still form a majority.
        for batch in range(4):
            payloads = [f"lag-{batch}-{m}".encode() for m in range(LAG_WARN_ENTRIES // 2)]
            assert producer.send("obslag_v", payloads, history, budget_s=15), history.failed[:3]
        status = status_at(client, owner_address)
        assert any(expected in w for w in status.warnings), list(status.warnings)
        lag = scrape(cluster, owner).get(
            "raftwal_wal_replica_lag_entries", pchannel=pchannel, replica=victim
        )
        assert lag is not None and lag >= 2 * LAG_WARN_ENTRIES
        cli = run_status_cli([owner_address])
        assert cli.returncode == 1, cli.stderr  # UNHEALTHY exits 1
        assert "UNHEALTHY" in cli.stdout and expected in cli.stdout, cli.stdout
    finally:
        cluster.kill(victim, signal.SIGCONT)
        producer.close()

    # Resumed, the replica catches up and the warning goes away.
    def cleared() -> bool:
        warnings = warnings_at(client, owner_address)
        return warnings is not None and not any(expected in w for w in warnings)

    wait_for("the lag warning to clear", cleared, timeout_s=30)
    assert (
        scrape(cluster, owner).get(
            "raftwal_wal_replica_lag_entries", pchannel=pchannel, replica=victim
        )
        == 0
    )


def test_node_logs_are_json_lines(obs: tuple[dev.LocalCluster, Api]) -> None:
    cluster, _ = obs
    for node in cluster.config.nodes:
        lines = (cluster.directory / f"{node.id}.log").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        assert records, f"{node.id}.log is empty"
        for record in records:
            assert {"ts", "level", "logger", "message"} <= record.keys(), record
            assert record["node_id"] == node.id, record
            assert datetime.fromisoformat(record["ts"]).tzinfo is not None
        messages = {(r["logger"], r["message"]) for r in records}
        assert (
            "raftwal.node.metrics",
            f"node {node.id} serving metrics on http://127.0.0.1:{node.metrics_port}/metrics",
        ) in messages
    # An exception travels as one string field of the same line.
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("raftwal.test").makeRecord(
            "raftwal.test", logging.ERROR, __file__, 0, "failed: %s", ("x",), sys.exc_info()
        )
    line = JsonLogFormatter("n9").format(record)
    parsed = json.loads(line)
    assert parsed["message"] == "failed: x" and parsed["node_id"] == "n9"
    assert "ValueError: boom" in parsed["exc_info"] and "\n" not in line


def test_killed_node_is_reported_down(obs: tuple[dev.LocalCluster, Api]) -> None:
    cluster, client = obs
    wait_nodes_up(client)  # the earlier SIGSTOP may have had a node marked DOWN for a while
    leader = wait_for("a leader", lambda: client.status().leader_node_id)
    # Prefer a pchannel owner: its replicas see their Append streams break and report it,
    # so it is marked DOWN early (the path that once flapped back UP).
    owners = sorted(
        {c.owner_node_id for c in client.status().pchannels if c.owner_node_id != leader}
    )
    victim = owners[0] if owners else next(n for n in node_ids(cluster) if n != leader)
    survivors = [n.grpc_address for n in cluster.config.nodes if n.id != victim]
    leader_address = cluster.node(leader).grpc_address
    started = time.monotonic()
    cluster.kill(victim)

    def reported_down() -> list[str] | None:
        warnings = warnings_at(client, leader_address)
        return warnings if warnings and f"node {victim} is DOWN" in warnings else None

    warnings = wait_for(f"node {victim} reported DOWN", reported_down)
    print(f"{victim} reported DOWN after {time.monotonic() - started:.1f} s")
    assert any(w.startswith(f"member {victim} ") and "unreachable" in w for w in warnings)
    # Marked DOWN early (its streams broke, so it was suspected), it stays DOWN: the last
    # heartbeat it sent before the kill must not register it again.
    until = started + NODE_TIMEOUT_MS / 1000 + 0.5
    checks = 0
    while time.monotonic() < until and checks < 200:
        checks += 1
        assert reported_down() is not None, f"node {victim} flapped back UP"
        time.sleep(0.1)
    wait_for(
        "the DOWN node counted by the leader's metrics",
        lambda: scrape(cluster, leader).get("raftwal_nodes", state="DOWN") == 1,
    )
    cli = run_status_cli(survivors)
    assert cli.returncode == 1, cli.stderr  # UNHEALTHY exits 1
    assert "UNHEALTHY" in cli.stdout and f"node {victim} is DOWN" in cli.stdout, cli.stdout
