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
from collections.abc import AsyncIterator, Awaitable
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
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.segment_transfer import transfer_host
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
    """CoordinationView + Proposer over the node's applied state."""

    def __init__(self, node: DataPlaneHost) -> None:
        self._node = node
        self.view = DataViewSnapshot()
        self._reassign_attempts = 0

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
                    )
            for name, vchannel in state.vchannels.items():
                view.vchannels[name] = VChannelInfo(
                    name, vchannel.id, vchannel.pchannel, vchannel.state == pb.VCHANNEL_STATE_NORMAL
                )
                view.vchannel_names[vchannel.id] = name
            for node_id, node in state.nodes.items():
                view.addresses[node_id] = node.address
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

        if self._node.applied_revision() != self.view.revision:
            self.view = self._node.replica.read(reader)

    # CoordinationView

    def assignments(self) -> dict[str, Assignment]:
        return self.view.assignments

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

    def retention_floor(self, pchannel: str) -> int:
        return self.view.deleted_before.get(pchannel, 0)

    def still_assigned(self, pchannel: str, term: int) -> bool:
        assignment = self.view.assignments.get(pchannel)
        if assignment is None:
            return pchannel not in self.view.pchannels and self.view.revision < 0
        return assignment.term == term and assignment.owner_node_id == self._node.me.id

    # helpers for the servicers

    def owner_hint(self, pchannel: str) -> tuple[str, int]:
        assignment = self.view.assignments.get(pchannel)
        if assignment is None:
            return "", 0
        return self.view.addresses.get(assignment.owner_node_id, ""), assignment.term


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


class _PortAppendStream:
    """The Append stream over the replica's transfer port (`rpc.append_stream`).

    It opens on first use: OpenAppend for a ticket, then the connection. When the replica
    hands out no ticket (its port is off or at its cap, or it predates OpenAppend), or
    the port cannot be reached or refuses the ticket, the stream is the gRPC Append call
    instead. A failed OpenAppend call (the replica is down) fails the stream: the owner
    retries with backoff, as for a failed Append call."""

    def __init__(self, transport: GrpcReplicaTransport, node_id: str) -> None:
        self._transport = transport
        self._node_id = node_id
        self._opening: asyncio.Future[None] | None = None
        self._grpc: _GrpcAppendStream | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._cancelled = False

    async def _open(self) -> None:
        transport, node_id = self._transport, self._node_id
        stub = transport.stub(node_id)
        try:
            offer = await stub.OpenAppend(
                wire.OpenAppendRequest(owner_node_id=transport.node.me.id), timeout=2.0
            )
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            offer = wire.OpenAppendResponse()  # a node from before OpenAppend
        config = transport.node.config
        # None: this peer is dialled through a relay of gRPC only (no transfer address).
        address = (
            config.node(transport.node.me.id).dial_transfer_address(
                config.node(node_id), offer.port
            )
            if offer.ticket
            else None
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
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        # Shielded: the sender and the reader of the stream both wait for it, and one of
        # them being cancelled must not cancel the other's open (`cancel` does that).
        await asyncio.shield(self._opening)
        if self._cancelled:
            raise ConnectionError(f"append stream to {self._node_id} cancelled")

    async def write(self, request: wire.AppendRequest) -> None:
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
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        if self._grpc is not None:
            self._grpc.cancel()
        if self._writer is not None:
            self._writer.transport.abort()


class _FaultedAppendStream:
    """Every AppendRequest passes the ``replication.send`` fault point first (the nemesis
    tests drop and delay replication here, whichever way the stream goes)."""

    def __init__(self, stream: _PortAppendStream | _GrpcAppendStream) -> None:
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


class GrpcReplicaTransport:
    """The owner's side of the Replication service. Append streams go over the replica's
    transfer port (at the config's peer_transfer_addresses if set, e.g. the chaos suite's
    per-link proxies) unless `append_over_port` is off or the replica is dialled through
    another gRPC address and no transfer address (`routed_node_ids`: a relay of gRPC
    only); otherwise, and whenever the port is not offered, over the gRPC Append call."""

    def __init__(
        self,
        node: DataPlaneHost,
        *,
        append_over_port: bool = True,
        tls: ssl.SSLContext | None = None,
        routed_node_ids: frozenset[str] = frozenset(),
    ) -> None:
        self.node = node
        self.tls = tls
        self._append_over_port = append_over_port
        self._routed_node_ids = routed_node_ids

    def stub(self, node_id: str) -> streaming_pb2_grpc.ReplicationStub:
        address = self.node.config.node(node_id).grpc_address
        return streaming_pb2_grpc.ReplicationStub(self.node.channel(address))

    def open_append(self, node_id: str) -> _FaultedAppendStream:
        if self._append_over_port and node_id not in self._routed_node_ids:
            return _FaultedAppendStream(_PortAppendStream(self, node_id))
        return _FaultedAppendStream(_GrpcAppendStream(self.stub(node_id)))

    async def fence(self, node_id: str, request: wire.FenceRequest) -> wire.FenceResponse:
        try:
            return await self.stub(node_id).Fence(request, timeout=2.0)
        except grpc.aio.AioRpcError as error:
            from rpc.errors import from_rpc_error

            info = from_rpc_error(error)
            if info.code == E.CHANNEL_FENCED:
                raise WalError(
                    E.CHANNEL_FENCED, info.message, current_term=info.current_term
                ) from None
            raise

    async def fetch(self, node_id: str, request: wire.FetchRequest) -> wire.FetchResponse:
        return await self.stub(node_id).Fetch(request, timeout=10.0)


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
