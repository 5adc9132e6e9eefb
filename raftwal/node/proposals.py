"""Proposal batching: many concurrent proposals, one Raft log entry.

Every Raft entry costs the same fixed work however small it is (pysyncobj's pickling and
bookkeeping, a journal record, a future and a hand-off between the tick thread and the
event loop). ``ProposalBatcher`` sends a proposal at once when the pipeline is idle, and
while ``max_in_flight`` entries are already on their way it gathers the proposals that
arrive into the next entry (up to ``max_batch_commands`` commands or
``max_batch_bytes``): latency stays one round trip when idle, and under load each entry
serves many clients (group commit one level up).

Errors of the underlying proposal (not leader, unknown outcome, ...) fail every command of
that entry; each caller retries on its own (with its request id, so nothing applies
twice).

``propose_group`` submits the commands of one client batch (``Coordinator.BatchWrite``)
as a unit: they are never split across entries (a group larger than the entry bounds is an
entry of its own), so a batch is one Raft entry applied in order.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rpc.protos import coordination_pb2 as pb

log = logging.getLogger(__name__)

ProposeEntry = Callable[[bytes], Awaitable[bytes]]


@dataclass
class _Waiting:
    commands: list[bytes]
    size: int
    future: asyncio.Future[list[bytes]]


class ProposalBatcher:
    def __init__(
        self,
        propose_entry: ProposeEntry,
        *,
        max_in_flight: int = 1,
        max_batch_commands: int = 512,
        max_batch_bytes: int = 1024 * 1024,
        max_queued: int = 20_000,
    ) -> None:
        self._propose_entry = propose_entry
        self._max_in_flight = max_in_flight
        self._max_batch_commands = max_batch_commands
        self._max_batch_bytes = max_batch_bytes
        self._max_queued = max_queued
        self._queue: collections.deque[_Waiting] = collections.deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.entries = 0
        self.commands = 0

    async def propose(self, command: bytes) -> bytes:
        """Replicate one serialized Command; returns its serialized CommandResult."""
        return (await self.propose_group([command]))[0]

    async def propose_group(self, commands: list[bytes]) -> list[bytes]:
        """Replicate serialized Commands in one Raft entry, applied in this order; returns
        their serialized CommandResults in the same order."""
        if not commands:
            return []
        if len(self._queue) >= self._max_queued:
            raise OverflowError(f"too many queued proposals ({len(self._queue)})")
        future: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(commands, sum(len(c) for c in commands), future))
        self._maybe_send()
        return await future

    def _maybe_send(self) -> None:
        while self._queue and self._in_flight < self._max_in_flight:
            batch: list[_Waiting] = []
            size = 0
            count = 0
            while self._queue:
                waiting = self._queue[0]
                if batch and (
                    size + waiting.size > self._max_batch_bytes
                    or count + len(waiting.commands) > self._max_batch_commands
                ):
                    break
                batch.append(self._queue.popleft())
                size += waiting.size
                count += len(waiting.commands)
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            commands = [command for waiting in batch for command in waiting.commands]
            if len(commands) == 1:
                entry = pb.LogEntry(command=commands[0])
            else:
                entry = pb.LogEntry(batch=pb.CommandBatch(commands=commands))
            self.entries += 1
            self.commands += len(commands)
            try:
                reply = await self._propose_entry(entry.SerializeToString())
            except Exception as error:  # noqa: BLE001 (re-raised to every caller of the entry)
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(error)
                return
            results = list(pb.LogEntryResult.FromString(reply).results)
            if len(results) != len(commands):
                raise AssertionError(
                    f"log entry of {len(commands)} commands answered with {len(results)} results"
                )
            start = 0
            for waiting in batch:
                end = start + len(waiting.commands)
                if not waiting.future.done():
                    waiting.future.set_result(results[start:end])
                start = end
        finally:
            self._in_flight -= 1
            self._maybe_send()
