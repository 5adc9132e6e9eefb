"""The cross-cluster replicator's pipeline (raftwal/node/replicator.py), without clusters:
a log of real WAL frames, a Produce stream whose answers the test gives, in any order.

- several batches go out before the first answer, each continuing the one before it
  (previous_sequence = the previous batch's sequence), within the window's bounds;
- the checkpoint moves only over a prefix the target acknowledged, whatever order the
  answers come in; a failed answer stops the pipeline and the checkpoint is read again;
- the status measures the lag in entries, bytes and seconds, and says in one line when
  the backlog grows.

The end-to-end behaviour (kills mid-pipeline on both sides, exactly once) is
tests/chaos/test_chaos_replicate.py's."""

from __future__ import annotations

import asyncio
import time

import pytest

from raftwal.node import replicator as r
from raftwal.services.backend import DataViewSnapshot
from rpc.errors import RaftwalError
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2 as E
from rpc.protos import streaming_pb2 as wire
from wal_segments.format import Entry, MsgType, encode_batch
from wal_segments.owner import TICK_LOGICAL_BITS

PAYLOAD = b"x" * 1000


class _Log:
    # Nothing deleted by retention (a replicator checks it holds what it sends next).
    first_lsn = 1

    def __init__(self, count: int, old_s: float = 0.0) -> None:
        wall_ms = int((time.time() - old_s) * 1000)
        self.frames = [
            encode_batch(
                [
                    Entry(
                        lsn=lsn,
                        term=1,
                        time_tick=(wall_ms << TICK_LOGICAL_BITS) + lsn,
                        msg_type=int(MsgType.MESSAGE),
                        vchannel_id=1,
                        key=f"k{lsn}".encode(),
                        payload=PAYLOAD,
                    )
                ]
            ).data
            for lsn in range(1, count + 1)
        ]

    @property
    def last_lsn(self) -> int:
        return len(self.frames)

    def read_frames(self, from_lsn: int, max_bytes: int, to_lsn: int | None = None) -> bytes:
        out, size = [], 0
        for lsn in range(from_lsn, min(to_lsn or self.last_lsn, self.last_lsn) + 1):
            frame = self.frames[lsn - 1]
            if out and size + len(frame) > max_bytes:
                break
            out.append(frame)
            size += len(frame)
        return b"".join(out)

    def bytes_between(self, from_lsn: int, to_lsn: int) -> int:
        return sum(len(f) for f in self.frames[from_lsn - 1 : to_lsn])


class _Owner:
    serving = True
    term = 1

    def __init__(self, log: _Log) -> None:
        self.log = log
        self.committed_lsn = log.last_lsn

    async def wait_commit_change(self, timeout_s: float) -> None:
        await asyncio.sleep(min(timeout_s, 0.001))


class _Stream:
    """Produce stream stand-in: every request is kept with its future, answered by the
    test."""

    address = "target:1"
    failure = None

    def __init__(self) -> None:
        self.sent: list[tuple[wire.ProduceRequest, asyncio.Future[wire.ProduceResult]]] = []

    def submit(self, request: wire.ProduceRequest) -> asyncio.Future[wire.ProduceResult]:
        future: asyncio.Future[wire.ProduceResult] = asyncio.get_running_loop().create_future()
        self.sent.append((request, future))
        return future


class _Host:
    cluster_id = "east"

    def view(self) -> DataViewSnapshot:
        view = DataViewSnapshot()
        view.vchannel_names[1] = "v"
        return view

    def replicate_configuration(self) -> pb.ReplicateConfiguration:
        return pb.ReplicateConfiguration()


def _replicator(checkpoint: int = 0) -> r._Replicator:
    edge = r._Edge("p", 1, pb.ReplicateCluster(cluster_id="west", endpoints=["x:1"]), "p")
    replicator = r._Replicator(_Host(), edge)  # type: ignore[arg-type]
    replicator.checkpoint = checkpoint
    replicator.scanned = replicator.confirmed = checkpoint
    replicator.target_vchannels = {"v"}
    return replicator


def _ok(request: wire.ProduceRequest) -> wire.ProduceResult:
    return wire.ProduceResult(term=1, first_lsn=request.sequence)


