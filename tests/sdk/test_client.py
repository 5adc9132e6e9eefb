"""The asyncio SDK against fake nodes on real gRPC servers: leader hints, failover, request
ids reused across retries, bounded retries, typed errors, resumable streams, lease keeper."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest

from rpc.client import (
    CompactedError,
    CoordinatorClient,
    InvalidArgumentError,
    NotFoundError,
    NotLeaderError,
    OnShutdownError,
    ResourceAcquiredError,
    UnavailableError,
    UnknownError,
    error_for,
    parse_endpoints,
)
from rpc.errors import error_info
from rpc.protos import errors_pb2
from tests.sdk.fake_coordinator import FakeCluster, make_events, not_leader, on_shutdown
from tests.timing import scaled

E = errors_pb2
FAST = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05}


async def test_not_leader_hint_is_followed_and_remembered(cluster: FakeCluster) -> None:
    follower, leader = cluster.add("follower"), cluster.add("leader")
    follower.always["CreateChannels"] = not_leader(leader.address)
    async with CoordinatorClient([follower.address], **FAST) as client:
        response = await client.create_channels(count=2, prefix="p")
        assert list(response.pchannels) == ["p_0", "p_1"]
        assert client.leader == leader.address
        # The next call goes straight to the remembered leader.
        await client.create_channels(count=1, prefix="q")
    assert follower.count("CreateChannels") == 1
    assert leader.count("CreateChannels") == 2


async def test_transport_failure_fails_over_to_next_endpoint(
    cluster: FakeCluster, dead_address: str
) -> None:
    alive = cluster.add("alive")
    async with CoordinatorClient([dead_address, alive.address], **FAST) as client:
        response = await client.create_channels(names=["a"])
    assert list(response.pchannels) == ["a"]
    assert alive.count("CreateChannels") == 1


async def test_on_shutdown_and_plain_unavailable_fail_over(cluster: FakeCluster) -> None:
    stopping, plain, alive = cluster.add("stopping"), cluster.add("plain"), cluster.add("alive")
    stopping.always["DropChannels"] = on_shutdown()
    plain.always["DropChannels"] = grpc.StatusCode.UNAVAILABLE
    endpoints = [stopping.address, plain.address, alive.address]
    async with CoordinatorClient(endpoints, **FAST) as client:
        assert (await client.drop_channels(["x"])).revision == 8
    assert [n.count("DropChannels") for n in (stopping, plain, alive)] == [1, 1, 1]


async def test_request_id_is_reused_across_retries(cluster: FakeCluster) -> None:
    first, second = cluster.add("first"), cluster.add("second")
    # Unknown outcome, then a failover, then NOT_LEADER pointing back: three attempts.
    first.errors["GrantLease"].extend(
        [error_info(E.UNKNOWN, "outcome unknown; retry with the same request id")]
    )
    second.errors["GrantLease"].extend([not_leader(first.address)])
    async with CoordinatorClient([first.address, second.address], **FAST) as client:
        await client.grant_lease(5000)
        ids = first.request_ids + second.request_ids
        assert len(ids) == 3
        assert len(set(ids)) == 1 and len(ids[0]) == 32
        int(ids[0], 16)  # uuid4 hex
        # A new logical call gets a new id; an explicit one is sent as given.
        await client.grant_lease(5000)
        await client.grant_lease(5000, request_id="caller-chosen")
    ids = first.request_ids + second.request_ids
    assert len(set(ids)) == 3 and "caller-chosen" in ids


async def test_retries_are_bounded_in_attempts(cluster: FakeCluster) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    a.always["CreateChannels"] = on_shutdown()
    b.always["CreateChannels"] = on_shutdown()
    async with CoordinatorClient([a.address, b.address], max_attempts=5, **FAST) as client:
        with pytest.raises(UnavailableError) as raised:
            await client.create_channels(names=["x"])
    assert a.count("CreateChannels") + b.count("CreateChannels") == 5
    assert "5 attempt(s)" in str(raised.value)
    assert isinstance(raised.value.last_error, OnShutdownError)
    assert raised.value.code == E.ON_SHUTDOWN


async def test_retries_are_bounded_in_time(cluster: FakeCluster) -> None:
    hung = cluster.add("hung")
    hung.delay_s["ListChannels"] = 30
    async with CoordinatorClient([hung.address], timeout_s=0.5, max_attempts=100) as client:
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            await client.list_channels()
        assert time.monotonic() - started < 2.0


async def test_election_ping_pong_is_bounded(cluster: FakeCluster) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    a.always["Lock"] = not_leader(b.address)
    b.always["Lock"] = not_leader(a.address)
    async with CoordinatorClient([a.address], max_attempts=6, **FAST) as client:
        with pytest.raises(UnavailableError) as raised:
            await client.lock("k", 1)
    assert isinstance(raised.value.last_error, NotLeaderError)
    assert a.count("Lock") + b.count("Lock") == 6


async def test_non_retryable_error_raises_at_once(cluster: FakeCluster) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    a.always["CreateVChannel"] = error_info(
        E.INVALID_ARGUMENT, "invalid vchannel name ('a b'; expected characters A-Za-z0-9_.-)"
    )
    async with CoordinatorClient([a.address, b.address], **FAST) as client:
        with pytest.raises(InvalidArgumentError) as raised:
            await client.create_vchannel("a b", "p")
    assert raised.value.info.message.startswith("invalid vchannel name ('a b'")
    assert raised.value.code == E.INVALID_ARGUMENT
    assert isinstance(raised.value, ValueError)
    assert (a.count("CreateVChannel"), b.count("CreateVChannel")) == (1, 0)


async def test_typed_errors_for_rejections(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    node.always["Lock"] = error_info(E.RESOURCE_ACQUIRED, "key k is held by lease 7")
    async with CoordinatorClient([node.address], **FAST) as client:
        with pytest.raises(ResourceAcquiredError, match="held by lease 7"):
            await client.lock("k", 1, mode="shared")
        with pytest.raises(InvalidArgumentError):
            await client.lock("k", 1, mode="sideways")
    assert node.count("Lock") == 1
    assert type(error_for(error_info(E.NOT_FOUND, "x"))) is NotFoundError
    newer = error_for(error_info(999, "from a newer server"))
    assert type(newer) is UnknownError and "CODE_999: from a newer server" in str(newer)


def test_endpoints_are_parsed() -> None:
    assert parse_endpoints(" h1:1, h2:2,,h1:1 ") == ["h1:1", "h2:2"]
    with pytest.raises(InvalidArgumentError):
        parse_endpoints(",")
    with pytest.raises(InvalidArgumentError):
        parse_endpoints(["nohost"])


async def test_watch_events_resumes_after_last_revision_on_another_node(
    cluster: FakeCluster,
) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    a.events = b.events = make_events(6)
    a.kill_watch_after = 3
    async with CoordinatorClient([a.address, b.address], **FAST) as client:
        seen = []
        async for event in client.watch_events(from_revision=2):
            seen.append(event.revision)
            if len(seen) == 5:
                break
    assert seen == [2, 3, 4, 5, 6]
    assert a.watch_starts == [2]
    assert b.watch_starts == [5]


async def test_watch_events_compacted_raises(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    node.always["WatchEvents"] = error_info(E.COMPACTED, "revision 1 was compacted")
    async with CoordinatorClient([node.address], **FAST) as client:
        with pytest.raises(CompactedError, match="compacted"):
            async for _ in client.watch_events(from_revision=1):
                pass
    assert node.count("WatchEvents") == 1


async def test_watch_events_reconnects_are_bounded(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    node.always["WatchEvents"] = on_shutdown()
    async with CoordinatorClient([node.address], max_attempts=3, **FAST) as client:
        with pytest.raises(UnavailableError):
            async for _ in client.watch_events():
                pass
    assert node.count("WatchEvents") == 3


async def test_watch_events_from_now_pins_the_revision(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    node.events = make_events(4)
    node.channels.revision = 2
    async with CoordinatorClient([node.address], **FAST) as client:
        stream = client.watch_events(from_revision=0)
        first = await anext(stream)
        await stream.aclose()
    assert first.revision == 3
    assert node.watch_starts == [3]


async def test_watch_assignments_never_goes_back(cluster: FakeCluster) -> None:
    ahead, behind = cluster.add("ahead"), cluster.add("behind")
    ahead.assignment_versions = [5, 6]
    behind.assignment_versions = [4, 5, 6, 7]
    behind.kill_assignments = False
    async with CoordinatorClient([ahead.address, behind.address], **FAST) as client:
        versions = []
        async for discovery in client.watch_assignments():
            versions.append(discovery.version)
            if len(versions) == 3:
                break
    assert versions == [5, 6, 7]


async def test_watch_events_moves_off_a_silent_node(cluster: FakeCluster) -> None:
    # A stopped node (SIGSTOP) keeps its TCP connections and never ends a stream: without
    # even a progress notification for watch_idle_timeout_s, the watch moves on.
    silent, live = cluster.add("silent"), cluster.add("live")
    silent.events = make_events(3)
    live.events = make_events(6)
    async with CoordinatorClient(
        [silent.address, live.address], watch_idle_timeout_s=0.3, **FAST
    ) as client:
        seen = []
        async for event in client.watch_events(from_revision=1):
            seen.append(event.revision)
            if len(seen) == 6:
                break
    assert seen == [1, 2, 3, 4, 5, 6]
    assert silent.watch_starts == [1]
    assert live.watch_starts == [4]


async def test_watch_assignments_moves_off_a_silent_node(cluster: FakeCluster) -> None:
    silent, live = cluster.add("silent"), cluster.add("live")
    silent.assignment_versions = [1, 2]
    silent.kill_assignments = False
    live.assignment_versions = [2, 3]
    live.kill_assignments = False
    live.progress_every_s = 0.05
    async with CoordinatorClient(
        [silent.address, live.address], watch_idle_timeout_s=0.3, **FAST
    ) as client:
        versions = []
        async for discovery in client.watch_assignments():
            assert not discovery.progress
            versions.append(discovery.version)
            if len(versions) == 3:
                break
    assert versions == [1, 2, 3]


async def test_progress_notifications_keep_a_quiet_watch_in_place(cluster: FakeCluster) -> None:
    quiet, other = cluster.add("quiet"), cluster.add("other")
    quiet.events = other.events = make_events(2)
    quiet.progress_every_s = other.progress_every_s = 0.05
    async with CoordinatorClient(
        [quiet.address, other.address], watch_idle_timeout_s=0.3, **FAST
    ) as client:
        stream = client.watch_events(from_revision=1)
        assert [(await anext(stream)).revision for _ in range(2)] == [1, 2]
        # Nothing new for 5x the idle timeout: progress notifications only, never yielded
        # and never a reason to move.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(stream), 1.5)
        await stream.aclose()  # type: ignore[attr-defined]
    assert quiet.progress_sent >= 10
    assert quiet.watch_starts == [1]
    assert other.watch_starts == []


async def test_lease_keeper_renews_reconnects_and_notices_loss(cluster: FakeCluster) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    a.leases[100] = b.leases[100] = 600
    a.kill_keepalive_after = 2  # the stream on a dies after two renewals
    client = CoordinatorClient([a.address, b.address], **FAST)
    async with client, client.lease_keeper(100, interval_s=0.05) as keeper:
        assert keeper.alive
        # Renewals go on past the stream's death, on the other node.
        assert await _until(lambda: keeper.renewals >= 5 and b.keepalive_count >= 2), (
            keeper.renewals,
            b.keepalive_count,
        )
        assert keeper.alive
        del b.leases[100]  # revoked or expired on the server
        assert await keeper.wait_lost(timeout_s=scaled(2.0))
        assert not keeper.alive
        assert isinstance(keeper.lost_error, NotFoundError)


async def test_lease_keeper_for_unknown_lease_fails_on_enter(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    async with CoordinatorClient([node.address], **FAST) as client:
        with pytest.raises(NotFoundError):
            async with client.lease_keeper(12345):
                pass
        with pytest.raises(NotFoundError):
            await client.keep_alive(12345)


async def _until(predicate: Callable[[], bool], timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


async def test_lease_keeper_recovers_from_a_late_renewal(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    node.leases[100] = 300
    client = CoordinatorClient([node.address], timeout_s=5.0, **FAST)
    async with client, client.lease_keeper(100, interval_s=0.05) as keeper:
        node.kill_keepalive_after = node.keepalive_count  # every renewal fails from now on
        assert await _until(lambda: not keeper.alive)
        # The server still knew the lease (a failover extends leases): a late renewal
        # brings the belief back instead of abandoning a lease that never expired.
        node.kill_keepalive_after = None
        assert await _until(lambda: keeper.alive)
        assert keeper.lost_error is None


async def test_lease_keeper_gives_up_after_its_grace(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    node.leases[100] = 300
    client = CoordinatorClient([node.address], timeout_s=0.5, **FAST)
    async with client, client.lease_keeper(100, interval_s=0.05) as keeper:
        started = time.monotonic()
        cluster.stop_node(node)
        assert await _until(lambda: not keeper.alive, timeout_s=1.0)
        assert await keeper.wait_lost(timeout_s=3.0)
        # Believed lost at the ttl; given up at ttl + timeout_s (0.3 + 0.5 s).
        assert 0.6 < time.monotonic() - started < 2.0
        assert isinstance(keeper.lost_error, UnavailableError)
