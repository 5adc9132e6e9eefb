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
- ``Txn``: ``BeginTxn`` / ``AppendTxn`` / ``CommitTxn`` / ``RollbackTxn`` on the owner of the
  vchannel's pchannel, with a keepalive task while open; an async context manager that
  commits on normal exit and rolls back on an exception.
- ``StreamingClient``: what the three share (a ``CoordinatorClient``, the routing table and
  one gRPC channel per node, opened with the coordinator client's ``security``: TLS, client
  certificate, bearer token; see ``rpc.client``); ``list_segments`` reads the committed
  segment manifest. With token auth on, producing takes a producer (or admin) token,
  consuming a consumer, reader (or admin) token: anything else is PERMISSION_DENIED, raised
  at once.

Every retry loop here is bounded in attempts and in time, and only errors that another
attempt can fix are retried. This module must never resend a batch under a new sequence,
send a pchannel's batches out of sequence order after a failure, or deliver an entry twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NamedTuple

import grpc

from rpc.aio import wait_event
from rpc.credentials import ClientSecurity
from rpc.errors import error_info, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire

log = logging.getLogger(__name__)
E = errors_pb2

__all__ = [
    "AssignmentCache",
    "Consumer",
    "Position",
    "Producer",
    "ProducerStats",
    "Route",
    "StreamingClient",
    "Txn",
    "list_segments",
]

# The server remembers the last 8 batches of each producer per pchannel
# (wal_segments.owner.PRODUCER_HISTORY). A resent batch must still be in that window to be
# recognised as a duplicate, so no more batches than that may be unacknowledged at once.
SERVER_PRODUCER_HISTORY = 8
# Server limits (raftwal/streaming.py): messages per Produce batch, Consume batch entries.
MAX_BATCH_MESSAGES = 10_000
MAX_CONSUME_BATCH = 10_000
# Upper bound of the max_batch_bytes option: well under a node's gRPC message limit
# (grpc_max_message_bytes, 32 MiB by default); a larger request would break the whole
# Produce stream it travels on, not just fail its batch.
MAX_BATCH_BYTES = 16 << 20
# One message larger than this is refused by submit() for the same reason (the server
# itself refuses payloads over 8 MiB and keys over 1 MiB).
MAX_MESSAGE_BYTES = 10 << 20
MAX_LINGER_MS = 60_000
MAX_PRODUCER_ID_CHARS = 128
# Property keys with this prefix are written by the WAL itself (producer id and sequence).
RESERVED_PROPERTY_PREFIX = "rw."
# A node whose applied state lags the coordinator's answers CHANNEL_NOT_EXIST for a vchannel
# created a moment ago: such an answer is retried this many times, then raised.
MAX_NOT_EXIST_RETRIES = 5
# After an owner failed, the cache waits this long for a newer assignment before offering
# the same owner again (the failure may have been transient: a stream reset, a node that
# was still finishing its recovery).
SUSPECT_HOLD_S = 0.3
# While a consumer's stream is quiet or a producer's batch unanswered, check this often
# whether the pchannel moved (an owner stopped with SIGSTOP never closes its streams).
ROUTE_CHECK_S = 1.0
# While an owner failure is pending, an assignment watch silent this long is moved to another
# endpoint (its node may be stopped). About the coordinator's node timeout (3 s).
WATCH_STALE_S = 3.0
# A consumer whose stream has been quiet this long asks the owner for its position (bounded
# by CONSUMER_PROBE_TIMEOUT_S) to find out whether the owner is still there.
CONSUMER_PROBE_S = 5.0
CONSUMER_PROBE_TIMEOUT_S = 2.0
DEFAULT_ATTEMPT_TIMEOUT_S = 10.0
DEFAULT_RETRY_TIMEOUT_S = 30.0
DEFAULT_MAX_ATTEMPTS = 60
DEFAULT_TXN_KEEPALIVE_MS = 10_000
CLOSE_GRACE_S = 1.0

# Data-plane answers that another attempt (at the new owner, with the same sequence) can
# turn into success. UNKNOWN means "outcome unknown": safe to repeat with the same sequence.
DATA_RETRYABLE_CODES = frozenset(
    {E.NOT_OWNER, E.CHANNEL_FENCED, E.ON_SHUTDOWN, E.NOT_LEADER, E.UNKNOWN}
)
# A Produce stream ended with these was refused before the node read any request: nothing
# of it was written, and another attempt with the same credentials is refused the same way.
STREAM_REFUSED_CODES = frozenset({E.UNAUTHENTICATED, E.PERMISSION_DENIED})


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------


class Position(NamedTuple):
    """Where one message landed: its pchannel, LSN and time tick."""

    pchannel: str
    lsn: int
    time_tick: int


@dataclass(frozen=True)
class Route:
    """One pchannel's assignment as the client knows it."""

    pchannel: str
    term: int
    owner_address: str
    owner_node_id: str = ""
    state: int = pb.PCHANNEL_STATE_UNSPECIFIED
    vchannels: tuple[str, ...] = ()
    from_hint: bool = False

    @property
    def assigned(self) -> bool:
        return self.state == pb.PCHANNEL_STATE_ASSIGNED and bool(self.owner_address)


@dataclass
class ProducerStats:
    """Counters of one producer (monotonic; read them, never write them)."""

    #: Produce requests written, retries included
    batches_sent: int = 0
    #: batches acknowledged with positions (each batch once)
    batches_acknowledged: int = 0
    #: of those, batches the server answered from its producer table (a retry of a batch
    #: it already held)
    duplicates: int = 0
    messages_acknowledged: int = 0
    messages_failed: int = 0
    #: batches sent again after a failure (same sequence)
    retries: int = 0
    #: times a pchannel's pipeline was re-established after a failure
    recoveries: int = 0


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(error_info(E.INVALID_ARGUMENT, message))


