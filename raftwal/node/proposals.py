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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rpc.protos import coordination_pb2 as pb

log = logging.getLogger(__name__)

ProposeEntry = Callable[[bytes], Awaitable[bytes]]


@dataclass
class _Waiting:
    command: bytes
    future: asyncio.Future[bytes]


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
        self._queue: list[_Waiting] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.entries = 0
        self.commands = 0

    async def propose(self, command: bytes) -> bytes:
        """Replicate one serialized Command; returns its serialized CommandResult."""
        if len(self._queue) >= self._max_queued:
            raise OverflowError(f"too many queued proposals ({len(self._queue)})")
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(command, future))
        self._maybe_send()
        return await future

    def _maybe_send(self) -> None:
        while self._queue and self._in_flight < self._max_in_flight:
            batch: list[_Waiting] = []
            size = 0
            while self._queue and len(batch) < self._max_batch_commands:
                waiting = self._queue[0]
                if batch and size + len(waiting.command) > self._max_batch_bytes:
                    break
                batch.append(self._queue.pop(0))
                size += len(waiting.command)
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            if len(batch) == 1:
                entry = pb.LogEntry(command=batch[0].command)
            else:
                entry = pb.LogEntry(batch=pb.CommandBatch(commands=[w.command for w in batch]))
            self.entries += 1
            self.commands += len(batch)
            try:
                reply = await self._propose_entry(entry.SerializeToString())
            except Exception as error:  # noqa: BLE001 (re-raised to every caller of the entry)
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(error)
                return
            results = pb.LogEntryResult.FromString(reply).results
            if len(results) != len(batch):
                raise AssertionError(
                    f"log entry of {len(batch)} commands answered with {len(results)} results"
                )
            for waiting, result in zip(batch, results, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(result)
        finally:
            self._in_flight -= 1
            self._maybe_send()
