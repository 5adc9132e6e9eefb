"""PySpark Python Data Source ``raftwal`` reading committed WAL segments.

    import spark_connector
    spark_connector.register(spark)
    df = spark.read.format("raftwal").option("endpoints", "h1:7201,h2:7201").load()

Imports only ``rpc`` (client) and ``wal_segments`` (segment reader) from raftwal.
"""

from __future__ import annotations

from typing import Any

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> type:
    """Register the `raftwal` format with `spark` and return the class registered: the
    variant with filter pushdown when the session enables `PUSHDOWN_CONF` (Spark refuses a
    reader with pushFilters otherwise). Register again after changing that setting."""
    from spark_connector.datasource import RaftwalDataSource, RaftwalPushdownDataSource

    enabled = str(spark.conf.get(PUSHDOWN_CONF, "false")).lower() == "true"
    source = RaftwalPushdownDataSource if enabled else RaftwalDataSource
    spark.dataSource.register(source)
    return source


__all__ = ["PUSHDOWN_CONF", "register"]
