"""ReadSegment's pre-built replies (node side) and their parse without a message copy
(the Spark connector's side): both must agree with the protobuf library byte for byte."""

from __future__ import annotations

import pytest

from raftwal.services.consume_wire import read_segment_response, serialize_prebuilt
from rpc.protos import streaming_pb2 as wire
from spark_connector import fetch
from spark_connector.fetch import parse_segment_chunk
from spark_connector.options import parse_options
from spark_connector.plan import SegmentSlice
from wal_segments.format import FormatError

FRAMES = bytes(range(256)) * 40 + b"tail"


def _head(**extra: object) -> wire.ReadSegmentResponse:
    return wire.ReadSegmentResponse(
        first_lsn=1_000_001,
        last_lsn=1_000_040,
        node_id="n2",
        frames_crc=0xFEDCBA98,
        frame_offsets=b"\x00" * 8 * 40,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("first", [True, False])
def test_prebuilt_reply_parses_to_the_message_protobuf_builds(first: bool) -> None:
    head = _head(segment_digest=0x89ABCDEF, segment_count=250_002) if first else _head()
    built = read_segment_response(head, memoryview(FRAMES)[: len(FRAMES)])
    expected = wire.ReadSegmentResponse()
    expected.CopyFrom(head)
    expected.frames = FRAMES
    assert wire.ReadSegmentResponse.FromString(built) == expected
    assert serialize_prebuilt(built) is built


def test_parse_agrees_with_protobuf_and_keeps_the_frames_a_view() -> None:
    message = _head(segment_digest=0x89ABCDEF, segment_count=7)
    message.frames = FRAMES
    raw = message.SerializeToString()
    chunk = parse_segment_chunk(raw)
    assert isinstance(chunk.frames, memoryview) and chunk.frames.obj is raw
    assert bytes(chunk.frames) == FRAMES
    assert chunk.frame_offsets == message.frame_offsets
    assert (chunk.first_lsn, chunk.last_lsn) == (1_000_001, 1_000_040)
    assert (chunk.segment_digest, chunk.frames_crc) == (0x89ABCDEF, 0xFEDCBA98)
    # The pre-built form (frames last) parses the same.
    built = parse_segment_chunk(read_segment_response(_head(segment_digest=0x89ABCDEF), FRAMES))
    assert (bytes(built.frames), built.segment_digest) == (FRAMES, 0x89ABCDEF)


def test_parse_skips_unknown_fields_and_takes_the_last_occurrence() -> None:
    raw = (
        _head().SerializeToString()
        + b"\x98\x06\x05"  # field 99, varint: unknown, skipped
        + b"\xa2\x06\x03abc"  # field 100, bytes: unknown, skipped
        + b"\xad\x06\x01\x02\x03\x04"  # field 101, fixed32: unknown, skipped
        + wire.ReadSegmentResponse(first_lsn=5).SerializeToString()
    )
    chunk = parse_segment_chunk(raw)
    assert (chunk.first_lsn, chunk.last_lsn, bytes(chunk.frames)) == (5, 1_000_040, b"")


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x10short",  # frames longer than the message
        b"\x10\xff\xff",  # a varint cut off
        b"\x10" + b"\xff" * 11,  # a varint too long
        b"\x0b",  # wire type 3 (groups) is not ours
        b"\x12\x01x",  # first_lsn as bytes
    ],
)
def test_parse_refuses_bytes_that_are_not_a_chunk(raw: bytes) -> None:
    with pytest.raises(FormatError):
        parse_segment_chunk(raw)


def test_parse_reads_a_bulk_transfer_offer() -> None:
    ticket = bytes(range(32))
    message = _head(
        segment_digest=0x89ABCDEF,
        transfer_ticket=ticket,
        transfer_port=65535,
        transfer_bytes=44_040_192,
    )
    chunk = parse_segment_chunk(message.SerializeToString())
    assert chunk.transfer_ticket == ticket
    assert (chunk.transfer_port, chunk.transfer_bytes) == (65535, 44_040_192)
    assert bytes(chunk.frames) == b""
    # A plain chunk has no offer.
    assert parse_segment_chunk(_head().SerializeToString()).transfer_ticket == b""


@pytest.mark.parametrize("announced", [0, -5, (1 << 30) + 1, 1 << 40])
def test_a_bulk_offer_of_an_impossible_size_is_refused_before_any_allocation(
    monkeypatch: pytest.MonkeyPatch, announced: int
) -> None:
    """A replica's offer is checked before the reader allocates its buffer or connects:
    a size no segment can have names the replica's problem, and nothing is received."""
    part = SegmentSlice("p0", 1, 1, 2, 0xABCD, 1, 2, (("n1", "127.0.0.1:1"),))
    offer = parse_segment_chunk(
        wire.ReadSegmentResponse(
            first_lsn=1,
            last_lsn=2,
            segment_digest=0xABCD,
            frame_offsets=b"\x00" * 16,
            transfer_ticket=b"t" * 32,
            transfer_port=9,
            transfer_bytes=announced,
        ).SerializeToString()
    )
    monkeypatch.setattr(fetch, "read_segment_chunks", lambda *_args: iter([offer]))

    def never(*_args: object) -> None:
        raise AssertionError("nothing may be received for an impossible offer")

    monkeypatch.setattr(fetch, "receive", never)
    options = parse_options({"endpoints": "127.0.0.1:1"})
    got = fetch._read_replica(None, part, options, "127.0.0.1:1", 1, 2, True)  # type: ignore[arg-type]
    assert isinstance(got, str) and "bulk transfer offer of" in got
