"""Every long-lived loop of the SDK against a real three-node cluster whose nodes are
killed (SIGKILL), paused (SIGSTOP) and restarted mid-stream: the lease keeper, the watches,
the assignment cache, the producer's streams, the consumer and the transaction keepalive.

Each loop must either recover or end with a typed ``RaftwalError`` that its caller sees;
none may end quietly (a dead task, a bare CancelledError, a raw RuntimeError, or a keeper
whose ``wait_lost()`` never returns while nothing renews the lease). Nothing here is
random: the victim is always the node the loop's stream is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator

import pytest

from raftwal.cli import dev
from rpc.client import CoordinatorClient, InnerError, RaftwalError, TransactionExpiredError
from rpc.protos import errors_pb2
from rpc.streaming_client import Consumer, Producer, StreamingClient, Txn
from tests.sdk.test_streaming_client import _replicated_vchannel, _wait_all_up
from tests.timing import scaled

pytestmark = pytest.mark.cluster

TEST_TIMEOUT_S = 60.0
LEASE_TTL_MS = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    directory = tmp_path_factory.mktemp("loops")
    config = dataclasses.replace(dev.make_config(directory.resolve(), 3))
    local = dev.up(directory, 3, timeout_s=60, config=config)
    try:
        yield local
    finally:
        local.stop_all()


def _closed_client_error(error: BaseException | None) -> bool:
    """What a loop must end with when its client is closed under it: a typed ON_SHUTDOWN
    (``rpc.client.ClientClosedError``), not a CancelledError, a RuntimeError or INNER."""
    return isinstance(error, RaftwalError) and error.code == errors_pb2.ON_SHUTDOWN


def _node_of(cluster: dev.LocalCluster, address: str) -> str:
    return cluster.node_of(address)


async def _follower_first(cluster: dev.LocalCluster) -> list[str]:
    """The endpoints with a Raft follower first: a client's streams start there, and
    killing it leaves the leader (and the leases it judges) alone."""
    async with CoordinatorClient(cluster.endpoints) as client:
        status = await client.cluster_status()
    leader = status.leader_node_id
    follower = next(n for n in cluster.config.nodes if n.id != leader)
    return [follower.grpc_address, *(e for e in cluster.endpoints if e != follower.grpc_address)]


@contextlib.asynccontextmanager
async def _stopped(cluster: dev.LocalCluster, node_id: str, how: str):
    """Kill (-9) or pause (SIGSTOP) `node_id`; afterwards restart or resume it and wait
    until the whole cluster is healthy again, so the next test starts from three nodes."""
    signum = signal.SIGKILL if how == "kill" else signal.SIGSTOP
    await asyncio.to_thread(cluster.kill, node_id, signum)
    try:
        yield
    finally:
        if how == "kill":
            cluster.start_node(node_id)
        else:
            cluster.kill(node_id, signal.SIGCONT)
        async with StreamingClient(cluster.endpoints) as client:
            await _wait_all_up(client)


async def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------------------
# Lease keeper
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["kill", "pause"])
async def test_lease_keeper_outlives_the_node_its_stream_is_on(
    cluster: dev.LocalCluster, how: str
) -> None:
    """The keeper's node is killed or paused between two renewals. The next write then
    meets a finished stream (kill: InvalidStateError, which used to kill the keeper task
    quietly: renewals stopped, lost_error stayed None, wait_lost never returned) or a
    silent one (pause). Either way the keeper moves on and the lease never lapses."""
    endpoints = await _follower_first(cluster)
    async with CoordinatorClient(endpoints) as client:
        lease = await client.grant_lease(LEASE_TTL_MS, holder="keeper-test")
        held = await client.lock(f"loops/{how}", lease.lease_id)
        async with client.lease_keeper(lease.lease_id) as keeper:
            await _until(lambda: keeper.renewals >= 2, 10, "two renewals before the fault")
            before = keeper.renewals
            async with _stopped(cluster, _node_of(cluster, endpoints[0]), how):
                # Three ttls: without renewals the lease would have expired twice over.
                deadline = time.monotonic() + scaled(3 * LEASE_TTL_MS / 1000)
                while time.monotonic() < deadline:
                    assert keeper.lost_error is None, keeper.lost_error
                    await asyncio.sleep(0.1)
                assert keeper.alive, "the lease is believed alive throughout"
                assert keeper.renewals >= before + 3, (before, keeper.renewals)
                # The server agrees: the lock is still this lease's (same fencing token).
                again = await client.lock(f"loops/{how}", lease.lease_id)
                assert again.fencing_token == held.fencing_token
            assert not await keeper.wait_lost(0.1)
        await client.revoke_lease(lease.lease_id)


async def test_lease_keeper_never_dies_quietly(
    cluster: dev.LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure no rule covers (here: handling an answer raises) and a cancel without
    stop() both mark the lease lost at once: lost_error is typed and wait_lost returns."""
    async with CoordinatorClient(cluster.endpoints) as client:
        lease = await client.grant_lease(LEASE_TTL_MS, holder="bug")
        keeper = await client.lease_keeper(lease.lease_id, interval_s=0.1).start()

        def broken(*_: object) -> None:
            raise ValueError("a bug in handling a renewal")

        monkeypatch.setattr(keeper, "_renewed", broken)
        assert await keeper.wait_lost(5.0), "wait_lost returns once the keeper fails"
        assert isinstance(keeper.lost_error, InnerError), keeper.lost_error
        assert "a bug in handling a renewal" in str(keeper.lost_error)
        assert not keeper.alive
        await keeper.stop()
        monkeypatch.undo()

        other = await client.lease_keeper(lease.lease_id, interval_s=0.1).start()
        assert other._task is not None
        other._task.cancel()
        assert await other.wait_lost(5.0), "a cancel without stop() is a loss too"
        assert isinstance(other.lost_error, RaftwalError), other.lost_error
        await other.stop()
        await client.revoke_lease(lease.lease_id)


