"""Time-tick packs over the vchannels of a subscription (Milvus' ``TtMsgStream``/``MsgPack``).

A **pack** holds every message of the subscription's vchannels with a time tick in
(``begin_time_tick``, ``end_time_tick``], in (time_tick, vchannel, lsn) order, with the
position of each vchannel before and after it. Packs are contiguous: each one begins where
the previous one ended. A pack is cut only once every vchannel's committed time-tick
watermark (``ConsumeResponse.committed_time_tick``) has reached its end, so it is complete
and never revised: no message with a tick at or below the watermark can be committed later,
on this owner or on any later one (see ``ChannelOwner.advance_time_tick``). An idle pchannel
keeps its watermark moving with time-tick entries its owner appends after
``time_tick_interval_ms`` without writes, so no pack waits on it much longer than that.

Public API (small and stable: the shard framework builds on it):

- ``Pack``: ``begin_time_tick``, ``end_time_tick``, ``messages`` (``WalEntry``),
  ``start_positions`` and ``end_positions`` ({vchannel: (lsn, time_tick)}; lsn 0 = nothing
  consumed on that vchannel yet).
- ``PackAssembler``: the pure assembly (no I/O, clock or randomness): ``add(vchannel,
  entries, watermark)`` and ``next_pack()``.
- ``pack_begin(positions)``: where a pack stream resumes, from a subscription's positions.
- ``PackConsumer(client, subscription, ...)``: an async iterator of packs. It starts where
  the subscription stands and commits the end positions of the packs the caller has
  finished with (a pack counts once the caller asks for the next, calls ``commit()``, or
  leaves ``async with`` without an exception) every ``commit_every`` packs or
  ``commit_interval_ms``, and at close: at least once, like ``SubscriptionConsumer``.

How it resumes: each vchannel's position is committed as (last lsn of that vchannel in the
finished pack, the pack's end tick), and only when its lsn moved. After a restart every
vchannel resumes after its lsn, and the pack stream begins at the highest committed end
tick (committed after the latest Seek): entries at or below it belong to finished packs
and are skipped, which also covers a commit cut short between two vchannels. So positions
of a pack subscription must move only through ``PackConsumer`` (or Seek), not through a
``SubscriptionConsumer`` whose ticks are per entry.

This module must never hand out a pack before every vchannel's watermark has reached its
end, nor commit a pack the caller has not finished with. Buffers are bounded
(``max_buffered_entries`` per vchannel: a vchannel ahead of the slowest one stops reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from rpc.aio import wait_event
from rpc.errors import InvalidArgumentError, RaftwalError, error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.streaming.consumer import Consumer, refuse_start_options
from rpc.streaming.routing import StreamingClientBase, _check_range

log = logging.getLogger(__name__)
E = errors_pb2

#: default ms without writes after which an idle pchannel's owner appends a time-tick entry
DEFAULT_TIME_TICK_INTERVAL_MS = 100
# How long one wait for reader progress lasts before the consumer checks its readers and
# commit timer again.
WAIT_SLICE_S = 1.0
# A commit refused for one of these (a pchannel's owner is being replaced, the Raft leader
# moved) is tried again at the next commit point instead of failing the iteration; at
# close and on demand (commit()) it is retried, bounded by CLOSE_COMMIT_TIMEOUT_S.
TRANSIENT_COMMIT_CODES = frozenset({E.NOT_OWNER, E.UNAVAILABLE, E.ON_SHUTDOWN, E.NOT_LEADER})
CLOSE_COMMIT_TIMEOUT_S = 30.0
CLOSE_COMMIT_RETRY_S = 0.2


@dataclass(frozen=True)
class Pack:
    """Every message with begin_time_tick < time_tick <= end_time_tick on the vchannels."""

    begin_time_tick: int
    end_time_tick: int
    messages: tuple[wire.WalEntry, ...]
    #: {vchannel: (lsn, time_tick)} before and after this pack (lsn of the last message
    #: consumed on the vchannel, or the one before the pack when it has none there)
    start_positions: Mapping[str, tuple[int, int]]
    end_positions: Mapping[str, tuple[int, int]]

    def __len__(self) -> int:
        return len(self.messages)


class PackOrderError(ValueError):
    """Entries or a watermark that break the watermark's promise (a bug upstream)."""