async def test_batches_are_pipelined_and_chained() -> None:
    log = _Log(12000)
    replicator, stream = _replicator(), _Stream()
    await replicator._fill(None, stream, _Owner(log))  # type: ignore[arg-type]
    requests = [request for request, _ in stream.sent]
    # Several batches before any answer, within the window's bounds.
    assert len(requests) >= 2, len(requests)
    assert len(requests) <= r.MAX_INFLIGHT_BATCHES
    assert replicator.inflight_bytes <= r.MAX_INFLIGHT_BYTES + r.MAX_BATCH_BYTES
    previous = 0
    for request in requests:
        assert request.previous_sequence == previous
        assert list(request.replicate_source.lsns) == list(
            range(previous + 1, request.sequence + 1)
        )
        assert request.messages[0].key == f"k{previous + 1}".encode()
        assert request.messages[0].payload == PAYLOAD
        previous = request.sequence
    assert replicator.scanned == previous
    # Nothing acknowledged yet: the checkpoint has not moved.
    assert (replicator.checkpoint, replicator.confirmed) == (0, 0)


async def test_the_checkpoint_moves_only_over_an_acknowledged_prefix() -> None:
    log = _Log(12000)
    replicator, stream = _replicator(), _Stream()
    await replicator._fill(None, stream, _Owner(log))  # type: ignore[arg-type]
    assert len(stream.sent) >= 3
    (first, f1), (second, f2), (third, f3) = stream.sent[:3]
    # The second and third answers come first: the first batch may still fail.
    f2.set_result(_ok(second))
    f3.set_result(_ok(third))
    replicator._settle()
    assert (replicator.checkpoint, replicator.confirmed) == (0, 0)
    f1.set_result(_ok(first))
    replicator._settle()
    assert replicator.checkpoint == third.sequence == replicator.confirmed
    assert replicator.applied_entries == third.sequence


async def test_a_failed_batch_stops_the_pipeline_and_the_checkpoint_is_read_again() -> None:
    log = _Log(12000)
    replicator, stream = _replicator(), _Stream()
    await replicator._fill(None, stream, _Owner(log))  # type: ignore[arg-type]
    (first, f1), (second, f2) = stream.sent[:2]
    f1.set_result(_ok(first))
    f2.set_result(wire.ProduceResult(error=E.ErrorInfo(code=E.NOT_OWNER, message="moved")))
    with pytest.raises(RaftwalError):
        replicator._settle()
    assert replicator.checkpoint == first.sequence  # what was acknowledged before it
    replicator._reset()
    assert replicator.checkpoint is None and not replicator.inflight
    # The later batches' futures are cancelled: their answers change nothing.
    assert all(future.cancelled() for _, future in stream.sent[2:])


async def test_the_status_measures_the_lag_and_says_when_it_cannot_keep_up() -> None:
    log = _Log(2000, old_s=8.0)
    owner = _Owner(log)
    replicator = _replicator(checkpoint=500)
    start = time.monotonic()
    # Two measurements a window apart: the backlog grew from 500 to 1500 LSNs.
    owner.committed_lsn = 1000
    replicator.samples.append((start - r.RATE_WINDOW_S, 1000, 500, 0))
    owner.committed_lsn = 2000
    replicator._measure(owner, force=True)  # type: ignore[arg-type]
    status = replicator.published
    assert status.lag_entries == 1500
    assert status.lag_bytes == log.bytes_between(501, 2000)
    assert 7.5 <= status.lag_s <= 30, status.lag_s
    assert status.commit_rate_entries_s > status.apply_rate_entries_s == 0
    assert not status.keeping_up
    assert status.summary.startswith("replication of pchannel p to west/p cannot keep up"), (
        status.summary
    )
    # Nothing acknowledged for longer than the lag allows: stalled.
    replicator.acked_at = time.monotonic() - 2 * r.BEHIND_LAG_S
    replicator._measure(owner, force=True)  # type: ignore[arg-type]
    assert replicator.published.summary.startswith(
        "replication of pchannel p to west/p is stalled: the target acknowledged nothing for"
    ), replicator.published.summary
    assert not replicator.published.keeping_up
    # Caught up: nothing to say.
    replicator.confirmed = replicator.checkpoint = 2000
    replicator._measure(owner, force=True)  # type: ignore[arg-type]
    assert (replicator.published.lag_entries, replicator.published.keeping_up) == (0, True)
    assert replicator.published.summary == ""


def test_the_status_copies_are_independent() -> None:
    replicators = r.Replicators(_Host())  # type: ignore[arg-type]
    replicator = _replicator()
    replicators._replicators[("p", 1, "p", b"")] = replicator
    (copy,) = replicators.status()
    copy.lag_entries = 99
    assert replicator.published.lag_entries == 0
