"""The segment file format of the data WAL: constants and pure encode/decode functions.

What lives here: the byte layout of a segment file (file header, entry frames, seal footer
and trailer), the entry record (`Entry`), the message-type registry, and functions that turn
entries into bytes and bytes back into entries or into validated batch metadata. Everything
is pure: no file, clock, thread or logging. File handling lives in `segment.py`, the
vectorized Arrow decoding in `columnar.py`.

What must never happen here: an import of `raft` or `raftwal`, any I/O, or a decode that
returns data it has not verified (every frame is checked by its crc32c, a sealed footer by
its own crc).

Layout (all integers little-endian; every frame starts at a multiple of 8 bytes from the
start of the file so that a sealed segment's fixed headers can be gathered as 64-bit words)::

    file   = file_header frame* [footer trailer]
    header = magic "\\x89RWSEG\\r\\n" (8) | version u16 | header_len u16 | pchannel_len u16
             | reserved u16 | first_lsn i64 | created_term i64 | pchannel utf-8
             | zero pad to 8 | header_crc u32 (over all bytes before it) | reserved u32
    frame  = crc u32 | properties_len u32 | lsn i64 | term i64 | time_tick i64
             | vchannel_id i64 | txn_id i64 | broadcast_id i64 | msg_type u16 | reserved u16
             | flags u32 | key_len u32 | payload_len u32            (72 bytes, fixed)
             | key | payload | properties | zero pad to 8
             crc = crc32c(frame[4:])  (the header without the crc, the body and the pad)
    footer = magic "RWSEGFTR" | block_size u32 | block_count u32 | entry_count u64
             | first_lsn | last_lsn | first_term | last_term | first_time_tick
             | last_time_tick (i64 each) | data_end u64 | digest u32 | reserved u32
             | frame offsets u64 * entry_count | block crc32c u32 * block_count | pad to 8
    trailer = footer_offset u64 | footer_len u64 | footer_crc u32
              | trailer_crc u32 (over the 20 bytes before it) | magic "RWSEGEND"   (32 bytes)

Properties are encoded as UTF-8 ``k1 NUL v1 NUL k2 NUL v2`` (no trailing NUL; an empty map
is zero bytes), which Arrow can split in one vectorized call. Keys and values must not
contain NUL. `txn_id` and `broadcast_id` are 0 when absent (real ids start at 1).

The digest a `CommitSegment` carries is crc32c over the entry bytes, i.e. the file from
the end of the header to `data_end`: it does not depend on the file header, so replicas
holding the same entries agree on it.
"""

from __future__ import annotations

import enum
import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import crc32c as _crc32c

# -- constants ------------------------------------------------------------------------------

FILE_MAGIC = b"\x89RWSEG\r\n"
FORMAT_VERSION = 1
FOOTER_MAGIC = b"RWSEGFTR"
TRAILER_MAGIC = b"RWSEGEND"

FRAME_ALIGN_BYTES = 8

#: magic, version, header_len, pchannel_len, reserved, first_lsn, created_term
FILE_HEADER_FIXED = struct.Struct("<8sHHHHqq")
#: crc, properties_len, lsn, term, time_tick, vchannel_id, txn_id, broadcast_id,
#: msg_type, reserved, flags, key_len, payload_len
ENTRY_HEADER = struct.Struct("<II6qHHIII")
ENTRY_HEADER_SIZE = ENTRY_HEADER.size
#: the crc covers the frame from this offset on
FRAME_CRC_SIZE = 4
#: magic, block_size, block_count, entry_count, first/last lsn, first/last term,
#: first/last time tick, data_end, digest, reserved
FOOTER_FIXED = struct.Struct("<8sIIQ6qQII")
#: footer_offset, footer_len, footer_crc, trailer_crc, magic
TRAILER = struct.Struct("<QQII8s")
TRAILER_SIZE = TRAILER.size

assert ENTRY_HEADER_SIZE == 72 and ENTRY_HEADER_SIZE % FRAME_ALIGN_BYTES == 0
assert FILE_HEADER_FIXED.size == 32 and FOOTER_FIXED.size == 88 and TRAILER_SIZE == 32

# Word positions of the fixed header fields, for readers that gather headers as 64-bit words.
WORD_CRC_PROPERTIES_LEN = 0
WORD_LSN = 1
WORD_TERM = 2
WORD_TIME_TICK = 3
WORD_VCHANNEL_ID = 4
WORD_TXN_ID = 5
WORD_BROADCAST_ID = 6
WORD_MSG_TYPE_FLAGS = 7
WORD_KEY_PAYLOAD_LEN = 8

# Hard limits of the format. The configured limits of the service (message size, batch size,
# segment_max_bytes) are lower; these only bound what a decoder will ever believe.
MAX_KEY_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 64 << 20
MAX_PROPERTIES_BYTES = 1 << 20
MAX_PCHANNEL_BYTES = 255
#: Frames of one segment end below this offset; Arrow readers rely on it for int32 offsets.
MAX_SEGMENT_BYTES = 1 << 30
DEFAULT_BLOCK_SIZE_BYTES = 1 << 20
MIN_BLOCK_SIZE_BYTES = 4096
MAX_BLOCK_SIZE_BYTES = 64 << 20

#: True when the crc32c package uses the CPU's crc32c instruction (it is C code either way).
CRC32C_HARDWARE = bool(_crc32c.hardware_based)


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """crc32c of `data`, continuing from `value` (C-backed)."""
    return _crc32c.crc32c(data, value)


def align_up(size: int) -> int:
    """`size` rounded up to the frame alignment."""
    return (size + FRAME_ALIGN_BYTES - 1) & ~(FRAME_ALIGN_BYTES - 1)


