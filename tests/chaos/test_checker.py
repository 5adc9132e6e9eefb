"""The chaos checker on hand-written histories: a clean run passes, and every property it
claims to check catches a history that breaks it, while what an allowed outcome (an
unknown operation, two overlapping operations, a stale read) explains is not flagged.
No cluster: these run in milliseconds."""

from __future__ import annotations

import hashlib
import math

import pytest

from raftwal.chaos.checker import (
    FinalState,
    LogEntry,
    SegmentFileCheck,
    SegmentInfo,
    check,
)
from raftwal.chaos.workload import FAIL, OK, UNKNOWN, Delivery, History, Op, StatusSample

P = "chaos_0"
V = "chaos_v0"
MAPPING = {V: P}


def _op(
    history: History,
    process: str,
    kind: str,
    start: float,
    end: float,
    outcome: str,
    value: dict,
    result: dict | None = None,
) -> Op:
    op = Op(len(history.ops), process, kind, start, value)
    op.outcome = outcome
    op.complete_s = end if outcome in (OK, FAIL) else math.inf
    op.result = result or {}
    history.ops.append(op)
    return op


def _entry(
    lsn: int,
    key: str,
    term: int = 1,
    broadcast_id: int = 0,
    vchannel: str = V,
    msg_type: str = "message",
) -> LogEntry:
    return LogEntry(lsn, term, lsn * 10, vchannel, msg_type, key, broadcast_id, _digest(key))


