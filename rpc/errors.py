"""The mapping between raftwal's ErrorInfo and gRPC statuses, shared by servers and clients,
and the typed errors of the client SDK.

A raftwal error travels as a standard rich gRPC status (``grpc-status-details-bin``: a
``google.rpc.Status`` whose details hold one ``raftwal.v1.ErrorInfo``), so clients in any
language can read the code, the message and the leader/owner hints. The gRPC status code
is chosen so that generic clients also behave sensibly (UNAVAILABLE is retryable,
FAILED_PRECONDITION is not, ...).

``RaftwalError`` has one subclass per ``ErrorCode`` (``ERROR_CLASSES``; ``error_for`` and
``raise_for`` pick it), so that a caller catches what it can handle (``NotFoundError``,
``ResourceAcquiredError``, ...); ``rpc.client`` and ``rpc.streaming_client`` re-export them.
This module must never import a client module (``rpc.client``, ``rpc.coordinator_client``,
``rpc.streaming``, ``rpc.streaming_client``, ``rpc.sync_client``) nor anything of ours but
``rpc.protos``: servers and every client module import it.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from grpc_status import rpc_status

from rpc.protos import errors_pb2

E = errors_pb2

GRPC_CODE_FOR: dict[int, grpc.StatusCode] = {
    E.OK: grpc.StatusCode.OK,
    E.CHANNEL_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    E.CHANNEL_FENCED: grpc.StatusCode.FAILED_PRECONDITION,
    E.ON_SHUTDOWN: grpc.StatusCode.UNAVAILABLE,
    E.INVALID_REQUEST_SEQ: grpc.StatusCode.FAILED_PRECONDITION,
    E.UNMATCHED_CHANNEL_TERM: grpc.StatusCode.FAILED_PRECONDITION,
    E.IGNORED_OPERATION: grpc.StatusCode.FAILED_PRECONDITION,
    E.INNER: grpc.StatusCode.INTERNAL,
    E.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    E.TRANSACTION_EXPIRED: grpc.StatusCode.FAILED_PRECONDITION,
    E.INVALID_TRANSACTION_STATE: grpc.StatusCode.FAILED_PRECONDITION,
    E.UNRECOVERABLE: grpc.StatusCode.INTERNAL,
    E.RESOURCE_ACQUIRED: grpc.StatusCode.ABORTED,
    E.NOT_LEADER: grpc.StatusCode.UNAVAILABLE,
    E.NOT_OWNER: grpc.StatusCode.UNAVAILABLE,
    E.COMPACTED: grpc.StatusCode.OUT_OF_RANGE,
    E.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    E.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    E.UNKNOWN: grpc.StatusCode.UNKNOWN,
    E.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    E.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    E.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


def error_info(
    code: int,
    message: str,
    *,
    leader_hint: str = "",
    current_term: int = 0,
    owner_hint: str = "",
    first_available: int = 0,
) -> errors_pb2.ErrorInfo:
    info = errors_pb2.ErrorInfo(
        message=message,
        leader_hint=leader_hint,
        current_term=current_term,
        owner_hint=owner_hint,
        first_available=first_available,
    )
    info.code = code  # type: ignore[assignment]
    return info


#: An error's message travels twice in the trailers (grpc-message, percent-encoded, and the
#: detail), which gRPC caps at 16 KiB: a longer one (an echoed input can be any size) would
#: replace the whole status with RESOURCE_EXHAUSTED and no detail. Cut at this many bytes.
MAX_ERROR_MESSAGE_BYTES = 1024


def to_status(info: errors_pb2.ErrorInfo) -> grpc.Status:
    """A grpc.Status carrying `info` as its single detail (for ``context.abort_with_status``)."""
    grpc_code = GRPC_CODE_FOR.get(info.code, grpc.StatusCode.UNKNOWN)
    encoded = info.message.encode()
    if len(encoded) > MAX_ERROR_MESSAGE_BYTES:
        shortened = errors_pb2.ErrorInfo()
        shortened.CopyFrom(info)
        shortened.message = (
            encoded[:MAX_ERROR_MESSAGE_BYTES].decode(errors="ignore")
            + f"... (cut; {len(encoded)} bytes)"
        )
        info = shortened
    detail = any_pb2.Any()
    detail.Pack(info)
    message = f"{code_name(info.code)}: {info.message}"
    status = status_pb2.Status(
        code=getattr(code_pb2, grpc_code.name), message=message, details=[detail]
    )
    return rpc_status.to_status(status)


def from_rpc_error(error: grpc.RpcError) -> errors_pb2.ErrorInfo:
    """The ErrorInfo of a failed call; synthesized from the plain status when there is none
    (transport failures, deadlines, servers that are not raftwal)."""
    status = None
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(errors_pb2.ErrorInfo.DESCRIPTOR):
                info = errors_pb2.ErrorInfo()
                detail.Unpack(info)
                return info
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    mapped = {
        grpc.StatusCode.INVALID_ARGUMENT: E.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND: E.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS: E.ALREADY_EXISTS,
        grpc.StatusCode.UNAVAILABLE: E.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED: E.UNAVAILABLE,
        grpc.StatusCode.UNAUTHENTICATED: E.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED: E.PERMISSION_DENIED,
    }.get(code, E.UNKNOWN)
    if mapped == E.UNAVAILABLE:
        return error_info(mapped, transport_cause(code, details or ""))
    return error_info(mapped, f"{code.name if code else 'UNKNOWN'}: {details}")


# What grpc's transport errors say, in a user's words (the first match wins).
_TRANSPORT_CAUSES = (
    ("connection refused", "connection refused (is a node running there?)"),
    ("handshake", "TLS handshake failed"),
    ("ssl", "TLS handshake failed"),
    ("certificate", "TLS handshake failed"),
    ("dns resolution failed", "name resolution failed"),
    ("name resolution", "name resolution failed"),
    ("connection reset", "connection reset"),
    ("socket closed", "connection closed by the peer"),
    ("no route to host", "no route to host"),
    ("timed out", "connection timed out"),
)


def transport_cause(code: grpc.StatusCode | None, details: str) -> str:
    """One phrase for a transport failure without an ErrorInfo: the cause grpc reported
    (connection refused, TLS handshake, deadline...), with grpc's own text after it."""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer before the deadline ({details[:200]})"
    lowered = details.lower()
    for needle, cause in _TRANSPORT_CAUSES:
        if needle in lowered:
            return f"{cause} ({details[:200]})"
    return f"unreachable ({details[:200]})"


