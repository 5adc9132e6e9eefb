"""A slow disk under one node: elections, write latency and lagging replicas.

Three nodes (`raftwal dev up`), every data dir on a PowerFS mount
(raftwal/chaos/powerfs.py). For each target (a follower that owns no pchannel, then the
Raft leader) and each fsync delay (`--delays-ms`, default 100, 500, 2000), every fsync of
the target's data dir takes that long for `--hold-s` while an SDK producer writes batches
of 10 messages back to back to a pchannel owned by another node (when the target is the
leader and owns it, by the leader) and a lease keeper renews a lease three times per ttl.
Before each step the delay is off for `--settle-s`.

Reports per step: the Raft term before and after, leaders seen (a sample per second),
batches acknowledged, failed, and their p50/p99/max latency, the longest lag of a
replica on the target and whether it was reported lagging, and lease renewals lost.
Every process it starts is stopped by its own pid; the mounts are unmounted at the end.

    .venv/bin/python bench/slow_disk.py --hold-s 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftwal.chaos.powerfs import PowerMount  # noqa: E402
from raftwal.cli import dev  # noqa: E402
from rpc.client import CoordinatorClient, RaftwalError  # noqa: E402
from rpc.streaming_client import StreamingClient  # noqa: E402


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _step(
    client: CoordinatorClient,
    streaming: StreamingClient,
    mount: PowerMount,
    target: str,
    delay_ms: int,
    pchannel: str,
    vchannel: str,
    hold_s: float,
) -> dict[str, object]:
    status = await client.cluster_status()
    terms_before = {m.node_id: m.raft_term for m in status.members if m.reachable}
    leaders: set[str] = {status.leader_node_id}
    latencies: list[float] = []
    failed = 0
    lag_ms = 0
    lagging = False
    renew_failures = 0
    stop = asyncio.Event()
    producer = streaming.producer(retry_timeout_s=60.0)

    async def produce() -> None:
        nonlocal failed
        index = 0
        while not stop.is_set():
            payloads = [b"slow-%d-%d-" % (index, i) + b"x" * 1000 for i in range(10)]
            index += 1
            started = time.monotonic()
            try:
                await producer.send_batch(vchannel, payloads)
                latencies.append(time.monotonic() - started)
            except RaftwalError:
                failed += 1

    async def keep_lease() -> None:
        nonlocal renew_failures
        lease = await client.grant_lease(3000, holder="slow-disk-bench")
        while not stop.is_set():
            try:
                await client.keep_alive(lease.lease_id)
            except RaftwalError:
                renew_failures += 1
            await asyncio.sleep(1.0)

    async def watch() -> None:
        nonlocal lag_ms, lagging
        while not stop.is_set():
            try:
                sample = await client.cluster_status()
            except RaftwalError:
                await asyncio.sleep(1.0)
                continue
            if sample.leader_node_id:
                leaders.add(sample.leader_node_id)
            for member in sample.members:
                for owned in member.owners:
                    for replica in owned.replicas:
                        if owned.pchannel == pchannel and replica.node_id == target:
                            lag_ms = max(lag_ms, replica.lag_ms)
                            lagging = lagging or replica.lagging
            await asyncio.sleep(1.0)

    await asyncio.to_thread(mount.set_faults, fsync_delay_ms=delay_ms)
    tasks = [asyncio.create_task(t()) for t in (produce, keep_lease, watch)]
    await asyncio.sleep(hold_s)
    await asyncio.to_thread(mount.set_faults)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await producer.close(timeout_s=10.0)
    status = await client.cluster_status()
    terms_after = {m.node_id: m.raft_term for m in status.members if m.reachable}
    return {
        "target": target,
        "delay_ms": delay_ms,
        "terms_before": terms_before,
        "terms_after": terms_after,
        "elections": max(terms_after.values()) - max(terms_before.values()),
        "leaders_seen": sorted(leaders - {""}),
        "batches": len(latencies),
        "failed_batches": failed,
        "p50_ms": round(_percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies, default=0.0) * 1000, 1),
        "target_replica_max_lag_ms": lag_ms,
        "target_replica_reported_lagging": lagging,
        "lease_renewals_failed": renew_failures,
    }


async def _run(args: argparse.Namespace, directory: Path) -> list[dict[str, object]]:
    config = dev.make_config(directory, 3)
    mounts = {
        n.id: PowerMount(directory / "power" / n.id, n.data_dir, directory / f"{n.id}.powerfs.log")
        for n in config.nodes
    }
    cluster: dev.LocalCluster | None = None
    results = []
    try:
        for mount in mounts.values():
            await asyncio.to_thread(mount.start)
        env = {**os.environ, "RAFTWAL_SEGMENT_MAX_BYTES": str(1 << 20)}
        cluster = await asyncio.to_thread(dev.up, directory, 3, 60.0, env, config)
        async with CoordinatorClient(cluster.endpoints) as client:
            streaming = StreamingClient(client)
            created = await client.create_channels(count=3, prefix="slowbench")
            for index, name in enumerate(created.pchannels):
                await client.create_vchannel(f"slowbench_v{index}", name)
            for target_kind in ("follower", "leader"):
                for delay_ms in args.delays_ms:
                    await asyncio.sleep(args.settle_s)
                    status = await client.cluster_status()
                    leader = status.leader_node_id
                    owners = {p.name: p.owner_node_id for p in status.pchannels}
                    if target_kind == "leader":
                        target = leader
                        owned = [p for p, o in owners.items() if o == target]
                        pchannel = owned[0] if owned else sorted(owners)[0]
                    else:
                        spare = [
                            n.id
                            for n in cluster.config.nodes
                            if n.id != leader and n.id not in owners.values()
                        ]
                        target = (spare or [n.id for n in cluster.config.nodes if n.id != leader])[
                            0
                        ]
                        pchannel = next(p for p, o in sorted(owners.items()) if o != target)
                    vchannel = f"slowbench_v{sorted(owners).index(pchannel)}"
                    result = await _step(
                        client, streaming, mounts[target], target, delay_ms, pchannel,
                        vchannel, args.hold_s,
                    )  # fmt: skip
                    result["target_kind"] = target_kind
                    print(json.dumps(result), flush=True)
                    results.append(result)
            await streaming.close()
    finally:
        if cluster is not None:
            await asyncio.to_thread(cluster.stop_all)
        for mount in mounts.values():
            await asyncio.to_thread(mount.close)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--delays-ms", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="raftwal-slow-disk-"))
    results = asyncio.run(_run(args, directory))
    print(f"{'target':<9} {'fsync':>6} {'elections':>9} {'batches':>8} {'failed':>6} "
          f"{'p50 ms':>7} {'p99 ms':>8} {'max ms':>8} {'lag ms':>7} {'lagging':>7}")  # fmt: skip
    for r in results:
        print(
            f"{r['target_kind']:<9} {r['delay_ms']:>6} {r['elections']:>9} {r['batches']:>8} "
            f"{r['failed_batches']:>6} {r['p50_ms']:>7} {r['p99_ms']:>8} {r['max_ms']:>8} "
            f"{r['target_replica_max_lag_ms']:>7} {str(r['target_replica_reported_lagging']):>7}"
        )
    print(f"median p50 over the steps: {statistics.median(r['p50_ms'] for r in results)} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
