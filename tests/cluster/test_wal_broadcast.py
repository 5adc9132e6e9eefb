"""Broadcast delivery on a real three-node cluster: a broadcast to vchannels on two
pchannels, under an EXCLUSIVE resource key, is appended to both exactly once across a kill
-9 of the Raft leader, and its key is released once every vchannel acked."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from tests.cluster.conftest import Api, leader_id, running_cluster
from tests.cluster.wal_helpers import consume_all, setup_channels, wait_assigned, wait_nodes_up

pytestmark = pytest.mark.cluster
E = errors_pb2


@pytest.fixture()
def wal_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    directory: Path = tmp_path_factory.mktemp("bcast")
    env = dict(os.environ)
    env["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(directory, env) as running:
        yield running


def test_broadcast_delivered_once_across_leader_kill_and_keys_released(wal_cluster) -> None:
    cluster, client = wal_cluster
    pchannels = setup_channels(client, "bc", {"bc_a": 0, "bc_b": 1})
    for pchannel in pchannels:
        wait_assigned(client, pchannel)
    key = pb.ResourceKey(key="db/orders", mode=pb.LOCK_MODE_EXCLUSIVE)
    created = client.call(
        "Broadcast",
        api.BroadcastRequest(
            request_id=uuid.uuid4().hex,
            message=b"create collection orders",
            msg_type="create_collection",
            vchannels=["bc_a", "bc_b"],
            resource_keys=[key],
            idempotency_key="ddl-1",
        ),
    )
    broadcast_id = created.broadcast_id
    # A conflicting broadcast is refused while the key is held.
    with pytest.raises(grpc.RpcError) as raised:
        client.call(
            "Broadcast",
            api.BroadcastRequest(
                request_id=uuid.uuid4().hex,
                message=b"drop",
                vchannels=["bc_a"],
                resource_keys=[key],
            ),
        )
    assert from_rpc_error(raised.value).code == E.RESOURCE_ACQUIRED
    cluster.kill(leader_id(client))
    found = {}
    for vchannel, pchannel in (("bc_a", pchannels[0]), ("bc_b", pchannels[1])):
        entries = consume_all(client, vchannel, pchannel, expect=1, timeout_s=60)
        delivered = [e for e in entries if e.broadcast_id == broadcast_id]
        assert len(delivered) == 1, f"{vchannel}: {delivered}"
        assert delivered[0].payload == b"create collection orders"
        assert delivered[0].msg_type == "create_collection"
        found[vchannel] = delivered[0].lsn
    for vchannel, lsn in found.items():
        reply = client.call(
            "Ack",
            api.AckRequest(
                request_id=uuid.uuid4().hex,
                broadcast_id=broadcast_id,
                vchannel=vchannel,
                checkpoint=lsn,
            ),
        )
    assert reply.state == pb.BROADCAST_STATE_TOMBSTONE
    wait_nodes_up(client, 2)
    lease = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=10_000, holder="t"))
    held = client.call(
        "Lock",
        api.LockRequest(
            request_id=uuid.uuid4().hex,
            key="db/orders",
            mode=pb.LOCK_MODE_EXCLUSIVE,
            lease_id=lease.lease_id,
        ),
    )
    assert held.fencing_token > 0
    # Still exactly one copy on each vchannel after everything settled.
    for vchannel, pchannel in (("bc_a", pchannels[0]), ("bc_b", pchannels[1])):
        entries = consume_all(client, vchannel, pchannel, expect=1, timeout_s=30)
        assert [e.lsn for e in entries if e.broadcast_id == broadcast_id] == [found[vchannel]]
