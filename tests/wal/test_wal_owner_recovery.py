"""`ChannelOwner` recovery over three real `PChannelLog`s (real segment files, fsync on):
a new owner fences a majority, adopts the most up-to-date log among them and only then
starts its term. The replicas are reached through a loopback transport that does what the
Replication service does with the same log calls (fence, fetch, append with log matching).

The case that matters is a stale owner coming back: it holds an uncommitted suffix of an
old term that is *longer* than the majority's log, while the majority has committed entries
of a newer term at those LSNs. Adopting must make its log equal to the best one (cut the
stale suffix), not merely long enough; otherwise its next term's entries sit on top of the
stale suffix, a later owner adopts that log, and committed entries are lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rpc.protos import errors_pb2 as E
from rpc.protos import streaming_pb2 as wire
from wal_segments.catalog import Catalog
from wal_segments.format import Entry, MsgType, encode_batch
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import Fenced, Mismatch, PChannelLog
from wal_segments.owner import ChannelOwner, OwnerConfig

PCHANNEL = "p_recover"
NODES = ("n1", "n2", "n3")


def entry(lsn: int, term: int) -> Entry:
    return Entry(
        lsn=lsn,
        term=term,
        time_tick=100 * lsn + term,
        msg_type=int(MsgType.MESSAGE),
        vchannel_id=1,
        payload=f"{lsn}@{term}".encode(),
    )


async def write(log: PChannelLog, term: int, entries: list[Entry]) -> None:
    prev = entries[0].lsn - 1
    result = await log.append(
        term, prev, log.term_at(prev) if prev else 0, encode_batch(entries).data
    )
    await log.wait_durable(result)


def terms(log: PChannelLog) -> list[tuple[int, int]]:
    return [(e.lsn, e.term) for e in log.iter_entries(log.first_lsn, log.last_lsn)]


class _Stream:
    """One Append stream to a replica's log: each request is applied in order, as the
    Replication service applies it, and answered once durable."""

    def __init__(self, log: PChannelLog) -> None:
        self._log = log
        self._answers: asyncio.Queue[wire.AppendResponse | None] = asyncio.Queue()

    async def write(self, request: wire.AppendRequest) -> None:
        log = self._log
        try:
            if request.frames:
                result = await log.append(
                    request.term,
                    request.prev_lsn,
                    request.prev_term,
                    request.frames,
                    from_log_start=request.from_log_start,
                )
                await log.wait_durable(result)
                durable = result.last_lsn
            else:
                if request.term < log.fenced_term:
                    raise Fenced(request.term, log.fenced_term)
                log.check_match(request.prev_lsn, request.prev_term)
                durable = request.prev_lsn
        except Fenced as error:
            answer = wire.AppendResponse(
                request_id=request.request_id,
                status=wire.APPEND_STATUS_FENCED,
                fenced_term=error.fenced_term,
            )
        except Mismatch as error:
            answer = wire.AppendResponse(
                request_id=request.request_id,
                status=wire.APPEND_STATUS_MISMATCH,
                last_lsn=log.last_lsn,
                last_term=log.last_term,
                conflict_term=error.conflict_term,
                conflict_first_lsn=error.conflict_first_lsn,
            )
        except Exception as error:  # noqa: BLE001 - reported to the owner, as the service does
            answer = wire.AppendResponse(
                request_id=request.request_id, status=wire.APPEND_STATUS_ERROR
            )
            answer.error.code = E.INNER
            answer.error.message = str(error)[:500]
        else:
            committed = min(request.committed_lsn, durable)
            if committed > log.committed_lsn:
                log.committed_lsn = committed
            answer = wire.AppendResponse(
                request_id=request.request_id,
                status=wire.APPEND_STATUS_OK,
                durable_lsn=durable,
                last_lsn=log.last_lsn,
                last_term=log.last_term,
            )
        await self._answers.put(answer)

    async def responses(self) -> AsyncIterator[wire.AppendResponse]:
        while True:
            answer = await self._answers.get()
            if answer is None:
                return
            yield answer

    def cancel(self) -> None:
        self._answers.put_nowait(None)


class Loopback:
    """The owner's `ReplicaTransport` and `Proposer`, backed by the other nodes' logs."""

    def __init__(self, logs: dict[str, PChannelLog], down: frozenset[str] = frozenset()) -> None:
        self.logs = logs
        self.down = down
        self.ready: list[tuple[int, int]] = []

    def _reach(self, node_id: str) -> PChannelLog:
        if node_id in self.down:
            raise ConnectionError(f"{node_id} is down")
        return self.logs[node_id]

    def open_append(self, node_id: str) -> _Stream:
        return _Stream(self._reach(node_id))

    async def fence(self, node_id: str, request: wire.FenceRequest) -> wire.FenceResponse:
        log = self._reach(node_id)
        position = await log.fence(request.term)
        return wire.FenceResponse(
            fenced_term=log.fenced_term,
            last_lsn=position.last_lsn,
            last_term=position.last_term,
            last_time_tick=position.last_time_tick,
            node_id=node_id,
        )

    async def fetch(self, node_id: str, request: wire.FetchRequest) -> wire.FetchResponse:
        log = self._reach(node_id)
        if request.term < log.fenced_term:
            return wire.FetchResponse(status=wire.APPEND_STATUS_FENCED, fenced_term=log.fenced_term)
        # As ReplicationServicer.Fetch answers.
        try:
            frames, start, from_log_start = log.fetch_from(
                request.prev_lsn, request.prev_term, max(request.max_bytes, 1 << 16)
            )
        except Mismatch as error:
            return wire.FetchResponse(
                status=wire.APPEND_STATUS_MISMATCH,
                last_lsn=log.last_lsn,
                last_term=log.last_term,
                conflict_term=error.conflict_term,
                conflict_first_lsn=error.conflict_first_lsn,
            )
        return wire.FetchResponse(
            status=wire.APPEND_STATUS_OK,
            frames=frames,
            last_lsn=log.last_lsn,
            last_term=log.last_term,
            log_start_lsn=start if from_log_start else 0,
        )

    async def pchannel_ready(self, pchannel: str, term: int, start_lsn: int) -> int:
        self.ready.append((term, start_lsn))
        return E.OK

    async def commit_segment(self, pchannel: str, term: int, fields: dict[str, object]) -> int:
        return E.OK

    def committed_through(self, pchannel: str) -> int:
        return 0

    def still_assigned(self, pchannel: str, term: int) -> bool:
        return True


async def _open_logs(tmp_path: Path, nodes: tuple[str, ...]):
    opened: dict[str, PChannelLog] = {}
    for node in nodes:
        root = tmp_path / node
        root.mkdir(mode=0o700)
        catalog = Catalog(root / "catalog.db")
        opened[node] = await PChannelLog.open(
            root / "segments", PCHANNEL, catalog, parse_fsync_policy("always")
        )
    yield opened
    for log in opened.values():
        await log.close()
        log.catalog.close()


@pytest.fixture
async def logs(tmp_path: Path):
    async for opened in _open_logs(tmp_path, NODES):
        yield opened


def start_owner(
    logs: dict[str, PChannelLog],
    node: str,
    term: int,
    transport: Loopback,
    ready_floor: int = 0,
) -> ChannelOwner:
    """`node`'s owner at `term` over the other nodes of NODES, started (recovering)."""
    owner = ChannelOwner(
        ready_floor=ready_floor,
        pchannel=PCHANNEL,
        term=term,
        node_id=node,
        replica_node_ids=[n for n in NODES if n != node],
        log=logs[node],
        transport=transport,
        proposer=transport,
        config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0),
    )
    owner.start()
    return owner


