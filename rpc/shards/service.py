"""Exactly-once consumer shards (Gazette's consumer framework): the ``Application``
interface, the ``Shard`` that runs one application over one shard, and the
``ConsumerService`` that runs the shards the coordinator assigns to this process.

A shard is (subscription, vchannel). Its state is a ``ShardStore`` (SQLite) and its
recovery log (``RecoveryLog``). Taking a shard (``Shard.recover``):
1. open the local SQLite file (or start an empty one when the disk was lost);
2. replay the recovery log after the store's checkpoint, up to the log's last LSN;
3. append a fence record under the member's generation (the fencing token) with
   ``expected_last_lsn`` = the last LSN replayed; from here on, a previous owner's append
   (whose expected LSN is now stale) is refused, so a zombie can never commit;
4. read the source vchannel after the store's checkpoint.

One store transaction per batch: ``app.consume(store, entries)`` writes through the store,
the checkpoint (source position + token) joins the same SQLite transaction, the record is
appended to the recovery log (fenced), then SQLite commits. A crash before the append
loses the batch (it is consumed again); a crash after it is repaired by the replay. The
subscription's position in Raft follows the store (at most ``commit_interval_ms`` behind,
fenced by member generation) for lag and retention; the store's checkpoint is what counts.

The source is a ``ShardSource``: a vchannel (``VChannelSource``) today; a pack stream can be
one too (``next_batch`` returning the entries of whole packs, ``last`` the end position).
This module must never commit SQLite before the recovery record was appended.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rpc.aio import wait_event
from rpc.errors import ChannelFencedError, NotFoundError, RaftwalError, error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.routing import _invalid
from rpc.shards.recovery import RecoveryLog, recovery_names
from rpc.shards.store import Checkpoint, Record, ShardStore, decode_record, encode_record
from rpc.streaming.consumer import MAX_CONSUME_BATCH, Consumer
from rpc.streaming.routing import StreamingClientBase, _check_range
from rpc.streaming.subscription import SubscriptionMember

log = logging.getLogger(__name__)
E = errors_pb2


@runtime_checkable
class Application(Protocol):
    """What the user implements. Every method runs inside an open store transaction and
    writes only through ``store.db`` / ``store.execute`` / ``store.executemany``."""

    def init_store(self, store: ShardStore) -> None:
        """Create the application's tables (idempotent: CREATE ... IF NOT EXISTS). Runs
        when a process takes the shard, in the fence transaction."""

    def consume(self, store: ShardStore, entries: Sequence[wire.WalEntry]) -> None:
        """Apply `entries` (in LSN order) to the store."""

    def finalize(self, store: ShardStore) -> None:
        """Called once per transaction after the last ``consume`` and before the commit."""


class ShardSource(Protocol):
    """Where a shard's messages come from, resumed after a position."""

    async def start(self, after_lsn: int, **start: Any) -> None: ...

    async def next_batch(self, max_entries: int, linger_s: float) -> list[wire.WalEntry]: ...

    async def close(self) -> None: ...


