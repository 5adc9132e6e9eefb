"""The simulated clients of ``raftwal simulate``: producers, transactions and consumers
that reach the nodes over the simulated network and route with views that may be stale.

What lives here:
- `Router`: a client's routing table, refreshed from the applied state of whichever node
  it reaches (a WatchAssignments stream: that node may lag behind Raft, or be cut off
  from it) and from the owner hints of NOT_OWNER / CHANNEL_FENCED answers. So a deposed
  owner that still serves its old term is offered writes, as a real client would offer
  it them.
- `ProducerLane`: one pchannel's pipeline of an idempotent producer, driven the way
  ``rpc.streaming.producer.Producer`` drives its lanes: multi-message batches stamped
  with (producer id, sequence), up to `max_in_flight` unacknowledged; after NOT_OWNER,
  CHANNEL_FENCED, ON_SHUTDOWN, a lost answer or a silent owner, every unacknowledged
  batch is sent again, in sequence order, with the same sequences, to the owner the
  router names now; a batch out of time or attempts fails with the later ones (its
  outcome unknown). Each request is served by the node's real
  ``StreamingNodeServicer.Produce`` stream handler.
- `TxnClient`: BeginTxn, AppendTxn, then CommitTxn (retried after an unknown outcome,
  which the real servicer answers from its memory or a new owner's log) or RollbackTxn.
- `Consumer`: the real ``StreamingNodeServicer.Consume`` stream, from the owner or from a
  replica (``from_replica``), with control entries; every entry it reads is recorded, and
  one LSN read twice with different contents is a violation at once.

Everything acknowledged or read goes to the world's `History`; the world checks it.

Must never: read the real clock or real randomness, or touch a node's objects except
through its servicers (a client is not in the node's process).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from google.rpc import status_pb2

from raftwal.services import consume_wire
from rpc.aio import Signal, wait_event
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire

#: The simulated world (``raftwal.sim.world.World``; not imported: the world imports this
#: module, and the layering allows no cycle, not even for type checking).
World = Any

E = errors_pb2
RETRYABLE = frozenset({E.NOT_OWNER, E.CHANNEL_FENCED, E.ON_SHUTDOWN, E.NOT_LEADER, E.UNKNOWN})


class CallLost(Exception):
    """No answer within the caller's timeout: the outcome is unknown."""


class CallFailed(Exception):
    """The node answered with an error status."""

    def __init__(self, info: errors_pb2.ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


class ClientContext:
    """What a servicer handler gets as its grpc context from a simulated client."""

    def __init__(self, client: str) -> None:
        self._peer = f"ipv4:{client}.sim:1"

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, Any]:
        return {}

    def cancelled(self) -> bool:
        return False

    async def abort_with_status(self, status: Any) -> None:
        raise CallFailed(abort_info(status))


def abort_info(status: Any) -> errors_pb2.ErrorInfo:
    """The ErrorInfo of a status a servicer aborted with."""
    info = errors_pb2.ErrorInfo(code=E.UNKNOWN, message="aborted")
    for key, value in status.trailing_metadata or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                if detail.Is(errors_pb2.ErrorInfo.DESCRIPTOR):
                    detail.Unpack(info)
    return info


# -- routing ----------------------------------------------------------------------------------


class Router:
    """A client's view of who owns what (see the module doc)."""

    def __init__(self, world: World, client: str) -> None:
        self.world = world
        self.client = client
        #: pchannel -> (owner node id, term)
        self.routes: dict[str, tuple[str, int]] = {}
        self.changed = Signal()

    def route(self, pchannel: str) -> tuple[str, int] | None:
        return self.routes.get(pchannel)

    def learn(self, state: pb.CoordinationState) -> None:
        for name, channel in state.pchannels.items():
            if channel.state != pb.PCHANNEL_STATE_ASSIGNED:
                continue
            known = self.routes.get(name)
            # A stale node's view may be older than what the client knows already: a
            # watch stream never goes back in revision, nor does this table in term.
            if known is None or channel.term >= known[1]:
                self.routes[name] = (channel.owner_node_id, channel.term)
        event, self.changed = self.changed, Signal()
        event.set()

    def hint(self, pchannel: str, info: errors_pb2.ErrorInfo) -> None:
        node = info.owner_hint.split(".", 1)[0] if info.owner_hint else ""
        known = self.routes.get(pchannel)
        if node in self.world.nodes and (known is None or info.current_term > known[1]):
            self.routes[pchannel] = (node, info.current_term)

    async def watch(self) -> None:
        """WatchAssignments from one reachable node at a time: its applied view, now and
        then (it may lag, or be cut off from Raft)."""
        world = self.world
        rng = world.rng
        node_ids = sorted(world.nodes)
        source = rng.choice(node_ids)
        while True:
            await asyncio.sleep(rng.uniform(0.1, 0.4))
            node = world.nodes[source]
            if not node.running or not world.link_up(self.client, source) or rng.random() < 0.1:
                source = rng.choice(node_ids)
                continue
            self.learn(node.applied)


