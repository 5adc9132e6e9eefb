"""The balancer: a pure placement policy, ``plan(state, live_nodes) -> list[Command]``.

The coordinator loop on the Raft leader calls it with the nodes it currently hears from
and proposes the ``AssignPChannel`` commands it returns; the state machine validates them
again (a plan computed on a stale view is simply rejected with UNMATCHED_CHANNEL_TERM).

Rules, in order:
1. A pchannel never assigned gets the least-loaded eligible node as owner and a replica set
   of ``replica_count`` nodes: the owner plus the nodes holding the fewest replicas, taken
   first among the eligible nodes and then among the other UP, unfrozen nodes (a node a
   new leader has not heard from yet is still a replica: it catches up when it is back).
   A passing silence must not cut the set short (a short set is widened only by rule 3).
2. A pchannel whose owner is not eligible (DOWN, frozen, or not heard from), that is
   UNAVAILABLE, or that the caller reports stuck in ASSIGNING, moves at term + 1 to the
   least-loaded eligible node **of its replica set**. A move never changes the set: the
   acknowledged WAL entries live on a majority of it, and tail recovery finds them by
   fencing a majority of it. A pchannel with no eligible replica stays where it is (the
   coordinator reports it).
3. **Replica repair.** A pchannel whose owner is eligible gets a new replica set at term + 1
   when a member is in ``replace_nodes`` (DOWN for longer than the coordinator's
   ``replica_replace_after_ms``) or frozen (a node being drained), or, once ready, when
   its set is smaller than it should be (``replica_count``, capped by the UP unfrozen
   nodes). Each such member is swapped for
   (and a short set widened by) the eligible non-member holding the fewest replicas; with
   no such node the set stays as it is (it never shrinks). The change is safe because the
   new owner's recovery fences a majority of the new set and ceil(n/2) of the last ready
   set (``stable_replica_node_ids``), which meets every majority of it, where every
   acknowledged entry lives; and the state machine allows one change at a time (none while
   the last one is not ready), so no older set matters. docs/architecture.md (F9) has the
   argument.
4. When the policy allows rebalancing, pchannels move from the most to the least loaded
   eligible node while the difference exceeds one, again only within replica sets.

Moves per round are bounded (recovery by ``Limits.max_recovery_moves_per_round``, repair
by ``Limits.max_repairs_per_round``, rebalancing by the policy's ``max_moves_per_round``).
The output depends only on the inputs: nodes and pchannels are visited in sorted order
and ties break by node id. A pchannel gets at most one command per round.
"""

from __future__ import annotations

from collections.abc import Iterable

from rpc.protos import coordination_pb2 as pb
from statemachine.types import DEFAULT_LIMITS, Limits

_ACTIVE = (pb.PCHANNEL_STATE_ASSIGNING, pb.PCHANNEL_STATE_ASSIGNED)


def eligible_nodes(state: pb.CoordinationState, live_nodes: Iterable[str]) -> list[str]:
    """Registered, UP, unfrozen nodes that the coordinator hears from, sorted."""
    live = set(live_nodes)
    return sorted(
        node_id
        for node_id, node in state.nodes.items()
        if node_id in live and node.state == pb.NODE_STATE_UP and not node.frozen
    )


def _assign(channel: pb.PChannel, node_id: str, replicas: list[str]) -> pb.Command:
    return pb.Command(
        assign_pchannel=pb.AssignPChannel(
            pchannel=channel.name,
            term=channel.term + 1,
            node_id=node_id,
            replica_node_ids=replicas,
            access_mode=channel.access_mode or pb.ACCESS_MODE_READWRITE,
        )
    )


