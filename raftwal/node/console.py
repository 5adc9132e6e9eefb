"""The read-only web console every node serves on its metrics port, at ``/console``.

What lives here:

- ``ConsoleFeed``: a task on the node's event loop builds one JSON snapshot of the cluster
  (ClusterStatus with every member's view, plus vchannels, committed segments,
  subscriptions, consumer shards and recent events from the applied state and the event
  store) every ``CONSOLE_REFRESH_S`` while someone polls, and keeps its bytes. The metrics
  endpoint's thread only hands out the newest bytes, so a console view never waits on the
  event loop, on Raft or on a peer, and a hundred open consoles cost one snapshot a second.
- ``ConsoleRoutes``: the HTTP side, called by ``raftwal.node.metrics_http`` for paths
  under ``/console``: the static page (HTML, JS, CSS shipped in ``console_static/``, no CDN,
  no build step) and ``/console/state.json``. Where the cluster uses tokens, the state
  needs ``Authorization: Bearer <token>`` of a role that may read (``reader``,
  ``consumer``, ``producer`` or ``admin``; see ``raftwal.node.security``): 401 without one,
  403 for the ``node`` role. The static files hold no data and are served to anyone.

What must never happen here: a write of any kind (the console proposes nothing and calls
only ClusterStatus's own collection), an unbounded table (every list is capped by a named
limit, and the response says when it was cut), or a token in a log line or a response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from raftwal.node.metrics import NODE_STATES, PCHANNEL_STATES
from raftwal.node.security import TokenTable, check_console
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from wal_segments.owner import TICK_LOGICAL_BITS

# The node (raftwal.node.process.Node) is taken as Any: importing it here, even for type
# checking only, would make an import cycle (process.py starts the console).
Node = Any

log = logging.getLogger(__name__)

# How often the snapshot is rebuilt while someone polls, and how long after the last poll
# it keeps being rebuilt (a closed tab stops costing anything after this).
CONSOLE_REFRESH_S = 1.0
CONSOLE_IDLE_S = 30.0
# While nobody polls, how often the task looks whether someone started.
CONSOLE_IDLE_TICK_S = 0.25
# Bounds of the snapshot: rows per table, events, segments listed per pchannel.
MAX_ROWS = 1000
MAX_EVENTS = 50
MAX_SEGMENTS_PER_PCHANNEL = 5
MAX_EVENT_SUMMARY_CHARS = 240

STATIC_DIR = Path(__file__).with_name("console_static")
STATIC_FILES = {
    "/console": ("index.html", "text/html; charset=utf-8"),
    "/console/": ("index.html", "text/html; charset=utf-8"),
    "/console/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/console/app.css": ("app.css", "text/css; charset=utf-8"),
}
STATE_PATH = "/console/state.json"
# Every console answer: nothing from elsewhere may load (self-contained, air-gapped), no
# inline script, no framing, no caching of the state.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str]


class ConsoleFeed:
    """The newest snapshot's bytes, shared between the event loop and the HTTP thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._polled_at = float("-inf")

    def poll(self) -> bytes | None:
        """The newest snapshot (None before the first); marks the console as watched."""
        with self._lock:
            self._polled_at = time.monotonic()
            return self._body

    def watched(self) -> bool:
        with self._lock:
            return time.monotonic() - self._polled_at < CONSOLE_IDLE_S

    def publish(self, body: bytes) -> None:
        with self._lock:
            self._body = body

    async def run(self, node: Node, stopping: asyncio.Event) -> None:
        """Rebuild the snapshot every CONSOLE_REFRESH_S while watched, until `stopping`."""
        while not stopping.is_set():
            if not self.watched():
                await asyncio.sleep(CONSOLE_IDLE_TICK_S)
                continue
            started = time.monotonic()
            try:
                snapshot = await build_snapshot(node)
                self.publish(json.dumps(snapshot, separators=(",", ":")).encode())
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 (the console must not stop the node)
                log.exception("console snapshot failed")
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(CONSOLE_IDLE_TICK_S, CONSOLE_REFRESH_S - elapsed))


