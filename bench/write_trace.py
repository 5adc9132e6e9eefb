"""Where one coordination write's time goes: milestones inside the three nodes.

A three-node dev cluster (durable, fsync before every acknowledgement) whose node processes
load `bench/writetrace/sitecustomize.py`; one SDK client then makes `--ops` sequential
calls to the leader: Lock and Unlock of one key of its own lease (`--mode write`), or
linearizable DescribeChannels (`--mode read`), with `--pause-ms` of idleness after each.
For every call it takes the first time each node reached each milestone between the call's
start and its return, and prints the median offset of every milestone from the call's
start, in order, with the step from the one before:

- client `call_start` / `call_end`: around the SDK call;
- `rpc_start` / `rpc_end`: the servicer method on the leader;
- `propose_start` / `submit` / `propose_end`: the proposal on the event loop;
- `entries_sent` / `entries_received`: an AppendEntries carrying entries;
- `fsync_start` / `fsync_end`: a journal sync that had something to write;
- `answer_sent` / `answer_received`: a follower's acknowledgement;
- `apply_start` / `apply_end` / `result`: the tick thread applying the entry;
- `loop_drain`: the event loop taking the tick thread's results.

With a pause, each call starts on an idle cluster and its window holds only its own
milestones. With `--pause-ms 0` (as in `bench/coord.py`) the followers' tail of one call
overlaps the next, which then shows up at the start of the table. Each milestone costs a
few microseconds to record, so the total is a little above `bench/coord.py`'s.

    PYTHONPATH=. .venv/bin/python bench/write_trace.py [--ops 400] [--pause-ms 5]
        [--mode write|read] [--experiment no-events-db|switch-interval-0.5ms|
        yield-before-sends] [--markdown]

With RAFTWAL_RAFT_TICK_ON_LOOP=1 in the environment the nodes tick Raft on their event
loops (`RaftTuning.tick_on_event_loop`); `loop_drain` then no longer carries the results.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import tempfile
import time
from pathlib import Path

from raftwal.cli import dev
from rpc.client import CoordinatorClient

TRACE_DIR = Path(__file__).resolve().parent / "writetrace"
WARM_UP_OPS = 20


async def find_leader(cluster: dev.LocalCluster) -> str:
    """The leader's node id (bounded: 30 s)."""
    client = CoordinatorClient(cluster.endpoints)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = await client.cluster_status(linearizable=False)
            if status.leader_node_id:
                return status.leader_node_id
            await asyncio.sleep(0.05)
    finally:
        await client.close()
    raise SystemExit("no leader within 30 s")


async def drive(leader: str, args: argparse.Namespace, out: Path) -> None:
    sdk = CoordinatorClient([leader], max_attempts=1)
    try:
        lease = (await sdk.grant_lease(60_000, holder="write-trace")).lease_id
        if args.mode == "read":
            await sdk.create_channels(names=["trace_read"])
        held = False
        lines = []
        for _ in range(args.ops + WARM_UP_OPS):
            start = time.monotonic_ns()
            if args.mode == "read":
                await sdk.describe_channels(["trace_read"], linearizable=True)
            elif held:
                await sdk.unlock("trace", lease)
            else:
                await sdk.lock("trace", lease)
            end = time.monotonic_ns()
            held = not held
            lines.append(f"{start} client call_start\n{end} client call_end\n")
            if args.pause_ms:
                await asyncio.sleep(args.pause_ms / 1000)
        out.write_text("".join(lines[WARM_UP_OPS:]))
    finally:
        await sdk.close()


def analyse(directory: Path, leader: str) -> tuple[list[tuple[float, str, str, int]], int]:
    """(median offset ms, node, milestone, calls that reached it) in order, and the calls."""
    events: list[tuple[int, str, str]] = []
    for path in directory.glob("*.txt"):
        for line in path.read_text().splitlines():
            at, node, tag = line.split()
            events.append((int(at), node, tag))
    events.sort()
    starts = [at for at, _, tag in events if tag == "call_start"]
    ends = [at for at, _, tag in events if tag == "call_end"]
    offsets: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    position = 0
    for start, end in zip(starts, ends, strict=True):
        while position < len(events) and events[position][0] < start:
            position += 1
        first: dict[tuple[str, str], int] = {}
        index = position
        while index < len(events) and events[index][0] <= end:
            at, node, tag = events[index]
            first.setdefault((node, tag), at)
            index += 1
        for key, at in first.items():
            offsets[key].append((at - start) / 1e6)
    rows = [
        (statistics.median(values), "leader" if node == leader else node, tag, len(values))
        for (node, tag), values in offsets.items()
    ]
    return sorted(rows), len(starts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--pause-ms", type=float, default=5.0)
    parser.add_argument("--mode", choices=("write", "read"), default="write")
    parser.add_argument(
        "--experiment",
        choices=("no-events-db", "switch-interval-0.5ms", "yield-before-sends"),
        help="change the nodes' behaviour to measure what it would save (see "
        "bench/writetrace/sitecustomize.py); a benchmark only",
    )
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.ops <= 100_000 or not 0 <= args.pause_ms <= 1000:
        parser.error("expected 1 <= --ops <= 100000 and 0 <= --pause-ms <= 1000")
    with tempfile.TemporaryDirectory(prefix="raftwal-write-trace-") as root:
        trace = Path(root) / "trace"
        trace.mkdir()
        env = {
            **os.environ,
            "RAFTWAL_WRITE_TRACE": str(trace),
            "RAFTWAL_WRITE_TRACE_EXPERIMENT": args.experiment or "",
            "PYTHONPATH": os.pathsep.join(
                [str(TRACE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        cluster = dev.up(Path(root) / "cluster", 3, timeout_s=60, env=env)
        try:
            leader_id = asyncio.run(find_leader(cluster))
            leader = cluster.node(leader_id).grpc_address
            asyncio.run(drive(leader, args, trace / "client.txt"))
        finally:
            cluster.stop_all()
        rows, calls = analyse(trace, leader_id)
    if args.markdown:
        print("| milestone | process | median offset (ms) | step (ms) | calls |")
        print("|---|---|---:|---:|---:|")
    else:
        print(f"{calls} {args.mode} calls, pause {args.pause_ms:g} ms, leader {leader_id}")
    previous = 0.0
    for offset, node, tag, count in rows:
        if args.markdown:
            print(f"| {tag} | {node} | {offset:.3f} | {offset - previous:.3f} | {count} |")
        else:
            print(f"{offset:8.3f} ms  (+{offset - previous:6.3f})  {node:7s} {tag:17s} {count}")
        previous = offset
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
