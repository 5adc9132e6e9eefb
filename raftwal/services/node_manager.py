"""The node-internal ``NodeManager`` service: what the coordinator calls on a node (Assign,
Remove, CollectStatus).

``Assign`` wakes the node's data workers, whose data planes run tail recovery for the assignment and ends it
with ``PChannelReady`` (``wal_segments.owner``). Depends on ``NodeManagerBackend``, never on
the node.
"""

from __future__ import annotations

import logging

from raftwal.services.backend import NodeManagerBackend
from rpc.errors import RaftwalError, error_info, to_status
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2

log = logging.getLogger(__name__)
E = errors_pb2


class NodeManagerServicer(coordinator_pb2_grpc.NodeManagerServicer):
    def __init__(self, node: NodeManagerBackend) -> None:
        self._node = node

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
        # The data workers' reconcile loops start tail recovery as soon as they have
        # applied the assignment; this call only makes sure they look now.
        self._node.reconcile_now()
        return api.AssignResponse(accepted=True)

    async def Remove(self, request, context):
        return api.RemoveResponse()

    async def CollectStatus(self, request, context):
        try:
            member = await self._node.member_status()
        except (AssertionError, RaftwalError):
            await context.abort_with_status(
                to_status(error_info(E.ON_SHUTDOWN, "node is starting or stopping"))
            )
        return api.CollectStatusResponse(
            node_id=self._node.me.id,
            member=member,
            serving_terms=self._node.serving_terms(),
        )
