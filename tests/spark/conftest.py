"""One SparkSession for every Spark test (starting one costs 6-18 s here): local[2], UI
off, bound to 127.0.0.1, Python filter pushdown on, the `raftwal` source registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def session_builder(master: str, app: str) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.python.worker.reuse", "true")
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import spark_connector

    session = session_builder("local[2]", "raftwal-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    spark_connector.register(session)
    try:
        yield session
    finally:
        session.stop()
