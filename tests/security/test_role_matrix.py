"""Every role against every method, as the role table of docs/operations.md states it.

One secure dev cluster (TLS, client certificates, a bearer token per role). For each method
of every service (enumerated from the service descriptors, so a new method without a line
here fails the test) and each caller (no token, each user role, the node token), one call
with an empty request over grpc's generic API. The call is either refused before the
servicer (UNAUTHENTICATED, or PERMISSION_DENIED naming the method) or reaches it (any other
answer: OK, INVALID_ARGUMENT for the empty request, a deadline for a stream that waits).

The expected table below is written from docs/operations.md, not from
``raftwal.node.security``: the two are independent statements of the same policy, and this
test holds them together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2, streaming_pb2
from tests.timing import scaled

pytestmark = pytest.mark.cluster

CALL_TIMEOUT_S = scaled(1.5)
USERS = ("admin", "producer", "consumer", "reader")
CALLERS = ("none", *USERS, "node")

# docs/operations.md, "Security settings": what each role may call.
_METADATA = {
    "Coordinator/DescribeChannels",
    "Coordinator/ListChannels",
    "Coordinator/WatchAssignments",
    "Coordinator/ClusterStatus",
    "Coordinator/ListSegments",
    "Coordinator/ListMembers",
    "Coordinator/WatchEvents",
    "StreamingNode/GetLatestTimeTick",
    "StreamingNode/Seal",
    "StreamingNode/GetReplicateCheckpoint",
}
_LEASES_AND_LOCKS = {
    "Coordinator/GrantLease",
    "Coordinator/KeepAlive",
    "Coordinator/RevokeLease",
    "Coordinator/Lock",
    "Coordinator/Unlock",
    "Coordinator/WaitResourceKey",
    "Coordinator/BatchWrite",
}
_ADMIN_ONLY = {
    "Coordinator/CreateChannels",
    "Coordinator/DropChannels",
    "Coordinator/CreateVChannel",
    "Coordinator/DropVChannel",
    "Coordinator/SetBalancePolicy",
    "Coordinator/SaveSnapshot",
    "Coordinator/ChangeMembership",
    "Coordinator/UpdateReplicateConfiguration",
    "Coordinator/GetReplicateConfiguration",
    "Coordinator/AlterWal",
}
_PRODUCE = {
    "StreamingNode/Produce",
    "StreamingNode/OpenProduce",
    "StreamingNode/BeginTxn",
    "StreamingNode/AppendTxn",
    "StreamingNode/CommitTxn",
    "StreamingNode/RollbackTxn",
    "StreamingNode/KeepAliveTxn",
    "Coordinator/Broadcast",
}
_READ_DATA = {"StreamingNode/Consume", "StreamingNode/ReadSegment"}
_SUBSCRIBE = {
    "Coordinator/CreateSubscription",
    "Coordinator/DropSubscription",
    "Coordinator/CommitSubscription",
    "Coordinator/SeekSubscription",
    "Coordinator/JoinSubscription",
    "Coordinator/LeaveSubscription",
}
_METADATA |= {"Coordinator/ListSubscriptions", "Coordinator/DescribeSubscription"}
_NODE_ONLY_SERVICES = ("NodeManager", "Cluster", "Replication")

EXPECTED: dict[str, set[str]] = {
    "none": set(),
    "admin": _METADATA
    | _LEASES_AND_LOCKS
    | _ADMIN_ONLY
    | _PRODUCE
    | _READ_DATA
    | _SUBSCRIBE
    | {"Coordinator/Ack"},
    "producer": _METADATA | _LEASES_AND_LOCKS | _PRODUCE,
    "consumer": _METADATA | _LEASES_AND_LOCKS | _READ_DATA | _SUBSCRIBE | {"Coordinator/Ack"},
    "reader": _METADATA | _READ_DATA,
    # Node-to-node services, the event history nodes backfill from each other, where a
    # pchannel's log ends (asked of its owner for a subscription's lag or a seek), and the
    # cluster's members (asked by a joining node).
    "node": {
        "Coordinator/WatchEvents",
        "StreamingNode/GetLatestTimeTick",
        "Coordinator/ClusterStatus",
    },
}

SERVICES = [
    coordinator_pb2.DESCRIPTOR.services_by_name[name]
    for name in ("Coordinator", "NodeManager", "Cluster")
] + [streaming_pb2.DESCRIPTOR.services_by_name[name] for name in ("StreamingNode", "Replication")]
METHODS = [method for service in SERVICES for method in service.methods]


def _short(method) -> str:  # type: ignore[no-untyped-def]
    return f"{method.containing_service.name}/{method.name}"


def _allowed(caller: str, method) -> bool:  # type: ignore[no-untyped-def]
    if caller == "node" and method.containing_service.name in _NODE_ONLY_SERVICES:
        return True
    return _short(method) in EXPECTED[caller]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    local = dev.up(tmp_path_factory.mktemp("matrix"), 3, timeout_s=60, secure=True)
    try:
        yield local
    finally:
        local.stop_all()


def _tokens(local: dev.LocalCluster) -> dict[str, str | None]:
    assert local.security is not None
    tokens: dict[str, str | None] = {"none": None}
    for role in USERS:
        tokens[role] = local.security.token_files[role].read_text().strip()
    # The node token is only in the nodes' tokens file (`<role> <token>` lines).
    for line in Path(local.security.auth_tokens_file).read_text().splitlines():
        role, _, token = line.partition(" ")
        if role == "node":
            tokens["node"] = token.strip()
    assert set(tokens) == set(CALLERS)
    return tokens


def _outcome(channel: grpc.Channel, path: str, kind: tuple[bool, bool], token: str | None) -> str:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    try:
        if kind == (False, False):
            channel.unary_unary(path)(b"", timeout=CALL_TIMEOUT_S, metadata=metadata)
        elif kind == (False, True):
            list(channel.unary_stream(path)(b"", timeout=CALL_TIMEOUT_S, metadata=metadata))
        elif kind == (True, False):
            channel.stream_unary(path)(iter([b""]), timeout=CALL_TIMEOUT_S, metadata=metadata)
        else:
            list(
                channel.stream_stream(path)(iter([b""]), timeout=CALL_TIMEOUT_S, metadata=metadata)
            )
    except grpc.RpcError as error:
        info = from_rpc_error(error)
        if error.code() == grpc.StatusCode.UNAUTHENTICATED:
            return "unauthenticated"
        if error.code() == grpc.StatusCode.PERMISSION_DENIED and "may not call" in info.message:
            assert path in info.message, info.message
            return "denied"
    return "reached"


def test_every_role_reaches_exactly_the_methods_the_readme_lists(
    secure: dev.LocalCluster,
) -> None:
    listed = set().union(*EXPECTED.values()) | {
        _short(m) for m in METHODS if m.containing_service.name in _NODE_ONLY_SERVICES
    }
    unlisted = sorted(_short(m) for m in METHODS if _short(m) not in listed)
    assert not unlisted, f"methods missing from the expected role table: {unlisted}"
    tokens = _tokens(secure)
    # TLS with the client certificate, and no token of its own: each call brings one.
    security = dataclasses.replace(secure.client_security("admin"), token=None)
    wrong: list[str] = []
    checked = 0
    with security.channel(secure.endpoints[0]) as channel:
        for method in METHODS:
            path = f"/{method.containing_service.full_name}/{method.name}"
            kind = (method.client_streaming, method.server_streaming)
            for caller in CALLERS:
                got = _outcome(channel, path, kind, tokens[caller])
                if caller == "none":
                    expected = "unauthenticated"
                else:
                    expected = "reached" if _allowed(caller, method) else "denied"
                checked += 1
                if got != expected:
                    wrong.append(f"{caller} -> {_short(method)}: got {got}, expected {expected}")
        # Health needs no token; reflection needs any valid one.
        health = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        assert _outcome(channel, reflection, (True, True), None) == "unauthenticated"
        assert _outcome(channel, reflection, (True, True), tokens["reader"]) == "reached"
    print(f"role x method matrix: {checked - len(wrong)}/{checked} as docs/operations.md states")
    assert not wrong, "\n".join(wrong)
    assert checked == len(METHODS) * len(CALLERS)
