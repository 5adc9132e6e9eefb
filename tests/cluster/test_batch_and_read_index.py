"""Batched coordination writes and ReadIndex reads on a real 3-node cluster.

One cluster whose Raft and node-to-node gRPC links run through the chaos proxies
(``raftwal.chaos.net.ProxyNet``), so that the last test can cut the leader off. Client
ports are direct.

- ``Coordinator.BatchWrite``: per-op results and errors in order, a later op seeing an
  earlier one's effect, bad ops refused alone, a retried batch answered from the
  deduplication window op by op, the same through a follower (``Cluster.ProposeBatch``).
- The SDK coalesces concurrent writes of one client into BatchWrite calls, each caller
  with its own outcome (checked against what each caller was told).
- Linearizable reads (ReadIndex) through the leader and a follower see every write
  acknowledged before them, and append nothing to the Raft log.
- A follower cut off from the leader alone cannot depose it: the other follower, which
  still hears from the leader, ignores its RequestVotes (the vote guard the leader's lease
  relies on), and writes and linearizable reads go on at the same leader and term.
- A leader cut off from the others (it still believes it leads: its step-down timeout is
  raised to 15 s here) serves no linearizable read once the majority side has elected a
  new leader and acknowledged a write (its lease ran out before they could elect one);
  serializable reads there show the stale state, which is what a "leader reads locally"
  shortcut without a lease would have answered.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from raftwal.chaos.net import ProxyNet
from raftwal.cli import dev
from rpc.client import CoordinatorClient
from rpc.errors import ResourceAcquiredError, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2 as E
from tests.cluster.conftest import Api, converged, leader_id, rid
from tests.timing import scaled

pytestmark = pytest.mark.cluster

LINEARIZABLE = api.CONSISTENCY_LINEARIZABLE
SERIALIZABLE = api.CONSISTENCY_SERIALIZABLE


class ProxiedCluster:
    def __init__(self, local: dev.LocalCluster, net: ProxyNet) -> None:
        self.local = local
        self.net = net
        self.endpoints = local.endpoints
        self.by_id = {node.id: node.grpc_address for node in local.config.nodes}


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxiedCluster]:
    directory: Path = tmp_path_factory.mktemp("readindex")
    config = dev.make_config(directory, 3)
    net = ProxyNet(config.nodes)
    net.start()
    try:
        config = replace(config, nodes=net.configure(config.nodes))
        env = {**os.environ, "RAFTWAL_RAFT_LEADER_FALLBACK_MS": "15000"}
        local = dev.up(directory, 3, timeout_s=60, env=env, config=config)
        try:
            yield ProxiedCluster(local, net)
        finally:
            local.stop_all()
    finally:
        net.close()


@pytest.fixture(scope="module")
def client(proxied: ProxiedCluster) -> Iterator[Api]:
    api_client = Api(proxied.endpoints)
    try:
        yield api_client
    finally:
        api_client.close()


def _lease(client: Api) -> int:
    return client.call(
        "GrantLease", api.GrantLeaseRequest(request_id=rid(), ttl_ms=60_000)
    ).lease_id


def _lock(key: str, lease: int, request_id: str, wait_ms: int = 0) -> api.BatchWriteOp:
    return api.BatchWriteOp(
        lock=api.LockRequest(
            request_id=request_id,
            key=key,
            lease_id=lease,
            wait_timeout_ms=wait_ms,
            mode=pb.LOCK_MODE_EXCLUSIVE,
        )
    )


def _unlock(key: str, lease: int, request_id: str) -> api.BatchWriteOp:
    return api.BatchWriteOp(
        unlock=api.UnlockRequest(request_id=request_id, key=key, lease_id=lease)
    )


def _codes(response: api.BatchWriteResponse) -> list[int]:
    return [result.error.code for result in response.results]


def test_batch_write_results_errors_order_and_dedup(client: Api, proxied: ProxiedCluster) -> None:
    a, b = _lease(client), _lease(client)
    key = f"batch-{rid()}"
    ids = [rid() for _ in range(7)]
    request = api.BatchWriteRequest(
        ops=[
            _lock(key, a, ids[0]),  # granted
            _lock(key, b, ids[1]),  # held by a: RESOURCE_ACQUIRED
            _unlock(key, a, ids[2]),  # released
            _lock(key, b, ids[3]),  # granted now, with a larger token
            api.BatchWriteOp(),  # empty: INVALID_ARGUMENT, not proposed
            _lock(f"{key}-w", a, ids[5], wait_ms=100),  # waits are not batched
            _lock(f"{key}-x", 987_654_321, ids[6]),  # no such lease: the state machine's no
        ]
    )
    leader = proxied.by_id[leader_id(client)]
    first = client.call("BatchWrite", request, endpoint=leader)
    codes = _codes(first)
    assert codes[:6] == [
        E.OK,
        E.RESOURCE_ACQUIRED,
        E.OK,
        E.OK,
        E.INVALID_ARGUMENT,
        E.INVALID_ARGUMENT,
    ]
    assert codes[6] != E.OK
    assert "expected one of" in first.results[4].error.message
    assert "wait_timeout_ms" in first.results[5].error.message
    granted_a, released, granted_b = first.results[0], first.results[2], first.results[3]
    assert granted_a.lock.key == key and granted_a.lock.fencing_token > 0
    assert granted_b.lock.fencing_token > granted_a.lock.fencing_token
    # Applied in order: each accepted op's revision is above the previous one's.
    assert granted_a.lock.revision < released.unlock.revision < granted_b.lock.revision
    # b holds the key now: a's attempt is refused.
    with pytest.raises(grpc.RpcError) as refused:
        client.call(
            "Lock",
            api.LockRequest(request_id=rid(), key=key, lease_id=a, mode=pb.LOCK_MODE_EXCLUSIVE),
        )
    assert from_rpc_error(refused.value).code == E.RESOURCE_ACQUIRED

    # The same batch again, through a follower (forwarded whole with ProposeBatch): every
    # op with a request id is answered from the deduplication window, nothing re-applied.
    follower = next(e for e in proxied.endpoints if e != leader)
    again = client.call("BatchWrite", request, endpoint=follower)
    assert _codes(again) == codes
    assert again.results[0].lock.fencing_token == granted_a.lock.fencing_token
    assert again.results[0].lock.revision == granted_a.lock.revision
    assert again.results[3].lock.fencing_token == granted_b.lock.fencing_token
    assert again.results[2].unlock.revision == released.unlock.revision

    # A fresh batch through the follower: a, then b each take their own key.
    fresh = client.call(
        "BatchWrite",
        api.BatchWriteRequest(ops=[_lock(f"{key}-1", a, rid()), _lock(f"{key}-2", b, rid())]),
        endpoint=follower,
    )
    assert _codes(fresh) == [E.OK, E.OK]
    assert fresh.results[0].lock.revision < fresh.results[1].lock.revision


@pytest.mark.parametrize("ops", [0, 1025])
def test_batch_write_refuses_bad_sizes(client: Api, ops: int) -> None:
    request = api.BatchWriteRequest(ops=[_unlock("k", 1, rid()) for _ in range(ops)])
    with pytest.raises(grpc.RpcError) as error:
        client.call("BatchWrite", request)
    info = from_rpc_error(error.value)
    assert info.code == E.INVALID_ARGUMENT
    assert f"({ops}; expected 1..1024)" in info.message


def test_sdk_coalesces_concurrent_writes_with_own_outcomes(proxied: ProxiedCluster) -> None:
    async def scenario() -> None:
        async with CoordinatorClient(proxied.endpoints, timeout_s=30.0) as sdk:
            leases = [(await sdk.grant_lease(60_000)).lease_id for _ in range(8)]
            tag = rid()
            rounds = 5

            async def own_key(n: int) -> list[int]:
                tokens = []
                for _ in range(rounds):
                    key = f"own-{tag}-{n}"
                    locked = await sdk.lock(key, leases[n % len(leases)])
                    assert locked.key == key
                    tokens.append(locked.fencing_token)
                    await sdk.unlock(key, leases[n % len(leases)])
                return tokens

            batches_before = sdk.write_batches
            results = await asyncio.gather(*(own_key(n) for n in range(64)))
            for tokens in results:
                assert tokens == sorted(tokens) and len(set(tokens)) == rounds
            batches, ops = (
                sdk.write_batches[0] - batches_before[0],
                sdk.write_batches[1] - batches_before[1],
            )
            # 640 writes from 64 concurrent callers: most went out in shared calls.
            assert batches > 0 and ops > 2 * batches, (batches, ops)

            # Contention inside batches: one winner per key, every other caller gets its
            # own RESOURCE_ACQUIRED, and the winner is the one the cluster reports.
            contested = f"contested-{tag}"
            outcomes = await asyncio.gather(
                *(sdk.lock(contested, lease) for lease in leases), return_exceptions=True
            )
            winners = [o for o in outcomes if isinstance(o, api.LockResponse)]
            losers = [o for o in outcomes if isinstance(o, ResourceAcquiredError)]
            assert len(winners) == 1 and len(losers) == len(leases) - 1, outcomes
            winner_lease = leases[outcomes.index(winners[0])]
            for lease in leases:
                if lease != winner_lease:
                    with pytest.raises(ResourceAcquiredError):
                        await sdk.lock(contested, lease)
            await sdk.unlock(contested, winner_lease)

    asyncio.run(scenario())


def _locked_revision(client: Api, key: str, lease: int, endpoint: str) -> int:
    """Lock `key` for `lease` through `endpoint`; the revision of the write."""
    return client.call(
        "Lock",
        api.LockRequest(request_id=rid(), key=key, lease_id=lease, mode=pb.LOCK_MODE_EXCLUSIVE),
        endpoint=endpoint,
    ).revision


def _read_revision(client: Api, endpoint: str) -> int:
    return client.call(
        "ListChannels", api.ListChannelsRequest(consistency=LINEARIZABLE), endpoint=endpoint
    ).revision


def test_linearizable_reads_see_acknowledged_writes_without_log_entries(
    client: Api, proxied: ProxiedCluster
) -> None:
    lease = _lease(client)
    leader = proxied.by_id[leader_id(client)]
    for n in range(30):
        # Each write acknowledged by the leader, then read linearizably at every node.
        written = _locked_revision(client, f"ri-{n}", lease, leader)
        for endpoint in proxied.endpoints:
            assert _read_revision(client, endpoint) >= written, (n, endpoint)
    # Reads add no Raft entries (a Barrier per read did): the commit index of a quiet
    # cluster stays where it is across 100 linearizable reads at every node.
    before = client.status(endpoint=leader)
    commit_before = max(m.commit_index for m in before.members)
    for _ in range(34):
        for endpoint in proxied.endpoints:
            _read_revision(client, endpoint)
    after = client.status(endpoint=leader)
    commit_after = max(m.commit_index for m in after.members)
    # A little slack for the coordinator loop's own proposals during the reads.
    assert commit_after - commit_before < 10, (commit_before, commit_after)


def _leader_term(client: Api, endpoint: str) -> tuple[str, int]:
    """(leader id, its Raft term) as `endpoint` sees them (serializable: no Raft round)."""
    status = client.call(
        "ClusterStatus",
        api.ClusterStatusRequest(consistency=SERIALIZABLE),
        endpoint=endpoint,
        timeout_s=5,
    )
    terms = [m.raft_term for m in status.members if m.node_id == status.leader_node_id]
    return status.leader_node_id, terms[0] if terms else -1


def test_a_follower_cut_off_from_the_leader_alone_cannot_depose_it(
    client: Api, proxied: ProxiedCluster
) -> None:
    """The vote guard (Raft thesis 4.2.3), which the leader's lease relies on: the cut-off
    follower times out and calls elections, and the other follower, which hears from the
    leader, ignores them. Without the guard it votes, the leadership moves and the term
    goes up (the leader hears of the new term through that follower)."""
    converged(client)
    leader = leader_id(client)
    endpoint = proxied.by_id[leader]
    cut_off, other = (node_id for node_id in proxied.by_id if node_id != leader)
    other_endpoint = proxied.by_id[other]
    before = _leader_term(client, endpoint)
    assert before[0] == leader
    lease = _lease(client)
    proxied.net.cut(leader, cut_off, "drop")
    try:
        # Several maximum election timeouts (1.2 s each) of elections by the cut-off node.
        deadline = time.monotonic() + 6.0
        n = 0
        while time.monotonic() < deadline:
            # The other follower still follows the same leader in the same term (the
            # cut-off one's view is not asked: it calls elections nobody answers).
            assert _leader_term(client, other_endpoint) == before, (before, n)
            assert _leader_term(client, endpoint) == before, (before, n)
            # Writes commit (leader and the other follower) and reads see them.
            written = _locked_revision(client, f"guard-{n}", lease, endpoint)
            assert _read_revision(client, endpoint) >= written
            n += 1
            time.sleep(0.1)
        assert _leader_term(client, other_endpoint) == before
    finally:
        proxied.net.heal_all()
    # Healed: the cut-off node's higher term may still cost one election; it converges.
    converged(client, timeout_s=60)


def test_deposed_leader_serves_no_stale_linearizable_read(
    client: Api, proxied: ProxiedCluster
) -> None:
    converged(client)
    old_id = leader_id(client)
    old = proxied.by_id[old_id]
    others = [node_id for node_id in proxied.by_id if node_id != old_id]
    other_endpoints = [proxied.by_id[node_id] for node_id in others]
    before = _read_revision(client, old)

    for node_id in others:
        proxied.net.cut(old_id, node_id, "drop")
    cut_at = time.monotonic()
    try:
        majority = Api(other_endpoints)
        try:
            # The majority side elects a new leader and acknowledges a write.
            deadline = time.monotonic() + scaled(30)
            new_id = ""
            while time.monotonic() < deadline:
                status = majority.call(
                    "ClusterStatus",
                    api.ClusterStatusRequest(consistency=SERIALIZABLE),
                    endpoint=other_endpoints[0],
                    timeout_s=5,
                )
                if status.leader_node_id and status.leader_node_id != old_id:
                    new_id = status.leader_node_id
                    break
                time.sleep(0.05)
            assert new_id, "the majority side elected no leader"
            print(f"new leader {new_id} after {time.monotonic() - cut_at:.2f} s")
            written = majority.call(
                "GrantLease",
                api.GrantLeaseRequest(request_id=rid(), ttl_ms=60_000),
                endpoint=proxied.by_id[new_id],
            ).revision
            assert written > before
            print(f"write acknowledged after {time.monotonic() - cut_at:.2f} s")

            # The old leader still believes it leads (step-down after 15 s here), and its
            # applied state is stale: exactly the read a local shortcut would serve.
            stale = client.call(
                "ClusterStatus",
                api.ClusterStatusRequest(consistency=SERIALIZABLE),
                endpoint=old,
                timeout_s=3,
            )
            assert stale.leader_node_id == old_id
            print(f"stale status after {time.monotonic() - cut_at:.2f} s")
            assert stale.revision < written

            # Linearizable reads started after the acknowledgement, at the old leader.
            answers: list[int] = []
            refusals: list[int] = []

            def read_once() -> None:
                stub = client.stub(old)
                try:
                    answers.append(
                        stub.ListChannels(
                            api.ListChannelsRequest(consistency=LINEARIZABLE), timeout=scaled(10)
                        ).revision
                    )
                except grpc.RpcError as error:
                    refusals.append(from_rpc_error(error).code)

            readers = [threading.Thread(target=read_once) for _ in range(4)]
            for reader in readers:
                reader.start()
            # Started while the old leader still believes it leads (it steps down 15 s
            # after the cut); otherwise this run proves nothing.
            assert time.monotonic() - cut_at < 13, "too slow to test the window"
            for reader in readers:
                reader.join(15)
            stale_answers = [revision for revision in answers if revision < written]
            assert not stale_answers, (written, answers)
            assert len(refusals) == len(readers), (answers, refusals)
        finally:
            majority.close()
    finally:
        proxied.net.heal_all()
    # Healed: the old leader rejoins, and its linearizable reads see the write.
    converged(client, timeout_s=60)
    assert _read_revision(client, old) >= written
