"""raftwal's asyncio SDK for the data plane (``raftwal.v1.StreamingNode``, ``grpc.aio``).

- ``AssignmentCache``: the client's routing table. It follows ``Coordinator.WatchAssignments``
  (moving to another endpoint when the stream breaks, or stays silent while an owner is
  failing), maps vchannel -> pchannel and pchannel -> owner address, and
  ``owner(pchannel, timeout_s)`` waits until the pchannel is ASSIGNED. A NOT_OWNER /
  CHANNEL_FENCED answer or a broken stream is reported back (``report_failure``): the owner
  that failed is held back for a moment and an ``owner_hint`` is tried first.
- ``Producer``: batches per pchannel even when the caller sends one message at a time
  (``linger_ms``, ``max_batch_messages``, ``max_batch_bytes``), keeps up to
  ``max_in_flight`` batches in flight per pchannel over one Produce stream per owner, and
  stamps every batch with (``producer_id``, ``sequence``). After NOT_OWNER, CHANNEL_FENCED,
  ON_SHUTDOWN, a transport failure or a silent owner, it resends every unacknowledged batch
  of the pchannel, in sequence order and with the same sequences, to the (new) owner: the
  server answers a batch it already holds with its original positions (``duplicate``), so
  nothing is written twice.
- ``Consumer``: an async iterator of committed ``WalEntry`` of one vchannel that resumes
  after the last delivered LSN at the new owner when a stream breaks: no gap, no duplicate.
- ``SubscriptionConsumer``: a ``Consumer`` of one vchannel of a subscription that starts
  where the subscription stands and commits its position as it goes (at least once).
- ``PackConsumer``: time-tick packs (``Pack``) over a subscription's vchannels: every
  message of a time-tick range, complete and in order, committed per pack (``packs``).
- ``Txn``: ``BeginTxn`` / ``AppendTxn`` / ``CommitTxn`` / ``RollbackTxn`` on the owner of the
  vchannel's pchannel, with a keepalive task while open; an async context manager that
  commits on normal exit and rolls back on an exception.
- ``StreamingClient``: what the three share (a ``CoordinatorClient``, the routing table and
  one gRPC channel per node, opened with the coordinator client's ``security``: TLS, client
  certificate, bearer token; see ``rpc.client``); ``list_segments`` reads the committed
  segment manifest. With token auth on, producing takes a producer (or admin) token,
  consuming a consumer, reader (or admin) token: anything else is PERMISSION_DENIED, raised
  at once.

Nothing is defined here: each part lives in its module of ``rpc.streaming`` (``routing``:
``AssignmentCache``, ``Route``, ``Position``, ``list_segments``; ``producer``: ``Producer``,
``ProducerStats``; ``consumer``; ``txn``; ``client``: ``StreamingClient``), which states the
rules it keeps (every retry loop bounded in attempts and in time, no batch resent under a
new sequence or out of sequence order, no entry delivered twice). This module re-exports
them, where callers import them; it must never define behaviour of its own, nor be imported
by the modules it re-exports.
"""

from __future__ import annotations

from rpc.coordinator_client import CoordinatorClient as CoordinatorClient
from rpc.errors import ChannelNotExistError as ChannelNotExistError
from rpc.errors import ClientClosedError as ClientClosedError
from rpc.errors import InnerError as InnerError
from rpc.errors import InvalidArgumentError as InvalidArgumentError
from rpc.errors import InvalidTransactionStateError as InvalidTransactionStateError
from rpc.errors import OnShutdownError as OnShutdownError
from rpc.errors import RaftwalError as RaftwalError
from rpc.errors import TransactionExpiredError as TransactionExpiredError
from rpc.errors import UnavailableError as UnavailableError
from rpc.errors import UnknownError as UnknownError
from rpc.errors import code_name as code_name
from rpc.errors import error_for as error_for
from rpc.routing import MAX_CHANNELS as MAX_CHANNELS
from rpc.routing import STREAM_FAILURES as STREAM_FAILURES
from rpc.routing import classify as classify
from rpc.routing import read_stream as read_stream
from rpc.routing import stream_failure as stream_failure
from rpc.routing import unexpected_loop_error as unexpected_loop_error
from rpc.streaming.client import StreamingClient
from rpc.streaming.consumer import CONSUMER_PROBE_S as CONSUMER_PROBE_S
from rpc.streaming.consumer import CONSUMER_PROBE_TIMEOUT_S as CONSUMER_PROBE_TIMEOUT_S
from rpc.streaming.consumer import MAX_CONSUME_BATCH as MAX_CONSUME_BATCH
from rpc.streaming.consumer import Consumer
from rpc.streaming.packs import Pack, PackConsumer
from rpc.streaming.producer import MAX_BATCH_BYTES as MAX_BATCH_BYTES
from rpc.streaming.producer import MAX_BATCH_MESSAGES as MAX_BATCH_MESSAGES
from rpc.streaming.producer import MAX_LINGER_MS as MAX_LINGER_MS
from rpc.streaming.producer import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from rpc.streaming.producer import MAX_PRODUCER_ID_CHARS as MAX_PRODUCER_ID_CHARS
from rpc.streaming.producer import SERVER_PRODUCER_HISTORY as SERVER_PRODUCER_HISTORY
from rpc.streaming.producer import STREAM_REFUSED_CODES as STREAM_REFUSED_CODES
from rpc.streaming.producer import Producer, ProducerStats
from rpc.streaming.routing import CLOSE_GRACE_S as CLOSE_GRACE_S
from rpc.streaming.routing import DATA_CHANNEL_OPTIONS as DATA_CHANNEL_OPTIONS
from rpc.streaming.routing import DATA_RETRYABLE_CODES as DATA_RETRYABLE_CODES
from rpc.streaming.routing import DEFAULT_ATTEMPT_TIMEOUT_S as DEFAULT_ATTEMPT_TIMEOUT_S
from rpc.streaming.routing import DEFAULT_MAX_ATTEMPTS as DEFAULT_MAX_ATTEMPTS
from rpc.streaming.routing import DEFAULT_RETRY_TIMEOUT_S as DEFAULT_RETRY_TIMEOUT_S
from rpc.streaming.routing import MAX_NOT_EXIST_RETRIES as MAX_NOT_EXIST_RETRIES
from rpc.streaming.routing import RESERVED_PROPERTY_PREFIX as RESERVED_PROPERTY_PREFIX
from rpc.streaming.routing import ROUTE_CHECK_S as ROUTE_CHECK_S
from rpc.streaming.routing import SUSPECT_HOLD_S as SUSPECT_HOLD_S
from rpc.streaming.routing import WATCH_STALE_S as WATCH_STALE_S
from rpc.streaming.routing import AssignmentCache, Position, Route, list_segments
from rpc.streaming.subscription import SubscriptionConsumer, SubscriptionMember
from rpc.streaming.txn import DEFAULT_TXN_KEEPALIVE_MS as DEFAULT_TXN_KEEPALIVE_MS
from rpc.streaming.txn import Txn

# The documented API. The names imported above "as" themselves (the bounds, and the
# coordinator SDK's names this module used to import) are importable from here too, as they
# always were, without being part of it.
__all__ = [
    "AssignmentCache",
    "Consumer",
    "Pack",
    "PackConsumer",
    "Position",
    "Producer",
    "ProducerStats",
    "Route",
    "StreamingClient",
    "SubscriptionConsumer",
    "SubscriptionMember",
    "Txn",
    "list_segments",
]
