"""One data worker of a node (DESIGN.md section 2): the WAL of the pchannels placed on it.

``WorkerNode`` wires, in a process of its own: the StreamingNode and Replication gRPC
services on the worker's own gRPC port, the segment transfer port (sendfile reads,
Append and Produce streams), the ``DataPlane`` (owners and replicas) of the pchannels that
``rpc.placement`` puts on this worker, the reconcile loop that keeps them in line with the
coordination state, the cross-cluster replicators of the source pchannels it owns, and its
metrics page (which the control process serves with its own).

It knows the coordination state only through its control process
(``raftwal.node.planes``): a copy kept by the events the control process applies
(``StateMirror``), proposals sent up (``ControlLink.propose``). Nothing here touches Raft.
It exits when its control process goes away (the supervisor then starts the node's
processes as needed), and on SIGTERM / SIGINT or when the control process asks it to
stop, after closing its data plane.

What must never happen here: a pchannel served that is not placed on this worker (the
data plane refuses to open its log, and every log holds its directory's lock), or any
state kept that a restart needs and the disk does not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import time
from dataclasses import replace

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from raftwal.node import faults, stop_signals
from raftwal.node.cluster_view import ClusterView
from raftwal.node.config import ClusterConfig, NodeConfig
from raftwal.node.data_plane import GrpcReplicaTransport, NodeDataView, dial_address, reconcile_loop
from raftwal.node.disks import DiskWatch, Watermarks
from raftwal.node.metrics import NodeMetrics
from raftwal.node.planes import ControlGone, ControlLink, StateMirror, open_link
from raftwal.node.replicator import Replicators
from raftwal.node.security import NodeSecurity
from raftwal.node.trim import trim_memory_loop
from raftwal.services.consume_wire import add_streaming_node_servicer
from raftwal.services.decoding import DecodeInterceptor
from raftwal.services.grpc_metrics import GrpcMetricsInterceptor
from raftwal.services.replication import ReplicationServicer
from raftwal.services.segment_transfer import SegmentTransfers
from raftwal.services.stream_caps import StreamCapInterceptor, StreamCaps
from raftwal.services.streaming_node import StreamingNodeServicer
from rpc.errors import RaftwalError, error_info
from rpc.placement import worker_index
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2, streaming_pb2, streaming_pb2_grpc
from rpc.protos import planes_pb2 as planes
from rpc.segment_transfer import client_tls
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.owner import ChannelOwner, OwnerConfig
from wal_segments.plane import DataPlane

log = logging.getLogger(__name__)
E = errors_pb2

#: How long a new worker waits for its first whole state from the control process.
FIRST_STATE_WAIT_S = 60.0
#: How often the worker looks whether the pchannels it serves changed (and tells).
SERVING_CHECK_S = 0.2
#: How long a stopping worker lets its gRPC handlers finish.
STOP_HANDLERS_WAIT_S = 2.0

SERVICE_NAMES = (
    streaming_pb2.DESCRIPTOR.services_by_name["StreamingNode"].full_name,
    streaming_pb2.DESCRIPTOR.services_by_name["Replication"].full_name,
)


def now_ms() -> int:
    return int(time.time() * 1000)


class _ReplicatorHost:
    """The worker as `Replicators` sees it (raftwal.node.replicator.ReplicatorHost)."""

    def __init__(self, worker: WorkerNode) -> None:
        self._worker = worker

    @property
    def cluster_id(self) -> str:
        return self._worker.cluster_id

    @property
    def max_lag_s(self) -> float:
        return self._worker.config.replicate_max_lag_ms / 1000

    def replicate_configuration(self) -> pb.ReplicateConfiguration:
        def reader(state: pb.CoordinationState) -> pb.ReplicateConfiguration:
            copy = pb.ReplicateConfiguration()
            copy.CopyFrom(state.replicate_configuration)
            return copy

        return self._worker.replica.read(reader)

    def serving_owner(self, pchannel: str) -> ChannelOwner | None:
        return self._worker.plane.owner(pchannel)

    def view(self):  # type: ignore[no-untyped-def]
        self._worker.data_view.refresh()
        return self._worker.data_view.view

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
        result = await self._worker.propose(command)
        if result.rejection.code != E.OK:
            raise RaftwalError(result.rejection)


class _RaftReserveFlag:
    """Raft's disk reserve as a data worker sees it: held by its control process, which
    says when it is released (``raftwal.node.disks.DiskWatch`` reads ``released``; a
    worker never takes the reserve itself: ``held`` stays true)."""

    held = True
    held_bytes = 0
    releases = 0

    def __init__(self) -> None:
        self.released = False

    def ensure(self) -> bool:
        return True


class _NoCoordinator:
    """A worker runs no coordinator: nothing of the leader's to report."""

    broadcast_failures: dict[tuple[int, str], tuple[int, str]] = {}


