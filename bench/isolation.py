"""Isolation of coordination from the WAL: raftwal against etcd 3.4 + NATS JetStream (issue 48).

Does a coordination write slow down while the same nodes carry a WAL stream? One run, on
127.0.0.1, one system at a time, each started, measured and stopped before the next:

- **raftwal**: a three-node dev cluster (`raftwal.cli.dev.up`, fsync policy `always`; each
  node a supervisor, a control process and `RAFTWAL_DEV_DATA_WORKERS` data workers, 1 by
  default) takes both the coordination writes and the WAL stream, on `--pchannels` (1)
  pchannels with replica set 3.
- **anchor**, the way Milvus deploys it: a three-member etcd 3.4 (bench/coord.py's
  `EtcdSystem`) takes the same coordination writes while a three-server NATS JetStream
  cluster (bench/wal.py's `NatsWal`, R3 file stream, `sync_interval: always`) takes the
  same WAL stream. Both run side by side on the same host, as raftwal's three nodes do.

First, on raftwal alone, a **max** phase measures raftwal's own maximum produce rate as
bench/wal.py's "100 B x 8 producers" does (its `pipelined_load` and `RaftwalProducer`:
`--producers` (8) producers, each one Produce connection to the pchannel's data worker over
its transfer port, batches of `--batch` (100) 100-byte messages, `--in-flight` (8) batches
outstanding each, closed loop for `--max-s` after a warm-up). `--max-rate R` skips it and
takes R. Then, for each system, one phase after the other, each `--warmup-s` (3) not
counted, then `--phase-s` (30) counted (latencies of what was sent in it, CPU over it):

- **idle**: coordination writes only;
- **walNN**: the same coordination writes while the WAL takes a paced stream at NN% of
  raftwal's maximum (`--wal-fractions`, 0.5,0.9); JetStream gets the same absolute rate.

(raftwal's idle phase runs before its max phase, so that it is idle indeed.)

Coordination writes: `--coord-writes-per-s` (50) spread over `--coord-clients` (4) paced
writers, each with a client of its own and a 5 s deadline per write (stability.py's
`paced`: a slow write delays that writer's next one, never piles up). raftwal: each writer
is an SDK `CoordinatorClient` over every endpoint, the Raft leader's first (a follower
forwards a write it gets to the leader: one more hop), with a lease of its own, and
alternates Lock and Unlock of its own key. etcd: each writer is one
keep-alive connection to the leader's JSON gateway (etcd's best case: no forwarding), and
puts its own key. Every write's latency is recorded, from its send to its answer. The
writers run in a process of their own (`--coord-writers process`, the default), as an
application that takes locks runs apart from one that produces: in the bench's own
process, beside the WAL's load generator, their latencies would include its event loop
and GIL (`--coord-writers inline` measures that way; the JetStream client's CPU, three
times raftwal's batch client's, then lands in etcd's figures most). Their CPU is reported
as `writers_cpu_s`, apart from the bench client's `client_cpu_s`.

WAL stream: an open loop. Unit k of `--batch` 100-byte messages is due at t0 + k x batch /
rate, round-robin over `--producers` producers, whether or not earlier ones were
acknowledged; a message's produce->ack latency runs from its unit's due time to its own
acknowledgement, so a client or server falling behind shows in it. raftwal, with
`--wal-client batch` (default): wal.py's `RaftwalProducer`, the unit one pre-encoded
Produce batch (one acknowledgement for all of its messages), so that the bench client's CPU
stays small beside the nodes'; with `--wal-client sdk`: SDK `Producer`s
(`rpc.streaming_client`, routing through WatchAssignments by themselves, linger 2 ms), each
message submitted and acknowledged on its own. JetStream: one nats-py connection per
producer to the stream leader's server, each message a JetStream publish with a reply
subject, each message's own PubAck ends its latency. A unit still unacknowledged 10 s after
the phase counts as failed. Percentiles of the WAL come from 1%-wide log buckets.

Reported, for each system and phase: coordination writes (acknowledged, failed) and their
p50 / p99 / max; the WAL rate asked and the rate reached (acknowledged messages from the
phase's start to its last acknowledgement), produce->ack p50 / p99 / max, failed messages;
CPU seconds over the phase of every process (raftwal: each node's supervisor, control
process and data workers, found with `dev.node_processes` and labelled from
`MemberStatus.processes`; etcd members; nats servers; the bench client itself); Raft terms
and WAL owner terms at the phase's start and end. Then, with `--runs N` (fresh clusters each
run), every run and the medians, and issue 48's Done-when checks as pass / fail lines: with
the WAL at 50% of its maximum, raftwal's coordination write p50 <= 1.5x its own idle p50,
its p99 <= 2x its idle p99 and <= 1.5x etcd's in the same phase, and raftwal's WAL
produce->ack p99 <= JetStream's at the same rate. A WAL that fell behind its rate (under
90% of it reached, or a message failed) is said beside every check, since that phase was
not the load it is named for, and raftwal's WAL check then fails. The first line gives the
data workers' niceness (`data_worker_nice`, RAFTWAL_DATA_WORKER_NICE): on a host that
other work shares, workers at nice 10 get little CPU, and raftwal's WAL figures show it.

    .venv/bin/python bench/isolation.py [--runs 3] [--phase-s 30] [--quick] [--json]
        [--wal-fractions 0.5,0.9] [--max-rate R] [--wal-client batch|sdk]
        [--coord-writers process|inline]
        [--skip-etcd] [--skip-nats]

(or `./run bench isolation ...`). etcd comes from `scripts/install-etcd.sh`, nats-server
>= 2.10 from `scripts/install-nats.sh`. Every process started here is stopped by its pid,
also after a failure, Ctrl-C or SIGTERM (raftwal: `stop_all`, else `dev.down` of the dev
dir; then any process of a node still alive is killed by its pid); every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime
import json
import math
import multiprocessing
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    cpu_seconds,
    error_name,
    median,
    own_cpu_seconds,
    percentile,
    wait_until,
)
from coord import ERRORS as COORD_ERRORS  # noqa: E402
from coord import EtcdBenchClient, EtcdSystem  # noqa: E402
from stability import paced  # noqa: E402
from wal import ERRORS as WAL_ERRORS  # noqa: E402
from wal import (  # noqa: E402
    NATS_SYNC_ALWAYS_MIN_VERSION,
    LoadResult,
    NatsWal,
    RaftwalProducer,
    SystemUnavailable,
    close_all,
    find_nats_server,
    nats_connect,
    pipelined_load,
)

from raftwal.cli import dev  # noqa: E402
from raftwal.node.config import ClusterConfig  # noqa: E402
from rpc.client import AlreadyExistsError, CoordinatorClient  # noqa: E402
from rpc.placement import serving_address  # noqa: E402
from rpc.protos import coordination_pb2 as pb  # noqa: E402
from rpc.protos import coordinator_pb2 as api  # noqa: E402
from rpc.streaming_client import Producer, StreamingClient  # noqa: E402

ERRORS = (*COORD_ERRORS, *WAL_ERRORS)
#: What ends one run (reported, and the next run goes on); anything else ends them all.
RUN_ERRORS = (*ERRORS, RuntimeError, SystemUnavailable, AssertionError)

MESSAGE_BYTES = 100
#: Per coordination write, per Produce submit, per status call.
WRITE_DEADLINE_S = 5.0
STATUS_TIMEOUT_S = 5.0
START_TIMEOUT_S = 180.0
#: How long a stopped run waits for an interrupted dev.up to give up (it checks every 0.2 s).
START_STOP_WAIT_S = 30.0
ASSIGN_TIMEOUT_S = 90.0
#: After a phase's schedule, how long its last WAL units may take to be acknowledged.
DRAIN_TIMEOUT_S = 10.0
#: A phase that has not ended this long after its schedule is cancelled (a wedged system).
PHASE_GRACE_S = DRAIN_TIMEOUT_S + 4 * WRITE_DEADLINE_S
#: Pause between phases, so that one phase's tail does not land in the next.
SETTLE_S = 2.0
#: WAL units scheduled while this many are outstanding are skipped (counted "overload").
MAX_OUTSTANDING_UNITS = 2000
#: A WAL stream kept up when nothing failed and this share of the asked rate was reached.
KEPT_UP_FRACTION = 0.9
#: raftwal leases of the coordination writers: far longer than any run.
LEASE_TTL_MS = 3_600_000
#: How long the processes of a stopped raftwal node get to be gone before SIGKILL by pid.
LEFTOVER_WAIT_S = 10.0
#: The Done-when of issue 48, at the phase with the WAL at 50% of its maximum.
CHECK_FRACTION = 0.5
CHECKS = (
    ("coord_p50", "raftwal coordination p50 <= 1.5x its own idle p50", 1.5),
    ("coord_p99_idle", "raftwal coordination p99 <= 2x its own idle p99", 2.0),
    ("coord_p99_etcd", "raftwal coordination p99 <= 1.5x etcd's in the same phase", 1.5),
    ("wal_p99", "raftwal WAL produce->ack p99 <= JetStream's at the same rate", 1.0),
)


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def _round(value: float, digits: int = 2) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


# -- statistics -----------------------------------------------------------------------------


_LOG_GROWTH = math.log(1.01)


class Histogram:
    """Latencies in log-spaced buckets 1% wide, with the exact count and maximum: a phase
    of millions of messages is summarized without keeping every sample, and its
    percentiles are exact to within 1%."""

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.max_s = 0.0

    def add(self, seconds: float, weight: int = 1) -> None:
        bucket = math.floor(math.log(max(seconds, 1e-6) * 1e6) / _LOG_GROWTH)
        self.buckets[bucket] += weight
        self.count += weight
        if seconds > self.max_s:
            self.max_s = seconds

    def percentile_s(self, fraction: float) -> float:
        if not self.count:
            return math.nan
        rank = fraction * (self.count - 1)
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen > rank:
                # The bucket's geometric middle, never above the largest sample.
                return min(math.exp((bucket + 0.5) * _LOG_GROWTH) / 1e6, self.max_s)
        return self.max_s


@dataclass
class CoordStats:
    """The coordination writes of one phase: every write's latency, or its error."""

    latencies_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def summary(self, wall_s: float) -> dict[str, Any]:
        ms = [s * 1000 for s in self.latencies_s]
        failed = sum(self.errors.values())
        return {
            "writes": len(ms),
            "failed": failed,
            "errors": dict(self.errors),
            "writes_per_s": _round(len(ms) / wall_s if wall_s > 0 else math.nan, 1),
            "p50_ms": _round(percentile(ms, 0.50)),
            "p99_ms": _round(percentile(ms, 0.99)),
            "max_ms": _round(max(ms) if ms else math.nan),
        }


