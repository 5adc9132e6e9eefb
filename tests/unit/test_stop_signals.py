"""A stop signal that lands while asyncio closes a node process's loop leaves no noise.

asyncio's ``close()`` closes the loop's self-pipe before it removes the signal handlers; a
SIGTERM in between (the supervisor stopping workers that are already stopping) had Python
print "Exception ignored when trying to write to the signal wakeup fd" into the node's
log, after the process's last line (tests/cluster/test_one_process_per_node_id.py read
that line and failed once in a full run). The race is made certain here: the script sends
itself SIGTERM right after the self-pipe closes.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.timing import scaled

SCRIPT = r"""
import asyncio, os, signal, sys
from raftwal.node import stop_signals

how = sys.argv[1]

async def main():
    loop = asyncio.get_running_loop()
    if how == "bare":  # what the processes did before stop_signals
        for signum in stop_signals.STOP_SIGNALS:
            loop.add_signal_handler(signum, lambda: None)
    else:
        stop_signals.install(loop, lambda: None)
        stop_signals.release(loop, ignore=how == "worker")
    close_self_pipe = loop._close_self_pipe

    def close_then_signal():
        close_self_pipe()
        os.kill(os.getpid(), signal.SIGTERM)

    loop._close_self_pipe = close_then_signal

asyncio.run(main())
print("exited normally", flush=True)
"""

NOISE = "Exception ignored when trying to write to the signal wakeup fd"


def _run(how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, how],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )


def test_the_race_is_real_without_releasing_the_handlers() -> None:
    bare = _run("bare")
    assert NOISE in bare.stderr, bare.stderr


@pytest.mark.parametrize(
    ("how", "returncode", "stdout"),
    [("worker", 0, "exited normally\n"), ("control", -signal.SIGTERM, "")],
)
def test_released_handlers_leave_no_noise(how: str, returncode: int, stdout: str) -> None:
    # A worker ignores the late signal and ends as it was ending; the control process
    # takes the signal's default action, as a process with no handler does.
    result = _run(how)
    assert NOISE not in result.stderr, result.stderr
    assert result.returncode == returncode, (result.returncode, result.stderr)
    assert result.stdout == stdout
