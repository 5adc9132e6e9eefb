"""Exactly-once shard apply: an ``rpc.shards.Shard`` applying 100 B messages to SQLite.

A three-node dev cluster on 127.0.0.1 (``raftwal dev up``, durable settings) holds
`--messages` 100 B messages on one vchannel, produced before the measurement. Each run
creates a new subscription over that vchannel (so a new, empty recovery log) and a new
SQLite file, and times one Shard consuming every message: per store transaction the
application's writes and the checkpoint commit in one SQLite transaction (synchronous=FULL,
so fsync), after the transaction's record was appended to the shard's recovery log with
``expected_last_lsn`` (replicated, majority-durable). Two applications:

- ``counters``: per-key counters, aggregated within the transaction (one upsert per key
  touched) - the usual shape of an exactly-once aggregate;
- ``per_message``: one upsert per message (no aggregation).

After each run, a second Shard on an empty disk rebuilds the store from the recovery log:
that is the recovery time. Target (issue #15): >= 50,000 msgs/s for the shard apply.

`run(...)` returns the figures as a dict, for a caller that folds this bench into another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftwal.cli import dev
from rpc.protos import streaming_pb2 as wire
from rpc.shards_client import Shard, ShardStore
from rpc.streaming_client import Producer, StreamingClient

PAYLOAD_BYTES = 100
KEYS = 1000


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Counters:
    """Per-key counters, aggregated within the store transaction."""

    def init_store(self, store: ShardStore) -> None:
        store.execute("CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, n INTEGER)")

    def consume(self, store: ShardStore, entries: Sequence[wire.WalEntry]) -> None:
        counts = Counter(entry.payload[:8] for entry in entries)
        store.executemany(
            "INSERT INTO counters (key, n) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET n = n + excluded.n",
            [(key.decode(), n) for key, n in counts.items()],
        )

    def finalize(self, store: ShardStore) -> None:
        pass


class PerMessage(Counters):
    """One upsert per message."""

    def consume(self, store: ShardStore, entries: Sequence[wire.WalEntry]) -> None:
        store.executemany(
            "INSERT INTO counters (key, n) VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET n = n + 1",
            [(entry.payload[:8].decode(),) for entry in entries],
        )


APPS = {"counters": Counters, "per_message": PerMessage}


async def _fill(client: StreamingClient, vchannel: str, count: int) -> None:
    async with Producer(client, retry_timeout_s=120) as producer:
        sent = 0
        while sent < count:
            chunk = min(20_000, count - sent)
            await asyncio.gather(
                *(
                    producer.send(
                        vchannel, f"k{(sent + i) % KEYS:07d}".encode().ljust(PAYLOAD_BYTES, b".")
                    )
                    for i in range(chunk)
                )
            )
            sent += chunk


async def _one_run(
    client: StreamingClient,
    app_name: str,
    run_number: int,
    vchannel: str,
    count: int,
    root: Path,
    max_batch_messages: int,
) -> dict[str, Any]:
    subscription = f"bench-{app_name}-{run_number}"
    await client.coordinator.create_subscription(subscription, [vchannel])
    app = APPS[app_name]()
    shard = Shard(
        client,
        app,
        subscription,
        vchannel,
        store_path=root / f"{subscription}.sqlite",
        member_id="bench",
        token=1,
        commit_as_member=False,
        max_batch_messages=max_batch_messages,
        linger_ms=5,
    )
    # Timed from the end of the takeover (recovery-log channel, fence): the source starts
    # reading as recover() returns, so nothing was read ahead before the clock started.
    await shard.recover()
    started = time.perf_counter()
    applied = 0
    deadline = time.monotonic() + 600
    while applied < count and time.monotonic() < deadline:
        applied += await shard.run_once()
    elapsed = time.perf_counter() - started
    transactions = shard.status.transactions
    split = {
        name: round(getattr(shard.status, name), 3)
        for name in ("wait_s", "apply_s", "append_s", "commit_s")
    }
    assert shard.store is not None
    total = shard.store.conn.execute("SELECT SUM(n) FROM counters").fetchone()[0]
    await shard.close()
    if total != count:
        raise AssertionError(f"{app_name} run {run_number}: counters sum {total}, expected {count}")
    # Recovery without the old disk: a new owner replays the recovery log.
    rebuilt = Shard(
        client,
        APPS[app_name](),
        subscription,
        vchannel,
        store_path=root / f"{subscription}-rebuilt.sqlite",
        member_id="bench2",
        token=2,
        commit_as_member=False,
    )
    status = await rebuilt.recover()
    assert rebuilt.store is not None
    rebuilt_total = rebuilt.store.conn.execute("SELECT SUM(n) FROM counters").fetchone()[0]
    await rebuilt.close()
    if rebuilt_total != count:
        raise AssertionError(f"rebuilt store counts {rebuilt_total}, expected {count}")
    await client.coordinator.drop_subscription(subscription)
    figures = {
        "app": app_name,
        "run": run_number,
        "messages": applied,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(applied / elapsed),
        "store_transactions": transactions,
        **split,
        "recovery_records": status.replayed_records,
        "recovery_s": round(status.recovery_s, 3),
    }
    say(json.dumps(figures))
    return figures


async def run(
    messages: int = 200_000,
    repeat: int = 3,
    apps: Sequence[str] = ("counters", "per_message"),
    max_batch_messages: int = 10_000,
    root: Path | None = None,
) -> dict[str, Any]:
    """Start a dev cluster, measure, stop it; the figures (medians per application)."""
    own_root = root is None
    root = root or Path(tempfile.mkdtemp(prefix="shard-apply-"))
    cluster = dev.up(root / "cluster", 3, timeout_s=60)
    try:
        async with StreamingClient(cluster.endpoints) as client:
            created = await client.coordinator.create_channels(names=["bench_shards_p"])
            del created
            await client.coordinator.create_vchannel("bench_shards", "bench_shards_p")
            await client.router.owner("bench_shards_p", 60)
            started = time.perf_counter()
            await _fill(client, "bench_shards", messages)
            say(f"produced {messages} messages in {time.perf_counter() - started:.1f} s")
            runs = []
            for run_number in range(repeat):
                for app_name in apps:
                    runs.append(
                        await _one_run(
                            client,
                            app_name,
                            run_number,
                            "bench_shards",
                            messages,
                            root / "stores",
                            max_batch_messages,
                        )
                    )
    finally:
        cluster.stop_all()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for app_name in apps:
        mine = [r for r in runs if r["app"] == app_name]
        summary[app_name] = {
            "msgs_per_s": [r["msgs_per_s"] for r in mine],
            "median_msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in mine)),
            "target_ratio": round(statistics.median(r["msgs_per_s"] for r in mine) / 50_000, 2),
            "median_recovery_s": statistics.median(r["recovery_s"] for r in mine),
            "recovery_records": mine[0]["recovery_records"],
        }
    return {
        "messages": messages,
        "payload_bytes": PAYLOAD_BYTES,
        "keys": KEYS,
        "max_batch_messages": max_batch_messages,
        "runs": runs,
        "summary": summary,
    }


async def phase(endpoints: list[str], vchannel: str, messages: int) -> dict[str, Any]:
    """The shard phase of ``bench/consumers.py``, on its raftwal cluster: `messages` keyed
    100 B messages on a vchannel of this phase's own (the consume phase's payloads carry no
    keys), then each application three times; the same figures as `run`."""
    del vchannel
    root = Path(tempfile.mkdtemp(prefix="shard-phase-"))
    apps = ("counters", "per_message")
    try:
        async with StreamingClient(endpoints) as client:
            await client.coordinator.create_channels(names=["bench_shards_p"])
            await client.coordinator.create_vchannel("bench_shards", "bench_shards_p")
            await client.router.owner("bench_shards_p", 60)
            await _fill(client, "bench_shards", messages)
            runs = [
                await _one_run(client, app_name, run_number, "bench_shards", messages, root, 10_000)
                for run_number in range(3)
                for app_name in apps
            ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        app_name: {
            "msgs_per_s": [r["msgs_per_s"] for r in runs if r["app"] == app_name],
            "median_msgs_per_s": round(
                statistics.median(r["msgs_per_s"] for r in runs if r["app"] == app_name)
            ),
            "median_recovery_s": statistics.median(
                r["recovery_s"] for r in runs if r["app"] == app_name
            ),
        }
        for app_name in apps
    }


#: picked up by bench/consumers.py (its EXTRA_PHASES)
PHASE = phase


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages (200000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per application (3)")
    parser.add_argument(
        "--apps", default="counters,per_message", help="counters,per_message (both)"
    )
    parser.add_argument(
        "--max-batch-messages", type=int, default=10_000, help="per store transaction (10000)"
    )
    args = parser.parse_args(argv)
    report = asyncio.run(
        run(args.messages, args.repeat, args.apps.split(","), args.max_batch_messages)
    )
    report["command"] = "./run bench shard_apply " + " ".join(sys.argv[1:])
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
