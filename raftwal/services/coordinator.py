"""The public ``Coordinator`` gRPC service: validate, propose, map outcomes to statuses.

No business logic lives here: the state machine decides, this module only checks the
request's shape (sizes, enum values, waits), turns it into commands for the
``CoordinationBackend`` (which the node wires to Raft), and answers with the result or a
gRPC status carrying an ``ErrorInfo``. Waiting calls (Lock/Broadcast with a wait,
WaitResourceKey, streams) are bounded by the backend's ``max_wait_ms`` and by the client's
lifetime.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

import grpc

from raftwal.services.callers import caller_identity
from raftwal.services.common import fail
from rpc.errors import RaftwalError, error_info, to_status
from rpc.placement import address_for
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from statemachine.evolve import EVENT_KINDS
from statemachine.replicate import redacted, redacted_event
from statemachine.state import restore_state, snapshot_state
from statemachine.types import DEFAULT_LIMITS as LIMITS
from statemachine.validation import check_name
from wal_segments.owner import TICK_LOGICAL_BITS
from wal_segments.walimpls import registry as wal_registry
from wal_segments.walimpls.api import ConfigError

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

MAX_NAMES_PER_REQUEST = 1024
REQUEST_ID_MAX_CHARS = 128
# Upper bound of attempts for a waiting Lock/Broadcast (each attempt waits for a change).
MAX_WAIT_ATTEMPTS = 10_000
# Streams wake up at least this often to notice cancelled clients and shutdown.
STREAM_POLL_S = 1.0
# A watch stream silent this long gets a progress notification, so clients can tell a
# quiet node from a stopped one (see WatchAssignmentsRequest in coordinator.proto).
WATCH_PROGRESS_S = 1.0
# A node that has known no Raft leader this long ends its watch streams (NOT_LEADER): it
# is cut off from the majority and its view may be stale. Above an election (0.4-1.2 s
# by default, a few rounds when votes split) and about the coordinator's node timeout.
WATCH_LEADERLESS_S = 3.0
EVENT_BATCH = 500
# Ops of one BatchWrite.
MAX_BATCH_OPS = 1024
# How long a membership change may take to commit (ChangeMembershipRequest.timeout_ms).
DEFAULT_MEMBERSHIP_TIMEOUT_MS = 10_000
MAX_MEMBERSHIP_TIMEOUT_MS = 60_000


class CompactedHistory(Exception):
    """Raised by ``CoordinationBackend.events_from`` for a revision no longer retained."""

    def __init__(self, requested: int, first_retained: int) -> None:
        self.requested = requested
        self.first_retained = first_retained
        super().__init__(
            f"revision {requested} was compacted (history starts at revision {first_retained})"
        )


class CoordinationBackend(Protocol):
    """What the servicer needs from the node. Errors: ``RaftwalError`` (NOT_LEADER,
    ON_SHUTDOWN, UNKNOWN for an unknown outcome...) from ``propose``/``read``."""

    max_wait_ms: int
    # This cluster's id ([cluster] cluster_id; "" when unset): stamped on replication
    # configuration updates, which must list it.
    cluster_id: str

    def caller_name(self, identity: str) -> str:
        """The name a caller's identity (``callers.caller_identity``) has in the
        coordination state (``callers.identity_name``): stamped on GrantLease, whose
        per-identity budgets the state machine decides."""
        ...

    async def propose(self, command: pb.Command) -> pb.CommandResult:
        """Replicate `command` (request id and time are stamped here if missing) and return
        its result; rejections come back inside the result, not as exceptions."""
        ...

    async def propose_batch(self, commands: list[pb.Command]) -> list[pb.CommandResult]:
        """Replicate `commands` as one Raft entry, applied in order; one result each
        (rejections inside the results)."""
        ...

    async def read(
        self, reader: Callable[[pb.CoordinationState], T], linearizable: bool
    ) -> tuple[T, int]:
        """(reader(state), revision). Linearizable reads reflect every write acknowledged
        before the call; serializable ones this node's applied state."""
        ...

    async def wait_change(self, timeout_s: float) -> None:
        """Return when this node applies a new command, or after `timeout_s`."""
        ...

    def events_from(self, from_revision: int, limit: int) -> list[pb.Event]:
        """Events with revision >= from_revision; raises CompactedHistory."""
        ...

    def applied_revision(self) -> int: ...

    def leaderless_s(self) -> float:
        """Seconds this node has gone without knowing a Raft leader (0.0 while it knows one)."""
        ...

    async def cluster_status(self, linearizable: bool) -> api.ClusterStatusResponse: ...

    async def latest_position(self, pchannel: str) -> tuple[int, int]:
        """(committed LSN, latest time tick) of `pchannel`, asked of its owner; raises
        RaftwalError (CHANNEL_NOT_EXIST, NOT_OWNER, UNAVAILABLE...) when no owner answers."""
        ...

    async def change_membership(
        self, node_id: str, add: bool, timeout_s: float
    ) -> tuple[list[str], bool]:
        """Make `node_id` a Raft voter (`add`) or a data node; (voters after it, changed).
        Raises RaftwalError (NOT_LEADER, NOT_FOUND, IGNORED_OPERATION when a precondition
        does not hold, UNKNOWN when the outcome is unknown)."""
        ...

    async def forget_node(self, node_id: str) -> bool:
        """Forget `node_id`, a node that left the voters and holds nothing (RemoveNode);
        False when it was forgotten already. Raises RaftwalError (NOT_LEADER, NOT_FOUND,
        IGNORED_OPERATION when a precondition does not hold)."""
        ...

    def list_members(self) -> api.ListMembersResponse:
        """The leader's voter set; raises RaftwalError NOT_LEADER on another node."""
        ...


def _check_request_id(request_id: str) -> None:
    if len(request_id) > REQUEST_ID_MAX_CHARS:
        raise fail(
            E.INVALID_ARGUMENT,
            f"request_id too long ({len(request_id)} chars; expected at most "
            f"{REQUEST_ID_MAX_CHARS})",
        )


