"""The fenced code blocks of README.md and docs/*.md, and what is done with each language.

docs/README.md ("Code blocks in these pages") states the rule for writers; the tests that
apply it are tests/cluster/test_readme.py (Python blocks run against a dev cluster) and
tests/unit/test_doc_blocks.py (every other language). A block whose language is in none of
the sets below fails, so nothing in the docs is silently unchecked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Run as a whole script against a dev cluster.
RUN = frozenset({"python"})
#: Every `raftwal` command line must parse with the CLI's parser.
SHELL = frozenset({"bash", "sh"})
#: Parsed with tomllib.
TOML = frozenset({"toml"})
#: Shown to the reader, not checked: output, file trees, configs of other tools, and
#: Python that is explicitly not meant to run.
ILLUSTRATIVE = frozenset({"text", "yaml", "python-illustrative"})
LANGUAGES = RUN | SHELL | TOML | ILLUSTRATIVE

FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root, e.g. "docs/sdk.md"
    line: int  # 1-based line of the opening fence
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The pages whose blocks are checked: docs/*.md by name, then README.md (its snippets
    repeat the guides' and run last, after the guides set up what they read)."""
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one page, in page order."""
    found: list[Block] = []
    lines = path.read_text().split("\n")
    opened: tuple[int, str, str, str] | None = None  # line, indent, fence, language
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        match = FENCE.match(line)
        if opened is None:
            if match:
                opened = (number, match.group(1), match.group(2), match.group(3).strip())
                body = []
            continue
        start, indent, fence, language = opened
        if match and match.group(2).startswith(fence) and not match.group(3).strip():
            page = path.relative_to(ROOT).as_posix()
            found.append(Block(page, start, language, "\n".join(body) + "\n"))
            opened = None
            continue
        body.append(line[len(indent) :] if line.startswith(indent) else line)
    assert opened is None, f"{path}:{opened[0]}: the block is never closed"
    return found


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in blocks(path)]
