"""Starting a test's subprocess the way the cluster and Spark tests need it: in its own
process session (so that the whole group, with the children it starts, can be stopped by
the session's id and nothing else), stdin closed, stdout and stderr in one log file."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def start_in_own_session(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def node_rss_bytes(pid: int) -> int:
    """Resident memory of a node whose supervisor is `pid`: its supervisor, control process
    and data workers together (a node is all of them, DESIGN.md section 2)."""
    from raftwal.cli import dev

    total = 0
    for member in dev.node_processes(pid):
        try:
            text = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue  # gone meanwhile
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    if not total:
        raise AssertionError(f"no VmRSS for node pid {pid}")
    return total
