"""One simulated history of the WAL replication protocol: ``run_seed(seed, options)``.

The code under test is the real one: each node runs ``wal_segments``' `DataPlane` (its
`ChannelOwner`s and `PChannelLog`s, on real segment files in a tmpfs directory), the
node's `NodeDataView` (the Proposer and the coordination view of ``raftwal.node``), the
real reconcile loop, and ``raftwal.services``' `ReplicationServicer` answering Fence,
Fetch and Append. What is simulated (``raftwal.sim.runtime``): the clock, the event loop,
the disk (a crash can drop every unsynced byte), and here:

- the network between nodes: every message is delayed, an Append stream may break at any
  message, unary calls and their answers may be lost, and links are cut by partitions;
- the coordination plane: one `CoordinationState` changed only by the real state machine
  (``statemachine.apply_command``), each node applying it after its own delay; a leader's
  coordinator loop (liveness with a node timeout, the real balancer's failovers, repairs
  and widenings of replica sets) and a nemesis that shrinks and moves replica sets,
  proposes retention, crashes nodes (a process kill, or a power cut that drops unsynced
  bytes), partitions them and heals;
- a producer writing to each pchannel's owner, whose acknowledged writes are the history.

After the faults, everything heals and the run waits for every pchannel to serve and
make progress, then checks: every acknowledged write is in the owner's log at its LSN
(and was in every segment Raft committed over it), no two nodes' committed entries
differ, and terms never go back along a log. One seed is one history: the same seed gives
the same trace, byte for byte.

Must never: read the real clock or real randomness inside a run, or let one seed's state
leak into the next (each gets a new loop, disk and world).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.rpc import status_pb2

from raftwal.node.data_plane import NodeDataView, reconcile_loop
from raftwal.services.replication import ReplicationServicer
from raftwal.sim.runtime import NODE, Incarnation, SimClock, SimDisk, SimLoop
from rpc.aio import Signal, wait_event
from rpc.errors import code_name
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from statemachine import balancer
from statemachine.apply import apply_command
from statemachine.state import copy_state, new_state
from wal_segments import mutations
from wal_segments import plane as plane_module
from wal_segments.catalog import Catalog
from wal_segments.format import MsgType, check_frame, iter_batch
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import PChannelLog
from wal_segments.owner import ChannelOwner, Message, OwnerConfig, WalError
from wal_segments.plane import DataPlane

E = errors_pb2
PCHANNEL_PREFIX = "p"
_TRACED_LOGGERS = ("wal_segments", "raftwal.services.replication", "raftwal.node.data_plane")


@dataclass(frozen=True)
class SimOptions:
    nodes: int = 4
    pchannels: int = 1
    replica_count: int = 3
    #: virtual seconds of faults, then at most `heal_s` for everything to serve again
    #: (shorter and denser than the first version's histories: they find the
    #: same-term-recovery bug about as often per seed, and about twice as often per CPU
    #: second; see RELIABILITY.md)
    duration_s: float = 1.5
    #: a seed's mean time between faults is one of these
    fault_intervals_s: tuple[float, ...] = (0.15, 0.3, 0.6)
    #: virtual seconds from the start to the first fault
    settle_s: float = 0.3
    heal_s: float = 30.0
    write_interval_s: float = 0.1
    segment_max_bytes: int = 2048
    #: ``same-term-recovery`` puts back the bug a recovery at one term twice caused
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
    acknowledged: int = 0
    sync_failures: int = 0
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
    """What a servicer handler gets as its grpc context."""

    async def abort_with_status(self, status: Any) -> None:
        info = errors_pb2.ErrorInfo(code=E.UNKNOWN, message="aborted")
        for key, value in status.trailing_metadata or ():
            if key == "grpc-status-details-bin":
                for detail in status_pb2.Status.FromString(value).details:
                    if detail.Is(errors_pb2.ErrorInfo.DESCRIPTOR):
                        detail.Unpack(info)
        raise _Abort(info)


class _GuardedCatalog:
    """A node's catalog, kept across its incarnations (in memory: durable at each commit,
    as synchronous=FULL is on a disk). A crashed incarnation can no longer change it."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def __getattr__(self, name: str) -> Any:
        incarnation = NODE.get()
        if incarnation is not None and not incarnation.alive:
            raise OSError(5, f"simulated: catalog.{name} after the node crashed")
        return getattr(self._catalog, name)

    def close(self) -> None:
        """Kept open: the next incarnation finds it as it was."""


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
        self._ends: list[Incarnation | None] = [world.nodes[source].incarnation, None]
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
        at = max(sent + delay, self._sent_at[direction])
        self._sent_at[direction] = at
        queue = self._requests if direction == 0 else self._responses
        receiver = self._ends[1 - direction]

        def arrive() -> None:
            if item is not None and (
                (receiver is not None and not receiver.alive)
                or frozenset((self.source, self.target)) in world.partitions
                or sent > self.lost_after[direction]
            ):
                return
            queue.put_nowait(item)

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


