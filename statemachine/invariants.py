"""Invariants of the coordination state, as a pure checker.

``violations(state, previous)`` lists every broken invariant (empty when all hold); tests
run it after every step, and ``check`` raises AssertionError for use as a guard. Comparing
with ``previous`` (the state before the last command) covers the invariants about change:
terms never decrease and the revision moves by exactly the number of events.
"""

from __future__ import annotations

from rpc.protos import coordination_pb2 as pb


def _lock_violations(state: pb.CoordinationState) -> list[str]:
    problems: list[str] = []
    lease_keys: dict[int, set[str]] = {}
    for key in sorted(state.locks):
        lock = state.locks[key]
        if lock.key != key:
            problems.append(f"lock {key!r} stored under key {lock.key!r}")
        if not lock.holders:
            problems.append(f"lock {key!r} has no holder but is kept")
        if lock.mode == pb.LOCK_MODE_EXCLUSIVE and len(lock.holders) != 1:
            problems.append(f"EXCLUSIVE lock {key!r} has {len(lock.holders)} holders")
        if lock.mode not in (pb.LOCK_MODE_EXCLUSIVE, pb.LOCK_MODE_SHARED):
            problems.append(f"lock {key!r} has invalid mode {lock.mode}")
        tokens = [h.fencing_token for h in lock.holders]
        if tokens != sorted(tokens) or len(set(tokens)) != len(tokens):
            problems.append(f"lock {key!r} holders are not ordered by distinct tokens {tokens}")
        for holder in lock.holders:
            if holder.fencing_token > state.revision or holder.fencing_token <= 0:
                problems.append(f"lock {key!r} token {holder.fencing_token} out of range")
            if holder.kind == pb.HOLDER_KIND_BROADCAST:
                task = state.broadcasts.get(holder.id)
                if task is None:
                    problems.append(f"lock {key!r} held by unknown broadcast {holder.id}")
                elif task.state != pb.BROADCAST_STATE_PENDING:
                    problems.append(
                        f"lock {key!r} held by broadcast {holder.id} in state "
                        f"{pb.BroadcastState.Name(task.state)}; only PENDING tasks hold keys"
                    )
            elif holder.kind == pb.HOLDER_KIND_LEASE:
                if holder.id not in state.leases:
                    problems.append(f"lock {key!r} held by ended lease {holder.id}")
                lease_keys.setdefault(holder.id, set()).add(key)
            else:
                problems.append(f"lock {key!r} has holder of unknown kind {holder.kind}")
    for lease_id in sorted(state.leases):
        lease = state.leases[lease_id]
        keys = list(lease.locked_keys)
        if keys != sorted(keys):
            problems.append(f"lease {lease_id} keys are not sorted")
        if set(keys) != lease_keys.get(lease_id, set()):
            problems.append(f"lease {lease_id} keys {keys} disagree with the lock table")
    return problems


def _broadcast_violations(state: pb.CoordinationState) -> list[str]:
    problems: list[str] = []
    for broadcast_id in sorted(state.broadcasts):
        task = state.broadcasts[broadcast_id]
        if task.state == pb.BROADCAST_STATE_TOMBSTONE and not all(v.acked for v in task.vchannels):
            problems.append(f"broadcast {broadcast_id} is TOMBSTONE with unacked vchannels")
        if (
            task.state == pb.BROADCAST_STATE_PENDING
            and task.vchannels
            and all(v.acked for v in task.vchannels)
        ):
            problems.append(f"broadcast {broadcast_id} is PENDING though every vchannel acked")
        if task.idempotency_key and (
            state.broadcast_idempotency.get(task.idempotency_key) != broadcast_id
        ):
            problems.append(f"broadcast {broadcast_id} idempotency index is wrong")
    for key in sorted(state.broadcast_idempotency):
        if state.broadcast_idempotency[key] not in state.broadcasts:
            problems.append(f"idempotency key {key!r} points to a cleared broadcast")
    return problems


