"""The executors' Python: PySpark starts whatever ``python3`` is first on PATH for the
workers unless told otherwise, and a Python without grpc failed deep inside a long Spark
error. ``spark_connector.register`` points local-mode executors at the driver's own
interpreter, so a script run with the venv's python works without an activated venv.

Runs in a subprocess with a plain ``SparkSession.builder`` (not raftwal's session helper,
which sets the interpreter itself) and PYSPARK_PYTHON naming a bare Python of the same
version that has no grpc, as the system's python3 usually is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import scaled

pytestmark = pytest.mark.spark

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = scaled(180.0)

_SCRIPT = """
import sys
from pyspark.sql import SparkSession
import spark_connector

spark = (
    SparkSession.builder.master("local[1]")
    .appName("raftwal-executor-python")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
try:
    if sys.argv[1] == "register":
        spark_connector.register(spark)
    # An executor task that needs what the connector needs.
    imported = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("grpc").__name__
    ).collect()
    print("IMPORTED", imported)
finally:
    spark.stop()
"""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python of the driver's version with nothing installed (no grpc)."""
    directory = tmp_path_factory.mktemp("bare") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run(
        [base, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=scaled(120)
    )
    python = str(directory / "bin" / "python")
    missing = subprocess.run([python, "-c", "import grpc"], capture_output=True, timeout=scaled(60))
    assert missing.returncode != 0, "the bare Python unexpectedly has grpc"
    return python


def _run(mode: str, python: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = python
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_register_points_local_executors_at_the_drivers_python(bare_python: str) -> None:
    done = _run("register", bare_python)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "IMPORTED ['grpc']" in done.stdout


def test_without_register_the_bare_python_fails(bare_python: str) -> None:
    # The check above can fail: the same task in the bare Python cannot import grpc.
    done = _run("plain", bare_python)
    assert done.returncode != 0
    assert "No module named 'grpc'" in done.stderr
