"""A fork server for the node processes of local clusters (`raftwal.cli.dev`), for the
test suite: each node is forked from one process that has already imported what a node
imports, instead of a fresh interpreter importing it all again.

Starting a node costs about 1.1 CPU-seconds, 0.7 of them the interpreter's start and the
imports; the suite starts about 300 nodes. A forked node runs the very same code as
``python -m raftwal.cli node ...`` (the same ``main``, argv, environment, working
directory, log file, its own session, stdin from /dev/null) in a process of its own.

Only a process that keeps running while its nodes do may use it: the server kills its
nodes when its client goes away (the client's end of the socket closes). ``raftwal dev
up`` exits and leaves its nodes running, so it spawns them the usual way;
`raftwal.cli.dev.use_fork_server` turns this on for the process that calls it (the test
suite's workers do).

The server (``python -m raftwal.cli.forkserver FD``) speaks JSON lines on the socket FD:

- ``{"op": "spawn", "id": N, "module": M, "argv": [...], "env": {...}, "log": PATH,
  "cwd": PATH}``: fork a process that runs ``python -m M ARGV`` would (M defaults to
  ``raftwal.cli``); answered ``{"op": "spawned", "id": N,
  "pid": P}`` or ``{"op": "failed", "id": N, "error": "..."}``.
- ``{"op": "exited", "pid": P, "returncode": R}`` (from the server): the node exited
  (R as subprocess.Popen's: the exit status, or minus the signal that ended it). It stays a
  zombie, so its pid is not reused, until the client answers ``{"op": "reap", "pid": P}``
  (it has recorded the exit; after that the pid is as free as a waited-for Popen's).

Security: the socket is a socketpair between the client and the server it started, never
bound to an address; nothing else can write to it."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# What `python -m raftwal.cli node` imports before it serves; imported once, here.
PRELOAD = (
    "raftwal.cli.main",
    "raftwal.node.process",
    "raftwal.node.config",
    "raftwal.node.supervisor",
    "raftwal.node.worker",
)

_MAX_LINE_BYTES = 1 << 20


def _returncode(info: os.waitid_result) -> int:
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _run_child(request: Mapping[str, object]) -> None:
    """In the forked child: become the node process ``python -m raftwal.cli ARGV``. Never
    returns."""
    code = 1
    try:
        os.setsid()
        log_fd = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.closerange(3, 1 << 16)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
        argv = [str(a) for a in request["argv"]]  # type: ignore[union-attr]
        module = str(request.get("module") or "raftwal.cli")
        # As `python -m MODULE ARGV` sets them (run_module puts the module's file first).
        sys.argv = ["-m", *argv]
        # A restarting node (a Raft role change) execs this command line again.
        sys.orig_argv = [sys.executable, "-m", module, *argv]
        # The server's random state is every child's: seed each child afresh (election
        # timeouts are drawn from it).
        import random

        random.seed()
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
    except KeyboardInterrupt:
        # As the interpreter ends on an unhandled KeyboardInterrupt: by SIGINT.
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - reported in the node's log, then exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        # What the interpreter does on its way out: wait for non-daemon threads, run the
        # exit functions, flush.
        with contextlib.suppress(Exception):
            threading._shutdown()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            import atexit

            atexit._run_exitfuncs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def serve(fd: int) -> int:
    """The server's loop on socket `fd`; returns when the client's end closes."""
    for name in PRELOAD:
        __import__(name)
    import gc

    # Nothing may run beside the fork: a thread holding a lock at fork time leaves it held
    # in the child forever.
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        print(f"forkserver: {threads} threads after the imports; refusing", file=sys.stderr)
        return 1
    gc.collect()
    gc.freeze()
    conn = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(conn, selectors.EVENT_READ, "conn")
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    running: set[int] = set()  # forked, exit not reported
    exited: set[int] = set()  # exit reported, not reaped yet
    inbox = b""
    outbox = bytearray()

    def send(message: Mapping[str, object]) -> None:
        outbox.extend(json.dumps(message).encode() + b"\n")

    def flush() -> None:
        # The client's reader thread always reads: a blocking send cannot stall for long.
        with contextlib.suppress(OSError):
            conn.sendall(outbox)
        outbox.clear()

    def check_children() -> None:
        for pid in list(running):
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                running.discard(pid)
                continue
            if info is not None and info.si_pid == pid:
                running.discard(pid)
                exited.add(pid)
                send({"op": "exited", "pid": pid, "returncode": _returncode(info)})

    def handle(request: dict[str, object]) -> None:
        op = request.get("op")
        if op == "spawn":
            try:
                pid = os.fork()
            except OSError as error:
                send({"op": "failed", "id": request.get("id"), "error": str(error)})
                return
            if pid == 0:
                _run_child(request)
            running.add(pid)
            send({"op": "spawned", "id": request.get("id"), "pid": pid})
        elif op == "reap":
            pid = request.get("pid")
            if isinstance(pid, int) and pid in exited:
                exited.discard(pid)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    closed = False
    try:
        while not closed:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 4096):
                            pass
                    continue
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                inbox += chunk
                if len(inbox) > _MAX_LINE_BYTES and b"\n" not in inbox:
                    closed = True
                    break
                while b"\n" in inbox:
                    line, inbox = inbox.split(b"\n", 1)
                    handle(json.loads(line))
            check_children()
            if not closed:
                flush()
    finally:
        # The client is gone (or this loop failed): nobody will stop these nodes, so stop
        # them now (each leads a process group of its own).
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for pid in running | exited:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return 0


class ForkedProcess:
    """A node forked by the server, with the part of subprocess.Popen's interface that the
    local-cluster helpers and the tests use."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._server.wait_for_exit(self.pid, remaining)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        # Like Popen: never signal a pid whose exit was seen (it may be reused by now).
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServerError(RuntimeError):
    pass


