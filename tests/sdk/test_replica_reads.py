"""Replica reads against a real three-node cluster: a consumer with ``prefer_replica`` reads
from a node of the replica set that is not the owner, gets exactly the acknowledged entries
in order (a backlog, then a live tail), and falls back to the owner without a gap or a
repeat when its replica is killed. A node that holds no replica, and a time-tick stream,
are still answered with the owner's address."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from rpc.client import InvalidArgumentError
from rpc.errors import from_rpc_error
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.streaming_client import Consumer, Producer, StreamingClient
from tests.sdk.test_streaming_client import _cli, _replicated_vchannel, _wait_all_up
from tests.timing import scaled

pytestmark = pytest.mark.cluster

TEST_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    directory = tmp_path_factory.mktemp("replica-reads")
    local = dev.up(directory, 3, timeout_s=60, config=dev.make_config(directory.resolve(), 3))
    try:
        yield local
    finally:
        local.stop_all()


def _node_of(cluster: dev.LocalCluster, address: str) -> str:
    return cluster.node_of(address)


async def _read(consumer: Consumer, count: int) -> list[tuple[int, bytes]]:
    seen: list[tuple[int, bytes]] = []

    async def take() -> None:
        async for entry in consumer:
            seen.append((entry.lsn, entry.payload))
            if len(seen) == count:
                return

    await asyncio.wait_for(take(), TEST_TIMEOUT_S)
    return seen


async def test_a_replica_serves_the_backlog_and_the_tail_exactly_as_acknowledged(
    cluster: dev.LocalCluster,
) -> None:
    async with StreamingClient(cluster.endpoints) as client:
        pchannel, vchannel = await _replicated_vchannel(client, "rr")
        owner = await client.router.owner(pchannel, TEST_TIMEOUT_S)
        async with Producer(client) as producer:
            acked = [
                (p.lsn, b"b%04d" % i)
                for i, p in enumerate(
                    await producer.send_batch(vchannel, [b"b%04d" % i for i in range(300)])
                )
            ]
            consumer = Consumer(client, vchannel, prefer_replica=True)
            try:
                assert await _read(consumer, 300) == acked
                assert consumer.on_replica
                stream_address = consumer._route.owner_address  # noqa: SLF001 - where it reads
                assert stream_address != owner.owner_address
                assert stream_address in owner.replica_addresses
                # The live tail: each message arrives from the replica, one at a time.
                delays = []
                for i in range(20):
                    started = time.monotonic()
                    position = await producer.send(vchannel, b"t%04d" % i)
                    [(lsn, payload)] = await _read(consumer, 1)
                    delays.append(time.monotonic() - started)
                    assert (lsn, payload) == (position.lsn, b"t%04d" % i)
                assert consumer.on_replica
                # Idle commit points reach replicas with a heartbeat, not the next write:
                # no message waits for the 1 s idle heartbeat.
                assert sorted(delays)[len(delays) // 2] < 0.5, delays
            finally:
                await consumer.close()


async def test_the_consumer_falls_back_to_the_owner_when_its_replica_is_killed(
    cluster: dev.LocalCluster,
) -> None:
    async with StreamingClient(cluster.endpoints) as client:
        pchannel, vchannel = await _replicated_vchannel(client, "rk")
        owner = await client.router.owner(pchannel, TEST_TIMEOUT_S)
        async with Producer(client) as producer:
            first = await producer.send_batch(vchannel, [b"a%03d" % i for i in range(100)])
        consumer = Consumer(client, vchannel, prefer_replica=True, retry_timeout_s=60)
        victim = ""
        try:
            seen = await _read(consumer, 100)
            assert consumer.on_replica
            victim = _node_of(cluster, consumer._route.owner_address)  # noqa: SLF001
            assert victim != owner.owner_node_id
            await asyncio.to_thread(cluster.kill, victim, signal.SIGKILL)
            async with Producer(client, retry_timeout_s=60) as producer:
                later = await producer.send_batch(vchannel, [b"a%03d" % i for i in range(100, 150)])
            seen += await _read(consumer, 50)
            acked = [(p.lsn, b"a%03d" % i) for i, p in enumerate([*first, *later])]
            assert seen == acked, "no gap, no repeat"
            assert consumer.connections >= 2
        finally:
            await consumer.close()
            if victim:
                cluster.start_node(victim)
                await _wait_all_up(client)


async def test_nodes_without_a_replica_and_time_tick_streams_answer_with_the_owner(
    cluster: dev.LocalCluster,
) -> None:
    with pytest.raises(InvalidArgumentError, match="prefer_replica"):
        Consumer(cluster.endpoints, "x", prefer_replica=True, time_tick_interval_ms=100)
    async with StreamingClient(cluster.endpoints) as client:
        tag = f"rs{uuid.uuid4().hex[:6]}"
        created = await client.coordinator.create_channels(names=[tag], replica_count=1)
        pchannel = created.pchannels[0]
        await client.coordinator.create_vchannel(f"{tag}_v", pchannel)
        owner = await client.router.owner(pchannel, TEST_TIMEOUT_S)
        async with Producer(client) as producer:
            await producer.send(f"{tag}_v", b"only on the owner")
        other = next(e for e in cluster.data_endpoints(pchannel) if e != owner.owner_address)
        replicated_p, replicated_v = await _replicated_vchannel(client, "rt")
        replicated_owner = await client.router.owner(replicated_p, TEST_TIMEOUT_S)
        replica = next(
            e for e in cluster.data_endpoints(replicated_p) if e != replicated_owner.owner_address
        )
        # Each case names its own owner: `other` and `replica` may be the same node.
        cases = [
            (
                other,
                wire.ConsumeRequest(vchannel=f"{tag}_v", from_replica=True),
                owner.owner_address,
            ),
            (
                replica,
                wire.ConsumeRequest(
                    vchannel=replicated_v, from_replica=True, time_tick_interval_ms=100
                ),
                replicated_owner.owner_address,
            ),
        ]
        for address, request, expected in cases:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = streaming_pb2_grpc.StreamingNodeStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in stub.Consume(request, timeout=scaled(10)):
                        break
                info = from_rpc_error(raised.value)
                assert info.code == errors_pb2.NOT_OWNER, info
                assert info.owner_hint == expected, info
        # The same node serves the replicated pchannel's committed entries when asked, once it
        # has them: the owner's recovery fenced a majority, which need not include this replica,
        # so it may hear of the term a moment later.
        async with grpc.aio.insecure_channel(replica) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            deadline = time.monotonic() + scaled(TEST_TIMEOUT_S)
            while True:
                latest = await stub.GetLatestTimeTick(
                    wire.GetLatestTimeTickRequest(pchannel=replicated_p, from_replica=True),
                    timeout=scaled(10),
                )
                if latest.term >= replicated_owner.term or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert latest.term >= replicated_owner.term, latest
        with contextlib.suppress(Exception):
            await client.coordinator.drop_channels([pchannel])


async def test_cli_consume_prefer_replica_prints_the_acknowledged_entries(
    cluster: dev.LocalCluster,
) -> None:
    endpoints = ",".join(cluster.endpoints)
    async with StreamingClient(cluster.endpoints) as client:
        _, vchannel = await _replicated_vchannel(client, "rc")
        async with Producer(client) as producer:
            positions = await producer.send_batch(vchannel, [b"c%03d" % i for i in range(50)])
    consumed = await asyncio.to_thread(
        _cli, "consume", "--endpoints", endpoints, "--vchannel", vchannel, "--from-beginning",
        "--prefer-replica", "--limit", "50", "--timeout-s", "20", "--json",
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    entries = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(e["lsn"], base64.b64decode(e["payload"])) for e in entries] == [
        (p.lsn, b"c%03d" % i) for i, p in enumerate(positions)
    ]
    refused = await asyncio.to_thread(
        _cli, "consume", "--endpoints", endpoints, "--subscription", "s", "--packs",
        "--prefer-replica",
    )  # fmt: skip
    assert refused.returncode == 2 and "--prefer-replica with --packs" in refused.stderr
