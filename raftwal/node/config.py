"""Node and cluster configuration: a TOML file, with environment overrides.

```toml
[cluster]
secret_file = "/etc/raftwal/secret"   # Raft transport secret (or RAFTWAL_SECRET): required
cluster_id = "east"                   # this cluster's name in a replication configuration
node_timeout_ms = 3000
# Security of the gRPC port (raftwal/security.py); all optional, off by default.
tls_ca_file = "/etc/raftwal/ca.pem"   # verifies peers' certificates (and clients' with mTLS)
tls_client_auth = "require"           # "none" (default) or "require": mutual TLS
auth_tokens_file = "/etc/raftwal/tokens"  # lines `role token`: bearer-token auth is on

[[nodes]]
id = "n1"
host = "127.0.0.1"                    # the address other nodes and clients reach it at
listen_host = "0.0.0.0"               # optional: listen here instead of on host
grpc_port = 7201
raft_port = 7301
metrics_port = 9201                   # Prometheus /metrics on host (0 or absent: off)
transfer_port = 7601                  # segment transfers, replication (0/absent: free; -1: off)
data_dir = "/var/lib/raftwal/n1"
tls_cert_file = "/etc/raftwal/n1.pem" # this node's certificate chain and key: TLS is on
tls_key_file = "/etc/raftwal/n1.key"  # (also allowed in [cluster], for every node)
# Optional: dial these peers at another address (e.g. a per-link TCP proxy, as the chaos
# suite does): outgoing connections only; a peer's identity stays its own address.
peer_raft_addresses = { "n2" = "127.0.0.1:7402" }
peer_grpc_addresses = { "n2" = "127.0.0.1:7502" }
peer_transfer_addresses = { "n2" = "127.0.0.1:7602" }  # Append streams to n2's transfer port
# Optional: "data" makes a node that follows the Raft log without voting; it owns
# pchannels and holds replicas like any other (default "voter"). Keep 3 or 5 voters.
role = "voter"
```

Every ``[cluster]`` timing can be overridden by ``RAFTWAL_<NAME>`` (upper case) in the
environment, e.g. ``RAFTWAL_NODE_TIMEOUT_MS=5000``, and so can the security settings
(``RAFTWAL_TLS_CERT_FILE``, ``RAFTWAL_TLS_KEY_FILE``, ``RAFTWAL_TLS_CA_FILE``,
``RAFTWAL_TLS_CLIENT_AUTH``, ``RAFTWAL_AUTH_TOKENS_FILE``), and so can ``cluster_id``
(``RAFTWAL_CLUSTER_ID``). Secrets come from a file or
the environment (``RAFTWAL_SECRET``), never from the command line. Paths are read when the
node starts, not here. Validation messages say what was got and what was expected.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from statemachine.validation import NAME_RULE, is_plain_name
from wal_segments.fsync_policy import parse_fsync_policy

log = logging.getLogger(__name__)


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
    # The segment transfer port (raftwal.services.segment_transfer), which also carries
    # the Append streams of replication to this node (rpc.append_stream): 0 = any free
    # port, -1 = none (ReadSegment then always streams over gRPC, and owners replicate
    # to this node over the gRPC Append call). TLS as the gRPC port.
    transfer_port: int = 0
    # PEM certificate chain and private key of this node's gRPC port (TLS when set).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Peers this node dials somewhere else than at their own address ((peer id,
    # "host:port") pairs, e.g. a TCP proxy per link): used for this node's outgoing Raft
    # and gRPC connections only; a peer's identity stays its raft_address / grpc_address.
    # peer_transfer_addresses: where this node's Append streams reach a peer's transfer
    # port; a peer with a peer_grpc_address but none here is replicated to over gRPC
    # (its transfer port may not be reachable the way its gRPC port is).
    peer_raft_addresses: tuple[tuple[str, str], ...] = ()
    peer_grpc_addresses: tuple[tuple[str, str], ...] = ()
    peer_transfer_addresses: tuple[tuple[str, str], ...] = ()
    # "voter": a Raft member that votes and counts toward commits; "data": a node that
    # follows the Raft log without voting (pysyncobj's read-only node) and otherwise does
    # what every node does (owns pchannels, holds replicas, serves clients), so a
    # cluster grows past its three or five voters.
    role: str = "voter"
    # Where this node's ports listen (e.g. "0.0.0.0", "::" or one interface's address);
    # None: on `host`. `host` is what the other nodes and clients reach it at (the
    # advertised address), so it can never be a wildcard address.
    listen_host: str | None = None
    # Data worker processes (DESIGN.md section 2): each runs the WAL of the pchannels
    # placed on it (rpc.placement) with its own gRPC port and transfer port, beside the
    # control process (Raft, the coordinator, the Coordinator/Cluster/NodeManager
    # services on grpc_port). 0: the machine's cores minus one, at least one.
    data_workers: int = 0
    # Worker k's gRPC port (0 or absent: any free port; announced through Raft).
    worker_grpc_ports: tuple[int, ...] = ()
    # Worker k's transfer port (absent: transfer_port for worker 0, any free port for the
    # others; -1 turns it off). transfer_port = -1 turns every worker's off.
    worker_transfer_ports: tuple[int, ...] = ()
    # As peer_grpc_addresses / peer_transfer_addresses, for each peer's data workers by
    # index (peer id -> ["host:port", ...]); worker 0's transfer port defaults to
    # peer_transfer_addresses.
    peer_worker_grpc_addresses: tuple[tuple[str, tuple[str, ...]], ...] = ()
    peer_worker_transfer_addresses: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def voter(self) -> bool:
        return self.role == "voter"

    @property
    def bind_host(self) -> str:
        """The address this node's ports listen on: `listen_host`, else `host`."""
        return self.listen_host or self.host

    def bind_address(self, port: int) -> str:
        """host:port to listen on (an IPv6 address in brackets, as gRPC wants it)."""
        host = self.bind_host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    def dial_raft_address(self, peer: NodeConfig) -> str:
        """Where this node connects to `peer`'s Raft port."""
        return dict(self.peer_raft_addresses).get(peer.id, peer.raft_address)

    def dial_grpc_address(self, peer: NodeConfig) -> str:
        """Where this node connects to `peer`'s gRPC port."""
        return dict(self.peer_grpc_addresses).get(peer.id, peer.grpc_address)

    def worker_count(self) -> int:
        """How many data workers this node runs: `data_workers`, else the cores this
        process may run on minus one (at least one)."""
        if self.data_workers > 0:
            return self.data_workers
        return max(1, available_cores() - 1)

    def worker_grpc_port(self, index: int) -> int:
        """The gRPC port worker `index` listens on (0: any free port)."""
        ports = self.worker_grpc_ports
        return ports[index] if index < len(ports) else 0

    def worker_transfer_port(self, index: int) -> int:
        """The transfer port worker `index` listens on (0: any free port, -1: none)."""
        if self.transfer_port < 0:
            return -1
        ports = self.worker_transfer_ports
        if index < len(ports):
            return ports[index]
        return self.transfer_port if index == 0 else 0

    def dial_worker_grpc_address(self, peer_id: str, index: int, address: str) -> str:
        """Where this node connects to worker `index` of `peer_id`, announced at `address`."""
        routed = dict(self.peer_worker_grpc_addresses).get(peer_id, ())
        return routed[index] if index < len(routed) else address

    def dial_worker_transfer_address(
        self, peer: NodeConfig, index: int, host: str, port: int
    ) -> str | None:
        """Where this node connects to the transfer port `port` of worker `index` of
        `peer`, whose gRPC port is announced on `host`; None when `peer` is dialled
        through another gRPC address but no transfer address (a relay of gRPC only)."""
        routed = dict(self.peer_worker_transfer_addresses).get(peer.id, ())
        if index < len(routed):
            return routed[index]
        if index == 0:
            single = dict(self.peer_transfer_addresses).get(peer.id)
            if single is not None:
                return single
        if peer.id in dict(self.peer_grpc_addresses) or peer.id in dict(
            self.peer_worker_grpc_addresses
        ):
            return None
        return f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"

    def dial_transfer_address(self, peer: NodeConfig, port: int) -> str | None:
        """Where this node connects to `peer`'s transfer port, which `peer` says is `port`;
        None when `peer` is dialled through another gRPC address but no transfer address
        (a relay of gRPC only)."""
        routed = dict(self.peer_transfer_addresses).get(peer.id)
        if routed is not None:
            return routed
        if peer.id in dict(self.peer_grpc_addresses):
            return None
        return f"{peer.host}:{port}"


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]
    secret: str | None = None
    # This cluster's id in a cross-cluster replication configuration (docs/replication.md;
    # a name as for pchannels). Empty: unset, and no replication configuration can be
    # applied to the cluster. Every node of a cluster must have the same one.
    cluster_id: str = ""
    # Where the secret came from (None: RAFTWAL_SECRET or no secret); its mode is checked
    # at start (check_transport_security).
    secret_file: Path | None = None
    # A node not heard from for this long is proposed DOWN by the leader.
    node_timeout_ms: int = 3000
    heartbeat_interval_ms: int = 300
    coordinator_tick_ms: int = 200
    # An ASSIGNING pchannel not ready after this long is reassigned with a new term.
    assign_timeout_ms: int = 15_000
    # Replica repair: a node DOWN for this long (as seen by the current Raft leader) is
    # replaced in every replica set by an UP node outside it, when there is one; the new
    # replica copies the pchannel's log before the pchannel serves again. 0: never (then
    # `status` keeps listing such pchannels as under-replicated).
    replica_replace_after_ms: int = 300_000
    # On SIGTERM a node hands over (its pchannels move, then its Raft leadership) before
    # it stops; after this long it stops anyway (a second SIGTERM stops it at once).
    handover_timeout_ms: int = 10_000
    # A node whose process started less than this long ago gets no pchannel from the
    # balancer while other nodes can take it: it catches up as a replica (and the other
    # nodes' channels to it reconnect) first, so that moving a pchannel to it is quick.
    placement_warmup_ms: int = 2_000
    # TOMBSTONE broadcasts are kept this long for deduplication, then cleared.
    broadcast_retention_ms: int = 3_600_000
    # Events older than this many revisions behind the newest are deleted from events.db.
    event_retention_revisions: int = 1_000_000
    # ... and (when set) events older than this, by their proposer time (0: by revisions
    # only). WatchEvents below what is kept answers COMPACTED.
    event_retention_ms: int = 0
    # How often each node compacts its events.db.
    event_retention_check_ms: int = 30_000
    # WAL retention, per pchannel (the leader's coordinator proposes DeleteSegmentsBefore;
    # every replica then deletes the same committed segments). A committed segment goes
    # when its newest entry is older than wal_retention_ms (default 7 days, as Kafka's
    # retention.ms), or while the pchannel's committed segments exceed
    # wal_retention_bytes (oldest first; 0 = no size limit, the default). Never past a
    # subscription that holds retention, a consumer group, or an unacknowledged
    # broadcast; never the segment open for appends.
    wal_retention_ms: int = 7 * 24 * 3_600_000
    wal_retention_bytes: int = 0
    wal_retention_check_ms: int = 10_000
    propose_timeout_ms: int = 5000
    # Upper bound for server-side waits (Lock/Broadcast wait, WaitResourceKey).
    max_wait_ms: int = 60_000
    # Raft election timeouts (ms): failover takes about one election timeout.
    raft_min_timeout_ms: int = 400
    raft_max_timeout_ms: int = 1200
    # A Raft leader that heard from no majority for this long steps down (ms). Reads never
    # rely on it (a lease or ReadIndex confirms leadership per read); it bounds how long a
    # cut-off leader keeps accepting proposals that cannot commit.
    raft_leader_fallback_ms: int = 2000
    # Linearizable reads on the leader from its lease (no message per read) while a
    # majority answered it within 0.675 x raft_min_timeout_ms; false: ReadIndex (one
    # heartbeat round per read) always. Leases assume no node's monotonic clock runs more
    # than 10% faster or slower than another's (docs/architecture.md, section 9).
    raft_lease_reads: bool = True
    # Raft snapshot after this many log entries.
    raft_snapshot_entries: int = 20_000
    grpc_max_message_bytes: int = 32 * 1024 * 1024
    # WAL: fsync before acknowledging (`always`), every N ms (`interval:<ms>`) or `never`
    # (UNSAFE: acknowledged entries can be lost on power loss).
    wal_fsync_policy: str = "always"
    # The owner seals the open segment past this size or age.
    segment_max_bytes: int = 64 * 1024 * 1024
    segment_max_age_ms: int = 600_000
    # An idempotent producer (producer_id) that wrote nothing to a pchannel for this long
    # is forgotten there (default 7 days, as Kafka's transactional.id.expiration.ms): a
    # retry of its last batch after that is written again. Retention never forgets one
    # (the owner carries the producers in the log, docs/architecture.md); a replicated
    # batch's producer (a standby's checkpoint) never expires.
    wal_producer_expiry_ms: int = 7 * 24 * 3_600_000
    # ClusterStatus flags a replica whose durable LSN is this many entries behind its
    # owner's committed LSN (a healthy replica under load stays within a few batches).
    replica_lag_warn_entries: int = 10_000
    # ... or whose oldest committed entry not yet durable on it is older than this: a
    # replica too slow for its owner (a slow disk or link). It is reported as lagging
    # (metric, console, status); the majority acknowledges without it.
    replica_lag_warn_ms: int = 1000
    # Disk watermarks of every data directory (data_dir, and its wal/ and raft/ where they
    # sit on filesystems of their own; docs/operations.md, "Disks"). A directory is past a
    # mark when its used share (df's used / (used + available)) reaches *_used_percent or
    # its free bytes fall below *_min_free_bytes (0: no byte floor). Past the soft mark the
    # node warns (log, metric, alert, console) and WAL retention runs at once; past the
    # hard mark it refuses Produce and transaction writes with RESOURCE_EXHAUSTED, while
    # reads, replication and coordination go on, until space returns. Checked every
    # disk_check_ms. The defaults are Milvus Woodpecker's (80% / 90%, 1 GiB free).
    disk_soft_used_percent: int = 80
    disk_hard_used_percent: int = 90
    disk_soft_min_free_bytes: int = 2 << 30
    disk_hard_min_free_bytes: int = 1 << 30
    disk_check_ms: int = 1000
    # Space Raft keeps for itself in raft/reserve (preallocated): when the Raft journal, its
    # metadata, a snapshot or events.db meets a full disk, the reserve is released and the
    # write retried, so that coordination (leases, locks) keeps working when something
    # else filled the disk. Taken again once the disk is back under its soft mark. 0: none.
    raft_reserve_bytes: int = 64 << 20
    # ClusterStatus flags a replication target (docs/replication.md) whose recorded
    # checkpoint is this many LSNs behind its source pchannel's committed LSN.
    replicate_lag_warn_entries: int = 10_000
    # Flow control for cross-cluster replication (docs/replication.md, "Flow control"): an
    # owner holds its clients' writes while a replication target that is acknowledging
    # lags this pchannel by more than this (the age of the oldest committed entry it does
    # not hold), so a standby that cannot keep up slows the source instead of falling
    # behind without bound (a bounded RPO, at the source's cost). A target that stopped
    # acknowledging is not waited for. 0: off.
    replicate_max_lag_ms: int = 0
    # How much less CPU priority a node's data workers get than its control process
    # (the niceness added to theirs, 0..19): a coordination write or a lease keep-alive
    # never queues behind the WAL (docs/architecture.md, "Processes of a node").
    data_worker_nice: int = 10
    # Uncommitted transaction data a node holds in memory: what all open transactions on
    # the node, those of one producer (BeginTxnRequest.producer_id, else the client's
    # address), and those of one caller identity (its token or client certificate,
    # whatever producer ids it uses; callers without either have no such budget) may
    # buffer before an append is refused with RESOURCE_EXHAUSTED. A node's memory grows by
    # about 1.6x the bytes it buffers.
    txn_buffer_budget_bytes: int = 64 * 1024 * 1024
    txn_buffer_producer_budget_bytes: int = 32 * 1024 * 1024
    txn_buffer_identity_budget_bytes: int = 32 * 1024 * 1024
    # Bytes of partly received frames a node holds across all its transfer-port streams
    # (Produce and Append): each frame reserves its declared length when its header
    # arrives; past this a frame is refused with RESOURCE_EXHAUSTED (the sender falls back
    # or retries). Each frame must then arrive within 5 s + 1 s per 4 MiB.
    frame_buffer_budget_bytes: int = 64 * 1024 * 1024
    # Long-lived streams of the gRPC port (WatchEvents, WatchAssignments, lease KeepAlive,
    # Consume), per method: open at once on the node, and per caller (its token or client
    # certificate; without either, its network host). Past a cap a new stream gets
    # RESOURCE_EXHAUSTED (raftwal.services.stream_caps).
    max_node_streams: int = 1024
    max_identity_streams: int = 256
    # PEM CA bundle: nodes verify each other's certificates with it, and clients' ones when
    # tls_client_auth is "require" (mutual TLS).
    tls_ca_file: Path | None = None
    tls_client_auth: str = "none"
    # Bearer tokens and their roles (raftwal/security.py); None: authentication is off.
    auth_tokens_file: Path | None = None
    # gRPC endpoints (host:port) of a running cluster this node joins (raftwal/node/join.py):
    # its config then needs to name only itself.
    join: tuple[str, ...] = ()
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        """Whether the nodes' gRPC ports speak TLS (all of them or none, see parse_config)."""
        return any(node.tls_cert_file is not None for node in self.nodes)

    def node(self, node_id: str) -> NodeConfig:
        for node in self.nodes:
            if node.id == node_id:
                return node
        known = ", ".join(n.id for n in self.nodes)
        raise ConfigError(f"unknown node id {node_id!r} (expected one of: {known})")

    @property
    def voters(self) -> tuple[NodeConfig, ...]:
        return tuple(node for node in self.nodes if node.voter)

    def node_by_raft_address(self, raft_address: str) -> NodeConfig | None:
        for node in self.nodes:
            if node.raft_address == raft_address:
                return node
        return None


