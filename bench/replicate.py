"""Cross-cluster replication benchmark (docs/replication.md), raftwal beside a JetStream
mirror between two nats-servers, in the same run.

raftwal: a source dev cluster (3 nodes) alone: the maximum produce throughput (one SDK
producer, as fast as acks come back). Then a target dev cluster, `replicate set` source
-> target, and the same maximum again (with a target). The target catches up (`drain_s`),
then a steady rate of half the first maximum: each message's lag runs from its send on
the source to a consumer on the target receiving it (end to end; the source's ack
latency is reported beside it); p50 and p99.

JetStream: server A (domain a) holds stream S; server B (domain b, a leaf node of A) holds
a mirror M of S. The same three phases: max publish rate to S without M, with M, then a
paced half rate with the lag from the publish on A to delivery from M on B.

    .venv/bin/python bench/replicate.py [--seconds 10] [--rate MSGS_S] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats.errors import Error as NatsError  # noqa: E402

from bench._harness import percentile, stop_process  # noqa: E402
from raftwal.cli import dev  # noqa: E402
from rpc.client import CoordinatorClient, RaftwalError  # noqa: E402
from rpc.protos import coordination_pb2 as pb  # noqa: E402
from rpc.streaming_client import Consumer, StreamingClient  # noqa: E402

PAYLOAD = b"x" * 200
MAX_PENDING_PUBLISHES = 4000
#: how long the target may take to catch up with the maximum-rate phase
DRAIN_BUDGET_S = 180.0


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def max_rate(
    submit: Callable[[bytes], Awaitable[Any]], seconds: float, tag: str = "m"
) -> tuple[float, dict[str, float]]:
    """(messages per second acknowledged with submissions as fast as acks allow, key ->
    ack time of each acknowledged message); keys are `tag` + a count."""
    acks: dict[str, float] = {}
    outstanding: set[asyncio.Future[Any]] = set()

    def done(future: asyncio.Future[Any], key: str) -> None:
        outstanding.discard(future)
        if not future.cancelled() and future.exception() is None:
            acks[key] = time.perf_counter()

    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < seconds:
        key = f"{tag}{n}"
        future = await submit(key.encode() + b"|" + PAYLOAD)
        n += 1
        outstanding.add(future)
        future.add_done_callback(lambda f, key=key: done(f, key))
    if outstanding:
        await asyncio.wait(list(outstanding), timeout=30)
    return len(acks) / (time.perf_counter() - started), acks


async def paced(
    submit: Callable[[bytes], Awaitable[Any]], rate: float, seconds: float, tag: str
) -> dict[str, float]:
    """Key -> (send time, ack time) of each message sent at `rate` for `seconds` and
    acknowledged."""
    acks: dict[str, tuple[float, float]] = {}
    waiting: list[asyncio.Future[Any]] = []
    t0 = time.perf_counter()
    for n in range(int(rate * seconds)):
        delay = t0 + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        key = f"{tag}{n}"
        sent = time.perf_counter()
        future = await submit(key.encode() + b"|" + PAYLOAD)
        future.add_done_callback(
            lambda f, key=key, sent=sent: (
                acks.__setitem__(key, (sent, time.perf_counter()))
                if not f.cancelled() and f.exception() is None
                else None
            )
        )
        waiting.append(future)
    await asyncio.wait(waiting, timeout=30)
    return acks


def lags(acks: dict[str, tuple[float, float]], seen: dict[str, float]) -> dict[str, Any]:
    """The paced phase's figures: the source's ack latency (send -> ack) and the
    replication lag, send on the source -> delivered from the target (end to end: a
    target may deliver before the source's ack reaches the client, so the ack is no
    starting point)."""
    ack_ms = [(acked - sent) * 1000 for sent, acked in acks.values()]
    lag_ms = [(seen[k] - sent) * 1000 for k, (sent, _) in acks.items() if k in seen]

    def pct(values: list[float], q: float) -> float | None:
        return round(percentile(values, q), 1) if values else None

    return {
        "acked": len(acks),
        "replicated": len(lag_ms),
        "ack_p50_ms": pct(ack_ms, 0.5),
        "ack_p99_ms": pct(ack_ms, 0.99),
        "lag_p50_ms": pct(lag_ms, 0.5),
        "lag_p99_ms": pct(lag_ms, 0.99),
    }


async def wait_seen(acks: dict[str, Any], seen: dict[str, float], budget_s: float) -> float:
    """Wait until every key of `acks` was seen on the target (at most `budget_s`); the
    seconds waited."""
    started = time.monotonic()
    deadline = started + budget_s
    while time.monotonic() < deadline and not all(k in seen for k in acks):
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def drained(
    name: str, acks: dict[str, Any], seen: dict[str, float], result: dict[str, Any]
) -> None:
    """Before the lag phase: the target catches up with the maximum-rate phase, so that
    the lag measured is the steady one, not the backlog's (`drain_s`: how long that took;
    `drain_missing`: messages still not seen after DRAIN_BUDGET_S)."""
    result["drain_s"] = round(await wait_seen(acks, seen, DRAIN_BUDGET_S), 1)
    result["drain_missing"] = sum(1 for key in acks if key not in seen)
    say(f"{name}: target caught up in {result['drain_s']} s ({result['drain_missing']} missing)")


# -- raftwal -------------------------------------------------------------------------------


async def run_raftwal(directory: Path, seconds: float, rate_s: float = 0.0) -> dict[str, Any]:
    result: dict[str, Any] = {}
    clusters: list[dev.LocalCluster] = []
    try:
        source = await asyncio.to_thread(
            dev.up, directory / "source", 3, 120.0, cluster_id="source"
        )
        clusters.append(source)
        async with CoordinatorClient(source.endpoints, timeout_s=30.0) as client:
            await client.create_channels(names=["rb_0"])
            await client.create_vchannel("rb_v", "rb_0")
        streaming = StreamingClient(CoordinatorClient(source.endpoints, timeout_s=30.0))
        producer = streaming.producer(
            producer_id="bench-rp", linger_ms=2, max_in_flight=8, max_pending_messages=5000
        )

        async def submit(payload: bytes) -> Any:
            return await producer.submit("rb_v", payload)

        await (await submit(b"warm|"))
        rate_without, before = await max_rate(submit, seconds, "a")
        result["max_without_target_msgs_s"] = round(rate_without, 1)
        say(f"raftwal max without target: {result['max_without_target_msgs_s']} msg/s")

        target = await asyncio.to_thread(
            dev.up, directory / "target", 3, 120.0, cluster_id="target"
        )
        clusters.append(target)
        async with CoordinatorClient(target.endpoints, timeout_s=30.0) as client:
            await client.create_channels(names=["rb_0"])
        configuration = pb.ReplicateConfiguration(
            clusters=[
                pb.ReplicateCluster(cluster_id="source", endpoints=source.endpoints, pchannels=["rb_0"]),
                pb.ReplicateCluster(cluster_id="target", endpoints=target.endpoints, pchannels=["rb_0"]),
            ],
            topology=[pb.ReplicateTopologyEdge(source_cluster_id="source", target_cluster_id="target")],
        )  # fmt: skip
        for cluster in (source, target):
            async with CoordinatorClient(cluster.endpoints, timeout_s=30.0) as client:
                await client.update_replicate_configuration(configuration)
        target_streaming = StreamingClient(CoordinatorClient(target.endpoints, timeout_s=30.0))
        seen: dict[str, float] = {}

        async def consume() -> None:
            while True:
                try:
                    consumer = Consumer(target_streaming, "rb_v", retry_timeout_s=60.0)
                    async for entry in consumer:
                        seen[entry.payload.split(b"|", 1)[0].decode()] = time.perf_counter()
                except asyncio.CancelledError:
                    raise
                except (
                    RaftwalError,
                    RuntimeError,
                    OSError,
                ):  # the vchannel appears once replicated
                    await asyncio.sleep(0.2)

        reader = asyncio.create_task(consume())
        await wait_seen({"warm": 0.0, **before}, seen, DRAIN_BUDGET_S)
        rate_with, during = await max_rate(submit, seconds, "b")
        result["max_with_target_msgs_s"] = round(rate_with, 1)
        say(f"raftwal max with target: {result['max_with_target_msgs_s']} msg/s")
        await drained("raftwal", during, seen, result)
        rate = rate_s or result["max_without_target_msgs_s"] / 2
        result["paced_rate_msgs_s"] = round(rate, 1)
        acks = await paced(submit, rate, seconds, "k")
        await wait_seen(acks, seen, 60.0)
        result.update(lags(acks, seen))
        reader.cancel()
        await producer.close(timeout_s=2.0)
        await streaming.close()
        await target_streaming.close()
        return result
    finally:
        for cluster in clusters:
            await asyncio.to_thread(cluster.stop_all)


# -- JetStream -----------------------------------------------------------------------------


async def run_nats(
    directory: Path, binary: str, seconds: float, rate_s: float = 0.0
) -> dict[str, Any]:
    import nats
    from nats.js.api import ExternalStream, StreamConfig, StreamSource

    ports = dev.free_ports(3)
    configs = {
        "a": f'server_name: a\nlisten: "127.0.0.1:{ports[0]}"\n'
        f'jetstream {{ store_dir: "{directory}/a", domain: a }}\n'
        f'leafnodes {{ listen: "127.0.0.1:{ports[2]}" }}\n',
        "b": f'server_name: b\nlisten: "127.0.0.1:{ports[1]}"\n'
        f'jetstream {{ store_dir: "{directory}/b", domain: b }}\n'
        f'leafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{ports[2]}" }}] }}\n',
    }
    processes: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {}
    try:
        for name, text in configs.items():
            (directory / f"{name}.conf").write_text(text)
            with open(directory / f"{name}.log", "ab") as log:
                processes.append(
                    subprocess.Popen([binary, "-c", str(directory / f"{name}.conf")], stdout=log, stderr=log)
                )  # fmt: skip
        deadline = time.monotonic() + 30

        async def connect(port: int) -> Any:
            # One connection per server, retried until it is up (never a second one left
            # reconnecting in the background).
            while True:
                try:
                    return await nats.connect(
                        f"nats://127.0.0.1:{port}", connect_timeout=2, allow_reconnect=False
                    )
                except (OSError, TimeoutError, NatsError) as error:
                    if time.monotonic() > deadline:
                        raise NatsUnavailable(
                            f"no connection to 127.0.0.1:{port} in 30 s ({error!r}): "
                            + _log_tails(directory)
                        ) from None
                    await asyncio.sleep(0.3)

        a = await connect(ports[0])
        b = await connect(ports[1])
        ja, jb = a.jetstream(), b.jetstream()
        await ja.add_stream(StreamConfig(name="S", subjects=["rb.>"]))

        # At most MAX_PENDING_PUBLISHES unacknowledged (the Go client's async publish
        # default): without a bound a stalled server piles up futures without end.
        pending = asyncio.Semaphore(MAX_PENDING_PUBLISHES)

        async def submit(payload: bytes) -> Any:
            await pending.acquire()
            future = asyncio.ensure_future(ja.publish("rb.x", payload, timeout=5.0))
            future.add_done_callback(lambda _: pending.release())
            return future

        await (await submit(b"warm|"))
        rate_without, before = await max_rate(submit, seconds, "a")
        result["max_without_target_msgs_s"] = round(rate_without, 1)
        say(f"JetStream max without mirror: {result['max_without_target_msgs_s']} msg/s")
        if not before:
            raise NatsUnavailable("no publish acknowledged: " + _log_tails(directory))
        await jb.add_stream(
            StreamConfig(
                name="M", mirror=StreamSource(name="S", external=ExternalStream(api="$JS.a.API"))
            )
        )
        seen: dict[str, float] = {}

        async def on_message(message: Any) -> None:
            seen[message.data.split(b"|", 1)[0].decode()] = time.perf_counter()

        await jb.subscribe("rb.x", stream="M", cb=on_message, ordered_consumer=True)
        await wait_seen({"warm": 0.0, **before}, seen, DRAIN_BUDGET_S)
        rate_with, during = await max_rate(submit, seconds, "b")
        result["max_with_target_msgs_s"] = round(rate_with, 1)
        say(f"JetStream max with mirror: {result['max_with_target_msgs_s']} msg/s")
        await drained("JetStream", during, seen, result)
        rate = rate_s or result["max_without_target_msgs_s"] / 2
        result["paced_rate_msgs_s"] = round(rate, 1)
        acks = await paced(submit, rate, seconds, "k")
        await wait_seen(acks, seen, 60.0)
        result.update(lags(acks, seen))
        await a.close()
        await b.close()
        return result
    finally:
        for process in processes:
            stop_process(process)


class NatsUnavailable(RuntimeError):
    pass


def _log_tails(directory: Path) -> str:
    """The last lines of both servers' logs, for a report that says why."""
    tails = []
    for name in ("a", "b"):
        try:
            lines = (directory / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError as error:
            lines = [f"(no log: {error})"]
        tails.append(f"server {name}: " + " | ".join(lines[-5:]))
    return "; ".join(tails)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="bench-replicate-"))
    report: dict[str, Any] = {"seconds": args.seconds, "loadavg_start": os.getloadavg()[0]}
    try:
        report["raftwal"] = await run_raftwal(directory / "raftwal", args.seconds, args.rate)
        binary = args.nats_server or shutil.which("nats-server")
        if binary is None:
            report["jetstream"] = {"unavailable": "nats-server not found (scripts/install-nats.sh)"}
        else:
            (directory / "nats").mkdir()
            try:
                report["jetstream"] = await run_nats(
                    directory / "nats", binary, args.seconds, args.rate
                )
            except (OSError, TimeoutError, NatsError, NatsUnavailable) as error:  # reported
                report["jetstream"] = {"unavailable": f"{type(error).__name__}: {error}"}
    finally:
        report["loadavg_end"] = os.getloadavg()[0]
        shutil.rmtree(directory, ignore_errors=True)
    for name in ("raftwal", "jetstream"):
        row = report.get(name, {})
        if row.get("max_without_target_msgs_s"):
            row["with_over_without"] = round(
                row["max_with_target_msgs_s"] / row["max_without_target_msgs_s"], 2
            )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="lag phase rate in msgs/s for both systems (default: half each one's maximum)",
    )
    parser.add_argument("--nats-server", default=None, help="nats-server binary")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error(f"invalid --seconds (got {args.seconds}; expected > 0)")
    if not 0 <= args.rate <= 1_000_000:
        parser.error(f"invalid --rate (got {args.rate}; expected 0..1000000, 0: half the maximum)")
    report = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(report))
    else:
        print(f"load average: {report['loadavg_start']:.2f} -> {report['loadavg_end']:.2f}")
        for name in ("raftwal", "jetstream"):
            print(f"{name}: {json.dumps(report.get(name))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
