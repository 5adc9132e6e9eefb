"""Spark read throughput of committed WAL segments: the connector against its own ceiling
and against Parquet, in one run and one SparkSession.

Setup (untimed): a three-node cluster on loopback (`raftwal.cli.dev`), `--pchannels` pchannels
(replica set 3, one vchannel each) and `--messages` 100-byte messages with distinct random
payloads, produced through pipelined compact Produce streams, with the segment size chosen
so that they fill exactly `--segments` committed segments (one extra batch per pchannel
seals the last of them and stays in the open segment, which a read never sees). The
expected rows and sums come from the produce acknowledgements, cut at the committed end.

Variants, each read in the same SparkSession (`local[2]`) with the same aggregate, `count`
plus `sum(lsn)`, `sum(time_tick % 1000003)` and `sum(length(payload))` (ANSI mode is on, and
a plain sum of hybrid time ticks overflows):

(a) the `raftwal` connector, segments fetched from the nodes: a ReadSegment call (gRPC),
    then the frames over the node's segment transfer port;
(b) the connector with `preferLocal`, reading the nodes' segment files directly;
(c) the ceiling: a Python data source (`raftwal_ceiling`, defined here) with the same
    schema and one partition per segment that yields pre-built Arrow batches cached in each
    Python worker: the limit of Spark's Python data source path;
(d) `spark.read.parquet` of the same rows, written once from the connector;
(e) `spark_connector.export.export` of every committed entry (preferLocal, as (b)) into a
    new directory: snapshot, Spark job writing partitioned Parquet, manifest commit and
    moves; its "rows/s" is the rows exported per second of the whole run;
(f) the query over an export's directory (`spark.read.parquet(DIR)`, partitioned by
    pchannel, vchannel and date), written once untimed.

Every variant runs once untimed (warm-up, and the ceiling's workers build their cache),
then `--repeat` timed rounds interleave the variants so that the machine's noise spreads
over all of them, each round after an untimed query of the ceiling over one segment (the
first Python-source query after the Parquet-only variants pays a JVM warm-up); every run's answer is checked against the expected one. A breakdown then
says where a segment's time goes, measured in this process without Spark.

    ./run bench spark_read [--messages N] [--segments S] [--pchannels P] [--batch B]
                           [--repeat R] [--keep-dir] [--json | --markdown]

Targets (the Spark connector issue): (b) >= 0.85x (c), (a) >= 0.6x (c), (b) >= 0.5x (d);
the export (issue 20 item 2): (e) >= 0.8x (b), (f) >= 1.0x (d).
Everything started here (the nodes by pid, the SparkSession, temp dirs) is stopped and
removed in `finally` blocks, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType
from rich.console import Console
from rich.table import Table

from raftwal.cli import dev
from rpc.client import CoordinatorClient
from rpc.errors import code_name
from rpc.placement import serving_address
from rpc.protos import coordination_pb2 as pb
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from rpc.streaming_client import list_segments
from spark_connector.datasource import SCHEMA_DDL
from spark_connector.export import export
from spark_connector.fetch import (
    CHUNK_BYTES,
    SPARK_SCHEMA,
    RowFilter,
    SegmentChunk,
    _read_replica,
    gather,
    read_segment_chunks,
    read_slice,
)
from spark_connector.options import ReadOptions, parse_options
from spark_connector.plan import SegmentSlice, Snapshot, channel, plan, snapshot
from wal_segments import columnar
from wal_segments.format import (
    MAX_SEGMENT_BYTES,
    Entry,
    MsgType,
    crc32c,
    encode_batch,
    file_header_size,
)
from wal_segments.segment import SegmentReader, segment_file_name

# Targets from the issue: rate ratios.
TARGETS = [
    ("b", "c", 0.85, "connector preferLocal / ceiling"),
    ("a", "c", 0.6, "connector ReadSegment / ceiling"),
    ("b", "d", 0.5, "connector preferLocal / Parquet"),
    ("e", "b", 0.8, "export (preferLocal) / connector preferLocal read"),
    ("f", "d", 1.0, "query over the export / plain Parquet"),
]
VARIANTS = {
    "a": "connector, ReadSegment (transfer port)",
    "b": "connector, preferLocal (local files)",
    "c": "ceiling: cached Arrow batches",
    "d": "spark.read.parquet",
    "e": "export to Parquet (preferLocal)",
    "f": "spark.read.parquet of the export",
}

PAYLOAD_BYTES = 100
TICK_MODULUS = 1_000_003
CEILING_NAME = "raftwal_ceiling"
SPARK_CORES = 2
SPARK_MASTER = f"local[{SPARK_CORES}]"
SPARK_DRIVER_MEMORY = "2g"

# Bounds of the setup: per request, per phase.
REQUEST_TIMEOUT_S = 30.0
START_TIMEOUT_S = 90.0
ASSIGN_TIMEOUT_S = 60.0
ASSIGN_STABLE_S = 2.0
# The committed manifest must reach the expected segments within this long after the last
# acknowledgement; if it stays unchanged for SETTLE_QUIET_S before that, the run goes on
# with what is committed (and says so).
SETTLE_TIMEOUT_S = 120.0
SETTLE_QUIET_S = 10.0
PROGRESS_EVERY_S = 10.0
IN_FLIGHT_BATCHES = 8
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# The open segment is sealed by size only: no age seal may change the layout mid-run.
SEGMENT_MAX_AGE_MS = 24 * 3600 * 1000
# Each stage of the breakdown is timed this many times (median).
BREAKDOWN_REPEAT = 5
# A timed ceiling run during which a Python worker had to build its cache does not measure
# the ceiling: it is discarded and run again, at most this many times per round.
MAX_COLD_CEILING_RETRIES = 5

console = Console(stderr=True)


def say(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)


class BenchError(RuntimeError):
    """The setup or a check failed; the message says what was got and what was expected."""


def segment_path(data_dir: str | Path, pchannel: str, segment_id: int) -> Path:
    """Where a node keeps a segment file (as the connector's preferLocal looks for it)."""
    return Path(data_dir) / "wal" / pchannel / segment_file_name(segment_id)


def vchannel_names(snap: Snapshot, pchannel: str) -> dict[int, str]:
    """vchannel id -> name, for the vchannels of `pchannel`."""
    return {
        vchannel_id: name
        for vchannel_id, name in snap.vchannel_names.items()
        if snap.vchannel_pchannels.get(name) == pchannel
    }


# -- the ceiling data source (c) ------------------------------------------------------------
#
# Spark ships these classes to its Python workers by reference (module and name), so they
# must live in a module the workers import: this file runs as `spark_read` (see the end),
# with bench/ on the workers' PYTHONPATH.


@dataclass(frozen=True)
class CeilingSegment:
    """One committed segment as a local file, and what its rows need from the manifest."""

    path: str
    pchannel: str
    segment_id: int
    vchannel_names: dict[int, str]

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "pchannel": self.pchannel,
            "segment_id": self.segment_id,
            "vchannel_names": {str(k): v for k, v in self.vchannel_names.items()},
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> CeilingSegment:
        return CeilingSegment(
            path=data["path"],
            pchannel=data["pchannel"],
            segment_id=int(data["segment_id"]),
            vchannel_names={int(k): v for k, v in data["vchannel_names"].items()},
        )


class CeilingPartition(InputPartition):
    """One task: the index of its segment in the reader's list."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


# Per Python worker (spark.python.worker.reuse keeps it between tasks and queries): segment
# path -> its RecordBatch of the Spark schema.
_CEILING_CACHE: dict[str, pa.RecordBatch] = {}


def ceiling_batch(segment: CeilingSegment) -> pa.RecordBatch:
    """What the connector yields for a whole segment: the local file decoded vectorially,
    control entries dropped, cast to the schema Spark expects."""
    with SegmentReader.open(segment.path) as reader:
        batch = reader.to_arrow(
            segment.pchannel,
            segment.vchannel_names,
            segment_id=segment.segment_id,
            include_control=False,
        )
    return pa.RecordBatch.from_arrays(batch.columns, schema=SPARK_SCHEMA)


class CeilingReader(DataSourceReader):
    def __init__(self, segments: list[CeilingSegment], builds_dir: str) -> None:
        self.segments = segments
        self.builds_dir = builds_dir

    def partitions(self) -> list[InputPartition]:
        return [CeilingPartition(index) for index in range(len(self.segments))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, CeilingPartition):
            # Spark reads InputPartition(None) when partitions() returned none.
            return iter(())
        segment = self.segments[partition.index]
        if segment.path not in _CEILING_CACHE:
            # A worker builds every segment on its first miss, so that whichever worker a
            # later task lands on finds its batch cached; each build leaves a marker file
            # that tells the driver the run was not a pure ceiling run.
            for each in self.segments:
                if each.path not in _CEILING_CACHE:
                    _CEILING_CACHE[each.path] = ceiling_batch(each)
            marker = Path(self.builds_dir) / f"{os.getpid()}-{time.monotonic_ns()}"
            marker.touch()
        return iter((_CEILING_CACHE[segment.path],))


class CeilingDataSource(DataSource):
    """`spark.read.format("raftwal_ceiling").option("segments", json).option("buildsDir",
    dir).load()`: the connector's schema, rows from cached Arrow batches."""

    @classmethod
    def name(cls) -> str:
        return CEILING_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark hands the options over with lower-case keys.
        options = {key.lower(): value for key, value in self.options.items()}
        try:
            segments = [CeilingSegment.from_json(s) for s in json.loads(options["segments"])]
            builds_dir = options["buildsdir"]
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(
                f"raftwal_ceiling options: got {sorted(options)} ({error!r}), expected "
                "segments (JSON list) and buildsDir"
            ) from None
        return CeilingReader(segments, builds_dir)


# -- setup: cluster, channels, produce ------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What the run writes: per pchannel, `batches_per_pchannel` batches of `batch` messages
    fill `segments_per_pchannel` segments of `per_segment` messages; one more batch seals the
    last of them."""

    messages: int
    segments: int
    pchannels: int
    batch: int

    @property
    def per_segment(self) -> int:
        return self.messages // self.segments

    @property
    def segments_per_pchannel(self) -> int:
        return self.segments // self.pchannels

    @property
    def batches_per_pchannel(self) -> int:
        return self.messages // self.pchannels // self.batch

    def pchannel_names(self) -> list[str]:
        return [f"sparkbench_{k}" for k in range(self.pchannels)]

    def frame_bytes(self) -> int:
        """Bytes one message takes in a segment (header, payload, padding), measured by
        encoding one as the owner does."""
        entry = Entry(
            lsn=1,
            term=1,
            time_tick=1,
            msg_type=int(MsgType.MESSAGE),
            vchannel_id=1,
            payload=bytes(PAYLOAD_BYTES),
        )
        return encode_batch([entry]).meta.size_bytes

    def segment_max_bytes(self) -> int:
        """The owner seals before a batch when the open segment's bytes plus its estimate of
        the batch (100 + key + payload per message, wal_segments/owner.py) pass the limit.
        With half a batch of frames as slack past `per_segment` frames, it seals exactly
        after `per_segment` messages for any estimate between 0.5 and 1.5 frames per
        message; the first segment's term-start entry (one 72-byte frame) fits in that
        slack too."""
        header = max(file_header_size(name) for name in self.pchannel_names())
        frame = self.frame_bytes()
        return header + self.per_segment * frame + self.batch * frame // 2


@dataclass
class Acks:
    """Acknowledged batches of one pchannel: first LSN and time ticks, in LSN order."""

    first_lsns: list[int]
    time_ticks: list[array]


@dataclass(frozen=True)
class Expected:
    rows: int
    sum_lsn: int
    sum_tick_mod: int
    sum_payload_bytes: int

    def values(self) -> tuple[int, int, int, int]:
        return (self.rows, self.sum_lsn, self.sum_tick_mod, self.sum_payload_bytes)


class ProduceFailed(BenchError):
    """A Produce batch failed, went unanswered or was answered wrongly."""


async def produce_pchannel(
    address: str, pchannel: str, vchannel: str, batches: int, batch: int, progress: list[int]
) -> Acks:
    """`batches` compact batches of `batch` distinct random payloads over one Produce
    stream, at most IN_FLIGHT_BATCHES unacknowledged; any error fails the run."""
    acked: dict[int, tuple[int, array]] = {}
    options = [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    ]
    async with grpc.aio.insecure_channel(address, options=options) as chan:
        call = streaming_pb2_grpc.StreamingNodeStub(chan).Produce()
        slots = asyncio.Semaphore(IN_FLIGHT_BATCHES)

        async def write() -> None:
            for request_id in range(1, batches + 1):
                await asyncio.wait_for(slots.acquire(), REQUEST_TIMEOUT_S)
                block = os.urandom(batch * PAYLOAD_BYTES)
                payloads = [
                    block[k : k + PAYLOAD_BYTES] for k in range(0, len(block), PAYLOAD_BYTES)
                ]
                request = wire.ProduceRequest(
                    request_id=request_id,
                    pchannel=pchannel,
                    batch_vchannel=vchannel,
                    payloads=payloads,
                )
                await asyncio.wait_for(call.write(request), REQUEST_TIMEOUT_S)
            await asyncio.wait_for(call.done_writing(), REQUEST_TIMEOUT_S)

        async def read() -> None:
            for _ in range(batches):
                result = await asyncio.wait_for(call.read(), REQUEST_TIMEOUT_S)
                if result is grpc.aio.EOF:
                    raise ProduceFailed(
                        f"{pchannel}: Produce stream ended after {len(acked)} of {batches} batches"
                    )
                if result.HasField("error") and result.error.code:
                    raise ProduceFailed(
                        f"{pchannel}: batch {result.request_id} failed: "
                        f"{code_name(result.error.code)}: {result.error.message}"
                    )
                if len(result.time_ticks) != batch:
                    raise ProduceFailed(
                        f"{pchannel}: batch {result.request_id} acknowledged with "
                        f"{len(result.time_ticks)} time ticks, expected {batch}"
                    )
                acked[result.request_id] = (result.first_lsn, array("q", result.time_ticks))
                progress[0] += batch
                slots.release()

        tasks = [asyncio.create_task(write()), asyncio.create_task(read())]
        try:
            await asyncio.gather(*tasks)
        except TimeoutError:
            raise ProduceFailed(
                f"{pchannel}: no progress for {REQUEST_TIMEOUT_S:.0f} s after {len(acked)} of "
                f"{batches} batches"
            ) from None
        except grpc.RpcError as error:
            raise ProduceFailed(
                f"{pchannel}: Produce stream failed after {len(acked)} of {batches} batches: "
                f"{error.code().name}: {error.details()}"
            ) from None
        finally:
            for task in tasks:
                task.cancel()
            call.cancel()
    ordered = sorted(acked.values())
    # Batches follow each other, apart from the control entries (seal, term start) between.
    for (first, ticks), (following, _) in zip(ordered, ordered[1:], strict=False):
        if following < first + len(ticks):
            raise ProduceFailed(f"{pchannel}: acknowledged batches overlap at lsn {following}")
    return Acks([first for first, _ in ordered], [ticks for _, ticks in ordered])


async def wait_assigned(client: CoordinatorClient, pchannels: Sequence[str]) -> dict[str, str]:
    """pchannel -> owner gRPC address, once every pchannel is ASSIGNED to the same owner
    for ASSIGN_STABLE_S (a new cluster still balances its pchannels over the nodes as
    they register, and the producers here do not follow an owner that moves)."""
    deadline = time.monotonic() + ASSIGN_TIMEOUT_S
    reason = "not checked yet"
    seen: dict[str, str] = {}
    since = time.monotonic()
    while time.monotonic() < deadline:
        status = await client.cluster_status()
        owners: dict[str, str] = {}
        for entry in status.pchannels:
            if entry.name in pchannels and entry.state == pb.PCHANNEL_STATE_ASSIGNED:
                owners[entry.name] = serving_address(status.nodes, entry.owner_node_id, entry.name)
        missing = [p for p in pchannels if not owners.get(p)]
        if owners != seen:
            seen, since = owners, time.monotonic()
        if not missing and time.monotonic() - since >= ASSIGN_STABLE_S:
            return owners
        reason = f"not assigned yet: {', '.join(missing)}" if missing else "owners moving"
        await asyncio.sleep(0.2)
    raise BenchError(f"pchannels not assigned after {ASSIGN_TIMEOUT_S:.0f} s ({reason})")


async def settle(client: CoordinatorClient, layout: Layout) -> None:
    """Until every pchannel has its segments committed (or the manifest stopped changing
    for SETTLE_QUIET_S)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last: tuple[int, ...] = ()
    since = time.monotonic()
    while time.monotonic() < deadline:
        listed = await list_segments(client, layout.pchannel_names())
        per = tuple(
            sum(1 for s in listed.segments if s.pchannel == p) for p in layout.pchannel_names()
        )
        if min(per) >= layout.segments_per_pchannel:
            return
        if per != last:
            last, since = per, time.monotonic()
        elif time.monotonic() - since >= SETTLE_QUIET_S:
            say(
                f"[yellow]manifest unchanged for {SETTLE_QUIET_S:.0f} s with {sum(per)} "
                f"committed segments (expected {layout.segments}); going on with them[/yellow]"
            )
            return
        await asyncio.sleep(0.5)
    raise BenchError(
        f"segments not committed after {SETTLE_TIMEOUT_S:.0f} s (per pchannel {last}, "
        f"expected {layout.segments_per_pchannel} each)"
    )


def expected_from(acks: dict[str, Acks], segments: Sequence[pb.Segment]) -> Expected:
    """The acknowledged messages inside committed segments: what every variant must read."""
    rows = sum_lsn = sum_tick = 0
    for pchannel, acked in acks.items():
        through = max((s.last_lsn for s in segments if s.pchannel == pchannel), default=0)
        for first, ticks in zip(acked.first_lsns, acked.time_ticks, strict=True):
            count = max(0, min(len(ticks), through - first + 1))
            rows += count
            sum_lsn += count * first + count * (count - 1) // 2
            sum_tick += sum(t % TICK_MODULUS for t in ticks[:count])
    return Expected(rows, sum_lsn, sum_tick, rows * PAYLOAD_BYTES)


async def prepare(cluster: dev.LocalCluster, layout: Layout) -> tuple[dict[str, Acks], float]:
    """Channels and messages, until their segments are committed; returns (acks per
    pchannel, seconds the produce took)."""
    names = layout.pchannel_names()
    async with CoordinatorClient(cluster.endpoints, timeout_s=REQUEST_TIMEOUT_S) as client:
        await client.create_channels(names=names, replica_count=3)
        for name in names:
            await client.create_vchannel(f"{name}_v0", name)
        owners = await wait_assigned(client, names)
        progress = [0]
        total = layout.pchannels * (layout.batches_per_pchannel + 1) * layout.batch

        async def report() -> None:
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                say(f"  {progress[0]:,} of {total:,} messages acknowledged")

        reporter = asyncio.create_task(report())
        started = time.perf_counter()
        try:
            results = await asyncio.gather(
                *(
                    produce_pchannel(
                        owners[name],
                        name,
                        f"{name}_v0",
                        layout.batches_per_pchannel + 1,
                        layout.batch,
                        progress,
                    )
                    for name in names
                )
            )
        finally:
            reporter.cancel()
        produce_s = time.perf_counter() - started
        say(
            f"produced {total:,} messages in {produce_s:.1f} s ({total / produce_s:,.0f} msgs/s); "
            "waiting for the segments to commit"
        )
        await settle(client, layout)
    return dict(zip(names, results, strict=True)), produce_s


# -- Spark ----------------------------------------------------------------------------------


def start_spark() -> Any:
    """A SparkSession like `raftwal spark-read`'s (UI off, loopback, this Python for the
    workers), with Python worker reuse explicit (the ceiling's cache lives in the workers)
    and bench/ on the workers' PYTHONPATH (they import this module for the ceiling)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    bench_dir = str(Path(__file__).resolve().parent)
    paths = [bench_dir, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from spark_connector.session import start_session

    return start_session(
        SPARK_MASTER,
        "raftwal bench spark_read",
        {
            "spark.driver.memory": SPARK_DRIVER_MEMORY,
            "spark.sql.shuffle.partitions": "2",
            "spark.python.worker.reuse": "true",
        },
    )


def aggregate(df: Any) -> tuple[int, int, int, int]:
    """The query every variant runs: count, sum(lsn), sum(time_tick % m), sum(length)."""
    from pyspark.sql import functions as F

    rows, sum_lsn, sum_tick_mod, sum_payload_bytes = (
        int(value or 0)  # a sum over no rows is null
        for value in df.agg(
            F.count(F.lit(1)),
            F.sum("lsn"),
            F.sum(F.col("time_tick") % TICK_MODULUS),
            F.sum(F.length("payload")),
        ).collect()[0]
    )
    return rows, sum_lsn, sum_tick_mod, sum_payload_bytes


@dataclass
class Variant:
    """A variant's DataFrame, built anew for every run (so planning is timed too), and the
    seconds of its timed runs."""

    key: str
    label: str
    load: Callable[[], Any]
    runs_s: list[float]
    cold_runs: int = 0
    #: instead of the query on `load()`: a run that returns what the query would
    run: Callable[[], tuple[int, int, int, int]] | None = None
    #: untimed, before each run
    prepare: Callable[[], None] | None = None


def timed_run(variant: Variant, expected: Expected) -> float:
    """Seconds of one run of the query on `variant`; a wrong answer fails the benchmark."""
    if variant.prepare is not None:
        variant.prepare()
    started = time.perf_counter()
    got = variant.run() if variant.run is not None else aggregate(variant.load())
    elapsed = time.perf_counter() - started
    if got != expected.values():
        raise BenchError(
            f"({variant.key}) {variant.label} answered (rows, sum lsn, sum tick % "
            f"{TICK_MODULUS}, sum length) = {got}, expected {expected.values()}"
        )
    return elapsed


def measure_variants(
    variants: list[Variant],
    expected: Expected,
    repeat: int,
    builds_dir: Path,
    round_warmup: Callable[[], object] | None = None,
) -> None:
    """One untimed run each, then `repeat` interleaved timed rounds, each after an
    untimed `round_warmup`."""
    for variant in variants:
        say(f"warm-up ({variant.key}) {variant.label}")
        elapsed = timed_run(variant, expected)
        say(f"  {elapsed:.2f} s (untimed)")
    for round_number in range(1, repeat + 1):
        if round_warmup is not None:
            # The first Python-source query after the Parquet-only variants runs slower
            # (its first tasks wait 0.5-1 s on the JVM); that must not fall on (a).
            round_warmup()
        for variant in variants:
            for _attempt in range(MAX_COLD_CEILING_RETRIES + 1):
                builds_before = len(list(builds_dir.iterdir()))
                elapsed = timed_run(variant, expected)
                if len(list(builds_dir.iterdir())) == builds_before:
                    break
                # Only the ceiling leaves build markers: a worker started since the warm-up.
                variant.cold_runs += 1
                say(f"  ({variant.key}) a worker built its cache during the run; again")
            else:
                raise BenchError(
                    f"({variant.key}) every run rebuilt the ceiling cache "
                    f"({MAX_COLD_CEILING_RETRIES + 1} runs): Python workers are not reused"
                )
            variant.runs_s.append(elapsed)
            say(f"round {round_number}: ({variant.key}) {elapsed:.2f} s")


# -- where the time goes (one segment, this process, no Spark) -------------------------------


def _median_time(function: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def breakdown(
    snap: Snapshot,
    options: ReadOptions,
    local_options: ReadOptions,
    cluster: dev.LocalCluster,
    repeat: int,
) -> dict[str, Any]:
    """Seconds per stage for one whole segment (the middle one of the plan), single thread,
    medians of `repeat`."""
    slices = plan(options, snap)
    part: SegmentSlice = slices[len(slices) // 2]
    names = vchannel_names(snap, part.pchannel)
    node_id, address = part.replicas[0]
    path = segment_path(cluster.node(node_id).data_dir, part.pchannel, part.segment_id)
    request = wire.ReadSegmentRequest(
        pchannel=part.pchannel,
        segment_id=part.segment_id,
        from_lsn=part.from_lsn,
        to_lsn=part.to_lsn,
        max_chunk_bytes=CHUNK_BYTES,
        with_offsets=True,
    )

    def transfer() -> list[SegmentChunk]:
        with channel(address, options) as chan:
            return list(read_segment_chunks(chan, request, options.timeout_s))

    chunks = transfer()
    frames = [chunk.frames for chunk in chunks]

    def bulk_transfer() -> object:
        with channel(address, options) as chan:
            got = _read_replica(chan, part, options, address, part.from_lsn, part.to_lsn, True)
        if isinstance(got, str):
            raise BenchError(f"{part.label}: bulk transfer from {address}: {got}")
        return got

    with SegmentReader.open(path) as reader:
        buffer, index = reader.buffer, reader.index

        def decode() -> columnar.HeaderColumns:
            return columnar.decode_headers(
                buffer,
                index,
                first_lsn=reader.first_lsn,
                lower_bound=reader.header_len,
                end_offset=reader.data_end,
                start_offset=reader.header_len,
            )

        headers = decode()

        def build() -> pa.RecordBatch:
            return columnar.to_record_batch(
                buffer,
                headers,
                pchannel=part.pchannel,
                segment_id=part.segment_id,
                vchannel_names=names,
                source=str(path),
            )

        stages = {
            "readsegment_transfer_s": _median_time(transfer, repeat),
            "bulk_transfer_s": _median_time(bulk_transfer, repeat),
            "crc32c_one_pass_s": _median_time(lambda: [crc32c(f) for f in frames], repeat),
            "join_chunks_s": _median_time(lambda: gather(frames), repeat),
            "open_verify_blocks_s": _median_time(lambda: SegmentReader.open(path).close(), repeat),
            "decode_headers_s": _median_time(decode, repeat),
            "build_columns_s": _median_time(build, repeat),
        }
    row_filter = RowFilter()

    def read(read_options: ReadOptions) -> Callable[[], list[pa.RecordBatch]]:
        return lambda: list(read_slice(part, read_options, names, row_filter))

    # Either read may come in pieces (spark_connector.fetch.PIECE_ROWS).
    local_table = pa.Table.from_batches(read(local_options)())
    fetched = pa.Table.from_batches(read(options)(), schema=local_table.schema)
    (batch,) = local_table.combine_chunks().to_batches()
    if not fetched.equals(local_table):
        raise BenchError(f"{part.label}: ReadSegment and the local file gave different rows")

    def ipc_write() -> pa.Buffer:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return sink.getvalue()

    stages["read_slice_local_s"] = _median_time(read(local_options), repeat)
    stages["read_slice_remote_s"] = _median_time(read(options), repeat)
    stages["arrow_ipc_write_s"] = _median_time(ipc_write, repeat)
    return {
        "segment": part.label,
        "rows": batch.num_rows,
        "entries": len(headers),
        "segment_bytes": sum(len(f) for f in frames),
        "batch_bytes": batch.nbytes,
        "chunks": len(chunks),
        "stages": {name: round(seconds, 6) for name, seconds in stages.items()},
    }


# -- report ---------------------------------------------------------------------------------


def summarize(variants: list[Variant], rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in variants:
        median_s = statistics.median(variant.runs_s)
        out[variant.key] = {
            "label": variant.label,
            "runs_s": [round(s, 3) for s in variant.runs_s],
            "median_s": round(median_s, 3),
            "rows_per_s": round(rows / median_s, 1),
            "cold_runs_discarded": variant.cold_runs,
        }
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for mine, theirs, target, what in TARGETS:
        ratio = results[mine]["rows_per_s"] / results[theirs]["rows_per_s"]
        out.append(
            {
                "ratio": f"({mine})/({theirs})",
                "what": what,
                "value": round(ratio, 3),
                "target": target,
                "met": ratio >= target,
            }
        )
    return out


def per_segment_costs(
    results: dict[str, Any], fixed_query_s: dict[str, float], segments: int
) -> dict[str, float]:
    """CPU seconds per segment inside Spark, estimated from the medians: wall time minus
    the path's fixed per-query cost, times the cores busy, over the segments."""
    cores = min(SPARK_CORES, segments)
    out = {}
    for key in VARIANTS:
        if key not in results:
            continue
        fixed = fixed_query_s["parquet" if key in ("d", "f") else "python_data_source"]
        out[key] = max(0.0, results[key]["median_s"] - fixed) * cores / segments
    return out


def breakdown_rows(report: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    """(stage, ms per segment, M rows/s on one core, applies to) rows of the breakdown."""
    found = report["breakdown"]
    stages = found["stages"]
    in_spark = report["per_segment_s"]
    spark_rows = report["data"]["rows"] / report["data"]["segments"]
    rows = [
        ("bulk transfer (ReadSegment offer, transfer port, digest)",
         stages["bulk_transfer_s"], found["rows"], "(a)"),
        ("ReadSegment over the gRPC stream (node, gRPC, chunk parse)",
         stages["readsegment_transfer_s"], found["rows"], "(a) without transfer port"),
        ("crc32c over the segment's bytes, one pass", stages["crc32c_one_pass_s"],
         found["rows"], "(a): the digest"),
        ("copy the chunks into one buffer", stages["join_chunks_s"], found["rows"],
         "(a) without transfer port"),
        ("open the local file: mmap + block crcs", stages["open_verify_blocks_s"],
         found["rows"], "(b)"),
        ("decode headers (vectorized, checked)", stages["decode_headers_s"], found["rows"],
         "(a), (b); (c) untimed"),
        ("build the columns (keys, payloads, names)", stages["build_columns_s"],
         found["rows"], "(a), (b); (c) untimed"),
        ("read_slice end to end, preferLocal", stages["read_slice_local_s"], found["rows"],
         "(b) per task"),
        ("read_slice end to end, from a replica", stages["read_slice_remote_s"],
         found["rows"], "(a) per task: pieces fetched while the last is decoded"),
        ("Arrow IPC write of the batch (Python side)", stages["arrow_ipc_write_s"],
         found["rows"], "(a), (b), (c)"),
        ("in Spark: (c) ceiling", in_spark["c"], spark_rows, "hand-off + aggregate"),
        ("in Spark: (d) Parquet", in_spark["d"], spark_rows, "JVM scan + aggregate"),
        ("in Spark: (b) connector preferLocal", in_spark["b"], spark_rows, "measured"),
        ("in Spark: (a) connector ReadSegment", in_spark["a"], spark_rows,
         "measured, nodes on the same cores"),
    ]  # fmt: skip
    return [
        (name, seconds * 1000, rows / seconds / 1e6 if seconds > 0 else 0.0, note)
        for name, seconds, rows, note in rows
    ]


def _rate_text(rows_per_s_millions: float, ms: float) -> str:
    # A stage that takes no measurable time (one chunk needs no join) has no rate to show.
    return "-" if ms < 0.1 else f"{rows_per_s_millions:.2f}"


def render_breakdown_notes(report: dict[str, Any]) -> list[str]:
    found = report["breakdown"]
    stages = found["stages"]
    in_spark = report["per_segment_s"]
    fixed = report["fixed_query_s"]
    predicted_b = in_spark["c"] + stages["read_slice_local_s"]
    predicted_a = in_spark["c"] + stages["read_slice_remote_s"]
    return [
        f"breakdown segment: {found['segment']}, {found['rows']:,} rows "
        f"({found['entries']:,} entries), {found['segment_bytes'] / 2**20:.1f} MiB of frames "
        f"in {found['chunks']} ReadSegment chunk(s), {found['batch_bytes'] / 2**20:.1f} MiB as "
        "Arrow; this process, one thread, no Spark, medians",
        "'in Spark' rows: (median - the path's fixed per-query cost) x "
        f"{min(SPARK_CORES, report['data']['segments'])} cores / segments, i.e. CPU time per "
        "segment with both cores busy; fixed per-query cost (the same query over no rows): "
        f"Python data source {fixed['python_data_source']:.2f} s, Parquet "
        f"{fixed['parquet']:.2f} s",
        f"(b) ~ (c) + read_slice local = {predicted_b * 1000:.0f} ms per segment predicted, "
        f"{in_spark['b'] * 1000:.0f} ms measured; (a) ~ (c) + read_slice remote = "
        f"{predicted_a * 1000:.0f} ms predicted, {in_spark['a'] * 1000:.0f} ms measured "
        "(plus the nodes' CPU for ReadSegment, on the same cores)",
    ]


def variant_rows(report: dict[str, Any]) -> list[list[str]]:
    results = report["results"]
    parquet = results["d"]["rows_per_s"]
    ceiling = results["c"]["rows_per_s"]
    rows = []
    for key in [k for k in VARIANTS if k in results]:
        entry = results[key]
        rows.append(
            [
                f"({key}) {entry['label']}",
                f"{entry['median_s']:.2f}",
                f"{entry['rows_per_s'] / 1e6:.2f}",
                f"{entry['rows_per_s'] / ceiling:.2f}x",
                f"{entry['rows_per_s'] / parquet:.2f}x",
                " ".join(f"{s:.2f}" for s in entry["runs_s"]),
            ]
        )
    return rows


VARIANT_HEADER = ["variant", "median s", "M rows/s", "vs (c)", "vs (d)", "runs s"]
BREAKDOWN_HEADER = ["where a segment's time goes", "ms", "M rows/s", "applies to"]


def _notes(report: dict[str, Any]) -> list[str]:
    data = report["data"]
    machine = report["machine"]
    settings = report["settings"]
    return [
        f"command: {report['command']}",
        f"{report['date']}; {machine['cpus']} cores, load average {machine['load_before']} "
        f"before and {machine['load_after']} after; {machine['platform']}; Python "
        f"{machine['python']}, pyspark {machine['pyspark']}, pyarrow {machine['pyarrow']}, "
        f"Java {machine['java']}; Spark {SPARK_MASTER}",
        f"{data['rows']:,} rows of {PAYLOAD_BYTES}-byte random payloads in {data['segments']} "
        f"committed segments over {settings['pchannels']} pchannels "
        f"({data['segment_bytes'] / 2**20:,.0f} MiB, {data['bytes_per_row']:.0f} bytes per "
        f"entry on disk); produced at {data['produce_msgs_per_s']:,.0f} msgs/s; Parquet "
        f"{data['parquet_bytes'] / 2**20:,.0f} MiB in {data['parquet_files']} files; the "
        f"export {data['export_bytes'] / 2**20:,.0f} MiB in {data['export_files']} files",
        f"query: count, sum(lsn), sum(time_tick % {TICK_MODULUS}), sum(length(payload)); all "
        "variants returned the expected values on every run; medians of "
        f"{settings['repeat']} interleaved rounds after one warm-up each",
    ]


def _target_text(target: dict[str, Any]) -> str:
    verdict = "met" if target["met"] else "missed"
    return (
        f"target {target['ratio']} {target['what']} >= {target['target']:.2f}x: "
        f"{target['value']:.2f}x -> {verdict}"
    )


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        "| " + " | ".join(VARIANT_HEADER) + " |",
        "|---|" + "---:|" * (len(VARIANT_HEADER) - 1),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in variant_rows(report)]
    lines.append("")
    for target in report["targets"]:
        text = _target_text(target)
        lines.append("- " + text.replace("-> missed", "-> **missed**"))
    lines += [
        "",
        "| " + " | ".join(BREAKDOWN_HEADER) + " |",
        "|---|---:|---:|---|",
    ]
    lines += [
        f"| {name} | {ms:.1f} | {_rate_text(rate, ms)} | {note} |"
        for name, ms, rate, note in breakdown_rows(report)
    ]
    lines.append("")
    lines += [f"- {note}" for note in render_breakdown_notes(report) + _notes(report)]
    return "\n".join(lines)


def render(report: dict[str, Any]) -> None:
    out = Console(width=max(120, Console().width))
    table = Table(title=f"Spark read of committed segments ({report['date']})")
    for k, name in enumerate(VARIANT_HEADER):
        table.add_column(name, justify="left" if k in (0, len(VARIANT_HEADER) - 1) else "right")
    for row in variant_rows(report):
        table.add_row(*row)
    out.print(table)
    for target in report["targets"]:
        color = "green" if target["met"] else "red"
        out.print(f"[{color}]{_target_text(target)}[/{color}]", highlight=False)
    stages = Table(title="Where a segment's time goes")
    for k, name in enumerate(BREAKDOWN_HEADER):
        stages.add_column(name, justify="right" if k in (1, 2) else "left")
    for name, ms, rate, note in breakdown_rows(report):
        stages.add_row(name, f"{ms:.1f}", _rate_text(rate, ms), note)
    out.print(stages)
    for note in render_breakdown_notes(report) + _notes(report):
        out.print(note, highlight=False)


# -- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000_000, help="(10,000,000)")
    parser.add_argument("--segments", type=int, default=40, help="committed segments (40)")
    parser.add_argument("--pchannels", type=int, default=4, help="(4)")
    parser.add_argument("--batch", type=int, default=1000, help="messages per Produce (1000)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (3)")
    parser.add_argument(
        "--keep-dir", action="store_true", help="keep data dirs, Parquet and logs (path on stderr)"
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON object")
    output.add_argument(
        "--markdown", action="store_true", help="print Markdown tables (BENCHMARKS.md)"
    )
    args = parser.parse_args(argv)
    for name, low, high in (
        ("messages", 1000, 1_000_000_000),
        ("segments", 1, 10_000),
        ("pchannels", 1, 64),
        ("batch", 1, 10_000),
        ("repeat", 1, 20),
    ):
        value = getattr(args, name)
        if not low <= value <= high:
            parser.error(f"invalid --{name} ({value}; expected {low}..{high})")
    if args.segments % args.pchannels:
        parser.error(
            f"invalid --segments ({args.segments}; expected a multiple of --pchannels "
            f"{args.pchannels})"
        )
    if args.messages % (args.segments * args.batch):
        parser.error(
            f"invalid --messages ({args.messages}; expected a multiple of --segments x --batch "
            f"= {args.segments * args.batch}, so that every segment holds whole batches)"
        )
    layout = Layout(args.messages, args.segments, args.pchannels, args.batch)
    if layout.segment_max_bytes() > MAX_SEGMENT_BYTES:
        parser.error(
            f"invalid --messages / --segments ({layout.per_segment:,} messages per segment, "
            f"{layout.segment_max_bytes():,} bytes; expected <= {MAX_SEGMENT_BYTES:,} bytes)"
        )
    return args


def _java_version(spark: Any) -> str:
    return str(spark.sparkContext._jvm.System.getProperty("java.version"))


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def measure_in_spark(
    root: Path,
    cluster: dev.LocalCluster,
    snap: Snapshot,
    expected: Expected,
    remote_options: dict[str, str],
    local_options: dict[str, str],
    repeat: int,
) -> dict[str, Any]:
    """Start the SparkSession, write the Parquet copy, run the variants and the fixed-cost
    queries; the session is stopped whatever happens."""
    say("starting the SparkSession")
    spark = start_spark()
    try:
        import spark_connector

        spark_connector.register(spark)
        spark.dataSource.register(CeilingDataSource)
        reader_node = cluster.config.nodes[0]
        every_segment = [
            CeilingSegment(
                path=str(segment_path(reader_node.data_dir, s.pchannel, s.segment_id)),
                pchannel=s.pchannel,
                segment_id=s.segment_id,
                vchannel_names=vchannel_names(snap, s.pchannel),
            )
            for s in snap.segments
        ]
        builds_dir = root / "ceiling-builds"
        builds_dir.mkdir()
        parquet_dir = root / "parquet"
        empty_parquet_dir = root / "parquet-empty"

        def connector(options: dict[str, str]) -> Callable[[], Any]:
            def load() -> Any:
                reader = spark.read.format("raftwal")
                for key, value in options.items():
                    reader = reader.option(key, value)
                return reader.load()

            return load

        def ceiling(segments: list[CeilingSegment]) -> Callable[[], Any]:
            text = json.dumps([segment.to_json() for segment in segments])
            return lambda: (
                spark.read.format(CEILING_NAME)
                .option("segments", text)
                .option("buildsDir", str(builds_dir))
                .load()
            )

        say(f"writing Parquet (untimed) to {parquet_dir}")
        connector(local_options)().write.parquet(str(parquet_dir))
        connector(local_options)().limit(0).write.parquet(str(empty_parquet_dir))
        parquet_files = list(parquet_dir.glob("*.parquet"))
        export_dir = root / "export"
        say(f"exporting (untimed) to {export_dir}")
        first = export(spark, export_dir, local_options)
        if first.rows != expected.rows:
            raise BenchError(f"the export wrote {first.rows:,} rows, expected {expected.rows:,}")
        exports_root = root / "exports"
        exports_root.mkdir()

        def export_prepare() -> None:
            # The previous timed export's directory goes, untimed (disk space).
            for previous in exports_root.iterdir():
                shutil.rmtree(previous)

        def export_run() -> tuple[int, int, int, int]:
            result = export(spark, exports_root / f"run-{time.monotonic_ns()}", local_options)
            if result.rows != expected.rows:
                raise BenchError(f"(e) exported {result.rows:,} rows, expected {expected.rows:,}")
            return expected.values()

        variants = [
            Variant("a", VARIANTS["a"], connector(remote_options), []),
            Variant("b", VARIANTS["b"], connector(local_options), []),
            Variant("c", VARIANTS["c"], ceiling(every_segment), []),
            Variant("d", VARIANTS["d"], lambda: spark.read.parquet(str(parquet_dir)), []),
            Variant(
                "e",
                VARIANTS["e"],
                lambda: None,
                [],
                run=export_run,
                prepare=export_prepare,
            ),
            Variant("f", VARIANTS["f"], lambda: spark.read.parquet(str(export_dir)), []),
        ]
        measure_variants(
            variants,
            expected,
            repeat,
            builds_dir,
            round_warmup=lambda: aggregate(ceiling(every_segment[:1])()),
        )
        # The same query over no rows: what every query pays before its first row.
        no_rows = Expected(0, 0, 0, 0)
        fixed_query_s = {
            name: statistics.median(
                timed_run(Variant(name, f"{name} over no rows", load, []), no_rows)
                for _ in range(repeat)
            )
            for name, load in (
                ("python_data_source", ceiling([])),
                ("parquet", lambda: spark.read.parquet(str(empty_parquet_dir))),
            )
        }
        return {
            "results": summarize(variants, expected.rows),
            "fixed_query_s": fixed_query_s,
            "parquet_bytes": sum(path.stat().st_size for path in parquet_files),
            "parquet_files": len(parquet_files),
            "export_bytes": sum(p.stat().st_size for p in export_dir.rglob("part-*.parquet")),
            "export_files": first.files,
            "pyspark": spark.version,
            "java": _java_version(spark),
        }
    finally:
        say("stopping the SparkSession")
        spark.stop()


def start_cluster(layout: Layout, directory: Path) -> dev.LocalCluster:
    """Three nodes whose segments seal at `layout`'s size, never by age."""
    segment_max_bytes = layout.segment_max_bytes()
    environ = dict(os.environ)
    environ["RAFTWAL_SEGMENT_MAX_BYTES"] = str(segment_max_bytes)
    environ["RAFTWAL_SEGMENT_MAX_AGE_MS"] = str(SEGMENT_MAX_AGE_MS)
    say(
        f"starting a 3-node cluster under {directory} (segment_max_bytes "
        f"{segment_max_bytes:,}: {layout.per_segment:,} messages per segment)"
    )
    try:
        return dev.up(directory, 3, timeout_s=START_TIMEOUT_S, env=environ)
    except BaseException as error:
        # Failed or interrupted while waiting for the nodes: stop them by the pids that
        # cluster.json holds.
        dev.down(directory)
        if isinstance(error, TimeoutError):
            raise BenchError(f"{error}; node logs: {directory}/n*.log (--keep-dir)") from None
        raise


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    layout = Layout(args.messages, args.segments, args.pchannels, args.batch)
    started_at = datetime.datetime.now(datetime.UTC)
    load_before = _load()
    cluster = start_cluster(layout, root / "cluster")
    try:
        acks, produce_s = asyncio.run(prepare(cluster, layout))
        remote_options = {"endpoints": ",".join(cluster.endpoints)}
        local_options = {
            **remote_options,
            "preferLocal": "true",
            "localDataDirs": ",".join(f"{n.id}={n.data_dir}" for n in cluster.config.nodes),
        }
        # The manifest every variant reads: nothing is written or sealed any more.
        snap = snapshot(parse_options(remote_options))
        segments = snap.segments
        expected = expected_from(acks, segments)
        committed_entries = sum(s.count for s in segments)
        segment_bytes = sum(s.bytes for s in segments)
        say(
            f"{len(segments)} committed segments: {committed_entries:,} entries "
            f"({expected.rows:,} messages), {segment_bytes / 2**20:,.0f} MiB"
        )
        if len(segments) != layout.segments or expected.rows != layout.messages:
            say(
                f"[yellow]asked for {layout.messages:,} messages in {layout.segments} segments, "
                f"committed {expected.rows:,} in {len(segments)}: figures are for the "
                "latter[/yellow]"
            )
        if committed_entries < expected.rows + len(segments):
            raise BenchError(
                f"the manifest counts {committed_entries:,} entries, expected at least "
                f"{expected.rows:,} messages + {len(segments)} seal entries"
            )
        say("breakdown of one segment (this process, no Spark)")
        found = breakdown(
            snap,
            parse_options(remote_options),
            parse_options(local_options),
            cluster,
            BREAKDOWN_REPEAT,
        )
        in_spark = measure_in_spark(
            root, cluster, snap, expected, remote_options, local_options, args.repeat
        )
    finally:
        say("stopping the cluster")
        cluster.stop_all()
    results = in_spark["results"]
    return {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": _load(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "pyspark": in_spark["pyspark"],
            "pyarrow": pa.__version__,
            "java": in_spark["java"],
        },
        "settings": {
            "messages": args.messages,
            "segments": args.segments,
            "pchannels": args.pchannels,
            "batch": args.batch,
            "repeat": args.repeat,
            "payload_bytes": PAYLOAD_BYTES,
            "segment_max_bytes": layout.segment_max_bytes(),
            "spark_master": SPARK_MASTER,
        },
        "data": {
            "rows": expected.rows,
            "segments": len(segments),
            "committed_entries": committed_entries,
            "segment_bytes": segment_bytes,
            "bytes_per_row": round(segment_bytes / max(1, committed_entries), 1),
            "produce_s": round(produce_s, 3),
            "produce_msgs_per_s": round(
                sum(len(t) for a in acks.values() for t in a.time_ticks) / produce_s, 1
            ),
            "parquet_bytes": in_spark["parquet_bytes"],
            "parquet_files": in_spark["parquet_files"],
            "export_bytes": in_spark["export_bytes"],
            "export_files": in_spark["export_files"],
            "expected": dict(
                zip(
                    ("rows", "sum_lsn", "sum_tick_mod", "sum_payload_bytes"),
                    expected.values(),
                    strict=True,
                )
            ),
        },
        "results": results,
        "fixed_query_s": {k: round(v, 3) for k, v in in_spark["fixed_query_s"].items()},
        "per_segment_s": {
            k: round(v, 4)
            for k, v in per_segment_costs(results, in_spark["fixed_query_s"], len(segments)).items()
        },
        "breakdown": found,
        "targets": targets(results),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="raftwal-spark-bench-"))
    say(f"data dirs, Parquet and logs under {root}")
    try:
        report = run(args, root)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        if args.keep_dir:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(report, allow_nan=False))
    elif args.markdown:
        print(render_markdown(report))
    else:
        render(report)
    return 0


if __name__ == "__main__":
    # Run as the module `spark_read`, not as `__main__`: Spark pickles the ceiling source's
    # classes by module and name, and its Python workers can import `spark_read` (bench/ is
    # on their PYTHONPATH) but not this process's `__main__`.
    import spark_read

    sys.exit(spark_read.main())
