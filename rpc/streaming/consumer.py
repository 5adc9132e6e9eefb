"""The data plane's ``Consumer`` (``StreamingNode.Consume``).

``Consumer`` is an async iterator of committed ``WalEntry`` of one vchannel that resumes
after the last delivered LSN at the new owner when a stream breaks: no gap, no duplicate.

Every retry loop here is bounded in attempts and in time, and only errors that another
attempt can fix are retried. This module must never deliver an entry twice or skip one;
nor may it import ``rpc.streaming.client`` (which builds consumers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from rpc.coordinator_client import CoordinatorClient
from rpc.errors import ClientClosedError, UnavailableError, code_name, error_for, error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.routing import _Backoff, _invalid, unexpected_loop_error
from rpc.streaming.routing import (
    DEFAULT_ATTEMPT_TIMEOUT_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_TIMEOUT_S,
    MAX_NOT_EXIST_RETRIES,
    ROUTE_CHECK_S,
    Route,
    StreamingClientBase,
    _check_range,
    _classify_data,
    _resolve,
    _unavailable,
)

# The logger name of the data-plane SDK since it was one module (rpc/streaming_client.py).
log = logging.getLogger("rpc.streaming_client")
E = errors_pb2

# Server limit (raftwal/services/streaming_node.py): entries per Consume batch.
MAX_CONSUME_BATCH = 10_000
# A consumer whose stream has been quiet this long asks the owner for its position (bounded
# by CONSUMER_PROBE_TIMEOUT_S) to find out whether the owner is still there.
CONSUMER_PROBE_S = 5.0
CONSUMER_PROBE_TIMEOUT_S = 2.0
# After a replica failed a consumer (``prefer_replica``), it reads from the owner this long.
REPLICA_HOLD_S = 5.0


# ---------------------------------------------------------------------------------------
# Consumer
# ---------------------------------------------------------------------------------------


#: Consumer options that choose where to start: refused by readers that start where their
#: subscription stands.
START_OPTIONS = ("from_lsn", "start_after", "latest", "from_time_tick")


def refuse_start_options(reader: str, options: Mapping[str, object]) -> None:
    """InvalidArgumentError when `options` (passed on to a Consumer) choose a start:
    a subscription's readers start where the subscription stands."""
    for option in START_OPTIONS:
        if option in options:
            raise _invalid(
                f"{option} given to a {reader} (expected none: it starts where the "
                "subscription stands; seek the subscription to move it)"
            )


