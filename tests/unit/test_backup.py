"""The backup file format (`raftwal.node.backup`): a saved state round-trips, is written
0600 and atomically, and every kind of damage is refused with a message saying what."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from helpers import VCHANNELS, Harness

from raftwal.node.backup import (
    MAGIC,
    RESTORE_FILE,
    Backup,
    BackupError,
    decode_backup,
    encode_backup,
    finish_restore,
    pending_restore,
    read_backup,
    write_backup,
)
from statemachine.state import snapshot_state


def _backup() -> Backup:
    harness = Harness()
    harness.ok(*VCHANNELS)
    state = snapshot_state(harness.state)
    return Backup(harness.state.revision, hashlib.sha256(state).hexdigest(), state, 1, "n1")


def test_round_trip_and_file_mode(tmp_path: Path) -> None:
    backup = _backup()
    path = tmp_path / "b.snap"
    write_backup(path, backup)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_backup(path) == backup
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        pytest.param(lambda data: b"X" + data[1:], "not a raftwal snapshot", id="magic"),
        pytest.param(lambda data: data[:-3], "truncated", id="truncated"),
        pytest.param(lambda data: data[:-1] + bytes([data[-1] ^ 1]), "damaged", id="bit-flip"),
        pytest.param(lambda data: MAGIC + b"{not json\n", "unreadable header", id="header"),
        pytest.param(
            lambda data: data.replace(b'"revision": ', b'"revision": 9'),
            "header says",
            id="revision",
        ),
    ],
)
def test_damage_is_refused(damage, expected: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BackupError, match=expected):
        decode_backup(damage(encode_backup(_backup())))


def test_restore_hand_off(tmp_path: Path) -> None:
    assert pending_restore(tmp_path) is None
    backup = _backup()
    write_backup(tmp_path / RESTORE_FILE, backup)
    assert pending_restore(tmp_path) == backup
    moved = finish_restore(tmp_path, "done")
    assert moved.name == f"{RESTORE_FILE}.done" and pending_restore(tmp_path) is None
