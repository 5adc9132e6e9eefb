"""Small value types shared by the pure core: the apply context, rejections and limits.

Nothing here may read a clock or the environment: the proposer stamps the time on the
command and the Raft layer supplies the log index.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpc.protos import errors_pb2


@dataclass(frozen=True, slots=True)
class Context:
    """What a command carries besides its body: stamped by the proposer and by Raft."""

    # Proposer wall time in ms since the epoch, never below the last applied one.
    time_ms: int
    # Raft log index of the entry that carried the command.
    raft_index: int


@dataclass(frozen=True, slots=True)
class Rejection:
    """A command the state machine refused. A value, not an exception."""

    code: int  # an errors_pb2.ErrorCode value
    message: str
    current_term: int = 0
    # COMPACTED: the first LSN still retained.
    first_available: int = 0

    def to_error_info(self) -> errors_pb2.ErrorInfo:
        info = errors_pb2.ErrorInfo(
            message=self.message,
            current_term=self.current_term,
            first_available=self.first_available,
        )
        info.code = self.code  # type: ignore[assignment]
        return info

    @property
    def code_name(self) -> str:
        return errors_pb2.ErrorCode.Name(self.code)


@dataclass(frozen=True, slots=True)
class Limits:
    """Cluster-wide limits of the coordination state machine.

    They are part of the replicated logic: every node of a cluster must run with the same
    values (they are constants of a raftwal version, not per-node configuration), or the
    replicas would decide differently.
    """

    name_max_chars: int = 128
    address_max_chars: int = 256
    resource_key_max_chars: int = 256
    text_max_chars: int = 256
    request_id_max_chars: int = 128
    max_pchannels_per_request: int = 1024
    max_replicas: int = 7
    default_replica_count: int = 3
    max_history_entries: int = 64
    broadcast_message_max_bytes: int = 1024 * 1024
    max_broadcast_vchannels: int = 1024
    max_subscriptions: int = 10_000
    max_subscription_vchannels: int = 1024
    max_subscription_moves_per_round: int = 64
    max_resource_keys: int = 64
    lease_ttl_min_ms: int = 1
    lease_ttl_max_ms: int = 3_600_000
    max_leases: int = 65_536
    # Budgets per identity (Lease.owner, stamped by the proposer from who called; a caller
    # without an identity, on a cluster without tokens, has none): one token can hold at
    # most an eighth of the cluster's leases, and a bounded number of keys through them,
    # so it cannot make another application's GrantLease or Lock fail.
    max_leases_per_owner: int = 8_192
    max_lease_locks_per_owner: int = 65_536
    max_keys_per_lease: int = 1024
    max_events_per_sweep: int = 1024
    broadcast_retention_max_ms: int = 30 * 24 * 3_600_000
    max_moves_per_round_limit: int = 1024
    default_moves_per_round: int = 16
    max_recovery_moves_per_round: int = 256
    # Replica set changes per balancer round: each one copies a pchannel's log to a node.
    max_repairs_per_round: int = 4
    dedup_window: int = 4096
    # Node ids `raftwal member remove` forgot and still refuses (a rejoin frees one).
    max_removed_nodes: int = 4096
    # Data worker processes a node announces (Node.worker_addresses).
    max_data_workers: int = 256
    # Cross-cluster replication configuration (statemachine/replicate.py).
    max_replicate_clusters: int = 16
    max_replicate_endpoints: int = 16
    replicate_token_max_chars: int = 4096
    replicate_ca_max_chars: int = 65_536
    # Proposer times beyond year 9999 are rejected: deadlines (time + ttl) must stay far
    # inside int64, and one absurd clock must never poison the state machine's clock.
    max_time_ms: int = 253_402_300_799_999


DEFAULT_LIMITS = Limits()
