"""Configuration parsing: defaults, env overrides, secrets, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftwal.config import (
    ConfigError,
    check_transport_security,
    load_config,
    parse_config,
    render_config,
)

NODES = [
    {"id": "n1", "host": "127.0.0.1", "grpc_port": 7201, "raft_port": 7301},
    {"id": "n2", "host": "127.0.0.1", "grpc_port": 7202, "raft_port": 7302},
]


def test_defaults_and_paths(tmp_path: Path) -> None:
    config = parse_config({"nodes": NODES}, tmp_path, environ={})
    assert [n.id for n in config.nodes] == ["n1", "n2"]
    assert config.node("n2").grpc_address == "127.0.0.1:7202"
    assert config.node("n1").data_dir == (tmp_path / "data/n1").resolve()
    assert config.secret is None
    assert config.node_by_raft_address("127.0.0.1:7302").id == "n2"


def test_cluster_table_and_environment_override(tmp_path: Path) -> None:
    data = {"nodes": NODES, "cluster": {"node_timeout_ms": 5000, "propose_timeout_ms": 100}}
    config = parse_config(data, tmp_path, environ={"RAFTWAL_NODE_TIMEOUT_MS": "7000"})
    assert config.node_timeout_ms == 7000
    assert config.propose_timeout_ms == 100


def test_secret_from_file_and_environment(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cret\n")
    data = {"nodes": NODES, "cluster": {"secret_file": "secret"}}
    assert parse_config(data, tmp_path, environ={}).secret == "s3cret"
    assert parse_config(data, tmp_path, environ={"RAFTWAL_SECRET": "env"}).secret == "env"
    with pytest.raises(ConfigError, match="cannot read cluster.secret_file"):
        parse_config({"nodes": NODES, "cluster": {"secret_file": "missing"}}, tmp_path, {})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "missing \\[\\[nodes\\]\\]"),
        ({"nodes": [{"id": "", "grpc_port": 1, "raft_port": 2}]}, "invalid nodes\\[0\\].id"),
        ({"nodes": [{"id": "a b", "grpc_port": 1, "raft_port": 2}]}, "expected \\[A-Za-z0-9_.-\\]"),
        ({"nodes": [{"id": "n1", "grpc_port": 0, "raft_port": 2}]}, "nodes\\[0\\].grpc_port \\(0"),
        ({"nodes": [{"id": "n1", "grpc_port": "x", "raft_port": 2}]}, "expected an integer"),
        ({"nodes": [NODES[0], NODES[0]]}, "duplicate node ids"),
        ({"nodes": NODES, "cluster": {"node_timeout_ms": -1}}, "cluster.node_timeout_ms \\(-1"),
        (
            {"nodes": NODES, "cluster": {"raft_min_timeout_ms": 900, "raft_max_timeout_ms": 800}},
            "expected min < max",
        ),
    ],
)
def test_invalid_configs_say_what_was_expected(tmp_path: Path, data, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, tmp_path, environ={})


def test_bad_environment_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RAFTWAL_NODE_TIMEOUT_MS"):
        parse_config({"nodes": NODES}, tmp_path, environ={"RAFTWAL_NODE_TIMEOUT_MS": "soon"})


def test_non_loopback_without_secret_refuses_to_start(tmp_path: Path) -> None:
    nodes = [dict(NODES[0], host="10.1.2.3"), NODES[1]]
    config = parse_config({"nodes": nodes}, tmp_path, environ={})
    with pytest.raises(ConfigError, match="refusing to start an unauthenticated Raft transport"):
        check_transport_security(config, config.node("n1"))
    check_transport_security(config, config.node("n2"))
    secured = parse_config({"nodes": nodes}, tmp_path, environ={"RAFTWAL_SECRET": "x"})
    check_transport_security(secured, secured.node("n1"))


def test_render_then_load_round_trips(tmp_path: Path) -> None:
    config = parse_config({"nodes": NODES, "cluster": {"node_timeout_ms": 4321}}, tmp_path, {})
    path = tmp_path / "raftwal.toml"
    path.write_text(render_config(config))
    loaded = load_config(path, environ={})
    assert loaded.nodes == config.nodes
    assert loaded.node_timeout_ms == 4321
    path.write_text("[[nodes]\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(path, environ={})
