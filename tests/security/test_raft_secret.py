"""The Raft transport secret on a real cluster: bytes sent to
a Raft port without the secret (among them a pickle that would run code if it were
unpickled) are never applied and leave the nodes up, and a node started with a wrong
secret never gets a Raft connection: it cannot join, campaign or send anything the others
apply, and it never learns their state while they go on without it.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import struct
import time
import urllib.request
import uuid
import zlib
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from raftwal.node.config import NodeConfig
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from tests.cluster.conftest import Api, converged, leader_id
from tests.timing import scaled

pytestmark = pytest.mark.cluster
CALL_TIMEOUT_S = scaled(5.0)
# Several Raft election timeouts (0.4-1.2 s) and reconnection attempts of the intruder.
INTRUDER_WATCH_S = 6.0


class _RunsCode:
    """Unpickling this creates `marker`: proof that a node unpickled what it was sent."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def _send_raw(address: str, frames: list[bytes]) -> None:
    """Each frame on a connection of its own: a node hangs up on the first frame it cannot
    decrypt (a later send on that connection then fails with EPIPE or ECONNRESET, which
    is the node doing its job, not a test failure)."""
    host, port = address.rsplit(":", 1)
    for frame in frames:
        with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT_S) as sock:
            try:
                # pysyncobj's framing: a native int length, then the (normally encrypted)
                # body.
                sock.sendall(struct.pack("i", len(frame)) + frame)
                time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):
                pass


def _member(endpoint: str) -> api.MemberStatus:
    with grpc.insecure_channel(endpoint) as channel:
        reply = coordinator_pb2_grpc.NodeManagerStub(channel).CollectStatus(
            api.CollectStatusRequest(), timeout=CALL_TIMEOUT_S
        )
    return reply.member


def _partners_connected(node: NodeConfig) -> dict[str, float]:
    """Raft address -> 1.0 when `node`'s Raft transport to that partner is connected."""
    url = f"http://{node.host}:{node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=CALL_TIMEOUT_S) as response:
        text = response.read().decode()
    return {
        sample.labels["partner"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "raftwal_raft_partner_connected"
        for sample in family.samples
    }


def test_raft_port_without_the_secret_is_ignored(tmp_path: Path) -> None:
    local = dev.up(tmp_path / "raft", 3, timeout_s=60)
    client = Api(local.endpoints)
    try:
        assert (local.directory / dev.SECRET_FILE).stat().st_size > 0
        before = converged(client)
        marker = tmp_path / f"unpickled-{uuid.uuid4().hex}"
        evil = zlib.compress(pickle.dumps(_RunsCode(marker)), 3)
        for node in local.config.nodes:
            _send_raw(node.raft_address, [evil, os.urandom(200), b"\x00" * 16])
        after = converged(client)
        assert not marker.exists(), "a node unpickled bytes sent without the secret"
        assert after.revision == before.revision, "bytes without the secret changed the state"
        assert all(local.processes[n.id].poll() is None for n in local.config.nodes)

        # A node restarted empty with a wrong secret: it dials its partners, none lets it in.
        members = [n for n in local.config.nodes if n.id != leader_id(client)]
        intruder = members[-1]
        local.kill(intruder.id)
        shutil.rmtree(intruder.data_dir)
        healthy_ids = {n.id for n in local.config.nodes if n.id != intruder.id}
        others = Api([local.node(n).grpc_address for n in sorted(healthy_ids)])
        try:
            start = others.status()
            local.start_node(intruder.id, extra_env={"RAFTWAL_SECRET": "not-the-cluster-secret"})
            deadline = time.monotonic() + INTRUDER_WATCH_S
            made = 0
            while time.monotonic() < deadline:
                others.call(
                    "CreateChannels", api.CreateChannelsRequest(prefix=f"raft_{made}", count=1)
                )
                made += 1
                time.sleep(0.5)
            end = others.status()
            alone = _member(intruder.grpc_address)
            connected = {n.id: _partners_connected(n) for n in local.config.nodes}
        finally:
            others.close()
        healthy = [m for m in end.members if m.node_id in healthy_ids]
        assert end.revision > start.revision and made > 0
        # The others went on together without it, connected to each other only.
        assert all(m.reachable and m.revision > start.revision for m in healthy), healthy
        for node_id in healthy_ids:
            mate = local.node(next(n for n in healthy_ids if n != node_id)).raft_address
            assert connected[node_id] == {mate: 1.0, intruder.raft_address: 0.0}, connected
        # It never got a Raft connection (pysyncobj does not even campaign without one), so
        # it never learned anything: term 0, no leader, nothing applied.
        assert set(connected[intruder.id].values()) == {0.0}, connected
        assert (alone.raft_term, alone.revision, alone.applied_index) == (0, 0, 0)
        assert not alone.is_leader
        assert local.processes[intruder.id].poll() is None
    finally:
        client.close()
        local.stop_all()
