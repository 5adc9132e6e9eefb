from rpc.protos import coordination_pb2 as _coordination_pb2
from rpc.protos import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSISTENCY_LINEARIZABLE: _ClassVar[Consistency]
    CONSISTENCY_SERIALIZABLE: _ClassVar[Consistency]

class WaitMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_MODE_ONCE: _ClassVar[WaitMode]
    WAIT_MODE_ALL: _ClassVar[WaitMode]

class SeekTarget(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEEK_TARGET_UNSPECIFIED: _ClassVar[SeekTarget]
    SEEK_TARGET_EARLIEST: _ClassVar[SeekTarget]
    SEEK_TARGET_LATEST: _ClassVar[SeekTarget]
    SEEK_TARGET_LSN: _ClassVar[SeekTarget]
    SEEK_TARGET_TIME_TICK: _ClassVar[SeekTarget]

class MembershipAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBERSHIP_ACTION_UNSPECIFIED: _ClassVar[MembershipAction]
    MEMBERSHIP_ACTION_ADD: _ClassVar[MembershipAction]
    MEMBERSHIP_ACTION_REMOVE: _ClassVar[MembershipAction]
    MEMBERSHIP_ACTION_FORGET: _ClassVar[MembershipAction]
CONSISTENCY_LINEARIZABLE: Consistency
CONSISTENCY_SERIALIZABLE: Consistency
WAIT_MODE_ONCE: WaitMode
WAIT_MODE_ALL: WaitMode
SEEK_TARGET_UNSPECIFIED: SeekTarget
SEEK_TARGET_EARLIEST: SeekTarget
SEEK_TARGET_LATEST: SeekTarget
SEEK_TARGET_LSN: SeekTarget
SEEK_TARGET_TIME_TICK: SeekTarget
MEMBERSHIP_ACTION_UNSPECIFIED: MembershipAction
MEMBERSHIP_ACTION_ADD: MembershipAction
MEMBERSHIP_ACTION_REMOVE: MembershipAction
MEMBERSHIP_ACTION_FORGET: MembershipAction

class CreateChannelsRequest(_message.Message):
    __slots__ = ("request_id", "names", "prefix", "count", "owner", "replica_count", "wal", "wal_config")
    class WalConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    WAL_FIELD_NUMBER: _ClassVar[int]
    WAL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    names: _containers.RepeatedScalarFieldContainer[str]
    prefix: str
    count: int
    owner: _coordination_pb2.OwnerDescription
    replica_count: int
    wal: str
    wal_config: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., prefix: _Optional[str] = ..., count: _Optional[int] = ..., owner: _Optional[_Union[_coordination_pb2.OwnerDescription, _Mapping]] = ..., replica_count: _Optional[int] = ..., wal: _Optional[str] = ..., wal_config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateChannelsResponse(_message.Message):
    __slots__ = ("pchannels", "revision")
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    revision: int
    def __init__(self, pchannels: _Optional[_Iterable[str]] = ..., revision: _Optional[int] = ...) -> None: ...

class DropChannelsRequest(_message.Message):
    __slots__ = ("request_id", "pchannels")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., pchannels: _Optional[_Iterable[str]] = ...) -> None: ...

class DropChannelsResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class DescribeChannelsRequest(_message.Message):
    __slots__ = ("pchannels", "consistency")
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    consistency: Consistency
    def __init__(self, pchannels: _Optional[_Iterable[str]] = ..., consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class DescribeChannelsResponse(_message.Message):
    __slots__ = ("pchannels", "vchannels", "revision")
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    pchannels: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.PChannel]
    vchannels: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.VChannel]
    revision: int
    def __init__(self, pchannels: _Optional[_Iterable[_Union[_coordination_pb2.PChannel, _Mapping]]] = ..., vchannels: _Optional[_Iterable[_Union[_coordination_pb2.VChannel, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class ListChannelsRequest(_message.Message):
    __slots__ = ("consistency", "include_dropped")
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DROPPED_FIELD_NUMBER: _ClassVar[int]
    consistency: Consistency
    include_dropped: bool
    def __init__(self, consistency: _Optional[_Union[Consistency, str]] = ..., include_dropped: _Optional[bool] = ...) -> None: ...

class ListChannelsResponse(_message.Message):
    __slots__ = ("pchannels", "vchannels", "revision")
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    pchannels: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.PChannel]
    vchannels: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.VChannel]
    revision: int
    def __init__(self, pchannels: _Optional[_Iterable[_Union[_coordination_pb2.PChannel, _Mapping]]] = ..., vchannels: _Optional[_Iterable[_Union[_coordination_pb2.VChannel, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class CreateVChannelRequest(_message.Message):
    __slots__ = ("request_id", "name", "pchannel", "owner")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    pchannel: str
    owner: _coordination_pb2.OwnerDescription
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., pchannel: _Optional[str] = ..., owner: _Optional[_Union[_coordination_pb2.OwnerDescription, _Mapping]] = ...) -> None: ...

class CreateVChannelResponse(_message.Message):
    __slots__ = ("vchannel", "revision")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    vchannel: _coordination_pb2.VChannel
    revision: int
    def __init__(self, vchannel: _Optional[_Union[_coordination_pb2.VChannel, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class DropVChannelRequest(_message.Message):
    __slots__ = ("request_id", "name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DropVChannelResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class WatchAssignmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeAssignment(_message.Message):
    __slots__ = ("node_id", "address", "state", "worker_addresses")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    state: _coordination_pb2.NodeState
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[_coordination_pb2.NodeState, str]] = ..., worker_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class ChannelAssignment(_message.Message):
    __slots__ = ("pchannel", "term", "owner_node_id", "owner_address", "state", "access_mode", "replica_node_ids", "vchannels", "replica_addresses")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_MODE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    owner_node_id: str
    owner_address: str
    state: _coordination_pb2.PChannelState
    access_mode: _coordination_pb2.AccessMode
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    replica_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., owner_node_id: _Optional[str] = ..., owner_address: _Optional[str] = ..., state: _Optional[_Union[_coordination_pb2.PChannelState, str]] = ..., access_mode: _Optional[_Union[_coordination_pb2.AccessMode, str]] = ..., replica_node_ids: _Optional[_Iterable[str]] = ..., vchannels: _Optional[_Iterable[str]] = ..., replica_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class AssignmentDiscovery(_message.Message):
    __slots__ = ("version", "channels", "nodes", "progress")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    version: int
    channels: _containers.RepeatedCompositeFieldContainer[ChannelAssignment]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeAssignment]
    progress: bool
    def __init__(self, version: _Optional[int] = ..., channels: _Optional[_Iterable[_Union[ChannelAssignment, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeAssignment, _Mapping]]] = ..., progress: _Optional[bool] = ...) -> None: ...

class GrantLeaseRequest(_message.Message):
    __slots__ = ("request_id", "ttl_ms", "holder")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    ttl_ms: int
    holder: str
    def __init__(self, request_id: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., holder: _Optional[str] = ...) -> None: ...

class GrantLeaseResponse(_message.Message):
    __slots__ = ("lease_id", "ttl_ms", "deadline_ms", "revision")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    ttl_ms: int
    deadline_ms: int
    revision: int
    def __init__(self, lease_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("lease_id", "ttl_ms", "deadline_ms", "revision")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    ttl_ms: int
    deadline_ms: int
    revision: int
    def __init__(self, lease_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class RevokeLeaseRequest(_message.Message):
    __slots__ = ("request_id", "lease_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_id: int
    def __init__(self, request_id: _Optional[str] = ..., lease_id: _Optional[int] = ...) -> None: ...

class RevokeLeaseResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class LockRequest(_message.Message):
    __slots__ = ("request_id", "key", "mode", "lease_id", "wait_timeout_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    key: str
    mode: _coordination_pb2.LockMode
    lease_id: int
    wait_timeout_ms: int
    def __init__(self, request_id: _Optional[str] = ..., key: _Optional[str] = ..., mode: _Optional[_Union[_coordination_pb2.LockMode, str]] = ..., lease_id: _Optional[int] = ..., wait_timeout_ms: _Optional[int] = ...) -> None: ...

class LockResponse(_message.Message):
    __slots__ = ("key", "fencing_token", "revision")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    key: str
    fencing_token: int
    revision: int
    def __init__(self, key: _Optional[str] = ..., fencing_token: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class UnlockRequest(_message.Message):
    __slots__ = ("request_id", "key", "lease_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    key: str
    lease_id: int
    def __init__(self, request_id: _Optional[str] = ..., key: _Optional[str] = ..., lease_id: _Optional[int] = ...) -> None: ...

class UnlockResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class BroadcastRequest(_message.Message):
    __slots__ = ("request_id", "message", "msg_type", "vchannels", "resource_keys", "idempotency_key", "lock_timeout_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_KEYS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LOCK_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    message: bytes
    msg_type: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    resource_keys: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.ResourceKey]
    idempotency_key: str
    lock_timeout_ms: int
    def __init__(self, request_id: _Optional[str] = ..., message: _Optional[bytes] = ..., msg_type: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ..., resource_keys: _Optional[_Iterable[_Union[_coordination_pb2.ResourceKey, _Mapping]]] = ..., idempotency_key: _Optional[str] = ..., lock_timeout_ms: _Optional[int] = ...) -> None: ...

class BroadcastResponse(_message.Message):
    __slots__ = ("broadcast_id", "vchannels", "revision")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    vchannels: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.BroadcastVChannel]
    revision: int
    def __init__(self, broadcast_id: _Optional[int] = ..., vchannels: _Optional[_Iterable[_Union[_coordination_pb2.BroadcastVChannel, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("request_id", "broadcast_id", "vchannel", "checkpoint")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    broadcast_id: int
    vchannel: str
    checkpoint: int
    def __init__(self, request_id: _Optional[str] = ..., broadcast_id: _Optional[int] = ..., vchannel: _Optional[str] = ..., checkpoint: _Optional[int] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("revision", "state")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    revision: int
    state: _coordination_pb2.BroadcastState
    def __init__(self, revision: _Optional[int] = ..., state: _Optional[_Union[_coordination_pb2.BroadcastState, str]] = ...) -> None: ...

class WaitResourceKeyRequest(_message.Message):
    __slots__ = ("key", "mode", "timeout_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    mode: WaitMode
    timeout_ms: int
    def __init__(self, key: _Optional[str] = ..., mode: _Optional[_Union[WaitMode, str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class WaitResourceKeyResponse(_message.Message):
    __slots__ = ("broadcast_id", "state", "revision")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    state: _coordination_pb2.BroadcastState
    revision: int
    def __init__(self, broadcast_id: _Optional[int] = ..., state: _Optional[_Union[_coordination_pb2.BroadcastState, str]] = ..., revision: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("from_revision", "kinds")
    FROM_REVISION_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    from_revision: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, from_revision: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("events", "applied_revision", "next_revision")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_REVISION_FIELD_NUMBER: _ClassVar[int]
    NEXT_REVISION_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.Event]
    applied_revision: int
    next_revision: int
    def __init__(self, events: _Optional[_Iterable[_Union[_coordination_pb2.Event, _Mapping]]] = ..., applied_revision: _Optional[int] = ..., next_revision: _Optional[int] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ("consistency",)
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    consistency: Consistency
    def __init__(self, consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class MemberStatus(_message.Message):
    __slots__ = ("node_id", "grpc_address", "raft_address", "is_leader", "reachable", "raft_term", "commit_index", "applied_index", "revision", "state_digest", "pid", "durable_index", "owners", "wal_disk", "data_dir_bytes", "role", "processes", "replicators", "disks", "raft_reserve_bytes", "raft_reserve_wanted_bytes", "disk_writes_refused")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DURABLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    WAL_DISK_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    REPLICATORS_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    RAFT_RESERVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAFT_RESERVE_WANTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_WRITES_REFUSED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    grpc_address: str
    raft_address: str
    is_leader: bool
    reachable: bool
    raft_term: int
    commit_index: int
    applied_index: int
    revision: int
    state_digest: str
    pid: int
    durable_index: int
    owners: _containers.RepeatedCompositeFieldContainer[OwnerStatus]
    wal_disk: _containers.RepeatedCompositeFieldContainer[WalDiskUsage]
    data_dir_bytes: int
    role: str
    processes: _containers.RepeatedCompositeFieldContainer[ProcessStatus]
    replicators: _containers.RepeatedCompositeFieldContainer[ReplicatorStatus]
    disks: _containers.RepeatedCompositeFieldContainer[DiskStatus]
    raft_reserve_bytes: int
    raft_reserve_wanted_bytes: int
    disk_writes_refused: int
    def __init__(self, node_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., raft_address: _Optional[str] = ..., is_leader: _Optional[bool] = ..., reachable: _Optional[bool] = ..., raft_term: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., revision: _Optional[int] = ..., state_digest: _Optional[str] = ..., pid: _Optional[int] = ..., durable_index: _Optional[int] = ..., owners: _Optional[_Iterable[_Union[OwnerStatus, _Mapping]]] = ..., wal_disk: _Optional[_Iterable[_Union[WalDiskUsage, _Mapping]]] = ..., data_dir_bytes: _Optional[int] = ..., role: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[ProcessStatus, _Mapping]]] = ..., replicators: _Optional[_Iterable[_Union[ReplicatorStatus, _Mapping]]] = ..., disks: _Optional[_Iterable[_Union[DiskStatus, _Mapping]]] = ..., raft_reserve_bytes: _Optional[int] = ..., raft_reserve_wanted_bytes: _Optional[int] = ..., disk_writes_refused: _Optional[int] = ...) -> None: ...

class ProcessStatus(_message.Message):
    __slots__ = ("kind", "index", "pid", "up", "cpu_seconds", "rss_bytes", "grpc_address", "transfer_port", "restarts", "owned_pchannels", "replica_pchannels")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_PORT_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    OWNED_PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    index: int
    pid: int
    up: bool
    cpu_seconds: float
    rss_bytes: int
    grpc_address: str
    transfer_port: int
    restarts: int
    owned_pchannels: _containers.RepeatedScalarFieldContainer[str]
    replica_pchannels: int
    def __init__(self, kind: _Optional[str] = ..., index: _Optional[int] = ..., pid: _Optional[int] = ..., up: _Optional[bool] = ..., cpu_seconds: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., grpc_address: _Optional[str] = ..., transfer_port: _Optional[int] = ..., restarts: _Optional[int] = ..., owned_pchannels: _Optional[_Iterable[str]] = ..., replica_pchannels: _Optional[int] = ...) -> None: ...

class ReplicatorStatus(_message.Message):
    __slots__ = ("pchannel", "term", "target_cluster_id", "target_pchannel", "state", "source_committed_lsn", "target_lsn", "lag_entries", "lag_bytes", "lag_s", "apply_rate_entries_s", "apply_rate_bytes_s", "commit_rate_entries_s", "inflight_batches", "inflight_bytes", "keeping_up", "summary", "last_error", "applied_entries", "applied_bytes", "measured_at_ms", "needed_lsn", "source_first_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_COMMITTED_LSN_FIELD_NUMBER: _ClassVar[int]
    TARGET_LSN_FIELD_NUMBER: _ClassVar[int]
    LAG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    APPLY_RATE_ENTRIES_S_FIELD_NUMBER: _ClassVar[int]
    APPLY_RATE_BYTES_S_FIELD_NUMBER: _ClassVar[int]
    COMMIT_RATE_ENTRIES_S_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEEPING_UP_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    APPLIED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NEEDED_LSN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    target_cluster_id: str
    target_pchannel: str
    state: str
    source_committed_lsn: int
    target_lsn: int
    lag_entries: int
    lag_bytes: int
    lag_s: float
    apply_rate_entries_s: float
    apply_rate_bytes_s: float
    commit_rate_entries_s: float
    inflight_batches: int
    inflight_bytes: int
    keeping_up: bool
    summary: str
    last_error: str
    applied_entries: int
    applied_bytes: int
    measured_at_ms: int
    needed_lsn: int
    source_first_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., target_cluster_id: _Optional[str] = ..., target_pchannel: _Optional[str] = ..., state: _Optional[str] = ..., source_committed_lsn: _Optional[int] = ..., target_lsn: _Optional[int] = ..., lag_entries: _Optional[int] = ..., lag_bytes: _Optional[int] = ..., lag_s: _Optional[float] = ..., apply_rate_entries_s: _Optional[float] = ..., apply_rate_bytes_s: _Optional[float] = ..., commit_rate_entries_s: _Optional[float] = ..., inflight_batches: _Optional[int] = ..., inflight_bytes: _Optional[int] = ..., keeping_up: _Optional[bool] = ..., summary: _Optional[str] = ..., last_error: _Optional[str] = ..., applied_entries: _Optional[int] = ..., applied_bytes: _Optional[int] = ..., measured_at_ms: _Optional[int] = ..., needed_lsn: _Optional[int] = ..., source_first_lsn: _Optional[int] = ...) -> None: ...

class DiskStatus(_message.Message):
    __slots__ = ("dir", "total_bytes", "free_bytes", "level", "soft_mark_free_bytes", "hard_mark_free_bytes")
    DIR_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    SOFT_MARK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HARD_MARK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    dir: str
    total_bytes: int
    free_bytes: int
    level: str
    soft_mark_free_bytes: int
    hard_mark_free_bytes: int
    def __init__(self, dir: _Optional[str] = ..., total_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., level: _Optional[str] = ..., soft_mark_free_bytes: _Optional[int] = ..., hard_mark_free_bytes: _Optional[int] = ...) -> None: ...

class OwnerStatus(_message.Message):
    __slots__ = ("pchannel", "term", "state", "last_lsn", "committed_lsn", "replicas")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LSN_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    state: str
    last_lsn: int
    committed_lsn: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaPosition]
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., state: _Optional[str] = ..., last_lsn: _Optional[int] = ..., committed_lsn: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaPosition, _Mapping]]] = ...) -> None: ...

class ReplicaPosition(_message.Message):
    __slots__ = ("node_id", "durable_lsn", "lag_ms", "lagging")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DURABLE_LSN_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    LAGGING_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    durable_lsn: int
    lag_ms: int
    lagging: bool
    def __init__(self, node_id: _Optional[str] = ..., durable_lsn: _Optional[int] = ..., lag_ms: _Optional[int] = ..., lagging: _Optional[bool] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("leader_node_id", "leader_address", "members", "nodes", "pchannels", "revision", "balance_policy", "warnings", "leases", "locks", "pending_broadcasts", "retention", "under_replicated", "wal_alter")
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    BALANCE_POLICY_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    PENDING_BROADCASTS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    WAL_ALTER_FIELD_NUMBER: _ClassVar[int]
    leader_node_id: str
    leader_address: str
    members: _containers.RepeatedCompositeFieldContainer[MemberStatus]
    nodes: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.Node]
    pchannels: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.PChannel]
    revision: int
    balance_policy: _coordination_pb2.BalancePolicy
    warnings: _containers.RepeatedScalarFieldContainer[str]
    leases: int
    locks: int
    pending_broadcasts: int
    retention: _containers.RepeatedCompositeFieldContainer[RetentionStatus]
    under_replicated: _containers.RepeatedCompositeFieldContainer[UnderReplicated]
    wal_alter: _coordination_pb2.WalAlter
    def __init__(self, leader_node_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberStatus, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[_coordination_pb2.Node, _Mapping]]] = ..., pchannels: _Optional[_Iterable[_Union[_coordination_pb2.PChannel, _Mapping]]] = ..., revision: _Optional[int] = ..., balance_policy: _Optional[_Union[_coordination_pb2.BalancePolicy, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ..., leases: _Optional[int] = ..., locks: _Optional[int] = ..., pending_broadcasts: _Optional[int] = ..., retention: _Optional[_Iterable[_Union[RetentionStatus, _Mapping]]] = ..., under_replicated: _Optional[_Iterable[_Union[UnderReplicated, _Mapping]]] = ..., wal_alter: _Optional[_Union[_coordination_pb2.WalAlter, _Mapping]] = ...) -> None: ...

class AlterWalRequest(_message.Message):
    __slots__ = ("request_id", "target", "config")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    target: str
    config: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., target: _Optional[str] = ..., config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AlterWalResponse(_message.Message):
    __slots__ = ("epoch", "pchannels", "revision")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    revision: int
    def __init__(self, epoch: _Optional[int] = ..., pchannels: _Optional[_Iterable[str]] = ..., revision: _Optional[int] = ...) -> None: ...

class ListSegmentsRequest(_message.Message):
    __slots__ = ("pchannels", "as_of_revision")
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_REVISION_FIELD_NUMBER: _ClassVar[int]
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    as_of_revision: int
    def __init__(self, pchannels: _Optional[_Iterable[str]] = ..., as_of_revision: _Optional[int] = ...) -> None: ...

class ListSegmentsResponse(_message.Message):
    __slots__ = ("segments", "revision")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.Segment]
    revision: int
    def __init__(self, segments: _Optional[_Iterable[_Union[_coordination_pb2.Segment, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class SetBalancePolicyRequest(_message.Message):
    __slots__ = ("request_id", "allow_rebalance", "max_moves_per_round", "freeze_node_ids", "unfreeze_node_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOW_REBALANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    FREEZE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    UNFREEZE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    allow_rebalance: bool
    max_moves_per_round: int
    freeze_node_ids: _containers.RepeatedScalarFieldContainer[str]
    unfreeze_node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., allow_rebalance: _Optional[bool] = ..., max_moves_per_round: _Optional[int] = ..., freeze_node_ids: _Optional[_Iterable[str]] = ..., unfreeze_node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SetBalancePolicyResponse(_message.Message):
    __slots__ = ("policy", "revision")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    policy: _coordination_pb2.BalancePolicy
    revision: int
    def __init__(self, policy: _Optional[_Union[_coordination_pb2.BalancePolicy, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class UpdateReplicateConfigurationRequest(_message.Message):
    __slots__ = ("request_id", "configuration")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    configuration: _coordination_pb2.ReplicateConfiguration
    def __init__(self, request_id: _Optional[str] = ..., configuration: _Optional[_Union[_coordination_pb2.ReplicateConfiguration, _Mapping]] = ...) -> None: ...

class UpdateReplicateConfigurationResponse(_message.Message):
    __slots__ = ("revision", "changed")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    revision: int
    changed: bool
    def __init__(self, revision: _Optional[int] = ..., changed: _Optional[bool] = ...) -> None: ...

class GetReplicateConfigurationRequest(_message.Message):
    __slots__ = ("consistency",)
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    consistency: Consistency
    def __init__(self, consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class GetReplicateConfigurationResponse(_message.Message):
    __slots__ = ("configuration", "cluster_id", "revision", "checkpoints")
    class CheckpointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _coordination_pb2.ReplicateCheckpoints
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_coordination_pb2.ReplicateCheckpoints, _Mapping]] = ...) -> None: ...
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    configuration: _coordination_pb2.ReplicateConfiguration
    cluster_id: str
    revision: int
    checkpoints: _containers.MessageMap[str, _coordination_pb2.ReplicateCheckpoints]
    def __init__(self, configuration: _Optional[_Union[_coordination_pb2.ReplicateConfiguration, _Mapping]] = ..., cluster_id: _Optional[str] = ..., revision: _Optional[int] = ..., checkpoints: _Optional[_Mapping[str, _coordination_pb2.ReplicateCheckpoints]] = ...) -> None: ...

class CreateSubscriptionRequest(_message.Message):
    __slots__ = ("request_id", "name", "vchannels", "start", "start_lsn", "start_time_tick", "no_retention_hold")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    START_LSN_FIELD_NUMBER: _ClassVar[int]
    START_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    NO_RETENTION_HOLD_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    start: _coordination_pb2.SubscriptionStart
    start_lsn: int
    start_time_tick: int
    no_retention_hold: bool
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ..., start: _Optional[_Union[_coordination_pb2.SubscriptionStart, str]] = ..., start_lsn: _Optional[int] = ..., start_time_tick: _Optional[int] = ..., no_retention_hold: _Optional[bool] = ...) -> None: ...

class CreateSubscriptionResponse(_message.Message):
    __slots__ = ("subscription", "revision")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    subscription: _coordination_pb2.Subscription
    revision: int
    def __init__(self, subscription: _Optional[_Union[_coordination_pb2.Subscription, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class DropSubscriptionRequest(_message.Message):
    __slots__ = ("request_id", "name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DropSubscriptionResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ("consistency",)
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    consistency: Consistency
    def __init__(self, consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions", "revision")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[_coordination_pb2.Subscription]
    revision: int
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[_coordination_pb2.Subscription, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class DescribeSubscriptionRequest(_message.Message):
    __slots__ = ("name", "consistency")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    name: str
    consistency: Consistency
    def __init__(self, name: _Optional[str] = ..., consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class SubscriptionLag(_message.Message):
    __slots__ = ("vchannel", "pchannel", "position_lsn", "position_time_tick", "committed_lsn", "latest_time_tick", "lsn_lag", "time_lag_ms", "error")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    POSITION_LSN_FIELD_NUMBER: _ClassVar[int]
    POSITION_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LSN_FIELD_NUMBER: _ClassVar[int]
    LATEST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    LSN_LAG_FIELD_NUMBER: _ClassVar[int]
    TIME_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    pchannel: str
    position_lsn: int
    position_time_tick: int
    committed_lsn: int
    latest_time_tick: int
    lsn_lag: int
    time_lag_ms: int
    error: str
    def __init__(self, vchannel: _Optional[str] = ..., pchannel: _Optional[str] = ..., position_lsn: _Optional[int] = ..., position_time_tick: _Optional[int] = ..., committed_lsn: _Optional[int] = ..., latest_time_tick: _Optional[int] = ..., lsn_lag: _Optional[int] = ..., time_lag_ms: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class DescribeSubscriptionResponse(_message.Message):
    __slots__ = ("subscription", "lags", "revision")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LAGS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    subscription: _coordination_pb2.Subscription
    lags: _containers.RepeatedCompositeFieldContainer[SubscriptionLag]
    revision: int
    def __init__(self, subscription: _Optional[_Union[_coordination_pb2.Subscription, _Mapping]] = ..., lags: _Optional[_Iterable[_Union[SubscriptionLag, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class SubscriptionCommit(_message.Message):
    __slots__ = ("vchannel", "lsn", "time_tick")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    lsn: int
    time_tick: int
    def __init__(self, vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., time_tick: _Optional[int] = ...) -> None: ...

class CommitSubscriptionRequest(_message.Message):
    __slots__ = ("request_id", "name", "positions", "member_id", "generation")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    positions: _containers.RepeatedCompositeFieldContainer[SubscriptionCommit]
    member_id: str
    generation: int
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., positions: _Optional[_Iterable[_Union[SubscriptionCommit, _Mapping]]] = ..., member_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class JoinSubscriptionRequest(_message.Message):
    __slots__ = ("request_id", "name", "member_id", "lease_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    member_id: str
    lease_id: int
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., member_id: _Optional[str] = ..., lease_id: _Optional[int] = ...) -> None: ...

class JoinSubscriptionResponse(_message.Message):
    __slots__ = ("member", "revision")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    member: _coordination_pb2.SubscriptionMember
    revision: int
    def __init__(self, member: _Optional[_Union[_coordination_pb2.SubscriptionMember, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class LeaveSubscriptionRequest(_message.Message):
    __slots__ = ("request_id", "name", "member_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    member_id: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class LeaveSubscriptionResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class CommitSubscriptionResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class SeekSubscriptionRequest(_message.Message):
    __slots__ = ("request_id", "name", "vchannel", "target", "lsn", "time_tick")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    vchannel: str
    target: SeekTarget
    lsn: int
    time_tick: int
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., vchannel: _Optional[str] = ..., target: _Optional[_Union[SeekTarget, str]] = ..., lsn: _Optional[int] = ..., time_tick: _Optional[int] = ...) -> None: ...

class SeekSubscriptionResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class AssignRequest(_message.Message):
    __slots__ = ("pchannel", "term", "replica_node_ids")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., replica_node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AssignResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("pchannel", "term")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectStatusResponse(_message.Message):
    __slots__ = ("node_id", "member", "serving_terms")
    class ServingTermsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    SERVING_TERMS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    member: MemberStatus
    serving_terms: _containers.ScalarMap[str, int]
    def __init__(self, node_id: _Optional[str] = ..., member: _Optional[_Union[MemberStatus, _Mapping]] = ..., serving_terms: _Optional[_Mapping[str, int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "address", "incarnation", "serving_terms", "suspect_node_ids", "draining", "raft_address", "joined", "worker_addresses", "disk_pressure")
    class ServingTermsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SERVING_TERMS_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    DISK_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    incarnation: int
    serving_terms: _containers.ScalarMap[str, int]
    suspect_node_ids: _containers.RepeatedScalarFieldContainer[str]
    draining: bool
    raft_address: str
    joined: bool
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    disk_pressure: bool
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[int] = ..., serving_terms: _Optional[_Mapping[str, int]] = ..., suspect_node_ids: _Optional[_Iterable[str]] = ..., draining: _Optional[bool] = ..., raft_address: _Optional[str] = ..., joined: _Optional[bool] = ..., worker_addresses: _Optional[_Iterable[str]] = ..., disk_pressure: _Optional[bool] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("leader_node_id", "revision", "draining_seen", "handover_targets", "voter_node_ids", "membership_settled")
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_SEEN_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_TARGETS_FIELD_NUMBER: _ClassVar[int]
    VOTER_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_SETTLED_FIELD_NUMBER: _ClassVar[int]
    leader_node_id: str
    revision: int
    draining_seen: bool
    handover_targets: int
    voter_node_ids: _containers.RepeatedScalarFieldContainer[str]
    membership_settled: bool
    def __init__(self, leader_node_id: _Optional[str] = ..., revision: _Optional[int] = ..., draining_seen: _Optional[bool] = ..., handover_targets: _Optional[int] = ..., voter_node_ids: _Optional[_Iterable[str]] = ..., membership_settled: _Optional[bool] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("command", "timeout_ms")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    command: bytes
    timeout_ms: int
    def __init__(self, command: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bytes
    def __init__(self, result: _Optional[bytes] = ...) -> None: ...

class BatchWriteOp(_message.Message):
    __slots__ = ("grant_lease", "revoke_lease", "lock", "unlock")
    GRANT_LEASE_FIELD_NUMBER: _ClassVar[int]
    REVOKE_LEASE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    UNLOCK_FIELD_NUMBER: _ClassVar[int]
    grant_lease: GrantLeaseRequest
    revoke_lease: RevokeLeaseRequest
    lock: LockRequest
    unlock: UnlockRequest
    def __init__(self, grant_lease: _Optional[_Union[GrantLeaseRequest, _Mapping]] = ..., revoke_lease: _Optional[_Union[RevokeLeaseRequest, _Mapping]] = ..., lock: _Optional[_Union[LockRequest, _Mapping]] = ..., unlock: _Optional[_Union[UnlockRequest, _Mapping]] = ...) -> None: ...

class BatchWriteRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[BatchWriteOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[BatchWriteOp, _Mapping]]] = ...) -> None: ...

class BatchWriteResult(_message.Message):
    __slots__ = ("error", "grant_lease", "revoke_lease", "lock", "unlock")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GRANT_LEASE_FIELD_NUMBER: _ClassVar[int]
    REVOKE_LEASE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    UNLOCK_FIELD_NUMBER: _ClassVar[int]
    error: _errors_pb2.ErrorInfo
    grant_lease: GrantLeaseResponse
    revoke_lease: RevokeLeaseResponse
    lock: LockResponse
    unlock: UnlockResponse
    def __init__(self, error: _Optional[_Union[_errors_pb2.ErrorInfo, _Mapping]] = ..., grant_lease: _Optional[_Union[GrantLeaseResponse, _Mapping]] = ..., revoke_lease: _Optional[_Union[RevokeLeaseResponse, _Mapping]] = ..., lock: _Optional[_Union[LockResponse, _Mapping]] = ..., unlock: _Optional[_Union[UnlockResponse, _Mapping]] = ...) -> None: ...

class BatchWriteResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchWriteResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchWriteResult, _Mapping]]] = ...) -> None: ...

class ProposeBatchRequest(_message.Message):
    __slots__ = ("commands", "timeout_ms")
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedScalarFieldContainer[bytes]
    timeout_ms: int
    def __init__(self, commands: _Optional[_Iterable[bytes]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ProposeBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, results: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReadIndexRequest(_message.Message):
    __slots__ = ("timeout_ms",)
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    def __init__(self, timeout_ms: _Optional[int] = ...) -> None: ...

class ReadIndexResponse(_message.Message):
    __slots__ = ("raft_index", "term")
    RAFT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    raft_index: int
    term: int
    def __init__(self, raft_index: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class WalDiskUsage(_message.Message):
    __slots__ = ("pchannel", "bytes", "first_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    bytes: int
    first_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., bytes: _Optional[int] = ..., first_lsn: _Optional[int] = ...) -> None: ...

class UnderReplicated(_message.Message):
    __slots__ = ("pchannel", "replica_node_ids", "down_node_ids", "wanted", "live")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    DOWN_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    WANTED_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    down_node_ids: _containers.RepeatedScalarFieldContainer[str]
    wanted: int
    live: int
    def __init__(self, pchannel: _Optional[str] = ..., replica_node_ids: _Optional[_Iterable[str]] = ..., down_node_ids: _Optional[_Iterable[str]] = ..., wanted: _Optional[int] = ..., live: _Optional[int] = ...) -> None: ...

class RetentionStatus(_message.Message):
    __slots__ = ("pchannel", "deleted_before_lsn", "committed_segments", "committed_bytes", "committed_through_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    DELETED_BEFORE_LSN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_THROUGH_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    deleted_before_lsn: int
    committed_segments: int
    committed_bytes: int
    committed_through_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., deleted_before_lsn: _Optional[int] = ..., committed_segments: _Optional[int] = ..., committed_bytes: _Optional[int] = ..., committed_through_lsn: _Optional[int] = ...) -> None: ...

class SaveSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SaveSnapshotResponse(_message.Message):
    __slots__ = ("state", "revision", "state_digest")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    state: bytes
    revision: int
    state_digest: str
    def __init__(self, state: _Optional[bytes] = ..., revision: _Optional[int] = ..., state_digest: _Optional[str] = ...) -> None: ...

class ChangeMembershipRequest(_message.Message):
    __slots__ = ("node_id", "action", "timeout_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    action: MembershipAction
    timeout_ms: int
    def __init__(self, node_id: _Optional[str] = ..., action: _Optional[_Union[MembershipAction, str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ChangeMembershipResponse(_message.Message):
    __slots__ = ("voter_node_ids", "changed")
    VOTER_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    voter_node_ids: _containers.RepeatedScalarFieldContainer[str]
    changed: bool
    def __init__(self, voter_node_ids: _Optional[_Iterable[str]] = ..., changed: _Optional[bool] = ...) -> None: ...

class ListMembersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMembersResponse(_message.Message):
    __slots__ = ("voter_node_ids", "change_pending", "leader_node_id")
    VOTER_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    CHANGE_PENDING_FIELD_NUMBER: _ClassVar[int]
    LEADER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    voter_node_ids: _containers.RepeatedScalarFieldContainer[str]
    change_pending: bool
    leader_node_id: str
    def __init__(self, voter_node_ids: _Optional[_Iterable[str]] = ..., change_pending: _Optional[bool] = ..., leader_node_id: _Optional[str] = ...) -> None: ...
