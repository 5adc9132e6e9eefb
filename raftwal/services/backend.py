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

from rpc.placement import address_for
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from wal_segments.plane import Assignment

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
    # node id -> the gRPC addresses of its data workers (Node.worker_addresses)
    worker_addresses: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def address(self, node_id: str, pchannel: str) -> str:
        """Where `node_id` serves `pchannel`: its data worker for it (rpc.placement), or
        its own address while it announced none; "" for an unknown node."""
        node_address = self.addresses.get(node_id, "")
        if not node_address:
            return ""
        return address_for(node_address, self.worker_addresses.get(node_id, ()), pchannel)


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


class DiskGuard(Protocol):
    """The node's disk watermarks as the data plane's servicers see them
    (``raftwal.node.disks.DiskWatch``)."""

    def write_refusal(self, what: str = ...) -> errors_pb2.ErrorInfo | None:
        """RESOURCE_EXHAUSTED (with its ``disk`` detail) for a client write while a data
        directory is past its hard watermark; None while writes are taken."""
        ...

    def replica_refusal(self) -> errors_pb2.ErrorInfo | None:
        """RESOURCE_EXHAUSTED for an owner's Append while the disk is past its hard mark
        and Raft had to use its disk reserve (the disk filled up): what is left is Raft's.
        None otherwise (replicas keep taking appends past the hard mark)."""
        ...

    def full_detail(self) -> errors_pb2.DiskSpace:
        """The ``disk`` detail for a write the filesystem refused with ENOSPC (between
        two samples); the guard samples again at once."""
        ...


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

    def joiner_conflict(self, request: api.HeartbeatRequest) -> str | None:
        """Why a joining node's heartbeat must be refused (its process must stop): another
        live process joins under that id, or its announced address is another node's."""
        ...

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
    """What ``NodeManagerServicer`` needs from its node (its control process)."""

    @property
    def me(self) -> NodeIdentity: ...

    def reconcile_now(self) -> None:
        """Make the node's data workers look at their assignments now."""

    def serving_terms(self) -> dict[str, int]:
        """pchannel -> term of every pchannel an owner of this node serves now."""
        ...

    def member_status(self) -> Awaitable[api.MemberStatus]:
        """This node's status; raises RaftwalError (ON_SHUTDOWN) while it starts or
        stops."""
        ...
