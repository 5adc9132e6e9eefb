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
    return state


def copy_state(state: pb.CoordinationState) -> pb.CoordinationState:
    duplicate = pb.CoordinationState()
    duplicate.CopyFrom(state)
    return duplicate


def state_digest(state: pb.CoordinationState) -> str:
    """sha256 of the deterministic snapshot: equal on replicas that have not diverged."""
    return hashlib.sha256(snapshot_state(state)).hexdigest()
