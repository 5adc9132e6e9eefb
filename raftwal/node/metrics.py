"""Prometheus metrics of one node process, served over HTTP on ``metrics_port``.

What lives here: ``NodeMetrics``, which owns this node's own ``CollectorRegistry`` (never
prometheus_client's global default registry, so that nothing else in the process leaks into
a node's page and two nodes in one process would not mix), and the ``/metrics`` endpoint.

Two kinds of metrics:

- **Read at scrape time** (``_NodeCollector``): the Raft peer's term and indexes, the
  applied coordination state (nodes, pchannels, leases, locks, pending broadcasts,
  committed segments from the manifests), the durations of the Raft journal's fdatasyncs
  (``raft.journal.SyncTimes``), the event store's size, for every pchannel
  this node owns its committed LSN and each replica's durable LSN and the lag of every
  subscription on it, which pchannels are under-replicated (the rule ClusterStatus uses,
  ``raftwal.node.health``), the data directory's free and total disk, and the number of
  unfinished asyncio tasks (a leak shows as a climb). Nothing has to keep
  these up to date, so they cannot drift from what ClusterStatus reports.
- **Counted when they happen** (counters and histograms): proposals, their time to an
  outcome and their rejections by code (``observe_proposal``, wrapped around
  ``Node.propose``), acknowledged WAL write
  batches with their latency (``batch_acknowledged``, the owner's ``WriteObserver``), and
  broadcast delivery failures (the leader's coordinator), and the disk probe: a thread
  that times a small write + fdatasync in the data directory every few seconds
  (``raftwal_disk_fsync_probe_seconds``, for the slow-fsync alert of deploy/prometheus).

What must never happen here: a scrape that changes anything or waits on the event loop or
on Raft (it only reads, under the replica's apply lock for the state); an unbounded label
(labels are pchannel names, subscription names, node ids, command kinds and error codes,
all bounded by the configuration and the state machine's limits; never broadcast ids,
request ids or LSNs).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sized
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from raft.journal import SYNC_BUCKETS_S
from raft.peer import RaftPeer
from raftwal import __version__
from raftwal.node.config import ClusterConfig, NodeConfig
from raftwal.node.health import under_replicated
from raftwal.node.metrics_http import MetricsServer, Routes
from raftwal.node.replicator import SOURCE_GAP
from raftwal.services.segment_transfer import SegmentTransfers
from raftwal.services.stream_caps import StreamCaps
from rpc.errors import RaftwalError
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from statemachine.replicate import replicated_pairs

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

# Produce -> acknowledgement latency buckets (seconds): an fsync is ~0.1-10 ms, a majority
# round trip on a LAN ~0.2-2 ms; the tail covers backpressure and failover waits.
WAL_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# Coordination proposal latency buckets (seconds): etcd's write p50 on an idle SSD is about
# 1-2 ms, a loaded or remote quorum tens to hundreds.
PROPOSAL_LATENCY_BUCKETS_S = (
    0.001,
    0.002,
    0.004,
    0.006,
    0.008,
    0.012,
    0.016,
    0.024,
    0.032,
    0.064,
    0.128,
    0.256,
    0.512,
    1.024,
    2.048,
    5.0,
)

# fdatasync latency buckets (seconds) of the disk probe, the same as the Raft journal's
# fsync histogram; etcd alerts when its WAL fsync p99 passes 0.5 s, a healthy SSD is under
# 10 ms.
FSYNC_LATENCY_BUCKETS_S = SYNC_BUCKETS_S
# How often the probe writes and fdatasyncs one block in the data directory.
FSYNC_PROBE_INTERVAL_S = 5.0
FSYNC_PROBE_BYTES = 4096
FSYNC_PROBE_FILE = ".fsync-probe"


def error_code_name(code: int) -> str:
    """`CHANNEL_FENCED` for the ErrorCode value, the number for one this build lacks."""
    try:
        return str(E.ErrorCode.Name(code))
    except ValueError:
        return str(code)


def _enum_names(enum: object, prefix: str) -> dict[int, str]:
    return {
        value: name.removeprefix(prefix)
        for name, value in enum.items()  # type: ignore[attr-defined]
    }


NODE_STATES = _enum_names(pb.NodeState, "NODE_STATE_")
PCHANNEL_STATES = _enum_names(pb.PChannelState, "PCHANNEL_STATE_")


class _BroadcastFailures(Protocol):
    @property
    def broadcast_failures(self) -> Sized: ...


class _StateReader(Protocol):
    def read(self, reader: Callable[[pb.CoordinationState], T]) -> T: ...


class _ReplicatorStatuses(Protocol):
    def status(self) -> list[api.ReplicatorStatus]:
        """The cross-cluster replicators this node runs (copies, readable from any thread)."""
        ...


class MetricsHost(Protocol):
    """What the metrics read from their process at every scrape: the control process
    (``raftwal.node.process.Node``: Raft, the state, the event store, the disk) or a data
    worker (``raftwal.node.worker.WorkerNode``: its owners and transfer port)."""

    @property
    def me(self) -> NodeConfig: ...

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def peer(self) -> RaftPeer | None: ...

    @property
    def replica(self) -> _StateReader: ...

    @property
    def coordinator(self) -> _BroadcastFailures: ...

    @property
    def metrics(self) -> NodeMetrics: ...

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def segment_transfers(self) -> SegmentTransfers | None: ...

    @property
    def stream_caps(self) -> StreamCaps: ...

    def is_leader(self) -> bool: ...


class NodeMetrics:
    """The metrics of one node: its registry, its event metrics and its endpoint."""

    def __init__(self, node: MetricsHost, role: str = "control") -> None:
        self.registry = CollectorRegistry()
        self._node = node
        # "control": the process's own page is the node's, with its data workers' pages
        # merged in (`serve`); "worker": a data worker's page, which its control process
        # asks for (`render`).
        self.role = role
        self._server: MetricsServer | None = None
        self.proposals = Counter(
            "raftwal_proposals",
            "Coordination commands this node proposed (client requests it received, its "
            "coordinator loop, read barriers), by command kind.",
            ["kind"],
            registry=self.registry,
        )
        self.grpc_handled = Counter(
            "raftwal_grpc_server_handled",
            "Calls the gRPC port answered, by full method name and status code (refusals by "
            "authentication and the stream caps included; streams count when they end).",
            ["method", "code"],
            registry=self.registry,
        )
        self.proposal_latency = Histogram(
            "raftwal_proposal_duration_seconds",
            "Time from this node proposing a coordination command (a client request it "
            "received, its coordinator loop) to the command's outcome: forwarding to the "
            "leader, Raft replication to a majority and their journal fsyncs, and the "
            "apply; by command kind. Proposals that got no outcome are not counted.",
            ["kind"],
            buckets=PROPOSAL_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.proposal_rejections = Counter(
            "raftwal_proposal_rejections",
            "Proposed commands the state machine rejected (committed, not applied), by kind "
            "and ErrorInfo code.",
            ["kind", "code"],
            registry=self.registry,
        )
        self.proposal_failures = Counter(
            "raftwal_proposal_failures",
            "Proposals that got no outcome from Raft (NOT_LEADER without a leader, UNKNOWN "
            "after a timeout, ON_SHUTDOWN), by kind and ErrorInfo code.",
            ["kind", "code"],
            registry=self.registry,
        )
        self.wal_batches = Counter(
            "raftwal_wal_append_batches",
            "Write batches this node's owners acknowledged (durable on a majority), by "
            "pchannel; idempotent retries answered from memory are not counted.",
            ["pchannel"],
            registry=self.registry,
        )
        self.wal_messages = Counter(
            "raftwal_wal_append_messages",
            "Messages in acknowledged write batches, by pchannel.",
            ["pchannel"],
            registry=self.registry,
        )
        self.wal_bytes = Counter(
            "raftwal_wal_append_bytes",
            "Encoded WAL bytes (frames) of acknowledged write batches, by pchannel.",
            ["pchannel"],
            registry=self.registry,
        )
        self.wal_latency = Histogram(
            "raftwal_wal_append_latency_seconds",
            "Time from the owner receiving a write batch to acknowledging it (backpressure, "
            "local append, replication to a majority), by pchannel.",
            ["pchannel"],
            buckets=WAL_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.broadcast_delivery_failures = Counter(
            "raftwal_broadcast_delivery_failures",
            "Failed attempts of the leader to append a pending broadcast to a target "
            "vchannel (each is retried with backoff).",
            registry=self.registry,
        )
        self.fsync_probe = Histogram(
            "raftwal_disk_fsync_probe_seconds",
            f"Time to write {FSYNC_PROBE_BYTES} bytes to {FSYNC_PROBE_FILE} in the data "
            f"directory and fdatasync it, every {FSYNC_PROBE_INTERVAL_S:g} s: the latency the "
            "WAL's and the Raft journal's fsyncs see from this disk.",
            buckets=FSYNC_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.fsync_probe_failures = Counter(
            "raftwal_disk_fsync_probe_failures",
            "Disk probes whose write or fdatasync failed (the error is logged).",
            registry=self.registry,
        )
        self._probe: _FsyncProbe | None = None
        self.registry.register(_NodeCollector(node, role))

    # -- events ---------------------------------------------------------------------------

    async def observe_proposal(
        self, kind: str, outcome: Awaitable[pb.CommandResult]
    ) -> pb.CommandResult:
        """Await a proposal's `outcome`, counting it, its rejection or its failure."""
        self.proposals.labels(kind).inc()
        began = time.monotonic()
        try:
            result = await outcome
        except RaftwalError as error:
            self.proposal_failures.labels(kind, error_code_name(error.info.code)).inc()
            raise
        self.proposal_latency.labels(kind).observe(time.monotonic() - began)
        if result.rejection.code != E.OK:
            self.proposal_rejections.labels(kind, error_code_name(result.rejection.code)).inc()
        return result

    async def observe_proposals(
        self, kinds: list[str], outcome: Awaitable[list[pb.CommandResult]]
    ) -> list[pb.CommandResult]:
        """``observe_proposal`` for the commands of one batch (one entry), kind by kind."""
        for kind in kinds:
            self.proposals.labels(kind).inc()
        began = time.monotonic()
        try:
            results = await outcome
        except RaftwalError as error:
            for kind in kinds:
                self.proposal_failures.labels(kind, error_code_name(error.info.code)).inc()
            raise
        took_s = time.monotonic() - began
        for kind in kinds:
            self.proposal_latency.labels(kind).observe(took_s)
        for kind, result in zip(kinds, results, strict=False):
            if result.rejection.code != E.OK:
                self.proposal_rejections.labels(kind, error_code_name(result.rejection.code)).inc()
        return results

    def batch_acknowledged(
        self, pchannel: str, messages: int, wal_bytes: int, latency_s: float
    ) -> None:
        """`wal_segments.owner.WriteObserver`: one write batch was acknowledged."""
        self.wal_batches.labels(pchannel).inc()
        self.wal_messages.labels(pchannel).inc(messages)
        self.wal_bytes.labels(pchannel).inc(wal_bytes)
        self.wal_latency.labels(pchannel).observe(latency_s)

    # -- endpoint -------------------------------------------------------------------------

    def render(self) -> bytes:
        """This process's page (Prometheus text format)."""
        return generate_latest(self.registry)

    def serve(
        self,
        host: str,
        port: int,
        routes: Routes | None = None,
        worker_pages: Callable[[], dict[int, bytes]] | None = None,
    ) -> None:
        """Serve ``/metrics`` (and `routes`: the console) on host:port from one daemon thread
        with bounded connections and deadlines (``raftwal.node.metrics_http``): this
        process's metrics with those of the node's data workers (`worker_pages`: each
        worker's page by index; their samples get a ``worker`` label). Raises OSError when
        the port cannot be bound."""

        def render() -> tuple[bytes, str]:
            if worker_pages is None:
                return generate_latest(self.registry), CONTENT_TYPE_LATEST
            return merge_pages(self.registry, worker_pages()), CONTENT_TYPE_LATEST

        try:
            self._server = MetricsServer(host, port, render, routes=routes).start()
        except OSError as error:
            raise OSError(f"cannot serve metrics on {host}:{port}: {error}") from error
        log.info("node %s serving metrics on http://%s:%d/metrics", self._node.me.id, host, port)
        self._probe = _FsyncProbe(self._node.me.data_dir / FSYNC_PROBE_FILE, self).start()

    def endpoint_refusals(self) -> dict[str, int]:
        """Connections the metrics endpoint closed without an answer, by reason."""
        return dict(self._server.refused) if self._server is not None else {}

    def stop(self) -> None:
        """Stop the endpoint (blocks up to its tick, 0.25 s) and the disk probe."""
        if self._probe is not None:
            self._probe.stop()
            self._probe = None
        if self._server is not None:
            self._server.stop()
            self._server = None


