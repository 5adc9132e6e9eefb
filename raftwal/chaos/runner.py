"""``raftwal chaos``: a Jepsen-style nemesis run against a real three-node cluster.

``run_chaos(ChaosOptions)`` starts three ``raftwal node`` processes on 127.0.0.1 (small
segments, so that segments seal and commit during the run), every node-to-node link
through its own TCP proxy (``raftwal.chaos.net``), and for ``duration_s`` runs at once

- the workload (``raftwal.chaos.workload``): idempotent producers on several vchannels of
  several pchannels, a consumer per vchannel, lock clients with leases, broadcasters with
  resource keys, and a status sampler; every operation goes into one ``History``;
- the nemesis: a schedule drawn from ``random.Random(seed)`` of the requested fault kinds,
  one at a time, each held for a bounded random time and then healed:
  ``kill`` (SIGKILL a node, start it again later), ``pause`` (SIGSTOP, later SIGCONT),
  ``restart`` (SIGTERM, start again at once), ``worker`` (SIGKILL one data worker process
  of a node, the one serving a pchannel's owner where it can: its supervisor starts it
  again while the node's control process runs on) and ``partition`` (isolate the Raft leader,
  isolate a pchannel's owner, a minority/majority split, or a bridge where two nodes lose
  each other but both still see the third; links reset or silently dropped), and, asked
  for by name, ``power`` (a power cut: SIGKILL, then every byte and directory entry the
  node had not fsynced is dropped from its data dir, see ``raftwal.chaos.powerfs``; of the
  Raft leader, a pchannel's owner, a replica that is not the owner, or two nodes at once,
  started again after the hold). With ``power`` among the faults every node's data dir
  is a PowerFS mount for the whole run.
- asked for by name too, the disk faults of ``raftwal.chaos.diskfaults`` on those mounts:
  ``disk-full`` (a node's disk fills up, to past its hard watermark or to the last
  byte), ``slow-disk`` (every fsync 100 ms, 500 ms or 2 s) and ``fsync-error`` (the next
  fsyncs fail with EIO and lose what they covered). The report gives, for every fault,
  the seconds it cost the producers in failed or refused writes (``cost_s``).

Then it heals everything, lets the workload finish what it started, waits until the
cluster has recovered, reads the final state (each pchannel's whole committed log, the
segment manifest, every replica's segment files, the replicas' state digests, and
optionally a Spark read of the committed segments) and hands it all to
``raftwal.chaos.checker``. The ``ChaosReport`` says what ran (operations by kind and
outcome, faults by kind), the violations found and the seed that replays the schedule.

Must never: signal a process it did not start (every signal goes to a pid of this run's
``LocalCluster``), leave a node, a proxy or a paused process behind (everything is healed
and stopped in ``finally``), or wait without a bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from raftwal.chaos.checker import (
    FinalState,
    SegmentFileCheck,
    SegmentInfo,
    Violation,
    check,
)
from raftwal.chaos.diskfaults import (
    DISK_FAULT_KINDS,
    DISK_HOLD_S,
    DiskFaultFigures,
    DiskNemesis,
    costs_by_kind,
    fault_costs,
    plan_variant,
)
from raftwal.chaos.net import LINK_MODES, ProxyNet
from raftwal.chaos.observe import _status, read_log, wait_recovered
from raftwal.chaos.subscribers import MemberClient, PackClient, PositionSampler, ShardClient
from raftwal.chaos.workload import (
    OK,
    BroadcastClient,
    ConsumerClient,
    History,
    LockClient,
    ProducerClient,
    StatusSample,
    StatusSampler,
    gather_bounded,
)
from raftwal.cli import dev
from rpc.client import CoordinatorClient, RaftwalError
from rpc.membership import MembershipTimeout, demote, promote
from rpc.placement import serving_address
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from rpc.streaming_client import StreamingClient
from wal_segments.segment import SegmentReader, segment_file_name

if TYPE_CHECKING:
    # Imported where a "power" fault needs it: PowerFS loads libfuse3 when imported, and
    # every other fault (and `--help`) must work on a machine without it.
    from raftwal.chaos.powerfs import PowerMount

FAULT_KINDS = ("kill", "pause", "partition", "restart", "worker")
# "worker": kill -9 one data worker process of a node (the one serving a pchannel's owner,
# for the "owner" target); its supervisor starts it again and its pchannels recover at
# term + 1, while the node's control process (Raft) runs on.
# Asked for by name only: "outage", a node killed for longer than replica_replace_after_ms,
# so that replica repair replaces it while the workload runs (with a node outside the
# sets); "member", a voter replaced by a data node (`raftwal member add` of a data node,
# then `member remove` of a voter: drained, removed, restarted as a data node; unfrozen
# when the fault is healed, so it can come back later). "member" needs a data node.
# "power", a power cut (raftwal.chaos.powerfs: every node's data dir on a FUSE mount that
# drops what was not fsynced), needs FUSE.
# "nats-kill" and "nats-pause" (with --wal jetstream): the run's nats-server killed with
# SIGKILL (started again on the same port and store) or paused with SIGSTOP.
NATS_FAULT_KINDS = ("nats-kill", "nats-pause")
EXTRA_FAULT_KINDS = ("outage", "member", "power", *DISK_FAULT_KINDS, *NATS_FAULT_KINDS)
#: The WAL implementations a run's pchannels can be on (`--wal`).
WAL_NAMES = ("segments", "local", "jetstream")
# The kinds that need every node's data dir on a PowerFS mount for the whole run.
MOUNTED_FAULT_KINDS = frozenset({"power", *DISK_FAULT_KINDS})
# `--replicate`'s faults when --faults is not given (its nemesis has kinds of its own,
# raftwal.chaos.replicate.FAULT_NAMES).
REPLICATE_DEFAULT_FAULTS = "kill,pause,partition,restart"
PARTITION_VARIANTS = ("isolate-leader", "isolate-owner", "split", "bridge")
NODE_TARGETS = ("leader", "owner", "random")
# Whose power is cut: the Raft leader, a pchannel's owner, a replica of a pchannel that
# does not own it, or two nodes at once (a pchannel's owner and one of its replicas).
POWER_TARGETS = ("leader", "owner", "replica", "two")
# Seconds a fault is held (restart has no hold: the node comes back at once).
HOLD_S = {
    "kill": (2.0, 7.0),
    "pause": (2.0, 7.0),
    "partition": (3.0, 9.0),
    "restart": (0.0, 0.0),
    "worker": (0.0, 0.0),
    "outage": (10.0, 16.0),
    "member": (1.0, 4.0),
    "power": (2.0, 7.0),
    "nats-kill": (2.0, 7.0),
    "nats-pause": (2.0, 7.0),
    **DISK_HOLD_S,
}
# The bound of one membership swap (promotion, then drain and removal).
MEMBER_WAIT_S = 90.0
GAP_S = (1.0, 4.0)
# The workload's first seconds are fault-free, so that every client is up before the first
# fault (a run that fails to start must not be blamed on the nemesis).
WARMUP_S = 3.0
NODES = 3
START_TIMEOUT_S = 60.0
RECOVERY_TIMEOUT_S = 90.0
CONVERGENCE_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 60.0
FINAL_READ_TIMEOUT_S = 60.0
SPARK_TIMEOUT_S = 300.0
# Lock and broadcast clients' total time per call (retries included), and the producers'.
CLIENT_TIMEOUT_S = 6.0
# The exactly-once shard's drain after the run (its own bound is SHARD_DRAIN_S).
SHARD_FINISH_TIMEOUT_S = 120.0


class SetupFailed(RuntimeError):
    """The cluster or the channels could not be set up: the run proves nothing."""


@dataclass(frozen=True)
class ChaosOptions:
    seed: int
    duration_s: float = 60.0
    faults: tuple[str, ...] = FAULT_KINDS
    spark: bool = True
    directory: Path | None = None
    keep_dir: bool = False
    pchannels: int = 3
    vchannels: int = 6
    producers: int = 3
    lock_clients: int = 3
    lock_keys: int = 2
    broadcasters: int = 2
    broadcast_keys: int = 2
    #: messages per second, all producers together
    rate_per_s: float = 150.0
    payload_bytes: int = 256
    segment_max_bytes: int = 64 * 1024
    #: members of the consumer-group subscription (0: none), and whether a pack consumer
    #: and an exactly-once shard application run (issue 15)
    subscription_members: int = 2
    packs: bool = True
    shard: bool = True
    #: nodes, of which the last `data_nodes` do not vote; pchannels' replica_count (0: the
    #: default, 3); replica repair after a node is DOWN this long (0: the default, 5 min)
    nodes: int = NODES
    data_nodes: int = 0
    #: data worker processes per node (0: a dev cluster's, one unless
    #: RAFTWAL_DEV_DATA_WORKERS says otherwise)
    data_workers: int = 0
    replica_count: int = 0
    replace_after_ms: int = 0
    #: WAL retention by size per pchannel while the faults run (0: off, the cluster's
    #: default of 7 days by age only); checked every second
    retention_bytes: int = 0
    #: the pchannels' WAL implementation; "jetstream" runs a nats-server of its own
    wal: str = "segments"

    def validate(self) -> None:
        unknown = sorted(set(self.faults) - set(FAULT_KINDS + EXTRA_FAULT_KINDS))
        if unknown or not self.faults:
            raise ValueError(
                f"invalid faults ({','.join(self.faults) or 'none'}; expected one or more of "
                f"{','.join(FAULT_KINDS + EXTRA_FAULT_KINDS)})"
            )
        if self.wal not in WAL_NAMES:
            raise ValueError(f"invalid wal ({self.wal!r}; expected one of {', '.join(WAL_NAMES)})")
        if set(NATS_FAULT_KINDS) & set(self.faults) and self.wal != "jetstream":
            raise ValueError(
                f"invalid faults (nats-kill and nats-pause with wal {self.wal}; expected "
                "--wal jetstream)"
            )
        if "member" in self.faults and self.data_nodes < 1:
            raise ValueError(
                f"invalid faults (member with {self.data_nodes} data nodes; expected at least "
                "one data node to swap in)"
            )
        if not 3 <= self.nodes <= 5 or not 0 <= self.data_nodes <= self.nodes - 3:
            raise ValueError(
                f"invalid nodes/data_nodes ({self.nodes}/{self.data_nodes}; expected 3..5 "
                "nodes with at least 3 voters)"
            )
        if not 0 <= self.data_workers <= 8:
            raise ValueError(f"invalid data_workers ({self.data_workers}; expected 0..8)")
        if not 0 <= self.replica_count <= self.nodes:
            raise ValueError(
                f"invalid replica_count ({self.replica_count}; expected 0..{self.nodes})"
            )
        if not 0 <= self.replace_after_ms <= 3_600_000:
            raise ValueError(
                f"invalid replace_after_ms ({self.replace_after_ms}; expected 0..3600000)"
            )
        if self.retention_bytes and not (self.segment_max_bytes <= self.retention_bytes <= 1 << 40):
            raise ValueError(
                f"invalid retention_bytes ({self.retention_bytes}; expected 0 or "
                f"{self.segment_max_bytes}..{1 << 40}, at least one segment)"
            )
        if not 5 <= self.duration_s <= 24 * 3600:
            raise ValueError(f"invalid duration ({self.duration_s} s; expected 5 s .. 24 h)")
        for name, low, high in (
            ("pchannels", 1, 16),
            ("vchannels", 2, 64),
            ("producers", 1, 16),
            ("lock_clients", 0, 16),
            ("lock_keys", 1, 16),
            ("broadcasters", 0, 8),
            ("broadcast_keys", 1, 16),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(f"invalid {name} ({value}; expected {low}..{high})")
        if not 1 <= self.rate_per_s <= 10_000:
            raise ValueError(f"invalid rate_per_s ({self.rate_per_s}; expected 1..10000)")
        if not 64 <= self.payload_bytes <= 65536:
            raise ValueError(f"invalid payload_bytes ({self.payload_bytes}; expected 64..65536)")


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    #: kill/pause/restart/worker: leader | owner | random; partition: one of PARTITION_VARIANTS
    variant: str
    #: partition: reset | drop
    mode: str
    hold_s: float
    gap_s: float
    #: chooses the node or pchannel among the candidates at injection time
    pick: int

    @property
    def label(self) -> str:
        if self.kind == "partition" or self.kind in DISK_FAULT_KINDS:
            return f"{self.kind}:{self.variant}/{self.mode}"
        return f"{self.kind}:{self.variant}"


@dataclass
class FaultRecord:
    label: str
    kind: str
    nodes: list[str]
    detail: str
    start_s: float
    end_s: float = 0.0
    #: seconds of failed or refused writes it cost (diskfaults.fault_costs)
    cost_s: float = 0.0


@dataclass
class ChaosReport:
    seed: int
    duration_s: float
    faults_requested: list[str]
    elapsed_s: float = 0.0
    directory: str = ""
    operations: dict[str, dict[str, int]] = field(default_factory=dict)
    #: by kind (kill, pause, partition, restart) and by variant (e.g. partition:bridge/drop)
    faults: dict[str, int] = field(default_factory=dict)
    fault_variants: dict[str, int] = field(default_factory=dict)
    fault_log: list[FaultRecord] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    #: why the run proved little (no fault injected, nothing acknowledged, ...)
    ineffective: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: why the Spark check could not run although it was asked for ("" when it ran)
    spark_unavailable: str = ""
    #: power cuts: nodes whose unsynced bytes were dropped (a cut of two nodes counts
    #: two), how many of them dropped anything, and the bytes dropped in all
    power_cuts: int = 0
    power_cuts_dropping: int = 0
    power_bytes_dropped: int = 0
    #: disk faults (disk-full, slow-disk, fsync-error): what the mounts counted
    disk_faults: DiskFaultFigures = field(default_factory=DiskFaultFigures)
    #: by fault kind: seconds of failed or refused writes the faults cost
    fault_cost_s: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.ineffective

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


# ---------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------


def plan_faults(seed: int, kinds: Sequence[str], duration_s: float) -> list[PlannedFault]:
    """The nemesis schedule of a seed: kinds (and partition variants, and targets) come in
    shuffled rounds, so a short run still sees every requested kind."""
    rng = random.Random(seed)
    planned: list[PlannedFault] = []
    kinds_left: list[str] = []
    variants_left: list[str] = []
    targets_left: list[str] = []
    power_left: list[str] = []
    elapsed = WARMUP_S
    while elapsed < duration_s and len(planned) < 10_000:
        if not kinds_left:
            kinds_left = sorted(kinds)
            rng.shuffle(kinds_left)
        kind = kinds_left.pop()
        if kind == "partition":
            if not variants_left:
                variants_left = list(PARTITION_VARIANTS)
                rng.shuffle(variants_left)
            variant, mode = variants_left.pop(), rng.choice(LINK_MODES)
        elif kind == "power":
            if not power_left:
                power_left = list(POWER_TARGETS)
                rng.shuffle(power_left)
            variant, mode = power_left.pop(), ""
        elif kind in DISK_FAULT_KINDS:
            variant, mode = plan_variant(kind, rng)
        elif kind in NATS_FAULT_KINDS:
            variant, mode = "nats-server", ""
        else:
            if not targets_left:
                targets_left = list(NODE_TARGETS)
                rng.shuffle(targets_left)
            variant, mode = targets_left.pop(), ""
        low, high = HOLD_S[kind]
        fault = PlannedFault(
            kind=kind,
            variant=variant,
            mode=mode,
            hold_s=round(rng.uniform(low, high), 2),
            gap_s=round(rng.uniform(*GAP_S), 2),
            pick=rng.randrange(1 << 16),
        )
        planned.append(fault)
        elapsed += fault.hold_s + fault.gap_s
    return planned


# ---------------------------------------------------------------------------------------
# The nemesis
# ---------------------------------------------------------------------------------------


class Nemesis:
    """Applies planned faults one at a time to `cluster` and `proxies` (see module doc)."""

    def __init__(
        self,
        cluster: dev.LocalCluster,
        proxies: ProxyNet,
        sampler: StatusSampler,
        history: History,
        progress: Callable[[str], None],
        client: CoordinatorClient | None = None,
        mounts: dict[str, PowerMount] | None = None,
        nats: dict[str, object] | None = None,
    ) -> None:
        self.cluster = cluster
        #: the run's nats-server ({"url", "pid", "dir"}: `dev.start_nats`), for NATS faults
        self.nats = nats
        self.nats_killed = False
        self.nats_paused = False
        #: node id -> the PowerFS mount of its data dir ("power" and disk faults)
        self.mounts = mounts or {}
        self.disks = DiskNemesis(cluster, self.mounts)
        self.power_cuts = 0
        self.power_cuts_dropping = 0
        self.power_bytes_dropped = 0
        #: for membership swaps ("member" faults)
        self.client = client
        self.proxies = proxies
        self.sampler = sampler
        self.history = history
        self.progress = progress
        self.node_ids = [n.id for n in cluster.config.nodes]
        self.records: list[FaultRecord] = []
        self.killed: set[str] = set()
        self.paused: set[str] = set()
        #: voters removed by a "member" fault, frozen until healed
        self.frozen: set[str] = set()
        self.member_changes = 0
        self.member_failures: list[str] = []

    async def run(self, plan: Sequence[PlannedFault], deadline: float) -> None:
        await self._sleep_until(min(deadline, time.monotonic() + WARMUP_S))
        for fault in plan:
            if time.monotonic() + fault.hold_s > deadline:
                break
            record = await self.inject(fault)
            self.records.append(record)
            self.progress(f"{record.start_s:7.1f}s  {record.label:<32} {record.detail}")
            await self._sleep_until(time.monotonic() + fault.hold_s)
            await self.heal()
            record.end_s = self.history.now()
            await self._sleep_until(min(deadline, time.monotonic() + fault.gap_s))

    @staticmethod
    async def _sleep_until(moment: float) -> None:
        delay = moment - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _status(self) -> StatusSample | None:
        return await self.sampler.sample() or self.sampler.latest

    def _owner(self, status: StatusSample | None, pick: int) -> tuple[str, str] | None:
        if status is None:
            return None
        owned = sorted((p, owner) for p, (_, owner, _) in status.pchannels.items() if owner)
        return owned[pick % len(owned)] if owned else None

    async def _target(self, variant: str, pick: int) -> tuple[str, str]:
        """(node id, why) for a node fault or an isolation."""
        status = await self._status()
        if variant in ("leader", "isolate-leader") and status is not None and status.leader:
            return status.leader, "the Raft leader"
        if variant in ("owner", "isolate-owner"):
            owned = self._owner(status, pick)
            if owned is not None:
                return owned[1], f"owner of {owned[0]}"
        return self.node_ids[pick % len(self.node_ids)], "a random node"

    async def inject(self, fault: PlannedFault) -> FaultRecord:
        start = self.history.now()
        if fault.kind == "partition":
            node, why = await self._target(fault.variant, fault.pick)
            others = [n for n in self.node_ids if n != node]
            if fault.variant == "bridge":
                # `node` is the bridge: the two others lose each other, not it.
                await asyncio.to_thread(self.proxies.cut, others[0], others[1], fault.mode)
                detail = f"{others[0]} x {others[1]}, {node} bridges ({fault.mode})"
                return FaultRecord(fault.label, fault.kind, others, detail, start)
            for other in others:
                await asyncio.to_thread(self.proxies.cut, node, other, fault.mode)
            detail = f"{node} ({why}) | {', '.join(others)} ({fault.mode})"
            return FaultRecord(fault.label, fault.kind, [node], detail, start)
        if fault.kind in NATS_FAULT_KINDS:
            assert self.nats is not None, "NATS faults need the run's nats-server"
            pid = int(self.nats["pid"])  # type: ignore[call-overload]
            if fault.kind == "nats-kill":
                os.kill(pid, signal.SIGKILL)
                await asyncio.to_thread(_reap, pid)
                self.nats_killed = True
                detail = f"kill -9 nats-server (pid {pid}) for {fault.hold_s:.1f} s"
            else:
                os.kill(pid, signal.SIGSTOP)
                self.nats_paused = True
                detail = f"SIGSTOP nats-server (pid {pid}) for {fault.hold_s:.1f} s"
            return FaultRecord(fault.label, fault.kind, ["nats"], detail, start)
        if fault.kind == "member":
            return await self._swap_voter(fault, start)
        if fault.kind == "power":
            return await self._power_cut(fault, start)
        if fault.kind == "worker":
            return await self._kill_worker(fault, start)
        if fault.kind in DISK_FAULT_KINDS:
            nodes, detail = await self.disks.inject(
                fault.kind, fault.variant, fault.mode, fault.pick, self._target
            )
            return FaultRecord(
                fault.label, fault.kind, nodes, f"{detail} for {fault.hold_s:.1f} s", start
            )
        node, why = await self._target(fault.variant, fault.pick)
        pid = self.cluster.pid(node)
        if fault.kind in ("kill", "outage"):
            await asyncio.to_thread(self.cluster.kill, node, signal.SIGKILL)
            self.killed.add(node)
            detail = f"kill -9 {node} ({why}, pid {pid}) for {fault.hold_s:.1f} s"
        elif fault.kind == "pause":
            self.cluster.kill(node, signal.SIGSTOP)
            self.paused.add(node)
            detail = f"SIGSTOP {node} ({why}, pid {pid}) for {fault.hold_s:.1f} s"
        else:
            await asyncio.to_thread(self.cluster.kill, node, signal.SIGTERM)
            await asyncio.to_thread(self.cluster.start_node, node)
            detail = f"restart {node} ({why}, pid {pid} -> {self.cluster.pid(node)})"
        return FaultRecord(fault.label, fault.kind, [node], detail, start)

    async def heal(self) -> None:
        """Undo whatever is in effect: links, paused and killed nodes, frozen nodes, the
        nats-server."""
        await asyncio.to_thread(self.proxies.heal_all)
        if self.nats is not None and self.nats_paused:
            os.kill(int(self.nats["pid"]), signal.SIGCONT)  # type: ignore[call-overload]
            self.nats_paused = False
        if self.nats is not None and self.nats_killed:
            port = int(str(self.nats["url"]).rsplit(":", 1)[1])
            restarted = await asyncio.to_thread(
                dev.start_nats, Path(str(self.nats["dir"])).parent, 10.0, port
            )
            self.nats.update(restarted)
            self.nats_killed = False
        for node in sorted(self.paused):
            self.cluster.kill(node, signal.SIGCONT)
        self.paused.clear()
        for node in sorted(self.killed):
            await asyncio.to_thread(self.cluster.start_node, node)
        self.killed.clear()
        if self.disks.injected:
            for restarted in await self.disks.heal():
                self.progress(f"{self.history.now():7.1f}s  started {restarted} again")
        if self.frozen and self.client is not None:
            try:
                policy = (await self.client.cluster_status()).balance_policy
                await self.client.set_balance_policy(
                    policy.allow_rebalance, policy.max_moves_per_round, unfreeze=sorted(self.frozen)
                )
                self.frozen.clear()
            except RaftwalError as error:
                # Kept: the next heal (at the latest the final one) tries again.
                self.progress(f"unfreezing {', '.join(sorted(self.frozen))} failed: {error}")

    async def _kill_worker(self, fault: PlannedFault, start: float) -> FaultRecord:
        """SIGKILL one data worker of a node, by the pid its node reports (and only if it
        is a process of that node's supervisor); the supervisor restarts it."""
        node, why = await self._target(fault.variant, fault.pick)
        supervisor = self.cluster.pid(node)
        ours = set(dev.node_processes(supervisor)[1:]) if supervisor is not None else set()
        workers = []
        with contextlib.suppress(RaftwalError, grpc.RpcError, OSError):
            status = await self.client.cluster_status() if self.client is not None else None
            member = (
                next((m for m in status.members if m.node_id == node), None) if status else None
            )
            if member is not None:
                workers = [p for p in member.processes if p.kind == "worker" and p.pid in ours]
        owner_of = why.removeprefix("owner of ") if why.startswith("owner of ") else ""
        serving = [p for p in workers if owner_of and owner_of in p.owned_pchannels]
        candidates = serving or workers
        if not candidates:
            detail = f"no data worker of {node} ({why}) to kill: none reported"
            return FaultRecord(fault.label, fault.kind, [node], detail, start)
        victim = candidates[fault.pick % len(candidates)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGKILL)
        detail = (
            f"kill -9 data worker {victim.index} of {node} ({why}, pid {victim.pid}); its "
            "supervisor starts it again"
        )
        return FaultRecord(fault.label, fault.kind, [node], detail, start)

    async def _power_targets(self, variant: str, pick: int) -> list[tuple[str, str]]:
        """[(node id, why)] whose power a "power" fault cuts (two for "two")."""
        status = await self._status()
        if variant == "leader" and status is not None and status.leader:
            return [(status.leader, "the Raft leader")]
        owned = self._owner(status, pick)
        if owned is not None and variant in ("replica", "two") and status is not None:
            pchannel, owner = owned
            replicas = [n for n in status.replica_sets.get(pchannel, ()) if n != owner]
            if replicas:
                replica = replicas[pick % len(replicas)]
                if variant == "replica":
                    return [(replica, f"replica of {pchannel} (owner {owner})")]
                return [(owner, f"owner of {pchannel}"), (replica, f"replica of {pchannel}")]
        if owned is not None and variant in ("owner", "two"):
            first = [(owned[1], f"owner of {owned[0]}")]
        else:
            first = [(self.node_ids[pick % len(self.node_ids)], "a random node")]
        if variant == "two":
            others = [n for n in self.node_ids if n != first[0][0]]
            first.append((others[pick % len(others)], "a random other node"))
        return first

    async def _power_cut(self, fault: PlannedFault, start: float) -> FaultRecord:
        """SIGKILL the targets, then drop what their data dirs had not made durable; they
        start again when the fault is healed."""
        targets = await self._power_targets(fault.variant, fault.pick)
        pids = {node: self.cluster.pid(node) for node, _ in targets}
        for node, _why in targets:
            await asyncio.to_thread(self.cluster.kill, node, signal.SIGKILL)
            self.killed.add(node)
        parts = []
        for node, why in targets:
            result = await asyncio.to_thread(self.mounts[node].crash)
            self.power_cuts += 1
            self.power_cuts_dropping += int(result.bytes_dropped > 0)
            self.power_bytes_dropped += result.bytes_dropped
            parts.append(
                f"{node} ({why}, pid {pids[node]}): {result.bytes_dropped} unsynced bytes "
                f"dropped, {result.files_reverted} files and {result.entries_reverted} "
                "directory entries reverted"
            )
        detail = "power cut of " + "; ".join(parts) + f", for {fault.hold_s:.1f} s"
        return FaultRecord(fault.label, fault.kind, [n for n, _ in targets], detail, start)

    async def _swap_voter(self, fault: PlannedFault, start: float) -> FaultRecord:
        """Promote a data node, then drain and remove a voter (the leader, a pchannel's
        owner or a random one, as the variant says): the cluster keeps its voter count."""
        assert self.client is not None, "member faults need a client"
        began = time.monotonic()
        try:
            voters = list((await self.client.list_members()).voter_node_ids)
            spares = [n for n in self.node_ids if n not in voters]
            if not spares:
                raise MembershipTimeout(f"no data node to promote (voters {', '.join(voters)})")
            incoming = spares[fault.pick % len(spares)]
            outgoing, why = await self._target(fault.variant, fault.pick)
            if outgoing not in voters:
                outgoing, why = voters[fault.pick % len(voters)], "a random voter"
        except (MembershipTimeout, RaftwalError) as error:
            detail = f"no swap: {error}"
            self.member_failures.append(detail)
            return FaultRecord(fault.label, fault.kind, [], detail, start)
        quiet: Callable[[str], None] = lambda _text: None  # noqa: E731
        try:
            await promote(self.client, incoming, MEMBER_WAIT_S, quiet)
            self.member_changes += 1
            self.frozen.add(outgoing)
            await demote(self.client, outgoing, MEMBER_WAIT_S, quiet)
            self.member_changes += 1
            detail = (
                f"{incoming} promoted, {outgoing} ({why}) drained and removed in "
                f"{time.monotonic() - began:.1f} s"
            )
        except (MembershipTimeout, RaftwalError) as error:
            detail = f"swap {incoming} in / {outgoing} out FAILED: {error}"
            self.member_failures.append(detail)
        return FaultRecord(fault.label, fault.kind, [incoming, outgoing], detail, start)


# ---------------------------------------------------------------------------------------
# Setting up and reading back
# ---------------------------------------------------------------------------------------


async def _floors(client: CoordinatorClient, pchannels: Sequence[str]) -> dict[str, int]:
    """pchannel -> the first LSN retention kept (a linearizable read)."""
    status = await client.cluster_status()
    return {
        row.pchannel: max(1, row.deleted_before_lsn)
        for row in status.retention
        if row.pchannel in pchannels
    }


async def wait_membership_converged(
    client: CoordinatorClient, voters: int, timeout_s: float
) -> str:
    """Wait until the voter set is settled, holds `voters` nodes, and every node runs in
    the role the set gives it. Returns "" then, else what still differs."""
    deadline = time.monotonic() + timeout_s
    problem = "no answer"
    while time.monotonic() < deadline:
        try:
            members = await client.list_members()
            status = await client.cluster_status()
        except RaftwalError as error:
            problem = f"no answer: {error}"
        else:
            wrong = [
                f"{m.node_id} runs as {m.role or '?'}"
                for m in status.members
                if not m.reachable
                or m.role != ("voter" if m.node_id in members.voter_node_ids else "data")
            ]
            problem = ""
            if members.change_pending or len(members.voter_node_ids) != voters or wrong:
                problem = (
                    f"voters {', '.join(members.voter_node_ids)} (expected {voters}), change "
                    f"pending {members.change_pending}, "
                    f"roles differing: {', '.join(wrong) or 'none'}"
                )
            if not problem:
                return ""
        await asyncio.sleep(0.5)
    return f"membership did not converge within {timeout_s:.0f} s: {problem}"


async def wait_converged(endpoints: Sequence[str], timeout_s: float) -> tuple[str, str]:
    """Wait until every node is reachable at one revision and state digest, and every
    pchannel owner sees each of its replicas durable up to its committed LSN. Returns
    ("", "") then, else what still differs: (state problem, WAL replica problem)."""
    deadline = time.monotonic() + timeout_s
    state_problem, replica_problem = "no ClusterStatus answer", ""
    while time.monotonic() < deadline:
        status = await _status(endpoints)
        if status is not None:
            members = [(m.node_id, m.reachable, m.revision, m.state_digest) for m in status.members]
            reachable = [m for m in members if m[1]]
            state_problem = ""
            if not (
                len(reachable) == len(members)
                and len({m[2] for m in reachable}) == 1
                and len({m[3] for m in reachable}) == 1
            ):
                state_problem = "replicas did not converge: " + ", ".join(
                    f"{n} {'up' if r else 'unreachable'} rev {rev} digest {d[:12]}"
                    for n, r, rev, d in members
                )
            behind = [
                f"{o.pchannel} replica {r.node_id} durable at {r.durable_lsn} < committed "
                f"{o.committed_lsn} (owner {m.node_id}, term {o.term})"
                for m in status.members
                for o in m.owners
                if o.state == "serving"
                for r in o.replicas
                if r.durable_lsn < o.committed_lsn
            ]
            replica_problem = "WAL replicas behind after healing: " + "; ".join(behind)
            if not behind:
                replica_problem = ""
            if not state_problem and not replica_problem:
                return "", ""
        await asyncio.sleep(0.5)
    suffix = f" (after {timeout_s:.0f} s)"
    return (
        state_problem + suffix if state_problem else "",
        replica_problem + suffix if replica_problem else "",
    )


def check_segment_files(
    segments: Sequence[SegmentInfo], data_dirs: dict[str, Path]
) -> list[SegmentFileCheck]:
    """Open every replica's file of every committed segment; the first replica's entries
    are kept so that the checker compares them with the consumed log."""
    checks = []
    for segment in segments:
        for position, node_id in enumerate(segment.replicas):
            path = (
                data_dirs[node_id] / "wal" / segment.pchannel / segment_file_name(segment.first_lsn)
            )
            try:
                with SegmentReader.open(path) as reader:
                    entries = None
                    if position == 0:
                        entries = tuple(
                            (e.lsn, e.term, e.time_tick, hashlib.sha1(e.payload).hexdigest())
                            for e in reader.entries()
                        )
                    checks.append(
                        SegmentFileCheck(
                            segment.pchannel,
                            segment.first_lsn,
                            node_id,
                            digest=reader.digest,
                            last_lsn=reader.last_lsn,
                            count=reader.entry_count,
                            entries=entries,
                        )
                    )
            except Exception as error:  # noqa: BLE001 (any unreadable copy is a finding)
                checks.append(
                    SegmentFileCheck(
                        segment.pchannel, segment.first_lsn, node_id, error=f"{path}: {error}"
                    )
                )
    return checks


class SparkUnavailable(RuntimeError):
    """A local SparkSession could not start (no JVM, no memory): nothing was checked."""


def spark_read(endpoints: Sequence[str], revision: int) -> set[tuple[str, int, str]]:
    """(pchannel, lsn, sha1 of payload) of every row a Spark read of the committed
    segments as of `revision` returns (blocking; starts and stops a local SparkSession)."""
    from pyspark.sql import functions as F

    import spark_connector
    from spark_connector.session import start_session

    try:
        spark = start_session("local[2]", "raftwal chaos", {"spark.sql.shuffle.partitions": "4"})
    except Exception as error:  # noqa: BLE001 (pyspark raises bare exceptions here)
        raise SparkUnavailable(str(error).strip().splitlines()[0][:500]) from None
    try:
        spark_connector.register(spark)
        rows = (
            spark.read.format("raftwal")
            .option("endpoints", ",".join(endpoints))
            .option("asOfRevision", str(revision))
            .load()
            .select("pchannel", "lsn", F.sha1("payload").alias("digest"))
            .collect()
        )
        return {(row.pchannel, row.lsn, row.digest) for row in rows}
    finally:
        spark.stop()


def _spark_child(argv: Sequence[str]) -> int:
    """Entry point of the Spark subprocess: `endpoints revision out_file`. Exit 0 with the
    rows written as JSON, 3 when Spark could not start, 1 when the read failed (the reason
    on the last line of stderr)."""
    endpoints, revision, out_file = argv
    try:
        rows = spark_read(endpoints.split(","), int(revision))
    except SparkUnavailable as error:
        print(error, file=sys.stderr)
        return 3
    except Exception as error:  # noqa: BLE001 (Spark wraps the connector's errors)
        print(str(error).strip().splitlines()[0][:500], file=sys.stderr)
        return 1
    Path(out_file).write_text(json.dumps(sorted(rows)))
    return 0


def spark_read_isolated(
    endpoints: Sequence[str], revision: int, directory: Path
) -> set[tuple[str, int, str]]:
    """`spark_read` in a fresh Python process (blocking). pyspark starts its JVM with a
    Python `preexec_fn`, which is unsafe to fork from this process's gRPC threads (the
    child crashed with SIGSEGV here); a process of its own has none. Raises
    SparkUnavailable, or RuntimeError for a failed or hung read."""
    out_file = directory / "spark-rows.json"
    code = "import sys; from raftwal.chaos.runner import _spark_child; sys.exit(_spark_child(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, ",".join(endpoints), str(revision), str(out_file)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=SPARK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # The session holds the child and the JVM it started: stop both.
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)
        raise RuntimeError(
            f"the Spark read did not finish within {SPARK_TIMEOUT_S:.0f} s"
        ) from None
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit code {process.returncode}"
    if process.returncode == 3:
        raise SparkUnavailable(reason)
    if process.returncode != 0:
        raise RuntimeError(reason)
    rows = json.loads(out_file.read_text())
    out_file.unlink()
    return {(pchannel, lsn, digest) for pchannel, lsn, digest in rows}


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def _cluster_env(options: ChaosOptions) -> dict[str, str]:
    env = dict(os.environ)
    env["RAFTWAL_SEGMENT_MAX_BYTES"] = str(options.segment_max_bytes)
    # Failover within a couple of seconds, so that faults of a few seconds matter.
    env["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    if options.replace_after_ms:
        env["RAFTWAL_REPLICA_REPLACE_AFTER_MS"] = str(options.replace_after_ms)
    if options.retention_bytes:
        env["RAFTWAL_WAL_RETENTION_BYTES"] = str(options.retention_bytes)
        env["RAFTWAL_WAL_RETENTION_CHECK_MS"] = "1000"
    return env


async def _setup_channels(
    client: CoordinatorClient,
    endpoints: Sequence[str],
    options: ChaosOptions,
    tag: str,
    nats_url: str = "",
) -> dict[str, str]:
    """Create the pchannels and vchannels; vchannel -> pchannel once all are ASSIGNED."""
    response = await client.create_channels(
        count=options.pchannels,
        prefix=f"chaos{tag}",
        replica_count=options.replica_count,
        wal="" if options.wal == "segments" else options.wal,
        # A publish unacknowledged for 2 s stops the owner (a paused server), so that
        # NATS faults of a few seconds show.
        wal_config={"url": nats_url, "timeout_ms": "2000"} if options.wal == "jetstream" else {},
    )
    pchannels = list(response.pchannels)
    mapping = {}
    for index in range(options.vchannels):
        name = f"chaos{tag}_v{index}"
        pchannel = pchannels[index % len(pchannels)]
        await client.create_vchannel(name, pchannel)
        mapping[name] = pchannel
    _, missing = await wait_recovered(endpoints, pchannels, START_TIMEOUT_S, options.nodes)
    if missing:
        raise SetupFailed(f"channels not ready after {START_TIMEOUT_S:.0f} s: {missing}")
    return mapping


async def _run(
    options: ChaosOptions, directory: Path, progress: Callable[[str], None]
) -> ChaosReport:
    report = ChaosReport(options.seed, options.duration_s, list(options.faults))
    report.directory = str(directory)
    rng = random.Random(options.seed)
    tag = uuid.UUID(int=rng.getrandbits(128)).hex[:6]
    config = dev.make_config(
        directory, options.nodes, data_nodes=options.data_nodes, data_workers=options.data_workers
    )
    proxies = ProxyNet(config.nodes)
    proxies.start()
    cluster: dev.LocalCluster | None = None
    nemesis: Nemesis | None = None
    history = History()
    problems: list[str] = []
    setup_error = ""
    mounts: dict[str, PowerMount] = {}
    vchannel_pchannel: dict[str, str] = {}
    nats: dict[str, object] | None = None
    try:
        config = replace(config, nodes=proxies.configure(config.nodes))
        if options.wal == "jetstream":
            try:
                nats = await asyncio.to_thread(dev.start_nats, directory / "jetstream")
            except RuntimeError as error:
                raise SetupFailed(f"nats-server did not start: {error}") from None
            progress(f"nats-server {nats['url']} (pid {nats['pid']})")
        if MOUNTED_FAULT_KINDS & set(options.faults):
            from raftwal.chaos.powerfs import PowerMount

            # Every data dir lives on a PowerFS mount for the whole run (the backing
            # directories, which hold the data afterwards, are under power/).
            for node in config.nodes:
                mounts[node.id] = PowerMount(
                    directory / "power" / node.id,
                    node.data_dir,
                    directory / f"powerfs-{node.id}.log",
                )
            try:
                for mount in mounts.values():
                    await asyncio.to_thread(mount.start)
            except (RuntimeError, OSError) as error:
                raise SetupFailed(f"PowerFS could not mount the data dirs: {error}") from None
            progress(
                "data dirs on PowerFS (pids: "
                + ", ".join(f"{n} {m.pid}" for n, m in mounts.items())
                + ")"
            )
        try:
            cluster = await asyncio.to_thread(
                dev.up, directory, options.nodes, START_TIMEOUT_S, _cluster_env(options), config
            )
        except (RuntimeError, TimeoutError, OSError) as error:
            raise SetupFailed(f"the cluster did not start: {error}") from None
        endpoints = cluster.endpoints
        pids = ", ".join(f"{n.id} {cluster.pid(n.id)}" for n in cluster.config.nodes)
        progress(f"cluster up in {directory} (pids: {pids})")
        coordinator = CoordinatorClient(endpoints, timeout_s=15.0, max_attempts=60)
        streaming = StreamingClient(coordinator)
        # Lock and broadcast clients give up sooner than a long fault lasts, so that the
        # history holds indeterminate (unknown) operations for the checker to reason about.
        impatient = CoordinatorClient(endpoints, timeout_s=CLIENT_TIMEOUT_S, max_attempts=30)
        sampler = StatusSampler(endpoints, history)
        try:
            vchannel_pchannel = await _setup_channels(
                coordinator, endpoints, options, tag, str(nats["url"]) if nats else ""
            )
            vchannels = sorted(vchannel_pchannel)
            pchannels = sorted(set(vchannel_pchannel.values()))
            first = await _status(endpoints)
            initial_sets = {
                p.name: tuple(sorted(p.replica_node_ids))
                for p in (first.pchannels if first is not None else ())
                if p.name in pchannels
            }
            stop = asyncio.Event()
            producers = [
                ProducerClient(
                    f"p{k}",
                    streaming,
                    vchannels,
                    history,
                    random.Random(rng.getrandbits(64)),
                    options.rate_per_s / options.producers,
                    options.payload_bytes,
                )
                for k in range(options.producers)
            ]
            consumers = [ConsumerClient(streaming, v) for v in vchannels]
            lockers = [
                LockClient(
                    f"l{k}",
                    impatient,
                    [f"chaos{tag}-lock-{i}" for i in range(options.lock_keys)],
                    history,
                    random.Random(rng.getrandbits(64)),
                )
                for k in range(options.lock_clients)
            ]
            broadcasters = [
                BroadcastClient(
                    f"b{k}",
                    impatient,
                    vchannels,
                    [f"chaos{tag}-ddl-{i}" for i in range(options.broadcast_keys)],
                    f"chaos{tag}",
                    history,
                    random.Random(rng.getrandbits(64)),
                )
                for k in range(options.broadcasters)
            ]
            consumer_side = await _setup_subscribers(
                streaming, vchannels, tag, directory, history, rng, options
            )
            nemesis = Nemesis(
                cluster, proxies, sampler, history, progress, coordinator, mounts=mounts, nats=nats
            )
            plan = plan_faults(options.seed, options.faults, options.duration_s)
            sampler_task = asyncio.create_task(sampler.run(stop), name="sampler")
            consumer_tasks = [
                asyncio.create_task(c.run(stop), name=f"consumer {c.vchannel}") for c in consumers
            ]
            workload = [
                *(
                    asyncio.create_task(p.run(stop, DRAIN_TIMEOUT_S), name=p.name)
                    for p in producers
                ),
                *(asyncio.create_task(lk.run(stop), name=lk.name) for lk in lockers),
                *(asyncio.create_task(b.run(stop), name=b.name) for b in broadcasters),
                *consumer_side.tasks(stop),
            ]
            progress(
                f"workload on {len(vchannels)} vchannels / {len(pchannels)} pchannels; "
                f"{len(plan)} faults planned over {options.duration_s:.0f} s (seed {options.seed})"
            )
            started = time.monotonic()
            try:
                await nemesis.run(plan, started + options.duration_s)
                remaining = started + options.duration_s - time.monotonic()
                if remaining > 0:
                    await asyncio.sleep(remaining)
            finally:
                await nemesis.heal()
            progress(f"{history.now():7.1f}s  healed; letting the workload finish")
            stop.set()
            final = FinalState()
            if options.retention_bytes:
                # Retention stops here, so that what the final reads see stays put: a
                # subscription from EARLIEST that never moves holds every entry still
                # there (the state machine bounds every later deletion by it).
                await coordinator.create_subscription(f"chaos{tag}-freeze", vchannels)
                final.floors = await _floors(coordinator, pchannels)
                progress(f"{history.now():7.1f}s  retention frozen at {final.floors}")
            await gather_bounded(workload, DRAIN_TIMEOUT_S + 30, problems.append)
            for broadcaster in broadcasters:
                await broadcaster.finish(DRAIN_TIMEOUT_S)
            await consumer_side.finish(problems.append)
            status, missing = await wait_recovered(
                endpoints, pchannels, RECOVERY_TIMEOUT_S, options.nodes
            )
            if missing:
                final.recovery_error = (
                    f"the cluster did not recover within {RECOVERY_TIMEOUT_S:.0f} s of healing: "
                    f"{missing}"
                )
            if "member" in options.faults:
                final.membership_error = await wait_membership_converged(
                    coordinator, options.nodes - options.data_nodes, CONVERGENCE_TIMEOUT_S
                )
            progress(f"{history.now():7.1f}s  recovered; reading the final state")
            await _read_final(final, status, endpoints, pchannels, cluster, options, progress)
            await gather_bounded([sampler_task, *consumer_tasks], 15, problems.append)
            report.violations = check(
                history,
                {c.vchannel: c.delivered for c in consumers},
                sampler.samples,
                vchannel_pchannel,
                final,
            )
            # Subscriptions hold retention: none of their readers may ever be told that
            # what they still need was deleted.
            report.violations += [
                Violation("retention-overtook-holder", error)
                for error in consumer_side.errors()
                if "COMPACTED" in error
            ]
            report.notes += [f"ClusterStatus warning after healing: {w}" for w in final.warnings]
            if final.spark_rows is None and final.spark_unavailable:
                report.spark_unavailable = final.spark_unavailable
            report.checked = {
                "log_entries": sum(len(e) for e in final.logs.values()),
                "segments": len(final.segments),
                "segment_copies": len(final.segment_files),
                "consumer_deliveries": sum(len(c.delivered) for c in consumers),
                "consumer_restarts": sum(c.restarts for c in consumers),
                "status_samples": len(sampler.samples),
                # How lock holds ended: released on time, or cut short because the lease
                # keeper gave the lease up (lost) or stopped vouching for it (expired).
                **{
                    f"lock_holds_{reason}": sum(
                        1
                        for op in history.ops
                        if op.kind == "hold" and op.result.get("reason") == reason
                    )
                    for reason in ("released", "lost", "expired")
                },
                "spark_rows": -1 if final.spark_rows is None else len(final.spark_rows),
                # Replica repair: replica set changes seen in the status samples (in
                # revision order), and replica logs read back for the holders check.
                "replica_set_changes": _replica_set_changes(sampler.samples, initial_sets),
                "replica_logs": sum(len(logs) for logs in final.replica_logs.values()),
                # Membership swaps: voter set changes committed ("member" faults).
                "membership_changes": nemesis.member_changes,
                # Retention: entries deleted below the final floors, and acknowledged
                # messages among them (the rest must all be in the final logs).
                "retention_deleted_entries": sum(f - 1 for f in final.floors.values()),
                "acked_below_floor": sum(
                    1
                    for op in history.ops
                    if op.kind == "produce"
                    and op.outcome == OK
                    and int(op.result["lsn"]) < final.floors.get(op.result["pchannel"], 1)
                ),
                "consumer_compacted_skips": sum(c.skips for c in consumers),
                **consumer_side.figures(history),
            }
        finally:
            await sampler.close()
            await streaming.close()
            await coordinator.close()
            await impatient.close()
    except SetupFailed as error:
        setup_error = str(error)
        progress(f"setup failed: {error}")
    finally:
        if nemesis is not None:
            report.fault_log = nemesis.records
        if cluster is not None:
            # A paused node would ignore SIGTERM: continue everything before stopping.
            for node in cluster.config.nodes:
                if cluster.pid(node.id) is not None:
                    cluster.kill(node.id, signal.SIGCONT)
            await asyncio.to_thread(cluster.stop_all)
        proxies.close()
        # After the nodes: a mount still in use could not be unmounted cleanly.
        for mount in mounts.values():
            await asyncio.to_thread(mount.close)
        if nats is not None and isinstance(nats.get("pid"), int):
            pid = int(nats["pid"])  # type: ignore[call-overload]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGTERM)
            await asyncio.to_thread(_reap, pid)
    if nemesis is not None:
        report.power_cuts = nemesis.power_cuts
        report.power_cuts_dropping = nemesis.power_cuts_dropping
        report.power_bytes_dropped = nemesis.power_bytes_dropped
        report.disk_faults = nemesis.disks.figures
        costs = fault_costs(nemesis.records, history, vchannel_pchannel, history.now())
        for index, cost in costs.items():
            nemesis.records[index].cost_s = cost
        report.fault_cost_s = costs_by_kind(nemesis.records)
    report.operations = history.counts()
    for record in report.fault_log:
        report.faults[record.kind] = report.faults.get(record.kind, 0) + 1
        report.fault_variants[record.label] = report.fault_variants.get(record.label, 0) + 1
    report.notes.extend(problems)
    if nemesis is not None:
        report.notes.extend(f"membership swap: {f}" for f in nemesis.member_failures)
    report.ineffective = [setup_error] if setup_error else []
    report.ineffective += _ineffective(report)
    if options.keep_dir or not report.ok:
        history.write_jsonl(directory / "history.jsonl")
    return report


async def _read_final(
    final: FinalState,
    status: api.ClusterStatusResponse | None,
    endpoints: Sequence[str],
    pchannels: Sequence[str],
    cluster: dev.LocalCluster,
    options: ChaosOptions,
    progress: Callable[[str], None],
) -> None:
    for pchannel in pchannels:
        # The balancer may still move a pchannel after healing: follow it (bounded).
        error = "no owner known after healing"
        for _ in range(5):
            if status is not None:
                owners = {p.name: p.owner_node_id for p in status.pchannels}
                # The owner's data worker for the pchannel (DESIGN.md section 2).
                address = serving_address(status.nodes, owners.get(pchannel, ""), pchannel)
                if address:
                    try:
                        final.logs[pchannel] = await read_log(
                            address,
                            pchannel,
                            FINAL_READ_TIMEOUT_S,
                            floor=final.floors.get(pchannel, 1),
                        )
                        break
                    except (RuntimeError, grpc.aio.AioRpcError) as failure:
                        error = f"{failure}"
            await asyncio.sleep(1.0)
            status, _ = await wait_recovered(endpoints, pchannels, 20.0, options.nodes)
        else:
            final.log_errors[pchannel] = error
    final.convergence_detail, final.replica_detail = await wait_converged(
        endpoints, CONVERGENCE_TIMEOUT_S
    )
    final.converged = not final.convergence_detail
    last = await _status(endpoints)
    if last is not None:
        await _read_replicas(final, last, pchannels)
    final.warnings = list(last.warnings) if last is not None else []
    manifest_revision = 0
    async with grpc.aio.insecure_channel(endpoints[0]) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            listed = await stub.ListSegments(
                api.ListSegmentsRequest(pchannels=pchannels), timeout=10
            )
        except grpc.aio.AioRpcError as error:
            final.recovery_error = final.recovery_error or f"ListSegments failed: {error.code()}"
        else:
            manifest_revision = listed.revision
            final.segments = [
                SegmentInfo(
                    s.pchannel,
                    s.first_lsn,
                    s.last_lsn,
                    s.count,
                    s.digest,
                    tuple(s.replica_node_ids),
                )
                for s in listed.segments
            ]
    data_dirs = {n.id: n.data_dir for n in cluster.config.nodes}
    final.segment_files = await asyncio.to_thread(check_segment_files, final.segments, data_dirs)
    if options.spark and manifest_revision:
        progress(f"reading {len(final.segments)} committed segments with Spark")
        for attempt in range(2):
            try:
                rows = await asyncio.to_thread(
                    spark_read_isolated, endpoints, manifest_revision, cluster.directory
                )
                # Spark reads every pchannel; the manifest was listed for the workload's
                # only (the exactly-once shard's recovery log has a pchannel of its own,
                # which the final state does not read).
                final.spark_rows = {row for row in rows if row[0] in pchannels}
                break
            except SparkUnavailable as error:
                # Not the cluster's fault: say so, and try once more (a JVM that failed to
                # start on a busy machine usually starts the second time).
                final.spark_unavailable = f"Spark could not start: {error}"
                await asyncio.sleep(5.0 * (attempt + 1))
            except RuntimeError as error:
                final.spark_error = f"Spark read failed: {error}"
                break


def _replica_set_changes(
    samples: Sequence[StatusSample], initial: dict[str, tuple[str, ...]]
) -> int:
    """How many times a pchannel's replica set changed, as the samples saw it (ordered by
    revision, so that a node answering from an older state does not count twice)."""
    current = dict(initial)
    changes = 0
    for sample in sorted(samples, key=lambda s: s.revision):
        for name, members in sample.replica_sets.items():
            if name in current and members and members != current[name]:
                current[name] = members
                changes += 1
    return changes


async def _read_replicas(
    final: FinalState, status: api.ClusterStatusResponse, pchannels: Sequence[str]
) -> None:
    """Each final replica's committed log of each pchannel (not the owner's: that one is
    `final.logs`), for the check that a majority of the set holds every entry."""
    for channel in status.pchannels:
        if channel.name not in pchannels:
            continue
        if channel.wal in ("local", "jetstream"):
            # One copy on the nodes (the owner's); jetstream's others are the stream's.
            final.replica_sets[channel.name] = (channel.owner_node_id, (channel.owner_node_id,))
            continue
        final.replica_sets[channel.name] = (channel.owner_node_id, tuple(channel.replica_node_ids))
        for node_id in channel.replica_node_ids:
            if node_id == channel.owner_node_id:
                continue
            try:
                final.replica_logs.setdefault(channel.name, {})[node_id] = await read_log(
                    serving_address(status.nodes, node_id, channel.name),
                    channel.name,
                    20.0,
                    from_replica=True,
                    floor=final.floors.get(channel.name, 1),
                )
            except (RuntimeError, grpc.aio.AioRpcError) as error:
                final.replica_logs.setdefault(channel.name, {})[node_id] = str(error)


@dataclass
class _ConsumerSide:
    """The issue-15 clients of one run (see raftwal.chaos.subscribers)."""

    members: list[MemberClient]
    packs: PackClient | None
    shard: ShardClient | None
    positions: PositionSampler | None

    def tasks(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(m.run(stop), name=m.name) for m in self.members]
        if self.packs is not None:
            tasks.append(asyncio.create_task(self.packs.run(stop), name="packs"))
        if self.shard is not None:
            tasks.append(asyncio.create_task(self.shard.run(stop), name="shard"))
        if self.positions is not None:
            tasks.append(asyncio.create_task(self.positions.run(stop), name="positions"))
        return tasks

    async def finish(self, on_problem: Callable[[str], None]) -> None:
        if self.shard is not None:
            try:
                await asyncio.wait_for(self.shard.finish(), SHARD_FINISH_TIMEOUT_S)
            except Exception as error:  # noqa: BLE001 - reported, the run goes on to checking
                on_problem(f"the shard's final store could not be read: {error!r}")

    def errors(self) -> list[str]:
        """What the subscription clients ran into (each recovered and went on)."""
        found = [f"member {m.name}: {e}" for m in self.members for e in m.errors]
        if self.packs is not None:
            found += [f"packs: {e}" for e in self.packs.errors]
        if self.shard is not None:
            found += [f"shard: {e}" for e in self.shard.errors]
        return found

    def figures(self, history: History) -> dict[str, int]:
        counts = history.counts()
        return {
            "subscription_commits_ok": counts.get("sub_commit", {}).get(OK, 0),
            "subscription_commits_fenced": counts.get("sub_commit", {}).get("fail", 0),
            "member_sessions": sum(m.sessions for m in self.members),
            "subscription_seeks_ok": counts.get("sub_seek", {}).get(OK, 0),
            "packs": self.packs.packs if self.packs is not None else 0,
            "pack_consumers": self.packs.incarnation if self.packs is not None else 0,
            "pack_messages": sum(
                len(op.result.get("messages", ())) for op in history.ops if op.kind == "pack"
            ),
            "shard_takeovers": self.shard.token if self.shard is not None else 0,
            "shard_applied": sum(
                len(op.result.get("applied", ())) for op in history.ops if op.kind == "shard_final"
            ),
        }


async def _setup_subscribers(
    streaming: StreamingClient,
    vchannels: Sequence[str],
    tag: str,
    directory: Path,
    history: History,
    rng: random.Random,
    options: ChaosOptions,
) -> _ConsumerSide:
    coordinator = streaming.coordinator
    group, packs, shard = f"chaos{tag}-group", f"chaos{tag}-packs", f"chaos{tag}-shard"
    if options.subscription_members:
        await coordinator.create_subscription(group, vchannels)
    if options.packs:
        await coordinator.create_subscription(packs, vchannels)
    if options.shard:
        await coordinator.create_subscription(shard, vchannels[:1])
    subscriptions = [
        name
        for name, wanted in (
            (group, options.subscription_members),
            (packs, options.packs),
            (shard, options.shard),
        )
        if wanted
    ]
    shard_dir = directory / "shards"
    shard_dir.mkdir(mode=0o700, exist_ok=True)
    return _ConsumerSide(
        members=[
            MemberClient(f"m{k}", streaming, group, history, random.Random(rng.getrandbits(64)))
            for k in range(options.subscription_members)
        ],
        packs=PackClient(streaming, packs, history) if options.packs else None,
        shard=(
            ShardClient(
                streaming,
                shard,
                vchannels[0],
                shard_dir,
                history,
                random.Random(rng.getrandbits(64)),
            )
            if options.shard
            else None
        ),
        positions=(
            PositionSampler(
                streaming, subscriptions, group, history, random.Random(rng.getrandbits(64))
            )
            if subscriptions
            else None
        ),
    )


def _ineffective(report: ChaosReport) -> list[str]:
    reasons = []
    if not report.fault_log:
        reasons.append("no fault was injected")
    for kind in report.faults_requested:
        if not report.faults.get(kind):
            reasons.append(f"no {kind} fault was injected")
    if report.spark_unavailable:
        reasons.append(report.spark_unavailable)
    if report.faults.get("power") and not report.power_cuts_dropping:
        reasons.append("no power cut dropped unsynced bytes")
    figures = report.disk_faults
    if report.faults.get("slow-disk") and not figures.delayed_fsyncs:
        reasons.append("no slow-disk fault delayed an fsync")
    if report.faults.get("fsync-error") and not figures.failed_fsyncs:
        reasons.append("no fsync-error fault failed an fsync")
    # The issue-15 consumer side, when it ran: packs delivered, member commits
    # acknowledged, the shard's final store read.
    for kind in ("pack", "sub_commit", "shard_final"):
        if kind in report.operations and not report.operations[kind].get(OK):
            reasons.append(f"no {kind} operation was acknowledged")
    for kind in ("produce", "lock", "broadcast"):
        if kind == "lock" and "lock" not in report.operations:
            continue
        if kind == "broadcast" and "broadcast" not in report.operations:
            continue
        if not report.operations.get(kind, {}).get(OK):
            reasons.append(f"no {kind} operation was acknowledged")
    return reasons


def run_chaos(options: ChaosOptions, progress: Callable[[str], None] | None = None) -> ChaosReport:
    """Run one chaos test (blocking). The cluster lives in `options.directory` (a fresh
    temporary directory by default), which is removed afterwards unless `keep_dir` is set
    or something was found."""
    options.validate()
    say = progress or (lambda _message: None)
    directory = options.directory or Path(tempfile.mkdtemp(prefix=f"raftwal-chaos-{options.seed}-"))
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report = asyncio.run(_run(options, directory, say))
    report.elapsed_s = round(time.monotonic() - started, 1)
    if options.keep_dir or not report.ok:
        (directory / "report.json").write_text(json.dumps(report.as_json(), indent=2, default=str))
    elif options.directory is None:
        shutil.rmtree(directory, ignore_errors=True)
        report.directory = ""
    return report


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `1h` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (expected e.g. 60s, 10m)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "chaos",
        help="nemesis + workload + checker against a local cluster (three nodes by default)",
        description="Start three nodes on 127.0.0.1 behind per-link proxies, run a workload "
        "while injecting faults from a seeded schedule, heal, and check the history and the "
        "final state. Exit code 0: no violation; 1: violations; 3: the run proved nothing "
        "(no fault or no acknowledged operation); 2: bad arguments, or --faults power on a "
        "machine without FUSE (only that fault needs libfuse3: scripts/install-fuse.sh).",
    )
    parser.add_argument("--seed", type=int, default=None, help="schedule seed (default: random)")
    parser.add_argument(
        "--duration",
        type=parse_duration,
        default=60.0,
        help="how long faults run, e.g. 60s, 10m (default: 60s)",
    )
    parser.add_argument(
        "--faults",
        default=None,
        help=f"comma-separated subset of {','.join(FAULT_KINDS + EXTRA_FAULT_KINDS)} "
        f"(default: {','.join(FAULT_KINDS)}; with --replicate: {REPLICATE_DEFAULT_FAULTS}; "
        "worker: one data worker process of a node killed and restarted by its supervisor; "
        "outage: a node killed for 10-16 s, long enough "
        "for replica repair with --replace-after-ms; member: a data node promoted and a "
        "voter drained and removed, needs --data-nodes; power: a power cut that drops "
        "every unsynced byte of the node's data dir, needs FUSE: scripts/install-fuse.sh; "
        "disk-full, slow-disk, fsync-error: a node's disk fills up, syncs slowly, or fails "
        "its fsyncs, on the same FUSE mounts)",
    )
    parser.add_argument("--nodes", type=int, default=NODES, help="nodes (3..5, default 3)")
    parser.add_argument(
        "--data-workers",
        type=int,
        default=0,
        help="data worker processes per node (1..8; default: one, or RAFTWAL_DEV_DATA_WORKERS)",
    )
    parser.add_argument(
        "--data-nodes", type=int, default=0, help="how many of them do not vote (default 0)"
    )
    parser.add_argument(
        "--replica-count", type=int, default=0, help="replicas per pchannel (default 3)"
    )
    parser.add_argument(
        "--replace-after-ms",
        type=int,
        default=0,
        help="replica repair replaces a node DOWN this long (default: the cluster's, 5 min)",
    )
    parser.add_argument(
        "--retention-bytes",
        type=int,
        default=0,
        help="WAL retention by size per pchannel during the run, checked every second "
        "(default 0: off); the checker then allows acknowledged entries below the final "
        "floor to be gone, and no other",
    )
    parser.add_argument(
        "--wal",
        default="segments",
        help="the pchannels' WAL implementation: segments (default), local, jetstream (a "
        "nats-server of the run's own; with the nats-kill and nats-pause faults)",
    )
    parser.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check a Spark read of the committed segments (default on)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="cluster directory (default: temp)")
    parser.add_argument(
        "--keep-dir", action="store_true", help="keep logs, history and report afterwards"
    )
    parser.add_argument(
        "--rate", type=float, default=150.0, help="messages per second (default: 150)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--replicate",
        action="store_true",
        help="two clusters, source -> target (`replicate set`), faults on both sides and "
        "between them (of --faults: kill, pause, partition, restart, power); checks that the "
        "target holds the source's committed log exactly",
    )
    parser.set_defaults(handler=_command)


