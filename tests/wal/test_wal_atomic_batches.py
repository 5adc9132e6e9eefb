"""A producer's write batch is all or nothing in every log (issue 49, item 1): a real
`ChannelOwner` over three real `PChannelLog`s (segment files, fsync on), reached through
the loopback transport of `test_wal_owner_recovery`, which applies fences, fetches and
appends with the same log calls as the Replication service.

The bug these tests pin down: the producer's sequence rides on a batch's last entry only,
and a replica may hold a prefix of a batch (a torn tail kept its first frames, a catch-up
chunk ended inside it). A new owner that adopted such a log committed the prefix without
the sequence; the producer's retry then looked new and its first entries were written a
second time. Now every entry of a batch but its last is flagged BATCH_CONTINUES, a new
owner drops a flagged tail, and the commit point only ever moves to a batch's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rpc.protos import streaming_pb2 as wire
from tests.timing import scaled
from tests.wal.test_wal_owner_recovery import NODES, PCHANNEL, Loopback, _open_logs, _Stream
from wal_segments import mutations
from wal_segments.format import EntryFlags, MsgType
from wal_segments.log import PChannelLog
from wal_segments.owner import ChannelOwner, Message, OwnerConfig, WalError

PRODUCER = "producer-1"
BATCH = [b"b0", b"b1", b"b2", b"b3"]


def message(payload: bytes) -> Message:
    return Message(vchannel_id=1, msg_type=int(MsgType.MESSAGE), payload=payload)


class Network(Loopback):
    """The loopback transport, with nodes that can go away and come back, and replicas
    that answer fences as this version's Replication service does."""

    def __init__(self, logs: dict[str, PChannelLog]) -> None:
        super().__init__(logs)
        #: node id -> how many appends carrying frames it still applies (None: all)
        self.append_budget: dict[str, int] = {}

    async def fence(self, node_id: str, request: wire.FenceRequest) -> wire.FenceResponse:
        reply = await super().fence(node_id, request)
        if "batch_frames" in wire.FenceResponse.DESCRIPTOR.fields_by_name:
            reply.batch_frames = True
        return reply

    def open_append(self, node_id: str) -> _Stream:
        return _LinkStream(self._reach(node_id), self, node_id)


class _LinkStream(_Stream):
    """An Append stream over a link that breaks when its node goes down, and that applies
    only the first `append_budget[node]` requests carrying frames, if the test set one,
    and then never answers again (a replica whose link stalled mid catch-up)."""

    def __init__(self, log: PChannelLog, network: Network, node_id: str) -> None:
        super().__init__(log)
        self._network, self._node_id = network, node_id

    async def write(self, request: wire.AppendRequest) -> None:
        if self._node_id in self._network.down:
            self.cancel()
            return
        budget = self._network.append_budget.get(self._node_id)
        if request.frames and budget is not None:
            if budget <= 0:
                return
            self._network.append_budget[self._node_id] = budget - 1
        await super().write(request)


def new_owner(
    logs: dict[str, PChannelLog], network: Network, node: str, term: int, **config: int
) -> ChannelOwner:
    return ChannelOwner(
        pchannel=PCHANNEL,
        term=term,
        node_id=node,
        replica_node_ids=[n for n in NODES if n != node],
        log=logs[node],
        transport=network,
        proposer=network,
        config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0, **config),
    )


async def serving(owner: ChannelOwner) -> ChannelOwner:
    owner.start()
    await asyncio.wait_for(owner.ready.wait(), scaled(20))
    return owner


