"""Every code block of README.md and docs/*.md is checked by its language.

Python blocks run against a dev cluster (tests/cluster/test_readme.py). Here: every block
has a language the rule knows (tests/doc_blocks.py), every `raftwal` command line of a
shell block parses with the CLI's own parser (so a renamed command or flag breaks the
docs' build, not the reader), and every TOML block is valid TOML.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import tomllib

import pytest

from raftwal.cli.main import build_parser
from tests.doc_blocks import LANGUAGES, SHELL, TOML, all_blocks

# Ways a command line can start that run the raftwal CLI.
PREFIXES = (("raftwal",), (".venv/bin/raftwal",), ("./run", "raftwal"))


def command_lines(text: str) -> list[list[str]]:
    """The raftwal invocations of a shell block, comments and continuations handled."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for prefix in PREFIXES:
            if tuple(words[: len(prefix)]) == prefix:
                found.append(words[len(prefix) :])
    return found


def parse_error(arguments: list[str]) -> str | None:
    """None if the CLI parser accepts the arguments, else what it printed."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(arguments)
    except SystemExit as stop:
        if stop.code not in (0, None):
            return errors.getvalue().strip() or f"exit {stop.code}"
    return None


def test_every_block_has_a_language_the_rule_knows() -> None:
    blocks = all_blocks()
    assert len(blocks) > 20
    unknown = [f"{b.where}: ```{b.language}" for b in blocks if b.language not in LANGUAGES]
    assert not unknown, (
        "a code block needs one of the languages of tests/doc_blocks.py "
        f"({', '.join(sorted(LANGUAGES))}): " + "; ".join(unknown)
    )


def test_every_raftwal_command_in_a_shell_block_parses() -> None:
    checked = 0
    wrong = []
    for block in all_blocks():
        if block.language not in SHELL:
            continue
        for arguments in command_lines(block.text):
            checked += 1
            error = parse_error(arguments)
            if error is not None:
                wrong.append(f"{block.where}: raftwal {shlex.join(arguments)}\n  {error}")
    assert checked >= 20, f"only {checked} raftwal command lines found in the docs"
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "line",
    [
        "raftwal channel create --count 4 --no-such-flag",
        "./run raftwal no-such-command",
        "raftwal balance sideways",
    ],
)
def test_a_broken_command_line_is_caught(line: str) -> None:
    (arguments,) = command_lines(line + "   # a comment\n")
    assert parse_error(arguments) is not None


def test_command_lines_skip_what_is_not_the_raftwal_cli() -> None:
    text = "./run demo\n# raftwal status\nexport X=1\nraftwal status --json  # healthy?\n"
    assert command_lines(text) == [["status", "--json"]]


def test_every_toml_block_parses() -> None:
    toml_blocks = [b for b in all_blocks() if b.language in TOML]
    assert toml_blocks
    for block in toml_blocks:
        try:
            tomllib.loads(block.text)
        except tomllib.TOMLDecodeError as error:
            pytest.fail(f"{block.where}: {error}")