class SimNode:
    """One node id across its incarnations; while running, the host the data plane glue
    and the Replication servicer see (``DataPlaneHost``, ``ReplicationBackend``)."""

    def __init__(self, world: World, node_id: str) -> None:
        self.world = world
        self.node_id = node_id
        self.root = world.root / node_id
        self.root.mkdir(mode=0o700)
        self.catalog = Catalog(":memory:")
        self.incarnation: Incarnation | None = None
        self.context: contextvars.Context | None = None
        self.applied = world.history[-1]
        self.applied_index = len(world.history) - 1
        self._changed = Signal()
        self.plane: DataPlane | None = None
        self.data_view: NodeDataView | None = None
        self.servicer: ReplicationServicer | None = None
        self.down_since: float | None = None

    # DataPlaneHost / ReplicationBackend
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
        return await self.world.propose(self.node_id, command)

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
            self.applied = self.world.history[index]
            event, self._changed = self._changed, Signal()
            event.set()

    def start(self) -> None:
        number = self.incarnation.number + 1 if self.incarnation else 1
        incarnation = Incarnation(self.node_id, number)
        self.incarnation = incarnation
        self.down_since = None
        self.applied_index = len(self.world.history) - 1
        self.applied = self.world.history[-1]
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
                segment_max_bytes=world.options.segment_max_bytes,
                replication_chunk_bytes=4096,
                retry_min_s=0.02,
                retry_max_s=0.3,
                rpc_timeout_s=0.5,
            ),
            transport=_Transport(world, self.node_id),
            proposer=self.data_view,
            view=self.data_view,
        )
        self.servicer = ReplicationServicer(self, self.plane)
        stopping = asyncio.Event()
        asyncio.get_running_loop().create_task(
            reconcile_loop(self, self.plane, self.data_view, stopping)
        )

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        assert self.context is not None
        return asyncio.get_running_loop().create_task(coroutine, context=self.context)

    def crash(self, power: bool) -> int:
        incarnation = self.incarnation
        assert incarnation is not None and incarnation.alive
        incarnation.alive = False
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
            dropped = world.disk.crash(self.node_id, keep_prefix_rate=0.3)
        self.plane = None
        return dropped


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


