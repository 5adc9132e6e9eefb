"""``decide(state, command, ctx)``: validate a command against the state and say what happened.

Returns the list of events the command produces (possibly empty: an idempotent repeat) or
a ``Rejection``. Each event is stamped with the revision it will get (the state's revision
+ 1 + its position), so ids that are revisions (lease ids, broadcast ids, fencing tokens)
are known while deciding. ``decide`` never changes the state.

Determinism: every iteration over a protobuf map goes through ``sorted`` (map order is an
implementation detail that may differ between processes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from statemachine.replicate import (
    check_configuration,
    is_empty,
    local_cluster,
    replicated_pairs,
    replication_hold,
    switching_to,
    with_kept_tokens,
    write_refusal,
)
from statemachine.state import restore_state
from statemachine.types import DEFAULT_LIMITS, Context, Limits, Rejection
from statemachine.validation import (
    check_address,
    check_enum,
    check_key,
    check_name,
    check_range,
    check_text,
    check_unique,
    first_error,
    invalid,
    show,
)

E = errors_pb2

LOCK_MODES: dict[int, str] = {pb.LOCK_MODE_EXCLUSIVE: "EXCLUSIVE", pb.LOCK_MODE_SHARED: "SHARED"}
ACCESS_MODES: dict[int, str] = {
    pb.ACCESS_MODE_UNSPECIFIED: "UNSPECIFIED(=READWRITE)",
    pb.ACCESS_MODE_READWRITE: "READWRITE",
    pb.ACCESS_MODE_READONLY: "READONLY",
}

Outcome = list[pb.Event] | Rejection


class _Emitter:
    """Builds the events of one decision with consecutive revisions."""

    __slots__ = ("events", "_next_revision", "_ctx")

    def __init__(self, state: pb.CoordinationState, ctx: Context) -> None:
        self.events: list[pb.Event] = []
        self._next_revision = state.revision + 1
        self._ctx = ctx

    @property
    def next_revision(self) -> int:
        return self._next_revision

    def emit(self, **body: object) -> pb.Event:
        event = pb.Event(
            revision=self._next_revision,
            raft_index=self._ctx.raft_index,
            time_ms=self._ctx.time_ms,
            **body,  # type: ignore[arg-type]
        )
        self._next_revision += 1
        self.events.append(event)
        return event


def _owner_error(owner: pb.OwnerDescription, limits: Limits) -> Rejection | None:
    return first_error(
        check_text("owner.role", owner.role, limits),
        check_text("owner.address", owner.address, limits),
        check_text("owner.text", owner.text, limits),
    )


def _pchannel_missing(name: str) -> Rejection:
    return Rejection(E.CHANNEL_NOT_EXIST, f"pchannel {show(name)} does not exist")


def _live_pchannel(state: pb.CoordinationState, name: str) -> pb.PChannel | Rejection:
    if name not in state.pchannels:
        return _pchannel_missing(name)
    channel = state.pchannels[name]
    if channel.state == pb.PCHANNEL_STATE_DROPPED:
        return Rejection(E.CHANNEL_NOT_EXIST, f"pchannel {show(name)} was dropped")
    return channel


def _node_or_error(state: pb.CoordinationState, node_id: str, limits: Limits) -> Rejection | None:
    bad = check_name("node_id", node_id, limits)
    if bad:
        return bad
    if node_id not in state.nodes:
        return Rejection(E.NOT_FOUND, f"node {show(node_id)} is not registered")
    return None


def _live_lease(state: pb.CoordinationState, lease_id: int, ctx: Context) -> pb.Lease | Rejection:
    if lease_id <= 0:
        return invalid(f"invalid lease_id ({lease_id}; expected a granted lease id >= 1)")
    if lease_id not in state.leases:
        return Rejection(E.NOT_FOUND, f"lease {lease_id} does not exist (revoked or expired)")
    lease = state.leases[lease_id]
    if lease.deadline_ms <= ctx.time_ms:
        return Rejection(
            E.NOT_FOUND,
            f"lease {lease_id} expired at {lease.deadline_ms} ms (now {ctx.time_ms} ms)",
        )
    return lease


def _conflict(
    state: pb.CoordinationState, key: str, mode: int, holder_kind: int, holder_id: int
) -> Rejection | None:
    """RESOURCE_ACQUIRED when `key` cannot be taken in `mode` by the given holder."""
    if key not in state.locks:
        return None
    lock = state.locks[key]
    others = [h for h in lock.holders if not (h.kind == holder_kind and h.id == holder_id)]
    if not others:
        return None
    if mode == pb.LOCK_MODE_EXCLUSIVE or lock.mode == pb.LOCK_MODE_EXCLUSIVE:
        first = others[0]
        kind = pb.HolderKind.Name(first.kind).removeprefix("HOLDER_KIND_").lower()
        return Rejection(
            E.RESOURCE_ACQUIRED,
            f"resource key {show(key)} is held {LOCK_MODES[lock.mode]} by {kind} {first.id} "
            f"(fencing token {first.fencing_token}); requested {LOCK_MODES[mode]}",
        )
    return None


def _release_lease_locks(emitter: _Emitter, lease: pb.Lease) -> None:
    for key in sorted(lease.locked_keys):
        emitter.emit(
            lock_released=pb.LockReleased(
                key=key, holder_kind=pb.HOLDER_KIND_LEASE, holder_id=lease.id
            )
        )


# --------------------------------------------------------------------------------------
# Nodes
# --------------------------------------------------------------------------------------


def _register_node(state, cmd: pb.RegisterNode, ctx, limits) -> Outcome:
    bad = first_error(
        check_name("node_id", cmd.node_id, limits),
        check_address("address", cmd.address, limits),
        check_address("raft_address", cmd.raft_address, limits) if cmd.raft_address else None,
        *(
            check_address(f"worker_addresses[{index}]", address, limits)
            for index, address in enumerate(cmd.worker_addresses[: limits.max_data_workers])
        ),
    )
    if bad:
        return bad
    if len(cmd.worker_addresses) > limits.max_data_workers:
        return invalid(
            f"too many worker_addresses ({len(cmd.worker_addresses)}; expected at most "
            f"{limits.max_data_workers})"
        )
    removed = state.removed_nodes.get(cmd.node_id)
    if removed is not None and cmd.joined_incarnation_ms <= removed.removed_at_ms:
        return Rejection(
            E.IGNORED_OPERATION,
            f"node {show(cmd.node_id)} was removed from the cluster at revision "
            f"{removed.removed_revision} (got a registration from a process started at "
            f"{cmd.joined_incarnation_ms} ms; expected one started with --join after the "
            f"removal at {removed.removed_at_ms} ms)",
        )
    existing = state.nodes.get(cmd.node_id)
    if (
        existing is not None
        and existing.address == cmd.address
        and existing.raft_address == cmd.raft_address
        and list(existing.worker_addresses) == list(cmd.worker_addresses)
        and existing.state == pb.NODE_STATE_UP
    ):
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        node_registered=pb.NodeRegistered(
            node_id=cmd.node_id,
            address=cmd.address,
            raft_address=cmd.raft_address,
            worker_addresses=cmd.worker_addresses,
        )
    )
    return emitter.events


def _remove_node(state, cmd: pb.RemoveNode, ctx, limits) -> Outcome:
    """Forget a node that left: its registration and addresses go; its id is remembered
    so that its heartbeats do not register it again (only a rejoin does)."""
    bad = check_name("node_id", cmd.node_id, limits)
    if bad:
        return bad
    if cmd.node_id in state.removed_nodes:
        return []
    for name in sorted(state.pchannels):
        channel = state.pchannels[name]
        if channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        if (
            channel.owner_node_id == cmd.node_id
            or cmd.node_id in channel.replica_node_ids
            or cmd.node_id in channel.stable_replica_node_ids
        ):
            return Rejection(
                E.IGNORED_OPERATION,
                f"node {show(cmd.node_id)} still holds pchannel {show(name)} (as its owner or "
                "a replica; expected a node that holds nothing: freeze it and wait first)",
            )
    if len(state.removed_nodes) >= limits.max_removed_nodes:
        return Rejection(
            E.RESOURCE_EXHAUSTED,
            f"too many removed nodes ({len(state.removed_nodes)}; expected fewer than "
            f"{limits.max_removed_nodes})",
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(node_removed=pb.NodeRemoved(node_id=cmd.node_id, removed_at_ms=ctx.time_ms))
    return emitter.events


def _node_flag(
    field: str, target: Callable[[pb.Node], bool], event_field: str, event_type: type
) -> Callable[..., Outcome]:
    """Commands that set one property of a node: idempotent when it already holds."""

    def decide_flag(state, cmd, ctx, limits) -> Outcome:
        bad = _node_or_error(state, cmd.node_id, limits)
        if bad:
            return bad
        if target(state.nodes[cmd.node_id]):
            return []
        emitter = _Emitter(state, ctx)
        emitter.emit(**{event_field: event_type(node_id=cmd.node_id)})
        return emitter.events

    decide_flag.__name__ = f"_{field}"
    return decide_flag


# --------------------------------------------------------------------------------------
# PChannels
# --------------------------------------------------------------------------------------


#: The WAL implementations a pchannel may name (wal_segments.walimpls.registry; the node
#: validates an implementation's configuration before proposing, this bounds its size).
WAL_NAMES = ("segments", "local", "jetstream")
DEFAULT_WAL = "segments"
MAX_WAL_CONFIG_KEYS = 16
MAX_WAL_CONFIG_CHARS = 1024


def _wal_error(wal: str, config) -> Rejection | None:  # type: ignore[no-untyped-def]
    if wal and wal not in WAL_NAMES:
        return invalid(f"invalid wal ({show(wal)}; expected one of {', '.join(WAL_NAMES)})")
    if config and wal in ("", "segments", "local"):
        return invalid(
            f"invalid wal_config ({len(config)} key(s); expected none for {wal or DEFAULT_WAL})"
        )
    if len(config) > MAX_WAL_CONFIG_KEYS:
        return invalid(
            f"invalid wal_config ({len(config)} keys; expected at most {MAX_WAL_CONFIG_KEYS})"
        )
    for key in sorted(config):
        if not key or len(key) + len(config[key]) > MAX_WAL_CONFIG_CHARS:
            return invalid(
                f"invalid wal_config entry {show(key)} ({len(key) + len(config[key])} chars; "
                f"expected a key and at most {MAX_WAL_CONFIG_CHARS} chars in all)"
            )
    return None


def _create_pchannels(state, cmd: pb.CreatePChannels, ctx, limits) -> Outcome:
    bad = _owner_error(cmd.owner, limits)
    if bad:
        return bad
    replica_count = cmd.replica_count or limits.default_replica_count
    bad = check_range("replica_count", replica_count, 1, limits.max_replicas)
    if bad:
        return bad
    if cmd.replica_count and state.nodes and cmd.replica_count > len(state.nodes):
        # Kafka refuses a replication factor above the broker count: a replica set is fixed
        # at placement, so a smaller one than asked for would be a silent downgrade.
        return invalid(
            f"invalid replica_count ({cmd.replica_count}; the cluster has {len(state.nodes)} "
            f"node(s): expected 1..{min(len(state.nodes), limits.max_replicas)})"
        )
    bad = _wal_error(cmd.wal, cmd.wal_config)
    if bad:
        return bad
    names = list(cmd.names)
    if names:
        if cmd.count or cmd.prefix:
            return invalid(
                f"give either names ({len(names)} given) or prefix+count "
                f"(got prefix {show(cmd.prefix)}, count {cmd.count}), not both"
            )
        bad = check_range("number of names", len(names), 1, limits.max_pchannels_per_request)
        if bad:
            return bad
        for name in names:
            bad = check_name("pchannel name", name, limits)
            if bad:
                return bad
        bad = check_unique("pchannel name", names)
        if bad:
            return bad
        for name in names:
            if name in state.pchannels:
                return Rejection(E.ALREADY_EXISTS, f"pchannel {show(name)} already exists")
    else:
        bad = first_error(
            check_name("prefix", cmd.prefix, limits),
            check_range("count", cmd.count, 1, limits.max_pchannels_per_request),
        )
        if bad:
            return bad
        # Room for the "_<k>" suffix.
        suffix_chars = len(str(len(state.pchannels) + cmd.count)) + 1
        if len(cmd.prefix) + suffix_chars > limits.name_max_chars:
            return invalid(
                f"prefix too long ({len(cmd.prefix)} chars; expected at most "
                f"{limits.name_max_chars - suffix_chars} to leave room for _<k>)"
            )
        # The smallest unused k: at most count + len(pchannels) candidates are needed.
        for k in range(cmd.count + len(state.pchannels)):
            candidate = f"{cmd.prefix}_{k}"
            if candidate not in state.pchannels:
                names.append(candidate)
                if len(names) == cmd.count:
                    break
    emitter = _Emitter(state, ctx)
    for name in names:
        emitter.emit(
            pchannel_created=pb.PChannelCreated(
                name=name,
                owner=cmd.owner,
                replica_count=replica_count,
                wal="" if cmd.wal == DEFAULT_WAL else cmd.wal,
                wal_config=cmd.wal_config,
            )
        )
    return emitter.events


def _assign_pchannel(state, cmd: pb.AssignPChannel, ctx, limits) -> Outcome:
    bad = first_error(
        check_name("pchannel", cmd.pchannel, limits),
        check_enum("access_mode", cmd.access_mode, ACCESS_MODES),
    )
    if bad:
        return bad
    channel = _live_pchannel(state, cmd.pchannel)
    if isinstance(channel, Rejection):
        return channel
    if cmd.term != channel.term + 1:
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"assign {cmd.pchannel} at term {cmd.term}; expected term {channel.term + 1} "
            f"(current term {channel.term} + 1)",
            current_term=channel.term,
        )
    bad = _node_or_error(state, cmd.node_id, limits)
    if bad:
        return bad
    if state.nodes[cmd.node_id].state != pb.NODE_STATE_UP:
        return invalid(f"node {cmd.node_id} is DOWN; expected an UP node as owner")
    replicas = list(cmd.replica_node_ids)
    if cmd.node_id not in replicas:
        replicas.insert(0, cmd.node_id)
    bad = check_range("replica set size", len(replicas), 1, limits.max_replicas)
    if bad:
        return bad
    bad = check_unique("replica node id", replicas)
    if bad:
        return bad
    for node_id in replicas:
        bad = _node_or_error(state, node_id, limits)
        if bad:
            return bad
    stable = list(channel.stable_replica_node_ids)
    if (
        stable
        and set(replicas) != set(channel.replica_node_ids)
        and set(channel.replica_node_ids) != set(stable)
    ):
        # One replica set change at a time: a new owner's recovery consults the last ready
        # set and the current one, never an older one.
        return Rejection(
            E.INVALID_ARGUMENT,
            f"replica set of {cmd.pchannel} changes from {','.join(channel.replica_node_ids)} "
            f"to {','.join(replicas)} while the change from {','.join(stable)} is not ready; "
            f"expected the same set until a term with it is ready",
            current_term=channel.term,
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        pchannel_assigned=pb.PChannelAssigned(
            pchannel=cmd.pchannel,
            term=cmd.term,
            node_id=cmd.node_id,
            replica_node_ids=replicas,
            access_mode=cmd.access_mode or pb.ACCESS_MODE_READWRITE,
        )
    )
    return emitter.events


def ready_floor(state: pb.CoordinationState, pchannel: str) -> int:
    """The last LSN that earlier terms of `pchannel` are known to have written and
    committed: the highest committed segment's end, and each earlier term's start and end
    (a ready term's start entry is committed; entries up to a term's end were in the log
    the next ready term adopted). A new term's log must hold it, and its start entry comes
    after it (`PChannelReady`)."""
    floor = 0
    manifest = state.manifests.get(pchannel)
    if manifest is not None:
        floor = manifest.committed_through_lsn
    channel = state.pchannels.get(pchannel)
    if channel is not None:
        for entry in channel.history[:-1]:
            floor = max(floor, entry.start_lsn, entry.end_lsn)
    return floor


def _pchannel_ready(state, cmd: pb.PChannelReady, ctx, limits) -> Outcome:
    bad = first_error(
        check_name("pchannel", cmd.pchannel, limits),
        check_name("node_id", cmd.node_id, limits),
    )
    if bad:
        return bad
    if cmd.start_lsn < 1:
        return invalid(f"invalid start_lsn ({cmd.start_lsn}; expected >= 1)")
    channel = _live_pchannel(state, cmd.pchannel)
    if isinstance(channel, Rejection):
        return channel
    if cmd.term != channel.term or cmd.node_id != channel.owner_node_id:
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"ready {cmd.pchannel} at term {cmd.term} by {show(cmd.node_id)}; the pchannel is "
            f"at term {channel.term} owned by {show(channel.owner_node_id)}",
            current_term=channel.term,
        )
    if channel.state == pb.PCHANNEL_STATE_ASSIGNED:
        if channel.history and channel.history[-1].start_lsn == cmd.start_lsn:
            return []
        return invalid(
            f"pchannel {cmd.pchannel} is already ready at term {cmd.term} with start_lsn "
            f"{channel.history[-1].start_lsn if channel.history else 0} (got {cmd.start_lsn})"
        )
    if channel.state != pb.PCHANNEL_STATE_ASSIGNING:
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"pchannel {cmd.pchannel} is {pb.PChannelState.Name(channel.state)} at term "
            f"{channel.term}; expected ASSIGNING",
            current_term=channel.term,
        )
    # A new term's log starts after everything earlier terms wrote: after the previous
    # ready term's start and after every committed segment.
    floor = ready_floor(state, cmd.pchannel)
    if cmd.start_lsn <= floor:
        return invalid(
            f"invalid start_lsn for {cmd.pchannel} at term {cmd.term} ({cmd.start_lsn}; "
            f"expected > {floor}, after what earlier terms wrote and committed)"
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        pchannel_became_ready=pb.PChannelBecameReady(
            pchannel=cmd.pchannel, term=cmd.term, node_id=cmd.node_id, start_lsn=cmd.start_lsn
        )
    )
    if state.HasField("wal_alter"):
        entry = state.wal_alter.pchannels.get(cmd.pchannel)
        if (
            entry is not None
            and entry.stage == pb.WAL_ALTER_STAGE_ADVANCE_CHECKPOINT
            and cmd.term >= entry.term
        ):
            # Writes resumed on the new implementation: this pchannel is done.
            _alter_channel_done(state, emitter, cmd.pchannel)
    return emitter.events


def _mark_pchannel_unavailable(state, cmd: pb.MarkPChannelUnavailable, ctx, limits) -> Outcome:
    bad = check_name("pchannel", cmd.pchannel, limits)
    if bad:
        return bad
    channel = _live_pchannel(state, cmd.pchannel)
    if isinstance(channel, Rejection):
        return channel
    if cmd.term != channel.term:
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"mark {cmd.pchannel} unavailable at term {cmd.term}; current term is {channel.term}",
            current_term=channel.term,
        )
    if channel.state == pb.PCHANNEL_STATE_UNAVAILABLE:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        pchannel_marked_unavailable=pb.PChannelMarkedUnavailable(
            pchannel=cmd.pchannel, term=cmd.term
        )
    )
    return emitter.events


def _drop_pchannel(state, cmd: pb.DropPChannel, ctx, limits) -> Outcome:
    bad = check_name("pchannel", cmd.pchannel, limits)
    if bad:
        return bad
    if cmd.pchannel not in state.pchannels:
        return _pchannel_missing(cmd.pchannel)
    if state.pchannels[cmd.pchannel].state == pb.PCHANNEL_STATE_DROPPED:
        return []
    live = sorted(
        name
        for name, vchannel in state.vchannels.items()
        if vchannel.pchannel == cmd.pchannel and vchannel.state == pb.VCHANNEL_STATE_NORMAL
    )
    if live:
        return invalid(
            f"pchannel {cmd.pchannel} has {len(live)} live vchannels "
            f"({', '.join(live[:5])}{', ...' if len(live) > 5 else ''}); expected none: drop them first"
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(pchannel_dropped=pb.PChannelDropped(pchannel=cmd.pchannel))
    if state.HasField("wal_alter"):
        entry = state.wal_alter.pchannels.get(cmd.pchannel)
        if entry is not None and entry.stage != pb.WAL_ALTER_STAGE_DONE:
            _alter_channel_done(state, emitter, cmd.pchannel)
    return emitter.events


# --------------------------------------------------------------------------------------
# VChannels
# --------------------------------------------------------------------------------------


def _create_vchannel(state, cmd: pb.CreateVChannel, ctx, limits) -> Outcome:
    bad = first_error(
        check_name("vchannel name", cmd.name, limits),
        check_name("pchannel", cmd.pchannel, limits),
        _owner_error(cmd.owner, limits),
    )
    if bad:
        return bad
    if cmd.name in state.vchannels:
        return Rejection(E.ALREADY_EXISTS, f"vchannel {show(cmd.name)} already exists")
    channel = _live_pchannel(state, cmd.pchannel)
    if isinstance(channel, Rejection):
        return channel
    emitter = _Emitter(state, ctx)
    emitter.emit(
        vchannel_created=pb.VChannelCreated(
            name=cmd.name, id=state.next_vchannel_id, pchannel=cmd.pchannel, owner=cmd.owner
        )
    )
    return emitter.events


def _drop_vchannel(state, cmd: pb.DropVChannel, ctx, limits) -> Outcome:
    bad = check_name("vchannel name", cmd.name, limits)
    if bad:
        return bad
    if cmd.name not in state.vchannels:
        return Rejection(E.CHANNEL_NOT_EXIST, f"vchannel {show(cmd.name)} does not exist")
    if state.vchannels[cmd.name].state == pb.VCHANNEL_STATE_DROPPED:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(vchannel_dropped=pb.VChannelDropped(name=cmd.name))
    return emitter.events


# --------------------------------------------------------------------------------------
# Segment manifest
# --------------------------------------------------------------------------------------


def _commit_segment(state, cmd: pb.CommitSegment, ctx, limits) -> Outcome:
    bad = check_name("pchannel", cmd.pchannel, limits)
    if bad:
        return bad
    channel = _live_pchannel(state, cmd.pchannel)
    if isinstance(channel, Rejection):
        return channel
    if cmd.term != channel.term:
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"commit segment of {cmd.pchannel} at term {cmd.term}; current term is {channel.term}",
            current_term=channel.term,
        )
    if cmd.first_lsn < 1 or cmd.last_lsn < cmd.first_lsn:
        return invalid(
            f"invalid LSN range [{cmd.first_lsn}, {cmd.last_lsn}]; expected 1 <= first <= last"
        )
    expected_count = cmd.last_lsn - cmd.first_lsn + 1
    if cmd.count != expected_count:
        return invalid(
            f"invalid count ({cmd.count}; expected {expected_count} for LSNs "
            f"[{cmd.first_lsn}, {cmd.last_lsn}])"
        )
    if not (1 <= cmd.first_term <= cmd.last_term <= cmd.term):
        return invalid(
            f"invalid term range [{cmd.first_term}, {cmd.last_term}]; expected "
            f"1 <= first_term <= last_term <= {cmd.term}"
        )
    if cmd.first_time_tick < 0 or cmd.last_time_tick < cmd.first_time_tick:
        return invalid(
            f"invalid time tick range [{cmd.first_time_tick}, {cmd.last_time_tick}]; "
            "expected 0 <= first <= last"
        )
    if cmd.bytes < 0:
        return invalid(f"invalid bytes ({cmd.bytes}; expected >= 0)")
    replicas = list(cmd.replica_node_ids)
    bad = first_error(
        check_range("replica count", len(replicas), 1, limits.max_replicas),
        check_unique("replica node id", replicas),
    )
    if bad:
        return bad
    for node_id in replicas:
        bad = _node_or_error(state, node_id, limits)
        if bad:
            return bad
    manifest = state.manifests.get(cmd.pchannel)
    through = manifest.committed_through_lsn if manifest is not None else 0
    if manifest is not None and cmd.first_lsn <= through:
        # An exact repeat (an owner retrying after an unknown outcome) is accepted quietly.
        # Segments are sorted and contiguous: find the one starting at first_lsn by bisection.
        segments = manifest.segments
        low, high = 0, len(segments)
        while low < high:
            middle = (low + high) // 2
            if segments[middle].first_lsn < cmd.first_lsn:
                low = middle + 1
            else:
                high = middle
        if low < len(segments):
            segment = segments[low]
            if (
                segment.first_lsn == cmd.first_lsn
                and segment.last_lsn == cmd.last_lsn
                and segment.digest == cmd.digest
            ):
                return []
    if cmd.first_lsn <= through:
        return invalid(
            f"segment [{cmd.first_lsn}, {cmd.last_lsn}] of {cmd.pchannel} overlaps the committed "
            f"range ending at {through}; expected first_lsn {through + 1}"
        )
    if cmd.first_lsn != through + 1:
        return invalid(
            f"segment [{cmd.first_lsn}, {cmd.last_lsn}] of {cmd.pchannel} leaves a gap after "
            f"{through}; expected first_lsn {through + 1}"
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        segment_committed=pb.SegmentCommitted(
            segment=pb.Segment(
                pchannel=cmd.pchannel,
                segment_id=cmd.first_lsn,
                first_lsn=cmd.first_lsn,
                last_lsn=cmd.last_lsn,
                first_term=cmd.first_term,
                last_term=cmd.last_term,
                first_time_tick=cmd.first_time_tick,
                last_time_tick=cmd.last_time_tick,
                count=cmd.count,
                bytes=cmd.bytes,
                digest=cmd.digest,
                replica_node_ids=replicas,
                committed_revision=emitter.next_revision,
                commit_term=cmd.term,
            )
        )
    )
    return emitter.events


def retention_bound(state: pb.CoordinationState, pchannel: str, before_lsn: int) -> int:
    """`before_lsn` lowered to what `pchannel`'s readers still need: segments ending below
    the result may be deleted."""
    manifest = state.manifests.get(pchannel) or pb.SegmentManifest()
    # Never delete what a consumer group on one of this pchannel's vchannels still needs.
    bound = before_lsn
    for group_name in sorted(state.consumer_groups):
        group = state.consumer_groups[group_name]
        for vchannel_name in sorted(group.positions):
            vchannel = state.vchannels.get(vchannel_name)
            if vchannel is None or vchannel.pchannel != pchannel:
                continue
            if vchannel.state != pb.VCHANNEL_STATE_NORMAL:
                continue
            bound = min(bound, group.positions[vchannel_name].lsn + 1)
    # Nor what a subscription that holds retention has not consumed yet (from its start
    # while it has no committed position on a vchannel).
    for name in sorted(state.subscriptions):
        subscription = state.subscriptions[name]
        if not subscription.holds_retention:
            continue
        for vchannel_name in sorted(subscription.vchannels):
            vchannel = state.vchannels.get(vchannel_name)
            if vchannel is None or vchannel.pchannel != pchannel:
                continue
            if vchannel.state != pb.VCHANNEL_STATE_NORMAL:
                continue
            bound = min(bound, _subscription_hold(subscription, vchannel_name, manifest))
    # Nor a broadcast appended here that its consumers have not acknowledged yet.
    bound = min(bound, _unacked_broadcast_floor(state, pchannel))
    # Nor what a replication target has not applied.
    bound = min(bound, replication_hold(state, pchannel))
    return bound


def _delete_segments_before(state, cmd: pb.DeleteSegmentsBefore, ctx, limits) -> Outcome:
    bad = check_name("pchannel", cmd.pchannel, limits)
    if bad:
        return bad
    if cmd.before_lsn < 1:
        return invalid(f"invalid before_lsn ({cmd.before_lsn}; expected >= 1)")
    if cmd.pchannel not in state.pchannels:
        return _pchannel_missing(cmd.pchannel)
    manifest = state.manifests.get(cmd.pchannel)
    if manifest is None or not manifest.segments:
        return []
    bound = retention_bound(state, cmd.pchannel, cmd.before_lsn)
    deleted = [s for s in manifest.segments if s.last_lsn < bound]
    if not deleted:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        segments_deleted=pb.SegmentsDeleted(
            pchannel=cmd.pchannel,
            segment_ids=[s.segment_id for s in deleted],
            deleted_before_lsn=deleted[-1].last_lsn + 1,
        )
    )
    return emitter.events


def _first_lsn_at_tick(manifest: pb.SegmentManifest, time_tick: int) -> int:
    """The first LSN of the first committed segment holding entries at or after
    `time_tick` (past every committed segment when none does)."""
    for segment in manifest.segments:
        if segment.last_time_tick >= time_tick:
            return segment.first_lsn
    return manifest.committed_through_lsn + 1


def _subscription_hold(
    subscription: pb.Subscription, vchannel: str, manifest: pb.SegmentManifest
) -> int:
    """The lowest LSN `subscription` still needs on `vchannel`'s pchannel."""
    if vchannel in subscription.positions:
        position = subscription.positions[vchannel]
        if position.lsn > 0:
            return position.lsn + 1
        if position.from_time_tick > 0:
            return _first_lsn_at_tick(manifest, position.from_time_tick)
        return 1  # seeked to the beginning
    if subscription.start == pb.SUBSCRIPTION_START_LSN:
        return subscription.start_lsn
    if subscription.start == pb.SUBSCRIPTION_START_TIME_TICK:
        return _first_lsn_at_tick(manifest, subscription.start_time_tick)
    if subscription.start == pb.SUBSCRIPTION_START_LATEST:
        return 1 << 62  # starts after whatever is there when it first consumes
    return 1  # EARLIEST: everything is still to be consumed


