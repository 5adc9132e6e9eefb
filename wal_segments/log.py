"""One pchannel's log on one node: the sequence of segment files and the replica rules.

What lives here: `PChannelLog`, used both by the pchannel's owner (for its own copy) and
by the replicas. It holds:
- the segments `<dir>/<first_lsn>.seg`, contiguous from the first retained LSN; the last
  one is open for appends. **Segment boundaries are a function of the log's content**:
  a segment ends right after an entry flagged SEAL_MARKER, so every replica holding the
  same entries rolls at the same LSN and a committed segment is the same file everywhere.
- the **fenced term**, persisted in `catalog.db` before it is reported: an append whose
  term is below it is refused (FENCED).
- **log matching** (Raft): an append carries the (lsn, term) of the entry before it; the
  log accepts it only when it holds exactly that entry. Entries it already has with the
  same term are skipped (a resend), and a divergent suffix (same LSN, another term) is
  truncated, never an entry that `committed_lsn` covers.
- group-commit fsync per open segment (`fsync_policy.GroupCommit`).
- **background seals**: the append that writes a seal marker hands the segment to a seal
  task and returns; the next append opens the next segment at once. The task makes the
  segment's entries durable, then writes its footer (index, block crcs, digest) and its
  catalog row; only then is it listed in `sealed_segments()`. Durability stays a prefix
  of the log: an append waits for the entries of every segment before its own
  (`AppendResult.after`), and seals finish in LSN order. Recovery finishes a seal a crash
  interrupted, and moves aside segments that follow a gap (a segment whose unsynced tail
  was lost: what came after it was never reported durable).
- local I/O failures: an append whose write fails (ENOSPC) leaves the log as it was and
  raises OSError; after a failed fdatasync or seal the log refuses appends (`failure`)
  until it is closed and opened again, which recovers it from the files (under fsync
  policy ``always`` the open segment is first cut back to its last synced offset).

Mutations run on the event loop that owns the log, one at a time (an asyncio lock, held
only while writing, never while waiting for an fsync); durability is awaited outside it.

What must never happen here: an import of `raft` or `raftwal`; an append below the fenced
term; truncating at or below the committed LSN; an unverified batch written to disk.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rpc.aio import wait_event
from wal_segments import buggify, faults, mutations
from wal_segments.catalog import Catalog, SegmentRow
from wal_segments.format import (
    ENTRY_HEADER,
    ENTRY_HEADER_SIZE,
    BatchMeta,
    Entry,
    EntryFlags,
    FormatError,
    crc32c,
    iter_batch,
    scan_batch,
)
from wal_segments.fsync_policy import FsyncPolicy, GroupCommit
from wal_segments.segment import (
    Fdatasync,
    SealedSegment,
    SegmentCorrupted,
    SegmentStateError,
    SegmentWriter,
    _default_fdatasync,
    fsync_directory,
    list_segment_files,
    make_durable_directory,
    open_segment,
    segment_file_name,
    sync_file,
)

logger = logging.getLogger(__name__)
#: Appended to the name of a segment file found where a new segment must go.
ORPHAN_SUFFIX = ".orphaned"

SEAL_FLAG = int(EntryFlags.SEAL_MARKER)
_FLAGS_WORD = 10  # index of `flags` in ENTRY_HEADER's fields

# Deliberate bugs for the simulation's mutation suite (`wal_segments.mutations`).
ACCEPT_STALE_TERM = mutations.declare(
    "accept-stale-term", "a replica accepts appends from a term older than its fence"
)
SKIP_LOG_MATCHING = mutations.declare(
    "skip-log-matching", "a replica appends without checking the previous (lsn, term)"
)
FENCE_IN_MEMORY = mutations.declare(
    "fence-in-memory", "a replica's fenced term is kept in memory only, not in the catalog"
)
HEARTBEAT_NO_FENCE = mutations.declare(
    "heartbeat-no-fence", "an owner's heartbeat checks log matching without raising the fence"
)
RESEND_DURABLE_TO_END = mutations.declare(
    "resend-durable-to-end", "a resent batch already held is reported durable to the log's end"
)


class LogError(Exception):
    """Base class of this module's errors."""


class Fenced(LogError):
    def __init__(self, term: int, fenced_term: int) -> None:
        super().__init__(f"term {term} is fenced (fenced term {fenced_term})")
        self.term = term
        self.fenced_term = fenced_term


class Mismatch(LogError):
    """Log matching failed: no entry (prev_lsn, prev_term) here. Carries the fast back-up
    hint of Raft: the term found at prev_lsn (or of the last entry) and its first LSN."""

    def __init__(self, prev_lsn: int, prev_term: int, conflict_term: int, conflict_first: int):
        super().__init__(
            f"no entry (lsn {prev_lsn}, term {prev_term}); found term {conflict_term} "
            f"from lsn {conflict_first}"
        )
        self.conflict_term = conflict_term
        self.conflict_first_lsn = conflict_first


class BadBatch(LogError):
    """A batch that fails verification or breaks the log's rules (never written)."""


@dataclass(slots=True)
class _Segment:
    first_lsn: int
    last_lsn: int
    path: Path
    sealed: bool
    header_len: int
    #: absolute frame offsets, loaded lazily for sealed segments
    offsets: array | None = None
    summary: object | None = None
    read_fd: int | None = None
    #: where the frames end, once known without the footer (a segment being sealed)
    data_end: int | None = None

    @property
    def count(self) -> int:
        return self.last_lsn - self.first_lsn + 1


