"""``evolve(state, event)``: the only way the coordination state changes.

Each event must carry exactly the next revision; anything else is a broken invariant and
stops the process (an ``AssertionError``), because a replica that skipped or repeated an
event has diverged. Events were validated by ``decide``: evolve trusts their content and
only asserts what would mean a bug. The state is updated in place and returned.
"""

from __future__ import annotations

from collections.abc import Callable

from rpc.protos import coordination_pb2 as pb
from statemachine.replicate import replicated_pairs
from statemachine.state import upgrade_state
from statemachine.types import DEFAULT_LIMITS, Limits


def _node_registered(
    state: pb.CoordinationState, e: pb.NodeRegistered, revision: int, limits: Limits
) -> None:
    node = state.nodes[e.node_id]
    node.node_id = e.node_id
    node.address = e.address
    node.raft_address = e.raft_address
    del node.worker_addresses[:]
    node.worker_addresses.extend(e.worker_addresses)
    node.state = pb.NODE_STATE_UP
    node.registered_revision = revision
    # Only a rejoin registers a removed node (the decider checked).
    if e.node_id in state.removed_nodes:
        del state.removed_nodes[e.node_id]


def _node_removed(state, e: pb.NodeRemoved, revision, limits: Limits) -> None:
    if e.node_id in state.nodes:
        del state.nodes[e.node_id]
    removed = state.removed_nodes[e.node_id]
    removed.removed_revision = revision
    removed.removed_at_ms = e.removed_at_ms


def _node_marked_down(state, e: pb.NodeMarkedDown, revision, limits: Limits) -> None:
    state.nodes[e.node_id].state = pb.NODE_STATE_DOWN


def _node_marked_up(state, e: pb.NodeMarkedUp, revision, limits: Limits) -> None:
    state.nodes[e.node_id].state = pb.NODE_STATE_UP


def _node_frozen(state, e: pb.NodeFrozen, revision, limits: Limits) -> None:
    state.nodes[e.node_id].frozen = True


def _node_unfrozen(state, e: pb.NodeUnfrozen, revision, limits: Limits) -> None:
    state.nodes[e.node_id].frozen = False


def _pchannel_created(state, e: pb.PChannelCreated, revision, limits: Limits) -> None:
    assert e.name not in state.pchannels, f"pchannel {e.name} created twice"
    channel = state.pchannels[e.name]
    channel.name = e.name
    channel.state = pb.PCHANNEL_STATE_UNINITIALIZED
    channel.owner.CopyFrom(e.owner)
    channel.replica_count = e.replica_count
    channel.created_revision = revision
    channel.wal = e.wal
    channel.wal_config.update(e.wal_config)
    state.manifests[e.name].SetInParent()


def _wal_alter_started(state, e: pb.WalAlterStarted, revision, limits: Limits) -> None:
    assert not state.HasField("wal_alter"), "two AlterWALs at once"
    alter = state.wal_alter
    alter.epoch = e.epoch
    alter.target = e.target
    alter.target_config.update(e.target_config)
    for name, from_wal in zip(e.pchannels, e.from_wals, strict=True):
        entry = alter.pchannels[name]
        entry.stage = pb.WAL_ALTER_STAGE_FLUSHING
        entry.from_wal = from_wal


def _wal_checkpoint_advanced(state, e: pb.WalCheckpointAdvanced, revision, limits: Limits) -> None:
    channel = state.pchannels[e.pchannel]
    channel.wal = e.wal
    channel.wal_config.clear()
    channel.wal_config.update(e.wal_config)
    channel.wal_epoch = e.epoch
    channel.wal_checkpoint_lsn = e.checkpoint_lsn
    channel.wal_checkpoint_term = e.checkpoint_term
    channel.wal_checkpoint_time_tick = e.checkpoint_time_tick
    if state.HasField("wal_alter") and e.pchannel in state.wal_alter.pchannels:
        entry = state.wal_alter.pchannels[e.pchannel]
        entry.stage = pb.WAL_ALTER_STAGE_ADVANCE_CHECKPOINT
        entry.checkpoint_lsn = e.checkpoint_lsn
        entry.checkpoint_time_tick = e.checkpoint_time_tick
        entry.term = e.term