def _digest(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()


def _produce(history: History, key: str, outcome: str, lsn: int = 0, start: float = 0.0) -> Op:
    result = {"pchannel": P, "lsn": lsn} if outcome == OK else {}
    return _op(
        history,
        key.split(":")[0],
        "produce",
        start,
        start + 0.1,
        outcome,
        {"vchannel": V, "key": key},
        result,
    )


def _clean() -> tuple[History, FinalState]:
    history = History(0.0)
    _produce(history, "p0:chaos_v0:0", OK, lsn=2, start=0.0)
    _produce(history, "p0:chaos_v0:1", OK, lsn=3, start=0.1)
    _produce(history, "p1:chaos_v0:0", UNKNOWN, start=0.2)
    _produce(history, "p1:chaos_v0:1", UNKNOWN, start=0.3)
    _produce(history, "p1:chaos_v0:2", FAIL, start=0.4)
    log = [
        _entry(1, "", msg_type="term_start"),
        _entry(2, "p0:chaos_v0:0"),
        _entry(3, "p0:chaos_v0:1"),
        _entry(4, "p1:chaos_v0:0"),
    ]
    final = FinalState(logs={P: log})
    final.segments = [SegmentInfo(P, 1, 3, 3, 7, ("n1", "n2"))]
    final.segment_files = [
        SegmentFileCheck(
            P,
            1,
            "n1",
            digest=7,
            last_lsn=3,
            count=3,
            entries=tuple((e.lsn, e.term, e.time_tick, e.digest) for e in log[:3]),
        ),
        SegmentFileCheck(P, 1, "n2", digest=7, last_lsn=3, count=3),
    ]
    final.spark_rows = {(P, 2, _digest("p0:chaos_v0:0")), (P, 3, _digest("p0:chaos_v0:1"))}
    return history, final


def _kinds(history: History, final: FinalState, deliveries=None, samples=()) -> list[str]:
    violations = check(history, deliveries or {}, list(samples), MAPPING, final)
    return sorted({v.kind for v in violations})


def test_clean_history_passes() -> None:
    history, final = _clean()
    deliveries = {V: [Delivery(2, "p0:chaos_v0:0", 0), Delivery(4, "p1:chaos_v0:0", 0)]}
    assert _kinds(history, final, deliveries) == []


def test_lost_acknowledged_message() -> None:
    history, final = _clean()
    final.logs[P] = [e for e in final.logs[P] if e.lsn != 3]
    assert "lost" in _kinds(history, final)


def test_retention_may_delete_below_its_floor_and_nothing_above() -> None:
    history, final = _clean()
    # Retention deleted lsn 1..2 (the first segment ended there); the log starts at 3.
    final.floors = {P: 3}
    final.logs[P] = [e for e in final.logs[P] if e.lsn >= 3]
    final.segments = [SegmentInfo(P, 3, 3, 1, 7, ("n1",))]
    final.segment_files = []
    final.spark_rows = {(P, 3, _digest("p0:chaos_v0:1"))}
    deliveries = {V: [Delivery(2, "p0:chaos_v0:0", 0), Delivery(3, "p0:chaos_v0:1", 0)]}
    assert _kinds(history, final, deliveries) == []
    # Above the floor, an acknowledged message must still be there.
    final.logs[P] = [e for e in final.logs[P] if e.lsn != 3]
    assert "lost" in _kinds(history, final, deliveries)
    # And the log starts at the floor, not after it.
    history, final = _clean()
    final.floors = {P: 2}
    final.logs[P] = [e for e in final.logs[P] if e.lsn >= 3]
    assert {"lost", "lsn-order"} <= set(_kinds(history, final))


def test_acknowledged_at_another_lsn() -> None:
    history, final = _clean()
    history.ops[0].result["lsn"] = 3
    assert "ack-mismatch" in _kinds(history, final)


def test_duplicate_of_an_unknown_write() -> None:
    history, final = _clean()
    final.logs[P].append(_entry(5, "p1:chaos_v0:0"))
    assert _kinds(history, final) == ["duplicate"]


def test_failed_write_must_not_appear() -> None:
    history, final = _clean()
    final.logs[P].append(_entry(5, "p1:chaos_v0:2"))
    assert _kinds(history, final) == ["failed-write-visible"]


def test_entry_nobody_wrote() -> None:
    history, final = _clean()
    final.logs[P].append(_entry(5, "zz:chaos_v0:9"))
    assert _kinds(history, final) == ["unexpected-entry"]


def test_log_gap_term_and_time_tick_regressions() -> None:
    history, final = _clean()
    log = final.logs[P]
    log.append(LogEntry(6, 0, 5, V, "message", "p1:chaos_v0:1", 0, _digest("x")))
    kinds = _kinds(history, final)
    assert {"lsn-order", "term-regression", "time-tick-order"} <= set(kinds)


def test_producer_acks_out_of_submission_order() -> None:
    history, final = _clean()
    history.ops[0].result["lsn"], history.ops[1].result["lsn"] = 3, 2
    final.logs[P][1:3] = [_entry(2, "p0:chaos_v0:1"), _entry(3, "p0:chaos_v0:0")]
    final.spark_rows = None
    final.segment_files = []
    assert _kinds(history, final) == ["lsn-order"]


def test_consumer_dirty_read_and_order() -> None:
    history, final = _clean()
    deliveries = {V: [Delivery(3, "p0:chaos_v0:1", 0), Delivery(2, "p0:chaos_v0:0", 0)]}
    assert _kinds(history, final, deliveries) == ["consumer-order"]
    deliveries = {V: [Delivery(5, "p1:chaos_v0:1", 0)]}
    assert _kinds(history, final, deliveries) == ["dirty-read"]


def _lock(
    history: History,
    process: str,
    lease: int,
    start: float,
    end: float,
    token: int,
    outcome: str = OK,
) -> Op:
    return _op(
        history,
        process,
        "lock",
        start,
        end,
        outcome,
        {"key": "k", "lease": lease},
        {"token": token} if outcome == OK else {},
    )


def _unlock(history: History, lock: Op, start: float, end: float, outcome: str = OK) -> Op:
    return _op(
        history,
        lock.process,
        "unlock",
        start,
        end,
        outcome,
        {"key": "k", "lease": lock.value["lease"], "lock": lock.index},
    )


def test_sequential_locks_pass_and_concurrent_ones_are_not_ordered() -> None:
    history, final = _clean()
    a = _lock(history, "l0", 10, 1.0, 1.1, token=20)
    _unlock(history, a, 1.5, 1.6)
    b = _lock(history, "l1", 11, 1.2, 1.7, token=30)  # waited for a's release
    _unlock(history, b, 1.8, 1.9)
    # Invoked before b completed: its token may be lower than b's (it may be older).
    _lock(history, "l2", 12, 1.65, 2.5, token=25, outcome=OK)
    assert "lock-token" not in _kinds(history, final)
    assert "lock-overlap" not in _kinds(history, final)


def test_lock_token_must_increase_in_real_time() -> None:
    history, final = _clean()
    a = _lock(history, "l0", 10, 1.0, 1.1, token=20)
    _unlock(history, a, 1.5, 1.6)
    _lock(history, "l1", 11, 1.7, 1.8, token=19)
    assert "lock-token" in _kinds(history, final)


def test_lock_acquired_inside_an_acknowledged_hold() -> None:
    history, final = _clean()
    a = _lock(history, "l0", 10, 1.0, 1.1, token=20)
    _unlock(history, a, 2.0, 2.1)
    _lock(history, "l1", 11, 1.2, 1.3, token=22)
    assert "lock-overlap" in _kinds(history, final)


def test_hold_with_an_unknown_release_proves_nothing() -> None:
    history, final = _clean()
    a = _lock(history, "l0", 10, 1.0, 1.1, token=20)
    _unlock(history, a, 2.0, 2.1, outcome=UNKNOWN)
    _lock(history, "l1", 11, 1.2, 1.3, token=22)
    assert "lock-overlap" not in _kinds(history, final)


def _hold(history: History, lock: Op, end: float, reason: str) -> Op:
    return _op(
        history,
        lock.process,
        "hold",
        lock.complete_s,
        end,
        OK,
        {"key": "k", "lease": lock.value["lease"], "lock": lock.index},
        {"reason": reason},
    )


def test_zombie_holder_is_caught() -> None:
    """l0's keeper died quietly, so l0 kept believing it held the lock until 9.0, while its
    lease expired on the server and l1, which asked at 5.0, got the lock at 6.0."""
    history, final = _clean()
    a = _lock(history, "l0", 10, 1.0, 1.1, token=20)
    _hold(history, a, 9.0, "released")
    _unlock(history, a, 9.0, 9.1, outcome=FAIL)
    _lock(history, "l1", 11, 5.0, 6.0, token=30)
    assert _kinds(history, final) == ["zombie-holder"]


def test_a_hold_that_ended_with_its_lease_is_no_zombie() -> None:
    """The keeper stopped vouching at 4.0 (the deadline it believed): l1's acquisition at
    6.0 came after. l2's request predates the hold: its grant may predate the hold too (the
    mutual-exclusion checks cover that), so it proves no zombie either."""
    history, final = _clean()
    a = _lock(history, "l0", 10, 1.0, 1.1, token=20)
    _hold(history, a, 4.0, "expired")
    _lock(history, "l1", 11, 3.5, 6.0, token=30)
    _lock(history, "l2", 12, 0.5, 2.0, token=25)
    assert "zombie-holder" not in _kinds(history, final)


def _broadcast(
    history: History,
    name: str,
    key: str,
    start: float,
    end: float,
    outcome: str,
    broadcast_id: int = 0,
    appended: dict | None = None,
) -> Op:
    value = {
        "idempotency_key": f"idem-{name}",
        "key": key,
        "vchannels": [V],
        "message": f"bc:{name}",
    }
    result = {"broadcast_id": broadcast_id, "appended": appended or {}} if outcome == OK else {}
    return _op(history, name, "broadcast", start, end, outcome, value, result)


def _ack(history: History, name: str, broadcast_id: int, start: float) -> Op:
    value = {
        "idempotency_key": f"idem-{name}",
        "broadcast_id": broadcast_id,
        "vchannel": V,
        "checkpoint": 1,
    }
    return _op(history, name, "ack", start, start + 0.1, OK, value)


def _with_broadcast_entries(final: FinalState, *entries: LogEntry) -> None:
    final.logs[P].extend(entries)


def test_broadcast_delivered_once_passes() -> None:
    history, final = _clean()
    _broadcast(history, "b0", "ddl", 1.0, 1.1, OK, broadcast_id=40, appended={V: 5})
    _ack(history, "b0", 40, 1.5)
    _broadcast(history, "b1", "ddl", 1.7, 1.8, OK, broadcast_id=50)
    _with_broadcast_entries(
        final, _entry(5, "bc:b0", broadcast_id=40), _entry(6, "bc:b1", broadcast_id=50)
    )
    assert _kinds(history, final) == []


def test_broadcast_lost_or_duplicated() -> None:
    history, final = _clean()
    _broadcast(history, "b0", "ddl", 1.0, 1.1, OK, broadcast_id=40, appended={V: 5})
    assert _kinds(history, final) == ["broadcast-lost"]
    _with_broadcast_entries(
        final, _entry(5, "bc:b0", broadcast_id=40), _entry(6, "bc:b0", broadcast_id=40)
    )
    assert _kinds(history, final) == ["broadcast-duplicate"]


def test_broadcasts_on_one_key_must_not_overlap() -> None:
    history, final = _clean()
    _broadcast(history, "b0", "ddl", 1.0, 1.1, OK, broadcast_id=40)
    _ack(history, "b0", 40, 2.0)
    # Created (acknowledged) before b0's only vchannel was even acked.
    _broadcast(history, "b1", "ddl", 1.2, 1.5, OK, broadcast_id=50)
    _with_broadcast_entries(
        final, _entry(5, "bc:b0", broadcast_id=40), _entry(6, "bc:b1", broadcast_id=50)
    )
    assert _kinds(history, final) == ["resource-key-overlap"]


def _sample(at: float, revision: int, term: int, owner: str, raft: dict[str, int]) -> StatusSample:
    return StatusSample(at, "e", revision, "n1", {P: (term, owner, 3)}, raft, {})


def test_terms_by_revision_and_raft_terms_by_time() -> None:
    history, final = _clean()
    # A stale read (lower revision, lower term) after a newer one is fine.
    good = [_sample(1.0, 10, 2, "n1", {"n1": 3}), _sample(2.0, 8, 1, "n2", {"n1": 3})]
    assert _kinds(history, final, samples=good) == []
    bad = [_sample(1.0, 10, 2, "n1", {"n1": 3}), _sample(2.0, 12, 1, "n2", {"n1": 2})]
    assert _kinds(history, final, samples=bad) == ["raft-term-regression", "term-regression"]
    owners = [_sample(1.0, 10, 2, "n1", {}), _sample(2.0, 11, 2, "n3", {})]
    assert _kinds(history, final, samples=owners) == ["term-owner"]


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ("digest", "segment-divergence"),
        ("entries", "segment-divergence"),
        ("missing-file", "segment-replica"),
        ("gap", "segment-gap"),
    ],
)
def test_segment_checks(change: str, kind: str) -> None:
    history, final = _clean()
    first = final.segment_files[0]
    if change == "digest":
        final.segment_files[1] = SegmentFileCheck(P, 1, "n2", digest=8, last_lsn=3, count=3)
    elif change == "entries":
        assert first.entries is not None
        entries = (*first.entries[:2], (3, 1, 30, _digest("other")))
        final.segment_files[0] = SegmentFileCheck(
            P, 1, "n1", digest=7, last_lsn=3, count=3, entries=entries
        )
    elif change == "missing-file":
        final.segment_files[1] = SegmentFileCheck(P, 1, "n2", error="no such file")
    else:
        final.segments = [SegmentInfo(P, 2, 3, 2, 7, ("n1",))]
        final.segment_files = []
        final.spark_rows = None
    assert kind in _kinds(history, final)