def _unacked_broadcast_floor(state: pb.CoordinationState, pchannel: str) -> int:
    """The lowest LSN on `pchannel` holding a broadcast that was appended but not yet
    acknowledged (retention must keep it), else a value above every LSN."""
    floor = 1 << 62
    for task_id in sorted(state.broadcasts):
        task = state.broadcasts[task_id]
        if task.state != pb.BROADCAST_STATE_PENDING:
            continue
        for target in task.vchannels:
            if not target.appended or target.acked:
                continue
            vchannel = state.vchannels.get(target.vchannel)
            if vchannel is not None and vchannel.pchannel == pchannel:
                floor = min(floor, target.appended_lsn)
    return floor


def retention_floor(state: pb.CoordinationState, pchannel: str) -> int:
    """The first LSN of `pchannel` still retained (1 when nothing was ever deleted)."""
    manifest = state.manifests.get(pchannel)
    return max(1, manifest.deleted_before_lsn) if manifest is not None else 1


# --------------------------------------------------------------------------------------
# Broadcasts
# --------------------------------------------------------------------------------------


def _same_broadcast(task: pb.BroadcastTask, cmd: pb.CreateBroadcast) -> bool:
    return (
        task.message == cmd.message
        and task.msg_type == cmd.msg_type
        and [v.vchannel for v in task.vchannels] == list(cmd.vchannels)
        and [(k.key, k.mode) for k in task.resource_keys]
        == [(k.key, k.mode) for k in cmd.resource_keys]
    )