class World:
    def __init__(self, seed: int, options: SimOptions, root: Path) -> None:
        self.seed = seed
        self.options = options
        self.root = root
        self.root_text = str(root)
        self.rng = random.Random(seed)
        rng = self.rng
        self.clock = SimClock()
        self.loop = SimLoop(self.clock, self._io_latency)
        self.disk = SimDisk(root, random.Random(rng.random()), rng.choice([0.0, 0.0, 0.002]))
        # This seed's fault and timing profile.
        self.break_rate = rng.choice([0.0, 0.002, 0.01])
        self.base_delay_s = rng.choice([0.0005, 0.002, 0.01])
        self.lost_reply_rate = rng.choice([0.0, 0.05])
        self.fault_interval_s = rng.choice(list(options.fault_intervals_s))
        self.power_rate = rng.choice([0.5, 0.8, 1.0])
        self.history: list[pb.CoordinationState] = [new_state()]
        self.state = copy_state(self.history[0])
        self.raft_index = 0
        self.partitions: set[frozenset[str]] = set()
        self.streams: set[_Stream] = set()
        self.stream_serial = 0
        self.trace: list[str] = []
        self._digest = hashlib.sha256()
        self.result = SeedResult(seed)
        self.acked: dict[tuple[str, int], bytes] = {}
        self.stopping = False
        self.faulting = True
        self.assigning_since: dict[tuple[str, int], float] = {}
        self._request = 0
        self.nodes: dict[str, SimNode] = {}
        #: crashed nodes' restarts still to come: (when, node id)
        self._restarts: list[tuple[float, str]] = []
        self._driver_context = contextvars.Context()
        self._mirrors: dict[tuple[str, str], _Mirror] = {}
        self._mirror_serial = 0
        self.pchannels = [f"{PCHANNEL_PREFIX}{i}" for i in range(options.pchannels)]

    # -- tracing ---------------------------------------------------------------------------

    def trace_line(self, who: str, text: str) -> None:
        line = f"{self.clock.now - 1_000_000.0:9.4f} {who:<6} {text}"
        self._digest.update(line.encode())
        self.trace.append(line)
        if len(self.trace) > self.options.trace_lines * 2:
            del self.trace[: -self.options.trace_lines]

    def violation(self, text: str) -> None:
        self.trace_line("CHECK", f"VIOLATION {text}")
        self.result.violations.append(text)

    # -- timing ----------------------------------------------------------------------------

    def _io_latency(self) -> float:
        rng = self.rng
        return 0.0002 + (
            rng.expovariate(1 / 0.001) if rng.random() < 0.9 else rng.uniform(0.005, 0.03)
        )

    def net_delay(self) -> float:
        return self.base_delay_s * (0.5 + self.rng.random()) + (
            self.rng.uniform(0.01, 0.08) if self.rng.random() < 0.03 else 0.0
        )

    def link_up(self, a: str, b: str) -> bool:
        if frozenset((a, b)) in self.partitions:
            return False
        return self.nodes[a].running and self.nodes[b].running

    # -- network calls -----------------------------------------------------------------------

    def serve_stream(self, stream: _Stream) -> None:
        node = self.nodes[stream.target]
        if not node.running or node.servicer is None:
            stream.break_()
            return
        servicer = node.servicer
        stream.served_by(node.incarnation)

        async def serve() -> None:
            owner_ids: set[str] = set()
            try:
                async for response in servicer._answer(stream.requests(), owner_ids):  # noqa: SLF001
                    stream.answer(response)
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

        def arrive() -> None:
            node = self.nodes[target]
            if not node.running or node.servicer is None or not self.link_up(source, target):
                return
            handler = getattr(node.servicer, method)

            async def handle() -> None:
                try:
                    outcome: tuple[bool, Any] = (True, await handler(request, _Context()))
                except _Abort as error:
                    outcome = (False, error)
                except (OSError, asyncio.CancelledError):
                    return  # the node crashed while handling it: no answer
                if lose_answer or not self.link_up(source, target):
                    return
                self.loop.call_at(self.clock.now + self.net_delay(), settle, outcome)

            node.spawn(handle())

        def settle(outcome: tuple[bool, Any]) -> None:
            if answer.done() or not self.nodes[source].running:
                return
            ok, value = outcome
            if ok:
                answer.set_result(value)
            else:
                answer.set_exception(value)

        loop.call_at(self.clock.now + self.net_delay(), arrive)
        return await answer

    # -- coordination ------------------------------------------------------------------------

    def apply(self, command: pb.Command, who: str = "coord") -> pb.CommandResult:
        if not command.request_id:
            self._request += 1
            command.request_id = f"sim-{self._request}"
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
            self.history.append(copy_state(self.state))
            index = len(self.history) - 1
            for node in self.nodes.values():
                self.loop.call_at(self.clock.now + self.net_delay() * 2, node.apply_up_to, index)
            if kind == "commit_segment" and accepted:
                self._check_committed_segment(who, command.commit_segment)
            if kind == "assign_pchannel" and accepted and not self.stopping and self.faulting:
                # Tail recovery is short: faults at random times rarely land in it. Now and
                # then the new owner crashes at one of its next syncs, mid-recovery.
                owner = command.assign_pchannel.node_id
                if self.rng.random() < 0.3:
                    power = self.rng.random() < self.power_rate
                    self.disk.arm(
                        owner, lambda n=owner, p=power: self._crash(n, p), self.rng.randint(0, 3)
                    )
                if self.rng.random() < 0.3:
                    # ... and one of its replicas is briefly out of reach, so that what it
                    # writes reaches some replicas and not others.
                    others = [n for n in command.assign_pchannel.replica_node_ids if n != owner]
                    if others:
                        self._cut(owner, self.rng.choice(others), self.rng.uniform(0.002, 0.05))
        return result

    async def propose(self, who: str, command: pb.Command) -> pb.CommandResult:
        await asyncio.sleep(self.net_delay() * 2)
        if self.rng.random() < self.lost_reply_rate / 2:
            raise ConnectionError("raft: no leader reachable")
        result = self.apply(command, who)
        if self.rng.random() < self.lost_reply_rate / 2:
            raise ConnectionError("raft: reply lost")
        await asyncio.sleep(self.net_delay())
        return result

    def _check_committed_segment(self, who: str, segment: pb.CommitSegment) -> None:
        node = self.nodes.get(who)
        if node is None or node.plane is None:
            return
        log = node.plane.logs.get(segment.pchannel)
        if log is None:
            return
        try:
            entries = {
                e.lsn: e.payload for e in log.iter_entries(segment.first_lsn, segment.last_lsn)
            }
        except (KeyError, OSError):
            self.violation(
                f"{who} committed segment [{segment.first_lsn}, {segment.last_lsn}] "
                "that its own log cannot read"
            )
            return
        for (pchannel, lsn), payload in sorted(self.acked.items()):
            if (
                pchannel == segment.pchannel
                and segment.first_lsn <= lsn <= segment.last_lsn
                and entries.get(lsn) != payload
            ):
                self.violation(
                    f"{pchannel}: committed segment [{segment.first_lsn}, "
                    f"{segment.last_lsn}] (term {segment.term}, by {who}) holds "
                    f"{entries.get(lsn)!r} at lsn {lsn}, acknowledged as {payload!r}"
                )

    async def coordinator(self) -> None:
        """The Raft leader's loop: liveness, failover, repair (the real balancer)."""
        node_timeout_s, replace_after_s, assign_timeout_s = 0.8, 2.5, 3.0
        last_situation: tuple[Any, ...] = ()
        while True:
            await asyncio.sleep(0.1)
            now = self.clock.now
            for node_id, node in sorted(self.nodes.items()):
                recorded = self.state.nodes[node_id].state
                if node.running and recorded == pb.NODE_STATE_DOWN:
                    self.apply(pb.Command(mark_node_up=pb.MarkNodeUp(node_id=node_id)))
                elif (
                    not node.running
                    and recorded == pb.NODE_STATE_UP
                    and node.down_since is not None
                    and now - node.down_since > node_timeout_s
                ):
                    self.apply(pb.Command(mark_node_down=pb.MarkNodeDown(node_id=node_id)))
            # Live as the leader sees it: heartbeats within the node timeout.
            live = [
                n
                for n, node in sorted(self.nodes.items())
                if node.running
                or (node.down_since is not None and now - node.down_since <= node_timeout_s)
            ]
            long_down = [
                n
                for n, node in sorted(self.nodes.items())
                if node.down_since is not None and now - node.down_since > replace_after_s
            ]
            stuck = []
            for name in self.pchannels:
                channel = self.state.pchannels[name]
                if channel.state == pb.PCHANNEL_STATE_ASSIGNING:
                    since = self.assigning_since.setdefault((name, channel.term), now)
                    if now - since > assign_timeout_s:
                        stuck.append(name)
            situation = (self.state.revision, tuple(live), tuple(stuck), tuple(long_down))
            if situation == last_situation:
                continue  # the plan is a pure function of these: nothing new to propose
            last_situation = situation
            for command in balancer.plan(self.state, live, stuck, replace_nodes=long_down):
                self.apply(command)

    # -- workload ----------------------------------------------------------------------------

    async def producer(self) -> None:
        sequence = 0
        while True:
            await asyncio.sleep(self.options.write_interval_s * (0.5 + self.rng.random()))
            if self.stopping:
                continue
            pchannel = self.rng.choice(self.pchannels)
            channel = self.state.pchannels[pchannel]
            node = self.nodes.get(channel.owner_node_id)
            if node is None or not node.running or node.plane is None:
                continue
            owner = node.plane.owner(pchannel)
            if owner is None or not owner.serving:
                continue
            sequence += 1
            node.spawn(self._write(node.node_id, owner, pchannel, f"w{sequence}".encode()))

    async def _write(self, who: str, owner: ChannelOwner, pchannel: str, payload: bytes) -> None:
        message = Message(vchannel_id=1, msg_type=int(MsgType.MESSAGE), payload=payload)
        try:
            positions, _ = await owner.write([message])
        except (WalError, OSError, AssertionError) as error:
            del error
            return
        lsn = positions[0][0]
        key = (pchannel, lsn)
        self.trace_line(who, f"ack {pchannel} lsn {lsn} {payload.decode()} (term {owner.term})")
        self.result.acknowledged += 1
        previous = self.acked.get(key)
        if previous is not None and previous != payload:
            self.violation(
                f"{pchannel}: lsn {lsn} acknowledged twice, as {previous!r} and {payload!r}"
            )
        self.acked[key] = payload

    # -- nemesis -----------------------------------------------------------------------------

    async def nemesis(self) -> None:
        rng = self.rng
        end = self.clock.now + self.options.duration_s
        while True:
            pause = rng.expovariate(1 / self.fault_interval_s)
            if self.clock.now + pause >= end:
                # Faults last duration_s, not up to a whole fault interval more.
                await asyncio.sleep(max(0.0, end - self.clock.now))
                break
            await asyncio.sleep(pause)
            roll = rng.random()
            if roll < 0.55:
                self._crash_some()
            elif roll < 0.7:
                self._partition()
            elif roll < 0.9:
                self._change_replicas()
            else:
                self._retention()
        self.faulting = False
        self.disk.disarm()
        self.trace_line("sim", "faults stop; healing")

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
        if rng.random() < 0.5:
            # At the node's next fsync, before it takes effect: what it wrote since the
            # last one is what a power cut drops.
            for node_id in victims:
                self.disk.arm(
                    node_id, lambda n=node_id: self._crash(n, rng.random() < self.power_rate)
                )
            return
        for node_id in victims:
            self._crash(node_id, rng.random() < self.power_rate)

    def _crash(self, node_id: str, power: bool) -> None:
        node = self.nodes[node_id]
        if not node.running:
            return
        unsynced = self.disk.unsynced_bytes(node_id)
        if node.plane is not None:
            for name, owner in sorted(node.plane.owners.items()):
                if owner.state == "recovering" and owner.start_lsn:
                    self.trace_line(
                        node_id,
                        f"{name}: crash mid-recovery at term {owner.term} after its term start at lsn {owner.start_lsn}",
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
        back = self.rng.uniform(0.02, 0.5) if self.rng.random() < 0.7 else self.rng.uniform(0.5, 3)
        restart = (self.clock.now + back, node_id)
        self._restarts.append(restart)
        # A timer of the driver's (the crash may run in the crashed incarnation's context).
        self.loop.call_at(restart[0], self._restart, restart, context=self._driver_context)

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
        links = {frozenset((isolated, other)) for other in names if other != isolated}
        if rng.random() < 0.3:
            # One link only (a bridge: both still see the others).
            links = {rng.choice(sorted(links, key=sorted))}
        self.partitions |= links
        for stream in sorted(self.streams, key=lambda s: s.serial):
            if frozenset((stream.source, stream.target)) in links:
                stream.break_()
        hold = rng.uniform(0.1, 1.5)
        self.trace_line(
            "sim", f"partition {sorted(sorted(link) for link in links)} for {hold:.2f} s"
        )

        def heal() -> None:
            self.partitions -= links

        self.loop.call_later(hold, heal)

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

        self.loop.call_later(hold_s, heal)

    def _change_replicas(self) -> None:
        rng = self.rng
        name = rng.choice(self.pchannels)
        channel = self.state.pchannels[name]
        if channel.term == 0 or not balancer.settled(channel):
            return
        members = list(channel.replica_node_ids)
        up = [n for n, node in sorted(self.nodes.items()) if node.running]
        choice = rng.random()
        owner = channel.owner_node_id
        if choice < 0.5 and len(members) > 2:
            members.remove(rng.choice([m for m in members if m != owner]))  # shrink
        elif choice < 0.8:
            candidates = [m for m in members if m != owner and m in up]
            if not candidates:
                return
            owner = rng.choice(candidates)  # move the owner within the set
        else:
            outside = [n for n in up if n not in members]
            if not outside or len(members) < 2:
                return
            members[members.index(rng.choice([m for m in members if m != owner]))] = rng.choice(
                outside
            )
        if owner not in up:
            return
        self.apply(
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
            self.apply(
                pb.Command(
                    delete_segments_before=pb.DeleteSegmentsBefore(pchannel=name, before_lsn=before)
                ),
                "nemesis",
            )

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        options = self.options
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
                    prefix=PCHANNEL_PREFIX.rstrip("_") or "p",
                    count=options.pchannels,
                    replica_count=options.replica_count,
                )
            )
        )
        self.pchannels = sorted(self.state.pchannels)
        for node in self.nodes.values():
            node.start()
        background = [
            self.loop.create_task(self.coordinator()),
            self.loop.create_task(self.producer()),
            self.loop.create_task(self.checker()),
        ]
        try:
            await asyncio.sleep(self.options.settle_s)
            await self.nemesis()
            await self._heal()
        finally:
            for task in background:
                task.cancel()

    async def _heal(self) -> None:
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
        self.stopping = True
        await asyncio.sleep(0.3)  # writes in flight finish or fail
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

    def _check_final(self) -> None:
        for name in self.pchannels:
            self._check_agreement(name, final=True)

    def _mirror(self, node_id: str, name: str, log: PChannelLog) -> _Mirror | None:
        """The checker's copy of `node_id`'s log of `name`, brought up to the log's end
        (`failed` once it found a violation: a term going back, an unreadable frame).
        None while the log is busy: a truncation bumps the generation before it truncates,
        so what a log holds matches its generation only when no append or truncation holds
        its lock; it is read then."""
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
                term = fields[3]
                if term < mirror.term:
                    mirror.failed = True
                    self.violation(
                        f"{name}: term goes back on {node_id} at lsn {lsn} "
                        f"({mirror.term} -> {term})"
                    )
                    return mirror
                mirror.frames[lsn] = bytes(view[offset:end])
                mirror.term, mirror.through = term, lsn
                offset = end
                lsn += 1
        return mirror

    def _check_agreement(self, name: str, final: bool) -> bool:
        """Against the serving owner's log: every acknowledged write still retained is at
        its LSN (final check only: meanwhile the owner may not have adopted it yet), no
        node's committed entry differs from the owner's (the whole frame, byte for byte: a
        committed segment is the same bytes everywhere), and terms never go back along a
        log. Each log is read once (`_Mirror`) and each pair of logs compared once up to
        what both had committed. Returns False when it found a violation."""
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
        found = False
        if final:
            for (pchannel, lsn), payload in sorted(self.acked.items()):
                if pchannel != name or lsn < log.first_lsn:
                    continue
                frame = reference.frames.get(lsn) if lsn <= reference_top else None
                held = _decode(frame).payload if frame is not None else None
                if held != payload:
                    found = True
                    self.violation(
                        f"{name}: acknowledged {payload!r} at lsn {lsn} is lost: the owner "
                        f"{node.node_id} (term {owner.term}) holds {held!r} there"
                    )
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
        #: the highest LSN read, and its entry's term
        self.through = log.first_lsn - 1
        self.term = 0
        #: reference mirror serial -> the highest LSN found equal in both
        self.verified: dict[int, int] = {}
        self.failed = False


