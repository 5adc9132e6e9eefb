"""The transfer port's Append connections (rpc.append_stream), in process over real sockets:
which tickets open a connection, and that nothing a refused connection sends reaches the
append handler (the only code that parses frames as protobuf). The replica's handler
itself runs in tests/cluster/test_append_port.py.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest

from raftwal.services.segment_transfer import SegmentTransfers
from rpc import append_stream, produce_stream, segment_transfer

TICKET_TTL_S = 0.3


class _Recorder:
    """An append handler that records each accepted connection and echoes its frames."""

    def __init__(self) -> None:
        self.owners: list[str] = []

    async def __call__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, owner_node_id: str
    ) -> None:
        self.owners.append(owner_node_id)
        while True:
            try:
                payload = await append_stream.read_frame(reader, 1024, 5.0)
            except append_stream.FrameTooLarge:
                return  # the port closes the connection
            if payload is None:
                return
            writer.write(append_stream.frame(payload))
            await writer.drain()


async def _port() -> tuple[SegmentTransfers, _Recorder]:
    transfers = SegmentTransfers("127.0.0.1", 0, ticket_ttl_s=TICKET_TTL_S)
    await transfers.start()
    recorder = _Recorder()
    transfers.serve_appends(recorder)
    return transfers, recorder


async def _hello(port: int, hello: bytes) -> bytes:
    """What the port answers to `hello` followed by a valid-looking frame: everything it
    sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(hello + append_stream.frame(b"\x08\x01"))
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


def test_only_a_fresh_unused_append_ticket_opens_a_connection() -> None:
    async def main() -> None:
        transfers, recorder = await _port()
        try:
            port = transfers.port
            # A ticket never issued.
            wrong = append_stream.HELLO + secrets.token_bytes(segment_transfer.TICKET_BYTES)
            assert await _hello(port, wrong) == segment_transfer.REFUSED
            # An append ticket under the segment transfer's hello.
            ticket = transfers.offer_append("n1")
            assert ticket is not None
            assert await _hello(port, segment_transfer.HELLO + ticket) == segment_transfer.REFUSED
            # The right hello works once: echoed frame, then the handler's end closes it.
            ticket = transfers.offer_append("n1")
            assert ticket is not None
            reader, writer = await append_stream.connect("127.0.0.1", port, ticket, None)
            writer.write(append_stream.frame(b"hello"))
            assert await append_stream.read_frame(reader, 1024, 5.0) == b"hello"
            writer.close()
            # ... and not twice.
            assert await _hello(port, append_stream.HELLO + ticket) == segment_transfer.REFUSED
            # An expired ticket.
            ticket = transfers.offer_append("n2")
            assert ticket is not None
            await asyncio.sleep(TICKET_TTL_S * 2)
            assert await _hello(port, append_stream.HELLO + ticket) == segment_transfer.REFUSED
            # Only the one valid connection reached the handler.
            assert recorder.owners == ["n1"]
            assert transfers.counts["refused"] == 4 and transfers.counts["appends"] == 1
        finally:
            await transfers.close()

    asyncio.run(main())


def test_connect_raises_on_a_refused_ticket() -> None:
    async def main() -> None:
        transfers, recorder = await _port()
        try:
            with pytest.raises(append_stream.AppendRefused):
                await append_stream.connect(
                    "127.0.0.1",
                    transfers.port,
                    secrets.token_bytes(segment_transfer.TICKET_BYTES),
                    None,
                )
            assert recorder.owners == []
        finally:
            await transfers.close()

    asyncio.run(main())


def test_a_frame_over_the_cap_ends_the_connection() -> None:
    async def main() -> None:
        transfers, recorder = await _port()
        try:
            ticket = transfers.offer_append("n1")
            assert ticket is not None
            reader, writer = await append_stream.connect("127.0.0.1", transfers.port, ticket, None)
            writer.write(append_stream.LENGTH.pack(1025) + b"x" * 1025)
            async with asyncio.timeout(5):
                assert await reader.read() == b""  # closed, nothing echoed
            writer.close()
        finally:
            await transfers.close()

    asyncio.run(main())


def test_append_tickets_are_capped() -> None:
    async def main() -> None:
        transfers, _ = await _port()
        try:
            from raftwal.services import segment_transfer as port_module

            tickets = [
                transfers.offer_append("n1") for _ in range(port_module.MAX_APPEND_CONNECTIONS)
            ]
            assert all(tickets)
            assert transfers.offer_append("n1") is None
        finally:
            await transfers.close()

    asyncio.run(main())