async def recover(
    logs: dict[str, PChannelLog], node: str, term: int, down: frozenset[str] = frozenset()
) -> ChannelOwner:
    owner = start_owner(logs, node, term, Loopback(logs, down))
    await asyncio.wait_for(owner.ready.wait(), 20)
    return owner


async def test_a_stale_owner_with_a_longer_old_suffix_adopts_the_newer_majority_log(logs):
    """n1 (term 1) wrote 1..12 but only 1..8 reached n2 and n3; n3 then owned term 2 and
    committed 9..10 on {n3, n2}. n1 is assigned term 3: its log (12 at term 1) is longer
    than the majority's (10 at term 2) but older. It must serve from a log that holds
    9..10 of term 2 and none of its own 9..12 of term 1, and so must every replica."""
    n1, n2, n3 = (logs[n] for n in NODES)
    for log in logs.values():
        await log.fence(1)
    await write(n1, 1, [entry(lsn, 1) for lsn in range(1, 13)])
    for log in (n2, n3):
        await write(log, 1, [entry(lsn, 1) for lsn in range(1, 9)])
    for log in (n2, n3):
        await log.fence(2)
        await write(log, 2, [entry(9, 2), entry(10, 2)])
        log.committed_lsn = 10
    n1.committed_lsn = 8
    committed = terms(n2)

    owner = await recover(logs, "n1", 3)
    try:
        # The committed prefix is intact on the new owner, and its term starts after it.
        assert terms(n1)[:10] == committed
        assert owner.start_lsn > 10
        assert all(term == 3 for _, term in terms(n1)[10:])

        # Every replica converges on the same log, committed entries included.
        async def converged() -> bool:
            while not (terms(n2) == terms(n1) == terms(n3)):
                await asyncio.sleep(0.02)
            return True

        await asyncio.wait_for(converged(), 10)
        assert terms(n3)[:10] == committed
    finally:
        await owner.close()


