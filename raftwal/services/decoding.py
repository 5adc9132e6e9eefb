"""Requests that do not parse are the client's error: INVALID_ARGUMENT with an ErrorInfo.

grpc parses a request with the message's ``FromString`` before any servicer code runs; a
body that is not the message (or a string field with invalid UTF-8) makes grpc answer
UNKNOWN "Unexpected DecodeError" with no ErrorInfo, which a client can only treat as "the
server broke". ``DecodeInterceptor`` wraps every method's deserializer so that a failure
becomes a marker value, and the method's behavior so that the marker ends the call with
INVALID_ARGUMENT naming the expected message: for a unary request before the servicer is
called, for a stream of requests when the bad one is read.

Must never: call the servicer with an unparsed request, or let a parse failure through as
anything but INVALID_ARGUMENT.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from rpc.errors import error_info, to_status
from rpc.protos import errors_pb2


class _Undecodable:
    """What a request that did not parse becomes (never shown to a servicer)."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


def _message_name(deserializer: Callable[[bytes], Any] | None) -> str:
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "the request message")


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    expected = _message_name(deserializer)

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:  # noqa: BLE001 (any parse failure is the request's fault)
            return _Undecodable(
                f"request body ({len(data)} bytes) does not parse as {expected} "
                f"({type(error).__name__}: {str(error)[:200]}; expected a serialized {expected} "
                "with valid UTF-8 in its string fields)"
            )

    return parse


async def _refuse(context: grpc.aio.ServicerContext, bad: _Undecodable) -> None:
    await context.abort_with_status(to_status(error_info(errors_pb2.INVALID_ARGUMENT, bad.detail)))


async def _checked(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Undecodable):
            await _refuse(context, request)
        yield request


def _is_async_generator(behavior: Callable[..., Any]) -> bool:
    # grpc serves an async generator's responses itself, and awaits a coroutine (which
    # writes through the context): the wrapper must be of the same kind as the servicer.
    return inspect.isasyncgenfunction(behavior) or inspect.isasyncgenfunction(
        getattr(behavior, "__func__", None)
    )


def _wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    deserializer = _tolerant(handler.request_deserializer)
    serializer = handler.response_serializer
    if handler.request_streaming:
        behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary
        factory = (
            grpc.stream_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.stream_unary_rpc_method_handler
        )

        if _is_async_generator(behavior):

            async def requests_generator(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                async for response in behavior(_checked(requests, context), context):
                    yield response

            requests_behavior: Callable[..., Any] = requests_generator
        else:

            async def requests_coroutine(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                return await behavior(_checked(requests, context), context)

            requests_behavior = requests_coroutine
        return factory(
            requests_behavior, request_deserializer=deserializer, response_serializer=serializer
        )
    if handler.response_streaming:
        behavior = handler.unary_stream
        if _is_async_generator(behavior):

            async def stream_generator(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _refuse(context, request)
                async for response in behavior(request, context):
                    yield response

            stream_behavior: Callable[..., Any] = stream_generator
        else:

            async def stream_coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _refuse(context, request)
                return await behavior(request, context)

            stream_behavior = stream_coroutine
        return grpc.unary_stream_rpc_method_handler(
            stream_behavior, request_deserializer=deserializer, response_serializer=serializer
        )
    unary = handler.unary_unary

    async def unary_behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await _refuse(context, request)
        return await unary(request, context)

    return grpc.unary_unary_rpc_method_handler(
        unary_behavior, request_deserializer=deserializer, response_serializer=serializer
    )


class DecodeInterceptor(grpc.aio.ServerInterceptor):
    """Every method of every service: a request that does not parse gets INVALID_ARGUMENT."""

    def __init__(self) -> None:
        # method -> (the servicer's handler, its wrapper): built once per method, not per
        # call (a bounded map: one entry per method the server registered).
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap(handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
