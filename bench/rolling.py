"""Rolling restarts under produce load: a SIGTERM roll (each node hands over first) against
a kill -9 roll, in the same run, on the same cluster.

A three-node dev cluster (`raftwal.cli.dev`, durable settings) with `--pchannels`
pchannels and one vchannel each. One SDK `Producer` (idempotent, batching) sends to every
vchannel from one task per vchannel, each waiting for its acknowledgement and then pacing
to `--rate` sends per second. While it runs, `dev.rolling_restart` restarts the three
nodes one at a time, the leader last, waiting for each to be caught up and the owners
balanced before the next. A roll is repeated `--rolls` times per mode, alternating the
modes (SIGTERM with handover, then SIGKILL).

Per roll it reports: sends, failed sends, the longest send latency and the p99 during the
roll (call to acknowledgement), and the history check: every acknowledged message is read
back with a Consumer exactly once, at its acknowledged LSN.

    python bench/rolling.py [--rolls 3] [--pchannels 6] [--rate 50] [--skip-kill] [--json]

Goal (issue #16 item 5): with the handover, 0 failed sends and a longest latency <= 1 s.

``--full-speed N`` is issue 53's scenario instead: what `raftwal produce --count N --size
100` does (one Producer, N messages submitted as fast as the queue takes them, a retry
budget of ``--retry-timeout-s``, 10 s as the CLI's) on one pchannel while one SIGTERM roll
runs, ``--load K`` busy loops beside it. It reports the sends that failed, the producer
process's CPU and its longest event-loop lag (a task that sleeps 0.1 s in a loop), and each
move of the pchannel (AssignPChannel -> PChannelReady, from the event history).
Every process started here is stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import median, percentile  # noqa: E402
from raftwal.cli import dev  # noqa: E402
from rpc.errors import RaftwalError  # noqa: E402
from rpc.streaming_client import Consumer, Producer, StreamingClient  # noqa: E402

MODES = {"sigterm": signal.SIGTERM, "kill9": signal.SIGKILL}


@dataclass
class Roll:
    mode: str
    sends: int = 0
    failures: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    # (wall time the send began, latency): where the worst ones fell, to read with the logs
    timed: list[tuple[float, float]] = field(default_factory=list)
    # (vchannel, payload) -> acknowledged LSN
    acked: dict[tuple[str, bytes], int] = field(default_factory=dict)
    roll_s: float = 0.0
    history_problems: list[str] = field(default_factory=list)
    steps: list[dev.RestartStep] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "sends": self.sends,
            "failed": len(self.failures),
            "max_ms": round(max(self.latencies_s, default=0) * 1000, 1),
            "p99_ms": round(percentile(self.latencies_s, 0.99) * 1000, 1),
            "p50_ms": round(percentile(self.latencies_s, 0.50) * 1000, 1),
            "roll_s": round(self.roll_s, 1),
            "history_problems": len(self.history_problems),
            "exit_s": [round(s.exit_s, 2) for s in self.steps],
            "worst": [
                (
                    time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}",
                    round(s * 1000),
                )
                for at, s in sorted(self.timed, key=lambda t: -t[1])[:3]
            ],
        }


async def setup(endpoints: list[str], pchannels: int, prefix: str) -> list[str]:
    async with StreamingClient(endpoints) as client:
        created = await client.coordinator.create_channels(count=pchannels, prefix=prefix)
        vchannels = []
        for index, pchannel in enumerate(created.pchannels):
            name = f"{prefix}_v{index}"
            await client.coordinator.create_vchannel(name, pchannel)
            vchannels.append(name)
        return vchannels


async def produce_during_roll(
    cluster: dev.LocalCluster, vchannels: list[str], mode: str, rate_hz: float
) -> Roll:
    roll = Roll(mode)
    stop = asyncio.Event()
    interval_s = 1.0 / rate_hz

    async def sender(producer: Producer, vchannel: str) -> None:
        count = 0
        while not stop.is_set() and count < 1_000_000:
            payload = f"{mode}:{vchannel}:{count}:{time.time_ns()}".encode()
            count += 1
            began = time.monotonic()
            began_wall = time.time()
            try:
                position = await producer.send(vchannel, payload)
            except RaftwalError as error:
                roll.failures.append(f"{type(error).__name__}: {error}")
                continue
            finally:
                roll.sends += 1
            roll.latencies_s.append(time.monotonic() - began)
            roll.timed.append((began_wall, roll.latencies_s[-1]))
            roll.acked[(vchannel, payload)] = position.lsn
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - began)))

    async with (
        StreamingClient(cluster.endpoints) as client,
        Producer(client, linger_ms=2, retry_timeout_s=60) as producer,
    ):
        tasks = [asyncio.create_task(sender(producer, v)) for v in vchannels]
        await asyncio.sleep(1.0)
        began = time.monotonic()
        try:
            roll.steps = await asyncio.to_thread(
                dev.rolling_restart, cluster, signum=MODES[mode], ready_timeout_s=90
            )
        finally:
            roll.roll_s = time.monotonic() - began
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait(tasks, timeout=90)
    return roll


async def check_history(endpoints: list[str], roll: Roll, timeout_s: float = 60.0) -> None:
    """Every acknowledged (vchannel, payload) is in the log exactly once, at its LSN."""
    by_vchannel: dict[str, dict[bytes, int]] = {}
    for (vchannel, payload), lsn in roll.acked.items():
        by_vchannel.setdefault(vchannel, {})[payload] = lsn
    async with StreamingClient(endpoints) as client:
        for vchannel, expected in sorted(by_vchannel.items()):
            last_lsn = max(expected.values())
            seen: dict[bytes, list[int]] = {}
            deadline = time.monotonic() + timeout_s
            async with Consumer(client, vchannel) as consumer:
                while time.monotonic() < deadline:
                    entry = await asyncio.wait_for(anext(consumer), deadline - time.monotonic())
                    seen.setdefault(entry.payload, []).append(entry.lsn)
                    if entry.lsn >= last_lsn:
                        break
            for payload, lsn in expected.items():
                where = seen.get(payload, [])
                if where != [lsn]:
                    roll.history_problems.append(
                        f"{vchannel}: {payload[:40]!r} acknowledged at {lsn}, in the log at {where}"
                    )
            for payload, where in seen.items():
                if len(where) > 1 and payload not in expected:
                    roll.history_problems.append(
                        f"{vchannel}: {payload[:40]!r} unacknowledged, written {len(where)} times"
                    )


async def full_speed_during_roll(
    cluster: dev.LocalCluster, vchannel: str, count: int, retry_timeout_s: float
) -> dict[str, object]:
    """One roll beside a full-speed producer (the module docstring)."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def sampler() -> None:
        while not stop.is_set():
            began = time.monotonic()
            await asyncio.sleep(0.1)
            lags.append(time.monotonic() - began - 0.1)

    async def roll() -> float:
        await asyncio.sleep(2.0)
        began = time.monotonic()
        await asyncio.to_thread(dev.rolling_restart, cluster, ready_timeout_s=120)
        return time.monotonic() - began

    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    sampling = asyncio.create_task(sampler())
    rolling = asyncio.create_task(roll())
    futures: list[asyncio.Future[object]] = []
    began = time.monotonic()
    async with (
        StreamingClient(cluster.endpoints) as client,
        Producer(client, retry_timeout_s=retry_timeout_s) as producer,
    ):
        for index in range(count):
            futures.append(await producer.submit(vchannel, b"%0100d" % index))
        await producer.flush()
    produce_s = time.monotonic() - began
    roll_s = await rolling
    stop.set()
    await sampling
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    failed = [f.exception() for f in futures if f.exception() is not None]
    return {
        "messages": count,
        "failed": len(failed),
        "first_failure": str(failed[0])[:200] if failed else "",
        "produce_s": round(produce_s, 1),
        "roll_s": round(roll_s, 1),
        "producer_cpu_s": round(
            cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime, 1
        ),
        "max_loop_lag_s": round(max(lags, default=0.0), 2),
        "moves": await pchannel_moves(cluster.endpoints),
    }