class _FsyncProbe:
    """One daemon thread that times a small write + fdatasync in the data directory every
    ``FSYNC_PROBE_INTERVAL_S``: the disk's latency whether or not anything else writes
    (the Raft journal times its own fdatasyncs, ``raftwal_raft_journal_fsync_seconds``,
    but only when there is something to sync; wal_segments/ does not time its own).
    One probe at a time, one block rewritten in place: bounded in I/O and in space."""

    def __init__(self, path: os.PathLike[str], metrics: NodeMetrics) -> None:
        self._path = path
        self._metrics = metrics
        self._stop = threading.Event()
        self._block = b"\0" * FSYNC_PROBE_BYTES
        self._thread = threading.Thread(target=self._run, name="raftwal-fsync-probe", daemon=True)

    def start(self) -> _FsyncProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(FSYNC_PROBE_INTERVAL_S)

    def probe_once(self) -> None:
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                started = time.monotonic()
                os.pwrite(fd, self._block, 0)
                os.fdatasync(fd)
                self._metrics.fsync_probe.observe(time.monotonic() - started)
            finally:
                os.close(fd)
        except OSError as error:
            self._metrics.fsync_probe_failures.inc()
            log.warning("disk probe of %s failed: %s", self._path, error)


def merge_pages(registry: CollectorRegistry, pages: dict[int, bytes]) -> bytes:
    """`registry`'s page with the data workers' `pages` merged in: one family per name.
    With more than one worker, each worker's samples get a ``worker="<index>"`` label (its
    process-wide series, such as calls answered or open streams, would collide); a node
    with one worker shows its samples as they are. A page that does not parse is left
    out (and logged)."""
    families: dict[str, Metric] = {}
    for family in registry.collect():
        families[family.name] = family
    for index, page in sorted(pages.items()):
        try:
            parsed = list(text_string_to_metric_families(page.decode()))
        except (ValueError, UnicodeDecodeError) as error:
            log.warning("metrics page of data worker %d does not parse: %s", index, error)
            continue
        for family in parsed:
            samples = (
                [
                    sample._replace(labels={**sample.labels, "worker": str(index)})
                    for sample in family.samples
                ]
                if len(pages) > 1 or index > 0
                else list(family.samples)
            )
            known = families.get(family.name)
            if known is None:
                family.samples = samples
                families[family.name] = family
            elif known.type == family.type:
                known.samples.extend(samples)

    class _Merged(Collector):
        def collect(self) -> Iterator[Metric]:
            return iter(families.values())

    merged = CollectorRegistry(auto_describe=False)
    merged.register(_Merged())
    return generate_latest(merged)


