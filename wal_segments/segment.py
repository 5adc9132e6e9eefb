"""Segment files on the local disk: writer, crash recovery, sealed and unsealed readers.

What lives here:
- `SegmentWriter`: creates `<dir>/<first_lsn:020d>.seg` atomically (header written and
  synced under a temporary name, linked into place, directory fsynced), appends encoded
  batches, syncs (fdatasync through a hook so tests can count it), truncates a divergent
  suffix, and seals (footer with the offset index, per-block crc32c and the digest). An
  append whose write fails (ENOSPC, EIO) is cut back off the file, leaving the segment as
  it was and still appendable; a failed fdatasync, seal or cut-back leaves the writer
  failed (every later call raises SegmentStateError) until the file is reopened.
  Every write and fdatasync passes the fault points ``wal.append`` / ``wal.fsync``
  (`faults.py`) first.
- `open_segment`: recovery on open. A sealed file has its trailer and footer verified. An
  unsealed file is walked frame by frame: a torn tail (a bad frame with no valid frame
  after it: a partial last frame, a last frame whose crc fails, zeros or a half-written
  footer) is truncated and reported; a bad frame followed by a valid frame is mid-file
  corruption and raises `SegmentCorrupted(path, offset, reason)`. Nothing is ever skipped.
- `SegmentReader`: a sealed segment, verified once (trailer, footer crc, every block crc),
  read through the index: entries one by one (slow path), the fixed headers as Arrow
  columns, or the Spark RecordBatch built vectorially (`to_arrow`).
- `read_unsealed`: walks the open tail frame by frame with per-frame crc (slow path).

What must never happen here: an import of `raft` or `raftwal`; returning bytes that were
not verified; silently skipping a bad entry; truncating anything but a torn tail, the part
of a failed append that reached the file, or the suffix a caller asked to drop. A writer
belongs to one task: `append_*`, `seal` and `truncate_after` must not run concurrently with
each other; `sync` may run in another thread while appends continue (that is how the group
commit uses it).
"""

from __future__ import annotations

import contextlib
import logging
import os
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wal_segments import mutations
from wal_segments.faults import fault
from wal_segments.format import (
    CONTROL_FLAGS,
    DEFAULT_BLOCK_SIZE_BYTES,
    ENTRY_HEADER,
    ENTRY_HEADER_SIZE,
    FOOTER_FIXED,
    FOOTER_MAGIC,
    MAX_SEGMENT_BYTES,
    TRAILER_SIZE,
    BatchMeta,
    Entry,
    FileHeader,
    Footer,
    FormatError,
    SegmentSummary,
    check_block_size,
    check_frame,
    crc32c,
    decode_file_header,
    decode_footer,
    decode_trailer,
    encode_batch,
    encode_file_header,
    encode_footer_parts,
    entry_from_frame,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from wal_segments import columnar

logger = logging.getLogger(__name__)

# A deliberate bug for the simulation's mutation suite (`wal_segments.mutations`).
RETRY_FAILED_FSYNC = mutations.declare(
    "retry-failed-fsync", "a failed fdatasync is retried over the same pages"
)

SEGMENT_SUFFIX = ".seg"
_TEMPORARY_SUFFIX = ".seg.tmp"
_MAX_HEADER_BYTES = 512

Fdatasync = Callable[[int], None]


def _default_fdatasync(fd: int) -> None:
    """``os.fdatasync`` (``os.fsync`` where there is none), looked up at each call so that
    a fault layer under ``os`` (``raftwal simulate``'s disk, tests) sees every sync."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)


class SegmentError(Exception):
    """Base class of the errors of this module."""


class SegmentCorrupted(SegmentError):
    """A segment's bytes are not what was written. Never skipped: the caller decides."""

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str) -> None:
        super().__init__(f"corrupt segment {os.fspath(path)} at offset {offset}: {reason}")
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason


class SegmentStateError(SegmentError):
    """An operation that the segment's state does not allow (sealed, failed, closed)."""


def segment_file_name(first_lsn: int) -> str:
    """`<first_lsn>.seg`, zero-padded so that names sort by LSN."""
    return f"{first_lsn:020d}{SEGMENT_SUFFIX}"


