"""Start and drive `peer_main.py` processes on 127.0.0.1 for raft tests and benchmarks.

Lives here: `free_ports` (the dev helpers' own, from this worker's port range),
`PeerProcess` (one peer process: start, request, kill -9,
SIGSTOP/SIGCONT, restart on the same data dir) and `Cluster` (several of them, leader
lookup, convergence waits). Every wait is bounded in time; every process is stopped by its
own PID.

Must never: signal a process it did not start, address anything but loopback, or wait
without a deadline.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from raftwal.cli.dev import free_ports, scaled

PEER_MAIN = Path(__file__).resolve().parent / "peer_main.py"
START_TIMEOUT_S = 20.0
# The cluster secret every test peer uses unless a test gives another one: a peer never
# starts without one (raft/peer.py), and peer_main reads it from RAFT_TEST_SECRET.
TEST_SECRET = "raftwal-test-cluster-secret-7f3c9a"


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in the stopped state (T, or t under a tracer)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue  # a thread that ended
        if state not in ("T", "t"):
            return False
    return True


class PeerDied(RuntimeError):
    """The peer process exited (or closed stdout) while a request was in flight."""


class Items:
    """An in-process peer's application: the applied commands in order; each result is
    the entry's Raft index (8 bytes, big-endian)."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def apply(self, command: bytes, raft_index: int) -> bytes:
        self.items.append(command)
        return raft_index.to_bytes(8, "big")

    def take_snapshot(self) -> bytes:
        return b"\n".join(self.items)

    def restore_snapshot(self, data: bytes) -> None:
        self.items = data.split(b"\n") if data else []