class WorkerNode:
    """One data worker process (see the module doc)."""

    def __init__(self, config: ClusterConfig, node_id: str, index: int, token: bytes) -> None:
        self._cluster = ClusterView(config, node_id)
        self.node_config: NodeConfig = config.node(node_id)
        # This worker as clients reach it; its ports are known once bound (`start`).
        self.me: NodeConfig = self.node_config
        self.index = index
        self.count = self.node_config.worker_count()
        self._token = token
        self.cluster_id = config.cluster_id
        self.max_wait_ms = config.max_wait_ms
        self.security = NodeSecurity.load(config, self.node_config)
        self.mirror = StateMirror()
        self.notifier = self.mirror.notifier
        self.peer = None
        self.coordinator = _NoCoordinator()
        self.metrics = NodeMetrics(self, role="worker")
        self.stream_caps = StreamCaps(config.max_node_streams, config.max_identity_streams)
        self.data_view = NodeDataView(self, worker=(index, self.count))
        self.link: ControlLink | None = None
        self.segment_transfers: SegmentTransfers | None = None
        self._server: grpc.aio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stopping = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._reconcile_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.admitted = asyncio.Event()
        # The watermarks of the node's data directories, checked here too: this worker
        # refuses client writes past the hard mark, and while Raft lives on its reserve
        # (which its control process holds and tells it about).
        self.raft_reserve_flag = _RaftReserveFlag()
        data_dir = self.node_config.data_dir
        self.disks = DiskWatch(
            node_id,
            [data_dir, data_dir / "wal", data_dir / "raft"],
            Watermarks.of(config),
            check_s=config.disk_check_ms / 1000,
            reserve=self.raft_reserve_flag,  # type: ignore[arg-type]
        )
        self.replicators = Replicators(_ReplicatorHost(self))
        self.plane = DataPlane(
            node_id=node_id,
            data_dir=self.node_config.data_dir,
            policy=parse_fsync_policy(config.wal_fsync_policy),
            owner_config=OwnerConfig(
                segment_max_bytes=config.segment_max_bytes,
                segment_max_age_ms=config.segment_max_age_ms,
                producer_expiry_ms=config.wal_producer_expiry_ms,
            ),
            transport=GrpcReplicaTransport(
                self,
                tls=client_tls(self.security.client),
                routed_node_ids=frozenset(dict(self.node_config.peer_grpc_addresses))
                - frozenset(dict(self.node_config.peer_transfer_addresses)),
                view=self._refreshed_view,
            ),
            proposer=self.data_view,
            view=self.data_view,
            observer=self.metrics,
            accepts=self.holds,
            exclusive=True,
            # No owner starts before a Raft leader accepted the node's process (the
            # control process says so): a second process under this node id never
            # recovers its pchannels.
            admitted=self.admitted,
        )

    # -- what the data plane and the servicers need -----------------------------------------

    @property
    def replica(self) -> StateMirror:
        return self.mirror

    @property
    def config(self) -> ClusterConfig:
        return self._cluster.current(self.mirror)

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def holds(self, pchannel: str) -> bool:
        return worker_index(pchannel, self.count) == self.index

    def _refreshed_view(self):  # type: ignore[no-untyped-def]
        self.data_view.refresh()
        return self.data_view.view

    def applied_revision(self) -> int:
        """The revision of the last change this worker's copy holds (see
        ``StateMirror.data_revision``)."""
        return self.mirror.data_revision

    def is_leader(self) -> bool:
        return False

    async def propose(self, command: pb.Command) -> pb.CommandResult:
        link = self.link
        if link is None or self._stopping.is_set():
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"worker {self.index} is stopping"))
        return await link.propose(command)

    def suspect(self, node_id: str) -> None:
        if self.link is not None and node_id != self.me.id:
            self.link.suspect(node_id)

    async def wait_change(self, timeout_s: float) -> None:
        """As the control process's: raises ON_SHUTDOWN once the worker is stopping."""
        if self._stopping.is_set():
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"node {self.me.id} is shutting down"))
        await self.notifier.wait_change(timeout_s)
        if self._stopping.is_set():
            raise RaftwalError(error_info(E.ON_SHUTDOWN, f"node {self.me.id} is shutting down"))

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            config = self.config
            channel = self.security.client.aio_channel(
                dial_address(self.node_config, config, self.data_view, address),
                options=[
                    ("grpc.max_receive_message_length", config.grpc_max_message_bytes),
                    ("grpc.max_send_message_length", config.grpc_max_message_bytes),
                    # A restarted peer must be reachable again within a second.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
            self._channels[address] = channel
        return channel

    # -- what the control process asks (planes.ControlRequests) ---------------------------

    def status(self) -> planes.PlaneStatus:
        from raftwal.node.status import owner_status

        status = planes.PlaneStatus(
            owners=[
                owner_status(o, self.config.replica_lag_warn_ms)
                for _, o in sorted(self.plane.owners.items())
            ],
            problems=self.plane.problems(),
            logs=len(self.plane.logs),
            replicators=self.replicators.status(),
            disk_writes_refused=self.disks.refused,
        )
        for name, (size, first) in self.plane.disk_usage().items():
            status.wal_disk.add(pchannel=name, bytes=size, first_lsn=first)
        return status

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def reconcile_now(self) -> None:
        self._reconcile_now.set()
        self.notifier.advance(self.notifier.revision, self.notifier.raft_index)

    def request_stop(self) -> None:
        self._stop_requested.set()

    def raft_reserve(self, released: bool) -> None:
        self.raft_reserve_flag.released = released

    def admit(self) -> None:
        if not self.admitted.is_set():
            self.admitted.set()
            self.reconcile_now()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        config = self._cluster.static
        reader, writer = await open_link(sock)
        self.link = ControlLink(reader, writer, self.mirror, self)
        me = self.node_config
        transfer_port = me.worker_transfer_port(self.index)
        if transfer_port >= 0:
            transfers = SegmentTransfers(
                me.bind_host,
                transfer_port,
                self.security.transfer_tls,
                frame_budget_bytes=config.frame_buffer_budget_bytes,
            )
            await transfers.start()
            self.segment_transfers = transfers
        options = [
            ("grpc.max_receive_message_length", config.grpc_max_message_bytes),
            ("grpc.max_send_message_length", config.grpc_max_message_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
        ]
        interceptors = (
            GrpcMetricsInterceptor(
                lambda method, code: self.metrics.grpc_handled.labels(method, code).inc()
            ),
            *self.security.interceptors,
            DecodeInterceptor(),
            StreamCapInterceptor(self.stream_caps),
        )
        server = grpc.aio.server(options=options, interceptors=interceptors)
        streaming = StreamingNodeServicer(
            self,
            self.plane,
            self.data_view,
            self.segment_transfers,
            config.grpc_max_message_bytes,
            disk=self.disks,
        )
        add_streaming_node_servicer(streaming, server)
        replication = ReplicationServicer(
            self, self.plane, self.segment_transfers, config.grpc_max_message_bytes, disk=self.disks
        )
        if self.segment_transfers is not None:
            self.segment_transfers.serve_appends(replication.serve_append_connection)
            self.segment_transfers.serve_produces(streaming.serve_produce_connection)
        streaming_pb2_grpc.add_ReplicationServicer_to_server(replication, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        grpc_bind = me.bind_address(me.worker_grpc_port(self.index))
        if self.security.server_credentials is not None:
            port = server.add_secure_port(grpc_bind, self.security.server_credentials)
        else:
            port = server.add_insecure_port(grpc_bind)
        if port == 0:
            raise OSError(f"cannot listen on {grpc_bind}")
        await server.start()
        self._server = server
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._health = health_servicer
        self.me = replace(
            me,
            grpc_port=port,
            transfer_port=self.segment_transfers.port if self.segment_transfers else -1,
        )
        self.link.hello(
            planes.PlaneHello(
                token=self._token,
                worker_index=self.index,
                pid=os.getpid(),
                grpc_address=self.me.grpc_address,
                transfer_port=max(0, self.me.transfer_port),
            )
        )
        link_task = asyncio.create_task(self._follow_control(), name="control-link")
        self._tasks.append(link_task)
        deadline = time.monotonic() + FIRST_STATE_WAIT_S
        while not self.mirror.ready:
            if link_task.done() or time.monotonic() >= deadline:
                raise ControlGone("no state from the control process")
            await self.notifier.wait_change(0.5)
        self.data_view.refresh()
        self._tasks += [
            asyncio.create_task(
                reconcile_loop(self, self.plane, self.data_view, self._stopping), name="reconcile"
            ),
            asyncio.create_task(self.replicators.run(self._stopping), name="replicators"),
            asyncio.create_task(self._tell_serving(), name="serving"),
            asyncio.create_task(trim_memory_loop(self._stopping), name="trim-memory"),
            asyncio.create_task(self.disks.run(self._stopping), name="disk-watch"),
        ]
        log.info(
            "node %s data worker %d of %d serving gRPC on %s, transfer port %s (pid %d)",
            me.id,
            self.index,
            self.count,
            self.me.grpc_address,
            self.me.transfer_port,
            os.getpid(),
        )

    async def _follow_control(self) -> None:
        assert self.link is not None
        try:
            await self.link.run()
        except ControlGone as error:
            if not self._stopping.is_set():
                log.warning("worker %d: %s; stopping", self.index, error)
        finally:
            self._stop_requested.set()

    async def _tell_serving(self) -> None:
        """Tell the control process which pchannels this worker serves, when it changes."""
        while not self._stopping.is_set():
            with contextlib.suppress(ControlGone):
                if self.link is not None:
                    self.link.serving(self.plane.serving_terms())
            await asyncio.sleep(SERVING_CHECK_S)

    async def run_until_stopped(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        stop_signals.install(loop, self._stop_requested.set)
        try:
            await self._run_until_stopped(sock)
        finally:
            stop_signals.release(loop, ignore=True)

    async def _run_until_stopped(self, sock: socket.socket) -> None:
        try:
            await self.start(sock)
        except ControlGone as error:
            log.warning("worker %d: %s before it served; stopping", self.index, error)
            await self.stop()
            return
        gc.collect()
        gc.freeze()
        await self._stop_requested.wait()
        await self.stop()

    async def stop(self) -> None:
        self._stopping.set()
        self.notifier.advance(self.notifier.revision, self.notifier.raft_index)
        log.info("node %s data worker %d stopping", self.me.id, self.index)
        if getattr(self, "_health", None) is not None:
            await self._health.enter_graceful_shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.segment_transfers is not None:
            await self.segment_transfers.close()
        await self.plane.close()
        if self._server is not None:
            await self._server.stop(grace=1.0)
            handlers = [
                task
                for task in asyncio.all_tasks()
                if task.get_name() == "rpc_task" or task.get_name().startswith("HandleExceptions[")
            ]
            if handlers:
                await asyncio.wait(handlers, timeout=STOP_HANDLERS_WAIT_S)
        for channel in self._channels.values():
            await channel.close()
        if self.link is not None:
            self.link.close()


def run_worker(
    config: ClusterConfig, node_id: str, index: int, sock: socket.socket, token: bytes
) -> int:
    """The data worker process's main (forked by the supervisor): 0 when it stopped as
    asked or because its control process went away."""
    faults.install_from_environment(node_id)
    worker = WorkerNode(config, node_id, index, token)
    asyncio.run(worker.run_until_stopped(sock))
    return 0
