"""`raftwal replicate set FILE | clear | show | status | promote | switchover --to ID`: the
cross-cluster replication configuration (docs/replication.md) from the command line.

FILE is TOML: one ``[[clusters]]`` table per cluster (``id``, ``endpoints``, ``pchannels``
in order, and optional ``token_file`` / ``ca_file``, paths relative to FILE) and one
``[[topology]]`` table per edge (``source``, ``target``). Tokens come from files, never
from the command line or FILE itself, so that FILE can be shared and kept in version
control while the token files stay 0600. ``set`` replaces the configuration of every
cluster FILE names with FILE's, each reached at its endpoints with its own token
and CA file (``--here``: only the cluster the CLI talks to, ``--endpoints`` or the dev
cluster, with the flags' credentials); ``clear`` empties the CLI's cluster's one;
``show`` prints it as the cluster answers it, tokens redacted. ``switchover`` drives a
planned swap through configuration updates (the write pause is the configuration's
``switchover``, kept in Raft) and waits for the drain the source's replicators record. This
module only parses, calls the SDK and prints: the clusters validate and enforce.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import grpc
from rich.table import Table

from raftwal.cli.client import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    Target,
    _console,
    _handler,
    _print_json,
    client_security,
    common_arguments,
    message_to_json,
)
from raftwal.node.replicator import cluster_security
from rpc.client import CoordinatorClient, RaftwalError
from rpc.credentials import ClientSecurity, CredentialsError
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.streaming.routing import StreamingClientBase
from statemachine.replicate import mismatch_warning
from wal_segments.owner import TICK_LOGICAL_BITS

log = logging.getLogger(__name__)

# Bounds on what FILE may name (the cluster bounds the configuration itself).
MAX_FILE_BYTES = 1 << 20
MAX_SECRET_FILE_BYTES = 1 << 16
_CLUSTER_KEYS = frozenset({"id", "endpoints", "pchannels", "token_file", "ca_file"})
_EDGE_KEYS = frozenset({"source", "target"})


class ReplicateFileError(CliError):
    """FILE is unreadable or not a replication configuration; the message says where."""


def _strings(table: dict[str, object], key: str, where: str) -> list[str]:
    value = table.get(key)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ReplicateFileError(
            f"invalid {where}.{key} ({value!r:.60}; expected a list of strings)"
        )
    return [str(item) for item in value]


def _string(table: dict[str, object], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str):
        raise ReplicateFileError(f"invalid {where}.{key} ({value!r:.60}; expected a string)")
    return value


def _read_small(path: Path, what: str) -> str:
    """The text of a token or CA file, never echoed (only its path and size are)."""
    try:
        size = path.stat().st_size
        if size > MAX_SECRET_FILE_BYTES:
            raise ReplicateFileError(
                f"{what} {path} is too large ({size} bytes; expected at most "
                f"{MAX_SECRET_FILE_BYTES})"
            )
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ReplicateFileError(f"cannot read {what} {path}: {type(error).__name__}") from None


def parse_replicate_file(data: dict[str, object], base_dir: Path) -> pb.ReplicateConfiguration:
    """The configuration a parsed FILE describes (token and CA files read, relative to
    `base_dir`). Raises ReplicateFileError naming the table and key at fault."""
    unknown = sorted(set(data) - {"clusters", "topology"})
    if unknown:
        raise ReplicateFileError(
            f"unknown top-level keys {unknown} (expected [[clusters]] and [[topology]] tables)"
        )
    clusters = data.get("clusters", [])
    edges = data.get("topology", [])
    if not isinstance(clusters, list) or not isinstance(edges, list):
        raise ReplicateFileError(
            "invalid clusters or topology (expected arrays of tables: [[clusters]], [[topology]])"
        )
    configuration = pb.ReplicateConfiguration()
    for index, table in enumerate(clusters):
        where = f"clusters[{index}]"
        if not isinstance(table, dict):
            raise ReplicateFileError(f"invalid {where} ({table!r:.60}; expected a table)")
        extra = sorted(set(table) - _CLUSTER_KEYS)
        if extra:
            raise ReplicateFileError(
                f"unknown keys {extra} in {where} (expected {', '.join(sorted(_CLUSTER_KEYS))})"
            )
        cluster = configuration.clusters.add(
            cluster_id=_string(table, "id", where),
            endpoints=_strings(table, "endpoints", where),
            pchannels=_strings(table, "pchannels", where),
        )
        if "token_file" in table:
            path = base_dir / _string(table, "token_file", where)
            cluster.credentials.token = _read_small(path, f"{where}.token_file")
        if "ca_file" in table:
            path = base_dir / _string(table, "ca_file", where)
            cluster.credentials.ca_certificate_pem = _read_small(path, f"{where}.ca_file")
    for index, table in enumerate(edges):
        where = f"topology[{index}]"
        if not isinstance(table, dict) or set(table) != _EDGE_KEYS:
            raise ReplicateFileError(
                f"invalid {where} ({sorted(table) if isinstance(table, dict) else table!r:.60}; "
                'expected a table with source = "ID" and target = "ID")'
            )
        configuration.topology.add(
            source_cluster_id=_string(table, "source", where),
            target_cluster_id=_string(table, "target", where),
        )
    return configuration


def load_replicate_file(path: Path) -> pb.ReplicateConfiguration:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ReplicateFileError(
                f"{path} is too large ({size} bytes; expected at most {MAX_FILE_BYTES})"
            )
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise ReplicateFileError(f"cannot read {path}: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ReplicateFileError(f"invalid TOML in {path}: {error}") from None
    return parse_replicate_file(data, path.parent)


def register(commands: argparse._SubParsersAction) -> None:
    common = common_arguments()
    replicate = commands.add_parser(
        "replicate",
        help="cross-cluster replication: the configuration (admin only)",
        description="A replication configuration names clusters (id, endpoints, "
        "credentials, pchannels in order) and source -> target edges. It is kept in Raft "
        "and replaced whole; tokens are stored as given and never shown.",
    )
    replicate_commands = replicate.add_subparsers(dest="replicate_command", metavar="ACTION")
    replicate_commands.required = True
    setter = replicate_commands.add_parser(
        "set",
        parents=[common],
        help="replace the configuration of every cluster in FILE (TOML) with FILE's",
        description="Each cluster of FILE is reached at its endpoints with its token_file "
        "and ca_file (the flags' credentials are not used), in FILE's order; the first "
        "refusal stops it. With --here, only the cluster the flags name.",
    )
    setter.add_argument("file", type=Path, metavar="FILE", help="the configuration (TOML)")
    setter.add_argument(
        "--here",
        action="store_true",
        help="apply it only to the cluster --endpoints (or the dev cluster) names, with the "
        "flags' credentials",
    )
    setter.set_defaults(handler=_set_handler)
    clear = replicate_commands.add_parser(
        "clear", parents=[common], help="remove the configuration (no replication)"
    )
    clear.set_defaults(handler=_handler(_replicate_clear))
    status = replicate_commands.add_parser(
        "status",
        parents=[common],
        help="per source pchannel: committed LSN, where the target stands, the lag in "
        "entries, bytes and seconds, the apply rate, and one line for a target that cannot "
        "keep up",
        description="Run against the source cluster. Where a replicator runs (on the source "
        "pchannel's owner), its own figures of about a second ago: what the target "
        "acknowledged, the committed LSNs after it, their bytes and the age of the oldest, "
        "and the rates at which the target applies and the source commits over the last "
        "30 s. Where none runs, the checkpoint last recorded in Raft and the source's data "
        "entries after it. The state is the replicator's: starting, replicating, caught up, "
        "retrying, source_gap (the target needs entries the source's retention deleted: "
        "nothing can be sent; exit status 1), or not_running (no owner serves the pchannel, "
        "or its replicator has not started yet).",
    )
    status.set_defaults(handler=_handler(_replicate_status))
    promote = replicate_commands.add_parser(
        "promote",
        parents=[common],
        help="make this target cluster writable when its source is gone; prints, per "
        "pchannel, the last source LSN it holds (what came after may be lost)",
        description="Removes the edge into this cluster from its configuration (this "
        "cluster only: the source is assumed gone) and reports where each pchannel stands.",
    )
    promote.set_defaults(handler=_handler(_replicate_promote))
    switchover = replicate_commands.add_parser(
        "switchover",
        parents=[common],
        help="planned swap: the source pauses client writes, its target catches up, then "
        "the edge is reversed (the target becomes the source); prints the write pause",
        description="Run against any cluster of the configuration; every cluster of the "
        "swapped edge is reached at its configured endpoints with the flags' token (and "
        "its configured CA). Safe to run again after a crash or a timeout: it finishes "
        "or redoes what is left.",
    )
    switchover.add_argument(
        "--to", required=True, metavar="ID", help="the target cluster that becomes the source"
    )
    switchover.add_argument(
        "--drain-timeout-s",
        type=float,
        default=DRAIN_TIMEOUT_S,
        help="how long the source's writes may stay paused waiting for the target to hold "
        f"every entry; past it the pause is undone and the command fails (default: "
        f"{DRAIN_TIMEOUT_S:g})",
    )
    switchover.set_defaults(handler=_handler(_replicate_switchover))
    show = replicate_commands.add_parser(
        "show", parents=[common], help="the configuration, tokens redacted"
    )
    show.set_defaults(handler=_handler(_replicate_show))


async def _replicate_set(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    return await _apply(args, client, load_replicate_file(args.file), "replaced", "unchanged")


def _set_handler(args: argparse.Namespace) -> int:
    if args.here:
        return _handler(_replicate_set)(args)
    try:
        return asyncio.run(_set_everywhere(args))
    except (CliError, CredentialsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


async def _set_everywhere(args: argparse.Namespace) -> int:
    configuration = load_replicate_file(args.file)
    if not configuration.clusters:
        raise CliError(
            f"{args.file} names no cluster (expected [[clusters]] tables; `raftwal replicate "
            "clear --endpoints ...` clears one cluster's configuration)"
        )
    applied: list[dict[str, object]] = []
    for cluster in configuration.clusters:
        async with CoordinatorClient(
            list(cluster.endpoints), timeout_s=args.timeout_s, security=cluster_security(cluster)
        ) as client:
            try:
                response = await client.update_replicate_configuration(configuration)
            except RaftwalError as error:
                done = ", ".join(str(a["cluster_id"]) for a in applied) or "none"
                print(
                    f"error: cluster {cluster.cluster_id}: {error} (applied to: {done})",
                    file=sys.stderr,
                )
                return EXIT_ERROR
        applied.append(
            {
                "cluster_id": cluster.cluster_id,
                "revision": response.revision,
                "changed": response.changed,
            }
        )
        if not args.json:
            state = "replaced" if response.changed else "unchanged (already this one)"
            _console().print(
                f"cluster {cluster.cluster_id}: replication configuration {state} at "
                f"revision {response.revision}"
            )
    if args.json:
        _print_json({"clusters": applied})
    return 0


async def _replicate_clear(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    return await _apply(args, client, pb.ReplicateConfiguration(), "cleared", "already empty")


async def _apply(
    args: argparse.Namespace,
    client: CoordinatorClient,
    configuration: pb.ReplicateConfiguration,
    changed: str,
    unchanged: str,
) -> int:
    response = await client.update_replicate_configuration(configuration)
    if args.json:
        _print_json(response)
        return 0
    state = changed if response.changed else unchanged
    _console().print(f"replication configuration {state} at revision {response.revision}")
    return 0


async def _replicate_show(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.get_replicate_configuration()
    if args.json:
        _print_json(message_to_json(response))
        return 0
    console = _console()
    configuration = response.configuration
    console.print(
        f"this cluster [bold]{response.cluster_id or '(no cluster_id)'}[/]  "
        f"revision {response.revision}"
    )
    if not configuration.clusters:
        console.print("no replication configuration")
        return 0
    clusters = Table(title="clusters")
    for column in ("id", "endpoints", "pchannels", "token", "TLS"):
        clusters.add_column(column)
    for cluster in configuration.clusters:
        clusters.add_row(
            cluster.cluster_id + (" (this)" if cluster.cluster_id == response.cluster_id else ""),
            ", ".join(cluster.endpoints),
            ", ".join(cluster.pchannels),
            "set" if cluster.credentials.token_set else "-",
            "CA given" if cluster.credentials.ca_certificate_pem else "plaintext",
        )
    console.print(clusters)
    edges = ", ".join(
        f"{edge.source_cluster_id} -> {edge.target_cluster_id}" for edge in configuration.topology
    )
    console.print(f"topology: {edges or 'no edges'}")
    return 0


# ---------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------

#: How long `status` reads a source pchannel's unreplicated entries to count them.
STATUS_READ_S = 2.0
#: How long `status` waits for a pchannel's owner.
STATUS_ROUTE_S = 10.0
#: Counted at most per pchannel (the lag shows as ">= N" past it).
STATUS_MAX_COUNT = 100_000


async def _unreplicated(
    client: StreamingClientBase, pchannel: str, after: int, committed: int
) -> tuple[int, int]:
    """(data entries of `pchannel` in (after, committed], time tick of the first one or 0)."""
    if after >= committed:
        return 0, 0
    route = await client.router.owner(pchannel, STATUS_ROUTE_S)
    call = client.stub(route.owner_address).Consume(
        wire.ConsumeRequest(pchannel=pchannel, policy=wire.DELIVER_POLICY_START_AFTER, lsn=after),
        timeout=STATUS_READ_S,
    )
    count, first_tick = 0, 0
    try:
        async for response in call:
            for entry in response.entries:
                if entry.lsn > committed or count >= STATUS_MAX_COUNT:
                    return count, first_tick
                count += 1
                first_tick = first_tick or entry.time_tick
            if response.entries and response.entries[-1].lsn >= committed:
                break
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    finally:
        call.cancel()
    return count, first_tick


async def _replicate_status(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    answer = await client.get_replicate_configuration()
    local = answer.cluster_id
    rows: list[dict[str, object]] = []
    clusters = {c.cluster_id: c for c in answer.configuration.clusters}
    now_ms = int(time.time() * 1000)
    # The replicators' own measurements (lag in entries, bytes and seconds, apply rate),
    # from the members that run them: the serving owners of the source pchannels.
    live: dict[tuple[str, str], api.ReplicatorStatus] = {}
    with contextlib.suppress(RaftwalError):
        cluster = await client.cluster_status(linearizable=False)
        for member in cluster.members:
            for replicator in member.replicators:
                key = (replicator.pchannel, replicator.target_cluster_id)
                if key not in live or replicator.term > live[key].term:
                    live[key] = replicator
    async with StreamingClientBase(client) as streaming:
        for edge in answer.configuration.topology:
            if edge.source_cluster_id != local or local not in clusters:
                continue
            target_cluster = clusters[edge.target_cluster_id]
            for index, pchannel in enumerate(clusters[local].pchannels):
                route = await streaming.router.owner(pchannel, args.timeout_s)
                latest = await streaming.stub(route.owner_address).GetLatestTimeTick(
                    wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=args.timeout_s
                )
                recorded = max(
                    answer.checkpoints[pchannel].source_lsns.get(edge.target_cluster_id, 0),
                    # A reversed edge starts after what its target wrote itself.
                    edge.start_after_lsns[index] if edge.start_after_lsns else 0,
                )
                # A target checkpoint above what the source committed, which its
                # replicator refused (docs/replication.md): the standby does not match.
                claimed = answer.checkpoints[pchannel].mismatched_lsns.get(
                    edge.target_cluster_id, 0
                )
                replicator = live.get((pchannel, edge.target_cluster_id))
                state = replicator.state if replicator is not None else "not_running"
                if state == "source_gap":
                    assert replicator is not None
                    # What the target lacks is gone here: nothing left to count.
                    lag = latest.committed_lsn - replicator.needed_lsn + 1
                    first_tick = 0
                else:
                    lag, first_tick = await _unreplicated(
                        streaming, pchannel, recorded, latest.committed_lsn
                    )
                lag_s = (
                    max(0.0, (now_ms - (first_tick >> TICK_LOGICAL_BITS)) / 1000) if lag else 0.0
                )
                row: dict[str, object] = {
                    "source_cluster_id": local,
                    "pchannel": pchannel,
                    "target_cluster_id": edge.target_cluster_id,
                    "target_pchannel": target_cluster.pchannels[index],
                    "source_committed_lsn": latest.committed_lsn,
                    "target_checkpoint_lsn": recorded,
                    "lag_entries": lag,
                    "lag_entries_capped": lag >= STATUS_MAX_COUNT,
                    "lag_s": round(lag_s, 3),
                    "target_claims_lsn": claimed,
                    "checkpoint_mismatch": bool(claimed),
                    # What the running replicator measured (None: none runs, e.g. the
                    # owner is down or the configuration was just set).
                    "replicator": None,
                    "state": "not_running",
                    "needed_lsn": 0,
                    "source_first_lsn": 0,
                }
                running = live.get((pchannel, edge.target_cluster_id))
                if running is not None:
                    row["state"] = running.state
                    row["needed_lsn"] = running.needed_lsn
                    row["source_first_lsn"] = running.source_first_lsn
                if running is not None:
                    row["replicator"] = {
                        "state": running.state,
                        "term": running.term,
                        "target_lsn": running.target_lsn,
                        "lag_entries": running.lag_entries,
                        "lag_bytes": running.lag_bytes,
                        "lag_s": round(running.lag_s, 3),
                        "apply_rate_entries_s": running.apply_rate_entries_s,
                        "apply_rate_bytes_s": running.apply_rate_bytes_s,
                        "commit_rate_entries_s": running.commit_rate_entries_s,
                        "inflight_batches": running.inflight_batches,
                        "inflight_bytes": running.inflight_bytes,
                        "keeping_up": running.keeping_up,
                        "summary": running.summary,
                        "last_error": running.last_error,
                        "measured_at_ms": running.measured_at_ms,
                    }
                rows.append(row)
    stopped = [row for row in rows if row["state"] == "source_gap"]
    if args.json:
        _print_json({"cluster_id": local, "pchannels": rows})
        return 1 if stopped else 0
    console = _console()
    if not rows:
        console.print(f"cluster {local or '(no cluster_id)'} replicates nothing")
        return 0
    table = Table(title=f"replication from {local}")
    columns = ("pchannel", "target", "state", "source committed", "target holds", "lag",
               "lag bytes", "lag s", "applies/s", "commits/s", "in flight")  # fmt: skip
    for column in columns:
        table.add_column(column)
    lines = []
    for row in rows:
        measured = row["replicator"]
        if isinstance(measured, dict):
            running_row: dict[str, Any] = measured
            table.add_row(
                str(row["pchannel"]),
                f"{row['target_cluster_id']}/{row['target_pchannel']}",
                str(running_row["state"]),
                str(row["source_committed_lsn"]),
                str(running_row["target_lsn"]) + _claim(row),
                str(running_row["lag_entries"]),
                _human_bytes(int(running_row["lag_bytes"])),
                f"{running_row['lag_s']:.1f}",
                f"{running_row['apply_rate_entries_s']:,.0f}",
                f"{running_row['commit_rate_entries_s']:,.0f}",
                f"{running_row['inflight_batches']} ({_human_bytes(int(running_row['inflight_bytes']))})",
            )
            if running_row["summary"] and not row["checkpoint_mismatch"]:
                lines.append(str(running_row["summary"]))
        else:
            table.add_row(
                str(row["pchannel"]),
                f"{row['target_cluster_id']}/{row['target_pchannel']}",
                "no replicator",
                str(row["source_committed_lsn"]),
                str(row["target_checkpoint_lsn"]) + _claim(row),
                (">= " if row["lag_entries_capped"] else "") + str(row["lag_entries"]),
                "-",
                str(row["lag_s"]),
                "-",
                "-",
                "-",
            )
    console.print(table)
    for line in lines:
        console.print(f"[bold red]{line}[/]")
    for row in rows:
        if row["checkpoint_mismatch"]:
            warning = mismatch_warning(
                str(row["pchannel"]), str(row["target_cluster_id"]), row["target_claims_lsn"]
            )
            console.print(f"[bold red]{warning}[/]")
    # A target that needs what the source no longer holds cannot be served: say so in the
    # exit status too (docs/replication.md).
    return 1 if stopped else 0


def _claim(row: dict[str, Any]) -> str:
    """The "target holds" cell's note for a target whose checkpoint does not match."""
    if row["checkpoint_mismatch"]:
        return f" (MISMATCH: target claims {row['target_claims_lsn']})"
    return ""


