"""The disk faults of ``raftwal chaos``: a disk that fills up, a slow one, failing fsyncs.

Lives here: the fault kinds (`DISK_FAULT_KINDS`: ``disk-full``, ``slow-disk``,
``fsync-error``), how a planned fault picks its variant, `DiskNemesis`, which injects them
through the PowerFS mounts every node's data dir sits on during such a run
(``raftwal.chaos.powerfs``, `PowerMount.set_faults`) and heals them, and `fault_costs`,
the seconds each fault cost the producers in failed or refused writes.

- ``disk-full`` on the Raft leader, a pchannel's owner, a random node or all of them: the
  mount's byte budget is set just above what the node holds (``hard``: 1 MiB left, past
  the node's hard watermark: produce refused) or exactly at it (``full``: the next write
  that needs space meets ENOSPC, Raft lives on its reserve). Healed by lifting the budget.
- ``slow-disk`` on the leader, an owner or a random node: every fsync of the node takes
  100 ms, 500 ms or 2 s for the hold.
- ``fsync-error`` on the leader, an owner or a random node: the node's next one to three
  fsyncs of WAL segments (``wal``), or of any file (``any``: the Raft journal and SQLite
  too), fail with EIO and lose the writes they covered. A node that stops on it (a Raft
  journal that cannot sync exits, to be restarted from its durable state) is started
  again when the fault is healed, as a supervisor would.

The checker is the same as for every fault: nothing acknowledged lost or duplicated,
locks linearizable.

Must never: import FUSE before a disk fault runs (``raftwal.chaos.powerfs`` is imported by
the runner only when a fault kind needs the mounts), signal a process the run did not
start, or leave a fault in force after `heal`.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raftwal.chaos.powerfs import PowerMount
    from raftwal.chaos.workload import History
    from raftwal.cli import dev

DISK_FAULT_KINDS = ("disk-full", "slow-disk", "fsync-error")
#: Seconds a disk fault is held (the runner's HOLD_S takes these).
DISK_HOLD_S = {
    "disk-full": (3.0, 8.0),
    "slow-disk": (4.0, 10.0),
    "fsync-error": (2.0, 6.0),
}
DISK_TARGETS = ("leader", "owner", "random")
FULL_TARGETS = (*DISK_TARGETS, "all")
FULL_MODES = ("hard", "full")
SLOW_FSYNC_MS = (100, 500, 2000)
FSYNC_ERROR_SCOPES = ("wal", "any")
#: disk-full "hard": what is left under the budget (past any hard watermark's floor)
HARD_LEFT_BYTES = 1 << 20
#: A mount with no budget (a disk fault healed).
NO_BUDGET = 0
#: fault_costs: the buckets writes are judged in, and how long after a fault's heal its
#: cost is still counted (what it left behind: a recovery, a move, retried writes)
COST_BUCKET_S = 0.5
COST_AFTER_HEAL_S = 10.0


def plan_variant(kind: str, rng: random.Random) -> tuple[str, str]:
    """(variant, mode) of a planned disk fault: its target, and how it hits it."""
    if kind == "disk-full":
        return rng.choice(FULL_TARGETS), rng.choice(FULL_MODES)
    if kind == "slow-disk":
        return rng.choice(DISK_TARGETS), f"{rng.choice(SLOW_FSYNC_MS)}ms"
    assert kind == "fsync-error", kind
    return rng.choice(DISK_TARGETS), rng.choice(FSYNC_ERROR_SCOPES)


@dataclass
class DiskFaultFigures:
    """What the disk faults did, summed over the run (from the mounts' own counts)."""

    #: writes the filesystems refused for lack of space
    enospc: int = 0
    #: fsyncs that failed with EIO, and fsyncs slowed down
    failed_fsyncs: int = 0
    delayed_fsyncs: int = 0
    #: nodes started again after a disk fault stopped them
    restarts: int = 0
    #: node id -> the counts last read from its mount (each mount counts from its start)
    last: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, node_id: str, report: Mapping[str, Any]) -> None:
        before = self.last.get(node_id, {})
        now = {
            key: int(report.get(key, 0)) for key in ("enospc", "failed_fsyncs", "delayed_fsyncs")
        }
        self.enospc += max(0, now["enospc"] - before.get("enospc", 0))
        self.failed_fsyncs += max(0, now["failed_fsyncs"] - before.get("failed_fsyncs", 0))
        self.delayed_fsyncs += max(0, now["delayed_fsyncs"] - before.get("delayed_fsyncs", 0))
        self.last[node_id] = now


Target = Callable[[str, int], Awaitable[tuple[str, str]]]


