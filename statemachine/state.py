"""The coordination state value and its snapshot codec.

The state is a ``CoordinationState`` protobuf message. ``evolve`` updates it in place (a
copy per event would make every apply cost the size of the whole state); code that needs
the state from before an event keeps a ``copy_state``. Serialized with deterministic
ordering it is byte-identical on every replica at the same revision, which makes it both
the snapshot format and the basis of the replicas' digest comparison.
"""

from __future__ import annotations

import hashlib

from google.protobuf.message import DecodeError

from rpc.protos import coordination_pb2 as pb

STATE_FORMAT_VERSION = 1


def new_state() -> pb.CoordinationState:
    state = pb.CoordinationState(format_version=STATE_FORMAT_VERSION, next_vchannel_id=1)
    # Bounded rebalancing is on from the start, as in Milvus' balancer: after a node comes
    # back, the pchannels that failed over spread out again without anyone asking
    # (`raftwal balance off` turns it off).
    state.balance_policy.allow_rebalance = True
    return state


def snapshot_state(state: pb.CoordinationState) -> bytes:
    """Deterministic bytes of the whole state (equal states give equal bytes)."""
    return state.SerializeToString(deterministic=True)


def restore_state(data: bytes) -> pb.CoordinationState:
    """Inverse of ``snapshot_state``; refuses a snapshot of an unknown format version."""
    try:
        state = pb.CoordinationState.FromString(data)
    except DecodeError as error:
        raise ValueError(
            f"undecodable coordination snapshot ({len(data)} bytes: {error})"
        ) from None
    if state.format_version != STATE_FORMAT_VERSION:
        raise ValueError(
            f"unsupported coordination snapshot format {state.format_version} "
            f"(expected {STATE_FORMAT_VERSION})"
        )
    upgrade_state(state)
    return state


def upgrade_state(state: pb.CoordinationState) -> None:
    """Fill in, in place, what a state saved by an older version lacks (idempotent, and a
    no-op on a current state, so every node that loads a snapshot agrees).

    ``stable_replica_node_ids`` (the replica set of the last ready term) is set when a
    pchannel becomes ready. A pchannel that went ready before the field existed has it
    empty, and the first replica set change after that would fence only the new set: a
    majority of the new set need not overlap the old set's majority, which holds the
    acknowledged entries. While such a pchannel is ASSIGNED, its replica set is the last
    ready set. (One caught mid-change by the upgrade, ASSIGNING with an empty set, keeps
    it empty: its last ready set is not recorded anywhere; the next ready term sets it.)

    ``owner_usage`` (the per-identity lease and lock counts) is derived from ``leases``:
    it is counted again here, which a current state already agrees with."""
    state.owner_usage.clear()
    for lease_id in sorted(state.leases):
        lease = state.leases[lease_id]
        if lease.owner:
            usage = state.owner_usage[lease.owner]
            usage.leases += 1
            usage.locks += len(lease.locked_keys)
    for name in sorted(state.pchannels):
        channel = state.pchannels[name]
        if (
            not channel.stable_replica_node_ids
            and channel.state == pb.PCHANNEL_STATE_ASSIGNED
            and channel.replica_node_ids
        ):
            channel.stable_replica_node_ids.extend(channel.replica_node_ids)


def copy_state(state: pb.CoordinationState) -> pb.CoordinationState:
    duplicate = pb.CoordinationState()
    duplicate.CopyFrom(state)
    return duplicate


def state_digest(state: pb.CoordinationState) -> str:
    """sha256 of the deterministic snapshot: equal on replicas that have not diverged."""
    return hashlib.sha256(snapshot_state(state)).hexdigest()
