"""Time-tick packs on a real three-node cluster: packs are complete, contiguous and in
time-tick order against the acknowledged history (several producers, two pchannels); an idle
pchannel does not stall them; a restarted consumer resumes from the committed positions
without losing or repeating a pack; an owner killed with SIGKILL mid-stream changes nothing.

Every check compares the packs against what the producers had acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from raftwal.cli.main import main
from rpc.errors import InvalidArgumentError, NotFoundError, from_rpc_error
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.streaming_client import Pack, PackConsumer, Producer, StreamingClient
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import setup_channels, wait_assigned, wait_nodes_up
from tests.timing import scaled

pytestmark = pytest.mark.cluster

E = errors_pb2

TIMEOUT_S = scaled(float(os.environ.get("PACKS_TEST_TIMEOUT_S", 60)))
# vchannel -> pchannel index: two vchannels share pchannel 0, one is alone on pchannel 1.
LAYOUT = {"a": 0, "b": 0, "c": 1}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    settings = dict(os.environ)
    settings["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(tmp_path_factory.mktemp("packs"), settings) as running:
        yield running


def _channels(api_client: Api, prefix: str) -> tuple[dict[str, str], list[str]]:
    """Create the LAYOUT's vchannels as `<prefix>_<name>`: ({name: vchannel}, pchannels)."""
    names = {name: f"{prefix}_{name}" for name in LAYOUT}
    pchannels = setup_channels(api_client, prefix, {names[n]: i for n, i in LAYOUT.items()})
    for pchannel in pchannels:
        wait_assigned(api_client, pchannel)
    return names, pchannels


Acked = dict[tuple[str, int], tuple[int, bytes]]  # (vchannel, lsn) -> (time_tick, payload)


async def _produce(
    client: StreamingClient, acked: Acked, vchannels: list[str], tag: str, count: int
) -> None:
    """One producer: `count` messages round-robin over `vchannels`, recorded once acked."""
    async with Producer(client, retry_timeout_s=TIMEOUT_S, linger_ms=2) as producer:
        for index in range(count):
            vchannel = vchannels[index % len(vchannels)]
            payload = f"{tag}-{index}".encode()
            position = await producer.send(vchannel, payload)
            acked[(vchannel, position.lsn)] = (position.time_tick, payload)


def _check_packs(packs: list[Pack], acked: Acked, begin: int = 0) -> None:
    """Contiguous from `begin`, each in order and within its range, together exactly the
    acknowledged messages (so each holds every message of its range), positions right."""
    end = begin
    seen: dict[tuple[str, int], tuple[int, bytes]] = {}
    positions: dict[str, int] = {}
    for pack in packs:
        assert pack.begin_time_tick == end < pack.end_time_tick, (pack.begin_time_tick, end)
        order = [(m.time_tick, m.vchannel, m.lsn) for m in pack.messages]
        assert order == sorted(order)
        for message in pack.messages:
            assert pack.begin_time_tick < message.time_tick <= pack.end_time_tick
            key = (message.vchannel, message.lsn)
            assert key not in seen, f"{key} in two packs"
            seen[key] = (message.time_tick, message.payload)
            positions[message.vchannel] = message.lsn
        for vchannel, (lsn, tick) in pack.end_positions.items():
            assert tick == pack.end_time_tick
            assert lsn == positions.get(vchannel, pack.start_positions[vchannel][0])
        end = pack.end_time_tick
    missing = sorted(set(acked) - set(seen))
    extra = sorted(set(seen) - set(acked))
    assert not missing and not extra, (missing[:5], extra[:5])
    assert seen == acked


async def _read_until(
    consumer: PackConsumer, packs: list[Pack], done, timeout_s: float = TIMEOUT_S
) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + scaled(timeout_s)
    while not done():
        remaining = deadline - time.monotonic()
        try:
            packs.append(await asyncio.wait_for(anext(consumer), max(0.001, remaining)))
        except TimeoutError:
            raise AssertionError(
                f"packs did not arrive in {timeout_s} s ({len(packs)} read, "
                f"{_count(packs)} messages; {consumer.status()})"
            ) from None


