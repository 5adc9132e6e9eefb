from rpc.protos import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_UP: _ClassVar[NodeState]
    NODE_STATE_DOWN: _ClassVar[NodeState]

class PChannelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PCHANNEL_STATE_UNSPECIFIED: _ClassVar[PChannelState]
    PCHANNEL_STATE_UNINITIALIZED: _ClassVar[PChannelState]
    PCHANNEL_STATE_ASSIGNING: _ClassVar[PChannelState]
    PCHANNEL_STATE_ASSIGNED: _ClassVar[PChannelState]
    PCHANNEL_STATE_UNAVAILABLE: _ClassVar[PChannelState]
    PCHANNEL_STATE_DROPPED: _ClassVar[PChannelState]

class AccessMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACCESS_MODE_UNSPECIFIED: _ClassVar[AccessMode]
    ACCESS_MODE_READWRITE: _ClassVar[AccessMode]
    ACCESS_MODE_READONLY: _ClassVar[AccessMode]

class VChannelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VCHANNEL_STATE_UNSPECIFIED: _ClassVar[VChannelState]
    VCHANNEL_STATE_NORMAL: _ClassVar[VChannelState]
    VCHANNEL_STATE_DROPPED: _ClassVar[VChannelState]

class LockMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCK_MODE_UNSPECIFIED: _ClassVar[LockMode]
    LOCK_MODE_EXCLUSIVE: _ClassVar[LockMode]
    LOCK_MODE_SHARED: _ClassVar[LockMode]

class BroadcastState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BROADCAST_STATE_UNSPECIFIED: _ClassVar[BroadcastState]
    BROADCAST_STATE_PENDING: _ClassVar[BroadcastState]
    BROADCAST_STATE_TOMBSTONE: _ClassVar[BroadcastState]
    BROADCAST_STATE_DONE: _ClassVar[BroadcastState]

class WalAlterStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAL_ALTER_STAGE_UNSPECIFIED: _ClassVar[WalAlterStage]
    WAL_ALTER_STAGE_FLUSHING: _ClassVar[WalAlterStage]
    WAL_ALTER_STAGE_ADVANCE_CHECKPOINT: _ClassVar[WalAlterStage]
    WAL_ALTER_STAGE_DONE: _ClassVar[WalAlterStage]

class HolderKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOLDER_KIND_UNSPECIFIED: _ClassVar[HolderKind]
    HOLDER_KIND_LEASE: _ClassVar[HolderKind]
    HOLDER_KIND_BROADCAST: _ClassVar[HolderKind]

class SubscriptionStart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBSCRIPTION_START_UNSPECIFIED: _ClassVar[SubscriptionStart]
    SUBSCRIPTION_START_EARLIEST: _ClassVar[SubscriptionStart]
    SUBSCRIPTION_START_LATEST: _ClassVar[SubscriptionStart]
    SUBSCRIPTION_START_LSN: _ClassVar[SubscriptionStart]
    SUBSCRIPTION_START_TIME_TICK: _ClassVar[SubscriptionStart]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_UP: NodeState
NODE_STATE_DOWN: NodeState
PCHANNEL_STATE_UNSPECIFIED: PChannelState
PCHANNEL_STATE_UNINITIALIZED: PChannelState
PCHANNEL_STATE_ASSIGNING: PChannelState
PCHANNEL_STATE_ASSIGNED: PChannelState
PCHANNEL_STATE_UNAVAILABLE: PChannelState
PCHANNEL_STATE_DROPPED: PChannelState
ACCESS_MODE_UNSPECIFIED: AccessMode
ACCESS_MODE_READWRITE: AccessMode
ACCESS_MODE_READONLY: AccessMode
VCHANNEL_STATE_UNSPECIFIED: VChannelState
VCHANNEL_STATE_NORMAL: VChannelState
VCHANNEL_STATE_DROPPED: VChannelState
LOCK_MODE_UNSPECIFIED: LockMode
LOCK_MODE_EXCLUSIVE: LockMode
LOCK_MODE_SHARED: LockMode
BROADCAST_STATE_UNSPECIFIED: BroadcastState
BROADCAST_STATE_PENDING: BroadcastState
BROADCAST_STATE_TOMBSTONE: BroadcastState
BROADCAST_STATE_DONE: BroadcastState
WAL_ALTER_STAGE_UNSPECIFIED: WalAlterStage
WAL_ALTER_STAGE_FLUSHING: WalAlterStage
WAL_ALTER_STAGE_ADVANCE_CHECKPOINT: WalAlterStage
WAL_ALTER_STAGE_DONE: WalAlterStage
HOLDER_KIND_UNSPECIFIED: HolderKind
HOLDER_KIND_LEASE: HolderKind
HOLDER_KIND_BROADCAST: HolderKind
SUBSCRIPTION_START_UNSPECIFIED: SubscriptionStart
SUBSCRIPTION_START_EARLIEST: SubscriptionStart
SUBSCRIPTION_START_LATEST: SubscriptionStart
SUBSCRIPTION_START_LSN: SubscriptionStart
SUBSCRIPTION_START_TIME_TICK: SubscriptionStart

class OwnerDescription(_message.Message):
    __slots__ = ("role", "address", "text")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    role: str
    address: str
    text: str
    def __init__(self, role: _Optional[str] = ..., address: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("node_id", "address", "state", "frozen", "registered_revision", "raft_address", "worker_addresses")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_REVISION_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    state: NodeState
    frozen: bool
    registered_revision: int
    raft_address: str
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., frozen: _Optional[bool] = ..., registered_revision: _Optional[int] = ..., raft_address: _Optional[str] = ..., worker_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class AssignmentHistoryEntry(_message.Message):
    __slots__ = ("term", "node_id", "start_lsn", "end_lsn")
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_LSN_FIELD_NUMBER: _ClassVar[int]
    END_LSN_FIELD_NUMBER: _ClassVar[int]
    term: int
    node_id: str
    start_lsn: int
    end_lsn: int
    def __init__(self, term: _Optional[int] = ..., node_id: _Optional[str] = ..., start_lsn: _Optional[int] = ..., end_lsn: _Optional[int] = ...) -> None: ...

class PChannel(_message.Message):
    __slots__ = ("name", "term", "owner_node_id", "replica_node_ids", "state", "access_mode", "history", "owner", "replica_count", "created_revision", "stable_replica_node_ids", "wal", "wal_config", "wal_epoch", "wal_checkpoint_lsn", "wal_checkpoint_term", "wal_checkpoint_time_tick")
    class WalConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_MODE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATED_REVISION_FIELD_NUMBER: _ClassVar[int]
    STABLE_REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    WAL_FIELD_NUMBER: _ClassVar[int]
    WAL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    WAL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WAL_CHECKPOINT_LSN_FIELD_NUMBER: _ClassVar[int]
    WAL_CHECKPOINT_TERM_FIELD_NUMBER: _ClassVar[int]
    WAL_CHECKPOINT_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    name: str
    term: int
    owner_node_id: str
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    state: PChannelState
    access_mode: AccessMode
    history: _containers.RepeatedCompositeFieldContainer[AssignmentHistoryEntry]
    owner: OwnerDescription
    replica_count: int
    created_revision: int
    stable_replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    wal: str
    wal_config: _containers.ScalarMap[str, str]
    wal_epoch: int
    wal_checkpoint_lsn: int
    wal_checkpoint_term: int
    wal_checkpoint_time_tick: int
    def __init__(self, name: _Optional[str] = ..., term: _Optional[int] = ..., owner_node_id: _Optional[str] = ..., replica_node_ids: _Optional[_Iterable[str]] = ..., state: _Optional[_Union[PChannelState, str]] = ..., access_mode: _Optional[_Union[AccessMode, str]] = ..., history: _Optional[_Iterable[_Union[AssignmentHistoryEntry, _Mapping]]] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., replica_count: _Optional[int] = ..., created_revision: _Optional[int] = ..., stable_replica_node_ids: _Optional[_Iterable[str]] = ..., wal: _Optional[str] = ..., wal_config: _Optional[_Mapping[str, str]] = ..., wal_epoch: _Optional[int] = ..., wal_checkpoint_lsn: _Optional[int] = ..., wal_checkpoint_term: _Optional[int] = ..., wal_checkpoint_time_tick: _Optional[int] = ...) -> None: ...

class WalAlterChannel(_message.Message):
    __slots__ = ("stage", "from_wal", "checkpoint_lsn", "checkpoint_time_tick", "term")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FROM_WAL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_LSN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    stage: WalAlterStage
    from_wal: str
    checkpoint_lsn: int
    checkpoint_time_tick: int
    term: int
    def __init__(self, stage: _Optional[_Union[WalAlterStage, str]] = ..., from_wal: _Optional[str] = ..., checkpoint_lsn: _Optional[int] = ..., checkpoint_time_tick: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class WalAlter(_message.Message):
    __slots__ = ("epoch", "target", "target_config", "pchannels", "started_at_ms")
    class TargetConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PchannelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: WalAlterChannel
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[WalAlterChannel, _Mapping]] = ...) -> None: ...
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_CONFIG_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    target: str
    target_config: _containers.ScalarMap[str, str]
    pchannels: _containers.MessageMap[str, WalAlterChannel]
    started_at_ms: int
    def __init__(self, epoch: _Optional[int] = ..., target: _Optional[str] = ..., target_config: _Optional[_Mapping[str, str]] = ..., pchannels: _Optional[_Mapping[str, WalAlterChannel]] = ..., started_at_ms: _Optional[int] = ...) -> None: ...