def code_name(code: int) -> str:
    """The enum name of `code`, or CODE_<n> for a code this version does not know (a newer
    server may send one)."""
    try:
        return E.ErrorCode.Name(code)
    except ValueError:
        return f"CODE_{code}"


class RaftwalError(Exception):
    """An error answered by raftwal (or a transport failure), with its ErrorInfo."""

    def __init__(self, info: errors_pb2.ErrorInfo) -> None:
        self.info = info
        super().__init__(f"{code_name(info.code)}: {info.message}")

    @property
    def code(self) -> int:
        return self.info.code

    @property
    def code_name(self) -> str:
        return code_name(self.info.code)


# ---------------------------------------------------------------------------------------
# Typed errors
# ---------------------------------------------------------------------------------------


class UnavailableError(RaftwalError):
    """No node could serve the call: retries ran out (attempts or time), or a retryable
    answer (NOT_LEADER, ON_SHUTDOWN, transport failure) when it is raised as such.
    ``last_error`` is the typed error of the last attempt, when there was one."""

    def __init__(self, info: errors_pb2.ErrorInfo, last_error: RaftwalError | None = None) -> None:
        super().__init__(info)
        self.last_error = last_error


class NotLeaderError(UnavailableError):
    """NOT_LEADER: the node is not the Raft leader (``info.leader_hint`` names it)."""


class OnShutdownError(UnavailableError):
    """ON_SHUTDOWN: the node said it is starting, stopping or too far behind."""


class UnreachableError(UnavailableError):
    """UNAVAILABLE: no node answered (nothing listening, connection refused or reset, TLS
    handshake failed, no answer before the deadline); the message names the cause."""


class ClientClosedError(OnShutdownError, RuntimeError):
    """The client (or the StreamingClient it belongs to) was closed: a loop still running on
    it (a watch, a lease keeper, a consumer) ends with this rather than with a bare
    CancelledError. Also a RuntimeError, as using a closed client always was."""


class ChannelNotExistError(RaftwalError):
    """CHANNEL_NOT_EXIST."""


class ChannelFencedError(RaftwalError):
    """CHANNEL_FENCED: ``info.current_term`` is the channel's current term."""


