"""Leadership is sticky (DESIGN.md section 11): PreVote and the leader-contact guard.

Real `peer_main.py` processes on 127.0.0.1. A follower that merely missed heartbeats (it
was paused, or cut off) must not raise its term, and so must not depose a healthy leader
when it comes back: it asks for pre-votes first, and the nodes that hear the leader refuse
them (Raft thesis 9.6; etcd raft's PreVote and CheckQuorum). Without PreVote, the paused
follower's first tick after SIGCONT starts an election at term + 1 and the leader steps
down on its RequestVote; the cut-off follower raises its term while cut off and forces an
election when the partition heals.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raft_harness import Cluster, PeerProcess

pytestmark = pytest.mark.cluster

ELECTION_BOUND_S = 10.0
PAUSE_S = 3.0
ISOLATION_S = 5.0
#: How long after a resume or a heal the leader and the term are watched.
WATCH_S = 4.0


def _propose(leader: PeerProcess, data: str) -> None:
    answer = leader.request("propose", data=data, timeout_s=5.0)
    assert answer["ok"], answer


def _watch_stable(
    peers: list[PeerProcess], leader: PeerProcess, term: int, seconds: float
) -> list[tuple[str, str, int]]:
    """Every (peer, state, term) sampled for `seconds`, failing at the first sample where
    the leader is not leader any more or a term moved."""
    seen: list[tuple[str, str, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for peer in peers:
            status = peer.status()["status"]
            seen.append((peer.name, status["state"], status["term"]))
            assert status["term"] == term, (
                f"{peer.name} at term {status['term']}; expected the term to stay {term}",
                seen[-12:],
            )
            if peer is leader:
                assert status["state"] == "leader", (f"{leader.name} was deposed", seen[-12:])
        time.sleep(0.1)
    return seen


#: The two places a peer ticks (raft/peer.py `RaftTuning.tick_on_event_loop`). On its tick
#: thread, a follower stopped while it waits in poll reads the leader's queued heartbeats
#: before its next election check, so an idle one resumed after SIGSTOP kept its leader
#: even without PreVote (a pause that lands inside a tick did not); ticked on an event
#: loop, the overdue tick timer runs the election check first, and without PreVote the
#: resumed follower deposed the leader every time.
TICK_MODES = {"tick-thread": "0", "event-loop": "1"}


@pytest.fixture(params=sorted(TICK_MODES))
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3, env={"RAFTWAL_RAFT_TICK_ON_LOOP": TICK_MODES[request.param]})
    cluster.start_all()
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def proxied_cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3, proxied=True)
    cluster.start_all()
    try:
        yield cluster
    finally:
        cluster.stop_all()


def _settled(cluster: Cluster) -> tuple[PeerProcess, int]:
    leader = cluster.wait_for_leader(ELECTION_BOUND_S)
    _propose(leader, "before")
    cluster.wait_converged(10.0)
    cluster.wait_until(
        lambda: all(
            all(p.status()["status"]["partners_connected"].values()) for p in cluster.peers
        ),
        5.0,
        "full connectivity",
    )
    return leader, leader.status()["status"]["term"]


def test_a_follower_paused_and_resumed_does_not_depose_the_leader(cluster: Cluster) -> None:
    leader, term = _settled(cluster)
    follower, other = [peer for peer in cluster.peers if peer is not leader]
    follower.pause()
    try:
        # The leader keeps its other follower meanwhile: no election, no new term.
        _watch_stable([leader, other], leader, term, PAUSE_S)
    finally:
        follower.resume()
    _watch_stable(cluster.peers, leader, term, WATCH_S)
    _propose(leader, "after")
    cluster.wait_converged(10.0)
    assert cluster.wait_for_leader(ELECTION_BOUND_S) is leader


def test_a_cut_off_follower_keeps_its_term_and_rejoins_without_an_election(
    proxied_cluster: Cluster,
) -> None:
    cluster = proxied_cluster
    assert cluster.net is not None
    leader, term = _settled(cluster)
    follower = next(peer for peer in cluster.peers if peer is not leader)
    cluster.net.isolate(follower.address)
    try:
        _watch_stable(cluster.peers, leader, term, ISOLATION_S)
        # Cut off for longer than an election timeout, it names no leader any more (the
        # watches of a node cut off from the majority end on that; tests/cluster/
        # test_watch_liveness.py). Without this, its pre-vote rounds kept the old leader.
        assert follower.status()["status"]["leader"] is None, follower.status()
        _propose(leader, "while-cut-off")
    finally:
        cluster.net.heal_all()
    cluster.wait_until(
        lambda: follower.status()["status"]["leader"] == leader.address,
        10.0,
        f"{follower.name} following {leader.name} again",
    )
    _watch_stable(cluster.peers, leader, term, WATCH_S)
    cluster.wait_converged(10.0)


def test_a_follower_cut_off_from_the_leader_only_cannot_raise_the_term(
    proxied_cluster: Cluster,
) -> None:
    """Cut from the leader but not from the other follower: that follower hears the leader
    and refuses the pre-votes, so the cut-off one stays at the leader's term, and follows
    the leader again once the link heals."""
    cluster = proxied_cluster
    assert cluster.net is not None
    leader, term = _settled(cluster)
    follower = next(peer for peer in cluster.peers if peer is not leader)
    cluster.net.cut(follower.address, leader.address)
    try:
        _watch_stable(cluster.peers, leader, term, ISOLATION_S)
        _propose(leader, "while-cut-off")
    finally:
        cluster.net.heal_all()
    cluster.wait_until(
        lambda: follower.status()["status"]["leader"] == leader.address,
        10.0,
        f"{follower.name} following {leader.name} again",
    )
    _watch_stable(cluster.peers, leader, term, WATCH_S)
    cluster.wait_converged(10.0)


def test_a_follower_whose_term_moved_past_the_leader_rejoins(cluster: Cluster) -> None:
    """A follower can still end up at a term above its live leader's: it won a pre-vote
    while a majority missed heartbeats, then lost the election when they heard the leader
    again. The leader's AppendEntries (of the lower term) are then ignored by it, and its
    pre-votes refused by everyone else: with nothing more it would stay out for good. Like
    etcd raft (`Step`, a MsgApp of a lower term is answered so that the leader learns the
    term), it tells the leader its term; the leader steps down, one election follows, and
    every node ends up following one leader again. The follower is put there by restarting
    it with its stored term raised."""
    from raft.journal import DurableJournal

    leader, term = _settled(cluster)
    follower = next(peer for peer in cluster.peers if peer is not leader)
    follower.kill9()
    journal = DurableJournal(follower.data_dir)
    try:
        journal.setCurrentTerm(term + 3, None)
    finally:
        journal.close()
    follower.start()
    new_leader = cluster.wait_for_leader(ELECTION_BOUND_S)
    statuses = [peer.status()["status"] for peer in cluster.peers]
    assert {s["term"] for s in statuses} == {statuses[0]["term"]}, statuses
    assert statuses[0]["term"] > term + 3, statuses
    _propose(new_leader, "after")
    cluster.wait_converged(10.0)
