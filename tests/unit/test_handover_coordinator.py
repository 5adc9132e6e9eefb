"""The coordinator loop's part of a planned stop, against a fake host (no cluster):

- a node that heartbeats as draining gets nothing placed on it and its pchannels move to
  another replica; a heartbeat without the flag (the restarted process) ends that;
- ``handover_targets`` counts the other nodes heard from and not draining (none: the whole
  cluster is stopping);
- a node whose process started less than ``placement_warmup_ms`` ago is a target only when
  no other node can be;
- right after taking over, a new leader places nothing until every UP node has
  heartbeated to it (else it would move everything to the nodes heard first).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raftwal.node import coordinator as coordinator_module
from raftwal.node.config import ClusterConfig, NodeConfig
from raftwal.node.coordinator import Coordinator
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api

NODES = ("n1", "n2", "n3")


class FakeHost:
    def __init__(self, state: pb.CoordinationState) -> None:
        self.config = ClusterConfig(
            nodes=tuple(
                NodeConfig(
                    id=n,
                    host="127.0.0.1",
                    grpc_port=7000 + i,
                    raft_port=7100 + i,
                    data_dir=Path("/nonexistent"),
                )
                for i, n in enumerate(NODES)
            )
        )
        self.me = self.config.nodes[0]
        self.metrics: Any = None
        self.state = state
        self.proposed: list[pb.Command] = []

    def is_leader(self) -> bool:
        return True

    async def read(
        self, reader: Callable[[pb.CoordinationState], Any], linearizable: bool
    ) -> tuple[Any, int]:
        return reader(self.state), self.state.revision

    async def propose(self, command: pb.Command, forward: bool = True) -> pb.CommandResult:
        # The coordinator proposes as the leader only: never through another node.
        assert forward is False, "the coordinator forwarded a proposal"
        self.proposed.append(command)
        return pb.CommandResult()

    def channel(self, address: str) -> Any:
        raise AssertionError("no channel in this test")


def _state() -> pb.CoordinationState:
    state = pb.CoordinationState()
    for node_id in NODES:
        state.nodes[node_id].CopyFrom(
            pb.Node(node_id=node_id, address=f"{node_id}:1", state=pb.NODE_STATE_UP)
        )
    state.pchannels["p"].CopyFrom(
        pb.PChannel(
            name="p",
            term=1,
            owner_node_id="n1",
            replica_node_ids=list(NODES),
            state=pb.PCHANNEL_STATE_ASSIGNED,
        )
    )
    return state


def _beat(
    coordinator: Coordinator, node_id: str, draining: bool = False, incarnation: int = 1
) -> None:
    coordinator.record_heartbeat(
        api.HeartbeatRequest(
            node_id=node_id, address=f"{node_id}:1", incarnation=incarnation, draining=draining
        )
    )


def _moves(host: FakeHost) -> list[tuple[str, int, str]]:
    return [
        (c.assign_pchannel.pchannel, c.assign_pchannel.term, c.assign_pchannel.node_id)
        for c in host.proposed
        if c.WhichOneof("body") == "assign_pchannel"
    ]


@pytest.fixture(autouse=True)
def nodes_answer_as_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's proof of a node (NodeManager.CollectStatus at its announced address):
    the process at "nX:1" is node nX, caught up."""

    async def fake_collect_status(node: object, address: str) -> api.CollectStatusResponse:
        node_id = address.split(":")[0]
        return api.CollectStatusResponse(
            node_id=node_id, member=api.MemberStatus(node_id=node_id, revision=1 << 40)
        )

    monkeypatch.setattr(coordinator_module, "collect_status", fake_collect_status)


async def _prove(coordinator: Coordinator, host: FakeHost) -> None:
    """Let the leader prove every node heard from: a tick starts the proofs (and places
    nothing on the nodes not proven yet); they end before the next tick."""
    await coordinator.tick()
    await asyncio.gather(*coordinator._proof_tasks)
    host.proposed.clear()


@pytest.fixture(autouse=True)
def no_assign_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    sent: list[tuple[str, str, int]] = []

    async def fake_call_assign(node: object, address: str, pchannel: str, term: int) -> bool:
        sent.append((address, pchannel, term))
        return True

    monkeypatch.setattr(coordinator_module, "call_assign", fake_call_assign)
    return sent


