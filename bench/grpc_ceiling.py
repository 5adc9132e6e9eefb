"""The ceiling of one raftwal node's Python gRPC server, with no Raft work at all.

Starts the three-node dev cluster (the same way bench/coord.py does), then drives the
Raft leader's gRPC port with 64 closed-loop clients (one connection each) calling
(a) the standard health Check and (b) DescribeChannels SERIALIZABLE (a local read, no
log entry). Whatever raftwal does per write comes on top of this, so it bounds the
write throughput one leader process can reach on this machine.

    ./run bench grpc_ceiling [--duration-s 5] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import coord
import grpc
from _harness import closed_loop, cpu_seconds
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc


def _step(call: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[int]]:
    async def step() -> int:
        await call()
        return 1

    return step


async def main(duration_s: float, clients: int) -> None:
    system = coord.RaftwalSystem(Path(tempfile.mkdtemp(prefix="grpc-ceiling-")))
    await system.start()
    channels: list[grpc.aio.Channel] = []
    try:
        leader = await system.leader()
        endpoint = system.cluster.node(leader).grpc_address
        channels = [
            grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(clients)
        ]
        check = health_pb2.HealthCheckRequest()
        describe = api.DescribeChannelsRequest(
            pchannels=[coord.READ_PCHANNEL], consistency=api.CONSISTENCY_SERIALIZABLE
        )
        health_stubs = [health_pb2_grpc.HealthStub(c) for c in channels]
        coordinator_stubs = [coordinator_pb2_grpc.CoordinatorStub(c) for c in channels]
        cases = {
            "health Check": [_step(functools.partial(s.Check, check)) for s in health_stubs],
            "DescribeChannels SERIALIZABLE": [
                _step(functools.partial(s.DescribeChannels, describe)) for s in coordinator_stubs
            ],
        }
        pid = system.pids()[leader]
        for label, steps in cases.items():
            cpu_before, started = cpu_seconds(pid), time.perf_counter()
            result = await closed_loop(steps, duration_s, 1.0, coord.ERRORS)
            cores = (cpu_seconds(pid) - cpu_before) / (time.perf_counter() - started)
            print(
                f"{label}: {result.per_s:,.0f} RPC/s with {clients} clients, leader CPU "
                f"{cores:.2f} cores, p50 {result.latencies.p50_ms:.2f} ms"
            )
    finally:
        for channel in channels:
            await channel.close()
        await system.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.duration_s, args.clients))