class _NodeCollector(Collector):
    """Reads the process's current state at every scrape (see the module docstring)."""

    def __init__(self, node: MetricsHost, role: str) -> None:
        self._node = node
        self._role = role

    def collect(self) -> Iterator[Metric]:
        node = self._node
        view = node.replica.read(_StateView.of)
        if self._role == "worker":
            yield from self._wal(view)
            yield from self._process()
            return
        info = GaugeMetricFamily(
            "raftwal_node_info",
            "This node's id and raftwal version (always 1).",
            labels=["node_id", "version"],
        )
        info.add_metric([node.me.id, __version__], 1)
        yield info
        yield from self._raft()
        yield from self._state(view)
        yield from self._event_store()
        yield from self._disk()
        yield from self._process()

    def _process(self) -> Iterator[Metric]:
        """What each process of a node has of its own: its transfer port (a data worker),
        its stream caps, its event loop's tasks."""
        node = self._node
        transfers = node.segment_transfers
        if transfers is not None:
            outcomes = CounterMetricFamily(
                "raftwal_segment_transfers",
                "Connections to the segment transfer port, by outcome: served (the frames "
                "sent), refused (no valid ticket: unknown, used, expired, or a bad hello), "
                "failed (cut short: the reader went away or stalled, or the file was gone), "
                "turned_away (closed at once: too many connections), turned_away_source (closed "
                "at once: too many from one address in the hello phase), appends (Append streams of "
                "replication accepted), produces (producers' Produce streams accepted), "
                "frames_refused (a Produce or Append frame past frame_buffer_budget_bytes), "
                "frames_stalled (a frame whose body did not follow its header in time).",
                labels=["outcome"],
            )
            for outcome, count in sorted(dict(transfers.counts).items()):
                outcomes.add_metric([outcome], float(count))
            yield outcomes
        caps = node.stream_caps
        open_streams = GaugeMetricFamily(
            "raftwal_open_streams",
            "Open long-lived streams of the gRPC port, by method (capped per node at "
            "max_node_streams and per caller at max_identity_streams).",
            labels=["method"],
        )
        for method, count in sorted(dict(caps.open).items()):
            open_streams.add_metric([method], float(count))
        yield open_streams
        stream_refusals = CounterMetricFamily(
            "raftwal_stream_refusals",
            "Long-lived streams refused with RESOURCE_EXHAUSTED, by method and by the cap "
            "reached: node (max_node_streams) or identity (max_identity_streams).",
            labels=["method", "scope"],
        )
        for (method, scope), count in sorted(dict(caps.refused).items()):
            stream_refusals.add_metric([method, scope], float(count))
        yield stream_refusals
        loop = node.event_loop
        if loop is not None:
            # all_tasks copies the loop's task set with a retry, safe from this thread.
            yield GaugeMetricFamily(
                "raftwal_asyncio_tasks",
                "Unfinished asyncio tasks of the node's event loop (streams, owners, "
                "background loops); a count that keeps climbing is a leak.",
                value=len(asyncio.all_tasks(loop)),
            )

    def _raft(self) -> Iterator[Metric]:
        node = self._node
        peer = node.peer
        if peer is None:
            return
        status = peer.status()
        commit_index = int(status["commit_index"])
        # The peer's applied index counts pysyncobj's own no-op entries too (the
        # coordination state's last_raft_index skips them), so an idle node shows no lag.
        applied_index = int(status["last_applied"])
        gauges = (
            ("raftwal_raft_term", "Current Raft term.", status["term"]),
            ("raftwal_raft_is_leader", "1 when this node is the Raft leader.", node.is_leader()),
            ("raftwal_raft_commit_index", "Raft commit index known here.", commit_index),
            (
                "raftwal_raft_applied_index",
                "Raft index of the last log entry applied on this node.",
                applied_index,
            ),
            (
                "raftwal_raft_apply_lag_entries",
                "Raft commit index minus the applied index on this node.",
                max(0, commit_index - applied_index),
            ),
            (
                "raftwal_raft_durable_index",
                "Raft journal entries fsynced on this node.",
                status["durable_index"],
            ),
            (
                "raftwal_raft_pending_proposals",
                "Proposals waiting for their Raft outcome on this node.",
                status["pending_proposals"],
            ),
            (
                "raftwal_raft_snapshot_index",
                "Raft index of the newest snapshot on this node.",
                status["snapshot_index"],
            ),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=float(value))
        yield GaugeMetricFamily(
            "raftwal_raft_has_leader",
            "1 when this node knows a Raft leader (itself included), 0 when it knows none.",
            value=1.0 if status["leader"] else 0.0,
        )
        yield CounterMetricFamily(
            "raftwal_raft_journal_syncs",
            "Syncs (fdatasync when durable) of this node's Raft journal.",
            value=float(status["journal_syncs"]),
        )
        counts, total_s = peer.journal_sync_times()
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*SYNC_BUCKETS_S, math.inf), counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == math.inf else repr(bound), float(running)))
        yield HistogramMetricFamily(
            "raftwal_raft_journal_fsync_seconds",
            "Time each group-commit fdatasync of this node's Raft journal took (etcd's "
            "etcd_disk_wal_fsync_duration_seconds): a coordination write waits for one on "
            "the leader and on a majority.",
            buckets=buckets,
            sum_value=total_s,
        )
        partners = GaugeMetricFamily(
            "raftwal_raft_partner_connected",
            "1 when the Raft transport to the partner (its Raft address) is connected.",
            labels=["partner"],
        )
        for address, connected in sorted(status["partners_connected"].items()):
            partners.add_metric([address], float(connected))
        yield partners
        refused = CounterMetricFamily(
            "raftwal_raft_port_refusals",
            "Connections the Raft port closed before or for lack of authentication with the "
            "cluster secret, by reason: frame_too_large (declared more than the cap), "
            "bad_frame (did not decrypt, or a replayed frame), auth_timeout (no "
            "authentication within auth_timeout_s), too_many_unauthenticated.",
            labels=["reason"],
        )
        for reason, count in sorted(peer.port_refusals().items()):
            refused.add_metric([reason], float(count))
        yield refused
        endpoint = CounterMetricFamily(
            "raftwal_metrics_endpoint_refusals",
            "Connections to this metrics endpoint closed without an answer, by reason: "
            "too_many_connections, read_timeout, write_timeout, request_too_large.",
            labels=["reason"],
        )
        for reason, count in sorted(node.metrics.endpoint_refusals().items()):
            endpoint.add_metric([reason], float(count))
        yield endpoint

    def _state(self, view: _StateView) -> Iterator[Metric]:
        node = self._node
        yield GaugeMetricFamily(
            "raftwal_state_revision",
            "Revision of this node's applied coordination state.",
            value=view.revision,
        )
        yield GaugeMetricFamily(
            "raftwal_leases", "Leases granted and not expired or revoked.", value=view.leases
        )
        yield GaugeMetricFamily(
            "raftwal_locks",
            "Lock keys held (exclusive or shared, by leases or broadcasts).",
            value=view.locks,
        )
        yield GaugeMetricFamily(
            "raftwal_broadcasts_pending",
            "Broadcasts not yet appended to and acknowledged by every target vchannel.",
            value=view.pending_broadcasts,
        )
        yield _count_by("raftwal_nodes", "Registered nodes by state.", NODE_STATES, view.nodes)
        yield _count_by("raftwal_pchannels", "pchannels by state.", PCHANNEL_STATES, view.pchannels)
        segments = GaugeMetricFamily(
            "raftwal_segments_committed",
            "Committed WAL segments in the manifest, by pchannel.",
            labels=["pchannel"],
        )
        segment_bytes = GaugeMetricFamily(
            "raftwal_segments_committed_bytes",
            "Bytes of the committed WAL segments in the manifest, by pchannel.",
            labels=["pchannel"],
        )
        for name, (count, size) in sorted(view.segments.items()):
            segments.add_metric([name], count)
            segment_bytes.add_metric([name], size)
        yield segments
        yield segment_bytes
        floor = GaugeMetricFamily(
            "raftwal_segments_retention_floor_lsn",
            "Retention floor of each pchannel: every LSN below it has been deleted.",
            labels=["pchannel"],
        )
        for name, lsn in sorted(view.retention_floors.items()):
            floor.add_metric([name], lsn)
        yield floor
        short = GaugeMetricFamily(
            "raftwal_pchannel_under_replicated",
            "1 for a placed pchannel whose replica set has fewer live replicas than it "
            "should (a replica on a DOWN node, or a set placed while nodes were missing), "
            "0 for the other placed pchannels.",
            labels=["pchannel"],
        )
        for name, flag in sorted(view.under_replicated.items()):
            short.add_metric([name], flag)
        yield short
        if node.is_leader():
            yield GaugeMetricFamily(
                "raftwal_broadcast_targets_failing",
                "On the leader: (broadcast, vchannel) targets whose last delivery attempt "
                "failed and that are waiting for a retry.",
                value=len(node.coordinator.broadcast_failures),
            )

    def _disk(self) -> Iterator[Metric]:
        try:
            usage = shutil.disk_usage(self._node.me.data_dir)
        except OSError:
            return
        yield GaugeMetricFamily(
            "raftwal_disk_total_bytes",
            "Size of the filesystem holding this node's data directory.",
            value=usage.total,
        )
        yield GaugeMetricFamily(
            "raftwal_disk_free_bytes",
            "Bytes available to this node on the filesystem of its data directory.",
            value=usage.free,
        )

    def _event_store(self) -> Iterator[Metric]:
        store = self._node.replica.store  # type: ignore[attr-defined]
        yield GaugeMetricFamily(
            "raftwal_event_store_events",
            "Events retained in this node's event store (events.db).",
            value=store.count(),
        )
        yield GaugeMetricFamily(
            "raftwal_event_store_bytes",
            "Size of events.db on disk, its SQLite write-ahead log included.",
            value=store.size_bytes(),
        )

    def _wal(self, view: _StateView) -> Iterator[Metric]:
        # A copy: owners are added and removed on the event loop thread.
        node = self._node
        plane = getattr(node, "plane", None)
        owners = sorted(dict(plane.owners).items()) if plane is not None else []
        serving = GaugeMetricFamily(
            "raftwal_wal_owner_serving",
            "1 for a pchannel this node owns and serves writes for, 0 while its owner "
            "recovers or after it was fenced.",
            labels=["pchannel"],
        )
        term = GaugeMetricFamily(
            "raftwal_wal_owner_term", "Term of this node's owner, by pchannel.", labels=["pchannel"]
        )
        last = GaugeMetricFamily(
            "raftwal_wal_last_lsn", "Last LSN appended by this node's owner.", labels=["pchannel"]
        )
        committed = GaugeMetricFamily(
            "raftwal_wal_committed_lsn",
            "LSN durable on a majority of the replica set (acknowledged writes end there).",
            labels=["pchannel"],
        )
        durable = GaugeMetricFamily(
            "raftwal_wal_replica_durable_lsn",
            "LSN each replica reported durable to this node's owner (the owner included).",
            labels=["pchannel", "replica"],
        )
        lag = GaugeMetricFamily(
            "raftwal_wal_replica_lag_entries",
            "Committed LSN minus the replica's durable LSN (0 when it holds everything "
            "committed), as this node's owner sees it.",
            labels=["pchannel", "replica"],
        )
        producers = GaugeMetricFamily(
            "raftwal_wal_producers",
            "Idempotent producers (producer_id) this node's owner remembers for the "
            "pchannel: a retry of their newest batches is answered as a duplicate.",
            labels=["pchannel"],
        )
        expired = CounterMetricFamily(
            "raftwal_wal_producers_expired",
            "Idempotent producers this node's owner forgot: idle past "
            "wal_producer_expiry_ms (timeout), or the least recently written past the "
            "per-pchannel bound (capacity). Counted since the owner took the pchannel.",
            labels=["pchannel", "reason"],
        )
        lag_seconds = GaugeMetricFamily(
            "raftwal_wal_replica_lag_seconds",
            "Age of the oldest committed entry the replica has not reported durable (0 when "
            "it holds everything committed), as this node's owner sees it.",
            labels=["pchannel", "replica"],
        )
        lagging = GaugeMetricFamily(
            "raftwal_wal_replica_lagging",
            "1 for a replica whose lag is past replica_lag_warn_ms: too slow for its owner "
            "(a slow disk or link); the majority acknowledges without it.",
            labels=["pchannel", "replica"],
        )
        warn_s = node.config.replica_lag_warn_ms / 1000
        for pchannel, owner in owners:
            committed_lsn = owner.committed_lsn
            serving.add_metric([pchannel], float(owner.serving))
            term.add_metric([pchannel], owner.term)
            last.add_metric([pchannel], owner.log.last_lsn)
            committed.add_metric([pchannel], committed_lsn)
            lags = owner.replica_lags_s()
            for replica, lsn in sorted(owner.replica_positions().items()):
                durable.add_metric([pchannel, replica], lsn)
                lag.add_metric([pchannel, replica], max(0, committed_lsn - lsn))
                behind_s = lags.get(replica, 0.0)
                lag_seconds.add_metric([pchannel, replica], behind_s)
                lagging.add_metric([pchannel, replica], float(behind_s > warn_s))
            producers.add_metric([pchannel], owner.producer_count())
            for reason, count in sorted(owner.producers_expired.items()):
                expired.add_metric([pchannel, reason], count)
        yield from (
            serving, term, last, committed, durable, lag, lag_seconds, lagging, producers,
            expired,
        )  # fmt: skip
        # Consumer lag where the committed LSN is known: on the owner of the pchannel. The
        # largest lag over the subscription's vchannels on that pchannel (a vchannel without
        # a committed position counts from 0, as DescribeSubscription does).
        committed_by_pchannel = {p: o.committed_lsn for p, o in owners}
        subscription_lag = GaugeMetricFamily(
            "raftwal_subscription_lag_entries",
            "Entries of the pchannel committed after the subscription's committed position "
            "(the largest over its vchannels on it), reported by the pchannel's owner.",
            labels=["subscription", "pchannel"],
        )
        for name, positions in sorted(view.subscriptions.items()):
            worst: dict[str, int] = {}
            for _vchannel, pchannel, lsn in positions:
                if pchannel in committed_by_pchannel:
                    behind = max(0, committed_by_pchannel[pchannel] - lsn)
                    worst[pchannel] = max(worst.get(pchannel, 0), behind)
            for pchannel, behind in sorted(worst.items()):
                subscription_lag.add_metric([name, pchannel], behind)
        yield subscription_lag
        # Cross-cluster replication lag, on the source pchannel's owner: its committed LSN
        # minus the last source LSN each target holds as recorded in Raft (recorded after
        # the target acknowledged, so this is an upper bound by at most one batch).
        replicate_lag = GaugeMetricFamily(
            "raftwal_replicate_lag_entries",
            "Committed LSNs of this owner's pchannel that a replication target does not hold "
            "yet (as recorded by the replicator), by pchannel and target cluster id.",
            labels=["pchannel", "target"],
        )
        # Where this node runs the replicator, its own figures (what the target
        # acknowledged, about a second ago) replace the recorded checkpoint's.
        # A data worker runs the replicators of the source pchannels it owns.
        replicators: _ReplicatorStatuses | None = getattr(self._node, "replicators", None)
        running = {
            (r.pchannel, r.target_cluster_id): r
            for r in (replicators.status() if replicators is not None else [])
        }
        for pchannel, targets in sorted(view.replicate_checkpoints.items()):
            if pchannel in committed_by_pchannel:
                for target, lsn in sorted(targets.items()):
                    if (pchannel, target) in running:
                        continue
                    behind = max(0, committed_by_pchannel[pchannel] - lsn)
                    replicate_lag.add_metric([pchannel, target], behind)
        for (pchannel, target), replicator in sorted(running.items()):
            replicate_lag.add_metric([pchannel, target], replicator.lag_entries)
        yield replicate_lag
        source_gap = GaugeMetricFamily(
            "raftwal_replicate_source_gap",
            "1 while the replicator of a source pchannel (on its owner) cannot send: the "
            "target needs entries that retention deleted here; 0 while it runs.",
            labels=["pchannel", "target"],
        )
        for (pchannel, target), replicator in sorted(running.items()):
            source_gap.add_metric([pchannel, target], float(replicator.state == SOURCE_GAP))
        yield source_gap
        # A target whose checkpoint does not match its source pchannel: from the
        # replicated state, the same on every node.
        mismatch = GaugeMetricFamily(
            "raftwal_replicate_checkpoint_mismatch",
            "1 while a replication target claims to hold more of this cluster's pchannel than "
            "it committed (the replicator refused that checkpoint and stopped), else 0, by "
            "pchannel and target cluster id.",
            labels=["pchannel", "target"],
        )
        for pchannel, targets in sorted(view.replicate_mismatches.items()):
            for target, claimed in sorted(targets.items()):
                mismatch.add_metric([pchannel, target], 1 if claimed else 0)
        yield mismatch
        yield from _replicator_metrics(running)


