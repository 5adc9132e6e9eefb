"""Consumer benchmark: raftwal subscription consumers and time-tick packs against NATS
JetStream durable pull consumers with explicit acks, side by side in one run.

Each system runs on the same shape (three nodes on loopback, replica set / R3 file stream,
fsync before ack: raftwal `always`, JetStream `sync_interval: always` when the nats-server
has it, else its default), one at a time (started, measured, stopped):

- consume throughput: `--messages` 100-byte messages are produced first, then read back
  from the start, `--repeats` times (a fresh subscription / durable each time):
  - raftwal: `SubscriptionConsumer` with a commit at least every 100 ms
    (`commit_interval_ms=100`), positions committed through Raft;
  - JetStream: a durable pull consumer (`AckExplicit`), `fetch` batches of `--fetch`, every
    message acked.
  Reported: msgs/s per repeat, the median, and raftwal / JetStream.
- pack latency (raftwal only): a pack consumer over two vchannels on two pchannels, one of
  them silent; single messages sent `--pack-samples` times; latency = the ack of the
  message (the last of its tick) -> its pack delivered. p50/p99.
- the exactly-once shard phase: `bench/shard_apply.py`'s `PHASE` runs on the raftwal
  cluster after the consume phase: `await shard_apply.PHASE(endpoints, vchannel,
  messages)` -> a dict of figures, reported under "shard_apply" (it produces `messages`
  keyed 100-byte messages to a vchannel of its own, then applies them with each
  application three times). Other phases can be added to `EXTRA_PHASES` the same way.

    ./run bench consumers [--quick] [--json] [--skip-nats]

Every process started here is stopped by pid (through bench/wal.py's system classes); every
loop is bounded by a count and a time budget. Performance is reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats.errors
import shard_apply  # bench/shard_apply.py: the exactly-once SQLite shard phase
import wal  # bench/wal.py: the raftwal and JetStream systems, started and stopped by pid
from nats.js.api import AckPolicy, ConsumerConfig

from rpc.streaming_client import PackConsumer, Producer, StreamingClient, SubscriptionConsumer

PAYLOAD = b"x" * 100
BUDGET_S = 300.0

#: extra raftwal phases, name -> coroutine(endpoints, vchannel, messages) -> figures, run
#: after the consume phase on the same cluster.
Phase = Callable[[list[str], str, int], Awaitable[dict[str, Any]]]
EXTRA_PHASES: dict[str, Phase] = {"shard_apply": shard_apply.PHASE}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _fill(system: Any, count: int) -> None:
    """Produce `count` messages to the system's 100-byte stream (pipelined batches)."""
    producers = await system.producers("small", 4, 100)
    try:
        acked = 0
        deadline = time.monotonic() + BUDGET_S
        pending: list[Any] = []
        while acked < count and time.monotonic() < deadline:
            for producer in producers:
                pending.append(await producer.submit())
            if len(pending) >= 32 or acked + len(pending) * 100 >= count:
                await asyncio.wait_for(asyncio.gather(*pending), 60)
                acked += len(pending) * 100
                pending.clear()
        if pending:
            await asyncio.wait_for(asyncio.gather(*pending), 60)
    finally:
        await wal.close_all(producers)


async def raftwal_consume(endpoints: list[str], vchannel: str, count: int, tag: str) -> float:
    async with StreamingClient(endpoints) as client:
        await client.coordinator.create_subscription(tag, [vchannel])
        started = time.perf_counter()
        got = 0
        async with SubscriptionConsumer(
            client, tag, vchannel, commit_every=1_000_000, commit_interval_ms=100
        ) as reader:
            deadline = time.monotonic() + BUDGET_S
            while got < count and time.monotonic() < deadline:
                await asyncio.wait_for(anext(reader), 30)
                got += 1
        return got / (time.perf_counter() - started)


async def raftwal_pack_latency(
    endpoints: list[str], busy: str, silent: str, samples: int
) -> list[float]:
    delays = []
    async with StreamingClient(endpoints) as client:
        await client.coordinator.create_subscription("packlat", [busy, silent], start="latest")
        async with (
            PackConsumer(client, "packlat", time_tick_interval_ms=100) as packs,
            Producer(client, linger_ms=0) as producer,
        ):
            for index in range(samples):
                await producer.send(busy, PAYLOAD)
                acked_at = time.perf_counter()
                got = 0
                while got < 1:
                    pack = await asyncio.wait_for(anext(packs), 30)
                    got += len(pack.messages)
                delays.append(time.perf_counter() - acked_at)
                await asyncio.sleep(0.02 + 0.01 * (index % 7))
    return delays


