"""Coordination-plane benchmark: raftwal against etcd 3.4, same harness, same machine.

Three raftwal nodes on loopback with durable settings (the Raft journal is fsynced before
any acknowledgement), and in the same run three etcd 3.4 members on loopback (default
fsync behaviour), each driven through its client API with one persistent connection per
client:

- sequential write latency p50/p99, through the leader and through a follower. raftwal's
  write is one Lock or one Unlock RPC on a key of the client's own lease (the client
  alternates them, so the state stays bounded as etcd's overwritten key does); a Lock+Unlock
  pair counts as two writes. etcd's write is one put of the client's own key.
- linearizable read latency: raftwal DescribeChannels (LINEARIZABLE, one pchannel); etcd
  range of one key (the default, linearizable).
- throughput: 64 concurrent clients, spread round-robin over the three members, closed loop
  for a fixed duration after a warm-up; writes/s, latency under load, errors by kind.
- shared-client throughput: the same 64 callers, closed loop, sharing one SDK client for
  the whole benchmark process (raftwal: one `CoordinatorClient` over all endpoints, which
  sends writes to the leader and coalesces concurrent ones into `BatchWrite` calls). etcd's
  own benchmark tool shares a few gRPC connections among its clients the same way; etcd
  here speaks HTTP/1.1 JSON, which cannot carry concurrent requests on one connection, so
  its "shared" phase keeps one keep-alive connection per caller (its best case).
- leader failover: kill -9 the leader, then time to the first successful write through the
  surviving members (a probe starts every 50 ms, each bounded by its own timeout, so one
  probe stuck on the dead leader does not hide the recovery); the killed member is
  restarted and the cluster is healthy again before the next trial.

Latency and throughput phases run `--repeats` times, alternating the systems, and the
report gives the median of the per-repetition values (the machine is shared and noisy).

    python bench/coord.py [--quick] [--trials 10] [--duration-s 10] [--skip-etcd] [--json]

Targets (issue #17), as ratios to etcd in the same run: writes/s with shared clients >=
2.0x, writes/s with one client per caller >= 1.0x, write p50 via leader <= 1.5x,
linearizable read p50 via leader <= 1.5x, members' CPU per write <= 1.5x, failover p50
<= 1.0x.
etcd comes from `scripts/install-etcd.sh`. Every process started here is stopped by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
from _harness import (
    TRANSPORT_ERRORS,
    ErrorTypes,
    FirstSuccess,
    HttpConnection,
    Latencies,
    Throughput,
    closed_loop,
    first_success,
    kill9,
    median,
    own_cpu_seconds,
    percentile,
    sequential,
    stop_process,
    tree_cpu_seconds,
    wait_until,
)
from rich.console import Console
from rich.table import Table

from raftwal.cli import dev
from raftwal.cli.dev import free_ports
from rpc.client import AlreadyExistsError, CoordinatorClient
from rpc.errors import RaftwalError
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api

ERRORS: ErrorTypes = (*TRANSPORT_ERRORS, grpc.RpcError, RaftwalError, asyncio.TimeoutError)

# Targets from issue #17: (summary key, label, comparison, ratio to etcd).
TARGETS = (
    ("shared_throughput_per_s", "writes/s, shared clients", ">=", 2.0),
    ("throughput_per_s", "writes/s, one client per caller", ">=", 1.0),
    ("write_leader_p50_ms", "write p50 via leader", "<=", 1.5),
    ("read_leader_p50_ms", "linearizable read p50 via leader", "<=", 1.5),
    ("members_cpu_ms_per_write", "members' CPU per write", "<=", 1.5),
    ("failover_p50_s", "failover p50", "<=", 1.0),
)

# Per-request bounds.
REQUEST_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.05
PROBE_MAX_IN_FLIGHT = 40
FAILOVER_BUDGET_S = 30.0
HEALTHY_TIMEOUT_S = 90.0
# Settle time after a restarted member rejoined, before the next trial.
SETTLE_S = 1.0
# raftwal leases held by benchmark clients; far above the longest run.
LEASE_TTL_MS = 3_600_000
# Applied indexes within this distance count as caught up.
CAUGHT_UP_ENTRIES = 50

console = Console(stderr=True)


def say(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)


# -- the harness's view of a system -------------------------------------------------------


class Client(Protocol):
    # True while a request is outstanding on a client that cannot multiplex (HTTP/1.1).
    busy: bool

    async def write(self) -> None:
        """One write (bounded by REQUEST_TIMEOUT_S)."""

    async def read(self) -> None:
        """One linearizable read."""

    async def probe(self, timeout_s: float) -> None:
        """One idempotent write for the failover probe, bounded by `timeout_s`."""

    async def close(self) -> None: ...


class System(Protocol):
    name: str
    write_unit: str
    read_unit: str

    def members(self) -> list[str]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def leader(self) -> str:
        """The id of the current leader, as the members agree on it."""

    async def client(self, member: str, index: int) -> Client: ...

    async def shared_clients(self, count: int) -> tuple[list[Any], Callable[[], Awaitable[None]]]:
        """`count` callers sharing the process's client(s), and how to close them."""
        ...

    async def kill(self, member: str) -> None:
        """kill -9 the member's process and reap it."""

    async def restart(self, member: str) -> None: ...

    async def healthy(self) -> str | None:
        """None when every member is up, agrees on a leader and has caught up; else why."""

    def version(self) -> str: ...

    def pids(self) -> dict[str, int]:
        """The running members' process ids (for CPU accounting)."""


