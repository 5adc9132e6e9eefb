"""The WAL contract, run once per implementation (`segments`, `local`, `jetstream`): a
`ChannelOwner` (the adaptor) over real `PChannelLog`s with fsync on, and for `jetstream` a
real nats-server with JetStream. What every implementation must give the adaptor:

- an acknowledged batch is read back, whole, in LSN order, with rising time ticks;
- a new owner at a higher term keeps every acknowledged batch and continues the LSNs and
  time ticks above them;
- an owner whose term was superseded gets nothing acknowledged any more (fencing);
- an idempotent producer's retry is answered from the log, never written twice, also after
  a failover; `expected_last_lsn` holds under every implementation.

`segments` recovers from its replicas (a loopback transport doing what the Replication
service does), `local` from the previous owner's one copy, `jetstream` from the stream.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from rpc.protos import errors_pb2 as E
from tests.natsserver import NatsServer, nats_binary
from tests.timing import scaled
from tests.wal.test_wal_owner_recovery import Loopback
from wal_segments.catalog import Catalog
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import PChannelLog
from wal_segments.owner import ChannelOwner, Message, OwnerConfig, WalError
from wal_segments.walimpls import registry
from wal_segments.walimpls.api import ConfigError

NODES = ("n1", "n2", "n3")
IMPLS = ("segments", "local", "jetstream")
_prefixes = itertools.count(1)


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory):
    if nats_binary() is None:
        pytest.skip("nats-server is not installed (scripts/install-nats.sh)")
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


class Cluster:
    """Three nodes' logs of one pchannel and the implementation's openers (one per node,
    as each node's data worker has its own)."""

    def __init__(
        self, impl: str, tmp_path: Path, nats_url: str, extra: dict[str, str] | None = None
    ) -> None:
        self.impl = impl
        self.tmp_path = tmp_path
        self.pchannel = f"p_{impl}"
        self.logs: dict[str, PChannelLog] = {}
        config = {}
        if impl == "jetstream":
            config = {"url": nats_url, "stream_prefix": f"T{next(_prefixes)}x{tmp_path.name[-8:]}"}
            config["stream_prefix"] = "".join(
                c if c.isalnum() else "_" for c in config["stream_prefix"]
            )[:32]
            config.update(extra or {})
        self.config = config
        self.openers = {n: registry.builder(impl).build(config) for n in NODES}
        self.transport = Loopback(self.logs)
        self.owners: list[ChannelOwner] = []

    async def open(self) -> None:
        for node in NODES:
            root = self.tmp_path / node
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.logs[node] = await PChannelLog.open(
                root / "wal",
                self.pchannel,
                Catalog(root / "catalog.db"),
                parse_fsync_policy("always"),
            )

    async def owner(self, node: str, term: int, previous: str = "") -> ChannelOwner:
        wal = await self.openers[node].open(self.pchannel, 0)
        replicated = self.impl == "segments"
        owner = ChannelOwner(
            pchannel=self.pchannel,
            term=term,
            node_id=node,
            replica_node_ids=[n for n in NODES if n != node] if replicated else [],
            # `local`: the one copy is the previous owner's
            stable_replica_node_ids=[previous] if self.impl == "local" and previous else [],
            log=self.logs[node],
            transport=self.transport,
            proposer=self.transport,
            config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0),
            wal=wal,
        )
        self.owners.append(owner)
        owner.start()
        await asyncio.wait_for(owner.ready.wait(), scaled(30))
        return owner

    async def close_openers(self) -> None:
        for owner in self.owners:
            await owner.close()
        for opener in self.openers.values():
            await opener.close()

    async def close(self) -> None:
        await self.close_openers()
        for log in self.logs.values():
            await log.close()
            log.catalog.close()


@pytest.fixture(params=IMPLS)
async def cluster(request, tmp_path):
    url = ""
    if request.param == "jetstream":
        url = request.getfixturevalue("nats_server").url
    made = Cluster(request.param, tmp_path, url)
    await made.open()
    yield made
    await made.close()


def batch(tag: str, count: int = 3) -> list[Message]:
    return [Message(1, 1, payload=f"{tag}-{k}".encode()) for k in range(count)]


def payloads(log: PChannelLog) -> list[tuple[int, bytes]]:
    return [
        (e.lsn, e.payload) for e in log.iter_entries(log.first_lsn, log.last_lsn) if e.vchannel_id
    ]


