"""`raftwal replicate set FILE | clear | show`: the cross-cluster replication configuration
(docs/replication.md) from the command line.

FILE is TOML: one ``[[clusters]]`` table per cluster (``id``, ``endpoints``, ``pchannels``
in order, and optional ``token_file`` / ``ca_file``, paths relative to FILE) and one
``[[topology]]`` table per edge (``source``, ``target``). Tokens come from files, never
from the command line or FILE itself, so that FILE can be shared and kept in version
control while the token files stay 0600. ``set`` replaces the configuration of the cluster
the CLI talks to (``--endpoints``, else the dev cluster) with FILE's; ``clear`` empties it;
``show`` prints it as the cluster answers it, tokens redacted. This module only parses,
calls the SDK and prints: the cluster validates.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from rich.table import Table

from raftwal.cli.client import (
    CliError,
    Target,
    _console,
    _handler,
    _print_json,
    common_arguments,
    message_to_json,
)
from rpc.client import CoordinatorClient
from rpc.protos import coordination_pb2 as pb

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
        "set", parents=[common], help="replace the configuration with FILE's (TOML)"
    )
    setter.add_argument("file", type=Path, metavar="FILE", help="the configuration (TOML)")
    setter.set_defaults(handler=_handler(_replicate_set))
    clear = replicate_commands.add_parser(
        "clear", parents=[common], help="remove the configuration (no replication)"
    )
    clear.set_defaults(handler=_handler(_replicate_clear))
    show = replicate_commands.add_parser(
        "show", parents=[common], help="the configuration, tokens redacted"
    )
    show.set_defaults(handler=_handler(_replicate_show))


async def _replicate_set(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    return await _apply(args, client, load_replicate_file(args.file), "replaced", "unchanged")


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
