"""The metrics port as an attacker sees it (plain sockets and HTTP, no credentials): half-sent
requests held open by the hundred and then dropped at once cost the cluster no leader
change and no write, a normal scrape still answers within a second, and the endpoint
closes what it will not serve (too many connections, too slow, too large).

The default run holds 1,000 connections against the leader's endpoint for a few seconds;
`RELIABILITY.md` records the figures of this run.
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from tests.timing import scaled

pytestmark = pytest.mark.cluster

CALL_TIMEOUT_S = scaled(5.0)
HALF_OPEN = 1000
# raftwal.node.metrics_http defaults.
READ_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8192


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    local = dev.up(tmp_path_factory.mktemp("metricsport"), 3, timeout_s=60)
    try:
        yield local
    finally:
        local.stop_all()


def _status(endpoints: list[str]) -> api.ClusterStatusResponse:
    for endpoint in endpoints:
        with grpc.insecure_channel(endpoint) as channel, contextlib.suppress(grpc.RpcError):
            return coordinator_pb2_grpc.CoordinatorStub(channel).ClusterStatus(
                api.ClusterStatusRequest(), timeout=CALL_TIMEOUT_S
            )
    raise AssertionError("no node answered ClusterStatus")


LATENCIES_S: list[float] = []


def _write(stub: coordinator_pb2_grpc.CoordinatorStub, name: str) -> None:
    started = time.monotonic()
    stub.CreateChannels(
        api.CreateChannelsRequest(prefix=name, count=1, request_id=uuid.uuid4().hex),
        timeout=CALL_TIMEOUT_S,
    )
    LATENCIES_S.append(time.monotonic() - started)


def _scrape(node: dev.NodeConfig, path: str = "/metrics") -> tuple[float, str]:
    started = time.monotonic()
    url = f"http://{node.host}:{node.metrics_port}{path}"
    with urllib.request.urlopen(url, timeout=CALL_TIMEOUT_S) as response:
        text = response.read().decode()
    return time.monotonic() - started, text


def _endpoint_refusals(node: dev.NodeConfig) -> dict[str, float]:
    _, text = _scrape(node)
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "raftwal_metrics_endpoint_refusals"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_half_open_connections_by_the_thousand_cost_nothing(cluster: dev.LocalCluster) -> None:
    status = _status(cluster.endpoints)
    leader = cluster.node(status.leader_node_id)
    term = max(m.raft_term for m in status.members)
    leader_stub_channel = grpc.insecure_channel(leader.grpc_address)
    stub = coordinator_pb2_grpc.CoordinatorStub(leader_stub_channel)
    held: list[socket.socket] = []
    writes = failures = 0
    scrape_s: list[float] = []
    try:
        for index in range(HALF_OPEN):
            try:
                sock = socket.create_connection(
                    (leader.host, leader.metrics_port), timeout=scaled(2)
                )
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
                held.append(sock)
            except OSError:
                pass  # refused or reset at once: the endpoint's cap doing its job
            if index % 50 == 0:
                try:
                    _write(stub, f"halfopen{index}")
                    writes += 1
                except grpc.RpcError:
                    failures += 1
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                _write(stub, "held")
                writes += 1
            except grpc.RpcError:
                failures += 1
            scrape_s.append(_scrape(leader)[0])
            time.sleep(0.1)
    finally:
        for sock in held:  # all at once
            sock.close()
        leader_stub_channel.close()
    with grpc.insecure_channel(leader.grpc_address) as channel:
        after = time.monotonic() + 3.0
        while time.monotonic() < after:
            try:
                _write(coordinator_pb2_grpc.CoordinatorStub(channel), "after")
                writes += 1
            except grpc.RpcError:
                failures += 1
            time.sleep(0.1)
    final = _status(cluster.endpoints)
    final_term = max(m.raft_term for m in final.members)
    print(
        f"metrics port: {len(held)} of {HALF_OPEN} half-open connections accepted, "
        f"{writes} writes, {failures} failed, longest write {max(LATENCIES_S):.3f} s, "
        f"scrape max {max(scrape_s):.3f} s, "
        f"term {term} -> {final_term}"
    )
    assert failures == 0
    assert (final_term, final.leader_node_id) == (term, leader.id), "no leader change"
    assert max(scrape_s) < 1.0, scrape_s
    assert _endpoint_refusals(leader)["too_many_connections"] > 0


def test_slow_large_and_wrong_requests_are_closed(cluster: dev.LocalCluster) -> None:
    node = cluster.config.nodes[0]
    before = _endpoint_refusals(node)
    with socket.create_connection((node.host, node.metrics_port), timeout=scaled(10)) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        slow.settimeout(READ_TIMEOUT_S + 3)
        started = time.monotonic()
        assert slow.recv(1024) == b"", "a request not finished in time is closed unanswered"
        assert READ_TIMEOUT_S - 1 <= time.monotonic() - started <= READ_TIMEOUT_S + 3
    with socket.create_connection((node.host, node.metrics_port), timeout=scaled(10)) as large:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            large.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (2 * MAX_REQUEST_BYTES))
        answer = large.recv(1024)
        assert answer.startswith(b"HTTP/1.1 431"), answer
    with pytest.raises(urllib.error.HTTPError) as missing:
        _scrape(node, "/nosuch")
    assert missing.value.code == 404
    after = _endpoint_refusals(node)
    assert after["read_timeout"] >= before["read_timeout"] + 1
    assert after["request_too_large"] >= before["request_too_large"] + 1
    elapsed, text = _scrape(node)
    assert "raftwal_raft_term" in text and elapsed < 1.0
