"""Structured Streaming (`spark.readStream.format("raftwal")`) against a real three-node
cluster and a real SparkSession, into a real Parquet sink (exactly once with its own log).

Checked against what producers had acknowledged: every acknowledged message is in the sink
exactly once while the pchannel's owner is killed (kill -9 of its process) under a running
query, and across a query stopped and restarted from its checkpoint; committed-but-never-
acknowledged entries may appear (once each), nothing else does. Plus the option errors and
the transaction rule of a tail read (a transaction belongs to the batch holding its begin).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from spark_connector.datasource import SCHEMA_DDL
from spark_connector.fetch import RowFilter
from spark_connector.plan import connector_message
from spark_connector.stream import TailPartition, _Rows, _take, parse_starting_offsets
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, setup_channels, wait_assigned
from tests.timing import scaled
from wal_segments.format import EntryFlags

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

#: Small segments, so that micro-batches read sealed committed segments (ReadSegment) as
#: well as the open segment's committed prefix (Consume).
SEGMENT_BYTES = 32 * 1024
VCHANNELS = ("s_orders", "s_payments")
#: Bound on waiting for the sink to catch up (a loaded 2-core machine).
CATCH_UP_S = 120.0


class Env:
    def __init__(self, local: dev.LocalCluster, client: Api, pchannels: list[str]) -> None:
        self.local = local
        self.client = client
        self.pchannels = pchannels
        self.pchannel_of = dict(zip(VCHANNELS, pchannels, strict=True))
        self.history = {v: History() for v in VCHANNELS}
        #: every payload ever sent (acknowledged or not)
        self.attempted: set[bytes] = set()
        self.producers: dict[str, Producer] = {}
        self.lock = threading.Lock()

    @property
    def endpoints(self) -> str:
        return ",".join(self.local.endpoints)

    def produce(self, vchannel: str, batches: int, per_batch: int = 10, tag: str = "") -> None:
        producer = self.producers.get(vchannel)
        if producer is None:
            producer = self.producers[vchannel] = Producer(
                self.client, self.pchannel_of[vchannel], f"stream-{vchannel}"
            )
        history = self.history[vchannel]
        for _ in range(batches):
            with self.lock:
                count = len(self.attempted)
                payloads = [
                    f"{vchannel}-{tag}-{count + i:07d}-".encode() + b"x" * 100
                    for i in range(per_batch)
                ]
                self.attempted.update(payloads)
            producer.send(vchannel, payloads, history, budget_s=60)

    def acked(self) -> set[tuple[str, int, bytes]]:
        return {(v, a.lsn, a.payload) for v, h in self.history.items() for a in h.acked}

    def stream(self, spark: Any, **options: str) -> Any:
        reader = spark.readStream.format("raftwal").option("endpoints", self.endpoints)
        reader = reader.option("vchannels", ",".join(VCHANNELS))
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    directory: Path = tmp_path_factory.mktemp("stream")
    environ = dict(os.environ)
    environ["RAFTWAL_SEGMENT_MAX_BYTES"] = str(SEGMENT_BYTES)
    local = dev.up(directory, 3, timeout_s=60, env=environ)
    client = Api(local.endpoints)
    state: Env | None = None
    try:
        pchannels = setup_channels(client, "st", {VCHANNELS[0]: 0, VCHANNELS[1]: 1})
        for pchannel in pchannels:
            wait_assigned(client, pchannel)
        state = Env(local, client, pchannels)
        yield state
    finally:
        if state is not None:
            for producer in state.producers.values():
                producer.close()
        client.close()
        local.stop_all()


def _sink_rows(spark: Any, path: Path) -> list[tuple[str, str, int, bytes]]:
    # The file sink's own log says which files are committed; read through it.
    if not any((path / "_spark_metadata").glob("[0-9]*")):
        return []
    df = spark.read.schema(SCHEMA_DDL).parquet(str(path))
    return [
        (r.pchannel, r.vchannel, r.lsn, bytes(r.payload))
        for r in df.select("pchannel", "vchannel", "lsn", "payload").collect()
    ]


#: Spark gives a Python worker a fixed 10 s to connect back (PythonWorkerFactory); on a
#: loaded 2-core machine a new query's streaming-source worker sometimes misses it and the
#: query stops before its first batch. That is Spark's start-up, not the source: such a
#: query is started again (from its checkpoint, where it has one), at most this many times.
MAX_RESTARTS = 8
ENVIRONMENTAL = "Python worker failed to connect back"


class Query:
    """A streaming query, started again when Spark's Python worker failed to start."""

    def __init__(self, start: Callable[[], Any]) -> None:
        self.start = start
        self.query = start()
        self.restarts = 0

    def error(self) -> Any:
        """The query's exception, or None while it runs (restarting it after an
        environmental failure)."""
        error = self.query.exception()
        if error is not None and ENVIRONMENTAL in str(error) and self.restarts < MAX_RESTARTS:
            self.restarts += 1
            self.query.stop()
            time.sleep(2)
            self.query = self.start()
            return None
        return error

    def check(self) -> None:
        error = self.error()
        if error is not None:
            raise AssertionError(f"the query failed: {error}")

    def stop(self) -> None:
        self.query.stop()


