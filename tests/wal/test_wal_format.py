"""Pure format: entry frames, file header, footer, validation messages."""

from __future__ import annotations

import struct
from array import array

import pytest

from tests.wal.segment_helpers import simple_entries, varied_entries
from wal_segments.format import (
    ENTRY_HEADER_SIZE,
    FILE_MAGIC,
    Entry,
    EntryFlags,
    FileHeader,
    FormatError,
    MsgType,
    SegmentSummary,
    align_up,
    block_checksums,
    crc32c,
    decode_batch,
    decode_file_header,
    decode_footer,
    decode_properties,
    decode_trailer,
    encode_batch,
    encode_file_header,
    encode_footer,
    encode_footer_parts,
    encode_properties,
    frame_headers,
    msg_type_code,
    msg_type_name,
    scan_batch,
)


def test_crc32c_is_the_castagnoli_polynomial_from_the_c_package():
    # The standard check value of CRC-32C.
    assert crc32c(b"123456789") == 0xE3069283
    import crc32c as package

    assert package.__name__ == "crc32c" and hasattr(package, "hardware_based")


def test_every_field_round_trips():
    entries = varied_entries(40, first_lsn=2**40, term=2**40, first_tick=2**62)
    batch = encode_batch(entries)
    assert decode_batch(batch.data) == entries
    meta = batch.meta
    assert (meta.count, meta.first_lsn, meta.last_lsn) == (40, 2**40, 2**40 + 39)
    assert (meta.first_time_tick, meta.last_time_tick) == (2**62, 2**62 + 7 * 39)
    assert meta.size_bytes == len(batch.data)
    assert scan_batch(batch.data) == meta


def test_extreme_values_empty_and_large_bodies():
    big = bytes(range(256)) * 4096  # 1 MiB
    entries = [
        Entry(lsn=1, term=1, time_tick=0, msg_type=MsgType.MESSAGE),
        Entry(
            lsn=2,
            term=2**63 - 1,
            time_tick=2**63 - 1,
            msg_type=MsgType.TXN_ROLLBACK,
            vchannel_id=2**63 - 1,
            flags=EntryFlags.TXN_ROLLBACK | EntryFlags.BROADCAST,
            txn_id=2**63 - 1,
            broadcast_id=2**63 - 1,
            key=b"\x00" * 1000,
            payload=big,
            properties={"k": "v" * 100_000, "ß": "🙂\u0301"},
        ),
    ]
    batch = encode_batch(entries)
    assert decode_batch(batch.data) == entries
    assert all(offset % 8 == 0 for offset in batch.meta.frame_offsets)
    assert len(batch.data) % 8 == 0


def test_frame_layout_is_the_documented_one():
    entry = Entry(
        lsn=5,
        term=6,
        time_tick=7,
        msg_type=MsgType.DELETE,
        vchannel_id=8,
        flags=EntryFlags.TXN_BODY,
        txn_id=9,
        key=b"ab",
        payload=b"cde",
        properties={"x": "y"},
    )
    data = encode_batch([entry]).data
    assert len(data) == align_up(ENTRY_HEADER_SIZE + 2 + 3 + 3) == 80
    crc, props_len, lsn, term, tick, vch, txn, bcast, mtype, reserved, flags, klen, plen = (
        struct.unpack_from("<II6qHHIII", data)
    )
    assert (props_len, lsn, term, tick, vch, txn, bcast) == (3, 5, 6, 7, 8, 9, 0)
    assert (mtype, reserved, flags, klen, plen) == (MsgType.DELETE, 0, 2, 2, 3)
    assert data[72:80] == b"abcdex\x00y"
    assert crc == crc32c(data[4:])


