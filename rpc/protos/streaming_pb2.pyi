from rpc.protos import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliverPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVER_POLICY_UNSPECIFIED: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_ALL: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_LATEST: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_START_FROM: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_START_AFTER: _ClassVar[DeliverPolicy]

class AppendStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPEND_STATUS_UNSPECIFIED: _ClassVar[AppendStatus]
    APPEND_STATUS_OK: _ClassVar[AppendStatus]
    APPEND_STATUS_FENCED: _ClassVar[AppendStatus]
    APPEND_STATUS_MISMATCH: _ClassVar[AppendStatus]
    APPEND_STATUS_ERROR: _ClassVar[AppendStatus]
DELIVER_POLICY_UNSPECIFIED: DeliverPolicy
DELIVER_POLICY_ALL: DeliverPolicy
DELIVER_POLICY_LATEST: DeliverPolicy
DELIVER_POLICY_START_FROM: DeliverPolicy
DELIVER_POLICY_START_AFTER: DeliverPolicy
APPEND_STATUS_UNSPECIFIED: AppendStatus
APPEND_STATUS_OK: AppendStatus
APPEND_STATUS_FENCED: AppendStatus
APPEND_STATUS_MISMATCH: AppendStatus
APPEND_STATUS_ERROR: AppendStatus

