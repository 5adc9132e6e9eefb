"""Cross-cluster replication benchmark (docs/replication.md): raftwal beside a JetStream
mirror between two nats-servers, at the same rates, in the same run.

raftwal: a source dev cluster (3 nodes) and a target dev cluster (3 nodes), `replicate
set` source -> target for one pchannel; one SDK producer on the source, a consumer of the
target. JetStream: server A (domain a) holds stream S; server B (domain b, a leaf node of
A) holds a mirror M of S; a publisher on A, a subscriber of M on B.

For each round trip between the sites (`--rtts`, ms) and each payload size (`--sizes`,
bytes), each system runs:

- the **maximum**: messages published as fast as acknowledgements come back (`--seconds`),
  with replication on: that is "the source's maximum"; then the time the target took to
  hold every one of them after the phase ended (`catch_up_s`);
- a **paced phase** at each load of `--loads` (default 50% and 90%) of raftwal's maximum
  at that size and round trip, the same rate for both systems: the replication lag of
  each message, from its send on the source to a consumer of the target receiving it
  (end to end), p50 and p99; the source's ack latency; the produce rate (the phase's
  acknowledged messages over the span from the first ack to the last) and the apply rate
  (the same messages over the span from the target's first delivery of them to its last)
  and their ratio; `delivered_in_phase`, the share of what the source acknowledged within
  the phase that the target delivered within it too (which a steady lag lowers by
  lag/phase length, so it is not a rate); the catch-up after the phase; for raftwal, also the largest lag its replicator reported meanwhile (the age
  of the oldest entry the target had not acknowledged, sampled twice a second from
  ClusterStatus): the standby's own view, apart from the measuring consumer.

raftwal's maximum without a target is measured first at each size (`max_alone`), for
reference. Round trips > 0 go through user-space delaying proxies (this kernel has no
netem; raftwal/chaos/net.py `SiteLink`): the target cluster's nodes advertise 127.0.0.2
and its gRPC and transfer ports are reached there, through a proxy that delays each way
by RTT/2; JetStream's leaf node connection from B to A goes through the same kind of
proxy. The consumers measuring the lag read the target directly (they sit at the target's
site), as the subscriber of M does on B; each runs in a process of its own (`_Watcher`),
so that its delivery never waits for the producer's share of this process's GIL.

    .venv/bin/python bench/replicate.py [--seconds 10] [--sizes 200,10240]
        [--rtts 0,10,50] [--loads 0.5,0.9] [--max-lag-ms 0] [--skip-nats] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats.errors import Error as NatsError  # noqa: E402

from bench._harness import percentile, stop_process  # noqa: E402
from raftwal.chaos.net import SiteLink  # noqa: E402
from raftwal.cli import dev  # noqa: E402
from rpc.client import CoordinatorClient, RaftwalError  # noqa: E402
from rpc.protos import coordination_pb2 as pb  # noqa: E402
from rpc.streaming_client import Consumer, StreamingClient  # noqa: E402

MAX_PENDING_PUBLISHES = 4000
#: how long a target may take to catch up with a phase before the bench says so
CATCH_UP_BUDGET_S = 120.0
#: the target site's loopback address when a round trip separates the sites
TARGET_SITE = "127.0.0.2"


class _LinkProcess:
    """A `SiteLink` in a process of its own: its proxies must not wait for this process's
    GIL (the producer and the consumers keep it busy), or they would add delays of their
    own to the link. `set_latency` and `close` go over a pipe."""

    def __init__(self, address: str, ports: list[int]) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=_serve_link, args=(address, ports, child), name="site-link", daemon=True
        )
        self._process.start()
        if not self._pipe.poll(30) or self._pipe.recv() != "ready":
            raise RuntimeError("the site link's proxies did not start")

    def set_latency(self, delay_ms: float) -> None:
        self._pipe.send(("latency", delay_ms))
        if not self._pipe.poll(10) or self._pipe.recv() != "ok":
            raise RuntimeError("the site link did not take its latency")

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._pipe.send(("close", 0.0))
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


def _serve_link(address: str, ports: list[int], pipe: Any) -> None:
    link = SiteLink(address, ports)
    link.start()
    pipe.send("ready")
    try:
        while True:
            command, value = pipe.recv()
            if command == "close":
                return
            link.set_latency(value)
            pipe.send("ok")
    except EOFError:
        return
    finally:
        link.close()


class _Watcher:
    """The consumer that measures the lag, in a process of its own (spawned): it records
    when each message of the target reaches it (``time.perf_counter``, CLOCK_MONOTONIC,
    which every process of the machine shares) and sends (key, time) pairs up a pipe in
    batches, which a thread of this process folds into `seen`. In this process it would
    share one GIL with the producer: at the higher rates its delivery waited for the
    producer's work, and the lag measured the bench's own process, not the standby.

    `kind` "raftwal": an SDK Consumer of vchannel rb_v on the target's nodes (`where`:
    their endpoints, reached directly at the target's site); "jetstream": an ordered push
    consumer of mirror M on server B (`where`: its port)."""

    def __init__(self, kind: str, where: list[str] | int, seen: dict[str, float]) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_watch, args=(kind, where, child), name=f"watch-{kind}", daemon=True
        )
        self._process.start()
        child.close()
        self._seen = seen
        self._thread = threading.Thread(target=self._fold, name="watch-fold", daemon=True)
        self._thread.start()

    def _fold(self) -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                for key, at in json.loads(self._pipe.recv_bytes()):
                    self._seen[key] = at

    def close(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._thread.join(5)
        self._pipe.close()


#: how often the watcher process sends what it saw
WATCH_FLUSH_S = 0.01


def _watch(kind: str, where: list[str] | int, pipe: Any) -> None:
    batch: list[tuple[str, float]] = []

    def key_of(data: bytes) -> str:
        return bytes(data[:40]).split(b"|", 1)[0].decode()

    async def flush() -> None:
        while True:
            await asyncio.sleep(WATCH_FLUSH_S)
            if batch:
                pipe.send_bytes(json.dumps(batch).encode())
                batch.clear()

    async def raftwal(endpoints: list[str]) -> None:
        reader = _SiteReader(CoordinatorClient(endpoints, timeout_s=30.0))
        while True:
            try:
                consumer = Consumer(reader, "rb_v", retry_timeout_s=60.0)
                async for entry in consumer:
                    batch.append((key_of(entry.payload), time.perf_counter()))
            except (RaftwalError, RuntimeError, OSError):
                await asyncio.sleep(0.2)  # the vchannel appears once replicated

    async def jetstream(port: int) -> None:
        import nats

        client = await nats.connect(f"nats://127.0.0.1:{port}", error_cb=_ignore_nats_error)

        async def on_message(received: Any) -> None:
            batch.append((key_of(received.data), time.perf_counter()))

        await client.jetstream().subscribe("rb.x", stream="M", cb=on_message, ordered_consumer=True)
        await asyncio.Event().wait()

    async def main() -> None:
        flusher = asyncio.create_task(flush())
        try:
            if kind == "raftwal":
                assert isinstance(where, list)
                await raftwal(where)
            else:
                assert isinstance(where, int)
                await jetstream(where)
        finally:
            flusher.cancel()

    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError, OSError):
        asyncio.run(main())


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


Submit = Callable[[bytes], Awaitable["asyncio.Future[Any]"]]


def message(key: str, size: int) -> bytes:
    body = key.encode() + b"|"
    return body + b"x" * max(0, size - len(body))


async def max_rate(
    submit: Submit, seconds: float, size: int, tag: str
) -> tuple[float, dict[str, tuple[float, float]]]:
    """(messages per second acknowledged with submissions as fast as acks allow, key ->
    (send time, ack time) of each acknowledged message); keys are `tag` + a count."""
    acks: dict[str, tuple[float, float]] = {}
    outstanding: set[asyncio.Future[Any]] = set()

    def done(future: asyncio.Future[Any], *, key: str, sent: float) -> None:
        outstanding.discard(future)
        if not future.cancelled() and future.exception() is None:
            acks[key] = (sent, time.perf_counter())

    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < seconds:
        key = f"{tag}{n}"
        sent = time.perf_counter()
        future = await submit(message(key, size))
        n += 1
        outstanding.add(future)
        future.add_done_callback(functools.partial(done, key=key, sent=sent))
    if outstanding:
        await asyncio.wait(list(outstanding), timeout=60)
    return len(acks) / (time.perf_counter() - started), acks


async def _ignore_nats_error(error: Exception) -> None:
    """nats-py's error callback; the caller sees and handles every error itself."""


