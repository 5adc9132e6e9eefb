"""Subscriptions on a real three-node cluster: positions committed through Raft survive a
consumer's restart and an owner's failover, move forward only except through Seek, and
Describe shows the lag; bad requests get a clear ErrorInfo; the CLI resumes from them.

Every check compares what a consumer reads against what the producer had acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from rpc.client import (
    ChannelFencedError,
    ChannelNotExistError,
    CoordinatorClient,
    InvalidArgumentError,
    NotFoundError,
)
from rpc.streaming_client import (
    Producer,
    StreamingClient,
    SubscriptionConsumer,
    SubscriptionMember,
)
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.timing import scaled

pytestmark = pytest.mark.cluster

RAFTWAL = str(Path(sys.executable).with_name("raftwal"))
TIMEOUT_S = scaled(60.0)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    settings = dict(os.environ)
    settings["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(tmp_path_factory.mktemp("subscriptions"), settings) as running:
        yield running


async def _produce(client: StreamingClient, vchannel: str, payloads: list[bytes]) -> list[int]:
    async with Producer(client, retry_timeout_s=TIMEOUT_S) as producer:
        positions = await asyncio.gather(*(producer.send(vchannel, p) for p in payloads))
    return [p.lsn for p in positions]


async def _take(reader: SubscriptionConsumer, count: int) -> list[bytes]:
    taken = []
    for _ in range(count):
        entry = await asyncio.wait_for(anext(reader), TIMEOUT_S)
        taken.append(entry.payload)
    return taken


def test_positions_survive_a_restart_and_a_failover(env) -> None:
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "sub", {"sub_v": 0})
    owner, term, _ = wait_assigned(api_client, pchannel)

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            created = await client.coordinator.create_subscription("orders", ["sub_v"])
            assert list(created.subscription.vchannels) == ["sub_v"]
            # The same create again is a no-op; other settings are refused.
            await client.coordinator.create_subscription("orders", ["sub_v"])
            first = [b"m%03d" % i for i in range(30)]
            lsns = await _produce(client, "sub_v", first)
            # A consumer reads 10 and stops cleanly: 10 are committed.
            async with SubscriptionConsumer(client, "orders", "sub_v", commit_every=3) as one:
                assert await _take(one, 10) == first[:10]
            described = await client.coordinator.describe_subscription("orders")
            (lag,) = described.lags
            assert lag.position_lsn == lsns[9]
            assert lag.committed_lsn >= lsns[-1]
            assert lag.lsn_lag == lag.committed_lsn - lsns[9] and lag.lsn_lag >= 20
            # A consumer that fails on an entry does not commit it: it comes again.
            with pytest.raises(RuntimeError, match="boom"):
                async with SubscriptionConsumer(client, "orders", "sub_v") as two:
                    assert await _take(two, 5) == first[10:15]
                    raise RuntimeError("boom")
            async with SubscriptionConsumer(client, "orders", "sub_v") as three:
                assert await _take(three, 5) == first[14:19]

        # The owner dies; the positions live in Raft, not on it.
        cluster.kill(owner)
        await asyncio.to_thread(wait_assigned, api_client, pchannel, min_term=term + 1)
        async with StreamingClient(cluster.endpoints) as client:
            more = [b"n%03d" % i for i in range(5)]
            await _produce(client, "sub_v", more)
            async with SubscriptionConsumer(client, "orders", "sub_v") as four:
                assert await _take(four, 16) == first[19:] + more
            # Positions move forward only; Seek moves them back.
            with pytest.raises(InvalidArgumentError, match="moves forward only"):
                await client.coordinator.commit_subscription("orders", {"sub_v": (lsns[0], 0)})
            await client.coordinator.seek_subscription("orders", lsn=lsns[5])
            async with SubscriptionConsumer(client, "orders", "sub_v") as five:
                assert await _take(five, 2) == first[5:7]
            await client.coordinator.seek_subscription("orders", latest=True)
            late = [b"late"]
            await _produce(client, "sub_v", late)
            async with SubscriptionConsumer(client, "orders", "sub_v") as six:
                assert await _take(six, 1) == late
            await client.coordinator.seek_subscription("orders", earliest=True)
            async with SubscriptionConsumer(client, "orders", "sub_v") as seven:
                assert await _take(seven, 3) == first[:3]

    asyncio.run(scenario())
    cluster.start_node(owner)


def test_bad_requests_get_a_clear_error(env) -> None:
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "subbad", {"subbad_v": 0})
    wait_assigned(api_client, pchannel)

    async def scenario() -> None:
        async with CoordinatorClient(cluster.endpoints) as client:
            with pytest.raises(NotFoundError, match="'nosuch' does not exist"):
                await client.describe_subscription("nosuch")
            with pytest.raises(ChannelNotExistError, match="'no_v'"):
                await client.create_subscription("s_bad", ["no_v"])
            with pytest.raises(InvalidArgumentError, match="a letter or digit"):
                await client.create_subscription("../x", ["subbad_v"])
            await client.create_subscription("s_ok", ["subbad_v"])
            # Beyond the committed log.
            with pytest.raises(InvalidArgumentError, match="expected <= "):
                await client.commit_subscription("s_ok", {"subbad_v": (10**9, 0)})
            with pytest.raises(InvalidArgumentError, match="exactly one of"):
                await client.seek_subscription("s_ok", lsn=3, latest=True)
            with pytest.raises(InvalidArgumentError, match="not in subscription"):
                await client.commit_subscription("s_ok", {"sub_v": (1, 0)})
            await client.drop_subscription("s_ok")
            with pytest.raises(NotFoundError):
                await client.drop_subscription("s_ok")

    asyncio.run(scenario())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RAFTWAL, *args], capture_output=True, text=True, timeout=scaled(120))


def test_the_cli_resumes_from_a_subscription(env) -> None:
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "subcli", {"subcli_v": 0})
    wait_assigned(api_client, pchannel)
    endpoints = ",".join(cluster.endpoints)
    produced = _cli("produce", "--endpoints", endpoints, "--vchannel", "subcli_v", "--count", "6")
    assert produced.returncode == 0, produced.stderr
    created = _cli(
        "subscription", "create", "audit", "--vchannels", "subcli_v", "--endpoints", endpoints
    )
    assert created.returncode == 0, created.stderr

    def consume(limit: int) -> list[dict]:
        done = _cli(
            "consume", "--subscription", "audit", "--limit", str(limit), "--json",
            "--timeout-s", "10", "--endpoints", endpoints,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    first, second = consume(4), consume(4)
    assert len(first) == 4 and len(second) == 2
    assert [e["lsn"] for e in first + second] == sorted({e["lsn"] for e in first + second})
    described = _cli("subscription", "describe", "audit", "--json", "--endpoints", endpoints)
    (lag,) = json.loads(described.stdout)["lags"]
    assert lag["position_lsn"] == second[-1]["lsn"] and lag["lsn_lag"] == 0
    listed = _cli("subscription", "list", "--json", "--endpoints", endpoints)
    assert "audit" in [s["name"] for s in json.loads(listed.stdout)["subscriptions"]]
    sought = _cli(
        "subscription", "seek", "audit", "--lsn", str(first[0]["lsn"]), "--endpoints", endpoints
    )
    assert sought.returncode == 0, sought.stderr
    assert [e["lsn"] for e in consume(2)] == [first[0]["lsn"], first[1]["lsn"]]
    bad = _cli("subscription", "create", "x", "--vchannels", "subcli_v", "--start", "soon",
               "--endpoints", endpoints)  # fmt: skip
    assert bad.returncode == 2 and "--start: invalid value 'soon'" in bad.stderr
    missing = _cli("subscription", "describe", "nosuch", "--endpoints", endpoints)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_members_split_vchannels_and_a_member_that_lost_one_is_fenced(env) -> None:
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "submem", {"submem_a": 0, "submem_b": 0})
    wait_assigned(api_client, pchannel)

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            coordinator = client.coordinator
            await coordinator.create_subscription("pool", ["submem_a", "submem_b"])
            await _produce(client, "submem_a", [b"a%d" % i for i in range(4)])
            await _produce(client, "submem_b", [b"b%d" % i for i in range(4)])
            async with SubscriptionMember(client, "pool", "m1") as first:
                generation, held = await first.wait_assignment(TIMEOUT_S)
                assert held == ["submem_a", "submem_b"], held
                async with first.consumer("submem_a") as reader:
                    assert await _take(reader, 2) == [b"a0", b"a1"]
                old_generation = first.generation
                async with SubscriptionMember(client, "pool", "m2") as second:
                    # The coordinator rebalances: one vchannel each, new generations.
                    _, held_second = await second.wait_assignment(TIMEOUT_S)
                    assert len(held_second) == 1, held_second
                    _, held_first = await first.wait_assignment(TIMEOUT_S)
                    assert len(held_first) == 1 and held_first != held_second
                    assert first.generation > old_generation
                    # The old generation can never move a position again.
                    with pytest.raises(ChannelFencedError, match="generation"):
                        await coordinator.commit_subscription(
                            "pool",
                            {held_first[0]: (1, 0)},
                            member_id="m1",
                            generation=old_generation,
                        )
                    # Nor can a member commit a vchannel it no longer holds.
                    with pytest.raises(ChannelFencedError, match="does not hold"):
                        await coordinator.commit_subscription(
                            "pool",
                            {held_second[0]: (1, 0)},
                            member_id="m1",
                            generation=first.generation,
                        )
                    # Each reads its own vchannel, resuming where the subscription stands.
                    async with second.consumer(held_second[0]) as reader:
                        got = await _take(reader, 1)
                        assert got[0][:1] == held_second[0][-1].encode()
                # m2 left: m1 gets both vchannels back at a newer generation.
                _, held = await first.wait_assignment(TIMEOUT_S)
                assert held == ["submem_a", "submem_b"]
                # An unfenced commit is refused while the subscription has members.
                with pytest.raises(ChannelFencedError, match="must name its member"):
                    await coordinator.commit_subscription("pool", {"submem_a": (1, 0)})
            described = await coordinator.describe_subscription("pool")
            assert not described.subscription.members  # m1 left too

    asyncio.run(scenario())