def _human_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------
# promote
# ---------------------------------------------------------------------------------------


async def _replicate_promote(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    answer = await client.get_replicate_configuration()
    local = answer.cluster_id
    configuration = answer.configuration
    edges = [e for e in configuration.topology if e.target_cluster_id == local]
    if not edges:
        listed = ", ".join(
            f"{e.source_cluster_id} -> {e.target_cluster_id}" for e in configuration.topology
        )
        raise CliError(
            f"cluster {local or '(no cluster_id)'} is not a replication target (got topology "
            f"{listed or 'empty'}; expected an edge into it)"
        )
    source_id = edges[0].source_cluster_id
    clusters = {c.cluster_id: c for c in configuration.clusters}
    # What this cluster holds of each source pchannel, read before it stops being a target.
    rows: list[dict[str, object]] = []
    async with StreamingClientBase(client) as streaming:
        for index, pchannel in enumerate(clusters[local].pchannels):
            source_pchannel = clusters[source_id].pchannels[index]
            route = await streaming.router.owner(pchannel, args.timeout_s)
            held = await streaming.stub(route.owner_address).GetReplicateCheckpoint(
                wire.GetReplicateCheckpointRequest(
                    pchannel=pchannel, source_cluster_id=source_id, source_pchannel=source_pchannel
                ),
                timeout=args.timeout_s,
            )
            rows.append(
                {
                    "pchannel": pchannel,
                    "source_pchannel": source_pchannel,
                    "last_source_lsn": held.source_lsn,
                }
            )
    promoted = pb.ReplicateConfiguration()
    promoted.CopyFrom(configuration)
    del promoted.topology[:]
    promoted.topology.extend(e for e in configuration.topology if e.target_cluster_id != local)
    # Get answers hide tokens (token_set marks them): sent back so, each cluster keeps the
    # token it stores. The source's is dropped: the source is gone from the topology's use.
    for cluster in promoted.clusters:
        if cluster.cluster_id == source_id:
            cluster.credentials.token = ""
            cluster.credentials.token_set = False
    response = await client.update_replicate_configuration(promoted)
    if args.json:
        _print_json(
            {
                "cluster_id": local,
                "source_cluster_id": source_id,
                "revision": response.revision,
                "pchannels": rows,
            }
        )
        return 0
    console = _console()
    console.print(
        f"cluster {local} is writable: no longer a target of {source_id} (revision "
        f"{response.revision}); entries of {source_id} after these may be lost:"
    )
    table = Table()
    for column in ("pchannel", f"{source_id} pchannel", "last source LSN held"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["pchannel"]), str(row["source_pchannel"]), str(row["last_source_lsn"])
        )
    console.print(table)
    return 0