async def paced(
    submit: Submit, rate: float, seconds: float, size: int, tag: str
) -> tuple[float, dict[str, tuple[float, float]]]:
    """(phase start, key -> (send time, ack time)) of each message sent at `rate` for
    `seconds` and acknowledged."""
    acks: dict[str, tuple[float, float]] = {}
    waiting: list[asyncio.Future[Any]] = []
    t0 = time.perf_counter()
    for n in range(int(rate * seconds)):
        delay = t0 + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        key = f"{tag}{n}"
        sent = time.perf_counter()
        future = await submit(message(key, size))
        future.add_done_callback(functools.partial(_record_ack, acks, key, sent))
        waiting.append(future)
    if waiting:
        await asyncio.wait(waiting, timeout=60)
    return t0, acks


def _record_ack(
    acks: dict[str, tuple[float, float]], key: str, sent: float, future: asyncio.Future[Any]
) -> None:
    if not future.cancelled() and future.exception() is None:
        acks[key] = (sent, time.perf_counter())


async def caught_up(acks: dict[str, Any], seen: dict[str, float], since: float) -> float | None:
    """Seconds from `since` until every key of `acks` was seen on the target (None: not
    within CATCH_UP_BUDGET_S)."""
    deadline = time.monotonic() + CATCH_UP_BUDGET_S
    # `seen` only grows: a cursor over the keys in order checks each key about once. (A
    # scan from the first key at every poll took half a core of this 2-core machine while
    # a backlog of 75,000 messages drained: the bench slowed the catch-up it measured.)
    keys = list(acks)
    done = 0
    while True:
        while done < len(keys) and keys[done] in seen:
            done += 1
        if done == len(keys):
            break
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.02)
    # 0 when the target delivered everything before the source's last ack came back.
    return round(max(0.0, max((seen[k] for k in acks), default=since) - since), 2)


