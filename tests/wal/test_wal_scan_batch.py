"""`scan_batch`, the replica's one pass over a replicated batch: every damaged header field,
in every frame position, with and without a batch crc, is refused with the same
FormatError (offset and reason) as the frame-by-frame implementation it replaced (copied
below as the reference), and an intact batch yields the same metadata, including the rows
that carry a seal marker."""

from __future__ import annotations

import struct
from array import array
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.wal.segment_helpers import simple_entries, varied_entries
from wal_segments.format import (
    ENTRY_HEADER,
    ENTRY_HEADER_SIZE,
    FRAME_CRC_SIZE,
    KNOWN_FLAGS,
    MAX_KEY_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_PROPERTIES_BYTES,
    MSG_TYPE_NAMES,
    BatchMeta,
    Entry,
    EntryFlags,
    FormatError,
    MsgType,
    align_up,
    crc32c,
    encode_batch,
    encode_rows,
    scan_batch,
)

SEAL = int(EntryFlags.SEAL_MARKER)

# -- the reference: scan_batch and check_frame as they were before the one-pass scan ---------


def reference_check_frame(data, offset, end, expected_lsn, last_term, last_time_tick, verify_crc):
    if end - offset < ENTRY_HEADER_SIZE:
        return f"incomplete frame header ({end - offset} of {ENTRY_HEADER_SIZE} bytes)"
    fields = ENTRY_HEADER.unpack_from(data, offset)
    (
        crc,
        properties_len,
        lsn,
        term,
        time_tick,
        vchannel_id,
        txn_id,
        broadcast_id,
        msg_type,
        reserved,
        flags,
        key_len,
        payload_len,
    ) = fields
    if key_len > MAX_KEY_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        return f"implausible lengths (key {key_len}, payload {payload_len})"
    if properties_len > MAX_PROPERTIES_BYTES:
        return f"implausible properties length {properties_len}"
    if reserved or flags & ~KNOWN_FLAGS or msg_type not in MSG_TYPE_NAMES:
        return f"bad msg_type {msg_type} / flags {flags:#x} / reserved {reserved}"
    if expected_lsn is not None and lsn != expected_lsn:
        return f"unexpected lsn {lsn} (expected {expected_lsn})"
    if lsn < 1 or term < 1 or time_tick < 0 or min(vchannel_id, txn_id, broadcast_id) < 0:
        return f"bad lsn {lsn} / term {term} / time_tick {time_tick} / ids"
    if term < last_term or time_tick <= last_time_tick:
        return (
            f"out-of-order term {term} / time_tick {time_tick} "
            f"(after {last_term} / {last_time_tick})"
        )
    frame_end = align_up(offset + ENTRY_HEADER_SIZE + key_len + payload_len + properties_len)
    if frame_end > end:
        return f"frame extends past the end ({frame_end} > {end})"
    if verify_crc and crc32c(memoryview(data)[offset + FRAME_CRC_SIZE : frame_end]) != crc:
        return "frame crc mismatch"
    return fields, frame_end


def reference_scan_batch(
    data, *, expected_first_lsn=None, last_term=0, last_time_tick=-1, batch_crc=None
):
    """The old scan_batch, plus the old log's walk for the seal rows."""
    if batch_crc is not None and crc32c(data) != batch_crc:
        raise FormatError(0, "batch crc mismatch")
    verify = batch_crc is None
    view = memoryview(data)
    if not len(view):
        raise FormatError(0, "empty batch")
    offsets = array("q")
    offset, expected, term, tick = 0, expected_first_lsn, last_term, last_time_tick
    first = None
    fields = None
    while offset < len(view):
        checked = reference_check_frame(view, offset, len(view), expected, term, tick, verify)
        if isinstance(checked, str):
            raise FormatError(offset, checked)
        fields, frame_end = checked
        if first is None:
            first = fields
        offsets.append(offset)
        expected, term, tick = fields[2] + 1, fields[3], fields[4]
        offset = frame_end
    assert first is not None and fields is not None
    seal_rows = tuple(
        row
        for row, at in enumerate(offsets)
        if ENTRY_HEADER.unpack_from(data, at)[10] & SEAL  # the old _seal_positions
    )
    return BatchMeta(
        count=len(offsets),
        first_lsn=first[2],
        last_lsn=fields[2],
        first_term=first[3],
        last_term=fields[3],
        first_time_tick=first[4],
        last_time_tick=fields[4],
        size_bytes=len(view),
        frame_offsets=offsets,
        seal_rows=seal_rows,
    )