def _replicator_metrics(running: dict[tuple[str, str], api.ReplicatorStatus]) -> Iterator[Metric]:
    """The cross-cluster replicators this node runs, as each last measured itself."""
    labels = ["pchannel", "target"]
    lag_bytes = GaugeMetricFamily(
        "raftwal_replicate_lag_bytes",
        "Bytes, in the source's log, of the committed entries a replication target does not "
        "hold yet, by source pchannel and target cluster id (on the node running the "
        "replicator).",
        labels=labels,
    )
    lag_seconds = GaugeMetricFamily(
        "raftwal_replicate_lag_seconds",
        "Age of the oldest committed source entry a replication target does not hold yet "
        "(0 when caught up): the data a failover to the target now would lose is this old.",
        labels=labels,
    )
    applied = CounterMetricFamily(
        "raftwal_replicate_applied_entries",
        "Data entries a replication target acknowledged since the replicator started (its "
        "rate is the apply rate).",
        labels=labels,
    )
    applied_bytes = CounterMetricFamily(
        "raftwal_replicate_applied_bytes",
        "Key and payload bytes (64 more per entry) of the entries counted by "
        "raftwal_replicate_applied_entries.",
        labels=labels,
    )
    inflight = GaugeMetricFamily(
        "raftwal_replicate_inflight_batches",
        "Target batches the replicator sent and the target has not acknowledged yet.",
        labels=labels,
    )
    keeping_up = GaugeMetricFamily(
        "raftwal_replicate_keeping_up",
        "0 while the replicator cannot keep up (its lag grows and is at least 5 s old) or "
        "is stalled retrying; else 1.",
        labels=labels,
    )
    for (pchannel, target), replicator in sorted(running.items()):
        key = [pchannel, target]
        lag_bytes.add_metric(key, replicator.lag_bytes)
        lag_seconds.add_metric(key, replicator.lag_s)
        applied.add_metric(key, replicator.applied_entries)
        applied_bytes.add_metric(key, replicator.applied_bytes)
        inflight.add_metric(key, replicator.inflight_batches)
        keeping_up.add_metric(key, float(replicator.keeping_up))
    yield from (lag_bytes, lag_seconds, applied, applied_bytes, inflight, keeping_up)


