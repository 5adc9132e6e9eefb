"""``ShardStore``: the SQLite store of one consumer shard (Gazette's SQLStore, on
sqlite-utils).

What lives here: one SQLite file per shard holding the application's tables and the
shard's checkpoint (the source position consumed, the fencing token it was consumed under,
and the recovery-log LSN of the last transaction). A store transaction records the write
statements the application runs through ``store.db`` (a ``sqlite_utils.Database`` whose
tracer feeds the recording) or ``store.execute``/``store.executemany``, so the same
transaction can be appended to the shard's recovery log and replayed on another host
(``apply_record``). The application's writes and the checkpoint commit in ONE SQLite
transaction, so a restart resumes exactly after the last committed message.

Rules the application keeps: write only through ``store.db``, ``store.execute`` or
``store.executemany`` (a write on ``store.conn`` directly is not recorded and would be
lost on a rebuild), and use deterministic SQL (no ``random()``, no ``datetime('now')``):
the recovery log replays the statements, not the rows.

This module does no network I/O and never commits a transaction the caller has not asked
it to commit.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sqlite3
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

log = logging.getLogger(__name__)

#: the table holding the shard's checkpoint (one row)
CHECKPOINT_TABLE = "_raftwal_shard_checkpoint"
#: record format version in the recovery log
RECORD_VERSION = 1
# Statements that never change the database: not recorded.
_READ_KEYWORDS = frozenset({"SELECT", "PRAGMA", "EXPLAIN", "VALUES"})
_TXN_KEYWORDS = frozenset({"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"})


class StoreError(Exception):
    """The store file or a recovery record is not what this module wrote."""


@dataclass(frozen=True)
class Checkpoint:
    """Where the shard stands: every source entry with lsn <= `source_lsn` took effect,
    under fencing token `token`; `rlog_lsn` is the recovery-log LSN of the last record
    applied (0: none)."""

    source_lsn: int = 0
    source_time_tick: int = 0
    token: int = 0
    member_id: str = ""
    rlog_lsn: int = 0


@dataclass(frozen=True)
class Record:
    """One recovery-log record: a store transaction (``kind == "txn"``) or the fence a new
    owner writes when it takes the shard (``kind == "fence"``)."""

    kind: str
    token: int
    member_id: str
    source_lsn: int = 0
    source_time_tick: int = 0
    ops: tuple[Any, ...] = ()


def _encode_value(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": base64.b64encode(bytes(value)).decode("ascii")}
    if value is None or isinstance(value, (int, float, str)):
        return value
    raise StoreError(f"unsupported SQL parameter type ({type(value).__name__})")


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["b"])
    return value


def _encode_params(params: Any) -> Any:
    if params is None:
        return None
    if isinstance(params, dict):
        return {"n": {k: _encode_value(v) for k, v in params.items()}}
    return [_encode_value(v) for v in params]


def _decode_params(params: Any) -> Any:
    if params is None:
        return ()
    if isinstance(params, dict):
        return {k: _decode_value(v) for k, v in params["n"].items()}
    return [_decode_value(v) for v in params]


def encode_record(record: Record) -> bytes:
    body = {
        "v": RECORD_VERSION,
        "kind": record.kind,
        "token": record.token,
        "member": record.member_id,
        "lsn": record.source_lsn,
        "tick": record.source_time_tick,
        "ops": list(record.ops),
    }
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 1)


def decode_record(payload: bytes) -> Record:
    """The record in `payload` (StoreError when it is not one this module wrote)."""
    try:
        body = json.loads(zlib.decompress(payload))
    except (zlib.error, ValueError) as error:
        raise StoreError(f"not a recovery record ({error})") from error
    if not isinstance(body, dict) or body.get("v") != RECORD_VERSION:
        raise StoreError(f"unknown recovery record version (expected {RECORD_VERSION})")
    if body.get("kind") not in ("txn", "fence"):
        raise StoreError(f"unknown recovery record kind ({body.get('kind')!r})")
    return Record(
        kind=body["kind"],
        token=int(body["token"]),
        member_id=str(body["member"]),
        source_lsn=int(body["lsn"]),
        source_time_tick=int(body["tick"]),
        ops=tuple(body["ops"]),
    )


def _first_keyword(sql: str) -> str:
    stripped = sql.lstrip().lstrip("(").lstrip()
    return stripped.split(None, 1)[0].upper() if stripped else ""


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


class ShardStore:
    """The SQLite file of one shard (see the module docstring).

    ``begin()`` opens a store transaction; the application writes through ``db``,
    ``execute`` or ``executemany``; ``prepare(checkpoint)`` writes the checkpoint into the
    same transaction and returns the recovery record; ``commit(rlog_lsn)`` commits both
    (after the record was appended to the recovery log), ``rollback()`` drops both.
    """

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL"):
            raise ValueError(f"invalid synchronous ({synchronous!r}; expected OFF, NORMAL, FULL)")
        self.path = Path(path)
        _private_dir(self.path.parent)
        existed = self.path.exists()
        self.conn = sqlite3.connect(str(self.path), check_same_thread=False)
        if not existed:
            os.chmod(self.path, 0o600)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self._recording: list[Any] | None = None
        self._recorded_bytes = 0
        #: the application's handle: every write it makes here is recorded
        self.db = sqlite_utils.Database(self.conn, tracer=self._trace)
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {CHECKPOINT_TABLE} (id INTEGER PRIMARY KEY CHECK (id = 1),"
            " source_lsn INTEGER NOT NULL, source_time_tick INTEGER NOT NULL,"
            " token INTEGER NOT NULL, member_id TEXT NOT NULL, rlog_lsn INTEGER NOT NULL)"
        )
        self.conn.commit()

    # -- reading -------------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        row = self.conn.execute(
            f"SELECT source_lsn, source_time_tick, token, member_id, rlog_lsn FROM "
            f"{CHECKPOINT_TABLE} WHERE id = 1"
        ).fetchone()
        return Checkpoint(*row) if row else Checkpoint()

    @property
    def in_transaction(self) -> bool:
        return self._recording is not None

    @property
    def recorded_bytes(self) -> int:
        """An estimate of the recovery record of the open transaction."""
        return self._recorded_bytes

    # -- the transaction -------------------------------------------------------------------

    def _trace(self, sql: str, params: Any) -> None:
        if self._recording is None:
            return
        keyword = _first_keyword(sql)
        if keyword in _READ_KEYWORDS or keyword in _TXN_KEYWORDS:
            return
        self._recording.append([sql, _encode_params(params)])
        self._recorded_bytes += len(sql) + 16 * (len(params) if params else 0)

    def begin(self) -> None:
        if self._recording is not None:
            raise StoreError("a store transaction is already open")
        if self.conn.in_transaction:
            # Something wrote through conn outside a store transaction: refuse to mix it in.
            raise StoreError("the connection has an open transaction outside the store")
        self.conn.execute("BEGIN IMMEDIATE")
        self._recording = []
        self._recorded_bytes = 0

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Run one statement in the open transaction (recorded when it writes)."""
        self._require_txn()
        return self.db.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run `sql` once per row in the open transaction, recorded as one operation."""
        recording = self._require_txn()
        rows = list(rows)
        self.conn.executemany(sql, rows)
        if _first_keyword(sql) not in _READ_KEYWORDS:
            recording.append([sql, [_encode_params(r) for r in rows], 1])
            self._recorded_bytes += len(sql) + sum(16 * len(r) for r in rows)

    def _require_txn(self) -> list[Any]:
        if self._recording is None:
            raise StoreError("no store transaction is open (call begin() first)")
        return self._recording

    def prepare(self, checkpoint: Checkpoint) -> Record:
        """Write `checkpoint` into the open transaction and return its recovery record
        (the application's recorded writes plus the checkpoint)."""
        recording = self._require_txn()
        self._write_checkpoint(checkpoint)
        return Record(
            kind="txn",
            token=checkpoint.token,
            member_id=checkpoint.member_id,
            source_lsn=checkpoint.source_lsn,
            source_time_tick=checkpoint.source_time_tick,
            ops=tuple(recording),
        )

    def commit(self, rlog_lsn: int) -> None:
        """Commit the open transaction; the checkpoint's recovery-log LSN is `rlog_lsn`."""
        self._require_txn()
        self.conn.execute(f"UPDATE {CHECKPOINT_TABLE} SET rlog_lsn = ? WHERE id = 1", (rlog_lsn,))
        self.conn.execute("COMMIT")
        self._recording = None

    def rollback(self) -> None:
        """Drop the open transaction (a no-op without one)."""
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        self._recording = None

    def _write_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.conn.execute(
            f"INSERT INTO {CHECKPOINT_TABLE} (id, source_lsn, source_time_tick, token, member_id,"
            " rlog_lsn) VALUES (1, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET"
            " source_lsn = excluded.source_lsn, source_time_tick = excluded.source_time_tick,"
            " token = excluded.token, member_id = excluded.member_id,"
            " rlog_lsn = excluded.rlog_lsn",
            (
                checkpoint.source_lsn,
                checkpoint.source_time_tick,
                checkpoint.token,
                checkpoint.member_id,
                checkpoint.rlog_lsn,
            ),
        )

    # -- replay ----------------------------------------------------------------------------

    def apply_record(self, record: Record, rlog_lsn: int) -> None:
        """Replay one recovery-log record at `rlog_lsn` in its own transaction: its
        statements, then its checkpoint (a fence moves only the token and the log LSN)."""
        if self._recording is not None:
            raise StoreError("cannot replay inside an open store transaction")
        current = self.checkpoint()
        if rlog_lsn <= current.rlog_lsn:
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            for op in record.ops:
                if len(op) == 3:
                    self.conn.executemany(op[0], [_decode_params(p) for p in op[1]])
                else:
                    self.conn.execute(op[0], _decode_params(op[1]))
            if record.kind == "txn":
                moved = Checkpoint(
                    record.source_lsn,
                    record.source_time_tick,
                    record.token,
                    record.member_id,
                    rlog_lsn,
                )
            else:
                moved = Checkpoint(
                    current.source_lsn,
                    current.source_time_tick,
                    record.token,
                    record.member_id,
                    rlog_lsn,
                )
            self._write_checkpoint(moved)
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def skip_to(self, rlog_lsn: int) -> None:
        """Move the checkpoint's recovery-log LSN over entries that are not records
        (term starts, seal markers), so replay need not read them again."""
        current = self.checkpoint()
        if rlog_lsn <= current.rlog_lsn:
            return
        with self.conn:
            self._write_checkpoint(
                Checkpoint(
                    current.source_lsn,
                    current.source_time_tick,
                    current.token,
                    current.member_id,
                    rlog_lsn,
                )
            )

    def close(self) -> None:
        self.rollback()
        self.conn.close()