def outcome(scan, data: bytes, **kwargs):
    """('ok', meta) or ('error', offset, reason) of one scan."""
    try:
        return ("ok", scan(data, **kwargs))
    except FormatError as error:
        return ("error", error.offset, error.reason)


def assert_same(data: bytes, **kwargs):
    expected = outcome(reference_scan_batch, data, **kwargs)
    assert outcome(scan_batch, data, **kwargs) == expected, kwargs
    return expected


# -- damaged header fields ------------------------------------------------------------------

# (name, offset in the frame, struct format) of every fixed header field
FIELDS = [
    ("crc", 0, "<I"),
    ("properties_len", 4, "<I"),
    ("lsn", 8, "<q"),
    ("term", 16, "<q"),
    ("time_tick", 24, "<q"),
    ("vchannel_id", 32, "<q"),
    ("txn_id", 40, "<q"),
    ("broadcast_id", 48, "<q"),
    ("msg_type", 56, "<H"),
    ("reserved", 58, "<H"),
    ("flags", 60, "<I"),
    ("key_len", 64, "<I"),
    ("payload_len", 68, "<I"),
]
assert sum(struct.calcsize(fmt) for _, _, fmt in FIELDS) == ENTRY_HEADER_SIZE


def bad_values(fmt: str, current: int) -> list[int]:
    bits = 8 * struct.calcsize(fmt)
    if fmt[-1].islower():
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    else:
        low, high = 0, (1 << bits) - 1
    candidates = {low, high, 0, 1, 2, 8, 21, 64, 255, 1 << 16, 1 << 20, (1 << 20) + 1, 64 << 20}
    candidates |= {current - 8, current - 1, current + 1, current + 8, current ^ 0x20}
    candidates |= {-1, 1 << 40}
    return sorted(v for v in candidates if low <= v <= high and v != current)


def frame_extent(meta: BatchMeta, row: int) -> tuple[int, int]:
    start = meta.frame_offsets[row]
    end = meta.frame_offsets[row + 1] if row + 1 < meta.count else meta.size_bytes
    return start, end


def runs_batch() -> bytes:
    """Same-size frames in runs (checked column-wise by scan_batch) with what breaks a run:
    a frame of the same size but other lengths, a producer's properties, a term change, a
    tick jump, mixed flags and message types inside a run."""
    rows = []
    tick = 1000
    for lsn in range(1, 61):
        term = 2 if lsn < 50 else 3
        tick += 1 if lsn % 17 else 50
        key, payload, properties = b"", bytes(100), {}
        flags, txn_id, msg_type = 0, 0, int(MsgType.MESSAGE)
        if lsn == 11:
            properties = {"a": "bc"}  # 4 bytes: the same frame size, other lengths
        elif lsn == 21:
            properties = {"rw.producer": "p", "rw.seq": "7", "rw.count": "21"}
        elif 22 <= lsn < 45:
            payload = bytes(60)
            if lsn % 5 == 0:
                flags, txn_id, msg_type = int(EntryFlags.TXN_BODY), 9, int(MsgType.INSERT)
        elif lsn >= 45:
            key = b"kk"  # the same frame size as the first run, other lengths
        rows.append((lsn, term, tick, msg_type, 4, flags, txn_id, 0, key, payload, properties))
    return encode_rows(rows)