async def test_acknowledged_batches_read_back_in_order_with_rising_ticks(cluster):
    owner = await cluster.owner("n1", 1)
    acked: list[tuple[int, int]] = []
    for k in range(20):
        positions, duplicate = await owner.write(batch(f"b{k}"))
        assert not duplicate
        acked.extend(positions)
    lsns = [lsn for lsn, _ in acked]
    ticks = [tick for _, tick in acked]
    assert lsns == sorted(set(lsns)) and lsns == list(range(lsns[0], lsns[0] + 60))
    assert ticks == sorted(set(ticks))
    assert owner.committed_lsn >= lsns[-1]
    written = payloads(cluster.logs["n1"])
    assert [p for _, p in written] == [f"b{k}-{j}".encode() for k in range(20) for j in range(3)]
    assert [lsn for lsn, _ in written] == lsns
    others = [cluster.logs[n].last_lsn for n in ("n2", "n3")]
    if cluster.impl == "segments":
        assert min(others) >= lsns[-1] or owner.committed_lsn >= lsns[-1]
    else:
        # `local` and `jetstream` replicate to no node
        assert others == [0, 0]
    if cluster.impl == "jetstream":
        # every batch is a record of the stream: the fence, the term start and producer
        # state, then the 20 batches
        wal = owner.wal
        assert await wal.last_sequence() >= 21
        records = [r async for r, _ in wal.scan(1, await wal.last_sequence())]
        assert records[0].fence and records[0].term == 1
        data = [r for r in records if not r.fence]
        assert data[-1].last_lsn == lsns[-1]
        assert [r.first_lsn for r in data] == sorted(r.first_lsn for r in data)


async def test_a_new_owner_keeps_every_acknowledged_batch_and_fences_the_old(cluster):
    first = await cluster.owner("n1", 1)
    acked = []
    for k in range(10):
        acked.extend((await first.write(batch(f"a{k}")))[0])
    # `local` keeps its one copy on the owner: the next owner is the same node (a restart)
    # or another node that adopts that copy; here another node for all three.
    second = await cluster.owner("n2", 2, previous="n1")
    log = cluster.logs["n2"]
    kept = {lsn: p for lsn, p in payloads(log)}
    for lsn, _ in acked:
        assert lsn in kept
    assert [kept[lsn] for lsn, _ in acked] == [
        f"a{k}-{j}".encode() for k in range(10) for j in range(3)
    ]
    # The old owner can get nothing acknowledged any more.
    with pytest.raises(WalError) as raised:
        await asyncio.wait_for(first.write(batch("stale")), scaled(15))
    assert raised.value.info.code in (E.CHANNEL_FENCED, E.ON_SHUTDOWN)
    # The new owner continues above the acknowledged LSNs and ticks.
    positions, _ = await second.write(batch("next"))
    assert positions[0][0] > acked[-1][0] and positions[0][1] > acked[-1][1]
    assert b"stale-0" not in {p for _, p in payloads(log)}


async def test_a_producer_retry_is_answered_from_the_log_also_after_a_failover(cluster):
    owner = await cluster.owner("n1", 1)
    positions, duplicate = await owner.write(batch("once"), producer_id="prod", sequence=7)
    assert not duplicate
    again, duplicate = await owner.write(batch("once"), producer_id="prod", sequence=7)
    assert duplicate and again == positions
    second = await cluster.owner("n2", 2, previous="n1")
    after, duplicate = await second.write(batch("once"), producer_id="prod", sequence=7)
    assert duplicate and after == positions
    assert [p for _, p in payloads(cluster.logs["n2"])].count(b"once-0") == 1


async def test_expected_last_lsn_holds(cluster):
    owner = await cluster.owner("n1", 1)
    positions, _ = await owner.write(batch("x", 1))
    last = positions[-1][0]
    await owner.write(batch("y", 1), expected_last_lsn=last)
    with pytest.raises(WalError) as raised:
        await owner.write(batch("z", 1), expected_last_lsn=last)
    assert raised.value.info.code == E.UNMATCHED_CHANNEL_TERM


def test_registry_knows_the_three_and_refuses_bad_config():
    assert registry.names() == ["jetstream", "local", "segments"]
    assert registry.validate("", {}) == {}
    with pytest.raises(ConfigError, match="unknown WAL implementation 'kafka'"):
        registry.validate("kafka", {})
    with pytest.raises(ConfigError, match="expected none"):
        registry.validate("local", {"x": "1"})
    with pytest.raises(ConfigError, match="jetstream needs url"):
        registry.validate("jetstream", {})
    with pytest.raises(ConfigError, match="invalid jetstream url"):
        registry.validate("jetstream", {"url": "nats://user:secret@h:1"})
    with pytest.raises(ConfigError, match=r"invalid jetstream replicas \('9'; expected 1..5\)"):
        registry.validate("jetstream", {"url": "nats://127.0.0.1:4222", "replicas": "9"})
    with pytest.raises(ConfigError, match="is not a readable file"):
        registry.validate("jetstream", {"url": "nats://h:1", "credentials": "/nonexistent.creds"})


