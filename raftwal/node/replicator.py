"""Cross-cluster replication on the source: one replicator per owned source pchannel and
target (docs/replication.md, section 2).

``Replicators.run`` keeps, on this node, one task per (pchannel, owner term, target
cluster) for every pchannel this node serves as owner that the replication configuration
names as a source: a new term, a new configuration or the loss of ownership stops the
task, and the next round starts the right ones. A task reads the pchannel's **committed**
log from the local owner and appends its data entries to the target cluster's matching
pchannel as the idempotent, contiguous producer ``rw.replicate/<cluster>/<pchannel>``:
sequence = the source LSN of the batch's last entry, previous_sequence = the target's
checkpoint, read from the target with ``GetReplicateCheckpoint``. A batch that does not
continue the target's sequence is refused there (INVALID_REQUEST_SEQ), and the task
re-reads the checkpoint: so two replicators (an old owner not yet stopped, a new one) can
never both write, and a restart resumes exactly after what the target holds.

Replicated: data entries with their vchannel, type, key, payload and properties (minus
the source's own ``rw.`` bookkeeping); a committed transaction as one batch with its begin
and commit markers (the target writes them under a transaction id of its own); broadcast
entries as entries of their vchannel; the creation of vchannels (before their first entry
is sent) and their removal (once every entry before it is replicated), through the
target's Coordinator, which needs the target token's role to be admin. Not replicated:
the source's term starts, seal markers and idle time ticks.
Every retry is bounded in rate (``RETRY_MAX_S``) and logged.

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
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import grpc

from raftwal.services.backend import DataViewSnapshot
from raftwal.services.replicated import RESERVED_PREFIX, producer_id
from rpc.credentials import ClientSecurity, CredentialsError
from rpc.errors import RaftwalError, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.streaming.routing import StreamingClientBase
from statemachine.replicate import local_cluster, start_after, switching_to
from wal_segments.format import MSG_TYPE_NAMES, EntryFlags, MsgType
from wal_segments.owner import ChannelOwner

log = logging.getLogger(__name__)
E = errors_pb2

#: How often the set of replicators is compared with the configuration and ownership.
REFRESH_S = 0.5
#: How often an idle replicator looks for newly committed entries.
IDLE_POLL_S = 0.05
#: Bounds of one target batch.
MAX_BATCH_MESSAGES = 1000
MAX_BATCH_BYTES = 4 << 20
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


def next_batch(
    owner: ChannelOwner,
    after: int,
    committed: int,
    names: dict[int, str],
    max_bytes: int = MAX_BATCH_BYTES,
) -> _Batch:
    """The data entries of `owner`'s log after `after` through `committed`, at most one
    batch's worth (`max_bytes` read), never ending inside a transaction."""
    entries = owner.log.entries(after + 1, max_bytes, committed)
    batch = _Batch([], [], [], after)
    size = 0
    txn_start: int | None = None  # index in batch.messages where an open txn's body starts
    for entry in entries:
        if entry.lsn > committed:
            break
        if entry.msg_type == MsgType.TXN_BEGIN:
            txn_start = len(batch.messages)
        if entry.msg_type == MsgType.TXN_COMMIT:
            txn_start = None
        if entry.vchannel_id and entry.vchannel_id not in names:
            # A vchannel this node's view does not know yet: stop before it (the caller
            # tries again once the view has caught up), never skip it.
            break
        skipped = (
            entry.msg_type in _SKIPPED_TYPES
            or entry.flags & _SKIPPED_FLAGS
            or not entry.vchannel_id
        )
        if not skipped:
            batch.messages.append(
                wire.Message(
                    vchannel=names[entry.vchannel_id],
                    msg_type=MSG_TYPE_NAMES.get(entry.msg_type, "message"),
                    key=entry.key,
                    payload=entry.payload,
                    properties={
                        k: v
                        for k, v in entry.properties.items()
                        if not k.startswith(RESERVED_PREFIX)
                    },
                )
            )
            batch.lsns.append(entry.lsn)
            batch.ticks.append(entry.time_tick)
            size += 64 + len(entry.key) + len(entry.payload)
        if txn_start is None:
            batch.scanned_through = entry.lsn
            if len(batch.messages) >= MAX_BATCH_MESSAGES or size >= MAX_BATCH_BYTES:
                break
    if txn_start is not None:
        # The range ended inside a transaction: send it whole next time.
        del batch.messages[txn_start:], batch.lsns[txn_start:], batch.ticks[txn_start:]
        batch.cut_transaction = not batch.messages
    return batch