def _check_range(field_name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise _invalid(f"invalid {field_name} ({value}; expected {low:g}..{high:g})")


def _retrieve(future: asyncio.Future[Any]) -> None:
    # Callers may drop a future they got from submit(); its error is theirs to see, not a
    # "Future exception was never retrieved" warning at exit.
    if not future.cancelled():
        future.exception()


def _classify_data(error: grpc.RpcError) -> tuple[errors_pb2.ErrorInfo, bool]:
    """(ErrorInfo, retryable) of a failed data-plane call: like ``classify`` for the
    coordinator, with the routing answers (NOT_OWNER, CHANNEL_FENCED) retryable too."""
    info, retryable = classify(error)
    if retryable:
        return info, True
    if info.code in DATA_RETRYABLE_CODES and _has_error_info(error):
        return info, True
    return info, False


def _message(
    vchannel: str,
    payload: bytes | str,
    key: bytes | str,
    msg_type: str,
    properties: Mapping[str, str] | None,
) -> wire.Message:
    """A wire Message, refusing at once what the server would refuse for the whole batch
    it travels in (so that one bad message cannot fail its neighbours' sends)."""
    for name, value in (properties or {}).items():
        if "\x00" in name or "\x00" in value or name.startswith(RESERVED_PROPERTY_PREFIX):
            raise _invalid(
                f"invalid property {name[:64]!r} (expected no NUL and no "
                f"{RESERVED_PROPERTY_PREFIX!r} prefix)"
            )
    return wire.Message(
        vchannel=vchannel,
        msg_type=msg_type,
        key=key.encode() if isinstance(key, str) else key,
        payload=payload.encode() if isinstance(payload, str) else payload,
        properties=dict(properties or {}),
    )


def _elapsed_text(started: float) -> str:
    return f"{time.monotonic() - started:.1f} s"


def _unavailable(message: str, info: errors_pb2.ErrorInfo | None) -> UnavailableError:
    last = error_for(info) if info is not None else None
    code = info.code if info is not None else E.ON_SHUTDOWN
    detail = f"; last error: {code_name(info.code)}: {info.message}" if info is not None else ""
    return UnavailableError(error_info(code, message + detail), last)


# ---------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------


@dataclass
class _Suspect:
    address: str
    term: int
    until: float


class AssignmentCache:
    """The latest ``AssignmentDiscovery`` of the cluster, kept by a background watch.

    Use it from one event loop. The watch runs its own ``WatchAssignments`` stream (any
    node answers from its applied state): on a failure it moves to the next endpoint after
    a jittered backoff and never applies a version older than the one it has; after the
    coordinator client's ``max_attempts`` / ``timeout_s`` without a message it stops, and
    the next lookup restarts it (at most once per backoff delay). A node stopped with
    SIGSTOP never ends its streams, so while an owner failure is reported and the watch has
    been silent for ``WATCH_STALE_S`` the watch moves to the next endpoint too.
    """

    def __init__(
        self,
        coordinator: CoordinatorClient,
        channel_for: Callable[[str], grpc.aio.Channel] | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._channel_for = channel_for
        self._endpoints = list(coordinator.endpoints)
        self._target_index = 0
        self._routes: dict[str, Route] = {}
        self._vchannels: dict[str, str] = {}
        # vchannel -> pchannel learnt from ListChannels (the watch may lag behind it).
        self._looked_up: dict[str, str] = {}
        self._lookups: dict[str, asyncio.Task[str | None]] = {}
        self._hints: dict[str, tuple[str, int]] = {}
        self._suspects: dict[str, _Suspect] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: RaftwalError | None = None
        self._restart_after = 0.0
        self._restart_backoff = _Backoff(coordinator.backoff_initial_s, coordinator.backoff_max_s)
        # When the current watch stream last proved alive (a message, or its start).
        self._last_heard = 0.0
        self._closed = False
        self.version = -1
        #: WatchAssignments streams opened (the first one included)
        self.watch_streams = 0

    # -- the watch ------------------------------------------------------------------

    def _ensure_watching(self) -> None:
        if self._closed:
            raise ClientClosedError(error_info(E.ON_SHUTDOWN, "the StreamingClient is closed"))
        if self._task is not None and not self._task.done():
            return
        now = time.monotonic()
        if self._task is not None and now < self._restart_after:
            return
        self._last_heard = now
        self._task = asyncio.create_task(self._watch(), name="raftwal-assignments")

    def _move_watch(self) -> None:
        """Abandon the current watch stream for the next endpoint."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self._target_index += 1
        self._ensure_watching()

    def refresh_if_stale(self, pchannel: str) -> bool:
        """A caller has waited on `pchannel`'s owner for a while: when the watch has been
        silent for WATCH_STALE_S (its node may be stopped: such a stream never ends), move
        it to the next endpoint, which answers with the current assignment at once. True
        when it moved."""
        silent_s = time.monotonic() - self._last_heard
        if silent_s <= WATCH_STALE_S or len(self._endpoints) < 2 or self._closed:
            return False
        log.info(
            "assignment watch silent for %.1f s while %s has no answering owner; moving it "
            "to the next endpoint",
            silent_s,
            pchannel,
        )
        self._move_watch()
        return True

    def _stub(self, target: str) -> coordinator_pb2_grpc.CoordinatorStub:
        if self._channel_for is not None:
            return coordinator_pb2_grpc.CoordinatorStub(self._channel_for(target))
        return self._coordinator._stub(target)

    async def _watch(self) -> None:
        coordinator = self._coordinator
        backoff = _Backoff(coordinator.backoff_initial_s, coordinator.backoff_max_s)
        failures = 0
        outage_started: float | None = None
        try:
            while True:
                target = self._endpoints[self._target_index % len(self._endpoints)]
                call = self._stub(target).WatchAssignments(api.WatchAssignmentsRequest())
                self.watch_streams += 1
                info = error_info(E.ON_SHUTDOWN, f"{target} ended the WatchAssignments stream")
                try:
                    async for discovery in read_stream(call, coordinator.watch_idle_timeout_s):
                        self._last_heard = time.monotonic()
                        failures, outage_started = 0, None
                        backoff.reset()
                        self._restart_backoff.reset()
                        self._error = None
                        if discovery.version > self.version:
                            self._apply(discovery)
                except STREAM_FAILURES as error:
                    info, retryable = await stream_failure(error, call, target, "WatchAssignments")
                    if not retryable:
                        self._error = error_for(info)
                        log.warning("WatchAssignments at %s refused: %s", target, self._error)
                        return
                finally:
                    call.cancel()
                now = time.monotonic()
                if outage_started is None:
                    outage_started = now
                failures += 1
                self._target_index += 1
                elapsed = now - outage_started
                log.debug("WatchAssignments at %s failed: %s", target, info.message)
                if failures >= coordinator.max_attempts or elapsed >= coordinator.timeout_s:
                    self._error = _unavailable(
                        f"WatchAssignments gave up after {failures} failure(s) in {elapsed:.1f} s",
                        info,
                    )
                    log.warning("%s", self._error)
                    self._restart_after = now + self._restart_backoff.next_delay(1.0)
                    return
                await asyncio.sleep(backoff.next_delay(coordinator.timeout_s - elapsed))
        except ClientClosedError as error:
            # The client was closed under the watch.
            self._error = error
        except Exception as error:  # noqa: BLE001 (reported: owner() raises it, and the log)
            # No rule covers it: report it to the callers waiting on a route, and let the
            # next lookup start a new watch after a backoff rather than fail for good.
            self._error = unexpected_loop_error("the assignment watch", error)
            self._restart_after = time.monotonic() + self._restart_backoff.next_delay(1.0)
        finally:
            self._notify()

    def _apply(self, discovery: api.AssignmentDiscovery) -> None:
        routes: dict[str, Route] = {}
        vchannels: dict[str, str] = {}
        for channel in discovery.channels:
            routes[channel.pchannel] = Route(
                pchannel=channel.pchannel,
                term=channel.term,
                owner_address=channel.owner_address,
                owner_node_id=channel.owner_node_id,
                state=channel.state,
                vchannels=tuple(channel.vchannels),
            )
            for name in channel.vchannels:
                vchannels[name] = channel.pchannel
        self._routes = routes
        self._vchannels = vchannels
        self.version = discovery.version
        for pchannel, (_, term) in list(self._hints.items()):
            route = routes.get(pchannel)
            if route is not None and route.term > term:
                del self._hints[pchannel]
        log.debug("assignments at version %d: %d pchannels", discovery.version, len(routes))
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _wait(self, event: asyncio.Event, timeout_s: float) -> None:
        await wait_event(event, timeout_s)

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._task, *self._lookups.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, RaftwalError, RuntimeError):
                await task
        self._notify()

    # -- lookups --------------------------------------------------------------------

    def route(self, pchannel: str) -> Route | None:
        """The assignment of `pchannel` as last seen (None when unknown)."""
        return self._routes.get(pchannel)

    def routes(self) -> dict[str, Route]:
        return dict(self._routes)

    def cached_pchannel(self, vchannel: str) -> str | None:
        return self._vchannels.get(vchannel) or self._looked_up.get(vchannel)

    async def pchannel_of(self, vchannel: str) -> str:
        """The pchannel `vchannel` lives on. Unknown to the watch: asked once (linearizably)
        of the coordinator; raises ChannelNotExistError when it has no such vchannel."""
        known = self.cached_pchannel(vchannel)
        if known:
            return known
        self._ensure_watching()
        task = self._lookups.get(vchannel)
        if task is None:
            task = asyncio.create_task(self._look_up(vchannel))
            self._lookups[vchannel] = task
            task.add_done_callback(lambda _: self._lookups.pop(vchannel, None))
        pchannel = await asyncio.shield(task)
        if pchannel is None:
            raise ChannelNotExistError(
                error_info(E.CHANNEL_NOT_EXIST, f"vchannel {vchannel!r} does not exist")
            )
        return pchannel

    async def _look_up(self, vchannel: str) -> str | None:
        response = await self._coordinator.list_channels(linearizable=True)
        for item in response.vchannels:
            if item.state == pb.VCHANNEL_STATE_NORMAL:
                self._looked_up[item.name] = item.pchannel
        return self._looked_up.get(vchannel)

    def report_failure(
        self, pchannel: str, address: str, term: int, info: errors_pb2.ErrorInfo | None = None
    ) -> None:
        """`address` (believed owner at `term`) failed for `pchannel`: hold it back for a
        moment and remember an owner hint, if the answer carried one."""
        if address:
            self._suspects[pchannel] = _Suspect(address, term, time.monotonic() + SUSPECT_HOLD_S)
        hint = info.owner_hint if info is not None else ""
        if hint and hint != address and info is not None and info.current_term >= term:
            self._hints[pchannel] = (hint, info.current_term)
        elif self._hints.get(pchannel, ("", 0))[0] == address:
            del self._hints[pchannel]

    def _candidate(self, pchannel: str) -> tuple[Route | None, float]:
        """(route to try now, or None; seconds until a held-back owner may be offered)."""
        now = time.monotonic()
        suspect = self._suspects.get(pchannel)
        if suspect is not None and suspect.until <= now:
            del self._suspects[pchannel]
            suspect = None

        def allowed(address: str, term: int) -> bool:
            return suspect is None or suspect.address != address or term > suspect.term

        route = self._routes.get(pchannel)
        hint = self._hints.get(pchannel)
        if hint is not None and allowed(*hint) and (route is None or hint[1] >= route.term):
            return (
                Route(
                    pchannel,
                    hint[1],
                    hint[0],
                    state=pb.PCHANNEL_STATE_ASSIGNED,
                    from_hint=True,
                ),
                0.0,
            )
        if route is not None and route.assigned and allowed(route.owner_address, route.term):
            return route, 0.0
        return None, (suspect.until - now) if suspect is not None else float("inf")

    async def owner(self, pchannel: str, timeout_s: float) -> Route:
        """The route to `pchannel`'s serving owner: waits up to `timeout_s` until it is
        ASSIGNED (and, after a reported failure, until a newer assignment or the hold
        passes). Raises UnavailableError on timeout."""
        deadline = time.monotonic() + timeout_s
        confirmed = False
        while True:
            self._ensure_watching()
            event = self._changed
            route, hold_s = self._candidate(pchannel)
            if route is not None:
                return route
            if pchannel in self._suspects and self.refresh_if_stale(pchannel):
                event = self._changed
            if not confirmed and self.version >= 0 and pchannel not in self._routes:
                # Unknown to a live watch: a dropped or misspelt pchannel fails at once.
                confirmed = True
                response = await self._coordinator.list_channels(linearizable=True)
                if pchannel not in {p.name for p in response.pchannels}:
                    raise ChannelNotExistError(
                        error_info(E.CHANNEL_NOT_EXIST, f"pchannel {pchannel!r} does not exist")
                    )
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                current = self._routes.get(pchannel)
                state = (
                    f"{pb.PChannelState.Name(current.state)} at term {current.term} on "
                    f"{current.owner_address or '-'}"
                    if current is not None
                    else "unknown"
                )
                last = self._error.info if self._error is not None else None
                raise _unavailable(
                    f"pchannel {pchannel} has no serving owner after {timeout_s:.1f} s "
                    f"(assignment {state}, version {self.version})",
                    last,
                )
            await self._wait(event, min(remaining, hold_s, WATCH_STALE_S))


# ---------------------------------------------------------------------------------------
# The shared client
# ---------------------------------------------------------------------------------------


#: Defaults for the channels to nodes' data plane (a caller's own options win).
DATA_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 32 << 20),
)


class StreamingClient:
    """A ``CoordinatorClient``, the routing table and one channel per node, shared by the
    producers, consumers and transactions made from it. ``close()`` it when done; it closes
    the ``CoordinatorClient`` only when it created it (from endpoints)."""

    def __init__(
        self,
        client_or_endpoints: CoordinatorClient | str | Sequence[str],
        *,
        timeout_s: float = 10.0,
        channel_options: Sequence[tuple[str, Any]] = (),
        security: ClientSecurity | None = None,
    ) -> None:
        if isinstance(client_or_endpoints, CoordinatorClient):
            if security is not None:
                raise TypeError(
                    "security given with a CoordinatorClient (expected it on that client: "
                    "its security is used for every channel)"
                )
            self.coordinator = client_or_endpoints
            self._owns_coordinator = False
        else:
            self.coordinator = CoordinatorClient(
                client_or_endpoints,
                timeout_s=timeout_s,
                channel_options=channel_options,
                security=security,
            )
            self._owns_coordinator = True
        # A node answers with up to 32 MiB (a whole transaction of up to 16 MiB is one
        # Consume response, a message up to 8 MiB): grpc's 4 MiB default would refuse them.
        given = {name for name, _ in channel_options}
        self._channel_options = [
            *channel_options,
            *((name, value) for name, value in DATA_CHANNEL_OPTIONS if name not in given),
        ]
        self.router = AssignmentCache(self.coordinator, self._channel)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, streaming_pb2_grpc.StreamingNodeStub] = {}
        self._closed = False

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _channel(self, address: str) -> grpc.aio.Channel:
        """The channel to `address` (opened lazily, at most MAX_CHANNELS of them)."""
        if self._closed:
            raise ClientClosedError(error_info(E.ON_SHUTDOWN, "the StreamingClient is closed"))
        channel = self._channels.get(address)
        if channel is None:
            if len(self._channels) >= MAX_CHANNELS:
                raise UnavailableError(
                    error_info(
                        E.ON_SHUTDOWN,
                        f"too many node addresses ({len(self._channels)}; expected <= "
                        f"{MAX_CHANNELS}); not opening a channel to {address}",
                    )
                )
            channel = self.coordinator.security.aio_channel(address, self._channel_options)
            self._channels[address] = channel
        return channel

    def stub(self, address: str) -> streaming_pb2_grpc.StreamingNodeStub:
        """The StreamingNode stub of `address`."""
        stub = self._stubs.get(address)
        if stub is None:
            stub = streaming_pb2_grpc.StreamingNodeStub(self._channel(address))
            self._stubs[address] = stub
        return stub

    def producer(self, **options: Any) -> Producer:
        return Producer(self, **options)

    def consumer(self, vchannel: str, **options: Any) -> Consumer:
        return Consumer(self, vchannel, **options)

    def txn(self, vchannel: str, **options: Any) -> Txn:
        """``async with client.txn("v") as txn: await txn.append(b"a", b"b")``."""
        return Txn(self, vchannel, **options)

    async def list_segments(
        self, pchannels: Sequence[str] = (), as_of_revision: int = 0
    ) -> api.ListSegmentsResponse:
        return await list_segments(self.coordinator, pchannels, as_of_revision)

    async def close(self) -> None:
        """Stop the watch and close every node channel (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self.router.close()
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close(grace=CLOSE_GRACE_S)
        if self._owns_coordinator:
            await self.coordinator.close()


def _resolve(client_or_endpoints: Any) -> tuple[StreamingClient, bool]:
    """(shared client, owned): a StreamingClient is shared; anything else gets a private
    one that the caller must close."""
    if isinstance(client_or_endpoints, StreamingClient):
        return client_or_endpoints, False
    return StreamingClient(client_or_endpoints), True


async def list_segments(
    client: CoordinatorClient | StreamingClient,
    pchannels: Sequence[str] = (),
    as_of_revision: int = 0,
) -> api.ListSegmentsResponse:
    """``Coordinator.ListSegments``: the committed segments of `pchannels` (all when empty),
    as of `as_of_revision` (0 = now, linearizable), with the CoordinatorClient's leader
    following and bounded retries. A read: repeating it is harmless."""
    if as_of_revision < 0:
        raise _invalid(f"invalid as_of_revision ({as_of_revision}; expected >= 0)")
    coordinator = client.coordinator if isinstance(client, StreamingClient) else client
    request = api.ListSegmentsRequest(pchannels=list(pchannels), as_of_revision=as_of_revision)
    response: api.ListSegmentsResponse = await coordinator._unary("ListSegments", request)
    return response


# ---------------------------------------------------------------------------------------
# Producer
# ---------------------------------------------------------------------------------------


class _StreamBroken(Exception):
    """A Produce stream ended before answering: the batch's outcome is unknown."""

    def __init__(self, info: errors_pb2.ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


class _ProduceStream:
    """One Produce bidi stream to one owner, shared by every pchannel it owns. Requests are
    written in submission order by one writer task; results are matched by request id.
    When the stream breaks, every unanswered request fails with ``_StreamBroken``."""

    def __init__(self, stub: streaming_pb2_grpc.StreamingNodeStub, address: str) -> None:
        self.address = address
        self.failure: errors_pb2.ErrorInfo | None = None
        self._call = stub.Produce()
        # Bounded by construction: each pchannel has at most max_in_flight batches
        # unanswered, so this holds at most max_in_flight x pchannels requests.
        self._outbox: asyncio.Queue[wire.ProduceRequest] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[wire.ProduceResult]] = {}
        self._request_ids = itertools.count(1)
        self._tasks = [
            asyncio.create_task(self._write_loop(), name=f"produce-writer:{address}"),
            asyncio.create_task(self._read_loop(), name=f"produce-reader:{address}"),
        ]

    def submit(self, template: wire.ProduceRequest) -> asyncio.Future[wire.ProduceResult]:
        future: asyncio.Future[wire.ProduceResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        if self.failure is not None:
            future.set_exception(_StreamBroken(self.failure))
            return future
        # A copy per attempt: an abandoned attempt may still sit in another stream's outbox.
        request = wire.ProduceRequest()
        request.CopyFrom(template)
        request.request_id = next(self._request_ids)
        self._waiting[request.request_id] = future
        self._outbox.put_nowait(request)
        return future

    def _locally_cancelled(self) -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _write_loop(self) -> None:
        try:
            while True:
                request = await self._outbox.get()
                await self._call.write(request)
        except grpc.aio.AioRpcError as error:
            self._break(_classify_data(error)[0])
        except asyncio.InvalidStateError:
            self._break(error_info(E.ON_SHUTDOWN, f"{self.address} closed the Produce stream"))
        except asyncio.CancelledError:
            if self._locally_cancelled():
                raise
            self._break(error_info(E.ON_SHUTDOWN, f"Produce stream to {self.address} cancelled"))
        except Exception as error:  # noqa: BLE001 (reported: every waiting batch fails with it)
            self._break(self._unexpected("writer", error))

    async def _read_loop(self) -> None:
        info = error_info(E.ON_SHUTDOWN, f"{self.address} ended the Produce stream")
        try:
            while True:
                result = await self._call.read()
                if result is grpc.aio.EOF:
                    break
                future = self._waiting.pop(result.request_id, None)
                if future is not None and not future.done():
                    future.set_result(result)
        except grpc.aio.AioRpcError as error:
            info = _classify_data(error)[0]
        except asyncio.CancelledError:
            if self._locally_cancelled():
                raise
        except Exception as error:  # noqa: BLE001 (reported: every waiting batch fails with it)
            info = self._unexpected("reader", error)
        self._break(info)

    def _unexpected(self, loop: str, error: BaseException) -> errors_pb2.ErrorInfo:
        # Outcome unknown, like any broken stream: the batches are resent with their
        # sequences (the server answers those it holds as duplicates).
        typed = unexpected_loop_error(f"the Produce stream {loop} to {self.address}", error)
        return error_info(E.ON_SHUTDOWN, typed.info.message)

    def _break(self, info: errors_pb2.ErrorInfo) -> None:
        if self.failure is not None:
            return
        log.debug("Produce stream to %s broke: %s", self.address, info.message)
        self.failure = info
        self._call.cancel()
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(_StreamBroken(info))
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        self._break(error_info(E.ON_SHUTDOWN, "producer closed"))
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass(eq=False)
class _Pending:
    message: wire.Message
    size: int
    future: asyncio.Future[Position]
    enqueued: float
    deadline: float


@dataclass(eq=False)
class _Batch:
    sequence: int
    items: list[_Pending]
    request: wire.ProduceRequest
    size: int
    deadline: float
    attempts: int = 0
    not_exist_retries: int = 0
    sent_at: float = 0.0
    address: str = ""
    term: int = 0
    attempt: asyncio.Future[wire.ProduceResult] | None = None


def _initial_sequence() -> int:
    # Wall-clock microseconds: a new Producer that reuses a producer_id starts above the
    # sequences an earlier one used (the server refuses an old sequence it no longer
    # remembers) as long as fewer than a million batches per second were sent.
    return time.time_ns() // 1000


@dataclass(eq=False)
class _Lane:
    """One pchannel's pipeline: pending messages, unacknowledged batches in sequence order,
    and the worker task that moves them."""

    pchannel: str
    next_sequence: int
    backoff: _Backoff
    pending: deque[_Pending] = field(default_factory=deque)
    pending_bytes: int = 0
    inflight: list[_Batch] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stream: _ProduceStream | None = None
    route: Route | None = None
    failure: errors_pb2.ErrorInfo | None = None
    failed_at: tuple[str, int] = ("", 0)
    task: asyncio.Task[None] | None = None


class Producer:
    """Idempotent, batching producer (see the module docstring).

    ``send`` waits for the message's position; ``submit`` only waits for room in the
    bounded queue (``max_pending_messages`` / ``max_pending_bytes`` unacknowledged) and
    returns a future, so a loop of ``submit`` calls (or many concurrent ``send`` calls)
    fills batches. On one pchannel, positions follow submission order.

    Failures: a send fails with a typed error when the server refuses its batch for a reason
    retrying cannot fix (INVALID_ARGUMENT, ...). What the client can check (reserved or NUL
    properties, size) is refused by ``submit`` itself; anything else the server refuses
    (an unknown ``msg_type``, ...) fails the whole batch the message travelled in: use
    ``max_batch_messages=1`` where one message must never affect another. A send fails with
    UnavailableError when its batch could not be acknowledged within ``retry_timeout_s`` of
    the send or ``max_attempts`` attempts: its outcome is then unknown, and the later
    unacknowledged batches of that pchannel fail too, so that nothing is written out of
    order behind it. The server keeps gaps in a producer's sequences legal, so ordering
    after a failure relies on it failing a pchannel's batches from the first failed one on
    (as NOT_OWNER, CHANNEL_FENCED and shutdowns do); a retried batch the server no longer
    recognises fails with InvalidRequestSeqError rather than being written out of order.

    A ``producer_id`` may be reused by a later Producer: sequences start at the wall clock
    in microseconds, above those an earlier one used.
    """

    def __init__(
        self,
        client_or_endpoints: StreamingClient | CoordinatorClient | str | Sequence[str],
        *,
        producer_id: str | None = None,
        linger_ms: float = 2,
        max_batch_messages: int = 500,
        max_batch_bytes: int = 1 << 20,
        max_in_flight: int = 8,
        retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        max_pending_messages: int = 100_000,
        max_pending_bytes: int = 64 << 20,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
    ) -> None:
        producer_id = producer_id if producer_id is not None else uuid.uuid4().hex
        if not 1 <= len(producer_id) <= MAX_PRODUCER_ID_CHARS:
            raise _invalid(
                f"invalid producer_id ({producer_id[:32]!r}; expected 1..{MAX_PRODUCER_ID_CHARS} "
                "chars)"
            )
        _check_range("linger_ms", linger_ms, 0, MAX_LINGER_MS)
        _check_range("max_batch_messages", max_batch_messages, 1, MAX_BATCH_MESSAGES)
        _check_range("max_batch_bytes", max_batch_bytes, 1, MAX_BATCH_BYTES)
        _check_range("max_in_flight", max_in_flight, 1, SERVER_PRODUCER_HISTORY)
        _check_range("retry_timeout_s", retry_timeout_s, 0.001, 3600)
        _check_range("max_attempts", max_attempts, 1, 1000)
        _check_range("attempt_timeout_s", attempt_timeout_s, 0.001, 3600)
        _check_range("max_pending_messages", max_pending_messages, 1, 10_000_000)
        _check_range("max_pending_bytes", max_pending_bytes, 1, 1 << 34)
        _check_range("backoff_initial_s", backoff_initial_s, 0.001, 60)
        _check_range("backoff_max_s", backoff_max_s, backoff_initial_s, 60)
        self.producer_id = producer_id
        self.linger_s = linger_ms / 1000
        self.max_batch_messages = int(max_batch_messages)
        self.max_batch_bytes = int(max_batch_bytes)
        self.max_in_flight = int(max_in_flight)
        self.retry_timeout_s = retry_timeout_s
        self.max_attempts = int(max_attempts)
        self.attempt_timeout_s = attempt_timeout_s
        self.max_pending_messages = int(max_pending_messages)
        self.max_pending_bytes = int(max_pending_bytes)
        self._backoff_s = (backoff_initial_s, backoff_max_s)
        self.stats = ProducerStats()
        self._client, self._owns_client = _resolve(client_or_endpoints)
        self._lanes: dict[str, _Lane] = {}
        self._streams: dict[str, _ProduceStream] = {}
        self._unacked_messages = 0
        self._unacked_bytes = 0
        self._room = asyncio.Event()
        self._flushing = 0
        self._closing = False
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def flush(self) -> None:
        """Send what is queued without lingering and wait until every message submitted so
        far is acknowledged or failed (bounded by ``retry_timeout_s``). It does not raise
        for failed messages: their futures (``send``) do."""
        futures = [
            item.future
            for lane in self._lanes.values()
            for item in itertools.chain(lane.pending, (i for b in lane.inflight for i in b.items))
            if not item.future.done()
        ]
        if not futures:
            return
        self._flushing += 1
        self._wake_all()
        try:
            await asyncio.wait(futures)
        finally:
            self._flushing -= 1

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop (idempotent). After `timeout_s` (default: as long as retries
        may take) what is still unacknowledged fails with OnShutdownError."""
        if self._closed:
            return
        self._closing = True
        self._wake_all()
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        if tasks:
            done, running = await asyncio.wait(tasks, timeout=timeout_s)
            for task in running:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._closed = True
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            await stream.close()
        if self._owns_client:
            await self._client.close()

    def _wake_all(self) -> None:
        for lane in self._lanes.values():
            lane.wake.set()

    # -- sending --------------------------------------------------------------------

    async def submit(
        self,
        vchannel: str,
        payload: bytes | str,
        *,
        key: bytes | str = b"",
        msg_type: str = "message",
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Position]:
        """Queue one message (waiting for room in the bounded queue) and return the future
        of its position."""
        if self._closing or self._closed:
            raise RuntimeError("Producer is closed")
        message = _message(vchannel, payload, key, msg_type, properties)
        pchannel = self._client.router.cached_pchannel(vchannel)
        if pchannel is None:
            pchannel = await self._client.router.pchannel_of(vchannel)
        size = message.ByteSize()
        if size > MAX_MESSAGE_BYTES:
            raise _invalid(
                f"message too large ({size} bytes serialized; expected <= {MAX_MESSAGE_BYTES})"
            )
        while self._unacked_messages > 0 and (
            self._unacked_messages >= self.max_pending_messages
            or self._unacked_bytes + size > self.max_pending_bytes
        ):
            self._room.clear()
            await self._room.wait()
        if self._closing or self._closed:
            raise RuntimeError("Producer is closed")
        lane = self._lane(pchannel)
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        now = time.monotonic()
        lane.pending.append(_Pending(message, size, future, now, now + self.retry_timeout_s))
        lane.pending_bytes += size
        self._unacked_messages += 1
        self._unacked_bytes += size
        lane.wake.set()
        return future

    async def send(
        self,
        vchannel: str,
        payload: bytes | str,
        *,
        key: bytes | str = b"",
        msg_type: str = "message",
        properties: Mapping[str, str] | None = None,
    ) -> Position:
        """Send one message and wait for its position. Cancelling the caller does not
        withdraw the message."""
        future = await self.submit(
            vchannel, payload, key=key, msg_type=msg_type, properties=properties
        )
        return await asyncio.shield(future)

    async def send_batch(
        self,
        vchannel: str,
        payloads: Iterable[bytes | str],
        *,
        key: bytes | str = b"",
        msg_type: str = "message",
        properties: Mapping[str, str] | None = None,
    ) -> list[Position]:
        """Send several messages of one vchannel (in order) and wait for all positions;
        raises the first error."""
        futures = [
            await self.submit(vchannel, p, key=key, msg_type=msg_type, properties=properties)
            for p in payloads
        ]
        self._flushing += 1
        self._wake_all()
        try:
            return list(await asyncio.gather(*[asyncio.shield(f) for f in futures]))
        finally:
            self._flushing -= 1

    # -- lanes ----------------------------------------------------------------------

    def _lane(self, pchannel: str) -> _Lane:
        lane = self._lanes.get(pchannel)
        if lane is None:
            lane = _Lane(pchannel, _initial_sequence(), _Backoff(*self._backoff_s))
            self._lanes[pchannel] = lane
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._run(lane), name=f"producer:{pchannel}")
        return lane

    def _stream_for(self, address: str) -> _ProduceStream:
        stream = self._streams.get(address)
        if stream is None or stream.failure is not None:
            stream = _ProduceStream(self._client.stub(address), address)
            self._streams[address] = stream
        return stream

    def _release(self, items: Sequence[_Pending]) -> None:
        self._unacked_messages -= len(items)
        self._unacked_bytes -= sum(item.size for item in items)
        self._room.set()

    async def _run(self, lane: _Lane) -> None:
        try:
            while True:
                lane.wake.clear()
                self._collect(lane)
                if lane.failure is not None:
                    await self._recover(lane)
                    continue
                now = time.monotonic()
                self._expire_pending(lane, now, None)
                await self._send_ready(lane)
                if self._closing and not lane.pending and not lane.inflight:
                    return
                await wait_event(lane.wake, self._next_timer(lane))
        except BaseException as error:
            # Never leave a caller waiting on a future nobody will resolve.
            failure = (
                OnShutdownError(error_info(E.ON_SHUTDOWN, "producer closed"))
                if isinstance(error, asyncio.CancelledError)
                else InnerError(error_info(E.INNER, f"producer failed: {error!r}"))
            )
            if not isinstance(error, asyncio.CancelledError):
                log.exception("producer lane %s failed", lane.pchannel)
            for batch in list(lane.inflight):
                self._fail_batch(lane, batch, failure)
            items = list(lane.pending)
            lane.pending.clear()
            lane.pending_bytes = 0
            self._fail_items(items, failure)
            raise

    def _next_timer(self, lane: _Lane) -> float | None:
        """Seconds until the lane has something to do without being woken."""
        now = time.monotonic()
        timers = [b.sent_at + self.attempt_timeout_s - now for b in lane.inflight]
        if lane.inflight:
            timers.append(ROUTE_CHECK_S)
        if lane.pending:
            oldest = lane.pending[0]
            timers.append(oldest.deadline - now)
            if len(lane.inflight) < self.max_in_flight:
                timers.append(oldest.enqueued + self.linger_s - now)
        return max(0.0, min(timers)) if timers else None

    def _collect(self, lane: _Lane) -> None:
        """Apply the answers that arrived; a retryable failure marks the lane for recovery."""
        now = time.monotonic()
        route = self._client.router.route(lane.pchannel)
        for batch in list(lane.inflight):
            attempt = batch.attempt
            if attempt is None:
                continue
            if not attempt.done():
                if now - batch.sent_at > self.attempt_timeout_s:
                    self._mark_failed(
                        lane,
                        batch,
                        error_info(
                            E.ON_SHUTDOWN,
                            f"{batch.address} did not answer batch {batch.sequence} of "
                            f"{lane.pchannel} within {self.attempt_timeout_s:g} s",
                        ),
                    )
                elif route is not None and route.assigned and route.term > batch.term:
                    # A silent owner (stopped, partitioned) never fails its streams: move
                    # on as soon as the pchannel is served at a newer term.
                    self._mark_failed(
                        lane,
                        batch,
                        error_info(
                            E.CHANNEL_FENCED,
                            f"{lane.pchannel} moved to {route.owner_address} at term "
                            f"{route.term} while batch {batch.sequence} waited at "
                            f"{batch.address} (term {batch.term})",
                            current_term=route.term,
                        ),
                    )
                elif now - batch.sent_at > WATCH_STALE_S:
                    self._client.router.refresh_if_stale(lane.pchannel)
                continue
            try:
                result = attempt.result()
            except _StreamBroken as broken:
                if broken.info.code in STREAM_REFUSED_CODES:
                    self._fail_batch(lane, batch, error_for(broken.info))
                else:
                    self._mark_failed(lane, batch, broken.info)
                continue
            if result.HasField("error") and result.error.code != E.OK:
                code = result.error.code
                if code in DATA_RETRYABLE_CODES:
                    self._mark_failed(lane, batch, result.error)
                elif (
                    code == E.CHANNEL_NOT_EXIST and batch.not_exist_retries < MAX_NOT_EXIST_RETRIES
                ):
                    batch.not_exist_retries += 1
                    self._mark_failed(lane, batch, result.error)
                else:
                    self._fail_batch(lane, batch, error_for(result.error))
                continue
            if len(result.time_ticks) != len(batch.items):
                self._fail_batch(
                    lane,
                    batch,
                    InnerError(
                        error_info(
                            E.INNER,
                            f"{batch.address} answered {len(result.time_ticks)} positions for a "
                            f"batch of {len(batch.items)} messages",
                        )
                    ),
                )
                continue
            lane.inflight.remove(batch)
            lane.backoff.reset()
            self.stats.batches_acknowledged += 1
            self.stats.messages_acknowledged += len(batch.items)
            if result.duplicate:
                self.stats.duplicates += 1
            for index, (item, tick) in enumerate(zip(batch.items, result.time_ticks, strict=True)):
                if not item.future.done():
                    item.future.set_result(Position(lane.pchannel, result.first_lsn + index, tick))
            self._release(batch.items)

    def _mark_failed(self, lane: _Lane, batch: _Batch, info: errors_pb2.ErrorInfo) -> None:
        log.debug(
            "batch %d of %s at %s failed: %s: %s",
            batch.sequence,
            lane.pchannel,
            batch.address,
            code_name(info.code),
            info.message,
        )
        batch.attempt = None
        if lane.failure is None:
            lane.failure = info
            lane.failed_at = (batch.address, batch.term)

    def _fail_items(self, items: Sequence[_Pending], error: BaseException) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)
        self.stats.messages_failed += len(items)
        if items:
            self._release(items)

    def _fail_batch(self, lane: _Lane, batch: _Batch, error: BaseException) -> None:
        if batch in lane.inflight:
            lane.inflight.remove(batch)
        self._fail_items(batch.items, error)

    def _expire_pending(self, lane: _Lane, now: float, error: BaseException | None) -> None:
        """Fail queued messages whose deadline passed (with `error` when given: no owner
        could be found before then)."""
        expired: list[_Pending] = []
        while lane.pending and lane.pending[0].deadline <= now:
            item = lane.pending.popleft()
            lane.pending_bytes -= item.size
            expired.append(item)
        if expired:
            self._fail_items(
                expired,
                error
                or _unavailable(
                    f"{len(expired)} message(s) for {lane.pchannel} could not be sent within "
                    f"retry_timeout_s {self.retry_timeout_s:g}",
                    lane.failure,
                ),
            )

    def _expire_inflight(self, lane: _Lane, info: errors_pb2.ErrorInfo | None) -> None:
        """Give up on the first batch out of time or attempts and on every later one (they
        must not be written behind a batch whose outcome is unknown)."""
        now = time.monotonic()
        for index, batch in enumerate(lane.inflight):
            out_of_time = batch.deadline <= now
            if out_of_time or batch.attempts >= self.max_attempts:
                reason = (
                    f"within retry_timeout_s {self.retry_timeout_s:g}"
                    if out_of_time
                    else f"in max_attempts {self.max_attempts}"
                )
                doomed = lane.inflight[index:]
                for later in doomed:
                    error = _unavailable(
                        f"batch {later.sequence} of {lane.pchannel} ({len(later.items)} "
                        f"messages) was not acknowledged {reason} (outcome unknown"
                        + (
                            f"; it was sent after unacknowledged batch {batch.sequence})"
                            if later is not batch
                            else ")"
                        ),
                        info,
                    )
                    self._fail_batch(lane, later, error)
                return

    async def _connect(self, lane: _Lane, deadline: float) -> None:
        route = await self._client.router.owner(lane.pchannel, deadline - time.monotonic())
        lane.route = route
        lane.stream = self._stream_for(route.owner_address)

    def _submit(self, lane: _Lane, batch: _Batch) -> None:
        assert lane.stream is not None and lane.route is not None
        batch.attempts += 1
        batch.sent_at = time.monotonic()
        batch.address = lane.route.owner_address
        batch.term = lane.route.term
        batch.attempt = lane.stream.submit(batch.request)
        batch.attempt.add_done_callback(lambda _: lane.wake.set())
        self.stats.batches_sent += 1
        if batch.attempts > 1:
            self.stats.retries += 1

    def _ready_to_cut(self, lane: _Lane) -> bool:
        if not lane.pending or len(lane.inflight) >= self.max_in_flight:
            return False
        if (
            self._flushing
            or self._closing
            or len(lane.pending) >= self.max_batch_messages
            or lane.pending_bytes >= self.max_batch_bytes
        ):
            return True
        return time.monotonic() - lane.pending[0].enqueued >= self.linger_s

    def _cut(self, lane: _Lane) -> _Batch:
        items: list[_Pending] = []
        size = 0
        while lane.pending and len(items) < self.max_batch_messages:
            item = lane.pending[0]
            if items and size + item.size > self.max_batch_bytes:
                break
            lane.pending.popleft()
            lane.pending_bytes -= item.size
            items.append(item)
            size += item.size
        sequence = lane.next_sequence
        lane.next_sequence += 1
        first = items[0].message
        if all(
            item.message.vchannel == first.vchannel
            and item.message.msg_type == first.msg_type
            and not item.message.key
            and not item.message.properties
            for item in items
        ):
            # Plain messages of one vchannel: the compact form, cheaper on both ends.
            request = wire.ProduceRequest(
                pchannel=lane.pchannel,
                batch_vchannel=first.vchannel,
                batch_msg_type=first.msg_type,
                payloads=[item.message.payload for item in items],
                producer_id=self.producer_id,
                sequence=sequence,
            )
        else:
            request = wire.ProduceRequest(
                pchannel=lane.pchannel,
                messages=[item.message for item in items],
                producer_id=self.producer_id,
                sequence=sequence,
            )
        deadline = min(item.deadline for item in items)
        return _Batch(sequence, items, request, size, deadline)

    async def _send_ready(self, lane: _Lane) -> None:
        while self._ready_to_cut(lane):
            if lane.stream is None or lane.stream.failure is not None:
                deadline = lane.pending[0].deadline
                try:
                    await self._connect(lane, deadline)
                except ClientClosedError as error:
                    items = list(lane.pending)
                    lane.pending.clear()
                    lane.pending_bytes = 0
                    self._fail_items(items, error)
                    return
                except UnavailableError as error:
                    now = time.monotonic()
                    self._expire_pending(lane, now, error)
                    if lane.pending:
                        delay = lane.backoff.next_delay(lane.pending[0].deadline - now)
                        await asyncio.sleep(delay)
                    return
                except RaftwalError as error:
                    items = list(lane.pending)
                    lane.pending.clear()
                    lane.pending_bytes = 0
                    self._fail_items(items, error)
                    return
            # Answers may have arrived while connecting: never send past a failed batch.
            self._collect(lane)
            if lane.failure is not None or not self._ready_to_cut(lane):
                return
            batch = self._cut(lane)
            lane.inflight.append(batch)
            self._submit(lane, batch)

    async def _recover(self, lane: _Lane) -> None:
        """Re-establish the pipeline after a failure: every unacknowledged batch is sent
        again, in sequence order, to the owner the routing table names now."""
        info = lane.failure
        lane.failure = None
        address, term = lane.failed_at
        self._client.router.report_failure(lane.pchannel, address, term, info)
        lane.stream = None
        self.stats.recoveries += 1
        for batch in lane.inflight:
            # Abandon the outstanding attempts: a late answer to one is ignored (its resend
            # gets the same positions back as a duplicate).
            batch.attempt = None
        while True:
            self._expire_inflight(lane, info)
            if not lane.inflight:
                return
            deadline = min(batch.deadline for batch in lane.inflight)
            await asyncio.sleep(lane.backoff.next_delay(deadline - time.monotonic()))
            try:
                await self._connect(lane, deadline)
            except ClientClosedError as error:
                for batch in list(lane.inflight):
                    self._fail_batch(lane, batch, error)
                return
            except UnavailableError as error:
                info = error.info
                continue
            except RaftwalError as error:
                for batch in list(lane.inflight):
                    self._fail_batch(lane, batch, error)
                return
            log.info(
                "resending %d batch(es) of %s (sequences %d..%d) to %s at term %d",
                len(lane.inflight),
                lane.pchannel,
                lane.inflight[0].sequence,
                lane.inflight[-1].sequence,
                lane.route.owner_address if lane.route else "?",
                lane.route.term if lane.route else 0,
            )
            for batch in lane.inflight:
                self._submit(lane, batch)
            return


# ---------------------------------------------------------------------------------------
# Consumer
# ---------------------------------------------------------------------------------------


class Consumer:
    """Committed entries of one vchannel, in LSN order, as an async iterator.

    Where to start: ``from_lsn`` (that LSN and after), ``start_after`` (after that LSN),
    ``latest`` (only entries committed after the consumer first connects: ``start()``,
    ``async with`` or the first ``__anext__``), else the whole retained log. After a broken stream or an owner move it resumes after the last
    delivered LSN at the (new) owner, so no entry is skipped or delivered twice. Gives up
    with UnavailableError after ``max_attempts`` consecutive failures or ``retry_timeout_s``
    without progress; non-retryable answers (COMPACTED, INVALID_ARGUMENT, ...) raise their
    typed error.
    """

    def __init__(
        self,
        client_or_endpoints: StreamingClient | CoordinatorClient | str | Sequence[str],
        vchannel: str,
        *,
        from_lsn: int | None = None,
        start_after: int | None = None,
        latest: bool = False,
        msg_types: Sequence[str] | None = None,
        include_control: bool = False,
        max_batch_entries: int = 1000,
        retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
    ) -> None:
        chosen = [
            name
            for name, value in (("from_lsn", from_lsn), ("start_after", start_after))
            if value is not None
        ]
        if latest:
            chosen.append("latest")
        if len(chosen) > 1:
            raise _invalid(f"invalid start ({', '.join(chosen)}; expected at most one)")
        if from_lsn is not None and from_lsn < 0:
            raise _invalid(f"invalid from_lsn ({from_lsn}; expected >= 0)")
        if start_after is not None and start_after < 0:
            raise _invalid(f"invalid start_after ({start_after}; expected >= 0)")
        _check_range("max_batch_entries", max_batch_entries, 1, MAX_CONSUME_BATCH)
        _check_range("retry_timeout_s", retry_timeout_s, 0.001, 3600)
        _check_range("max_attempts", max_attempts, 1, 1000)
        _check_range("attempt_timeout_s", attempt_timeout_s, 0.001, 3600)
        self.vchannel = vchannel
        self._client, self._owns_client = _resolve(client_or_endpoints)
        self._latest = latest
        if from_lsn is not None:
            self._policy, self._lsn = wire.DELIVER_POLICY_START_FROM, from_lsn
        elif start_after is not None:
            self._policy, self._lsn = wire.DELIVER_POLICY_START_AFTER, start_after
        else:
            self._policy, self._lsn = wire.DELIVER_POLICY_ALL, 0
        self._msg_types = list(msg_types or ())
        self._include_control = include_control
        self._max_batch_entries = int(max_batch_entries)
        self.retry_timeout_s = retry_timeout_s
        self.max_attempts = int(max_attempts)
        self.attempt_timeout_s = attempt_timeout_s
        self._backoff = _Backoff(backoff_initial_s, backoff_max_s)
        self._pchannel: str | None = None
        self._route: Route | None = None
        self._call: Any = None
        self._read_task: asyncio.Task[Any] | None = None
        self._buffer: deque[wire.WalEntry] = deque()
        self._last_lsn: int | None = None
        self._failures = 0
        self._not_exist = 0
        self._outage_started: float | None = None
        self._last_response_at = 0.0
        self._last_probe_at = 0.0
        self._closed = False
        #: streams opened (the first one included): 1 + reconnections
        self.connections = 0
        self.delivered = 0

    @property
    def last_lsn(self) -> int | None:
        """The LSN of the last entry delivered (None before the first)."""
        return self._last_lsn

    @property
    def pchannel(self) -> str | None:
        return self._pchannel

    def __aiter__(self) -> Consumer:
        return self

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def start(self) -> Consumer:
        """Connect now rather than on the first ``__anext__`` (``latest`` is pinned here).
        Raises what connecting raises (after the bounded retries)."""
        while self._read_task is None and not self._closed:
            await self._connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop (idempotent); a pending ``__anext__`` ends the iteration."""
        if self._closed:
            return
        self._closed = True
        self._disconnect()
        if self._owns_client:
            await self._client.close()

    def _disconnect(self) -> None:
        if self._read_task is not None:
            self._read_task.cancel()
            self._read_task.add_done_callback(
                lambda t: t.cancelled() or t.exception()  # retrieved: no warning
            )
        if self._call is not None:
            self._call.cancel()
        self._call = None
        self._read_task = None
        # Undelivered entries are read again after the last delivered one.
        self._buffer.clear()

    async def __anext__(self) -> wire.WalEntry:
        while True:
            if self._closed:
                raise StopAsyncIteration
            while self._buffer:
                entry = self._buffer.popleft()
                if self._last_lsn is not None and entry.lsn <= self._last_lsn:
                    continue
                self._last_lsn = entry.lsn
                self.delivered += 1
                return entry
            if self._read_task is None:
                await self._connect()
                continue
            done, _ = await asyncio.wait({self._read_task}, timeout=ROUTE_CHECK_S)
            if self._closed:
                raise StopAsyncIteration
            if not done:
                if not self._check_moved():
                    await self._probe()
                continue
            await self._take(self._read_task)

    def _check_moved(self) -> bool:
        """Reconnect when the routing table has a newer serving owner than our stream's."""
        if self._pchannel is None or self._route is None:
            return False
        current = self._client.router.route(self._pchannel)
        if current is not None and current.assigned and current.term > self._route.term:
            log.info(
                "%s moved to %s at term %d; consumer reconnects",
                self._pchannel,
                current.owner_address,
                current.term,
            )
            self._disconnect()
            return True
        return False

    async def _probe(self) -> None:
        """After CONSUMER_PROBE_S of silence, ask the owner for its position: an owner that
        cannot answer (stopped, partitioned) or no longer owns the pchannel is left."""
        now = time.monotonic()
        if (
            self._pchannel is None
            or self._route is None
            or now - max(self._last_response_at, self._last_probe_at) < CONSUMER_PROBE_S
        ):
            return
        self._last_probe_at = now
        address, term = self._route.owner_address, self._route.term
        try:
            await self._client.stub(address).GetLatestTimeTick(
                wire.GetLatestTimeTickRequest(pchannel=self._pchannel),
                timeout=min(self.attempt_timeout_s, CONSUMER_PROBE_TIMEOUT_S),
            )
        except grpc.aio.AioRpcError as error:
            info, retryable = _classify_data(error)
            if retryable:
                log.info("owner %s of %s failed a probe: %s", address, self._pchannel, info.message)
                self._client.router.refresh_if_stale(self._pchannel)
                await self._failed(info, True, address, term)

    async def _take(self, task: asyncio.Task[Any]) -> None:
        address = self._route.owner_address if self._route else ""
        term = self._route.term if self._route else 0
        try:
            response = task.result()
        except asyncio.CancelledError:
            # Our own cancellation (close or a move), or the call cancelled under us (its
            # channel closed): reconnect, which raises ClientClosedError when the client
            # is closed, or stop.
            self._disconnect()
            return
        except grpc.aio.AioRpcError as error:
            info, retryable = _classify_data(error)
            await self._failed(info, retryable, address, term)
            return
        except Exception as error:
            self._disconnect()
            raise unexpected_loop_error(
                f"Consume of {self.vchannel} at {address}", error
            ) from error
        if response is grpc.aio.EOF:
            await self._failed(
                error_info(E.ON_SHUTDOWN, f"{address} ended the Consume stream"),
                True,
                address,
                term,
            )
            return
        self._progress()
        self._last_response_at = time.monotonic()
        if self._route is not None and response.term > self._route.term:
            self._route = Route(
                self._route.pchannel, response.term, address, state=pb.PCHANNEL_STATE_ASSIGNED
            )
        self._buffer.extend(response.entries)
        self._read_task = asyncio.ensure_future(self._call.read())

    def _progress(self) -> None:
        self._failures = 0
        self._not_exist = 0
        self._outage_started = None
        self._backoff.reset()

    def _request(self) -> wire.ConsumeRequest:
        if self._last_lsn is not None:
            policy, lsn = wire.DELIVER_POLICY_START_AFTER, self._last_lsn
        else:
            policy, lsn = self._policy, self._lsn
        return wire.ConsumeRequest(
            vchannel=self.vchannel,
            policy=policy,
            lsn=lsn,
            msg_types=self._msg_types,
            include_control=self._include_control,
            max_batch_entries=self._max_batch_entries,
        )

    def _remaining_s(self) -> float:
        started = self._outage_started or time.monotonic()
        return max(0.0, started + self.retry_timeout_s - time.monotonic())

    async def _connect(self) -> None:
        router = self._client.router
        address, term = "", 0
        try:
            if self._pchannel is None:
                self._pchannel = await router.pchannel_of(self.vchannel)
            route = await router.owner(self._pchannel, max(0.001, self._remaining_s()))
            address, term = route.owner_address, route.term
            stub = self._client.stub(address)
            if self._latest and self._last_lsn is None:
                # Pin "latest" once, so that a reconnect cannot skip what arrived between.
                latest = await stub.GetLatestTimeTick(
                    wire.GetLatestTimeTickRequest(pchannel=self._pchannel),
                    timeout=self.attempt_timeout_s,
                )
                self._policy, self._lsn = wire.DELIVER_POLICY_START_AFTER, latest.committed_lsn
                self._latest = False
            self._route = route
            self._call = stub.Consume(self._request())
            self._read_task = asyncio.ensure_future(self._call.read())
            self._last_response_at = time.monotonic()
            self.connections += 1
        except grpc.aio.AioRpcError as error:
            info, retryable = _classify_data(error)
            await self._failed(info, retryable, address, term)
        except ClientClosedError:
            raise
        except UnavailableError as error:
            await self._failed(error.info, True, address, term)

    async def _failed(
        self, info: errors_pb2.ErrorInfo, retryable: bool, address: str, term: int
    ) -> None:
        self._disconnect()
        if info.code == E.CHANNEL_NOT_EXIST and self._not_exist < MAX_NOT_EXIST_RETRIES:
            self._not_exist += 1
            retryable = True
        if not retryable:
            raise error_for(info)
        if self._pchannel is not None:
            self._client.router.report_failure(self._pchannel, address, term, info)
        now = time.monotonic()
        if self._outage_started is None:
            self._outage_started = now
        self._failures += 1
        elapsed = now - self._outage_started
        log.debug(
            "Consume of %s at %s failed (%s: %s); failure %d",
            self.vchannel,
            address or "-",
            code_name(info.code),
            info.message,
            self._failures,
        )
        if self._failures >= self.max_attempts or elapsed >= self.retry_timeout_s:
            raise _unavailable(
                f"Consume of {self.vchannel} gave up after {self._failures} failure(s) in "
                f"{elapsed:.1f} s without progress (max_attempts {self.max_attempts}, "
                f"retry_timeout_s {self.retry_timeout_s:g}; last delivered lsn "
                f"{self._last_lsn})",
                info,
            )
        await asyncio.sleep(self._backoff.next_delay(self._remaining_s()))


# ---------------------------------------------------------------------------------------
# Transactions
# ---------------------------------------------------------------------------------------


class Txn:
    """One transaction on one vchannel (buffered by the pchannel's owner, written as one
    contiguous batch at commit: readers see all of it or nothing).

    ``BeginTxn`` is retried like a routing call (a txn left behind by an attempt whose
    answer was lost simply expires). ``AppendTxn``, ``CommitTxn`` and ``RollbackTxn`` go to
    the owner that began the txn, once: repeating an append could buffer it twice, and a
    commit whose answer was lost raises UnknownError (outcome unknown). A keepalive task
    renews the txn every third of ``keepalive_ms`` while it is open; when it gives up (the
    owner refused, or could not be reached for ``keepalive_ms``, after which the owner has
    expired the txn) ``keepalive_error`` says why and the next call raises it at once.
    """

    def __init__(
        self,
        client_or_endpoints: StreamingClient | CoordinatorClient | str | Sequence[str],
        vchannel: str,
        *,
        keepalive_ms: int = DEFAULT_TXN_KEEPALIVE_MS,
        timeout_s: float = 10.0,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        max_attempts: int = 20,
    ) -> None:
        _check_range("keepalive_ms", keepalive_ms, 1, 600_000)
        _check_range("timeout_s", timeout_s, 0.001, 3600)
        _check_range("attempt_timeout_s", attempt_timeout_s, 0.001, 3600)
        _check_range("max_attempts", max_attempts, 1, 1000)
        self.vchannel = vchannel
        self.keepalive_ms = int(keepalive_ms)
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.max_attempts = int(max_attempts)
        self._client, self._owns_client = _resolve(client_or_endpoints)
        self.txn_id = 0
        self.pchannel = ""
        self.term = 0
        #: new -> open -> committed | rolled_back | failed
        self.state = "new"
        self.buffered_messages = 0
        self.keepalives = 0
        self.keepalive_error: RaftwalError | None = None
        self._address = ""
        self._keepalive: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Txn:
        try:
            return await self.begin()
        except BaseException:
            await self._release()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if self.state == "open":
                if exc_type is None:
                    await self.commit()
                else:
                    try:
                        await self.rollback()
                    except RaftwalError as error:
                        # The original exception matters more; the txn expires anyway.
                        log.warning("rollback of txn %d failed: %s", self.txn_id, error)
        finally:
            await self._release()

    async def _release(self) -> None:
        await self._stop_keepalive()
        if self._owns_client:
            await self._client.close()

    async def begin(self) -> Txn:
        if self.state != "new":
            raise _state_error(f"txn already begun (state {self.state})")
        router = self._client.router
        pchannel = router.cached_pchannel(self.vchannel) or await router.pchannel_of(self.vchannel)
        request = wire.BeginTxnRequest(vchannel=self.vchannel, keepalive_ms=self.keepalive_ms)
        started = time.monotonic()
        backoff = _Backoff(0.05, 1.0)
        info: errors_pb2.ErrorInfo | None = None
        attempts = 0
        while attempts < self.max_attempts:
            remaining = started + self.timeout_s - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            route = await router.owner(pchannel, remaining)
            try:
                response = await self._client.stub(route.owner_address).BeginTxn(
                    request, timeout=min(remaining, self.attempt_timeout_s)
                )
            except grpc.aio.AioRpcError as error:
                info, retryable = _classify_data(error)
                if info.code == E.CHANNEL_NOT_EXIST and attempts <= MAX_NOT_EXIST_RETRIES:
                    retryable = True
                if not retryable:
                    raise error_for(info) from None
                router.report_failure(pchannel, route.owner_address, route.term, info)
                await asyncio.sleep(backoff.next_delay(started + self.timeout_s - time.monotonic()))
                continue
            self.txn_id = response.txn_id
            self.pchannel = response.pchannel
            self.term = response.term
            self._address = route.owner_address
            self.state = "open"
            self._keepalive = asyncio.create_task(
                self._keep_alive(), name=f"txn-keepalive:{self.txn_id}"
            )
            return self
        raise _unavailable(
            f"BeginTxn on {self.vchannel} gave up after {attempts} attempt(s) in "
            f"{_elapsed_text(started)}",
            info,
        )

    async def _once(self, method: str, request: Any, *, commit: bool = False) -> Any:
        if self.state != "open":
            raise _state_error(f"txn {self.txn_id} is {self.state} (expected open)")
        if self.keepalive_error is not None:
            # The keepalive already knows the txn is gone on its owner: say so at once
            # instead of sending (and, for a stopped owner, waiting out a deadline to
            # report an "unknown" outcome that is in fact known: nothing was written).
            self.state = "failed"
            raise self.keepalive_error
        try:
            return await getattr(self._client.stub(self._address), method)(
                request, timeout=self.attempt_timeout_s
            )
        except grpc.aio.AioRpcError as error:
            info = from_rpc_error(error)
            if not _has_error_info(error):
                # No answer: the txn's fate on the owner is unknown.
                self.state = "failed"
                what = "outcome unknown" if commit else "the txn is abandoned"
                raise UnknownError(
                    error_info(
                        E.UNKNOWN,
                        f"{method} of txn {self.txn_id} at {self._address}: {what} ({info.message})",
                    )
                ) from None
            if info.code in (E.TRANSACTION_EXPIRED, E.NOT_OWNER, E.CHANNEL_FENCED) or commit:
                self.state = "failed"
            raise error_for(info) from None

    async def append(
        self,
        *payloads: bytes | str,
        key: bytes | str = b"",
        msg_type: str = "message",
        properties: Mapping[str, str] | None = None,
    ) -> int:
        """Buffer messages in the txn; returns how many the txn holds now."""
        if not payloads:
            raise _invalid("invalid append (no payloads; expected at least one)")
        messages = [_message(self.vchannel, p, key, msg_type, properties) for p in payloads]
        response = await self._once(
            "AppendTxn",
            wire.AppendTxnRequest(vchannel=self.vchannel, txn_id=self.txn_id, messages=messages),
        )
        self.buffered_messages = response.buffered_messages
        return int(response.buffered_messages)

    async def commit(self) -> list[Position]:
        """Write the txn; returns one position per entry written: the begin marker, each
        message, the commit marker (consumers see the same entries)."""
        response = await self._once(
            "CommitTxn",
            wire.CommitTxnRequest(vchannel=self.vchannel, txn_id=self.txn_id),
            commit=True,
        )
        self.state = "committed"
        await self._stop_keepalive()
        return [Position(self.pchannel, p.lsn, p.time_tick) for p in response.positions]

    async def rollback(self) -> None:
        try:
            await self._once(
                "RollbackTxn", wire.RollbackTxnRequest(vchannel=self.vchannel, txn_id=self.txn_id)
            )
            self.state = "rolled_back"
        finally:
            await self._stop_keepalive()

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep_alive(self) -> None:
        # Never ends quietly: however it stops short of the txn's end, keepalive_error
        # says why and the next append/commit raises it.
        try:
            await self._renew_while_open()
        except asyncio.CancelledError:
            raise
        except RaftwalError as error:
            self.keepalive_error = error
        except Exception as error:  # noqa: BLE001 (reported: keepalive_error, the log)
            self.keepalive_error = unexpected_loop_error(f"txn {self.txn_id} keepalive", error)

    async def _renew_while_open(self) -> None:
        interval_s = max(0.01, self.keepalive_ms / 3000)
        request = wire.KeepAliveTxnRequest(vchannel=self.vchannel, txn_id=self.txn_id)
        renewed = time.monotonic()
        while self.state == "open":
            await asyncio.sleep(interval_s)
            try:
                await self._client.stub(self._address).KeepAliveTxn(
                    request, timeout=min(self.attempt_timeout_s, interval_s * 2)
                )
                self.keepalives += 1
                renewed = time.monotonic()
            except grpc.aio.AioRpcError as error:
                info = from_rpc_error(error)
                if _has_error_info(error):
                    # The owner answered: the txn is gone (expired, moved); stop renewing.
                    self.keepalive_error = error_for(info)
                    log.warning("txn %d keepalive refused: %s", self.txn_id, self.keepalive_error)
                    return
                log.debug("txn %d keepalive failed: %s", self.txn_id, info.message)
                if time.monotonic() - renewed > self.keepalive_ms / 1000:
                    # Unrenewed for keepalive_ms (measured from an answer, so later than the
                    # owner's own deadline): the owner has expired the txn by now, and it
                    # was never written.
                    self.keepalive_error = TransactionExpiredError(
                        error_info(
                            E.TRANSACTION_EXPIRED,
                            f"txn {self.txn_id} expired: not renewed within keepalive_ms "
                            f"{self.keepalive_ms} at {self._address} (last error: "
                            f"{code_name(info.code)}: {info.message})",
                        )
                    )
                    log.warning("%s", self.keepalive_error)
                    return


def _state_error(message: str) -> InvalidTransactionStateError:
    return InvalidTransactionStateError(error_info(E.INVALID_TRANSACTION_STATE, message))


# The SDK's conventions and typed errors. Imported last: ``rpc/client.py`` re-exports this
# module's classes at its end, so either module may be imported first without a cycle
# failing (every name above is only used at call time).
from rpc.client import (  # noqa: E402
    MAX_CHANNELS,
    STREAM_FAILURES,
    ChannelNotExistError,
    ClientClosedError,
    CoordinatorClient,
    InnerError,
    InvalidArgumentError,
    InvalidTransactionStateError,
    OnShutdownError,
    RaftwalError,
    TransactionExpiredError,
    UnavailableError,
    UnknownError,
    _Backoff,
    _has_error_info,
    classify,
    code_name,
    error_for,
    read_stream,
    stream_failure,
    unexpected_loop_error,
)
