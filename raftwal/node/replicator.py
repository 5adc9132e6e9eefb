"""Cross-cluster replication on the source: one replicator per owned source pchannel and
target (docs/replication.md, section 2).

``Replicators.run`` keeps, on this node, one task per (pchannel, owner term, target
cluster) for every pchannel this node serves as owner that the replication configuration
names as a source: a new term, a new configuration or the loss of ownership stops the
task, and the next round starts the right ones. A task (``_Replicator``) reads the pchannel's
**committed** log from the local owner and appends its data entries to the target
cluster's matching pchannel as the idempotent, contiguous producer
``rw.replicate/<cluster>/<pchannel>``: sequence = the source LSN of the batch's last
entry, previous_sequence = the sequence of the batch before it (the first one after a
start: the target's checkpoint, read with ``GetReplicateCheckpoint``). Several batches are
in flight at once (a pipeline bounded in batches and bytes) over one Produce stream to the
target owner, on its transfer port where it offers one; answers are taken in order, and
the checkpoint moves only over the prefix the target acknowledged. A batch that does not
continue the target's sequence is refused there (INVALID_REQUEST_SEQ); any failure ends
the pipeline and the task re-reads the checkpoint: so two replicators (an old owner not
yet stopped, a new one) can never both write, and a restart resumes exactly after what
the target holds. Each task measures itself about once a second (lag in entries, bytes
and seconds, apply and commit rates; ``Replicators.status``) and says in one line when it
cannot keep up or is stalled.

Replicated: data entries with their vchannel, type, key, payload and properties (minus
the source's own ``rw.`` bookkeeping); a committed transaction as one batch with its begin
and commit markers (the target writes them under a transaction id of its own); broadcast
entries as entries of their vchannel; the creation of vchannels (before their first entry
is sent) and their removal (once every entry before it is replicated), through the
target's Coordinator, which needs the target token's role to be admin. Not replicated:
the source's term starts, seal markers and idle time ticks.
Every retry is bounded in rate (``RETRY_MAX_S``) and logged.

A target that needs entries the source no longer holds (its checkpoint is below the
source's first retained LSN: a standby attached after retention deleted the start of the
log, or one restored from an old backup) cannot be served: the replicator says so (state
``source_gap`` in ``status()``, which ``raftwal replicate status``, ClusterStatus's
warnings and the metric ``raftwal_replicate_source_gap`` show), sends nothing, and looks
again every ``SOURCE_GAP_RECHECK_S``. It never skips the missing entries by itself, and
never retries a read of deleted entries in a loop.

A target checkpoint above this pchannel's committed LSN does not match the source (the
target holds entries this pchannel never committed: a forged batch, or a source restored
from an older copy). The replicator refuses it: it neither records it in Raft (it would
become the retention hold, and entries the target never received could be deleted) nor
continues from it (the entries after it would never be sent). It reports the claim with
``RecordReplicateCheckpoint.target_claims_lsn`` instead (``raftwal replicate status``,
``raftwal status`` and ``raftwal_replicate_checkpoint_mismatch`` show it), logs an error
and reads the checkpoint again every ``MISMATCH_RECHECK_S``; once it matches, the next
record clears the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from raftwal.services.backend import DataViewSnapshot
from raftwal.services.replicated import RESERVED_PREFIX, producer_id
from rpc.aio import Signal
from rpc.credentials import ClientSecurity, CredentialsError
from rpc.errors import RaftwalError, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.streaming.producer import ProducerStats, ProduceStream, StreamBroken
from rpc.streaming.routing import StreamingClientBase
from statemachine.replicate import local_cluster, start_after, switching_to
from wal_segments.format import (
    ENTRY_HEADER_SIZE,
    MSG_TYPE_NAMES,
    EntryFlags,
    FormatError,
    MsgType,
    decode_properties,
    frame_headers,
)
from wal_segments.log import LogError
from wal_segments.owner import TICK_LOGICAL_BITS, ChannelOwner

log = logging.getLogger(__name__)
E = errors_pb2

#: How often the set of replicators is compared with the configuration and ownership.
REFRESH_S = 0.5
#: How often an idle replicator looks for newly committed entries.
IDLE_POLL_S = 0.05
#: Bounds of one target batch (the target takes up to 10,000 messages a batch).
MAX_BATCH_MESSAGES = 4096
MAX_BATCH_BYTES = 4 << 20
#: The pipeline: target batches sent and not yet acknowledged, per (pchannel, target),
#: bounded in batches and in bytes (a batch counts its keys and payloads, 64 bytes more a
#: message). The bytes bound what a WAN link can hold in flight: its bandwidth-delay
#: product, e.g. 100 MB/s x 50 ms = 5 MB (docs/replication.md, "The pipeline"). The
#: target serves up to 64 requests of a stream at once.
MAX_INFLIGHT_BATCHES = 16
MAX_INFLIGHT_BYTES = 16 << 20
#: With this many batches in flight, the next is sent only once FULL_BATCH_LSNS entries
#: are committed after what was sent, or an answer came: fewer, larger batches under load,
#: a batch at once when the pipeline is short.
EAGER_BATCHES = 2
FULL_BATCH_LSNS = 256
#: How often a replicator with EAGER_BATCHES in flight looks whether a full batch's worth
#: is committed (instead of waking at every commit).
LINGER_S = 0.005
#: How often a replicator publishes its status (lag, rates), and the window its rates and
#: its "is the backlog growing" verdict are measured over.
STATUS_EVERY_S = 1.0
RATE_WINDOW_S = 30.0
#: A replicator whose lag is this old and grew over the window (or that is retrying with
#: it) cannot keep up: its status says so in one line, logged at most every WARN_EVERY_S.
BEHIND_LAG_S = 5.0
WARN_EVERY_S = 60.0
#: Flow control (ClusterConfig.replicate_max_lag_ms): a write held because the target lags
#: looks again at least this often, and a target that acknowledged nothing for
#: FLOW_STALLED_S is not waited for (a standby that is down must not stop the source).
FLOW_POLL_S = 0.05
FLOW_STALLED_S = 2.0
#: How often a replicator reads the replication configuration again (a switchover's
#: pause is seen within this).
CONFIGURATION_EVERY_S = 0.1
#: A transaction is one target batch: larger than MAX_BATCH_BYTES, it is read whole with
#: this bound (above the WAL's transaction limit).
MAX_TXN_READ_BYTES = 40 << 20
#: Retry backoff after a failed call to the target, doubling up to RETRY_MAX_S.
RETRY_MIN_S = 0.1
RETRY_MAX_S = 5.0
CALL_TIMEOUT_S = 10.0
#: How often a replicator reports its target's checkpoint to Raft (the retention hold),
#: at most: retention runs every few seconds, and every report is a Raft entry.
RECORD_EVERY_S = 1.0
#: How often an idle replicator compares the target's vchannels with the source's.
VCHANNEL_SYNC_S = 2.0
#: How often a replicator whose target needs entries the source no longer holds reads
#: the target's checkpoint again (an operator may have restored or reset the target).
SOURCE_GAP_RECHECK_S = 10.0
SOURCE_GAP = "source_gap"
CHECKPOINT_MISMATCH = "checkpoint_mismatch"
#: How often a replicator that found the target's checkpoint above the source's
#: committed LSN reads it again.
MISMATCH_RECHECK_S = 2.0
_SKIPPED_FLAGS = int(EntryFlags.TERM_START | EntryFlags.SEAL_MARKER)
# A committed transaction's begin and commit markers are sent (the target writes them as
# its own, services/replicated.py:with_transactions); the source's control entries not.
_SKIPPED_TYPES = frozenset({MsgType.TERM_START, MsgType.SEAL, MsgType.TIME_TICK})
_RETRY_CODES = frozenset(
    {E.NOT_OWNER, E.CHANNEL_FENCED, E.UNAVAILABLE, E.ON_SHUTDOWN, E.NOT_LEADER, E.UNKNOWN}
)


class ReplicatorHost(Protocol):
    """What the replicators need from the node."""

    @property
    def cluster_id(self) -> str: ...

    @property
    def max_lag_s(self) -> float:
        """Flow control's bound (ClusterConfig.replicate_max_lag_ms; 0: off)."""
        ...

    def replicate_configuration(self) -> pb.ReplicateConfiguration:
        """The applied replication configuration (a copy)."""
        ...

    def serving_owner(self, pchannel: str) -> ChannelOwner | None:
        """This node's owner of `pchannel`, if it has one."""
        ...

    def view(self) -> DataViewSnapshot:
        """The node's data view (vchannel ids to names, pchannels), refreshed."""
        ...

    async def record_checkpoint(
        self,
        pchannel: str,
        target_cluster_id: str,
        lsn: int,
        drained_through_lsn: int = 0,
        target_claims_lsn: int = 0,
    ) -> None:
        """Propose RecordReplicateCheckpoint (the retention hold, during a switchover the
        drain, and a target checkpoint that does not match the source); raises
        RaftwalError."""
        ...