BATCHES = {
    "runs": runs_batch(),
    "bench-like": encode_rows(
        [
            (
                500 + i,
                7,
                1 << 40 | i,
                int(MsgType.MESSAGE),
                3,
                0,
                0,
                0,
                b"",
                bytes(100),
                {"rw.producer": "p", "rw.seq": "1", "rw.count": "100"} if i == 99 else {},
            )
            for i in range(100)
        ]
    ),
    "uniform": encode_batch(simple_entries(6, first_lsn=40, term=3, first_tick=500, size=100)),
    "varied": encode_batch(varied_entries(9, first_lsn=7, term=2)),
    "sealed last": encode_batch(
        simple_entries(3, first_lsn=5, term=2, first_tick=50)
        + [Entry(lsn=8, term=2, time_tick=60, msg_type=int(MsgType.SEAL), flags=SEAL)]
    ),
}


@pytest.mark.parametrize("name", sorted(BATCHES))
@pytest.mark.parametrize("field", [f[0] for f in FIELDS])
def test_every_damaged_header_field_is_refused_as_before(name: str, field: str):
    batch = BATCHES[name]
    meta = batch.meta
    _, field_at, fmt = next(f for f in FIELDS if f[0] == field)
    rows = sorted({0, 1, 2, meta.count // 2, meta.count - 2, meta.count - 1})
    if name == "runs":
        rows = sorted(set(rows) | {9, 10, 11, 12, 19, 20, 21, 22, 30, 43, 44, 45})
    checked = refused = 0
    for row in rows:
        start, end = frame_extent(meta, row)
        current = struct.unpack_from(fmt, batch.data, start + field_at)[0]
        for value in bad_values(fmt, current):
            raw = bytearray(batch.data)
            struct.pack_into(fmt, raw, start + field_at, value)
            variants = [bytes(raw)]
            if field != "crc":
                # The frame's crc re-sealed over its original extent: the structural
                # checks decide, also on the path that verifies every frame's crc.
                struct.pack_into("<I", raw, start, crc32c(bytes(raw[start + 4 : end])))
                variants.append(bytes(raw))
            for data in variants:
                for kwargs in (
                    {},
                    {"batch_crc": crc32c(data)},
                    {"expected_first_lsn": meta.first_lsn, "batch_crc": crc32c(data)},
                    {
                        "expected_first_lsn": meta.first_lsn,
                        "last_term": meta.first_term,
                        "last_time_tick": meta.first_time_tick - 1,
                    },
                ):
                    result = assert_same(data, **kwargs)
                    checked += 1
                    refused += result[0] == "error"
    assert checked and refused  # every field has values that make the batch bad


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_intact_batches_give_the_same_metadata(name: str):
    batch = BATCHES[name]
    meta = batch.meta
    assert scan_batch(batch.data) == reference_scan_batch(batch.data) == meta
    for kwargs in (
        {"batch_crc": crc32c(batch.data)},
        {"expected_first_lsn": meta.first_lsn},
        {"expected_first_lsn": meta.first_lsn + 1},
        {"expected_first_lsn": 0},
        {"expected_first_lsn": -3},
        {"last_term": meta.first_term},
        {"last_term": meta.first_term + 1},
        {"last_time_tick": meta.first_time_tick - 1},
        {"last_time_tick": meta.first_time_tick},
        {"last_time_tick": -5},
        {"last_term": -5},
        {"batch_crc": crc32c(batch.data) ^ 1},
    ):
        assert_same(batch.data, **kwargs)


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_truncated_and_extended_batches_are_refused_as_before(name: str):
    data = BATCHES[name].data
    for cut in range(0, len(data) + 1):
        for kwargs in ({}, {"batch_crc": crc32c(data[:cut])}):
            assert_same(data[:cut], **kwargs)
    for tail in (b"\x00" * 8, b"\x00" * 72, data[:72], data):
        assert_same(data + tail, batch_crc=crc32c(data + tail))


def test_zero_lsn_and_term_frames_are_refused_as_before():
    rows = [(lsn, 1, 10 + lsn, int(MsgType.MESSAGE), 0, 0, 0, 0, b"", b"x", {}) for lsn in (1, 2)]
    data = bytearray(encode_rows(rows).data)
    for first_lsn in (0, -1):
        for second in (first_lsn + 1, 5):
            struct.pack_into("<q", data, 8, first_lsn)
            struct.pack_into("<q", data, 8 + 80, second)
            for expected in (None, first_lsn, 1):
                assert_same(bytes(data), expected_first_lsn=expected, batch_crc=crc32c(bytes(data)))


def test_messages_are_pinned():
    batch = encode_batch(simple_entries(3, first_lsn=4, term=2, first_tick=10))
    second = batch.meta.frame_offsets[1]

    def refused(data: bytes, **kwargs) -> tuple[int, str]:
        with pytest.raises(FormatError) as caught:
            scan_batch(data, batch_crc=crc32c(data), **kwargs)
        return caught.value.offset, caught.value.reason

    def patch(at: int, fmt: str, value: int) -> bytes:
        raw = bytearray(batch.data)
        struct.pack_into(fmt, raw, second + at, value)
        return bytes(raw)

    assert refused(patch(8, "<q", 9)) == (second, "unexpected lsn 9 (expected 5)")
    assert refused(patch(16, "<q", 1)) == (
        second,
        "out-of-order term 1 / time_tick 11 (after 2 / 10)",
    )
    assert refused(patch(24, "<q", 10)) == (
        second,
        "out-of-order term 2 / time_tick 10 (after 2 / 10)",
    )
    assert refused(patch(40, "<q", -1)) == (second, "bad lsn 5 / term 2 / time_tick 11 / ids")
    assert refused(patch(56, "<H", 99)) == (second, "bad msg_type 99 / flags 0x0 / reserved 0")
    assert refused(patch(58, "<H", 1)) == (second, "bad msg_type 5 / flags 0x0 / reserved 1")
    assert refused(patch(60, "<I", 1 << 9)) == (
        second,
        "bad msg_type 5 / flags 0x200 / reserved 0",
    )
    assert refused(patch(64, "<I", MAX_KEY_BYTES + 1)) == (
        second,
        f"implausible lengths (key {MAX_KEY_BYTES + 1}, payload 24)",
    )
    assert refused(patch(4, "<I", MAX_PROPERTIES_BYTES + 1)) == (
        second,
        f"implausible properties length {MAX_PROPERTIES_BYTES + 1}",
    )
    assert refused(patch(68, "<I", 1000)) == (
        second,
        f"frame extends past the end ({align_up(second + 72 + 2 + 1000)} > {len(batch.data)})",
    )
    with pytest.raises(FormatError) as caught:
        scan_batch(patch(72, "<B", 0))
    assert (caught.value.offset, caught.value.reason) == (second, "frame crc mismatch")
    assert refused(batch.data[: second + 40]) == (
        second,
        "incomplete frame header (40 of 72 bytes)",
    )


def test_seal_rows_are_every_flagged_row():
    entries = simple_entries(5, first_lsn=1, term=1)
    for seal_at in ((), (4,), (0,), (2,), (1, 4), (0, 1, 2, 3, 4)):
        marked = [replace(e, flags=SEAL) if i in seal_at else e for i, e in enumerate(entries)]
        batch = encode_batch(marked)
        assert batch.meta.seal_rows == seal_at
        assert scan_batch(batch.data).seal_rows == seal_at
        assert scan_batch(batch.data, batch_crc=crc32c(batch.data)).seal_rows == seal_at


def test_length_limits_hold_in_batches_above_a_mebibyte():
    # Below 1 MiB a frame that ends inside the batch cannot break a length limit; above,
    # the limits are tested on their own.
    payload = bytes(2 << 20)
    batch = encode_batch(
        [Entry(lsn=1, term=1, time_tick=1, msg_type=int(MsgType.MESSAGE), payload=payload)]
    )
    for key_len in (MAX_KEY_BYTES, MAX_KEY_BYTES + 1, MAX_KEY_BYTES + 8):
        raw = bytearray(batch.data)
        struct.pack_into("<II", raw, 64, key_len, len(payload) - key_len)
        data = bytes(raw)
        assert_same(data, batch_crc=crc32c(data))
    raw = bytearray(batch.data)
    struct.pack_into("<II", raw, 64, MAX_KEY_BYTES + 1, len(payload) - MAX_KEY_BYTES - 1)
    assert outcome(scan_batch, bytes(raw), batch_crc=crc32c(bytes(raw)))[2] == (
        f"implausible lengths (key {MAX_KEY_BYTES + 1}, payload {len(payload) - MAX_KEY_BYTES - 1})"
    )
    raw = bytearray(batch.data)
    struct.pack_into("<I", raw, 4, MAX_PROPERTIES_BYTES + 1)
    struct.pack_into("<I", raw, 68, len(payload) - MAX_PROPERTIES_BYTES - 1)
    assert outcome(scan_batch, bytes(raw), batch_crc=crc32c(bytes(raw)))[2] == (
        f"implausible properties length {MAX_PROPERTIES_BYTES + 1}"
    )


def test_same_size_runs_are_checked_column_wise(monkeypatch: pytest.MonkeyPatch):
    """The batches above do go through the column-wise check (so the comparisons with the
    reference cover it), and a batch of one size is one run after its first frame."""
    from wal_segments import format as module

    runs: list[tuple[int, int, int, bool]] = []
    checked = module._same_size_run

    def spy(*args):
        result = checked(*args)
        runs.append((args[3], args[4], args[5], result is not None))
        return result

    monkeypatch.setattr(module, "_same_size_run", spy)
    bench_like = BATCHES["bench-like"]
    assert scan_batch(bench_like.data) == bench_like.meta
    assert runs == [(176, 176, 98, True)]
    runs.clear()
    batch = BATCHES["runs"]
    for kwargs in ({}, {"batch_crc": crc32c(batch.data)}):
        assert scan_batch(batch.data, **kwargs) == batch.meta
    assert sum(count for _, _, count, taken in runs if taken) >= 2 * 40
    assert all(taken for *_, taken in runs)


@pytest.mark.parametrize("name", ["runs", "bench-like", "uniform"])
@pytest.mark.parametrize("field", [f[0] for f in FIELDS])
def test_a_field_damaged_alike_in_every_frame_is_refused_as_before(name: str, field: str):
    """The same bad value in every frame after the first (a run whose column is one
    repeated value, which scan_batch compares as bytes) or in every frame."""
    batch = BATCHES[name]
    meta = batch.meta
    _, field_at, fmt = next(f for f in FIELDS if f[0] == field)
    current = struct.unpack_from(fmt, batch.data, meta.frame_offsets[1] + field_at)[0]
    for value in bad_values(fmt, current):
        for first_row in (0, 1):
            raw = bytearray(batch.data)
            for row in range(first_row, meta.count):
                struct.pack_into(fmt, raw, meta.frame_offsets[row] + field_at, value)
            data = bytes(raw)
            assert_same(data, batch_crc=crc32c(data))
            assert_same(data, expected_first_lsn=meta.first_lsn, batch_crc=crc32c(data))
            assert_same(data)


FUZZ = settings(
    max_examples=1500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FUZZ
@given(
    name=st.sampled_from(sorted(BATCHES)),
    edits=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1),  # which frame
            st.integers(0, ENTRY_HEADER_SIZE - 1),  # which header byte
            st.integers(1, 255),  # xor mask
            st.booleans(),  # in every frame from that one on
        ),
        min_size=1,
        max_size=3,
    ),
    crc=st.sampled_from(["batch", "frames", "resealed"]),
    expect=st.booleans(),
)
def test_fuzzed_headers_are_refused_as_before(name, edits, crc, expect):
    batch = BATCHES[name]
    meta = batch.meta
    raw = bytearray(batch.data)
    for fraction, at, mask, onwards in edits:
        row = min(int(fraction * meta.count), meta.count - 1)
        for target in range(row, meta.count if onwards else row + 1):
            raw[meta.frame_offsets[target] + at] ^= mask
    if crc == "resealed":
        for row in range(meta.count):
            start, end = frame_extent(meta, row)
            struct.pack_into("<I", raw, start, crc32c(bytes(raw[start + 4 : end])))
    data = bytes(raw)
    kwargs: dict = {"expected_first_lsn": meta.first_lsn} if expect else {}
    if crc == "batch":
        kwargs["batch_crc"] = crc32c(data)
    assert_same(data, **kwargs)
