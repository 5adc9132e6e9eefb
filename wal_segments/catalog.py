"""`catalog.db`: the per-node SQLite catalog of the WAL (sqlite-utils).

What lives here: for every pchannel this node holds a replica of, the **fenced term** (the
highest term it has promised to follow; an append at a lower term is refused), the
segments it holds (LSN, term and time-tick ranges, count, bytes, digest, state: open,
sealed, committed), the replica positions an owner last saw, and the retention floor
(every segment ending below it is deleted, or about to be).

The segment files are the source of truth for what the log contains; the catalog adds
what the files cannot say (the fence, which segments Raft committed) and a queryable index
for operators. `fenced_term` must be durable before a Fence is answered: the database runs
in WAL mode with `synchronous=FULL`, so every commit is fsynced.

What must never happen here: an import of `raft` or `raftwal`; a fenced term or a
retention floor that goes down.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

SEGMENT_STATES = ("open", "sealed", "committed")


@dataclass(frozen=True, slots=True)
class SegmentRow:
    pchannel: str
    first_lsn: int
    last_lsn: int
    first_term: int
    last_term: int
    first_time_tick: int
    last_time_tick: int
    count: int
    bytes: int
    digest: int
    state: str


class Catalog:
    """One node's catalog. Thread-safe (one connection guarded by a lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        connection = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        self._db = sqlite_utils.Database(connection)
        if "pchannels" not in self._db.table_names():
            self._db["pchannels"].create(
                {"name": str, "fenced_term": int, "committed_lsn": int},
                pk="name",
                if_not_exists=True,
            )
        if "segments" not in self._db.table_names():
            self._db["segments"].create(
                {
                    "pchannel": str,
                    "first_lsn": int,
                    "last_lsn": int,
                    "first_term": int,
                    "last_term": int,
                    "first_time_tick": int,
                    "last_time_tick": int,
                    "count": int,
                    "bytes": int,
                    "digest": int,
                    "state": str,
                },
                pk=("pchannel", "first_lsn"),
                if_not_exists=True,
            )
        if "retention" not in self._db.table_names():
            # The retention floor per pchannel, written before any file below it is
            # deleted: a deletion a crash cut short is finished when the log is opened.
            self._db["retention"].create(
                {"pchannel": str, "deleted_before_lsn": int}, pk="pchannel", if_not_exists=True
            )
        if "replica_positions" not in self._db.table_names():
            self._db["replica_positions"].create(
                {"pchannel": str, "node_id": str, "term": int, "durable_lsn": int},
                pk=("pchannel", "node_id"),
                if_not_exists=True,
            )

    def close(self) -> None:
        with self._lock:
            self._db.conn.close()

    # -- fencing ---------------------------------------------------------------------------

    def fenced_term(self, pchannel: str) -> int:
        with self._lock:
            rows = list(
                self._db.query("select fenced_term from pchannels where name = ?", [pchannel])
            )
        return int(rows[0]["fenced_term"]) if rows else 0

    def fenced_terms(self) -> dict[str, int]:
        with self._lock:
            return {
                row["name"]: int(row["fenced_term"])
                for row in self._db.query("select name, fenced_term from pchannels")
            }

    def raise_fenced_term(self, pchannel: str, term: int) -> int:
        """Persist fenced_term = max(current, term) durably; returns the fenced term."""
        with self._lock:
            rows = list(
                self._db.query("select fenced_term from pchannels where name = ?", [pchannel])
            )
            current = int(rows[0]["fenced_term"]) if rows else 0
            if term <= current:
                return current
            self._db["pchannels"].upsert(
                {"name": pchannel, "fenced_term": term}, pk="name", alter=False
            )
            return term

    # -- segments ----------------------------------------------------------------------------

    def upsert_segment(self, row: SegmentRow) -> None:
        if row.state not in SEGMENT_STATES:
            raise ValueError(f"invalid segment state {row.state!r} (expected {SEGMENT_STATES})")
        with self._lock:
            self._db["segments"].upsert(
                {
                    "pchannel": row.pchannel,
                    "first_lsn": row.first_lsn,
                    "last_lsn": row.last_lsn,
                    "first_term": row.first_term,
                    "last_term": row.last_term,
                    "first_time_tick": row.first_time_tick,
                    "last_time_tick": row.last_time_tick,
                    "count": row.count,
                    "bytes": row.bytes,
                    "digest": row.digest,
                    "state": row.state,
                },
                pk=("pchannel", "first_lsn"),
            )

    def mark_committed(self, pchannel: str, first_lsn: int) -> None:
        with self._lock:
            self._db.execute(
                "update segments set state = 'committed' where pchannel = ? and first_lsn = ?",
                [pchannel, first_lsn],
            )

    def delete_segments_from(self, pchannel: str, first_lsn: int) -> None:
        """Forget segments starting at or after `first_lsn` (their files were truncated)."""
        with self._lock:
            self._db.execute(
                "delete from segments where pchannel = ? and first_lsn >= ?", [pchannel, first_lsn]
            )

    def delete_segments_before(self, pchannel: str, lsn: int) -> None:
        """Forget segments that end before `lsn` (retention deleted their files)."""
        with self._lock:
            self._db.execute(
                "delete from segments where pchannel = ? and last_lsn < ?", [pchannel, lsn]
            )

    # -- retention -----------------------------------------------------------------------------

    def retention_floor(self, pchannel: str) -> int:
        """The retention floor recorded for `pchannel` (0: nothing deleted)."""
        with self._lock:
            rows = list(
                self._db.query(
                    "select deleted_before_lsn from retention where pchannel = ?", [pchannel]
                )
            )
        return int(rows[0]["deleted_before_lsn"]) if rows else 0

    def raise_retention_floor(self, pchannel: str, lsn: int) -> int:
        """Persist the floor = max(current, lsn) durably; returns the floor (never lower)."""
        with self._lock:
            rows = list(
                self._db.query(
                    "select deleted_before_lsn from retention where pchannel = ?", [pchannel]
                )
            )
            current = int(rows[0]["deleted_before_lsn"]) if rows else 0
            if lsn <= current:
                return current
            self._db["retention"].upsert(
                {"pchannel": pchannel, "deleted_before_lsn": lsn}, pk="pchannel"
            )
            return lsn

    def segments(self, pchannel: str | None = None) -> list[SegmentRow]:
        sql = "select * from segments"
        params: list[object] = []
        if pchannel is not None:
            sql += " where pchannel = ?"
            params.append(pchannel)
        sql += " order by pchannel, first_lsn"
        with self._lock:
            return [SegmentRow(**row) for row in self._db.query(sql, params)]

    def committed_first_lsns(self, pchannel: str) -> set[int]:
        with self._lock:
            return {
                int(row["first_lsn"])
                for row in self._db.query(
                    "select first_lsn from segments where pchannel = ? and state = 'committed'",
                    [pchannel],
                )
            }

    # -- replica positions -----------------------------------------------------------------

    def record_replica_positions(self, pchannel: str, term: int, positions: dict[str, int]) -> None:
        with self._lock:
            self._db["replica_positions"].upsert_all(
                [
                    {"pchannel": pchannel, "node_id": node, "term": term, "durable_lsn": lsn}
                    for node, lsn in sorted(positions.items())
                ],
                pk=("pchannel", "node_id"),
            )

    def replica_positions(self, pchannel: str) -> dict[str, int]:
        with self._lock:
            return {
                row["node_id"]: int(row["durable_lsn"])
                for row in self._db.query(
                    "select node_id, durable_lsn from replica_positions where pchannel = ?",
                    [pchannel],
                )
            }
