"""Reply size against read throughput of one gRPC stream: ReadSegment chunk sizes.

Starts a three-node dev cluster (segments sealed at 32 MiB), produces `--messages`
messages of `--payload-bytes` random bytes to one pchannel, waits for at least three
committed segments, then reads every committed segment from one replica with ReadSegment
(asyncio client), once per chunk size in `--chunks`, in that order (repeat a size to see
the noise). A large message stalls a stream on HTTP/2 flow control; this shows where.

    ./run bench read_chunks [--messages N] [--payload-bytes B] [--chunks 8388608,1048576]

Prints MB/s of frames per chunk size. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import grpc

from raftwal.cli import dev
from rpc.client import CoordinatorClient
from rpc.placement import serving_address
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.streaming_client import StreamingClient

SEGMENT_BYTES = 32 << 20


async def run(messages: int, payload_bytes: int, chunks: list[int]) -> list[tuple[int, float]]:
    env = {**os.environ, "RAFTWAL_SEGMENT_MAX_BYTES": str(SEGMENT_BYTES)}
    cluster = dev.up(Path(tempfile.mkdtemp(prefix="read-chunks-")), 3, 60, env=env)
    try:
        coordinator = CoordinatorClient(cluster.endpoints)
        sdk = StreamingClient(coordinator)
        await coordinator.create_channels(names=["chunks"])
        await coordinator.create_vchannel("chunks_v", "chunks")
        payload = os.urandom(payload_bytes)
        async with sdk.producer() as producer:
            pending = []
            for _ in range(0, messages, 100):
                pending.append(
                    asyncio.ensure_future(producer.send_batch("chunks_v", [payload] * 100))
                )
                if len(pending) >= 32:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
        async with grpc.aio.insecure_channel(cluster.endpoints[0]) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            for _ in range(60):
                listed = await stub.ListSegments(api.ListSegmentsRequest(pchannels=["chunks"]))
                if len(listed.segments) >= 3:
                    break
                await asyncio.sleep(1)
        segments = list(listed.segments)
        if not segments:
            raise RuntimeError("no committed segment within 60 s")
        status = await coordinator.cluster_status()
        address = serving_address(
            status.nodes, segments[0].replica_node_ids[0], segments[0].pchannel
        )
        out = []
        options = [("grpc.max_receive_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            for chunk in chunks:
                total, started = 0, time.perf_counter()
                for segment in segments:
                    request = wire.ReadSegmentRequest(
                        pchannel="chunks", segment_id=segment.segment_id, max_chunk_bytes=chunk
                    )
                    async for reply in stub.ReadSegment(request, timeout=120):
                        total += len(reply.frames)
                out.append((chunk, total / (time.perf_counter() - started) / 1e6))
                print(f"chunk {chunk:>9,} B: {out[-1][1]:6.0f} MB/s ({total:,} B)", flush=True)
        await sdk.close()
        await coordinator.close()
        return out
    finally:
        cluster.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_200_000, help="default: 1200000")
    parser.add_argument("--payload-bytes", type=int, default=100, help="default: 100")
    parser.add_argument(
        "--chunks",
        default="8388608,1048576,524288,8388608,524288",
        help="chunk sizes in bytes, comma-separated (4096..16777216)",
    )
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",") if c]
    asyncio.run(run(args.messages, args.payload_bytes, chunks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
