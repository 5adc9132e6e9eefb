"""Crash points for tests: kill this process at a named point of a durable write.

Lives here: `crash_point(name)`, a no-op unless the environment variable
`RAFTWAL_RAFT_CRASH_AT` names that point, in which case the process sends itself SIGKILL
(the same thing `kill -9` does, at a deterministic place). Cluster tests use it to prove
that snapshots and journal compaction are atomic (FoundationDB's BUGGIFY, etcd's gofail).

Must never: do anything when the variable is unset, or be used to alter behaviour other
than dying on the spot.
"""

from __future__ import annotations

import logging
import os
import signal

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


def crash_point(name: str) -> None:
    """Die with SIGKILL here if `RAFTWAL_RAFT_CRASH_AT` equals `name`."""
    assert name in CRASH_POINTS, f"unknown crash point {name!r}"
    if os.environ.get(CRASH_ENV_VAR) == name:
        logger.warning("crash point %s reached: sending SIGKILL to self", name)
        os.kill(os.getpid(), signal.SIGKILL)
