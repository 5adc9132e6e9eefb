"""CPU of one ReadSegment transfer, on both ends: the serving node and the reader.

Starts a three-node dev cluster sealing segments at 250,000 100-byte messages (as
`bench/spark_read.py` does), produces `--messages` messages to one pchannel, then fetches
one committed segment `--repeat` times each way, alternating, from one replica, as the
Spark connector does (`spark_connector.fetch._read_replica`: the frames in one buffer,
checked against the committed digest):

- stream: ReadSegment's chunks over gRPC;
- bulk: ReadSegment's offer, then the frames over the node's segment transfer port.

For each fetch it records the wall time, this process's CPU time and the serving node's
CPU time (from /proc/<pid>/stat, in clock ticks: 10 ms on most kernels), and prints their
medians per way.

    ./run bench read_segment_cpu [--messages N] [--repeat N]

Reported, never asserted. The host's speed drifts; compare runs made back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import spark_read  # noqa: E402 (the benchmark next to this one: cluster and producer)

from spark_connector.fetch import _read_replica  # noqa: E402
from spark_connector.options import parse_options  # noqa: E402
from spark_connector.plan import channel, plan, snapshot  # noqa: E402


def process_cpu_s(pid: int) -> float:
    """utime + stime of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="(1,000,000)")
    parser.add_argument("--repeat", type=int, default=15, help="fetches of the segment (15)")
    args = parser.parse_args(argv)
    if not 250_000 <= args.messages <= 20_000_000 or not 1 <= args.repeat <= 1000:
        parser.error("expected --messages 250,000..20,000,000 and --repeat 1..1000")
    root = Path(tempfile.mkdtemp(prefix="read-segment-cpu-"))
    layout = spark_read.Layout(args.messages, max(1, args.messages // 250_000), 1, 1000)
    cluster = spark_read.start_cluster(layout, root / "cluster")
    try:
        asyncio.run(spark_read.prepare(cluster, layout))
        options = parse_options({"endpoints": ",".join(cluster.endpoints)})
        part = plan(options, snapshot(options))[0]
        node_id, address = part.replicas[0]
        pid = cluster.pid(node_id)
        if pid is None:
            raise SystemExit(f"node {node_id} has no pid")
        low, high = part.from_lsn, part.to_lsn
        ways = {"stream": False, "bulk": True}
        walls: dict[str, list[float]] = {way: [] for way in ways}
        clients: dict[str, list[float]] = {way: [] for way in ways}
        nodes: dict[str, list[float]] = {way: [] for way in ways}
        size = 0
        for _ in range(args.repeat):
            for way, bulk in ways.items():
                client0, node0 = time.process_time(), process_cpu_s(pid)
                wall0 = time.perf_counter()
                with channel(address, options) as chan:
                    frames = _read_replica(chan, part, options, address, low, high, bulk)
                walls[way].append(time.perf_counter() - wall0)
                clients[way].append(time.process_time() - client0)
                nodes[way].append(process_cpu_s(pid) - node0)
                if isinstance(frames, str):
                    raise SystemExit(f"{way}: {frames}")
                size = frames.end_offset
        print(
            f"segment {part.segment_id} of {part.pchannel}: {size / 2**20:.1f} MiB, "
            f"{high - low + 1:,} entries, {args.repeat} fetches each way from node {node_id}"
            "; medians:"
        )
        for way in ways:
            print(
                f"  {way:6}: wall {statistics.median(walls[way]) * 1000:.0f} ms, "
                f"reader CPU {statistics.median(clients[way]) * 1000:.0f} ms, "
                f"serving node CPU {statistics.median(nodes[way]) * 1000:.0f} ms"
            )
    finally:
        spark_read.dev.down(root / "cluster")
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
