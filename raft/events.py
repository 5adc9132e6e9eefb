"""The event store: every applied coordination event, by revision, in ``events.db`` (SQLite).

The Raft log is compacted by snapshots; the event store keeps the history beyond that, for
``WatchEvents(from_revision)`` and for audits, within a retention window. Contract:

- ``append`` is called by the apply thread with the events of one command, in revision
  order; a writer thread stores them in batches. Re-appending a revision (the Raft layer re-applies the entries after its last
  snapshot on restart) must find identical bytes; it replaces them.
- Writes use SQLite's WAL mode with ``synchronous=NORMAL``: cheap, and safe against a
  process crash. They become durable against power loss at ``make_durable``, which the
  Raft layer calls before it writes a snapshot, so that history older than the snapshot
  is never only in the (then truncated) Raft journal.
- ``read(from_revision)`` raises ``Compacted`` when retention removed that revision.
- A write that meets a full disk (SQLITE_FULL) releases Raft's disk reserve
  (`raft/reserve.py`) and is tried once more before the store fails.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from pathlib import Path

from raft.reserve import DiskReserve
from rpc.protos import coordination_pb2 as pb

log = logging.getLogger(__name__)


class Compacted(Exception):
    """The requested revision is older than the retained history."""

    def __init__(self, requested: int, first_retained: int) -> None:
        self.requested = requested
        self.first_retained = first_retained
        super().__init__(
            f"revision {requested} was compacted (history starts at revision {first_retained})"
        )


# Events queued for the writer thread at most (the replica keeps more than this many
# recent events in memory, so a reader never misses one that is queued but not stored).
MAX_PENDING_EVENTS = 10_000
# The writer stores what was queued this long after the first event of a batch arrived,
# or at once past WRITE_BATCH_EVENTS (or on flush/close). Waking it for every applied
# command put its SQLite transaction, and its hold on the GIL, right inside the write's
# reply path on the leader (docs/benchmarks-history.md, "Where a sequential write's time goes").
WRITE_DELAY_S = 0.010
WRITE_BATCH_EVENTS = 2_000


class EventStore:
    """Append-only history of events keyed by revision. Thread-safe."""

    def __init__(self, path: Path, reserve: DiskReserve | None = None) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._path = path
        self._reserve = reserve
        self._lock = threading.Lock()
        connection = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        # Plain SQL, the tables sqlite_utils created before (same columns and types): its
        # import cost every node start 0.1-0.2 s of CPU before the Raft peer ran (issue 35).
        connection.execute(
            'CREATE TABLE IF NOT EXISTS "events" ("revision" INTEGER PRIMARY KEY, '
            '"raft_index" INTEGER, "time_ms" INTEGER, "kind" TEXT, "body" BLOB)'
        )
        connection.execute(
            'CREATE TABLE IF NOT EXISTS "meta" ("key" TEXT PRIMARY KEY, "value" INTEGER)'
        )
        self._conn = connection
        # first_retained(), cached (every watch poll asks): cleared whenever meta changes.
        self._first_cache: int | None = None
        self._pending: list[tuple[int, int, int, str | None, bytes]] = []
        self._pending_changed = threading.Condition()
        self._writing = False
        self._closed = False
        self._flush_requested = False
        self._failure: Exception | None = None
        self._writer = threading.Thread(target=self._write_loop, name="events-writer", daemon=True)
        self._writer.start()

    # -- writes (apply thread) ----------------------------------------------------------

    def append(self, events: list[pb.Event]) -> list[tuple[str, bytes]]:
        """Queue the events of one command; a writer thread stores them in batches (one
        SQLite transaction per batch), off the Raft apply thread. Blocks while
        MAX_PENDING_EVENTS are queued (backpressure). Raises if the writer failed: the
        apply must not go on with a history that is not being recorded. Returns each
        event's kind and deterministic bytes, as stored."""
        if not events:
            return []
        rows = [
            (
                event.revision,
                event.raft_index,
                event.time_ms,
                event.WhichOneof("body"),
                event.SerializeToString(deterministic=True),
            )
            for event in events
        ]
        with self._pending_changed:
            while len(self._pending) >= MAX_PENDING_EVENTS and self._failure is None:
                self._pending_changed.wait(1.0)
            if self._failure is not None:
                raise RuntimeError(f"event store writer failed: {self._failure}")
            if self._closed:
                raise RuntimeError("event store is closed")
            first = not self._pending
            self._pending.extend(rows)
            # Only what the writer waits for: the first event of a batch (it then waits
            # out WRITE_DELAY_S on its own) or a full batch.
            if first or len(self._pending) >= WRITE_BATCH_EVENTS:
                self._pending_changed.notify_all()
        return [(row[3] or "", row[4]) for row in rows]

    def _write_loop(self) -> None:
        while True:
            with self._pending_changed:
                while not self._pending and not self._closed:
                    self._pending_changed.wait()
                if not self._pending:
                    return
                deadline = time.monotonic() + WRITE_DELAY_S
                while (
                    not self._closed
                    and not self._flush_requested
                    and len(self._pending) < WRITE_BATCH_EVENTS
                ):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._pending_changed.wait(remaining)
                rows, self._pending = self._pending, []
                self._flush_requested = False
                self._writing = True
            try:
                self._write_rows(rows)
            except sqlite3.Error as error:
                log.critical("event store write failed: %s", error)
                with self._pending_changed:
                    self._failure = error
            finally:
                with self._pending_changed:
                    self._writing = False
                    self._pending_changed.notify_all()

    def _write_rows(self, rows: list[tuple[int, int, int, str | None, bytes]]) -> None:
        try:
            self._write_rows_once(rows)
        except sqlite3.Error as error:
            if self._reserve is None or not self._reserve.release_for(error):
                raise
            log.warning("event store: retrying a write after releasing the disk reserve")
            self._write_rows_once(rows)

    def _write_rows_once(self, rows: list[tuple[int, int, int, str | None, bytes]]) -> None:
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO events (revision, raft_index, time_ms, kind, body) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
                self._conn.execute("COMMIT")
            except sqlite3.Error:
                # A full disk fails the statement or the commit: leave no transaction open
                # (SQLite may have rolled it back already).
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def flush(self) -> None:
        """Wait until every queued event is stored (bounded by the writer's progress)."""
        with self._pending_changed:
            if self._pending:
                self._flush_requested = True
                self._pending_changed.notify_all()
            while (self._pending or self._writing) and self._failure is None:
                self._pending_changed.wait(1.0)
            if self._failure is not None:
                raise RuntimeError(f"event store writer failed: {self._failure}")

    def make_durable(self) -> None:
        """Force everything appended so far to stable storage (checkpoint + fsync)."""
        # In WAL mode with synchronous=NORMAL a checkpoint fsyncs the WAL, copies it into
        # the database file and fsyncs that: afterwards every committed row is durable.
        self.flush()
        with self._lock:
            self._conn.execute("PRAGMA wal_checkpoint(FULL)")

    def compact(self, before_revision: int) -> int:
        """Delete history below `before_revision` (retention); returns rows deleted."""
        with self._lock:
            current = self._first_retained_locked()
            if before_revision <= current:
                return 0
            cursor = self._conn.execute("DELETE FROM events WHERE revision < ?", (before_revision,))
            self._set_meta("compacted_before", before_revision)
            return cursor.rowcount

    def first_revision_at(self, time_ms: int) -> int:
        """The first stored revision proposed at or after `time_ms` (past the last one when
        none was): history retention by age compacts below it."""
        self.flush()
        with self._lock:
            # Revisions grow with proposer time, so the scan in revision order stops early.
            row = self._conn.execute(
                "SELECT revision FROM events WHERE time_ms >= ? ORDER BY revision LIMIT 1",
                (time_ms,),
            ).fetchone()
            if row is not None:
                return int(row[0])
            last = self._conn.execute("SELECT MAX(revision) FROM events").fetchone()
        return int(last[0] or 0) + 1

    def mark_gap(self, through_revision: int) -> None:
        """The state jumped to `through_revision` without its events (a snapshot installed
        by the leader on a lagging follower): revisions after the last stored one up to
        `through_revision` are missing. Until ``fill_gap`` closes it, history starts after
        the gap, so readers get ``Compacted`` instead of a history with a hole."""
        with self._lock:
            last = self._conn.execute("SELECT MAX(revision) FROM events").fetchone()[0] or 0
            if through_revision <= last:
                return
            self._set_meta("gap_from", last + 1)
            self._set_meta("gap_to", through_revision)

    def gap(self) -> tuple[int, int] | None:
        """(first, last) missing revision, or None."""
        with self._lock:
            return self._gap_locked()

    def fill_gap(self, events: list[pb.Event]) -> bool:
        """Store events fetched from a peer for the gap; True once the gap is closed."""
        with self._lock:
            gap = self._gap_locked()
            if gap is None:
                return True
            first, last = gap
            wanted = [e for e in events if first <= e.revision <= last]
            expected = list(range(first, first + len(wanted)))
            if [e.revision for e in wanted] != expected:
                raise ValueError(f"events for the gap are not contiguous from revision {first}")
        self.append(wanted)
        self.flush()
        with self._lock:
            if wanted and wanted[-1].revision >= last:
                self._conn.execute("DELETE FROM meta WHERE key IN ('gap_from', 'gap_to')")
                self._first_cache = None
                return True
            if wanted:
                self._set_meta("gap_from", wanted[-1].revision + 1)
            return False

    # -- reads (any thread) -------------------------------------------------------------

    def _set_meta(self, key: str, value: int) -> None:
        self._first_cache = None
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _meta(self, key: str) -> int | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else None

    def _gap_locked(self) -> tuple[int, int] | None:
        first, last = self._meta("gap_from"), self._meta("gap_to")
        if first is None or last is None:
            return None
        return first, last

    def _first_retained_locked(self) -> int:
        gap = self._gap_locked()
        if gap is not None:
            return gap[1] + 1
        return self._meta("compacted_before") or 1

    def first_retained(self) -> int:
        with self._lock:
            if self._first_cache is None:
                self._first_cache = self._first_retained_locked()
            return self._first_cache

    def last_revision(self) -> int:
        self.flush()
        with self._lock:
            row = self._conn.execute("SELECT MAX(revision) FROM events").fetchone()
        return int(row[0] or 0)

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])

    def size_bytes(self) -> int:
        """Bytes of events.db on disk, its SQLite write-ahead log included (for metrics)."""
        total = 0
        for path in (self._path, self._path.with_name(f"{self._path.name}-wal")):
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def read(self, from_revision: int, limit: int = 1000) -> list[pb.Event]:
        """Up to `limit` events with revision >= from_revision, in order."""
        with self._lock:
            first = self._first_retained_locked()
            if from_revision < first:
                raise Compacted(from_revision, first)
            rows = self._conn.execute(
                "SELECT body FROM events WHERE revision >= ? ORDER BY revision LIMIT ?",
                (from_revision, limit),
            ).fetchall()
        return [pb.Event.FromString(row[0]) for row in rows]

    def close(self) -> None:
        with self._pending_changed:
            self._closed = True
            self._pending_changed.notify_all()
        self._writer.join(timeout=30)
        with self._lock:
            self._conn.close()