class VChannelSource:
    """Entries of one vchannel after a position, in batches. A background task reads ahead
    into a bounded buffer (`max_buffered` entries) while the shard commits, so the next
    transaction takes everything that arrived meanwhile."""

    def __init__(
        self,
        client: StreamingClientBase,
        vchannel: str,
        *,
        max_buffered: int = 50_000,
        **options: Any,
    ) -> None:
        _check_range("max_buffered", max_buffered, 1, 10_000_000)
        self._client = client
        self.vchannel = vchannel
        self.max_buffered = max_buffered
        # Large responses: fewer round trips per entry (the Consumer's own bound).
        self._options = {"max_batch_entries": MAX_CONSUME_BATCH, **options}
        self._consumer: Consumer | None = None
        self._buffer: deque[wire.WalEntry] = deque()
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._pump_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    async def start(self, after_lsn: int, **start: Any) -> None:
        """After `after_lsn` when > 0, else where `start` says (Consumer's options)."""
        if after_lsn > 0:
            start = {"start_after": after_lsn}
        self._consumer = Consumer(self._client, self.vchannel, **start, **self._options)
        await self._consumer.start()
        self._pump_task = asyncio.create_task(self._pump(self._consumer))

    async def _pump(self, consumer: Consumer) -> None:
        try:
            while True:
                while len(self._buffer) >= self.max_buffered:
                    self._room.clear()
                    await self._room.wait()
                entry = await consumer.__anext__()
                self._buffer.append(entry)
                # What the same response brought, without a coroutine per entry.
                self._buffer.extend(consumer.drain(self.max_buffered - len(self._buffer)))
                self._arrived.set()
        except StopAsyncIteration:
            self._failure = _invalid(f"the source of {self.vchannel} was closed")
        except Exception as error:  # noqa: BLE001 (handed to the shard by next_batch)
            self._failure = error
        self._arrived.set()

    async def next_batch(self, max_entries: int, linger_s: float) -> list[wire.WalEntry]:
        """Up to `max_entries` of what has arrived; waits at most `linger_s` when nothing
        has. Raises what reading raised (after the Consumer's bounded retries)."""
        if self._pump_task is None:
            raise _invalid("source not started")
        if not self._buffer and self._failure is None:
            self._arrived.clear()
            await wait_event(self._arrived, linger_s)
        if not self._buffer and self._failure is not None:
            raise self._failure
        count = min(max_entries, len(self._buffer))
        batch = [self._buffer.popleft() for _ in range(count)]
        self._room.set()
        return batch

    async def close(self) -> None:
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
        if self._consumer is not None:
            await self._consumer.close()


@dataclass
class ShardStatus:
    """What ``Shard`` reports about itself."""

    subscription: str
    vchannel: str
    state: str = "RECOVERING"
    token: int = 0
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    applied: int = 0
    transactions: int = 0
    replayed_records: int = 0
    recovery_s: float = 0.0
    error: str = ""
    #: seconds spent waiting for the source, in the application, appending to the
    #: recovery log and committing SQLite (where the time of a transaction goes)
    wait_s: float = 0.0
    apply_s: float = 0.0
    append_s: float = 0.0
    commit_s: float = 0.0