def list_segment_files(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(first_lsn, path) of the segment files in `directory`, in LSN order."""
    found = []
    for path in Path(directory).iterdir():
        stem = path.name[: -len(SEGMENT_SUFFIX)]
        if path.name.endswith(SEGMENT_SUFFIX) and stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable_directory(directory: str | os.PathLike[str]) -> None:
    """Create `directory` (0700, with its missing parents) so that it survives a power cut:
    each directory created is followed by an fsync of its parent, without which the new
    entry, and every file under it however well synced, may be gone after a crash."""
    path = Path(directory)
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):
            created.mkdir(mode=0o700)
        fsync_directory(created.parent)


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int, path: Path) -> None:
    fault("wal.append", str(path))
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _pwritev_all(fd: int, parts: Sequence[bytes | memoryview], offset: int, path: Path) -> None:
    """`parts` written in order at `offset` with one pwritev (a short write, which a
    regular file rarely gives, is finished part by part)."""
    fault("wal.append", str(path))
    # Byte-format buffers: len() is in bytes.
    views = [part for part in parts if len(part)]
    written = os.pwritev(fd, views, offset) if views else 0
    for view in views:
        if written >= len(view):
            written -= len(view)
            offset += len(view)
            continue
        rest = view[written:]
        while rest:
            count = os.pwrite(fd, rest, offset)
            rest = rest[count:]
            offset += count
        written = 0


def _datasync(fdatasync: Fdatasync, fd: int, path: Path) -> None:
    fault("wal.fsync", str(path))
    fdatasync(fd)


def sync_file(path: str | os.PathLike[str], fdatasync: Fdatasync = _default_fdatasync) -> None:
    """fdatasync the file at `path` (through the ``wal.fsync`` fault point): what a
    process killed before its own fdatasync left in the page cache is on the disk after
    this."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _datasync(fdatasync, fd, Path(path))
    finally:
        os.close(fd)


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


# -- recovery -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TornTail:
    """What recovery cut off the end of an unsealed segment."""

    offset: int
    discarded_bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveredSegment:
    path: Path
    header: FileHeader
    header_len: int
    sealed: bool
    entry_count: int
    #: first_lsn - 1 when the segment holds no entry
    last_lsn: int
    #: 0 when the segment holds no entry (the previous entry lives in the previous segment)
    last_term: int
    #: -1 when the segment holds no entry
    last_time_tick: int
    #: end of the last frame (= the footer offset of a sealed file)
    data_end: int
    #: absolute offsets of every frame, array('q')
    frame_offsets: array
    #: set when recovery cut (or, with repair=False, would cut) a torn tail
    truncated: TornTail | None
    #: the footer's summary, for a sealed file
    summary: SegmentSummary | None


@dataclass(slots=True)
class _Walk:
    offsets: array
    end: int
    last_lsn: int
    last_term: int
    last_time_tick: int
    bad_offset: int | None = None
    bad_reason: str = ""


def _walk_frames(view: memoryview, start: int, end: int, first_lsn: int) -> _Walk:
    """Verify frames from `start` until `end` or the first bad frame (or footer magic)."""
    walk = _Walk(array("q"), start, first_lsn - 1, 0, -1)
    offset = start
    while offset < end:
        # The footer magic (or, at the very end, a prefix of it) where a frame should
        # start: a seal that crashed before its trailer was written.
        if view[offset : offset + 8] == FOOTER_MAGIC[: min(8, end - offset)]:
            walk.bad_offset, walk.bad_reason = offset, "incomplete seal footer"
            break
        checked = check_frame(
            view, offset, end, walk.last_lsn + 1, walk.last_term, walk.last_time_tick
        )
        if isinstance(checked, str):
            walk.bad_offset, walk.bad_reason = offset, checked
            break
        fields, frame_end = checked
        walk.offsets.append(offset)
        walk.last_lsn, walk.last_term, walk.last_time_tick = fields[2], fields[3], fields[4]
        offset = frame_end
    walk.end = offset
    return walk


def _valid_frame_after(view: memoryview, walk: _Walk, end: int) -> int | None:
    """Offset of a verifiable frame after the bad one (LSN beyond the last good entry), or
    None: a torn write leaves only a prefix of what was being written, so a valid frame past
    a bad one means the bad one is mid-file corruption, not a torn tail."""
    assert walk.bad_offset is not None
    first = walk.bad_offset + 8
    last = end - ENTRY_HEADER_SIZE
    if first > last:
        return None
    # Cheap pre-filter on the lsn word of every 8-aligned candidate before the crc.
    highest_lsn = walk.last_lsn + (end - walk.bad_offset) // ENTRY_HEADER_SIZE + 1
    lsn_words = view[first + 8 : last + 16]
    count = (last - first) // 8 + 1
    lsns = array("q")
    lsns.frombytes(lsn_words[: count * 8])
    for index, lsn in enumerate(lsns):
        if walk.last_lsn < lsn <= highest_lsn:
            candidate = first + 8 * index
            checked = check_frame(view, candidate, end, None, walk.last_term, walk.last_time_tick)
            if not isinstance(checked, str):
                return candidate
    return None


def _read_header(path: Path, fd: int) -> tuple[FileHeader, int]:
    try:
        return decode_file_header(_pread_exact(fd, _MAX_HEADER_BYTES, 0))
    except FormatError as error:
        raise SegmentCorrupted(path, error.offset, error.reason) from None


def _read_footer(path: Path, fd: int, size: int, header_len: int) -> Footer | None:
    """The verified footer of a sealed file, None for an unsealed one."""
    if size < header_len + FOOTER_FIXED.size + TRAILER_SIZE:
        return None
    tail = _pread_exact(fd, TRAILER_SIZE, size - TRAILER_SIZE)
    try:
        found = decode_trailer(tail, size)
        if found is None:
            return None
        footer_offset, footer_len, footer_crc = found
        if footer_offset < header_len:
            raise FormatError(size - TRAILER_SIZE, "footer overlaps the file header")
        body = _pread_exact(fd, footer_len, footer_offset)
        return decode_footer(body, footer_offset, footer_crc)
    except FormatError as error:
        raise SegmentCorrupted(path, error.offset, error.reason) from None


def _verify_blocks(path: Path, data: bytes | memoryview | pa.Buffer, footer: Footer) -> None:
    view = memoryview(data)
    block = footer.block_size_bytes
    data_end = footer.summary.data_end
    for number, expected in enumerate(footer.block_crcs):
        start = number * block
        if crc32c(view[start : min(start + block, data_end)]) != expected:
            raise SegmentCorrupted(path, start, f"block {number} crc mismatch")


def open_segment(
    path: str | os.PathLike[str],
    *,
    repair: bool = True,
    verify_blocks: bool = False,
    fdatasync: Fdatasync = _default_fdatasync,
) -> RecoveredSegment:
    """Validate a segment file after a restart. Sealed: trailer and footer are verified (and
    every block crc with `verify_blocks`). Unsealed: every frame is verified; a torn tail is
    truncated (and fsynced) when `repair`, and reported in `truncated` either way.
    Raises SegmentCorrupted naming the file and offset for anything else."""
    path = Path(path)
    fd = os.open(path, os.O_RDWR if repair else os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        header, header_len = _read_header(path, fd)
        footer = _read_footer(path, fd, size, header_len)
        if footer is not None:
            summary = footer.summary
            if summary.first_lsn != header.first_lsn:
                raise SegmentCorrupted(
                    path, summary.data_end, "footer first_lsn disagrees with the header"
                )
            if verify_blocks:
                _verify_blocks(path, _pread_exact(fd, summary.data_end, 0), footer)
            return RecoveredSegment(
                path=path,
                header=header,
                header_len=header_len,
                sealed=True,
                entry_count=summary.entry_count,
                last_lsn=summary.last_lsn,
                last_term=summary.last_term,
                last_time_tick=summary.last_time_tick,
                data_end=summary.data_end,
                frame_offsets=array("q", footer.frame_offsets),
                truncated=None,
                summary=summary,
            )
        data = _pread_exact(fd, size, 0)
        view = memoryview(data)
        walk = _walk_frames(view, header_len, size, header.first_lsn)
        torn = None
        if walk.bad_offset is not None:
            follower = None
            if walk.bad_reason != "incomplete seal footer":
                follower = _valid_frame_after(view, walk, size)
            if follower is not None:
                raise SegmentCorrupted(
                    path,
                    walk.bad_offset,
                    f"{walk.bad_reason}; a valid frame follows at offset {follower}",
                )
            torn = TornTail(walk.bad_offset, size - walk.bad_offset, walk.bad_reason)
            if repair:
                logger.warning(
                    "segment %s: truncating torn tail at offset %d (%d bytes: %s)",
                    path,
                    torn.offset,
                    torn.discarded_bytes,
                    torn.reason,
                )
                os.ftruncate(fd, torn.offset)
                fdatasync(fd)
        return RecoveredSegment(
            path=path,
            header=header,
            header_len=header_len,
            sealed=False,
            entry_count=len(walk.offsets),
            last_lsn=walk.last_lsn,
            last_term=walk.last_term,
            last_time_tick=walk.last_time_tick,
            data_end=walk.end,
            frame_offsets=walk.offsets,
            truncated=torn,
            summary=None,
        )
    finally:
        os.close(fd)


# -- writer ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SealedSegment:
    """What `seal` produced: the CommitSegment fields the file can tell."""

    path: Path
    pchannel: str
    summary: SegmentSummary
    size_bytes: int


class _Checksums:
    """Running per-block crc32c of a file written strictly in order from offset 0, and the
    digest of the entry bytes (everything after the file header)."""

    def __init__(self, block_size_bytes: int) -> None:
        self.block = block_size_bytes
        self.blocks = array("I")
        self.current = 0
        self.size = 0
        self.digest = 0

    def add(self, data: bytes | memoryview, offset: int, *, digest: bool) -> None:
        if offset != self.size:
            raise ValueError(f"checksums at offset {self.size}, not {offset}")
        view = memoryview(data).cast("B")
        position = 0
        while position < len(view):
            room = self.block - self.size % self.block
            piece = view[position : position + room]
            self.current = crc32c(piece, self.current)
            position += len(piece)
            self.size += len(piece)
            if self.size % self.block == 0:
                self.blocks.append(self.current)
                self.current = 0
        if digest:
            self.digest = crc32c(view, self.digest)

    def result(self) -> tuple[array, int]:
        blocks = array("I", self.blocks)
        if self.size % self.block:
            blocks.append(self.current)
        return blocks, self.digest


class SegmentWriter:
    """Appends to one unsealed segment file. Create with `create` or `resume`."""

    def __init__(
        self,
        path: Path,
        fd: int,
        header: FileHeader,
        header_len: int,
        *,
        end_offset: int,
        frame_offsets: array,
        last_lsn: int,
        last_term: int,
        last_time_tick: int,
        first_term: int,
        first_time_tick: int,
        fdatasync: Fdatasync,
        block_size_bytes: int,
    ) -> None:
        check_block_size(block_size_bytes)
        self.path = path
        self.header = header
        self.header_len = header_len
        self._fd = fd
        self._fdatasync = fdatasync
        self._block_size_bytes = block_size_bytes
        self._end_offset = end_offset
        self._durable_offset = end_offset
        self._frame_offsets = frame_offsets
        self._last_lsn = last_lsn
        self._last_term = last_term
        self._last_time_tick = last_time_tick
        self._first_term = first_term
        self._first_time_tick = first_time_tick
        self._sealed = False
        self._closed = False
        self._failure: BaseException | None = None
        # Checksums the footer needs, kept up to date by every append so that sealing does
        # not read the segment back (a stall of tens of ms on every replica at once). None
        # when the writer did not see every byte (resumed, truncated): seal reads back.
        self._checksums: _Checksums | None = None

    # construction

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        pchannel: str,
        first_lsn: int,
        created_term: int,
        *,
        fdatasync: Fdatasync = _default_fdatasync,
        block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES,
    ) -> SegmentWriter:
        """A new empty segment. The file appears under its final name only once its header
        is durable, so a crash never leaves a final-named file without a valid header."""
        header = FileHeader(pchannel, first_lsn, created_term)
        encoded = encode_file_header(header)
        directory = Path(directory)
        path = directory / segment_file_name(first_lsn)
        temporary = directory / (path.name[: -len(SEGMENT_SUFFIX)] + _TEMPORARY_SUFFIX)
        if path.exists():
            raise FileExistsError(f"segment {path} already exists")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _pwrite_all(fd, encoded, 0, temporary)
            _datasync(fdatasync, fd, temporary)
            os.link(temporary, path)  # fails rather than replace an existing segment
        except BaseException:
            os.close(fd)
            # Nothing is under the final name: the next attempt starts afresh (and recovery
            # deletes a temporary file a crash leaves behind).
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        try:
            os.unlink(temporary)
            fsync_directory(directory)
        except BaseException:
            os.close(fd)
            raise
        writer = cls(
            path,
            fd,
            header,
            len(encoded),
            end_offset=len(encoded),
            frame_offsets=array("q"),
            last_lsn=first_lsn - 1,
            last_term=0,
            last_time_tick=-1,
            first_term=0,
            first_time_tick=-1,
            fdatasync=fdatasync,
            block_size_bytes=block_size_bytes,
        )
        writer._checksums = _Checksums(block_size_bytes)
        writer._checksums.add(encoded, 0, digest=False)
        return writer

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike[str],
        *,
        unseal: bool = False,
        fdatasync: Fdatasync = _default_fdatasync,
        block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES,
    ) -> tuple[SegmentWriter, RecoveredSegment]:
        """Reopen an unsealed segment for appending after recovery (torn tail truncated).
        A sealed segment raises SegmentStateError unless `unseal`, which drops its footer
        (for a replica whose sealed but uncommitted segment must be truncated)."""
        recovered = open_segment(path, repair=True, fdatasync=fdatasync)
        if recovered.sealed and not unseal:
            raise SegmentStateError(f"segment {recovered.path} is sealed")
        fd = os.open(recovered.path, os.O_RDWR)
        try:
            if recovered.sealed:
                os.ftruncate(fd, recovered.data_end)
            # What the file holds may never have been synced: its writer was killed
            # between a write and its fdatasync, and the page cache kept the bytes for
            # this process to read. Whatever this writer reports durable from here on
            # (an append already held, a fence answer) must be on the disk.
            _datasync(fdatasync, fd, Path(recovered.path))
            first_term, first_tick = 0, -1
            if recovered.entry_count:
                first = ENTRY_HEADER.unpack(
                    _pread_exact(fd, ENTRY_HEADER_SIZE, recovered.frame_offsets[0])
                )
                first_term, first_tick = first[3], first[4]
        except BaseException:
            os.close(fd)
            raise
        writer = cls(
            recovered.path,
            fd,
            recovered.header,
            recovered.header_len,
            end_offset=recovered.data_end,
            frame_offsets=recovered.frame_offsets,
            last_lsn=recovered.last_lsn,
            last_term=recovered.last_term,
            last_time_tick=recovered.last_time_tick,
            first_term=first_term,
            first_time_tick=first_tick,
            fdatasync=fdatasync,
            block_size_bytes=block_size_bytes,
        )
        return writer, recovered

    # state

    @property
    def pchannel(self) -> str:
        return self.header.pchannel

    @property
    def first_lsn(self) -> int:
        return self.header.first_lsn

    @property
    def last_lsn(self) -> int:
        """first_lsn - 1 while empty."""
        return self._last_lsn

    @property
    def last_term(self) -> int:
        """0 while empty."""
        return self._last_term

    @property
    def last_time_tick(self) -> int:
        return self._last_time_tick

    @property
    def entry_count(self) -> int:
        return len(self._frame_offsets)

    @property
    def end_offset(self) -> int:
        """Bytes written (header included)."""
        return self._end_offset

    @property
    def durable_offset(self) -> int:
        """Bytes known to be on disk (fdatasync'ed)."""
        return self._durable_offset

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def failure(self) -> BaseException | None:
        """The error that left this writer unusable (None while it works)."""
        return self._failure

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise SegmentStateError(
                f"segment {self.path} failed earlier ({self._failure!r}); reopen it to recover"
            )
        if self._sealed or self._closed:
            raise SegmentStateError(
                f"segment {self.path} is {'sealed' if self._sealed else 'closed'}"
            )

    # writing

    def append(self, entries: Sequence[Entry]) -> int:
        """Encode and append entries; returns the end offset to sync through."""
        batch = encode_batch(entries)
        return self.append_encoded(batch.data, batch.meta)

    def append_encoded(self, data: bytes | memoryview, meta: BatchMeta) -> int:
        """Append a batch encoded by `encode_batch` (owner) or verified by `scan_batch`
        (replica) and return the end offset to pass to `GroupCommit.sync_through`. The
        batch must continue the segment: next LSN, term not lower, time tick higher."""
        self._check_writable()
        if meta.count < 1 or len(data) != meta.size_bytes:
            raise ValueError(f"batch of {len(data)} bytes does not match its metadata {meta}")
        if meta.first_lsn != self._last_lsn + 1:
            raise ValueError(
                f"non-contiguous append to {self.path} (lsn {meta.first_lsn}; "
                f"expected {self._last_lsn + 1})"
            )
        if meta.first_term < self._last_term:
            raise ValueError(
                f"append with term {meta.first_term} below the last term {self._last_term}"
            )
        if meta.first_time_tick <= self._last_time_tick:
            raise ValueError(
                f"append with time_tick {meta.first_time_tick} not above {self._last_time_tick}"
            )
        if self._end_offset + len(data) > MAX_SEGMENT_BYTES:
            raise ValueError(
                f"segment {self.path} would exceed {MAX_SEGMENT_BYTES} bytes (seal it first)"
            )
        base = self._end_offset
        try:
            _pwrite_all(self._fd, data, base, self.path)
        except BaseException as error:
            # The file may hold part of the batch (a short write before ENOSPC): cut it
            # off, and the segment is exactly what it was before this call, still
            # appendable. Only when that fails too is the writer unusable (recovery on
            # reopen truncates the torn tail).
            try:
                os.ftruncate(self._fd, base)
            except OSError as truncate_error:
                logger.error(
                    "segment %s: cannot cut a failed append back to offset %d: %s",
                    self.path,
                    base,
                    truncate_error,
                )
                self._failure = error
            raise
        if self._checksums is not None:
            self._checksums.add(data, base, digest=True)
        if not self._frame_offsets:
            self._first_term, self._first_time_tick = meta.first_term, meta.first_time_tick
        self._frame_offsets.extend(base + offset for offset in meta.frame_offsets)
        self._end_offset = base + len(data)
        self._last_lsn = meta.last_lsn
        self._last_term = meta.last_term
        self._last_time_tick = meta.last_time_tick
        return self._end_offset

    def sync(self) -> int:
        """fdatasync what has been written so far; returns the offset now durable. Safe to
        call from another thread while appends continue."""
        if self._failure is not None:
            raise SegmentStateError(f"segment {self.path} failed earlier ({self._failure!r})")
        target = self._end_offset
        if target <= self._durable_offset:
            return self._durable_offset
        try:
            _datasync(self._fdatasync, self._fd, self.path)
        except BaseException as error:
            # After a failed fsync the page cache state is unknown: never retry blindly.
            if not mutations.active(RETRY_FAILED_FSYNC):
                self._failure = error
            raise
        self._durable_offset = max(self._durable_offset, target)
        return self._durable_offset

    def truncate_after(self, lsn: int) -> None:
        """Drop every entry above `lsn` (log matching found a divergent suffix) and make the
        truncation durable. `lsn` may be first_lsn - 1 to empty the segment."""
        self._check_writable()
        if not self.first_lsn - 1 <= lsn <= self._last_lsn:
            raise ValueError(
                f"invalid truncate_after lsn ({lsn}; expected "
                f"{self.first_lsn - 1}..{self._last_lsn})"
            )
        if lsn == self._last_lsn:
            return
        keep = lsn - self.first_lsn + 1
        new_end = self._frame_offsets[keep]
        if keep:
            last = ENTRY_HEADER.unpack(
                _pread_exact(self._fd, ENTRY_HEADER_SIZE, self._frame_offsets[keep - 1])
            )
            last_term, last_tick = last[3], last[4]
        else:
            last_term, last_tick = 0, -1
            self._first_term, self._first_time_tick = 0, -1
        try:
            os.ftruncate(self._fd, new_end)
            _datasync(self._fdatasync, self._fd, self.path)
        except BaseException as error:
            self._failure = error
            raise
        del self._frame_offsets[keep:]
        self._checksums = None
        self._end_offset = new_end
        self._durable_offset = new_end
        self._last_lsn, self._last_term, self._last_time_tick = lsn, last_term, last_tick
        logger.info("segment %s: truncated after lsn %d (offset %d)", self.path, lsn, new_end)

    def seal(self) -> SealedSegment:
        """Write the footer (offset index, per-block crc32c, digest) and the trailer, each
        made durable, then close the file. An empty segment cannot be sealed."""
        self._check_writable()
        if not self._frame_offsets:
            raise SegmentStateError(f"segment {self.path} is empty (delete it instead)")
        self.sync()
        data_end = self._end_offset
        block = self._block_size_bytes
        if self._checksums is not None:
            block_crcs, digest = self._checksums.result()
        else:
            # Checksums of what is in the file (the page cache), read back block by block.
            block_crcs = array("I")
            digest = 0
            for start in range(0, data_end, block):
                chunk = _pread_exact(self._fd, min(block, data_end - start), start)
                block_crcs.append(crc32c(chunk))
                if start + len(chunk) > self.header_len:
                    digest = crc32c(memoryview(chunk)[max(0, self.header_len - start) :], digest)
        summary = SegmentSummary(
            entry_count=len(self._frame_offsets),
            first_lsn=self.first_lsn,
            last_lsn=self._last_lsn,
            first_term=self._first_term,
            last_term=self._last_term,
            first_time_tick=self._first_time_tick,
            last_time_tick=self._last_time_tick,
            data_end=data_end,
            digest=digest,
        )
        footer = encode_footer_parts(summary, block, block_crcs, self._frame_offsets)
        try:
            # The trailer is written only once the footer is durable: a valid trailer then
            # always means a complete footer, and a torn seal looks like an unsealed file.
            _pwritev_all(self._fd, footer.body, data_end, self.path)
            _datasync(self._fdatasync, self._fd, self.path)
            _pwrite_all(self._fd, footer.trailer, data_end + footer.body_len, self.path)
            _datasync(self._fdatasync, self._fd, self.path)
        except BaseException as error:
            self._failure = error
            raise
        finally:
            footer.release()
        self._sealed = True
        size = data_end + len(footer)
        self.close()
        return SealedSegment(self.path, self.pchannel, summary, size)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- readers --------------------------------------------------------------------------------