def _wait_for(spark: Any, path: Path, want: set[tuple[str, int, bytes]], query: Query) -> list:
    """Sink rows once they include `want` (bounded by CATCH_UP_S)."""
    deadline = time.monotonic() + scaled(CATCH_UP_S)
    rows: list[tuple[str, str, int, bytes]] = []
    while time.monotonic() < deadline:
        query.check()
        rows = _sink_rows(spark, path)
        if want <= {(v, lsn, p) for _, v, lsn, p in rows}:
            return rows
        time.sleep(0.5)
    missing = want - {(v, lsn, p) for _, v, lsn, p in rows}
    raise AssertionError(
        f"{len(missing)} acknowledged messages not in the sink: {sorted(missing)[:3]}"
    )


def _check_exactly_once(env: Env, rows: list[tuple[str, str, int, bytes]]) -> None:
    positions = [(pchannel, lsn) for pchannel, _, lsn, _ in rows]
    assert len(positions) == len(set(positions)), "an entry was delivered twice"
    payloads = [p for _, _, _, p in rows]
    assert len(payloads) == len(set(payloads)), "a message was delivered twice"
    # Nothing that was never sent; acknowledged ones at their acknowledged LSN.
    assert set(payloads) <= env.attempted
    acked = env.acked()
    got = {(v, lsn, p) for _, v, lsn, p in rows}
    assert acked <= got
    for _, vchannel, _, _ in rows:
        assert vchannel in VCHANNELS


