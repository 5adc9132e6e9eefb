"""Starting a SparkSession for the connector: loopback, UI off, this Python for the
workers, and a JVM start that says why it failed.

PySpark starts its JVM (`spark-submit` with a Py4J gateway) on the first SparkContext and,
when that JVM exits early, raises only `JAVA_GATEWAY_EXITED` ("exited before sending its
port number"); what the JVM printed went to the parent's stderr and is usually lost. Here
the JVM's stdout and stderr go to a log file, a failed start is retried a bounded number of
times, and the error names the log and quotes its tail.

Used by `raftwal spark-read`, the demo, the chaos checker, the benchmarks and the tests.
Only the driver imports this module; it must never be imported on an executor.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Failed JVM starts are retried this many times in all (the first one included).
START_ATTEMPTS = 3
#: Pause between two attempts.
START_RETRY_PAUSE_S = 2.0
#: Lines of the JVM log quoted in a start error.
LOG_TAIL_LINES = 40


class SparkStartError(RuntimeError):
    """The JVM behind a SparkSession did not start: the message quotes what it printed."""


def base_settings(master: str, app: str) -> dict[str, str]:
    """The settings every raftwal session uses: bound to 127.0.0.1, UI and console progress
    off, Python filter pushdown on, this interpreter on the driver and the workers."""
    return {
        "spark.master": master,
        "spark.app.name": app,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }


def _launch_gateway(conf: Any, jvm_log: Path, attempts: int, pause_s: float) -> Any:
    """Start the Py4J gateway JVM with its output appended to `jvm_log`; up to `attempts`
    starts, `pause_s` apart. Raises SparkStartError with the log's tail."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    failures: list[str] = []
    for attempt in range(1, attempts + 1):
        start_offset = jvm_log.stat().st_size if jvm_log.exists() else 0
        with open(jvm_log, "ab") as log_file:
            try:
                return launch_gateway(
                    conf, popen_kwargs={"stdout": log_file, "stderr": subprocess.STDOUT}
                )
            except PySparkRuntimeError as error:
                failure = str(error).strip().splitlines()[0]
        with open(jvm_log, "rb") as log_file:
            log_file.seek(start_offset)
            printed = log_file.read().decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        said = "\n".join(printed) if printed else "(the JVM printed nothing)"
        failures.append(f"attempt {attempt}/{attempts}: {failure}\n{said}")
        # Logged as well as raised: a retry that then succeeds still leaves a trace.
        logger.warning(
            "the Spark JVM did not start (attempt %d/%d; log %s):\n%s",
            attempt,
            attempts,
            jvm_log,
            said,
        )
        if attempt < attempts:
            time.sleep(pause_s)
    raise SparkStartError(
        f"the Spark JVM did not start after {attempts} attempt(s) (log {jvm_log}):\n"
        + "\n".join(failures)
    )


def start_session(
    master: str,
    app: str,
    settings: Mapping[str, str] | None = None,
    *,
    jvm_log: Path | None = None,
    attempts: int = START_ATTEMPTS,
    retry_pause_s: float = START_RETRY_PAUSE_S,
) -> Any:
    """A SparkSession with `base_settings` overridden by `settings`, log level ERROR.

    When this process has no JVM yet, it is started here with its output in `jvm_log`
    (default: a temporary file, removed once the JVM is up and kept when it fails). When a
    SparkContext already runs, it is reused as `SparkSession.builder.getOrCreate()` does,
    and JVM-level settings (driver memory, master) of the new call are ignored.
    """
    if attempts < 1:
        raise ValueError(f"invalid attempts ({attempts}; expected >= 1)")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    merged = {**base_settings(master, app), **(settings or {})}
    if SparkContext._active_spark_context is None:
        temporary = jvm_log is None
        if jvm_log is None:
            fd, name = tempfile.mkstemp(prefix="raftwal-spark-jvm-", suffix=".log")
            os.close(fd)
            jvm_log = Path(name)
        conf = SparkConf()
        for key, value in merged.items():
            conf.set(key, value)
        if SparkContext._gateway is None:
            gateway = _launch_gateway(conf, jvm_log, attempts, retry_pause_s)
            # The public way to hand PySpark a gateway: the context adopts it as the
            # process's JVM.
            SparkContext(conf=conf, gateway=gateway)
        else:
            SparkContext(conf=conf)
        if temporary:
            # The JVM keeps its open file; only the name goes.
            jvm_log.unlink(missing_ok=True)
    builder = SparkSession.builder
    for key, value in merged.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


__all__ = ["SparkStartError", "base_settings", "start_session"]