def _create_broadcast(state, cmd: pb.CreateBroadcast, ctx, limits) -> Outcome:
    if len(cmd.message) > limits.broadcast_message_max_bytes:
        return invalid(
            f"broadcast message too large ({len(cmd.message)} bytes; expected at most "
            f"{limits.broadcast_message_max_bytes})"
        )
    if cmd.msg_type:
        bad = check_name("msg_type", cmd.msg_type, limits)
        if bad:
            return bad
    vchannels = list(cmd.vchannels)
    bad = first_error(
        check_range("number of vchannels", len(vchannels), 1, limits.max_broadcast_vchannels),
        check_range("number of resource keys", len(cmd.resource_keys), 0, limits.max_resource_keys),
    )
    if bad:
        return bad
    for name in vchannels:
        bad = check_name("vchannel", name, limits)
        if bad:
            return bad
    bad = check_unique("vchannel", vchannels)
    if bad:
        return bad
    for resource in cmd.resource_keys:
        bad = first_error(
            check_key("resource key", resource.key, limits),
            check_enum("resource key mode", resource.mode, LOCK_MODES),
        )
        if bad:
            return bad
    bad = check_unique("resource key", [k.key for k in cmd.resource_keys])
    if bad:
        return bad
    if cmd.idempotency_key:
        bad = check_key("idempotency_key", cmd.idempotency_key, limits)
        if bad:
            return bad
        existing_id = state.broadcast_idempotency.get(cmd.idempotency_key)
        if existing_id is not None:
            if _same_broadcast(state.broadcasts[existing_id], cmd):
                return []
            return Rejection(
                E.ALREADY_EXISTS,
                f"idempotency key {show(cmd.idempotency_key)} belongs to broadcast "
                f"{existing_id} with a different message, vchannels or keys",
            )
    for name in vchannels:
        vchannel = state.vchannels.get(name)
        if vchannel is None or vchannel.state != pb.VCHANNEL_STATE_NORMAL:
            return Rejection(E.CHANNEL_NOT_EXIST, f"vchannel {show(name)} does not exist")
        # A replication target takes only its source's entries, and a source pauses its
        # client writes during a switchover (statemachine/replicate.py).
        refusal = write_refusal(
            state.replicate_configuration,
            state.replicate_cluster_id,
            vchannel.pchannel,
            f"a broadcast to {name}",
        )
        if refusal:
            return Rejection(E.IGNORED_OPERATION, refusal)
    emitter = _Emitter(state, ctx)
    broadcast_id = emitter.next_revision
    for resource in cmd.resource_keys:
        bad = _conflict(state, resource.key, resource.mode, pb.HOLDER_KIND_BROADCAST, broadcast_id)
        if bad:
            return bad
    emitter.emit(
        broadcast_created=pb.BroadcastCreated(
            task=pb.BroadcastTask(
                id=broadcast_id,
                message=cmd.message,
                msg_type=cmd.msg_type,
                resource_keys=cmd.resource_keys,
                state=pb.BROADCAST_STATE_PENDING,
                vchannels=[pb.BroadcastVChannel(vchannel=name) for name in vchannels],
                idempotency_key=cmd.idempotency_key,
                created_revision=broadcast_id,
            )
        )
    )
    for resource in sorted(cmd.resource_keys, key=lambda k: k.key):
        emitter.emit(
            lock_acquired=pb.LockAcquired(
                key=resource.key,
                mode=resource.mode,
                holder_kind=pb.HOLDER_KIND_BROADCAST,
                holder_id=broadcast_id,
                fencing_token=emitter.next_revision,
            )
        )
    return emitter.events


