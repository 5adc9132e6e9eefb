"""Spark reads of committed segments against a real three-node cluster and a real
SparkSession: the rows are exactly the acknowledged messages of committed segments, a read
at a revision repeats while producers keep writing, filters (pushed down and not), a node
down, transactions all-or-nothing, and a segment corrupted on every replica fails the job
naming it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

import spark_connector
from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from spark_connector.fetch import RowFilter, SegmentUnreadable, read_slice
from spark_connector.options import parse_options
from spark_connector.plan import SegmentSlice, connector_message
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, setup_channels, wait_assigned
from tests.timing import scaled
from wal_segments.segment import segment_file_name

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

SEGMENT_BYTES = 32 * 1024


class Env:
    def __init__(self, local: dev.LocalCluster, client: Api, pchannels: list[str]) -> None:
        self.local = local
        self.client = client
        self.pchannels = pchannels
        self.history: dict[str, History] = {"orders": History(), "payments": History()}
        self.producers: dict[str, Producer] = {}

    @property
    def endpoints(self) -> str:
        return ",".join(self.local.endpoints)

    def produce(self, vchannel: str, pchannel: str, batches: int, per_batch: int = 20) -> None:
        producer = self.producers.get(vchannel)
        if producer is None:
            producer = self.producers[vchannel] = Producer(self.client, pchannel, f"p-{vchannel}")
        history = self.history[vchannel]
        for _ in range(batches):
            start = len(history.acked)
            payloads = [
                f"{vchannel}-{start + i:06d}-".encode() + b"x" * 80 for i in range(per_batch)
            ]
            assert producer.send(vchannel, payloads, history), "produce not acknowledged"

    def segments(self, as_of: int = 0) -> api.ListSegmentsResponse:
        return self.client.call("ListSegments", api.ListSegmentsRequest(as_of_revision=as_of))

    def committed_through(self, pchannel: str, segments: api.ListSegmentsResponse) -> int:
        return max((s.last_lsn for s in segments.segments if s.pchannel == pchannel), default=0)

    def read(self, spark: Any, **options: str) -> Any:
        reader = spark.read.format("raftwal").option("endpoints", self.endpoints)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    directory: Path = tmp_path_factory.mktemp("spark")
    environ = dict(os.environ)
    environ["RAFTWAL_SEGMENT_MAX_BYTES"] = str(SEGMENT_BYTES)
    local = dev.up(directory, 3, timeout_s=60, env=environ)
    client = Api(local.endpoints)
    try:
        pchannels = setup_channels(client, "sp", {"orders": 0, "payments": 1})
        for pchannel in pchannels:
            wait_assigned(client, pchannel)
        state = Env(local, client, pchannels)
        state.produce("orders", pchannels[0], 40)
        state.produce("payments", pchannels[1], 25)
        _settle(state)
        yield state
    finally:
        for producer in getattr(locals().get("state"), "producers", {}).values():
            producer.close()
        client.close()
        local.stop_all()


def _wait_committed(env: Env, pchannel: str, lsn: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        if env.committed_through(pchannel, env.segments()) >= lsn:
            return
        time.sleep(0.2)
    raise AssertionError(f"{pchannel}: no committed segment reached lsn {lsn} in {timeout_s} s")


def _settle(env: Env, timeout_s: float = 30.0) -> None:
    """Until sealed segments are committed: the manifest stops growing for 1.5 s."""
    deadline = time.monotonic() + scaled(timeout_s)
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(env.segments().segments)
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= 1.5:
            return
        time.sleep(0.2)


def _rows(df: Any) -> list[tuple[str, int, bytes]]:
    return sorted(
        (r.vchannel, r.lsn, bytes(r.payload))
        for r in df.select("vchannel", "lsn", "payload").collect()
    )


def _expected(env: Env, vchannel: str, through: int) -> list[tuple[str, int, bytes]]:
    return sorted(
        (vchannel, a.lsn, a.payload) for a in env.history[vchannel].acked if a.lsn <= through
    )


def test_rows_equal_the_acknowledged_messages_of_committed_segments(spark, env) -> None:
    # A few messages that stay in the open segments: the fixture's own tail may have been
    # sealed already by a pchannel move (a new term seals the inherited segment).
    env.produce("orders", env.pchannels[0], 1)
    env.produce("payments", env.pchannels[1], 1)
    _settle(env)  # a roll those caused has committed before the manifest is compared
    segments = env.segments()
    assert len(segments.segments) >= 4, "the fixture should commit several segments"
    # sealOpenSegments=false: committed segments only, as they stand (the open ones unread).
    df = env.read(spark, msgTypes="message", sealOpenSegments="false")
    assert [f.name for f in df.schema.fields] == [
        "pchannel", "vchannel", "segment_id", "lsn", "term", "time_tick", "msg_type",
        "key", "payload", "txn_id", "broadcast_id", "properties",
    ]  # fmt: skip
    rows = _rows(df)
    expected: list[tuple[str, int, bytes]] = []
    for vchannel, pchannel in (("orders", env.pchannels[0]), ("payments", env.pchannels[1])):
        through = env.committed_through(pchannel, segments)
        expected += _expected(env, vchannel, through)
        acked_after = [a for a in env.history[vchannel].acked if a.lsn > through]
        # Messages in the open segment exist (the fixture leaves some) and are not read.
        assert acked_after, "the open segment should hold acknowledged messages"
    assert rows == sorted(expected)
    # Nothing duplicated, nothing from the open segments.
    assert len({(v, lsn) for v, lsn, _ in rows}) == len(rows)
    # Per-segment counts agree with the manifest (data rows <= entries in the segment).
    by_segment = {
        (r.pchannel, r.segment_id): r["count"]
        for r in df.groupBy("pchannel", "segment_id").count().collect()
    }
    manifest = {(s.pchannel, s.segment_id): s for s in segments.segments}
    assert set(by_segment) <= set(manifest)
    for key, count in by_segment.items():
        assert count <= manifest[key].count
    # The WAL's own bookkeeping never leaks into properties.
    leaked = df.where("map_contains_key(properties, 'rw.seq')").count()
    assert leaked == 0
    # Control entries (term start, seal markers) are hidden by default.
    types = {
        r.msg_type
        for r in env.read(spark, sealOpenSegments="false").select("msg_type").distinct().collect()
    }
    assert types == {"message"}


def test_a_read_sees_everything_acknowledged_before_it(spark, env) -> None:
    # Produce, then read at once: by default the read seals the open segments first, so it
    # gets every acknowledged message, not only those of segments sealed by size or age.
    (pchannel,) = setup_channels(env.client, "fresh", {"fresh_v": 0})
    wait_assigned(env.client, pchannel)
    env.history["fresh_v"] = History()
    env.produce("fresh_v", pchannel, 5)
    acked = sorted(("fresh_v", a.lsn, a.payload) for a in env.history["fresh_v"].acked)
    assert len(acked) == 100
    assert _rows(env.read(spark, vchannels="fresh_v", sealOpenSegments="false")) == []
    df = env.read(spark, vchannels="fresh_v")
    assert _rows(df) == acked
    # The snapshot it read is repeatable by its revision.
    revision = str(env.segments().revision)
    assert _rows(env.read(spark, vchannels="fresh_v", asOfRevision=revision)) == acked


def test_as_of_revision_repeats_a_read_while_producers_write(spark, env) -> None:
    first = env.segments()
    revision = first.revision
    before = _rows(env.read(spark, asOfRevision=str(revision)))
    env.produce("orders", env.pchannels[0], 20)
    _wait_committed(env, env.pchannels[0], env.committed_through(env.pchannels[0], first) + 1)
    again = _rows(env.read(spark, asOfRevision=str(revision)))
    assert again == before
    now = _rows(env.read(spark))
    assert len(now) > len(before)
    assert set(before) <= set(now)


@pytest.mark.parametrize("pushdown", [True, False])
def test_vchannel_and_time_tick_filters(spark, env, pushdown) -> None:
    spark.conf.set(spark_connector.PUSHDOWN_CONF, str(pushdown).lower())
    try:
        spark_connector.register(spark)
        segments = env.segments()
        revision = str(segments.revision)
        through = env.committed_through(env.pchannels[0], segments)
        orders = _expected(env, "orders", through)
        ticks = sorted(a.time_tick for a in env.history["orders"].acked if a.lsn <= through)
        middle = ticks[len(ticks) // 2]
        # As options.
        by_option = _rows(env.read(spark, vchannels="orders", asOfRevision=revision))
        assert by_option == orders
        ticked = _rows(
            env.read(spark, vchannels="orders", fromTimeTick=str(middle), asOfRevision=revision)
        )
        assert ticked == sorted(
            ("orders", a.lsn, a.payload)
            for a in env.history["orders"].acked
            if a.lsn <= through and a.time_tick >= middle
        )
        # As DataFrame filters (pushed down, or evaluated by Spark).
        df = env.read(spark, asOfRevision=revision)
        filtered = _rows(df.where((df.vchannel == "orders") & (df.time_tick < middle)))
        assert filtered == sorted(
            ("orders", a.lsn, a.payload)
            for a in env.history["orders"].acked
            if a.lsn <= through and a.time_tick < middle
        )
        lsn_cut = orders[len(orders) // 3][1]
        ranged = _rows(df.where((df.lsn > lsn_cut) & df.vchannel.isin("orders", "nope")))
        assert ranged == [row for row in orders if row[1] > lsn_cut]
        assert df.where(df.msg_type == "delete").count() == 0
    finally:
        spark.conf.set(spark_connector.PUSHDOWN_CONF, "true")
        spark_connector.register(spark)


def test_bad_options_fail_clearly(spark, env) -> None:
    with pytest.raises(Exception, match="fromTimeTick"):
        env.read(spark, fromTimeTick="yesterday").count()
    with pytest.raises(Exception, match="unknown vchannel") as missing:
        env.read(spark, vchannels="no_such_vchannel").count()
    # spark-read prints the connector's own sentence, not the first line of the JVM trace.
    message = connector_message(missing.value)
    assert message is not None and "unknown vchannel" in message and "\n" not in message
    assert "no_such_vchannel" in message and "Traceback" not in message
    with pytest.raises(Exception, match="msgTypes"):
        env.read(spark, msgTypes="messages").count()


def test_transactions_are_all_or_nothing(spark, env) -> None:
    pchannel = env.pchannels[1]
    _, _, address = wait_assigned(env.client, pchannel)
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        committed = stub.BeginTxn(wire.BeginTxnRequest(vchannel="payments"), timeout=scaled(10))
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="payments",
                txn_id=committed.txn_id,
                messages=[
                    wire.Message(vchannel="payments", payload=b"txn-%d" % i) for i in range(5)
                ],
            ),
            timeout=scaled(10),
        )
        done = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="payments", txn_id=committed.txn_id), timeout=scaled(10)
        )
        rolled = stub.BeginTxn(wire.BeginTxnRequest(vchannel="payments"), timeout=scaled(10))
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="payments",
                txn_id=rolled.txn_id,
                messages=[wire.Message(vchannel="payments", payload=b"rolled-back")],
            ),
            timeout=scaled(10),
        )
        stub.RollbackTxn(
            wire.RollbackTxnRequest(vchannel="payments", txn_id=rolled.txn_id), timeout=scaled(10)
        )
    # Push the txn into a committed segment.
    env.produce("payments", pchannel, 25)
    _wait_committed(env, pchannel, done.positions[-1].lsn)
    # Each action on a DataFrame is a read of its own (seal, plan, fetch): collect once.
    df = env.read(spark, vchannels="payments")
    rows = df.select("txn_id", "msg_type", "vchannel", "lsn", "payload").collect()
    txn_rows = [r for r in rows if r.txn_id is not None]
    assert {r.txn_id for r in txn_rows} == {committed.txn_id}
    assert sorted(bytes(r.payload) for r in txn_rows if r.msg_type == "message") == [
        b"txn-%d" % i for i in range(5)
    ]
    assert {r.msg_type for r in txn_rows} == {"txn_begin", "message", "txn_commit"}
    assert not [r for r in rows if bytes(r.payload) == b"rolled-back"]
    # A partition boundary inside the transaction neither drops nor repeats it. Read a
    # window around it only: every partition is a Spark task of its own (0.2-0.5 s each).
    low, high = min(r.lsn for r in txn_rows) - 4, max(r.lsn for r in txn_rows) + 5
    small = env.read(
        spark, vchannels="payments", maxRecordsPerPartition="3", fromLsn=str(low), toLsn=str(high)
    )
    assert small.rdd.getNumPartitions() >= 4
    small_rows = small.select("txn_id", "vchannel", "lsn", "payload").collect()
    assert _triples(small_rows) == _triples([r for r in rows if low <= r.lsn < high])
    assert sorted(r.lsn for r in small_rows if r.txn_id is not None) == sorted(
        r.lsn for r in txn_rows
    )


def _triples(rows: list[Any]) -> list[tuple[str, int, bytes]]:
    return sorted((r.vchannel, r.lsn, bytes(r.payload)) for r in rows)


def _slice_of(env: Env, segment: Any, replicas: tuple[tuple[str, str], ...]) -> SegmentSlice:
    return SegmentSlice(
        pchannel=segment.pchannel,
        segment_id=segment.segment_id,
        first_lsn=segment.first_lsn,
        last_lsn=segment.last_lsn,
        digest=segment.digest,
        from_lsn=segment.first_lsn,
        to_lsn=segment.last_lsn,
        replicas=replicas,
    )


def test_executor_reads_local_files_and_checks_them_against_the_manifest(env) -> None:
    """The executor path without Spark: a local copy serves the read even when no replica
    answers, and a local copy that differs from the committed digest is not used."""
    segment = env.segments().segments[0]
    nodes = env.local.config.nodes
    names = {}
    for vchannel in env.client.call("ListChannels", api.ListChannelsRequest()).vchannels:
        names[vchannel.id] = vchannel.name
    # Each replica's data worker for the pchannel (its control port serves no segments).
    served = dict(
        zip((n.id for n in nodes), env.local.data_endpoints(segment.pchannel), strict=True)
    )
    addresses = tuple((n.id, served[n.id]) for n in nodes if n.id in segment.replica_node_ids)
    remote = parse_options({"endpoints": env.endpoints})
    expected = pa.Table.from_batches(
        list(read_slice(_slice_of(env, segment, addresses), remote, names, RowFilter()))
    )
    assert expected.num_rows > 0
    dead = tuple((node_id, "127.0.0.1:1") for node_id, _ in addresses)
    local = parse_options(
        {
            "endpoints": env.endpoints,
            "preferLocal": "true",
            "localDataDirs": ",".join(f"{n.id}={n.data_dir}" for n in nodes),
            "timeoutSeconds": "2",
        }
    )
    got = pa.Table.from_batches(
        list(read_slice(_slice_of(env, segment, dead), local, names, RowFilter()))
    )
    assert got.equals(expected)
    wrong = replace(_slice_of(env, segment, dead), digest=segment.digest ^ 1)
    with pytest.raises(SegmentUnreadable, match=f"segment {segment.segment_id}"):
        list(read_slice(wrong, local, names, RowFilter()))


def test_read_survives_a_node_down_and_prefer_local(spark, env) -> None:
    revision = str(env.segments().revision)
    expected = _rows(env.read(spark, asOfRevision=revision))
    nodes = env.local.config.nodes
    dirs = ",".join(f"{n.id}={n.data_dir}" for n in nodes)
    local = _rows(env.read(spark, asOfRevision=revision, preferLocal="true", localDataDirs=dirs))
    assert local == expected
    victim = nodes[0].id
    env.local.kill(victim, signal.SIGKILL)
    try:
        down = _rows(env.read(spark, asOfRevision=revision))
        assert down == expected
    finally:
        env.local.start_node(victim)
        wait_assigned(env.client, env.pchannels[0])


def test_a_segment_corrupt_on_every_replica_fails_the_job_naming_it(spark, env) -> None:
    segments = env.segments()
    target = next(s for s in segments.segments if s.pchannel == env.pchannels[1])
    revision = str(segments.revision)
    expected = _rows(env.read(spark, pchannels=target.pchannel, asOfRevision=revision))
    paths = [
        Path(node.data_dir) / "wal" / target.pchannel / segment_file_name(target.segment_id)
        for node in env.local.config.nodes
    ]
    paths = [path for path in paths if path.exists()]
    assert len(paths) == 3

    def corrupt(path: Path) -> None:
        data = bytearray(path.read_bytes())
        middle = len(data) // 3
        data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
        path.write_bytes(bytes(data))

    # Two bad copies: the read goes to the third replica.
    for path in paths[:2]:
        corrupt(path)
    again = _rows(env.read(spark, pchannels=target.pchannel, asOfRevision=revision))
    assert again == expected
    corrupt(paths[2])
    with pytest.raises(Exception) as caught:
        env.read(spark, pchannels=target.pchannel, asOfRevision=revision).count()
    message = str(caught.value)
    assert f"pchannel {target.pchannel} segment {target.segment_id}" in message, message[-2000:]
    # The other pchannel still reads.
    assert env.read(spark, pchannels=env.pchannels[0]).count() > 0
