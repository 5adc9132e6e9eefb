"""A node is a supervisor of a control process and data workers (DESIGN.md section 2),
here with two data workers per node.

- Every node runs exactly a supervisor, a control process and two workers; the workers
  run at a lower priority (a higher niceness) than the control process, in the node's
  session; `ClusterStatus` shows each process with its pid, CPU time and memory; the
  pchannels of a node are spread over its two workers as rpc.placement says, and every
  worker's address is announced through Raft.
- A data worker killed with SIGKILL while the SDK produces is started again by its
  supervisor, its pchannels recover at a new term, and every acknowledged message is read
  back exactly once at its LSN; no send fails.
- The supervisor killed with SIGKILL takes its children with it: no process of the node is
  left, and its ports can be bound again at once.
- SIGTERM stops every process of the node (after its handover), with exit status 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from rpc.placement import serving_address, worker_index
from rpc.protos import coordination_pb2 as pb
from tests.cluster.conftest import Api, converged, running_cluster
from tests.cluster.test_handover import _history_problems, _produce_while
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.timing import scaled

pytestmark = pytest.mark.cluster

WORKERS = 2
PCHANNELS = 6


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    saved = os.environ.get(dev.DATA_WORKERS_ENV)
    os.environ[dev.DATA_WORKERS_ENV] = str(WORKERS)
    try:
        with running_cluster(tmp_path_factory.mktemp("processes")) as running:
            cluster, client = running
            setup_channels(client, "pr", {f"pr_v{index}": index for index in range(PCHANNELS)})
            for index in range(PCHANNELS):
                wait_assigned(client, f"pr_{index}")
            yield running
    finally:
        if saved is None:
            os.environ.pop(dev.DATA_WORKERS_ENV, None)
        else:
            os.environ[dev.DATA_WORKERS_ENV] = saved


def _niceness(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        raw = stat.read()
    return int(raw[raw.rfind(b")") + 2 :].split()[16])


def _until_workers_announced(client: Api) -> pb.CoordinationState:
    deadline = time.monotonic() + scaled(60)
    while True:
        status = client.status()
        if all(len(n.worker_addresses) == WORKERS for n in status.nodes):
            return status
        assert time.monotonic() < deadline, [list(n.worker_addresses) for n in status.nodes]
        time.sleep(0.2)


def test_every_node_runs_a_control_process_and_its_workers(env) -> None:
    cluster, client = env
    status = _until_workers_announced(client)
    for node in cluster.config.nodes:
        supervisor = cluster.pid(node.id)
        assert supervisor is not None
        pids = dev.node_processes(supervisor)
        assert len(pids) == 2 + WORKERS, (node.id, pids)
        member = next(m for m in status.members if m.node_id == node.id)
        kinds = sorted((p.kind, p.index) for p in member.processes)
        assert kinds == [("control", 0), ("supervisor", 0), ("worker", 0), ("worker", 1)]
        by_kind = {(p.kind, p.index): p for p in member.processes}
        assert member.pid == supervisor == by_kind[("supervisor", 0)].pid
        control = by_kind[("control", 0)]
        assert set(pids) == {p.pid for p in member.processes}
        for index in range(WORKERS):
            worker = by_kind[("worker", index)]
            assert worker.up and worker.cpu_seconds > 0 and worker.rss_bytes > 0
            # Scheduled behind the control process, in the node's session (its share of
            # the host is the node's), in a process group of its own.
            assert _niceness(worker.pid) > _niceness(control.pid)
            assert os.sched_getscheduler(worker.pid) == os.SCHED_BATCH
            assert os.sched_getscheduler(control.pid) == os.SCHED_OTHER
            assert os.getsid(worker.pid) == os.getsid(control.pid) == os.getsid(supervisor)
            assert os.getpgid(worker.pid) == worker.pid
            assert worker.grpc_address == f"{node.host}:{node.worker_grpc_ports[index]}"
        announced = next(n for n in status.nodes if n.node_id == node.id)
        assert list(announced.worker_addresses) == [
            by_kind[("worker", k)].grpc_address for k in range(WORKERS)
        ]
    # Each owned pchannel is served by the worker rpc.placement names, and both workers of
    # the cluster's nodes take some: more workers take more load.
    owners = {c.name: c.owner_node_id for c in status.pchannels if c.name.startswith("pr_")}
    used = set()
    for member in status.members:
        for process in member.processes:
            for pchannel in process.owned_pchannels:
                assert owners[pchannel] == member.node_id
                assert worker_index(pchannel, WORKERS) == process.index
                used.add(process.index)
    assert used == set(range(WORKERS)), status.members
    assert len({worker_index(f"pr_{k}", WORKERS) for k in range(PCHANNELS)}) == WORKERS


def test_sigusr1_writes_a_process_stacks_to_the_node_log_and_it_goes_on(env) -> None:
    """`kill -USR1` on any process of a node (supervisor, control, worker) dumps every
    thread's stack to the node's log, and the process keeps serving: what an operator (or
    a test that saw a node hang) asks of a stuck process."""
    cluster, client = env
    node = cluster.config.nodes[0]
    supervisor = cluster.pid(node.id)
    assert supervisor is not None
    log_path = cluster.directory / f"{node.id}.log"
    pids = dev.node_processes(supervisor)
    assert len(pids) == 2 + WORKERS
    for pid in pids:
        before = log_path.read_text(errors="replace").count("Current thread")
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + scaled(30)
        while log_path.read_text(errors="replace").count("Current thread") <= before:
            assert time.monotonic() < deadline, f"no stack dump from pid {pid}"
            time.sleep(0.1)
    assert dev.node_processes(supervisor) == pids
    converged(client)


def test_a_killed_worker_restarts_and_loses_no_acknowledged_message(env) -> None:
    cluster, client = env
    converged(client)
    status = _until_workers_announced(client)
    pchannel = "pr_0"
    owner, term, address = wait_assigned(client, pchannel)
    member = next(m for m in status.members if m.node_id == owner)
    victim = next(
        p for p in member.processes if p.kind == "worker" and pchannel in p.owned_pchannels
    )
    assert address == serving_address(status.nodes, owner, pchannel) == victim.grpc_address
    raft_before = (status.leader_node_id, max(m.raft_term for m in status.members))

    def kill_the_worker() -> None:
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + scaled(60)
        while True:
            now = Api(cluster.endpoints).status()
            channel = next(c for c in now.pchannels if c.name == pchannel)
            if channel.term > term and channel.state == pb.PCHANNEL_STATE_ASSIGNED:
                return
            assert time.monotonic() < deadline, channel
            time.sleep(0.2)

    vchannels = [f"pr_v{index}" for index in range(PCHANNELS)]
    load = asyncio.run(_produce_while(cluster.endpoints, vchannels, kill_the_worker))
    problems = asyncio.run(_history_problems(cluster.endpoints, load))
    print(f"{load.sends} sends, {len(load.acked)} acknowledged, {len(load.failures)} failed")
    assert not load.failures, load.failures[:5]
    assert len(load.acked) > 50
    assert not problems, problems[:5]
    after = client.status()
    restarted = next(m for m in after.members if m.node_id == owner)
    worker = next(p for p in restarted.processes if p.kind == "worker" and p.index == victim.index)
    assert worker.up and worker.pid != victim.pid and worker.restarts == 1
    assert (
        f"data worker {victim.index} died (killed by SIGKILL)"
        in (cluster.directory / f"{owner}.log").read_text()
    )
    # The control process ran on: the same Raft leader and term, the node still UP.
    assert (after.leader_node_id, max(m.raft_term for m in after.members)) == raft_before
    node_states = {n.node_id: n.state for n in after.nodes}
    assert node_states[owner] == pb.NODE_STATE_UP, node_states


def _ports_free(node: dev.NodeConfig) -> bool:
    for port in (node.grpc_port, node.raft_port, node.transfer_port, *node.worker_grpc_ports):
        with socket.socket() as sock:
            # As the node binds them (connections of the killed node may be in TIME_WAIT).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((node.host, port))
            except OSError:
                return False
    return True


def _start_times(pids: list[int]) -> dict[int, int]:
    """pid -> its start time (clock ticks since boot): a pid and its start time name one
    process, even on a busy host that reuses pids within seconds."""
    found = {}
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        found[pid] = int(raw[raw.rfind(b")") + 2 :].split()[19])
    return found


def _still_running(started: dict[int, int]) -> list[int]:
    """The processes of `started` that are still there (zombies count as gone)."""
    return [
        pid
        for pid, ticks in _start_times(list(started)).items()
        if ticks == started[pid] and dev._alive(pid)  # noqa: SLF001
    ]


def test_a_killed_supervisor_leaves_no_process_behind(env) -> None:
    cluster, client = env
    node = cluster.config.nodes[-1]
    supervisor = cluster.pid(node.id)
    assert supervisor is not None
    children = dev.node_processes(supervisor)[1:]
    assert len(children) == 1 + WORKERS
    # Only the supervisor: its children must go by themselves.
    os.kill(supervisor, signal.SIGKILL)
    process = cluster.processes[node.id]
    assert process is not None and process.wait(timeout=scaled(10)) == -signal.SIGKILL
    cluster.processes[node.id] = None
    deadline = time.monotonic() + scaled(10)
    started = _start_times(children)
    while _still_running(started):
        assert time.monotonic() < deadline, _still_running(started)
        time.sleep(0.02)
    while not _ports_free(node):
        assert time.monotonic() < deadline, "a port of the killed node is still held"
        time.sleep(0.05)
    cluster.start_node(node.id)
    dev.wait_caught_up(cluster, node.id, timeout_s=90)


def test_sigterm_stops_every_process_of_the_node(env) -> None:
    cluster, client = env
    converged(client)
    node = cluster.config.nodes[0]
    supervisor = cluster.pid(node.id)
    assert supervisor is not None
    started = _start_times(dev.node_processes(supervisor))
    process = cluster.processes[node.id]
    assert process is not None
    os.kill(supervisor, signal.SIGTERM)
    assert process.wait(timeout=scaled(30)) == 0
    cluster.processes[node.id] = None
    # Waited for, not asserted at once: once, in a full run, the supervisor's own pid
    # still showed alive (same start time) right after its wait() returned.
    deadline = time.monotonic() + scaled(10)
    while _still_running(started):
        assert time.monotonic() < deadline, _still_running(started)
        time.sleep(0.02)
    log = (cluster.directory / f"{node.id}.log").read_text()
    assert f"node {node.id} handover" in log
    assert all(f"node {node.id} data worker {k} stopping" in log for k in range(WORKERS))
    cluster.start_node(node.id)
    dev.wait_caught_up(cluster, node.id, timeout_s=90)