async def test_a_longer_but_older_local_suffix_is_cut_even_when_it_ends_past_the_best(logs):
    """The same as above, with the best log ending in the middle of the stale suffix's
    segment of terms: n1 has 1..6 at term 1 and 7..15 at term 2 (uncommitted past 8); n2
    has 1..6 at term 1, 7..8 at term 2 and 9 at term 4. n1 at term 5 must end up holding
    9 at term 4 and nothing of its 9..15 at term 2."""
    n1, n2, n3 = (logs[n] for n in NODES)
    for log in logs.values():
        await log.fence(2)
    await write(
        n1, 2, [entry(lsn, 1) for lsn in range(1, 7)] + [entry(lsn, 2) for lsn in range(7, 16)]
    )
    for log in (n2, n3):
        await write(log, 2, [entry(lsn, 1) for lsn in range(1, 7)] + [entry(7, 2), entry(8, 2)])
    await n2.fence(4)
    await write(n2, 4, [entry(9, 4)])
    n2.committed_lsn = 8
    n3.committed_lsn = 8
    n1.committed_lsn = 8
    # n3 is down: the majority is {n1, n2}, and n2's log is the most up to date.
    expected = terms(n2)
    owner = await recover(logs, "n1", 5, down=frozenset({"n3"}))
    try:
        assert terms(n1)[:9] == expected
        assert all(term == 5 for _, term in terms(n1)[9:])
        assert terms(n2) == terms(n1)
    finally:
        await owner.close()


@pytest.fixture
async def four_logs(tmp_path: Path):
    async for opened in _open_logs(tmp_path, (*NODES, "n4")):
        yield opened


async def test_a_replica_set_change_consults_the_last_ready_set(four_logs):
    """The last ready set was {n1, n2, n3}: 1..10 are committed on {n2, n3}, n1 lagged at 4.
    Term 2 changes the set to {n1, n4} (n4 is new and empty). A majority of the new set
    alone holds none of 5..10: recovery must also fence ceil(3/2) = 2 of the last ready set
    (n3 is down: n1 and n2), adopt n2's log and copy it to n4 before the term is ready."""
    logs = four_logs
    n1, n2, n3, n4 = (logs[n] for n in (*NODES, "n4"))
    for log in (n1, n2, n3):
        await log.fence(1)
    await write(n1, 1, [entry(lsn, 1) for lsn in range(1, 5)])
    for log in (n2, n3):
        await write(log, 1, [entry(lsn, 1) for lsn in range(1, 11)])
        log.committed_lsn = 10
    committed = terms(n2)
    transport = Loopback(logs, frozenset({"n3"}))
    owner = ChannelOwner(
        pchannel=PCHANNEL,
        term=2,
        node_id="n1",
        replica_node_ids=["n4"],
        stable_replica_node_ids=list(NODES),
        log=n1,
        transport=transport,
        proposer=transport,
        config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0),
    )
    owner.start()
    try:
        await asyncio.wait_for(owner.ready.wait(), 20)
        assert terms(n1)[:10] == committed
        assert owner.start_lsn > 10
        # The term-start entry is on both members of the new set, so n4 holds 1..10 too.
        assert terms(n4)[: owner.start_lsn] == terms(n1)[: owner.start_lsn]
        # n2, outside the new set, was fenced at term 2 (its old owner can no longer write).
        assert n2.fenced_term == 2
    finally:
        await owner.close()