class ConsoleRoutes:
    """What the metrics endpoint answers under /console (see the module docstring)."""

    def __init__(self, feed: ConsoleFeed, tokens: TokenTable | None) -> None:
        self._feed = feed
        self._tokens = tokens
        self._static: dict[str, tuple[bytes, str]] = {}
        for path, (name, content_type) in STATIC_FILES.items():
            self._static[path] = ((STATIC_DIR / name).read_bytes(), content_type)

    def __call__(self, path: str, headers: Mapping[str, str]) -> Answer | None:
        if path in self._static:
            body, content_type = self._static[path]
            return Answer(200, body, content_type, SECURITY_HEADERS)
        if path != STATE_PATH:
            return None
        if self._tokens is not None:
            refused = check_console(self._tokens, headers.get("authorization"))
            if refused is not None:
                status = 403 if refused.code == errors_pb2.PERMISSION_DENIED else 401
                body = json.dumps({"error": refused.message, "status": status}).encode()
                return Answer(status, body, "application/json", SECURITY_HEADERS)
        snapshot = self._feed.poll()
        if snapshot is None:
            pending = {"pending": True, "error": "the first snapshot is being built"}
            return Answer(503, json.dumps(pending).encode(), "application/json", SECURITY_HEADERS)
        return Answer(200, snapshot, "application/json", SECURITY_HEADERS)


# -- the snapshot ---------------------------------------------------------------------------


def _capped(
    rows: list[Any], truncated: dict[str, int], name: str, limit: int = MAX_ROWS
) -> list[Any]:
    if len(rows) > limit:
        truncated[name] = len(rows)
        return rows[:limit]
    return rows


def _tick_ms(time_tick: int) -> int:
    return time_tick >> TICK_LOGICAL_BITS


class _StateExtras:
    """What the console reads from the applied state beyond ClusterStatus (one read)."""

    def __init__(self, state: pb.CoordinationState) -> None:
        self.vchannels = [
            {
                "name": v.name,
                "id": v.id,
                "pchannel": v.pchannel,
                "state": pb.VChannelState.Name(v.state).removeprefix("VCHANNEL_STATE_"),
            }
            for _, v in sorted(state.vchannels.items())
        ]
        self.segments = []
        for name, manifest in sorted(state.manifests.items()):
            segments = list(manifest.segments)
            self.segments.append(
                {
                    "pchannel": name,
                    "count": len(segments),
                    "bytes": sum(s.bytes for s in segments),
                    "first_lsn": segments[0].first_lsn if segments else 0,
                    "last_lsn": segments[-1].last_lsn if segments else 0,
                    "committed_through_lsn": manifest.committed_through_lsn,
                    "retention_floor_lsn": manifest.deleted_before_lsn,
                    "latest": [
                        {
                            "segment_id": s.segment_id,
                            "first_lsn": s.first_lsn,
                            "last_lsn": s.last_lsn,
                            "count": s.count,
                            "bytes": s.bytes,
                            "replicas": list(s.replica_node_ids),
                        }
                        for s in segments[-MAX_SEGMENTS_PER_PCHANNEL:]
                    ],
                }
            )
        self.subscriptions: list[dict[str, Any]] = []
        for name, sub in sorted(state.subscriptions.items()):
            holders = {
                vchannel: (member.member_id, member.generation)
                for member in sub.members.values()
                for vchannel in member.vchannels
            }
            self.subscriptions.append(
                {
                    "name": name,
                    "holds_retention": sub.holds_retention,
                    "start": pb.SubscriptionStart.Name(sub.start).removeprefix(
                        "SUBSCRIPTION_START_"
                    ),
                    "members": [
                        {
                            "member_id": m.member_id,
                            "generation": m.generation,
                            "vchannels": list(m.vchannels),
                        }
                        for _, m in sorted(sub.members.items())
                    ],
                    "positions": [
                        {
                            "vchannel": vchannel,
                            "pchannel": state.vchannels[vchannel].pchannel
                            if vchannel in state.vchannels
                            else "",
                            "lsn": sub.positions[vchannel].lsn if vchannel in sub.positions else 0,
                            "time_tick_ms": _tick_ms(sub.positions[vchannel].time_tick)
                            if vchannel in sub.positions
                            else 0,
                            "member_id": holders.get(vchannel, ("", 0))[0],
                            "generation": holders.get(vchannel, ("", 0))[1],
                        }
                        for vchannel in sub.vchannels
                    ],
                }
            )