async def pchannel_moves(endpoints: list[str]) -> list[dict[str, object]]:
    """Each AssignPChannel after the first and its PChannelReady, from the event history."""
    moves: list[dict[str, object]] = []
    assigned: dict[int, int] = {}
    async with StreamingClient(endpoints) as client:
        events = client.coordinator.watch_events(
            from_revision=1, kinds=["pchannel_assigned", "pchannel_became_ready"]
        )
        while True:
            try:
                # The history, then live: a quiet second ends it.
                event = await asyncio.wait_for(anext(events), 2.0)
            except (TimeoutError, StopAsyncIteration):
                break
            kind = event.WhichOneof("body")
            if kind == "pchannel_assigned":
                assigned[event.pchannel_assigned.term] = event.time_ms
            elif kind == "pchannel_became_ready":
                term = event.pchannel_became_ready.term
                if term > 1 and term in assigned:
                    moves.append(
                        {
                            "term": term,
                            "node": event.pchannel_became_ready.node_id,
                            "assign_to_ready_ms": event.time_ms - assigned[term],
                        }
                    )
    return moves


def full_speed(args: argparse.Namespace) -> int:
    directory = Path(tempfile.mkdtemp(prefix="raftwal-rolling-"))
    cluster = dev.up(directory / "cluster", 3, timeout_s=60)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        (vchannel,) = asyncio.run(setup(cluster.endpoints, 1, "full"))
        for index in range(args.rolls):
            result = asyncio.run(
                full_speed_during_roll(cluster, vchannel, args.full_speed, args.retry_timeout_s)
            )
            print(f"roll {index + 1}: {json.dumps(result)}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        cluster.stop_all()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rolls", type=int, default=3, help="rolls per mode (default: 3)")
    parser.add_argument("--pchannels", type=int, default=6, help="pchannels (default: 6)")
    parser.add_argument(
        "--rate", type=float, default=50.0, help="sends/s per vchannel (default: 50)"
    )
    parser.add_argument("--skip-kill", action="store_true", help="only the SIGTERM rolls")
    parser.add_argument("--json", action="store_true", help="print raw results as JSON")
    parser.add_argument("--keep-dir", action="store_true", help="keep the cluster directory")
    parser.add_argument(
        "--full-speed",
        type=int,
        default=0,
        metavar="N",
        help="issue 53's scenario: N messages as fast as possible during each SIGTERM roll",
    )
    parser.add_argument(
        "--retry-timeout-s", type=float, default=10.0, help="with --full-speed (default: 10)"
    )
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes beside it")
    args = parser.parse_args()
    if args.full_speed:
        return full_speed(args)
    modes = ["sigterm"] if args.skip_kill else ["sigterm", "kill9"]
    directory = Path(tempfile.mkdtemp(prefix="raftwal-rolling-"))
    cluster = dev.up(directory / "cluster", 3, timeout_s=60)
    results: list[Roll] = []
    try:
        vchannels = asyncio.run(setup(cluster.endpoints, args.pchannels, "roll"))
        for index in range(args.rolls):
            for mode in modes:
                roll = asyncio.run(produce_during_roll(cluster, vchannels, mode, args.rate))
                asyncio.run(check_history(cluster.endpoints, roll))
                results.append(roll)
                summary = roll.summary()
                print(f"roll {index + 1} {mode}: {json.dumps(summary)}", flush=True)
                for problem in roll.history_problems[:5]:
                    print(f"  history: {problem}", flush=True)
                for failure in roll.failures[:3]:
                    print(f"  failed: {failure}", flush=True)
    finally:
        cluster.stop_all()
        if args.keep_dir:
            print(f"cluster directory kept: {directory}")
    if args.json:
        print(json.dumps([r.summary() for r in results]))
    print()
    print(
        "| mode | rolls | sends | failed sends | history problems | max latency ms (median of rolls, worst) | p99 ms (median) | p50 ms (median) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        rolls = [r.summary() for r in results if r.mode == mode]
        maxes = [float(r["max_ms"]) for r in rolls]  # type: ignore[arg-type]
        print(
            f"| {mode} | {len(rolls)} | {sum(int(r['sends']) for r in rolls)} "  # type: ignore[call-overload]
            f"| {sum(int(r['failed']) for r in rolls)} "  # type: ignore[call-overload]
            f"| {sum(int(r['history_problems']) for r in rolls)} "  # type: ignore[call-overload]
            f"| {median(maxes):.0f} ({max(maxes):.0f}) "
            f"| {median([float(r['p99_ms']) for r in rolls]):.0f} "  # type: ignore[arg-type]
            f"| {median([float(r['p50_ms']) for r in rolls]):.0f} |"  # type: ignore[arg-type]
        )
    if len(modes) == 2:
        term = [float(r.summary()["max_ms"]) for r in results if r.mode == "sigterm"]  # type: ignore[arg-type]
        kill = [float(r.summary()["max_ms"]) for r in results if r.mode == "kill9"]  # type: ignore[arg-type]
        print(
            f"\nmax latency, SIGTERM roll / kill -9 roll (medians): {median(term) / median(kill):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