TLS_CLIENT_AUTH_MODES = ("none", "require")
# As the state machine's names (statemachine.types.Limits.name_max_chars).
CLUSTER_ID_MAX_CHARS = 128

_TIMINGS = {
    f.name
    for f in fields(ClusterConfig)
    if f.name.endswith(("_ms", "_revisions", "_entries", "_bytes", "_streams", "_percent"))
}

#: raft.peer.RaftTuning's heartbeat period: an election timeout must leave room for three.
RAFT_HEARTBEAT_MS = 50
#: The Raft connection timeout (raft.peer.RaftTuning.connection_timeout_s) at the default
#: election timeouts; it grows with raft_max_timeout_ms (`raft_connection_timeout_ms`).
RAFT_CONNECTION_TIMEOUT_MS = 2000


def raft_connection_timeout_ms(config: ClusterConfig) -> int:
    """How long a Raft connection may stay silent before it counts as dead: derived from
    raft_max_timeout_ms (at least 5/3 of it, as the defaults 2000 and 1200), never set
    apart, so that no election timeout can make the node refuse to start."""
    return max(RAFT_CONNECTION_TIMEOUT_MS, -(-config.raft_max_timeout_ms * 5 // 3))


# Settings where 0 switches the limit off.
_ZERO_MEANS_OFF = frozenset(
    {
        "event_retention_ms",
        "wal_retention_ms",
        "wal_retention_bytes",
        "replica_replace_after_ms",
        "disk_soft_min_free_bytes",
        "disk_hard_min_free_bytes",
        "raft_reserve_bytes",
        "replicate_max_lag_ms",
    }
)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: The most data workers a node runs (statemachine.types.Limits.max_data_workers bounds
#: what it may announce).
MAX_DATA_WORKERS = 64


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_wildcard(host: str) -> bool:
    """0.0.0.0, :: and the like: addresses to listen on, never to be reached at."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


NODE_ROLES = ("voter", "data")


def _role(table: Mapping[str, object], where: str) -> str:
    role = table.get("role", "voter")
    if role not in NODE_ROLES:
        raise ConfigError(f"invalid {where}.role ({role!r}; expected one of {NODE_ROLES})")
    return str(role)


def _int(table: Mapping[str, object], key: str, where: str, low: int, high: int) -> int:
    value = table.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"invalid {where}.{key} ({value!r}; expected an integer {low}..{high})")
    return value


def _path(
    table: Mapping[str, object],
    key: str,
    where: str,
    base_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """A path setting from `table` (relative to the config file), or from RAFTWAL_<KEY>
    (relative to the working directory) when `environ` is given and has it."""
    env_name = f"RAFTWAL_{key.upper()}"
    if environ is not None and environ.get(env_name):
        return Path(environ[env_name]).resolve()
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"invalid {where}.{key} ({value!r}; expected a path)")
    return (base_dir / value).resolve()


def _peer_addresses(
    table: Mapping[str, object], key: str, where: str
) -> tuple[tuple[str, str], ...]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(
            f'invalid {where}.{key} ({value!r}; expected a table of node id = "host:port")'
        )
    pairs = []
    for peer_id, address in sorted(value.items()):
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                f"invalid {where}.{key}.{peer_id} ({address!r}; expected host:port with a "
                "port 1..65535)"
            )
        pairs.append((str(peer_id), address))
    return tuple(pairs)


def _ports(table: Mapping[str, object], key: str, where: str, low: int) -> tuple[int, ...]:
    value = table.get(key, [])
    if (
        not isinstance(value, list)
        or len(value) > MAX_DATA_WORKERS
        or not all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= 65535 for v in value
        )
    ):
        raise ConfigError(
            f"invalid {where}.{key} ({value!r}; expected a list of at most {MAX_DATA_WORKERS} "
            f"ports {low}..65535, one per data worker)"
        )
    return tuple(value)


def _peer_worker_addresses(
    table: Mapping[str, object], key: str, where: str
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(
            f'invalid {where}.{key} ({value!r}; expected a table of node id = ["host:port", ...])'
        )
    pairs = []
    for peer_id, addresses in sorted(value.items()):
        if not isinstance(addresses, list) or len(addresses) > MAX_DATA_WORKERS:
            raise ConfigError(
                f"invalid {where}.{key}.{peer_id} ({addresses!r}; expected a list of "
                "host:port, one per data worker of that node)"
            )
        for address in addresses:
            host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ConfigError(
                    f"invalid {where}.{key}.{peer_id} ({address!r}; expected host:port with "
                    "a port 1..65535)"
                )
        pairs.append((str(peer_id), tuple(addresses)))
    return tuple(pairs)


def _join_endpoints(value: object) -> tuple[str, ...]:
    """`[cluster] join` (or --join): host:port strings, at most 16."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or len(items) > 16:
        raise ConfigError(
            f"invalid cluster.join ({value!r}; expected a list of at most 16 host:port "
            "gRPC endpoints of a running cluster)"
        )
    endpoints = []
    for item in items:
        host, _, port = item.strip().rpartition(":") if isinstance(item, str) else ("", "", "")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                f"invalid cluster.join endpoint ({item!r}; expected host:port with a port 1..65535)"
            )
        endpoints.append(item.strip())
    return tuple(endpoints)


def with_join(config: ClusterConfig, endpoints: str) -> ClusterConfig:
    """`config` joining the cluster at `endpoints` (comma-separated; raftwal node --join)."""
    return replace(config, join=_join_endpoints(endpoints))


def parse_config(
    data: Mapping[str, object], base_dir: Path, environ: Mapping[str, str] | None = None
) -> ClusterConfig:
    environ = os.environ if environ is None else environ
    cluster_table = data.get("cluster", {})
    if not isinstance(cluster_table, dict):
        raise ConfigError(f"invalid [cluster] ({cluster_table!r}; expected a table)")
    # Every node's certificate defaults to the cluster's (one certificate naming every host).
    default_cert = _path(cluster_table, "tls_cert_file", "cluster", base_dir, environ)
    default_key = _path(cluster_table, "tls_key_file", "cluster", base_dir, environ)
    env_certs = bool(environ.get("RAFTWAL_TLS_CERT_FILE") or environ.get("RAFTWAL_TLS_KEY_FILE"))
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
        if not is_plain_name(node_id):
            raise ConfigError(f"invalid {where}.id ({node_id!r}; expected {NAME_RULE})")
        host = raw.get("host", "127.0.0.1")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"invalid {where}.host ({host!r}; expected a host name or IP)")
        if _is_wildcard(host):
            raise ConfigError(
                f"invalid {where}.host ({host!r}; expected the address other nodes and clients "
                "reach this node at: a wildcard address can only be listened on, so set "
                f'listen_host = "{host}" and host to a routable name or IP)'
            )
        listen_host = raw.get("listen_host")
        if listen_host is not None and (not isinstance(listen_host, str) or not listen_host):
            raise ConfigError(
                f"invalid {where}.listen_host ({listen_host!r}; expected an IP address or host "
                'name to listen on, e.g. "0.0.0.0")'
            )
        data_dir = raw.get("data_dir", f"data/{node_id}")
        if not isinstance(data_dir, str):
            raise ConfigError(f"invalid {where}.data_dir ({data_dir!r}; expected a path)")
        cert_file, key_file = default_cert, default_key
        if not env_certs:
            # The environment names this process's node's files and wins over every table;
            # otherwise a node's own setting wins over the cluster's.
            cert_file = _path(raw, "tls_cert_file", where, base_dir) or default_cert
            key_file = _path(raw, "tls_key_file", where, base_dir) or default_key
        if (cert_file is None) != (key_file is None):
            raise ConfigError(
                f"invalid {where} TLS settings (got tls_cert_file {cert_file or '-'} and "
                f"tls_key_file {key_file or '-'}; expected both or neither)"
            )
        nodes.append(
            NodeConfig(
                id=node_id,
                host=host,
                grpc_port=_int(raw, "grpc_port", where, 1, 65535),
                raft_port=_int(raw, "raft_port", where, 1, 65535),
                metrics_port=_int(raw, "metrics_port", where, 0, 65535)
                if "metrics_port" in raw
                else 0,
                transfer_port=_int(raw, "transfer_port", where, -1, 65535)
                if "transfer_port" in raw
                else 0,
                data_dir=(base_dir / data_dir).resolve(),
                tls_cert_file=cert_file,
                tls_key_file=key_file,
                peer_raft_addresses=_peer_addresses(raw, "peer_raft_addresses", where),
                peer_grpc_addresses=_peer_addresses(raw, "peer_grpc_addresses", where),
                peer_transfer_addresses=_peer_addresses(raw, "peer_transfer_addresses", where),
                role=_role(raw, where),
                listen_host=listen_host,
                data_workers=_int(raw, "data_workers", where, 0, MAX_DATA_WORKERS)
                if "data_workers" in raw
                else 0,
                worker_grpc_ports=_ports(raw, "worker_grpc_ports", where, 0),
                worker_transfer_ports=_ports(raw, "worker_transfer_ports", where, -1),
                peer_worker_grpc_addresses=_peer_worker_addresses(
                    raw, "peer_worker_grpc_addresses", where
                ),
                peer_worker_transfer_addresses=_peer_worker_addresses(
                    raw, "peer_worker_transfer_addresses", where
                ),
            )
        )
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"duplicate node ids ({ids}; expected each once)")
    join = _join_endpoints(cluster_table.get("join", []))
    if not any(n.voter for n in nodes) and not join:
        raise ConfigError(
            f"no voting node (roles {', '.join(f'{n.id}={n.role}' for n in nodes)}; expected "
            'at least one node with role = "voter", the default: three or five of them)'
        )
    for node in nodes:
        for peer_id, _ in (
            *node.peer_raft_addresses,
            *node.peer_grpc_addresses,
            *node.peer_transfer_addresses,
            *node.peer_worker_grpc_addresses,
            *node.peer_worker_transfer_addresses,
        ):
            if peer_id == node.id or peer_id not in ids:
                others = ", ".join(i for i in ids if i != node.id) or "none"
                raise ConfigError(
                    f"invalid peer address of node {node.id} for {peer_id!r} (expected one "
                    f"of the other nodes: {others})"
                )
    with_tls = [n.id for n in nodes if n.tls_cert_file is not None]
    if with_tls and len(with_tls) != len(nodes):
        # Nodes call each other with the cluster's settings: a mixed cluster cannot talk.
        raise ConfigError(
            f"TLS configured for some nodes only ({', '.join(with_tls)} of {', '.join(ids)}; "
            "expected tls_cert_file/tls_key_file for every node or for none)"
        )
    config = ClusterConfig(nodes=tuple(nodes), join=join)
    overrides: dict[str, object] = {}
    for name in sorted(_TIMINGS):
        if name in cluster_table:
            low = 0 if name in _ZERO_MEANS_OFF else 1
            overrides[name] = _int(cluster_table, name, "cluster", low, 10**12)
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
    lease_reads = cluster_table.get("raft_lease_reads", config.raft_lease_reads)
    lease_env = environ.get("RAFTWAL_RAFT_LEASE_READS")
    if lease_env is not None:
        lease_reads = {"true": True, "1": True, "false": False, "0": False}.get(
            lease_env.strip().lower(), lease_env
        )
    if not isinstance(lease_reads, bool):
        raise ConfigError(
            f"invalid cluster.raft_lease_reads ({lease_reads!r}; expected true or false)"
        )
    overrides["raft_lease_reads"] = lease_reads
    nice = environ.get("RAFTWAL_DATA_WORKER_NICE", cluster_table.get("data_worker_nice", 10))
    try:
        nice = int(nice)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        nice = -1
    if not 0 <= nice <= 19:
        raise ConfigError(
            f"invalid cluster.data_worker_nice ({cluster_table.get('data_worker_nice')!r}; "
            "expected an integer 0..19)"
        )
    overrides["data_worker_nice"] = nice
    overrides["tls_ca_file"] = _path(cluster_table, "tls_ca_file", "cluster", base_dir, environ)
    overrides["auth_tokens_file"] = _path(
        cluster_table, "auth_tokens_file", "cluster", base_dir, environ
    )
    client_auth = environ.get("RAFTWAL_TLS_CLIENT_AUTH") or cluster_table.get(
        "tls_client_auth", "none"
    )
    if client_auth not in TLS_CLIENT_AUTH_MODES:
        raise ConfigError(
            f"invalid cluster.tls_client_auth ({client_auth!r}; expected one of "
            f"{', '.join(TLS_CLIENT_AUTH_MODES)}: grpc-python cannot ask for a client "
            "certificate without requiring it, so there is no optional mode)"
        )
    overrides["tls_client_auth"] = client_auth
    if (overrides["tls_ca_file"] is not None or client_auth != "none") and not with_tls:
        raise ConfigError(
            f"invalid cluster TLS settings (got tls_ca_file {overrides['tls_ca_file'] or '-'} "
            f"and tls_client_auth {client_auth!r} without node certificates; expected "
            "tls_cert_file and tls_key_file too)"
        )
    if client_auth == "require" and overrides["tls_ca_file"] is None:
        raise ConfigError(
            'invalid cluster.tls_client_auth ("require" without tls_ca_file; expected the CA '
            "that signs client certificates)"
        )
    cluster_id = environ.get("RAFTWAL_CLUSTER_ID") or cluster_table.get("cluster_id", "")
    if not isinstance(cluster_id, str) or (
        cluster_id and (len(cluster_id) > CLUSTER_ID_MAX_CHARS or not is_plain_name(cluster_id))
    ):
        raise ConfigError(
            f"invalid cluster.cluster_id ({cluster_id!r}; expected {NAME_RULE}, "
            f"1..{CLUSTER_ID_MAX_CHARS} chars, or absent)"
        )
    overrides["cluster_id"] = cluster_id
    secret = environ.get("RAFTWAL_SECRET") or None
    secret_file = cluster_table.get("secret_file")
    secret_path = None
    if secret is None and secret_file:
        if not isinstance(secret_file, str):
            raise ConfigError(f"invalid cluster.secret_file ({secret_file!r}; expected a path)")
        secret_path = (base_dir / secret_file).resolve()
        try:
            secret = secret_path.read_text().strip() or None
        except OSError as error:
            raise ConfigError(f"cannot read cluster.secret_file {secret_path}: {error}") from None
    config = replace(config, secret=secret, secret_file=secret_path, **overrides)  # type: ignore[arg-type]
    if config.raft_min_timeout_ms >= config.raft_max_timeout_ms:
        raise ConfigError(
            f"invalid raft timeouts (raft_min_timeout_ms {config.raft_min_timeout_ms}, "
            f"raft_max_timeout_ms {config.raft_max_timeout_ms}; expected min < max)"
        )
    if config.raft_min_timeout_ms <= 3 * RAFT_HEARTBEAT_MS:
        raise ConfigError(
            f"invalid raft_min_timeout_ms ({config.raft_min_timeout_ms}; expected > "
            f"{3 * RAFT_HEARTBEAT_MS}: three Raft heartbeats of {RAFT_HEARTBEAT_MS} ms)"
        )
    if config.raft_leader_fallback_ms <= RAFT_HEARTBEAT_MS:
        raise ConfigError(
            f"invalid raft_leader_fallback_ms ({config.raft_leader_fallback_ms}; expected > "
            f"{RAFT_HEARTBEAT_MS}, the Raft heartbeat period)"
        )
    for name in ("disk_soft_used_percent", "disk_hard_used_percent"):
        if not 1 <= getattr(config, name) <= 100:
            raise ConfigError(
                f"invalid {name} ({getattr(config, name)}; expected 1..100, 100: no share limit)"
            )
    if config.disk_soft_used_percent > config.disk_hard_used_percent or (
        config.disk_soft_min_free_bytes < config.disk_hard_min_free_bytes
    ):
        raise ConfigError(
            f"invalid disk watermarks (soft {config.disk_soft_used_percent}% / "
            f"{config.disk_soft_min_free_bytes} bytes free, hard "
            f"{config.disk_hard_used_percent}% / {config.disk_hard_min_free_bytes} bytes "
            "free; expected the soft mark at or before the hard one)"
        )
    if config.max_identity_streams > config.max_node_streams:
        raise ConfigError(
            f"invalid stream caps (max_identity_streams {config.max_identity_streams}, "
            f"max_node_streams {config.max_node_streams}; expected identity <= node)"
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


#: Where `raftwal secret new` and the config template put the cluster secret by default.
DEFAULT_SECRET_FILE = "/etc/raftwal/secret"
#: The shortest cluster secret a node accepts (raft.peer.MIN_PASSWORD_CHARS).
MIN_SECRET_CHARS = 16


def check_transport_security(config: ClusterConfig, node: NodeConfig) -> None:
    """Refuse to run a Raft transport without a cluster secret, on any address: pysyncobj
    unpickles what peers send, so an unauthenticated Raft port runs code for anyone who can
    reach it, and every local user can reach a loopback port."""
    if config.secret is None:
        raise ConfigError(
            f"node {node.id} has no cluster secret, and its Raft port would run code sent by "
            "anyone who can reach it: create one with `raftwal secret new "
            f"{DEFAULT_SECRET_FILE}` (copy it to every node) and set [cluster] secret_file "
            "to it, or RAFTWAL_SECRET"
        )
    if len(config.secret) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"invalid cluster secret (too short: {len(config.secret)} chars; expected >= "
            f"{MIN_SECRET_CHARS}; `raftwal secret new FILE` writes a 64-hex-digit one)"
        )
    if config.secret_file is not None:
        # Whoever reads the secret can speak Raft to every node (and so run code there):
        # say so, as for the tokens file and the data directory.
        try:
            mode = stat.S_IMODE(config.secret_file.stat().st_mode)
        except OSError:
            return
        if mode & 0o077:
            log.warning(
                "cluster secret_file %s is accessible to group or others (mode %04o; expected "
                "0600: whoever reads it can join the Raft port and run code in every node); "
                "chmod 600 it",
                config.secret_file,
                mode,
            )


