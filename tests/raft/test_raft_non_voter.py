"""Non-voting members (`RaftPeer(voter=False)`, pysyncobj's read-only node), in process:
three voters and one non-voter on 127.0.0.1, real transport and fsync.

Checked: the non-voter applies every committed entry, durably (it restarts from its own
journal), refuses proposals with NotLeader naming the leader and serves reads through
`wait_applied`; it never leads; and it never counts toward a quorum: with two voters
gone, neither a proposal nor a ReadIndex read of the remaining voter succeeds although
the non-voter keeps answering its AppendEntries (a read confirmed by it would be a read
from a deposed leader).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from raft_harness import TEST_SECRET, free_ports
from test_raft_read_index import FAST, Items

from raft import NotLeader, RaftPeer, RaftTuning, UnknownOutcome
from raft.errors import LeadershipUnconfirmed
from tests.timing import scaled

# Snapshots every few entries: a non-voter takes its own, and restarts from one.
TUNING = replace(FAST, snapshot_every_entries=8)


def _start(
    address: str, voters: list[str], directory: Path, tuning: RaftTuning, voter: bool
) -> tuple[RaftPeer, Items]:
    app = Items()
    peer = RaftPeer(
        address,
        voters,
        directory,
        app.apply,
        app.take_snapshot,
        app.restore_snapshot,
        tuning=tuning,
        password=TEST_SECRET,
        voter=voter,
    )
    return peer, app


@pytest.fixture
def members(tmp_path: Path) -> Iterator[dict[str, tuple[RaftPeer, Items]]]:
    ports = free_ports(4)
    voters = [f"127.0.0.1:{port}" for port in ports[:3]]
    started: dict[str, tuple[RaftPeer, Items]] = {}
    try:
        for n, address in enumerate(voters):
            started[f"v{n}"] = _start(address, voters, tmp_path / f"v{n}", TUNING, True)
        started["learner"] = _start(
            f"127.0.0.1:{ports[3]}", voters, tmp_path / "learner", TUNING, False
        )
        yield started
    finally:
        for peer, _ in started.values():
            peer.close()


def _leader(members: dict[str, tuple[RaftPeer, Items]]) -> tuple[str, RaftPeer, Items]:
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        for name, (peer, app) in members.items():
            if peer.is_leader() and peer.read_index(5.0).result(10) > 0:
                return name, peer, app
        time.sleep(0.05)
    raise AssertionError("no leader serving reads")


def test_a_non_voter_follows_the_log_and_never_leads(members, tmp_path: Path) -> None:
    name, leader, app = _leader(members)
    assert name != "learner"
    learner, learned = members["learner"]
    for n in range(30):
        leader.propose(f"w{n}".encode(), 5.0).result(10)
    target = leader.read_index(5.0).result(10)
    assert learner.wait_applied(target, 5.0).result(10) == target
    assert learned.items == app.items
    status = learner.status()
    assert status["voter"] is False and status["state"] == "follower"
    assert learner.leader_address() == leader.status()["self_address"]
    with pytest.raises(NotLeader) as refused:
        learner.propose(b"nope", 5.0).result(10)
    assert refused.value.leader_address == leader.status()["self_address"]

    # The leader goes: a voter takes over, never the non-voter, which follows the new one.
    leader.close()
    del members[name]
    new_name, new_leader, new_app = _leader(members)
    assert new_name != "learner"
    new_leader.propose(b"after", 5.0).result(10)
    target = new_leader.read_index(5.0).result(10)
    assert learner.wait_applied(target, 5.0).result(10) == target
    assert learned.items[-1] == b"after" and learned.items == new_app.items

    # Durable: restarted on its own snapshot and journal, it has everything it applied.
    deadline = time.monotonic() + scaled(10)
    while learner.status()["snapshots_written"] == 0 and time.monotonic() < deadline:
        new_leader.propose(b"more", 5.0).result(10)
    assert learner.status()["snapshots_written"] > 0
    target = new_leader.read_index(5.0).result(10)
    learner.wait_applied(target, 5.0).result(10)
    address = learner.status()["self_address"]
    voters = [peer.status()["self_address"] for n, (peer, _) in members.items() if n != "learner"]
    learner.close()
    restarted, relearned = _start(
        address, [*voters, leader.status()["self_address"]], tmp_path / "learner", TUNING, False
    )
    members["learner"] = (restarted, relearned)
    assert relearned.items == learned.items


def test_a_non_voter_never_makes_a_quorum(members) -> None:
    name, leader, _ = _leader(members)
    learner, _ = members["learner"]
    leader.propose(b"before", 5.0).result(10)
    for other, (peer, _) in members.items():
        if other not in (name, "learner"):
            peer.close()
    # The leader still believes it leads (fallback 20 s) and the non-voter still answers.
    assert leader.is_leader()
    with pytest.raises(LeadershipUnconfirmed):
        leader.read_index(1.0).result(10)
    with pytest.raises(UnknownOutcome):
        leader.propose(b"lost", 1.0).result(10)
    assert learner.last_applied_index() < leader.status()["journal_last_index"]
