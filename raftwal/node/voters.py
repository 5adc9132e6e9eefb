"""Raft membership changes on the leader's control process (``raftwal member``,
docs/architecture.md section 10): the checks before a voter is added or removed or a node
forgotten, one change at a time.

``VotersMixin`` is part of ``raftwal.node.process.Node``. It changes the membership only
through the Raft peer, and refuses what would leave no majority.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

from raft.errors import (
    ChangeRefused,
    NotLeader,
    Overloaded,
    PeerClosed,
    UnknownOutcome,
)
from raft.peer import RaftPeer
from raftwal.node.membership import (
    MAX_PROMOTION_LAG_ENTRIES,
)
from rpc.errors import RaftwalError, error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")


class VotersMixin:
    """Raft membership changes (voters and data nodes). (a part of the control process's ``Node``.)"""

    def voter_node_ids(self) -> list[str]:
        """The voters as this node's log has them, as node ids (an address no configured
        node has stays an address)."""
        peer = self._require_peer()
        ids = []
        for address in peer.voters():
            node = self.config.node_by_raft_address(address)
            ids.append(node.id if node is not None else address)
        return sorted(ids)

    def membership(self) -> tuple[list[str], bool]:
        peer = self._require_peer()
        return self.voter_node_ids(), not peer.membership_pending()

    def _require_leader(self) -> RaftPeer:
        peer = self._require_peer()
        if not peer.is_leader():
            self._leader_for(NotLeader(peer.leader_address()), forward=False)
        return peer

    def list_members(self) -> api.ListMembersResponse:
        peer = self._require_leader()
        return api.ListMembersResponse(
            voter_node_ids=self.voter_node_ids(),
            change_pending=peer.membership_pending(),
            leader_node_id=self.me.id,
        )

    async def change_membership(
        self, node_id: str, add: bool, timeout_s: float
    ) -> tuple[list[str], bool]:
        peer = self._require_leader()
        if node_id not in {n.id for n in self.config.nodes}:
            raise RaftwalError(
                error_info(
                    E.NOT_FOUND,
                    f"unknown node {node_id!r} (expected one of the configured nodes: "
                    f"{', '.join(n.id for n in self.config.nodes)})",
                )
            )
        node = self.config.node(node_id)
        voters = self.voter_node_ids()
        if (node_id in voters) == add:
            return voters, False

        def refuse(message: str) -> RaftwalError:
            return RaftwalError(error_info(E.IGNORED_OPERATION, message))

        if peer.membership_pending():
            raise refuse("another membership change is not committed yet; retry shortly")
        if add:
            # The new voter counts toward commits only once it restarted as one, which it
            # does when the change has committed: the voters connected now must be a
            # majority of the new set without it, or the change never commits and the
            # cluster is left without a leader (a dead voter among them: remove it first).
            connected = peer.status()["partners_connected"]
            current = peer.voters()
            live = sum(1 for v in current if v == self.me.raft_address or connected.get(v, False))
            needed = (len(current) + 1) // 2 + 1
            if live < needed:
                raise refuse(
                    f"adding {node_id} would make {len(current) + 1} voters of which only "
                    f"{live} are connected to the leader, and {node_id} counts only once it "
                    f"restarted as a voter (expected {needed} connected): remove the dead "
                    f"voter first (raftwal member remove), then add {node_id}"
                )
            member = await self._collect_member(node)
            if not member.reachable:
                raise refuse(
                    f"node {node_id} does not answer: start it (as a data node) and let it "
                    "catch up before making it a voter"
                )
            behind = peer.commit_index() - member.applied_index
            if behind > MAX_PROMOTION_LAG_ENTRIES:
                raise refuse(
                    f"node {node_id} is {behind} Raft entries behind (applied "
                    f"{member.applied_index} of {peer.commit_index()}; expected at most "
                    f"{MAX_PROMOTION_LAG_ENTRIES} behind): let it catch up first"
                )
        else:
            if node_id == self.me.id:
                # A leader never removes itself: move the leadership, and let the caller
                # ask the next leader (NOT_LEADER is retried with its hint).
                await self._hand_over_leadership(time.monotonic() + timeout_s)
                leader = self.leader()
                raise RaftwalError(
                    error_info(
                        E.NOT_LEADER,
                        f"node {node_id} led; the leadership moved away from it first: "
                        "ask the new leader",
                        leader_hint=leader.grpc_address
                        if leader is not None and leader.id != self.me.id
                        else "",
                    )
                )
            held = self._held_by(node_id)
            if held:
                raise refuse(
                    f"node {node_id} still holds {', '.join(held[:8])}"
                    f"{' and more' if len(held) > 8 else ''}: freeze it "
                    "(raftwal balance freeze) and wait until its pchannels moved and it left "
                    "every replica set (raftwal member remove does both)"
                )
            connected = peer.status()["partners_connected"]
            remaining = [v for v in peer.voters() if v != node.raft_address]
            live = sum(1 for v in remaining if v == self.me.raft_address or connected.get(v, False))
            if live <= len(remaining) // 2:
                raise refuse(
                    f"removing {node_id} would leave {len(remaining)} voters of which only "
                    f"{live} are connected to the leader (expected a majority, "
                    f"{len(remaining) // 2 + 1}): bring the others back first"
                )
        try:
            await asyncio.wrap_future(
                peer.change_membership("add" if add else "remove", node.raft_address, timeout_s)
            )
        except ChangeRefused as error:
            raise refuse(str(error)) from None
        except NotLeader as error:
            self._leader_for(error, forward=False)
        except UnknownOutcome as error:
            raise RaftwalError(
                error_info(E.UNKNOWN, f"outcome unknown ({error}); ask ListMembers")
            ) from None
        except (Overloaded, PeerClosed) as error:
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"cannot change now: {error}")) from None
        log.warning(
            "node %s: %s node %s as a Raft voter; voters now %s",
            self.me.id,
            "added" if add else "removed",
            node_id,
            ", ".join(self.voter_node_ids()),
        )
        return self.voter_node_ids(), True

    async def forget_node(self, node_id: str) -> bool:
        """Forget `node_id` (RemoveNode): a node that left the voters and holds nothing.
        False when it was forgotten already. Raises RaftwalError: NOT_FOUND for a node the
        cluster does not know, IGNORED_OPERATION while it is a voter, a membership change
        is uncommitted or it still holds something."""
        peer = self._require_leader()
        if self.removed_node(node_id) is not None:
            return False
        if node_id not in {n.id for n in self.config.nodes}:
            raise RaftwalError(
                error_info(
                    E.NOT_FOUND,
                    f"unknown node {node_id!r} (expected one of the cluster's nodes: "
                    f"{', '.join(n.id for n in self.config.nodes)})",
                )
            )
        if node_id == self.me.id:
            raise RaftwalError(
                error_info(
                    E.IGNORED_OPERATION,
                    f"node {node_id} leads (expected a node that left the voters)",
                )
            )

        def refuse(message: str) -> RaftwalError:
            return RaftwalError(error_info(E.IGNORED_OPERATION, message))

        if peer.membership_pending():
            raise refuse("a membership change is not committed yet; retry shortly")
        if node_id in self.voter_node_ids():
            raise refuse(
                f"node {node_id} is a Raft voter (expected a node that left the voters: "
                "MEMBERSHIP_ACTION_REMOVE first)"
            )
        held = self._held_by(node_id)
        if held:
            raise refuse(
                f"node {node_id} still holds {', '.join(held[:8])}"
                f"{' and more' if len(held) > 8 else ''} (expected nothing: freeze it and "
                "wait until its pchannels moved)"
            )
        result = await self.propose(pb.Command(remove_node=pb.RemoveNode(node_id=node_id)))
        if result.rejection.code != E.OK:
            raise RaftwalError(result.rejection)
        # Its last heartbeats must not register it again.
        self.coordinator.forget(node_id)
        log.warning("node %s: forgot node %s (it left the cluster)", self.me.id, node_id)
        return True

    def _held_by(self, node_id: str) -> list[str]:
        """What `node_id` still holds in the applied state: pchannels it owns, replica
        sets it is in."""

        def reader(state: pb.CoordinationState) -> list[str]:
            held = []
            for name in sorted(state.pchannels):
                channel = state.pchannels[name]
                if channel.state == pb.PCHANNEL_STATE_DROPPED:
                    continue
                if channel.owner_node_id == node_id:
                    held.append(f"pchannel {name}")
                elif (
                    node_id in channel.replica_node_ids
                    or node_id in channel.stable_replica_node_ids
                ):
                    held.append(f"a replica of {name}")
            return held

        return self.replica.read(reader)