class VChannel(_message.Message):
    __slots__ = ("name", "id", "pchannel", "state", "owner", "created_revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CREATED_REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    pchannel: str
    state: VChannelState
    owner: OwnerDescription
    created_revision: int
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., pchannel: _Optional[str] = ..., state: _Optional[_Union[VChannelState, str]] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., created_revision: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("pchannel", "segment_id", "first_lsn", "last_lsn", "first_term", "last_term", "first_time_tick", "last_time_tick", "count", "bytes", "digest", "replica_node_ids", "committed_revision", "commit_term")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    FIRST_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TERM_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    segment_id: int
    first_lsn: int
    last_lsn: int
    first_term: int
    last_term: int
    first_time_tick: int
    last_time_tick: int
    count: int
    bytes: int
    digest: int
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    committed_revision: int
    commit_term: int
    def __init__(self, pchannel: _Optional[str] = ..., segment_id: _Optional[int] = ..., first_lsn: _Optional[int] = ..., last_lsn: _Optional[int] = ..., first_term: _Optional[int] = ..., last_term: _Optional[int] = ..., first_time_tick: _Optional[int] = ..., last_time_tick: _Optional[int] = ..., count: _Optional[int] = ..., bytes: _Optional[int] = ..., digest: _Optional[int] = ..., replica_node_ids: _Optional[_Iterable[str]] = ..., committed_revision: _Optional[int] = ..., commit_term: _Optional[int] = ...) -> None: ...

class SegmentManifest(_message.Message):
    __slots__ = ("segments", "committed_through_lsn", "deleted_before_lsn")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_THROUGH_LSN_FIELD_NUMBER: _ClassVar[int]
    DELETED_BEFORE_LSN_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    committed_through_lsn: int
    deleted_before_lsn: int
    def __init__(self, segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., committed_through_lsn: _Optional[int] = ..., deleted_before_lsn: _Optional[int] = ...) -> None: ...

class ResourceKey(_message.Message):
    __slots__ = ("key", "mode")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    key: str
    mode: LockMode
    def __init__(self, key: _Optional[str] = ..., mode: _Optional[_Union[LockMode, str]] = ...) -> None: ...

class BroadcastVChannel(_message.Message):
    __slots__ = ("vchannel", "appended", "appended_lsn", "appended_time_tick", "acked", "acked_checkpoint")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    APPENDED_LSN_FIELD_NUMBER: _ClassVar[int]
    APPENDED_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    ACKED_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    appended: bool
    appended_lsn: int
    appended_time_tick: int
    acked: bool
    acked_checkpoint: int
    def __init__(self, vchannel: _Optional[str] = ..., appended: _Optional[bool] = ..., appended_lsn: _Optional[int] = ..., appended_time_tick: _Optional[int] = ..., acked: _Optional[bool] = ..., acked_checkpoint: _Optional[int] = ...) -> None: ...

class BroadcastTask(_message.Message):
    __slots__ = ("id", "message", "msg_type", "resource_keys", "state", "vchannels", "idempotency_key", "created_revision", "tombstoned_at_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_KEYS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_REVISION_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    message: bytes
    msg_type: str
    resource_keys: _containers.RepeatedCompositeFieldContainer[ResourceKey]
    state: BroadcastState
    vchannels: _containers.RepeatedCompositeFieldContainer[BroadcastVChannel]
    idempotency_key: str
    created_revision: int
    tombstoned_at_ms: int
    def __init__(self, id: _Optional[int] = ..., message: _Optional[bytes] = ..., msg_type: _Optional[str] = ..., resource_keys: _Optional[_Iterable[_Union[ResourceKey, _Mapping]]] = ..., state: _Optional[_Union[BroadcastState, str]] = ..., vchannels: _Optional[_Iterable[_Union[BroadcastVChannel, _Mapping]]] = ..., idempotency_key: _Optional[str] = ..., created_revision: _Optional[int] = ..., tombstoned_at_ms: _Optional[int] = ...) -> None: ...

class LockHolder(_message.Message):
    __slots__ = ("kind", "id", "fencing_token")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    kind: HolderKind
    id: int
    fencing_token: int
    def __init__(self, kind: _Optional[_Union[HolderKind, str]] = ..., id: _Optional[int] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class ResourceLock(_message.Message):
    __slots__ = ("key", "mode", "holders")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    key: str
    mode: LockMode
    holders: _containers.RepeatedCompositeFieldContainer[LockHolder]
    def __init__(self, key: _Optional[str] = ..., mode: _Optional[_Union[LockMode, str]] = ..., holders: _Optional[_Iterable[_Union[LockHolder, _Mapping]]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("id", "ttl_ms", "holder", "granted_revision", "deadline_ms", "locked_keys", "owner")
    ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    GRANTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    LOCKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    id: int
    ttl_ms: int
    holder: str
    granted_revision: int
    deadline_ms: int
    locked_keys: _containers.RepeatedScalarFieldContainer[str]
    owner: str
    def __init__(self, id: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., holder: _Optional[str] = ..., granted_revision: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., locked_keys: _Optional[_Iterable[str]] = ..., owner: _Optional[str] = ...) -> None: ...

class ConsumerPosition(_message.Message):
    __slots__ = ("group", "vchannel", "lsn", "fence")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    vchannel: str
    lsn: int
    fence: int
    def __init__(self, group: _Optional[str] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., fence: _Optional[int] = ...) -> None: ...

class ConsumerGroup(_message.Message):
    __slots__ = ("positions",)
    class PositionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ConsumerPosition
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ConsumerPosition, _Mapping]] = ...) -> None: ...
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.MessageMap[str, ConsumerPosition]
    def __init__(self, positions: _Optional[_Mapping[str, ConsumerPosition]] = ...) -> None: ...

class SubscriptionPosition(_message.Message):
    __slots__ = ("lsn", "time_tick", "from_time_tick", "revision")
    LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    FROM_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    lsn: int
    time_tick: int
    from_time_tick: int
    revision: int
    def __init__(self, lsn: _Optional[int] = ..., time_tick: _Optional[int] = ..., from_time_tick: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class SubscriptionMember(_message.Message):
    __slots__ = ("member_id", "lease_id", "generation", "vchannels", "joined_revision")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    JOINED_REVISION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    lease_id: int
    generation: int
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    joined_revision: int
    def __init__(self, member_id: _Optional[str] = ..., lease_id: _Optional[int] = ..., generation: _Optional[int] = ..., vchannels: _Optional[_Iterable[str]] = ..., joined_revision: _Optional[int] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("name", "vchannels", "start", "start_lsn", "start_time_tick", "positions", "holds_retention", "created_revision", "members")
    class PositionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SubscriptionPosition
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SubscriptionPosition, _Mapping]] = ...) -> None: ...
    class MembersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SubscriptionMember
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SubscriptionMember, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    START_LSN_FIELD_NUMBER: _ClassVar[int]
    START_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    HOLDS_RETENTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_REVISION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    start: SubscriptionStart
    start_lsn: int
    start_time_tick: int
    positions: _containers.MessageMap[str, SubscriptionPosition]
    holds_retention: bool
    created_revision: int
    members: _containers.MessageMap[str, SubscriptionMember]
    def __init__(self, name: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ..., start: _Optional[_Union[SubscriptionStart, str]] = ..., start_lsn: _Optional[int] = ..., start_time_tick: _Optional[int] = ..., positions: _Optional[_Mapping[str, SubscriptionPosition]] = ..., holds_retention: _Optional[bool] = ..., created_revision: _Optional[int] = ..., members: _Optional[_Mapping[str, SubscriptionMember]] = ...) -> None: ...

class BalancePolicy(_message.Message):
    __slots__ = ("allow_rebalance", "max_moves_per_round")
    ALLOW_REBALANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    allow_rebalance: bool
    max_moves_per_round: int
    def __init__(self, allow_rebalance: _Optional[bool] = ..., max_moves_per_round: _Optional[int] = ...) -> None: ...

class ReplicateCredentials(_message.Message):
    __slots__ = ("token", "ca_certificate_pem", "token_set")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_SET_FIELD_NUMBER: _ClassVar[int]
    token: str
    ca_certificate_pem: str
    token_set: bool
    def __init__(self, token: _Optional[str] = ..., ca_certificate_pem: _Optional[str] = ..., token_set: _Optional[bool] = ...) -> None: ...

class ReplicateCluster(_message.Message):
    __slots__ = ("cluster_id", "endpoints", "credentials", "pchannels")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    credentials: ReplicateCredentials
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster_id: _Optional[str] = ..., endpoints: _Optional[_Iterable[str]] = ..., credentials: _Optional[_Union[ReplicateCredentials, _Mapping]] = ..., pchannels: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplicateTopologyEdge(_message.Message):
    __slots__ = ("source_cluster_id", "target_cluster_id", "start_after_lsns")
    SOURCE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_LSNS_FIELD_NUMBER: _ClassVar[int]
    source_cluster_id: str
    target_cluster_id: str
    start_after_lsns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, source_cluster_id: _Optional[str] = ..., target_cluster_id: _Optional[str] = ..., start_after_lsns: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplicateSwitchover(_message.Message):
    __slots__ = ("source_cluster_id", "target_cluster_id")
    SOURCE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    source_cluster_id: str
    target_cluster_id: str
    def __init__(self, source_cluster_id: _Optional[str] = ..., target_cluster_id: _Optional[str] = ...) -> None: ...

class ReplicateConfiguration(_message.Message):
    __slots__ = ("clusters", "topology", "switchover")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    SWITCHOVER_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[ReplicateCluster]
    topology: _containers.RepeatedCompositeFieldContainer[ReplicateTopologyEdge]
    switchover: ReplicateSwitchover
    def __init__(self, clusters: _Optional[_Iterable[_Union[ReplicateCluster, _Mapping]]] = ..., topology: _Optional[_Iterable[_Union[ReplicateTopologyEdge, _Mapping]]] = ..., switchover: _Optional[_Union[ReplicateSwitchover, _Mapping]] = ...) -> None: ...

class CoordinationState(_message.Message):
    __slots__ = ("format_version", "revision", "last_raft_index", "nodes", "pchannels", "vchannels", "next_vchannel_id", "manifests", "broadcasts", "broadcast_idempotency", "locks", "leases", "consumer_groups", "balance_policy", "recent_results", "recent_request_ids", "recent_cursor", "last_time_ms", "subscriptions", "replicate_configuration", "replicate_cluster_id", "replicate_checkpoints", "removed_nodes", "owner_usage", "wal_alter")
    class NodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Node
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...
    class PchannelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PChannel
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PChannel, _Mapping]] = ...) -> None: ...
    class VchannelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: VChannel
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[VChannel, _Mapping]] = ...) -> None: ...
    class ManifestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SegmentManifest
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SegmentManifest, _Mapping]] = ...) -> None: ...
    class BroadcastsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: BroadcastTask
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[BroadcastTask, _Mapping]] = ...) -> None: ...
    class BroadcastIdempotencyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class LocksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ResourceLock
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ResourceLock, _Mapping]] = ...) -> None: ...
    class LeasesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: Lease
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...
    class ConsumerGroupsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ConsumerGroup
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ConsumerGroup, _Mapping]] = ...) -> None: ...
    class RecentResultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class SubscriptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Subscription
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Subscription, _Mapping]] = ...) -> None: ...
    class ReplicateCheckpointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ReplicateCheckpoints
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ReplicateCheckpoints, _Mapping]] = ...) -> None: ...
    class RemovedNodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: RemovedNode
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[RemovedNode, _Mapping]] = ...) -> None: ...
    class OwnerUsageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: OwnerUsage
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[OwnerUsage, _Mapping]] = ...) -> None: ...
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    LAST_RAFT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    NEXT_VCHANNEL_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    BROADCASTS_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_IDEMPOTENCY_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BALANCE_POLICY_FIELD_NUMBER: _ClassVar[int]
    RECENT_RESULTS_FIELD_NUMBER: _ClassVar[int]
    RECENT_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    RECENT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_NODES_FIELD_NUMBER: _ClassVar[int]
    OWNER_USAGE_FIELD_NUMBER: _ClassVar[int]
    WAL_ALTER_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    revision: int
    last_raft_index: int
    nodes: _containers.MessageMap[str, Node]
    pchannels: _containers.MessageMap[str, PChannel]
    vchannels: _containers.MessageMap[str, VChannel]
    next_vchannel_id: int
    manifests: _containers.MessageMap[str, SegmentManifest]
    broadcasts: _containers.MessageMap[int, BroadcastTask]
    broadcast_idempotency: _containers.ScalarMap[str, int]
    locks: _containers.MessageMap[str, ResourceLock]
    leases: _containers.MessageMap[int, Lease]
    consumer_groups: _containers.MessageMap[str, ConsumerGroup]
    balance_policy: BalancePolicy
    recent_results: _containers.ScalarMap[str, bytes]
    recent_request_ids: _containers.RepeatedScalarFieldContainer[str]
    recent_cursor: int
    last_time_ms: int
    subscriptions: _containers.MessageMap[str, Subscription]
    replicate_configuration: ReplicateConfiguration
    replicate_cluster_id: str
    replicate_checkpoints: _containers.MessageMap[str, ReplicateCheckpoints]
    removed_nodes: _containers.MessageMap[str, RemovedNode]
    owner_usage: _containers.MessageMap[str, OwnerUsage]
    wal_alter: WalAlter
    def __init__(self, format_version: _Optional[int] = ..., revision: _Optional[int] = ..., last_raft_index: _Optional[int] = ..., nodes: _Optional[_Mapping[str, Node]] = ..., pchannels: _Optional[_Mapping[str, PChannel]] = ..., vchannels: _Optional[_Mapping[str, VChannel]] = ..., next_vchannel_id: _Optional[int] = ..., manifests: _Optional[_Mapping[str, SegmentManifest]] = ..., broadcasts: _Optional[_Mapping[int, BroadcastTask]] = ..., broadcast_idempotency: _Optional[_Mapping[str, int]] = ..., locks: _Optional[_Mapping[str, ResourceLock]] = ..., leases: _Optional[_Mapping[int, Lease]] = ..., consumer_groups: _Optional[_Mapping[str, ConsumerGroup]] = ..., balance_policy: _Optional[_Union[BalancePolicy, _Mapping]] = ..., recent_results: _Optional[_Mapping[str, bytes]] = ..., recent_request_ids: _Optional[_Iterable[str]] = ..., recent_cursor: _Optional[int] = ..., last_time_ms: _Optional[int] = ..., subscriptions: _Optional[_Mapping[str, Subscription]] = ..., replicate_configuration: _Optional[_Union[ReplicateConfiguration, _Mapping]] = ..., replicate_cluster_id: _Optional[str] = ..., replicate_checkpoints: _Optional[_Mapping[str, ReplicateCheckpoints]] = ..., removed_nodes: _Optional[_Mapping[str, RemovedNode]] = ..., owner_usage: _Optional[_Mapping[str, OwnerUsage]] = ..., wal_alter: _Optional[_Union[WalAlter, _Mapping]] = ...) -> None: ...

