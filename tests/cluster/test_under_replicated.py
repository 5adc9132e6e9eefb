"""`raftwal status` lists under-replicated pchannels, against a real three-node cluster: a
pchannel whose replica set holds a node that was killed is listed (and warned about, so
`status` exits 1) until that node is back; a pchannel created while a node was DOWN is
placed on the two nodes UP then, and stays listed until replica repair widens its set
once the node is back. The pure rule is tested on its own below."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from raftwal.node.health import under_replicated
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api, rid, running_cluster
from tests.timing import scaled

RAFTWAL = str(Path(sys.executable).with_name("raftwal"))
TIMEOUT_S = scaled(60.0)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    settings = dict(os.environ)
    settings["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(tmp_path_factory.mktemp("underrep"), settings) as running:
        yield running


def _status(cluster: dev.LocalCluster) -> tuple[int, dict]:
    done = subprocess.run(
        [RAFTWAL, "status", "--json", "--endpoints", ",".join(cluster.endpoints)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def _until(cluster: dev.LocalCluster, check, what: str) -> tuple[int, dict]:
    deadline = time.monotonic() + TIMEOUT_S
    last: tuple[int, dict] | None = None
    while time.monotonic() < deadline:
        last = _status(cluster)
        if check(last[1]):
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {last}")


def _short(data: dict) -> dict[str, dict]:
    return {item["pchannel"]: item for item in data.get("under_replicated", [])}


def _flag(cluster: dev.LocalCluster, node_id: str, pchannel: str) -> float | None:
    """raftwal_pchannel_under_replicated{pchannel} on `node_id`'s /metrics (what the
    RaftwalPChannelUnderReplicated alert of deploy/prometheus/alerts.yml reads)."""
    port = cluster.node(node_id).metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "raftwal_pchannel_under_replicated"
                and sample.labels.get("pchannel") == pchannel
            ):
                return sample.value
    return None


def _node_states(data: dict) -> dict[str, str]:
    return {n["node_id"]: n["state"] for n in data["nodes"]}


@pytest.mark.cluster
def test_status_lists_under_replicated_pchannels(env: tuple[dev.LocalCluster, Api]) -> None:
    cluster, client = env
    full = f"ur_full_{rid()}"
    client.call("CreateChannels", api.CreateChannelsRequest(request_id=rid(), names=[full]))
    _until(
        cluster,
        lambda d: any(
            p["name"] == full and len(p.get("replica_node_ids", [])) == 3 for p in d["pchannels"]
        ),
        f"{full} placed on three nodes",
    )
    code, data = _status(cluster)
    assert full not in _short(data), data.get("under_replicated")
    assert _flag(cluster, "n1", full) == 0
    victim = "n3"
    cluster.kill(victim, signal.SIGKILL)
    try:
        code, data = _until(
            cluster,
            lambda d: _node_states(d).get(victim) == "NODE_STATE_DOWN" and full in _short(d),
            f"{victim} DOWN and {full} listed",
        )
        item = _short(data)[full]
        assert item["down_node_ids"] == [victim]
        assert (item["live"], item["wanted"]) == (2, 3)
        assert code == 1
        assert any(f"pchannel {full} is under-replicated" in w for w in data["warnings"])
        # The metric says so too, on a node that saw the same state.
        deadline = time.monotonic() + TIMEOUT_S
        while _flag(cluster, "n1", full) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _flag(cluster, "n1", full) == 1
        # Created while n3 is DOWN: placed on the two nodes UP.
        narrow = f"ur_narrow_{rid()}"
        client.call("CreateChannels", api.CreateChannelsRequest(request_id=rid(), names=[narrow]))
        code, data = _until(cluster, lambda d: narrow in _short(d), f"{narrow} listed")
        item = _short(data)[narrow]
        assert len(item["replica_node_ids"]) == 2 and victim not in item["replica_node_ids"]
        assert item.get("down_node_ids", []) == []
    finally:
        cluster.start_node(victim)
    code, data = _until(
        cluster,
        lambda d: _node_states(d).get(victim) == "NODE_STATE_UP" and full not in _short(d),
        f"{victim} UP again and {full} no longer listed",
    )
    deadline = time.monotonic() + TIMEOUT_S
    while _flag(cluster, "n1", full) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _flag(cluster, "n1", full) == 0
    # Replica repair widens the narrow set once the node is back, and it is no longer listed.
    code, data = _until(cluster, lambda d: narrow not in _short(d), f"{narrow} widened")
    widened = {p["name"]: p for p in data["pchannels"]}[narrow]
    assert sorted(widened["replica_node_ids"]) == ["n1", "n2", "n3"]


def _channel(name: str, replicas: list[str], count: int = 3, **fields) -> pb.PChannel:
    return pb.PChannel(name=name, replica_node_ids=replicas, replica_count=count, **fields)


def _nodes(*states: tuple[str, int]) -> list[pb.Node]:
    return [pb.Node(node_id=n, state=s) for n, s in states]


def test_the_rule() -> None:
    up, down = pb.NODE_STATE_UP, pb.NODE_STATE_DOWN
    three = _nodes(("n1", up), ("n2", up), ("n3", down))
    found = under_replicated(
        [
            _channel("full_up", ["n1", "n2"], count=2),
            _channel("full_down", ["n1", "n2", "n3"]),
            _channel("narrow", ["n1", "n2"]),
            _channel("unplaced", []),
            _channel("dropped", ["n3"], state=pb.PCHANNEL_STATE_DROPPED),
            # Wants 5 in a 3-node cluster: 3 is all there can be.
            _channel("five", ["n1", "n2", "n3"], count=5),
        ],
        three,
    )
    assert [(f.pchannel, f.live, f.wanted, list(f.down_node_ids)) for f in found] == [
        ("full_down", 2, 3, ["n3"]),
        ("narrow", 2, 3, []),
        ("five", 2, 3, ["n3"]),
    ]
    everyone_up = _nodes(("n1", up), ("n2", up), ("n3", up))
    assert under_replicated([_channel("five", ["n1", "n2", "n3"], count=5)], everyone_up) == []
