"""``RecoveryLog``: a shard's recovery log (Gazette's recovery log), a vchannel on a
pchannel of its own.

What lives here: appending one store transaction as one entry, with ``expected_last_lsn``
fencing, and reading the log back (control entries included) for replay.

Why a pchannel of its own: ``ProduceRequest.expected_last_lsn`` is a precondition on the
whole pchannel. On a private pchannel the only other entries are the owner's term starts
and seal markers, so "the log's last LSN is still the one I know" means "nobody else wrote
a record since". A failed precondition is checked by reading the tail: control entries only
-> retry at the new LSN; a record -> another owner took the shard -> ChannelFencedError.

Every loop here is bounded in attempts and time; an append whose outcome stayed unknown
raises UnavailableError, and the caller must re-read the log before it writes again (the
idempotent (producer_id, sequence) makes the retried append land at most once).
This module must never append without a precondition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import grpc

from rpc.errors import (
    AlreadyExistsError,
    ChannelFencedError,
    UnavailableError,
    UnmatchedChannelTermError,
    error_for,
    error_info,
)
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.routing import _invalid
from rpc.streaming.routing import StreamingClientBase, _check_range, _classify_data

log = logging.getLogger(__name__)
E = errors_pb2

#: the msg_type of recovery records
RECORD_MSG_TYPE = "message"
# Answers after which the same append is retried at the (new) owner.
_RETRY_CODES = frozenset(
    {E.NOT_OWNER, E.CHANNEL_FENCED, E.ON_SHUTDOWN, E.UNAVAILABLE, E.CHANNEL_NOT_EXIST}
)


def recovery_names(subscription: str, vchannel: str) -> tuple[str, str]:
    """(pchannel, vchannel) of the recovery log of shard (subscription, vchannel)."""
    base = f"{subscription}.{vchannel}.rlog"
    return f"{base}.p", base


def is_recovery_hold(subscription: str) -> bool:
    """True for the subscription a recovery log holds retention with (`RecoveryLog.
    hold_name`): it has no consumers, and shard listings leave it out."""
    return subscription.endswith(".rlog.p")


class RecoveryLog:
    """The recovery log of one shard (see the module docstring)."""

    def __init__(
        self,
        client: StreamingClientBase,
        pchannel: str,
        vchannel: str,
        *,
        retry_timeout_s: float = 30.0,
        attempt_timeout_s: float = 5.0,
    ) -> None:
        _check_range("retry_timeout_s", retry_timeout_s, 0.1, 3600)
        _check_range("attempt_timeout_s", attempt_timeout_s, 0.1, 600)
        self._client = client
        self.pchannel = pchannel
        self.vchannel = vchannel
        self.retry_timeout_s = retry_timeout_s
        self.attempt_timeout_s = attempt_timeout_s

    async def ensure(self, replica_count: int = 0) -> None:
        """Create the log's pchannel and vchannel unless they exist, and the subscription
        that keeps WAL retention off the log (`hold_name`)."""
        coordinator = self._client.coordinator
        with contextlib.suppress(AlreadyExistsError):
            await coordinator.create_channels(names=[self.pchannel], replica_count=replica_count)
        with contextlib.suppress(AlreadyExistsError):
            await coordinator.create_vchannel(self.vchannel, self.pchannel)
        # The log is the store's only history (no store snapshots): a new owner on an
        # empty disk replays it from its first record, so retention must never delete
        # any of it. A subscription from EARLIEST that never commits a position holds
        # the whole pchannel (creating the same one again is a no-op).
        await coordinator.create_subscription(
            self.hold_name, [self.vchannel], start="earliest", holds_retention=True
        )

    @property
    def hold_name(self) -> str:
        """The subscription that holds the log against WAL retention: named after the
        log's pchannel (subscriptions have their own namespace; a longer name could pass
        the name limit that the pchannel's own name meets)."""
        return self.pchannel

    async def _owner_stub(self, deadline: float) -> tuple[str, int, object]:
        route = await self._client.router.owner(
            self.pchannel, max(0.001, deadline - time.monotonic())
        )
        return route.owner_address, route.term, self._client.stub(route.owner_address)

    async def _rpc_failed(
        self,
        what: str,
        error: grpc.aio.AioRpcError,
        address: str,
        term: int,
        deadline: float,
        attempt: int,
    ) -> None:
        """A call to the owner failed: raise its typed error when it is final, else tell
        the routing table and wait before the next attempt (`_retrying`)."""
        info, retryable = _classify_data(error)
        if not retryable and info.code not in _RETRY_CODES:
            raise error_for(info) from error
        self._client.router.report_failure(self.pchannel, address, term, info)
        await self._retrying(what, deadline, attempt, info.message)

    async def _retrying(self, what: str, deadline: float, attempt: int, info: object) -> None:
        if time.monotonic() >= deadline:
            raise UnavailableError(
                error_info(
                    E.UNAVAILABLE,
                    f"{what} on recovery log {self.pchannel} failed for "
                    f"{self.retry_timeout_s} s (last: {info})",
                )
            )
        await asyncio.sleep(min(1.0, 0.05 * (2 ** min(attempt, 5))))

    async def tail(self) -> tuple[int, int]:
        """(last_lsn, committed_lsn) of the log's pchannel at its owner."""
        deadline = time.monotonic() + self.retry_timeout_s
        attempt = 0
        while True:
            address, term = "", 0
            try:
                address, term, stub = await self._owner_stub(deadline)
                answer = await stub.GetLatestTimeTick(  # type: ignore[attr-defined]
                    wire.GetLatestTimeTickRequest(pchannel=self.pchannel),
                    timeout=self.attempt_timeout_s,
                )
                return answer.last_lsn, answer.committed_lsn
            except grpc.aio.AioRpcError as error:
                info, retryable = _classify_data(error)
                if not retryable and info.code not in _RETRY_CODES:
                    raise error_for(info) from error
                self._client.router.report_failure(self.pchannel, address, term, info)
                attempt += 1
                await self._retrying("tail", deadline, attempt, info.message)
            except UnavailableError as error:
                attempt += 1
                await self._retrying("tail", deadline, attempt, error)

    async def read(self, after_lsn: int, until_lsn: int) -> AsyncIterator[wire.WalEntry]:
        """Every entry of the log's pchannel with after_lsn < lsn <= until_lsn, control
        entries included, in order (waiting until they are committed)."""
        deadline = time.monotonic() + self.retry_timeout_s
        next_after = after_lsn
        attempt = 0
        while next_after < until_lsn:
            address, term = "", 0
            call = None
            try:
                address, term, stub = await self._owner_stub(deadline)
                call = stub.Consume(  # type: ignore[attr-defined]
                    wire.ConsumeRequest(
                        pchannel=self.pchannel,
                        policy=wire.DELIVER_POLICY_START_AFTER,
                        lsn=next_after,
                        include_control=True,
                    )
                )
                while next_after < until_lsn:
                    response = await asyncio.wait_for(call.read(), self.attempt_timeout_s)
                    if response is grpc.aio.EOF:
                        break
                    for entry in response.entries:
                        if entry.lsn > until_lsn:
                            break
                        next_after = entry.lsn
                        deadline = time.monotonic() + self.retry_timeout_s
                        yield entry
                attempt += 1
                await self._retrying("read", deadline, attempt, "stream ended")
            except grpc.aio.AioRpcError as error:
                attempt += 1
                await self._rpc_failed("read", error, address, term, deadline, attempt)
            except (UnavailableError, TimeoutError) as error:
                attempt += 1
                await self._retrying("read", deadline, attempt, repr(error))
            finally:
                if call is not None:
                    call.cancel()

    async def _produce(self, request: wire.ProduceRequest) -> wire.ProduceResult:
        """One Produce request on a stream of its own, retried at the (new) owner with the
        same (producer_id, sequence) until answered or the deadline."""
        deadline = time.monotonic() + self.retry_timeout_s
        attempt = 0
        while True:
            address, term = "", 0
            call = None
            try:
                address, term, stub = await self._owner_stub(deadline)
                call = stub.Produce()  # type: ignore[attr-defined]
                await call.write(request)
                result = await asyncio.wait_for(call.read(), self.attempt_timeout_s)
                if result is grpc.aio.EOF:
                    raise UnavailableError(
                        error_info(E.ON_SHUTDOWN, f"{address} ended the Produce stream")
                    )
                if result.HasField("error") and result.error.code in _RETRY_CODES:
                    self._client.router.report_failure(self.pchannel, address, term, result.error)
                    attempt += 1
                    await self._retrying("append", deadline, attempt, result.error.message)
                    continue
                return result
            except grpc.aio.AioRpcError as error:
                attempt += 1
                await self._rpc_failed("append", error, address, term, deadline, attempt)
            except (UnavailableError, TimeoutError) as error:
                attempt += 1
                await self._retrying("append", deadline, attempt, repr(error))
            finally:
                if call is not None:
                    call.cancel()

    async def append(
        self, payload: bytes, expected_last_lsn: int, producer_id: str, sequence: int
    ) -> int:
        """Append `payload` as one entry if the pchannel's last LSN is `expected_last_lsn`
        (0 = empty); its LSN. UnmatchedChannelTermError when the precondition failed."""
        if not producer_id or sequence <= 0:
            raise _invalid("a recovery append needs a producer_id and a sequence > 0")
        request = wire.ProduceRequest(
            pchannel=self.pchannel,
            producer_id=producer_id,
            sequence=sequence,
            expected_last_lsn=expected_last_lsn if expected_last_lsn > 0 else -1,
            batch_vchannel=self.vchannel,
            batch_msg_type=RECORD_MSG_TYPE,
            payloads=[payload],
        )
        result = await self._produce(request)
        if result.HasField("error") and result.error.code != E.OK:
            raise error_for(result.error)
        return result.first_lsn

    async def fenced_append(
        self,
        payload: bytes,
        known_last_lsn: int,
        producer_id: str,
        sequence: int,
        *,
        max_attempts: int = 20,
    ) -> int:
        """Append `payload` right after `known_last_lsn`, skipping over control entries
        that arrived since; ChannelFencedError when a record of someone else did."""
        expected = known_last_lsn
        for _ in range(max_attempts):
            try:
                return await self.append(payload, expected, producer_id, sequence)
            except UnmatchedChannelTermError:
                pass
            last_lsn, _ = await self.tail()
            async for entry in self.read(expected, last_lsn):
                if entry.vchannel == self.vchannel:
                    raise ChannelFencedError(
                        error_info(
                            E.CHANNEL_FENCED,
                            f"recovery log {self.pchannel} has a record at lsn {entry.lsn} "
                            f"after {known_last_lsn}: another owner took the shard",
                        )
                    )
                expected = entry.lsn
        raise UnavailableError(
            error_info(
                E.UNAVAILABLE,
                f"recovery log {self.pchannel} kept moving under {max_attempts} appends",
            )
        )
