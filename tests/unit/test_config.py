"""Configuration parsing: defaults, env overrides, secrets, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftwal.node.config import (
    ConfigError,
    check_transport_security,
    config_template,
    load_config,
    parse_config,
    render_config,
    write_secret_file,
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
        ({"nodes": [{"id": "a b", "grpc_port": 1, "raft_port": 2}]}, "a letter or digit, then"),
        ({"nodes": [{"id": "n1", "grpc_port": 0, "raft_port": 2}]}, "nodes\\[0\\].grpc_port \\(0"),
        ({"nodes": [{"id": "n1", "grpc_port": "x", "raft_port": 2}]}, "expected an integer"),
        ({"nodes": [NODES[0], NODES[0]]}, "duplicate node ids"),
        ({"nodes": NODES, "cluster": {"node_timeout_ms": -1}}, "cluster.node_timeout_ms \\(-1"),
        (
            {"nodes": NODES, "cluster": {"raft_min_timeout_ms": 900, "raft_max_timeout_ms": 800}},
            "expected min < max",
        ),
        ({"nodes": [{**NODES[0], "role": "witness"}]}, "nodes\\[0\\].role \\('witness'"),
        ({"nodes": [{**n, "role": "data"} for n in NODES]}, "no voting node"),
        ({"nodes": NODES, "cluster": {"cluster_id": "../east"}}, "cluster.cluster_id \\('../east'"),
        ({"nodes": NODES, "cluster": {"cluster_id": 7}}, "cluster.cluster_id \\(7; expected"),
        (
            {"nodes": NODES, "cluster": {"replicate_max_lag_ms": -1}},
            "cluster.replicate_max_lag_ms \\(-1",
        ),
    ],
)
def test_invalid_configs_say_what_was_expected(tmp_path: Path, data, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, tmp_path, environ={})


def test_replication_flow_control_is_off_by_default_and_takes_a_bound(tmp_path: Path) -> None:
    assert parse_config({"nodes": NODES}, tmp_path, environ={}).replicate_max_lag_ms == 0
    data = {"nodes": NODES, "cluster": {"replicate_max_lag_ms": 1500}}
    assert parse_config(data, tmp_path, environ={}).replicate_max_lag_ms == 1500
    data = {"nodes": NODES, "cluster": {"replicate_max_lag_ms": 0}}
    assert parse_config(data, tmp_path, environ={}).replicate_max_lag_ms == 0


def test_bad_environment_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RAFTWAL_NODE_TIMEOUT_MS"):
        parse_config({"nodes": NODES}, tmp_path, environ={"RAFTWAL_NODE_TIMEOUT_MS": "soon"})


def test_a_node_without_a_secret_refuses_to_start_on_any_address(tmp_path: Path) -> None:
    nodes = [dict(NODES[0], host="10.1.2.3"), NODES[1]]  # NODES[1] is on loopback
    config = parse_config({"nodes": nodes}, tmp_path, environ={})
    for node_id in ("n1", "n2"):
        with pytest.raises(ConfigError, match="has no cluster secret.*raftwal secret new"):
            check_transport_security(config, config.node(node_id))
    short = parse_config({"nodes": nodes}, tmp_path, environ={"RAFTWAL_SECRET": "x"})
    with pytest.raises(ConfigError, match=r"too short: 1 chars; expected >= 16"):
        check_transport_security(short, short.node("n2"))
    secured = parse_config({"nodes": nodes}, tmp_path, environ={"RAFTWAL_SECRET": "x" * 32})
    check_transport_security(secured, secured.node("n1"))


def test_secret_new_writes_0600_and_never_replaces_silently(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "secret"
    write_secret_file(path)
    first = path.read_text().strip()
    assert len(first) == 64 and int(first, 16) >= 0
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    with pytest.raises(ConfigError, match="exists"):
        write_secret_file(path)
    assert path.read_text().strip() == first
    write_secret_file(path, overwrite=True)
    assert path.read_text().strip() != first
    assert path.stat().st_mode & 0o777 == 0o600


def test_config_template_loads_and_uses_the_secret_file(tmp_path: Path) -> None:
    write_secret_file(tmp_path / "secret")
    path = tmp_path / "raftwal.toml"
    path.write_text(config_template("secret"))
    config = load_config(path, environ={})
    assert [n.id for n in config.nodes] == ["n1", "n2", "n3"]
    assert config.secret == (tmp_path / "secret").read_text().strip()
    check_transport_security(config, config.node("n1"))


def test_data_nodes_do_not_vote(tmp_path: Path) -> None:
    nodes = [*NODES, {"id": "n3", "grpc_port": 7203, "raft_port": 7303, "role": "data"}]
    config = parse_config({"nodes": nodes}, tmp_path, environ={})
    assert [n.id for n in config.voters] == ["n1", "n2"]
    assert config.node("n3").role == "data" and not config.node("n3").voter
    assert config.node("n1").role == "voter" and config.node("n1").voter


def test_cluster_id_from_the_file_and_the_environment(tmp_path: Path) -> None:
    assert parse_config({"nodes": NODES}, tmp_path, environ={}).cluster_id == ""
    data = {"nodes": NODES, "cluster": {"cluster_id": "east"}}
    assert parse_config(data, tmp_path, environ={}).cluster_id == "east"
    assert parse_config(data, tmp_path, {"RAFTWAL_CLUSTER_ID": "west"}).cluster_id == "west"


def test_render_then_load_round_trips(tmp_path: Path) -> None:
    nodes = [*NODES, {"id": "n3", "grpc_port": 7203, "raft_port": 7303, "role": "data"}]
    cluster = {"node_timeout_ms": 4321, "cluster_id": "east"}
    config = parse_config({"nodes": nodes, "cluster": cluster}, tmp_path, {})
    path = tmp_path / "raftwal.toml"
    path.write_text(render_config(config))
    loaded = load_config(path, environ={})
    assert loaded.nodes == config.nodes
    assert loaded.node_timeout_ms == 4321
    assert loaded.cluster_id == "east"
    path.write_text("[[nodes]\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(path, environ={})


def test_lease_reads_from_the_file_and_the_environment(tmp_path: Path) -> None:
    assert parse_config({"nodes": NODES}, tmp_path, environ={}).raft_lease_reads is True
    off = {"nodes": NODES, "cluster": {"raft_lease_reads": False}}
    config = parse_config(off, tmp_path, environ={})
    assert config.raft_lease_reads is False
    # render_config (raftwal dev up) keeps the setting.
    rendered = render_config(config)
    assert "raft_lease_reads = false" in rendered
    assert (
        parse_config({"nodes": NODES}, tmp_path, {"RAFTWAL_RAFT_LEASE_READS": "0"}).raft_lease_reads
        is False
    )
    assert (
        parse_config(off, tmp_path, {"RAFTWAL_RAFT_LEASE_READS": "true"}).raft_lease_reads is True
    )
    with pytest.raises(ConfigError, match=r"invalid cluster.raft_lease_reads \('yes'; expected"):
        parse_config({"nodes": NODES}, tmp_path, {"RAFTWAL_RAFT_LEASE_READS": "yes"})
    with pytest.raises(ConfigError, match=r"invalid cluster.raft_lease_reads \(1; expected"):
        parse_config({"nodes": NODES, "cluster": {"raft_lease_reads": 1}}, tmp_path, {})


def _tuning(config):  # type: ignore[no-untyped-def]
    """The Raft tuning a node builds from `config` (as raftwal.node.process does)."""
    from raft.peer import RaftTuning
    from raftwal.node.config import raft_connection_timeout_ms

    return RaftTuning(
        election_timeout_min_s=config.raft_min_timeout_ms / 1000,
        election_timeout_max_s=config.raft_max_timeout_ms / 1000,
        leader_fallback_timeout_s=config.raft_leader_fallback_ms / 1000,
        connection_timeout_s=raft_connection_timeout_ms(config) / 1000,
    )


@pytest.mark.parametrize("max_timeout_ms", ["1201", "2000", "4000", "60000"])
def test_a_longer_election_timeout_stretches_the_connection_timeout(
    tmp_path: Path, max_timeout_ms: str
) -> None:
    # Issue 40, item 7: RAFTWAL_RAFT_MAX_TIMEOUT_MS=4000 stopped every node with a
    # ValueError about connection_timeout_s, a setting the config does not even have.
    config = parse_config(
        {"nodes": NODES}, tmp_path, environ={"RAFTWAL_RAFT_MAX_TIMEOUT_MS": max_timeout_ms}
    )
    tuning = _tuning(config)
    tuning.validate()
    assert tuning.connection_timeout_s >= tuning.election_timeout_max_s
    assert tuning.connection_timeout_s >= 2.0


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"RAFTWAL_RAFT_MIN_TIMEOUT_MS": "1500"},
            r"invalid raft timeouts \(raft_min_timeout_ms 1500, raft_max_timeout_ms 1200; "
            "expected min < max",
        ),
        (
            {"RAFTWAL_RAFT_MIN_TIMEOUT_MS": "100"},
            r"invalid raft_min_timeout_ms \(100; expected > 150",
        ),
        (
            {"RAFTWAL_RAFT_LEADER_FALLBACK_MS": "20"},
            r"invalid raft_leader_fallback_ms \(20; expected > 50",
        ),
        (
            {"RAFTWAL_MAX_NODE_STREAMS": "10", "RAFTWAL_MAX_IDENTITY_STREAMS": "20"},
            r"invalid stream caps \(max_identity_streams 20, max_node_streams 10",
        ),
    ],
)
def test_raft_timings_that_pysyncobj_would_refuse_are_config_errors(
    tmp_path: Path, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"nodes": NODES}, tmp_path, environ=environ)


def test_a_secret_file_open_to_others_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 40, item 5: a tokens file at 0644 got a warning, the secret file did not.
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef")
    data = {"nodes": NODES, "cluster": {"secret_file": "secret"}}
    for mode, warned in ((0o600, False), (0o644, True), (0o640, True)):
        secret.chmod(mode)
        config = parse_config(data, tmp_path, environ={})
        caplog.clear()
        with caplog.at_level("WARNING", logger="raftwal.node.config"):
            check_transport_security(config, config.nodes[0])
        text = caplog.text
        assert ("secret_file" in text and f"mode {mode:04o}" in text) == warned, (mode, text)
        assert "0123456789abcdef" not in text


def test_listen_host_apart_from_the_advertised_host(tmp_path: Path) -> None:
    nodes = [
        {"id": "n1", "host": "10.0.0.1", "listen_host": "0.0.0.0", "grpc_port": 1, "raft_port": 2},
        {"id": "n2", "host": "db2.example", "listen_host": "::", "grpc_port": 1, "raft_port": 2},
        {"id": "n3", "host": "10.0.0.3", "grpc_port": 1, "raft_port": 2},
    ]
    n1, n2, n3 = parse_config({"nodes": nodes}, tmp_path, environ={}).nodes
    assert (n1.grpc_address, n1.bind_address(1)) == ("10.0.0.1:1", "0.0.0.0:1")
    assert (n2.grpc_address, n2.bind_address(1)) == ("db2.example:1", "[::]:1")
    assert (n3.bind_host, n3.bind_address(2)) == ("10.0.0.3", "10.0.0.3:2")
    rendered = render_config(parse_config({"nodes": nodes}, tmp_path, environ={}))
    assert 'listen_host = "0.0.0.0"' in rendered and rendered.count("\nlisten_host = ") == 2


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]"])
def test_a_wildcard_is_no_advertised_host(tmp_path: Path, host: str) -> None:
    nodes = [{"id": "n1", "host": host, "grpc_port": 1, "raft_port": 2}]
    with pytest.raises(ConfigError, match=r"a wildcard address can only be listened on"):
        parse_config({"nodes": nodes}, tmp_path, environ={})
    nodes = [{"id": "n1", "host": "10.0.0.1", "listen_host": "", "grpc_port": 1, "raft_port": 2}]
    with pytest.raises(ConfigError, match=r"invalid nodes\[0\].listen_host"):
        parse_config({"nodes": nodes}, tmp_path, environ={})
