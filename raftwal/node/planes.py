"""The links between a node's control process and its data workers (DESIGN.md section 2).

A node is a supervisor (``raftwal.node.supervisor``), one control process and
``data_workers`` data workers. Each worker talks to the control process over one stream
socketpair the supervisor made (never a network port; the frames and messages are
``rpc/protos/planes.proto``):

- **down**: the applied coordination state, once whole (``PlaneState``) and then as the
  events applied since (``PlaneEvents``), which the worker folds into its copy with the
  pure ``statemachine.evolve`` (``StateMirror``): the state is a fold of its events
  (DESIGN.md section 3), so the copy is the control process's state at the same revision.
  A snapshot restore or a ``RestoreState`` sends the whole state again. Also the outcomes
  of the worker's proposals, and requests: status, metrics, reconcile now, stop.
- **up**: proposals (PChannelReady, CommitSegment, reassignments, replication
  checkpoints), which the control process proposes as its own (forwarded to the Raft
  leader when it does not lead), the pchannels the worker serves (for the node's
  heartbeats and handover), its status (owners, disk usage, problems) and suspicions.

Control side: ``DataWorkers`` (one ``WorkerLink`` per worker). Worker side:
``ControlLink`` and ``StateMirror``.

Trust: a link is a socketpair between processes forked from one supervisor, so nothing
else can reach it; even so a worker's first frame must be a hello carrying the
supervisor's per-start secret (``hmac.compare_digest``), at most ``HELLO_MAX_BYTES``,
within ``HELLO_TIMEOUT_S``. Every frame is bounded (``DOWN_FRAME_MAX_BYTES``,
``UP_FRAME_MAX_BYTES``), and so is what the control process buffers for a worker that
stopped reading (``WRITE_BUFFER_MAX_BYTES``: past it the link is dropped, the worker exits
and the supervisor starts it again). No pickle anywhere.

Every loop here ends on its peer going away: a worker whose control process is gone
exits (``ControlGone``); a control process drops a worker's link on EOF, on a bad frame
and on a full buffer, and the worker's pending proposals fail with ON_SHUTDOWN.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from raftwal.node.notify import AppliedNotifier
from rpc.errors import RaftwalError, error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import planes_pb2 as planes
from statemachine import evolve, new_state

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

_HEADER = struct.Struct(">I")
#: A worker's hello (secret, index, pid, addresses) fits in this.
HELLO_MAX_BYTES = 4096
#: A frame to a worker: the whole state, bounded by the state machine's limits.
DOWN_FRAME_MAX_BYTES = 512 << 20
#: A frame from a worker: its status (a few hundred bytes per pchannel) or metrics page.
UP_FRAME_MAX_BYTES = 64 << 20
HELLO_TIMEOUT_S = 30.0
#: What the control process holds for one worker that does not read: a stuck worker is cut
#: off (it then exits, and the supervisor starts it again) rather than grow the control
#: process's memory.
WRITE_BUFFER_MAX_BYTES = 256 << 20
#: How long a worker's proposal waits for its outcome (the control process's own bound is
#: its propose timeout; this covers a control process that stopped answering).
PROPOSE_WAIT_S = 30.0
#: How often a worker sends its status unasked.
STATUS_INTERVAL_S = 1.0
#: How long the control process waits for a worker's metrics page.
METRICS_WAIT_S = 2.0


class LinkBroken(ConnectionError):
    """The other end of a link closed it or sent something it must not."""


class ControlGone(LinkBroken):
    """A worker's control process is gone: the worker must stop (the supervisor restarts
    the node's processes as needed)."""


#: Events a data worker's copy of the state never needs (nothing of the data plane reads
#: leases or locks), and the parts of the state they alone touch: the control process
#: sends neither, so a coordination write that takes or keeps a lease costs its workers
#: nothing. Only these evolvers read or write `leases` and `locks` (statemachine/evolve.py).
MIRROR_SKIPPED_KINDS = frozenset(
    {
        "lock_acquired",
        "lock_released",
        "lease_granted",
        "lease_renewed",
        "lease_revoked",
        "lease_expired",
    }
)
MIRROR_SKIPPED_FIELDS = frozenset(
    {"leases", "locks", "recent_results", "recent_request_ids", "recent_cursor"}
)


