"""The balancer policy: placement, failover moves within replica sets, bounded rebalancing,
and determinism. Plans are applied through the real state machine to check they are valid.
"""

from __future__ import annotations

import random

import pytest

from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from statemachine import apply_command, copy_state, new_state, snapshot_state
from statemachine.balancer import eligible_nodes, plan, plan_subscriptions
from statemachine.types import Limits

NOW = 1_700_000_000_000


def run(state: pb.CoordinationState, command: pb.Command) -> pb.CommandResult:
    command.proposed_at_ms = NOW
    return apply_command(state, command.SerializeToString(), state.last_raft_index + 1)


def cluster(nodes: int = 3, pchannels: int = 6) -> pb.CoordinationState:
    state = new_state()
    for k in range(1, nodes + 1):
        run(
            state,
            pb.Command(
                register_node=pb.RegisterNode(node_id=f"n{k}", address=f"127.0.0.1:{7200 + k}")
            ),
        )
    run(state, pb.Command(create_pchannels=pb.CreatePChannels(prefix="p", count=pchannels)))
    return state


def apply_plan(state: pb.CoordinationState, commands: list[pb.Command]) -> None:
    for command in commands:
        result = run(state, command)
        assert result.rejection.code == errors_pb2.OK, result.rejection.message


def make_ready(state: pb.CoordinationState) -> None:
    for name in sorted(state.pchannels):
        channel = state.pchannels[name]
        if channel.state == pb.PCHANNEL_STATE_ASSIGNING:
            # Each term's log starts after the previous term's (10 LSNs per term here).
            ready = pb.PChannelReady(
                pchannel=name,
                term=channel.term,
                node_id=channel.owner_node_id,
                start_lsn=10 * channel.term,
            )
            assert run(state, pb.Command(pchannel_ready=ready)).rejection.code == errors_pb2.OK


def owners(state: pb.CoordinationState) -> dict[str, int]:
    load: dict[str, int] = {}
    for channel in state.pchannels.values():
        load[channel.owner_node_id] = load.get(channel.owner_node_id, 0) + 1
    return load


def test_initial_placement_spreads_owners_and_replicas():
    state = cluster(3, 6)
    commands = plan(state, ["n1", "n2", "n3"])
    assert len(commands) == 6
    apply_plan(state, commands)
    assert owners(state) == {"n1": 2, "n2": 2, "n3": 2}
    for channel in state.pchannels.values():
        assert len(channel.replica_node_ids) == 3
        assert channel.replica_node_ids[0] == channel.owner_node_id
        assert channel.term == 1
    # Nothing more to do once placed.
    make_ready(state)
    assert plan(state, ["n1", "n2", "n3"]) == []


def test_replica_count_capped_by_eligible_nodes():
    state = cluster(2, 1)
    apply_plan(state, plan(state, ["n1", "n2"]))
    assert len(state.pchannels["p_0"].replica_node_ids) == 2


def test_down_owner_moves_within_replica_set_with_term_bump():
    state = cluster(3, 6)
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    before = copy_state(state)
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n2")))
    commands = plan(state, ["n1", "n3"])
    moved = {c.assign_pchannel.pchannel for c in commands}
    assert moved == {n for n, c in before.pchannels.items() if c.owner_node_id == "n2"}
    apply_plan(state, commands)
    for name in moved:
        channel = state.pchannels[name]
        assert channel.owner_node_id in ("n1", "n3")
        assert channel.term == before.pchannels[name].term + 1
        assert list(channel.replica_node_ids) == list(before.pchannels[name].replica_node_ids)


def test_unheard_and_frozen_owners_move_too():
    state = cluster(3, 3)
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    run(state, pb.Command(freeze_node=pb.FreezeNode(node_id="n1")))
    commands = plan(state, ["n1", "n2", "n3"])
    assert {c.assign_pchannel.node_id for c in commands} <= {"n2", "n3"}
    assert len(commands) == 1
    # n3 silent (not live) though still UP in the state: moves as well.
    apply_plan(state, commands)
    make_ready(state)
    commands = plan(state, ["n1", "n2"])
    assert commands and all(c.assign_pchannel.node_id == "n2" for c in commands)


def test_first_replica_set_is_full_even_when_members_are_unheard():
    # n2 and n3 are UP in the state but not heard from yet (a new leader): the owner is a
    # live node, and the replica set still gets replica_count members, live ones first.
    state = cluster(3, 1)
    apply_plan(state, plan(state, ["n1"]))
    assert state.pchannels["p_0"].owner_node_id == "n1"
    assert list(state.pchannels["p_0"].replica_node_ids) == ["n1", "n2", "n3"]
    # A DOWN node is never chosen.
    state = cluster(3, 1)
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n3")))
    apply_plan(state, plan(state, ["n1", "n2"]))
    assert list(state.pchannels["p_0"].replica_node_ids) == ["n1", "n2"]