def _check_count(field: str, count: int, low: int = 1, high: int = MAX_NAMES_PER_REQUEST) -> None:
    if count < low or count > high:
        raise fail(
            E.INVALID_ARGUMENT, f"invalid number of {field} ({count}; expected {low}..{high})"
        )


def _check_wait(field: str, value: int, max_wait_ms: int) -> None:
    if value < 0 or value > max_wait_ms:
        raise fail(E.INVALID_ARGUMENT, f"invalid {field} ({value}; expected 0..{max_wait_ms})")


SEEK_TARGETS = {
    api.SEEK_TARGET_EARLIEST: "EARLIEST",
    api.SEEK_TARGET_LATEST: "LATEST",
    api.SEEK_TARGET_LSN: "LSN",
    api.SEEK_TARGET_TIME_TICK: "TIME_TICK",
}


def _copy_subscription(found: pb.Subscription) -> pb.Subscription:
    copy = pb.Subscription()
    copy.CopyFrom(found)
    return copy


def _subscription_reader(name: str) -> Callable[[pb.CoordinationState], pb.Subscription]:
    def reader(state: pb.CoordinationState) -> pb.Subscription:
        found = state.subscriptions.get(name)
        return _copy_subscription(found) if found is not None else pb.Subscription()

    return reader


def _pchannels_of(vchannels: list[str]) -> Callable[[pb.CoordinationState], dict[str, str]]:
    def reader(state: pb.CoordinationState) -> dict[str, str]:
        return {v: state.vchannels[v].pchannel for v in vchannels if v in state.vchannels}

    return reader


def _raise_rejection(result: pb.CommandResult) -> pb.CommandResult:
    if result.rejection.code != E.OK:
        raise RaftwalError(result.rejection)
    return result


def _new_request_id(given: str) -> str:
    _check_request_id(given)
    return given or uuid.uuid4().hex


