"""The coordinator SDK's public names, where callers import them: ``CoordinatorClient``,
``LeaseKeeper`` and the typed errors (``from rpc.client import CoordinatorClient,
ResourceAcquiredError``).

Nothing is defined here. ``CoordinatorClient`` and ``LeaseKeeper`` live in
``rpc.coordinator_client`` (its docstring states the routing, retry and security rules), the
``RaftwalError`` hierarchy with ``error_for`` / ``raise_for`` / ``code_name`` in
``rpc.errors``, the failure classification and the stream and endpoint helpers shared with
the data plane in ``rpc.routing``; ``Producer``, ``Consumer`` and ``Txn`` (``rpc.streaming``)
stay importable from here too. The synchronous ``Client`` is imported from
``rpc.sync_client``, which imports this module (never the reverse). This module must never
define behaviour of its own, nor be imported by the modules it re-exports.
"""

from __future__ import annotations

from rpc.coordinator_client import CLOSE_GRACE_S as CLOSE_GRACE_S
from rpc.coordinator_client import DEFAULT_ATTEMPT_TIMEOUT_S as DEFAULT_ATTEMPT_TIMEOUT_S
from rpc.coordinator_client import DEFAULT_WATCH_IDLE_TIMEOUT_S as DEFAULT_WATCH_IDLE_TIMEOUT_S
from rpc.coordinator_client import CoordinatorClient, LeaseKeeper
from rpc.errors import ERROR_CLASSES as ERROR_CLASSES
from rpc.errors import (
    AlreadyExistsError,
    ChannelFencedError,
    ChannelNotExistError,
    ClientClosedError,
    CompactedError,
    IgnoredOperationError,
    InnerError,
    InvalidArgumentError,
    InvalidRequestSeqError,
    InvalidTransactionStateError,
    NotFoundError,
    NotLeaderError,
    NotOwnerError,
    OnShutdownError,
    PermissionDeniedError,
    RaftwalError,
    ResourceAcquiredError,
    ResourceExhaustedError,
    TransactionExpiredError,
    UnauthenticatedError,
    UnavailableError,
    UnknownError,
    UnmatchedChannelTermError,
    UnreachableError,
    UnrecoverableError,
    code_name,
    error_for,
    raise_for,
)
from rpc.routing import MAX_CHANNELS as MAX_CHANNELS
from rpc.routing import RETRYABLE_CODES as RETRYABLE_CODES
from rpc.routing import RETRYABLE_TRANSPORT as RETRYABLE_TRANSPORT
from rpc.routing import STREAM_FAILURES as STREAM_FAILURES
from rpc.routing import StreamIdle as StreamIdle
from rpc.routing import cancelled_by_caller as cancelled_by_caller
from rpc.routing import classify, parse_endpoints
from rpc.routing import read_stream as read_stream
from rpc.routing import stream_failure as stream_failure
from rpc.routing import unexpected_loop_error as unexpected_loop_error
from rpc.streaming.consumer import Consumer as Consumer
from rpc.streaming.producer import Producer as Producer
from rpc.streaming.txn import Txn as Txn

# The documented API. The names imported above "as" themselves are importable from here
# too, as they always were, without being part of it.
__all__ = [
    "AlreadyExistsError",
    "ChannelFencedError",
    "ChannelNotExistError",
    "ClientClosedError",
    "CompactedError",
    "CoordinatorClient",
    "IgnoredOperationError",
    "InnerError",
    "InvalidArgumentError",
    "InvalidRequestSeqError",
    "InvalidTransactionStateError",
    "LeaseKeeper",
    "NotFoundError",
    "NotLeaderError",
    "NotOwnerError",
    "OnShutdownError",
    "PermissionDeniedError",
    "RaftwalError",
    "ResourceAcquiredError",
    "ResourceExhaustedError",
    "TransactionExpiredError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnknownError",
    "UnmatchedChannelTermError",
    "UnreachableError",
    "UnrecoverableError",
    "classify",
    "code_name",
    "error_for",
    "parse_endpoints",
    "raise_for",
]
