"""The control process of a node: the composition root of the coordination plane.

A node is a supervisor (``raftwal.node.supervisor``), this control process and its data
workers (``raftwal.node.worker``), DESIGN.md section 2. ``Node`` wires the Raft peer
(``raft.peer.RaftPeer``) to the coordination replica (``raft.replica.
CoordinationReplica``), serves the gRPC services (Coordinator, NodeManager, Cluster,
health, reflection) on ``grpc_port``, heartbeats the Raft leader (with the pchannels its
workers serve and their addresses), runs the coordinator loop while it leads, serves
Prometheus metrics (its own and its workers' pages) and the console on ``metrics_port``
when one is configured (``raftwal.node.metrics``), and keeps its data workers' copies of
the coordination state and proposals flowing (``raftwal.node.planes.DataWorkers``).
StreamingNode and Replication calls that reach ``grpc_port`` are answered with the worker
to go to (``raftwal.services.data_redirect``). It implements ``raftwal.services.
coordinator.CoordinationBackend`` for the public servicer:

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
import concurrent.futures
import contextlib
import gc
import logging
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raft.peer import RaftPeer, RaftTuning, loop_mailbox
from raft.replica import CoordinationReplica
from raft.reserve import RESERVE_FILE_NAME, DiskReserve
from raftwal.node import faults, stop_signals
from raftwal.node.cluster_view import ClusterView, removed_node
from raftwal.node.config import (
    ClusterConfig,
    NodeConfig,
    check_transport_security,
    raft_connection_timeout_ms,
)
from raftwal.node.console import ConsoleFeed, ConsoleRoutes
from raftwal.node.coordinator import Coordinator
from raftwal.node.data_plane import NodeDataView, dial_address
from raftwal.node.disks import DiskCollector, DiskWatch, Watermarks
from raftwal.node.handover import HandoverMixin
from raftwal.node.liveness import LivenessMixin
from raftwal.node.membership import (
    load_role,
)
from raftwal.node.metrics import NodeMetrics
from raftwal.node.notify import AppliedNotifier
from raftwal.node.planes import DataWorkers, supervisor_message, worker_state
from raftwal.node.proposals import ProposalBatcher
from raftwal.node.proposing import FORWARDS_IN_FLIGHT, MAX_COMMAND_BYTES, ProposingMixin
from raftwal.node.reporting import ReportingMixin
from raftwal.node.security import NodeSecurity
from raftwal.node.trim import return_large_blocks_to_the_system, trim_memory_loop
from raftwal.node.voters import VotersMixin
from raftwal.services.callers import identity_name
from raftwal.services.cluster import ClusterServicer
from raftwal.services.coordinator import CoordinatorServicer
from raftwal.services.data_redirect import add_data_redirects
from raftwal.services.decoding import DecodeInterceptor
from raftwal.services.grpc_metrics import GrpcMetricsInterceptor
from raftwal.services.node_manager import NodeManagerServicer
from raftwal.services.stream_caps import StreamCapInterceptor, StreamCaps
from rpc.errors import RaftwalError, error_info, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2, streaming_pb2_grpc

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")


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
# How long a stopping node waits for its data workers to close their data planes.
WORKERS_STOP_WAIT_S = 10.0
# How long a metrics scrape waits for the data workers' pages.
METRICS_WAIT_S = 2.0
# How often the data workers hear whether Raft's disk reserve is released.
RESERVE_CHECK_S = 0.1


class Node(ProposingMixin, ReportingMixin, LivenessMixin, HandoverMixin, VotersMixin):
    """The control process of a node (see the module doc): its wiring and life here, each
    concern in a mixin of its own module (proposals and reads, status, liveness, handover,
    Raft membership changes)."""

    def __init__(
        self,
        config: ClusterConfig,
        node_id: str,
        token: bytes = b"",
        supervisor: socket.socket | None = None,
    ) -> None:
        # The config file's nodes; `config` adds those that joined since (see there).
        self._static_config = config
        self._cluster = ClusterView(config, node_id)
        self.me: NodeConfig = config.node(node_id)
        check_transport_security(config, self.me)
        # TLS and bearer-token auth of the gRPC port, and the node's own client credentials.
        self.security = NodeSecurity.load(config, self.me)
        self.max_wait_ms = config.max_wait_ms
        self.cluster_id = config.cluster_id
        self.incarnation = now_ms()
        data_dir = self.me.data_dir
        prepare_data_dir(data_dir)
        # The role this node runs in: the configured one until `raftwal member` changed it
        # (raftwal/node/membership.py). A switch restarts the process in the new role.
        self.role = load_role(data_dir, self.me.role)
        self.restart_requested = False
        # The leader refused this node's heartbeat: `raftwal member remove` forgot it.
        self.removed = False
        # ... or another process holds this node id (the refusal's words; "" otherwise).
        self.id_in_use = ""
        # Set once a Raft leader accepted this process's heartbeat (or it leads): until
        # then the data plane takes no pchannel, so that a second process under this id
        # never recovers the node's pchannels (see DataPlane's `admitted`).
        self.admitted = asyncio.Event()
        # Disks (raftwal/node/disks.py): Raft's own reserve, for the control plane, and
        # the watermarks of the node's data directories (the data workers refuse client
        # writes past the hard mark; this process reports them and asks for retention).
        self.raft_reserve = DiskReserve(
            data_dir / "raft" / RESERVE_FILE_NAME, config.raft_reserve_bytes
        )
        self._heartbeat_now = asyncio.Event()
        self.disks = DiskWatch(
            self.me.id,
            [data_dir, data_dir / "wal", data_dir / "raft"],
            Watermarks.of(config),
            check_s=config.disk_check_ms / 1000,
            reserve=self.raft_reserve,
            on_pressure=self._heartbeat_now.set,
        )
        self.replica = CoordinationReplica(data_dir, reserve=self.raft_reserve)
        self.metrics = NodeMetrics(self)
        self.metrics.registry.register(
            DiskCollector(self.disks, refused=lambda: self.workers.disk_writes_refused())
        )
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
        # The control process serves no segment transfers (its data workers do).
        self.segment_transfers = None
        self.stream_caps = StreamCaps(
            self.config.max_node_streams, self.config.max_identity_streams
        )
        self._tasks: list[asyncio.Task[None]] = []
        # The node's view of assignments and addresses (owner hints for clients that ask
        # this port for data).
        self.data_view = NodeDataView(self)
        # node id -> monotonic time it was suspected (see HeartbeatRequest.suspect_node_ids)
        self._suspects: dict[str, float] = {}
        # The stall watch's last tick, and when it last found this process frozen.
        self._alive_at = time.monotonic()
        self._stalled_at = -1e9
        # Last time (monotonic) this node knew a Raft leader; start counts as one.
        self._leader_seen_at = time.monotonic()
        # The node's data workers (raftwal.node.planes), whose links the supervisor hands
        # over on `supervisor` (raftwal.node.supervisor).
        self.workers = DataWorkers(self, token, self.me.worker_count())
        self._supervisor = supervisor

    @property
    def config(self) -> ClusterConfig:
        """The cluster's nodes: those of the config file, and every node that joined
        without being in it (raftwal/node/join.py), at the gRPC and Raft addresses it
        announced in its heartbeats (registered in the replicated state); without the
        nodes `raftwal member remove` forgot (RemoveNode), except this node itself."""
        return self._cluster.current(getattr(self, "replica", None))

    def removed_node(self, node_id: str) -> pb.RemovedNode | None:
        """The removal of `node_id` (RemoveNode) in the applied state; None when it was
        not removed (or rejoined since)."""
        return self.replica.read(lambda state: removed_node(state, node_id))

    # -- the data workers (raftwal.node.planes.WorkersHost) ---------------------------------

    def state_bytes(self) -> bytes:
        return self.replica.read(worker_state)

    def serving_changed(self) -> None:
        self._heartbeat_now.set()

    def serving_terms(self) -> dict[str, int]:
        """pchannel -> term of every pchannel an owner of this node serves now."""
        return self.workers.serving_terms()

    def reconcile_now(self) -> None:
        """NodeManager.Assign: the data workers look at their assignments now."""
        self.workers.reconcile_now()

    async def _tell_reserve(self) -> None:
        """Tell the data workers whenever Raft releases its disk reserve (the disk filled
        up) or takes it back: while released, they refuse client writes and owners'
        appends, so that the space it gave back stays Raft's (raftwal/node/disks.py)."""
        told: bool | None = None
        while not self._stopping.is_set():
            released = self.raft_reserve.released
            if released != told:
                self.workers.raft_reserve(released)
                told = released
            await asyncio.sleep(RESERVE_CHECK_S)

    def _worker_pages(self) -> dict[int, bytes]:
        """The data workers' metrics pages (for the metrics endpoint's thread)."""
        loop = self._loop
        if loop is None or self._stopping.is_set():
            return {}
        try:
            return asyncio.run_coroutine_threadsafe(self.workers.metrics_pages(), loop).result(
                METRICS_WAIT_S + 1.0
            )
        except (TimeoutError, RuntimeError, concurrent.futures.CancelledError):
            return {}

    def _follow_supervisor(self) -> None:
        """Take what the supervisor sends (raftwal.node.supervisor): a new link to a data
        worker, or the news that one exited."""
        sock = self._supervisor
        assert sock is not None
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(sock, 4096, 1)
            except BlockingIOError:
                return
            except OSError as error:
                log.error("node %s: supervisor channel failed: %s", self.me.id, error)
                self._close_supervisor_channel()
                return
            if not message:
                # The supervisor is gone: this process is an orphan now, and must stop.
                log.error("node %s: the supervisor went away; stopping", self.me.id)
                for fd in fds:
                    os.close(fd)
                self._close_supervisor_channel()
                self._stop_requested.set()
                return
            try:
                news = supervisor_message(message)
            except ValueError as error:
                log.error("node %s: bad supervisor message: %s", self.me.id, error)
                for fd in fds:
                    os.close(fd)
                continue
            if news.op == "worker" and fds:
                self.workers.attach(
                    news.index, socket.socket(fileno=fds[0]), restarts=news.restarts
                )
            elif news.op == "exited":
                for fd in fds:
                    os.close(fd)
                self.workers.exited(news.index, news.how)

    def _close_supervisor_channel(self) -> None:
        if self._loop is not None and self._supervisor is not None:
            self._loop.remove_reader(self._supervisor.fileno())
            self._supervisor.close()
            self._supervisor = None

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        loop = self._loop
        # Through the loop's mailbox: the applied notifier and the proposal outcomes of one
        # Raft tick wake the event loop once (raft.peer.LoopMailbox).
        mailbox = loop_mailbox(loop)
        # The data workers' copies of the state follow every applied event, in order, and
        # before the notifier wakes anyone: a proposal answered to a worker has its events
        # on the way to it first (raftwal.node.planes).
        self.replica.add_event_listener(
            lambda events, revision, index, last_time_ms, restored: mailbox.post(
                self.workers.applied, events, revision, index, last_time_ms, restored
            )
        )
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
            reserve=self.raft_reserve,
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
        # StreamingNode and Replication live on the data workers' ports: a call that
        # reaches this port anyway is answered with where to go (raftwal.services.
        # data_redirect).
        add_data_redirects(server, self.data_view, self.me.id)
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
                worker_pages=self._worker_pages,
            )
        if self._supervisor is not None:
            self._supervisor.setblocking(False)
            loop.add_reader(self._supervisor.fileno(), self._follow_supervisor)
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._stall_watch(), name="stall-watch"),
            asyncio.create_task(self.coordinator.run(), name="coordinator"),
            asyncio.create_task(self._housekeeping_loop(), name="housekeeping"),
            asyncio.create_task(trim_memory_loop(self._stopping), name="trim-memory"),
            asyncio.create_task(self.disks.run(self._stopping), name="disk-watch"),
            asyncio.create_task(self._tell_reserve(), name="raft-reserve"),
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
        stop_signals.install(loop, self._on_stop_signal)
        try:
            await self._run_until_stopped()
        finally:
            stop_signals.release(loop, ignore=False)

    async def _run_until_stopped(self) -> None:
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
        # A forgotten node holds nothing and has no leader to ask; nor does a second
        # process under a node id (it was never admitted).
        if not self.removed and not self.id_in_use:
            await self.handover_or_abort()
        await self.stop()

    def _on_stop_signal(self) -> None:
        # An operator's stop wins over a pending role switch: stop, do not restart.
        self.restart_requested = False
        if self._stop_requested.is_set():
            log.warning("node %s: second stop signal, stopping without handover", self.me.id)
            self._handover_abort.set()
        self._stop_requested.set()

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
        # The data workers close their data planes (their owners stop; replicas were
        # handed over above) and exit.
        await self.workers.stop_all(WORKERS_STOP_WAIT_S)
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
            channel = self.security.client.aio_channel(
                dial_address(self.me, self.config, self.data_view, address),
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
        """The name a caller's leases are counted under (never its secret): keyed by the
        cluster secret, which every node has (it refuses to start without)."""
        return identity_name(identity, self.config.secret or "")

    def _require_peer(self) -> RaftPeer:
        if self.peer is None or self._stopping.is_set():
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"node {self.me.id} is shutting down"))
        return self.peer

    # -- the event history (local to each node) -----------------------------------------

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


