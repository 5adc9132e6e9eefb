"""Where the coordination plane meets the data plane on one node.

- ``NodeDataView``: the node's cached view of assignments, vchannels and manifests
  (refreshed when the node applies new commands) and the ``Proposer`` the owners use
  (PChannelReady, CommitSegment, reassignment after a restart);
- ``GrpcReplicaTransport``: the owner's client side of the ``Replication`` service; its
  Append streams go over the replica's transfer port (``rpc.append_stream``) or the gRPC
  Append call, and every AppendRequest passes the ``replication.send`` fault point of
  ``raftwal.node.faults`` either way;
- ``reconcile_loop``: keeps the data plane's owners in line with the applied state.

It implements ``wal_segments``' Protocols and ``raftwal.services.backend.DataView`` over a
``DataPlaneHost`` (the node), and never imports the node's module.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import grpc

from raftwal.node import faults
from raftwal.services.backend import (
    ClusterMembers,
    DataViewSnapshot,
    NodeIdentity,
    StateReader,
    VChannelInfo,
)
from rpc import append_stream
from rpc.errors import RaftwalError
from rpc.placement import worker_index
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.segment_transfer import transfer_host
from statemachine.decider import ready_floor
from statemachine.replicate import replication_sources
from wal_segments.owner import WalError
from wal_segments.plane import Assignment, DataPlane

log = logging.getLogger(__name__)
E = errors_pb2

_STATE_NAMES = {
    pb.PCHANNEL_STATE_ASSIGNING: "ASSIGNING",
    pb.PCHANNEL_STATE_ASSIGNED: "ASSIGNED",
}


class DataPlaneHost(Protocol):
    """What the data-plane glue needs from the node."""

    @property
    def me(self) -> NodeIdentity: ...

    @property
    def replica(self) -> StateReader: ...

    @property
    def config(self) -> ClusterMembers: ...

    @property
    def notifier(self) -> _ChangeNotifier: ...

    def applied_revision(self) -> int: ...

    def propose(self, command: pb.Command) -> Awaitable[pb.CommandResult]: ...

    def channel(self, address: str) -> grpc.aio.Channel: ...


class _ChangeNotifier(Protocol):
    def wait_change(self, timeout_s: float) -> Awaitable[None]: ...


class NodeDataView:
    """CoordinationView + Proposer over the node's applied state. With `worker` = (index,
    count), the view of one data worker: its assignments are those of the pchannels placed
    on it (rpc.placement), the only ones its data plane runs."""

    def __init__(self, node: DataPlaneHost, worker: tuple[int, int] | None = None) -> None:
        self._node = node
        self.view = DataViewSnapshot()
        self._refreshed_at = -2
        self._reassign_attempts = 0
        self._worker = worker
        # The view's assignments, as this worker sees them (its pchannels only).
        self._mine: dict[str, Assignment] = {}
        self._mine_revision = -2

    def holds(self, pchannel: str) -> bool:
        """Whether `pchannel` is placed on this view's data worker (always, for a node's
        view)."""
        if self._worker is None:
            return True
        index, count = self._worker
        return worker_index(pchannel, count) == index

    def refresh(self) -> None:
        def reader(state: pb.CoordinationState) -> DataViewSnapshot:
            view = DataViewSnapshot(revision=state.revision)
            for name, channel in state.pchannels.items():
                if channel.state == pb.PCHANNEL_STATE_DROPPED:
                    continue
                view.pchannels.add(name)
                if channel.state in _STATE_NAMES:
                    view.assignments[name] = Assignment(
                        pchannel=name,
                        term=channel.term,
                        owner_node_id=channel.owner_node_id,
                        state=_STATE_NAMES[channel.state],
                        replica_node_ids=tuple(channel.replica_node_ids),
                        stable_replica_node_ids=tuple(channel.stable_replica_node_ids),
                        wal=channel.wal,
                        wal_config=tuple(sorted(channel.wal_config.items())),
                        wal_epoch=channel.wal_epoch,
                        previous_owner_node_id=_previous_owner(channel),
                        wal_checkpoint=(channel.wal_checkpoint_lsn, channel.wal_checkpoint_term),
                        ready_floor=ready_floor(state, name),
                        **_flushing(state, name),
                    )
            for name, vchannel in state.vchannels.items():
                view.vchannels[name] = VChannelInfo(
                    name, vchannel.id, vchannel.pchannel, vchannel.state == pb.VCHANNEL_STATE_NORMAL
                )
                view.vchannel_names[vchannel.id] = name
            for node_id, node in state.nodes.items():
                view.addresses[node_id] = node.address
                if node.worker_addresses:
                    view.worker_addresses[node_id] = tuple(node.worker_addresses)
            for name, manifest in state.manifests.items():
                view.committed_through[name] = manifest.committed_through_lsn
                if manifest.deleted_before_lsn:
                    view.deleted_before[name] = manifest.deleted_before_lsn
            view.replicated_from = replication_sources(
                state.replicate_configuration, state.replicate_cluster_id
            )
            view.replicate_configuration.CopyFrom(state.replicate_configuration)
            view.replicate_cluster_id = state.replicate_cluster_id
            return view

        # A data worker's "applied revision" moves only with what its view reads (leases
        # and locks never reach it: raftwal.node.planes), so a coordination write that
        # takes a lease costs no view rebuild there.
        applied = self._node.applied_revision()
        if applied != self._refreshed_at:
            self.view = self._node.replica.read(reader)
            self._refreshed_at = applied

    # CoordinationView

    def assignments(self) -> dict[str, Assignment]:
        if self._worker is None:
            return self.view.assignments
        if self._mine_revision != self.view.revision:
            self._mine = {p: a for p, a in self.view.assignments.items() if self.holds(p)}
            self._mine_revision = self.view.revision
        return self._mine

    async def reassign_to_self(self, pchannel: str, term: int) -> None:
        """Propose the next term of `pchannel` to this node; raises RaftwalError when it is
        rejected, so that the data plane asks again on a later reconcile (a rejection
        such as "node n1 is DOWN" right after a restart or a restore passes). Each attempt
        has a request id of its own: the state machine keeps a rejection for retries of
        the same id, and a second acceptance cannot happen (it would be at a stale term)."""
        assignment = self.view.assignments.get(pchannel)
        replicas = list(assignment.replica_node_ids) if assignment else []
        self._reassign_attempts += 1
        result = await self._node.propose(
            pb.Command(
                request_id=(
                    f"reassign:{pchannel}:{term + 1}:{self._node.me.id}:{self._reassign_attempts}"
                ),
                assign_pchannel=pb.AssignPChannel(
                    pchannel=pchannel,
                    term=term + 1,
                    node_id=self._node.me.id,
                    replica_node_ids=replicas,
                ),
            )
        )
        if result.rejection.code != E.OK:
            raise RaftwalError(result.rejection)

    # Proposer

    async def pchannel_ready(self, pchannel: str, term: int, start_lsn: int) -> int:
        result = await self._node.propose(
            pb.Command(
                request_id=f"ready:{pchannel}:{term}:{start_lsn}",
                pchannel_ready=pb.PChannelReady(
                    pchannel=pchannel, term=term, node_id=self._node.me.id, start_lsn=start_lsn
                ),
            )
        )
        return result.rejection.code

    async def commit_segment(self, pchannel: str, term: int, fields: dict[str, object]) -> int:
        result = await self._node.propose(
            pb.Command(
                request_id=f"commit:{pchannel}:{term}:{fields['first_lsn']}:{fields['digest']}",
                commit_segment=pb.CommitSegment(pchannel=pchannel, term=term, **fields),  # type: ignore[arg-type]
            )
        )
        if result.rejection.code == E.OK:
            self.view.committed_through[pchannel] = max(
                self.view.committed_through.get(pchannel, 0),
                int(fields["last_lsn"]),  # type: ignore[call-overload]
            )
        return result.rejection.code

    def committed_through(self, pchannel: str) -> int:
        return self.view.committed_through.get(pchannel, 0)

    async def wal_flushed(
        self, pchannel: str, epoch: int, term: int, checkpoint: tuple[int, int, int]
    ) -> int:
        lsn, lsn_term, time_tick = checkpoint
        result = await self._node.propose(
            pb.Command(
                request_id=f"flushed:{pchannel}:{epoch}:{term}:{lsn}",
                wal_flushed=pb.WalFlushed(
                    pchannel=pchannel,
                    epoch=epoch,
                    term=term,
                    node_id=self._node.me.id,
                    checkpoint_lsn=lsn,
                    checkpoint_term=lsn_term,
                    checkpoint_time_tick=time_tick,
                ),
            )
        )
        return result.rejection.code

    def retention_floor(self, pchannel: str) -> int:
        return self.view.deleted_before.get(pchannel, 0)

    def still_assigned(self, pchannel: str, term: int) -> bool:
        assignment = self.view.assignments.get(pchannel)
        if assignment is None:
            return pchannel not in self.view.pchannels and self.view.revision < 0
        return assignment.term == term and assignment.owner_node_id == self._node.me.id

    # helpers for the servicers

    def owner_hint(self, pchannel: str) -> tuple[str, int]:
        """(the gRPC address serving `pchannel` on its owner: the owner's data worker for
        it, term), or ("", 0)."""
        assignment = self.view.assignments.get(pchannel)
        if assignment is None:
            return "", 0
        return self.view.address(assignment.owner_node_id, pchannel), assignment.term


# -- transport -------------------------------------------------------------------------------


class _GrpcAppendStream:
    def __init__(self, stub: streaming_pb2_grpc.ReplicationStub) -> None:
        self._call = stub.Append()

    async def write(self, request: wire.AppendRequest) -> None:
        await self._call.write(request)

    async def responses(self) -> AsyncIterator[wire.AppendResponse]:
        while True:
            response = await self._call.read()
            if response is grpc.aio.EOF:
                return
            yield response

    def cancel(self) -> None:
        self._call.cancel()


class _AppendStream:
    """The Append stream to one replica, opened on its first request: the request's
    pchannel says which of the replica's data workers holds it (rpc.placement), hence
    which address to dial.

    Over the replica's transfer port (`rpc.append_stream`) when `over_port`: OpenAppend
    for a ticket, then the connection. When the replica hands out no ticket (its port is
    off or at its cap, or it predates OpenAppend), or the port cannot be reached or
    refuses the ticket, the stream is the gRPC Append call instead. A failed OpenAppend
    call (the replica is down) fails the stream: the owner retries with backoff, as for a
    failed Append call."""

    def __init__(self, transport: GrpcReplicaTransport, node_id: str, over_port: bool) -> None:
        self._transport = transport
        self._node_id = node_id
        self._over_port = over_port
        self._pchannel: str | None = None
        self._known = asyncio.Event()
        self._opening: asyncio.Future[None] | None = None
        self._grpc: _GrpcAppendStream | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._cancelled = False

    async def _open(self) -> None:
        transport, node_id = self._transport, self._node_id
        pchannel = self._pchannel or ""
        stub = transport.stub(node_id, pchannel)
        if not self._over_port:
            self._grpc = _GrpcAppendStream(stub)
            return
        try:
            offer = await stub.OpenAppend(
                wire.OpenAppendRequest(owner_node_id=transport.node.me.id), timeout=2.0
            )
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            offer = wire.OpenAppendResponse()  # a node from before OpenAppend
        # None: this peer is dialled through a relay of gRPC only (no transfer address).
        address = (
            transport.transfer_address(node_id, pchannel, offer.port) if offer.ticket else None
        )
        if address is not None:
            try:
                self._reader, self._writer = await append_stream.connect(
                    transfer_host(address),
                    int(address.rpartition(":")[2]),
                    offer.ticket,
                    transport.tls,
                )
                return
            except (append_stream.AppendRefused, OSError, TimeoutError) as error:
                log.info(
                    "append connection to %s at %s failed (%r); using the gRPC call",
                    node_id,
                    address,
                    error,
                )
        self._grpc = _GrpcAppendStream(stub)

    async def _opened(self) -> None:
        await self._known.wait()
        if self._cancelled:
            raise ConnectionError(f"append stream to {self._node_id} cancelled")
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        # Shielded: the sender and the reader of the stream both wait for it, and one of
        # them being cancelled must not cancel the other's open (`cancel` does that).
        await asyncio.shield(self._opening)
        if self._cancelled:
            raise ConnectionError(f"append stream to {self._node_id} cancelled")

    async def write(self, request: wire.AppendRequest) -> None:
        if self._pchannel is None:
            self._pchannel = request.pchannel
            self._known.set()
        await self._opened()
        if self._grpc is not None:
            await self._grpc.write(request)
            return
        writer = self._writer
        assert writer is not None
        if writer.transport.is_closing():
            raise ConnectionError(f"append connection to {self._node_id} closed")
        # Bounded: a replica that stopped reading (SIGSTOP) is given up after the idle
        # timeout, and the owner reconnects.
        await append_stream.send(writer, request.SerializeToString(), append_stream.IDLE_TIMEOUT_S)

    async def responses(self) -> AsyncIterator[wire.AppendResponse]:
        await self._opened()
        if self._grpc is not None:
            async for response in self._grpc.responses():
                yield response
            return
        reader = self._reader
        assert reader is not None
        while True:
            try:
                payload = await append_stream.read_frame(
                    reader, append_stream.MAX_ANSWER_BYTES, append_stream.IDLE_TIMEOUT_S
                )
            except TimeoutError:
                # The replica answers every request and the owner sends at least a
                # heartbeat a second: silence this long is a stopped or cut-off replica.
                raise ConnectionError(
                    f"no answer from {self._node_id} in {append_stream.IDLE_TIMEOUT_S:g} s"
                ) from None
            except asyncio.IncompleteReadError:
                raise ConnectionError(f"{self._node_id} closed the append connection") from None
            if payload is None:
                return
            yield wire.AppendResponse.FromString(payload)

    def cancel(self) -> None:
        self._cancelled = True
        self._known.set()
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        if self._grpc is not None:
            self._grpc.cancel()
        if self._writer is not None:
            self._writer.transport.abort()


class _FaultedAppendStream:
    """Every AppendRequest passes the ``replication.send`` fault point first (the nemesis
    tests drop and delay replication here, whichever way the stream goes)."""

    def __init__(self, stream: _AppendStream) -> None:
        self._stream = stream

    async def write(self, request: wire.AppendRequest) -> None:
        injector = faults.active()
        if injector is not None and await injector.network_fault(
            "replication.send", request.pchannel
        ):
            return  # dropped: log matching finds the gap and the owner resends
        await self._stream.write(request)

    def responses(self) -> AsyncIterator[wire.AppendResponse]:
        return self._stream.responses()

    def cancel(self) -> None:
        self._stream.cancel()


class _WorkerAddresses(Protocol):
    """Where a node serves a pchannel (``DataViewSnapshot``)."""

    def address(self, node_id: str, pchannel: str) -> str: ...

    @property
    def worker_addresses(self) -> dict[str, tuple[str, ...]]: ...


class GrpcReplicaTransport:
    """The owner's side of the Replication service, to the data worker of each replica
    that holds the pchannel (its address from `view`, rpc.placement; a node that announced
    no workers at its own address). Append streams go over that worker's transfer port
    (at the config's peer addresses if set, e.g. the chaos suite's per-link proxies)
    unless `append_over_port` is off or the replica is dialled through another gRPC
    address and no transfer address (`routed_node_ids`: a relay of gRPC only); otherwise,
    and whenever the port is not offered, over the gRPC Append call."""

    def __init__(
        self,
        node: DataPlaneHost,
        *,
        append_over_port: bool = True,
        tls: ssl.SSLContext | None = None,
        routed_node_ids: frozenset[str] = frozenset(),
        view: Callable[[], _WorkerAddresses] | None = None,
    ) -> None:
        self.node = node
        self.tls = tls
        self._append_over_port = append_over_port
        self._routed_node_ids = routed_node_ids
        self._view = view

    def _worker(self, node_id: str, pchannel: str) -> tuple[str, int | None]:
        """(the announced gRPC address serving `pchannel` on `node_id`, its worker index;
        None: the node's own address)."""
        if self._view is not None:
            view = self._view()
            workers = view.worker_addresses.get(node_id, ())
            if workers:
                index = worker_index(pchannel, len(workers))
                if workers[index]:
                    return workers[index], index
            address = view.address(node_id, pchannel)
            if address:
                return address, None
        return self.node.config.node(node_id).grpc_address, None

    def stub(self, node_id: str, pchannel: str = "") -> streaming_pb2_grpc.ReplicationStub:
        address, index = self._worker(node_id, pchannel)
        if index is not None:
            me = self.node.config.node(self.node.me.id)
            dial = dial_worker_grpc_address(me, node_id, index, address)
            return streaming_pb2_grpc.ReplicationStub(self.node.channel(dial))
        return streaming_pb2_grpc.ReplicationStub(self.node.channel(address))

    def transfer_address(self, node_id: str, pchannel: str, port: int) -> str | None:
        """Where to connect to the transfer port `port` that `node_id`'s worker holding
        `pchannel` offered; None: dial through gRPC only."""
        config = self.node.config
        me, peer = config.node(self.node.me.id), config.node(node_id)
        address, index = self._worker(node_id, pchannel)
        if index is None:
            return me.dial_transfer_address(peer, port)
        host = address.rpartition(":")[0].strip("[]")
        return me.dial_worker_transfer_address(peer, index, host, port)

    def open_append(self, node_id: str) -> _FaultedAppendStream:
        over_port = self._append_over_port and node_id not in self._routed_node_ids
        return _FaultedAppendStream(_AppendStream(self, node_id, over_port))

    async def fence(self, node_id: str, request: wire.FenceRequest) -> wire.FenceResponse:
        try:
            return await self.stub(node_id, request.pchannel).Fence(request, timeout=2.0)
        except grpc.aio.AioRpcError as error:
            from rpc.errors import from_rpc_error

            info = from_rpc_error(error)
            if info.code == E.CHANNEL_FENCED:
                raise WalError(
                    E.CHANNEL_FENCED, info.message, current_term=info.current_term
                ) from None
            raise

    async def fetch(self, node_id: str, request: wire.FetchRequest) -> wire.FetchResponse:
        return await self.stub(node_id, request.pchannel).Fetch(request, timeout=10.0)


def dial_address(me: NodeIdentity, config: ClusterMembers, view: NodeDataView, address: str) -> str:
    """Where `me` dials the gRPC `address`: a peer node's control port or one of its data
    workers' ports (as announced), through a configured per-link proxy if there is one."""
    peer = next((n for n in config.nodes if n.grpc_address == address), None)
    if peer is not None:
        dial = getattr(me, "dial_grpc_address", None)
        return dial(peer) if dial is not None else address  # type: ignore[no-any-return]
    view.refresh()
    for node_id, workers in view.view.worker_addresses.items():
        if address in workers:
            return dial_worker_grpc_address(me, node_id, workers.index(address), address)
    return address


def dial_worker_grpc_address(me: NodeIdentity, node_id: str, index: int, address: str) -> str:
    """Where `me` dials worker `index` of `node_id`, announced at `address` (a configured
    per-link proxy, or the address itself)."""
    dial = getattr(me, "dial_worker_grpc_address", None)
    return dial(node_id, index, address) if dial is not None else address


# -- reconciliation loop ---------------------------------------------------------------------


async def reconcile_loop(
    node: DataPlaneHost, plane: DataPlane, view: NodeDataView, stopping: asyncio.Event
) -> None:
    """Keep owners in line with the applied state: on every applied change, and at least
    every second (so a stopped owner is noticed without a state change)."""
    while not stopping.is_set():
        try:
            view.refresh()
            await plane.reconcile()
            # Retention decided in Raft: delete the same segments here (idempotent, so it
            # also finishes a deletion a crash cut short).
            await plane.apply_retention(
                {
                    name: floor
                    for name, floor in view.view.deleted_before.items()
                    if name in view.view.assignments
                    and node.me.id in view.view.assignments[name].replica_node_ids
                }
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged; the next round retries
            log.exception("data plane reconcile failed")
        await node.notifier.wait_change(1.0)


def _flushing(state: pb.CoordinationState, pchannel: str) -> dict[str, object]:
    """The AlterWAL in FLUSHING for `pchannel`, as Assignment fields (none: {})."""
    if not state.HasField("wal_alter"):
        return {}
    entry = state.wal_alter.pchannels.get(pchannel)
    if entry is None or entry.stage != pb.WAL_ALTER_STAGE_FLUSHING:
        return {}
    return {"flushing_epoch": state.wal_alter.epoch, "flushing_target": state.wal_alter.target}


def _previous_owner(channel: pb.PChannel) -> str:
    """The owner at the last term before the current one that became ready (its history
    entry has a start LSN), "" when none or when it is the current owner."""
    for entry in reversed(channel.history):
        if entry.term < channel.term and entry.start_lsn:
            return entry.node_id if entry.node_id != channel.owner_node_id else ""
    return ""
