"""One simulated history of the WAL replication protocol: ``run_seed(seed, options)``.

The code under test is the real one: each node runs ``wal_segments``' `DataPlane` (its
`ChannelOwner`s and `PChannelLog`s, on real segment files in a tmpfs directory), the
node's `NodeDataView` (the Proposer and the coordination view of ``raftwal.node``), the
real reconcile loop, ``raftwal.services``' `ReplicationServicer` answering Fence, Fetch
and Append, and its `StreamingNodeServicer` answering the clients' Produce, transaction
and Consume calls. What is simulated (``raftwal.sim.runtime``): the clock, the event
loop, the disk (a power cut drops unsynced bytes, tears writes, keeps directory changes
in another order than file data, and a failed fsync loses its pages), and here:

- the network between nodes and clients: every message is delayed, an Append stream
  delivers in the order sent and may break at any message, calls and their answers may
  be lost, and links are cut by partitions (a node, a single link, or a client from a
  node);
- the coordination plane behind a simulated Raft (`SimRaft`): three voters elect a
  leader among those that reach a majority, a leader cut off from the majority steps
  down and another is elected; proposals travel to the leader and may be lost, time out
  and still commit later (late proposals), or lose their answer; each node applies the
  committed commands only while the leader reaches it, so its view (and the clients'
  views it feeds) lags; the real state machine (``statemachine.apply_command``) applies
  each command; the leader's coordinator loop judges liveness from heartbeats that
  travel over the simulated network (a partitioned owner fails over while it still
  runs and clients still reach it), and runs the real balancer's failovers, repairs
  and widenings; a nemesis crashes nodes (a kill, or a power cut), partitions them,
  shrinks and moves replica sets, and proposes retention;
- each node's ``catalog.db`` with the durability its ``synchronous`` setting gives
  (`_CatalogDisk`);
- buggify points (``wal_segments.buggify``): per seed some are on, and slow the code
  down or crash the node at a rare step (a fence answer, a seal, each step of a tail
  recovery);
- clients (``raftwal.sim.clients``): idempotent producers with multi-message batches and
  retries with the same sequence, transactions, consumers on owners and replicas, all
  routing with views that may be stale.

After the faults, everything heals and the run waits for every pchannel to serve and
make progress, then checks the history (`World._check_final`, and during the run):
every acknowledged message is at its LSN in the owner's log, exactly once, in its
producer's order; transactions are whole or absent, and an acknowledged one is present;
what a consumer read is what the log holds; no two nodes' committed entries differ (byte
for byte), every segment Raft committed holds what the owner's log holds, and terms never
go back and time ticks always rise along a log; and every time any node's commit point
rises (`_CommittedWatch`), the entries it covers must be what every node ever held
committed there, and in the final owner's log. One seed is one history: the same seed
gives the same trace, byte for byte. Even seeds play a plain world and odd seeds a rich
one (`rich_profile`).

Must never: read the real clock or real randomness inside a run, or let one seed's state
leak into the next (each gets a new loop, disk and world).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import logging
import os
import random
import re
import shutil
import sqlite3
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftwal.node.data_plane import NodeDataView, reconcile_loop
from raftwal.services import streaming_node
from raftwal.services.replication import ReplicationServicer
from raftwal.services.streaming_node import StreamingNodeServicer
from raftwal.sim.clients import (
    Consumer,
    LaneOptions,
    ProducerLane,
    Router,
    TxnClient,
    abort_info,
)
from raftwal.sim.runtime import NODE, Incarnation, SimClock, SimDisk, SimLoop
from rpc.aio import Signal, wait_event
from rpc.errors import code_name
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from statemachine import balancer
from statemachine.apply import apply_command
from statemachine.state import copy_state, new_state
from wal_segments import buggify, mutations
from wal_segments import plane as plane_module
from wal_segments.catalog import Catalog
from wal_segments.format import (
    BATCH_CONTINUES_FLAG,
    TXN_FLAGS,
    EntryFlags,
    FormatError,
    check_frame,
    decode_properties,
    frame_headers,
    iter_batch,
)
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import PChannelLog
from wal_segments.owner import TXN_COUNT_PROPERTY, ChannelOwner, OwnerConfig, WalError
from wal_segments.plane import DataPlane

E = errors_pb2
#: how a message's padding shows in a violation (`World.padding`)
_PADDING = re.compile(r"\.{8,}")
PCHANNEL_PREFIX = "p"
_TRACED_LOGGERS = ("wal_segments", "raftwal.services.replication", "raftwal.node.data_plane")
#: Raft voters: the first three nodes (the others are learners: they apply, never vote).
VOTERS = 3


#: Virtual seconds of faults of a seed of each profile (`World.rich`).
PLAIN_DURATION_S = 2.5
RICH_DURATION_S = 4.0
#: Virtual seconds of faults the isolation ring adds to its seeds (`World._isolation_ring`)
RING_EXTRA_S = 3.0


def rich_profile(seed: int) -> bool:
    """Whether `seed` plays the rich world (odd seeds) or the plain one (even seeds).

    A world tuned for one kind of history finds the bugs that history shows and misses
    others: the plain world's short histories of small messages, few scenarios and plain
    crashes find mistakes in the commit rule of older terms and in shared fsyncs that the
    rich world's long, dense histories of padded messages, split brains and brown-outs
    bury, and the rich world finds the recovery and failed-fsync mistakes the plain world
    never composes (RELIABILITY.md, "The mutation suite"). So every seed draws its world
    from one of two profiles, as FoundationDB draws its knobs per seed."""
    return seed % 2 == 1


@dataclass(frozen=True)
class SimOptions:
    nodes: int = 4
    #: a seed's number of pchannels is drawn from 1..pchannels
    pchannels: int = 3
    replica_count: int = 3
    clients: int = 2
    #: virtual seconds of faults, then at most `heal_s` for everything to serve again
    #: (None: the seed's profile's, `PLAIN_DURATION_S` or `RICH_DURATION_S`)
    duration_s: float | None = None
    #: a seed's mean time between faults is one of these
    fault_intervals_s: tuple[float, ...] = (0.15, 0.3, 0.6)
    #: virtual seconds from the start to the first fault
    settle_s: float = 0.4
    heal_s: float = 30.0
    segment_max_bytes: int = 2048
    #: deliberate bugs to switch on (``wal_segments.mutations``)
    mutations: tuple[str, ...] = ()
    trace_lines: int = 400


@dataclass
class SeedResult:
    seed: int
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    crashes: int = 0
    power_cuts: int = 0
    power_cuts_dropping: int = 0
    dropped_bytes: int = 0
    #: acknowledged messages (producers' and transactions')
    acknowledged: int = 0
    #: producer batches answered as duplicates (a retry of a batch written before)
    duplicates: int = 0
    #: entries the consumers read
    read: int = 0
    failovers: int = 0
    leader_changes: int = 0
    late_proposals: int = 0
    buggified: int = 0
    sync_failures: int = 0
    #: 1 when a node ran the version before atomic batches (a rolling upgrade)
    rolling_upgrades: int = 0
    #: brown-outs (disks failing fsyncs, then a power cut of the nodes on a feed)
    brownouts: int = 0
    #: split-brain scenarios played (`World._split_brain`)
    split_brains: int = 0
    virtual_s: float = 0.0
    digest: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations


class _Abort(Exception):
    def __init__(self, info: errors_pb2.ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


class _Context:
    """What a Replication handler gets as its grpc context."""

    async def abort_with_status(self, status: Any) -> None:
        raise _Abort(abort_info(status))


# -- the catalog ------------------------------------------------------------------------------

#: Catalog methods that commit a change.
_CATALOG_WRITES = frozenset(
    {
        "raise_fenced_term",
        "upsert_segment",
        "mark_committed",
        "delete_segments_from",
        "delete_segments_before",
        "raise_retention_floor",
        "record_replica_positions",
    }
)


class _CatalogDisk:
    """A node's ``catalog.db`` across its incarnations: the real `Catalog` on an
    in-memory SQLite, and what of it is on the disk. At ``synchronous=FULL`` (what the
    catalog asks for) every commit is durable when it returns; at a weaker setting a
    commit reaches the disk only when the system happens to write it back (drawn per
    commit), and a power cut takes the catalog back to what is durable."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.catalog = Catalog(":memory:")
        self._durable = sqlite3.connect(":memory:")
        self._sync()

    def _sync(self) -> None:
        self.catalog._conn.backup(self._durable)  # noqa: SLF001

    def committed(self) -> None:
        level = self.catalog._conn.execute("PRAGMA synchronous").fetchone()[0]  # noqa: SLF001
        if level >= 2 or self._rng.random() < 0.3:
            self._sync()

    def power_cut(self) -> None:
        restored = Catalog(":memory:")
        self._durable.backup(restored._conn)  # noqa: SLF001
        self.catalog.close()
        self.catalog = restored

    def close(self) -> None:
        self.catalog.close()
        self._durable.close()


