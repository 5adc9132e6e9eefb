"""Applying one replicated command: decode, deduplicate, decide, evolve, reply.

This is the single entry point the Raft layer calls for every committed log entry, on
every node, in log order. Besides the domain state it maintains two pieces of apply
metadata that are not events: the request-id deduplication window (a retried command with
a request id already seen gets the stored result, so an UNKNOWN_OUTCOME retry never applies
twice) and the state machine's clock (the highest proposer time seen, so time never runs
backwards across leader changes). Both are part of the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import DecodeError

from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from statemachine.decider import decide
from statemachine.evolve import evolve
from statemachine.types import DEFAULT_LIMITS, Context, Limits, Rejection
from statemachine.validation import invalid


def _reply(
    state: pb.CoordinationState,
    command: pb.Command,
    events: list[pb.Event],
    result: pb.CommandResult,
) -> None:
    """Fill the reply fields a caller needs beyond the events (also for idempotent repeats)."""
    kind = command.WhichOneof("body")
    if kind == "create_pchannels":
        result.pchannel_names.extend(
            e.pchannel_created.name for e in events if e.HasField("pchannel_created")
        )
    elif kind == "create_broadcast":
        created = [e for e in events if e.HasField("broadcast_created")]
        if created:
            result.broadcast_id = created[0].broadcast_created.task.id
        else:
            key = command.create_broadcast.idempotency_key
            result.broadcast_id = state.broadcast_idempotency.get(key, 0)
    elif kind == "grant_lease":
        result.lease_id = events[0].lease_granted.lease.id
        result.lease_deadline_ms = events[0].lease_granted.lease.deadline_ms
    elif kind == "keep_alive_lease":
        lease = state.leases[command.keep_alive_lease.lease_id]
        result.lease_id = lease.id
        result.lease_deadline_ms = lease.deadline_ms
    elif kind == "lock":
        for holder in state.locks[command.lock.key].holders:
            if holder.kind == pb.HOLDER_KIND_LEASE and holder.id == command.lock.lease_id:
                result.fencing_token = holder.fencing_token
    elif kind == "bump_consumer_fence":
        result.consumer_fence = events[0].consumer_fence_bumped.fence


def _remember(
    state: pb.CoordinationState, request_id: str, result: pb.CommandResult, limits: Limits
) -> None:
    """Keep `result` for retries of `request_id`. Called before the events are attached:
    they can be large (a broadcast carries its message) and they are in the event history;
    a deduplicated reply carries the revision and the replies."""
    if limits.dedup_window <= 0:
        return
    stored = result.SerializeToString(deterministic=True)
    state.recent_results[request_id] = stored
    ring = state.recent_request_ids
    if len(ring) < limits.dedup_window:
        ring.append(request_id)
        return
    # Full ring: overwrite the oldest id (O(1), unlike deleting from the front).
    cursor = state.recent_cursor % len(ring)
    del state.recent_results[ring[cursor]]
    ring[cursor] = request_id
    state.recent_cursor = (cursor + 1) % len(ring)


def apply_command(
    state: pb.CoordinationState,
    command_bytes: bytes,
    raft_index: int,
    limits: Limits = DEFAULT_LIMITS,
) -> pb.CommandResult:
    """Apply one committed command to `state` (in place); return what it produced.

    Never raises on bad input: undecodable bytes and invalid commands become rejections,
    identically on every node. Raises AssertionError only on a broken invariant.
    """
    result = pb.CommandResult(raft_index=raft_index)
    try:
        command = pb.Command.FromString(command_bytes)
    except DecodeError as error:
        rejection = invalid(f"undecodable command ({len(command_bytes)} bytes: {error})")
        result.rejection.CopyFrom(rejection.to_error_info())
        result.revision = state.revision
        state.last_raft_index = max(state.last_raft_index, raft_index)
        return result

    request_id = command.request_id
    if request_id:
        stored = state.recent_results.get(request_id)
        if stored is not None:
            previous = pb.CommandResult.FromString(stored)
            previous.deduplicated = True
            state.last_raft_index = max(state.last_raft_index, raft_index)
            return previous

    time_ms = state.last_time_ms
    if 0 < command.proposed_at_ms <= limits.max_time_ms:
        time_ms = max(command.proposed_at_ms, time_ms)
    ctx = Context(time_ms=time_ms, raft_index=raft_index)
    if len(request_id) > limits.request_id_max_chars:
        outcome: list[pb.Event] | Rejection = invalid(
            f"request_id too long ({len(request_id)} chars; expected at most "
            f"{limits.request_id_max_chars})"
        )
        request_id = ""
    elif not 0 < command.proposed_at_ms <= limits.max_time_ms:
        outcome = invalid(
            f"invalid proposed_at_ms ({command.proposed_at_ms}; expected the proposer's "
            f"wall time in ms, 1..{limits.max_time_ms})"
        )
    else:
        outcome = decide(state, command, ctx, limits)

    events: list[pb.Event] = []
    if isinstance(outcome, Rejection):
        result.rejection.CopyFrom(outcome.to_error_info())
    else:
        events = outcome
        result.rejection.code = errors_pb2.OK
        for event in events:
            evolve(state, event, limits)
        _reply(state, command, events, result)
    state.last_time_ms = time_ms
    state.last_raft_index = max(state.last_raft_index, raft_index)
    result.revision = state.revision
    if request_id:
        _remember(state, request_id, result, limits)
    if events:
        result.events.extend(events)
    return result


def apply_events(state: pb.CoordinationState, events: Iterable[pb.Event]) -> pb.CoordinationState:
    """Fold a history of events into `state` (e.g. replaying the event store)."""
    for event in events:
        evolve(state, event)
    return state


def apply_log_entry(
    state: pb.CoordinationState,
    entry_bytes: bytes,
    raft_index: int,
    limits: Limits = DEFAULT_LIMITS,
) -> list[pb.CommandResult]:
    """Apply every command of one Raft log entry, in order; one result per command.

    All commands of a batch share the entry's raft index. An undecodable entry yields one
    INVALID_ARGUMENT result, identically on every node.
    """
    try:
        entry = pb.LogEntry.FromString(entry_bytes)
    except DecodeError:
        entry = pb.LogEntry()
    kind = entry.WhichOneof("body")
    if kind == "command":
        commands: list[bytes] = [entry.command]
    elif kind == "batch":
        commands = list(entry.batch.commands)
    else:
        # Not a LogEntry we understand: apply_command rejects the bytes as a command.
        commands = [entry_bytes]
    return [apply_command(state, command, raft_index, limits) for command in commands]
