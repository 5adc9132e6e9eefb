"""One RaftPeer in its own process, driven over a JSON line protocol on stdin/stdout.

Lives here: the process the raft cluster tests and `bench/raft_commit.py` start. The
application is a deliberately trivial hash chain: `apply` appends the command to a list,
folds it into a running sha256 and returns that digest (32 bytes) followed by the raft
index (8 bytes, big endian); the snapshot is the list, length-prefixed. Any two peers that
applied the same commands in the same order report the same (count, digest).

Protocol: one JSON object per line on stdin, `{"id": n, "op": ..., ...}`; one answer per
line on stdout, `{"id": n, "ok": true, ...}` or `{"id": n, "ok": false, "error": ClassName,
"message": ..., "leader": ...}`. Ops: status, propose {data, timeout_s}, propose_stream
{prefix, count, concurrency, timeout_s, snapshot_after}, digest, items, snapshot, bench
{count, concurrency, size, timeout_s}. propose_stream also prints `{"id": n, "ack": payload,
"index": i}` for each acknowledged proposal the moment its future resolves (on the raft tick
thread, before that thread does anything else), so a test that kills the process still
knows exactly what was acknowledged. EOF on stdin closes the peer and exits 0. Logs go to
stderr.

Must never: print anything but protocol lines on stdout, or run without bounds (every op
has a timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The repository root, so `import raft` works when this file runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from raft import FatalPeerError, RaftError, RaftPeer, RaftTuning  # noqa: E402

logger = logging.getLogger("peer_main")

_U32 = struct.Struct(">I")
_STDOUT_LOCK = threading.Lock()


def emit(message: dict[str, Any]) -> None:
    line = json.dumps(message)
    with _STDOUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class HashChainApp:
    """The trivial replicated application (see module doc)."""

    def __init__(self, snapshot_delay_s: float = 0.0) -> None:
        self._lock = threading.Lock()
        self.items: list[bytes] = []
        self.digest = bytes(32)
        self.last_index = 0
        self._snapshot_delay_s = snapshot_delay_s

    def _fold(self, command: bytes) -> None:
        self.items.append(command)
        self.digest = hashlib.sha256(self.digest + _U32.pack(len(command)) + command).digest()

    def apply(self, command: bytes, raft_index: int) -> bytes:
        with self._lock:
            if raft_index <= self.last_index:
                raise AssertionError(
                    f"apply out of order: index {raft_index} after {self.last_index}"
                )
            self._fold(command)
            self.last_index = raft_index
            return self.digest + raft_index.to_bytes(8, "big")

    def take_snapshot(self) -> bytes:
        if self._snapshot_delay_s:
            time.sleep(self._snapshot_delay_s)
        with self._lock:
            parts = [struct.pack(">Q", self.last_index), self.digest]
            for item in self.items:
                parts.append(_U32.pack(len(item)))
                parts.append(item)
            return b"".join(parts)

    def restore_snapshot(self, data: bytes) -> None:
        (last_index,) = struct.unpack_from(">Q", data, 0)
        expected_digest = data[8:40]
        offset = 40
        with self._lock:
            self.items = []
            self.digest = bytes(32)
            while offset < len(data):
                (length,) = _U32.unpack_from(data, offset)
                offset += _U32.size
                self._fold(data[offset : offset + length])
                offset += length
            if self.digest != expected_digest:
                raise ValueError("snapshot digest does not match its items")
            self.last_index = last_index

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "count": len(self.items),
                "digest": self.digest.hex(),
                "last_index": self.last_index,
            }


def _error_answer(exc: BaseException) -> dict[str, Any]:
    return {
        "ok": False,
        "error": type(exc).__name__,
        "message": str(exc),
        "leader": getattr(exc, "leader_address", None),
    }


async def _propose_many(
    peer: RaftPeer, payloads: list[bytes], concurrency: int, timeout_s: float
) -> tuple[list[float], list[dict[str, Any]]]:
    """Propose every payload with `concurrency` workers; per-payload latency and outcome."""
    next_position = 0
    latencies: list[float] = [0.0] * len(payloads)
    outcomes: list[dict[str, Any]] = [{} for _ in payloads]

    async def worker() -> None:
        nonlocal next_position
        while next_position < len(payloads):
            position = next_position
            next_position += 1
            started = time.perf_counter()
            try:
                result = await peer.propose_async(payloads[position], timeout_s)
                outcomes[position] = {"ok": True, "index": int.from_bytes(result[32:], "big")}
            except RaftError as exc:
                outcomes[position] = _error_answer(exc)
            latencies[position] = time.perf_counter() - started

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return latencies, outcomes


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    position = min(len(sorted_values) - 1, int(round(fraction * (len(sorted_values) - 1))))
    return sorted_values[position]


def _propose_stream(peer: RaftPeer, request: dict[str, Any]) -> dict[str, Any]:
    prefix = str(request["prefix"])
    count = int(request["count"])
    timeout_s = float(request.get("timeout_s", 5.0))
    snapshot_after = int(request.get("snapshot_after", 0))
    concurrency = max(1, int(request.get("concurrency", 16)))
    slots = threading.BoundedSemaphore(concurrency)
    lock = threading.Lock()
    acked = 0
    failures: list[dict[str, Any]] = []

    def on_done(payload: str, future: Any) -> None:
        nonlocal acked
        try:
            exception = future.exception()
            if exception is None:
                index = int.from_bytes(future.result()[32:], "big")
                emit({"id": request.get("id"), "ack": payload, "index": index})
                with lock:
                    acked += 1
                    take_snapshot = acked == snapshot_after
                if take_snapshot:
                    peer.request_snapshot()
            else:
                with lock:
                    failures.append({"payload": payload, **_error_answer(exception)})
        finally:
            slots.release()

    for n in range(count):
        payload = f"{prefix}{n}"
        if not slots.acquire(timeout=timeout_s + 5.0):
            raise TimeoutError("no proposal slot freed in time")
        future = peer.propose(payload.encode(), timeout_s)
        future.add_done_callback(lambda done, payload=payload: on_done(payload, done))
    # Every callback releases its slot after it counted its outcome: holding all slots
    # means every outcome is in.
    for _ in range(concurrency):
        if not slots.acquire(timeout=timeout_s + 5.0):
            raise TimeoutError("a proposal outcome did not arrive in time")
    with lock:
        return {"ok": True, "acked": acked, "failures": failures}


def handle(peer: RaftPeer, app: HashChainApp, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "status":
        return {"ok": True, "status": peer.status(), "app": app.summary(), "pid": os.getpid()}
    if op == "digest":
        return {"ok": True, **app.summary()}
    if op == "items":
        with app._lock:
            items = [item.decode("utf-8", "replace") for item in app.items]
        return {"ok": True, "items": items}
    if op == "snapshot":
        peer.request_snapshot()
        return {"ok": True}
    if op == "propose":
        data = str(request["data"]).encode()
        timeout_s = float(request.get("timeout_s", 5.0))
        try:
            result = peer.propose(data, timeout_s).result(timeout_s + 5.0)
        except RaftError as exc:
            return _error_answer(exc)
        return {
            "ok": True,
            "digest": result[:32].hex(),
            "index": int.from_bytes(result[32:], "big"),
        }
    if op == "propose_stream":
        return _propose_stream(peer, request)
    if op == "bench":
        count = int(request["count"])
        size = int(request.get("size", 64))
        concurrency = int(request.get("concurrency", 1))
        payloads = [(f"b{n}-".encode() + b"x" * size)[: max(size, 1)] for n in range(count)]
        syncs_before = peer.status()["journal_syncs"]
        started = time.perf_counter()
        latencies, outcomes = asyncio.run(
            _propose_many(peer, payloads, concurrency, float(request.get("timeout_s", 10.0)))
        )
        elapsed = time.perf_counter() - started
        syncs = peer.status()["journal_syncs"] - syncs_before
        failures = sum(1 for outcome in outcomes if not outcome.get("ok"))
        ordered = sorted(latencies)
        return {
            "ok": True,
            "count": count,
            "concurrency": concurrency,
            "failures": failures,
            "elapsed_s": elapsed,
            "throughput_per_s": count / elapsed if elapsed > 0 else 0.0,
            "p50_ms": _percentile(ordered, 0.50) * 1e3,
            "p99_ms": _percentile(ordered, 0.99) * 1e3,
            "max_ms": (ordered[-1] if ordered else 0.0) * 1e3,
            "leader_journal_syncs": syncs,
        }
    return {"ok": False, "error": "BadRequest", "message": f"unknown op {op!r}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--partners", default="", help="comma-separated host:port list")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument(
        "--password-env",
        default="RAFT_TEST_SECRET",
        help="read the cluster password from this env var (the harness sets it)",
    )
    parser.add_argument("--snapshot-every", type=int, default=10_000)
    parser.add_argument("--snapshot-delay-s", type=float, default=0.0)
    parser.add_argument("--unsafe-no-fsync", action="store_true")
    parser.add_argument(
        "--dial",
        default="",
        help="comma-separated partner=host:port: where to connect to a partner (a proxy)",
    )
    args = parser.parse_args()

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    password = os.environ[args.password_env]
    partners = [address for address in args.partners.split(",") if address]
    app = HashChainApp(snapshot_delay_s=args.snapshot_delay_s)

    def on_fatal(error: FatalPeerError) -> None:
        logger.critical("fatal raft error, exiting: %s", error)
        os._exit(70)

    peer = RaftPeer(
        args.self_address,
        partners,
        args.data_dir,
        app.apply,
        app.take_snapshot,
        app.restore_snapshot,
        password=password,
        tuning=RaftTuning(snapshot_every_entries=args.snapshot_every),
        durable=not args.unsafe_no_fsync,
        on_fatal=on_fatal,
        partner_dial_addresses=dict(item.split("=", 1) for item in args.dial.split(",") if item),
    )
    emit({"id": 0, "ok": True, "ready": True, "pid": os.getpid()})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            answer = handle(peer, app, request)
            answer["id"] = request.get("id")
            emit(answer)
    finally:
        peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
