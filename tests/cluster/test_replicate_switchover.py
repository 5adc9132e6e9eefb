"""A planned switchover between two real dev clusters, east -> west (docs/replication.md,
"Switchover"), issue 37's "Done when":

- after `raftwal replicate set` (east -> west), 1,000 messages produced on east are
  consumed from west with the same payloads in the same order; `raftwal replicate status
  --json` shows a lag of 0; `raftwal produce` on west exits 1 naming east;
- a switchover whose drain cannot finish (west's owner stopped) fails with a typed error
  and lifts the pause;
- `raftwal replicate switchover --to west`, while a producer keeps writing to east: the
  pause refuses its writes, then west takes writes and they appear on east, and a produce
  on east exits 1 naming west;
- a crash midway: the pause alone is applied on west (the new source), west's owner is
  killed with SIGKILL, the new owner still refuses writes; `raftwal replicate switchover
  --to east` finishes it, and a rerun has nothing left to do;
- a transaction committed on east then reaches west whole, with its begin and commit
  markers;
- a switchover that crashed between its two reversal updates is finished by a rerun.

History check after each phase: each cluster's own entries (no `rw.src.cluster`) are, in
order and once each, the entries of the other cluster that came from it (same payloads,
`rw.src.lsn` = the original LSN); every acknowledged batch is there; nothing twice."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import (
    History,
    Producer,
    consume_all,
    setup_channels,
    wait_assigned,
    wait_nodes_up,
)
from tests.timing import wait_for
from wal_segments.format import EntryFlags

pytestmark = pytest.mark.cluster

SEED = random.randrange(1 << 30)
MESSAGES = 1000
PER_BATCH = 50
SOURCE_PROPERTY = "rw.src.cluster"


@pytest.fixture(scope="module")
def clusters(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dev.LocalCluster, dev.LocalCluster]]:
    east = dev.up(tmp_path_factory.mktemp("east"), 3, timeout_s=120, cluster_id="east")
    try:
        west = dev.up(tmp_path_factory.mktemp("west"), 3, timeout_s=120, cluster_id="west")
        try:
            yield east, west
        finally:
            west.stop_all()
    finally:
        east.stop_all()


def _cli(*args: str, endpoints: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", *args, "--endpoints", ",".join(endpoints)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _entries(client: Api, pchannel: str) -> list[wire.WalEntry]:
    return consume_all(client, "orders", pchannel, expect=1_000_000, timeout_s=3)


def _mismatch(
    logs: dict[str, list[wire.WalEntry]], histories: dict[str, list[History]]
) -> str | None:
    """What breaks the history check, or None: each cluster's own entries are the other's
    copies of them, entry for entry; acknowledged entries are there; nothing twice."""
    for cluster, entries in logs.items():
        # (A transaction's markers have no payload.)
        payloads = [e.payload for e in entries if e.msg_type not in ("txn_begin", "txn_commit")]
        if len(set(payloads)) != len(payloads):
            return f"a payload twice on {cluster}"
        own = [(e.payload, e.lsn) for e in entries if SOURCE_PROPERTY not in e.properties]
        for other, theirs in logs.items():
            if other == cluster:
                continue
            copies = [
                (e.payload, int(e.properties["rw.src.lsn"]))
                for e in theirs
                if e.properties.get(SOURCE_PROPERTY) == cluster
            ]
            if copies != own:
                return f"{other} holds {len(copies)} of {cluster}'s {len(own)} entries or others"
        acked = {a.payload for history in histories[cluster] for a in history.acked}
        missing = acked - {p for p, _ in own}
        if missing:
            return f"{len(missing)} acknowledged entries of {cluster} are not in its log"
    return None


def _check_history(
    east_api: Api, west_api: Api, pchannel: str, histories: dict[str, list[History]]
) -> dict[str, list[wire.WalEntry]]:
    last: list[dict[str, list[wire.WalEntry]]] = [{}]

    def check() -> bool:
        last[0] = {"east": _entries(east_api, pchannel), "west": _entries(west_api, pchannel)}
        problem = _mismatch(last[0], histories)
        if problem:
            print("history:", problem)
        return problem is None

    wait_for("each cluster holds the other's entries exactly", check, timeout_s=90, interval_s=1)
    return last[0]


def _stub(client: Api, address: str) -> streaming_pb2_grpc.StreamingNodeStub:
    return streaming_pb2_grpc.StreamingNodeStub(client.security.channel(address))


def _keep_producing(client: Api, pchannel: str, history: History, stop: threading.Event) -> None:
    """Small batches to east until `stop`; a refused batch is retried briefly (with its
    producer sequence) and then given up: it was not written."""
    producer = Producer(client, pchannel, f"background-{SEED}")
    try:
        number = 0
        while not stop.is_set():
            number += 1
            payloads = [f"bg.{number}.{k}".encode() for k in range(5)]
            producer.send("orders", payloads, history, budget_s=1)
    finally:
        producer.close()


def test_switchover_east_to_west_and_back(
    clusters: tuple[dev.LocalCluster, dev.LocalCluster], tmp_path: Path
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    east, west = clusters
    east_api, west_api = Api(east.endpoints), Api(west.endpoints)
    histories: dict[str, list[History]] = {"east": [], "west": []}
    try:
        (pchannel,) = setup_channels(east_api, "sw", {"orders": 0})
        wait_nodes_up(west_api)
        west_api.call("CreateChannels", api.CreateChannelsRequest(names=[pchannel]))
        (tmp_path / "replicate.toml").write_text(
            "\n".join(
                f'[[clusters]]\nid = "{name}"\nendpoints = {json.dumps(local.endpoints)}\n'
                f'pchannels = ["{pchannel}"]\n'
                for name, local in (("east", east), ("west", west))
            )
            + '\n[[topology]]\nsource = "east"\ntarget = "west"\n'
        )
        done = _cli("replicate", "set", str(tmp_path / "replicate.toml"), endpoints=east.endpoints)
        assert done.returncode == 0, done.stderr

        # 1,000 messages on east, consumed from west: same payloads, same order.
        first = History()
        histories["east"].append(first)
        producer = Producer(east_api, pchannel, f"app-{SEED}")
        for number in range(MESSAGES // PER_BATCH):
            payloads = [f"{number}.{k}.{rng.random():.6f}".encode() for k in range(PER_BATCH)]
            assert producer.send("orders", payloads, first, budget_s=60), first.failed[-3:]
        producer.close()
        sent = [a.payload for a in first.acked]
        assert len(sent) == MESSAGES
        on_west = consume_all(west_api, "orders", pchannel, expect=MESSAGES, timeout_s=90)
        assert [e.payload for e in on_west] == sent
        assert all(e.properties[SOURCE_PROPERTY] == "east" for e in on_west)

        def lag_zero() -> dict[str, object] | None:
            status = _cli("replicate", "status", "--json", endpoints=east.endpoints)
            assert status.returncode == 0, status.stderr
            (row,) = json.loads(status.stdout)["pchannels"]
            return row if (row["lag_entries"], row["lag_s"]) == (0, 0.0) else None

        row = wait_for("replicate status shows a lag of 0", lag_zero, timeout_s=30)
        assert row["target_cluster_id"] == "west"
        refused = _cli("produce", "--vchannel", "orders", "--count", "1", "--timeout-s", "10",
                       endpoints=west.endpoints)  # fmt: skip
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert "replication target of cluster east" in refused.stderr

        # A drain that cannot finish (the data workers of west's owner are stopped, east
        # has a new entry): the switchover fails with a typed error, and east takes writes
        # again. Only the workers: the owner's control process goes on heartbeating, so
        # west does not fail the pchannel over to a node that would catch up however long
        # the steps below take on a loaded host (stopping the whole node let that happen
        # once in a full run), and west still answers the switchover's reads.
        owner, _, _ = wait_assigned(west_api, pchannel)
        stalled = [
            pid
            for pid in dev.node_processes(west.pid(owner) or 0)
            if os.getpriority(os.PRIO_PROCESS, pid) > 0  # the workers run at data_worker_nice
        ]
        assert stalled, f"no data worker of {owner} found"
        for pid in stalled:
            os.kill(pid, signal.SIGSTOP)
        try:
            producer = Producer(east_api, pchannel, f"stalled-{SEED}")
            assert producer.send("orders", [b"while west is stopped"], first, budget_s=30)
            timed_out = _cli("replicate", "switchover", "--to", "west", "--drain-timeout-s", "1",
                             endpoints=east.endpoints)  # fmt: skip
            assert timed_out.returncode == 1, (timed_out.stdout, timed_out.stderr)
            assert "did not catch up with east within 1 s" in timed_out.stderr
            assert "the write pause on east was undone" in timed_out.stderr
            answer = east_api.call(
                "GetReplicateConfiguration", api.GetReplicateConfigurationRequest()
            )
            assert not answer.configuration.HasField("switchover")
            assert producer.send("orders", [b"after the timeout"], first, budget_s=30)
            producer.close()
        finally:
            for pid in stalled:
                os.kill(pid, signal.SIGCONT)

        # The switchover, under a producer that keeps writing to east.
        background = History()
        histories["east"].append(background)
        stop = threading.Event()
        writer = threading.Thread(
            target=_keep_producing, args=(east_api, pchannel, background, stop), daemon=True
        )
        writer.start()
        try:
            wait_for("the background producer writes", lambda: len(background.acked) >= 50)
            switched = _cli("replicate", "switchover", "--to", "west", "--json",
                            endpoints=east.endpoints)  # fmt: skip
        finally:
            stop.set()
            writer.join(timeout=60)
        assert not writer.is_alive()
        assert switched.returncode == 0, (switched.stdout, switched.stderr)
        report = json.loads(switched.stdout)
        assert (report["source_cluster_id"], report["target_cluster_id"]) == ("west", "east")
        paused_refusals = sum("switching over to cluster west" in r for _, r in background.failed)
        print(
            f"write pause east -> west: {report['write_pause_s']} s; background producer: "
            f"{len(background.acked)} acknowledged, {paused_refusals} refused by the pause"
        )
        assert 0 < report["write_pause_s"] < 60 and not report["pause_began_earlier"]
        reasons = " | ".join(reason for _, reason in background.failed)
        assert "switching over to cluster west" in reasons or (
            "replication target of cluster west" in reasons
        ), reasons[-500:]
        for client in (east_api, west_api):
            answer = client.call(
                "GetReplicateConfiguration", api.GetReplicateConfigurationRequest()
            )
            assert [(e.source_cluster_id, e.target_cluster_id) for e in answer.configuration.topology] == [
                ("west", "east")
            ]  # fmt: skip
            assert not answer.configuration.HasField("switchover")

        # West takes writes, and they appear on east; east refuses them, naming west.
        written = _cli("produce", "--vchannel", "orders", "--count", "3", "--timeout-s", "10",
                       endpoints=west.endpoints)  # fmt: skip
        assert written.returncode == 0, (written.stdout, written.stderr)
        on_west_history = History()
        histories["west"].append(on_west_history)
        producer = Producer(west_api, pchannel, f"west-{SEED}")
        for number in range(4):
            payloads = [f"w{number}.{k}".encode() for k in range(PER_BATCH)]
            assert producer.send("orders", payloads, on_west_history, budget_s=60)
        producer.close()
        refused = _cli("produce", "--vchannel", "orders", "--count", "1", "--timeout-s", "10",
                       endpoints=east.endpoints)  # fmt: skip
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert "replication target of cluster west" in refused.stderr
        logs = _check_history(east_api, west_api, pchannel, histories)
        from_west = [e for e in logs["east"] if e.properties.get(SOURCE_PROPERTY) == "west"]
        assert len(from_west) == 3 + 4 * PER_BATCH

        # A rerun has nothing left to do.
        again = _cli("replicate", "switchover", "--to", "west", "--json", endpoints=east.endpoints)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["finished_now"] == []

        # A switchover back that crashed after its pause: west (the source now) has the
        # pause in Raft; its pchannel's owner dies, and the new owner refuses writes too.
        current = west_api.call(
            "GetReplicateConfiguration", api.GetReplicateConfigurationRequest()
        ).configuration
        current.switchover.CopyFrom(
            pb.ReplicateSwitchover(source_cluster_id="west", target_cluster_id="east")
        )
        west_api.call(
            "UpdateReplicateConfiguration",
            api.UpdateReplicateConfigurationRequest(configuration=current),
        )
        owner, term, _ = wait_assigned(west_api, pchannel)
        west.kill(owner)
        try:
            wait_assigned(west_api, pchannel, min_term=term + 1, timeout_s=60)
            paused = History()
            producer = Producer(west_api, pchannel, f"paused-{SEED}")
            assert not producer.send("orders", [b"not while paused"], paused, budget_s=3)
            producer.close()
            assert paused.acked == []
            assert any("switching over to cluster east" in r for _, r in paused.failed), (
                paused.failed[-3:]
            )
            _, _, address = wait_assigned(west_api, pchannel)
            with pytest.raises(grpc.RpcError) as raised:
                _stub(west_api, address).BeginTxn(
                    wire.BeginTxnRequest(vchannel="orders"), timeout=10
                )
            assert "switching over to cluster east" in str(raised.value.details())
        finally:
            west.start_node(owner)
        back = _cli("replicate", "switchover", "--to", "east", "--json", endpoints=west.endpoints)
        assert back.returncode == 0, (back.stdout, back.stderr)
        assert json.loads(back.stdout)["pause_began_earlier"]
        on_east_again = History()
        histories["east"].append(on_east_again)
        producer = Producer(east_api, pchannel, f"east-again-{SEED}")
        assert producer.send("orders", [b"east again 1", b"east again 2"], on_east_again)
        producer.close()
        # A transaction committed on east reaches west whole, with its markers.
        _, _, address = wait_assigned(east_api, pchannel)
        stub = _stub(east_api, address)
        txn = stub.BeginTxn(wire.BeginTxnRequest(vchannel="orders"), timeout=10)
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="orders",
                txn_id=txn.txn_id,
                messages=[wire.Message(vchannel="orders", payload=p) for p in (b"t1", b"t2")],
            ),
            timeout=10,
        )
        committed = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="orders", txn_id=txn.txn_id), timeout=10
        )
        txn_lsns = [p.lsn for p in committed.positions]
        assert len(txn_lsns) == 4  # begin, two messages, commit
        histories["east"].append(History())  # (its payloads are checked below)
        logs = _check_history(east_api, west_api, pchannel, histories)
        assert b"not while paused" not in {e.payload for e in logs["west"]}
        copies = logs["west"][-4:]
        assert [int(e.properties["rw.src.lsn"]) for e in copies] == txn_lsns
        assert [e.msg_type for e in copies] == ["txn_begin", "message", "message", "txn_commit"]
        assert [e.payload for e in copies[1:3]] == [b"t1", b"t2"]
        assert [e.flags for e in copies] == [
            int(EntryFlags.TXN_BEGIN),
            int(EntryFlags.TXN_BODY),
            int(EntryFlags.TXN_BODY),
            int(EntryFlags.TXN_COMMIT),
        ]
        assert len({e.txn_id for e in copies}) == 1 and copies[0].txn_id != 0
        assert logs["west"][-5].payload == b"east again 2"

        # A switchover to west that crashed between its two reversal updates: east is
        # paused (and drained: west holds all of it), west already has the reversed edge.
        # A rerun applies the reversed edge to east.
        forward = east_api.call(
            "GetReplicateConfiguration", api.GetReplicateConfigurationRequest()
        ).configuration
        paused_east = pb.ReplicateConfiguration()
        paused_east.CopyFrom(forward)
        paused_east.switchover.CopyFrom(
            pb.ReplicateSwitchover(source_cluster_id="east", target_cluster_id="west")
        )
        east_api.call(
            "UpdateReplicateConfiguration",
            api.UpdateReplicateConfigurationRequest(configuration=paused_east),
        )
        _, _, address = wait_assigned(west_api, pchannel)
        west_committed = (
            _stub(west_api, address)
            .GetLatestTimeTick(wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=10)
            .committed_lsn
        )
        reversed_edge = pb.ReplicateConfiguration()
        reversed_edge.CopyFrom(forward)
        del reversed_edge.topology[:]
        reversed_edge.topology.add(
            source_cluster_id="west", target_cluster_id="east", start_after_lsns=[west_committed]
        )
        west_api.call(
            "UpdateReplicateConfiguration",
            api.UpdateReplicateConfigurationRequest(configuration=reversed_edge),
        )
        finish = _cli("replicate", "switchover", "--to", "west", "--json", endpoints=east.endpoints)
        assert finish.returncode == 0, (finish.stdout, finish.stderr)
        assert json.loads(finish.stdout)["finished_now"] == ["east"]
        for client in (east_api, west_api):
            answer = client.call(
                "GetReplicateConfiguration", api.GetReplicateConfigurationRequest()
            )
            assert answer.configuration == reversed_edge
        last_west = History()
        histories["west"].append(last_west)
        producer = Producer(west_api, pchannel, f"west-last-{SEED}")
        assert producer.send("orders", [b"west at last"], last_west, budget_s=60)
        producer.close()
        logs = _check_history(east_api, west_api, pchannel, histories)
        assert logs["east"][-1].payload == b"west at last"
    finally:
        east_api.close()
        west_api.close()
