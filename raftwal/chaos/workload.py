"""The chaos suite's workload and its history (``raftwal chaos``).

Lives here: ``History`` (every client operation as invoke -> ok | fail | unknown, with
times relative to the run's start) and the clients that fill it, all asyncio, all through
the Python SDK as an application would use it:

- ``ProducerClient``: one idempotent, batching SDK ``Producer`` sending unique payloads
  (``<producer>:<vchannel>:<n>|padding``) to random vchannels at a paced rate;
- ``ConsumerClient``: an SDK ``Consumer`` per vchannel, from the beginning, recording what
  it was delivered (the checker proves it saw only committed entries, in order, once);
- ``LockClient``: leases kept alive by the SDK's lease keeper, EXCLUSIVE locks taken, held
  a moment (sometimes longer than the ttl) and released, recording fencing tokens and how
  long the client believed it held each lock;
- ``BroadcastClient``: broadcasts to two vchannels under an EXCLUSIVE resource key with an
  idempotency key, waits until the coordinator appended them, then acks every vchannel;
- ``StatusSampler``: one ClusterStatus at a time, from each node in turn (terms, owners,
  the leader; the nemesis aims with the latest sample).

Outcomes: an answer is ``ok``; an error that means "not done" (INVALID_ARGUMENT,
RESOURCE_ACQUIRED, NOT_FOUND, ...) is ``fail``; anything else (retries exhausted, a
timeout, a connection lost) is ``unknown``: it may or may not have happened. Every loop is
bounded by the stop event and by time. This module must never assert anything about the
cluster (the checker does), nor retry a write under a new identity (request id,
producer sequence or idempotency key).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rpc.aio import wait_event
from rpc.client import CompactedError, CoordinatorClient, LeaseKeeper, RaftwalError
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from rpc.streaming_client import Consumer, StreamingClient

log = logging.getLogger(__name__)
E = errors_pb2

OK, FAIL, UNKNOWN, PENDING = "ok", "fail", "unknown", "pending"
# Error codes that mean the operation did not happen (and cannot happen later).
NOT_DONE_CODES = frozenset(
    {
        E.INVALID_ARGUMENT,
        E.CHANNEL_NOT_EXIST,
        E.RESOURCE_ACQUIRED,
        E.NOT_FOUND,
        E.ALREADY_EXISTS,
        E.IGNORED_OPERATION,
        # A read or a seek below the retention floor: refused, nothing changed.
        E.COMPACTED,
    }
)
LEASE_TTL_MS = 4000
LOCK_WAIT_MS = 1500
BROADCAST_LOCK_WAIT_MS = 2000
# How long a broadcaster waits for the coordinator to append one broadcast everywhere.
BROADCAST_APPEND_WAIT_S = 20.0
BROADCAST_POLL_S = 0.3
MAX_DRIVES = 3
STATUS_INTERVAL_S = 0.5
STATUS_TIMEOUT_S = 2.0
CANCEL_WAIT_S = 5.0
# A message not acknowledged within this long is given up (its outcome unknown): shorter
# than the longest faults, so that some are.
PRODUCE_RETRY_TIMEOUT_S = 12.0


def outcome_of(error: BaseException) -> str:
    if isinstance(error, RaftwalError) and error.code in NOT_DONE_CODES:
        return FAIL
    return UNKNOWN


def describe(error: BaseException) -> str:
    if isinstance(error, RaftwalError):
        name = E.ErrorCode.Name(error.code) if error.code in E.ErrorCode.values() else error.code
        return f"{name}: {str(error)[:200]}"
    return f"{type(error).__name__}: {str(error)[:200]}"


@dataclass(slots=True)
class Op:
    index: int
    process: str
    kind: str
    invoke_s: float
    value: dict[str, Any]
    outcome: str = PENDING
    complete_s: float = math.inf
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "process": self.process,
            "kind": self.kind,
            "invoke_s": round(self.invoke_s, 4),
            "complete_s": None if math.isinf(self.complete_s) else round(self.complete_s, 4),
            "outcome": self.outcome,
            "value": self.value,
            "result": self.result,
            "error": self.error,
        }


class History:
    """Operations in invocation order; times in seconds since `started` (monotonic)."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.ops: list[Op] = []

    def now(self) -> float:
        return time.monotonic() - self.started

    def invoke(self, process: str, kind: str, **value: Any) -> Op:
        op = Op(len(self.ops), process, kind, self.now(), value)
        self.ops.append(op)
        return op

    def ok(self, op: Op, **result: Any) -> Op:
        op.outcome, op.complete_s, op.result = OK, self.now(), result
        return op

    def failed(self, op: Op, error: BaseException) -> Op:
        op.outcome, op.complete_s, op.error = outcome_of(error), self.now(), describe(error)
        if op.outcome == UNKNOWN:
            # An unknown outcome took effect, if at all, no later than now: the checker
            # treats its completion time as "never" (infinity) on purpose.
            op.complete_s = math.inf
        return op

    def counts(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for op in self.ops:
            row = table.setdefault(op.kind, {})
            row[op.outcome] = row.get(op.outcome, 0) + 1
        return dict(sorted(table.items()))

    def write_jsonl(self, path: Path) -> None:
        with path.open("w") as out:
            for op in self.ops:
                out.write(json.dumps(op.as_json(), default=str) + "\n")


# ---------------------------------------------------------------------------------------
# Producers and consumers
# ---------------------------------------------------------------------------------------


def payload_key(payload: bytes) -> str:
    """The unique key at the front of a workload payload (`key|padding`)."""
    return payload.split(b"|", 1)[0].decode(errors="replace")


class ProducerClient:
    """Unique payloads to random vchannels at a paced rate through one SDK Producer; each
    message is one `produce` operation, `ok` with its (pchannel, lsn) once acknowledged."""

    def __init__(
        self,
        name: str,
        client: StreamingClient,
        vchannels: Sequence[str],
        history: History,
        rng: random.Random,
        rate_per_s: float,
        payload_bytes: int,
    ) -> None:
        self.name = name
        self.client = client
        self.vchannels = list(vchannels)
        self.history = history
        self.rng = rng
        self.interval_s = 1.0 / rate_per_s
        self.payload_bytes = payload_bytes
        self.sent = 0

    async def run(self, stop: asyncio.Event, drain_s: float) -> None:
        producer = self.client.producer(
            producer_id=f"chaos-{self.name}-{self.rng.randrange(1 << 30)}",
            linger_ms=5,
            max_in_flight=4,
            retry_timeout_s=PRODUCE_RETRY_TIMEOUT_S,
            attempt_timeout_s=5.0,
            max_pending_messages=2000,
        )
        try:
            next_at = time.monotonic()
            while not stop.is_set():
                vchannel = self.rng.choice(self.vchannels)
                key = f"{self.name}:{vchannel}:{self.sent}"
                self.sent += 1
                payload = key.encode() + b"|" + b"x" * max(0, self.payload_bytes - len(key) - 1)
                op = self.history.invoke(self.name, "produce", vchannel=vchannel, key=key)
                try:
                    future = await asyncio.wait_for(producer.submit(vchannel, payload), 30.0)
                except (RaftwalError, TimeoutError, RuntimeError) as error:
                    self.history.failed(op, error)
                else:
                    future.add_done_callback(lambda f, op=op: self._record(op, f))
                next_at += self.interval_s
                delay = next_at - time.monotonic()
                if delay > 0:
                    await wait_event(stop, delay)
                else:
                    next_at = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(producer.flush(), drain_s)
        finally:
            await producer.close(timeout_s=2.0)

    def _record(self, op: Op, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            op.outcome, op.error = UNKNOWN, "cancelled"
            return
        error = future.exception()
        if error is not None:
            self.history.failed(op, error)
            return
        position = future.result()
        self.history.ok(op, pchannel=position.pchannel, lsn=position.lsn)


@dataclass
class Delivery:
    lsn: int
    key: str
    broadcast_id: int


class ConsumerClient:
    """Follows one vchannel from its first entry until stopped; `restarts` counts the
    times the SDK consumer gave up and a new one resumed after the last delivered LSN."""

    def __init__(self, client: StreamingClient, vchannel: str) -> None:
        self.client = client
        self.vchannel = vchannel
        self.delivered: list[Delivery] = []
        self.restarts = 0
        self.errors: list[str] = []
        #: times retention overtook it (COMPACTED): it went on at the first entry kept
        self.skips = 0
        self._resume_after: int | None = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.restarts < 1000:
            last = self.delivered[-1].lsn if self.delivered else None
            if self._resume_after is not None and (last is None or last < self._resume_after):
                last = self._resume_after
            consumer = Consumer(self.client, self.vchannel, start_after=last, retry_timeout_s=60.0)
            stopper = asyncio.create_task(self._close_on(stop, consumer))
            try:
                async for entry in consumer:
                    self.delivered.append(
                        Delivery(entry.lsn, payload_key(entry.payload), entry.broadcast_id)
                    )
            except CompactedError as error:
                # A plain consumer holds nothing: retention may pass it (a subscription
                # would hold it). Go on at the first entry kept, as an application would.
                self.skips += 1
                self._resume_after = max(0, error.info.first_available - 1)
            except RaftwalError as error:
                self.restarts += 1
                self.errors.append(describe(error))
                await wait_event(stop, 0.5)
            finally:
                stopper.cancel()
                await consumer.close()

    @staticmethod
    async def _close_on(stop: asyncio.Event, consumer: Consumer) -> None:
        await stop.wait()
        await consumer.close()


# ---------------------------------------------------------------------------------------
# Locks and broadcasts
# ---------------------------------------------------------------------------------------


class LockClient:
    """Takes EXCLUSIVE locks on a few shared keys under its own lease, kept alive by the
    SDK's ``lease_keeper`` as an application would keep it, holds each lock for a moment
    (one hold in five lasts longer than the lease's ttl, so that the keeper has to renew
    through the faults), and releases it.

    It stops using a lock as soon as its keeper no longer vouches for the lease: the keeper
    reports the lease lost (``wait_lost()`` fires) or its believed deadline passes. Each
    hold is recorded as a ``hold`` operation from the lock's acknowledgement to the moment
    the client stopped believing it held the lock (its release, or the keeper's verdict:
    the time it gave up or the deadline it believed, whichever came first), so that the
    checker can prove no client kept believing while another client had the lock."""

    def __init__(
        self,
        name: str,
        client: CoordinatorClient,
        keys: Sequence[str],
        history: History,
        rng: random.Random,
    ) -> None:
        self.name = name
        self.client = client
        self.keys = list(keys)
        self.history = history
        self.rng = rng
        self.lease_id = 0

    async def _grant(self) -> int:
        op = self.history.invoke(self.name, "grant_lease", ttl_ms=LEASE_TTL_MS)
        try:
            response = await self.client.grant_lease(LEASE_TTL_MS, holder=self.name)
        except RaftwalError as error:
            self.history.failed(op, error)
            return 0
        self.history.ok(op, lease=response.lease_id)
        return int(response.lease_id)

    async def _revoke(self, lease_id: int) -> None:
        op = self.history.invoke(self.name, "revoke_lease", lease=lease_id)
        try:
            await self.client.revoke_lease(lease_id)
        except RaftwalError as error:
            self.history.failed(op, error)
        else:
            self.history.ok(op)

    async def _keep(self, lease_id: int) -> LeaseKeeper | None:
        keeper = self.client.lease_keeper(lease_id)
        try:
            await keeper.start()
        except RaftwalError as error:
            log.debug("%s: lease %d could not be kept: %s", self.name, lease_id, error)
            return None
        return keeper

    async def run(self, stop: asyncio.Event) -> None:
        lease_id, keeper = 0, None
        try:
            while not stop.is_set():
                if keeper is None or not keeper.alive:
                    # Lost, or not vouched for any more: give it up and start afresh.
                    if keeper is not None:
                        await keeper.stop()
                        keeper = None
                    if lease_id:
                        await self._revoke(lease_id)
                    lease_id = await self._grant()
                    keeper = await self._keep(lease_id) if lease_id else None
                    if keeper is None:
                        await asyncio.sleep(0.5)
                        continue
                if await self._one_hold(lease_id, keeper):
                    # The lease was revoked or is gone: the next round takes a new one.
                    await keeper.stop()
                    keeper, lease_id = None, 0
                await wait_event(stop, self.rng.uniform(0.0, 0.3))
        finally:
            if keeper is not None:
                await keeper.stop()
            if lease_id:
                await self._revoke(lease_id)

    def _hold_s(self) -> float:
        if self.rng.random() < 0.2:
            return self.rng.uniform(1.0, 2.5) * LEASE_TTL_MS / 1000
        return self.rng.uniform(0.05, 0.4)

    async def _hold(self, keeper: LeaseKeeper, hold_s: float) -> tuple[float, str]:
        """Use the lock for `hold_s` unless the keeper stops vouching for the lease first;
        (when belief ended, on the history's clock; why)."""
        until = time.monotonic() + hold_s
        while True:
            now = time.monotonic()
            if keeper.lost_error is not None:
                lost_at = keeper.lost_at if keeper.lost_at is not None else now
                ended = min(now, lost_at, keeper.believed_until)
                return ended - self.history.started, "lost"
            if not keeper.alive:
                return min(now, keeper.believed_until) - self.history.started, "expired"
            if now >= until:
                return now - self.history.started, "released"
            await keeper.wait_lost(min(until - now, keeper.remaining_s))

    async def _one_hold(self, lease_id: int, keeper: LeaseKeeper) -> bool:
        """One lock, hold and release; True when the lease is gone or was given up."""
        key = self.rng.choice(self.keys)
        lock = self.history.invoke(self.name, "lock", key=key, lease=lease_id)
        try:
            response = await self.client.lock(key, lease_id, "exclusive", LOCK_WAIT_MS)
        except RaftwalError as error:
            self.history.failed(lock, error)
            if error.code == E.NOT_FOUND:
                return True
            if lock.outcome == FAIL:
                return False
        else:
            self.history.ok(lock, token=response.fencing_token, revision=response.revision)
            hold = self.history.invoke(self.name, "hold", key=key, lease=lease_id, lock=lock.index)
            hold.invoke_s = lock.complete_s
            ended_s, reason = await self._hold(keeper, self._hold_s())
            self.history.ok(hold, reason=reason)
            hold.complete_s = max(hold.invoke_s, ended_s)
        # Release after a hold, and after an unknown lock too (it may have been taken).
        unlock = self.history.invoke(self.name, "unlock", key=key, lease=lease_id, lock=lock.index)
        try:
            response = await self.client.unlock(key, lease_id)
        except RaftwalError as error:
            self.history.failed(unlock, error)
            if error.code == E.NOT_FOUND:
                return True
            if unlock.outcome == UNKNOWN:
                # The key may still be ours: give the lease up so that the hold ends.
                await self._revoke(lease_id)
                return True
        else:
            self.history.ok(unlock, revision=response.revision)
        return False


@dataclass
class BroadcastJob:
    """One logical broadcast (its idempotency key), across the ops that drive it."""

    idempotency_key: str
    message: bytes
    vchannels: list[str]
    key: str
    created_op: int = -1
    broadcast_id: int = 0
    appended: dict[str, int] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)
    #: drive() calls so far; the run loop gives a stuck job up to `finish()`
    drives: int = 0

    @property
    def complete(self) -> bool:
        return self.broadcast_id > 0 and self.acked >= set(self.vchannels)


class BroadcastClient:
    """Broadcasts one message at a time (see module doc); an unfinished job is finished
    before the next one starts, and `finish()` drains the rest after the run."""

    def __init__(
        self,
        name: str,
        client: CoordinatorClient,
        vchannels: Sequence[str],
        keys: Sequence[str],
        run_tag: str,
        history: History,
        rng: random.Random,
    ) -> None:
        self.name = name
        self.client = client
        self.vchannels = list(vchannels)
        self.keys = list(keys)
        self.run_tag = run_tag
        self.history = history
        self.rng = rng
        self.jobs: list[BroadcastJob] = []

    async def _broadcast(self, job: BroadcastJob, kind: str, wait_ms: int) -> bool:
        """One Broadcast call for `job` (the first, or a repeat that learns its id and
        positions through the idempotency key). True when it answered."""
        op = self.history.invoke(
            self.name,
            kind,
            idempotency_key=job.idempotency_key,
            key=job.key,
            vchannels=job.vchannels,
            message=job.message.decode(),
        )
        try:
            response = await self.client.broadcast(
                job.message,
                job.vchannels,
                [(job.key, "exclusive")],
                idempotency_key=job.idempotency_key,
                lock_timeout_ms=wait_ms,
            )
        except RaftwalError as error:
            self.history.failed(op, error)
            return False
        appended = {v.vchannel: v.appended_lsn for v in response.vchannels if v.appended}
        self.history.ok(op, broadcast_id=response.broadcast_id, appended=appended)
        job.broadcast_id = int(response.broadcast_id)
        if job.created_op < 0:
            job.created_op = op.index
        job.appended.update(appended)
        return True

    async def _ack(self, job: BroadcastJob, vchannel: str) -> None:
        op = self.history.invoke(
            self.name,
            "ack",
            idempotency_key=job.idempotency_key,
            broadcast_id=job.broadcast_id,
            vchannel=vchannel,
            checkpoint=job.appended[vchannel],
        )
        try:
            await self.client.ack(job.broadcast_id, vchannel, job.appended[vchannel])
        except RaftwalError as error:
            self.history.failed(op, error)
        else:
            self.history.ok(op)
            job.acked.add(vchannel)

    async def drive(self, job: BroadcastJob, budget_s: float) -> None:
        """Learn the job's id if unknown, wait for its appends, ack them (bounded)."""
        job.drives += 1
        deadline = time.monotonic() + budget_s
        attempts = 0
        while not job.complete and time.monotonic() < deadline and attempts < 200:
            attempts += 1
            missing = [v for v in job.vchannels if v not in job.appended]
            if job.broadcast_id == 0 or missing:
                # The first time this creates the broadcast when the key is free; later
                # it only reads the task back (same idempotency key).
                answered = await self._broadcast(job, "broadcast_poll", 0)
                if not answered or [v for v in job.vchannels if v not in job.appended]:
                    await asyncio.sleep(BROADCAST_POLL_S)
                    continue
            for vchannel in job.vchannels:
                if vchannel not in job.acked:
                    await self._ack(job, vchannel)

    async def run(self, stop: asyncio.Event) -> None:
        count = 0
        while not stop.is_set():
            # An unfinished job holds its key: finish it first (a few tries; the rest
            # is left to finish()).
            pending = [j for j in self.jobs if not j.complete and j.drives < MAX_DRIVES]
            for job in pending:
                await self.drive(job, BROADCAST_APPEND_WAIT_S)
            if [j for j in self.jobs if not j.complete and j.drives < MAX_DRIVES]:
                await wait_event(stop, 1.0)
                continue
            count += 1
            job = BroadcastJob(
                idempotency_key=f"{self.run_tag}-{self.name}-{count}",
                message=f"bc:{self.name}:{count}".encode(),
                vchannels=self.rng.sample(self.vchannels, 2),
                key=self.rng.choice(self.keys),
            )
            answered = await self._broadcast(job, "broadcast", BROADCAST_LOCK_WAIT_MS)
            last = self.history.ops[-1]
            if answered or last.outcome == UNKNOWN:
                self.jobs.append(job)
                await self.drive(job, BROADCAST_APPEND_WAIT_S)
            await wait_event(stop, self.rng.uniform(0.1, 0.5))

    async def finish(self, budget_s: float) -> None:
        deadline = time.monotonic() + budget_s
        for job in self.jobs:
            if not job.complete:
                await self.drive(job, max(1.0, deadline - time.monotonic()))


# ---------------------------------------------------------------------------------------
# Cluster status sampling
# ---------------------------------------------------------------------------------------


@dataclass
class StatusSample:
    at_s: float
    endpoint: str
    revision: int
    leader: str
    #: pchannel -> (term, owner node id, state)
    pchannels: dict[str, tuple[int, str, int]]
    #: node id -> raft term, for the members that answered
    raft_terms: dict[str, int]
    #: node id -> gRPC address
    addresses: dict[str, str]
    #: pchannel -> its replica set, sorted
    replica_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)