def test_spark_must_read_exactly_the_committed_segments() -> None:
    history, final = _clean()
    assert final.spark_rows is not None
    final.spark_rows.discard((P, 3, _digest("p0:chaos_v0:1")))
    final.spark_rows.add((P, 4, _digest("p1:chaos_v0:0")))
    assert _kinds(history, final) == ["spark-extra", "spark-missing"]


def test_an_unreadable_log_and_no_recovery_are_violations() -> None:
    history, final = _clean()
    final.log_errors[P] = "no owner known after healing"
    final.recovery_error = "the cluster did not recover"
    final.converged, final.convergence_detail = False, "digests differ"
    kinds = _kinds(history, final)
    assert {"unreadable-log", "recovery", "divergence"} <= set(kinds)


# -- issue 15: exactly-once shard, subscription positions, members, packs ------------------


def _shard_final(history: History, source_lsn: int, applied: list[int], counters: dict) -> Op:
    return _op(
        history,
        "shard",
        "shard_final",
        9.0,
        9.5,
        OK,
        {"vchannel": V},
        {"source_lsn": source_lsn, "applied": applied, "counters": counters, "token": 3},
    )


def test_exactly_once_shard_passes_when_it_matches_the_log() -> None:
    history, final = _clean()
    _shard_final(history, 4, [2, 3, 4], {"p0": 2, "p1": 1})
    assert _kinds(history, final) == []
    history, final = _clean()
    _shard_final(history, 3, [2, 3], {"p0": 2})  # behind the log's end: fine
    assert _kinds(history, final) == []


