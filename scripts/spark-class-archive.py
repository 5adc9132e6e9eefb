"""Build (once) a class-data-sharing archive of the Spark JVM for the test suite, and print
the JVM options that use it.

Every Spark JVM the tests start (the shared session, the docs' snippets, the demo, the
`raftwal export` and `spark-read` runs) spends most of its start loading and verifying the
same ten thousand classes, and compiling code that runs once. A dynamic CDS archive
(JDK 13+: `-XX:ArchiveClassesAtExit`) holds those classes ready to map; with C1 only
(`-XX:TieredStopAtLevel=1`, right for jobs of seconds) a local read of a few rows went
from 35 s to 20 s on the project's 2-core VM (docs/testing.md).

The archive depends on the JVM build and Spark's jars only, so it lives in the venv,
named after both, and is built again when either changes. Building it runs one small
local job (a DataFrame, a shuffle, Python workers, a Python data source, Parquet) under
`-XX:ArchiveClassesAtExit`: about 40 s. On any failure this prints nothing and exits 0:
the tests then start their JVMs without it, slower but the same. The options are used
by `./run test` only (exported as SPARK_SUBMIT_OPTS): a user's long jobs want C2.

Usage: python scripts/spark-class-archive.py VENV_DIR
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BUILD_TIMEOUT_S = 600

# The job whose classes go into the archive: what the suite's Spark runs do, small.
WORKLOAD = r"""
import sys, tempfile
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

class Tiny(DataSource):
    @classmethod
    def name(cls):
        return "tiny"
    def schema(self):
        return "id long, payload binary"
    def reader(self, schema):
        return TinyReader()

class TinyReader(DataSourceReader):
    def partitions(self):
        return [InputPartition(0), InputPartition(1)]
    def read(self, partition):
        for i in range(3):
            yield (partition.value * 10 + i, b"x")

spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.pyspark.python", sys.executable)
    .config("spark.pyspark.driver.python", sys.executable)
    .getOrCreate()
)
spark.dataSource.register(Tiny)
df = spark.read.format("tiny").load()
df.groupBy((df.id % 2).alias("k")).count().collect()
spark.sparkContext.parallelize(range(10), 2).map(lambda x: x * 2).collect()
with tempfile.TemporaryDirectory() as out:
    df.write.mode("overwrite").partitionBy("payload").parquet(out + "/p")
    spark.read.parquet(out + "/p").where("id > 3").collect()
jvm = spark.sparkContext._gateway.proc
spark.stop()
# The JVM writes the archive as it exits (on the end of its stdin): wait for that.
jvm.stdin.close()
jvm.wait(timeout=300)
"""


def _key(python: str) -> str | None:
    """A name for the archive from the JVM build and Spark's jars, or None (no Java)."""
    java = (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java")
        if "JAVA_HOME" in os.environ
        else "java"
    )
    try:
        version = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=True
        ).stderr
        jars = subprocess.run(
            [
                python,
                "-c",
                "import os, pyspark; d = os.path.join(os.path.dirname(pyspark.__file__), 'jars'); print(pyspark.__version__, sorted(os.listdir(d)))",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha256((version + jars).encode()).hexdigest()[:16]


def options(path: Path) -> str:
    return f"-XX:SharedArchiveFile={path} -Xshare:auto -XX:TieredStopAtLevel=1"


def main() -> int:
    venv = Path(sys.argv[1]).resolve()
    python = str(venv / "bin" / "python")
    key = _key(python)
    if key is None:
        return 0
    directory = venv / "spark-class-archive"
    path = directory / f"{key}.jsa"
    if path.exists():
        print(options(path))
        return 0
    directory.mkdir(mode=0o700, exist_ok=True)
    for old in directory.glob("*.jsa"):
        old.unlink(missing_ok=True)
    partial = directory / f"{key}.jsa.partial"
    partial.unlink(missing_ok=True)
    env = dict(os.environ)
    env["SPARK_SUBMIT_OPTS"] = (
        f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off -Xlog:cds+dynamic=off"
    )
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = python
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "workload.py"
        script.write_text(WORKLOAD)
        try:
            subprocess.run(
                [python, str(script)],
                cwd=work,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=BUILD_TIMEOUT_S,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            partial.unlink(missing_ok=True)
            return 0
    if not partial.exists() or partial.stat().st_size == 0:
        return 0
    partial.rename(path)
    print(options(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
