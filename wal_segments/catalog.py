"""`catalog.db`: the per-node SQLite catalog of the WAL (plain `sqlite3`: it is on the
write path, and each statement is one prepared, cached SQL string).

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

from wal_segments import mutations

# Deliberate bugs for the simulation's mutation suite (`wal_segments.mutations`).
CATALOG_NO_SYNC = mutations.declare(
    "catalog-no-sync", "the catalog commits without syncing (a power cut loses its last commits)"
)

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


#: The schema (as sqlite-utils created it before: a catalog.db written by an older version
#: opens unchanged). One script, run once per open.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS "pchannels" (
   "name" TEXT PRIMARY KEY,
   "fenced_term" INTEGER,
   "committed_lsn" INTEGER
);
CREATE TABLE IF NOT EXISTS "segments" (
   "pchannel" TEXT,
   "first_lsn" INTEGER,
   "last_lsn" INTEGER,
   "first_term" INTEGER,
   "last_term" INTEGER,
   "first_time_tick" INTEGER,
   "last_time_tick" INTEGER,
   "count" INTEGER,
   "bytes" INTEGER,
   "digest" INTEGER,
   "state" TEXT,
   PRIMARY KEY ("pchannel", "first_lsn")
);
CREATE TABLE IF NOT EXISTS "retention" (
   "pchannel" TEXT PRIMARY KEY,
   "deleted_before_lsn" INTEGER
);
CREATE TABLE IF NOT EXISTS "replica_positions" (
   "pchannel" TEXT,
   "node_id" TEXT,
   "term" INTEGER,
   "durable_lsn" INTEGER,
   PRIMARY KEY ("pchannel", "node_id")
);
"""

_SEGMENT_COLUMNS = (
    "pchannel",
    "first_lsn",
    "last_lsn",
    "first_term",
    "last_term",
    "first_time_tick",
    "last_time_tick",
    "count",
    "bytes",
    "digest",
    "state",
)

# Upserts change only the columns they name (an existing row keeps the others).
_UPSERT_SEGMENT = (
    f"INSERT INTO segments ({', '.join(f'[{c}]' for c in _SEGMENT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _SEGMENT_COLUMNS)}) "
    "ON CONFLICT (pchannel, first_lsn) DO UPDATE SET "
    + ", ".join(f"[{c}] = excluded.[{c}]" for c in _SEGMENT_COLUMNS[2:])
)
_UPSERT_FENCED_TERM = (
    "INSERT INTO pchannels (name, fenced_term) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET fenced_term = excluded.fenced_term"
)
_UPSERT_RETENTION = (
    "INSERT INTO retention (pchannel, deleted_before_lsn) VALUES (?, ?) "
    "ON CONFLICT (pchannel) DO UPDATE SET deleted_before_lsn = excluded.deleted_before_lsn"
)
_UPSERT_REPLICA_POSITION = (
    "INSERT INTO replica_positions (pchannel, node_id, term, durable_lsn) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (pchannel, node_id) DO UPDATE SET term = excluded.term, "
    "durable_lsn = excluded.durable_lsn"
)


#: How long a statement waits for another process's write transaction on the catalog.
BUSY_TIMEOUT_MS = 30_000


