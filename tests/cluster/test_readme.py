"""The Python snippets of the docs run exactly as written.

Every fenced ``python`` block of docs/*.md and README.md (tests/doc_blocks.py: docs/ by name,
then the README) is written to a file and run, in that order, with the venv's interpreter
outside an activated venv (no venv on PATH, no PYSPARK_PYTHON), as a user who copied it
would, against a dev cluster with the `orders` vchannel that "Try it" creates. Each must
exit 0 and print what it promises. A block identical to one already run (the README repeats
one snippet of each guide) is not run twice. Blocks in other languages are checked by
tests/unit/test_doc_blocks.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.doc_blocks import RUN, Block, all_blocks
from tests.timing import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

TIMEOUT_S = scaled(240.0)
# What each Python block of a page, in page order, must print (a fragment of its output).
# A page with Python blocks that is not listed here, or with more or fewer, fails.
EXPECTED = {
    "docs/sdk.md": [
        "fencing token",
        "order 1 at lsn",
        "audit stands at lsn",
        "pack (",
        "exactly once: True",
    ],
    "docs/spark.md": ["orders", "streamed", "exported"],
    "README.md": ["fencing token", "orders"],
}


def python_blocks() -> list[Block]:
    return [block for block in all_blocks() if block.language in RUN]


def snippets() -> list[tuple[Block, str]]:
    """Each Python block to run, in order, with what it must print; a block identical to
    an earlier one is left out."""
    expected = {page: iter(fragments) for page, fragments in EXPECTED.items()}
    found, seen = [], set()
    for block in python_blocks():
        fragment = next(expected.get(block.page, iter(())), None)
        if block.text not in seen and fragment is not None:
            seen.add(block.text)
            found.append((block, fragment))
    return found


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    with running_cluster(tmp_path_factory.mktemp("readme")) as running:
        _, client = running
        (pchannel,) = setup_channels(client, "wal", {"orders": 0})
        wait_assigned(client, pchannel)
        yield running


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every snippet, as a user running them one after another."""
    return tmp_path_factory.mktemp("snippets")


def test_the_pages_have_the_snippets_this_test_expects() -> None:
    counts: dict[str, int] = {}
    for block in python_blocks():
        counts[block.page] = counts.get(block.page, 0) + 1
    assert counts == {page: len(expected) for page, expected in EXPECTED.items()}


# One test per snippet, in page order (each later one reads what earlier ones wrote), so
# each has the per-test time bound of its own and a failure names its page and line.
@pytest.mark.parametrize(
    ("block", "fragment"), snippets(), ids=[block.where for block, _ in snippets()]
)
def test_the_snippet_runs_as_written(env, workdir: Path, block: Block, fragment: str) -> None:
    cluster, _ = env
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
    }
    venv_bin = str(Path(sys.executable).parent)
    environ["PATH"] = os.pathsep.join(
        part for part in environ.get("PATH", "").split(os.pathsep) if part != venv_bin
    )
    environ["RAFTWAL_ENDPOINTS"] = ",".join(cluster.endpoints)
    script = workdir / f"{block.page.replace('/', '_')}_{block.line}.py"
    script.write_text(block.text)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=workdir,
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, f"{block.where}:\n{block.text}\n{done.stderr[-3000:]}"
    assert fragment in done.stdout, f"{block.where} printed:\n{done.stdout}"