def _wal_alter_channel_done(state, e: pb.WalAlterChannelDone, revision, limits: Limits) -> None:
    assert state.wal_alter.epoch == e.epoch
    state.wal_alter.pchannels[e.pchannel].stage = pb.WAL_ALTER_STAGE_DONE


def _wal_alter_finished(state, e: pb.WalAlterFinished, revision, limits: Limits) -> None:
    assert state.wal_alter.epoch == e.epoch
    state.ClearField("wal_alter")


def _pchannel_assigned(state, e: pb.PChannelAssigned, revision, limits: Limits) -> None:
    channel = state.pchannels[e.pchannel]
    assert e.term == channel.term + 1, f"{e.pchannel}: term {channel.term} -> {e.term}"
    channel.term = e.term
    channel.owner_node_id = e.node_id
    del channel.replica_node_ids[:]
    channel.replica_node_ids.extend(e.replica_node_ids)
    channel.state = pb.PCHANNEL_STATE_ASSIGNING
    channel.access_mode = e.access_mode
    channel.history.add(term=e.term, node_id=e.node_id)
    overflow = len(channel.history) - limits.max_history_entries
    if overflow > 0:
        del channel.history[:overflow]


def _pchannel_became_ready(state, e: pb.PChannelBecameReady, revision, limits: Limits) -> None:
    channel = state.pchannels[e.pchannel]
    assert channel.term == e.term and channel.owner_node_id == e.node_id
    channel.state = pb.PCHANNEL_STATE_ASSIGNED
    # The term-start entry is on a majority of this set, with every entry before it.
    if list(channel.stable_replica_node_ids) != list(channel.replica_node_ids):
        del channel.stable_replica_node_ids[:]
        channel.stable_replica_node_ids.extend(channel.replica_node_ids)
    current = channel.history[-1]
    current.start_lsn = e.start_lsn
    # The previous owner's term ends where this one starts (if it ever wrote anything).
    for previous in reversed(channel.history[:-1]):
        if previous.start_lsn > 0:
            if previous.end_lsn == 0:
                previous.end_lsn = e.start_lsn - 1
            break


def _pchannel_marked_unavailable(
    state, e: pb.PChannelMarkedUnavailable, revision, limits: Limits
) -> None:
    state.pchannels[e.pchannel].state = pb.PCHANNEL_STATE_UNAVAILABLE


def _pchannel_dropped(state, e: pb.PChannelDropped, revision, limits: Limits) -> None:
    channel = state.pchannels[e.pchannel]
    channel.state = pb.PCHANNEL_STATE_DROPPED
    channel.owner_node_id = ""


def _vchannel_created(state, e: pb.VChannelCreated, revision, limits: Limits) -> None:
    assert e.name not in state.vchannels, f"vchannel {e.name} created twice"
    assert e.id == state.next_vchannel_id
    vchannel = state.vchannels[e.name]
    vchannel.name = e.name
    vchannel.id = e.id
    vchannel.pchannel = e.pchannel
    vchannel.state = pb.VCHANNEL_STATE_NORMAL
    vchannel.owner.CopyFrom(e.owner)
    vchannel.created_revision = revision
    state.next_vchannel_id = e.id + 1


def _vchannel_dropped(state, e: pb.VChannelDropped, revision, limits: Limits) -> None:
    state.vchannels[e.name].state = pb.VCHANNEL_STATE_DROPPED


def _segment_committed(state, e: pb.SegmentCommitted, revision, limits: Limits) -> None:
    manifest = state.manifests[e.segment.pchannel]
    assert e.segment.first_lsn == manifest.committed_through_lsn + 1, "segment gap/overlap"
    manifest.segments.append(e.segment)
    manifest.committed_through_lsn = e.segment.last_lsn


def _segments_deleted(state, e: pb.SegmentsDeleted, revision, limits: Limits) -> None:
    manifest = state.manifests[e.pchannel]
    count = len(e.segment_ids)
    assert [s.segment_id for s in manifest.segments[:count]] == list(e.segment_ids)
    del manifest.segments[:count]
    manifest.deleted_before_lsn = e.deleted_before_lsn


def _broadcast_created(state, e: pb.BroadcastCreated, revision, limits: Limits) -> None:
    task = e.task
    assert task.id == revision
    state.broadcasts[task.id].CopyFrom(task)
    if task.idempotency_key:
        state.broadcast_idempotency[task.idempotency_key] = task.id


