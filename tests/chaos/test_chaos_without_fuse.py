"""`raftwal chaos` on a machine without libfuse3 (issue 53, item 1).

Only the "power" fault needs FUSE (raftwal/chaos/powerfs.py, through mfusepy, which loads
libfuse3 when imported). Here a stand-in `mfusepy` on PYTHONPATH fails its import exactly
as the real one does without the library (OSError "Unable to find libfuse"), and:

- every command's parser builds, `raftwal --help` and `raftwal chaos --help` exit 0, and
  nothing imported PowerFS;
- `raftwal chaos --faults power` exits 2 with one line that names
  scripts/install-fuse.sh, before it starts anything;
- a short `raftwal chaos --faults kill` runs, injects kills, and finds nothing wrong.

On the old code the chaos runner imported PowerFS at the top, so all three died with the
OSError's traceback (and so did `raftwal --help`, which imports every command's module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import scaled

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261123


@pytest.fixture
def no_fuse_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine whose libfuse3 is missing."""
    fake = tmp_path / "no-fuse"
    (fake / "mfusepy").mkdir(parents=True)
    (fake / "mfusepy" / "__init__.py").write_text(
        'raise OSError("Unable to find libfuse (hidden by the test)")\n'
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(fake), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    # The stand-in really hides the library.
    probe = subprocess.run(
        [sys.executable, "-c", "import mfusepy"], env=env, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "Unable to find libfuse" in probe.stderr
    return env


def _raftwal(
    env: dict[str, str], *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(timeout_s),
    )


def test_help_and_every_command_work_without_libfuse(no_fuse_env: dict[str, str]) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from raftwal.cli.main import build_parser\n"
            "build_parser()\n"
            "assert 'raftwal.chaos.powerfs' not in sys.modules, 'PowerFS was imported'\n"
            "assert 'mfusepy' not in sys.modules\n",
        ],
        env=no_fuse_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert built.returncode == 0, built.stderr
    for args in (("--help",), ("chaos", "--help")):
        done = _raftwal(no_fuse_env, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert "usage: raftwal" in done.stdout
        assert "Traceback" not in done.stderr


def test_the_power_fault_says_what_to_install(no_fuse_env: dict[str, str], tmp_path: Path) -> None:
    done = _raftwal(
        no_fuse_env, "chaos", "--faults", "kill,power", "--duration", "5", "--dir",
        str(tmp_path / "chaos"),
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "the power fault needs FUSE" in lines[0]
    assert "scripts/install-fuse.sh" in lines[0]
    assert "apt-get install fuse3 libfuse3-3" in lines[0]
    # Refused before anything started: no cluster directory was made.
    assert not (tmp_path / "chaos").exists()


@pytest.mark.timeout(300)
def test_a_short_kill_run_works_without_libfuse(
    no_fuse_env: dict[str, str], tmp_path: Path
) -> None:
    done = _raftwal(
        no_fuse_env, "chaos", "--faults", "kill", "--duration", "15", "--seed", str(SEED),
        "--no-spark", "--dir", str(tmp_path / "chaos"), "--json",
        timeout_s=240,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["faults"].get("kill", 0) >= 1, report["faults"]
    assert not report["violations"], report["violations"]
