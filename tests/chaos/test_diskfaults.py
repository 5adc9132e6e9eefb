"""The disk faults of `raftwal chaos` (raftwal/chaos/diskfaults.py): how they are planned
and what a fault cost the producers. The faults themselves run against real mounts in the
disk-fault chaos run (tests/chaos/test_chaos.py) and the cluster tests of
tests/cluster/test_disks.py."""

from __future__ import annotations

from raftwal.chaos.diskfaults import (
    DISK_FAULT_KINDS,
    DISK_TARGETS,
    FSYNC_ERROR_SCOPES,
    FULL_MODES,
    FULL_TARGETS,
    SLOW_FSYNC_MS,
    costs_by_kind,
    fault_costs,
)
from raftwal.chaos.runner import HOLD_S, ChaosOptions, FaultRecord, plan_faults
from raftwal.chaos.workload import OK, UNKNOWN, History, Op


def test_disk_faults_are_planned_with_their_targets_and_modes() -> None:
    ChaosOptions(seed=1, faults=(*DISK_FAULT_KINDS, "kill")).validate()
    plan = plan_faults(11, DISK_FAULT_KINDS, 600.0)
    assert plan == plan_faults(11, DISK_FAULT_KINDS, 600.0)
    assert {f.kind for f in plan[:3]} == set(DISK_FAULT_KINDS)
    for fault in plan:
        low, high = HOLD_S[fault.kind]
        assert low <= fault.hold_s <= high
        assert fault.label == f"{fault.kind}:{fault.variant}/{fault.mode}"
        if fault.kind == "disk-full":
            assert fault.variant in FULL_TARGETS and fault.mode in FULL_MODES
        elif fault.kind == "slow-disk":
            assert fault.variant in DISK_TARGETS
            assert int(fault.mode.removesuffix("ms")) in SLOW_FSYNC_MS
        else:
            assert fault.variant in DISK_TARGETS and fault.mode in FSYNC_ERROR_SCOPES
    modes = {(f.kind, f.mode) for f in plan}
    assert ("disk-full", "full") in modes and ("slow-disk", "2000ms") in modes


def _produce(history: History, at_s: float, vchannel: str, outcome: str) -> None:
    op = Op(len(history.ops), "p0", "produce", at_s, {"vchannel": vchannel, "key": str(at_s)})
    op.outcome = outcome
    history.ops.append(op)


def test_a_fault_costs_the_seconds_its_pchannels_took_no_write() -> None:
    history = History()
    pchannels = {"v0": "p0", "v1": "p1"}
    for tenth in range(0, 400):
        at = tenth / 10
        # p0 takes nothing from 10 s to 14 s; p1 nothing from 12 s to 13 s.
        _produce(history, at, "v0", UNKNOWN if 10 <= at < 14 else OK)
        _produce(history, at, "v1", UNKNOWN if 12 <= at < 13 else OK)
    records = [
        FaultRecord("disk-full:owner/full", "disk-full", ["n1"], "", 9.0, 13.0),
        FaultRecord("slow-disk:leader/2000ms", "slow-disk", ["n2"], "", 30.0, 35.0),
    ]
    costs = fault_costs(records, history, pchannels, 40.0)
    assert costs == {0: 4.0 + 1.0, 1: 0.0}
    records[0].cost_s, records[1].cost_s = costs[0], costs[1]
    assert costs_by_kind(records) == {"disk-full": 5.0, "slow-disk": 0.0}
