"""A local cluster on loopback for trying raftwal and for tests: ``raftwal dev up|down``.

``up`` picks free ports on 127.0.0.1 (gRPC, Raft and Prometheus metrics per node), writes
``<dir>/raftwal.toml`` (and a random Raft transport secret in ``<dir>/secret``, mode 0600)
and starts one ``raftwal node`` process per node in the background (logs in
``<dir>/<id>.log``, in the format ``RAFTWAL_LOG_FORMAT`` names: text or json), waits
until a leader is elected and every node is registered, and records the members with
their pids in ``<dir>/cluster.json`` (which the other CLI commands read for their default
endpoints). ``down`` stops those processes by pid (SIGTERM, then SIGKILL after a grace
period). Nothing else is ever signalled.

``restart`` (``raftwal dev restart --rolling``) restarts the nodes one at a time, the Raft
leader last: SIGTERM (the node hands over its pchannels and its leadership first, see
``raftwal.node.process``), wait for the exit (SIGKILL after the node's handover timeout
plus a grace), start it again, and wait until it is healthy and caught up (registered UP,
its Raft log applied to where the leader's commit index stood, its WAL replicas durable to
where each owner's committed LSN stood, no pchannel ASSIGNING) and the owners are
balanced again, before the next node. ``rolling_restart`` is the same for tests and
benchmarks (``signum=SIGKILL`` gives the crash roll to compare with).

Every dev cluster has a ``cluster_id`` (``dev`` unless ``raftwal dev up --cluster-id``
names another), so that two of them can replicate to each other.

``up(secure=True)`` (``raftwal dev up --secure``) also makes a new local CA, node and
client certificates and a token per role (``raftwal.cli.devcerts``), and configures the nodes
for TLS, mutual TLS and bearer-token auth; ``cluster.json`` then names the CA, the client
certificate and the token files, so that the CLI connects with them (admin token) and
tests can pick another role (``LocalCluster.client_security``).

On a slow or busy machine one factor stretches every wait these helpers make:
``RAFTWAL_TEST_TIME_SCALE`` (default 1; ``scaled``). The test suite derives its own
deadlines from the same factor (``tests/timing.py``). ``RAFTWAL_PORT_RANGE`` (``LO-HI``)
makes ``free_ports`` pick from that range instead of the kernel's ephemeral one: the test
suite gives each of its parallel workers a range of its own there.

It is also the helper API that ``raftwal.chaos``, the tests and the benchmarks use to run
clusters: ``ClusterConfig``, ``NodeConfig`` and ``render_config`` are re-exported here so
that they need nothing else from the node's modules.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from raftwal.cli import devcerts, netns
from raftwal.node.config import ClusterConfig, NodeConfig, load_config, render_config
from raftwal.node.security import ADMIN
from rpc.credentials import ClientSecurity
from rpc.placement import address_for
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc

if TYPE_CHECKING:
    from raftwal.cli import forkserver

__all__ = [
    "CLUSTER_FILE",
    "CONFIG_FILE",
    "SECRET_FILE",
    "ClusterConfig",
    "LocalCluster",
    "NodeConfig",
    "down",
    "free_ports",
    "scaled",
    "time_scale",
    "make_config",
    "node_processes",
    "render_config",
    "RestartStep",
    "load",
    "restart_node",
    "rolling_restart",
    "secure_config",
    "signal_node",
    "up",
    "wait_caught_up",
    "wait_ready",
]

TIME_SCALE_ENV = "RAFTWAL_TEST_TIME_SCALE"
PORT_RANGE_ENV = "RAFTWAL_PORT_RANGE"

CLUSTER_FILE = "cluster.json"
CONFIG_FILE = "raftwal.toml"
SECRET_FILE = "secret"
# The cluster_id of a dev cluster unless `--cluster-id` names another (two dev clusters
# that replicate to each other need two ids).
DEV_CLUSTER_ID = "dev"


_fork_server: forkserver.ForkServer | None = None


def use_fork_server(log_path: Path | None = None) -> None:
    """Fork the nodes this process starts from now on from a fork server (`forkserver`),
    which imported what a node imports once, instead of starting a fresh interpreter for
    each. For a process that outlives its clusters (the test suite's workers): the server
    stops its nodes when this process exits. `stop_fork_server` ends it."""
    global _fork_server
    from raftwal.cli import forkserver

    if _fork_server is None or not _fork_server.alive:
        _fork_server = forkserver.ForkServer(log_path)


def stop_fork_server() -> None:
    """Stop the fork server (and any node of it still running)."""
    global _fork_server
    server, _fork_server = _fork_server, None
    if server is not None:
        server.close()


def time_scale() -> float:
    """The factor every wait of these helpers (and of the test suite) is multiplied by:
    ``RAFTWAL_TEST_TIME_SCALE``, default 1, bounded to 0.1..100."""
    raw = os.environ.get(TIME_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(
            f"invalid {TIME_SCALE_ENV} ({raw!r}; expected a number 0.1..100)"
        ) from None
    if not 0.1 <= factor <= 100:
        raise ValueError(f"invalid {TIME_SCALE_ENV} ({raw!r}; expected a number 0.1..100)")
    return factor


def scaled(seconds: float) -> float:
    """`seconds` stretched by ``time_scale()``: the bound of a wait, never a poll interval."""
    return seconds * time_scale()


def _port_range() -> tuple[int, int] | None:
    raw = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not raw:
        return None
    low, sep, high = raw.partition("-")
    try:
        bounds = (int(low), int(high)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 1024 <= bounds[0] < bounds[1] <= 65535:
        raise ValueError(f"invalid {PORT_RANGE_ENV} ({raw!r}; expected LO-HI within 1024..65535)")
    return bounds


# Where the next pick from RAFTWAL_PORT_RANGE starts: a random place in the range at first,
# then after the last port handed out, so that ports given to a cluster that has not bound
# them yet are not handed out again by this process.
_range_cursor: int | None = None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago (bound all at once, then closed).

    Without ``RAFTWAL_PORT_RANGE`` the kernel picks them from its ephemeral range. With
    it, they come from that range (outside the ephemeral one, where neither a socket bound
    to port 0 nor an outgoing connection can take a port between this pick and the node's
    bind); a port that cannot be bound now (in use, or in TIME_WAIT) is skipped."""
    global _range_cursor
    bounds = _port_range()
    sockets = []
    try:
        if bounds is None:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind((host, 0))
                sockets.append(sock)
            return [sock.getsockname()[1] for sock in sockets]
        low, high = bounds
        size = high - low + 1
        if _range_cursor is None:
            _range_cursor = low + secrets.randbelow(size)
        for _ in range(size):
            port = _range_cursor
            _range_cursor = low + (_range_cursor + 1 - low) % size
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
            if len(sockets) == count:
                return [s.getsockname()[1] for s in sockets]
        raise RuntimeError(
            f"only {len(sockets)} of {count} ports free in {PORT_RANGE_ENV} {low}-{high}"
        )
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class LocalCluster:
    """A set of node processes started from one config, by pid."""

    directory: Path
    config: ClusterConfig
    processes: dict[str, subprocess.Popen[bytes] | forkserver.ForkedProcess | None]
    env: dict[str, str]
    # The key material of a cluster started with secure=True.
    security: devcerts.DevSecurity | None = None
    # Pids from cluster.json of nodes this process did not start (`load`).
    recorded_pids: dict[str, int] = field(default_factory=dict)
    # How clients connect when the key material is not ours (`load` of a secure cluster).
    recorded_client_security: ClientSecurity | None = None
    # The nodes' network namespaces (`up(netns=True)`): each node runs in its own.
    netns: netns.NetnsHosts | None = None
    # Nodes added by `add_node`: each runs from a config file of its own (itself and the
    # cluster to join), so that the cluster's raftwal.toml is never rewritten.
    joined_configs: dict[str, Path] = field(default_factory=dict)
    # The nats-server of `up(with_nats=True)`: {"url", "pid", "dir"} (in cluster.json).
    nats: dict[str, object] | None = None

    def remove_hosts(self) -> None:
        """Remove the nodes' network namespaces and their bridge (after `stop_all`)."""
        if self.netns is not None:
            self.netns.destroy()

    @property
    def endpoints(self) -> list[str]:
        return [n.grpc_address for n in self.config.nodes]

    def node(self, node_id: str) -> NodeConfig:
        return self.config.node(node_id)

    def node_of(self, address: str) -> str:
        """The id of the node serving at gRPC `address`: its control port or one of its
        data workers' (whose ports a local cluster fixes in its config)."""
        for node in self.config.nodes:
            workers = {f"{node.host}:{port}" for port in node.worker_grpc_ports}
            if address == node.grpc_address or address in workers:
                return node.id
        raise KeyError(f"no node of this cluster serves at {address}")

    def data_endpoints(self, pchannel: str = "") -> list[str]:
        """Where each node serves `pchannel` (its data worker for it, rpc.placement): the
        endpoints of StreamingNode and Replication, as `endpoints` are the Coordinator's."""
        return [
            address_for(n.grpc_address, self.worker_addresses(n.id), pchannel)
            for n in self.config.nodes
        ]

    def worker_addresses(self, node_id: str) -> list[str]:
        """The gRPC addresses of `node_id`'s data workers, by index (fixed in the config)."""
        node = self.config.node(node_id)
        return [f"{node.host}:{port}" for port in node.worker_grpc_ports]

    def client_security(self, role: str = ADMIN) -> ClientSecurity:
        """How a client connects with `role`'s token (over mutual TLS); plaintext without
        a token for a cluster started without secure=True."""
        if self.security is None:
            return self.recorded_client_security or ClientSecurity()
        return ClientSecurity.load(
            token_file=self.security.token_files[role],
            tls_ca_file=self.security.ca_file,
            tls_cert_file=self.security.client_cert_file,
            tls_key_file=self.security.client_key_file,
        )

    def pid(self, node_id: str) -> int | None:
        process = self.processes.get(node_id)
        if process is not None:
            return process.pid
        return self.recorded_pids.get(node_id)

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
            str(self.joined_configs.get(node_id, self.directory / CONFIG_FILE)),
            "--id",
            node_id,
        ]
        env = {**self.env, **(extra_env or {})}
        if self.netns is None and _fork_server is not None:
            log_file.close()
            self.processes[node_id] = _fork_server.spawn(
                command[3:], env=env, log_path=log_path, cwd=Path.cwd()
            )
            return
        if self.netns is not None:
            command = self.netns.command(node_id, command)
        self.processes[node_id] = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log_file.close()

    def kill(self, node_id: str, signum: int = signal.SIGKILL) -> None:
        """Signal `node_id`: SIGKILL, SIGSTOP and SIGCONT reach every process of the node
        (`signal_node`), SIGTERM its supervisor (which stops the others); wait for the
        exit of the whole node after SIGKILL and SIGTERM."""
        process = self.processes.get(node_id)
        if process is None:
            return
        if signum == signal.SIGTERM:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)
        else:
            signal_node(process.pid, signum)
        if signum in (signal.SIGKILL, signal.SIGTERM):
            try:
                process.wait(timeout=scaled(KILL_WAIT_S))
            except subprocess.TimeoutExpired:
                signal_node(process.pid, signal.SIGKILL)
                process.wait(timeout=scaled(KILL_WAIT_S))
            self.processes[node_id] = None

    def stop_all(self, grace_s: float = 5.0) -> None:
        for process in self.processes.values():
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
        deadline = time.monotonic() + scaled(grace_s)
        for node_id, process in list(self.processes.items()):
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_node(process.pid, signal.SIGKILL)
                process.wait(timeout=scaled(KILL_WAIT_S))
            self.processes[node_id] = None

    def write_cluster_file(self) -> None:
        # A cluster loaded from its directory keeps the security section it was started with.
        path = self.directory / CLUSTER_FILE
        previous: dict[str, object] = {}
        if self.security is None and path.exists():
            with contextlib.suppress(OSError, ValueError):
                previous = json.loads(path.read_text())
        members = [
            {
                "id": node.id,
                "grpc": node.grpc_address,
                "raft": node.raft_address,
                "metrics_port": node.metrics_port,
                "pid": self.pid(node.id),
                "data_dir": str(node.data_dir),
                **(
                    {"config": str(self.joined_configs[node.id])}
                    if node.id in self.joined_configs
                    else {}
                ),
            }
            for node in self.config.nodes
        ]
        data: dict[str, object] = {"nodes": members}
        if self.netns is not None:
            data["netns"] = self.netns.to_json()
        if previous.get("security"):
            data["security"] = previous["security"]
        if self.nats is not None:
            data["nats"] = self.nats
        elif previous.get("nats"):
            data["nats"] = previous["nats"]
        if self.security is not None:
            data["security"] = {
                "tls_ca_file": str(self.security.ca_file),
                "tls_cert_file": str(self.security.client_cert_file),
                "tls_key_file": str(self.security.client_key_file),
                "token_file": str(self.security.token_files[ADMIN]),
                "token_files": {r: str(f) for r, f in self.security.token_files.items()},
            }
        (self.directory / CLUSTER_FILE).write_text(json.dumps(data, indent=2))