@pytest.mark.parametrize(
    ("applied", "counters", "kinds"),
    [
        ([2, 3, 3, 4], {"p0": 3, "p1": 1}, ["exactly-once", "shard-counter"]),  # twice
        ([2, 4], {"p0": 1, "p1": 1}, ["exactly-once", "shard-counter"]),  # lost
        ([2, 3, 4, 7], {"p0": 2, "p1": 1}, ["exactly-once"]),  # not in the log
        ([2, 3, 4], {"p0": 1, "p1": 1}, ["shard-counter"]),  # counter off
        ([2, 3, 4], {"p0": 2, "p1": 1, "p9": 1}, ["shard-counter"]),  # a key nobody wrote
    ],
)
def test_exactly_once_shard_violations(applied: list[int], counters: dict, kinds: list) -> None:
    history, final = _clean()
    _shard_final(history, 4, applied, counters)
    assert _kinds(history, final) == kinds


def test_shard_checkpoint_must_be_a_committed_entry() -> None:
    history, final = _clean()
    _shard_final(history, 9, [2, 3, 4], {"p0": 2, "p1": 1})
    assert _kinds(history, final) == ["shard-checkpoint"]


def _observe(history: History, at: float, positions: dict, subscription: str = "g") -> Op:
    return _op(
        history,
        "positions",
        "sub_observe",
        at,
        at + 0.1,
        OK,
        {"subscription": subscription},
        {"positions": positions, "members": {}},
    )