class StatusSampler:
    """One serializable ClusterStatus at a time, from each endpoint in turn (so samples
    are totally ordered in time)."""

    def __init__(self, endpoints: Sequence[str], history: History) -> None:
        self.endpoints = list(endpoints)
        self.history = history
        self.samples: list[StatusSample] = []
        self.failures = 0
        self._channels = {e: grpc.aio.insecure_channel(e) for e in self.endpoints}
        self._turn = 0
        # The nemesis samples too: one call at a time keeps the samples ordered in time.
        self._one_at_a_time = asyncio.Lock()

    @property
    def latest(self) -> StatusSample | None:
        return self.samples[-1] if self.samples else None

    async def sample(self) -> StatusSample | None:
        async with self._one_at_a_time:
            return await self._sample()

    async def _sample(self) -> StatusSample | None:
        for _ in range(len(self.endpoints)):
            endpoint = self.endpoints[self._turn % len(self.endpoints)]
            self._turn += 1
            stub = coordinator_pb2_grpc.CoordinatorStub(self._channels[endpoint])
            try:
                status = await stub.ClusterStatus(
                    api.ClusterStatusRequest(consistency=api.CONSISTENCY_SERIALIZABLE),
                    timeout=STATUS_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError:
                self.failures += 1
                continue
            sample = StatusSample(
                at_s=self.history.now(),
                endpoint=endpoint,
                revision=status.revision,
                leader=status.leader_node_id,
                pchannels={p.name: (p.term, p.owner_node_id, p.state) for p in status.pchannels},
                raft_terms={m.node_id: m.raft_term for m in status.members if m.reachable},
                addresses={n.node_id: n.address for n in status.nodes},
                replica_sets={p.name: tuple(sorted(p.replica_node_ids)) for p in status.pchannels},
            )
            self.samples.append(sample)
            return sample
        return None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample()
            await wait_event(stop, STATUS_INTERVAL_S)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


async def gather_bounded(
    tasks: Sequence[asyncio.Task[Any]], timeout_s: float, on_problem: Callable[[str], None]
) -> None:
    """Wait for `tasks` up to `timeout_s`, then cancel what is left (and wait a little
    more); report (by name) what had to be cancelled, did not stop, or failed."""
    if not tasks:
        return
    _, running = await asyncio.wait(tasks, timeout=timeout_s)
    for task in running:
        on_problem(f"{task.get_name()} timed out")
        task.cancel()
    if running:
        await asyncio.wait(running, timeout=CANCEL_WAIT_S)
    for task in tasks:
        if not task.done():
            on_problem(f"{task.get_name()} did not stop when cancelled")
        elif not task.cancelled() and task.exception() is not None:
            log.error("workload task %s failed: %r", task.get_name(), task.exception())
            on_problem(f"{task.get_name()} failed: {task.exception()!r}")