#: The ports of a node alone in its network namespace (`up(netns=True)`), and its data
#: worker's gRPC port.
NETNS_PORTS = (7201, 7301, 9201, 7601)
NETNS_WORKER_GRPC_PORT = 7211

#: Data workers per node of a local cluster (the node's default, the machine's cores minus
#: one, would give three nodes on one machine three times the cores): RAFTWAL_DEV_DATA_WORKERS
#: overrides it.
DEV_DATA_WORKERS = 1
DATA_WORKERS_ENV = "RAFTWAL_DEV_DATA_WORKERS"


def dev_data_workers() -> int:
    raw = os.environ.get(DATA_WORKERS_ENV, "").strip()
    if not raw:
        return DEV_DATA_WORKERS
    if not raw.isdigit() or not 1 <= int(raw) <= 16:
        raise ValueError(f"invalid {DATA_WORKERS_ENV} ({raw!r}; expected 1..16)")
    return int(raw)


def make_netns_config(
    directory: Path, hosts: netns.NetnsHosts, data_nodes: int = 0
) -> ClusterConfig:
    """A node per namespace of `hosts`, each on its own address with the same ports."""
    grpc_port, raft_port, metrics_port, transfer_port = NETNS_PORTS
    count = len(hosts.node_ids)
    return ClusterConfig(
        nodes=tuple(
            NodeConfig(
                id=node_id,
                host=hosts.address(node_id),
                grpc_port=grpc_port,
                raft_port=raft_port,
                metrics_port=metrics_port,
                transfer_port=transfer_port,
                data_dir=(directory / node_id).resolve(),
                role="data" if k >= count - data_nodes else "voter",
                data_workers=1,
                worker_grpc_ports=(NETNS_WORKER_GRPC_PORT,),
            )
            for k, node_id in enumerate(hosts.node_ids)
        )
    )


