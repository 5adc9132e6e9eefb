"""``raftwal chaos --replicate`` (raftwal.chaos.replicate): two real three-node clusters,
source -> target, a producing workload on the source and owner kills, pauses, a
partition between the clusters and restarts on both sides. The run must find no
violation and must have done something (faults of several kinds, produces and
transactions acknowledged); ``-m slow`` runs it for 5 minutes. A run of mid-pipeline
kills alone (the replicator's node and the target owner, each with batches in flight)
checks the pipeline.

The checker itself is shown to catch a duplicate, a gap and a split transaction."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from raftwal.chaos.checker import LogEntry
from raftwal.chaos.replicate import (
    FAULTS,
    MID_PIPELINE_FAULTS,
    ReplicateReport,
    check_logs,
    run_replicate_chaos,
)

SEED = int(os.environ.get("RAFTWAL_CHAOS_SEEDS", "20261128").split(",")[0])


def _run(
    tmp_path: Path, duration_s: float, kinds: tuple[str, ...] = FAULTS, max_lag_ms: int = 0
) -> ReplicateReport:
    report = run_replicate_chaos(
        SEED, duration_s, tmp_path, rate_per_s=40.0, progress=print, kinds=kinds,
        max_lag_ms=max_lag_ms,
    )  # fmt: skip
    for fault in report.faults:
        print(fault)
    assert not report.violations, (SEED, report.violations)
    ran = {f["kind"] for f in report.faults}
    # Faults really ran: at least one per 12 s, of several kinds, and traffic went through.
    assert len(report.faults) >= max(3, int(duration_s / 12)), report.faults
    assert len(ran) >= min(3, len(kinds)), ran
    assert report.acked > 100 and report.txns_committed > 5, report.as_json()
    assert sum(report.source_entries.values()) >= report.acked
    return report


@pytest.mark.cluster
def test_replicate_chaos_short(tmp_path: Path) -> None:
    _run(tmp_path, 40.0)


@pytest.mark.cluster
def test_replicate_chaos_kills_mid_pipeline(tmp_path: Path) -> None:
    """Only mid-pipeline kills: the replicator's node, and the target owner holding its
    batches uncommitted, each killed with at least two batches in flight; nothing lost or
    duplicated, and no checkpoint recorded in Raft ahead of what the target held. The
    source runs with flow control (a 300 ms bound), so its owners also hold client writes
    while the target catches up after a kill: holding loses and repeats nothing either."""
    report = _run(tmp_path, 45.0, MID_PIPELINE_FAULTS, max_lag_ms=300)
    deep = {f["kind"] for f in report.faults if f.get("inflight_batches", 0) >= 2}
    assert deep == set(MID_PIPELINE_FAULTS), report.faults
    assert report.checkpoint_checks >= len(report.faults), report.as_json()
    held = [
        path.name
        for path in (tmp_path / "source").glob("n*.log")
        if "holding client writes" in path.read_text(errors="replace")
    ]
    assert held, "flow control never held a write"


@pytest.mark.cluster
@pytest.mark.slow
def test_replicate_chaos_five_minutes(tmp_path: Path) -> None:
    report = _run(tmp_path, 300.0)
    assert {f["kind"] for f in report.faults} == set(FAULTS)


def _entry(lsn: int, key: str, vchannel: str = "v") -> LogEntry:
    return LogEntry(lsn, 1, lsn, vchannel, "message", key, 0, f"d{key}")


def test_the_checker_finds_duplicates_gaps_and_split_transactions() -> None:
    source = [_entry(1, "p:0"), _entry(2, "t:1:0/2"), _entry(3, "t:1:1/2"), _entry(4, "p:1")]
    rng = random.Random(SEED)
    assert check_logs({"c": source}, {"c": list(source)}, {"p:0", "p:1"}, {"t:1": 2}) == []
    duplicate = [*source, _entry(5, "p:1")]
    assert any("twice" in p for p in check_logs({"c": source}, {"c": duplicate}, set(), {}))
    dropped = rng.choice(["p:0", "p:1"])
    gap = [e for e in source if e.key != dropped]
    assert any("differs" in p for p in check_logs({"c": source}, {"c": gap}, set(), {}))
    split = [source[0], source[1], source[3], source[2]]
    found = check_logs({"c": source}, {"c": split}, set(), {})
    assert any("not whole" in p for p in found), found
    assert any("acknowledged" in p for p in check_logs({"c": source}, {"c": source}, {"p:9"}, {}))