@dataclass(eq=False, slots=True)
class _Seal:
    """A segment being sealed in the background (`PChannelLog._start_seal`)."""

    writer: SegmentWriter
    group: GroupCommit
    segment: _Segment
    #: resolved once the segment's entries (and every earlier segment's) are durable
    durable: asyncio.Future[None] = field(repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    #: the entries' own sync failed (not only the footer)
    data_failed: bool = False


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append wrote: `last_lsn` is the last LSN of the batch (entries skipped as
    resends count as present; the log may hold more after it); `sync_offset` (with
    `writer`) is what to wait durable."""

    last_lsn: int
    writer: SegmentWriter | None
    sync_offset: int
    sealed: bool = False
    #: the log's truncation count when the append was written
    generation: int = 0
    #: durability of the segments before this one still being sealed (None: none were)
    after: asyncio.Future[None] | None = None


@dataclass
class LogPosition:
    last_lsn: int
    last_term: int
    last_time_tick: int


@dataclass
class _Waiter:
    lsn: int
    future: asyncio.Future[None] = field(repr=False)


def _release(segments: list[_Segment]) -> list[Path]:
    """Close the read descriptors of segments leaving the log; returns their paths."""
    for segment in segments:
        if segment.read_fd is not None:
            os.close(segment.read_fd)
            segment.read_fd = None
    return [segment.path for segment in segments]


class PChannelLog:
    """A pchannel's segments in `directory`. Create with `await PChannelLog.open(...)`."""

    def __init__(
        self,
        directory: Path,
        pchannel: str,
        catalog: Catalog,
        policy: FsyncPolicy,
        *,
        fdatasync: Fdatasync = _default_fdatasync,
    ) -> None:
        self.directory = directory
        self.pchannel = pchannel
        self.catalog = catalog
        self.policy = policy
        self._fdatasync = fdatasync
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []
        self._writer: SegmentWriter | None = None
        self._group: GroupCommit | None = None
        self._lock = asyncio.Lock()
        self.fenced_term = 0
        self.last_lsn = 0
        self.last_term = 0
        self.last_time_tick = -1
        #: highest LSN known committed (from the owner); truncation never goes below it
        self.committed_lsn = 0
        #: called with the new last LSN after every append (consumers tail this)
        self._appended = asyncio.Event()
        self.closed = False
        #: truncations so far, and (generation, lsn kept) of the recent ones: an append
        #: whose entries were truncated afterwards must never be reported durable.
        self._generation = 0
        self._truncations: list[tuple[int, int]] = []
        #: seals running in the background, oldest first (a failed one stays until close)
        self._seals: list[_Seal] = []
        self._seal_failure: BaseException | None = None
        #: why a truncation (or a restart at a new first LSN) stopped part-way, after it
        #: began changing the files: the log no longer says what they hold (`_cut_failed`)
        self._cut_failure: BaseException | None = None

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        directory: Path,
        pchannel: str,
        catalog: Catalog,
        policy: FsyncPolicy,
        *,
        fdatasync: Fdatasync = _default_fdatasync,
    ) -> PChannelLog:
        log = cls(directory, pchannel, catalog, policy, fdatasync=fdatasync)
        await asyncio.to_thread(log._recover)
        return log

    def _recover(self) -> None:
        make_durable_directory(self.directory)
        for leftover in self.directory.glob("*.seg.tmp"):
            leftover.unlink()
        self.fenced_term = self.catalog.fenced_term(self.pchannel)
        committed = self.catalog.committed_first_lsns(self.pchannel)
        listed = {row.first_lsn for row in self.catalog.segments(self.pchannel)}
        files = list_segment_files(self.directory)
        floor = self.catalog.retention_floor(self.pchannel)
        if floor:
            files = self._finish_retention(files, floor)
        expected_first: int | None = None
        for index, (first_lsn, path) in enumerate(files):
            last_file = index == len(files) - 1
            # verify_blocks: without it a sealed file's frames are never checked, and a
            # corrupt byte inside one would be served (and replicated) as if it were good.
            recovered = open_segment(
                path, repair=True, verify_blocks=True, fdatasync=self._fdatasync
            )
            if recovered.header.pchannel != self.pchannel:
                raise SegmentCorrupted(
                    path, 0, f"segment of pchannel {recovered.header.pchannel!r} in this directory"
                )
            if expected_first is not None and first_lsn != expected_first:
                raise SegmentCorrupted(
                    path, 0, f"segment starts at lsn {first_lsn}; expected {expected_first}"
                )
            if (
                not recovered.sealed
                and not last_file
                and files[index + 1][0] != (recovered.last_lsn + 1)
            ):
                # The entries at its end were lost (never synced: a power loss, or a sync
                # that failed while it was being sealed in the background), so the files
                # after it no longer follow it. Appends to them waited for this segment's
                # entries: none of theirs was reported durable. They go aside, kept for
                # inspection, and this segment stays open. Only segments of this pchannel
                # after a gap, though: anything else is reported (and nothing is changed).
                self._check_after_gap(files[index + 1 :], recovered.last_lsn)
                for _, later in files[index + 1 :]:
                    self._move_aside(
                        later, f"follows {path.name}, which ends at lsn {recovered.last_lsn}"
                    )
                del files[index + 1 :]
                last_file = True
            if not recovered.sealed and (not last_file or _ends_with_seal_marker(path, recovered)):
                # A crash while sealing (the footer was torn or never written; the next
                # segment may not have been created yet, but an entry flagged SEAL_MARKER
                # ends its segment all the same): finish the seal. Appending after the
                # marker would leave it in the middle of a segment, which every replica
                # refuses.
                writer, _ = SegmentWriter.resume(path, fdatasync=self._fdatasync)
                if writer.entry_count:
                    writer.seal()
                    recovered = open_segment(path, repair=False)
                else:
                    writer.close()
            if recovered.entry_count == 0 and (not last_file or recovered.sealed):
                path.unlink()
                continue
            if recovered.sealed and recovered.summary is not None and first_lsn not in listed:
                # Sealed, but the row never made it (a crash between the footer and the
                # catalog, or a seal finished just above); its footer, and entries a
                # killed writer never synced, may be in the page cache only.
                sync_file(path, self._fdatasync)
                self.catalog.upsert_segment(
                    _segment_row(
                        self.pchannel,
                        SealedSegment(path, self.pchannel, recovered.summary, path.stat().st_size),
                    )
                )
            segment = _Segment(
                first_lsn=first_lsn,
                last_lsn=recovered.last_lsn,
                path=path,
                sealed=recovered.sealed,
                header_len=recovered.header_len,
                offsets=recovered.frame_offsets,
                summary=recovered.summary,
            )
            self._segments.append(segment)
            self._firsts.append(first_lsn)
            expected_first = recovered.last_lsn + 1
            if recovered.truncated is not None:
                logger.warning(
                    "%s: torn tail of %s truncated at offset %d",
                    self.pchannel,
                    path.name,
                    recovered.truncated.offset,
                )
        if self._segments:
            tail = self._segments[-1]
            if not tail.sealed:
                self._writer, _ = SegmentWriter.resume(tail.path, fdatasync=self._fdatasync)
                tail.offsets = None  # the writer holds them
            self.last_lsn = tail.last_lsn
            # The tail may be empty (a crash right after it was created, or a torn tail that
            # held its only entries): the last entry then lives in the previous segment.
            if self.last_lsn >= self.first_lsn:
                header = self._header_at(self.last_lsn)
                self.last_term, self.last_time_tick = header[3], header[4]
        self.committed_lsn = max(
            (s.last_lsn for s in self._segments if s.first_lsn in committed), default=0
        )
        # The files' names too: a segment created just before its writer was killed may
        # have a directory entry only the page cache holds.
        fsync_directory(self.directory)

    def _finish_retention(
        self, files: list[tuple[int, Path]], floor: int
    ) -> list[tuple[int, Path]]:
        """Delete the files that end below the recorded retention floor (a deletion that a
        crash cut short; the next file starts at or below the floor), and forget their rows.
        Returns the files that are left. The last file is always kept."""
        keep = 0
        while keep + 1 < len(files) and files[keep + 1][0] <= floor:
            keep += 1
        doomed, left = files[:keep], files[keep:]
        for _, path in doomed:
            faults.fault("wal.delete", str(path))
            path.unlink(missing_ok=True)
        if doomed:
            fsync_directory(self.directory)
            logger.info(
                "%s: finished an interrupted retention: %d segment files below lsn %d deleted",
                self.pchannel,
                len(doomed),
                floor,
            )
        self.catalog.delete_segments_before(self.pchannel, floor)
        return left

    def _check_after_gap(self, later: list[tuple[int, Path]], last_lsn: int) -> None:
        """Raise SegmentCorrupted naming the first of `later` (the files after a segment
        that ends at `last_lsn`) that is not a segment of this pchannel starting past it."""
        expected = last_lsn + 2
        for first_lsn, path in later:
            found = open_segment(path, repair=False)
            if found.header.pchannel != self.pchannel:
                raise SegmentCorrupted(
                    path, 0, f"segment of pchannel {found.header.pchannel!r} in this directory"
                )
            if first_lsn < expected:
                raise SegmentCorrupted(
                    path, 0, f"segment starts at lsn {first_lsn}; expected {expected} or later"
                )
            expected = found.last_lsn + 1

    @property
    def failure(self) -> BaseException | None:
        """The local I/O error (a failed fdatasync, seal, or cut-back of a failed append, a
        truncation cut short) after which this log takes no more appends: it must be closed
        and opened again, which recovers the files from what is on disk. None while the log
        works."""
        if self._cut_failure is not None:
            return self._cut_failure
        if self._seal_failure is not None:
            return self._seal_failure
        writer, group = self._writer, self._group
        if writer is not None and writer.failure is not None:
            return writer.failure
        if group is not None and group.failure is not None:
            return group.failure
        return None

    def _check_usable(self) -> None:
        if self.closed:
            raise LogError(f"{self.pchannel}: log is closed")
        failure = self.failure
        if failure is not None:
            raise LogError(f"{self.pchannel}: log failed ({failure}); it must be reopened")

    async def close(self) -> None:
        async with self._lock:
            self.closed = True
            await self._wait_seals()
            failure = self.failure
            if self._group is not None:
                with contextlib.suppress(OSError, SegmentStateError):
                    await self._group.close()
                self._group = None
            if self._writer is not None:
                self._writer.close()
                if failure is not None and self.policy.kind == "always":
                    # What the page cache shows past the last successful fdatasync may
                    # never reach the disk (after a failed fsync the kernel may drop the
                    # dirty pages): cut it, so that a reopen never trusts it. Under
                    # "always" nothing this copy acknowledged or reported durable is past
                    # that point; the other policies never promised more than the page
                    # cache, and a reopen trusts it as a process restart would.
                    writer = self._writer
                    logger.warning(
                        "%s: %s failed (%s); cutting it back to its last synced offset %d",
                        self.pchannel,
                        writer.path.name,
                        failure,
                        writer.durable_offset,
                    )
                    with contextlib.suppress(OSError):
                        os.truncate(writer.path, writer.durable_offset)
                self._writer = None
            self._close_failed_seals()
            for segment in self._segments:
                if segment.read_fd is not None:
                    os.close(segment.read_fd)
                    segment.read_fd = None
            self._appended.set()

    def _close_failed_seals(self) -> None:
        """Leave the files of a failed seal as a reopen must find them. A footer that failed
        is cut off (the entries were durable; recovery seals the segment again). Entries
        whose own sync failed are cut back to the last synced offset under ``always``, like
        the open segment's; recovery then moves aside the segments after it (every append
        to them waited for this one, so none of theirs was reported durable)."""
        for seal in self._seals:
            writer = seal.writer
            writer.close()
            keep = seal.segment.data_end or writer.end_offset
            if seal.data_failed and self.policy.kind == "always":
                keep = min(keep, writer.durable_offset)
            logger.warning(
                "%s: sealing %s failed; cutting it back to offset %d",
                self.pchannel,
                writer.path.name,
                keep,
            )
            with contextlib.suppress(OSError):
                if writer.path.stat().st_size > keep:
                    os.truncate(writer.path, keep)
        # The failed seals stay listed: a wait_durable on their entries still fails.

    # -- reading positions -------------------------------------------------------------------

    @property
    def first_lsn(self) -> int:
        return self._segments[0].first_lsn if self._segments else self.last_lsn + 1

    def position(self) -> LogPosition:
        return LogPosition(self.last_lsn, self.last_term, self.last_time_tick)

    def _segment_of(self, lsn: int) -> _Segment:
        if self._cut_failure is not None:
            # The segments and their indexes may disagree with the files (and each other).
            raise LogError(
                f"{self.pchannel}: log failed ({self._cut_failure!r}); it must be reopened"
            )
        index = bisect.bisect_right(self._firsts, lsn) - 1
        if index < 0 or lsn > self._segments[index].last_lsn:
            raise KeyError(f"{self.pchannel}: lsn {lsn} is not in the log")
        return self._segments[index]

    def _offsets(self, segment: _Segment) -> array:
        if segment is self._segments[-1] and self._writer is not None:
            return self._writer._frame_offsets  # noqa: SLF001 - the open segment's index
        if segment.offsets is None:
            segment.offsets = open_segment(segment.path, repair=False).frame_offsets
        return segment.offsets

    def _fd(self, segment: _Segment) -> int:
        if segment.read_fd is None:
            segment.read_fd = os.open(segment.path, os.O_RDONLY)
        return segment.read_fd

    def _header_at(self, lsn: int) -> tuple[int, ...]:
        segment = self._segment_of(lsn)
        offset = self._offsets(segment)[lsn - segment.first_lsn]
        data = os.pread(self._fd(segment), ENTRY_HEADER_SIZE, offset)
        return ENTRY_HEADER.unpack(data)

    def term_at(self, lsn: int) -> int:
        """The term of the entry at `lsn`; 0 for lsn 0 (before the log)."""
        if lsn == 0:
            return 0
        if lsn == self.last_lsn:
            return self.last_term
        return self._header_at(lsn)[3]

    def first_lsn_of_term(self, term: int, upto_lsn: int) -> int:
        """The first LSN <= upto_lsn holding `term` (terms never decrease along a log)."""
        low, high = self.first_lsn, upto_lsn
        while low < high:
            middle = (low + high) // 2
            if self.term_at(middle) < term:
                low = middle + 1
            else:
                high = middle
        return low

    def last_lsn_of_term_at_most(self, term: int) -> int:
        """The last LSN whose term is <= `term` (0 when none)."""
        low, high = self.first_lsn - 1, self.last_lsn
        while low < high:
            middle = (low + high + 1) // 2
            if self.term_at(middle) <= term:
                low = middle
            else:
                high = middle - 1
        return low

    def check_match(self, prev_lsn: int, prev_term: int) -> None:
        """Raise Mismatch (with Raft's fast back-up hint) unless this log holds the entry
        (prev_lsn, prev_term). An entry below the retained log cannot be checked: that is a
        mismatch too (hint: the term of the first retained entry and its LSN), except the
        start of an empty log (lsn 0, or where a restarted log begins), which follows
        anything below it (all of that is below the retention floor)."""
        if prev_lsn < self.first_lsn:
            if prev_lsn == 0 or (prev_lsn == self.last_lsn and self.last_lsn < self.first_lsn):
                return
            first = self.first_lsn
            conflict_term = self.term_at(first) if first <= self.last_lsn else 0
            raise Mismatch(prev_lsn, prev_term, conflict_term, first)
        if prev_lsn > self.last_lsn or self.term_at(prev_lsn) != prev_term:
            probe = min(prev_lsn, self.last_lsn)
            conflict_term = self.term_at(probe) if probe >= self.first_lsn else 0
            conflict_first = (
                self.first_lsn_of_term(conflict_term, probe) if conflict_term else self.first_lsn
            )
            raise Mismatch(prev_lsn, prev_term, conflict_term, conflict_first)

    def _unverifiable_start(
        self, prev_lsn: int, frames: bytes, meta: BatchMeta, from_log_start: bool
    ) -> bool:
        """For an append whose previous entry this log cannot check (below its retained
        start, or `from_log_start`: the sender retains nothing before prev_lsn + 1):
        whether the whole log must go, so that it starts again at prev_lsn + 1.

        Raft's InstallSnapshot rule with Log Matching (one writer per (lsn, term): a
        recovery never runs twice at one term): when this log holds an entry of the batch
        with the same term, it holds the sender's log up to there and keeps everything
        (the rest is checked entry by entry). When it holds a different entry there, none of
        its entries from there on is committed (the sender holds every committed entry it
        retains) and everything before is below the sender's retained start, so below the
        retention floor: the log is dropped. Raises Mismatch when the batch does not reach
        this log's first entry (the sender backs up to it)."""
        first, last = self.first_lsn, self.last_lsn
        if last < first:
            # Empty: it starts where it was restarted; anything else starts it again.
            return prev_lsn != last
        if from_log_start and prev_lsn > last:
            return True  # the log ends before the sender's start: all of it is below
        probe = max(prev_lsn + 1, first)
        if probe > last:
            return True  # holds prev_lsn but nothing after it: nothing to compare with
        if probe > meta.last_lsn:
            raise Mismatch(prev_lsn, 0, self.term_at(first), first)
        theirs = _term_of_frame(frames, meta.frame_offsets[probe - meta.first_lsn])
        if self.term_at(probe) == theirs:
            return False
        if probe <= self.committed_lsn:
            logger.critical(
                "%s: the sender's entry at committed lsn %d has term %d, this log's %d",
                self.pchannel,
                probe,
                theirs,
                self.term_at(probe),
            )
            raise BadBatch(
                f"entry at lsn {probe} differs from the committed one here (term {theirs}; "
                f"expected {self.term_at(probe)}, committed through {self.committed_lsn})"
            )
        return True

    def fetch_from(self, prev_lsn: int, prev_term: int, max_bytes: int) -> tuple[bytes, int, bool]:
        """What a recovering owner fetches after its entry (prev_lsn, prev_term): (frames,
        lsn of the first frame, whether they start this log). Raises Mismatch (with the
        back-up hint) when this log does not hold that entry. When prev_lsn is below this
        log's retained start (prev_lsn + 1 == first_lsn included: the term of the entry
        before the first is not kept), it cannot be checked: the frames then start at this
        log's first entry, and the caller appends them as the start of its log
        (`append(..., from_log_start=True)`), which keeps what it holds only where the
        frames prove it matches."""
        if 0 < prev_lsn < self.first_lsn or (prev_lsn == 0 and self.first_lsn > 1):
            start, from_log_start = self.first_lsn, True
        else:
            self.check_match(prev_lsn, prev_term)
            start, from_log_start = prev_lsn + 1, False
        if start > self.last_lsn:
            return b"", start, from_log_start
        return self.read_frames(start, max_bytes), start, from_log_start

    # -- fencing -----------------------------------------------------------------------------

    async def fence(self, term: int) -> LogPosition:
        """Promise to refuse appends below `term` (durably), then report the log's end once
        every entry up to it is durable. Raises Fenced when `term` is below the fenced
        term already, and LogError or OSError when the entries it would report cannot be
        made durable (a failed fdatasync).

        Only durable entries may be reported: the new owner adopts the longest log of its
        fence quorum and cuts its own log to match it. An end that counted entries still
        in the page cache (a replica's append whose group commit had not synced yet) could
        vanish after the answer, to a failed fdatasync or a power cut, and the new owner,
        copying this log, would then cut committed entries of its own down to what this
        log still holds (RELIABILITY.md, "Found by the closing round": seed 2513)."""
        async with self._lock:
            if term < self.fenced_term:
                raise Fenced(term, self.fenced_term)
            if term > self.fenced_term and mutations.active(FENCE_IN_MEMORY):
                self.fenced_term = term
            if term > self.fenced_term:
                self.fenced_term = await asyncio.to_thread(
                    self.catalog.raise_fenced_term, self.pchannel, term
                )
            position = self.position()
            writer = self._writer
            written = AppendResult(
                position.last_lsn,
                writer,
                writer.end_offset if writer is not None else 0,
                generation=self._generation,
                after=self._after(),
            )
        await self.wait_durable(written)
        return position

    async def _raise_fence(self, term: int) -> None:
        if term > self.fenced_term and mutations.active(FENCE_IN_MEMORY):
            self.fenced_term = term
        if term > self.fenced_term:
            self.fenced_term = await asyncio.to_thread(
                self.catalog.raise_fenced_term, self.pchannel, term
            )

    async def heartbeat(self, term: int, prev_lsn: int, prev_term: int) -> None:
        """An owner's Append without frames: raise the fence to `term`, as any append does,
        then check that this log holds (prev_lsn, prev_term) (Raft: any AppendEntries of a
        newer term makes the follower take that term, matching or not). Raises Fenced or
        Mismatch.

        Raising the fence here too is what makes every answer an owner gets from this log
        hold until its next request: once a newer owner has heard where this log stands,
        no older owner can extend it behind its back (a deposed owner's request held up in
        the network, delivered after the newer owner's fence call was lost). Without it,
        such a request landing between a heartbeat's answer and the next append could
        leave a divergent tail beyond what the newer owner then sends, and only the
        resend and commit rules (`append`, the replica's `min(committed, durable)`) kept
        that tail from being counted (RELIABILITY.md, "Masked mutations")."""
        async with self._lock:
            self._check_usable()
            if term < self.fenced_term:
                raise Fenced(term, self.fenced_term)
            if not mutations.active(HEARTBEAT_NO_FENCE):
                await self._raise_fence(term)
            self.check_match(prev_lsn, prev_term)

    # -- appending ---------------------------------------------------------------------------

    async def append(
        self,
        term: int,
        prev_lsn: int,
        prev_term: int,
        frames: bytes,
        meta: BatchMeta | None = None,
        *,
        batch_crc: int | None = None,
        from_log_start: bool = False,
    ) -> AppendResult:
        """Append encoded frames written at (or copied by an owner at) `term` after the entry
        (prev_lsn, prev_term). Raises Fenced, Mismatch or BadBatch; never writes a batch that
        fails verification. Returns where the log ends and what to wait durable.

        `from_log_start`: prev_lsn + 1 is the first LSN the sender retains (retention deleted
        what is below, so prev_term is unknown). Such a batch, and one whose prev_lsn is
        below this log's own retained start, is checked by its entries instead (see
        `_unverifiable_start`): a log that holds one of them keeps what it has; otherwise it
        drops everything it holds (all of it is below the retention floor, or was never
        committed) and starts at prev_lsn + 1."""
        async with self._lock:
            self._check_usable()
            if term < self.fenced_term and not mutations.active(ACCEPT_STALE_TERM):
                raise Fenced(term, self.fenced_term)
            await self._raise_fence(term)
            if meta is None:
                try:
                    meta = scan_batch(frames, expected_first_lsn=prev_lsn + 1, batch_crc=batch_crc)
                except FormatError as error:
                    raise BadBatch(f"invalid frames: {error}") from None
            if meta.first_lsn != prev_lsn + 1:
                raise BadBatch(f"frames start at lsn {meta.first_lsn}; expected {prev_lsn + 1}")
            if prev_lsn > 0 and (from_log_start or prev_lsn < self.first_lsn):
                # The previous entry cannot be checked here: the batch itself is.
                if self._unverifiable_start(prev_lsn, frames, meta, from_log_start):
                    await self._restart_at_locked(prev_lsn + 1)
                elif prev_lsn < self.first_lsn - 1:
                    # It matches from this log's first entry on; what is below that is
                    # below the retention floor here.
                    skip = self.first_lsn - meta.first_lsn
                    frames = frames[meta.frame_offsets[skip] :]
                    prev_lsn = self.first_lsn - 1
                    meta = scan_batch(
                        frames, expected_first_lsn=prev_lsn + 1, batch_crc=crc32c(frames)
                    )
                prev_term = 0  # verified by the batch (or the log starts here)
            elif not mutations.active(SKIP_LOG_MATCHING) or prev_lsn > self.last_lsn:
                self.check_match(prev_lsn, prev_term)
            if meta.last_term > term:
                raise BadBatch(f"frames of term {meta.last_term} above the sender's term {term}")
            if meta.first_term < prev_term:
                raise BadBatch(f"frames of term {meta.first_term} below prev_term {prev_term}")
            self._check_seal_positions(frames, meta)
            # Skip what is already here with the same term (a resend), truncate a conflict.
            start_row = 0
            while start_row < meta.count and prev_lsn + 1 + start_row <= self.last_lsn:
                lsn = prev_lsn + 1 + start_row
                theirs = _term_of_frame(frames, meta.frame_offsets[start_row])
                if self.term_at(lsn) != theirs:
                    await self._truncate_after_locked(lsn - 1)
                    break
                start_row += 1
            if start_row == meta.count:
                # All of it is here already (a resend). What matches the sender ends with
                # the batch, not with this log's end: entries beyond it may be a divergent
                # suffix the sender never wrote (reporting them as durable let a new owner
                # count this replica for its own entries at those LSNs, and raised this
                # log's committed LSN over entries it then had to truncate). They are
                # durable once the open segment is synced up to where it is written now.
                writer = self._writer
                return AppendResult(
                    self.last_lsn
                    if mutations.active(RESEND_DURABLE_TO_END)
                    else prev_lsn + meta.count,
                    writer,
                    writer.end_offset if writer is not None else 0,
                    generation=self._generation,
                    after=self._after(),
                )
            if start_row:
                offset = meta.frame_offsets[start_row]
                frames = frames[offset:]
                # Already verified above: only the metadata of the remaining suffix.
                meta = scan_batch(
                    frames,
                    expected_first_lsn=prev_lsn + 1 + start_row,
                    batch_crc=crc32c(frames),
                )
            return await self._write_locked(frames, meta)

    async def append_local(self, frames: bytes, meta: BatchMeta, term: int) -> AppendResult:
        """The owner's own append of a batch it encoded at `term` (continues the log)."""
        async with self._lock:
            self._check_usable()
            if term < self.fenced_term:
                raise Fenced(term, self.fenced_term)
            if meta.first_lsn != self.last_lsn + 1:
                raise BadBatch(
                    f"batch starts at lsn {meta.first_lsn}; expected {self.last_lsn + 1}"
                )
            self._check_seal_positions(frames, meta)
            await self._raise_fence(term)
            return await self._write_locked(frames, meta)

    def _check_seal_positions(self, frames: bytes, meta: BatchMeta) -> None:
        # Every seal marker, not only the batch's last one: the segment rolls only after
        # the last entry, so an earlier marker would end up in the middle of a segment.
        if any(row != meta.count - 1 for row in self._seal_positions(frames, meta)):
            raise BadBatch("a seal marker must be the last entry of a batch")

    def _seal_positions(self, frames: bytes, meta: BatchMeta) -> tuple[int, ...] | list[int]:
        """The rows flagged SEAL_MARKER: as `scan_batch` or `encode_rows` recorded them
        while they visited every frame, or (a BatchMeta built without them) from a walk."""
        if meta.seal_rows is not None:
            return meta.seal_rows
        rows = []
        for row, offset in enumerate(meta.frame_offsets):
            flags = ENTRY_HEADER.unpack_from(frames, offset)[_FLAGS_WORD]
            if flags & SEAL_FLAG:
                rows.append(row)
        return rows

    async def _write_locked(self, frames: bytes, meta: BatchMeta) -> AppendResult:
        if meta.first_time_tick <= self.last_time_tick:
            raise BadBatch(
                f"time tick {meta.first_time_tick} not above the log's {self.last_time_tick}"
            )
        writer = self._writer
        if writer is None:
            writer = await asyncio.to_thread(self._create_writer, meta.first_lsn, meta.first_term)
            self._writer = writer
            segment = _Segment(
                first_lsn=meta.first_lsn,
                last_lsn=meta.first_lsn - 1,
                path=writer.path,
                sealed=False,
                header_len=writer.header_len,
            )
            self._segments.append(segment)
            self._firsts.append(meta.first_lsn)
        if self._group is None:
            self._group = GroupCommit(writer, self.policy)
            self._group.start()
        end = writer.append_encoded(frames, meta)
        segment = self._segments[-1]
        segment.last_lsn = meta.last_lsn
        self.last_lsn = meta.last_lsn
        self.last_term = meta.last_term
        self.last_time_tick = meta.last_time_tick
        sealed = False
        if meta.seal_rows is not None:
            seals = bool(meta.seal_rows) and meta.seal_rows[-1] == meta.count - 1
        else:
            last_flags = ENTRY_HEADER.unpack_from(frames, meta.frame_offsets[-1])[_FLAGS_WORD]
            seals = bool(last_flags & SEAL_FLAG)
        if seals:
            self._start_seal()
            sealed = True
        self._notify()
        return AppendResult(
            meta.last_lsn, writer, end, sealed, generation=self._generation, after=self._after()
        )

    def _after(self) -> asyncio.Future[None] | None:
        """What an append made now waits for besides its own segment's sync: the newest
        seal's durability (which includes every earlier seal's), also when it has failed
        already. A seal may fail while an append that passed `_check_usable` awaits its
        write: that append's entries follow entries that are not durable, and must never
        be reported durable (durability is a prefix of the log)."""
        if self._seals:
            durable = self._seals[-1].durable
            if not durable.done() or durable.cancelled() or durable.exception() is not None:
                return durable
        return None

    def _create_writer(self, first_lsn: int, first_term: int) -> SegmentWriter:
        """A new segment at `first_lsn` (in a worker thread). A file already there is not
        part of this log (it ends at first_lsn - 1): a creation whose caller was cancelled
        after the file appeared left it. It is moved aside, kept for inspection, never
        deleted, and never read again (the name no longer ends in the segment suffix)."""
        try:
            return SegmentWriter.create(
                self.directory, self.pchannel, first_lsn, first_term, fdatasync=self._fdatasync
            )
        except FileExistsError:
            self._move_aside(
                Path(self.directory) / segment_file_name(first_lsn),
                "exists but is not part of the log (an interrupted segment creation)",
            )
            return SegmentWriter.create(
                self.directory, self.pchannel, first_lsn, first_term, fdatasync=self._fdatasync
            )

    def _move_aside(self, path: Path, why: str) -> None:
        """Rename a segment file that is not part of the log so it is never read again
        (the name no longer ends in the segment suffix); kept for inspection."""
        aside = path.with_name(path.name + ORPHAN_SUFFIX)
        logger.warning("%s: %s %s; moving it to %s", self.pchannel, path.name, why, aside.name)
        os.replace(path, aside)
        fsync_directory(self.directory)

    def _start_seal(self) -> None:
        """Hand the open segment (its last entry a seal marker) to a background seal; the
        next append opens the next segment. Called with the lock held."""
        writer, group = self._writer, self._group
        # _write_locked opened both before it appended the seal marker.
        assert writer is not None and group is not None
        segment = self._segments[-1]
        # The writer takes no more appends: its index and end are final.
        segment.offsets = writer._frame_offsets  # noqa: SLF001
        segment.data_end = writer.end_offset
        previous = self._seals[-1] if self._seals else None
        seal = _Seal(writer, group, segment, asyncio.get_running_loop().create_future())
        self._seals.append(seal)
        self._writer, self._group = None, None
        seal.task = asyncio.create_task(self._finish_seal(seal, previous))

    async def _finish_seal(self, seal: _Seal, previous: _Seal | None) -> None:
        try:
            if previous is not None and previous.task is not None:
                # Seals finish in LSN order: durability stays a prefix of the log.
                await asyncio.wait({previous.task})
                if self._seal_failure is not None:
                    raise LogError(f"an earlier seal failed: {self._seal_failure!r}")
            await seal.group.close()
        except BaseException as error:
            seal.data_failed = True
            self._seal_failed(seal, error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        seal.durable.set_result(None)
        try:
            await buggify.point("log.seal")
            sealed = await asyncio.to_thread(seal.writer.seal)
            await asyncio.to_thread(
                self.catalog.upsert_segment, _segment_row(self.pchannel, sealed)
            )
        except BaseException as error:
            self._seal_failed(seal, error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        segment = seal.segment
        segment.summary = sealed.summary
        segment.sealed = True
        self._seals.remove(seal)

    def _seal_failed(self, seal: _Seal, error: BaseException) -> None:
        if self._seal_failure is None:
            self._seal_failure = error
            logger.error(
                "%s: sealing %s failed; the log must be reopened: %r",
                self.pchannel,
                seal.writer.path.name,
                error,
            )
        if not seal.durable.done():
            seal.durable.set_exception(
                LogError(
                    f"{self.pchannel}: entries of {seal.writer.path.name} not durable: {error!r}"
                )
            )
            seal.durable.exception()  # retrieved: waiters get it, none is required

    async def _wait_seals(self) -> None:
        """Until every seal started so far has finished (or failed)."""
        tasks = {
            seal.task for seal in self._seals if seal.task is not None and not seal.task.done()
        }
        if tasks:
            await asyncio.wait(tasks)

    async def wait_sealed(self) -> None:
        """Until every segment whose seal marker is written is sealed: footer durable and
        listed in the catalog and `sealed_segments()`. Raises LogError when a seal failed."""
        await self._wait_seals()
        if self._seal_failure is not None:
            raise LogError(f"{self.pchannel}: a seal failed ({self._seal_failure!r})")

    async def wait_durable(self, result: AppendResult) -> None:
        """Return once `result`'s entries are durable (per the fsync policy). Raises
        LogError when any of them was truncated meanwhile (even if other entries took
        their LSNs since), or the sync failed."""
        if result.after is not None:
            await asyncio.shield(result.after)
        seal = next((s for s in self._seals if s.writer is result.writer), None)
        if seal is not None:
            # Its segment is being sealed: the seal syncs it (after the earlier ones).
            await asyncio.shield(seal.durable)
        elif result.writer is not None and result.writer is self._writer and not result.sealed:
            group = self._group
            if group is not None:
                await group.sync_through(result.sync_offset)
        # Otherwise its segment was sealed since (durable) or closed by a truncation or a
        # close (checked below; a close stops the log).
        if self._truncated_since(result.generation, result.last_lsn):
            raise LogError(f"{self.pchannel}: entries up to {result.last_lsn} were truncated")

    # -- truncation --------------------------------------------------------------------------

    async def truncate_after(self, lsn: int) -> None:
        async with self._lock:
            await self._truncate_after_locked(lsn)

    def _truncated_since(self, generation: int, last_lsn: int) -> bool:
        if generation == self._generation:
            return False
        if self._truncations and self._truncations[0][0] > generation + 1:
            return True  # older than the record kept: assume the worst
        return any(g > generation and kept < last_lsn for g, kept in self._truncations)

    async def _truncate_after_locked(self, lsn: int) -> None:
        if lsn >= self.last_lsn:
            return
        # Seals in progress first: below, every segment but the last is sealed.
        await self._wait_seals()
        if self._seal_failure is not None:
            raise LogError(f"{self.pchannel}: a seal failed ({self._seal_failure!r}); reopen")
        self._generation += 1
        self._truncations.append((self._generation, lsn))
        del self._truncations[:-64]
        if lsn < self.committed_lsn:
            logger.critical(
                "%s: refusing to truncate after lsn %d below the committed lsn %d",
                self.pchannel,
                lsn,
                self.committed_lsn,
            )
            raise BadBatch(
                f"truncation after lsn {lsn} would drop committed entries (committed "
                f"{self.committed_lsn})"
            )
        logger.warning("%s: truncating divergent suffix after lsn %d", self.pchannel, lsn)
        await buggify.point("log.truncate")
        try:
            await self._cut_after_locked(lsn)
        except BaseException as error:
            self._cut_failed("truncation", error)
            raise

    def _cut_failed(self, what: str, error: BaseException) -> None:
        """A truncation or restart failed (an fdatasync, the catalog) or was cancelled (its
        caller's stream went away) after it began changing the files: the segments, their
        indexes and `last_lsn` may no longer say what the files hold. Stop the log as after
        a failed fdatasync: it refuses appends and reads (`failure`) until it is closed and
        opened again from its files (``DataPlane.log`` does that)."""
        if self._cut_failure is None:
            self._cut_failure = error
        logger.error(
            "%s: %s stopped part-way (%r); the log refuses appends and reads until it is "
            "reopened from its files",
            self.pchannel,
            what,
            error,
        )

    async def _cut_after_locked(self, lsn: int) -> None:
        """The part of `_truncate_after_locked` that changes the files."""
        await self._close_writer_locked()
        while self._segments and self._segments[-1].first_lsn > lsn:
            segment = self._segments.pop()
            self._firsts.pop()
            if segment.read_fd is not None:
                os.close(segment.read_fd)
            segment.path.unlink()
        forget_from = lsn + 1
        if self._segments and self._segments[-1].sealed and self._segments[-1].last_lsn > lsn:
            # The sealed segment holding lsn + 1 is unsealed and truncated below: its row
            # (sealed, with the old range and digest) goes too.
            forget_from = self._segments[-1].first_lsn
        await asyncio.to_thread(self.catalog.delete_segments_from, self.pchannel, forget_from)
        fsync_directory(self.directory)
        if self._segments:
            tail = self._segments[-1]
            if tail.read_fd is not None:
                os.close(tail.read_fd)
                tail.read_fd = None
            if tail.sealed and tail.last_lsn > lsn:
                writer, _ = SegmentWriter.resume(tail.path, unseal=True, fdatasync=self._fdatasync)
                tail.sealed = False
            elif not tail.sealed:
                writer, _ = SegmentWriter.resume(tail.path, fdatasync=self._fdatasync)
            else:
                writer = None
            if writer is not None:
                try:
                    writer.truncate_after(lsn)
                except BaseException:
                    with contextlib.suppress(OSError):
                        writer.close()
                    raise
                self._writer = writer
                tail.offsets = None
                tail.summary = None
            tail.last_lsn = min(tail.last_lsn, lsn)
        self.last_lsn = lsn
        if lsn >= self.first_lsn and self._segments:
            header = self._header_at(lsn)
            self.last_term, self.last_time_tick = header[3], header[4]
        else:
            # Nothing left: as a reopen finds it. The entries cut were never committed,
            # so their time ticks bound nothing; keeping the last one refused the best
            # log's entries when they carried lower ticks (a deposed owner writes late).
            self.last_term, self.last_time_tick = 0, -1
        self._notify()

    async def _close_writer_locked(self) -> None:
        if self._group is not None:
            await self._group.close()
            self._group = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _restart_at_locked(self, first_lsn: int) -> None:
        """Drop every segment and start the log empty at `first_lsn` (a replica catching up
        from an owner whose retained log starts there). The floor is recorded first, so a
        crash part-way leaves files the next open deletes, or a log the owner resets again."""
        await self._wait_seals()
        if self._seal_failure is not None:
            raise LogError(f"{self.pchannel}: a seal failed ({self._seal_failure!r}); reopen")
        logger.warning(
            "%s: dropping lsn %d..%d to start at lsn %d (the owner's first retained entry)",
            self.pchannel,
            self.first_lsn,
            self.last_lsn,
            first_lsn,
        )
        self._generation += 1
        self._truncations.append((self._generation, 0))
        del self._truncations[:-64]
        try:
            await self._drop_all_locked(first_lsn)
        except BaseException as error:
            self._cut_failed(f"restart at lsn {first_lsn}", error)
            raise

    async def _drop_all_locked(self, first_lsn: int) -> None:
        """The part of `_restart_at_locked` that changes the files."""
        await self._close_writer_locked()
        segments, self._segments, self._firsts = self._segments, [], []
        paths = _release(segments)

        def drop_all() -> None:
            self.catalog.raise_retention_floor(self.pchannel, first_lsn)
            for path in paths:
                path.unlink(missing_ok=True)
            fsync_directory(self.directory)
            self.catalog.delete_segments_from(self.pchannel, 0)

        await asyncio.to_thread(drop_all)
        self.last_lsn = first_lsn - 1
        self.last_term = 0
        self.last_time_tick = -1
        self.committed_lsn = first_lsn - 1
        self._notify()

    # -- retention -----------------------------------------------------------------------------

    async def delete_before(self, lsn: int) -> int:
        """Retention: delete the sealed, committed segments that end below `lsn` (files and
        catalog rows); returns how many. Never the last segment nor one still being sealed
        (the caller's floor comes from Raft: every entry below it was committed). The floor is recorded in the catalog first, so a crash part-way
        leaves files that the next open deletes (idempotent: a repeat deletes nothing)."""
        async with self._lock:
            if self.closed:
                return 0
            doomed: list[_Segment] = []
            for segment in self._segments[:-1]:
                if segment.last_lsn >= lsn or not segment.sealed or segment.summary is None:
                    break
                doomed.append(segment)
            if not doomed:
                # Files an earlier deletion failed to unlink (no longer in the log).
                first = self.first_lsn if self._segments else 0
                if first:
                    await asyncio.to_thread(self._sweep_below, first)
                return 0
            floor = doomed[-1].last_lsn + 1
            await asyncio.to_thread(self.catalog.raise_retention_floor, self.pchannel, floor)
            # Readers run on this loop: once the segments leave the lists, nobody opens them.
            del self._segments[: len(doomed)]
            del self._firsts[: len(doomed)]
            paths = _release(doomed)

        def unlink_all() -> None:
            for path in paths:
                faults.fault("wal.delete", str(path))
                path.unlink(missing_ok=True)
            fsync_directory(self.directory)
            self.catalog.delete_segments_before(self.pchannel, floor)

        # Outside the lock: appends go on while the files go (nobody reads them any more).
        await asyncio.to_thread(unlink_all)
        logger.info(
            "%s: retention deleted %d segments below lsn %d", self.pchannel, len(doomed), floor
        )
        return len(doomed)

    def _sweep_below(self, first_lsn: int) -> None:
        """Unlink segment files that start below the log's first segment (left behind by a
        deletion whose unlink failed)."""
        left = [path for first, path in list_segment_files(self.directory) if first < first_lsn]
        for path in left:
            faults.fault("wal.delete", str(path))
            path.unlink(missing_ok=True)
        if left:
            fsync_directory(self.directory)
            self.catalog.delete_segments_before(self.pchannel, first_lsn)
            logger.info(
                "%s: %d leftover segment files below lsn %d deleted",
                self.pchannel,
                len(left),
                first_lsn,
            )

    def retained_below(self, lsn: int) -> int:
        """How many segments still held here end below `lsn` (the last one excepted)."""
        return sum(1 for segment in self._segments[:-1] if segment.last_lsn < lsn)

    def disk_bytes(self) -> int:
        """Bytes of this log's segment files (sealed sizes from their summaries, the open
        one from its writer)."""
        total = 0
        for segment in self._segments:
            if segment is self._segments[-1] and self._writer is not None:
                total += self._writer.end_offset
            else:
                with contextlib.suppress(OSError):
                    total += segment.path.stat().st_size
        return total

    # -- reading -----------------------------------------------------------------------------

    def read_frames(self, from_lsn: int, max_bytes: int, to_lsn: int | None = None) -> bytes:
        return self.read_frames_range(from_lsn, max_bytes, to_lsn)[0]

    def read_frames_range(
        self, from_lsn: int, max_bytes: int, to_lsn: int | None = None
    ) -> tuple[bytes, int]:
        """(frames, last lsn in them): raw frames from `from_lsn` on, within one segment, at most `max_bytes` (but at
        least one frame), up to `to_lsn` (default: the log's end). Empty when from_lsn is
        past the end."""
        last = self.last_lsn if to_lsn is None else min(to_lsn, self.last_lsn)
        if from_lsn > last:
            return b"", from_lsn - 1
        segment = self._segment_of(from_lsn)
        offsets = self._offsets(segment)
        row = from_lsn - segment.first_lsn
        last_row = min(last, segment.last_lsn) - segment.first_lsn
        start = offsets[row]
        limit = start + max_bytes

        def end_of(r: int) -> int:
            return offsets[r + 1] if r + 1 < len(offsets) else self._segment_end(segment)

        # offsets[j] (j in row+1..last_row) is where row j-1 ends: the rows that fit.
        fitting = bisect.bisect_right(offsets, limit, row + 1, last_row + 1)
        stop = fitting - 2
        if fitting == last_row + 1 and end_of(last_row) <= limit:
            stop = last_row
        stop = max(stop, row)
        end = end_of(stop)
        return os.pread(self._fd(segment), end - start, start), segment.first_lsn + stop

    def bytes_between(self, from_lsn: int, to_lsn: int) -> int:
        """Bytes of the frames of entries `from_lsn`..`to_lsn` (clamped to the log), from
        the segments' offset indexes: nothing is read but an index not loaded yet."""
        first, last = max(from_lsn, self.first_lsn), min(to_lsn, self.last_lsn)
        total = 0
        while first <= last:
            segment = self._segment_of(first)
            offsets = self._offsets(segment)
            stop = min(last, segment.last_lsn)
            end_row = stop - segment.first_lsn
            end = offsets[end_row + 1] if end_row + 1 < len(offsets) else self._segment_end(segment)
            total += end - offsets[first - segment.first_lsn]
            first = stop + 1
        return total

    def _segment_end(self, segment: _Segment) -> int:
        if segment is self._segments[-1] and self._writer is not None:
            return self._writer.end_offset
        summary = segment.summary
        if summary is None and segment.data_end is not None:
            return segment.data_end
        if summary is None:
            segment.summary = open_segment(segment.path, repair=False).summary
            summary = segment.summary
        return summary.data_end  # type: ignore[attr-defined]

    def entries(self, from_lsn: int, max_bytes: int, to_lsn: int | None = None) -> list[Entry]:
        data = self.read_frames(from_lsn, max_bytes, to_lsn)
        if not data:
            return []
        return list(iter_batch(data))

    def iter_entries(
        self, from_lsn: int, to_lsn: int, chunk_bytes: int = 1 << 20
    ) -> Iterator[Entry]:
        lsn = from_lsn
        while lsn <= to_lsn:
            chunk = self.entries(lsn, chunk_bytes, to_lsn)
            if not chunk:
                return
            yield from chunk
            lsn = chunk[-1].lsn + 1

    def sealed_segments(self) -> list[_Segment]:
        return [s for s in self._segments if s.sealed]

    def segment_path(self, first_lsn: int) -> Path | None:
        index = bisect.bisect_left(self._firsts, first_lsn)
        if index < len(self._firsts) and self._firsts[index] == first_lsn:
            return self._segments[index].path
        return None

    def segment_range(self, lsn: int) -> tuple[int, int]:
        """(first, last) LSN of the segment holding `lsn` (the open one's last so far);
        KeyError when no segment holds it."""
        segment = self._segment_of(lsn)
        return segment.first_lsn, segment.last_lsn

    def open_segment_first_lsn(self) -> int | None:
        """The first LSN of the segment open for appends (None: the next append opens one;
        a segment being sealed is not open)."""
        if self._writer is not None and self._segments:
            return self._segments[-1].first_lsn
        return None

    def open_segment_bytes(self) -> int:
        return self._writer.end_offset if self._writer is not None else 0

    # -- tailing -----------------------------------------------------------------------------

    def _notify(self) -> None:
        event, self._appended = self._appended, asyncio.Event()
        event.set()

    async def wait_appended(self, timeout_s: float) -> None:
        """Return after the next append or commit advance (or `timeout_s`)."""
        await wait_event(self._appended, timeout_s)

    def advance_committed(self, lsn: int) -> None:
        """Raise the committed LSN learned from the owner (never lowers it) and wake the
        readers tailing this log (a replica serving committed entries)."""
        if lsn > self.committed_lsn:
            self.committed_lsn = lsn
            self._notify()


def _segment_row(pchannel: str, sealed: SealedSegment) -> SegmentRow:
    summary = sealed.summary
    return SegmentRow(
        pchannel=pchannel,
        first_lsn=summary.first_lsn,
        last_lsn=summary.last_lsn,
        first_term=summary.first_term,
        last_term=summary.last_term,
        first_time_tick=summary.first_time_tick,
        last_time_tick=summary.last_time_tick,
        count=summary.entry_count,
        bytes=sealed.size_bytes,
        digest=summary.digest,
        state="sealed",
    )


def _ends_with_seal_marker(path: Path, recovered: object) -> bool:
    """Whether a recovered segment's last entry is a seal marker."""
    offsets = recovered.frame_offsets  # type: ignore[attr-defined]
    if not recovered.entry_count or offsets is None or not len(offsets):  # type: ignore[attr-defined]
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        header = os.pread(fd, ENTRY_HEADER_SIZE, offsets[-1])
    finally:
        os.close(fd)
    return len(header) == ENTRY_HEADER_SIZE and bool(
        ENTRY_HEADER.unpack(header)[_FLAGS_WORD] & SEAL_FLAG
    )


def _term_of_frame(frames: bytes | memoryview, offset: int) -> int:
    return ENTRY_HEADER.unpack_from(frames, offset)[3]