def _channel_violations(state: pb.CoordinationState) -> list[str]:
    problems: list[str] = []
    for name in sorted(state.pchannels):
        channel = state.pchannels[name]
        terms = [entry.term for entry in channel.history]
        if terms != sorted(set(terms)):
            problems.append(f"pchannel {name} history terms not strictly increasing: {terms}")
        if channel.history and channel.history[-1].term != channel.term:
            problems.append(f"pchannel {name} term {channel.term} is not its last assignment")
        if (
            channel.history
            and channel.history[-1].node_id != channel.owner_node_id
            and channel.state != pb.PCHANNEL_STATE_DROPPED
        ):
            problems.append(f"pchannel {name} owner disagrees with its last assignment")
        if (
            channel.term > 0
            and channel.owner_node_id
            and (channel.owner_node_id not in channel.replica_node_ids)
        ):
            problems.append(f"pchannel {name} owner is not in its replica set")
        manifest = state.manifests.get(name)
        if manifest is None:
            problems.append(f"pchannel {name} has no segment manifest")
            continue
        expected_first = None
        for segment in manifest.segments:
            if segment.last_lsn < segment.first_lsn:
                problems.append(f"{name} segment {segment.segment_id} has an empty range")
            if expected_first is not None and segment.first_lsn != expected_first:
                problems.append(
                    f"{name} segment {segment.segment_id} overlaps or leaves a gap "
                    f"(expected first_lsn {expected_first})"
                )
            expected_first = segment.last_lsn + 1
        if manifest.segments and manifest.segments[-1].last_lsn != manifest.committed_through_lsn:
            problems.append(f"{name} committed_through_lsn disagrees with its last segment")
    for name in sorted(state.vchannels):
        vchannel = state.vchannels[name]
        if vchannel.pchannel not in state.pchannels:
            problems.append(f"vchannel {name} on unknown pchannel {vchannel.pchannel}")
        if vchannel.id <= 0 or vchannel.id >= state.next_vchannel_id:
            problems.append(f"vchannel {name} id {vchannel.id} out of range")
    return problems


def _member_violations(state: pb.CoordinationState) -> list[str]:
    """Each vchannel of a subscription is held by at most one member, and only vchannels of
    the subscription are held."""
    problems = []
    for name in sorted(state.subscriptions):
        subscription = state.subscriptions[name]
        holders: dict[str, str] = {}
        for member_id in sorted(subscription.members):
            for vchannel in subscription.members[member_id].vchannels:
                if vchannel not in subscription.vchannels:
                    problems.append(f"member {member_id} of {name} holds foreign {vchannel}")
                if vchannel in holders:
                    problems.append(
                        f"{vchannel} of {name} held by {holders[vchannel]} and {member_id}"
                    )
                holders[vchannel] = member_id
    return problems


def _subscription_step_violations(
    previous: pb.CoordinationState, state: pb.CoordinationState, events: list[pb.Event]
) -> list[str]:
    """A subscription's committed positions move forward, except through a Seek; every
    position names one of the subscription's vchannels."""
    problems = []
    sought = {
        (e.subscription_position_committed.name, e.subscription_position_committed.vchannel)
        for e in events
        if e.WhichOneof("body") == "subscription_position_committed"
        and e.subscription_position_committed.seek
    }
    for name in sorted(state.subscriptions):
        subscription = state.subscriptions[name]
        for vchannel in sorted(subscription.positions):
            if vchannel not in subscription.vchannels:
                problems.append(f"subscription {name} has a position on foreign {vchannel}")
        before = previous.subscriptions.get(name)
        if before is None:
            continue
        for vchannel in sorted(before.positions):
            if (name, vchannel) in sought or vchannel not in subscription.positions:
                continue
            old, new = before.positions[vchannel].lsn, subscription.positions[vchannel].lsn
            if new < old:
                problems.append(f"subscription {name} on {vchannel} went back {old} -> {new}")
    return problems


def _removed_node_violations(state: pb.CoordinationState) -> list[str]:
    """A removed node is registered no more, and holds nothing."""
    problems = [
        f"node {node_id} is both registered and removed"
        for node_id in sorted(state.removed_nodes)
        if node_id in state.nodes
    ]
    for name in sorted(state.pchannels):
        channel = state.pchannels[name]
        if channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        held = {channel.owner_node_id, *channel.replica_node_ids}
        for node_id in sorted(held & set(state.removed_nodes)):
            problems.append(f"pchannel {name} is held by removed node {node_id}")
    return problems


