"""What a node reports of itself in ``MemberStatus``: its owners as each sees its replica
set, the bytes under its data directory, and its processes (supervisor, control process,
data workers) with their CPU time and resident memory, read from ``/proc``.

Must never block for long: every reading is bounded (a data directory holds few files,
``/proc`` reads are single small files).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from rpc.protos import coordinator_pb2 as api
from wal_segments.owner import ChannelOwner

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def owner_status(owner: ChannelOwner, lag_warn_ms: int) -> api.OwnerStatus:
    """`owner`'s view of its replica set; a replica whose oldest missing committed entry is
    older than `lag_warn_ms` is `lagging` (too slow for its owner)."""
    lags = owner.replica_lags_s()
    replicas = []
    for node_id, lsn in sorted(owner.replica_positions().items()):
        lag_ms = int(lags.get(node_id, 0.0) * 1000)
        replicas.append(
            api.ReplicaPosition(
                node_id=node_id, durable_lsn=lsn, lag_ms=lag_ms, lagging=lag_ms > lag_warn_ms
            )
        )
    return api.OwnerStatus(
        pchannel=owner.pchannel,
        term=owner.term,
        state=owner.state,
        last_lsn=owner.log.last_lsn,
        committed_lsn=owner.committed_lsn,
        replicas=replicas,
    )


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under `root` (bounded: a data dir holds few files)."""
    total = 0
    for count, path in enumerate(root.rglob("*")):
        if count >= 100_000:
            break
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total


def process_usage(pid: int) -> tuple[float, int] | None:
    """(CPU seconds used, user and system, resident bytes) of process `pid`; None when it
    is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
        with open(f"/proc/{pid}/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    # The command name (2nd field) is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        cpu_ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return None
    return cpu_ticks / _CLOCK_TICKS, resident_pages * _PAGE_BYTES


def process_status(kind: str, pid: int, index: int = 0, **fields: object) -> api.ProcessStatus:
    """A ``ProcessStatus`` with `pid`'s CPU time and resident memory (up: it exists)."""
    status = api.ProcessStatus(kind=kind, index=index, pid=pid, **fields)  # type: ignore[arg-type]
    usage = process_usage(pid) if pid > 0 else None
    if usage is not None:
        status.cpu_seconds, status.rss_bytes = usage
    elif "up" not in fields:
        status.up = False
    return status