class PackAssembler:
    """Pure pack assembly: entries and watermarks in, complete packs out.

    `begin_time_tick` is the end of the last finished pack (entries at or below it are
    skipped: they were in finished packs); `positions` {vchannel: lsn} where each vchannel
    stands. With `emit_empty`, a pack is cut whenever the watermark moves, even without
    messages; otherwise empty ranges merge into the next pack that has messages.
    """

    def __init__(
        self,
        vchannels: Iterable[str],
        *,
        begin_time_tick: int = 0,
        positions: Mapping[str, int] | None = None,
        emit_empty: bool = False,
    ) -> None:
        self.vchannels = tuple(sorted(set(vchannels)))
        if not self.vchannels:
            raise ValueError("a pack needs at least one vchannel (got none)")
        if begin_time_tick < 0:
            raise ValueError(f"invalid begin_time_tick ({begin_time_tick}; expected >= 0)")
        self.emit_empty = emit_empty
        #: end of the last pack cut (the next pack's begin)
        self.end_time_tick = begin_time_tick
        self._floor = begin_time_tick
        self._buffers: dict[str, deque[wire.WalEntry]] = {v: deque() for v in self.vchannels}
        self._watermarks = dict.fromkeys(self.vchannels, 0)
        start = positions or {}
        self._positions = {v: (int(start.get(v, 0)), begin_time_tick) for v in self.vchannels}
        # (lsn, time_tick) of the last entry added per vchannel: order checks.
        self._last_added = {v: (self._positions[v][0], 0) for v in self.vchannels}
        #: entries skipped because a finished pack held them (a resume after a cut commit)
        self.skipped = 0

    def buffered(self, vchannel: str | None = None) -> int:
        """Entries waiting for a pack (of one vchannel, or of all)."""
        if vchannel is not None:
            return len(self._buffers[vchannel])
        return sum(len(b) for b in self._buffers.values())

    def watermark(self, vchannel: str | None = None) -> int:
        """The committed time tick every vchannel (or this one) has reached."""
        if vchannel is not None:
            return self._watermarks[vchannel]
        return min(self._watermarks.values())

    def add(self, vchannel: str, entries: Sequence[wire.WalEntry], watermark: int) -> None:
        """Entries of `vchannel` in LSN order, then its watermark: every entry of it with a
        time tick <= `watermark` has been added now. Raises PackOrderError on entries out of
        order or below a pack already cut."""
        if vchannel not in self._buffers:
            raise ValueError(f"unknown vchannel {vchannel!r} (expected one of {self.vchannels})")
        buffer = self._buffers[vchannel]
        last_lsn, last_tick = self._last_added[vchannel]
        for entry in entries:
            if entry.lsn <= last_lsn or entry.time_tick <= last_tick:
                raise PackOrderError(
                    f"{vchannel}: entry lsn {entry.lsn} tick {entry.time_tick} after lsn "
                    f"{last_lsn} tick {last_tick} (expected both to increase)"
                )
            last_lsn, last_tick = entry.lsn, entry.time_tick
            if entry.time_tick <= self._floor:
                self.skipped += 1
                continue
            if entry.time_tick <= self.end_time_tick:
                raise PackOrderError(
                    f"{vchannel}: entry lsn {entry.lsn} tick {entry.time_tick} arrived after "
                    f"the pack ending at {self.end_time_tick} was cut (a watermark lied)"
                )
            buffer.append(entry)
        self._last_added[vchannel] = (last_lsn, last_tick)
        # Delivered entries are below the watermark by definition.
        self._watermarks[vchannel] = max(self._watermarks[vchannel], watermark, last_tick)

    def next_pack(self) -> Pack | None:
        """The next complete pack, or None while some vchannel's watermark is below every
        possible end (or, without `emit_empty`, while the complete range has no message)."""
        end = self.watermark()
        if end <= self.end_time_tick:
            return None
        taken: list[wire.WalEntry] = []
        counts: dict[str, int] = {}
        for vchannel, buffer in self._buffers.items():
            count = 0
            for entry in buffer:
                if entry.time_tick > end:
                    break
                count += 1
            counts[vchannel] = count
        if not any(counts.values()) and not self.emit_empty:
            return None
        start_positions = dict(self._positions)
        for vchannel, count in counts.items():
            buffer = self._buffers[vchannel]
            if count:
                chunk = [buffer.popleft() for _ in range(count)]
                taken.extend(chunk)
                self._positions[vchannel] = (chunk[-1].lsn, end)
            else:
                self._positions[vchannel] = (self._positions[vchannel][0], end)
        taken.sort(key=lambda e: (e.time_tick, e.vchannel, e.lsn))
        pack = Pack(
            begin_time_tick=self.end_time_tick,
            end_time_tick=end,
            messages=tuple(taken),
            start_positions=start_positions,
            end_positions=dict(self._positions),
        )
        self.end_time_tick = end
        return pack


