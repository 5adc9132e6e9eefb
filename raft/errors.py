"""Typed outcomes of the Raft adapter.

Lives here: the exceptions a proposer can see and the ones that stop a peer. Each says
whether the command can still be committed, because that decides what the caller may do:
`NotLeader` and `Overloaded` guarantee the command was not (and will never be) applied, so
a retry anywhere is safe; `UnknownOutcome` means it may still commit, so a retry must carry
the same request id and rely on the state machine to deduplicate.

Must never: import pysyncobj or anything with side effects (callers import these names in
tests and servicers).
"""

from __future__ import annotations


class RaftError(Exception):
    """Base class of every error raised by the `raft` package."""


class NotLeader(RaftError):
    """This peer is not the leader: the command was not appended and never will be.

    `leader_address` is the Raft address of the leader this peer last heard from, or None
    while an election is in progress.
    """

    def __init__(self, leader_address: str | None, message: str | None = None) -> None:
        self.leader_address = leader_address
        super().__init__(message or f"not the leader (leader hint: {leader_address or 'unknown'})")


class UnknownOutcome(RaftError):
    """The command may or may not commit (timeout, leadership lost after append, shutdown).

    Retry with the same request id: the state machine deduplicates.
    """


class LeadershipUnconfirmed(RaftError):
    """A linearizable read could not be served: this peer did not hear from a majority
    in its term within the wait (partitioned or deposed), or did not apply far enough.
    Nothing was read; retry, possibly elsewhere."""


class Overloaded(RaftError):
    """The command was refused before it reached the log (a bound was hit); retry later."""


class ChangeRefused(RaftError):
    """A membership change was refused (not appended): another change is not committed
    yet, this leader has not committed an entry of its own term, or the change would not
    change anything. Nothing happened; ask again once the cause is gone."""


class PeerClosed(RaftError):
    """The peer is closed or stopped after a fatal error; nothing was proposed."""


class FatalPeerError(RaftError):
    """The peer hit an error it must not continue after (fsync failure, apply failure,
    an attempt to truncate already-applied entries). The peer stops; the process should exit
    and be restarted, which recovers from the durable journal and snapshot."""


class JournalCorrupted(RaftError):
    """The journal or its metadata cannot be trusted; the peer refuses to start."""


class SnapshotCorrupted(RaftError):
    """The snapshot file fails its checks; the peer refuses to start."""
