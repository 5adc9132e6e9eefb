"""Consume's pre-built reply bytes (`raftwal.services.consume_wire`) parse to exactly the
`ConsumeResponse` the protobuf library builds from the same frames: every field, zero and
empty ones, keys, properties, large values and payloads, the response's own fields."""

from __future__ import annotations

import random

import pytest

from raftwal.services.consume_wire import EntryEncoder, response, serialize_prebuilt, varint
from rpc.protos import streaming_pb2 as wire
from wal_segments.format import (
    ENTRY_HEADER_SIZE,
    Entry,
    MsgType,
    decode_properties,
    encode_batch,
    frame_headers,
    msg_type_name,
)

NAMES = {0: "", 1: "v_one", 2: "v_twö"}


def _entries(rng: random.Random, count: int) -> list[Entry]:
    out = []
    tick = rng.randrange(1 << 40)
    term = 1
    for k in range(count):
        term = rng.choice([term, term, term + 1, term + (1 << 40)])
        tick += rng.randrange(1, 1 << 20)
        payload_size = rng.choice([0, 1, 100, 10_240, 70_000])
        txn_id = rng.choice([0, 0, 5, (1 << 50) + 1])
        broadcast_id = rng.choice([0, 0, 9])
        flags = (rng.choice([1, 2, 4]) if txn_id else 0) | (64 if broadcast_id else 0)
        out.append(
            Entry(
                lsn=1000 + k,
                term=term,
                time_tick=tick,
                msg_type=int(rng.choice([MsgType.MESSAGE, MsgType.MESSAGE, MsgType.TIME_TICK])),
                vchannel_id=rng.choice([0, 1, 2]),
                flags=flags,
                txn_id=txn_id,
                broadcast_id=broadcast_id,
                key=rng.choice([b"", b"k", bytes(rng.randrange(256) for _ in range(40))]),
                payload=bytes(rng.randrange(256) for _ in range(payload_size)),
                properties=rng.choice([{}, {}, {"a": "1", "ключ": "значение"}]),
            )
        )
    return out


def _expected(entry: Entry, pchannel: str, segment_id: int) -> wire.WalEntry:
    return wire.WalEntry(
        pchannel=pchannel,
        vchannel=NAMES[entry.vchannel_id],
        lsn=entry.lsn,
        term=entry.term,
        time_tick=entry.time_tick,
        msg_type=msg_type_name(entry.msg_type),
        key=entry.key,
        payload=entry.payload,
        properties=dict(entry.properties) or None,
        txn_id=entry.txn_id,
        broadcast_id=entry.broadcast_id,
        flags=entry.flags,
        segment_id=segment_id,
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("as_view", [False, True])
def test_prebuilt_replies_parse_to_what_protobuf_builds(seed: int, as_view: bool) -> None:
    rng = random.Random(seed)
    entries = _entries(rng, 40)
    data = encode_batch(entries).data
    buffer = memoryview(data) if as_view else data
    encoder = EntryEncoder("p_main", msg_type_name)
    parts = []
    for (offset, fields), entry in zip(frame_headers(data), entries, strict=True):
        properties_start = offset + ENTRY_HEADER_SIZE + fields[11] + fields[12]
        properties = (
            decode_properties(data[properties_start : properties_start + fields[1]])
            if fields[1]
            else None
        )
        parts.append(
            encoder.entry(
                buffer, offset, fields, NAMES[fields[5]], entry.lsn % 3 * 1000, properties
            )
        )
    built = response(parts, committed_lsn=123_456_789_012, term=7, committed_time_tick=0)
    parsed = wire.ConsumeResponse.FromString(built)
    expected = wire.ConsumeResponse(
        entries=[_expected(e, "p_main", e.lsn % 3 * 1000) for e in entries],
        committed_lsn=123_456_789_012,
        term=7,
    )
    assert parsed == expected
    assert serialize_prebuilt(built) is built
    assert wire.ConsumeResponse.FromString(serialize_prebuilt(expected)) == expected


def test_empty_response_and_varints() -> None:
    assert wire.ConsumeResponse.FromString(response([], 0, 0, 0)) == wire.ConsumeResponse()
    assert wire.ConsumeResponse.FromString(response([], 5, 2, 9)) == wire.ConsumeResponse(
        committed_lsn=5, term=2, committed_time_tick=9
    )
    for value in (0, 1, 127, 128, 300, (1 << 63) - 1, -1, -(1 << 63)):
        message = wire.WalEntry(lsn=value)
        assert message.SerializeToString() == (b"\x18" + varint(value) if value else b"")