def _seek(history: History, at: float, outcome: str, vchannel: str = V) -> Op:
    value = {"subscription": "g", "vchannel": vchannel, "lsn": 1}
    return _op(history, "positions", "sub_seek", at, at + 0.1, outcome, value)


def _commit(
    history: History,
    member: str,
    generation: int,
    lsn: int,
    start: float,
    outcome: str = OK,
    vchannel: str = V,
) -> Op:
    value = {
        "subscription": "g",
        "member": member,
        "generation": generation,
        "vchannel": vchannel,
        "lsn": lsn,
    }
    return _op(history, member, "sub_commit", start, start + 0.1, outcome, value)


def test_positions_never_go_back_except_through_seek() -> None:
    history, final = _clean()
    _observe(history, 1.0, {V: 5})
    _observe(history, 2.0, {V: 5})
    _observe(history, 3.0, {V: 7})
    assert _kinds(history, final) == []
    _observe(history, 4.0, {V: 3})
    assert _kinds(history, final) == ["position-backwards"]
    # A seek of another vchannel, or one that failed, explains nothing ...
    _seek(history, 3.5, OK, vchannel="other")
    _seek(history, 3.5, FAIL)
    assert _kinds(history, final) == ["position-backwards"]
    # ... one of this vchannel between the two observations does, even of unknown outcome.
    _seek(history, 3.5, UNKNOWN)
    assert _kinds(history, final) == []


def test_an_acknowledged_commit_is_never_lost() -> None:
    history, final = _clean()
    _commit(history, "m1", 10, 6, 1.0)
    _observe(history, 0.5, {V: 2})  # before the commit completed: may not show it
    _observe(history, 2.0, {V: 6})
    assert _kinds(history, final) == []
    history, final = _clean()
    _commit(history, "m1", 10, 6, 1.0)
    _observe(history, 2.0, {V: 4})
    assert _kinds(history, final) == ["position-lost"]
    _seek(history, 1.5, OK)
    assert _kinds(history, final) == []


