"""The Append stream over the transfer port: WAL replication without gRPC.

A pchannel's owner replicates to each replica over one long-lived stream of
`AppendRequest` messages, answered by `AppendResponse` messages (pipelined; the replica
may fold ready answers into one). Over grpc.aio each message costs a few tens of
microseconds of Python in each process (docs/benchmarks-history.md, "The half-load tail, measured
again"); here the same messages go length-prefixed over a plain TCP connection.

The owner first asks the replica for a ticket with `Replication.OpenAppend`, an
authenticated gRPC call like any other node-to-node call. It then connects to the
replica's transfer port (the segment transfer port: `rpc.segment_transfer`), sends
`HELLO` and the ticket, and reads one status byte. Before a ticket matched, the replica
reads exactly ``len(HELLO) + TICKET_BYTES`` bytes within `HELLO_TIMEOUT_S` and nothing else,
as for segment transfers: nothing the connection sends is parsed as protobuf before that.
A ticket is 32 random bytes, good for one connection and a few seconds.

After `ACCEPTED` each direction carries frames: a 4-byte big-endian length, then that many
bytes of one serialized message (requests from the owner, answers from the replica). A
length over the reader's cap (the replica: the gRPC message size limit,
``grpc_max_message_bytes``, which bounded the Append call too; the owner:
`MAX_ANSWER_BYTES`) closes the connection. Each side gives up on a connection that sent no
frame within `IDLE_TIMEOUT_S` (the owner heartbeats an idle stream every second), or
whose writes did not drain within it (a peer that stopped reading, e.g. SIGSTOP).

On the node's side a frame's bytes are held in memory until the whole frame arrived, so
they are bounded twice: every partly received frame of every stream connection of a node
reserves its declared length in one `FrameBudget` when its header arrives (past the
budget the frame is refused with RESOURCE_EXHAUSTED and the connection closed, before
any of its bytes are read), and the rest of a frame must arrive within
`frame_deadline_s(length)` of its header (a few seconds), or the connection is cut.

When the gRPC port uses TLS, so does this one, with the same certificates
(`rpc.segment_transfer.client_tls`).

This module is the protocol's constants, its framing and the owner's connect; the replica's
side is `raftwal.services.segment_transfer` (the port) and
`raftwal.services.replication` (the messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from rpc.protos import errors_pb2
from rpc.segment_transfer import ACCEPTED, HELLO_TIMEOUT_S, TICKET_BYTES

#: What an owner sends first, before its ticket (the protocol's name and version).
HELLO = b"RWAPPND1"
#: The frame header: the length of the message that follows.
LENGTH = struct.Struct(">I")
#: A connection that sent no frame for this long is closed by either side.
IDLE_TIMEOUT_S = 10.0
#: How long the owner waits for the connection, the TLS handshake and the status byte.
CONNECT_TIMEOUT_S = 3.0
#: The largest answer the owner reads (an AppendResponse is a few dozen bytes, an error
#: message at most a few hundred).
MAX_ANSWER_BYTES = 1 << 20
#: Bytes the stream reader buffers ahead of the frame it reads.
READ_BUFFER_BYTES = 1 << 20
#: A writer waits for the socket (`drain`, with a timeout) only once this much is queued:
#: below it a write costs no wait at all (a `wait_for` per frame cost a task each).
DRAIN_ABOVE_BYTES = 64 * 1024

#: Once a frame's header arrived, the rest must come within FRAME_DEADLINE_S plus its
#: length at MIN_FRAME_BYTES_PER_S (32 MiB: 13 s): a sender that stalls mid-frame is cut.
FRAME_DEADLINE_S = 5.0
MIN_FRAME_BYTES_PER_S = 4 << 20
#: The default of ``frame_buffer_budget_bytes``: bytes of partly received frames a node
#: holds across all its Append and Produce connections.
DEFAULT_FRAME_BUDGET_BYTES = 64 << 20

assert len(HELLO) == 8 and HELLO_TIMEOUT_S > 0

M = TypeVar("M", bound=Message)


def frame_deadline_s(length: int) -> float:
    """How long the body of a frame of `length` bytes may take after its header."""
    return FRAME_DEADLINE_S + length / MIN_FRAME_BYTES_PER_S


class FrameTooLarge(Exception):
    """A frame header announced more bytes than the reader's cap."""


class FrameBudgetFull(Exception):
    """A frame header announced more bytes than the node's frame budget has left."""


class FrameStalled(Exception):
    """A frame's body did not arrive within `frame_deadline_s` of its header."""


