"""The ``segments`` and ``local`` implementations: raftwal's own segment files.

For both, the adaptor's write-ahead cache (the owner's `PChannelLog`) *is* the storage, so
their `WAL` objects carry no data path at all: they say how the owner makes an appended
batch durable, and the owner does it as it always has.
- ``segments`` (`replicated`): the owner streams each batch's frames to its replica set and
  acknowledges once a majority holds them after fdatasync; tail recovery fences a majority
  and adopts the most up-to-date log (docs/architecture.md, section 4).
- ``local``: one copy, on the owner's disk. The owner replicates to no one and acknowledges
  once its own fdatasync covered the batch, so the node's fsync policy must be ``always``
  (`check_fsync_policy`). A new owner fences the previous owner's log and adopts it, so a
  move waits for the node that holds the one copy.

What must never happen here: any I/O of its own (the adaptor does all of it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from wal_segments.walimpls.api import ConfigError, Record, Tail


class FilesWAL:
    """The `WAL` of a pchannel kept in the owner's segment files."""

    external = False

    def __init__(self, name: str, replicated: bool) -> None:
        self.name = name
        self.replicated = replicated

    async def tail(self) -> Tail:
        # The owner's log is the storage: its position is the tail (the adaptor reads it).
        return Tail(0, 0, 0)

    async def record_at(self, position: int) -> tuple[Record, int] | None:
        return None

    async def scan(self, first: int, last: int) -> AsyncIterator[tuple[Record, int]]:
        return
        yield

    async def fence(self, term: int, after: Tail) -> Tail:
        return after

    def append(self, record: Record) -> None:
        raise AssertionError(f"the {self.name} WAL is the owner's own log: nothing to append")

    def on_durable(self, callback: object) -> None:
        return None

    async def close(self) -> None:
        return None


class FilesOpener:
    def __init__(self, name: str, replicated: bool) -> None:
        self.name = name
        self._wal = FilesWAL(name, replicated)

    async def open(self, pchannel: str, epoch: int) -> FilesWAL:
        return self._wal

    async def close(self) -> None:
        return None


class FilesBuilder:
    """Builder of ``segments`` (replicated) or ``local`` (one copy). Neither takes any
    configuration: the node's own settings (fsync policy, segment sizes) apply."""

    def __init__(self, name: str, replicated: bool) -> None:
        self.name = name
        self.replicated = replicated

    def validate(self, config: Mapping[str, str]) -> dict[str, str]:
        if config:
            raise ConfigError(
                f"invalid {self.name} WAL config (got keys {sorted(config)[:8]}; expected none)"
            )
        return {}

    def build(self, config: Mapping[str, str]) -> FilesOpener:
        self.validate(config)
        return FilesOpener(self.name, self.replicated)


def check_fsync_policy(name: str, policy_kind: str) -> None:
    """``local`` keeps one copy: an acknowledgement must follow an fdatasync covering it."""
    if name == "local" and policy_kind != "always":
        raise ConfigError(
            f"the local WAL needs wal_fsync = always (got {policy_kind}; one copy must be "
            "on disk before the ack)"
        )


SEGMENTS = FilesBuilder("segments", replicated=True)
LOCAL = FilesBuilder("local", replicated=False)
