"""Flow control of cross-cluster replication (ClusterConfig.replicate_max_lag_ms,
docs/replication.md "Flow control"): a real `ChannelOwner` (three real `PChannelLog`s,
fsync on, the loopback replicas of `test_wal_owner_recovery`) with a real replicator's
admission check (`_Replicator.admit`), whose target's answers the test gives.

- while the oldest committed entry the target does not hold is older than the bound and
  the target keeps acknowledging, client writes wait, and resume in their order once the
  target confirms;
- a target that stopped acknowledging (FLOW_STALLED_S) is not waited for: a standby that
  is down never stops the source;
- a retry of a batch already written is answered without waiting."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from raftwal.node import replicator as r
from tests.timing import scaled
from tests.unit.test_replicator_pipeline import _replicator
from tests.wal.test_wal_owner_producer_order import _batch, _owner, _until, _written_sequences
from tests.wal.test_wal_owner_recovery import NODES, _open_logs
from wal_segments.owner import ChannelOwner

TIMEOUT_S = scaled(20.0)
BOUND_S = 0.2


@pytest.fixture
async def logs(tmp_path):
    async for opened in _open_logs(tmp_path, NODES):
        yield opened


async def _lagging(logs) -> tuple[ChannelOwner, r._Replicator]:  # type: ignore[no-untyped-def]
    """An owner holding batch 1, with a replicator's flow control whose target holds
    nothing, once batch 1 is older than the bound."""
    owner, _ = await _owner(logs)
    replicator = _replicator(checkpoint=0)
    try:
        await asyncio.wait_for(owner.write(_batch(1), producer_id="p", sequence=1), TIMEOUT_S)
        owner.add_admission(replicator, functools.partial(replicator.admit, owner, BOUND_S))
        await _until(lambda: owner.commit_age_s(replicator.confirmed) > BOUND_S, "a lag")
    except BaseException:
        await owner.close()
        raise
    return owner, replicator


async def test_writes_wait_while_an_acknowledging_target_lags_and_resume_in_order(logs) -> None:
    owner, replicator = await _lagging(logs)
    try:
        replicator.acked_at = time.monotonic()
        second = asyncio.create_task(owner.write(_batch(2), producer_id="p", sequence=2))
        third = asyncio.create_task(owner.write(_batch(3), producer_id="p", sequence=3))
        # Held for several polls, the target acknowledging meanwhile.
        for _ in range(4):
            replicator.acked_at = time.monotonic()
            await asyncio.sleep(r.FLOW_POLL_S)
        assert not second.done() and not third.done()
        assert _written_sequences(owner.log) == [1]
        assert replicator.held_writes == 1  # the first in line waits; the rest behind it
        # A retry of batch 1 (already written) is answered at once.
        _, duplicate = await asyncio.wait_for(
            owner.write(_batch(1), producer_id="p", sequence=1), scaled(1.0)
        )
        assert duplicate
        # The target confirms what it holds: the held writes go on, in their order.
        replicator.confirmed = owner.committed_lsn
        replicator.moved.set()
        replicator.moved.clear()
        await asyncio.wait_for(asyncio.gather(second, third), TIMEOUT_S)
        assert _written_sequences(owner.log) == [1, 2, 3]
        assert replicator.held_s > 0
    finally:
        await owner.close()


async def test_a_target_that_stopped_acknowledging_is_not_waited_for(logs) -> None:
    owner, replicator = await _lagging(logs)
    try:
        # The target answered nothing for longer than FLOW_STALLED_S: writes go on.
        replicator.acked_at = time.monotonic() - r.FLOW_STALLED_S - 1
        await asyncio.wait_for(owner.write(_batch(2), producer_id="p", sequence=2), TIMEOUT_S)
        assert replicator.held_writes == 0
        # It acknowledges again (still lagging): the next write waits, and once the target
        # stops answering while it waits, it goes on within FLOW_STALLED_S.
        replicator.acked_at = time.monotonic()
        started = time.monotonic()
        await asyncio.wait_for(owner.write(_batch(3), producer_id="p", sequence=3), TIMEOUT_S)
        assert replicator.held_writes == 1
        assert time.monotonic() - started >= r.FLOW_STALLED_S - 0.1
        assert _written_sequences(owner.log) == [1, 2, 3]
        # Removed (the replicator stopped): nothing holds writes any more.
        owner.remove_admission(replicator)
        replicator.acked_at = time.monotonic() + 3600
        await asyncio.wait_for(owner.write(_batch(4), producer_id="p", sequence=4), TIMEOUT_S)
        assert replicator.held_writes == 1
    finally:
        await owner.close()
