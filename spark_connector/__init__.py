"""PySpark Python Data Source ``raftwal`` reading committed WAL segments.

    import spark_connector
    spark_connector.register(spark)
    df = spark.read.format("raftwal").option("endpoints", "h1:7201,h2:7201").load()

Imports only ``rpc`` (client) and ``wal_segments`` (segment reader) from raftwal.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


class ExecutorPythonError(RuntimeError):
    """The Python that Spark starts for the connector cannot import it (one sentence, with
    the fix)."""


def _same_interpreter(command: str) -> bool:
    # Paths, not inodes: two venvs' pythons are links to one binary, but only the venv
    # whose site-packages hold raftwal can run the connector.
    found = shutil.which(command) or command
    return os.path.abspath(found) == os.path.abspath(sys.executable)


def check_executor_python(spark: Any) -> None:
    """Make sure the Python that Spark runs the connector in can import it.

    In local mode the executors are this machine, so they are pointed at the driver's own
    interpreter when they would start another one (PySpark's default is whatever
    ``python3`` is first on PATH, often the system's, which lacks grpc). Elsewhere a
    one-task job tries the import on an executor; a failure raises ExecutorPythonError
    naming the interpreter and the fix, instead of a long Spark error later."""
    context = spark.sparkContext
    executable = context.pythonExec
    if _same_interpreter(executable):
        return
    if str(context.master).startswith("local"):
        context.pythonExec = sys.executable
        return

    def probe(_: Any) -> Any:
        import importlib
        import sys as executor_sys

        try:
            for module in ("grpc", "pyarrow", "spark_connector.fetch"):
                importlib.import_module(module)
        except ImportError as error:
            return f"{executor_sys.executable}: {error}"
        return ""

    problems = [p for p in context.parallelize([0], 1).map(probe).collect() if p]
    if problems:
        raise ExecutorPythonError(
            f"the executors' Python cannot import the raftwal connector ({problems[0]}): "
            "install raftwal into that Python, or set spark.pyspark.python (PYSPARK_PYTHON) "
            "to an interpreter that has it"
        )


def register(spark: Any) -> type:
    """Register the `raftwal` format with `spark` and return the class registered: the
    variant with filter pushdown when the session enables `PUSHDOWN_CONF` (Spark refuses a
    reader with pushFilters otherwise). Register again after changing that setting.

    Checks first that the executors' Python can import the connector
    (``check_executor_python``)."""
    from spark_connector.datasource import RaftwalDataSource, RaftwalPushdownDataSource

    check_executor_python(spark)
    enabled = str(spark.conf.get(PUSHDOWN_CONF, "false")).lower() == "true"
    source = RaftwalPushdownDataSource if enabled else RaftwalDataSource
    spark.dataSource.register(source)
    return source


__all__ = ["PUSHDOWN_CONF", "ExecutorPythonError", "check_executor_python", "register"]
