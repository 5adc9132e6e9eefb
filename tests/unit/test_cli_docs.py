"""docs/cli.md is what `raftwal/cli/docs.py` renders from the CLI's own parser.

Like the generated protobuf code, the CLI reference is committed and checked: a command or
flag added, changed or removed without `python -m raftwal.cli.docs --write` fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raftwal.cli import docs
from raftwal.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = ".venv/bin/python -m raftwal.cli.docs --write"


def test_the_committed_cli_reference_is_fresh() -> None:
    committed = (ROOT / docs.CLI_DOC).read_text()
    assert committed == docs.render(build_parser()), (
        f"{docs.CLI_DOC} is stale: run `{REGENERATE}` and commit the result"
    )


def test_every_command_and_flag_of_the_parser_is_in_the_reference() -> None:
    text = docs.render(build_parser())
    commands = list(docs.walk(build_parser()))
    assert len(commands) > 40  # the walk reached the sub-sub-commands
    for command in commands:
        assert f"\n## {command.name}\n" in text, command.name
        for action in command.parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text or f", {flag}" in text, (command.name, flag)


def test_a_new_flag_makes_the_committed_reference_stale() -> None:
    parser = build_parser()
    (dev,) = [c for c in docs.walk(parser) if c.path == ("dev", "up")]
    dev.parser.add_argument("--brand-new-flag", help="a flag nobody documented yet")
    rendered = docs.render(parser)
    assert "`--brand-new-flag BRAND_NEW_FLAG` | a flag nobody documented yet |" in rendered
    assert rendered != (ROOT / docs.CLI_DOC).read_text()


def test_the_reference_does_not_depend_on_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Some defaults are read from the environment (--log-format); none is rendered.
    before = docs.render(build_parser())
    monkeypatch.setenv("RAFTWAL_LOG_FORMAT", "json")
    monkeypatch.setenv("RAFTWAL_ENDPOINTS", "10.0.0.1:7201")
    monkeypatch.setenv("COLUMNS", "20")
    assert docs.render(build_parser()) == before


def test_write_puts_the_reference_where_the_docs_link_it(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    assert docs.main(["--write", "--root", str(tmp_path)]) == 0
    assert (tmp_path / docs.CLI_DOC).read_text() == docs.render(build_parser())
