"""What the servicers need from their node, as ``typing.Protocol``s that
``raftwal.node.process.Node`` implements, and the snapshot of the coordination state that the
data-plane servicers read (``DataViewSnapshot``, refreshed by the node's data view).

Keeping servicers on these narrow interfaces means a servicer can be read, and tested,
without the node: it sees a name and an address, a view of assignments, a state reader and
a few calls. Must never import ``raftwal.node``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from wal_segments.plane import Assignment, DataPlane

T = TypeVar("T")


@dataclass
class VChannelInfo:
    name: str
    id: int
    pchannel: str
    normal: bool


@dataclass
class DataViewSnapshot:
    """Assignments, vchannels, node addresses and manifests at one applied revision."""

    revision: int = -1
    assignments: dict[str, Assignment] = field(default_factory=dict)
    vchannels: dict[str, VChannelInfo] = field(default_factory=dict)
    vchannel_names: dict[int, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    committed_through: dict[str, int] = field(default_factory=dict)
    pchannels: set[str] = field(default_factory=set)
    # pchannel -> retention floor (manifest.deleted_before_lsn), only where it is > 0
    deleted_before: dict[str, int] = field(default_factory=dict)
    # pchannel -> (the cluster it is a replication target of, the source pchannel matched
    # to it) (docs/replication.md): only that cluster's replicator writes to it.
    replicated_from: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The replication configuration and this cluster's id as applied: whether a client
    # write is taken (statemachine.replicate.write_refusal).
    replicate_configuration: pb.ReplicateConfiguration = field(
        default_factory=pb.ReplicateConfiguration
    )
    replicate_cluster_id: str = ""


class NodeIdentity(Protocol):
    """A node's id and the address clients reach it at (``NodeConfig`` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def grpc_address(self) -> str: ...

    @property
    def raft_address(self) -> str: ...


class DataView(Protocol):
    """The node's cached view of the coordination state for the data plane."""

    @property
    def view(self) -> DataViewSnapshot: ...

    def refresh(self) -> None:
        """Re-read the view when the node applied new commands."""

    def owner_hint(self, pchannel: str) -> tuple[str, int]:
        """(owner's address, term) of `pchannel` as this node knows it, or ("", 0)."""
        ...

    def committed_through(self, pchannel: str) -> int: ...

    def retention_floor(self, pchannel: str) -> int:
        """The first LSN of `pchannel` retention keeps (0: nothing deleted yet)."""
        ...


class StateReader(Protocol):
    def read(self, reader: Callable[[pb.CoordinationState], T]) -> T:
        """`reader` applied to the node's applied coordination state (no copy kept)."""
        ...


class TxnBudgets(Protocol):
    """The transaction buffer budgets of ``ClusterConfig``."""

    @property
    def txn_buffer_budget_bytes(self) -> int: ...

    @property
    def txn_buffer_producer_budget_bytes(self) -> int: ...

    @property
    def txn_buffer_identity_budget_bytes(self) -> int: ...


class StreamingBackend(Protocol):
    """What ``StreamingNodeServicer`` needs from its node."""

    @property
    def me(self) -> NodeIdentity: ...

    @property
    def config(self) -> TxnBudgets: ...


class ReplicationBackend(Protocol):
    """What ``ReplicationServicer`` needs from its node."""

    @property
    def me(self) -> NodeIdentity: ...

    @property
    def data_view(self) -> DataView: ...

    @property
    def replica(self) -> StateReader: ...

    def suspect(self, node_id: str) -> None:
        """A replica stream from `node_id` failed: let the coordinator judge it sooner."""

    def wait_change(self, timeout_s: float) -> Awaitable[None]:
        """Until the node applies a new command, or `timeout_s`."""
        ...


class ClusterMembers(Protocol):
    @property
    def nodes(self) -> Sequence[NodeIdentity]: ...

    def node(self, node_id: str) -> NodeIdentity: ...


class HeartbeatSink(Protocol):
    def record_heartbeat(self, request: api.HeartbeatRequest) -> None: ...

    def handover_targets(self, node_id: str) -> int: ...


class ClusterBackend(Protocol):
    """What ``ClusterServicer`` needs from its node."""

    @property
    def me(self) -> NodeIdentity: ...

    @property
    def config(self) -> ClusterMembers: ...

    @property
    def coordinator(self) -> HeartbeatSink: ...

    def is_leader(self) -> bool: ...

    def leader(self) -> NodeIdentity | None: ...

    def applied_revision(self) -> int: ...

    def removed_node(self, node_id: str) -> pb.RemovedNode | None:
        """`node_id`'s removal (RemoveNode) in the applied state, None when not removed."""
        ...

    def membership(self) -> tuple[list[str], bool]:
        """(the Raft voters as node ids, whether that set is settled: no membership entry
        uncommitted), as this node's log has them."""
        ...

    def propose_bytes(self, data: bytes, forward: bool = True) -> Awaitable[pb.CommandResult]:
        """Propose serialized command bytes (forwarded to the leader unless `forward` is
        False); raises RaftwalError (NOT_LEADER, ...)."""
        ...

    def propose_batch_bytes(
        self, commands: list[bytes], forward: bool = True
    ) -> Awaitable[list[pb.CommandResult]]:
        """Propose serialized commands as one Raft entry, applied in order; one result
        each; raises RaftwalError like ``propose_bytes``."""
        ...

    def read_index(self, timeout_s: float) -> Awaitable[tuple[int, int]]:
        """(raft index, term) a linearizable read must have applied, confirmed by a
        heartbeat round on this leader; raises RaftwalError (NOT_LEADER, UNAVAILABLE)."""
        ...


class NodeManagerBackend(Protocol):
    """What ``NodeManagerServicer`` needs from its node."""

    @property
    def me(self) -> NodeIdentity: ...

    @property
    def data_view(self) -> DataView: ...

    @property
    def plane(self) -> DataPlane: ...

    def member_status(self) -> api.MemberStatus:
        """This node's status; raises AssertionError while it starts or stops."""
        ...
