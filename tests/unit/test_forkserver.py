"""The fork server that the suite's workers start nodes from (raftwal.cli.forkserver): a
forked node is the process ``python -m raftwal.cli ARGV`` would be (argv, environment,
working directory, log file, session, exit status), each with a random state of its own,
and nothing it forked outlives the server. Real processes, no cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftwal.cli.forkserver import ForkServer
from tests.timing import scaled

PROBE = "tests.unit.forkserver_probe"


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # In the server's environment, not in the one each child is given.
    monkeypatch.setenv("PROBE_ABSENT", "server")
    fork_server = ForkServer(tmp_path / "forkserver.log")
    try:
        yield fork_server
    finally:
        fork_server.close()


def _wait_for(predicate, what: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {scaled(timeout_s):.0f} s")


def _probe_lines(log: Path) -> dict[str, str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return dict(line.split(" ", 1) for line in lines if " " in line)


def _spawn_probe(server: ForkServer, tmp_path: Path, name: str, **env: str):
    environment = {k: v for k, v in os.environ.items() if k != "PROBE_ABSENT"}
    environment.update({"PROBE_VALUE": "here", **env})
    log = tmp_path / f"{name}.log"
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    process = server.spawn(["a", "b c"], env=environment, log_path=log, cwd=cwd, module=PROBE)
    return process, log


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_a_forked_child_runs_as_python_dash_m_would(server: ForkServer, tmp_path: Path) -> None:
    process, log = _spawn_probe(server, tmp_path, "exit3", PROBE_EXIT="3")
    assert process.wait(timeout=scaled(20)) == 3
    assert process.returncode == 3
    seen = _probe_lines(log)
    assert seen["argv"] == "['a', 'b c']"
    assert seen["argv0"].endswith("tests/unit/forkserver_probe.py")
    assert seen["orig_argv"] == repr([sys.executable, "-m", PROBE, "a", "b c"])
    assert seen["cwd"] == str(tmp_path / "cwd")
    # The child's environment is the one asked for, not the server's.
    assert seen["env"] == "here None"
    assert seen["session"] == "True"
    assert seen["stdin"] == "b''"
    # stdin, stdout, stderr and the directory being listed: nothing of the server's.
    assert set(eval(seen["fds"])) <= {0, 1, 2, 3}, seen["fds"]
    assert log.stat().st_mode & 0o777 == 0o600


def test_each_child_has_a_random_state_of_its_own(server: ForkServer, tmp_path: Path) -> None:
    draws = []
    for index in range(3):
        process, log = _spawn_probe(server, tmp_path, f"random{index}", PROBE_EXIT="0")
        assert process.wait(timeout=scaled(20)) == 0
        draws.append(_probe_lines(log)["random"])
    assert len(set(draws)) == 3, draws


def test_a_killed_child_is_reported_and_its_pid_kept_until_seen(
    server: ForkServer, tmp_path: Path
) -> None:
    process, log = _spawn_probe(server, tmp_path, "sleeper")
    _wait_for(lambda: "stdin" in _probe_lines(log), "the probe started")
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    os.kill(process.pid, signal.SIGKILL)
    # Until this process has seen the exit, the server keeps the child a zombie: its pid
    # cannot be reused by a process that a late signal would then hit.
    _wait_for(lambda: _state(process.pid) == "Z", "the killed child is a zombie")
    time.sleep(0.3)
    assert _state(process.pid) == "Z"
    assert process.wait(timeout=scaled(20)) == -signal.SIGKILL
    _wait_for(lambda: _state(process.pid) is None, "the child reaped once its exit was seen")
    # Like Popen's: no signal once the exit is known.
    process.send_signal(signal.SIGKILL)
    process.terminate()


def test_stopping_the_server_stops_every_child_it_forked(
    server: ForkServer, tmp_path: Path
) -> None:
    processes = [_spawn_probe(server, tmp_path, f"orphan{i}")[0] for i in range(2)]
    for index in range(2):
        _wait_for(
            lambda i=index: "stdin" in _probe_lines(tmp_path / f"orphan{i}.log"),
            "the probes started",
        )
    server.close()
    for process in processes:
        _wait_for(lambda p=process: _state(p.pid) is None, f"pid {process.pid} gone")
    assert not server.alive
