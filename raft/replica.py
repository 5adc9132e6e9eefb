"""The coordination state machine as a Raft application: apply, snapshot, restore, read.

``CoordinationReplica`` is what the Raft peer drives on every node: ``apply`` runs
``statemachine.apply_command`` for each committed entry (on the peer's thread, in log
order) and records the events in the event store; ``take_snapshot``/``restore_snapshot``
are the versioned snapshot codec (the deterministic ``CoordinationState`` bytes, never a
pickle). Readers on other threads go through ``read``, which holds the same lock as apply,
so they never see a half-applied command.

Listeners are told of every applied command ``(revision, raft_index)`` from the apply
thread; they must be quick and must not block (the node hands them to its event loop).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from raft.events import Compacted, EventStore
from raft.reserve import DiskReserve
from rpc.protos import coordination_pb2 as pb
from statemachine import apply_log_entry, new_state, restore_state, snapshot_state, state_digest

log = logging.getLogger(__name__)

T = TypeVar("T")
Listener = Callable[[int, int], None]
# ((kind, deterministic bytes) of each applied event, revision, raft index, state
# machine clock, whether the state was replaced: a snapshot restore or a RestoreState,
# after which the events do not lead from the previous state to the new one)
EventListener = Callable[[list[tuple[str, bytes]], int, int, int, bool], None]

# Recent events kept in memory for live watchers (older ones are read from events.db).
RECENT_EVENTS = 20_000


class CoordinationReplica:
    def __init__(self, data_dir: Path, reserve: DiskReserve | None = None) -> None:
        self._lock = threading.RLock()
        self._state = new_state()
        self._store = EventStore(data_dir / "events.db", reserve=reserve)
        self._recent: collections.deque[pb.Event] = collections.deque(maxlen=RECENT_EVENTS)
        self._listeners: list[Listener] = []
        self._event_listeners: list[EventListener] = []

    @property
    def store(self) -> EventStore:
        return self._store

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def add_event_listener(self, listener: EventListener) -> None:
        """`listener` hears every applied command's events (as bytes) and every state
        replacement, on the apply thread, before the plain listeners; it must be quick and
        must not block (the node's data workers keep their copy of the state with it)."""
        self._event_listeners.append(listener)

    # -- Raft application callbacks (peer thread) ----------------------------------------

    def apply(self, command_bytes: bytes, raft_index: int) -> bytes:
        """Apply one log entry (a serialized LogEntry); returns a serialized LogEntryResult."""
        with self._lock:
            if raft_index <= self._state.last_raft_index:
                # The Raft layer must never apply an index twice; if it does, the replicas
                # may diverge, so stop loudly rather than continue.
                raise AssertionError(
                    f"raft index {raft_index} applied twice (state is at "
                    f"{self._state.last_raft_index})"
                )
            results = apply_log_entry(self._state, command_bytes, raft_index)
            events = [event for result in results for event in result.events]
            encoded: list[tuple[str, bytes]] = []
            if events:
                encoded = self._store.append(events)
                self._recent.extend(events)
            revision = self._state.revision
            restored = any(event.HasField("state_restored") for event in events)
            if restored:
                # A restored cluster has no history before the restore: watches from an
                # earlier revision answer COMPACTED (first retained: the next revision).
                self._recent.clear()
                self._store.compact(revision + 1)
            for event_listener in self._event_listeners:
                event_listener(encoded, revision, raft_index, self._state.last_time_ms, restored)
        for listener in self._listeners:
            listener(revision, raft_index)
        return pb.LogEntryResult(
            results=[result.SerializeToString() for result in results]
        ).SerializeToString()

    def take_snapshot(self) -> bytes:
        with self._lock:
            # History up to the snapshot must survive the journal compaction that follows.
            self._store.make_durable()
            return snapshot_state(self._state)

    def restore_snapshot(self, data: bytes) -> None:
        state = restore_state(data)
        with self._lock:
            self._state = state
            self._recent.clear()
            revision, raft_index = state.revision, state.last_raft_index
            for event_listener in self._event_listeners:
                event_listener([], revision, raft_index, state.last_time_ms, True)
        stored = self._store.last_revision()
        if stored < revision:
            # A snapshot installed by the leader (this node lagged past its log), or a lost
            # events.db: the node backfills the missing history from a peer; meanwhile
            # reads of it answer COMPACTED rather than skip it.
            log.warning(
                "event store ends at revision %d but the snapshot is at %d: history gap "
                "marked for backfill",
                stored,
                revision,
            )
            self._store.mark_gap(revision)
        for listener in self._listeners:
            listener(revision, raft_index)

    # -- reads (any thread) ---------------------------------------------------------------

    def read(self, reader: Callable[[pb.CoordinationState], T]) -> T:
        """Run `reader` on the applied state under the apply lock; it must not keep
        references into the state (copy what it returns)."""
        with self._lock:
            return reader(self._state)

    def applied(self) -> tuple[int, int]:
        """(revision, raft index) of the applied state."""
        with self._lock:
            return self._state.revision, self._state.last_raft_index

    def digest(self) -> tuple[int, int, str]:
        """(revision, raft index, sha256 of the snapshot bytes) for replica comparison."""
        with self._lock:
            return self._state.revision, self._state.last_raft_index, state_digest(self._state)

    def events_from(self, from_revision: int, limit: int = 1000) -> list[pb.Event]:
        """Events with revision >= from_revision (memory first, then events.db); raises
        ``Compacted`` below the history retention kept, also for events still in memory."""
        first = self._store.first_retained()
        if from_revision < first:
            raise Compacted(from_revision, first)
        with self._lock:
            if self._recent and self._recent[0].revision <= from_revision:
                start = from_revision - self._recent[0].revision
                out = []
                for index in range(start, min(start + limit, len(self._recent))):
                    out.append(self._recent[index])
                return out
        return self._store.read(from_revision, limit)

    def close(self) -> None:
        self._store.close()


__all__ = ["Compacted", "CoordinationReplica"]
