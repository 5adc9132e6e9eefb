"""Caps on the long-lived streams of the gRPC port: WatchEvents, WatchAssignments, the
lease KeepAlive stream and Consume.

Each such call holds a task, buffers and a slot of grpc's for as long as the client keeps
it open; nothing else bounds how many one caller opens (the audit of issue 40 opened 4,088
WatchEvents streams on one node in a minute). ``StreamCaps`` counts the open streams of
each capped method, per node and per caller (``callers.caller_identity``: its token and
client certificate; a caller with neither is named by its network host), and
``StreamCapInterceptor`` refuses a stream past either cap with RESOURCE_EXHAUSTED and an
ErrorInfo before the servicer runs. Refusals are counted per method and scope for the
metrics (``raftwal_stream_refusals_total``), open streams per method
(``raftwal_open_streams``).

Must never: let a refused stream reach its servicer, leak a slot (a stream gives its slot
back however it ends), keep a map entry for an identity with no open stream (the map is
bounded by the open streams), or put an identity (a token digest) into a message or a
metric label.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from raftwal.services.callers import caller_identity
from rpc.errors import error_info, to_status
from rpc.protos import errors_pb2

E = errors_pb2

#: The capped methods, by their full gRPC name (the short name is the metric label).
CAPPED_METHODS: Mapping[str, str] = {
    "/raftwal.v1.Coordinator/WatchEvents": "WatchEvents",
    "/raftwal.v1.Coordinator/WatchAssignments": "WatchAssignments",
    "/raftwal.v1.Coordinator/KeepAlive": "KeepAlive",
    "/raftwal.v1.StreamingNode/Consume": "Consume",
}
#: The defaults of ``max_node_streams`` and ``max_identity_streams`` (per method).
DEFAULT_MAX_NODE_STREAMS = 1024
DEFAULT_MAX_IDENTITY_STREAMS = 256
#: How long a refused request-streaming call waits for its first request (as
#: ``raftwal.node.security.REFUSAL_READ_S``, for grpc/grpc#36066).
REFUSAL_READ_S = 1.0


def _peer_host(peer: str) -> str:
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() else peer


class StreamCaps:
    """Open streams per capped method, per node and per identity."""

    def __init__(
        self,
        max_node_streams: int = DEFAULT_MAX_NODE_STREAMS,
        max_identity_streams: int = DEFAULT_MAX_IDENTITY_STREAMS,
    ) -> None:
        if not 1 <= max_identity_streams <= max_node_streams:
            raise ValueError(
                f"invalid stream caps (max_identity_streams {max_identity_streams}, "
                f"max_node_streams {max_node_streams}; expected 1 <= identity <= node)"
            )
        self.max_node_streams = max_node_streams
        self.max_identity_streams = max_identity_streams
        #: method -> open streams
        self.open: dict[str, int] = dict.fromkeys(CAPPED_METHODS.values(), 0)
        #: (method, "node" | "identity") -> refused streams
        self.refused: dict[tuple[str, str], int] = {}
        self._by_identity: dict[tuple[str, str], int] = {}

    def take(self, method: str, identity: str) -> errors_pb2.ErrorInfo | None:
        """Take a slot of `method` for `identity`; the ErrorInfo to answer when either cap
        is reached (counted), else None (give it back with `give_back`)."""
        key = (method, identity)
        held = self._by_identity.get(key, 0)
        if self.open[method] >= self.max_node_streams:
            scope, message = (
                "node",
                f"too many {method} streams on this node ({self.open[method]}; expected at "
                f"most {self.max_node_streams}, max_node_streams): close one or retry later",
            )
        elif held >= self.max_identity_streams:
            scope, message = (
                "identity",
                f"too many {method} streams of this caller ({held}; expected at most "
                f"{self.max_identity_streams} per token, client certificate or, without "
                "either, network host: max_identity_streams): close one or retry later",
            )
        else:
            self.open[method] += 1
            self._by_identity[key] = held + 1
            return None
        self.refused[(method, scope)] = self.refused.get((method, scope), 0) + 1
        return error_info(E.RESOURCE_EXHAUSTED, message)

    def give_back(self, method: str, identity: str) -> None:
        key = (method, identity)
        held = self._by_identity[key] - 1
        if held:
            self._by_identity[key] = held
        else:
            del self._by_identity[key]
        self.open[method] -= 1
        assert self.open[method] >= 0, (method, self.open[method])


def _identity(context: grpc.aio.ServicerContext) -> str:
    return caller_identity(context) or f"host:{_peer_host(context.peer())}"


def _capped(handler: grpc.RpcMethodHandler, caps: StreamCaps, method: str) -> grpc.RpcMethodHandler:
    """`handler` (an async generator servicer method) behind a slot of `caps`."""
    request_streaming = handler.request_streaming
    behavior: Callable[..., AsyncIterator[Any]] = (
        handler.stream_stream if request_streaming else handler.unary_stream
    )
    if not (
        inspect.isasyncgenfunction(behavior)
        or inspect.isasyncgenfunction(getattr(behavior, "__func__", None))
    ):
        raise AssertionError(f"capped method {method} is no async generator")

    async def capped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        identity = _identity(context)
        refused = caps.take(method, identity)
        if refused is not None:
            if request_streaming:
                # grpc-python's asyncio client reports INTERNAL instead of the status when
                # its write meets a stream the server already ended (grpc/grpc#36066).
                with contextlib.suppress(TimeoutError, StopAsyncIteration):
                    await asyncio.wait_for(anext(aiter(request)), REFUSAL_READ_S)
            await context.abort_with_status(to_status(refused))
            return
        try:
            async for response in behavior(request, context):
                yield response
        finally:
            caps.give_back(method, identity)

    factory = (
        grpc.stream_stream_rpc_method_handler
        if request_streaming
        else grpc.unary_stream_rpc_method_handler
    )
    return factory(
        capped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class StreamCapInterceptor(grpc.aio.ServerInterceptor):
    """Puts the capped methods behind ``StreamCaps`` (after authentication: a refused
    call takes no slot)."""

    def __init__(self, caps: StreamCaps) -> None:
        self.caps = caps
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = CAPPED_METHODS.get(handler_call_details.method)
        if handler is None or method is None:
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _capped(handler, self.caps, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