async def until(what: str, check, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + scaled(timeout_s)
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not within {scaled(timeout_s):.0f} s")
        await asyncio.sleep(0.01)


def data_payloads(log: PChannelLog, through: int) -> list[bytes]:
    """The payloads of the producers' entries (not the WAL's own) of `log` through LSN
    `through`."""
    return [
        entry.payload
        for entry in log.iter_entries(log.first_lsn, through)
        if entry.vchannel_id and entry.msg_type == MsgType.MESSAGE
    ]


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[dict[str, PChannelLog]]:
    async for opened in _open_logs(tmp_path, NODES):
        yield opened


async def prefix_then_retry(logs: dict[str, PChannelLog]) -> list[bytes]:
    """The interleaving of issue 49: n1 at term 1 appends batch B (b0..b3, sequence 2) and
    only b0, b1 reach n2 before n1 loses power; no acknowledgement went out. n2 owns term
    2 with n3 (n1 is down), adopting its own log as the most up to date; the producer
    retries B with sequence 2. Returns the producers' payloads of n2's committed log."""
    network = Network(logs)
    owner1 = await serving(new_owner(logs, network, "n1", 1))
    await owner1.write([message(b"a")], producer_id=PRODUCER, sequence=1)
    n1, n2 = logs["n1"], logs["n2"]
    first = n1.last_lsn + 1
    await until(
        "every replica holding a", lambda: all(log.last_lsn == first - 1 for log in logs.values())
    )

    network.down = frozenset({"n2", "n3"})
    pending = asyncio.create_task(
        owner1.write([message(p) for p in BATCH], producer_id=PRODUCER, sequence=2)
    )
    await until("batch B in n1's log", lambda: n1.last_lsn == first + len(BATCH) - 1)
    # A catch-up chunk that ended inside B reached n2: its first two entries.
    prefix = n1.read_frames(first, 1 << 20, first + 1)
    result = await n2.append(1, first - 1, n1.term_at(first - 1), prefix)
    await n2.wait_durable(result)
    assert n2.last_lsn == first + 1

    # n1 loses power: its owner stops, and B was never acknowledged.
    await owner1.close()
    with pytest.raises(WalError):
        await pending

    network.down = frozenset({"n1"})
    owner2 = await serving(new_owner(logs, network, "n2", 2))
    try:
        positions, duplicate = await owner2.write(
            [message(p) for p in BATCH], producer_id=PRODUCER, sequence=2
        )
        assert not duplicate
        assert len(positions) == len(BATCH)
        return data_payloads(n2, owner2.committed_lsn)
    finally:
        await owner2.close()


async def test_a_surviving_prefix_of_a_batch_is_dropped_and_the_retry_written_once(logs):
    assert await prefix_then_retry(logs) == [b"a", *BATCH]


async def test_the_non_atomic_batch_mutation_brings_the_duplicate_back(logs):
    """`raftwal simulate --mutation non-atomic-batch` switches the rule above off: the
    prefix survives and the retry writes b0 and b1 again (what the simulation must find)."""
    with mutations.enabled(["non-atomic-batch"]):
        payloads = await prefix_then_retry(logs)
    assert payloads == [b"a", b"b0", b"b1", *BATCH]


async def test_the_commit_point_never_stops_inside_a_batch(logs):
    """n3 is down and n2 catches up one entry per request (replication_chunk_bytes of 1,
    no batch left in the owner's memory): once n2 holds the first two entries of a four-
    entry batch, a majority ({n1, n2}) holds them, but the batch is not whole anywhere but
    on n1. The commit point must stay at the end of the batch before it."""
    network = Network(logs)
    owner = await serving(
        new_owner(logs, network, "n1", 1, replication_chunk_bytes=1, recent_cache_bytes=1)
    )
    try:
        await owner.write([message(b"a")], producer_id=PRODUCER, sequence=1)
        before = owner.committed_lsn
        await until(
            "every replica holding a", lambda: all(log.last_lsn == before for log in logs.values())
        )
        network.down = frozenset({"n2", "n3"})
        first = logs["n1"].last_lsn + 1
        batch = asyncio.create_task(
            owner.write([message(p) for p in BATCH], producer_id=PRODUCER, sequence=2)
        )
        # A second batch pushes the first out of the owner's memory: n2 gets it from the
        # log, in chunks of one entry.
        await until("batch B appended", lambda: logs["n1"].last_lsn == first + len(BATCH) - 1)
        later = asyncio.create_task(owner.write([message(b"c")], producer_id="other", sequence=1))
        await until("batch C appended", lambda: logs["n1"].last_lsn == first + len(BATCH))
        network.append_budget["n2"] = 2
        network.down = frozenset({"n3"})
        await until(
            "n2 holding two entries of B",
            lambda: owner.replica_positions().get("n2", 0) >= first + 1,
        )
        assert logs["n2"].last_lsn == first + 1
        # Give the owner every chance to (wrongly) move the commit point.
        await asyncio.sleep(0.2)
        assert owner.committed_lsn == before, (owner.committed_lsn, before, first)
        assert logs["n2"].committed_lsn <= before
        assert not batch.done()
        later.cancel()
        batch.cancel()
    finally:
        await owner.close()


async def test_every_entry_of_a_batch_but_the_last_says_more_follows(logs):
    """The flag on disk, and a transaction's batch ([begin, body..., commit]) keeps its
    own flags beside it."""
    network = Network(logs)
    owner = await serving(new_owner(logs, network, "n1", 1))
    try:
        positions, _ = await owner.write(
            [message(p) for p in BATCH], producer_id=PRODUCER, sequence=1
        )
        txn = [
            Message(1, int(MsgType.TXN_BEGIN), flags=int(EntryFlags.TXN_BEGIN), txn_id=7),
            Message(
                1, int(MsgType.MESSAGE), payload=b"t", flags=int(EntryFlags.TXN_BODY), txn_id=7
            ),
            Message(1, int(MsgType.TXN_COMMIT), flags=int(EntryFlags.TXN_COMMIT), txn_id=7),
        ]
        txn_positions, _ = await owner.write(txn)
        flags = {
            entry.lsn: entry.flags
            for entry in logs["n1"].iter_entries(positions[0][0], txn_positions[-1][0])
        }
        more = int(EntryFlags.BATCH_CONTINUES)
        assert [bool(flags[lsn] & more) for lsn, _ in positions] == [True, True, True, False]
        assert [flags[lsn] for lsn, _ in txn_positions] == [
            int(EntryFlags.TXN_BEGIN) | more,
            int(EntryFlags.TXN_BODY) | more,
            int(EntryFlags.TXN_COMMIT),
        ]
    finally:
        await owner.close()
