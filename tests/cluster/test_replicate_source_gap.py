"""A replication target that needs entries its source no longer holds (issue 49, item 2):
the replicator says so instead of retrying a read of a deleted LSN forever.

Two one-node dev clusters, east and west. East's pchannel has written enough for its
retention (by size) to delete its first segments; only then is west attached as its
target. West holds nothing, so it needs east's LSN 1, which is gone. Before, the
replicator's read raised KeyError, was retried every few seconds for ever, and nothing
said why west stayed empty. Now `raftwal replicate status` says `source_gap` with the
LSNs (exit status 1), the owner's metric `raftwal_replicate_source_gap` is 1 (the
RaftwalReplicationSourceGap alert's), ClusterStatus warns, and nothing is written to west.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, wait_assigned, wait_nodes_up
from tests.timing import scaled, wait_for

pytestmark = pytest.mark.cluster

PCHANNEL = "gap_0"


@pytest.fixture(scope="module")
def clusters(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dev.LocalCluster, dev.LocalCluster]]:
    retention = {
        **os.environ,
        "RAFTWAL_SEGMENT_MAX_BYTES": "8192",
        "RAFTWAL_WAL_RETENTION_BYTES": "16384",
        "RAFTWAL_WAL_RETENTION_CHECK_MS": "300",
    }
    east = dev.up(
        tmp_path_factory.mktemp("east"), 1, timeout_s=scaled(120), env=retention, cluster_id="east"
    )
    try:
        west = dev.up(tmp_path_factory.mktemp("west"), 1, timeout_s=scaled(120), cluster_id="west")
        try:
            yield east, west
        finally:
            west.stop_all()
    finally:
        east.stop_all()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", *args],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )


def test_a_target_that_needs_deleted_entries_is_reported_not_retried_blindly(
    clusters: tuple[dev.LocalCluster, dev.LocalCluster], tmp_path: Path
) -> None:
    east, west = clusters
    east_api, west_api = Api(east.endpoints), Api(west.endpoints)
    for client in (east_api, west_api):
        wait_nodes_up(client, count=1)
        client.call("CreateChannels", api.CreateChannelsRequest(names=[PCHANNEL]))
    east_api.call("CreateVChannel", api.CreateVChannelRequest(name="orders", pchannel=PCHANNEL))
    wait_assigned(east_api, PCHANNEL)

    # Enough for several 8 KiB segments, of which retention keeps about 16 KiB.
    producer = Producer(east_api, PCHANNEL, "app")
    history = History()
    for number in range(80):
        assert producer.send("orders", [b"%04d" % number + b"x" * 500], history, budget_s=60)
    producer.close()

    def floor() -> int:
        status = east_api.call("ClusterStatus", api.ClusterStatusRequest())
        return next((r.deleted_before_lsn for r in status.retention if r.pchannel == PCHANNEL), 0)

    first_kept = wait_for("east's retention deleting its first segments", floor, 60)
    assert first_kept > 1

    (tmp_path / "replicate.toml").write_text(
        "\n".join(
            f'[[clusters]]\nid = "{name}"\nendpoints = {json.dumps(local.endpoints)}\n'
            f'pchannels = ["{PCHANNEL}"]\n'
            for name, local in (("east", east), ("west", west))
        )
        + '\n[[topology]]\nsource = "east"\ntarget = "west"\n'
    )
    done = _cli("replicate", "set", "--json", str(tmp_path / "replicate.toml"))
    assert done.returncode == 0, done.stderr

    def stopped_row() -> tuple[dict[str, object], int] | None:
        status = _cli("replicate", "status", "--json", "--endpoints", ",".join(east.endpoints))
        if not status.stdout:
            return None
        (row,) = json.loads(status.stdout)["pchannels"]
        return (row, status.returncode) if row.get("state") == "source_gap" else None

    row, code = wait_for("replicate status saying source_gap", stopped_row, 60, 1.0)
    assert code == 1
    assert row["needed_lsn"] == 1
    assert int(row["source_first_lsn"]) >= first_kept  # type: ignore[call-overload]
    assert row["target_checkpoint_lsn"] == 0

    # The owner's metric (what RaftwalReplicationSourceGap fires on).
    owner_id, _, _ = wait_assigned(east_api, PCHANNEL)
    port = east.node(owner_id).metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        gaps = {
            (s.labels["pchannel"], s.labels["target"]): s.value
            for family in text_string_to_metric_families(page.read().decode())
            for s in family.samples
            if s.name == "raftwal_replicate_source_gap"
        }
    assert gaps == {(PCHANNEL, "west"): 1.0}, gaps
    warnings = east_api.call("ClusterStatus", api.ClusterStatusRequest()).warnings
    assert any(
        f"replication of pchannel {PCHANNEL} to cluster west is stopped" in w for w in warnings
    ), warnings

    # Nothing was skipped to get going: west holds none of east's entries.
    time.sleep(1.0)
    status = west_api.call("ClusterStatus", api.ClusterStatusRequest())
    (owner,) = [o for m in status.members for o in m.owners if o.pchannel == PCHANNEL]
    assert owner.last_lsn == 1, owner  # its term start, and nothing replicated
