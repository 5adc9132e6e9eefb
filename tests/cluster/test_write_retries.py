"""A write retried after an unknown outcome is applied once, by every raw-stub client.

The demo's `_Client` retried CreateVChannel after a DEADLINE_EXCEEDED without a request id:
when the first attempt had committed, the retry was refused with ALREADY_EXISTS and the demo
stopped (issue 35). Here a real one-node cluster commits the first attempt and the client is
told DEADLINE_EXCEEDED anyway (a client interceptor drops the answer, as a deadline that
expires just after the commit does); the retry must get the stored answer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from rpc.request_ids import is_write, with_request_id
from tests.cluster.conftest import running_cluster


class _LostAnswer(grpc.RpcError):
    """What the client sees when its deadline expires after the server committed."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "Deadline Exceeded (answer dropped by the test after the commit)"

    def trailing_metadata(self) -> tuple[()]:
        return ()


class _DropFirstAnswer(grpc.UnaryUnaryClientInterceptor):
    """Lets the first call of `method` reach the server and complete, then reports a lost
    answer; records every request of `method` it saw."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.requests: list[Any] = []

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        outcome = continuation(client_call_details, request)
        if client_call_details.method.endswith("/" + self.method):
            copy = type(request)()
            copy.CopyFrom(request)
            self.requests.append(copy)
            if len(self.requests) == 1:
                outcome.result()  # the server answered: the write is committed
                raise _LostAnswer()
        return outcome


def test_with_request_id_stamps_writes_once_and_leaves_reads_alone() -> None:
    original = api.CreateVChannelRequest(name="v", pchannel="p")
    write = with_request_id(original)
    assert len(write.request_id) == 32
    assert write.name == "v" and write.pchannel == "p"
    # The caller's message is left alone: sending it again is another logical call.
    assert original.request_id == ""
    assert with_request_id(original).request_id != write.request_id
    assert with_request_id(write).request_id == write.request_id
    own = with_request_id(api.GrantLeaseRequest(request_id="mine", ttl_ms=1000))
    assert own.request_id == "mine"
    assert not is_write(api.ClusterStatusRequest())
    assert with_request_id(api.ClusterStatusRequest()) == api.ClusterStatusRequest()


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_demo_client_retries_a_committed_create_vchannel_to_success(tmp_path: Path) -> None:
    from raftwal.cli.demo import _Client

    with running_cluster(tmp_path, nodes=1, timeout_s=120) as (cluster, _api):
        client = _Client(cluster.endpoints)
        dropper = _DropFirstAnswer("CreateVChannel")
        channels = [
            grpc.intercept_channel(grpc.insecure_channel(e), dropper) for e in cluster.endpoints
        ]
        client._stubs = [coordinator_pb2_grpc.CoordinatorStub(c) for c in channels]
        try:
            client.call("CreateChannels", api.CreateChannelsRequest(prefix="retry", count=1))
            reply = client.call(
                "CreateVChannel", api.CreateVChannelRequest(name="once", pchannel="retry_0")
            )
        finally:
            for channel in channels:
                channel.close()
            client.close()
        assert reply.vchannel.name == "once", reply
        assert len(dropper.requests) == 2, dropper.requests
        first, retry = dropper.requests
        assert first.request_id and first.request_id == retry.request_id, (
            f"the retry carried request id {retry.request_id!r}; expected the first "
            f"attempt's {first.request_id!r}"
        )