class ForkServer:
    """The client: starts the server process and forks nodes through it."""

    def __init__(self, log_path: Path | None = None) -> None:
        mine, theirs = socket.socketpair()
        # Its own errors go to `log_path`, else to this process's stderr (never to its
        # stdout, which may be a channel of its own: pytest-xdist's workers talk on it).
        log = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "raftwal.cli.forkserver", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log if log is not None else subprocess.DEVNULL,
                stderr=log if log is not None else None,
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()
            theirs.close()
        self._sock = mine
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._next_id = 0
        self._spawned: dict[int, dict[str, object]] = {}
        self._exits: dict[int, int] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="raftwal-forkserver", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self._sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    message = json.loads(line)
                    with self._lock:
                        if message["op"] in ("spawned", "failed"):
                            self._spawned[message["id"]] = message
                        elif message["op"] == "exited":
                            self._exits[message["pid"]] = message["returncode"]
                        self._changed.notify_all()
        except OSError:
            pass
        finally:
            with self._lock:
                self._closed = True
                self._changed.notify_all()

    def _send(self, message: Mapping[str, object]) -> None:
        self._sock.sendall(json.dumps(message).encode() + b"\n")

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path,
        module: str = "raftwal.cli",
    ) -> ForkedProcess:
        """Fork what ``python -m MODULE ARGV`` runs (a node: ``raftwal.cli node ...``)."""
        with self._lock:
            if self._closed:
                raise ForkServerError("the fork server has exited")
            self._next_id += 1
            request_id = self._next_id
            self._send(
                {
                    "op": "spawn",
                    "id": request_id,
                    "module": module,
                    "argv": list(argv),
                    "env": dict(env),
                    "log": str(log_path),
                    "cwd": str(cwd),
                }
            )
            deadline = time.monotonic() + 30.0
            while request_id not in self._spawned:
                if self._closed or time.monotonic() > deadline:
                    raise ForkServerError("the fork server did not answer a spawn")
                self._changed.wait(1.0)
            answer = self._spawned.pop(request_id)
        if answer["op"] != "spawned":
            raise ForkServerError(f"fork failed: {answer.get('error')}")
        pid = answer["pid"]
        assert isinstance(pid, int)
        return ForkedProcess(self, pid, [sys.executable, "-m", module, *argv])

    def returncode(self, pid: int) -> int | None:
        with self._lock:
            code = self._exits.pop(pid, None)
            if code is not None:
                # Recorded: the server may reap it now.
                with contextlib.suppress(OSError):
                    self._send({"op": "reap", "pid": pid})
                return code
            if self._closed:
                # The server is gone (it killed its nodes on the way out, unless it was
                # killed itself): the node is gone or orphaned; either way nobody can
                # report its status any more.
                return None if _alive(pid) else -signal.SIGKILL
            return None

    def wait_for_exit(self, pid: int, timeout: float | None) -> None:
        with self._lock:
            if pid not in self._exits and not self._closed:
                self._changed.wait(0.5 if timeout is None else min(timeout, 0.5))
                return
            closed = self._closed
        if closed:
            # Nobody reports exits any more: `returncode` looks at /proc; poll it gently.
            time.sleep(0.05 if timeout is None else max(0.0, min(timeout, 0.05)))

    @property
    def alive(self) -> bool:
        with self._lock:
            return not self._closed

    def close(self) -> None:
        """Stop the server, and with it every node it forked that still runs."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=30)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._sock.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