async def _all_there(log: PChannelLog, acked: list[tuple[int, int]], tag: str, batches: int):
    kept = dict(payloads(log))
    assert [kept.get(lsn) for lsn, _ in acked] == [
        f"{tag}{k}-{j}".encode() for k in range(batches) for j in range(3)
    ]


async def test_a_killed_or_paused_nats_server_stops_the_owner_and_a_new_term_recovers(
    tmp_path,
):
    """The NATS server killed (SIGKILL) under an owner, then paused (SIGSTOP): the owner
    stops with a typed error (ON_SHUTDOWN naming the jetstream WAL) instead of hanging or
    acknowledging, and a new owner at the next term, once the server is back, recovers every
    acknowledged batch from the stream."""
    if nats_binary() is None:
        pytest.skip("nats-server is not installed (scripts/install-nats.sh)")
    server = NatsServer(tmp_path / "nats")
    server.start()
    cluster = Cluster("jetstream", tmp_path, server.url, {"timeout_ms": "1000"})
    await cluster.open()
    try:
        first = await cluster.owner("n1", 1)
        acked = []
        for k in range(10):
            acked.extend((await first.write(batch(f"a{k}")))[0])
        server.kill()
        with pytest.raises(WalError) as raised:
            for k in range(100):
                await asyncio.wait_for(first.write(batch(f"lost{k}")), scaled(15))
        assert raised.value.info.code == E.ON_SHUTDOWN, raised.value.info
        assert "jetstream WAL unavailable" in raised.value.info.message
        server.start()
        second = await cluster.owner("n2", 2)
        await _all_there(cluster.logs["n2"], acked, "a", 10)
        more = []
        for k in range(5):
            more.extend((await second.write(batch(f"b{k}")))[0])
        server.pause()
        try:
            with pytest.raises(WalError) as raised:
                await asyncio.wait_for(second.write(batch("paused")), scaled(15))
            assert raised.value.info.code == E.ON_SHUTDOWN
            assert "no ack within 1 s" in raised.value.info.message, raised.value.info.message
        finally:
            server.resume()
        third = await cluster.owner("n3", 3)
        await _all_there(cluster.logs["n3"], acked, "a", 10)
        await _all_there(cluster.logs["n3"], more, "b", 5)
        positions, _ = await third.write(batch("c"))
        assert positions[0][0] > more[-1][0]
    finally:
        await cluster.close()
        server.stop()


async def test_a_stream_that_starts_after_a_switch_keeps_the_log_before_it(tmp_path, nats_server):
    """A pchannel switched from segments to jetstream (an AlterWAL's checkpoint): the
    stream starts at the checkpoint, and every later jetstream owner keeps the log before
    it, on the same node (a restart) and on another one (which copies it from the owner
    that flushed)."""
    segments = Cluster("segments", tmp_path / "s", "")
    segments.pchannel = "p_switch"
    await segments.open()
    try:
        owner = await segments.owner("n1", 1)
        acked = []
        for k in range(5):
            acked.extend((await owner.write(batch(f"s{k}")))[0])
        await owner.seal_now()
        await owner.close()
        checkpoint = (segments.logs["n1"].last_lsn, segments.logs["n1"].last_term)
        jetstream = Cluster("jetstream", tmp_path / "j", nats_server.url)
        jetstream.pchannel, jetstream.logs, jetstream.transport = (
            "p_switch",
            segments.logs,
            segments.transport,
        )

        async def owner_at(node: str, term: int) -> ChannelOwner:
            wal = await jetstream.openers[node].open("p_switch", 7)
            made = ChannelOwner(
                pchannel="p_switch",
                term=term,
                node_id=node,
                replica_node_ids=[],
                log=segments.logs[node],
                transport=segments.transport,
                proposer=segments.transport,
                config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05),
                wal=wal,
                checkpoint=checkpoint,
                previous_owner_node_id="n1" if node != "n1" else "",
            )
            jetstream.owners.append(made)
            made.start()
            await asyncio.wait_for(made.ready.wait(), scaled(30))
            return made

        first = await owner_at("n1", 2)
        for k in range(5):
            acked.extend((await first.write(batch(f"j{k}")))[0])
        await first.close()
        again = await owner_at("n1", 3)  # the same node, a restart
        await _all_there_mixed(segments.logs["n1"], acked)
        await again.close()
        await owner_at("n3", 4)  # another node: it copies the prefix from n1
        await _all_there_mixed(segments.logs["n3"], acked)
        await jetstream.close_openers()
    finally:
        await segments.close()


async def _all_there_mixed(log: PChannelLog, acked: list[tuple[int, int]]) -> None:
    kept = dict(payloads(log))
    expected = [f"{t}{k}-{j}".encode() for t in "sj" for k in range(5) for j in range(3)]
    assert [kept.get(lsn) for lsn, _ in acked] == expected


