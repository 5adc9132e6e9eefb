"""Durable Raft journal: the log file and the term/vote/commit metadata, fsynced.

Lives here: `DurableJournal`, a drop-in for pysyncobj's `Journal` interface (pysyncobj
0.3.17 `journal.py`) that pysyncobj's `SyncObj` uses as its `__raftLog`, plus the small
file helpers (`fsync_directory`, `write_file_atomically`) the snapshot code shares.

Why not pysyncobj's `FileJournal`: it writes records through an mmap that is never msynced
while running, rewrites the whole file in place on compaction (a crash mid-rewrite leaves a
prefix), has no checksums (a torn tail parses as garbage), and renames its metadata file
without fsync. Here:

- the log is an append-only file of CRC-framed records; `add()` only buffers, and `sync()`
  writes every buffered record with one `pwrite` and one `fdatasync` (group commit). The
  caller decides when to sync (see `raft/DURABILITY.md`): a follower before it acknowledges
  an AppendEntries batch, the leader before it counts itself toward the commit index;
- `synced_index` is the observable durable point: every entry at or below it is on disk;
- a torn tail (short or CRC-failing record) found on open is cut off: it was never synced,
  so it was never acknowledged;
- pysyncobj's AppendEntries handler deletes every entry after `prevLogIdx` whenever there
  are any (syncobj.py line 1004) and re-adds the batch, which happens on every overlapping
  resend. pysyncobj's view of the log shrinks at once (its follower commit index relies on
  it), but the file keeps the removed entries as a tail: re-added identical entries cost no
  write, and only the first *different* entry truncates the file (an `ftruncate` made
  durable by the next `sync()`). That is also where a conflict with an already-applied
  entry is detected (`before_truncate`), instead of at every resend;
- compaction (after a snapshot) and `clear()` (after a snapshot install) write a new file
  under a temporary name, fsync it, rename it over the old one and fsync the directory, so
  a crash leaves either the old or the new journal, never a mix;
- the group-commit write and fdatasync pass the fault points ``raft.journal.write`` and
  ``raft.journal.fsync`` (`_faults.py`; no-ops unless a test enabled fault injection), so
  a test can make them fail like a full or broken disk;
- a write that meets a full disk (ENOSPC) releases Raft's disk reserve (`raft/reserve.py`)
  and is tried once more: nothing was synced over, so nothing is retried over lost pages.
  The metadata and the compacted journal do the same;
- after a failed sync the file is cut back to its last synced size before the peer stops:
  the kernel may have dropped the unsynced pages while still serving them from its cache,
  and a restarted peer must not read, and acknowledge, records that never reached the disk
  (the WAL's segments are cut back the same way, `wal_segments/log.py`);
- the journal's own directory entry is made durable on open (an fsync of the parent
  directory): the directory is often created just before (`mkdir` without a parent
  fsync), and a power cut that drops it would take a durable log and vote with it;
- term, vote and commit index live in `journal.meta`, replaced atomically with fsync of the
  file and of the directory. A crash between the rename and the directory fsync leaves the
  previous metadata (or none, at first) and a `.tmp` file: the change never left the node,
  so recovery takes what it finds. Term and vote are stored synchronously (Raft requires them
  durable before a vote or vote request leaves the node); the commit index is stored at
  most once per second, and only after the log it covers has been synced.

Must never: acknowledge anything itself (it only reports what is durable), call into
pysyncobj, retry a failed fsync (after a failed fsync the page cache state is unknown:
the journal is marked broken and every later sync raises), or be used from more than one
thread (pysyncobj's tick thread owns it; status readers only read plain ints).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from pysyncobj.journal import Journal

from raft._faults import crash_point, io_fault
from raft.errors import FatalPeerError, JournalCorrupted
from raft.reserve import DiskReserve

logger = logging.getLogger(__name__)

JOURNAL_FILE_NAME = "journal.log"
META_FILE_NAME = "journal.meta"

# File header: magic, format version, reserved.
_MAGIC = b"RWJRNL\x00\x01"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII")
# Record: payload length, crc32(payload); payload = raft index, raft term, command bytes.
_RECORD_HEAD = struct.Struct("<II")
_ENTRY_HEAD = struct.Struct("<QQ")
_META_FORMAT_VERSION = 1

Entry = tuple[bytes, int, int]  # (command, raft index, raft term), pysyncobj's shape


def fsync_directory(directory: Path) -> None:
    """Make renames and creations inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes, *, durable: bool) -> None:
    """Replace `path` with `data`: write a temp file, fsync it, rename, fsync the directory.

    A crash at any point leaves either the old content or the new one.
    """
    tmp_path = path.with_name(path.name + ".tmp")
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, data, 0)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp_path, path)
    if durable:
        fsync_directory(path.parent)