def _owner_usage_violations(state: pb.CoordinationState) -> list[str]:
    """`owner_usage` counts exactly the live leases, and the keys they hold, per owner."""
    counted: dict[str, tuple[int, int]] = {}
    for lease_id in sorted(state.leases):
        lease = state.leases[lease_id]
        if lease.owner:
            leases, locks = counted.get(lease.owner, (0, 0))
            counted[lease.owner] = (leases + 1, locks + len(lease.locked_keys))
    kept = {owner: (u.leases, u.locks) for owner, u in state.owner_usage.items()}
    if kept != counted:
        return [f"owner_usage {sorted(kept.items())} != counted {sorted(counted.items())}"]
    return []


def _wal_alter_violations(state: pb.CoordinationState) -> list[str]:
    """An AlterWAL never half-switches a pchannel: one in FLUSHING is still on the
    implementation it came from, one past it is on the target with its checkpoint at or
    below the manifest's end; a finished alter leaves no record."""
    if not state.HasField("wal_alter"):
        return []
    alter = state.wal_alter
    problems = []
    if not alter.pchannels:
        problems.append(f"AlterWAL epoch {alter.epoch} lists no pchannel")
    if all(e.stage == pb.WAL_ALTER_STAGE_DONE for e in alter.pchannels.values()):
        problems.append(f"AlterWAL epoch {alter.epoch} is done but still recorded")
    for name in sorted(alter.pchannels):
        entry = alter.pchannels[name]
        channel = state.pchannels.get(name)
        if channel is None:
            problems.append(f"AlterWAL lists unknown pchannel {name}")
            continue
        if channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        if entry.stage == pb.WAL_ALTER_STAGE_FLUSHING and channel.wal_epoch == alter.epoch:
            problems.append(f"pchannel {name} is FLUSHING but already on epoch {alter.epoch}")
        if entry.stage in (pb.WAL_ALTER_STAGE_ADVANCE_CHECKPOINT, pb.WAL_ALTER_STAGE_DONE):
            if channel.wal != alter.target or channel.wal_epoch != alter.epoch:
                problems.append(f"pchannel {name} advanced but is not on the alter's target")
            manifest = state.manifests.get(name)
            through = manifest.committed_through_lsn if manifest is not None else 0
            if channel.wal_checkpoint_lsn > through:
                problems.append(f"pchannel {name} checkpoint is past its manifest's end")
    return problems


def violations(
    state: pb.CoordinationState,
    previous: pb.CoordinationState | None = None,
    events: list[pb.Event] | None = None,
) -> list[str]:
    """Every broken invariant of `state` (and of the step from `previous` by `events`)."""
    problems = (
        _lock_violations(state)
        + _broadcast_violations(state)
        + _channel_violations(state)
        + _member_violations(state)
        + _removed_node_violations(state)
        + _owner_usage_violations(state)
        + _wal_alter_violations(state)
    )
    if previous is not None:
        for name in sorted(previous.pchannels):
            before = previous.pchannels[name].term
            after = state.pchannels[name].term if name in state.pchannels else None
            if after is None:
                problems.append(f"pchannel {name} disappeared")
            elif after < before:
                problems.append(f"pchannel {name} term decreased {before} -> {after}")
            problems += _subscription_step_violations(previous, state, events or [])
        restored = [e for e in events or [] if e.WhichOneof("body") == "state_restored"]
        if events is not None and restored:
            if state.revision != restored[-1].state_restored.restored_revision:
                problems.append(f"restore left revision {state.revision}")
        elif events is not None:
            if state.revision != previous.revision + len(events):
                problems.append(
                    f"revision moved {previous.revision} -> {state.revision} "
                    f"for {len(events)} events"
                )
            for offset, event in enumerate(events):
                if event.revision != previous.revision + 1 + offset:
                    problems.append(f"event {offset} has revision {event.revision}")
    return problems


def check(
    state: pb.CoordinationState,
    previous: pb.CoordinationState | None = None,
    events: list[pb.Event] | None = None,
) -> None:
    problems = violations(state, previous, events)
    if problems:
        raise AssertionError("invariants broken: " + "; ".join(problems))
