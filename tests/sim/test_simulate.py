"""``raftwal simulate``: the WAL replication protocol on a simulated clock, network and disk.

- one seed is one history: the same seed gives the same trace, byte for byte, within a
  process (whatever ran before it) and across processes;
- a few hundred seeds (what CI runs) find no violation, and their power cuts do drop
  unsynced bytes (a simulation whose crashes never lose anything proves nothing);
- with the fix for a tail recovery run twice at one term reverted (``--mutation
  same-term-recovery``), the simulation finds the divergence it causes on its own, and the
  same seed is clean with the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raftwal.sim.world import SimOptions, run_seed

#: A seed on which the reverted fix shows (found by `raftwal simulate --seed 1 --seeds 3000
#: --mutation same-term-recovery`, see RELIABILITY.md). Any change to the simulation
#: changes its histories: if this stops failing with the mutation, search again and update.
SAME_TERM_SEED = int(os.environ.get("RAFTWAL_SIM_MUTATION_SEED", "0")) or None


def _cli(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_a_seed_is_one_history() -> None:
    first = run_seed(11, SimOptions())
    run_seed(12, SimOptions())  # whatever ran in between
    again = run_seed(11, SimOptions())
    assert first.digest == again.digest
    assert first.trace == again.trace
    assert (first.crashes, first.acknowledged) == (again.crashes, again.acknowledged)
    assert first.acknowledged > 0 and first.crashes > 0


def test_a_seed_is_one_history_across_processes() -> None:
    runs = [_cli("--seed", "21", "--seeds", "3", "--json", timeout_s=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
    summaries = [json.loads(run.stdout) for run in runs]
    for summary in summaries:
        summary.pop("elapsed_s")
        summary.pop("seeds_per_minute")
    assert summaries[0] == summaries[1]


def test_a_few_hundred_seeds_find_no_violation_and_drop_unsynced_bytes() -> None:
    run = _cli("--seeds", "300", "--seed", "1000", "--json", timeout_s=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads(run.stdout)
    assert summary["seeds"] == 300
    assert summary["violations"] == 0
    assert summary["power_cuts_dropping_bytes"] > 0 and summary["dropped_bytes"] > 0
    assert summary["acknowledged_writes"] > 1000


def test_the_simulation_finds_a_recovery_run_twice_at_one_term() -> None:
    seed = SAME_TERM_SEED or MUTATION_SEED
    broken = run_seed(seed, SimOptions(mutations=("same-term-recovery",)))
    assert not broken.ok, "the reverted fix no longer shows on this seed: search again"
    assert any("differs" in v or "lost" in v for v in broken.violations), broken.violations
    fixed = run_seed(seed, SimOptions())
    assert fixed.ok, fixed.violations


def test_the_cli_prints_the_seed_and_the_trace_of_a_failure() -> None:
    seed = SAME_TERM_SEED or MUTATION_SEED
    run = _cli(
        "--seed", str(seed), "--seeds", "1", "--mutation", "same-term-recovery", timeout_s=300
    )
    assert run.returncode == 1
    assert f"seed {seed}:" in run.stdout
    assert "VIOLATION" in run.stdout
    assert f"raftwal simulate --seed {seed} --seeds 1 --mutation same-term-recovery" in run.stdout


def test_bad_arguments_are_refused_with_what_was_expected() -> None:
    run = _cli("--seeds", "0", timeout_s=120)
    assert run.returncode == 2 and "expected >= 1" in run.stderr
    run = _cli("--mutation", "nope", timeout_s=120)
    assert run.returncode == 2 and "same-term-recovery" in run.stderr


@pytest.mark.slow
def test_a_long_run_finds_no_violation() -> None:
    run = _cli("--seeds", "5000", "--seed", "100000", "--json", timeout_s=7200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert json.loads(run.stdout)["violations"] == 0


MUTATION_SEED = 365