class OwnerUsage(_message.Message):
    __slots__ = ("leases", "locks")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    leases: int
    locks: int
    def __init__(self, leases: _Optional[int] = ..., locks: _Optional[int] = ...) -> None: ...

class RemovedNode(_message.Message):
    __slots__ = ("removed_revision", "removed_at_ms")
    REMOVED_REVISION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    removed_revision: int
    removed_at_ms: int
    def __init__(self, removed_revision: _Optional[int] = ..., removed_at_ms: _Optional[int] = ...) -> None: ...

class ReplicateCheckpoints(_message.Message):
    __slots__ = ("source_lsns", "drained_through_lsns", "mismatched_lsns")
    class SourceLsnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DrainedThroughLsnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MismatchedLsnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SOURCE_LSNS_FIELD_NUMBER: _ClassVar[int]
    DRAINED_THROUGH_LSNS_FIELD_NUMBER: _ClassVar[int]
    MISMATCHED_LSNS_FIELD_NUMBER: _ClassVar[int]
    source_lsns: _containers.ScalarMap[str, int]
    drained_through_lsns: _containers.ScalarMap[str, int]
    mismatched_lsns: _containers.ScalarMap[str, int]
    def __init__(self, source_lsns: _Optional[_Mapping[str, int]] = ..., drained_through_lsns: _Optional[_Mapping[str, int]] = ..., mismatched_lsns: _Optional[_Mapping[str, int]] = ...) -> None: ...