@dataclass(frozen=True)
class _Edge:
    pchannel: str
    term: int
    target: pb.ReplicateCluster
    target_pchannel: str

    @property
    def key(self) -> tuple[str, int, str, bytes]:
        return (
            self.pchannel,
            self.term,
            self.target_pchannel,
            self.target.SerializeToString(deterministic=True),
        )


def desired_edges(
    configuration: pb.ReplicateConfiguration,
    cluster_id: str,
    serving_terms: dict[str, int],
) -> list[_Edge]:
    """The replicators this node should run: for each edge from this cluster, each of its
    pchannels this node serves (at the given terms), paired by position with the target's."""
    local = local_cluster(configuration, cluster_id) if cluster_id else None
    if local is None:
        return []
    edges = []
    for edge in configuration.topology:
        if edge.source_cluster_id != cluster_id:
            continue
        target = local_cluster(configuration, edge.target_cluster_id)
        if target is None or len(target.pchannels) != len(local.pchannels):
            continue
        for index, pchannel in enumerate(local.pchannels):
            if pchannel in serving_terms:
                edges.append(
                    _Edge(pchannel, serving_terms[pchannel], target, target.pchannels[index])
                )
    return edges


def cluster_security(cluster: pb.ReplicateCluster) -> ClientSecurity:
    """How to call `cluster`: its configured token, and TLS with its CA when it has one.
    Raises CredentialsError for an unusable token."""
    pem = cluster.credentials.ca_certificate_pem
    return ClientSecurity(
        token=cluster.credentials.token or None,
        tls=bool(pem),
        root_certificates=pem.encode() if pem else None,
    )


@dataclass
class _Batch:
    messages: list[wire.Message]
    lsns: list[int]
    ticks: list[int]
    # The last source LSN looked at (data or not): where the next scan starts.
    scanned_through: int
    # The read ended inside a transaction with nothing before it: read more next time.
    cut_transaction: bool = False
    # Key and payload bytes of `messages`, plus a fixed 64 per message (what the window
    # counts).
    size: int = 0