async def test_replicas_behind_the_owners_retained_log_restart_at_its_first_entry(logs):
    """Retention deleted 1..10 on the owner n1 (its log starts at 11). n2 is a new, empty
    replica; n3 was away and holds only 1..3. Neither can match an entry the owner still
    has, so the owner sends from its first entry marked `from_log_start`: each drops what
    it holds and starts its log at 11, and both end equal to the owner's. Without it the
    owner backs up to its first entry and is refused forever, and the term never starts."""
    from tests.wal.test_wal_log import append as append_entries
    from tests.wal.test_wal_log import run

    n1, n2, n3 = (logs[n] for n in NODES)
    for log in logs.values():
        await log.fence(1)
    for first in (1, 6, 11):
        batch = run(first, first + 4, 1, seal_at=(first + 4,))
        await append_entries(n1, 1, first - 1, n1.term_at(first - 1), batch)
    await append_entries(n1, 1, 15, 1, run(16, 17, 1))
    n1.committed_lsn = 17
    assert await n1.delete_before(11) == 2 and n1.first_lsn == 11
    await append_entries(n3, 1, 0, 0, run(1, 3, 1))

    owner = await recover(logs, "n1", 2)
    try:

        async def converged() -> None:
            while not terms(n2) == terms(n3) == terms(n1):
                await asyncio.sleep(0.02)

        await asyncio.wait_for(converged(), 10)
        assert n2.first_lsn == n3.first_lsn == 11
        assert terms(n2)[:7] == [(lsn, 1) for lsn in range(11, 18)]
        assert n3.catalog.retention_floor(PCHANNEL) == 11
    finally:
        await owner.close()
    # The restarted logs open again as they were left.
    for name in ("n2", "n3"):
        log = logs[name]
        before = terms(log)
        await log.close()
        logs[name] = await PChannelLog.open(
            log.directory, PCHANNEL, log.catalog, parse_fsync_policy("always")
        )
        assert terms(logs[name]) == before


async def _retain_from(log: PChannelLog, term: int, first: int, last: int, keep_from: int) -> None:
    """Fill `log` with first..last at `term` (a seal marker ending a segment at keep_from - 1),
    commit it and let retention delete everything below keep_from."""
    import dataclasses

    from wal_segments.format import EntryFlags

    head = [entry(lsn, term) for lsn in range(first, keep_from)]
    head[-1] = dataclasses.replace(
        head[-1], msg_type=int(MsgType.SEAL), flags=int(EntryFlags.SEAL_MARKER), payload=b""
    )
    await write(log, term, head)
    await log.wait_sealed()
    await write(log, term, [entry(lsn, term) for lsn in range(keep_from, last + 1)])
    log.committed_lsn = last
    await log.delete_before(keep_from)
    assert log.first_lsn == keep_from


async def test_adopting_below_the_best_logs_retained_start_never_grafts_a_divergent_prefix(logs):
    """n2 (the best log: term 4 from lsn 50) retains only 80..100; n1 holds 1..49 of term 1
    and an uncommitted 50..100 of term 3. The fast back-up lands at 79, below n2's retained
    start, where n2 cannot check n1's entry. Before the fix n2 answered as if 79 matched
    and n1 grafted 80..100 of term 4 onto its own 50..79 of term 3, entries that were never
    committed (and then served them, and rebuilt producer deduplication from them). Now n2
    sends from its log's start and n1 keeps nothing it cannot prove matches."""
    n1, n2, _ = (logs[n] for n in NODES)
    for log in (n1, n2):
        await log.fence(1)
        await write(log, 1, [entry(lsn, 1) for lsn in range(1, 50)])
    await n1.fence(3)
    await write(n1, 3, [entry(lsn, 3) for lsn in range(50, 101)])
    await n2.fence(4)
    await _retain_from(n2, 4, 50, 100, 80)
    owner = await asyncio.wait_for(recover(logs, "n1", 5, down=frozenset({"n3"})), 20)
    try:
        held = terms(n1)
        assert all(term != 3 for _, term in held), held[:5]
        assert n1.first_lsn == 80
        assert held[: 100 - 80 + 1] == terms(n2)[: 100 - 80 + 1]
    finally:
        await owner.close()


