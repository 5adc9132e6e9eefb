"""The nemesis' parts without a cluster: the seeded schedule (deterministic, every requested
kind even in a short run), the per-link proxies (forward, drop silently then resume,
reset; against a local echo server) and the config's per-node peer addresses they need."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from raftwal.chaos.net import ProxyNet
from raftwal.chaos.runner import (
    FAULT_KINDS,
    HOLD_S,
    NODE_TARGETS,
    PARTITION_VARIANTS,
    POWER_TARGETS,
    ChaosOptions,
    parse_duration,
    plan_faults,
)
from raftwal.cli.dev import free_ports
from raftwal.node.config import ConfigError, NodeConfig, parse_config, render_config
from tests.timing import scaled


def test_schedule_is_deterministic_and_covers_every_kind() -> None:
    plan = plan_faults(7, FAULT_KINDS, 35.0)
    assert plan == plan_faults(7, FAULT_KINDS, 35.0)
    assert plan != plan_faults(8, FAULT_KINDS, 35.0)
    assert {f.kind for f in plan[: len(FAULT_KINDS)]} == set(FAULT_KINDS)
    for fault in plan:
        low, high = HOLD_S[fault.kind]
        assert low <= fault.hold_s <= high
        if fault.kind == "partition":
            assert fault.variant in PARTITION_VARIANTS and fault.mode in ("reset", "drop")


def test_schedule_rotates_partition_variants() -> None:
    plan = plan_faults(3, ("partition",), 600.0)
    variants = [f.variant for f in plan[: len(PARTITION_VARIANTS)]]
    assert sorted(variants) == sorted(PARTITION_VARIANTS)


def test_schedule_rotates_power_targets_and_leaves_other_kinds_alone() -> None:
    ChaosOptions(seed=1, faults=("kill", "power", "partition")).validate()
    plan = plan_faults(7, ("power",), 600.0)
    assert sorted(f.variant for f in plan[: len(POWER_TARGETS)]) == sorted(POWER_TARGETS)
    assert all(HOLD_S["power"][0] <= f.hold_s <= HOLD_S["power"][1] for f in plan)
    mixed = plan_faults(7, ("kill", "power", "partition"), 60.0)
    assert {f.kind for f in mixed[:3]} == {"kill", "power", "partition"}
    assert all(f.variant in POWER_TARGETS for f in mixed if f.kind == "power")


def test_worker_faults_target_nodes_are_instant_and_in_the_default_set() -> None:
    """A data worker killed is healed by its supervisor, not by the nemesis: no hold."""
    assert "worker" in FAULT_KINDS
    plan = plan_faults(5, ("worker",), 60.0)
    assert sorted({f.variant for f in plan}) == sorted(NODE_TARGETS)
    assert all(f.kind == "worker" and f.hold_s == 0.0 for f in plan)
    ChaosOptions(seed=1, faults=("worker",), data_workers=2).validate()
    with pytest.raises(ValueError, match="data_workers"):
        ChaosOptions(seed=1, faults=("worker",), data_workers=9).validate()


def test_schedule_honours_the_requested_kinds() -> None:
    assert {f.kind for f in plan_faults(1, ("pause",), 60.0)} == {"pause"}


@pytest.mark.parametrize(("text", "seconds"), [("60", 60), ("60s", 60), ("10m", 600), ("1h", 3600)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.fixture()
def echo_port() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(connection,), daemon=True).start()

    def echo(connection: socket.socket) -> None:
        # The proxy resets the connection when the link is cut: that ends the echo too.
        with connection, contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while data := connection.recv(65536):
                connection.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_proxies_forward_drop_and_reset(echo_port: int) -> None:
    ports = free_ports(3)
    a = NodeConfig("a", "127.0.0.1", ports[0], echo_port, Path("/nonexistent/a"))
    b = NodeConfig("b", "127.0.0.1", ports[1], ports[2], Path("/nonexistent/b"))
    net = ProxyNet([a, b])
    net.start()
    try:
        _, configured_b = net.configure([a, b])
        assert configured_b.peer_transfer_addresses == ()  # a has no transfer port
        host, port = configured_b.dial_raft_address(a).split(":")
        assert int(port) != echo_port  # b dials a through its proxy
        with socket.create_connection((host, int(port)), timeout=scaled(5)) as client:
            client.sendall(b"hello")
            assert client.recv(100) == b"hello"
            net.cut("a", "b", "drop")
            assert net.cut_pairs() == [("a", "b", "drop")]
            client.sendall(b"held")
            client.settimeout(0.5)
            with pytest.raises(TimeoutError):
                client.recv(100)
            net.heal_all()
            client.settimeout(5)
            assert client.recv(100) == b"held"  # a healed link resumes, nothing lost
            net.cut("a", "b", "reset")
            with pytest.raises(OSError):
                client.sendall(b"x")
                if not client.recv(100):
                    raise ConnectionResetError("closed")
        with (
            pytest.raises(OSError),
            socket.create_connection((host, int(port)), timeout=scaled(5)) as s,
        ):
            s.sendall(b"x")
            if not s.recv(100):
                raise ConnectionResetError("closed")
        net.heal_all()
        assert net.cut_pairs() == []
        with socket.create_connection((host, int(port)), timeout=scaled(5)) as client:
            client.sendall(b"again")
            assert client.recv(100) == b"again"
    finally:
        net.close()


def test_a_delayed_link_delays_each_way_and_keeps_the_order(echo_port: int) -> None:
    ports = free_ports(3)
    a = NodeConfig("a", "127.0.0.1", ports[0], echo_port, Path("/nonexistent/a"))
    b = NodeConfig("b", "127.0.0.1", ports[1], ports[2], Path("/nonexistent/b"))
    net = ProxyNet([a, b])
    net.start()
    try:
        _, configured_b = net.configure([a, b])
        host, port = configured_b.dial_raft_address(a).split(":")
        with pytest.raises(ValueError, match="expected 0..10000"):
            net.set_latency(-1)
        net.set_latency(100, jitter_ms=30)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            started = time.monotonic()
            sent = b"".join(b"%05d" % k for k in range(2000))
            for k in range(0, len(sent), 1000):
                client.sendall(sent[k : k + 1000])
            got = b""
            while len(got) < len(sent):
                chunk = client.recv(65536)
                assert chunk, "closed early"
                got += chunk
            # One way there, one way back: two delays at least, jitter or not...
            assert time.monotonic() - started >= 0.2
            # ...and every byte in the order it was sent, though each chunk's jitter differs.
            assert got == sent
        net.set_latency(0)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            started = time.monotonic()
            client.sendall(b"quick")
            assert client.recv(100) == b"quick"
            assert time.monotonic() - started < 0.2
    finally:
        net.close()


def test_peer_addresses_parse_render_and_validate() -> None:
    data = {
        "nodes": [
            {
                "id": "n1",
                "grpc_port": 7201,
                "raft_port": 7301,
                "peer_raft_addresses": {"n2": "127.0.0.1:7402"},
                "peer_grpc_addresses": {"n2": "127.0.0.1:7502"},
                "peer_transfer_addresses": {"n2": "127.0.0.1:7602"},
            },
            {"id": "n2", "grpc_port": 7202, "raft_port": 7302},
        ]
    }
    config = parse_config(data, Path("/tmp"), environ={})
    n1, n2 = config.nodes
    assert (n1.dial_raft_address(n2), n1.dial_grpc_address(n2)) == (
        "127.0.0.1:7402",
        "127.0.0.1:7502",
    )
    assert n1.dial_transfer_address(n2, 7702) == "127.0.0.1:7602"
    assert (n2.dial_raft_address(n1), n2.dial_grpc_address(n1)) == (
        n1.raft_address,
        n1.grpc_address,
    )
    # Not routed: the port the peer offers, at its host.
    assert n2.dial_transfer_address(n1, 7701) == f"{n1.host}:7701"
    # A relay of gRPC but not of the transfer port: no transfer address at all.
    only_grpc = replace(n1, peer_transfer_addresses=())
    assert only_grpc.dial_transfer_address(n2, 7702) is None
    again = parse_config(tomllib.loads(render_config(config)), Path("/tmp"), environ={})
    assert again.nodes == config.nodes
    data["nodes"][0]["peer_transfer_addresses"] = {"n1": "127.0.0.1:1"}
    with pytest.raises(ConfigError, match="n1"):
        parse_config(data, Path("/tmp"), environ={})
    data["nodes"][0]["peer_transfer_addresses"] = {}
    data["nodes"][0]["peer_raft_addresses"] = {"n9": "127.0.0.1:1"}
    with pytest.raises(ConfigError, match="n9"):
        parse_config(data, Path("/tmp"), environ={})
    data["nodes"][0]["peer_raft_addresses"] = {"n2": "nowhere"}
    with pytest.raises(ConfigError, match="expected host:port"):
        parse_config(data, Path("/tmp"), environ={})


def test_member_faults_need_a_data_node() -> None:
    with pytest.raises(ValueError, match="member with 0 data nodes"):
        ChaosOptions(seed=1, faults=("kill", "member")).validate()
    ChaosOptions(seed=1, faults=("kill", "member"), nodes=4, data_nodes=1).validate()


def test_the_transfer_port_has_a_proxy_of_its_own(echo_port: int) -> None:
    ports = free_ports(4)
    a = NodeConfig("a", "127.0.0.1", ports[0], ports[1], Path("/x/a"), transfer_port=echo_port)
    b = NodeConfig("b", "127.0.0.1", ports[2], ports[3], Path("/x/b"), transfer_port=-1)
    net = ProxyNet([a, b])
    net.start()
    try:
        configured_a, configured_b = net.configure([a, b])
        assert configured_a.peer_transfer_addresses == ()  # b's port is off: no link
        address = configured_b.dial_transfer_address(a, echo_port)
        assert address is not None
        host, port = address.split(":")
        assert int(port) != echo_port
        with socket.create_connection((host, int(port)), timeout=scaled(5)) as client:
            client.sendall(b"append")
            assert client.recv(100) == b"append"
            net.cut("a", "b", "reset")
            with pytest.raises(OSError):
                client.sendall(b"x")
                if not client.recv(100):
                    raise ConnectionResetError("closed")
    finally:
        net.close()
