"""StreamingNode and Replication on a node's control port: where to go instead.

A node serves its data plane from its data workers, each on a gRPC port of its own
(DESIGN.md section 2), and clients find a pchannel's worker in ``WatchAssignments``
(``owner_address``, ``replica_addresses``). A call of either service that reaches the
control process's port anyway (a client that routed before the workers were announced,
one that uses the node's address from an older view, a peer still starting) is answered
NOT_OWNER with the address serving that pchannel as ``owner_hint`` when the request names
one, so that the SDK's rerouting takes it there. Nothing is served here.

Depends on the node's data view only, never on the node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc

from rpc.errors import error_info, to_status
from rpc.protos import errors_pb2, streaming_pb2

E = errors_pb2

SERVICES = ("StreamingNode", "Replication")


class _OwnerHints(Protocol):
    def refresh(self) -> None: ...

    def owner_hint(self, pchannel: str) -> tuple[str, int]: ...


class _Redirects(grpc.GenericRpcHandler):
    def __init__(self, view: _OwnerHints, node_id: str) -> None:
        self._view = view
        self._node_id = node_id
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for service_name in SERVICES:
            service = streaming_pb2.DESCRIPTOR.services_by_name[service_name]
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                self._handlers[path] = self._handler(method)

    def _answer(self, request: Any) -> grpc.Status:
        pchannel = getattr(request, "pchannel", "") if request is not None else ""
        hint, term = "", 0
        if isinstance(pchannel, str) and pchannel:
            self._view.refresh()
            hint, term = self._view.owner_hint(pchannel[:256])
        return to_status(
            error_info(
                E.NOT_OWNER,
                f"node {self._node_id}'s gRPC port serves coordination only (got a data-plane "
                "call; expected it at the data worker serving the pchannel: owner_address or "
                "replica_addresses in WatchAssignments" + (f", here {hint})" if hint else ")"),
                owner_hint=hint,
                current_term=term,
            )
        )

    def _handler(self, method: Any) -> grpc.RpcMethodHandler:
        request_type = getattr(streaming_pb2, method.input_type.name)
        # Strict: a body that does not parse gets INVALID_ARGUMENT naming the message, as on
        # every port (raftwal.services.decoding wraps this deserializer).
        tolerant: Callable[[bytes], Any] = request_type.FromString

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort_with_status(self._answer(request))

        async def streamed(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            first = None
            async for request in request_iterator:
                first = request
                break
            await context.abort_with_status(self._answer(first))

        async def unary_to_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort_with_status(self._answer(request))
            yield  # pragma: no cover - never reached: abort raises

        async def stream_to_stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            first = None
            async for request in request_iterator:
                first = request
                break
            await context.abort_with_status(self._answer(first))
            yield  # pragma: no cover - never reached: abort raises

        if method.client_streaming and method.server_streaming:
            return grpc.stream_stream_rpc_method_handler(
                stream_to_stream, request_deserializer=tolerant
            )
        if method.client_streaming:
            return grpc.stream_unary_rpc_method_handler(streamed, request_deserializer=tolerant)
        if method.server_streaming:
            return grpc.unary_stream_rpc_method_handler(
                unary_to_stream, request_deserializer=tolerant
            )
        return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=tolerant)

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)


def add_data_redirects(server: grpc.aio.Server, view: _OwnerHints, node_id: str) -> None:
    """Answer every StreamingNode and Replication call on `server` with where to go."""
    server.add_generic_rpc_handlers((_Redirects(view, node_id),))
