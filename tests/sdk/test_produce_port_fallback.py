"""The producer's Produce stream when a node's transfer port cannot be used: against a real
gRPC server whose OpenProduce hands out a ticket for a port nobody listens on (a firewall
that passes the gRPC port only looks like this to the producer). The stream falls back to
the Produce call, answers its requests, and the producer does not try that node's port
again for a while. The whole path against real nodes runs in test_streaming_client.py and
test_long_lived_loops.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc

from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from rpc.streaming.producer import ProducerStats, _ProduceStream


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Node(streaming_pb2_grpc.StreamingNodeServicer):
    def __init__(self, port: int) -> None:
        self.port = port
        self.offers = 0

    async def OpenProduce(self, request, context):  # type: ignore[no-untyped-def]
        self.offers += 1
        return wire.OpenProduceResponse(ticket=b"t" * 32, port=self.port, max_frame_bytes=1 << 20)

    async def Produce(self, request_iterator, context) -> AsyncIterator[wire.ProduceResult]:  # type: ignore[no-untyped-def,override]
        async for request in request_iterator:
            yield wire.ProduceResult(
                request_id=request.request_id,
                first_lsn=10 * request.request_id,
                time_ticks=[1] * len(request.payloads),
            )


async def test_an_unreachable_port_falls_back_to_the_produce_call_and_is_not_retried() -> None:
    node = _Node(_closed_port())
    server = grpc.aio.server()
    streaming_pb2_grpc.add_StreamingNodeServicer_to_server(node, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    stats = ProducerStats()
    unreachable: dict[str, float] = {}
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            for attempt in range(2):
                stream = _ProduceStream(stub, address, lambda: None, stats, unreachable)
                try:
                    request = wire.ProduceRequest(pchannel="p", payloads=[b"a", b"b"])
                    results = await asyncio.wait_for(
                        asyncio.gather(stream.submit(request), stream.submit(request)), 10
                    )
                    assert [r.first_lsn for r in results] == [10, 20]
                    assert not stream.over_port and stream.failure is None
                finally:
                    await stream.close()
                # Tried once; the second stream went straight to the call.
                assert node.offers == 1, attempt
                assert address in unreachable
        assert stats.grpc_streams == 2 and stats.port_streams == 0
    finally:
        await server.stop(None)