def figures(
    t0: float, seconds: float, acks: dict[str, tuple[float, float]], seen: dict[str, float]
) -> dict[str, Any]:
    """A paced phase's figures (see the module doc)."""
    end = t0 + seconds
    ack_ms = [(acked - sent) * 1000 for sent, acked in acks.values()]
    lag_ms = [(seen[k] - sent) * 1000 for k, (sent, _) in acks.items() if k in seen]
    produced = sum(1 for _, acked in acks.values() if acked <= end)
    applied = sum(1 for k in acks if seen.get(k, end + 1) <= end)
    # The rates proper: messages over the span from the first to the last of them, on each
    # side. A standby that keeps pace behind a steady lag applies at the source's rate (a
    # ratio near 1) however long the lag; one that falls further behind, or catches up
    # only after the phase, stretches its span and shows a lower rate.
    ack_times = [acked for _, acked in acks.values()]
    seen_times = [seen[k] for k in acks if k in seen]
    produce_span = max(ack_times) - min(ack_times) if len(ack_times) > 1 else 0.0
    apply_span = max(seen_times) - min(seen_times) if len(seen_times) > 1 else 0.0
    produce_rate = len(ack_times) / produce_span if produce_span > 0 else None
    apply_rate = len(seen_times) / apply_span if apply_span > 0 else None

    def pct(values: list[float], q: float) -> float | None:
        return round(percentile(values, q), 1) if values else None

    return {
        "acked": len(acks),
        "replicated": len(lag_ms),
        "ack_p50_ms": pct(ack_ms, 0.5),
        "ack_p99_ms": pct(ack_ms, 0.99),
        "lag_p50_ms": pct(lag_ms, 0.5),
        "lag_p99_ms": pct(lag_ms, 0.99),
        "produce_rate_msgs_s": round(produce_rate, 1) if produce_rate else None,
        "apply_rate_msgs_s": round(apply_rate, 1) if apply_rate else None,
        "apply_over_produce": (
            round(apply_rate / produce_rate, 3) if apply_rate and produce_rate else None
        ),
        # The earlier figure: of the messages the source acknowledged within the phase, the
        # share the target delivered within it too (1 minus the lag over the phase's length).
        "delivered_in_phase": round(applied / produced, 3) if produced else None,
    }


