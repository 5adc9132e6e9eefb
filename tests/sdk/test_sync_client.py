"""The synchronous wrapper: same calls, errors and retries as the async client, from plain
threads, with streams as blocking generators."""

from __future__ import annotations

import threading

import pytest

from rpc.client import InvalidArgumentError, NotFoundError, UnavailableError
from rpc.errors import error_info
from rpc.protos import errors_pb2
from rpc.sync_client import Client
from tests.sdk.fake_coordinator import FakeCluster, make_events, not_leader, on_shutdown

E = errors_pb2
FAST = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05}


def test_sync_calls_follow_hints_and_reuse_request_ids(cluster: FakeCluster) -> None:
    follower, leader = cluster.add("follower"), cluster.add("leader")
    follower.always["CreateChannels"] = not_leader(leader.address)
    leader.errors["CreateChannels"].append(on_shutdown())
    with Client(follower.address, **FAST) as client:
        response = client.create_channels(count=1, prefix="s")
        assert list(response.pchannels) == ["s_0"]
        assert client.leader == leader.address
    ids = follower.request_ids + leader.request_ids
    # follower (hint) -> leader (stopping) -> follower (hint again) -> leader: one id.
    assert len(ids) == 4 and len(set(ids)) == 1


def test_sync_errors_are_typed_and_bounded(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    node.always["Lock"] = error_info(E.INVALID_ARGUMENT, "invalid key ('' ; expected 1..256)")
    node.always["Unlock"] = on_shutdown()
    with Client([node.address], max_attempts=3, **FAST) as client:
        with pytest.raises(InvalidArgumentError, match="invalid key"):
            client.lock("", 1)
        with pytest.raises(UnavailableError):
            client.unlock("k", 1)
    assert node.count("Lock") == 1
    assert node.count("Unlock") == 3


def test_sync_watch_is_a_generator_that_resumes(cluster: FakeCluster) -> None:
    a, b = cluster.add("a"), cluster.add("b")
    a.events = b.events = make_events(5)
    a.kill_watch_after = 2
    with Client([a.address, b.address], **FAST) as client:
        stream = client.watch_events(from_revision=1)
        revisions = [next(stream).revision for _ in range(5)]
        stream.close()  # cancels the live stream on b
        # The client stays usable after a stream is closed.
        assert client.list_channels().revision == 0
    assert revisions == [1, 2, 3, 4, 5]
    assert b.watch_starts == [3]


def test_sync_lease_keeper_from_another_thread(cluster: FakeCluster) -> None:
    node = cluster.add("n")
    with Client([node.address], **FAST) as client:
        lease = client.grant_lease(500)
        seen: list[bool] = []
        with client.lease_keeper(lease.lease_id, interval_s=0.05) as keeper:
            reader = threading.Thread(target=lambda: seen.append(keeper.alive))
            reader.start()
            reader.join(5)
            assert not keeper.wait_lost(0.3)
            assert keeper.alive
            client.revoke_lease(lease.lease_id)
            assert keeper.wait_lost(2.0)
            assert isinstance(keeper.lost_error, NotFoundError)
    assert seen == [True]


def test_sync_client_rejects_bad_arguments_without_leaking_a_thread() -> None:
    before = threading.active_count()
    with pytest.raises(InvalidArgumentError):
        Client("", timeout_s=1.0)
    with pytest.raises(InvalidArgumentError):
        Client("h:1", max_attempts=0)
    assert threading.active_count() == before