class FrameBudget:
    """The bytes of partly received frames one node holds, across all its stream
    connections: a frame reserves its declared length when its header arrived and gives
    it back once it was read whole (or its connection ended). `counts` gets
    "frames_refused" (budget full) and "frames_stalled" (cut mid-frame)."""

    def __init__(self, budget_bytes: int, counts: dict[str, int] | None = None) -> None:
        if budget_bytes < 1:
            raise ValueError(f"invalid frame budget ({budget_bytes} bytes; expected >= 1)")
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self.counts = counts if counts is not None else {}
        self.counts.setdefault("frames_refused", 0)
        self.counts.setdefault("frames_stalled", 0)

    def reserve(self, length: int) -> None:
        """Take `length` bytes; FrameBudgetFull (counted) when they do not fit."""
        if self.used_bytes + length > self.budget_bytes:
            self.counts["frames_refused"] += 1
            raise FrameBudgetFull(
                f"frame of {length:,} bytes refused: the node holds {self.used_bytes:,} "
                f"bytes of partly received frames (expected at most {self.budget_bytes:,} "
                "in all, frame_buffer_budget_bytes; retry later)"
            )
        self.used_bytes += length

    def release(self, length: int) -> None:
        self.used_bytes -= length
        assert self.used_bytes >= 0, self.used_bytes


class AppendRefused(Exception):
    """The replica refused the ticket or closed the connection before answering."""


def frame(message: bytes) -> bytes:
    """One frame: the length, then `message`."""
    return LENGTH.pack(len(message)) + message


async def read_frame(
    reader: asyncio.StreamReader,
    max_bytes: int,
    timeout_s: float | None,
    budget: FrameBudget | None = None,
) -> bytes | None:
    """The next frame's message, or None at a clean end of the stream (between frames).
    FrameTooLarge over `max_bytes`; TimeoutError when no header came within `timeout_s`
    (None: no limit; with `budget`, FrameStalled when the body did not follow within
    `frame_deadline_s`, and the whole frame must come within `timeout_s` otherwise);
    FrameBudgetFull when `budget` cannot hold the frame; asyncio.IncompleteReadError
    when the stream ends inside a frame."""
    async with asyncio.timeout(timeout_s) as idle:
        try:
            header = await reader.readexactly(LENGTH.size)
        except asyncio.IncompleteReadError as error:
            if not error.partial:
                return None
            raise
        (length,) = LENGTH.unpack(header)
        if length > max_bytes:
            raise FrameTooLarge(f"frame of {length:,} bytes (expected at most {max_bytes:,})")
        if budget is None:
            return await reader.readexactly(length)
        # The idle timeout covered the wait for a header; the body has its own deadline.
        idle.reschedule(None)
    budget.reserve(length)
    try:
        deadline_s = frame_deadline_s(length)
        try:
            async with asyncio.timeout(deadline_s):
                return await reader.readexactly(length)
        except TimeoutError:
            budget.counts["frames_stalled"] += 1
            raise FrameStalled(
                f"frame of {length:,} bytes not received whole within {deadline_s:.1f} s of "
                f"its header ({len(reader._buffer):,} bytes came; expected "  # noqa: SLF001
                f"at least {MIN_FRAME_BYTES_PER_S:,} bytes/s)"
            ) from None
    finally:
        budget.release(length)


class StreamEnd:
    """Why `read_messages` stopped, for the log of whoever served the stream."""

    def __init__(self) -> None:
        self.reason = "closed by the peer"


async def read_messages(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    max_bytes: int,
    idle_timeout_s: float,
    new_message: Callable[[], M],
    end: StreamEnd,
    refusal: Callable[[str, int], Message] | None = None,
    budget: FrameBudget | None = None,
) -> AsyncIterator[M]:
    """The messages a node reads from an accepted stream connection, one per frame, until
    the peer closes or resets it, sends nothing for `idle_timeout_s`, stalls inside a frame
    (`budget`: see `read_frame`), or sends a frame over `max_bytes`, over what `budget`
    has left, or one that does not parse as `new_message()`'s type. Nothing more is read
    after a bad frame: the connection is aborted, or, given `refusal`, sent
    `refusal(reason, error code)` as a last frame and closed. `end.reason` says why it
    ended."""
    while True:
        try:
            payload = await read_frame(reader, max_bytes, idle_timeout_s, budget)
        except TimeoutError:
            end.reason = f"no frame within {idle_timeout_s:g} s"
            return
        except FrameStalled as error:
            end.reason = str(error)
            writer.transport.abort()
            return
        except FrameBudgetFull as error:
            end.reason = str(error)
            _refuse(writer, refusal, end.reason, errors_pb2.RESOURCE_EXHAUSTED)
            return
        except FrameTooLarge as error:
            end.reason = str(error)
            _refuse(writer, refusal, end.reason, errors_pb2.INVALID_ARGUMENT)
            return
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as error:
            end.reason = repr(error)
            return
        if payload is None:
            return
        message = new_message()
        try:
            message.ParseFromString(payload)
        except DecodeError as error:
            end.reason = (
                f"a frame of {len(payload):,} bytes does not parse as "
                f"{message.DESCRIPTOR.full_name} ({error}; expected a serialized "
                f"{message.DESCRIPTOR.full_name} with valid UTF-8 in its string fields)"
            )
            _refuse(writer, refusal, end.reason, errors_pb2.INVALID_ARGUMENT)
            return
        yield message