class Replicators:
    def __init__(self, host: ReplicatorHost) -> None:
        self._host = host
        self._tasks: dict[tuple[str, int, str, bytes], asyncio.Task[None]] = {}

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
        for key, edge in wanted.items():
            if key not in self._tasks:
                self._tasks[key] = asyncio.create_task(
                    self._replicate(edge), name=f"replicate-{edge.pchannel}"
                )

    def running(self) -> list[str]:
        return sorted(f"{k[0]}@{k[1]}->{k[2]}" for k in self._tasks)

    async def _replicate(self, edge: _Edge) -> None:
        host = self._host
        try:
            security = cluster_security(edge.target)
        except CredentialsError as error:
            log.warning(
                "replicate %s: unusable credentials of the target (%s)", edge.pchannel, error
            )
            return
        producer = producer_id(host.cluster_id, edge.pchannel)
        checkpoint: int | None = None
        scanned = 0
        # -1: nothing recorded by this task yet, so its first record (which carries no
        # mismatch) also clears a mismatch an earlier replicator of the pair reported.
        recorded, recorded_at = -1, 0.0
        # The mismatched checkpoint this task last reported (0: none).
        claimed = 0
        # During a switchover to this target: the LSN no client write of the pchannel can
        # follow (None: no pause, or not known yet), and whether the drain was recorded.
        drain_lsn: int | None = None
        drain_recorded = False
        # The LSN the edge starts after (a reversed edge's: what the target wrote itself).
        start = 0
        # The target pchannel's vchannels as last synchronized, and when.
        target_vchannels: set[str] | None = None
        synced_at = 0.0
        backoff = RETRY_MIN_S
        log.info(
            "replicate %s (term %d) -> %s/%s: started",
            edge.pchannel,
            edge.term,
            edge.target.cluster_id,
            edge.target_pchannel,
        )
        async with StreamingClientBase(list(edge.target.endpoints), security=security) as client:
            while True:
                owner = host.serving_owner(edge.pchannel)
                if owner is None or not owner.serving or owner.term != edge.term:
                    return  # no longer the owner at this term: the next round decides
                address, term = "", 0
                try:
                    route = await client.router.owner(edge.target_pchannel, CALL_TIMEOUT_S)
                    address, term = route.owner_address, route.term
                    stub = client.stub(address)
                    configuration = host.replicate_configuration()
                    if checkpoint is None:
                        answer = await stub.GetReplicateCheckpoint(
                            wire.GetReplicateCheckpointRequest(
                                pchannel=edge.target_pchannel,
                                source_cluster_id=host.cluster_id,
                                source_pchannel=edge.pchannel,
                            ),
                            timeout=CALL_TIMEOUT_S,
                        )
                        if answer.source_lsn > owner.committed_lsn:
                            # More than this pchannel ever committed: refused (the module
                            # docstring), reported, and read again later.
                            if claimed != answer.source_lsn:
                                log.error(
                                    "replicate %s -> %s/%s: the target claims to hold source "
                                    "LSN %d, above this pchannel's committed LSN %d: its "
                                    "checkpoint does not match this cluster; not recorded, "
                                    "nothing sent until it matches (docs/replication.md)",
                                    edge.pchannel,
                                    edge.target.cluster_id,
                                    edge.target_pchannel,
                                    answer.source_lsn,
                                    owner.committed_lsn,
                                )
                                await host.record_checkpoint(
                                    edge.pchannel,
                                    edge.target.cluster_id,
                                    0,
                                    target_claims_lsn=answer.source_lsn,
                                )
                                claimed = answer.source_lsn
                            await asyncio.sleep(MISMATCH_RECHECK_S)
                            continue
                        if claimed:
                            log.warning(
                                "replicate %s -> %s: the target's checkpoint matches again "
                                "(source LSN %d)",
                                edge.pchannel,
                                edge.target.cluster_id,
                                answer.source_lsn,
                            )
                            claimed, recorded = 0, -1
                        checkpoint = answer.source_lsn
                        # After a switchover reversed the edge, the target holds this
                        # pchannel's entries through `start` already (it wrote them).
                        start = start_after(
                            configuration, host.cluster_id, edge.target.cluster_id, edge.pchannel
                        )
                        scanned = max(checkpoint, start)
                    if switching_to(configuration, host.cluster_id) != edge.target.cluster_id:
                        drain_lsn, drain_recorded = None, False
                    elif drain_lsn is None:
                        # The pause is applied here: once the node's view has it, every
                        # client write is refused under the owner's write lock, so the
                        # last LSN after the writes holding that lock bounds them all.
                        host.view()
                        drain_lsn = await owner.settled_last_lsn()
                        log.info(
                            "replicate %s -> %s: writes paused, draining through LSN %d",
                            edge.pchannel,
                            edge.target.cluster_id,
                            drain_lsn,
                        )
                    # What the target holds of this pchannel: what it applied, or what it
                    # wrote itself before the edge was reversed.
                    held = max(checkpoint, start)
                    if drain_lsn is not None and not drain_recorded and scanned >= drain_lsn:
                        await host.record_checkpoint(
                            edge.pchannel,
                            edge.target.cluster_id,
                            held,
                            drained_through_lsn=max(drain_lsn, held, 1),
                        )
                        drain_recorded = True
                        recorded, recorded_at = max(recorded, held), time.monotonic()
                        log.info(
                            "replicate %s -> %s: drained (the target holds source LSN %d)",
                            edge.pchannel,
                            edge.target.cluster_id,
                            checkpoint,
                        )
                    if held > recorded and time.monotonic() - recorded_at >= RECORD_EVERY_S:
                        await host.record_checkpoint(edge.pchannel, edge.target.cluster_id, held)
                        recorded, recorded_at = held, time.monotonic()
                    committed = owner.committed_lsn
                    if scanned >= committed:
                        if time.monotonic() - synced_at >= VCHANNEL_SYNC_S:
                            # Caught up: a vchannel dropped here can be dropped there.
                            target_vchannels = await self._sync_vchannels(client, edge, True)
                            synced_at = time.monotonic()
                            # And read the target's checkpoint again: an idle source
                            # must notice a target that moved without it.
                            checkpoint = None
                        await asyncio.sleep(IDLE_POLL_S)
                        continue
                    names = host.view().vchannel_names
                    batch = next_batch(owner, scanned, committed, names)
                    if batch.cut_transaction:
                        # A transaction larger than one read: read it whole.
                        batch = next_batch(owner, scanned, committed, names, MAX_TXN_READ_BYTES)
                    if target_vchannels is None or any(
                        m.vchannel not in target_vchannels for m in batch.messages
                    ):
                        target_vchannels = await self._sync_vchannels(client, edge, False)
                        synced_at = time.monotonic()
                    if not batch.messages:
                        progressed = batch.scanned_through > scanned
                        scanned = batch.scanned_through
                        if not progressed:
                            await asyncio.sleep(IDLE_POLL_S)
                        continue
                    request = wire.ProduceRequest(
                        request_id=1,
                        pchannel=edge.target_pchannel,
                        messages=batch.messages,
                        producer_id=producer,
                        sequence=batch.lsns[-1],
                        previous_sequence=checkpoint,
                        replicate_source=wire.ReplicateSource(
                            cluster_id=host.cluster_id,
                            pchannel=edge.pchannel,
                            lsns=batch.lsns,
                            time_ticks=batch.ticks,
                        ),
                    )
                    result = await self._produce(stub, request)
                    if result.HasField("error") and result.error.code != E.OK:
                        raise RaftwalError(result.error)
                    checkpoint, scanned = batch.lsns[-1], batch.scanned_through
                    backoff = RETRY_MIN_S
                except asyncio.CancelledError:
                    raise
                except (RaftwalError, grpc.RpcError) as error:
                    info = error.info if isinstance(error, RaftwalError) else from_rpc_error(error)
                    if info.code == E.INVALID_REQUEST_SEQ:
                        # Someone else moved the target (an earlier owner's replicator):
                        # continue from what the target holds.
                        log.info(
                            "replicate %s: %s; re-reading the checkpoint",
                            edge.pchannel,
                            info.message,
                        )
                        checkpoint = None
                        continue
                    if info.code in _RETRY_CODES:
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
                    checkpoint = None
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
                    if address:
                        client.router.report_failure(edge.target_pchannel, address, term)
                    checkpoint = None
                    await asyncio.sleep(backoff)
                    backoff = min(RETRY_MAX_S, backoff * 2)

    async def _sync_vchannels(
        self, client: StreamingClientBase, edge: _Edge, caught_up: bool
    ) -> set[str]:
        """Create on the target pchannel the vchannels this pchannel has and it lacks, and,
        once `caught_up` (every entry of a dropped vchannel replicated), drop there those
        dropped here. Returns the target pchannel's vchannels afterwards."""
        view = self._host.view()
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

    @staticmethod
    async def _produce(stub, request: wire.ProduceRequest) -> wire.ProduceResult:  # type: ignore[no-untyped-def]
        call = stub.Produce(iter([request]), timeout=CALL_TIMEOUT_S)
        try:
            async for result in call:
                return result  # type: ignore[no-any-return]
        finally:
            call.cancel()
        raise RaftwalError(
            E.ErrorInfo(code=E.UNKNOWN, message="the target ended Produce without an answer")
        )
