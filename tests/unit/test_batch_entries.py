"""Batched log entries: several commands in one Raft entry (``apply_log_entry``).

A client batch (``Coordinator.BatchWrite``) and the node's proposal batching both put
several serialized commands into one ``LogEntry``. The rules checked here:

- commands apply in order, each with its own outcome (result or rejection) and events, and
  a later command sees the effect of an earlier one;
- a rejected or undecodable command rejects only itself;
- deduplication by request id works per command, inside one batch and across batches;
- applying a batch is exactly applying its commands one by one at the entry's index
  (property test over random lease and lock commands split at random into entries).

Also ``ProposalBatcher.propose_group``: a group is never split across Raft entries.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from raftwal.node.proposals import ProposalBatcher
from rpc.protos import coordination_pb2 as pb
from statemachine import apply_command, apply_log_entry, new_state, snapshot_state
from tests.unit.helpers import EXCLUSIVE, NOW, E, cmd, grant


def _entry(*commands: pb.Command | bytes) -> bytes:
    raw = [c if isinstance(c, bytes) else c.SerializeToString() for c in commands]
    return pb.LogEntry(batch=pb.CommandBatch(commands=raw)).SerializeToString()


def _lock(key: str, lease_id: int, request_id: str = "") -> pb.Command:
    return cmd(request_id=request_id, lock=pb.Lock(key=key, mode=EXCLUSIVE, lease_id=lease_id))


def _unlock(key: str, lease_id: int, request_id: str = "") -> pb.Command:
    return cmd(request_id=request_id, unlock=pb.Unlock(key=key, lease_id=lease_id))


def _two_leases() -> tuple[pb.CoordinationState, int, int]:
    state = new_state()
    results = apply_log_entry(state, _entry(grant(), grant(holder="client-2")), 1)
    assert [r.rejection.code for r in results] == [E.OK, E.OK]
    return state, results[0].lease_id, results[1].lease_id


def test_batch_applies_in_order_with_own_outcomes() -> None:
    state, a, b = _two_leases()
    results = apply_log_entry(
        state,
        _entry(
            _lock("k", a, "r1"),  # granted
            _lock("k", b, "r2"),  # held by a
            _unlock("k", a, "r3"),  # released
            _lock("k", b, "r4"),  # granted now: sees the release before it
            b"\xff\xfe not a command",  # rejected alone
            _lock("k2", 999_999, "r6"),  # no such lease
        ),
        7,
    )
    codes = [r.rejection.code for r in results]
    assert codes[:5] == [E.OK, E.RESOURCE_ACQUIRED, E.OK, E.OK, E.INVALID_ARGUMENT]
    assert codes[5] != E.OK
    assert all(r.raft_index == 7 for r in results)
    # Each accepted command has its own events and a revision above the previous one's.
    assert [e.WhichOneof("body") for e in results[0].events] == ["lock_acquired"]
    assert [e.WhichOneof("body") for e in results[3].events] == ["lock_acquired"]
    assert not results[1].events and not results[4].events
    assert results[0].revision < results[2].revision < results[3].revision
    assert results[3].fencing_token > results[0].fencing_token
    holders = state.locks["k"].holders
    assert [h.id for h in holders] == [b]


def test_dedup_per_command_inside_and_across_batches() -> None:
    state, a, b = _two_leases()
    first = apply_log_entry(state, _entry(_lock("k", a, "x"), _lock("k", a, "x")), 5)
    # The second command with the same id is the stored answer of the first, not a
    # second application (which would be an idempotent re-grant with a new revision).
    assert first[1].deduplicated and not first[0].deduplicated
    assert first[1].fencing_token == first[0].fencing_token
    assert first[1].revision == first[0].revision
    revision = state.revision
    # The whole batch retried (same ids) with a new command in between: only the new
    # one applies; the retried ones answer their stored results.
    again = apply_log_entry(
        state, _entry(_lock("k", a, "x"), _lock("k", b, "y"), _unlock("k", a, "z")), 6
    )
    assert again[0].deduplicated and again[0].fencing_token == first[0].fencing_token
    assert again[1].rejection.code == E.RESOURCE_ACQUIRED and not again[1].deduplicated
    assert again[2].rejection.code == E.OK and again[2].revision > revision
    retried = apply_log_entry(state, _entry(_unlock("k", a, "z"), _lock("k", b, "y")), 7)
    # "y" was remembered with its rejection: a retry answers the same rejection even
    # though the key is free now.
    assert retried[0].deduplicated and retried[0].revision == again[2].revision
    assert retried[1].deduplicated and retried[1].rejection.code == E.RESOURCE_ACQUIRED


def test_empty_batch_and_single_command_entry() -> None:
    state, a, _ = _two_leases()
    assert apply_log_entry(state, _entry(), 3) == []
    single = pb.LogEntry(command=_lock("k", a).SerializeToString()).SerializeToString()
    (result,) = apply_log_entry(state, single, 4)
    assert result.rejection.code == E.OK and result.raft_index == 4


KEYS = st.sampled_from(["k1", "k2", "k3"])
LEASE_SLOTS = st.integers(min_value=0, max_value=2)
REQUEST_IDS = st.sampled_from(["", "", "r1", "r2", "r3", "r4"])
OPS = st.one_of(
    st.tuples(st.just("lock"), KEYS, LEASE_SLOTS, REQUEST_IDS),
    st.tuples(st.just("unlock"), KEYS, LEASE_SLOTS, REQUEST_IDS),
    st.tuples(st.just("revoke"), KEYS, LEASE_SLOTS, REQUEST_IDS),
)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(OPS, min_size=1, max_size=24),
    cuts=st.lists(st.integers(min_value=1, max_value=24), max_size=8),
)
def test_batch_equals_commands_one_by_one(ops: list[tuple[str, str, int, str]], cuts) -> None:
    def commands(leases: list[int]) -> list[bytes]:
        out = []
        for n, (kind, key, slot, request_id) in enumerate(ops):
            lease = leases[slot]
            at = NOW + n
            if kind == "lock":
                body: dict[str, object] = {"lock": pb.Lock(key=key, mode=EXCLUSIVE, lease_id=lease)}
            elif kind == "unlock":
                body = {"unlock": pb.Unlock(key=key, lease_id=lease)}
            else:
                body = {"revoke_lease": pb.RevokeLease(lease_id=lease)}
            out.append(cmd(request_id=request_id, at=at, **body).SerializeToString())
        return out

    batched, single = new_state(), new_state()
    setup = [grant(holder=f"c{n}").SerializeToString() for n in range(3)]
    leases = [r.lease_id for r in apply_log_entry(batched, _entry(*setup), 1)]
    for data in setup:
        apply_command(single, data, 1)
    raw = commands(leases)
    bounds = sorted({c for c in cuts if c < len(raw)} | {0, len(raw)})
    index = 2
    for start, end in zip(bounds, bounds[1:], strict=False):
        got = apply_log_entry(batched, _entry(*raw[start:end]), index)
        want = [apply_command(single, data, index) for data in raw[start:end]]
        assert [g.SerializeToString() for g in got] == [w.SerializeToString() for w in want]
        index += 1
    assert snapshot_state(batched) == snapshot_state(single)


def test_propose_group_is_one_entry_never_split() -> None:
    entries: list[pb.LogEntry] = []
    release = asyncio.Event()

    async def propose_entry(data: bytes) -> bytes:
        entry = pb.LogEntry.FromString(data)
        entries.append(entry)
        await release.wait()
        count = len(entry.batch.commands) if entry.HasField("batch") else 1
        results = [pb.CommandResult(raft_index=len(entries), revision=n) for n in range(count)]
        return pb.LogEntryResult(
            results=[r.SerializeToString() for r in results]
        ).SerializeToString()

    async def scenario() -> None:
        batcher = ProposalBatcher(propose_entry, max_batch_commands=4)
        first = asyncio.ensure_future(batcher.propose(b"c0"))
        await asyncio.sleep(0)
        # While c0's entry is in flight: a group of 3, a single, then a group of 3 that
        # would overflow the 4-command bound and so goes whole into the next entry.
        group = asyncio.ensure_future(batcher.propose_group([b"g1", b"g2", b"g3"]))
        lone = asyncio.ensure_future(batcher.propose(b"s"))
        late = asyncio.ensure_future(batcher.propose_group([b"h1", b"h2", b"h3"]))
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, group, lone, late)
        got = [[pb.CommandResult.FromString(r).revision for r in group.result()]]
        assert got == [[0, 1, 2]]
        assert pb.CommandResult.FromString(lone.result()).revision == 3
        assert [pb.CommandResult.FromString(r).raft_index for r in late.result()] == [3, 3, 3]

    asyncio.run(scenario())
    shapes = [
        [entry.command] if entry.HasField("command") else list(entry.batch.commands)
        for entry in entries
    ]
    assert shapes == [[b"c0"], [b"g1", b"g2", b"g3", b"s"], [b"h1", b"h2", b"h3"]]
