"""``raftwal node``: a supervisor of one control process and the node's data workers
(DESIGN.md section 2).

The supervisor owns no state and serves nothing. It forks:

- the **control process** (``raftwal.node.process.run_control``): Raft, the coordinator,
  the Coordinator/Cluster/NodeManager services on ``grpc_port``, metrics and the console;
- ``data_workers`` **data workers** (``raftwal.node.worker.run_worker``): the WAL of the
  pchannels placed on each, on ports of their own. Each runs with its niceness raised by
  ``data_worker_nice`` and as a batch process (SCHED_BATCH: no preemption on wakeup), in
  the node's session (and so its scheduling group, where the kernel groups sessions), so
  that the control process is scheduled ahead of them: a lease keep-alive or a lock never
  waits behind WAL work, while the node as a whole keeps its share of a shared host.

Each worker gets a stream socketpair to the control process (``raftwal.node.planes``):
the supervisor keeps neither end, and hands the control process its end over a
SOCK_SEQPACKET channel with the socket attached (SCM_RIGHTS), with a secret made for this
start that both ends hold in memory only.

Process life:

- a data worker that dies is started again (backoff from 0.1 s doubling to 5 s, reset
  after a minute up); its pchannels recover at term + 1, as after a node failure (the
  new worker finds itself the recorded owner but not serving, DESIGN.md section 5);
- the control process ending ends the node: the supervisor stops the workers (they also
  see their links close) and exits with the control process's status; status
  ``EXIT_RESTART`` (a Raft role change) makes it exec the same command line again, in
  the same pid;
- SIGTERM / SIGINT go to the control process, which hands over (DESIGN.md section 8b),
  stops the workers and exits; a second one stops without handover;
- SIGCONT is passed to every child (a paused node resumes whole);
- the supervisor killed (even with SIGKILL) takes its children with it: each asks the
  kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG), so no orphan keeps a port or
  the data directory.

What must never happen here: a thread before a fork (a lock held by another thread at
fork time stays held in the child; gRPC's threads are one: a join's discovery therefore
runs in a process of its own, ``raftwal.node.join.discover_apart``), a child outliving the supervisor, or an import of the
node's heavy modules after the first fork (they are imported once, before it, and shared).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import faulthandler
import logging
import os
import secrets
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from raftwal.node.config import ClusterConfig, check_transport_security
from raftwal.node.membership import load_role
from raftwal.node.planes import SupervisorNews
from raftwal.node.process import (
    EXIT_ID_IN_USE,
    EXIT_NODE_REMOVED,
    EXIT_RESTART,
    prepare_data_dir,
    run_control,
)
from raftwal.node.security import NodeSecurity
from raftwal.node.trim import return_large_blocks_to_the_system
from raftwal.node.worker import run_worker

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
#: Backoff before a dead data worker starts again: from the first, doubling to the last,
#: back to the first once it ran RESTART_RESET_S.
RESTART_BACKOFF_S = (0.1, 5.0)
RESTART_RESET_S = 60.0
#: Exit statuses of the control process that end the node as planned, with the control
#: process's own last line the node's: stopped, restarting in another role, another
#: process is this node, removed from the cluster.
QUIET_EXITS = frozenset({0, EXIT_RESTART, EXIT_ID_IN_USE, EXIT_NODE_REMOVED})
#: How long a stopping node's workers get after the control process ended before they are
#: killed.
WORKER_STOP_GRACE_S = 15.0


@dataclass
class _Child:
    kind: str
    index: int
    pid: int
    started_at: float
    restarts: int = 0


def _set_parent_death_signal(parent: int) -> None:
    """Ask for SIGKILL when the supervisor dies; exit at once if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the children still see their links close and stop
    if os.getppid() != parent:
        os._exit(1)


def _raise_niceness(by: int) -> None:
    """Lower this process's CPU priority by `by` (niceness). The worker stays in its
    node's session, and so in its scheduling group where the kernel groups sessions
    (autogroups): it yields to its own control process, while the node as a whole keeps
    its fair share against everything else on the host (a group of its own with a lower
    weight starved the WAL on a busy host: measured 3-9k msgs/s against 30-47k)."""
    if by <= 0:
        return
    try:
        os.nice(by)
    except OSError as error:
        log.warning("cannot lower the data worker's priority: %s", error)
    # SCHED_BATCH (same niceness): a worker woken by a WAL packet or an fsync's end does
    # not preempt the running process; it waits for that one's slice. Niceness weighs
    # the workers' share of the CPU; this keeps their wakeups from cutting into the
    # control process's (docs/architecture.md, "Priorities"). Any user may ask it.
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError as error:
            log.warning("cannot make the data worker a batch process: %s", error)


