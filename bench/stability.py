"""Leadership stability on a starved host: raftwal and etcd 3.4 side by side (issue 35).

One run, on 127.0.0.1: `--hogs K` busy-loop processes start first (each a Python
`while True: pass`), then a three-member etcd (bench/coord.py's `EtcdSystem`) and a
three-node raftwal dev cluster, one after the other, each timed from its first process
start to its first acknowledged write. With `--cpu C` this process pins itself to core C
before it starts anything, so every hog and every process of both clusters (they inherit
the affinity), and this sampler too, share that one core.

Then both clusters run side by side and are sampled once a second for `--duration-s`
(90). A sample reads every member's Raft term and leadership (etcd: the JSON gateway's
`/v3/maintenance/status`; raftwal: each node's Prometheus endpoint, `raftwal_raft_term`
and `raftwal_raft_is_leader`) and sends one write with a 5 s deadline (etcd: a put through
member e1, which forwards to the leader; raftwal: a Lock or Unlock of one key under one
lease through the SDK on every endpoint, which retries with the same request id). A
write still running does not delay the next sample.

Two phases of `--duration-s` each, on the same two clusters: **idle** (nothing but the
samples), then **load**: a steady coordination write load on both, `--load-writes-per-s`
(20) spread over `--load-clients` (4) paced writers (etcd: puts of 64 keys through member
e1, one connection per writer; raftwal: Lock or Unlock of 64 keys under the lease through
the SDK), and on raftwal also a WAL produce stream: one SDK `Producer` sending
`--load-produce-per-s` (200) messages of 100 B a second, paced, over `LOAD_PCHANNELS`
pchannels. Every load write and message has the same 5 s deadline as the samples' writes;
the samples' own writes are what the phase reports, the load's outcome is reported beside.

Reports, for each system and phase: start to first write (once, before the phases); the
Raft term at the first and the last sample (highest over the members that answered);
samples in which no member said there was a leader; failed writes of N; write p50, p99
and max (successful writes); for the load phase, the load's writes and messages sent,
failed, and their p50 / p99.

    .venv/bin/python bench/stability.py [--duration-s 90] [--hogs 2] [--cpu 0]
        [--phases idle,load] [--json]

With `--command CMD` it runs CMD instead of the two clusters (split as a shell would, no
shell), `--runs` times one after the other, under the same hogs and core, and reports each
run's exit code and time; it exits 0 only when every run did. Issue 35 runs the demo so:

    .venv/bin/python bench/stability.py --hogs 2 --cpu 0 --command "./run demo" --runs 3

etcd comes from `scripts/install-etcd.sh`. Every process started here is stopped by its
pid: the hogs with SIGKILL, the clusters as bench/coord.py and `raftwal dev` stop them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import kill9, median, percentile  # noqa: E402
from coord import ERRORS, EtcdBenchClient, EtcdSystem  # noqa: E402
from produce_elections import scrape  # noqa: E402

from raftwal.cli import dev  # noqa: E402
from rpc.client import CoordinatorClient  # noqa: E402
from rpc.streaming_client import Producer, StreamingClient  # noqa: E402

SAMPLE_INTERVAL_S = 1.0
WRITE_DEADLINE_S = 5.0
STATUS_TIMEOUT_S = 0.9
START_TIMEOUT_S = 300.0
MAX_HOGS = 16
LOCK_KEY = "stability/key"
PHASES = ("idle", "load")
# The load phase: keys the coordination writes cycle through, pchannels of the WAL stream.
LOAD_KEYS = 64
LOAD_PCHANNELS = 2
LOAD_PAYLOAD = b"x" * 100
MAX_LOAD_WRITES_PER_S = 1000
MAX_LOAD_CLIENTS = 64
MAX_LOAD_PRODUCE_PER_S = 100_000


@dataclass
class Series:
    """What one system showed over the samples."""

    name: str
    start_to_first_write_s: float = float("nan")
    terms: list[int] = field(default_factory=list)
    samples: int = 0
    without_leader: int = 0
    writes: int = 0
    failed_writes: int = 0
    write_errors: dict[str, int] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)

    def sample(self, answers: list[tuple[int, bool] | None]) -> None:
        self.samples += 1
        answered = [a for a in answers if a is not None]
        if answered:
            self.terms.append(max(term for term, _ in answered))
        if not any(has_leader for _, has_leader in answered):
            self.without_leader += 1

    def wrote(self, elapsed_s: float | None, error: BaseException | None) -> None:
        self.writes += 1
        if error is not None or elapsed_s is None:
            self.failed_writes += 1
            name = type(error).__name__ if error is not None else "unknown"
            self.write_errors[name] = self.write_errors.get(name, 0) + 1
        else:
            self.latencies_s.append(elapsed_s)

    def summary(self) -> dict[str, Any]:
        ms = [s * 1000 for s in self.latencies_s]
        return {
            "start_to_first_write_s": round(self.start_to_first_write_s, 2),
            "term_first": self.terms[0] if self.terms else None,
            "term_last": self.terms[-1] if self.terms else None,
            # [sample number (1-based), new term] at each rise: when the elections were.
            "term_rises": [
                [index + 1, self.terms[index]]
                for index in range(1, len(self.terms))
                if self.terms[index] > self.terms[index - 1]
            ],
            "samples": self.samples,
            "samples_without_leader": self.without_leader,
            "writes": self.writes,
            "failed_writes": self.failed_writes,
            "write_errors": self.write_errors,
            "write_p50_ms": round(median(ms), 1) if ms else None,
            "write_p99_ms": round(percentile(ms, 0.99), 1) if ms else None,
            "write_max_ms": round(max(ms), 1) if ms else None,
        }


@dataclass
class LoadStats:
    """What one stream of the load phase sent: each write or message acknowledged within
    WRITE_DEADLINE_S, or failed."""

    sent: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)

    def done(self, elapsed_s: float | None, error: BaseException | None) -> None:
        self.sent += 1
        if error is not None or elapsed_s is None:
            self.failed += 1
            name = type(error).__name__ if error is not None else "unknown"
            self.errors[name] = self.errors.get(name, 0) + 1
        else:
            self.latencies_s.append(elapsed_s)

    def summary(self) -> dict[str, Any]:
        ms = [s * 1000 for s in self.latencies_s]
        return {
            "sent": self.sent,
            "failed": self.failed,
            "errors": self.errors,
            "p50_ms": round(median(ms), 1) if ms else None,
            "p99_ms": round(percentile(ms, 0.99), 1) if ms else None,
        }


async def paced(rate_per_s: float, clients: int, duration_s: float, one: Any) -> None:
    """`clients` writers, each calling `await one(client, index)` every `clients /
    rate_per_s` seconds (sequentially: a slow write delays that writer's next one, never
    piles up), for `duration_s`."""
    interval_s = clients / rate_per_s

    async def writer(client: int) -> None:
        began = time.perf_counter() + client * interval_s / clients
        index = 0
        while True:
            next_at = began + index * interval_s
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            if time.perf_counter() - began >= duration_s:
                return
            await one(client, index * clients + client)
            index += 1

    await asyncio.gather(*(writer(k) for k in range(clients)))


# -- hogs -----------------------------------------------------------------------------------


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(count)
    ]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        if hog.poll() is None:
            kill9(hog)


# -- etcd -----------------------------------------------------------------------------------


class Etcd:
    name = "etcd"

    def __init__(self, directory: Path, binary: str) -> None:
        self.system = EtcdSystem(directory, binary)
        self.series = Series("etcd")
        self.load: dict[str, LoadStats] = {}
        self._status = {
            name: EtcdBenchClient(self.system.member(name), -1) for name in self.system.members()
        }

    async def start(self) -> None:
        began = time.perf_counter()
        await self.system.start()  # returns after a first put has been acknowledged
        self.series.start_to_first_write_s = time.perf_counter() - began

    async def stop(self) -> None:
        for client in self._status.values():
            await client.close()
        await self.system.stop()

    async def _one(self, name: str) -> tuple[int, bool] | None:
        try:
            status = await self._status[name].status(STATUS_TIMEOUT_S)
        except ERRORS:
            return None
        return int(status.get("raftTerm", 0)), int(status.get("leader", 0) or 0) != 0

    async def sample(self) -> None:
        answers = await asyncio.gather(*(self._one(name) for name in self._status))
        self.series.sample(list(answers))

    async def write(self, index: int) -> None:
        client = EtcdBenchClient(self.system.member("e1"), -1)
        began = time.perf_counter()
        try:
            await asyncio.wait_for(client.put(LOCK_KEY, str(index)), WRITE_DEADLINE_S)
        except ERRORS as error:
            self.series.wrote(None, error)
        else:
            self.series.wrote(time.perf_counter() - began, None)
        finally:
            await client.close()

    async def run_load(self, args: argparse.Namespace, duration_s: float) -> None:
        stats = self.load["coordination_writes"] = LoadStats()
        clients = [EtcdBenchClient(self.system.member("e1"), -1) for _ in range(args.load_clients)]

        async def one(client: int, index: int) -> None:
            began = time.perf_counter()
            key = f"stability/load/{index % LOAD_KEYS}"
            try:
                await asyncio.wait_for(clients[client].put(key, str(index)), WRITE_DEADLINE_S)
            except ERRORS as error:
                stats.done(None, error)
                # A timed-out request leaves its connection mid-answer: start a new one.
                await clients[client].close()
                clients[client] = EtcdBenchClient(self.system.member("e1"), -1)
            else:
                stats.done(time.perf_counter() - began, None)

        try:
            await paced(args.load_writes_per_s, args.load_clients, duration_s, one)
        finally:
            for client in clients:
                await client.close()


# -- raftwal --------------------------------------------------------------------------------


class Raftwal:
    name = "raftwal"

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self.cluster: dev.LocalCluster | None = None
        self.series = Series("raftwal")
        self.load: dict[str, LoadStats] = {}
        self._sdk: CoordinatorClient | None = None
        self._lease_id = 0
        self._held = False
        self._metrics: list[str] = []

    async def start(self, lease_ttl_s: float) -> None:
        began = time.perf_counter()
        self.cluster = await asyncio.to_thread(dev.up, self._directory, 3, START_TIMEOUT_S)
        self._metrics = [f"{n.host}:{n.metrics_port}" for n in self.cluster.config.nodes]
        self._sdk = CoordinatorClient(self.cluster.endpoints, timeout_s=WRITE_DEADLINE_S)
        first = await self._sdk.grant_lease(int(lease_ttl_s * 1000), holder="stability")
        self._lease_id = first.lease_id
        self.series.start_to_first_write_s = time.perf_counter() - began

    async def stop(self) -> None:
        if self._sdk is not None:
            await self._sdk.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop_all)

    async def sample(self) -> None:
        answers = await asyncio.gather(
            *(asyncio.to_thread(scrape, address) for address in self._metrics)
        )
        # scrape also gives the pchannels' owner terms: only the Raft term and leadership here.
        self.series.sample([None if a is None else (a[0], a[1]) for a in answers])

    async def write(self, _index: int) -> None:
        assert self._sdk is not None
        began = time.perf_counter()
        # Lock is idempotent for its holder and Unlock of a key not held is a no-op, so two
        # overlapping writes (one slower than a sample) never fail each other.
        held, self._held = self._held, not self._held
        try:
            if held:
                call = self._sdk.unlock(LOCK_KEY, self._lease_id)
            else:
                call = self._sdk.lock(LOCK_KEY, self._lease_id)
            await asyncio.wait_for(call, WRITE_DEADLINE_S)
        except ERRORS as error:
            self.series.wrote(None, error)
        else:
            self.series.wrote(time.perf_counter() - began, None)

    async def run_load(self, args: argparse.Namespace, duration_s: float) -> None:
        assert self._sdk is not None and self.cluster is not None
        sdk = self._sdk
        writes = self.load["coordination_writes"] = LoadStats()
        self.load["wal_messages"] = LoadStats()

        async def one(_client: int, index: int) -> None:
            # Each key is locked on one pass and unlocked on the next (both idempotent).
            key = f"stability/load/{index % LOAD_KEYS}"
            began = time.perf_counter()
            try:
                if (index // LOAD_KEYS) % 2:
                    call = sdk.unlock(key, self._lease_id)
                else:
                    call = sdk.lock(key, self._lease_id)
                await asyncio.wait_for(call, WRITE_DEADLINE_S)
            except ERRORS as error:
                writes.done(None, error)
            else:
                writes.done(time.perf_counter() - began, None)

        async with StreamingClient(self.cluster.endpoints) as client:
            vchannels = await self._wal_vchannels(client)
            async with Producer(client, retry_timeout_s=WRITE_DEADLINE_S) as producer:
                await asyncio.gather(
                    paced(args.load_writes_per_s, args.load_clients, duration_s, one),
                    self._produce(producer, vchannels, args.load_produce_per_s, duration_s),
                )

    async def _wal_vchannels(self, client: StreamingClient) -> list[str]:
        created = await client.coordinator.create_channels(count=LOAD_PCHANNELS, prefix="stability")
        names = []
        for index, pchannel in enumerate(created.pchannels):
            name = f"stability_v{index}"
            await client.coordinator.create_vchannel(name, pchannel)
            names.append(name)
        return names

    async def _produce(
        self, producer: Producer, vchannels: list[str], rate_per_s: float, duration_s: float
    ) -> None:
        messages = self.load["wal_messages"]
        pending: set[asyncio.Future[Any]] = set()
        began = time.perf_counter()
        index = 0
        while time.perf_counter() - began < duration_s:
            sent_at = time.perf_counter()
            try:
                future = await asyncio.wait_for(
                    producer.submit(vchannels[index % len(vchannels)], LOAD_PAYLOAD),
                    WRITE_DEADLINE_S,
                )
            except ERRORS as error:
                messages.done(None, error)
            else:

                def acked(done: asyncio.Future[Any], sent_at: float = sent_at) -> None:
                    pending.discard(done)
                    error = None if done.cancelled() else done.exception()
                    if done.cancelled() or error is not None:
                        messages.done(None, error)
                    else:
                        messages.done(time.perf_counter() - sent_at, None)

                pending.add(future)
                future.add_done_callback(acked)
            index += 1
            next_at = began + index / rate_per_s
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        if pending:
            await asyncio.wait(list(pending), timeout=2 * WRITE_DEADLINE_S)


# -- run ------------------------------------------------------------------------------------


async def sample_both(systems: list[Etcd | Raftwal], duration_s: float) -> None:
    writes: set[asyncio.Task[None]] = set()
    began = time.perf_counter()
    index = 0
    while time.perf_counter() - began < duration_s:
        index += 1
        for system in systems:
            task = asyncio.create_task(system.write(index))
            writes.add(task)
            task.add_done_callback(writes.discard)
        await asyncio.gather(*(system.sample() for system in systems))
        next_at = began + index * SAMPLE_INTERVAL_S
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    if writes:
        await asyncio.wait(list(writes), timeout=2 * WRITE_DEADLINE_S)


async def run_phase(
    name: str, systems: list[Etcd | Raftwal], args: argparse.Namespace
) -> dict[str, Any]:
    for system in systems:
        started = system.series.start_to_first_write_s
        system.series = Series(system.name, start_to_first_write_s=started)
        system.load = {}
    load: list[asyncio.Task[None]] = []
    if name == "load":
        load = [asyncio.create_task(system.run_load(args, args.duration_s)) for system in systems]
    try:
        await sample_both(systems, args.duration_s)
    finally:
        if load:
            # Each load ends by itself after duration_s; a broken one raises here.
            await asyncio.wait_for(asyncio.gather(*load), timeout=4 * WRITE_DEADLINE_S)
    return {
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "systems": {
            system.name: {
                **system.series.summary(),
                "load": {k: v.summary() for k, v in system.load.items()},
            }
            for system in systems
        },
    }


async def run(args: argparse.Namespace, etcd_binary: str) -> dict[str, Any]:
    hogs = start_hogs(args.hogs)
    load_average_at_start = round(os.getloadavg()[0], 2)
    phases: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="raftwal-stability-") as tmp:
            etcd = Etcd(Path(tmp) / "etcd", etcd_binary)
            raftwal = Raftwal(Path(tmp) / "raftwal")
            try:
                await etcd.start()
                await raftwal.start(lease_ttl_s=len(args.phases) * args.duration_s + 600)
                for phase in args.phases:
                    phases[phase] = await run_phase(phase, [etcd, raftwal], args)
            finally:
                with contextlib.suppress(*ERRORS):
                    await raftwal.stop()
                await etcd.stop()
    finally:
        stop_hogs(hogs)
    return {
        "duration_s": args.duration_s,
        "hogs": args.hogs,
        "cpu": args.cpu,
        "cpus": os.cpu_count(),
        "load_average_1m_at_start": load_average_at_start,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "etcd_version": etcd.system.version(),
        "load": {
            "writes_per_s": args.load_writes_per_s,
            "clients": args.load_clients,
            "produce_per_s": args.load_produce_per_s,
        },
        "phases": phases,
    }


ROWS = [
    ("start to first write", lambda s: f"{s['start_to_first_write_s']:.1f} s"),
    ("Raft term, first -> last sample", lambda s: f"{s['term_first']} -> {s['term_last']}"),
    ("samples with no leader", lambda s: f"{s['samples_without_leader']} of {s['samples']}"),
    (
        f"failed writes ({WRITE_DEADLINE_S:.0f} s deadline)",
        lambda s: f"{s['failed_writes']} of {s['writes']}",
    ),
    (
        "write p50 / p99 / max",
        lambda s: f"{s['write_p50_ms']} / {s['write_p99_ms']} / {s['write_max_ms']} ms",
    ),
]


def _load_cell(summary: dict[str, Any], stream: str) -> str:
    load = summary["load"].get(stream)
    if load is None:
        return "-"
    return f"{load['failed']} of {load['sent']} failed, {load['p50_ms']} / {load['p99_ms']} ms"


def render_markdown(phase: dict[str, Any]) -> str:
    etcd, raftwal = phase["systems"]["etcd"], phase["systems"]["raftwal"]
    lines = ["| | etcd | raftwal |", "|---|---:|---:|"]
    lines += [f"| {label} | {show(etcd)} | {show(raftwal)} |" for label, show in ROWS]
    if etcd["load"] or raftwal["load"]:
        for stream, label in (
            ("coordination_writes", "load writes, p50 / p99"),
            ("wal_messages", "load WAL messages, p50 / p99"),
        ):
            lines.append(
                f"| {label} | {_load_cell(etcd, stream)} | {_load_cell(raftwal, stream)} |"
            )
    return "\n".join(lines)


def _phases(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if not names or any(n not in PHASES for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"invalid --phases ({value!r}; expected some of {','.join(PHASES)}, comma-separated)"
        )
    return names


# -- a command under the same starvation ----------------------------------------------------


def run_command(argv: list[str], runs: int, timeout_s: float) -> list[dict[str, Any]]:
    """Run `argv` `runs` times in a row (the hogs already started); each run's exit code
    (None: stopped after `timeout_s`) and wall time. A run past its time gets SIGTERM, then
    after 60 s SIGKILL to its process group (its own session, started here)."""
    results: list[dict[str, Any]] = []
    for number in range(1, runs + 1):
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        finally:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        elapsed = time.perf_counter() - started
        results.append({"run": number, "exit_code": code, "seconds": round(elapsed, 1)})
        print(
            f"run {number} of {runs}: "
            + (f"exit {code}" if code is not None else f"stopped after {timeout_s:.0f} s")
            + f" in {elapsed:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=90.0, help="sampling time (90)")
    parser.add_argument("--hogs", type=int, default=0, help="busy-loop processes (0)")
    parser.add_argument("--cpu", type=int, help="pin everything to this core (default: none)")
    parser.add_argument(
        "--phases", type=_phases, default=PHASES, help="phases to run, in order (idle,load)"
    )
    parser.add_argument(
        "--load-writes-per-s",
        type=float,
        default=20.0,
        help="load phase: coordination writes/s (20)",
    )
    parser.add_argument("--load-clients", type=int, default=4, help="load phase: paced writers (4)")
    parser.add_argument(
        "--load-produce-per-s",
        type=float,
        default=200.0,
        help="load phase, raftwal: WAL messages/s (200)",
    )
    parser.add_argument(
        "--command",
        help="instead of the clusters: run this command (split as a shell would) under the "
        "same hogs and core, --runs times",
    )
    parser.add_argument("--runs", type=int, default=1, help="with --command: how many runs (1)")
    parser.add_argument(
        "--command-timeout-s",
        type=float,
        default=1200.0,
        help="with --command: stop a run after this long (1200)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error(f"invalid --runs ({args.runs}; expected 1..100)")
    if not 1 <= args.command_timeout_s <= 24 * 3600:
        parser.error(f"invalid --command-timeout-s ({args.command_timeout_s}; expected 1..86400)")
    if not 0 < args.load_writes_per_s <= MAX_LOAD_WRITES_PER_S:
        parser.error(
            f"invalid --load-writes-per-s ({args.load_writes_per_s}; "
            f"expected 0..{MAX_LOAD_WRITES_PER_S}, above 0)"
        )
    if not 1 <= args.load_clients <= MAX_LOAD_CLIENTS:
        parser.error(
            f"invalid --load-clients ({args.load_clients}; expected 1..{MAX_LOAD_CLIENTS})"
        )
    if not 0 < args.load_produce_per_s <= MAX_LOAD_PRODUCE_PER_S:
        parser.error(
            f"invalid --load-produce-per-s ({args.load_produce_per_s}; "
            f"expected 0..{MAX_LOAD_PRODUCE_PER_S}, above 0)"
        )
    if not 1 <= args.duration_s <= 3600:
        parser.error(f"invalid --duration-s ({args.duration_s}; expected 1..3600)")
    if not 0 <= args.hogs <= MAX_HOGS:
        parser.error(f"invalid --hogs ({args.hogs}; expected 0..{MAX_HOGS})")
    if args.cpu is not None and args.cpu not in os.sched_getaffinity(0):
        parser.error(
            f"invalid --cpu ({args.cpu}; expected one of {sorted(os.sched_getaffinity(0))})"
        )
    command = shlex.split(args.command) if args.command else []
    if args.command is not None and not command:
        parser.error("invalid --command (empty)")
    binary = shutil.which("etcd")
    if binary is None and not command:
        parser.error("etcd is not installed: run scripts/install-etcd.sh")
    if args.cpu is not None:
        # Inherited by every process started from here on: hogs and both clusters.
        os.sched_setaffinity(0, {args.cpu})
    if command:
        hogs = start_hogs(args.hogs)
        try:
            runs = run_command(command, args.runs, args.command_timeout_s)
        finally:
            stop_hogs(hogs)
        passed = sum(1 for run in runs if run["exit_code"] == 0)
        summary = {"command": args.command, "hogs": args.hogs, "cpu": args.cpu, "runs": runs}
        print(json.dumps(summary) if args.json else f"{passed} of {len(runs)} runs exited 0")
        return 0 if passed == len(runs) else 1
    assert binary is not None
    report = asyncio.run(run(args, binary))
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['duration_s']:.0f} s per phase, {args.hogs} hogs, cpu {args.cpu}, "
            f"etcd {report['etcd_version']}, load average {report['load_average_1m_at_start']}"
            f" at the start"
        )
        for name, phase in report["phases"].items():
            print(f"\n{name} (load average {phase['load_average_1m_at_end']} at its end)")
            print(render_markdown(phase))
            for system, summary in phase["systems"].items():
                if summary["write_errors"]:
                    print(f"{system} write errors: {summary['write_errors']}")
                for stream, load in summary["load"].items():
                    if load["errors"]:
                        print(f"{system} {stream} errors: {load['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
