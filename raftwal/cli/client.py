"""The client sub-commands of the ``raftwal`` CLI: ``status``, ``channel``, ``vchannel``,
``events`` and ``lock``, all speaking to a cluster through the asyncio SDK (``rpc.client``),
and ``produce``, ``consume`` and ``segments`` through the data-plane SDK
(``rpc.streaming_client``).

``register(commands)`` adds them to the main parser (``raftwal/cli.py``). Endpoints come
from ``--endpoints``, else ``RAFTWAL_ENDPOINTS``, else the dev cluster file written by
``raftwal dev up`` (``<--dev-dir>/cluster.json``). Credentials (``rpc.credentials``) come
from ``--token-file`` / ``--tls-ca-file`` / ``--tls-cert-file`` / ``--tls-key-file``, else
the ``RAFTWAL_TOKEN``... environment variables, else, when the endpoints came from the dev
cluster file, from that file (a ``dev up --secure`` cluster: admin token, its CA and client
certificate); a token is never taken from the command line itself, where other users'
``ps`` could see it. Humans get rich tables; ``--json``
prints protobuf messages as JSON (``message_to_json``: protobuf's JSON mapping with int64
fields as JSON numbers): one object per command,
or one line per event for streams. A raftwal error prints ``error: CODE: message`` on
stderr and exits 1, without a traceback. Nothing here decides anything: it only calls
the SDK and formats what comes back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from rpc.client import CoordinatorClient, InvalidArgumentError, RaftwalError, parse_endpoints
from rpc.credentials import (
    CA_FILE_ENV,
    CERT_FILE_ENV,
    KEY_FILE_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    ClientSecurity,
    CredentialsError,
)
from rpc.errors import from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from rpc.streaming_client import (
    Consumer,
    PackConsumer,
    Position,
    Producer,
    StreamingClient,
    SubscriptionConsumer,
    list_segments,
)
from wal_segments.format import MSG_TYPE_CODES, PRODUCIBLE_MSG_TYPES

log = logging.getLogger(__name__)

CLUSTER_FILE = "cluster.json"
ENDPOINTS_ENV = "RAFTWAL_ENDPOINTS"
# `events` without --follow stops when the stream is idle this long before reaching the
# revision it set out to print (a node that cannot serve the tail must not hang the CLI).
EVENTS_IDLE_S = 10.0
# Unlocking and revoking on the way out of `lock` is bounded like any call, but tighter:
# the user asked to stop.
RELEASE_TIMEOUT_S = 5.0
# `produce` reads stdin in chunks of about this many bytes (one message per line).
STDIN_CHUNK_BYTES = 1 << 20
# Largest generated payload for `produce --size` (the server's message limit is 8 MiB).
MAX_GENERATED_SIZE = 8 << 20
E = errors_pb2
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A problem with what the user asked (no endpoints, a bad flag value): exit 2."""


@dataclass
class Target:
    endpoints: list[str]
    # gRPC address -> pid, from the dev cluster file (local nodes only).
    local_pids: dict[str, int] = field(default_factory=dict)
    # Credential files of a `dev up --secure` cluster, from the dev cluster file: keys
    # token_file, tls_ca_file, tls_cert_file, tls_key_file.
    dev_security: dict[str, str] = field(default_factory=dict)
    # The URL of the nats-server of a `dev up --with-nats` cluster ("" otherwise).
    dev_nats_url: str = ""


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """The credential flags shared by every command that connects to a cluster."""
    parser.add_argument(
        "--token-file",
        help=f"file holding the bearer token (default: ${TOKEN_ENV}, else ${TOKEN_FILE_ENV}, "
        "else the dev cluster's admin token)",
    )
    parser.add_argument(
        "--tls-ca-file", help=f"PEM CA bundle: connect with TLS (default: ${CA_FILE_ENV})"
    )
    parser.add_argument(
        "--tls-cert-file", help=f"PEM client certificate for mutual TLS (default: ${CERT_FILE_ENV})"
    )
    parser.add_argument("--tls-key-file", help=f"its PEM private key (default: ${KEY_FILE_ENV})")


def security_settings(args: argparse.Namespace, target: Target) -> dict[str, str]:
    """The credential settings in force, by precedence: flags, environment, dev cluster
    file. Keys: token (a value, from RAFTWAL_TOKEN only), token_file, tls_ca_file,
    tls_cert_file, tls_key_file; absent when unset."""
    environ = os.environ
    dev = target.dev_security
    settings = {
        "token_file": args.token_file or environ.get(TOKEN_FILE_ENV) or dev.get("token_file"),
        "tls_ca_file": args.tls_ca_file or environ.get(CA_FILE_ENV) or dev.get("tls_ca_file"),
        "tls_cert_file": (
            args.tls_cert_file or environ.get(CERT_FILE_ENV) or dev.get("tls_cert_file")
        ),
        "tls_key_file": args.tls_key_file or environ.get(KEY_FILE_ENV) or dev.get("tls_key_file"),
    }
    if not args.token_file and environ.get(TOKEN_ENV):
        settings["token"] = environ[TOKEN_ENV]
    return {key: value for key, value in settings.items() if value}


def client_security(args: argparse.Namespace, target: Target) -> ClientSecurity:
    return ClientSecurity.load(**security_settings(args, target))


# ---------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------


