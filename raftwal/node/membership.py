"""Raft membership of a node: the role it runs in, and the leader's side of
``raftwal member add | remove | list``.

Lives here: the role file (``<data_dir>/role.json``), ``RoleSwitch`` (a node comparing its
role with the leader's settled voter set), and ``change_membership`` / ``list_members``
(what the leader does for the Coordinator RPCs).

How membership works:
- The voter set lives in the Raft log (pysyncobj membership entries, one change at a time,
  durable in the journal and the snapshots: ``raft.RaftPeer.change_membership``). The
  ``role`` in a node's ``[[nodes]]`` table is the role it starts in the first time (an
  empty data directory); after a change the node remembers its role in ``role.json``.
- Adding a voter promotes a data node (etcd's learner): it follows the log without voting
  and must be caught up; the leader appends the change, and once it commits the node sees
  the settled set in its heartbeat answer, writes ``role.json`` and restarts itself (a
  planned stop: it hands over first, then re-executes the same command line, same pid).
- Removing a voter: the node must hold nothing (no pchannel, no replica), which freezing
  it achieves; the leader appends the change, and the removed node, which never receives
  its own removal (the leader stops replicating to it at once), learns it from the
  heartbeat answer and restarts as a data node. Until then the others refuse its Raft
  connections: it is no member of theirs, so it cannot disturb them.

Must never: change the membership of a node that is not in the cluster configuration,
remove the last voter, or act on a voter set that is not settled (a change still
uncommitted may be undone by a new leader).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from raft.journal import write_file_atomically

log = logging.getLogger(__name__)

ROLE_FILE = "role.json"
ROLES = ("voter", "data")
# A data node may be promoted once it has applied the leader's log up to this many entries
# behind the commit index (it then counts toward commits at once).
MAX_PROMOTION_LAG_ENTRIES = 100


class RoleFileError(ValueError):
    """role.json exists but cannot be used; the message says what was found."""


def load_role(data_dir: Path, configured: str) -> str:
    """The role this node runs in: the one it remembers, else the configured one."""
    path = data_dir / ROLE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return configured
    try:
        role = json.loads(raw)["role"]
    except (ValueError, KeyError, TypeError) as error:
        raise RoleFileError(f'invalid {path} ({error}; expected {{"role": "voter"}})') from None
    if role not in ROLES:
        raise RoleFileError(f"invalid role in {path} ({role!r}; expected one of {ROLES})")
    return str(role)


def store_role(data_dir: Path, role: str) -> None:
    """Remember `role` durably (fsync of the file and the directory) before acting on it."""
    if role not in ROLES:
        raise ValueError(f"invalid role ({role!r}; expected one of {ROLES})")
    write_file_atomically(
        data_dir / ROLE_FILE, json.dumps({"role": role}).encode() + b"\n", durable=True
    )


def wanted_role(
    node_id: str, voter_node_ids: list[str] | tuple[str, ...], settled: bool
) -> str | None:
    """The role the leader's voter set gives this node; None while the set is not settled
    or carries no answer (an older leader, or none known)."""
    if not settled or not voter_node_ids:
        return None
    return "voter" if node_id in voter_node_ids else "data"
