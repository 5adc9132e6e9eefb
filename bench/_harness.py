"""Shared helpers for the benchmarks in bench/: statistics, bounded measurement loops, a
minimal keep-alive HTTP/1.1 client and process helpers.

Everything here is system-agnostic: a benchmark hands in an async callable per operation
and gets latencies, rates and error counts back. Every loop is bounded twice, by a count
and by a time budget, so a wedged system under test ends a run instead of hanging it.
Nothing here starts or stops a process it was not handed by pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# -- statistics ---------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile of `values` (0 <= fraction <= 1); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    weight = position - low
    return ordered[low] * (1 - weight) + ordered[high] * weight


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


@dataclass
class Latencies:
    """Latency samples of one measured phase, in seconds, with the errors seen."""

    samples_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0

    @property
    def p50_ms(self) -> float:
        return percentile(self.samples_s, 0.50) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(self.samples_s, 0.99) * 1000

    def summary(self) -> dict[str, object]:
        return {
            "count": len(self.samples_s),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "mean_ms": round(statistics.fmean(self.samples_s) * 1000, 3)
            if self.samples_s
            else math.nan,
            "elapsed_s": round(self.elapsed_s, 3),
            "errors": dict(self.errors),
        }


def error_name(error: BaseException) -> str:
    """A short, stable label for counting errors by kind."""
    code = getattr(error, "code", None)
    if callable(code):  # grpc.RpcError
        return f"{type(error).__name__}:{getattr(code(), 'name', code())}"
    status = getattr(error, "status", None)
    if isinstance(status, int):  # HttpError
        return f"{type(error).__name__}:{status}"
    return type(error).__name__


# -- measurement loops --------------------------------------------------------------------


class HttpError(Exception):
    """A non-2xx answer; `status` and the body's first bytes."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {body[:200]!r}")


Operation = Callable[[], Awaitable[object]]
ErrorTypes = tuple[type[BaseException], ...]
# What a failed operation may raise on the transport side; a benchmark adds its client's
# error types (grpc.RpcError...). The loops count these by kind and go on; anything else is
# a bug in the benchmark and ends the run loudly.
TRANSPORT_ERRORS: ErrorTypes = (
    OSError,
    TimeoutError,
    asyncio.IncompleteReadError,
    HttpError,
    json.JSONDecodeError,
)


async def sequential(
    operation: Operation, count: int, budget_s: float, errors: ErrorTypes
) -> Latencies:
    """Run `operation` one at a time, at most `count` times and for at most `budget_s`."""
    result = Latencies()
    started = time.perf_counter()
    deadline = started + budget_s
    for _ in range(count):
        if time.perf_counter() >= deadline:
            break
        begin = time.perf_counter()
        try:
            await operation()
        except errors as error:
            result.errors[error_name(error)] += 1
            continue
        result.samples_s.append(time.perf_counter() - begin)
    result.elapsed_s = time.perf_counter() - started
    return result


@dataclass
class Throughput:
    clients: int
    duration_s: float
    operations: int
    latencies: Latencies

    @property
    def per_s(self) -> float:
        return self.operations / self.duration_s if self.duration_s > 0 else math.nan

    def summary(self) -> dict[str, object]:
        return {
            "clients": self.clients,
            "duration_s": round(self.duration_s, 3),
            "operations": self.operations,
            "per_s": round(self.per_s, 1),
            "latency": self.latencies.summary(),
        }


async def closed_loop(
    workers: Sequence[Callable[[], Awaitable[int]]],
    duration_s: float,
    warmup_s: float,
    errors: ErrorTypes,
    max_operations_per_worker: int = 1_000_000,
) -> Throughput:
    """Closed-loop load: each worker calls its step back to back; a step returns how many
    operations it completed (a Lock+Unlock step returns 2). Only steps that end inside the
    measured window (after `warmup_s`, for `duration_s`) count; the latency of a step is
    split evenly over its operations."""
    latencies = Latencies()
    loop_start = time.perf_counter()
    window_start = loop_start + warmup_s
    window_end = window_start + duration_s
    operations = 0

    async def run(step: Callable[[], Awaitable[int]]) -> None:
        nonlocal operations
        for _ in range(max_operations_per_worker):
            begin = time.perf_counter()
            if begin >= window_end:
                return
            try:
                done = await step()
            except errors as error:
                if window_start <= time.perf_counter() <= window_end:
                    latencies.errors[error_name(error)] += 1
                # Do not spin on an instantly failing system.
                await asyncio.sleep(0.01)
                continue
            end = time.perf_counter()
            if window_start <= begin and end <= window_end:
                operations += done
                latencies.samples_s.extend([(end - begin) / done] * done)

    # A step that hangs past the window is cancelled: the window is what is measured.
    tasks = [asyncio.create_task(run(step)) for step in workers]
    _done, pending = await asyncio.wait(tasks, timeout=warmup_s + duration_s + 10.0)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    latencies.elapsed_s = duration_s
    return Throughput(len(workers), duration_s, operations, latencies)