def test_properties_encoding():
    assert encode_properties({}) == b""
    assert encode_properties({"a": "b", "c": ""}) == b"a\x00b\x00c\x00"
    assert decode_properties(b"a\x00b\x00c\x00") == {"a": "b", "c": ""}
    assert decode_properties(b"\x00") == {"": ""}
    with pytest.raises(ValueError, match="odd|even"):
        decode_properties(b"a")
    with pytest.raises(ValueError, match="NUL"):
        encode_properties({"a\x00": "b"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lsn": 0}, r"invalid lsn \(0; expected >= 1\)"),
        ({"term": 0}, r"invalid term \(0; expected >= 1\)"),
        ({"time_tick": -1}, r"invalid time_tick"),
        ({"msg_type": 999}, r"invalid msg_type \(999; expected 1\.\.\d+\)"),
        ({"flags": 1 << 20}, r"invalid flags"),
        ({"flags": int(EntryFlags.TXN_BEGIN)}, r"TXN_\* flag exactly when txn_id != 0"),
        ({"txn_id": 3}, r"TXN_\* flag exactly when txn_id != 0"),
        (
            {"flags": int(EntryFlags.TXN_BEGIN | EntryFlags.TXN_COMMIT), "txn_id": 3},
            r"at most one TXN_\* bit",
        ),
        ({"broadcast_id": 4}, r"BROADCAST exactly when broadcast_id != 0"),
        ({"vchannel_id": -1}, r"invalid ids"),
        ({"key": b"k" * ((1 << 20) + 1)}, r"key too long \(1048577 bytes; expected 0\.\.1048576\)"),
        ({"properties": {"a": "\x00"}}, r"contains NUL"),
    ],
)
def test_invalid_entries_are_rejected_with_what_was_expected(change, message):
    fields = {"lsn": 1, "term": 1, "time_tick": 1, "msg_type": int(MsgType.INSERT)}
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        encode_batch([Entry(**fields)])


def test_batch_order_is_enforced():
    one, two = simple_entries(2)
    with pytest.raises(ValueError, match="non-contiguous lsn"):
        encode_batch([one, Entry(**{**_fields(two), "lsn": 5})])
    with pytest.raises(ValueError, match="term went back"):
        encode_batch([Entry(**{**_fields(one), "term": 2}), two])
    with pytest.raises(ValueError, match="time_tick not increasing"):
        encode_batch([one, Entry(**{**_fields(two), "time_tick": one.time_tick})])
    with pytest.raises(ValueError, match="empty batch"):
        encode_batch([])


def _fields(entry: Entry) -> dict:
    return {name: getattr(entry, name) for name in Entry.__slots__}


def test_scan_batch_names_the_bad_frame():
    batch = encode_batch(simple_entries(5))
    data = bytearray(batch.data)
    third = batch.meta.frame_offsets[2]
    data[third + ENTRY_HEADER_SIZE] ^= 0x40
    with pytest.raises(FormatError, match="crc mismatch") as caught:
        scan_batch(bytes(data))
    assert caught.value.offset == third
    with pytest.raises(FormatError, match=r"unexpected lsn 1 \(expected 7\)"):
        scan_batch(batch.data, expected_first_lsn=7)
    with pytest.raises(FormatError, match="extends past the end"):
        scan_batch(batch.data[:-8])
    with pytest.raises(FormatError, match="out-of-order"):
        scan_batch(batch.data, last_time_tick=10**6)


def test_msg_type_registry():
    assert msg_type_code("insert") == MsgType.INSERT
    assert msg_type_name(MsgType.DDL) == "ddl"
    with pytest.raises(ValueError, match=r"unknown msg_type 'nope' \(expected one of .*insert"):
        msg_type_code("nope")
    with pytest.raises(ValueError, match="unknown msg_type code 0"):
        msg_type_name(0)