def common_arguments() -> argparse.ArgumentParser:
    """The options every client command takes: where the cluster is, the call bound,
    JSON output and the transport security."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--endpoints",
        help=f"comma-separated gRPC addresses host:port (default: ${ENDPOINTS_ENV}, else the "
        f"dev cluster file <dev-dir>/{CLUSTER_FILE})",
    )
    common.add_argument(
        "--dev-dir",
        type=Path,
        default=Path(".raftwal-dev"),
        help="directory of `raftwal dev up` (default: .raftwal-dev)",
    )
    common.add_argument(
        "--timeout-s",
        type=float,
        default=10.0,
        help="bound on each call, retries included, in seconds (default: 10)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for machines")
    add_security_arguments(common)
    return common


def register(commands: argparse._SubParsersAction) -> None:
    """Add the client sub-commands to the ``raftwal`` parser's sub-parsers."""
    common = common_arguments()

    status = commands.add_parser("status", parents=[common], help="cluster members and state")
    status.add_argument(
        "--serializable",
        action="store_true",
        help="read the answering node's state without going through the Raft log",
    )
    status.set_defaults(handler=_handler(_status))

    wal = commands.add_parser("wal", help="the pchannels' WAL implementations")
    wal_commands = wal.add_subparsers(dest="wal_command", metavar="ACTION")
    wal_commands.required = True
    alter = wal_commands.add_parser(
        "alter",
        parents=[common],
        help="move every pchannel to another WAL implementation online (FLUSHING, "
        "ADVANCE_CHECKPOINT, resume)",
    )
    alter.add_argument("--to", required=True, help="the implementation: segments, local, jetstream")
    alter.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="its configuration (jetstream: url=nats://HOST:PORT, credentials=FILE, "
        "replicas=N, stream_prefix=NAME; on a `dev up --with-nats` cluster the url is "
        "its server's); repeatable",
    )
    alter.add_argument("--no-wait", action="store_true", help="return once the alter is recorded")
    alter.add_argument(
        "--wait-s", type=float, default=300.0, help="how long to wait for it (default: 300)"
    )
    alter.set_defaults(handler=_handler(_wal_alter, {"target": "--to", "config": "--config"}))

    channel = commands.add_parser("channel", help="physical channels (pchannels)")
    channel_commands = channel.add_subparsers(dest="channel_command", metavar="ACTION")
    channel_commands.required = True
    create = channel_commands.add_parser("create", parents=[common], help="create pchannels")
    create.add_argument("--count", type=int, required=True, help="how many to create")
    create.add_argument(
        "--prefix", default="pchannel", help="names are <prefix>_<k> (default: pchannel)"
    )
    create.add_argument("--replicas", type=int, default=0, help="replica set size (0: default)")
    create.add_argument(
        "--wal",
        default="",
        help="WAL implementation: segments (default), local, jetstream",
    )
    create.add_argument(
        "--wal-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the implementation's configuration (jetstream: url=nats://HOST:PORT, "
        "credentials=FILE, replicas=N, stream_prefix=NAME); repeatable",
    )
    create.set_defaults(
        handler=_handler(
            _channel_create,
            {
                "replica_count": "--replicas",
                "count": "--count",
                "prefix": "--prefix",
                "wal": "--wal",
                "wal_config": "--wal-config",
            },
        )
    )
    listing = channel_commands.add_parser("list", parents=[common], help="list pchannels")
    listing.add_argument(
        "--include-dropped", action="store_true", help="also list dropped pchannels"
    )
    listing.set_defaults(handler=_handler(_channel_list))
    drop = channel_commands.add_parser("drop", parents=[common], help="drop pchannels")
    drop.add_argument("names", nargs="+", metavar="NAME", help="pchannels to drop")
    drop.set_defaults(handler=_handler(_channel_drop))

    vchannel = commands.add_parser("vchannel", help="virtual channels (vchannels)")
    vchannel_commands = vchannel.add_subparsers(dest="vchannel_command", metavar="ACTION")
    vchannel_commands.required = True
    vcreate = vchannel_commands.add_parser("create", parents=[common], help="create a vchannel")
    vcreate.add_argument("name", metavar="NAME", help="the new vchannel's name")
    vcreate.add_argument("--pchannel", required=True, help="the pchannel to multiplex it on")
    vcreate.set_defaults(handler=_handler(_vchannel_create, {"pchannel": "--pchannel"}))
    vlist = vchannel_commands.add_parser("list", parents=[common], help="list vchannels")
    vlist.add_argument("--include-dropped", action="store_true", help="also list dropped vchannels")
    vlist.set_defaults(handler=_handler(_vchannel_list))
    vdrop = vchannel_commands.add_parser("drop", parents=[common], help="drop a vchannel")
    vdrop.add_argument("name", metavar="NAME", help="the vchannel to drop")
    vdrop.set_defaults(handler=_handler(_vchannel_drop))

    events = commands.add_parser("events", parents=[common], help="the coordination history")
    events.add_argument(
        "--from-revision",
        type=int,
        default=1,
        help="first revision (default: 1, all retained history)",
    )
    events.add_argument("--follow", action="store_true", help="keep printing new events")
    events.add_argument(
        "--kinds", default="", help="comma-separated event kinds, e.g. lock_acquired,lease_granted"
    )
    events.set_defaults(handler=_handler(_events, {"from_revision": "--from-revision"}))

    lock = commands.add_parser(
        "lock",
        parents=[common],
        help="hold a lock until Ctrl-C/SIGTERM (grants a lease and keeps it alive)",
    )
    lock.add_argument("name", metavar="NAME", help="the lock key")
    lock.add_argument("--ttl-ms", type=int, required=True, help="lease time to live")
    lock.add_argument("--shared", action="store_true", help="take a shared lock")
    lock.add_argument(
        "--wait-ms", type=int, default=0, help="wait this long for a held lock (0: fail at once)"
    )
    lock.set_defaults(handler=_handler(_lock, {"ttl_ms": "--ttl-ms", "wait_ms": "--wait-ms"}))

    produce = commands.add_parser(
        "produce",
        parents=[common],
        help="send messages to a vchannel: --count generated ones, else one per stdin line",
        description="Send messages through the batching, idempotent producer. With --count, "
        "N generated payloads of --size bytes; otherwise one message per line of stdin "
        "(without its newline). Prints the count, the rate and the last position. "
        "--timeout-s bounds the retries of each message.",
    )
    produce.add_argument("--vchannel", required=True, help="the vchannel to write to")
    produce.add_argument("--count", type=int, help="send this many generated messages")
    produce.add_argument(
        "--size", type=int, default=100, help="payload bytes of generated messages (default 100)"
    )
    produce.add_argument("--key", default="", help="message key")
    produce.add_argument("--msg-type", default="message", help="message type (default message)")
    produce.add_argument("--linger-ms", type=float, default=2.0, help="batching delay (default: 2)")
    produce.add_argument(
        "--max-batch-messages",
        type=int,
        default=500,
        help="messages per Produce batch (default: 500)",
    )
    produce.set_defaults(handler=_handler(_produce, {"msg_type": "--msg-type", "key": "--key"}))

    consume = commands.add_parser(
        "consume",
        parents=[common],
        help="print committed entries of a vchannel",
        description="Print committed entries of a vchannel in LSN order (JSON: one WalEntry "
        "per line, bytes in base64). Starts after the latest committed entry unless "
        "--from-beginning or --from-lsn; stops after --limit entries or when no entry "
        "arrives for --timeout-s seconds.",
    )
    consume.add_argument(
        "--vchannel",
        help="the vchannel to read (required, unless --subscription names a subscription of one "
        "vchannel)",
    )
    consume.add_argument(
        "--subscription",
        help="resume where this subscription stands on the vchannel and commit as entries "
        "are printed (no --from-* then)",
    )
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="the whole retained log")
    start.add_argument("--from-lsn", type=int, help="start at this LSN")
    consume.add_argument("--limit", type=int, default=0, help="stop after N entries (0: no limit)")
    consume.add_argument(
        "--msg-types", default="", help="comma-separated message types to deliver (default all)"
    )
    consume.add_argument(
        "--packs",
        action="store_true",
        help="with --subscription: print time-tick packs over all its vchannels (every "
        "message of a time-tick range, complete and in order) and commit per pack; --limit "
        "then counts packs (default: off)",
    )
    consume.add_argument(
        "--prefer-replica",
        action="store_true",
        help="read from a replica of the pchannel that is not its owner (the same committed "
        "entries; falls back to the owner when it fails; not with --packs) (default: off)",
    )
    consume.add_argument(
        "--time-tick-interval-ms",
        type=int,
        default=100,
        help="with --packs: ms without writes after which an idle pchannel's owner moves "
        "its time tick (default: 100)",
    )
    consume.set_defaults(
        handler=_handler(
            _consume,
            {
                "lsn": "--from-lsn",
                "msg_types": "--msg-types",
                "time_tick_interval_ms": "--time-tick-interval-ms",
            },
        )
    )

    balance = commands.add_parser(
        "balance",
        help="the balancer: show it, turn rebalancing on or off, freeze or unfreeze nodes",
        description="Rebalancing is on by default: pchannels move, a bounded number per "
        "round and only within their replica sets, from the most to the least loaded node. "
        "A frozen node keeps serving but gets no pchannel, and the balancer moves its "
        "pchannels away.",
    )
    balance_commands = balance.add_subparsers(dest="balance_command", metavar="ACTION")
    balance_commands.required = True
    balance_show = balance_commands.add_parser(
        "show", parents=[common], help="the policy, frozen nodes and pchannels per owner"
    )
    balance_show.set_defaults(handler=_handler(_balance_show))
    balance_on = balance_commands.add_parser(
        "on", parents=[common], help="rebalance automatically (the default)"
    )
    balance_on.add_argument(
        "--max-moves-per-round",
        type=int,
        default=None,
        help="pchannel moves per balancer round (default: keep the current value; 0: the "
        "built-in default)",
    )
    balance_on.set_defaults(
        handler=_handler(_balance_on, {"max_moves_per_round": "--max-moves-per-round"}),
        allow_rebalance=True,
    )
    balance_off = balance_commands.add_parser(
        "off", parents=[common], help="stop moving pchannels for balance (failover still runs)"
    )
    balance_off.set_defaults(handler=_handler(_balance_on), allow_rebalance=False)
    for action, text in (("freeze", "freeze"), ("unfreeze", "unfreeze")):
        sub = balance_commands.add_parser(
            action, parents=[common], help=f"{text} nodes (a frozen node gets no pchannel)"
        )
        sub.add_argument("nodes", nargs="+", metavar="NODE", help=f"node ids to {text}")
        sub.set_defaults(handler=_handler(_balance_freeze, {"node_id": "NODE"}), action=action)

    subscription = commands.add_parser(
        "subscription",
        help="durable consumer groups: positions per vchannel kept in Raft",
        description="A subscription names vchannels and where its consumers start. Its "
        "positions are committed through Raft, move forward only, and survive restarts; "
        "`seek` moves them anywhere. `raftwal consume --subscription S` resumes from them.",
    )
    subscription_commands = subscription.add_subparsers(
        dest="subscription_command", metavar="ACTION"
    )
    subscription_commands.required = True
    screate = subscription_commands.add_parser(
        "create", parents=[common], help="create a subscription"
    )
    screate.add_argument("name", metavar="NAME", help="the subscription's name")
    screate.add_argument("--vchannels", required=True, help="comma-separated vchannels it consumes")
    screate.add_argument(
        "--start",
        default="earliest",
        help="where consumers start on a vchannel without a position: earliest, latest, "
        "lsn:N or tick:T (default: earliest)",
    )
    screate.add_argument(
        "--no-retention-hold",
        action="store_true",
        help="its positions do not hold back WAL retention",
    )
    screate.set_defaults(
        handler=_handler(_subscription_create, {"vchannels": "--vchannels", "start": "--start"})
    )
    slist = subscription_commands.add_parser("list", parents=[common], help="list subscriptions")
    slist.set_defaults(handler=_handler(_subscription_list))
    sdescribe = subscription_commands.add_parser(
        "describe", parents=[common], help="positions and lag per vchannel"
    )
    sdescribe.add_argument("name", metavar="NAME", help="the subscription")
    sdescribe.set_defaults(handler=_handler(_subscription_describe))
    sseek = subscription_commands.add_parser(
        "seek", parents=[common], help="move a subscription's position, in any direction"
    )
    sseek.add_argument("name", metavar="NAME", help="the subscription")
    sseek.add_argument("--vchannel", default="", help="only this vchannel (default: all)")
    target = sseek.add_mutually_exclusive_group(required=True)
    target.add_argument("--lsn", type=int, help="the next entry consumed is this LSN")
    target.add_argument("--time-tick", type=int, help="the first entry at or after this tick")
    target.add_argument("--earliest", action="store_true", help="every retained entry")
    target.add_argument("--latest", action="store_true", help="after everything committed")
    sseek.set_defaults(
        handler=_handler(_subscription_seek, {"lsn": "--lsn", "time_tick": "--time-tick"})
    )
    sdrop = subscription_commands.add_parser(
        "drop", parents=[common], help="drop a subscription and its positions"
    )
    sdrop.add_argument("name", metavar="NAME", help="the subscription")
    sdrop.set_defaults(handler=_handler(_subscription_drop))

    seal = commands.add_parser(
        "seal",
        parents=[common],
        help="seal the open segment now, so `segments` and `spark-read` show fresh data",
        description="Asks the pchannel's owner to seal its open segment (a no-op when it is "
        "empty) and waits until the manifest holds it: afterwards the committed segments hold "
        "every entry acknowledged before the command.",
    )
    which = seal.add_mutually_exclusive_group(required=True)
    which.add_argument("--pchannel", help="the pchannel to seal")
    which.add_argument("--vchannel", help="seal the pchannel this vchannel lives on")
    seal.set_defaults(handler=_handler(_seal, {"pchannel": "--pchannel"}))

    segments = commands.add_parser(
        "segments", parents=[common], help="committed WAL segments (the manifest)"
    )
    segments.add_argument(
        "--pchannel",
        action="append",
        default=[],
        metavar="P",
        help="only this pchannel (repeatable; default all)",
    )
    segments.add_argument(
        "--as-of-revision", type=int, default=0, help="the manifest as of a revision (0: now)"
    )
    segments.set_defaults(handler=_handler(_segments, {"as_of_revision": "--as-of-revision"}))


