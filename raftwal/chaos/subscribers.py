"""The chaos workload's consumer side (issue 15): subscription members, a pack consumer,
an exactly-once shard application, and a sampler of subscription positions.

Lives here, all asyncio through the SDK as an application would use it, each recording
what it observed or committed in the run's ``History``:

- ``MemberClient``: joins a subscription with a lease (``SubscriptionMember``), reads the
  vchannels the coordinator assigns it with ``SubscriptionConsumer`` and commits under its
  generation (``sub_commit``), leaves after a while and joins again (``sub_join``,
  ``sub_leave``), so that assignments move during the faults;
- ``PackClient``: a ``PackConsumer`` over a subscription; every pack handed out is a
  ``pack`` op (ticks, positions, and each message as (vchannel, lsn, time tick));
- ``ShardClient``: per-key counters in SQLite through ``rpc.shards_client.Shard``, taken
  again under a new token every few seconds (every other time with its disk lost, so the
  store is rebuilt from the recovery log); after the run it drains and records the store's
  counters, every applied LSN and its checkpoint (``shard_final``);
- ``PositionSampler``: one linearizable DescribeSubscription at a time (``sub_observe``),
  and now and then a ``Seek`` back on the members' subscription (``sub_seek``).

Every loop is bounded by the stop event and in time; this module must never assert
anything about the cluster (the checker does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftwal.chaos.workload import FAIL, History, Op, payload_key
from rpc.aio import wait_event
from rpc.errors import RaftwalError
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.shards_client import Shard, ShardStore
from rpc.streaming_client import PackConsumer, StreamingClient, SubscriptionMember

log = logging.getLogger(__name__)
E = errors_pb2

MEMBER_LEASE_TTL_MS = 4000
MEMBER_SESSION_S = (4.0, 12.0)
ASSIGNMENT_POLL_S = 1.0
COMMIT_EVERY_S = 0.3
SAMPLE_INTERVAL_S = 0.5
SEEK_EVERY_S = 15.0
SHARD_INCARNATION_S = (8.0, 20.0)
SHARD_IDLE_S = 3.0
SHARD_DRAIN_S = 60.0
RESTART_PAUSE_S = 0.5
MAX_ROUNDS = 10_000


def counter_key(key: str) -> str:
    """The counter a workload message counts toward: its producer (``p0``), or ``bc``."""
    return key.split(":", 1)[0]


def _fenced_is_fail(op: Op, error: BaseException) -> None:
    # A fenced commit did not happen (and cannot happen later).
    if isinstance(error, RaftwalError) and error.code == E.CHANNEL_FENCED:
        op.outcome = FAIL


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    await wait_event(stop, seconds)


class MemberClient:
    """One consumer process of a subscription with members (see the module docstring)."""

    def __init__(
        self,
        name: str,
        client: StreamingClient,
        subscription: str,
        history: History,
        rng: random.Random,
    ) -> None:
        self.name = name
        self.client = client
        self.subscription = subscription
        self.history = history
        self.rng = rng
        self.sessions = 0
        self.delivered = 0
        self.errors: list[str] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.sessions < MAX_ROUNDS:
            self.sessions += 1
            try:
                await self._session(stop, f"{self.name}-{self.sessions}")
            except RaftwalError as error:
                self.errors.append(str(error)[:200])
                await _pause(stop, RESTART_PAUSE_S)

    async def _session(self, stop: asyncio.Event, member_id: str) -> None:
        member = SubscriptionMember(
            self.client, self.subscription, member_id, lease_ttl_ms=MEMBER_LEASE_TTL_MS
        )
        join = self.history.invoke(self.name, "sub_join", subscription=self.subscription)
        try:
            await member.__aenter__()
        except RaftwalError as error:
            self.history.failed(join, error)
            with contextlib.suppress(RaftwalError):
                await member.__aexit__(None, None, None)
            await _pause(stop, RESTART_PAUSE_S)
            return
        self.history.ok(join, member=member_id, lease=member.lease_id)
        until = time.monotonic() + self.rng.uniform(*MEMBER_SESSION_S)
        try:
            while not stop.is_set() and time.monotonic() < until and member.alive:
                generation, vchannels = await member.wait_assignment(
                    timeout_s=ASSIGNMENT_POLL_S * 3, poll_s=0.3
                )
                if not vchannels:
                    continue
                await self._consume(stop, member, member_id, generation, vchannels, until)
        finally:
            leave = self.history.invoke(
                self.name, "sub_leave", subscription=self.subscription, member=member_id
            )
            try:
                await member.__aexit__(None, None, None)
            except RaftwalError as error:
                self.history.failed(leave, error)
            else:
                self.history.ok(leave)

    async def _consume(
        self,
        stop: asyncio.Event,
        member: SubscriptionMember,
        member_id: str,
        generation: int,
        vchannels: Sequence[str],
        until: float,
    ) -> None:
        """Read every assigned vchannel until the assignment changes, the session ends or
        the lease may have ended."""
        done = asyncio.Event()
        readers = [
            asyncio.create_task(self._read(done, member, member_id, generation, v))
            for v in vchannels
        ]
        try:
            while not stop.is_set() and time.monotonic() < until and member.alive:
                await _pause(stop, ASSIGNMENT_POLL_S)
                if all(r.done() for r in readers):
                    break
                try:
                    now_generation, _ = await member.assignment()
                except RaftwalError:
                    continue
                if now_generation != generation:
                    break
        finally:
            done.set()
            await asyncio.wait(readers, timeout=30.0)
            for reader in readers:
                if not reader.done():
                    reader.cancel()

    async def _commit(
        self, consumer: Any, member_id: str, generation: int, vchannel: str, lsn: int
    ) -> None:
        op = self.history.invoke(
            self.name,
            "sub_commit",
            subscription=self.subscription,
            member=member_id,
            generation=generation,
            vchannel=vchannel,
            lsn=lsn,
        )
        try:
            await consumer.commit()
        except RaftwalError as error:
            self.history.failed(op, error)
            _fenced_is_fail(op, error)
            raise
        self.history.ok(op)

    async def _read(
        self,
        done: asyncio.Event,
        member: SubscriptionMember,
        member_id: str,
        generation: int,
        vchannel: str,
    ) -> None:
        consumer = member.consumer(
            vchannel, commit_every=1_000_000, commit_interval_ms=3_600_000, retry_timeout_s=30.0
        )
        committed = last = 0
        last_commit = time.monotonic()
        entries = consumer.__aiter__()
        # One read in flight at a time, never cancelled mid-way while reading goes on.
        pending: asyncio.Future[wire.WalEntry] | None = None
        try:
            while not done.is_set():
                if pending is None:
                    pending = asyncio.ensure_future(entries.__anext__())
                await asyncio.wait({pending}, timeout=COMMIT_EVERY_S)
                if pending.done():
                    entry, pending = pending.result(), None
                    last = entry.lsn
                    self.delivered += 1
                if last > committed and time.monotonic() - last_commit >= COMMIT_EVERY_S:
                    await self._commit(consumer, member_id, generation, vchannel, last)
                    committed, last_commit = last, time.monotonic()
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
                pending = None
            if last > committed:
                await self._commit(consumer, member_id, generation, vchannel, last)
        except (RaftwalError, StopAsyncIteration) as error:
            self.errors.append(f"{vchannel}: {str(error)[:200]}")
        finally:
            if pending is not None:
                pending.cancel()
            # What was consumed was committed above (recorded); close() commits nothing new
            # unless that commit failed, and then the same position again.
            try:
                await asyncio.wait_for(consumer.close(), 10.0)
            except (RaftwalError, asyncio.CancelledError):
                pass
            except TimeoutError:
                # A paused or cut-off node held the close: the session ends anyway (its
                # member lease expires). Said here, not raised from a task nobody awaits.
                self.errors.append(f"{vchannel}: closing the consumer took over 10 s")


class PackClient:
    """Packs of one subscription; a failed PackConsumer is replaced by a new one that
    resumes where the subscription stands (``incarnation`` counts them)."""

    def __init__(self, client: StreamingClient, subscription: str, history: History) -> None:
        self.client = client
        self.subscription = subscription
        self.history = history
        self.incarnation = 0
        self.packs = 0
        self.errors: list[str] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.incarnation < MAX_ROUNDS:
            self.incarnation += 1
            consumer = PackConsumer(
                self.client,
                self.subscription,
                commit_every=5,
                commit_interval_ms=200,
                retry_timeout_s=30.0,
            )
            stopper = asyncio.create_task(self._close_on(stop, consumer))
            try:
                async for pack in consumer:
                    self._record(pack)
            except RaftwalError as error:
                self.errors.append(str(error)[:200])
                await _pause(stop, RESTART_PAUSE_S)
            finally:
                stopper.cancel()
                with contextlib.suppress(RaftwalError):
                    await asyncio.wait_for(consumer.close(), 40.0)

    def _record(self, pack: Any) -> None:
        self.packs += 1
        op = self.history.invoke(
            "packs", "pack", subscription=self.subscription, incarnation=self.incarnation
        )
        self.history.ok(
            op,
            begin=pack.begin_time_tick,
            end=pack.end_time_tick,
            start_positions={v: list(p) for v, p in pack.start_positions.items()},
            end_positions={v: list(p) for v, p in pack.end_positions.items()},
            messages=[[m.vchannel, m.lsn, m.time_tick] for m in pack.messages],
        )

    @staticmethod
    async def _close_on(stop: asyncio.Event, consumer: PackConsumer) -> None:
        await stop.wait()
        with contextlib.suppress(RaftwalError):
            await consumer.close()


class CounterApp:
    """The exactly-once application: per-key counters, and every applied LSN (a plain
    table, so a duplicate shows)."""

    def init_store(self, store: ShardStore) -> None:
        store.execute("CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, n INTEGER)")
        store.execute("CREATE TABLE IF NOT EXISTS applied (lsn INTEGER, key TEXT)")

    def consume(self, store: ShardStore, entries: Sequence[wire.WalEntry]) -> None:
        for entry in entries:
            key = counter_key(payload_key(entry.payload))
            store.execute(
                "INSERT INTO counters (key, n) VALUES (?, 1) "
                "ON CONFLICT(key) DO UPDATE SET n = n + 1",
                (key,),
            )
            store.execute("INSERT INTO applied (lsn, key) VALUES (?, ?)", (entry.lsn, key))

    def finalize(self, store: ShardStore) -> None:
        return None


class ShardClient:
    """One exactly-once shard (subscription, vchannel), taken again and again under a
    growing token (see the module docstring)."""

    def __init__(
        self,
        client: StreamingClient,
        subscription: str,
        vchannel: str,
        directory: Path,
        history: History,
        rng: random.Random,
    ) -> None:
        self.client = client
        self.subscription = subscription
        self.vchannel = vchannel
        self.directory = directory
        self.history = history
        self.rng = rng
        self.token = 0
        self.disk = 0
        self.errors: list[str] = []
        self._shard: Shard | None = None

    def _path(self) -> Path:
        return self.directory / f"shard-{self.disk}.sqlite"

    async def _take(self) -> Shard | None:
        self.token += 1
        if self.token > 1 and self.token % 2 == 0:
            self.disk += 1  # this incarnation lost the previous one's disk
        shard = Shard(
            self.client,
            CounterApp(),
            self.subscription,
            self.vchannel,
            store_path=self._path(),
            member_id=f"shard{self.token}",
            token=self.token,
            commit_as_member=False,
            max_batch_messages=500,
            commit_interval_ms=500,
            retry_timeout_s=30.0,
        )
        op = self.history.invoke(
            "shard", "shard_recover", token=self.token, disk=self.disk, vchannel=self.vchannel
        )
        try:
            status = await shard.recover()
        except RaftwalError as error:
            self.history.failed(op, error)
            self.errors.append(str(error)[:200])
            await shard.close()
            if shard.store is not None:
                shard.store.close()
            return None
        self.history.ok(
            op,
            source_lsn=status.checkpoint.source_lsn,
            replayed=status.replayed_records,
            recovery_s=round(status.recovery_s, 4),
        )
        return shard

    async def run(self, stop: asyncio.Event) -> None:
        rounds = 0
        while not stop.is_set() and rounds < MAX_ROUNDS:
            rounds += 1
            shard = await self._take()
            if shard is None:
                await _pause(stop, RESTART_PAUSE_S)
                continue
            self._shard = shard
            mine = asyncio.Event()
            ender = asyncio.create_task(self._end_after(stop, mine))
            try:
                await shard.run(mine)
            except RaftwalError as error:
                self.errors.append(str(error)[:200])
            finally:
                ender.cancel()
            if stop.is_set():
                return  # the last incarnation drains in finish()
            await self._release(shard)

    async def _end_after(self, stop: asyncio.Event, mine: asyncio.Event) -> None:
        await _pause(stop, self.rng.uniform(*SHARD_INCARNATION_S))
        mine.set()

    async def _release(self, shard: Shard) -> None:
        await shard.close()
        if shard.store is not None:
            shard.store.close()
        self._shard = None

    async def finish(self) -> None:
        """After the run: the last incarnation (or a new one) applies what is left until
        its source stays idle, then its counters, applied LSNs and checkpoint are
        recorded; bounded by SHARD_DRAIN_S."""
        op = self.history.invoke("shard", "shard_final", vchannel=self.vchannel)
        deadline = time.monotonic() + SHARD_DRAIN_S
        shard = self._shard
        while shard is None and time.monotonic() < deadline:
            shard = await self._take()
        if shard is None or shard.store is None:
            op.error = "no shard could be taken after the run"
            return
        self._shard = shard
        idle_since = time.monotonic()
        try:
            while time.monotonic() < deadline:
                if await shard.run_once():
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= SHARD_IDLE_S:
                    break
        except RaftwalError as error:
            op.error = f"draining failed: {str(error)[:200]}"
        store = shard.store
        # Reads outside a store transaction go to the connection (the store's execute is
        # for the application's writes).
        counters = dict(store.conn.execute("SELECT key, n FROM counters").fetchall())
        applied = [row[0] for row in store.conn.execute("SELECT lsn FROM applied ORDER BY rowid")]
        checkpoint = store.checkpoint()
        self.history.ok(
            op,
            source_lsn=checkpoint.source_lsn,
            token=checkpoint.token,
            counters=counters,
            applied=applied,
            incarnations=self.token,
        )
        await self._release(shard)


class PositionSampler:
    """Linearizable positions and members of the subscriptions, one call at a time; a
    Seek back on `seek_subscription` every SEEK_EVERY_S."""

    def __init__(
        self,
        client: StreamingClient,
        subscriptions: Sequence[str],
        seek_subscription: str,
        history: History,
        rng: random.Random,
    ) -> None:
        self.client = client
        self.subscriptions = list(subscriptions)
        self.seek_subscription = seek_subscription
        self.history = history
        self.rng = rng
        self.failures = 0

    async def _observe(self, subscription: str) -> dict[str, int]:
        op = self.history.invoke("positions", "sub_observe", subscription=subscription)
        try:
            described = await self.client.coordinator.describe_subscription(subscription)
        except RaftwalError as error:
            self.history.failed(op, error)
            self.failures += 1
            return {}
        found = described.subscription
        positions = {v: int(p.lsn) for v, p in found.positions.items()}
        members = {m: [int(x.generation), list(x.vchannels)] for m, x in found.members.items()}
        self.history.ok(op, positions=positions, members=members)
        return positions

    async def run(self, stop: asyncio.Event) -> None:
        next_seek = time.monotonic() + SEEK_EVERY_S
        rounds = 0
        while not stop.is_set() and rounds < 1_000_000:
            rounds += 1
            for subscription in self.subscriptions:
                positions = await self._observe(subscription)
                if subscription == self.seek_subscription and time.monotonic() >= next_seek:
                    next_seek = time.monotonic() + SEEK_EVERY_S
                    moved = [v for v, lsn in positions.items() if lsn > 2]
                    if moved:
                        vchannel = self.rng.choice(sorted(moved))
                        await self._seek(subscription, vchannel, positions[vchannel] // 2)
            await _pause(stop, SAMPLE_INTERVAL_S)

    async def _seek(self, subscription: str, vchannel: str, lsn: int) -> None:
        op = self.history.invoke(
            "positions", "sub_seek", subscription=subscription, vchannel=vchannel, lsn=lsn
        )
        try:
            await self.client.coordinator.seek_subscription(
                subscription, vchannel=vchannel, lsn=lsn
            )
        except RaftwalError as error:
            self.history.failed(op, error)
            if error.code == E.COMPACTED and error.info.first_available > lsn:
                # Retention deleted that far back: seek to the first entry it kept.
                await self._seek(subscription, vchannel, error.info.first_available)
        else:
            self.history.ok(op)