def _count(packs: list[Pack]) -> int:
    return sum(len(p) for p in packs)


def test_packs_complete_and_in_order_with_several_producers(env) -> None:
    cluster, api_client = env
    names, _ = _channels(api_client, "pk")
    vchannels = sorted(names.values())

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("pk_sub", vchannels)
            acked: Acked = {}
            packs: list[Pack] = []
            async with PackConsumer(client, "pk_sub") as consumer:
                producing = asyncio.gather(
                    *(
                        _produce(client, acked, vchannels[i:] + vchannels[:i], f"p{i}", 200)
                        for i in range(3)
                    )
                )
                reading = asyncio.ensure_future(
                    _read_until(consumer, packs, lambda: _count(packs) >= 600)
                )
                await asyncio.wait_for(producing, TIMEOUT_S)
                await reading
            assert len(acked) == 600
            _check_packs(packs, acked)
            # Concurrent producers and an interval of 100 ms: more than one pack.
            assert len(packs) > 1
            # Closing committed the last pack: each vchannel's position is its last lsn, at
            # the end tick of the pack committed when it moved; the highest is the last
            # pack's end, where a restart resumes.
            described = await client.coordinator.describe_subscription("pk_sub")
            ends = {p.end_time_tick for p in packs}
            ticks = []
            for vchannel in vchannels:
                last = max(lsn for (v, lsn) in acked if v == vchannel)
                (holder,) = [
                    p
                    for p in packs
                    if (vchannel, last) in {(m.vchannel, m.lsn) for m in p.messages}
                ]
                position = described.subscription.positions[vchannel]
                assert position.lsn == last
                assert position.time_tick in ends and position.time_tick >= holder.end_time_tick
                ticks.append(position.time_tick)
            assert max(ticks) == packs[-1].end_time_tick

    asyncio.run(scenario())


def test_an_idle_pchannel_does_not_stall_packs(env) -> None:
    """Only vchannel a (pchannel 0) is written; c's pchannel stays silent, so each pack can
    be cut only once c's owner has appended a time-tick entry past the message."""
    cluster, api_client = env
    names, _ = _channels(api_client, "pkidle")

    async def scenario() -> list[float]:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription(
                "pkidle_sub", [names["a"], names["c"]], start="latest"
            )
            delays = []
            async with (
                PackConsumer(client, "pkidle_sub", time_tick_interval_ms=100) as consumer,
                Producer(client, retry_timeout_s=TIMEOUT_S, linger_ms=0) as producer,
            ):
                for index in range(15):
                    await producer.send(names["a"], b"x%d" % index)
                    acked_at = time.monotonic()
                    pack = await asyncio.wait_for(anext(consumer), TIMEOUT_S)
                    delays.append(time.monotonic() - acked_at)
                    assert [m.payload for m in pack.messages] == [b"x%d" % index]
                    await asyncio.sleep(0.05)
            return delays

    delays = asyncio.run(scenario())
    median = statistics.median(delays)
    print(
        f"idle-pchannel pack delay: median {median * 1000:.0f} ms, max {max(delays) * 1000:.0f} ms"
    )
    # The bound is the interval plus a commit; generous for a loaded two-core machine.
    assert median < 0.6, delays
    assert max(delays) < 5.0, delays