class Consumer:
    """Committed entries of one vchannel, in LSN order, as an async iterator.

    Where to start: ``from_lsn`` (that LSN and after), ``start_after`` (after that LSN),
    ``latest`` (only entries committed after the consumer first connects: ``start()``,
    ``async with`` or the first ``__anext__``), else the whole retained log. After a broken stream or an owner move it resumes after the last
    delivered LSN at the (new) owner, so no entry is skipped or delivered twice. Gives up
    with UnavailableError after ``max_attempts`` consecutive failures or ``retry_timeout_s``
    without progress; non-retryable answers (COMPACTED, INVALID_ARGUMENT, ...) raise their
    typed error.

    With ``time_tick_interval_ms`` the owner also reports a committed time-tick watermark
    (``watermark``: every entry of the vchannel with a time tick at or below it has been
    delivered, and none can be committed later), kept moving on an idle pchannel by
    time-tick entries after that many ms; ``read_batch()`` returns a response's entries at
    once, or none when only the watermark moved (time-tick packs, ``rpc.streaming.packs``).

    With ``prefer_replica`` the stream goes to a node of the pchannel's replica set other
    than its owner (one picked at random per consumer, so that consumers spread over the
    set), which serves the entries it knows to be committed: the same entries in the same
    order, a few milliseconds later than the owner. When that replica cannot serve (down,
    no longer in the set), the consumer reads from the owner for a while. Not with
    ``time_tick_interval_ms`` (the owner keeps an idle pchannel's time moving).
    """

    def __init__(
        self,
        client_or_endpoints: StreamingClientBase | CoordinatorClient | str | Sequence[str],
        vchannel: str,
        *,
        from_lsn: int | None = None,
        start_after: int | None = None,
        latest: bool = False,
        from_time_tick: int | None = None,
        msg_types: Sequence[str] | None = None,
        include_control: bool = False,
        max_batch_entries: int = 1000,
        time_tick_interval_ms: int = 0,
        retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
        prefer_replica: bool = False,
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
        if from_time_tick is not None and from_time_tick < 0:
            raise _invalid(f"invalid from_time_tick ({from_time_tick}; expected >= 0)")
        _check_range("max_batch_entries", max_batch_entries, 1, MAX_CONSUME_BATCH)
        if time_tick_interval_ms:
            _check_range("time_tick_interval_ms", time_tick_interval_ms, 1, 60_000)
        _check_range("retry_timeout_s", retry_timeout_s, 0.001, 3600)
        _check_range("max_attempts", max_attempts, 1, 1000)
        _check_range("attempt_timeout_s", attempt_timeout_s, 0.001, 3600)
        if prefer_replica and time_tick_interval_ms:
            raise _invalid(
                "invalid prefer_replica with time_tick_interval_ms (expected one of them: "
                "time-tick streams are served by the owner)"
            )
        self.vchannel = vchannel
        self.prefer_replica = bool(prefer_replica)
        # Which replica this consumer prefers (spread), moved on after each replica failure.
        self._replica_turn = random.randrange(1 << 16)
        self._replica_hold_until = 0.0
        #: the current stream is at a replica, not at the owner
        self.on_replica = False
        self._client, self._owns_client = _resolve(client_or_endpoints)
        self._latest = latest
        if from_lsn is not None:
            self._policy, self._lsn = wire.DELIVER_POLICY_START_FROM, from_lsn
        elif start_after is not None:
            self._policy, self._lsn = wire.DELIVER_POLICY_START_AFTER, start_after
        else:
            self._policy, self._lsn = wire.DELIVER_POLICY_ALL, 0
        # Entries with time_tick >= this only (a subscription sought to a time tick).
        self._from_time_tick = from_time_tick
        self._msg_types = list(msg_types or ())
        self._include_control = include_control
        self._max_batch_entries = int(max_batch_entries)
        self._time_tick_interval_ms = int(time_tick_interval_ms)
        # The committed time tick of the responses taken (`_pending_watermark`) becomes
        # `watermark` once their entries are handed out (undelivered entries are dropped at
        # a reconnect, and so is the watermark that covered them).
        self._pending_watermark = 0
        #: every entry with time_tick <= this has been delivered (time_tick_interval_ms)
        self.watermark = 0
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
        self._pending_watermark = self.watermark

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
                if not self._buffer:
                    self.watermark = max(self.watermark, self._pending_watermark)
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

    async def read_batch(self) -> list[wire.WalEntry]:
        """The next entries as they arrive, a whole response at a time (with
        ``time_tick_interval_ms``, possibly none: only ``watermark`` moved). Raises
        StopAsyncIteration once closed; otherwise what ``__anext__`` raises."""
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._buffer:
                out = []
                for entry in self._buffer:
                    if self._last_lsn is not None and entry.lsn <= self._last_lsn:
                        continue
                    self._last_lsn = entry.lsn
                    out.append(entry)
                self._buffer.clear()
                self.delivered += len(out)
                self.watermark = max(self.watermark, self._pending_watermark)
                return out
            if self._pending_watermark > self.watermark:
                self.watermark = self._pending_watermark
                return []
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

    def drain(self, max_entries: int) -> list[wire.WalEntry]:
        """Entries already received, without waiting (at most `max_entries`): what the next
        ``__anext__`` calls would return, in bulk (in order, none delivered twice)."""
        out: list[wire.WalEntry] = []
        while self._buffer and len(out) < max_entries and not self._closed:
            entry = self._buffer.popleft()
            if self._last_lsn is not None and entry.lsn <= self._last_lsn:
                continue
            self._last_lsn = entry.lsn
            self.delivered += 1
            out.append(entry)
        return out

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
                wire.GetLatestTimeTickRequest(
                    pchannel=self._pchannel, from_replica=self.on_replica
                ),
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
        if response.committed_time_tick > self._pending_watermark:
            self._pending_watermark = response.committed_time_tick
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
            from_time_tick=self._from_time_tick,
            time_tick_interval_ms=self._time_tick_interval_ms,
            from_replica=self.on_replica,
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
            replica = self._replica_address(route)
            self.on_replica = bool(replica)
            if replica:
                # The stream's route is the replica's: probes and failures are about it.
                address = replica
                route = dataclasses.replace(route, owner_address=replica)
                stub = self._client.stub(replica)
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

    def _replica_address(self, route: Route) -> str:
        """The replica to read from ("" for the owner)."""
        candidates = [a for a in route.replica_addresses if a and a != route.owner_address]
        if not self.prefer_replica or not candidates:
            return ""
        if time.monotonic() < self._replica_hold_until:
            return ""
        return sorted(candidates)[self._replica_turn % len(candidates)]

    async def _failed(
        self, info: errors_pb2.ErrorInfo, retryable: bool, address: str, term: int
    ) -> None:
        self._disconnect()
        if info.code == E.CHANNEL_NOT_EXIST and self._not_exist < MAX_NOT_EXIST_RETRIES:
            self._not_exist += 1
            retryable = True
        if not retryable:
            raise error_for(info)
        if self.on_replica:
            # A replica failed us: read from the owner for a while, then the next replica.
            # The routing table's view of the owner is not touched.
            self.on_replica = False
            self._replica_turn += 1
            self._replica_hold_until = time.monotonic() + REPLICA_HOLD_S
            log.info(
                "replica %s of %s failed a consumer (%s); reading from the owner",
                address,
                self._pchannel,
                info.message,
            )
        elif self._pchannel is not None:
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