# -- raftwal ------------------------------------------------------------------------------


class RaftwalSdkClient:
    """The same slice over the SDK (rpc.client.CoordinatorClient) pinned to one endpoint,
    with one attempt per call: the harness does its own timing, retries and failover
    probing, and followers forward writes to the leader themselves."""

    def __init__(self, endpoint: str, name: str, shared: CoordinatorClient | None = None) -> None:
        self._owned = shared is None
        self._sdk = shared or CoordinatorClient(
            [endpoint],
            timeout_s=REQUEST_TIMEOUT_S,
            attempt_timeout_s=REQUEST_TIMEOUT_S,
            max_attempts=1,
            # A private subchannel pool: each benchmark client gets its own TCP connection,
            # like an independent application (and like etcd's one connection per client).
            channel_options=[("grpc.use_local_subchannel_pool", 1)],
        )
        self.name = name
        self.lease_id = 0

    async def grant_lease(self, ttl_ms: int) -> int:
        reply = await self._sdk.grant_lease(ttl_ms, holder=self.name)
        self.lease_id = reply.lease_id
        return reply.lease_id

    async def revoke_lease(self) -> None:
        await self._sdk.revoke_lease(self.lease_id)

    async def lock(self, key: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        await asyncio.wait_for(self._sdk.lock(key, self.lease_id), timeout_s)

    async def unlock(self, key: str) -> None:
        await self._sdk.unlock(key, self.lease_id)

    async def describe_channel(self, pchannel: str) -> None:
        await self._sdk.describe_channels([pchannel], linearizable=True)

    async def create_channel(self, pchannel: str) -> None:
        with contextlib.suppress(AlreadyExistsError):
            await self._sdk.create_channels(names=[pchannel])

    async def cluster_status(self, timeout_s: float = 2.0) -> api.ClusterStatusResponse:
        return await asyncio.wait_for(self._sdk.cluster_status(linearizable=False), timeout_s)

    async def close(self) -> None:
        if self._owned:
            await self._sdk.close()


def make_raftwal_client(endpoint: str, name: str) -> RaftwalSdkClient:
    return RaftwalSdkClient(endpoint, name)


READ_PCHANNEL = "bench_read"
PROBE_KEY = "bench/failover"


class RaftwalBenchClient:
    """Writes alternate Lock and Unlock of one key held by this client's own lease."""

    def __init__(self, sdk: RaftwalSdkClient, key: str) -> None:
        self._sdk = sdk
        self._key = key
        self._held = False
        # gRPC multiplexes calls over one HTTP/2 connection: never busy.
        self.busy = False

    async def write(self) -> None:
        # On an error the same call is repeated next time: Lock is idempotent for the
        # holder, Unlock of a key not held is a no-op.
        if self._held:
            await self._sdk.unlock(self._key)
        else:
            await self._sdk.lock(self._key)
        self._held = not self._held

    async def read(self) -> None:
        await self._sdk.describe_channel(READ_PCHANNEL)

    async def probe(self, timeout_s: float) -> None:
        # Its own key: another client's lease holding the probe key would make this fail.
        await self._sdk.lock(f"{PROBE_KEY}/{self._key}", timeout_s)

    async def close(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._sdk.revoke_lease()
        await self._sdk.close()


class RaftwalSystem:
    name = "raftwal"
    write_unit = "Lock or Unlock RPC (a pair = 2 writes)"
    read_unit = "DescribeChannels LINEARIZABLE (1 pchannel)"

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._cluster: dev.LocalCluster | None = None
        self._status_clients: dict[str, RaftwalSdkClient] = {}

    @property
    def cluster(self) -> dev.LocalCluster:
        assert self._cluster is not None, "raftwal cluster not started"
        return self._cluster

    def members(self) -> list[str]:
        return [n.id for n in self.cluster.config.nodes]

    def pids(self) -> dict[str, int]:
        return {m: pid for m in self.members() if (pid := self.cluster.pid(m)) is not None}

    def version(self) -> str:
        from importlib.metadata import version

        return version("raftwal")

    async def start(self) -> None:
        self._cluster = await asyncio.to_thread(dev.up, self._directory, 3)
        for node in self.cluster.config.nodes:
            self._status_clients[node.id] = make_raftwal_client(node.grpc_address, "status")
        sdk = make_raftwal_client(self.cluster.endpoints[0], "setup")
        try:
            await sdk.create_channel(READ_PCHANNEL)
        finally:
            await sdk.close()

    async def stop(self) -> None:
        for sdk in self._status_clients.values():
            await sdk.close()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.stop_all)

    async def _statuses(self) -> dict[str, api.ClusterStatusResponse | str]:
        async def one(member: str) -> api.ClusterStatusResponse | str:
            if self.cluster.pid(member) is None:
                return "not running"
            try:
                return await self._status_clients[member].cluster_status()
            except (grpc.aio.AioRpcError, RaftwalError, TimeoutError) as error:
                return getattr(error, "code_name", type(error).__name__)

        members = self.members()
        answers = await asyncio.gather(*(one(m) for m in members))
        return dict(zip(members, answers, strict=True))

    async def leader(self) -> str:
        async def check() -> str | None:
            statuses = await self._statuses()
            leaders = {s.leader_node_id for s in statuses.values() if not isinstance(s, str)}
            if len(leaders) == 1 and "" not in leaders:
                return None
            return f"leaders seen: {statuses_summary(statuses)}"

        await wait_until(check, HEALTHY_TIMEOUT_S)
        statuses = await self._statuses()
        return next(s.leader_node_id for s in statuses.values() if not isinstance(s, str))

    async def healthy(self) -> str | None:
        statuses = await self._statuses()
        bad = {m: s for m, s in statuses.items() if isinstance(s, str)}
        if bad:
            return f"members not answering: {bad}"
        answers = [s for s in statuses.values() if not isinstance(s, str)]
        leaders = {s.leader_node_id for s in answers}
        if len(leaders) != 1 or "" in leaders:
            return f"no agreed leader ({sorted(leaders)})"
        up = [n.node_id for n in answers[0].nodes if n.state == pb.NODE_STATE_UP]
        if len(up) < len(self.members()):
            return f"nodes UP in the state: {up}"
        applied = [m.applied_index for m in answers[0].members if m.reachable]
        if len(applied) < len(self.members()) or max(applied) - min(applied) > CAUGHT_UP_ENTRIES:
            return f"members not caught up (applied indexes {applied})"
        return None

    async def client(self, member: str, index: int) -> RaftwalBenchClient:
        sdk = make_raftwal_client(self.cluster.node(member).grpc_address, f"bench-{index}")
        await sdk.grant_lease(LEASE_TTL_MS)
        return RaftwalBenchClient(sdk, f"bench/k{index}")

    async def kill(self, member: str) -> None:
        self.cluster.kill(member)

    async def shared_clients(
        self, count: int
    ) -> tuple[list[RaftwalBenchClient], Callable[[], Awaitable[None]]]:
        """`count` callers over one SDK client (all endpoints, writes coalesced)."""
        shared = CoordinatorClient(
            self.cluster.endpoints,
            timeout_s=REQUEST_TIMEOUT_S,
            attempt_timeout_s=REQUEST_TIMEOUT_S,
        )
        clients = []
        for k in range(count):
            sdk = RaftwalSdkClient("", f"shared-{k}", shared)
            clients.append(RaftwalBenchClient(sdk, f"bench/s{k}"))
        leases = await asyncio.gather(*(c._sdk.grant_lease(LEASE_TTL_MS) for c in clients))
        assert all(leases)

        async def close() -> None:
            for client in clients:
                await client.close()
            await shared.close()

        self.last_shared = shared
        return clients, close

    async def restart(self, member: str) -> None:
        self.cluster.start_node(member)
        self.cluster.write_cluster_file()


def statuses_summary(statuses: dict[str, Any]) -> str:
    return ", ".join(
        f"{m}: {s if isinstance(s, str) else s.leader_node_id or '-'}" for m, s in statuses.items()
    )


# -- etcd ---------------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


class EtcdBenchClient:
    """One keep-alive HTTP/1.1 connection to one member's v3 JSON gateway."""

    def __init__(self, member: EtcdMember, index: int) -> None:
        self._connection = HttpConnection("127.0.0.1", member.client_port, REQUEST_TIMEOUT_S)
        self._put = {"key": _b64(f"bench/k{index}"), "value": _b64("v" * 16)}
        self._range = {"key": _b64("bench/read")}
        self._probe = {"key": _b64(PROBE_KEY), "value": _b64("probe")}

    async def write(self) -> None:
        await self._connection.post_json("/v3/kv/put", self._put)

    async def put(self, key: str, value: str) -> None:
        await self._connection.post_json("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    async def read(self) -> None:
        await self._connection.post_json("/v3/kv/range", self._range)

    async def probe(self, timeout_s: float) -> None:
        await self._connection.post_json("/v3/kv/put", self._probe, timeout_s)

    async def status(self, timeout_s: float = 2.0) -> dict[str, Any]:
        reply = await self._connection.post_json("/v3/maintenance/status", {}, timeout_s)
        assert isinstance(reply, dict), f"unexpected status answer {reply!r}"
        return reply

    @property
    def busy(self) -> bool:
        return self._connection.busy

    async def close(self) -> None:
        await self._connection.close()


class EtcdSystem:
    name = "etcd"
    write_unit = "put (JSON gateway)"
    read_unit = "range, linearizable (JSON gateway)"

    def __init__(self, directory: Path, binary: str) -> None:
        self._directory = directory
        self._binary = binary
        ports = free_ports(6)
        self._members = {
            f"e{k + 1}": EtcdMember(
                name=f"e{k + 1}",
                client_port=ports[2 * k],
                peer_port=ports[2 * k + 1],
                data_dir=directory / f"e{k + 1}",
                log_path=directory / f"e{k + 1}.log",
            )
            for k in range(3)
        }
        self._status_clients: dict[str, EtcdBenchClient] = {}
        self._ids: dict[str, str] = {}

    def members(self) -> list[str]:
        return list(self._members)

    def pids(self) -> dict[str, int]:
        return {n: m.process.pid for n, m in self._members.items() if m.process is not None}

    def member(self, name: str) -> EtcdMember:
        return self._members[name]

    def version(self) -> str:
        out = subprocess.run(
            [self._binary, "--version"], capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.splitlines()[0].removeprefix("etcd Version: ").strip()

    def _command(self, member: EtcdMember) -> list[str]:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self._members.values())
        return [
            self._binary,
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            member.client_url,
            "--advertise-client-urls",
            member.client_url,
            "--listen-peer-urls",
            member.peer_url,
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster",
            initial,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"coord-bench-{self._directory.name}",
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]

    def _spawn(self, member: EtcdMember) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        with open(member.log_path, "ab") as log:
            member.process = subprocess.Popen(
                self._command(member),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    async def start(self) -> None:
        for member in self._members.values():
            self._spawn(member)
            self._status_clients[member.name] = EtcdBenchClient(member, -1)
        await wait_until(self.healthy, HEALTHY_TIMEOUT_S, 0.2)
        writer = EtcdBenchClient(next(iter(self._members.values())), -1)
        try:
            await writer.put("bench/read", "r" * 16)
        finally:
            await writer.close()

    async def stop(self) -> None:
        for client in self._status_clients.values():
            await client.close()
        for member in self._members.values():
            if member.process is not None:
                await asyncio.to_thread(stop_process, member.process)
                member.process = None

    async def _statuses(self) -> dict[str, dict[str, Any] | str]:
        async def one(name: str) -> dict[str, Any] | str:
            member = self._members[name]
            if member.process is None or member.process.poll() is not None:
                return "not running"
            try:
                return await self._status_clients[name].status()
            except ERRORS as error:
                return type(error).__name__

        names = self.members()
        answers = await asyncio.gather(*(one(n) for n in names))
        return dict(zip(names, answers, strict=True))

    async def healthy(self) -> str | None:
        statuses = await self._statuses()
        bad = {m: s for m, s in statuses.items() if isinstance(s, str)}
        if bad:
            return f"members not answering: {bad}"
        answers = {m: s for m, s in statuses.items() if not isinstance(s, str)}
        for name, status in answers.items():
            self._ids[name] = str(status["header"]["member_id"])
        leaders = {str(s.get("leader", "0")) for s in answers.values()}
        if len(leaders) != 1 or "0" in leaders:
            return f"no agreed leader ({sorted(leaders)})"
        indexes = [int(s.get("raftIndex", 0)) for s in answers.values()]
        if max(indexes) - min(indexes) > CAUGHT_UP_ENTRIES:
            return f"members not caught up (raft indexes {indexes})"
        return None

    async def leader(self) -> str:
        await wait_until(self.healthy, HEALTHY_TIMEOUT_S, 0.1)
        statuses = await self._statuses()
        leader_id = next(str(s["leader"]) for s in statuses.values() if not isinstance(s, str))
        for name, member_id in self._ids.items():
            if member_id == leader_id:
                return name
        raise AssertionError(f"leader {leader_id} is none of the members {self._ids}")

    async def client(self, member: str, index: int) -> EtcdBenchClient:
        return EtcdBenchClient(self._members[member], index)

    async def shared_clients(
        self, count: int
    ) -> tuple[list[EtcdBenchClient], Callable[[], Awaitable[None]]]:
        """HTTP/1.1 carries one request at a time per connection: sharing one among the
        callers would serialize them, so each caller keeps its own (etcd's best case)."""
        members = self.members()
        clients = [
            EtcdBenchClient(self._members[members[k % len(members)]], 50_000 + k)
            for k in range(count)
        ]

        async def close() -> None:
            for client in clients:
                await client.close()

        return clients, close

    async def kill(self, member: str) -> None:
        process = self._members[member].process
        assert process is not None, f"etcd member {member} is not running"
        kill9(process)
        self._members[member].process = None
        await self._status_clients[member].close()

    async def restart(self, member: str) -> None:
        self._spawn(self._members[member])


# -- phases -------------------------------------------------------------------------------


@dataclass
class Settings:
    repeats: int
    sequential_ops: int
    sequential_budget_s: float
    clients: int
    duration_s: float
    warmup_s: float
    trials: int
    failover: bool


@dataclass
class CpuUse:
    """CPU seconds spent during the measured load window, by the benchmark process (the
    clients) and by each member process."""

    window_s: float
    client_s: float
    members_s: dict[str, float]

    def summary(self) -> dict[str, object]:
        return {
            "window_s": round(self.window_s, 3),
            "client_s": round(self.client_s, 3),
            "members_s": {m: round(v, 3) for m, v in self.members_s.items()},
        }


async def sample_cpu(system: System, warmup_s: float, duration_s: float) -> CpuUse:
    await asyncio.sleep(warmup_s)
    pids = system.pids()
    start = time.perf_counter()
    client0 = own_cpu_seconds()
    members0 = {m: tree_cpu_seconds(pid) for m, pid in pids.items()}
    await asyncio.sleep(duration_s)
    client1 = own_cpu_seconds()
    members1 = {m: tree_cpu_seconds(pid) for m, pid in pids.items()}
    return CpuUse(
        time.perf_counter() - start,
        client1 - client0,
        {m: members1[m] - members0[m] for m in pids},
    )


@dataclass
class RepetitionResult:
    write_leader: Latencies
    write_follower: Latencies
    read_leader: Latencies
    read_follower: Latencies
    load: Throughput
    cpu: CpuUse
    # The leader at the start of the repetition and after it (a change shows an election).
    leaders: tuple[str, str]
    shared_load: Throughput | None = None
    shared_cpu: CpuUse | None = None
    # (BatchWrite calls, writes they carried) of the shared raftwal client.
    shared_batches: tuple[int, int] = (0, 0)

    def summary(self) -> dict[str, object]:
        return {
            "leaders": list(self.leaders),
            "write_leader": self.write_leader.summary(),
            "write_follower": self.write_follower.summary(),
            "read_leader": self.read_leader.summary(),
            "read_follower": self.read_follower.summary(),
            "load": self.load.summary(),
            "load_cpu": self.cpu.summary(),
            "shared_load": None if self.shared_load is None else self.shared_load.summary(),
            "shared_load_cpu": None if self.shared_cpu is None else self.shared_cpu.summary(),
            "shared_batches": list(self.shared_batches),
        }


@dataclass
class FailoverResult:
    trials_s: list[float | None] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    probes: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    recovery_s: list[float] = field(default_factory=list)

    def completed(self) -> list[float]:
        return [t for t in self.trials_s if t is not None]

    def summary(self) -> dict[str, object]:
        done = self.completed()
        return {
            "trials": len(self.trials_s),
            "failed_trials": len(self.trials_s) - len(done),
            "p50_s": round(median(done), 3) if done else math.nan,
            "min_s": round(min(done), 3) if done else math.nan,
            "max_s": round(max(done), 3) if done else math.nan,
            "p90_s": round(percentile(done, 0.9), 3) if done else math.nan,
            "per_trial_s": [None if t is None else round(t, 3) for t in self.trials_s],
            "killed": self.killed,
            "probes": self.probes,
            "probe_errors": dict(self.errors),
            "rejoin_s": [round(t, 2) for t in self.recovery_s],
        }


async def _with_client(
    system: System, member: str, index: int, work: Callable[[Client], Awaitable[Latencies]]
) -> Latencies:
    client = await system.client(member, index)
    try:
        return await work(client)
    finally:
        await client.close()


async def run_repetition(system: System, settings: Settings) -> RepetitionResult:
    leader = await system.leader()
    follower = next(m for m in system.members() if m != leader)
    ops, budget = settings.sequential_ops, settings.sequential_budget_s

    def writes(client: Client) -> Awaitable[Latencies]:
        return sequential(client.write, ops, budget, ERRORS)

    def reads(client: Client) -> Awaitable[Latencies]:
        return sequential(client.read, ops, budget, ERRORS)

    # Client indexes 10_000+ are for single clients; 0.. for the concurrent ones.
    write_leader = await _with_client(system, leader, 10_000, writes)
    write_follower = await _with_client(system, follower, 10_001, writes)
    read_leader = await _with_client(system, leader, 10_002, reads)
    read_follower = await _with_client(system, follower, 10_003, reads)

    members = system.members()
    clients = [await system.client(members[k % len(members)], k) for k in range(settings.clients)]

    def step(client: Client) -> Callable[[], Awaitable[int]]:
        async def one() -> int:
            await client.write()
            return 1

        return one

    try:
        cpu_task = asyncio.create_task(sample_cpu(system, settings.warmup_s, settings.duration_s))
        load = await closed_loop(
            [step(c) for c in clients], settings.duration_s, settings.warmup_s, ERRORS
        )
        cpu = await cpu_task
    finally:
        for client in clients:
            await client.close()

    shared, close_shared = await system.shared_clients(settings.clients)
    sdk = getattr(system, "last_shared", None)
    # getattr: the same file also drives older checkouts (A/B runs) whose SDK has no batches.
    before = getattr(sdk, "write_batches", (0, 0))
    try:
        cpu_task = asyncio.create_task(sample_cpu(system, settings.warmup_s, settings.duration_s))
        shared_load = await closed_loop(
            [step(c) for c in shared], settings.duration_s, settings.warmup_s, ERRORS
        )
        shared_cpu = await cpu_task
        after = getattr(sdk, "write_batches", (0, 0))
    finally:
        await close_shared()
    leaders = (leader, await system.leader())
    return RepetitionResult(
        write_leader,
        write_follower,
        read_leader,
        read_follower,
        load,
        cpu,
        leaders,
        shared_load,
        shared_cpu,
        (after[0] - before[0], after[1] - before[1]),
    )


async def failover_trial(system: System) -> tuple[str, FirstSuccess]:
    """Kill -9 the leader and time the first successful write through the survivors."""
    leader = await system.leader()
    survivors = [m for m in system.members() if m != leader]
    # Warm connections to every survivor; a connection-per-request client (HTTP/1.1) that
    # is still busy with an earlier probe gets a new one from `pool`.
    pool = [await system.client(m, 20_000 + k) for k, m in enumerate(survivors)]
    for client in pool:
        await client.probe(REQUEST_TIMEOUT_S)

    async def probe(k: int) -> None:
        client = pool[k % len(survivors)]
        if client.busy:
            client = next((c for c in pool if not c.busy), None) or await system.client(
                survivors[k % len(survivors)], 30_000 + k
            )
            if client not in pool:
                pool.append(client)
        await client.probe(PROBE_TIMEOUT_S)

    t0 = time.perf_counter()
    await system.kill(leader)
    try:
        outcome = await first_success(
            probe, t0, FAILOVER_BUDGET_S, PROBE_INTERVAL_S, PROBE_MAX_IN_FLIGHT, ERRORS
        )
    finally:
        for client in pool:
            await client.close()
    return leader, outcome


async def run_failover(system: System, settings: Settings) -> FailoverResult:
    result = FailoverResult()
    for trial in range(settings.trials):
        await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
        await asyncio.sleep(SETTLE_S)
        leader, outcome = await failover_trial(system)
        result.trials_s.append(outcome.elapsed_s)
        result.killed.append(leader)
        result.probes.append(outcome.probes)
        result.errors.update(outcome.errors)
        shown = "none within budget" if outcome.elapsed_s is None else f"{outcome.elapsed_s:.3f} s"
        say(
            f"{system.name} failover trial {trial + 1}/{settings.trials}: killed {leader}, "
            f"first write after {shown} ({outcome.probes} probes, errors {dict(outcome.errors)})"
        )
        rejoin_start = time.perf_counter()
        await system.restart(leader)
        await wait_until(system.healthy, HEALTHY_TIMEOUT_S, 0.2)
        result.recovery_s.append(time.perf_counter() - rejoin_start)
    return result


async def warm_up(system: System) -> None:
    leader = await system.leader()
    client = await system.client(leader, 40_000)
    try:
        await sequential(client.write, 200, 10.0, ERRORS)
        await sequential(client.read, 100, 10.0, ERRORS)
    finally:
        await client.close()


# -- report -------------------------------------------------------------------------------


def summarize(reps: list[RepetitionResult]) -> dict[str, float]:
    def med(pick: Callable[[RepetitionResult], float]) -> float:
        return median([pick(r) for r in reps])

    return {
        "write_leader_p50_ms": med(lambda r: r.write_leader.p50_ms),
        "write_leader_p99_ms": med(lambda r: r.write_leader.p99_ms),
        "write_follower_p50_ms": med(lambda r: r.write_follower.p50_ms),
        "write_follower_p99_ms": med(lambda r: r.write_follower.p99_ms),
        "read_leader_p50_ms": med(lambda r: r.read_leader.p50_ms),
        "read_leader_p99_ms": med(lambda r: r.read_leader.p99_ms),
        "read_follower_p50_ms": med(lambda r: r.read_follower.p50_ms),
        "read_follower_p99_ms": med(lambda r: r.read_follower.p99_ms),
        "throughput_per_s": med(lambda r: r.load.per_s),
        "load_p50_ms": med(lambda r: r.load.latencies.p50_ms),
        "load_p99_ms": med(lambda r: r.load.latencies.p99_ms),
        # CPU during the load window: the benchmark's clients (share of one core) and the
        # members together (CPU milliseconds per acknowledged write).
        "client_cpu_share": med(lambda r: r.cpu.client_s / r.cpu.window_s),
        "members_cpu_ms_per_write": med(
            lambda r: 1000 * sum(r.cpu.members_s.values()) / max(1, r.load.operations)
        ),
        "members_cpu_share": med(lambda r: sum(r.cpu.members_s.values()) / r.cpu.window_s),
        "shared_throughput_per_s": med(lambda r: r.shared_load.per_s if r.shared_load else 0.0),
        "shared_load_p50_ms": med(
            lambda r: r.shared_load.latencies.p50_ms if r.shared_load else math.nan
        ),
        "shared_load_p99_ms": med(
            lambda r: r.shared_load.latencies.p99_ms if r.shared_load else math.nan
        ),
        "shared_members_cpu_ms_per_write": med(
            lambda r: (
                1000 * sum(r.shared_cpu.members_s.values()) / max(1, r.shared_load.operations)
                if r.shared_load and r.shared_cpu
                else math.nan
            )
        ),
        "shared_errors": float(
            sum(sum(r.shared_load.latencies.errors.values()) for r in reps if r.shared_load)
        ),
        "load_errors": float(sum(sum(r.load.latencies.errors.values()) for r in reps)),
        "sequential_errors": float(
            sum(
                sum(x.errors.values())
                for r in reps
                for x in (r.write_leader, r.write_follower, r.read_leader, r.read_follower)
            )
        ),
    }


ROWS = [
    ("write_leader_p50_ms", "sequential write p50, via leader (ms)", "{:.2f}"),
    ("write_leader_p99_ms", "sequential write p99, via leader (ms)", "{:.2f}"),
    ("write_follower_p50_ms", "sequential write p50, via follower (ms)", "{:.2f}"),
    ("write_follower_p99_ms", "sequential write p99, via follower (ms)", "{:.2f}"),
    ("read_leader_p50_ms", "linearizable read p50, via leader (ms)", "{:.2f}"),
    ("read_leader_p99_ms", "linearizable read p99, via leader (ms)", "{:.2f}"),
    ("read_follower_p50_ms", "linearizable read p50, via follower (ms)", "{:.2f}"),
    ("read_follower_p99_ms", "linearizable read p99, via follower (ms)", "{:.2f}"),
    ("throughput_per_s", "writes/s, {clients} clients", "{:,.0f}"),
    ("load_p50_ms", "write p50 under load (ms)", "{:.2f}"),
    ("load_p99_ms", "write p99 under load (ms)", "{:.2f}"),
    ("load_errors", "errors under load (all repetitions)", "{:.0f}"),
    ("shared_throughput_per_s", "writes/s, {clients} callers sharing one client", "{:,.0f}"),
    ("shared_load_p50_ms", "write p50 under load, shared client (ms)", "{:.2f}"),
    ("shared_load_p99_ms", "write p99 under load, shared client (ms)", "{:.2f}"),
    ("shared_errors", "errors under load, shared client (all repetitions)", "{:.0f}"),
    (
        "shared_members_cpu_ms_per_write",
        "members' CPU per write, shared client (ms)",
        "{:.2f}",
    ),
    ("sequential_errors", "errors in sequential phases (all repetitions)", "{:.0f}"),
    ("members_cpu_share", "members' CPU under load (cores)", "{:.2f}"),
    ("members_cpu_ms_per_write", "members' CPU per write (ms)", "{:.2f}"),
    ("client_cpu_share", "benchmark client CPU under load (cores)", "{:.2f}"),
    ("failover_p50_s", "failover p50: kill -9 leader -> first write (s)", "{:.2f}"),
    ("failover_max_s", "failover max (s)", "{:.2f}"),
]


def targets(raftwal: dict[str, float], etcd: dict[str, float] | None) -> list[dict[str, object]]:
    """Issue #17's targets, each a ratio raftwal / etcd in this run."""
    out: list[dict[str, object]] = []
    if etcd is None:
        return out
    for key, label, op, bound in TARGETS:
        a, b = raftwal.get(key), etcd.get(key)
        if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
            continue
        ratio = a / b
        out.append(
            {
                "target": f"{label} {op} {bound:.1f}x etcd",
                "value": round(ratio, 3),
                "met": ratio >= bound if op == ">=" else ratio <= bound,
            }
        )
    return out


def table_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the results table, shared by the terminal and Markdown output."""
    systems = report["systems"]
    names = list(systems)
    header = ["metric", *(f"{n} {systems[n]['version']}" for n in names)]
    if len(names) == 2:
        header.append("raftwal / etcd")
    rows = []
    for key, label, fmt in ROWS:
        values = [systems[n]["summary"].get(key) for n in names]
        if all(v is None for v in values):
            continue
        cells = ["-" if v is None or math.isnan(v) else fmt.format(v) for v in values]
        if len(names) == 2:
            a, b = values
            ok = a is not None and b is not None and b and not math.isnan(a) and not math.isnan(b)
            cells.append(f"{a / b:.2f}x" if ok else "-")
        rows.append([label.format(clients=report["settings"]["clients"]), *cells])
    return header, rows


def render_markdown(report: dict[str, Any]) -> str:
    header, rows = table_rows(report)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    for target in report["targets"]:
        lines.append(
            f"- target {target['target']}: {target['value']} -> "
            f"{'met' if target['met'] else '**missed**'}"
        )
    return "\n".join(lines)


def render(report: dict[str, Any]) -> None:
    out = Console(width=max(120, Console().width))
    header, rows = table_rows(report)
    table = Table(title=f"Coordination benchmark ({report['date']})")
    for k, name in enumerate(header):
        table.add_column(name, justify="left" if k == 0 else "right")
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for name, system in report["systems"].items():
        out.print(
            f"{name}: write = {system['write_unit']}; read = {system['read_unit']}",
            highlight=False,
        )
    for target in report["targets"]:
        mark = "[green]met[/green]" if target["met"] else "[red]MISSED[/red]"
        out.print(f"target {target['target']}: {target['value']} -> {mark}")


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (< 1 min)")
    parser.add_argument("--trials", type=int, help="failover trials (default 10, quick 2)")
    parser.add_argument(
        "--duration-s", type=float, help="measured throughput window (default 10, quick 2)"
    )
    parser.add_argument("--repeats", type=int, help="latency/throughput repetitions (3; quick 1)")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    parser.add_argument("--ops", type=int, help="sequential operations per phase (1000; 200)")
    parser.add_argument("--skip-etcd", action="store_true", help="measure raftwal only")
    parser.add_argument("--skip-failover", action="store_true", help="no failover trials")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown (BENCHMARKS.md)"
    )
    parser.add_argument(
        "--keep-dir", action="store_true", help="keep data dirs and logs (path on stderr)"
    )
    args = parser.parse_args(argv)
    for name, low, high in (
        ("trials", 0, 100),
        ("repeats", 1, 20),
        ("clients", 1, 1024),
        ("ops", 10, 100_000),
    ):
        value = getattr(args, name)
        if value is not None and not low <= value <= high:
            parser.error(f"invalid --{name} ({value}; expected {low}..{high})")
    if args.duration_s is not None and not 0.5 <= args.duration_s <= 600:
        parser.error(f"invalid --duration-s ({args.duration_s}; expected 0.5..600)")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    quick = args.quick
    return Settings(
        repeats=args.repeats or (1 if quick else 3),
        sequential_ops=args.ops or (200 if quick else 1000),
        sequential_budget_s=10.0 if quick else 30.0,
        clients=args.clients,
        duration_s=args.duration_s or (2.0 if quick else 10.0),
        warmup_s=0.5 if quick else 2.0,
        trials=0
        if args.skip_failover
        else (args.trials if args.trials is not None else (2 if quick else 10)),
        failover=not args.skip_failover,
    )


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    settings = settings_from(args)
    started_at = datetime.datetime.now(datetime.UTC)
    systems: list[System] = [RaftwalSystem(root / "raftwal")]
    if not args.skip_etcd:
        binary = shutil.which("etcd")
        if binary is None:
            raise SystemExit("etcd is not installed: run scripts/install-etcd.sh (or --skip-etcd)")
        systems.append(EtcdSystem(root / "etcd", binary))
    started: list[System] = []
    reps: dict[str, list[RepetitionResult]] = {s.name: [] for s in systems}
    failovers: dict[str, FailoverResult] = {}
    try:
        for system in systems:
            say(f"starting {system.name}")
            started.append(system)
            await system.start()
            await warm_up(system)
        for rep in range(settings.repeats):
            for system in systems:
                say(f"{system.name}: repetition {rep + 1}/{settings.repeats}")
                result = await run_repetition(system, settings)
                reps[system.name].append(result)
                say(
                    f"{system.name}: write p50 {result.write_leader.p50_ms:.2f} ms, read p50 "
                    f"{result.read_leader.p50_ms:.2f} ms, {result.load.per_s:,.0f} writes/s, "
                    f"shared {result.shared_load.per_s if result.shared_load else 0:,.0f} "
                    f"writes/s in {result.shared_batches[0]} batches "
                    f"(errors {dict(result.load.latencies.errors)}; leader "
                    f"{' -> '.join(dict.fromkeys(result.leaders))})"
                )
        if settings.trials:
            for system in systems:
                failovers[system.name] = await run_failover(system, settings)
    finally:
        for system in reversed(started):
            say(f"stopping {system.name}")
            await system.stop()

    report: dict[str, Any] = {
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "settings": settings.__dict__,
        "systems": {},
    }
    for system in systems:
        summary = summarize(reps[system.name])
        entry: dict[str, Any] = {
            "version": system.version(),
            "write_unit": system.write_unit,
            "read_unit": system.read_unit,
            "repetitions": [r.summary() for r in reps[system.name]],
        }
        if system.name in failovers:
            failover = failovers[system.name]
            entry["failover"] = failover.summary()
            done = failover.completed()
            summary["failover_p50_s"] = median(done) if done else math.nan
            summary["failover_max_s"] = max(done) if done else math.nan
        entry["summary"] = {k: round(v, 3) for k, v in summary.items()}
        report["systems"][system.name] = entry
    etcd = report["systems"].get("etcd", {}).get("summary")
    report["targets"] = targets(report["systems"]["raftwal"]["summary"], etcd)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix=f"coord-bench-{uuid.uuid4().hex[:6]}-"))
    say(f"data dirs and logs under {root}")
    # SIGTERM as Ctrl-C: the run is cancelled and stops the clusters it started (their
    # nodes run in sessions of their own, so nothing else would).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        report = asyncio.run(run(args, root))
    finally:
        if not args.keep_dir:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=None, sort_keys=False))
    elif args.markdown:
        print(render_markdown(report))
    else:
        render(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