def _broadcast_target(
    state: pb.CoordinationState, broadcast_id: int, vchannel: str, limits: Limits
) -> tuple[pb.BroadcastTask, pb.BroadcastVChannel] | Rejection:
    bad = check_name("vchannel", vchannel, limits)
    if bad:
        return bad
    if broadcast_id not in state.broadcasts:
        return Rejection(E.NOT_FOUND, f"broadcast {broadcast_id} does not exist")
    task = state.broadcasts[broadcast_id]
    for target in task.vchannels:
        if target.vchannel == vchannel:
            return task, target
    return invalid(
        f"vchannel {show(vchannel)} is not a target of broadcast {broadcast_id} "
        f"(targets: {', '.join(v.vchannel for v in task.vchannels[:5])})"
    )


def _record_broadcast_appended(state, cmd: pb.RecordBroadcastAppended, ctx, limits) -> Outcome:
    found = _broadcast_target(state, cmd.broadcast_id, cmd.vchannel, limits)
    if isinstance(found, Rejection):
        return found
    _, target = found
    if cmd.lsn < 1 or cmd.time_tick < 0:
        return invalid(
            f"invalid position (lsn {cmd.lsn}, time tick {cmd.time_tick}; "
            "expected lsn >= 1 and time tick >= 0)"
        )
    if target.appended:
        if target.appended_lsn == cmd.lsn and target.appended_time_tick == cmd.time_tick:
            return []
        return Rejection(
            E.IGNORED_OPERATION,
            f"broadcast {cmd.broadcast_id} was already appended to {cmd.vchannel} at lsn "
            f"{target.appended_lsn} (got lsn {cmd.lsn})",
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        broadcast_appended=pb.BroadcastAppended(
            broadcast_id=cmd.broadcast_id,
            vchannel=cmd.vchannel,
            lsn=cmd.lsn,
            time_tick=cmd.time_tick,
        )
    )
    return emitter.events


def _ack_broadcast(state, cmd: pb.AckBroadcast, ctx, limits) -> Outcome:
    found = _broadcast_target(state, cmd.broadcast_id, cmd.vchannel, limits)
    if isinstance(found, Rejection):
        return found
    task, target = found
    if cmd.checkpoint < 0:
        return invalid(f"invalid checkpoint ({cmd.checkpoint}; expected >= 0)")
    if target.acked:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        broadcast_acked=pb.BroadcastAcked(
            broadcast_id=cmd.broadcast_id, vchannel=cmd.vchannel, checkpoint=cmd.checkpoint
        )
    )
    if all(v.acked or v.vchannel == cmd.vchannel for v in task.vchannels):
        for resource in sorted(task.resource_keys, key=lambda k: k.key):
            emitter.emit(
                lock_released=pb.LockReleased(
                    key=resource.key,
                    holder_kind=pb.HOLDER_KIND_BROADCAST,
                    holder_id=task.id,
                )
            )
        emitter.emit(
            broadcast_tombstoned=pb.BroadcastTombstoned(
                broadcast_id=task.id, tombstoned_at_ms=ctx.time_ms
            )
        )
    return emitter.events


def _clear_broadcasts(state, cmd: pb.ClearBroadcasts, ctx, limits) -> Outcome:
    bad = check_range("retention_ms", cmd.retention_ms, 0, limits.broadcast_retention_max_ms)
    if bad:
        return bad
    emitter = _Emitter(state, ctx)
    for broadcast_id in sorted(state.broadcasts):
        if len(emitter.events) >= limits.max_events_per_sweep:
            break
        task = state.broadcasts[broadcast_id]
        if task.state != pb.BROADCAST_STATE_TOMBSTONE:
            continue
        if task.tombstoned_at_ms + cmd.retention_ms <= ctx.time_ms:
            emitter.emit(broadcast_cleared=pb.BroadcastCleared(broadcast_id=broadcast_id))
    return emitter.events


