"""What a node's control process reports: its own ``MemberStatus`` (Raft, and its data
workers' owners, WAL on disk, replicators and processes, asked over their links) and the
cluster's ``ClusterStatus`` with the warnings an operator acts on.

``ReportingMixin`` is part of ``raftwal.node.process.Node``. It only reads, and every call
to a peer or a worker is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TypeVar

import grpc

from raftwal.node.config import (
    NodeConfig,
)
from raftwal.node.disks import disk_warnings
from raftwal.node.health import under_replicated
from raftwal.node.status import process_status, tree_bytes
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from statemachine.replicate import mismatch_warning, replicated_pairs

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

# How long a status waits for the data workers' own (those that do not answer in time are
# shown with what they sent last).
MEMBER_STATUS_WAIT_S = 0.5


class ReportingMixin:
    """Member and cluster status, and the warnings in them. (a part of the control process's ``Node``.)"""

    async def member_status(self) -> api.MemberStatus:
        """This node's status: Raft as its control process has it, the owners and WAL of
        its data workers (asked now, briefly), and every process of the node."""
        peer = self._require_peer()
        status = peer.status()
        revision, applied_index, digest = self.replica.digest()
        await self.workers.refresh_status(MEMBER_STATUS_WAIT_S)
        member = api.MemberStatus(
            node_id=self.me.id,
            grpc_address=self.me.grpc_address,
            raft_address=self.me.raft_address,
            role=self.role,
            is_leader=peer.is_leader(),
            reachable=True,
            raft_term=peer.raft_term(),
            commit_index=peer.commit_index(),
            applied_index=applied_index,
            revision=revision,
            state_digest=digest,
            # The node's own process (`raftwal node`): its supervisor.
            pid=os.getppid(),
            durable_index=int(status.get("durable_index", 0) or 0),
            data_dir_bytes=await asyncio.to_thread(tree_bytes, self.me.data_dir),
            disks=self.disks.statuses(),
            raft_reserve_bytes=self.raft_reserve.held_bytes,
            raft_reserve_wanted_bytes=self.raft_reserve.size_bytes,
            disk_writes_refused=self.workers.disk_writes_refused(),
        )
        member.processes.append(process_status("supervisor", os.getppid(), up=True))
        member.processes.append(process_status("control", os.getpid(), up=True))
        for index, link in sorted(self.workers.links.items()):
            owners = sorted(link.status.owners, key=lambda o: o.pchannel) if link.up else []
            member.owners.extend(owners)
            if link.up:
                member.wal_disk.extend(link.status.wal_disk)
                member.replicators.extend(link.status.replicators)
            member.processes.append(
                process_status(
                    "worker",
                    link.pid if link.up else 0,
                    index=index,
                    up=link.up,
                    grpc_address=link.grpc_address,
                    transfer_port=link.transfer_port,
                    restarts=link.restarts,
                    owned_pchannels=[o.pchannel for o in owners],
                    replica_pchannels=link.status.logs if link.up else 0,
                )
            )
        member.wal_disk.sort(key=lambda usage: usage.pchannel)
        return member

    async def cluster_status(self, linearizable: bool) -> api.ClusterStatusResponse:
        # (source pchannel, target cluster, last source LSN the target holds as recorded,
        # the mismatched checkpoint the target claims or 0)
        replicated: list[tuple[str, str, int, int]] = []

        def reader(state: pb.CoordinationState) -> api.ClusterStatusResponse:
            for pchannel, target in replicated_pairs(
                state.replicate_configuration, state.replicate_cluster_id
            ):
                checkpoints = state.replicate_checkpoints.get(pchannel)
                recorded = checkpoints.source_lsns.get(target, 0) if checkpoints else 0
                claimed = checkpoints.mismatched_lsns.get(target, 0) if checkpoints else 0
                replicated.append((pchannel, target, recorded, claimed))
            response = api.ClusterStatusResponse(
                nodes=[state.nodes[k] for k in sorted(state.nodes)],
                pchannels=[
                    state.pchannels[k]
                    for k in sorted(state.pchannels)
                    if state.pchannels[k].state != pb.PCHANNEL_STATE_DROPPED
                ],
                balance_policy=state.balance_policy,
                leases=len(state.leases),
                locks=len(state.locks),
                pending_broadcasts=sum(
                    1 for t in state.broadcasts.values() if t.state == pb.BROADCAST_STATE_PENDING
                ),
                retention=[
                    api.RetentionStatus(
                        pchannel=name,
                        deleted_before_lsn=state.manifests[name].deleted_before_lsn,
                        committed_segments=len(state.manifests[name].segments),
                        committed_bytes=sum(s.bytes for s in state.manifests[name].segments),
                        committed_through_lsn=state.manifests[name].committed_through_lsn,
                    )
                    for name in sorted(state.manifests)
                    if name in state.pchannels
                    and state.pchannels[name].state != pb.PCHANNEL_STATE_DROPPED
                ],
            )
            if state.HasField("wal_alter"):
                response.wal_alter.CopyFrom(state.wal_alter)
            return response

        response, revision = await self.read(reader, linearizable)
        response.revision = revision
        members = await asyncio.gather(*(self._collect_member(node) for node in self.config.nodes))
        response.members.extend(members)
        leader = self.leader()
        if leader is not None:
            response.leader_node_id = leader.id
            response.leader_address = leader.grpc_address
        response.under_replicated.extend(under_replicated(response.pchannels, response.nodes))
        response.warnings.extend(self._warnings(response))
        response.warnings.extend(self._replication_warnings(response, replicated))
        return response

    def _replication_warnings(
        self, response: api.ClusterStatusResponse, replicated: list[tuple[str, str, int, int]]
    ) -> list[str]:
        """A replicator that cannot keep up or is stalled (its one line), and a target that
        lags its source pchannel by more than replicate_lag_warn_entries (LSNs, control
        entries included) by the checkpoint its replicator last recorded."""
        committed = {
            owner.pchannel: owner.committed_lsn
            for member in response.members
            for owner in member.owners
            if owner.state == "serving"
        }
        limit = self.config.replicate_lag_warn_entries
        # A replicator that cannot keep up (or is stalled) says so in one line; one stopped
        # by a checkpoint that does not match is said below, with the target's claim.
        warnings = [
            replicator.summary
            for member in response.members
            for replicator in member.replicators
            if replicator.summary and replicator.state != "checkpoint_mismatch"
        ]
        for pchannel, target, recorded, claimed in replicated:
            if claimed:
                # Above what the source committed: the replicator refused it.
                warnings.append(mismatch_warning(pchannel, target, claimed))
                continue
            lag = committed.get(pchannel, 0) - recorded
            if lag > limit:
                warnings.append(
                    f"replication of pchannel {pchannel} to cluster {target} is lagging: "
                    f"{lag} entries behind committed lsn {committed[pchannel]} (target "
                    f"checkpoint {recorded}; warning above {limit}; see `raftwal replicate "
                    "status`)"
                )
        return warnings

    async def _collect_member(self, node: NodeConfig) -> api.MemberStatus:
        if node.id == self.me.id:
            return await self.member_status()
        stub = coordinator_pb2_grpc.NodeManagerStub(self.channel(node.grpc_address))
        try:
            reply = await stub.CollectStatus(api.CollectStatusRequest(), timeout=1.0)
            return reply.member
        except grpc.aio.AioRpcError:
            return api.MemberStatus(
                node_id=node.id,
                grpc_address=node.grpc_address,
                raft_address=node.raft_address,
                role=node.role,
                reachable=False,
            )

    def _warnings(self, response: api.ClusterStatusResponse) -> list[str]:
        warnings = []
        if not response.leader_node_id:
            warnings.append("no Raft leader is known")
        for member in response.members:
            if not member.reachable:
                warnings.append(f"member {member.node_id} ({member.grpc_address}) is unreachable")
        for node in response.nodes:
            if node.state == pb.NODE_STATE_DOWN:
                warnings.append(f"node {node.node_id} is DOWN")
        for channel in response.pchannels:
            if channel.state == pb.PCHANNEL_STATE_ASSIGNING:
                warnings.append(f"pchannel {channel.name} is ASSIGNING at term {channel.term}")
            elif channel.state == pb.PCHANNEL_STATE_UNAVAILABLE:
                warnings.append(f"pchannel {channel.name} is UNAVAILABLE")
        if self.is_leader():
            for (task_id, vchannel), (count, error) in sorted(
                self.coordinator.broadcast_failures.items()
            ):
                if count >= 3:
                    warnings.append(
                        f"broadcast {task_id} to {vchannel} failing ({count} attempts): {error}"
                    )
        for index, link in sorted(self.workers.links.items()):
            if not link.up:
                warnings.append(
                    f"data worker {index} of node {self.me.id} is "
                    + ("down (restarting)" if link.grpc_address else "starting")
                )
            for pchannel, error in sorted(link.status.problems.items()):
                warnings.append(f"pchannel {pchannel}: {error}")
        for short in response.under_replicated:
            warnings.append(
                f"pchannel {short.pchannel} is under-replicated: {short.live} of {short.wanted} "
                f"replicas live (set {','.join(short.replica_node_ids)}"
                + (f"; DOWN: {','.join(short.down_node_ids)}" if short.down_node_ids else "")
                + ")"
            )
        lag_limit = self.config.replica_lag_warn_entries
        for member in response.members:
            for owner in member.owners:
                if owner.state != "serving":
                    continue
                for replica in owner.replicas:
                    lag = owner.committed_lsn - replica.durable_lsn
                    if lag > lag_limit:
                        warnings.append(
                            f"replica {replica.node_id} of pchannel {owner.pchannel} is lagging: "
                            f"{lag} entries behind committed lsn {owner.committed_lsn} (owner "
                            f"{member.node_id} at term {owner.term}; warning above {lag_limit})"
                        )
                    elif replica.lagging:
                        warnings.append(
                            f"replica {replica.node_id} of pchannel {owner.pchannel} is lagging: "
                            f"its oldest missing committed entry is {replica.lag_ms} ms old "
                            f"(durable lsn {replica.durable_lsn} < committed lsn "
                            f"{owner.committed_lsn}; owner {member.node_id} at term "
                            f"{owner.term}; warning above {self.config.replica_lag_warn_ms} ms: "
                            "a slow disk or link; writes are acknowledged without it)"
                        )
        for member in response.members:
            warnings.extend(disk_warnings(member))
        # The digest covers apply metadata too (raft index, clock, dedup window), so only
        # replicas at the same applied raft index must agree.
        by_index: dict[int, set[str]] = {}
        for member in response.members:
            if member.reachable:
                by_index.setdefault(member.applied_index, set()).add(member.state_digest)
        for index, seen in sorted(by_index.items()):
            if len(seen) > 1:
                warnings.append(
                    f"replicas DIVERGED at raft index {index}: state digests "
                    f"{', '.join(d[:16] for d in sorted(seen))}"
                )
        return warnings
