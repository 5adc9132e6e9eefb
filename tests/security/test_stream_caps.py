"""Long-lived streams are capped per node and per caller (issue 40, item 3).

The audit opened 4,088 WatchEvents streams on one node in 63 s with the reader role and
was never refused. Now WatchEvents, WatchAssignments, the lease KeepAlive stream and
Consume are each capped per node (``max_node_streams``) and per caller
(``max_identity_streams``: per token or client certificate, else per network host);
stream N+1 past a cap gets RESOURCE_EXHAUSTED with an ErrorInfo naming the setting, and
is counted in ``raftwal_stream_refusals_total{method,scope}``. A closed stream gives its
slot back.

One node from ``dev up --secure`` (tokens per role) with small caps, driven through the
generated stubs.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import wait_nodes_up
from tests.timing import scaled

pytestmark = pytest.mark.cluster
E = errors_pb2
NODE_CAP = 6
IDENTITY_CAP = 4
SETTLE_S = 0.5


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, str]]:
    env = {
        **os.environ,
        "RAFTWAL_MAX_NODE_STREAMS": str(NODE_CAP),
        "RAFTWAL_MAX_IDENTITY_STREAMS": str(IDENTITY_CAP),
    }
    local = dev.up(tmp_path_factory.mktemp("streamcaps"), 1, timeout_s=60, env=env, secure=True)
    admin = Api(local.endpoints, local.client_security("admin"))
    try:
        wait_nodes_up(admin, 1)
        admin.call("CreateChannels", api.CreateChannelsRequest(prefix="cap", count=1))
        (pchannel,) = [p.name for p in admin.status().pchannels if p.name.startswith("cap")]
        admin.call("CreateVChannel", api.CreateVChannelRequest(name="cap_v", pchannel=pchannel))
        yield local, local.endpoints[0]
    finally:
        admin.close()
        local.stop_all()


def _refused(error: grpc.RpcError, scope_setting: str) -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error.code(), error.details())
    info = from_rpc_error(error)
    assert info.code == E.RESOURCE_EXHAUSTED, info
    assert scope_setting in info.message, info.message


class _Opener:
    """Opens one stream of a capped method; `.held` keeps the open ones."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
        self.streaming = streaming_pb2_grpc.StreamingNodeStub(channel)
        self.held: list[Any] = []

    def open(self, method: str) -> Any:
        """The call, open on the node (its first answer read where the method sends one)."""
        if method == "WatchEvents":
            call = self.coordinator.WatchEvents(api.WatchEventsRequest(from_revision=0))
            next(call)
        elif method == "WatchAssignments":
            call = self.coordinator.WatchAssignments(api.WatchAssignmentsRequest())
            next(call)
        elif method == "KeepAlive":
            # No request: the stream stays open until the client ends it.
            call = self.coordinator.KeepAlive(_silent_requests())
        else:
            call = self.streaming.Consume(
                wire.ConsumeRequest(vchannel="cap_v", policy=wire.DELIVER_POLICY_LATEST)
            )
        self.held.append(call)
        return call

    def refused(self, method: str) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as raised:
            if method == "KeepAlive":
                call = self.coordinator.KeepAlive(
                    iter([api.KeepAliveRequest(lease_id=1)]), timeout=scaled(10)
                )
                list(call)
            elif method == "Consume":
                call = self.streaming.Consume(
                    wire.ConsumeRequest(vchannel="cap_v", policy=wire.DELIVER_POLICY_LATEST),
                    timeout=scaled(10),
                )
                next(call)
            elif method == "WatchEvents":
                next(self.coordinator.WatchEvents(api.WatchEventsRequest(), timeout=scaled(10)))
            else:
                next(
                    self.coordinator.WatchAssignments(
                        api.WatchAssignmentsRequest(), timeout=scaled(10)
                    )
                )
        return raised.value

    def close(self) -> None:
        for call in self.held:
            call.cancel()
        self.held.clear()


def _silent_requests(hold_s: float = 30.0) -> Iterator[api.KeepAliveRequest]:
    """A request stream that sends nothing for `hold_s` (the stream stays open)."""
    time.sleep(hold_s)
    yield from ()


def _metric(local: dev.LocalCluster, name: str) -> float:
    """The value of the sample `name` (with its labels) on the node's metrics page."""
    port = local.config.nodes[0].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)) as page:
        text = page.read().decode()
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    return 0.0


@pytest.mark.parametrize("method", ["WatchEvents", "WatchAssignments", "KeepAlive", "Consume"])
def test_stream_past_the_caps_is_refused(node, method: str) -> None:
    local, address = node
    if method == "Consume":
        # StreamingNode lives on the node's data worker, whose port has caps of its own.
        address = local.worker_addresses(local.config.nodes[0].id)[0]
    with (
        local.client_security("reader" if method != "KeepAlive" else "producer").channel(
            address
        ) as first_channel,
        local.client_security("admin").channel(address) as second_channel,
    ):
        first, second = _Opener(first_channel), _Opener(second_channel)
        try:
            for _ in range(IDENTITY_CAP):
                first.open(method)
            time.sleep(SETTLE_S)
            # N + 1 for this caller: refused, whatever the node has left.
            _refused(first.refused(method), "max_identity_streams")
            # Another caller fills the node's cap, then is refused by it.
            for _ in range(NODE_CAP - IDENTITY_CAP):
                second.open(method)
            time.sleep(SETTLE_S)
            _refused(second.refused(method), "max_node_streams")
            # A closed stream gives its slot back.
            first.held.pop().cancel()
            time.sleep(SETTLE_S)
            second.open(method)
        finally:
            first.close()
            second.close()
    identity = _metric(
        local, f'raftwal_stream_refusals_total{{method="{method}",scope="identity"}}'
    )
    node_scope = _metric(local, f'raftwal_stream_refusals_total{{method="{method}",scope="node"}}')
    assert identity >= 1 and node_scope >= 1, (identity, node_scope)
