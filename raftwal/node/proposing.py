"""Proposals and linearizable reads of a node's control process (the
``CoordinationBackend`` the Coordinator servicer uses): ``propose`` stamps the proposer's
wall time and proposes through the local Raft peer when it leads, otherwise forwards the
command bytes to the leader's ``Cluster.Propose`` (batched by ``ProposalBatcher``);
``read`` serves linearizable reads by ReadIndex or the leader's lease (docs/architecture.md,
section 9).

``ProposingMixin`` is part of ``raftwal.node.process.Node``. It never changes the state
but through Raft, and every wait here is bounded by the propose timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from raft.errors import (
    LeadershipUnconfirmed,
    NotLeader,
    Overloaded,
    PeerClosed,
    UnknownOutcome,
)
from raft.events import Compacted
from raftwal.node.config import (
    NodeConfig,
)
from raftwal.services.coordinator import CompactedHistory
from rpc.errors import RaftwalError, error_info, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

MAX_COMMAND_BYTES = 2 * 1024 * 1024
# Forwarded proposal calls a follower keeps in flight to the leader at once.
FORWARDS_IN_FLIGHT = 4
# How long a follower waits for the leader to confirm a read index it forwarded.
FORWARDED_READ_INDEX_S = 2.0


def now_ms() -> int:
    return int(time.time() * 1000)


class ProposingMixin:
    """Proposals (local or forwarded to the leader) and linearizable reads. (a part of the control process's ``Node``.)"""

    async def propose(self, command: pb.Command, forward: bool = True) -> pb.CommandResult:
        """Propose `command` here, or at the leader when this node is not it (unless
        `forward` is False: then NOT_LEADER; the coordinator proposes only as leader)."""
        if not command.proposed_at_ms:
            command.proposed_at_ms = now_ms()
        data = command.SerializeToString()
        if len(data) > MAX_COMMAND_BYTES:
            raise RaftwalError(
                error_info(
                    E.INVALID_ARGUMENT,
                    f"command too large ({len(data)} bytes; expected at most {MAX_COMMAND_BYTES})",
                )
            )
        result = await self.metrics.observe_proposal(
            command.WhichOneof("body") or "none", self.propose_bytes(data, forward)
        )
        if result.raft_index and not await self.notifier.wait_index(
            result.raft_index, self.config.propose_timeout_ms / 1000
        ):
            # Committed, but this node has not applied it yet: reads here would be stale.
            log.warning("node %s lags behind raft index %d", self.me.id, result.raft_index)
        return result

    async def propose_batch(self, commands: list[pb.Command]) -> list[pb.CommandResult]:
        """Propose `commands` as one Raft entry, applied in order; one result each.
        Request ids and the proposer's time are stamped like ``propose``'s."""
        stamp = now_ms()
        encoded: list[bytes] = []
        for command in commands:
            if not command.proposed_at_ms:
                command.proposed_at_ms = stamp
            encoded.append(command.SerializeToString())
        total = sum(len(data) for data in encoded)
        if total > MAX_COMMAND_BYTES:
            raise RaftwalError(
                error_info(
                    E.INVALID_ARGUMENT,
                    f"batch too large ({total} bytes; expected at most {MAX_COMMAND_BYTES})",
                )
            )
        results = await self.metrics.observe_proposals(
            [command.WhichOneof("body") or "none" for command in commands],
            self.propose_batch_bytes(encoded),
        )
        index = max((result.raft_index for result in results), default=0)
        if index and not await self.notifier.wait_index(
            index, self.config.propose_timeout_ms / 1000
        ):
            log.warning("node %s lags behind raft index %d", self.me.id, index)
        return results

    async def propose_batch_bytes(
        self, commands: list[bytes], forward: bool = True
    ) -> list[pb.CommandResult]:
        """Serialized commands as one entry (forwarded whole to the leader unless
        `forward` is False); raises RaftwalError like ``propose_bytes``."""
        self._require_peer()
        try:
            replies = await self.batcher.propose_group(commands)
            return [pb.CommandResult.FromString(reply) for reply in replies]
        except NotLeader as error:
            self._leader_for(error, forward)
            replies = await self._forward_group(commands)
            return [pb.CommandResult.FromString(reply) for reply in replies]
        except UnknownOutcome as error:
            raise RaftwalError(
                error_info(E.UNKNOWN, f"outcome unknown ({error}); retry with the same request ids")
            ) from None
        except (Overloaded, PeerClosed, OverflowError) as error:
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"cannot propose now: {error}")) from None

    def _leader_for(self, error: NotLeader, forward: bool) -> NodeConfig:
        """The leader to forward to, or the NOT_LEADER error to answer."""
        leader = (
            self.config.node_by_raft_address(error.leader_address) if error.leader_address else None
        )
        if leader is None or leader.id == self.me.id or not forward:
            raise RaftwalError(
                error_info(
                    E.NOT_LEADER,
                    f"node {self.me.id} is not the Raft leader and knows no leader yet"
                    if leader is None
                    else f"node {self.me.id} is not the Raft leader",
                    leader_hint=leader.grpc_address if leader is not None else "",
                )
            ) from None
        return leader

    async def _forward_group(self, commands: list[bytes]) -> list[bytes]:
        try:
            return await self.forwarder.propose_group(commands)
        except OverflowError as error:
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"cannot forward now: {error}")) from None

    async def _forward_entry(self, entry_bytes: bytes) -> bytes:
        """The forwarder's "propose": send the commands gathered into `entry_bytes` (a
        LogEntry) to the leader known now, as one Propose or ProposeBatch call; answers a
        LogEntryResult. Raises RaftwalError (NOT_LEADER without a known leader, or the
        leader's error, which every command of the group then gets)."""
        entry = pb.LogEntry.FromString(entry_bytes)
        commands = [entry.command] if entry.HasField("command") else list(entry.batch.commands)
        leader = self.leader()
        if leader is None or leader.id == self.me.id:
            raise RaftwalError(
                error_info(
                    E.NOT_LEADER,
                    f"node {self.me.id} is not the Raft leader and knows no leader yet",
                )
            )
        timeout_s = self.config.propose_timeout_ms / 1000
        stub = coordinator_pb2_grpc.ClusterStub(self.channel(leader.grpc_address))
        try:
            if len(commands) == 1:
                single = await stub.Propose(
                    api.ProposeRequest(command=commands[0], timeout_ms=int(timeout_s * 1000)),
                    timeout=timeout_s + 1,
                )
                results = [single.result]
            else:
                many = await stub.ProposeBatch(
                    api.ProposeBatchRequest(commands=commands, timeout_ms=int(timeout_s * 1000)),
                    timeout=timeout_s + 1,
                )
                results = list(many.results)
        except grpc.aio.AioRpcError as rpc_error:
            raise RaftwalError(self._forward_error(rpc_error, leader)) from None
        return pb.LogEntryResult(results=results).SerializeToString()

    @staticmethod
    def _forward_error(error: grpc.aio.AioRpcError, leader: NodeConfig) -> errors_pb2.ErrorInfo:
        info = from_rpc_error(error)
        if info.code == E.NOT_LEADER and not info.leader_hint:
            info.leader_hint = leader.grpc_address
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            info = error_info(E.UNKNOWN, "forwarded proposal timed out; outcome unknown")
        return info

    async def _propose_entry(self, entry: bytes) -> bytes:
        peer = self._require_peer()
        return await peer.propose_async(entry, self.config.propose_timeout_ms / 1000)

    async def propose_bytes(self, data: bytes, forward: bool = True) -> pb.CommandResult:
        self._require_peer()
        try:
            reply = await self.batcher.propose(data)
            return pb.CommandResult.FromString(reply)
        except NotLeader as error:
            leader = (
                self.config.node_by_raft_address(error.leader_address)
                if error.leader_address
                else None
            )
            if leader is None or leader.id == self.me.id or not forward:
                raise RaftwalError(
                    error_info(
                        E.NOT_LEADER,
                        f"node {self.me.id} is not the Raft leader and knows no leader yet"
                        if leader is None
                        else f"node {self.me.id} is not the Raft leader",
                        leader_hint=leader.grpc_address if leader is not None else "",
                    )
                ) from None
            (reply,) = await self._forward_group([data])
            return pb.CommandResult.FromString(reply)
        except UnknownOutcome as error:
            raise RaftwalError(
                error_info(
                    E.UNKNOWN,
                    f"outcome unknown ({error}); retry with the same request id",
                )
            ) from None
        except (Overloaded, PeerClosed, OverflowError) as error:
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"cannot propose now: {error}")) from None

    async def read_index(self, timeout_s: float) -> tuple[int, int]:
        """(raft index, term) for a linearizable read, on the leader only: from the
        leader's lease when it holds one (no message at all), else ReadIndex (one heartbeat
        round); never a log entry. Raises RaftwalError NOT_LEADER / UNAVAILABLE."""
        peer = self._require_peer()
        term = peer.raft_term()
        try:
            index = peer.lease_read_index()
            if index is not None:
                if peer.last_applied_index() < index:
                    await peer.wait_applied_async(index, timeout_s)
                return index, term
            index = await peer.read_index_async(timeout_s)
        except NotLeader as error:
            leader = (
                self.config.node_by_raft_address(error.leader_address)
                if error.leader_address
                else None
            )
            raise RaftwalError(
                error_info(
                    E.NOT_LEADER,
                    f"node {self.me.id} is not the Raft leader ({error})",
                    leader_hint=leader.grpc_address if leader is not None else "",
                )
            ) from None
        except (LeadershipUnconfirmed, Overloaded) as error:
            raise RaftwalError(
                error_info(E.UNAVAILABLE, f"linearizable read failed: {error}")
            ) from None
        except PeerClosed as error:
            raise RaftwalError(error_info(E.ON_SHUTDOWN, str(error))) from None
        return index, term

    async def _linearizable_point(self) -> None:
        """Return once this node's applied state reflects every write acknowledged before
        the call (ReadIndex: the leader's, or the leader's index applied here)."""
        peer = self._require_peer()
        timeout_s = self.config.propose_timeout_ms / 1000
        if peer.is_leader():
            await self.read_index(timeout_s)
            return
        leader = self.leader()
        if leader is None or leader.id == self.me.id:
            raise RaftwalError(
                error_info(
                    E.NOT_LEADER,
                    f"node {self.me.id} knows no Raft leader: cannot serve a linearizable read",
                )
            )
        stub = coordinator_pb2_grpc.ClusterStub(self.channel(leader.grpc_address))
        # A live leader confirms a read index in one heartbeat round; one that does not
        # answer within FORWARDED_READ_INDEX_S is paused, partitioned or dead. Say so
        # while the client still has time to ask another node, rather than holding the
        # call for the whole propose timeout.
        forward_s = min(timeout_s, FORWARDED_READ_INDEX_S)
        try:
            reply = await stub.ReadIndex(
                api.ReadIndexRequest(timeout_ms=int(forward_s * 1000)), timeout=forward_s + 0.5
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise RaftwalError(
                    error_info(
                        E.UNAVAILABLE,
                        f"node {self.me.id}: the Raft leader {leader.id} did not confirm a "
                        f"read index within {forward_s:g} s; cannot serve a linearizable read",
                    )
                ) from None
            info = from_rpc_error(error)
            if info.code == E.NOT_LEADER and not info.leader_hint:
                info.leader_hint = leader.grpc_address
            raise RaftwalError(info) from None
        try:
            await peer.wait_applied_async(reply.raft_index, timeout_s)
        except (LeadershipUnconfirmed, Overloaded):
            raise RaftwalError(
                error_info(E.UNAVAILABLE, f"node {self.me.id} is too far behind the leader")
            ) from None
        except PeerClosed as error:
            raise RaftwalError(error_info(E.ON_SHUTDOWN, str(error))) from None

    async def read(
        self, reader: Callable[[pb.CoordinationState], T], linearizable: bool
    ) -> tuple[T, int]:
        if linearizable:
            await self._linearizable_point()

        def with_revision(state: pb.CoordinationState) -> tuple[T, int]:
            return reader(state), state.revision

        return self.replica.read(with_revision)

    async def wait_change(self, timeout_s: float) -> None:
        """Wait for the applied state to change (bounded by `timeout_s`). Raises
        ON_SHUTDOWN once the node is stopping, so that watches end with a status their
        clients retry elsewhere instead of being cancelled by the server's stop."""
        if self._stopping.is_set():
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"node {self.me.id} is shutting down"))
        await self.notifier.wait_change(timeout_s)
        if self._stopping.is_set():
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"node {self.me.id} is shutting down"))

    def events_from(self, from_revision: int, limit: int) -> list[pb.Event]:
        try:
            return self.replica.events_from(from_revision, limit)
        except Compacted as error:
            raise CompactedHistory(error.requested, error.first_retained) from None

    def applied_revision(self) -> int:
        return self.replica.applied()[0]
