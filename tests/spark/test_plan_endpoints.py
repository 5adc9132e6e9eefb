"""The driver's calls to the cluster (`spark_connector.plan._on_any`) against real gRPC
servers on 127.0.0.1 that answer as a cluster does while it has no leader (UNAVAILABLE
with NOT_LEADER, for a while), with a definite error, or not at all. A read must ride out
an election, fail at once on a definite error, and give up after `timeoutSeconds`."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from rpc.errors import E, error_info, to_status
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from spark_connector.options import parse_options
from spark_connector.plan import ConnectorError, _on_any
from tests.timing import scaled


class _Coordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """ListSegments fails with `failure` for its first `failing` calls, then answers."""

    def __init__(self, failing: int, failure: int) -> None:
        self.failing = failing
        self.failure = failure
        self.calls = 0
        self.lock = threading.Lock()

    def ListSegments(self, request, context):  # noqa: N802 - gRPC's name
        with self.lock:
            self.calls += 1
            failing = self.calls <= self.failing
        if failing:
            context.abort_with_status(to_status(error_info(self.failure, "test: no leader yet")))
        return api.ListSegmentsResponse(revision=7)


def _serve(servicer: _Coordinator) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def servers() -> Iterator[Callable[..., tuple[_Coordinator, str]]]:
    """Starts coordinators (failing calls, failure code) and stops them after the test."""
    started: list[grpc.Server] = []

    def make(failing: int, failure: int = E.NOT_LEADER) -> tuple[_Coordinator, str]:
        servicer = _Coordinator(failing, failure)
        server, endpoint = _serve(servicer)
        started.append(server)
        return servicer, endpoint

    yield make
    for server in started:
        server.stop(None)


def _list(stub: coordinator_pb2_grpc.CoordinatorStub) -> api.ListSegmentsResponse:
    return stub.ListSegments(api.ListSegmentsRequest(), timeout=scaled(2))


def test_rides_out_an_election(servers) -> None:
    # Every node answers NOT_LEADER for its first two calls (three rounds in all); one
    # endpoint is down for good.
    first, one = servers(2)
    second, two = servers(2)
    options = parse_options({"endpoints": f"{_closed_port()},{one},{two}", "timeoutSeconds": "20"})
    assert _on_any(options, _list).revision == 7
    assert (first.calls, second.calls) == (3, 2)


def test_definite_error_is_raised_at_once(servers) -> None:
    servicer, endpoint = servers(10, E.INVALID_ARGUMENT)
    options = parse_options({"endpoints": endpoint, "timeoutSeconds": "20"})
    started = time.monotonic()
    with pytest.raises(ConnectorError, match="INVALID_ARGUMENT"):
        _on_any(options, _list)
    assert servicer.calls == 1 and time.monotonic() - started < 5


def test_gives_up_after_the_timeout(servers) -> None:
    servicer, endpoint = servers(10**6)
    options = parse_options({"endpoints": f"{endpoint},{_closed_port()}", "timeoutSeconds": "1.5"})
    started = time.monotonic()
    with pytest.raises(ConnectorError, match=r"no endpoint answered in 1.5 s .*NOT_LEADER"):
        _on_any(options, _list)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 6 and servicer.calls >= 2
