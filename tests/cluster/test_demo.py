"""The README's main job, `raftwal demo`, run as a user runs it: three node processes on
127.0.0.1, produce, kill -9 the owner, fail over, restart, compare replicas, and read the
committed segments with a real SparkSession. The demo checks the Spark rows against the
messages it had acknowledged and exits non-zero when they differ; here it must exit 0,
show every step, and leave no node process behind.

The demo runs in its own process session: on a timeout the whole group (the demo, its
nodes and its JVM) is killed by the session's id, nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftwal.cli import dev
from tests.processes import start_in_own_session
from tests.timing import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The demo takes 30-40 s here, most of it Spark's start.
DEMO_TIMEOUT_S = 240.0
#: How long children may take to exit after the demo has.
LINGER_S = 10.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): only a running process counts.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"{pid}: (gone)"
    return f"{pid}: " + raw.replace(b"\0", b" ").decode(errors="replace")[:300]


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and _alive(int(entry.name)):
                members.append(int(entry.name))
    return members


@pytest.mark.timeout(int(DEMO_TIMEOUT_S) + 60)
def test_the_readme_demo_runs_end_to_end(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "120"  # rich wraps at the terminal width; keep the lines whole
    # The demo's cluster lives in a temporary directory: here, so that its nodes (each in
    # a session of its own, out of the demo's group) can be found and stopped by their
    # recorded pids if the demo does not stop them itself.
    env["TMPDIR"] = str(tmp_path)
    log_path = tmp_path / "demo.log"
    started = time.monotonic()
    demo = start_in_own_session(
        [
            sys.executable,
            "-c",
            "import sys; from raftwal.cli.main import main; sys.exit(main())",
            "demo",
        ],
        cwd=tmp_path,
        env=env,
        log_path=log_path,
    )
    try:
        code = demo.wait(timeout=scaled(DEMO_TIMEOUT_S))
    except subprocess.TimeoutExpired:
        code = None
    finally:
        # Children that are stopping when the demo exits (its JVM ends once the demo's
        # end of their pipe closes) get a moment; anything still running after it is left.
        deadline = time.monotonic() + scaled(LINGER_S)
        leftovers = _group_members(demo.pid)
        while leftovers and code is not None and time.monotonic() < deadline:
            time.sleep(0.2)
            leftovers = _group_members(demo.pid)
        described = [_command_line(pid) for pid in leftovers]
        if leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)
        if demo.poll() is None:
            demo.wait(timeout=scaled(10))
        stopped_nodes = []
        for directory in tmp_path.glob("raftwal-demo-*"):
            with contextlib.suppress(Exception):
                stopped_nodes += dev.down(directory)
    output = log_path.read_text(errors="replace")
    elapsed = time.monotonic() - started
    assert code == 0, f"demo exited with {code} after {elapsed:.0f} s:\n{output[-6000:]}"
    assert not leftovers, f"the demo left processes running: {described}\n{output[-3000:]}"
    assert not stopped_nodes, f"the demo left node processes running: {stopped_nodes}"
    for step in (
        "three nodes on 127.0.0.1",
        "every replica holds the same state at the same revision",
        "Spark reads the committed segments",
        "done: all node processes stopped",
    ):
        assert step in output, f"missing {step!r}:\n{output[-6000:]}"
    # The demo's own check of Spark's rows against what it had acknowledged.
    match = re.search(
        r"orders: ([\d,]+) rows in [\d.]+ s, exactly the ([\d,]+) acknowledged", output
    )
    assert match is not None, output[-6000:]
    assert match.group(1) == match.group(2) and int(match.group(1).replace(",", "")) > 0


@pytest.mark.timeout(int(DEMO_TIMEOUT_S) + 60)
def test_sigterm_stops_the_demo_and_its_nodes(tmp_path: Path) -> None:
    """SIGTERM to the demo (a terminal closed, a CI job cancelled) stops its node
    processes, which run in sessions of their own, out of the demo's process group."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)
    log_path = tmp_path / "demo.log"
    demo = start_in_own_session(
        [
            sys.executable,
            "-c",
            "import sys; from raftwal.cli.main import main; sys.exit(main())",
            "demo",
        ],
        cwd=tmp_path,
        env=env,
        log_path=log_path,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + scaled(DEMO_TIMEOUT_S)
        while "cluster up in" not in log_path.read_text(errors="replace"):
            assert demo.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the demo's cluster did not come up"
            time.sleep(0.2)
        for path in tmp_path.glob("raftwal-demo-*/cluster.json"):
            pids += [node["pid"] for node in json.loads(path.read_text())["nodes"]]
        assert len(pids) == 3, pids
        os.kill(demo.pid, signal.SIGTERM)
        code = demo.wait(timeout=scaled(60))
        assert code == 128 + signal.SIGTERM, log_path.read_text(errors="replace")[-3000:]
        assert [pid for pid in pids if _alive(pid)] == [], "node processes left running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)
        if demo.poll() is None:
            demo.wait(timeout=scaled(10))
        for directory in tmp_path.glob("raftwal-demo-*"):
            with contextlib.suppress(Exception):
                dev.down(directory)
