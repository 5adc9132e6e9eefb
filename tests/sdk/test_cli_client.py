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
from rpc.client import CoordinatorClient, OnShutdownError, UnreachableError
from rpc.errors import error_info
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from tests.sdk.fake_coordinator import FakeCluster, make_events
from tests.timing import scaled

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
    # UNHEALTHY (a warning) exits 1, with --json too, as `etcdctl endpoint health` does.
    assert main(["status", "--json", "--dev-dir", str(tmp_path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["leader_node_id"] == "n1"
    assert data["pchannels"][0]["state"] == "PCHANNEL_STATE_ASSIGNED"
    # The pid of a local node comes from the dev cluster file when the member has none.
    assert data["members"][0]["pid"] == 4242
    assert data["warnings"] == ["node n2 is DOWN"]


def test_status_human_output(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    node = cluster.add("n1")
    node.status = _status(node.address)
    assert main(["status", "--endpoints", node.address]) == 1
    out = capsys.readouterr().out
    for expected in ("UNHEALTHY", "members", "n1", "n2", "127.0.0.1:9", "pchannel_0", "DOWN"):
        assert expected in out
    # No warning: healthy, exit 0 (human and --json).
    del node.status.warnings[:]
    assert main(["status", "--endpoints", node.address]) == 0
    assert "healthy" in capsys.readouterr().out
    assert main(["status", "--json", "--endpoints", node.address]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


def test_unreachable_is_unavailable_not_on_shutdown(
    dead_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens there: the user must not read "the node is stopping" and wait.
    code = main(["status", "--endpoints", dead_address, "--timeout-s", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("error: UNAVAILABLE: "), err
    assert dead_address in err and "connection refused" in err, err
    assert "ON_SHUTDOWN" not in err and "\n" not in err, err


async def test_the_sdk_tells_nobody_there_from_a_stopping_node(
    cluster: FakeCluster, dead_address: str
) -> None:
    async with CoordinatorClient([dead_address], timeout_s=1.0) as client:
        with pytest.raises(UnreachableError) as raised:
            await client.cluster_status()
    assert raised.value.code == E.UNAVAILABLE
    assert dead_address in str(raised.value) and "connection refused" in str(raised.value)
    stopping = cluster.add("n1")
    stopping.always["ClusterStatus"] = error_info(E.ON_SHUTDOWN, "node is stopping")
    async with CoordinatorClient([stopping.address], timeout_s=1.0) as client:
        with pytest.raises(OnShutdownError) as said:
            await client.cluster_status()
    assert said.value.code == E.ON_SHUTDOWN


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
    # The CLI speaks of its flags, not of the request's fields.
    assert (
        captured.err.strip()
        == "error: INVALID_ARGUMENT: --count 0: invalid --count (0; expected 1..1024)"
    )
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
        _, err = process.communicate(timeout=scaled(15))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert process.returncode == 0, err
    assert node.count("Unlock") == 1 and node.count("RevokeLease") == 1
    assert node.leases == {}


@pytest.mark.parametrize(
    ("endpoints", "named"),
    [
        ("localhost:99999", "port 99999 is out of range"),
        ("localhost:abc", "port 'abc' is not a number"),
        ("http://localhost:2379", "drop the http:// scheme"),
        ("localhost", "no port"),
        ("", "no endpoints"),
        (" , ", "no endpoints"),
    ],
)
def test_bad_endpoints_are_usage_errors_naming_the_bad_part(
    endpoints: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An empty --endpoints used to fall back to the dev cluster; now it is a mistake.
    (tmp_path / "cluster.json").write_text(
        json.dumps({"nodes": [{"id": "n1", "grpc": "127.0.0.1:1", "raft": "x"}]})
    )
    code = main(["status", "--endpoints", endpoints, "--dev-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: --endpoints: ") and named in err, err
    assert "\n" not in err


@pytest.mark.parametrize("endpoints", ["localhost:99999", "localhost:abc", "http://h:1", ""])
def test_the_sdk_checks_endpoints_with_value_error(endpoints: str) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        CoordinatorClient(endpoints)


def test_the_sdk_accepts_names_ipv4_and_bracketed_ipv6() -> None:
    client = CoordinatorClient("localhost:7201, 127.0.0.1:7202,[::1]:7203")
    assert client.endpoints == ["localhost:7201", "127.0.0.1:7202", "[::1]:7203"]


def test_filters_and_enums_check_their_values(
    dead_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `events --kinds nosuch` printed nothing and exited 0.
    assert main(["events", "--kinds", "nosuch", "--endpoints", dead_address]) == 2
    err = capsys.readouterr().err
    assert "--kinds: unknown value(s) 'nosuch'" in err and "lease_granted" in err, err
    assert (
        main(["consume", "--vchannel", "v", "--msg-types", "x", "--endpoints", dead_address]) == 2
    )
    assert "--msg-types: unknown value(s) 'x'" in capsys.readouterr().err
    # --msg-type lists only what a user may send, not the WAL's own control types.
    assert (
        main(["produce", "--vchannel", "v", "--msg-type", "seal", "--endpoints", dead_address]) == 2
    )
    err = capsys.readouterr().err
    expected = err.split("expected one of ", 1)[1]
    assert "message" in expected and "seal" not in expected and "term_start" not in expected


def test_errors_speak_in_flags_not_fields(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    node = cluster.add("n1")
    node.always["CreateChannels"] = error_info(
        E.INVALID_ARGUMENT,
        "invalid replica_count (5; the cluster has 3 node(s): expected 1..3)",
    )
    code = main(
        ["channel", "create", "--count", "1", "--replicas", "5", "--endpoints", node.address]
    )
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err == (
        "error: INVALID_ARGUMENT: --replicas 5: invalid --replicas (5; the cluster has 3 "
        "node(s): expected 1..3)"
    )
    assert "replica_count" not in err