#: Upper bounds (seconds) of the buckets `SyncTimes` counts the journal's fdatasyncs in
#: (etcd's etcd_disk_wal_fsync_duration_seconds: an SSD under 10 ms, its alert at 0.5 s).
SYNC_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.008,
    0.016,
    0.032,
    0.064,
    0.128,
    0.256,
    0.512,
    1.024,
    2.048,
    4.096,
    8.192,
)


class SyncTimes:
    """How long the journal's group-commit fdatasyncs took: counts per bucket
    (`SYNC_BUCKETS_S`, not cumulative; the last one past every bound), their sum and
    number. Written by the thread that syncs; read at a scrape through `snapshot`, which
    copies (a sync landing during the copy shows at the next scrape)."""

    def __init__(self) -> None:
        self._counts = [0] * (len(SYNC_BUCKETS_S) + 1)
        self._sum_s = 0.0

    def observe(self, seconds: float) -> None:
        index = 0
        while index < len(SYNC_BUCKETS_S) and seconds > SYNC_BUCKETS_S[index]:
            index += 1
        self._counts[index] += 1
        self._sum_s += seconds

    def snapshot(self) -> tuple[list[int], float]:
        """(count per bucket, the last past every bound; sum of seconds)."""
        return list(self._counts), self._sum_s


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(f"pwrite wrote {written} bytes")
        offset += written
        view = view[written:]


def encode_record(command: bytes, index: int, term: int) -> bytes:
    payload = _ENTRY_HEAD.pack(index, term) + command
    return _RECORD_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _file_header() -> bytes:
    return _HEADER.pack(_MAGIC, _FORMAT_VERSION, 0)


