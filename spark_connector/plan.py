"""Driver side: read the committed manifest once and cut it into input partitions.

What lives here: `SegmentSlice` (one input partition: a committed segment, or an LSN range
of a large one, with the replicas that hold it), `Snapshot` (the manifest at one revision,
the vchannel names and the node addresses) and `plan`, which prunes segments by the read's
pchannels, LSN and time-tick bounds and splits the rest by `maxRecordsPerPartition`.

What must never happen here: a silent gap. A read at a revision whose segments retention
removed fails (COMPACTED from the cluster); a read is one consistent revision, never a mix.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from rpc.errors import code_name, from_rpc_error
from rpc.placement import address_for
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from spark_connector.options import ReadOptions

T = TypeVar("T")
E = errors_pb2


@dataclass(frozen=True)
class SegmentSlice:
    """One input partition (pickled per task: keep it small)."""

    pchannel: str
    segment_id: int
    #: the segment as committed
    first_lsn: int
    last_lsn: int
    digest: int
    #: this partition's inclusive LSN range inside the segment
    from_lsn: int
    to_lsn: int
    #: (node_id, grpc address) of every replica holding the segment
    replicas: tuple[tuple[str, str], ...]

    @property
    def whole(self) -> bool:
        return self.from_lsn == self.first_lsn and self.to_lsn == self.last_lsn

    @property
    def label(self) -> str:
        return f"pchannel {self.pchannel} segment {self.segment_id}"


@dataclass(frozen=True)
class Snapshot:
    revision: int
    segments: tuple[pb.Segment, ...]
    vchannel_names: Mapping[int, str]
    vchannel_ids: Mapping[str, int]
    #: vchannel name -> its pchannel (dropped vchannels included)
    vchannel_pchannels: Mapping[str, str]
    addresses: Mapping[str, str]
    #: node id -> the gRPC addresses of its data workers (rpc.placement)
    worker_addresses: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def address(self, node_id: str, pchannel: str) -> str:
        """Where `node_id` serves `pchannel`: its data worker for it ("" when unknown)."""
        node_address = self.addresses.get(node_id, "")
        if not node_address:
            return ""
        return address_for(node_address, self.worker_addresses.get(node_id, ()), pchannel)


class ConnectorError(RuntimeError):
    """A read that cannot be served as asked (the message says which part and why)."""


_CONNECTOR_ERROR = re.compile(r"(?:ConnectorError|SegmentCorrupted|ValueError): ([^\n]+)")


def connector_message(error: BaseException) -> str | None:
    """The connector's own one-line message inside a Spark error (Spark wraps what the
    data source raised in a long JVM/Python trace), or None when there is none."""
    found = _CONNECTOR_ERROR.search(str(error))
    return found.group(1).strip() if found else None


def channel(endpoint: str, options: ReadOptions) -> grpc.Channel:
    """A channel to `endpoint` with the read's credentials (TLS, client certificate and
    the bearer token every call carries)."""
    return options.security.channel(endpoint, [("grpc.max_receive_message_length", 64 << 20)])


def describe(error: grpc.RpcError) -> str:
    info = from_rpc_error(error)
    return f"{code_name(info.code)}: {info.message}"


def _retryable(error: grpc.RpcError) -> bool:
    return error.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    )


#: pause between rounds over the endpoints while none answers (a Raft election)
_ROUND_PAUSE_S = (0.2, 0.5, 1.0)


def _on_any(options: ReadOptions, call: Callable[[coordinator_pb2_grpc.CoordinatorStub], T]) -> T:
    """`call` on the first endpoint that answers; a definite error (not an outage) is
    raised at once, since another node would answer the same. When none answers (the
    leader was just lost: the others forward to it until they elect a new one), rounds
    over the endpoints go on until `timeoutSeconds` has passed."""
    deadline = time.monotonic() + options.timeout_s
    for round_ in itertools.count():
        failures: list[str] = []
        for endpoint in options.endpoints:
            with channel(endpoint, options) as chan:
                try:
                    return call(coordinator_pb2_grpc.CoordinatorStub(chan))
                except grpc.RpcError as error:
                    if not _retryable(error):
                        raise ConnectorError(f"{endpoint}: {describe(error)}") from None
                    failures.append(f"{endpoint}: {describe(error)}")
        pause = _ROUND_PAUSE_S[min(round_, len(_ROUND_PAUSE_S) - 1)]
        if time.monotonic() + pause >= deadline:
            raise ConnectorError(
                f"no endpoint answered in {options.timeout_s:g} s ({round_ + 1} rounds); "
                "last errors: " + "; ".join(failures)
            )
        time.sleep(pause)
    raise AssertionError("unreachable")


def probe(options: ReadOptions) -> None:
    """Return once an endpoint answers ClusterStatus; ConnectorError, in the same words a
    read would fail with, when none answers within `timeoutSeconds`."""
    _on_any(
        options,
        lambda stub: stub.ClusterStatus(api.ClusterStatusRequest(), timeout=options.timeout_s),
    )


def _read_pchannels(options: ReadOptions, channels: Any) -> list[str]:
    """The live pchannels a read covers (its pchannels, those of its vchannels, or all)."""
    live = {p.name for p in channels.pchannels if p.state != pb.PCHANNEL_STATE_DROPPED}
    wanted = set(live)
    if options.pchannels:
        wanted &= set(options.pchannels)
    if options.vchannels:
        wanted &= {v.pchannel for v in channels.vchannels if v.name in options.vchannels}
    return sorted(wanted)


def seal_open_segments(options: ReadOptions, channels: Any) -> dict[str, int]:
    """Ask each covered pchannel's owner to seal its open segment and wait for the commit
    (``StreamingNode.Seal``); {pchannel: committed through LSN}. A pchannel between owners
    is retried until ``timeoutSeconds``; then ConnectorError names it."""
    deadline = time.monotonic() + options.timeout_s
    done: dict[str, int] = {}
    for pchannel in _read_pchannels(options, channels):
        last = ""
        while pchannel not in done:
            status = _on_any(
                options,
                lambda stub: stub.ClusterStatus(
                    api.ClusterStatusRequest(), timeout=options.timeout_s
                ),
            )
            nodes = {n.node_id: n for n in status.nodes}
            found = next((p for p in status.pchannels if p.name == pchannel), None)
            owner = nodes.get(found.owner_node_id) if found is not None else None
            address = (
                address_for(owner.address, owner.worker_addresses, pchannel)
                if owner is not None and owner.address
                else ""
            )
            if found is not None and found.state == pb.PCHANNEL_STATE_ASSIGNED and address:
                remaining = max(0.1, deadline - time.monotonic())
                with channel(address, options) as chan:
                    try:
                        answer = streaming_pb2_grpc.StreamingNodeStub(chan).Seal(
                            wire.SealRequest(
                                pchannel=pchannel, timeout_ms=int(min(remaining, 60) * 1000)
                            ),
                            timeout=remaining + 1,
                        )
                        done[pchannel] = answer.committed_through_lsn
                        continue
                    except grpc.RpcError as error:
                        if not _retryable(error) and from_rpc_error(error).code not in (
                            E.NOT_OWNER,
                            E.CHANNEL_FENCED,
                        ):
                            raise ConnectorError(
                                f"sealing pchannel {pchannel} at {address}: {describe(error)}"
                            ) from None
                        last = describe(error)
            else:
                last = f"state {pb.PChannelState.Name(found.state) if found else 'unknown'}"
            if time.monotonic() >= deadline:
                raise ConnectorError(
                    f"could not seal pchannel {pchannel} within {options.timeout_s:g} s to read "
                    f"everything acknowledged ({last}); set sealOpenSegments=false to read "
                    "committed segments only"
                )
            time.sleep(0.2)
    return done


def snapshot(options: ReadOptions) -> Snapshot:
    """The committed manifest at one revision (`asOfRevision`, or the current one)."""
    timeout = options.timeout_s

    def list_segments(stub: coordinator_pb2_grpc.CoordinatorStub) -> Any:
        return stub.ListSegments(
            api.ListSegmentsRequest(
                pchannels=sorted(options.pchannels or ()), as_of_revision=options.as_of_revision
            ),
            timeout=timeout,
        )

    def list_channels(stub: coordinator_pb2_grpc.CoordinatorStub) -> Any:
        return stub.ListChannels(api.ListChannelsRequest(include_dropped=True), timeout=timeout)

    def cluster(stub: coordinator_pb2_grpc.CoordinatorStub) -> Any:
        return stub.ClusterStatus(api.ClusterStatusRequest(), timeout=timeout)

    if options.seal_open_segments and not options.as_of_revision:
        # Everything acknowledged before the read: seal every open segment first (a no-op
        # where there is none), then read the manifest, which then holds it all.
        seal_open_segments(options, _on_any(options, list_channels))
    listed = _on_any(options, list_segments)
    channels = _on_any(options, list_channels)
    status = _on_any(options, cluster)
    names = {v.id: v.name for v in channels.vchannels}
    if options.pchannels:
        known = {p.name for p in channels.pchannels}
        missing = sorted(options.pchannels - known)
        if missing:
            raise ConnectorError(f"unknown pchannel(s) {', '.join(missing)}")
    if options.vchannels:
        missing = sorted(options.vchannels - set(names.values()))
        if missing:
            raise ConnectorError(f"unknown vchannel(s) {', '.join(missing)}")
    return Snapshot(
        revision=listed.revision,
        segments=tuple(listed.segments),
        vchannel_names=names,
        vchannel_ids={name: vid for vid, name in names.items()},
        vchannel_pchannels={v.name: v.pchannel for v in channels.vchannels},
        addresses={n.node_id: n.address for n in status.nodes},
        worker_addresses={n.node_id: tuple(n.worker_addresses) for n in status.nodes},
    )


def _pchannels_of(options: ReadOptions, snap: Snapshot) -> set[str] | None:
    wanted: set[str] | None = set(options.pchannels) if options.pchannels else None
    if options.vchannels:
        by_vchannel = {snap.vchannel_pchannels[v] for v in options.vchannels}
        wanted = by_vchannel if wanted is None else wanted & by_vchannel
    return wanted


def plan(
    options: ReadOptions,
    snap: Snapshot,
    *,
    lsn_bounds: Callable[[str], tuple[int | None, int | None]] | None = None,
    tick_bounds: tuple[int | None, int | None] = (None, None),
) -> list[SegmentSlice]:
    """Input partitions for `snap`, pruned by pchannels/vchannels, LSN bounds (half-open,
    per pchannel) and time-tick bounds (half-open)."""
    wanted = _pchannels_of(options, snap)
    bounds = lsn_bounds or options.lsn_bounds
    low_tick, high_tick = tick_bounds
    slices: list[SegmentSlice] = []
    for segment in snap.segments:
        if wanted is not None and segment.pchannel not in wanted:
            continue
        low, high = bounds(segment.pchannel)
        first = max(segment.first_lsn, low or 1)
        last = min(segment.last_lsn, (high - 1) if high is not None else segment.last_lsn)
        if first > last:
            continue
        if low_tick is not None and segment.last_time_tick < low_tick:
            continue
        if high_tick is not None and segment.first_time_tick >= high_tick:
            continue
        replicas = tuple(
            (node_id, snap.address(node_id, segment.pchannel))
            for node_id in segment.replica_node_ids
            if snap.address(node_id, segment.pchannel)
        )
        if not replicas:
            raise ConnectorError(
                f"pchannel {segment.pchannel} segment {segment.segment_id}: no known address "
                f"for its replicas {list(segment.replica_node_ids)}"
            )
        step = options.max_records_per_partition
        for start in range(first, last + 1, step):
            slices.append(
                SegmentSlice(
                    pchannel=segment.pchannel,
                    segment_id=segment.segment_id,
                    first_lsn=segment.first_lsn,
                    last_lsn=segment.last_lsn,
                    digest=segment.digest,
                    from_lsn=start,
                    to_lsn=min(last, start + step - 1),
                    replicas=replicas,
                )
            )
    return slices


def count_rows(slices: Iterable[SegmentSlice]) -> int:
    return sum(s.to_lsn - s.from_lsn + 1 for s in slices)