def test_a_restart_resumes_from_committed_positions(env) -> None:
    cluster, api_client = env
    names, _ = _channels(api_client, "pkre")
    vchannels = sorted(names.values())

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("pkre_sub", vchannels)
            acked: Acked = {}
            # Session 1 reads everything produced so far and stops cleanly: all of it is
            # committed.
            await _produce(client, acked, vchannels, "one", 60)
            one: list[Pack] = []
            async with PackConsumer(client, "pkre_sub", commit_every=1000) as consumer:
                await _read_until(consumer, one, lambda: _count(one) >= 60)
            # Session 2 reads two rounds, then fails on its last pack: that one is not
            # committed and comes again.
            two: list[Pack] = []
            with pytest.raises(RuntimeError, match="boom"):
                async with PackConsumer(client, "pkre_sub") as consumer:
                    for round_ in range(2):
                        await _produce(client, acked, vchannels, f"two{round_}", 30)
                        await _read_until(consumer, two, lambda: _count(one + two) >= len(acked))
                    assert two[0].begin_time_tick == one[-1].end_time_tick
                    raise RuntimeError("boom")
            assert len(two) >= 2
            # More messages while nobody reads; session 3 reads everything left.
            await _produce(client, acked, vchannels, "late", 30)
            three: list[Pack] = []
            async with PackConsumer(client, "pkre_sub") as consumer:
                await _read_until(
                    consumer, three, lambda: _count(one + two[:-1] + three) >= len(acked)
                )
            # It began where the last committed pack ended, with what the failed pack held.
            assert three[0].begin_time_tick == two[-2].end_time_tick
            failed = {(m.vchannel, m.lsn) for m in two[-1].messages}
            assert failed <= {(m.vchannel, m.lsn) for m in three[0].messages}
            _check_packs(one + two[:-1] + three, acked)
            # Nothing more: no pack is repeated once everything is committed.
            async with PackConsumer(client, "pkre_sub") as consumer:
                assert consumer.begin_time_tick == three[-1].end_time_tick
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(anext(consumer), 1.0)

    asyncio.run(scenario())


def test_owner_killed_mid_stream_keeps_packs_complete_and_in_order(env) -> None:
    cluster, api_client = env
    names, pchannels = _channels(api_client, "pkkill")
    vchannels = sorted(names.values())
    owner, term, _ = wait_assigned(api_client, pchannels[0])

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("pkkill_sub", vchannels)
            acked: Acked = {}
            packs: list[Pack] = []
            # Commits every 20 ms: some land while pchannel 0 has no owner (deferred).
            async with PackConsumer(
                client, "pkkill_sub", commit_interval_ms=20, retry_timeout_s=TIMEOUT_S
            ) as consumer:
                producing = asyncio.ensure_future(
                    asyncio.gather(
                        *(
                            _produce(client, acked, vchannels[i:] + vchannels[:i], f"k{i}", 150)
                            for i in range(2)
                        )
                    )
                )
                reading = asyncio.ensure_future(
                    _read_until(consumer, packs, lambda: _count(packs) >= 300)
                )
                deadline = time.monotonic() + TIMEOUT_S
                while len(acked) < 60 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                cluster.kill(owner)
                await asyncio.wait_for(producing, TIMEOUT_S * 2)
                await asyncio.wait_for(reading, TIMEOUT_S * 2)
            assert len(acked) == 300
            _check_packs(packs, acked)
            print(f"owner kill: {len(packs)} packs, {consumer.deferred_commits} deferred commits")
            # Failover happened under the consumer: pchannel 0 has a newer term now.
            await asyncio.to_thread(wait_assigned, api_client, pchannels[0], min_term=term + 1)

    try:
        asyncio.run(scenario())
    finally:
        cluster.start_node(owner)
        wait_nodes_up(api_client)