class _StateView(NamedTuple):
    """What a scrape copies out of the applied state (under the replica's apply lock)."""

    revision: int
    leases: int
    locks: int
    pending_broadcasts: int
    nodes: list[int]
    pchannels: list[int]
    # pchannel -> (committed segments, their bytes)
    segments: dict[str, tuple[int, int]]
    # pchannel -> deleted_before_lsn
    retention_floors: dict[str, int]
    # placed pchannel -> 1 when under-replicated, else 0
    under_replicated: dict[str, int]
    # subscription -> [(vchannel, pchannel, committed position LSN)]
    subscriptions: dict[str, list[tuple[str, str, int]]]
    # source pchannel -> {target cluster id: last source LSN the target holds, as recorded}
    replicate_checkpoints: dict[str, dict[str, int]]
    # source pchannel -> {target cluster id: the mismatched checkpoint it claims, or 0}
    replicate_mismatches: dict[str, dict[str, int]]

    @classmethod
    def of(cls, state: pb.CoordinationState) -> _StateView:
        return cls(
            revision=state.revision,
            leases=len(state.leases),
            locks=len(state.locks),
            pending_broadcasts=sum(
                1 for t in state.broadcasts.values() if t.state == pb.BROADCAST_STATE_PENDING
            ),
            nodes=[n.state for n in state.nodes.values()],
            pchannels=[c.state for c in state.pchannels.values()],
            segments={
                name: (len(m.segments), sum(s.bytes for s in m.segments))
                for name, m in state.manifests.items()
            },
            retention_floors={name: m.deleted_before_lsn for name, m in state.manifests.items()},
            under_replicated=_under_replicated_flags(state),
            subscriptions={
                name: [
                    (
                        vchannel,
                        state.vchannels[vchannel].pchannel,
                        sub.positions[vchannel].lsn if vchannel in sub.positions else 0,
                    )
                    for vchannel in sub.vchannels
                    if vchannel in state.vchannels
                ]
                for name, sub in state.subscriptions.items()
            },
            replicate_checkpoints={
                pchannel: dict(checkpoints.source_lsns)
                for pchannel, checkpoints in state.replicate_checkpoints.items()
            },
            replicate_mismatches=_replicate_mismatches(state),
        )


