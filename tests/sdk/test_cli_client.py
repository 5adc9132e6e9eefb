"""The client sub-commands of ``raftwal`` against fake nodes: endpoint resolution, JSON and
human output, error reporting, and ``lock`` held until SIGTERM in a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftwal.cli.main import main
from rpc.errors import error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from tests.sdk.fake_coordinator import FakeCluster, make_events

E = errors_pb2
ROOT = Path(__file__).resolve().parents[2]


def _status(node_address: str) -> api.ClusterStatusResponse:
    return api.ClusterStatusResponse(
        leader_node_id="n1",
        leader_address=node_address,
        revision=12,
        members=[
            api.MemberStatus(
                node_id="n1",
                grpc_address=node_address,
                raft_address="127.0.0.1:9",
                is_leader=True,
                reachable=True,
                raft_term=3,
                commit_index=40,
                revision=12,
            ),
            api.MemberStatus(node_id="n2", grpc_address="127.0.0.1:8", reachable=False),
        ],
        nodes=[pb.Node(node_id="n1", address=node_address, state=pb.NODE_STATE_UP)],
        pchannels=[
            pb.PChannel(
                name="pchannel_0",
                term=4,
                owner_node_id="n1",
                state=pb.PCHANNEL_STATE_ASSIGNED,
                replica_node_ids=["n1", "n2"],
            )
        ],
        warnings=["node n2 is DOWN"],
    )


def test_status_json_from_dev_cluster_file(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = cluster.add("n1")
    node.status = _status(node.address)
    (tmp_path / "cluster.json").write_text(
        json.dumps({"nodes": [{"id": "n1", "grpc": node.address, "raft": "x", "pid": 4242}]})
    )
    assert main(["status", "--json", "--dev-dir", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["leader_node_id"] == "n1"
    assert data["pchannels"][0]["state"] == "PCHANNEL_STATE_ASSIGNED"
    # The pid of a local node comes from the dev cluster file when the member has none.
    assert data["members"][0]["pid"] == 4242
    assert data["warnings"] == ["node n2 is DOWN"]


def test_status_human_output(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    node = cluster.add("n1")
    node.status = _status(node.address)
    assert main(["status", "--endpoints", node.address]) == 0
    out = capsys.readouterr().out
    for expected in ("members", "n1", "n2", "127.0.0.1:9", "pchannel_0", "ASSIGNED", "DOWN"):
        assert expected in out


def test_no_endpoints_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAFTWAL_ENDPOINTS", raising=False)
    assert main(["status", "--dev-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no endpoints") and "raftwal dev up" in err


def test_raftwal_error_prints_code_and_exits_1(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    node = cluster.add("n1")
    node.always["CreateChannels"] = error_info(
        E.INVALID_ARGUMENT, "invalid count (0; expected 1..1024)"
    )
    code = main(["channel", "create", "--count", "0", "--endpoints", node.address])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.strip() == "error: INVALID_ARGUMENT: invalid count (0; expected 1..1024)"
    assert "Traceback" not in captured.err


def test_channel_and_vchannel_commands(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    node = cluster.add("n1")
    endpoints = ["--endpoints", node.address]
    assert main(["channel", "create", "--count", "2", "--prefix", "p", "--json", *endpoints]) == 0
    assert json.loads(capsys.readouterr().out)["pchannels"] == ["p_0", "p_1"]
    assert main(["vchannel", "create", "v1", "--pchannel", "p_0", *endpoints]) == 0
    assert "created vchannel v1" in capsys.readouterr().out
    assert main(["channel", "drop", "p_0", "p_1", *endpoints]) == 0
    assert "dropped p_0, p_1" in capsys.readouterr().out
    assert node.count("CreateChannels") == node.count("CreateVChannel") == 1


def test_events_prints_history_up_to_now(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    node = cluster.add("n1")
    node.events = make_events(5)
    node.channels.revision = 4  # "now": the fifth event is in the future
    assert main(["events", "--from-revision", "2", "--json", "--endpoints", node.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    # int64 fields are JSON numbers (protobuf's JSON mapping would write "2"), so that
    # `jq '.revision > 2'` compares numbers.
    assert [json.loads(line)["revision"] for line in lines] == [2, 3, 4]
    assert main(["events", "--kinds", "lease_granted", "--endpoints", node.address]) == 0
    assert capsys.readouterr().out == ""


def test_lock_holds_until_sigterm_then_releases(cluster: FakeCluster) -> None:
    node = cluster.add("n1")
    command = [sys.executable, "-m", "raftwal.cli", "lock", "job-1", "--ttl-ms", "3000"]
    command += ["--json", "--endpoints", node.address]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        held = json.loads(line)
        assert held["key"] == "job-1" and held["fencing_token"] == 42
        assert held["lease_id"] == 100 and held["mode"] == "exclusive"
        time.sleep(1.2)  # a third of the ttl: the keeper has renewed at least once
        assert node.keepalive_count >= 2
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert process.returncode == 0, err
    assert node.count("Unlock") == 1 and node.count("RevokeLease") == 1
    assert node.leases == {}
