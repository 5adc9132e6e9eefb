"""A local cluster on loopback for trying raftwal and for tests: ``raftwal dev up|down``.

``up`` picks free ports on 127.0.0.1 (gRPC, Raft and Prometheus metrics per node), writes
``<dir>/raftwal.toml`` (and a random Raft transport secret in ``<dir>/secret``, mode 0600)
and starts one ``raftwal node`` process per node in the background (logs in
``<dir>/<id>.log``, in the format ``RAFTWAL_LOG_FORMAT`` names: text or json), waits
until a leader is elected and every node is registered, and records the members with
their pids in ``<dir>/cluster.json`` (which the other CLI commands read for their default
endpoints). ``down`` stops those processes by pid (SIGTERM, then SIGKILL after a grace
period). Nothing else is ever signalled.

``up(secure=True)`` (``raftwal dev up --secure``) also makes a new local CA, node and
client certificates and a token per role (``raftwal.cli.devcerts``), and configures the nodes
for TLS, mutual TLS and bearer-token auth; ``cluster.json`` then names the CA, the client
certificate and the token files, so that the CLI connects with them (admin token) and
tests can pick another role (``LocalCluster.client_security``).

It is also the helper API that ``raftwal.chaos``, the tests and the benchmarks use to run
clusters: ``ClusterConfig``, ``NodeConfig`` and ``render_config`` are re-exported here so
that they need nothing else from the node's modules.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from raftwal.cli import devcerts
from raftwal.node.config import ClusterConfig, NodeConfig, render_config
from raftwal.node.security import ADMIN
from rpc.credentials import ClientSecurity
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc

__all__ = [
    "CLUSTER_FILE",
    "CONFIG_FILE",
    "SECRET_FILE",
    "ClusterConfig",
    "LocalCluster",
    "NodeConfig",
    "down",
    "free_ports",
    "make_config",
    "render_config",
    "secure_config",
    "up",
    "wait_ready",
]

CLUSTER_FILE = "cluster.json"
CONFIG_FILE = "raftwal.toml"
SECRET_FILE = "secret"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago (bound all at once, then closed)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class LocalCluster:
    """A set of node processes started from one config, by pid."""

    directory: Path
    config: ClusterConfig
    processes: dict[str, subprocess.Popen[bytes] | None]
    env: dict[str, str]
    # The key material of a cluster started with secure=True.
    security: devcerts.DevSecurity | None = None

    @property
    def endpoints(self) -> list[str]:
        return [n.grpc_address for n in self.config.nodes]

    def node(self, node_id: str) -> NodeConfig:
        return self.config.node(node_id)

    def client_security(self, role: str = ADMIN) -> ClientSecurity:
        """How a client connects with `role`'s token (over mutual TLS); plaintext without
        a token for a cluster started without secure=True."""
        if self.security is None:
            return ClientSecurity()
        return ClientSecurity.load(
            token_file=self.security.token_files[role],
            tls_ca_file=self.security.ca_file,
            tls_cert_file=self.security.client_cert_file,
            tls_key_file=self.security.client_key_file,
        )

    def pid(self, node_id: str) -> int | None:
        process = self.processes.get(node_id)
        return process.pid if process is not None else None

    def start_node(self, node_id: str, extra_env: dict[str, str] | None = None) -> None:
        """Start `node_id`'s process; `extra_env` is added to this node's environment only
        (e.g. another RAFTWAL_SECRET, to show that such a node is kept out)."""
        log_path = self.directory / f"{node_id}.log"
        # The node's log is its own user's only (0600), like everything else it writes.
        log_file = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        command = [
            sys.executable,
            "-m",
            "raftwal.cli",
            "--log-level",
            self.env.get("RAFTWAL_LOG_LEVEL", "INFO"),
            "--log-format",
            self.env.get("RAFTWAL_LOG_FORMAT", "text"),
            "node",
            "--config",
            str(self.directory / CONFIG_FILE),
            "--id",
            node_id,
        ]
        self.processes[node_id] = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**self.env, **(extra_env or {})},
            start_new_session=True,
        )
        log_file.close()

    def kill(self, node_id: str, signum: int = signal.SIGKILL) -> None:
        process = self.processes.get(node_id)
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
        if signum in (signal.SIGKILL, signal.SIGTERM):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            self.processes[node_id] = None

    def stop_all(self, grace_s: float = 5.0) -> None:
        for process in self.processes.values():
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
        deadline = time.monotonic() + grace_s
        for node_id, process in list(self.processes.items()):
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            self.processes[node_id] = None

    def write_cluster_file(self) -> None:
        members = [
            {
                "id": node.id,
                "grpc": node.grpc_address,
                "raft": node.raft_address,
                "metrics_port": node.metrics_port,
                "pid": self.pid(node.id),
                "data_dir": str(node.data_dir),
            }
            for node in self.config.nodes
        ]
        data: dict[str, object] = {"nodes": members}
        if self.security is not None:
            data["security"] = {
                "tls_ca_file": str(self.security.ca_file),
                "tls_cert_file": str(self.security.client_cert_file),
                "tls_key_file": str(self.security.client_key_file),
                "token_file": str(self.security.token_files[ADMIN]),
                "token_files": {r: str(f) for r, f in self.security.token_files.items()},
            }
        (self.directory / CLUSTER_FILE).write_text(json.dumps(data, indent=2))


def make_config(directory: Path, nodes: int, host: str = "127.0.0.1") -> ClusterConfig:
    ports = free_ports(nodes * 3, host)
    members = tuple(
        NodeConfig(
            id=f"n{k + 1}",
            host=host,
            grpc_port=ports[3 * k],
            raft_port=ports[3 * k + 1],
            metrics_port=ports[3 * k + 2],
            data_dir=(directory / f"n{k + 1}").resolve(),
        )
        for k in range(nodes)
    )
    return ClusterConfig(nodes=members)


def secure_config(config: ClusterConfig, security: devcerts.DevSecurity) -> ClusterConfig:
    """`config` with TLS, mutual TLS and token auth from `security`."""
    nodes = tuple(
        replace(
            node,
            tls_cert_file=security.node_certs[node.id][0],
            tls_key_file=security.node_certs[node.id][1],
        )
        for node in config.nodes
    )
    return replace(
        config,
        nodes=nodes,
        tls_ca_file=security.ca_file,
        tls_client_auth="require",
        auth_tokens_file=security.auth_tokens_file,
    )


def wait_ready(
    endpoints: list[str],
    nodes: int,
    timeout_s: float,
    security: ClientSecurity | None = None,
) -> api.ClusterStatusResponse:
    """Poll ClusterStatus until a leader is known and every node is registered UP."""
    security = security or ClientSecurity()
    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        for endpoint in endpoints:
            try:
                with security.channel(endpoint) as channel:
                    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
                    status = stub.ClusterStatus(api.ClusterStatusRequest(), timeout=2.0)
                up = [n for n in status.nodes if n.state == 1]
                if status.leader_node_id and len(up) >= nodes:
                    return status
                last_error = f"leader {status.leader_node_id or '-'}, {len(up)}/{nodes} nodes up"
            except grpc.RpcError as error:
                last_error = f"{endpoint}: {error.code().name}"
        time.sleep(0.2)
    raise TimeoutError(f"cluster not ready after {timeout_s:.0f} s ({last_error})")


def up(
    directory: Path,
    nodes: int = 3,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    config: ClusterConfig | None = None,
    secure: bool = False,
) -> LocalCluster:
    directory = directory.resolve()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    existing = directory / CLUSTER_FILE
    if existing.exists():
        alive = [m for m in json.loads(existing.read_text())["nodes"] if _alive(m.get("pid"))]
        if alive:
            raise RuntimeError(
                f"a dev cluster is already running from {directory} (pids "
                f"{', '.join(str(m['pid']) for m in alive)}); run `raftwal dev down` first"
            )
    config = config or make_config(directory, nodes)
    # Even on loopback the Raft transport gets a secret: pysyncobj unpickles what peers
    # send, so without one any local user could run code in the nodes.
    secret_path = directory / SECRET_FILE
    if not secret_path.exists():
        secret_path.touch(mode=0o600)
        secret_path.write_text(secrets.token_hex(32))
    security = devcerts.generate(directory, [n.id for n in config.nodes]) if secure else None
    if security is not None:
        config = secure_config(config, security)
    (directory / CONFIG_FILE).write_text(render_config(config, secret_file=SECRET_FILE))
    process_env = dict(os.environ if env is None else env)
    cluster = LocalCluster(directory, config, {}, process_env, security)
    for node in config.nodes:
        cluster.start_node(node.id)
    cluster.write_cluster_file()
    try:
        wait_ready(cluster.endpoints, len(config.nodes), timeout_s, cluster.client_security())
    except TimeoutError:
        cluster.stop_all()
        raise
    return cluster


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours still answers kill(0); check its state where /proc exists.
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        with contextlib.suppress(OSError, IndexError):
            return stat.read_text().split(")")[-1].split()[0] != "Z"
    return True


KILL_WAIT_S = 10.0


def down(directory: Path, grace_s: float = 10.0) -> list[int]:
    """Stop the processes recorded in `directory`/cluster.json (SIGTERM: a clean stop; after
    `grace_s`, SIGKILL) and return once every one has exited; returns the pids stopped."""
    path = directory / CLUSTER_FILE
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    members = data["nodes"]
    pids = [m["pid"] for m in members if _alive(m.get("pid"))]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # Return only once every node is gone (its ports free, its files closed): a SIGKILLed
    # process still takes a moment to die.
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    still = [pid for pid in pids if _alive(pid)]
    if still:
        raise RuntimeError(f"node processes {still} did not exit after SIGKILL")
    for member in members:
        member["pid"] = None
    path.write_text(json.dumps(data, indent=2))
    return pids
