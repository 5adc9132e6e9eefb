"""ConsumeResponse bytes built straight from WAL frames: the Consume stream's replies.

Building a `WalEntry` message per entry and then serializing the `ConsumeResponse` copies
every payload twice more and costs about 17 us per 10 KiB entry in this process
(docs/benchmarks-history.md, "Consume"). Here each entry's protobuf encoding is written directly:
its few scalar fields as varints, its key and payload as slices of the buffer read from
the segment, joined once into the response. The Consume method is registered with a
response serializer that passes such bytes through (`serialize_prebuilt`), so gRPC sends
them as they are; clients parse an ordinary `ConsumeResponse`.

Field numbers are those of `rpc/protos/streaming.proto` (`WalEntry`, `ConsumeResponse`);
`tests/wal/test_consume_wire.py` checks the bytes parse to the message the protobuf
library would have built. Zero and empty fields are left out, as proto3 does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import grpc

from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from wal_segments.format import BATCH_CONTINUES_FLAG, ENTRY_HEADER_SIZE, HeaderFields

# One byte tags: (field number << 3) | wire type (0 varint, 2 length-delimited).
_ENTRIES = b"\x0a"  # ConsumeResponse.entries = 1
_RESPONSE_COMMITTED_LSN = 0x10  # = 2
_RESPONSE_TERM = 0x18  # = 3
_RESPONSE_COMMITTED_TICK = 0x20  # = 4
_PCHANNEL = 0x0A  # WalEntry.pchannel = 1
_VCHANNEL = 0x12  # = 2
_LSN = 0x18  # = 3
_TERM = 0x20  # = 4
_TIME_TICK = 0x28  # = 5
_MSG_TYPE = 0x32  # = 6
_KEY = 0x3A  # = 7
_PAYLOAD = b"\x42"  # = 8
_SEGMENT_FRAMES = b"\x0a"  # ReadSegmentResponse.frames = 1
_TXN_ID = 0x50  # = 10
_BROADCAST_ID = 0x58  # = 11
_FLAGS = 0x60  # = 12
# The entry flags a consumer sees (see `EntryEncoder.entry`).
_SHOWN_FLAGS = 0xFFFFFFFF & ~BATCH_CONTINUES_FLAG
_SEGMENT_ID = 0x68  # = 13

_SMALL = [bytes((n,)) for n in range(0x80)]
_LSN_TAG, _TERM_TAG, _TICK_TAG = bytes((_LSN,)), bytes((_TERM,)), bytes((_TIME_TICK,))
# Varints of large values share their high groups with the previous entries' (LSNs and
# hybrid time ticks grow slowly above their low 14 bits): those are encoded once.
_HIGH_CACHE_MAX = 4096
# Payloads below this are copied into their entry's bytes at once (one part per entry);
# larger ones are joined straight from the read buffer (one copy in all).
_SMALL_PAYLOAD = 2048


def varint(value: int) -> bytes:
    """The protobuf varint of `value` (an int64 or uint32 field: negatives as 10 bytes)."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def int_field(tag: int, value: int) -> bytes:
    """A varint field, left out when zero."""
    return bytes((tag,)) + varint(value) if value else b""


def text_field(tag: int, text: str) -> bytes:
    """A string field, left out when empty."""
    if not text:
        return b""
    data = text.encode()
    return bytes((tag,)) + varint(len(data)) + data