# -- calls ---------------------------------------------------------------------------------------


class Connection:
    """One client connection to a node (a Produce stream, a channel): what is lost is lost
    from some point on, never one answer in the middle (it is TCP). Once `broken`, no
    request sent on it is served and no answer comes back."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.broken = False


async def call(
    world: World,
    client: str,
    node_id: str,
    handler: Callable[[Any], Awaitable[Any]],
    timeout_s: float,
    connection: Connection | None = None,
) -> Any:
    """One request from `client` to a node's servicer (`handler(servicer)` runs on the node,
    in its incarnation); raises CallLost when no answer came within `timeout_s` (the
    connection broke, the node is down or cut off), CallFailed for an error status."""
    loop = world.loop
    answer: asyncio.Future[Any] = loop.create_future()
    connection = connection or Connection(node_id)
    lose = world.rng.random() < world.client_loss_rate

    def arrive() -> None:
        node = world.nodes[node_id]
        if (
            connection.broken
            or not node.running
            or node.streaming is None
            or not world.link_up(client, node_id)
        ):
            connection.broken = True
            return
        servicer = node.streaming

        async def handle() -> None:
            try:
                outcome: tuple[bool, Any] = (True, await handler(servicer))
            except CallFailed as error:
                outcome = (False, error)
            except (OSError, asyncio.CancelledError):
                return  # the node crashed while handling it: no answer
            if lose or connection.broken or not world.link_up(client, node_id):
                connection.broken = True
                return
            loop.call_at(world.clock.now + world.net_delay(), settle, outcome)

        node.spawn(handle())

    def settle(outcome: tuple[bool, Any]) -> None:
        if connection.broken:
            return
        if not answer.done():
            ok, value = outcome
            if ok:
                answer.set_result(value)
            else:
                answer.set_exception(value)

    if world.link_up(client, node_id):
        loop.call_at(world.clock.now + world.net_delay(), arrive)
    try:
        return await asyncio.wait_for(answer, timeout_s)
    except TimeoutError:
        raise CallLost(f"{client} -> {node_id}: no answer in {timeout_s:g} s") from None


# -- producers -------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Batch:
    sequence: int
    payloads: list[bytes]
    deadline: float
    attempts: int = 0
    sent_at: float = 0.0
    node: str = ""
    term: int = 0
    attempt: asyncio.Task[Any] | None = None


@dataclass
class LaneOptions:
    max_batch: int
    max_in_flight: int
    interval_s: float
    attempt_timeout_s: float = 1.0
    retry_timeout_s: float = 4.0
    max_attempts: int = 12


class ProducerLane:
    """One producer's pipeline to one pchannel (see the module doc)."""

    def __init__(
        self,
        world: World,
        client: str,
        router: Router,
        pchannel: str,
        vchannel: str,
        options: LaneOptions,
        first_sequence: int,
    ) -> None:
        self.world = world
        self.client = client
        self.router = router
        self.pchannel = pchannel
        self.vchannel = vchannel
        self.options = options
        self.producer_id = f"{client}-producer"
        self.next_sequence = first_sequence
        self.inflight: list[_Batch] = []
        self.failure: errors_pb2.ErrorInfo | None = None
        self.wake = Signal()
        self.serial = 0
        self.connection: Connection | None = None
        self.context = ClientContext(client)
        #: every payload submitted, in submission order (the checker's order check)
        self.submitted: list[bytes] = []

    def _trace(self, text: str) -> None:
        self.world.trace_line(self.client, text)

    async def run(self) -> None:
        world = self.world
        rng = world.rng
        next_cut = world.clock.now + rng.uniform(0, self.options.interval_s)
        while True:
            self.wake.clear()
            self._collect()
            if self.failure is not None:
                await self._recover()
                continue
            now = world.clock.now
            if world.clients_stopping:
                if not self.inflight:
                    return
            elif (
                now >= next_cut
                and len(self.inflight) < self.options.max_in_flight
                and self.router.route(self.pchannel) is not None
            ):
                # (A new batch goes out only on a working pipeline: never past a failed one.)
                self._send(self._cut())
                next_cut = now + self.options.interval_s * (0.5 + rng.random())
            timers = [
                b.sent_at + self.options.attempt_timeout_s - now
                for b in self.inflight
                if b.attempt is not None and not b.attempt.done()
            ]
            if not world.clients_stopping and len(self.inflight) < self.options.max_in_flight:
                routed = self.router.route(self.pchannel) is not None
                timers.append(next_cut - now if routed else 0.05)
            await wait_event(self.wake, max(0.005, min(timers, default=0.5)))

    def _cut(self) -> _Batch:
        world = self.world
        count = world.rng.randint(1, self.options.max_batch)
        payloads = []
        for _ in range(count):
            self.serial += 1
            payload = f"{self.client}:{self.pchannel}:{self.serial}".encode() + world.padding()
            payloads.append(payload)
            self.submitted.append(payload)
        sequence = self.next_sequence
        self.next_sequence += 1
        world.history.submitted += count
        for index, payload in enumerate(payloads):
            world.history.batch_of[payload] = (self.producer_id, sequence, index, payloads)
        return _Batch(sequence, payloads, world.clock.now + self.options.retry_timeout_s)

    def _send(self, batch: _Batch) -> bool:
        """Send `batch` (new or again) to the owner the router names; False when there
        is none yet (a new batch then waits; a resent one is retried later)."""
        route = self.router.route(self.pchannel)
        if batch not in self.inflight:
            self.inflight.append(batch)
        if route is None:
            batch.sent_at = self.world.clock.now
            return False
        node, term = route
        connection = self.connection
        if connection is None or connection.broken or connection.node_id != node:
            connection = self.connection = Connection(node)
        batch.attempts += 1
        batch.sent_at = self.world.clock.now
        batch.node, batch.term = node, term
        request = wire.ProduceRequest(
            pchannel=self.pchannel,
            batch_vchannel=self.vchannel,
            batch_msg_type="message",
            payloads=batch.payloads,
            producer_id=self.producer_id,
            sequence=batch.sequence,
        )

        context = self.context

        async def attempt() -> wire.ProduceResult:
            try:
                return await call(
                    self.world,
                    self.client,
                    node,
                    lambda servicer: produce(servicer, request, context),
                    self.options.attempt_timeout_s,
                    connection,
                )
            finally:
                self.wake.set()

        batch.attempt = self.world.loop.create_task(attempt())
        batch.attempt.add_done_callback(_retrieve)
        return True

    def _mark_failed(self, batch: _Batch, info: errors_pb2.ErrorInfo) -> None:
        batch.attempt = None
        if self.failure is None:
            self.failure = info

    def _collect(self) -> None:
        now = self.world.clock.now
        route = self.router.route(self.pchannel)
        if self.connection is not None and self.connection.broken and self.inflight:
            # The stream failed: every batch still on it fails (the SDK's _StreamBroken).
            for batch in self.inflight:
                if batch.attempt is not None and not batch.attempt.done():
                    self._mark_failed(
                        batch, errors_pb2.ErrorInfo(code=E.ON_SHUTDOWN, message="stream broke")
                    )
        for batch in list(self.inflight):
            attempt = batch.attempt
            if attempt is None:
                if batch.attempts == 0 or now - batch.sent_at > self.options.attempt_timeout_s:
                    self._mark_failed(
                        batch, errors_pb2.ErrorInfo(code=E.ON_SHUTDOWN, message="not sent")
                    )
                continue
            if not attempt.done():
                if route is not None and route[1] > batch.term:
                    self._mark_failed(
                        batch, errors_pb2.ErrorInfo(code=E.CHANNEL_FENCED, message="moved on")
                    )
                continue
            error = attempt.exception()
            if error is not None:
                info = (
                    error.info
                    if isinstance(error, CallFailed)
                    else errors_pb2.ErrorInfo(code=E.ON_SHUTDOWN, message=str(error))
                )
                self._mark_failed(batch, info)
                continue
            result = attempt.result()
            if result.HasField("error") and result.error.code != E.OK:
                if result.error.code in RETRYABLE:
                    self.router.hint(self.pchannel, result.error)
                    self._mark_failed(batch, result.error)
                else:
                    self._trace(
                        f"batch {batch.sequence} of {self.pchannel} refused: "
                        f"{result.error.message[:120]}"
                    )
                    self._give_up(batch, known=False)
                continue
            if len(result.time_ticks) != len(batch.payloads):
                self.world.violation(
                    f"{self.pchannel}: batch {batch.sequence} of {len(batch.payloads)} messages "
                    f"answered with {len(result.time_ticks)} positions"
                )
                self._give_up(batch, known=False)
                continue
            self.inflight.remove(batch)
            self.world.history.batch_acknowledged(
                self,
                batch.sequence,
                batch.payloads,
                result.first_lsn,
                result.term,
                result.duplicate,
            )

    def _give_up(self, batch: _Batch, known: bool) -> None:
        if batch in self.inflight:
            self.inflight.remove(batch)
        self.world.history.unknown += len(batch.payloads)

    def _expire(self) -> None:
        now = self.world.clock.now
        for index, batch in enumerate(self.inflight):
            if batch.deadline <= now or batch.attempts >= self.options.max_attempts:
                for later in list(self.inflight[index:]):
                    self._give_up(later, known=False)
                self._trace(
                    f"{self.pchannel}: batches {batch.sequence}.. not acknowledged in time "
                    "(outcome unknown)"
                )
                return

    async def _recover(self) -> None:
        world = self.world
        info = self.failure
        self.failure = None
        assert info is not None
        self.connection = None  # a new stream, as the producer opens after a failure
        self.router.hint(self.pchannel, info)
        for batch in self.inflight:
            batch.attempt = None  # a late answer is ignored: its resend answers again
        await asyncio.sleep(world.rng.uniform(0.02, 0.15))
        self._expire()
        if not self.inflight:
            return
        route = self.router.route(self.pchannel)
        if route is not None and len(self.inflight) > 0:
            self._trace(
                f"resend {self.pchannel} seq {self.inflight[0].sequence}..{self.inflight[-1].sequence}"
                f" to {route[0]} (term {route[1]})"
            )
        for batch in list(self.inflight):
            self._send(batch)