def test_the_port_closes_open_append_connections_when_it_closes() -> None:
    async def main() -> None:
        transfers, recorder = await _port()
        ticket = transfers.offer_append("n1")
        assert ticket is not None
        reader, writer = await append_stream.connect("127.0.0.1", transfers.port, ticket, None)
        await transfers.close()
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()

    asyncio.run(main())


def test_produce_and_append_tickets_open_only_their_own_streams() -> None:
    """Produce connections (rpc.produce_stream) have a table of tickets and a cap of their
    own: an Append ticket sent with the Produce hello is refused and the other way round,
    and each accepted connection reaches its own handler only."""

    async def main() -> None:
        transfers, appends = await _port()
        produces = _Recorder()
        transfers.serve_produces(produces)
        try:
            append_ticket = transfers.offer_append("n1")
            produce_ticket = transfers.offer_produce()
            assert append_ticket is not None and produce_ticket is not None
            crossed = [
                produce_stream.HELLO + append_ticket,
                append_stream.HELLO + produce_ticket,
            ]
            for hello in crossed:
                assert await _hello(transfers.port, hello) == segment_transfer.REFUSED
            assert appends.owners == [] and produces.owners == []
            # Both were used up by the refused attempts (a ticket is looked up once).
            append_ticket = transfers.offer_append("n1")
            produce_ticket = transfers.offer_produce()
            assert append_ticket is not None and produce_ticket is not None
            reader, writer = await append_stream.connect(
                "127.0.0.1", transfers.port, produce_ticket, None, hello=produce_stream.HELLO
            )
            writer.write(append_stream.frame(b"\x08\x01"))
            async with asyncio.timeout(5):
                assert await append_stream.read_frame(reader, 1024, 5.0) == b"\x08\x01"
            writer.close()
            assert produces.owners == [""] and appends.owners == []
            assert transfers.counts["produces"] == 1 and transfers.counts["appends"] == 0
        finally:
            await transfers.close()

    asyncio.run(main())


def test_produce_tickets_are_capped_and_need_a_handler() -> None:
    async def main() -> None:
        transfers, _ = await _port()
        try:
            from raftwal.services import segment_transfer as port_module

            assert transfers.offer_produce() is None  # no Produce handler yet
            transfers.serve_produces(_Recorder())
            tickets = [
                transfers.offer_produce() for _ in range(port_module.MAX_PRODUCE_CONNECTIONS)
            ]
            assert all(tickets)
            assert transfers.offer_produce() is None
            # The Append cap is separate.
            assert transfers.offer_append("n1") is not None
        finally:
            await transfers.close()

    asyncio.run(main())


def test_silent_connections_from_one_address_leave_the_others_room() -> None:
    # Issue 40, item 8: 80 silent connections (reopened as they were closed) from one
    # peer held all 64 hello slots; 1 of 13 legitimate Produce-port connections got in.
    # Now one source address holds at most MAX_CONNECTIONS_PER_SOURCE of them.
    from raftwal.services import segment_transfer as port_module

    cap = getattr(port_module, "MAX_CONNECTIONS_PER_SOURCE", 16)
    assert cap < port_module.MAX_CONNECTIONS

    async def main() -> None:
        transfers, recorder = await _port()
        silent: list[asyncio.StreamWriter] = []
        try:
            port = transfers.port
            for _ in range(80):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                silent.append(writer)
            await asyncio.sleep(0.3)
            # Another address (all of 127/8 is loopback) still gets a hello slot.
            for round_ in range(3):
                ticket = transfers.offer_append(f"n{round_}")
                assert ticket is not None
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=("127.0.0.2", 0)
                )
                writer.write(append_stream.HELLO + ticket)
                async with asyncio.timeout(5):
                    assert await reader.readexactly(1) == segment_transfer.ACCEPTED
                writer.write(append_stream.frame(b"mine"))
                assert await append_stream.read_frame(reader, 1024, 5.0) == b"mine"
                writer.close()
            assert transfers.counts.get("turned_away_source", 0) >= 80 - cap
            assert transfers.counts["turned_away"] == 0
        finally:
            for writer in silent:
                writer.transport.abort()
            await transfers.close()

    asyncio.run(main())