def make_config(
    directory: Path,
    nodes: int,
    host: str = "127.0.0.1",
    data_nodes: int = 0,
    data_workers: int = 0,
) -> ClusterConfig:
    """`nodes` nodes n1..nN on free ports; the last `data_nodes` of them do not vote.

    Every port is picked here, the segment transfer port too: a node binding port 0 gets a
    port from the kernel's ephemeral range, the same range these picks come from, and could
    take a port picked for a node that has not bound it yet (CI saw a node's transfer port
    take another node's metrics port, which then failed to start). `data_workers` per node
    (0: `dev_data_workers()`)."""
    workers = data_workers or dev_data_workers()
    # Per node: gRPC, Raft, metrics, transfer (worker 0's), each worker's gRPC port and
    # every other worker's transfer port.
    per_node = 4 + workers + (workers - 1)
    ports = free_ports(nodes * per_node, host)
    members = []
    for k in range(nodes):
        mine = ports[per_node * k : per_node * (k + 1)]
        members.append(
            NodeConfig(
                id=f"n{k + 1}",
                host=host,
                grpc_port=mine[0],
                raft_port=mine[1],
                metrics_port=mine[2],
                transfer_port=mine[3],
                data_dir=(directory / f"n{k + 1}").resolve(),
                role="data" if k >= nodes - data_nodes else "voter",
                data_workers=workers,
                worker_grpc_ports=tuple(mine[4 : 4 + workers]),
                worker_transfer_ports=(mine[3], *mine[4 + workers :]) if workers > 1 else (),
            )
        )
    return ClusterConfig(nodes=tuple(members))


