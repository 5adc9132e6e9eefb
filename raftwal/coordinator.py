"""The coordinator loop: runs on the Raft leader only (DESIGN.md section 5).

- Heartbeats are held **in memory**; only changes are proposed: RegisterNode when a node
  appears, restarts or comes back, MarkNodeDown after ``node_timeout_ms`` of silence.
- A new leader first grants every node a full timeout (it has heard nobody yet) and
  proposes ``ExtendLeases`` so no holder loses a lease to the leader change.
- Leases whose deadline passed (by the leader's clock) are expired with ``ExpireLeases``;
  TOMBSTONE broadcasts are cleared after the retention.
- The balancer (``statemachine.balancer.plan``) is asked for moves; each accepted
  ``AssignPChannel`` is followed by ``NodeManager.Assign`` on the new owner, and ASSIGNING
  pchannels are re-sent to their owner until they are ready; one stuck for longer than
  ``assign_timeout_ms`` is reassigned with a new term.

Every proposal is bounded by the propose timeout; failures are logged and retried on the
next tick, never in a tight loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftwal.internal import call_assign
from rpc.errors import RaftwalError
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from statemachine.balancer import plan

if TYPE_CHECKING:
    from raftwal.node import Node

log = logging.getLogger(__name__)
E = errors_pb2

CLEAR_BROADCASTS_EVERY_S = 10.0
RESEND_ASSIGN_EVERY_S = 2.0


@dataclass
class _Heartbeat:
    address: str
    incarnation: int
    seen_at: float  # time.monotonic()


class Coordinator:
    def __init__(self, node: Node) -> None:
        self._node = node
        self._heartbeats: dict[str, _Heartbeat] = {}
        self._leading_since: float | None = None
        self._assigning_since: dict[tuple[str, int], float] = {}
        self._assign_sent: dict[tuple[str, int], float] = {}
        self._last_clear = 0.0
        self._background: set[asyncio.Task[bool]] = set()
        self.failures = 0

    def _send_assign(self, address: str, pchannel: str, term: int) -> None:
        # Bounded by call_assign's deadline; the set keeps the task referenced until done.
        task = asyncio.create_task(call_assign(self._node, address, pchannel, term))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def record_heartbeat(self, request: api.HeartbeatRequest) -> None:
        self._heartbeats[request.node_id] = _Heartbeat(
            address=request.address, incarnation=request.incarnation, seen_at=time.monotonic()
        )

    async def run(self) -> None:
        interval = self._node.config.coordinator_tick_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if not self._node.is_leader():
                self._leading_since = None
                continue
            try:
                if self._leading_since is None:
                    await self._take_over()
                await self.tick()
            except RaftwalError as error:
                # Lost leadership mid-tick or a proposal timed out: try again next tick.
                self.failures += 1
                log.info("coordinator tick failed: %s", error)

    async def _propose(self, **body: object) -> pb.CommandResult:
        result = await self._node.propose(pb.Command(**body))  # type: ignore[arg-type]
        if result.rejection.code != E.OK:
            log.info("coordinator command %s rejected: %s", list(body), result.rejection.message)
        return result

    async def _take_over(self) -> None:
        now = time.monotonic()
        node_ids, _ = await self._node.read(lambda s: sorted(s.nodes), linearizable=True)
        # Everyone gets a full timeout from now: silence before we led is not evidence.
        for node_id in node_ids:
            beat = self._heartbeats.get(node_id)
            if beat is None:
                self._heartbeats[node_id] = _Heartbeat(address="", incarnation=0, seen_at=now)
            else:
                beat.seen_at = max(beat.seen_at, now)
        self._assigning_since.clear()
        self._assign_sent.clear()
        await self._propose(extend_leases=pb.ExtendLeases())
        self._leading_since = now
        log.info("node %s leads: coordinator started", self._node.me.id)

    async def tick(self) -> None:
        node = self._node
        config = node.config
        now = time.monotonic()
        timeout_s = config.node_timeout_ms / 1000

        def snapshot(state: pb.CoordinationState) -> pb.CoordinationState:
            copy = pb.CoordinationState()
            copy.CopyFrom(state)
            return copy

        state, _ = await node.read(snapshot, linearizable=False)

        # 1. Liveness: register what appeared or restarted, mark down what went silent.
        for node_id, beat in sorted(self._heartbeats.items()):
            if not beat.address or now - beat.seen_at > timeout_s:
                continue
            known = state.nodes.get(node_id)
            if known is None or known.address != beat.address or known.state != pb.NODE_STATE_UP:
                await self._propose(
                    register_node=pb.RegisterNode(node_id=node_id, address=beat.address)
                )
        for node_id in sorted(state.nodes):
            if state.nodes[node_id].state != pb.NODE_STATE_UP:
                continue
            beat = self._heartbeats.get(node_id)
            if beat is None:
                self._heartbeats[node_id] = _Heartbeat(address="", incarnation=0, seen_at=now)
            elif now - beat.seen_at > timeout_s:
                log.warning(
                    "node %s silent for %.1f s: marking it DOWN", node_id, now - beat.seen_at
                )
                await self._propose(mark_node_down=pb.MarkNodeDown(node_id=node_id))

        # 2. Leases and broadcasts, judged by the leader's wall clock.
        wall_ms = int(time.time() * 1000)
        if any(lease.deadline_ms <= wall_ms for lease in state.leases.values()):
            await self._propose(expire_leases=pb.ExpireLeases())
        if now - self._last_clear > CLEAR_BROADCASTS_EVERY_S:
            self._last_clear = now
            if any(t.state == pb.BROADCAST_STATE_TOMBSTONE for t in state.broadcasts.values()):
                await self._propose(
                    clear_broadcasts=pb.ClearBroadcasts(retention_ms=config.broadcast_retention_ms)
                )

        # 3. Placement.
        live = [
            node_id
            for node_id, beat in self._heartbeats.items()
            if beat.address and now - beat.seen_at <= timeout_s
        ]
        assigning = {
            (name, channel.term)
            for name, channel in state.pchannels.items()
            if channel.state == pb.PCHANNEL_STATE_ASSIGNING
        }
        for key in list(self._assigning_since):
            if key not in assigning:
                del self._assigning_since[key]
                self._assign_sent.pop(key, None)
        for key in assigning:
            self._assigning_since.setdefault(key, now)
        stuck = [
            name
            for (name, _term), since in self._assigning_since.items()
            if now - since > config.assign_timeout_ms / 1000
        ]
        moved: set[str] = set()
        for command in plan(state, live, stuck_pchannels=stuck):
            assign = command.assign_pchannel
            result = await self._propose(assign_pchannel=assign)
            if result.rejection.code == E.OK:
                moved.add(assign.pchannel)
                self._assign_sent[(assign.pchannel, assign.term)] = now
                address = state.nodes[assign.node_id].address
                self._send_assign(address, assign.pchannel, assign.term)
        for name, term in sorted(assigning):
            if name in moved:
                continue
            sent = self._assign_sent.get((name, term), 0.0)
            if now - sent < RESEND_ASSIGN_EVERY_S:
                continue
            channel = state.pchannels[name]
            owner = state.nodes.get(channel.owner_node_id)
            if owner is None:
                continue
            self._assign_sent[(name, term)] = now
            self._send_assign(owner.address, name, term)