# --------------------------------------------------------------------------------------
# Leases and locks
# --------------------------------------------------------------------------------------


def _grant_lease(state, cmd: pb.GrantLease, ctx, limits) -> Outcome:
    bad = first_error(
        check_range("ttl_ms", cmd.ttl_ms, limits.lease_ttl_min_ms, limits.lease_ttl_max_ms),
        check_text("holder", cmd.holder, limits),
        check_text("owner", cmd.owner, limits),
    )
    if bad:
        return bad
    # The caller's own budget first: a caller over it is told so even when the cluster is
    # full too.
    if cmd.owner:
        usage = state.owner_usage.get(cmd.owner)
        held = usage.leases if usage is not None else 0
        if held >= limits.max_leases_per_owner:
            return Rejection(
                E.RESOURCE_EXHAUSTED,
                f"too many live leases for this caller's identity ({held}; expected fewer "
                f"than {limits.max_leases_per_owner}, the per-identity lease budget "
                "max_leases_per_owner: revoke leases it no longer needs)",
            )
    if len(state.leases) >= limits.max_leases:
        return Rejection(
            E.RESOURCE_EXHAUSTED,
            f"too many live leases in the cluster ({len(state.leases)}; expected fewer than "
            f"{limits.max_leases}, the cluster's lease budget max_leases)",
        )
    emitter = _Emitter(state, ctx)
    lease_id = emitter.next_revision
    emitter.emit(
        lease_granted=pb.LeaseGranted(
            lease=pb.Lease(
                id=lease_id,
                ttl_ms=cmd.ttl_ms,
                holder=cmd.holder,
                granted_revision=lease_id,
                deadline_ms=ctx.time_ms + cmd.ttl_ms,
                owner=cmd.owner,
            )
        )
    )
    return emitter.events


def _keep_alive_lease(state, cmd: pb.KeepAliveLease, ctx, limits) -> Outcome:
    lease = _live_lease(state, cmd.lease_id, ctx)
    if isinstance(lease, Rejection):
        return lease
    deadline = ctx.time_ms + lease.ttl_ms
    if deadline <= lease.deadline_ms:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(lease_renewed=pb.LeaseRenewed(lease_id=lease.id, deadline_ms=deadline))
    return emitter.events


def _revoke_lease(state, cmd: pb.RevokeLease, ctx, limits) -> Outcome:
    if cmd.lease_id <= 0:
        return invalid(f"invalid lease_id ({cmd.lease_id}; expected a granted lease id >= 1)")
    if cmd.lease_id not in state.leases:
        return Rejection(E.NOT_FOUND, f"lease {cmd.lease_id} does not exist (revoked or expired)")
    lease = state.leases[cmd.lease_id]
    emitter = _Emitter(state, ctx)
    _release_lease_locks(emitter, lease)
    emitter.emit(lease_revoked=pb.LeaseRevoked(lease_id=lease.id))
    return emitter.events


def _expire_leases(state, cmd: pb.ExpireLeases, ctx, limits) -> Outcome:
    emitter = _Emitter(state, ctx)
    expired = 0
    for lease_id in sorted(state.leases):
        if expired >= limits.max_events_per_sweep:
            break
        lease = state.leases[lease_id]
        if lease.deadline_ms <= ctx.time_ms:
            _release_lease_locks(emitter, lease)
            emitter.emit(lease_expired=pb.LeaseExpired(lease_id=lease_id))
            expired += 1
    return emitter.events


def _extend_leases(state, cmd: pb.ExtendLeases, ctx, limits) -> Outcome:
    emitter = _Emitter(state, ctx)
    for lease_id in sorted(state.leases):
        lease = state.leases[lease_id]
        deadline = ctx.time_ms + lease.ttl_ms
        if deadline > lease.deadline_ms:
            emitter.emit(lease_renewed=pb.LeaseRenewed(lease_id=lease_id, deadline_ms=deadline))
    return emitter.events


def _lock(state, cmd: pb.Lock, ctx, limits) -> Outcome:
    bad = first_error(
        check_key("key", cmd.key, limits),
        check_enum("mode", cmd.mode, LOCK_MODES),
    )
    if bad:
        return bad
    lease = _live_lease(state, cmd.lease_id, ctx)
    if isinstance(lease, Rejection):
        return lease
    if cmd.key in lease.locked_keys:
        held = state.locks[cmd.key]
        if held.mode == cmd.mode:
            return []
        return invalid(
            f"lease {lease.id} already holds {show(cmd.key)} {LOCK_MODES[held.mode]} "
            f"(requested {LOCK_MODES[cmd.mode]}); expected an unlock first"
        )
    if len(lease.locked_keys) >= limits.max_keys_per_lease:
        return invalid(
            f"lease {lease.id} holds too many keys ({len(lease.locked_keys)}; expected at most "
            f"{limits.max_keys_per_lease})"
        )
    if lease.owner:
        usage = state.owner_usage.get(lease.owner)
        held = usage.locks if usage is not None else 0
        if held >= limits.max_lease_locks_per_owner:
            return Rejection(
                E.RESOURCE_EXHAUSTED,
                f"too many keys held by the leases of lease {lease.id}'s identity ({held}; "
                f"expected fewer than {limits.max_lease_locks_per_owner}, the per-identity "
                "lock budget max_lease_locks_per_owner: unlock keys it no longer needs)",
            )
    bad = _conflict(state, cmd.key, cmd.mode, pb.HOLDER_KIND_LEASE, lease.id)
    if bad:
        return bad
    emitter = _Emitter(state, ctx)
    emitter.emit(
        lock_acquired=pb.LockAcquired(
            key=cmd.key,
            mode=cmd.mode,
            holder_kind=pb.HOLDER_KIND_LEASE,
            holder_id=lease.id,
            fencing_token=emitter.next_revision,
        )
    )
    return emitter.events


def _unlock(state, cmd: pb.Unlock, ctx, limits) -> Outcome:
    bad = check_key("key", cmd.key, limits)
    if bad:
        return bad
    if cmd.lease_id not in state.leases:
        return Rejection(E.NOT_FOUND, f"lease {cmd.lease_id} does not exist (revoked or expired)")
    lease = state.leases[cmd.lease_id]
    if cmd.key not in lease.locked_keys:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        lock_released=pb.LockReleased(
            key=cmd.key, holder_kind=pb.HOLDER_KIND_LEASE, holder_id=lease.id
        )
    )
    return emitter.events


# --------------------------------------------------------------------------------------
# Consumer positions and balance policy
# --------------------------------------------------------------------------------------


def _consumer_target(state, group: str, vchannel: str, limits) -> Rejection | None:
    bad = first_error(
        check_name("group", group, limits),
        check_name("vchannel", vchannel, limits),
    )
    if bad:
        return bad
    if vchannel not in state.vchannels:
        return Rejection(E.CHANNEL_NOT_EXIST, f"vchannel {show(vchannel)} does not exist")
    return None


def _stored_fence(state: pb.CoordinationState, group: str, vchannel: str) -> int:
    stored = state.consumer_groups.get(group)
    if stored is None or vchannel not in stored.positions:
        return 0
    return stored.positions[vchannel].fence


def _commit_consumer_position(state, cmd: pb.CommitConsumerPosition, ctx, limits) -> Outcome:
    bad = _consumer_target(state, cmd.group, cmd.vchannel, limits)
    if bad:
        return bad
    if cmd.lsn < 0 or cmd.fence < 0:
        return invalid(f"invalid position (lsn {cmd.lsn}, fence {cmd.fence}; expected >= 0)")
    fence = _stored_fence(state, cmd.group, cmd.vchannel)
    if cmd.fence < fence:
        return Rejection(
            E.CHANNEL_FENCED,
            f"consumer {cmd.group}/{cmd.vchannel} fence {cmd.fence} was superseded by {fence}",
            current_term=fence,
        )
    if cmd.fence > fence:
        return invalid(
            f"consumer {cmd.group}/{cmd.vchannel} fence {cmd.fence} was never issued; "
            f"expected {fence}"
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        consumer_position_committed=pb.ConsumerPositionCommitted(
            group=cmd.group, vchannel=cmd.vchannel, lsn=cmd.lsn, fence=cmd.fence
        )
    )
    return emitter.events


def _bump_consumer_fence(state, cmd: pb.BumpConsumerFence, ctx, limits) -> Outcome:
    bad = _consumer_target(state, cmd.group, cmd.vchannel, limits)
    if bad:
        return bad
    emitter = _Emitter(state, ctx)
    emitter.emit(
        consumer_fence_bumped=pb.ConsumerFenceBumped(
            group=cmd.group,
            vchannel=cmd.vchannel,
            fence=_stored_fence(state, cmd.group, cmd.vchannel) + 1,
        )
    )
    return emitter.events


SUBSCRIPTION_STARTS: dict[int, str] = {
    pb.SUBSCRIPTION_START_EARLIEST: "EARLIEST",
    pb.SUBSCRIPTION_START_LATEST: "LATEST",
    pb.SUBSCRIPTION_START_LSN: "LSN",
    pb.SUBSCRIPTION_START_TIME_TICK: "TIME_TICK",
}


def _subscription(state, name: str, limits) -> pb.Subscription | Rejection:
    bad = check_name("subscription", name, limits)
    if bad:
        return bad
    subscription = state.subscriptions.get(name)
    if subscription is None:
        return Rejection(E.NOT_FOUND, f"subscription {show(name)} does not exist")
    return subscription


