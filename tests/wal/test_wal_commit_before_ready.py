"""Nothing is committed before its term is ready: a real `ChannelOwner` over four real
`PChannelLog`s (segment files, fsync on), reached through the loopback transport of
`test_wal_owner_recovery`.

The history (found by ``raftwal simulate``, seeds 2831, 3941 and 6575 of the issue 50
run): p's first term never became ready. Its owner n1 wrote the term start at lsn 1 and
n2 held it, a majority of {n1, n2, n3}, so the owner counted it committed and told n2;
n2 served it to a consumer as committed. Then the replica set changed to {n2, n3, n4}.
No term had been ready yet, so the new owner's recovery needed no quorum of the first
set (`stable_replica_node_ids` is empty): it fenced n3 and n4, both empty, and wrote its
own term start at lsn 1. The entry readers had seen as committed was gone, and n2, which
held it as committed, refused to truncate it: it never caught up again.

The rule: a term's owner announces its commit point (to its own log's readers and to its
replicas) only once PChannelReady for that term is committed. Recovery fences a quorum of
the last *ready* replica set, so only what a ready term counted on a majority survives
every later recovery (docs/architecture.md, the fencing argument).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rpc.protos import streaming_pb2 as wire
from tests.timing import scaled
from tests.wal.test_wal_owner_recovery import PCHANNEL, Loopback, _open_logs, _Stream, terms
from wal_segments.format import MsgType
from wal_segments.log import PChannelLog
from wal_segments.owner import ChannelOwner, Message, OwnerConfig

NODES = ("n1", "n2", "n3", "n4")


class _NoReady(Loopback):
    """A coordination plane that never answers PChannelReady (its leader is cut off), and
    whose assignment of the term it stands for can be superseded."""

    def __init__(self, logs: dict[str, PChannelLog], down: frozenset[str]) -> None:
        super().__init__(logs, down)
        self.asked = asyncio.Event()
        self.superseded = False
        #: the commit point each Append request told a replica, in the order sent
        self.announced: list[int] = []

    def open_append(self, node_id: str) -> _Stream:
        stream = super().open_append(node_id)
        write = stream.write

        async def recorded(request: wire.AppendRequest) -> None:
            self.announced.append(request.committed_lsn)
            await write(request)

        stream.write = recorded  # type: ignore[method-assign]
        return stream

    async def pchannel_ready(self, pchannel: str, term: int, start_lsn: int) -> int:
        self.asked.set()
        await asyncio.sleep(0.05)
        raise ConnectionError("raft: no leader reachable")

    def still_assigned(self, pchannel: str, term: int) -> bool:
        return not self.superseded


def owner_of(
    logs: dict[str, PChannelLog],
    transport: Loopback,
    node: str,
    term: int,
    replicas: list[str],
) -> ChannelOwner:
    return ChannelOwner(
        pchannel=PCHANNEL,
        term=term,
        node_id=node,
        replica_node_ids=replicas,
        log=logs[node],
        transport=transport,
        proposer=transport,
        config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0),
    )


async def until(what: str, check, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + scaled(timeout_s)
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not within {scaled(timeout_s):.0f} s")
        await asyncio.sleep(0.01)


def served_as_committed(log: PChannelLog) -> int:
    """What a Consume on this node serves as committed when it does not own the pchannel
    (``_ReplicaSource.committed`` in raftwal/services/streaming_node.py)."""
    return min(log.committed_lsn, log.last_lsn)


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[dict[str, PChannelLog]]:
    async for opened in _open_logs(tmp_path, NODES):
        yield opened


async def test_a_term_that_never_became_ready_announces_no_commit_point(logs):
    """n1 owns the first term with {n1, n2, n3} (n3 and n4 are away); its term start is
    durable on n1 and n2, a majority, but PChannelReady never commits. Neither log may
    serve it as committed; then a new owner with the set {n2, n3, n4}, fencing only n3
    and n4, takes lsn 1 for its own term start, and n2 must converge on that log."""
    n1, n2 = logs["n1"], logs["n2"]
    first = _NoReady(logs, frozenset({"n3", "n4"}))
    owner1 = owner_of(logs, first, "n1", 1, ["n2", "n3"])
    owner1.start()
    try:
        await asyncio.wait_for(first.asked.wait(), scaled(10))
        await until("n2 holding the term start", lambda: n2.last_lsn == 1)
        await until("the owner counting it on a majority", lambda: owner1.committed_lsn == 1)
        # ... but announcing it nowhere while its term is not ready: neither on its own
        # log nor in what it sends n2 afterwards (a heartbeat at least once a second).
        sent = len(first.announced)
        await until("another request to n2", lambda: len(first.announced) > sent)
        assert set(first.announced) == {0}
        assert served_as_committed(n1) == 0
        assert served_as_committed(n2) == 0
    finally:
        first.superseded = True
        await owner1.close()

    # The set changes before any term was ready: the new owner needs no quorum of the
    # first set. n1 is gone; n2 is away while n3 and n4 are fenced.
    second = Loopback(logs, frozenset({"n1", "n2"}))
    owner2 = owner_of(logs, second, "n3", 2, ["n2", "n4"])
    owner2.start()
    try:
        await asyncio.wait_for(owner2.ready.wait(), scaled(20))
        assert owner2.start_lsn == 1
        message = Message(vchannel_id=1, msg_type=int(MsgType.MESSAGE), payload=b"m")
        positions, _ = await owner2.write([message])
        assert second.ready == [(2, 1)]
        # n2 comes back: it drops the term start of term 1, never committed, and takes
        # the new owner's log.
        second.down = frozenset({"n1"})
        await until("n2 converging on the owner's log", lambda: terms(n2) == terms(logs["n3"]))
        assert terms(n2)[0] == (1, 2)
        await until(
            "n2 learning the commit point",
            lambda: served_as_committed(n2) >= positions[-1][0],
        )
    finally:
        await owner2.close()
