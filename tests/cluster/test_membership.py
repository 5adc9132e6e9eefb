"""Raft membership change on real processes: `raftwal member add | remove | list`.

Four nodes, three voters (n1-n3) and a data node (n4), a producer on four pchannels
throughout. `member add n4` promotes the data node: it restarts itself as a voter (same
pid: it re-executes its command line). `member remove n1` drains n1 (frozen: its pchannels
move and it leaves every replica set), removes it from the voters and it restarts as a
data node. Then a voter of the original three is killed: the remaining two of the new
set {n2, n3, n4} still elect and commit, which the original set (with n1 no longer
voting) could not. Every node restarts: the membership holds (it is durable in the Raft
log and snapshots, and in n1's role.json). Every acknowledged message is read back once,
in order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from tests.cluster.conftest import Api, rid, running_cluster
from tests.cluster.wal_helpers import (
    History,
    Producer,
    consume_all,
    wait_assigned,
    wait_nodes_up,
)
from tests.timing import scaled

pytestmark = pytest.mark.cluster

PCHANNELS = 4
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    directory: Path = tmp_path_factory.mktemp("members")
    env = {**os.environ, "RAFTWAL_NODE_TIMEOUT_MS": "2000"}
    with running_cluster(directory, env, nodes=4, data_nodes=1, timeout_s=90) as running:
        yield running


def _run_cli(cluster: dev.LocalCluster, *args: str, timeout_s: float = 200.0):  # type: ignore[no-untyped-def]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "raftwal.cli",
            "member",
            *args,
            "--dev-dir",
            str(cluster.directory),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _cli(cluster: dev.LocalCluster, *args: str, timeout_s: float = 200.0) -> dict:
    done = _run_cli(cluster, *args, timeout_s=timeout_s)
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def _produce(producers: dict[str, Producer], history: dict[str, History], tag: str) -> None:
    for index in range(3):
        for name, producer in producers.items():
            payloads = [b"%s-%s-%d-%d" % (name.encode(), tag.encode(), index, i) for i in range(4)]
            assert producer.send(f"{name}_v", payloads, history[name], budget_s=TIMEOUT_S), (
                name,
                tag,
            )


def _voters(client: Api) -> list[str]:
    return list(client.call("ListMembers", api.ListMembersRequest()).voter_node_ids)


def _roles(client: Api) -> dict[str, str]:
    return {m.node_id: m.role for m in client.status().members if m.reachable}


def _wait(condition, what: str, timeout_s: float = TIMEOUT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + scaled(timeout_s)
    last: object = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception as error:  # noqa: BLE001 - a node restarting: ask again
            last = error
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached in {timeout_s} s (last error: {last})")


def test_member_commands_refuse_what_cannot_be_done_with_one_sentence(
    four: tuple[dev.LocalCluster, Api],
) -> None:
    cluster, client = four
    # A node that is no member of the configuration: a usage error (exit 2), one line,
    # nothing changed.
    for action in ("add", "remove"):
        done = _run_cli(cluster, action, "n9", timeout_s=60)
        assert done.returncode == 2, (action, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "n9" in lines[0] and "expected one of" in lines[0], lines
    # A voter already: nothing to do, and saying so is success.
    assert _cli(cluster, "add", "n1")["changed"] is False
    # Straight to the RPC: the leader refuses to remove a voter that still holds a
    # pchannel or a replica, and says what to do.
    created = client.call(
        "CreateChannels", api.CreateChannelsRequest(request_id=rid(), prefix="err", count=2)
    )
    for name in created.pchannels:
        wait_assigned(client, name)
    placed = [c for c in client.status().pchannels if c.name in created.pchannels]
    holder = sorted(n for c in placed for n in {c.owner_node_id, *c.replica_node_ids} if n != "n4")[
        0
    ]
    with pytest.raises(grpc.RpcError) as refused:
        client.call(
            "ChangeMembership",
            api.ChangeMembershipRequest(node_id=holder, action=api.MEMBERSHIP_ACTION_REMOVE),
        )
    info = from_rpc_error(refused.value)
    assert info.code == errors_pb2.IGNORED_OPERATION, info
    assert "freeze it" in info.message, info.message
    # Bad input: a clear INVALID_ARGUMENT.
    with pytest.raises(grpc.RpcError) as invalid:
        client.call("ChangeMembership", api.ChangeMembershipRequest(node_id="n2"))
    assert from_rpc_error(invalid.value).code == errors_pb2.INVALID_ARGUMENT
    # A voter is never forgotten: it must leave the voters first.
    leader = client.status().leader_node_id
    voter = next(n for n in ("n1", "n2", "n3") if n != leader)
    with pytest.raises(grpc.RpcError) as forgotten:
        client.call(
            "ChangeMembership",
            api.ChangeMembershipRequest(node_id=voter, action=api.MEMBERSHIP_ACTION_FORGET),
        )
    info = from_rpc_error(forgotten.value)
    assert info.code == errors_pb2.IGNORED_OPERATION, info
    assert "is a Raft voter" in info.message, info.message
    assert _voters(client) == ["n1", "n2", "n3"]


def test_add_a_voter_remove_a_voter_and_the_membership_survives_restarts(
    four: tuple[dev.LocalCluster, Api],
) -> None:
    cluster, client = four
    assert _voters(client) == ["n1", "n2", "n3"]
    listed = _cli(cluster, "list")
    assert {m["node_id"]: m["role"] for m in listed["members"]} == {
        "n1": "voter",
        "n2": "voter",
        "n3": "voter",
        "n4": "data",
    }

    created = client.call(
        "CreateChannels", api.CreateChannelsRequest(request_id=rid(), prefix="mem", count=PCHANNELS)
    )
    names = list(created.pchannels)
    for name in names:
        client.call("CreateVChannel", api.CreateVChannelRequest(name=f"{name}_v", pchannel=name))
    producers = {name: Producer(client, name, f"p-{name}") for name in names}
    history = {name: History() for name in names}
    killed = ""
    try:
        _produce(producers, history, "a")

        # Promote the data node: same pid, now a voter.
        pid = cluster.pid("n4")
        added = _cli(cluster, "add", "n4")
        assert added["changed"] is True
        assert added["voter_node_ids"] == ["n1", "n2", "n3", "n4"]
        assert _roles(client)["n4"] == "voter"
        assert cluster.pid("n4") == pid
        _produce(producers, history, "b")

        # Remove n1 (drained first, whatever it led or held).
        # --keep-data-node: n1 stays as a data node (a plain remove forgets it:
        # tests/cluster/test_join.py).
        removed = _cli(cluster, "remove", "n1", "--keep-data-node")
        assert removed["changed"] is True
        assert removed["voter_node_ids"] == ["n2", "n3", "n4"]
        _wait(lambda: _roles(client).get("n1") == "data", "n1 running as a data node")
        status = client.status()
        assert all(
            c.owner_node_id != "n1" and "n1" not in c.replica_node_ids
            for c in status.pchannels
            if c.name in names
        )
        _produce(producers, history, "c")

        # Kill n2: n3 and n4 are two of the three voters now, and they go on.
        killed = "n2"
        cluster.kill(killed, signal.SIGKILL)
        _wait(
            lambda: client.status().leader_node_id in {"n3", "n4"},
            "a leader among n3 and n4",
        )
        _produce(producers, history, "d")
        cluster.start_node(killed)
        killed = ""
        wait_nodes_up(client, count=4)

        # Every node restarts: the changed membership holds.
        cluster.stop_all()
        for node_id in ("n1", "n2", "n3", "n4"):
            cluster.start_node(node_id)
        wait_nodes_up(client, count=4, timeout_s=90)
        _wait(lambda: _voters(client) == ["n2", "n3", "n4"], "the voters after the restart")
        _wait(
            lambda: _roles(client) == {"n1": "data", "n2": "voter", "n3": "voter", "n4": "voter"},
            "every node in its role after the restart",
        )
        _produce(producers, history, "e")

        for name in names:
            acked = [a.payload for a in history[name].acked]
            entries = consume_all(client, f"{name}_v", name, expect=len(acked), timeout_s=60)
            assert [e.payload for e in entries][: len(acked)] == acked, name
    finally:
        for producer in producers.values():
            producer.close()
        if killed and cluster.processes.get(killed) is None:
            cluster.start_node(killed)
