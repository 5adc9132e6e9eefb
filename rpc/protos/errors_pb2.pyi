from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[ErrorCode]
    CHANNEL_NOT_EXIST: _ClassVar[ErrorCode]
    CHANNEL_FENCED: _ClassVar[ErrorCode]
    ON_SHUTDOWN: _ClassVar[ErrorCode]
    INVALID_REQUEST_SEQ: _ClassVar[ErrorCode]
    UNMATCHED_CHANNEL_TERM: _ClassVar[ErrorCode]
    IGNORED_OPERATION: _ClassVar[ErrorCode]
    INNER: _ClassVar[ErrorCode]
    INVALID_ARGUMENT: _ClassVar[ErrorCode]
    TRANSACTION_EXPIRED: _ClassVar[ErrorCode]
    INVALID_TRANSACTION_STATE: _ClassVar[ErrorCode]
    UNRECOVERABLE: _ClassVar[ErrorCode]
    RESOURCE_ACQUIRED: _ClassVar[ErrorCode]
    NOT_LEADER: _ClassVar[ErrorCode]
    NOT_OWNER: _ClassVar[ErrorCode]
    COMPACTED: _ClassVar[ErrorCode]
    ALREADY_EXISTS: _ClassVar[ErrorCode]
    NOT_FOUND: _ClassVar[ErrorCode]
    UNKNOWN: _ClassVar[ErrorCode]
    UNAUTHENTICATED: _ClassVar[ErrorCode]
    PERMISSION_DENIED: _ClassVar[ErrorCode]
    RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    UNAVAILABLE: _ClassVar[ErrorCode]
OK: ErrorCode
CHANNEL_NOT_EXIST: ErrorCode
CHANNEL_FENCED: ErrorCode
ON_SHUTDOWN: ErrorCode
INVALID_REQUEST_SEQ: ErrorCode
UNMATCHED_CHANNEL_TERM: ErrorCode
IGNORED_OPERATION: ErrorCode
INNER: ErrorCode
INVALID_ARGUMENT: ErrorCode
TRANSACTION_EXPIRED: ErrorCode
INVALID_TRANSACTION_STATE: ErrorCode
UNRECOVERABLE: ErrorCode
RESOURCE_ACQUIRED: ErrorCode
NOT_LEADER: ErrorCode
NOT_OWNER: ErrorCode
COMPACTED: ErrorCode
ALREADY_EXISTS: ErrorCode
NOT_FOUND: ErrorCode
UNKNOWN: ErrorCode
UNAUTHENTICATED: ErrorCode
PERMISSION_DENIED: ErrorCode
RESOURCE_EXHAUSTED: ErrorCode
UNAVAILABLE: ErrorCode

class ErrorInfo(_message.Message):
    __slots__ = ("code", "message", "leader_hint", "current_term", "owner_hint", "first_available", "disk")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_HINT_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TERM_FIELD_NUMBER: _ClassVar[int]
    OWNER_HINT_FIELD_NUMBER: _ClassVar[int]
    FIRST_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    leader_hint: str
    current_term: int
    owner_hint: str
    first_available: int
    disk: DiskSpace
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., leader_hint: _Optional[str] = ..., current_term: _Optional[int] = ..., owner_hint: _Optional[str] = ..., first_available: _Optional[int] = ..., disk: _Optional[_Union[DiskSpace, _Mapping]] = ...) -> None: ...

class DiskSpace(_message.Message):
    __slots__ = ("node_id", "dir", "free_bytes", "total_bytes", "mark", "mark_free_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    MARK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    dir: str
    free_bytes: int
    total_bytes: int
    mark: str
    mark_free_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., dir: _Optional[str] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., mark: _Optional[str] = ..., mark_free_bytes: _Optional[int] = ...) -> None: ...
