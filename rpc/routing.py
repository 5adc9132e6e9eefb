"""What the coordinator client and the data-plane client share, and no client itself.

- classifying a failed call: ``classify`` (its ErrorInfo, and whether another attempt may
  succeed), ``RETRYABLE_CODES``, ``RETRYABLE_TRANSPORT``;
- long-lived server streams: ``read_stream`` (``StreamIdle`` when a stream stays silent),
  ``STREAM_FAILURES`` and ``stream_failure`` (what a broken stream means),
  ``cancelled_by_caller``, ``unexpected_loop_error``;
- endpoints and retries: ``parse_endpoints``, ``MAX_CHANNELS``, the leader-following
  ``_Router`` and the jittered exponential ``_Backoff``.

This module must never import a client module (``rpc.coordinator_client``, ``rpc.streaming``,
nor the ``rpc.client``, ``rpc.streaming_client`` and ``rpc.sync_client`` facades): they all
import it. It retries nothing itself; it only says what is retryable and how long to wait.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_status import rpc_status

from rpc.aio import wait_within
from rpc.errors import InnerError, InvalidArgumentError, error_info, from_rpc_error
from rpc.protos import errors_pb2

# The logger these helpers always used (they were part of rpc/client.py): a caller's
# logging configuration for "rpc.client" keeps covering them.
log = logging.getLogger("rpc.client")
E = errors_pb2

# Leader hints name addresses the caller did not list; cap the channels they may open so
# that a confused cluster cannot make a client open sockets without end.
MAX_CHANNELS = 32


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(error_info(E.INVALID_ARGUMENT, message))


# ---------------------------------------------------------------------------------------
# Classifying failures
# ---------------------------------------------------------------------------------------

# Answers with an ErrorInfo that another attempt (same request id) may turn into success.
# UNKNOWN is what a node answers when a proposal's outcome is unknown ("retry with the same
# request id"); the request-id window makes that retry safe.
RETRYABLE_CODES = frozenset({E.NOT_LEADER, E.ON_SHUTDOWN, E.UNKNOWN, E.UNAVAILABLE})
# Failures without an ErrorInfo that mean "this node, now" rather than "this request":
# connection refused or reset, the per-attempt deadline, a server stopping mid-call.
RETRYABLE_TRANSPORT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def _has_error_info(error: grpc.RpcError) -> bool:
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:
        return False
    return status is not None and any(
        detail.Is(errors_pb2.ErrorInfo.DESCRIPTOR) for detail in status.details
    )


def classify(error: grpc.RpcError) -> tuple[errors_pb2.ErrorInfo, bool]:
    """(ErrorInfo, retryable) for a failed call. A raftwal answer is retryable by its code;
    a failure without ErrorInfo (transport, deadline) by its gRPC status code."""
    info = from_rpc_error(error)
    if _has_error_info(error):
        return info, info.code in RETRYABLE_CODES
    code = error.code() if hasattr(error, "code") else None
    return info, code in RETRYABLE_TRANSPORT


class StreamIdle(Exception):
    """A server stream brought nothing for ``idle_s`` (see ``read_stream``)."""

    def __init__(self, idle_s: float) -> None:
        super().__init__(f"nothing received for {idle_s:.1f} s")
        self.idle_s = idle_s

    def info(self, target: str, method: str) -> errors_pb2.ErrorInfo:
        return error_info(
            E.UNAVAILABLE,
            f"{method} stream at {target} sent nothing, not even a progress notification, "
            f"for {self.idle_s:.1f} s (node stopped, hung or cut off?)",
        )


async def read_stream(call: Any, idle_s: float) -> AsyncIterator[Any]:
    """The messages of a server-streaming `call` until it ends; raises StreamIdle when none
    arrives for `idle_s` (a stopped node never closes its streams), AioRpcError on a failed
    status."""
    while True:
        try:
            async with asyncio.timeout(idle_s):
                message = await call.read()
        except TimeoutError:
            raise StreamIdle(idle_s) from None
        if message is grpc.aio.EOF:
            return
        yield message


def cancelled_by_caller() -> bool:
    """True while the running task is being cancelled. A CancelledError can also come out
    of a gRPC call that something else cancelled (its channel was closed): only the task's
    own cancellation may end a long-lived loop quietly; the other is a stream failure."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


# What a read or write on a long-lived stream raises when its peer goes away: a failed
# status, a write on a stream the server already finished (InvalidStateError), a call
# cancelled under us, no answer in time (TimeoutError), or a silent stream (StreamIdle).
STREAM_FAILURES: tuple[type[BaseException], ...] = (
    grpc.aio.AioRpcError,
    asyncio.InvalidStateError,
    asyncio.CancelledError,
    TimeoutError,
    StreamIdle,
)