# ---------------------------------------------------------------------------------------
# switchover
# ---------------------------------------------------------------------------------------

#: Default bound on the write pause spent waiting for the drain.
DRAIN_TIMEOUT_S = 60.0
#: How often the drain is polled (a Raft read on the source).
DRAIN_POLL_S = 0.05


class SwitchoverTimeout(CliError):
    """The target did not catch up within --drain-timeout-s; the source's write pause was
    undone (the message says which pchannels lagged)."""


def _edges(configuration: pb.ReplicateConfiguration) -> list[tuple[str, str]]:
    return [(e.source_cluster_id, e.target_cluster_id) for e in configuration.topology]


def _without_switchover(configuration: pb.ReplicateConfiguration) -> pb.ReplicateConfiguration:
    copy = pb.ReplicateConfiguration()
    copy.CopyFrom(configuration)
    copy.ClearField("switchover")
    return copy


def _paused(
    configuration: pb.ReplicateConfiguration, source: str, target: str
) -> pb.ReplicateConfiguration:
    copy = _without_switchover(configuration)
    copy.switchover.CopyFrom(
        pb.ReplicateSwitchover(source_cluster_id=source, target_cluster_id=target)
    )
    return copy


def _reversed(
    configuration: pb.ReplicateConfiguration, source: str, target: str, start_after: list[int]
) -> pb.ReplicateConfiguration:
    """`configuration` with source -> target replaced by target -> source, replication
    starting after `start_after` (the target's committed LSN per pchannel: everything
    through it came from the source)."""
    copy = _without_switchover(configuration)
    del copy.topology[:]
    for edge in configuration.topology:
        if (edge.source_cluster_id, edge.target_cluster_id) == (source, target):
            copy.topology.add(
                source_cluster_id=target, target_cluster_id=source, start_after_lsns=start_after
            )
        else:
            copy.topology.add().CopyFrom(edge)
    return copy


