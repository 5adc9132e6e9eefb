"""A cluster stays balanced without being asked: rebalancing is on by default.

Three nodes, nine pchannels (three per node). One node is killed: its pchannels fail over
to the other two (six and three, or five and four). It restarts: within 60 s of its return
the owners differ by at most one pchannel per node again, and a producer writing to every
pchannel the whole time (the SDK's idempotent producer) sees no send fail. The `balance`
command shows and changes the policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.streaming_client import Producer, StreamingClient
from tests.cluster.conftest import Api, leader_id, running_cluster
from tests.cluster.wal_helpers import setup_channels
from tests.timing import scaled

pytestmark = pytest.mark.cluster

RAFTWAL = str(Path(sys.executable).with_name("raftwal"))
PCHANNELS = 9
BALANCED_WITHIN_S = 60.0


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[tuple[dev.LocalCluster, Api]]:
    settings = dict(os.environ)
    settings["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(tmp_path / "balance", settings) as running:
        yield running


def _owners(client: Api) -> Counter[str]:
    status = client.status()
    counts: Counter[str] = Counter({node.node_id: 0 for node in status.nodes})
    for channel in status.pchannels:
        if channel.name.startswith("bal_") and channel.state == pb.PCHANNEL_STATE_ASSIGNED:
            counts[channel.owner_node_id] += 1
    return counts


def _assigned(client: Api) -> int:
    return sum(
        1
        for c in client.status().pchannels
        if c.name.startswith("bal_") and c.state == pb.PCHANNEL_STATE_ASSIGNED
    )


def _wait(what: str, check, timeout_s: float) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    last = None
    timeout_s = scaled(timeout_s)
    while time.monotonic() - started < timeout_s:
        try:
            last = check()
            if last is True:
                return time.monotonic() - started
        except Exception as error:  # noqa: BLE001 - a node may be down; try again
            last = error
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout_s} s (last: {last})")


async def _produce_until(
    endpoints: list[str], vchannels: list[str], stop: asyncio.Event
) -> tuple[int, list[BaseException]]:
    """Send to every vchannel in turn until `stop`; (acknowledged, failures)."""
    acknowledged = 0
    failures: list[BaseException] = []
    async with (
        StreamingClient(endpoints) as client,
        Producer(client, linger_ms=2, retry_timeout_s=60) as producer,
    ):
        round_ = 0
        while not stop.is_set() and round_ < 10_000:
            sends = [producer.send(v, f"{v}-{round_}".encode()) for v in vchannels]
            for outcome in await asyncio.gather(*sends, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    failures.append(outcome)
                else:
                    acknowledged += 1
            round_ += 1
            await asyncio.sleep(0.05)
    return acknowledged, failures


def test_a_restarted_node_gets_its_share_back_and_no_produce_fails(env) -> None:
    cluster, client = env
    vchannels = {f"bal_v{index}": index for index in range(PCHANNELS)}
    setup_channels(client, "bal", vchannels)
    _wait("every pchannel assigned", lambda: _assigned(client) == PCHANNELS, 60)
    _wait(
        "a balanced start",
        lambda: max(_owners(client).values()) - min(_owners(client).values()) <= 1,
        60,
    )
    leader = leader_id(client)
    victim = next(node.id for node in cluster.config.nodes if node.id != leader)

    async def scenario() -> tuple[int, list[BaseException], float]:
        stop = asyncio.Event()
        producing = asyncio.create_task(_produce_until(cluster.endpoints, list(vchannels), stop))
        await asyncio.sleep(2.0)
        cluster.kill(victim)
        await asyncio.to_thread(
            _wait,
            "failover off the killed node",
            lambda: _owners(client)[victim] == 0 and _assigned(client) == PCHANNELS,
            60,
        )
        cluster.start_node(victim)
        balanced_after = await asyncio.to_thread(
            _wait,
            "owners within one of each other",
            lambda: (
                _assigned(client) == PCHANNELS
                and max(_owners(client).values()) - min(_owners(client).values()) <= 1
            ),
            BALANCED_WITHIN_S,
        )
        await asyncio.sleep(2.0)
        stop.set()
        acknowledged, failures = await producing
        return acknowledged, failures, balanced_after

    acknowledged, failures, balanced_after = asyncio.run(scenario())
    print(f"balanced {balanced_after:.1f} s after the restart; {acknowledged} acknowledged")
    assert not failures, failures[:3]
    assert acknowledged > PCHANNELS * 10
    owners = _owners(client)
    assert owners[victim] >= 2, owners


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    # The command's own budget follows the time scale too: a busy machine makes the
    # command slower, it must not make it give up.
    return subprocess.run(
        [RAFTWAL, *args, "--timeout-s", f"{scaled(10.0):g}"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )


def _events_from(client: Api, revision: int) -> list[pb.Event]:
    """The events from `revision` to the applied revision of the node answering."""
    stream = client.stub(client.endpoints[0]).WatchEvents(
        api.WatchEventsRequest(from_revision=revision), timeout=scaled(10)
    )
    events: list[pb.Event] = []
    try:
        for batch in stream:
            events += list(batch.events)
            if batch.next_revision > batch.applied_revision:
                break
    finally:
        stream.cancel()
    return events


def test_the_balance_command_shows_and_changes_the_policy(env) -> None:
    cluster, client = env
    endpoints = ",".join(cluster.endpoints)
    shown = _cli("balance", "show", "--json", "--endpoints", endpoints)
    assert shown.returncode == 0, shown.stderr
    policy = json.loads(shown.stdout)
    assert policy["allow_rebalance"] is True  # on by default
    off = _cli("balance", "off", "--json", "--endpoints", endpoints)
    assert off.returncode == 0 and json.loads(off.stdout)["allow_rebalance"] is False
    assert not client.status().balance_policy.allow_rebalance
    node = cluster.config.nodes[0].id
    frozen = _cli("balance", "freeze", node, "--json", "--endpoints", endpoints)
    assert frozen.returncode == 0, frozen.stderr
    assert json.loads(frozen.stdout)["frozen_node_ids"] == [node]
    on = _cli("balance", "on", "--max-moves-per-round", "2", "--json", "--endpoints", endpoints)
    data = json.loads(on.stdout)
    assert data["allow_rebalance"] is True and data["max_moves_per_round"] == 2
    assert data["frozen_node_ids"] == [node]  # turning it on keeps the frozen nodes
    thawed = _cli("balance", "unfreeze", node, "--json", "--endpoints", endpoints)
    assert json.loads(thawed.stdout)["frozen_node_ids"] == []
    unknown = _cli("balance", "freeze", "nosuch", "--endpoints", endpoints)
    assert unknown.returncode == 2 and "unknown node id(s) 'nosuch'" in unknown.stderr
    # The policy, its freezes and its unfreezes are one Raft entry (one round of
    # replication, all or nothing), not one proposal after another.
    others = [n.id for n in cluster.config.nodes[1:]]
    answer = client.call(
        "SetBalancePolicy",
        api.SetBalancePolicyRequest(
            allow_rebalance=True, max_moves_per_round=3, freeze_node_ids=others
        ),
    )
    events = _events_from(client, answer.revision - 2)
    kinds = [e.WhichOneof("body") for e in events]
    assert kinds == ["balance_policy_set", "node_frozen", "node_frozen"], kinds
    assert len({e.raft_index for e in events}) == 1, [e.raft_index for e in events]
    client.call(
        "SetBalancePolicy",
        api.SetBalancePolicyRequest(
            allow_rebalance=True, max_moves_per_round=3, unfreeze_node_ids=others
        ),
    )
