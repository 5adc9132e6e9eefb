"""The coordination service as a real three-process cluster on 127.0.0.1.

Each test checks a history of what was acknowledged against what the cluster holds, and
ends by checking that the three replicas converged (same revision, same state digest).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2 as E
from tests.cluster.conftest import Api, converged, leader_id, rid
from tests.timing import scaled, wait_for

pytestmark = pytest.mark.cluster


def vchannel_names(client: Api, endpoint: str) -> set[str]:
    response = client.call(
        "ListChannels",
        api.ListChannelsRequest(consistency=api.CONSISTENCY_SERIALIZABLE),
        endpoint=endpoint,
    )
    return {v.name for v in response.vchannels}


def test_cluster_elects_a_leader_and_every_node_serves_writes(cluster, client):
    status = converged(client)
    assert status.leader_node_id in {"n1", "n2", "n3"}
    assert sum(m.is_leader for m in status.members) == 1
    assert {n.node_id for n in status.nodes if n.state == pb.NODE_STATE_UP} == {"n1", "n2", "n3"}
    created = client.call("CreateChannels", api.CreateChannelsRequest(prefix="basic", count=3))
    assert list(created.pchannels) == ["basic_0", "basic_1", "basic_2"]
    for index, endpoint in enumerate(cluster.endpoints):
        response = client.call(
            "CreateVChannel",
            api.CreateVChannelRequest(name=f"any-node-{index}", pchannel="basic_0"),
            endpoint=endpoint,
        )
        assert response.vchannel.name == f"any-node-{index}"
    # The balancer places the new pchannels and the owners report ready.
    deadline = time.monotonic() + scaled(15)
    while time.monotonic() < deadline:
        described = client.call(
            "DescribeChannels", api.DescribeChannelsRequest(pchannels=list(created.pchannels))
        )
        if all(p.state == pb.PCHANNEL_STATE_ASSIGNED for p in described.pchannels):
            break
        time.sleep(0.2)
    assert all(p.state == pb.PCHANNEL_STATE_ASSIGNED and p.term == 1 for p in described.pchannels)
    converged(client)
    for endpoint in cluster.endpoints:
        assert {"any-node-0", "any-node-1", "any-node-2"} <= vchannel_names(client, endpoint)


def test_duplicate_request_id_applies_once(cluster, client):
    request = api.CreateChannelsRequest(request_id=rid(), prefix="dedup", count=2)
    first = client.call("CreateChannels", request)
    second = client.call("CreateChannels", request, endpoint=cluster.endpoints[2])
    assert list(first.pchannels) == list(second.pchannels) == ["dedup_0", "dedup_1"]
    assert second.revision == first.revision
    listed = client.call("ListChannels", api.ListChannelsRequest())
    assert sum(p.name.startswith("dedup_") for p in listed.pchannels) == 2
    converged(client)


def test_exclusive_lock_is_never_held_twice(cluster, client):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    history: list[tuple[str, float, float, int]] = []  # (client, acquired, released, token)
    errors: list[str] = []

    def contender(name: str, endpoint: str, rounds: int, hold_s: float) -> None:
        lease = client.call(
            "GrantLease", api.GrantLeaseRequest(ttl_ms=10_000, holder=name), endpoint=endpoint
        )
        for _ in range(rounds):
            try:
                locked = client.call(
                    "Lock",
                    api.LockRequest(
                        request_id=rid(),
                        key="contended",
                        mode=pb.LOCK_MODE_EXCLUSIVE,
                        lease_id=lease.lease_id,
                        wait_timeout_ms=10_000,
                    ),
                    endpoint=endpoint,
                )
                acquired = time.monotonic()
                time.sleep(hold_s)
                released = time.monotonic()
                client.call(
                    "Unlock",
                    api.UnlockRequest(key="contended", lease_id=lease.lease_id),
                    endpoint=endpoint,
                )
                history.append((name, acquired, released, locked.fencing_token))
            except grpc.RpcError as error:
                errors.append(f"{name}: {from_rpc_error(error)}")
                return

    threads = [
        threading.Thread(
            target=contender, args=(f"c{k}", cluster.endpoints[k % 3], 15, rng.uniform(0, 0.01))
        )
        for k in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=scaled(120))
    assert not errors, (seed, errors)
    assert len(history) == 45, seed
    history.sort(key=lambda h: h[1])
    for before, after in zip(history, history[1:], strict=False):
        # The client-side hold [acquired, released] is inside the true hold, so overlapping
        # client intervals would prove two simultaneous holders.
        assert before[2] <= after[1], f"seed {seed}: overlapping holds {before} {after}"
        assert before[3] < after[3], f"seed {seed}: fencing tokens not increasing {before} {after}"
    converged(client)


def test_expired_lease_releases_its_locks(cluster, client):
    short = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=1500, holder="crashes"))
    first = client.call(
        "Lock",
        api.LockRequest(key="lease-test", mode=pb.LOCK_MODE_EXCLUSIVE, lease_id=short.lease_id),
    )
    other = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=30_000, holder="waits"))
    with pytest.raises(grpc.RpcError) as raised:
        client.call(
            "Lock",
            api.LockRequest(key="lease-test", mode=pb.LOCK_MODE_SHARED, lease_id=other.lease_id),
        )
    assert from_rpc_error(raised.value).code == E.RESOURCE_ACQUIRED
    # No keep-alives: the leader expires the lease and the waiter gets the key.
    started = time.monotonic()
    second = client.call(
        "Lock",
        api.LockRequest(
            key="lease-test",
            mode=pb.LOCK_MODE_EXCLUSIVE,
            lease_id=other.lease_id,
            wait_timeout_ms=10_000,
        ),
        timeout_s=20,
    )
    waited = time.monotonic() - started
    assert second.fencing_token > first.fencing_token
    assert 0.3 < waited < 8, waited
    with pytest.raises(grpc.RpcError) as raised:
        replies = client.stub(client.endpoints[0]).KeepAlive(
            iter([api.KeepAliveRequest(lease_id=short.lease_id)]), timeout=scaled(5)
        )
        list(replies)
    assert from_rpc_error(raised.value).code == E.NOT_FOUND
    converged(client)


def test_bad_input_gets_invalid_argument_and_the_node_stays_healthy(cluster, client):
    endpoint = cluster.endpoints[0]
    bad_requests = [
        ("CreateChannels", api.CreateChannelsRequest(names=[""])),
        ("CreateChannels", api.CreateChannelsRequest(names=["x" * 129])),
        ("CreateChannels", api.CreateChannelsRequest(names=["has space"])),
        ("CreateChannels", api.CreateChannelsRequest(names=["üñí"])),
        ("CreateChannels", api.CreateChannelsRequest(prefix="p", count=-1)),
        ("CreateChannels", api.CreateChannelsRequest(request_id="r" * 500, prefix="p", count=1)),
        ("CreateVChannel", api.CreateVChannelRequest(name="v", pchannel="")),
        ("GrantLease", api.GrantLeaseRequest(ttl_ms=-5)),
        ("GrantLease", api.GrantLeaseRequest(ttl_ms=0)),
        ("Lock", api.LockRequest(key="k", mode=7, lease_id=1)),
        ("Lock", api.LockRequest(key="k", mode=1, lease_id=1, wait_timeout_ms=-1)),
        ("DescribeChannels", api.DescribeChannelsRequest(consistency=9)),
        ("DropChannels", api.DropChannelsRequest(pchannels=[f"p{k}" for k in range(1_000_000)])),
        (
            "Broadcast",
            api.BroadcastRequest(
                vchannels=["v"],
                resource_keys=[pb.ResourceKey(key=f"k{k}", mode=1) for k in range(100_000)],
            ),
        ),
        ("Broadcast", api.BroadcastRequest(message=b"x" * (2 << 20), vchannels=["v"])),
        ("WaitResourceKey", api.WaitResourceKeyRequest(key="", timeout_ms=1)),
        ("SetBalancePolicy", api.SetBalancePolicyRequest(max_moves_per_round=-3)),
    ]
    for method, request in bad_requests:
        with pytest.raises(grpc.RpcError) as raised:
            client.call(method, request, endpoint=endpoint)
        info = from_rpc_error(raised.value)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, info)
        assert info.code == E.INVALID_ARGUMENT and info.message, (method, info)
    with pytest.raises(grpc.RpcError) as raised:
        stream = client.stub(endpoint).WatchEvents(
            api.WatchEventsRequest(kinds=["no_such_event"]), timeout=scaled(5)
        )
        next(iter(stream))
    assert from_rpc_error(raised.value).code == E.INVALID_ARGUMENT
    health = health_pb2_grpc.HealthStub(client.channels[endpoint])
    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=scaled(5))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    client.call("CreateVChannel", api.CreateVChannelRequest(name="after-bad", pchannel="basic_0"))
    converged(client)


def test_kill_leader_during_writes_loses_nothing_acknowledged(cluster, client):
    seed = random.randrange(1 << 30)
    acked: list[str] = []
    stop = threading.Event()
    failures: list[str] = []

    def writer() -> None:
        serial = 0
        while not stop.is_set() and serial < 5000:
            serial += 1
            name = f"kl-{seed}-{serial}"
            request = api.CreateVChannelRequest(request_id=rid(), name=name, pchannel="basic_1")
            try:
                # The same request id on every retry: an unknown outcome never applies twice.
                client.call("CreateVChannel", request, timeout_s=20)
                acked.append(name)
            except grpc.RpcError as error:
                info = from_rpc_error(error)
                if info.code == E.ALREADY_EXISTS:
                    acked.append(name)  # a retry whose first attempt had applied
                else:
                    failures.append(f"{name}: {info}")

    thread = threading.Thread(target=writer)
    thread.start()
    wait_for("writes before the kill", lambda: len(acked) >= 10 or failures, timeout_s=30)
    victim = leader_id(client)
    before_kill = len(acked)
    cluster.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    while len(acked) <= before_kill + 1 and time.monotonic() - killed_at < scaled(20):
        time.sleep(0.01)
    recovered_after = time.monotonic() - killed_at
    if len(acked) > before_kill + 1:
        recovered = len(acked)
        wait_for("writes under the new leader", lambda: len(acked) >= recovered + 10, timeout_s=30)
    stop.set()
    thread.join(timeout=scaled(60))
    assert not failures, (seed, failures[:3])
    assert len(acked) > before_kill + 1, f"seed {seed}: no write after the leader was killed"
    assert recovered_after < scaled(10), recovered_after
    survivors = [
        e for n, e in zip(("n1", "n2", "n3"), cluster.endpoints, strict=True) if n != victim
    ]
    converged(client, expect_members=2)
    for endpoint in survivors:
        missing = set(acked) - vchannel_names(client, endpoint)
        assert not missing, f"seed {seed}: {len(missing)} acknowledged writes missing on {endpoint}"
    cluster.start_node(victim)
    status = converged(client, expect_members=3, timeout_s=30)
    victim_endpoint = cluster.node(victim).grpc_address
    assert not set(acked) - vchannel_names(client, victim_endpoint), seed
    assert len({m.state_digest for m in status.members}) == 1


@pytest.mark.parametrize("crash_point", ["snapshot_tmp_written", "snapshot_renamed"])
def test_crash_mid_snapshot_then_full_restart_keeps_everything(tmp_path, crash_point):
    # Every node snapshots after 40 entries and kills itself (SIGKILL, at a deterministic
    # point of the snapshot write) when it gets there. Then the whole cluster is restarted
    # without the crash point: it must start, keep every acknowledged write, and serve the
    # complete history from revision 1, identically before and after a second full kill.
    env = dict(os.environ, RAFTWAL_RAFT_SNAPSHOT_ENTRIES="40", RAFTWAL_RAFT_CRASH_AT=crash_point)
    local = dev.up(tmp_path / "restart", 3, timeout_s=60, env=env)
    client = Api(local.endpoints)
    acked: list[str] = []
    try:
        client.call("CreateChannels", api.CreateChannelsRequest(prefix="h", count=1))
        for k in range(200):
            try:
                client.call(
                    "CreateVChannel",
                    api.CreateVChannelRequest(request_id=rid(), name=f"h{k}", pchannel="h_0"),
                    timeout_s=3,
                )
                acked.append(f"h{k}")
            except grpc.RpcError:
                break
        deadline = time.monotonic() + scaled(20)
        while time.monotonic() < deadline and not any(
            p is not None and p.poll() is not None for p in local.processes.values()
        ):
            time.sleep(0.1)
        crashed = [n for n, p in local.processes.items() if p is not None and p.poll() == -9]
        assert crashed, f"no node died at {crash_point}"
        for node_id in ("n1", "n2", "n3"):
            local.kill(node_id, signal.SIGKILL)
        local.env = {k: v for k, v in env.items() if k != "RAFTWAL_RAFT_CRASH_AT"}
        for node_id in ("n1", "n2", "n3"):
            local.start_node(node_id)
        status = converged(client, timeout_s=40)
        for endpoint in local.endpoints:
            assert set(acked) <= vchannel_names(client, endpoint), (crash_point, endpoint)
        before = collect_history(client, status.revision)
        assert [e.revision for e in before] == list(range(1, status.revision + 1))
        for node_id in ("n1", "n2", "n3"):
            local.kill(node_id, signal.SIGKILL)
        for node_id in ("n1", "n2", "n3"):
            local.start_node(node_id)
        converged(client, timeout_s=40)
        for endpoint in local.endpoints:
            after = collect_history(client, status.revision, endpoint)
            assert [e.SerializeToString(deterministic=True) for e in after] == [
                e.SerializeToString(deterministic=True) for e in before
            ], endpoint
    finally:
        client.close()
        local.stop_all()


def collect_history(client: Api, up_to: int, endpoint: str | None = None) -> list[pb.Event]:
    """Events 1..up_to from WatchEvents on `endpoint`; a node still backfilling history
    (after a snapshot install) answers COMPACTED for a while: retry, bounded."""
    deadline = time.monotonic() + scaled(30)
    while True:
        events: list[pb.Event] = []
        # wait_for_ready: the channel may still be backing off from the node's restart.
        stream = client.stub(endpoint or client.endpoints[0]).WatchEvents(
            api.WatchEventsRequest(from_revision=1), timeout=scaled(20), wait_for_ready=True
        )
        try:
            for batch in stream:
                events.extend(batch.events)
                if events and events[-1].revision >= up_to:
                    stream.cancel()
                    break
            return [e for e in events if e.revision <= up_to]
        except grpc.RpcError as error:
            if from_rpc_error(error).code != E.COMPACTED or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
