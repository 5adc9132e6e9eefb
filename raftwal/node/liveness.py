"""A node's control process and the Raft leader's coordinator: heartbeats (with the
pchannels the node serves and its data workers' addresses), suspicions of peers whose
streams broke, the stall watch (a frozen process suspects nobody), and the answers that
stop or restart the node (removed, another process is this node, a new Raft role).

``LivenessMixin`` is part of ``raftwal.node.process.Node``. Its loops end only when the
node stops; every call in them is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

import grpc

from raftwal.node.membership import (
    store_role,
    wanted_role,
)
from raftwal.services.cluster import ID_IN_USE_MARK, REMOVED_MARK
from rpc.aio import wait_event
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

# A suspicion (HeartbeatRequest.suspect_node_ids) is repeated this long.
SUSPECT_KEEP_S = 3.0
# The stall watch ticks this often; a tick this much later than due means the process
# itself was frozen (SIGSTOP, a VM pause, a starved CPU): for SUSPECT_KEEP_S after that it
# suspects no peer, whose streams may well have ended because of its own silence.
STALL_TICK_S = 0.1
STALL_S = 1.0


class LivenessMixin:
    """Heartbeats, suspicions, and the answers that stop or restart the node. (a part of the control process's ``Node``.)"""

    def suspect(self, node_id: str) -> None:
        """A peer's stream to this node broke abruptly: tell the leader at once, unless
        this process was frozen itself a moment ago (then the peer most likely gave up on
        it: an owner closes a replica's stream that stays silent past its idle timeout)."""
        if node_id == self.me.id or node_id not in {n.id for n in self.config.nodes}:
            return
        now = time.monotonic()
        if now - self._alive_at > STALL_S:
            self._stalled_at = now
        if now - self._stalled_at < SUSPECT_KEEP_S:
            log.info("node %s was frozen a moment ago: not suspecting %s", self.me.id, node_id)
            return
        self._suspects[node_id] = now
        self._heartbeat_now.set()

    async def _stall_watch(self) -> None:
        """Notices this process being frozen (see STALL_S) and drops the suspicions it
        raised just before: it cannot tell a peer's failure from its own silence."""
        while not self._stopping.is_set():
            await asyncio.sleep(STALL_TICK_S)
            now = time.monotonic()
            if now - self._alive_at > STALL_S:
                self._stalled_at = now
                self._suspects.clear()
            self._alive_at = now

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        request = api.HeartbeatRequest(
            node_id=self.me.id,
            address=self.me.grpc_address,
            incarnation=self.incarnation,
            raft_address=self.me.raft_address,
            joined=bool(self._static_config.join),
        )
        while not self._stopping.is_set():
            if self._forgotten(request):
                return
            leader = self.leader() if self.peer is not None else None
            self.leaderless_s()
            request.serving_terms.clear()
            request.serving_terms.update(self.serving_terms())
            # Announced once every data worker is up (the last known address of one
            # that is restarting): the leader registers them (Node.worker_addresses).
            del request.worker_addresses[:]
            request.worker_addresses.extend(self.workers.worker_addresses())
            now = time.monotonic()
            self._suspects = {n: t for n, t in self._suspects.items() if now - t < SUSPECT_KEEP_S}
            del request.suspect_node_ids[:]
            request.suspect_node_ids.extend(sorted(self._suspects))
            request.draining = self.draining
            request.disk_pressure = self.disks.pressure
            if leader is not None:
                if leader.id == self.me.id:
                    self.coordinator.record_heartbeat(request)
                    self._admit()
                    if self.draining:
                        self._note_handover_targets(self.coordinator.handover_targets(self.me.id))
                else:
                    stub = coordinator_pb2_grpc.ClusterStub(self.channel(leader.grpc_address))
                    try:
                        answer = await stub.Heartbeat(request, timeout=max(interval, 0.5))
                        self._admit()
                        if self.draining and answer.draining_seen:
                            self._note_handover_targets(answer.handover_targets)
                        await self._follow_membership(
                            list(answer.voter_node_ids), answer.membership_settled
                        )
                    except grpc.aio.AioRpcError as error:
                        log.debug("heartbeat to %s failed: %s", leader.id, error.code())
                        refusal = from_rpc_error(error)
                        if refusal.code == E.NOT_FOUND and REMOVED_MARK in refusal.message:
                            self._stop_removed(refusal.message)
                            return
                        if refusal.code == E.ALREADY_EXISTS and ID_IN_USE_MARK in refusal.message:
                            self._stop_id_in_use(refusal.message)
                            return
            self._heartbeat_now.clear()
            await wait_event(self._heartbeat_now, interval)

    def _forgotten(self, request: api.HeartbeatRequest) -> bool:
        """True (and the node stopping) when the applied state says `raftwal member
        remove` forgot this node and this process was not started with --join after that:
        a removed node stops even when it cannot reach the leader to be refused."""
        removed = self.removed_node(self.me.id)
        if removed is None or (request.joined and request.incarnation > removed.removed_at_ms):
            return False
        self._stop_removed(
            f"node {self.me.id} {REMOVED_MARK} by `raftwal member remove` at revision "
            f"{removed.removed_revision} (this process started at {request.incarnation} ms"
            f"{' with' if request.joined else ' without'} --join; expected one started with "
            f"--join after the removal, at {removed.removed_at_ms} ms): stop it, or start it "
            "again with --join"
        )
        return True

    def _admit(self) -> None:
        """A leader accepted this process as the node: its data workers may take its
        pchannels now (at once, rather than at their next round)."""
        if not self.admitted.is_set():
            self.admitted.set()
            self.workers.admit()

    def _stop_id_in_use(self, why: str) -> None:
        """Another process is this node (the leader refused this one): stop at once,
        without a handover (this process holds nothing of the node's), and say why
        (``run_node`` raises NodeIdInUse: exit status 2, with `why` as its one line)."""
        log.info("node %s refused by the leader: another process is this node", self.me.id)
        self.id_in_use = why
        self.restart_requested = False
        self._stop_requested.set()

    def _stop_removed(self, why: str) -> None:
        """Forgotten by `raftwal member remove`: stop, and say why (``run_node`` raises
        NodeRemoved: exit status 3)."""
        log.error("%s", why)
        self.removed = True
        self.restart_requested = False
        self._stop_requested.set()

    async def _follow_membership(self, voter_node_ids: list[str], settled: bool) -> None:
        """Switch this node's role when the leader's settled voter set says so: remember
        the new role durably, then stop as for a planned restart (handover first) and let
        ``main`` start the same command again (``restart_requested``)."""
        wanted = wanted_role(self.me.id, voter_node_ids, settled)
        if wanted is None or wanted == self.role or self._stop_requested.is_set():
            return
        log.warning(
            "node %s: the Raft voters are now %s; restarting as a %s node (was %s)",
            self.me.id,
            ", ".join(voter_node_ids),
            "voting" if wanted == "voter" else "data",
            self.role,
        )
        try:
            await asyncio.to_thread(store_role, self.me.data_dir, wanted)
        except OSError as error:
            # Not switching without remembering: the next heartbeat answer asks again.
            log.error("node %s: cannot store its new role: %s", self.me.id, error)
            return
        self.restart_requested = True
        self._stop_requested.set()
