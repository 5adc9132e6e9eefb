"""Structured Streaming latency: from a produce's acknowledgement to the row being visible in
a memory sink of `spark.readStream.format("raftwal")` with the default trigger, side by side
with a plain `Consume` stream (the WAL's own delivery latency) in the same run.

Setup (untimed): a three-node cluster on loopback (`raftwal.cli.dev`), one pchannel
(replica set 3) with one vchannel, a SparkSession (`local[2]`, as `raftwal spark-read`
starts it) and two readers started before any message is produced:
  (a) a streaming query `readStream.format("raftwal")` -> `writeStream.format("memory")`
      with no trigger set (Spark's default: the next micro-batch as soon as the last ends);
  (b) a raw `Consume` stream at the pchannel's owner (the reference: what any consumer of
      the WAL waits).
Then one producer sends `--messages` single-message batches, one every `--interval-ms`, and
records when each is acknowledged.

Visible in the sink: a `StreamingQueryListener` records when each micro-batch's progress
arrives, which Spark reports after the batch was committed to the memory sink; a message is
visible at the first progress whose end offset covers its LSN. Latency = that time minus
the acknowledgement time (both on this process's wall clock). At the end every acknowledged
message must be in the memory table exactly once, or the run fails.

    ./run bench spark_stream [--messages N] [--interval-ms MS] [--json]

Target (the Spark connector issue): p99 <= 2 s from acknowledgement to visible.
Everything started here (the nodes by pid, the SparkSession, the temp dir) is stopped and
removed in `finally` blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from raftwal.cli import dev
from rpc.placement import serving_address
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import median, percentile  # noqa: E402

START_TIMEOUT_S = 90
PCHANNEL = "stream_bench_0"
VCHANNEL = "stream_bench_v"
#: Bound on waiting for the last messages to arrive in the sink after the producer ends.
DRAIN_TIMEOUT_S = 60.0


class BenchError(RuntimeError):
    pass


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _owner(coordinator: Any) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        status = coordinator.ClusterStatus(api.ClusterStatusRequest(), timeout=5)
        for p in status.pchannels:
            if p.name == PCHANNEL and p.state == pb.PCHANNEL_STATE_ASSIGNED:
                return serving_address(status.nodes, p.owner_node_id, PCHANNEL)
        time.sleep(0.2)
    raise BenchError(f"{PCHANNEL} was not assigned within {START_TIMEOUT_S} s")


def _wait_nodes_up(coordinator: Any) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        status = coordinator.ClusterStatus(api.ClusterStatusRequest(), timeout=5)
        if sum(1 for n in status.nodes if n.state == pb.NODE_STATE_UP) >= 3:
            return
        time.sleep(0.2)
    raise BenchError("the three nodes were not UP in time")


class ConsumeReference(threading.Thread):
    """A raw Consume stream at the owner: the arrival time of each LSN."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.arrived: dict[int, float] = {}
        self.stream: Any = None
        self.error: str = ""

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as chan:
            self.stream = streaming_pb2_grpc.StreamingNodeStub(chan).Consume(
                wire.ConsumeRequest(vchannel=VCHANNEL, policy=wire.DELIVER_POLICY_ALL),
                timeout=3600,
            )
            try:
                for response in self.stream:
                    now = time.time()
                    for entry in response.entries:
                        self.arrived.setdefault(entry.lsn, now)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.CANCELLED:
                    self.error = f"{error.code()}: {error.details()}"

    def stop(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        self.join(timeout=10)


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from pyspark.sql.streaming import StreamingQueryListener

    import spark_connector
    from spark_connector.session import start_session

    say(f"starting a 3-node cluster under {root}")
    cluster = dev.up(root / "cluster", 3, timeout_s=START_TIMEOUT_S, env=dict(os.environ))
    spark = None
    query = None
    reference: ConsumeReference | None = None
    coordinator_channel = grpc.insecure_channel(cluster.endpoints[0])
    try:
        coordinator = coordinator_pb2_grpc.CoordinatorStub(coordinator_channel)
        _wait_nodes_up(coordinator)
        coordinator.CreateChannels(
            api.CreateChannelsRequest(names=[PCHANNEL], replica_count=3), timeout=30
        )
        coordinator.CreateVChannel(
            api.CreateVChannelRequest(name=VCHANNEL, pchannel=PCHANNEL), timeout=30
        )
        owner = _owner(coordinator)
        say("starting Spark")
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark = start_session(
            "local[2]",
            "raftwal bench spark_stream",
            {"spark.sql.shuffle.partitions": "2", "spark.python.worker.reuse": "true"},
        )
        spark_connector.register(spark)

        #: (time the progress arrived, end LSN of the pchannel)
        progress: list[tuple[float, int]] = []

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryProgress(self, event: Any) -> None:  # noqa: N802
                now = time.time()
                for source in event.progress.sources:
                    end = json.loads(source.endOffset or "{}")
                    if isinstance(end, dict) and PCHANNEL in end:
                        progress.append((now, int(end[PCHANNEL])))

            def onQueryIdle(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
                pass

        spark.streams.addListener(Listener())
        query = (
            spark.readStream.format("raftwal")
            .option("endpoints", ",".join(cluster.endpoints))
            .option("vchannels", VCHANNEL)
            .load()
            .writeStream.format("memory")
            .queryName("bench_stream")
            .start()
        )
        reference = ConsumeReference(owner)
        reference.start()
        # Let the query get past its first (empty) batches before measuring.
        deadline = time.monotonic() + START_TIMEOUT_S
        while not progress and time.monotonic() < deadline:
            time.sleep(0.1)
        if not progress:
            raise BenchError(f"the streaming query made no progress: {query.exception()}")

        say(f"producing {args.messages} messages, one every {args.interval_ms} ms")
        acked: dict[int, float] = {}
        with grpc.insecure_channel(owner) as chan:
            stub = streaming_pb2_grpc.StreamingNodeStub(chan)
            for k in range(args.messages):
                request = wire.ProduceRequest(
                    request_id=k + 1,
                    pchannel=PCHANNEL,
                    messages=[wire.Message(vchannel=VCHANNEL, payload=b"m%08d" % k)],
                    producer_id="bench",
                    sequence=k + 1,
                )
                (result,) = list(stub.Produce(iter([request]), timeout=30))
                now = time.time()
                if result.HasField("error") and result.error.code:
                    raise BenchError(f"produce {k} failed: {result.error.message}")
                acked[result.positions[0].lsn] = now
                time.sleep(args.interval_ms / 1000)
        last_lsn = max(acked)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if progress and max(end for _, end in progress) >= last_lsn:
                break
            if query.exception() is not None:
                raise BenchError(f"the streaming query failed: {query.exception()}")
            time.sleep(0.1)
        else:
            raise BenchError(f"the sink did not reach lsn {last_lsn} in {DRAIN_TIMEOUT_S} s")
        rows = spark.sql("select lsn from bench_stream").collect()
        lsns = [r.lsn for r in rows]
        if len(lsns) != len(set(lsns)) or set(acked) - set(lsns):
            raise BenchError(
                f"the sink holds {len(lsns)} rows ({len(set(lsns))} distinct); "
                f"{len(set(acked) - set(lsns))} acknowledged messages missing"
            )
        spark_ms: list[float] = []
        ordered = sorted(progress)
        for lsn, acked_at in acked.items():
            visible = next(t for t, end in ordered if end >= lsn)
            spark_ms.append((visible - acked_at) * 1000)
        consume_ms = [
            (reference.arrived[lsn] - acked_at) * 1000
            for lsn, acked_at in acked.items()
            if lsn in reference.arrived
        ]
        batches = [p for p in query.recentProgress if p.numInputRows]
        # Where a micro-batch's time goes (Spark's own phases), median over those with rows.
        phases: dict[str, float] = {}
        for name in sorted({k for p in batches for k in (p.durationMs or {})}):
            values = [float(p.durationMs[name]) for p in batches if name in p.durationMs]
            phases[name] = median(values)
        return {
            "bench": "spark_stream",
            "command": "./run bench spark_stream " + " ".join(sys.argv[1:]),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}",
            "messages": len(acked),
            "interval_ms": args.interval_ms,
            "spark_visible_ms": {
                "p50": percentile(spark_ms, 0.5),
                "p99": percentile(spark_ms, 0.99),
                "max": max(spark_ms),
                "median": median(spark_ms),
            },
            "consume_ms": {
                "p50": percentile(consume_ms, 0.5),
                "p99": percentile(consume_ms, 0.99),
                "received": len(consume_ms),
            },
            "micro_batches_with_rows": len(batches),
            "batch_phase_median_ms": phases,
            "load_average_1m": os.getloadavg()[0],
            "reference_error": reference.error,
        }
    finally:
        if reference is not None:
            reference.stop()
        if query is not None:
            query.stop()
        if spark is not None:
            spark.stop()
        coordinator_channel.close()
        cluster.stop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300, help="messages produced (300)")
    parser.add_argument(
        "--interval-ms", type=int, default=100, help="pause between messages, ms (100)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep-dir", action="store_true", help="keep the data dirs")
    args = parser.parse_args(argv)
    if not 1 <= args.messages <= 1_000_000 or not 0 <= args.interval_ms <= 60_000:
        parser.error("--messages 1..1000000, --interval-ms 0..60000")
    root = Path(tempfile.mkdtemp(prefix="raftwal-stream-bench-"))
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
        print(json.dumps(report))
    else:
        s, c = report["spark_visible_ms"], report["consume_ms"]
        print(f"{report['command']}  ({report['machine']})")
        print(
            f"ack -> visible in the memory sink (default trigger): p50 {s['p50']:.0f} ms, "
            f"p99 {s['p99']:.0f} ms, max {s['max']:.0f} ms over {report['messages']} messages"
        )
        print(
            f"ack -> delivered by Consume (reference):            p50 {c['p50']:.1f} ms, "
            f"p99 {c['p99']:.1f} ms ({c['received']} received)"
        )
        print(f"micro-batches with rows: {report['micro_batches_with_rows']}")
        phases = ", ".join(f"{k} {v:.0f}" for k, v in report["batch_phase_median_ms"].items())
        print(f"median ms per micro-batch phase: {phases}")
        print(f"load average (1 min) at the end: {report['load_average_1m']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
