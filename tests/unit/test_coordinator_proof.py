"""A node proves it can serve before the coordinator registers it or places anything on it
(issue 53, item 7; issue 49, item 3), against the fake host of
`test_handover_coordinator` whose state applies the RegisterNode commands proposed.

Before, a heartbeat was enough: heartbeats from a process that never answered registered
a node, and the balancer then made it the owner of a new pchannel (ASSIGNING for good);
a joiner announcing another name of n1's address was accepted; and a second process
joining under an id another process was joining under was accepted too. Now the leader
calls NodeManager.CollectStatus at the announced address and wants that node id, that
Raft address and the state applied up to where the leader was when it first heard it.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from raftwal.node import coordinator as coordinator_module
from raftwal.node.coordinator import Coordinator
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from tests.unit.test_handover_coordinator import NODES, FakeHost, _leading, _moves

# address -> (node id answering there, its applied revision); absent: nothing answers
ANSWERS: dict[str, tuple[str, int]] = {}


class _Refused(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "refused"
        )


class ApplyingHost(FakeHost):
    """The fake host, whose state takes the nodes the coordinator registers (UP)."""

    async def propose(self, command: pb.Command, forward: bool = True) -> pb.CommandResult:
        if command.WhichOneof("body") == "register_node":
            register = command.register_node
            self.state.nodes[register.node_id].CopyFrom(
                pb.Node(
                    node_id=register.node_id,
                    address=register.address,
                    raft_address=register.raft_address,
                    state=pb.NODE_STATE_UP,
                )
            )
        return await super().propose(command, forward)


@pytest.fixture(autouse=True)
def answers(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, int]]:
    ANSWERS.clear()
    for node_id in NODES:
        ANSWERS[f"{node_id}:1"] = (node_id, 1 << 40)

    async def fake_collect_status(node: object, address: str) -> api.CollectStatusResponse:
        if address not in ANSWERS:
            raise _Refused()
        node_id, revision = ANSWERS[address]
        return api.CollectStatusResponse(
            node_id=node_id, member=api.MemberStatus(node_id=node_id, revision=revision)
        )

    async def no_assign(node: object, address: str, pchannel: str, term: int) -> bool:
        return True

    monkeypatch.setattr(coordinator_module, "collect_status", fake_collect_status, raising=False)
    monkeypatch.setattr(coordinator_module, "call_assign", no_assign)
    return ANSWERS


def _state_with_new_pchannels(count: int) -> pb.CoordinationState:
    state = pb.CoordinationState(revision=10)
    for node_id in NODES:
        state.nodes[node_id].CopyFrom(
            pb.Node(node_id=node_id, address=f"{node_id}:1", state=pb.NODE_STATE_UP)
        )
    for index in range(count):
        name = f"p{index}"
        state.pchannels[name].CopyFrom(
            pb.PChannel(name=name, state=pb.PCHANNEL_STATE_UNINITIALIZED)
        )
    return state


def _beat(coordinator: Coordinator, node_id: str, address: str, joined: bool = False) -> None:
    coordinator.record_heartbeat(
        api.HeartbeatRequest(node_id=node_id, address=address, incarnation=1, joined=joined)
    )


async def _ticks(
    coordinator: Coordinator, beats: list[tuple[str, str, bool]], count: int = 4
) -> None:
    for _ in range(count):
        for node_id, address, joined in beats:
            _beat(coordinator, node_id, address, joined)
        await coordinator.tick()
        await asyncio.gather(*getattr(coordinator, "_proof_tasks", ()))
        await asyncio.sleep(getattr(coordinator_module, "PROOF_EVERY_S", 0.5))


def _registered(host: FakeHost) -> list[str]:
    return [
        c.register_node.node_id for c in host.proposed if c.WhichOneof("body") == "register_node"
    ]


async def test_a_node_that_never_answered_is_neither_registered_nor_given_a_pchannel() -> None:
    host = ApplyingHost(_state_with_new_pchannels(8))
    coordinator = await _leading(host)
    beats = [(n, f"{n}:1", False) for n in NODES] + [("rogue", "10.9.9.9:7201", True)]
    await _ticks(coordinator, beats)
    assert "rogue" not in _registered(host)
    assert "rogue" not in host.state.nodes
    owners = {owner for _, _, owner in _moves(host)}
    assert owners == set(NODES), owners
    assert "did not answer" in coordinator.proof_problems["rogue"]


async def test_a_joiner_at_another_nodes_address_is_refused() -> None:
    """A joiner announcing n1's address under another name: the process there is n1."""
    host = ApplyingHost(_state_with_new_pchannels(4))
    coordinator = await _leading(host)
    ANSWERS["localhost:1"] = ("n1", 1 << 40)
    beats = [(n, f"{n}:1", False) for n in NODES] + [("n4", "localhost:1", True)]
    await _ticks(coordinator, beats)
    assert "n4" not in _registered(host)
    assert "n4" not in {owner for _, _, owner in _moves(host)}
    refusal = coordinator.joiner_conflict(
        api.HeartbeatRequest(node_id="n4", address="localhost:1", incarnation=1, joined=True)
    )
    from raftwal.services.cluster import ID_IN_USE_MARK

    assert refusal is not None and ID_IN_USE_MARK in refusal and "node n1 answers" in refusal


async def test_a_second_process_joining_under_one_id_is_refused() -> None:
    host = ApplyingHost(_state_with_new_pchannels(0))
    coordinator = await _leading(host)
    coordinator.record_heartbeat(
        api.HeartbeatRequest(
            node_id="n4", address="10.0.0.4:7201", raft_address="10.0.0.4:7301",
            incarnation=100, joined=True,
        )
    )  # fmt: skip
    second = api.HeartbeatRequest(
        node_id="n4", address="10.0.0.5:7201", raft_address="10.0.0.5:7301",
        incarnation=200, joined=True,
    )  # fmt: skip
    refusal = coordinator.joiner_conflict(second)
    from raftwal.services.cluster import ID_IN_USE_MARK

    assert refusal is not None and ID_IN_USE_MARK in refusal
    assert "10.0.0.4:7201" in refusal and "10.0.0.5:7201" in refusal
    # The first process itself is not in conflict with its own heartbeats.
    first_again = api.HeartbeatRequest(
        node_id="n4", address="10.0.0.4:7201", raft_address="10.0.0.4:7301",
        incarnation=100, joined=True,
    )  # fmt: skip
    assert coordinator.joiner_conflict(first_again) is None


async def test_a_node_behind_the_leaders_state_gets_nothing_until_caught_up() -> None:
    host = ApplyingHost(_state_with_new_pchannels(6))
    coordinator = await _leading(host)
    ANSWERS["n3:1"] = ("n3", 5)  # the leader is at revision 10
    beats = [(n, f"{n}:1", False) for n in NODES]
    await _ticks(coordinator, beats)
    assert "n3" not in {owner for _, _, owner in _moves(host)}
    assert "not caught up" in coordinator.proof_problems["n3"]
    ANSWERS["n3:1"] = ("n3", 10)
    for name in list(host.state.pchannels):
        host.state.pchannels[name].state = pb.PCHANNEL_STATE_UNINITIALIZED
    host.proposed.clear()
    started = time.monotonic()
    await _ticks(coordinator, beats)
    assert "n3" in {owner for _, _, owner in _moves(host)}
    assert time.monotonic() - started < 10
