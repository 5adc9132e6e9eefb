"""The node-internal ``Cluster`` service: heartbeats to the Raft leader (whose coordinator
keeps them in memory), proposals forwarded to it by followers (one command, or a batch as
one entry), and read indexes for followers serving linearizable reads (ReadIndex).

Only nodes call it (role ``node``). A forwarded proposal is checked to be a command with a
body before it reaches the Raft log. Depends on ``ClusterBackend``, never on the node.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from google.protobuf.message import DecodeError

from raftwal.services.backend import ClusterBackend, ClusterMembers
from rpc.errors import RaftwalError, error_info, to_status
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from statemachine.validation import NAME_RULE, is_plain_name

log = logging.getLogger(__name__)
E = errors_pb2

# How long an Assign waits for this node to apply the assignment it is told about.
MAX_PROPOSE_TIMEOUT_MS = 60_000
# Commands of one forwarded batch (Coordinator.BatchWrite's bound).
MAX_BATCH_COMMANDS = 1024
# A ReadIndex request without a timeout waits this long for the heartbeat round.
MAX_READ_INDEX_TIMEOUT_MS = 10_000
# In the NOT_FOUND answer to a heartbeat of a node `raftwal member remove` forgot: the
# node stops when it reads it.
REMOVED_MARK = "was removed from the cluster"
# In the ALREADY_EXISTS answer to a heartbeat of a second process under a node id (other
# addresses than the node's): that process stops when it reads it (exit status 2).
ID_IN_USE_MARK = "cannot run as node"
# A joining node's announced host names are resolved (to compare them with the members'):
# each lookup is bounded by this.
RESOLVE_TIMEOUT_S = 1.0


#: The most data worker addresses a heartbeat may announce, and the longest one.
MAX_WORKER_ADDRESSES = 256
MAX_ADDRESS_CHARS = 256


def _bad_worker_address(request: api.HeartbeatRequest) -> str | None:
    """What is wrong with the data worker addresses a heartbeat announces, or None."""
    if len(request.worker_addresses) > MAX_WORKER_ADDRESSES:
        return (
            f"too many worker_addresses ({len(request.worker_addresses)}; expected at most "
            f"{MAX_WORKER_ADDRESSES})"
        )
    for index, address in enumerate(request.worker_addresses):
        host, _, port = address.rpartition(":")
        if (
            len(address) > MAX_ADDRESS_CHARS
            or not host
            or not port.isdigit()
            or not 1 <= int(port) <= 65535
        ):
            return (
                f"invalid worker_addresses[{index}] ({address[:64]!r}; expected host:port "
                "with a port 1..65535)"
            )
    return None


class ClusterServicer(coordinator_pb2_grpc.ClusterServicer):
    def __init__(self, node: ClusterBackend) -> None:
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
        removed = self._node.removed_node(request.node_id)
        if removed is not None and not (
            request.joined and request.incarnation > removed.removed_at_ms
        ):
            # Forgotten (RemoveNode): only a process started with --join after that comes
            # back; anything else would register it again behind the operator's back.
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.NOT_FOUND,
                        f"node {request.node_id} {REMOVED_MARK} by `raftwal member remove` "
                        f"at revision {removed.removed_revision} (got a heartbeat from its "
                        f"process started at {request.incarnation} ms"
                        f"{' with' if request.joined else ' without'} --join; expected a "
                        "process started with --join after the removal, at "
                        f"{removed.removed_at_ms} ms): stop it, or start it again with --join",
                    )
                )
            )
        bad_worker = _bad_worker_address(request)
        if bad_worker is not None:
            await context.abort_with_status(to_status(error_info(E.INVALID_ARGUMENT, bad_worker)))
        known = {n.id for n in self._node.config.nodes}
        if request.node_id not in known:
            refusal = await _joiner_refusal(request, self._node.config)
            if refusal is None:
                conflict = self._node.coordinator.joiner_conflict(request)
                if conflict is not None:
                    refusal = error_info(E.ALREADY_EXISTS, conflict)
            if refusal is not None:
                await context.abort_with_status(to_status(refusal))
            # A node that joined (raftwal node --join): registered with what it announced.
            self._node.coordinator.record_heartbeat(request)
            voters, settled = self._node.membership()
            return api.HeartbeatResponse(
                leader_node_id=self._node.me.id,
                revision=self._node.applied_revision(),
                voter_node_ids=voters,
                membership_settled=settled,
                draining_seen=request.draining,
                handover_targets=self._node.coordinator.handover_targets(request.node_id)
                if request.draining
                else 0,
            )
        node = self._node.config.node(request.node_id)
        if request.address != node.grpc_address or (
            request.raft_address and request.raft_address != node.raft_address
        ):
            # The coordinator registers the addresses a heartbeat carries: wrong ones would
            # send every client (or every Raft peer) of that node elsewhere. A node's
            # addresses are its config file's, or those it registered when it joined; they
            # change only with `raftwal member remove` and a rejoin. So this is another
            # process under the same id: it must stop (ID_IN_USE_MARK).
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.ALREADY_EXISTS,
                        f"node {request.node_id} is at grpc {node.grpc_address}, raft "
                        f"{node.raft_address}: the process announcing grpc "
                        f"{request.address[:64]}, raft {request.raft_address[:64]} "
                        f"{ID_IN_USE_MARK} {request.node_id} (a node's addresses change only "
                        "with `raftwal member remove` and a rejoin under them)",
                    )
                )
            )
        self._node.coordinator.record_heartbeat(request)
        voters, settled = self._node.membership()
        response = api.HeartbeatResponse(
            leader_node_id=self._node.me.id,
            revision=self._node.applied_revision(),
            voter_node_ids=voters,
            membership_settled=settled,
        )
        if request.draining:
            response.draining_seen = True
            response.handover_targets = self._node.coordinator.handover_targets(request.node_id)
        return response

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
            body = pb.Command.FromString(request.command).WhichOneof("body")
        except DecodeError as error:
            body, problem = None, f"undecodable ({error})"
        else:
            problem = "no body"
        if body is None:
            # Rejected here rather than by the state machine: bytes that are no command
            # never reach the Raft log.
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.INVALID_ARGUMENT,
                        f"invalid command ({len(request.command)} bytes, {problem}; expected "
                        "a serialized raftwal.v1.Command with a body)",
                    )
                )
            )
        try:
            # Never forwarded again: a follower that thinks we lead must learn otherwise.
            result = await self._node.propose_bytes(request.command, forward=False)
        except RaftwalError as error:
            await context.abort_with_status(to_status(error.info))
        return api.ProposeResponse(result=result.SerializeToString())

    async def ProposeBatch(self, request, context):
        await self._check_timeout(request.timeout_ms, context)
        count = len(request.commands)
        if not 1 <= count <= MAX_BATCH_COMMANDS:
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.INVALID_ARGUMENT,
                        f"invalid number of commands ({count}; expected 1..{MAX_BATCH_COMMANDS})",
                    )
                )
            )
        for position, data in enumerate(request.commands):
            try:
                body = pb.Command.FromString(data).WhichOneof("body")
            except DecodeError as error:
                body, problem = None, f"undecodable ({error})"
            else:
                problem = "no body"
            if body is None:
                await context.abort_with_status(
                    to_status(
                        error_info(
                            E.INVALID_ARGUMENT,
                            f"invalid commands[{position}] ({len(data)} bytes, {problem}; "
                            "expected a serialized raftwal.v1.Command with a body)",
                        )
                    )
                )
        try:
            # Never forwarded again, like Propose.
            results = await self._node.propose_batch_bytes(list(request.commands), forward=False)
        except RaftwalError as error:
            await context.abort_with_status(to_status(error.info))
        return api.ProposeBatchResponse(results=[r.SerializeToString() for r in results])

    async def ReadIndex(self, request, context):
        await self._check_timeout(request.timeout_ms, context)
        timeout_ms = request.timeout_ms or MAX_READ_INDEX_TIMEOUT_MS
        try:
            index, term = await self._node.read_index(timeout_ms / 1000)
        except RaftwalError as error:
            await context.abort_with_status(to_status(error.info))
        return api.ReadIndexResponse(raft_index=index, term=term)

    async def _check_timeout(self, timeout_ms: int, context) -> None:
        if timeout_ms < 0 or timeout_ms > MAX_PROPOSE_TIMEOUT_MS:
            await context.abort_with_status(
                to_status(
                    error_info(
                        E.INVALID_ARGUMENT,
                        f"invalid timeout_ms ({timeout_ms}; expected 0..{MAX_PROPOSE_TIMEOUT_MS})",
                    )
                )
            )


# address -> (when resolved, time.monotonic(); the endpoints): a joiner heartbeats every
# interval, and its checks resolve every member's addresses.
_RESOLVED: dict[str, tuple[float, frozenset[tuple[str, int]]]] = {}
RESOLVED_KEEP_S = 30.0
RESOLVED_MAX = 1024


async def _endpoints(address: str) -> frozenset[tuple[str, int]]:
    """The (IP, port) pairs `address` resolves to (empty when it does not resolve in
    time): `localhost:7201` and `127.0.0.1:7201` are one endpoint. Kept for
    RESOLVED_KEEP_S."""
    now = time.monotonic()
    known = _RESOLVED.get(address)
    if known is not None and now - known[0] < RESOLVED_KEEP_S:
        return known[1]
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM),
            RESOLVE_TIMEOUT_S,
        )
        found = frozenset((str(info[4][0]), int(info[4][1])) for info in infos)
    except (OSError, ValueError, TimeoutError):
        found = frozenset()
    if len(_RESOLVED) >= RESOLVED_MAX:
        _RESOLVED.clear()
    _RESOLVED[address] = (now, found)
    return found


async def _joiner_refusal(
    request: api.HeartbeatRequest, config: ClusterMembers
) -> errors_pb2.ErrorInfo | None:
    """Why a heartbeat from a node no config file names is refused, or None: it must say
    it joined, and its id and addresses must be well-formed and no other node's (compared
    by what they resolve to, not as strings)."""
    node_id = request.node_id
    if not request.joined:
        return error_info(E.INVALID_ARGUMENT, f"unknown node id {node_id[:64]!r}")
    if not is_plain_name(node_id) or len(node_id) > 64:
        return error_info(
            E.INVALID_ARGUMENT, f"invalid node id ({node_id[:64]!r}; expected {NAME_RULE})"
        )
    for name, address in (("address", request.address), ("raft_address", request.raft_address)):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or len(address) > 256:
            return error_info(
                E.INVALID_ARGUMENT,
                f"invalid {name} of joining node {node_id} ({address[:64]!r}; expected "
                "host:port with a port 1..65535)",
            )
    grpc_endpoints = await _endpoints(request.address)
    raft_endpoints = await _endpoints(request.raft_address)
    for node in config.nodes:
        same = request.address == node.grpc_address or request.raft_address == node.raft_address
        if not same:
            same = bool(grpc_endpoints & await _endpoints(node.grpc_address)) or bool(
                raft_endpoints & await _endpoints(node.raft_address)
            )
        if same:
            return error_info(
                E.ALREADY_EXISTS,
                f"joining node {node_id} announces an address of node {node.id} (got grpc "
                f"{request.address!r}, raft {request.raft_address!r}; node {node.id} is at grpc "
                f"{node.grpc_address}, raft {node.raft_address}): its process {ID_IN_USE_MARK} "
                f"{node_id} (expected addresses of its own)",
            )
    return None
