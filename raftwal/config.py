"""Node and cluster configuration: a TOML file, with environment overrides.

```toml
[cluster]
secret_file = "/etc/raftwal/secret"   # Raft transport secret (or RAFTWAL_SECRET)
node_timeout_ms = 3000

[[nodes]]
id = "n1"
host = "127.0.0.1"
grpc_port = 7201
raft_port = 7301
metrics_port = 9201                   # Prometheus /metrics on host (0 or absent: off)
data_dir = "/var/lib/raftwal/n1"
```

Every ``[cluster]`` timing can be overridden by ``RAFTWAL_<NAME>`` (upper case) in the
environment, e.g. ``RAFTWAL_NODE_TIMEOUT_MS=5000``. Secrets come from a file or the
environment (``RAFTWAL_SECRET``), never from the command line. Validation messages say
what was got and what was expected.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from statemachine.validation import NAME_CHARSET
from wal_segments.fsync_policy import parse_fsync_policy


class ConfigError(ValueError):
    """The configuration is invalid; the message says what was got and what was expected."""


@dataclass(frozen=True)
class NodeConfig:
    id: str
    host: str
    grpc_port: int
    raft_port: int
    data_dir: Path
    metrics_port: int = 0

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]
    secret: str | None = None
    # A node not heard from for this long is proposed DOWN by the leader.
    node_timeout_ms: int = 3000
    heartbeat_interval_ms: int = 300
    coordinator_tick_ms: int = 200
    # An ASSIGNING pchannel not ready after this long is reassigned with a new term.
    assign_timeout_ms: int = 15_000
    # TOMBSTONE broadcasts are kept this long for deduplication, then cleared.
    broadcast_retention_ms: int = 3_600_000
    # Events older than this many revisions behind the newest are deleted from events.db.
    event_retention_revisions: int = 1_000_000
    propose_timeout_ms: int = 5000
    # Upper bound for server-side waits (Lock/Broadcast wait, WaitResourceKey).
    max_wait_ms: int = 60_000
    # Raft election timeouts (ms): failover takes about one election timeout.
    raft_min_timeout_ms: int = 400
    raft_max_timeout_ms: int = 1200
    # Raft snapshot after this many log entries.
    raft_snapshot_entries: int = 20_000
    grpc_max_message_bytes: int = 32 * 1024 * 1024
    # WAL: fsync before acknowledging (`always`), every N ms (`interval:<ms>`) or `never`
    # (UNSAFE: acknowledged entries can be lost on power loss).
    wal_fsync_policy: str = "always"
    # The owner seals the open segment past this size or age.
    segment_max_bytes: int = 64 * 1024 * 1024
    segment_max_age_ms: int = 600_000
    # ClusterStatus flags a replica whose durable LSN is this many entries behind its
    # owner's committed LSN (a healthy replica under load stays within a few batches).
    replica_lag_warn_entries: int = 10_000
    extra: Mapping[str, object] = field(default_factory=dict)

    def node(self, node_id: str) -> NodeConfig:
        for node in self.nodes:
            if node.id == node_id:
                return node
        known = ", ".join(n.id for n in self.nodes)
        raise ConfigError(f"unknown node id {node_id!r} (expected one of: {known})")

    def node_by_raft_address(self, raft_address: str) -> NodeConfig | None:
        for node in self.nodes:
            if node.raft_address == raft_address:
                return node
        return None


_TIMINGS = {
    f.name
    for f in fields(ClusterConfig)
    if f.name.endswith(("_ms", "_revisions", "_entries", "_bytes"))
}


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _int(table: Mapping[str, object], key: str, where: str, low: int, high: int) -> int:
    value = table.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"invalid {where}.{key} ({value!r}; expected an integer {low}..{high})")
    return value


def parse_config(
    data: Mapping[str, object], base_dir: Path, environ: Mapping[str, str] | None = None
) -> ClusterConfig:
    environ = os.environ if environ is None else environ
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError("missing [[nodes]] (expected at least one node table)")
    nodes: list[NodeConfig] = []
    for index, raw in enumerate(raw_nodes):
        where = f"nodes[{index}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"invalid {where} ({raw!r}; expected a table)")
        node_id = raw.get("id")
        if not isinstance(node_id, str) or not node_id or len(node_id) > 64:
            raise ConfigError(f"invalid {where}.id ({node_id!r}; expected 1..64 chars)")
        if not all(c.isalnum() or c in "_.-" for c in node_id):
            raise ConfigError(f"invalid {where}.id ({node_id!r}; expected {NAME_CHARSET})")
        host = raw.get("host", "127.0.0.1")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"invalid {where}.host ({host!r}; expected a host name or IP)")
        data_dir = raw.get("data_dir", f"data/{node_id}")
        if not isinstance(data_dir, str):
            raise ConfigError(f"invalid {where}.data_dir ({data_dir!r}; expected a path)")
        nodes.append(
            NodeConfig(
                id=node_id,
                host=host,
                grpc_port=_int(raw, "grpc_port", where, 1, 65535),
                raft_port=_int(raw, "raft_port", where, 1, 65535),
                metrics_port=_int(raw, "metrics_port", where, 0, 65535)
                if "metrics_port" in raw
                else 0,
                data_dir=(base_dir / data_dir).resolve(),
            )
        )
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"duplicate node ids ({ids}; expected each once)")
    cluster_table = data.get("cluster", {})
    if not isinstance(cluster_table, dict):
        raise ConfigError(f"invalid [cluster] ({cluster_table!r}; expected a table)")
    config = ClusterConfig(nodes=tuple(nodes))
    overrides: dict[str, object] = {}
    for name in sorted(_TIMINGS):
        if name in cluster_table:
            overrides[name] = _int(cluster_table, name, "cluster", 1, 10**12)
        env_name = f"RAFTWAL_{name.upper()}"
        if env_name in environ:
            try:
                overrides[name] = int(environ[env_name])
            except ValueError:
                raise ConfigError(
                    f"invalid {env_name} ({environ[env_name]!r}; expected an integer)"
                ) from None
    policy = cluster_table.get("wal_fsync_policy", config.wal_fsync_policy)
    policy = environ.get("RAFTWAL_WAL_FSYNC_POLICY", policy)
    try:
        parse_fsync_policy(str(policy))
    except ValueError as error:
        raise ConfigError(f"invalid cluster.wal_fsync_policy: {error}") from None
    overrides["wal_fsync_policy"] = str(policy)
    secret = environ.get("RAFTWAL_SECRET") or None
    secret_file = cluster_table.get("secret_file")
    if secret is None and secret_file:
        if not isinstance(secret_file, str):
            raise ConfigError(f"invalid cluster.secret_file ({secret_file!r}; expected a path)")
        path = (base_dir / secret_file).resolve()
        try:
            secret = path.read_text().strip() or None
        except OSError as error:
            raise ConfigError(f"cannot read cluster.secret_file {path}: {error}") from None
    config = replace(config, secret=secret, **overrides)  # type: ignore[arg-type]
    if config.raft_min_timeout_ms >= config.raft_max_timeout_ms:
        raise ConfigError(
            f"invalid raft timeouts ({config.raft_min_timeout_ms}..{config.raft_max_timeout_ms} "
            "ms; expected min < max)"
        )
    return config


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> ClusterConfig:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"invalid TOML in {path}: {error}") from None
    return parse_config(data, path.parent, environ)


def check_transport_security(config: ClusterConfig, node: NodeConfig) -> None:
    """Refuse to run a Raft transport off loopback without a secret: pysyncobj unpickles
    what peers send, so an open port without authentication runs anyone's code."""
    if config.secret is None and not _is_loopback(node.host):
        raise ConfigError(
            f"node {node.id} listens on {node.host}, which is not loopback, and no cluster "
            "secret is configured (expected [cluster] secret_file or RAFTWAL_SECRET): "
            "refusing to start an unauthenticated Raft transport"
        )


def render_config(config: ClusterConfig, secret_file: str | None = None) -> str:
    """TOML text for `config` (used by `raftwal dev up`)."""
    lines = ["[cluster]"]
    if secret_file:
        lines.append(f'secret_file = "{secret_file}"')
    for name in sorted(_TIMINGS):
        lines.append(f"{name} = {getattr(config, name)}")
    lines.append(f'wal_fsync_policy = "{config.wal_fsync_policy}"')
    for node in config.nodes:
        lines += [
            "",
            "[[nodes]]",
            f'id = "{node.id}"',
            f'host = "{node.host}"',
            f"grpc_port = {node.grpc_port}",
            f"raft_port = {node.raft_port}",
            f"metrics_port = {node.metrics_port}",
            f'data_dir = "{node.data_dir}"',
        ]
    return "\n".join(lines) + "\n"