class EntryFlags(enum.IntFlag):
    """Bits of an entry's `flags`. At most one TXN_* bit is set, and exactly when txn_id != 0;
    BROADCAST is set exactly when broadcast_id != 0."""

    TXN_BEGIN = 1 << 0
    TXN_BODY = 1 << 1
    TXN_COMMIT = 1 << 2
    TXN_ROLLBACK = 1 << 3
    TERM_START = 1 << 4
    SEAL_MARKER = 1 << 5
    BROADCAST = 1 << 6
    #: an owner's time-tick entry (msg_type TIME_TICK, no vchannel): it only moves the
    #: pchannel's committed time tick forward while no producer writes (time-tick packs)
    TIME_TICK_MARKER = 1 << 7
    #: more entries of the same write batch follow this one: set on every entry of a
    #: batch but its last, so that a log ending in an entry with it holds only a prefix
    #: of a batch, which was never acknowledged (`ChannelOwner` drops it when it adopts
    #: such a log; docs/architecture.md, the fencing argument). Logs written before it
    #: existed have it nowhere: each of their entries reads as a whole batch.
    BATCH_CONTINUES = 1 << 8


KNOWN_FLAGS = int(
    EntryFlags.TXN_BEGIN
    | EntryFlags.TXN_BODY
    | EntryFlags.TXN_COMMIT
    | EntryFlags.TXN_ROLLBACK
    | EntryFlags.TERM_START
    | EntryFlags.SEAL_MARKER
    | EntryFlags.BROADCAST
    | EntryFlags.TIME_TICK_MARKER
    | EntryFlags.BATCH_CONTINUES
)
TXN_FLAGS = int(
    EntryFlags.TXN_BEGIN | EntryFlags.TXN_BODY | EntryFlags.TXN_COMMIT | EntryFlags.TXN_ROLLBACK
)
BROADCAST_FLAG = int(EntryFlags.BROADCAST)
SEAL_FLAG = int(EntryFlags.SEAL_MARKER)
BATCH_CONTINUES_FLAG = int(EntryFlags.BATCH_CONTINUES)
#: flags & TXN_FLAGS values with at most one bit set
_SINGLE_TXN_BIT = {0: True, 1: True, 2: True, 4: True, 8: True}
#: Entries the WAL writes for itself rather than for a producer.
CONTROL_FLAGS = int(EntryFlags.TERM_START | EntryFlags.SEAL_MARKER | EntryFlags.TIME_TICK_MARKER)


class MsgType(enum.IntEnum):
    """The message-type registry: the code stored in a frame and its name (the lower-case
    member name) shown to readers. Append-only: a code is never reused or renumbered, since
    sealed segments keep it forever."""

    TERM_START = 1
    SEAL = 2
    TIME_TICK = 3
    MESSAGE = 4
    INSERT = 5
    DELETE = 6
    UPSERT = 7
    FLUSH = 8
    MANUAL_FLUSH = 9
    CREATE_COLLECTION = 10
    DROP_COLLECTION = 11
    CREATE_PARTITION = 12
    DROP_PARTITION = 13
    CREATE_SEGMENT = 14
    IMPORT = 15
    SCHEMA_CHANGE = 16
    DDL = 17
    TXN_BEGIN = 18
    TXN_COMMIT = 19
    TXN_ROLLBACK = 20


MSG_TYPE_NAMES: dict[int, str] = {member.value: member.name.lower() for member in MsgType}
MSG_TYPE_CODES: dict[str, int] = {name: code for code, name in MSG_TYPE_NAMES.items()}
#: Types only the WAL itself writes (term starts, seal markers, a transaction's frame).
CONTROL_MSG_TYPES = frozenset(
    {MsgType.TERM_START, MsgType.SEAL, MsgType.TXN_BEGIN, MsgType.TXN_COMMIT, MsgType.TXN_ROLLBACK}
)
#: The names a producer may send, in registry order.
PRODUCIBLE_MSG_TYPES: tuple[str, ...] = tuple(
    MSG_TYPE_NAMES[m.value] for m in MsgType if m not in CONTROL_MSG_TYPES
)
MAX_MSG_TYPE_CODE = max(MSG_TYPE_NAMES)


def msg_type_code(name: str) -> int:
    """The registry code of a message-type name; ValueError for an unknown name."""
    code = MSG_TYPE_CODES.get(name)
    if code is None:
        raise ValueError(
            f"unknown msg_type {name!r} (expected one of {', '.join(sorted(MSG_TYPE_CODES))})"
        )
    return code


def msg_type_name(code: int) -> str:
    """The name of a registry code; ValueError for an unknown code."""
    name = MSG_TYPE_NAMES.get(code)
    if name is None:
        raise ValueError(f"unknown msg_type code {code} (expected 1..{MAX_MSG_TYPE_CODE})")
    return name