async def stream_failure(
    error: BaseException, call: Any, target: str, method: str
) -> tuple[errors_pb2.ErrorInfo, bool]:
    """(ErrorInfo, retryable) of one of ``STREAM_FAILURES`` raised by a read or write on
    `call`. The caller's own cancellation is raised again. A write on a stream the server
    already finished answers with that stream's final status: the server's refusal when it
    failed (NOT_FOUND, ...), a retryable ON_SHUTDOWN when it ended normally."""
    if isinstance(error, asyncio.CancelledError):
        if cancelled_by_caller():
            raise error
        return error_info(E.ON_SHUTDOWN, f"the {method} call to {target} was cancelled"), True
    if isinstance(error, grpc.aio.AioRpcError):
        return classify(error)
    if isinstance(error, StreamIdle):
        return error.info(target, method), True
    if isinstance(error, TimeoutError):
        return error_info(E.UNAVAILABLE, f"{target} did not answer {method} in time"), True
    if isinstance(error, asyncio.InvalidStateError):
        ended = error_info(E.ON_SHUTDOWN, f"{target} had already ended the {method} stream")
        try:
            # A finished call's read raises its failed status, or returns EOF when it was OK.
            await wait_within(call.read(), 1.0)
        except grpc.aio.AioRpcError as status:
            return classify(status)
        except asyncio.CancelledError:
            if cancelled_by_caller():
                raise
        except (asyncio.InvalidStateError, TimeoutError):
            pass
        return ended, True
    raise TypeError(f"not a stream failure: {error!r}")


def unexpected_loop_error(what: str, error: BaseException) -> InnerError:
    """The typed error a long-lived loop reports for an exception it has no rule for (a bug,
    or a failure this SDK does not know yet), logged with its traceback."""
    log.error("%s failed unexpectedly", what, exc_info=error)
    return InnerError(error_info(E.INNER, f"{what} failed unexpectedly: {error!r}"))


_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def check_endpoint(endpoint: str) -> str | None:
    """Why `endpoint` is not a usable ``host:port`` (one sentence naming the bad part), or
    None. Hosts are names or IPv4 addresses, or IPv6 addresses in brackets; ports 1-65535;
    no scheme (gRPC targets are not URLs)."""
    if "://" in endpoint:
        scheme = endpoint.split("://", 1)[0]
        return (
            f"invalid endpoint {endpoint!r}: drop the {scheme}:// scheme (expected host:port, "
            "e.g. 127.0.0.1:7201)"
        )
    host, colon, port = endpoint.rpartition(":")
    if not colon or not host:
        return f"invalid endpoint {endpoint!r}: no port (expected host:port, e.g. 127.0.0.1:7201)"
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            return f"invalid endpoint {endpoint!r}: bad IPv6 host {host!r} (expected [address])"
    elif ":" in host:
        return (
            f"invalid endpoint {endpoint!r}: an IPv6 host needs brackets (expected [{host}]:{port})"
        )
    elif not set(host) <= _HOST_CHARS:
        return (
            f"invalid endpoint {endpoint!r}: bad host {host!r} (expected a name or an IP address)"
        )
    if not port.isdigit():
        return f"invalid endpoint {endpoint!r}: port {port!r} is not a number (expected 1..65535)"
    if not 1 <= int(port) <= 65535:
        return (
            f"invalid endpoint {endpoint!r}: port {int(port)} is out of range (expected 1..65535)"
        )
    return None


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """``"h1:7201,h2:7201"`` or a list of ``host:port`` -> a deduplicated list, in order;
    raises InvalidArgumentError (a ValueError) naming the first bad endpoint."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    result: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise _invalid(f"invalid endpoint {item!r} (expected a host:port string)")
        endpoint = item.strip()
        if not endpoint:
            continue
        problem = check_endpoint(endpoint)
        if problem is not None:
            raise _invalid(problem)
        if endpoint not in result:
            result.append(endpoint)
    if not result:
        raise _invalid(f"no endpoints (got {endpoints!r}; expected host:port[,host:port...])")
    return result


# ---------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------


class _Router:
    """Which node to try first and next. Not thread-safe: one event loop owns it."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        self.leader: str | None = None
        self._cursor = 0

    def first(self) -> str:
        return self.leader or self.endpoints[self._cursor]

    def set_leader(self, address: str) -> None:
        if address and address != self.leader:
            log.debug("leader is now believed to be %s", address)
            self.leader = address

    def succeeded(self, target: str) -> None:
        # Stick to an endpoint that works, so that calls do not wander between nodes.
        if target in self.endpoints:
            self._cursor = self.endpoints.index(target)

    def failed(self, target: str) -> str:
        """Forget `target` as leader and return the next endpoint to try."""
        if target == self.leader:
            self.leader = None
        if target in self.endpoints:
            self._cursor = (self.endpoints.index(target) + 1) % len(self.endpoints)
        return self.endpoints[self._cursor]


class _Backoff:
    """Bounded exponential backoff with jitter (each delay uniform in [d/2, d])."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._next_s = initial_s

    def reset(self) -> None:
        self._next_s = self._initial_s

    def next_delay(self, limit_s: float) -> float:
        delay = random.uniform(self._next_s / 2, self._next_s)
        self._next_s = min(self._next_s * 2, self._max_s)
        return max(0.0, min(delay, limit_s))
