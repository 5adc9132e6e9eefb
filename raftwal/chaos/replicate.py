"""``raftwal chaos --replicate``: two dev clusters on this machine, source -> target
(docs/replication.md), a producing workload on the source (plain entries, sent in bursts
of 1-8 messages so that most produce batches hold several, and committed transactions)
and a nemesis on both sides, of the kinds ``--faults`` names: ``kill`` (an owner
SIGKILLed, then started again), ``pause`` (an owner SIGSTOPped, then continued),
``partition`` (between the clusters: every target node paused), ``restart`` (a node
stopped with SIGTERM, then started) and ``power`` (an owner's power cut: SIGKILL, then
every byte its data dir had not fsynced is dropped; every data dir of both clusters is
on a PowerFS mount for the run, which needs FUSE).

Mid-pipeline kills (``MID_PIPELINE_FAULTS``): once the source's replicator of a pchannel
has delivered, the target's replicas of that pchannel are paused so that its owner cannot
commit, bursts are produced on the source until the replicator reports several batches in
flight, then the replicator's node (the source owner) or the target owner that holds
those batches uncommitted is killed, and the replicas resume.

The check, after healing and a bounded wait for the target to catch up: every pchannel of
the target holds the source's committed log, entry for entry and in order (vchannel,
message type, key, payload digest), no entry twice, every transaction whole, and every
acknowledged write is in the source's log. After every fault and at the end, each
checkpoint the source recorded in Raft must be held by the target already (a checkpoint
never ahead of the target's data).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from raftwal.chaos.checker import LogEntry
from raftwal.chaos.observe import _status, read_log, wait_recovered
from raftwal.chaos.workload import NOT_DONE_CODES
from raftwal.cli import dev
from rpc.client import CoordinatorClient, RaftwalError
from rpc.placement import serving_address
from rpc.protos import coordination_pb2 as pb
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from rpc.streaming_client import StreamingClient

SOURCE, TARGET = "source", "target"
#: Mid-pipeline kills: the target's replicas of a pchannel are paused so that its owner
#: cannot commit, bursts are produced on the source until its replicator has several
#: batches in flight, then the replicator's node (the source owner) or the node those
#: batches went to (the target owner) is killed and the replicas resume.
MID_PIPELINE_FAULTS = ("kill-source-mid-pipeline", "kill-target-mid-pipeline")
FAULTS = (
    "kill-source", "kill-target", "pause-source", "pause-target", "partition", "restart",
    *MID_PIPELINE_FAULTS,
)  # fmt: skip
#: `raftwal chaos --faults` names -> the kinds of this mode they stand for.
FAULT_NAMES = {
    "kill": ("kill-source", "kill-target"),
    "pause": ("pause-source", "pause-target"),
    "partition": ("partition",),
    "restart": ("restart",),
    "power": ("power-source", "power-target"),
    "kill-mid-pipeline": MID_PIPELINE_FAULTS,
}
#: The plain producer sends bursts of 1..MAX_BURST messages to one vchannel at once: the
#: SDK puts a burst in one batch (its linger outlasts the burst), so most batches hold
#: several messages (a batch is all or nothing on both clusters, docs/architecture.md).
MAX_BURST = 8


def fault_kinds(names: tuple[str, ...] | None) -> tuple[str, ...]:
    """The kinds of this mode for `raftwal chaos --faults` names (None: every kind but
    power); ValueError naming an unknown one."""
    if names is None:
        return FAULTS
    unknown = sorted(set(names) - set(FAULT_NAMES))
    if unknown or not names:
        raise ValueError(
            f"invalid --faults for --replicate ({','.join(unknown) or 'none'}; expected a "
            f"subset of {','.join(FAULT_NAMES)})"
        )
    return tuple(kind for name in names for kind in FAULT_NAMES[name])


START_TIMEOUT_S = 120.0
CATCH_UP_TIMEOUT_S = 180.0
#: Messages of a mid-pipeline fault's burst, at most how many bursts it starts, and how
#: long it waits for the replicator (and then for batches in flight).
BURST_MESSAGES = 3000
BURSTS_PER_FAULT = 3
PIPELINE_WAIT_S = 15.0


@dataclass
class ReplicateReport:
    seed: int
    duration_s: float
    directory: str = ""
    faults: list[dict[str, Any]] = field(default_factory=list)
    acked: int = 0
    txns_committed: int = 0
    source_entries: dict[str, int] = field(default_factory=dict)
    #: keys found more than once among the data entries of each side's log
    duplicates: dict[str, int] = field(default_factory=lambda: {SOURCE: 0, TARGET: 0})
    #: the plain producer's bursts of more than one message, and its stats (batches and
    #: messages acknowledged, batches retried, retries answered as duplicates)
    multi_message_bursts: int = 0
    producer: dict[str, int] = field(default_factory=dict)
    #: bytes the power cuts dropped (faults "power-source", "power-target")
    power_bytes_dropped: int = 0
    violations: list[str] = field(default_factory=list)
    # Comparisons of the checkpoints the source recorded in Raft with what the target
    # held right after (each one a source LSN the target must hold already).
    checkpoint_checks: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": "replicate",
            "seed": self.seed,
            "duration_s": self.duration_s,
            "directory": self.directory,
            "faults": self.faults,
            "acked_produces": self.acked,
            "committed_txns": self.txns_committed,
            "source_entries": self.source_entries,
            "duplicates": self.duplicates,
            "multi_message_bursts": self.multi_message_bursts,
            "producer": self.producer,
            "power_bytes_dropped": self.power_bytes_dropped,
            "checkpoint_checks": self.checkpoint_checks,
            "violations": self.violations,
            "ok": self.ok,
        }


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    return env


def _signal(cluster: dev.LocalCluster, node_id: str, signum: int) -> None:
    pid = cluster.pid(node_id)
    if pid is not None:
        # Every process of the node: its supervisor, control process and data workers.
        dev.signal_node(pid, signum)


class _Workload:
    """Plain produces (one idempotent SDK producer) and transactions of 2..4 entries on the
    source; `acked` holds the keys the source acknowledged, `txns` the committed txns."""

    def __init__(self, streaming: StreamingClient, vchannels: list[str], rng: random.Random):
        self.streaming = streaming
        self.vchannels = vchannels
        self.rng = rng
        self.acked: set[str] = set()
        self.txns: dict[str, int] = {}
        self.sent = 0
        #: bursts of more than one message submitted, and the producer's stats when it
        #: stopped (batches and messages acknowledged, retries, duplicates answered)
        self.multi_message_bursts = 0
        self.producer_stats: dict[str, int] = {}
        self.bursts = 0

    async def burst(self, vchannels: list[str], count: int) -> None:
        """`count` messages as fast as the source takes them (a producer of their own),
        to `vchannels`; the acknowledged ones join `acked`."""
        self.bursts += 1
        tag = f"b{self.bursts}"
        producer = self.streaming.producer(
            producer_id=f"chaos-rb-{tag}-{self.rng.randrange(1 << 30)}",
            linger_ms=2,
            max_in_flight=8,
            retry_timeout_s=60.0,
            attempt_timeout_s=5.0,
        )
        try:
            for number in range(count):
                key = f"{tag}:{number}"
                try:
                    future = await asyncio.wait_for(
                        producer.submit(self.rng.choice(vchannels), key.encode() + b"|burst"),
                        30.0,
                    )
                except (RaftwalError, TimeoutError, RuntimeError):
                    continue
                future.add_done_callback(
                    lambda f, key=key: (
                        self.acked.add(key) if not f.cancelled() and f.exception() is None else None
                    )
                )
            with contextlib.suppress(TimeoutError, RaftwalError):
                await asyncio.wait_for(producer.flush(), 60.0)
        finally:
            await producer.close(timeout_s=2.0)

    async def produce(self, stop: asyncio.Event, rate_per_s: float) -> None:
        producer = self.streaming.producer(
            producer_id=f"chaos-rp-{self.rng.randrange(1 << 30)}",
            linger_ms=5,
            max_in_flight=4,
            retry_timeout_s=60.0,
            attempt_timeout_s=5.0,
        )
        try:
            while not stop.is_set():
                # A burst to one vchannel: one batch of `burst` messages, mostly.
                burst = self.rng.randint(1, MAX_BURST)
                vchannel = self.rng.choice(self.vchannels)
                self.multi_message_bursts += burst > 1
                for _ in range(burst):
                    key = f"p:{self.sent}"
                    self.sent += 1
                    try:
                        future = await asyncio.wait_for(
                            producer.submit(vchannel, key.encode() + b"|payload"), 30.0
                        )
                    except (RaftwalError, TimeoutError, RuntimeError):
                        continue
                    future.add_done_callback(
                        lambda f, key=key: (
                            self.acked.add(key)
                            if not f.cancelled() and f.exception() is None
                            else None
                        )
                    )
                await asyncio.sleep(burst / rate_per_s)
            with contextlib.suppress(TimeoutError, RaftwalError):
                await asyncio.wait_for(producer.flush(), 30.0)
        finally:
            stats = producer.stats
            self.producer_stats = {
                "batches_acknowledged": stats.batches_acknowledged,
                "messages_acknowledged": stats.messages_acknowledged,
                "retries": stats.retries,
                "duplicates_answered": stats.duplicates,
            }
            await producer.close(timeout_s=2.0)

    async def transact(self, stop: asyncio.Event) -> None:
        number = 0
        while not stop.is_set():
            number += 1
            size = self.rng.randint(2, 4)
            name = f"t:{number}"
            try:
                async with self.streaming.txn(self.rng.choice(self.vchannels)) as txn:
                    await txn.append(*[f"{name}:{k}/{size}|txn".encode() for k in range(size)])
                    await txn.commit()
                self.txns[name] = size
            except (RaftwalError, grpc.RpcError, TimeoutError, RuntimeError, OSError):
                await asyncio.sleep(0.5)
            await asyncio.sleep(0.2)


def _key(entry: LogEntry) -> str:
    return entry.key


def check_logs(
    source: dict[str, list[LogEntry]],
    target: dict[str, list[LogEntry]],
    acked: set[str],
    txns: dict[str, int],
) -> list[str]:
    """The violations: a target pchannel that is not the source's committed log (data
    entries, in order), a duplicate, a transaction split or partial, an acknowledged write
    missing from the source."""
    problems: list[str] = []
    seen: set[str] = set()
    for pchannel, entries in source.items():
        want = [(e.vchannel, e.msg_type, e.key, e.digest) for e in entries if not e.control]
        got = [
            (e.vchannel, e.msg_type, e.key, e.digest)
            for e in target.get(pchannel, [])
            if not e.control
        ]
        for name, rows in (("source", want), ("target", got)):
            twice = [k for k, n in Counter(r[2] for r in rows if r[2]).items() if n > 1]
            if twice:
                problems.append(f"{name} {pchannel}: {len(twice)} keys twice (e.g. {twice[:3]})")
        if want != got:
            first = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
            problems.append(
                f"target {pchannel} differs from the source at data entry {first} "
                f"(source {len(want)} entries, target {len(got)}; "
                f"source {want[first : first + 1]}, target {got[first : first + 1]})"
            )
        # Transactions whole: the entries of one txn are contiguous and all there.
        keys = [r[2] for r in got]
        groups: dict[str, list[int]] = {}
        for index, key in enumerate(keys):
            if key.startswith("t:"):
                groups.setdefault(key.rsplit(":", 1)[0], []).append(index)
        for name, indexes in groups.items():
            size = int(keys[indexes[0]].rsplit("/", 1)[1])
            if len(indexes) != size or indexes[-1] - indexes[0] != size - 1:
                problems.append(f"target {pchannel}: transaction {name} not whole ({indexes})")
        seen.update(r[2] for r in want)
    lost = sorted(k for k in acked if k not in seen)
    if lost:
        problems.append(f"{len(lost)} acknowledged produces not in the source log: {lost[:5]}")
    missing_txns = sorted(t for t in txns if f"{t}:0/{txns[t]}" not in seen)
    if missing_txns:
        problems.append(f"{len(missing_txns)} committed transactions not in the source log")
    return problems


def duplicate_keys(logs: dict[str, list[LogEntry]]) -> int:
    """How many keys appear more than once among the data entries of `logs` (per
    pchannel, summed)."""
    return sum(
        sum(1 for n in Counter(e.key for e in entries if not e.control and e.key).values() if n > 1)
        for entries in logs.values()
    )


def _owner_address(status: Any, pchannel: str) -> str:
    if status is None:
        return ""
    owners = {p.name: p.owner_node_id for p in status.pchannels}
    # The owner's data worker for the pchannel (DESIGN.md section 2).
    return serving_address(status.nodes, owners.get(pchannel, ""), pchannel)


async def _read_all(endpoints: list[str], pchannels: list[str]) -> dict[str, list[LogEntry]]:
    logs: dict[str, list[LogEntry]] = {}
    for pchannel in pchannels:
        error = "no owner"
        for _ in range(5):
            status = await _status(endpoints, linearizable=True)
            owner = _owner_address(status, pchannel)
            if owner:
                try:
                    logs[pchannel] = await read_log(owner, pchannel, 60.0)
                    break
                except (RuntimeError, grpc.aio.AioRpcError) as failure:
                    error = str(failure)
            await asyncio.sleep(1.0)
        else:
            raise RuntimeError(f"could not read {pchannel}: {error}")
    return logs


async def _checkpoint(endpoints: list[str], pchannel: str) -> int:
    status = await _status(endpoints)
    owner = _owner_address(status, pchannel)
    if not owner:
        return -1
    async with grpc.aio.insecure_channel(owner) as channel:
        try:
            answer = await streaming_pb2_grpc.StreamingNodeStub(channel).GetReplicateCheckpoint(
                wire.GetReplicateCheckpointRequest(
                    pchannel=pchannel, source_cluster_id=SOURCE, source_pchannel=pchannel
                ),
                timeout=5.0,
            )
        except grpc.aio.AioRpcError:
            return -1
    return int(answer.source_lsn)


async def check_checkpoints(
    clusters: dict[str, dev.LocalCluster], pchannels: list[str], report: ReplicateReport
) -> None:
    """Every checkpoint the source recorded in Raft (its replicators' reports) must be held
    by the target already: the recorded source LSN is read first, then what the target
    holds, which can only have grown since. A side that does not answer is skipped."""
    try:
        async with CoordinatorClient(
            clusters[SOURCE].endpoints, timeout_s=5.0, max_attempts=3
        ) as client:
            answer = await client.get_replicate_configuration()
    except (RaftwalError, grpc.RpcError, OSError):
        return
    for pchannel in pchannels:
        recorded = answer.checkpoints[pchannel].source_lsns.get(TARGET, 0)
        if recorded <= 0:
            continue
        held = await _checkpoint(clusters[TARGET].endpoints, pchannel)
        if held < 0:
            continue
        report.checkpoint_checks += 1
        if held < recorded:
            report.violations.append(
                f"the source recorded checkpoint {recorded} of {pchannel} in Raft, but the "
                f"target holds source LSNs only through {held}"
            )


class _Nemesis:
    def __init__(
        self,
        clusters: dict[str, dev.LocalCluster],
        rng: random.Random,
        report: ReplicateReport,
        workload: _Workload | None = None,
        vchannels_of: dict[str, list[str]] | None = None,
        kinds: tuple[str, ...] = FAULTS,
        mounts: dict[tuple[str, str], Any] | None = None,
    ):
        self.clusters = clusters
        self.rng = rng
        self.report = report
        self.workload = workload
        self.vchannels_of = vchannels_of or {}
        self.kinds = kinds
        # (side, node id) -> the PowerMount of its data dir (power faults)
        self.mounts = mounts or {}
        self.paused: list[tuple[dev.LocalCluster, str]] = []
        self.down: list[tuple[dev.LocalCluster, str]] = []
        # The mid-pipeline faults' bursts, still being acknowledged.
        self.bursts: list[asyncio.Task[None]] = []

    async def _replicator(self, pchannel: str, inflight: int) -> tuple[str, int] | None:
        """(node, batches in flight) of the source's replicator of `pchannel` once it has
        delivered something and has at least `inflight` batches in flight; else None."""
        seen = await _status(self.clusters[SOURCE].endpoints)
        for member in seen.members if seen else ():
            for replicator in member.replicators:
                if (
                    replicator.pchannel == pchannel
                    and replicator.target_cluster_id == TARGET
                    and replicator.target_lsn > 0
                    and replicator.inflight_batches >= inflight
                ):
                    return member.node_id, replicator.inflight_batches
        return None

    async def _mid_pipeline(self, kind: str, pchannels: list[str]) -> tuple[str, int]:
        """(detail, batches in flight when the kill came) of a mid-pipeline kill (see
        MID_PIPELINE_FAULTS)."""
        source, target = self.clusters[SOURCE], self.clusters[TARGET]
        pchannel = self.rng.choice(pchannels)
        status = await _status(target.endpoints, linearizable=True)
        channel = next(
            (c for c in (status.pchannels if status else ()) if c.name == pchannel), None
        )
        if channel is None or not channel.owner_node_id or self.workload is None:
            return f"skipped: {TARGET} {pchannel} has no owner", 0
        followers = [n for n in channel.replica_node_ids if n != channel.owner_node_id]
        # The replicator must have delivered once (the target's vchannels exist): pausing
        # the target's replicas also stops its Raft, where a first vchannel is created.
        deadline = time.monotonic() + PIPELINE_WAIT_S
        while time.monotonic() < deadline and await self._replicator(pchannel, 0) is None:
            await asyncio.sleep(0.5)
        for node in followers:
            _signal(target, node, signal.SIGSTOP)
        inflight, runner = 0, ""
        try:
            deadline = time.monotonic() + PIPELINE_WAIT_S
            bursts = 0
            next_burst = time.monotonic()
            while time.monotonic() < deadline and not runner:
                if bursts < BURSTS_PER_FAULT and time.monotonic() >= next_burst:
                    # Another burst while the pipeline is short: each batch in flight
                    # needs FULL_BATCH_LSNS more committed entries than the last one.
                    bursts += 1
                    next_burst = time.monotonic() + PIPELINE_WAIT_S / (BURSTS_PER_FAULT + 1)
                    self.bursts.append(
                        asyncio.create_task(
                            self.workload.burst(self.vchannels_of.get(pchannel, []), BURST_MESSAGES)
                        )
                    )
                found = await self._replicator(pchannel, 2)
                if found is not None:
                    runner, inflight = found
                else:
                    await asyncio.sleep(0.2)
            if kind == "kill-source-mid-pipeline":
                side, cluster = SOURCE, source
                node = runner or await self._owner(SOURCE, [pchannel])
            else:
                side, cluster, node = TARGET, target, channel.owner_node_id
            await asyncio.to_thread(cluster.kill, node)
            self.down.append((cluster, node))
        finally:
            for follower in followers:
                _signal(target, follower, signal.SIGCONT)
        return (
            f"{side} {node} SIGKILL with {inflight} batches of {pchannel} in flight "
            f"({TARGET} replicas {', '.join(followers)} paused meanwhile), started again",
            inflight,
        )

    async def _owner(self, side: str, pchannels: list[str]) -> str:
        status = await _status(self.clusters[side].endpoints)
        owners = [
            p.owner_node_id for p in (status.pchannels if status else ()) if p.name in pchannels
        ]
        owners = [o for o in owners if o]
        return (
            self.rng.choice(owners)
            if owners
            else self.rng.choice([n.id for n in self.clusters[side].config.nodes])
        )

    async def run(self, stop: asyncio.Event, pchannels: list[str], started: float) -> None:
        kinds = list(self.kinds)
        self.rng.shuffle(kinds)
        while not stop.is_set():
            if not kinds:
                kinds = list(self.kinds)
                self.rng.shuffle(kinds)
            kind = kinds.pop()
            hold_s = self.rng.uniform(2.0, 6.0)
            side = TARGET if kind.endswith("target") or kind == "partition" else SOURCE
            cluster = self.clusters[side]
            at = time.monotonic() - started
            inflight = None
            if kind in MID_PIPELINE_FAULTS:
                detail, inflight = await self._mid_pipeline(kind, pchannels)
            elif kind == "partition":
                nodes = [n.id for n in cluster.config.nodes]
                for node in nodes:
                    _signal(cluster, node, signal.SIGSTOP)
                self.paused += [(cluster, n) for n in nodes]
                detail = f"{TARGET} paused whole ({', '.join(nodes)})"
            elif kind == "restart":
                side = self.rng.choice((SOURCE, TARGET))
                cluster = self.clusters[side]
                node = self.rng.choice([n.id for n in cluster.config.nodes])
                await asyncio.to_thread(cluster.kill, node, signal.SIGTERM)
                self.down.append((cluster, node))
                detail = f"{side} {node} stopped (SIGTERM), started again"
            elif kind.startswith("power"):
                node = await self._owner(side, pchannels)
                pid = cluster.pid(node)
                await asyncio.to_thread(cluster.kill, node, signal.SIGKILL)
                self.down.append((cluster, node))
                result = await asyncio.to_thread(self.mounts[(side, node)].crash)
                self.report.power_bytes_dropped += result.bytes_dropped
                detail = (
                    f"{side} owner {node} (pid {pid}) power cut: {result.bytes_dropped} "
                    f"unsynced bytes dropped, {result.files_reverted} files and "
                    f"{result.entries_reverted} directory entries reverted; started again"
                )
            else:
                node = await self._owner(side, pchannels)
                if kind.startswith("kill"):
                    await asyncio.to_thread(cluster.kill, node)
                    self.down.append((cluster, node))
                    detail = f"{side} owner {node} SIGKILL, started again"
                else:
                    _signal(cluster, node, signal.SIGSTOP)
                    self.paused.append((cluster, node))
                    detail = f"{side} owner {node} SIGSTOP/SIGCONT"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), hold_s)
            await self.heal()
            fault: dict[str, Any] = {
                "kind": kind, "at_s": round(at, 1), "hold_s": round(hold_s, 1), "detail": detail,
            }  # fmt: skip
            if inflight is not None:
                fault["inflight_batches"] = inflight
            self.report.faults.append(fault)
            await check_checkpoints(self.clusters, pchannels, self.report)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(3.0, 8.0))

    async def heal(self) -> None:
        for cluster, node in self.paused:
            _signal(cluster, node, signal.SIGCONT)
        self.paused = []
        for cluster, node in self.down:
            await asyncio.to_thread(cluster.start_node, node)
        self.down = []


async def _run(
    seed: int, duration_s: float, directory: Path, pchannel_count: int, rate_per_s: float,
    progress: Callable[[str], None], kinds: tuple[str, ...] = FAULTS, max_lag_ms: int = 0,
) -> ReplicateReport:  # fmt: skip
    report = ReplicateReport(seed, duration_s, str(directory))
    rng = random.Random(seed)
    clusters: dict[str, dev.LocalCluster] = {}
    mounts: dict[tuple[str, str], Any] = {}
    try:
        for side in (SOURCE, TARGET):
            config = dev.make_config(directory / side, 3)
            if side == SOURCE:
                # The source's flow control (docs/replication.md), when asked for: writes
                # held while the target catches up after a fault.
                config = replace(config, replicate_max_lag_ms=max_lag_ms)
            if any(kind.startswith("power") for kind in kinds):
                # FUSE only for power cuts (raftwal.chaos.powerfs): every data dir of
                # both clusters on a PowerFS mount for the whole run.
                from raftwal.chaos.powerfs import PowerMount

                for node in config.nodes:
                    mount = PowerMount(
                        directory / "power" / side / node.id,
                        node.data_dir,
                        directory / f"powerfs-{side}-{node.id}.log",
                    )
                    mounts[(side, node.id)] = mount
                    await asyncio.to_thread(mount.start)
            clusters[side] = await asyncio.to_thread(
                dev.up, directory / side, 3, START_TIMEOUT_S, _env(), config, cluster_id=side
            )
            pids = ", ".join(
                f"{n.id} {clusters[side].pid(n.id)}" for n in clusters[side].config.nodes
            )
            progress(f"{side} cluster up (pids: {pids})")
        source, target = clusters[SOURCE], clusters[TARGET]
        names = [f"crp_{k}" for k in range(pchannel_count)]
        vchannels = [f"crp_v{k}" for k in range(pchannel_count * 2)]
        async with CoordinatorClient(source.endpoints, timeout_s=15.0, max_attempts=60) as client:
            await client.create_channels(names=names)
            for index, vchannel in enumerate(vchannels):
                await client.create_vchannel(vchannel, names[index % len(names)])
        async with CoordinatorClient(target.endpoints, timeout_s=15.0, max_attempts=60) as client:
            await client.create_channels(names=names)
        for side in (SOURCE, TARGET):
            _, missing = await wait_recovered(clusters[side].endpoints, names, START_TIMEOUT_S)
            if missing:
                raise RuntimeError(f"{side}: channels not ready: {missing}")
        configuration = pb.ReplicateConfiguration(
            clusters=[
                pb.ReplicateCluster(cluster_id=SOURCE, endpoints=source.endpoints, pchannels=names),
                pb.ReplicateCluster(cluster_id=TARGET, endpoints=target.endpoints, pchannels=names),
            ],
            topology=[pb.ReplicateTopologyEdge(source_cluster_id=SOURCE, target_cluster_id=TARGET)],
        )
        for side in (SOURCE, TARGET):
            async with CoordinatorClient(clusters[side].endpoints, timeout_s=15.0) as client:
                await client.update_replicate_configuration(configuration)
        progress(f"replicate set: {SOURCE} -> {TARGET}, pchannels {names}")

        coordinator = CoordinatorClient(source.endpoints, timeout_s=15.0, max_attempts=60)
        streaming = StreamingClient(coordinator)
        workload = _Workload(streaming, vchannels, random.Random(rng.getrandbits(64)))
        vchannels_of = {
            name: [v for k, v in enumerate(vchannels) if names[k % len(names)] == name]
            for name in names
        }
        nemesis = _Nemesis(
            clusters,
            random.Random(rng.getrandbits(64)),
            report,
            workload,
            vchannels_of,
            kinds,
            mounts,
        )
        stop = asyncio.Event()
        started = time.monotonic()
        tasks = [
            asyncio.create_task(workload.produce(stop, rate_per_s)),
            asyncio.create_task(workload.transact(stop)),
            asyncio.create_task(nemesis.run(stop, names, started)),
        ]
        try:
            await asyncio.sleep(duration_s)
        finally:
            stop.set()
            await asyncio.wait(tasks, timeout=90.0)
            await nemesis.heal()
            if nemesis.bursts:
                await asyncio.wait(nemesis.bursts, timeout=120.0)
            await streaming.close()
            await coordinator.close()
        progress(f"healed after {len(report.faults)} faults; waiting for the target")
        report.acked, report.txns_committed = len(workload.acked), len(workload.txns)
        report.multi_message_bursts = workload.multi_message_bursts
        report.producer = dict(workload.producer_stats)
        for side in (SOURCE, TARGET):
            await wait_recovered(clusters[side].endpoints, names, START_TIMEOUT_S)
        source_logs = await _read_all(source.endpoints, names)
        report.source_entries = {p: len(e) for p, e in source_logs.items()}
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        behind = list(names)
        while behind and time.monotonic() < deadline:
            last = {
                p: max((e.lsn for e in source_logs[p] if not e.control), default=0) for p in names
            }
            behind = [p for p in names if await _checkpoint(target.endpoints, p) < last[p]]
            if behind:
                await asyncio.sleep(1.0)
        if behind:
            report.violations.append(
                f"the target did not catch up within {CATCH_UP_TIMEOUT_S:.0f} s: {behind}"
            )
        await check_checkpoints(clusters, names, report)
        target_logs = await _read_all(target.endpoints, names)
        report.duplicates = {
            SOURCE: duplicate_keys(source_logs),
            TARGET: duplicate_keys(target_logs),
        }
        report.violations += check_logs(source_logs, target_logs, workload.acked, workload.txns)
        return report
    finally:
        for cluster in clusters.values():
            for node in cluster.config.nodes:
                _signal(cluster, node.id, signal.SIGCONT)
            await asyncio.to_thread(cluster.stop_all)
        # After the nodes: a mount still in use could not be unmounted cleanly.
        for mount in mounts.values():
            await asyncio.to_thread(mount.close)


def run_replicate_chaos(
    seed: int, duration_s: float, directory: Path | None = None, pchannels: int = 2,
    rate_per_s: float = 50.0, progress: Callable[[str], None] | None = None,
    faults: tuple[str, ...] | None = None,
    kinds: tuple[str, ...] | None = None,
    max_lag_ms: int = 0,
) -> ReplicateReport:  # fmt: skip
    """One run; `faults` are `raftwal chaos --faults` names (None: every kind but power),
    or `kinds` the fault kinds themselves (FAULTS, the power ones); `max_lag_ms`: the
    source's replicate_max_lag_ms (0: no flow control). Raises ValueError for a fault
    this mode does not have."""
    if kinds is None:
        kinds = fault_kinds(faults)
    unknown = sorted(set(kinds) - set(FAULTS) - {"power-source", "power-target"})
    if unknown or not kinds:
        raise ValueError(f"invalid fault kinds {unknown or '(none)'} (expected some of {FAULTS})")
    say = progress or (lambda _: None)
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="raftwal-chaos-rp-"))
    directory.mkdir(parents=True, exist_ok=True)
    return asyncio.run(
        _run(seed, duration_s, directory, pchannels, rate_per_s, say, kinds, max_lag_ms)
    )


__all__ = ["NOT_DONE_CODES", "ReplicateReport", "check_logs", "run_replicate_chaos"]