def assignment_view(state: pb.CoordinationState) -> api.AssignmentDiscovery:
    """The full assignment (without version) as clients see it."""
    view = api.AssignmentDiscovery()
    vchannels: dict[str, list[str]] = {}
    for name in sorted(state.vchannels):
        vchannel = state.vchannels[name]
        if vchannel.state == pb.VCHANNEL_STATE_NORMAL:
            vchannels.setdefault(vchannel.pchannel, []).append(name)
    for node_id in sorted(state.nodes):
        node = state.nodes[node_id]
        view.nodes.add(
            node_id=node_id,
            address=node.address,
            state=node.state,
            worker_addresses=node.worker_addresses,
        )

    def serving(node_id: str, pchannel: str) -> str:
        # The node's data worker for the pchannel (rpc.placement), or "" when unknown.
        node = state.nodes.get(node_id)
        if node is None:
            return ""
        return address_for(node.address, node.worker_addresses, pchannel)

    for name in sorted(state.pchannels):
        channel = state.pchannels[name]
        if channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        view.channels.add(
            pchannel=name,
            term=channel.term,
            owner_node_id=channel.owner_node_id,
            owner_address=serving(channel.owner_node_id, name),
            state=channel.state,
            access_mode=channel.access_mode,
            replica_node_ids=channel.replica_node_ids,
            vchannels=vchannels.get(name, []),
            replica_addresses=[serving(node_id, name) for node_id in channel.replica_node_ids],
        )
    return view


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, backend: CoordinationBackend) -> None:
        self._backend = backend

    # -- plumbing ---------------------------------------------------------------------

    async def _call(self, context: grpc.aio.ServicerContext, work: Awaitable[T]) -> T:
        try:
            return await work
        except RaftwalError as error:
            await context.abort_with_status(to_status(error.info))
        except CompactedHistory as error:
            await context.abort_with_status(
                to_status(error_info(E.COMPACTED, str(error), first_available=error.first_retained))
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            # The node must survive whatever a request triggers: report, never crash.
            log.exception("internal error while serving a Coordinator request")
            await context.abort_with_status(
                to_status(error_info(E.INNER, "internal error (see the node's log)"))
            )
        raise AssertionError("unreachable: abort_with_status raises")

    async def _propose(self, request_id: str, **body: object) -> pb.CommandResult:
        command = pb.Command(request_id=request_id, **body)  # type: ignore[arg-type]
        return _raise_rejection(await self._backend.propose(command))

    async def _propose_waiting(
        self, request_id: str, wait_ms: int, keys: list[str], **body: object
    ) -> pb.CommandResult:
        """Propose; while the answer is RESOURCE_ACQUIRED and time remains, wait until one
        of `keys` changes hands in this node's applied state and try again (each attempt
        its own request id). Waiting on the keys, not on any change, keeps many waiters
        from re-proposing on every unrelated write."""
        deadline = time.monotonic() + wait_ms / 1000

        def holders(state: pb.CoordinationState) -> bytes:
            held = pb.CoordinationState()
            for key in keys:
                if key in state.locks:
                    held.locks[key].CopyFrom(state.locks[key])
            return held.SerializeToString(deterministic=True)

        for attempt in range(MAX_WAIT_ATTEMPTS):
            attempt_id = request_id if attempt == 0 else f"{request_id}.{attempt}"
            command = pb.Command(request_id=attempt_id, **body)  # type: ignore[arg-type]
            result = await self._backend.propose(command)
            if result.rejection.code != E.RESOURCE_ACQUIRED:
                return _raise_rejection(result)
            seen, _ = await self._backend.read(holders, linearizable=False)
            # Retry when the keys change hands, and at least once per poll interval (the
            # release may have been applied here before `seen` was read).
            poll_until = time.monotonic() + STREAM_POLL_S
            while seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return _raise_rejection(result)
                if time.monotonic() >= poll_until:
                    break
                await self._backend.wait_change(min(remaining, poll_until - time.monotonic()))
                now, _ = await self._backend.read(holders, linearizable=False)
                if now != seen:
                    break
            if deadline - time.monotonic() <= 0:
                return _raise_rejection(result)
        raise fail(E.RESOURCE_ACQUIRED, f"gave up after {MAX_WAIT_ATTEMPTS} attempts")

    # -- channels ---------------------------------------------------------------------

    async def CreateChannels(self, request, context):
        async def work() -> api.CreateChannelsResponse:
            request_id = _new_request_id(request.request_id)
            _check_count("names", len(request.names), 0)
            try:
                wal_config = wal_registry.validate(request.wal, request.wal_config)
            except ConfigError as error:
                raise fail(E.INVALID_ARGUMENT, str(error)) from None
            result = await self._propose(
                request_id,
                create_pchannels=pb.CreatePChannels(
                    names=request.names,
                    prefix=request.prefix,
                    count=request.count,
                    owner=request.owner,
                    replica_count=request.replica_count,
                    wal=request.wal,
                    wal_config=wal_config,
                ),
            )
            return api.CreateChannelsResponse(
                pchannels=result.pchannel_names, revision=result.revision
            )

        return await self._call(context, work())

    async def DropChannels(self, request, context):
        async def work() -> api.DropChannelsResponse:
            request_id = _new_request_id(request.request_id)
            _check_count("pchannels", len(request.pchannels))
            revision = 0
            for index, name in enumerate(request.pchannels):
                result = await self._propose(
                    f"{request_id}.{index}", drop_pchannel=pb.DropPChannel(pchannel=name)
                )
                revision = result.revision
            return api.DropChannelsResponse(revision=revision)

        return await self._call(context, work())

    def _channels_reader(
        self, names: list[str], include_dropped: bool
    ) -> Callable[[pb.CoordinationState], tuple[list[pb.PChannel], list[pb.VChannel]]]:
        def reader(state: pb.CoordinationState) -> tuple[list[pb.PChannel], list[pb.VChannel]]:
            wanted = names or sorted(state.pchannels)
            pchannels: list[pb.PChannel] = []
            for name in wanted:
                channel = state.pchannels.get(name)
                if channel is None:
                    raise fail(E.CHANNEL_NOT_EXIST, f"pchannel {name[:64]!r} does not exist")
                if channel.state == pb.PCHANNEL_STATE_DROPPED and not (include_dropped or names):
                    continue
                copy = pb.PChannel()
                copy.CopyFrom(channel)
                pchannels.append(copy)
            selected = {c.name for c in pchannels}
            vchannels = []
            for name in sorted(state.vchannels):
                vchannel = state.vchannels[name]
                if vchannel.pchannel in selected and (
                    include_dropped or vchannel.state == pb.VCHANNEL_STATE_NORMAL
                ):
                    copy_v = pb.VChannel()
                    copy_v.CopyFrom(vchannel)
                    vchannels.append(copy_v)
            return pchannels, vchannels

        return reader

    async def DescribeChannels(self, request, context):
        async def work() -> api.DescribeChannelsResponse:
            _check_count("pchannels", len(request.pchannels), 0)
            linearizable = _linearizable(request.consistency)
            (pchannels, vchannels), revision = await self._backend.read(
                self._channels_reader(list(request.pchannels), False), linearizable
            )
            return api.DescribeChannelsResponse(
                pchannels=pchannels, vchannels=vchannels, revision=revision
            )

        return await self._call(context, work())

    async def ListChannels(self, request, context):
        async def work() -> api.ListChannelsResponse:
            linearizable = _linearizable(request.consistency)
            (pchannels, vchannels), revision = await self._backend.read(
                self._channels_reader([], request.include_dropped), linearizable
            )
            return api.ListChannelsResponse(
                pchannels=pchannels, vchannels=vchannels, revision=revision
            )

        return await self._call(context, work())

    async def CreateVChannel(self, request, context):
        async def work() -> api.CreateVChannelResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id,
                create_vchannel=pb.CreateVChannel(
                    name=request.name, pchannel=request.pchannel, owner=request.owner
                ),
            )

            def reader(state: pb.CoordinationState) -> pb.VChannel:
                copy = pb.VChannel()
                if request.name in state.vchannels:
                    copy.CopyFrom(state.vchannels[request.name])
                return copy

            vchannel, _ = await self._backend.read(reader, linearizable=False)
            return api.CreateVChannelResponse(vchannel=vchannel, revision=result.revision)

        return await self._call(context, work())

    # Subscriptions

    async def CreateSubscription(self, request, context):
        async def work() -> api.CreateSubscriptionResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id,
                create_subscription=pb.CreateSubscription(
                    name=request.name,
                    vchannels=list(request.vchannels),
                    start=request.start,
                    start_lsn=request.start_lsn,
                    start_time_tick=request.start_time_tick,
                    no_retention_hold=request.no_retention_hold,
                ),
            )
            subscription, _ = await self._backend.read(
                _subscription_reader(request.name), linearizable=False
            )
            return api.CreateSubscriptionResponse(
                subscription=subscription, revision=result.revision
            )

        return await self._call(context, work())

    async def DropSubscription(self, request, context):
        async def work() -> api.DropSubscriptionResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id, drop_subscription=pb.DropSubscription(name=request.name)
            )
            return api.DropSubscriptionResponse(revision=result.revision)

        return await self._call(context, work())

    async def ListSubscriptions(self, request, context):
        async def work() -> api.ListSubscriptionsResponse:
            def reader(state: pb.CoordinationState) -> list[pb.Subscription]:
                return [
                    _copy_subscription(state.subscriptions[n]) for n in sorted(state.subscriptions)
                ]

            subscriptions, revision = await self._backend.read(
                reader, _linearizable(request.consistency)
            )
            return api.ListSubscriptionsResponse(subscriptions=subscriptions, revision=revision)

        return await self._call(context, work())

    async def DescribeSubscription(self, request, context):
        async def work() -> api.DescribeSubscriptionResponse:
            bad = check_name("subscription", request.name, LIMITS)
            if bad is not None:
                raise RaftwalError(bad.to_error_info())

            def reader(
                state: pb.CoordinationState,
            ) -> tuple[pb.Subscription | None, dict[str, str]]:
                found = state.subscriptions.get(request.name)
                if found is None:
                    return None, {}
                pchannels = {
                    v: state.vchannels[v].pchannel for v in found.vchannels if v in state.vchannels
                }
                return _copy_subscription(found), pchannels

            (subscription, pchannels), revision = await self._backend.read(
                reader, _linearizable(request.consistency)
            )
            if subscription is None:
                raise fail(E.NOT_FOUND, f"subscription {request.name!r} does not exist")
            latest: dict[str, tuple[int, int] | str] = {}
            for pchannel in sorted(set(pchannels.values())):
                try:
                    latest[pchannel] = await self._backend.latest_position(pchannel)
                except RaftwalError as error:
                    latest[pchannel] = f"{error.code_name}: {error.info.message}"[:300]
            lags = []
            for vchannel in subscription.vchannels:
                position = subscription.positions.get(vchannel)
                lag = api.SubscriptionLag(
                    vchannel=vchannel,
                    pchannel=pchannels.get(vchannel, ""),
                    position_lsn=position.lsn if position else 0,
                    position_time_tick=position.time_tick if position else 0,
                )
                answer = latest.get(lag.pchannel, "the vchannel was dropped")
                if isinstance(answer, str):
                    lag.error = answer
                else:
                    lag.committed_lsn, lag.latest_time_tick = answer
                    lag.lsn_lag = max(0, lag.committed_lsn - lag.position_lsn)
                    if lag.position_time_tick and lag.latest_time_tick:
                        lag.time_lag_ms = max(
                            0,
                            (lag.latest_time_tick >> TICK_LOGICAL_BITS)
                            - (lag.position_time_tick >> TICK_LOGICAL_BITS),
                        )
                lags.append(lag)
            return api.DescribeSubscriptionResponse(
                subscription=subscription, lags=lags, revision=revision
            )

        return await self._call(context, work())

    async def CommitSubscription(self, request, context):
        async def work() -> api.CommitSubscriptionResponse:
            request_id = _new_request_id(request.request_id)
            _check_count("positions", len(request.positions))
            pchannels, _ = await self._backend.read(
                _pchannels_of([p.vchannel for p in request.positions]), linearizable=False
            )
            revision = 0
            for index, position in enumerate(request.positions):
                pchannel = pchannels.get(position.vchannel)
                if pchannel is not None and position.lsn > 0:
                    committed, _ = await self._backend.latest_position(pchannel)
                    if position.lsn > committed:
                        raise fail(
                            E.INVALID_ARGUMENT,
                            f"invalid lsn for {position.vchannel!r} ({position.lsn}; expected "
                            f"<= {committed}, the committed LSN of {pchannel})",
                        )
                result = await self._propose(
                    f"{request_id}.{index}",
                    commit_subscription_position=pb.CommitSubscriptionPosition(
                        name=request.name,
                        vchannel=position.vchannel,
                        lsn=position.lsn,
                        time_tick=position.time_tick,
                        member_id=request.member_id,
                        generation=request.generation,
                    ),
                )
                revision = result.revision
            return api.CommitSubscriptionResponse(revision=revision)

        return await self._call(context, work())

    async def JoinSubscription(self, request, context):
        async def work() -> api.JoinSubscriptionResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id,
                join_subscription=pb.JoinSubscription(
                    name=request.name, member_id=request.member_id, lease_id=request.lease_id
                ),
            )
            subscription, _ = await self._backend.read(
                _subscription_reader(request.name), linearizable=False
            )
            member = subscription.members.get(request.member_id, pb.SubscriptionMember())
            return api.JoinSubscriptionResponse(member=member, revision=result.revision)

        return await self._call(context, work())

    async def LeaveSubscription(self, request, context):
        async def work() -> api.LeaveSubscriptionResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id,
                leave_subscription=pb.LeaveSubscription(
                    name=request.name, member_id=request.member_id
                ),
            )
            return api.LeaveSubscriptionResponse(revision=result.revision)

        return await self._call(context, work())

    async def SeekSubscription(self, request, context):
        async def work() -> api.SeekSubscriptionResponse:
            request_id = _new_request_id(request.request_id)
            target = request.target
            if target not in SEEK_TARGETS:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid target ({target}; expected one of {', '.join(SEEK_TARGETS.values())})",
                )
            if target == api.SEEK_TARGET_LSN and request.lsn < 1:
                raise fail(E.INVALID_ARGUMENT, f"invalid lsn ({request.lsn}; expected >= 1)")
            if target == api.SEEK_TARGET_TIME_TICK and request.time_tick < 1:
                raise fail(
                    E.INVALID_ARGUMENT, f"invalid time_tick ({request.time_tick}; expected >= 1)"
                )
            if target != api.SEEK_TARGET_LATEST:
                result = await self._propose(
                    request_id,
                    seek_subscription=pb.SeekSubscription(
                        name=request.name,
                        vchannel=request.vchannel,
                        lsn=1 if target == api.SEEK_TARGET_EARLIEST else request.lsn,
                        from_time_tick=request.time_tick
                        if target == api.SEEK_TARGET_TIME_TICK
                        else 0,
                    ),
                )
                return api.SeekSubscriptionResponse(revision=result.revision)

            # LATEST: just after each vchannel's pchannel's committed LSN, as its owner says.
            def reader(state: pb.CoordinationState) -> list[str]:
                found = state.subscriptions.get(request.name)
                if found is None:
                    return []
                return [request.vchannel] if request.vchannel else list(found.vchannels)

            vchannels, _ = await self._backend.read(reader, linearizable=False)
            if not vchannels:
                raise fail(E.NOT_FOUND, f"subscription {request.name!r} does not exist")
            pchannels, _ = await self._backend.read(_pchannels_of(vchannels), linearizable=False)
            revision = 0
            for index, vchannel in enumerate(vchannels):
                pchannel = pchannels.get(vchannel)
                if pchannel is None:
                    raise fail(E.CHANNEL_NOT_EXIST, f"vchannel {vchannel!r} does not exist")
                committed, _ = await self._backend.latest_position(pchannel)
                result = await self._propose(
                    f"{request_id}.{index}",
                    seek_subscription=pb.SeekSubscription(
                        name=request.name, vchannel=vchannel, lsn=committed + 1
                    ),
                )
                revision = result.revision
            return api.SeekSubscriptionResponse(revision=revision)

        return await self._call(context, work())

    async def DropVChannel(self, request, context):
        async def work() -> api.DropVChannelResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id, drop_vchannel=pb.DropVChannel(name=request.name)
            )
            return api.DropVChannelResponse(revision=result.revision)

        return await self._call(context, work())

    async def _end_if_leaderless(self, context, method: str) -> None:
        leaderless_s = self._backend.leaderless_s()
        if leaderless_s >= WATCH_LEADERLESS_S:
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.NOT_LEADER,
                        f"{method}: this node has known no Raft leader for {leaderless_s:.1f} s "
                        "(cut off from the majority?), so its view may be stale; watch from "
                        "another node",
                    )
                )
            )

    async def WatchAssignments(self, request, context) -> AsyncIterator[api.AssignmentDiscovery]:
        last_sent: bytes | None = None
        last_version = 0
        sent_at = time.monotonic()
        while True:
            await self._end_if_leaderless(context, "WatchAssignments")
            view, revision = await self._call(
                context, self._backend.read(assignment_view, linearizable=False)
            )
            encoded = view.SerializeToString(deterministic=True)
            if encoded != last_sent:
                view.version = last_version = revision
                last_sent = encoded
                sent_at = time.monotonic()
                yield view
            elif time.monotonic() - sent_at >= WATCH_PROGRESS_S:
                sent_at = time.monotonic()
                yield api.AssignmentDiscovery(version=last_version, progress=True)
            await self._call(context, self._backend.wait_change(STREAM_POLL_S))

    # -- leases and locks -------------------------------------------------------------

    async def GrantLease(self, request, context):
        async def work() -> api.GrantLeaseResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id,
                grant_lease=pb.GrantLease(
                    ttl_ms=request.ttl_ms, holder=request.holder, owner=self._owner(context)
                ),
            )
            return api.GrantLeaseResponse(
                lease_id=result.lease_id,
                ttl_ms=request.ttl_ms,
                deadline_ms=result.lease_deadline_ms,
                revision=result.revision,
            )

        return await self._call(context, work())

    async def KeepAlive(self, request_iterator, context) -> AsyncIterator[api.KeepAliveResponse]:
        async for request in request_iterator:
            result = await self._call(
                context,
                self._propose(
                    uuid.uuid4().hex,
                    keep_alive_lease=pb.KeepAliveLease(lease_id=request.lease_id),
                ),
            )
            now_ms = int(time.time() * 1000)
            yield api.KeepAliveResponse(
                lease_id=result.lease_id,
                ttl_ms=max(0, result.lease_deadline_ms - now_ms),
                deadline_ms=result.lease_deadline_ms,
                revision=result.revision,
            )

    async def RevokeLease(self, request, context):
        async def work() -> api.RevokeLeaseResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id, revoke_lease=pb.RevokeLease(lease_id=request.lease_id)
            )
            return api.RevokeLeaseResponse(revision=result.revision)

        return await self._call(context, work())

    async def Lock(self, request, context):
        async def work() -> api.LockResponse:
            request_id = _new_request_id(request.request_id)
            _check_wait("wait_timeout_ms", request.wait_timeout_ms, self._backend.max_wait_ms)
            result = await self._propose_waiting(
                request_id,
                request.wait_timeout_ms,
                [request.key],
                lock=pb.Lock(key=request.key, mode=request.mode, lease_id=request.lease_id),
            )
            return api.LockResponse(
                key=request.key, fencing_token=result.fencing_token, revision=result.revision
            )

        return await self._call(context, work())

    async def Unlock(self, request, context):
        async def work() -> api.UnlockResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id, unlock=pb.Unlock(key=request.key, lease_id=request.lease_id)
            )
            return api.UnlockResponse(revision=result.revision)

        return await self._call(context, work())

    async def BatchWrite(self, request, context):
        async def work() -> api.BatchWriteResponse:
            _check_count("ops", len(request.ops), 1, MAX_BATCH_OPS)
            results = [api.BatchWriteResult() for _ in request.ops]
            commands: list[pb.Command] = []
            positions: list[int] = []
            owner = self._owner(context)
            for position, op in enumerate(request.ops):
                try:
                    commands.append(self._batch_command(op, owner))
                except RaftwalError as error:
                    # A bad op is answered on its own and never proposed; the rest go on.
                    results[position].error.CopyFrom(error.info)
                    continue
                positions.append(position)
            if commands:
                replies = await self._backend.propose_batch(commands)
                for position, command, reply in zip(positions, commands, replies, strict=True):
                    self._batch_reply(request.ops[position], command, reply, results[position])
            return api.BatchWriteResponse(results=results)

        return await self._call(context, work())

    def _owner(self, context: grpc.aio.ServicerContext) -> str:
        """Who calls, as the coordination state names it (never from the request)."""
        return self._backend.caller_name(caller_identity(context))

    @staticmethod
    def _batch_command(op: api.BatchWriteOp, owner: str) -> pb.Command:
        kind = op.WhichOneof("op")
        if kind is None:
            raise fail(
                E.INVALID_ARGUMENT,
                "invalid op (empty; expected one of grant_lease, revoke_lease, lock, unlock)",
            )
        inner = getattr(op, kind)
        request_id = _new_request_id(inner.request_id)
        if kind == "grant_lease":
            return pb.Command(
                request_id=request_id,
                grant_lease=pb.GrantLease(ttl_ms=inner.ttl_ms, holder=inner.holder, owner=owner),
            )
        if kind == "revoke_lease":
            return pb.Command(
                request_id=request_id, revoke_lease=pb.RevokeLease(lease_id=inner.lease_id)
            )
        if kind == "lock":
            if inner.wait_timeout_ms != 0:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid lock.wait_timeout_ms in a batch ({inner.wait_timeout_ms}; "
                    "expected 0: a waiting Lock is a call of its own)",
                )
            return pb.Command(
                request_id=request_id,
                lock=pb.Lock(key=inner.key, mode=inner.mode, lease_id=inner.lease_id),
            )
        return pb.Command(
            request_id=request_id, unlock=pb.Unlock(key=inner.key, lease_id=inner.lease_id)
        )

    @staticmethod
    def _batch_reply(
        op: api.BatchWriteOp,
        command: pb.Command,
        reply: pb.CommandResult,
        out: api.BatchWriteResult,
    ) -> None:
        if reply.rejection.code != E.OK:
            out.error.CopyFrom(reply.rejection)
            return
        out.error.code = E.OK
        kind = op.WhichOneof("op")
        if kind == "grant_lease":
            out.grant_lease.CopyFrom(
                api.GrantLeaseResponse(
                    lease_id=reply.lease_id,
                    ttl_ms=op.grant_lease.ttl_ms,
                    deadline_ms=reply.lease_deadline_ms,
                    revision=reply.revision,
                )
            )
        elif kind == "revoke_lease":
            out.revoke_lease.CopyFrom(api.RevokeLeaseResponse(revision=reply.revision))
        elif kind == "lock":
            out.lock.CopyFrom(
                api.LockResponse(
                    key=command.lock.key,
                    fencing_token=reply.fencing_token,
                    revision=reply.revision,
                )
            )
        else:
            out.unlock.CopyFrom(api.UnlockResponse(revision=reply.revision))

    # -- broadcasts -------------------------------------------------------------------

    async def _broadcast_task(self, broadcast_id: int) -> pb.BroadcastTask | None:
        def reader(state: pb.CoordinationState) -> pb.BroadcastTask | None:
            task = state.broadcasts.get(broadcast_id)
            if task is None:
                return None
            copy = pb.BroadcastTask()
            copy.CopyFrom(task)
            return copy

        task, _ = await self._backend.read(reader, linearizable=False)
        return task

    async def Broadcast(self, request, context):
        async def work() -> api.BroadcastResponse:
            request_id = _new_request_id(request.request_id)
            _check_wait("lock_timeout_ms", request.lock_timeout_ms, self._backend.max_wait_ms)
            # Cheap shape checks before anything is replicated (the state machine checks
            # the same limits again, authoritatively).
            _check_count("vchannels", len(request.vchannels), 1, LIMITS.max_broadcast_vchannels)
            _check_count("resource_keys", len(request.resource_keys), 0, LIMITS.max_resource_keys)
            if len(request.message) > LIMITS.broadcast_message_max_bytes:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"broadcast message too large ({len(request.message)} bytes; expected at "
                    f"most {LIMITS.broadcast_message_max_bytes})",
                )
            result = await self._propose_waiting(
                request_id,
                request.lock_timeout_ms,
                [k.key for k in request.resource_keys],
                create_broadcast=pb.CreateBroadcast(
                    message=request.message,
                    msg_type=request.msg_type,
                    vchannels=request.vchannels,
                    resource_keys=request.resource_keys,
                    idempotency_key=request.idempotency_key,
                ),
            )
            task = await self._broadcast_task(result.broadcast_id)
            return api.BroadcastResponse(
                broadcast_id=result.broadcast_id,
                vchannels=task.vchannels if task is not None else [],
                revision=result.revision,
            )

        return await self._call(context, work())

    async def Ack(self, request, context):
        async def work() -> api.AckResponse:
            request_id = _new_request_id(request.request_id)
            result = await self._propose(
                request_id,
                ack_broadcast=pb.AckBroadcast(
                    broadcast_id=request.broadcast_id,
                    vchannel=request.vchannel,
                    checkpoint=request.checkpoint,
                ),
            )
            task = await self._broadcast_task(request.broadcast_id)
            state = task.state if task is not None else pb.BROADCAST_STATE_DONE
            return api.AckResponse(revision=result.revision, state=state)

        return await self._call(context, work())

    async def WaitResourceKey(self, request, context):
        async def work() -> api.WaitResourceKeyResponse:
            if not request.key or len(request.key) > 256:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid key ({len(request.key)} chars; expected 1..256)",
                )
            if request.mode not in (api.WAIT_MODE_ONCE, api.WAIT_MODE_ALL):
                raise fail(E.INVALID_ARGUMENT, f"invalid mode ({request.mode}; expected ONCE|ALL)")
            _check_wait("timeout_ms", request.timeout_ms, self._backend.max_wait_ms)
            return await self._wait_resource_key(request)

        return await self._call(context, work())

    async def _wait_resource_key(
        self, request: api.WaitResourceKeyRequest
    ) -> api.WaitResourceKeyResponse:
        def holder(state: pb.CoordinationState) -> int:
            lock = state.locks.get(request.key)
            if lock is None:
                return 0
            for entry in lock.holders:
                if entry.kind == pb.HOLDER_KIND_BROADCAST:
                    return entry.id
            return 0

        broadcast_id, revision = await self._backend.read(holder, linearizable=True)
        if broadcast_id == 0:
            return api.WaitResourceKeyResponse(revision=revision)
        deadline = time.monotonic() + request.timeout_ms / 1000
        while True:
            task = await self._broadcast_task(broadcast_id)
            revision = self._backend.applied_revision()
            if task is None:
                return api.WaitResourceKeyResponse(
                    broadcast_id=broadcast_id, state=pb.BROADCAST_STATE_DONE, revision=revision
                )
            done = task.state != pb.BROADCAST_STATE_PENDING
            if request.mode == api.WAIT_MODE_ONCE:
                done = done or any(v.acked for v in task.vchannels)
            remaining = deadline - time.monotonic()
            if done or remaining <= 0:
                return api.WaitResourceKeyResponse(
                    broadcast_id=broadcast_id, state=task.state, revision=revision
                )
            await self._backend.wait_change(min(remaining, STREAM_POLL_S))

    # -- history, status, policy ------------------------------------------------------

    async def WatchEvents(self, request, context) -> AsyncIterator[api.WatchEventsResponse]:
        kinds = set(request.kinds)
        unknown = sorted(kinds - set(EVENT_KINDS))
        if unknown or len(request.kinds) > len(EVENT_KINDS) or request.from_revision < 0:
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.INVALID_ARGUMENT,
                        f"invalid watch (from_revision {request.from_revision}, unknown kinds "
                        f"{unknown[:5]}; expected from_revision >= 0 and kinds among "
                        f"{', '.join(EVENT_KINDS[:4])}, ...)",
                    )
                )
            )
        next_revision = request.from_revision or self._backend.applied_revision() + 1
        # The first response has no events: it tells the client where the watch starts
        # (from_revision 0 = "from now") before anything happens.
        yield api.WatchEventsResponse(
            applied_revision=self._backend.applied_revision(), next_revision=next_revision
        )
        sent_at = time.monotonic()
        while True:
            await self._end_if_leaderless(context, "WatchEvents")
            try:
                events = self._backend.events_from(next_revision, EVENT_BATCH)
            except CompactedHistory as error:
                await context.abort_with_status(
                    to_status(
                        error_info(E.COMPACTED, str(error), first_available=error.first_retained)
                    )
                )
            if events:
                next_revision = events[-1].revision + 1
                # Replication credentials never leave the node in history answers.
                selected = [
                    redacted_event(e) for e in events if not kinds or e.WhichOneof("body") in kinds
                ]
                # With a kinds filter a batch may select nothing: the response (with no
                # events) still reports progress, so a client resumes from next_revision.
                sent_at = time.monotonic()
                yield api.WatchEventsResponse(
                    events=selected,
                    applied_revision=self._backend.applied_revision(),
                    next_revision=next_revision,
                )
                continue
            if time.monotonic() - sent_at >= WATCH_PROGRESS_S:
                # Nothing happened: a progress notification keeps the stream visibly alive.
                sent_at = time.monotonic()
                yield api.WatchEventsResponse(
                    applied_revision=self._backend.applied_revision(),
                    next_revision=next_revision,
                )
            await self._call(context, self._backend.wait_change(STREAM_POLL_S))

    async def ClusterStatus(self, request, context):
        async def work() -> api.ClusterStatusResponse:
            return await self._backend.cluster_status(_linearizable(request.consistency))

        return await self._call(context, work())

    async def SetBalancePolicy(self, request, context):
        async def work() -> api.SetBalancePolicyResponse:
            request_id = _new_request_id(request.request_id)
            _check_count("freeze_node_ids", len(request.freeze_node_ids), 0)
            _check_count("unfreeze_node_ids", len(request.unfreeze_node_ids), 0)
            # One Raft entry for the policy and every freeze and unfreeze: one round of
            # replication instead of one per command, applied in this order.
            commands = [
                pb.Command(
                    request_id=request_id,
                    set_balance_policy=pb.SetBalancePolicy(
                        allow_rebalance=request.allow_rebalance,
                        max_moves_per_round=request.max_moves_per_round,
                    ),
                ),
                *(
                    pb.Command(
                        request_id=f"{request_id}.f{index}",
                        freeze_node=pb.FreezeNode(node_id=node_id),
                    )
                    for index, node_id in enumerate(request.freeze_node_ids)
                ),
                *(
                    pb.Command(
                        request_id=f"{request_id}.u{index}",
                        unfreeze_node=pb.UnfreezeNode(node_id=node_id),
                    )
                    for index, node_id in enumerate(request.unfreeze_node_ids)
                ),
            ]
            revision = 0
            for result in await self._backend.propose_batch(commands):
                revision = _raise_rejection(result).revision

            def reader(state: pb.CoordinationState) -> pb.BalancePolicy:
                copy = pb.BalancePolicy()
                copy.CopyFrom(state.balance_policy)
                return copy

            policy, _ = await self._backend.read(reader, linearizable=False)
            return api.SetBalancePolicyResponse(policy=policy, revision=revision)

        return await self._call(context, work())

    async def UpdateReplicateConfiguration(self, request, context):
        async def work() -> api.UpdateReplicateConfigurationResponse:
            request_id = _new_request_id(request.request_id)
            # The state machine validates the configuration (statemachine/replicate.py);
            # the node stamps which cluster it is.
            result = await self._propose(
                request_id,
                update_replicate_configuration=pb.UpdateReplicateConfiguration(
                    configuration=request.configuration,
                    local_cluster_id=self._backend.cluster_id,
                ),
            )
            log.info(
                "replication configuration %s at revision %d (%d clusters, %d edges)",
                "updated" if result.events else "unchanged",
                result.revision,
                len(request.configuration.clusters),
                len(request.configuration.topology),
            )
            return api.UpdateReplicateConfigurationResponse(
                revision=result.revision, changed=bool(result.events)
            )

        return await self._call(context, work())

    async def GetReplicateConfiguration(self, request, context):
        async def work() -> api.GetReplicateConfigurationResponse:
            def reader(state: pb.CoordinationState) -> api.GetReplicateConfigurationResponse:
                answer = api.GetReplicateConfigurationResponse(
                    configuration=redacted(state.replicate_configuration)
                )
                for name in sorted(state.replicate_checkpoints):
                    answer.checkpoints[name].CopyFrom(state.replicate_checkpoints[name])
                return answer

            answer, revision = await self._backend.read(reader, _linearizable(request.consistency))
            answer.cluster_id = self._backend.cluster_id
            answer.revision = revision
            return answer

        return await self._call(context, work())

    async def AlterWal(self, request, context):
        async def work() -> api.AlterWalResponse:
            request_id = _new_request_id(request.request_id)
            if not request.target:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid target (got ''; expected one of {', '.join(wal_registry.names())})",
                )
            try:
                config = wal_registry.validate(request.target, request.config)
            except ConfigError as error:
                raise fail(E.INVALID_ARGUMENT, str(error)) from None
            result = await self._propose(
                request_id, alter_wal=pb.AlterWal(target=request.target, target_config=config)
            )
            started = [e for e in result.events if e.WhichOneof("body") == "wal_alter_started"]
            moved = [
                e.wal_checkpoint_advanced.pchannel
                for e in result.events
                if e.WhichOneof("body") == "wal_checkpoint_advanced"
            ]
            return api.AlterWalResponse(
                epoch=started[0].wal_alter_started.epoch if started else 0,
                pchannels=sorted(
                    [*(started[0].wal_alter_started.pchannels if started else ()), *moved]
                ),
                revision=result.revision,
            )

        return await self._call(context, work())

    async def ListSegments(self, request, context):
        async def work() -> api.ListSegmentsResponse:
            _check_count("pchannels", len(request.pchannels), 0)
            names = list(dict.fromkeys(request.pchannels))
            for name in names:
                bad = check_name("pchannel", name, LIMITS)
                if bad is not None:
                    raise fail(E.INVALID_ARGUMENT, bad.message)
            as_of = request.as_of_revision
            if as_of < 0:
                raise fail(E.INVALID_ARGUMENT, f"invalid as_of_revision ({as_of}; expected >= 0)")

            floors: dict[str, int] = {}

            def reader(state: pb.CoordinationState) -> tuple[list[pb.Segment], bool, list[str]]:
                wanted = names or sorted(state.manifests)
                missing = [n for n in wanted if n not in state.pchannels]
                segments: list[pb.Segment] = []
                retention = False
                for name in wanted:
                    manifest = state.manifests.get(name)
                    if manifest is None:
                        continue
                    retention = retention or manifest.deleted_before_lsn > 0
                    floors[name] = manifest.deleted_before_lsn
                    for segment in manifest.segments:
                        copy = pb.Segment()
                        copy.CopyFrom(segment)
                        segments.append(copy)
                return segments, retention, missing

            (segments, retention, missing), revision = await self._backend.read(
                reader, linearizable=True
            )
            if missing:
                raise fail(E.CHANNEL_NOT_EXIST, f"pchannel {missing[0]!r} does not exist")
            if not as_of:
                return api.ListSegmentsResponse(segments=segments, revision=revision)
            if as_of > revision:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"as_of_revision {as_of} is in the future (current revision {revision})",
                )
            if retention:
                # A segment deleted after `as_of` cannot be read any more: the snapshot is
                # no longer repeatable.
                wanted = set(names)
                cursor = as_of + 1
                while cursor <= revision:
                    events = self._backend.events_from(cursor, EVENT_BATCH)
                    if not events:
                        break
                    for event in events:
                        if event.WhichOneof("body") == "segments_deleted" and (
                            not wanted or event.segments_deleted.pchannel in wanted
                        ):
                            raise fail(
                                E.COMPACTED,
                                f"segments of {event.segments_deleted.pchannel} committed by "
                                f"revision {as_of} were deleted at revision {event.revision} "
                                f"(the first lsn retained is "
                                f"{floors.get(event.segments_deleted.pchannel, 0)})",
                                first_available=floors.get(event.segments_deleted.pchannel, 0),
                            )
                    cursor = events[-1].revision + 1
            return api.ListSegmentsResponse(
                segments=[s for s in segments if s.committed_revision <= as_of], revision=as_of
            )

        return await self._call(context, work())

    async def ChangeMembership(self, request, context):
        async def work() -> api.ChangeMembershipResponse:
            if request.action not in (
                api.MEMBERSHIP_ACTION_ADD,
                api.MEMBERSHIP_ACTION_REMOVE,
                api.MEMBERSHIP_ACTION_FORGET,
            ):
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid action ({request.action}; expected MEMBERSHIP_ACTION_ADD, "
                    "MEMBERSHIP_ACTION_REMOVE or MEMBERSHIP_ACTION_FORGET)",
                )
            if not 0 <= request.timeout_ms <= MAX_MEMBERSHIP_TIMEOUT_MS:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid timeout_ms ({request.timeout_ms}; expected "
                    f"0..{MAX_MEMBERSHIP_TIMEOUT_MS})",
                )
            bad = check_name("node_id", request.node_id, LIMITS)
            if bad is not None:
                raise fail(E.INVALID_ARGUMENT, bad.message)
            if request.action == api.MEMBERSHIP_ACTION_FORGET:
                changed = await self._backend.forget_node(request.node_id)
                return api.ChangeMembershipResponse(
                    voter_node_ids=self._backend.list_members().voter_node_ids, changed=changed
                )
            voters, changed = await self._backend.change_membership(
                request.node_id,
                request.action == api.MEMBERSHIP_ACTION_ADD,
                (request.timeout_ms or DEFAULT_MEMBERSHIP_TIMEOUT_MS) / 1000,
            )
            return api.ChangeMembershipResponse(voter_node_ids=voters, changed=changed)

        return await self._call(context, work())

    async def ListMembers(self, request, context):
        async def work() -> api.ListMembersResponse:
            return self._backend.list_members()

        return await self._call(context, work())

    async def SaveSnapshot(self, request, context):
        """The whole coordination state at one revision (a linearizable read), with its
        digest: what `raftwal snapshot save` writes to a file."""

        async def work() -> api.SaveSnapshotResponse:
            def reader(state: pb.CoordinationState) -> bytes:
                return snapshot_state(state)

            data, _ = await self._backend.read(reader, linearizable=True)
            saved = restore_state(data)
            return api.SaveSnapshotResponse(
                state=data,
                revision=saved.revision,
                state_digest=hashlib.sha256(data).hexdigest(),
            )

        return await self._call(context, work())


def _linearizable(consistency: int) -> bool:
    if consistency not in (api.CONSISTENCY_LINEARIZABLE, api.CONSISTENCY_SERIALIZABLE):
        raise fail(
            E.INVALID_ARGUMENT,
            f"invalid consistency ({consistency}; expected LINEARIZABLE|SERIALIZABLE)",
        )
    return consistency == api.CONSISTENCY_LINEARIZABLE