# ---------------------------------------------------------------------------------------
# Watches
# ---------------------------------------------------------------------------------------


async def _collect_events(client: CoordinatorClient, into: list[int], from_revision: int):
    async for event in client.watch_events(from_revision=from_revision):
        into.append(event.revision)


async def test_watches_resume_after_a_kill_and_end_typed_when_the_client_closes(
    cluster: dev.LocalCluster,
) -> None:
    """watch_events and watch_assignments resume on another node when theirs is killed
    (no gap, no repeat). When the client is closed under them, their call is cancelled
    from outside: they end with ClientClosedError, where they used to end with a bare
    CancelledError that made the iterating task look cancelled."""
    endpoints = await _follower_first(cluster)
    client = CoordinatorClient(endpoints)
    revisions: list[int] = []
    versions: list[int] = []

    async def assignments() -> None:
        async for discovery in client.watch_assignments():
            versions.append(discovery.version)

    try:
        start = (await client.list_channels()).revision + 1
        events = asyncio.create_task(_collect_events(client, revisions, start))
        discoveries = asyncio.create_task(assignments())
        await client.create_channels(2, prefix="loopsw")
        await _until(lambda: len(revisions) >= 1 and versions, 10, "first event and version")
        async with _stopped(cluster, _node_of(cluster, endpoints[0]), "kill"):
            await client.create_channels(2, prefix="loopsx")
            created = (await client.list_channels()).revision
            await _until(lambda: revisions and revisions[-1] >= created, 30, "events resume")
        assert revisions == list(range(start, revisions[-1] + 1)), "no gap, no repeat"
        assert versions == sorted(set(versions))
    finally:
        await client.close()
    for task, name in ((events, "watch_events"), (discoveries, "watch_assignments")):
        done, _ = await asyncio.wait({task}, timeout=scaled(10))
        assert done, f"{name} still runs after the client closed"
        assert not task.cancelled(), f"{name} ended as if its caller had been cancelled"
        assert _closed_client_error(task.exception()), (name, task.exception())


# ---------------------------------------------------------------------------------------
# Assignment cache and producer streams
# ---------------------------------------------------------------------------------------


async def test_assignment_cache_and_producer_survive_a_kill_and_end_typed_when_closed(
    cluster: dev.LocalCluster,
) -> None:
    """The routing table's watch is on the killed node: it moves, and every send made
    meanwhile is acknowledged once, in order. Then the client is closed under the
    producer with sends in flight: each send that was not acknowledged fails with a typed
    ON_SHUTDOWN (the client is closed). It used to fail with INNER after the producer's
    lane died on a RuntimeError from the closed routing table. The owner is paused for
    that part, so that the sends are still unacknowledged when the client closes."""
    endpoints = await _follower_first(cluster)
    client = StreamingClient(endpoints)
    producer = Producer(client, retry_timeout_s=20)
    try:
        pchannel, vchannel = await _replicated_vchannel(client, "loopsp")
        await producer.send(vchannel, b"before")
        streams_before = client.router.watch_streams
        async with _stopped(cluster, _node_of(cluster, endpoints[0]), "kill"):
            positions = [await producer.send(vchannel, b"during %d" % i) for i in range(20)]
            await _until(
                lambda: client.router.watch_streams > streams_before, 15, "the watch moved"
            )
        assert [p.lsn for p in positions] == sorted({p.lsn for p in positions})
        owner = await client.router.owner(pchannel, TEST_TIMEOUT_S)
        async with _stopped(cluster, owner.owner_node_id, "pause"):
            # The paused owner answers nothing: these stay unacknowledged until the close.
            futures = [await producer.submit(vchannel, b"late %d" % i) for i in range(50)]
            await asyncio.sleep(0.5)
            await client.close()
            results = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), TEST_TIMEOUT_S
            )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == len(futures), results[:3]
        assert all(_closed_client_error(e) for e in errors), errors[:3]
    finally:
        with contextlib.suppress(RaftwalError, RuntimeError):
            await producer.close(timeout_s=5)
        await client.close()