def next_batch(
    owner: ChannelOwner,
    after: int,
    committed: int,
    names: dict[int, str],
    max_bytes: int = MAX_BATCH_BYTES,
) -> _Batch:
    """The data entries of `owner`'s log after `after` through `committed`, at most one
    batch's worth (`max_bytes` read), never ending inside a transaction. Built from the
    frames' fixed headers (crc-checked, as Consume reads them): no `Entry` per entry."""
    data = owner.log.read_frames(after + 1, max_bytes, committed)
    batch = _Batch([], [], [], after)
    if not data:
        return batch
    size = 0
    txn_start: int | None = None  # index in batch.messages where an open txn's body starts
    txn_size = 0  # `size` before that transaction
    type_names: dict[int, str] = {}
    for offset, fields in frame_headers(data):
        properties_len, lsn, time_tick, vchannel_id = fields[1], fields[2], fields[4], fields[5]
        msg_type, flags, key_len, payload_len = fields[8], fields[10], fields[11], fields[12]
        if lsn > committed:
            break
        if msg_type == MsgType.TXN_BEGIN:
            txn_start, txn_size = len(batch.messages), size
        if msg_type == MsgType.TXN_COMMIT:
            txn_start = None
        if vchannel_id and vchannel_id not in names:
            # A vchannel this node's view does not know yet: stop before it (the caller
            # tries again once the view has caught up), never skip it.
            break
        skipped = msg_type in _SKIPPED_TYPES or flags & _SKIPPED_FLAGS or not vchannel_id
        if not skipped:
            key_start = offset + ENTRY_HEADER_SIZE
            payload_start = key_start + key_len
            properties_start = payload_start + payload_len
            type_name = type_names.get(msg_type)
            if type_name is None:
                type_name = type_names[msg_type] = MSG_TYPE_NAMES.get(msg_type, "message")
            message = wire.Message(
                vchannel=names[vchannel_id],
                msg_type=type_name,
                key=data[key_start:payload_start],
                payload=data[payload_start:properties_start],
            )
            if properties_len:
                properties = decode_properties(
                    data[properties_start : properties_start + properties_len]
                )
                message.properties.update(
                    {k: v for k, v in properties.items() if not k.startswith(RESERVED_PREFIX)}
                )
            batch.messages.append(message)
            batch.lsns.append(lsn)
            batch.ticks.append(time_tick)
            size += 64 + key_len + payload_len
        if txn_start is None:
            batch.scanned_through = lsn
            if len(batch.messages) >= MAX_BATCH_MESSAGES or size >= MAX_BATCH_BYTES:
                break
    if txn_start is not None:
        # The range ended inside a transaction: send it whole next time.
        del batch.messages[txn_start:], batch.lsns[txn_start:], batch.ticks[txn_start:]
        batch.cut_transaction = not batch.messages
        size = txn_size
    batch.size = size
    return batch


@dataclass
class _Sent:
    """A batch of the pipeline: sent to the target (`future`: its answer), or one that held
    no data (`future` None: done once every batch before it is)."""

    batch: _Batch
    future: asyncio.Future[wire.ProduceResult] | None
    sent_at: float


