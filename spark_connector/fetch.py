"""Executor side: one input partition's rows as Arrow RecordBatches.

What lives here: `read_slice`, which gets the frames of a `SegmentSlice` (the local file
when `preferLocal` finds a verified copy, else `ReadSegment` from each replica in turn),
decodes them vectorially (`wal_segments.columnar`: no Python object per row) and applies the
row filters, and `RowFilter`, the filters a read pushes down.

What must never happen here: a wrong or missing row without an error. Every byte is
verified before it is decoded: a local file by its block crcs and the committed digest, a
remote chunk by its crc (computed by the replica from its verified file) and, for a whole
segment, the committed digest over all chunks. A replica that is down, lacks the segment or
sends bad bytes is skipped for the next one; when none serves it, the error names the
pchannel, the segment and what every replica answered.

Transactions: only entries of committed transactions appear. A transaction is written as
one contiguous batch [begin, body..., commit], so it lies inside one segment; a partition
that splits a segment emits the transactions whose begin entry falls in its range, and reads
past its end until their commit. Entries of a transaction without a commit entry (which
the WAL never seals, but a reader does not rely on that) are not shown.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from rpc.protos import streaming_pb2 as wire
from rpc.segment_transfer import TransferError, client_tls, receive, transfer_host
from spark_connector.options import HIDDEN_MSG_TYPES, ReadOptions
from spark_connector.plan import SegmentSlice, channel, describe
from wal_segments import columnar
from wal_segments.format import (
    CONTROL_FLAGS,
    MAX_SEGMENT_BYTES,
    TXN_FLAGS,
    EntryFlags,
    FormatError,
    crc32c,
)
from wal_segments.segment import SegmentCorrupted, SegmentReader, segment_file_name

log = logging.getLogger(__name__)

#: Properties the WAL keeps for idempotent producers; never shown to readers.
INTERNAL_PROPERTIES = pa.array(["rw.producer", "rw.seq", "rw.count"], pa.string())
#: Rows fetched per step when a split partition reads on to finish a transaction.
TXN_TAIL_STEP = 65_536
#: ReadSegment's chunk size. Large messages stall a gRPC stream on HTTP/2 flow control:
#: segments read in 8 MiB chunks ran at about 265 MB/s, in 1 MiB chunks at about 410
#: (`./run bench read_chunks`; docs/benchmarks-history.md, "Consume").
CHUNK_BYTES = 1 << 20
#: A partition read from a replica is fetched in pieces of at most this many rows (about
#: 17 MiB of 100-byte messages), the next while the current one is decoded.
PIECE_ROWS = 100_000
#: Up to this many rows filtered out, a batch is sliced around them instead of filtered.
FEW_DROPPED_ROWS = 64
HEADER_FIELDS = tuple(f.name for f in dataclasses.fields(columnar.HeaderColumns))
#: What Spark's Python data source path accepts: the declared schema exactly, which has
#: every top-level field nullable (the data itself has nulls only in txn_id/broadcast_id).
SPARK_SCHEMA = pa.schema([field.with_nullable(True) for field in columnar.SCHEMA])


@dataclass(frozen=True)
class RowFilter:
    """Row predicates applied vectorially after decoding (all optional, AND-ed)."""

    vchannel_ids: frozenset[int] | None = None
    #: allowed message-type codes; None = everything but HIDDEN_MSG_TYPES
    msg_types: frozenset[int] | None = None
    min_time_tick: int | None = None  # inclusive
    max_time_tick: int | None = None  # exclusive

    @staticmethod
    def from_options(options: ReadOptions, vchannel_ids: Mapping[str, int]) -> RowFilter:
        return RowFilter(
            vchannel_ids=(
                frozenset(vchannel_ids[v] for v in options.vchannels) if options.vchannels else None
            ),
            msg_types=options.msg_types,
            min_time_tick=options.from_time_tick,
            max_time_tick=options.to_time_tick,
        )


class SegmentUnreadable(RuntimeError):
    """No replica served a verified copy of a segment."""


@dataclass
class _Frames:
    """Verified frames of consecutive LSNs: `buffer` holds them, `offsets` (uint64) locate
    each frame; `lower_bound`/`start_offset` say where frames may start."""

    buffer: pa.Buffer
    offsets: pa.Array
    first_lsn: int
    end_offset: int
    lower_bound: int
    start_offset: int | None
    source: str

    def headers(self) -> columnar.HeaderColumns:
        try:
            return columnar.decode_headers(
                self.buffer,
                self.offsets,
                first_lsn=self.first_lsn,
                lower_bound=self.lower_bound,
                end_offset=self.end_offset,
                start_offset=self.start_offset,
            )
        except FormatError as error:
            raise SegmentCorrupted(self.source, error.offset, error.reason) from None


# -- fetching -------------------------------------------------------------------------------


def _local_frames(part: SegmentSlice, options: ReadOptions, low: int, high: int) -> _Frames | None:
    """Frames from a local copy whose digest matches the committed one, or None."""
    for node_id, _ in part.replicas:
        directory = options.local_data_dirs.get(node_id)
        if directory is None:
            continue
        path = Path(directory) / "wal" / part.pchannel / segment_file_name(part.segment_id)
        if not path.exists():
            continue
        try:
            reader = SegmentReader.open(path)
        except (OSError, SegmentCorrupted) as error:
            log.warning("%s: local copy %s unusable (%s); trying others", part.label, path, error)
            continue
        if (
            reader.digest != part.digest
            or reader.first_lsn != part.first_lsn
            or reader.last_lsn != part.last_lsn
        ):
            log.warning("%s: local copy %s differs from the committed digest", part.label, path)
            reader.close()
            continue
        start = low - reader.first_lsn
        stop = high - reader.first_lsn + 1
        offsets = reader.frame_offsets()
        end = reader.data_end if stop >= reader.entry_count else int(offsets[stop])
        offsets.release()
        return _Frames(
            buffer=reader.buffer,
            offsets=reader.index.slice(start, stop - start),
            first_lsn=low,
            end_offset=end,
            lower_bound=reader.header_len,
            start_offset=reader.header_len if start == 0 else None,
            source=f"{path} (node {node_id})",
        )
    return None


def _remote_frames(
    part: SegmentSlice, options: ReadOptions, low: int, high: int, failures: list[str]
) -> _Frames | None:
    """Frames from the first replica that serves them verified; failures are appended.
    Each replica is asked for a bulk transfer first (its transfer port, no gRPC copies);
    when that fails in transit, the same replica streams them over gRPC."""
    # Spread whole-segment reads over the replicas instead of all hitting the first one.
    count = len(part.replicas)
    start = part.segment_id % count
    order = part.replicas[start:] + part.replicas[:start]
    for node_id, address in order:
        name = f"replica {node_id} ({address})"
        for bulk in (True, False) if options.bulk_transfer else (False,):
            try:
                with channel(address, options) as chan:
                    got = _read_replica(chan, part, options, address, low, high, bulk)
            except grpc.RpcError as error:
                failures.append(f"{name}: {describe(error)}")
                break
            except FormatError as error:
                failures.append(f"{name}: {error.reason}")
                break
            except TransferError as error:
                log.warning(
                    "%s: bulk transfer from %s failed (%s); streaming", part.label, name, error
                )
                continue
            if isinstance(got, str):
                failures.append(f"{name}: {got}")
                break
            return dataclasses.replace(got, source=f"{part.label} from {name}")
    return None


def _read_replica(
    chan: grpc.Channel,
    part: SegmentSlice,
    options: ReadOptions,
    address: str,
    low: int,
    high: int,
    bulk: bool,
) -> _Frames | str:
    """Rows `low`..`high` of `part` from one replica, verified, or what was wrong with
    them. TransferError when a bulk transfer failed in transit (the caller streams)."""
    whole = low == part.first_lsn and high == part.last_lsn
    chunks = read_segment_chunks(
        chan,
        wire.ReadSegmentRequest(
            pchannel=part.pchannel,
            segment_id=part.segment_id,
            from_lsn=low,
            to_lsn=high,
            max_chunk_bytes=CHUNK_BYTES,
            with_offsets=True,
            bulk=bulk,
        ),
        options.timeout_s,
    )
    frames: list[memoryview] = []
    offset_parts: list[pa.Array] = []
    size = 0
    running = 0
    expected_lsn = low
    for index, chunk in enumerate(chunks):
        if index == 0 and chunk.segment_digest != part.digest:
            return (
                f"digest {chunk.segment_digest:#010x} differs from the committed "
                f"{part.digest:#010x}"
            )
        offsets_bytes = chunk.frame_offsets
        first_lsn, last_lsn = chunk.first_lsn, chunk.last_lsn
        n = last_lsn - first_lsn + 1
        if first_lsn != expected_lsn or n < 1 or len(offsets_bytes) != 8 * n:
            return f"chunk at lsn {first_lsn} out of sequence or malformed"
        if chunk.transfer_ticket:
            if index != 0 or last_lsn != high:
                return f"a bulk transfer offer at lsn {first_lsn} that does not cover {low}..{high}"
            if not 0 < chunk.transfer_bytes <= MAX_SEGMENT_BYTES:
                # Checked before anything is allocated for it.
                return (
                    f"a bulk transfer offer of {chunk.transfer_bytes:,} bytes (expected "
                    f"1..{MAX_SEGMENT_BYTES:,})"
                )
            return _transferred(part, options, address, chunk, whole)
        data = chunk.frames
        if whole:
            # The committed digest over every chunk checks the whole transfer.
            running = crc32c(data, running)
        elif crc32c(data) != chunk.frames_crc:
            return f"chunk at lsn {first_lsn} failed its crc in transfer"
        relative = pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(offsets_bytes)])
        offset_parts.append(pc.add(relative, pa.scalar(size, pa.uint64())))
        frames.append(data)
        size += len(data)
        expected_lsn = last_lsn + 1
    if expected_lsn != high + 1:
        return f"stream ended at lsn {expected_lsn - 1}, expected {high}"
    if whole and running != part.digest:
        return f"bytes hash to {running:#010x}, not the committed digest {part.digest:#010x}"
    return _Frames(
        buffer=gather(frames),
        offsets=pa.concat_arrays(offset_parts),
        first_lsn=low,
        end_offset=size,
        lower_bound=0,
        start_offset=0,
        source="",
    )


def _transferred(
    part: SegmentSlice, options: ReadOptions, address: str, offer: SegmentChunk, whole: bool
) -> _Frames | str:
    """The frames a bulk transfer `offer` announces, received into one buffer and checked
    against the committed digest (a whole segment) or the offer's crc."""
    size = offer.transfer_bytes
    buffer = pa.allocate_buffer(size)
    receive(
        transfer_host(address),
        offer.transfer_port,
        offer.transfer_ticket,
        memoryview(buffer).cast("B"),
        options.timeout_s,
        client_tls(options.security),
    )
    want = part.digest if whole else offer.frames_crc
    got = crc32c(memoryview(buffer))
    if got != want:
        return f"bytes of the bulk transfer hash to {got:#010x}, expected {want:#010x}"
    n = offer.last_lsn - offer.first_lsn + 1
    return _Frames(
        buffer=buffer,
        offsets=pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(offer.frame_offsets)]),
        first_lsn=offer.first_lsn,
        end_offset=size,
        lower_bound=0,
        start_offset=0,
        source="",
    )