def worker_state(state: pb.CoordinationState) -> bytes:
    """`state` as a data worker's copy starts from: without `MIRROR_SKIPPED_FIELDS`."""
    copy = pb.CoordinationState()
    for descriptor, value in state.ListFields():
        if descriptor.name in MIRROR_SKIPPED_FIELDS:
            continue
        if descriptor.is_repeated or descriptor.message_type is not None:
            getattr(copy, descriptor.name).MergeFrom(value)
        else:
            setattr(copy, descriptor.name, value)
    return copy.SerializeToString()


def encode(message: planes.PlaneMessage) -> bytes:
    payload = message.SerializeToString()
    return _HEADER.pack(len(payload)) + payload


async def read_message(reader: asyncio.StreamReader, max_bytes: int) -> planes.PlaneMessage | None:
    """The next message, or None at a clean end of the stream. Raises LinkBroken on a frame
    over `max_bytes`, a cut-off frame or an undecodable message."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return None
        raise LinkBroken("link closed inside a frame header") from None
    except OSError as error:  # a reset: the other end died
        raise LinkBroken(f"link broken: {error}") from None
    (length,) = _HEADER.unpack(header)
    if length > max_bytes:
        raise LinkBroken(f"frame of {length} bytes (expected at most {max_bytes})")
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise LinkBroken(f"link closed inside a frame of {length} bytes") from None
    except OSError as error:
        raise LinkBroken(f"link broken inside a frame: {error}") from None
    try:
        return planes.PlaneMessage.FromString(payload)
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise LinkBroken(f"undecodable frame ({length} bytes): {error}") from None


async def open_link(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock.setblocking(False)
    return await asyncio.open_connection(sock=sock, limit=1 << 20)


# -- the worker's side -----------------------------------------------------------------------


class StateMirror:
    """A data worker's copy of the applied coordination state (a ``StateReader``), kept
    by what its control process sends. Readers on other threads (the metrics endpoint)
    take the same lock as the updates."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._state = new_state()
        # The revision of the last change the copy holds (a whole state or an event it
        # folded in): it does not move with the skipped kinds, so what is derived from the
        # copy (the data view) is rebuilt only when something it reads changed.
        self.data_revision = -1
        # The worker has its first whole state.
        self.ready = False
        self.notifier = AppliedNotifier()

    def read(self, reader: Callable[[pb.CoordinationState], T]) -> T:
        with self._lock:
            return reader(self._state)

    def applied(self) -> tuple[int, int]:
        """(revision, raft index) of the copy."""
        with self._lock:
            return self._state.revision, self._state.last_raft_index

    def load(self, message: planes.PlaneState) -> None:
        state = pb.CoordinationState.FromString(message.state)
        with self._lock:
            self._state = state
            self.data_revision = state.revision
            self.ready = True
        self.notifier.advance(state.revision, state.last_raft_index)

    def apply(self, message: planes.PlaneEvents) -> None:
        """Fold the events in (those at or below the copy's revision were in its last
        whole state already). The events of `MIRROR_SKIPPED_KINDS` never come: they touch
        only what the copy leaves out, so the revision steps over them."""
        with self._lock:
            state = self._state
            for data in message.events:
                event = pb.Event.FromString(data)
                if event.revision <= state.revision:
                    continue
                state.revision = event.revision - 1
                evolve(state, event)
                self.data_revision = event.revision
            state.revision = max(state.revision, message.revision)
            state.last_raft_index = max(state.last_raft_index, message.raft_index)
            state.last_time_ms = max(state.last_time_ms, message.last_time_ms)
            revision, raft_index = state.revision, state.last_raft_index
        self.notifier.advance(revision, raft_index)


class ControlRequests(Protocol):
    """What a worker answers its control process."""

    def status(self) -> planes.PlaneStatus: ...

    def metrics_text(self) -> bytes: ...

    def reconcile_now(self) -> None: ...

    def request_stop(self) -> None: ...

    def admit(self) -> None:
        """The node was admitted: its data plane may take pchannels."""

    def raft_reserve(self, released: bool) -> None:
        """Whether Raft lives on its disk reserve (PlaneDisk)."""


