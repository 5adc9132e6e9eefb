"""What the chaos runners (`runner`, `replicate`) read from a running cluster: its status,
whether it recovered, and a pchannel's committed log. Shared so that neither runner
imports the other."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence

import grpc

from raftwal.chaos.checker import LogEntry
from raftwal.chaos.workload import payload_key
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from wal_segments.format import CONTROL_FLAGS


async def _status(
    endpoints: Sequence[str], linearizable: bool = False, timeout_s: float = 3.0
) -> api.ClusterStatusResponse | None:
    consistency = api.CONSISTENCY_LINEARIZABLE if linearizable else api.CONSISTENCY_SERIALIZABLE
    for endpoint in endpoints:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            try:
                return await stub.ClusterStatus(
                    api.ClusterStatusRequest(consistency=consistency), timeout=timeout_s
                )
            except grpc.aio.AioRpcError:
                continue
    return None


async def wait_recovered(
    endpoints: Sequence[str], pchannels: Sequence[str], timeout_s: float, nodes: int = 3
) -> tuple[api.ClusterStatusResponse | None, str]:
    """(status, "") once a leader is known, every node is UP and every pchannel ASSIGNED;
    (last status, what was missing) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    status, missing = None, "no answer"
    while time.monotonic() < deadline:
        status = await _status(endpoints, linearizable=True)
        if status is not None:
            down = [n.node_id for n in status.nodes if n.state != pb.NODE_STATE_UP]
            states = {p.name: p.state for p in status.pchannels}
            unassigned = [p for p in pchannels if states.get(p) != pb.PCHANNEL_STATE_ASSIGNED]
            if status.leader_node_id and len(status.nodes) >= nodes and not down and not unassigned:
                return status, ""
            missing = (
                f"leader {status.leader_node_id or '-'}, nodes not UP {down or '-'}, "
                f"pchannels not ASSIGNED {unassigned or '-'}"
            )
        await asyncio.sleep(0.5)
    return status, missing


async def read_log(
    address: str, pchannel: str, timeout_s: float, from_replica: bool = False, floor: int = 1
) -> list[LogEntry]:
    """Every committed entry of `pchannel` (control entries too) from `floor` (the first
    LSN retention kept) on, from its owner (or, with `from_replica`, from the replica at
    `address`), up to the committed LSN it reported first. Raises RuntimeError when it
    cannot (COMPACTED included: the floor is frozen before the final reads)."""
    deadline = time.monotonic() + timeout_s
    entries: list[LogEntry] = []
    target: int | None = None
    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        attempts = 0
        while time.monotonic() < deadline and attempts < 20:
            attempts += 1
            if target is not None and (entries[-1].lsn if entries else 0) >= target:
                return entries
            request = wire.ConsumeRequest(
                pchannel=pchannel,
                policy=wire.DELIVER_POLICY_START_AFTER
                if entries or floor > 1
                else wire.DELIVER_POLICY_ALL,
                lsn=entries[-1].lsn if entries else floor - 1,
                include_control=True,
                max_batch_entries=5000,
                from_replica=from_replica,
            )
            if target is None:
                latest = await stub.GetLatestTimeTick(
                    wire.GetLatestTimeTickRequest(pchannel=pchannel, from_replica=from_replica),
                    timeout=5.0,
                )
                target = latest.committed_lsn
                if target == 0:
                    return entries
            call = stub.Consume(request, timeout=max(1.0, deadline - time.monotonic()))
            try:
                async for response in call:
                    for entry in response.entries:
                        entries.append(
                            LogEntry(
                                lsn=entry.lsn,
                                term=entry.term,
                                time_tick=entry.time_tick,
                                vchannel=entry.vchannel,
                                msg_type=entry.msg_type,
                                key=payload_key(entry.payload),
                                broadcast_id=entry.broadcast_id,
                                digest=hashlib.sha1(entry.payload).hexdigest(),
                                control=bool(entry.flags & CONTROL_FLAGS),
                            )
                        )
                    if entries and entries[-1].lsn >= target:
                        break
            except grpc.aio.AioRpcError as error:
                await asyncio.sleep(0.3)
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"reading {pchannel} at {address}: {error.code()}") from None
            finally:
                call.cancel()
    if target is not None and (entries[-1].lsn if entries else 0) >= target:
        return entries
    raise RuntimeError(
        f"read only up to lsn {entries[-1].lsn if entries else 0} of {pchannel} at {address} "
        f"(committed lsn {target}) within {timeout_s:.0f} s"
    )
