"""``SubscriptionConsumer``: a ``Consumer`` of one vchannel of a subscription that starts
where the subscription stands and commits its position as it goes.

Where it starts on the vchannel: after the subscription's committed position; after a
Seek to a time tick, at the first entry at or after it; with no position yet, by the
subscription's start policy (earliest, latest, an LSN, a time tick).

What it commits: an entry counts as consumed once the caller asks for the next one (or
calls ``commit()``, or leaves ``async with`` without an exception), so a crash between
receiving an entry and finishing with it redelivers that entry: at least once. Commits go
out every ``commit_every`` entries or ``commit_interval_ms``, whichever comes first, and at
close. A commit due while reading runs in the background (one at a time), so reading never
waits for Raft; its refusal is raised by the next ``__anext__``, and ``commit()`` and
``close()`` wait for it. Exactly once needs the application's writes and the position in one transaction
(not in this module).

Positions move forward only; a commit the coordinator refuses raises its typed error.
This module must never commit an entry the caller has not finished with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import Any

from rpc.errors import InvalidArgumentError, RaftwalError, error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.routing import _invalid
from rpc.streaming.consumer import Consumer, refuse_start_options
from rpc.streaming.routing import StreamingClientBase, _check_range

E = errors_pb2


class SubscriptionConsumer:
    """Entries of `vchannel` for subscription `subscription`, resumed from its committed
    position and committed as they are consumed (see the module docstring)."""

    def __init__(
        self,
        client: StreamingClientBase,
        subscription: str,
        vchannel: str,
        *,
        commit_every: int = 1000,
        commit_interval_ms: int = 1000,
        member_id: str = "",
        generation: int = 0,
        **consumer_options: Any,
    ) -> None:
        _check_range("commit_every", commit_every, 1, 1_000_000)
        _check_range("commit_interval_ms", commit_interval_ms, 1, 3_600_000)
        refuse_start_options("SubscriptionConsumer", consumer_options)
        self._client = client
        self.subscription = subscription
        self.vchannel = vchannel
        self.commit_every = commit_every
        self.commit_interval_s = commit_interval_ms / 1000
        #: the member (and generation) commits are fenced by, when the subscription has
        #: members (see SubscriptionMember)
        self.member_id = member_id
        self.generation = generation
        self._consumer_options = consumer_options
        self._consumer: Consumer | None = None
        # (lsn, time_tick) of the last entry handed out, the one before it, and the last
        # position committed.
        self._delivered: tuple[int, int] | None = None
        self._previous: tuple[int, int] | None = None
        self._committed: tuple[int, int] | None = None
        self._uncommitted = 0
        self._last_commit_at = time.monotonic()
        # The commit running in the background (started by _maybe_commit), if any.
        self._commit_task: asyncio.Future[None] | None = None
        #: entries handed out and positions committed, for the caller's status
        self.delivered_count = 0
        self.commits = 0

    async def _open(self) -> Consumer:
        if self._consumer is not None:
            return self._consumer
        described = await self._client.coordinator.describe_subscription(self.subscription)
        found = described.subscription
        if self.vchannel not in found.vchannels:
            raise InvalidArgumentError(
                error_info(
                    E.INVALID_ARGUMENT,
                    f"vchannel {self.vchannel!r} is not in subscription {self.subscription!r} "
                    f"(expected one of {list(found.vchannels)[:8]})",
                )
            )
        start: dict[str, Any] = {}
        position = found.positions.get(self.vchannel)
        if position is not None and position.lsn > 0:
            start["start_after"] = position.lsn
            self._committed = (position.lsn, position.time_tick)
        elif position is not None and position.from_time_tick > 0:
            start["from_time_tick"] = position.from_time_tick
        elif found.start == pb.SUBSCRIPTION_START_LATEST:
            start["latest"] = True
        elif found.start == pb.SUBSCRIPTION_START_LSN:
            start["from_lsn"] = found.start_lsn
        elif found.start == pb.SUBSCRIPTION_START_TIME_TICK:
            start["from_time_tick"] = found.start_time_tick
        self._consumer = Consumer(self._client, self.vchannel, **start, **self._consumer_options)
        await self._consumer.start()
        return self._consumer

    async def start(self) -> None:
        """Read the subscription and open the stream (also done by ``async with`` and the
        first ``__anext__``)."""
        await self._open()

    def __aiter__(self) -> SubscriptionConsumer:
        return self

    async def __anext__(self) -> wire.WalEntry:
        consumer = await self._open()
        # The caller asks for the next entry: it is done with the last one.
        await self._maybe_commit()
        entry = await consumer.__anext__()
        self._previous, self._delivered = self._delivered, (entry.lsn, entry.time_tick)
        self._uncommitted += 1
        self.delivered_count += 1
        return entry

    async def _maybe_commit(self) -> None:
        self._reap()
        if self._delivered is None or self._uncommitted == 0 or self._commit_task is not None:
            return
        due = time.monotonic() - self._last_commit_at >= self.commit_interval_s
        if self._uncommitted >= self.commit_every or due:
            self._uncommitted = 0
            self._last_commit_at = time.monotonic()
            self._commit_task = asyncio.ensure_future(self._commit(self._delivered))

    def _reap(self) -> None:
        """Collect a finished background commit: raises its error."""
        task = self._commit_task
        if task is not None and task.done():
            self._commit_task = None
            task.result()

    async def _drain(self) -> None:
        """Wait for the background commit, if any (raises its error)."""
        task = self._commit_task
        if task is not None:
            self._commit_task = None
            await task

    async def _commit(self, position: tuple[int, int] | None) -> None:
        if position is None or (self._committed is not None and position <= self._committed):
            return
        await self._client.coordinator.commit_subscription(
            self.subscription,
            {self.vchannel: position},
            member_id=self.member_id,
            generation=self.generation,
        )
        if self._committed is None or position > self._committed:
            self._committed = position
        self.commits += 1

    async def _commit_now(self, position: tuple[int, int] | None) -> None:
        await self._drain()
        await self._commit(position)
        if position is not None and position == self._delivered:
            self._uncommitted = 0
        self._last_commit_at = time.monotonic()

    async def commit(self) -> None:
        """Commit everything handed out so far (the caller is done with the last entry)."""
        await self._commit_now(self._delivered)

    @property
    def committed(self) -> tuple[int, int] | None:
        """(lsn, time_tick) of the last position this consumer committed (or found)."""
        return self._committed

    async def close(self, failed: bool = False) -> None:
        """Commit what was consumed (all delivered entries, or all but the last when
        `failed`: the caller did not finish with it) and close the stream."""
        try:
            if self._consumer is not None:
                await self._commit_now(self._previous if failed else self._delivered)
        finally:
            if self._consumer is not None:
                await self._consumer.close()

    async def __aenter__(self) -> SubscriptionConsumer:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close(failed=exc is not None)


class SubscriptionMember:
    """One consumer process in a subscription: it grants a lease and keeps it alive
    (``LeaseKeeper``), joins, and reads the vchannels the coordinator assigns it.

    ``wait_assignment()`` returns (generation, vchannels) once it holds at least one
    vchannel (or the assignment changed); ``consumer(vchannel)`` is a
    ``SubscriptionConsumer`` whose commits carry this member's id and that generation, so a
    member that lost the vchannel (a newer generation, or its lease ended while it was
    paused) can never move the position: ChannelFencedError. Leaving the ``async with``
    leaves the subscription and revokes the lease.
    """

    def __init__(
        self,
        client: StreamingClientBase,
        subscription: str,
        member_id: str,
        *,
        lease_ttl_ms: int = 10_000,
    ) -> None:
        _check_range("lease_ttl_ms", lease_ttl_ms, 1000, 3_600_000)
        self._client = client
        self.subscription = subscription
        self.member_id = member_id
        self.lease_ttl_ms = lease_ttl_ms
        self.lease_id = 0
        self.generation = 0
        self.vchannels: list[str] = []
        self._keeper: Any = None

    async def __aenter__(self) -> SubscriptionMember:
        coordinator = self._client.coordinator
        granted = await coordinator.grant_lease(
            ttl_ms=self.lease_ttl_ms, holder=f"{self.subscription}/{self.member_id}"
        )
        self.lease_id = granted.lease_id
        self._keeper = coordinator.lease_keeper(self.lease_id)
        await self._keeper.__aenter__()
        await coordinator.join_subscription(self.subscription, self.member_id, self.lease_id)
        return self

    @property
    def alive(self) -> bool:
        """False once the lease may have ended: stop using the assignment then."""
        return self._keeper is not None and self._keeper.alive

    async def assignment(self) -> tuple[int, list[str]]:
        """(generation, vchannels) this member holds now, as the coordinator assigned."""
        described = await self._client.coordinator.describe_subscription(self.subscription)
        member = described.subscription.members.get(self.member_id)
        if member is None:
            return 0, []
        return member.generation, list(member.vchannels)

    async def wait_assignment(
        self, timeout_s: float = 30.0, poll_s: float = 0.2
    ) -> tuple[int, list[str]]:
        """Until the member holds vchannels at a generation newer than the last one seen
        (bounded by `timeout_s`: then what it holds, possibly nothing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            generation, vchannels = await self.assignment()
            changed = generation != self.generation and vchannels
            if changed or time.monotonic() >= deadline:
                self.generation, self.vchannels = generation, vchannels
                return generation, vchannels
            await asyncio.sleep(poll_s)

    def consumer(self, vchannel: str, **options: Any) -> SubscriptionConsumer:
        if vchannel not in self.vchannels:
            raise _invalid(
                f"member {self.member_id!r} does not hold {vchannel!r} (it holds "
                f"{self.vchannels[:8]} at generation {self.generation})"
            )
        return SubscriptionConsumer(
            self._client,
            self.subscription,
            vchannel,
            member_id=self.member_id,
            generation=self.generation,
            **options,
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        coordinator = self._client.coordinator
        try:
            await coordinator.leave_subscription(self.subscription, self.member_id)
        finally:
            if self._keeper is not None:
                # A lost lease was the caller's to notice (alive, wait_lost); leaving goes on.
                with contextlib.suppress(RaftwalError):
                    await self._keeper.__aexit__(None, None, None)
            if self.lease_id:
                with contextlib.suppress(RaftwalError):
                    await coordinator.revoke_lease(self.lease_id)