class ControlLink:
    """A data worker's link to its control process."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        mirror: StateMirror,
        requests: ControlRequests,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._mirror = mirror
        self._requests = requests
        self._ids = itertools.count(1)
        self._proposals: dict[int, asyncio.Future[planes.PlaneProposeResult]] = {}
        self._closed = False
        self._serving: dict[str, int] | None = None

    def _send(self, message: planes.PlaneMessage) -> None:
        if self._closed or self._writer.transport.is_closing():
            raise ControlGone("the link to the control process is closed")
        self._writer.write(encode(message))

    def hello(self, hello: planes.PlaneHello) -> None:
        self._send(planes.PlaneMessage(hello=hello))

    async def run(self) -> None:
        """Read until the control process goes away; then raises ControlGone (after
        failing every pending proposal)."""
        try:
            while True:
                message = await read_message(self._reader, DOWN_FRAME_MAX_BYTES)
                if message is None:
                    raise ControlGone("the control process closed the link")
                self._dispatch(message)
        except LinkBroken as error:
            raise ControlGone(str(error)) from None
        finally:
            self._closed = True
            for future in self._proposals.values():
                if not future.done():
                    future.set_exception(
                        RaftwalError(
                            error_info(E.ON_SHUTDOWN, "the node's control process is gone")
                        )
                    )
            self._proposals.clear()
            self._writer.transport.abort()

    def _dispatch(self, message: planes.PlaneMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "events":
            self._mirror.apply(message.events)
        elif kind == "state":
            self._mirror.load(message.state)
        elif kind == "propose_result":
            future = self._proposals.pop(message.propose_result.id, None)
            if future is not None and not future.done():
                future.set_result(message.propose_result)
        elif kind == "status_request":
            status = self._requests.status()
            status.id = message.status_request.id
            self._send(planes.PlaneMessage(status=status))
        elif kind == "metrics_request":
            self._send(
                planes.PlaneMessage(
                    metrics=planes.PlaneMetrics(
                        id=message.metrics_request.id, text=self._requests.metrics_text()
                    )
                )
            )
        elif kind == "reconcile":
            self._requests.reconcile_now()
        elif kind == "stop":
            self._requests.request_stop()
        elif kind == "admitted":
            self._requests.admit()
        elif kind == "disk":
            self._requests.raft_reserve(message.disk.raft_reserve_released)
        else:
            raise LinkBroken(f"unexpected message from the control process: {kind}")

    async def propose(self, command: pb.Command) -> pb.CommandResult:
        """Propose `command` through the control process; returns once this worker's copy
        of the state has applied it (as ``Node.propose`` does on the control process).
        Raises RaftwalError (the proposal's failure, or ON_SHUTDOWN / UNKNOWN when the
        control process does not answer)."""
        request_id = next(self._ids)
        future: asyncio.Future[planes.PlaneProposeResult] = (
            asyncio.get_running_loop().create_future()
        )
        self._proposals[request_id] = future
        try:
            self._send(
                planes.PlaneMessage(
                    propose=planes.PlanePropose(id=request_id, command=command.SerializeToString())
                )
            )
        except ControlGone:
            self._proposals.pop(request_id, None)
            raise RaftwalError(
                error_info(E.ON_SHUTDOWN, "the node's control process is gone")
            ) from None
        try:
            answer = await asyncio.wait_for(asyncio.shield(future), PROPOSE_WAIT_S)
        except TimeoutError:
            raise RaftwalError(
                error_info(
                    E.UNKNOWN,
                    f"no outcome from the control process in {PROPOSE_WAIT_S:g} s; retry with "
                    "the same request id",
                )
            ) from None
        finally:
            self._proposals.pop(request_id, None)
        if answer.HasField("error"):
            raise RaftwalError(answer.error)
        result = pb.CommandResult.FromString(answer.result)
        if result.raft_index:
            await self._mirror.notifier.wait_index(result.raft_index, PROPOSE_WAIT_S)
        return result

    def serving(self, terms: dict[str, int]) -> None:
        """Tell the control process which pchannels this worker's owners serve (only when
        that changed)."""
        if terms == self._serving:
            return
        self._serving = dict(terms)
        self._send(planes.PlaneMessage(serving=planes.PlaneServing(serving_terms=terms)))

    def status(self, status: planes.PlaneStatus) -> None:
        self._send(planes.PlaneMessage(status=status))

    def suspect(self, node_id: str) -> None:
        with contextlib.suppress(ControlGone):
            self._send(planes.PlaneMessage(suspect=planes.PlaneSuspect(node_id=node_id)))

    def close(self) -> None:
        self._closed = True
        self._writer.transport.abort()


# -- the control process's side --------------------------------------------------------------


class WorkersHost(Protocol):
    """What ``DataWorkers`` needs from the control process."""

    def propose(self, command: pb.Command) -> Awaitable[pb.CommandResult]: ...

    def suspect(self, node_id: str) -> None: ...

    def state_bytes(self) -> bytes:
        """The applied state as a worker's copy starts from (`worker_state`)."""
        ...

    def serving_changed(self) -> None:
        """The pchannels the node serves changed (heartbeat now)."""


