"""Fixtures for SDK tests: fake Coordinator nodes on real grpc.aio servers (127.0.0.1, port
0), stopped at the end of every test, and an address where nothing listens."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.sdk.fake_coordinator import FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def dead_address() -> str:
    """127.0.0.1:PORT with no listener (the port was free a moment ago): connecting is
    refused, as with a node killed with -9."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"