@dataclass
class FirstSuccess:
    """Outcome of `first_success`: seconds from `t0` to the end of the first successful
    probe (None if none succeeded within the budget), with the errors of failed probes."""

    elapsed_s: float | None
    probes: int
    errors: Counter[str]


async def first_success(
    probe: Callable[[int], Awaitable[object]],
    t0: float,
    budget_s: float,
    interval_s: float,
    max_in_flight: int,
    errors: ErrorTypes,
) -> FirstSuccess:
    """Start `probe(k)` every `interval_s` (at most `max_in_flight` outstanding, each
    expected to bound itself with its own timeout) until one succeeds or `budget_s` after
    `t0` passed. Overlapping probes keep the resolution at `interval_s` even when an early
    probe hangs on a dead leader until its own timeout."""
    seen: Counter[str] = Counter()
    success = asyncio.Event()
    finished_at: list[float] = []
    in_flight: set[asyncio.Task[None]] = set()

    async def attempt(k: int) -> None:
        try:
            await probe(k)
        except errors as error:
            seen[error_name(error)] += 1
            return
        finished_at.append(time.perf_counter())
        success.set()

    deadline = t0 + budget_s
    probes = 0
    while not success.is_set() and time.perf_counter() < deadline:
        if len(in_flight) < max_in_flight:
            task = asyncio.create_task(attempt(probes))
            probes += 1
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(success.wait(), interval_s)
    for task in list(in_flight):
        task.cancel()
    for task in list(in_flight):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    elapsed = (min(finished_at) - t0) if finished_at else None
    return FirstSuccess(elapsed, probes, seen)


# -- a minimal HTTP/1.1 keep-alive client -------------------------------------------------


MAX_RESPONSE_BYTES = 4 * 1024 * 1024
MAX_HEADER_LINES = 100


class HttpConnection:
    """One persistent HTTP/1.1 connection, one request at a time (no pipelining).

    Just enough for JSON POSTs to a local server: Content-Length and chunked bodies,
    reconnect on the next request after an error. Not safe for concurrent use: a
    benchmark client owns one connection, as a keep-alive client would."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.busy = False

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._reader, self._writer = reader, writer
        return self._reader, self._writer

    async def post_json(self, path: str, body: object, timeout_s: float | None = None) -> object:
        """POST `body` as JSON and return the decoded JSON answer; raises HttpError,
        TimeoutError or OSError (the connection is dropped and reopened next time)."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        self.busy = True
        try:
            return await asyncio.wait_for(
                self._exchange(path, payload), self.timeout_s if timeout_s is None else timeout_s
            )
        except BaseException:
            await self.close()
            raise
        finally:
            self.busy = False

    async def _exchange(self, path: str, payload: bytes) -> object:
        reader, writer = await self._connect()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        writer.write(head + payload)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionResetError("server closed the connection")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ConnectionError(f"malformed status line {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        for _ in range(MAX_HEADER_LINES):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise ConnectionError(f"more than {MAX_HEADER_LINES} header lines")
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = await self._read_chunked(reader)
        else:
            length = int(headers.get(b"content-length", b"0"))
            if length > MAX_RESPONSE_BYTES:
                raise ConnectionError(f"response too large ({length} bytes)")
            body = await reader.readexactly(length)
        if headers.get(b"connection", b"").lower() == b"close":
            await self.close()
        if not 200 <= status < 300:
            raise HttpError(status, body)
        return json.loads(body) if body else {}

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int((await reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readline()  # the empty line after the last chunk (no trailers)
                return b"".join(chunks)
            total += size
            if total > MAX_RESPONSE_BYTES:
                raise ConnectionError(f"chunked response larger than {MAX_RESPONSE_BYTES}")
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


# -- processes ----------------------------------------------------------------------------


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: only the process we were handed."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def kill9(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


async def wait_until(
    check: Callable[[], Awaitable[str | None]], timeout_s: float, interval_s: float = 0.1
) -> None:
    """Poll `check` (None = ready, else a reason) until ready; TimeoutError with the last
    reason after `timeout_s`."""
    deadline = time.perf_counter() + timeout_s
    reason = "not checked yet"
    while time.perf_counter() < deadline:
        reason = await check() or ""
        if not reason:
            return
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"not ready after {timeout_s:.0f} s: {reason}")


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all threads) from /proc; NaN if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    # After the command name: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid` and every process under it (a raftwal node is a
    supervisor whose control process and data workers do the work; `dev.node_processes`
    finds them); NaN if `pid` is gone. Compare two readings of a tree whose processes
    lived through the window."""
    from raftwal.cli.dev import node_processes

    if math.isnan(cpu_seconds(pid)):
        return math.nan
    # A child that ended between the scan and its reading counts for nothing.
    return sum(
        seconds for child in node_processes(pid) if not math.isnan(seconds := cpu_seconds(child))
    )


def own_cpu_seconds() -> float:
    """CPU seconds of this process (all threads)."""
    return time.process_time()