async def test_a_send_waits_out_a_lookup_no_node_can_answer_within_retry_timeout(
    cluster: dev.LocalCluster,
) -> None:
    """Two of three nodes are paused for longer than the coordinator client's deadline
    (10 s): no node can answer the producer's linearizable vchannel lookup. The send has
    retry_timeout_s 40: it asks again until the nodes come back and is acknowledged once.
    It used to fail with UnreachableError after the coordinator client's 10 s, whatever
    the producer's budget (seen in CI as a flaky consumer test under load)."""
    async with StreamingClient(cluster.endpoints) as setup:
        _, vchannel = await _replicated_vchannel(setup, "loopsl")
    paused = [n.id for n in cluster.config.nodes][1:]
    client = StreamingClient(cluster.endpoints)
    producer = Producer(client, retry_timeout_s=40)
    try:
        for node in paused:
            await asyncio.to_thread(cluster.kill, node, signal.SIGSTOP)
        try:
            sending = asyncio.create_task(producer.send(vchannel, b"after the outage"))
            await asyncio.sleep(13)
            assert not sending.done() or sending.exception() is None, sending.exception()
        finally:
            for node in paused:
                cluster.kill(node, signal.SIGCONT)
        position = await asyncio.wait_for(sending, TEST_TIMEOUT_S)
        async with StreamingClient(cluster.endpoints) as reader:
            await _wait_all_up(reader)
            consumer = Consumer(reader, vchannel)
            try:
                seen = []
                async for entry in consumer:
                    seen.append((entry.lsn, entry.payload))
                    if entry.lsn >= position.lsn:
                        break
            finally:
                await consumer.close()
        assert [p for _, p in seen].count(b"after the outage") == 1, seen
        assert (position.lsn, b"after the outage") in seen
    finally:
        with contextlib.suppress(RaftwalError, RuntimeError):
            await producer.close(timeout_s=5)
        await client.close()


async def test_producer_over_the_transfer_port_survives_its_owner_killed_then_paused(
    cluster: dev.LocalCluster,
) -> None:
    """Sends go on, one after another, over Produce connections to the owner's transfer
    port (rpc.produce_stream) while the owner is killed (its connection resets) and then
    the new owner is paused (its connection goes silent). Every send is acknowledged, and
    the log holds each acknowledged message once, at its position, in send order; each
    time the sends moved to another Produce connection on a transfer port, never to the
    gRPC call."""
    async with StreamingClient(cluster.endpoints) as setup:
        pchannel, vchannel = await _replicated_vchannel(setup, "loopspp")
    client = StreamingClient(cluster.endpoints)
    producer = Producer(client, retry_timeout_s=40, attempt_timeout_s=3)
    acked: list[tuple[int, bytes]] = []
    stop = asyncio.Event()

    async def keep_sending() -> None:
        for k in range(100_000):  # bounded; stopped long before
            if stop.is_set():
                return
            payload = b"pp %d" % k
            position = await producer.send(vchannel, payload)
            acked.append((position.lsn, payload))

    sending = asyncio.create_task(keep_sending())
    try:
        await _until(lambda: len(acked) >= 20 or sending.done(), TEST_TIMEOUT_S, "first sends")
        for how in ("kill", "pause"):
            # The node the producer's stream is on now (the owner may have moved back to a
            # restarted node since the last phase).
            before = len(acked)
            await _until(lambda before=before: len(acked) > before, TEST_TIMEOUT_S, "a send")
            lane = producer._lanes[pchannel]
            route, stream = lane.route, lane.stream
            assert route is not None and stream is not None and stream.over_port
            async with _stopped(cluster, _node_of(cluster, route.owner_address), how):
                before = len(acked)
                await _until(
                    lambda before=before: len(acked) >= before + 20 or sending.done(),
                    TEST_TIMEOUT_S,
                    f"sends go on with the owner {how}ed",
                )
                # The sends went on over another Produce connection (a new one, or one
                # opened to that node before and still open).
                assert lane.stream is not stream and lane.stream is not None
                assert lane.stream.over_port, lane.stream.address
            assert not sending.done(), sending.exception()
        stop.set()
        await asyncio.wait_for(sending, TEST_TIMEOUT_S)
        assert producer.stats.port_streams >= 2 and producer.stats.grpc_streams == 0, producer.stats
        last = acked[-1][0]
        seen: list[tuple[int, bytes]] = []
        async with Consumer(client, vchannel, retry_timeout_s=30) as consumer:
            async with asyncio.timeout(TEST_TIMEOUT_S):
                async for entry in consumer:
                    seen.append((entry.lsn, entry.payload))
                    if entry.lsn >= last:
                        break
        assert seen == acked, (len(seen), len(acked))
    finally:
        stop.set()
        sending.cancel()
        with contextlib.suppress(BaseException):
            await sending
        with contextlib.suppress(RaftwalError, RuntimeError):
            await producer.close(timeout_s=5)
        await client.close()


