"""The coordinator loop: runs on the Raft leader only.

- Heartbeats are held **in memory**; only changes are proposed: RegisterNode when a node
  appears, restarts or comes back, MarkNodeDown after ``node_timeout_ms`` of silence.
- A new leader first grants every node a full timeout (it has heard nobody yet) and
  proposes ``ExtendLeases`` so no holder loses a lease to the leader change.
- Leases whose deadline passed (by the leader's clock) are expired with ``ExpireLeases``;
  TOMBSTONE broadcasts are cleared after the retention.
- A node that heartbeats with ``draining`` (a planned stop, ``Node.handover``) is left out
  of the nodes the balancer may place on, so its pchannels move to the other replicas;
  the flag lives in memory only and ends with the next heartbeat without it.
- A node whose process started less than ``placement_warmup_ms`` ago (its heartbeat's
  incarnation) gets nothing from the balancer while another node can take it: a restarted
  node first catches up as a replica.
- **A node proves it can serve before it gets anything**: for each process (node id and
  incarnation) that heartbeats, the leader calls ``NodeManager.CollectStatus`` at the gRPC
  address the heartbeat announced; only when the process there answers with that node id
  and that Raft address, having applied the coordination state at least up to the
  revision the leader had when it first heard that process, is it *proven*. A node never
  registered before is registered only once proven; an unproven node gets no pchannel and
  no replica (what it already owns stays, as for a warming node). A joiner whose address
  turns out to be another node's, or a second process joining under an id a live process
  is joining under, is refused at its next heartbeat (``joiner_conflict``).
- WAL retention (``statemachine.retention.plan_retention``, every
  ``wal_retention_check_ms``, and at once when a node's heartbeat says a disk of it went
  past its soft watermark): ``DeleteSegmentsBefore`` per pchannel whose committed
  segments are past the age or size limit, cut by what readers still hold.
- A restore handed to this node (``<data_dir>/restore.snapshot``, see
  ``raftwal.node.backup``) is proposed as ``RestoreState`` once this node leads; the
  file is then moved aside (``.done``, or ``.refused`` when the cluster was not fresh).
- The balancer (``statemachine.balancer.plan``) is asked for moves; each accepted
  ``AssignPChannel`` is followed by ``NodeManager.Assign`` on the new owner, and ASSIGNING
  pchannels are re-sent to their owner until they are ready; one stuck for longer than
  ``assign_timeout_ms`` is reassigned with a new term. Replica repair: a node DOWN for
  ``replica_replace_after_ms`` (counted by this leader) is replaced in replica sets, and
  short sets are widened (``statemachine.balancer``, rule 3).

Every proposal is bounded by the propose timeout; failures are logged and retried on the
next tick, never in a tight loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from raftwal.node.backup import BackupError, finish_restore, pending_restore
from raftwal.node.config import ClusterConfig, NodeConfig
from raftwal.services.cluster import ID_IN_USE_MARK
from rpc.errors import RaftwalError, from_rpc_error
from rpc.placement import address_for
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from statemachine.balancer import plan, plan_subscriptions
from statemachine.retention import RetentionPolicy, plan_retention
from wal_segments.owner import TICK_LOGICAL_BITS

log = logging.getLogger(__name__)
E = errors_pb2

CLEAR_BROADCASTS_EVERY_S = 10.0
# A suspected node (see record_heartbeat) is judged within this window after the report.
SUSPECT_WINDOW_S = 5.0
# How long the leader's own connection attempt to a suspected node may take (see
# _refuses_connections): a refusal comes back in one round trip.
PROBE_TIMEOUT_S = 1.0
# A suspected node whose port accepted the last probe is probed again after this long.
PROBE_EVERY_S = 0.5
# Broadcast delivery: appends in flight at once, and the retry backoff bounds.
MAX_BROADCAST_APPENDS_IN_FLIGHT = 16
BROADCAST_RETRY_MIN_S = 0.2
BROADCAST_RETRY_MAX_S = 30.0
BROADCAST_APPEND_TIMEOUT_S = 10.0
RESEND_ASSIGN_EVERY_S = 2.0
RESTORE_CHECK_EVERY_S = 1.0
# A coordinator tick this much later than due means the process was frozen or starved: it
# takes over afresh instead of judging the silence it sees (see `Coordinator.run`).
FROZEN_S = 1.0
# A node's proof (CollectStatus at its announced address): bound of one call, and how
# soon an unproven node is asked again.
PROOF_TIMEOUT_S = 2.0
PROOF_EVERY_S = 0.5


T = TypeVar("T")


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _CoordinatorMetrics(Protocol):
    @property
    def broadcast_delivery_failures(self) -> _Counter: ...


class CoordinatorHost(Protocol):
    """What the coordinator loop needs from its node (``Node`` implements it)."""

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def me(self) -> NodeConfig: ...

    @property
    def metrics(self) -> _CoordinatorMetrics: ...

    def is_leader(self) -> bool: ...

    def read(
        self, reader: Callable[[pb.CoordinationState], T], linearizable: bool
    ) -> Awaitable[tuple[T, int]]: ...

    def propose(self, command: pb.Command, forward: bool = ...) -> Awaitable[pb.CommandResult]: ...

    def channel(self, address: str) -> grpc.aio.Channel: ...


#: Fields of the coordination state the tick never reads: the request-id deduplication
#: window (up to 4,096 stored results). Copying the whole state every tick cost 1.9 ms
#: with a full window against 0.07 ms without it, on the thread that applies entries.
TICK_SKIPPED_FIELDS = frozenset({"recent_results", "recent_request_ids", "recent_cursor"})


def tick_view(state: pb.CoordinationState) -> pb.CoordinationState:
    """A copy of `state` for one coordinator tick, without `TICK_SKIPPED_FIELDS`."""
    copy = pb.CoordinationState()
    for field, value in state.ListFields():
        if field.name in TICK_SKIPPED_FIELDS:
            continue
        if field.is_repeated or field.message_type is not None:
            getattr(copy, field.name).MergeFrom(value)
        else:
            setattr(copy, field.name, value)
    return copy


@dataclass
class _Heartbeat:
    address: str
    incarnation: int
    seen_at: float  # time.monotonic()
    raft_address: str = ""
    # The sender was started with --join (it may bring back a removed node id).
    joined: bool = False
    # Its data workers' gRPC addresses (empty until they are all up).
    worker_addresses: tuple[str, ...] = ()


#: The most data worker addresses a heartbeat's registration takes
#: (statemachine.types.Limits.max_data_workers).
MAX_WORKER_ADDRESSES = 256


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None
    return host, int(port)


async def collect_status(node: CoordinatorHost, address: str) -> api.CollectStatusResponse:
    """What the process at gRPC `address` says of itself (NodeManager.CollectStatus)."""
    stub = coordinator_pb2_grpc.NodeManagerStub(node.channel(address))
    return await stub.CollectStatus(api.CollectStatusRequest(), timeout=PROOF_TIMEOUT_S)


async def refuses_connections(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True when nothing listens at `address` (the connection is refused): the node's
    process is gone. A process that is alive but slow, starved or stopped still has its
    listening socket, whose connections the kernel accepts; an unreachable host times
    out. Neither of those is a refusal."""
    target = _host_port(address)
    if target is None:
        return False
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*target), timeout_s)
    except ConnectionRefusedError:
        return True
    except (TimeoutError, OSError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


class Coordinator:
    def __init__(self, node: CoordinatorHost) -> None:
        self._node = node
        self._heartbeats: dict[str, _Heartbeat] = {}
        self._leading_since: float | None = None
        self._assigning_since: dict[tuple[str, int], float] = {}
        self._assign_sent: dict[tuple[str, int], float] = {}
        self._last_clear = 0.0
        self._last_retention = 0.0
        self._last_restore_check = 0.0
        self._background: set[asyncio.Task[bool]] = set()
        self.failures = 0
        # node id -> when a peer reported its streams broke (a crash): such a node is
        # marked DOWN once its own heartbeats are late and its gRPC port refuses this
        # leader's connection, not after the full node_timeout (see _suspect_confirmed).
        self._suspected: dict[str, float] = {}
        # node id -> when the leader's own probe found its gRPC port refusing connections.
        self._refused_at: dict[str, float] = {}
        self._probing: set[str] = set()
        self._probed_at: dict[str, float] = {}
        # Broadcast delivery, per (broadcast id, vchannel): in flight, next retry time,
        # failed attempts and the last error (shown by ClusterStatus on the leader).
        self._broadcast_inflight: set[tuple[int, str]] = set()
        self._broadcast_retry_at: dict[tuple[int, str], float] = {}
        self.broadcast_failures: dict[tuple[int, str], tuple[int, str]] = {}
        self._broadcast_tasks: set[asyncio.Task[None]] = set()
        # Nodes handing over before a planned stop (HeartbeatRequest.draining).
        self.draining: set[str] = set()
        # Nodes past their soft disk watermark (HeartbeatRequest.disk_pressure).
        self.disk_pressure: set[str] = set()
        # node id -> since when (time.monotonic()) this leader has seen it DOWN: replica
        # repair replaces it after replica_replace_after_ms. A new leader starts counting
        # afresh, which only delays a repair.
        self._down_since: dict[str, float] = {}
        # Proofs (see the module doc): node id -> the incarnation proven; (node id,
        # incarnation) -> the revision it must have applied; node id -> when last asked,
        # and why its last proof failed; the proofs in flight.
        self._proven: dict[str, int] = {}
        self._proof_revision: dict[tuple[str, int], int] = {}
        self._proof_at: dict[str, float] = {}
        self.proof_problems: dict[str, str] = {}
        # (node id, incarnation) -> why its announced address is not its own
        self._not_its_address: dict[tuple[str, int], str] = {}
        self._proof_tasks: set[asyncio.Task[None]] = set()

    def _send_assign(self, address: str, pchannel: str, term: int) -> None:
        # Bounded by call_assign's deadline; the set keeps the task referenced until done.
        task = asyncio.create_task(call_assign(self._node, address, pchannel, term))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def record_heartbeat(self, request: api.HeartbeatRequest) -> None:
        now = time.monotonic()
        self._heartbeats[request.node_id] = _Heartbeat(
            address=request.address,
            incarnation=request.incarnation,
            seen_at=now,
            raft_address=request.raft_address,
            joined=request.joined,
            worker_addresses=tuple(request.worker_addresses[:MAX_WORKER_ADDRESSES]),
        )
        for node_id in request.suspect_node_ids[:16]:
            self._suspected[node_id] = now
        if request.draining:
            if request.node_id not in self.draining:
                log.info("node %s is handing over: moving its pchannels", request.node_id)
            self.draining.add(request.node_id)
        else:
            self.draining.discard(request.node_id)
        if request.disk_pressure and request.node_id not in self.disk_pressure:
            # A disk past its soft mark: WAL retention runs at the next tick, not at its
            # next wal_retention_check_ms (then at its own pace while the pressure lasts).
            log.warning(
                "node %s is past its soft disk watermark: running retention now", request.node_id
            )
            self._last_retention = float("-inf")
        if request.disk_pressure:
            self.disk_pressure.add(request.node_id)
        else:
            self.disk_pressure.discard(request.node_id)

    def forget(self, node_id: str) -> None:
        """`node_id` was removed (RemoveNode): drop what this leader heard from it, so
        that its last heartbeat does not propose registering it again."""
        self._heartbeats.pop(node_id, None)
        self.draining.discard(node_id)
        self._down_since.pop(node_id, None)
        self._proven.pop(node_id, None)

    def joiner_conflict(self, request: api.HeartbeatRequest) -> str | None:
        """Why a heartbeat from a joining node (an id not registered yet) must be refused
        and its process stop, or None: another live process heartbeats under that id from
        other addresses (the first one heard keeps it), or this leader's proof found that
        the announced gRPC address answers as another node."""
        theirs = self._heartbeats.get(request.node_id)
        timeout_s = self._node.config.node_timeout_ms / 1000
        if (
            theirs is not None
            and theirs.address
            and theirs.incarnation != request.incarnation
            and (theirs.address, theirs.raft_address) != (request.address, request.raft_address)
            and time.monotonic() - theirs.seen_at <= timeout_s
        ):
            return (
                f"node {request.node_id} is being joined by another process at grpc "
                f"{theirs.address}, raft {theirs.raft_address}: the process at grpc "
                f"{request.address}, raft {request.raft_address} {ID_IN_USE_MARK} "
                f"{request.node_id} (expected one process per node id)"
            )
        return self._not_its_address.get((request.node_id, request.incarnation))

    def _proven_now(self, node_id: str) -> bool:
        """This leader has proven the process that heartbeats as `node_id` now."""
        if node_id == self._node.me.id:
            return True
        beat = self._heartbeats.get(node_id)
        return beat is not None and self._proven.get(node_id) == beat.incarnation

    def _prove_soon(self, node_id: str, revision: int, now: float) -> None:
        """Start a proof of the process heartbeating as `node_id` (see the module doc)
        unless one runs or ran within PROOF_EVERY_S."""
        beat = self._heartbeats.get(node_id)
        if beat is None or not beat.address or self._proven_now(node_id):
            return
        if now - self._proof_at.get(node_id, -1e9) < PROOF_EVERY_S:
            return
        self._proof_at[node_id] = now
        wanted = self._proof_revision.setdefault((node_id, beat.incarnation), revision)
        task = asyncio.create_task(self._prove(node_id, beat, wanted))
        self._proof_tasks.add(task)
        task.add_done_callback(self._proof_tasks.discard)

    async def _prove(self, node_id: str, beat: _Heartbeat, revision: int) -> None:
        try:
            reply = await collect_status(self._node, beat.address)
        except (grpc.aio.AioRpcError, OSError, ValueError) as error:
            code = error.code().name if isinstance(error, grpc.aio.AioRpcError) else error
            self.proof_problems[node_id] = (
                f"its gRPC address {beat.address} did not answer ({code})"
            )
            return
        member = reply.member
        if reply.node_id != node_id:
            why = (
                f"joining node {node_id} announces grpc {beat.address}, where node "
                f"{reply.node_id} answers: the process announcing it {ID_IN_USE_MARK} "
                f"{node_id} (expected an address of its own)"
            )
            self._not_its_address[(node_id, beat.incarnation)] = why
            self.proof_problems[node_id] = why
            log.warning("%s", why)
        elif beat.raft_address and member.raft_address != beat.raft_address:
            self.proof_problems[node_id] = (
                f"the process at {beat.address} announces raft {member.raft_address}, "
                f"its heartbeat raft {beat.raft_address}"
            )
        elif member.revision < revision:
            self.proof_problems[node_id] = (
                f"not caught up: applied revision {member.revision} of {revision}"
            )
        else:
            self._proven[node_id] = beat.incarnation
            self.proof_problems.pop(node_id, None)
            log.info(
                "node %s (process started at %d ms) proved it can serve", node_id, beat.incarnation
            )

    def replaceable(self, state: pb.CoordinationState, now: float) -> list[str]:
        """Nodes DOWN for longer than replica_replace_after_ms (none when it is 0)."""
        for node_id, info in state.nodes.items():
            if info.state == pb.NODE_STATE_DOWN:
                self._down_since.setdefault(node_id, now)
            else:
                self._down_since.pop(node_id, None)
        for node_id in [n for n in self._down_since if n not in state.nodes]:
            del self._down_since[node_id]
        after_ms = self._node.config.replica_replace_after_ms
        if after_ms <= 0:
            return []
        return sorted(n for n, since in self._down_since.items() if now - since >= after_ms / 1000)

    @staticmethod
    def _plan(
        state: pb.CoordinationState,
        live: list[str],
        settled: list[str],
        stuck: list[str],
        replace: Sequence[str] = (),
        placeable: Sequence[str] | None = None,
    ) -> list[pb.Command]:
        """The balancer's moves. Moves go to settled nodes only (not warming up) while there
        are any; a pchannel's first placement may use every placeable live node (default:
        all; the coordinator passes the proven ones), so that a cluster whose nodes started
        a moment apart does not put everything on the first one. A live node that is not
        settled keeps what it owns."""
        placeable = list(live) if placeable is None else list(placeable)
        if len(placeable) == len(live) and (not settled or len(settled) == len(live)):
            return plan(state, live, stuck_pchannels=stuck, replace_nodes=replace)

        def first_placement(command: pb.Command) -> bool:
            channel = state.pchannels.get(command.assign_pchannel.pchannel)
            return channel is not None and channel.term == 0

        def owned_by_warming(command: pb.Command) -> bool:
            # Planned over the settled nodes only, a warming owner looks dead to the
            # balancer; it is alive, so what it owns stays until it has settled (a stuck
            # ASSIGNING pchannel still moves).
            channel = state.pchannels.get(command.assign_pchannel.pchannel)
            return (
                channel is not None
                and channel.owner_node_id in warming
                and channel.name not in stuck
            )

        warming = set(live) - set(settled)
        initial = [c for c in plan(state, placeable, stuck_pchannels=stuck) if first_placement(c)]
        moves = [
            c
            for c in plan(state, settled, stuck_pchannels=stuck, replace_nodes=replace)
            if not first_placement(c) and not owned_by_warming(c)
        ]
        return initial + moves

    def _warming(self, node_id: str, wall_ms: int) -> bool:
        """The node's process started less than placement_warmup_ms ago."""
        beat = self._heartbeats.get(node_id)
        warmup_ms = self._node.config.placement_warmup_ms
        return beat is not None and wall_ms - beat.incarnation < warmup_ms

    def handover_targets(self, node_id: str) -> int:
        """Nodes other than `node_id` that pchannels can move to now: heard from within
        the node timeout and not draining themselves."""
        now = time.monotonic()
        timeout_s = self._node.config.node_timeout_ms / 1000
        return sum(
            1
            for other, beat in self._heartbeats.items()
            if other != node_id
            and other not in self.draining
            and beat.address
            and now - beat.seen_at <= timeout_s
        )

    def _suspect_grace_s(self) -> float:
        """How late a suspected node's heartbeat may be: a few intervals, never more than
        the node timeout."""
        config = self._node.config
        return min(config.node_timeout_ms, max(3 * config.heartbeat_interval_ms, 600)) / 1000

    def _suspect_confirmed(self, node_id: str, beat: _Heartbeat, address: str, now: float) -> bool:
        """A suspected node is DOWN before the node timeout only on evidence that its
        process is gone: its heartbeats are late by the grace AND its gRPC port refused
        this leader's connection since the suspicion. Broken streams and late heartbeats
        alone are what a starved or briefly stopped node shows too (a loaded host delays
        both by a second or two), and moving its pchannels then costs every writer a new
        term; such a node goes DOWN only after the full node timeout. The probe runs in
        the background; its answer counts from the next tick on."""
        suspected_at = self._suspected.get(node_id)
        grace = self._suspect_grace_s()
        if (
            suspected_at is None
            or now - suspected_at >= SUSPECT_WINDOW_S
            or now - beat.seen_at <= grace
            or self._leading_since is None
            or now - self._leading_since <= grace
        ):
            return False
        if self._refused_at.get(node_id, -1e9) >= suspected_at:
            return True
        target = beat.address or address
        if (
            target
            and node_id not in self._probing
            and now - self._probed_at.get(node_id, -1e9) >= PROBE_EVERY_S
        ):
            self._probing.add(node_id)
            self._probed_at[node_id] = now
            task = asyncio.create_task(self._probe(node_id, target))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return False

    async def _probe(self, node_id: str, address: str) -> bool:
        try:
            refused = await refuses_connections(address)
        finally:
            self._probing.discard(node_id)
        if refused:
            self._refused_at[node_id] = time.monotonic()
        else:
            log.debug("node %s is suspected but accepts connections: not DOWN yet", node_id)
        return refused

    async def run(self) -> None:
        interval = self._node.config.coordinator_tick_ms / 1000
        woke_at = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            late_s = time.monotonic() - woke_at - interval
            woke_at = time.monotonic()
            if not self._node.is_leader():
                self._leading_since = None
                continue
            if late_s > FROZEN_S and self._leading_since is not None:
                # This process was frozen (SIGSTOP, a VM pause, a starved host): the
                # silence it sees now is its own, and the heartbeats sent meanwhile are
                # still unread. Judge nobody on it: start over as a new leader does,
                # every node getting a full timeout from now.
                log.warning(
                    "node %s: coordinator woke %.1f s late; taking over afresh",
                    self._node.me.id,
                    late_s,
                )
                self._leading_since = None
            try:
                if self._leading_since is None:
                    await self._take_over()
                await self.tick()
            except RaftwalError as error:
                # Lost leadership mid-tick or a proposal timed out: try again next tick.
                self.failures += 1
                log.info("coordinator tick failed: %s", error)
            woke_at = time.monotonic()

    async def _propose(self, **body: object) -> pb.CommandResult:
        # Never forwarded: the coordinator's commands rest on what this node saw as leader
        # (heartbeats, plans). A node that lost the leadership without noticing yet (it
        # was frozen) gets NOT_LEADER, and a leader deposed with the command in its log
        # never commits it; forwarded, the new leader would apply a stale verdict.
        result = await self._node.propose(pb.Command(**body), forward=False)  # type: ignore[arg-type]
        if result.rejection.code != E.OK:
            log.info("coordinator command %s rejected: %s", list(body), result.rejection.message)
        return result

    async def _take_over(self) -> None:
        now = time.monotonic()
        node_ids, _ = await self._node.read(lambda s: sorted(s.nodes), linearizable=True)
        # Everyone gets a full timeout from now: silence before we led is not evidence.
        # Nor is a heartbeat from before we led evidence of life (a node that handed its
        # pchannels and then this leadership over has stopped since): nobody counts as
        # live for placement until it heartbeats to this leader.
        for node_id in node_ids:
            beat = self._heartbeats.get(node_id)
            if beat is None or node_id != self._node.me.id:
                self._heartbeats[node_id] = _Heartbeat(address="", incarnation=0, seen_at=now)
            else:
                beat.seen_at = max(beat.seen_at, now)
        self.draining.clear()
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

        state, _ = await node.read(tick_view, linearizable=False)

        # 1. Liveness: register what appeared or restarted, mark down what went silent.
        for node_id, beat in sorted(self._heartbeats.items()):
            if not beat.address or now - beat.seen_at > timeout_s:
                continue
            known = state.nodes.get(node_id)
            if known is None and not self._proven_now(node_id):
                # A node never registered: only once it proved it is what it announces.
                self._prove_soon(node_id, state.revision, now)
                continue
            # A node's data workers are announced once they are all up; until then (a
            # node starting) the registered ones stay, since they may still serve.
            workers = beat.worker_addresses or (
                tuple(known.worker_addresses) if known is not None else ()
            )
            if (
                known is None
                or known.address != beat.address
                or known.raft_address != beat.raft_address
                or tuple(known.worker_addresses) != workers
                or known.state != pb.NODE_STATE_UP
            ):
                await self._propose(
                    register_node=pb.RegisterNode(
                        node_id=node_id,
                        address=beat.address,
                        raft_address=beat.raft_address,
                        joined_incarnation_ms=beat.incarnation if beat.joined else 0,
                        worker_addresses=workers,
                    )
                )
        for node_id in sorted(state.nodes):
            if state.nodes[node_id].state != pb.NODE_STATE_UP:
                continue
            beat = self._heartbeats.get(node_id)
            if beat is None:
                self._heartbeats[node_id] = _Heartbeat(address="", incarnation=0, seen_at=now)
            elif now - beat.seen_at > timeout_s or self._suspect_confirmed(
                node_id, beat, state.nodes[node_id].address, now
            ):
                log.warning(
                    "node %s silent for %.1f s: marking it DOWN", node_id, now - beat.seen_at
                )
                await self._propose(mark_node_down=pb.MarkNodeDown(node_id=node_id))
                # Only a heartbeat after this one registers it again (and counts it live):
                # the last one, before it went silent, must not undo the verdict.
                self._heartbeats[node_id] = _Heartbeat(
                    address="", incarnation=0, seen_at=beat.seen_at
                )
                self._suspected.pop(node_id, None)
                self._refused_at.pop(node_id, None)

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

        if now - self._last_restore_check > RESTORE_CHECK_EVERY_S:
            self._last_restore_check = now
            await self._restore_if_handed(state)
        if now - self._last_retention > config.wal_retention_check_ms / 1000:
            self._last_retention = now
            await self._apply_retention(state, wall_ms)

        # 3. Placement.
        live = [
            node_id
            for node_id, beat in self._heartbeats.items()
            if beat.address and now - beat.seen_at <= timeout_s and node_id not in self.draining
        ]
        # Only proven nodes get anything; an unproven one keeps what it owns (as a warming
        # one does) while its proof runs.
        proven = []
        for node_id in live:
            if self._proven_now(node_id):
                proven.append(node_id)
            else:
                self._prove_soon(node_id, state.revision, now)
        settled = [n for n in proven if not self._warming(n, wall_ms)]
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
        # Right after taking over, a node not heard yet is not evidence of a dead one:
        # place nothing until every UP node has heartbeated here or a few intervals passed
        # (placing on the nodes heard so far would move everything to them).
        settle_s = 3 * config.heartbeat_interval_ms / 1000
        settling = (
            self._leading_since is not None
            and now - self._leading_since < settle_s
            and any(
                not self._heartbeats.get(node_id, _Heartbeat("", 0, 0.0)).address
                for node_id, info in state.nodes.items()
                if info.state == pb.NODE_STATE_UP
            )
        )
        replace = self.replaceable(state, now)
        for command in [] if settling else self._plan(state, live, settled, stuck, replace, proven):
            assign = command.assign_pchannel
            result = await self._propose(assign_pchannel=assign)
            if result.rejection.code == E.OK:
                moved.add(assign.pchannel)
                self._assign_sent[(assign.pchannel, assign.term)] = now
                address = state.nodes[assign.node_id].address
                self._send_assign(address, assign.pchannel, assign.term)
        # 4. Subscription members: split each subscription's vchannels among live members
        # (a rejection means the state moved on under the plan; the next round replans).
        for command in plan_subscriptions(state):
            kind = command.WhichOneof("body")
            await self._propose(**{kind: getattr(command, kind)})
        self._drive_broadcasts(state, now)
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

    async def _restore_if_handed(self, state: pb.CoordinationState) -> None:
        data_dir = self._node.me.data_dir
        try:
            backup = await asyncio.to_thread(pending_restore, data_dir)
        except BackupError as error:
            log.error("restore file refused: %s", error)
            await asyncio.to_thread(finish_restore, data_dir, "refused")
            return
        if backup is None:
            return
        try:
            result = await self._propose(
                restore_state=pb.RestoreState(state=backup.state, state_digest=backup.state_digest)
            )
        except RaftwalError as error:
            # Caught here so that the coordinator's other work goes on. Too large for one
            # Raft command: refused for good; anything else (no quorum yet): next check.
            log.error("restore at revision %d failed: %s", backup.revision, error)
            if error.code == E.INVALID_ARGUMENT:
                await asyncio.to_thread(finish_restore, data_dir, "refused")
            return
        code = result.rejection.code
        if code == E.OK:
            log.warning(
                "coordination state restored at revision %d (digest %s)",
                backup.revision,
                backup.state_digest[:16],
            )
            outcome = "done"
        elif code == E.ALREADY_EXISTS and state.revision >= backup.revision:
            outcome = "done"  # restored already (from another node's copy of the file)
        else:
            log.error("restore refused: %s", result.rejection.message)
            outcome = "refused"
        await asyncio.to_thread(finish_restore, data_dir, outcome)

    async def _apply_retention(self, state: pb.CoordinationState, wall_ms: int) -> None:
        config = self._node.config
        policy = RetentionPolicy(
            retention_ms=config.wal_retention_ms,
            retention_bytes=config.wal_retention_bytes,
            tick_logical_bits=TICK_LOGICAL_BITS,
        )
        for command in plan_retention(state, wall_ms, policy):
            result = await self._propose(delete_segments_before=command)
            if result.rejection.code == E.OK:
                log.info("retention: %s below lsn %d", command.pchannel, command.before_lsn)

    # -- broadcast delivery ------------------------------------------------------------

    def _drive_broadcasts(self, state: pb.CoordinationState, now: float) -> None:
        """Append every PENDING broadcast to each target vchannel not yet appended, through
        the owner of its pchannel (idempotent there per (broadcast, vchannel)), then record
        the position in Raft. Retries back off exponentially per target, bounded; failures
        are counted and shown in ClusterStatus."""
        live = {key for key in self._broadcast_retry_at if key[0] in state.broadcasts}
        for key in list(self._broadcast_retry_at):
            if key not in live:
                self._broadcast_retry_at.pop(key, None)
                self.broadcast_failures.pop(key, None)
        for task_id in sorted(state.broadcasts):
            task = state.broadcasts[task_id]
            if task.state != pb.BROADCAST_STATE_PENDING:
                continue
            for target in task.vchannels:
                key = (task_id, target.vchannel)
                if target.appended or key in self._broadcast_inflight:
                    continue
                if len(self._broadcast_inflight) >= MAX_BROADCAST_APPENDS_IN_FLIGHT:
                    return
                if now < self._broadcast_retry_at.get(key, 0.0):
                    continue
                vchannel = state.vchannels.get(target.vchannel)
                channel = state.pchannels.get(vchannel.pchannel) if vchannel else None
                if (
                    vchannel is None
                    or channel is None
                    or channel.state != pb.PCHANNEL_STATE_ASSIGNED
                ):
                    self._broadcast_failed(key, "vchannel missing or its pchannel not ready", now)
                    continue
                owner = state.nodes.get(channel.owner_node_id)
                if owner is None:
                    continue
                request = wire.AppendBroadcastRequest(
                    pchannel=vchannel.pchannel,
                    vchannel=target.vchannel,
                    broadcast_id=task_id,
                    msg_type=task.msg_type,
                    message=task.message,
                )
                self._broadcast_inflight.add(key)
                # To the owner's data worker for the pchannel (rpc.placement).
                address = address_for(owner.address, owner.worker_addresses, vchannel.pchannel)
                work = asyncio.create_task(self._append_broadcast(key, address, request))
                self._broadcast_tasks.add(work)
                work.add_done_callback(self._broadcast_tasks.discard)

    def _broadcast_failed(self, key: tuple[int, str], error: str, now: float) -> None:
        self._node.metrics.broadcast_delivery_failures.inc()
        count = self.broadcast_failures.get(key, (0, ""))[0] + 1
        self.broadcast_failures[key] = (count, error[:200])
        delay = min(BROADCAST_RETRY_MAX_S, BROADCAST_RETRY_MIN_S * 2 ** min(count, 10))
        self._broadcast_retry_at[key] = now + delay
        if count in (3, 10) or count % 50 == 0:
            log.warning("broadcast %d to %s failed %d times: %s", key[0], key[1], count, error)

    async def _append_broadcast(
        self, key: tuple[int, str], address: str, request: wire.AppendBroadcastRequest
    ) -> None:
        try:
            stub = streaming_pb2_grpc.ReplicationStub(self._node.channel(address))
            reply = await stub.AppendBroadcast(request, timeout=BROADCAST_APPEND_TIMEOUT_S)
            result = await self._propose(
                record_broadcast_appended=pb.RecordBroadcastAppended(
                    broadcast_id=request.broadcast_id,
                    vchannel=request.vchannel,
                    lsn=reply.position.lsn,
                    time_tick=reply.position.time_tick,
                )
            )
            if result.rejection.code not in (E.OK, E.IGNORED_OPERATION):
                self._broadcast_failed(key, result.rejection.message, time.monotonic())
            else:
                self.broadcast_failures.pop(key, None)
                self._broadcast_retry_at.pop(key, None)
        except grpc.aio.AioRpcError as error:
            self._broadcast_failed(key, from_rpc_error(error).message, time.monotonic())
        except RaftwalError as error:
            self._broadcast_failed(key, error.info.message, time.monotonic())
        finally:
            self._broadcast_inflight.discard(key)


async def call_assign(node: CoordinatorHost, address: str, pchannel: str, term: int) -> bool:
    stub = coordinator_pb2_grpc.NodeManagerStub(node.channel(address))
    try:
        reply = await stub.Assign(api.AssignRequest(pchannel=pchannel, term=term), timeout=2.0)
        return reply.accepted
    except grpc.aio.AioRpcError as error:
        log.info("Assign(%s, %d) to %s failed: %s", pchannel, term, address, error.code())
        return False