class _Position(Protocol):
    lsn: int
    time_tick: int
    from_time_tick: int
    revision: int


def pack_begin(positions: Mapping[str, _Position]) -> int:
    """Where a pack stream resumes, from a subscription's positions: the highest time tick
    committed after the latest Seek (a seek leaves time_tick 0), else just before the
    earliest tick a Seek named, else 0."""
    seek_revision = max(
        (p.revision for p in positions.values() if p.time_tick == 0 and p.revision), default=0
    )
    committed = [
        p.time_tick
        for p in positions.values()
        if p.time_tick > 0 and p.lsn > 0 and p.revision > seek_revision
    ]
    if committed:
        return max(committed)
    sought = [p.from_time_tick for p in positions.values() if p.from_time_tick > 0]
    return max(0, min(sought) - 1) if sought else 0


class PackConsumer:
    """Packs of subscription `subscription` (all its vchannels, or `vchannels`), resumed from
    its committed positions and committed as they are consumed (see the module docstring).

    `consumer_options` go to each vchannel's ``Consumer`` (retry bounds, msg_types, ...).
    """

    def __init__(
        self,
        client: StreamingClientBase,
        subscription: str,
        *,
        vchannels: Sequence[str] | None = None,
        time_tick_interval_ms: int = DEFAULT_TIME_TICK_INTERVAL_MS,
        commit_every: int = 10,
        commit_interval_ms: int = 100,
        emit_empty: bool = False,
        member_id: str = "",
        generation: int = 0,
        max_buffered_entries: int = 100_000,
        **consumer_options: Any,
    ) -> None:
        _check_range("time_tick_interval_ms", time_tick_interval_ms, 1, 60_000)
        _check_range("commit_every", commit_every, 1, 1_000_000)
        _check_range("commit_interval_ms", commit_interval_ms, 1, 3_600_000)
        _check_range("max_buffered_entries", max_buffered_entries, 1, 10_000_000)
        refuse_start_options("PackConsumer", consumer_options)
        self._client = client
        self.subscription = subscription
        self._wanted = list(vchannels) if vchannels is not None else None
        self.time_tick_interval_ms = time_tick_interval_ms
        self.commit_every = commit_every
        self.commit_interval_s = commit_interval_ms / 1000
        self.emit_empty = emit_empty
        self.member_id = member_id
        self.generation = generation
        self.max_buffered_entries = max_buffered_entries
        self._consumer_options = consumer_options
        self._assembler: PackAssembler | None = None
        self._consumers: dict[str, Consumer] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._failure: BaseException | None = None
        self._closed = False
        # The last pack handed out, the one before it, and the committed lsn per vchannel.
        self._delivered: Pack | None = None
        self._previous: Pack | None = None
        self._committed_lsn: dict[str, int] = {}
        self._committed_end = 0
        self._uncommitted = 0
        self._last_commit_at = time.monotonic()
        #: packs handed out and commits made, for the caller's status
        self.delivered_count = 0
        self.commits = 0
        #: commits put off after a transient refusal (see TRANSIENT_COMMIT_CODES)
        self.deferred_commits = 0

    @property
    def vchannels(self) -> tuple[str, ...]:
        return self._assembler.vchannels if self._assembler is not None else ()

    @property
    def begin_time_tick(self) -> int:
        """The end of the last pack cut (where the next pack begins)."""
        return self._assembler.end_time_tick if self._assembler is not None else 0

    @property
    def committed_time_tick(self) -> int:
        """The end tick of the last pack committed (or resumed from)."""
        return self._committed_end

    def status(self) -> dict[str, Any]:
        """Where the consumer stands, per vchannel (for the caller's status and errors)."""
        assembler = self._assembler
        if assembler is None:
            return {"started": False}
        return {
            "begin_time_tick": assembler.end_time_tick,
            "committed_time_tick": self._committed_end,
            "packs": self.delivered_count,
            "commits": self.commits,
            "deferred_commits": self.deferred_commits,
            "vchannels": {
                v: {
                    "watermark": assembler.watermark(v),
                    "buffered": assembler.buffered(v),
                    "last_lsn": self._consumers[v].last_lsn,
                    "connections": self._consumers[v].connections,
                }
                for v in assembler.vchannels
            },
        }

    async def start(self) -> PackConsumer:
        """Read the subscription and open a stream per vchannel (also done by ``async
        with`` and the first ``__anext__``)."""
        if self._assembler is not None:
            return self
        described = await self._client.coordinator.describe_subscription(self.subscription)
        found = described.subscription
        vchannels = list(found.vchannels) if self._wanted is None else self._wanted
        unknown = [v for v in vchannels if v not in found.vchannels]
        if unknown or not vchannels:
            raise InvalidArgumentError(
                error_info(
                    E.INVALID_ARGUMENT,
                    f"vchannels {unknown[:8] or '(none)'} for packs of subscription "
                    f"{self.subscription!r} (expected some of {list(found.vchannels)[:8]})",
                )
            )
        positions = {v: found.positions[v] for v in vchannels if v in found.positions}
        begin = pack_begin(positions)
        starts: dict[str, int] = {}
        for vchannel in vchannels:
            options: dict[str, Any] = {}
            position = positions.get(vchannel)
            if position is not None and position.lsn > 0:
                options["start_after"] = position.lsn
                starts[vchannel] = position.lsn
                self._committed_lsn[vchannel] = position.lsn
            elif position is not None and position.from_time_tick > 0:
                options["from_time_tick"] = position.from_time_tick
            elif found.start == pb.SUBSCRIPTION_START_LATEST:
                options["latest"] = True
            elif found.start == pb.SUBSCRIPTION_START_LSN:
                options["from_lsn"] = found.start_lsn
            elif found.start == pb.SUBSCRIPTION_START_TIME_TICK:
                options["from_time_tick"] = found.start_time_tick
            self._consumers[vchannel] = Consumer(
                self._client,
                vchannel,
                time_tick_interval_ms=self.time_tick_interval_ms,
                **options,
                **self._consumer_options,
            )
        self._assembler = PackAssembler(
            vchannels, begin_time_tick=begin, positions=starts, emit_empty=self.emit_empty
        )
        self._committed_end = begin
        try:
            for consumer in self._consumers.values():
                await consumer.start()
        except BaseException:
            await self._stop_streams()
            raise
        for vchannel, consumer in self._consumers.items():
            self._readers[vchannel] = asyncio.create_task(
                self._read(vchannel, consumer), name=f"packs:{self.subscription}:{vchannel}"
            )
        return self

    async def _read(self, vchannel: str, consumer: Consumer) -> None:
        assembler = self._assembler
        assert assembler is not None
        try:
            while not self._closed:
                # Bounded buffers: a vchannel ahead of the slowest one waits for packs to
                # be cut; the slowest one always reads (or nothing could ever be cut).
                while (
                    assembler.buffered(vchannel) >= self.max_buffered_entries
                    and assembler.watermark(vchannel) > assembler.watermark()
                ):
                    self._room.clear()
                    await wait_event(self._room, WAIT_SLICE_S)
                entries = await consumer.read_batch()
                assembler.add(vchannel, entries, consumer.watermark)
                self._wake.set()
        except StopAsyncIteration:
            return
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - handed to the iterating caller
            if self._failure is None:
                self._failure = error
            self._wake.set()

    def __aiter__(self) -> PackConsumer:
        return self

    async def __anext__(self) -> Pack:
        await self.start()
        assembler = self._assembler
        assert assembler is not None
        # The caller asks for the next pack: it is done with the last one.
        if self._delivered is not None and self._uncommitted:
            await self._maybe_commit()
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._failure is not None:
                raise self._failure
            pack = assembler.next_pack()
            if pack is not None:
                self._room.set()
                self._previous, self._delivered = self._delivered, pack
                self._uncommitted += 1
                self.delivered_count += 1
                return pack
            self._wake.clear()
            wait_s = WAIT_SLICE_S
            if self._uncommitted:
                # Commit the finished pack on time even while no new pack comes.
                due_in = self._last_commit_at + self.commit_interval_s - time.monotonic()
                if due_in <= 0:
                    await self._commit(self._delivered)
                    continue
                wait_s = min(wait_s, due_in)
            await wait_event(self._wake, wait_s)

    async def _maybe_commit(self) -> None:
        due = time.monotonic() - self._last_commit_at >= self.commit_interval_s
        if self._uncommitted >= self.commit_every or due:
            await self._commit(self._delivered)

    async def _commit(self, pack: Pack | None, defer: bool = True) -> None:
        if pack is None:
            return
        if pack.end_time_tick <= self._committed_end:
            if pack is self._delivered:
                self._uncommitted = 0
            return
        moved = {
            vchannel: position
            for vchannel, position in pack.end_positions.items()
            if position[0] > self._committed_lsn.get(vchannel, 0)
        }
        if moved:
            try:
                await self._client.coordinator.commit_subscription(
                    self.subscription,
                    moved,
                    member_id=self.member_id,
                    generation=self.generation,
                )
            except RaftwalError as error:
                if not defer or error.info.code not in TRANSIENT_COMMIT_CODES:
                    raise
                # Nothing is lost: the pack stays uncommitted and the next commit point
                # sends its positions again (a vchannel already committed is a no-op).
                log.info("commit of %s deferred: %s", self.subscription, error)
                self.deferred_commits += 1
                self._last_commit_at = time.monotonic()
                return
            for vchannel, (lsn, _) in moved.items():
                self._committed_lsn[vchannel] = lsn
            self.commits += 1
        self._committed_end = pack.end_time_tick
        if pack is self._delivered:
            self._uncommitted = 0
        self._last_commit_at = time.monotonic()

    async def commit(self) -> None:
        """Commit every pack handed out so far (the caller is done with the last one);
        returns once committed, retrying transient refusals (an owner being replaced) for
        up to CLOSE_COMMIT_TIMEOUT_S."""
        await self._commit_retrying(self._delivered)

    async def _stop_streams(self) -> None:
        for task in self._readers.values():
            task.cancel()
        for task in self._readers.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._readers.clear()
        for consumer in self._consumers.values():
            with contextlib.suppress(Exception):
                await consumer.close()

    async def close(self, failed: bool = False) -> None:
        """Commit the packs consumed (all handed out, or all but the last when `failed`:
        the caller did not finish with it) and close the streams (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        try:
            if self._assembler is not None:
                await self._commit_retrying(self._previous if failed else self._delivered)
        finally:
            await self._stop_streams()

    async def _commit_retrying(self, pack: Pack | None) -> None:
        deadline = time.monotonic() + CLOSE_COMMIT_TIMEOUT_S
        while True:
            try:
                await self._commit(pack, defer=False)
                return
            except RaftwalError as error:
                if (
                    error.info.code not in TRANSIENT_COMMIT_CODES
                    or time.monotonic() + CLOSE_COMMIT_RETRY_S > deadline
                ):
                    raise
            await asyncio.sleep(CLOSE_COMMIT_RETRY_S)

    async def __aenter__(self) -> PackConsumer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close(failed=exc is not None)


__all__ = [
    "DEFAULT_TIME_TICK_INTERVAL_MS",
    "Pack",
    "PackAssembler",
    "PackConsumer",
    "PackOrderError",
    "pack_begin",
]