def _replicate_mismatches(state: pb.CoordinationState) -> dict[str, dict[str, int]]:
    """Every pair this cluster replicates -> the mismatched checkpoint its target claims
    (0: none), so that the gauge has a sample per pair to alert on."""
    out: dict[str, dict[str, int]] = {}
    for pchannel, target in replicated_pairs(
        state.replicate_configuration, state.replicate_cluster_id
    ):
        checkpoints = state.replicate_checkpoints.get(pchannel)
        claimed = checkpoints.mismatched_lsns.get(target, 0) if checkpoints else 0
        out.setdefault(pchannel, {})[target] = claimed
    return out


def _under_replicated_flags(state: pb.CoordinationState) -> dict[str, int]:
    pchannels = list(state.pchannels.values())
    short = {u.pchannel for u in under_replicated(pchannels, list(state.nodes.values()))}
    return {
        c.name: int(c.name in short)
        for c in pchannels
        if c.replica_node_ids and c.state != pb.PCHANNEL_STATE_DROPPED
    }


def _count_by(
    name: str, documentation: str, names: dict[int, str], values: Iterable[int]
) -> GaugeMetricFamily:
    """A gauge family with one sample per enum state (zeros included, so that an alert on
    ``raftwal_nodes{state="DOWN"} > 0`` has a series to evaluate)."""
    family = GaugeMetricFamily(name, documentation, labels=["state"])
    counts = dict.fromkeys(sorted(v for v in names if v != 0), 0)
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    for value, count in counts.items():
        family.add_metric([names.get(value, str(value))], count)
    return family


__all__ = ["NodeMetrics", "error_code_name"]
