"""Counts every call the gRPC port answers, by method and status code, as go-grpc-
prometheus's ``grpc_server_handled_total`` does: ``raftwal_grpc_server_handled_total``.

``GrpcMetricsInterceptor`` is the outermost interceptor, so calls that authentication
refuses (UNAUTHENTICATED, PERMISSION_DENIED) and streams the caps refuse
(RESOURCE_EXHAUSTED) are counted too. A call's code is the one its servicer set or
aborted with; OK when it returned normally, CANCELLED when the client went away, UNKNOWN
when it raised anything else. Streams are counted when they end.

Must never: change what a call answers, raise out of the counting, or label by anything
but the service's own method names and gRPC's status codes (an unknown method is left to
grpc, which answers UNIMPLEMENTED, uncounted: its name came from the network).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

#: Called with (method, code name) once per finished call.
Observe = Callable[[str, str], None]


def _code_name(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    code = None
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - a context without a code: decide below
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return status.name
    with contextlib.suppress(Exception):
        if context.cancelled():
            return "CANCELLED"
    if error is None:
        return "OK"
    # grpc cancels the handler's task, or closes its generator, when the call ends from
    # outside (the client went away or its deadline passed).
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"
    return "UNKNOWN"


def _counted(
    handler: grpc.RpcMethodHandler, method: str, observe: Observe
) -> grpc.RpcMethodHandler:
    if handler.request_streaming and handler.response_streaming:
        behavior, factory = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        behavior, factory = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        behavior, factory = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        behavior, factory = handler.unary_unary, grpc.unary_unary_rpc_method_handler
    assert behavior is not None

    def finish(context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
        # Counting must never fail a call.
        with contextlib.suppress(Exception):
            observe(method, _code_name(context, error))

    if inspect.isasyncgenfunction(behavior) or inspect.isasyncgenfunction(
        getattr(behavior, "__func__", None)
    ):
        generator: Callable[..., AsyncIterator[Any]] = behavior

        async def counted_stream(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            error: BaseException | None = None
            try:
                async for response in generator(request, context):
                    yield response
            except BaseException as raised:
                error = raised
                raise
            finally:
                finish(context, error)

        wrapped: Callable[..., Any] = counted_stream
    else:
        call: Callable[..., Awaitable[Any]] = behavior

        async def counted_call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            error: BaseException | None = None
            try:
                return await call(request, context)
            except BaseException as raised:
                error = raised
                raise
            finally:
                finish(context, error)

        wrapped = counted_call
    return factory(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts each call of a known method by its status code (see the module doc)."""

    def __init__(self, observe: Observe) -> None:
        self._observe = observe
        # method -> (the handler seen, its counted wrapper): handlers are built per call
        # by some interceptors, cached by grpc for the servicers themselves.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _counted(handler, method, self._observe)
        if len(self._wrapped) < 1024:
            self._wrapped[method] = (handler, wrapped)
        return wrapped
