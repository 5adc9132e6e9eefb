"""Commit latency and throughput of raft.RaftPeer on a three-process loopback cluster.

Three `tests/raft/peer_main.py` processes on 127.0.0.1 (fsync on, the defaults a node
uses), each a real RaftPeer with a trivial hash-chain application. Proposals are issued
inside the leader process (asyncio `propose_async`, so no control-pipe hop is measured):
first sequentially (one in flight: the latency of one write on an idle cluster), then with
N concurrent proposers (batches form: one leader fsync and one fsync per follower per
batch). Each line also reports how many journal fsyncs the leader made per commit.

    ./run bench raft_commit [--count N] [--concurrency 1,8,32,128] [--size BYTES]
                            [--unsafe-no-fsync]

Reference: per-entry fsync (no group commit) measured ~0.9k commits/s on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "raft"))

from raft_harness import Cluster  # noqa: E402


def _fsync_latency_ms(directory: Path, rounds: int = 300) -> float:
    """Median fdatasync of a small append on this disk, for reference."""
    path = directory / "fsync-probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    samples = []
    try:
        for _ in range(rounds):
            os.write(fd, b"x" * 100)
            started = time.perf_counter()
            os.fdatasync(fd)
            samples.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    samples.sort()
    return samples[len(samples) // 2] * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4000, help="proposals per run")
    parser.add_argument("--sequential-count", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--size", type=int, default=64, help="command bytes")
    parser.add_argument("--unsafe-no-fsync", action="store_true")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",") if level]

    with tempfile.TemporaryDirectory(prefix="raft-bench-") as scratch:
        root = Path(scratch)
        extra = ["--unsafe-no-fsync"] if args.unsafe_no_fsync else []
        # Snapshots are left at their default cadence (every 10,000 entries).
        cluster = Cluster(root, 3, extra_args=extra)
        cluster.start_all()
        try:
            leader = cluster.wait_for_leader(15.0)
            print(f"fdatasync on this disk: median {_fsync_latency_ms(root):.3f} ms")
            print(
                f"cluster: 3 processes on 127.0.0.1, fsync {'OFF (unsafe)' if extra else 'on'}, "
                f"{args.size}-byte commands, leader {leader.name} (pid {leader.pid})"
            )
            leader.request("bench", wait_s=60.0, count=200, concurrency=8, size=args.size)  # warm
            header = (
                f"{'proposers':>9} {'count':>6} {'commits/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'max ms':>8} {'fsyncs/commit':>13} {'failed':>6}"
            )
            print(header)
            print("-" * len(header))
            runs = [(1, args.sequential_count)] + [
                (level, args.count) for level in levels if level != 1
            ]
            for concurrency, count in runs:
                result = leader.request(
                    "bench", wait_s=300.0, count=count, concurrency=concurrency, size=args.size
                )
                assert result["ok"], result
                print(
                    f"{concurrency:>9} {count:>6} {result['throughput_per_s']:>10.0f} "
                    f"{result['p50_ms']:>8.2f} {result['p99_ms']:>8.2f} {result['max_ms']:>8.2f} "
                    f"{result['leader_journal_syncs'] / count:>13.3f} {result['failures']:>6}"
                )
            summary = cluster.wait_converged(30.0)
            print(f"all three peers converged: {summary['count']} entries, same digest")
        finally:
            cluster.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
