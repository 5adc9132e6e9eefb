"""The owner of a pchannel at one term: tail recovery, the write path, replication, seal
and commit.

What lives here: `ChannelOwner`. Created when the coordination state assigns a pchannel to
this node at term T, it
1. **recovers the tail**: fences every replica at T (each persists it and reports its last
   (lsn, term)), waits for a majority (itself included) and, when T changes the replica
   set, for ceil(n/2) of the last ready set as well (`stable_replica_node_ids`), adopts the most up-to-date log
   (highest last term, then highest LSN) by fetching the missing suffix, drops a trailing
   transaction that has no commit entry (it was never acknowledged), seals the inherited
   open segment with a seal marker and appends a term-start entry at T, replicates to a
   majority (which commits everything before it), and proposes `PChannelReady`. Recovery
   waits as long as it takes; it stops only when the assignment is superseded.
2. **writes**: assigns LSNs and hybrid-logical-clock time ticks (strictly increasing per
   pchannel, across terms), appends locally, forwards the same bytes to every replica over
   one Append stream each (pipelined), and acknowledges a batch once a majority of the
   replica set holds it durably. `committed_lsn` is that majority point.
3. **seals** the open segment at `segment_max_bytes` / `segment_max_age_ms` by writing a
   seal marker (so replicas roll at the same LSN) and proposes `CommitSegment` once the
   marker is committed.
4. **keeps time moving** on an idle pchannel: `advance_time_tick` appends a time-tick entry
   (TIME_TICK_MARKER) when nothing was written for a while and a Consume stream asks for
   watermarks, so committed time ticks advance (time-tick packs).

An owner that meets a higher term (a replica answers FENCED, or its own log was fenced)
stops: every pending and later write fails with CHANNEL_FENCED; it never acknowledges
again. A local write that fails cleanly (nothing reached the log) fails only its batch:
with RESOURCE_EXHAUSTED when the disk is full (ENOSPC, EDQUOT: the producer may retry once
space returns), else with INNER; after a failed fdatasync or seal the owner stops
(ON_SHUTDOWN, with the reason) and the data plane recovers the pchannel at a new term.

What must never happen here: an import of `raft` or `raftwal` (the coordination plane is
reached through the `Proposer` protocol); acknowledging a write before a majority holds it
durably; acknowledging anything after a higher term was seen.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import errno
import heapq
import itertools
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from rpc.aio import Signal, wait_event, wait_within
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from wal_segments import buggify, mutations
from wal_segments.format import (
    BATCH_CONTINUES_FLAG,
    ENTRY_HEADER,
    ENTRY_HEADER_SIZE,
    MAX_PROPERTIES_BYTES,
    TXN_FLAGS,
    Entry,
    EntryFlags,
    MsgType,
    align_up,
    crc32c,
    decode_properties,
    encode_batch,
    encode_rows,
)
from wal_segments.log import BadBatch, Fenced, LogError, LogPosition, Mismatch, PChannelLog
from wal_segments.walimpls.api import WAL, Corrupt, FencedByTerm, Record, Tail, WalImplError

logger = logging.getLogger(__name__)
E = errors_pb2

TICK_LOGICAL_BITS = 18
PRODUCER_ID_PROPERTY = "rw.producer"
PRODUCER_SEQ_PROPERTY = "rw.seq"
PRODUCER_COUNT_PROPERTY = "rw.count"
PRODUCER_HISTORY = 8
#: On a transaction's commit entry: how many entries the transaction wrote ([begin, body...,
#: commit]), so that a new owner can answer a retried CommitTxn from its log.
TXN_COUNT_PROPERTY = "rw.txn.count"
#: Committed transactions whose outcome an owner remembers (a retried CommitTxn or a
#: RollbackTxn after the commit is answered from this), oldest forgotten first.
TXN_OUTCOMES = 10_000
# Cancels (0.1 s apart) before a replica's stopped stream gives up waiting for its sender.
SENDER_STOP_ATTEMPTS = 50
# A commit point that moved while a replica's sender is idle is passed on by a heartbeat
# this much later, unless a write carries it first (so that a steady stream of writes
# costs no extra appends, and a replica serving reads learns it within a few ms).
COMMIT_NOTICE_DELAY_S = 0.005
#: how many entries back recovery looks for idempotent producers' sequences
PRODUCER_SCAN_ENTRIES = 200_000
#: On an owner's producer-state entry (TIME_TICK, TIME_TICK_MARKER): every producer it
#: remembers, as JSON, so that a later owner knows them though retention deleted the
#: entries of their batches (see `_write_producer_state`).
PRODUCERS_PROPERTY = "rw.producers"
PRODUCER_STATE_VERSION = 1
#: An owner writes its producer state again after this many entries (and first thing in
#: every segment it opens), so recovery's tail scan of PRODUCER_SCAN_ENTRIES always holds
#: one while there are producers.
PRODUCER_STATE_EVERY_ENTRIES = PRODUCER_SCAN_ENTRIES // 2
#: Producers of batches replicated from another cluster (``rw.replicate/<cluster>/<pchannel>``):
#: their sequence is the target's checkpoint, kept however long the source is idle (one per
#: source pchannel, so bounded); every other producer expires (`producer_expiry_ms`).
REPLICATED_PRODUCER_PREFIX = "rw.replicate/"
#: How often a serving owner drops producers idle past their expiry (besides whenever it
#: writes its producer state).
PRODUCER_EXPIRY_CHECK_S = 10.0


#: Commit waiters kept before the cancelled ones are swept out (see `_wait_committed`).
_WAITERS_BEFORE_SWEEP = 1024
#: The most entries one write batch can hold (the service's batch limit is far lower): the
#: walk back over a batch's surviving prefix stops there.
MAX_BATCH_ENTRIES = 1_000_000

NON_ATOMIC_BATCH = mutations.declare(
    "non-atomic-batch",
    "a new owner keeps the surviving prefix of a write batch at the end of the log it "
    "adopts, so a producer's retry of that batch writes those entries a second time",
)

#: Commit points remembered for replica lag (`replica_lags_s`); older ones are forgotten.
COMMIT_TIMES_KEPT = 4096
#: In the message of a RESOURCE_EXHAUSTED for a write the disk refused (ENOSPC, EDQUOT).
DISK_FULL_MARK = "disk full"
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

# Deliberate bugs for the simulation's mutation suite (`wal_segments.mutations`).
SELF_FENCE_MAJORITY = mutations.declare(
    "self-fence-majority", "the owner takes its own fence answer as a majority"
)
NO_STABLE_QUORUM = mutations.declare(
    "no-stable-quorum", "recovery no longer needs a quorum of the last ready replica set"
)
ADOPT_SHORTEST_LOG = mutations.declare(
    "adopt-shortest-log", "recovery adopts the shortest log of the fence quorum"
)
BEST_LOG_BY_LSN = mutations.declare(
    "best-log-by-lsn", "recovery picks the best log by LSN before term"
)
SAME_TERM_RECOVERY = mutations.declare(
    "same-term-recovery", "a tail recovery runs twice at one term on one node"
)
ACK_ONE_REPLICA = mutations.declare(
    "ack-one-replica", "a write is acknowledged once 1 of the replica set holds it"
)
OWNER_EARLY_DURABLE = mutations.declare(
    "owner-early-durable", "the owner counts its own write as durable before its fsync"
)
COUNT_OLD_TERM = mutations.declare(
    "count-old-term",
    "entries of an older term are committed, and announced, by counting replicas (Raft's figure 8)",
)
MATCH_BY_LAST_LSN = mutations.declare(
    "match-by-last-lsn", "the owner counts a replica up to its log's end, not its durable LSN"
)
SKIP_PRODUCER_REBUILD = mutations.declare(
    "skip-producer-rebuild", "a new owner forgets the producer sequences its log holds"
)
KEEP_PARTIAL_TXN = mutations.declare(
    "keep-partial-txn", "recovery keeps a transaction tail that has no commit entry"
)


class WalError(Exception):
    """A data-plane error with its ErrorInfo (mapped to a gRPC status by the servicers)."""

    def __init__(
        self, code: int, message: str, *, current_term: int = 0, owner_hint: str = ""
    ) -> None:
        super().__init__(message)
        self.info = errors_pb2.ErrorInfo(
            message=message, current_term=current_term, owner_hint=owner_hint
        )
        self.info.code = code  # type: ignore[assignment]


def fenced_error(pchannel: str, term: int, by_term: int) -> WalError:
    return WalError(
        E.CHANNEL_FENCED,
        f"pchannel {pchannel} at term {term} was fenced by term {by_term}",
        current_term=by_term,
    )


# -- protocols: what the owner needs from the rest of the node ------------------------------


class AppendStream(Protocol):
    """One bidi Append stream to a replica."""

    async def write(self, request: wire.AppendRequest) -> None: ...

    def responses(self) -> AsyncIterator[wire.AppendResponse]: ...

    def cancel(self) -> None: ...


class ReplicaTransport(Protocol):
    """Node-to-node calls to another replica (gRPC Replication service). Errors: any
    exception means "unreachable now"; the owner retries with backoff."""

    def open_append(self, node_id: str) -> AppendStream: ...

    async def fence(self, node_id: str, request: wire.FenceRequest) -> wire.FenceResponse: ...

    async def fetch(self, node_id: str, request: wire.FetchRequest) -> wire.FetchResponse: ...


class Proposer(Protocol):
    """Coordination-plane commands the owner proposes. Each returns the rejection code (OK
    = accepted) or raises on an unknown outcome (the owner retries: both are idempotent)."""

    async def pchannel_ready(self, pchannel: str, term: int, start_lsn: int) -> int: ...

    async def commit_segment(self, pchannel: str, term: int, fields: dict[str, object]) -> int: ...

    def committed_through(self, pchannel: str) -> int: ...

    def still_assigned(self, pchannel: str, term: int) -> bool: ...

    async def wal_flushed(
        self, pchannel: str, epoch: int, term: int, checkpoint: tuple[int, int, int]
    ) -> int:
        """Propose WalFlushed: FLUSHING of AlterWAL `epoch` is done at `term`, nothing is
        appended after checkpoint (lsn, term, time tick) and the manifest covers it."""
        ...


class WriteObserver(Protocol):
    """Told of every write batch the owner acknowledges (the node's metrics). Runs on the
    event loop: it must be quick and must not raise."""

    def batch_acknowledged(
        self, pchannel: str, messages: int, wal_bytes: int, latency_s: float
    ) -> None: ...


@dataclass(frozen=True)
class OwnerConfig:
    segment_max_bytes: int = 64 << 20
    segment_max_age_ms: int = 10 * 60_000
    replication_chunk_bytes: int = 4 << 20
    #: appended but not yet committed bytes; producers wait beyond it (backpressure)
    max_uncommitted_bytes: int = 64 << 20
    #: bytes of recent batches kept in memory for replication
    recent_cache_bytes: int = 64 << 20
    retry_min_s: float = 0.05
    retry_max_s: float = 1.0
    rpc_timeout_s: float = 2.0
    #: an idempotent producer that wrote nothing for this long is forgotten (a retry of its
    #: last batch is then written again); replicated producers never expire
    producer_expiry_ms: int = 7 * 24 * 3600 * 1000
    #: producers remembered per pchannel; past it the least recently written is forgotten
    max_producers: int = 8192
    #: whether the owner flags its batches BATCH_CONTINUES (atomic batches) once every
    #: replica it recovered with says it takes them; False writes batches as the version
    #: before them did (the simulation runs a rolling upgrade's older nodes so)
    batch_frames: bool = True


_NO_PROPERTIES: dict[str, str] = {}


class Message(NamedTuple):
    """One message to write (validated by the caller). A tuple, so that hot paths can
    build plain tuples in this field order."""

    vchannel_id: int
    msg_type: int
    key: bytes = b""
    payload: bytes = b""
    properties: Mapping[str, str] = _NO_PROPERTIES
    flags: int = 0
    txn_id: int = 0
    broadcast_id: int = 0


@dataclass(slots=True)
class _ProducerBatch:
    sequence: int
    first_lsn: int
    last_lsn: int
    done: asyncio.Future[list[tuple[int, int]]] | None = None
    #: the time tick of the batch's last entry (expiry counts from it)
    time_tick: int = 0


def _producer_batch(
    entry_lsn: int, time_tick: int, properties: Mapping[str, str]
) -> _ProducerBatch | None:
    """The producer batch an entry with these properties ends, if it ends one. Raises
    KeyError or ValueError for malformed producer properties."""
    if not properties.get(PRODUCER_ID_PROPERTY):
        return None
    count = int(properties[PRODUCER_COUNT_PROPERTY])
    return _ProducerBatch(
        int(properties[PRODUCER_SEQ_PROPERTY]),
        entry_lsn - count + 1,
        entry_lsn,
        time_tick=time_tick,
    )


def encode_producer_state(records: Sequence[tuple[str, int, int, int, int]]) -> str:
    """The value of PRODUCERS_PROPERTY for (producer id, sequence, first lsn, last lsn,
    time tick) records, one per producer (its newest batch), in the given order."""
    return json.dumps(
        {"v": PRODUCER_STATE_VERSION, "p": [list(record) for record in records]},
        separators=(",", ":"),
        ensure_ascii=False,
    )


def decode_producer_state(value: str) -> dict[str, _ProducerBatch]:
    """Inverse of `encode_producer_state`; ValueError for anything else."""
    try:
        document = json.loads(value)
        if document["v"] != PRODUCER_STATE_VERSION:
            raise ValueError(f"producer state version {document['v']!r}")
        state = {}
        for producer, sequence, first, last, tick in document["p"]:
            if not isinstance(producer, str) or not all(
                isinstance(n, int) for n in (sequence, first, last, tick)
            ):
                raise ValueError(f"bad producer record {producer!r}")
            state[producer] = _ProducerBatch(sequence, first, last, time_tick=tick)
        return state
    except (KeyError, TypeError) as error:
        raise ValueError(f"malformed producer state ({error!r})") from None


@dataclass(slots=True)
class _Replica:
    node_id: str
    match_lsn: int = 0
    next_lsn: int = 0
    last_error: str = ""
    task: asyncio.Task[None] | None = None
    wake: Signal = field(default_factory=Signal)


def hybrid_tick(previous: int, wall_ms: int) -> int:
    """The next time tick: physical ms in the high bits, a logical counter in the low 18,
    strictly above `previous` whatever the wall clock does."""
    return max(previous + 1, wall_ms << TICK_LOGICAL_BITS)


class ChannelOwner:
    def __init__(
        self,
        *,
        pchannel: str,
        term: int,
        node_id: str,
        replica_node_ids: Sequence[str],
        log: PChannelLog,
        transport: ReplicaTransport,
        proposer: Proposer,
        config: OwnerConfig,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        observer: WriteObserver | None = None,
        stable_replica_node_ids: Sequence[str] = (),
        wal: WAL | None = None,
        checkpoint: tuple[int, int] = (0, 0),
        previous_owner_node_id: str = "",
        ready_floor: int = 0,
    ) -> None:
        self.pchannel = pchannel
        self.term = term
        self.node_id = node_id
        # The WAL implementation (wal_segments.walimpls): None or a replicated one is
        # ``segments``, this owner's replicas; otherwise the owner replicates to no one and
        # either its own fdatasync (``local``) or the implementation (``jetstream``,
        # `external`) makes a batch durable.
        self.wal = wal
        self.wal_name = wal.name if wal is not None else "segments"
        self._external = wal is not None and wal.external
        if wal is not None and not wal.replicated:
            replica_node_ids = ()
        #: the last LSN the external implementation reported durable
        self._external_durable = 0
        # Where this implementation took over the log (an AlterWAL's checkpoint: the last
        # entry before it, (lsn, term); (0, 0) when the pchannel was created on it), and
        # the last ready owner, who holds the log up to there when this node does not.
        self.checkpoint = checkpoint
        self.previous_owner_node_id = previous_owner_node_id
        # The last LSN earlier terms are known to have written and committed: the log
        # this owner recovers must hold it before it writes anything of its own term.
        self.ready_floor = ready_floor
        #: why writes are refused for now (an AlterWAL's FLUSHING), "" when they are not
        self.paused = ""
        self.replica_ids = list(dict.fromkeys([node_id, *replica_node_ids]))
        self.majority = len(self.replica_ids) // 2 + 1
        # The replica set at the last ready term, when this term changes it: every
        # acknowledged entry is on a majority of that set, so recovery fences enough of it
        # that the rest could never form a majority (its read quorum, ceil(n / 2)) and
        # takes the most up-to-date log among those too.
        stable = list(dict.fromkeys(stable_replica_node_ids))
        self.stable_ids = stable if set(stable) != set(self.replica_ids) else []
        self.stable_quorum = (len(self.stable_ids) + 1) // 2
        self.log = log
        self.transport = transport
        self.proposer = proposer
        self.config = config
        self._wall_ms = wall_ms
        self.observer = observer
        self.state = "recovering"
        self.fenced_by = 0
        self.start_lsn = 0
        self.committed_lsn = 0
        self._self_durable = 0
        self._replicas = {n: _Replica(n) for n in self.replica_ids if n != node_id}
        self._progress = Signal()
        #: (lsn, sequence, future) of writers waiting for `lsn` to commit, a heap: each
        #: commit advance settles only the futures it covers (no wake-up of every writer)
        self._commit_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_sequence = itertools.count()
        self._write_lock = asyncio.Lock()
        #: held from a write's arrival until it holds `_write_lock` (`write`)
        self._write_turn = asyncio.Lock()
        #: first lsn -> (last lsn, prev term, frames, crc32c of frames, ends a segment)
        self._recent: OrderedDict[int, tuple[int, int, bytes, int, bool]] = OrderedDict()
        self._recent_bytes = 0
        #: the last LSN of every batch this owner appended that is not committed yet, in
        #: order: the commit point moves only to the end of a batch (`_update_commit`)
        self._batch_ends: deque[int] = deque()
        #: whether this owner flags its batches BATCH_CONTINUES: decided at recovery, on
        #: when every fence answer said the replica takes such frames
        self._batch_flags = False
        self._producers: dict[str, list[_ProducerBatch]] = {}
        # Producers looked for in the whole log (`_know_producer`), found or not.
        self._producers_scanned: set[str] = set()
        #: the producer table holds every producer of the log (recovery found a producer-
        #: state entry): no producer needs looking for in the whole log
        self._producers_complete = False
        #: LSN of the newest producer-state entry this owner wrote or recovered from
        self._producer_state_lsn = 0
        self._producer_expiry_at = time.monotonic()
        #: producers forgotten by this owner, by reason ("timeout", "capacity")
        self.producers_expired: dict[str, int] = {"timeout": 0, "capacity": 0}
        #: txn id -> (first lsn, last lsn) of committed transactions (bounded: TXN_OUTCOMES)
        self._committed_txns: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._segment_opened_at = time.monotonic()
        self._last_append_at = time.monotonic()
        self._tick_task: asyncio.Task[None] | None = None
        self.commit_failures = 0
        self.last_commit_error = ""
        #: why the owner stopped after a local I/O failure ("" otherwise)
        self.failure = ""
        self.ready = asyncio.Event()
        #: (committed lsn, monotonic time it committed), oldest first: how long a replica
        #: has been behind (`replica_lags_s`)
        self._commit_times: deque[tuple[int, float]] = deque(maxlen=COMMIT_TIMES_KEPT)
        #: Admission checks a client write passes in its turn, before it takes its LSNs
        #: (`add_admission`): flow control of cross-cluster replication.
        self._admissions: dict[object, Callable[[], Awaitable[None]]] = {}
        if self._external:
            assert wal is not None
            wal.on_durable(self._external_reported)

    # -- status ------------------------------------------------------------------------------

    def _notify_progress(self) -> None:
        event, self._progress = self._progress, Signal()
        event.set()
        waiters = self._commit_waiters
        if not waiters:
            return
        # Out of service (fenced, closed): every waiter wakes and finds out why.
        limit = self.committed_lsn if self.state == "serving" else None
        while waiters and (limit is None or waiters[0][0] <= limit):
            waiter = heapq.heappop(waiters)[2]
            if not waiter.done():
                waiter.set_result(None)

    async def wait_commit_change(self, timeout_s: float) -> None:
        """Return when the commit point moves or the owner stops, or after `timeout_s`."""
        await wait_event(self._progress, timeout_s)

    @property
    def serving(self) -> bool:
        return self.state == "serving"

    @property
    def announced_commit_lsn(self) -> int:
        """The commit point this owner tells others (its log's readers, its replicas): 0
        until its term is ready (PChannelReady committed), then `committed_lsn`.

        Before that, what a majority of this term's replica set holds is not yet safe: a
        later assignment that changes the set fences a quorum of the last *ready* set only
        (`stable_replica_node_ids`), which this term is not, so a term that never becomes
        ready may lose what it counted (its term start, an adopted suffix). Recovery still
        counts it, to know when to propose PChannelReady; nobody reads it as committed."""
        if self.ready.is_set():
            return self.committed_lsn
        if mutations.active(COUNT_OLD_TERM):
            # The mutation puts the old rule back whole: entries of older terms that a
            # majority holds are committed and announced at once (this term's are not).
            return (
                self.committed_lsn
                if self.start_lsn <= 0
                else min(self.committed_lsn, self.start_lsn - 1)
            )
        return 0

    def commit_age_s(self, after_lsn: int) -> float:
        """How long ago the oldest committed entry after `after_lsn` was committed: 0 when
        none is; past the COMMIT_TIMES_KEPT newest commit points, the oldest kept one's
        age (a lower bound)."""
        times = self._commit_times
        if self.committed_lsn <= after_lsn or not times:
            return 0.0
        index = bisect.bisect_right(times, after_lsn, key=lambda point: point[0])
        at = times[min(index, len(times) - 1)][1]
        return max(0.0, time.monotonic() - at)

    def add_admission(self, key: object, admit: Callable[[], Awaitable[None]]) -> None:
        """Make every client write await `admit()` in its turn, before it takes its LSNs
        (its wait holds the writers behind it, in order: a producer's pipelined batches
        still reach the log in sequence). `admit` decides when to let writes go on and
        must not wait for this owner's own writes. A retried batch already written is
        answered without waiting."""
        self._admissions[key] = admit

    def remove_admission(self, key: object) -> None:
        self._admissions.pop(key, None)

    def replica_positions(self) -> dict[str, int]:
        positions = {self.node_id: self._self_durable}
        positions.update({r.node_id: r.match_lsn for r in self._replicas.values()})
        return positions

    def replica_lags_s(self) -> dict[str, float]:
        """node id -> how long ago the oldest committed entry it has not reported durable
        was committed (0 when it holds everything committed; a lower bound past the
        COMMIT_TIMES_KEPT newest commit points): a replica too slow for this owner shows
        here, while the majority acknowledges without it."""
        now = time.monotonic()
        lags = {}
        for node_id, durable in self.replica_positions().items():
            lag = 0.0
            if durable < self.committed_lsn:
                lag = now - self._commit_times[0][1] if self._commit_times else 0.0
                for lsn, at in self._commit_times:
                    if lsn > durable:
                        lag = now - at
                        break
            lags[node_id] = lag
        return lags

    def _check_serving(self) -> None:
        if self.state == "fenced":
            raise fenced_error(self.pchannel, self.term, self.fenced_by)
        if self.state != "serving":
            raise WalError(
                E.ON_SHUTDOWN if self.state == "closed" else E.NOT_OWNER,
                f"pchannel {self.pchannel} at term {self.term} is {self.state}"
                + (f" ({self.failure})" if self.failure else ""),
                current_term=self.term,
            )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name=f"owner:{self.pchannel}"))

    async def _run(self) -> None:
        try:
            await self._recover()
        except asyncio.CancelledError:
            raise
        except WalError as error:
            logger.info("%s: recovery at term %d ended: %s", self.pchannel, self.term, error)
            if self.state == "recovering":
                self.state = "closed"
                if error.info.code != E.CHANNEL_FENCED:
                    self.failure = self.failure or f"recovery failed: {error}"
            return
        except (LogError, OSError) as error:
            logger.error("%s: recovery at term %d failed: %s", self.pchannel, self.term, error)
            self.state = "closed"
            self.failure = self.failure or f"recovery failed: {error}"
            return
        self._tasks.append(asyncio.create_task(self._commit_loop(), name=f"commit:{self.pchannel}"))

    async def close(self, state: str = "closed") -> None:
        if self.state not in ("fenced", "closed"):
            self.state = state
        self._notify_progress()
        for replica in self._replicas.values():
            if replica.task is not None:
                replica.task.cancel()
        ticking = [self._tick_task] if self._tick_task is not None else []
        for task in [*self._tasks, *ticking]:
            task.cancel()
        for task in [
            *self._tasks,
            *ticking,
            *(r.task for r in self._replicas.values() if r.task),
        ]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._external and self.wal is not None:
            with contextlib.suppress(Exception):
                await self.wal.close()

    def _local_failure(self, error: BaseException) -> None:
        """The local copy can no longer be trusted (a failed fdatasync or seal): stop
        acknowledging. The data plane then reopens the log from the files and asks for a
        new term (`DataPlane.reconcile`), as after a restart."""
        if self.state in ("fenced", "closed"):
            return
        logger.error(
            "%s: local write failed at term %d (%s); the owner stops and the pchannel "
            "recovers at a new term",
            self.pchannel,
            self.term,
            error,
        )
        self.failure = f"local write failed on node {self.node_id}: {error}"
        self.state = "closed"
        self._notify_progress()
        for replica in self._replicas.values():
            if replica.task is not None:
                replica.task.cancel()

    def _backend_failure(self, error: BaseException) -> None:
        """The external implementation can make nothing more durable (its server is gone or
        paused past its timeout): stop as after a local failure, so the pchannel recovers at
        a new term from what the implementation stored."""
        if self.state in ("fenced", "closed"):
            return
        logger.error(
            "%s: the %s WAL stopped at term %d (%s); the owner stops and the pchannel "
            "recovers at a new term",
            self.pchannel,
            self.wal_name,
            self.term,
            error,
        )
        self.failure = f"{self.wal_name} WAL unavailable: {error}"
        self.state = "closed"
        self._notify_progress()

    def _fence(self, by_term: int) -> None:
        if self.state in ("fenced", "closed"):
            return
        logger.warning(
            "%s: owner at term %d fenced by term %d; stops acknowledging",
            self.pchannel,
            self.term,
            by_term,
        )
        self.state = "fenced"
        self.fenced_by = by_term
        self._notify_progress()
        for replica in self._replicas.values():
            if replica.task is not None:
                replica.task.cancel()

    # -- recovery ----------------------------------------------------------------------------

    async def _backoff(self, attempt: int) -> None:
        await asyncio.sleep(min(self.config.retry_max_s, self.config.retry_min_s * 2**attempt))

    def _check_current(self) -> None:
        if self.state in ("fenced", "closed"):
            raise WalError(E.CHANNEL_FENCED, f"{self.pchannel} owner at term {self.term} stopped")
        if not self.proposer.still_assigned(self.pchannel, self.term):
            raise WalError(
                E.CHANNEL_FENCED, f"assignment of {self.pchannel} at term {self.term} superseded"
            )

    async def _fence_replica(self, node_id: str) -> wire.FenceResponse:
        attempt = 0
        request = wire.FenceRequest(
            pchannel=self.pchannel, term=self.term, owner_node_id=self.node_id
        )
        while True:
            self._check_current()
            try:
                reply = await wait_within(
                    self.transport.fence(node_id, request), self.config.rpc_timeout_s
                )
            except WalError as error:
                if error.info.code == E.CHANNEL_FENCED:
                    self._fence(error.info.current_term)
                    raise
                logger.debug("%s: fence %s failed: %s", self.pchannel, node_id, error)
            except (TimeoutError, OSError, Exception) as error:  # noqa: BLE001 - retried
                logger.debug("%s: fence %s failed: %r", self.pchannel, node_id, error)
            else:
                return reply
            await self._backoff(attempt)
            attempt += 1

    def _recovery_ran_here(self) -> bool:
        """Only this node may fence at its own assigned term, so a log fenced at this term
        already means a recovery at this term ran here before (see
        `DataPlane._recovered_here_before`); running another could write different entries
        at the same (lsn, term)."""
        return self.log.fenced_term >= self.term and not mutations.active(SAME_TERM_RECOVERY)

    async def _recover(self) -> None:
        if self._recovery_ran_here():
            # The data plane asks for term + 1.
            raise WalError(
                E.UNMATCHED_CHANNEL_TERM,
                f"pchannel {self.pchannel}: recovery at term {self.term} already ran on node "
                f"{self.node_id} (its log is fenced at term {self.log.fenced_term}); a new "
                "term is needed",
                current_term=self.log.fenced_term,
            )
        position = await self.log.fence(self.term)
        if self._external:
            await self._adopt_checkpoint()
            await self._adopt_external()
            self._batch_flags = True
        else:
            await self._fence_and_adopt(position)
            await self._adopt_checkpoint()
        await self._recover_rest()

    def _check_holds_floor(self) -> None:
        """Refuse, before writing anything of this term, a recovered log that ends before
        what earlier terms wrote and committed (`ready_floor`). `PChannelReady` refuses
        its start entry anyway, but each attempt that wrote one would leave its entries
        behind, and enough attempts would carry a later term's start past the floor over
        a log that lacks the committed entries (a restore without the segment files, or a
        majority of replicas that lost their logs)."""
        if self._external or self.log.last_lsn >= self.ready_floor:
            return
        raise WalError(
            E.UNRECOVERABLE,
            f"pchannel {self.pchannel}: the log recovered at term {self.term} ends at lsn "
            f"{self.log.last_lsn}, before lsn {self.ready_floor} that earlier terms wrote "
            "and committed (expected a log holding it: were the segment files restored, "
            "and do a majority of the replicas still have their logs?)",
            current_term=self.term,
        )

    async def _adopt_checkpoint(self) -> None:
        """After an AlterWAL, the log up to the checkpoint was written under the previous
        implementation: every entry up to it is committed and held by the owner that
        flushed it (the last ready owner). A log here that does not hold the checkpoint
        entry (this node was not that owner, nor kept up with it) copies it from there
        first, so the log stays one across the switch."""
        lsn, term = self.checkpoint
        if lsn <= 0 or self._holds_entry(lsn, term):
            return
        source = self.previous_owner_node_id
        if not source or source == self.node_id:
            raise WalError(
                E.INNER,
                f"pchannel {self.pchannel}: the log here lacks the WAL switch's checkpoint "
                f"(lsn {lsn}, term {term}) and no other node flushed it",
                current_term=self.term,
            )
        logger.info(
            "%s: copying the log up to the WAL switch's checkpoint (lsn %d, term %d) from %s",
            self.pchannel,
            lsn,
            term,
            source,
        )
        await self._adopt(source, lsn, term, stop_at=lsn)

    def _holds_entry(self, lsn: int, term: int) -> bool:
        if lsn < self.log.first_lsn:
            return self.log.last_lsn >= lsn  # below the retained start: committed there
        return lsn <= self.log.last_lsn and self.log.term_at(lsn) == term

    async def _fence_and_adopt(self, position: LogPosition) -> None:
        """Fence the replica set (and the last ready set's read quorum) at this term and
        adopt the most up-to-date log among the answers (``segments`` and ``local``)."""
        positions: dict[str, wire.FenceResponse] = {
            self.node_id: wire.FenceResponse(
                fenced_term=self.term,
                last_lsn=position.last_lsn,
                last_term=position.last_term,
                last_time_tick=position.last_time_tick,
                node_id=self.node_id,
                batch_frames=self.config.batch_frames,
            )
        }
        to_fence = list(self._replicas) + [
            n for n in self.stable_ids if n not in self._replicas and n != self.node_id
        ]
        pending = {asyncio.create_task(self._fence_replica(n)): n for n in to_fence}

        def enough() -> bool:
            if mutations.active(SELF_FENCE_MAJORITY):
                return True
            if sum(1 for n in positions if n in self.replica_ids) < self.majority:
                return False
            if mutations.active(NO_STABLE_QUORUM):
                return True
            return sum(1 for n in positions if n in self.stable_ids) >= self.stable_quorum

        try:
            while not enough():
                if not pending:
                    raise WalError(E.ON_SHUTDOWN, "no majority to fence")
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                # In node order, not the set's: the same answers give the same recovery
                # (ties between equal logs included; `raftwal simulate` replays it).
                for task in sorted(done, key=lambda t: pending[t]):
                    node = pending.pop(task)
                    positions[node] = task.result()
        finally:
            # Late fences still help: let them finish in the background, bounded by _check_current.
            for task in pending:
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
        for node, reply in positions.items():
            if node in self._replicas:
                self._replicas[node].next_lsn = reply.last_lsn + 1
        await buggify.point("owner.recovery.fenced")
        best = max(positions.values(), key=lambda r: (r.last_term, r.last_lsn))
        if mutations.active(ADOPT_SHORTEST_LOG):
            best = min(positions.values(), key=lambda r: (r.last_term, r.last_lsn))
        if mutations.active(BEST_LOG_BY_LSN):
            best = max(positions.values(), key=lambda r: (r.last_lsn, r.last_term))
        if best.node_id != self.node_id and (best.last_term, best.last_lsn) > (
            self.log.last_term,
            self.log.last_lsn,
        ):
            await self._adopt(best.node_id, best.last_lsn, best.last_term)
        await buggify.point("owner.recovery.adopted")
        self._check_current()
        # Replicas of an older version refuse flagged frames (a rolling upgrade): flag only
        # when every replica heard from says it takes them. A replica that did not answer
        # yet and turns out older stays behind until it runs this version too.
        self._batch_flags = all(reply.batch_frames for reply in positions.values())

    async def _recover_rest(self) -> None:
        if not mutations.active(NON_ATOMIC_BATCH):
            await self._drop_partial_batch()
        if not mutations.active(KEEP_PARTIAL_TXN):
            await self._drop_partial_txn()
        if not mutations.active(SKIP_PRODUCER_REBUILD):
            await self._rebuild_producers()
        await buggify.point("owner.recovery.trimmed")
        self._check_holds_floor()
        # Seal the inherited open segment, then start this term's segment.
        async with self._write_lock:
            if self.log.open_segment_first_lsn() is not None:
                await self._append_entry(MsgType.SEAL, int(EntryFlags.SEAL_MARKER))
            # The term start opens this term's segment (nothing of this term before it);
            # the producer state follows it at once, so that the segment holds it even if
            # nothing else is ever written in it.
            result_lsn = await self._append_entry(MsgType.TERM_START, int(EntryFlags.TERM_START))
            await self._write_producer_state()
        self.start_lsn = result_lsn
        self._segment_opened_at = time.monotonic()
        for replica in self._replicas.values():
            replica.task = asyncio.create_task(self._replicate(replica))
        await buggify.point("owner.recovery.term_start")
        await self._wait_committed(self.start_lsn, recovering=True)
        await buggify.point("owner.recovery.ready")
        attempt = 0
        while True:
            self._check_current()
            try:
                code = await self.proposer.pchannel_ready(self.pchannel, self.term, self.start_lsn)
            except Exception as error:  # noqa: BLE001 - unknown outcome: retried (idempotent)
                logger.info("%s: PChannelReady failed (%r); retrying", self.pchannel, error)
                await self._backoff(attempt)
                attempt += 1
                continue
            if code != E.OK:
                raise WalError(code, f"PChannelReady({self.pchannel}, {self.term}) rejected")
            break
        self.state = "serving"
        self.ready.set()
        # The term is ready: what it counted is committed now, for readers and replicas.
        self.log.advance_committed(self.committed_lsn)
        for replica in self._replicas.values():
            replica.wake.set()
        logger.info(
            "%s: serving at term %d from lsn %d (committed %d)",
            self.pchannel,
            self.term,
            self.start_lsn,
            self.committed_lsn,
        )

    # -- an external implementation (jetstream) ---------------------------------------------

    async def _adopt_external(self) -> None:
        """Recovery on an external implementation: make this log equal to what the
        implementation stores, then fence it at this term. Every acknowledged batch is
        stored there (it was acknowledged only once stored), so adopting the stored log keeps
        it; a local suffix the implementation does not hold was never acknowledged and is
        cut. Fencing expects the implementation's last position as read: if an older owner
        stored more meanwhile, the fence is refused and this adopts the new end first
        (docs/architecture.md, "The jetstream fencing argument"). Retried while the
        assignment holds; the backend being unreachable only delays it."""
        assert self.wal is not None
        attempt = 0
        while True:
            self._check_current()
            try:
                tail = await self.wal.tail()
                while True:
                    if tail.fenced_term > self.term:
                        raise FencedByTerm(
                            f"stored log fenced at {tail.fenced_term}", tail.fenced_term
                        )
                    await self._match_external(tail)
                    if tail.records == 0:
                        # An empty store starts at this log's end: the fence record says
                        # so (a later owner's walk back stops at it and keeps what is
                        # before it, e.g. the log before an AlterWAL's checkpoint).
                        tail = Tail(self.log.last_lsn, self.log.last_term, 0, records=0)
                    fenced = await self.wal.fence(self.term, tail)
                    if fenced is tail:
                        return
                    tail = fenced
                    self._check_current()
            except FencedByTerm as error:
                self._fence(max(error.term, self.term + 1))
                raise fenced_error(self.pchannel, self.term, self.fenced_by) from None
            except WalImplError as error:
                logger.info(
                    "%s: %s recovery at term %d: %s; retrying",
                    self.pchannel,
                    self.wal_name,
                    self.term,
                    error,
                )
            await self._backoff(attempt)
            attempt += 1

    def _holds(self, record: Record) -> bool:
        """Whether this log holds the last entry of `record` (a fence: the entry it was
        taken at). Below this log's retained start nothing can be compared, and what is
        there was committed before this log's start: it counts as held."""
        lsn = record.last_lsn
        term = record.prev_term if record.fence else record.term
        if lsn == 0 or lsn < self.log.first_lsn:
            return True
        return lsn <= self.log.last_lsn and self.log.term_at(lsn) == term

    async def _match_external(self, tail: Tail) -> None:
        """Make this log end where the stored log ends, `tail`: walk back from the stored
        end to the last record this log holds (Log Matching: then it holds everything
        before it too), cut this log after it, and append every stored record after it."""
        assert self.wal is not None
        if tail.records == 0:
            # An empty stream: this owner's fence starts it at this log's end; after an
            # AlterWAL that end is the checkpoint (anything after it here was never stored
            # there, so never acknowledged).
            lsn = self.checkpoint[0]
            if lsn > 0 and self.log.last_lsn > lsn:
                await self.log.truncate_after(lsn)
            return
        position, matched = tail.records, 0
        matched_lsn: int | None = None
        while position > 0:
            found = await self.wal.record_at(position)
            if found is None:
                position -= 1
                continue
            record, first = found
            if self._holds(record):
                matched, matched_lsn = position, record.last_lsn
                break
            position = first - 1
        if matched_lsn is not None and self.log.last_lsn > matched_lsn:
            logger.warning(
                "%s: dropping lsn %d..%d: the %s log ends at lsn %d",
                self.pchannel,
                matched_lsn + 1,
                self.log.last_lsn,
                self.wal_name,
                matched_lsn,
            )
            await self.log.truncate_after(matched_lsn)
        async for record, _ in self.wal.scan(matched + 1, tail.records):
            self._check_current()
            if record.fence or not record.frames:
                continue
            prev = record.first_lsn - 1
            if self.log.last_lsn > prev:
                await self.log.truncate_after(max(prev, self.log.first_lsn - 1))
            restart = self.log.last_lsn != prev or (
                prev >= self.log.first_lsn and self.log.term_at(prev) != record.prev_term
            )
            if restart and (self.log.last_lsn > 0 or prev > 0):
                # A stored record that does not continue this log (a gap in the stream or
                # a fence that named an older end than what follows it). Starting the log
                # over at the record would drop every entry before it here, acknowledged
                # ones included: stop instead (the recovery is retried) and say so.
                raise Corrupt(
                    f"{self.pchannel}: the {self.wal_name} record at lsn {record.first_lsn} "
                    f"(prev term {record.prev_term}) does not continue this log, which ends "
                    f"at ({self.log.last_lsn}, {self.log.last_term}); not adopted"
                )
            result = await self.log.append(
                self.term, prev, record.prev_term, record.frames, from_log_start=restart
            )
            await self.log.wait_durable(result)
        if tail.last_lsn and (self.log.last_lsn, self.log.last_term) != (
            tail.last_lsn,
            tail.last_term,
        ):
            raise Corrupt(
                f"{self.pchannel}: the adopted log ends at ({self.log.last_lsn}, "
                f"{self.log.last_term}), the stored one at ({tail.last_lsn}, {tail.last_term})"
            )

    def _external_reported(self, value: int | BaseException) -> None:
        """The implementation's durable callback: a new durable LSN, or why it stopped."""
        if isinstance(value, BaseException):
            if isinstance(value, FencedByTerm):
                self._fence(max(value.term, self.term + 1))
            else:
                self._backend_failure(value)
            return
        if value > self._external_durable:
            self._external_durable = value
            self._update_commit()

    async def _adopt(
        self, source: str, source_last_lsn: int, source_last_term: int, stop_at: int = 0
    ) -> None:
        """Make this log equal to `source`'s (fenced at this term, so it no longer grows):
        cut what it lacks, backing up on a mismatch, and copy its suffix.

        Equal, not merely as long: a stale owner coming back may hold an uncommitted
        suffix of an old term that is longer than the best log, which holds committed
        entries of a newer term at those LSNs. Anything past the best log's end is on no
        majority (the best log holds every committed entry), so it was never committed."""
        if self.log.last_lsn > source_last_lsn:
            logger.warning(
                "%s: dropping lsn %d..%d (term %d at the end): the log of %s ends at lsn %d of "
                "term %d",
                self.pchannel,
                source_last_lsn + 1,
                self.log.last_lsn,
                self.log.last_term,
                source,
                source_last_lsn,
                source_last_term,
            )
            await self.log.truncate_after(source_last_lsn)
        attempt = 0
        while (self.log.last_lsn, self.log.last_term) != (source_last_lsn, source_last_term):
            self._check_current()
            request = wire.FetchRequest(
                pchannel=self.pchannel,
                term=self.term,
                prev_lsn=self.log.last_lsn,
                prev_term=self.log.last_term,
                max_bytes=self.config.replication_chunk_bytes,
            )
            try:
                reply = await wait_within(
                    self.transport.fetch(source, request), self.config.rpc_timeout_s * 5
                )
            except Exception as error:  # noqa: BLE001 - retried while the assignment holds
                logger.info("%s: fetch from %s failed: %r", self.pchannel, source, error)
                await self._backoff(attempt)
                attempt += 1
                continue
            if reply.status == wire.APPEND_STATUS_FENCED:
                self._fence(reply.fenced_term)
                raise fenced_error(self.pchannel, self.term, reply.fenced_term)
            if reply.status == wire.APPEND_STATUS_MISMATCH:
                changed = (reply.last_lsn, reply.last_term) != (source_last_lsn, source_last_term)
                if reply.last_lsn < source_last_lsn or (changed and not stop_at):
                    # The source's log is no longer what its fence answer said (fenced at
                    # this term, it can only have lost entries: a disk that gave back
                    # durable data). Backing up to it could cut committed entries of our
                    # own; this recovery stops and the next term's fences again. (A copy
                    # up to a WAL switch's checkpoint, `stop_at`, names the checkpoint,
                    # not the source's end, which may lie past it.)
                    raise WalError(
                        E.INNER,
                        f"pchannel {self.pchannel}: the log of {source} ends at lsn "
                        f"{reply.last_lsn} of term {reply.last_term}, not at lsn "
                        f"{source_last_lsn} of term {source_last_term} as it answered the "
                        "fence; not adopting it",
                        current_term=self.term,
                    )
                keep = self._backup_point(
                    reply.conflict_term, reply.conflict_first_lsn, reply.last_lsn
                )
                await self.log.truncate_after(min(keep, self.log.last_lsn - 1))
                continue
            if reply.status != wire.APPEND_STATUS_OK or not reply.frames:
                await self._backoff(attempt)
                attempt += 1
                continue
            if reply.log_start_lsn:
                # Our end is below what the source retains: its frames start its log (kept
                # here only where they prove this log matches; see PChannelLog.append).
                result = await self.log.append(
                    self.term, reply.log_start_lsn - 1, 0, reply.frames, from_log_start=True
                )
            else:
                result = await self.log.append(
                    self.term, request.prev_lsn, request.prev_term, reply.frames
                )
            await self.log.wait_durable(result)
            if stop_at and self.log.last_lsn > stop_at:
                # Copying a prefix only (`_adopt_checkpoint`): the source went on after it.
                await self.log.truncate_after(stop_at)

    def _backup_point(self, conflict_term: int, conflict_first: int, their_last: int) -> int:
        """The LSN after which two logs may still match, from a MISMATCH hint (Raft's fast
        back-up): our last entry of `conflict_term` when we have that term, otherwise just
        before the first entry they hold at that term."""
        if conflict_term == 0:
            return 0
        ours = self.log.last_lsn_of_term_at_most(conflict_term)
        if ours and self.log.term_at(ours) == conflict_term:
            return min(ours, their_last)
        return max(0, min(conflict_first - 1, their_last))

    async def _drop_partial_batch(self) -> None:
        """A log that ends in an entry flagged BATCH_CONTINUES holds only a prefix of its
        write batch (a torn tail, a catch-up chunk, a fetch cut short): the batch was never
        acknowledged, since the commit point only ever moves to a batch's end
        (`_update_commit`) and the log adopted holds every committed entry. Drop the
        prefix, so that the producer's retry of the batch is written once, whole."""
        last = self.log.last_lsn
        start = None
        lsn = last
        while lsn >= self.log.first_lsn and last - lsn < MAX_BATCH_ENTRIES:
            if not _header(self.log, lsn)[10] & BATCH_CONTINUES_FLAG:
                break
            start = lsn
            lsn -= 1
        if start is not None:
            logger.warning(
                "%s: dropping lsn %d..%d, the prefix of a batch whose end no replica holds",
                self.pchannel,
                start,
                last,
            )
            await self.log.truncate_after(start - 1)

    async def _drop_partial_txn(self) -> None:
        """A transaction at the very end of the log without its commit entry was never
        acknowledged (the commit entry is written with the body, in one batch): drop it so
        that it can never become visible."""
        last = self.log.last_lsn
        if last < self.log.first_lsn:
            return
        start = None
        lsn = last
        scanned = 0
        while lsn >= self.log.first_lsn and scanned < 1_000_000:
            header = _header(self.log, lsn)
            flags = header[10]
            if not flags & TXN_FLAGS or flags & (EntryFlags.TXN_COMMIT | EntryFlags.TXN_ROLLBACK):
                break
            start = lsn
            if flags & EntryFlags.TXN_BEGIN:
                break
            lsn -= 1
            scanned += 1
        if start is not None:
            logger.warning(
                "%s: dropping an uncommitted transaction tail at lsn %d..%d",
                self.pchannel,
                start,
                last,
            )
            await self.log.truncate_after(start - 1)

    async def _rebuild_producers(self) -> None:
        """Recover idempotent producers' recent sequences from the log's tail: the last
        `PRODUCER_SCAN_ENTRIES` entries, walking frame headers and decoding properties only
        where there are some (recovery time matters: this runs during a failover).

        A producer-state entry met on the way (an earlier owner's, see
        `_write_producer_state`) replaces the table with what it lists, the history kept
        before it included: it holds every producer of the log before it, those whose
        batches retention deleted too, and none that expired. With one, the table is
        complete; without (a log written before such entries existed), producers not in
        the tail are looked for in the whole log when asked for (`_know_producer`)."""
        last = self.log.last_lsn
        start = max(self.log.first_lsn, last - PRODUCER_SCAN_ENTRIES)
        # A scan of a whole log that retention never cut misses nothing either.
        self._producers_complete = start <= 1
        marker = int(EntryFlags.TIME_TICK_MARKER)
        async for entry_lsn, txn_id, flags, tick, properties in self._entries_with_properties(
            start, last
        ):
            try:
                state = properties.get(PRODUCERS_PROPERTY)
                if state is not None and flags & marker:
                    self._load_producer_state(decode_producer_state(state))
                    self._producer_state_lsn = entry_lsn
                    self._producers_complete = True
                    continue
                txn_count = properties.get(TXN_COUNT_PROPERTY)
                if txn_count is not None and txn_id:
                    self.remember_txn(txn_id, entry_lsn - int(txn_count) + 1, entry_lsn)
                batch = _producer_batch(entry_lsn, tick, properties)
                if batch is not None:
                    self._remember(properties[PRODUCER_ID_PROPERTY], batch)
            except (KeyError, ValueError) as error:
                logger.warning(
                    "%s: unreadable producer bookkeeping at lsn %d: %s",
                    self.pchannel,
                    entry_lsn,
                    error,
                )
        self._expire_producers(self.log.last_time_tick)

    def _load_producer_state(self, state: dict[str, _ProducerBatch]) -> None:
        """Make the table what a producer-state entry lists (see `_rebuild_producers`)."""
        table: dict[str, list[_ProducerBatch]] = {}
        # In the order they last wrote, as `_remember` keeps the table.
        for producer, newest in sorted(state.items(), key=lambda item: item[1].last_lsn):
            history = [b for b in self._producers.get(producer, ()) if b.last_lsn < newest.last_lsn]
            history.append(newest)
            table[producer] = history[-PRODUCER_HISTORY:]
        self._producers = table

    def _expire_producers(self, now_tick: int) -> None:
        """Forget the producers whose newest batch is older than `producer_expiry_ms` at
        time tick `now_tick` (replicated producers excepted)."""
        horizon = now_tick - (self.config.producer_expiry_ms << TICK_LOGICAL_BITS)
        expired = [
            producer
            for producer, history in self._producers.items()
            if history[-1].time_tick < horizon
            and not producer.startswith(REPLICATED_PRODUCER_PREFIX)
            and history[-1].done is None
        ]
        for producer in expired:
            del self._producers[producer]
        if expired:
            self.producers_expired["timeout"] += len(expired)
            logger.info(
                "%s: %d idempotent producer(s) idle past %d ms forgotten (e.g. %r)",
                self.pchannel,
                len(expired),
                self.config.producer_expiry_ms,
                expired[0][:64],
            )

    def producer_count(self) -> int:
        """Idempotent producers this owner remembers (a metric)."""
        return len(self._producers)

    async def _entries_with_properties(
        self, first: int, last: int
    ) -> AsyncIterator[tuple[int, int, int, int, dict[str, str]]]:
        """(lsn, txn id, flags, time tick, properties) of the entries first..last that have
        properties, reading frame headers only elsewhere; entries whose properties do not
        decode are skipped."""
        unpack = ENTRY_HEADER.unpack_from
        lsn = first
        while lsn <= last:
            data, chunk_last = self.log.read_frames_range(lsn, 4 << 20)
            if not data:
                break
            view = memoryview(data)
            offset, size = 0, len(data)
            while offset < size:
                fields = unpack(data, offset)
                properties_len, entry_lsn = fields[1], fields[2]
                body = offset + ENTRY_HEADER_SIZE + fields[11] + fields[12]
                if properties_len and entry_lsn <= last:
                    try:
                        properties = decode_properties(view[body : body + properties_len])
                        yield entry_lsn, fields[6], fields[10], fields[4], properties
                    except (KeyError, ValueError):
                        pass
                offset = align_up(body + properties_len)
            lsn = chunk_last + 1
            await asyncio.sleep(0)

    async def _know_producer(self, producer_id: str) -> None:
        """Make sure the producer table has `producer_id`'s newest batch if the log has
        one: the tail scan at recovery covers the last PRODUCER_SCAN_ENTRIES entries; a
        producer not seen there is looked for in the whole log, once per owner, unless
        recovery found a producer-state entry (then the table is complete)."""
        if (
            self._producers_complete
            or producer_id in self._producers
            or producer_id in self._producers_scanned
        ):
            return
        found: _ProducerBatch | None = None
        async for entry_lsn, _, _, tick, properties in self._entries_with_properties(
            self.log.first_lsn, self.log.last_lsn
        ):
            if properties.get(PRODUCER_ID_PROPERTY) == producer_id:
                with contextlib.suppress(KeyError, ValueError):
                    found = _producer_batch(entry_lsn, tick, properties) or found
        self._producers_scanned.add(producer_id)
        if found is not None and producer_id not in self._producers:
            self._remember(producer_id, found)

    async def producer_checkpoint(self, producer_id: str) -> tuple[int, int]:
        """(newest sequence, LSN of that batch's last entry) of `producer_id` on this
        pchannel, (0, 0) when it is unknown here (it never wrote, or it expired); answered
        once that batch is committed. Retention does not change the answer: the owner's
        producer-state entries carry it past the deletion of the batch's entries."""
        self._check_serving()
        await self._know_producer(producer_id)
        history = self._producers.get(producer_id)
        if not history:
            return 0, 0
        newest = history[-1]
        await self._wait_committed(newest.last_lsn)
        return newest.sequence, newest.last_lsn

    def remember_txn(self, txn_id: int, first_lsn: int, last_lsn: int) -> None:
        """Record a committed transaction's entries (by the servicer at commit, and from the
        log's tail when an owner recovers)."""
        self._committed_txns[txn_id] = (first_lsn, last_lsn)
        self._committed_txns.move_to_end(txn_id)
        while len(self._committed_txns) > TXN_OUTCOMES:
            self._committed_txns.popitem(last=False)

    async def committed_txn(self, txn_id: int) -> list[tuple[int, int]] | None:
        """[(lsn, time_tick)] of a committed transaction's entries, as its commit answered,
        or None when this owner does not know it committed (it may have expired, been rolled
        back, or be older than what the owner remembers)."""
        span = self._committed_txns.get(txn_id)
        if span is None:
            return None
        first, last = span
        await self._wait_committed(last)
        if first < self.log.first_lsn:
            return None
        entries = self.log.entries(first, 1 << 30, last)
        return [(e.lsn, e.time_tick) for e in entries]

    def _remember(self, producer: str, batch: _ProducerBatch) -> None:
        # The table is in the order producers last wrote (least recent first).
        history = self._producers.pop(producer, None)
        if history is None:
            if len(self._producers) >= self.config.max_producers:
                self._forget_least_recent()
            history = []
        self._producers[producer] = history
        history.append(batch)
        if len(history) > PRODUCER_HISTORY:
            del history[0]

    def _forget_least_recent(self) -> bool:
        """Make room for one more producer: forget the one that wrote least recently, but
        never a replicated producer (a standby's checkpoint) nor one with a batch in
        flight. Returns whether one was forgotten."""
        oldest = next(
            (
                producer
                for producer, history in self._producers.items()
                if not producer.startswith(REPLICATED_PRODUCER_PREFIX) and history[-1].done is None
            ),
            None,
        )
        if oldest is None:
            return False
        del self._producers[oldest]
        self.producers_expired["capacity"] += 1
        logger.warning(
            "%s: more than %d idempotent producers: forgot %r, the least recently written",
            self.pchannel,
            self.config.max_producers,
            oldest[:64],
        )
        return True

    async def _append_control(self, msg_type: int, flags: int) -> int:
        """Append one control entry of this owner's (a seal marker, a time tick), the
        producer state first when it is due (`_before_append`). Under the write lock."""
        await self._before_append()
        return await self._append_entry(msg_type, flags)

    async def _append_entry(
        self, msg_type: int, flags: int, properties: Mapping[str, str] = _NO_PROPERTIES
    ) -> int:
        lsn = self.log.last_lsn + 1
        tick = hybrid_tick(self.log.last_time_tick, self._wall_ms())
        batch = encode_batch(
            [
                Entry(
                    lsn=lsn,
                    term=self.term,
                    time_tick=tick,
                    msg_type=msg_type,
                    flags=flags,
                    properties=properties,
                )
            ]
        )
        await self._write_locked(batch.data, batch.meta)
        return lsn

    # -- producer state -------------------------------------------------------------------------

    async def _before_append(self) -> None:
        """Write the producer state first when the next append would open a segment (every
        segment then holds the state as of its start, so retention, which deletes whole
        segments and never the last, never deletes the newest one) or when the newest is
        PRODUCER_STATE_EVERY_ENTRIES behind (recovery's tail scan then finds one). A seal
        marker ends its segment: it never needs one. Under the write lock."""
        if (
            self.log.open_segment_first_lsn() is None
            or self.log.last_lsn - self._producer_state_lsn >= PRODUCER_STATE_EVERY_ENTRIES
        ):
            await self._write_producer_state()

    async def _write_producer_state(self) -> None:
        """Append a producer-state entry (a TIME_TICK control entry whose PRODUCERS_PROPERTY
        lists each remembered producer's newest batch), unless no producer is remembered.

        Why in the log rather than beside it: it then moves with the log, by the same
        rules. Every replica holds it, a new owner adopts it with the log it adopts, a
        replica catching up from a retention floor gets it with the first segment, a
        truncation removes it with the batches it summarizes, and it is committed exactly
        when the entries before it are. Under the write lock."""
        tick = hybrid_tick(self.log.last_time_tick, self._wall_ms())
        self._expire_producers(tick)
        if not self._producers:
            return
        while True:
            records = sorted(
                (producer, newest.sequence, newest.first_lsn, newest.last_lsn, newest.time_tick)
                for producer, history in self._producers.items()
                for newest in (history[-1],)
            )
            value = encode_producer_state(records)
            # One entry's properties are bounded: the least recently written go first.
            if len(value.encode()) + 64 <= MAX_PROPERTIES_BYTES or not self._forget_least_recent():
                break
        lsn = self.log.last_lsn + 1
        batch = encode_batch(
            [
                Entry(
                    lsn=lsn,
                    term=self.term,
                    time_tick=tick,
                    msg_type=int(MsgType.TIME_TICK),
                    flags=int(EntryFlags.TIME_TICK_MARKER),
                    properties={PRODUCERS_PROPERTY: value},
                )
            ]
        )
        await self._write_locked(batch.data, batch.meta)
        self._producer_state_lsn = lsn

    # -- time ticks ---------------------------------------------------------------------------

    def advance_time_tick(self, idle_s: float) -> bool:
        """Start appending a time-tick entry (TIME_TICK_MARKER, no vchannel) when nothing
        was appended for `idle_s` and every appended entry is committed; returns whether one
        was started. Never waits: the entry commits like any other, and Consume streams see
        the committed time tick move.

        Why this is a safe watermark: the entry is committed only on a majority at this
        term, a later owner adopts a log holding it and ticks strictly above it
        (`hybrid_tick`), and ticks rise with LSNs within a term; so once an entry with tick
        t is committed, no entry with a tick <= t can be committed after it. A fenced or
        paused owner cannot commit one, so it cannot move the watermark either.
        Concurrent callers share one append (one entry per pchannel per `idle_s` at most)."""
        if (
            self.state != "serving"
            or self.paused
            or self._tick_task is not None
            or self._write_lock.locked()
            or self.log.last_lsn != self.committed_lsn
            or time.monotonic() - self._last_append_at < idle_s
        ):
            return False
        self._tick_task = asyncio.create_task(self._append_time_tick())
        return True

    async def _append_time_tick(self) -> None:
        try:
            async with self._write_lock:
                if self.state != "serving":
                    return
                await self._append_control(MsgType.TIME_TICK, int(EntryFlags.TIME_TICK_MARKER))
        except WalError as error:
            # The owner stopped or the disk refused: its streams see that on their own.
            logger.debug("%s: time-tick append failed: %s", self.pchannel, error.info.message)
        finally:
            self._tick_task = None

    # -- writing -----------------------------------------------------------------------------

    async def _write_locked(self, frames: bytes, meta) -> None:  # type: ignore[no-untyped-def]
        prev_lsn = meta.first_lsn - 1
        prev_term = self.log.term_at(prev_lsn) if prev_lsn >= self.log.first_lsn else 0
        try:
            result = await self.log.append_local(frames, meta, self.term)
        except Fenced as error:
            self._fence(error.fenced_term)
            raise fenced_error(self.pchannel, self.term, error.fenced_term) from None
        except BadBatch:
            raise  # a bug of the caller, not of the disk
        except (OSError, LogError) as error:
            if self.log.failure is None and not self.log.closed:
                # The write failed and was cut back (ENOSPC, EIO): the log is unchanged and
                # this batch simply failed; the next one may succeed.
                if getattr(error, "errno", None) in _DISK_FULL_ERRNOS:
                    raise WalError(
                        E.RESOURCE_EXHAUSTED,
                        f"pchannel {self.pchannel}: {DISK_FULL_MARK} on node {self.node_id} "
                        f"({error}); nothing was written, retry once space returns",
                        current_term=self.term,
                    ) from None
                raise WalError(
                    E.INNER,
                    f"pchannel {self.pchannel}: local write failed on node {self.node_id} "
                    f"({error}); nothing was written, retry later",
                    current_term=self.term,
                ) from None
            self._local_failure(error)
            raise WalError(
                E.ON_SHUTDOWN,
                f"pchannel {self.pchannel} at term {self.term} stopped: {self.failure or error}",
                current_term=self.term,
            ) from None
        self._cache(meta.first_lsn, meta.last_lsn, prev_term, frames, result.sealed)
        self._batch_ends.append(meta.last_lsn)
        if self._external:
            self.wal.append(  # type: ignore[union-attr]
                Record(meta.first_lsn, meta.last_lsn, self.term, prev_term, frames)
            )
        for replica in self._replicas.values():
            replica.wake.set()
        if result.sealed:
            self._segment_opened_at = time.monotonic()
        self._last_append_at = time.monotonic()
        if mutations.active(OWNER_EARLY_DURABLE):
            self._self_durable = max(self._self_durable, result.last_lsn)
        task = asyncio.create_task(self._local_durable(result))
        task.add_done_callback(_log_failure)

    async def _local_durable(self, result) -> None:  # type: ignore[no-untyped-def]
        try:
            await self.log.wait_durable(result)
        except (LogError, OSError, ValueError) as error:
            self._local_failure(error)
            return
        if result.last_lsn > self._self_durable:
            self._self_durable = result.last_lsn
            self._update_commit()

    def _cache(
        self, first_lsn: int, last_lsn: int, prev_term: int, frames: bytes, sealed: bool
    ) -> None:
        self._recent[first_lsn] = (last_lsn, prev_term, frames, crc32c(frames), sealed)
        self._recent_bytes += len(frames)
        while self._recent_bytes > self.config.recent_cache_bytes and len(self._recent) > 1:
            _, (_, _, old, _, _) = self._recent.popitem(last=False)
            self._recent_bytes -= len(old)

    def _update_commit(self) -> None:
        if self._external:
            # Durable where the implementation stores it: its acknowledgement is the vote.
            point = self._external_durable
        else:
            matches = sorted(
                [self._self_durable, *(r.match_lsn for r in self._replicas.values())],
                reverse=True,
            )
            point = matches[0 if mutations.active(ACK_ONE_REPLICA) else self.majority - 1]
        # Only entries of this term commit by counting (Raft): the term start comes first.
        if point <= self.committed_lsn:
            return
        old_term = point < self.start_lsn or self.start_lsn <= 0
        if old_term and not mutations.active(COUNT_OLD_TERM):
            return
        # Only to the end of a batch: a majority may hold a prefix of one (a catch-up
        # chunk ends inside it), and a prefix must never be committed, or a new owner
        # could neither drop it nor tell a producer's retry of the batch from a new one.
        # (The mutations put the old rules back: any counted point commits.)
        ends = self._batch_ends
        end = point if old_term or mutations.active(NON_ATOMIC_BATCH) else 0
        while ends and ends[0] <= point:
            end = max(end, ends.popleft())
        if end > self.committed_lsn:
            point = end
            self.committed_lsn = point
            self._commit_times.append((point, time.monotonic()))
            if self.ready.is_set() or (old_term and mutations.active(COUNT_OLD_TERM)):
                # (Before the term is ready, nothing is announced: `announced_commit_lsn`.)
                self.log.committed_lsn = max(self.log.committed_lsn, point)
            self._notify_progress()
            # An idle sender passes the new commit point on (see COMMIT_NOTICE_DELAY_S).
            for replica in self._replicas.values():
                replica.wake.set()

    async def _wait_committed(self, lsn: int, recovering: bool = False) -> None:
        while self.committed_lsn < lsn:
            if self.state == "fenced":
                raise fenced_error(self.pchannel, self.term, self.fenced_by)
            if self.state == "closed" or (not recovering and self.state != "serving"):
                raise WalError(
                    E.ON_SHUTDOWN,
                    f"owner of {self.pchannel} is {self.state}"
                    + (f" ({self.failure})" if self.failure else ""),
                )
            if recovering:
                self._check_current()
                await wait_event(self._progress, 0.5)
                continue
            # Serving: a future that `_notify_progress` settles once the commit point
            # reaches `lsn`, or when the owner leaves service (every change of state away
            # from "serving" notifies).
            waiter = asyncio.get_running_loop().create_future()
            waiters = self._commit_waiters
            if len(waiters) >= _WAITERS_BEFORE_SWEEP and len(waiters) % _WAITERS_BEFORE_SWEEP == 0:
                # Cancelled writers leave their futures behind until the commit point
                # passes them; while it stands still, drop those so the heap stays small.
                waiters[:] = [w for w in waiters if not w[2].done()]
                heapq.heapify(waiters)
            heapq.heappush(waiters, (lsn, next(self._waiter_sequence), waiter))
            await waiter

    def _repeat_of(self, producer_id: str, sequence: int, count: int) -> _ProducerBatch | None:
        """The batch of `producer_id` with `sequence` if the owner holds it (a retry);
        None for a new batch. Raises INVALID_REQUEST_SEQ for a retry of another size or a
        sequence older than the producer's retained window."""
        history = self._producers.get(producer_id)
        if not history:
            return None
        for batch in history:
            if batch.sequence == sequence:
                if batch.last_lsn - batch.first_lsn + 1 != count:
                    raise WalError(
                        E.INVALID_REQUEST_SEQ,
                        f"producer {producer_id} sequence {sequence} was a batch of "
                        f"{batch.last_lsn - batch.first_lsn + 1} messages (got {count})",
                    )
                return batch
        if sequence < history[-1].sequence:
            raise WalError(
                E.INVALID_REQUEST_SEQ,
                f"producer {producer_id} sequence {sequence} is older than the retained "
                f"window (newest {history[-1].sequence})",
            )
        return None

    async def _answer_repeat(self, batch: _ProducerBatch) -> list[tuple[int, int]]:
        """The positions of a batch written earlier, once it is committed."""
        if batch.done is not None:
            return await asyncio.shield(batch.done)
        await self._wait_committed(batch.last_lsn)
        if batch.first_lsn < self.log.first_lsn and batch.time_tick:
            # Retention deleted its entries. A batch's ticks rise by one from entry to
            # entry (`_append_locked`), so its last one gives them all.
            return [
                (lsn, batch.time_tick - (batch.last_lsn - lsn))
                for lsn in range(batch.first_lsn, batch.last_lsn + 1)
            ]
        entries = self.log.entries(batch.first_lsn, 1 << 30, batch.last_lsn)
        return [(e.lsn, e.time_tick) for e in entries]

    async def _append_locked(
        self,
        messages: Sequence[Message],
        producer_id: str,
        sequence: int,
        expected_last_lsn: int,
        previous_sequence: int | None,
        contiguous: bool,
        admit: Callable[[], None] | None,
    ) -> tuple[list[tuple[int, int]], _ProducerBatch | None, int, int]:
        """`write`'s append, under the write lock: the checks that must hold when the batch
        gets its LSNs, then the batch itself. Returns ([(lsn, time_tick)], the producer
        record or None, rows, WAL bytes)."""
        if admit is not None:
            admit()
        if contiguous:
            history = self._producers.get(producer_id)
            newest = history[-1].sequence if history else 0
            if newest != previous_sequence:
                raise WalError(
                    E.INVALID_REQUEST_SEQ,
                    f"producer {producer_id} does not continue here (got "
                    f"previous_sequence {previous_sequence}; expected {newest}, the "
                    "newest sequence this pchannel holds)",
                )
        if expected_last_lsn:
            actual = self.log.last_lsn
            want = 0 if expected_last_lsn == -1 else expected_last_lsn
            if actual != want:
                raise WalError(
                    E.UNMATCHED_CHANNEL_TERM,
                    f"expected_last_lsn {expected_last_lsn} does not hold (last lsn {actual})",
                    current_term=self.term,
                )
        estimate = sum(100 + len(m[2]) + len(m[3]) for m in messages)
        if (
            self.log.open_segment_first_lsn() is not None
            and self.log.open_segment_bytes() + estimate > self.config.segment_max_bytes
        ):
            # Seal first: a batch (a transaction in particular) never spans segments.
            await self._append_control(MsgType.SEAL, int(EntryFlags.SEAL_MARKER))
        await self._before_append()
        first_lsn = self.log.last_lsn + 1
        tick = self.log.last_time_tick
        wall_tick = self._wall_ms() << TICK_LOGICAL_BITS
        term = self.term
        rows = []
        last_index = len(messages) - 1
        # Every entry but the last says that more of its batch follows (atomic batches).
        more = BATCH_CONTINUES_FLAG if self._batch_flags else 0
        for index, message in enumerate(messages):
            vchannel_id, msg_type, key, payload, properties, flags, txn_id, broadcast_id = message
            tick = tick + 1 if tick >= wall_tick else wall_tick
            if index != last_index:
                flags |= more
            elif producer_id:
                properties = {
                    **properties,
                    PRODUCER_ID_PROPERTY: producer_id,
                    PRODUCER_SEQ_PROPERTY: str(sequence),
                    PRODUCER_COUNT_PROPERTY: str(len(messages)),
                }
            rows.append(
                (
                    first_lsn + index,
                    term,
                    tick,
                    msg_type,
                    vchannel_id,
                    flags,
                    txn_id,
                    broadcast_id,
                    key,
                    payload,
                    properties,
                )
            )
        batch = encode_rows(rows)
        await self._write_locked(batch.data, batch.meta)
        positions = [(row[0], row[2]) for row in rows]
        record = None
        if producer_id and sequence > 0:
            record = _ProducerBatch(
                sequence,
                first_lsn,
                first_lsn + len(rows) - 1,
                asyncio.get_running_loop().create_future(),
                time_tick=rows[-1][2],
            )
            self._remember(producer_id, record)
        return positions, record, len(rows), len(batch.data)

    async def write(
        self,
        messages: Sequence[Message],
        *,
        producer_id: str = "",
        sequence: int = 0,
        expected_last_lsn: int = 0,
        previous_sequence: int | None = None,
        admit: Callable[[], None] | None = None,
    ) -> tuple[list[tuple[int, int]], bool]:
        """Write `messages` as one batch; returns ([(lsn, time_tick)], duplicate) once a
        majority holds them durably. Raises WalError.

        `admit`, when given, runs under the write lock just before the append and may
        raise (a RaftwalError or WalError) to refuse the batch: a check that must hold at
        the moment the batch gets its LSNs (a switchover's write pause), not earlier.

        With `previous_sequence` (and a producer id and sequence) the batch must continue
        the producer's newest sequence exactly: a retry of a batch already written is
        answered as a duplicate, any other batch that does not follow it is refused with
        INVALID_REQUEST_SEQ, checked under the write lock so that two writers can never
        both continue the same sequence."""
        started = time.perf_counter()
        self._check_serving()
        self._check_not_paused()
        repeat: _ProducerBatch | None = None
        if producer_id and sequence > 0:
            repeat = self._repeat_of(producer_id, sequence, len(messages))
            if repeat is not None:
                return await self._answer_repeat(repeat), True
        contiguous = previous_sequence is not None and bool(producer_id) and sequence > 0
        if contiguous:
            await self._know_producer(producer_id)
        # Writers take their turns in the order they came: one waiting for room (bounded
        # uncommitted data) is never overtaken by a later one, so a producer's pipelined
        # batches reach the log in sequence order. The producer checks are made again
        # under the write lock, where the producer table cannot change: a retry that
        # raced its own first attempt is answered as a duplicate, never written twice.
        async with self._write_turn:
            for admission in list(self._admissions.values()):
                await admission()
            await self._wait_room()
            await self._write_lock.acquire()
        try:
            self._check_serving()
            if producer_id and sequence > 0:
                repeat = self._repeat_of(producer_id, sequence, len(messages))
            if repeat is None:
                self._check_not_paused()
            if repeat is None:
                positions, record, rows, wal_bytes = await self._append_locked(
                    messages,
                    producer_id,
                    sequence,
                    expected_last_lsn,
                    previous_sequence,
                    contiguous,
                    admit,
                )
        finally:
            self._write_lock.release()
        if repeat is not None:
            return await self._answer_repeat(repeat), True
        try:
            await self._wait_committed(positions[-1][0])
        except WalError as error:
            if record is not None and record.done is not None and not record.done.done():
                record.done.set_exception(error)
                record.done.exception()  # retrieved: no "never retrieved" warning
            raise
        if record is not None and record.done is not None:
            record.done.set_result(positions)
            record.done = None
        if self.observer is not None:
            self.observer.batch_acknowledged(
                self.pchannel, rows, wal_bytes, time.perf_counter() - started
            )
        return positions, False

    async def _wait_room(self) -> None:
        while (
            self.log.last_lsn > self.committed_lsn
            and self._recent_bytes_uncommitted() > self.config.max_uncommitted_bytes
        ):
            self._check_serving()
            await wait_event(self._progress, 0.5)

    def _recent_bytes_uncommitted(self) -> int:
        total = 0
        for _first, (last, _, frames, _, _) in reversed(self._recent.items()):
            if last <= self.committed_lsn:
                break
            total += len(frames)
        return total

    # -- replication -------------------------------------------------------------------------

    def _frames_from(self, lsn: int) -> tuple[int, bytes, int, int]:
        """(prev_term, frames, last lsn, crc32c of frames) starting at `lsn`. Batches still
        in memory are sent as they are, several consecutive ones joined into one request
        when a replica is behind (fewer, larger messages under load; never across a
        segment end, since a seal marker must end its request). Otherwise the frames are
        read back from the log (catch-up)."""
        cached = self._recent.get(lsn)
        if cached is None:
            prev_term = self.log.term_at(lsn - 1) if lsn - 1 >= self.log.first_lsn else 0
            frames, last = self.log.read_frames_range(lsn, self.config.replication_chunk_bytes)
            return prev_term, frames, last, crc32c(frames)
        last, prev_term, frames, crc, sealed = cached
        parts = None
        size = len(frames)
        while not sealed and size < self.config.replication_chunk_bytes:
            following = self._recent.get(last + 1)
            if following is None:
                break
            if parts is None:
                parts = [frames]
            last, _, more, _, sealed = following
            parts.append(more)
            size += len(more)
        if parts is None:
            return prev_term, frames, last, crc
        joined = b"".join(parts)
        return prev_term, joined, last, crc32c(joined)

    async def _replicate(self, replica: _Replica) -> None:
        attempt = 0
        while self.state in ("recovering", "serving"):
            stream = None
            try:
                stream = self.transport.open_append(replica.node_id)
                await self._pump(replica, stream)
                attempt = 0
            except asyncio.CancelledError:
                if stream is not None:
                    stream.cancel()
                raise
            except _Resync:
                attempt = 0
            except Exception as error:  # noqa: BLE001 - a replica being down is normal
                replica.last_error = repr(error)
                logger.debug("%s: replication to %s: %r", self.pchannel, replica.node_id, error)
                attempt += 1
            finally:
                if stream is not None:
                    stream.cancel()
            if self.state in ("recovering", "serving") and attempt:
                await self._backoff(min(attempt, 5))

    async def _pump(self, replica: _Replica, stream: AppendStream) -> None:
        if replica.next_lsn <= 0 or replica.next_lsn > self.log.last_lsn + 1:
            replica.next_lsn = self.log.last_lsn + 1
        replica.next_lsn = max(replica.next_lsn, replica.match_lsn + 1, self.log.first_lsn)
        # Where the next stream resumes unless answers say more: where this one starts.
        resume = replica.next_lsn
        inflight: asyncio.Queue[int] = asyncio.Queue()
        window = 64
        sent = asyncio.Semaphore(window)

        async def send() -> None:
            request_id = 0
            # Always send at least one request so that the replica reports where it is.
            first = True
            sent_committed = -1
            while True:
                if replica.next_lsn > self.log.last_lsn and not first:
                    replica.wake.clear()
                    if (
                        replica.next_lsn > self.log.last_lsn
                        and sent_committed >= self.announced_commit_lsn
                    ):
                        await wait_event(replica.wake, 1.0)
                    # Only the commit point moved: a write sent within the delay carries
                    # it, else a heartbeat does (replicas serving reads learn it).
                    deadline = time.monotonic() + COMMIT_NOTICE_DELAY_S
                    while (
                        replica.next_lsn > self.log.last_lsn
                        and sent_committed < self.announced_commit_lsn
                        and (left := deadline - time.monotonic()) > 0
                    ):
                        replica.wake.clear()
                        await wait_event(replica.wake, left)
                        if replica.next_lsn > self.log.last_lsn:
                            # Idle: a heartbeat carrying the committed LSN.
                            pass
                await sent.acquire()
                lsn = replica.next_lsn
                crc = None
                if lsn <= self.log.last_lsn and lsn not in self._recent:
                    # A catch-up from the log (entries no longer in memory) is slow.
                    await buggify.point("owner.catchup")
                    lsn = replica.next_lsn
                if lsn <= self.log.last_lsn:
                    prev_term, frames, last, crc = self._frames_from(lsn)
                else:
                    prev_term = self.log.term_at(lsn - 1) if lsn - 1 >= self.log.first_lsn else 0
                    frames, last = b"", lsn - 1
                request_id += 1
                sent_committed = self.announced_commit_lsn
                await stream.write(
                    wire.AppendRequest(
                        pchannel=self.pchannel,
                        term=self.term,
                        prev_lsn=lsn - 1,
                        prev_term=prev_term,
                        frames=frames,
                        committed_lsn=sent_committed,
                        request_id=request_id,
                        owner_node_id=self.node_id,
                        frames_crc=crc,
                        from_log_start=lsn == self.log.first_lsn and lsn > 1,
                    )
                )
                replica.next_lsn = last + 1
                first = False
                inflight.put_nowait(request_id)

        sender = asyncio.create_task(send())
        answered = 0
        try:
            async for response in stream.responses():
                # A replica may answer several requests at once (the newest stands for all
                # before it): free one window slot per request covered.
                covered = max(1, response.request_id - answered)
                answered = max(answered, response.request_id)
                for _ in range(covered):
                    sent.release()
                if response.status == wire.APPEND_STATUS_OK:
                    durable_lsn = response.durable_lsn
                    if mutations.active(MATCH_BY_LAST_LSN):
                        durable_lsn = response.last_lsn
                    if durable_lsn > replica.match_lsn:
                        replica.match_lsn = durable_lsn
                        self._update_commit()
                    replica.last_error = ""
                elif response.status == wire.APPEND_STATUS_FENCED:
                    self._fence(response.fenced_term)
                    return
                elif response.status == wire.APPEND_STATUS_MISMATCH:
                    keep = self._backup_point(
                        response.conflict_term, response.conflict_first_lsn, response.last_lsn
                    )
                    replica.next_lsn = min(keep, response.last_lsn) + 1
                    replica.match_lsn = min(replica.match_lsn, keep)
                    resume = replica.next_lsn
                    raise _Resync()
                else:
                    replica.last_error = response.error.message
                    raise RuntimeError(f"replica {replica.node_id}: {response.error.message}")
                if sender.done():
                    sender.result()
        finally:
            await _stop_sender(sender)
            # Whatever was in flight is resent from the last match, or from where this
            # stream started (or a MISMATCH's back-up point) when that is further on: a
            # stream that ends before its first answer says nothing about the replica's
            # log, and the match of a replica not yet heard from at this term is 0, which
            # would send it the whole log again from its start.
            replica.next_lsn = max(replica.match_lsn + 1, resume)
        raise ConnectionError(f"append stream to {replica.node_id} ended")

    # -- sealing and committing segments ------------------------------------------------------

    async def settled_last_lsn(self) -> int:
        """The last LSN once every write that holds the write lock now has appended: a
        write admitted later gets a higher LSN."""
        async with self._write_lock:
            return self.log.last_lsn

    def _check_not_paused(self) -> None:
        if self.paused:
            raise WalError(
                E.ON_SHUTDOWN,
                f"{self.paused}: writes resume at the next term on the new implementation; retry",
                current_term=self.term,
            )

    async def flush_for_alter(self, epoch: int, target: str) -> tuple[int, int, int]:
        """FLUSHING of AlterWAL `epoch`: refuse every later write (ON_SHUTDOWN, which
        producers retry at the next owner), seal the open segment, and wait until every
        entry is committed and the manifest covers it. Returns the checkpoint (lsn, term,
        time tick): the last entry, after which this owner appends nothing."""
        async with self._write_lock:
            self._check_serving()
            if not self.paused:
                self.paused = (
                    f"pchannel {self.pchannel} is switching its WAL to {target or 'segments'} "
                    f"(AlterWAL epoch {epoch})"
                )
                logger.info("%s: FLUSHING for AlterWAL epoch %d", self.pchannel, epoch)
            if self.log.open_segment_first_lsn() is not None:
                await self._append_entry(MsgType.SEAL, int(EntryFlags.SEAL_MARKER))
            last = self.log.last_lsn
        await self._wait_committed(last)
        while self.proposer.committed_through(self.pchannel) < last:
            self._check_serving()
            await wait_event(self._progress, 0.1)
        header = _header(self.log, last)
        return last, self.log.term_at(last), header[4]

    async def seal_now(self) -> None:
        async with self._write_lock:
            self._check_serving()
            if self.log.open_segment_first_lsn() is not None:
                await self._append_control(MsgType.SEAL, int(EntryFlags.SEAL_MARKER))

    async def _commit_loop(self) -> None:
        attempt = 0
        while self.state == "serving":
            try:
                if (
                    self.log.open_segment_first_lsn() is not None
                    and time.monotonic() - self._segment_opened_at
                    > self.config.segment_max_age_ms / 1000
                ):
                    await self.seal_now()
                await self._commit_ready_segments()
                if time.monotonic() - self._producer_expiry_at >= PRODUCER_EXPIRY_CHECK_S:
                    self._producer_expiry_at = time.monotonic()
                    self._expire_producers(hybrid_tick(self.log.last_time_tick, self._wall_ms()))
                # Consecutive failures: a success clears the status warning.
                attempt = self.commit_failures = 0
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                raise
            except WalError as error:
                if error.info.code == E.CHANNEL_FENCED:
                    return
                self.commit_failures += 1
                self.last_commit_error = str(error)
                await self._backoff(attempt)
                attempt += 1
            except Exception as error:  # noqa: BLE001 - counted, visible in status, retried
                self.commit_failures += 1
                self.last_commit_error = repr(error)
                logger.warning("%s: segment commit failed: %r", self.pchannel, error)
                await self._backoff(attempt)
                attempt += 1

    async def _commit_ready_segments(self) -> None:
        through = self.proposer.committed_through(self.pchannel)
        for segment in self.log.sealed_segments():
            if segment.last_lsn <= through:
                continue
            if segment.first_lsn != through + 1 or segment.last_lsn > self.committed_lsn:
                return
            summary = segment.summary
            if summary is None:
                return
            replicas = [
                node for node, lsn in self.replica_positions().items() if lsn >= segment.last_lsn
            ]
            fields = {
                "first_lsn": summary.first_lsn,  # type: ignore[attr-defined]
                "last_lsn": summary.last_lsn,  # type: ignore[attr-defined]
                "first_term": summary.first_term,  # type: ignore[attr-defined]
                "last_term": summary.last_term,  # type: ignore[attr-defined]
                "first_time_tick": summary.first_time_tick,  # type: ignore[attr-defined]
                "last_time_tick": summary.last_time_tick,  # type: ignore[attr-defined]
                "count": summary.entry_count,  # type: ignore[attr-defined]
                "bytes": segment.path.stat().st_size,
                "digest": summary.digest,  # type: ignore[attr-defined]
                "replica_node_ids": sorted(replicas),
            }
            await buggify.point("owner.commit_segment")
            code = await self.proposer.commit_segment(self.pchannel, self.term, fields)
            if code == E.UNMATCHED_CHANNEL_TERM:
                self._fence(self.term + 1)
                raise fenced_error(self.pchannel, self.term, self.term + 1)
            if code != E.OK:
                raise WalError(
                    code, f"CommitSegment [{segment.first_lsn}, {segment.last_lsn}] rejected"
                )
            await asyncio.to_thread(
                self.log.catalog.mark_committed, self.pchannel, segment.first_lsn
            )
            through = segment.last_lsn


class _Resync(Exception):
    """The replica's log diverged: reconnect from the new next LSN."""


def _header(log: PChannelLog, lsn: int) -> tuple[int, ...]:
    return log._header_at(lsn)  # noqa: SLF001


async def _stop_sender(sender: asyncio.Task[None]) -> None:
    """Cancel a replica's sender and wait until it has stopped. Python 3.11's
    `asyncio.wait_for` swallows a cancellation that arrives just as what it waits for
    completes (the replica's wake event, set by every append); the sender then went on to
    block on its full window for good, and so did this replica's replication (seen in the
    chaos suite: an owner never heard from a replica again). The sender now waits with
    `rpc.aio.wait_event`, which cannot lose a cancel; this still cancels until it is done,
    a bounded number of times, and says so if it is not."""
    for _ in range(SENDER_STOP_ATTEMPTS):
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({sender}, timeout=0.1)
        if sender.done():
            break
    else:
        logger.error(
            "replica sender %s did not stop after %d cancels", sender, SENDER_STOP_ATTEMPTS
        )
    if sender.done() and not sender.cancelled():
        sender.exception()  # retrieved: a failed write is what ended the stream anyway


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("background task failed: %r", task.exception())


__all__ = [
    "BadBatch",
    "ChannelOwner",
    "Message",
    "Mismatch",
    "OwnerConfig",
    "Proposer",
    "ReplicaTransport",
    "WalError",
    "WriteObserver",
    "hybrid_tick",
]
