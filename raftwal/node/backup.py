"""Backup files of the coordination state: the format `raftwal snapshot save` writes and
`raftwal snapshot restore` reads, and the restore hand-off to a new cluster's nodes.

File layout (version 1):

    b"RAFTWAL-SNAPSHOT 1\\n"
    one JSON line: {"revision", "state_digest" (sha256 hex of the state bytes), "bytes",
                    "saved_at_ms", "source"}
    the state bytes (a serialized CoordinationState, deterministic)

`read_backup` checks all of it (magic, length, digest, decodable state at the stated
revision) and raises `BackupError` saying what is wrong. A restore is handed to a node by
placing the verified file at `<data_dir>/restore.snapshot` before its first start; the
node's coordinator, once it leads a fresh cluster, proposes ``RestoreState`` from it
(`pending_restore`, `finish_restore`).

Segment data is NOT in this file: see docs/operations.md ("Backup and restore").

Must never: write a file that is not 0600 or is visible before it is complete (temp +
fsync + rename), or accept a file whose digest does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from statemachine.state import restore_state

MAGIC = b"RAFTWAL-SNAPSHOT 1\n"
RESTORE_FILE = "restore.snapshot"
#: what a state file may hold at most (the Raft command carrying it is bounded too)
MAX_STATE_BYTES = 1 << 30


class BackupError(ValueError):
    """A backup file that cannot be used; the message says what was got and expected."""


@dataclass(frozen=True)
class Backup:
    revision: int
    state_digest: str
    state: bytes
    saved_at_ms: int
    source: str


def encode_backup(backup: Backup) -> bytes:
    header = {
        "revision": backup.revision,
        "state_digest": backup.state_digest,
        "bytes": len(backup.state),
        "saved_at_ms": backup.saved_at_ms,
        "source": backup.source,
    }
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + backup.state


def decode_backup(data: bytes, source: str = "snapshot file") -> Backup:
    if not data.startswith(MAGIC):
        raise BackupError(f"{source}: not a raftwal snapshot (expected it to start with {MAGIC!r})")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise BackupError(f"{source}: truncated header")
    try:
        header = json.loads(data[len(MAGIC) : end])
        revision, digest, size = (
            int(header["revision"]),
            str(header["state_digest"]),
            int(header["bytes"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise BackupError(f"{source}: unreadable header ({error})") from None
    state = data[end + 1 :]
    if len(state) != size:
        raise BackupError(f"{source}: state is {len(state)} bytes (expected {size}): truncated?")
    actual = hashlib.sha256(state).hexdigest()
    if actual != digest:
        raise BackupError(f"{source}: digest {actual[:16]}... (expected {digest[:16]}...): damaged")
    try:
        decoded = restore_state(state)
    except ValueError as error:
        raise BackupError(f"{source}: {error}") from None
    if decoded.revision != revision:
        raise BackupError(
            f"{source}: state at revision {decoded.revision} (header says {revision})"
        )
    return Backup(
        revision, digest, state, int(header.get("saved_at_ms", 0)), str(header.get("source", ""))
    )


def read_backup(path: Path) -> Backup:
    try:
        size = path.stat().st_size
        if size > MAX_STATE_BYTES + 4096:
            raise BackupError(f"{path}: {size} bytes (expected at most {MAX_STATE_BYTES})")
        data = path.read_bytes()
    except OSError as error:
        raise BackupError(f"{path}: {error.strerror or error}") from None
    return decode_backup(data, str(path))


def write_backup(path: Path, backup: Backup) -> None:
    """Write atomically, 0600: a temp file in the same directory, fsynced, then renamed."""
    data = encode_backup(backup)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def pending_restore(data_dir: Path) -> Backup | None:
    """The restore handed to this node, if any (a damaged one raises BackupError)."""
    path = data_dir / RESTORE_FILE
    if not path.exists():
        return None
    return read_backup(path)


def finish_restore(data_dir: Path, outcome: str) -> Path:
    """Move the hand-off file aside once the restore is decided (`outcome`: done, refused)."""
    path = data_dir / RESTORE_FILE
    target = data_dir / f"{RESTORE_FILE}.{outcome}"
    os.replace(path, target)
    return target