async def nats_consume(system: Any, count: int, tag: str, fetch: int) -> float:
    nc = await system._admin()
    try:
        js = nc.jetstream(timeout=wal.REQUEST_TIMEOUT_S)
        stream = system._streams["small"]
        subscription = await js.pull_subscribe(
            system._subjects["small"],
            durable=tag,
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=100_000),
        )
        started = time.perf_counter()
        got = 0
        deadline = time.monotonic() + BUDGET_S
        while got < count and time.monotonic() < deadline:
            try:
                messages = await subscription.fetch(fetch, timeout=5)
            except nats.errors.TimeoutError:
                continue
            for message in messages:
                await message.ack()
            got += len(messages)
        await nc.flush()
        return got / (time.perf_counter() - started)
    finally:
        await nc.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"messages": args.messages, "repeats": args.repeats}
    payloads = {"small": PAYLOAD, "large": b"y" * 10240}
    with tempfile.TemporaryDirectory(prefix="consumers-bench-") as tmp:
        directory = Path(tmp)
        system = wal.RaftwalWal(directory / "raftwal", payloads)
        say("raftwal: starting")
        await system.start()
        try:
            await _fill(system, args.messages)
            endpoints = system.cluster.endpoints
            rates = []
            for repeat in range(args.repeats):
                rate = await raftwal_consume(
                    endpoints, system._vchannels["small"], args.messages, f"bench{repeat}"
                )
                say(f"raftwal subscription consume: {rate:,.0f} msgs/s")
                rates.append(rate)
            report["raftwal_msgs_per_s"] = rates
            delays = await raftwal_pack_latency(
                endpoints, system._vchannels["small"], system._vchannels["large"], args.samples
            )
            report["pack_latency_ms"] = {
                "p50": round(percentile(delays, 0.5) * 1000, 1),
                "p99": round(percentile(delays, 0.99) * 1000, 1),
                "samples": len(delays),
            }
            say(f"pack latency: {report['pack_latency_ms']}")
            for name, phase in EXTRA_PHASES.items():
                say(f"{name}: running")
                report[name] = await phase(endpoints, system._vchannels["small"], args.messages)
        finally:
            await system.stop()
        if not args.skip_nats:
            found = wal.find_nats_server(None)
            if found is None:
                report["jetstream"] = "nats-server not found (scripts/install-nats.sh)"
            else:
                binary, version = found
                sync_always = version >= wal.NATS_SYNC_ALWAYS_MIN_VERSION
                nats_system = wal.NatsWal(
                    directory / "nats", binary, version, sync_always, payloads
                )
                say(f"JetStream {version} ({nats_system.label}): starting")
                await nats_system.start()
                try:
                    await _fill(nats_system, args.messages)
                    rates = []
                    for repeat in range(args.repeats):
                        rate = await nats_consume(
                            nats_system, args.messages, f"bench{repeat}", args.fetch
                        )
                        say(f"JetStream durable pull consume: {rate:,.0f} msgs/s")
                        rates.append(rate)
                    report["jetstream_label"] = nats_system.label
                    report["jetstream_msgs_per_s"] = rates
                finally:
                    await nats_system.stop()
    if "jetstream_msgs_per_s" in report:
        ours = statistics.median(report["raftwal_msgs_per_s"])
        theirs = statistics.median(report["jetstream_msgs_per_s"])
        report["ratio"] = round(ours / theirs, 2)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (default: off)")
    parser.add_argument("--messages", type=int, default=50_000, help="default: 50000")
    parser.add_argument("--repeats", type=int, default=3, help="default: 3")
    parser.add_argument("--samples", type=int, default=200, help="pack latency samples (200)")
    parser.add_argument("--fetch", type=int, default=500, help="JetStream fetch batch (500)")
    parser.add_argument("--skip-nats", action="store_true", help="raftwal only (default: off)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.repeats, args.samples = 10_000, 2, 50
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
