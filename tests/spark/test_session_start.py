"""`spark_connector.session.start_session` when the JVM cannot start: a real `spark-submit`
given a driver heap size the JVM refuses exits before it sends its port. The error must
say so in the JVM's own words, after the bounded retries, and the log must keep every
attempt. Runs in a subprocess: a process has one JVM, and the session fixture's lives here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_connector.session import start_session
from tests.timing import scaled

pytestmark = pytest.mark.spark

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = scaled(120.0)

_SCRIPT = """
import json, sys
from pathlib import Path
from spark_connector.session import SparkStartError, start_session
from tests.timing import scaled

try:
    start_session(
        "local[1]",
        "raftwal-bad-heap",
        {"spark.driver.memory": "not-a-size"},
        jvm_log=Path(sys.argv[1]),
        attempts=2,
        retry_pause_s=0.1,
    )
except SparkStartError as error:
    print(json.dumps({"error": str(error)}))
    sys.exit(3)
print(json.dumps({"error": None}))
"""


def test_a_jvm_that_exits_at_start_is_retried_and_quoted(tmp_path: Path) -> None:
    jvm_log = tmp_path / "jvm.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(jvm_log)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert "after 2 attempt(s)" in error
    assert "attempt 1/2" in error and "attempt 2/2" in error
    # The JVM's own reason, quoted once per attempt, in the error and in the log.
    assert error.count("Invalid maximum heap size: -Xmxnot-a-size") == 2
    assert jvm_log.read_text().count("Invalid maximum heap size") == 2
    # Each failed attempt is also logged when it happens (a later success leaves a trace).
    assert done.stderr.count("the Spark JVM did not start (attempt") == 2


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"invalid attempts \(0; expected >= 1\)"):
        start_session("local[1]", "raftwal-no-attempts", attempts=0)


def test_spark_read_of_a_closed_cluster_says_so_in_one_sentence() -> None:
    # Nothing listens at the endpoint: the user gets the connector's sentence, not the
    # first line of a long Spark trace.
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    raftwal = str(Path(sys.executable).with_name("raftwal"))
    done = subprocess.run(
        [raftwal, "spark-read", "--endpoints", dead, "--timeout-s", "2", "--master", "local[1]"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith("error: no endpoint answered in 2 s"), errors[0]
    assert dead in errors[0]