@dataclass
class WorkerLink:
    """One data worker as the control process sees it."""

    index: int
    pid: int = 0
    grpc_address: str = ""
    transfer_port: int = 0
    # Times the supervisor started it again after it died.
    restarts: int = 0
    up: bool = False
    serving_terms: dict[str, int] = field(default_factory=dict)
    status: planes.PlaneStatus = field(default_factory=planes.PlaneStatus)
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    pending: dict[int, asyncio.Future[planes.PlaneMessage]] = field(default_factory=dict)


class DataWorkers:
    """The control process's links to its node's data workers (see the module doc)."""

    def __init__(self, host: WorkersHost, token: bytes, count: int) -> None:
        self._host = host
        self._token = token
        self.count = count
        self.links = {index: WorkerLink(index) for index in range(count)}
        self._ids = itertools.count(1)
        # Events applied since the last flush, sent to every up worker once per loop turn.
        self._pending_events: list[bytes] = []
        self._pending_revision = 0
        self._pending_index = 0
        self._pending_time_ms = 0
        self._resend_state = False
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._all_up = asyncio.Event()
        # A leader accepted this node's process (see PlaneAdmitted).
        self._admitted = False
        # Raft lives on its disk reserve (see PlaneDisk).
        self._reserve_released = False

    # -- attaching ------------------------------------------------------------------------

    def attach(self, index: int, sock: socket.socket, restarts: int) -> None:
        """A new link to worker `index` (just started by the supervisor)."""
        link = self.links.get(index)
        if link is None:
            sock.close()
            log.error("supervisor handed over a link to unknown worker %d", index)
            return
        self._drop(link, "replaced by a new link")
        link.restarts = restarts
        link.task = asyncio.create_task(self._serve(link, sock), name=f"worker-link-{index}")

    def exited(self, index: int, how: str) -> None:
        link = self.links.get(index)
        if link is not None:
            log.warning("data worker %d exited (%s)", index, how)
            self._drop(link, how)

    def _drop(self, link: WorkerLink, why: str) -> None:
        if link.writer is not None:
            link.writer.transport.abort()
            link.writer = None
        if link.task is not None and not link.task.done():
            link.task.cancel()
        was_serving = bool(link.serving_terms)
        link.up = False
        link.serving_terms = {}
        for future in link.pending.values():
            if not future.done():
                future.set_exception(LinkBroken(f"worker {link.index}: {why}"))
        link.pending.clear()
        if was_serving:
            self._host.serving_changed()

    async def _serve(self, link: WorkerLink, sock: socket.socket) -> None:
        try:
            reader, writer = await open_link(sock)
        except OSError as error:
            log.error("worker %d: cannot open its link: %s", link.index, error)
            sock.close()
            return
        link.writer = writer
        try:
            hello = await asyncio.wait_for(read_message(reader, HELLO_MAX_BYTES), HELLO_TIMEOUT_S)
            if (
                hello is None
                or hello.WhichOneof("body") != "hello"
                or not hmac.compare_digest(hello.hello.token, self._token)
                or hello.hello.worker_index != link.index
            ):
                raise LinkBroken("the first frame is no valid hello")
            link.pid = hello.hello.pid
            link.grpc_address = hello.hello.grpc_address
            link.transfer_port = hello.hello.transfer_port
            # Whole state first; events applied meanwhile (at or below its revision) are
            # skipped by the worker, later ones follow in order.
            writer.write(
                encode(planes.PlaneMessage(state=planes.PlaneState(state=self._host.state_bytes())))
            )
            if self._admitted:
                writer.write(encode(planes.PlaneMessage(admitted=planes.PlaneAdmitted())))
            if self._reserve_released:
                writer.write(
                    encode(planes.PlaneMessage(disk=planes.PlaneDisk(raft_reserve_released=True)))
                )
            link.up = True
            log.info(
                "data worker %d up (pid %d, gRPC %s, transfer port %d)",
                link.index,
                link.pid,
                link.grpc_address,
                link.transfer_port,
            )
            if all(other.up or other.grpc_address for other in self.links.values()):
                self._all_up.set()
            self._host.serving_changed()
            while True:
                message = await read_message(reader, UP_FRAME_MAX_BYTES)
                if message is None:
                    raise LinkBroken("the worker closed its link")
                self._dispatch(link, message)
        except (LinkBroken, TimeoutError, OSError) as error:
            log.warning("data worker %d: link closed: %s", link.index, error)
        except asyncio.CancelledError:
            pass
        finally:
            if link.writer is writer:
                self._drop(link, "link closed")
            writer.transport.abort()

    def _dispatch(self, link: WorkerLink, message: planes.PlaneMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "propose":
            task = asyncio.create_task(self._propose(link, message.propose))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == "serving":
            link.serving_terms = dict(message.serving.serving_terms)
            self._host.serving_changed()
        elif kind == "status":
            if message.status.id:
                future = link.pending.pop(message.status.id, None)
                if future is not None and not future.done():
                    future.set_result(message)
            link.status = message.status
        elif kind == "metrics":
            future = link.pending.pop(message.metrics.id, None)
            if future is not None and not future.done():
                future.set_result(message)
        elif kind == "suspect":
            self._host.suspect(message.suspect.node_id)
        else:
            raise LinkBroken(f"unexpected message from worker {link.index}: {kind}")

    async def _propose(self, link: WorkerLink, request: planes.PlanePropose) -> None:
        answer = planes.PlaneProposeResult(id=request.id)
        try:
            command = pb.Command.FromString(request.command)
            result = await self._host.propose(command)
            answer.result = result.SerializeToString()
        except RaftwalError as error:
            answer.error.CopyFrom(error.info)
        except Exception as error:  # noqa: BLE001 - answered, so the worker never hangs
            log.exception("worker %d: proposal failed", link.index)
            answer.error.CopyFrom(error_info(E.INNER, f"proposal failed: {error!r}"[:300]))
        self._write(link, planes.PlaneMessage(propose_result=answer))

    def _write(self, link: WorkerLink, message: planes.PlaneMessage | bytes) -> None:
        writer = link.writer
        if writer is None or writer.transport.is_closing():
            return
        if writer.transport.get_write_buffer_size() > WRITE_BUFFER_MAX_BYTES:
            log.error(
                "data worker %d does not read its link (%d bytes waiting): dropping it",
                link.index,
                writer.transport.get_write_buffer_size(),
            )
            self._drop(link, "it stopped reading")
            return
        writer.write(message if isinstance(message, bytes) else encode(message))

    # -- the state, down ------------------------------------------------------------------

    def applied(
        self,
        events: list[tuple[str, bytes]],
        revision: int,
        raft_index: int,
        last_time_ms: int,
        restored: bool,
    ) -> None:
        """The replica applied an entry (called on the event loop, in apply order)."""
        if restored:
            self._resend_state = True
            self._pending_events.clear()
        else:
            self._pending_events.extend(
                data for kind, data in events if kind not in MIRROR_SKIPPED_KINDS
            )
        self._pending_revision = max(self._pending_revision, revision)
        self._pending_index = max(self._pending_index, raft_index)
        self._pending_time_ms = max(self._pending_time_ms, last_time_ms)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._resend_state:
            self._resend_state = False
            frame = encode(
                planes.PlaneMessage(state=planes.PlaneState(state=self._host.state_bytes()))
            )
        else:
            frame = encode(
                planes.PlaneMessage(
                    events=planes.PlaneEvents(
                        events=self._pending_events,
                        raft_index=self._pending_index,
                        last_time_ms=self._pending_time_ms,
                        revision=self._pending_revision,
                    )
                )
            )
        self._pending_events = []
        for link in self.links.values():
            if link.up:
                self._write(link, frame)

    # -- questions, up --------------------------------------------------------------------

    async def _ask(
        self, link: WorkerLink, message: planes.PlaneMessage, request_id: int, timeout_s: float
    ) -> planes.PlaneMessage | None:
        if not link.up:
            return None
        future: asyncio.Future[planes.PlaneMessage] = asyncio.get_running_loop().create_future()
        link.pending[request_id] = future
        self._write(link, message)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except (TimeoutError, LinkBroken):
            return None
        finally:
            link.pending.pop(request_id, None)

    async def metrics_pages(self, timeout_s: float = METRICS_WAIT_S) -> dict[int, bytes]:
        """Each up worker's metrics page (those that answer within `timeout_s`)."""

        async def one(link: WorkerLink) -> tuple[int, bytes | None]:
            request_id = next(self._ids)
            answer = await self._ask(
                link,
                planes.PlaneMessage(metrics_request=planes.PlaneMetricsRequest(id=request_id)),
                request_id,
                timeout_s,
            )
            return link.index, (answer.metrics.text if answer is not None else None)

        pages = await asyncio.gather(*(one(link) for link in self.links.values()))
        return {index: text for index, text in pages if text is not None}

    async def refresh_status(self, timeout_s: float = 1.0) -> None:
        """Ask every up worker for its status now (those that answer in time update it)."""

        async def one(link: WorkerLink) -> None:
            request_id = next(self._ids)
            await self._ask(
                link,
                planes.PlaneMessage(status_request=planes.PlaneStatusRequest(id=request_id)),
                request_id,
                timeout_s,
            )

        await asyncio.gather(*(one(link) for link in self.links.values()))

    def admit(self) -> None:
        """Tell every worker, now and at its hello, that the node was admitted."""
        if self._admitted:
            return
        self._admitted = True
        for link in self.links.values():
            if link.up:
                self._write(link, planes.PlaneMessage(admitted=planes.PlaneAdmitted()))

    def raft_reserve(self, released: bool) -> None:
        """Tell every worker, now and at its hello, whether Raft lives on its reserve."""
        self._reserve_released = released
        message = planes.PlaneMessage(disk=planes.PlaneDisk(raft_reserve_released=released))
        for link in self.links.values():
            if link.up:
                self._write(link, message)

    def disk_writes_refused(self) -> int:
        return sum(link.status.disk_writes_refused for link in self.links.values())

    def reconcile_now(self) -> None:
        for link in self.links.values():
            if link.up:
                self._write(link, planes.PlaneMessage(reconcile=planes.PlaneReconcile()))

    async def stop_all(self, timeout_s: float) -> None:
        """Ask every worker to close its data plane and exit; wait for their links to end
        (at most `timeout_s`)."""
        for link in self.links.values():
            if link.up:
                self._write(link, planes.PlaneMessage(stop=planes.PlaneStop()))
        tasks = [link.task for link in self.links.values() if link.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for link in self.links.values():
            self._drop(link, "stopping")

    # -- what the node reports ------------------------------------------------------------

    def serving_terms(self) -> dict[str, int]:
        terms: dict[str, int] = {}
        for link in self.links.values():
            terms.update(link.serving_terms)
        return terms

    def worker_addresses(self) -> list[str]:
        """Every worker's gRPC address once each has said hello at least once (the last
        known one of a worker that is restarting); [] before."""
        if any(not link.grpc_address for link in self.links.values()):
            return []
        return [self.links[index].grpc_address for index in range(self.count)]

    async def wait_all_up(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_up.wait(), timeout_s)
        return self._all_up.is_set()

    def problems(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for link in self.links.values():
            if not link.up:
                found[f"worker {link.index}"] = (
                    "data worker down (restarting)" if link.grpc_address else "data worker starting"
                )
            found.update(link.status.problems)
        return found


# -- the supervisor's channel to the control process --------------------------------------


#: The most a supervisor message takes (a JSON object; a new link comes with its socket).
SUPERVISOR_MESSAGE_MAX_BYTES = 4096


@dataclass(frozen=True)
class SupervisorNews:
    """What the supervisor tells the control process (over a SOCK_SEQPACKET socketpair,
    one message per datagram): ``worker`` (a new link to worker `index`, its socket
    attached) or ``exited`` (worker `index` exited, `how`)."""

    op: str
    index: int
    restarts: int = 0
    how: str = ""

    def encode(self) -> bytes:
        return json.dumps(
            {"op": self.op, "index": self.index, "restarts": self.restarts, "how": self.how}
        ).encode()


def supervisor_message(data: bytes) -> SupervisorNews:
    """Decode one supervisor message; raises ValueError on anything else."""
    try:
        raw = json.loads(data)
        news = SupervisorNews(
            op=str(raw["op"]),
            index=int(raw["index"]),
            restarts=int(raw.get("restarts", 0)),
            how=str(raw.get("how", ""))[:256],
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"undecodable supervisor message ({len(data)} bytes): {error}") from None
    if news.op not in ("worker", "exited") or not 0 <= news.index < 1024:
        raise ValueError(f"unexpected supervisor message {news}")
    return news