# ---------------------------------------------------------------------------------------
# Plumbing
# ---------------------------------------------------------------------------------------


def resolve_target(endpoints: str | None, dev_dir: Path) -> Target:
    """Where to connect: explicit endpoints, the environment, or the dev cluster file."""
    if endpoints is not None:
        explicit, source = endpoints, "--endpoints"
    else:
        explicit, source = os.environ.get(ENDPOINTS_ENV, ""), ENDPOINTS_ENV
    if endpoints is not None or explicit:
        # Given but empty is a mistake (an unset shell variable), not "use the dev cluster".
        try:
            return Target(parse_endpoints(explicit))
        except InvalidArgumentError as error:
            raise CliError(f"{source}: {error.info.message}") from None
    path = dev_dir / CLUSTER_FILE
    if not path.is_file():
        raise CliError(
            f"no endpoints: pass --endpoints host:port[,...], set {ENDPOINTS_ENV}, or start a "
            f"local cluster with `raftwal dev up` (no {path})"
        )
    try:
        data = json.loads(path.read_text())
        nodes = data["nodes"]
        target = Target([str(node["grpc"]) for node in nodes])
        target.local_pids = {
            str(node["grpc"]): int(node["pid"]) for node in nodes if node.get("pid")
        }
        security = data.get("security") or {}
        target.dev_security = {
            key: str(security[key])
            for key in ("token_file", "tls_ca_file", "tls_cert_file", "tls_key_file")
            if security.get(key)
        }
        nats = data.get("nats") or {}
        if nats.get("pid") and nats.get("url"):
            target.dev_nats_url = str(nats["url"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CliError(f"cannot read endpoints from {path} ({error})") from None
    if not target.endpoints:
        raise CliError(f"no nodes in {path}")
    return target


#: The event kinds `events --kinds` takes: the names of raftwal.v1.Event's body.
EVENT_KINDS: tuple[str, ...] = tuple(
    field.name for field in pb.Event.DESCRIPTOR.oneofs_by_name["body"].fields
)


def _listed(flag: str, text: str, valid: Sequence[str]) -> list[str]:
    """The comma-separated values of `flag`, each checked against `valid` (CliError, so
    exit 2, naming the bad ones and listing the valid ones)."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in valid]
    if unknown:
        raise CliError(
            f"{flag}: unknown value(s) {', '.join(repr(v[:64]) for v in unknown[:5])} "
            f"(expected one of {', '.join(valid)})"
        )
    return values


Command = Callable[[argparse.Namespace, CoordinatorClient, Target], Awaitable[int]]


def in_flags(message: str, flags: Mapping[str, str], args: argparse.Namespace) -> str:
    """A server's validation `message` in the CLI's words: the request fields it names
    (``replica_count``) become the flags that set them (``--replicas``), and the first one
    leads with the value given ("--replicas 5: ..."). The ErrorInfo itself keeps the field
    names, for SDK users."""
    named = [
        (name, flag)
        for name, flag in flags.items()
        if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message)
    ]
    if not named:
        return message
    for name, flag in named:
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", flag, message)
    flag = named[0][1]
    value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    return f"{flag} {value}: {message}" if value not in (None, "") else f"{flag}: {message}"


def _handler(
    command: Command, flags: Mapping[str, str] | None = None
) -> Callable[[argparse.Namespace], int]:
    """Run `command`; `flags` maps the request fields it sends to the flags that set them,
    so that server-side validation errors speak of flags."""

    def run(args: argparse.Namespace) -> int:
        try:
            target = resolve_target(args.endpoints, args.dev_dir)
            return asyncio.run(_with_client(command, args, target))
        except (CliError, CredentialsError) as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_USAGE
        except RaftwalError as error:
            if flags and error.info.code == E.INVALID_ARGUMENT:
                text = in_flags(error.info.message, flags, args)
                print(f"error: {error.code_name}: {text}", file=sys.stderr)
            else:
                print(f"error: {error}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return run


async def _with_client(command: Command, args: argparse.Namespace, target: Target) -> int:
    async with CoordinatorClient(
        target.endpoints, timeout_s=args.timeout_s, security=client_security(args, target)
    ) as client:
        return await command(args, client, target)


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _int64_as_numbers(descriptor: Descriptor, data: dict[str, Any]) -> None:
    """Turn the int64 fields that protobuf's JSON mapping writes as strings back into JSON
    numbers, in place, so that `jq '.lsn > 5'` compares numbers. Python's json writes any
    int exactly; the field names stay as they are."""
    for proto_field in descriptor.fields:
        if proto_field.name not in data:
            continue
        value = data[proto_field.name]
        message = proto_field.message_type
        if message is not None and message.GetOptions().map_entry:
            value_field = message.fields_by_name["value"]
            if value_field.message_type is not None:
                for item in value.values():
                    _int64_as_numbers(value_field.message_type, item)
            elif value_field.type in _INT64_TYPES:
                data[proto_field.name] = {key: int(item) for key, item in value.items()}
        elif message is not None:
            if message.full_name.startswith("google.protobuf."):
                continue  # well-known types have JSON forms of their own
            for item in value if isinstance(value, list) else [value]:
                _int64_as_numbers(message, item)
        elif proto_field.type in _INT64_TYPES:
            data[proto_field.name] = (
                [int(v) for v in value] if isinstance(value, list) else int(value)
            )


def message_to_json(message: Message) -> dict[str, Any]:
    """`message` as the CLI's --json prints it: protobuf's JSON mapping with the proto field
    names, every field present, and int64 fields as JSON numbers (not strings)."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(message.DESCRIPTOR, data)
    return data


def _to_dict(message: Message) -> dict[str, Any]:
    return message_to_json(message)


def _print_json(message: Message | dict[str, Any]) -> None:
    data = message if isinstance(message, dict) else _to_dict(message)
    print(json.dumps(data, sort_keys=True), flush=True)


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def _pchannel_state(value: int) -> str:
    return _enum_name(pb.PChannelState, value, "PCHANNEL_STATE_")


# Tables written to a pipe or file are not cut to 80 columns (an elided address is useless).
PIPE_WIDTH = 200


def _console() -> Console:
    return Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)


# ---------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------


async def _status(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    status = await client.cluster_status(linearizable=not args.serializable)
    if args.json:
        data = _to_dict(status)
        for member in data.get("members", []):
            if not int(member.get("pid") or 0):
                member["pid"] = target.local_pids.get(member.get("grpc_address", ""), 0)
        _print_json(data)
        return EXIT_ERROR if status.warnings else 0
    console = _console()
    if status.warnings:
        console.print(
            f"[bold red]UNHEALTHY[/]: {len(status.warnings)} warning(s), listed at the end"
        )
    else:
        console.print("[bold green]healthy[/]: no warnings")
    console.print(
        f"leader [bold]{status.leader_node_id or '-'}[/] ({status.leader_address or 'unknown'})"
        f"  revision {status.revision}  leases {status.leases}  locks {status.locks}"
        f"  pending broadcasts {status.pending_broadcasts}"
        f"  rebalance {'on' if status.balance_policy.allow_rebalance else 'off'}"
    )
    members = Table(title="members")
    for column in ("", "id", "role", "gRPC", "Raft", "pid", "reachable", "term", "commit"):
        members.add_column(column)
    members.add_column("applied")
    members.add_column("durable")
    members.add_column("revision")
    for member in status.members:
        pid = member.pid or target.local_pids.get(member.grpc_address, 0)
        members.add_row(
            "*" if member.is_leader or member.node_id == status.leader_node_id else "",
            member.node_id,
            member.role or "voter",
            member.grpc_address,
            member.raft_address,
            str(pid) if pid else "-",
            "yes" if member.reachable else "[red]no[/]",
            str(member.raft_term),
            str(member.commit_index),
            str(member.applied_index),
            str(member.durable_index),
            str(member.revision),
        )
    console.print(members)
    processes = _process_table(status.members)
    if processes.row_count:
        console.print(processes)
    nodes = Table(title="nodes")
    for column in ("id", "address", "state", "frozen", "registered"):
        nodes.add_column(column)
    for node in status.nodes:
        state = _enum_name(pb.NodeState, node.state, "NODE_STATE_")
        nodes.add_row(
            node.node_id,
            node.address,
            state if state == "UP" else f"[red]{state}[/]",
            "yes" if node.frozen else "",
            str(node.registered_revision),
        )
    console.print(nodes)
    console.print(_pchannel_table(status.pchannels))
    if status.HasField("wal_alter"):
        console.print(_wal_alter_table(status.wal_alter))
    replication = _replication_table(status.members)
    if replication.row_count:
        console.print(replication)
    if status.under_replicated:
        short = Table(title="under-replicated pchannels")
        for column in ("pchannel", "replicas", "live", "wanted", "DOWN"):
            short.add_column(column)
        for item in status.under_replicated:
            short.add_row(
                item.pchannel,
                ",".join(item.replica_node_ids),
                f"[red]{item.live}[/]",
                str(item.wanted),
                ",".join(item.down_node_ids) or "-",
            )
        console.print(short)
    retention = _retention_table(status)
    if retention.row_count:
        console.print(retention)
    if status.warnings:
        console.print(
            Panel(
                "\n".join(f"[bold red]![/] {escape(w)}" for w in status.warnings),
                title=f"[bold red]{len(status.warnings)} warning(s)[/]",
                border_style="red",
                title_align="left",
                expand=False,
            )
        )
    # `raftwal status && deploy` is safe: exit 0 only when there is nothing to warn about.
    return EXIT_ERROR if status.warnings else 0


def _process_table(members: Sequence[api.MemberStatus]) -> Table:
    """One row per process of each member: its supervisor, control process and data
    workers, with pid, CPU time, resident memory and what each worker serves."""
    table = Table(title="processes")
    for column in ("node", "process", "pid", "CPU s", "RSS", "gRPC", "transfer", "owns"):
        table.add_column(column)
    table.add_column("logs")
    for member in members:
        for process in member.processes:
            name = f"worker {process.index}" if process.kind == "worker" else process.kind
            up = process.up or process.kind != "worker"
            table.add_row(
                member.node_id,
                name,
                str(process.pid) if process.pid else "-",
                f"{process.cpu_seconds:.1f}",
                _mib(process.rss_bytes) if process.rss_bytes else "-",
                process.grpc_address or "-",
                str(process.transfer_port) if process.transfer_port else "-",
                ",".join(process.owned_pchannels) if up else "[red]down[/]",
                str(process.replica_pchannels) if process.kind == "worker" else "",
            )
    return table


def _replication_table(members: Sequence[api.MemberStatus]) -> Table:
    """One row per (owned pchannel, replica): where each replica is as its owner sees it."""
    table = Table(title="replication (as each owner sees it)")
    for column in ("pchannel", "owner", "term", "state", "committed", "replica", "durable"):
        table.add_column(column)
    table.add_column("behind")
    for member in members:
        for owner in member.owners:
            for replica in owner.replicas:
                behind = max(0, owner.committed_lsn - replica.durable_lsn)
                table.add_row(
                    owner.pchannel,
                    member.node_id,
                    str(owner.term),
                    owner.state if owner.state == "serving" else f"[yellow]{owner.state}[/]",
                    str(owner.committed_lsn),
                    replica.node_id,
                    str(replica.durable_lsn),
                    str(behind) if not behind else f"[yellow]{behind}[/]",
                )
    return table


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _retention_table(status: api.ClusterStatusResponse) -> Table:
    """WAL retention per pchannel: the floor decided in Raft, the committed segments still
    listed, and the bytes of its files on each member (with the first LSN each holds)."""
    reachable = [m for m in status.members if m.reachable]
    title = "WAL retention and disk use"
    if reachable:
        title += (
            " (data dirs: "
            + ", ".join(f"{m.node_id} {_mib(m.data_dir_bytes)}" for m in reachable)
            + ")"
        )
    table = Table(title=title)
    for column in ("pchannel", "floor", "committed", "segments", "committed bytes"):
        table.add_column(column)
    for member in reachable:
        table.add_column(f"{member.node_id} disk (first lsn)")
    for row in status.retention:
        cells = [
            row.pchannel,
            str(row.deleted_before_lsn) if row.deleted_before_lsn else "-",
            str(row.committed_through_lsn),
            str(row.committed_segments),
            _mib(row.committed_bytes),
        ]
        for member in reachable:
            usage = {u.pchannel: u for u in member.wal_disk}.get(row.pchannel)
            cells.append(f"{_mib(usage.bytes)} ({usage.first_lsn})" if usage else "-")
        table.add_row(*cells)
    return table


def _pchannel_table(pchannels: Sequence[pb.PChannel]) -> Table:
    table = Table(title="pchannels")
    for column in ("name", "term", "owner", "state", "access", "wal", "replicas"):
        table.add_column(column)
    for channel in pchannels:
        state = _pchannel_state(channel.state)
        table.add_row(
            channel.name,
            str(channel.term),
            channel.owner_node_id or "-",
            state if state == "ASSIGNED" else f"[yellow]{state}[/]",
            _enum_name(pb.AccessMode, channel.access_mode, "ACCESS_MODE_"),
            channel.wal or "segments",
            # local and jetstream replicate to no node: the owner holds the files
            ",".join(channel.replica_node_ids)
            if channel.wal in ("", "segments")
            else channel.owner_node_id or "-",
        )
    return table


def _wal_alter_table(alter: pb.WalAlter) -> Table:
    table = Table(
        title=f"WAL switch in progress: to {alter.target or 'segments'} (epoch {alter.epoch})"
    )
    for column in ("pchannel", "from", "stage", "checkpoint lsn", "term"):
        table.add_column(column)
    for name, entry in sorted(alter.pchannels.items()):
        stage = _enum_name(pb.WalAlterStage, entry.stage, "WAL_ALTER_STAGE_")
        table.add_row(
            name,
            entry.from_wal or "segments",
            stage if stage == "DONE" else f"[yellow]{stage}[/]",
            str(entry.checkpoint_lsn or "-"),
            str(entry.term or "-"),
        )
    return table


def _vchannel_table(vchannels: Sequence[pb.VChannel]) -> Table:
    table = Table(title="vchannels")
    for column in ("name", "id", "pchannel", "state"):
        table.add_column(column)
    for vchannel in vchannels:
        table.add_row(
            vchannel.name,
            str(vchannel.id),
            vchannel.pchannel,
            _enum_name(pb.VChannelState, vchannel.state, "VCHANNEL_STATE_"),
        )
    return table


# ---------------------------------------------------------------------------------------
# channel / vchannel
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# balance
# ---------------------------------------------------------------------------------------


def _print_balance(args: argparse.Namespace, status: api.ClusterStatusResponse) -> None:
    owners: dict[str, int] = {node.node_id: 0 for node in status.nodes}
    for channel in status.pchannels:
        if channel.owner_node_id and channel.state != pb.PCHANNEL_STATE_DROPPED:
            owners[channel.owner_node_id] = owners.get(channel.owner_node_id, 0) + 1
    frozen = sorted(node.node_id for node in status.nodes if node.frozen)
    policy = status.balance_policy
    if args.json:
        _print_json(
            {
                "allow_rebalance": policy.allow_rebalance,
                "max_moves_per_round": policy.max_moves_per_round,
                "frozen_node_ids": frozen,
                "pchannels_by_owner": owners,
                "revision": status.revision,
            }
        )
        return
    console = _console()
    moves = policy.max_moves_per_round or "default"
    console.print(
        f"rebalance {'[green]on[/]' if policy.allow_rebalance else '[yellow]off[/]'}  "
        f"max moves per round {moves}  frozen {', '.join(frozen) or '-'}  "
        f"revision {status.revision}"
    )
    table = Table(title="pchannels per owner")
    table.add_column("node")
    table.add_column("pchannels")
    table.add_column("frozen")
    for node_id, count in sorted(owners.items()):
        table.add_row(node_id, str(count), "yes" if node_id in frozen else "")
    console.print(table)


async def _balance_show(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    _print_balance(args, await client.cluster_status())
    return 0


async def _balance_on(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    current = (await client.cluster_status()).balance_policy
    moves = getattr(args, "max_moves_per_round", None)
    if moves is not None and moves < 0:
        raise CliError(f"invalid --max-moves-per-round ({moves}; expected >= 0)")
    await client.set_balance_policy(
        args.allow_rebalance, current.max_moves_per_round if moves is None else moves
    )
    _print_balance(args, await client.cluster_status())
    return 0


async def _balance_freeze(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    status = await client.cluster_status()
    known = {node.node_id for node in status.nodes}
    unknown = [node for node in args.nodes if node not in known]
    if unknown:
        raise CliError(
            f"NODE: unknown node id(s) {', '.join(repr(n[:64]) for n in unknown)} "
            f"(expected one of {', '.join(sorted(known)) or 'no registered node'})"
        )
    policy = status.balance_policy
    nodes = list(dict.fromkeys(args.nodes))
    await client.set_balance_policy(
        policy.allow_rebalance,
        policy.max_moves_per_round,
        freeze=nodes if args.action == "freeze" else (),
        unfreeze=nodes if args.action == "unfreeze" else (),
    )
    _print_balance(args, await client.cluster_status())
    return 0


def _key_values(flag: str, items: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE flags as a dict; a usage error (exit 2) for anything else."""
    found: dict[str, str] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise CliError(f"invalid {flag} {item[:64]!r} (expected KEY=VALUE)")
        found[key] = value
    return found


def _wal_config(args: argparse.Namespace, target: Target) -> dict[str, str]:
    """--wal-config as a dict; for jetstream without a url, the dev cluster's nats-server
    (`dev up --with-nats`) when there is one."""
    config = _key_values("--wal-config", args.wal_config)
    if args.wal == "jetstream" and "url" not in config and target.dev_nats_url:
        config["url"] = target.dev_nats_url
    return config


async def _wal_alter(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    config = _key_values("--config", args.config)
    if args.to == "jetstream" and "url" not in config and target.dev_nats_url:
        config["url"] = target.dev_nats_url
    response = await client.alter_wal(args.to, config)
    if not response.epoch:
        if args.json:
            _print_json(response)
        else:
            moved = (
                f" ({len(response.pchannels)} never-assigned moved)" if response.pchannels else ""
            )
            _console().print(f"every pchannel is on {args.to} already{moved}")
        return 0
    if not args.json:
        _console().print(
            f"AlterWAL to {args.to}: epoch {response.epoch}, {len(response.pchannels)} pchannel(s)"
        )
    if args.no_wait:
        if args.json:
            _print_json(response)
        return 0
    deadline = time.monotonic() + args.wait_s
    last = ""
    while True:
        status = await client.cluster_status(linearizable=False)
        alter = status.wal_alter
        if not status.HasField("wal_alter") or alter.epoch != response.epoch:
            break
        stages = Counter(
            _enum_name(pb.WalAlterStage, e.stage, "WAL_ALTER_STAGE_")
            for e in alter.pchannels.values()
        )
        line = ", ".join(f"{n} {stage}" for stage, n in sorted(stages.items()))
        if line != last and not args.json:
            _console().print(f"  {line}")
            last = line
        if time.monotonic() > deadline:
            raise CliError(
                f"AlterWAL epoch {response.epoch} not finished after {args.wait_s:g} s ({line}); "
                "it goes on: see `raftwal status`"
            )
        await asyncio.sleep(0.5)
    if args.json:
        _print_json(response)
    else:
        _console().print(f"AlterWAL epoch {response.epoch} done: every pchannel is on {args.to}")
    return 0


async def _channel_create(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.create_channels(
        count=args.count,
        prefix=args.prefix,
        replica_count=args.replicas,
        wal=args.wal,
        wal_config=_wal_config(args, target),
    )
    if args.json:
        _print_json(response)
    else:
        _console().print(
            f"created {len(response.pchannels)} pchannel(s) at revision {response.revision}: "
            + ", ".join(response.pchannels)
        )
    return 0


async def _channel_list(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    response = await client.list_channels(include_dropped=args.include_dropped)
    if args.json:
        _print_json(response)
        return 0
    console = _console()
    console.print(_pchannel_table(response.pchannels))
    console.print(_vchannel_table(response.vchannels))
    console.print(f"revision {response.revision}")
    return 0


async def _channel_drop(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    response = await client.drop_channels(args.names)
    if args.json:
        _print_json(response)
    else:
        _console().print(
            f"dropped {', '.join(args.names)} (revision {response.revision})", markup=False
        )
    return 0


async def _vchannel_create(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.create_vchannel(args.name, args.pchannel)
    if args.json:
        _print_json(response)
    else:
        _console().print(
            f"created vchannel {response.vchannel.name} (id {response.vchannel.id}) on "
            f"{response.vchannel.pchannel} at revision {response.revision}",
            markup=False,
        )
    return 0


async def _vchannel_list(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.list_channels(include_dropped=args.include_dropped)
    if args.json:
        # Same shape as ListChannelsResponse's JSON.
        vchannels = [_to_dict(v) for v in response.vchannels]
        _print_json({"vchannels": vchannels, "revision": response.revision})
        return 0
    _console().print(_vchannel_table(response.vchannels))
    return 0


async def _vchannel_drop(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.drop_vchannel(args.name)
    if args.json:
        _print_json(response)
    else:
        _console().print(
            f"dropped vchannel {args.name} (revision {response.revision})", markup=False
        )
    return 0


# ---------------------------------------------------------------------------------------
# events
# ---------------------------------------------------------------------------------------


async def _events(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    kinds = _listed("--kinds", args.kinds, EVENT_KINDS)
    if args.from_revision < 0:
        raise CliError(f"invalid --from-revision ({args.from_revision}; expected >= 0)")
    console = _console()
    if args.follow:
        async for event in client.watch_events(args.from_revision, kinds):
            _print_event(console, event, args.json)
        return 0
    # Without --follow: print what exists now and stop. The watch is unfiltered so that the
    # end is visible even when no selected event reaches it; kinds filter locally.
    end = (await client.list_channels(linearizable=True)).revision
    if end < max(args.from_revision, 1):
        return 0
    stream = client.watch_events(args.from_revision or end + 1, ())
    try:
        while True:
            try:
                event = await asyncio.wait_for(anext(stream), EVENTS_IDLE_S)
            except StopAsyncIteration:
                break
            except TimeoutError:
                print(
                    f"warning: no event for {EVENTS_IDLE_S:g} s before revision {end}; stopping",
                    file=sys.stderr,
                )
                break
            if not kinds or event.WhichOneof("body") in kinds:
                _print_event(console, event, args.json)
            if event.revision >= end:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return 0


def _print_event(console: Console, event: pb.Event, as_json: bool) -> None:
    if as_json:
        _print_json(event)
        return
    kind = event.WhichOneof("body") or "?"
    body = json.dumps(_to_dict(getattr(event, kind)) if kind != "?" else {}, separators=(",", ":"))
    when = datetime.fromtimestamp(event.time_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    console.print(f"{event.revision:>8}  {when}  {kind:<28} {body}", markup=False)


# ---------------------------------------------------------------------------------------
# lock
# ---------------------------------------------------------------------------------------


async def _lock(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    if args.ttl_ms <= 0:
        raise CliError(f"invalid --ttl-ms ({args.ttl_ms}; expected > 0)")
    if args.wait_ms < 0:
        raise CliError(f"invalid --wait-ms ({args.wait_ms}; expected >= 0)")
    mode = "shared" if args.shared else "exclusive"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    holder = f"raftwal-cli@{socket.gethostname()}:{os.getpid()}"
    lease = await client.grant_lease(args.ttl_ms, holder=holder)
    lost = False
    try:
        locked = await _unless_stopped(
            client.lock(args.name, lease.lease_id, mode, args.wait_ms), stop
        )
        if locked is None:
            # Interrupted while waiting: revoking the lease (below) also releases a lock
            # that the cancelled call may have taken after all.
            return EXIT_INTERRUPTED
        async with client.lease_keeper(lease.lease_id) as keeper:
            if args.json:
                _print_json(
                    {
                        "key": locked.key,
                        "mode": mode,
                        "fencing_token": locked.fencing_token,
                        "lease_id": lease.lease_id,
                        "ttl_ms": args.ttl_ms,
                        "revision": locked.revision,
                    }
                )
            else:
                print(
                    f"locked {locked.key} ({mode}) fencing_token={locked.fencing_token} "
                    f"lease={lease.lease_id} ttl_ms={args.ttl_ms}; Ctrl-C to release",
                    flush=True,
                )
            stopped = asyncio.ensure_future(stop.wait())
            lost_waiter = asyncio.ensure_future(keeper.wait_lost())
            try:
                await asyncio.wait({stopped, lost_waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                lost_waiter.cancel()
            if keeper.lost_error is not None:
                lost = True
                print(f"error: lease lost: {keeper.lost_error}", file=sys.stderr)
        if not lost:
            await _bounded(client.unlock(args.name, lease.lease_id), "unlock")
    finally:
        await _bounded(client.revoke_lease(lease.lease_id), "revoke the lease")
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if not lost and not args.json:
        print(f"released {args.name}", flush=True)
    return EXIT_ERROR if lost else 0


async def _unless_stopped(call: Awaitable[Any], stop: asyncio.Event) -> Any:
    """`call`'s result, or None when `stop` is set first (the call is then cancelled)."""
    work = asyncio.ensure_future(call)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    return None if work.cancelled() else work.result()


async def _bounded(call: Awaitable[Any], what: str) -> None:
    """Best effort on the way out: a failure is reported, never raised over the real
    outcome (the lease expires by itself after its ttl anyway)."""
    try:
        await asyncio.wait_for(call, RELEASE_TIMEOUT_S)
    except (RaftwalError, TimeoutError) as error:
        print(f"warning: could not {what}: {error}", file=sys.stderr)
    except asyncio.CancelledError:
        raise


# ---------------------------------------------------------------------------------------
# produce / consume / segments
# ---------------------------------------------------------------------------------------


def _generated_payload(index: int, size: int) -> bytes:
    """`size` bytes ending with the message's index in decimal (zero-padded), so that a
    reader can tell generated messages apart and check their order."""
    digits = str(index).encode()
    return digits.rjust(size, b"0")[-size:] if size else b""


async def _stdin_chunks() -> AsyncIterator[list[bytes]]:
    """Lines of stdin without their newline, read in bounded chunks off the event loop."""
    while True:
        lines = await asyncio.to_thread(sys.stdin.buffer.readlines, STDIN_CHUNK_BYTES)
        if not lines:
            return
        yield [line.rstrip(b"\r\n") for line in lines]


async def _produce(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    _listed("--msg-type", args.msg_type, PRODUCIBLE_MSG_TYPES)
    if args.count is not None and args.count < 0:
        raise CliError(f"invalid --count ({args.count}; expected >= 0)")
    if not 0 <= args.size <= MAX_GENERATED_SIZE:
        raise CliError(f"invalid --size ({args.size}; expected 0..{MAX_GENERATED_SIZE})")
    futures: list[asyncio.Future[Position]] = []
    started = time.monotonic()
    async with (
        StreamingClient(client) as streaming,
        Producer(
            streaming,
            linger_ms=args.linger_ms,
            max_batch_messages=args.max_batch_messages,
            retry_timeout_s=args.timeout_s,
        ) as producer,
    ):

        async def submit(payload: bytes) -> None:
            futures.append(
                await producer.submit(
                    args.vchannel, payload, key=args.key.encode(), msg_type=args.msg_type
                )
            )

        if args.count is not None:
            for index in range(args.count):
                await submit(_generated_payload(index, args.size))
        else:
            async for lines in _stdin_chunks():
                for line in lines:
                    await submit(line)
        await producer.flush()
        stats = producer.stats
    seconds = time.monotonic() - started
    errors = [f.exception() for f in futures if f.exception() is not None]
    positions = [f.result() for f in futures if f.exception() is None]
    last = max(positions, key=lambda p: p.lsn) if positions else None
    rate = len(positions) / seconds if seconds > 0 else 0.0
    if args.json:
        _print_json(
            {
                "vchannel": args.vchannel,
                "count": len(positions),
                "failed": len(errors),
                "seconds": round(seconds, 6),
                "msgs_per_s": round(rate, 1),
                "batches": stats.batches_acknowledged,
                "retries": stats.retries,
                "last": last._asdict() if last else None,
            }
        )
    else:
        where = (
            f"last position {last.pchannel} lsn {last.lsn} time_tick {last.time_tick}"
            if last
            else "nothing written"
        )
        _console().print(
            f"sent {len(positions)} message(s) to {args.vchannel} in {seconds:.2f} s "
            f"({rate:,.0f} msgs/s, {stats.batches_acknowledged} batches); {where}",
            markup=False,
        )
    if errors:
        print(f"error: {len(errors)} message(s) failed; first: {errors[0]}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _payload_text(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return repr(payload)


async def _consume(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    if args.limit < 0:
        raise CliError(f"invalid --limit ({args.limit}; expected >= 0)")
    if args.from_lsn is not None and args.from_lsn < 0:
        raise CliError(f"invalid --from-lsn ({args.from_lsn}; expected >= 0)")
    msg_types = _listed("--msg-types", args.msg_types, tuple(MSG_TYPE_CODES))
    if args.subscription and (args.from_beginning or args.from_lsn is not None):
        raise CliError(
            "--subscription starts where the subscription stands (got --from-beginning or "
            "--from-lsn too; expected neither: `raftwal subscription seek` moves it)"
        )
    if args.packs and args.prefer_replica:
        raise CliError(
            "--prefer-replica with --packs (expected one of them: packs read from the owner, "
            "which keeps an idle pchannel's time ticks moving)"
        )
    if args.packs:
        return await _consume_packs(args, client, msg_types)
    console = _console()
    printed = 0
    async with StreamingClient(client) as streaming:
        vchannel = args.vchannel
        if args.subscription and not vchannel:
            described = await client.describe_subscription(args.subscription)
            if len(described.subscription.vchannels) != 1:
                raise CliError(
                    f"--vchannel: subscription {args.subscription!r} has "
                    f"{len(described.subscription.vchannels)} vchannels (expected one of "
                    f"{', '.join(described.subscription.vchannels)})"
                )
            vchannel = described.subscription.vchannels[0]
        if not vchannel:
            raise CliError("--vchannel: missing (expected the vchannel to read)")
        reader: Consumer | SubscriptionConsumer
        if args.subscription:
            reader = SubscriptionConsumer(
                streaming,
                args.subscription,
                vchannel,
                msg_types=msg_types,
                prefer_replica=args.prefer_replica,
            )
        else:
            reader = Consumer(
                streaming,
                vchannel,
                from_lsn=args.from_lsn,
                latest=not args.from_beginning and args.from_lsn is None,
                msg_types=msg_types,
                prefer_replica=args.prefer_replica,
            )
        async with reader:
            while not args.limit or printed < args.limit:
                try:
                    entry = await asyncio.wait_for(anext(reader), args.timeout_s)
                except (StopAsyncIteration, TimeoutError):
                    break
                _print_entry(console, entry, args.json)
                printed += 1
    if not args.json:
        print(f"{printed} entr{'y' if printed == 1 else 'ies'}", file=sys.stderr)
    return 0


async def _consume_packs(
    args: argparse.Namespace, client: CoordinatorClient, msg_types: list[str]
) -> int:
    """`consume --subscription S --packs`: one line per pack (JSON: the pack with its
    messages), then its messages in text mode."""
    if not args.subscription:
        raise CliError("--packs: needs --subscription (packs are cut over its vchannels)")
    if args.vchannel:
        raise CliError("--packs reads every vchannel of the subscription (got --vchannel too)")
    if not 1 <= args.time_tick_interval_ms <= 60_000:
        raise CliError(
            f"invalid --time-tick-interval-ms ({args.time_tick_interval_ms}; expected 1..60000)"
        )
    console = _console()
    packs = messages = 0
    async with (
        StreamingClient(client) as streaming,
        PackConsumer(
            streaming,
            args.subscription,
            time_tick_interval_ms=args.time_tick_interval_ms,
            msg_types=msg_types,
        ) as reader,
    ):
        while not args.limit or packs < args.limit:
            try:
                pack = await asyncio.wait_for(anext(reader), args.timeout_s)
            except (StopAsyncIteration, TimeoutError):
                break
            packs += 1
            messages += len(pack.messages)
            if args.json:
                _print_json(
                    {
                        "begin_time_tick": pack.begin_time_tick,
                        "end_time_tick": pack.end_time_tick,
                        "start_positions": {
                            v: {"lsn": lsn, "time_tick": tick}
                            for v, (lsn, tick) in pack.start_positions.items()
                        },
                        "end_positions": {
                            v: {"lsn": lsn, "time_tick": tick}
                            for v, (lsn, tick) in pack.end_positions.items()
                        },
                        "messages": [_to_dict(m) for m in pack.messages],
                    }
                )
                continue
            console.print(
                f"pack ({pack.begin_time_tick}, {pack.end_time_tick}]: "
                f"{len(pack.messages)} message(s)",
                markup=False,
            )
            for entry in pack.messages:
                _print_entry(console, entry, False)
    if not args.json:
        print(f"{packs} pack(s), {messages} message(s)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------
# subscriptions
# ---------------------------------------------------------------------------------------


def _parse_start(text: str) -> dict[str, Any]:
    kind, _, value = text.partition(":")
    if kind in ("earliest", "latest") and not value:
        return {"start": kind}
    if kind in ("lsn", "tick") and value.isdigit() and int(value) > 0:
        key = "start_lsn" if kind == "lsn" else "start_time_tick"
        return {"start": "lsn" if kind == "lsn" else "time_tick", key: int(value)}
    raise CliError(
        f"--start: invalid value {text!r} (expected earliest, latest, lsn:N or tick:T with "
        "N, T >= 1)"
    )


async def _subscription_create(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    vchannels = [v.strip() for v in args.vchannels.split(",") if v.strip()]
    if not vchannels:
        raise CliError("--vchannels: no vchannel given (expected a comma-separated list)")
    response = await client.create_subscription(
        args.name, vchannels, holds_retention=not args.no_retention_hold, **_parse_start(args.start)
    )
    if args.json:
        _print_json(response)
    else:
        _console().print(
            f"subscription {args.name} over {', '.join(response.subscription.vchannels)} "
            f"at revision {response.revision}",
            markup=False,
        )
    return 0


def _start_text(found: pb.Subscription) -> str:
    start = _enum_name(pb.SubscriptionStart, found.start, "SUBSCRIPTION_START_").lower()
    if found.start == pb.SUBSCRIPTION_START_LSN:
        return f"lsn:{found.start_lsn}"
    if found.start == pb.SUBSCRIPTION_START_TIME_TICK:
        return f"tick:{found.start_time_tick}"
    return start


async def _subscription_list(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.list_subscriptions()
    if args.json:
        _print_json(response)
        return 0
    table = Table(title="subscriptions")
    for column in ("name", "vchannels", "start", "positions", "holds retention", "created"):
        table.add_column(column)
    for found in response.subscriptions:
        table.add_row(
            found.name,
            ", ".join(found.vchannels),
            _start_text(found),
            str(len(found.positions)),
            "yes" if found.holds_retention else "no",
            str(found.created_revision),
        )
    _console().print(table)
    return 0


async def _subscription_describe(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.describe_subscription(args.name)
    if args.json:
        _print_json(response)
        return 0
    found = response.subscription
    console = _console()
    console.print(
        f"subscription {found.name}  start {_start_text(found)}  holds retention "
        f"{'yes' if found.holds_retention else 'no'}  revision {response.revision}",
        markup=False,
    )
    table = Table(title="positions")
    for column in ("vchannel", "pchannel", "position", "committed", "lsn lag", "time lag"):
        table.add_column(column)
    for lag in response.lags:
        position = found.positions.get(lag.vchannel)
        where = str(lag.position_lsn) if lag.position_lsn else "-"
        if position is not None and position.from_time_tick:
            where = f"tick >= {position.from_time_tick}"
        table.add_row(
            lag.vchannel,
            lag.pchannel,
            where,
            str(lag.committed_lsn) if not lag.error else f"[red]{escape(lag.error)}[/]",
            str(lag.lsn_lag),
            f"{lag.time_lag_ms / 1000:.1f} s" if lag.position_time_tick else "-",
        )
    console.print(table)
    if found.members:
        members = Table(title="members")
        for column in ("member", "lease", "generation", "vchannels"):
            members.add_column(column)
        for member_id in sorted(found.members):
            member = found.members[member_id]
            members.add_row(
                member_id, str(member.lease_id), str(member.generation), ", ".join(member.vchannels)
            )
        console.print(members)
    return 0


async def _subscription_seek(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    if args.lsn is not None and args.lsn < 1:
        raise CliError(f"--lsn: invalid value {args.lsn} (expected >= 1)")
    if args.time_tick is not None and args.time_tick < 1:
        raise CliError(f"--time-tick: invalid value {args.time_tick} (expected >= 1)")
    response = await client.seek_subscription(
        args.name,
        vchannel=args.vchannel,
        lsn=args.lsn,
        time_tick=args.time_tick,
        earliest=args.earliest,
        latest=args.latest,
    )
    if args.json:
        _print_json(response)
    else:
        print(f"sought {args.name} at revision {response.revision}")
    return 0


async def _subscription_drop(
    args: argparse.Namespace, client: CoordinatorClient, target: Target
) -> int:
    response = await client.drop_subscription(args.name)
    if args.json:
        _print_json(response)
    else:
        print(f"dropped {args.name} at revision {response.revision}")
    return 0


def _print_entry(console: Console, entry: wire.WalEntry, as_json: bool) -> None:
    if as_json:
        _print_json(entry)
        return
    extra = f" txn={entry.txn_id}" if entry.txn_id else ""
    console.print(
        f"{entry.lsn:>10}  {entry.time_tick:>20}  {entry.vchannel:<16} {entry.msg_type:<12}"
        f"{extra} {_payload_text(entry.payload)}",
        markup=False,
    )


async def _seal(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    pchannel = args.pchannel
    async with StreamingClient(client) as streaming:
        deadline = time.monotonic() + args.timeout_s
        if args.vchannel:
            listed = await client.list_channels()
            found = next((v for v in listed.vchannels if v.name == args.vchannel), None)
            if found is None:
                raise CliError(f"--vchannel: unknown vchannel {args.vchannel!r}")
            pchannel = found.pchannel
        while True:
            route = await streaming.router.owner(pchannel, max(0.1, deadline - time.monotonic()))
            try:
                answer = await streaming.stub(route.owner_address).Seal(
                    wire.SealRequest(pchannel=pchannel, timeout_ms=int(args.timeout_s * 1000)),
                    timeout=args.timeout_s + 1,
                )
                break
            except grpc.aio.AioRpcError as error:
                info = from_rpc_error(error)
                if info.code not in (E.NOT_OWNER, E.CHANNEL_FENCED, E.UNAVAILABLE) or (
                    time.monotonic() >= deadline
                ):
                    raise RaftwalError(info) from None
                streaming.router.report_failure(pchannel, route.owner_address, route.term, info)
                await asyncio.sleep(0.2)
    if args.json:
        _print_json(answer)
    else:
        what = "sealed" if answer.sealed else "nothing to seal"
        print(f"{pchannel}: {what}; committed through lsn {answer.committed_through_lsn}")
    return 0


async def _segments(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    if args.as_of_revision < 0:
        raise CliError(f"invalid --as-of-revision ({args.as_of_revision}; expected >= 0)")
    response = await list_segments(client, args.pchannel, args.as_of_revision)
    if args.json:
        _print_json(response)
        return 0
    table = Table(title="segments")
    for column in ("pchannel", "segment", "lsns", "count", "bytes", "terms", "replicas", "rev"):
        table.add_column(column)
    for segment in response.segments:
        terms = (
            str(segment.first_term)
            if segment.first_term == segment.last_term
            else f"{segment.first_term}..{segment.last_term}"
        )
        table.add_row(
            segment.pchannel,
            str(segment.segment_id),
            f"{segment.first_lsn}..{segment.last_lsn}",
            str(segment.count),
            str(segment.bytes),
            terms,
            ",".join(segment.replica_node_ids),
            str(segment.committed_revision),
        )
    console = _console()
    console.print(table)
    console.print(f"{len(response.segments)} segment(s) at revision {response.revision}")
    return 0