class InvalidRequestSeqError(RaftwalError):
    """INVALID_REQUEST_SEQ."""


class UnmatchedChannelTermError(RaftwalError):
    """UNMATCHED_CHANNEL_TERM: ``info.current_term`` is the channel's current term."""


class IgnoredOperationError(RaftwalError):
    """IGNORED_OPERATION."""


class InnerError(RaftwalError):
    """INNER: the server failed internally (see its log)."""


class InvalidArgumentError(RaftwalError, ValueError):
    """INVALID_ARGUMENT: the request itself is wrong; retrying cannot help."""


class TransactionExpiredError(RaftwalError):
    """TRANSACTION_EXPIRED."""


class InvalidTransactionStateError(RaftwalError):
    """INVALID_TRANSACTION_STATE."""


class UnrecoverableError(RaftwalError):
    """UNRECOVERABLE."""


class ResourceAcquiredError(RaftwalError):
    """RESOURCE_ACQUIRED: a lock or resource key is held by someone else."""


class NotOwnerError(RaftwalError):
    """NOT_OWNER: the node does not own the pchannel (``info.owner_hint`` names the owner).
    Data-plane clients re-route on it; the coordinator API does not retry it."""


class CompactedError(RaftwalError):
    """COMPACTED: the requested revision or LSN is older than the retained history or WAL
    (``info.first_available`` is the first revision or LSN still there)."""


class AlreadyExistsError(RaftwalError):
    """ALREADY_EXISTS."""


class NotFoundError(RaftwalError, LookupError):
    """NOT_FOUND (e.g. a lease that was revoked or expired)."""


class UnknownError(RaftwalError):
    """UNKNOWN: an error without a raftwal code, or an outcome the server could not know."""


class UnauthenticatedError(RaftwalError):
    """UNAUTHENTICATED: no bearer token, or one the cluster does not know (see
    ``rpc.credentials.ClientSecurity``); retrying cannot help."""


class PermissionDeniedError(RaftwalError, PermissionError):
    """PERMISSION_DENIED: the token's role may not call this method (the message names
    the role and the roles that may)."""


class ResourceExhaustedError(RaftwalError):
    """RESOURCE_EXHAUSTED: a budget is full (the message names it and how full it is);
    retrying later, after commits or rollbacks free it, may succeed."""


ERROR_CLASSES: dict[int, type[RaftwalError]] = {
    E.CHANNEL_NOT_EXIST: ChannelNotExistError,
    E.CHANNEL_FENCED: ChannelFencedError,
    E.ON_SHUTDOWN: OnShutdownError,
    E.INVALID_REQUEST_SEQ: InvalidRequestSeqError,
    E.UNMATCHED_CHANNEL_TERM: UnmatchedChannelTermError,
    E.IGNORED_OPERATION: IgnoredOperationError,
    E.INNER: InnerError,
    E.INVALID_ARGUMENT: InvalidArgumentError,
    E.TRANSACTION_EXPIRED: TransactionExpiredError,
    E.INVALID_TRANSACTION_STATE: InvalidTransactionStateError,
    E.UNRECOVERABLE: UnrecoverableError,
    E.RESOURCE_ACQUIRED: ResourceAcquiredError,
    E.NOT_LEADER: NotLeaderError,
    E.NOT_OWNER: NotOwnerError,
    E.COMPACTED: CompactedError,
    E.ALREADY_EXISTS: AlreadyExistsError,
    E.NOT_FOUND: NotFoundError,
    E.UNKNOWN: UnknownError,
    E.UNAUTHENTICATED: UnauthenticatedError,
    E.PERMISSION_DENIED: PermissionDeniedError,
    E.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    E.UNAVAILABLE: UnreachableError,
}


def error_for(info: errors_pb2.ErrorInfo) -> RaftwalError:
    """The typed exception for `info`. A code this SDK does not know (added by a newer
    server) becomes an UnknownError whose message keeps the original number, since
    ``RaftwalError`` can only name known codes."""
    cls = ERROR_CLASSES.get(info.code)
    if cls is None:
        known = errors_pb2.ErrorInfo()
        known.CopyFrom(info)
        known.code = E.UNKNOWN
        known.message = f"{code_name(info.code)}: {info.message}"
        return UnknownError(known)
    return cls(info)


def raise_for(info: errors_pb2.ErrorInfo) -> NoReturn:
    """Raise the typed exception for `info`."""
    raise error_for(info)