@dataclass
class WalStats:
    """The WAL stream of one phase, counted in messages."""

    rate_msgs_per_s: float
    scheduled: int = 0
    acked: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latency: Histogram = field(default_factory=Histogram)
    started_at: float = 0.0
    last_ack_at: float = 0.0

    def fail(self, name: str, messages: int) -> None:
        self.failed += messages
        self.errors[name] += messages

    @property
    def reached_msgs_per_s(self) -> float:
        """Acknowledged messages a second from the phase's start to its last ack."""
        span = self.last_ack_at - self.started_at
        return self.acked / span if self.acked and span > 0 else 0.0

    @property
    def kept_up(self) -> bool:
        return (
            self.failed == 0 and self.reached_msgs_per_s >= KEPT_UP_FRACTION * self.rate_msgs_per_s
        )

    def summary(self) -> dict[str, Any]:
        return {
            "asked_msgs_per_s": _round(self.rate_msgs_per_s, 1),
            "reached_msgs_per_s": _round(self.reached_msgs_per_s, 1),
            "kept_up": self.kept_up,
            "scheduled": self.scheduled,
            "acked": self.acked,
            "failed": self.failed,
            "errors": dict(self.errors),
            "p50_ms": _round(self.latency.percentile_s(0.50) * 1000),
            "p99_ms": _round(self.latency.percentile_s(0.99) * 1000),
            "max_ms": _round(self.latency.max_s * 1000 if self.latency.count else math.nan),
        }


# -- the WAL stream ---------------------------------------------------------------------------


@dataclass
class UnitResult:
    """How one unit of messages ended: `acked_at` holds each acknowledged message's ack
    time (perf_counter), or is None when all of them were acknowledged at once, when the
    unit's future resolved."""

    acked_at: list[float] | None = None
    failed: int = 0
    error: str = ""


class WalSender(Protocol):
    #: messages per unit
    unit: int

    async def send(self) -> asyncio.Future[UnitResult | None]:
        """Send one unit; the future resolves when every message of it has an outcome."""

    async def close(self) -> None: ...


class RaftwalBatchSender:
    """A unit is one pre-encoded Produce batch over wal.py's `RaftwalProducer` (one
    acknowledgement for the whole batch)."""

    def __init__(self, producer: RaftwalProducer) -> None:
        self.unit = producer.batch_size
        self._producer = producer

    async def send(self) -> asyncio.Future[UnitResult | None]:
        return await self._producer.submit()

    async def close(self) -> None:
        await self._producer.close()


def _collector(
    unit: int,
) -> tuple[asyncio.Future[UnitResult | None], Callable[[float | None, str], None]]:
    """A unit's future and the callback each of its `unit` messages reports to (its ack
    time, or None and the error's name); the future resolves after the last report."""
    future: asyncio.Future[UnitResult | None] = asyncio.get_running_loop().create_future()
    result = UnitResult(acked_at=[])

    def report(acked_at: float | None, error: str) -> None:
        assert result.acked_at is not None
        if acked_at is None:
            result.failed += 1
            result.error = result.error or error
        else:
            result.acked_at.append(acked_at)
        if len(result.acked_at) + result.failed == unit and not future.done():
            future.set_result(result)

    return future, report


class SdkSender:
    """A unit is `unit` messages submitted one by one to an SDK `Producer`; each message
    has its own future, acknowledged when the batch the SDK put it in is."""

    def __init__(self, producer: Producer, vchannel: str, payload: bytes, unit: int) -> None:
        self.unit = unit
        self._producer = producer
        self._vchannel = vchannel
        self._payload = payload

    async def send(self) -> asyncio.Future[UnitResult | None]:
        future, report = _collector(self.unit)

        def done(message: asyncio.Future[Any]) -> None:
            if message.cancelled():
                report(None, "cancelled")
            elif (error := message.exception()) is not None:
                report(None, error_name(error))
            else:
                report(time.perf_counter(), "")

        for _ in range(self.unit):
            message = await self._producer.submit(self._vchannel, self._payload)
            message.add_done_callback(done)
        return future

    async def close(self) -> None:
        return None  # the producers are closed by their stack


class JetStreamSender:
    """One nats-py connection to the stream leader's server. A unit is `unit` JetStream
    publishes sharing one reply subject; each PubAck ends its own message's latency (as
    wal.py's `NatsProducer`, with a time per acknowledgement instead of one per batch)."""

    def __init__(self, connection: Any, subject: str, payload: bytes, unit: int) -> None:
        self.unit = unit
        self._nc = connection
        self._subject = subject
        self._payload = payload
        self._prefix = f"_ISOBENCH.{uuid.uuid4().hex}"
        self._next = 1
        self._pending: dict[int, Callable[[float | None, str], None]] = {}
        self._reported: Counter[int] = Counter()
        self._subscription: Any = None

    async def open(self) -> None:
        self._subscription = await self._nc.subscribe(f"{self._prefix}.*", cb=self._on_ack)

    async def _on_ack(self, message: Any) -> None:
        now = time.perf_counter()
        number = int(message.subject.rsplit(".", 1)[1])
        report = self._pending.get(number)
        if report is None:
            return
        if b'"error"' in message.data or not message.data:
            report(None, "JetStream error" if message.data else "no responders")
        else:
            report(now, "")
        self._reported[number] += 1
        if self._reported[number] >= self.unit:
            del self._pending[number], self._reported[number]

    async def send(self) -> asyncio.Future[UnitResult | None]:
        if self._nc.is_closed:
            raise ConnectionError("NATS connection closed")
        number = self._next
        self._next += 1
        future, report = _collector(self.unit)
        self._pending[number] = report
        reply = f"{self._prefix}.{number}"
        for _ in range(self.unit):
            await self._nc.publish(self._subject, self._payload, reply=reply)
        return future

    async def close(self) -> None:
        self._pending.clear()
        with contextlib.suppress(*ERRORS):
            await asyncio.wait_for(self._nc.close(), 2.0)


async def paced_wal(
    senders: list[WalSender], stats: WalStats, warmup_s: float, duration_s: float
) -> None:
    """Open loop: unit k is sent at t0 + k x unit / rate, round-robin over `senders`,
    whether or not earlier ones were acknowledged; each message's latency runs from its
    unit's due time to its acknowledgement. Only units due after `warmup_s` are counted,
    for `duration_s`; units still out DRAIN_TIMEOUT_S after the schedule count as failed."""
    unit = senders[0].unit
    units_per_s = stats.rate_msgs_per_s / unit
    count = max(1, round(units_per_s * (warmup_s + duration_s)))
    outstanding: dict[asyncio.Future[UnitResult | None], bool] = {}
    # Set once the drain is over: a unit that ends after it was already counted as failed.
    closed = False
    t0 = time.perf_counter() + 0.02
    stats.started_at = t0 + warmup_s
    # A send that blocks (flow control of a stalled server) must not stretch the phase.
    deadline = t0 + warmup_s + duration_s + WRITE_DEADLINE_S
    for k in range(count):
        due = t0 + k / units_per_s
        counted = due >= stats.started_at
        now = time.perf_counter()
        if now >= deadline:
            left = sum(1 for j in range(k, count) if t0 + j / units_per_s >= stats.started_at)
            stats.scheduled += left * unit
            stats.fail("phase deadline", left * unit)
            break
        # Behind schedule, still let acknowledgements in between sends.
        await asyncio.sleep(due - now if due > now else 0)
        if counted:
            stats.scheduled += unit
        if len(outstanding) >= MAX_OUTSTANDING_UNITS:
            if counted:
                stats.fail("overload", unit)
            continue
        try:
            future = await senders[k % len(senders)].send()
        except ERRORS as error:
            if counted:
                stats.fail(error_name(error), unit)
            continue

        def done(future: asyncio.Future[UnitResult | None], due: float = due) -> None:
            counted = outstanding.pop(future, False)
            if closed or not counted:
                return
            if future.cancelled():
                stats.fail("cancelled", unit)
                return
            error = future.exception()
            if error is not None:
                stats.fail(error_name(error), unit)
                return
            result = future.result()
            if result is None or result.acked_at is None:
                now = time.perf_counter()
                stats.latency.add(now - due, unit)
                stats.acked += unit
                stats.last_ack_at = max(stats.last_ack_at, now)
                return
            for acked_at in result.acked_at:
                stats.latency.add(acked_at - due)
                stats.last_ack_at = max(stats.last_ack_at, acked_at)
            stats.acked += len(result.acked_at)
            if result.failed:
                stats.fail(result.error or "failed", result.failed)

        outstanding[future] = counted
        future.add_done_callback(done)
    if outstanding:
        await asyncio.wait(list(outstanding), timeout=DRAIN_TIMEOUT_S)
    closed = True
    late = [(f, counted) for f, counted in outstanding.items() if not f.done()]
    late_messages = sum(unit for _f, counted in late if counted)
    if late_messages:
        stats.fail("unacknowledged after the drain", late_messages)
    for future, _counted in late:
        future.cancel()