# ---------------------------------------------------------------------------------------
# Consumer
# ---------------------------------------------------------------------------------------


async def test_consumer_survives_its_owner_paused_and_ends_typed_when_closed_under_it(
    cluster: dev.LocalCluster,
) -> None:
    """The consumer's owner is paused mid-stream (its stream goes silent): the consumer
    moves to the new owner without a gap or repeat. Closing the client under a consumer
    cancels its call: the next read raises ClientClosedError, where it used to raise a
    raw RuntimeError from deep inside the routing table."""
    async with StreamingClient(cluster.endpoints) as setup:
        pchannel, vchannel = await _replicated_vchannel(setup, "loopsc")
        async with Producer(setup) as producer:
            await producer.send_batch(vchannel, [b"m%03d" % i for i in range(50)])
        owner = await setup.router.owner(pchannel, TEST_TIMEOUT_S)
    client = StreamingClient(cluster.endpoints)
    consumer = Consumer(client, vchannel)
    seen: list[bytes] = []
    try:
        async for entry in consumer:
            seen.append(entry.payload)
            if len(seen) == 50:
                break
        async with _stopped(cluster, owner.owner_node_id, "pause"):
            async with Producer(cluster.endpoints) as producer:
                await producer.send_batch(vchannel, [b"m%03d" % i for i in range(50, 60)])
            async for entry in consumer:
                seen.append(entry.payload)
                if len(seen) == 60:
                    break
        assert seen == [b"m%03d" % i for i in range(60)], "no gap, no repeat"
        assert consumer.connections >= 2
        reading = asyncio.create_task(consumer.__anext__())
        await asyncio.sleep(0.3)
        await client.close()
        done, _ = await asyncio.wait({reading}, timeout=scaled(10))
        assert done, "the read ends when the client closes"
        assert _closed_client_error(reading.exception()), reading.exception()
    finally:
        await consumer.close()
        await client.close()


# ---------------------------------------------------------------------------------------
# Transaction keepalive
# ---------------------------------------------------------------------------------------


async def test_txn_keepalive_that_gave_up_fails_the_commit_at_once(
    cluster: dev.LocalCluster,
) -> None:
    """The txn's owner is paused longer than keepalive_ms: the keepalive gives up (the
    owner has expired the txn by then) and the commit raises TransactionExpiredError at
    once, without sending. It used to wait out attempt_timeout_s at the paused owner and
    report an unknown outcome, although nothing can have been written."""
    async with StreamingClient(cluster.endpoints) as client:
        pchannel, vchannel = await _replicated_vchannel(client, "loopst")
        owner = await client.router.owner(pchannel, TEST_TIMEOUT_S)
        txn = Txn(client, vchannel, keepalive_ms=1500, attempt_timeout_s=10)
        await txn.begin()
        await txn.append(b"a", b"b")
        async with _stopped(cluster, owner.owner_node_id, "pause"):
            await _until(lambda: txn.keepalive_error is not None, 10, "the keepalive gives up")
            assert isinstance(txn.keepalive_error, TransactionExpiredError), txn.keepalive_error
            started = time.monotonic()
            with pytest.raises(TransactionExpiredError):
                await txn.commit()
            assert time.monotonic() - started < 1.0
            assert txn.state == "failed"
        await txn._release()