def gather(chunks: list[memoryview]) -> pa.Buffer:
    """The chunks copied once, in order, into one buffer Arrow allocates aligned."""
    buffer = pa.allocate_buffer(sum(len(chunk) for chunk in chunks))
    target = memoryview(buffer).cast("B")
    position = 0
    for chunk in chunks:
        target[position : position + len(chunk)] = chunk
        position += len(chunk)
    return buffer


@dataclass(frozen=True)
class SegmentChunk:
    """One ReadSegmentResponse, its `frames` a view of the received bytes (no copy)."""

    frames: memoryview
    frame_offsets: bytes
    first_lsn: int
    last_lsn: int
    segment_digest: int
    frames_crc: int
    #: a bulk transfer's offer (empty ticket: the frames are in this chunk)
    transfer_ticket: bytes = b""
    transfer_port: int = 0
    transfer_bytes: int = 0


#: ReadSegment's full method name (the generated stub's).
READ_SEGMENT_METHOD = "/raftwal.v1.StreamingNode/ReadSegment"


def read_segment_chunks(
    chan: grpc.Channel, request: wire.ReadSegmentRequest, timeout_s: float
) -> Iterator[SegmentChunk]:
    """ReadSegment's chunks, each parsed from the bytes gRPC received: the frames stay a
    view of them instead of being copied into a message and out of it again."""
    call = chan.unary_stream(
        READ_SEGMENT_METHOD,
        request_serializer=wire.ReadSegmentRequest.SerializeToString,
        response_deserializer=None,
    )
    for raw in call(request, timeout=timeout_s):
        yield parse_segment_chunk(raw)


