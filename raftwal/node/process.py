"""One raftwal node = one process: the composition root.

``Node`` wires the Raft peer (``raft.peer.RaftPeer``) to the coordination replica
(``raft.replica.CoordinationReplica``), serves the gRPC services (Coordinator, NodeManager,
Cluster, health, reflection) on ``grpc_port``, heartbeats the Raft leader, runs the
coordinator loop while it leads, and serves Prometheus metrics on ``metrics_port`` when one
is configured (``raftwal.node.metrics``). It implements ``raftwal.services.coordinator.
CoordinationBackend`` for the public servicer:

- ``propose`` stamps the request id and the proposer's wall time, proposes through the
  local peer when it leads and otherwise forwards the command bytes to the leader's
  ``Cluster.Propose`` (a client never needs to know who leads); NOT_LEADER is answered only
  while no leader is known.
- a planned stop (SIGTERM or SIGINT) first hands over (``handover``): the node heartbeats
  as draining, so the coordinator moves the pchannels it owns to other replicas (each new
  owner fences and recovers the tail), waits until every one is ASSIGNED elsewhere, then
  transfers its Raft leadership to a caught-up follower, all within
  ``handover_timeout_ms``; only then does it stop serving. A second signal stops it at
  once. Producers see NOT_OWNER / CHANNEL_FENCED answers and resend their unacknowledged
  batches, with the same sequences, to the new owners.
- ``propose_batch`` proposes several commands as one Raft entry (``Coordinator.
  BatchWrite``), forwarded as a whole (``Cluster.ProposeBatch``) from a follower;
- linearizable reads use ReadIndex, with no log entry: the leader confirms its leadership
  with one heartbeat round (``RaftPeer.read_index``); a follower asks the leader for that
  index (``Cluster.ReadIndex``) and answers once it has applied it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raft.errors import (
    ChangeRefused,
    LeadershipUnconfirmed,
    NotLeader,
    Overloaded,
    PeerClosed,
    UnknownOutcome,
)
from raft.events import Compacted
from raft.peer import RaftPeer, RaftTuning, loop_mailbox
from raft.replica import CoordinationReplica
from raftwal.node import faults
from raftwal.node.config import (
    ClusterConfig,
    NodeConfig,
    check_transport_security,
    raft_connection_timeout_ms,
)
from raftwal.node.console import ConsoleFeed, ConsoleRoutes
from raftwal.node.coordinator import Coordinator
from raftwal.node.data_plane import GrpcReplicaTransport, NodeDataView, reconcile_loop
from raftwal.node.health import under_replicated
from raftwal.node.membership import (
    MAX_PROMOTION_LAG_ENTRIES,
    load_role,
    store_role,
    wanted_role,
)
from raftwal.node.metrics import NodeMetrics
from raftwal.node.proposals import ProposalBatcher
from raftwal.node.replicator import Replicators
from raftwal.node.security import NodeSecurity
from raftwal.services.callers import identity_name
from raftwal.services.cluster import REMOVED_MARK, ClusterServicer
from raftwal.services.consume_wire import add_streaming_node_servicer
from raftwal.services.coordinator import CompactedHistory, CoordinatorServicer
from raftwal.services.decoding import DecodeInterceptor
from raftwal.services.grpc_metrics import GrpcMetricsInterceptor
from raftwal.services.node_manager import NodeManagerServicer
from raftwal.services.replication import ReplicationServicer
from raftwal.services.segment_transfer import SegmentTransfers
from raftwal.services.stream_caps import StreamCapInterceptor, StreamCaps
from raftwal.services.streaming_node import StreamingNodeServicer
from rpc.aio import wait_event
from rpc.errors import RaftwalError, error_info, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2, streaming_pb2_grpc
from rpc.segment_transfer import client_tls
from statemachine.replicate import mismatch_warning, replicated_pairs
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.owner import ChannelOwner, OwnerConfig
from wal_segments.plane import DataPlane

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

MAX_COMMAND_BYTES = 2 * 1024 * 1024
# Forwarded proposal calls a follower keeps in flight to the leader at once.
FORWARDS_IN_FLIGHT = 4
# A suspicion (HeartbeatRequest.suspect_node_ids) is repeated this long.
SUSPECT_KEEP_S = 3.0
# The stall watch ticks this often; a tick this much later than due means the process
# itself was frozen (SIGSTOP, a VM pause, a starved CPU): for SUSPECT_KEEP_S after that it
# suspects no peer, whose streams may well have ended because of its own silence.
STALL_TICK_S = 0.1
STALL_S = 1.0
# How long a follower waits for the leader to confirm a read index it forwarded.
FORWARDED_READ_INDEX_S = 2.0

SERVICE_NAMES = (
    api.DESCRIPTOR.services_by_name["Coordinator"].full_name,
    api.DESCRIPTOR.services_by_name["NodeManager"].full_name,
    api.DESCRIPTOR.services_by_name["Cluster"].full_name,
    streaming_pb2.DESCRIPTOR.services_by_name["StreamingNode"].full_name,
    streaming_pb2.DESCRIPTOR.services_by_name["Replication"].full_name,
)


def now_ms() -> int:
    return int(time.time() * 1000)


# How long a stopping node waits for the server's cancelled handlers to finish.
STOP_HANDLERS_WAIT_S = 2.0
# A handover gives up waiting for its pchannels to move once the leader has reported no
# other node to move them to for this long (the whole cluster is stopping), or once no
# majority of the voters has been in reach for this long (the others stopped first, so no
# leader is left to report). Two heartbeat intervals (300 ms): a leader that just took over
# has heard nobody yet.
HANDOVER_NO_TARGET_S = 0.6
# The share of handover_timeout_ms kept for the leadership transfer (at most 2 s of it).
HANDOVER_LEADERSHIP_SHARE = 0.2
HANDOVER_LEADERSHIP_MAX_S = 2.0
# How often the leadership transfer is polled and retried (a follower not caught up yet
# is refused by pysyncobj; a moment later it usually is).
HANDOVER_POLL_S = 0.05


class AppliedNotifier:
    """asyncio view of the replica's progress: who waits for the next applied command."""

    def __init__(self) -> None:
        self.revision = 0
        self.raft_index = 0
        self._changed = asyncio.Event()

    def advance(self, revision: int, raft_index: int) -> None:
        self.revision = max(self.revision, revision)
        self.raft_index = max(self.raft_index, raft_index)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_change(self, timeout_s: float) -> None:
        await wait_event(self._changed, timeout_s)

    async def wait_index(self, raft_index: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.raft_index < raft_index:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self.wait_change(remaining)
        return True


class _ReplicatorHost:
    """The node as `Replicators` sees it (raftwal.node.replicator.ReplicatorHost)."""

    def __init__(self, node: Node) -> None:
        self._node = node

    @property
    def cluster_id(self) -> str:
        return self._node.cluster_id

    def replicate_configuration(self) -> pb.ReplicateConfiguration:
        def reader(state: pb.CoordinationState) -> pb.ReplicateConfiguration:
            copy = pb.ReplicateConfiguration()
            copy.CopyFrom(state.replicate_configuration)
            return copy

        return self._node.replica.read(reader)  # type: ignore[no-any-return]

    def serving_owner(self, pchannel: str):  # type: ignore[no-untyped-def]
        return self._node.plane.owner(pchannel)

    def view(self):  # type: ignore[no-untyped-def]
        self._node.data_view.refresh()
        return self._node.data_view.view

    async def record_checkpoint(
        self,
        pchannel: str,
        target_cluster_id: str,
        lsn: int,
        drained_through_lsn: int = 0,
        target_claims_lsn: int = 0,
    ) -> None:
        command = pb.Command(
            record_replicate_checkpoint=pb.RecordReplicateCheckpoint(
                pchannel=pchannel,
                target_cluster_id=target_cluster_id,
                source_lsn=lsn,
                drained_through_lsn=drained_through_lsn,
                target_claims_lsn=target_claims_lsn,
            )
        )
        result = await self._node.propose(command)
        if result.rejection.code != E.OK:
            raise RaftwalError(result.rejection)


def _announced_nodes(
    state: pb.CoordinationState,
) -> tuple[tuple[tuple[str, str, str], ...], tuple[str, ...]]:
    """(id, gRPC address, Raft address) of every node the state has both addresses of,
    and the ids of the nodes `raftwal member remove` forgot."""
    return (
        tuple(
            (node_id, node.address, node.raft_address)
            for node_id, node in sorted(state.nodes.items())
            if node.address and node.raft_address
        ),
        tuple(sorted(state.removed_nodes)),
    )


def _removed_node(state: pb.CoordinationState, node_id: str) -> pb.RemovedNode | None:
    if node_id not in state.removed_nodes:
        return None
    copy = pb.RemovedNode()
    copy.CopyFrom(state.removed_nodes[node_id])
    return copy


class Node:
    def __init__(self, config: ClusterConfig, node_id: str) -> None:
        # The config file's nodes; `config` adds those that joined since (see there).
        self._static_config = config
        self._config_view: tuple[
            tuple[tuple[tuple[str, str, str], ...], tuple[str, ...]], ClusterConfig
        ] = (((), ()), config)
        self.me: NodeConfig = config.node(node_id)
        check_transport_security(config, self.me)
        # TLS and bearer-token auth of the gRPC port, and the node's own client credentials.
        self.security = NodeSecurity.load(config, self.me)
        self.max_wait_ms = config.max_wait_ms
        self.cluster_id = config.cluster_id
        # Cross-cluster replication of the source pchannels this node owns.
        self.replicators = Replicators(_ReplicatorHost(self))
        self.incarnation = now_ms()
        data_dir = self.me.data_dir
        prepare_data_dir(data_dir)
        # The role this node runs in: the configured one until `raftwal member` changed it
        # (raftwal/node/membership.py). A switch restarts the process in the new role.
        self.role = load_role(data_dir, self.me.role)
        self.restart_requested = False
        # The leader refused this node's heartbeat: `raftwal member remove` forgot it.
        self.removed = False
        self.replica = CoordinationReplica(data_dir)
        self.metrics = NodeMetrics(self)
        # The web console on the metrics port (raftwal.node.console).
        self.console = ConsoleFeed()
        self.notifier = AppliedNotifier()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stopping = asyncio.Event()
        # Planned stop: the first SIGTERM/SIGINT asks for a handover, a second one aborts it.
        self._stop_requested = asyncio.Event()
        self._handover_abort = asyncio.Event()
        self.draining = False
        # The leader's answer to a draining heartbeat: other nodes pchannels can move to
        # (None: no answer yet), and since when it has been none.
        self._handover_targets: int | None = None
        self._no_target_since: float | None = None
        self.peer: RaftPeer | None = None
        self.coordinator = Coordinator(self)
        self.batcher = ProposalBatcher(self._propose_entry)
        # A follower groups the proposals it forwards the same way: the commands that arrive
        # while earlier forwards are in flight go to the leader as one Cluster.ProposeBatch
        # (one gRPC call on the GIL-bound leader for many clients).
        self.forwarder = ProposalBatcher(self._forward_entry, max_in_flight=FORWARDS_IN_FLIGHT)
        self._server: grpc.aio.Server | None = None
        self.segment_transfers: SegmentTransfers | None = None
        self.stream_caps = StreamCaps(
            self.config.max_node_streams, self.config.max_identity_streams
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.data_view = NodeDataView(self)
        # node id -> monotonic time it was suspected (see HeartbeatRequest.suspect_node_ids)
        self._suspects: dict[str, float] = {}
        # The stall watch's last tick, and when it last found this process frozen.
        self._alive_at = time.monotonic()
        self._stalled_at = -1e9
        self._heartbeat_now = asyncio.Event()
        # Last time (monotonic) this node knew a Raft leader; start counts as one.
        self._leader_seen_at = time.monotonic()
        self.plane = DataPlane(
            node_id=self.me.id,
            data_dir=data_dir,
            policy=parse_fsync_policy(config.wal_fsync_policy),
            owner_config=OwnerConfig(
                segment_max_bytes=config.segment_max_bytes,
                segment_max_age_ms=config.segment_max_age_ms,
            ),
            # Append streams over the peers' transfer ports (TLS as for gRPC), except to
            # peers dialled through another gRPC address and no transfer address (a
            # relay of gRPC only).
            transport=GrpcReplicaTransport(
                self,
                tls=client_tls(self.security.client),
                routed_node_ids=frozenset(dict(self.me.peer_grpc_addresses))
                - frozenset(dict(self.me.peer_transfer_addresses)),
            ),
            proposer=self.data_view,
            view=self.data_view,
            observer=self.metrics,
        )

    @property
    def config(self) -> ClusterConfig:
        """The cluster's nodes: those of the config file, and every node that joined
        without being in it (raftwal/node/join.py), at the gRPC and Raft addresses it
        announced in its heartbeats (registered in the replicated state); without the
        nodes `raftwal member remove` forgot (RemoveNode), except this node itself."""
        static = self._static_config
        replica = getattr(self, "replica", None)
        if replica is None:
            return static
        seen_state = replica.read(_announced_nodes)
        seen, view = self._config_view
        if seen_state == seen:
            return view
        announced, removed_ids = seen_state
        removed = set(removed_ids) - {self.me.id}
        known = {n.id for n in static.nodes}
        kept = tuple(n for n in static.nodes if n.id not in removed)
        added = []
        for node_id, address, raft_address in announced:
            if node_id in known:
                continue
            host, _, grpc_port = address.rpartition(":")
            _, _, raft_port = raft_address.rpartition(":")
            if not host or not grpc_port.isdigit() or not raft_port.isdigit():
                continue
            added.append(
                NodeConfig(
                    id=node_id,
                    host=host,
                    grpc_port=int(grpc_port),
                    raft_port=int(raft_port),
                    data_dir=Path("/nonexistent") / node_id,
                    role="data",
                )
            )
        view = (
            replace(static, nodes=kept + tuple(added))
            if added or len(kept) != len(static.nodes)
            else static
        )
        self._config_view = (seen_state, view)
        return view

    def removed_node(self, node_id: str) -> pb.RemovedNode | None:
        """The removal of `node_id` (RemoveNode) in the applied state; None when it was
        not removed (or rejoined since)."""
        return self.replica.read(lambda state: _removed_node(state, node_id))

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        loop = self._loop
        # Through the loop's mailbox: the applied notifier and the proposal outcomes of one
        # Raft tick wake the event loop once (raft.peer.LoopMailbox).
        mailbox = loop_mailbox(loop)
        self.replica.add_listener(
            lambda revision, index: mailbox.post(self.notifier.advance, revision, index)
        )
        # A data node follows the voters without voting; voters know only each other
        # (a data node connects to them, as pysyncobj's read-only node). The configured
        # voters are the first voter set; the Raft log and snapshots hold every change
        # since, and the peer replays them.
        # The config file's voters, never the replicated view: the journal's membership
        # changes are replayed onto exactly this first set.
        partners = [n.raft_address for n in self._static_config.voters if n.id != self.me.id]
        # A peer may be dialled elsewhere than at its own address (config peer_*_addresses,
        # e.g. the chaos suite's per-link proxies); its identity stays its own address.
        others = [n for n in self.config.nodes if n.id != self.me.id]
        dial = {n.raft_address: self.me.dial_raft_address(n) for n in others}
        self.peer = RaftPeer(
            self_address=self.me.raft_address,
            bind_address=f"{self.me.bind_host}:{self.me.raft_port}",
            partner_addresses=partners,
            data_dir=self.me.data_dir / "raft",
            apply=self.replica.apply,
            take_snapshot=self.replica.take_snapshot,
            restore_snapshot=self.replica.restore_snapshot,
            password=self.config.secret,
            tuning=RaftTuning(
                election_timeout_min_s=self.config.raft_min_timeout_ms / 1000,
                election_timeout_max_s=self.config.raft_max_timeout_ms / 1000,
                # Follows the election timeout (RaftTuning requires >= it).
                connection_timeout_s=raft_connection_timeout_ms(self.config) / 1000,
                leader_fallback_timeout_s=self.config.raft_leader_fallback_ms / 1000,
                lease_reads=self.config.raft_lease_reads,
                snapshot_every_entries=self.config.raft_snapshot_entries,
                # Room for the largest valid command (a broadcast of 1 MiB plus envelope).
                max_command_bytes=MAX_COMMAND_BYTES,
                max_append_entries_bytes=4 * MAX_COMMAND_BYTES,
            ),
            partner_dial_addresses={a: d for a, d in dial.items() if a != d},
            on_fatal=self._on_fatal,
            voter=self.role == "voter",
        )
        revision, index = self.replica.applied()
        self.notifier.advance(revision, index)
        options = [
            ("grpc.max_receive_message_length", self.config.grpc_max_message_bytes),
            ("grpc.max_send_message_length", self.config.grpc_max_message_bytes),
            ("grpc.so_reuseport", 0),
            # Clients may ping idle streams (watches, keep-alives) to notice a frozen node;
            # the server pings too, so half-open connections of vanished clients close.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
        ]
        # Authentication first (a refused call's request is never parsed), then decoding.
        interceptors = (
            # Outermost: every answer is counted, refusals included.
            GrpcMetricsInterceptor(
                lambda method, code: self.metrics.grpc_handled.labels(method, code).inc()
            ),
            *self.security.interceptors,
            DecodeInterceptor(),
            # Innermost: a call refused above takes no stream slot.
            StreamCapInterceptor(self.stream_caps),
        )
        server = grpc.aio.server(options=options, interceptors=interceptors)
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(self), server)
        coordinator_pb2_grpc.add_NodeManagerServicer_to_server(NodeManagerServicer(self), server)
        coordinator_pb2_grpc.add_ClusterServicer_to_server(ClusterServicer(self), server)
        # Sealed segments go to readers over the transfer port: by sendfile, with no copy
        # in this process, when gRPC is plaintext; over TLS with the gRPC port's files
        # when it is not.
        if self.me.transfer_port >= 0:
            transfers = SegmentTransfers(
                self.me.bind_host,
                self.me.transfer_port,
                self.security.transfer_tls,
                frame_budget_bytes=self.config.frame_buffer_budget_bytes,
            )
            await transfers.start()
            self.segment_transfers = transfers
        # Consume's replies are pre-built bytes (raftwal.services.consume_wire).
        streaming = StreamingNodeServicer(
            self,
            self.plane,
            self.data_view,
            self.segment_transfers,
            self.config.grpc_max_message_bytes,
        )
        add_streaming_node_servicer(streaming, server)
        replication = ReplicationServicer(
            self, self.plane, self.segment_transfers, self.config.grpc_max_message_bytes
        )
        if self.segment_transfers is not None:
            # Owners replicate to this node over the transfer port (rpc.append_stream).
            self.segment_transfers.serve_appends(replication.serve_append_connection)
            # Producers too (rpc.produce_stream).
            self.segment_transfers.serve_produces(streaming.serve_produce_connection)
        streaming_pb2_grpc.add_ReplicationServicer_to_server(replication, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        grpc_bind = self.me.bind_address(self.me.grpc_port)
        if self.security.server_credentials is not None:
            bound = server.add_secure_port(grpc_bind, self.security.server_credentials)
        else:
            bound = server.add_insecure_port(grpc_bind)
        if bound == 0:
            raise OSError(f"cannot listen on {grpc_bind}")
        await server.start()
        self._server = server
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._health = health_servicer
        if self.me.metrics_port:
            self.metrics.serve(
                self.me.bind_host,
                self.me.metrics_port,
                routes=ConsoleRoutes(self.console, self.security.tokens),
            )
        if self.segment_transfers is not None:
            log.info(
                "node %s serves segment transfers on %s:%d",
                self.me.id,
                self.me.host,
                self.segment_transfers.port,
            )
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._stall_watch(), name="stall-watch"),
            asyncio.create_task(self.coordinator.run(), name="coordinator"),
            asyncio.create_task(self._housekeeping_loop(), name="housekeeping"),
            asyncio.create_task(_trim_memory_loop(self._stopping), name="trim-memory"),
            asyncio.create_task(
                reconcile_loop(self, self.plane, self.data_view, self._stopping), name="reconcile"
            ),
            asyncio.create_task(self.replicators.run(self._stopping), name="replicators"),
        ]
        if self.me.metrics_port:
            self._tasks.append(
                asyncio.create_task(self.console.run(self, self._stopping), name="console")
            )
        log.info(
            "node %s serving gRPC on %s (%s), Raft on %s (pid %d)",
            self.me.id,
            self.me.grpc_address,
            self.security.summary,
            self.me.raft_address,
            os.getpid(),
        )

    def _on_fatal(self, error: Exception) -> None:
        # The peer stopped (fsync failure, apply bug, unsafe truncation): this process must
        # not serve anything more. Exit at once; a restart recovers from the durable journal.
        log.critical("node %s: fatal Raft error, exiting: %s", self.me.id, error)
        logging.shutdown()
        os._exit(70)

    async def run_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal)
        await self.start()
        # What exists now (modules, functions, protobuf descriptors, the recovered state)
        # lives as long as the process: keep it out of the cyclic GC's full collections.
        # Without this every full collection rescans those ~60k objects, and under load
        # (a full collection every few seconds) that paused the node 20-45 ms each time,
        # most of the p99 of produce at half load (BENCHMARKS.md, WAL data plane). Frozen
        # objects are still freed by reference counting; only a cycle among them would
        # never be collected.
        gc.collect()
        gc.freeze()
        await self._stop_requested.wait()
        if not self.removed:  # a forgotten node holds nothing and has no leader to ask
            await self.handover_or_abort()
        await self.stop()

    def _on_stop_signal(self) -> None:
        # An operator's stop wins over a pending role switch: stop, do not restart.
        self.restart_requested = False
        if self._stop_requested.is_set():
            log.warning("node %s: second stop signal, stopping without handover", self.me.id)
            self._handover_abort.set()
        self._stop_requested.set()

    async def handover_or_abort(self) -> None:
        """``handover``, cut short by a second stop signal; never longer than the handover
        timeout (plus a second for the last answers)."""
        if self._stopping.is_set() or self._handover_abort.is_set():
            return
        if len(self.config.nodes) < 2:
            return  # nobody to hand over to
        work = asyncio.create_task(self.handover(), name="handover")
        abort = asyncio.create_task(self._handover_abort.wait(), name="handover-abort")
        try:
            await asyncio.wait(
                {work, abort},
                timeout=self.config.handover_timeout_ms / 1000 + 1.0,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for task in (work, abort):
                task.cancel()
            for task in (work, abort):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if work.done() and not work.cancelled() and work.exception() is not None:
                log.error("node %s: handover failed: %r", self.me.id, work.exception())

    async def handover(self) -> bool:
        """Hand over before a planned stop (see the module docstring): move the pchannels
        this node owns to other nodes and wait until each is ASSIGNED there, then transfer
        the Raft leadership if this node leads. Bounded by ``handover_timeout_ms``; True
        when both finished in time. The node keeps serving throughout: replicas keep
        acknowledging, watches keep answering, and late batches on an owner that lost its
        pchannel are answered NOT_OWNER / CHANNEL_FENCED, so their producers resend them."""
        started = time.monotonic()
        timeout_s = self.config.handover_timeout_ms / 1000
        deadline = started + timeout_s
        leadership_s = min(HANDOVER_LEADERSHIP_MAX_S, timeout_s * HANDOVER_LEADERSHIP_SHARE)
        self.draining = True
        self._handover_targets = None
        self._no_target_since = None
        self._heartbeat_now.set()
        log.info("node %s handing over before it stops (within %.1f s)", self.me.id, timeout_s)
        moved = await self._hand_over_pchannels(deadline - leadership_s)
        moved_at = time.monotonic()
        led = self.is_leader()
        # With nobody to hand over to (the whole cluster is stopping), keep the leadership.
        nobody = self._handover_targets == 0 or (
            self.peer is not None and not self.peer.quorum_in_reach()
        )
        transferred = await self._hand_over_leadership(deadline) if led and not nobody else True
        log.info(
            "node %s handover %s: pchannels %s in %.3f s, leadership %s in %.3f s",
            self.me.id,
            "done" if moved and transferred else "incomplete",
            "moved" if moved else "NOT all moved",
            moved_at - started,
            ("transferred" if transferred and not nobody else "NOT transferred")
            if led
            else "not held",
            time.monotonic() - moved_at,
        )
        return moved and transferred

    def _pchannels_to_hand_over(self, watched: set[str]) -> list[str]:
        """Pchannels this node still owns, or that it owned (`watched`) and are not yet
        ASSIGNED to another node (read from the applied state)."""
        me = self.me.id

        def reader(state: pb.CoordinationState) -> list[str]:
            waiting = []
            for name, channel in state.pchannels.items():
                if channel.state == pb.PCHANNEL_STATE_DROPPED:
                    continue
                if channel.owner_node_id == me:
                    waiting.append(name)
                    watched.add(name)
                elif name in watched and channel.state != pb.PCHANNEL_STATE_ASSIGNED:
                    waiting.append(name)
            return sorted(waiting)

        return self.replica.read(reader)

    async def _hand_over_pchannels(self, deadline: float) -> bool:
        watched: set[str] = set(self.plane.serving_terms())
        no_quorum_since: float | None = None
        while True:
            waiting = self._pchannels_to_hand_over(watched)
            if not waiting and not self.plane.serving_terms():
                return True
            now = time.monotonic()
            # No majority of the voters in reach: no move can commit, and no leader is left
            # to report targets (the rest of the cluster stopped first).
            peer = self.peer
            if peer is not None and not peer.quorum_in_reach():
                no_quorum_since = now if no_quorum_since is None else no_quorum_since
                if now - no_quorum_since >= HANDOVER_NO_TARGET_S:
                    log.warning(
                        "node %s: no majority of the voters in reach; stopping without moving %s",
                        self.me.id,
                        ", ".join(waiting[:8]) or "its pchannels",
                    )
                    return False
            else:
                no_quorum_since = None
            if self._no_target_since is not None and now - self._no_target_since >= (
                HANDOVER_NO_TARGET_S
            ):
                log.warning(
                    "node %s: no other node can take over %s (the cluster is stopping?); "
                    "stopping without moving them",
                    self.me.id,
                    ", ".join(waiting[:8]) or "its pchannels",
                )
                return False
            if now >= deadline:
                log.warning(
                    "node %s: handover timed out with %d pchannel(s) not moved: %s",
                    self.me.id,
                    len(waiting),
                    ", ".join(waiting[:8]),
                )
                return False
            await self.notifier.wait_change(min(0.2, deadline - now))

    async def _hand_over_leadership(self, deadline: float) -> bool:
        """Transfer the Raft leadership (TimeoutNow) to the most caught-up follower and wait
        until another node leads. True when this node does not lead (any more)."""
        peer = self.peer
        if peer is None:
            return True
        election_s = self.config.raft_max_timeout_ms / 1000
        while True:
            if not peer.is_leader():
                return True
            now = time.monotonic()
            if now >= deadline:
                log.warning("node %s: leadership transfer timed out", self.me.id)
                return False
            try:
                sent = await asyncio.wait_for(
                    asyncio.wrap_future(peer.transfer_leadership()), deadline - now
                )
            except NotLeader:
                return True
            except (PeerClosed, TimeoutError) as error:
                log.warning("node %s: leadership transfer failed: %r", self.me.id, error)
                return False
            # Sent: the target calls an election at once; denied (no follower holds the
            # whole log yet): ask again shortly.
            wait_until = min(deadline, time.monotonic() + (election_s if sent else 0.0))
            while True:
                await asyncio.sleep(HANDOVER_POLL_S)
                if not peer.is_leader() or time.monotonic() >= wait_until:
                    break

    async def stop(self) -> None:
        self._stopping.set()
        # Wake every watch: each ends its stream with ON_SHUTDOWN (see wait_change).
        self.notifier.advance(self.notifier.revision, self.notifier.raft_index)
        log.info("node %s stopping", self.me.id)
        await asyncio.to_thread(self.metrics.stop)
        if getattr(self, "_health", None) is not None:
            await self._health.enter_graceful_shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.segment_transfers is not None:
            await self.segment_transfers.close()
        await self.plane.close()
        if self._server is not None:
            await self._server.stop(grace=1.0)
            # The server's stop cancels handlers still open (a client's KeepAlive or Produce
            # stream waiting for its next request); let their tasks finish here, or the
            # event loop's own shutdown cancels them again and grpc logs each as an error.
            handlers = [
                task
                for task in asyncio.all_tasks()
                if task.get_name() == "rpc_task" or task.get_name().startswith("HandleExceptions[")
            ]
            if handlers:
                await asyncio.wait(handlers, timeout=STOP_HANDLERS_WAIT_S)
        for channel in self._channels.values():
            await channel.close()
        if self.peer is not None:
            self.peer.close()
        self.replica.close()

    # -- cluster plumbing ---------------------------------------------------------------

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the node runs on (None before ``start``)."""
        return self._loop

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            peer = next((n for n in self.config.nodes if n.grpc_address == address), None)
            channel = self.security.client.aio_channel(
                self.me.dial_grpc_address(peer) if peer is not None else address,
                options=[
                    ("grpc.max_receive_message_length", self.config.grpc_max_message_bytes),
                    ("grpc.max_send_message_length", self.config.grpc_max_message_bytes),
                    # A restarted peer must be reachable again within a second: gRPC's
                    # default reconnect backoff grows to minutes, which would stall tail
                    # recovery and heartbeats long after the peer is back.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
            self._channels[address] = channel
        return channel

    async def latest_position(self, pchannel: str) -> tuple[int, int]:
        """(committed LSN, latest time tick) of `pchannel`: from the local owner when this
        node serves it, else from its owner over gRPC (GetLatestTimeTick)."""
        owner = self.plane.owner(pchannel)
        if owner is not None and owner.serving:
            return owner.committed_lsn, owner.log.last_time_tick
        self.data_view.refresh()
        address, _ = self.data_view.owner_hint(pchannel)
        if not address:
            # Transient (it is being assigned): retryable, like an owner that does not answer.
            raise RaftwalError(
                error_info(E.UNAVAILABLE, f"pchannel {pchannel} has no owner now (being assigned)")
            )
        stub = streaming_pb2_grpc.StreamingNodeStub(self.channel(address))
        try:
            answer = await stub.GetLatestTimeTick(
                streaming_pb2.GetLatestTimeTickRequest(pchannel=pchannel), timeout=5.0
            )
        except grpc.aio.AioRpcError as error:
            info = from_rpc_error(error)
            if info.code in (E.NOT_OWNER, E.CHANNEL_FENCED):
                # The hinted owner is recovering the pchannel or was just replaced (a
                # failover, the balancer): transient, so retryable, like no owner at all.
                raise RaftwalError(
                    error_info(
                        E.UNAVAILABLE,
                        f"pchannel {pchannel} is changing owner ({address}: {info.message})",
                    )
                ) from None
            raise RaftwalError(info) from None
        return answer.committed_lsn, answer.time_tick

    def leader(self) -> NodeConfig | None:
        assert self.peer is not None
        address = self.peer.leader_address()
        if address is None:
            return None
        return self.config.node_by_raft_address(address)

    def leaderless_s(self) -> float:
        """Seconds since this node last led or was connected to the leader it knows (the
        heartbeat loop calls this every interval, so it counts from the loss)."""
        now = time.monotonic()
        if self.peer is not None and self.peer.knows_leader():
            self._leader_seen_at = now
            return 0.0
        return now - self._leader_seen_at

    def is_leader(self) -> bool:
        return self.peer is not None and self.peer.is_leader()

    def caller_name(self, identity: str) -> str:
        # Keyed by the cluster secret, which every node has (it refuses to start without).
        return identity_name(identity, self.config.secret or "")

    def _require_peer(self) -> RaftPeer:
        if self.peer is None or self._stopping.is_set():
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"node {self.me.id} is shutting down"))
        return self.peer

    # -- CoordinationBackend ------------------------------------------------------------

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

    # -- status -------------------------------------------------------------------------

    def member_status(self) -> api.MemberStatus:
        assert self.peer is not None
        status = self.peer.status()
        revision, applied_index, digest = self.replica.digest()
        return api.MemberStatus(
            node_id=self.me.id,
            grpc_address=self.me.grpc_address,
            raft_address=self.me.raft_address,
            role=self.role,
            is_leader=self.peer.is_leader(),
            reachable=True,
            raft_term=self.peer.raft_term(),
            commit_index=self.peer.commit_index(),
            applied_index=applied_index,
            revision=revision,
            state_digest=digest,
            pid=os.getpid(),
            durable_index=int(status.get("durable_index", 0) or 0),
            owners=[_owner_status(o) for _, o in sorted(self.plane.owners.items())],
            wal_disk=[
                api.WalDiskUsage(pchannel=name, bytes=size, first_lsn=first)
                for name, (size, first) in self.plane.disk_usage().items()
            ],
            data_dir_bytes=_tree_bytes(self.me.data_dir),
        )

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
        """A target whose checkpoint does not match its source pchannel (above what it
        committed), or that lags it by more than replicate_lag_warn_entries (LSNs, control
        entries included) by the checkpoint its replicator last recorded."""
        committed = {
            owner.pchannel: owner.committed_lsn
            for member in response.members
            for owner in member.owners
            if owner.state == "serving"
        }
        limit = self.config.replicate_lag_warn_entries
        warnings = []
        for pchannel, target, recorded, claimed in replicated:
            if claimed:
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
            return self.member_status()
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
        for pchannel, error in sorted(self.plane.problems().items()):
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

    # -- background loops ---------------------------------------------------------------

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

    async def _backfill_history(self) -> None:
        gap = self.replica.store.gap()
        if gap is None:
            return
        first, last = gap
        for node in self.config.nodes:
            if node.id == self.me.id:
                continue
            try:
                if await _backfill_history_from(
                    self.channel(node.grpc_address), self.replica.store, first, last
                ):
                    log.info("history %d..%d backfilled from %s", first, last, node.id)
                    return
            except (grpc.aio.AioRpcError, ValueError) as error:
                log.info(
                    "backfill of history %d..%d from %s failed: %s", first, last, node.id, error
                )

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
            request.serving_terms.update(self.plane.serving_terms())
            now = time.monotonic()
            self._suspects = {n: t for n, t in self._suspects.items() if now - t < SUSPECT_KEEP_S}
            del request.suspect_node_ids[:]
            request.suspect_node_ids.extend(sorted(self._suspects))
            request.draining = self.draining
            if leader is not None:
                if leader.id == self.me.id:
                    self.coordinator.record_heartbeat(request)
                    if self.draining:
                        self._note_handover_targets(self.coordinator.handover_targets(self.me.id))
                else:
                    stub = coordinator_pb2_grpc.ClusterStub(self.channel(leader.grpc_address))
                    try:
                        answer = await stub.Heartbeat(request, timeout=max(interval, 0.5))
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

    # -- Raft membership (Coordinator.ChangeMembership / ListMembers) -------------------

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

    def _note_handover_targets(self, targets: int) -> None:
        self._handover_targets = targets
        if targets > 0:
            self._no_target_since = None
        elif self._no_target_since is None:
            self._no_target_since = time.monotonic()

    async def _housekeeping_loop(self) -> None:
        """Event-store backfill and retention (local to each node)."""
        last_retention = time.monotonic()
        while not self._stopping.is_set():
            await asyncio.sleep(min(2.0, self.config.event_retention_check_ms / 1000))
            if self.replica.store.gap() is not None:
                await self._backfill_history()
            if time.monotonic() - last_retention < self.config.event_retention_check_ms / 1000:
                continue
            last_retention = time.monotonic()
            revision = self.applied_revision()
            floor = revision - self.config.event_retention_revisions
            if self.config.event_retention_ms:
                # By age too: everything proposed before the cutoff goes.
                cutoff_ms = int(time.time() * 1000) - self.config.event_retention_ms
                by_age = await asyncio.to_thread(self.replica.store.first_revision_at, cutoff_ms)
                floor = max(floor, min(by_age, revision))
            if floor > 1:
                deleted = await asyncio.to_thread(self.replica.store.compact, floor)
                if deleted:
                    log.info("event store: deleted %d events below revision %d", deleted, floor)


def _tree_bytes(root: Path) -> int:
    """Bytes of the regular files under `root` (bounded: a data dir holds few files)."""
    total = 0
    for count, path in enumerate(root.rglob("*")):
        if count >= 100_000:
            break
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total


def _owner_status(owner: ChannelOwner) -> api.OwnerStatus:
    return api.OwnerStatus(
        pchannel=owner.pchannel,
        term=owner.term,
        state=owner.state,
        last_lsn=owner.log.last_lsn,
        committed_lsn=owner.committed_lsn,
        replicas=[
            api.ReplicaPosition(node_id=node_id, durable_lsn=lsn)
            for node_id, lsn in sorted(owner.replica_positions().items())
        ],
    )


async def _backfill_history_from(
    channel: grpc.aio.Channel, store: object, first: int, last: int
) -> bool:
    """Copy events [first, last] from a peer's WatchEvents into `store` (bounded)."""
    stub = coordinator_pb2_grpc.CoordinatorStub(channel)
    stream = stub.WatchEvents(api.WatchEventsRequest(from_revision=first), timeout=30)
    try:
        async for batch in stream:
            if store.fill_gap(list(batch.events)):  # type: ignore[attr-defined]
                return True
            if batch.events and batch.events[-1].revision >= last:
                return True
    finally:
        stream.cancel()
    return False


def prepare_data_dir(data_dir: Path) -> None:
    """Create `data_dir` 0700, or warn (as PostgreSQL does) when an existing one is open to
    the group or others: it holds the WAL, the Raft journal and the event history."""
    if not data_dir.exists():
        data_dir.mkdir(mode=0o700, parents=True)
        return
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077:
        log.warning(
            "data directory %s has mode %04o: group or others can read what the node "
            "stores (expected 0700; fix it with chmod 700 %s)",
            data_dir,
            mode,
            data_dir,
        )


# glibc's malloc serves large blocks with mmap and gives them back on free, but after the
# first such free it raises its threshold (up to 32 MiB) and serves later large blocks from
# the heap, which it rarely returns. Requests of a few MiB that a node refuses (a budget
# full, a bad batch) would then grow it for good. A fixed threshold keeps mmap for every
# block of 1 MiB or more, so memory follows what the node holds, not what it was sent.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20


def _return_large_blocks_to_the_system() -> None:
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return  # not glibc: nothing to tune
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        log.debug("mallopt(M_MMAP_THRESHOLD) refused; keeping malloc's defaults")


# A refused large request (a 30 MiB CreateChannels without a token, or one over a limit)
# stays in memory after its answer: the exception that ended its call holds the handler's
# frame, and with it the request, in a reference cycle that only the cyclic GC frees; an
# idle node allocates too few objects to run it soon. Measured: 11 refused 30 MiB
# requests from one client left a node 363 MiB (and at times over 1 GiB) larger until
# then. So when the resident size is TRIM_ABOVE_BYTES above the smallest seen, the node
# collects cycles and gives free heap pages back (malloc_trim), at once when it grew by
# that much since the last time, else at most every TRIM_RECHECK_S (memory that is in use
# stays, and is not collected for again and again). Checked every TRIM_CHECK_S with a
# read of /proc/self/statm.
TRIM_CHECK_S = 2.0
TRIM_RECHECK_S = 10.0
TRIM_ABOVE_BYTES = 32 << 20


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


async def _trim_memory_loop(stopping: asyncio.Event) -> None:
    malloc_trim: Callable[[int], int] | None = None
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
        malloc_trim.argtypes = (ctypes.c_size_t,)  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        malloc_trim = None  # not glibc: collect cycles only
    floor = last_after = _resident_bytes()
    last_collect = time.monotonic()
    while not stopping.is_set():
        await asyncio.sleep(TRIM_CHECK_S)
        resident = _resident_bytes()
        floor = min(floor, resident)
        if resident - floor <= TRIM_ABOVE_BYTES:
            continue
        if resident - last_after <= TRIM_ABOVE_BYTES and (
            time.monotonic() - last_collect < TRIM_RECHECK_S
        ):
            continue
        gc.collect()
        if malloc_trim is not None:
            await asyncio.to_thread(malloc_trim, 0)
        last_after, last_collect = _resident_bytes(), time.monotonic()
        log.debug("memory: resident %d -> %d MiB", resident >> 20, last_after >> 20)


class NodeRemoved(Exception):
    """The leader refused this node's heartbeats: `raftwal member remove` forgot it. It
    stopped; it comes back only when started again with --join."""


async def run_node(config: ClusterConfig, node_id: str) -> bool:
    """Run the node until it stops; True when it stopped to restart in another Raft role
    (``raftwal member``): the caller then starts the same command again. Raises
    NodeRemoved when it stopped because the cluster forgot it."""
    _return_large_blocks_to_the_system()
    # Every file the node creates (segments, catalog.db, events.db, the Raft journal and
    # snapshots, SQLite's side files) is for its own user only: 0600 in 0700 directories.
    os.umask(0o077)
    # Tests only, and only with RAFTWAL_ENABLE_FAULTS=1 (see raftwal/faults.py).
    faults.install_from_environment(node_id)
    node = Node(config, node_id)
    await node.run_until_stopped()
    if node.removed:
        raise NodeRemoved(
            f"node {node_id} was removed from the cluster (raftwal member remove): start it "
            "again with --join to rejoin"
        )
    return node.restart_requested
