"""An exactly-once shard's recovery log under WAL retention.

The recovery log is the only copy of a shard's store history (there are no store
snapshots): a new owner on another disk rebuilds the store by replaying it from its first
record. Retention must therefore never delete it. Here a cluster deletes every committed
segment beyond 4 KiB per pchannel (4 KiB segments), checked every half second; a shard applies 1,200
messages in transactions of 10 (over a hundred recovery records, many segments), retention
visibly runs on the source pchannel, and a new owner on an empty disk still rebuilds the
exact store.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from rpc.shards_client import Shard, recovery_names
from rpc.streaming_client import StreamingClient
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.shard_app import Counters
from tests.cluster.test_shards import _check_exactly_once, _produce
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.timing import scaled

pytestmark = pytest.mark.cluster

SEGMENT_BYTES = 4 * 1024
RETENTION_BYTES = 4 * 1024
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    env = {
        **os.environ,
        "RAFTWAL_NODE_TIMEOUT_MS": "2000",
        "RAFTWAL_SEGMENT_MAX_BYTES": str(SEGMENT_BYTES),
        "RAFTWAL_WAL_RETENTION_BYTES": str(RETENTION_BYTES),
        "RAFTWAL_WAL_RETENTION_CHECK_MS": "500",
    }
    with running_cluster(tmp_path_factory.mktemp("shard-retention"), env) as running:
        yield running


def _floor(client: Api, pchannel: str) -> int:
    rows = {row.pchannel: row for row in client.status().retention}
    return rows[pchannel].deleted_before_lsn if pchannel in rows else 0


def test_retention_never_deletes_a_recovery_log(tight, tmp_path: Path) -> None:
    cluster, api_client = tight
    (source,) = setup_channels(api_client, "rr", {"rr_v": 0})
    wait_assigned(api_client, source)
    rlog_pchannel, _ = recovery_names("rr", "rr_v")
    rng = random.Random(5)

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("rr", ["rr_v"])
            acked = await _produce(client, "rr_v", 1200, rng)
            first = Shard(
                client,
                Counters(),
                "rr",
                "rr_v",
                store_path=tmp_path / "first.sqlite",
                member_id="first",
                token=5,
                commit_as_member=False,
                max_batch_messages=10,
            )
            second = Shard(
                client,
                Counters(),
                "rr",
                "rr_v",
                store_path=tmp_path / "second.sqlite",
                member_id="second",
                token=9,
                commit_as_member=False,
            )
            try:
                await first.recover()
                applied = 0
                while applied < len(acked):
                    applied += await first.run_once()
                _check_exactly_once(tmp_path / "first.sqlite", acked)
                # The shard's position moved the source's floor: retention ran there.
                deadline = time.monotonic() + scaled(TIMEOUT_S)
                while _floor(api_client, source) == 0:
                    assert time.monotonic() < deadline, "retention never ran on the source"
                    await first.run_once()
                    await asyncio.sleep(0.5)
                await asyncio.sleep(2.0)  # a few more retention rounds
                rows = {row.pchannel: row for row in api_client.status().retention}
                assert rows[rlog_pchannel].committed_segments > 2, rows[rlog_pchannel]
                assert _floor(api_client, rlog_pchannel) == 0, "the recovery log lost records"
                # A new owner on an empty disk rebuilds the exact store from the log.
                status = await second.recover()
                assert status.replayed_records >= 100
                _check_exactly_once(tmp_path / "second.sqlite", acked)
            finally:
                await first.close()
                await second.close()

    asyncio.run(scenario())
