"""The command line imports what the command it runs needs: `raftwal status` does not
import the chaos runner, Spark's connector or the SQLite shards (over a second of CPU for
every CLI call before). Each module's commands are listed in `raftwal.cli.main`'s table;
these tests keep the table true and check the imports in a fresh interpreter."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from raftwal.cli.main import COMMAND_MODULES, OWN_COMMANDS, build_parser
from tests.timing import scaled

#: Modules that only some commands need.
HEAVY = ("raftwal.chaos", "pyarrow", "sqlite_utils", "pyspark", "spark_connector", "rpc.shards")


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(commands.choices)


@pytest.mark.parametrize("module", sorted(COMMAND_MODULES))
def test_the_table_names_exactly_the_commands_each_module_registers(module: str) -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    importlib.import_module(module).register(commands)
    assert tuple(commands.choices) == COMMAND_MODULES[module]


def test_the_own_commands_are_those_main_defines() -> None:
    assert tuple(_choices(build_parser(all_commands=False))) == OWN_COMMANDS


def test_the_whole_command_line_has_every_command_once() -> None:
    every = [*OWN_COMMANDS, *(name for names in COMMAND_MODULES.values() for name in names)]
    assert sorted(_choices(build_parser())) == sorted(every)
    assert len(set(every)) == len(every)


def _run(*argv: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`raftwal ARGV` in a fresh interpreter; what it exited with and which of HEAVY it
    had imported by then."""
    code = (
        "import atexit, json, sys\n"
        "from raftwal.cli.main import main\n"
        f"heavy = {list(HEAVY)!r}\n"
        "def report():\n"
        "    found = {h for h in heavy for m in list(sys.modules) if m == h or "
        "m.startswith(h + '.')}\n"
        "    print('IMPORTED', json.dumps(sorted(found)), file=sys.stderr)\n"
        "atexit.register(report)\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        stdin=subprocess.DEVNULL,
    )
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("IMPORTED ")][-1]
    return done, json.loads(line.removeprefix("IMPORTED "))


def test_a_client_command_imports_no_module_of_other_commands() -> None:
    # Nothing listens on port 1: the command fails after its own imports and one attempt.
    done, imported = _run("status", "--endpoints", "127.0.0.1:1", "--timeout-s", "0.2")
    assert done.returncode != 0
    assert "127.0.0.1:1" in done.stderr
    assert imported == []


def test_help_and_an_unknown_command_still_see_every_command() -> None:
    done, _ = _run("--help")
    assert done.returncode == 0
    for name in ("status", "chaos", "spark-read", "shard", "replicate", "init", "node"):
        assert name in done.stdout
    done, _ = _run("--log-level", "INFO", "nosuch")
    assert done.returncode == 2
    assert "invalid choice: 'nosuch'" in done.stderr and "'spark-read'" in done.stderr


def test_a_command_of_another_module_parses_as_before() -> None:
    done, imported = _run("simulate", "--help")
    assert done.returncode == 0 and "--seeds" in done.stdout, done.stdout
    assert "raftwal.chaos" not in imported