def _decode(frame: bytes) -> Any:
    return next(iter_batch(frame))


def _identity(frame: bytes | None) -> tuple[Any, ...] | None:
    if frame is None:
        return None
    entry = _decode(frame)
    return (
        entry.lsn,
        entry.term,
        entry.time_tick,
        entry.msg_type,
        entry.flags,
        entry.vchannel_id,
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
    world = World(seed, options, root)
    saved_time = (time.monotonic, time.time, time.perf_counter)
    saved_catalog = plane_module.Catalog
    catalogs: dict[str, _GuardedCatalog] = {}

    def catalog_for(path: Any) -> _GuardedCatalog:
        node_id = Path(path).parent.name
        if node_id not in catalogs:
            catalogs[node_id] = _GuardedCatalog(world.nodes[node_id].catalog)
        return catalogs[node_id]

    handler = _TraceHandler(world)
    loggers = [logging.getLogger(name) for name in _TRACED_LOGGERS]
    saved_loggers = [(lg.level, lg.propagate) for lg in loggers]
    switched = mutations.enabled(options.mutations)
    switched.__enter__()
    world.disk.install()
    time.monotonic = world.clock.monotonic  # type: ignore[assignment]
    time.perf_counter = world.clock.monotonic  # type: ignore[assignment]
    time.time = world.clock.wall  # type: ignore[assignment]
    plane_module.Catalog = catalog_for  # type: ignore[assignment,misc]
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
        plane_module.Catalog = saved_catalog  # type: ignore[misc]
        time.monotonic, time.time, time.perf_counter = saved_time  # type: ignore[assignment]
        world.disk.uninstall()
        switched.__exit__(None, None, None)
        for node in world.nodes.values():
            node.catalog.close()
        shutil.rmtree(root, ignore_errors=True)
    result = world.result
    result.sync_failures = world.disk.sync_failures
    result.trace = world.trace[-options.trace_lines :]
    result.digest = world._digest.hexdigest()  # noqa: SLF001
    return result