# -- a system under test ----------------------------------------------------------------------


# -- raftwal's own latency histograms ---------------------------------------------------------

#: (metric, label filter) of the server-side histograms read around each raftwal phase:
#: the proposals of the writers' Lock and Unlock on the node they call (the Raft leader),
#: and every node's Raft journal fdatasyncs.
SERVER_HISTOGRAMS = {
    "proposal": ("raftwal_proposal_duration_seconds", ("lock", "unlock")),
    "journal_fsync": ("raftwal_raft_journal_fsync_seconds", None),
}


def scrape_buckets(port: int) -> dict[str, dict[float, float]]:
    """name -> {upper bound: cumulative count} of `SERVER_HISTOGRAMS` on one node's
    metrics page (label values summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/metrics", timeout=STATUS_TIMEOUT_S
    ) as answer:
        text = answer.read().decode()
    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for key, (name, kinds) in SERVER_HISTOGRAMS.items():
            if family.name != name:
                continue
            buckets = out.setdefault(key, {})
            for sample in family.samples:
                if not sample.name.endswith("_bucket"):
                    continue
                if kinds is not None and sample.labels.get("kind") not in kinds:
                    continue
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return out


def bucket_summary(
    before: dict[float, float], after: dict[float, float]
) -> dict[str, float | None]:
    """Count, and the p50 / p99 as the upper bound of the bucket they fall in, of what a
    histogram took between two scrapes."""
    bounds = sorted(after)
    delta = [after[b] - before.get(b, 0.0) for b in bounds]
    total = delta[-1] if delta else 0.0

    def quantile(q: float) -> float | None:
        for bound, cumulative in zip(bounds, delta, strict=True):
            if total and cumulative >= q * total:
                return None if math.isinf(bound) else _round(bound * 1000, 1)
        return None

    return {"count": total, "p50_le_ms": quantile(0.5), "p99_le_ms": quantile(0.99)}


# -- coordination writers --------------------------------------------------------------------


class RaftwalWriters:
    """raftwal's coordination writers: one SDK client (its own TCP connection) and lease
    each, alternating Lock and Unlock of its own key."""

    def __init__(self, endpoints: list[str], clients: int) -> None:
        self._endpoints = endpoints
        self._clients = clients
        self._writers: list[tuple[CoordinatorClient, int]] = []
        self._held: list[bool] = []

    async def open(self) -> None:
        for k in range(self._clients):
            sdk = CoordinatorClient(
                self._endpoints,
                timeout_s=WRITE_DEADLINE_S,
                # Its own TCP connection, as an independent application would have.
                channel_options=[("grpc.use_local_subchannel_pool", 1)],
            )
            self._writers.append((sdk, 0))
            lease = await sdk.grant_lease(LEASE_TTL_MS, holder=f"isolation-{k}")
            self._writers[k] = (sdk, lease.lease_id)
            self._held.append(False)
        for k in range(len(self._writers)):
            await self.write(k, 0)

    async def write(self, client: int, index: int) -> None:
        # Lock is idempotent for its holder and Unlock of a key not held is a no-op: after
        # an error the same write is simply tried again next time.
        sdk, lease_id = self._writers[client]
        key = f"isolation/k{client}"
        if self._held[client]:
            await asyncio.wait_for(sdk.unlock(key, lease_id), WRITE_DEADLINE_S)
        else:
            await asyncio.wait_for(sdk.lock(key, lease_id), WRITE_DEADLINE_S)
        self._held[client] = not self._held[client]

    async def close(self) -> None:
        writers, self._writers = self._writers, []
        for sdk, _lease in writers:
            with contextlib.suppress(*ERRORS):
                await asyncio.wait_for(sdk.close(), WRITE_DEADLINE_S)


@dataclass(frozen=True)
class EtcdPort:
    """What `EtcdBenchClient` needs of a member."""

    client_port: int


class EtcdWriters:
    """etcd's coordination writers: one keep-alive connection each to the leader's JSON
    gateway (etcd's best case: no forwarding), each putting its own key."""

    def __init__(self, client_port: int, clients: int) -> None:
        member: Any = EtcdPort(client_port)
        self._member = member
        self._writers = [EtcdBenchClient(self._member, k) for k in range(clients)]

    async def open(self) -> None:
        for k in range(len(self._writers)):
            await self.write(k, 0)

    async def write(self, client: int, index: int) -> None:
        try:
            await asyncio.wait_for(
                self._writers[client].put(f"isolation/k{client}", str(index)), WRITE_DEADLINE_S
            )
        except BaseException:
            # A timed-out request leaves its connection mid-answer: start a new one.
            await self._writers[client].close()
            self._writers[client] = EtcdBenchClient(self._member, client)
            raise

    async def close(self) -> None:
        writers, self._writers = self._writers, []
        for writer in writers:
            with contextlib.suppress(*ERRORS):
                await writer.close()


Writers = RaftwalWriters | EtcdWriters


@dataclass(frozen=True)
class WriterSpec:
    """How a writer process reaches its system (picklable: it crosses a spawn)."""

    kind: str  # "raftwal" or "etcd"
    clients: int
    endpoints: tuple[str, ...] = ()
    etcd_port: int = 0

    def writers(self) -> Writers:
        if self.kind == "raftwal":
            return RaftwalWriters(list(self.endpoints), self.clients)
        return EtcdWriters(self.etcd_port, self.clients)


@dataclass
class PhaseWrites:
    """What a phase's coordination writes gave: latencies of those sent in its counted
    window, errors by name, and the CPU seconds the writers took over that window."""

    latencies_s: list[float]
    errors: dict[str, int]
    cpu_s: float | None


async def timed_writes(
    writers: Writers, rate: float, clients: int, warmup_s: float, phase_s: float
) -> PhaseWrites:
    """`rate` writes/s over `clients` paced writers (stability.py's `paced`) for
    `warmup_s`, not counted, then `phase_s`."""
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    window = time.perf_counter() + warmup_s
    cpu_at_window = math.nan

    async def one(client: int, index: int) -> None:
        nonlocal cpu_at_window
        sent = time.perf_counter()
        if sent >= window and math.isnan(cpu_at_window):
            cpu_at_window = own_cpu_seconds()
        try:
            await writers.write(client, index)
        except ERRORS as error:
            if sent >= window:
                errors[error_name(error)] += 1
        else:
            if sent >= window:
                latencies.append(time.perf_counter() - sent)

    await paced(rate, clients, warmup_s + phase_s, one)
    cpu = own_cpu_seconds() - cpu_at_window
    return PhaseWrites(latencies, dict(errors), None if math.isnan(cpu) else cpu)


def _writer_process_main(connection: Any, spec: WriterSpec) -> None:
    """A writer process: the coordination writers in an interpreter of their own, so that
    the WAL's load generator (this bench's event loop and GIL) adds nothing to their
    latencies; an application taking locks runs apart from one that produces."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_writes(connection, spec))


async def _serve_writes(connection: Any, spec: WriterSpec) -> None:
    writers = spec.writers()
    try:
        try:
            await writers.open()
        except Exception as error:  # noqa: BLE001 (reported to the bench, which stops)
            connection.send(("error", f"{type(error).__name__}: {error}"))
            return
        connection.send(("ready",))
        while True:
            try:
                # The bench gone (its end of the pipe closed) ends this process.
                message = await asyncio.to_thread(connection.recv)
            except (EOFError, OSError):
                return
            if message[0] != "phase":
                return
            _, rate, clients, warmup_s, phase_s = message
            try:
                result = await asyncio.wait_for(
                    timed_writes(writers, rate, clients, warmup_s, phase_s),
                    warmup_s + phase_s + PHASE_GRACE_S,
                )
            except Exception as error:  # noqa: BLE001 (reported to the bench, which stops)
                connection.send(("error", f"{type(error).__name__}: {error}"))
                return
            connection.send(("result", result.latencies_s, result.errors, result.cpu_s))
    finally:
        await writers.close()


class WriterProcess:
    """The bench's end of a writer process (`_writer_process_main`)."""

    def __init__(self, spec: WriterSpec) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, self._child_end = context.Pipe()
        # Daemonic: stopped with the bench at its exit; if the bench is killed, the pipe's
        # EOF ends it.
        self._process = context.Process(
            target=_writer_process_main,
            args=(self._child_end, spec),
            daemon=True,
            name="coord-writers",
        )

    @property
    def pid(self) -> int | None:
        return self._process.pid

    async def _receive(self, timeout_s: float) -> tuple[Any, ...]:
        ready = await asyncio.to_thread(self._connection.poll, timeout_s)
        if not ready:
            raise RuntimeError(f"the coordination writers' process said nothing in {timeout_s:g} s")
        try:
            message = self._connection.recv()
        except (EOFError, OSError) as error:
            raise RuntimeError(
                f"the coordination writers' process ended (exit code {self._process.exitcode})"
            ) from error
        if message[0] == "error":
            raise RuntimeError(f"coordination writers: {message[1]}")
        return tuple(message)

    async def start(self) -> None:
        self._process.start()
        self._child_end.close()
        await self._receive(START_TIMEOUT_S)

    async def phase(
        self, rate: float, clients: int, warmup_s: float, phase_s: float
    ) -> PhaseWrites:
        self._connection.send(("phase", rate, clients, warmup_s, phase_s))
        _, latencies, errors, cpu = await self._receive(warmup_s + phase_s + PHASE_GRACE_S + 5)
        return PhaseWrites(latencies, errors, cpu)

    async def stop(self) -> None:
        if self._process.pid is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._connection.send(("stop",))
        await asyncio.to_thread(self._process.join, WRITE_DEADLINE_S + 5)
        if self._process.is_alive():
            self._process.kill()
            await asyncio.to_thread(self._process.join, 5)
        self._connection.close()


async def open_writers(
    inline: Writers, spec: WriterSpec, settings: Settings
) -> WriterProcess | None:
    """Start a system's coordination writers: in a process of their own (`--coord-writers
    process`, the default), or `inline` in this bench's event loop (`inline`: their
    latencies then include the WAL load generator's)."""
    if settings.coord_writers == "inline":
        await inline.open()
        return None
    process = WriterProcess(spec)
    try:
        await process.start()
    except BaseException:
        await process.stop()
        raise
    return process


class Stack(Protocol):
    name: str
    label: str
    coordination: bool
    wal: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def processes(self) -> dict[str, int]:
        """label -> pid of every server process now."""

    async def observe(self) -> dict[str, Any]:
        """What the system says of itself now (leaders, terms, warnings) for the report."""

    #: the coordination writers in the bench's loop (`--coord-writers inline`)
    writers: Writers | None
    #: the coordination writers' own process (`--coord-writers process`)
    writer_process: WriterProcess | None

    async def wal_senders(self, settings: Settings) -> list[WalSender]: ...

    async def close_senders(self, senders: list[WalSender]) -> None: ...


# -- raftwal --------------------------------------------------------------------------------


class RaftwalStack:
    name = "raftwal"
    label = "raftwal"
    coordination = True
    wal = True

    def __init__(self, directory: Path, settings: Settings) -> None:
        self._directory = directory
        self._settings = settings
        self.cluster: dev.LocalCluster | None = None
        run = uuid.uuid4().hex[:6]
        self.pchannels = [f"iso_{run}_{k}" for k in range(settings.pchannels)]
        self.vchannels = [f"{p}_v0" for p in self.pchannels]
        self._payload = os.urandom(MESSAGE_BYTES)
        self._status: CoordinatorClient | None = None
        self.writers: Writers | None = None
        self.writer_process: WriterProcess | None = None
        #: pid -> "control", "worker 0", ... from MemberStatus.processes
        self._kinds: dict[int, str] = {}
        #: every node process seen during the run (pid -> its start time): none may
        #: outlive `stop`
        self.seen: dict[int, int] = {}
        self._streaming: StreamingClient | None = None
        self._sdk_producers: list[Producer] = []
        self.leftovers: list[int] = []
        self.writers_endpoints: list[str] = []
        #: the node the coordination writers call (the Raft leader when they started)
        self.writers_node = ""
        self._abort = threading.Event()
        self._starting: concurrent.futures.Future[dev.LocalCluster] | None = None

    @property
    def _cluster(self) -> dev.LocalCluster:
        assert self.cluster is not None, "raftwal is not started"
        return self.cluster

    async def start(self) -> None:
        config = dev.make_config(self._directory, 3)
        # Pinned, not inherited from the default: JetStream runs with sync_interval always.
        config = dataclasses.replace(config, wal_fsync_policy="always")

        def progress(step: str) -> None:
            # Only while it waits for the nodes: by then dev.up has recorded them in the
            # dev dir, where `stop` finds them (dev.down).
            if self._abort.is_set() and step.startswith("waiting"):
                raise StartAborted("the run was stopped while the cluster started")

        # A thread of its own, not asyncio's executor: an interrupted start must not keep
        # the interpreter from exiting until dev.up's timeout.
        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dev-up")
        self._starting = executor.submit(
            dev.up, self._directory, 3, START_TIMEOUT_S, None, config, on_progress=progress
        )
        executor.shutdown(wait=False)
        self.cluster = await asyncio.wrap_future(self._starting)
        self._remember_pids()
        endpoints = self._cluster.endpoints
        self._status = CoordinatorClient(endpoints, timeout_s=STATUS_TIMEOUT_S)
        with contextlib.suppress(AlreadyExistsError):
            await self._status.create_channels(names=self.pchannels, replica_count=3)
        for pchannel, vchannel in zip(self.pchannels, self.vchannels, strict=True):
            with contextlib.suppress(AlreadyExistsError):
                await self._status.create_vchannel(vchannel, pchannel)
        await wait_until(self._all_assigned, ASSIGN_TIMEOUT_S, 0.2)
        # The Raft leader first, as etcd's writers connect to its leader: the SDK sends a
        # write to its first endpoint that answers, and a follower forwards it to the
        # leader (one more hop, and that follower's CPU) without telling the client.
        leader = (await self._cluster_status()).leader_node_id
        self.writers_node = leader
        self.writers_endpoints = sorted(
            endpoints, key=lambda e: e != self._cluster.node(leader).grpc_address
        )
        self.writers = RaftwalWriters(self.writers_endpoints, self._settings.coord_clients)
        spec = WriterSpec(
            "raftwal", self._settings.coord_clients, endpoints=tuple(self.writers_endpoints)
        )
        self.writer_process = await open_writers(self.writers, spec, self._settings)
        # One batch on every pchannel: the data plane is served at all.
        senders = await self._batch_senders(len(self.pchannels), 1)
        try:
            for sender in senders:
                await asyncio.wait_for(await sender.send(), WRITE_DEADLINE_S)
        finally:
            await close_all_senders(senders)
        self._remember_pids()

    async def _cluster_status(self) -> api.ClusterStatusResponse:
        assert self._status is not None
        return await asyncio.wait_for(
            self._status.cluster_status(linearizable=False), STATUS_TIMEOUT_S
        )

    async def _all_assigned(self) -> str | None:
        try:
            status = await self._cluster_status()
        except ERRORS as error:
            return f"ClusterStatus: {error_name(error)}"
        for name in self.pchannels:
            channel = next((p for p in status.pchannels if p.name == name), None)
            if channel is None:
                return f"{name} not in the cluster status"
            if channel.state != pb.PCHANNEL_STATE_ASSIGNED:
                return f"{name} is {pb.PChannelState.Name(channel.state)}"
            if not serving_address(status.nodes, channel.owner_node_id, name):
                return f"{name}: no address for its owner {channel.owner_node_id}"
        return None

    async def _addresses(self) -> dict[str, str]:
        """pchannel -> the gRPC address of its owner's data worker for it."""
        status = await self._cluster_status()
        out = {}
        for channel in status.pchannels:
            if channel.name in self.pchannels:
                out[channel.name] = serving_address(
                    status.nodes, channel.owner_node_id, channel.name
                )
        return out

    def server_buckets(self) -> dict[str, dict[str, dict[float, float]]]:
        """node -> `scrape_buckets` of its metrics page (a node that does not answer is
        left out)."""
        out = {}
        for node in self._cluster.config.nodes:
            port = self._cluster.node(node.id).metrics_port
            if port:
                with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                    out[node.id] = scrape_buckets(port)
        return out

    def _remember_pids(self) -> None:
        for pid in self.processes().values():
            started = _start_time(pid)
            if started is not None:
                self.seen.setdefault(pid, started)

    def processes(self) -> dict[str, int]:
        if self.cluster is None:
            return {}
        out: dict[str, int] = {}
        for node in self.cluster.config.nodes:
            supervisor = self.cluster.pid(node.id)
            if supervisor is None:
                continue
            for position, pid in enumerate(dev.node_processes(supervisor)):
                if position == 0:
                    kind = "supervisor"
                else:
                    # Labelled by what the node said of it; by position (control first)
                    # for a process it has not reported yet.
                    kind = self._kinds.get(pid) or (
                        "control" if position == 1 else f"worker {position - 2}"
                    )
                out[f"{node.id} {kind}"] = pid
        return out

    async def observe(self) -> dict[str, Any]:
        try:
            status = await self._cluster_status()
        except ERRORS as error:
            return {"error": error_name(error)}
        workers: dict[str, list[str]] = {}
        restarts: dict[str, int] = {}
        for member in status.members:
            for process in member.processes:
                kind = process.kind if process.kind != "worker" else f"worker {process.index}"
                self._kinds[int(process.pid)] = kind
                if process.kind == "worker":
                    label = f"{member.node_id} {kind}"
                    workers[label] = list(process.owned_pchannels)
                    if process.restarts:
                        restarts[label] = int(process.restarts)
        self._remember_pids()
        channels = {p.name: p for p in status.pchannels if p.name in self.pchannels}
        return {
            "leader": status.leader_node_id,
            "raft_terms": {m.node_id: int(m.raft_term) for m in status.members},
            "wal_owners": {
                name: f"{channel.owner_node_id} (term {channel.term})"
                for name, channel in channels.items()
            },
            "worker_pchannels": workers,
            "worker_restarts": restarts,
            "warnings": list(status.warnings),
        }

    async def _batch_senders(self, count: int, batch: int) -> list[WalSender]:
        addresses = await self._addresses()
        senders: list[WalSender] = []
        try:
            for k in range(count):
                pchannel = self.pchannels[k % len(self.pchannels)]
                producer = await RaftwalProducer.open(
                    addresses[pchannel],
                    pchannel,
                    self.vchannels[k % len(self.vchannels)],
                    self._payload,
                    batch,
                    True,
                )
                senders.append(RaftwalBatchSender(producer))
        except BaseException:
            await close_all_senders(senders)
            raise
        return senders

    async def measure_max(self, settings: Settings) -> LoadResult:
        senders = await self._batch_senders(settings.producers, settings.batch)
        producers = [s._producer for s in senders if isinstance(s, RaftwalBatchSender)]
        try:
            return await pipelined_load(
                list(producers),
                settings.in_flight,
                settings.max_warmup_s,
                settings.max_s,
                self.processes(),
            )
        finally:
            await close_all(list(producers))

    async def wal_senders(self, settings: Settings) -> list[WalSender]:
        if settings.wal_client == "batch":
            return await self._batch_senders(settings.producers, settings.batch)
        self._streaming = StreamingClient(self._cluster.endpoints)
        senders: list[WalSender] = []
        for k in range(settings.producers):
            producer = Producer(self._streaming, retry_timeout_s=WRITE_DEADLINE_S)
            self._sdk_producers.append(producer)
            vchannel = self.vchannels[k % len(self.vchannels)]
            senders.append(SdkSender(producer, vchannel, self._payload, settings.batch))
        # One message through each: the routing table is filled before the schedule starts.
        for sender in senders:
            assert isinstance(sender, SdkSender)
            await asyncio.wait_for(
                sender._producer.send(sender._vchannel, sender._payload), WRITE_DEADLINE_S
            )
        return senders

    async def close_senders(self, senders: list[WalSender]) -> None:
        await close_all_senders(senders)
        producers, self._sdk_producers = self._sdk_producers, []
        for producer in producers:
            with contextlib.suppress(*ERRORS):
                await producer.close(timeout_s=WRITE_DEADLINE_S)
        if self._streaming is not None:
            streaming, self._streaming = self._streaming, None
            with contextlib.suppress(*ERRORS):
                await asyncio.wait_for(streaming.close(), WRITE_DEADLINE_S)

    async def stop(self) -> None:
        if self.writer_process is not None:
            await self.writer_process.stop()
            self.writer_process = None
        if self.writers is not None:
            await self.writers.close()
        if self._status is not None:
            with contextlib.suppress(*ERRORS):
                await asyncio.wait_for(self._status.close(), WRITE_DEADLINE_S)
            self._status = None
        self._abort.set()
        starting = self._starting
        if starting is not None:
            await asyncio.to_thread(concurrent.futures.wait, [starting], START_STOP_WAIT_S)
            if self.cluster is None and starting.done() and starting.exception() is None:
                self.cluster = starting.result()  # it started just as the run was stopped
        if self.cluster is not None:
            self._remember_pids()
            await asyncio.to_thread(self.cluster.stop_all)
        elif (self._directory / dev.CLUSTER_FILE).exists():
            # Interrupted inside dev.up: its nodes are recorded in the dev dir.
            await asyncio.to_thread(dev.down, self._directory)
        self.leftovers = await asyncio.to_thread(reap, dict(self.seen))


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    # After the command name: state is field 3, starttime field 22 (1-based).
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _alive(pid: int, started: int) -> bool:
    """Whether the process `pid` that started at `started` still runs: a zombie (exited,
    not yet reaped) holds no port or file, and a pid reused by another process is not it."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == started


class StartAborted(Exception):
    """Raised inside dev.up's wait for the nodes when the run is being stopped."""


def reap(seen: dict[int, int]) -> list[int]:
    """Wait up to LEFTOVER_WAIT_S for every process in `seen` (pid -> start time; node
    processes of this run) to be gone, then SIGKILL any left, by its pid; returns those."""
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while time.monotonic() < deadline and any(_alive(p, t) for p, t in seen.items()):
        time.sleep(0.1)
    left = [pid for pid, started in seen.items() if _alive(pid, started)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


async def close_all_senders(senders: list[WalSender]) -> None:
    for sender in senders:
        with contextlib.suppress(*ERRORS):
            await sender.close()


# -- etcd + JetStream -------------------------------------------------------------------------


class AnchorStack:
    name = "anchor"

    def __init__(
        self,
        directory: Path,
        etcd_binary: str | None,
        nats: tuple[str, tuple[int, ...]] | None,
        settings: Settings,
    ) -> None:
        self._settings = settings
        self.etcd = EtcdSystem(directory / "etcd", etcd_binary) if etcd_binary else None
        payloads = {"small": os.urandom(MESSAGE_BYTES), "large": os.urandom(10 * 1024)}
        self._payload = payloads["small"]
        self.nats = NatsWal(directory / "nats", nats[0], nats[1], True, payloads) if nats else None
        self.coordination = self.etcd is not None
        self.wal = self.nats is not None
        parts = []
        if self.etcd is not None:
            parts.append("etcd")
        if self.nats is not None:
            parts.append("JetStream")
        self.label = " + ".join(parts)
        self.writers: Writers | None = None
        self.writer_process: WriterProcess | None = None
        self._etcd_leader = ""

    async def start(self) -> None:
        if self.etcd is not None:
            await self.etcd.start()
            self._etcd_leader = await self.etcd.leader()
            port = self.etcd.member(self._etcd_leader).client_port
            self.writers = EtcdWriters(port, self._settings.coord_clients)
            spec = WriterSpec("etcd", self._settings.coord_clients, etcd_port=port)
            self.writer_process = await open_writers(self.writers, spec, self._settings)
        if self.nats is not None:
            await self.nats.start()

    async def stop(self) -> None:
        if self.writer_process is not None:
            await self.writer_process.stop()
            self.writer_process = None
        if self.writers is not None:
            await self.writers.close()
        try:
            if self.nats is not None:
                await self.nats.stop()
        finally:
            if self.etcd is not None:
                await self.etcd.stop()

    def processes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.etcd is not None:
            out.update({f"etcd {name}": pid for name, pid in self.etcd.pids().items()})
        if self.nats is not None:
            out.update({f"nats {name}": pid for name, pid in self.nats.pids().items()})
        return out

    async def observe(self) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        if self.etcd is not None:
            seen["etcd_writes_to"] = self._etcd_leader
            try:
                seen["etcd_leader"] = await asyncio.wait_for(self.etcd.leader(), STATUS_TIMEOUT_S)
            except (*ERRORS, AssertionError) as error:
                seen["etcd_leader"] = error_name(error)
        if self.nats is not None:
            try:
                leader = await asyncio.wait_for(self.nats._leader("small"), STATUS_TIMEOUT_S)
                seen["stream_leader"] = leader.name
            except ERRORS as error:
                seen["stream_leader"] = error_name(error)
        return seen

    async def wal_senders(self, settings: Settings) -> list[WalSender]:
        assert self.nats is not None
        leader = await asyncio.wait_for(self.nats._leader("small"), STATUS_TIMEOUT_S)
        subject = self.nats._subjects["small"]
        senders: list[WalSender] = []
        try:
            for _ in range(settings.producers):
                sender = JetStreamSender(
                    await nats_connect([leader.url]), subject, self._payload, settings.batch
                )
                senders.append(sender)
                await sender.open()
        except BaseException:
            await close_all_senders(senders)
            raise
        return senders

    async def close_senders(self, senders: list[WalSender]) -> None:
        await close_all_senders(senders)


# -- phases -----------------------------------------------------------------------------------


@dataclass
class Settings:
    phase_s: float
    warmup_s: float
    max_s: float
    max_warmup_s: float
    fractions: tuple[float, ...]
    max_rate: float | None
    coord_writes_per_s: float
    coord_clients: int
    producers: int
    batch: int
    in_flight: int
    pchannels: int
    wal_client: str
    coord_writers: str = "process"

    def phase_name(self, fraction: float) -> str:
        return f"wal{round(fraction * 100)}"


async def run_phase(stack: Stack, rate: float, settings: Settings) -> dict[str, Any]:
    """One phase on `stack`: its coordination writes, and the WAL at `rate` (0: none), for
    `settings.warmup_s` not counted, then `settings.phase_s` counted."""
    before = await stack.observe()
    senders = await stack.wal_senders(settings) if rate > 0 and stack.wal else []
    coord = CoordStats()
    wal = WalStats(rate) if senders else None
    notes: list[str] = []
    processes: dict[str, int] = {}
    cpu_before: dict[str, float] = {}
    own_before = math.nan
    began = time.perf_counter()
    window = began + settings.warmup_s

    scrape = getattr(stack, "server_buckets", None)
    buckets_before: dict[str, dict[str, dict[float, float]]] = {}

    async def cpu_at_window() -> None:
        nonlocal own_before
        await asyncio.sleep(max(0.0, window - time.perf_counter()))
        if scrape is not None:
            buckets_before.update(await asyncio.to_thread(scrape))
        processes.update(stack.processes())
        cpu_before.update({label: cpu_seconds(pid) for label, pid in processes.items()})
        own_before = own_cpu_seconds()

    writes: list[PhaseWrites] = []

    async def coordination() -> None:
        args = (
            settings.coord_writes_per_s,
            settings.coord_clients,
            settings.warmup_s,
            settings.phase_s,
        )
        if stack.writer_process is not None:
            writes.append(await stack.writer_process.phase(*args))
        else:
            assert stack.writers is not None
            writes.append(await timed_writes(stack.writers, *args))

    total_s = settings.warmup_s + settings.phase_s
    try:
        work: list[Awaitable[None]] = [cpu_at_window()]
        if stack.coordination:
            work.append(coordination())
        if wal is not None:
            work.append(paced_wal(senders, wal, settings.warmup_s, settings.phase_s))
        try:
            await asyncio.wait_for(asyncio.gather(*work), total_s + PHASE_GRACE_S)
        except TimeoutError:
            notes.append(f"the phase had not ended {PHASE_GRACE_S:.0f} s after its schedule")
        wall_s = time.perf_counter() - window
        own_s = own_cpu_seconds() - own_before
        writers_cpu_s = None
        for done in writes:
            coord.latencies_s.extend(done.latencies_s)
            coord.errors.update(done.errors)
            if stack.writer_process is not None:
                writers_cpu_s = done.cpu_s
        now = stack.processes()
        cpu_s: dict[str, float | None] = {}
        for label, pid in processes.items():
            if now.get(label) != pid:
                notes.append(f"{label} (pid {pid}) ended during the phase")
            cpu_s[label] = _round(cpu_seconds(pid) - cpu_before[label])
        for label, pid in now.items():
            if label not in processes:
                notes.append(f"{label} (pid {pid}) started during the phase")
    finally:
        await stack.close_senders(senders)
    server: dict[str, Any] = {}
    if scrape is not None:
        # What the nodes measured of themselves over the phase (bucket bounds, not exact):
        # the writers' proposals where they were received, every journal fsync.
        buckets_after = await asyncio.to_thread(scrape)
        writers_node = getattr(stack, "writers_node", "")
        for node_id, now in sorted(buckets_after.items()):
            then = buckets_before.get(node_id, {})
            if node_id == writers_node and "proposal" in now:
                server["proposal"] = {
                    "node": node_id,
                    **bucket_summary(then.get("proposal", {}), now["proposal"]),
                }
            if "journal_fsync" in now:
                server.setdefault("journal_fsync", {})[node_id] = bucket_summary(
                    then.get("journal_fsync", {}), now["journal_fsync"]
                )
    after = await stack.observe()
    servers = sum(v for v in cpu_s.values() if v is not None)
    return {
        "wall_s": _round(wall_s),
        "coordination": coord.summary(settings.phase_s) if stack.coordination else None,
        "wal": wal.summary() if wal is not None else None,
        "cpu_s": cpu_s,
        "servers_cpu_s": _round(servers),
        "client_cpu_s": _round(own_s),
        # The coordination writers' process (`--coord-writers process`), apart.
        "writers_cpu_s": _round(writers_cpu_s) if writers_cpu_s is not None else None,
        "server": server or None,
        "before": before,
        "after": after,
        "notes": notes,
    }


def _progress(stack: Stack, phase: str, result: dict[str, Any]) -> None:
    parts = [f"{stack.label} {phase}:"]
    coord = result["coordination"]
    if coord:
        parts.append(
            f"coordination {coord['writes']} ok / {coord['failed']} failed, p50 "
            f"{coord['p50_ms']} p99 {coord['p99_ms']} ms;"
        )
    wal = result["wal"]
    if wal:
        parts.append(
            f"WAL {wal['reached_msgs_per_s']:,.0f} of {wal['asked_msgs_per_s']:,.0f} msgs/s, "
            f"p50 {wal['p50_ms']} p99 {wal['p99_ms']} ms, {wal['failed']} failed;"
        )
    parts.append(f"servers {result['servers_cpu_s']} CPU s, client {result['client_cpu_s']}")
    if result.get("writers_cpu_s") is not None:
        parts.append(f"(writers {result['writers_cpu_s']})")
    say(" ".join(parts))
    server = result.get("server") or {}
    if server.get("proposal"):
        proposal = server["proposal"]
        fsyncs = ", ".join(
            f"{node} {v['p50_le_ms']}/{v['p99_le_ms']}"
            for node, v in (server.get("journal_fsync") or {}).items()
        )
        say(
            f"  {stack.label} itself: proposals on {proposal['node']} p50/p99 <= "
            f"{proposal['p50_le_ms']}/{proposal['p99_le_ms']} ms; journal fsync p50/p99 <= "
            f"{fsyncs} ms"
        )
    for note in result["notes"]:
        say(f"  note: {note}")
    coord_errors = coord["errors"] if coord else {}
    wal_errors = wal["errors"] if wal else {}
    if coord_errors or wal_errors:
        say(f"  errors: coordination {coord_errors}, WAL {wal_errors}")


async def run_once(
    number: int,
    root: Path,
    settings: Settings,
    etcd_binary: str | None,
    nats: tuple[str, tuple[int, ...]] | None,
    result: dict[str, Any],
) -> None:
    """One run: raftwal's idle, max and WAL phases, then the anchor's, on fresh clusters;
    fills `result` as it goes (what a failed run measured stays in it)."""
    result["phases"] = {}
    phases: dict[str, dict[str, Any]] = result["phases"]
    raftwal = RaftwalStack(root / f"run{number}" / "raftwal", settings)
    say(f"run {number}: starting raftwal")
    try:
        await raftwal.start()
        phases["idle"] = {"raftwal": await run_phase(raftwal, 0, settings)}
        _progress(raftwal, "idle", phases["idle"]["raftwal"])
        await asyncio.sleep(SETTLE_S)
        if settings.max_rate is not None:
            peak = settings.max_rate
            result["max"] = {"msgs_per_s": peak, "given": True}
        else:
            load = await raftwal.measure_max(settings)
            peak = load.msgs_per_s
            result["max"] = {
                "msgs_per_s": _round(peak, 1),
                "given": False,
                "servers_cpu_cores": _round(load.servers_cpu_s / load.duration_s),
                "client_cpu_cores": _round(load.client_cpu_s / load.duration_s),
                "batch_p99_ms": _round(load.latencies.p99_ms),
                "errors": dict(load.latencies.errors),
            }
            say(
                f"raftwal max: {peak:,.0f} msgs/s ({settings.producers} producers, batches of "
                f"{settings.batch}, {settings.in_flight} in flight), servers "
                f"{result['max']['servers_cpu_cores']} cores, errors {result['max']['errors']}"
            )
            await asyncio.sleep(SETTLE_S)
        if not peak > 0:
            raise RuntimeError(
                f"raftwal acknowledged no batch inside its max phase's {settings.max_s:g} s "
                "window (try a longer --max-s, or --max-rate)"
            )
        result["rates"] = {settings.phase_name(f): _round(f * peak, 1) for f in settings.fractions}
        for fraction in settings.fractions:
            name = settings.phase_name(fraction)
            phases[name] = {"raftwal": await run_phase(raftwal, fraction * peak, settings)}
            _progress(raftwal, name, phases[name]["raftwal"])
            await asyncio.sleep(SETTLE_S)
    finally:
        say(f"run {number}: stopping raftwal")
        await raftwal.stop()
        if raftwal.leftovers:
            say(f"  raftwal processes left after stop, killed by pid: {raftwal.leftovers}")
    result["raftwal_leftover_pids"] = raftwal.leftovers
    if etcd_binary is None and nats is None:
        return
    anchor = AnchorStack(root / f"run{number}" / "anchor", etcd_binary, nats, settings)
    say(f"run {number}: starting {anchor.label}")
    try:
        await anchor.start()
        if anchor.etcd is not None:
            result["etcd_version"] = anchor.etcd.version()
        if anchor.nats is not None:
            result["nats_version"] = anchor.nats.version()
        names = ["idle", *(settings.phase_name(f) for f in settings.fractions)]
        rates = [0.0, *(f * peak for f in settings.fractions)]
        for name, rate in zip(names, rates, strict=True):
            phases[name]["anchor"] = await run_phase(anchor, rate, settings)
            _progress(anchor, name, phases[name]["anchor"])
            await asyncio.sleep(SETTLE_S)
    finally:
        say(f"run {number}: stopping {anchor.label}")
        await anchor.stop()


# -- report -----------------------------------------------------------------------------------


def _get(phase: dict[str, Any] | None, stack: str, part: str, key: str) -> float | None:
    entry = (phase or {}).get(stack) or {}
    section = entry.get(part) if part else entry
    if not isinstance(section, dict):
        return None
    value = section.get(key)
    return value if isinstance(value, int | float) else None


def checks(result: dict[str, Any], settings: Settings) -> list[dict[str, Any]]:
    """Issue 48's Done-when on one run (or on the medians)."""
    phases = result["phases"]
    name = settings.phase_name(CHECK_FRACTION)
    loaded, idle = phases.get(name), phases.get("idle")
    values = {
        "coord_p50": (
            _get(loaded, "raftwal", "coordination", "p50_ms"),
            _get(idle, "raftwal", "coordination", "p50_ms"),
        ),
        "coord_p99_idle": (
            _get(loaded, "raftwal", "coordination", "p99_ms"),
            _get(idle, "raftwal", "coordination", "p99_ms"),
        ),
        "coord_p99_etcd": (
            _get(loaded, "raftwal", "coordination", "p99_ms"),
            _get(loaded, "anchor", "coordination", "p99_ms"),
        ),
        "wal_p99": (
            _get(loaded, "raftwal", "wal", "p99_ms"),
            _get(loaded, "anchor", "wal", "p99_ms"),
        ),
    }
    # A WAL that did not carry the phase's rate: the phase is not the load it is named for
    # (said beside every check), and raftwal's WAL check fails (not "at the same rate").
    behind = {
        stack: entry["wal"].get("kept_up") is False
        for stack, entry in (loaded or {}).items()
        if isinstance(entry.get("wal"), dict)
    }
    caveats = [
        f"{'raftwal' if stack == 'raftwal' else 'JetStream'}'s WAL fell behind the rate"
        for stack, late in behind.items()
        if late
    ]
    out = []
    for key, text, factor in CHECKS:
        value, reference = values[key]
        passed = None
        if value is not None and reference is not None:
            passed = value <= factor * reference
            if key == "wal_p99" and behind.get("raftwal"):
                passed = False
        out.append(
            {
                "check": key,
                "text": f"{text} (at {name})",
                "value_ms": value,
                "limit_ms": _round(factor * reference) if reference is not None else None,
                "passed": passed,
                "caveats": caveats,
            }
        )
    return out


#: What a phase reports that has no median: what the systems said of themselves, notes.
NOT_MERGED = frozenset({"before", "after", "notes", "errors"})


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every numeric figure of the phases, the median over the runs that have it."""

    def merge(values: list[Any]) -> Any:
        present = [v for v in values if v is not None]
        if not present:
            return None
        if all(isinstance(v, bool) for v in present):
            return sum(present) == len(present)
        if all(isinstance(v, int | float) for v in present):
            return _round(median([float(v) for v in present]), 2)
        if all(isinstance(v, dict) for v in present):
            keys = dict.fromkeys(k for v in present for k in v if k not in NOT_MERGED)
            return {k: merge([v.get(k) for v in present]) for k in keys}
        return None

    return {"phases": merge([run["phases"] for run in runs])}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) >= 1000:
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _triple(section: dict[str, Any] | None) -> str:
    if not section:
        return "-"
    return " / ".join(_fmt(section.get(k), 2) for k in ("p50_ms", "p99_ms", "max_ms"))


def render_phases(phases: dict[str, Any], anchor_label: str) -> str:
    lines = [f"| phase | figure | raftwal | {anchor_label} |", "|---|---|---:|---:|"]
    for name, phase in phases.items():
        raftwal = phase.get("raftwal") or {}
        anchor = phase.get("anchor") or {}
        asked = (raftwal.get("wal") or {}).get("asked_msgs_per_s")
        title = name if asked is None else f"{name} ({_fmt(asked)} msgs/s)"
        rows: list[tuple[str, str, str]] = []
        rc, ac = raftwal.get("coordination"), anchor.get("coordination")

        def writes(section: dict[str, Any] | None) -> str:
            if not section:
                return "-"
            return f"{_count(section.get('writes'))} ({_count(section.get('failed'))})"

        rows.append(("coordination writes ok (failed)", writes(rc), writes(ac)))
        rows.append(("coordination p50 / p99 / max ms", _triple(rc), _triple(ac)))
        rw, aw = raftwal.get("wal"), anchor.get("wal")
        if rw or aw:

            def reached(section: dict[str, Any] | None) -> str:
                if not section:
                    return "-"
                text = _fmt(section.get("reached_msgs_per_s"))
                return text if section.get("kept_up") else f"{text} (behind)"

            rows.append(("WAL msgs/s reached", reached(rw), reached(aw)))
            rows.append(("WAL produce->ack p50 / p99 / max ms", _triple(rw), _triple(aw)))
            rows.append(
                (
                    "WAL messages failed",
                    _count((rw or {}).get("failed")),
                    _count((aw or {}).get("failed")),
                )
            )
        rows.append(
            (
                "servers' CPU s",
                _fmt(raftwal.get("servers_cpu_s"), 2),
                _fmt(anchor.get("servers_cpu_s"), 2),
            )
        )
        rows.append(
            (
                "bench client CPU s",
                _fmt(raftwal.get("client_cpu_s"), 2),
                _fmt(anchor.get("client_cpu_s"), 2),
            )
        )
        for k, (label, left, right) in enumerate(rows):
            lines.append(f"| {title if k == 0 else ''} | {label} | {left} | {right} |")
    return "\n".join(lines)


def render_cpu(phases: dict[str, Any]) -> str:
    names = list(phases)
    lines = [
        "| CPU s over the phase | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for stack in ("raftwal", "anchor"):
        labels = dict.fromkeys(
            label
            for phase in phases.values()
            for label in ((phase.get(stack) or {}).get("cpu_s") or {})
        )
        for label in labels:
            cells = [
                _fmt(((phases[n].get(stack) or {}).get("cpu_s") or {}).get(label), 2) for n in names
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if labels:
            total = [_fmt((phases[n].get(stack) or {}).get("servers_cpu_s"), 2) for n in names]
            client = [_fmt((phases[n].get(stack) or {}).get("client_cpu_s"), 2) for n in names]
            lines.append(f"| **{stack} servers** | " + " | ".join(total) + " |")
            lines.append(f"| bench client ({stack} phases) | " + " | ".join(client) + " |")
    return "\n".join(lines)


def render_checks(title: str, results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for check in results:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[check["passed"]]
        caveats = "; ".join(check.get("caveats") or [])
        lines.append(
            f"{title}: {verdict} {check['text']}: {_fmt(check['value_ms'], 2)} ms "
            f"(limit {_fmt(check['limit_ms'], 2)} ms)" + (f" [{caveats}]" if caveats else "")
        )
    return lines


def _roles(phases: dict[str, Any]) -> str:
    """Who led what at the start of the first phase."""
    first = next(iter(phases.values()), {})
    raftwal = (first.get("raftwal") or {}).get("before") or {}
    anchor = (first.get("anchor") or {}).get("before") or {}
    parts = []
    if raftwal.get("leader"):
        owners = ", ".join(f"{p}: {o}" for p, o in (raftwal.get("wal_owners") or {}).items())
        parts.append(f"raftwal Raft leader {raftwal['leader']}, WAL owner {owners}")
    if anchor.get("etcd_leader"):
        parts.append(f"etcd leader {anchor['etcd_leader']} (takes the writes)")
    if anchor.get("stream_leader"):
        parts.append(f"JetStream stream leader {anchor['stream_leader']}")
    return "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    out = [
        f"{report['date']}, {report['machine']['cpus']} CPUs, load average "
        f"{report['load_average_1m_at_start']} at the start, {report['load_average_1m_at_end']} "
        f"at the end; {report['settings']['phase_s']:.0f} s per phase; coordination "
        f"{report['settings']['coord_writes_per_s']:.0f} writes/s over "
        f"{report['settings']['coord_clients']} writers; WAL {MESSAGE_BYTES} B messages in "
        f"units of {report['settings']['batch']} over {report['settings']['producers']} "
        f"producers ({report['settings']['wal_client']} client), {report['settings']['pchannels']}"
        f" pchannel(s); raftwal {report['raftwal_commit']}, etcd "
        f"{report.get('etcd_version') or '-'}, nats-server {report.get('nats_version') or '-'}; "
        f"{report['data_workers_per_node']} data worker(s) per node at nice "
        f"{report['data_worker_nice']}"
    ]
    anchor_label = report["anchor_label"] or "anchor"
    for run in report["runs"]:
        peak = run.get("max", {})
        out.append(
            f"\n### run {run['run']}: raftwal max {_fmt(peak.get('msgs_per_s'))} msgs/s"
            + (" (given)" if peak.get("given") else "")
        )
        if run.get("error"):
            out.append(f"**this run failed**: {run['error']}")
        roles = _roles(run["phases"])
        if roles:
            out.append(roles)
            out.append("")
        out.append(render_phases(run["phases"], anchor_label))
        out.append("")
        out.append(render_cpu(run["phases"]))
        notes = [
            f"{name} {stack}: {note}"
            for name, phase in run["phases"].items()
            for stack, entry in phase.items()
            for note in entry.get("notes", [])
        ]
        for name, phase in run["phases"].items():
            for stack, entry in phase.items():
                for part in ("coordination", "wal"):
                    errors = (entry.get(part) or {}).get("errors")
                    if errors:
                        notes.append(f"{name} {stack} {part} errors: {errors}")
                after = entry.get("after") or {}
                if after.get("worker_restarts"):
                    notes.append(f"{name} {stack}: worker restarts {after['worker_restarts']}")
                if after.get("warnings"):
                    notes.append(f"{name} {stack}: warnings {after['warnings']}")
                terms = (entry.get("before") or {}).get("raft_terms"), after.get("raft_terms")
                if terms[0] and terms[1] and max(terms[1].values()) > max(terms[0].values()):
                    notes.append(
                        f"{name} {stack}: Raft term {max(terms[0].values())} -> "
                        f"{max(terms[1].values())} (leader {after.get('leader')})"
                    )
                owners = (entry.get("before") or {}).get("wal_owners"), after.get("wal_owners")
                if owners[0] and owners[1] and owners[0] != owners[1]:
                    notes.append(f"{name} {stack}: WAL owners {owners[0]} -> {owners[1]}")
        if run.get("raftwal_leftover_pids"):
            notes.append(f"raftwal processes left after stop: {run['raftwal_leftover_pids']}")
        if notes:
            out.append("")
            out.extend(f"- {note}" for note in notes)
    if len(report["runs"]) > 1:
        out.append(f"\n### medians of {len(report['runs'])} runs")
        out.append(render_phases(report["medians"]["phases"], anchor_label))
        out.append("")
        out.append(render_cpu(report["medians"]["phases"]))
    out.append("\n### Done-when (issue 48)")
    for run in report["runs"]:
        out.extend(render_checks(f"run {run['run']}", run["checks"]))
    if len(report["runs"]) > 1:
        out.extend(render_checks("medians", report["medians"]["checks"]))
    passing = sum(1 for run in report["runs"] if all(c["passed"] for c in run["checks"]))
    out.append(f"{passing} of {len(report['runs'])} runs pass every check")
    return "\n".join(out)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


async def run(
    args: argparse.Namespace,
    settings: Settings,
    root: Path,
    etcd_binary: str | None,
    nats: tuple[str, tuple[int, ...]] | None,
) -> dict[str, Any]:
    # SIGTERM ends the run as Ctrl-C does: the phases are cancelled, every cluster stopped.
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    started_at = datetime.datetime.now(datetime.UTC)
    load_at_start = round(os.getloadavg()[0], 2)
    runs = []
    for number in range(1, args.runs + 1):
        result: dict[str, Any] = {"run": number, "phases": {}}
        try:
            await run_once(number, root, settings, etcd_binary, nats, result)
        except RUN_ERRORS as error:
            # Its clusters are stopped; the next run starts afresh.
            result["error"] = f"{type(error).__name__}: {error}"
            say(f"run {number} failed: {result['error']}")
        result["checks"] = checks(result, settings)
        runs.append(result)
    anchor_parts = [p for p, on in (("etcd 3.4", etcd_binary), ("JetStream", nats)) if on]
    report: dict[str, Any] = {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "raftwal_commit": _commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "settings": dataclasses.asdict(settings),
        "data_workers_per_node": dev.dev_data_workers(),
        "data_worker_nice": int(
            os.environ.get("RAFTWAL_DATA_WORKER_NICE", ClusterConfig.data_worker_nice)
        ),
        "anchor_label": " + ".join(anchor_parts),
        "etcd_version": next((r["etcd_version"] for r in runs if "etcd_version" in r), None),
        "nats_version": next((r["nats_version"] for r in runs if "nats_version" in r), None),
        "runs": runs,
    }
    report["medians"] = medians([r for r in runs if not r.get("error")] or runs)
    report["medians"]["checks"] = checks(report["medians"], settings)
    return report


def _fractions(value: str) -> tuple[float, ...]:
    try:
        fractions = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        fractions = ()
    if (
        not fractions
        or any(not 0 < f <= 2 for f in fractions)
        or len(set(fractions)) != len(fractions)
    ):
        raise argparse.ArgumentTypeError(
            f"invalid --wal-fractions ({value!r}; expected distinct numbers in (0, 2], "
            "comma-separated, e.g. 0.5,0.9)"
        )
    return fractions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs on fresh clusters (1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: a few s per phase")
    parser.add_argument("--phase-s", type=float, help="seconds per phase (30; quick 4)")
    parser.add_argument(
        "--warmup-s", type=float, help="uncounted start of every phase (3; quick 1)"
    )
    parser.add_argument("--max-s", type=float, help="max phase's window (5; quick 3)")
    parser.add_argument(
        "--wal-fractions",
        type=_fractions,
        default=(0.5, 0.9),
        help="WAL phases, as fractions of raftwal's maximum (0.5,0.9)",
    )
    parser.add_argument(
        "--max-rate", type=float, help="take this as raftwal's maximum (msgs/s): no max phase"
    )
    parser.add_argument(
        "--coord-writes-per-s", type=float, default=50.0, help="coordination writes/s (50)"
    )
    parser.add_argument("--coord-clients", type=int, default=4, help="coordination writers (4)")
    parser.add_argument("--producers", type=int, default=8, help="WAL producers (8)")
    parser.add_argument(
        "--batch", type=int, default=100, help="100-byte messages per WAL unit (100)"
    )
    parser.add_argument(
        "--in-flight", type=int, default=8, help="max phase: batches in flight per producer (8)"
    )
    parser.add_argument("--pchannels", type=int, default=1, help="raftwal WAL pchannels (1)")
    parser.add_argument(
        "--wal-client",
        choices=("batch", "sdk"),
        default="batch",
        help="raftwal's WAL producers: wal.py's pre-encoded batches, or SDK Producers "
        "(default batch)",
    )
    parser.add_argument(
        "--coord-writers",
        choices=("process", "inline"),
        default="process",
        help="the coordination writers in a process of their own, or in the bench's event "
        "loop beside the WAL's load generator (default process)",
    )
    parser.add_argument("--skip-etcd", action="store_true", help="no etcd")
    parser.add_argument("--skip-nats", action="store_true", help="no JetStream")
    parser.add_argument("--nats-server", help="nats-server binary (default: newest installed)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--keep-dir", action="store_true", help="keep data dirs and logs (path on stderr)"
    )
    args = parser.parse_args(argv)
    for name, low, high in (
        ("runs", 1, 20),
        ("coord_clients", 1, 64),
        ("producers", 1, 64),
        ("batch", 1, 10_000),
        ("in_flight", 1, 256),
        ("pchannels", 1, 16),
    ):
        value = getattr(args, name)
        if not low <= value <= high:
            parser.error(f"invalid --{name.replace('_', '-')} ({value}; expected {low}..{high})")
    for name, low, high in (("phase_s", 1, 3600), ("warmup_s", 0, 600), ("max_s", 0.5, 600)):
        value = getattr(args, name)
        if value is not None and not low <= value <= high:
            parser.error(f"invalid --{name.replace('_', '-')} ({value}; expected {low}..{high})")
    if not 0 < args.coord_writes_per_s <= 1000:
        parser.error(
            f"invalid --coord-writes-per-s ({args.coord_writes_per_s}; expected 0..1000, above 0)"
        )
    if args.max_rate is not None and not 1 <= args.max_rate <= 10_000_000:
        parser.error(f"invalid --max-rate ({args.max_rate}; expected 1..10000000)")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        phase_s=args.phase_s or (4.0 if args.quick else 30.0),
        warmup_s=args.warmup_s if args.warmup_s is not None else (1.0 if args.quick else 3.0),
        max_s=args.max_s or (3.0 if args.quick else 5.0),
        max_warmup_s=1.0 if args.quick else 2.0,
        fractions=args.wal_fractions,
        max_rate=args.max_rate,
        coord_writes_per_s=args.coord_writes_per_s,
        coord_clients=args.coord_clients,
        producers=args.producers,
        batch=args.batch,
        in_flight=args.in_flight,
        pchannels=args.pchannels,
        wal_client=args.wal_client,
        coord_writers=args.coord_writers,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    etcd_binary = None
    if not args.skip_etcd:
        etcd_binary = shutil.which("etcd")
        if etcd_binary is None:
            say("etcd is not installed: run scripts/install-etcd.sh (or --skip-etcd)")
            return 2
    nats = None
    if not args.skip_nats:
        nats = find_nats_server(args.nats_server)
        if nats is None or nats[1] < NATS_SYNC_ALWAYS_MIN_VERSION:
            say(
                "no nats-server >= 2.10 (JetStream sync_interval always): run "
                "scripts/install-nats.sh (or --skip-nats)"
            )
            return 2
    root = Path(tempfile.mkdtemp(prefix="isolation-bench-"))
    say(f"data dirs and logs under {root}")
    try:
        report = asyncio.run(run(args, settings, root, etcd_binary, nats))
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("interrupted: every cluster was stopped")
        return 130
    finally:
        if not args.keep_dir:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