# pyarrow (and columnar, built on it) is imported by the readers below only: the write
# path and recovery need none of it, and a node answers Raft before it pays for it.


def _aligned_buffer(data: bytes | bytearray | memoryview | pa.Buffer) -> pa.Buffer:
    import pyarrow as pa

    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    if buffer.address % 8:
        copy = pa.allocate_buffer(buffer.size)
        memoryview(copy).cast("B")[:] = memoryview(buffer).cast("B")
        buffer = copy
    return buffer


class SegmentReader:
    """A sealed segment, verified once on open (trailer, footer crc, header, every block
    crc); reads then go through the footer index without per-frame crc work."""

    def __init__(self, buffer: pa.Buffer, name: str, mapped: pa.MemoryMappedFile | None) -> None:
        import pyarrow as pa

        self.name = name
        self._buffer = buffer
        self._mapped = mapped
        view = memoryview(buffer)
        try:
            self.header, self.header_len = decode_file_header(view[:_MAX_HEADER_BYTES])
            found = decode_trailer(view[buffer.size - TRAILER_SIZE :], buffer.size)
            if found is None or buffer.size < self.header_len + TRAILER_SIZE:
                raise FormatError(buffer.size, "not sealed (no valid trailer)")
            footer_offset, footer_len, footer_crc = found
            if footer_offset < self.header_len:
                raise FormatError(footer_offset, "footer overlaps the file header")
            self.footer = decode_footer(
                view[footer_offset : footer_offset + footer_len],
                footer_offset,
                footer_crc,
                with_index=False,
            )
        except FormatError as error:
            raise SegmentCorrupted(name, error.offset, error.reason) from None
        self.summary = self.footer.summary
        if self.summary.first_lsn != self.header.first_lsn:
            raise SegmentCorrupted(name, footer_offset, "footer first_lsn disagrees with header")
        _verify_blocks(Path(name), view, self.footer)
        count = self.summary.entry_count
        self._index = pa.Array.from_buffers(
            pa.uint64(), count, [None, buffer.slice(self.footer.index_offset, 8 * count)]
        )

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> SegmentReader:
        import pyarrow as pa

        mapped = pa.memory_map(os.fspath(path), "r")
        try:
            return cls(mapped.read_buffer(), os.fspath(path), mapped)
        except BaseException:
            mapped.close()
            raise

    @classmethod
    def from_buffer(
        cls, data: bytes | bytearray | memoryview | pa.Buffer, name: str
    ) -> SegmentReader:
        """A sealed segment held in memory (e.g. received by ReadSegment); `name` is what
        errors call it."""
        return cls(_aligned_buffer(data), name, None)

    def close(self) -> None:
        if self._mapped is not None:
            self._mapped.close()
            self._mapped = None

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pchannel(self) -> str:
        return self.header.pchannel

    @property
    def first_lsn(self) -> int:
        return self.summary.first_lsn

    @property
    def last_lsn(self) -> int:
        return self.summary.last_lsn

    @property
    def entry_count(self) -> int:
        return self.summary.entry_count

    @property
    def digest(self) -> int:
        return self.summary.digest

    @property
    def size_bytes(self) -> int:
        return self._buffer.size

    def _rows(self, lsn_range: tuple[int, int] | None) -> tuple[int, int]:
        """[start, stop) row numbers for an inclusive LSN range, clipped to the segment."""
        if lsn_range is None:
            return 0, self.entry_count
        low, high = lsn_range
        start = max(low, self.first_lsn) - self.first_lsn
        stop = min(high, self.last_lsn) - self.first_lsn + 1
        return start, max(start, stop)

    def _frame_offset(self, row: int) -> int:
        return self.summary.data_end if row == self.entry_count else int(self._index[row].as_py())

    @property
    def buffer(self) -> pa.Buffer:
        """The whole verified file."""
        return self._buffer

    @property
    def index(self) -> pa.Array:
        """The footer index (uint64 frame offsets, one per row)."""
        return self._index

    @property
    def data_end(self) -> int:
        """File offset just past the last frame."""
        return self.summary.data_end

    def frame_offsets(self) -> memoryview:
        """The footer index as a read-only sequence of ints: row -> file offset of the frame
        (verified by the footer crc; `columnar.decode_headers` checks it chains)."""
        return memoryview(self._index.buffers()[1]).cast("B").cast("Q")

    def row_offsets(self, start: int, stop: int, base: int) -> bytes:
        """Offsets of rows [start, stop) minus `base`, as little-endian uint64 bytes."""
        import pyarrow as pa
        import pyarrow.compute as pc

        shifted = pc.subtract(self._index.slice(start, stop - start), pa.scalar(base, pa.uint64()))
        return shifted.buffers()[1].to_pybytes()[: 8 * (stop - start)]

    def byte_range(self, lsn_range: tuple[int, int] | None = None) -> tuple[int, int]:
        """[start, end) file offsets of the frames in `lsn_range` (raw bytes to stream)."""
        start, stop = self._rows(lsn_range)
        return self._frame_offset(start), self._frame_offset(stop)

    def header_columns(self, lsn_range: tuple[int, int] | None = None) -> pa.RecordBatch:
        """The fixed frame headers in `lsn_range` as Arrow columns (verified, no Python
        object per row); see `columnar.HEADER_SCHEMA`."""
        import pyarrow as pa

        from wal_segments import columnar

        start, stop = self._rows(lsn_range)
        if start == stop:
            return pa.RecordBatch.from_pylist([], schema=columnar.HEADER_SCHEMA)
        return self._decode(start, stop).to_record_batch()

    def _decode(self, start: int, stop: int) -> columnar.HeaderColumns:
        from wal_segments import columnar

        try:
            return columnar.decode_headers(
                self._buffer,
                self._index.slice(start, stop - start),
                first_lsn=self.first_lsn + start,
                lower_bound=self.header_len,
                end_offset=self._frame_offset(stop),
                start_offset=self.header_len if start == 0 else None,
            )
        except FormatError as error:
            raise SegmentCorrupted(self.name, error.offset, error.reason) from None

    def to_arrow(
        self,
        pchannel: str,
        vchannel_names: Mapping[int, str],
        lsn_range: tuple[int, int] | None = None,
        *,
        segment_id: int | None = None,
        include_control: bool = True,
    ) -> pa.RecordBatch:
        """The entries in `lsn_range` (inclusive, clipped) as a RecordBatch of
        `columnar.SCHEMA`, built vectorially. `vchannel_names` maps vchannel ids to names
        (KeyError for an id it lacks; id 0 is the pchannel itself and becomes ""),
        `segment_id` defaults to the first LSN, and `include_control=False` drops
        term-start and seal-marker entries."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from wal_segments import columnar

        if pchannel != self.pchannel:
            raise ValueError(
                f"segment {self.name} belongs to pchannel {self.pchannel!r}, not {pchannel!r}"
            )
        start, stop = self._rows(lsn_range)
        if start == stop:
            return columnar._empty_batch()
        headers = self._decode(start, stop)
        try:
            batch = columnar.to_record_batch(
                self._buffer,
                headers,
                pchannel=pchannel,
                segment_id=self.first_lsn if segment_id is None else segment_id,
                vchannel_names=vchannel_names,
                source=self.name,
            )
        except FormatError as error:
            raise SegmentCorrupted(self.name, error.offset, error.reason) from None
        if not include_control:
            control = pc.bit_wise_and(headers.flags, pa.scalar(CONTROL_FLAGS, pa.uint64()))
            batch = batch.filter(pc.equal(control, pa.scalar(0, pa.uint64())))
        return batch

    def entries(self, lsn_range: tuple[int, int] | None = None) -> Iterator[Entry]:
        """Entries one by one through the index (slow path: one Python object per entry)."""
        start, stop = self._rows(lsn_range)
        view = memoryview(self._buffer)
        last_term, last_tick = 0, -1
        for row in range(start, stop):
            offset = self._frame_offset(row)
            checked = check_frame(
                view,
                offset,
                self._frame_offset(row + 1),
                self.first_lsn + row,
                last_term,
                last_tick,
            )
            if isinstance(checked, str) or checked[1] != self._frame_offset(row + 1):
                reason = checked if isinstance(checked, str) else "frame disagrees with index"
                raise SegmentCorrupted(self.name, offset, reason)
            fields = checked[0]
            try:
                yield entry_from_frame(view, offset, fields)
            except ValueError as error:
                raise SegmentCorrupted(self.name, offset, f"bad properties ({error})") from None
            last_term, last_tick = fields[3], fields[4]

    def __iter__(self) -> Iterator[Entry]:
        return self.entries()


def read_unsealed(
    path: str | os.PathLike[str],
    *,
    from_lsn: int | None = None,
    end_offset: int | None = None,
) -> Iterator[Entry]:
    """Walk a segment's frames with per-frame crc (the open tail; slow path). With
    `end_offset` (bytes known written), any bad frame before it raises SegmentCorrupted.
    Without it, a bad frame at the end with nothing valid after it is taken as a write in
    progress and ends the walk; a bad frame followed by a valid one raises. Never modifies
    the file. Stops at a seal footer."""
    path = Path(path)
    with open(path, "rb") as file:
        data = file.read() if end_offset is None else file.read(end_offset)
    if end_offset is not None and len(data) < end_offset:
        raise SegmentCorrupted(path, len(data), f"file is shorter than {end_offset} bytes")
    view = memoryview(data)
    try:
        header, header_len = decode_file_header(view[:_MAX_HEADER_BYTES])
    except FormatError as error:
        raise SegmentCorrupted(path, error.offset, error.reason) from None
    walk = _walk_frames(view, header_len, len(view), header.first_lsn)
    if walk.bad_offset is not None and walk.bad_reason != "incomplete seal footer":
        follower = _valid_frame_after(view, walk, len(view))
        if end_offset is not None or follower is not None:
            detail = f"; a valid frame follows at offset {follower}" if follower else ""
            raise SegmentCorrupted(path, walk.bad_offset, walk.bad_reason + detail)
    first_row = 0 if from_lsn is None else max(0, from_lsn - header.first_lsn)
    for offset in walk.offsets[first_row:]:
        fields = ENTRY_HEADER.unpack_from(view, offset)
        try:
            yield entry_from_frame(view, offset, fields)
        except ValueError as error:
            raise SegmentCorrupted(path, offset, f"bad properties ({error})") from None


__all__ = [
    "RecoveredSegment",
    "SealedSegment",
    "SegmentCorrupted",
    "SegmentError",
    "SegmentReader",
    "SegmentStateError",
    "SegmentWriter",
    "TornTail",
    "fsync_directory",
    "list_segment_files",
    "open_segment",
    "read_unsealed",
    "segment_file_name",
]