class Shard:
    """One application over one shard, under fencing token `token` (the member's
    generation when it was assigned the vchannel). See the module docstring."""

    def __init__(
        self,
        client: StreamingClientBase,
        app: Application,
        subscription: str,
        vchannel: str,
        *,
        store_path: str | Path,
        member_id: str,
        token: int,
        generation: int | None = None,
        max_batch_messages: int = 10_000,
        linger_ms: int = 20,
        commit_interval_ms: int = 1000,
        record_max_bytes: int = 4 << 20,
        source: ShardSource | None = None,
        synchronous: str = "FULL",
        commit_as_member: bool = True,
        retry_timeout_s: float = 60.0,
        attempt_timeout_s: float = 10.0,
    ) -> None:
        _check_range("max_batch_messages", max_batch_messages, 1, 1_000_000)
        _check_range("linger_ms", linger_ms, 0, 60_000)
        _check_range("commit_interval_ms", commit_interval_ms, 1, 3_600_000)
        _check_range("record_max_bytes", record_max_bytes, 1024, 8 << 20)
        if token <= 0:
            raise _invalid(f"invalid token ({token}; expected > 0: the member's generation)")
        self._client = client
        self.app = app
        self.subscription = subscription
        self.vchannel = vchannel
        self.member_id = member_id
        self.token = token
        #: the member's current generation, for the fenced commit to Raft
        self.generation = generation if generation is not None else token
        #: False: the process is not a subscription member (a standalone shard over a
        #: subscription without members); its Raft commits then carry no member
        self.commit_as_member = commit_as_member
        self.max_batch_messages = max_batch_messages
        self.linger_s = linger_ms / 1000
        self.commit_interval_s = commit_interval_ms / 1000
        self.record_max_bytes = record_max_bytes
        self.store_path = Path(store_path)
        self._synchronous = synchronous
        rlog_pchannel, rlog_vchannel = recovery_names(subscription, vchannel)
        self.recovery_log = RecoveryLog(
            client,
            rlog_pchannel,
            rlog_vchannel,
            retry_timeout_s=retry_timeout_s,
            attempt_timeout_s=attempt_timeout_s,
        )
        self.source: ShardSource = source or VChannelSource(client, vchannel)
        self.store: ShardStore | None = None
        self.status = ShardStatus(subscription, vchannel, token=token)
        self._producer_id = f"shard.{subscription}.{vchannel}.{member_id}.{token}"
        self._sequence = time.time_ns() // 1000
        self._raft_committed: tuple[int, int] = (0, 0)
        self._last_raft_commit = 0.0
        # At most one position commit in flight, beside the transactions (never awaited by
        # them: Raft's latency must not stall the store); its fencing error is raised by
        # the next run_once.
        self._raft_task: asyncio.Task[None] | None = None
        self._raft_failure: ChannelFencedError | None = None

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    # -- taking the shard --------------------------------------------------------------

    async def recover(self) -> ShardStatus:
        """Replay the recovery log into the store, fence it, start the source."""
        started = time.monotonic()
        # An unknown subscription or vchannel is NOT_FOUND before anything is created.
        subscription_start = await self._subscription_start()
        await self.recovery_log.ensure()
        self.store = ShardStore(self.store_path, synchronous=self._synchronous)
        store = self.store
        replayed = 0
        for _ in range(20):
            last_lsn, _committed = await self.recovery_log.tail()
            replayed += await self._replay(last_lsn)
            # Fence: the first record under this token, right after what was replayed.
            store.begin()
            try:
                self.app.init_store(store)
                current = store.checkpoint()
                record = Record(
                    kind="fence",
                    token=self.token,
                    member_id=self.member_id,
                    source_lsn=current.source_lsn,
                    source_time_tick=current.source_time_tick,
                    ops=store.prepare(
                        Checkpoint(
                            current.source_lsn,
                            current.source_time_tick,
                            self.token,
                            self.member_id,
                            current.rlog_lsn,
                        )
                    ).ops,
                )
                rlog_lsn = await self.recovery_log.append(
                    encode_record(record),
                    store.checkpoint().rlog_lsn,
                    self._producer_id,
                    self._next_sequence(),
                )
            except RaftwalError as error:
                store.rollback()
                if error.info.code == E.UNMATCHED_CHANNEL_TERM:
                    continue  # something was appended meanwhile: replay it, then fence again
                raise
            except BaseException:
                store.rollback()
                raise
            store.commit(rlog_lsn)
            break
        else:
            raise ChannelFencedError(
                error_info(
                    E.CHANNEL_FENCED,
                    f"could not fence the recovery log of {self.subscription}/{self.vchannel}"
                    " in 20 attempts",
                )
            )
        checkpoint = store.checkpoint()
        start = {} if checkpoint.source_lsn else subscription_start
        await self.source.start(checkpoint.source_lsn, **start)
        self.status.state = "RUNNING"
        self.status.checkpoint = checkpoint
        self.status.replayed_records = replayed
        self.status.recovery_s = time.monotonic() - started
        log.info(
            "shard %s/%s taken under token %d: %d records replayed in %.3f s, resuming after "
            "lsn %d",
            self.subscription,
            self.vchannel,
            self.token,
            replayed,
            self.status.recovery_s,
            checkpoint.source_lsn,
        )
        return self.status

    async def _subscription_start(self) -> dict[str, Any]:
        """Where a shard without a checkpoint starts: the subscription's position, else
        its start policy."""
        described = await self._client.coordinator.describe_subscription(self.subscription)
        found = described.subscription
        if self.vchannel not in found.vchannels:
            raise NotFoundError(
                error_info(
                    E.NOT_FOUND,
                    f"shard {self.subscription}/{self.vchannel} not found (the subscription "
                    f"has vchannels {list(found.vchannels)[:8]})",
                )
            )
        position = found.positions.get(self.vchannel)
        # Where Raft stands, which may be behind the store (a process killed before its
        # position commit): the first commit after the takeover catches it up.
        self._raft_committed = (position.lsn, position.time_tick) if position else (0, 0)
        if position is not None and position.lsn > 0:
            return {"start_after": position.lsn}
        if position is not None and position.from_time_tick > 0:
            return {"from_time_tick": position.from_time_tick}
        if found.start == pb.SUBSCRIPTION_START_LATEST:
            return {"latest": True}
        if found.start == pb.SUBSCRIPTION_START_LSN:
            return {"from_lsn": found.start_lsn}
        if found.start == pb.SUBSCRIPTION_START_TIME_TICK:
            return {"from_time_tick": found.start_time_tick}
        return {}

    async def _replay(self, until_lsn: int) -> int:
        store = self.store
        assert store is not None
        replayed = 0
        after = store.checkpoint().rlog_lsn
        if after >= until_lsn:
            return 0
        async for entry in self.recovery_log.read(after, until_lsn):
            if entry.vchannel == self.recovery_log.vchannel:
                record = decode_record(entry.payload)
                if record.token > self.token:
                    raise ChannelFencedError(
                        error_info(
                            E.CHANNEL_FENCED,
                            f"shard {self.subscription}/{self.vchannel} was taken under token "
                            f"{record.token} (this process has {self.token})",
                            current_term=record.token,
                        )
                    )
                store.apply_record(record, entry.lsn)
                replayed += 1
            else:
                store.skip_to(entry.lsn)
        return replayed

    # -- running -----------------------------------------------------------------------

    async def run_once(self) -> int:
        """One store transaction over the next batch (none when the source had nothing
        within linger); the number of entries applied."""
        store = self.store
        if store is None:
            raise _invalid("shard not recovered (call recover() first)")
        waited = time.perf_counter()
        entries = await self.source.next_batch(self.max_batch_messages, self.linger_s)
        applying = time.perf_counter()
        self.status.wait_s += applying - waited
        if not entries:
            self._position_in_background()
            return 0
        before = store.checkpoint()
        store.begin()
        try:
            self.app.consume(store, entries)
            self.app.finalize(store)
            last = entries[-1]
            record = store.prepare(
                Checkpoint(last.lsn, last.time_tick, self.token, self.member_id, before.rlog_lsn)
            )
            payload = encode_record(record)
            if len(payload) > self.record_max_bytes:
                raise _invalid(
                    f"store transaction too large for the recovery log ({len(payload)} bytes; "
                    f"expected <= {self.record_max_bytes}: lower max_batch_messages)"
                )
            appending = time.perf_counter()
            self.status.apply_s += appending - applying
            rlog_lsn = await self.recovery_log.fenced_append(
                payload, before.rlog_lsn, self._producer_id, self._next_sequence()
            )
        except BaseException:
            store.rollback()
            raise
        committing = time.perf_counter()
        self.status.append_s += committing - appending
        store.commit(rlog_lsn)
        self.status.commit_s += time.perf_counter() - committing
        self.status.applied += len(entries)
        self.status.transactions += 1
        self.status.checkpoint = store.checkpoint()
        self._position_in_background()
        return len(entries)

    def _position_in_background(self) -> None:
        if self._raft_failure is not None:
            raise self._raft_failure
        if self._raft_task is not None and not self._raft_task.done():
            return
        if time.monotonic() - self._last_raft_commit < self.commit_interval_s:
            return
        self._raft_task = asyncio.create_task(self._background_commit())

    async def _background_commit(self) -> None:
        try:
            await self._commit_raft(force=False)
        except ChannelFencedError as error:
            self._raft_failure = error

    async def _finish_position(self) -> None:
        """Wait for the commit in flight, then commit the final position."""
        if self._raft_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._raft_task
        if self._raft_failure is not None:
            raise self._raft_failure
        await self._commit_raft(force=True)

    async def _commit_raft(self, force: bool) -> None:
        """Move the subscription's position in Raft to the store's checkpoint (fenced by
        this member's generation), at most every commit_interval_ms unless `force`."""
        store = self.store
        if store is None:
            return
        checkpoint = store.checkpoint()
        position = (checkpoint.source_lsn, checkpoint.source_time_tick)
        if position[0] <= self._raft_committed[0]:
            return
        now = time.monotonic()
        if not force and now - self._last_raft_commit < self.commit_interval_s:
            return
        self._last_raft_commit = now
        try:
            await self._client.coordinator.commit_subscription(
                self.subscription,
                {self.vchannel: position},
                member_id=self.member_id if self.commit_as_member else "",
                generation=self.generation if self.commit_as_member else 0,
            )
        except ChannelFencedError:
            raise
        except RaftwalError as error:
            # The position in Raft only follows the store (lag, retention): a failed commit
            # (an owner moving, a leader election) is retried with the next one.
            log.warning(
                "shard %s/%s: position commit failed, retried later: %s",
                self.subscription,
                self.vchannel,
                error,
            )
            return
        self._raft_committed = position

    async def run(self, stop: asyncio.Event) -> None:
        """Transactions until `stop` is set (or a typed error: fenced, unavailable)."""
        try:
            while not stop.is_set():
                await self.run_once()
            try:
                await self._finish_position()
            except ChannelFencedError as error:
                log.warning(
                    "shard %s/%s: final position commit fenced: %s",
                    self.subscription,
                    self.vchannel,
                    error,
                )
            self.status.state = "STOPPED"
        except ChannelFencedError as error:
            self.status.state = "FENCED"
            self.status.error = error.info.message
            raise
        except BaseException as error:
            self.status.state = "FAILED"
            self.status.error = repr(error)
            raise

    async def close(self) -> None:
        if self._raft_task is not None and not self._raft_task.done():
            self._raft_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._raft_task
        with contextlib.suppress(RaftwalError):
            await self.source.close()
        if self.store is not None:
            self.store.close()
            self.store = None