def _broadcast_target(state, broadcast_id: int, vchannel: str) -> pb.BroadcastVChannel:
    for target in state.broadcasts[broadcast_id].vchannels:
        if target.vchannel == vchannel:
            return target
    raise AssertionError(f"broadcast {broadcast_id} has no target {vchannel}")


def _broadcast_appended(state, e: pb.BroadcastAppended, revision, limits: Limits) -> None:
    target = _broadcast_target(state, e.broadcast_id, e.vchannel)
    target.appended = True
    target.appended_lsn = e.lsn
    target.appended_time_tick = e.time_tick


def _broadcast_acked(state, e: pb.BroadcastAcked, revision, limits: Limits) -> None:
    target = _broadcast_target(state, e.broadcast_id, e.vchannel)
    target.acked = True
    target.acked_checkpoint = e.checkpoint


def _broadcast_tombstoned(state, e: pb.BroadcastTombstoned, revision, limits: Limits) -> None:
    task = state.broadcasts[e.broadcast_id]
    task.state = pb.BROADCAST_STATE_TOMBSTONE
    task.tombstoned_at_ms = e.tombstoned_at_ms


def _broadcast_cleared(state, e: pb.BroadcastCleared, revision, limits: Limits) -> None:
    task = state.broadcasts[e.broadcast_id]
    if task.idempotency_key:
        del state.broadcast_idempotency[task.idempotency_key]
    del state.broadcasts[e.broadcast_id]


def _lock_acquired(state, e: pb.LockAcquired, revision, limits: Limits) -> None:
    assert e.fencing_token == revision
    existed = e.key in state.locks
    lock = state.locks[e.key]
    if not existed:
        lock.key = e.key
        lock.mode = e.mode
    assert lock.mode == e.mode, f"lock {e.key}: {lock.mode} held, {e.mode} acquired"
    lock.holders.add(kind=e.holder_kind, id=e.holder_id, fencing_token=e.fencing_token)
    if e.holder_kind == pb.HOLDER_KIND_LEASE:
        lease = state.leases[e.holder_id]
        lease.locked_keys.append(e.key)
        lease.locked_keys.sort()
        _count_owner(state, lease.owner, locks=1)


def _lock_released(state, e: pb.LockReleased, revision, limits: Limits) -> None:
    lock = state.locks[e.key]
    for index, holder in enumerate(lock.holders):
        if holder.kind == e.holder_kind and holder.id == e.holder_id:
            del lock.holders[index]
            break
    else:
        raise AssertionError(f"lock {e.key} not held by {e.holder_kind}:{e.holder_id}")
    if not lock.holders:
        del state.locks[e.key]
    if e.holder_kind == pb.HOLDER_KIND_LEASE:
        lease = state.leases[e.holder_id]
        lease.locked_keys.remove(e.key)
        _count_owner(state, lease.owner, locks=-1)


def _count_owner(state, owner: str, leases: int = 0, locks: int = 0) -> None:
    """Keep `owner_usage` (the per-identity budgets' counts) in step with `leases`."""
    if not owner:
        return
    usage = state.owner_usage[owner]
    usage.leases += leases
    usage.locks += locks
    assert usage.leases >= 0 and usage.locks >= 0, f"owner usage went negative: {usage}"
    if not usage.leases and not usage.locks:
        del state.owner_usage[owner]


def _lease_granted(state, e: pb.LeaseGranted, revision, limits: Limits) -> None:
    assert e.lease.id == revision
    state.leases[e.lease.id].CopyFrom(e.lease)
    _count_owner(state, e.lease.owner, leases=1)


def _lease_renewed(state, e: pb.LeaseRenewed, revision, limits: Limits) -> None:
    state.leases[e.lease_id].deadline_ms = e.deadline_ms


def _lease_ended(state, e: pb.LeaseRevoked | pb.LeaseExpired, revision, limits: Limits) -> None:
    assert not state.leases[e.lease_id].locked_keys, "a lease ended while holding keys"
    _count_owner(state, state.leases[e.lease_id].owner, leases=-1)
    del state.leases[e.lease_id]


def _consumer_position_committed(
    state, e: pb.ConsumerPositionCommitted, revision, limits: Limits
) -> None:
    position = state.consumer_groups[e.group].positions[e.vchannel]
    position.group = e.group
    position.vchannel = e.vchannel
    position.lsn = e.lsn
    position.fence = e.fence