async def phases(
    name: str,
    submit: Submit,
    seen: dict[str, float],
    seconds: float,
    size: int,
    rtt_ms: float,
    loads: list[float],
    rates: dict[float, float] | None,
    replicator_lags: list[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The maximum, then each paced load (at `rates` when given: the other system's).
    `replicator_lags`: (time, lag_s) the source's replicator reported, sampled meanwhile
    (raftwal): the largest in each paced phase is reported beside the consumer's lag."""
    tag = f"{rtt_ms:g}-{size}-"
    result: dict[str, Any] = {"rtt_ms": rtt_ms, "size": size}
    await caught_up({"warm": 0}, seen, time.perf_counter())
    rate, acks = await max_rate(submit, seconds, size, tag + "m")
    ended = time.perf_counter()
    result["max_msgs_s"] = round(rate, 1)
    result["max_mb_s"] = round(rate * size / 1e6, 1)
    result["max_catch_up_s"] = await caught_up(acks, seen, ended)
    say(
        f"{name} rtt {rtt_ms:g} ms, {size} B: max {result['max_msgs_s']} msg/s, target "
        f"caught up {result['max_catch_up_s']} s after"
    )
    for load in loads:
        target_rate = float((rates or {}).get(load) or load * rate)
        t0, acks = await paced(submit, target_rate, seconds, size, f"{tag}{load:g}-")
        ended = time.perf_counter()
        row: dict[str, Any] = {"load": load, "rate_msgs_s": round(target_rate, 1)}
        row["catch_up_s"] = await caught_up(acks, seen, ended)
        row.update(figures(t0, seconds, acks, seen))
        if replicator_lags is not None:
            within = [lag for at, lag in replicator_lags if t0 <= at <= ended]
            row["replicator_lag_s_max"] = round(max(within), 2) if within else None
        result[f"load_{load:g}"] = row
        say(
            f"{name} rtt {rtt_ms:g} ms, {size} B, {load:.0%} ({row['rate_msgs_s']} msg/s): lag "
            f"p50 {row['lag_p50_ms']} ms p99 {row['lag_p99_ms']} ms, apply/produce "
            f"{row['apply_over_produce']}, caught up {row['catch_up_s']} s after"
            + (f", replicator lag max {row['replicator_lag_s_max']} s" if replicator_lags else "")
        )
    return result


# -- raftwal -------------------------------------------------------------------------------


class _SiteReader(StreamingClient):
    """A client at the target's site: it reaches the target's nodes at 127.0.0.1, not
    through the link (their advertised address)."""

    def _channel(self, address: str) -> Any:
        return super()._channel(address.replace(TARGET_SITE + ":", "127.0.0.1:"))


async def run_raftwal(
    directory: Path,
    rtts: list[float],
    sizes: list[int],
    loads: list[float],
    seconds: float,
    max_lag_ms: int = 0,
) -> dict[str, Any]:
    out: dict[str, Any] = {"alone": {}, "runs": []}
    groups = [[0.0]] if 0 in rtts else []
    if any(r > 0 for r in rtts):
        groups.append([r for r in rtts if r > 0])
    for group in groups:
        await _raftwal_group(directory / ("wan" if group[0] > 0 else "lan"), group, sizes,
                             loads, seconds, out, max_lag_ms)  # fmt: skip
    return out


async def _raftwal_group(
    sub: Path,
    group: list[float],
    sizes: list[int],
    loads: list[float],
    seconds: float,
    out: dict[str, Any],
    max_lag_ms: int = 0,
) -> None:
    """Two clusters for `group`'s round trips (linked directly, or through the delaying
    proxy when they are > 0), every size and load at each; results added to `out`."""
    wan = group[0] > 0
    clusters: list[dev.LocalCluster] = []
    link: _LinkProcess | None = None
    watcher: _Watcher | None = None
    try:
        # The source's flow control (ClusterConfig.replicate_max_lag_ms), when asked for.
        source_config = replace(dev.make_config(sub / "source", 3), replicate_max_lag_ms=max_lag_ms)
        source = await asyncio.to_thread(
            functools.partial(
                dev.up, sub / "source", 3, 120.0, config=source_config, cluster_id="source"
            )
        )
        clusters.append(source)
        config = None
        if wan:
            config = dev.make_config(sub / "target", 3)
            nodes = SiteLink.of_nodes(config.nodes, TARGET_SITE)
            link = _LinkProcess(TARGET_SITE, nodes.ports)
            config = replace(config, nodes=nodes.site_nodes(config.nodes))
        target = await asyncio.to_thread(
            functools.partial(dev.up, sub / "target", 3, 120.0, config=config, cluster_id="target")
        )
        clusters.append(target)
        async with CoordinatorClient(source.endpoints, timeout_s=30.0) as client:
            await client.create_channels(names=["rb_0"])
            await client.create_vchannel("rb_v", "rb_0")
        async with CoordinatorClient(target.endpoints, timeout_s=30.0) as client:
            await client.create_channels(names=["rb_0"])
        streaming = StreamingClient(CoordinatorClient(source.endpoints, timeout_s=30.0))
        producer = streaming.producer(
            producer_id=f"bench-rp-{len(out['runs'])}",
            linger_ms=2,
            max_in_flight=8,
            max_pending_messages=5000,
        )

        async def submit(payload: bytes) -> Any:
            return await producer.submit("rb_v", payload)

        await (await submit(b"warm|"))
        # What the source holds before replication starts: the target gets it first.
        backlog: dict[str, Any] = {"warm": 0}
        if not wan:
            for size in sizes:
                rate, acks = await max_rate(submit, seconds, size, f"alone-{size}-")
                backlog.update(acks)
                out["alone"][str(size)] = round(rate, 1)
                say(f"raftwal max without a target, {size} B: {rate:.1f} msg/s")
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
        direct = [e.replace(TARGET_SITE + ":", "127.0.0.1:") for e in target.endpoints]
        seen: dict[str, float] = {}
        watcher = _Watcher("raftwal", direct, seen)
        replicator_lags: list[tuple[float, float]] = []

        async def sample() -> None:
            # The replicator's own lag (what the target acknowledged), twice a second.
            async with CoordinatorClient(source.endpoints, timeout_s=5.0) as client:
                while True:
                    try:
                        status = await client.cluster_status(linearizable=False)
                        lags = [r.lag_s for m in status.members for r in m.replicators]
                        if lags:
                            replicator_lags.append((time.perf_counter(), max(lags)))
                    except RaftwalError:
                        pass
                    await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample())
        initial = await caught_up(backlog, seen, time.perf_counter())
        say(f"raftwal: the target holds the source's {len(backlog)} earlier messages "
            f"({initial} s after it started reading)")  # fmt: skip
        for rtt in group:
            if link is not None:
                link.set_latency(rtt / 2)
            for size in sizes:
                out["runs"].append(
                    await phases(
                        "raftwal", submit, seen, seconds, size, rtt, loads, None, replicator_lags
                    )
                )
        sampler.cancel()
        await producer.close(timeout_s=2.0)
        await streaming.close()
    finally:
        if watcher is not None:
            watcher.close()
        for cluster in clusters:
            await asyncio.to_thread(cluster.stop_all)
        if link is not None:
            link.close()


# -- JetStream -----------------------------------------------------------------------------


async def run_nats(
    directory: Path,
    binary: str,
    rtts: list[float],
    sizes: list[int],
    loads: list[float],
    seconds: float,
    rates: dict[tuple[float, int], dict[float, float]],
) -> dict[str, Any]:
    import nats
    from nats.js.api import ExternalStream, StreamConfig, StreamSource

    out: dict[str, Any] = {"runs": []}
    ports = dev.free_ports(3)
    # Round trips > 0: B's leaf node connection to A crosses the delayed link.
    link = _LinkProcess(TARGET_SITE, [ports[2]]) if any(r > 0 for r in rtts) else None
    leaf = f"{TARGET_SITE if link is not None else '127.0.0.1'}:{ports[2]}"
    configs = {
        "a": f'server_name: a\nlisten: "127.0.0.1:{ports[0]}"\nmax_payload: 8MB\n'
        f'jetstream {{ store_dir: "{directory}/a", domain: a }}\n'
        f'leafnodes {{ listen: "127.0.0.1:{ports[2]}" }}\n',
        "b": f'server_name: b\nlisten: "127.0.0.1:{ports[1]}"\nmax_payload: 8MB\n'
        f'jetstream {{ store_dir: "{directory}/b", domain: b }}\n'
        f'leafnodes {{ remotes: [{{ url: "nats-leaf://{leaf}" }}] }}\n',
    }
    processes: list[subprocess.Popen[bytes]] = []
    watcher: _Watcher | None = None
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
                        f"nats://127.0.0.1:{port}",
                        connect_timeout=2,
                        allow_reconnect=False,
                        # A server not up yet is retried here: no traceback per attempt.
                        error_cb=_ignore_nats_error,
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
            future = asyncio.ensure_future(ja.publish("rb.x", payload, timeout=10.0))
            future.add_done_callback(lambda _: pending.release())
            return future

        await (await submit(b"warm|"))
        await jb.add_stream(
            StreamConfig(
                name="M", mirror=StreamSource(name="S", external=ExternalStream(api="$JS.a.API"))
            )
        )
        seen: dict[str, float] = {}
        watcher = _Watcher("jetstream", ports[1], seen)
        for rtt in rtts:
            if link is not None:
                link.set_latency(rtt / 2)
            for size in sizes:
                out["runs"].append(
                    await phases(
                        "JetStream", submit, seen, seconds, size, rtt, loads, rates.get((rtt, size))
                    )
                )
        await a.close()
        await b.close()
        return out
    finally:
        if watcher is not None:
            watcher.close()
        for process in processes:
            stop_process(process)
        if link is not None:
            link.close()


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
    report: dict[str, Any] = {
        "seconds": args.seconds,
        "rtts_ms": args.rtts,
        "sizes": args.sizes,
        "loads": args.loads,
        "max_lag_ms": args.max_lag_ms,
        "loadavg_start": os.getloadavg()[0],
    }
    try:
        report["raftwal"] = await run_raftwal(
            directory / "raftwal", args.rtts, args.sizes, args.loads, args.seconds,
            args.max_lag_ms,
        )  # fmt: skip
        # JetStream at raftwal's rates: the same load on both.
        rates = {
            (run["rtt_ms"], run["size"]): {
                load: run[f"load_{load:g}"]["rate_msgs_s"] for load in args.loads
            }
            for run in report["raftwal"]["runs"]
        }
        binary = args.nats_server or shutil.which("nats-server")
        if args.skip_nats:
            report["jetstream"] = {"skipped": "--skip-nats"}
        elif binary is None:
            report["jetstream"] = {"unavailable": "nats-server not found (scripts/install-nats.sh)"}
        else:
            # Like raftwal: the sites without a round trip between them linked directly,
            # the others through the delaying proxy.
            report["jetstream"] = {"runs": []}
            groups = [[r for r in args.rtts if r == 0], [r for r in args.rtts if r > 0]]
            for index, group in enumerate(g for g in groups if g):
                (directory / f"nats{index}").mkdir()
                try:
                    part = await run_nats(
                        directory / f"nats{index}", binary, group, args.sizes, args.loads,
                        args.seconds, rates,
                    )  # fmt: skip
                    report["jetstream"]["runs"] += part["runs"]
                except (OSError, TimeoutError, NatsError, NatsUnavailable) as error:  # reported
                    report["jetstream"]["unavailable"] = f"{type(error).__name__}: {error}"
    finally:
        report["loadavg_end"] = os.getloadavg()[0]
        shutil.rmtree(directory, ignore_errors=True)
    return report


def _floats(text: str, what: str, low: float, high: float) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(low <= v <= high for v in values):
        raise argparse.ArgumentTypeError(
            f"invalid {what} ({text!r}; expected numbers {low:g}..{high:g}, comma separated)"
        )
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument(
        "--sizes",
        type=lambda t: [int(v) for v in _floats(t, "--sizes", 16, 1 << 20)],
        default=[200, 10240],
        help="payload bytes, comma separated (default 200,10240)",
    )
    parser.add_argument(
        "--rtts",
        type=lambda t: _floats(t, "--rtts", 0, 1000),
        default=[0.0, 10.0, 50.0],
        help="round trips between the sites in ms (default 0,10,50)",
    )
    parser.add_argument(
        "--loads",
        type=lambda t: _floats(t, "--loads", 0.01, 1.0),
        default=[0.5, 0.9],
        help="paced phases as fractions of raftwal's maximum (default 0.5,0.9)",
    )
    parser.add_argument(
        "--max-lag-ms",
        type=int,
        default=0,
        help="the source's replicate_max_lag_ms, flow control (default 0: off)",
    )
    parser.add_argument("--nats-server", default=None, help="nats-server binary")
    parser.add_argument("--skip-nats", action="store_true", help="raftwal only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error(f"invalid --seconds (got {args.seconds}; expected > 0)")
    if args.max_lag_ms < 0:
        parser.error(f"invalid --max-lag-ms (got {args.max_lag_ms}; expected >= 0)")
    # SIGTERM as Ctrl-C: the run is cancelled and stops the clusters and servers it started
    # (the nodes run in sessions of their own, so nothing else would).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    report = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"load average: {report['loadavg_start']:.2f} -> {report['loadavg_end']:.2f}")
    print(f"raftwal max without a target: {report['raftwal']['alone']}")
    for name in ("raftwal", "jetstream"):
        for run in report.get(name, {}).get("runs", []):
            print(f"{name}: {json.dumps(run)}")
    if "runs" not in report.get("jetstream", {}):
        print(f"jetstream: {json.dumps(report.get('jetstream'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
