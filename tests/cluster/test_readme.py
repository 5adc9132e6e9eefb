"""The README's Python snippets run exactly as written.

Every fenced ``python`` block of README.md is written to a file and run, in order, with
the venv's interpreter outside an activated venv (no venv on PATH, no PYSPARK_PYTHON), as
a user who copied it would, against a dev cluster with the `orders` vchannel the README's
"Try it" commands create. Each must exit 0 and print what it promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import setup_channels, wait_assigned

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240.0
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
# What each block, in README order, must print (a fragment of its output).
EXPECTED = [
    "fencing token",
    "order 1 at lsn",
    "audit stands at lsn",
    "pack (",
    "orders",
    "exactly once: True",
    "streamed",
    "exported",
]


def readme_blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    with running_cluster(tmp_path_factory.mktemp("readme")) as running:
        _, client = running
        (pchannel,) = setup_channels(client, "wal", {"orders": 0})
        wait_assigned(client, pchannel)
        yield running


def test_the_readme_has_the_snippets_this_test_expects() -> None:
    assert len(readme_blocks()) == len(EXPECTED)


def test_every_readme_snippet_runs_as_written(env, tmp_path: Path) -> None:
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
    for number, (block, expected) in enumerate(zip(readme_blocks(), EXPECTED, strict=True)):
        script = tmp_path / f"readme_{number}.py"
        script.write_text(block)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 0, f"README block {number}:\n{block}\n{done.stderr[-3000:]}"
        assert expected in done.stdout, f"README block {number} printed:\n{done.stdout}"