class Catalog:
    """One node's catalog. Thread-safe (one connection guarded by a lock). Each statement
    outside an explicit transaction commits on its own (autocommit)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        connection = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        # A node's data workers share the catalog (each writes the rows of its own
        # pchannels): a writer waits for another's transaction rather than fail at once.
        connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(
            "PRAGMA synchronous=" + ("OFF" if mutations.active(CATALOG_NO_SYNC) else "FULL")
        )
        connection.executescript(_SCHEMA)
        self._conn = connection

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _one(self, sql: str, params: tuple[object, ...]) -> int:
        """The integer in the first column of the first row (0 when there is no row)."""
        row = self._conn.execute(sql, params).fetchone()
        return int(row[0]) if row else 0

    # -- fencing ---------------------------------------------------------------------------

    def fenced_term(self, pchannel: str) -> int:
        with self._lock:
            return self._one("select fenced_term from pchannels where name = ?", (pchannel,))

    def fenced_terms(self) -> dict[str, int]:
        with self._lock:
            return {
                name: int(term)
                for name, term in self._conn.execute("select name, fenced_term from pchannels")
            }

    def raise_fenced_term(self, pchannel: str, term: int) -> int:
        """Persist fenced_term = max(current, term) durably; returns the fenced term."""
        with self._lock:
            current = self._one("select fenced_term from pchannels where name = ?", (pchannel,))
            if term <= current:
                return current
            self._conn.execute(_UPSERT_FENCED_TERM, (pchannel, term))
            return term

    # -- segments ----------------------------------------------------------------------------

    def upsert_segment(self, row: SegmentRow) -> None:
        if row.state not in SEGMENT_STATES:
            raise ValueError(f"invalid segment state {row.state!r} (expected {SEGMENT_STATES})")
        with self._lock:
            self._conn.execute(
                _UPSERT_SEGMENT,
                (
                    row.pchannel,
                    row.first_lsn,
                    row.last_lsn,
                    row.first_term,
                    row.last_term,
                    row.first_time_tick,
                    row.last_time_tick,
                    row.count,
                    row.bytes,
                    row.digest,
                    row.state,
                ),
            )

    def mark_committed(self, pchannel: str, first_lsn: int) -> None:
        with self._lock:
            self._conn.execute(
                "update segments set state = 'committed' where pchannel = ? and first_lsn = ?",
                (pchannel, first_lsn),
            )

    def delete_segments_from(self, pchannel: str, first_lsn: int) -> None:
        """Forget segments starting at or after `first_lsn` (their files were truncated)."""
        with self._lock:
            self._conn.execute(
                "delete from segments where pchannel = ? and first_lsn >= ?", (pchannel, first_lsn)
            )

    def delete_segments_before(self, pchannel: str, lsn: int) -> None:
        """Forget segments that end before `lsn` (retention deleted their files)."""
        with self._lock:
            self._conn.execute(
                "delete from segments where pchannel = ? and last_lsn < ?", (pchannel, lsn)
            )

    # -- retention -----------------------------------------------------------------------------

    def retention_floor(self, pchannel: str) -> int:
        """The retention floor recorded for `pchannel` (0: nothing deleted)."""
        with self._lock:
            return self._one(
                "select deleted_before_lsn from retention where pchannel = ?", (pchannel,)
            )

    def raise_retention_floor(self, pchannel: str, lsn: int) -> int:
        """Persist the floor = max(current, lsn) durably; returns the floor (never lower)."""
        with self._lock:
            current = self._one(
                "select deleted_before_lsn from retention where pchannel = ?", (pchannel,)
            )
            if lsn <= current:
                return current
            self._conn.execute(_UPSERT_RETENTION, (pchannel, lsn))
            return lsn

    def segments(self, pchannel: str | None = None) -> list[SegmentRow]:
        sql = f"select {', '.join(f'[{c}]' for c in _SEGMENT_COLUMNS)} from segments"
        params: tuple[object, ...] = ()
        if pchannel is not None:
            sql += " where pchannel = ?"
            params = (pchannel,)
        sql += " order by pchannel, first_lsn"
        with self._lock:
            return [SegmentRow(*row) for row in self._conn.execute(sql, params)]

    def committed_first_lsns(self, pchannel: str) -> set[int]:
        with self._lock:
            return {
                int(first_lsn)
                for (first_lsn,) in self._conn.execute(
                    "select first_lsn from segments where pchannel = ? and state = 'committed'",
                    (pchannel,),
                )
            }

    # -- replica positions -----------------------------------------------------------------

    def record_replica_positions(self, pchannel: str, term: int, positions: dict[str, int]) -> None:
        with self._lock:
            # One transaction for the batch: one commit (one fsync) for all of them.
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(
                    _UPSERT_REPLICA_POSITION,
                    [(pchannel, node, term, lsn) for node, lsn in sorted(positions.items())],
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def replica_positions(self, pchannel: str) -> dict[str, int]:
        with self._lock:
            return {
                node_id: int(durable_lsn)
                for node_id, durable_lsn in self._conn.execute(
                    "select node_id, durable_lsn from replica_positions where pchannel = ?",
                    (pchannel,),
                )
            }
