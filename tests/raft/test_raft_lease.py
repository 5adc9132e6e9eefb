"""The leader's lease and the vote guard, on in-process peers (real transport, real fsync).

- `RaftPeer.lease_read_index` covers every write acknowledged before it, sends nothing,
  appends nothing and syncs nothing; followers have no lease.
- Once its followers are gone, the leader's lease ends no later than `lease_s` after the
  last moment they could have answered, and it serves no lease read after that.
- A leadership transfer gives the lease up before TimeoutNow leaves, and the target's
  election passes the other voters' vote guard: with five voters the old leader's vote
  alone is not enough, and the target still wins in one round (term + 1).
- Tuning is validated: a lease shorter than two heartbeats, or a guard of a whole
  election timeout, is refused.

The vote guard itself (a follower cut off from the leader alone cannot depose it) runs on
a real cluster with per-link proxies: tests/cluster/test_batch_and_read_index.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raft_harness import TEST_SECRET, Items, free_ports

import raft._pysyncobj_glue as glue
from raft import RaftPeer, RaftTuning
from tests.timing import scaled

TUNING = RaftTuning(
    # In-process peers share one GIL: elections are kept slow enough that a loaded host
    # does not call one mid-test.
    election_timeout_min_s=1.0,
    election_timeout_max_s=2.0,
    heartbeat_period_s=0.05,
    # A leader whose followers are gone keeps believing it leads: only its lease decides.
    leader_fallback_timeout_s=20.0,
    connection_timeout_s=20.0,
)


def _start_peers(tmp_path: Path, count: int) -> list[tuple[RaftPeer, Items]]:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
    started: list[tuple[RaftPeer, Items]] = []
    try:
        for n, address in enumerate(addresses):
            app = Items()
            peer = RaftPeer(
                address,
                addresses,
                tmp_path / f"p{n}",
                app.apply,
                app.take_snapshot,
                app.restore_snapshot,
                tuning=TUNING,
                password=TEST_SECRET,
            )
            started.append((peer, app))
    except BaseException:
        for peer, _ in started:
            peer.close()
        raise
    return started


def _running(tmp_path: Path) -> Iterator[list[tuple[RaftPeer, Items]]]:
    started = _start_peers(tmp_path, 3)
    try:
        yield started
    finally:
        for peer, _ in started:
            peer.close()


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[list[tuple[RaftPeer, Items]]]:
    yield from _running(tmp_path)


def _leased_leader(peers: list[tuple[RaftPeer, Items]]) -> tuple[RaftPeer, Items]:
    """The leader, once it holds a lease (bounded: 20 s)."""
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        for peer, app in peers:
            if peer.is_leader() and peer.lease_read_index() is not None:
                return peer, app
        time.sleep(0.02)
    raise AssertionError("no leader with a lease within 20 s")


def test_lease_reads_cover_acknowledged_writes_and_send_nothing(peers) -> None:
    leader, app = _leased_leader(peers)
    for n in range(20):
        written = int.from_bytes(leader.propose(f"w{n}".encode(), 5.0).result(10), "big")
        index = leader.lease_read_index()
        assert index is not None and index >= written
        assert leader.last_applied_index() >= written
        assert app.items[-1] == f"w{n}".encode()
    before = leader.status()
    served = 0
    for _ in range(500):
        if leader.lease_read_index() is not None:
            served += 1
    after = leader.status()
    # A lease is renewed by every heartbeat: on a healthy cluster it does not lapse.
    assert served == 500
    assert after["read_rounds"] == before["read_rounds"]
    assert after["journal_last_index"] == before["journal_last_index"]
    assert after["journal_syncs"] == before["journal_syncs"]
    assert after["lease_reads"] - before["lease_reads"] == 500
    for peer, _ in peers:
        if peer is not leader:
            assert peer.lease_read_index() is None


@pytest.fixture(params=[0.0, 100.0], ids=["clock", "raw-clock-100s-ahead"])
def clock_offset(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> float:
    """pysyncobj's clock (CLOCK_MONOTONIC_RAW) and time.monotonic (CLOCK_MONOTONIC) have
    different origins: a quarter of a second apart on a host up for a day. The second
    case moves the clock the glue reads 100 s ahead of time.monotonic, so a lease dated
    on one clock and checked on the other would run for 100 s."""
    offset: float = request.param
    if offset:
        monkeypatch.setattr(glue, "monotonicTime", lambda: time.monotonic() + offset)
    return offset


@pytest.fixture
def offset_peers(tmp_path: Path, clock_offset: float) -> Iterator[list[tuple[RaftPeer, Items]]]:
    yield from _running(tmp_path)


def test_the_lease_ends_within_its_length_once_the_followers_are_gone(offset_peers) -> None:
    peers = offset_peers
    leader, _ = _leased_leader(peers)
    lease_s = TUNING.lease_s()
    for peer, _ in peers:
        if peer is not leader:
            peer.close()
    # No follower can answer anything sent after this moment.
    gone_at = time.monotonic()
    last_served = gone_at
    deadline = gone_at + lease_s + 2.0
    while time.monotonic() < deadline:
        now = time.monotonic()
        if leader.lease_read_index() is not None:
            last_served = now
        time.sleep(0.001)
    assert leader.is_leader(), "the leader stepped down: the test proves nothing"
    assert last_served < gone_at + lease_s, (last_served - gone_at, lease_s)
    # ReadIndex refuses too: nobody answers its round.
    assert leader.lease_read_index() is None


def test_a_transfer_gives_up_the_lease_and_its_election_passes_the_vote_guard(
    tmp_path: Path,
) -> None:
    peers = _start_peers(tmp_path, 5)
    try:
        old, _ = _leased_leader(peers)
        term = old.raft_term()
        # (Votes ignored at start-up are not this test's: the peers start one by one.)
        ignored_before = sum(peer.status()["votes_ignored"] for peer, _ in peers)
        # Every follower has heard from the leader within its guard when the target calls
        # its election; the old leader's vote and the target's own are 2 of 5.
        deadline = time.monotonic() + scaled(10)
        sent = False
        while not sent and time.monotonic() < deadline:
            sent = old.transfer_leadership().result(10)
            if not sent:
                time.sleep(0.05)
        assert sent, "no follower caught up within 10 s"
        assert old.lease_read_index() is None
        deadline = time.monotonic() + scaled(10)
        new = None
        while time.monotonic() < deadline and new is None:
            leaders = [peer for peer, _ in peers if peer.is_leader()]
            if leaders and leaders[0] is not old:
                new = leaders[0]
            time.sleep(0.005)
        assert new is not None, "no new leader within 10 s"
        # One round: the guard let the transfer's election through (without that, the
        # target's first election fails and a later one wins at term + 2 or more).
        assert new.raft_term() == term + 1, (term, new.raft_term())
        ignored = sum(peer.status()["votes_ignored"] for peer, _ in peers) - ignored_before
        assert ignored == 0, ignored
    finally:
        for peer, _ in peers:
            peer.close()


def test_lease_tuning_is_validated() -> None:
    with pytest.raises(ValueError, match=r"invalid lease_reads \(True; expected False, or a"):
        RaftTuning(vote_guard_fraction=0.2).validate()
    with pytest.raises(ValueError, match=r"invalid vote_guard_fraction \(1.0; expected 0 <= x"):
        RaftTuning(vote_guard_fraction=1.0).validate()
    with pytest.raises(ValueError, match=r"invalid max_clock_drift \(0; expected 0 < x < 1\)"):
        RaftTuning(max_clock_drift=0).validate()
    # Off: no lease, and no constraint on its length.
    RaftTuning(vote_guard_fraction=0.2, lease_reads=False).validate()
    assert RaftTuning(lease_reads=False).lease_s() == 0
    assert RaftTuning().lease_s() == pytest.approx(0.4 * 0.75 * 0.9)
