"""A Raft leader frozen past the node timeout (SIGSTOP: a VM pause, a stalled host) and then
resumed judges nobody on the silence it saw, on a real three-node cluster.

While it is frozen the two others elect a leader, mark it DOWN and move its pchannels.
When it resumes, its coordinator wakes with heartbeats that are seconds old and, for a
moment, still believes it leads. It must mark no other node DOWN and move no pchannel:
neither by proposing as a leader it no longer is (its commands must not be forwarded to the
new leader) nor while it still leads after a freeze (it takes over afresh, every node
getting a full timeout). The check is the Raft-applied state: the other nodes keep their
registration (a DOWN and back would register them again) and every pchannel that did not
belong to the frozen node keeps its owner and term (rebalancing is off, or the resumed
node would rightly get its share back).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api, leader_id, running_cluster
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.timing import scaled, wait_for

pytestmark = pytest.mark.cluster

NODE_TIMEOUT_MS = 2000
# How long the state is watched after the resume for a verdict the frozen node should not
# have given: its stale tick runs within milliseconds of the resume.
WATCH_S = 3.0


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[dev.LocalCluster, Api]]:
    env = dict(os.environ)
    env["RAFTWAL_NODE_TIMEOUT_MS"] = str(NODE_TIMEOUT_MS)
    with running_cluster(tmp_path / "frozen", env) as running:
        yield running


def _status(client: Api, endpoint: str) -> api.ClusterStatusResponse | None:
    try:
        return client.stub(endpoint).ClusterStatus(api.ClusterStatusRequest(), timeout=scaled(5.0))
    except grpc.RpcError:
        return None


def _placement(status: api.ClusterStatusResponse, names: list[str]) -> dict[str, tuple[str, int]]:
    return {
        c.name: (c.owner_node_id, c.term)
        for c in status.pchannels
        if c.name in names and c.state == pb.PCHANNEL_STATE_ASSIGNED
    }


def test_a_resumed_frozen_leader_marks_no_other_node_down(cluster) -> None:
    local, client = cluster
    client.call("SetBalancePolicy", api.SetBalancePolicyRequest(allow_rebalance=False))
    names = setup_channels(client, "frz", {f"frz_v{i}": i for i in range(6)})
    for name in names:
        wait_assigned(client, name)
    frozen = leader_id(client)
    others = [n.id for n in local.config.nodes if n.id != frozen]
    endpoint = {n.id: n.grpc_address for n in local.config.nodes}
    pid = local.pid(frozen)
    assert pid is not None
    dev.signal_node(pid, signal.SIGSTOP)
    try:
        # The others take over: a new leader, the frozen node DOWN, its pchannels moved.
        def taken_over() -> api.ClusterStatusResponse | None:
            status = _status(client, endpoint[others[0]])
            if status is None or status.leader_node_id not in others:
                return None
            down = {n.node_id for n in status.nodes if n.state != pb.NODE_STATE_UP}
            placement = _placement(status, names)
            moved = len(placement) == len(names) and all(
                owner != frozen for owner, _ in placement.values()
            )
            return status if down == {frozen} and moved else None

        # By then it has been frozen longer than the node timeout: the new leader marks it
        # DOWN only a full timeout after taking over.
        before = wait_for("the others took over from the frozen leader", taken_over, 60)
    finally:
        dev.signal_node(pid, signal.SIGCONT)
    registered = {n.node_id: n.registered_revision for n in before.nodes if n.node_id in others}
    placement = _placement(before, names)

    def back() -> bool:
        status = _status(client, endpoint[frozen])
        if status is None or status.leader_node_id in ("", frozen):
            return False
        return all(n.state == pb.NODE_STATE_UP for n in status.nodes)

    wait_for("the resumed node follows the new leader and is UP again", back, 60)
    watch_until = time.monotonic() + WATCH_S
    while True:
        status = _status(client, endpoint[others[0]])
        assert status is not None
        now_registered = {
            n.node_id: n.registered_revision for n in status.nodes if n.node_id in others
        }
        assert now_registered == registered, (
            f"a node the frozen leader could not hear was marked DOWN and registered again: "
            f"{registered} -> {now_registered}"
        )
        now = {c.name: (c.owner_node_id, c.term) for c in status.pchannels if c.name in names}
        changed = {
            name: (placement[name], now.get(name))
            for name in names
            if now.get(name) != placement[name]
        }
        assert not changed, f"pchannels moved after the frozen leader resumed: {changed}"
        if time.monotonic() >= watch_until:
            break
        time.sleep(0.2)
