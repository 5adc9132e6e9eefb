"""Every relative link of the docs points at something that exists.

README.md, docs/*.md, RELIABILITY.md, SECURITY.md and BENCHMARKS.md link to each other and
into the code. A link's file (or directory) must exist, and a ``#fragment`` must name a
heading of the linked page, spelled as GitHub spells heading anchors.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "RELIABILITY.md",
    ROOT / "SECURITY.md",
    ROOT / "BENCHMARKS.md",
]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"`+[^`]*`+")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")


def prose(text: str) -> str:
    """The page without fenced blocks and code spans, where a link is not a link."""
    kept, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        kept.append("" if fenced else line)
    return CODE_SPAN.sub("", "\n".join(kept))


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, and
    -1, -2, ... for repeats."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = HEADING.match(line)
        if fenced or not match:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(text: str) -> list[str]:
    body = prose(text)
    return INLINE_LINK.findall(body) + REFERENCE.findall(body)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    wrong = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, fragment = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        name = page.relative_to(root).as_posix()
        if not linked.exists():
            wrong.append(f"{name}: {target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked.read_text()):
            wrong.append(f"{name}: {target} (no heading #{fragment} in {linked.name})")
    return wrong


def test_every_relative_link_points_at_an_existing_file_and_heading() -> None:
    checked = sum(len(links(page.read_text())) for page in PAGES)
    assert checked > 50, f"only {checked} links found: is the link pattern still right?"
    wrong = [problem for page in PAGES for problem in broken_links(page)]
    assert not wrong, "broken links:\n" + "\n".join(wrong)


def test_the_readme_links_every_guide() -> None:
    linked = {target.partition("#")[0] for target in links((ROOT / "README.md").read_text())}
    for guide in ("sdk", "spark", "operations", "cli", "architecture", "getting-started"):
        assert f"docs/{guide}.md" in linked, guide


def test_anchors_are_spelled_as_github_spells_them() -> None:
    text = "# A `code` title: (x)\n## Same\n## Same\n```text\n# not a heading\n```\n"
    assert anchors(text) == {"a-code-title-x", "same", "same-1"}


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# There\n")
    page.write_text(
        "[ok](there.md#there) [gone](missing.md) [bad anchor](there.md#nowhere)\n"
        "[self](#page) `[in code](missing.md)`\n# Page\n"
    )
    problems = [p.split(": ", 1)[1] for p in broken_links(page, tmp_path)]
    assert problems == [
        "missing.md (no such file)",
        "there.md#nowhere (no heading #nowhere in there.md)",
    ]
