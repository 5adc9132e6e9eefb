"""Where raftwal's produce tail latency comes from: open-loop phases at fixed rates, and the
late batches grouped by when they were sent.

The same three-node cluster (fsync policy `always`), producers and open-loop pacing as
`bench/wal.py`'s half-load phase, but on its own: a warm-up, then one `--duration-s`
phase per rate in `--rates` (100-byte messages in batches of 100 over `--producers`
producers). For each phase it prints p50/p90/p99/max, and the "bunches": batches later
than `--late-ms` grouped by 100 ms of send time. A bunch of many late batches at once is
a stall of the whole pipeline (a segment roll, a pause of a node); late batches spread
thinly are scheduling noise. `bench/wal.py` measures the half-load p99 that the target
names, after its throughput phases; this isolates it.

    ./run bench wal_tail [--rates 55000,40000,25000] [--duration-s 8] [--json]
                         [--stall-watch-ms 12] [--produce-over port|grpc]

`--stall-watch-ms N` also watches the event loop of every node and of this process
(`bench/stallwatch/sitecustomize.py`): each phase then reports, per process, the stalls
longer than N ms and the innermost raftwal frames they were caught in. Ordinary short
work in those frames means CPU starvation; one long operation shows as the same frame.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import own_cpu_seconds, percentile, tree_cpu_seconds
from stallwatch.sitecustomize import install as install_stall_watch
from wal import SIZES, RaftwalWal, close_all, paced_load, say


def bunches(timeline: list[tuple[float, float]], late_s: float) -> list[dict[str, float]]:
    """Late batches grouped by 100 ms of send time: start, count, worst latency (ms)."""
    groups: dict[int, list[float]] = {}
    for sent_s, latency_s in timeline:
        if latency_s > late_s:
            groups.setdefault(int(sent_s * 10), []).append(latency_s)
    return [
        {"sent_s": key / 10, "late_batches": len(late), "worst_ms": round(max(late) * 1000, 1)}
        for key, late in sorted(groups.items())
    ]


STALL_WATCH_DIR = Path(__file__).resolve().parent / "stallwatch"
#: Path fragments of the frames a stall is attributed to (the innermost one found).
PROJECT_PATHS = ("/raftwal/", "/wal_segments/", "/rpc/", "/raft/", "/bench/")


def watch_stalls(root: Path, threshold_ms: float) -> str:
    """Have the nodes started from now on (and this process's loop) report event-loop
    stalls over `threshold_ms`; returns the report files' prefix."""
    prefix = str(root / "stalls")
    os.environ["RAFTWAL_STALL_WATCH"] = prefix
    os.environ["RAFTWAL_STALL_WATCH_MS"] = str(threshold_ms)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(STALL_WATCH_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    install_stall_watch(asyncio.get_running_loop(), prefix, threshold_ms / 1000)
    return prefix


def stall_summary(prefix: str, start: float, end: float) -> dict[str, Any]:
    """Per process: the stalls that began in [start, end] (wall clock), their longest, and
    the innermost project frames they were caught in, most frequent first."""
    by_process: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(prefix).parent.glob(Path(prefix).name + ".*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            stall = json.loads(line)
            began = stall["at"] - stall["lag_ms"] / 1000
            if not start <= began <= end:
                continue
            entry = by_process.setdefault(
                stall["process"], {"stalls": 0, "longest_ms": 0.0, "frames": {}}
            )
            entry["stalls"] += 1
            entry["longest_ms"] = max(entry["longest_ms"], stall["lag_ms"])
            ours = [
                f
                for f in stall["stack"]
                if any(p in f for p in PROJECT_PATHS) and "/stallwatch/" not in f
            ]
            innermost = stall["stack"][-1].rsplit("/", 1)[-1] if stall["stack"] else "?"
            frame = ours[-1].rsplit("/", 1)[-1] if ours else f"(no project frame: {innermost})"
            entry["frames"][frame] = entry["frames"].get(frame, 0) + 1
    for entry in by_process.values():
        entry["frames"] = dict(sorted(entry["frames"].items(), key=lambda kv: -kv[1])[:5])
    return dict(sorted(by_process.items()))


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    payloads = {size: os.urandom(length) for size, length in SIZES.items()}
    stall_prefix = watch_stalls(root, args.stall_watch_ms) if args.stall_watch_ms else None
    system = RaftwalWal(root / "raftwal", payloads, args.produce_over == "port")
    await system.start()
    phases = []
    try:
        producers = await system.producers("small", args.producers, 100)
        try:
            await paced_load(producers, args.rates[-1], 2.0)  # warm-up
            for rate in args.rates:
                started = time.time()
                pids = system.pids()
                cpu_before = {node: tree_cpu_seconds(pid) for node, pid in pids.items()}
                own_before, clock_before = own_cpu_seconds(), time.monotonic()
                result = await paced_load(producers, rate, args.duration_s)
                elapsed_s = time.monotonic() - clock_before
                samples = result.latencies.samples_s
                # CPU per node over the phase, busiest first (the busiest is the owner of
                # the pchannel under load), in cores and in ms per 100-message batch.
                cpu_s = {
                    node: tree_cpu_seconds(pid) - cpu_before[node] for node, pid in pids.items()
                }
                cpu_s["load generator"] = own_cpu_seconds() - own_before
                cpu = {
                    node: {
                        "cores": round(spent / elapsed_s, 3),
                        "ms_per_batch": round(spent * 1000 / max(1, len(samples)), 3),
                    }
                    for node, spent in sorted(cpu_s.items(), key=lambda kv: -kv[1])
                }
                phase = {
                    "rate_msgs_per_s": rate,
                    "batches": len(samples),
                    "errors": dict(result.latencies.errors),
                    **{
                        f"p{int(q * 100)}_ms": round(percentile(samples, q) * 1000, 2)
                        for q in (0.5, 0.9, 0.99)
                    },
                    "max_ms": round(max(samples, default=0.0) * 1000, 2),
                    "bunches": bunches(result.timeline, args.late_ms / 1000),
                    "cpu": cpu,
                    "load_average_1m": os.getloadavg()[0],
                }
                if stall_prefix is not None:
                    phase["stalls"] = stall_summary(stall_prefix, started, time.time())
                phases.append(phase)
                big = [b for b in phase["bunches"] if b["late_batches"] >= 10]
                say(
                    f"{rate:,} msgs/s: p50 {phase['p50_ms']} ms, p90 {phase['p90_ms']} ms, "
                    f"p99 {phase['p99_ms']} ms, max {phase['max_ms']} ms; "
                    f"{len(phase['bunches'])} windows with batches over {args.late_ms:g} ms, "
                    f"{len(big)} of them with 10 or more: {big}"
                )
                say(
                    "  CPU (cores, ms per batch): "
                    + ", ".join(f"{n} {c['cores']} {c['ms_per_batch']}" for n, c in cpu.items())
                )
                if stall_prefix is not None:
                    say(
                        f"  event-loop stalls over {args.stall_watch_ms:g} ms: "
                        + (json.dumps(phase["stalls"]) if phase["stalls"] else "none")
                    )
        finally:
            await close_all(producers)
    finally:
        await system.stop()
    return {
        "command": "python bench/wal_tail.py " + " ".join(sys.argv[1:]),
        "producers": args.producers,
        "duration_s": args.duration_s,
        "late_ms": args.late_ms,
        "phases": phases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates",
        type=lambda text: [int(r) for r in text.split(",")],
        default=[55_000, 40_000, 25_000],
        help="msgs/s of each phase, comma-separated (default 55000,40000,25000)",
    )
    parser.add_argument("--duration-s", type=float, default=8.0, help="seconds per phase (8)")
    parser.add_argument("--producers", type=int, default=8, help="producers (8)")
    parser.add_argument("--late-ms", type=float, default=20.0, help="a late batch (20 ms)")
    parser.add_argument(
        "--stall-watch-ms",
        type=float,
        default=0.0,
        help="report event-loop stalls over this many ms per process (0: off)",
    )
    parser.add_argument(
        "--produce-over",
        choices=("port", "grpc"),
        default="port",
        help="producers stream over the owner's transfer port (the SDK's default) or the "
        "gRPC Produce call (default port)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="wal-tail-"))
    try:
        report = asyncio.run(run(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