def test_file_header_round_trip_and_corruption():
    header = FileHeader("by-dev-rootcoord-dml_7", first_lsn=1234, created_term=9)
    data = encode_file_header(header)
    assert data.startswith(FILE_MAGIC) and len(data) % 8 == 0
    assert decode_file_header(data + b"trailing") == (header, len(data))
    for offset in range(len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0x01
        with pytest.raises(FormatError):
            decode_file_header(bytes(damaged))
    with pytest.raises(FormatError, match="incomplete file header"):
        decode_file_header(data[:20])
    with pytest.raises(ValueError, match=r"invalid pchannel '' \(0 bytes; expected 1\.\.255\)"):
        encode_file_header(FileHeader("", 1, 1))


def test_footer_round_trip_and_trailer():
    summary = SegmentSummary(3, 10, 12, 1, 2, 100, 300, data_end=8192 + 64, digest=77)
    crcs = block_checksums(b"\x01" * (8192 + 64), 8192 + 64, 4096)
    assert len(crcs) == 3
    encoded = encode_footer(summary, 4096, crcs, [40, 120, 200])
    body, trailer = encoded[:-32], encoded[-32:]
    file_size = summary.data_end + len(encoded)
    footer_offset, footer_len, footer_crc = decode_trailer(trailer, file_size)
    assert (footer_offset, footer_len) == (summary.data_end, len(body))
    footer = decode_footer(body, footer_offset, footer_crc)
    assert footer.summary == summary
    assert list(footer.frame_offsets) == [40, 120, 200]
    assert list(footer.block_crcs) == list(crcs)
    assert decode_trailer(b"\x00" * 32, file_size) is None
    with pytest.raises(FormatError, match="footer crc mismatch"):
        decode_footer(body[:-1] + b"\x01", footer_offset, footer_crc)
    with pytest.raises(ValueError, match="index has 2 offsets"):
        encode_footer(summary, 4096, crcs, [1, 2])


def test_footer_parts_reference_the_index_and_match_the_one_buffer_footer():
    summary = SegmentSummary(3, 10, 12, 1, 2, 100, 300, data_end=8192 + 64, digest=77)
    crcs = array("I", block_checksums(b"\x01" * (8192 + 64), 8192 + 64, 4096))
    offsets = array("q", [40, 120, 200])
    parts = encode_footer_parts(summary, 4096, crcs, offsets)
    assert bytes(parts) == encode_footer(summary, 4096, list(crcs), list(offsets))
    assert len(parts) == len(bytes(parts)) and parts.body_len % 8 == 0
    assert sum(len(part) for part in parts.body) == parts.body_len
    # The index part is a view of the writer's own array, not a copy of it.
    offsets[0] = 48
    assert bytes(parts.body[1][:8]) == (48).to_bytes(8, "little")


def test_frame_headers_find_what_decode_batch_decodes_and_catch_a_changed_byte():
    """The Consume path's reader: every frame's header and body, with no Entry built, equal
    to the full decoder's; a byte changed anywhere in a frame (header, key, payload,
    properties, padding) or a cut batch is a FormatError naming the frame."""
    entries = varied_entries(40)
    data = encode_batch(entries).data
    frames = frame_headers(data)
    assert [fields[2] for _, fields in frames] == [e.lsn for e in entries]
    for (offset, fields), entry in zip(frames, entries, strict=True):
        key_start = offset + ENTRY_HEADER_SIZE
        payload_start = key_start + fields[11]
        properties_start = payload_start + fields[12]
        assert (fields[3], fields[4], fields[5], fields[8], fields[10]) == (
            entry.term,
            entry.time_tick,
            entry.vchannel_id,
            entry.msg_type,
            entry.flags,
        )
        assert data[key_start:payload_start] == entry.key
        assert data[payload_start:properties_start] == entry.payload
        assert (
            decode_properties(data[properties_start : properties_start + fields[1]])
            == entry.properties
        )
    assert frame_headers(b"") == []
    third = frames[2][0]
    for position in range(frames[2][0] + 4, frames[3][0]):
        changed = bytearray(data)
        changed[position] ^= 0x01
        with pytest.raises(FormatError) as raised:
            frame_headers(bytes(changed))
        # A changed length may move the frame's end; either way the bad frame is named.
        assert raised.value.offset == third, position
    with pytest.raises(FormatError, match="past the end|incomplete"):
        frame_headers(data[: frames[5][0] + ENTRY_HEADER_SIZE + 1])