class DiskNemesis:
    """Injects and heals disk faults on `mounts` (node id -> PowerMount of its data dir)."""

    def __init__(self, cluster: dev.LocalCluster, mounts: Mapping[str, PowerMount]) -> None:
        self.cluster = cluster
        self.mounts = dict(mounts)
        self.figures = DiskFaultFigures()
        #: nodes whose mount has a fault in force
        self.faulty: set[str] = set()
        #: disk faults injected so far (a run without any leaves every node alone)
        self.injected = 0

    async def inject(
        self, kind: str, variant: str, mode: str, pick: int, target: Target
    ) -> tuple[list[str], str]:
        """Apply one disk fault; returns (the nodes hit, what was done)."""
        if kind == "disk-full" and variant == "all":
            nodes = sorted(self.mounts)
            why = {n: "every node" for n in nodes}
        else:
            node, reason = await target(variant, pick)
            nodes, why = [node], {node: reason}
        parts = []
        for node in nodes:
            mount = self.mounts[node]
            if kind == "disk-full":
                used = int((await asyncio.to_thread(mount.usage))["used_bytes"])
                budget = used + (HARD_LEFT_BYTES if mode == "hard" else 0)
                await asyncio.to_thread(mount.set_faults, budget_bytes=max(1, budget))
                parts.append(
                    f"{node} ({why[node]}) filled: {used} bytes held, budget "
                    f"{max(1, budget)} ({mode})"
                )
            elif kind == "slow-disk":
                delay_ms = int(mode.removesuffix("ms"))
                await asyncio.to_thread(mount.set_faults, fsync_delay_ms=delay_ms)
                parts.append(f"{node} ({why[node]}): every fsync {delay_ms} ms")
            else:
                count = 1 + pick % 3
                match = "/wal/" if mode == "wal" else ""
                await asyncio.to_thread(mount.set_faults, fsync_errors=count, match=match)
                scope = "WAL segment" if mode == "wal" else "any"
                parts.append(f"{node} ({why[node]}): the next {count} {scope} fsyncs fail (EIO)")
            self.faulty.add(node)
        self.injected += 1
        return nodes, "; ".join(parts)

    async def heal(self) -> list[str]:
        """Lift every disk fault in force; start again a node a fault stopped. Returns what
        was restarted (for the progress line)."""
        restarted = []
        for node in sorted(self.faulty):
            mount = self.mounts[node]
            report = await asyncio.to_thread(mount.set_faults)
            self.figures.add(node, report)
        self.faulty.clear()
        if not self.injected:
            return restarted
        for node in sorted(self.mounts):
            process = self.cluster.processes.get(node)
            if process is not None and process.poll() is not None:
                # It stopped on its own (a Raft journal whose fsync failed exits with 70):
                # what a supervisor would do.
                self.cluster.processes[node] = None
                await asyncio.to_thread(self.cluster.start_node, node)
                self.figures.restarts += 1
                restarted.append(f"{node} (exited {process.poll()})")
        return restarted


def fault_costs(
    records: Sequence[Any],
    history: History,
    vchannel_pchannel: Mapping[str, str],
    run_end_s: float,
) -> dict[int, float]:
    """Seconds each fault (by its position in `records`) cost in failed or refused writes,
    summed over the pchannels: per pchannel, the buckets of `COST_BUCKET_S` from the
    fault's start to `COST_AFTER_HEAL_S` after its heal (or the next fault's start, or the
    end of the run, whichever comes first) in which messages were submitted to it and
    none of them was acknowledged. A fault that stopped one pchannel of three for 4 s
    costs 4 s; one that stopped all three, 12 s."""
    submitted: set[tuple[str, int]] = set()
    acked: set[tuple[str, int]] = set()
    for op in history.ops:
        if op.kind != "produce":
            continue
        pchannel = vchannel_pchannel.get(op.value.get("vchannel", ""), "")
        bucket = (pchannel, math.floor(op.invoke_s / COST_BUCKET_S))
        submitted.add(bucket)
        if op.outcome == "ok":
            acked.add(bucket)
    failing = submitted - acked
    costs: dict[int, float] = {}
    starts = [record.start_s for record in records]
    for index, record in enumerate(records):
        end = (record.end_s or record.start_s) + COST_AFTER_HEAL_S
        if index + 1 < len(starts):
            end = min(end, starts[index + 1])
        end = min(end, run_end_s)
        first, last = math.floor(record.start_s / COST_BUCKET_S), math.ceil(end / COST_BUCKET_S)
        costs[index] = COST_BUCKET_S * sum(1 for _, bucket in failing if first <= bucket < last)
    return costs


def costs_by_kind(records: Iterable[Any]) -> dict[str, float]:
    """Total cost_s per fault kind (records carry their own `cost_s`)."""
    totals: dict[str, float] = {}
    for record in records:
        totals[record.kind] = round(totals.get(record.kind, 0.0) + record.cost_s, 1)
    return totals