def plan(
    state: pb.CoordinationState,
    live_nodes: Iterable[str],
    stuck_pchannels: Iterable[str] = (),
    limits: Limits = DEFAULT_LIMITS,
    replace_nodes: Iterable[str] = (),
) -> list[pb.Command]:
    """The AssignPChannel commands that bring the placement back in line with the policy."""
    eligible = eligible_nodes(state, live_nodes)
    if not eligible:
        return []
    eligible_set = set(eligible)
    stuck = set(stuck_pchannels)
    owner_load = {node_id: 0 for node_id in eligible}
    replica_load = {node_id: 0 for node_id in eligible}
    names = sorted(state.pchannels)
    for name in names:
        channel = state.pchannels[name]
        if channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        if channel.state in _ACTIVE and channel.owner_node_id in owner_load:
            owner_load[channel.owner_node_id] += 1
        for node_id in channel.replica_node_ids:
            if node_id in replica_load:
                replica_load[node_id] += 1

    def least_loaded(candidates: Iterable[str]) -> str | None:
        pool = [c for c in candidates if c in eligible_set]
        if not pool:
            return None
        return min(pool, key=lambda node_id: (owner_load[node_id], node_id))

    commands: list[pb.Command] = []
    moved: set[str] = set()
    for name in names:
        if len(commands) >= limits.max_recovery_moves_per_round:
            break
        channel = state.pchannels[name]
        if channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        if channel.term == 0:
            owner = least_loaded(eligible)
            assert owner is not None
            members = sorted(
                node_id
                for node_id, node in state.nodes.items()
                if node.state == pb.NODE_STATE_UP and not node.frozen
            )
            wanted = min(channel.replica_count or limits.default_replica_count, len(members))
            others = sorted(
                (n for n in members if n != owner),
                key=lambda node_id: (
                    node_id not in eligible_set,
                    replica_load.get(node_id, 0),
                    node_id,
                ),
            )
            replicas = [owner, *others[: wanted - 1]]
            for node_id in replicas:
                replica_load[node_id] = replica_load.get(node_id, 0) + 1
        else:
            needs_move = (
                channel.owner_node_id not in eligible_set
                or channel.state == pb.PCHANNEL_STATE_UNAVAILABLE
                or channel.state == pb.PCHANNEL_STATE_UNINITIALIZED
                or name in stuck
            )
            if not needs_move:
                continue
            owner = least_loaded(channel.replica_node_ids)
            if owner is None:
                continue
            replicas = list(channel.replica_node_ids)
            if channel.owner_node_id in owner_load and channel.state in _ACTIVE:
                owner_load[channel.owner_node_id] -= 1
        owner_load[owner] += 1
        commands.append(_assign(channel, owner, replicas))
        moved.add(name)

    repairs = _repairs(state, eligible, set(replace_nodes), moved, replica_load, limits)
    commands.extend(repairs)
    moved.update(c.assign_pchannel.pchannel for c in repairs)
    if not state.balance_policy.allow_rebalance:
        return commands
    budget = state.balance_policy.max_moves_per_round or limits.default_moves_per_round
    owners = {
        name: state.pchannels[name].owner_node_id
        for name in names
        if state.pchannels[name].state == pb.PCHANNEL_STATE_ASSIGNED and name not in moved
    }
    rebalanced = 0
    while rebalanced < budget:
        busiest = max(eligible, key=lambda node_id: (owner_load[node_id], node_id))
        # A pchannel of the busiest node that can move to a less loaded replica.
        best: tuple[str, str] | None = None
        for name in names:
            if owners.get(name) != busiest:
                continue
            channel = state.pchannels[name]
            target = least_loaded(n for n in channel.replica_node_ids if n != busiest)
            if target is None or owner_load[busiest] - owner_load[target] <= 1:
                continue
            if best is None or (owner_load[target], target) < (owner_load[best[1]], best[1]):
                best = (name, target)
        if best is None:
            break
        name, target = best
        channel = state.pchannels[name]
        commands.append(_assign(channel, target, list(channel.replica_node_ids)))
        owner_load[busiest] -= 1
        owner_load[target] += 1
        del owners[name]
        rebalanced += 1
    return commands


def settled(channel: pb.PChannel) -> bool:
    """No replica set change of `channel` is waiting for a ready term."""
    stable = channel.stable_replica_node_ids
    return not stable or set(stable) == set(channel.replica_node_ids)


