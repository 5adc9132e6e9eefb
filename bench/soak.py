"""Soak: a three-node cluster produces at a steady rate for a long time with minute-scale
retention; each node directory's disk use must stay flat (issue 16, item 2).

Usage (the record run is 30 minutes or more; the machine may be shared, say so):

    ./run bench soak --duration-s 1800 --out /tmp/soak.jsonl

What it does: starts a dev cluster in a temporary directory with 256 KiB segments,
`wal_retention_ms` 60 s (checked every 2 s), `event_retention_ms` 120 s (checked every
10 s) and a Raft snapshot every 2,000 entries; one producer writes `--rate` messages of
`--payload-bytes` per second (in batches of 10) to 2 pchannels, and a lease is granted and
revoked every 200 ms (coordination writes: Raft log, events.db). Every `--sample-s` it
records, per node, the bytes of wal/, raft/ (journal + snapshots), events.db (+ its -wal)
and catalog.db, and the retention floor per pchannel. At the end it prints the medians of
the first and last thirds after a warm-up (retention needs about two minutes to start
deleting) and their ratio: flat is about 1.0, growth without bound is well above it.

Nothing is asserted: the figures go to BENCHMARKS/RELIABILITY by hand, with the command.
Every loop is bounded by the duration; the cluster is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftwal.cli import dev  # noqa: E402
from rpc.placement import serving_address  # noqa: E402
from rpc.protos import coordination_pb2 as pb  # noqa: E402
from rpc.protos import coordinator_pb2 as api  # noqa: E402
from rpc.protos import coordinator_pb2_grpc, streaming_pb2_grpc  # noqa: E402
from rpc.protos import streaming_pb2 as wire  # noqa: E402
from rpc.request_ids import with_request_id  # noqa: E402

WARMUP_S = 180.0


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_size
        except OSError:
            pass
    return total


def _node_usage(data_dir: Path) -> dict[str, int]:
    parts = {
        "wal": _tree_bytes(data_dir / "wal"),
        "raft": _tree_bytes(data_dir / "raft"),
        "events": sum(_tree_bytes(p) for p in data_dir.glob("events.db*")),
        "catalog": sum(_tree_bytes(p) for p in data_dir.glob("catalog.db*")),
    }
    parts["total"] = _tree_bytes(data_dir)
    return parts


class Coordinator:
    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        self.channels = {e: grpc.insecure_channel(e) for e in endpoints}
        self.index = 0

    def call(self, method: str, request, timeout_s: float = 20.0):
        # One request id for every attempt: a retried write is answered, not re-applied.
        request = with_request_id(request)
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        for _ in range(200):
            if time.monotonic() > deadline:
                break
            endpoint = self.endpoints[self.index % len(self.endpoints)]
            try:
                stub = coordinator_pb2_grpc.CoordinatorStub(self.channels[endpoint])
                return getattr(stub, method)(request, timeout=5)
            except grpc.RpcError as error:
                last = error
                self.index += 1
                time.sleep(0.05)
        raise RuntimeError(f"{method} failed: {last}")

    def owner_address(self, pchannel: str) -> str:
        for _ in range(200):
            status = self.call("ClusterStatus", api.ClusterStatusRequest())
            for channel in status.pchannels:
                if channel.name == pchannel and channel.state == pb.PCHANNEL_STATE_ASSIGNED:
                    return serving_address(status.nodes, channel.owner_node_id, pchannel)
            time.sleep(0.2)
        raise RuntimeError(f"{pchannel} never assigned")


def _produce_loop(
    coordinator: Coordinator,
    pchannel: str,
    vchannel: str,
    rate: float,
    payload_bytes: int,
    until: float,
    stats: dict[str, int],
) -> None:
    """`rate` messages/s in batches of 10, paced by the clock (catches up if behind)."""
    batch = 10
    interval = batch / rate
    address = ""
    channel: grpc.Channel | None = None
    sequence = 0
    producer_id = f"soak-{uuid.uuid4().hex[:8]}"
    next_at = time.monotonic()
    while time.monotonic() < until:
        now = time.monotonic()
        if now < next_at:
            time.sleep(min(next_at - now, 0.5))
            continue
        next_at += interval
        sequence += 1
        request = wire.ProduceRequest(
            request_id=sequence,
            pchannel=pchannel,
            producer_id=producer_id,
            sequence=sequence,
            messages=[
                wire.Message(vchannel=vchannel, payload=os.urandom(payload_bytes))
                for _ in range(batch)
            ],
        )
        for _attempt in range(50):
            if time.monotonic() > until:
                return
            try:
                if not address:
                    address = coordinator.owner_address(pchannel)
                    if channel is not None:
                        channel.close()
                    channel = grpc.insecure_channel(address)
                stub = streaming_pb2_grpc.StreamingNodeStub(channel)
                (result,) = list(stub.Produce(iter([request]), timeout=10))
                if result.HasField("error") and result.error.code != 0:
                    raise RuntimeError(result.error.message)
                stats["acked"] += batch
                break
            except (grpc.RpcError, RuntimeError):
                stats["retries"] += 1
                address = ""
                time.sleep(0.2)
        else:
            stats["failed"] += batch


def _lease_loop(coordinator: Coordinator, until: float, stats: dict[str, int]) -> None:
    while time.monotonic() < until:
        try:
            lease = coordinator.call("GrantLease", api.GrantLeaseRequest(ttl_ms=10_000))
            coordinator.call("RevokeLease", api.RevokeLeaseRequest(lease_id=lease.lease_id))
            stats["leases"] += 1
        except RuntimeError:
            stats["lease_errors"] += 1
        time.sleep(0.2)


def _thirds(samples: list[dict], key: str) -> tuple[float, float, float]:
    steady = [s for s in samples if s["t_s"] >= WARMUP_S]
    if len(steady) < 3:
        return (float("nan"),) * 3
    third = len(steady) // 3
    first = statistics.median(s[key] for s in steady[:third])
    last = statistics.median(s[key] for s in steady[-third:])
    peak = max(s[key] for s in steady)
    return first, last, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=1800.0, help="run time (default 1800)")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="messages/s per pchannel (default 200)"
    )
    parser.add_argument("--payload-bytes", type=int, default=512, help="message size (default 512)")
    parser.add_argument("--sample-s", type=float, default=30.0, help="sampling period (default 30)")
    parser.add_argument("--out", type=Path, default=None, help="JSON lines of every sample")
    parser.add_argument("--dir", type=Path, default=None, help="cluster directory (default: temp)")
    args = parser.parse_args()
    if not 10 <= args.duration_s <= 7 * 86_400:
        parser.error(f"invalid --duration-s ({args.duration_s}; expected 10..604800)")
    if not 1 <= args.rate <= 100_000:
        parser.error(f"invalid --rate ({args.rate}; expected 1..100000)")
    if not 1 <= args.payload_bytes <= 1 << 20:
        parser.error(f"invalid --payload-bytes ({args.payload_bytes}; expected 1..1048576)")
    if not 1 <= args.sample_s <= 3600:
        parser.error(f"invalid --sample-s ({args.sample_s}; expected 1..3600)")

    env = {
        **os.environ,
        "RAFTWAL_SEGMENT_MAX_BYTES": str(256 * 1024),
        "RAFTWAL_WAL_RETENTION_MS": "60000",
        "RAFTWAL_WAL_RETENTION_CHECK_MS": "2000",
        "RAFTWAL_EVENT_RETENTION_MS": "120000",
        "RAFTWAL_EVENT_RETENTION_CHECK_MS": "10000",
        "RAFTWAL_RAFT_SNAPSHOT_ENTRIES": "2000",
    }
    directory = args.dir or Path(tempfile.mkdtemp(prefix="raftwal-soak-"))
    cluster = dev.up(directory, 3, timeout_s=90, env=env)
    out = args.out.open("w") if args.out else None
    try:
        coordinator = Coordinator(cluster.endpoints)
        created = coordinator.call(
            "CreateChannels", api.CreateChannelsRequest(request_id="soak", prefix="soak", count=2)
        )
        pchannels = list(created.pchannels)
        for index, pchannel in enumerate(pchannels):
            coordinator.call(
                "CreateVChannel",
                api.CreateVChannelRequest(
                    request_id=f"soak-v{index}", name=f"soak_v{index}", pchannel=pchannel
                ),
            )
        start = time.monotonic()
        until = start + args.duration_s
        stats = {"acked": 0, "retries": 0, "failed": 0, "leases": 0, "lease_errors": 0}
        threads = [
            threading.Thread(
                target=_produce_loop,
                args=(coordinator, p, f"soak_v{i}", args.rate, args.payload_bytes, until, stats),
                daemon=True,
            )
            for i, p in enumerate(pchannels)
        ]
        threads.append(
            threading.Thread(target=_lease_loop, args=(coordinator, until, stats), daemon=True)
        )
        for thread in threads:
            thread.start()
        samples: list[dict] = []
        while time.monotonic() < until:
            time.sleep(min(args.sample_s, max(0.0, until - time.monotonic())))
            sample: dict = {"t_s": round(time.monotonic() - start, 1), **stats}
            for node in cluster.config.nodes:
                for part, size in _node_usage(node.data_dir).items():
                    sample[f"{node.id}.{part}"] = size
            try:
                status = coordinator.call("ClusterStatus", api.ClusterStatusRequest(), timeout_s=10)
                sample["revision"] = status.revision
                for row in status.retention:
                    sample[f"floor.{row.pchannel}"] = row.deleted_before_lsn
                    sample[f"committed.{row.pchannel}"] = row.committed_through_lsn
            except RuntimeError:
                sample["status_error"] = 1
            samples.append(sample)
            line = json.dumps(sample)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
        for thread in threads:
            thread.join(timeout=30)
        print(
            "\nsummary (medians of the first and last third after a "
            f"{WARMUP_S:.0f} s warm-up; bytes):"
        )
        print(f"{'node.part':<14} {'first':>12} {'last':>12} {'peak':>12} {'last/first':>10}")
        for node in cluster.config.nodes:
            for part in ("total", "wal", "raft", "events", "catalog"):
                first, last, peak = _thirds(samples, f"{node.id}.{part}")
                ratio = last / first if first else float("nan")
                print(
                    f"{node.id + '.' + part:<14} {first:>12.0f} {last:>12.0f} {peak:>12.0f} {ratio:>10.2f}"
                )
        print(
            f"\nproduced {stats['acked']} messages acknowledged, {stats['failed']} failed, "
            f"{stats['retries']} retries; {stats['leases']} lease grant+revoke pairs"
        )
    finally:
        if out:
            out.close()
        cluster.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
