"""The ``raftwal`` command line: argparse front end, human output with rich, ``--json`` for
machines. Each sub-command lives in its own module and registers itself here.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

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
        "demo", help="run the scripted demo scenario and print what happened"
    )
    demo.add_argument("--json", action="store_true", help="print events as JSON lines")
    demo.set_defaults(handler=_run_demo)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    from raftwal.demo import run_demo

    return run_demo(json_output=args.json)


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
