"""The simulation's mutation suite: deliberate bugs declared beside the code they break
(``wal_segments.mutations``), each of which ``raftwal simulate`` must find on its own.

- every declared mutation is still asked for (``mutations.active``) in the module that
  declared it, so a refactor cannot silently orphan a switch;
- every declared mutation has a known seed, found from ``--seed 1`` within the budget
  (`SEED_BUDGET`), and that seed shows a violation with the mutation and none without it
  (the default suite replays only these seeds: fast);
- the slow tier searches again from seed 1 for each mutation and checks it is found
  within the budget.

Any change to the simulation (or to the code under test) changes its histories: when a
known seed stops showing its mutation, search again (`raftwal simulate --seed 1 --seeds
1000 --mutation NAME`) and update `KNOWN_SEEDS` and the table in RELIABILITY.md.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from raftwal.sim.world import SimOptions, known_mutations, run_seed
from tests.wal.test_wal_log import Node, check_heartbeat_fences, check_resend_reports_its_batch_end
from wal_segments import mutations

#: Each mutation must be found within this many seeds from seed 1 (issue 50).
SEED_BUDGET = 1000

#: The first seed from 1 on which each mutation shows (`raftwal simulate --seed 1 --seeds
#: 1000 --mutation NAME`); see RELIABILITY.md for how often each shows.
KNOWN_SEEDS: dict[str, int] = {
    "accept-stale-term": 228,
    "ack-one-replica": 6,
    "adopt-shortest-log": 10,
    "best-log-by-lsn": 21,
    "catalog-no-sync": 410,
    "count-old-term": 397,
    "fence-in-memory": 2,
    "keep-partial-txn": 4,
    "match-by-last-lsn": 763,
    "no-stable-quorum": 117,
    "non-atomic-batch": 78,
    "owner-early-durable": 59,
    "replica-commit-unmatched": 1,
    "replica-early-durable": 53,
    "retry-failed-fsync": 19,
    "same-term-recovery": 472,
    "self-fence-majority": 3,
    "shared-sync-once": 379,
    "skip-log-matching": 75,
    "skip-producer-rebuild": 2,
}

#: Mutations the simulation did not find within the budget when last searched: gaps in
#: the world, named here so that they stay visible (RELIABILITY.md, "The mutation
#: suite"). A mutation leaves this list once a seed finds it.
KNOWN_GAPS: dict[str, str] = {}

#: Mutations no history can show, because another rule masks them (defence in depth):
#: each breaks one of two independent rules that keep a replica from vouching for a
#: divergent tail beyond what a newer owner sent it, and the other rule alone makes that
#: tail impossible (RELIABILITY.md, "Masked mutations"). A mutation testing tool calls
#: such a change an equivalent mutant. Each is caught by a deterministic check instead,
#: which `test_a_masked_mutation_fails_its_check` runs with the mutation on.
MASKED: dict[str, tuple[str, Callable[[Node], Awaitable[None]]]] = {
    "heartbeat-no-fence": (
        "a divergent tail also needs a resend reported durable to the log's end",
        check_heartbeat_fences,
    ),
    "resend-durable-to-end": (
        "once a newer owner has any answer from a replica, the replica is fenced (a heartbeat "
        "too), so what the replica holds beyond a resent batch is the newer owner's own",
        check_resend_reports_its_batch_end,
    ),
}


def _switch_names(module_name: str) -> dict[str, str]:
    """Module-level constants bound to ``mutations.declare("name", ...)``: constant ->
    name."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    names: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "declare"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node.value.args[0].value
    return names


def _asked_for(module_name: str) -> set[str]:
    """The mutation names a module passes to ``mutations.active`` (by constant or by
    string)."""
    constants = _switch_names(module_name)
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    asked: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "active"
            and node.args
        ):
            argument = node.args[0]
            if isinstance(argument, ast.Name) and argument.id in constants:
                asked.add(constants[argument.id])
            elif isinstance(argument, ast.Constant):
                asked.add(argument.value)
    return asked


def test_the_suite_has_a_dozen_mutations_at_least() -> None:
    declared = known_mutations()
    assert len(declared) >= 12, sorted(declared)
    # The changes the issue found unnoticed, each among them.
    assert {
        "self-fence-majority",
        "ack-one-replica",
        "replica-early-durable",
        "adopt-shortest-log",
        "same-term-recovery",
        "accept-stale-term",
        "owner-early-durable",
        "no-stable-quorum",
        "best-log-by-lsn",
        "count-old-term",
    } <= set(declared)


def test_every_mutation_is_asked_for_in_the_module_that_declares_it() -> None:
    known_mutations()  # imports every module with switches
    for mutation in mutations.declared().values():
        assert mutation.name in _asked_for(mutation.module), (
            f"mutation {mutation.name!r} is declared in {mutation.module} but never asked "
            "for there (mutations.active): its switch was orphaned"
        )


def test_every_mutation_has_a_known_seed_within_its_budget() -> None:
    declared = set(known_mutations())
    assert not set(KNOWN_SEEDS) & set(KNOWN_GAPS)
    assert not set(KNOWN_SEEDS) & set(MASKED)
    assert not set(KNOWN_GAPS) & set(MASKED)
    missing = sorted(declared - set(KNOWN_SEEDS) - set(KNOWN_GAPS) - set(MASKED))
    assert not missing, (
        f"no known seed for {missing}: run `raftwal simulate --seed 1 --seeds {SEED_BUDGET} "
        "--mutation NAME` for each and add the first failing seed to KNOWN_SEEDS"
    )
    assert not sorted(set(KNOWN_SEEDS) - declared), "KNOWN_SEEDS names undeclared mutations"
    assert not sorted(set(KNOWN_GAPS) - declared), "KNOWN_GAPS names undeclared mutations"
    assert not sorted(set(MASKED) - declared), "MASKED names undeclared mutations"
    for name, seed in KNOWN_SEEDS.items():
        assert 1 <= seed <= SEED_BUDGET, (name, seed)


@pytest.mark.parametrize("name", sorted(KNOWN_SEEDS))
def test_the_simulation_finds_each_mutation_at_its_seed(name: str) -> None:
    seed = KNOWN_SEEDS[name]
    broken = run_seed(seed, SimOptions(mutations=(name,)))
    assert not broken.ok, (
        f"{name} no longer shows at seed {seed}: search again (`raftwal simulate --seed 1 "
        f"--seeds {SEED_BUDGET} --mutation {name}`) and update KNOWN_SEEDS"
    )
    fixed = run_seed(seed, SimOptions())
    assert fixed.ok, fixed.violations


@pytest.mark.parametrize("name", sorted(MASKED))
async def test_a_masked_mutation_fails_its_check(name: str, tmp_path: Path) -> None:
    _, check = MASKED[name]
    for mutated in (False, True):
        root = tmp_path / f"mutated-{mutated}"
        root.mkdir(mode=0o700)
        node = Node(root)
        await node.open()
        try:
            if not mutated:
                await check(node)
                continue
            with (
                mutations.enabled([name]),
                pytest.raises((AssertionError, pytest.fail.Exception)),
            ):
                await check(node)
        finally:
            await node.close()


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_every_mutation_is_found_from_seed_1_within_the_budget() -> None:
    late = {}
    for name in sorted(set(known_mutations()) - set(KNOWN_GAPS) - set(MASKED)):
        for seed in range(1, SEED_BUDGET + 1):
            if not run_seed(seed, SimOptions(mutations=(name,))).ok:
                break
        else:
            late[name] = "not found"
    assert not late, late