class DurableJournal(Journal):
    """pysyncobj `Journal` with explicit, group-committed durability (see module doc).

    Callbacks (all called on the thread that calls into the journal):
    - `on_synced(index)`: after a sync made every entry up to `index` durable;
    - `before_truncate(first_removed_index)`: before a conflicting suffix is dropped; may
      raise to refuse (the journal is left unchanged);
    - `on_commit_index(index)`: when pysyncobj raises the commit index it records here.
    """

    def __init__(
        self,
        directory: Path,
        *,
        durable: bool = True,
        on_synced: Callable[[int], None] | None = None,
        before_truncate: Callable[[int], None] | None = None,
        on_commit_index: Callable[[int], None] | None = None,
        reserve: DiskReserve | None = None,
    ) -> None:
        self._directory = directory
        self._reserve = reserve
        self._path = directory / JOURNAL_FILE_NAME
        self._meta_path = directory / META_FILE_NAME
        self._durable = durable
        self._on_synced = on_synced
        self._before_truncate = before_truncate
        self._on_commit_index = on_commit_index

        # pysyncobj's view of the log.
        self._entries: list[Entry] = []
        # Entries pysyncobj removed tentatively (deleteEntriesFrom) that are still in the
        # file or in _pending, right after _entries. The physical log is _entries + _tail.
        self._tail: list[Entry] = []
        # File offset of each physical entry already written (a prefix of the physical
        # log); the rest are encoded in _pending and reach the file at the next sync().
        self._offsets: list[int] = []
        self._pending: list[bytes] = []
        # How many physical entries (a prefix) are known durable.
        self._durable_count = 0
        self._file_size = 0
        # The file's size at its last successful sync: what a failed sync cuts back to.
        self._synced_size = 0
        self._rewrite_needed = False
        self._unsynced_truncate = False
        self._broken: BaseException | None = None
        self._closed = False

        self.sync_count = 0
        #: the durations of this journal's fdatasyncs (durable journals only)
        self.sync_times = SyncTimes()
        self._reported_commit_index = 0

        self._meta: dict[str, object] = self._load_meta()
        self._meta_dirty = False
        self._fd = self._open_and_scan()

    # ---------------------------------------------------------------- opening

    def _open_and_scan(self) -> int:
        if not self._path.exists():
            write_file_atomically(self._path, _file_header(), durable=self._durable)
        if self._durable:
            # The directory's own entry in its parent: everything below is durable only
            # once that is (see the module doc).
            fsync_directory(self._directory.parent)
        data = self._path.read_bytes()
        if len(data) < _HEADER.size:
            raise JournalCorrupted(
                f"{self._path}: header is {len(data)} bytes (expected {_HEADER.size}); "
                "the file is created atomically, so this is corruption"
            )
        magic, version, _reserved = _HEADER.unpack_from(data, 0)
        if magic != _MAGIC or version != _FORMAT_VERSION:
            raise JournalCorrupted(
                f"{self._path}: bad header (magic {magic!r}, version {version}; "
                f"expected {_MAGIC!r}, version {_FORMAT_VERSION})"
            )
        offset = _HEADER.size
        end = len(data)
        while offset < end:
            if end - offset < _RECORD_HEAD.size:
                break
            length, crc = _RECORD_HEAD.unpack_from(data, offset)
            start = offset + _RECORD_HEAD.size
            if length < _ENTRY_HEAD.size or start + length > end:
                break
            payload = data[start : start + length]
            if zlib.crc32(payload) != crc:
                break
            index, term = _ENTRY_HEAD.unpack_from(payload, 0)
            if self._entries:
                _previous_command, previous_index, previous_term = self._entries[-1]
                if index != previous_index + 1 or term < previous_term:
                    raise JournalCorrupted(
                        f"{self._path}: record at offset {offset} has index {index} term "
                        f"{term} after index {previous_index} term {previous_term} "
                        "(expected contiguous indexes and non-decreasing terms)"
                    )
            self._entries.append((payload[_ENTRY_HEAD.size :], index, term))
            self._offsets.append(offset)
            offset = start + length
        fd = os.open(self._path, os.O_RDWR)
        if offset < end:
            # Everything past the last whole record was never synced, so never acknowledged:
            # a crash tore it. Cut it off durably before anything is appended after it.
            logger.warning(
                "%s: dropping a torn tail of %d bytes after %d good records",
                self._path,
                end - offset,
                len(self._entries),
            )
            os.ftruncate(fd, offset)
        if self._durable:
            # What this file and the metadata next to it hold may be in the page cache
            # only: a peer killed between a write and its fdatasync (or a meta rename and
            # its directory fsync) reads them back after a restart. They are taken as
            # durable below (acknowledged to a leader, a vote kept), so make them so.
            os.fsync(fd)
            fsync_directory(self._directory)
        self._file_size = offset
        self._synced_size = offset
        self._durable_count = len(self._entries)
        return fd

    def _load_meta(self) -> dict[str, object]:
        if not self._meta_path.exists():
            return {}
        raw = self._meta_path.read_bytes()
        try:
            document = json.loads(raw)
            body = document["body"]
            crc = document["crc32"]
        except (ValueError, KeyError, TypeError) as exc:
            raise JournalCorrupted(f"{self._meta_path}: unreadable metadata ({exc})") from exc
        canonical = json.dumps(body, sort_keys=True).encode()
        if zlib.crc32(canonical) != crc or body.get("format") != _META_FORMAT_VERSION:
            raise JournalCorrupted(
                f"{self._meta_path}: metadata fails its checksum or has format "
                f"{body.get('format')!r} (expected {_META_FORMAT_VERSION})"
            )
        return dict(body)

    # ------------------------------------------------------ durability points

    @property
    def synced_index(self) -> int:
        """Every entry of the log at or below this index is durable (0: none)."""
        entries = self._entries
        count = min(len(entries), self._durable_count)
        try:
            return entries[count - 1][1] if count > 0 else 0
        except IndexError:  # read from a status thread while the tick thread mutates
            return 0

    def has_unsynced(self) -> bool:
        """True when some change of the log is not on disk yet."""
        return bool(self._pending) or self._unsynced_truncate or self._rewrite_needed

    def sync(self) -> None:
        """Make every entry durable: one write and one fdatasync for everything buffered."""
        if self._broken is not None:
            raise FatalPeerError(f"journal is broken after an earlier failure: {self._broken}")
        if self._closed or not self.has_unsynced():
            return
        try:
            if self._rewrite_needed:
                self._with_reserve(self._rewrite)
            else:
                if self._pending:
                    data = b"".join(self._pending)
                    start = self._file_size

                    def write() -> None:
                        io_fault("raft.journal.write", str(self._path))
                        _write_all(self._fd, data, start)

                    self._with_reserve(write)
                    offset = start
                    for record in self._pending:
                        self._offsets.append(offset)
                        offset += len(record)
                    self._file_size = offset
                    self._pending.clear()
                if self._durable:
                    io_fault("raft.journal.fsync", str(self._path))
                    began = time.monotonic()
                    os.fdatasync(self._fd)
                    self.sync_times.observe(time.monotonic() - began)
                self._unsynced_truncate = False
        except OSError as exc:
            # Never retry a failed fsync: the kernel may have dropped the dirty pages and a
            # second fsync would report success for data that is gone.
            self._broken = exc
            self._cut_back()
            logger.critical("journal sync failed; this peer must stop: %s", exc)
            raise FatalPeerError(f"journal sync failed: {exc}") from exc
        self._synced_size = self._file_size
        self._durable_count = len(self._entries) + len(self._tail)
        self.sync_count += 1
        if self._durable and self._on_synced is not None:
            self._on_synced(self.synced_index)

    def _with_reserve(self, write: Callable[[], None]) -> None:
        """Run `write`; when the disk is full, release Raft's reserve and run it once more
        (a write that failed with ENOSPC synced nothing, so this retries no fsync)."""
        try:
            write()
        except OSError as error:
            if self._reserve is None or not self._reserve.release_for(error):
                raise
            logger.warning("%s: retrying a write after releasing the disk reserve", self._path)
            write()

    def _cut_back(self) -> None:
        """After a failed sync: drop whatever the file holds past its last synced size, so
        that nothing whose sync failed can be read back (by a restarted peer) as if it were
        durable. Best effort: the peer stops either way."""
        try:
            size = os.fstat(self._fd).st_size
            if size > self._synced_size:
                logger.warning(
                    "%s: cutting back %d unsynced bytes after the failed sync (to %d)",
                    self._path,
                    size - self._synced_size,
                    self._synced_size,
                )
                os.ftruncate(self._fd, self._synced_size)
        except OSError as error:
            logger.error("%s: cannot cut back after the failed sync: %s", self._path, error)

    def _rewrite(self) -> None:
        """Write pysyncobj's log as a new file and swap it in atomically."""
        tmp_path = self._path.with_name(self._path.name + ".tmp")
        header = _file_header()
        records = [encode_record(command, index, term) for command, index, term in self._entries]
        offsets: list[int] = []
        offset = len(header)
        for record in records:
            offsets.append(offset)
            offset += len(record)
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, header + b"".join(records), 0)
            if self._durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        crash_point("journal_compaction_tmp_written")
        os.replace(tmp_path, self._path)
        crash_point("journal_compaction_renamed")
        if self._durable:
            fsync_directory(self._directory)
        old_fd = self._fd
        self._fd = os.open(self._path, os.O_RDWR)
        os.close(old_fd)
        self._tail = []
        self._offsets = offsets
        self._file_size = offset
        self._synced_size = offset
        self._pending.clear()
        self._rewrite_needed = False
        self._unsynced_truncate = False

    # ------------------------------------------------- pysyncobj Journal API

    def add(self, command: bytes | str, idx: int, term: int) -> None:
        if isinstance(command, str):
            command = command.encode("utf-8")
        entry = (command, idx, term)
        if self._tail:
            if self._tail[0] == entry:
                # A resend of an entry we hold: nothing to write.
                self._entries.append(self._tail.pop(0))
                return
            # A real conflict (Raft: same index, different entry): drop the rest for good.
            if self._before_truncate is not None:
                self._before_truncate(self._tail[0][1])
            self._drop_tail()
        if self._entries:
            _last_command, last_index, last_term = self._entries[-1]
            assert idx == last_index + 1 and term >= last_term, (
                f"journal append out of order: index {idx} term {term} after index "
                f"{last_index} term {last_term}"
            )
        self._entries.append(entry)
        if not self._rewrite_needed:
            self._pending.append(encode_record(command, idx, term))

    def clear(self) -> None:
        # pysyncobj clears only to install a snapshot and re-adds the snapshot's last two
        # entries right away; the file is replaced atomically at the next sync().
        self._entries = []
        self._tail = []
        self._offsets = []
        self._pending = []
        self._durable_count = 0
        self._rewrite_needed = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's API)
        # pysyncobj's view shrinks now (its follower commit index, min(leader commit, last
        # index), relies on that), but the entries stay in the file as _tail until add()
        # either re-adds them unchanged or contradicts them.
        if entryFrom >= len(self._entries):
            return
        self._tail = self._entries[entryFrom:] + self._tail
        del self._entries[entryFrom:]

    def _drop_tail(self) -> None:
        position = len(self._entries)
        self._tail = []
        if self._rewrite_needed:
            return
        written = len(self._offsets)
        if position < written:
            new_size = self._offsets[position]
            os.ftruncate(self._fd, new_size)
            self._file_size = new_size
            # Anything written after this point is new: a failed sync cuts back to here.
            self._synced_size = min(self._synced_size, new_size)
            del self._offsets[position:]
            self._pending.clear()
            # The truncation is durable only after the next fdatasync; an acknowledgement
            # that depends on it waits for that sync.
            self._unsynced_truncate = True
        else:
            del self._pending[position - written :]
        self._durable_count = min(self._durable_count, position)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 (pysyncobj's API)
        # pysyncobj calls this once the snapshot covering these entries has been renamed
        # into place (syncobj.py __tryLogCompaction). That rename must be durable before
        # the journal forgets the entries, or a crash could leave neither.
        crash_point("snapshot_renamed")
        if self._durable:
            fsync_directory(self._directory)
        self.compact_to(entryTo)

    def compact_to(self, position: int) -> None:
        """Drop the first `position` entries, durably and atomically."""
        self._entries = self._entries[position:]
        self._tail = []
        self._rewrite_needed = True
        self.sync()

    def __getitem__(self, item):  # type: ignore[no-untyped-def]
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self.close()

    def flush(self) -> None:
        self.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        if self._meta.get("commit_index") != raftCommitIndex:
            self._meta["commit_index"] = raftCommitIndex
            self._meta_dirty = True
        if raftCommitIndex > self._reported_commit_index:
            self._reported_commit_index = raftCommitIndex
            if self._on_commit_index is not None:
                self._on_commit_index(raftCommitIndex)

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        value = self._meta.get("commit_index", 1)
        assert isinstance(value, int)
        return value

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # noqa: N802, N803
        self._meta["current_term"] = term
        self._meta["voted_for"] = votedForNodeId
        # Raft: currentTerm and votedFor must be durable before the vote request or vote
        # that reflects them is sent; pysyncobj sends right after this call returns.
        self.store_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802
        value = self._meta.get("current_term", 0)
        assert isinstance(value, int)
        return value

    def getVotedForNodeId(self) -> str | None:  # noqa: N802
        value = self._meta.get("voted_for")
        assert value is None or isinstance(value, str)
        return value

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_dirty:
            self.store_meta()

    # ------------------------------------------------------------- metadata

    def store_meta(self) -> None:
        """Persist term, vote and commit index (after the log the commit index covers)."""
        if self._broken is not None or self._closed:
            return
        # A persisted commit index must never exceed the durable log: pysyncobj applies up
        # to it on restart before it hears from any leader.
        self.sync()
        body = dict(self._meta)
        body["format"] = _META_FORMAT_VERSION
        canonical = json.dumps(body, sort_keys=True).encode()
        document = json.dumps({"body": body, "crc32": zlib.crc32(canonical)}).encode()
        try:
            self._with_reserve(
                lambda: write_file_atomically(self._meta_path, document, durable=self._durable)
            )
        except OSError as exc:
            self._broken = exc
            logger.critical("journal metadata write failed; this peer must stop: %s", exc)
            raise FatalPeerError(f"journal metadata write failed: {exc}") from exc
        self._meta_dirty = False

    # ------------------------------------------------------------ utilities

    @property
    def durable(self) -> bool:
        return self._durable

    @property
    def first_index(self) -> int:
        entries = self._entries
        try:
            return entries[0][1]
        except IndexError:
            return 0

    @property
    def last_index(self) -> int:
        entries = self._entries
        try:
            return entries[-1][1]
        except IndexError:
            return 0

    def position_of(self, entry: Entry) -> int | None:
        """Position of exactly this entry (same index, term and bytes), or None."""
        first = self.first_index
        position = entry[1] - first
        if not self._entries or position < 0 or position >= len(self._entries):
            return None
        return position if self._entries[position] == entry else None

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._broken is None:
                self.store_meta()
        finally:
            self._closed = True
            os.close(self._fd)
