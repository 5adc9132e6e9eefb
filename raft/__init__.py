"""raft: a durable pysyncobj peer that replicates opaque command bytes.

Lives here: `RaftPeer`, the single entry point through which the rest
of raftwal replicates commands — `propose(command_bytes)` on the leader, `apply(command,
raft_index)` on every node in log order, snapshots through the application's own codec —
with the durability pysyncobj lacks: journal entries are fsynced (group commit) on the
leader and on a majority before a proposal is acknowledged; term, vote, commit index and
snapshots are replaced atomically with fsync of file and directory. See `DURABILITY.md`.
The coordination replica (`replica.py`) and event store (`events.py`) that plug into
RaftPeer's apply / snapshot callables live beside it.

Must never: know what a command means (no statemachine logic here), pickle application
data, or run with a non-loopback address and no cluster password. This package shadows the
unrelated PyPI distribution `raft`; never install both in one environment.
"""

from raft.errors import (
    ChangeRefused,
    FatalPeerError,
    JournalCorrupted,
    NotLeader,
    Overloaded,
    PeerClosed,
    RaftError,
    SnapshotCorrupted,
    UnknownOutcome,
)
from raft.peer import DurabilityEvent, RaftPeer, RaftTuning, is_loopback_address

__all__ = [
    "ChangeRefused",
    "DurabilityEvent",
    "FatalPeerError",
    "JournalCorrupted",
    "NotLeader",
    "Overloaded",
    "PeerClosed",
    "RaftError",
    "RaftPeer",
    "RaftTuning",
    "SnapshotCorrupted",
    "UnknownOutcome",
    "is_loopback_address",
]