def _create_subscription(state, cmd: pb.CreateSubscription, ctx, limits) -> Outcome:
    start = cmd.start or pb.SUBSCRIPTION_START_EARLIEST
    bad = first_error(
        check_name("subscription", cmd.name, limits),
        check_range(
            "number of vchannels", len(cmd.vchannels), 1, limits.max_subscription_vchannels
        ),
        check_enum("start", start, SUBSCRIPTION_STARTS),
        check_unique("vchannel", list(cmd.vchannels)),
    )
    if bad:
        return bad
    for vchannel in cmd.vchannels:
        bad = check_name("vchannel", vchannel, limits)
        if bad:
            return bad
        channel = state.vchannels.get(vchannel)
        if channel is None or channel.state != pb.VCHANNEL_STATE_NORMAL:
            return Rejection(E.CHANNEL_NOT_EXIST, f"vchannel {show(vchannel)} does not exist")
    if start == pb.SUBSCRIPTION_START_LSN and cmd.start_lsn < 1:
        return invalid(f"invalid start_lsn ({cmd.start_lsn}; expected >= 1 with start LSN)")
    if start == pb.SUBSCRIPTION_START_TIME_TICK and cmd.start_time_tick < 1:
        return invalid(
            f"invalid start_time_tick ({cmd.start_time_tick}; expected >= 1 with start TIME_TICK)"
        )
    if start != pb.SUBSCRIPTION_START_LSN and cmd.start_lsn:
        return invalid(f"start_lsn {cmd.start_lsn} given with start {SUBSCRIPTION_STARTS[start]}")
    if start != pb.SUBSCRIPTION_START_TIME_TICK and cmd.start_time_tick:
        return invalid(
            f"start_time_tick {cmd.start_time_tick} given with start {SUBSCRIPTION_STARTS[start]}"
        )
    wanted = pb.Subscription(
        name=cmd.name,
        vchannels=sorted(cmd.vchannels),
        start=start,
        start_lsn=cmd.start_lsn,
        start_time_tick=cmd.start_time_tick,
        holds_retention=not cmd.no_retention_hold,
    )
    existing = state.subscriptions.get(cmd.name)
    if existing is not None:
        same = pb.Subscription()
        same.CopyFrom(existing)
        same.ClearField("positions")
        same.created_revision = 0
        if same == wanted:
            return []  # the same create again: nothing to do
        return Rejection(
            E.ALREADY_EXISTS,
            f"subscription {show(cmd.name)} already exists with other settings "
            f"(vchannels {list(existing.vchannels)[:8]})",
        )
    if len(state.subscriptions) >= limits.max_subscriptions:
        return invalid(
            f"too many subscriptions ({len(state.subscriptions)}; expected < {limits.max_subscriptions})"
        )
    emitter = _Emitter(state, ctx)
    wanted.created_revision = emitter.next_revision
    emitter.emit(subscription_created=pb.SubscriptionCreated(subscription=wanted))
    return emitter.events


def _drop_subscription(state, cmd: pb.DropSubscription, ctx, limits) -> Outcome:
    subscription = _subscription(state, cmd.name, limits)
    if isinstance(subscription, Rejection):
        return subscription
    emitter = _Emitter(state, ctx)
    emitter.emit(subscription_dropped=pb.SubscriptionDropped(name=cmd.name))
    return emitter.events


def _subscription_vchannel(
    subscription: pb.Subscription, vchannel: str, limits
) -> Rejection | None:
    bad = check_name("vchannel", vchannel, limits)
    if bad:
        return bad
    if vchannel not in subscription.vchannels:
        return invalid(
            f"vchannel {show(vchannel)} is not in subscription {show(subscription.name)} "
            f"(expected one of {list(subscription.vchannels)[:8]})"
        )
    return None


def _commit_subscription_position(
    state, cmd: pb.CommitSubscriptionPosition, ctx, limits
) -> Outcome:
    subscription = _subscription(state, cmd.name, limits)
    if isinstance(subscription, Rejection):
        return subscription
    bad = _subscription_vchannel(subscription, cmd.vchannel, limits)
    if bad:
        return bad
    if cmd.lsn < 1 or cmd.time_tick < 0:
        return invalid(
            f"invalid position (lsn {cmd.lsn}, time_tick {cmd.time_tick}; expected lsn >= 1, "
            "time_tick >= 0)"
        )
    fenced = _member_fence(state, subscription, cmd)
    if fenced:
        return fenced
    stored = subscription.positions.get(cmd.vchannel)
    if stored is not None and cmd.lsn < stored.lsn:
        return invalid(
            f"position of {show(cmd.name)} on {show(cmd.vchannel)} moves forward only (got lsn "
            f"{cmd.lsn}; expected >= {stored.lsn}; Seek moves it back)"
        )
    if stored is not None and cmd.lsn == stored.lsn and not stored.from_time_tick:
        return []  # already there
    emitter = _Emitter(state, ctx)
    emitter.emit(
        subscription_position_committed=pb.SubscriptionPositionCommitted(
            name=cmd.name,
            vchannel=cmd.vchannel,
            position=pb.SubscriptionPosition(
                lsn=cmd.lsn, time_tick=cmd.time_tick, revision=emitter.next_revision
            ),
        )
    )
    return emitter.events


def _member_fence(
    state, subscription: pb.Subscription, cmd: pb.CommitSubscriptionPosition
) -> Rejection | None:
    """Why a commit is fenced: while a subscription has members, only the member holding
    the vchannel, at its current generation and with a live lease, may move its position."""
    if not cmd.member_id:
        if subscription.members:
            return Rejection(
                E.CHANNEL_FENCED,
                f"subscription {show(subscription.name)} has members: a commit must name its "
                "member and generation (got none)",
            )
        return None
    member = subscription.members.get(cmd.member_id)
    if member is None:
        return Rejection(
            E.CHANNEL_FENCED,
            f"member {show(cmd.member_id)} is not in subscription {show(subscription.name)} "
            "(it left, or its lease ended)",
        )
    if cmd.generation != member.generation:
        return Rejection(
            E.CHANNEL_FENCED,
            f"member {show(cmd.member_id)} of {show(subscription.name)} committed at generation "
            f"{cmd.generation}; expected its current generation {member.generation}",
            current_term=member.generation,
        )
    if member.lease_id not in state.leases:
        return Rejection(
            E.CHANNEL_FENCED,
            f"the lease {member.lease_id} of member {show(cmd.member_id)} has ended",
            current_term=member.generation,
        )
    if cmd.vchannel not in member.vchannels:
        return Rejection(
            E.CHANNEL_FENCED,
            f"member {show(cmd.member_id)} does not hold {show(cmd.vchannel)} at generation "
            f"{member.generation} (it holds {list(member.vchannels)[:8]})",
            current_term=member.generation,
        )
    return None


def _join_subscription(state, cmd: pb.JoinSubscription, ctx, limits) -> Outcome:
    subscription = _subscription(state, cmd.name, limits)
    if isinstance(subscription, Rejection):
        return subscription
    bad = check_name("member_id", cmd.member_id, limits)
    if bad:
        return bad
    if cmd.lease_id not in state.leases:
        return Rejection(E.NOT_FOUND, f"lease {cmd.lease_id} does not exist (or has ended)")
    existing = subscription.members.get(cmd.member_id)
    if existing is not None and existing.lease_id == cmd.lease_id:
        return []  # joined already
    if existing is None and len(subscription.members) >= limits.max_subscription_vchannels:
        return invalid(
            f"too many members in {show(cmd.name)} ({len(subscription.members)}; expected < "
            f"{limits.max_subscription_vchannels})"
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        subscription_member_joined=pb.SubscriptionMemberJoined(
            name=cmd.name,
            member=pb.SubscriptionMember(
                member_id=cmd.member_id,
                lease_id=cmd.lease_id,
                generation=emitter.next_revision,
                joined_revision=emitter.next_revision,
            ),
        )
    )
    return emitter.events


def _leave_subscription(state, cmd: pb.LeaveSubscription, ctx, limits) -> Outcome:
    subscription = _subscription(state, cmd.name, limits)
    if isinstance(subscription, Rejection):
        return subscription
    if cmd.member_id not in subscription.members:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        subscription_member_left=pb.SubscriptionMemberLeft(name=cmd.name, member_id=cmd.member_id)
    )
    return emitter.events


def _assign_subscription(state, cmd: pb.AssignSubscription, ctx, limits) -> Outcome:
    subscription = _subscription(state, cmd.name, limits)
    if isinstance(subscription, Rejection):
        return subscription
    listed = [a.member_id for a in cmd.assignments]
    if sorted(listed) != sorted(subscription.members):
        return invalid(
            f"assignment of {show(cmd.name)} lists members {sorted(listed)[:8]}; expected "
            f"every member exactly once ({sorted(subscription.members)[:8]})"
        )
    seen: set[str] = set()
    for assignment in cmd.assignments:
        for vchannel in assignment.vchannels:
            if vchannel not in subscription.vchannels:
                return invalid(f"vchannel {show(vchannel)} is not in {show(cmd.name)}")
            if vchannel in seen:
                return invalid(f"vchannel {show(vchannel)} assigned twice in {show(cmd.name)}")
            seen.add(vchannel)
    emitter = _Emitter(state, ctx)
    for assignment in sorted(cmd.assignments, key=lambda a: a.member_id):
        wanted = sorted(assignment.vchannels)
        if wanted == list(subscription.members[assignment.member_id].vchannels):
            continue
        emitter.emit(
            subscription_member_assigned=pb.SubscriptionMemberAssigned(
                name=cmd.name,
                member_id=assignment.member_id,
                vchannels=wanted,
                generation=emitter.next_revision,
            )
        )
    return emitter.events


