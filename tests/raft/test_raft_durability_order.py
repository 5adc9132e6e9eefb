"""Durable, then acknowledged: the order of fsyncs and acknowledgements, observed.

Three RaftPeers run in this process (real pysyncobj, real sockets on 127.0.0.1, real files)
with a `durability_observer` that appends every event to one shared, time-ordered history;
the leader's client acknowledgements (future done-callbacks, which run on the leader's tick
thread the moment the result is set) go into the same history. The checker then requires:

- a follower's "ack_sent n" comes after a "synced >= n" on that follower;
- the leader's "commit n" comes after a "synced >= n" on the leader (it never counts
  itself for an entry that is not durable) and after some follower's "ack_sent >= n";
- every client acknowledgement of entry n comes after both as well (leader + one follower
  = a majority of three, durable).

The same run with `durable=False` must produce violations: the checker can fail.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from raft_harness import TEST_SECRET, free_ports

from raft import DurabilityEvent, RaftPeer
from tests.timing import scaled


@dataclass(frozen=True)
class Recorded:
    node: str
    kind: str
    index: int


class History:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[Recorded] = []

    def observe(self, event: DurabilityEvent) -> None:
        with self._lock:
            self.events.append(Recorded(event.node, event.kind, event.index))

    def client_ack(self, node: str, index: int) -> None:
        with self._lock:
            self.events.append(Recorded(node, "client_ack", index))


class CountingApp:
    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes]] = []

    def apply(self, command: bytes, raft_index: int) -> bytes:
        self.applied.append((raft_index, command))
        return raft_index.to_bytes(8, "big")

    def take_snapshot(self) -> bytes:
        return b"".join(len(c).to_bytes(4, "big") + c for _i, c in self.applied)

    def restore_snapshot(self, data: bytes) -> None:
        raise AssertionError("no snapshot is installed in this test")


def check_order(events: list[Recorded], leader: str) -> list[str]:
    """Violations of the durable-before-acknowledged order (empty when all is well)."""
    synced: dict[str, int] = {}
    acked_by_follower: dict[str, int] = {}
    violations: list[str] = []
    for position, event in enumerate(events):
        if event.kind == "synced":
            synced[event.node] = event.index
        elif event.kind == "ack_sent":
            if event.index > synced.get(event.node, 0):
                violations.append(f"#{position} {event}: follower acked before its sync")
            acked_by_follower[event.node] = max(acked_by_follower.get(event.node, 0), event.index)
        elif event.kind in ("commit", "client_ack") and event.node == leader:
            if event.index > synced.get(leader, 0):
                violations.append(f"#{position} {event}: leader not durable yet")
            if not any(index >= event.index for index in acked_by_follower.values()):
                violations.append(f"#{position} {event}: no durable follower yet")
    return violations


def run_cluster(tmp_path: Path, durable: bool, proposals: int) -> tuple[History, str, dict]:
    history = History()
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    apps = [CountingApp() for _ in addresses]
    peers: list[RaftPeer] = []
    try:
        for number, address in enumerate(addresses):
            peers.append(
                RaftPeer(
                    address,
                    [other for other in addresses if other != address],
                    tmp_path / f"{'durable' if durable else 'unsafe'}-n{number}",
                    apps[number].apply,
                    apps[number].take_snapshot,
                    apps[number].restore_snapshot,
                    durable=durable,
                    durability_observer=history.observe,
                    password=TEST_SECRET,
                )
            )
        deadline = time.monotonic() + scaled(10.0)
        while not any(peer.is_leader() for peer in peers) and time.monotonic() < deadline:
            time.sleep(0.01)
        leader = next(peer for peer in peers if peer.is_leader())
        leader_address = leader.status()["self_address"]

        futures = []
        for number in range(proposals):
            future = leader.propose(f"cmd-{number}".encode(), 10.0)
            future.add_done_callback(
                lambda done: history.client_ack(
                    leader_address, int.from_bytes(done.result(), "big")
                )
            )
            futures.append(future)
            if number % 50 == 49:
                concurrent.futures.wait(futures, timeout=scaled(10.0))  # some idle gaps too
        done, not_done = concurrent.futures.wait(futures, timeout=scaled(20.0))
        assert not not_done
        assert all(future.exception() is None for future in done)
        return history, leader_address, leader.status()
    finally:
        for peer in peers:
            peer.close()


@pytest.fixture
def durable_run(tmp_path: Path) -> Iterator[tuple[History, str, dict]]:
    yield run_cluster(tmp_path, durable=True, proposals=400)


def test_acknowledgements_follow_durability(durable_run: tuple[History, str, dict]) -> None:
    history, leader, leader_status = durable_run
    events = history.events
    kinds = {event.kind for event in events}
    assert {"synced", "ack_sent", "commit", "client_ack"} <= kinds
    assert sum(1 for event in events if event.kind == "client_ack") == 400
    assert check_order(events, leader) == []
    # The safety net in apply never had to sync: the hooks did it in time.
    assert leader_status["safety_net_syncs"] == 0
    # Group commit: fewer fsyncs than entries, on the leader and on the followers.
    for node in {event.node for event in events}:
        syncs = sum(1 for event in events if event.node == node and event.kind == "synced")
        assert 0 < syncs < 400, (node, syncs)


def test_checker_detects_acknowledgement_without_fsync(tmp_path: Path) -> None:
    history, leader, _status = run_cluster(tmp_path, durable=False, proposals=60)
    violations = check_order(history.events, leader)
    assert violations, "with fsync disabled the ordering checker must report violations"
