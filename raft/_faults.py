"""Fault points for tests: die at a named point of a durable write, or fail its I/O.

Lives here:
- `crash_point(name)`, a no-op unless the environment variable `RAFTWAL_RAFT_CRASH_AT`
  names that point, in which case the process sends itself SIGKILL (the same thing
  `kill -9` does, at a deterministic place). Cluster tests use it to prove that snapshots
  and journal compaction are atomic (FoundationDB's BUGGIFY, etcd's gofail).
- `io_fault(point, subject)`, called by the journal right before its real writes and
  fsyncs (``raft.journal.write``, ``raft.journal.fsync``; the subject is the file's path).
  It does nothing unless the node process installed a hook (`install_io_fault_hook`, done
  only by `raftwal.node.faults` when fault injection is enabled); the hook may raise OSError or
  block for a while, which the journal then handles like a real disk failure or a slow
  disk.

Must never: do anything when the variable is unset and no hook is installed, import
`raftwal` (the composition root installs the hook), or alter behaviour other than dying on
the spot or failing/delaying the I/O call it guards.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

logger = logging.getLogger(__name__)

CRASH_ENV_VAR = "RAFTWAL_RAFT_CRASH_AT"

# Every point the package defines, so a typo in a test fails loudly instead of never firing.
CRASH_POINTS = frozenset(
    {
        # The snapshot temp file is written and fsynced; pysyncobj has not renamed it yet.
        "snapshot_tmp_written",
        # pysyncobj renamed the new snapshot into place; the journal still holds the
        # entries the snapshot covers (compaction has not started).
        "snapshot_renamed",
        # The compacted journal is written and fsynced under its temp name, not renamed.
        "journal_compaction_tmp_written",
        # The compacted journal replaced the old one; the directory is not fsynced yet.
        "journal_compaction_renamed",
    }
)

IO_FAULT_POINTS = frozenset({"raft.journal.write", "raft.journal.fsync"})

#: (point, subject) -> None; raises OSError or sleeps to inject a fault
IoFaultHook = Callable[[str, str], None]

_io_hook: IoFaultHook | None = None


def crash_point(name: str) -> None:
    """Die with SIGKILL here if `RAFTWAL_RAFT_CRASH_AT` equals `name`."""
    assert name in CRASH_POINTS, f"unknown crash point {name!r}"
    if os.environ.get(CRASH_ENV_VAR) == name:
        logger.warning("crash point %s reached: sending SIGKILL to self", name)
        os.kill(os.getpid(), signal.SIGKILL)


def install_io_fault_hook(hook: IoFaultHook | None) -> None:
    """Route every I/O fault point through `hook` (None: back to no faults at all)."""
    global _io_hook
    _io_hook = hook


def io_fault(point: str, subject: str) -> None:
    """Let the installed hook fail or delay the journal I/O about to happen at `point`."""
    hook = _io_hook
    if hook is not None:
        hook(point, subject)
