"""Fault injection for tests: named fault points in the file and network layers, switched
on and off at runtime from a JSON file that the test controls.

Lives here: `FaultInjector`, the rule format and `install_from_environment(node_id)`,
which the node process calls once before it starts. Fault injection is off unless BOTH

    RAFTWAL_ENABLE_FAULTS=1
    RAFTWAL_FAULTS_FILE=<path of a JSON file>

are in the node's environment. RAFTWAL_FAULTS_FILE without RAFTWAL_ENABLE_FAULTS=1 is
refused (the node does not start: a stray variable must never make a node fail its
writes); RAFTWAL_ENABLE_FAULTS=1 alone installs nothing. When enabled, the node logs a
warning at start and re-reads the file whenever its mtime, size or inode changes, checked
at most every 100 ms, so a test switches faults on and off while the node runs. Write the
file under a temporary name and rename it over the old one, so that a node never reads
half of it. A missing file means no faults; an unreadable or invalid one is logged as an
error and the previous rules stay in force.

The file (every node of a test cluster reads the same one; `nodes` picks the victims):

    {"faults": [
        {"point": "wal.append", "action": "error", "errno": "ENOSPC",
         "nodes": ["n1"], "match": "/orders_0/"},
        {"point": "wal.fsync", "action": "delay", "delay_ms": 50},
        {"point": "replication.send", "action": "drop", "probability": 0.2}
    ]}

- ``point``: a name from `FAULT_POINTS`:
  * ``wal.append`` / ``wal.fsync``: every pwrite / fdatasync of a WAL segment file
    (`wal_segments/segment.py`); the subject is the file's path;
  * ``wal.delete``: every unlink of a WAL segment file by retention
    (`wal_segments/log.py`); the subject is the file's path;
  * ``raft.journal.write`` / ``raft.journal.fsync``: the Raft journal's group-commit write
    and fdatasync (`raft/journal.py`); the subject is the journal's path;
  * ``replication.send``: every AppendRequest an owner sends to a replica
    (`raftwal/services/streaming_node.py`); the subject is the pchannel name.
- ``action``: ``error`` (the call fails with OSError(errno) instead of running; file
  points), ``delay`` (wait ``delay_ms``, then make the call: a slow disk or link),
  ``drop`` (the message is silently not sent; network points).
- ``errno``: a name from the errno module, for ``error`` (default EIO).
- ``delay_ms``: 1..60000, for ``delay``.
- ``nodes``: the node ids the rule applies to (default: every node).
- ``match``: a substring the call's subject must contain (default: every call).
- ``probability``: 0 < p <= 1 (default 1), drawn for every call.
The first rule that applies to a call decides what happens to it.

Must never: be active without RAFTWAL_ENABLE_FAULTS=1; cost more than one global load and
a None test at a fault point while off; inject anything into `statemachine/` (pure: no
hooks there).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from raft import _faults as raft_faults
from raftwal.node.config import ConfigError
from wal_segments import faults as wal_faults

logger = logging.getLogger(__name__)

ENABLE_ENV = "RAFTWAL_ENABLE_FAULTS"
FILE_ENV = "RAFTWAL_FAULTS_FILE"
#: how often, at most, the file's mtime is checked
CHECK_INTERVAL_S = 0.1
MAX_DELAY_MS = 60_000

FILE_POINTS = wal_faults.FAULT_POINTS | raft_faults.IO_FAULT_POINTS
NETWORK_POINTS = frozenset({"replication.send"})
FAULT_POINTS = FILE_POINTS | NETWORK_POINTS
_ACTIONS_FOR = {
    **{point: frozenset({"error", "delay"}) for point in FILE_POINTS},
    **{point: frozenset({"drop", "delay"}) for point in NETWORK_POINTS},
}
_RULE_KEYS = frozenset({"point", "action", "errno", "delay_ms", "nodes", "match", "probability"})


@dataclass(frozen=True, slots=True)
class FaultRule:
    point: str
    action: str
    error_number: int = errno.EIO
    delay_ms: int = 0
    nodes: frozenset[str] = field(default_factory=frozenset)
    match: str = ""
    probability: float = 1.0


def parse_rule(raw: object) -> FaultRule:
    """One rule of the file; ValueError saying what was got and what was expected."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"invalid fault rule ({raw!r}; expected an object)")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise ValueError(
            f"invalid fault rule keys {sorted(unknown)} (expected {sorted(_RULE_KEYS)})"
        )
    point = raw.get("point")
    if point not in FAULT_POINTS:
        raise ValueError(f"invalid fault point ({point!r}; expected one of {sorted(FAULT_POINTS)})")
    action = raw.get("action")
    if action not in _ACTIONS_FOR[point]:
        raise ValueError(
            f"invalid action for {point} ({action!r}; expected one of "
            f"{sorted(_ACTIONS_FOR[point])})"
        )
    errno_name = raw.get("errno", "EIO")
    error_number = getattr(errno, errno_name, None) if isinstance(errno_name, str) else None
    if not isinstance(error_number, int) or not errno_name.startswith("E"):
        raise ValueError(f"invalid errno ({errno_name!r}; expected a name such as ENOSPC, EIO)")
    delay_ms = raw.get("delay_ms", 0)
    if action == "delay" and (
        not isinstance(delay_ms, int)
        or isinstance(delay_ms, bool)
        or not 1 <= delay_ms <= MAX_DELAY_MS
    ):
        raise ValueError(f"invalid delay_ms ({delay_ms!r}; expected 1..{MAX_DELAY_MS})")
    nodes = raw.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise ValueError(f"invalid nodes ({nodes!r}; expected a list of node ids)")
    match = raw.get("match", "")
    if not isinstance(match, str):
        raise ValueError(f"invalid match ({match!r}; expected a string)")
    probability = raw.get("probability", 1.0)
    if (
        not isinstance(probability, int | float)
        or isinstance(probability, bool)
        or not 0 < probability <= 1
    ):
        raise ValueError(f"invalid probability ({probability!r}; expected 0 < p <= 1)")
    return FaultRule(
        point=point,
        action=action,
        error_number=error_number,
        delay_ms=delay_ms if action == "delay" else 0,
        nodes=frozenset(nodes),
        match=match,
        probability=float(probability),
    )