class RegisterNode(_message.Message):
    __slots__ = ("node_id", "address", "raft_address", "joined_incarnation_ms", "worker_addresses")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    JOINED_INCARNATION_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    raft_address: str
    joined_incarnation_ms: int
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., raft_address: _Optional[str] = ..., joined_incarnation_ms: _Optional[int] = ..., worker_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveNode(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class MarkNodeDown(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class MarkNodeUp(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class FreezeNode(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class UnfreezeNode(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class CreatePChannels(_message.Message):
    __slots__ = ("names", "prefix", "count", "owner", "replica_count", "wal", "wal_config")
    class WalConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    WAL_FIELD_NUMBER: _ClassVar[int]
    WAL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    prefix: str
    count: int
    owner: OwnerDescription
    replica_count: int
    wal: str
    wal_config: _containers.ScalarMap[str, str]
    def __init__(self, names: _Optional[_Iterable[str]] = ..., prefix: _Optional[str] = ..., count: _Optional[int] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., replica_count: _Optional[int] = ..., wal: _Optional[str] = ..., wal_config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AssignPChannel(_message.Message):
    __slots__ = ("pchannel", "term", "node_id", "replica_node_ids", "access_mode")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    ACCESS_MODE_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    node_id: str
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    access_mode: AccessMode
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., node_id: _Optional[str] = ..., replica_node_ids: _Optional[_Iterable[str]] = ..., access_mode: _Optional[_Union[AccessMode, str]] = ...) -> None: ...

class PChannelReady(_message.Message):
    __slots__ = ("pchannel", "term", "node_id", "start_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    node_id: str
    start_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., node_id: _Optional[str] = ..., start_lsn: _Optional[int] = ...) -> None: ...

class MarkPChannelUnavailable(_message.Message):
    __slots__ = ("pchannel", "term")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class DropPChannel(_message.Message):
    __slots__ = ("pchannel",)
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    def __init__(self, pchannel: _Optional[str] = ...) -> None: ...

class CreateVChannel(_message.Message):
    __slots__ = ("name", "pchannel", "owner")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    name: str
    pchannel: str
    owner: OwnerDescription
    def __init__(self, name: _Optional[str] = ..., pchannel: _Optional[str] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ...) -> None: ...

class DropVChannel(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CommitSegment(_message.Message):
    __slots__ = ("pchannel", "term", "first_lsn", "last_lsn", "first_term", "last_term", "first_time_tick", "last_time_tick", "count", "bytes", "digest", "replica_node_ids")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    FIRST_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    first_lsn: int
    last_lsn: int
    first_term: int
    last_term: int
    first_time_tick: int
    last_time_tick: int
    count: int
    bytes: int
    digest: int
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., first_lsn: _Optional[int] = ..., last_lsn: _Optional[int] = ..., first_term: _Optional[int] = ..., last_term: _Optional[int] = ..., first_time_tick: _Optional[int] = ..., last_time_tick: _Optional[int] = ..., count: _Optional[int] = ..., bytes: _Optional[int] = ..., digest: _Optional[int] = ..., replica_node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteSegmentsBefore(_message.Message):
    __slots__ = ("pchannel", "before_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    BEFORE_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    before_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., before_lsn: _Optional[int] = ...) -> None: ...

class CreateBroadcast(_message.Message):
    __slots__ = ("message", "msg_type", "vchannels", "resource_keys", "idempotency_key")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_KEYS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    message: bytes
    msg_type: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    resource_keys: _containers.RepeatedCompositeFieldContainer[ResourceKey]
    idempotency_key: str
    def __init__(self, message: _Optional[bytes] = ..., msg_type: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ..., resource_keys: _Optional[_Iterable[_Union[ResourceKey, _Mapping]]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class RecordBroadcastAppended(_message.Message):
    __slots__ = ("broadcast_id", "vchannel", "lsn", "time_tick")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    vchannel: str
    lsn: int
    time_tick: int
    def __init__(self, broadcast_id: _Optional[int] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., time_tick: _Optional[int] = ...) -> None: ...

class AckBroadcast(_message.Message):
    __slots__ = ("broadcast_id", "vchannel", "checkpoint")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    vchannel: str
    checkpoint: int
    def __init__(self, broadcast_id: _Optional[int] = ..., vchannel: _Optional[str] = ..., checkpoint: _Optional[int] = ...) -> None: ...

class ClearBroadcasts(_message.Message):
    __slots__ = ("retention_ms",)
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    retention_ms: int
    def __init__(self, retention_ms: _Optional[int] = ...) -> None: ...

class GrantLease(_message.Message):
    __slots__ = ("ttl_ms", "holder", "owner")
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    ttl_ms: int
    holder: str
    owner: str
    def __init__(self, ttl_ms: _Optional[int] = ..., holder: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class KeepAliveLease(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class RevokeLease(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class ExpireLeases(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExtendLeases(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Lock(_message.Message):
    __slots__ = ("key", "mode", "lease_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    mode: LockMode
    lease_id: int
    def __init__(self, key: _Optional[str] = ..., mode: _Optional[_Union[LockMode, str]] = ..., lease_id: _Optional[int] = ...) -> None: ...

class Unlock(_message.Message):
    __slots__ = ("key", "lease_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    lease_id: int
    def __init__(self, key: _Optional[str] = ..., lease_id: _Optional[int] = ...) -> None: ...

class CommitConsumerPosition(_message.Message):
    __slots__ = ("group", "vchannel", "lsn", "fence")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    vchannel: str
    lsn: int
    fence: int
    def __init__(self, group: _Optional[str] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., fence: _Optional[int] = ...) -> None: ...

class BumpConsumerFence(_message.Message):
    __slots__ = ("group", "vchannel")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    group: str
    vchannel: str
    def __init__(self, group: _Optional[str] = ..., vchannel: _Optional[str] = ...) -> None: ...

class CreateSubscription(_message.Message):
    __slots__ = ("name", "vchannels", "start", "start_lsn", "start_time_tick", "no_retention_hold")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    START_LSN_FIELD_NUMBER: _ClassVar[int]
    START_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    NO_RETENTION_HOLD_FIELD_NUMBER: _ClassVar[int]
    name: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    start: SubscriptionStart
    start_lsn: int
    start_time_tick: int
    no_retention_hold: bool
    def __init__(self, name: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ..., start: _Optional[_Union[SubscriptionStart, str]] = ..., start_lsn: _Optional[int] = ..., start_time_tick: _Optional[int] = ..., no_retention_hold: _Optional[bool] = ...) -> None: ...

class DropSubscription(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CommitSubscriptionPosition(_message.Message):
    __slots__ = ("name", "vchannel", "lsn", "time_tick", "member_id", "generation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    vchannel: str
    lsn: int
    time_tick: int
    member_id: str
    generation: int
    def __init__(self, name: _Optional[str] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., time_tick: _Optional[int] = ..., member_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class JoinSubscription(_message.Message):
    __slots__ = ("name", "member_id", "lease_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    member_id: str
    lease_id: int
    def __init__(self, name: _Optional[str] = ..., member_id: _Optional[str] = ..., lease_id: _Optional[int] = ...) -> None: ...

class LeaveSubscription(_message.Message):
    __slots__ = ("name", "member_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    member_id: str
    def __init__(self, name: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class SubscriptionAssignment(_message.Message):
    __slots__ = ("member_id", "vchannels")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, member_id: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ...) -> None: ...

class AssignSubscription(_message.Message):
    __slots__ = ("name", "assignments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    assignments: _containers.RepeatedCompositeFieldContainer[SubscriptionAssignment]
    def __init__(self, name: _Optional[str] = ..., assignments: _Optional[_Iterable[_Union[SubscriptionAssignment, _Mapping]]] = ...) -> None: ...

class SeekSubscription(_message.Message):
    __slots__ = ("name", "vchannel", "lsn", "from_time_tick")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    FROM_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    name: str
    vchannel: str
    lsn: int
    from_time_tick: int
    def __init__(self, name: _Optional[str] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., from_time_tick: _Optional[int] = ...) -> None: ...

class SetBalancePolicy(_message.Message):
    __slots__ = ("allow_rebalance", "max_moves_per_round")
    ALLOW_REBALANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    allow_rebalance: bool
    max_moves_per_round: int
    def __init__(self, allow_rebalance: _Optional[bool] = ..., max_moves_per_round: _Optional[int] = ...) -> None: ...

class UpdateReplicateConfiguration(_message.Message):
    __slots__ = ("configuration", "local_cluster_id")
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    configuration: ReplicateConfiguration
    local_cluster_id: str
    def __init__(self, configuration: _Optional[_Union[ReplicateConfiguration, _Mapping]] = ..., local_cluster_id: _Optional[str] = ...) -> None: ...

class RecordReplicateCheckpoint(_message.Message):
    __slots__ = ("pchannel", "target_cluster_id", "source_lsn", "drained_through_lsn", "target_claims_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LSN_FIELD_NUMBER: _ClassVar[int]
    DRAINED_THROUGH_LSN_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLAIMS_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    target_cluster_id: str
    source_lsn: int
    drained_through_lsn: int
    target_claims_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., target_cluster_id: _Optional[str] = ..., source_lsn: _Optional[int] = ..., drained_through_lsn: _Optional[int] = ..., target_claims_lsn: _Optional[int] = ...) -> None: ...

class Barrier(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AlterWal(_message.Message):
    __slots__ = ("target", "target_config")
    class TargetConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_CONFIG_FIELD_NUMBER: _ClassVar[int]
    target: str
    target_config: _containers.ScalarMap[str, str]
    def __init__(self, target: _Optional[str] = ..., target_config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WalFlushed(_message.Message):
    __slots__ = ("pchannel", "epoch", "term", "node_id", "checkpoint_lsn", "checkpoint_term", "checkpoint_time_tick")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_LSN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TERM_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    epoch: int
    term: int
    node_id: str
    checkpoint_lsn: int
    checkpoint_term: int
    checkpoint_time_tick: int
    def __init__(self, pchannel: _Optional[str] = ..., epoch: _Optional[int] = ..., term: _Optional[int] = ..., node_id: _Optional[str] = ..., checkpoint_lsn: _Optional[int] = ..., checkpoint_term: _Optional[int] = ..., checkpoint_time_tick: _Optional[int] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("request_id", "proposed_at_ms", "register_node", "mark_node_down", "mark_node_up", "freeze_node", "unfreeze_node", "remove_node", "create_pchannels", "assign_pchannel", "pchannel_ready", "mark_pchannel_unavailable", "drop_pchannel", "create_vchannel", "drop_vchannel", "commit_segment", "delete_segments_before", "create_broadcast", "record_broadcast_appended", "ack_broadcast", "clear_broadcasts", "grant_lease", "keep_alive_lease", "revoke_lease", "expire_leases", "extend_leases", "lock", "unlock", "commit_consumer_position", "bump_consumer_fence", "create_subscription", "drop_subscription", "commit_subscription_position", "seek_subscription", "join_subscription", "leave_subscription", "assign_subscription", "restore_state", "set_balance_policy", "update_replicate_configuration", "record_replicate_checkpoint", "barrier", "alter_wal", "wal_flushed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_NODE_FIELD_NUMBER: _ClassVar[int]
    MARK_NODE_DOWN_FIELD_NUMBER: _ClassVar[int]
    MARK_NODE_UP_FIELD_NUMBER: _ClassVar[int]
    FREEZE_NODE_FIELD_NUMBER: _ClassVar[int]
    UNFREEZE_NODE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_NODE_FIELD_NUMBER: _ClassVar[int]
    CREATE_PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_READY_FIELD_NUMBER: _ClassVar[int]
    MARK_PCHANNEL_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DROP_PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    CREATE_VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    DROP_VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DELETE_SEGMENTS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    CREATE_BROADCAST_FIELD_NUMBER: _ClassVar[int]
    RECORD_BROADCAST_APPENDED_FIELD_NUMBER: _ClassVar[int]
    ACK_BROADCAST_FIELD_NUMBER: _ClassVar[int]
    CLEAR_BROADCASTS_FIELD_NUMBER: _ClassVar[int]
    GRANT_LEASE_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_LEASE_FIELD_NUMBER: _ClassVar[int]
    REVOKE_LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_LEASES_FIELD_NUMBER: _ClassVar[int]
    EXTEND_LEASES_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    UNLOCK_FIELD_NUMBER: _ClassVar[int]
    COMMIT_CONSUMER_POSITION_FIELD_NUMBER: _ClassVar[int]
    BUMP_CONSUMER_FENCE_FIELD_NUMBER: _ClassVar[int]
    CREATE_SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    DROP_SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SUBSCRIPTION_POSITION_FIELD_NUMBER: _ClassVar[int]
    SEEK_SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    JOIN_SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LEAVE_SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    RESTORE_STATE_FIELD_NUMBER: _ClassVar[int]
    SET_BALANCE_POLICY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_REPLICATE_CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    RECORD_REPLICATE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    ALTER_WAL_FIELD_NUMBER: _ClassVar[int]
    WAL_FLUSHED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    proposed_at_ms: int
    register_node: RegisterNode
    mark_node_down: MarkNodeDown
    mark_node_up: MarkNodeUp
    freeze_node: FreezeNode
    unfreeze_node: UnfreezeNode
    remove_node: RemoveNode
    create_pchannels: CreatePChannels
    assign_pchannel: AssignPChannel
    pchannel_ready: PChannelReady
    mark_pchannel_unavailable: MarkPChannelUnavailable
    drop_pchannel: DropPChannel
    create_vchannel: CreateVChannel
    drop_vchannel: DropVChannel
    commit_segment: CommitSegment
    delete_segments_before: DeleteSegmentsBefore
    create_broadcast: CreateBroadcast
    record_broadcast_appended: RecordBroadcastAppended
    ack_broadcast: AckBroadcast
    clear_broadcasts: ClearBroadcasts
    grant_lease: GrantLease
    keep_alive_lease: KeepAliveLease
    revoke_lease: RevokeLease
    expire_leases: ExpireLeases
    extend_leases: ExtendLeases
    lock: Lock
    unlock: Unlock
    commit_consumer_position: CommitConsumerPosition
    bump_consumer_fence: BumpConsumerFence
    create_subscription: CreateSubscription
    drop_subscription: DropSubscription
    commit_subscription_position: CommitSubscriptionPosition
    seek_subscription: SeekSubscription
    join_subscription: JoinSubscription
    leave_subscription: LeaveSubscription
    assign_subscription: AssignSubscription
    restore_state: RestoreState
    set_balance_policy: SetBalancePolicy
    update_replicate_configuration: UpdateReplicateConfiguration
    record_replicate_checkpoint: RecordReplicateCheckpoint
    barrier: Barrier
    alter_wal: AlterWal
    wal_flushed: WalFlushed
    def __init__(self, request_id: _Optional[str] = ..., proposed_at_ms: _Optional[int] = ..., register_node: _Optional[_Union[RegisterNode, _Mapping]] = ..., mark_node_down: _Optional[_Union[MarkNodeDown, _Mapping]] = ..., mark_node_up: _Optional[_Union[MarkNodeUp, _Mapping]] = ..., freeze_node: _Optional[_Union[FreezeNode, _Mapping]] = ..., unfreeze_node: _Optional[_Union[UnfreezeNode, _Mapping]] = ..., remove_node: _Optional[_Union[RemoveNode, _Mapping]] = ..., create_pchannels: _Optional[_Union[CreatePChannels, _Mapping]] = ..., assign_pchannel: _Optional[_Union[AssignPChannel, _Mapping]] = ..., pchannel_ready: _Optional[_Union[PChannelReady, _Mapping]] = ..., mark_pchannel_unavailable: _Optional[_Union[MarkPChannelUnavailable, _Mapping]] = ..., drop_pchannel: _Optional[_Union[DropPChannel, _Mapping]] = ..., create_vchannel: _Optional[_Union[CreateVChannel, _Mapping]] = ..., drop_vchannel: _Optional[_Union[DropVChannel, _Mapping]] = ..., commit_segment: _Optional[_Union[CommitSegment, _Mapping]] = ..., delete_segments_before: _Optional[_Union[DeleteSegmentsBefore, _Mapping]] = ..., create_broadcast: _Optional[_Union[CreateBroadcast, _Mapping]] = ..., record_broadcast_appended: _Optional[_Union[RecordBroadcastAppended, _Mapping]] = ..., ack_broadcast: _Optional[_Union[AckBroadcast, _Mapping]] = ..., clear_broadcasts: _Optional[_Union[ClearBroadcasts, _Mapping]] = ..., grant_lease: _Optional[_Union[GrantLease, _Mapping]] = ..., keep_alive_lease: _Optional[_Union[KeepAliveLease, _Mapping]] = ..., revoke_lease: _Optional[_Union[RevokeLease, _Mapping]] = ..., expire_leases: _Optional[_Union[ExpireLeases, _Mapping]] = ..., extend_leases: _Optional[_Union[ExtendLeases, _Mapping]] = ..., lock: _Optional[_Union[Lock, _Mapping]] = ..., unlock: _Optional[_Union[Unlock, _Mapping]] = ..., commit_consumer_position: _Optional[_Union[CommitConsumerPosition, _Mapping]] = ..., bump_consumer_fence: _Optional[_Union[BumpConsumerFence, _Mapping]] = ..., create_subscription: _Optional[_Union[CreateSubscription, _Mapping]] = ..., drop_subscription: _Optional[_Union[DropSubscription, _Mapping]] = ..., commit_subscription_position: _Optional[_Union[CommitSubscriptionPosition, _Mapping]] = ..., seek_subscription: _Optional[_Union[SeekSubscription, _Mapping]] = ..., join_subscription: _Optional[_Union[JoinSubscription, _Mapping]] = ..., leave_subscription: _Optional[_Union[LeaveSubscription, _Mapping]] = ..., assign_subscription: _Optional[_Union[AssignSubscription, _Mapping]] = ..., restore_state: _Optional[_Union[RestoreState, _Mapping]] = ..., set_balance_policy: _Optional[_Union[SetBalancePolicy, _Mapping]] = ..., update_replicate_configuration: _Optional[_Union[UpdateReplicateConfiguration, _Mapping]] = ..., record_replicate_checkpoint: _Optional[_Union[RecordReplicateCheckpoint, _Mapping]] = ..., barrier: _Optional[_Union[Barrier, _Mapping]] = ..., alter_wal: _Optional[_Union[AlterWal, _Mapping]] = ..., wal_flushed: _Optional[_Union[WalFlushed, _Mapping]] = ...) -> None: ...

class NodeRegistered(_message.Message):
    __slots__ = ("node_id", "address", "raft_address", "worker_addresses")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    raft_address: str
    worker_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., raft_address: _Optional[str] = ..., worker_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeRemoved(_message.Message):
    __slots__ = ("node_id", "removed_at_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOVED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    removed_at_ms: int
    def __init__(self, node_id: _Optional[str] = ..., removed_at_ms: _Optional[int] = ...) -> None: ...

class NodeMarkedDown(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NodeMarkedUp(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NodeFrozen(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NodeUnfrozen(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class WalAlterStarted(_message.Message):
    __slots__ = ("epoch", "target", "target_config", "pchannels", "from_wals")
    class TargetConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_CONFIG_FIELD_NUMBER: _ClassVar[int]
    PCHANNELS_FIELD_NUMBER: _ClassVar[int]
    FROM_WALS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    target: str
    target_config: _containers.ScalarMap[str, str]
    pchannels: _containers.RepeatedScalarFieldContainer[str]
    from_wals: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epoch: _Optional[int] = ..., target: _Optional[str] = ..., target_config: _Optional[_Mapping[str, str]] = ..., pchannels: _Optional[_Iterable[str]] = ..., from_wals: _Optional[_Iterable[str]] = ...) -> None: ...

class WalCheckpointAdvanced(_message.Message):
    __slots__ = ("pchannel", "epoch", "wal", "wal_config", "checkpoint_lsn", "checkpoint_term", "checkpoint_time_tick", "term")
    class WalConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WAL_FIELD_NUMBER: _ClassVar[int]
    WAL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_LSN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TERM_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    epoch: int
    wal: str
    wal_config: _containers.ScalarMap[str, str]
    checkpoint_lsn: int
    checkpoint_term: int
    checkpoint_time_tick: int
    term: int
    def __init__(self, pchannel: _Optional[str] = ..., epoch: _Optional[int] = ..., wal: _Optional[str] = ..., wal_config: _Optional[_Mapping[str, str]] = ..., checkpoint_lsn: _Optional[int] = ..., checkpoint_term: _Optional[int] = ..., checkpoint_time_tick: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class WalAlterChannelDone(_message.Message):
    __slots__ = ("pchannel", "epoch")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    epoch: int
    def __init__(self, pchannel: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class WalAlterFinished(_message.Message):
    __slots__ = ("epoch", "target")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    target: str
    def __init__(self, epoch: _Optional[int] = ..., target: _Optional[str] = ...) -> None: ...

class PChannelCreated(_message.Message):
    __slots__ = ("name", "owner", "replica_count", "wal", "wal_config")
    class WalConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    WAL_FIELD_NUMBER: _ClassVar[int]
    WAL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    owner: OwnerDescription
    replica_count: int
    wal: str
    wal_config: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ..., replica_count: _Optional[int] = ..., wal: _Optional[str] = ..., wal_config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PChannelAssigned(_message.Message):
    __slots__ = ("pchannel", "term", "node_id", "replica_node_ids", "access_mode")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    ACCESS_MODE_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    node_id: str
    replica_node_ids: _containers.RepeatedScalarFieldContainer[str]
    access_mode: AccessMode
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., node_id: _Optional[str] = ..., replica_node_ids: _Optional[_Iterable[str]] = ..., access_mode: _Optional[_Union[AccessMode, str]] = ...) -> None: ...

class PChannelBecameReady(_message.Message):
    __slots__ = ("pchannel", "term", "node_id", "start_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    node_id: str
    start_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., node_id: _Optional[str] = ..., start_lsn: _Optional[int] = ...) -> None: ...

class PChannelMarkedUnavailable(_message.Message):
    __slots__ = ("pchannel", "term")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class PChannelDropped(_message.Message):
    __slots__ = ("pchannel",)
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    def __init__(self, pchannel: _Optional[str] = ...) -> None: ...

class VChannelCreated(_message.Message):
    __slots__ = ("name", "id", "pchannel", "owner")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    pchannel: str
    owner: OwnerDescription
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., pchannel: _Optional[str] = ..., owner: _Optional[_Union[OwnerDescription, _Mapping]] = ...) -> None: ...

class VChannelDropped(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SegmentCommitted(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: Segment
    def __init__(self, segment: _Optional[_Union[Segment, _Mapping]] = ...) -> None: ...

class SegmentsDeleted(_message.Message):
    __slots__ = ("pchannel", "segment_ids", "deleted_before_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    DELETED_BEFORE_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    deleted_before_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., segment_ids: _Optional[_Iterable[int]] = ..., deleted_before_lsn: _Optional[int] = ...) -> None: ...

class BroadcastCreated(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: BroadcastTask
    def __init__(self, task: _Optional[_Union[BroadcastTask, _Mapping]] = ...) -> None: ...

class BroadcastAppended(_message.Message):
    __slots__ = ("broadcast_id", "vchannel", "lsn", "time_tick")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    vchannel: str
    lsn: int
    time_tick: int
    def __init__(self, broadcast_id: _Optional[int] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., time_tick: _Optional[int] = ...) -> None: ...

class BroadcastAcked(_message.Message):
    __slots__ = ("broadcast_id", "vchannel", "checkpoint")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    vchannel: str
    checkpoint: int
    def __init__(self, broadcast_id: _Optional[int] = ..., vchannel: _Optional[str] = ..., checkpoint: _Optional[int] = ...) -> None: ...

class BroadcastTombstoned(_message.Message):
    __slots__ = ("broadcast_id", "tombstoned_at_ms")
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    tombstoned_at_ms: int
    def __init__(self, broadcast_id: _Optional[int] = ..., tombstoned_at_ms: _Optional[int] = ...) -> None: ...

class BroadcastCleared(_message.Message):
    __slots__ = ("broadcast_id",)
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    broadcast_id: int
    def __init__(self, broadcast_id: _Optional[int] = ...) -> None: ...

class LockAcquired(_message.Message):
    __slots__ = ("key", "mode", "holder_kind", "holder_id", "fencing_token")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KIND_FIELD_NUMBER: _ClassVar[int]
    HOLDER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    mode: LockMode
    holder_kind: HolderKind
    holder_id: int
    fencing_token: int
    def __init__(self, key: _Optional[str] = ..., mode: _Optional[_Union[LockMode, str]] = ..., holder_kind: _Optional[_Union[HolderKind, str]] = ..., holder_id: _Optional[int] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class LockReleased(_message.Message):
    __slots__ = ("key", "holder_kind", "holder_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KIND_FIELD_NUMBER: _ClassVar[int]
    HOLDER_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    holder_kind: HolderKind
    holder_id: int
    def __init__(self, key: _Optional[str] = ..., holder_kind: _Optional[_Union[HolderKind, str]] = ..., holder_id: _Optional[int] = ...) -> None: ...

class LeaseGranted(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class LeaseRenewed(_message.Message):
    __slots__ = ("lease_id", "deadline_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    deadline_ms: int
    def __init__(self, lease_id: _Optional[int] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class LeaseRevoked(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class LeaseExpired(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class ConsumerPositionCommitted(_message.Message):
    __slots__ = ("group", "vchannel", "lsn", "fence")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    vchannel: str
    lsn: int
    fence: int
    def __init__(self, group: _Optional[str] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., fence: _Optional[int] = ...) -> None: ...

class ConsumerFenceBumped(_message.Message):
    __slots__ = ("group", "vchannel", "fence")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    vchannel: str
    fence: int
    def __init__(self, group: _Optional[str] = ..., vchannel: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class SubscriptionCreated(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ...) -> None: ...

class SubscriptionDropped(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SubscriptionPositionCommitted(_message.Message):
    __slots__ = ("name", "vchannel", "position", "seek")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SEEK_FIELD_NUMBER: _ClassVar[int]
    name: str
    vchannel: str
    position: SubscriptionPosition
    seek: bool
    def __init__(self, name: _Optional[str] = ..., vchannel: _Optional[str] = ..., position: _Optional[_Union[SubscriptionPosition, _Mapping]] = ..., seek: _Optional[bool] = ...) -> None: ...

class SubscriptionMemberJoined(_message.Message):
    __slots__ = ("name", "member")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    name: str
    member: SubscriptionMember
    def __init__(self, name: _Optional[str] = ..., member: _Optional[_Union[SubscriptionMember, _Mapping]] = ...) -> None: ...

class SubscriptionMemberLeft(_message.Message):
    __slots__ = ("name", "member_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    member_id: str
    def __init__(self, name: _Optional[str] = ..., member_id: _Optional[str] = ...) -> None: ...

class SubscriptionMemberAssigned(_message.Message):
    __slots__ = ("name", "member_id", "vchannels", "generation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    member_id: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    def __init__(self, name: _Optional[str] = ..., member_id: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ...) -> None: ...

class BalancePolicySet(_message.Message):
    __slots__ = ("allow_rebalance", "max_moves_per_round")
    ALLOW_REBALANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    allow_rebalance: bool
    max_moves_per_round: int
    def __init__(self, allow_rebalance: _Optional[bool] = ..., max_moves_per_round: _Optional[int] = ...) -> None: ...

class ReplicateCheckpointRecorded(_message.Message):
    __slots__ = ("pchannel", "target_cluster_id", "source_lsn", "drained_through_lsn", "target_claims_lsn")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LSN_FIELD_NUMBER: _ClassVar[int]
    DRAINED_THROUGH_LSN_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLAIMS_LSN_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    target_cluster_id: str
    source_lsn: int
    drained_through_lsn: int
    target_claims_lsn: int
    def __init__(self, pchannel: _Optional[str] = ..., target_cluster_id: _Optional[str] = ..., source_lsn: _Optional[int] = ..., drained_through_lsn: _Optional[int] = ..., target_claims_lsn: _Optional[int] = ...) -> None: ...

class ReplicateConfigurationUpdated(_message.Message):
    __slots__ = ("configuration", "local_cluster_id")
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    configuration: ReplicateConfiguration
    local_cluster_id: str
    def __init__(self, configuration: _Optional[_Union[ReplicateConfiguration, _Mapping]] = ..., local_cluster_id: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("revision", "raft_index", "time_ms", "node_registered", "node_marked_down", "node_marked_up", "node_frozen", "node_unfrozen", "node_removed", "pchannel_created", "pchannel_assigned", "pchannel_became_ready", "pchannel_marked_unavailable", "pchannel_dropped", "vchannel_created", "vchannel_dropped", "segment_committed", "segments_deleted", "broadcast_created", "broadcast_appended", "broadcast_acked", "broadcast_tombstoned", "broadcast_cleared", "lease_granted", "lease_renewed", "lease_revoked", "lease_expired", "lock_acquired", "lock_released", "consumer_position_committed", "consumer_fence_bumped", "subscription_created", "subscription_dropped", "subscription_position_committed", "subscription_member_joined", "subscription_member_left", "subscription_member_assigned", "state_restored", "balance_policy_set", "replicate_configuration_updated", "replicate_checkpoint_recorded", "wal_alter_started", "wal_checkpoint_advanced", "wal_alter_channel_done", "wal_alter_finished")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RAFT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    NODE_MARKED_DOWN_FIELD_NUMBER: _ClassVar[int]
    NODE_MARKED_UP_FIELD_NUMBER: _ClassVar[int]
    NODE_FROZEN_FIELD_NUMBER: _ClassVar[int]
    NODE_UNFROZEN_FIELD_NUMBER: _ClassVar[int]
    NODE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_CREATED_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_BECAME_READY_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_MARKED_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_DROPPED_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_CREATED_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_CREATED_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_APPENDED_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_ACKED_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_TOMBSTONED_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_CLEARED_FIELD_NUMBER: _ClassVar[int]
    LEASE_GRANTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_RENEWED_FIELD_NUMBER: _ClassVar[int]
    LEASE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    LOCK_ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    LOCK_RELEASED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_POSITION_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FENCE_BUMPED_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_CREATED_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_POSITION_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_MEMBER_JOINED_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_MEMBER_LEFT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_MEMBER_ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    STATE_RESTORED_FIELD_NUMBER: _ClassVar[int]
    BALANCE_POLICY_SET_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_CONFIGURATION_UPDATED_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_CHECKPOINT_RECORDED_FIELD_NUMBER: _ClassVar[int]
    WAL_ALTER_STARTED_FIELD_NUMBER: _ClassVar[int]
    WAL_CHECKPOINT_ADVANCED_FIELD_NUMBER: _ClassVar[int]
    WAL_ALTER_CHANNEL_DONE_FIELD_NUMBER: _ClassVar[int]
    WAL_ALTER_FINISHED_FIELD_NUMBER: _ClassVar[int]
    revision: int
    raft_index: int
    time_ms: int
    node_registered: NodeRegistered
    node_marked_down: NodeMarkedDown
    node_marked_up: NodeMarkedUp
    node_frozen: NodeFrozen
    node_unfrozen: NodeUnfrozen
    node_removed: NodeRemoved
    pchannel_created: PChannelCreated
    pchannel_assigned: PChannelAssigned
    pchannel_became_ready: PChannelBecameReady
    pchannel_marked_unavailable: PChannelMarkedUnavailable
    pchannel_dropped: PChannelDropped
    vchannel_created: VChannelCreated
    vchannel_dropped: VChannelDropped
    segment_committed: SegmentCommitted
    segments_deleted: SegmentsDeleted
    broadcast_created: BroadcastCreated
    broadcast_appended: BroadcastAppended
    broadcast_acked: BroadcastAcked
    broadcast_tombstoned: BroadcastTombstoned
    broadcast_cleared: BroadcastCleared
    lease_granted: LeaseGranted
    lease_renewed: LeaseRenewed
    lease_revoked: LeaseRevoked
    lease_expired: LeaseExpired
    lock_acquired: LockAcquired
    lock_released: LockReleased
    consumer_position_committed: ConsumerPositionCommitted
    consumer_fence_bumped: ConsumerFenceBumped
    subscription_created: SubscriptionCreated
    subscription_dropped: SubscriptionDropped
    subscription_position_committed: SubscriptionPositionCommitted
    subscription_member_joined: SubscriptionMemberJoined
    subscription_member_left: SubscriptionMemberLeft
    subscription_member_assigned: SubscriptionMemberAssigned
    state_restored: StateRestored
    balance_policy_set: BalancePolicySet
    replicate_configuration_updated: ReplicateConfigurationUpdated
    replicate_checkpoint_recorded: ReplicateCheckpointRecorded
    wal_alter_started: WalAlterStarted
    wal_checkpoint_advanced: WalCheckpointAdvanced
    wal_alter_channel_done: WalAlterChannelDone
    wal_alter_finished: WalAlterFinished
    def __init__(self, revision: _Optional[int] = ..., raft_index: _Optional[int] = ..., time_ms: _Optional[int] = ..., node_registered: _Optional[_Union[NodeRegistered, _Mapping]] = ..., node_marked_down: _Optional[_Union[NodeMarkedDown, _Mapping]] = ..., node_marked_up: _Optional[_Union[NodeMarkedUp, _Mapping]] = ..., node_frozen: _Optional[_Union[NodeFrozen, _Mapping]] = ..., node_unfrozen: _Optional[_Union[NodeUnfrozen, _Mapping]] = ..., node_removed: _Optional[_Union[NodeRemoved, _Mapping]] = ..., pchannel_created: _Optional[_Union[PChannelCreated, _Mapping]] = ..., pchannel_assigned: _Optional[_Union[PChannelAssigned, _Mapping]] = ..., pchannel_became_ready: _Optional[_Union[PChannelBecameReady, _Mapping]] = ..., pchannel_marked_unavailable: _Optional[_Union[PChannelMarkedUnavailable, _Mapping]] = ..., pchannel_dropped: _Optional[_Union[PChannelDropped, _Mapping]] = ..., vchannel_created: _Optional[_Union[VChannelCreated, _Mapping]] = ..., vchannel_dropped: _Optional[_Union[VChannelDropped, _Mapping]] = ..., segment_committed: _Optional[_Union[SegmentCommitted, _Mapping]] = ..., segments_deleted: _Optional[_Union[SegmentsDeleted, _Mapping]] = ..., broadcast_created: _Optional[_Union[BroadcastCreated, _Mapping]] = ..., broadcast_appended: _Optional[_Union[BroadcastAppended, _Mapping]] = ..., broadcast_acked: _Optional[_Union[BroadcastAcked, _Mapping]] = ..., broadcast_tombstoned: _Optional[_Union[BroadcastTombstoned, _Mapping]] = ..., broadcast_cleared: _Optional[_Union[BroadcastCleared, _Mapping]] = ..., lease_granted: _Optional[_Union[LeaseGranted, _Mapping]] = ..., lease_renewed: _Optional[_Union[LeaseRenewed, _Mapping]] = ..., lease_revoked: _Optional[_Union[LeaseRevoked, _Mapping]] = ..., lease_expired: _Optional[_Union[LeaseExpired, _Mapping]] = ..., lock_acquired: _Optional[_Union[LockAcquired, _Mapping]] = ..., lock_released: _Optional[_Union[LockReleased, _Mapping]] = ..., consumer_position_committed: _Optional[_Union[ConsumerPositionCommitted, _Mapping]] = ..., consumer_fence_bumped: _Optional[_Union[ConsumerFenceBumped, _Mapping]] = ..., subscription_created: _Optional[_Union[SubscriptionCreated, _Mapping]] = ..., subscription_dropped: _Optional[_Union[SubscriptionDropped, _Mapping]] = ..., subscription_position_committed: _Optional[_Union[SubscriptionPositionCommitted, _Mapping]] = ..., subscription_member_joined: _Optional[_Union[SubscriptionMemberJoined, _Mapping]] = ..., subscription_member_left: _Optional[_Union[SubscriptionMemberLeft, _Mapping]] = ..., subscription_member_assigned: _Optional[_Union[SubscriptionMemberAssigned, _Mapping]] = ..., state_restored: _Optional[_Union[StateRestored, _Mapping]] = ..., balance_policy_set: _Optional[_Union[BalancePolicySet, _Mapping]] = ..., replicate_configuration_updated: _Optional[_Union[ReplicateConfigurationUpdated, _Mapping]] = ..., replicate_checkpoint_recorded: _Optional[_Union[ReplicateCheckpointRecorded, _Mapping]] = ..., wal_alter_started: _Optional[_Union[WalAlterStarted, _Mapping]] = ..., wal_checkpoint_advanced: _Optional[_Union[WalCheckpointAdvanced, _Mapping]] = ..., wal_alter_channel_done: _Optional[_Union[WalAlterChannelDone, _Mapping]] = ..., wal_alter_finished: _Optional[_Union[WalAlterFinished, _Mapping]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("rejection", "events", "revision", "raft_index", "deduplicated", "broadcast_id", "lease_id", "fencing_token", "consumer_fence", "pchannel_names", "lease_deadline_ms")
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RAFT_INDEX_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FENCE_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    rejection: _errors_pb2.ErrorInfo
    events: _containers.RepeatedCompositeFieldContainer[Event]
    revision: int
    raft_index: int
    deduplicated: bool
    broadcast_id: int
    lease_id: int
    fencing_token: int
    consumer_fence: int
    pchannel_names: _containers.RepeatedScalarFieldContainer[str]
    lease_deadline_ms: int
    def __init__(self, rejection: _Optional[_Union[_errors_pb2.ErrorInfo, _Mapping]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., revision: _Optional[int] = ..., raft_index: _Optional[int] = ..., deduplicated: _Optional[bool] = ..., broadcast_id: _Optional[int] = ..., lease_id: _Optional[int] = ..., fencing_token: _Optional[int] = ..., consumer_fence: _Optional[int] = ..., pchannel_names: _Optional[_Iterable[str]] = ..., lease_deadline_ms: _Optional[int] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("command", "batch")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    command: bytes
    batch: CommandBatch
    def __init__(self, command: _Optional[bytes] = ..., batch: _Optional[_Union[CommandBatch, _Mapping]] = ...) -> None: ...

class CommandBatch(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, commands: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LogEntryResult(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, results: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RestoreState(_message.Message):
    __slots__ = ("state", "state_digest")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    state: bytes
    state_digest: str
    def __init__(self, state: _Optional[bytes] = ..., state_digest: _Optional[str] = ...) -> None: ...

class StateRestored(_message.Message):
    __slots__ = ("state", "state_digest", "restored_revision")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RESTORED_REVISION_FIELD_NUMBER: _ClassVar[int]
    state: bytes
    state_digest: str
    restored_revision: int
    def __init__(self, state: _Optional[bytes] = ..., state_digest: _Optional[str] = ..., restored_revision: _Optional[int] = ...) -> None: ...
