"""Idempotent producers' state outlives retention and moves with the log (issue 49,
item 2): a real `ChannelOwner` over three real `PChannelLog`s, reached through the
loopback transport of `test_wal_owner_recovery`.

The bug: a producer's newest sequence lived only in the entries of its newest batch. On a
replication target the replicator's producer (``rw.replicate/<cluster>/<pchannel>``)
writes only while the source does; once the segment holding its last batch was deleted by
retention and the pchannel changed owner, `producer_checkpoint` answered (0, 0), and the
replicator resent everything from source LSN 1: duplicates on the standby (or, where the
source had deleted those entries, a replicator that stopped without a word). Now an owner
writes its producers' state into the log at the start of every segment it opens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.timing import scaled
from tests.wal.test_wal_atomic_batches import Network, message, serving, until
from tests.wal.test_wal_owner_recovery import NODES, PCHANNEL, _open_logs
from wal_segments.log import PChannelLog
from wal_segments.owner import ChannelOwner, OwnerConfig

REPLICATED = "rw.replicate/east/wal_0"
PLAIN = "producer-1"
DAY_MS = 24 * 3600 * 1000


class Clock:
    """The owners' wall clock (ms), moved by the test."""

    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


def owner_on(
    logs: dict[str, PChannelLog],
    network: Network,
    node: str,
    term: int,
    clock: Clock,
    **config: int,
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
        wall_ms=clock,
    )


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[dict[str, PChannelLog]]:
    async for opened in _open_logs(tmp_path, NODES):
        yield opened


async def retention_past(owner: ChannelOwner, logs: dict[str, PChannelLog]) -> int:
    """Seal the open segment, let an idle time tick open the next one, and delete every
    segment before it on every replica (as DeleteSegmentsBefore does once the retention
    window passed). Returns the first LSN left."""
    await owner.seal_now()
    sealed = owner.log.last_lsn
    await until("the time tick", lambda: owner.advance_time_tick(0.0))
    await until("the next segment", lambda: owner.log.open_segment_first_lsn() is not None)
    last = owner.log.last_lsn
    assert last > sealed
    await until("the tick committed", lambda: owner.committed_lsn >= last)
    await until(
        "every replica holding the tick",
        lambda: all(log.last_lsn >= last for log in logs.values()),
    )
    floor = owner.log.open_segment_first_lsn()
    assert floor is not None
    for log in logs.values():
        await log.wait_sealed()
        await log.delete_before(floor)
        assert log.first_lsn == floor, (log.first_lsn, floor)
    return floor


async def test_a_target_checkpoint_survives_retention_and_an_owner_change(logs):
    """The replicator's producer wrote its last batch (source LSN 1200); the pchannel
    then idled past retention (its segment deleted on every replica) and moved to n2."""
    network, clock = Network(logs), Clock()
    owner1 = await serving(owner_on(logs, network, "n1", 1, clock))
    try:
        await owner1.write(
            [message(b"r1"), message(b"r2")],
            producer_id=REPLICATED,
            sequence=1200,
            previous_sequence=0,
        )
        await owner1.write([message(b"p")], producer_id=PLAIN, sequence=7)
        written = owner1.log.last_lsn
        floor = await retention_past(owner1, logs)
        assert floor > written  # the batches' entries are gone everywhere
    finally:
        await owner1.close()

    owner2 = await serving(owner_on(logs, network, "n2", 2, clock))
    try:
        sequence, _ = await asyncio.wait_for(owner2.producer_checkpoint(REPLICATED), scaled(10))
        assert sequence == 1200
        # The plain producer's retry of its last batch is still a duplicate.
        _, duplicate = await owner2.write([message(b"p")], producer_id=PLAIN, sequence=7)
        assert duplicate
        # And the replicator continues exactly after its checkpoint.
        _, duplicate = await owner2.write(
            [message(b"r3")], producer_id=REPLICATED, sequence=1201, previous_sequence=1200
        )
        assert not duplicate
    finally:
        await owner2.close()


async def test_an_idle_producer_expires_but_a_replicated_one_does_not(logs):
    """Past producer_expiry_ms (one day here) without a write, a plain producer is
    forgotten, counted, and stays forgotten at the next owner; the replicated producer
    (a standby's checkpoint) is kept however long the source is idle."""
    network, clock = Network(logs), Clock()
    owner1 = await serving(owner_on(logs, network, "n1", 1, clock, producer_expiry_ms=DAY_MS))
    try:
        await owner1.write(
            [message(b"r1")], producer_id=REPLICATED, sequence=10, previous_sequence=0
        )
        await owner1.write([message(b"p")], producer_id=PLAIN, sequence=3)
        assert owner1.producer_count() == 2
        clock.now_ms += 2 * DAY_MS
        # The next producer-state entry (the segment that retention needs) expires it.
        await retention_past(owner1, logs)
        assert owner1.producer_count() == 1
        assert owner1.producers_expired["timeout"] == 1
        assert await owner1.producer_checkpoint(PLAIN) == (0, 0)
    finally:
        await owner1.close()

    owner2 = await serving(owner_on(logs, network, "n2", 2, clock, producer_expiry_ms=DAY_MS))
    try:
        assert owner2.producer_count() == 1
        assert (await owner2.producer_checkpoint(REPLICATED))[0] == 10
        assert await owner2.producer_checkpoint(PLAIN) == (0, 0)
        # Forgotten: its old sequence is a new batch again.
        _, duplicate = await owner2.write([message(b"p")], producer_id=PLAIN, sequence=3)
        assert not duplicate
    finally:
        await owner2.close()


async def test_past_the_bound_the_least_recently_written_producer_is_forgotten(logs):
    """Bounded: max_producers (3 here); the replicated producer is never the one to go."""
    network, clock = Network(logs), Clock()
    owner = await serving(owner_on(logs, network, "n1", 1, clock, max_producers=3))
    try:
        await owner.write([message(b"r")], producer_id=REPLICATED, sequence=5, previous_sequence=0)
        for name in ("a", "b"):
            await owner.write([message(name.encode())], producer_id=name, sequence=1)
        await owner.write([message(b"a2")], producer_id="a", sequence=2)  # a is recent again
        await owner.write([message(b"c")], producer_id="c", sequence=1)
        assert owner.producer_count() == 3
        assert owner.producers_expired["capacity"] == 1
        assert await owner.producer_checkpoint("b") == (0, 0)
        assert (await owner.producer_checkpoint("a"))[0] == 2
        assert (await owner.producer_checkpoint(REPLICATED))[0] == 5
    finally:
        await owner.close()