class Message(_message.Message):
    __slots__ = ("vchannel", "msg_type", "key", "payload", "properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    msg_type: str
    key: bytes
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    def __init__(self, vchannel: _Optional[str] = ..., msg_type: _Optional[str] = ..., key: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WalEntry(_message.Message):
    __slots__ = ("pchannel", "vchannel", "lsn", "term", "time_tick", "msg_type", "key", "payload", "properties", "txn_id", "broadcast_id", "flags", "segment_id")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    lsn: int
    term: int
    time_tick: int
    msg_type: str
    key: bytes
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    txn_id: int
    broadcast_id: int
    flags: int
    segment_id: int
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., lsn: _Optional[int] = ..., term: _Optional[int] = ..., time_tick: _Optional[int] = ..., msg_type: _Optional[str] = ..., key: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., txn_id: _Optional[int] = ..., broadcast_id: _Optional[int] = ..., flags: _Optional[int] = ..., segment_id: _Optional[int] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("lsn", "time_tick")
    LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    lsn: int
    time_tick: int
    def __init__(self, lsn: _Optional[int] = ..., time_tick: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("request_id", "pchannel", "messages", "producer_id", "sequence", "expected_last_lsn", "batch_vchannel", "batch_msg_type", "payloads", "previous_sequence", "replicate_source")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    BATCH_VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    pchannel: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    producer_id: str
    sequence: int
    expected_last_lsn: int
    batch_vchannel: str
    batch_msg_type: str
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    previous_sequence: int
    replicate_source: ReplicateSource
    def __init__(self, request_id: _Optional[int] = ..., pchannel: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., expected_last_lsn: _Optional[int] = ..., batch_vchannel: _Optional[str] = ..., batch_msg_type: _Optional[str] = ..., payloads: _Optional[_Iterable[bytes]] = ..., previous_sequence: _Optional[int] = ..., replicate_source: _Optional[_Union[ReplicateSource, _Mapping]] = ...) -> None: ...

class ReplicateSource(_message.Message):
    __slots__ = ("cluster_id", "pchannel", "lsns", "time_ticks")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    LSNS_FIELD_NUMBER: _ClassVar[int]
    TIME_TICKS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    pchannel: str
    lsns: _containers.RepeatedScalarFieldContainer[int]
    time_ticks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cluster_id: _Optional[str] = ..., pchannel: _Optional[str] = ..., lsns: _Optional[_Iterable[int]] = ..., time_ticks: _Optional[_Iterable[int]] = ...) -> None: ...

class ProduceResult(_message.Message):
    __slots__ = ("request_id", "positions", "error", "term", "duplicate", "first_lsn", "time_ticks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    TIME_TICKS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    positions: _containers.RepeatedCompositeFieldContainer[Position]
    error: _errors_pb2.ErrorInfo
    term: int
    duplicate: bool
    first_lsn: int
    time_ticks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[int] = ..., positions: _Optional[_Iterable[_Union[Position, _Mapping]]] = ..., error: _Optional[_Union[_errors_pb2.ErrorInfo, _Mapping]] = ..., term: _Optional[int] = ..., duplicate: _Optional[bool] = ..., first_lsn: _Optional[int] = ..., time_ticks: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("vchannel", "pchannel", "policy", "lsn", "after_time_tick", "from_time_tick", "msg_types", "include_control", "max_batch_entries", "time_tick_interval_ms", "with_segment_id", "from_replica")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    AFTER_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    FROM_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CONTROL_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TIME_TICK_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    WITH_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICA_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    pchannel: str
    policy: DeliverPolicy
    lsn: int
    after_time_tick: int
    from_time_tick: int
    msg_types: _containers.RepeatedScalarFieldContainer[str]
    include_control: bool
    max_batch_entries: int
    time_tick_interval_ms: int
    with_segment_id: bool
    from_replica: bool
    def __init__(self, vchannel: _Optional[str] = ..., pchannel: _Optional[str] = ..., policy: _Optional[_Union[DeliverPolicy, str]] = ..., lsn: _Optional[int] = ..., after_time_tick: _Optional[int] = ..., from_time_tick: _Optional[int] = ..., msg_types: _Optional[_Iterable[str]] = ..., include_control: _Optional[bool] = ..., max_batch_entries: _Optional[int] = ..., time_tick_interval_ms: _Optional[int] = ..., with_segment_id: _Optional[bool] = ..., from_replica: _Optional[bool] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("entries", "committed_lsn", "term", "committed_time_tick")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LSN_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[WalEntry]
    committed_lsn: int
    term: int
    committed_time_tick: int
    def __init__(self, entries: _Optional[_Iterable[_Union[WalEntry, _Mapping]]] = ..., committed_lsn: _Optional[int] = ..., term: _Optional[int] = ..., committed_time_tick: _Optional[int] = ...) -> None: ...

class BeginTxnRequest(_message.Message):
    __slots__ = ("vchannel", "keepalive_ms", "producer_id")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    keepalive_ms: int
    producer_id: str
    def __init__(self, vchannel: _Optional[str] = ..., keepalive_ms: _Optional[int] = ..., producer_id: _Optional[str] = ...) -> None: ...

class BeginTxnResponse(_message.Message):
    __slots__ = ("txn_id", "pchannel", "term")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    txn_id: int
    pchannel: str
    term: int
    def __init__(self, txn_id: _Optional[int] = ..., pchannel: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class AppendTxnRequest(_message.Message):
    __slots__ = ("vchannel", "txn_id", "messages", "producer_id")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    txn_id: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    producer_id: str
    def __init__(self, vchannel: _Optional[str] = ..., txn_id: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., producer_id: _Optional[str] = ...) -> None: ...

class AppendTxnResponse(_message.Message):
    __slots__ = ("buffered_messages", "buffered_bytes")
    BUFFERED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    buffered_messages: int
    buffered_bytes: int
    def __init__(self, buffered_messages: _Optional[int] = ..., buffered_bytes: _Optional[int] = ...) -> None: ...

class CommitTxnRequest(_message.Message):
    __slots__ = ("vchannel", "txn_id", "producer_id")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    txn_id: int
    producer_id: str
    def __init__(self, vchannel: _Optional[str] = ..., txn_id: _Optional[int] = ..., producer_id: _Optional[str] = ...) -> None: ...

class CommitTxnResponse(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[Position]
    def __init__(self, positions: _Optional[_Iterable[_Union[Position, _Mapping]]] = ...) -> None: ...

class RollbackTxnRequest(_message.Message):
    __slots__ = ("vchannel", "txn_id", "producer_id")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    txn_id: int
    producer_id: str
    def __init__(self, vchannel: _Optional[str] = ..., txn_id: _Optional[int] = ..., producer_id: _Optional[str] = ...) -> None: ...

class RollbackTxnResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeepAliveTxnRequest(_message.Message):
    __slots__ = ("vchannel", "txn_id", "producer_id")
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    vchannel: str
    txn_id: int
    producer_id: str
    def __init__(self, vchannel: _Optional[str] = ..., txn_id: _Optional[int] = ..., producer_id: _Optional[str] = ...) -> None: ...

class KeepAliveTxnResponse(_message.Message):
    __slots__ = ("expires_in_ms",)
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    expires_in_ms: int
    def __init__(self, expires_in_ms: _Optional[int] = ...) -> None: ...

class GetLatestTimeTickRequest(_message.Message):
    __slots__ = ("pchannel", "from_replica")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICA_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    from_replica: bool
    def __init__(self, pchannel: _Optional[str] = ..., from_replica: _Optional[bool] = ...) -> None: ...

class GetLatestTimeTickResponse(_message.Message):
    __slots__ = ("time_tick", "last_lsn", "committed_lsn", "term")
    TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LSN_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    time_tick: int
    last_lsn: int
    committed_lsn: int
    term: int
    def __init__(self, time_tick: _Optional[int] = ..., last_lsn: _Optional[int] = ..., committed_lsn: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class SealRequest(_message.Message):
    __slots__ = ("pchannel", "timeout_ms")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    timeout_ms: int
    def __init__(self, pchannel: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class SealResponse(_message.Message):
    __slots__ = ("committed_through_lsn", "term", "sealed")
    COMMITTED_THROUGH_LSN_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    committed_through_lsn: int
    term: int
    sealed: bool
    def __init__(self, committed_through_lsn: _Optional[int] = ..., term: _Optional[int] = ..., sealed: _Optional[bool] = ...) -> None: ...

class ReadSegmentRequest(_message.Message):
    __slots__ = ("pchannel", "segment_id", "from_lsn", "to_lsn", "max_chunk_bytes", "with_offsets", "bulk")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_LSN_FIELD_NUMBER: _ClassVar[int]
    TO_LSN_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    WITH_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    BULK_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    segment_id: int
    from_lsn: int
    to_lsn: int
    max_chunk_bytes: int
    with_offsets: bool
    bulk: bool
    def __init__(self, pchannel: _Optional[str] = ..., segment_id: _Optional[int] = ..., from_lsn: _Optional[int] = ..., to_lsn: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., with_offsets: _Optional[bool] = ..., bulk: _Optional[bool] = ...) -> None: ...

class ReadSegmentResponse(_message.Message):
    __slots__ = ("frames", "first_lsn", "last_lsn", "segment_digest", "segment_count", "node_id", "frames_crc", "frame_offsets", "transfer_ticket", "transfer_port", "transfer_bytes")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_CRC_FIELD_NUMBER: _ClassVar[int]
    FRAME_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TICKET_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_PORT_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    frames: bytes
    first_lsn: int
    last_lsn: int
    segment_digest: int
    segment_count: int
    node_id: str
    frames_crc: int
    frame_offsets: bytes
    transfer_ticket: bytes
    transfer_port: int
    transfer_bytes: int
    def __init__(self, frames: _Optional[bytes] = ..., first_lsn: _Optional[int] = ..., last_lsn: _Optional[int] = ..., segment_digest: _Optional[int] = ..., segment_count: _Optional[int] = ..., node_id: _Optional[str] = ..., frames_crc: _Optional[int] = ..., frame_offsets: _Optional[bytes] = ..., transfer_ticket: _Optional[bytes] = ..., transfer_port: _Optional[int] = ..., transfer_bytes: _Optional[int] = ...) -> None: ...

class OpenProduceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenProduceResponse(_message.Message):
    __slots__ = ("ticket", "port", "max_frame_bytes")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    ticket: bytes
    port: int
    max_frame_bytes: int
    def __init__(self, ticket: _Optional[bytes] = ..., port: _Optional[int] = ..., max_frame_bytes: _Optional[int] = ...) -> None: ...

class GetReplicateCheckpointRequest(_message.Message):
    __slots__ = ("pchannel", "source_cluster_id", "source_pchannel")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    source_cluster_id: str
    source_pchannel: str
    def __init__(self, pchannel: _Optional[str] = ..., source_cluster_id: _Optional[str] = ..., source_pchannel: _Optional[str] = ...) -> None: ...

class GetReplicateCheckpointResponse(_message.Message):
    __slots__ = ("source_lsn", "target_lsn", "term")
    SOURCE_LSN_FIELD_NUMBER: _ClassVar[int]
    TARGET_LSN_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    source_lsn: int
    target_lsn: int
    term: int
    def __init__(self, source_lsn: _Optional[int] = ..., target_lsn: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("pchannel", "term", "prev_lsn", "prev_term", "frames", "committed_lsn", "request_id", "owner_node_id", "frames_crc", "from_log_start")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PREV_LSN_FIELD_NUMBER: _ClassVar[int]
    PREV_TERM_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_LSN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_CRC_FIELD_NUMBER: _ClassVar[int]
    FROM_LOG_START_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    prev_lsn: int
    prev_term: int
    frames: bytes
    committed_lsn: int
    request_id: int
    owner_node_id: str
    frames_crc: int
    from_log_start: bool
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., prev_lsn: _Optional[int] = ..., prev_term: _Optional[int] = ..., frames: _Optional[bytes] = ..., committed_lsn: _Optional[int] = ..., request_id: _Optional[int] = ..., owner_node_id: _Optional[str] = ..., frames_crc: _Optional[int] = ..., from_log_start: _Optional[bool] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("request_id", "status", "durable_lsn", "last_lsn", "last_term", "fenced_term", "conflict_term", "conflict_first_lsn", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_LSN_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    FENCED_TERM_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_TERM_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: AppendStatus
    durable_lsn: int
    last_lsn: int
    last_term: int
    fenced_term: int
    conflict_term: int
    conflict_first_lsn: int
    error: _errors_pb2.ErrorInfo
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[_Union[AppendStatus, str]] = ..., durable_lsn: _Optional[int] = ..., last_lsn: _Optional[int] = ..., last_term: _Optional[int] = ..., fenced_term: _Optional[int] = ..., conflict_term: _Optional[int] = ..., conflict_first_lsn: _Optional[int] = ..., error: _Optional[_Union[_errors_pb2.ErrorInfo, _Mapping]] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("pchannel", "term", "owner_node_id")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    owner_node_id: str
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., owner_node_id: _Optional[str] = ...) -> None: ...

class FenceResponse(_message.Message):
    __slots__ = ("fenced_term", "last_lsn", "last_term", "last_time_tick", "node_id", "batch_frames")
    FENCED_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_TICK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FRAMES_FIELD_NUMBER: _ClassVar[int]
    fenced_term: int
    last_lsn: int
    last_term: int
    last_time_tick: int
    node_id: str
    batch_frames: bool
    def __init__(self, fenced_term: _Optional[int] = ..., last_lsn: _Optional[int] = ..., last_term: _Optional[int] = ..., last_time_tick: _Optional[int] = ..., node_id: _Optional[str] = ..., batch_frames: _Optional[bool] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("pchannel", "term", "prev_lsn", "prev_term", "max_bytes")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PREV_LSN_FIELD_NUMBER: _ClassVar[int]
    PREV_TERM_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    prev_lsn: int
    prev_term: int
    max_bytes: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., prev_lsn: _Optional[int] = ..., prev_term: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("status", "frames", "last_lsn", "last_term", "conflict_term", "conflict_first_lsn", "fenced_term", "log_start_lsn")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_TERM_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIRST_LSN_FIELD_NUMBER: _ClassVar[int]
    FENCED_TERM_FIELD_NUMBER: _ClassVar[int]
    LOG_START_LSN_FIELD_NUMBER: _ClassVar[int]
    status: AppendStatus
    frames: bytes
    last_lsn: int
    last_term: int
    conflict_term: int
    conflict_first_lsn: int
    fenced_term: int
    log_start_lsn: int
    def __init__(self, status: _Optional[_Union[AppendStatus, str]] = ..., frames: _Optional[bytes] = ..., last_lsn: _Optional[int] = ..., last_term: _Optional[int] = ..., conflict_term: _Optional[int] = ..., conflict_first_lsn: _Optional[int] = ..., fenced_term: _Optional[int] = ..., log_start_lsn: _Optional[int] = ...) -> None: ...

class AppendBroadcastRequest(_message.Message):
    __slots__ = ("pchannel", "vchannel", "broadcast_id", "msg_type", "message")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    vchannel: str
    broadcast_id: int
    msg_type: str
    message: bytes
    def __init__(self, pchannel: _Optional[str] = ..., vchannel: _Optional[str] = ..., broadcast_id: _Optional[int] = ..., msg_type: _Optional[str] = ..., message: _Optional[bytes] = ...) -> None: ...

class AppendBroadcastResponse(_message.Message):
    __slots__ = ("position", "duplicate")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    position: Position
    duplicate: bool
    def __init__(self, position: _Optional[_Union[Position, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class OpenAppendRequest(_message.Message):
    __slots__ = ("owner_node_id",)
    OWNER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    owner_node_id: str
    def __init__(self, owner_node_id: _Optional[str] = ...) -> None: ...

class OpenAppendResponse(_message.Message):
    __slots__ = ("ticket", "port", "max_frame_bytes")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    ticket: bytes
    port: int
    max_frame_bytes: int
    def __init__(self, ticket: _Optional[bytes] = ..., port: _Optional[int] = ..., max_frame_bytes: _Optional[int] = ...) -> None: ...