def _security_for(base: ClientSecurity, cluster: pb.ReplicateCluster) -> ClientSecurity:
    """The flags' credentials, with TLS and the cluster's configured CA where it has one."""
    pem = cluster.credentials.ca_certificate_pem
    if not pem:
        return base
    return dataclasses.replace(base, tls=True, root_certificates=pem.encode())


async def _committed_lsns(
    client: CoordinatorClient, pchannels: list[str], timeout_s: float
) -> list[int]:
    """The committed LSN of each pchannel, from its owner."""
    lsns: list[int] = []
    async with StreamingClientBase(client) as streaming:
        for pchannel in pchannels:
            route = await streaming.router.owner(pchannel, timeout_s)
            latest = await streaming.stub(route.owner_address).GetLatestTimeTick(
                wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=timeout_s
            )
            lsns.append(latest.committed_lsn)
    return lsns


async def _replicate_switchover(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    to = args.to
    here = await client.get_replicate_configuration()
    configuration = here.configuration
    clusters = {c.cluster_id: c for c in configuration.clusters}
    edges = _edges(configuration)
    into = [s for s, t in edges if t == to]
    out_of = [t for s, t in edges if s == to]
    if to not in clusters or len(into) + len(out_of) != 1:
        listed = ", ".join(f"{s} -> {t}" for s, t in edges) or "none"
        raise CliError(
            f"cannot switch over to cluster {to} (got topology {listed} seen from cluster "
            f"{here.cluster_id or '(no cluster_id)'}; expected one edge SOURCE -> {to}, and "
            "no other edge of it)"
        )
    # The other cluster of the pair: the source, or (already reversed) the old source.
    source = into[0] if into else out_of[0]
    # Tokens: every configuration this command sends is one a cluster answered (tokens
    # hidden, token_set where stored), which each cluster applies keeping its own stored
    # tokens (statemachine.replicate.with_kept_tokens).
    base_security = client_security(args, target)
    async with contextlib.AsyncExitStack() as stack:
        peers: dict[str, CoordinatorClient] = {}
        for cluster_id in (source, to):
            peers[cluster_id] = await stack.enter_async_context(
                CoordinatorClient(
                    list(clusters[cluster_id].endpoints),
                    timeout_s=args.timeout_s,
                    security=_security_for(base_security, clusters[cluster_id]),
                )
            )
        try:
            return await _switchover(args, peers, source, to)
        except SwitchoverTimeout as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_ERROR


async def _switchover(
    args: argparse.Namespace, peers: dict[str, CoordinatorClient], source: str, to: str
) -> int:
    console = _console()
    answers = {c: await peers[c].get_replicate_configuration() for c in (source, to)}
    for cluster_id, answer in answers.items():
        if answer.cluster_id != cluster_id:
            raise CliError(
                f"the endpoints configured for cluster {cluster_id} answer as cluster "
                f"{answer.cluster_id or '(no cluster_id)'} (expected {cluster_id})"
            )
    done = [
        c
        for c in (to, source)
        if (to, source) in _edges(answers[c].configuration)
        and not answers[c].configuration.HasField("switchover")
    ]
    if done:
        # A previous run reversed the edge on one cluster at least: finish it.
        final = answers[done[0]].configuration
        finished = []
        for cluster_id in (to, source):
            if (await peers[cluster_id].update_replicate_configuration(final)).changed:
                finished.append(cluster_id)
        report = {
            "source_cluster_id": to,
            "target_cluster_id": source,
            "finished_now": finished,
            "write_pause_s": None,
        }
        if args.json:
            _print_json(report)
        else:
            what = f"finished on {', '.join(finished)}" if finished else "nothing left to do"
            console.print(
                f"cluster {to} is already the source and {source} its target ({what}; the "
                "write pause of an earlier run is not known)"
            )
        return 0
    current = answers[source].configuration
    if (source, to) not in _edges(current):
        raise CliError(
            f"cluster {source} does not replicate to {to} (got topology "
            f"{', '.join(f'{s} -> {t}' for s, t in _edges(current)) or 'none'}; expected "
            f"{source} -> {to})"
        )
    base = _without_switchover(current)
    paused = _paused(base, source, to)
    # A previous run that stopped after its pause: the pause began before this run.
    resumed = current.SerializeToString(deterministic=True) == paused.SerializeToString(
        deterministic=True
    )
    deadline = time.monotonic() + args.drain_timeout_s
    pause_started = time.monotonic()
    # 1. The pause, in the source's Raft: from here every owner of the source refuses
    #    client writes, also after a failover. A broadcast still being appended delays it.
    while True:
        try:
            await peers[source].update_replicate_configuration(paused)
            break
        except RaftwalError as error:
            if error.info.code != errors_pb2.UNAVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(DRAIN_POLL_S * 4)
    if not args.json:
        console.print(f"cluster {source}: client writes paused; waiting for {to} to catch up")
    # 2. The drain: each source replicator records in Raft, once the target holds every
    #    client write of its pchannel, the LSN no client write can follow.
    pchannels = list([c for c in paused.clusters if c.cluster_id == source][0].pchannels)
    drained: dict[str, int] = {}
    while True:
        try:
            answer = await peers[source].get_replicate_configuration()
        except RaftwalError as error:
            # A leader change on the source, say: the pause is in Raft, keep waiting.
            if time.monotonic() > deadline:
                raise
            log.info("switchover: reading %s's drain failed (%s); retrying", source, error)
            await asyncio.sleep(DRAIN_POLL_S * 4)
            continue
        drained = {
            p: answer.checkpoints[p].drained_through_lsns.get(to, 0)
            for p in pchannels
            if p in answer.checkpoints
        }
        if all(drained.get(p, 0) > 0 for p in pchannels):
            break
        if time.monotonic() > deadline:
            await peers[source].update_replicate_configuration(base)
            lagging = ", ".join(
                f"{p} (target holds {answer.checkpoints[p].source_lsns.get(to, 0)})"
                if p in answer.checkpoints
                else f"{p} (no checkpoint recorded)"
                for p in pchannels
                if not drained.get(p)
            )
            raise SwitchoverTimeout(
                f"cluster {to} did not catch up with {source} within {args.drain_timeout_s:g} s "
                f"(got pchannels not drained: {lagging}; expected every pchannel drained): "
                f"the write pause on {source} was undone, {source} is still the source"
            )
        await asyncio.sleep(DRAIN_POLL_S)
    # 3. Reverse the edge: the target becomes the source (writable) first, then the old
    #    source becomes its target. Replication back starts after what `to` holds now,
    #    all of which came from `source`.
    target_pchannels = [c for c in base.clusters if c.cluster_id == to][0].pchannels
    start_after = await _committed_lsns(peers[to], list(target_pchannels), args.timeout_s)
    final = _reversed(base, source, to, start_after)
    await peers[to].update_replicate_configuration(final)
    write_pause_s = time.monotonic() - pause_started
    await peers[source].update_replicate_configuration(final)
    rows = [
        {
            "pchannel": p,
            "drained_through_lsn": drained[p],
            "target_pchannel": target_pchannels[index],
            "start_after_lsn": start_after[index],
        }
        for index, p in enumerate(pchannels)
    ]
    if args.json:
        _print_json(
            {
                "source_cluster_id": to,
                "target_cluster_id": source,
                "write_pause_s": round(write_pause_s, 3),
                "pause_began_earlier": resumed,
                "pchannels": rows,
            }
        )
        return 0
    console.print(
        f"switched over: cluster {to} is the source and takes writes, {source} is its "
        f"target; write pause {write_pause_s:.3f} s"
        + (" since this run began (the pause began in an earlier run)" if resumed else "")
    )
    table = Table()
    for column in (f"{source} pchannel", "drained through", f"{to} pchannel", "replicates after"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["pchannel"]),
            str(row["drained_through_lsn"]),
            str(row["target_pchannel"]),
            str(row["start_after_lsn"]),
        )
    console.print(table)
    return 0