async def test_adopting_from_a_log_whose_retained_start_is_past_our_end_completes(logs):
    """n1 ends at 50; the best log (n2) retains only 80..100. Before the fix the Fetch for
    lsn 51 raised KeyError inside the source, recovery retried until the assignment was
    superseded, and the balancer could pick n1 again. Now n1 starts its log at 80."""
    n1, n2, _ = (logs[n] for n in NODES)
    for log in (n1, n2):
        await log.fence(1)
    await write(n1, 1, [entry(lsn, 1) for lsn in range(1, 51)])
    await write(n2, 1, [entry(lsn, 1) for lsn in range(1, 51)])
    await _retain_from(n2, 1, 51, 100, 80)
    owner = await asyncio.wait_for(recover(logs, "n1", 2, down=frozenset({"n3"})), 20)
    try:
        assert n1.first_lsn == 80
        assert terms(n1)[:21] == terms(n2)[:21]
        assert owner.start_lsn > 100
    finally:
        await owner.close()


class _ShrinkingSource(Loopback):
    """n2 answers the fence with its whole log, then loses its tail (a disk that gave back
    data it had reported durable)."""

    async def fence(self, node_id: str, request: wire.FenceRequest) -> wire.FenceResponse:
        reply = await super().fence(node_id, request)
        if node_id == "n2":
            await self.logs["n2"].truncate_after(5)
        return reply


async def test_a_source_shorter_than_its_fence_answer_is_not_adopted(logs):
    """n1 holds 1..8 (committed with n3, down now), n2 answered term 2's fence with 1..12
    and then lost 6..12. Backing up to n2's log would cut n1's committed 6..8: the recovery
    must stop instead, with n1's log intact, and leave it to the next term."""
    n1, n2, _ = (logs[n] for n in NODES)
    for log in logs.values():
        await log.fence(1)
    await write(n1, 1, [entry(lsn, 1) for lsn in range(1, 9)])
    await write(n2, 1, [entry(lsn, 1) for lsn in range(1, 13)])
    before = terms(n1)
    owner = start_owner(logs, "n1", 2, _ShrinkingSource(logs, frozenset({"n3"})))
    try:

        async def stopped() -> None:
            while owner.state == "recovering":
                await asyncio.sleep(0.02)

        await asyncio.wait_for(stopped(), 20)
        assert owner.state == "closed"
        assert "not adopting it" in (owner.failure or "")
        assert not owner.ready.is_set()
        assert terms(n1) == before
        assert terms(n2)[-1] == (5, 1)
    finally:
        await owner.close()


async def test_a_log_below_what_earlier_terms_committed_gets_nothing_of_the_new_term(logs):
    """Every replica holds 1..4 at term 1, but earlier terms committed through lsn 10 (a
    restore without the segment files: the manifest lists 1..10). `PChannelReady` would
    refuse a term starting at 5, but writing it first leaves entries behind: after a few
    such terms a start entry lies past 10 over a log without 5..10, and is accepted (the
    proposer here accepts every ready, as that one would be). The recovery must stop
    before writing anything, every time."""
    for log in logs.values():
        await log.fence(1)
        await write(log, 1, [entry(lsn, 1) for lsn in range(1, 5)])
    before = {node: terms(log) for node, log in logs.items()}
    transport = Loopback(logs)
    for term in (2, 3, 4, 5):
        owner = start_owner(logs, "n1", term, transport, ready_floor=10)
        try:

            async def stopped(owner: ChannelOwner = owner) -> None:
                while owner.state == "recovering":
                    await asyncio.sleep(0.02)

            await asyncio.wait_for(stopped(), 20)
            assert owner.state == "closed"
            assert "before lsn 10 that earlier terms wrote and committed" in (owner.failure or "")
        finally:
            await owner.close()
    assert transport.ready == []
    assert {node: terms(log) for node, log in logs.items()} == before