def _repairs(
    state: pb.CoordinationState,
    eligible: list[str],
    replace: set[str],
    moved: set[str],
    replica_load: dict[str, int],
    limits: Limits,
) -> list[pb.Command]:
    """Rule 3: replace long-DOWN members and widen short replica sets."""
    eligible_set = set(eligible)
    # A frozen node is being drained: it leaves the replica sets as a DOWN one would.
    replace = replace | {node_id for node_id, node in state.nodes.items() if node.frozen}
    up = sum(
        1 for node in state.nodes.values() if node.state == pb.NODE_STATE_UP and not node.frozen
    )
    commands: list[pb.Command] = []
    for name in sorted(state.pchannels):
        if len(commands) >= limits.max_repairs_per_round:
            break
        channel = state.pchannels[name]
        if (
            name in moved
            or channel.term == 0
            or channel.state == pb.PCHANNEL_STATE_DROPPED
            or channel.owner_node_id not in eligible_set
            or not settled(channel)
        ):
            continue
        current = list(channel.replica_node_ids)
        candidates = sorted(
            (n for n in eligible if n not in current),
            key=lambda node_id: (replica_load.get(node_id, 0), node_id),
        )
        wanted = min(channel.replica_count or limits.default_replica_count, up)
        members = list(current)
        for index, node_id in enumerate(members):
            if node_id in replace and node_id != channel.owner_node_id and candidates:
                members[index] = candidates.pop(0)
        if channel.state == pb.PCHANNEL_STATE_ASSIGNED:
            while len(members) < wanted and candidates:
                members.append(candidates.pop(0))
        if members == current:
            continue
        for node_id in set(members) - set(current):
            replica_load[node_id] = replica_load.get(node_id, 0) + 1
        commands.append(_assign(channel, channel.owner_node_id, members))
    return commands


def plan_subscriptions(
    state: pb.CoordinationState, limits: Limits = DEFAULT_LIMITS
) -> list[pb.Command]:
    """One ``AssignSubscription`` per subscription whose members' vchannels should change.

    Live members are those whose lease still exists (the state machine removes a lease
    when it expires or is revoked). The split is balanced (member loads differ by at most
    one), sticky (a member keeps what it holds up to its share), deterministic (members by
    id, vchannels sorted), and bounded: at most ``limits.max_subscription_moves_per_round``
    vchannels move from one live member to another per round (a vchannel that nobody live
    holds is placed at once). A member whose lease ended is removed first
    (``LeaveSubscription``: a crashed process never leaves by itself); its subscription is
    assigned in a later round, once the removal is applied.
    """
    commands: list[pb.Command] = []
    for name in sorted(state.subscriptions):
        subscription = state.subscriptions[name]
        if not subscription.members:
            continue
        dead = [
            m
            for m in sorted(subscription.members)
            if subscription.members[m].lease_id not in state.leases
        ]
        if dead:
            commands.extend(
                pb.Command(leave_subscription=pb.LeaveSubscription(name=name, member_id=m))
                for m in dead
            )
            continue
        members = sorted(subscription.members)
        live = [m for m in members if subscription.members[m].lease_id in state.leases]
        current = {m: list(subscription.members[m].vchannels) for m in members}
        wanted: dict[str, list[str]] = {m: [] for m in members}
        if live:
            vchannels = sorted(subscription.vchannels)
            share, extra = divmod(len(vchannels), len(live))
            # The members already holding more get the larger shares: fewer moves.
            by_load = sorted(live, key=lambda m: (-len(current[m]), m))
            caps = {m: share + (1 if index < extra else 0) for index, m in enumerate(by_load)}
            placed: set[str] = set()
            for member in live:
                for vchannel in current[member]:
                    if (
                        vchannel in subscription.vchannels
                        and vchannel not in placed
                        and len(wanted[member]) < caps[member]
                    ):
                        wanted[member].append(vchannel)
                        placed.add(vchannel)
            held_by_live = {v for m in live for v in current[m]}
            moves = 0
            for vchannel in vchannels:
                if vchannel in placed:
                    continue
                if vchannel in held_by_live:
                    if moves >= limits.max_subscription_moves_per_round:
                        # Leave it where it is this round (over its holder's cap).
                        holder = next(m for m in live if vchannel in current[m])
                        wanted[holder].append(vchannel)
                        placed.add(vchannel)
                        continue
                    moves += 1
                target = min(live, key=lambda m: (len(wanted[m]) - caps[m], len(wanted[m]), m))
                wanted[target].append(vchannel)
                placed.add(vchannel)
        if all(sorted(wanted[m]) == sorted(current[m]) for m in members):
            continue
        commands.append(
            pb.Command(
                assign_subscription=pb.AssignSubscription(
                    name=name,
                    assignments=[
                        pb.SubscriptionAssignment(member_id=m, vchannels=sorted(wanted[m]))
                        for m in members
                    ],
                )
            )
        )
    return commands