def write_secret_file(path: Path, overwrite: bool = False) -> None:
    """A new random cluster secret (256 bits, hex) in `path`, created with mode 0600 (its
    directory 0700 when this creates it). Refuses to replace an existing file unless
    `overwrite`: every node of a cluster must share one secret."""
    if path.exists() and not overwrite:
        raise ConfigError(
            f"{path} exists (expected a new file; pass --force to replace it, then copy it to "
            "every node and restart them all: nodes with different secrets never talk)"
        )
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(descriptor, (secrets.token_hex(32) + "\n").encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


def config_template(secret_file: str = DEFAULT_SECRET_FILE) -> str:
    """An annotated three-node config that uses `secret_file` (for `raftwal config template`)."""
    nodes = "\n".join(
        f"""
[[nodes]]
id = "n{number}"
host = "10.0.0.{number}"          # this node's address, as the other nodes reach it
grpc_port = 7201
raft_port = 7301
metrics_port = 9201
data_dir = "/var/lib/raftwal/n{number}"   # created 0700; keep it on a local disk"""
        for number in (1, 2, 3)
    )
    return f"""# raftwal cluster configuration: the same file on every node; start each node with
#   raftwal node --config raftwal.toml --id n1
[cluster]
# The Raft transport secret, shared by every node (`raftwal secret new {secret_file}`
# writes one, mode 0600). A node refuses to start without it. RAFTWAL_SECRET overrides it.
secret_file = "{secret_file}"
# This cluster's id in a cross-cluster replication configuration (docs/replication.md).
# cluster_id = "east"
node_timeout_ms = 3000
# Linearizable reads from the Raft leader's lease (no message per read; assumes the nodes'
# clocks tick within 10% of each other). false: one heartbeat round per read (ReadIndex).
# raft_lease_reads = true
# gRPC security (optional): TLS, mutual TLS and bearer tokens per role; see SECURITY.md.
# tls_cert_file = "/etc/raftwal/node.pem"
# tls_key_file = "/etc/raftwal/node.key"
# tls_ca_file = "/etc/raftwal/ca.pem"
# tls_client_auth = "require"
# auth_tokens_file = "/etc/raftwal/tokens"
{nodes}
"""


def render_config(config: ClusterConfig, secret_file: str | None = None) -> str:
    """TOML text for `config` (used by `raftwal dev up`)."""
    lines = ["[cluster]"]
    if secret_file:
        lines.append(f'secret_file = "{secret_file}"')
    if config.cluster_id:
        lines.append(f'cluster_id = "{config.cluster_id}"')
    for name in sorted(_TIMINGS):
        lines.append(f"{name} = {getattr(config, name)}")
    lines.append(f'wal_fsync_policy = "{config.wal_fsync_policy}"')
    if not config.raft_lease_reads:
        lines.append("raft_lease_reads = false")
    if config.data_worker_nice != 10:
        lines.append(f"data_worker_nice = {config.data_worker_nice}")
    if config.tls_ca_file is not None:
        lines.append(f'tls_ca_file = "{config.tls_ca_file}"')
    if config.tls_client_auth != "none":
        lines.append(f'tls_client_auth = "{config.tls_client_auth}"')
    if config.auth_tokens_file is not None:
        lines.append(f'auth_tokens_file = "{config.auth_tokens_file}"')
    if config.join:
        lines.append("join = [" + ", ".join(f'"{e}"' for e in config.join) + "]")
    for node in config.nodes:
        lines += [
            "",
            "[[nodes]]",
            f'id = "{node.id}"',
            f'host = "{node.host}"',
            *([f'listen_host = "{node.listen_host}"'] if node.listen_host else []),
            f"grpc_port = {node.grpc_port}",
            f"raft_port = {node.raft_port}",
            f"metrics_port = {node.metrics_port}",
            f"transfer_port = {node.transfer_port}",
            f'data_dir = "{node.data_dir}"',
        ]
        if not node.voter:
            lines.append(f'role = "{node.role}"')
        if node.tls_cert_file is not None:
            lines += [
                f'tls_cert_file = "{node.tls_cert_file}"',
                f'tls_key_file = "{node.tls_key_file}"',
            ]
        if node.data_workers:
            lines.append(f"data_workers = {node.data_workers}")
        for name in ("worker_grpc_ports", "worker_transfer_ports"):
            ports = getattr(node, name)
            if ports:
                lines.append(f"{name} = [{', '.join(str(p) for p in ports)}]")
        for name in ("peer_raft_addresses", "peer_grpc_addresses", "peer_transfer_addresses"):
            pairs = getattr(node, name)
            if pairs:
                table = ", ".join(f'"{peer}" = "{address}"' for peer, address in pairs)
                lines.append(f"{name} = {{ {table} }}")
        for name in ("peer_worker_grpc_addresses", "peer_worker_transfer_addresses"):
            pairs = getattr(node, name)
            if pairs:
                table = ", ".join(
                    f'"{peer}" = [{", ".join(f"{chr(34)}{a}{chr(34)}" for a in addresses)}]'
                    for peer, addresses in pairs
                )
                lines.append(f"{name} = {{ {table} }}")
    return "\n".join(lines) + "\n"
