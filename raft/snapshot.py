"""Snapshot file codec: our own versioned framing around the application's state bytes.

Lives here: `encode_snapshot` / `decode_snapshot` and the file helpers the peer plugs into
pysyncobj's custom `serializer` / `deserializer` hooks (pysyncobj 0.3.17 `serializer.py`:
`serializer(tmp_file_name, data)` with `data = (last_entry, prev_entry, cluster)`, and
`deserializer(file_name) -> (last_entry, prev_entry, cluster)`), and
`align_journal_with_snapshot`, which repairs the one crash window pysyncobj itself gets wrong.

File layout (little endian), version 1:

    magic "RWSNAP\\0\\1" | format version u32 | raft index u64 | raft term u64
    | last entry (index u64, term u64, length u32, bytes)
    | previous entry (index u64, term u64, length u32, bytes)
    | cluster member count u32, each (length u16, utf-8 address)
    | application state length u64, bytes | crc32 of everything before u32

The two entries are the raw pysyncobj log entries at the snapshot point: pysyncobj keeps them
as the head of the compacted journal and compares them on load. The application state is
exactly what `take_snapshot()` returned: nothing here is pickled.

Must never: pickle anything, interpret the application bytes, or return a snapshot whose
checksum fails.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from raft._faults import crash_point
from raft.errors import SnapshotCorrupted
from raft.journal import DurableJournal, Entry, fsync_directory

logger = logging.getLogger(__name__)

SNAPSHOT_FILE_NAME = "snapshot.bin"

_MAGIC = b"RWSNAP\x00\x01"
_FORMAT_VERSION = 1
_HEAD = struct.Struct("<8sIQQ")
_ENTRY_HEAD = struct.Struct("<QQI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Snapshot:
    """A decoded snapshot file; `raft_index` is the last log index the state reflects."""

    raft_index: int
    raft_term: int
    last_entry: Entry
    prev_entry: Entry
    cluster: tuple[str, ...]
    app_state: bytes


def encode_snapshot(
    last_entry: Entry, prev_entry: Entry, cluster: tuple[str, ...], app_state: bytes
) -> bytes:
    if not isinstance(app_state, bytes):
        raise TypeError(f"take_snapshot() returned {type(app_state).__name__} (expected bytes)")
    parts = [_HEAD.pack(_MAGIC, _FORMAT_VERSION, last_entry[1], last_entry[2])]
    for command, index, term in (last_entry, prev_entry):
        parts.append(_ENTRY_HEAD.pack(index, term, len(command)))
        parts.append(bytes(command))
    parts.append(_U32.pack(len(cluster)))
    for address in cluster:
        encoded = address.encode("utf-8")
        parts.append(_U16.pack(len(encoded)))
        parts.append(encoded)
    parts.append(_U64.pack(len(app_state)))
    parts.append(app_state)
    body = b"".join(parts)
    return body + _U32.pack(zlib.crc32(body))


def decode_snapshot(data: bytes, source: str = "snapshot") -> Snapshot:
    if len(data) < _HEAD.size + _U32.size:
        raise SnapshotCorrupted(f"{source}: {len(data)} bytes is too short for a snapshot")
    body, (crc,) = data[: -_U32.size], _U32.unpack_from(data, len(data) - _U32.size)
    if zlib.crc32(body) != crc:
        raise SnapshotCorrupted(f"{source}: checksum mismatch")
    magic, version, raft_index, raft_term = _HEAD.unpack_from(body, 0)
    if magic != _MAGIC or version != _FORMAT_VERSION:
        raise SnapshotCorrupted(
            f"{source}: magic {magic!r} version {version} "
            f"(expected {_MAGIC!r} version {_FORMAT_VERSION})"
        )
    offset = _HEAD.size
    try:
        entries: list[Entry] = []
        for _ in range(2):
            index, term, length = _ENTRY_HEAD.unpack_from(body, offset)
            offset += _ENTRY_HEAD.size
            command = body[offset : offset + length]
            if len(command) != length:
                raise SnapshotCorrupted(f"{source}: truncated log entry")
            offset += length
            entries.append((command, index, term))
        (count,) = _U32.unpack_from(body, offset)
        offset += _U32.size
        cluster: list[str] = []
        for _ in range(count):
            (length,) = _U16.unpack_from(body, offset)
            offset += _U16.size
            cluster.append(body[offset : offset + length].decode("utf-8"))
            offset += length
        (app_length,) = _U64.unpack_from(body, offset)
        offset += _U64.size
        app_state = body[offset : offset + app_length]
        offset += app_length
    except (struct.error, UnicodeDecodeError) as exc:
        raise SnapshotCorrupted(f"{source}: malformed ({exc})") from exc
    if len(app_state) != app_length or offset != len(body):
        raise SnapshotCorrupted(
            f"{source}: application state is {len(app_state)} bytes with {len(body) - offset} "
            f"trailing (expected {app_length} and 0)"
        )
    last_entry, prev_entry = entries
    if last_entry[1] != raft_index or last_entry[2] != raft_term or prev_entry[1] != raft_index - 1:
        raise SnapshotCorrupted(
            f"{source}: header says index {raft_index} term {raft_term} but entries are "
            f"{last_entry[1]}/{last_entry[2]} and {prev_entry[1]}/{prev_entry[2]}"
        )
    return Snapshot(raft_index, raft_term, last_entry, prev_entry, tuple(cluster), app_state)


def read_snapshot_file(path: Path, *, durable: bool) -> Snapshot | None:
    """Read and verify the snapshot at `path` (None when there is none).

    With `durable`, the file and its directory are fsynced first: pysyncobj's snapshot
    install path (`Serializer.setTransmissionData`) writes and renames the received file
    without any fsync, and this is where the peer first touches it.
    """
    if not path.exists():
        return None
    if durable:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(path.parent)
    return decode_snapshot(path.read_bytes(), str(path))


def write_snapshot_tmp(tmp_path: Path, blob: bytes, *, durable: bool) -> None:
    """Write the temp file pysyncobj renames over the snapshot right after we return.

    The directory fsync that makes that rename durable happens in
    `DurableJournal.deleteEntriesTo`, before the journal drops the covered entries.
    """
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(blob)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    crash_point("snapshot_tmp_written")


def align_journal_with_snapshot(journal: DurableJournal, snapshot: Snapshot) -> None:
    """Make the journal start at the snapshot when it still holds the covered entries.

    pysyncobj's `__loadDumpFile` keeps the journal only if its first two entries equal the
    snapshot's (previous, last) entries, and otherwise clears it down to those two. After a
    crash between the snapshot rename and the journal compaction, the journal still starts
    at the old snapshot and also holds entries *after* the new one, which may have been
    acknowledged; clearing would lose them. Compacting here first keeps them.
    """
    if journal.position_of(snapshot.last_entry) is None:
        # The journal ends before the snapshot or disagrees with it (a snapshot installed
        # from the leader): pysyncobj's clear is right.
        return
    position = journal.position_of(snapshot.prev_entry)
    if position is None or position == 0:
        return
    logger.warning(
        "journal starts at index %d but the snapshot covers up to %d: compacting the "
        "journal before start (a crash interrupted the previous compaction)",
        journal.first_index,
        snapshot.raft_index,
    )
    journal.compact_to(position)


def remove_stale_temp_files(directory: Path) -> None:
    """Delete temp files a crash left behind; they were never renamed into place."""
    for name in (
        SNAPSHOT_FILE_NAME + ".tmp",
        SNAPSHOT_FILE_NAME + ".1.tmp",
        "journal.log.tmp",
        "journal.meta.tmp",
    ):
        path = directory / name
        if path.exists():
            logger.info("removing stale temp file %s", path)
            path.unlink()