async def _leading(host: FakeHost) -> Coordinator:
    coordinator = Coordinator(host)  # type: ignore[arg-type]
    await coordinator._take_over()
    host.proposed.clear()
    return coordinator


async def test_a_draining_owner_hands_its_pchannel_to_another_replica() -> None:
    host = FakeHost(_state())
    coordinator = await _leading(host)
    for node_id in NODES:
        _beat(coordinator, node_id)
    await _prove(coordinator, host)
    await coordinator.tick()
    assert _moves(host) == []  # nothing to do while n1 serves
    _beat(coordinator, "n1", draining=True)
    await coordinator.tick()
    assert _moves(host) == [("p", 2, "n2")]
    # The restarted process heartbeats without the flag: a target again.
    _beat(coordinator, "n1")
    assert "n1" not in coordinator.draining


async def test_handover_targets_count_the_other_live_nodes_not_draining() -> None:
    host = FakeHost(_state())
    coordinator = await _leading(host)
    for node_id in NODES:
        _beat(coordinator, node_id)
    _beat(coordinator, "n1", draining=True)
    assert coordinator.handover_targets("n1") == 2
    _beat(coordinator, "n2", draining=True)
    assert coordinator.handover_targets("n1") == 1
    _beat(coordinator, "n3", draining=True)
    assert coordinator.handover_targets("n1") == 0  # the whole cluster is stopping


async def test_a_just_started_node_is_a_target_only_when_nothing_else_is() -> None:
    host = FakeHost(_state())
    coordinator = await _leading(host)
    started_now_ms = int(time.time() * 1000)
    _beat(coordinator, "n1", draining=True)
    _beat(coordinator, "n2", incarnation=started_now_ms)  # warming up
    _beat(coordinator, "n3")
    await _prove(coordinator, host)
    await coordinator.tick()
    assert _moves(host) == [("p", 2, "n3")]
    host.state.pchannels["p"].owner_node_id = "n3"
    host.state.pchannels["p"].term = 2
    host.proposed.clear()
    _beat(coordinator, "n3", draining=True)
    await coordinator.tick()
    assert _moves(host) == [("p", 3, "n2")]  # the only node left, warm or not


async def test_a_new_leader_places_nothing_until_every_up_node_heartbeated() -> None:
    host = FakeHost(_state())
    coordinator = Coordinator(host)  # type: ignore[arg-type]
    # Heartbeats from an earlier leadership: not evidence of life now.
    for node_id in NODES:
        _beat(coordinator, node_id)
    await coordinator._take_over()
    host.proposed.clear()
    _beat(coordinator, "n2")  # only n2 heard since the take-over
    await coordinator.tick()
    assert _moves(host) == []
    _beat(coordinator, "n1")
    _beat(coordinator, "n3")
    await coordinator.tick()
    assert _moves(host) == []  # everyone heard and n1 serves: nothing to move


async def test_first_placements_spread_over_warming_nodes_too() -> None:
    # A cluster whose nodes started a moment apart must not put every new pchannel on the
    # first node past its warm-up.
    state = _state()
    del state.pchannels["p"]
    for name in ("a", "b", "c"):
        state.pchannels[name].CopyFrom(
            pb.PChannel(name=name, state=pb.PCHANNEL_STATE_UNINITIALIZED)
        )
    host = FakeHost(state)
    coordinator = await _leading(host)
    started_now_ms = int(time.time() * 1000)
    _beat(coordinator, "n1")
    _beat(coordinator, "n2", incarnation=started_now_ms)
    _beat(coordinator, "n3", incarnation=started_now_ms)
    await _prove(coordinator, host)
    await coordinator.tick()
    assert sorted(owner for _, _, owner in _moves(host)) == ["n1", "n2", "n3"]


async def test_a_warming_owner_keeps_what_it_was_given() -> None:
    # A pchannel first placed on a node that is still warming up must not be moved away at
    # once because that node is not a move target yet: a warming node is alive. (It was:
    # a fresh cluster moved new pchannels at term 2 a moment after placing them.)
    host = FakeHost(_state())  # p is owned by n1 at term 1
    coordinator = await _leading(host)
    started_now_ms = int(time.time() * 1000)
    _beat(coordinator, "n1", incarnation=started_now_ms)  # the owner is warming up
    _beat(coordinator, "n2")
    _beat(coordinator, "n3")
    await coordinator.tick()
    assert _moves(host) == []
