"""The event store's writer: the events of many commands in one SQLite transaction, and
nothing lost to the batching (flush, close and readers see every appended event)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import raft.events as events_module
from raft.events import EventStore
from rpc.protos import coordination_pb2 as pb


def _event(revision: int) -> pb.Event:
    return pb.Event(
        revision=revision,
        raft_index=revision,
        time_ms=1000 + revision,
        node_marked_down=pb.NodeMarkedDown(node_id=f"n{revision}"),
    )


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows per transaction the writer made."""
    batches: list[int] = []
    original = EventStore._write_rows

    def write_rows(self: EventStore, rows: list) -> None:  # type: ignore[type-arg]
        batches.append(len(rows))
        original(self, rows)

    monkeypatch.setattr(EventStore, "_write_rows", write_rows)
    return batches


def test_commands_appended_together_share_a_transaction(tmp_path: Path, counted) -> None:
    store = EventStore(tmp_path / "events.db")
    try:
        # One command every 2 ms, as a leader applies them under a steady trickle of
        # writes: without the batching delay, one transaction per command.
        for revision in range(1, 51):
            store.append([_event(revision)])
            time.sleep(0.002)
        store.flush()
        assert store.count() == 50
        assert sum(counted) == 50
        assert len(counted) <= 25, counted
        assert [e.revision for e in store.read(1, 100)] == list(range(1, 51))
    finally:
        store.close()


def test_a_full_batch_is_written_without_waiting(
    tmp_path: Path, counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delay far longer than the test: only the batch bound can start these writes.
    monkeypatch.setattr(events_module, "WRITE_DELAY_S", 3600.0)
    monkeypatch.setattr(events_module, "WRITE_BATCH_EVENTS", 10)
    store = EventStore(tmp_path / "events.db")
    try:
        store.append([_event(revision) for revision in range(1, 11)])
        # last_revision flushes, but a full batch needs no flush to be written.
        for _ in range(200):
            if counted:
                break
            time.sleep(0.01)
        assert counted and counted[0] == 10
        # A partial batch waits for the delay, and flush cuts it short.
        store.append([_event(11)])
        assert store.last_revision() == 11
        assert counted == [10, 1]
    finally:
        store.close()


def test_close_writes_what_is_queued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "WRITE_DELAY_S", 3600.0)
    store = EventStore(tmp_path / "events.db")
    for revision in range(1, 4):
        store.append([_event(revision)])
    store.close()
    reopened = EventStore(tmp_path / "events.db")
    try:
        assert reopened.last_revision() == 3
    finally:
        reopened.close()