async def produce(
    servicer: Any, request: wire.ProduceRequest, context: ClientContext
) -> wire.ProduceResult:
    """One request on the node's public Produce stream handler, and its result (the SDK
    pipelines requests on one stream; each is served the same way, in arrival order)."""

    async def requests() -> AsyncIterator[wire.ProduceRequest]:
        yield request

    results = servicer.Produce(requests(), context)
    try:
        async for result in results:
            return result
    finally:
        await results.aclose()
    raise CallFailed(errors_pb2.ErrorInfo(code=E.UNKNOWN, message="Produce stream ended"))


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


# -- transactions ---------------------------------------------------------------------------------


class TxnClient:
    """A client's transactions, one at a time, on random vchannels (see the module doc)."""

    def __init__(
        self, world: World, client: str, router: Router, vchannels: dict[str, str]
    ) -> None:
        self.world = world
        self.client = client
        self.router = router
        #: vchannel -> pchannel
        self.vchannels = vchannels
        self.serial = 0
        self.context = ClientContext(client)
        self.producer_id = f"{client}-txn"

    async def _call(self, pchannel: str, method: str, request: Any) -> Any:
        route = self.router.route(pchannel)
        if route is None:
            raise CallLost("no route")
        context = self.context
        try:
            return await call(
                self.world,
                self.client,
                route[0],
                lambda servicer: getattr(servicer, method)(request, context),
                1.0,
            )
        except CallFailed as error:
            self.router.hint(pchannel, error.info)
            raise

    async def run(self) -> None:
        world = self.world
        rng = world.rng
        while not world.clients_stopping:
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            if world.clients_stopping:
                return
            vchannel = rng.choice(sorted(self.vchannels))
            await self._one(vchannel, self.vchannels[vchannel])

    async def _one(self, vchannel: str, pchannel: str) -> None:
        world = self.world
        rng = world.rng
        try:
            begun = await self._call(
                pchannel,
                "BeginTxn",
                wire.BeginTxnRequest(
                    vchannel=vchannel, keepalive_ms=3000, producer_id=self.producer_id
                ),
            )
        except (CallLost, CallFailed):
            return
        txn_id = begun.txn_id
        payloads: list[bytes] = []
        for _ in range(rng.randint(1, 3)):
            self.serial += 1
            payload = f"{self.client}:txn:{self.serial}".encode() + world.padding()
            try:
                await self._call(
                    pchannel,
                    "AppendTxn",
                    wire.AppendTxnRequest(
                        vchannel=vchannel,
                        txn_id=txn_id,
                        producer_id=self.producer_id,
                        messages=[wire.Message(vchannel=vchannel, payload=payload)],
                    ),
                )
            except (CallLost, CallFailed):
                world.history.txn_abandoned(txn_id, payloads + [payload])
                return
            payloads.append(payload)
        if rng.random() < 0.2:
            with contextlib.suppress(CallLost, CallFailed):
                await self._call(
                    pchannel,
                    "RollbackTxn",
                    wire.RollbackTxnRequest(
                        vchannel=vchannel, txn_id=txn_id, producer_id=self.producer_id
                    ),
                )
            world.history.txn_abandoned(txn_id, payloads)
            return
        route = self.router.route(pchannel)
        if route is not None:
            world.power_cut_at_commit(pchannel, route[0])
        deadline = world.clock.now + 3.0
        while world.clock.now < deadline:
            try:
                answer = await self._call(
                    pchannel,
                    "CommitTxn",
                    wire.CommitTxnRequest(
                        vchannel=vchannel, txn_id=txn_id, producer_id=self.producer_id
                    ),
                )
            except CallLost:
                await asyncio.sleep(rng.uniform(0.05, 0.2))
                continue
            except CallFailed as error:
                if error.info.code in RETRYABLE:
                    await asyncio.sleep(rng.uniform(0.05, 0.2))
                    continue
                break  # expired, unknown: the outcome is unknown
            positions = [(p.lsn, p.time_tick) for p in answer.positions]
            world.history.txn_committed(self.client, pchannel, txn_id, payloads, positions)
            return
        world.history.txn_unknown(txn_id, payloads)


