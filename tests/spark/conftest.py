"""One SparkSession for every Spark test (starting one costs 6-18 s here): local[2], UI
off, bound to 127.0.0.1, Python filter pushdown on, the `raftwal` source registered. The
JVM's output goes to a `jvm.log` under pytest's temporary directory; a start that fails
quotes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: On top of `spark_connector.session.base_settings`.
TEST_SETTINGS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.python.worker.reuse": "true",
}


def start_test_session(
    master: str, app: str, extra: dict[str, str] | None = None, jvm_log: Path | None = None
) -> Any:
    from spark_connector.session import start_session

    return start_session(master, app, {**TEST_SETTINGS, **(extra or {})}, jvm_log=jvm_log)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import spark_connector

    jvm_log = tmp_path_factory.mktemp("spark") / "jvm.log"
    session = start_test_session("local[2]", "raftwal-tests", jvm_log=jvm_log)
    spark_connector.register(session)
    try:
        yield session
    finally:
        session.stop()
