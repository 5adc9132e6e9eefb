"""raftwal's asyncio Python SDK for the public ``Coordinator`` gRPC service (``grpc.aio``).

``CoordinatorClient`` hides the cluster behind one object:

- **routing**: any node answers, but writes end on the Raft leader, so the client remembers
  the leader (from a NOT_LEADER ``leader_hint`` or from ``ClusterStatus``) and sends there
  first; a hint is followed at once, a node that is down, shutting down or electing is
  left for the next endpoint after a jittered exponential backoff;
- **bounded retries**: every call is bounded in attempts (``max_attempts``) and in total
  time (``timeout_s``, plus the server-side wait the caller asked for, e.g. a lock's
  ``wait_timeout_ms``); running out raises ``UnavailableError`` carrying the last error;
- **exactly-once writes**: every mutating call carries one ``request_id`` (uuid4 hex) per
  logical call, reused on every retry, so the server's deduplication window turns a retry
  after an unknown outcome into the stored answer instead of a second application;
- **typed errors**: each ``ErrorCode`` has a ``RaftwalError`` subclass (``error_for`` /
  ``raise_for``); errors that retrying cannot fix raise at once;
- **coalesced writes**: concurrent ``grant_lease``, ``revoke_lease``, ``lock`` (without a
  wait) and ``unlock`` calls on one client share RPCs: while ``max_writes_in_flight``
  calls are on their way, new ones queue and leave together as one ``BatchWrite`` (up to
  ``max_batch_ops``), which the cluster proposes as one Raft entry. Each write keeps its
  own request id, result and typed error; a failed batch is retried whole with the same
  ids. An idle client sends a write on its own at once, so a lone caller waits no longer;
- **resumable streams**: ``watch_events`` resumes at the last delivered revision + 1 on
  another node, ``watch_assignments`` never goes back to an older version (both move when
  their node sends nothing, not even a progress notification, for
  ``watch_idle_timeout_s``, or ends them because it lost the Raft leader), and
  ``lease_keeper`` renews a lease over one bidirectional stream, reconnecting as needed;
- **security**: ``security`` (``rpc.credentials.ClientSecurity``) says how channels are
  opened: TLS with a CA file, a client certificate for clusters that require mutual TLS,
  and the bearer token that every call carries. By default it comes from the environment
  (``RAFTWAL_TOKEN`` or ``RAFTWAL_TOKEN_FILE``, ``RAFTWAL_CLIENT_TLS_CA_FILE``,
  ``RAFTWAL_CLIENT_TLS_CERT_FILE``, ``RAFTWAL_CLIENT_TLS_KEY_FILE``), else plaintext without
  a token. UNAUTHENTICATED and PERMISSION_DENIED are raised at once (never retried); a TLS
  handshake failure looks like an unreachable node (UNAVAILABLE) and is retried within the
  bounds, then raised as ``UnavailableError`` naming the handshake error.

```python
from rpc.client import CoordinatorClient
from rpc.credentials import ClientSecurity

security = ClientSecurity.load(token_file="tokens/producer", tls_ca_file="tls/ca.pem",
                               tls_cert_file="tls/client.pem", tls_key_file="tls/client.key")
async with CoordinatorClient("h1:7201,h2:7201,h3:7201", security=security) as client:
    print(await client.list_channels())
```

Callers import these names from ``rpc.client``. The typed errors live in ``rpc.errors``, the
failure classification and retry helpers shared with the data plane in ``rpc.routing``; the
synchronous wrapper ``Client`` lives in ``rpc/sync_client.py``, which imports this SDK (never
the reverse). This module must never retry without a bound, retry an error that is not
retryable, or give a retry of the same logical call a fresh request id; nor may it import
the data-plane SDK (``rpc.streaming``) or the sync client.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc

from rpc.aio import wait_event, wait_within
from rpc.credentials import ClientSecurity
from rpc.errors import (
    ClientClosedError,
    OnShutdownError,
    RaftwalError,
    UnavailableError,
    UnreachableError,
    code_name,
    error_for,
    error_info,
)
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from rpc.routing import (
    MAX_CHANNELS,
    STREAM_FAILURES,
    _Backoff,
    _invalid,
    _Router,
    classify,
    parse_endpoints,
    read_stream,
    stream_failure,
    unexpected_loop_error,
)

# Writes queued for a batch beyond this many are refused (RESOURCE_EXHAUSTED).
MAX_QUEUED_WRITES = 100_000

# The logger name this client always used (it was all of rpc/client.py).
log = logging.getLogger("rpc.client")
E = errors_pb2
T = TypeVar("T")

# A single attempt never waits longer than this (plus any server-side wait the caller
# asked for): above the node's propose timeout (5 s) so that a slow commit is not cut
# short, well below ``timeout_s`` so that a stopped (SIGSTOP) node leaves time to fail over.
DEFAULT_ATTEMPT_TIMEOUT_S = 6.0
# Closing channels waits at most this long for in-flight calls.
CLOSE_GRACE_S = 1.0
# A watch stream that brings nothing, not even a progress notification (nodes send one
# after about a second of quiet), for this long is moved to another node: its node is
# stopped (SIGSTOP keeps the TCP connection open), hung or cut off behind a proxy.
DEFAULT_WATCH_IDLE_TIMEOUT_S = 5.0


class _RetryableFailure(Exception):
    """Raised inside an attempt for a failure that carries no gRPC status (a stream that
    ended without an answer): retried like ON_SHUTDOWN."""

    def __init__(self, info: errors_pb2.ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


def _lock_mode(mode: str | int) -> int:
    if isinstance(mode, int) and mode in (pb.LOCK_MODE_EXCLUSIVE, pb.LOCK_MODE_SHARED):
        return mode
    named = {"exclusive": pb.LOCK_MODE_EXCLUSIVE, "shared": pb.LOCK_MODE_SHARED}
    if isinstance(mode, str) and mode.lower() in named:
        return named[mode.lower()]
    raise _invalid(f"invalid lock mode ({mode!r}; expected 'exclusive' or 'shared')")


def _wait_mode(mode: str | int) -> int:
    if isinstance(mode, int) and mode in (api.WAIT_MODE_ONCE, api.WAIT_MODE_ALL):
        return mode
    named = {"once": api.WAIT_MODE_ONCE, "all": api.WAIT_MODE_ALL}
    if isinstance(mode, str) and mode.lower() in named:
        return named[mode.lower()]
    raise _invalid(f"invalid wait mode ({mode!r}; expected 'once' or 'all')")


def _consistency(linearizable: bool) -> api.Consistency:
    return api.CONSISTENCY_LINEARIZABLE if linearizable else api.CONSISTENCY_SERIALIZABLE


def _check_positive(field: str, value: float) -> None:
    if not value > 0:
        raise _invalid(f"invalid {field} ({value}; expected > 0)")


def _check_wait_ms(field: str, value: int) -> None:
    if value < 0:
        raise _invalid(f"invalid {field} ({value}; expected >= 0)")


# ---------------------------------------------------------------------------------------
# Retries of long-lived streams
# ---------------------------------------------------------------------------------------


class _StreamRetry:
    """Reconnection budget of a long-lived stream: at most ``max_attempts`` consecutive
    failures and ``timeout_s`` of outage without progress; progress resets both."""

    def __init__(self, client: CoordinatorClient, name: str) -> None:
        self._client = client
        self._name = name
        self._failures = 0
        self._outage_started: float | None = None
        self._backoff = _Backoff(client.backoff_initial_s, client.backoff_max_s)

    def progress(self) -> None:
        self._failures = 0
        self._outage_started = None
        self._backoff.reset()

    async def failed(self, target: str, info: errors_pb2.ErrorInfo) -> str:
        """Record a failure at `target`; sleep the backoff and return the next target, or
        raise UnavailableError when the budget is spent."""
        now = time.monotonic()
        if self._outage_started is None:
            self._outage_started = now
        self._failures += 1
        elapsed = now - self._outage_started
        log.debug(
            "%s stream at %s failed (%s: %s); failure %d",
            self._name,
            target,
            code_name(info.code),
            info.message,
            self._failures,
        )
        if self._failures >= self._client.max_attempts or elapsed >= self._client.timeout_s:
            raise _exhausted(
                self._name, self._failures, elapsed, self._client, error_for(info), target
            )
        router = self._client._router
        hint = info.leader_hint if info.code == E.NOT_LEADER else ""
        if hint and hint != target and self._client._can_open(hint):
            router.set_leader(hint)
            next_target = hint
        else:
            next_target = router.failed(target)
        remaining = self._client.timeout_s - elapsed
        await asyncio.sleep(self._backoff.next_delay(remaining))
        return next_target


def _exhausted(
    name: str,
    attempts: int,
    elapsed_s: float,
    client: CoordinatorClient,
    last: RaftwalError | None,
    last_target: str,
) -> UnavailableError:
    code = last.info.code if last is not None else E.UNAVAILABLE
    limits = (
        f"{attempts} attempt(s) in {elapsed_s:.1f} s (max_attempts {client.max_attempts}, "
        f"timeout_s {client.timeout_s:g})"
    )
    if last is not None and code == E.UNAVAILABLE:
        # Nobody there: say where we tried and why it failed, in one sentence.
        message = (
            f"{name}: no node answered; {last_target}: {last.info.message}; gave up after {limits}"
        )
    elif last is not None:
        message = (
            f"{name} gave up after {limits}; last error from {last_target}: "
            f"{code_name(last.info.code)}: {last.info.message}"
        )
    else:
        message = f"{name} gave up after {limits} without reaching a node"
    info = error_info(code, message, leader_hint=last.info.leader_hint if last is not None else "")
    if code == E.UNAVAILABLE:
        return UnreachableError(info, last)
    if code == E.ON_SHUTDOWN:
        return OnShutdownError(info, last)
    return UnavailableError(info, last)


# ---------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------


class CoordinatorClient:
    """Asyncio client of a raftwal cluster. Use it from one event loop; ``close()`` it (or
    ``async with``) when done. See the module docstring for routing and retry rules."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout_s: float = 10.0,
        max_attempts: int = 8,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        channel_options: Sequence[tuple[str, Any]] = (),
        security: ClientSecurity | None = None,
        watch_idle_timeout_s: float = DEFAULT_WATCH_IDLE_TIMEOUT_S,
        coalesce_writes: bool = True,
        max_writes_in_flight: int = 2,
        max_batch_ops: int = 256,
    ) -> None:
        _check_positive("timeout_s", timeout_s)
        if not 1 <= max_writes_in_flight <= 64:
            raise _invalid(f"invalid max_writes_in_flight ({max_writes_in_flight}; expected 1..64)")
        if not 1 <= max_batch_ops <= 1024:
            raise _invalid(f"invalid max_batch_ops ({max_batch_ops}; expected 1..1024)")
        _check_positive("attempt_timeout_s", attempt_timeout_s)
        _check_positive("watch_idle_timeout_s", watch_idle_timeout_s)
        _check_positive("backoff_initial_s", backoff_initial_s)
        if backoff_max_s < backoff_initial_s:
            raise _invalid(
                f"invalid backoff_max_s ({backoff_max_s}; expected >= backoff_initial_s "
                f"{backoff_initial_s})"
            )
        if not 1 <= max_attempts <= 1000:
            raise _invalid(f"invalid max_attempts ({max_attempts}; expected 1..1000)")
        self.endpoints = parse_endpoints(endpoints)
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.attempt_timeout_s = attempt_timeout_s
        self.watch_idle_timeout_s = watch_idle_timeout_s
        self._channel_options = list(channel_options)
        # TLS, client certificate and token of every channel (see the module docstring).
        self.security = ClientSecurity.from_env() if security is None else security
        for endpoint in self.endpoints:
            # Fails now, not at the first call, on a token that would go out in cleartext.
            self.security.credentials(endpoint)
        self._router = _Router(self.endpoints)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, coordinator_pb2_grpc.CoordinatorStub] = {}
        self._keepers: set[LeaseKeeper] = set()
        self._closed = False
        self._writes = _WriteCoalescer(self, max_writes_in_flight, max_batch_ops)
        self._coalesce_writes = coalesce_writes

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop lease keepers and close every channel (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for keeper in list(self._keepers):
            await keeper.stop()
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close(grace=CLOSE_GRACE_S)

    @property
    def leader(self) -> str | None:
        """The gRPC address of the node believed to be the Raft leader, if any."""
        return self._router.leader

    def _can_open(self, target: str) -> bool:
        return target in self._channels or len(self._channels) < MAX_CHANNELS

    def _stub(self, target: str) -> coordinator_pb2_grpc.CoordinatorStub:
        if self._closed:
            raise ClientClosedError(error_info(E.ON_SHUTDOWN, "the CoordinatorClient is closed"))
        stub = self._stubs.get(target)
        if stub is None:
            # Channels are created lazily, inside the running loop that will use them.
            channel = self.security.aio_channel(target, self._channel_options)
            self._channels[target] = channel
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            self._stubs[target] = stub
        return stub

    # -- retry engine ---------------------------------------------------------------

    async def _with_retries(
        self,
        name: str,
        attempt: Callable[[str, float], Awaitable[T]],
        *,
        extra_wait_s: float = 0.0,
    ) -> T:
        """Run `attempt(target, attempt_timeout_s)` until it succeeds, a non-retryable
        error occurs, or ``max_attempts`` / ``timeout_s + extra_wait_s`` run out."""
        started = time.monotonic()
        deadline = started + self.timeout_s + extra_wait_s
        backoff = _Backoff(self.backoff_initial_s, self.backoff_max_s)
        target = self._router.first()
        last: RaftwalError | None = None
        last_target = target
        attempts = 0
        followed_hint = False
        while attempts < self.max_attempts:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            try:
                result = await attempt(
                    target, min(remaining, self.attempt_timeout_s + extra_wait_s)
                )
            except (grpc.aio.AioRpcError, _RetryableFailure) as error:
                if isinstance(error, _RetryableFailure):
                    info, retryable = error.info, True
                else:
                    info, retryable = classify(error)
                typed = error_for(info)
                if not retryable:
                    raise typed from None
                last, last_target = typed, target
                log.debug("%s attempt %d at %s failed: %s", name, attempts, target, typed)
                hint = info.leader_hint if info.code == E.NOT_LEADER else ""
                if hint and hint != target and self._can_open(hint):
                    self._router.set_leader(hint)
                    if not followed_hint:
                        # The leader is known: go there at once. A second hint in a row
                        # (nodes disagreeing during an election) waits for the backoff.
                        followed_hint = True
                        target = hint
                        continue
                    next_target = hint
                else:
                    next_target = self._router.failed(target)
                followed_hint = False
                target = next_target
                await asyncio.sleep(backoff.next_delay(deadline - time.monotonic()))
            else:
                self._router.succeeded(target)
                return result
        raise _exhausted(name, attempts, time.monotonic() - started, self, last, last_target)

    async def _unary(self, method: str, request: Any, *, extra_wait_s: float = 0.0) -> Any:
        async def attempt(target: str, timeout_s: float) -> Any:
            return await getattr(self._stub(target), method)(request, timeout=timeout_s)

        return await self._with_retries(method, attempt, extra_wait_s=extra_wait_s)

    async def _write(self, method: str, op: api.BatchWriteOp, request: Any) -> Any:
        """A lease or lock write: through the coalescer, or as its own RPC."""
        if not self._coalesce_writes:
            return await self._unary(method, request)
        return await self._writes.submit(method, op, request)

    @property
    def write_batches(self) -> tuple[int, int]:
        """(BatchWrite calls sent, writes they carried): how much coalescing happened."""
        return self._writes.batches, self._writes.batched_ops

    @staticmethod
    def _request_id(request_id: str) -> str:
        # One id per logical call, generated before the first attempt and reused by all.
        return request_id or uuid.uuid4().hex

    # -- channels -------------------------------------------------------------------

    async def create_channels(
        self,
        count: int = 0,
        prefix: str = "",
        names: Sequence[str] = (),
        replica_count: int = 0,
        owner: pb.OwnerDescription | None = None,
        *,
        request_id: str = "",
        wal: str = "",
        wal_config: Mapping[str, str] | None = None,
    ) -> api.CreateChannelsResponse:
        """Create pchannels by explicit `names`, or `count` new ones named ``<prefix>_<k>``,
        on the WAL implementation `wal` ("" = segments; "local", "jetstream" with its
        `wal_config`)."""
        request = api.CreateChannelsRequest(
            request_id=self._request_id(request_id),
            names=list(names),
            prefix=prefix,
            count=count,
            owner=owner,
            replica_count=replica_count,
            wal=wal,
            wal_config=dict(wal_config or {}),
        )
        return await self._unary("CreateChannels", request)

    async def drop_channels(
        self, names: Sequence[str], *, request_id: str = ""
    ) -> api.DropChannelsResponse:
        request = api.DropChannelsRequest(
            request_id=self._request_id(request_id), pchannels=list(names)
        )
        return await self._unary("DropChannels", request)

    async def describe_channels(
        self, names: Sequence[str] = (), linearizable: bool = True
    ) -> api.DescribeChannelsResponse:
        request = api.DescribeChannelsRequest(
            pchannels=list(names), consistency=_consistency(linearizable)
        )
        return await self._unary("DescribeChannels", request)

    async def list_channels(
        self, linearizable: bool = True, include_dropped: bool = False
    ) -> api.ListChannelsResponse:
        request = api.ListChannelsRequest(
            consistency=_consistency(linearizable), include_dropped=include_dropped
        )
        return await self._unary("ListChannels", request)

    async def create_vchannel(
        self,
        name: str,
        pchannel: str,
        owner: pb.OwnerDescription | None = None,
        *,
        request_id: str = "",
    ) -> api.CreateVChannelResponse:
        request = api.CreateVChannelRequest(
            request_id=self._request_id(request_id), name=name, pchannel=pchannel, owner=owner
        )
        return await self._unary("CreateVChannel", request)

    async def drop_vchannel(self, name: str, *, request_id: str = "") -> api.DropVChannelResponse:
        request = api.DropVChannelRequest(request_id=self._request_id(request_id), name=name)
        return await self._unary("DropVChannel", request)

    # Subscriptions (durable consumer groups; see rpc.streaming.subscription for the
    # consumer that resumes from and commits to one)

    async def create_subscription(
        self,
        name: str,
        vchannels: Sequence[str],
        *,
        start: str = "earliest",
        start_lsn: int = 0,
        start_time_tick: int = 0,
        holds_retention: bool = True,
        request_id: str = "",
    ) -> api.CreateSubscriptionResponse:
        """Create subscription `name` over `vchannels` (the same create again is a no-op).
        `start` ("earliest", "latest", "lsn" with `start_lsn`, "time_tick" with
        `start_time_tick`) is where consumers begin on a vchannel without a position."""
        starts = {
            "earliest": pb.SUBSCRIPTION_START_EARLIEST,
            "latest": pb.SUBSCRIPTION_START_LATEST,
            "lsn": pb.SUBSCRIPTION_START_LSN,
            "time_tick": pb.SUBSCRIPTION_START_TIME_TICK,
        }
        if start not in starts:
            raise _invalid(f"invalid start ({start!r}; expected one of {', '.join(starts)})")
        request = api.CreateSubscriptionRequest(
            request_id=self._request_id(request_id),
            name=name,
            vchannels=list(vchannels),
            start=starts[start],
            start_lsn=start_lsn,
            start_time_tick=start_time_tick,
            no_retention_hold=not holds_retention,
        )
        return await self._unary("CreateSubscription", request)

    async def drop_subscription(
        self, name: str, *, request_id: str = ""
    ) -> api.DropSubscriptionResponse:
        request = api.DropSubscriptionRequest(request_id=self._request_id(request_id), name=name)
        return await self._unary("DropSubscription", request)

    async def list_subscriptions(self, linearizable: bool = True) -> api.ListSubscriptionsResponse:
        request = api.ListSubscriptionsRequest(consistency=_consistency(linearizable))
        return await self._unary("ListSubscriptions", request)

    async def describe_subscription(
        self, name: str, linearizable: bool = True
    ) -> api.DescribeSubscriptionResponse:
        """The subscription with, per vchannel, its position and lag behind the committed
        log (NotFoundError when it does not exist)."""
        request = api.DescribeSubscriptionRequest(name=name, consistency=_consistency(linearizable))
        return await self._unary("DescribeSubscription", request)

    async def commit_subscription(
        self,
        name: str,
        positions: dict[str, tuple[int, int]],
        *,
        member_id: str = "",
        generation: int = 0,
        request_id: str = "",
    ) -> api.CommitSubscriptionResponse:
        """Commit {vchannel: (lsn, time_tick)}: everything up to each lsn was consumed.
        Positions move forward only (InvalidArgumentError otherwise; `seek_subscription`
        moves them back) and never past the committed log. While the subscription has
        members, name the member and its generation: a stale generation, a vchannel the
        member no longer holds or an ended lease raises ChannelFencedError."""
        request = api.CommitSubscriptionRequest(
            request_id=self._request_id(request_id),
            name=name,
            member_id=member_id,
            generation=generation,
            positions=[
                api.SubscriptionCommit(vchannel=vchannel, lsn=lsn, time_tick=tick)
                for vchannel, (lsn, tick) in sorted(positions.items())
            ],
        )
        return await self._unary("CommitSubscription", request)

    async def join_subscription(
        self, name: str, member_id: str, lease_id: int, *, request_id: str = ""
    ) -> api.JoinSubscriptionResponse:
        """Join subscription `name` as `member_id` for as long as lease `lease_id` lives;
        the coordinator then assigns the member vchannels with a generation (see
        ``describe_subscription(...).subscription.members``)."""
        request = api.JoinSubscriptionRequest(
            request_id=self._request_id(request_id),
            name=name,
            member_id=member_id,
            lease_id=lease_id,
        )
        return await self._unary("JoinSubscription", request)

    async def leave_subscription(
        self, name: str, member_id: str, *, request_id: str = ""
    ) -> api.LeaveSubscriptionResponse:
        request = api.LeaveSubscriptionRequest(
            request_id=self._request_id(request_id), name=name, member_id=member_id
        )
        return await self._unary("LeaveSubscription", request)

    async def seek_subscription(
        self,
        name: str,
        *,
        vchannel: str = "",
        lsn: int | None = None,
        time_tick: int | None = None,
        earliest: bool = False,
        latest: bool = False,
        request_id: str = "",
    ) -> api.SeekSubscriptionResponse:
        """Move the subscription (one vchannel, or all) to exactly one of: `lsn` (the next
        entry consumed), `time_tick` (the first entry at or after it), `earliest`,
        `latest` (after everything committed now)."""
        chosen = [
            name
            for name, given in (
                ("lsn", lsn is not None),
                ("time_tick", time_tick is not None),
                ("earliest", earliest),
                ("latest", latest),
            )
            if given
        ]
        if len(chosen) != 1:
            raise _invalid(
                f"invalid seek ({', '.join(chosen) or 'no target'}; expected exactly one of "
                "lsn, time_tick, earliest, latest)"
            )
        target = {
            "lsn": api.SEEK_TARGET_LSN,
            "time_tick": api.SEEK_TARGET_TIME_TICK,
            "earliest": api.SEEK_TARGET_EARLIEST,
            "latest": api.SEEK_TARGET_LATEST,
        }[chosen[0]]
        request = api.SeekSubscriptionRequest(
            request_id=self._request_id(request_id),
            name=name,
            vchannel=vchannel,
            target=target,
            lsn=lsn or 0,
            time_tick=time_tick or 0,
        )
        return await self._unary("SeekSubscription", request)

    async def watch_assignments(self) -> AsyncIterator[api.AssignmentDiscovery]:
        """Every assignment change, as the full assignment. After a stream failure it
        reconnects (another node when needed) and never yields a version <= the last one
        yielded, even when the new node lags behind the old one."""
        retry = _StreamRetry(self, "WatchAssignments")
        last_version = -1
        target = self._router.first()
        while True:
            call = self._stub(target).WatchAssignments(api.WatchAssignmentsRequest())
            info = error_info(E.ON_SHUTDOWN, f"{target} ended the WatchAssignments stream")
            try:
                async for discovery in read_stream(call, self.watch_idle_timeout_s):
                    if discovery.progress or discovery.version <= last_version:
                        continue
                    last_version = discovery.version
                    retry.progress()
                    self._router.succeeded(target)
                    yield discovery
            except STREAM_FAILURES as error:
                info, retryable = await stream_failure(error, call, target, "WatchAssignments")
                if not retryable:
                    raise error_for(info) from None
            except Exception as error:
                raise unexpected_loop_error("WatchAssignments", error) from error
            finally:
                call.cancel()
            target = await retry.failed(target, info)

    # -- leases and locks -----------------------------------------------------------

    async def grant_lease(
        self, ttl_ms: int, holder: str = "", *, request_id: str = ""
    ) -> api.GrantLeaseResponse:
        request = api.GrantLeaseRequest(
            request_id=self._request_id(request_id), ttl_ms=ttl_ms, holder=holder
        )
        return await self._write("GrantLease", api.BatchWriteOp(grant_lease=request), request)

    async def keep_alive(self, lease_id: int) -> api.KeepAliveResponse:
        """Renew a lease once (one request over a fresh KeepAlive stream). A repeat after an
        unknown outcome only renews again, so it is retried like a read."""
        request = api.KeepAliveRequest(lease_id=lease_id)

        async def attempt(target: str, timeout_s: float) -> api.KeepAliveResponse:
            call = self._stub(target).KeepAlive(timeout=timeout_s)
            try:
                await call.write(request)
                await call.done_writing()
                response = await call.read()
                if response is grpc.aio.EOF:
                    # The server closed without answering: a failed status raises here,
                    # an OK one is a node going away mid-call.
                    await call
                    raise _RetryableFailure(
                        error_info(E.ON_SHUTDOWN, f"{target} ended KeepAlive without an answer")
                    )
                return response
            finally:
                call.cancel()

        return await self._with_retries("KeepAlive", attempt)

    def lease_keeper(self, lease_id: int, interval_s: float | None = None) -> LeaseKeeper:
        """An async context manager that keeps `lease_id` alive in the background over one
        bidirectional KeepAlive stream (reconnecting on failure) until it exits. Entering
        renews once (raising e.g. NotFoundError for a lease that is gone); ``alive`` says
        whether the lease is still believed alive. `interval_s` defaults to a third of the
        lease's ttl."""
        return LeaseKeeper(self, lease_id, interval_s)

    async def revoke_lease(self, lease_id: int, *, request_id: str = "") -> api.RevokeLeaseResponse:
        request = api.RevokeLeaseRequest(request_id=self._request_id(request_id), lease_id=lease_id)
        return await self._write("RevokeLease", api.BatchWriteOp(revoke_lease=request), request)

    async def lock(
        self,
        key: str,
        lease_id: int,
        mode: str | int = "exclusive",
        wait_timeout_ms: int = 0,
        *,
        request_id: str = "",
    ) -> api.LockResponse:
        """Take `key` for `lease_id`. With ``wait_timeout_ms`` 0 a held key raises
        ResourceAcquiredError at once; otherwise the server waits up to that long."""
        _check_wait_ms("wait_timeout_ms", wait_timeout_ms)
        request = api.LockRequest(
            request_id=self._request_id(request_id),
            key=key,
            mode=_lock_mode(mode),  # type: ignore[arg-type]
            lease_id=lease_id,
            wait_timeout_ms=wait_timeout_ms,
        )
        if wait_timeout_ms:
            # A waiting lock holds its call open on the server: never part of a batch.
            return await self._unary("Lock", request, extra_wait_s=wait_timeout_ms / 1000)
        return await self._write("Lock", api.BatchWriteOp(lock=request), request)

    async def unlock(self, key: str, lease_id: int, *, request_id: str = "") -> api.UnlockResponse:
        request = api.UnlockRequest(
            request_id=self._request_id(request_id), key=key, lease_id=lease_id
        )
        return await self._write("Unlock", api.BatchWriteOp(unlock=request), request)

    # -- broadcasts -----------------------------------------------------------------

    async def broadcast(
        self,
        message: bytes | str,
        vchannels: Sequence[str],
        resource_keys: Iterable[tuple[str, str | int] | pb.ResourceKey] = (),
        msg_type: str = "",
        idempotency_key: str = "",
        lock_timeout_ms: int = 0,
        *,
        request_id: str = "",
    ) -> api.BroadcastResponse:
        """Broadcast `message` to `vchannels` under `resource_keys` ((key, "exclusive" |
        "shared") pairs)."""
        _check_wait_ms("lock_timeout_ms", lock_timeout_ms)
        keys = [
            key
            if isinstance(key, pb.ResourceKey)
            else pb.ResourceKey(key=key[0], mode=_lock_mode(key[1]))  # type: ignore[arg-type]
            for key in resource_keys
        ]
        request = api.BroadcastRequest(
            request_id=self._request_id(request_id),
            message=message.encode() if isinstance(message, str) else message,
            msg_type=msg_type,
            vchannels=list(vchannels),
            resource_keys=keys,
            idempotency_key=idempotency_key,
            lock_timeout_ms=lock_timeout_ms,
        )
        return await self._unary("Broadcast", request, extra_wait_s=lock_timeout_ms / 1000)

    async def ack(
        self, broadcast_id: int, vchannel: str, checkpoint: int, *, request_id: str = ""
    ) -> api.AckResponse:
        request = api.AckRequest(
            request_id=self._request_id(request_id),
            broadcast_id=broadcast_id,
            vchannel=vchannel,
            checkpoint=checkpoint,
        )
        return await self._unary("Ack", request)

    async def wait_resource_key(
        self, key: str, mode: str | int = "once", timeout_ms: int = 0
    ) -> api.WaitResourceKeyResponse:
        """Block until the broadcast holding `key` is acked at one ("once") or every ("all")
        vchannel, or `timeout_ms` passes (the response then says the task's state)."""
        _check_wait_ms("timeout_ms", timeout_ms)
        request = api.WaitResourceKeyRequest(
            key=key,
            mode=_wait_mode(mode),  # type: ignore[arg-type]
            timeout_ms=timeout_ms,
        )
        return await self._unary("WaitResourceKey", request, extra_wait_s=timeout_ms / 1000)

    # -- history, status, policy ----------------------------------------------------

    async def watch_events(
        self, from_revision: int = 1, kinds: Sequence[str] = ()
    ) -> AsyncIterator[pb.Event]:
        """Events from `from_revision` (1 = the whole retained history, 0 = only events
        after the call), then live. After a stream failure it resumes at the last yielded
        revision + 1 on another node, so nothing is skipped or repeated. Raises
        CompactedError when the history no longer holds the revision it needs."""
        if from_revision < 0:
            raise _invalid(f"invalid from_revision ({from_revision}; expected >= 0)")
        next_revision = from_revision
        if next_revision == 0:
            # The server resolves 0 against its own applied revision on every (re)connect,
            # which could skip events across a reconnect: pin "now" once, linearizably.
            next_revision = (await self.list_channels(linearizable=True)).revision + 1
        kind_list = list(kinds)
        retry = _StreamRetry(self, "WatchEvents")
        target = self._router.first()
        while True:
            request = api.WatchEventsRequest(from_revision=next_revision, kinds=kind_list)
            call = self._stub(target).WatchEvents(request)
            info = error_info(E.ON_SHUTDOWN, f"{target} ended the WatchEvents stream")
            try:
                async for response in read_stream(call, self.watch_idle_timeout_s):
                    for event in response.events:
                        # A node never sends an older revision on one stream; a misbehaving
                        # one must not make the caller see an event twice.
                        if event.revision < next_revision:
                            continue
                        next_revision = event.revision + 1
                        retry.progress()
                        yield event
                    # Progress past events a kinds filter skipped (empty responses).
                    if response.next_revision > next_revision:
                        next_revision = response.next_revision
                        retry.progress()
            except STREAM_FAILURES as error:
                info, retryable = await stream_failure(error, call, target, "WatchEvents")
                if not retryable:
                    raise error_for(info) from None
            except Exception as error:
                raise unexpected_loop_error("WatchEvents", error) from error
            finally:
                call.cancel()
            target = await retry.failed(target, info)

    async def alter_wal(
        self, target: str, config: Mapping[str, str] | None = None, *, request_id: str = ""
    ) -> api.AlterWalResponse:
        """Move every pchannel to the WAL implementation `target` online (AlterWAL); returns
        once the alter is recorded (epoch 0: nothing to move). Its progress is in
        `cluster_status().wal_alter` and each pchannel's `wal`."""
        request = api.AlterWalRequest(
            request_id=self._request_id(request_id), target=target, config=dict(config or {})
        )
        return await self._unary("AlterWal", request)

    async def cluster_status(self, linearizable: bool = True) -> api.ClusterStatusResponse:
        response: api.ClusterStatusResponse = await self._unary(
            "ClusterStatus", api.ClusterStatusRequest(consistency=_consistency(linearizable))
        )
        if response.leader_address and self._can_open(response.leader_address):
            self._router.set_leader(response.leader_address)
        return response

    async def set_balance_policy(
        self,
        allow_rebalance: bool,
        max_moves_per_round: int = 0,
        freeze: Sequence[str] = (),
        unfreeze: Sequence[str] = (),
        *,
        request_id: str = "",
    ) -> api.SetBalancePolicyResponse:
        request = api.SetBalancePolicyRequest(
            request_id=self._request_id(request_id),
            allow_rebalance=allow_rebalance,
            max_moves_per_round=max_moves_per_round,
            freeze_node_ids=list(freeze),
            unfreeze_node_ids=list(unfreeze),
        )
        return await self._unary("SetBalancePolicy", request)

    # -- cross-cluster replication --------------------------------------------------

    async def update_replicate_configuration(
        self, configuration: pb.ReplicateConfiguration, *, request_id: str = ""
    ) -> api.UpdateReplicateConfigurationResponse:
        """Replace the cluster's whole replication configuration (admin only): idempotent,
        and an empty one clears it. INVALID_ARGUMENT says what is wrong with it."""
        request = api.UpdateReplicateConfigurationRequest(
            request_id=self._request_id(request_id), configuration=configuration
        )
        return await self._unary("UpdateReplicateConfiguration", request)

    async def get_replicate_configuration(
        self, linearizable: bool = True
    ) -> api.GetReplicateConfigurationResponse:
        """The replication configuration (admin only), tokens redacted (`token_set` says
        where one is stored), and the answering cluster's id."""
        request = api.GetReplicateConfigurationRequest(consistency=_consistency(linearizable))
        return await self._unary("GetReplicateConfiguration", request)

    # -- Raft membership ------------------------------------------------------------

    async def change_membership(
        self, node_id: str, add: bool, *, timeout_ms: int = 0
    ) -> api.ChangeMembershipResponse:
        """Make `node_id` (a configured node) a Raft voter (`add`, it must be a caught-up
        data node) or a data node again (it must hold nothing: freeze it and wait first).
        Answered by the leader. Raises IgnoredOperationError when a precondition does not
        hold (the message says which); ``changed`` is False when the node had that role
        already, so a retry is safe."""
        request = api.ChangeMembershipRequest(
            node_id=node_id,
            action=api.MEMBERSHIP_ACTION_ADD if add else api.MEMBERSHIP_ACTION_REMOVE,
            timeout_ms=timeout_ms,
        )
        extra_wait_s = (timeout_ms or 10_000) / 1000
        return await self._unary("ChangeMembership", request, extra_wait_s=extra_wait_s)

    async def forget_node(self, node_id: str) -> api.ChangeMembershipResponse:
        """Forget `node_id` (MEMBERSHIP_ACTION_FORGET): a node that left the voters and
        holds nothing; its addresses leave the cluster's state and its heartbeats are
        refused until it is started again with --join. Raises IgnoredOperationError while
        it is a voter or holds something; ``changed`` is False when it was forgotten
        already, so a retry is safe."""
        request = api.ChangeMembershipRequest(node_id=node_id, action=api.MEMBERSHIP_ACTION_FORGET)
        response: api.ChangeMembershipResponse = await self._unary("ChangeMembership", request)
        return response

    async def list_members(self) -> api.ListMembersResponse:
        """The Raft voters as the leader's log has them, and whether a change is pending."""
        response: api.ListMembersResponse = await self._unary(
            "ListMembers", api.ListMembersRequest()
        )
        return response


# ---------------------------------------------------------------------------------------
# Lease keeper
# ---------------------------------------------------------------------------------------


class _WriteCoalescer:
    """Groups concurrent lease and lock writes of one client into ``BatchWrite`` calls.

    At most ``max_in_flight`` calls are on their way. A write that finds a free slot and
    nothing queued leaves at once as its own RPC (a lone caller's latency is unchanged);
    otherwise it queues, and every freed slot takes up to ``max_batch_ops`` queued writes
    as one ``BatchWrite`` (group commit one level above the node's). A caller cancelled
    while its write is still queued takes it out; once sent, a write cannot be recalled.
    """

    def __init__(self, client: CoordinatorClient, max_in_flight: int, max_batch_ops: int) -> None:
        self._client = client
        self._max_in_flight = max_in_flight
        self._max_batch_ops = max_batch_ops
        self._queue: collections.deque[tuple[api.BatchWriteOp, asyncio.Future[Any]]] = (
            collections.deque()
        )
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.batched_ops = 0

    async def submit(self, method: str, op: api.BatchWriteOp, request: Any) -> Any:
        if self._in_flight < self._max_in_flight and not self._queue:
            self._in_flight += 1
            try:
                return await self._client._unary(method, request)
            finally:
                self._in_flight -= 1
                self._flush()
        if len(self._queue) >= MAX_QUEUED_WRITES:
            raise error_for(
                error_info(
                    E.RESOURCE_EXHAUSTED,
                    f"too many queued writes ({len(self._queue)}; at most {MAX_QUEUED_WRITES})",
                )
            )
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((op, future))
        self._flush()
        return await future

    def _flush(self) -> None:
        while self._queue and self._in_flight < self._max_in_flight:
            batch: list[tuple[api.BatchWriteOp, asyncio.Future[Any]]] = []
            while self._queue and len(batch) < self._max_batch_ops:
                op, future = self._queue.popleft()
                if not future.done():  # done = its caller was cancelled
                    batch.append((op, future))
            if not batch:
                continue
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[api.BatchWriteOp, asyncio.Future[Any]]]) -> None:
        try:
            request = api.BatchWriteRequest(ops=[op for op, _ in batch])
            self.batches += 1
            self.batched_ops += len(batch)
            try:
                response = await self._client._unary("BatchWrite", request)
            except Exception as error:  # noqa: BLE001 (handed to every caller of the batch)
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                return
            if len(response.results) != len(batch):
                error = error_for(
                    error_info(
                        E.INNER,
                        f"BatchWrite of {len(batch)} ops answered with "
                        f"{len(response.results)} results",
                    )
                )
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                return
            for (_, future), result in zip(batch, response.results, strict=True):
                if future.done():
                    continue
                if result.error.code != E.OK:
                    future.set_exception(error_for(result.error))
                else:
                    kind = result.WhichOneof("reply")
                    future.set_result(getattr(result, kind) if kind else None)
        finally:
            self._in_flight -= 1
            self._flush()