# -- consumers ---------------------------------------------------------------------------------------


class Consumer:
    """Reads one pchannel with the real Consume stream, from its owner or a replica."""

    def __init__(self, world: World, client: str, router: Router, pchannel: str) -> None:
        self.world = world
        self.client = client
        self.router = router
        self.pchannel = pchannel
        self.next_lsn = 1
        self.context = ClientContext(client)

    async def run(self) -> None:
        world = self.world
        rng = world.rng
        while not world.clients_stopping:
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            route = self.router.route(self.pchannel)
            channel = world.state.pchannels[self.pchannel]
            from_replica = rng.random() < 0.5
            if from_replica:
                node_id = rng.choice(sorted(channel.replica_node_ids) or sorted(world.nodes))
            elif route is not None:
                node_id = route[0]
            else:
                continue
            node = world.nodes[node_id]
            if (
                not node.running
                or node.streaming is None
                or not world.link_up(self.client, node_id)
            ):
                continue
            floor = world.state.manifests[self.pchannel].deleted_before_lsn
            self.next_lsn = max(self.next_lsn, floor)
            done = world.loop.create_future()
            task = node.spawn(self._stream(node_id, node.streaming, from_replica, done))
            task.add_done_callback(_retrieve)
            await asyncio.wait([task], timeout=rng.uniform(0.3, 1.5))
            if not task.done():
                task.cancel()

    async def _stream(self, node_id: str, servicer: Any, from_replica: bool, done: Any) -> None:
        world = self.world
        request = wire.ConsumeRequest(
            pchannel=self.pchannel,
            policy=wire.DELIVER_POLICY_START_FROM,
            lsn=self.next_lsn,
            include_control=True,
            from_replica=from_replica,
        )
        stream = servicer.Consume(request, self.context)
        try:
            async for reply in stream:
                if not world.link_up(self.client, node_id) or world.clients_stopping:
                    return
                if not isinstance(reply, wire.ConsumeResponse):
                    reply = wire.ConsumeResponse.FromString(consume_wire.serialize_prebuilt(reply))
                for entry in reply.entries:
                    if entry.lsn != self.next_lsn:
                        world.violation(
                            f"{self.pchannel}: a consumer reading from {node_id} from lsn "
                            f"{self.next_lsn} got lsn {entry.lsn}"
                        )
                        return
                    world.history.read(self.pchannel, node_id, entry)
                    self.next_lsn = entry.lsn + 1
        except CallFailed:
            return
        finally:
            await stream.aclose()


@dataclass
class ClientSet:
    routers: list[Router] = field(default_factory=list)
    lanes: list[ProducerLane] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
