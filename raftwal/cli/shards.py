"""`raftwal shard list` and `raftwal consumer run MODULE:APP --subscription S`: the exactly-once
consumer shards of ``rpc.shards`` from the command line.

`shard list` shows, per shard (subscription, vchannel), who holds it at which generation
(the fencing token), its state, its committed position and its lag. `consumer run` runs an
application over the shards the coordinator assigns to this process, until SIGTERM or
SIGINT (a clean stop: the open transaction is finished or dropped, the member leaves and
its lease is revoked). This module only parses, calls the SDK and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

from rich.table import Table

from raftwal.cli.client import (
    EXIT_ERROR,
    EXIT_USAGE,
    CliError,
    Target,
    _console,
    _handler,
    common_arguments,
)
from rpc.client import ChannelFencedError, CoordinatorClient
from rpc.shards.recovery import is_recovery_hold
from rpc.shards_client import ConsumerService, ShardStatus, load_application, shard_rows
from rpc.streaming_client import StreamingClient


def register(commands: argparse._SubParsersAction) -> None:
    common = common_arguments()
    shard = commands.add_parser(
        "shard",
        help="exactly-once consumer shards: one per (subscription, vchannel)",
    )
    shard_commands = shard.add_subparsers(dest="shard_command", metavar="ACTION")
    shard_commands.required = True
    listing = shard_commands.add_parser(
        "list", parents=[common], help="assignment, state and lag per shard"
    )
    listing.add_argument("--subscription", default="", help="only this subscription (default: all)")
    listing.set_defaults(handler=_handler(_shard_list))

    consumer = commands.add_parser("consumer", help="run exactly-once applications")
    consumer_commands = consumer.add_subparsers(dest="consumer_command", metavar="ACTION")
    consumer_commands.required = True
    run = consumer_commands.add_parser(
        "run",
        parents=[common],
        help="run MODULE:APP over the shards of a subscription the coordinator assigns "
        "to this process (SIGTERM stops it cleanly)",
    )
    run.add_argument("app", metavar="MODULE:APP", help="the application (see rpc.shards)")
    run.add_argument("--subscription", required=True, help="the subscription it consumes")
    run.add_argument(
        "--member-id",
        default="",
        help="this process's member id (default: <hostname>-<pid>)",
    )
    run.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".raftwal-shards"),
        help="where the shards' SQLite files live (default: .raftwal-shards)",
    )
    run.add_argument(
        "--lease-ttl-ms", type=int, default=10_000, help="member lease (default: 10000)"
    )
    run.add_argument(
        "--max-batch-messages",
        type=int,
        default=10_000,
        help="messages per store transaction at most (default: 10000)",
    )
    run.add_argument(
        "--linger-ms",
        type=int,
        default=20,
        help="how long a transaction waits for more messages (default: 20)",
    )
    run.set_defaults(handler=_handler(_consumer_run))


async def _shard_list(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    if args.subscription:
        names = [args.subscription]
    else:
        listed = await client.list_subscriptions()
        names = sorted(s.name for s in listed.subscriptions if not is_recovery_hold(s.name))
    rows = []
    for name in names:
        rows.extend(shard_rows(await client.describe_subscription(name)))
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True), flush=True)
        return 0
    table = Table(title="shards")
    columns = ("subscription", "vchannel", "state", "member", "generation", "position")
    for column in (*columns, "committed", "lag"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["subscription"],
            row["vchannel"],
            row["state"],
            row["member_id"] or "-",
            str(row["generation"] or "-"),
            str(row["position_lsn"] or "-"),
            str(row["committed_lsn"]),
            str(row["lag_entries"]),
        )
    _console().print(table)
    return 0


async def _consumer_run(args: argparse.Namespace, client: CoordinatorClient, target: Target) -> int:
    if args.lease_ttl_ms < 1000:
        raise CliError(f"invalid --lease-ttl-ms ({args.lease_ttl_ms}; expected >= 1000)")
    # MODULE:APP is looked up from the working directory, as `python -m` would.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app = load_application(args.app)
    except (ImportError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    member_id = args.member_id or f"{socket.gethostname()}-{os.getpid()}"

    def report(status: ShardStatus) -> None:
        line = {
            "subscription": status.subscription,
            "vchannel": status.vchannel,
            "state": status.state,
            "token": status.token,
            "position_lsn": status.checkpoint.source_lsn,
            "applied": status.applied,
            "replayed_records": status.replayed_records,
            "recovery_s": round(status.recovery_s, 4),
            "error": status.error,
        }
        if args.json:
            print(json.dumps(line, sort_keys=True), flush=True)
        else:
            print(
                f"shard {status.subscription}/{status.vchannel} {status.state} token "
                f"{status.token} at lsn {status.checkpoint.source_lsn} "
                f"(replayed {status.replayed_records} records in {status.recovery_s:.3f} s)"
                + (f": {status.error}" if status.error else ""),
                flush=True,
            )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with StreamingClient(client) as streaming:
            service = ConsumerService(
                streaming,
                app,
                args.subscription,
                member_id=member_id,
                data_dir=args.data_dir,
                lease_ttl_ms=args.lease_ttl_ms,
                on_status=report,
                max_batch_messages=args.max_batch_messages,
                linger_ms=args.linger_ms,
            )
            print(f"consumer {member_id} running {args.app} on {args.subscription}", flush=True)
            await service.run(stop)
    except ChannelFencedError as error:
        print(f"error: fenced: {error.info.message}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    print(f"consumer {member_id} stopped", flush=True)
    return 0