def test_the_cli_prints_packs_and_resumes(env, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, api_client = env
    names, _ = _channels(api_client, "pkcli")
    endpoints = ",".join(cluster.endpoints)

    async def setup() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("pkcli_sub", [names["a"], names["c"]])
            await _produce(client, {}, [names["a"], names["c"]], "cli", 6)

    asyncio.run(setup())

    def consume(*extra: str) -> tuple[int, str, str]:
        # In process (the console script is `raftwal.cli.main:main`): no interpreter start
        # per call on a loaded machine.
        code = main(
            ["consume", "--subscription", "pkcli_sub", "--packs", "--timeout-s", "3",
             "--endpoints", endpoints, *extra]
        )  # fmt: skip
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = consume("--json")
    assert code == 0, err
    packs = [json.loads(line) for line in out.splitlines()]
    ticks = [int(m["time_tick"]) for p in packs for m in p["messages"]]
    assert len(ticks) == 6 and ticks == sorted(ticks)
    assert {m["vchannel"] for p in packs for m in p["messages"]} == {names["a"], names["c"]}
    for before, pack in zip([None, *packs], packs, strict=False):
        begin, end = int(pack["begin_time_tick"]), int(pack["end_time_tick"])
        assert before is None or begin == int(before["end_time_tick"])
        assert all(begin < int(m["time_tick"]) <= end for m in pack["messages"])
    # Committed: a second run has nothing left, in text mode too.
    code, out, err = consume()
    assert code == 0 and "0 pack(s), 0 message(s)" in err, (out, err)
    code, _, err = consume("--vchannel", names["a"])
    assert code == 2 and "--packs reads every vchannel" in err
    code, _, err = consume("--time-tick-interval-ms", "0")
    assert code == 2 and "invalid --time-tick-interval-ms (0; expected 1..60000)" in err


def test_a_commit_while_the_owner_is_replaced_waits_for_the_new_owner(env) -> None:
    """The coordinator checks a commit against the pchannel's owner; while that owner is
    dead and not yet replaced the check fails (UNAVAILABLE / NOT_OWNER): the consumer
    retries instead of failing, and the position lands once the new owner serves."""
    cluster, api_client = env
    names, pchannels = _channels(api_client, "pkfo")
    owner, term, _ = wait_assigned(api_client, pchannels[0])

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("pkfo_sub", [names["a"]])
            acked: Acked = {}
            await _produce(client, acked, [names["a"]], "fo", 5)
            packs: list[Pack] = []
            async with PackConsumer(client, "pkfo_sub", commit_interval_ms=3_600_000) as reader:
                await _read_until(reader, packs, lambda: _count(packs) >= 5)
                cluster.kill(owner)
                await reader.commit()
            _check_packs(packs, acked)
            described = await client.coordinator.describe_subscription("pkfo_sub")
            assert described.subscription.positions[names["a"]].lsn == max(lsn for _, lsn in acked)

    try:
        asyncio.run(scenario())
        wait_assigned(api_client, pchannels[0], min_term=term + 1)
    finally:
        cluster.start_node(owner)
        wait_nodes_up(api_client)


def test_bad_pack_requests_get_a_clear_error(env) -> None:
    cluster, api_client = env
    names, pchannels = _channels(api_client, "pkbad")
    _, _, address = wait_assigned(api_client, pchannels[0])
    # The watermark interval is checked by the node: INVALID_ARGUMENT with what was got.
    for interval in (-1, 60_001):
        request = wire.ConsumeRequest(vchannel=names["a"], time_tick_interval_ms=interval)
        for _ in range(20):  # bounded: a node restarted by an earlier test may still start
            with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
                list(
                    streaming_pb2_grpc.StreamingNodeStub(channel).Consume(
                        request, timeout=scaled(5)
                    )
                )
            info = from_rpc_error(raised.value)
            if info.code != E.UNAVAILABLE:
                break
            time.sleep(0.5)
            _, _, address = wait_assigned(api_client, pchannels[0])
        assert info.code == E.INVALID_ARGUMENT
        assert f"time_tick_interval_ms ({interval}; expected 0..60000)" in info.message

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("pkbad_sub", [names["a"]])
            with pytest.raises(NotFoundError):
                await PackConsumer(client, "nosuch").start()
            with pytest.raises(InvalidArgumentError, match=r"\['pkbad_c'\]"):
                await PackConsumer(client, "pkbad_sub", vchannels=[names["c"]]).start()
            with pytest.raises(InvalidArgumentError, match="from_lsn given to a PackConsumer"):
                PackConsumer(client, "pkbad_sub", from_lsn=3)
            with pytest.raises(InvalidArgumentError, match="time_tick_interval_ms"):
                PackConsumer(client, "pkbad_sub", time_tick_interval_ms=0)

    asyncio.run(scenario())
