"""``raftwal simulate``: run seeds of the deterministic simulation of the WAL replication
protocol (``raftwal.sim``) and report what they found.

``raftwal simulate --seeds N [--seed S] [--json]`` runs seeds S, S+1, ... S+N-1 (S is
random, and printed, when not given). A violation prints its seed, what was violated and
the trace of the events that led to it; ``--seed S --seeds 1`` replays that one history.
``--mutation NAME`` switches on one of the deliberate bugs declared beside the code they
break (``wal_segments.mutations``; ``--list-mutations`` names them) to show that the
simulation finds it on its own.

The run re-executes itself with ``PYTHONHASHSEED=0`` so that a seed gives the same
history in every process, not only within one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HASH_SEED = "0"


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate",
        help="deterministic simulation of WAL replication: crashes, power cuts, partitions",
        description=(
            "Run the real owner, log, replication and streaming code on a simulated clock, "
            "network, disk and Raft, with producers that retry, transactions and consumers; "
            "each seed is one reproducible history, checked for lost or duplicated "
            "acknowledged writes, torn transactions, reads taken back, diverging committed "
            "logs, and terms or time ticks going back."
        ),
    )
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (default: 100)")
    parser.add_argument("--seed", type=int, default=None, help="the first seed (default: random)")
    parser.add_argument("--json", action="store_true", help="one JSON summary on stdout")
    parser.add_argument(
        "--mutation",
        action="append",
        default=[],
        help="switch on a deliberate bug to check the simulation finds it (see --list-mutations)",
    )
    parser.add_argument(
        "--list-mutations",
        action="store_true",
        help="print the mutations --mutation takes, with what each breaks, and exit",
    )
    parser.add_argument("--nodes", type=int, default=4, help="nodes per history (default: 4)")
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="virtual seconds of faults per seed (default: the simulation's)",
    )
    parser.add_argument(
        "--trace-lines", type=int, default=120, help="trace lines shown per failure (default: 120)"
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="run every seed even after a violation (default: stop at the first)",
    )
    parser.set_defaults(handler=_command)


def _command(args: argparse.Namespace) -> int:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        environment = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        argv = [sys.executable, "-m", "raftwal.cli", *sys.argv[1:]]
        os.execve(sys.executable, argv, environment)
    from raftwal.sim.world import SimOptions, known_mutations, run_seed

    MUTATIONS = known_mutations()
    if args.list_mutations:
        for name, description in MUTATIONS.items():
            print(f"{name:<26} {description}")
        return 0

    if args.seeds < 1:
        print(f"invalid --seeds ({args.seeds}; expected >= 1)", file=sys.stderr)
        return 2
    if not 3 <= args.nodes <= 7:
        print(f"invalid --nodes ({args.nodes}; expected 3..7)", file=sys.stderr)
        return 2
    unknown = sorted(set(args.mutation) - set(MUTATIONS))
    if unknown:
        print(f"invalid --mutation {unknown} (expected one of {list(MUTATIONS)})", file=sys.stderr)
        return 2
    first = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    options = SimOptions(nodes=args.nodes, mutations=tuple(args.mutation))
    if args.duration is not None:
        options = SimOptions(
            nodes=args.nodes, mutations=tuple(args.mutation), duration_s=args.duration
        )
    counters = (
        "crashes",
        "power_cuts",
        "power_cuts_dropping",
        "dropped_bytes",
        "acknowledged",
        "duplicates",
        "read",
        "failovers",
        "leader_changes",
        "late_proposals",
        "buggified",
        "sync_failures",
        "rolling_upgrades",
        "brownouts",
        "split_brains",
    )
    totals: dict[str, Any] = {
        "first_seed": first,
        "seeds": 0,
        "violations": 0,
        "failed_seeds": [],
        "crashes": 0,
        "power_cuts": 0,
        "power_cuts_dropping_bytes": 0,
        "dropped_bytes": 0,
        "acknowledged_writes": 0,
        "duplicate_answers": 0,
        "entries_read": 0,
        "failovers": 0,
        "leader_changes": 0,
        "late_proposals": 0,
        "buggified": 0,
        "fsync_failures": 0,
        "rolling_upgrades": 0,
        "brownouts": 0,
        "split_brains": 0,
        "virtual_s": 0.0,
        "mutations": list(args.mutation),
    }
    started = time.monotonic()
    if not args.json:
        print(f"raftwal simulate: seeds {first}..{first + args.seeds - 1}", file=sys.stderr)
    for seed in range(first, first + args.seeds):
        result = run_seed(seed, options)
        totals["seeds"] += 1
        names = {
            "power_cuts_dropping": "power_cuts_dropping_bytes",
            "acknowledged": "acknowledged_writes",
            "duplicates": "duplicate_answers",
            "read": "entries_read",
            "sync_failures": "fsync_failures",
        }
        for counter in counters:
            totals[names.get(counter, counter)] += getattr(result, counter)
        totals["virtual_s"] += result.virtual_s
        if not result.ok:
            totals["violations"] += len(result.violations)
            totals["failed_seeds"].append(seed)
            out = sys.stderr if args.json else sys.stdout
            print(f"\nseed {seed}: {len(result.violations)} violation(s)", file=out)
            for violation in result.violations[:10]:
                print(f"  - {violation}", file=out)
            print(f"trace (last {args.trace_lines} events):", file=out)
            for line in result.trace[-args.trace_lines :]:
                print(f"  {line}", file=out)
            print(
                f"replay: raftwal simulate --seed {seed} --seeds 1"
                + "".join(f" --mutation {m}" for m in args.mutation),
                file=out,
            )
            if not args.keep_going:
                break
    elapsed = time.monotonic() - started
    totals["elapsed_s"] = round(elapsed, 2)
    totals["seeds_per_minute"] = round(totals["seeds"] / elapsed * 60, 1) if elapsed else 0.0
    totals["virtual_s"] = round(totals["virtual_s"], 1)
    if args.json:
        print(json.dumps(totals, sort_keys=True))
    else:
        print(
            f"{totals['seeds']} seeds, {totals['violations']} violations, "
            f"{totals['crashes']} crashes ({totals['power_cuts']} power cuts, "
            f"{totals['power_cuts_dropping_bytes']} of them dropping "
            f"{totals['dropped_bytes']} unsynced bytes), "
            f"{totals['acknowledged_writes']} acknowledged writes "
            f"({totals['duplicate_answers']} batches answered as duplicates), "
            f"{totals['entries_read']} entries read, {totals['failovers']} assignments, "
            f"{totals['leader_changes']} Raft leaders, "
            f"{totals['virtual_s']:.0f} virtual s in {elapsed:.1f} s "
            f"({totals['seeds_per_minute']:.0f} seeds/min)"
        )
    return 1 if totals["violations"] else 0