def parse_rules(document: object) -> tuple[FaultRule, ...]:
    """The rules of a whole file (``{"faults": [...]}``)."""
    if not isinstance(document, Mapping) or set(document) != {"faults"}:
        raise ValueError(
            f'invalid faults file ({str(document)[:100]}; expected {{"faults": [...]}})'
        )
    rules = document["faults"]
    if not isinstance(rules, list):
        raise ValueError(f"invalid faults ({rules!r}; expected a list of rules)")
    return tuple(parse_rule(raw) for raw in rules)


class FaultInjector:
    """The rules of one faults file, as seen by one node. Safe to call from any thread:
    the event loop, asyncio's worker threads (fsync) and the Raft tick thread."""

    def __init__(self, path: Path, node_id: str, *, seed: int | None = None) -> None:
        self.path = path
        self.node_id = node_id
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._rules: tuple[FaultRule, ...] = ()
        self._signature: tuple[int, int, int] | None = None
        self._checked_at = float("-inf")
        #: "point:action" -> faults injected so far
        self.injected: dict[str, int] = {}

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked_at < CHECK_INTERVAL_S:
            return
        with self._lock:
            if now - self._checked_at < CHECK_INTERVAL_S:
                return
            self._checked_at = now
            try:
                stat = os.stat(self.path)
                signature: tuple[int, int, int] | None = (
                    stat.st_mtime_ns,
                    stat.st_size,
                    stat.st_ino,
                )
            except FileNotFoundError:
                signature = None
            if signature == self._signature:
                return
            self._signature = signature
            try:
                rules = () if signature is None else parse_rules(json.loads(self.path.read_text()))
            except (OSError, ValueError) as error:
                logger.error("faults file %s ignored, previous rules kept: %s", self.path, error)
                return
            mine = tuple(r for r in rules if not r.nodes or self.node_id in r.nodes)
            if mine != self._rules:
                logger.warning(
                    "fault injection on node %s: %d rule(s) now active: %s",
                    self.node_id,
                    len(mine),
                    [f"{r.point}:{r.action}" for r in mine],
                )
            self._rules = mine

    def rule_for(self, point: str, subject: str) -> FaultRule | None:
        """The rule that decides this call at `point`, or None (no fault)."""
        self._refresh()
        for rule in self._rules:
            if rule.point == point and rule.match in subject:
                if rule.probability >= 1 or self._random.random() < rule.probability:
                    self._count(rule, subject)
                    return rule
                return None
        return None

    def _count(self, rule: FaultRule, subject: str) -> None:
        # Logged for the first few and then every 100th, so a test (or a person) can see
        # that a fault fired without a line per call.
        key = f"{rule.point}:{rule.action}"
        with self._lock:
            count = self.injected[key] = self.injected.get(key, 0) + 1
        if count <= 3 or count % 100 == 0:
            logger.info("fault injected (%d so far): %s on %s", count, key, subject)

    def file_fault(self, point: str, subject: str) -> None:
        """The hook of the file points: raise the injected OSError, or sleep (a slow disk)
        in the calling thread, before the real call runs."""
        rule = self.rule_for(point, subject)
        if rule is None:
            return
        if rule.action == "delay":
            time.sleep(rule.delay_ms / 1000)
            return
        raise OSError(
            rule.error_number,
            f"{os.strerror(rule.error_number)} (injected fault at {point})",
            subject,
        )

    async def network_fault(self, point: str, subject: str) -> bool:
        """For the network points, on the event loop: waits out a delay; True when the
        message must be dropped."""
        rule = self.rule_for(point, subject)
        if rule is None:
            return False
        if rule.action == "delay":
            await asyncio.sleep(rule.delay_ms / 1000)
            return False
        return True


_injector: FaultInjector | None = None


def active() -> FaultInjector | None:
    """The injector of this process, or None when fault injection is off."""
    return _injector


def install(injector: FaultInjector | None) -> None:
    """Route every fault point of this process through `injector` (None: faults off)."""
    global _injector
    _injector = injector
    hook = injector.file_fault if injector is not None else None
    wal_faults.install(hook)
    raft_faults.install_io_fault_hook(hook)


def install_from_environment(
    node_id: str, environ: Mapping[str, str] = os.environ
) -> FaultInjector | None:
    """Enable fault injection when the environment asks for it (see the module doc).
    Raises ConfigError for a faults file without RAFTWAL_ENABLE_FAULTS=1."""
    path = environ.get(FILE_ENV, "")
    enabled = environ.get(ENABLE_ENV, "")
    if not path:
        return None
    if enabled != "1":
        raise ConfigError(
            f"{FILE_ENV} is set ({path!r}) but {ENABLE_ENV} is {enabled!r} (expected '1' to "
            "allow fault injection, which is for tests only)"
        )
    injector = FaultInjector(Path(path), node_id)
    install(injector)
    logger.warning("node %s: FAULT INJECTION ENABLED (tests only): rules from %s", node_id, path)
    return injector
