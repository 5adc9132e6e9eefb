"""Start-up and rejoin times of a three-node dev cluster (issue 35, item 4).

- **start**: `raftwal dev up` (three node processes) until the CLI reports the cluster
  ready, as a newcomer waits for it (`dev up`'s own "ready in" figure is printed too).
- **rejoin**: a follower is killed with SIGKILL after `--writes` coordination writes
  (lease grants, each a Raft entry), restarted, and timed until (a) its gRPC port answers
  ClusterStatus, (b) the leader's status shows it reachable with its applied index at the
  leader's commit index as it stood at the restart, and (c) the coordination state has it
  UP again.

    .venv/bin/python bench/rejoin.py [--runs 3] [--writes 2000] [--json]

Reports each run and the medians. Every process it starts is stopped by its pid (the
restarted node by `LocalCluster.stop_all`, the others by `dev.down`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftwal.cli import dev  # noqa: E402
from rpc.client import CoordinatorClient  # noqa: E402
from rpc.protos import coordination_pb2 as pb  # noqa: E402

RAFTWAL = str(Path(sys.executable).with_name("raftwal"))
POLL_S = 0.05
LIMIT_S = 120.0


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def start(directory: Path) -> tuple[float, float]:
    """(wall seconds of `raftwal dev up`, the "ready in" it printed)."""
    began = time.monotonic()
    done = subprocess.run(
        [RAFTWAL, "dev", "up", "--dev-dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=True,
    )
    wall = time.monotonic() - began
    match = re.search(r"ready in ([\d.]+) s", done.stdout)
    return wall, float(match.group(1)) if match else float("nan")


async def rejoin(cluster: dev.LocalCluster, writes: int) -> dict[str, float]:
    async with CoordinatorClient(cluster.endpoints, timeout_s=30.0) as client:
        for _ in range(writes):
            await client.grant_lease(60_000)
        status = await client.cluster_status(linearizable=True)
        leader = status.leader_node_id
        victim = next(m.node_id for m in status.members if m.node_id != leader)
        pid = cluster.pid(victim)
        assert pid is not None
        # A cluster loaded from its directory knows its nodes by recorded pid only.
        dev.signal_node(pid, signal.SIGKILL)  # the supervisor and its workers
        while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
            await asyncio.sleep(POLL_S)
        # Wait for the leader to have seen it go (else "UP" below is the old verdict).
        deadline = time.monotonic() + LIMIT_S
        while time.monotonic() < deadline:
            status = await client.cluster_status(linearizable=False)
            member = next(m for m in status.members if m.node_id == victim)
            if not member.reachable:
                break
            await asyncio.sleep(POLL_S)
        target = max(m.commit_index for m in status.members)
        began = time.monotonic()
        cluster.start_node(victim)
        marks: dict[str, float] = {}
        address = cluster.node(victim).grpc_address
        async with CoordinatorClient(
            [address], timeout_s=1.0, attempt_timeout_s=1.0, max_attempts=1
        ) as own:
            while "answers" not in marks and time.monotonic() - began < LIMIT_S:
                try:
                    await own.cluster_status(linearizable=False)
                    marks["answers"] = time.monotonic() - began
                except Exception:  # noqa: BLE001 (not up yet: any failure means wait)
                    await asyncio.sleep(POLL_S)
        while len(marks) < 3 and time.monotonic() - began < LIMIT_S:
            status = await client.cluster_status(linearizable=False)
            member = next(m for m in status.members if m.node_id == victim)
            if "caught_up" not in marks and member.reachable and member.applied_index >= target:
                marks["caught_up"] = time.monotonic() - began
            node = next((n for n in status.nodes if n.node_id == victim), None)
            up = node is not None and node.state == pb.NODE_STATE_UP and member.reachable
            if "up" not in marks and up:
                marks["up"] = time.monotonic() - began
            await asyncio.sleep(POLL_S)
        return marks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 20 or not 0 <= args.writes <= 100_000:
        parser.error("invalid --runs (1..20) or --writes (0..100000)")
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / "cluster"
            wall, ready = start(directory)
            cluster = dev.load(directory)
            try:
                marks = asyncio.run(rejoin(cluster, args.writes))
            finally:
                # The restarted node is this process's child; the others were started
                # by `dev up` and are stopped by their recorded pids.
                cluster.stop_all()
                dev.down(directory)
        runs.append({"dev_up_wall_s": round(wall, 2), "dev_up_ready_s": ready, **marks})
        if not args.json:
            print(json.dumps(runs[-1]))
    medians = {
        key: round(statistics.median(r[key] for r in runs if key in r), 2)
        for key in ("dev_up_wall_s", "dev_up_ready_s", "answers", "caught_up", "up")
        if any(key in r for r in runs)
    }
    report = {
        "runs": runs,
        "median": medians,
        "writes": args.writes,
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(report, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
