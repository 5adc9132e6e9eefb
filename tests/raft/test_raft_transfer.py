"""RaftPeer.transfer_leadership on three in-process peers: the leadership moves to a
caught-up follower at once, also while commands keep arriving (the leader accepts none
during the transfer, so the target holds the whole log when it calls its election), and a
follower is refused with NotLeader."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raft_harness import TEST_SECRET, free_ports

from raft import NotLeader, RaftPeer, RaftTuning
from raft.errors import RaftError
from tests.timing import scaled

TUNING = RaftTuning(election_timeout_min_s=0.4, election_timeout_max_s=0.8, heartbeat_period_s=0.05)


class App:
    def __init__(self) -> None:
        self.count = 0

    def apply(self, command: bytes, raft_index: int) -> bytes:
        self.count += 1
        return b"ok"

    def take_snapshot(self) -> bytes:
        return str(self.count).encode()

    def restore_snapshot(self, data: bytes) -> None:
        self.count = int(data or b"0")


@pytest.fixture()
def peers(tmp_path: Path) -> Iterator[list[RaftPeer]]:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    started: list[RaftPeer] = []
    try:
        for index, address in enumerate(addresses):
            app = App()
            started.append(
                RaftPeer(
                    address,
                    [a for a in addresses if a != address],
                    tmp_path / f"p{index}",
                    app.apply,
                    app.take_snapshot,
                    app.restore_snapshot,
                    tuning=TUNING,
                    password=TEST_SECRET,
                )
            )
        yield started
    finally:
        for peer in started:
            peer.close()


def _leader(
    peers: list[RaftPeer], timeout_s: float = 10.0, not_: RaftPeer | None = None
) -> RaftPeer:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        leaders = [p for p in peers if p.is_leader() and p is not not_]
        if len(leaders) == 1 and not (not_ is not None and not_.is_leader()):
            return leaders[0]
        time.sleep(0.01)
    raise AssertionError("no single leader")


def test_the_leadership_moves_at_once_under_a_stream_of_commands(peers: list[RaftPeer]) -> None:
    old = _leader(peers)
    stop = threading.Event()
    refused: list[RaftError] = []

    def propose_forever() -> None:
        # Always at the current leader, as clients and forwarded proposals do.
        sent = 0
        while not stop.is_set() and sent < 100_000:
            leader = next((p for p in peers if p.is_leader()), None)
            if leader is None:
                time.sleep(0.005)
                continue
            sent += 1
            try:
                leader.propose(b"x", timeout_s=5.0).result(timeout=scaled(6.0))
            except NotLeader as error:
                refused.append(error)
                time.sleep(0.005)
            except RaftError:
                pass

    writers = [threading.Thread(target=propose_forever) for _ in range(4)]
    for writer in writers:
        writer.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        moved_after = None
        while time.monotonic() - started < scaled(5.0):
            try:
                sent = old.transfer_leadership().result(timeout=scaled(2.0))
            except NotLeader:
                sent = True
            if sent:
                try:
                    new = _leader(peers, timeout_s=TUNING.election_timeout_max_s, not_=old)
                    moved_after = time.monotonic() - started
                    break
                except AssertionError:
                    continue
            time.sleep(0.05)
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=scaled(10))
    assert moved_after is not None, "the leadership did not move within 5 s"
    print(f"leadership moved in {moved_after * 1000:.0f} ms; {len(refused)} proposals refused")
    assert new is not old and not old.is_leader()
    # The old leader stays a follower: it does not take the leadership back.
    time.sleep(2 * TUNING.election_timeout_max_s)
    assert _leader(peers) is new


def test_a_follower_cannot_transfer(peers: list[RaftPeer]) -> None:
    leader = _leader(peers)
    follower = next(p for p in peers if p is not leader)
    with pytest.raises(NotLeader):
        follower.transfer_leadership().result(timeout=scaled(2.0))
    assert leader.is_leader()


def test_a_closed_peer_refuses_a_transfer(peers: list[RaftPeer]) -> None:
    peer = peers[0]
    peer.close()
    with pytest.raises(RaftError):
        peer.transfer_leadership().result(timeout=scaled(2.0))
