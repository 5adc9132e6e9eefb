"""The data plane's transactions: ``Txn``.

``Txn`` runs ``BeginTxn`` / ``AppendTxn`` / ``CommitTxn`` / ``RollbackTxn`` on the owner of
the vchannel's pchannel, with a keepalive task while open; it is an async context manager
that commits on normal exit and rolls back on an exception.

``BeginTxn`` is retried (bounded in attempts and in time); the calls that follow go to the
owner that began the txn, once. This module must never repeat an ``AppendTxn`` or a
``CommitTxn`` (an append could be buffered twice), nor import ``rpc.streaming.client``
(which builds transactions).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from rpc.coordinator_client import CoordinatorClient
from rpc.errors import (
    InvalidTransactionStateError,
    RaftwalError,
    TransactionExpiredError,
    UnknownError,
    code_name,
    error_for,
    error_info,
    from_rpc_error,
)
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.routing import _Backoff, _has_error_info, _invalid, unexpected_loop_error
from rpc.streaming.routing import (
    DEFAULT_ATTEMPT_TIMEOUT_S,
    MAX_NOT_EXIST_RETRIES,
    Position,
    StreamingClientBase,
    _check_range,
    _classify_data,
    _message,
    _resolve,
    _unavailable,
)

# The logger name of the data-plane SDK since it was one module (rpc/streaming_client.py).
log = logging.getLogger("rpc.streaming_client")
E = errors_pb2

DEFAULT_TXN_KEEPALIVE_MS = 10_000


def _elapsed_text(started: float) -> str:
    return f"{time.monotonic() - started:.1f} s"


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

    The owner binds the txn to whoever began it: the same token (or client certificate)
    and the same ``producer_id`` (which also names the txn buffer budget it draws on);
    every call of this object sends both, and anyone else gets PERMISSION_DENIED.
    """

    def __init__(
        self,
        client_or_endpoints: StreamingClientBase | CoordinatorClient | str | Sequence[str],
        vchannel: str,
        *,
        keepalive_ms: int = DEFAULT_TXN_KEEPALIVE_MS,
        timeout_s: float = 10.0,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S,
        max_attempts: int = 20,
        producer_id: str = "",
    ) -> None:
        _check_range("keepalive_ms", keepalive_ms, 1, 600_000)
        if len(producer_id) > 128:
            raise _invalid(f"invalid producer_id ({len(producer_id)} chars; expected 0..128)")
        _check_range("timeout_s", timeout_s, 0.001, 3600)
        _check_range("attempt_timeout_s", attempt_timeout_s, 0.001, 3600)
        _check_range("max_attempts", max_attempts, 1, 1000)
        self.vchannel = vchannel
        self.keepalive_ms = int(keepalive_ms)
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.max_attempts = int(max_attempts)
        self.producer_id = producer_id
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
        pchannel = router.cached_pchannel(self.vchannel) or await router.pchannel_of(
            self.vchannel, self.timeout_s
        )
        request = wire.BeginTxnRequest(
            vchannel=self.vchannel, keepalive_ms=self.keepalive_ms, producer_id=self.producer_id
        )
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
            wire.AppendTxnRequest(
                vchannel=self.vchannel,
                txn_id=self.txn_id,
                messages=messages,
                producer_id=self.producer_id,
            ),
        )
        self.buffered_messages = response.buffered_messages
        return int(response.buffered_messages)

    async def commit(self) -> list[Position]:
        """Write the txn; returns one position per entry written: the begin marker, each
        message, the commit marker (consumers see the same entries)."""
        response = await self._once(
            "CommitTxn",
            wire.CommitTxnRequest(
                vchannel=self.vchannel, txn_id=self.txn_id, producer_id=self.producer_id
            ),
            commit=True,
        )
        self.state = "committed"
        await self._stop_keepalive()
        return [Position(self.pchannel, p.lsn, p.time_tick) for p in response.positions]

    async def rollback(self) -> None:
        try:
            await self._once(
                "RollbackTxn",
                wire.RollbackTxnRequest(
                    vchannel=self.vchannel, txn_id=self.txn_id, producer_id=self.producer_id
                ),
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
        request = wire.KeepAliveTxnRequest(
            vchannel=self.vchannel, txn_id=self.txn_id, producer_id=self.producer_id
        )
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
