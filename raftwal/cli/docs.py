"""The CLI reference, docs/cli.md, generated from the ``raftwal`` argparse parser.

The reference is written from the same parser that parses the command line, so a command or
flag cannot exist without being documented, nor be documented after it is gone. Run
``python -m raftwal.cli.docs --write`` after changing a command; ``tests/unit/test_cli_docs.py``
fails when docs/cli.md differs from what :func:`render` returns.

This module only reads the parser: it never runs a command, and its output depends on
nothing but the parser (no environment, no terminal width), so it is the same on every
machine. Defaults are not rendered from the parser because some are read from the
environment; each flag's help text states its default.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Where the reference lives, relative to the repository root.
CLI_DOC = Path("docs/cli.md")
#: An option whose flags and help are the same in at least this many commands is listed
#: once, under "Common options", instead of in every command's table.
COMMON_OPTION_MIN_COMMANDS = 8

HEADER = """\
# CLI reference

Every `raftwal` command and flag. This page is generated from the command's own argparse
parser by `raftwal/cli/docs.py`: do not edit it by hand; run
`.venv/bin/python -m raftwal.cli.docs --write` after changing a command
(`tests/unit/test_cli_docs.py` fails when it is stale). `raftwal COMMAND --help` prints the
same help on a terminal; [Getting started](getting-started.md#try-it) shows the commands at
work, with the exit codes.
"""


@dataclass(frozen=True)
class Command:
    """One parser of the tree: the top-level ``raftwal`` or a (sub-)sub-command."""

    path: tuple[str, ...]
    help: str
    parser: argparse.ArgumentParser

    @property
    def name(self) -> str:
        return " ".join(("raftwal", *self.path))

    @property
    def anchor(self) -> str:
        return "-".join(("raftwal", *self.path))


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = (), text: str = ""
) -> Iterator[Command]:
    """Every parser of the tree, depth first, sub-commands in the order they were added."""
    yield Command(path, text, parser)
    group = _subparsers(parser)
    if group is None:
        return
    helps = {choice.dest: choice.help or "" for choice in group._choices_actions}
    for name, child in group.choices.items():
        yield from walk(child, (*path, name), helps.get(name, ""))


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        and action.help != argparse.SUPPRESS
    ]


def _one_line(text: str) -> str:
    """One line of Markdown: whitespace folded, pipes escaped for tables, and outside code
    spans ``<`` escaped so that ``<dev-dir>`` is not taken for an HTML tag."""
    pieces = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(
        piece if index % 2 else piece.replace("<", "\\<") for index, piece in enumerate(pieces)
    )


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        # argparse expands %(name)s in help strings from the action's attributes.
        params = {**vars(action), "prog": prog}
        params = {key: value for key, value in params.items() if value is not argparse.SUPPRESS}
        text = text % params
    notes = []
    if action.required and action.option_strings:
        notes.append("required")
    if isinstance(action, argparse._AppendAction):
        notes.append("may be given more than once")
    line = _one_line(text)
    if notes:
        line = f"{line} ({'; '.join(notes)})" if line else "; ".join(notes)
    return line


def _metavar(action: argparse.Action) -> str:
    if action.metavar is None and action.choices is not None:
        return "{" + ",".join(str(choice) for choice in action.choices) + "}"
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    return action.dest.upper() if action.option_strings else action.dest


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        metavar = _metavar(action)
        return f"`{metavar}`" + (" ..." if action.nargs in ("*", "+") else "")
    names = ", ".join(action.option_strings)
    if _takes_value(action):
        return f"`{names} {_metavar(action)}`"
    return f"`{names}`"


def _signature(action: argparse.Action) -> tuple[object, ...]:
    return (tuple(action.option_strings), action.help, action.metavar, action.nargs)


def _synopsis(command: Command) -> str:
    words = [command.name]
    group = _subparsers(command.parser)
    arguments = _arguments(command.parser)
    if any(action.option_strings for action in arguments):
        words.append("[OPTIONS]")
    for action in arguments:
        if not action.option_strings:
            metavar = _metavar(action)
            words.append(f"[{metavar} ...]" if action.nargs in ("*", "?") else metavar)
    if group is not None:
        words.append(group.metavar if isinstance(group.metavar, str) else "COMMAND")
    return " ".join(words)


def render(parser: argparse.ArgumentParser) -> str:
    """The whole reference for ``parser`` (the ``raftwal`` parser), as Markdown."""
    commands = list(walk(parser))
    leaves = [command for command in commands if _subparsers(command.parser) is None]
    counts = Counter(
        _signature(action)
        for command in leaves
        for action in _arguments(command.parser)
        if action.option_strings
    )
    common = {signature for signature, n in counts.items() if n >= COMMON_OPTION_MIN_COMMANDS}
    common_actions: dict[tuple[object, ...], argparse.Action] = {}
    for command in leaves:
        for action in _arguments(command.parser):
            if _signature(action) in common:
                common_actions.setdefault(_signature(action), action)

    out = [HEADER]
    out.append("## Commands\n")
    for command in commands[1:]:
        indent = "  " * (len(command.path) - 1)
        summary = f": {_one_line(command.help)}" if command.help else ""
        out.append(f"{indent}- [`{command.name}`](#{command.anchor}){summary}")
    out.append("")
    if common_actions:
        out.append("## Common options\n")
        out.append(
            "The commands that talk to a cluster all take these: where the cluster is, how long "
            "to wait, how to print, and how to authenticate.\n"
        )
        out.append("| option | meaning |")
        out.append("|---|---|")
        for action in common_actions.values():
            out.append(f"| {_flag(action)} | {_help(action, 'raftwal')} |")
        out.append("")
    for command in commands:
        out.extend(_render_command(command, common))
    return "\n".join(out).rstrip("\n") + "\n"


def _render_command(command: Command, common: set[tuple[object, ...]]) -> list[str]:
    parser = command.parser
    out = [f"## {command.name}", ""]
    if command.help:
        out += [_one_line(command.help)[:1].upper() + _one_line(command.help)[1:] + ".", ""]
    if parser.description and parser.description != command.help:
        out += [_one_line(parser.description), ""]
    out += ["```text", _synopsis(command), "```", ""]
    own = [action for action in _arguments(parser) if _signature(action) not in common]
    has_common = any(_signature(action) in common for action in _arguments(parser))
    if own:
        out += ["| argument | meaning |", "|---|---|"]
        out += [f"| {_flag(action)} | {_help(action, parser.prog)} |" for action in own]
        out.append("")
    if has_common:
        out += ["Also takes the [common options](#common-options).", ""]
    group = _subparsers(parser)
    if group is not None:
        children = ", ".join(f"[`{name}`](#{command.anchor}-{name})" for name in group.choices)
        out += [f"Sub-commands: {children}.", ""]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the reference, or write it to docs/cli.md with ``--write``."""
    from raftwal.cli.main import build_parser

    arguments = argparse.ArgumentParser(
        prog="python -m raftwal.cli.docs", description="generate docs/cli.md from the parser"
    )
    arguments.add_argument(
        "--write", action="store_true", help=f"write {CLI_DOC} instead of printing it"
    )
    arguments.add_argument(
        "--root", type=Path, default=Path("."), help="the repository root (default: .)"
    )
    options = arguments.parse_args(argv)
    text = render(build_parser())
    if options.write:
        (options.root / CLI_DOC).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