def _start(env: Env, spark: Any, sink: Path, checkpoint: Path, **options: str) -> Query:
    return Query(
        lambda: (
            env.stream(spark, **options)
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
    )


def _memory(stream: Callable[[], Any], name: str) -> Query:
    return Query(lambda: stream().writeStream.format("memory").queryName(name).start())


@pytest.mark.timeout(600)
def test_owner_killed_under_a_running_query_every_ack_exactly_once(spark, env, tmp_path) -> None:
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    env.produce(VCHANNELS[0], 20, tag="a")
    env.produce(VCHANNELS[1], 10, tag="a")
    query = _start(env, spark, sink, checkpoint)
    try:
        _wait_for(spark, sink, env.acked(), query)
        stop = threading.Event()

        def keep_producing() -> None:
            rounds = 0
            while not stop.is_set() and rounds < 400:
                rounds += 1
                env.produce(VCHANNELS[0], 1, tag="b")
                env.produce(VCHANNELS[1], 1, tag="b")

        writer = threading.Thread(target=keep_producing, daemon=True)
        writer.start()
        try:
            time.sleep(2)
            victim, old_term, _ = wait_assigned(env.client, env.pchannels[0])
            env.local.kill(victim, signal.SIGKILL)
            # The pchannel moves to a new owner while the query and the producers run.
            wait_assigned(env.client, env.pchannels[0], min_term=old_term + 1, timeout_s=60)
            time.sleep(3)
            env.local.start_node(victim)
            time.sleep(2)
        finally:
            stop.set()
            writer.join(timeout=scaled(120))
        assert not writer.is_alive()
        assert len(env.history[VCHANNELS[0]].acked) > 200
        rows = _wait_for(spark, sink, env.acked(), query)
        query.check()
        _check_exactly_once(env, rows)
    finally:
        query.stop()
    _check_segment_ids(env, spark, sink)


@pytest.mark.slow  # ~25 s on top of the default suite's budget; the owner-kill test stays
@pytest.mark.timeout(600)
def test_query_stopped_and_restarted_from_its_checkpoint(spark, env, tmp_path) -> None:
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    env.produce(VCHANNELS[0], 5, tag="c")
    query = _start(env, spark, sink, checkpoint)
    try:
        first = _wait_for(spark, sink, env.acked(), query)
        assert first
    finally:
        query.stop()
    # Written while no query runs: the restarted query picks it up from its checkpoint.
    env.produce(VCHANNELS[0], 8, tag="d")
    env.produce(VCHANNELS[1], 8, tag="d")
    # startingOffsets is ignored on restart (Spark uses the checkpoint's offsets).
    query = _start(env, spark, sink, checkpoint, startingOffsets="latest")
    try:
        rows = _wait_for(spark, sink, env.acked(), query)
        env.produce(VCHANNELS[1], 3, tag="e")
        rows = _wait_for(spark, sink, env.acked(), query)
    finally:
        query.stop()
    _check_exactly_once(env, rows)
    assert set(first) <= set(rows)
    _check_segment_ids(env, spark, sink)


def _check_segment_ids(env: Env, spark: Any, sink: Path) -> None:
    """segment_id is what a batch read shows, also for rows read from the open segment at
    the owner (Consume's with_segment_id): once sealed, the manifest agrees."""
    for pchannel in env.pchannels:
        _seal(env, pchannel)
    listed = env.client.call("ListSegments", api.ListSegmentsRequest(pchannels=env.pchannels))
    segments = {(s.pchannel, s.segment_id): s for s in listed.segments}
    df = spark.read.schema(SCHEMA_DDL).parquet(str(sink))
    rows = df.select("pchannel", "segment_id", "lsn").collect()
    assert rows
    for row in rows:
        segment = segments[(row.pchannel, row.segment_id)]
        assert segment.first_lsn <= row.lsn <= segment.last_lsn, row


def test_starting_offsets_latest_and_json(spark, env, tmp_path) -> None:
    env.produce(VCHANNELS[0], 2, tag="f")
    before = env.acked()
    query = _memory(lambda: env.stream(spark, startingOffsets="latest"), "latest_stream")
    try:
        # Wait for the first (empty) batch to fix the start, then produce.
        deadline = time.monotonic() + scaled(CATCH_UP_S)
        while query.query.lastProgress is None and time.monotonic() < deadline:
            query.check()
            time.sleep(0.2)
        assert query.query.lastProgress is not None
        env.produce(VCHANNELS[0], 2, tag="g")
        new = env.acked() - before
        deadline = time.monotonic() + scaled(CATCH_UP_S)
        got: set[tuple[str, int, bytes]] = set()
        while time.monotonic() < deadline:
            query.check()
            got = {
                (r.vchannel, r.lsn, bytes(r.payload))
                for r in spark.sql("select vchannel, lsn, payload from latest_stream").collect()
            }
            if new <= got:
                break
            time.sleep(0.3)
        assert got == new
    finally:
        query.stop()


def test_bad_stream_options_are_one_sentence(spark, env) -> None:
    for options, expected in (
        ({"startingOffsets": "yesterday"}, "raftwal option startingOffsets: got 'yesterday'"),
        ({"asOfRevision": "5"}, "raftwal option asOfRevision: not supported by readStream"),
        ({"startingOffsets": '{"nosuch": 3}'}, "startingOffsets names pchannel(s) nosuch"),
    ):
        failure: Any = None
        try:
            query = _memory(lambda options=options: env.stream(spark, **options), "bad_stream")
        except Exception as error:  # noqa: BLE001 (refused when the query starts)
            failure = error
        else:
            try:
                deadline = time.monotonic() + scaled(CATCH_UP_S)
                while failure is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                    failure = query.error()
            finally:
                query.stop()
        assert failure is not None, options
        message = connector_message(failure)
        assert message is not None and expected in message, str(failure)[-1500:]


def _entry(lsn: int, flags: int = 0, txn_id: int = 0, msg_type: str = "message") -> wire.WalEntry:
    return wire.WalEntry(
        pchannel="p", vchannel="v", lsn=lsn, msg_type=msg_type, flags=flags, txn_id=txn_id,
        payload=b"%d" % lsn, segment_id=1,
    )  # fmt: skip


def test_a_transaction_belongs_to_the_batch_of_its_begin() -> None:
    # LSNs 1..8: plain 1, txn 7 = [2 begin, 3 body, 4 commit], plain 5,
    # txn 9 = [6 begin, 7 body, 8 rollback]. Batches (0, 3] and (3, 8].
    log = [
        _entry(1),
        _entry(2, EntryFlags.TXN_BEGIN, 7, "txn_begin"),
        _entry(3, EntryFlags.TXN_BODY, 7),
        _entry(4, EntryFlags.TXN_COMMIT, 7, "txn_commit"),
        _entry(5),
        _entry(6, EntryFlags.TXN_BEGIN, 9, "txn_begin"),
        _entry(7, EntryFlags.TXN_BODY, 9),
        _entry(8, EntryFlags.TXN_ROLLBACK, 9, "txn_rollback"),
    ]

    def batch(low: int, high: int, read_through: int) -> list[int]:
        part = TailPartition("p", low + 1, high, RowFilter(), None)
        pending: dict[int, list[wire.WalEntry]] = {}
        rows = _Rows()
        for entry in log[low:read_through]:
            _take(entry, part, pending, rows)
        return rows.take().column("lsn").to_pylist() if len(rows) else []

    # The first batch reads past its end (3) to the commit at 4: the whole txn is its own.
    assert batch(0, 3, 4) == [1, 2, 3, 4]
    # The next one skips the rest of txn 7 and never shows the rolled-back txn 9.
    assert batch(3, 8, 8) == [5]


def test_parse_starting_offsets() -> None:
    assert parse_starting_offsets(None) == "earliest"
    assert parse_starting_offsets("LATEST") == "latest"
    assert parse_starting_offsets('{"a": 3}') == {"a": 3}
    for bad in ('{"a": -1}', '{"a": true}', "[1]", "{", '{"": 1}'):
        with pytest.raises(ValueError, match="startingOffsets"):
            parse_starting_offsets(bad)


def _delete_segments_before(env: Env, pchannel: str, before_lsn: int) -> None:
    """Retention, as the state machine has it (DeleteSegmentsBefore): no node drives it yet,
    so the test proposes it at the Raft leader through the node-to-node Propose."""
    deadline = time.monotonic() + scaled(60)
    last = ""
    while time.monotonic() < deadline:
        status = env.client.call("ClusterStatus", api.ClusterStatusRequest())
        if status.leader_address:
            command = pb.Command(
                request_id=f"test-delete-{pchannel}-{before_lsn}",
                proposed_at_ms=int(time.time() * 1000),
                delete_segments_before=pb.DeleteSegmentsBefore(
                    pchannel=pchannel, before_lsn=before_lsn
                ),
            )
            with grpc.insecure_channel(status.leader_address) as chan:
                try:
                    answer = coordinator_pb2_grpc.ClusterStub(chan).Propose(
                        api.ProposeRequest(command=command.SerializeToString(), timeout_ms=10_000),
                        timeout=scaled(15),
                    )
                    result = pb.CommandResult.FromString(answer.result)
                    assert not result.rejection.code, result.rejection
                    assert [e.WhichOneof("body") for e in result.events] == ["segments_deleted"]
                    return
                except grpc.RpcError as error:
                    last = f"{error.code()}: {error.details()}"
        time.sleep(0.5)
    raise AssertionError(f"DeleteSegmentsBefore not accepted: {last}")


def _seal(env: Env, pchannel: str) -> None:
    """Seal the open segment and wait for its commit, at whichever node owns the pchannel
    (the balancer may move it after a restart): bounded attempts."""
    last: object = None
    for _ in range(20):
        _, _, address = wait_assigned(env.client, pchannel)
        with grpc.insecure_channel(address) as chan:
            try:
                streaming_pb2_grpc.StreamingNodeStub(chan).Seal(
                    wire.SealRequest(pchannel=pchannel, timeout_ms=30_000), timeout=scaled(40)
                )
                return
            except grpc.RpcError as error:
                last = f"{error.code()}: {error.details()}"
        time.sleep(0.5)
    raise AssertionError(f"could not seal {pchannel}: {last}")


@dataclass
class Compacted:
    pchannel: str
    #: a revision from before retention deleted the first segment
    old_revision: int
    #: the first LSN retention kept
    kept: int
    history: History


@pytest.fixture(scope="module")
def compacted(env: Env) -> Compacted:
    """A pchannel with two committed segments, the first deleted by retention."""
    (pchannel,) = setup_channels(env.client, "stc", {"s_compact": 0})
    wait_assigned(env.client, pchannel)
    producer = Producer(env.client, pchannel, "stream-compact")
    history = History()
    try:
        for round_ in range(2):
            for k in range(5):
                payloads = [b"c-%d-%d-%d" % (round_, k, i) for i in range(10)]
                assert producer.send("s_compact", payloads, history)
            _seal(env, pchannel)
    finally:
        producer.close()
    listed = env.client.call("ListSegments", api.ListSegmentsRequest(pchannels=[pchannel]))
    assert len(listed.segments) >= 2
    first = min(listed.segments, key=lambda s: s.first_lsn)
    _delete_segments_before(env, pchannel, first.last_lsn + 1)
    return Compacted(pchannel, listed.revision, first.last_lsn + 1, history)


def test_a_compacted_snapshot_is_one_sentence(spark, env, compacted) -> None:
    # A batch read at a revision whose segments retention deleted since.
    with pytest.raises(Exception) as caught:
        (
            spark.read.format("raftwal")
            .option("endpoints", env.endpoints)
            .option("pchannels", compacted.pchannel)
            .option("asOfRevision", str(compacted.old_revision))
            .load()
            .count()
        )
    message = connector_message(caught.value)
    assert message is not None, str(caught.value)[-1500:]
    assert "COMPACTED" in message and "\n" not in message, message
    assert f"committed by revision {compacted.old_revision} were deleted" in message, message


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_spark_read_of_a_compacted_snapshot_is_one_sentence(env, compacted) -> None:
    # `raftwal spark-read` starts its own JVM (minutes on a loaded 2-core machine): slow.
    raftwal = str(Path(sys.executable).with_name("raftwal"))
    done = subprocess.run(
        [
            raftwal, "spark-read", "--endpoints", env.endpoints, "--pchannels",
            compacted.pchannel, "--as-of-revision", str(compacted.old_revision),
            "--master", "local[1]",
        ],
        capture_output=True, text=True, timeout=scaled(600),
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr[-2000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "COMPACTED" in errors[0], done.stderr[-2000:]
    assert f"committed by revision {compacted.old_revision} were deleted" in errors[0]


def test_a_stream_offset_below_retention_is_one_sentence(spark, env, compacted) -> None:
    pchannel, kept = compacted.pchannel, compacted.kept
    # A start offset below what retention kept: one sentence naming the first available
    # LSN, never a silent skip.
    query = _memory(
        lambda: (
            spark.readStream.format("raftwal")
            .option("endpoints", env.endpoints)
            .option("pchannels", pchannel)
            .option("startingOffsets", json.dumps({pchannel: 0}))
            .load()
        ),
        "compacted_stream",
    )
    try:
        deadline = time.monotonic() + scaled(CATCH_UP_S)
        error = query.error()
        while error is None and time.monotonic() < deadline:
            time.sleep(0.3)
            error = query.error()
    finally:
        query.stop()
    assert error is not None
    message = connector_message(error)
    assert message is not None, str(error)[-1500:]
    assert message.startswith(f"COMPACTED: pchannel {pchannel}: the stream's offset 0"), message
    assert f"the first available LSN is {kept}" in message, message
    # startingOffsets=earliest starts at what is kept, and gets exactly the kept messages.
    query = _memory(
        lambda: (
            spark.readStream.format("raftwal")
            .option("endpoints", env.endpoints)
            .option("pchannels", pchannel)
            .load()
        ),
        "kept_stream",
    )
    expected = sorted(a.lsn for a in compacted.history.acked if a.lsn >= kept)
    try:
        deadline = time.monotonic() + scaled(CATCH_UP_S)
        got: list[int] = []
        while time.monotonic() < deadline:
            query.check()
            got = sorted(
                r.lsn
                for r in spark.sql(
                    "select lsn from kept_stream where msg_type = 'message'"
                ).collect()
            )
            if len(got) >= len(expected):
                break
            time.sleep(0.3)
    finally:
        query.stop()
    assert got == expected
