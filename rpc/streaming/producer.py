"""The data plane's idempotent, batching ``Producer`` (``StreamingNode.Produce``).

``Producer`` batches per pchannel even when the caller sends one message at a time
(``linger_ms``, ``max_batch_messages``, ``max_batch_bytes``), keeps up to
``max_in_flight`` batches in flight per pchannel over one Produce stream per owner, and
stamps every batch with (``producer_id``, ``sequence``). A Produce stream is a connection
to the node's transfer port where the node offers one (``rpc.produce_stream``; the gRPC
call otherwise, or always with ``transfer_port=False``). After NOT_OWNER, CHANNEL_FENCED,
ON_SHUTDOWN, a transport failure or a silent owner, it resends every unacknowledged batch
of the pchannel, in sequence order and with the same sequences, to the (new) owner: the
server answers a batch it already holds with its original positions (``duplicate``), so
nothing is written twice.

``retry_timeout_s`` bounds retrying, not queueing: a batch has that long from its first
attempt, and a message still in the queue fails only once its pchannel acknowledged no
batch for that long (no owner, or a stuck pipeline). A message waiting behind others in a
full queue on a slow host is backpressure (``submit`` waits for room), not a failure: a
deep queue that a loaded host drains slower than ``retry_timeout_s`` used to fail healthy
sends, most visibly during a rolling restart.

``ProducerStats`` counts what it did. Every retry loop here is bounded in attempts and in
time, and only errors that another attempt can fix are retried. This module must never
resend a batch under a new sequence, nor send a pchannel's batches out of sequence order
after a failure; nor may it import ``rpc.streaming.client`` (which builds producers).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc

from rpc import append_stream, produce_stream
from rpc.aio import Signal, wait_event
from rpc.coordinator_client import CoordinatorClient
from rpc.errors import (
    ClientClosedError,
    InnerError,
    OnShutdownError,
    RaftwalError,
    UnavailableError,
    code_name,
    error_for,
    error_info,
)
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.routing import _Backoff, _invalid, unexpected_loop_error
from rpc.segment_transfer import transfer_host
from rpc.streaming.routing import (
    DATA_RETRYABLE_CODES,
    DEFAULT_ATTEMPT_TIMEOUT_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_TIMEOUT_S,
    MAX_NOT_EXIST_RETRIES,
    ROUTE_CHECK_S,
    WATCH_STALE_S,
    Position,
    Route,
    StreamingClientBase,
    _check_range,
    _classify_data,
    _message,
    _resolve,
    _unavailable,
)

# The logger name of the data-plane SDK since it was one module (rpc/streaming_client.py).
log = logging.getLogger("rpc.streaming_client")
E = errors_pb2

# The server remembers the last 8 batches of each producer per pchannel
# (wal_segments.owner.PRODUCER_HISTORY). A resent batch must still be in that window to be
# recognised as a duplicate, so no more batches than that may be unacknowledged at once.
SERVER_PRODUCER_HISTORY = 8
# Server limit (raftwal/services/streaming_node.py): messages per Produce batch.
MAX_BATCH_MESSAGES = 10_000
# Upper bound of the max_batch_bytes option: well under a node's gRPC message limit
# (grpc_max_message_bytes, 32 MiB by default); a larger request would break the whole
# Produce stream it travels on, not just fail its batch.
MAX_BATCH_BYTES = 16 << 20
# One message larger than this is refused by submit() for the same reason (the server
# itself refuses payloads over 8 MiB and keys over 1 MiB).
MAX_MESSAGE_BYTES = 10 << 20
MAX_LINGER_MS = 60_000
# A caller submitting in a loop gives the event loop a turn at least this often.
SUBMIT_YIELD_S = 0.005
MAX_PRODUCER_ID_CHARS = 128
# A Produce stream ended with these was refused before the node read any request: nothing
# of it was written, and another attempt with the same credentials is refused the same way.
STREAM_REFUSED_CODES = frozenset({E.UNAUTHENTICATED, E.PERMISSION_DENIED})


@dataclass
class ProducerStats:
    """Counters of one producer (monotonic; read them, never write them)."""

    #: Produce requests written, retries included
    batches_sent: int = 0
    #: batches acknowledged with positions (each batch once)
    batches_acknowledged: int = 0
    #: of those, batches the server answered from its producer table (a retry of a batch
    #: it already held)
    duplicates: int = 0
    messages_acknowledged: int = 0
    messages_failed: int = 0
    #: batches sent again after a failure (same sequence)
    retries: int = 0
    #: times a pchannel's pipeline was re-established after a failure
    recoveries: int = 0
    #: Produce streams opened on a node's transfer port (``rpc.produce_stream``)
    port_streams: int = 0
    #: Produce streams opened as the gRPC Produce call (``transfer_port=False``, or the
    #: node offered no ticket, or its port could not be reached)
    grpc_streams: int = 0


def _retrieve(future: asyncio.Future[Any]) -> None:
    # Callers may drop a future they got from submit(); its error is theirs to see, not a
    # "Future exception was never retrieved" warning at exit.
    if not future.cancelled():
        future.exception()


# ---------------------------------------------------------------------------------------
# Producer
# ---------------------------------------------------------------------------------------


class _StreamBroken(Exception):
    """A Produce stream ended before answering: the batch's outcome is unknown."""

    def __init__(self, info: errors_pb2.ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


class _ProduceStream:
    """One Produce stream to one owner, shared by every pchannel it owns. Requests are
    written in submission order by one writer task; results are matched by request id.
    When the stream breaks, every unanswered request fails with ``_StreamBroken``.

    The stream is a connection to the node's transfer port (``rpc.produce_stream``) when
    the node hands out a ticket for one (``OpenProduce``) and the port answers; else the
    gRPC Produce call. Both carry the same messages and fail the same ways."""

    def __init__(
        self,
        stub: streaming_pb2_grpc.StreamingNodeStub,
        address: str,
        tls: Callable[[], ssl.SSLContext | None] | None,
        stats: ProducerStats,
        port_unreachable: dict[str, float],
    ) -> None:
        self.address = address
        self.failure: errors_pb2.ErrorInfo | None = None
        self._stub = stub
        self._stats = stats
        # address -> until when its port is not tried again (it could not be reached)
        self._port_unreachable = port_unreachable
        # Set by _open: the gRPC call, or the port connection's two ends.
        self._call: Any = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        # Bounded by construction: each pchannel has at most max_in_flight batches
        # unanswered, so this holds at most max_in_flight x pchannels requests.
        self._outbox: asyncio.Queue[wire.ProduceRequest] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[wire.ProduceResult]] = {}
        self._request_ids = itertools.count(1)
        self._opening = asyncio.create_task(self._open(tls), name=f"produce-open:{address}")
        self._tasks = [
            self._opening,
            asyncio.create_task(self._write_loop(), name=f"produce-writer:{address}"),
            asyncio.create_task(self._read_loop(), name=f"produce-reader:{address}"),
        ]

    @property
    def over_port(self) -> bool:
        """Whether the stream is (or is being opened as) a transfer port connection."""
        return self._writer is not None

    async def _open(self, tls: Callable[[], ssl.SSLContext | None] | None) -> None:
        """The port connection if the node offers one and it opens, else the gRPC call.
        A failed OpenProduce call (the node is down, or refused the credentials) fails
        the stream, as the gRPC call itself would."""
        if tls is not None and self._port_unreachable.get(self.address, 0.0) <= time.monotonic():
            try:
                offer = await self._stub.OpenProduce(
                    wire.OpenProduceRequest(), timeout=produce_stream.OPEN_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                offer = wire.OpenProduceResponse()  # a node from before OpenProduce
            if offer.ticket:
                try:
                    reader, writer = await append_stream.connect(
                        transfer_host(self.address),
                        offer.port,
                        offer.ticket,
                        tls(),
                        hello=produce_stream.HELLO,
                    )
                except (append_stream.AppendRefused, OSError, TimeoutError) as error:
                    # A firewalled port costs up to CONNECT_TIMEOUT_S: not tried again for
                    # this node for a while.
                    self._port_unreachable[self.address] = (
                        time.monotonic() + produce_stream.RETRY_PORT_AFTER_S
                    )
                    log.info(
                        "Produce connection to %s port %d failed (%r); using the Produce "
                        "call for %g s",
                        self.address,
                        offer.port,
                        error,
                        produce_stream.RETRY_PORT_AFTER_S,
                    )
                else:
                    if self.failure is not None:
                        writer.transport.abort()
                        return
                    self._reader, self._writer = reader, writer
                    self._stats.port_streams += 1
                    return
        self._call = self._stub.Produce()
        self._stats.grpc_streams += 1

    def submit(self, template: wire.ProduceRequest) -> asyncio.Future[wire.ProduceResult]:
        future: asyncio.Future[wire.ProduceResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        if self.failure is not None:
            future.set_exception(_StreamBroken(self.failure))
            return future
        # A copy per attempt: an abandoned attempt may still sit in another stream's outbox.
        request = wire.ProduceRequest()
        request.CopyFrom(template)
        request.request_id = next(self._request_ids)
        self._waiting[request.request_id] = future
        self._outbox.put_nowait(request)
        return future

    def _locally_cancelled(self) -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _write_loop(self) -> None:
        try:
            await asyncio.shield(self._opening)
            while True:
                request = await self._outbox.get()
                writer = self._writer
                if writer is None:
                    await self._call.write(request)
                    continue
                # Everything queued meanwhile goes in one write (one send, one syscall).
                messages = [request.SerializeToString()]
                while not self._outbox.empty():
                    messages.append(self._outbox.get_nowait().SerializeToString())
                if writer.transport.is_closing():
                    raise ConnectionError(f"{self.address} closed the Produce connection")
                # Bounded: a node that stopped reading is given up after the idle timeout.
                await append_stream.send_all(writer, messages, append_stream.IDLE_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            self._break(_classify_data(error)[0])
        except asyncio.InvalidStateError:
            self._break(error_info(E.ON_SHUTDOWN, f"{self.address} closed the Produce stream"))
        except (ConnectionError, OSError, TimeoutError) as error:
            self._break(error_info(E.ON_SHUTDOWN, f"Produce connection to {self.address}: {error}"))
        except asyncio.CancelledError:
            if self._locally_cancelled():
                raise
            self._break(error_info(E.ON_SHUTDOWN, f"Produce stream to {self.address} cancelled"))
        except Exception as error:  # noqa: BLE001 (reported: every waiting batch fails with it)
            self._break(self._unexpected("writer", error))

    async def _next_result(self) -> wire.ProduceResult | None:
        reader = self._reader
        if reader is None:
            result = await self._call.read()
            return None if result is grpc.aio.EOF else result
        payload = await append_stream.read_frame(reader, produce_stream.MAX_RESULT_BYTES, None)
        return None if payload is None else wire.ProduceResult.FromString(payload)

    async def _read_loop(self) -> None:
        info = error_info(E.ON_SHUTDOWN, f"{self.address} ended the Produce stream")
        try:
            await asyncio.shield(self._opening)
            while True:
                result = await self._next_result()
                if result is None:
                    break
                if result.request_id == 0 and result.HasField("error"):
                    # The node refused the connection's last frame (rpc.produce_stream).
                    info = result.error
                    break
                future = self._waiting.pop(result.request_id, None)
                if future is not None and not future.done():
                    future.set_result(result)
        except grpc.aio.AioRpcError as error:
            info = _classify_data(error)[0]
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as error:
            info = error_info(E.ON_SHUTDOWN, f"Produce connection to {self.address}: {error!r}")
        except asyncio.CancelledError:
            if self._locally_cancelled():
                raise
        except Exception as error:  # noqa: BLE001 (reported: every waiting batch fails with it)
            # A frame over the cap or one that is no ProduceResult among them.
            info = self._unexpected("reader", error)
        self._break(info)

    def _unexpected(self, loop: str, error: BaseException) -> errors_pb2.ErrorInfo:
        # Outcome unknown, like any broken stream: the batches are resent with their
        # sequences (the server answers those it holds as duplicates).
        typed = unexpected_loop_error(f"the Produce stream {loop} to {self.address}", error)
        return error_info(E.ON_SHUTDOWN, typed.info.message)

    def _break(self, info: errors_pb2.ErrorInfo) -> None:
        if self.failure is not None:
            return
        log.debug("Produce stream to %s broke: %s", self.address, info.message)
        self.failure = info
        if self._call is not None:
            self._call.cancel()
        if self._writer is not None:
            self._writer.transport.abort()
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(_StreamBroken(info))
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        self._break(error_info(E.ON_SHUTDOWN, "producer closed"))
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


#: One Produce stream to one node for a caller that builds its own requests (the
#: cross-cluster replicator, raftwal/node/replicator.py): ``submit(request)`` answers a
#: future of its ProduceResult; a broken stream fails every unanswered request with
#: ``StreamBroken`` (outcome unknown) and sets ``failure``; ``close()`` ends it.
ProduceStream = _ProduceStream
StreamBroken = _StreamBroken


@dataclass(eq=False)
class _Pending:
    message: wire.Message
    size: int
    future: asyncio.Future[Position]
    enqueued: float
    deadline: float


@dataclass(eq=False)
class _Batch:
    sequence: int
    items: list[_Pending]
    request: wire.ProduceRequest
    size: int
    deadline: float
    attempts: int = 0
    not_exist_retries: int = 0
    sent_at: float = 0.0
    address: str = ""
    term: int = 0
    attempt: asyncio.Future[wire.ProduceResult] | None = None


def _initial_sequence() -> int:
    # Wall-clock microseconds: a new Producer that reuses a producer_id starts above the
    # sequences an earlier one used (the server refuses an old sequence it no longer
    # remembers) as long as fewer than a million batches per second were sent.
    return time.time_ns() // 1000


@dataclass(eq=False)
class _Lane:
    """One pchannel's pipeline: pending messages, unacknowledged batches in sequence order,
    and the worker task that moves them."""

    pchannel: str
    next_sequence: int
    backoff: _Backoff
    pending: deque[_Pending] = field(default_factory=deque)
    pending_bytes: int = 0
    inflight: list[_Batch] = field(default_factory=list)
    wake: Signal = field(default_factory=Signal)
    stream: _ProduceStream | None = None
    route: Route | None = None
    failure: errors_pb2.ErrorInfo | None = None
    failed_at: tuple[str, int] = ("", 0)
    task: asyncio.Task[None] | None = None
    # When a batch of the lane was last acknowledged (or the lane began): queued messages
    # wait for a route and a free slot until retry_timeout_s after it.
    progress_at: float = field(default_factory=time.monotonic)

    def queue_deadline(self, retry_timeout_s: float) -> float:
        """Until when the oldest queued message may wait (inf when none waits): its own
        deadline (retry_timeout_s after it was submitted), pushed on by progress."""
        if not self.pending:
            return float("inf")
        return max(self.pending[0].deadline, self.progress_at + retry_timeout_s)


class Producer:
    """Idempotent, batching producer (see the module docstring).

    ``send`` waits for the message's position; ``submit`` only waits for room in the
    bounded queue (``max_pending_messages`` / ``max_pending_bytes`` unacknowledged) and
    returns a future, so a loop of ``submit`` calls (or many concurrent ``send`` calls)
    fills batches. On one pchannel, positions follow submission order.

    Failures: a send fails with a typed error when the server refuses its batch for a reason
    retrying cannot fix (INVALID_ARGUMENT, ...). What the client can check (reserved or NUL
    properties, size) is refused by ``submit`` itself; anything else the server refuses
    (an unknown ``msg_type``, ...) fails the whole batch the message travelled in: use
    ``max_batch_messages=1`` where one message must never affect another. A send fails with
    UnavailableError when its batch could not be acknowledged within ``retry_timeout_s`` of
    its first attempt or in ``max_attempts`` attempts, or when it waited in the queue while
    its pchannel acknowledged nothing for ``retry_timeout_s`` (time in a queue that is
    draining is not counted: see the module docstring): a sent batch's outcome is then
    unknown, and the later unacknowledged batches of that pchannel fail too, so that nothing is written out of
    order behind it. The server keeps gaps in a producer's sequences legal, so ordering
    after a failure relies on it failing a pchannel's batches from the first failed one on
    (as NOT_OWNER, CHANNEL_FENCED and shutdowns do); a retried batch the server no longer
    recognises fails with InvalidRequestSeqError rather than being written out of order.

    A ``producer_id`` may be reused by a later Producer: sequences start at the wall clock
    in microseconds, above those an earlier one used.
    """

    def __init__(
        self,
        client_or_endpoints: StreamingClientBase | CoordinatorClient | str | Sequence[str],
        *,
        producer_id: str | None = None,
        linger_ms: float = 2,
        max_batch_messages: int = 500,
        max_batch_bytes: int = 1 << 20,
        max_in_flight: int = 8,
        retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        max_pending_messages: int = 100_000,
        max_pending_bytes: int = 64 << 20,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
        transfer_port: bool = True,
    ) -> None:
        producer_id = producer_id if producer_id is not None else uuid.uuid4().hex
        if not 1 <= len(producer_id) <= MAX_PRODUCER_ID_CHARS:
            raise _invalid(
                f"invalid producer_id ({producer_id[:32]!r}; expected 1..{MAX_PRODUCER_ID_CHARS} "
                "chars)"
            )
        _check_range("linger_ms", linger_ms, 0, MAX_LINGER_MS)
        _check_range("max_batch_messages", max_batch_messages, 1, MAX_BATCH_MESSAGES)
        _check_range("max_batch_bytes", max_batch_bytes, 1, MAX_BATCH_BYTES)
        _check_range("max_in_flight", max_in_flight, 1, SERVER_PRODUCER_HISTORY)
        _check_range("retry_timeout_s", retry_timeout_s, 0.001, 3600)
        _check_range("max_attempts", max_attempts, 1, 1000)
        _check_range("attempt_timeout_s", attempt_timeout_s, 0.001, 3600)
        _check_range("max_pending_messages", max_pending_messages, 1, 10_000_000)
        _check_range("max_pending_bytes", max_pending_bytes, 1, 1 << 34)
        _check_range("backoff_initial_s", backoff_initial_s, 0.001, 60)
        _check_range("backoff_max_s", backoff_max_s, backoff_initial_s, 60)
        self.producer_id = producer_id
        self.linger_s = linger_ms / 1000
        self.max_batch_messages = int(max_batch_messages)
        self.max_batch_bytes = int(max_batch_bytes)
        self.max_in_flight = int(max_in_flight)
        self.retry_timeout_s = retry_timeout_s
        self.max_attempts = int(max_attempts)
        self.attempt_timeout_s = attempt_timeout_s
        self.max_pending_messages = int(max_pending_messages)
        self.max_pending_bytes = int(max_pending_bytes)
        self._backoff_s = (backoff_initial_s, backoff_max_s)
        #: Produce over nodes' transfer ports where they offer it (False: always the gRPC
        #: Produce call, e.g. where a firewall passes the gRPC port only)
        self.transfer_port = bool(transfer_port)
        self.stats = ProducerStats()
        self._client, self._owns_client = _resolve(client_or_endpoints)
        self._lanes: dict[str, _Lane] = {}
        self._streams: dict[str, _ProduceStream] = {}
        self._port_unreachable: dict[str, float] = {}
        self._unacked_messages = 0
        self._unacked_bytes = 0
        self._room = asyncio.Event()
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._yielded_at = 0.0

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def flush(self) -> None:
        """Send what is queued without lingering and wait until every message submitted so
        far is acknowledged or failed (bounded by ``retry_timeout_s``). It does not raise
        for failed messages: their futures (``send``) do."""
        futures = [
            item.future
            for lane in self._lanes.values()
            for item in itertools.chain(lane.pending, (i for b in lane.inflight for i in b.items))
            if not item.future.done()
        ]
        if not futures:
            return
        self._flushing += 1
        self._wake_all()
        try:
            await asyncio.wait(futures)
        finally:
            self._flushing -= 1

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop (idempotent). After `timeout_s` (default: as long as retries
        may take) what is still unacknowledged fails with OnShutdownError."""
        if self._closed:
            return
        self._closing = True
        self._wake_all()
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        if tasks:
            done, running = await asyncio.wait(tasks, timeout=timeout_s)
            for task in running:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._closed = True
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            await stream.close()
        if self._owns_client:
            await self._client.close()

    def _wake_all(self) -> None:
        for lane in self._lanes.values():
            lane.wake.set()

    # -- sending --------------------------------------------------------------------

    async def submit(
        self,
        vchannel: str,
        payload: bytes | str,
        *,
        key: bytes | str = b"",
        msg_type: str = "message",
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Position]:
        """Queue one message (waiting for room in the bounded queue) and return the future
        of its position."""
        if self._closing or self._closed:
            raise RuntimeError("Producer is closed")
        message = _message(vchannel, payload, key, msg_type, properties)
        pchannel = self._client.router.cached_pchannel(vchannel)
        if pchannel is None:
            pchannel = await self._client.router.pchannel_of(vchannel, self.retry_timeout_s)
        size = message.ByteSize()
        if size > MAX_MESSAGE_BYTES:
            raise _invalid(
                f"message too large ({size} bytes serialized; expected <= {MAX_MESSAGE_BYTES})"
            )
        while self._unacked_messages > 0 and (
            self._unacked_messages >= self.max_pending_messages
            or self._unacked_bytes + size > self.max_pending_bytes
        ):
            self._room.clear()
            await self._room.wait()
        if self._closing or self._closed:
            raise RuntimeError("Producer is closed")
        lane = self._lane(pchannel)
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        now = time.monotonic()
        lane.pending.append(_Pending(message, size, future, now, now + self.retry_timeout_s))
        lane.pending_bytes += size
        self._unacked_messages += 1
        self._unacked_bytes += size
        lane.wake.set()
        if now - self._yielded_at >= SUBMIT_YIELD_S:
            # Let the lanes send, the answers in and the routing watch run. Without this,
            # a loop of submit() calls that find room never gives the event loop up until
            # the queue is full: on a host with little CPU to spare that was tens of
            # seconds of nothing sent, and the first messages ran out of retry_timeout_s
            # before their batch ever left.
            self._yielded_at = now
            await asyncio.sleep(0)
        return future

    async def send(
        self,
        vchannel: str,
        payload: bytes | str,
        *,
        key: bytes | str = b"",
        msg_type: str = "message",
        properties: Mapping[str, str] | None = None,
    ) -> Position:
        """Send one message and wait for its position. Cancelling the caller does not
        withdraw the message."""
        future = await self.submit(
            vchannel, payload, key=key, msg_type=msg_type, properties=properties
        )
        return await asyncio.shield(future)

    async def send_batch(
        self,
        vchannel: str,
        payloads: Iterable[bytes | str],
        *,
        key: bytes | str = b"",
        msg_type: str = "message",
        properties: Mapping[str, str] | None = None,
    ) -> list[Position]:
        """Send several messages of one vchannel (in order) and wait for all positions;
        raises the first error."""
        futures = [
            await self.submit(vchannel, p, key=key, msg_type=msg_type, properties=properties)
            for p in payloads
        ]
        self._flushing += 1
        self._wake_all()
        try:
            return list(await asyncio.gather(*[asyncio.shield(f) for f in futures]))
        finally:
            self._flushing -= 1

    # -- lanes ----------------------------------------------------------------------

    def _lane(self, pchannel: str) -> _Lane:
        lane = self._lanes.get(pchannel)
        if lane is None:
            lane = _Lane(pchannel, _initial_sequence(), _Backoff(*self._backoff_s))
            self._lanes[pchannel] = lane
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._run(lane), name=f"producer:{pchannel}")
        return lane

    def _stream_for(self, address: str) -> _ProduceStream:
        stream = self._streams.get(address)
        if stream is None or stream.failure is not None:
            stream = _ProduceStream(
                self._client.stub(address),
                address,
                self._client.transfer_tls if self.transfer_port else None,
                self.stats,
                self._port_unreachable,
            )
            self._streams[address] = stream
        return stream

    def _release(self, items: Sequence[_Pending]) -> None:
        self._unacked_messages -= len(items)
        self._unacked_bytes -= sum(item.size for item in items)
        self._room.set()

    async def _run(self, lane: _Lane) -> None:
        try:
            while True:
                lane.wake.clear()
                self._collect(lane)
                if lane.failure is not None:
                    await self._recover(lane)
                    continue
                now = time.monotonic()
                self._expire_pending(lane, now, None)
                await self._send_ready(lane)
                if self._closing and not lane.pending and not lane.inflight:
                    return
                await wait_event(lane.wake, self._next_timer(lane))
        except BaseException as error:
            # Never leave a caller waiting on a future nobody will resolve.
            failure = (
                OnShutdownError(error_info(E.ON_SHUTDOWN, "producer closed"))
                if isinstance(error, asyncio.CancelledError)
                else InnerError(error_info(E.INNER, f"producer failed: {error!r}"))
            )
            if not isinstance(error, asyncio.CancelledError):
                log.exception("producer lane %s failed", lane.pchannel)
            for batch in list(lane.inflight):
                self._fail_batch(lane, batch, failure)
            items = list(lane.pending)
            lane.pending.clear()
            lane.pending_bytes = 0
            self._fail_items(items, failure)
            raise

    def _next_timer(self, lane: _Lane) -> float | None:
        """Seconds until the lane has something to do without being woken."""
        now = time.monotonic()
        timers = [b.sent_at + self.attempt_timeout_s - now for b in lane.inflight]
        if lane.inflight:
            timers.append(ROUTE_CHECK_S)
        if lane.pending:
            oldest = lane.pending[0]
            timers.append(lane.queue_deadline(self.retry_timeout_s) - now)
            if len(lane.inflight) < self.max_in_flight:
                timers.append(oldest.enqueued + self.linger_s - now)
        return max(0.0, min(timers)) if timers else None

    def _collect(self, lane: _Lane) -> None:
        """Apply the answers that arrived; a retryable failure marks the lane for recovery."""
        now = time.monotonic()
        route = self._client.router.route(lane.pchannel)
        for batch in list(lane.inflight):
            attempt = batch.attempt
            if attempt is None:
                continue
            if not attempt.done():
                if now - batch.sent_at > self.attempt_timeout_s:
                    self._mark_failed(
                        lane,
                        batch,
                        error_info(
                            E.ON_SHUTDOWN,
                            f"{batch.address} did not answer batch {batch.sequence} of "
                            f"{lane.pchannel} within {self.attempt_timeout_s:g} s",
                        ),
                    )
                elif route is not None and route.assigned and route.term > batch.term:
                    # A silent owner (stopped, partitioned) never fails its streams: move
                    # on as soon as the pchannel is served at a newer term.
                    self._mark_failed(
                        lane,
                        batch,
                        error_info(
                            E.CHANNEL_FENCED,
                            f"{lane.pchannel} moved to {route.owner_address} at term "
                            f"{route.term} while batch {batch.sequence} waited at "
                            f"{batch.address} (term {batch.term})",
                            current_term=route.term,
                        ),
                    )
                elif now - batch.sent_at > WATCH_STALE_S:
                    self._client.router.refresh_if_stale(lane.pchannel)
                continue
            try:
                result = attempt.result()
            except _StreamBroken as broken:
                if broken.info.code in STREAM_REFUSED_CODES:
                    self._fail_batch(lane, batch, error_for(broken.info))
                else:
                    self._mark_failed(lane, batch, broken.info)
                continue
            if result.HasField("error") and result.error.code != E.OK:
                code = result.error.code
                if code in DATA_RETRYABLE_CODES:
                    self._mark_failed(lane, batch, result.error)
                elif (
                    code == E.CHANNEL_NOT_EXIST and batch.not_exist_retries < MAX_NOT_EXIST_RETRIES
                ):
                    batch.not_exist_retries += 1
                    self._mark_failed(lane, batch, result.error)
                else:
                    self._fail_batch(lane, batch, error_for(result.error))
                continue
            if len(result.time_ticks) != len(batch.items):
                self._fail_batch(
                    lane,
                    batch,
                    InnerError(
                        error_info(
                            E.INNER,
                            f"{batch.address} answered {len(result.time_ticks)} positions for a "
                            f"batch of {len(batch.items)} messages",
                        )
                    ),
                )
                continue
            lane.inflight.remove(batch)
            lane.backoff.reset()
            lane.progress_at = now
            self.stats.batches_acknowledged += 1
            self.stats.messages_acknowledged += len(batch.items)
            if result.duplicate:
                self.stats.duplicates += 1
            for index, (item, tick) in enumerate(zip(batch.items, result.time_ticks, strict=True)):
                if not item.future.done():
                    item.future.set_result(Position(lane.pchannel, result.first_lsn + index, tick))
            self._release(batch.items)

    def _mark_failed(self, lane: _Lane, batch: _Batch, info: errors_pb2.ErrorInfo) -> None:
        log.debug(
            "batch %d of %s at %s failed: %s: %s",
            batch.sequence,
            lane.pchannel,
            batch.address,
            code_name(info.code),
            info.message,
        )
        batch.attempt = None
        if lane.failure is None:
            lane.failure = info
            lane.failed_at = (batch.address, batch.term)

    def _fail_items(self, items: Sequence[_Pending], error: BaseException) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)
        self.stats.messages_failed += len(items)
        if items:
            self._release(items)

    def _fail_batch(self, lane: _Lane, batch: _Batch, error: BaseException) -> None:
        if batch in lane.inflight:
            lane.inflight.remove(batch)
        self._fail_items(batch.items, error)

    def _expire_pending(self, lane: _Lane, now: float, error: BaseException | None) -> None:
        """Fail queued messages whose deadline passed (with `error` when given: no owner
        could be found before then): retry_timeout_s after they were submitted, and after
        the lane last made progress."""
        expired: list[_Pending] = []
        while lane.pending and lane.queue_deadline(self.retry_timeout_s) <= now:
            item = lane.pending.popleft()
            lane.pending_bytes -= item.size
            expired.append(item)
        if expired:
            message = (
                f"{len(expired)} message(s) for {lane.pchannel} could not be sent within "
                f"retry_timeout_s {self.retry_timeout_s:g}"
            )
            if error is None and lane.failure is None:
                # No error was seen: the pchannel acknowledged nothing for that long (an
                # owner that answers nothing). Not a shutdown, which the code used to say.
                error = UnavailableError(
                    error_info(
                        E.UNAVAILABLE,
                        f"{message}, while no batch of it was acknowledged (no error was seen)",
                    )
                )
            self._fail_items(expired, error or _unavailable(message, lane.failure))

    def _expire_inflight(self, lane: _Lane, info: errors_pb2.ErrorInfo | None) -> None:
        """Give up on the first batch out of time or attempts and on every later one (they
        must not be written behind a batch whose outcome is unknown)."""
        now = time.monotonic()
        for index, batch in enumerate(lane.inflight):
            out_of_time = batch.deadline <= now
            if out_of_time or batch.attempts >= self.max_attempts:
                reason = (
                    f"within retry_timeout_s {self.retry_timeout_s:g}"
                    if out_of_time
                    else f"in max_attempts {self.max_attempts}"
                )
                doomed = lane.inflight[index:]
                for later in doomed:
                    error = _unavailable(
                        f"batch {later.sequence} of {lane.pchannel} ({len(later.items)} "
                        f"messages) was not acknowledged {reason} (outcome unknown"
                        + (
                            f"; it was sent after unacknowledged batch {batch.sequence})"
                            if later is not batch
                            else ")"
                        ),
                        info,
                    )
                    self._fail_batch(lane, later, error)
                return

    async def _connect(self, lane: _Lane, deadline: float) -> None:
        route = await self._client.router.owner(lane.pchannel, deadline - time.monotonic())
        lane.route = route
        lane.stream = self._stream_for(route.owner_address)

    def _submit(self, lane: _Lane, batch: _Batch) -> None:
        assert lane.stream is not None and lane.route is not None
        batch.attempts += 1
        batch.sent_at = time.monotonic()
        batch.address = lane.route.owner_address
        batch.term = lane.route.term
        batch.attempt = lane.stream.submit(batch.request)
        batch.attempt.add_done_callback(lambda _: lane.wake.set())
        self.stats.batches_sent += 1
        if batch.attempts > 1:
            self.stats.retries += 1

    def _ready_to_cut(self, lane: _Lane) -> bool:
        if not lane.pending or len(lane.inflight) >= self.max_in_flight:
            return False
        if (
            self._flushing
            or self._closing
            or len(lane.pending) >= self.max_batch_messages
            or lane.pending_bytes >= self.max_batch_bytes
        ):
            return True
        return time.monotonic() - lane.pending[0].enqueued >= self.linger_s

    def _cut(self, lane: _Lane) -> _Batch:
        items: list[_Pending] = []
        size = 0
        while lane.pending and len(items) < self.max_batch_messages:
            item = lane.pending[0]
            if items and size + item.size > self.max_batch_bytes:
                break
            lane.pending.popleft()
            lane.pending_bytes -= item.size
            items.append(item)
            size += item.size
        sequence = lane.next_sequence
        lane.next_sequence += 1
        first = items[0].message
        if all(
            item.message.vchannel == first.vchannel
            and item.message.msg_type == first.msg_type
            and not item.message.key
            and not item.message.properties
            for item in items
        ):
            # Plain messages of one vchannel: the compact form, cheaper on both ends.
            request = wire.ProduceRequest(
                pchannel=lane.pchannel,
                batch_vchannel=first.vchannel,
                batch_msg_type=first.msg_type,
                payloads=[item.message.payload for item in items],
                producer_id=self.producer_id,
                sequence=sequence,
            )
        else:
            request = wire.ProduceRequest(
                pchannel=lane.pchannel,
                messages=[item.message for item in items],
                producer_id=self.producer_id,
                sequence=sequence,
            )
        # Retried for retry_timeout_s from now, its first attempt (however long its
        # messages queued while the pipeline moved).
        return _Batch(sequence, items, request, size, time.monotonic() + self.retry_timeout_s)

    async def _send_ready(self, lane: _Lane) -> None:
        while self._ready_to_cut(lane):
            if lane.stream is None or lane.stream.failure is not None:
                deadline = lane.queue_deadline(self.retry_timeout_s)
                try:
                    await self._connect(lane, deadline)
                except ClientClosedError as error:
                    items = list(lane.pending)
                    lane.pending.clear()
                    lane.pending_bytes = 0
                    self._fail_items(items, error)
                    return
                except UnavailableError as error:
                    now = time.monotonic()
                    self._expire_pending(lane, now, error)
                    if lane.pending:
                        delay = lane.backoff.next_delay(
                            lane.queue_deadline(self.retry_timeout_s) - now
                        )
                        await asyncio.sleep(delay)
                    return
                except RaftwalError as error:
                    items = list(lane.pending)
                    lane.pending.clear()
                    lane.pending_bytes = 0
                    self._fail_items(items, error)
                    return
            # Answers may have arrived while connecting: never send past a failed batch.
            self._collect(lane)
            if lane.failure is not None or not self._ready_to_cut(lane):
                return
            batch = self._cut(lane)
            lane.inflight.append(batch)
            self._submit(lane, batch)

    async def _recover(self, lane: _Lane) -> None:
        """Re-establish the pipeline after a failure: every unacknowledged batch is sent
        again, in sequence order, to the owner the routing table names now."""
        info = lane.failure
        lane.failure = None
        address, term = lane.failed_at
        self._client.router.report_failure(lane.pchannel, address, term, info)
        lane.stream = None
        self.stats.recoveries += 1
        for batch in lane.inflight:
            # Abandon the outstanding attempts: a late answer to one is ignored (its resend
            # gets the same positions back as a duplicate).
            batch.attempt = None
        while True:
            self._expire_inflight(lane, info)
            if not lane.inflight:
                return
            deadline = min(batch.deadline for batch in lane.inflight)
            await asyncio.sleep(lane.backoff.next_delay(deadline - time.monotonic()))
            try:
                await self._connect(lane, deadline)
            except ClientClosedError as error:
                for batch in list(lane.inflight):
                    self._fail_batch(lane, batch, error)
                return
            except UnavailableError as error:
                info = error.info
                continue
            except RaftwalError as error:
                for batch in list(lane.inflight):
                    self._fail_batch(lane, batch, error)
                return
            log.info(
                "resending %d batch(es) of %s (sequences %d..%d) to %s at term %d",
                len(lane.inflight),
                lane.pchannel,
                lane.inflight[0].sequence,
                lane.inflight[-1].sequence,
                lane.route.owner_address if lane.route else "?",
                lane.route.term if lane.route else 0,
            )
            for batch in lane.inflight:
                self._submit(lane, batch)
            return