class EntryEncoder:
    """Encodes the `WalEntry`s of one Consume stream (its pchannel, and the vchannel and
    msg_type names it meets, encoded once)."""

    def __init__(self, pchannel: str, msg_type_name: Callable[[int], str]) -> None:
        self._pchannel = text_field(_PCHANNEL, pchannel)
        self._msg_type_name = msg_type_name
        self._vchannels: dict[str, bytes] = {}
        self._msg_types: dict[int, bytes] = {}
        self._high: dict[int, bytes] = {}

    def _varint(self, value: int) -> bytes:
        """`varint(value)` for value >= 0, the groups above the low 14 bits cached."""
        if value < 0x4000:
            return varint(value)
        high = value >> 14
        encoded = self._high.get(high)
        if encoded is None:
            if len(self._high) >= _HIGH_CACHE_MAX:
                self._high.clear()
            encoded = self._high[high] = varint(high)
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80)) + encoded

    def entry(
        self,
        data: bytes | memoryview,
        offset: int,
        fields: HeaderFields,
        vchannel: str,
        segment_id: int = 0,
        properties: dict[str, str] | None = None,
    ) -> tuple[Any, ...]:
        """The parts of one `entries` field of a ConsumeResponse (joined by `response`)
        for the frame at `offset` of `data` whose header is `fields` (as
        `wal_segments.format.frame_headers` gives them): its key and payload are taken as
        slices of `data`, the payload not copied here. `properties` are the decoded ones
        to show (the caller filters them)."""
        lsn, term, time_tick = fields[2], fields[3], fields[4]
        txn_id, broadcast_id, msg_type = fields[6], fields[7], fields[8]
        # BATCH_CONTINUES is the WAL's own bookkeeping (atomic batches): not shown.
        flags = fields[10] & _SHOWN_FLAGS
        key_start = offset + ENTRY_HEADER_SIZE
        key_end = payload_start = key_start + fields[11]
        payload_end = payload_start + fields[12]
        vchannel_field = self._vchannels.get(vchannel)
        if vchannel_field is None:
            vchannel_field = self._vchannels[vchannel] = text_field(_VCHANNEL, vchannel)
        msg_type_field = self._msg_types.get(msg_type)
        if msg_type_field is None:
            msg_type_field = self._msg_types[msg_type] = text_field(
                _MSG_TYPE, self._msg_type_name(msg_type)
            )
        cached = self._varint
        # lsn, term and time_tick are never zero in a log, and an explicit zero parses
        # the same in proto3: written unconditionally.
        head = b"".join(
            (
                self._pchannel,
                vchannel_field,
                _LSN_TAG,
                cached(lsn) if lsn >= 0 else varint(lsn),
                _TERM_TAG,
                cached(term) if term >= 0 else varint(term),
                _TICK_TAG,
                cached(time_tick) if time_tick >= 0 else varint(time_tick),
                msg_type_field,
                bytes((_KEY,)) + varint(key_end - key_start) + data[key_start:key_end]
                if key_end > key_start
                else b"",
            )
        )
        payload_len = payload_end - payload_start
        tail = (
            b"".join(
                (
                    wire.WalEntry(properties=properties).SerializeToString() if properties else b"",
                    int_field(_TXN_ID, txn_id),
                    int_field(_BROADCAST_ID, broadcast_id),
                    int_field(_FLAGS, flags),
                    int_field(_SEGMENT_ID, segment_id),
                )
            )
            if txn_id or broadcast_id or flags or segment_id or properties
            else b""
        )
        if not payload_len:
            body = head + tail
            return (_ENTRIES + varint(len(body)) + body,)
        payload_tag = _PAYLOAD + varint(payload_len)
        size = len(head) + len(payload_tag) + payload_len + len(tail)
        if payload_len < _SMALL_PAYLOAD:
            # One part: fewer, smaller objects for the response's join to walk.
            return (
                b"".join(
                    (
                        _ENTRIES,
                        varint(size),
                        head,
                        payload_tag,
                        data[payload_start:payload_end],
                        tail,
                    )
                ),
            )
        view = data if isinstance(data, memoryview) else memoryview(data)
        return (
            _ENTRIES,
            varint(size),
            head,
            payload_tag,
            view[payload_start:payload_end],
            tail,
        )


def response(
    entries: list[tuple[Any, ...]], committed_lsn: int, term: int, committed_time_tick: int
) -> bytes:
    """A ConsumeResponse's bytes from `EntryEncoder.entry` parts (one copy of each)."""
    trailer = (
        int_field(_RESPONSE_COMMITTED_LSN, committed_lsn)
        + int_field(_RESPONSE_TERM, term)
        + int_field(_RESPONSE_COMMITTED_TICK, committed_time_tick)
    )
    return b"".join(itertools.chain(itertools.chain.from_iterable(entries), (trailer,)))


def serialize_prebuilt(reply: Any) -> bytes:
    """The response serializer of Consume and ReadSegment: pre-built bytes pass through,
    a message is serialized."""
    if type(reply) is bytes:
        return reply
    return reply.SerializeToString()  # type: ignore[no-any-return]


def read_segment_response(head: wire.ReadSegmentResponse, frames: Any) -> bytes:
    """A ReadSegmentResponse's bytes: `head` (every field but `frames`) and then `frames`
    (any buffer) as field 1. Protobuf parses fields in any order, so this is the message
    with `frames` set; the frames are copied once, by the join."""
    size = memoryview(frames).nbytes
    return b"".join((head.SerializeToString(), _SEGMENT_FRAMES, varint(size), frames))


class _Captured:
    """Stands in for a server to take the handlers a generated `add_*_to_server` makes."""

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(
        self, name: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.name, self.handlers = name, dict(handlers)


def add_streaming_node_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    """`add_StreamingNodeServicer_to_server`, with the replies of Consume and ReadSegment
    serialized by `serialize_prebuilt` (their generators yield pre-built bytes)."""
    captured = _Captured()
    streaming_pb2_grpc.add_StreamingNodeServicer_to_server(servicer, captured)
    handlers = captured.handlers
    handlers["Consume"] = grpc.unary_stream_rpc_method_handler(
        servicer.Consume,
        request_deserializer=wire.ConsumeRequest.FromString,
        response_serializer=serialize_prebuilt,
    )
    handlers["ReadSegment"] = grpc.unary_stream_rpc_method_handler(
        servicer.ReadSegment,
        request_deserializer=wire.ReadSegmentRequest.FromString,
        response_serializer=serialize_prebuilt,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(captured.name, handlers),)
    )
    server.add_registered_method_handlers(captured.name, handlers)