class _GuardedCatalog:
    """What a node's data plane holds as its catalog: the node's `_CatalogDisk`, which a
    crashed incarnation can no longer change."""

    def __init__(self, disk: _CatalogDisk) -> None:
        self._disk = disk

    def __getattr__(self, name: str) -> Any:
        incarnation = NODE.get()
        if incarnation is not None and not incarnation.alive:
            raise OSError(5, f"simulated: catalog.{name} after the node crashed")
        attribute = getattr(self._disk.catalog, name)
        if name not in _CATALOG_WRITES:
            return attribute
        disk = self._disk

        def write(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            disk.committed()
            return result

        return write

    def close(self) -> None:
        """Kept open: the next incarnation finds it as the disk has it."""


# -- the network --------------------------------------------------------------------------------


class _Stream:
    """One Append stream, owner -> replica: in order in each direction, each message
    delayed. It breaks on a cut link, a crash, a cancel or by chance: nothing more can be
    sent, what was sent before still arrives (then end of stream) unless the link is cut
    or the receiving incarnation died, as with TCP."""

    def __init__(self, world: World, source: str, target: str) -> None:
        self.world, self.source, self.target = world, source, target
        self.broken = False
        world.stream_serial += 1
        self.serial = world.stream_serial
        self._requests: asyncio.Queue[wire.AppendRequest | None] = asyncio.Queue()
        self._responses: asyncio.Queue[wire.AppendResponse | None] = asyncio.Queue()
        self._sent_at = [0.0, 0.0]
        #: per direction: what was sent and has not arrived yet, oldest first
        self._in_flight: tuple[deque[tuple[float, Any]], deque[tuple[float, Any]]] = (
            deque(),
            deque(),
        )
        self._ends: list[Incarnation | None] = [world.nodes[source].incarnation, None]
        #: per direction: (when the sender retransmits, when that arrives) of the last
        #: segment a retransmission timeout held back (`World.stall_s`)
        self._held = [(0.0, 0.0), (0.0, 0.0)]
        self._started = False
        #: per direction: what was sent after this is lost (a power cut of the sender
        #: loses what was still in its socket buffers)
        self.lost_after = [float("inf"), float("inf")]
        world.streams.add(self)

    def _schedule(self, direction: int, item: Any) -> None:
        world = self.world
        sent = world.clock.now
        delay = world.net_delay()
        if direction == 0 and not self._sent_at[0]:
            delay += world.net_delay() * 2  # the first message waits for the connection
        if item is not None:
            stall = world.stall_s()
            if stall:
                # A lost segment: the sender's kernel retransmits it after the RTO, and
                # the receiver's delivers nothing after it on this connection meanwhile
                # (head-of-line blocking); other connections are not held back.
                self._held[direction] = (sent + stall, sent + stall + delay)
                delay += stall
        at = max(sent + delay, self._sent_at[direction])
        self._sent_at[direction] = at
        queue = self._requests if direction == 0 else self._responses
        receiver = self._ends[1 - direction]
        in_flight = self._in_flight[direction]
        resent_at, held_until = self._held[direction]
        # What waits behind a retransmission is still the sender's to send then: a power
        # cut of the sender before that loses it (`lost_after`).
        in_flight.append((max(sent, resent_at) if at <= held_until else sent, item))

        def arrive() -> None:
            # In order, as on a TCP connection: arrivals are due in the order sent, but
            # timers due at the same instant run in no set order (the loop's heap), so
            # each one delivers the oldest message still in flight.
            sent_at, message = in_flight.popleft()
            if message is not None and (
                (receiver is not None and not receiver.alive)
                or frozenset((self.source, self.target)) in world.partitions
                or sent_at > self.lost_after[direction]
            ):
                return
            queue.put_nowait(message)

        world.loop.call_at(at, arrive)

    def _deliver(self, direction: int, item: Any) -> None:
        world = self.world
        if self.broken:
            return
        if not world.link_up(self.source, self.target) or world.rng.random() < world.break_rate:
            self.break_()
            return
        self._schedule(direction, item)

    def break_(self) -> None:
        if self.broken:
            return
        self.broken = True
        self._schedule(0, None)
        self._schedule(1, None)
        self.world.streams.discard(self)

    async def write(self, request: wire.AppendRequest) -> None:
        if self.broken:
            raise ConnectionError(f"append stream to {self.target} broke")
        if not self._started:
            self._started = True
            self.world.serve_stream(self)
        self._deliver(0, request)

    def served_by(self, incarnation: Incarnation | None) -> None:
        self._ends[1] = incarnation

    async def requests(self) -> AsyncIterator[wire.AppendRequest]:
        while True:
            request = await self._requests.get()
            if request is None:
                return
            yield request

    def answer(self, response: wire.AppendResponse) -> None:
        self._deliver(1, response)

    async def responses(self) -> AsyncIterator[wire.AppendResponse]:
        while True:
            response = await self._responses.get()
            if response is None:
                raise ConnectionError(f"append stream to {self.target} broke")
            yield response

    def cancel(self) -> None:
        self.break_()


class _Transport:
    """The owner's ReplicaTransport on one node incarnation."""

    def __init__(self, world: World, node_id: str) -> None:
        self.world, self.node_id = world, node_id

    def open_append(self, node_id: str) -> _Stream:
        return _Stream(self.world, self.node_id, node_id)

    async def fence(self, node_id: str, request: wire.FenceRequest) -> wire.FenceResponse:
        try:
            return await self.world.call(self.node_id, node_id, "Fence", request)
        except _Abort as error:
            if error.info.code == E.CHANNEL_FENCED:
                raise WalError(
                    E.CHANNEL_FENCED, error.info.message, current_term=error.info.current_term
                ) from None
            raise ConnectionError(error.info.message) from None

    async def fetch(self, node_id: str, request: wire.FetchRequest) -> wire.FetchResponse:
        try:
            return await self.world.call(self.node_id, node_id, "Fetch", request)
        except _Abort as error:
            raise ConnectionError(error.info.message) from None


# -- nodes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Budgets:
    txn_buffer_budget_bytes: int = 64 << 20
    txn_buffer_producer_budget_bytes: int = 16 << 20
    txn_buffer_identity_budget_bytes: int = 32 << 20


class SimNode:
    """One node id across its incarnations; while running, the host the data plane glue
    and the servicers see (``DataPlaneHost``, ``ReplicationBackend``,
    ``StreamingBackend``)."""

    def __init__(self, world: World, node_id: str) -> None:
        self.world = world
        self.node_id = node_id
        self.root = world.root / node_id
        self.root.mkdir(mode=0o700)
        self.catalog_disk = _CatalogDisk(random.Random(world.rng.random()))
        self.incarnation: Incarnation | None = None
        self.context: contextvars.Context | None = None
        self.applied = world.states[-1]
        self.applied_index = len(world.states) - 1
        self._changed = Signal()
        self.plane: DataPlane | None = None
        self.data_view: NodeDataView | None = None
        self.servicer: ReplicationServicer | None = None
        self.streaming: StreamingNodeServicer | None = None
        self.down_since: float | None = None
        self.txn_serial = 0
        #: runs the version before atomic batches (a rolling upgrade) until the restart
        #: that upgrades it (`World._upgrade`); a crash restarts the same version
        self.previous_version = False
        self.upgrade_pending = False

    # DataPlaneHost / ReplicationBackend / StreamingBackend
    @property
    def me(self) -> SimNode:
        return self

    @property
    def id(self) -> str:
        return self.node_id

    @property
    def grpc_address(self) -> str:
        return f"{self.node_id}.sim:1"

    @property
    def raft_address(self) -> str:
        return f"{self.node_id}.sim:2"

    @property
    def config(self) -> _Budgets:
        return _Budgets()

    @property
    def replica(self) -> SimNode:
        return self

    @property
    def notifier(self) -> SimNode:
        return self

    def read(self, reader: Callable[[pb.CoordinationState], Any]) -> Any:
        return reader(self.applied)

    def applied_revision(self) -> int:
        return self.applied.revision

    async def propose(self, command: pb.Command) -> pb.CommandResult:
        return await self.world.raft.propose(self.node_id, command)

    def suspect(self, node_id: str) -> None:
        pass

    async def wait_change(self, timeout_s: float) -> None:
        await wait_event(self._changed, timeout_s)

    @property
    def running(self) -> bool:
        return self.incarnation is not None and self.incarnation.alive

    def apply_up_to(self, index: int) -> None:
        if self.running and index > self.applied_index:
            self.applied_index = index
            self.applied = self.world.states[index]
            event, self._changed = self._changed, Signal()
            event.set()

    def start(self) -> None:
        number = self.incarnation.number + 1 if self.incarnation else 1
        if self.upgrade_pending:
            # The rolling upgrade reaches this node: it restarts at this version.
            self.previous_version = self.upgrade_pending = False
            self.world.trace_line(self.node_id, "restarts at this version (upgraded)")
        incarnation = Incarnation(self.node_id, number)
        self.incarnation = incarnation
        self.down_since = None
        # What it applied before (pysyncobj's journal is durable): the rest comes from
        # the leader, once it reaches this node.
        self.applied = self.world.states[self.applied_index]
        context = contextvars.copy_context()
        context.run(NODE.set, incarnation)
        self.context = context
        context.run(self._build)
        self.world.trace_line(self.node_id, f"started (incarnation {number})")

    def _build(self) -> None:
        world = self.world
        self.data_view = NodeDataView(self)
        self.plane = DataPlane(
            node_id=self.node_id,
            data_dir=self.root,
            policy=parse_fsync_policy("always"),
            owner_config=OwnerConfig(
                segment_max_bytes=world.segment_max_bytes,
                replication_chunk_bytes=world.chunk_bytes,
                retry_min_s=0.02,
                retry_max_s=0.3,
                rpc_timeout_s=0.5,
                batch_frames=not self.previous_version,
            ),
            transport=_Transport(world, self.node_id),
            proposer=self.data_view,
            view=self.data_view,
        )
        self.servicer = ReplicationServicer(self, self.plane)
        self.streaming = StreamingNodeServicer(self, self.plane, self.data_view)
        # Transaction ids from the seed, not from `secrets` (one seed, one history).
        self.streaming._new_txn_id = self._new_txn_id  # type: ignore[method-assign]  # noqa: SLF001
        stopping = asyncio.Event()
        asyncio.get_running_loop().create_task(
            reconcile_loop(self, self.plane, self.data_view, stopping)
        )

    def _new_txn_id(self) -> int:
        self.txn_serial += 1
        return (
            int(self.node_id[1:]) * 1_000_000 + self.incarnation.number * 10_000 + self.txn_serial
        )  # type: ignore[union-attr]

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        assert self.context is not None
        return asyncio.get_running_loop().create_task(coroutine, context=self.context)

    def crash(self, power: bool) -> int:
        incarnation = self.incarnation
        assert incarnation is not None and incarnation.alive
        incarnation.alive = False
        # A paused process dies too: what it had pending runs now, and finds it dead.
        self.world.paused_nodes.discard(self.node_id)
        self.world.loop.resume(incarnation)
        self.down_since = self.world.clock.now
        for task in list(incarnation.tasks):
            task.cancel()
        self.world.disk.close_fds(incarnation)
        world = self.world
        for stream in sorted(world.streams, key=lambda s: (s.source, s.target, s.serial)):
            if self.node_id in (stream.source, stream.target):
                if power:
                    # What it sent in its last moments was still in its socket buffers.
                    direction = 0 if stream.source == self.node_id else 1
                    stream.lost_after[direction] = world.clock.now - world.rng.uniform(0, 0.002)
                stream.break_()
        dropped = 0
        if power:
            dropped = world.disk.crash(
                self.node_id,
                keep_prefix_rate=0.3,
                torn_rate=world.torn_rate,
                keep_entries_rate=world.keep_entries_rate,
            )
            self.catalog_disk.power_cut()
        self.plane = None
        self.streaming = None
        return dropped


# -- Raft ----------------------------------------------------------------------------------------


class SimRaft:
    """The coordination plane's Raft as the data plane sees it (see the module doc):
    which node leads, which proposals commit (and when), which nodes have applied what,
    and the leader's heartbeat table. The log itself is the world's list of states:
    Raft's safety (one committed history, applied in order everywhere) is assumed, not
    simulated; its liveness and its timing are."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.voters = sorted(world.nodes)[:VOTERS]
        self.majority = len(self.voters) // 2 + 1
        self.leader: str | None = None
        self.term = 0
        #: node -> when the leader last heard its heartbeat (the leader's memory only)
        self.heard: dict[str, float] = {}
        #: commands a leader took without a quorum: committed later or lost
        self.pending: list[tuple[pb.Command, str]] = []
        self._no_quorum_since: float | None = None
        self._elect_at = 0.0

    def reaches_quorum(self, leader: str) -> bool:
        world = self.world
        if not world.nodes[leader].running or leader in world.paused_nodes:
            return False
        count = sum(
            1
            for v in self.voters
            if v == leader or (world.link_up(leader, v) and v not in world.paused_nodes)
        )
        return count >= self.majority

    def reaches(self, node_id: str) -> bool:
        """Whether the leader's log reaches `node_id` now (a paused node answers nothing)."""
        leader = self.leader
        return (
            leader is not None
            and node_id not in self.world.paused_nodes
            and (node_id == leader or self.world.link_up(leader, node_id))
        )

    async def run(self) -> None:
        world = self.world
        rng = world.rng
        while True:
            await asyncio.sleep(0.05)
            now = world.clock.now
            leader = self.leader
            if leader is not None:
                if self.reaches_quorum(leader):
                    self._no_quorum_since = None
                elif self._no_quorum_since is None:
                    self._no_quorum_since = now
                elif now - self._no_quorum_since > 0.3 or not world.nodes[leader].running:
                    # CheckQuorum: a leader that hears no majority steps down.
                    world.trace_line("raft", f"leader {leader} steps down (term {self.term})")
                    self.leader = None
                    self._elect_at = now + rng.uniform(0.15, 0.4)
            if self.leader is None and now >= self._elect_at:
                candidates = [v for v in self.voters if self.reaches_quorum(v)]
                if candidates:
                    self._elect(rng.choice(candidates))
            leader = self.leader
            if leader is None:
                continue
            # Heartbeats to the leader, over the network (a lost one is just late).
            for node_id, node in world.nodes.items():
                if node.running and self.reaches(node_id) and rng.random() > 0.1:
                    self.heard[node_id] = now
            # Followers the leader reaches catch up with the committed log.
            latest = len(world.states) - 1
            for node_id, node in world.nodes.items():
                if node.running and node.applied_index < latest and self.reaches(node_id):
                    world.loop.call_at(
                        now + world.net_delay() + world.apply_lag.get(node_id, 0.0),
                        node.apply_up_to,
                        latest,
                    )

    def _elect(self, leader: str) -> None:
        world = self.world
        self.term += 1
        previous, self.leader = self.leader, leader
        self._no_quorum_since = None
        world.result.leader_changes += 1
        # A new leader grants every node a full timeout before judging it.
        self.heard = {node_id: world.clock.now for node_id in world.nodes}
        world.trace_line("raft", f"{leader} leads at raft term {self.term}")
        pending, self.pending = self.pending, []
        for command, who in pending:
            # Taken by the old leader without a quorum: on the new one's log or not.
            if world.rng.random() < 0.5:
                world.result.late_proposals += 1
                world.apply(command, f"{who}+late")
        del previous

    def commit_local(self, command: pb.Command, who: str = "coord") -> pb.CommandResult | None:
        """A command of the leader's own (its coordinator loop): committed now if the
        leader reaches a quorum, else not at all."""
        leader = self.leader
        if leader is None or not self.reaches_quorum(leader):
            return None
        return self.world.apply(command, who)

    async def propose(self, who: str, command: pb.Command) -> pb.CommandResult:
        world = self.world
        rng = world.rng
        if not command.request_id:
            world.request_serial += 1
            command.request_id = f"sim-{world.request_serial}"
        await asyncio.sleep(world.net_delay())
        leader = self.leader
        if leader is None or not world.nodes[who].running or not self.reaches(who):
            await asyncio.sleep(0.2)
            raise ConnectionError("raft: no leader reachable")
        if rng.random() < world.late_rate:
            # Stuck in a queue somewhere: the proposer gives up, and it commits later.
            def late(command: pb.Command = command) -> None:
                if self.leader is not None and self.reaches_quorum(self.leader):
                    world.result.late_proposals += 1
                    world.apply(command, f"{who}+late")

            world.loop.call_at(
                world.clock.now + rng.uniform(0.2, 1.5), late, context=world.driver_context
            )
            await asyncio.sleep(0.5)
            raise ConnectionError("raft: proposal timed out")
        if not self.reaches_quorum(leader):
            self.pending.append((command, who))
            await asyncio.sleep(0.5)
            raise ConnectionError("raft: no quorum")
        await asyncio.sleep(world.net_delay())
        if self.leader != leader or not self.reaches_quorum(leader):
            if rng.random() < 0.5:
                world.apply(command, f"{who}+late")
            raise ConnectionError("raft: leader changed")
        result = world.apply(command, who)
        if rng.random() < world.lost_reply_rate / 2:
            raise ConnectionError("raft: reply lost")
        await asyncio.sleep(world.net_delay())
        return result


# -- the world -----------------------------------------------------------------------------------


class _TraceHandler(logging.Handler):
    def __init__(self, world: World) -> None:
        super().__init__(logging.INFO)
        self._world = world

    def emit(self, record: logging.LogRecord) -> None:
        incarnation = NODE.get()
        who = str(incarnation) if incarnation is not None else "-"
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log call must not end the run
            message = str(record.msg)
        message = message.replace(self._world.root_text, "<root>")
        self._world.trace_line(who, f"{record.levelname.lower()} {message}")


class History:
    """What the clients were told and what they read: the record the checks hold the
    logs to."""

    def __init__(self, world: World) -> None:
        self.world = world
        #: (pchannel, lsn) -> payload of every acknowledged message
        self.acked: dict[tuple[str, int], bytes] = {}
        #: payload -> (pchannel, lsn) it was acknowledged at
        self.acked_at: dict[bytes, tuple[str, int]] = {}
        #: (pchannel, lsn) -> (node, identity) of what a consumer read there first
        self.reads: dict[tuple[str, int], tuple[str, tuple[Any, ...]]] = {}
        #: txn id -> (pchannel, [(lsn, tick)], payloads) of acknowledged commits
        self.txns: dict[int, tuple[str, list[tuple[int, int]], list[bytes]]] = {}
        #: txn ids never committed by their client (rolled back or given up before it)
        self.abandoned: dict[int, list[bytes]] = {}
        self.lanes: list[ProducerLane] = []
        #: payload -> (producer id, sequence, index, payloads) of the batch it was sent in
        self.batch_of: dict[bytes, tuple[str, int, int, list[bytes]]] = {}
        self.submitted = 0
        self.unknown = 0

    def _ack(self, pchannel: str, lsn: int, payload: bytes, who: str) -> None:
        world = self.world
        key = (pchannel, lsn)
        previous = self.acked.get(key)
        if previous is not None and previous != payload:
            world.violation(
                f"{pchannel}: lsn {lsn} acknowledged twice, as {previous!r} and {payload!r}"
            )
        elsewhere = self.acked_at.get(payload)
        if elsewhere is not None and elsewhere != key:
            world.violation(
                f"{payload!r} acknowledged at two positions: {elsewhere} and {key} ({who})"
            )
        self.acked[key] = payload
        self.acked_at[payload] = key
        world.result.acknowledged += 1

    def batch_acknowledged(
        self,
        lane: ProducerLane,
        sequence: int,
        payloads: list[bytes],
        first_lsn: int,
        term: int,
        duplicate: bool,
    ) -> None:
        self.world.trace_line(
            lane.client,
            f"ack {lane.pchannel} seq {sequence} lsn {first_lsn}..{first_lsn + len(payloads) - 1}"
            f" (term {term}{', duplicate' if duplicate else ''})",
        )
        if duplicate:
            self.world.result.duplicates += 1
        for index, payload in enumerate(payloads):
            self._ack(lane.pchannel, first_lsn + index, payload, f"batch {sequence}")

    def txn_committed(
        self,
        client: str,
        pchannel: str,
        txn_id: int,
        payloads: list[bytes],
        positions: list[tuple[int, int]],
    ) -> None:
        self.world.trace_line(
            client, f"ack {pchannel} txn {txn_id} lsn {positions[0][0]}..{positions[-1][0]}"
        )
        if len(positions) != len(payloads) + 2:
            self.world.violation(
                f"{pchannel}: txn {txn_id} of {len(payloads)} messages committed at "
                f"{len(positions)} positions (expected {len(payloads) + 2})"
            )
            return
        self.txns[txn_id] = (pchannel, positions, payloads)
        for (lsn, _), payload in zip(positions[1:-1], payloads, strict=True):
            self._ack(pchannel, lsn, payload, f"txn {txn_id}")

    def txn_abandoned(self, txn_id: int, payloads: list[bytes]) -> None:
        self.abandoned[txn_id] = payloads

    def txn_unknown(self, txn_id: int, payloads: list[bytes]) -> None:
        self.unknown += len(payloads)

    def read(self, pchannel: str, node_id: str, entry: wire.WalEntry) -> None:
        identity = (
            entry.lsn,
            entry.term,
            entry.time_tick,
            entry.flags,
            entry.txn_id,
            entry.key,
            entry.payload,
        )
        key = (pchannel, entry.lsn)
        known = self.reads.get(key)
        if known is None:
            self.reads[key] = (node_id, identity)
            self.world.result.read += 1
        elif known[1] != identity:
            self.world.violation(
                f"{pchannel}: consumers read two entries at committed lsn {entry.lsn}: "
                f"{known[1]} from {known[0]}, then {identity} from {node_id}"
            )


class _CommittedWatch:
    """`PChannelLog.committed_lsn` while a seed runs: a data descriptor over the instance's
    own attribute that tells the world every raise (`World.committed_raised`), whether an
    owner counted it or a replica learnt it from an owner's announcement. The periodic
    checker samples logs every 0.25 virtual s; this sees every commit point a node ever
    held, also one that a truncation takes away before the next sample."""

    def __init__(self, world: World) -> None:
        self.world = world

    def __get__(self, log: Any, owner: Any = None) -> Any:
        if log is None:
            return self
        return log.__dict__.get("committed_lsn", 0)

    def __set__(self, log: Any, value: int) -> None:
        old = log.__dict__.get("committed_lsn", 0)
        log.__dict__["committed_lsn"] = value
        if value > old:
            self.world.committed_raised(log, old, value)


def _floor_watch(world: World, check: Callable[[ChannelOwner], None]) -> Callable[..., None]:
    """`ChannelOwner._check_holds_floor` while a seed runs: a recovered log below what
    earlier terms wrote and committed is refused there, and is a violation here. This
    world's disks never give back what they reported durable (no backup is restored
    either), so a fenced quorum whose best log lacks committed entries means the protocol
    lost them, even though the owner stops before it could do more harm."""

    def watched(owner: ChannelOwner) -> None:
        try:
            check(owner)
        except WalError:
            world.violation(
                f"{owner.pchannel}: committed entries lost: the log {owner.node_id} "
                f"recovered at term {owner.term} ends at lsn {owner.log.last_lsn}, below "
                f"lsn {owner.ready_floor} that earlier terms committed"
            )
            raise

    return watched


class World:
    def __init__(self, seed: int, options: SimOptions, root: Path) -> None:
        self.seed = seed
        self.options = options
        self.root = root
        self.root_text = str(root)
        self.rng = random.Random(seed)
        rng = self.rng
        #: this seed's profile (`rich_profile`): what the rich world adds is drawn only in it
        self.rich = rich_profile(seed)
        self.duration_s = (
            options.duration_s
            if options.duration_s is not None
            else (RICH_DURATION_S if self.rich else PLAIN_DURATION_S)
        )
        self.clock = SimClock()
        # A job handed to a worker thread (an fdatasync, a catalog write) runs somewhere
        # inside its latency: an fdatasync covers what was written when it began.
        self.loop = SimLoop(self.clock, self._io_latency, rng.random)
        self.disk = SimDisk(root, random.Random(rng.random()), rng.choice([0.0, 0.0, 0.01]))
        # This seed's fault and timing profile.
        #: how slow this seed's disks are (an fdatasync of about 1 ms times this): local
        #: SSDs, and disks an order of magnitude slower (network volumes, spinning ones),
        #: where appenders more often arrive while an fdatasync runs
        self.io_scale = rng.choice([1.0, 1.0, 1.0, 12.0])
        self.break_rate = rng.choice([0.0, 0.002, 0.01])
        self.base_delay_s = rng.choice([0.0005, 0.002, 0.01])
        self.lost_reply_rate = rng.choice([0.0, 0.05])
        self.client_loss_rate = rng.choice([0.0, 0.02, 0.1])
        self.late_rate = rng.choice([0.0, 0.03, 0.1])
        self.fault_interval_s = rng.choice(list(options.fault_intervals_s))
        # What the nemesis does, cumulative: crash, partition nodes, cut a client off,
        # change a replica set; else retention. Crash-heavy seeds, and seeds of mostly
        # partitions (where Raft stays up and judges a cut-off owner down while its
        # clients still reach it).
        self.fault_mix = rng.choice([(0.45, 0.7, 0.8, 0.93), (0.1, 0.65, 0.8, 0.93)])
        self.power_rate = rng.choice([0.5, 0.8, 1.0])
        self.torn_rate = rng.choice([0.0, 0.3, 0.7])
        self.keep_entries_rate = rng.choice([0.0, 0.3, 0.7])
        self.chunk_bytes = rng.choice([512, 4096])
        #: messages are their identity, padded in some seeds by up to this many bytes
        #: (real messages are larger than the identities): a write then spans several
        #: 4 KiB pages, in segments (`segment_max_bytes`) of many pages
        self.payload_pad = rng.choice([0, 0, 400, 3000]) if self.rich else 0
        self.segment_max_bytes = options.segment_max_bytes * (8 if self.payload_pad else 1)
        #: extra seconds a node takes to apply what Raft committed (a slow follower)
        self.apply_lag: dict[str, float] = {}
        self.pchannel_count = rng.randint(1, options.pchannels)
        # Buggify points on for this seed: point -> (how often it fires, how often it
        # crashes the node instead of slowing it down).
        self.buggify_on: dict[str, tuple[float, float]] = {}
        for point in sorted(buggify.POINTS):
            if rng.random() < 0.3:
                crash = 0.3 if point.startswith("owner.recovery") else 0.05
                self.buggify_on[point] = (rng.choice([0.1, 0.3, 0.6]), crash)
        self.states: list[pb.CoordinationState] = [new_state()]
        self.state = copy_state(self.states[0])
        self.raft_index = 0
        self.request_serial = 0
        self.partitions: set[frozenset[str]] = set()
        self.streams: set[_Stream] = set()
        self.stream_serial = 0
        self.trace: list[str] = []
        #: False once the run is over: what its teardown logs (cancelled tasks, in an
        #: order that depends on memory addresses) is not part of the history.
        self.tracing = True
        self._digest = hashlib.sha256()
        self.result = SeedResult(seed)
        self.history = History(self)
        self.stopping = False
        self.clients_stopping = False
        self.faulting = True
        self.assigning_since: dict[tuple[str, int], float] = {}
        self.nodes: dict[str, SimNode] = {}
        self.clients: list[str] = [f"c{i + 1}" for i in range(options.clients)]
        #: crashed nodes' restarts still to come: (when, node id)
        self._restarts: list[tuple[float, str]] = []
        self.driver_context = contextvars.Context()
        self._mirrors: dict[tuple[str, str], _Mirror] = {}
        self._mirror_serial = 0
        self.pchannels: list[str] = []
        #: (pchannel, first lsn) -> (last lsn, frames) of every segment Raft committed
        self.committed_segments: dict[tuple[str, int], tuple[int, bytes]] = {}
        self._segments_verified: set[tuple[str, int]] = set()
        #: (pchannel, lsn) -> the frame an owner had committed there (seen by a check, or
        #: a term start when its PChannelReady committed)
        self.committed_frames: dict[tuple[str, int], bytes] = {}
        #: (pchannel, payload) -> lsn where a serving owner's committed log holds it
        self._payload_at: dict[tuple[str, bytes], int] = {}
        self._payload_checked: dict[str, tuple[int, int]] = {}
        #: pchannel -> (term, node, seconds down): the owner that takes it over from
        #: `node` after `term` fails soon after its PChannelReady (`_split_brain`)
        self._fragile_successors: dict[str, tuple[int, str, float]] = {}
        #: pchannel -> lsn -> (term, node) of the entry some node held committed there
        #: (`committed_raised`)
        self._committed_terms: dict[str, dict[int, tuple[int, str]]] = {}
        #: how many of the next owners to be assigned crash in their tail recovery
        #: (`_plan_scenario`, `_arm_recovery_faults`)
        self._churn_left = 0
        #: no random fault before this time (a scenario plays out: `_plan_scenario`)
        self._quiet_until = 0.0
        #: the isolation ring (`_isolation_ring`): its pchannel, how many of its next
        #: owners it still takes on, the links it holds cut, and a serial per isolation
        self._ring_pchannel = ""
        self._ring_rounds = 0
        self._ring_links: set[frozenset[str]] = set()
        self._ring_isolated = ""
        self._ring_serial = 0
        self.raft: SimRaft
        # TCP retransmission timeouts (`stall_s`), drawn from a generator of their own:
        # a seed where none fires plays the history it played without them.
        self._net_rng = random.Random(f"tcp-stall:{seed}")
        self.stall_rate = self._net_rng.choice([0.0, 0.003, 0.01, 0.03])
        # Disk stalls (`disk_stalls`), likewise from a generator of their own: the mean
        # time between two (0: none in this seed), and node -> when its stall ends.
        self._disk_stall_rng = random.Random(f"disk-stall:{seed}")
        self.disk_stall_every_s = self._disk_stall_rng.choice([0.0, 0.0, 0.5, 1.5])
        self.disk_stalled_until: dict[str, float] = {}
        # Process pauses (`pauses`), from a generator of their own: the mean time between
        # two (0: none in this seed), and the nodes paused now.
        self._pause_rng = random.Random(f"pause:{seed}")
        self.pause_every_s = self._pause_rng.choice([0.0, 0.0, 0.7, 2.0])
        self.paused_nodes: set[str] = set()
        # Power cuts while a transaction commits (`power_cut_at_commit`), from a generator
        # of their own: how often a commit arms one (0: never in this seed).
        self._commit_cut_rng = random.Random(f"commit-cut:{seed}")
        self.commit_cut_rate = self._commit_cut_rng.choice([0.0, 0.0, 0.1, 0.3])

    # -- tracing ---------------------------------------------------------------------------

    def trace_line(self, who: str, text: str) -> None:
        if not self.tracing:
            return
        line = f"{self.clock.now - 1_000_000.0:9.4f} {who:<6} {text}"
        self._digest.update(line.encode())
        self.trace.append(line)
        if len(self.trace) > self.options.trace_lines * 2:
            del self.trace[: -self.options.trace_lines]

    def padding(self) -> bytes:
        """What pads a new message's identity (`payload_pad`)."""
        return b"." * self.rng.randint(0, self.payload_pad) if self.payload_pad else b""

    def violation(self, text: str) -> None:
        text = _PADDING.sub(lambda m: f"<{len(m.group())} pad bytes>", text)
        if text in self.result.violations:
            return  # found again by a later pass
        self.trace_line("CHECK", f"VIOLATION {text}")
        self.result.violations.append(text)

    # -- timing ----------------------------------------------------------------------------

    def _io_latency(self) -> float:
        rng = self.rng
        latency = 0.0002 + self.io_scale * (
            rng.expovariate(1 / 0.001) if rng.random() < 0.9 else rng.uniform(0.005, 0.03)
        )
        if self.disk_stalled_until:
            incarnation = NODE.get()
            until = self.disk_stalled_until.get(incarnation.node_id) if incarnation else None
            if until is not None and until > self.clock.now:
                # The disk completes nothing until the stall ends (`disk_stalls`).
                latency += until - self.clock.now
        return latency

    def net_delay(self) -> float:
        return self.base_delay_s * (0.5 + self.rng.random()) + (
            self.rng.uniform(0.01, 0.08) if self.rng.random() < 0.03 else 0.0
        )

    def stall_s(self) -> float:
        """How long a message sent now waits for a retransmission (0: not at all). A
        segment lost on the wire is sent again after the retransmission timeout (Linux:
        200 ms at least, doubled at each further loss), and TCP delivers nothing after
        it on that connection meanwhile; a message on another connection (a new stream,
        a unary call) is not held back, so it may overtake the held one. This is how a
        stream an owner has given up on still delivers requests after the stream that
        replaced it, and how an owner of an older term still reaches a replica after the
        newer owner's first messages."""
        rng = self._net_rng
        if not self.faulting or not self.stall_rate or rng.random() >= self.stall_rate:
            return 0.0
        return 0.2 * 2 ** rng.choice([0, 0, 1, 1, 2, 3])

    def _up(self, endpoint: str) -> bool:
        node = self.nodes.get(endpoint)
        return node is None or node.running  # clients are always up

    def link_up(self, a: str, b: str) -> bool:
        if frozenset((a, b)) in self.partitions:
            return False
        return self._up(a) and self._up(b)

    # -- buggify -----------------------------------------------------------------------------

    async def buggify(self, name: str) -> None:
        spec = self.buggify_on.get(name)
        if spec is None or not self.faulting:
            return
        rate, crash_rate = spec
        rng = self.rng
        if rng.random() >= rate:
            return
        incarnation = NODE.get()
        if incarnation is None or not incarnation.alive:
            return
        self.result.buggified += 1
        if rng.random() < crash_rate:
            self.trace_line(incarnation.node_id, f"buggify {name}: crash")
            self._crash(incarnation.node_id, rng.random() < self.power_rate)
            await asyncio.sleep(0)  # the crash cancelled this task: it ends here
            return
        delay = rng.uniform(0.01, 0.6)
        self.trace_line(incarnation.node_id, f"buggify {name}: {delay * 1000:.0f} ms")
        await asyncio.sleep(delay)

    # -- network calls -----------------------------------------------------------------------

    def serve_stream(self, stream: _Stream) -> None:
        node = self.nodes[stream.target]
        if not node.running or node.servicer is None:
            stream.break_()
            return
        servicer = node.servicer
        stream.served_by(node.incarnation)
        previous_version = node.previous_version
        refused: list[wire.AppendRequest] = []

        async def requests() -> AsyncIterator[wire.AppendRequest]:
            async for request in stream.requests():
                if previous_version and _has_batch_flags(request.frames):
                    # The version before atomic batches refuses a frame with a flag it
                    # does not know: the request fails, and the stream with it.
                    refused.append(request)
                    return
                yield request

        async def serve() -> None:
            try:
                async for response in servicer.Append(requests(), _Context()):
                    stream.answer(response)
                for request in refused:
                    stream.answer(
                        wire.AppendResponse(
                            request_id=request.request_id,
                            status=wire.APPEND_STATUS_ERROR,
                            error=errors_pb2.ErrorInfo(
                                code=E.INVALID_ARGUMENT, message="unknown entry flags 0x100"
                            ),
                        )
                    )
            finally:
                stream.break_()

        node.spawn(serve())

    async def call(self, source: str, target: str, method: str, request: Any) -> Any:
        """A unary Replication call: the request or the answer may be lost (the caller's
        own timeout then ends it), each way is delayed."""
        loop = self.loop
        answer: asyncio.Future[Any] = loop.create_future()
        if not self.link_up(source, target) or self.rng.random() < self.lost_reply_rate / 2:
            return await answer  # lost: never answered
        lose_answer = self.rng.random() < self.lost_reply_rate / 2
        sender = self.nodes[source].incarnation if source in self.nodes else None
        request_stall = self.stall_s()

        def arrive() -> None:
            node = self.nodes[target]
            if not node.running or node.servicer is None or not self.link_up(source, target):
                return
            if request_stall and sender is not None and not sender.alive:
                return  # its sender died before it retransmitted the request
            handler = getattr(node.servicer, method)

            async def handle() -> None:
                try:
                    outcome: tuple[bool, Any] = (True, await handler(request, _Context()))
                    if node.previous_version and isinstance(outcome[1], wire.FenceResponse):
                        # The version before atomic batches does not know the field.
                        older = wire.FenceResponse()
                        older.CopyFrom(outcome[1])
                        older.batch_frames = False
                        outcome = (True, older)
                except _Abort as error:
                    outcome = (False, error)
                except (OSError, asyncio.CancelledError):
                    return  # the node crashed while handling it: no answer
                if lose_answer or not self.link_up(source, target):
                    return
                self.loop.call_at(
                    self.clock.now + self.net_delay() + self.stall_s(), settle, outcome
                )

            node.spawn(handle())

        def settle(outcome: tuple[bool, Any]) -> None:
            if answer.done() or not self.nodes[source].running:
                return
            ok, value = outcome
            if ok:
                answer.set_result(value)
            else:
                answer.set_exception(value)

        loop.call_at(self.clock.now + self.net_delay() + request_stall, arrive)
        return await answer

    # -- coordination ------------------------------------------------------------------------

    def apply(self, command: pb.Command, who: str = "coord") -> pb.CommandResult:
        """Commit `command` to the Raft log (the real state machine applies it)."""
        if not command.request_id:
            self.request_serial += 1
            command.request_id = f"sim-{self.request_serial}"
        command.proposed_at_ms = int(self.clock.wall() * 1000)
        self.raft_index += 1
        result = apply_command(self.state, command.SerializeToString(), self.raft_index)
        kind = command.WhichOneof("body")
        body = getattr(command, kind)
        accepted = result.rejection.code == E.OK
        if (
            kind in ("assign_pchannel", "pchannel_ready", "delete_segments_before")
            or (kind == "commit_segment" and accepted)
            or (kind in ("mark_node_down", "mark_node_up") and result.events)
        ):
            summary = " ".join(
                f"{f.name}={v}" for f, v in body.ListFields() if f.name not in ("digest",)
            ).replace("\n", " ")
            outcome = "ok" if accepted else code_name(result.rejection.code)
            if not result.deduplicated:
                self.trace_line(who, f"raft {kind} {summary} -> {outcome}")
        if result.events:
            self.states.append(copy_state(self.state))
            index = len(self.states) - 1
            raft = getattr(self, "raft", None)
            for node_id, node in self.nodes.items():
                if raft is None or node_id == raft.leader:
                    node.apply_up_to(index)
                elif raft.reaches(node_id):
                    self.loop.call_at(
                        self.clock.now + self.net_delay() * 2 + self.apply_lag.get(node_id, 0.0),
                        node.apply_up_to,
                        index,
                    )
            if kind == "commit_segment" and accepted:
                self._check_committed_segment(who.split("+")[0], command.commit_segment)
            if kind == "pchannel_ready" and accepted:
                self._record_term_start(who.split("+")[0], command.pchannel_ready)
            if kind == "assign_pchannel" and accepted:
                self.result.failovers += 1
                if not self.stopping and self.faulting:
                    self._arm_recovery_faults(command.assign_pchannel)
        return result

    def _arm_recovery_faults(self, assign: pb.AssignPChannel) -> None:
        # Tail recovery is short: faults at random times rarely land in it. Now and
        # then the new owner crashes at one of its next syncs, mid-recovery.
        owner = assign.node_id
        if self._ring_rounds > 0 and assign.pchannel == self._ring_pchannel:
            self._ring_round(assign)
            return
        if self.clock.now < self._quiet_until:
            return  # a scenario plays out (`_plan_scenario`): no random fault breaks it
        if self._churn_left > 0:
            # Owner churn (`_plan_scenario`): the next owners each fail a moment into
            # their tail recovery, or at one of its first syncs, each leaving it half
            # done (an older term's entries pushed to some replicas, its own term start
            # on fewer) for the next to meet: Raft's figure 8, for the WAL.
            self._churn_left -= 1
            rng = self.rng
            self.trace_line(
                "sim", f"owner churn: {owner} fails in its recovery of {assign.pchannel}"
            )
            power = rng.random() < self.power_rate
            # Mostly back soon, to take part in the next recoveries; at times down long
            # enough to be replaced in the replica sets.
            back = rng.uniform(0.1, 0.8) if rng.random() < 0.8 else rng.uniform(2.6, 4.0)
            if rng.random() < 0.5:
                self.disk.arm(
                    owner,
                    functools.partial(self._crash, owner, power, back=back),
                    rng.randint(0, 3),
                )
            else:
                self.loop.call_later(
                    rng.uniform(0.002, 0.1),
                    functools.partial(self._crash, owner, power, back=back),
                    context=self.driver_context,
                )
            if rng.random() < 0.3:
                # ... while the replica set changes under the recovery (one never ready
                # yet, or ready with that set, takes a new set at once: `balancer.settled`).
                self.loop.call_later(
                    rng.uniform(0.05, 0.6),
                    self._change_replicas,
                    assign.pchannel,
                    context=self.driver_context,
                )
            return
        if self.rng.random() < 0.3:
            power = self.rng.random() < self.power_rate
            self.disk.arm(owner, lambda n=owner, p=power: self._crash(n, p), self.rng.randint(0, 3))
        if self.rng.random() < 0.3:
            # ... and one of its replicas is briefly out of reach, so that what it
            # writes reaches some replicas and not others.
            others = [n for n in assign.replica_node_ids if n != owner]
            if others:
                self._cut(owner, self.rng.choice(others), self.rng.uniform(0.002, 0.05))

    def _record_term_start(self, who: str, ready: pb.PChannelReady) -> None:
        """A new term's start entry is committed when its owner proposes PChannelReady:
        remember it (a later owner must hold the same entry there)."""
        fragile = self._fragile_successors.get(ready.pchannel)
        if fragile is not None and ready.term > fragile[0] and ready.node_id != fragile[1]:
            # The owner that took over from a cut-off one fails soon after it is ready:
            # its term ends having written little, the deposed owner's longer log of the
            # older term is still there, and the next recovery meets both.
            del self._fragile_successors[ready.pchannel]
            successor, down_s = ready.node_id, fragile[2]

            def fail() -> None:
                if self.faulting:
                    self.trace_line(
                        "sim", f"{ready.pchannel}: term {ready.term}'s new owner fails for a while"
                    )
                    self._crash(successor, self.rng.random() < self.power_rate, back=down_s)

            self.loop.call_later(self.rng.uniform(0.0, 0.3), fail, context=self.driver_context)
        node = self.nodes.get(who)
        log = node.plane.logs.get(ready.pchannel) if node is not None and node.plane else None
        if log is None or not log.first_lsn <= ready.start_lsn <= log.last_lsn:
            return
        try:
            frame = log.read_frames(ready.start_lsn, 1 << 20, ready.start_lsn)
        except (KeyError, OSError):
            return
        key = (ready.pchannel, ready.start_lsn)
        before = self.committed_frames.setdefault(key, frame)
        if before != frame:
            self.violation(
                f"{ready.pchannel}: committed lsn {ready.start_lsn} changed: "
                f"{_identity(before)} was committed there, {who}'s term start is "
                f"{_identity(frame)}"
            )

    def _check_committed_segment(self, who: str, segment: pb.CommitSegment) -> None:
        node = self.nodes.get(who)
        if node is None or node.plane is None:
            return
        log = node.plane.logs.get(segment.pchannel)
        if log is None:
            return
        try:
            entries = list(log.iter_entries(segment.first_lsn, segment.last_lsn))
            frames = log.read_frames(segment.first_lsn, 1 << 24, segment.last_lsn)
        except (KeyError, OSError):
            self.violation(
                f"{who} committed segment [{segment.first_lsn}, {segment.last_lsn}] "
                "that its own log cannot read"
            )
            return
        payloads = {e.lsn: e.payload for e in entries}
        key = (segment.pchannel, segment.first_lsn)
        known = self.committed_segments.get(key)
        if known is not None and known != (segment.last_lsn, frames):
            self.violation(
                f"{segment.pchannel}: segment [{segment.first_lsn}, {segment.last_lsn}] "
                f"committed twice with other contents (by {who})"
            )
        self.committed_segments[key] = (segment.last_lsn, frames)
        for (pchannel, lsn), payload in sorted(self.history.acked.items()):
            if (
                pchannel == segment.pchannel
                and segment.first_lsn <= lsn <= segment.last_lsn
                and payloads.get(lsn) != payload
            ):
                self.violation(
                    f"{pchannel}: committed segment [{segment.first_lsn}, "
                    f"{segment.last_lsn}] (term {segment.term}, by {who}) holds "
                    f"{payloads.get(lsn)!r} at lsn {lsn}, acknowledged as {payload!r}"
                )

    async def coordinator(self) -> None:
        """The Raft leader's loop: liveness from heartbeats, failover, repair (the real
        balancer). It runs wherever Raft has a leader, with that leader's heartbeats."""
        node_timeout_s, replace_after_s, assign_timeout_s = 0.8, 2.5, 3.0
        last_situation: tuple[Any, ...] = ()
        raft = self.raft
        while True:
            await asyncio.sleep(0.1)
            leader = raft.leader
            if leader is None or not raft.reaches_quorum(leader):
                continue
            now = self.clock.now
            heard = raft.heard
            live = [n for n in sorted(self.nodes) if now - heard.get(n, -1e9) <= node_timeout_s]
            for node_id in sorted(self.nodes):
                recorded = self.state.nodes[node_id].state
                if node_id in live and recorded == pb.NODE_STATE_DOWN:
                    raft.commit_local(pb.Command(mark_node_up=pb.MarkNodeUp(node_id=node_id)))
                elif node_id not in live and recorded == pb.NODE_STATE_UP:
                    raft.commit_local(pb.Command(mark_node_down=pb.MarkNodeDown(node_id=node_id)))
            long_down = [
                n for n in sorted(self.nodes) if now - heard.get(n, -1e9) > replace_after_s
            ]
            stuck = []
            for name in self.pchannels:
                channel = self.state.pchannels[name]
                if channel.state == pb.PCHANNEL_STATE_ASSIGNING:
                    since = self.assigning_since.setdefault((name, channel.term), now)
                    if now - since > assign_timeout_s:
                        stuck.append(name)
            situation = (self.state.revision, tuple(live), tuple(stuck), tuple(long_down), leader)
            if situation == last_situation:
                continue  # the plan is a pure function of these: nothing new to propose
            last_situation = situation
            for command in balancer.plan(self.state, live, stuck, replace_nodes=long_down):
                raft.commit_local(command)

    # -- nemesis -----------------------------------------------------------------------------

    async def pauses(self) -> None:
        """A node's processes stop for 0.2-2 s and then go on where they were (Jepsen's
        pause nemesis: SIGSTOP and SIGCONT; a virtual machine frozen by its host, a long
        garbage collection or swap storm). Nothing it runs makes progress meanwhile,
        neither its Raft peer (the leader stops hearing it, and may judge it down and
        move its pchannels) nor its data plane; what others send it waits in its socket
        buffers, and connections stay up. When it resumes, it handles what became ready
        in the order it did, with the clock moved on: an owner deposed meanwhile still
        acts on what it knew, and a replica takes requests of owners that may have
        died or been replaced since they sent them. The Raft leader is never the one
        paused (the simulated Raft does not model a paused leader's successor)."""
        rng = self._pause_rng
        if not self.pause_every_s:
            return
        while self.faulting:
            await asyncio.sleep(rng.expovariate(1 / self.pause_every_s))
            leader = self.raft.leader
            candidates = [
                n
                for n, node in sorted(self.nodes.items())
                if node.running and n != leader and n not in self.paused_nodes
            ]
            if not self.faulting or not candidates:
                continue
            node_id = rng.choice(candidates)
            node = self.nodes[node_id]
            incarnation = node.incarnation
            assert incarnation is not None
            hold = rng.uniform(0.2, 2.0)
            self.paused_nodes.add(node_id)
            self.loop.pause(incarnation)
            self.trace_line(node_id, f"paused for {hold:.2f} s")

            def resume(node_id: str = node_id, incarnation: Incarnation = incarnation) -> None:
                self._resume(node_id, incarnation)

            self.loop.call_later(hold, resume, context=self.driver_context)

    def _resume(self, node_id: str, incarnation: Incarnation | None = None) -> None:
        node = self.nodes[node_id]
        if node_id not in self.paused_nodes:
            return
        if incarnation is not None and node.incarnation is not incarnation:
            return  # it crashed meanwhile (the crash resumed it)
        self.paused_nodes.discard(node_id)
        if node.incarnation is not None:
            self.loop.resume(node.incarnation)
        self.trace_line(node_id, "resumes")

    async def disk_stalls(self) -> None:
        """A node's disk stops completing I/O for 0.3-2.5 s and then goes on: a storage
        path failing over (multipath, a network volume), a controller reset, an SSD's
        garbage collection or a saturated device; every job its code hands to a worker
        thread (an fdatasync, a segment file created, a catalog commit) ends only after
        it. The process runs on meanwhile: code that holds a log's lock across such a job
        keeps every append waiting behind it, while what needs no lock (a heartbeat's log
        matching, reads) is answered at once. Drawn from a generator of its own, in a
        third of the seeds (`disk_stall_every_s`)."""
        rng = self._disk_stall_rng
        if not self.disk_stall_every_s:
            return
        while self.faulting:
            await asyncio.sleep(rng.expovariate(1 / self.disk_stall_every_s))
            running = [n for n, node in sorted(self.nodes.items()) if node.running]
            if not self.faulting or not running:
                break
            node_id = rng.choice(running)
            hold = rng.uniform(0.3, 2.5)
            self.disk_stalled_until[node_id] = max(
                self.disk_stalled_until.get(node_id, 0.0), self.clock.now + hold
            )
            self.trace_line(node_id, f"disk stalls for {hold:.2f} s")
        self.disk_stalled_until.clear()

    async def nemesis(self) -> None:
        rng = self.rng
        end = self.clock.now + self.duration_s
        while True:
            pause = rng.expovariate(1 / self.fault_interval_s)
            if self.clock.now + pause >= end:
                # Faults last duration_s, not up to a whole fault interval more.
                await asyncio.sleep(max(0.0, end - self.clock.now))
                break
            await asyncio.sleep(pause)
            roll = rng.random()
            if self.clock.now < self._quiet_until:
                continue  # a scenario plays out (`_plan_scenario`)
            crash, partition, client, replicas = self.fault_mix
            if roll < crash:
                self._crash_some()
            elif roll < partition:
                self._partition()
            elif roll < client:
                self._partition_client()
            elif roll < replicas:
                self._change_replicas()
            else:
                self._retention()
        self.faulting = False
        self.disk.disarm()
        self.trace_line("sim", "faults stop; healing")

    def _plan_scenario(self) -> None:
        """FoundationDB's way to reach histories random faults rarely compose: some seeds
        are biased towards one hard story, played once at a random time of the faults on
        top of the random ones. Random faults pause from the start until the story has
        played out: they would mostly break it before its end (a Raft without a quorum
        replaces no owner). Rich seeds only (`rich_profile`)."""
        if not self.rich:
            return
        rng = self.rng
        roll = rng.random()
        # When the faults start (`settle_s`), or at a random time in their first 40%.
        at = self.options.settle_s + rng.uniform(0.0, 0.4) * self.duration_s
        if roll < 0.15:
            self.loop.call_later(at, self._split_brain, context=self.driver_context)
            self._quiet_until = self.clock.now + at + 4.0
        elif roll < 0.3:
            self.loop.call_later(at, self._feed_failure, context=self.driver_context)
            self._quiet_until = self.clock.now + at + 1.5
        elif roll < 0.45:
            churn = rng.randint(3, 6)
            if rng.random() < 0.5:
                # From the pchannels' first owners on: no replica set is stable yet, so
                # every assignment may take a new one (`balancer.settled`).
                self._churn_left = churn
            else:

                def begin() -> None:
                    self._churn_left = churn

                self.loop.call_later(at, begin, context=self.driver_context)
        elif roll < 0.85:
            # Early in the faults, and with more of them: each round of the ring takes a
            # failover (the node timeout), and its story is the rounds after the first.
            at = self.options.settle_s + rng.uniform(0.0, 0.2) * self.duration_s
            self.duration_s += RING_EXTRA_S
            self.loop.call_later(at, self._isolation_ring, context=self.driver_context)
            self._quiet_until = self.clock.now + self.options.settle_s + self.duration_s

    def _isolation_ring(self) -> None:
        """Jepsen's "isolate the primary", over and over: a pchannel's serving owner is cut
        off from every node (its clients still reach it, and it goes on writing their
        batches into its own log, never acknowledged); it is judged down and replaced,
        and each of the next owners meets a failure of its own early in its tail
        recovery (`_ring_round`), while the node cut off before is reachable again. One
        node is cut off at a time, so a majority always remains and the pchannel keeps
        failing over: each recovery meets the half-done work of the ones before."""
        rng = self.rng
        serving = self._serving_pchannels()
        if not self.faulting or not serving:
            return
        name = rng.choice(serving)
        self._ring_pchannel = name
        self._ring_rounds = rng.randint(4, 8)
        self.trace_line("sim", f"isolation ring on {name}: {self._ring_rounds} owners")
        self._ring_isolate(self.state.pchannels[name].owner_node_id)

    def _ring_round(self, assign: pb.AssignPChannel) -> None:
        """A new owner of the ring's pchannel fails early in its recovery, in one of two
        ways, drawn:

        - its own link flaps: it is cut off at one of its first syncs of the pchannel's
          log, so what it writes then (its term start) may be on its disk only;
        - its rack's power feed fails: a replica on that feed sees its disk's fsyncs
          fail from one of its next syncs of the pchannel's log on (a brown-out: what it
          took and acknowledged before is durable, what came after is not), then loses
          power; the owner, on its second power supply, stays up, and is cut off a
          moment later, when the rack's switch, on the failed feed, goes dark. A replica
          the owner was catching up keeps the acknowledged part of the catch-up only.

        Either way the node the ring cut off before is reachable again from that moment
        on, so the next owner is drawn among the nodes that just took part."""
        rng = self.rng
        self._ring_rounds -= 1
        owner = assign.node_id
        others = [
            n
            for n in assign.replica_node_ids
            if n not in (owner, self._ring_isolated) and self.nodes[n].running
        ]
        if rng.random() < 0.5 or not others:
            self.trace_line("sim", f"isolation ring: {owner} is cut off at one of its syncs")
            self.disk.arm(
                owner,
                functools.partial(self._ring_isolate, owner),
                rng.randint(0, 2),
                sync=True,
                under=f"/wal/{assign.pchannel}/",
            )
            return
        victim = rng.choice(others)
        back = rng.uniform(0.2, 2.0)
        sag_s = rng.uniform(0.01, 0.3)
        rate = rng.choice([0.5, 1.0])
        switch_s = rng.uniform(0.02, 0.25)
        self.trace_line(
            "sim",
            f"isolation ring: {owner}'s rack loses power, from one of {victim}'s syncs on",
        )

        def sags() -> None:
            self.result.brownouts += 1
            self.trace_line(
                "sim",
                f"brown-out: fsyncs fail on {victim} {rate:.0%} for {sag_s * 1000:.0f} ms, "
                f"then the power goes; {owner} is cut off {switch_s * 1000:.0f} ms later",
            )
            self.disk.fail_syncs(victim, rate)
            self.loop.call_later(sag_s, fails, context=self.driver_context)

        def fails() -> None:
            self.disk.heal_syncs(victim)
            if self.faulting:
                self._crash(victim, True, back=back)
            self.loop.call_later(switch_s, self._ring_isolate, owner, context=self.driver_context)

        self.disk.arm(victim, sags, rng.randint(1, 4), sync=True, under=f"/wal/{assign.pchannel}/")

    def _ring_isolate(self, node_id: str) -> None:
        """Reconnect the node the ring cut off last, and cut `node_id` off from every
        node, for long enough to be replaced (the next owner's failure, or at most a few
        seconds, ends it)."""
        self.partitions -= self._ring_links
        self._ring_links = set()
        self._ring_isolated = ""
        if not self.faulting:
            return
        links = {frozenset((node_id, other)) for other in sorted(self.nodes) if other != node_id}
        self._ring_links = links
        self._ring_isolated = node_id
        self._ring_serial += 1
        serial = self._ring_serial
        self.partitions |= links
        for stream in sorted(self.streams, key=lambda s: s.serial):
            if frozenset((stream.source, stream.target)) in links:
                stream.break_()
        self.trace_line("sim", f"isolation ring: {node_id} cut off from every node")

        def heal() -> None:
            if self._ring_serial == serial:
                self.partitions -= self._ring_links
                self._ring_links = set()
                self._ring_isolated = ""

        self.loop.call_later(
            self.rng.uniform(1.5, 3.0) if self._ring_rounds > 0 else self.rng.uniform(1.0, 2.0),
            heal,
            context=self.driver_context,
        )

    def _serving_pchannels(self) -> list[str]:
        """The pchannels assigned to an owner whose process runs, in their order."""
        return [
            p
            for p in self.pchannels
            if self.state.pchannels[p].state == pb.PCHANNEL_STATE_ASSIGNED
            and self.nodes[self.state.pchannels[p].owner_node_id].running
        ]

    def _split_brain(self) -> None:
        """A pchannel's owner is cut off from every node, long enough to be replaced,
        while its clients still reach it with routes that name it: it goes on taking
        their writes into its own log (never acknowledged). The owner that replaces it
        fails soon after it is ready and stays down a while (the load it inherited, or a
        cause they share), so a later recovery meets the deposed owner's longer log of the
        older term beside the newer term's short one."""
        rng = self.rng
        serving = self._serving_pchannels()
        if not self.faulting or not serving:
            return
        name = rng.choice(serving)
        channel = self.state.pchannels[name]
        isolated = channel.owner_node_id
        links = {frozenset((isolated, other)) for other in sorted(self.nodes) if other != isolated}
        hold = rng.uniform(1.2, 2.2)
        self.partitions |= links
        for stream in sorted(self.streams, key=lambda s: s.serial):
            if frozenset((stream.source, stream.target)) in links:
                stream.break_()
        self.trace_line(
            "sim",
            f"split brain: {isolated}, owner of {name}, cut off from every node for {hold:.2f} s",
        )
        self._fragile_successors[name] = (channel.term, isolated, rng.uniform(1.0, 2.5))
        self.result.split_brains += 1

        def heal() -> None:
            self.partitions -= links

        self.loop.call_later(hold, heal, context=self.driver_context)

    def _feed_failure(self) -> None:
        """A power feed fails: the whole cluster's, or that of one rack holding a
        pchannel's replica set (`_brownout`)."""
        rng = self.rng
        running = [n for n, node in sorted(self.nodes.items()) if node.running]
        if rng.random() < 0.5:
            victims = running
        else:
            channel = self.state.pchannels[rng.choice(self.pchannels)]
            victims = [n for n in channel.replica_node_ids if n in running]
        if self.faulting and victims:
            self._brownout(victims, boot=True)

    def _crash_some(self) -> None:
        rng = self.rng
        running = [n for n, node in sorted(self.nodes.items()) if node.running]
        if not running:
            return
        owners = [
            self.state.pchannels[p].owner_node_id
            for p in self.pchannels
            if self.state.pchannels[p].owner_node_id in running
        ]
        recovering = [
            self.state.pchannels[p].owner_node_id
            for p in self.pchannels
            if self.state.pchannels[p].owner_node_id in running
            and self.state.pchannels[p].state == pb.PCHANNEL_STATE_ASSIGNING
        ]
        roll = rng.random()
        if recovering and roll < 0.5:
            victims = [rng.choice(recovering)]  # an owner in tail recovery
        elif owners and roll < 0.75:
            victims = [rng.choice(owners)]
        else:
            victims = [rng.choice(running)]
        if rng.random() < 0.1:
            others = [n for n in running if n not in victims]
            if others:
                victims.append(rng.choice(others))
        how = rng.random()
        if how < 0.35:
            # At the node's next fsync, before it takes effect: what it wrote since the
            # last one is what a power cut drops.
            for node_id in victims:
                self.disk.arm(
                    node_id, lambda n=node_id: self._crash(n, rng.random() < self.power_rate)
                )
            return
        if how < 0.55:
            # A power cut in the middle of the node's next write: the first bytes of a
            # batch reach the disk (on an owner, often before the batch went out).
            for node_id in victims:
                self.disk.arm_write(node_id, lambda n=node_id: self._crash(n, True))
            return
        if how < 0.7 and self.rich:
            # A power feed fails (often a second node shares it: an owner and one of its
            # replicas, say).
            if len(victims) == 1 and rng.random() < 0.5:
                others = [n for n in running if n not in victims]
                if others:
                    victims.append(rng.choice(others))
            self._brownout(victims)
            return
        for node_id in victims:
            self._crash(node_id, rng.random() < self.power_rate)

    def power_cut_at_commit(self, pchannel: str, node_id: str) -> None:
        """A transaction about to commit on `node_id`: in some seeds (`commit_cut_rate`)
        that node's power fails in the middle of its next write to the pchannel's log,
        most often the transaction's own batch (its begin, messages and commit entry in
        one write), so that the disk keeps the first entries of it and not the commit
        entry. Random crashes rarely land inside one particular write; this is the
        transaction's torn tail that recovery must drop (`_drop_partial_txn`, where
        batches carry no BATCH_CONTINUES flag: a rolling upgrade)."""
        rng = self._commit_cut_rng
        if not self.faulting or not self.commit_cut_rate or rng.random() >= self.commit_cut_rate:
            return
        if self.clock.now < self._quiet_until:
            return  # a scenario plays out (`_plan_scenario`): no random fault breaks it
        node = self.nodes.get(node_id)
        if node is None or not node.running:
            return
        self.trace_line(
            "sim",
            f"power cut armed in {node_id}'s next write to {pchannel} (a transaction commits)",
        )
        self.disk.arm_write(node_id, lambda: self._crash(node_id, True), under=f"/wal/{pchannel}/")

    def _brownout(self, victims: list[str], boot: bool = False) -> None:
        """The power feed of `victims` sags, then fails: for a moment their disks fail
        some of their fsyncs (EIO, each disk at its own rate: some ride it out) while the
        nodes go on running, then they all lose power and come back one by one (`boot`:
        when the power is back, each machine boots, in its own time)."""
        rng = self.rng
        window = rng.uniform(0.01, 0.4)
        rates = {node_id: rng.choice([0.0, 0.2, 0.5]) for node_id in victims}
        self.result.brownouts += 1
        for node_id, rate in rates.items():
            self.disk.fail_syncs(node_id, rate)
        self.trace_line(
            "sim",
            "brown-out: fsyncs fail on "
            + ", ".join(f"{n} {r:.0%}" for n, r in rates.items())
            + f" for {window * 1000:.0f} ms, then the power goes",
        )

        def cut() -> None:
            for node_id in victims:
                self.disk.heal_syncs(node_id)
                if self.faulting:
                    self._crash(node_id, True, back=rng.uniform(0.2, 3.0) if boot else None)

        self.loop.call_later(window, cut, context=self.driver_context)

    def _crash(self, node_id: str, power: bool, back: float | None = None) -> None:
        """Crash `node_id` (a power cut, or a process kill) and restart it `back` seconds
        later (drawn when None)."""
        node = self.nodes[node_id]
        if not node.running:
            return
        unsynced = self.disk.unsynced_bytes(node_id)
        if node.plane is not None:
            for name, owner in sorted(node.plane.owners.items()):
                if owner.state == "recovering" and owner.start_lsn:
                    self.trace_line(
                        node_id,
                        f"{name}: crash mid-recovery at term {owner.term} after its term "
                        f"start at lsn {owner.start_lsn}",
                    )
        dropped = node.crash(power)
        self.result.crashes += 1
        if power:
            self.result.power_cuts += 1
            self.result.dropped_bytes += dropped
            if dropped:
                self.result.power_cuts_dropping += 1
        self.trace_line(
            node_id,
            ("power cut" if power else "killed")
            + (f", {dropped} of {unsynced} unsynced bytes dropped" if power else ""),
        )
        # Mostly back before the coordinator's node timeout (it stays the owner), at times
        # after it (the pchannel fails over, the node is replaced in replica sets).
        if back is None:
            back = (
                self.rng.uniform(0.02, 0.5) if self.rng.random() < 0.7 else self.rng.uniform(0.5, 3)
            )
        restart = (self.clock.now + back, node_id)
        self._restarts.append(restart)
        # A timer of the driver's (the crash may run in the crashed incarnation's context).
        self.loop.call_at(restart[0], self._restart, restart, context=self.driver_context)

    def _restart(self, restart: tuple[float, str]) -> None:
        if restart not in self._restarts:
            return  # healing restarted it already
        self._restarts.remove(restart)
        node_id = restart[1]
        if not self.nodes[node_id].running:
            self.nodes[node_id].start()
            if self.rng.random() < 0.3:
                other = self.rng.choice(sorted(n for n in self.nodes if n != node_id))
                self._cut(node_id, other, self.rng.uniform(0.002, 0.2))

    def _partition(self) -> None:
        rng = self.rng
        names = sorted(self.nodes)
        isolated = rng.choice(names)
        leader = self.raft.leader
        if rng.random() < 0.7:
            # Often the owner of a pchannel (and not the Raft leader): its clients may
            # still reach it when Raft no longer does.
            owners = sorted(
                {self.state.pchannels[p].owner_node_id for p in self.pchannels} - {"", leader}
            )
            if owners:
                isolated = rng.choice(owners)
        links = {frozenset((isolated, other)) for other in names if other != isolated}
        roll = rng.random()
        hold = rng.uniform(0.1, 2.0)
        if roll < 0.25 and leader is not None and leader != isolated:
            # Cut off from the Raft leader only: it stops hearing of new assignments and
            # is judged down, while its replicas and clients still reach it.
            links = {frozenset((isolated, leader))}
            hold = rng.uniform(0.9, 2.0)
        elif roll < 0.5:
            # Cut off from everyone but one peer (a bridge): a new owner may fence that
            # peer while the old one, still serving its clients, writes to it.
            bridge = rng.choice([n for n in names if n != isolated])
            links = {link for link in links if bridge not in link}
            hold = rng.uniform(0.9, 2.0)
        elif roll < 0.65:
            # One link only (both still see the others).
            links = {rng.choice(sorted(links, key=sorted))}
        self.partitions |= links
        for stream in sorted(self.streams, key=lambda s: s.serial):
            if frozenset((stream.source, stream.target)) in links:
                stream.break_()
        self.trace_line(
            "sim", f"partition {sorted(sorted(link) for link in links)} for {hold:.2f} s"
        )

        owned = {
            p: self.state.pchannels[p].term
            for p in self.pchannels
            if self.state.pchannels[p].owner_node_id == isolated
        }
        successor_fails = rng.random() < 0.4

        def heal() -> None:
            self.partitions -= links
            if not successor_fails or not self.faulting:
                return
            # The new owner fails just as the old one comes back, with its log of the old
            # term (maybe longer, never committed) not yet cut back: the next recovery
            # meets both.
            for name, term in sorted(owned.items()):
                channel = self.state.pchannels[name]
                if channel.term > term and channel.owner_node_id != isolated:
                    self._crash(channel.owner_node_id, self.rng.random() < self.power_rate)

        self.loop.call_later(hold, heal, context=self.driver_context)

    def _partition_client(self) -> None:
        rng = self.rng
        client = rng.choice(self.clients)
        node = rng.choice(sorted(self.nodes))
        self._cut(client, node, rng.uniform(0.1, 1.5))

    def _cut(self, a: str, b: str, hold_s: float) -> None:
        link = frozenset((a, b))
        if link in self.partitions:
            return
        self.partitions.add(link)
        for stream in sorted(self.streams, key=lambda s: s.serial):
            if frozenset((stream.source, stream.target)) == link:
                stream.break_()
        self.trace_line("sim", f"link {a}-{b} cut for {hold_s * 1000:.0f} ms")

        def heal() -> None:
            self.partitions.discard(link)

        self.loop.call_later(hold_s, heal, context=self.driver_context)

    def _change_replicas(self, name: str | None = None) -> None:
        rng = self.rng
        if name is None:
            name = rng.choice(self.pchannels)
        if not self.faulting:
            return
        channel = self.state.pchannels[name]
        if channel.term == 0 or not balancer.settled(channel):
            return
        members = list(channel.replica_node_ids)
        up = [n for n, node in sorted(self.nodes.items()) if node.running]
        choice = rng.random()
        owner = channel.owner_node_id
        if choice < 0.4 and len(members) > 2:
            members.remove(rng.choice([m for m in members if m != owner]))  # shrink
        elif choice < 0.6:
            candidates = [m for m in members if m != owner and m in up]
            if not candidates:
                return
            owner = rng.choice(candidates)  # move the owner within the set
        else:
            outside = [n for n in up if n not in members]
            if not outside or len(members) < 2:
                return
            incoming = rng.choice(outside)
            members[members.index(rng.choice([m for m in members if m != owner]))] = incoming
            if rng.random() < 0.5:
                owner = incoming  # the pchannel moves to the new member (an empty log)
        if owner not in up:
            return
        self.raft.commit_local(
            pb.Command(
                assign_pchannel=pb.AssignPChannel(
                    pchannel=name, term=channel.term + 1, node_id=owner, replica_node_ids=members
                )
            ),
            "nemesis",
        )

    def _retention(self) -> None:
        name = self.rng.choice(self.pchannels)
        manifest = self.state.manifests[name]
        if manifest.committed_through_lsn > 1:
            before = self.rng.randint(1, manifest.committed_through_lsn)
            self.raft.commit_local(
                pb.Command(
                    delete_segments_before=pb.DeleteSegmentsBefore(pchannel=name, before_lsn=before)
                ),
                "nemesis",
            )

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        options = self.options
        rng = self.rng
        for index in range(options.nodes):
            node_id = f"n{index + 1}"
            self.nodes[node_id] = SimNode(self, node_id)
            self.apply(
                pb.Command(
                    register_node=pb.RegisterNode(node_id=node_id, address=f"{node_id}.sim:1")
                )
            )
        self.apply(
            pb.Command(
                create_pchannels=pb.CreatePChannels(
                    prefix=PCHANNEL_PREFIX,
                    count=self.pchannel_count,
                    replica_count=options.replica_count,
                )
            )
        )
        self.pchannels = sorted(self.state.pchannels)
        vchannels: dict[str, str] = {}
        for name in self.pchannels:
            for number in range(2):
                vchannel = f"v-{name}-{number}"
                self.apply(
                    pb.Command(create_vchannel=pb.CreateVChannel(name=vchannel, pchannel=name))
                )
                vchannels[vchannel] = name
        for node in self.nodes.values():
            node.apply_up_to(len(self.states) - 1)
        upgrades: list[tuple[float, str]] = []
        if rng.random() < 0.25:
            # A rolling upgrade in progress: one or two nodes still run the version
            # before atomic batches. Such a node does not say in its Fence answer that it
            # takes BATCH_CONTINUES and refuses flagged frames; as an owner it flags
            # nothing; an owner that recovers with its answer writes unflagged batches
            # too, and relies on dropping a transaction tail without its commit entry.
            # A crash restarts it at the same version; the upgrade is a planned restart,
            # during the faults or at the latest when they end.
            self.result.rolling_upgrades = 1
            for node_id in rng.sample(sorted(self.nodes), rng.choice([1, 1, 2])):
                self.nodes[node_id].previous_version = True
                at = options.settle_s + rng.uniform(0.2, 1.2) * self.duration_s
                upgrades.append((at, node_id))
                self.trace_line(node_id, "runs the version before atomic batches")
        if rng.random() < 0.7:
            # Followers that apply late (a busy process): their owners serve a term
            # Raft has moved on from, and the clients routed by them write there.
            for node_id in sorted(self.nodes):
                self.apply_lag[node_id] = rng.choice([0.0, 0.0, 0.05, 0.2, 0.5])
        self.raft = SimRaft(self)
        self.raft._elect(rng.choice(self.raft.voters))  # noqa: SLF001
        for node in self.nodes.values():
            node.start()
        background = [
            self.loop.create_task(self.raft.run()),
            self.loop.create_task(self.coordinator()),
            self.loop.create_task(self.checker()),
            self.loop.create_task(self.disk_stalls()),
            self.loop.create_task(self.pauses()),
        ]
        clients: list[asyncio.Task[Any]] = []
        max_batch = rng.choice([1, 8, 16, 32] if self.rich else [1, 4, 8, 16])
        if any(node.previous_version for node in self.nodes.values()):
            # An unflagged multi-message batch is not atomic: a surviving prefix of it is
            # written twice on retry, the documented limit of exactly once while a
            # cluster is upgraded (docs/architecture.md, "A rolling upgrade").
            max_batch = 1
        for client in self.clients:
            router = Router(self, client)
            background.append(self.loop.create_task(router.watch()))
            for name in self.pchannels:
                lane = ProducerLane(
                    self,
                    client,
                    router,
                    name,
                    f"v-{name}-{rng.randint(0, 1)}",
                    LaneOptions(
                        max_batch=max_batch,
                        max_in_flight=rng.choice([1, 2, 4]),
                        interval_s=rng.choice([0.02, 0.05, 0.1] if self.rich else [0.05, 0.1, 0.2]),
                    ),
                    first_sequence=rng.randint(1, 1000),
                )
                self.history.lanes.append(lane)
                clients.append(self.loop.create_task(lane.run()))
                if rng.random() < 0.5:
                    background.append(
                        self.loop.create_task(Consumer(self, client, router, name).run())
                    )
            if rng.random() < 0.7:
                clients.append(
                    self.loop.create_task(TxnClient(self, client, router, vchannels).run())
                )
        for at, node_id in upgrades:
            self.loop.call_at(
                self.clock.now + at, self._upgrade, node_id, context=self.driver_context
            )
        # Before any task runs: a scenario may start with the pchannels' first owners.
        self._plan_scenario()
        try:
            await asyncio.sleep(self.options.settle_s)
            await self.nemesis()
            await self._heal(clients)
        finally:
            for task in background + clients:
                task.cancel()

    def _upgrade(self, node_id: str) -> None:
        """The rolling upgrade reaches `node_id`: a planned restart at this version (or,
        when it is down, its next start is at this version)."""
        node = self.nodes[node_id]
        if not node.previous_version or node.upgrade_pending:
            return
        node.upgrade_pending = True
        if node.running:
            self.trace_line(node_id, "planned restart to upgrade")
            self._crash(node_id, power=False)

    async def _heal(self, clients: list[asyncio.Task[Any]]) -> None:
        for node_id in sorted(self.paused_nodes):
            self._resume(node_id)
        for node_id in sorted(self.nodes):
            self._upgrade(node_id)  # the rolling upgrade finishes
        self.partitions.clear()
        for _, node_id in sorted(self._restarts):
            if not self.nodes[node_id].running:
                self.nodes[node_id].start()
        self._restarts = []
        start = self.clock.now
        acked_at_heal = self.result.acknowledged
        deadline = start + self.options.heal_s
        while self.clock.now < deadline:
            await asyncio.sleep(0.1)
            if self._all_serving() and self.result.acknowledged >= acked_at_heal + 3 * len(
                self.pchannels
            ):
                break
        else:
            stuck = {
                p: (
                    pb.PChannelState.Name(self.state.pchannels[p].state),
                    self.state.pchannels[p].term,
                    self.state.pchannels[p].owner_node_id,
                )
                for p in self.pchannels
            }
            self.violation(f"no progress {self.options.heal_s:g} s after healing: {stuck}")
        self.clients_stopping = True
        self.stopping = True
        # Writes in flight finish or fail (their outcome is then unknown).
        await asyncio.wait(clients, timeout=8.0)
        await asyncio.sleep(0.3)
        # A late change (a widening, a late proposal) may have moved a pchannel since.
        deadline = self.clock.now + self.options.heal_s
        while not self._all_serving():
            if self.clock.now > deadline:
                self.violation(
                    f"no owner serves every pchannel {self.options.heal_s:g} s after the clients stopped"
                )
                return
            await asyncio.sleep(0.1)
        for _ in range(100):  # the checker reads a log between its appends (`_mirror`)
            if not self._any_log_busy():
                break
            await asyncio.sleep(0.01)
        self._check_final()

    def _any_log_busy(self) -> bool:
        return any(
            log._lock.locked()  # noqa: SLF001
            for node in self.nodes.values()
            if node.running and node.plane is not None
            for log in node.plane.logs.values()
        )

    def _all_serving(self) -> bool:
        for name in self.pchannels:
            channel = self.state.pchannels[name]
            node = self.nodes[channel.owner_node_id]
            owner = node.plane.owner(name) if node.plane is not None else None
            if channel.state != pb.PCHANNEL_STATE_ASSIGNED or owner is None or not owner.serving:
                return False
        return True

    # -- checks ------------------------------------------------------------------------------

    def committed_raised(self, log: PChannelLog, old: int, new: int) -> None:
        """A node's log now holds (old, new] committed: each of those entries must be the
        one every node ever held committed at its LSN (a committed entry never changes),
        and the log must hold them: a commit point is only ever learnt for entries held
        (Raft's follower rule, commitIndex = min(leaderCommit, index of last new entry));
        one beyond the log's end would cover whatever reaches it later unchecked."""
        try:
            node_id = Path(log.directory).relative_to(self.root).parts[0]
        except (ValueError, IndexError):
            return
        if new > log.last_lsn:
            self.violation(
                f"{log.pchannel}: {node_id} holds lsn {log.first_lsn}..{log.last_lsn} "
                f"committed up to {new}, beyond its end"
            )
        seen = self._committed_terms.setdefault(log.pchannel, {})
        for lsn in range(max(old + 1, log.first_lsn), min(new, log.last_lsn) + 1):
            try:
                term = log.term_at(lsn)
            except Exception:  # noqa: BLE001 - an entry retention just deleted
                continue
            before = seen.get(lsn)
            if before is None:
                seen[lsn] = (term, node_id)
            elif before[0] != term:
                self.violation(
                    f"{log.pchannel}: committed lsn {lsn} changed term: {before[1]} held term "
                    f"{before[0]} there committed, {node_id} now holds term {term} committed"
                )

    def _check_final(self) -> None:
        for name in self.pchannels:
            if self._check_agreement(name, final=True):
                self._check_history(name)
            self._check_ever_committed(name)

    def _check_ever_committed(self, name: str) -> None:
        """Every entry any node ever held committed (`committed_raised`) is in the final
        owner's log, at its term, unless retention deleted it."""
        owner = self.nodes[self.state.pchannels[name].owner_node_id]
        log = owner.plane.logs.get(name) if owner.plane is not None else None
        if log is None:
            return
        for lsn, (term, node_id) in sorted(self._committed_terms.get(name, {}).items()):
            if lsn < log.first_lsn:
                continue
            now = log.term_at(lsn) if lsn <= log.last_lsn else None
            if now != term:
                self.violation(
                    f"{name}: committed lsn {lsn} lost: {node_id} held term {term} there "
                    f"committed, the final owner {owner.node_id} holds "
                    + ("nothing" if now is None else f"term {now}")
                )
                return

    def _mirror(self, node_id: str, name: str, log: PChannelLog) -> _Mirror | None:
        """The checker's copy of `node_id`'s log of `name`, brought up to the log's end
        (`failed` once it found a violation: a term going back, a time tick not rising,
        an unreadable frame). None while the log is busy: a truncation bumps the
        generation before it truncates, so what a log holds matches its generation only
        when no append or truncation holds its lock; it is read then."""
        busy = log._lock.locked()  # noqa: SLF001
        key = (node_id, name)
        mirror = self._mirrors.get(key)
        if (
            mirror is None
            or mirror.log is not log
            or mirror.generation != log._generation  # noqa: SLF001
            or log.last_lsn < mirror.through
        ):
            if busy:
                return None
            self._mirror_serial += 1
            mirror = _Mirror(log, self._mirror_serial)
            self._mirrors[key] = mirror
        if mirror.failed or busy:
            return mirror
        lsn = max(mirror.through + 1, log.first_lsn)
        last = log.last_lsn
        while lsn <= last:
            data, _ = log.read_frames_range(lsn, 1 << 20, last)
            if not data:
                break
            view = memoryview(data)
            offset = 0
            while offset < len(view):
                checked = check_frame(view, offset, len(view), lsn, 0, -1)
                if isinstance(checked, str):
                    mirror.failed = True
                    self.violation(f"{name}: {node_id}'s log is unreadable at lsn {lsn}: {checked}")
                    return mirror
                fields, end = checked
                term, tick = fields[3], fields[4]
                if term < mirror.term:
                    mirror.failed = True
                    self.violation(
                        f"{name}: term goes back on {node_id} at lsn {lsn} "
                        f"({mirror.term} -> {term})"
                    )
                    return mirror
                if tick <= mirror.tick:
                    mirror.failed = True
                    self.violation(
                        f"{name}: time tick does not rise on {node_id} at lsn {lsn} "
                        f"({mirror.tick} -> {tick})"
                    )
                    return mirror
                mirror.frames[lsn] = bytes(view[offset:end])
                mirror.term, mirror.tick, mirror.through = term, tick, lsn
                offset = end
                lsn += 1
        return mirror

    def _check_agreement(self, name: str, final: bool) -> bool:
        """Against the serving owner's log: every acknowledged write still retained is at
        its LSN (final check only: meanwhile the owner may not have adopted it yet), no
        message is in the committed log twice, every segment Raft committed holds what
        the log holds, no node's committed entry differs from the owner's (the whole
        frame, byte for byte: a committed segment is the same bytes everywhere), and
        terms never go back along a log. Each log is read once (`_Mirror`) and each pair
        of logs compared once up to what both had committed. Returns False when it found
        a violation."""
        channel = self.state.pchannels[name]
        node = self.nodes.get(channel.owner_node_id)
        if node is None or node.plane is None:
            return True  # a final one is reported as no progress
        owner = node.plane.owner(name)
        if owner is None or not owner.serving:
            return True
        log = owner.log
        reference = self._mirror(node.node_id, name, log)
        if reference is None:
            if final:
                self.violation(f"{name}: the owner's log stayed busy; the final check did not run")
                return False
            return True  # busy: the next check (or the final one) reads it
        if reference.failed:
            return False
        reference_top = min(owner.committed_lsn, reference.through)
        found = not self._check_committed_prefix(name, node.node_id, reference, reference_top)
        if final:
            floor = self.state.manifests[name].deleted_before_lsn
            for (pchannel, lsn), payload in sorted(self.history.acked.items()):
                if pchannel != name or lsn < floor:
                    continue
                frame = reference.frames.get(lsn) if lsn <= reference_top else None
                held = _decode(frame).payload if frame is not None else None
                if held != payload:
                    found = True
                    self.violation(
                        f"{name}: acknowledged {payload!r} at lsn {lsn} is lost: the owner "
                        f"{node.node_id} (term {owner.term}) holds {held!r} there"
                    )
                    break
        for other_id, other in sorted(self.nodes.items()):
            if other.plane is None or name not in other.plane.logs or not other.running:
                continue
            other_log = other.plane.logs[name]
            if other_log.closed or other_log.failure is not None:
                continue
            mirror = self._mirror(other_id, name, other_log)
            if mirror is None:
                continue
            if mirror.failed:
                found = True
                continue
            top = min(other_log.committed_lsn, reference_top, mirror.through)
            low = max(
                other_log.first_lsn, log.first_lsn, mirror.verified.get(reference.serial, 0) + 1
            )
            for lsn in range(low, top + 1):
                theirs, mine = mirror.frames.get(lsn), reference.frames.get(lsn)
                if theirs != mine:
                    found = True
                    self.violation(
                        f"{name}: committed lsn {lsn} differs: {other_id} holds "
                        f"{_identity(theirs)}, the owner {node.node_id} holds {_identity(mine)}"
                    )
                    break
            else:
                if top >= low:
                    mirror.verified[reference.serial] = top
        return not found

    def _check_committed_prefix(
        self, name: str, node_id: str, reference: _Mirror, top: int
    ) -> bool:
        """The owner's committed entries read since the last pass: each is what any owner
        had committed at its LSN before (a committed entry never changes, whoever owns the
        pchannel later), no message is there twice, and each committed segment is equal to
        what Raft's CommitSegment was given."""
        serial, checked = self._payload_checked.get(name, (0, 0))
        if serial != reference.serial:
            checked = 0
        start = max(checked + 1, reference.log.first_lsn)
        for lsn in range(start, top + 1):
            frame = reference.frames.get(lsn)
            if frame is None:
                continue
            before = self.committed_frames.setdefault((name, lsn), frame)
            if before != frame:
                self.violation(
                    f"{name}: committed lsn {lsn} changed: {_identity(before)} was committed "
                    f"there, the owner {node_id} now holds {_identity(frame)}"
                )
                return False
            payload = _decode(frame).payload
            if not payload:
                continue
            known = self._payload_at.setdefault((name, payload), lsn)
            if known != lsn:
                self.violation(
                    f"{name}: {payload!r} is in the committed log twice, at lsn {known} and "
                    f"{lsn} (owner {node_id}){self._batch_story(name, payload, known)}"
                )
                return False
        self._payload_checked[name] = (reference.serial, max(checked, top))
        for (pchannel, first), (last, frames) in sorted(self.committed_segments.items()):
            if pchannel != name or (pchannel, first) in self._segments_verified:
                continue
            if last > top or first < reference.log.first_lsn:
                continue
            held = b"".join(reference.frames.get(lsn, b"") for lsn in range(first, last + 1))
            if held != frames:
                self.violation(
                    f"{name}: committed segment [{first}, {last}] differs from the owner "
                    f"{node_id}'s log"
                )
                return False
            self._segments_verified.add((pchannel, first))
        return True

    def _batch_story(self, name: str, payload: bytes, lsn: int) -> str:
        """What the first copy of a message written twice was part of: a whole batch, or
        a prefix of one without its last entry (which carries the producer's sequence)."""
        batch = self.history.batch_of.get(payload)
        if batch is None:
            return ""
        producer, sequence, index, payloads = batch
        start = lsn - index
        held = [self._payload_at.get((name, p)) for p in payloads]
        if held == [start + i for i in range(len(payloads))]:
            return f"; its first copy is all of batch {sequence} of {producer}"
        kept = 0
        while kept < len(held) and held[kept] == start + kept:
            kept += 1
        return (
            f"; its first copy is a prefix of batch {sequence} of {producer} ({kept} of "
            f"{len(payloads)} messages, without the last, which carries the sequence)"
        )

    def _check_history(self, name: str) -> None:
        """At the end, against the owner's final log: each producer's messages are in its
        order; transactions are whole, written once, present when acknowledged and never
        when abandoned; what consumers read is what the log holds."""
        channel = self.state.pchannels[name]
        owner = self.nodes[channel.owner_node_id].plane.owner(name)  # type: ignore[union-attr]
        assert owner is not None
        reference = self._mirrors[(channel.owner_node_id, name)]
        top = min(owner.committed_lsn, reference.through)
        entries = {lsn: _decode(reference.frames[lsn]) for lsn in sorted(reference.frames)}
        where = {e.payload: lsn for lsn, e in entries.items() if e.payload and lsn <= top}
        for lane in self.history.lanes:
            if lane.pchannel != name:
                continue
            last = 0
            for payload in lane.submitted:
                lsn = where.get(payload)
                if lsn is None:
                    continue
                if lsn < last:
                    self.violation(
                        f"{name}: {lane.producer_id}'s {payload!r} is at lsn {lsn}, before an "
                        f"earlier message of its at lsn {last}"
                    )
                    break
                last = lsn
        seen_txns: set[int] = set()
        open_txn: tuple[int, int, int] | None = None  # (txn id, begin lsn, entries)
        for lsn, entry in entries.items():
            flags = entry.flags
            if open_txn is not None:
                txn_id, begin, count = open_txn
                if entry.txn_id != txn_id or not flags & TXN_FLAGS:
                    self.violation(
                        f"{name}: transaction {txn_id} begun at lsn {begin} is cut at lsn "
                        f"{lsn} by another entry (flags {flags:#x}, txn {entry.txn_id})"
                    )
                    return
                count += 1
                if flags & EntryFlags.TXN_COMMIT:
                    size = (
                        decode_properties(entry.properties).get(TXN_COUNT_PROPERTY)
                        if isinstance(entry.properties, (bytes, memoryview))
                        else entry.properties.get(TXN_COUNT_PROPERTY)
                    )
                    if size is not None and int(size) != count:
                        self.violation(
                            f"{name}: transaction {txn_id} at lsn {begin}..{lsn} holds {count} "
                            f"entries; its commit entry says {size}"
                        )
                    open_txn = None
                else:
                    open_txn = (txn_id, begin, count)
            elif flags & EntryFlags.TXN_BEGIN:
                if entry.txn_id in seen_txns:
                    self.violation(f"{name}: transaction {entry.txn_id} is in the log twice")
                    return
                seen_txns.add(entry.txn_id)
                if entry.txn_id in self.history.abandoned:
                    self.violation(
                        f"{name}: transaction {entry.txn_id}, never committed by its client, "
                        f"is in the log at lsn {lsn}"
                    )
                    return
                open_txn = (entry.txn_id, lsn, 1)
            elif flags & TXN_FLAGS:
                self.violation(
                    f"{name}: a transaction entry (flags {flags:#x}, txn {entry.txn_id}) "
                    f"without its begin at lsn {lsn}"
                )
                return
        if open_txn is not None and open_txn[1] <= top:
            self.violation(
                f"{name}: transaction {open_txn[0]} begun at committed lsn {open_txn[1]} "
                "never commits"
            )
        floor = self.state.manifests[name].deleted_before_lsn
        for txn_id, (pchannel, positions, _) in sorted(self.history.txns.items()):
            if pchannel != name or positions[0][0] < max(floor, reference.log.first_lsn):
                continue
            begin = entries.get(positions[0][0])
            end = entries.get(positions[-1][0])
            if (
                begin is None
                or end is None
                or begin.txn_id != txn_id
                or end.txn_id != txn_id
                or not begin.flags & EntryFlags.TXN_BEGIN
                or not end.flags & EntryFlags.TXN_COMMIT
            ):
                self.violation(
                    f"{name}: acknowledged transaction {txn_id} at lsn {positions[0][0]}.."
                    f"{positions[-1][0]} is not there"
                )
        for (pchannel, lsn), (node_id, identity) in sorted(self.history.reads.items()):
            if pchannel != name or lsn < reference.log.first_lsn:
                continue
            entry = entries.get(lsn)
            held = _identity(reference.frames[lsn]) if entry is not None else None
            if held != identity:
                self.violation(
                    f"{name}: a consumer read {identity} at lsn {lsn} from {node_id}; the "
                    f"owner's log holds {held}"
                )
                return

    async def checker(self) -> None:
        """Compare committed logs now and then during the run: retention may delete the
        evidence of a divergence before the final check."""
        while True:
            await asyncio.sleep(0.25)
            for name in self.pchannels:
                if not self._check_agreement(name, final=False):
                    return


class _Mirror:
    """What the checker has read of one node's log object: its frames, raw, by LSN. Within
    one generation of a `PChannelLog` (bumped at every truncation and restart) an entry up
    to its last LSN never changes, so each check reads only what was appended since, and
    compares a pair of logs only past what it found equal before."""

    def __init__(self, log: PChannelLog, serial: int) -> None:
        self.log = log
        self.serial = serial
        self.generation = log._generation  # noqa: SLF001
        self.frames: dict[int, bytes] = {}
        #: the highest LSN read, and its entry's term and time tick
        self.through = log.first_lsn - 1
        self.term = 0
        self.tick = -1
        #: reference mirror serial -> the highest LSN found equal in both
        self.verified: dict[int, int] = {}
        self.failed = False


def _has_batch_flags(frames: bytes) -> bool:
    """Whether any frame of an Append carries BATCH_CONTINUES."""
    if not frames:
        return False
    try:
        return any(fields[10] & BATCH_CONTINUES_FLAG for _, fields in frame_headers(frames))
    except FormatError:
        return False  # refused by the replica's own checks anyway


def _decode(frame: bytes) -> Any:
    return next(iter_batch(frame))


def _identity(frame: bytes | None) -> tuple[Any, ...] | None:
    """What a consumer sees of an entry (`History.read`): BATCH_CONTINUES is the WAL's
    own bookkeeping, which Consume does not show."""
    if frame is None:
        return None
    entry = _decode(frame)
    return (
        entry.lsn,
        entry.term,
        entry.time_tick,
        entry.flags & ~BATCH_CONTINUES_FLAG,
        entry.txn_id,
        entry.key,
        entry.payload,
    )


# -- running seeds --------------------------------------------------------------------------------


def known_mutations() -> dict[str, str]:
    """Every mutation the simulation can switch on: name -> what it breaks (declared beside
    the code it breaks, in the modules imported above)."""
    return {
        m.name: m.description for m in sorted(mutations.declared().values(), key=lambda m: m.name)
    }


def run_seed(seed: int, options: SimOptions, scratch: Path | None = None) -> SeedResult:
    """Run one seed to the end (violations are in the result, never raised)."""
    shm = Path("/dev/shm")
    base = scratch or (
        shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    )
    root = Path(tempfile.mkdtemp(prefix=f"raftwal-sim-{seed}-", dir=base))
    switched = mutations.enabled(options.mutations)
    switched.__enter__()
    world = World(seed, options, root)
    saved_time = (time.monotonic, time.time, time.perf_counter)
    saved_catalog = plane_module.Catalog
    catalogs: dict[str, _GuardedCatalog] = {}

    def catalog_for(path: Any) -> _GuardedCatalog:
        node_id = Path(path).parent.name
        if node_id not in catalogs:
            catalogs[node_id] = _GuardedCatalog(world.nodes[node_id].catalog_disk)
        return catalogs[node_id]

    handler = _TraceHandler(world)
    loggers = [logging.getLogger(name) for name in _TRACED_LOGGERS]
    saved_loggers = [(lg.level, lg.propagate) for lg in loggers]
    world.disk.install()
    setattr(PChannelLog, "committed_lsn", _CommittedWatch(world))  # noqa: B010
    saved_floor_check = ChannelOwner._check_holds_floor  # noqa: SLF001
    ChannelOwner._check_holds_floor = _floor_watch(world, saved_floor_check)  # type: ignore[method-assign]  # noqa: SLF001
    time.monotonic = world.clock.monotonic  # type: ignore[assignment]
    time.perf_counter = world.clock.monotonic  # type: ignore[assignment]
    time.time = world.clock.wall  # type: ignore[assignment]
    plane_module.Catalog = catalog_for  # type: ignore[assignment,misc]
    buggify.install(world.buggify)
    silenced = logging.getLogger(streaming_node.__name__)
    saved_silenced = silenced.level
    silenced.setLevel(logging.CRITICAL)
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    loop = world.loop
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(world.run())
    except Exception as error:  # noqa: BLE001 - a crash of the run is a finding too
        world.violation(f"the simulation itself failed: {error!r}")
    finally:
        world.result.virtual_s = world.clock.now - 1_000_000.0
        world.tracing = False
        try:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            for _ in range(20):
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                if not pending:
                    break
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
        except Exception:  # noqa: BLE001 - tearing down a failed run
            pass
        loop.close()
        asyncio.set_event_loop(None)
        world.disk.close_all()
        for lg, (level, propagate) in zip(loggers, saved_loggers, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate
        silenced.setLevel(saved_silenced)
        buggify.install(None)
        plane_module.Catalog = saved_catalog  # type: ignore[misc]
        time.monotonic, time.time, time.perf_counter = saved_time  # type: ignore[assignment]
        world.disk.uninstall()
        delattr(PChannelLog, "committed_lsn")
        ChannelOwner._check_holds_floor = saved_floor_check  # type: ignore[method-assign]  # noqa: SLF001
        switched.__exit__(None, None, None)
        for node in world.nodes.values():
            node.catalog_disk.close()
        shutil.rmtree(root, ignore_errors=True)
    result = world.result
    result.sync_failures = world.disk.sync_failures
    result.trace = world.trace[-options.trace_lines :]
    result.digest = world._digest.hexdigest()  # noqa: SLF001
    return result
