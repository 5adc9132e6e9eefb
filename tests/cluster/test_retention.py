"""WAL and history retention on a real three-node cluster (issue 16, items 1 and 2).

One cluster with small segments (32 KiB), a 96 KiB per-pchannel size limit checked every
half second, a short event history and fault injection enabled. The checks run against
what was acknowledged (`History`) and against the files on every node's disk:

- a subscription that holds retention and never committed holds every segment; after it
  commits a position the floor stops there; without it, the floor moves on;
- every replica deletes the same segments (files and catalog rows): each node's first
  segment file starts exactly at the floor decided in Raft;
- below the floor, Consume, ReadSegment, a subscription seek and ListSegments as of an old
  revision answer COMPACTED with the first LSN still there; WatchEvents below the
  compacted history answers COMPACTED with the first revision; every acknowledged entry
  at or above the floor is still read back;
- a replica killed with SIGKILL while it deletes (a `wal.delete` delay holds it there)
  finishes the deletion after its restart;
- ClusterStatus reports the floor and each member's disk use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from raftwal.node.backup import read_backup, write_backup
from raftwal.node.config import render_config
from rpc.errors import from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from statemachine.state import state_digest
from tests.cluster.conftest import Api, converged, rid
from tests.cluster.wal_helpers import History, Producer, setup_channels, wait_assigned
from tests.timing import scaled
from wal_segments.segment import list_segment_files

pytestmark = pytest.mark.cluster
E = errors_pb2

SEGMENT_BYTES = 32 * 1024
RETENTION_BYTES = 96 * 1024


@dataclass
class RetentionCluster:
    cluster: dev.LocalCluster
    client: Api
    faults_file: Path

    def set_faults(self, rules: list[dict[str, object]]) -> None:
        temporary = self.faults_file.with_name("faults.json.tmp")
        temporary.write_text(json.dumps({"faults": rules}))
        os.replace(temporary, self.faults_file)
        time.sleep(0.3)  # nodes look at the file at most every 100 ms


@pytest.fixture(scope="module")
def retention_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetentionCluster]:
    directory: Path = tmp_path_factory.mktemp("retention")
    faults_file = directory / "faults.json"
    env = {
        **os.environ,
        "RAFTWAL_ENABLE_FAULTS": "1",
        "RAFTWAL_FAULTS_FILE": str(faults_file),
        "RAFTWAL_SEGMENT_MAX_BYTES": str(SEGMENT_BYTES),
        "RAFTWAL_WAL_RETENTION_BYTES": str(RETENTION_BYTES),
        "RAFTWAL_WAL_RETENTION_CHECK_MS": "500",
        "RAFTWAL_EVENT_RETENTION_REVISIONS": "50",
        "RAFTWAL_EVENT_RETENTION_CHECK_MS": "1000",
    }
    local = dev.up(directory, 3, timeout_s=60, env=env)
    client = Api(local.endpoints)
    try:
        yield RetentionCluster(local, client, faults_file)
    finally:
        client.close()
        local.stop_all()


def _produce(producer: Producer, vchannel: str, batches: int, history: History, tag: str) -> None:
    for index in range(batches):
        payloads = [b"%s-%04d-%02d-" % (tag.encode(), index, i) + b"x" * 400 for i in range(8)]
        assert producer.send(vchannel, payloads, history, budget_s=60), (tag, index)


def _retention(client: Api, pchannel: str) -> tuple[api.RetentionStatus, api.ClusterStatusResponse]:
    status = client.status()
    for row in status.retention:
        if row.pchannel == pchannel:
            return row, status
    raise AssertionError(f"no retention row for {pchannel}: {list(status.retention)}")


def _wait_committed_bytes(
    client: Api, pchannel: str, above: int, timeout_s: float = 60.0
) -> tuple[api.RetentionStatus, api.ClusterStatusResponse]:
    """The retention row once more than `above` bytes of `pchannel` are committed: sealed
    segments commit through Raft after the writes that filled them were acknowledged."""
    deadline = time.monotonic() + scaled(timeout_s)
    row, status = _retention(client, pchannel)
    while row.committed_bytes <= above and time.monotonic() < deadline:
        time.sleep(0.2)
        row, status = _retention(client, pchannel)
    assert row.committed_bytes > above, row
    return row, status


def _wait_floor(client: Api, pchannel: str, above: int, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + scaled(timeout_s)
    floor = 0
    while time.monotonic() < deadline:
        floor = _retention(client, pchannel)[0].deleted_before_lsn
        if floor > above:
            return floor
        time.sleep(0.3)
    raise AssertionError(f"{pchannel}: retention floor still {floor} after {timeout_s} s")


def _files(cluster: dev.LocalCluster, node_id: str, pchannel: str) -> list[int]:
    directory = cluster.node(node_id).data_dir / "wal" / pchannel
    return [first for first, _ in list_segment_files(directory)] if directory.exists() else []


def _catalog(cluster: dev.LocalCluster, node_id: str, pchannel: str) -> tuple[int, int]:
    """(lowest first_lsn of a catalog row, recorded retention floor) on `node_id`."""
    path = cluster.node(node_id).data_dir / "catalog.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=scaled(5)) as db:
        lowest = db.execute(
            "select min(first_lsn) from segments where pchannel = ?", [pchannel]
        ).fetchone()[0]
        floor = db.execute(
            "select deleted_before_lsn from retention where pchannel = ?", [pchannel]
        ).fetchone()
    return int(lowest or 0), int(floor[0]) if floor else 0


def _wait_rows_at_floor(
    cluster: dev.LocalCluster, node_id: str, pchannel: str, floor: int, timeout_s: float = 10
) -> int:
    """The lowest catalog row of `pchannel` on `node_id`, once none is below `floor` (the
    rows go right after the files, in the same worker) or the time is up."""
    deadline = time.monotonic() + scaled(timeout_s)
    lowest = _catalog(cluster, node_id, pchannel)[0]
    while 0 < lowest < floor and time.monotonic() < deadline:
        time.sleep(0.2)
        lowest = _catalog(cluster, node_id, pchannel)[0]
    return lowest


def _wait_files_at_floor(
    cluster: dev.LocalCluster, pchannel: str, floor: int, node_ids: list[str], timeout_s: float = 30
) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    seen: dict[str, list[int]] = {}
    while time.monotonic() < deadline:
        seen = {n: _files(cluster, n, pchannel)[:3] for n in node_ids}
        if all(firsts and firsts[0] >= floor for firsts in seen.values()):
            return
        time.sleep(0.3)
    raise AssertionError(f"{pchannel}: files below floor {floor} remain: {seen}")


def _code(call) -> tuple[int, int, str]:
    try:
        call()
    except grpc.RpcError as error:
        info = from_rpc_error(error)
        return info.code, info.first_available, info.message
    raise AssertionError("expected an error, the call succeeded")


def _consume_from(address: str, vchannel: str, lsn: int, expect: int) -> list[wire.WalEntry]:
    entries: list[wire.WalEntry] = []
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        request = wire.ConsumeRequest(
            vchannel=vchannel, policy=wire.DELIVER_POLICY_START_FROM, lsn=lsn
        )
        stream = stub.Consume(request, timeout=scaled(30))
        for response in stream:
            entries.extend(response.entries)
            if len(entries) >= expect:
                stream.cancel()
                break
    return entries


def test_retention_deletes_the_same_segments_everywhere_and_answers_compacted(
    retention_cluster: RetentionCluster,
) -> None:
    cluster, client = retention_cluster.cluster, retention_cluster.client
    (pchannel,) = setup_channels(client, "ret", {"ret_v": 0})
    owner, _, address = wait_assigned(client, pchannel)
    # A subscription from the earliest entry that holds retention and has not committed.
    client.call(
        "CreateSubscription",
        api.CreateSubscriptionRequest(request_id=rid(), name="holder", vchannels=["ret_v"]),
    )
    history = History()
    producer = Producer(client, pchannel, "ret-producer")
    _produce(producer, "ret_v", 120, history, "a")  # ~400 KiB: ~12 segments
    # A loaded host once read this with half of the sealed segments still to commit.
    row, before = _wait_committed_bytes(client, pchannel, 2 * RETENTION_BYTES)
    time.sleep(2.0)  # four retention rounds
    row, _ = _retention(client, pchannel)
    assert row.deleted_before_lsn == 0, f"the holder's entries were deleted: {row}"

    # It consumed up to the middle: the floor moves up to it, never past.
    middle = history.acked[len(history.acked) // 2].lsn
    client.call(
        "CommitSubscription",
        api.CommitSubscriptionRequest(
            request_id=rid(),
            name="holder",
            positions=[api.SubscriptionCommit(vchannel="ret_v", lsn=middle)],
        ),
    )
    floor = _wait_floor(client, pchannel, 0)
    time.sleep(1.5)
    floor = _retention(client, pchannel)[0].deleted_before_lsn
    assert 1 < floor <= middle + 1, (floor, middle)

    # Without it the size limit alone decides.
    client.call("DropSubscription", api.DropSubscriptionRequest(request_id=rid(), name="holder"))
    floor = _wait_floor(client, pchannel, floor)
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline:
        row, status = _retention(client, pchannel)
        if row.committed_bytes <= RETENTION_BYTES:
            break
        time.sleep(0.3)
    floor = row.deleted_before_lsn
    assert row.committed_bytes <= RETENTION_BYTES, row
    node_ids = [n.id for n in cluster.config.nodes]
    _wait_files_at_floor(cluster, pchannel, floor, node_ids)
    for node_id in node_ids:
        firsts = _files(cluster, node_id, pchannel)
        assert firsts[0] >= floor, (node_id, firsts, floor)
        lowest_row = _wait_rows_at_floor(cluster, node_id, pchannel, floor)
        assert lowest_row == 0 or lowest_row >= floor, (node_id, lowest_row, floor)
        recorded = _catalog(cluster, node_id, pchannel)[1]
        assert recorded >= floor or recorded == firsts[0], (node_id, recorded, floor)
    # Same files everywhere (segment boundaries are a function of the content).
    assert len({tuple(_files(cluster, n, pchannel)[:-1]) for n in node_ids}) <= 2
    # Status: every member reports its disk use for the pchannel and its first LSN.
    row, status = _retention(client, pchannel)
    for member in status.members:
        usage = {u.pchannel: u for u in member.wal_disk}
        assert pchannel in usage and usage[pchannel].bytes > 0, member.node_id
        assert usage[pchannel].first_lsn >= floor and member.data_dir_bytes > 0

    # Below the floor: COMPACTED with the first LSN still there.
    _, _, address = wait_assigned(client, pchannel)
    code, first, message = _code(lambda: _consume_from(address, "ret_v", 1, 1))
    assert code == E.COMPACTED and first >= floor, (code, first, message)
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        code, first, message = _code(
            lambda: list(
                stub.ReadSegment(
                    wire.ReadSegmentRequest(pchannel=pchannel, segment_id=1), timeout=scaled(10)
                )
            )
        )
    assert code == E.COMPACTED and first >= floor, (code, first, message)
    client.call(
        "CreateSubscription",
        api.CreateSubscriptionRequest(
            request_id=rid(), name="late", vchannels=["ret_v"], no_retention_hold=True
        ),
    )
    code, first, message = _code(
        lambda: client.call(
            "SeekSubscription",
            api.SeekSubscriptionRequest(
                request_id=rid(), name="late", vchannel="ret_v", target=api.SEEK_TARGET_LSN, lsn=2
            ),
        )
    )
    assert code == E.COMPACTED and first >= floor, (code, first, message)
    code, first, message = _code(
        lambda: client.call(
            "ListSegments",
            api.ListSegmentsRequest(pchannels=[pchannel], as_of_revision=before.revision),
        )
    )
    # (The deleted segments, or the history retention already passed that revision: both
    # say where to start instead.)
    assert code == E.COMPACTED and first > 0, (code, first, message)

    # Everything acknowledged at or above the floor is still there, in order.
    floor = _retention(client, pchannel)[0].deleted_before_lsn
    kept = [a for a in history.acked if a.lsn >= floor]
    read = _consume_from(address, "ret_v", floor, len(kept))
    assert [e.payload for e in read[: len(kept)]] == [a.payload for a in kept]
    converged(client)


def _watch_answer(stub, from_revision: int) -> tuple[int, int, str]:
    """(code, first_available, message) of a WatchEvents from `from_revision`; code 0 when
    the watch starts."""
    try:
        stream = stub.WatchEvents(
            api.WatchEventsRequest(from_revision=from_revision), timeout=scaled(5)
        )
        responses = iter(stream)
        next(responses)  # where the watch starts
        next(responses)  # its first events, or the error
        stream.cancel()
        return 0, 0, ""
    except grpc.RpcError as error:
        info = from_rpc_error(error)
        return info.code, info.first_available, info.message


def test_watch_events_below_the_compacted_history_answers_compacted(
    retention_cluster: RetentionCluster,
) -> None:
    client = retention_cluster.client
    # More than the 50 revisions kept: leases granted and revoked.
    for _ in range(40):
        lease = client.call("GrantLease", api.GrantLeaseRequest(request_id=rid(), ttl_ms=60_000))
        client.call(
            "RevokeLease", api.RevokeLeaseRequest(request_id=rid(), lease_id=lease.lease_id)
        )
    revision = client.status().revision
    assert revision > 80
    # Every node compacts its own events.db (every second here): ask each of them.
    deadline = time.monotonic() + scaled(30)
    answers: list[tuple[int, int, str]] = []
    while time.monotonic() < deadline:
        answers = [_watch_answer(client.stub(e), 1) for e in client.endpoints]
        if all(a[0] == E.COMPACTED for a in answers):
            break
        time.sleep(0.5)
    for code, first, message in answers:
        assert code == E.COMPACTED and 1 < first <= revision - 49, (code, first, message)
    # From a retained revision on, the watch delivers.
    for endpoint in client.endpoints:
        assert _watch_answer(client.stub(endpoint), revision - 10)[0] == 0


def test_a_replica_killed_mid_delete_finishes_the_deletion_after_restart(
    retention_cluster: RetentionCluster,
) -> None:
    cluster, client = retention_cluster.cluster, retention_cluster.client
    (pchannel,) = setup_channels(client, "kill", {"kill_v": 0})
    owner, _, _ = wait_assigned(client, pchannel)
    leader = client.status().leader_node_id
    victim = next(n.id for n in cluster.config.nodes if n.id not in (owner, leader))
    # The victim stops right before it unlinks each segment file of this pchannel.
    retention_cluster.set_faults(
        [
            {
                "point": "wal.delete",
                "action": "delay",
                "delay_ms": 60_000,
                "nodes": [victim],
                "match": f"/{pchannel}/",
            }
        ]
    )
    history = History()
    producer = Producer(client, pchannel, "kill-producer")
    _produce(producer, "kill_v", 80, history, "k")
    _wait_floor(client, pchannel, 0)
    # The victim recorded a floor and is stuck deleting below it: those files remain. On
    # a loaded host the floor may have moved on since (it rises in steps as segments
    # age): the victim, stuck in its first deletion, records no later one.
    deadline = time.monotonic() + scaled(30)
    recorded = 0
    while time.monotonic() < deadline:
        recorded = _catalog(cluster, victim, pchannel)[1]
        if recorded > 0:
            break
        time.sleep(0.2)
    assert recorded > 0, "the victim recorded no retention floor"
    cluster.kill(victim)
    left = _files(cluster, victim, pchannel)
    assert left[0] < recorded and left[1] <= recorded, (left, recorded)
    retention_cluster.set_faults([])
    cluster.start_node(victim)
    floor = _retention(client, pchannel)[0].deleted_before_lsn
    _wait_files_at_floor(cluster, pchannel, floor, [victim], timeout_s=60)
    lowest_row = _wait_rows_at_floor(cluster, victim, pchannel, floor)
    assert lowest_row == 0 or lowest_row >= floor, (lowest_row, floor)
    # The copies agree again, and everything acknowledged above the floor is readable.
    converged(client)
    _, _, address = wait_assigned(client, pchannel)
    floor = _retention(client, pchannel)[0].deleted_before_lsn
    kept = [a for a in history.acked if a.lsn >= floor]
    read = _consume_from(address, "kill_v", floor, len(kept))
    assert [e.payload for e in read[: len(kept)]] == [a.payload for a in kept]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", *args],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )


def _projection(state: pb.CoordinationState) -> bytes:
    """What a restore must carry over unchanged (nodes, leases and pchannel placement move
    on in the new cluster; apply metadata is the new cluster's)."""
    kept = pb.CoordinationState(next_vchannel_id=state.next_vchannel_id)
    for field in ("vchannels", "manifests", "subscriptions", "consumer_groups"):
        for key, value in getattr(state, field).items():
            getattr(kept, field)[key].CopyFrom(value)
    kept.balance_policy.CopyFrom(state.balance_policy)
    return kept.SerializeToString(deterministic=True)


def test_snapshot_save_then_restore_into_a_fresh_cluster(
    retention_cluster: RetentionCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    source, source_client = retention_cluster.cluster, retention_cluster.client
    # Something to carry over: a pchannel with committed segments, a vchannel, a
    # subscription with a position, a lease.
    (pchannel,) = setup_channels(source_client, "snap", {"snap_v": 0})
    _produce(Producer(source_client, pchannel, "snap-producer"), "snap_v", 20, History(), "s")
    source_client.call(
        "CreateSubscription",
        api.CreateSubscriptionRequest(request_id=rid(), name="snap_sub", vchannels=["snap_v"]),
    )
    source_client.call(
        "CommitSubscription",
        api.CommitSubscriptionRequest(
            request_id=rid(),
            name="snap_sub",
            positions=[api.SubscriptionCommit(vchannel="snap_v", lsn=5)],
        ),
    )
    source_client.call("GrantLease", api.GrantLeaseRequest(request_id=rid(), ttl_ms=600_000))
    directory = tmp_path_factory.mktemp("restored")
    saved_file = directory / "backup.snap"
    done = _cli("snapshot", "save", str(saved_file), "--endpoints", ",".join(source.endpoints))
    assert done.returncode == 0, done.stderr
    saved = read_backup(saved_file)
    assert saved_file.stat().st_mode & 0o777 == 0o600
    assert hashlib.sha256(saved.state).hexdigest() == saved.state_digest
    original = pb.CoordinationState.FromString(saved.state)
    assert original.vchannels and original.manifests
    # The digest is the replicas' state digest at that raft index.
    assert saved.state_digest == state_digest(original)
    for member in retention_cluster.client.status().members:
        if member.applied_index == original.last_raft_index:
            assert member.state_digest == saved.state_digest

    config = dev.make_config(directory / "cluster", 3)
    dirs = [str(node.data_dir) for node in config.nodes]
    done = _cli("snapshot", "restore", str(saved_file), *[f"--data-dir={d}" for d in dirs])
    assert done.returncode == 0, done.stderr
    # A data directory that already served a node is refused.
    refused = _cli("snapshot", "restore", str(saved_file), f"--data-dir={directory}")
    assert refused.returncode == 0 or "expected a new, empty data directory" in refused.stderr
    restored_cluster = dev.up(directory / "cluster", 3, timeout_s=60, config=config)
    client = Api(restored_cluster.endpoints)
    try:
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline and client.status().revision < saved.revision:
            time.sleep(0.3)
        status = client.status()
        assert status.revision >= saved.revision, (status.revision, saved.revision)
        assert any((Path(d) / "restore.snapshot.done").exists() for d in dirs)
        again = directory / "again.snap"
        done = _cli(
            "snapshot", "save", str(again), "--endpoints", ",".join(restored_cluster.endpoints)
        )
        assert done.returncode == 0, done.stderr
        restored = pb.CoordinationState.FromString(read_backup(again).state)
        assert restored.revision > original.revision
        assert _projection(restored) == _projection(original)
        assert set(restored.pchannels) == set(original.pchannels)
        for name, channel in original.pchannels.items():
            assert restored.pchannels[name].term >= channel.term
        # The restored cluster serves writes: ids that are revisions keep increasing, and a
        # new pchannel takes writes.
        lease = client.call("GrantLease", api.GrantLeaseRequest(request_id=rid(), ttl_ms=5000))
        assert lease.lease_id > saved.revision
        (fresh,) = setup_channels(client, "after", {"after_v": 0})
        history = History()
        producer = Producer(client, fresh, "after-producer")
        assert producer.send("after_v", [b"after-restore"], history, budget_s=60)
        converged(client)
        # The restored pchannel whose segments were not copied is not served: a new owner
        # with an empty log is refused (docs/operations.md, "Backup and restore"), and status says so.
        deadline = time.monotonic() + scaled(30)
        warnings: list[str] = []
        while time.monotonic() < deadline:
            warnings = list(client.status().warnings)
            if any(f"pchannel {pchannel} is ASSIGNING" in w for w in warnings):
                break
            time.sleep(0.5)
        assert any(f"pchannel {pchannel} is ASSIGNING" in w for w in warnings), warnings
    finally:
        client.close()
        restored_cluster.stop_all()


def _logged(directory: Path, *parts: str) -> bool:
    """A node log under `directory` has a line with every one of `parts`."""
    for log_file in directory.glob("*.log"):
        for line in log_file.read_text(errors="replace").splitlines():
            if all(part in line for part in parts):
                return True
    return False


def test_a_restored_cluster_never_reaches_into_the_cluster_it_was_saved_from(
    retention_cluster: RetentionCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A backup restored while its source still runs, into nodes with the same ids. The
    saved state holds the source's node addresses, and a saved node that the restored
    cluster has not registered yet keeps them. A backup taken while a pchannel's owner X
    recovered (ASSIGNING at term T) has the restored X recover at the same T, a term the
    source's replicas accept from X. Through a saved address, X would fence the source's
    replica Z and adopt its log (CI saw a restored pchannel commit the source's tail this
    way, and X would then append at T to a log that the source's owner also writes at T).

    Here Z never starts in the restored cluster and Y's data worker is paused, so X has no
    quorum of its own. Nothing signals that something did not happen: a window of 10 s
    (scaled) from X's recovery start shows no restored owner that became ready; then Y
    resumes and X's recovery stops as a restore without segment files must: its log ends
    below what earlier terms committed.
    Without the fix, X adopted the source's log and was serving within a second."""
    source_client = retention_cluster.client
    source = retention_cluster.cluster
    (pchannel,) = setup_channels(source_client, "iso", {"iso_v": 0})
    producer = Producer(source_client, pchannel, "iso-producer")
    history = History()
    _produce(producer, "iso_v", 12, history, "before")
    _wait_committed_bytes(source_client, pchannel, 0)
    directory = tmp_path_factory.mktemp("restored-iso")
    saved_file = directory / "backup.snap"
    done = _cli("snapshot", "save", str(saved_file), "--endpoints", ",".join(source.endpoints))
    assert done.returncode == 0, done.stderr
    saved = read_backup(saved_file)
    # The backup as if taken while the owner recovered: ASSIGNING at its term.
    state = pb.CoordinationState.FromString(saved.state)
    saved_channel = state.pchannels[pchannel]
    saved_channel.state = pb.PCHANNEL_STATE_ASSIGNING
    saved_channel.history[-1].start_lsn = 0
    data = state.SerializeToString(deterministic=True)
    saved = dataclasses.replace(saved, state=data, state_digest=hashlib.sha256(data).hexdigest())
    write_backup(saved_file, saved)
    owner, term = saved_channel.owner_node_id, saved_channel.term
    paused_id, missing_id = sorted({"n1", "n2", "n3"} - {owner})
    assert sorted(saved_channel.replica_node_ids) == ["n1", "n2", "n3"]
    assert state.nodes[missing_id].address  # the source's, in the backup
    committed = state.manifests[pchannel].committed_through_lsn
    assert committed > 0
    # The source writes on: its replicas hold entries the backup's manifest has not.
    _produce(producer, "iso_v", 2, history, "after")
    cluster_dir = directory / "cluster"
    config = dev.make_config(cluster_dir, 3)
    done = _cli(
        "snapshot",
        "restore",
        str(saved_file),
        *[f"--data-dir={node.data_dir}" for node in config.nodes],
    )
    assert done.returncode == 0, done.stderr
    secret = cluster_dir / dev.SECRET_FILE
    secret.touch(mode=0o600)
    secret.write_text(os.urandom(32).hex())
    (cluster_dir / dev.CONFIG_FILE).write_text(render_config(config, secret_file=dev.SECRET_FILE))
    restored = dev.LocalCluster(cluster_dir, config, {}, dict(os.environ))
    client = Api([restored.node(owner).grpc_address, restored.node(paused_id).grpc_address])
    paused_worker = 0
    try:
        restored.start_node(paused_id)
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline and not paused_worker:
            found = re.search(
                r"data worker 0 up \(pid (\d+)",
                (cluster_dir / f"{paused_id}.log").read_text(errors="replace"),
            )
            paused_worker = int(found.group(1)) if found else 0
            time.sleep(0.1)
        assert paused_worker, f"{paused_id}'s data worker did not start"
        os.kill(paused_worker, signal.SIGSTOP)
        restored.start_node(owner)
        started = f"{pchannel}: recovering as owner at term {term}"
        deadline = time.monotonic() + scaled(90)
        while time.monotonic() < deadline and not _logged(cluster_dir, started):
            time.sleep(0.2)
        assert _logged(cluster_dir, started), "the restored owner did not start its recovery"
        window_ends = time.monotonic() + scaled(10)
        while time.monotonic() < window_ends:
            _produce(producer, "iso_v", 1, history, "during")
            channel = next(c for c in client.status().pchannels if c.name == pchannel)
            assert channel.state != pb.PCHANNEL_STATE_ASSIGNED, channel
            time.sleep(0.5)
        os.kill(paused_worker, signal.SIGCONT)
        paused_worker = 0
        refused = (f"{pchannel}: recovery at term", "that earlier terms wrote and committed")
        deadline = time.monotonic() + scaled(90)
        while time.monotonic() < deadline and not _logged(cluster_dir, *refused):
            time.sleep(0.3)
        assert _logged(cluster_dir, *refused), "the restored owner's recovery did not end"
        status = client.status()
        row = next((r for r in status.retention if r.pchannel == pchannel), None)
        assert row is None or row.committed_through_lsn == committed, row
        # The saved node the restored cluster never registered keeps no source address.
        node = next(n for n in status.nodes if n.node_id == missing_id)
        assert node.address == node.raft_address == "" and list(node.worker_addresses) == []
        # The source was not disturbed: it takes writes on the same pchannel.
        _produce(producer, "iso_v", 2, history, "later")
    finally:
        if paused_worker:
            os.kill(paused_worker, signal.SIGCONT)
        client.close()
        restored.stop_all()
