"""The ``raftwal`` command line: argparse front end, human output with rich, ``--json`` for
machines. Each sub-command lives in its own module and registers itself here.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from raftwal import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftwal",
        description="Event-sourced coordination service and term-fenced WAL on Raft.",
    )
    parser.add_argument("--version", action="version", version=f"raftwal {__version__}")
    parser.add_argument(
        "--log-level", default="WARNING", help="logging level (DEBUG, INFO, WARNING, ...)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="start a three-node cluster on loopback and show it working"
    )
    demo.add_argument(
        "--state-machine",
        action="store_true",
        help="run the scripted scenario against the pure state machine only (no processes)",
    )
    demo.add_argument(
        "--json", action="store_true", help="with --state-machine: events as JSON lines"
    )
    demo.set_defaults(handler=_run_demo)

    node = commands.add_parser("node", help="run one raftwal node in the foreground")
    node.add_argument("--config", required=True, type=Path, help="cluster TOML file")
    node.add_argument("--id", required=True, help="this node's id in the config")
    node.set_defaults(handler=_run_node)

    dev = commands.add_parser("dev", help="a local cluster on 127.0.0.1")
    dev_commands = dev.add_subparsers(dest="dev_command", metavar="ACTION", required=True)
    dev_up = dev_commands.add_parser("up", help="start local nodes in the background")
    dev_up.add_argument("--nodes", type=int, default=3)
    dev_up.add_argument("--dir", type=Path, default=Path(".raftwal-dev"))
    dev_up.add_argument("--timeout-s", type=float, default=60.0)
    dev_up.add_argument("--json", action="store_true")
    dev_up.set_defaults(handler=_dev_up)
    dev_down = dev_commands.add_parser("down", help="stop the local nodes")
    dev_down.add_argument("--dir", type=Path, default=Path(".raftwal-dev"))
    dev_down.set_defaults(handler=_dev_down)

    from raftwal.cli_client import register
    from raftwal.cli_spark import register as register_spark

    register(commands)
    register_spark(commands)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    from raftwal.demo import run_cluster_demo, run_demo

    if args.state_machine:
        return run_demo(json_output=args.json)
    return run_cluster_demo()


def _run_node(args: argparse.Namespace) -> int:
    import asyncio

    from raftwal.config import ConfigError, load_config
    from raftwal.node import run_node

    try:
        config = load_config(args.config)
        config.node(args.id)
        asyncio.run(run_node(config, args.id))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def _dev_up(args: argparse.Namespace) -> int:
    import json

    from raftwal import dev

    if not 1 <= args.nodes <= 9:
        print(f"error: invalid --nodes ({args.nodes}; expected 1..9)", file=sys.stderr)
        return 2
    try:
        cluster = dev.up(args.dir, args.nodes, args.timeout_s)
    except (RuntimeError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    members = [
        {"id": n.id, "grpc": n.grpc_address, "raft": n.raft_address, "pid": cluster.pid(n.id)}
        for n in cluster.config.nodes
    ]
    if args.json:
        print(json.dumps({"dir": str(cluster.directory), "nodes": members}))
    else:
        print(f"raftwal dev cluster up ({len(members)} nodes, state in {cluster.directory})")
        for member in members:
            print(
                f"  {member['id']}  grpc {member['grpc']}  raft {member['raft']}  pid {member['pid']}"
            )
        print(f"endpoints: {','.join(m['grpc'] for m in members)}")
    return 0


def _dev_down(args: argparse.Namespace) -> int:
    from raftwal import dev

    pids = dev.down(args.dir)
    print(f"stopped {len(pids)} node process(es)" + (f": {pids}" if pids else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
