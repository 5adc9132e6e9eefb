"""Every flag of every ``raftwal`` command says what it does, and its default when it has
one: the whole argparse tree is walked, so a new flag without help fails here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli.main import build_parser, main

# Old spellings kept working but not shown.
HIDDEN_ALIASES = {"--dir"}


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield path, action


ACTIONS = list(_walk(build_parser(), ("raftwal",)))


def test_the_walk_sees_every_command() -> None:
    commands = {" ".join(path) for path, _ in ACTIONS}
    for expected in ("raftwal dev up", "raftwal dev down", "raftwal status", "raftwal chaos"):
        assert expected in commands
    assert len(ACTIONS) > 100


def test_every_flag_has_help_with_its_default() -> None:
    missing = []
    for path, action in ACTIONS:
        name = "/".join(action.option_strings) or action.dest
        where = f"{' '.join(path)} {name}"
        if action.help == argparse.SUPPRESS:
            if not set(action.option_strings) <= HIDDEN_ALIASES:
                missing.append(f"{where}: hidden")
            continue
        if not action.help:
            missing.append(f"{where}: no help")
            continue
        default = action.default
        if default not in (None, False, [], "", argparse.SUPPRESS) and "default" not in action.help:
            missing.append(f"{where}: help does not say its default ({default!r})")
    assert not missing, "\n".join(missing)


def test_dev_commands_take_dev_dir_and_keep_dir_as_a_hidden_alias(tmp_path: Path) -> None:
    parser = build_parser()
    for flag in ("--dev-dir", "--dir"):
        args = parser.parse_args(["dev", "down", flag, str(tmp_path)])
        assert args.dir == tmp_path
    assert parser.parse_args(["dev", "down"]).dir == Path(".raftwal-dev")
    helps = [a.option_strings for p, a in ACTIONS if p == ("raftwal", "dev", "up")]
    assert ["--dev-dir"] in helps


def test_dev_up_help_lists_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["dev", "up", "--help"])
    out = capsys.readouterr().out
    for flag in ("--nodes", "--dev-dir", "--timeout-s", "--json", "--secure"):
        assert flag in out
    assert "--dir " not in out
