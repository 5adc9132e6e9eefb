"""Vectorized decoding of a sealed segment's frames into Arrow columns.

What lives here: the Arrow schema Spark reads (`SCHEMA`) and the functions that turn a
verified segment buffer plus its footer index into columns, using only pyarrow compute
kernels: the fixed 72-byte headers are gathered as 64-bit words (`take` at frame offset / 8
+ word number, a block of frames at a time so that the block's headers are read from the
CPU cache), and key, payload and properties are cut out of the file by a zero-copy
"pieces" binary array whose offsets are the interleaved section boundaries of every frame,
then gathered with one `take` each. No per-row Python object is created, and numpy is not
needed.

What must never happen here: I/O, or trusting the index. The caller has verified the footer
crc and the block crcs; this module still checks that the index chains the frames exactly
(every offset aligned, each frame ending where the next begins, the last at the range end),
that LSNs are contiguous, terms non-decreasing and time ticks increasing, so that a buggy
or crafted file yields a `FormatError`, never an out-of-bounds read or wrong rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from wal_segments.format import (
    BROADCAST_FLAG,
    ENTRY_HEADER_SIZE,
    KNOWN_FLAGS,
    MAX_MSG_TYPE_CODE,
    MAX_SEGMENT_BYTES,
    MSG_TYPE_NAMES,
    TXN_FLAGS,
    WORD_BROADCAST_ID,
    WORD_CRC_PROPERTIES_LEN,
    WORD_KEY_PAYLOAD_LEN,
    WORD_LSN,
    WORD_MSG_TYPE_FLAGS,
    WORD_TERM,
    WORD_TIME_TICK,
    WORD_TXN_ID,
    WORD_VCHANNEL_ID,
    FormatError,
)

if sys.byteorder != "little":
    # The header words (word_views), the packed section boundaries (_pack) and the
    # constant columns read the little-endian segment format as native integers.
    raise ImportError("wal_segments.columnar needs a little-endian host")

SCHEMA = pa.schema(
    [
        pa.field("pchannel", pa.string(), nullable=False),
        pa.field("vchannel", pa.string(), nullable=False),
        pa.field("segment_id", pa.int64(), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("term", pa.int64(), nullable=False),
        pa.field("time_tick", pa.int64(), nullable=False),
        pa.field("msg_type", pa.string(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("txn_id", pa.int64(), nullable=True),
        pa.field("broadcast_id", pa.int64(), nullable=True),
        pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
    ]
)

#: Fixed header fields as columns, what `header_columns` returns.
HEADER_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.uint64(), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("term", pa.int64(), nullable=False),
        pa.field("time_tick", pa.int64(), nullable=False),
        pa.field("msg_type", pa.uint16(), nullable=False),
        pa.field("flags", pa.uint32(), nullable=False),
        pa.field("vchannel_id", pa.int64(), nullable=False),
        pa.field("txn_id", pa.int64(), nullable=False),
        pa.field("broadcast_id", pa.int64(), nullable=False),
        pa.field("key_len", pa.uint32(), nullable=False),
        pa.field("payload_len", pa.uint32(), nullable=False),
        pa.field("properties_len", pa.uint32(), nullable=False),
    ]
)

# Indexed by msg_type code, one entry for each of the 65,536 codes a header can hold (so
# that a lookup needs no bounds check); null where no type is registered.
_MSG_TYPE_NAMES_BY_CODE = pa.array(
    [MSG_TYPE_NAMES.get(code) for code in range(1 << 16)], pa.string()
)


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.uint64())


def _i64(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.int64())


def _i32(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.int32())


_INT64 = pa.int64()


#: Longest index sequence kept for reuse: `arange` and the interleave patterns are sliced
#: from a cached array instead of being built for every decode (building 750,000 of them
#: took 4 ms, a tenth of a segment's decode). At most 8 MiB per cached sequence (int64
#: aranges; int32 ones and the patterns of each width, 4 MiB), about 30 MiB in a process
#: that decodes with and without properties; longer sequences are built each time.
_SEQUENCE_CACHE_MAX = 1 << 20

_sequences: dict[tuple[object, ...], pa.Array] = {}


def _sequence(key: tuple[object, ...], count: int, build: Callable[[int], pa.Array]) -> pa.Array:
    """The first `count` elements of the prefix-stable sequence `build` makes, from a
    cache that grows by doubling up to `_SEQUENCE_CACHE_MAX` elements."""
    cached = _sequences.get(key)
    if cached is not None and len(cached) >= count:
        return cached.slice(0, count)
    if count > _SEQUENCE_CACHE_MAX:
        return build(count)
    grown = min(_SEQUENCE_CACHE_MAX, max(count, 2 * len(cached) if cached is not None else 0))
    built = build(grown)
    _sequences[key] = built  # a plain assignment: a racing thread at worst builds it twice
    return built.slice(0, count)


def _build_arange(count: int, type_: pa.DataType) -> pa.Array:
    return pc.subtract(
        pc.cumulative_sum(pa.repeat(pa.scalar(1, type_), count)), pa.scalar(1, type_)
    )


def arange(count: int, type_: pa.DataType = _INT64) -> pa.Array:
    """0, 1, ..., count - 1 without a Python loop."""
    if count == 0:
        return pa.array([], type_)
    return _sequence(("arange", type_), count, lambda n: _build_arange(n, type_))


def word_views(buffer: pa.Buffer) -> tuple[pa.Array, pa.Array]:
    """The buffer as uint64 and int64 words (zero-copy); the buffer must be 8-byte aligned."""
    if buffer.address % 8:
        raise ValueError("segment buffer is not 8-byte aligned (copy it into an Arrow buffer)")
    words = buffer.size // 8
    return (
        pa.Array.from_buffers(pa.uint64(), words, [None, buffer]),
        pa.Array.from_buffers(pa.int64(), words, [None, buffer]),
    )


@dataclass(frozen=True, slots=True)
class HeaderColumns:
    """Verified fixed-header fields of a run of consecutive frames."""

    offsets: pa.Array  # uint64, absolute frame offsets
    lsn: pa.Array  # int64
    term: pa.Array
    time_tick: pa.Array
    vchannel_id: pa.Array
    txn_id: pa.Array
    broadcast_id: pa.Array
    msg_type: pa.Array  # uint64 (codes <= 0xFFFF)
    flags: pa.Array  # uint64 (bits <= 0xFFFFFFFF)
    key_len: pa.Array  # uint64
    payload_len: pa.Array
    properties_len: pa.Array
    msg_type_name: pa.Array  # string, the registered name of msg_type

    def __len__(self) -> int:
        return len(self.offsets)

    def to_record_batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [
                self.offsets,
                self.lsn,
                self.term,
                self.time_tick,
                self.msg_type.cast(pa.uint16()),
                self.flags.cast(pa.uint32()),
                self.vchannel_id,
                self.txn_id,
                self.broadcast_id,
                self.key_len.cast(pa.uint32()),
                self.payload_len.cast(pa.uint32()),
                self.properties_len.cast(pa.uint32()),
            ],
            schema=HEADER_SCHEMA,
        )


def _first_false(mask: pa.Array) -> int:
    """Index of the first false value of a boolean array, or -1."""
    return int(pc.index(mask, False).as_py())


def _require(mask: pa.Array, offsets: pa.Array, shift: int, reason: str) -> None:
    """FormatError at the frame of the first false value in `mask` (row = index + shift)."""
    index = _first_false(mask)
    if index >= 0:
        raise FormatError(int(offsets[index + shift].as_py()), reason)


class _Checks:
    """Row checks gathered as boolean masks and verified together: one reduction over all of
    them, and only on failure a search for the first bad row of the first failing check (the
    same FormatError an immediate check would raise)."""

    def __init__(self) -> None:
        self.pending: list[tuple[pa.Array, pa.Array, int, str]] = []

    def require(self, mask: pa.Array, offsets: pa.Array, shift: int, reason: str) -> None:
        self.pending.append((mask, offsets, shift, reason))

    def verify(self) -> None:
        if not self.pending:
            return
        combined: dict[int, pa.Array] = {}  # by length: masks of count or count - 1 rows
        for mask, _, _, _ in self.pending:
            other = combined.get(len(mask))
            combined[len(mask)] = mask if other is None else pc.and_(other, mask)
        if not all(pc.all(mask).as_py() is not False for mask in combined.values()):
            for mask, offsets, shift, reason in self.pending:
                _require(mask, offsets, shift, reason)
        self.pending.clear()


#: Frames whose header words are gathered together. Gathering each of the nine words over a
#: whole segment read its headers from memory nine times (a 42 MiB segment does not fit in
#: the cache); a block's headers (two cache lines each, 4 MiB for 32,768 frames) stay
#: cached across its nine gathers. Measured on a 250,000-frame segment: 20-21 ms for the
#: nine whole-segment gathers, 11-12 ms in blocks, including the concatenation.
GATHER_BLOCK_FRAMES = 32_768

# The header words decode_headers reads, in the order _gather_words returns them; the
# first three unsigned, the rest signed.
_UNSIGNED_WORDS = (WORD_CRC_PROPERTIES_LEN, WORD_MSG_TYPE_FLAGS, WORD_KEY_PAYLOAD_LEN)
_SIGNED_WORDS = (
    WORD_LSN,
    WORD_TERM,
    WORD_TIME_TICK,
    WORD_VCHANNEL_ID,
    WORD_TXN_ID,
    WORD_BROADCAST_ID,
)


def _gather_words(buffer: pa.Buffer, base: pa.Array) -> list[pa.Array]:
    """The header words of the frames whose first word is at `base` (uint64 word indexes,
    in bounds: the caller checked them), block by block, each block's words together.
    Word k of every frame is gathered from the word view sliced by k (zero-copy), not by
    adding k to every index: one pass less per word."""
    unsigned, signed = word_views(buffer)
    sources = [unsigned.slice(number) for number in _UNSIGNED_WORDS] + [
        signed.slice(number) for number in _SIGNED_WORDS
    ]
    count = len(base)
    blocks: list[list[pa.Array]] = [[] for _ in sources]
    for start in range(0, count, GATHER_BLOCK_FRAMES):
        block = base.slice(start, GATHER_BLOCK_FRAMES)
        for parts, source in zip(blocks, sources, strict=True):
            parts.append(pc.take(source, block, boundscheck=False))
    return [parts[0] if len(parts) == 1 else pa.concat_arrays(parts) for parts in blocks]


def decode_headers(
    buffer: pa.Buffer,
    offsets: pa.Array,
    *,
    first_lsn: int,
    lower_bound: int,
    end_offset: int,
    start_offset: int | None = None,
) -> HeaderColumns:
    """Gather and verify the fixed headers of the frames at `offsets` (uint64, consecutive
    frames), which must start at or after `lower_bound` (exactly at `start_offset` when
    given) and end exactly at `end_offset`.

    The checks run in two forms. `_headers_pass` is the fast one: fewer passes, each
    condition chosen so that, when all hold, every check of `_check_in_order` holds too
    (the reasoning is next to each). When any fails, `_check_in_order` runs the checks one
    by one in their documented order and raises the FormatError of the first failing check
    at its first bad frame; so a damaged header is reported exactly as by the checks alone,
    and a header the fast form was too strict about (none is known) still decodes."""
    count = len(offsets)
    if count == 0:
        raise ValueError("no frames to decode")
    if end_offset > buffer.size or end_offset > MAX_SEGMENT_BYTES:
        raise FormatError(end_offset, f"frames end past the buffer ({buffer.size} bytes)")
    offsets = offsets.cast(pa.uint64())
    # Bounds before any gather, so that every take below stays inside the buffer.
    low, high = pc.min_max(offsets).values()
    if low.as_py() < lower_bound or high.as_py() + ENTRY_HEADER_SIZE > end_offset:
        raise FormatError(int(low.as_py()), "index offset outside the frame region")
    if start_offset is not None and offsets[0].as_py() != start_offset:
        raise FormatError(start_offset, "first index offset is not the first frame")
    # In bounds: every offset + the header size is <= end_offset <= the buffer size.
    (
        crc_properties,
        type_flags,
        lengths,
        lsn,
        term,
        time_tick,
        vchannel_id,
        txn_id,
        broadcast_id,
    ) = _gather_words(buffer, pc.shift_right(offsets, _u64(3)))
    low32 = _u64(0xFFFFFFFF)
    msg_type = pc.bit_wise_and(type_flags, _u64(0xFFFF))
    headers = HeaderColumns(
        offsets=offsets,
        lsn=lsn,
        term=term,
        time_tick=time_tick,
        vchannel_id=vchannel_id,
        txn_id=txn_id,
        broadcast_id=broadcast_id,
        msg_type=msg_type,
        flags=pc.shift_right(type_flags, _u64(32)),
        key_len=pc.bit_wise_and(lengths, low32),
        payload_len=pc.shift_right(lengths, _u64(32)),
        properties_len=pc.shift_right(crc_properties, _u64(32)),
        # Null for an unregistered code, which the checks below report.
        msg_type_name=_msg_type_names(msg_type),
    )
    # The frames must chain exactly: each ends (padded to 8) where the next starts.
    body = pc.add(pc.add(headers.key_len, headers.payload_len), headers.properties_len)
    size = pc.bit_wise_and(pc.add(body, _u64(ENTRY_HEADER_SIZE + 7)), _u64(~7 & (2**64 - 1)))
    ends = pc.add(offsets, size)
    if not _headers_pass(headers, type_flags, ends, first_lsn=first_lsn, end_offset=end_offset):
        _check_in_order(headers, type_flags, ends, first_lsn=first_lsn, end_offset=end_offset)
    return headers


#: Bits of the msg_type/flags word that no valid header sets: the reserved 16 bits and
#: the flags no version of the format defines.
_NEVER_SET = (0xFFFF << 16) | ((~KNOWN_FLAGS & 0xFFFFFFFF) << 32)


def _headers_pass(
    headers: HeaderColumns,
    type_flags: pa.Array,
    ends: pa.Array,
    *,
    first_lsn: int,
    end_offset: int,
) -> bool:
    """Whether the headers certainly pass every check of `_check_in_order`, in fewer
    passes over the columns; False says only that `_check_in_order` must look."""
    offsets = headers.offsets
    count = len(offsets)
    # The last frame ends at the range end and each frame ends where the next starts;
    # since every frame's padded size is a multiple of 8 and at least the header size, an
    # aligned first offset makes every offset aligned, and no two frames overlap.
    if ends[count - 1].as_py() != end_offset or offsets[0].as_py() % 8:
        return False
    masks: list[pa.Array] = []
    if count > 1:
        masks.append(pc.equal(ends.slice(0, count - 1), offsets.slice(1)))
    # A registered name for every code (the table has one entry per 16-bit code).
    if headers.msg_type_name.null_count:
        return False
    # lsn[i] - i == first_lsn for every i: lsn contiguous from first_lsn. (Both sides
    # are in int64's range, so the wrapping subtraction cannot make a false match.)
    lsn_base = pc.min_max(pc.subtract(headers.lsn, arange(count)))
    if lsn_base["min"].as_py() != first_lsn or lsn_base["max"].as_py() != first_lsn:
        return False
    # Terms >= 1 and never going back: the minimum, and (a segment of several terms
    # only) each term against the one before.
    terms = pc.min_max(headers.term)
    if terms["min"].as_py() < 1:
        return False
    if terms["min"].as_py() != terms["max"].as_py():
        masks.append(pc.greater_equal(headers.term.slice(1), headers.term.slice(0, count - 1)))
    # Time ticks strictly increasing from a first one >= 0: all >= 0.
    if headers.time_tick[0].as_py() < 0:
        return False
    if count > 1:
        masks.append(pc.greater(headers.time_tick.slice(1), headers.time_tick.slice(0, count - 1)))
    if pc.min(headers.vchannel_id).as_py() < 0:
        return False
    never_set = _NEVER_SET
    for ids, bits in ((headers.txn_id, TXN_FLAGS), (headers.broadcast_id, BROADCAST_FLAG)):
        found = pc.min_max(ids)
        if found["min"].as_py() < 0:
            return False
        if found["max"].as_py() == 0:
            # No id anywhere: then no frame may carry the flags either.
            never_set |= bits << 32
        else:
            has_flag = pc.not_equal(pc.bit_wise_and(headers.flags, _u64(bits)), _u64(0))
            masks.append(pc.equal(has_flag, pc.not_equal(ids, _i64(0))))
    if pc.max(pc.bit_wise_and(type_flags, _u64(never_set))).as_py() != 0:
        return False
    combined: dict[int, pa.Array] = {}  # by length: masks of count or count - 1 rows
    for mask in masks:
        other = combined.get(len(mask))
        combined[len(mask)] = mask if other is None else pc.and_(other, mask)
    return all(pc.all(mask).as_py() for mask in combined.values())


def _check_in_order(
    headers: HeaderColumns,
    type_flags: pa.Array,
    ends: pa.Array,
    *,
    first_lsn: int,
    end_offset: int,
) -> None:
    """Every header check, each as its own boolean mask, verified in the documented order:
    the FormatError of the first failing check at its first bad frame."""
    offsets = headers.offsets
    count = len(offsets)
    checks = _Checks()
    checks.require(
        pc.equal(pc.bit_wise_and(offsets, _u64(7)), _u64(0)), offsets, 0, "unaligned frame"
    )
    if count > 1:
        checks.require(
            pc.greater_equal(
                offsets.slice(1), pc.add(offsets.slice(0, count - 1), _u64(ENTRY_HEADER_SIZE))
            ),
            offsets,
            1,
            "index offsets overlap",
        )
        checks.require(
            pc.equal(ends.slice(0, count - 1), offsets.slice(1)),
            offsets,
            0,
            "frame length disagrees with the index",
        )
    checks.verify()
    if ends[count - 1].as_py() != end_offset:
        raise FormatError(
            int(offsets[count - 1].as_py()), "last frame does not end at the range end"
        )

    reserved = pc.bit_wise_and(pc.shift_right(type_flags, _u64(16)), _u64(0xFFFF))
    flags, msg_type = headers.flags, headers.msg_type
    checks.require(pc.equal(reserved, _u64(0)), offsets, 0, "nonzero reserved header field")
    checks.require(
        pc.equal(pc.bit_wise_and(flags, _u64(~KNOWN_FLAGS & 0xFFFFFFFF)), _u64(0)),
        offsets,
        0,
        "unknown flags",
    )
    if pc.max(msg_type).as_py() > MAX_MSG_TYPE_CODE:
        # Now, not deferred, as before the name table covered every 16-bit code.
        _require(pc.less_equal(msg_type, _u64(MAX_MSG_TYPE_CODE)), offsets, 0, "unknown msg_type")
    checks.require(pc.is_valid(headers.msg_type_name), offsets, 0, "unknown msg_type")

    lsn, term, time_tick = headers.lsn, headers.term, headers.time_tick
    checks.require(
        pc.equal(lsn, pc.add(arange(count), _i64(first_lsn))),
        offsets,
        0,
        "lsn is not contiguous with the index",
    )
    if pc.min(term).as_py() < 1 or pc.min(time_tick).as_py() < 0:
        checks.require(pc.greater_equal(term, _i64(1)), offsets, 0, "bad term")
        checks.require(pc.greater_equal(time_tick, _i64(0)), offsets, 0, "bad time_tick")
    for ids in (headers.vchannel_id, headers.txn_id, headers.broadcast_id):
        if pc.min(ids).as_py() < 0:
            checks.require(pc.greater_equal(ids, _i64(0)), offsets, 0, "negative id")
    if count > 1:
        checks.require(
            pc.greater_equal(term.slice(1), term.slice(0, count - 1)), offsets, 1, "term went back"
        )
        checks.require(
            pc.greater(time_tick.slice(1), time_tick.slice(0, count - 1)),
            offsets,
            1,
            "time_tick not increasing",
        )
    has_txn_flag = pc.not_equal(pc.bit_wise_and(flags, _u64(TXN_FLAGS)), _u64(0))
    checks.require(
        pc.equal(has_txn_flag, pc.not_equal(headers.txn_id, _i64(0))),
        offsets,
        0,
        "txn flags disagree with txn_id",
    )
    has_broadcast_flag = pc.not_equal(pc.bit_wise_and(flags, _u64(BROADCAST_FLAG)), _u64(0))
    checks.require(
        pc.equal(has_broadcast_flag, pc.not_equal(headers.broadcast_id, _i64(0))),
        offsets,
        0,
        "broadcast flag disagrees with broadcast_id",
    )
    checks.verify()


def _interleave_index(width: int, count: int) -> pa.Array:
    """The take index that interleaves `width` concatenated columns of `count` rows. The
    last one built for each width is kept: the segments of a workload mostly hold the
    same number of frames, and building it is two passes over width * count elements."""
    cached = _interleave_indexes.get(width)
    if cached is not None and len(cached) == width * count:
        return cached
    total = width * count
    # Element p of the result is element p // width of column p % width, which sits at
    # (p % width) * count + p // width in the concatenation.
    column = _sequence(
        ("column", width), total, lambda n: pc.remainder(_build_arange(n, pa.int32()), _i32(width))
    )
    row = _sequence(
        ("row", width), total, lambda n: pc.divide(_build_arange(n, pa.int32()), _i32(width))
    )
    index = pc.add(pc.multiply(column, _i32(count)), row)
    if total <= _SEQUENCE_CACHE_MAX:
        _interleave_indexes[width] = index  # a plain assignment, as in _sequence
    return index


_interleave_indexes: dict[int, pa.Array] = {}


def _interleave(columns: list[pa.Array]) -> pa.Array:
    """[a0, b0, c0, a1, b1, c1, ...] from equally long columns a, b, c of one type."""
    index = _interleave_index(len(columns), len(columns[0]))
    return pc.take(pa.concat_arrays(columns), index, boundscheck=False)


def _repeated(values: list[bytes], counts: list[int]) -> pa.Buffer:
    """values[0] counts[0] times, then values[1] counts[1] times, ..., in one buffer from
    Arrow's memory pool. (Large Python bytes objects would do too, but glibc maps and
    unmaps each one, and every page is faulted in again on the next batch.)"""
    repeated = pc.binary_repeat(pa.array(values, pa.binary()), pa.array(counts, pa.int64()))
    data = repeated.buffers()[2]
    return pa.py_buffer(b"") if data is None else data


def _zero_offsets(count: int) -> pa.Buffer:
    """`count` + 1 int32 zeros: the offsets of `count` empty values."""
    return _repeated([bytes(4)], [count + 1])


def _pack(low: pa.Array, high: pa.Array) -> pa.Array:
    """uint64 words `low | high << 32` of uint64 columns below 2**31: read as int32 (the
    little-endian order Arrow's buffers have), [low0, high0, low1, high1, ...]."""
    return pc.bit_wise_or(low, pc.shift_left(high, _u64(32)))


def _gather_sections(
    buffer: pa.Buffer, headers: HeaderColumns, with_properties: bool
) -> tuple[pa.Array, pa.Array, pa.Array | None]:
    """(keys, payloads, property blobs) as contiguous binary arrays, cut out of the buffer.
    Keys empty in every frame are not cut out at all."""
    count = len(headers)
    with_keys = pc.max(headers.key_len).as_py() > 0
    key_start = pc.add(headers.offsets, _u64(ENTRY_HEADER_SIZE))
    payload_start = pc.add(key_start, headers.key_len) if with_keys else key_start
    payload_end = pc.add(payload_start, headers.payload_len)
    # The section boundaries of each frame in file order, two to a uint64 word; safe, as
    # decode_headers checked that every frame lies below end_offset <= 2**30. Two per
    # frame (payload start and end), or four (a zero-length piece pads three to four):
    #   keys and properties: key, payload, properties, gap
    #   keys only:           key, payload, empty, gap
    #   properties only:     payload, properties, empty, gap
    #   neither:             payload, gap
    # where the gap spans the padding and the next frame's header.
    if with_keys or with_properties:
        properties_end = (
            pc.add(payload_end, headers.properties_len) if with_properties else payload_end
        )
        if with_keys:
            pairs = [_pack(key_start, payload_start), _pack(payload_end, properties_end)]
        else:
            pairs = [_pack(payload_start, payload_end), _pack(properties_end, properties_end)]
        words = _interleave(pairs)
        width = 4
    else:
        words = _pack(payload_start, payload_end)
        width = 2
    # Piece width*i + j is section j of frame i; the last frame's gap is left out (its
    # end is past the frames), so width * count boundaries make width * count - 1
    # pieces. All boundaries are monotonic by construction.
    boundaries = words.buffers()[1].slice(8 * words.offset, 8 * len(words))
    pieces = pa.Array.from_buffers(pa.binary(), width * count - 1, [None, boundaries, buffer])
    rows = pc.multiply(arange(count, pa.int32()), _i32(width))
    section = 0
    if with_keys:
        keys = pc.take(pieces, rows)
        section += 1
    else:
        keys = pa.Array.from_buffers(
            pa.binary(), count, [None, _zero_offsets(count), pa.py_buffer(b"")]
        )
    payloads = pc.take(pieces, pc.add(rows, _i32(section)))
    blobs = pc.take(pieces, pc.add(rows, _i32(section + 1))) if with_properties else None
    return keys, payloads, blobs


def _properties_column(blobs: pa.Array | None, headers: HeaderColumns, count: int) -> pa.MapArray:
    """map<string, string> from NUL-separated property blobs, in vectorized steps."""
    map_type = SCHEMA.field("properties").type
    if blobs is None:
        offsets = pa.Array.from_buffers(pa.int32(), count + 1, [None, _zero_offsets(count)])
        empty = pa.array([], pa.string())
        return pa.MapArray.from_arrays(offsets, empty, empty, type=map_type)
    has = pc.greater(headers.properties_len, _u64(0))
    parts = pc.split_pattern(pc.filter(blobs, has), pattern="\x00")
    field_counts = pc.list_value_length(parts).cast(pa.int32())
    _require(
        pc.equal(pc.bit_wise_and(field_counts, _i32(1)), _i32(0)),
        pc.filter(headers.offsets, has),
        0,
        "properties have an odd field count",
    )
    fields = parts.flatten()
    pair_index = pc.multiply(arange(len(fields) // 2, pa.int32()), _i32(2))
    try:
        keys = pc.take(fields, pair_index).cast(pa.string())
        values = pc.take(fields, pc.add(pair_index, _i32(1))).cast(pa.string())
    except pa.ArrowInvalid as error:
        raise FormatError(int(headers.offsets[0].as_py()), f"properties: {error}") from None
    pairs = pc.replace_with_mask(pa.repeat(_i32(0), count), has, pc.divide(field_counts, _i32(2)))
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(pairs)])
    return pa.MapArray.from_arrays(offsets, keys, values, type=map_type)


#: Widest range of vchannel ids in one batch whose names are looked up in a table indexed
#: by id (4,096 entries, 32 KiB of Python list to build); wider ranges go through a
#: dictionary of the distinct ids.
VCHANNEL_TABLE_MAX = 4096


def _vchannel_column(
    vchannel_ids: pa.Array, vchannel_names: Mapping[int, str], source: str
) -> pa.Array:
    """Names for numeric vchannel ids: a dictionary lookup per distinct id, not per row.
    Id 0 (entries of the pchannel itself) maps to "" unless `vchannel_names` names it."""

    def name(vchannel_id: int) -> str:
        found = vchannel_names.get(vchannel_id)
        if found is None:
            if vchannel_id != 0:
                raise KeyError(
                    f"segment {source}: vchannel id {vchannel_id} is not in vchannel_names"
                )
            found = ""
        return found

    runs = _runs(vchannel_ids)
    if runs is not None:
        starts, ids = runs
        column = _string_runs(starts, [name(vchannel_id) for vchannel_id in ids], len(vchannel_ids))
        if column is not None:
            return column
    low, high = (value.as_py() for value in pc.min_max(vchannel_ids).values())
    if high - low < VCHANNEL_TABLE_MAX:
        # A table of the names of every id from low to high, taken by id - low: one pass,
        # where finding the distinct ids and their positions takes two. Null for an id
        # without a name; then the dictionary below names the first one.
        table: list[str | None] = [None] * (high - low + 1)
        for vchannel_id, found in vchannel_names.items():
            if low <= vchannel_id <= high:
                table[vchannel_id - low] = found
        if low == 0 and table[0] is None:
            table[0] = ""
        names_by_id = pc.take(
            pa.array(table, pa.string()),
            pc.subtract(vchannel_ids, _i64(low)),
            boundscheck=False,
        )
        if names_by_id.null_count == 0:
            return names_by_id
    encoded = pc.dictionary_encode(vchannel_ids)
    names = pa.array([name(vchannel_id) for vchannel_id in encoded.dictionary.to_pylist()])
    return pc.take(names, encoded.indices)


#: Most runs of equal values (consecutive rows with the same code or id) for which a
#: names column is built run by run, each run's name repeated; with more, it is a take
#: from a table of names, which costs a copy per row.
NAME_RUNS_MAX = 16


def _runs(values: pa.Array) -> tuple[list[int], list[int]] | None:
    """(first row, value) of each run of equal values, or None past NAME_RUNS_MAX runs."""
    count = len(values)
    if count > 1:
        changes = pc.not_equal(values.slice(1), values.slice(0, count - 1))
        if changes.true_count >= NAME_RUNS_MAX:
            return None
        starts = [0] + [row + 1 for row in pc.indices_nonzero(changes).to_pylist()]
    else:
        starts = [0]
    return starts, [values[row].as_py() for row in starts]


def _string_runs(starts: list[int], names: list[str], count: int) -> pa.Array | None:
    """The string column holding names[k] from row starts[k] up to the next start (or
    `count`); None when its bytes would not fit int32 offsets."""
    ends = [*starts[1:], count]
    encoded = [name.encode() for name in names]
    total = sum(
        len(data) * (end - start) for data, start, end in zip(encoded, starts, ends, strict=True)
    )
    if total >= 1 << 31:
        return None
    parts: list[pa.Array] = []
    position = 0
    for data, start, end in zip(encoded, starts, ends, strict=True):
        offsets = pc.multiply(arange(end - start, pa.int32()), _i32(len(data)))
        parts.append(pc.add(offsets, _i32(position)) if position else offsets)
        position += len(data) * (end - start)
    parts.append(pa.array([position], pa.int32()))
    offsets = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
    lengths = [end - start for start, end in zip(starts, ends, strict=True)]
    data = _repeated(encoded, lengths)
    return pa.Array.from_buffers(pa.string(), count, [None, offsets.buffers()[1], data])


def _msg_type_names(msg_type: pa.Array) -> pa.Array:
    """The registered name of every code in `msg_type` (uint64 codes below 2**16), null
    for an unregistered one: `take(_MSG_TYPE_NAMES_BY_CODE, msg_type)`, built by runs
    when there are few."""
    runs = _runs(msg_type)
    if runs is not None:
        starts, codes = runs
        names = [MSG_TYPE_NAMES.get(code) for code in codes]
        if all(name is not None for name in names):
            column = _string_runs(
                starts, [name for name in names if name is not None], len(msg_type)
            )
            if column is not None:
                return column
    return pc.take(_MSG_TYPE_NAMES_BY_CODE, msg_type)


def _constant_string(value: str, count: int) -> pa.Array:
    """`value` `count` times, built from its bytes repeated (pa.repeat is slower)."""
    column = _string_runs([0], [value], count)
    return pa.repeat(pa.scalar(value, pa.string()), count) if column is None else column


def _constant_int64(value: int, count: int) -> pa.Array:
    """`value` `count` times (pa.repeat is slower)."""
    data = _repeated([value.to_bytes(8, "little", signed=True)], [count])
    return pa.Array.from_buffers(pa.int64(), count, [None, data])


def to_record_batch(
    buffer: pa.Buffer,
    headers: HeaderColumns,
    *,
    pchannel: str,
    segment_id: int,
    vchannel_names: Mapping[int, str],
    source: str,
) -> pa.RecordBatch:
    """The Spark schema's RecordBatch for verified `headers` of frames inside `buffer`."""
    count = len(headers)
    if count == 0:
        return _empty_batch()
    with_properties = pc.max(headers.properties_len).as_py() > 0
    keys, payloads, blobs = _gather_sections(buffer, headers, with_properties)
    columns = [
        _constant_string(pchannel, count),
        _vchannel_column(headers.vchannel_id, vchannel_names, source),
        _constant_int64(segment_id, count),
        headers.lsn,
        headers.term,
        headers.time_tick,
        headers.msg_type_name,
        keys,
        payloads,
        _null_if_zero(headers.txn_id),
        _null_if_zero(headers.broadcast_id),
        _properties_column(blobs, headers, count),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def _null_if_zero(ids: pa.Array) -> pa.Array:
    """Ids (verified >= 0) with 0 as null; all null without a pass when all are 0."""
    if pc.max(ids).as_py() == 0:
        return pa.nulls(len(ids), pa.int64())
    return pc.if_else(pc.equal(ids, _i64(0)), pa.scalar(None, pa.int64()), ids)


def _empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=SCHEMA)
