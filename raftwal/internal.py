"""Node-internal gRPC services: ``Cluster`` (heartbeats to the leader, proposals forwarded
to it) and ``NodeManager`` (what the coordinator calls on a node: Assign, Remove,
CollectStatus).

Until the WAL data plane lands, a node answers ``Assign`` by proposing ``PChannelReady``
itself once its applied state shows the assignment; tail recovery replaces that.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from rpc.errors import RaftwalError, error_info, to_status
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2

if TYPE_CHECKING:
    from raftwal.node import Node

log = logging.getLogger(__name__)
E = errors_pb2

# How long an Assign waits for this node to apply the assignment it is told about.
ASSIGN_APPLY_WAIT_S = 5.0
MAX_PROPOSE_TIMEOUT_MS = 60_000


class ClusterServicer(coordinator_pb2_grpc.ClusterServicer):
    def __init__(self, node: Node) -> None:
        self._node = node

    async def Heartbeat(self, request, context):
        if not self._node.is_leader():
            leader = self._node.leader()
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.NOT_LEADER,
                        f"node {self._node.me.id} is not the leader",
                        leader_hint=leader.grpc_address if leader else "",
                    )
                )
            )
        if self._node.config.nodes and request.node_id not in {
            n.id for n in self._node.config.nodes
        }:
            await context.abort_with_status(
                to_status(
                    error_info(E.INVALID_ARGUMENT, f"unknown node id {request.node_id[:64]!r}")
                )
            )
        self._node.coordinator.record_heartbeat(request)
        return api.HeartbeatResponse(
            leader_node_id=self._node.me.id, revision=self._node.applied_revision()
        )

    async def Propose(self, request, context):
        if request.timeout_ms < 0 or request.timeout_ms > MAX_PROPOSE_TIMEOUT_MS:
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.INVALID_ARGUMENT,
                        f"invalid timeout_ms ({request.timeout_ms}; expected "
                        f"0..{MAX_PROPOSE_TIMEOUT_MS})",
                    )
                )
            )
        try:
            # Never forwarded again: a follower that thinks we lead must learn otherwise.
            result = await self._node.propose_bytes(request.command, forward=False)
        except RaftwalError as error:
            await context.abort_with_status(to_status(error.info))
        return api.ProposeResponse(result=result.SerializeToString())


class NodeManagerServicer(coordinator_pb2_grpc.NodeManagerServicer):
    def __init__(self, node: Node) -> None:
        self._node = node
        self._recovering: dict[tuple[str, int], asyncio.Task[None]] = {}

    async def Assign(self, request, context):
        if not request.pchannel or len(request.pchannel) > 128 or request.term < 1:
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.INVALID_ARGUMENT,
                        f"invalid assignment ({request.pchannel[:64]!r} at term "
                        f"{request.term}; expected a pchannel name and term >= 1)",
                    )
                )
            )
        key = (request.pchannel, request.term)
        task = self._recovering.get(key)
        if task is None or task.done():
            self._recovering = {k: t for k, t in self._recovering.items() if not t.done()}
            self._recovering[key] = asyncio.create_task(
                self._become_ready(request.pchannel, request.term)
            )
        return api.AssignResponse(accepted=True)

    async def _become_ready(self, pchannel: str, term: int) -> None:
        node = self._node

        def current(state: pb.CoordinationState) -> tuple[int, str, int, int]:
            channel = state.pchannels.get(pchannel)
            if channel is None:
                return 0, "", 0, 0
            # Placeholder start LSN until tail recovery computes the real one: just after
            # whatever earlier terms started or committed.
            floor = state.manifests[pchannel].committed_through_lsn
            for entry in channel.history[:-1]:
                floor = max(floor, entry.start_lsn, entry.end_lsn)
            return channel.term, channel.owner_node_id, channel.state, floor + 1

        loop = asyncio.get_running_loop()
        deadline = loop.time() + ASSIGN_APPLY_WAIT_S
        while True:
            (seen_term, owner, state, start_lsn), _ = await node.read(current, linearizable=False)
            if seen_term >= term or loop.time() >= deadline:
                break
            await node.wait_change(deadline - loop.time())
        if seen_term != term or owner != node.me.id or state != pb.PCHANNEL_STATE_ASSIGNING:
            log.info(
                "assignment of %s at term %d is no longer current (term %d, owner %s)",
                pchannel,
                term,
                seen_term,
                owner,
            )
            return
        command = pb.Command(
            request_id=f"ready:{pchannel}:{term}",
            pchannel_ready=pb.PChannelReady(
                pchannel=pchannel, term=term, node_id=node.me.id, start_lsn=start_lsn
            ),
        )
        try:
            result = await node.propose(command)
        except RaftwalError as error:
            log.warning("PChannelReady(%s, %d) failed: %s", pchannel, term, error)
            return
        if result.rejection.code != E.OK:
            log.info("PChannelReady(%s, %d) rejected: %s", pchannel, term, result.rejection)

    async def Remove(self, request, context):
        return api.RemoveResponse()

    async def CollectStatus(self, request, context):
        try:
            member = self._node.member_status()
        except AssertionError:
            await context.abort_with_status(
                to_status(error_info(E.ON_SHUTDOWN, "node is starting or stopping"))
            )
        return api.CollectStatusResponse(node_id=self._node.me.id, member=member)


async def call_assign(node: Node, address: str, pchannel: str, term: int) -> bool:
    stub = coordinator_pb2_grpc.NodeManagerStub(node.channel(address))
    try:
        reply = await stub.Assign(api.AssignRequest(pchannel=pchannel, term=term), timeout=2.0)
        return reply.accepted
    except grpc.aio.AioRpcError as error:
        log.info("Assign(%s, %d) to %s failed: %s", pchannel, term, address, error.code())
        return False
