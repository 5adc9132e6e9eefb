from rpc.protos import coordinator_pb2 as _coordinator_pb2
from rpc.protos import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlaneHello(_message.Message):
    __slots__ = ("token", "worker_index", "pid", "grpc_address", "transfer_port")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_PORT_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    worker_index: int
    pid: int
    grpc_address: str
    transfer_port: int
    def __init__(self, token: _Optional[bytes] = ..., worker_index: _Optional[int] = ..., pid: _Optional[int] = ..., grpc_address: _Optional[str] = ..., transfer_port: _Optional[int] = ...) -> None: ...

class PlaneState(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: bytes
    def __init__(self, state: _Optional[bytes] = ...) -> None: ...

class PlaneEvents(_message.Message):
    __slots__ = ("events", "raft_index", "last_time_ms", "revision")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    RAFT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedScalarFieldContainer[bytes]
    raft_index: int
    last_time_ms: int
    revision: int
    def __init__(self, events: _Optional[_Iterable[bytes]] = ..., raft_index: _Optional[int] = ..., last_time_ms: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class PlanePropose(_message.Message):
    __slots__ = ("id", "command")
    ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    id: int
    command: bytes
    def __init__(self, id: _Optional[int] = ..., command: _Optional[bytes] = ...) -> None: ...

class PlaneProposeResult(_message.Message):
    __slots__ = ("id", "result", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    result: bytes
    error: _errors_pb2.ErrorInfo
    def __init__(self, id: _Optional[int] = ..., result: _Optional[bytes] = ..., error: _Optional[_Union[_errors_pb2.ErrorInfo, _Mapping]] = ...) -> None: ...

class PlaneServing(_message.Message):
    __slots__ = ("serving_terms",)
    class ServingTermsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SERVING_TERMS_FIELD_NUMBER: _ClassVar[int]
    serving_terms: _containers.ScalarMap[str, int]
    def __init__(self, serving_terms: _Optional[_Mapping[str, int]] = ...) -> None: ...

class PlaneStatus(_message.Message):
    __slots__ = ("id", "owners", "wal_disk", "problems", "logs", "replicators", "disk_writes_refused")
    class ProblemsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    WAL_DISK_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    REPLICATORS_FIELD_NUMBER: _ClassVar[int]
    DISK_WRITES_REFUSED_FIELD_NUMBER: _ClassVar[int]
    id: int
    owners: _containers.RepeatedCompositeFieldContainer[_coordinator_pb2.OwnerStatus]
    wal_disk: _containers.RepeatedCompositeFieldContainer[_coordinator_pb2.WalDiskUsage]
    problems: _containers.ScalarMap[str, str]
    logs: int
    replicators: _containers.RepeatedCompositeFieldContainer[_coordinator_pb2.ReplicatorStatus]
    disk_writes_refused: int
    def __init__(self, id: _Optional[int] = ..., owners: _Optional[_Iterable[_Union[_coordinator_pb2.OwnerStatus, _Mapping]]] = ..., wal_disk: _Optional[_Iterable[_Union[_coordinator_pb2.WalDiskUsage, _Mapping]]] = ..., problems: _Optional[_Mapping[str, str]] = ..., logs: _Optional[int] = ..., replicators: _Optional[_Iterable[_Union[_coordinator_pb2.ReplicatorStatus, _Mapping]]] = ..., disk_writes_refused: _Optional[int] = ...) -> None: ...

class PlaneDisk(_message.Message):
    __slots__ = ("raft_reserve_released",)
    RAFT_RESERVE_RELEASED_FIELD_NUMBER: _ClassVar[int]
    raft_reserve_released: bool
    def __init__(self, raft_reserve_released: _Optional[bool] = ...) -> None: ...

class PlaneStatusRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class PlaneSuspect(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class PlaneReconcile(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PlaneMetricsRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class PlaneMetrics(_message.Message):
    __slots__ = ("id", "text")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: bytes
    def __init__(self, id: _Optional[int] = ..., text: _Optional[bytes] = ...) -> None: ...

class PlaneStop(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PlaneAdmitted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PlaneMessage(_message.Message):
    __slots__ = ("hello", "state", "events", "propose", "propose_result", "serving", "status", "status_request", "suspect", "reconcile", "metrics_request", "metrics", "stop", "admitted", "disk")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_RESULT_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REQUEST_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_FIELD_NUMBER: _ClassVar[int]
    METRICS_REQUEST_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    hello: PlaneHello
    state: PlaneState
    events: PlaneEvents
    propose: PlanePropose
    propose_result: PlaneProposeResult
    serving: PlaneServing
    status: PlaneStatus
    status_request: PlaneStatusRequest
    suspect: PlaneSuspect
    reconcile: PlaneReconcile
    metrics_request: PlaneMetricsRequest
    metrics: PlaneMetrics
    stop: PlaneStop
    admitted: PlaneAdmitted
    disk: PlaneDisk
    def __init__(self, hello: _Optional[_Union[PlaneHello, _Mapping]] = ..., state: _Optional[_Union[PlaneState, _Mapping]] = ..., events: _Optional[_Union[PlaneEvents, _Mapping]] = ..., propose: _Optional[_Union[PlanePropose, _Mapping]] = ..., propose_result: _Optional[_Union[PlaneProposeResult, _Mapping]] = ..., serving: _Optional[_Union[PlaneServing, _Mapping]] = ..., status: _Optional[_Union[PlaneStatus, _Mapping]] = ..., status_request: _Optional[_Union[PlaneStatusRequest, _Mapping]] = ..., suspect: _Optional[_Union[PlaneSuspect, _Mapping]] = ..., reconcile: _Optional[_Union[PlaneReconcile, _Mapping]] = ..., metrics_request: _Optional[_Union[PlaneMetricsRequest, _Mapping]] = ..., metrics: _Optional[_Union[PlaneMetrics, _Mapping]] = ..., stop: _Optional[_Union[PlaneStop, _Mapping]] = ..., admitted: _Optional[_Union[PlaneAdmitted, _Mapping]] = ..., disk: _Optional[_Union[PlaneDisk, _Mapping]] = ...) -> None: ...
