"""The node's segment transfer port (the protocol: `rpc.segment_transfer`).

ReadSegment, after its checks, calls `SegmentTransfers.offer` for a bulk request; the
ticket it gets back goes to the reader in the gRPC reply, and the reader redeems it here.
The frames go from the file to the socket by `sendfile`, so no byte of them passes
through this process.

Nothing a connection sends is trusted before its ticket matched: the node reads exactly
the hello and the ticket (40 bytes) within `HELLO_TIMEOUT_S`, keeps at most
`MAX_CONNECTIONS` connections (more are closed at once), and at most `MAX_TICKETS`
outstanding tickets (past that, ReadSegment streams its chunks over gRPC instead). A ticket
is looked up by its SHA-256 digest, works once, and expires after `TICKET_TTL_S`. A ticket
holds a path, not an open file: the file is opened when the ticket is redeemed, so idle
tickets hold no descriptors. If retention deleted the segment in between, the connection
is closed unanswered and the reader falls back to the gRPC stream, which then says what
happened (COMPACTED or NOT_FOUND). The reader checks what it received against the
committed digest (or the offer's crc) either way.

A node whose gRPC port uses TLS speaks TLS here too, with the same certificate, key, CA
and client authentication. The handshake starts only after the connection cap let the
connection in, and it must end, with the hello and the ticket, within HELLO_TIMEOUT_S.
Over TLS the frames cannot go by `sendfile`: asyncio reads the file in chunks and
encrypts them, still without gRPC's framing and copies.

The same port carries the Append streams of WAL replication (`rpc.append_stream`): a
connection whose hello is `rpc.append_stream.HELLO` redeems a ticket from `offer_append`
(Replication.OpenAppend), and is then handed to the append handler (the Replication
servicer's) until either side closes it. Append tickets live in a table of their own (a
segment ticket does not open an Append stream, nor the other way round). Accepted Append
connections leave the hello-phase cap and count against `MAX_APPEND_CONNECTIONS`
instead; at that cap, OpenAppend hands out no ticket and the owner uses the gRPC Append
call.

Producers' Produce streams come the same way (`rpc.produce_stream`): a ticket from
`offer_produce` (StreamingNode.OpenProduce, asked with a producer's credentials), the hello
`rpc.produce_stream.HELLO`, a table of tickets of its own, and `MAX_PRODUCE_CONNECTIONS`
(at that cap OpenProduce hands out no ticket and the producer uses the Produce call).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rpc import append_stream, produce_stream
from rpc.segment_transfer import ACCEPTED, HELLO, HELLO_TIMEOUT_S, REFUSED, TICKET_BYTES

log = logging.getLogger(__name__)

#: Connections open at once (reading a hello or sending frames); more are closed at once.
MAX_CONNECTIONS = 64
#: Of those, the most from one source address (IP) before their ticket matched: a peer
#: without a ticket that holds silent connections open takes at most these, not all.
MAX_CONNECTIONS_PER_SOURCE = 16
#: Outstanding tickets; past this, ReadSegment streams over gRPC instead.
MAX_TICKETS = 256
#: How long a ticket stays good after ReadSegment handed it out.
TICKET_TTL_S = 10.0
#: A transfer that sends slower than this is cut (a reader that stopped reading).
MIN_TRANSFER_BYTES_PER_S = 1 << 20
MIN_TRANSFER_S = 30.0
#: Bytes the stream reader buffers from a connection before its ticket matched.
READ_LIMIT = 4096
#: Append streams open at once plus Append tickets outstanding (one stream per pchannel
#: this node replicates for another owner); past this, owners use the gRPC Append call.
MAX_APPEND_CONNECTIONS = 256

#: Produce streams open at once plus Produce tickets outstanding (one stream per producer
#: and node); past this, producers use the gRPC Produce call.
MAX_PRODUCE_CONNECTIONS = 1024


#: Serves one accepted stream connection: (reader, writer, who the ticket was asked for:
#: the owner node id of an Append stream, "" for a Produce stream). It returns when the
#: connection is done; the port closes it then.
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]
AppendHandler = StreamHandler


def _source(writer: asyncio.StreamWriter) -> str:
    """The IP address a connection comes from."""
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


@dataclass
class _Ticket:
    path: Path
    begin: int
    length: int
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)


@dataclass
class _StreamTicket:
    asked_by: str
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)


@dataclass(eq=False)
class _StreamKind:
    """A long-lived framed stream the port hands over to a handler once its ticket
    matched: WAL replication's Append streams, or producers' Produce streams."""

    name: str  # its count in `SegmentTransfers.counts`
    hello: bytes
    cap: int  # open connections plus outstanding tickets
    handler: StreamHandler | None = None
    tickets: dict[bytes, _StreamTicket] = field(default_factory=dict)
    connections: int = 0
    # Open connections, closed with the port (asyncio.Server.close leaves connections it
    # accepted open).
    writers: set[asyncio.StreamWriter] = field(default_factory=set)


class SegmentTransfers:
    """The transfer port of one node: `start`, then `offer` from ReadSegment and
    `offer_append` from OpenAppend (once `serve_appends` set the handler); `close`."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
        ticket_ttl_s: float = TICKET_TTL_S,
        frame_budget_bytes: int = append_stream.DEFAULT_FRAME_BUDGET_BYTES,
    ) -> None:
        self._host, self._port = host, port
        self._tls = tls
        self._ticket_ttl_s = ticket_ttl_s
        self._server: asyncio.Server | None = None
        self._tickets: dict[bytes, _Ticket] = {}
        self._appends = _StreamKind("appends", append_stream.HELLO, MAX_APPEND_CONNECTIONS)
        self._produces = _StreamKind("produces", produce_stream.HELLO, MAX_PRODUCE_CONNECTIONS)
        self._kinds = {kind.hello: kind for kind in (self._appends, self._produces)}
        self._connections = 0
        # source address -> its connections in the hello phase (no entry at 0)
        self._by_source: dict[str, int] = {}
        self.port = 0  # the bound port, once started
        #: served, refused (bad or expired ticket), failed (cut short), turned away (cap);
        #: appends, produces: Append and Produce connections accepted.
        self.counts = {
            "served": 0,
            "refused": 0,
            "failed": 0,
            "turned_away": 0,
            "appends": 0,
            "produces": 0,
            "turned_away_source": 0,
        }
        #: Partly received frames of every Append and Produce connection (adds the counts
        #: frames_refused and frames_stalled).
        self.frame_budget = append_stream.FrameBudget(frame_budget_bytes, self.counts)

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._serve, self._host, self._port, limit=READ_LIMIT
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        for key in list(self._tickets):
            self._drop(key)
        for kind in self._kinds.values():
            for key in list(kind.tickets):
                self._drop_stream_ticket(kind, key)
            for writer in list(kind.writers):
                writer.transport.abort()

    def serve_appends(self, handler: AppendHandler) -> None:
        """Accept Append connections from now on, each served by `handler`."""
        self._appends.handler = handler

    def serve_produces(self, handler: StreamHandler) -> None:
        """Accept Produce connections from now on, each served by `handler`."""
        self._produces.handler = handler

    def offer_append(self, owner_node_id: str) -> bytes | None:
        """A ticket for one Append connection from `owner_node_id`, or None when this
        port takes none (not started, no handler, or at `MAX_APPEND_CONNECTIONS`)."""
        return self._offer_stream(self._appends, owner_node_id)

    def offer_produce(self, asked_by: str = "") -> bytes | None:
        """A ticket for one Produce connection of the caller `asked_by` (its
        ``callers.caller_identity``: the connection acts as that caller), or None when this
        port takes none (not started, no handler, or at `MAX_PRODUCE_CONNECTIONS`)."""
        return self._offer_stream(self._produces, asked_by)

    def _offer_stream(self, kind: _StreamKind, asked_by: str) -> bytes | None:
        if (
            self._server is None
            or kind.handler is None
            or kind.connections + len(kind.tickets) >= kind.cap
        ):
            return None
        ticket = secrets.token_bytes(TICKET_BYTES)
        key = hashlib.sha256(ticket).digest()
        entry = _StreamTicket(asked_by)
        entry.expiry = asyncio.get_running_loop().call_later(
            self._ticket_ttl_s, self._drop_stream_ticket, kind, key
        )
        kind.tickets[key] = entry
        return ticket

    def _drop_stream_ticket(self, kind: _StreamKind, key: bytes) -> None:
        entry = kind.tickets.pop(key, None)
        if entry is not None and entry.expiry is not None:
            entry.expiry.cancel()

    def offer(self, path: Path, begin: int, length: int) -> bytes | None:
        """A ticket for `length` bytes of `path` from `begin`, or None when this node takes
        no more tickets right now (the caller streams instead). OSError if the file is
        gone or shorter than the range."""
        if self._server is None or len(self._tickets) >= MAX_TICKETS:
            return None
        if begin < 0 or length < 0 or begin + length > os.stat(path).st_size:
            raise OSError(f"{path} is shorter than the range {begin}+{length}")
        ticket = secrets.token_bytes(TICKET_BYTES)
        key = hashlib.sha256(ticket).digest()
        entry = _Ticket(path, begin, length)
        entry.expiry = asyncio.get_running_loop().call_later(self._ticket_ttl_s, self._drop, key)
        self._tickets[key] = entry
        return ticket

    def _drop(self, key: bytes) -> None:
        entry = self._tickets.pop(key, None)
        if entry is not None and entry.expiry is not None:
            entry.expiry.cancel()

    def _claim(self, ticket: bytes) -> _Ticket | None:
        entry = self._tickets.pop(hashlib.sha256(ticket).digest(), None)
        if entry is not None and entry.expiry is not None:
            entry.expiry.cancel()
        return entry

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= MAX_CONNECTIONS:
            self.counts["turned_away"] += 1
            writer.transport.abort()
            return
        source = _source(writer)
        if self._by_source.get(source, 0) >= MAX_CONNECTIONS_PER_SOURCE:
            self.counts["turned_away_source"] += 1
            writer.transport.abort()
            return
        self._by_source[source] = self._by_source.get(source, 0) + 1
        released = False

        def leave_hello_phase() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._by_source[source] - 1
            if left:
                self._by_source[source] = left
            else:
                del self._by_source[source]

        try:
            await self._serve_counted(reader, writer, leave_hello_phase)
        finally:
            leave_hello_phase()

    async def _serve_counted(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        leave_hello_phase: Callable[[], None],
    ) -> None:
        self._connections += 1
        entry: _Ticket | None = None
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                if self._tls is not None:
                    await writer.start_tls(self._tls, ssl_handshake_timeout=HELLO_TIMEOUT_S)
                hello = await reader.readexactly(len(HELLO) + TICKET_BYTES)
            kind = self._kinds.get(hello[: len(HELLO)])
            if kind is not None and kind.handler is not None:
                streaming = kind.tickets.pop(hashlib.sha256(hello[len(HELLO) :]).digest(), None)
                if streaming is not None:
                    if streaming.expiry is not None:
                        streaming.expiry.cancel()
                    # A long-lived stream: it leaves the hello-phase caps (in all and per
                    # source) for its own.
                    self._connections -= 1
                    kind.connections += 1
                    leave_hello_phase()
                    try:
                        await self._serve_stream(kind, reader, writer, streaming.asked_by)
                    finally:
                        kind.connections -= 1
                        self._connections += 1  # taken again by the finally below
                    return
            if hello[: len(HELLO)] == HELLO:
                entry = self._claim(hello[len(HELLO) :])
            if entry is None:
                self.counts["refused"] += 1
                writer.write(REFUSED)
                await asyncio.wait_for(writer.drain(), HELLO_TIMEOUT_S)
                return
            # Authenticated by its ticket: no longer one of its source's hello slots.
            leave_hello_phase()
            file = open(entry.path, "rb", buffering=0)  # noqa: SIM115 - closed below
            try:
                if os.fstat(file.fileno()).st_size < entry.begin + entry.length:
                    raise OSError(f"{entry.path} is shorter than the offered range")
                writer.write(ACCEPTED)
                timeout = max(MIN_TRANSFER_S, entry.length / MIN_TRANSFER_BYTES_PER_S)
                loop = asyncio.get_running_loop()
                await asyncio.wait_for(
                    loop.sendfile(writer.transport, file, entry.begin, entry.length), timeout
                )
                await asyncio.wait_for(writer.drain(), HELLO_TIMEOUT_S)
            finally:
                file.close()
            self.counts["served"] += 1
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError) as error:
            # A reader that went away, sent garbage or stalled: nothing to answer. The
            # reader sees a short transfer and reads another way.
            self.counts["failed" if entry is not None else "refused"] += 1
            log.debug(
                "segment transfer from %s ended: %r", writer.get_extra_info("peername"), error
            )
            writer.transport.abort()
        except Exception:  # a bug here must not take the event loop's callback with it
            self.counts["failed"] += 1
            log.exception("segment transfer from %s failed", writer.get_extra_info("peername"))
            writer.transport.abort()
        finally:
            self._connections -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _serve_stream(
        self,
        kind: _StreamKind,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        asked_by: str,
    ) -> None:
        assert kind.handler is not None
        self.counts[kind.name] += 1
        append_stream.set_nodelay(writer)
        writer.write(ACCEPTED)
        # Frames are read whole (up to the gRPC message size): buffer more than the 4 KiB
        # a connection gets before its ticket matched. asyncio has no API for this.
        reader._limit = append_stream.READ_BUFFER_BYTES  # type: ignore[attr-defined]  # noqa: SLF001
        kind.writers.add(writer)
        try:
            await kind.handler(reader, writer, asked_by)
        finally:
            kind.writers.discard(writer)
