"""A producer's batches at one `ChannelOwner` (three real `PChannelLog`s, fsync on, the
loopback replicas of `test_wal_owner_recovery`), while writers wait for room: the owner
bounds uncommitted bytes, and a writer over the bound waits for the commit point to move.

Two things must hold however those waits end:
- a retry of a batch that raced its first attempt (both came before either was written)
  is answered as a duplicate, never written a second time. Both used to be written: the
  producer's duplicate check ran before the wait, outside the write lock. Besides the
  duplicate itself, each extra copy took a place in the owner's window of a producer's
  last 8 batches, so an earlier batch still unacknowledged fell out of it, and its next
  resend was refused as "older than the retained window": a write the producer lost
  although it had only ever been told it was pending (seen in
  `test_owner_lost_during_produce_loses_and_repeats_nothing[kill -9]`);
- a batch that came later never overtakes one waiting for room: a producer's pipelined
  batches reach the log in sequence order."""

from __future__ import annotations

import asyncio

import pytest

from tests.timing import scaled
from tests.wal.test_wal_owner_recovery import NODES, PCHANNEL, Loopback, _open_logs, _Stream
from wal_segments.format import MsgType
from wal_segments.log import PChannelLog
from wal_segments.owner import PRODUCER_SEQ_PROPERTY, ChannelOwner, Message, OwnerConfig

TIMEOUT_S = scaled(20.0)


class _GatedStream(_Stream):
    """An Append stream whose replica applies nothing while the gate is closed."""

    def __init__(self, log: PChannelLog, gate: asyncio.Event) -> None:
        super().__init__(log)
        self._gate = gate

    async def write(self, request) -> None:  # type: ignore[no-untyped-def]
        await self._gate.wait()
        await super().write(request)


class _GatedLoopback(Loopback):
    def __init__(self, logs: dict[str, PChannelLog], gate: asyncio.Event) -> None:
        super().__init__(logs)
        self.gate = gate

    def open_append(self, node_id: str) -> _Stream:
        return _GatedStream(self._reach(node_id), self.gate)


@pytest.fixture
async def logs(tmp_path):
    async for opened in _open_logs(tmp_path, NODES):
        yield opened


async def _owner(logs: dict[str, PChannelLog]) -> tuple[ChannelOwner, asyncio.Event]:
    gate = asyncio.Event()
    gate.set()
    transport = _GatedLoopback(logs, gate)
    owner = ChannelOwner(
        pchannel=PCHANNEL,
        term=1,
        node_id="n1",
        replica_node_ids=["n2", "n3"],
        log=logs["n1"],
        transport=transport,
        proposer=transport,
        # Any uncommitted byte is over the bound: a second writer waits for room.
        config=OwnerConfig(
            retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0, max_uncommitted_bytes=1
        ),
    )
    owner.start()
    await asyncio.wait_for(owner.ready.wait(), TIMEOUT_S)
    return owner, gate


def _batch(seq: int) -> list[Message]:
    return [Message(1, int(MsgType.MESSAGE), payload=b"s%d-%d" % (seq, i)) for i in range(3)]


def _written_sequences(log: PChannelLog) -> list[int]:
    """The producer sequences in the log, in log order (one per batch)."""
    return [
        int(entry.properties[PRODUCER_SEQ_PROPERTY])
        for entry in log.iter_entries(log.first_lsn, log.last_lsn)
        if PRODUCER_SEQ_PROPERTY in (entry.properties or {})
    ]


async def _until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def test_a_retry_racing_its_first_attempt_is_written_once(logs) -> None:
    owner, gate = await _owner(logs)
    try:
        gate.clear()
        first = asyncio.create_task(owner.write(_batch(1), producer_id="p", sequence=1))
        await _until(lambda: _written_sequences(owner.log) == [1], "batch 1 appended")
        # Batch 2 and its retry both come while batch 1 is uncommitted: both wait for room.
        attempt = asyncio.create_task(owner.write(_batch(2), producer_id="p", sequence=2))
        await asyncio.sleep(0.05)
        retry = asyncio.create_task(owner.write(_batch(2), producer_id="p", sequence=2))
        await asyncio.sleep(0.05)
        gate.set()
        done = await asyncio.wait_for(asyncio.gather(first, attempt, retry), TIMEOUT_S)
        (_, dup1), (positions_a, dup_a), (positions_b, dup_b) = done
        assert not dup1
        assert _written_sequences(owner.log) == [1, 2], "batch 2 written once"
        assert (dup_a, dup_b) == (False, True)
        assert positions_a == positions_b
    finally:
        await owner.close()


async def test_a_later_batch_never_overtakes_one_waiting_for_room(logs) -> None:
    owner, gate = await _owner(logs)
    late: list[asyncio.Task] = []
    try:
        gate.clear()
        first = asyncio.create_task(owner.write(_batch(1), producer_id="p", sequence=1))
        await _until(lambda: _written_sequences(owner.log) == [1], "batch 1 appended")
        waiting = asyncio.create_task(owner.write(_batch(2), producer_id="p", sequence=2))
        await asyncio.sleep(0.05)
        assert not waiting.done()

        # Batch 3 comes the moment batch 1 commits (room frees up), before batch 2's
        # waiter has run again: the pipelined producer's next request, on the same stream.
        notify = owner._notify_progress

        def notify_then_send() -> None:
            notify()
            if not late and owner.committed_lsn >= owner.log.last_lsn:
                late.append(
                    asyncio.create_task(owner.write(_batch(3), producer_id="p", sequence=3))
                )

        owner._notify_progress = notify_then_send  # type: ignore[method-assign]
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, waiting), TIMEOUT_S)
        await _until(lambda: bool(late), "batch 3 sent")
        await asyncio.wait_for(late[0], TIMEOUT_S)
        assert _written_sequences(owner.log) == [1, 2, 3]
    finally:
        for task in late:
            task.cancel()
        await owner.close()