class Replicators:
    def __init__(self, host: ReplicatorHost) -> None:
        self._host = host
        self._tasks: dict[tuple[str, int, str, bytes], asyncio.Task[None]] = {}
        self._replicators: dict[tuple[str, int, str, bytes], _Replicator] = {}

    async def run(self, stopping: asyncio.Event) -> None:
        try:
            while not stopping.is_set():
                try:
                    self._reconcile()
                except Exception:  # noqa: BLE001 - logged; the next round retries
                    log.exception("replicators: reconcile failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), REFRESH_S)
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self._tasks.clear()
            self._replicators.clear()

    def _reconcile(self) -> None:
        host = self._host
        view = host.view()
        serving: dict[str, int] = {}
        for pchannel in sorted(view.pchannels):
            owner = host.serving_owner(pchannel)
            if owner is not None and owner.serving:
                serving[pchannel] = owner.term
        wanted = {
            e.key: e
            for e in desired_edges(host.replicate_configuration(), host.cluster_id, serving)
        }
        for key in [k for k in self._tasks if k not in wanted or self._tasks[k].done()]:
            self._tasks.pop(key).cancel()
            self._replicators.pop(key, None)
        for key, edge in wanted.items():
            if key not in self._tasks:
                replicator = _Replicator(host, edge)
                self._replicators[key] = replicator
                self._tasks[key] = asyncio.create_task(
                    replicator.run(), name=f"replicate-{edge.pchannel}"
                )

    def running(self) -> list[str]:
        return sorted(f"{k[0]}@{k[1]}->{k[2]}" for k in self._tasks)

    def status(self) -> list[api.ReplicatorStatus]:
        """Each running replicator as it last measured itself (copies; safe to read from
        any thread: a replicator swaps in a new message, never changes one it published)."""
        out = []
        # list(): one step under the GIL, so a scrape thread never sees the dict change.
        for _, replicator in sorted(list(self._replicators.items())):
            published = replicator.published
            copy = api.ReplicatorStatus()
            copy.CopyFrom(published)
            out.append(copy)
        return out


def _size(value: float) -> str:
    """`value` bytes for a person: 12.3 MB."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def verdict(status: api.ReplicatorStatus, backlog_grew: bool, quiet_s: float) -> str:
    """The one line a replicator that cannot keep up says (empty when it keeps up), once
    its lag is at least BEHIND_LAG_S old: it is retrying, or the target acknowledged
    nothing for `quiet_s` >= BEHIND_LAG_S (stalled), or the lag grew over the measuring
    window (too slow)."""
    if status.state == CHECKPOINT_MISMATCH:
        return (
            f"replication of pchannel {status.pchannel} to cluster {status.target_cluster_id} "
            "is stopped: the target claims more of this pchannel than it committed (its "
            "checkpoint does not match; see `raftwal replicate status`)"
        )
    if status.state == SOURCE_GAP:
        return (
            f"replication of pchannel {status.pchannel} to cluster {status.target_cluster_id} "
            f"is stopped: the target needs source LSN {status.needed_lsn} and the source "
            f"holds only LSN {status.source_first_lsn} and later (see `raftwal replicate "
            "status`)"
        )
    if status.lag_s < BEHIND_LAG_S:
        return ""
    where = (
        f"replication of pchannel {status.pchannel} to {status.target_cluster_id}/"
        f"{status.target_pchannel}"
    )
    behind = (
        f"{status.lag_entries} entries ({_size(status.lag_bytes)}, {status.lag_s:.1f} s) behind"
    )
    if status.state == "retrying":
        return f"{where} is stalled: {status.last_error or 'retrying'}; {behind}"
    if quiet_s >= BEHIND_LAG_S:
        return (
            f"{where} is stalled: the target acknowledged nothing for {quiet_s:.0f} s "
            f"({status.inflight_batches} batches in flight); {behind}"
        )
    if backlog_grew:
        return (
            f"{where} cannot keep up: the source commits {status.commit_rate_entries_s:.0f} "
            f"entries/s, the target applies {status.apply_rate_entries_s:.0f}/s; {behind} "
            "and growing"
        )
    return ""


class CheckpointMismatch(Exception):
    """The target claims to hold more of this pchannel than it committed."""

    def __init__(self, claimed_lsn: int, committed_lsn: int) -> None:
        super().__init__(
            f"the target claims to hold source LSN {claimed_lsn}, above this pchannel's "
            f"committed LSN {committed_lsn}"
        )
        self.claimed_lsn = claimed_lsn
        self.committed_lsn = committed_lsn


class SourceGap(Exception):
    """The target needs source entries that retention deleted."""

    def __init__(self, needed_lsn: int, first_lsn: int) -> None:
        super().__init__(
            f"the target needs source LSN {needed_lsn}, but the source holds only LSN "
            f"{first_lsn} and later (retention deleted the rest)"
        )
        self.needed_lsn = needed_lsn
        self.first_lsn = first_lsn


class _Replicator:
    """One (source pchannel, owner term, target): reads the committed log, keeps a
    pipeline of target batches in flight over one Produce stream, advances the checkpoint
    over what the target acknowledged, in order, and measures itself (``published``)."""

    def __init__(self, host: ReplicatorHost, edge: _Edge) -> None:
        self.host = host
        self.edge = edge
        self.producer = producer_id(host.cluster_id, edge.pchannel)
        # The last source LSN the target holds (acknowledged), read from the target after
        # any failure (None: to be read).
        self.checkpoint: int | None = None
        # Source LSNs read and sent (`scanned`), and read and acknowledged (`confirmed`):
        # every data entry through `confirmed` is on the target.
        self.scanned = 0
        self.confirmed = 0
        # The LSN the edge starts after (a reversed edge's: what the target wrote itself).
        self.start = 0
        self.inflight: deque[_Sent] = deque()
        self.inflight_bytes = 0
        self.applied_entries = 0
        self.applied_bytes = 0
        self.last_error = ""
        self.retrying = False
        # (needed LSN, the source's first LSN) while the target needs entries the source
        # no longer holds (SOURCE_GAP), else None.
        self.gap: tuple[int, int] | None = None
        # The mismatched checkpoint (above the source's committed LSN) the target claims,
        # as this replicator last reported it to Raft (0: none).
        self.claimed = 0
        # (monotonic time, committed LSN, confirmed LSN, applied bytes), one a second, over
        # the last RATE_WINDOW_S: the rates and whether the backlog grows.
        self.samples: deque[tuple[float, int, int, int]] = deque()
        self.measured_at = float("-inf")
        self.warned_at = float("-inf")
        # When the target last acknowledged a batch (or the replicator started).
        self.acked_at = time.monotonic()
        # Flow control (`admit`): set whenever `confirmed` moves; writes held, and for how
        # long in all (seconds), since the replicator started.
        self.moved = Signal()
        self.held_writes = 0
        self.held_s = 0.0
        self.flow_logged_at = float("-inf")
        self.published = api.ReplicatorStatus(
            pchannel=edge.pchannel,
            term=edge.term,
            target_cluster_id=edge.target.cluster_id,
            target_pchannel=edge.target_pchannel,
            state="starting",
            keeping_up=True,
        )
        self.stats = ProducerStats()
        self.port_unreachable: dict[str, float] = {}
        # The checkpoint report to Raft in progress (never two at once), and what it says.
        self.recording: asyncio.Task[None] | None = None
        # -1: nothing recorded by this replicator yet, so its first record (which carries
        # no mismatch) also clears a mismatch an earlier replicator of the pair reported.
        self.recorded = -1
        self.recorded_at = 0.0
        # During a switchover to this target: the LSN no client write of the pchannel can
        # follow (None: no pause, or not known yet), and whether the drain was recorded.
        self.drain_lsn: int | None = None
        self.drain_recorded = False
        # The target pchannel's vchannels as last synchronized, and when.
        self.target_vchannels: set[str] | None = None
        self.synced_at = 0.0
        self.configuration = pb.ReplicateConfiguration()
        self.configuration_at = float("-inf")

    @property
    def room(self) -> bool:
        return (
            len(self.inflight) < MAX_INFLIGHT_BATCHES and self.inflight_bytes < MAX_INFLIGHT_BYTES
        )

    async def run(self) -> None:
        edge = self.edge
        try:
            security = cluster_security(edge.target)
        except CredentialsError as error:
            log.warning(
                "replicate %s: unusable credentials of the target (%s)", edge.pchannel, error
            )
            return
        log.info(
            "replicate %s (term %d) -> %s/%s: started",
            edge.pchannel,
            edge.term,
            edge.target.cluster_id,
            edge.target_pchannel,
        )
        backoff = RETRY_MIN_S
        stream: ProduceStream | None = None
        # The owner whose writes this replicator's flow control holds (None: none).
        gated: ChannelOwner | None = None
        async with StreamingClientBase(list(edge.target.endpoints), security=security) as client:
            try:
                while True:
                    owner = self.host.serving_owner(edge.pchannel)
                    if owner is None or not owner.serving or owner.term != edge.term:
                        return  # no longer the owner at this term: the next round decides
                    bound_s = self.host.max_lag_s
                    if bound_s > 0 and owner is not gated:
                        if gated is not None:
                            gated.remove_admission(self)
                        owner.add_admission(self, functools.partial(self.admit, owner, bound_s))
                        gated = owner
                    address, term = "", 0
                    try:
                        route = await client.router.owner(edge.target_pchannel, CALL_TIMEOUT_S)
                        address, term = route.owner_address, route.term
                        if (
                            stream is None
                            or stream.failure is not None
                            or stream.address != address
                        ):
                            if stream is not None:
                                await stream.close()
                            stream = ProduceStream(
                                client.stub(address),
                                address,
                                client.transfer_tls,
                                self.stats,
                                self.port_unreachable,
                            )
                        if self.checkpoint is None:
                            await self._read_checkpoint(client.stub(address), owner)
                        await self._step(client, stream, owner)
                        if self.retrying:
                            self.retrying, self.last_error = False, ""
                        if self.gap is not None:
                            log.info(
                                "replicate %s -> %s: running again",
                                edge.pchannel,
                                edge.target.cluster_id,
                            )
                            self.gap = None
                        backoff = RETRY_MIN_S
                    except asyncio.CancelledError:
                        raise
                    except CheckpointMismatch as mismatch:
                        # Refused (the module doc), reported once per claim, read again
                        # later: neither recorded as the retention hold nor continued from.
                        if self.claimed != mismatch.claimed_lsn:
                            log.error(
                                "replicate %s -> %s/%s: %s: its checkpoint does not match "
                                "this cluster; not recorded, nothing sent until it matches "
                                "(docs/replication.md)",
                                edge.pchannel,
                                edge.target.cluster_id,
                                edge.target_pchannel,
                                mismatch,
                            )
                            await self.host.record_checkpoint(
                                edge.pchannel,
                                edge.target.cluster_id,
                                0,
                                target_claims_lsn=mismatch.claimed_lsn,
                            )
                            self.claimed = mismatch.claimed_lsn
                        self._reset()
                        self._measure(owner, force=True)
                        await asyncio.sleep(MISMATCH_RECHECK_S)
                    except SourceGap as gap:
                        if self.gap is None:
                            log.error(
                                "replicate %s -> %s/%s stopped: %s; restore the target from "
                                "a backup that holds it, or see docs/replication.md (checking "
                                "again every %.0f s)",
                                edge.pchannel,
                                edge.target.cluster_id,
                                edge.target_pchannel,
                                gap,
                                SOURCE_GAP_RECHECK_S,
                            )
                        self.gap = (gap.needed_lsn, gap.first_lsn)
                        self._reset()
                        self._measure(owner, force=True)
                        await asyncio.sleep(SOURCE_GAP_RECHECK_S)
                    except (RaftwalError, grpc.RpcError, StreamBroken) as error:
                        info = (
                            error.info
                            if isinstance(error, (RaftwalError, StreamBroken))
                            else from_rpc_error(error)
                        )
                        self._reset()
                        if info.code == E.INVALID_REQUEST_SEQ:
                            # Someone else moved the target (an earlier owner's replicator),
                            # or a batch of the pipeline failed before this one: continue
                            # from what the target holds.
                            log.info(
                                "replicate %s: %s; re-reading the checkpoint",
                                edge.pchannel,
                                info.message,
                            )
                            continue
                        self._failed(f"{E.ErrorCode.Name(info.code)}: {info.message}", owner)
                        if info.code in _RETRY_CODES or isinstance(error, StreamBroken):
                            client.router.report_failure(edge.target_pchannel, address, term, info)
                        else:
                            log.warning(
                                "replicate %s -> %s/%s: %s: %s (retrying in %.1f s)",
                                edge.pchannel,
                                edge.target.cluster_id,
                                edge.target_pchannel,
                                E.ErrorCode.Name(info.code),
                                info.message,
                                backoff,
                            )
                        if stream is not None:
                            await stream.close()
                            stream = None
                        await asyncio.sleep(backoff)
                        backoff = min(RETRY_MAX_S, backoff * 2)
                    except Exception as error:  # noqa: BLE001 - grpc errors and the like: retried
                        log.warning(
                            "replicate %s -> %s: %s (retrying in %.1f s)",
                            edge.pchannel,
                            edge.target.cluster_id,
                            error,
                            backoff,
                        )
                        self._reset()
                        self._failed(repr(error)[:300], owner)
                        if address:
                            client.router.report_failure(edge.target_pchannel, address, term)
                        if stream is not None:
                            await stream.close()
                            stream = None
                        await asyncio.sleep(backoff)
                        backoff = min(RETRY_MAX_S, backoff * 2)
            finally:
                if gated is not None:
                    gated.remove_admission(self)
                if stream is not None:
                    await stream.close()
                if self.recording is not None:
                    self.recording.cancel()

    def flowing(self) -> bool:
        """Whether the target takes batches now: flow control waits only for such a one."""
        return (
            not self.retrying
            and self.gap is None
            and not self.claimed
            and time.monotonic() - self.acked_at < FLOW_STALLED_S
        )

    async def admit(self, owner: ChannelOwner, bound_s: float) -> None:
        """Flow control (an owner's admission check, `ChannelOwner.add_admission`): hold a
        client write while the oldest committed entry the target does not hold is older
        than `bound_s`, as long as the target keeps acknowledging. What it waits for is
        the target's answers, never this owner's writes."""
        started = None
        try:
            while owner.commit_age_s(self.confirmed) > bound_s and self.flowing():
                if started is None:
                    started = time.monotonic()
                    self.held_writes += 1
                    if started - self.flow_logged_at >= WARN_EVERY_S:
                        self.flow_logged_at = started
                        log.info(
                            "replicate %s -> %s/%s: holding client writes while the target "
                            "lags %.1f s behind (replicate_max_lag_ms: %.0f ms; %d writes held "
                            "so far, %.1f s in all)",
                            self.edge.pchannel,
                            self.edge.target.cluster_id,
                            self.edge.target_pchannel,
                            owner.commit_age_s(self.confirmed),
                            bound_s * 1000,
                            self.held_writes,
                            self.held_s,
                        )
                await self.moved.wait_within(FLOW_POLL_S)
        finally:
            if started is not None:
                self.held_s += time.monotonic() - started

    def _reset(self) -> None:
        """Forget the pipeline: what it sent may or may not be on the target, which the
        next checkpoint read tells."""
        for sent in self.inflight:
            if sent.future is not None:
                sent.future.cancel()
        self.inflight.clear()
        self.inflight_bytes = 0
        self.checkpoint = None

    def _failed(self, error: str, owner: ChannelOwner) -> None:
        self.retrying, self.last_error = True, error
        self._measure(owner, force=True)

    async def _read_checkpoint(self, stub, owner: ChannelOwner) -> None:  # type: ignore[no-untyped-def]
        edge = self.edge
        answer = await stub.GetReplicateCheckpoint(
            wire.GetReplicateCheckpointRequest(
                pchannel=edge.target_pchannel,
                source_cluster_id=self.host.cluster_id,
                source_pchannel=edge.pchannel,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        if answer.source_lsn > owner.committed_lsn:
            raise CheckpointMismatch(answer.source_lsn, owner.committed_lsn)
        if self.claimed:
            log.warning(
                "replicate %s -> %s: the target's checkpoint matches again (source LSN %d)",
                edge.pchannel,
                edge.target.cluster_id,
                answer.source_lsn,
            )
            # The next record, though it adds nothing, clears the reported mismatch.
            self.claimed, self.recorded = 0, -1
        self._reset()
        self.checkpoint = answer.source_lsn
        # After a switchover reversed the edge, the target holds this pchannel's entries
        # through `start` already (it wrote them).
        self.start = start_after(
            self._configuration(force=True),
            self.host.cluster_id,
            edge.target.cluster_id,
            edge.pchannel,
        )
        self.scanned = self.confirmed = max(self.checkpoint, self.start)

    def _configuration(self, force: bool = False) -> pb.ReplicateConfiguration:
        now = time.monotonic()
        if force or now - self.configuration_at >= CONFIGURATION_EVERY_S:
            self.configuration = self.host.replicate_configuration()
            self.configuration_at = now
        return self.configuration

    async def _step(
        self, client: StreamingClientBase, stream: ProduceStream, owner: ChannelOwner
    ) -> None:
        """One round: the bookkeeping, as many batches as the window takes, the answers
        that came, and one wait (for an answer, newly committed entries or the time)."""
        await self._housekeeping(owner)
        progressed = await self._fill(client, stream, owner)
        self._settle()
        if self.inflight and self.inflight[0].future is not None:
            head = self.inflight[0]
            assert head.future is not None
            left = head.sent_at + CALL_TIMEOUT_S - time.monotonic()
            if left <= 0:
                raise RaftwalError(
                    E.ErrorInfo(
                        code=E.UNAVAILABLE,
                        message=f"the target did not answer a batch within {CALL_TIMEOUT_S:g} s",
                    )
                )
            waiters: list[asyncio.Future[Any]] = [head.future]
            change = None
            timeout = min(left, STATUS_EVERY_S)
            if self.room and self._data_batches_in_flight() < EAGER_BATCHES:
                # A short pipeline: newly committed entries go at once.
                change = asyncio.ensure_future(owner.wait_commit_change(min(left, IDLE_POLL_S)))
                waiters.append(change)
            elif self.room:
                # Batches in flight already: the next waits for an answer or a full batch's
                # worth, looked at every LINGER_S (not at every commit).
                timeout = min(timeout, LINGER_S)
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if change is not None:
                    change.cancel()
            self._settle()
        elif not self.inflight and self.scanned >= owner.committed_lsn:
            if time.monotonic() - self.synced_at >= VCHANNEL_SYNC_S:
                # Caught up: a vchannel dropped here can be dropped there.
                self.target_vchannels = await self._sync_vchannels(client, True)
                self.synced_at = time.monotonic()
                # And read the target's checkpoint again: an idle source must notice a
                # target that moved without it (a checkpoint that no longer matches).
                self.checkpoint = None
                return
            await owner.wait_commit_change(IDLE_POLL_S)
        elif not self.inflight and not progressed:
            # Held back (a vchannel this node's view does not know yet, a transaction not
            # committed whole): look again a little later.
            await owner.wait_commit_change(IDLE_POLL_S)

    async def _housekeeping(self, owner: ChannelOwner) -> None:
        """The switchover's drain, the checkpoint report to Raft and the measurements."""
        edge, host = self.edge, self.host
        assert self.checkpoint is not None
        configuration = self._configuration()
        if switching_to(configuration, host.cluster_id) != edge.target.cluster_id:
            self.drain_lsn, self.drain_recorded = None, False
        elif self.drain_lsn is None:
            # The pause is applied here: once the node's view has it, every client write
            # is refused under the owner's write lock, so the last LSN after the writes
            # holding that lock bounds them all.
            self._configuration(force=True)
            host.view()
            self.drain_lsn = await owner.settled_last_lsn()
            log.info(
                "replicate %s -> %s: writes paused, draining through LSN %d",
                edge.pchannel,
                edge.target.cluster_id,
                self.drain_lsn,
            )
        # What the target holds of this pchannel: what it applied, or what it wrote itself
        # before the edge was reversed.
        held = max(self.checkpoint, self.start)
        if self.recording is not None and self.recording.done():
            self.recording = None
        since = time.monotonic() - self.recorded_at
        if self.recording is None:
            drained = (
                self.drain_lsn is not None
                and not self.drain_recorded
                and self.confirmed >= self.drain_lsn
            )
            if (drained and since >= RETRY_MIN_S) or (
                held > self.recorded and since >= RECORD_EVERY_S
            ):
                self.recording = asyncio.create_task(self._record(held, drained))
        self._measure(owner)

    async def _record(self, held: int, drained: bool) -> None:
        """Report `held` to Raft (the retention hold; with `drained`, the switchover's
        drain). A failure is logged and the report made again later."""
        edge = self.edge
        assert self.drain_lsn is not None or not drained
        try:
            if drained:
                await self.host.record_checkpoint(
                    edge.pchannel,
                    edge.target.cluster_id,
                    held,
                    drained_through_lsn=max(self.drain_lsn or 0, held, 1),
                )
                self.drain_recorded = True
                log.info(
                    "replicate %s -> %s: drained (the target holds source LSN %d)",
                    edge.pchannel,
                    edge.target.cluster_id,
                    held,
                )
            else:
                await self.host.record_checkpoint(edge.pchannel, edge.target.cluster_id, held)
            self.recorded = max(self.recorded, held)
        except RaftwalError as error:
            log.info("replicate %s: recording the checkpoint failed: %s", edge.pchannel, error)
        finally:
            self.recorded_at = time.monotonic()

    async def _fill(
        self, client: StreamingClientBase, stream: ProduceStream, owner: ChannelOwner
    ) -> bool:
        """Read committed entries after `scanned` and send them as batches while the
        window has room; whether `scanned` moved. With EAGER_BATCHES in flight already,
        a batch is sent only when a full one's worth is committed (fewer, larger batches
        under load); an answer or more entries wake the step that sends the rest."""
        assert self.checkpoint is not None
        names: dict[int, str] | None = None
        before = self.scanned
        while self.room:
            committed = owner.committed_lsn
            if self.scanned >= committed:
                break
            if (
                committed - self.scanned < FULL_BATCH_LSNS
                and self._data_batches_in_flight() >= EAGER_BATCHES
            ):
                break
            if self.scanned + 1 < owner.log.first_lsn:
                raise SourceGap(self.scanned + 1, owner.log.first_lsn)
            if names is None:
                names = self.host.view().vchannel_names
            batch = next_batch(owner, self.scanned, committed, names)
            if batch.cut_transaction:
                # A transaction larger than one read: read it whole.
                batch = next_batch(owner, self.scanned, committed, names, MAX_TXN_READ_BYTES)
            if not batch.messages:
                if batch.scanned_through <= self.scanned:
                    break  # a vchannel the view does not know yet, or a txn not committed
                self.scanned = batch.scanned_through
                self.inflight.append(_Sent(batch, None, time.monotonic()))
                continue
            if self.target_vchannels is None or any(
                m.vchannel not in self.target_vchannels for m in batch.messages
            ):
                self.target_vchannels = await self._sync_vchannels(client, False)
                self.synced_at = time.monotonic()
            previous = self._last_sent_sequence()
            request = wire.ProduceRequest(
                pchannel=self.edge.target_pchannel,
                messages=batch.messages,
                producer_id=self.producer,
                sequence=batch.lsns[-1],
                previous_sequence=previous,
                replicate_source=wire.ReplicateSource(
                    cluster_id=self.host.cluster_id,
                    pchannel=self.edge.pchannel,
                    lsns=batch.lsns,
                    time_ticks=batch.ticks,
                ),
            )
            future = stream.submit(request)
            self.inflight.append(_Sent(batch, future, time.monotonic()))
            self.inflight_bytes += batch.size
            self.scanned = batch.scanned_through
        return self.scanned > before

    def _data_batches_in_flight(self) -> int:
        return sum(1 for sent in self.inflight if sent.future is not None)

    def _last_sent_sequence(self) -> int:
        """The sequence the next batch continues: the last data batch in flight, else the
        target's checkpoint."""
        for sent in reversed(self.inflight):
            if sent.future is not None:
                return sent.batch.lsns[-1]
        assert self.checkpoint is not None
        return self.checkpoint

    def _settle(self) -> None:
        """Take the answers of the pipeline's head, in order: the checkpoint moves only
        over a prefix the target acknowledged (durable on a majority there). Raises the
        first failure."""
        while self.inflight:
            head = self.inflight[0]
            if head.future is not None:
                if not head.future.done():
                    return
                result = head.future.result()  # raises StreamBroken for a broken stream
                if result.HasField("error") and result.error.code != E.OK:
                    raise RaftwalError(result.error)
                self.checkpoint = head.batch.lsns[-1]
                self.acked_at = time.monotonic()
                self.inflight_bytes -= head.batch.size
                self.applied_entries += len(head.batch.messages)
                self.applied_bytes += head.batch.size
            self.confirmed = head.batch.scanned_through
            self.inflight.popleft()
            self.moved.set()
            self.moved.clear()

    def _measure(self, owner: ChannelOwner, force: bool = False) -> None:
        """Publish the status (at most every STATUS_EVERY_S unless `force`) and, when the
        replicator cannot keep up, say so (a warning at most every WARN_EVERY_S)."""
        now = time.monotonic()
        if not force and now - self.measured_at < STATUS_EVERY_S:
            return
        self.measured_at = now
        committed = owner.committed_lsn
        samples = self.samples
        samples.append((now, committed, self.confirmed, self.applied_bytes))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_S:
            samples.popleft()
        first_at, first_committed, first_confirmed, first_bytes = samples[0]
        span = now - first_at
        lag_entries = max(0, committed - self.confirmed)
        lag_bytes = lag_s = 0.0
        if lag_entries:
            with contextlib.suppress(LogError, KeyError, OSError, FormatError):
                lag_bytes = owner.log.bytes_between(self.confirmed + 1, committed)
                first = frame_headers(owner.log.read_frames(self.confirmed + 1, 1, committed))
                if first:
                    tick_ms = first[0][1][4] >> TICK_LOGICAL_BITS
                    lag_s = max(0.0, time.time() - tick_ms / 1000)
        status = api.ReplicatorStatus(
            pchannel=self.edge.pchannel,
            term=self.edge.term,
            target_cluster_id=self.edge.target.cluster_id,
            target_pchannel=self.edge.target_pchannel,
            state=(
                CHECKPOINT_MISMATCH
                if self.claimed
                else SOURCE_GAP
                if self.gap is not None
                else "retrying"
                if self.retrying
                else "starting"
                if self.checkpoint is None and not self.applied_entries
                else "caught up"
                if not lag_entries
                else "replicating"
            ),
            source_committed_lsn=committed,
            target_lsn=self.checkpoint
            if self.checkpoint is not None
            else self.published.target_lsn,
            lag_entries=lag_entries,
            lag_bytes=int(lag_bytes),
            lag_s=round(lag_s, 3),
            apply_rate_entries_s=round((self.confirmed - first_confirmed) / span, 1)
            if span > 0
            else 0.0,
            apply_rate_bytes_s=round((self.applied_bytes - first_bytes) / span, 1)
            if span > 0
            else 0.0,
            commit_rate_entries_s=round((committed - first_committed) / span, 1)
            if span > 0
            else 0.0,
            inflight_batches=self._data_batches_in_flight(),
            inflight_bytes=self.inflight_bytes,
            last_error=self.last_error if self.retrying else "",
            applied_entries=self.applied_entries,
            applied_bytes=self.applied_bytes,
            measured_at_ms=int(time.time() * 1000),
            needed_lsn=self.gap[0] if self.gap is not None else 0,
            source_first_lsn=self.gap[1] if self.gap is not None else 0,
        )
        grew = span >= RATE_WINDOW_S / 2 and lag_entries > max(0, first_committed - first_confirmed)
        status.summary = verdict(status, grew, now - self.acked_at)
        status.keeping_up = not status.summary
        self.published = status
        if status.summary and now - self.warned_at >= WARN_EVERY_S:
            self.warned_at = now
            log.warning("%s", status.summary)

    async def _sync_vchannels(self, client: StreamingClientBase, caught_up: bool) -> set[str]:
        """Create on the target pchannel the vchannels this pchannel has and it lacks, and,
        once `caught_up` (every entry of a dropped vchannel replicated), drop there those
        dropped here. Returns the target pchannel's vchannels afterwards."""
        edge = self.edge
        view = self.host.view()
        mine = {v.name: v.normal for v in view.vchannels.values() if v.pchannel == edge.pchannel}
        described = await client.coordinator.describe_channels([edge.target_pchannel])
        theirs = {
            v.name
            for v in described.vchannels
            if v.pchannel == edge.target_pchannel and v.state == pb.VCHANNEL_STATE_NORMAL
        }
        for name in sorted(mine):
            if mine[name] and name not in theirs:
                try:
                    await client.coordinator.create_vchannel(name, edge.target_pchannel)
                except RaftwalError as error:
                    if error.info.code != E.ALREADY_EXISTS:
                        raise
                log.info(
                    "replicate %s: created vchannel %s on %s/%s",
                    edge.pchannel,
                    name,
                    edge.target.cluster_id,
                    edge.target_pchannel,
                )
                theirs.add(name)
            elif caught_up and not mine[name] and name in theirs:
                await client.coordinator.drop_vchannel(name)
                log.info(
                    "replicate %s: dropped vchannel %s on %s",
                    edge.pchannel,
                    name,
                    edge.target.cluster_id,
                )
                theirs.discard(name)
        return theirs