def _refuse(
    writer: asyncio.StreamWriter,
    refusal: Callable[[str, int], Message] | None,
    reason: str,
    code: int,
) -> None:
    if refusal is None or writer.transport.is_closing():
        writer.transport.abort()
        return
    # Best effort: a peer still sending the rest of an oversized frame may get a reset
    # before it reads this.
    writer.write(frame(refusal(reason, code).SerializeToString()))
    writer.transport.close()


async def serve_messages(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    max_bytes: int,
    idle_timeout_s: float,
    new_message: Callable[[], M],
    answer: Callable[[AsyncIterator[M]], AsyncGenerator[Message, None]],
    refusal: Callable[[str, int], Message] | None = None,
    budget: FrameBudget | None = None,
) -> str:
    """Serve an accepted stream connection: the requests (`read_messages`) go to
    `answer`, whose answers are sent back framed as they come. Returns why it ended, once
    the peer closed, reset or stalled the connection, or sent a bad frame, or `answer`
    ended; a peer that stops reading its answers is given up after `IDLE_TIMEOUT_S`."""
    end = StreamEnd()
    requests = read_messages(
        reader, writer, max_bytes, idle_timeout_s, new_message, end, refusal, budget
    )
    try:
        async with contextlib.aclosing(answer(requests)) as answers:
            async for response in answers:
                if writer.transport.is_closing():
                    break
                # Bounded: a peer that stopped reading fills the socket's buffers, and is
                # given up after the idle timeout.
                await send(writer, response.SerializeToString(), IDLE_TIMEOUT_S)
    except (TimeoutError, ConnectionError, OSError) as error:
        end.reason = repr(error)
    return end.reason


async def send(writer: asyncio.StreamWriter, message: bytes, timeout_s: float) -> None:
    """Queue one frame of `message`; when the peer lags behind by more than
    `DRAIN_ABOVE_BYTES`, wait until it caught up, TimeoutError after `timeout_s`. One
    write of header and message: with TCP_NODELAY two writes could go as two packets.
    Frames queued while the socket is busy leave together (asyncio sends its whole buffer
    when the socket is writable again)."""
    await send_all(writer, (message,), timeout_s)


async def send_all(
    writer: asyncio.StreamWriter, messages: Sequence[bytes], timeout_s: float
) -> None:
    """`send` of several messages, framed and written at once."""
    if len(messages) == 1:
        writer.write(frame(messages[0]))
    else:
        writer.write(b"".join([frame(message) for message in messages]))
    if writer.transport.get_write_buffer_size() > DRAIN_ABOVE_BYTES:
        await asyncio.wait_for(writer.drain(), timeout_s)


def set_nodelay(writer: asyncio.StreamWriter) -> None:
    """Send each frame at once (asyncio sets this on TCP transports already; a transport
    that did not would hold small answers back for Nagle's delay)."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def connect(
    host: str, port: int, ticket: bytes, tls: ssl.SSLContext | None, hello: bytes = HELLO
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An accepted Append connection to `host`:`port` for `ticket` (or, with another
    `hello`, a stream of that protocol: `rpc.produce_stream`). AppendRefused when the
    node refuses the ticket or closes; OSError or TimeoutError when it cannot be reached
    within `CONNECT_TIMEOUT_S`."""
    if len(ticket) != TICKET_BYTES:
        raise AppendRefused(f"invalid ticket ({len(ticket)} bytes; expected {TICKET_BYTES})")
    if not 1 <= port <= 65535:
        raise AppendRefused(f"invalid transfer port ({port}; expected 1..65535)")
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(
            host,
            port,
            ssl=tls,
            server_hostname=host if tls is not None else None,
            limit=READ_BUFFER_BYTES,
        )
        try:
            set_nodelay(writer)
            writer.write(hello + ticket)
            status = await reader.read(1)
            if status != ACCEPTED:
                what = "closed the connection" if not status else "refused the ticket"
                raise AppendRefused(f"{host}:{port} {what}")
        except BaseException:
            writer.transport.abort()
            raise
    return reader, writer