def _seek_subscription(state, cmd: pb.SeekSubscription, ctx, limits) -> Outcome:
    subscription = _subscription(state, cmd.name, limits)
    if isinstance(subscription, Rejection):
        return subscription
    if cmd.vchannel:
        bad = _subscription_vchannel(subscription, cmd.vchannel, limits)
        if bad:
            return bad
    if cmd.from_time_tick < 0 or cmd.lsn < 0 or (cmd.lsn > 0) == (cmd.from_time_tick > 0):
        return invalid(
            f"invalid seek (lsn {cmd.lsn}, from_time_tick {cmd.from_time_tick}; expected "
            "either an lsn >= 1 or a from_time_tick >= 1)"
        )
    targets = [cmd.vchannel] if cmd.vchannel else list(subscription.vchannels)
    if cmd.lsn > 1:
        # A seek below the retention floor would position the subscription on entries that
        # are gone: COMPACTED, with the first LSN still there. (lsn 1 is the beginning of
        # the log, whatever retention deleted: SEEK_TARGET_EARLIEST.)
        for vchannel in targets:
            info = state.vchannels.get(vchannel)
            floor = retention_floor(state, info.pchannel) if info is not None else 1
            if cmd.lsn < floor:
                return Rejection(
                    E.COMPACTED,
                    f"lsn {cmd.lsn} of {show(vchannel)} was deleted by retention "
                    f"(expected >= {floor}, the first lsn still retained)",
                    first_available=floor,
                )
    emitter = _Emitter(state, ctx)
    for vchannel in targets:
        emitter.emit(
            subscription_position_committed=pb.SubscriptionPositionCommitted(
                name=cmd.name,
                vchannel=vchannel,
                position=pb.SubscriptionPosition(
                    lsn=cmd.lsn - 1 if cmd.lsn else 0,
                    from_time_tick=cmd.from_time_tick,
                    revision=emitter.next_revision,
                ),
                seek=True,
            )
        )
    return emitter.events


def _set_balance_policy(state, cmd: pb.SetBalancePolicy, ctx, limits) -> Outcome:
    bad = check_range(
        "max_moves_per_round", cmd.max_moves_per_round, 0, limits.max_moves_per_round_limit
    )
    if bad:
        return bad
    policy = state.balance_policy
    if (
        policy.allow_rebalance == cmd.allow_rebalance
        and policy.max_moves_per_round == cmd.max_moves_per_round
    ):
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        balance_policy_set=pb.BalancePolicySet(
            allow_rebalance=cmd.allow_rebalance, max_moves_per_round=cmd.max_moves_per_round
        )
    )
    return emitter.events


def _update_replicate_configuration(
    state, cmd: pb.UpdateReplicateConfiguration, ctx, limits
) -> Outcome:
    configuration = with_kept_tokens(cmd.configuration, state.replicate_configuration)
    if isinstance(configuration, Rejection):
        return configuration
    bad = check_configuration(configuration, cmd.local_cluster_id, limits)
    if bad:
        return bad
    if not is_empty(configuration):
        # This cluster's own pchannels must exist: a typo would otherwise make a pchannel
        # silently replicate nothing.
        mine = local_cluster(configuration, cmd.local_cluster_id)
        assert mine is not None  # check_configuration made sure
        for name in mine.pchannels:
            channel = _live_pchannel(state, name)
            if isinstance(channel, Rejection):
                return Rejection(
                    channel.code,
                    f"{channel.message} (listed for cluster {cmd.local_cluster_id!r}, this "
                    "cluster; expected a pchannel of it)",
                )
    current = state.replicate_configuration
    if current.SerializeToString(deterministic=True) == configuration.SerializeToString(
        deterministic=True
    ):
        return []
    if switching_to(configuration, cmd.local_cluster_id) and not switching_to(
        current, cmd.local_cluster_id
    ):
        # A write pause begins: a broadcast accepted before it must be in the log first,
        # or its append would follow the entries the target is known to hold.
        pending = _undelivered_broadcasts(state, configuration, cmd.local_cluster_id)
        if pending:
            return Rejection(
                E.UNAVAILABLE,
                f"broadcasts {', '.join(map(str, pending[:5]))} are still being appended to "
                f"pchannels of cluster {cmd.local_cluster_id} (got {len(pending)}; expected "
                "none before a switchover pauses writes: retry in a moment)",
            )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        replicate_configuration_updated=pb.ReplicateConfigurationUpdated(
            configuration=configuration, local_cluster_id=cmd.local_cluster_id
        )
    )
    return emitter.events


def _undelivered_broadcasts(
    state: pb.CoordinationState, configuration: pb.ReplicateConfiguration, cluster_id: str
) -> list[int]:
    """PENDING broadcasts with a vchannel not yet appended on a pchannel this cluster
    lists in `configuration`."""
    mine = local_cluster(configuration, cluster_id)
    listed = set(mine.pchannels) if mine is not None else set()
    pending = []
    for broadcast_id in sorted(state.broadcasts):
        task = state.broadcasts[broadcast_id]
        if task.state != pb.BROADCAST_STATE_PENDING:
            continue
        for target in task.vchannels:
            vchannel = state.vchannels.get(target.vchannel)
            if not target.appended and vchannel is not None and vchannel.pchannel in listed:
                pending.append(broadcast_id)
                break
    return pending


def _record_replicate_checkpoint(state, cmd: pb.RecordReplicateCheckpoint, ctx, limits) -> Outcome:
    bad = first_error(
        check_name("pchannel", cmd.pchannel, limits),
        check_name("target_cluster_id", cmd.target_cluster_id, limits),
    )
    if bad:
        return bad
    if cmd.source_lsn < 0:
        return invalid(f"invalid source_lsn ({cmd.source_lsn}; expected >= 0)")
    if cmd.target_claims_lsn < 0:
        return invalid(f"invalid target_claims_lsn ({cmd.target_claims_lsn}; expected >= 0)")
    pairs = replicated_pairs(state.replicate_configuration, state.replicate_cluster_id)
    if (cmd.pchannel, cmd.target_cluster_id) not in pairs:
        return Rejection(
            E.NOT_FOUND,
            f"no replication of pchannel {show(cmd.pchannel)} to cluster "
            f"{show(cmd.target_cluster_id)} (got none in the configuration; expected an "
            "edge from this cluster to it that lists the pchannel)",
        )
    drained = cmd.drained_through_lsn
    if drained:
        target = switching_to(state.replicate_configuration, state.replicate_cluster_id)
        if target != cmd.target_cluster_id:
            return Rejection(
                E.IGNORED_OPERATION,
                f"drained_through_lsn {drained} of pchannel {show(cmd.pchannel)} for cluster "
                f"{show(cmd.target_cluster_id)} without a switchover to it (got "
                f"{'a switchover to ' + target if target else 'none'}; expected this cluster "
                f"switching over to {cmd.target_cluster_id})",
            )
        if drained < cmd.source_lsn:
            return invalid(
                f"invalid drained_through_lsn ({drained}; expected 0, or at least source_lsn "
                f"{cmd.source_lsn})"
            )
    checkpoints = state.replicate_checkpoints.get(cmd.pchannel)
    current = checkpoints.source_lsns.get(cmd.target_cluster_id, 0) if checkpoints else 0
    current_drained = (
        checkpoints.drained_through_lsns.get(cmd.target_cluster_id, 0) if checkpoints else 0
    )
    current_claim = checkpoints.mismatched_lsns.get(cmd.target_cluster_id, 0) if checkpoints else 0
    moves = cmd.source_lsn > current
    drains = drained > current_drained
    # A mismatch (a target claiming more than the source committed) is reported or
    # cleared; it never moves the checkpoint, which is the retention hold.
    claims = cmd.target_claims_lsn != current_claim
    if not moves and not drains and not claims:
        return []
    emitter = _Emitter(state, ctx)
    emitter.emit(
        replicate_checkpoint_recorded=pb.ReplicateCheckpointRecorded(
            pchannel=cmd.pchannel,
            target_cluster_id=cmd.target_cluster_id,
            source_lsn=max(cmd.source_lsn, current),
            drained_through_lsn=drained if drains else 0,
            target_claims_lsn=cmd.target_claims_lsn,
        )
    )
    return emitter.events


def _fresh_state_problem(state: pb.CoordinationState) -> str:
    """What makes `state` not fresh (a restore would overwrite it), or ""."""
    for name, table in (
        ("pchannels", state.pchannels),
        ("vchannels", state.vchannels),
        ("subscriptions", state.subscriptions),
        ("consumer groups", state.consumer_groups),
        ("leases", state.leases),
        ("locks", state.locks),
        ("broadcasts", state.broadcasts),
    ):
        if len(table):
            return f"{len(table)} {name}"
    return ""


def _restore_state(state, cmd: pb.RestoreState, ctx, limits) -> Outcome:
    if hashlib.sha256(cmd.state).hexdigest() != cmd.state_digest:
        return invalid(
            f"state digest mismatch (got {show(cmd.state_digest[:16])}; expected the sha256 "
            "of the state bytes): the snapshot file is damaged"
        )
    try:
        restored = restore_state(cmd.state)
    except ValueError as error:
        return invalid(str(error))
    problem = _fresh_state_problem(state)
    if problem:
        return Rejection(
            E.ALREADY_EXISTS,
            f"the cluster is not fresh ({problem}); expected a new cluster to restore into",
        )
    if restored.revision <= state.revision:
        return invalid(
            f"the snapshot is at revision {restored.revision}, not after this cluster's "
            f"{state.revision} (expected a later one: revisions never go back)"
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        state_restored=pb.StateRestored(
            state=cmd.state, state_digest=cmd.state_digest, restored_revision=restored.revision
        )
    )
    return emitter.events


