"""`raftwal dev`'s cluster config picks every port a node binds, from the range the test
suite gives each worker when there is one; its waits stretch by the time scale."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from raftwal.cli import dev


def test_every_port_of_every_node_is_picked_and_distinct(tmp_path: Path) -> None:
    # A node binding port 0 (the transfer port's default) takes a kernel-chosen port,
    # which could be one picked for another node that has not bound it yet.
    config = dev.make_config(tmp_path, 4, data_nodes=1)
    ports = [
        port
        for node in config.nodes
        for port in (node.grpc_port, node.raft_port, node.metrics_port, node.transfer_port)
    ]
    assert all(port > 0 for port in ports), ports
    assert len(set(ports)) == len(ports), ports


def test_ports_come_from_the_range_and_skip_a_port_in_use(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The suite gives each parallel worker a range of its own (tests/conftest.py): picks
    # stay inside it, are distinct, and skip a port someone holds.
    monkeypatch.setenv(dev.PORT_RANGE_ENV, "32100-32109")
    monkeypatch.setattr(dev, "_range_cursor", 32100)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 32101))
        held.listen()
        ports = dev.free_ports(5)
    assert 32101 not in ports, ports
    assert len(set(ports)) == 5 and all(32100 <= p <= 32109 for p in ports), ports
    # The next pick goes on after the last one rather than handing the same ports out again
    # to a cluster that has not bound them yet.
    assert dev.free_ports(1)[0] not in ports


def test_a_range_too_small_or_malformed_is_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(dev.PORT_RANGE_ENV, "32100-32101")
    with pytest.raises(RuntimeError, match="only 2 of 3 ports free"):
        dev.free_ports(3)
    monkeypatch.setenv(dev.PORT_RANGE_ENV, "80-90")
    with pytest.raises(ValueError, match=r"invalid RAFTWAL_PORT_RANGE \('80-90'; expected"):
        dev.free_ports(1)


def test_the_time_scale_stretches_waits(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(dev.TIME_SCALE_ENV, raising=False)
    assert dev.scaled(10) == 10
    monkeypatch.setenv(dev.TIME_SCALE_ENV, "3")
    assert dev.scaled(10) == 30
    monkeypatch.setenv(dev.TIME_SCALE_ENV, "0")
    with pytest.raises(ValueError, match=r"invalid RAFTWAL_TEST_TIME_SCALE \('0'; expected"):
        dev.time_scale()