class FormatError(ValueError):
    """Bytes that are not a valid part of a segment: `offset` is where the bad structure starts,
    relative to the buffer the caller passed plus its `base_offset`."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.offset = offset
        self.reason = reason


# -- records --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One WAL entry. For tests and slow paths; hot paths handle encoded batches."""

    lsn: int
    term: int
    time_tick: int
    msg_type: int
    vchannel_id: int = 0
    flags: int = 0
    txn_id: int = 0
    broadcast_id: int = 0
    key: bytes = b""
    payload: bytes = b""
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FileHeader:
    pchannel: str
    first_lsn: int
    created_term: int
    version: int = FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class BatchMeta:
    """What a writer needs to know about an encoded batch, without decoding it again."""

    count: int
    first_lsn: int
    last_lsn: int
    first_term: int
    last_term: int
    first_time_tick: int
    last_time_tick: int
    size_bytes: int
    #: array('q') of frame offsets relative to the start of the batch
    frame_offsets: array
    #: rows (0-based, ascending) whose flags carry SEAL_MARKER, recorded by the pass that
    #: built or verified the batch (`encode_rows`, `scan_batch`) so that the log's seal
    #: rule needs no second walk; None when not recorded (then the log walks the frames)
    seal_rows: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    data: bytes
    meta: BatchMeta


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What a sealed segment declares about itself (and a CommitSegment carries)."""

    entry_count: int
    first_lsn: int
    last_lsn: int
    first_term: int
    last_term: int
    first_time_tick: int
    last_time_tick: int
    #: offset where the frames end and the footer starts
    data_end: int
    #: crc32c of the entry bytes [header_len, data_end)
    digest: int


@dataclass(frozen=True, slots=True)
class Footer:
    summary: SegmentSummary
    block_size_bytes: int
    #: array('I'): crc32c of file bytes [i * block_size, min((i + 1) * block_size, data_end))
    block_crcs: array
    #: array('Q'): absolute offset of every frame (empty when decoded without the index)
    frame_offsets: array
    #: offset of the index inside the file, for zero-copy readers
    index_offset: int


# -- properties -----------------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """``k1 NUL v1 NUL k2 ...`` in UTF-8; ValueError for NUL inside a key or value."""
    if not properties:
        return b""
    parts: list[str] = []
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(
                f"invalid property {key!r}={value!r} (expected str keys and str values)"
            )
        if "\x00" in key or "\x00" in value:
            raise ValueError(
                f"invalid property {key!r}={value!r} (contains NUL; expected text without NUL)"
            )
        parts.append(key)
        parts.append(value)
    return "\x00".join(parts).encode("utf-8")


def decode_properties(blob: bytes | memoryview) -> dict[str, str]:
    """Inverse of `encode_properties`; ValueError for an odd field count or bad UTF-8."""
    if not len(blob):
        return {}
    fields = bytes(blob).decode("utf-8").split("\x00")
    if len(fields) % 2:
        raise ValueError(f"properties have {len(fields)} fields (expected an even count)")
    return dict(zip(fields[0::2], fields[1::2], strict=True))


# -- file header ----------------------------------------------------------------------------


def file_header_size(pchannel: str) -> int:
    return align_up(FILE_HEADER_FIXED.size + len(pchannel.encode("utf-8"))) + 8


def encode_file_header(header: FileHeader) -> bytes:
    name = header.pchannel.encode("utf-8")
    if not 1 <= len(name) <= MAX_PCHANNEL_BYTES:
        raise ValueError(
            f"invalid pchannel {header.pchannel!r} ({len(name)} bytes; "
            f"expected 1..{MAX_PCHANNEL_BYTES})"
        )
    if header.first_lsn < 1:
        raise ValueError(f"invalid first_lsn ({header.first_lsn}; expected >= 1)")
    if header.created_term < 1:
        raise ValueError(f"invalid created_term ({header.created_term}; expected >= 1)")
    header_len = file_header_size(header.pchannel)
    out = bytearray(header_len)
    FILE_HEADER_FIXED.pack_into(
        out,
        0,
        FILE_MAGIC,
        header.version,
        header_len,
        len(name),
        0,
        header.first_lsn,
        header.created_term,
    )
    out[FILE_HEADER_FIXED.size : FILE_HEADER_FIXED.size + len(name)] = name
    struct.pack_into("<II", out, header_len - 8, crc32c(memoryview(out)[: header_len - 8]), 0)
    return bytes(out)


def decode_file_header(data: bytes | memoryview) -> tuple[FileHeader, int]:
    """(header, header_len) from the start of a segment file; FormatError if invalid."""
    view = memoryview(data)
    if len(view) < FILE_HEADER_FIXED.size + 8:
        raise FormatError(0, f"incomplete file header ({len(view)} bytes)")
    magic, version, header_len, name_len, reserved, first_lsn, created_term = (
        FILE_HEADER_FIXED.unpack_from(view, 0)
    )
    if magic != FILE_MAGIC:
        raise FormatError(0, f"bad file magic {bytes(magic)!r} (expected {FILE_MAGIC!r})")
    if version != FORMAT_VERSION:
        raise FormatError(8, f"unsupported format version {version} (expected {FORMAT_VERSION})")
    expected_len = align_up(FILE_HEADER_FIXED.size + name_len) + 8
    if not 1 <= name_len <= MAX_PCHANNEL_BYTES or header_len != expected_len:
        raise FormatError(10, f"bad header_len {header_len} / pchannel_len {name_len}")
    if len(view) < header_len:
        raise FormatError(0, f"incomplete file header ({len(view)} of {header_len} bytes)")
    stored_crc, trailing = struct.unpack_from("<II", view, header_len - 8)
    if stored_crc != crc32c(view[: header_len - 8]):
        raise FormatError(header_len - 8, "file header crc mismatch")
    if reserved or trailing:
        raise FormatError(14, "nonzero reserved field in file header")
    if first_lsn < 1 or created_term < 1:
        raise FormatError(16, f"bad first_lsn {first_lsn} / created_term {created_term}")
    name_bytes = bytes(view[FILE_HEADER_FIXED.size : FILE_HEADER_FIXED.size + name_len])
    try:
        pchannel = name_bytes.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FormatError(FILE_HEADER_FIXED.size, f"pchannel is not UTF-8 ({error})") from None
    return FileHeader(pchannel, first_lsn, created_term, version), header_len


# -- entry frames ---------------------------------------------------------------------------


def validate_entry(entry: Entry) -> None:
    """ValueError naming the field when `entry` cannot be written."""
    if entry.lsn < 1:
        raise ValueError(f"invalid lsn ({entry.lsn}; expected >= 1)")
    if entry.term < 1:
        raise ValueError(f"invalid term ({entry.term}; expected >= 1)")
    if entry.time_tick < 0:
        raise ValueError(f"invalid time_tick ({entry.time_tick}; expected >= 0)")
    if entry.msg_type not in MSG_TYPE_NAMES:
        raise ValueError(f"invalid msg_type ({entry.msg_type}; expected 1..{MAX_MSG_TYPE_CODE})")
    if entry.vchannel_id < 0 or entry.txn_id < 0 or entry.broadcast_id < 0:
        raise ValueError(
            f"invalid ids (vchannel_id {entry.vchannel_id}, txn_id {entry.txn_id}, "
            f"broadcast_id {entry.broadcast_id}; expected >= 0)"
        )
    flags = entry.flags
    if flags & ~KNOWN_FLAGS or flags < 0:
        raise ValueError(f"invalid flags ({flags:#x}; expected bits of {KNOWN_FLAGS:#x})")
    txn_bits = flags & TXN_FLAGS
    if txn_bits & (txn_bits - 1):
        raise ValueError(f"invalid flags ({flags:#x}; expected at most one TXN_* bit)")
    if bool(txn_bits) != bool(entry.txn_id):
        raise ValueError(
            f"invalid txn_id {entry.txn_id} with flags {flags:#x} "
            "(expected a TXN_* flag exactly when txn_id != 0)"
        )
    if bool(flags & EntryFlags.BROADCAST) != bool(entry.broadcast_id):
        raise ValueError(
            f"invalid broadcast_id {entry.broadcast_id} with flags {flags:#x} "
            "(expected BROADCAST exactly when broadcast_id != 0)"
        )
    if len(entry.key) > MAX_KEY_BYTES:
        raise ValueError(f"key too long ({len(entry.key)} bytes; expected 0..{MAX_KEY_BYTES})")
    if len(entry.payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"payload too long ({len(entry.payload)} bytes; expected 0..{MAX_PAYLOAD_BYTES})"
        )


_HEADER_AFTER_CRC = struct.Struct("<I6qHHIII")
_CRC_FIELD = struct.Struct("<I")
#: ENTRY_HEADER with msg_type and reserved read as one u32 (msg_type | reserved << 16): a
#: registry code is below 2**16, so one lookup also checks that `reserved` is zero
_SCAN_HEADER = struct.Struct("<II6qIIII")
_ZERO_PADS = tuple(b"\x00" * size for size in range(FRAME_ALIGN_BYTES))
_SMALL_BODY_BYTES = 4096
assert _HEADER_AFTER_CRC.size + _CRC_FIELD.size == ENTRY_HEADER_SIZE


#: (lsn, term, time_tick, msg_type, vchannel_id, flags, txn_id, broadcast_id, key, payload,
#: properties): an entry as a plain tuple, for hot paths that should not build `Entry`s.
EntryRow = tuple[int, int, int, int, int, int, int, int, bytes, bytes, Mapping[str, str]]


def encode_batch(entries: Sequence[Entry]) -> EncodedBatch:
    """Frames for `entries` (contiguous LSNs, non-decreasing terms, strictly increasing time
    ticks) in one buffer. The owner writes this buffer locally and forwards the same bytes
    to the replicas. Raises ValueError naming the first invalid field."""
    return encode_rows(
        [
            (
                e.lsn,
                e.term,
                e.time_tick,
                e.msg_type,
                e.vchannel_id,
                e.flags,
                e.txn_id,
                e.broadcast_id,
                e.key,
                e.payload,
                e.properties,
            )
            for e in entries
        ]
    )


def _row_entry(row: EntryRow) -> Entry:
    lsn, term, tick, msg_type, vchannel_id, flags, txn_id, broadcast_id, key, payload, props = row
    return Entry(
        lsn=lsn,
        term=term,
        time_tick=tick,
        msg_type=msg_type,
        vchannel_id=vchannel_id,
        flags=flags,
        txn_id=txn_id,
        broadcast_id=broadcast_id,
        key=key,
        payload=payload,
        properties=props,
    )


def encode_rows(rows: Sequence[EntryRow]) -> EncodedBatch:
    """`encode_batch` for entries given as `EntryRow` tuples (same rules, same bytes)."""
    if not rows:
        raise ValueError("empty batch (expected at least one entry)")
    parts: list[bytes] = []
    append = parts.append
    offsets = array("q")
    pack_header = _HEADER_AFTER_CRC.pack
    pack_crc = _CRC_FIELD.pack
    names = MSG_TYPE_NAMES
    offset = 0
    previous: EntryRow | None = None
    seal_rows: list[int] = []
    for row in rows:
        (
            lsn,
            term,
            tick,
            msg_type,
            vchannel_id,
            flags,
            txn_id,
            broadcast_id,
            key,
            payload,
            properties,
        ) = row
        # One cheap test for the common case; validate_entry words the error.
        if (
            lsn < 1
            or term < 1
            or tick < 0
            or vchannel_id < 0
            or txn_id < 0
            or broadcast_id < 0
            or msg_type not in names
            or flags < 0
            or flags & ~KNOWN_FLAGS
            or _SINGLE_TXN_BIT.get(flags & TXN_FLAGS) is None
            or ((flags & TXN_FLAGS) != 0) != (txn_id != 0)
            or ((flags & BROADCAST_FLAG) != 0) != (broadcast_id != 0)
            or len(key) > MAX_KEY_BYTES
            or len(payload) > MAX_PAYLOAD_BYTES
        ):
            validate_entry(_row_entry(row))
            raise AssertionError(f"validate_entry accepted {row!r}")  # pragma: no cover
        if previous is not None and (
            lsn != previous[0] + 1 or term < previous[1] or tick <= previous[2]
        ):
            _check_order(previous[0], previous[1], previous[2], _row_entry(row))
        props = encode_properties(properties) if properties else b""
        if len(props) > MAX_PROPERTIES_BYTES:
            raise ValueError(
                f"properties too long ({len(props)} bytes; expected 0..{MAX_PROPERTIES_BYTES})"
            )
        body_len = len(key) + len(payload) + len(props)
        pad = -(ENTRY_HEADER_SIZE + body_len) % FRAME_ALIGN_BYTES
        header = pack_header(
            len(props),
            lsn,
            term,
            tick,
            vchannel_id,
            txn_id,
            broadcast_id,
            msg_type,
            0,
            flags,
            len(key),
            len(payload),
        )
        if body_len <= _SMALL_BODY_BYTES:
            # Small frames: one concatenation and one crc call beat a call per part.
            frame = header + key + payload + props + _ZERO_PADS[pad]
            append(pack_crc(crc32c(frame)))
            append(frame)
        else:
            crc = crc32c(payload, crc32c(key, crc32c(header)))
            crc = crc32c(_ZERO_PADS[pad], crc32c(props, crc))
            append(pack_crc(crc))
            append(header)
            append(key)
            append(payload)
            append(props)
            append(_ZERO_PADS[pad])
        if flags & SEAL_FLAG:
            seal_rows.append(len(offsets))
        offsets.append(offset)
        offset += ENTRY_HEADER_SIZE + body_len + pad
        previous = row
    data = b"".join(parts)
    first, last = rows[0], rows[-1]
    meta = BatchMeta(
        count=len(rows),
        first_lsn=first[0],
        last_lsn=last[0],
        first_term=first[1],
        last_term=last[1],
        first_time_tick=first[2],
        last_time_tick=last[2],
        size_bytes=len(data),
        frame_offsets=offsets,
        seal_rows=tuple(seal_rows),
    )
    return EncodedBatch(data, meta)


def _check_order(lsn: int, term: int, time_tick: int, entry: Entry) -> None:
    if entry.lsn != lsn + 1:
        raise ValueError(f"non-contiguous lsn ({entry.lsn} after {lsn}; expected {lsn + 1})")
    if entry.term < term:
        raise ValueError(f"term went back ({entry.term} after {term} at lsn {entry.lsn})")
    if entry.time_tick <= time_tick:
        raise ValueError(
            f"time_tick not increasing ({entry.time_tick} after {time_tick} at lsn {entry.lsn})"
        )


# A parsed fixed header: (crc, properties_len, lsn, term, time_tick, vchannel_id, txn_id,
# broadcast_id, msg_type, reserved, flags, key_len, payload_len).
HeaderFields = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]


def check_frame(
    data: bytes | memoryview,
    offset: int,
    end: int,
    expected_lsn: int | None,
    last_term: int,
    last_time_tick: int,
    verify_crc: bool = True,
) -> tuple[HeaderFields, int] | str:
    """Verify the frame at `offset` (which must end by `end`): plausible header, in bounds,
    crc (unless the caller verified a checksum over the whole buffer), and ordered after
    (expected_lsn - 1, last_term, last_time_tick). Returns (header fields, frame end) or
    the reason it is bad. Never raises for bad bytes."""
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


def entry_from_frame(data: bytes | memoryview, offset: int, fields: HeaderFields) -> Entry:
    """Build an `Entry` from a frame whose header is `fields`; ValueError for bad properties."""
    (_, properties_len, lsn, term, time_tick, vchannel_id, txn_id, broadcast_id, msg_type) = fields[
        :9
    ]
    flags, key_len, payload_len = fields[10], fields[11], fields[12]
    view = memoryview(data)
    key_start = offset + ENTRY_HEADER_SIZE
    payload_start = key_start + key_len
    properties_start = payload_start + payload_len
    properties = (
        decode_properties(view[properties_start : properties_start + properties_len])
        if properties_len
        else {}
    )
    return Entry(
        lsn=lsn,
        term=term,
        time_tick=time_tick,
        msg_type=msg_type,
        vchannel_id=vchannel_id,
        flags=flags,
        txn_id=txn_id,
        broadcast_id=broadcast_id,
        key=bytes(view[key_start:payload_start]),
        payload=bytes(view[payload_start:properties_start]),
        properties=properties,
    )


def iter_batch(data: bytes | memoryview, *, base_offset: int = 0) -> Iterator[Entry]:
    """Decode every frame of a batch (strict: any bad frame raises FormatError)."""
    view = memoryview(data)
    offset, expected, term, tick = 0, None, 0, -1
    while offset < len(view):
        checked = check_frame(view, offset, len(view), expected, term, tick)
        if isinstance(checked, str):
            raise FormatError(base_offset + offset, checked)
        fields, frame_end = checked
        try:
            yield entry_from_frame(view, offset, fields)
        except ValueError as error:
            raise FormatError(base_offset + offset, f"bad properties ({error})") from None
        expected, term, tick = fields[2] + 1, fields[3], fields[4]
        offset = frame_end


def frame_headers(data: bytes) -> list[tuple[int, HeaderFields]]:
    """(offset, header fields) of every frame of `data`, frames this node's own log holds
    (each was fully checked by `check_frame` when it was appended): the bounds and the
    crc are checked again, which catches what the disk changed since; the structural
    checks are not repeated. About four times cheaper than `iter_batch`, and no `Entry`
    is built (the Consume path builds its reply straight from the fields). Raises
    FormatError on a frame past the end or a crc mismatch."""
    out: list[tuple[int, HeaderFields]] = []
    unpack, size, total, crc = (
        ENTRY_HEADER.unpack_from,
        ENTRY_HEADER_SIZE,
        len(data),
        _crc32c.crc32c,
    )
    view = memoryview(data)
    offset = 0
    while offset < total:
        if total - offset < size:
            raise FormatError(offset, f"incomplete frame header ({total - offset} bytes)")
        fields = unpack(data, offset)
        end = offset + size + fields[11] + fields[12] + fields[1]
        end += -end % FRAME_ALIGN_BYTES
        if end > total:
            raise FormatError(offset, f"frame extends past the end ({end} > {total})")
        if crc(view[offset + FRAME_CRC_SIZE : end]) != fields[0]:
            raise FormatError(offset, "frame crc mismatch")
        out.append((offset, fields))
        offset = end
    return out


def decode_batch(data: bytes | memoryview) -> list[Entry]:
    return list(iter_batch(data))


#: Same-size frames in a row that `scan_batch` checks column by column (`_same_size_run`).
_MIN_RUN_FRAMES = 4
#: Failed attempts at a run after which a scan goes on frame by frame (each costs a gather).
_RUN_ATTEMPTS = 4
_MSG_TYPE_CODES = frozenset(MSG_TYPE_NAMES)
_LITTLE_ENDIAN = struct.pack("=I", 1) == struct.pack("<I", 1)


def _equal_prefix(column: bytes, item: bytes) -> int:
    """How many items of `column` (items of len(item) bytes), from the first, are `item`."""
    size = len(item)
    count = len(column) // size
    if column == item * count:
        return count
    low, high = 0, count  # the first `low` items are `item`, the first `high` are not all
    while high - low > 1:
        middle = (low + high) // 2
        if column.startswith(item * middle):
            low = middle
        else:
            high = middle
    return low


def _same_lengths(
    view: memoryview, words: memoryview, halves: memoryview, start: int, stride: int, total: int
) -> int:
    """How many frames from `start` on, `stride` apart, have the lengths (key, payload,
    properties) of the frame checked just before `start`, so its size."""
    checked_at = start - stride
    first, step = start >> 3, stride >> 3
    stop = first + (total - start) // stride * step
    count = _equal_prefix(  # key_len and payload_len, one word
        words[first + WORD_KEY_PAYLOAD_LEN : stop : step].tobytes(),
        view[checked_at + 8 * WORD_KEY_PAYLOAD_LEN : checked_at + ENTRY_HEADER_SIZE].tobytes(),
    )
    if count < _MIN_RUN_FRAMES:
        return count
    stop = first + count * step
    return _equal_prefix(  # properties_len, the second uint32
        halves[2 * first + 1 : 2 * stop : 2 * step].tobytes(),
        view[checked_at + 4 : checked_at + 8].tobytes(),
    )


def _same_size_run(
    view: memoryview,
    words: memoryview,
    halves: memoryview,
    start: int,
    stride: int,
    count: int,
    next_lsn: int,
    term_floor: int,
    tick_floor: int,
    verify: bool,
) -> tuple[int, int, list[int]] | None:
    """Check `count` frames at `start`, `start + stride`, ..., whose lengths are known to
    be those of a frame already checked (so each ends where the next starts, inside the
    buffer, within the limits) against the rest of check_frame's rules, one header field
    at a time over all of them: lsns `next_lsn`, `next_lsn + 1`, ...; terms non-decreasing
    from `term_floor`; time ticks strictly increasing above `tick_floor`; ids >= 0; known
    msg_type, reserved 0, known flags; the frame crcs when `verify`. `words` and `halves`
    are the buffer as int64 and uint32 (little-endian). Where a column is one repeated
    value it is compared as bytes, without building an int per frame. Returns (last term,
    last time tick, the rows flagged SEAL_MARKER) or None when a rule fails (then the
    frames are checked one by one, which words the error)."""
    first, step = start >> 3, stride >> 3
    stop = first + count * step
    if words[first + WORD_LSN : stop : step].tolist() != list(range(next_lsn, next_lsn + count)):
        return None
    terms = words[first + WORD_TERM : stop : step].tobytes()
    if terms == terms[:8] * count:
        last_term = int.from_bytes(terms[:8], "little", signed=True)
        if last_term < term_floor:
            return None
    else:
        term_list = words[first + WORD_TERM : stop : step].tolist()
        if term_list[0] < term_floor or sorted(term_list) != term_list:
            return None
        last_term = term_list[-1]
    ticks = words[first + WORD_TIME_TICK : stop : step].tolist()
    if ticks[0] <= tick_floor or (
        ticks != list(range(ticks[0], ticks[0] + count)) and sorted(set(ticks)) != ticks
    ):
        return None
    end = start + count * stride
    for word in (WORD_VCHANNEL_ID, WORD_TXN_ID, WORD_BROADCAST_ID):
        # ids >= 0: the top byte of every one below 0x80
        if not view[start + 8 * word + 7 : end : stride].tobytes().isascii():
            return None
    # msg_type | reserved << 16: a registry code only when reserved is 0
    codes = halves[2 * first + 14 : 2 * stop : 2 * step]
    code_bytes = codes.tobytes()
    if code_bytes == code_bytes[:4] * count:
        if codes[0] not in _MSG_TYPE_CODES:
            return None
    elif not _MSG_TYPE_CODES.issuperset(codes.tolist()):
        return None
    flags = halves[2 * first + 15 : 2 * stop : 2 * step]
    flag_bytes = flags.tobytes()
    distinct = {flags[0]} if flag_bytes == flag_bytes[:4] * count else set(flags.tolist())
    if any(value & ~KNOWN_FLAGS for value in distinct):
        return None
    seal_rows = (
        [row for row, value in enumerate(flags.tolist()) if value & SEAL_FLAG]
        if any(value & SEAL_FLAG for value in distinct)
        else []
    )
    if verify:
        crc_of = _crc32c.crc32c
        if [
            crc_of(view[offset + FRAME_CRC_SIZE : offset + stride])
            for offset in range(start, end, stride)
        ] != halves[2 * first : 2 * stop : 2 * step].tolist():
            return None
    return last_term, ticks[-1], seal_rows


def scan_batch(
    data: bytes | memoryview,
    *,
    expected_first_lsn: int | None = None,
    last_term: int = 0,
    last_time_tick: int = -1,
    batch_crc: int | None = None,
) -> BatchMeta:
    """Verify a received batch frame by frame (crc, contiguity, order) without building
    entries, and return its metadata, including the rows that carry SEAL_MARKER;
    FormatError at the first bad frame. A replica calls this on the bytes the owner
    forwarded before `SegmentWriter.append_encoded`. With `batch_crc` (crc32c of the whole
    buffer, computed by the sender) one C-speed check replaces the per-frame crcs; the
    frames' own crcs are still written to disk.

    One pass, and a cheap one: each frame's header is unpacked once and every rule of
    `check_frame` is tested in one combined condition; only a frame that fails it goes
    through `check_frame`, which words the error (same reason, same offset). Frames that
    follow with the same lengths (a producer's batch of same-size messages) are checked
    column by column instead (`_same_size_run`); when a rule fails there, the scan goes on
    frame by frame from the run's start, so the error is the same too."""
    if batch_crc is not None and crc32c(data) != batch_crc:
        raise FormatError(0, "batch crc mismatch")
    verify = batch_crc is None
    view = memoryview(data)
    total = len(view)
    if not total:
        raise FormatError(0, "empty batch")
    offsets = array("q")
    add_offset = offsets.append
    seal_rows: list[int] = []
    unpack = _SCAN_HEADER.unpack_from
    names = MSG_TYPE_NAMES
    crc_of = _crc32c.crc32c
    size = ENTRY_HEADER_SIZE
    unknown_flags = ~KNOWN_FLAGS
    seal_flag = SEAL_FLAG
    # A frame that ends inside the buffer has no field longer than the buffer: below 1 MiB
    # the length limits need no test of their own.
    check_lengths = total - size > min(MAX_KEY_BYTES, MAX_PAYLOAD_BYTES, MAX_PROPERTIES_BYTES)
    # check_frame's rules, folded: term >= 1 and >= the previous term; time_tick >= 0 and
    # above the previous tick; lsn >= 1 and equal to the expected one (the first frame's,
    # when the caller expects none, only has to be >= 1). `next_lsn` None sends the frame
    # to check_frame.
    expected = expected_first_lsn
    next_lsn = expected if expected is not None and expected >= 1 else None
    term_floor = max(last_term, 1)
    tick_floor = max(last_time_tick, -1)
    prev_term, prev_tick = last_term, last_time_tick
    offset = row = stride = 0
    first_fields: tuple[int, ...] | None = None
    # Frames of the same size in a row (a producer's batch of same-size messages) are
    # checked column-wise over the buffer seen as int64 and uint32 words.
    attempts = (
        _RUN_ATTEMPTS
        if _LITTLE_ENDIAN
        and not total % FRAME_ALIGN_BYTES
        and view.format == "B"
        and view.c_contiguous
        else 0
    )
    if attempts:
        words, halves = view.cast("q"), view.cast("I")
    while offset < total:
        if total - offset < size:
            next_lsn = None  # check_frame words it
        else:
            fields = unpack(view, offset)
            (
                crc,
                properties_len,
                lsn,
                term,
                time_tick,
                vchannel_id,
                txn_id,
                broadcast_id,
                msg_type_reserved,
                flags,
                key_len,
                payload_len,
            ) = fields
            if next_lsn is None and expected is None and row == 0 and lsn >= 1:
                next_lsn = lsn
            frame_end = offset + size + key_len + payload_len + properties_len
            frame_end += -frame_end % FRAME_ALIGN_BYTES
            if (
                frame_end - offset == stride
                and attempts
                and total - offset >= _MIN_RUN_FRAMES * stride
                and next_lsn is not None
            ):
                # The size of the frame checked before: how many frames from here have
                # its lengths, and if they are a run, check them column-wise.
                count = _same_lengths(view, words, halves, offset, stride, total)
                run = (
                    _same_size_run(
                        view,
                        words,
                        halves,
                        offset,
                        stride,
                        count,
                        next_lsn,
                        term_floor,
                        tick_floor,
                        verify,
                    )
                    if count >= _MIN_RUN_FRAMES
                    else None
                )
                if run is None:
                    attempts -= 1
                else:
                    term_floor = prev_term = run[0]
                    tick_floor = prev_tick = run[1]
                    seal_rows.extend(row + seal_row for seal_row in run[2])
                    offsets.extend(range(offset, offset + count * stride, stride))
                    row += count
                    next_lsn = expected = next_lsn + count
                    offset += count * stride
                    continue
        if (
            next_lsn is None
            or lsn != next_lsn
            or term < term_floor
            or time_tick <= tick_floor
            or frame_end > total
            or msg_type_reserved not in names
            or flags & unknown_flags
            or (vchannel_id | txn_id | broadcast_id) < 0
            or (
                check_lengths
                and (
                    key_len > MAX_KEY_BYTES
                    or payload_len > MAX_PAYLOAD_BYTES
                    or properties_len > MAX_PROPERTIES_BYTES
                )
            )
            or (verify and crc_of(view[offset + FRAME_CRC_SIZE : frame_end]) != crc)
        ):
            checked = check_frame(view, offset, total, expected, prev_term, prev_tick, verify)
            if isinstance(checked, str):
                raise FormatError(offset, checked)
            raise AssertionError(  # pragma: no cover - the condition above mirrors check_frame
                f"check_frame accepted the frame at offset {offset} the fast check refused"
            )
        if first_fields is None:
            first_fields = fields
        if flags & seal_flag:
            seal_rows.append(row)
        add_offset(offset)
        row += 1
        next_lsn = expected = lsn + 1
        term_floor = prev_term = term
        tick_floor = prev_tick = time_tick
        stride = frame_end - offset
        offset = frame_end
    assert first_fields is not None
    return BatchMeta(
        count=row,
        first_lsn=first_fields[2],
        last_lsn=expected - 1,
        first_term=first_fields[3],
        last_term=prev_term,
        first_time_tick=first_fields[4],
        last_time_tick=prev_tick,
        size_bytes=total,
        frame_offsets=offsets,
        seal_rows=tuple(seal_rows),
    )


# -- seal footer ----------------------------------------------------------------------------


def block_checksums(
    data: bytes | memoryview, data_end: int, block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES
) -> array:
    """array('I') of crc32c over [i * block, min((i + 1) * block, data_end))."""
    view = memoryview(data)
    crcs = array("I")
    for start in range(0, data_end, block_size_bytes):
        crcs.append(crc32c(view[start : min(start + block_size_bytes, data_end)]))
    return crcs


def check_block_size(block_size_bytes: int) -> None:
    if not MIN_BLOCK_SIZE_BYTES <= block_size_bytes <= MAX_BLOCK_SIZE_BYTES:
        raise ValueError(
            f"invalid block_size_bytes ({block_size_bytes}; "
            f"expected {MIN_BLOCK_SIZE_BYTES}..{MAX_BLOCK_SIZE_BYTES})"
        )


@dataclass(frozen=True)
class EncodedFooter:
    """A footer as the buffers it is made of (no copy of the index): `body` parts, written
    in order at `summary.data_end`, then `trailer`. The parts are bytes or byte-format
    views of the caller's arrays; `release()` them when written."""

    body: tuple[bytes | memoryview, ...]
    body_len: int
    trailer: bytes

    def __bytes__(self) -> bytes:
        return b"".join(self.body) + self.trailer

    def __len__(self) -> int:
        return self.body_len + len(self.trailer)

    def release(self) -> None:
        """Let go of the views: while one is held, the arrays they show cannot resize."""
        for part in self.body:
            if isinstance(part, memoryview):
                part.release()


def encode_footer_parts(
    summary: SegmentSummary, block_size_bytes: int, block_crcs: array, frame_offsets: array
) -> EncodedFooter:
    """The footer body and trailer, the index and block crcs referenced where they are:
    a seal runs while producers wait on the GIL, and a full segment's index is megabytes,
    so it is checksummed and written (`os.pwritev`) without being copied."""
    if len(frame_offsets) != summary.entry_count:
        raise ValueError(f"index has {len(frame_offsets)} offsets (expected {summary.entry_count})")
    expected_blocks = -(-summary.data_end // block_size_bytes)
    if len(block_crcs) != expected_blocks:
        raise ValueError(f"{len(block_crcs)} block crcs (expected {expected_blocks})")
    fixed = FOOTER_FIXED.pack(
        FOOTER_MAGIC,
        block_size_bytes,
        len(block_crcs),
        summary.entry_count,
        summary.first_lsn,
        summary.last_lsn,
        summary.first_term,
        summary.last_term,
        summary.first_time_tick,
        summary.last_time_tick,
        summary.data_end,
        summary.digest,
        0,
    )
    # Offsets are non-negative, so a signed 64-bit index has the same bytes: no copy.
    index = (
        frame_offsets
        if isinstance(frame_offsets, array) and frame_offsets.typecode in ("q", "Q")
        else array("Q", frame_offsets)
    )
    crcs = (
        block_crcs
        if isinstance(block_crcs, array) and block_crcs.typecode == "I"
        else array("I", block_crcs)
    )
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian hosts
        index = array("Q", index)
        index.byteswap()
        crcs = array("I", crcs)
        crcs.byteswap()
    index_bytes = memoryview(index).cast("B")
    crc_bytes = memoryview(crcs).cast("B")
    unpadded = len(fixed) + len(index_bytes) + len(crc_bytes)
    body: tuple[bytes | memoryview, ...] = (
        fixed,
        index_bytes,
        crc_bytes,
        b"\x00" * (align_up(unpadded) - unpadded),
    )
    body_crc = 0
    for part in body:
        body_crc = crc32c(part, body_crc)
    body_len = align_up(unpadded)
    head = struct.pack("<QQI", summary.data_end, body_len, body_crc)
    trailer = head + struct.pack("<I", crc32c(head)) + TRAILER_MAGIC
    return EncodedFooter(body, body_len, trailer)


def encode_footer(
    summary: SegmentSummary, block_size_bytes: int, block_crcs: array, frame_offsets: array
) -> bytes:
    """Footer body followed by the trailer, as one buffer; written at `summary.data_end`."""
    return bytes(encode_footer_parts(summary, block_size_bytes, block_crcs, frame_offsets))


def decode_trailer(tail: bytes | memoryview, file_size: int) -> tuple[int, int, int] | None:
    """(footer_offset, footer_len, footer_crc) from the last TRAILER_SIZE bytes of a file, or
    None when they are not a trailer (an unsealed file). FormatError when they carry the
    trailer magic but are inconsistent (a corrupt sealed file)."""
    if len(tail) != TRAILER_SIZE or bytes(tail[-8:]) != TRAILER_MAGIC:
        return None
    footer_offset, footer_len, footer_crc, trailer_crc, _ = TRAILER.unpack_from(tail, 0)
    trailer_at = file_size - TRAILER_SIZE
    if trailer_crc != crc32c(memoryview(tail)[:20]):
        raise FormatError(trailer_at, "trailer crc mismatch")
    if footer_offset + footer_len != trailer_at or footer_len < FOOTER_FIXED.size:
        raise FormatError(
            trailer_at, f"trailer points outside the file ({footer_offset} + {footer_len})"
        )
    return footer_offset, footer_len, footer_crc


def decode_footer(
    body: bytes | memoryview, footer_offset: int, footer_crc: int, *, with_index: bool = True
) -> Footer:
    """Verify and decode a footer body found at `footer_offset`; FormatError if invalid."""
    view = memoryview(body)
    if crc32c(view) != footer_crc:
        raise FormatError(footer_offset, "footer crc mismatch")
    (
        magic,
        block_size,
        block_count,
        count,
        first_lsn,
        last_lsn,
        first_term,
        last_term,
        first_tick,
        last_tick,
        data_end,
        digest,
        reserved,
    ) = FOOTER_FIXED.unpack_from(view, 0)
    if magic != FOOTER_MAGIC:
        raise FormatError(footer_offset, f"bad footer magic {bytes(magic)!r}")
    if data_end != footer_offset or data_end > MAX_SEGMENT_BYTES or reserved:
        raise FormatError(footer_offset, f"footer data_end {data_end} != {footer_offset}")
    if not MIN_BLOCK_SIZE_BYTES <= block_size <= MAX_BLOCK_SIZE_BYTES or block_count != -(
        -data_end // block_size
    ):
        raise FormatError(footer_offset, f"bad block size {block_size} / count {block_count}")
    index_offset = FOOTER_FIXED.size
    crcs_offset = index_offset + 8 * count
    if (
        count < 1
        or last_lsn != first_lsn + count - 1
        or first_lsn < 1
        or align_up(crcs_offset + 4 * block_count) != len(view)
        or last_term < first_term
        or last_tick < first_tick
    ):
        raise FormatError(footer_offset, f"inconsistent footer (count {count}, lsn {first_lsn}..)")
    crcs = array("I")
    crcs.frombytes(view[crcs_offset : crcs_offset + 4 * block_count])
    index = array("Q")
    if with_index:
        index.frombytes(view[index_offset:crcs_offset])
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian hosts
        crcs.byteswap()
        index.byteswap()
    summary = SegmentSummary(
        entry_count=count,
        first_lsn=first_lsn,
        last_lsn=last_lsn,
        first_term=first_term,
        last_term=last_term,
        first_time_tick=first_tick,
        last_time_tick=last_tick,
        data_end=data_end,
        digest=digest,
    )
    return Footer(summary, block_size, crcs, index, footer_offset + index_offset)
