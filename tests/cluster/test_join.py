"""A node joins a running cluster without touching the others (raftwal/node/join.py):
its config names only itself and the cluster's endpoints; it announces its addresses
through its heartbeats, catches up as a data node, and `raftwal member add` makes it a
voter; `member remove` of an original voter then leaves three voters. No other node's
config file changes and no other node restarts; every acknowledged message is read back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from raftwal.cli import dev
from raftwal.node.config import NodeConfig, render_config
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api, rid, running_cluster
from tests.cluster.wal_helpers import History, Producer, consume_all, wait_assigned
from tests.processes import start_in_own_session

pytestmark = pytest.mark.cluster

TIMEOUT_S = 90.0


@pytest.fixture
def three(tmp_path: Path) -> Iterator[tuple[dev.LocalCluster, Api]]:
    env = {**os.environ, "RAFTWAL_NODE_TIMEOUT_MS": "2000"}
    with running_cluster(tmp_path / "cluster", env, nodes=3, timeout_s=90) as running:
        yield running


def _wait(condition, what: str, timeout_s: float = TIMEOUT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception as error:  # noqa: BLE001 - a node restarting: ask again
            last = error
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached in {timeout_s} s (last error: {last})")


def _member_cli(cluster: dev.LocalCluster, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "raftwal.cli", "member", *args, "--dev-dir", str(cluster.directory)]
        + ["--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_node_joins_is_promoted_and_an_original_voter_leaves(three, tmp_path: Path) -> None:
    cluster, client = three
    original_config = cluster.directory / dev.CONFIG_FILE
    before = _digest(original_config)
    pids = {n: cluster.pid(n) for n in ("n1", "n2", "n3")}
    # n4's own file: itself, the cluster's settings and secret, and where to join.
    ports = dev.free_ports(4)
    n4 = NodeConfig(
        id="n4",
        host="127.0.0.1",
        grpc_port=ports[0],
        raft_port=ports[1],
        metrics_port=ports[2],
        transfer_port=ports[3],
        data_dir=tmp_path / "n4",
    )
    n4_config = tmp_path / "n4.toml"
    n4_config.write_text(
        render_config(
            replace(cluster.config, nodes=(n4,), join=tuple(cluster.endpoints)),
            secret_file=str(cluster.directory / dev.SECRET_FILE),
        )
    )
    created = client.call(
        "CreateChannels", api.CreateChannelsRequest(request_id=rid(), prefix="join", count=1)
    )
    (pchannel,) = created.pchannels
    client.call(
        "CreateVChannel", api.CreateVChannelRequest(name=f"{pchannel}_v", pchannel=pchannel)
    )
    wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, "join")
    history = History()
    process = None
    try:

        def produce(tag: str) -> None:
            for k in range(3):
                payloads = [b"%s-%d-%d" % (tag.encode(), k, i) for i in range(5)]
                assert producer.send(f"{pchannel}_v", payloads, history, budget_s=TIMEOUT_S)

        produce("a")
        process = start_in_own_session(
            [sys.executable, "-m", "raftwal.cli", "--log-level", "INFO", "node"]
            + ["--config", str(n4_config), "--id", "n4"],
            cwd=tmp_path,
            env=os.environ,
            log_path=tmp_path / "n4.log",
        )
        # n4 announced itself: registered UP, listed as a data member at its address.
        _wait(
            lambda: any(
                n.node_id == "n4" and n.state == 1 and n.address == n4.grpc_address
                for n in client.status().nodes
            ),
            "n4 registered UP",
        )
        _wait(
            lambda: (
                {m.node_id: m.role for m in client.status().members if m.reachable}.get("n4")
                == "data"
            ),
            "n4 reachable as a data node",
        )
        produce("b")
        added = _member_cli(cluster, "add", "n4")
        assert added["voter_node_ids"] == ["n1", "n2", "n3", "n4"]
        produce("c")
        removed = _member_cli(cluster, "remove", "n1")
        assert removed["voter_node_ids"] == ["n2", "n3", "n4"]
        _wait(
            lambda: (
                {m.node_id: m.role for m in client.status().members if m.reachable}
                == {"n1": "data", "n2": "voter", "n3": "voter", "n4": "voter"}
            ),
            "every node in its new role",
        )
        produce("d")
        acked = [a.payload for a in history.acked]
        entries = consume_all(client, f"{pchannel}_v", pchannel, expect=len(acked), timeout_s=60)
        assert sorted(e.payload for e in entries) == sorted(acked)
        # Nothing touched the others: the same file, the same processes (n1 re-executed
        # itself as a data node in the same process, as a removed voter does).
        assert _digest(original_config) == before
        assert {n: cluster.pid(n) for n in ("n1", "n2", "n3")} == pids
        for node_id, pid in pids.items():
            assert pid is not None
            os.kill(pid, 0), node_id
    finally:
        producer.close()
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