class Supervisor:
    def __init__(self, config: ClusterConfig, node_id: str) -> None:
        self._config = config
        self._node_id = node_id
        self._me = config.node(node_id)
        self._count = self._me.worker_count()
        # The secret of this start: a worker's first frame must carry it.
        self._token = secrets.token_bytes(32)
        self._pid = os.getpid()
        self._control: _Child | None = None
        self._workers: dict[int, _Child | None] = dict.fromkeys(range(self._count))
        self._restart_at: dict[int, float] = {}
        self._restarts: dict[int, int] = dict.fromkeys(range(self._count), 0)
        self._backoff: dict[int, float] = dict.fromkeys(range(self._count), RESTART_BACKOFF_S[0])
        self._channel: socket.socket | None = None
        self._stopping = False
        self._signals_received: list[int] = []

    # -- forking --------------------------------------------------------------------------

    def _fork(self, body: Callable[[], int], keep: socket.socket, drop: list[socket.socket]) -> int:
        """Fork a child that runs `body` and exits with its status."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            _set_parent_death_signal(self._pid)
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGCONT):
                signal.signal(signum, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            for sock in drop:
                if sock is not keep:
                    sock.close()
            code = body()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported in the node's log, then exit 1
            traceback.print_exc()
            code = 1
        finally:
            try:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def _start_control(self) -> None:
        supervisor_end, control_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config, node_id, token = self._config, self._node_id, self._token

        def body() -> int:
            # A group of its own: a terminal's Ctrl-C reaches the supervisor only, which
            # passes one stop on (the control process would otherwise count two).
            os.setpgid(0, 0)
            return run_control(config, node_id, token, control_end)

        pid = self._fork(body, control_end, [supervisor_end])
        control_end.close()
        self._channel = supervisor_end
        self._control = _Child("control", 0, pid, time.monotonic())

    def _start_worker(self, index: int) -> None:
        assert self._channel is not None
        control_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config, node_id, token = self._config, self._node_id, self._token
        nice = self._config.data_worker_nice

        def body() -> int:
            # A process group of its own (a terminal's Ctrl-C reaches the supervisor only,
            # which hands over first), in the node's session.
            os.setpgid(0, 0)
            _raise_niceness(nice)
            return run_worker(config, node_id, index, worker_end, token)

        pid = self._fork(body, worker_end, [control_end, self._channel])
        worker_end.close()
        restarts = self._restarts[index]
        self._workers[index] = _Child("worker", index, pid, time.monotonic(), restarts)
        try:
            socket.send_fds(
                self._channel,
                [SupervisorNews("worker", index, restarts=restarts).encode()],
                [control_end.fileno()],
            )
        except OSError as error:
            # The control process is gone: the loop sees it exit and ends the node.
            log.error("cannot hand worker %d's link to the control process: %s", index, error)
        control_end.close()

    # -- the loop -------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals_received.append(signum)

    def run(self) -> int:
        """Run the node; its exit status. Execs itself again on EXIT_RESTART."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGCONT):
            signal.signal(signum, self._on_signal)
        # `kill -USR1 <pid>` writes every thread's stack of that process to the node's log
        # (stderr), without stopping it: what a hung process is doing. The control process
        # and the data workers inherit it through fork.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        self._start_control()
        for index in range(self._count):
            self._start_worker(index)
        selector = selectors.DefaultSelector()
        selector.register(wake_r, selectors.EVENT_READ)
        status: int | None = None
        try:
            while status is None:
                timeout = None
                if self._restart_at:
                    timeout = max(0.0, min(self._restart_at.values()) - time.monotonic())
                selector.select(timeout)
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                signals, self._signals_received = self._signals_received, []
                for signum in signals:
                    self._forward(signum)
                status = self._reap()
                now = time.monotonic()
                for index, at in list(self._restart_at.items()):
                    if at <= now and status is None and not self._stopping:
                        del self._restart_at[index]
                        log.warning("starting data worker %d again", index)
                        self._start_worker(index)
        finally:
            # A control process killed by a signal ended the node as a crash would: its
            # workers go the same way at once. Otherwise they stop cleanly.
            self._stop_workers(crashed=status is None or status < 0)
            selector.close()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            if self._channel is not None:
                self._channel.close()
        return status

    def _forward(self, signum: int) -> None:
        control = self._control
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stopping = True
            if control is not None:
                self._kill(control.pid, signal.SIGTERM)
        elif signum == signal.SIGCONT:
            for child in self._children():
                self._kill(child.pid, signal.SIGCONT)

    def _children(self) -> list[_Child]:
        found = [w for w in self._workers.values() if w is not None]
        if self._control is not None:
            found.append(self._control)
        return found

    @staticmethod
    def _kill(pid: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    def _reap(self) -> int | None:
        """Collect exited children; the node's exit status once the control process
        ended, else None."""
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            how = _describe(wait_status)
            if self._control is not None and pid == self._control.pid:
                self._control = None
                code = os.waitstatus_to_exitcode(wait_status)
                if code not in QUIET_EXITS:
                    log.error("node %s: the control process exited (%s)", self._node_id, how)
                return code
            for index, child in self._workers.items():
                if child is None or child.pid != pid:
                    continue
                self._workers[index] = None
                self._tell_control(SupervisorNews("exited", index, how=how))
                if self._stopping or (
                    os.WIFEXITED(wait_status) and os.WEXITSTATUS(wait_status) == 0
                ):
                    # Stopped as asked (or its control process went away): not a crash.
                    break
                up_s = time.monotonic() - child.started_at
                if up_s >= RESTART_RESET_S:
                    self._backoff[index] = RESTART_BACKOFF_S[0]
                delay = self._backoff[index]
                self._backoff[index] = min(RESTART_BACKOFF_S[1], delay * 2)
                self._restarts[index] += 1
                self._restart_at[index] = time.monotonic() + delay
                log.error(
                    "node %s: data worker %d died (%s) after %.1f s; starting it again in %.1f s",
                    self._node_id,
                    index,
                    how,
                    up_s,
                    delay,
                )
                break

    def _tell_control(self, news: SupervisorNews) -> None:
        if self._channel is None:
            return
        try:
            self._channel.send(news.encode())
        except OSError as error:
            if error.errno not in (errno.EPIPE, errno.ECONNREFUSED, errno.ECONNRESET):
                log.warning("cannot tell the control process: %s", error)

    def _stop_workers(self, crashed: bool) -> None:
        """Stop what is left: the workers end on their own once the control process is
        gone (their links close); those that do not within the grace are killed. After a
        crash (`crashed`) they are killed at once."""
        deadline = time.monotonic() + (0.0 if crashed else WORKER_STOP_GRACE_S)
        for child in self._children():
            self._kill(child.pid, signal.SIGKILL if crashed else signal.SIGTERM)
        while any(w is not None for w in self._workers.values()) or self._control is not None:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                if time.monotonic() >= deadline:
                    for child in self._children():
                        self._kill(child.pid, signal.SIGKILL)
                    deadline = float("inf")
                time.sleep(0.02)
                continue
            if self._control is not None and pid == self._control.pid:
                self._control = None
            for index, child in self._workers.items():
                if child is not None and child.pid == pid:
                    self._workers[index] = None


def _describe(wait_status: int) -> str:
    if os.WIFSIGNALED(wait_status):
        return f"killed by {signal.Signals(os.WTERMSIG(wait_status)).name}"
    return f"exit status {os.WEXITSTATUS(wait_status)}"


def run_node(config: ClusterConfig, node_id: str) -> int:
    """Run the node (a supervisor of its processes) until it stops; its exit status. A
    control process that asked to restart in another Raft role gets the same command
    line again, in this process (same pid: whatever supervises the node sees no exit)."""
    return_large_blocks_to_the_system()
    # Every file the node creates (segments, catalog.db, events.db, the Raft journal and
    # snapshots, SQLite's side files) is for its own user only: 0600 in 0700 directories.
    os.umask(0o077)
    me = config.node(node_id)
    # What would stop the control process at once is refused here, in one line, before any
    # process starts: a missing secret, unreadable TLS files or tokens, a bad role file.
    check_transport_security(config, me)
    NodeSecurity.load(config, me)
    prepare_data_dir(me.data_dir)
    load_role(me.data_dir, me.role)
    status = Supervisor(config, node_id).run()
    if status == EXIT_RESTART:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)
    if status < 0:
        # The control process died of a signal: end the same way, for whoever watches.
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status