async def test_a_pipelined_writer_stores_nothing_after_a_newer_owners_fence(nats_server, tmp_path):
    """Found by `raftwal chaos --wal jetstream --seed 5101` (a record of term 9 stored after
    term 10's records; the next owner then dropped its log up to it). An owner pipelines
    its publishes, each expecting the sequence before it. When a newer owner's fence lands
    between two of them, the first is refused, but the next one expects exactly the
    fence's sequence: with the sequence check alone it is stored after the fence. Here the
    old writer keeps a pipeline of records going while the new one fences, several times
    over; nothing of the old term may follow the new term's fence in the stream."""
    prefix = "".join(c if c.isalnum() else "_" for c in f"Race{tmp_path.name[-8:]}")
    config = {"url": nats_server.url, "stream_prefix": prefix}
    openers = [registry.builder("jetstream").build(config) for _ in range(2)]
    try:
        for round_ in range(8):
            await _fence_under_a_pipeline(openers, f"race{round_}")
    finally:
        for opener in openers:
            await opener.close()


async def _fence_under_a_pipeline(openers, pchannel: str) -> None:
    from wal_segments.walimpls.api import Record

    old = await openers[0].open(pchannel, 0)
    new = await openers[1].open(pchannel, 0)
    old_term, new_term = 1, 2
    await old.fence(old_term, await old.tail())
    stopped = asyncio.Event()
    old.on_durable(lambda value: stopped.set() if isinstance(value, Exception) else None)
    lsn = 0

    def push(count: int) -> None:
        nonlocal lsn
        for _ in range(count):
            lsn += 1
            old.append(Record(lsn, lsn, old_term, old_term, b"x" * 64))

    push(50)
    # The new owner fences while the old one's pipeline runs (retrying, as recovery does,
    # while the stream grows under it).
    after = await new.tail()
    for _ in range(200):
        push(5)
        fenced = await new.fence(new_term, after)
        if fenced is after:
            break
        after = fenced
    else:
        pytest.fail("the new owner's fence never landed")
    push(50)
    await asyncio.wait_for(stopped.wait(), scaled(10))
    # The stream in order: no record of the old term after the new term's fence.
    seen_fence = False
    async for record, _ in new.scan(1, await new.last_sequence()):
        if record.fence and record.term == new_term:
            seen_fence = True
        elif seen_fence:
            assert record.term >= new_term, (pchannel, record)
    assert seen_fence, pchannel
    await old.close()
    await new.close()


async def test_a_stored_record_that_does_not_continue_the_log_is_not_adopted(nats_server, tmp_path):
    """The second half of what `raftwal chaos --wal jetstream --seed 5101` found: a new
    owner met a stored record that did not continue the log it had adopted, started its
    log over at that record, and so dropped every entry before it (acknowledged ones
    included). Here a record with a gap is put in the stream after acknowledged batches;
    the next owner must refuse it (its recovery is retried, it never becomes ready on that
    stream) and keep every acknowledged entry."""
    from wal_segments.format import Entry, MsgType, encode_batch
    from wal_segments.walimpls.api import Record

    cluster = Cluster("jetstream", tmp_path, nats_server.url)
    await cluster.open()
    try:
        first = await cluster.owner("n1", 1)
        acked = []
        for k in range(3):
            acked.extend((await first.write(batch(f"a{k}")))[0])
        await first.close()
        last = cluster.logs["n1"].last_lsn
        # A writer at term 1 leaves a record at last + 2: lsn last + 1 is missing.
        stray = await cluster.openers["n3"].open(cluster.pchannel, 0)
        await stray.fence(1, await stray.tail())
        stored = asyncio.Event()
        stray.on_durable(lambda value: None if isinstance(value, Exception) else stored.set())
        gap = encode_batch(
            [
                Entry(
                    lsn=last + 2,
                    term=1,
                    time_tick=acked[-1][1] + 1_000_000,
                    msg_type=int(MsgType.MESSAGE),
                    vchannel_id=1,
                    payload=b"stray",
                )
            ]
        )
        stray.append(Record(last + 2, last + 2, 1, 1, gap.data))
        await asyncio.wait_for(stored.wait(), scaled(10))
        await stray.close()

        wal = await cluster.openers["n2"].open(cluster.pchannel, 0)
        second = ChannelOwner(
            pchannel=cluster.pchannel,
            term=2,
            node_id="n2",
            replica_node_ids=[],
            log=cluster.logs["n2"],
            transport=cluster.transport,
            proposer=cluster.transport,
            config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0),
            wal=wal,
        )
        cluster.owners.append(second)
        second.start()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(second.ready.wait(), scaled(3))
        kept = dict(payloads(cluster.logs["n2"]))
        assert [kept.get(lsn) for lsn, _ in acked] == [
            f"a{k}-{j}".encode() for k in range(3) for j in range(3)
        ]
        assert b"stray" not in kept.values()
    finally:
        await cluster.close()