class LeaseKeeper:
    """Keeps one lease alive from a background task over one KeepAlive stream.

    ``alive`` is conservative: the lease is *believed alive* until the local monotonic time
    of the last successful renewal's request plus the ttl the leader reported (measured from
    the request, not the answer, so the estimate errs towards "expired" and needs no clock
    agreement). When renewals fail, the keeper reconnects (next node, backoff with jitter)
    and keeps trying for ``timeout_s`` of the client past that deadline: a renewal that
    succeeds late proves the lease never expired on the server (across a leader failover
    the new leader extends every lease), and ``alive`` becomes True again. It gives up for
    good (``lost_error`` set, ``wait_lost`` returns) when the server no longer knows the
    lease (NOT_FOUND), on any other non-retryable answer, or when that grace runs out.
    Renewals are bounded by that grace; the keeper never revokes.

    Every way a stream can end is a reason to reconnect, not to stop: a failed status, an
    end without one (EOF), a write on a stream the server already finished (its node was
    killed or restarted: ``InvalidStateError``), a call cancelled under the keeper, a node
    that stopped answering (SIGSTOP). Anything else that would end the background task
    (an exception no rule covers, a cancel without ``stop()``, the client closed) marks the
    lease lost, so the keeper never dies quietly while a holder waits on ``wait_lost()``.
    """

    def __init__(self, client: CoordinatorClient, lease_id: int, interval_s: float | None) -> None:
        if interval_s is not None:
            _check_positive("interval_s", interval_s)
        self._client = client
        self.lease_id = lease_id
        self._interval_s = interval_s
        self._deadline = 0.0
        self._lost: RaftwalError | None = None
        self._lost_at: float | None = None
        self._lost_event = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.renewals = 0
        self.last_response: api.KeepAliveResponse | None = None

    @property
    def alive(self) -> bool:
        """True while the lease is believed alive (renewed in time and never refused)."""
        return self._lost is None and time.monotonic() < self._deadline

    @property
    def lost_error(self) -> RaftwalError | None:
        """Why the keeper gave up on the lease, once it has."""
        return self._lost

    @property
    def believed_until(self) -> float:
        """The believed deadline (``time.monotonic()`` clock): the lease is believed alive
        before it unless lost. It only moves forward."""
        return self._deadline

    @property
    def lost_at(self) -> float | None:
        """When the keeper gave up on the lease (``time.monotonic()`` clock), if it has."""
        return self._lost_at

    @property
    def remaining_s(self) -> float:
        """Seconds until the believed deadline (0 when lost or past it)."""
        return 0.0 if self._lost is not None else max(0.0, self._deadline - time.monotonic())

    async def wait_lost(self, timeout_s: float | None = None) -> bool:
        """Wait until the keeper gives up on the lease (True) or `timeout_s` passes (False)."""
        return await wait_event(self._lost_event, timeout_s)

    async def start(self) -> LeaseKeeper:
        """Renew once (raising the error when that fails) and start the background task."""
        if self._task is not None:
            return self
        sent = time.monotonic()
        response = await self._client.keep_alive(self.lease_id)
        self._renewed(sent, response)
        self._client._keepers.add(self)
        self._task = asyncio.create_task(self._run(), name=f"raftwal-lease-{self.lease_id}")
        self._task.add_done_callback(self._task_done)
        return self

    def _task_done(self, task: asyncio.Task[None]) -> None:
        # The backstop of _run's own handlers: a task cancelled before it first ran never
        # reached them.
        if self._stopping.is_set() or self._lost is not None:
            return
        reason = "was cancelled without stop()" if task.cancelled() else "ended"
        self._lose(
            OnShutdownError(
                error_info(E.ON_SHUTDOWN, f"the keeper of lease {self.lease_id} {reason}")
            )
        )

    async def stop(self) -> None:
        """Stop renewing (idempotent). The lease then expires after its ttl unless revoked."""
        self._stopping.set()
        task, self._task = self._task, None
        self._client._keepers.discard(self)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> LeaseKeeper:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    def _renewed(self, sent: float, response: api.KeepAliveResponse) -> None:
        if time.monotonic() >= self._deadline > 0:
            log.info("lease %d renewed after its believed deadline", self.lease_id)
        self._deadline = max(self._deadline, sent + response.ttl_ms / 1000)
        self.renewals += 1
        self.last_response = response
        if self._interval_s is None:
            # Three renewals per ttl: two may fail before the lease is believed lost.
            self._interval_s = max(0.05, response.ttl_ms / 3000)

    def _lose(self, error: RaftwalError) -> None:
        if self._lost is None:
            log.warning("lease %d is lost: %s", self.lease_id, error)
            self._lost = error
            self._lost_at = time.monotonic()
            self._lost_event.set()

    async def _sleep_or_stop(self, seconds: float) -> None:
        await wait_event(self._stopping, seconds)

    async def _run(self) -> None:
        # Nothing may end the keeper quietly: whatever stops it short of stop() marks the
        # lease lost, so that a holder waiting on wait_lost() stops using what it guards.
        try:
            await self._renew_until_stopped()
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                self._lose(
                    OnShutdownError(
                        error_info(
                            E.ON_SHUTDOWN,
                            f"the keeper of lease {self.lease_id} was cancelled without stop()",
                        )
                    )
                )
            raise
        except RaftwalError as error:
            self._lose(error)
        except Exception as error:  # noqa: BLE001 (reported: lost_error, wait_lost, the log)
            self._lose(unexpected_loop_error(f"the keeper of lease {self.lease_id}", error))

    async def _renew_until_stopped(self) -> None:
        client = self._client
        backoff = _Backoff(client.backoff_initial_s, client.backoff_max_s)
        target = client._router.first()
        request = api.KeepAliveRequest(lease_id=self.lease_id)
        interval_s = self._interval_s or 0.05
        # An answer normally takes one commit (milliseconds). Waiting longer than an
        # interval for it would spend the lease on a node that may be stuck forwarding to a
        # dead leader; asking another node is cheap (a duplicate renewal is harmless).
        answer_within_s = min(client.attempt_timeout_s, max(interval_s, 0.2))
        await self._sleep_or_stop(interval_s)
        while not self._stopping.is_set():
            info = error_info(E.ON_SHUTDOWN, f"{target} ended the KeepAlive stream")
            call = client._stub(target).KeepAlive()
            try:
                while not self._stopping.is_set():
                    sent = time.monotonic()
                    # A write on a stream the server has finished meanwhile (its node was
                    # killed or restarted during the sleep) raises InvalidStateError.
                    await wait_within(call.write(request), answer_within_s)
                    response = await wait_within(call.read(), answer_within_s)
                    if response is grpc.aio.EOF:
                        break
                    self._renewed(sent, response)
                    backoff.reset()
                    client._router.succeeded(target)
                    await self._sleep_or_stop(interval_s)
            except STREAM_FAILURES as error:
                info, retryable = await stream_failure(error, call, target, "KeepAlive")
                if not retryable:
                    self._lose(error_for(info))
                    return
            finally:
                call.cancel()
            if self._stopping.is_set():
                return
            give_up_in_s = self._deadline + client.timeout_s - time.monotonic()
            if give_up_in_s <= 0:
                self._lose(
                    UnavailableError(
                        error_info(
                            info.code,
                            f"lease {self.lease_id} could not be renewed within "
                            f"{client.timeout_s:g} s after its believed deadline (last error "
                            f"from {target}: {code_name(info.code)}: {info.message})",
                        ),
                        error_for(info),
                    )
                )
                return
            log.debug(
                "KeepAlive for lease %d at %s failed: %s", self.lease_id, target, info.message
            )
            hint = info.leader_hint if info.code == E.NOT_LEADER else ""
            if hint and hint != target and client._can_open(hint):
                client._router.set_leader(hint)
                target = hint
            else:
                target = client._router.failed(target)
            await self._sleep_or_stop(backoff.next_delay(give_up_in_s))