def _consumer_fence_bumped(state, e: pb.ConsumerFenceBumped, revision, limits: Limits) -> None:
    position = state.consumer_groups[e.group].positions[e.vchannel]
    position.group = e.group
    position.vchannel = e.vchannel
    assert e.fence == position.fence + 1
    position.fence = e.fence


def _subscription_created(state, e: pb.SubscriptionCreated, revision, limits: Limits) -> None:
    assert e.subscription.name not in state.subscriptions
    state.subscriptions[e.subscription.name].CopyFrom(e.subscription)


def _subscription_dropped(state, e: pb.SubscriptionDropped, revision, limits: Limits) -> None:
    del state.subscriptions[e.name]


def _subscription_position_committed(
    state, e: pb.SubscriptionPositionCommitted, revision, limits: Limits
) -> None:
    subscription = state.subscriptions[e.name]
    assert e.vchannel in subscription.vchannels
    if not e.seek and e.vchannel in subscription.positions:
        assert e.position.lsn >= subscription.positions[e.vchannel].lsn, "a commit went back"
    subscription.positions[e.vchannel].CopyFrom(e.position)


def _subscription_member_joined(
    state, e: pb.SubscriptionMemberJoined, revision, limits: Limits
) -> None:
    state.subscriptions[e.name].members[e.member.member_id].CopyFrom(e.member)


def _subscription_member_left(
    state, e: pb.SubscriptionMemberLeft, revision, limits: Limits
) -> None:
    del state.subscriptions[e.name].members[e.member_id]


def _subscription_member_assigned(
    state, e: pb.SubscriptionMemberAssigned, revision, limits: Limits
) -> None:
    member = state.subscriptions[e.name].members[e.member_id]
    assert e.generation > member.generation, "a generation went back"
    del member.vchannels[:]
    member.vchannels.extend(e.vchannels)
    member.generation = e.generation


def _balance_policy_set(state, e: pb.BalancePolicySet, revision, limits: Limits) -> None:
    state.balance_policy.allow_rebalance = e.allow_rebalance
    state.balance_policy.max_moves_per_round = e.max_moves_per_round


def _replicate_configuration_updated(
    state, e: pb.ReplicateConfigurationUpdated, revision, limits: Limits
) -> None:
    state.replicate_configuration.CopyFrom(e.configuration)
    if e.local_cluster_id:
        state.replicate_cluster_id = e.local_cluster_id
    # A target dropped from the configuration no longer holds retention, and one added
    # again later starts from what it reports then.
    kept = set(replicated_pairs(state.replicate_configuration, state.replicate_cluster_id))
    for pchannel in sorted(state.replicate_checkpoints):
        checkpoints = state.replicate_checkpoints[pchannel]
        for target in sorted(checkpoints.source_lsns):
            if (pchannel, target) not in kept:
                del checkpoints.source_lsns[target]
        for target in sorted(checkpoints.mismatched_lsns):
            if (pchannel, target) not in kept:
                del checkpoints.mismatched_lsns[target]
        # A drain is proven anew under each configuration (each write pause).
        checkpoints.drained_through_lsns.clear()
        if not checkpoints.source_lsns:
            del state.replicate_checkpoints[pchannel]


def _replicate_checkpoint_recorded(
    state, e: pb.ReplicateCheckpointRecorded, revision, limits: Limits
) -> None:
    checkpoints = state.replicate_checkpoints[e.pchannel]
    assert e.source_lsn >= checkpoints.source_lsns.get(e.target_cluster_id, 0), (
        "a replication checkpoint went back"
    )
    checkpoints.source_lsns[e.target_cluster_id] = e.source_lsn
    if e.drained_through_lsn:
        checkpoints.drained_through_lsns[e.target_cluster_id] = e.drained_through_lsn
    if e.target_claims_lsn:
        checkpoints.mismatched_lsns[e.target_cluster_id] = e.target_claims_lsn
    elif e.target_cluster_id in checkpoints.mismatched_lsns:
        del checkpoints.mismatched_lsns[e.target_cluster_id]


