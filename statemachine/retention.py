"""WAL retention policy: which ``DeleteSegmentsBefore`` commands the coordinator proposes.

Lives here: ``plan_retention(state, now_ms, policy)``, a pure function of the coordination
state and the proposer's wall clock (passed in: nothing here reads a clock). Per pchannel, a
committed segment is due when its newest entry is older than ``retention_ms`` or while the
pchannel's committed segments hold more than ``retention_bytes`` (oldest first). The plan
is then cut by the same floor the decider enforces (``decider.retention_bound``: consumer
groups, subscriptions that hold retention, unacknowledged broadcasts), so a proposal is
made only when it deletes something; the decider checks it again when it is applied.

Must never: read a clock, do I/O, or propose a floor that the decider would move
backwards (the floor only rises: segments are deleted from the head of the manifest).
"""

from __future__ import annotations

from dataclasses import dataclass

from rpc.protos import coordination_pb2 as pb
from statemachine.decider import retention_bound


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    #: a committed segment whose newest entry is older than this is deleted (0: no age limit)
    retention_ms: int
    #: committed bytes per pchannel kept at most, oldest deleted first (0: no size limit)
    retention_bytes: int
    #: time ticks are wall-clock ms shifted left by this many bits (the owner's hybrid clock)
    tick_logical_bits: int


def due_before(manifest: pb.SegmentManifest, now_ms: int, policy: RetentionPolicy) -> int:
    """The LSN below which `manifest`'s committed segments are due by age or size (0:
    none is)."""
    before = 0
    if policy.retention_ms > 0:
        for segment in manifest.segments:
            newest_ms = segment.last_time_tick >> policy.tick_logical_bits
            if newest_ms + policy.retention_ms > now_ms:
                break
            before = segment.last_lsn + 1
    if policy.retention_bytes > 0:
        total = sum(segment.bytes for segment in manifest.segments)
        for segment in manifest.segments:
            if total <= policy.retention_bytes:
                break
            total -= segment.bytes
            before = max(before, segment.last_lsn + 1)
    return before


def plan_retention(
    state: pb.CoordinationState, now_ms: int, policy: RetentionPolicy
) -> list[pb.DeleteSegmentsBefore]:
    """The deletions due now, one per pchannel, in name order (each deletes something)."""
    commands: list[pb.DeleteSegmentsBefore] = []
    for name in sorted(state.manifests):
        channel = state.pchannels.get(name)
        if channel is None or channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        manifest = state.manifests[name]
        if not manifest.segments:
            continue
        before = due_before(manifest, now_ms, policy)
        if before <= 0:
            continue
        bound = retention_bound(state, name, before)
        if manifest.segments[0].last_lsn < bound:
            commands.append(pb.DeleteSegmentsBefore(pchannel=name, before_lsn=before))
    return commands