def _barrier(state, cmd: pb.Barrier, ctx, limits) -> Outcome:
    return []


# --------------------------------------------------------------------------------------
# AlterWAL: moving every pchannel to another WAL implementation online
# --------------------------------------------------------------------------------------


def _alter_channel_done(state, emitter: _Emitter, pchannel: str) -> None:
    """Emit that `pchannel` finished its alter, and that the alter finished when it was
    the last one not done."""
    alter = state.wal_alter
    emitter.emit(
        wal_alter_channel_done=pb.WalAlterChannelDone(pchannel=pchannel, epoch=alter.epoch)
    )
    others = [
        name
        for name, entry in sorted(alter.pchannels.items())
        if name != pchannel and entry.stage != pb.WAL_ALTER_STAGE_DONE
    ]
    if not others:
        emitter.emit(wal_alter_finished=pb.WalAlterFinished(epoch=alter.epoch, target=alter.target))


def _alter_wal(state, cmd: pb.AlterWal, ctx, limits) -> Outcome:
    """Start moving every live pchannel that is not on `target` (with its config) there.
    One alter at a time: it is the cluster's exclusive WAL key. Pchannels never assigned
    move at once (they hold no log); the others go through FLUSHING on their owners."""
    if not cmd.target:
        return invalid(f"invalid target (got ''; expected one of {', '.join(WAL_NAMES)})")
    bad = _wal_error(cmd.target, cmd.target_config)
    if bad:
        return bad
    if state.HasField("wal_alter"):
        alter = state.wal_alter
        return Rejection(
            E.RESOURCE_ACQUIRED,
            f"an AlterWAL to {alter.target or DEFAULT_WAL} is in progress (epoch "
            f"{alter.epoch}, {sum(1 for e in alter.pchannels.values() if e.stage != pb.WAL_ALTER_STAGE_DONE)} "
            "pchannel(s) to go); expected none: wait until it finishes",
        )
    target = "" if cmd.target == DEFAULT_WAL else cmd.target
    config = dict(cmd.target_config)
    moving = [
        name
        for name, channel in sorted(state.pchannels.items())
        if channel.state != pb.PCHANNEL_STATE_DROPPED
        and (channel.wal != target or dict(channel.wal_config) != config)
    ]
    emitter = _Emitter(state, ctx)
    epoch = emitter.next_revision
    tracked = [name for name in moving if state.pchannels[name].term > 0]
    if tracked:
        emitter.emit(
            wal_alter_started=pb.WalAlterStarted(
                epoch=epoch,
                target=target,
                target_config=config,
                pchannels=tracked,
                from_wals=[state.pchannels[name].wal for name in tracked],
            )
        )
    for name in moving:
        if state.pchannels[name].term == 0:
            emitter.emit(
                wal_checkpoint_advanced=pb.WalCheckpointAdvanced(
                    pchannel=name, epoch=epoch, wal=target, wal_config=config
                )
            )
    return emitter.events


def _wal_flushed(state, cmd: pb.WalFlushed, ctx, limits) -> Outcome:
    """A pchannel's owner finished FLUSHING: advance its checkpoint to the new
    implementation and assign it at the next term to the same node, in one command (the
    switch is never half done: before it the pchannel is on the old implementation, after
    it on the new one from the checkpoint on)."""
    bad = first_error(
        check_name("pchannel", cmd.pchannel, limits),
        check_name("node_id", cmd.node_id, limits),
    )
    if bad:
        return bad
    if cmd.checkpoint_lsn < 1 or cmd.checkpoint_term < 1:
        return invalid(
            f"invalid checkpoint ({cmd.checkpoint_lsn}, term {cmd.checkpoint_term}; expected "
            "an entry's lsn and term, >= 1)"
        )
    if not state.HasField("wal_alter") or state.wal_alter.epoch != cmd.epoch:
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"no AlterWAL of epoch {cmd.epoch} is in progress"
            + (f" (epoch {state.wal_alter.epoch} is)" if state.HasField("wal_alter") else ""),
        )
    alter = state.wal_alter
    entry = alter.pchannels.get(cmd.pchannel)
    if entry is None:
        return invalid(f"pchannel {show(cmd.pchannel)} is not in AlterWAL epoch {cmd.epoch}")
    if entry.stage != pb.WAL_ALTER_STAGE_FLUSHING:
        if entry.term == cmd.term + 1 and entry.checkpoint_lsn == cmd.checkpoint_lsn:
            return []  # a retry of the flush that advanced it
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"pchannel {cmd.pchannel} is past FLUSHING in AlterWAL epoch {cmd.epoch} "
            f"(at term {entry.term})",
        )
    channel = _live_pchannel(state, cmd.pchannel)
    if isinstance(channel, Rejection):
        return channel
    if (
        cmd.term != channel.term
        or cmd.node_id != channel.owner_node_id
        or channel.state != pb.PCHANNEL_STATE_ASSIGNED
    ):
        return Rejection(
            E.UNMATCHED_CHANNEL_TERM,
            f"flushed {cmd.pchannel} at term {cmd.term} by {show(cmd.node_id)}; the pchannel is "
            f"{pb.PChannelState.Name(channel.state)} at term {channel.term} owned by "
            f"{show(channel.owner_node_id)}",
            current_term=channel.term,
        )
    manifest = state.manifests.get(cmd.pchannel)
    through = manifest.committed_through_lsn if manifest is not None else 0
    if cmd.checkpoint_lsn != through:
        return invalid(
            f"invalid checkpoint_lsn for {cmd.pchannel} ({cmd.checkpoint_lsn}; expected the "
            f"manifest's end, {through}: the flush commits every entry first)"
        )
    emitter = _Emitter(state, ctx)
    emitter.emit(
        wal_checkpoint_advanced=pb.WalCheckpointAdvanced(
            pchannel=cmd.pchannel,
            epoch=cmd.epoch,
            wal=alter.target,
            wal_config=alter.target_config,
            checkpoint_lsn=cmd.checkpoint_lsn,
            checkpoint_term=cmd.checkpoint_term,
            checkpoint_time_tick=cmd.checkpoint_time_tick,
            term=channel.term + 1,
        )
    )
    emitter.emit(
        pchannel_assigned=pb.PChannelAssigned(
            pchannel=cmd.pchannel,
            term=channel.term + 1,
            node_id=channel.owner_node_id,
            replica_node_ids=list(channel.replica_node_ids),
            access_mode=channel.access_mode or pb.ACCESS_MODE_READWRITE,
        )
    )
    return emitter.events


_DECIDERS: dict[str, Callable[..., Outcome]] = {
    "register_node": _register_node,
    "mark_node_down": _node_flag(
        "mark_node_down",
        lambda n: n.state == pb.NODE_STATE_DOWN,
        "node_marked_down",
        pb.NodeMarkedDown,
    ),
    "mark_node_up": _node_flag(
        "mark_node_up", lambda n: n.state == pb.NODE_STATE_UP, "node_marked_up", pb.NodeMarkedUp
    ),
    "freeze_node": _node_flag("freeze_node", lambda n: n.frozen, "node_frozen", pb.NodeFrozen),
    "unfreeze_node": _node_flag(
        "unfreeze_node", lambda n: not n.frozen, "node_unfrozen", pb.NodeUnfrozen
    ),
    "remove_node": _remove_node,
    "create_pchannels": _create_pchannels,
    "assign_pchannel": _assign_pchannel,
    "pchannel_ready": _pchannel_ready,
    "mark_pchannel_unavailable": _mark_pchannel_unavailable,
    "drop_pchannel": _drop_pchannel,
    "create_vchannel": _create_vchannel,
    "drop_vchannel": _drop_vchannel,
    "commit_segment": _commit_segment,
    "delete_segments_before": _delete_segments_before,
    "create_broadcast": _create_broadcast,
    "record_broadcast_appended": _record_broadcast_appended,
    "ack_broadcast": _ack_broadcast,
    "clear_broadcasts": _clear_broadcasts,
    "grant_lease": _grant_lease,
    "keep_alive_lease": _keep_alive_lease,
    "revoke_lease": _revoke_lease,
    "expire_leases": _expire_leases,
    "extend_leases": _extend_leases,
    "lock": _lock,
    "unlock": _unlock,
    "commit_consumer_position": _commit_consumer_position,
    "bump_consumer_fence": _bump_consumer_fence,
    "create_subscription": _create_subscription,
    "drop_subscription": _drop_subscription,
    "commit_subscription_position": _commit_subscription_position,
    "seek_subscription": _seek_subscription,
    "restore_state": _restore_state,
    "join_subscription": _join_subscription,
    "leave_subscription": _leave_subscription,
    "assign_subscription": _assign_subscription,
    "set_balance_policy": _set_balance_policy,
    "update_replicate_configuration": _update_replicate_configuration,
    "record_replicate_checkpoint": _record_replicate_checkpoint,
    "barrier": _barrier,
    "alter_wal": _alter_wal,
    "wal_flushed": _wal_flushed,
}

COMMAND_KINDS: tuple[str, ...] = tuple(_DECIDERS)


def decide(
    state: pb.CoordinationState,
    command: pb.Command,
    ctx: Context,
    limits: Limits = DEFAULT_LIMITS,
) -> Outcome:
    """Validate `command` against `state`; return its events or a Rejection."""
    kind = command.WhichOneof("body")
    if kind is None:
        return invalid("command has no body (got an empty oneof; expected one command)")
    decider = _DECIDERS.get(kind)
    if decider is None:
        return invalid(f"unsupported command {kind!r}")
    return decider(state, getattr(command, kind), ctx, limits)


def command_kinds() -> Iterable[str]:
    return COMMAND_KINDS
