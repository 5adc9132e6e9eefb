"""The data plane's routing, and what the producer, the consumer and transactions share.

- ``AssignmentCache``: the client's routing table. It follows ``Coordinator.WatchAssignments``
  (moving to another endpoint when the stream breaks, or stays silent while an owner is
  failing), maps vchannel -> pchannel and pchannel -> owner address, and
  ``owner(pchannel, timeout_s)`` waits until the pchannel is ASSIGNED. A NOT_OWNER /
  CHANNEL_FENCED answer or a broken stream is reported back (``report_failure``): the owner
  that failed is held back for a moment and an ``owner_hint`` is tried first.
- ``StreamingClientBase``: a ``CoordinatorClient``, that routing table and one gRPC channel
  per node, opened with the coordinator client's ``security`` (TLS, client certificate,
  bearer token; see ``rpc.client``). ``StreamingClient`` (``rpc.streaming.client``) is this
  plus the ``producer()`` / ``consumer()`` / ``txn()`` factories; ``Producer``, ``Consumer``
  and ``Txn`` depend only on this base, so that none of them imports the module that builds
  them.
- ``Route``, ``Position``, ``list_segments`` (the committed segment manifest), and the
  bounds, checks and failure classification the data-plane parts all use.

This module must never import ``rpc.streaming.producer``, ``consumer``, ``txn`` or
``client`` (they import it). Every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple, Self

import grpc

from rpc.aio import wait_event
from rpc.coordinator_client import CoordinatorClient
from rpc.credentials import ClientSecurity
from rpc.errors import (
    ChannelNotExistError,
    ClientClosedError,
    RaftwalError,
    UnavailableError,
    code_name,
    error_for,
    error_info,
)
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.routing import (
    MAX_CHANNELS,
    STREAM_FAILURES,
    _Backoff,
    _has_error_info,
    _invalid,
    classify,
    read_stream,
    stream_failure,
    unexpected_loop_error,
)
from rpc.segment_transfer import client_tls

# The logger name of the data-plane SDK since it was one module (rpc/streaming_client.py):
# a caller's logging configuration for it keeps covering every part.
log = logging.getLogger("rpc.streaming_client")
E = errors_pb2

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
DEFAULT_ATTEMPT_TIMEOUT_S = 10.0
DEFAULT_RETRY_TIMEOUT_S = 30.0
DEFAULT_MAX_ATTEMPTS = 60
CLOSE_GRACE_S = 1.0

# Data-plane answers that another attempt (at the new owner, with the same sequence) can
# turn into success. UNKNOWN means "outcome unknown": safe to repeat with the same sequence.
DATA_RETRYABLE_CODES = frozenset(
    {E.NOT_OWNER, E.CHANNEL_FENCED, E.ON_SHUTDOWN, E.NOT_LEADER, E.UNKNOWN}
)


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
    #: gRPC addresses of the replica set's nodes other than the owner (replica reads)
    replica_addresses: tuple[str, ...] = ()

    @property
    def assigned(self) -> bool:
        return self.state == pb.PCHANNEL_STATE_ASSIGNED and bool(self.owner_address)


def _check_range(field_name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise _invalid(f"invalid {field_name} ({value}; expected {low:g}..{high:g})")


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
        addresses = {node.node_id: node.address for node in discovery.nodes}
        for channel in discovery.channels:
            routes[channel.pchannel] = Route(
                pchannel=channel.pchannel,
                term=channel.term,
                owner_address=channel.owner_address,
                owner_node_id=channel.owner_node_id,
                state=channel.state,
                vchannels=tuple(channel.vchannels),
                replica_addresses=tuple(
                    address
                    for node, address in zip(
                        channel.replica_node_ids,
                        # The node's data worker for this pchannel (a node that announced
                        # none, or an older one: its own address).
                        channel.replica_addresses
                        or [addresses.get(node, "") for node in channel.replica_node_ids],
                        strict=False,
                    )
                    if node != channel.owner_node_id and address
                ),
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

    async def pchannel_of(self, vchannel: str, timeout_s: float = 0.0) -> str:
        """The pchannel `vchannel` lives on. Unknown to the watch: asked (linearizably) of
        the coordinator; raises ChannelNotExistError when it has no such vchannel.

        With `timeout_s`, a lookup that no node could answer (UnavailableError: a paused
        leader, an election) is asked again until `timeout_s` has passed, so that a caller
        with a retry budget (a producer's ``retry_timeout_s``) is not failed sooner by the
        coordinator client's own deadline."""
        deadline = time.monotonic() + timeout_s
        backoff = _Backoff(0.05, 1.0)
        while True:
            try:
                return await self._pchannel_of(vchannel)
            except ClientClosedError:
                raise
            except UnavailableError:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    raise
                log.debug("looking up vchannel %s failed; asking again", vchannel)
                await asyncio.sleep(backoff.next_delay(remaining))

    async def _pchannel_of(self, vchannel: str) -> str:
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
        elif address and self._hints.get(pchannel, ("", 0))[0] == address:
            # The hinted owner failed too: forget the hint. (No address: no owner was
            # known, so there is no hint of it to drop.)
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


class StreamingClientBase:
    """A ``CoordinatorClient``, the routing table and one channel per node: everything of
    ``StreamingClient`` (``rpc.streaming.client``) but its ``producer()`` / ``consumer()`` /
    ``txn()`` factories. Producers, consumers and transactions take one (a StreamingClient
    is one) and share it; given endpoints instead, they make a private one. ``close()`` it
    when done; it closes the ``CoordinatorClient`` only when it created it (from
    endpoints)."""

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
        self._transfer_tls: tuple[ssl.SSLContext | None] | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
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

    def transfer_tls(self) -> ssl.SSLContext | None:
        """The `ssl` context for nodes' transfer ports (Produce streams): the channels'
        TLS (`rpc.segment_transfer.client_tls`), made once; None for plaintext."""
        if self._transfer_tls is None:
            self._transfer_tls = (client_tls(self.coordinator.security),)
        return self._transfer_tls[0]

    def stub(self, address: str) -> streaming_pb2_grpc.StreamingNodeStub:
        """The StreamingNode stub of `address`."""
        stub = self._stubs.get(address)
        if stub is None:
            stub = streaming_pb2_grpc.StreamingNodeStub(self._channel(address))
            self._stubs[address] = stub
        return stub

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


def _resolve(client_or_endpoints: Any) -> tuple[StreamingClientBase, bool]:
    """(shared client, owned): a StreamingClient (any StreamingClientBase) is shared;
    anything else gets a private one that the caller must close."""
    if isinstance(client_or_endpoints, StreamingClientBase):
        return client_or_endpoints, False
    return StreamingClientBase(client_or_endpoints), True


async def list_segments(
    client: CoordinatorClient | StreamingClientBase,
    pchannels: Sequence[str] = (),
    as_of_revision: int = 0,
) -> api.ListSegmentsResponse:
    """``Coordinator.ListSegments``: the committed segments of `pchannels` (all when empty),
    as of `as_of_revision` (0 = now, linearizable), with the CoordinatorClient's leader
    following and bounded retries. A read: repeating it is harmless."""
    if as_of_revision < 0:
        raise _invalid(f"invalid as_of_revision ({as_of_revision}; expected >= 0)")
    coordinator = client.coordinator if isinstance(client, StreamingClientBase) else client
    request = api.ListSegmentsRequest(pchannels=list(pchannels), as_of_revision=as_of_revision)
    response: api.ListSegmentsResponse = await coordinator._unary("ListSegments", request)
    return response