def _reap(pid: int) -> None:
    """Wait (bounded) until a process this run killed is gone, reaping it when it is ours."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.05)


def power_unavailable() -> str:
    """Why the "power" fault cannot run here ("" when it can): PowerFS needs /dev/fuse,
    fusermount3 and libfuse3 (which mfusepy loads when `raftwal.chaos.powerfs` is
    imported, so that import is tried here and nowhere else before a power fault)."""
    try:
        from raftwal.chaos.powerfs import fuse_unavailable
    except (ImportError, OSError) as error:
        return f"mfusepy cannot load libfuse: {str(error)[:200]}"
    return fuse_unavailable()


def _command(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    if args.replicate:
        return _replicate_command(args, seed)
    names = args.faults if args.faults is not None else ",".join(FAULT_KINDS)
    faults = tuple(f.strip() for f in names.split(",") if f.strip())
    options = ChaosOptions(
        seed=seed,
        duration_s=args.duration,
        faults=faults,
        spark=args.spark,
        directory=args.dir,
        keep_dir=args.keep_dir,
        rate_per_s=args.rate,
        nodes=args.nodes,
        data_nodes=args.data_nodes,
        data_workers=args.data_workers,
        replica_count=args.replica_count,
        replace_after_ms=args.replace_after_ms,
        retention_bytes=args.retention_bytes,
        wal=args.wal,
    )
    try:
        options.validate()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if "power" in faults:
        missing = power_unavailable()
        if missing:
            print(
                f"error: the power fault needs FUSE, which this machine lacks ({missing}); "
                "run scripts/install-fuse.sh (or apt-get install fuse3 libfuse3-3), or "
                "leave power out of --faults",
                file=sys.stderr,
            )
            return 2
    progress = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    if progress is not None:
        progress(f"raftwal chaos: seed {seed}, {args.duration:.0f} s, faults {','.join(faults)}")
    report = run_chaos(options, progress)
    if args.json:
        print(json.dumps(report.as_json(), default=str))
    else:
        print_report(report)
    if report.violations:
        return 1
    return 3 if report.ineffective else 0


def _replicate_command(args: argparse.Namespace, seed: int) -> int:
    from raftwal.chaos.replicate import SOURCE, TARGET, fault_kinds, run_replicate_chaos

    if args.duration <= 0:
        print(f"error: invalid --duration (got {args.duration}; expected > 0)", file=sys.stderr)
        return 2
    names = args.faults if args.faults is not None else REPLICATE_DEFAULT_FAULTS
    faults = tuple(f.strip() for f in names.split(",") if f.strip())
    try:
        fault_kinds(faults)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    progress = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    if progress is not None:
        progress(
            f"raftwal chaos --replicate: seed {seed}, {args.duration:.0f} s, faults "
            + ",".join(faults)
        )
    try:
        report = run_replicate_chaos(seed, args.duration, args.dir, rate_per_s=args.rate,
                                     progress=progress, faults=faults)  # fmt: skip
    except (RuntimeError, TimeoutError, OSError, RaftwalError) as error:
        print(f"error: setup failed: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_json(), default=str))
    else:
        for fault in report.faults:
            print(f"  {fault['at_s']:>7.1f} s  {fault['kind']:<13} {fault['hold_s']:.1f} s  "
                  f"{fault['detail']}")  # fmt: skip
        print(f"faults: {len(report.faults)}; acknowledged produces: {report.acked}; "
              f"committed transactions: {report.txns_committed}; "
              f"source entries: {report.source_entries}; checkpoints recorded in Raft "
              f"checked against the target: {report.checkpoint_checks}")  # fmt: skip
        batches = report.producer.get("batches_acknowledged", 0)
        mean = report.producer.get("messages_acknowledged", 0) / batches if batches else 0.0
        print(f"duplicates: source {report.duplicates[SOURCE]}, target "
              f"{report.duplicates[TARGET]}; produce batches: {batches} acknowledged, "
              f"{mean:.1f} messages each on average, {report.multi_message_bursts} bursts of "
              f"2-8 messages, {report.producer.get('retries', 0)} retried, "
              f"{report.producer.get('duplicates_answered', 0)} answered as duplicates")  # fmt: skip
        for violation in report.violations:
            print(f"VIOLATION: {violation}")
        print("ok: the target holds the source's committed log" if report.ok else "FAILED")
    if report.violations:
        return 1
    return 3 if not report.faults else 0


def print_report(report: ChaosReport) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    operations = Table(title="operations")
    for column in ("kind", "ok", "fail", "unknown", "pending"):
        operations.add_column(column, justify="left" if column == "kind" else "right")
    for kind, outcomes in report.operations.items():
        operations.add_row(
            kind, *(str(outcomes.get(o, 0)) for o in ("ok", "fail", "unknown", "pending"))
        )
    console.print(operations)
    faults = Table(title="faults injected")
    faults.add_column("fault")
    faults.add_column("count", justify="right")
    for kind, count in sorted(report.faults.items()):
        faults.add_row(f"[bold]{kind}[/bold]", str(count))
        for label, variant_count in sorted(report.fault_variants.items()):
            if label.startswith(f"{kind}:"):
                faults.add_row(f"  {label}", str(variant_count))
    console.print(faults)
    if report.power_cuts:
        console.print(
            f"power cuts: {report.power_cuts} nodes, {report.power_cuts_dropping} of them "
            f"dropped unsynced bytes, {report.power_bytes_dropped} bytes dropped in all",
            highlight=False,
        )
    disks = report.disk_faults
    if report.fault_cost_s or disks.enospc or disks.failed_fsyncs or disks.delayed_fsyncs:
        console.print(
            f"disk faults: {disks.enospc} writes refused for space (ENOSPC), "
            f"{disks.failed_fsyncs} fsyncs failed, {disks.delayed_fsyncs} fsyncs delayed, "
            f"{disks.restarts} nodes started again",
            highlight=False,
        )
        console.print(
            "seconds of failed or refused writes, by fault: "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(report.fault_cost_s.items())),
            highlight=False,
        )
    console.print("checked: " + ", ".join(f"{k} {v}" for k, v in report.checked.items()))
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    for reason in report.ineffective:
        console.print(f"[yellow]ineffective:[/yellow] {reason}")
    if report.violations:
        console.print(f"[red]{len(report.violations)} violation(s):[/red]")
        for violation in report.violations:
            console.print(f"  [red]{violation.kind}[/red]: {violation.detail}", highlight=False)
    else:
        console.print("[green]no violations[/green]")
    where = f"; state kept in {report.directory}" if report.directory else ""
    console.print(
        f"seed {report.seed}, {report.duration_s:.0f} s of faults, {report.elapsed_s:.0f} s in "
        f"all{where}",
        highlight=False,
    )