#: ReadSegmentResponse's fields by number: (name, wire type).
_CHUNK_FIELDS = {
    1: ("frames", 2),
    2: ("first_lsn", 0),
    3: ("last_lsn", 0),
    4: ("segment_digest", 0),
    5: ("segment_count", 0),
    6: ("node_id", 2),
    7: ("frames_crc", 0),
    8: ("frame_offsets", 2),
    9: ("transfer_ticket", 2),
    10: ("transfer_port", 0),
    11: ("transfer_bytes", 0),
}


def _varint(raw: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(raw) or shift > 63:
            raise FormatError(position, "a truncated or overlong varint in a ReadSegment chunk")
        byte = raw[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def parse_segment_chunk(raw: bytes) -> SegmentChunk:
    """A serialized ReadSegmentResponse, parsed as protobuf would (the last occurrence of
    a field wins, unknown fields are skipped, int64s are two's complement); FormatError
    for bytes that are not one."""
    view = memoryview(raw)
    fields: dict[str, Any] = {}
    position = 0
    end = len(raw)
    while position < end:
        tag, position = _varint(raw, position)
        number, wire_type = tag >> 3, tag & 7
        value: int | memoryview
        if wire_type == 0:
            value, position = _varint(raw, position)
        elif wire_type == 2:
            length, position = _varint(raw, position)
            if position + length > end:
                raise FormatError(position, "a field runs past the end of a ReadSegment chunk")
            value = view[position : position + length]
            position += length
        elif wire_type == 1 or wire_type == 5:
            position += 8 if wire_type == 1 else 4
            if position > end:
                raise FormatError(position, "a field runs past the end of a ReadSegment chunk")
            continue
        else:
            raise FormatError(position, f"wire type {wire_type} in a ReadSegment chunk")
        known = _CHUNK_FIELDS.get(number)
        if known is None:
            continue
        if known[1] != wire_type:
            raise FormatError(
                position, f"field {number} of a ReadSegment chunk has wire type {wire_type}"
            )
        fields[known[0]] = value

    def signed(name: str) -> int:
        value = int(fields.get(name, 0))
        return value - (1 << 64) if value >= 1 << 63 else value

    return SegmentChunk(
        frames=fields.get("frames", view[0:0]),
        frame_offsets=bytes(fields.get("frame_offsets", b"")),
        first_lsn=signed("first_lsn"),
        last_lsn=signed("last_lsn"),
        segment_digest=int(fields.get("segment_digest", 0)) & 0xFFFFFFFF,
        frames_crc=int(fields.get("frames_crc", 0)) & 0xFFFFFFFF,
        transfer_ticket=bytes(fields.get("transfer_ticket", b"")),
        transfer_port=int(fields.get("transfer_port", 0)) & 0xFFFFFFFF,
        transfer_bytes=signed("transfer_bytes"),
    )


def _frames(part: SegmentSlice, options: ReadOptions, low: int, high: int) -> _Frames:
    if options.prefer_local:
        local = _local_frames(part, options, low, high)
        if local is not None:
            return local
    failures: list[str] = []
    remote = _remote_frames(part, options, low, high, failures)
    if remote is None:
        raise SegmentUnreadable(
            f"{part.label} (lsn {low}..{high}) could not be read from any replica: "
            + "; ".join(failures)
        )
    return remote


# -- decoding and filtering -----------------------------------------------------------------


def _hide_internal_properties(batch: pa.RecordBatch) -> pa.RecordBatch:
    properties = batch.column("properties")
    keys = properties.keys
    if len(keys) == 0:
        return batch
    keep = pc.invert(pc.is_in(keys, value_set=INTERNAL_PROPERTIES))
    if pc.all(keep).as_py():
        return batch
    kept_before = pa.concat_arrays(
        [pa.array([0], pa.int32()), pc.cumulative_sum(keep.cast(pa.int32()))]
    )
    old_offsets = properties.offsets
    if properties.offset:
        old_offsets = pc.subtract(old_offsets, old_offsets[0])
    new_offsets = pc.take(kept_before, old_offsets)
    rebuilt = pa.MapArray.from_arrays(
        new_offsets,
        pc.filter(keys, keep),
        pc.filter(properties.items, keep),
        type=properties.type,
    )
    index = batch.schema.get_field_index("properties")
    return batch.set_column(index, batch.schema.field(index), rebuilt)


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value, pa.uint64())


def _mask(
    headers: columnar.HeaderColumns, row_filter: RowFilter, high: int
) -> tuple[pa.Array, bool]:
    """(rows to keep, whether the frames end inside an unfinished transaction)."""
    lsn = headers.lsn
    # None while every row is kept: the frames of a whole segment or piece end at `high`.
    keep: pa.Array | None = None
    if lsn[len(lsn) - 1].as_py() > high:
        keep = pc.less_equal(lsn, pa.scalar(high, pa.int64()))
    txn_bits = pc.bit_wise_and(headers.flags, _u64(TXN_FLAGS))
    unfinished = False
    if pc.max(txn_bits).as_py():
        # Transactions whose begin lies in this partition's range, and that commit in the
        # frames at hand (a split partition reads on until they do).
        is_begin = pc.equal(txn_bits, _u64(int(EntryFlags.TXN_BEGIN)))
        begins = pc.filter(headers.txn_id, is_begin if keep is None else pc.and_(is_begin, keep))
        commits = pc.filter(headers.txn_id, pc.equal(txn_bits, _u64(int(EntryFlags.TXN_COMMIT))))
        committed = pc.filter(begins, pc.is_in(begins, value_set=commits))
        unfinished = len(committed) < len(begins)
        in_txn = pc.not_equal(txn_bits, _u64(0))
        keep = pc.if_else(
            in_txn,
            pc.is_in(headers.txn_id, value_set=committed),
            pa.scalar(True) if keep is None else keep,
        )
    # Control entries (term starts, seal markers, an idle owner's time-tick entries for
    # pack consumers) are the log's own bookkeeping, never rows, whatever msgTypes asks.
    not_control = pc.equal(pc.bit_wise_and(headers.flags, _u64(CONTROL_FLAGS)), _u64(0))
    keep = not_control if keep is None else pc.and_(keep, not_control)
    if row_filter.msg_types is not None:
        allowed = pa.array(sorted(row_filter.msg_types), pa.uint64())
        keep = pc.and_(keep, pc.is_in(headers.msg_type, value_set=allowed))
    else:
        hidden = pa.array(sorted(HIDDEN_MSG_TYPES), pa.uint64())
        keep = pc.and_(keep, pc.invert(pc.is_in(headers.msg_type, value_set=hidden)))
    if row_filter.vchannel_ids is not None:
        ids = pa.array(sorted(row_filter.vchannel_ids), pa.int64())
        keep = pc.and_(keep, pc.is_in(headers.vchannel_id, value_set=ids))
    if row_filter.min_time_tick is not None:
        keep = pc.and_(
            keep,
            pc.greater_equal(headers.time_tick, pa.scalar(row_filter.min_time_tick, pa.int64())),
        )
    if row_filter.max_time_tick is not None:
        keep = pc.and_(
            keep, pc.less(headers.time_tick, pa.scalar(row_filter.max_time_tick, pa.int64()))
        )
    return keep, unfinished


def _pieces(part: SegmentSlice, options: ReadOptions) -> list[SegmentSlice]:
    """`part` cut into consecutive LSN ranges of at most PIECE_ROWS rows, when its frames
    come from a replica (with `preferLocal` they are on hand: one piece)."""
    rows = part.to_lsn - part.from_lsn + 1
    if options.prefer_local or rows < 2 * PIECE_ROWS:
        return [part]
    count = -(-rows // PIECE_ROWS)
    bounds = [part.from_lsn + rows * k // count for k in range(count + 1)]
    return [
        dataclasses.replace(part, from_lsn=low, to_lsn=high - 1)
        for low, high in itertools.pairwise(bounds)
    ]


def read_slice(
    part: SegmentSlice,
    options: ReadOptions,
    vchannel_names: Mapping[int, str],
    row_filter: RowFilter,
) -> Iterator[pa.RecordBatch]:
    """The partition's rows, filtered, as RecordBatches of `columnar.SCHEMA`.

    Frames from a replica come in pieces (`_pieces`), each fetched in a background thread
    while the one before is decoded and handed to Spark: the transfer's wait overlaps the
    work instead of preceding it. A piece is read like a partition of its own (a
    transaction belongs to the piece holding its begin entry, which reads on to its
    commit), so the rows are the same as in one piece."""
    pieces = _pieces(part, options)
    if len(pieces) == 1:
        yield from _read_piece(part, options, vchannel_names, row_filter, None)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftwal-fetch")

    def fetch(piece: SegmentSlice) -> Future[_Frames]:
        return pool.submit(_frames, piece, options, piece.from_lsn, piece.to_lsn)

    upcoming = fetch(pieces[0])
    try:
        for index, piece in enumerate(pieces):
            frames = upcoming.result()
            if index + 1 < len(pieces):
                upcoming = fetch(pieces[index + 1])
            yield from _read_piece(piece, options, vchannel_names, row_filter, frames)
    finally:
        # A read stopped early (an error, or Spark needs no more rows) does not wait for
        # the fetch in flight; its thread ends with the fetch, bounded by timeoutSeconds.
        pool.shutdown(wait=False, cancel_futures=True)


def _read_piece(
    part: SegmentSlice,
    options: ReadOptions,
    vchannel_names: Mapping[int, str],
    row_filter: RowFilter,
    fetched: _Frames | None,
) -> Iterator[pa.RecordBatch]:
    """The rows of `part`, whose frames `fetched` holds already when not None."""
    started = time.monotonic()
    high = part.to_lsn
    fetch_high = high
    while True:
        if fetched is not None:
            frames, fetched = fetched, None
        else:
            frames = _frames(part, options, part.from_lsn, fetch_high)
        headers = frames.headers()
        keep, unfinished = _mask(headers, row_filter, high)
        if not unfinished or fetch_high >= part.last_lsn:
            break
        # A transaction begun in range commits further on: read on (bounded by the segment).
        fetch_high = min(part.last_lsn, fetch_high + TXN_TAIL_STEP)
    if unfinished:
        # The WAL never seals a transaction without its commit; if a segment holds one
        # anyway, it is not committed and stays invisible, as it would to a consumer.
        log.warning("%s: a transaction begun by lsn %d has no commit; not shown", part.label, high)
    total = len(keep)
    kept = keep.true_count  # no nulls in the mask
    dropped = total - kept
    if kept == 0:
        return
    if dropped > FEW_DROPPED_ROWS:
        # Real filtering: build columns for the kept rows only (no payload copied in vain).
        headers = _filter_headers(headers, keep)
    try:
        batch = columnar.to_record_batch(
            frames.buffer,
            headers,
            pchannel=part.pchannel,
            segment_id=part.segment_id,
            vchannel_names=vchannel_names,
            source=frames.source,
        )
    except FormatError as error:
        raise SegmentCorrupted(frames.source, error.offset, error.reason) from None
    batch = pa.RecordBatch.from_arrays(
        _hide_internal_properties(batch).columns, schema=SPARK_SCHEMA
    )
    count = 0
    if 0 < dropped <= FEW_DROPPED_ROWS:
        # A few rows out (term-start and seal entries): zero-copy slices around them
        # instead of a filter that copies every column.
        previous = 0
        for row in pc.indices_nonzero(pc.invert(keep)).to_pylist() + [total]:
            if row > previous:
                count += row - previous
                yield batch.slice(previous, row - previous)
            previous = row + 1
    else:
        count = batch.num_rows
        yield batch
    log.debug(
        "%s lsn %d..%d: %d rows from %s in %.3f s",
        part.label,
        part.from_lsn,
        high,
        count,
        frames.source,
        time.monotonic() - started,
    )


def _filter_headers(headers: columnar.HeaderColumns, keep: pa.Array) -> columnar.HeaderColumns:
    """The rows of `headers` where `keep` is true (frames stay in file order, which is all
    `columnar.to_record_batch` needs)."""
    return columnar.HeaderColumns(
        **{name: pc.filter(getattr(headers, name), keep) for name in HEADER_FIELDS}
    )