def test_no_eligible_replica_means_no_move():
    state = cluster(3, 1)
    apply_plan(state, [c for c in plan(state, ["n1"])])
    run(state, pb.Command(register_node=pb.RegisterNode(node_id="n9", address="127.0.0.1:9")))
    assert plan(state, ["n9"]) == []


def test_stuck_assigning_is_retried_with_a_new_term():
    state = cluster(3, 1)
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    assert state.pchannels["p_0"].state == pb.PCHANNEL_STATE_ASSIGNING
    assert plan(state, ["n1", "n2", "n3"]) == []
    commands = plan(state, ["n1", "n2", "n3"], stuck_pchannels=["p_0"])
    assert len(commands) == 1 and commands[0].assign_pchannel.term == 2


def test_rebalancing_is_on_by_default():
    # A new cluster rebalances without being asked (bounded per round, as below).
    state = cluster(3, 6)
    assert state.balance_policy.allow_rebalance
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    run(state, pb.Command(freeze_node=pb.FreezeNode(node_id="n2")))
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    assert "n2" not in owners(state)
    run(state, pb.Command(unfreeze_node=pb.UnfreezeNode(node_id="n2")))
    for _ in range(5):
        apply_plan(state, plan(state, ["n1", "n2", "n3"]))
        make_ready(state)
    assert sorted(owners(state).values()) == [2, 2, 2]


def test_rebalance_only_when_allowed_and_bounded():
    state = cluster(3, 6)
    run(state, pb.Command(set_balance_policy=pb.SetBalancePolicy(allow_rebalance=False)))
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    # Everything piles onto n1 while n2 and n3 are frozen, then they come back.
    run(state, pb.Command(freeze_node=pb.FreezeNode(node_id="n2")))
    run(state, pb.Command(freeze_node=pb.FreezeNode(node_id="n3")))
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    assert owners(state) == {"n1": 6}
    run(state, pb.Command(unfreeze_node=pb.UnfreezeNode(node_id="n2")))
    run(state, pb.Command(unfreeze_node=pb.UnfreezeNode(node_id="n3")))
    assert plan(state, ["n1", "n2", "n3"]) == []
    policy = pb.SetBalancePolicy(allow_rebalance=True, max_moves_per_round=1)
    run(state, pb.Command(set_balance_policy=policy))
    commands = plan(state, ["n1", "n2", "n3"])
    assert len(commands) == 1
    policy.max_moves_per_round = 10
    run(state, pb.Command(set_balance_policy=policy))
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    assert sorted(owners(state).values()) == [2, 2, 2]


def test_eligible_nodes_sorted_and_filtered():
    state = cluster(3, 1)
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n3")))
    assert eligible_nodes(state, ["n3", "n2", "n1", "zz"]) == ["n1", "n2"]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_plan_is_deterministic_and_always_valid(seed):
    rng = random.Random(seed)
    state = cluster(rng.randint(1, 5), rng.randint(1, 12))
    nodes = sorted(state.nodes)
    for step in range(30):
        live = [n for n in nodes if rng.random() < 0.8]
        if rng.random() < 0.2:
            target = rng.choice(nodes)
            kind = rng.choice(["freeze_node", "unfreeze_node", "mark_node_down", "mark_node_up"])
            message = {
                "freeze_node": pb.FreezeNode,
                "unfreeze_node": pb.UnfreezeNode,
                "mark_node_down": pb.MarkNodeDown,
                "mark_node_up": pb.MarkNodeUp,
            }[kind]
            run(state, pb.Command(**{kind: message(node_id=target)}))
        replace = [n for n in nodes if state.nodes[n].state == pb.NODE_STATE_DOWN]
        replace = [n for n in replace if rng.random() < 0.5]
        first = plan(state, live, replace_nodes=replace)
        second = plan(copy_state(state), list(reversed(live)), replace_nodes=replace)
        assert [c.SerializeToString() for c in first] == [c.SerializeToString() for c in second], (
            seed
        )
        names = [c.assign_pchannel.pchannel for c in first]
        assert len(names) == len(set(names)), (seed, step, names)
        snapshot = snapshot_state(state)
        apply_plan(state, first)
        assert snapshot != snapshot_state(state) or not first
        make_ready(state)
        eligible = set(eligible_nodes(state, live))
        for channel in state.pchannels.values():
            if channel.term and channel.owner_node_id not in eligible:
                # Only acceptable when no replica of it is eligible.
                assert not eligible & set(channel.replica_node_ids), (seed, step, channel)


def _sets(state: pb.CoordinationState) -> dict[str, list[str]]:
    return {n: list(c.replica_node_ids) for n, c in sorted(state.pchannels.items())}