def shard_store_path(data_dir: str | Path, subscription: str, vchannel: str) -> Path:
    """Where a shard's SQLite file lives under `data_dir` (names are checked to be plain)."""
    for name in (subscription, vchannel):
        if not name or "/" in name or name in (".", "..") or "\x00" in name:
            raise _invalid(f"invalid name for a store file ({name!r}; expected a plain name)")
    return Path(data_dir) / subscription / f"{vchannel}.sqlite"


def load_application(spec: str) -> Application:
    """The application named by ``MODULE:ATTR`` (a class is instantiated, a factory
    called, an instance used as is)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _invalid(f"invalid application ({spec!r}; expected MODULE:APP)")
    module = importlib.import_module(module_name)
    target = getattr(module, attr, None)
    if target is None:
        raise _invalid(f"module {module_name!r} has no {attr!r}")
    # A class (even one that looks like an Application) is instantiated; a factory called.
    if isinstance(target, type) or (callable(target) and not isinstance(target, Application)):
        app = target()
    else:
        app = target
    if not isinstance(app, Application):
        raise _invalid(f"{spec} is not an Application (expected init_store, consume and finalize)")
    return app


class ConsumerService:
    """Runs `app` over every shard of `subscription` the coordinator assigns to this
    process (a ``SubscriptionMember``). A vchannel moved away stops its shard; a new one
    is recovered under the member's generation; a shard fenced while the member lives (a
    rebalance moved the generation under its commit) is taken again under the current
    one if the member still holds it. ``run(stop)`` returns when `stop` is set; it raises
    ChannelFencedError when the member's lease was lost."""

    def __init__(
        self,
        client: StreamingClientBase,
        app: Application,
        subscription: str,
        *,
        member_id: str,
        data_dir: str | Path,
        lease_ttl_ms: int = 10_000,
        poll_s: float = 0.5,
        on_status: Callable[[ShardStatus], None] | None = None,
        **shard_options: Any,
    ) -> None:
        self._client = client
        self.app = app
        self.subscription = subscription
        self.member_id = member_id
        self.data_dir = Path(data_dir)
        self.lease_ttl_ms = lease_ttl_ms
        self.poll_s = poll_s
        self.on_status = on_status
        self._shard_options = shard_options
        self.shards: dict[str, Shard] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Event] = {}
        # Set when a shard's task ends (see _wait_poll).
        self._ended = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        described = await self._client.coordinator.describe_subscription(self.subscription)
        if not described.subscription.name:
            raise NotFoundError(
                error_info(E.NOT_FOUND, f"subscription {self.subscription!r} not found")
            )
        async with SubscriptionMember(
            self._client, self.subscription, self.member_id, lease_ttl_ms=self.lease_ttl_ms
        ) as member:
            try:
                while not stop.is_set():
                    if not member.alive:
                        raise ChannelFencedError(
                            error_info(
                                E.CHANNEL_FENCED,
                                f"member {self.member_id} lost its lease: its shards may "
                                "have moved",
                            )
                        )
                    generation, vchannels = await member.assignment()
                    await self._reconcile(generation, vchannels)
                    for name, task in list(self._tasks.items()):
                        if task.done():
                            error = task.exception()
                            del self._tasks[name]
                            if isinstance(error, ChannelFencedError) and member.alive:
                                # A rebalance moved this member's generation (or the
                                # shard) while the shard committed with the one before:
                                # drop it; the next reconcile takes it again under the
                                # current generation if it is still this member's,
                                # recovering its store from its own checkpoint.
                                log.warning(
                                    "shard %s/%s fenced (%s): taking it again if still held",
                                    self.subscription,
                                    name,
                                    error.info.message,
                                )
                                self.shards.pop(name, None)
                                self._stops.pop(name, None)
                                continue
                            if error is not None:
                                raise error
                    await self._wait_poll(stop)
            finally:
                # The final position commits carry the member's current generation (an
                # assignment may have moved it since the last poll).
                with contextlib.suppress(RaftwalError, asyncio.TimeoutError):
                    generation, vchannels = await asyncio.wait_for(member.assignment(), 10)
                    for name in vchannels:
                        if name in self.shards:
                            self.shards[name].generation = generation
                await self._stop_all()

    async def _wait_poll(self, stop: asyncio.Event) -> None:
        """Until the next poll, `stop`, or a shard's end (a fenced shard is taken again
        at once, not a poll later)."""
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._ended.wait())]
        try:
            await asyncio.wait(waiters, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            self._ended.clear()

    async def _reconcile(self, generation: int, vchannels: list[str]) -> None:
        held = set(vchannels)
        for name in list(self.shards):
            if name not in held:
                await self._stop(name)
        for name in sorted(held):
            shard = self.shards.get(name)
            if shard is not None:
                shard.generation = generation
                continue
            shard = Shard(
                self._client,
                self.app,
                self.subscription,
                name,
                store_path=shard_store_path(self.data_dir, self.subscription, name),
                member_id=self.member_id,
                token=generation,
                **self._shard_options,
            )
            self.shards[name] = shard
            stop = asyncio.Event()
            self._stops[name] = stop
            self._tasks[name] = asyncio.create_task(self._run_shard(shard, stop))

    async def _run_shard(self, shard: Shard, stop: asyncio.Event) -> None:
        try:
            await shard.recover()
            if self.on_status:
                self.on_status(shard.status)
            await shard.run(stop)
        finally:
            if self.on_status:
                self.on_status(shard.status)
            await shard.close()
            self._ended.set()

    async def _stop(self, name: str) -> None:
        self._stops.pop(name).set()
        task = self._tasks.pop(name, None)
        self.shards.pop(name, None)
        if task is None:
            return
        try:
            await asyncio.wait_for(task, 30)
        except asyncio.CancelledError:
            if asyncio.current_task() is not None and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise
        except Exception as error:  # noqa: BLE001 (a stopped shard's failure is logged, not raised)
            log.warning("shard %s/%s stopped with %r", self.subscription, name, error)

    async def _stop_all(self) -> None:
        for name in list(self.shards):
            await self._stop(name)


def shard_rows(described: Any) -> list[dict[str, Any]]:
    """One row per shard of a DescribeSubscriptionResponse: vchannel, member, generation,
    state, position and lag (for ``raftwal shard list``)."""
    subscription = described.subscription
    holders: dict[str, tuple[str, int]] = {}
    for member in subscription.members.values():
        for vchannel in member.vchannels:
            holders[vchannel] = (member.member_id, member.generation)
    lags = {lag.vchannel: lag for lag in described.lags}
    rows = []
    for vchannel in subscription.vchannels:
        member_id, generation = holders.get(vchannel, ("", 0))
        lag = lags.get(vchannel)
        position = subscription.positions.get(vchannel, pb.SubscriptionPosition())
        rows.append(
            {
                "subscription": subscription.name,
                "vchannel": vchannel,
                "member_id": member_id,
                "generation": generation,
                "state": "ASSIGNED" if member_id else "UNASSIGNED",
                "position_lsn": position.lsn,
                "committed_lsn": lag.committed_lsn if lag is not None else 0,
                "lag_entries": lag.lsn_lag if lag is not None else 0,
                "recovery_log": recovery_names(subscription.name, vchannel)[1],
            }
        )
    return rows
