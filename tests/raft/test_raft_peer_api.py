"""RaftPeer's public contract on a single in-process peer (its own majority).

Refusal of non-loopback addresses without a password, argument validation, typed errors,
restart recovery (journal replay and snapshot + replay), fatal apply errors, bind failures
and the asyncio bridge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from pathlib import Path

import pytest
from raft_harness import TEST_SECRET, free_ports

from raft import (
    FatalPeerError,
    NotLeader,
    PeerClosed,
    RaftPeer,
    RaftTuning,
    is_loopback_address,
)
from tests.timing import scaled

FAST = RaftTuning(election_timeout_min_s=0.2, election_timeout_max_s=0.3, heartbeat_period_s=0.05)


class ListApp:
    def __init__(self, fail_on: bytes | None = None) -> None:
        self.items: list[bytes] = []
        self.indexes: list[int] = []
        self.restored = 0
        self.fail_on = fail_on

    def apply(self, command: bytes, raft_index: int) -> bytes:
        if command == self.fail_on:
            raise RuntimeError("application bug")
        assert not self.indexes or raft_index > self.indexes[-1]
        self.items.append(command)
        self.indexes.append(raft_index)
        return b"ok:" + command

    def take_snapshot(self) -> bytes:
        return b"\n".join(self.items)

    def restore_snapshot(self, data: bytes) -> None:
        self.restored += 1
        self.items = data.split(b"\n") if data else []
        self.indexes = []


_SOLO_PORTS: dict[Path, int] = {}


def _solo(data_dir: Path, app: ListApp, **kwargs: object) -> RaftPeer:
    # A peer's address is its identity in the membership its snapshots record: a restart
    # from the same directory keeps its port.
    port = _SOLO_PORTS.get(data_dir) or free_ports(1)[0]
    _SOLO_PORTS[data_dir] = port
    peer = RaftPeer(
        f"127.0.0.1:{port}",
        [],
        data_dir,
        app.apply,
        app.take_snapshot,
        app.restore_snapshot,
        tuning=kwargs.pop("tuning", FAST),  # type: ignore[arg-type]
        password=kwargs.pop("password", TEST_SECRET),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
    deadline = time.monotonic() + scaled(10.0)
    while not peer.is_leader() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peer.is_leader()
    return peer


def _noop_app() -> tuple:
    app = ListApp()
    return app.apply, app.take_snapshot, app.restore_snapshot


@pytest.mark.parametrize("password", [None, ""])
@pytest.mark.parametrize(
    ("self_address", "partners"),
    [
        ("127.0.0.1:7000", []),
        ("127.0.0.1:7000", ["127.0.0.1:7001"]),
        ("10.1.2.3:7000", []),
        ("0.0.0.0:7000", []),
        ("node1.example:7000", []),
    ],
)
def test_a_peer_without_a_secret_is_refused_on_every_address(
    tmp_path: Path, self_address: str, partners: list[str], password: str | None
) -> None:
    # Loopback included: any local user can reach a loopback port, and pysyncobj unpickles.
    with pytest.raises(ValueError, match="refusing to start without a cluster secret"):
        RaftPeer(self_address, partners, tmp_path / "d", *_noop_app(), password=password)
    assert not (tmp_path / "d").exists()  # refused before touching anything


def test_a_short_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"too short: 5 chars; expected >= 16"):
        RaftPeer("127.0.0.1:7000", [], tmp_path / "d", *_noop_app(), password="short")


def test_loopback_detection() -> None:
    for address in ("127.0.0.1:1", "127.9.8.7:1", "localhost:1", "::1:1", "[::1]:1"):
        assert is_loopback_address(address), address
    for address in ("10.0.0.1:1", "0.0.0.0:1", "example.com:1", ":::1"):
        assert not is_loopback_address(address), address
    with pytest.raises(ValueError, match="host:port"):
        is_loopback_address("127.0.0.1")


def test_invalid_tuning_names_value_and_expectation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"invalid heartbeat_period_s \(0.2; expected 0 < x <"):
        RaftPeer(
            "127.0.0.1:1",
            [],
            tmp_path,
            *_noop_app(),
            tuning=RaftTuning(heartbeat_period_s=0.2),
            password=TEST_SECRET,
        )


def test_propose_validates_and_answers(tmp_path: Path) -> None:
    app = ListApp()
    peer = _solo(tmp_path, app)
    try:
        assert peer.propose(b"hello", 5.0).result(5.0) == b"ok:hello"
        with pytest.raises(TypeError):
            peer.propose("text", 5.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="command too large"):
            peer.propose(b"x" * (FAST.max_command_bytes + 1), 5.0)
        with pytest.raises(ValueError, match="invalid timeout_s"):
            peer.propose(b"x", 0)
        status = peer.status()
        assert status["state"] == "leader" and status["leader"] == status["self_address"]
        assert status["synced_index"] >= status["commit_index"] >= 3
    finally:
        peer.close()
    with pytest.raises(PeerClosed):
        peer.propose(b"late", 1.0).result(1.0)
    peer.close()  # idempotent


def test_restart_replays_journal_then_snapshot_plus_journal(tmp_path: Path) -> None:
    app = ListApp()
    peer = _solo(tmp_path, app)
    for number in range(30):
        peer.propose(f"a{number}".encode(), 5.0).result(5.0)
    peer.close()

    replayed = ListApp()
    peer = _solo(tmp_path, replayed)
    assert replayed.items == app.items and replayed.restored == 0
    peer.request_snapshot()
    deadline = time.monotonic() + scaled(5.0)
    while peer.status()["snapshot_index"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peer.status()["snapshot_index"] > 0
    for number in range(10):
        peer.propose(f"b{number}".encode(), 5.0).result(5.0)
    peer.close()

    restored = ListApp()
    peer = _solo(tmp_path, restored)
    try:
        assert restored.restored == 1
        assert restored.items == replayed.items
        assert restored.items[-1] == b"b9" and len(restored.items) == 40
    finally:
        peer.close()


def test_apply_exception_stops_the_peer(tmp_path: Path) -> None:
    fatal: list[FatalPeerError] = []
    stopped = threading.Event()

    def on_fatal(error: FatalPeerError) -> None:
        fatal.append(error)
        stopped.set()

    app = ListApp(fail_on=b"poison")
    peer = _solo(tmp_path, app, on_fatal=on_fatal)
    try:
        assert peer.propose(b"fine", 5.0).result(5.0) == b"ok:fine"
        with pytest.raises(PeerClosed, match="apply failed"):
            peer.propose(b"poison", 5.0).result(5.0)
        assert stopped.wait(5.0)
        assert "RuntimeError('application bug')" in str(fatal[0])
        assert "apply failed" in peer.status()["fatal_error"]
        with pytest.raises(PeerClosed):
            peer.propose(b"after", 1.0).result(1.0)
    finally:
        peer.close()


def test_port_in_use_is_an_os_error(tmp_path: Path) -> None:
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    try:
        port = blocker.getsockname()[1]
        tuning = RaftTuning(bind_retries=2, bind_retry_s=0.05)
        with pytest.raises(OSError, match="cannot bind"):
            RaftPeer(
                f"127.0.0.1:{port}", [], tmp_path, *_noop_app(), tuning=tuning, password=TEST_SECRET
            )
    finally:
        blocker.close()


def test_peer_without_leader_refuses_with_no_hint(tmp_path: Path) -> None:
    # A member of a three-node cluster whose partners never start: no leader, ever.
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    app = ListApp()
    peer = RaftPeer(
        addresses[0], addresses[1:], tmp_path, app.apply, app.take_snapshot,
        app.restore_snapshot, tuning=FAST, password=TEST_SECRET,
    )  # fmt: skip
    try:
        time.sleep(0.5)
        with pytest.raises(NotLeader) as raised:
            peer.propose(b"x", 1.0).result(1.0)
        assert raised.value.leader_address is None
        assert peer.status()["state"] in ("follower", "candidate")
    finally:
        peer.close()


async def test_propose_async_bridges_to_the_event_loop(tmp_path: Path) -> None:
    app = ListApp()
    # Built off the loop: _solo waits for leadership by sleeping, which would stall a peer
    # ticked on this loop (RAFTWAL_RAFT_TICK_ON_LOOP=1; it then runs a loop of its own).
    peer = await asyncio.to_thread(_solo, tmp_path, app)
    try:
        results = [await peer.propose_async(f"c{n}".encode(), 5.0) for n in range(5)]
        assert results == [f"ok:c{n}".encode() for n in range(5)]
    finally:
        peer.close()


async def test_peer_ticked_on_the_callers_event_loop(tmp_path: Path) -> None:
    app = ListApp()
    applied_on: set[int] = set()

    def apply(command: bytes, index: int) -> bytes:
        applied_on.add(threading.get_ident())
        return app.apply(command, index)

    port = free_ports(1)[0]
    peer = RaftPeer(
        f"127.0.0.1:{port}",
        [],
        tmp_path,
        apply,
        app.take_snapshot,
        app.restore_snapshot,
        tuning=dataclasses.replace(FAST, tick_on_event_loop=True),
        password=TEST_SECRET,
    )
    try:
        deadline = time.monotonic() + scaled(10.0)
        while not peer.is_leader() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert peer.is_leader()
        results = [await peer.propose_async(f"c{n}".encode(), 5.0) for n in range(5)]
        assert results == [f"ok:c{n}".encode() for n in range(5)]
        # Proposed from another thread too (the ticker is woken through the loop).
        future = await asyncio.to_thread(peer.propose, b"other", 5.0)
        assert await asyncio.wrap_future(future) == b"ok:other"
        assert await peer.read_index_async(5.0) >= 1
        # Every tick ran here: no tick thread.
        assert applied_on == {threading.get_ident()}
        assert not [t for t in threading.enumerate() if t.name.startswith("raft-")]
    finally:
        peer.close()
    assert peer.status()["closed"]


def test_wakeup_never_gets_stuck_armed_under_concurrent_notifies() -> None:
    # Regression: disarming before draining could swallow a byte written by a racing
    # notify(), leaving the notifier armed over an empty pipe: no proposal woke the tick
    # thread any more (each waited for the poll timeout).
    from pysyncobj.poller import createPoller

    from raft._pysyncobj_glue import Wakeup

    poller = createPoller("auto")
    wakeup = Wakeup(poller)
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            wakeup.notify()

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            poller.poll(0.001)
    finally:
        stop.set()
        thread.join(5.0)
    try:
        poller.poll(0)  # consume whatever the hammer left
        stuck = 0
        for _ in range(20):
            wakeup.notify()
            started = time.monotonic()
            poller.poll(0.5)
            if time.monotonic() - started > 0.25:
                stuck += 1
        assert stuck == 0, f"{stuck} of 20 notifications did not wake the poll"
    finally:
        wakeup.close()