class NodeRemoved(Exception):
    """The leader refused this node's heartbeats: `raftwal member remove` forgot it. It
    stopped; it comes back only when started again with --join."""


#: Exit statuses of the control process, which the supervisor turns into the node's:
#: removed from the cluster (start it again with --join), and stopped to restart in
#: another Raft role (the supervisor starts the same command again).
EXIT_NODE_REMOVED = 3
EXIT_RESTART = 75
# Another process is this node (the leader refused this one): restarting cannot help.
EXIT_ID_IN_USE = 2


def run_control(
    config: ClusterConfig, node_id: str, token: bytes, supervisor: socket.socket | None
) -> int:
    """The control process's main (forked by the supervisor, raftwal.node.supervisor): its
    exit status (0: stopped; EXIT_RESTART: to be started again in another Raft role;
    EXIT_NODE_REMOVED: the cluster forgot it)."""
    return_large_blocks_to_the_system()
    # Tests only, and only with RAFTWAL_ENABLE_FAULTS=1 (see raftwal/faults.py).
    faults.install_from_environment(node_id)
    node = Node(config, node_id, token=token, supervisor=supervisor)
    asyncio.run(node.run_until_stopped())
    if node.removed:
        print(
            f"error: node {node_id} was removed from the cluster (raftwal member remove): "
            "start it again with --join to rejoin",
            file=sys.stderr,
        )
        return EXIT_NODE_REMOVED
    if node.id_in_use:
        print(f"error: {node.id_in_use}", file=sys.stderr)
        return EXIT_ID_IN_USE
    return EXIT_RESTART if node.restart_requested else 0