def test_members_with_overlapping_generations_must_not_both_commit() -> None:
    history, final = _clean()
    _commit(history, "m1", 10, 3, 1.0)
    _commit(history, "m2", 12, 5, 2.0)
    _commit(history, "m1", 10, 6, 3.0, outcome=FAIL)  # fenced: fine
    _commit(history, "m1", 10, 6, 3.0, outcome=UNKNOWN)  # not known to have happened
    _commit(history, "m1", 11, 4, 1.5, vchannel="other")  # another vchannel
    assert _kinds(history, final) == []
    # The old generation still committed after the new one had.
    _commit(history, "m1", 10, 7, 3.5)
    assert _kinds(history, final) == ["member-overlap"]
    # Two members under one generation.
    history, final = _clean()
    _commit(history, "m1", 10, 3, 1.0)
    _commit(history, "m2", 10, 5, 1.05)
    assert _kinds(history, final) == ["member-overlap"]


def _pack(history: History, begin: int, end: int, messages: list, incarnation: int = 1) -> Op:
    positions = {V: [messages[-1][1] if messages else 0, end]}
    return _op(
        history,
        "packs",
        "pack",
        float(end),
        float(end) + 0.1,
        OK,
        {"subscription": "p", "incarnation": incarnation},
        {
            "begin": begin,
            "end": end,
            "start_positions": {V: [0, begin]},
            "end_positions": positions,
            "messages": messages,
        },
    )


def test_complete_packs_in_order_pass() -> None:
    history, final = _clean()
    _pack(history, 0, 25, [[V, 2, 20]])
    _pack(history, 25, 40, [[V, 3, 30], [V, 4, 40]])
    # A new consumer may deliver a range again (at least once), as long as it is complete.
    _pack(history, 25, 40, [[V, 3, 30], [V, 4, 40]], incarnation=2)
    assert _kinds(history, final) == []


@pytest.mark.parametrize(
    ("second", "kinds"),
    [
        ((25, 40, [[V, 3, 30]]), ["pack-incomplete"]),
        ((30, 40, [[V, 4, 40]]), ["pack-order"]),  # a gap after the first pack
        ((25, 40, [[V, 4, 40], [V, 3, 30]]), ["pack-order"]),  # out of order
        ((25, 35, [[V, 3, 30], [V, 4, 40]]), ["pack-order", "pack-uncommitted"]),  # outside
        ((25, 40, [[V, 3, 30], [V, 4, 40], [V, 9, 35]]), ["pack-order", "pack-uncommitted"]),
        ((25, 40, [[V, 3, 30], [V, 3, 30], [V, 4, 40]]), ["pack-duplicate"]),
    ],
)
def test_pack_violations(second: tuple, kinds: list) -> None:
    history, final = _clean()
    _pack(history, 0, 25, [[V, 2, 20]])
    _pack(history, *second)
    assert _kinds(history, final) == kinds


def test_a_majority_of_the_final_replica_set_must_hold_every_committed_entry() -> None:
    history, final = _clean()
    log = final.logs[P]
    final.replica_sets[P] = ("n1", ("n1", "n2", "n4"))
    # Both replicas hold the log (one with a time-tick entry more, read later): fine.
    later = [*log, _entry(5, "", msg_type="time_tick")]
    final.replica_logs[P] = {"n2": list(log), "n4": later}
    assert _kinds(history, final) == []
    # One replica lags and the other is unreadable: only the owner holds everything.
    final.replica_logs[P] = {"n2": log[:2], "n4": "UNAVAILABLE"}
    assert _kinds(history, final) == ["replica-holders"]
    # One holds all, the other holds a different entry at an LSN: a divergent replica.
    other = [*log[:3], _entry(4, "p9:chaos_v0:0", term=2)]
    final.replica_logs[P] = {"n2": list(log), "n4": other}
    assert _kinds(history, final) == ["replica-log"]
