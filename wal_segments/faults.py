"""Fault points of the WAL's file I/O, for tests: where an injected error or delay can hit.

Lives here: the names of the data plane's fault points (`FAULT_POINTS`), `install(hook)`,
and `fault(point, subject)`, which `segment.py` calls right before each real write and
fdatasync of a segment file:

- ``wal.append``: every `pwrite` into a segment file (a batch, a file header, a seal
  footer); the subject is the file's path;
- ``wal.fsync``: every fdatasync of a segment file; the subject is the file's path;
- ``wal.delete``: every unlink of a segment file by retention (`log.py`); the subject is
  the file's path.

With no hook installed (always, unless the node process enables fault injection: see
`raftwal.node.faults`), `fault` costs one global load and a None test. An installed hook may
raise OSError (the injected error) or block for a while (a slow disk) before the real call.

Must never: import `raft` or `raftwal` (the composition root installs the hook), do
anything when no hook is installed, or swallow what the hook raises.
"""

from __future__ import annotations

from collections.abc import Callable

#: (point, subject) -> None; raises OSError or sleeps to inject a fault
FaultHook = Callable[[str, str], None]

FAULT_POINTS = frozenset({"wal.append", "wal.fsync", "wal.delete"})

_hook: FaultHook | None = None


def install(hook: FaultHook | None) -> None:
    """Route every fault point through `hook` (None: back to no faults at all)."""
    global _hook
    _hook = hook


def fault(point: str, subject: str) -> None:
    """Let the installed hook fail or delay the I/O about to happen at `point`."""
    hook = _hook
    if hook is not None:
        hook(point, subject)
