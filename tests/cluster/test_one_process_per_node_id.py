"""One process per node id (issue 49, item 3), against a real dev cluster.

Before, a machine started under an id the cluster already had, at other addresses, ran:
`discover` dropped the existing member with that id from what it learned, two joiners
under one new id both passed the leader's checks, and a node ignored every refusal of its
heartbeats but REMOVED. It went on following Raft and reconciling that id's pchannels,
and could recover one at the same term as the real node: two writers at one (lsn, term).

Now:
- a join under an id in use at other addresses is refused before the node starts, in one
  line naming both addresses (exit status 2);
- of two processes joining under one new id at once, one is the node; the other stops
  with exit status 2 and one line naming both addresses;
- a process that skipped the join (its config file names the id) and heartbeats under a
  registered id from other addresses is refused by the leader and stops, exit status 2.
In every case the real node stays registered at its own addresses and nothing of the
cluster changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from raftwal.cli import dev
from raftwal.node.config import NodeConfig, render_config
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.test_join import _joiner_config, _start, _stop, _wait
from tests.timing import scaled

pytestmark = pytest.mark.cluster

EXIT_S = 60.0


@pytest.fixture
def three(tmp_path: Path) -> Iterator[tuple[dev.LocalCluster, Api]]:
    env = {**os.environ, "RAFTWAL_NODE_TIMEOUT_MS": "2000"}
    with running_cluster(tmp_path / "cluster", env, nodes=3, timeout_s=90) as running:
        yield running


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _exit_code(process: subprocess.Popen[bytes], timeout_s: float = EXIT_S) -> int | None:
    try:
        return process.wait(timeout=scaled(timeout_s))
    except subprocess.TimeoutExpired:
        return None


def _registered(client: Api, node_id: str) -> str | None:
    """The gRPC address `node_id` is registered UP at, if it is."""
    for node in client.status().nodes:
        if node.node_id == node_id and node.state == 1:
            return str(node.address)
    return None


def test_a_join_under_an_id_in_use_is_refused_naming_both_addresses(three, tmp_path: Path):
    cluster, client = three
    n2 = cluster.node("n2")
    impostor, config = _joiner_config(cluster, tmp_path, "n2")
    process = _start(config, "n2", tmp_path)
    try:
        code = _exit_code(process)
        line = _last_line(tmp_path / "n2.log")
        assert code == 2, (code, line)
        assert line.startswith("error: cannot join as n2"), line
        for address in (n2.grpc_address, n2.raft_address):
            assert address in line, line
        for address in (impostor.grpc_address, impostor.raft_address):
            assert address in line, line
    finally:
        _stop(process)
    assert _registered(client, "n2") == n2.grpc_address


def test_of_two_processes_joining_under_one_id_one_stops(three, tmp_path: Path):
    cluster, client = three
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    node_a, config_a = _joiner_config(cluster, tmp_path / "a", "n4")
    node_b, config_b = _joiner_config(cluster, tmp_path / "b", "n4")
    processes = {
        "a": _start(config_a, "n4", tmp_path / "a"),
        "b": _start(config_b, "n4", tmp_path / "b"),
    }
    addresses = {"a": node_a, "b": node_b}
    try:
        deadline = time.monotonic() + scaled(EXIT_S)
        while time.monotonic() < deadline and all(p.poll() is None for p in processes.values()):
            time.sleep(0.2)
        stopped = [name for name, p in processes.items() if p.poll() is not None]
        assert len(stopped) == 1, {name: p.poll() for name, p in processes.items()}
        (loser,) = stopped
        (winner,) = [name for name in processes if name != loser]
        line = _last_line(tmp_path / loser / "n4.log")
        assert processes[loser].returncode == 2, (processes[loser].returncode, line)
        assert line.startswith("error:"), line
        for node in addresses.values():
            assert node.grpc_address in line, line
        # The other one is the node, at its own addresses, and stays so.
        _wait(
            lambda: _registered(client, "n4") == addresses[winner].grpc_address,
            "n4 registered at the first joiner's address",
        )
        time.sleep(2.0)
        assert processes[winner].poll() is None
        assert _registered(client, "n4") == addresses[winner].grpc_address
    finally:
        for process in processes.values():
            _stop(process)


def test_a_process_under_a_registered_id_that_skipped_the_join_stops(three, tmp_path: Path):
    """The leader refuses its heartbeats (they announce other addresses than the node's)
    and it stops rather than following Raft and reconciling the node's pchannels."""
    cluster, client = three
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    node_a, config_a = _joiner_config(cluster, tmp_path / "a", "n4")
    first = _start(config_a, "n4", tmp_path / "a")
    second = None
    try:
        _wait(lambda: _registered(client, "n4") == node_a.grpc_address, "n4 registered")
        ports = dev.free_ports(4)
        node_b = NodeConfig(
            id="n4",
            host="127.0.0.1",
            grpc_port=ports[0],
            raft_port=ports[1],
            metrics_port=ports[2],
            transfer_port=ports[3],
            data_dir=tmp_path / "b" / "n4",
            role="data",
        )
        # An operator's copy of the cluster's file, with n4 added at new ports: no join.
        config_b = tmp_path / "b" / "n4.toml"
        config_b.write_text(
            render_config(
                replace(cluster.config, nodes=(*cluster.config.nodes, node_b)),
                secret_file=str(cluster.directory / dev.SECRET_FILE),
            )
        )
        second = _start(config_b, "n4", tmp_path / "b")
        code = _exit_code(second)
        line = _last_line(tmp_path / "b" / "n4.log")
        assert code == 2, (code, line)
        assert line.startswith("error: node n4 is at grpc " + node_a.grpc_address), line
        assert node_b.grpc_address in line and "cannot run as node n4" in line, line
        assert first.poll() is None
        assert _registered(client, "n4") == node_a.grpc_address
    finally:
        _stop(second)
        _stop(first)


#: Run in a fresh interpreter: what `raftwal node --config C --id n4` computes before its
#: supervisor forks the node's processes, then how many threads that process has.
_DISCOVERY_PROBE = """
import os, sys
from pathlib import Path
from raftwal.cli.main import node_config
config = node_config(Path(sys.argv[1]), "n4", None)
print(len(os.listdir("/proc/self/task")), sorted(n.id for n in config.nodes))
"""


def test_a_join_discovery_leaves_the_supervisor_without_a_grpc_thread(three, tmp_path: Path):
    """`raftwal node` forks its control process and data workers after the join
    discovery. The discovery's gRPC channel started gRPC's threads, which outlive it, and a
    lock one of them held at the fork stayed held in the child: a joining node's control
    process logged "raft peer started" and never served (twice in full test runs, in
    test_join and in the test above). The discovery now runs in a child of its own, and
    the process that forks the node has one thread, as the supervisor requires."""
    cluster, _client = three
    _node, config = _joiner_config(cluster, tmp_path, "n4")
    answer = subprocess.run(
        [sys.executable, "-c", _DISCOVERY_PROBE, str(config)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=tmp_path,
        check=False,
    )
    assert answer.returncode == 0, answer.stderr[-2000:]
    threads, nodes = answer.stdout.split(" ", 1)
    assert nodes.strip() == "['n1', 'n2', 'n3', 'n4']", answer.stdout
    assert int(threads) == 1, answer.stdout