class PeerProcess:
    """One `peer_main.py` process (see module doc)."""

    def __init__(
        self,
        name: str,
        address: str,
        partners: list[str],
        data_dir: Path,
        log_dir: Path,
        extra_args: Iterable[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.address = address
        self.partners = partners
        self.data_dir = data_dir
        self.log_dir = log_dir
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.process: subprocess.Popen[str] | None = None
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1024)
        self._next_id = 1
        self._starts = 0
        # (payload, raft index) of every proposal a propose_stream reported acknowledged,
        # kept even when the process dies in the middle of the stream.
        self.stream_acks: list[tuple[str, int]] = []

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, env: dict[str, str] | None = None, wait_ready: bool = True) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self._starts += 1
        self._answers = queue.Queue(maxsize=1024)
        log_path = self.log_dir / f"{self.name}.{self._starts}.log"
        command = [
            sys.executable,
            str(PEER_MAIN),
            "--self",
            self.address,
            "--partners",
            ",".join(self.partners),
            "--data-dir",
            str(self.data_dir),
            *self.extra_args,
        ]
        process_env = {**os.environ, "RAFT_TEST_SECRET": TEST_SECRET, **self.env, **(env or {})}
        with open(log_path, "w") as log_file:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                bufsize=1,
                env=process_env,
            )
        threading.Thread(
            target=self._read_answers, args=(self.process, self._answers), daemon=True
        ).start()
        if wait_ready:
            ready = self._next_answer(START_TIMEOUT_S)
            assert ready.get("ready"), f"{self.name} did not start: {ready}"

    @staticmethod
    def _read_answers(
        process: subprocess.Popen[str], answers: queue.Queue[dict[str, Any] | None]
    ) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            answers.put(json.loads(line), timeout=scaled(60))
        answers.put(None, timeout=scaled(60))

    def _next_answer(self, timeout_s: float) -> dict[str, Any]:
        try:
            answer = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no answer within {timeout_s}s") from None
        if answer is None:
            raise PeerDied(f"{self.name} exited (code {self.process and self.process.poll()})")
        return answer

    def request(self, op: str, wait_s: float = 15.0, **fields: Any) -> dict[str, Any]:
        assert self.process is not None and self.process.stdin is not None
        request_id = self._next_id
        self._next_id += 1
        try:
            self.process.stdin.write(json.dumps({"id": request_id, "op": op, **fields}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise PeerDied(f"{self.name}: stdin closed ({exc})") from exc
        deadline = time.monotonic() + scaled(wait_s)
        while True:
            answer = self._next_answer(max(0.01, deadline - time.monotonic()))
            if answer.get("id") != request_id:
                continue
            if "ack" in answer:
                self.stream_acks.append((answer["ack"], answer["index"]))
                continue
            return answer

    def status(self) -> dict[str, Any]:
        return self.request("status", wait_s=10.0)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill9(self) -> None:
        if self.is_running():
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=scaled(10))

    def pause(self) -> None:
        """SIGSTOP the peer and wait until every one of its threads is stopped: kill()
        returns once the signal is queued, and a thread that is running or waiting for a
        CPU on a loaded host may still be on its way to the stop when the caller's next
        step (a proposal that must not commit) goes out."""
        assert self.process is not None
        pid = self.process.pid
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + scaled(10)
        while not _all_threads_stopped(pid):
            assert time.monotonic() < deadline, f"{self.name} (pid {pid}) did not stop"
            time.sleep(0.001)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def wait_exit(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> None:
        """Close stdin (graceful), then SIGKILL by PID if it has not exited in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.kill(self.process.pid, signal.SIGCONT)  # in case a test paused it
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout=scaled(5))
            except (subprocess.TimeoutExpired, OSError):
                self.kill9()
        if self.process.stdout is not None:
            self.process.stdout.close()


class Cluster:
    """Peers started together; `stop_all` kills by PID whatever is still running."""

    def __init__(
        self,
        root: Path,
        size: int,
        extra_args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        per_peer_args: dict[int, list[str]] | None = None,
        proxied: bool = False,
    ) -> None:
        ports = free_ports(size)
        addresses = [f"127.0.0.1:{port}" for port in ports]
        log_dir = root / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        # `proxied`: every peer dials its partners through a proxy per directed link
        # (tests/raft/raft_net.py), which a test cuts with `self.net`.
        self.net = None
        if proxied:
            from raft_net import RaftNet

            self.net = RaftNet(addresses)
            self.net.start()
            per_peer_args = {
                number: [
                    *(per_peer_args or {}).get(number, []),
                    "--dial",
                    ",".join(f"{k}={v}" for k, v in self.net.dial_table(address).items()),
                ]
                for number, address in enumerate(addresses)
            }
        self.peers = [
            PeerProcess(
                f"n{number}",
                address,
                [other for other in addresses if other != address],
                root / f"n{number}",
                log_dir,
                [*extra_args, *(per_peer_args or {}).get(number, [])],
                env,
            )
            for number, address in enumerate(addresses)
        ]
        self.log_dir = log_dir

    def start_all(self) -> None:
        for peer in self.peers:
            peer.start(wait_ready=False)
        for peer in self.peers:
            ready = peer._next_answer(START_TIMEOUT_S)
            assert ready.get("ready"), f"{peer.name} did not start: {ready}"

    def stop_all(self) -> None:
        for peer in self.peers:
            peer.stop()
        if self.net is not None:
            self.net.close()

    def running(self) -> list[PeerProcess]:
        return [peer for peer in self.peers if peer.is_running()]

    def wait_for_leader(
        self, timeout_s: float, among: list[PeerProcess] | None = None
    ) -> PeerProcess:
        """The one peer all of `among` agree is leader (same address, and it says so)."""
        candidates = among if among is not None else self.running()
        deadline = time.monotonic() + scaled(timeout_s)
        last_seen: list[Any] = []
        while time.monotonic() < deadline:
            statuses = [peer.status()["status"] for peer in candidates]
            last_seen = [(s["self_address"], s["state"], s["leader"], s["term"]) for s in statuses]
            leaders = {s["leader"] for s in statuses}
            if len(leaders) == 1 and None not in leaders:
                (leader_address,) = leaders
                for peer, status in zip(candidates, statuses, strict=True):
                    if peer.address == leader_address and status["state"] == "leader":
                        return peer
            time.sleep(0.05)
        raise TimeoutError(f"no agreed leader within {timeout_s}s; last seen {last_seen}")

    def wait_until(
        self, predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05
    ) -> None:
        deadline = time.monotonic() + scaled(timeout_s)
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(poll_s)
        raise TimeoutError(f"not within {timeout_s}s: {what}")

    def wait_converged(self, timeout_s: float, peers: list[PeerProcess] | None = None) -> dict:
        """Wait until every peer reports the same (count, digest, last index)."""
        members = peers if peers is not None else self.running()
        summaries: list[dict[str, Any]] = []

        def converged() -> bool:
            nonlocal summaries
            summaries = [peer.request("digest") for peer in members]
            keys = {(s["count"], s["digest"], s["last_index"]) for s in summaries}
            return len(keys) == 1

        self.wait_until(converged, timeout_s, f"convergence of {[p.name for p in members]}")
        return summaries[0]

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every peer log, for assertion messages."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)
