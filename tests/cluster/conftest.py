"""Fixtures for cluster tests: real `raftwal node` processes on 127.0.0.1 with free ports.

Every cluster is stopped by pid at the end of its test or module; no test signals anything
it did not start. `converged()` is the check every cluster test ends with: all reachable
replicas at the same revision with the same state digest.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.credentials import ClientSecurity
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from rpc.request_ids import with_request_id
from tests.timing import scaled


class Api:
    """A test client: plain gRPC stubs per endpoint, following NOT_LEADER and failing over
    on UNAVAILABLE, bounded in attempts and time. Returns (response) or raises RpcError.
    `security` (TLS, token) is used for every channel, also those of the WAL helpers."""

    def __init__(self, endpoints: list[str], security: ClientSecurity | None = None) -> None:
        self.endpoints = endpoints
        self.security = security or ClientSecurity()
        self.channels = {e: self.security.channel(e) for e in endpoints}

    def stub(self, endpoint: str) -> coordinator_pb2_grpc.CoordinatorStub:
        return coordinator_pb2_grpc.CoordinatorStub(self.channels[endpoint])

    def call(self, method: str, request, *, endpoint: str | None = None, timeout_s: float = 15.0):
        # One request id for every attempt: a retried write is answered, not re-applied.
        request = with_request_id(request)
        deadline = time.monotonic() + scaled(timeout_s)
        order = [endpoint] if endpoint else []
        order += [e for e in self.endpoints if e not in order]
        attempt = 0
        last: grpc.RpcError | None = None
        while time.monotonic() < deadline and attempt < 200:
            target = order[attempt % len(order)]
            attempt += 1
            try:
                return getattr(self.stub(target), method)(request, timeout=scaled(5.0))
            except grpc.RpcError as error:
                last = error
                info = from_rpc_error(error)
                retryable = error.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ) or info.code in (
                    errors_pb2.NOT_LEADER,
                    errors_pb2.ON_SHUTDOWN,
                    errors_pb2.UNKNOWN,
                )
                if not retryable:
                    raise
                if info.leader_hint and info.leader_hint in self.channels:
                    order.insert(attempt % len(order), info.leader_hint)
                time.sleep(0.05)
        assert last is not None
        raise last

    def status(self, endpoint: str | None = None) -> api.ClusterStatusResponse:
        return self.call("ClusterStatus", api.ClusterStatusRequest(), endpoint=endpoint)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


def converged(
    client: Api, expect_members: int = 3, timeout_s: float = 20.0
) -> api.ClusterStatusResponse:
    """Wait until `expect_members` replicas are reachable at one revision and one digest."""
    deadline = time.monotonic() + scaled(timeout_s)
    status = None
    while time.monotonic() < deadline:
        try:
            status = client.status()
        except grpc.RpcError:
            time.sleep(0.2)
            continue
        reachable = [m for m in status.members if m.reachable]
        revisions = {m.revision for m in reachable}
        digests = {m.state_digest for m in reachable}
        if len(reachable) >= expect_members and len(revisions) == 1 and len(digests) == 1:
            return status
        time.sleep(0.2)
    members = (
        [(m.node_id, m.reachable, m.revision, m.state_digest[:12]) for m in status.members]
        if status
        else None
    )
    raise AssertionError(f"replicas did not converge within {timeout_s} s: {members}")


def leader_id(client: Api, timeout_s: float = 15.0) -> str:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        try:
            status = client.status()
            if status.leader_node_id:
                return status.leader_node_id
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise AssertionError("no leader elected")


def rid() -> str:
    return uuid.uuid4().hex


@contextlib.contextmanager
def running_cluster(
    directory: Path,
    env: dict[str, str] | None = None,
    nodes: int = 3,
    data_nodes: int = 0,
    timeout_s: float = 60.0,
) -> Iterator[tuple[dev.LocalCluster, Api]]:
    """`nodes` nodes (the last `data_nodes` of them not voting) started in `directory`
    (with `env` for their settings) and a test client; both stopped on exit. For modules
    that need a cluster of their own."""
    local = dev.up(directory, nodes, timeout_s=timeout_s, env=env, data_nodes=data_nodes)
    client = Api(local.endpoints)
    try:
        yield local, client
    finally:
        client.close()
        local.stop_all()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("cluster")
    local = dev.up(directory, 3, timeout_s=60)
    try:
        yield local
    finally:
        local.stop_all()


@pytest.fixture(scope="module")
def client(cluster: dev.LocalCluster) -> Iterator[Api]:
    api_client = Api(cluster.endpoints)
    try:
        yield api_client
    finally:
        api_client.close()
