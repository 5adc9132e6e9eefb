"""The contract between the WAL adaptor (`wal_segments.owner.ChannelOwner`) and a WAL
implementation: builder -> opener -> WAL -> scanner, as `typing.Protocol`s.

The split follows Milvus's `pkg/streaming/walimpls`:
- an `OpenerBuilder` lives as long as the process and is registered by name
  (`wal_segments.walimpls.registry`); `build(config)` validates the implementation's
  configuration (one-line `ConfigError`s that never quote a secret) and returns
- an `Opener`, which lives as long as its client resources (a NATS connection) and opens
- a `WAL` per pchannel (and per *epoch*: the alter that put the pchannel on this
  implementation), which makes the frames the adaptor appended durable, fences older
  writers and creates
- `Scanner`s, which read what the implementation holds back in append order.

What the adaptor keeps for every implementation (so an implementation never sees it):
LSNs and time ticks, the idempotent producers' table, transactions (written as one batch),
seal markers and the committed-segment manifest in Raft, retention, and the scanners'
filters (Consume reads the adaptor's write-ahead cache, the owner's `PChannelLog`). An
implementation only appends batches of encoded frames, reads them back, and fences.

Three implementations come with raftwal:
- ``segments``: the owner's segment files replicated by the owner to its replica set; the
  adaptor's own log *is* the storage, so its `WAL` object only says so (`replicated`), and
  the hot path is the owner's, unchanged;
- ``local``: the same files on the owner alone, acknowledged after the owner's fsync;
- ``jetstream``: one JetStream stream per pchannel and epoch on a NATS server the user runs;
  acknowledged once JetStream acknowledged the publish (stored on the stream's replicas).

What must never happen here: an import of `raft` or `raftwal`; an implementation that
acknowledges (calls its durable callback for) a batch its backend has not made durable,
or after it learned of a higher term.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

#: The implementation a pchannel uses when the coordination state names none.
DEFAULT_WAL = "segments"


class WalImplError(Exception):
    """An implementation's failure, with a short machine-readable `kind`."""

    kind = "error"


class ConfigError(WalImplError):
    """A configuration an implementation refuses: one line saying what was got and what
    was expected, never a secret's value."""

    kind = "config"


class Unavailable(WalImplError):
    """The backend cannot be reached now (a NATS server killed or paused, a timeout): the
    outcome of what was in flight is unknown; the owner stops and a new term recovers."""

    kind = "unavailable"


class FencedByTerm(WalImplError):
    """A newer writer fenced the log (a fence or a batch of a higher term, or an
    expected-last-sequence that no longer holds)."""

    kind = "fenced"

    def __init__(self, message: str, term: int) -> None:
        super().__init__(message)
        self.term = term


class Corrupt(WalImplError):
    """What the backend holds does not decode as this implementation wrote it."""

    kind = "corrupt"


@dataclass(frozen=True, slots=True)
class Record:
    """One appended batch as an implementation stores it: the encoded frames of entries
    first_lsn..last_lsn, all written at `term`, following an entry of `prev_term`."""

    first_lsn: int
    last_lsn: int
    term: int
    prev_term: int
    frames: bytes
    #: a fence record: no frames; `term` fenced the log when it ended at entry
    #: (last_lsn, prev_term)
    fence: bool = False


@dataclass(frozen=True, slots=True)
class Tail:
    """Where an implementation's log ends: the last entry (lsn, term), the highest term
    that wrote or fenced it (0 and 0 for an empty log) and the implementation's own last
    position (records are numbered from 1 in append order; a stream sequence)."""

    last_lsn: int
    last_term: int
    fenced_term: int
    records: int = 0


#: Reads an implementation's records in append order: (record, its last position).
Scanner = AsyncIterator[tuple[Record, int]]


#: Called by an implementation, on the event loop, with the last LSN of every record it
#: made durable, in order; or with an exception once it can make no more durable.
DurableCallback = Callable[[int | BaseException], None]


class WAL(Protocol):
    """One pchannel's log in an implementation, opened by the owner at one term."""

    #: the implementation's registered name
    name: str
    #: the owner's replica set holds copies, replicated by the owner (``segments``)
    replicated: bool
    #: durability lies outside the nodes: the owner's files are a cache, acknowledged
    #: batches are those the implementation reported durable (``jetstream``)
    external: bool

    async def tail(self) -> Tail:
        """Where the stored log ends now."""
        ...

    async def record_at(self, position: int) -> tuple[Record, int] | None:
        """The record that ends at `position` and the position it starts at; None when
        no whole record ends there (a part of a larger record, or nothing)."""
        ...

    def scan(self, first: int, last: int) -> Scanner:
        """The whole records in positions first..last, in order."""
        ...

    async def fence(self, term: int, after: Tail) -> Tail:
        """Fence every writer below `term`: from now on no record written under a lower
        term can be stored. `after` is the tail the caller recovered (it read everything
        up to it); raises FencedByTerm when a higher term holds the log, and returns the
        new tail when the log grew since `after` (the caller reads the rest and calls
        again) or `after` itself once fenced."""
        ...

    def append(self, record: Record) -> None:
        """Start making `record` durable (never blocks: the hot path). Records arrive in
        LSN order, each right after the last; the durable callback reports them in that
        order."""
        ...

    def on_durable(self, callback: DurableCallback) -> None: ...

    async def close(self) -> None: ...


class Opener(Protocol):
    """An implementation's client resources (one per data worker and implementation)."""

    name: str

    async def open(self, pchannel: str, epoch: int) -> WAL:
        """The WAL of `pchannel` for the alter `epoch` that put it on this implementation
        (0: it was created on it). Raises Unavailable or ConfigError."""
        ...

    async def close(self) -> None: ...


class OpenerBuilder(Protocol):
    """Registered by name; `build` validates the configuration first."""

    name: str

    def validate(self, config: Mapping[str, str]) -> dict[str, str]:
        """The configuration with defaults filled in; ConfigError for a bad one."""
        ...

    def build(self, config: Mapping[str, str]) -> Opener: ...
