"""`raftwal init`'s output starts a working cluster, as docs/deploy.md says it does: one
directory per host, copied as it is, each node started with `raftwal node --config
raftwal.toml --id ID`, on three distinct addresses (127.0.0.1, .2 and .3: Linux routes
all of 127/8 to the loopback device, so each node has an address of its own), with TLS
checked against the node's advertised address, client certificates and tokens."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftwal.cli import dev
from raftwal.cli.init import init_deployment, parse_hosts
from raftwal.cli.main import main
from raftwal.node.config import ConfigError, load_config
from rpc.credentials import ClientSecurity
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, consume_all, setup_channels, wait_assigned
from tests.processes import start_in_own_session

pytestmark = pytest.mark.cluster

HOSTS = {"n1": "127.0.0.1", "n2": "127.0.0.2", "n3": "127.0.0.3"}


def _ports_free_on_every_host() -> list[int]:
    """Four ports free on all three addresses (each node uses the same four)."""
    for _ in range(50):
        ports = dev.free_ports(4, HOSTS["n1"])
        held = []
        try:
            for host in (*HOSTS.values(), "127.0.0.4"):
                for port in ports:
                    sock = socket.socket()
                    held.append(sock)
                    sock.bind((host, port))
            return ports
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no four ports free on 127.0.0.1, .2 and .3 in 50 tries")


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for process in processes.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_a_cluster_starts_from_raftwal_init_output_on_three_addresses(tmp_path: Path) -> None:
    ports = _ports_free_on_every_host()
    out = tmp_path / "deploy"
    code = main(
        [
            "init",
            "--hosts",
            ",".join(f"{k}={v}" for k, v in HOSTS.items()),
            "--out",
            str(out),
            "--secure",
            "--data-dir",
            str(tmp_path / "data" / "{id}"),
            "--grpc-port",
            str(ports[0]),
            "--raft-port",
            str(ports[1]),
            "--metrics-port",
            str(ports[2]),
            "--transfer-port",
            str(ports[3]),
        ]
    )
    assert code == 0
    # Every file 0600, every directory 0700.
    for path in out.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {mode:04o}"
    # A host holds no client's token: its auth_tokens names them by digest only, and
    # holds in clear only the node token, which nodes present to each other.
    client_tokens = {
        path.name: path.read_text().strip() for path in (out / "client" / "tokens").iterdir()
    }
    assert set(client_tokens) == {"admin", "producer", "consumer", "reader"}
    for node_id in HOSTS:
        held = (out / node_id / "auth_tokens").read_text()
        for role, token in client_tokens.items():
            assert token not in held, f"{node_id}'s auth_tokens holds the {role} token"
            digest = hashlib.sha256(token.encode()).hexdigest()
            assert f"{role} sha256:{digest}" in held.splitlines()
        assert sum(1 for line in held.splitlines() if line.startswith("node ")) == 1
    # Each host's directory is copied somewhere else, as it would be to /etc/raftwal.
    processes: dict[str, subprocess.Popen[bytes]] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTWAL_")}
    client: Api | None = None
    try:
        for node_id in HOSTS:
            etc = tmp_path / "hosts" / node_id / "etc-raftwal"
            shutil.copytree(out / node_id, etc)
            processes[node_id] = start_in_own_session(
                [
                    sys.executable,
                    "-m",
                    "raftwal.cli",
                    "--log-level",
                    "INFO",
                    "node",
                    "--config",
                    str(etc / "raftwal.toml"),
                    "--id",
                    node_id,
                ],
                cwd=tmp_path,
                env=env,
                log_path=tmp_path / f"{node_id}.log",
            )
        endpoints = [f"{host}:{ports[0]}" for host in HOSTS.values()]
        security = ClientSecurity.load(
            token_file=out / "client" / "tokens" / "admin",
            tls_ca_file=out / "client" / "ca.pem",
            tls_cert_file=out / "client" / "client.pem",
            tls_key_file=out / "client" / "client.key",
        )
        status = dev.wait_ready(endpoints, 3, 90.0, security)
        addresses = {m.node_id: m.grpc_address for m in status.members}
        assert addresses == {k: f"{v}:{ports[0]}" for k, v in HOSTS.items()}
        client = Api(endpoints, security)
        (pchannel,) = setup_channels(client, "init", {"init_v": 0})
        wait_assigned(client, pchannel)
        producer = Producer(client, pchannel, "init")
        history = History()
        try:
            for k in range(5):
                assert producer.send("init_v", [b"init-%d-%d" % (k, i) for i in range(10)], history)
        finally:
            producer.close()
        entries = consume_all(client, "init_v", pchannel, expect=len(history.acked))
        assert sorted(e.payload for e in entries) == sorted(a.payload for a in history.acked)
        # Each node's certificate names its own address: a client that checks it reaches
        # n2 at 127.0.0.2 (the TLS handshake above would have failed otherwise).
        for node_id in HOSTS:
            assert processes[node_id].poll() is None, f"{node_id} exited"
        # A fourth machine joins, as docs/deploy.md says: its own files from init, with
        # the cluster's secret, CA and tokens; nothing of the others changes.
        joiner = tmp_path / "n4-files"
        assert (
            main(
                [
                    "init",
                    "--hosts",
                    "n4=127.0.0.4",
                    "--out",
                    str(joiner),
                    "--join",
                    ",".join(endpoints),
                    "--secret-file",
                    str(out / "n1" / "secret"),
                    "--secure",
                    "--ca-cert",
                    str(out / "ca" / "tls" / "ca.pem"),
                    "--ca-key",
                    str(out / "ca" / "tls" / "ca.key"),
                    "--data-dir",
                    str(tmp_path / "data" / "{id}"),
                    "--grpc-port",
                    str(ports[0]),
                    "--raft-port",
                    str(ports[1]),
                    "--metrics-port",
                    str(ports[2]),
                    "--transfer-port",
                    str(ports[3]),
                ]
            )
            == 0
        )
        shutil.copy(out / "n1" / "auth_tokens", joiner / "n4" / "auth_tokens")
        processes["n4"] = start_in_own_session(
            [sys.executable, "-m", "raftwal.cli", "--log-level", "INFO", "node"]
            + ["--config", str(joiner / "n4" / "raftwal.toml"), "--id", "n4"],
            cwd=tmp_path,
            env=env,
            log_path=tmp_path / "n4.log",
        )
        status = dev.wait_ready(endpoints, 4, 90.0, security)
        assert {m.node_id: m.grpc_address for m in status.members}["n4"] == f"127.0.0.4:{ports[0]}"
    finally:
        if client is not None:
            client.close()
        _stop(processes)


def test_init_refuses_what_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected ID=HOST"):
        parse_hosts("n1=10.0.0.1,n2")
    with pytest.raises(ConfigError, match="twice"):
        parse_hosts("n1=10.0.0.1,n1=10.0.0.2")
    with pytest.raises(ConfigError, match="one node per host"):
        parse_hosts("n1=10.0.0.1,n2=10.0.0.1")
    with pytest.raises(ConfigError, match="wildcard"):
        init_deployment({"n1": "0.0.0.0"}, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    with pytest.raises(ConfigError, match="not empty"):
        init_deployment({"n1": "10.0.0.1"}, tmp_path / "b")


def test_init_output_listens_where_told_and_advertises_the_host(tmp_path: Path) -> None:
    init_deployment(
        {"n1": "10.0.0.1", "n2": "db2.example"},
        tmp_path / "o",
        listen_host="0.0.0.0",
        data_nodes=["n2"],
    )
    config = load_config(tmp_path / "o" / "n2" / "raftwal.toml", environ={})
    n1, n2 = config.nodes
    assert (n1.host, n1.bind_host, n1.grpc_address) == ("10.0.0.1", "0.0.0.0", "10.0.0.1:7201")
    assert n2.role == "data" and n2.host == "db2.example"
    assert config.secret and len(config.secret) == 64
    assert (tmp_path / "o" / "n1" / "secret").read_text() == (
        tmp_path / "o" / "n2" / "secret"
    ).read_text()
    assert (tmp_path / "o" / "n2" / "node.env").read_text() == "RAFTWAL_NODE_ID=n2\n"


def test_the_systemd_unit_runs_what_init_wrote() -> None:
    """deploy/systemd/raftwal.service starts `raftwal node` with the file names `raftwal
    init` writes, and waits longer than a node's graceful handover before SIGKILL."""
    import argparse

    from raftwal.cli import init
    from raftwal.cli.main import build_parser
    from raftwal.node.config import ClusterConfig

    unit = (Path(__file__).parents[2] / "deploy" / "systemd" / "raftwal.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["EnvironmentFile"] == f"/etc/raftwal/{init.NODE_ENV_FILE}"
    argv = settings["ExecStart"].replace("${RAFTWAL_NODE_ID}", "n1").split()
    assert argv[0].endswith("/raftwal")
    args: argparse.Namespace = build_parser().parse_args(argv[1:])
    assert (args.command, args.id, args.config) == (
        "node",
        "n1",
        Path(f"/etc/raftwal/{init.CONFIG_FILE}"),
    )
    assert settings["KillSignal"] == "SIGTERM"
    assert int(settings["TimeoutStopSec"]) * 1000 > 2 * ClusterConfig(nodes=()).handover_timeout_ms
    assert settings["StateDirectoryMode"] == "0700" and settings["UMask"] == "0077"