def _event_row(event: pb.Event) -> dict[str, Any]:
    kind = event.WhichOneof("body") or "unknown"
    body = MessageToDict(getattr(event, kind), preserving_proto_field_name=True) if kind else {}
    summary = json.dumps(body, separators=(", ", ": "))
    if len(summary) > MAX_EVENT_SUMMARY_CHARS:
        summary = summary[: MAX_EVENT_SUMMARY_CHARS - 3] + "..."
    return {"revision": event.revision, "time_ms": event.time_ms, "kind": kind, "summary": summary}


async def build_snapshot(node: Node) -> dict[str, Any]:
    """One view of the cluster as this node sees it (its applied state, every member's
    CollectStatus answer), JSON-able and bounded."""
    status = await node.cluster_status(linearizable=False)
    extras = node.replica.read(_StateExtras)
    store = node.replica.store
    last = await asyncio.to_thread(store.last_revision)
    first = max(store.first_retained(), last - MAX_EVENTS + 1, 1)
    events = await asyncio.to_thread(store.read, first, MAX_EVENTS) if last else []
    now_ms = int(time.time() * 1000)
    truncated: dict[str, int] = {}

    node_rows = {n.node_id: n for n in status.nodes}
    down = {n.node_id for n in status.nodes if n.state == pb.NODE_STATE_DOWN}
    members = []
    for member in status.members:
        registered = node_rows.get(member.node_id)
        state = NODE_STATES.get(registered.state, "?") if registered is not None else "UNREGISTERED"
        members.append(
            {
                "node_id": member.node_id,
                "role": member.role,
                "grpc_address": member.grpc_address,
                "reachable": member.reachable,
                "state": state,
                "frozen": bool(registered.frozen) if registered is not None else False,
                "is_leader": member.is_leader or member.node_id == status.leader_node_id,
                "raft_term": member.raft_term,
                "commit_index": member.commit_index,
                "applied_index": member.applied_index,
                "durable_index": member.durable_index,
                "revision": member.revision,
                "data_dir_bytes": member.data_dir_bytes,
                "pid": member.pid,
                # Each data directory against its watermarks (ok, soft, hard), and Raft's
                # disk reserve (released: the disk filled up to the last byte).
                "disks": [
                    {
                        "dir": disk.dir,
                        "level": disk.level,
                        "free_bytes": disk.free_bytes,
                        "total_bytes": disk.total_bytes,
                        "hard_mark_free_bytes": disk.hard_mark_free_bytes,
                    }
                    for disk in member.disks
                ],
                "raft_reserve_released": member.raft_reserve_bytes
                < member.raft_reserve_wanted_bytes,
            }
        )
    # Every process of every member: supervisor, control process, data workers.
    processes = [
        {
            "node_id": member.node_id,
            "kind": process.kind,
            "index": process.index,
            "pid": process.pid,
            "up": process.up or process.kind != "worker",
            "cpu_seconds": round(process.cpu_seconds, 2),
            "rss_bytes": process.rss_bytes,
            "grpc_address": process.grpc_address,
            "transfer_port": process.transfer_port,
            "restarts": process.restarts,
            "owned_pchannels": list(process.owned_pchannels),
            "logs": process.replica_pchannels,
        }
        for member in status.members
        for process in member.processes
    ]
    # Each pchannel's serving owner's view, and the WAL bytes on every member's disk.
    owner_view: dict[str, api.OwnerStatus] = {}
    disk_bytes: dict[str, int] = {}
    for member in status.members:
        for owner in member.owners:
            if owner.state == "serving" or owner.pchannel not in owner_view:
                owner_view[owner.pchannel] = owner
        for usage in member.wal_disk:
            disk_bytes[usage.pchannel] = disk_bytes.get(usage.pchannel, 0) + usage.bytes
    short = {u.pchannel: u for u in status.under_replicated}
    retention = {r.pchannel: r for r in status.retention}
    pchannels = []
    for channel in status.pchannels:
        owner = owner_view.get(channel.name)
        durable = {r.node_id: r.durable_lsn for r in owner.replicas} if owner is not None else {}
        lagging = (
            {r.node_id: r.lag_ms for r in owner.replicas if r.lagging} if owner is not None else {}
        )
        kept = retention.get(channel.name)
        under = short.get(channel.name)
        pchannels.append(
            {
                "name": channel.name,
                "state": PCHANNEL_STATES.get(channel.state, "?"),
                # its WAL implementation, and its stage in a WAL switch ("" when none)
                "wal": channel.wal or "segments",
                "wal_alter_stage": _alter_stage(status, channel.name),
                "term": channel.term,
                "owner_node_id": channel.owner_node_id,
                "owner_state": owner.state if owner is not None else "",
                "last_lsn": owner.last_lsn if owner is not None else 0,
                "committed_lsn": owner.committed_lsn if owner is not None else 0,
                "replicas": [
                    {
                        "node_id": n,
                        "durable_lsn": durable.get(n),
                        "down": n in down,
                        # too slow for its owner: how long it has been behind (ms)
                        "lagging_ms": lagging.get(n),
                    }
                    for n in channel.replica_node_ids
                ],
                "retention_floor_lsn": kept.deleted_before_lsn if kept is not None else 0,
                "committed_segments": kept.committed_segments if kept is not None else 0,
                "committed_bytes": kept.committed_bytes if kept is not None else 0,
                "disk_bytes": disk_bytes.get(channel.name, 0),
                "under_replicated": under is not None,
                "live_replicas": under.live if under is not None else len(channel.replica_node_ids),
                "wanted_replicas": under.wanted if under is not None else 0,
            }
        )
    # Cross-cluster replicators, from the members running them (the serving owners of
    # source pchannels): their lag and apply rate as they last measured them.
    replication = [
        {
            "node_id": member.node_id,
            # Every field, numbers as numbers (MessageToDict spells int64 as strings).
            **{f.name: getattr(replicator, f.name) for f in replicator.DESCRIPTOR.fields},
        }
        for member in status.members
        for replicator in member.replicators
    ]
    committed = {name: view.committed_lsn for name, view in owner_view.items()}
    shards = []
    for subscription in extras.subscriptions:
        for position in subscription["positions"]:
            known = position["pchannel"] in committed
            lag = max(0, committed[position["pchannel"]] - position["lsn"]) if known else None
            position["committed_lsn"] = committed.get(position["pchannel"])
            position["lag_entries"] = lag
            position["lag_ms"] = (
                max(0, now_ms - position["time_tick_ms"]) if position["time_tick_ms"] else None
            )
            shards.append(
                {
                    "subscription": subscription["name"],
                    "vchannel": position["vchannel"],
                    "member_id": position["member_id"],
                    "generation": position["generation"],
                    "state": "ASSIGNED" if position["member_id"] else "UNASSIGNED",
                    "position_lsn": position["lsn"],
                    "lag_entries": lag,
                }
            )
    return {
        "generated_at_ms": now_ms,
        "answered_by": node.me.id,
        "revision": status.revision,
        "leader_node_id": status.leader_node_id,
        "warnings": _capped(list(status.warnings), truncated, "warnings"),
        "counts": {
            "leases": status.leases,
            "locks": status.locks,
            "pending_broadcasts": status.pending_broadcasts,
            "nodes": len(status.nodes),
            "pchannels": len(status.pchannels),
            "vchannels": len(extras.vchannels),
            "subscriptions": len(extras.subscriptions),
        },
        "members": members,
        "processes": _capped(processes, truncated, "processes"),
        "pchannels": _capped(pchannels, truncated, "pchannels"),
        "vchannels": _capped(extras.vchannels, truncated, "vchannels"),
        "segments": _capped(extras.segments, truncated, "segments"),
        "subscriptions": _capped(extras.subscriptions, truncated, "subscriptions"),
        "shards": _capped(shards, truncated, "shards"),
        "replication": _capped(replication, truncated, "replication"),
        "events": [_event_row(e) for e in reversed(events[-MAX_EVENTS:])],
        "truncated": truncated,
    }


__all__ = ["ConsoleFeed", "ConsoleRoutes", "build_snapshot"]


def _alter_stage(status: api.ClusterStatusResponse, pchannel: str) -> str:
    """The pchannel's stage in the WAL switch in progress ("" when none), with its target."""
    if not status.HasField("wal_alter"):
        return ""
    entry = status.wal_alter.pchannels.get(pchannel)
    if entry is None:
        return ""
    stage = pb.WalAlterStage.Name(entry.stage).removeprefix("WAL_ALTER_STAGE_")
    return f"{stage} to {status.wal_alter.target or 'segments'}"