def _state_restored(state, e: pb.StateRestored, revision, limits: Limits) -> None:
    """Replace the (fresh) state with the saved one: its nodes stay, as DOWN and with no
    address, unless this cluster registered them (which keeps their address here); apply
    metadata (raft index, clock) stays this cluster's, and the revision continues from the
    saved one.

    The saved addresses are the source cluster's, which may still run: a new owner would
    fence and adopt its replicas' logs through them, and the node view would dial its
    nodes. A saved node gets an address again when a node of this cluster registers under
    its id."""
    restored = pb.CoordinationState.FromString(e.state)
    current_nodes = {name: pb.Node() for name in state.nodes}
    for name in state.nodes:
        current_nodes[name].CopyFrom(state.nodes[name])
    raft_index, time_ms = state.last_raft_index, state.last_time_ms
    state.CopyFrom(restored)
    for name in sorted(state.nodes):
        saved_node = state.nodes[name]
        saved_node.state = pb.NODE_STATE_DOWN
        saved_node.address = ""
        saved_node.raft_address = ""
        del saved_node.worker_addresses[:]
    for name, node in sorted(current_nodes.items()):
        state.nodes[name].CopyFrom(node)
    state.last_raft_index = raft_index
    state.last_time_ms = max(time_ms, restored.last_time_ms)
    upgrade_state(state)  # a backup written by an older version


_EVOLVERS: dict[str, Callable[..., None]] = {
    "node_registered": _node_registered,
    "state_restored": _state_restored,
    "node_marked_down": _node_marked_down,
    "node_marked_up": _node_marked_up,
    "node_frozen": _node_frozen,
    "node_unfrozen": _node_unfrozen,
    "node_removed": _node_removed,
    "pchannel_created": _pchannel_created,
    "pchannel_assigned": _pchannel_assigned,
    "pchannel_became_ready": _pchannel_became_ready,
    "pchannel_marked_unavailable": _pchannel_marked_unavailable,
    "pchannel_dropped": _pchannel_dropped,
    "vchannel_created": _vchannel_created,
    "vchannel_dropped": _vchannel_dropped,
    "segment_committed": _segment_committed,
    "segments_deleted": _segments_deleted,
    "broadcast_created": _broadcast_created,
    "broadcast_appended": _broadcast_appended,
    "broadcast_acked": _broadcast_acked,
    "broadcast_tombstoned": _broadcast_tombstoned,
    "broadcast_cleared": _broadcast_cleared,
    "lock_acquired": _lock_acquired,
    "lock_released": _lock_released,
    "lease_granted": _lease_granted,
    "lease_renewed": _lease_renewed,
    "lease_revoked": _lease_ended,
    "lease_expired": _lease_ended,
    "consumer_position_committed": _consumer_position_committed,
    "consumer_fence_bumped": _consumer_fence_bumped,
    "subscription_created": _subscription_created,
    "subscription_dropped": _subscription_dropped,
    "subscription_position_committed": _subscription_position_committed,
    "subscription_member_joined": _subscription_member_joined,
    "subscription_member_left": _subscription_member_left,
    "subscription_member_assigned": _subscription_member_assigned,
    "balance_policy_set": _balance_policy_set,
    "replicate_configuration_updated": _replicate_configuration_updated,
    "replicate_checkpoint_recorded": _replicate_checkpoint_recorded,
    "wal_alter_started": _wal_alter_started,
    "wal_checkpoint_advanced": _wal_checkpoint_advanced,
    "wal_alter_channel_done": _wal_alter_channel_done,
    "wal_alter_finished": _wal_alter_finished,
}

EVENT_KINDS: tuple[str, ...] = tuple(_EVOLVERS)


def evolve(
    state: pb.CoordinationState, event: pb.Event, limits: Limits = DEFAULT_LIMITS
) -> pb.CoordinationState:
    """Fold one event into `state` (in place) and return it. `limits` must be the ones the
    events were decided with (they bound what the state keeps, e.g. assignment history)."""
    if event.revision != state.revision + 1:
        raise AssertionError(
            f"event revision {event.revision} does not follow state revision {state.revision}"
        )
    kind = event.WhichOneof("body")
    if kind is None:
        raise AssertionError(f"event at revision {event.revision} has no body")
    _EVOLVERS[kind](state, getattr(event, kind), event.revision, limits)
    # A restore continues from the saved revision (ids and fencing tokens that are
    # revisions keep increasing); every other event moves it by one.
    state.revision = (
        event.state_restored.restored_revision if kind == "state_restored" else (event.revision)
    )
    return state