def secure_config(
    config: ClusterConfig, security: devcerts.DevSecurity, mutual_tls: bool = True
) -> ClusterConfig:
    """`config` with TLS, mutual TLS (unless not `mutual_tls`) and token auth from
    `security`."""
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
        tls_client_auth="require" if mutual_tls else "none",
        auth_tokens_file=security.auth_tokens_file,
    )


def wait_ready(
    endpoints: list[str],
    nodes: int,
    timeout_s: float,
    security: ClientSecurity | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> api.ClusterStatusResponse:
    """Poll ClusterStatus until a leader is known and every node is registered UP with
    its data workers announced (so that no registration is still on its way when a
    caller starts); `on_progress` hears what is still missing after each round."""
    security = security or ClientSecurity()
    deadline = time.monotonic() + scaled(timeout_s)
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        for endpoint in endpoints:
            try:
                with security.channel(endpoint) as channel:
                    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
                    status = stub.ClusterStatus(api.ClusterStatusRequest(), timeout=scaled(2.0))
                up = [n for n in status.nodes if n.state == 1 and n.worker_addresses]
                if status.leader_node_id and len(up) >= nodes:
                    return status
                last_error = (
                    f"leader {status.leader_node_id or '-'}, {len(up)}/{nodes} nodes up with "
                    "their data workers"
                )
            except grpc.RpcError as error:
                last_error = f"{endpoint}: {error.code().name}"
        if on_progress is not None:
            on_progress(f"waiting for a leader and {nodes} nodes UP ({last_error})")
        time.sleep(0.2)
    raise TimeoutError(f"cluster not ready after {scaled(timeout_s):.0f} s ({last_error})")


def up(
    directory: Path,
    nodes: int = 3,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    config: ClusterConfig | None = None,
    secure: bool = False,
    data_nodes: int = 0,
    ca_cert_file: Path | None = None,
    ca_key_file: Path | None = None,
    on_progress: Callable[[str], None] | None = None,
    in_netns: bool = False,
    cluster_id: str | None = None,
    mutual_tls: bool = True,
    with_nats: bool = False,
) -> LocalCluster:
    """Start a local cluster in `directory` and return once it is ready (`wait_ready`);
    `on_progress` hears each step (`raftwal dev up` shows them on a terminal). With
    `in_netns`, each node runs in a network namespace of its own, on its own address
    (raftwal.cli.netns; root only); `down` removes them. With `secure` and not
    `mutual_tls`, clients need the CA and a token but no certificate of their own (what a
    replication target needs: a source's replicator presents no client certificate)."""
    say = on_progress or (lambda _step: None)
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
    hosts = None
    if in_netns:
        if config is not None:
            raise ValueError("in_netns makes its own config (expected config=None)")
        say("creating a network namespace per node")
        hosts = netns.create([f"n{k + 1}" for k in range(nodes)])
        config = make_netns_config(directory, hosts, data_nodes)
    try:
        return _start(
            directory,
            nodes,
            timeout_s,
            env,
            config,
            secure,
            data_nodes,
            ca_cert_file,
            ca_key_file,
            say,
            on_progress,
            hosts,
            cluster_id,
            mutual_tls,
            with_nats,
        )
    except BaseException:
        if hosts is not None:
            hosts.destroy()
        raise


def _start(
    directory: Path,
    nodes: int,
    timeout_s: float,
    env: dict[str, str] | None,
    config: ClusterConfig | None,
    secure: bool,
    data_nodes: int,
    ca_cert_file: Path | None,
    ca_key_file: Path | None,
    say: Callable[[str], None],
    on_progress: Callable[[str], None] | None,
    hosts: netns.NetnsHosts | None,
    cluster_id: str | None,
    mutual_tls: bool = True,
    with_nats: bool = False,
) -> LocalCluster:
    config = config or make_config(directory, nodes, data_nodes=data_nodes)
    if cluster_id is not None or not config.cluster_id:
        config = replace(config, cluster_id=cluster_id or DEV_CLUSTER_ID)
    # Even on loopback the Raft transport gets a secret: pysyncobj unpickles what peers
    # send, so without one any local user could run code in the nodes.
    secret_path = directory / SECRET_FILE
    if not secret_path.exists():
        secret_path.touch(mode=0o600)
        secret_path.write_text(secrets.token_hex(32))
    if secure:
        say("generating certificates and tokens")
    security = (
        devcerts.generate(
            directory,
            [n.id for n in config.nodes],
            ca_cert_file,
            ca_key_file,
            hosts={n.id: n.host for n in config.nodes},
        )
        if secure
        else None
    )
    if security is not None:
        config = secure_config(config, security, mutual_tls)
    (directory / CONFIG_FILE).write_text(render_config(config, secret_file=SECRET_FILE))
    process_env = dict(os.environ if env is None else env)
    cluster = LocalCluster(directory, config, {}, process_env, security, netns=hosts)
    for node in config.nodes:
        say(f"starting {node.id}")
        cluster.start_node(node.id)
    cluster.write_cluster_file()
    try:
        wait_ready(
            cluster.endpoints,
            len(config.nodes),
            timeout_s,
            cluster.client_security(),
            on_progress=on_progress,
        )
    except TimeoutError:
        cluster.stop_all()
        raise
    if with_nats:
        say("starting nats-server")
        try:
            cluster.nats = start_nats(directory)
        except RuntimeError:
            cluster.stop_all()
            raise
        cluster.write_cluster_file()
    return cluster


def stop_nats(cluster: LocalCluster) -> None:
    """Stop the dev cluster's nats-server (`up(with_nats=True)`), by its pid."""
    if cluster.nats is not None and isinstance(cluster.nats.get("pid"), int):
        _stop_pid(int(cluster.nats["pid"]), 5.0)  # type: ignore[arg-type]
        cluster.nats["pid"] = None


def node_processes(pid: int) -> list[int]:
    """`pid` (a node's supervisor) and every process under it (its control process and
    data workers), read from /proc; the supervisor first."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    raw = stat.read()
                parent = int(raw[raw.rfind(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 1024:
        current = todo.pop(0)
        found.append(current)
        todo.extend(sorted(children.get(current, [])))
    return found


def signal_node(pid: int, signum: int) -> list[int]:
    """Send `signum` to every process of the node whose supervisor is `pid` (a node is a
    supervisor, a control process and data workers, not one process: pausing only the
    supervisor would pause nothing that serves). The supervisor first, so that it cannot
    start a worker again between the signals; after SIGKILL, returns once every one of
    them is gone (its ports free). Returns the pids signalled."""
    pids = node_processes(pid)
    for target in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signum)
    if signum == signal.SIGKILL:
        deadline = time.monotonic() + scaled(KILL_WAIT_S)
        while time.monotonic() < deadline and any(_alive(p) for p in pids[1:]):
            time.sleep(0.01)
    return pids


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


def nats_binary() -> str | None:
    """The nats-server to run: the venv's (scripts/install-nats.sh installs >= 2.10 there),
    else the one on PATH."""
    venv = Path(sys.executable).parent / "nats-server"
    if venv.exists():
        return str(venv)
    return shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )


NATS_DIR = "nats"


def start_nats(
    directory: Path, timeout_s: float = 10.0, port: int | None = None
) -> dict[str, object]:
    """Start a nats-server with JetStream for the dev cluster in `directory`/nats (its store
    and log there), on a free loopback port, in a session of its own (it outlives this
    process; `down` stops it by pid). Returns {"url", "pid", "dir"}."""
    binary = nats_binary()
    if binary is None:
        raise RuntimeError("nats-server is not installed (run scripts/install-nats.sh)")
    home = directory / NATS_DIR
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    # `port`: the one it had (started again after a kill, on the same store).
    port = port or free_ports(1)[0]
    with open(home / "nats.log", "ab") as log:
        process = subprocess.Popen(
            [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(home / "store")],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return {"url": f"nats://127.0.0.1:{port}", "pid": process.pid, "dir": str(home)}
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited at start (see {home / 'nats.log'})")
        time.sleep(0.05)
    process.kill()
    process.wait(timeout=10)
    raise RuntimeError(f"nats-server did not listen within {timeout_s} s")


def _stop_pid(pid: int, grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + scaled(grace_s)
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + scaled(KILL_WAIT_S)
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


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
    deadline = time.monotonic() + scaled(grace_s)
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            signal_node(pid, signal.SIGKILL)
    # Return only once every node is gone (its ports free, its files closed): a SIGKILLed
    # process still takes a moment to die.
    deadline = time.monotonic() + scaled(KILL_WAIT_S)
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    still = [pid for pid in pids if _alive(pid)]
    if still:
        raise RuntimeError(f"node processes {still} did not exit after SIGKILL")
    for member in members:
        member["pid"] = None
    if data.get("netns"):
        # The nodes ran in namespaces of their own (`up(in_netns=True)`): remove them.
        netns.NetnsHosts.from_json(data.pop("netns")).destroy()
    nats = data.get("nats") or {}
    if isinstance(nats.get("pid"), int) and _alive(nats["pid"]):
        _stop_pid(nats["pid"], grace_s)
        pids.append(nats["pid"])
        nats["pid"] = None
    path.write_text(json.dumps(data, indent=2))
    return pids


# ---------------------------------------------------------------------------------------
# Restarts
# ---------------------------------------------------------------------------------------

# After the node's own handover bound, how long a stopping node may take to exit before it
# is killed (closing files, the Raft journal, the gRPC server's grace).
EXIT_GRACE_S = 10.0
RESTART_POLL_S = 0.1


def load(directory: Path) -> LocalCluster:
    """The dev cluster recorded in `directory` (raftwal.toml and cluster.json), with the
    pids it recorded, so that another process can restart its nodes."""
    directory = directory.resolve()
    path = directory / CLUSTER_FILE
    if not path.is_file():
        raise RuntimeError(
            f"no dev cluster in {directory} (no {CLUSTER_FILE}; run `raftwal dev up`)"
        )
    try:
        data = json.loads(path.read_text())
        pids = {str(m["id"]): int(m["pid"]) for m in data["nodes"] if m.get("pid")}
        security = data.get("security") or {}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RuntimeError(f"cannot read {path} ({error})") from None
    config = load_config(directory / CONFIG_FILE)
    joined: dict[str, Path] = {}
    for member in data["nodes"]:
        if member.get("config"):
            joined[str(member["id"])] = Path(member["config"])
            node = load_config(Path(member["config"])).node(str(member["id"]))
            config = replace(config, nodes=(*config.nodes, node))
    client_security = None
    if security:
        client_security = ClientSecurity.load(
            token_file=Path(security["token_file"]) if security.get("token_file") else None,
            tls_ca_file=Path(security["tls_ca_file"]) if security.get("tls_ca_file") else None,
            tls_cert_file=Path(security["tls_cert_file"])
            if security.get("tls_cert_file")
            else None,
            tls_key_file=Path(security["tls_key_file"]) if security.get("tls_key_file") else None,
        )
    return LocalCluster(
        directory,
        config,
        {},
        dict(os.environ),
        None,
        recorded_pids=pids,
        recorded_client_security=client_security,
        netns=netns.NetnsHosts.from_json(data["netns"]) if data.get("netns") else None,
        joined_configs=joined,
    )


def add_node(
    cluster: LocalCluster,
    timeout_s: float = 60.0,
    on_progress: Callable[[str], None] | None = None,
) -> NodeConfig:
    """Start one more node that joins `cluster` (`raftwal node --join`): a data node with
    a config file of its own, in a namespace of its own when the cluster's nodes are; the
    other nodes and the cluster's raftwal.toml are left as they are. Returns once the
    cluster has registered it UP. `raftwal member add ID` makes it a voter."""
    say = on_progress or (lambda _step: None)
    taken = {n.id for n in cluster.config.nodes}
    number = len(taken) + 1
    while f"n{number}" in taken:
        number += 1
    node_id = f"n{number}"
    if cluster.netns is not None:
        say(f"creating a network namespace for {node_id}")
        cluster.netns = cluster.netns.add_host(node_id)
        grpc_port, raft_port, metrics_port, transfer_port = NETNS_PORTS
        host = cluster.netns.address(node_id)
    else:
        host = "127.0.0.1"
        grpc_port, raft_port, metrics_port, transfer_port = free_ports(4, host)
    node = NodeConfig(
        id=node_id,
        host=host,
        grpc_port=grpc_port,
        raft_port=raft_port,
        metrics_port=metrics_port,
        transfer_port=transfer_port,
        data_dir=(cluster.directory / node_id).resolve(),
        role="data",
    )
    if cluster.config.tls:
        cert, key = devcerts.issue_node(cluster.directory, node_id, host)
        node = replace(node, tls_cert_file=cert, tls_key_file=key)
    path = cluster.directory / f"{node_id}.toml"
    joined = replace(cluster.config, nodes=(node,), join=tuple(cluster.endpoints))
    path.write_text(render_config(joined, secret_file=str(cluster.directory / SECRET_FILE)))
    cluster.joined_configs[node_id] = path
    cluster.config = replace(cluster.config, nodes=(*cluster.config.nodes, node))
    say(f"starting {node_id}")
    cluster.start_node(node_id)
    cluster.write_cluster_file()
    wait_ready(
        cluster.endpoints,
        len(cluster.config.nodes),
        timeout_s,
        cluster.client_security(),
        on_progress=on_progress,
    )
    return node


@dataclass
class RestartStep:
    """What one node's restart took."""

    node_id: str
    #: SIGTERM (or the signal given) to the process's exit
    exit_s: float
    #: it did not exit in time and was killed
    killed: bool
    #: start to healthy and caught up
    ready_s: float
    #: ready to balanced owners (None: not balanced within the bound, or not waited for)
    balanced_s: float | None
    old_pid: int | None
    new_pid: int | None


def _stop_process(cluster: LocalCluster, node_id: str, signum: int, exit_timeout_s: float) -> bool:
    """Signal `node_id`'s process and wait for its exit; SIGKILL after `exit_timeout_s`.
    True when it had to be killed."""
    process = cluster.processes.get(node_id)
    pid = cluster.pid(node_id)
    if pid is None or (process is None and not _alive(pid)):
        return False
    if signum == signal.SIGKILL:
        signal_node(pid, signum)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    killed = False
    exit_timeout_s = scaled(exit_timeout_s)
    deadline = time.monotonic() + exit_timeout_s
    if process is not None:
        try:
            process.wait(timeout=exit_timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
            signal_node(pid, signal.SIGKILL)
            process.wait(timeout=scaled(KILL_WAIT_S))
    else:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            killed = True
            signal_node(pid, signal.SIGKILL)
            kill_deadline = time.monotonic() + scaled(KILL_WAIT_S)
            while _alive(pid) and time.monotonic() < kill_deadline:
                time.sleep(0.05)
            if _alive(pid):
                raise RuntimeError(f"node {node_id} (pid {pid}) did not exit after SIGKILL")
    cluster.processes[node_id] = None
    cluster.recorded_pids.pop(node_id, None)
    return killed


def _status_once(
    endpoints: list[str], security: ClientSecurity, prefer_not: str = ""
) -> api.ClusterStatusResponse | None:
    """ClusterStatus from the first endpoint that answers (`prefer_not` last)."""
    ordered = [e for e in endpoints if e != prefer_not] + [e for e in endpoints if e == prefer_not]
    for endpoint in ordered:
        try:
            with security.channel(endpoint) as channel:
                stub = coordinator_pb2_grpc.CoordinatorStub(channel)
                return stub.ClusterStatus(api.ClusterStatusRequest(), timeout=scaled(2.0))
        except grpc.RpcError:
            continue
    return None


class _CatchUp:
    """Whether a restarted node has caught up: the targets are the leader's commit index
    and each owner's committed LSN as first seen once the node answers, so a steady write
    load cannot keep the node from ever being caught up."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.raft_target: int | None = None
        self.wal_targets: dict[str, int] = {}

    def problem(self, status: api.ClusterStatusResponse) -> str | None:
        node_id = self.node_id
        if not status.leader_node_id:
            return "no Raft leader"
        registered = {n.node_id: n for n in status.nodes}
        if node_id not in registered or registered[node_id].state != pb.NODE_STATE_UP:
            return f"{node_id} not registered UP yet"
        members = {m.node_id: m for m in status.members}
        member = members.get(node_id)
        if member is None or not member.reachable:
            return f"{node_id} does not answer yet"
        leader = members.get(status.leader_node_id)
        if leader is None or not leader.reachable:
            return "the leader does not answer"
        if self.raft_target is None:
            self.raft_target = leader.commit_index
        if member.applied_index < self.raft_target:
            return f"{node_id} applied Raft index {member.applied_index} of {self.raft_target}"
        for other in status.members:
            for owner in other.owners:
                if owner.state != "serving":
                    continue
                for replica in owner.replicas:
                    if replica.node_id != node_id:
                        continue
                    target = self.wal_targets.setdefault(owner.pchannel, owner.committed_lsn)
                    if replica.durable_lsn < target:
                        return (
                            f"{node_id} holds {owner.pchannel} to LSN {replica.durable_lsn} of "
                            f"{target}"
                        )
        for channel in status.pchannels:
            if channel.state != pb.PCHANNEL_STATE_ASSIGNED:
                return f"pchannel {channel.name} is {pb.PChannelState.Name(channel.state)}"
        return None


def _balance_problem(status: api.ClusterStatusResponse) -> str | None:
    """Owners differ by more than one between UP, unfrozen nodes (when rebalancing is on)."""
    if not status.balance_policy.allow_rebalance:
        return None
    counts = {n.node_id: 0 for n in status.nodes if n.state == pb.NODE_STATE_UP and not n.frozen}
    for channel in status.pchannels:
        if channel.state == pb.PCHANNEL_STATE_ASSIGNED and channel.owner_node_id in counts:
            counts[channel.owner_node_id] += 1
    if counts and max(counts.values()) - min(counts.values()) > 1:
        return f"owners not balanced: {dict(sorted(counts.items()))}"
    return None


def wait_caught_up(
    cluster: LocalCluster, node_id: str, timeout_s: float
) -> api.ClusterStatusResponse:
    """Poll ClusterStatus until `node_id` is healthy and caught up (see the module
    docstring); TimeoutError naming what was still missing."""
    security = cluster.client_security()
    check = _CatchUp(node_id)
    timeout_s = scaled(timeout_s)
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        status = _status_once(cluster.endpoints, security)
        if status is not None:
            problem = check.problem(status)
            if problem is None:
                return status
            last = problem
        time.sleep(RESTART_POLL_S)
    raise TimeoutError(f"node {node_id} not caught up after {timeout_s:.0f} s ({last})")


def _wait_balanced(cluster: LocalCluster, timeout_s: float) -> float | None:
    security = cluster.client_security()
    started = time.monotonic()
    while time.monotonic() - started < scaled(timeout_s):
        status = _status_once(cluster.endpoints, security)
        if (
            status is not None
            and _balance_problem(status) is None
            and not any(c.state != pb.PCHANNEL_STATE_ASSIGNED for c in status.pchannels)
        ):
            return time.monotonic() - started
        time.sleep(RESTART_POLL_S)
    return None


def restart_node(
    cluster: LocalCluster,
    node_id: str,
    *,
    signum: int = signal.SIGTERM,
    exit_timeout_s: float | None = None,
    ready_timeout_s: float = 60.0,
    balance_timeout_s: float = 15.0,
) -> RestartStep:
    """Stop `node_id` with `signum` (SIGTERM: it hands over first), wait for its exit,
    start it again, wait until it has caught up, then (bounded) until owners are balanced.
    Updates cluster.json with the new pid."""
    cluster.node(node_id)
    if exit_timeout_s is None:
        exit_timeout_s = cluster.config.handover_timeout_ms / 1000 + EXIT_GRACE_S
    old_pid = cluster.pid(node_id)
    started = time.monotonic()
    killed = _stop_process(cluster, node_id, signum, exit_timeout_s)
    exited = time.monotonic()
    cluster.start_node(node_id)
    cluster.write_cluster_file()
    wait_caught_up(cluster, node_id, ready_timeout_s)
    ready = time.monotonic()
    balanced_s = _wait_balanced(cluster, balance_timeout_s) if balance_timeout_s > 0 else None
    return RestartStep(
        node_id=node_id,
        exit_s=exited - started,
        killed=killed,
        ready_s=ready - exited,
        balanced_s=balanced_s,
        old_pid=old_pid,
        new_pid=cluster.pid(node_id),
    )


def rolling_restart(
    cluster: LocalCluster,
    *,
    signum: int = signal.SIGTERM,
    exit_timeout_s: float | None = None,
    ready_timeout_s: float = 60.0,
    balance_timeout_s: float = 15.0,
    report: Callable[[RestartStep], None] | None = None,
) -> list[RestartStep]:
    """Restart every node one at a time (``restart_node``), the Raft leader last so that
    the leadership moves once. The cluster must be healthy first: every node caught up."""
    security = cluster.client_security()
    status = _status_once(cluster.endpoints, security)
    if status is None or not status.leader_node_id:
        raise RuntimeError("the cluster has no leader now: not restarting anything")
    for node in cluster.config.nodes:
        wait_caught_up(cluster, node.id, ready_timeout_s)
    leader = status.leader_node_id
    order = [n.id for n in cluster.config.nodes if n.id != leader]
    order += [n.id for n in cluster.config.nodes if n.id == leader]
    steps = []
    for node_id in order:
        step = restart_node(
            cluster,
            node_id,
            signum=signum,
            exit_timeout_s=exit_timeout_s,
            ready_timeout_s=ready_timeout_s,
            balance_timeout_s=balance_timeout_s,
        )
        steps.append(step)
        if report is not None:
            report(step)
    return steps