def test_a_long_down_replica_is_replaced_by_a_node_outside_the_set():
    state = cluster(3, 3)
    for channel in state.pchannels.values():
        channel.replica_count = 2
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    before = _sets(state)
    assert all(len(members) == 2 for members in before.values())
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n2")))
    # DOWN, but not for long yet: only the owner moves (rule 2), sets stay.
    first = plan(state, ["n1", "n3"])
    apply_plan(state, first)
    make_ready(state)
    assert _sets(state) == before
    # DOWN for long: every set holding n2 gets n3 or n1 in its place, at term + 1, with the
    # same (eligible) owner.
    owners_before = {n: c.owner_node_id for n, c in state.pchannels.items()}
    terms_before = {n: c.term for n, c in state.pchannels.items()}
    commands = plan(state, ["n1", "n3"], replace_nodes=["n2"])
    changed = {c.assign_pchannel.pchannel for c in commands}
    assert changed == {n for n, m in before.items() if "n2" in m}
    apply_plan(state, commands)
    for name in changed:
        channel = state.pchannels[name]
        assert "n2" not in channel.replica_node_ids
        assert len(channel.replica_node_ids) == 2
        assert channel.owner_node_id == owners_before[name]
        assert channel.term == terms_before[name] + 1
        # Not ready yet: the last ready set is still the one with n2.
        assert "n2" in channel.stable_replica_node_ids
    # One change at a time: nothing more until the new sets are ready.
    assert plan(state, ["n1", "n3"], replace_nodes=["n2"]) == []
    make_ready(state)
    assert plan(state, ["n1", "n3"], replace_nodes=["n2"]) == []


def test_a_frozen_node_is_drained_of_owners_and_replicas():
    state = cluster(4, 6)
    for channel in state.pchannels.values():
        channel.replica_count = 3
    live = ["n1", "n2", "n3", "n4"]
    apply_plan(state, plan(state, live))
    make_ready(state)
    assert any("n4" in members for members in _sets(state).values())
    run(state, pb.Command(freeze_node=pb.FreezeNode(node_id="n4")))
    for _ in range(10):
        commands = plan(state, live)
        if not commands:
            break
        apply_plan(state, commands)
        make_ready(state)
    assert all("n4" not in members for members in _sets(state).values())
    assert all(len(members) == 3 for members in _sets(state).values())
    assert "n4" not in {c.owner_node_id for c in state.pchannels.values()}


def test_no_node_outside_the_set_means_the_set_stays():
    state = cluster(3, 2)
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n3")))
    apply_plan(state, plan(state, ["n1", "n2"]))
    make_ready(state)
    assert plan(state, ["n1", "n2"], replace_nodes=["n3"]) == []
    assert all(len(m) == 3 for m in _sets(state).values())


def test_a_short_set_is_widened_once_ready_and_a_node_is_back():
    state = cluster(3, 1)
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n3")))
    apply_plan(state, plan(state, ["n1", "n2"]))
    assert _sets(state) == {"p_0": ["n1", "n2"]}
    # Not ready: not widened yet.
    run(state, pb.Command(mark_node_up=pb.MarkNodeUp(node_id="n3")))
    assert plan(state, ["n1", "n2", "n3"]) == []
    make_ready(state)
    commands = plan(state, ["n1", "n2", "n3"])
    assert [list(c.assign_pchannel.replica_node_ids) for c in commands] == [["n1", "n2", "n3"]]
    apply_plan(state, commands)
    make_ready(state)
    assert plan(state, ["n1", "n2", "n3"]) == []


def test_a_stuck_pchannel_whose_set_lost_a_majority_is_repaired():
    """Set {n1, n2}; n1 (the owner) dies: the move to n2 cannot recover (it needs both),
    but the set is settled, so n1 can be replaced and n2's recovery then consults the last
    ready set {n1, n2} (one of two suffices) and the new one {n2, n3}."""
    state = cluster(3, 1)
    state.pchannels["p_0"].replica_count = 2
    apply_plan(state, plan(state, ["n1", "n2", "n3"]))
    make_ready(state)
    assert _sets(state) == {"p_0": ["n1", "n2"]}
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n1")))
    apply_plan(state, plan(state, ["n2", "n3"]))
    channel = state.pchannels["p_0"]
    assert (channel.owner_node_id, channel.state) == ("n2", pb.PCHANNEL_STATE_ASSIGNING)
    commands = plan(state, ["n2", "n3"], replace_nodes=["n1"])
    assert [list(c.assign_pchannel.replica_node_ids) for c in commands] == [["n3", "n2"]]
    apply_plan(state, commands)
    assert list(channel.stable_replica_node_ids) == ["n1", "n2"]


