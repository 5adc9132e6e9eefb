"""A real nats-server with JetStream for tests (scripts/install-nats.sh installs one): started
in a directory of the test's, on a port from the test's port slot, stopped by its PID.
`pause`/`resume` SIGSTOP/SIGCONT it, `kill` SIGKILLs it and `start` brings it back on the
same port and store."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from raftwal.cli.dev import free_ports
from tests.timing import scaled


def nats_binary() -> str | None:
    """The venv's nats-server (>= 2.10, from scripts/install-nats.sh), else the one on PATH."""
    venv = Path(sys.executable).parent / "nats-server"
    if venv.exists():
        return str(venv)
    return shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )


class NatsServer:
    def __init__(self, directory: Path, port: int | None = None) -> None:
        binary = nats_binary()
        if binary is None:
            raise RuntimeError("nats-server is not installed (run scripts/install-nats.sh)")
        self.binary = binary
        self.directory = directory
        self.port = port or free_ports(1)[0]
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.directory / "nats.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [
                self.binary,
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-sd",
                str(self.directory / "store"),
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"nats-server exited: see {self.directory / 'nats.log'}"
                    ) from None
                time.sleep(0.05)
        raise RuntimeError("nats-server did not listen in time")

    def pause(self) -> None:
        """SIGSTOP the server and return once every thread of it is stopped: kill() only
        queues the signal, and a thread running on another core goes on for a moment,
        long enough to acknowledge a publish sent right after (seen: a write acknowledged
        "while paused")."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline:
            if all(state in ("T", "t") for state in _thread_states(self.process.pid)):
                return
            time.sleep(0.001)
        raise RuntimeError(f"nats-server {self.process.pid} did not stop on SIGSTOP")

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


def _thread_states(pid: int) -> list[str]:
    """The scheduler state letter of every thread of `pid` (empty when it is gone)."""
    states = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue
    return states