# ---------------------------------------------------------------------------------------
# Subscription members
# ---------------------------------------------------------------------------------------


def _subscribed(vchannels: int = 4) -> pb.CoordinationState:
    state = cluster(3, 1)
    names = [f"v{k}" for k in range(vchannels)]
    for name in names:
        run(state, pb.Command(create_vchannel=pb.CreateVChannel(name=name, pchannel="p_0")))
    run(state, pb.Command(create_subscription=pb.CreateSubscription(name="s", vchannels=names)))
    return state


def _join(state: pb.CoordinationState, member: str) -> int:
    lease = run(state, pb.Command(grant_lease=pb.GrantLease(ttl_ms=10_000, holder=member)))
    assert lease.rejection.code == errors_pb2.OK
    joined = run(
        state,
        pb.Command(
            join_subscription=pb.JoinSubscription(
                name="s", member_id=member, lease_id=lease.lease_id
            )
        ),
    )
    assert joined.rejection.code == errors_pb2.OK, joined.rejection.message
    return lease.lease_id


def _held(state: pb.CoordinationState) -> dict[str, list[str]]:
    members = state.subscriptions["s"].members
    return {m: list(members[m].vchannels) for m in sorted(members)}


def test_members_split_the_vchannels_balanced_and_sticky() -> None:
    state = _subscribed(4)
    _join(state, "a")
    apply_plan(state, plan_subscriptions(state))
    assert _held(state) == {"a": ["v0", "v1", "v2", "v3"]}
    generation = state.subscriptions["s"].members["a"].generation
    _join(state, "b")
    apply_plan(state, plan_subscriptions(state))
    held = _held(state)
    assert sorted(len(v) for v in held.values()) == [2, 2]
    assert sorted(held["a"] + held["b"]) == ["v0", "v1", "v2", "v3"]
    # a kept two of its own; its generation moved because its set changed.
    assert state.subscriptions["s"].members["a"].generation > generation
    # Stable: nothing more to do.
    assert plan_subscriptions(state) == []
    _join(state, "c")
    before = _held(state)
    apply_plan(state, plan_subscriptions(state))
    after = _held(state)
    assert sorted(len(v) for v in after.values()) == [1, 1, 2]
    moved = sum(1 for m in ("a", "b") for v in before[m] if v not in after[m])
    assert moved == 1, (before, after)


def test_a_member_whose_lease_ended_loses_its_vchannels() -> None:
    state = _subscribed(3)
    _join(state, "a")
    lease_b = _join(state, "b")
    apply_plan(state, plan_subscriptions(state))
    run(state, pb.Command(revoke_lease=pb.RevokeLease(lease_id=lease_b)))
    # First b is removed (a crashed process never leaves by itself), then a gets it all.
    removal = plan_subscriptions(state)
    assert [c.WhichOneof("body") for c in removal] == ["leave_subscription"]
    apply_plan(state, removal)
    apply_plan(state, plan_subscriptions(state))
    assert _held(state) == {"a": ["v0", "v1", "v2"]}


def test_moves_per_round_are_bounded() -> None:
    state = _subscribed(8)
    _join(state, "a")
    apply_plan(state, plan_subscriptions(state))
    _join(state, "b")
    limits = Limits(max_subscription_moves_per_round=1)
    rounds = 0
    while (commands := plan_subscriptions(state, limits)) and rounds < 10:
        before = _held(state)
        apply_plan(state, commands)
        after = _held(state)
        assert sum(1 for v in before["a"] if v not in after["a"]) <= 1
        rounds += 1
    assert sorted(len(v) for v in _held(state).values()) == [4, 4]
    assert rounds == 4


def test_a_repaired_pchannel_is_not_also_rebalanced_in_the_same_round():
    """Both rules would pick the same pchannels (all owned by n1, all holding the long-DOWN
    n4): it gets the repair only, and one command per pchannel per round."""
    state = cluster(5, 4)
    for name in sorted(state.pchannels):
        assert (
            run(
                state,
                pb.Command(
                    assign_pchannel=pb.AssignPChannel(
                        pchannel=name, term=1, node_id="n1", replica_node_ids=["n1", "n2", "n4"]
                    )
                ),
            ).rejection.code
            == errors_pb2.OK
        )
    make_ready(state)
    run(state, pb.Command(mark_node_down=pb.MarkNodeDown(node_id="n4")))
    commands = plan(state, ["n1", "n2", "n3", "n5"], replace_nodes=["n4"])
    names = [c.assign_pchannel.pchannel for c in commands]
    assert len(names) == len(set(names)), names
    repaired = [c for c in commands if "n4" not in c.assign_pchannel.replica_node_ids]
    assert len(repaired) == 4
    apply_plan(state, commands)
