"""The connector on a real Spark standalone cluster: a master and two workers started from
the pip-installed Spark's own `spark-class` on 127.0.0.1, so the reads run in two executor
JVMs apart from the driver and fetch every segment with ReadSegment over gRPC (no
`preferLocal`: nothing is read from the nodes' data directories).

Only one SparkContext can live in a process, and the other Spark tests hold a `local[2]`
one, so the driver runs in a subprocess: this module run as a script
(`python -m tests.spark.test_spark_standalone '<json>'`), which reads at one revision and
writes the rows and where each partition ran to a JSON file that the test checks against
what the cluster acknowledged.

Every process here is started by this module and stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, setup_channels, wait_assigned
from tests.processes import start_in_own_session
from tests.timing import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

REPO_ROOT = Path(__file__).resolve().parents[2]
SEGMENT_BYTES = 32 * 1024
WORKERS = 2
#: Master and workers registered, and the driver's executors registered, within this.
READY_TIMEOUT_S = 60.0
#: The whole driver subprocess: JVM start, executors, two reads, stop.
DRIVER_TIMEOUT_S = scaled(240.0)
STOP_GRACE_S = 10.0
#: The export's driver subprocess: JVM start, executors, snapshot, write, commit, read back.
EXPORT_DRIVER_TIMEOUT_S = scaled(300.0)
VCHANNELS = {"orders": 0, "payments": 1}


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"({path}: {error})"
    return "\n".join(text.splitlines()[-lines:])


def _stop(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: the one pid, nothing else."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=grace_s)


@dataclass
class Standalone:
    """A Spark standalone master and its workers, by pid."""

    directory: Path
    master_port: int
    webui_port: int
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def work_dir(self, index: int) -> Path:
        return self.directory / f"worker-{index}"

    def log(self, name: str) -> Path:
        return self.directory / f"{name}.log"

    def spawn(self, name: str, arguments: list[str]) -> None:
        spark_class = Path(self.env["SPARK_HOME"]) / "bin" / "spark-class"
        with open(self.log(name), "wb") as log_file:
            self.processes[name] = subprocess.Popen(
                [str(spark_class), *arguments],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def logs(self) -> str:
        return "\n".join(f"--- {name}.log\n{_tail(self.log(name))}" for name in self.processes)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """The master's JSON status once `WORKERS` workers are ALIVE."""
        deadline = time.monotonic() + scaled(timeout_s)
        last = "no answer yet"
        while time.monotonic() < deadline:
            exited = {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}
            if exited:
                raise AssertionError(f"Spark processes exited early {exited}\n{self.logs()}")
            url = f"http://127.0.0.1:{self.webui_port}/json/"
            try:
                with urllib.request.urlopen(url, timeout=scaled(2)) as response:
                    status = json.load(response)
            except (OSError, ValueError) as error:
                last = repr(error)
            else:
                alive = [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) >= WORKERS:
                    return status
                last = f"{len(alive)}/{WORKERS} workers ALIVE"
            time.sleep(0.25)
        raise AssertionError(
            f"Spark standalone not ready after {timeout_s:.0f} s ({last})\n{self.logs()}"
        )

    def stop(self) -> None:
        # Workers first (each stops its executors), then the master.
        for name in sorted(self.processes, key=lambda n: n == "master"):
            _stop(self.processes[name])


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    """Starts the master and workers without waiting: the test calls `wait_ready()` after
    the WAL cluster is up, so both start at the same time."""
    import pyspark

    master_port, webui_port, *worker_ports = dev.free_ports(2 + WORKERS)
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(Path(pyspark.__file__).parent),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        # The master's REST submission server would take the fixed port 6066.
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )
    cluster = Standalone(tmp_path / "spark", master_port, webui_port, env)
    cluster.directory.mkdir()
    try:
        cluster.spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(master_port),
                "--webui-port", str(webui_port),
            ],
        )  # fmt: skip
        for index, port in enumerate(worker_ports):
            cluster.work_dir(index).mkdir()
            cluster.spawn(
                f"worker-{index}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host", "127.0.0.1",
                    "--webui-port", str(port),
                    "--cores", "1",
                    "--memory", "1g",
                    "--work-dir", str(cluster.work_dir(index)),
                    cluster.master_url,
                ],
            )  # fmt: skip
        yield cluster
    finally:
        cluster.stop()


@dataclass
class Wal:
    local: dev.LocalCluster
    client: Api
    pchannels: dict[str, str]
    history: dict[str, History] = field(default_factory=dict)
    producers: dict[str, Producer] = field(default_factory=dict)

    def produce(self, vchannel: str, batches: int, per_batch: int = 20) -> None:
        producer = self.producers.get(vchannel)
        if producer is None:
            producer = Producer(self.client, self.pchannels[vchannel], f"p-{vchannel}")
            self.producers[vchannel] = producer
        history = self.history.setdefault(vchannel, History())
        for _ in range(batches):
            start = len(history.acked)
            payloads = [
                f"{vchannel}-{start + i:06d}-".encode() + b"x" * 80 for i in range(per_batch)
            ]
            assert producer.send(vchannel, payloads, history), "produce not acknowledged"

    def segments(self) -> api.ListSegmentsResponse:
        return self.client.call("ListSegments", api.ListSegmentsRequest())

    def settle(self, timeout_s: float = 30.0) -> None:
        """Until sealed segments are committed: the manifest stops growing for 1.5 s."""
        deadline = time.monotonic() + scaled(timeout_s)
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            count = len(self.segments().segments)
            if count != last:
                last, since = count, time.monotonic()
            elif time.monotonic() - since >= 1.5:
                return
            time.sleep(0.2)
        raise AssertionError(f"ListSegments still growing after {timeout_s} s ({last})")


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[Wal]:
    environ = dict(os.environ)
    environ["RAFTWAL_SEGMENT_MAX_BYTES"] = str(SEGMENT_BYTES)
    local = dev.up(tmp_path / "wal", 3, timeout_s=60, env=environ)
    client = Api(local.endpoints)
    state: Wal | None = None
    try:
        names = setup_channels(client, "ss", VCHANNELS)
        for pchannel in names:
            wait_assigned(client, pchannel)
        state = Wal(local, client, {v: names[i] for v, i in VCHANNELS.items()})
        state.produce("orders", 40)
        state.produce("payments", 25)
        state.settle()
        yield state
    finally:
        for producer in state.producers.values() if state else ():
            producer.close()
        client.close()
        local.stop_all()


def _run_driver(
    standalone: Standalone,
    request: dict[str, Any],
    directory: Path,
    timeout_s: float = DRIVER_TIMEOUT_S,
) -> dict[str, Any]:
    """This module as a script in its own process (and session): the result it wrote."""
    result_path = directory / "driver-result.json"
    log_path = directory / "driver.log"
    jvm_log_path = directory / "driver-jvm.log"
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    arguments = {
        **request,
        "master": standalone.master_url,
        "result": str(result_path),
        "jvm_log": str(jvm_log_path),
    }
    driver = start_in_own_session(
        [sys.executable, "-m", "tests.spark.test_spark_standalone", json.dumps(arguments)],
        cwd=REPO_ROOT,
        env=env,
        log_path=log_path,
    )
    try:
        code = driver.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        # The driver's JVM is its child in the same new session: on a timeout stop both.
        if driver.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=STOP_GRACE_S)
    if code != 0 or not result_path.exists():
        executor_logs = "\n".join(
            f"--- {path}\n{_tail(path, 20)}"
            for path in sorted(standalone.directory.glob("worker-*/app-*/*/stderr"))
        )
        raise AssertionError(
            f"driver exited with {code} (timeout {timeout_s:.0f} s)\n"
            f"--- driver.log\n{_tail(log_path, 60)}\n"
            f"--- driver-jvm.log\n{_tail(jvm_log_path, 40)}\n{executor_logs}\n{standalone.logs()}"
        )
    return json.loads(result_path.read_text())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_executors_on_a_standalone_cluster_read_exactly_the_committed_messages(
    standalone: Standalone, wal: Wal, tmp_path: Path
) -> None:
    started = time.monotonic()
    status = standalone.wait_ready()
    assert status["url"] == standalone.master_url
    segments = wal.segments()
    assert len(segments.segments) >= 2 * WORKERS, "want more partitions than executors"
    expected: set[tuple[str, int, bytes]] = set()
    for vchannel, pchannel in wal.pchannels.items():
        through = max(s.last_lsn for s in segments.segments if s.pchannel == pchannel)
        acked = wal.history[vchannel].acked
        expected |= {(vchannel, a.lsn, a.payload) for a in acked if a.lsn <= through}
        # Messages in the open segment exist (acknowledged, not yet sealed) and are not read.
        assert any(a.lsn > through for a in acked), f"{vchannel}: nothing after the seal"
    result = _run_driver(
        standalone,
        {"endpoints": ",".join(wal.local.endpoints), "revision": segments.revision},
        tmp_path,
    )

    # The reads ran on the standalone cluster: two executors besides the driver.
    assert result["master"] == standalone.master_url
    assert len(result["block_managers"]) == 1 + WORKERS, result["block_managers"]
    # Each partition ran in one of the workers' executors (a Python worker's working
    # directory is its executor's <work-dir>/<app-id>/<executor-id>), and both were used.
    work_dirs = {str(standalone.work_dir(i).resolve()): i for i in range(WORKERS)}
    used: dict[int, int] = {}
    for partition, directory, count in result["placement"]:
        where = Path(directory).resolve()
        assert str(where.parent.parent) in work_dirs, (partition, directory)
        assert where.parent.name == result["application_id"], (partition, directory)
        worker = work_dirs[str(where.parent.parent)]
        used[worker] = used.get(worker, 0) + count
    assert sorted(used) == list(range(WORKERS)), f"rows per worker: {used}"
    assert len(result["placement"]) == result["partitions"] >= len(segments.segments)

    rows = [(v, lsn, bytes.fromhex(payload)) for v, lsn, payload in result["rows"]]
    assert len(set(rows)) == len(rows), "duplicate rows"
    assert sum(used.values()) == len(rows)
    assert set(rows) == expected, (
        f"{len(set(rows) - expected)} unexpected, {len(expected - set(rows))} missing"
    )
    print(
        f"standalone read: {len(rows)} rows, {result['partitions']} partitions, "
        f"rows per worker {used}, driver {result['seconds']} s, "
        f"test body {time.monotonic() - started:.1f} s"
    )


def _run_stream_driver(
    standalone: Standalone, request: dict[str, Any], directory: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    """`_stream_driver` in its own process (and session), started, not awaited."""
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    arguments = {
        **request,
        "master": standalone.master_url,
        "directory": str(directory),
        "jvm_log": str(directory / "stream-driver-jvm.log"),
    }
    log_path = directory / "stream-driver.log"
    code = (
        "import json, sys\n"
        "from tests.spark.test_spark_standalone import _stream_driver\n"
        "_stream_driver(json.loads(sys.argv[1]))\n"
    )
    driver = start_in_own_session(
        [sys.executable, "-c", code, json.dumps(arguments)], cwd=REPO_ROOT, env=env,
        log_path=log_path,
    )  # fmt: skip
    return driver, log_path


def _wait_file(
    path: Path, driver: subprocess.Popen[bytes], log_path: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s  # its callers pass scaled bounds
    while not path.exists():
        if driver.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(
                f"no {path.name} (driver exit {driver.poll()})\n{_tail(log_path, 60)}"
            )
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_streaming_query_on_a_standalone_cluster_writes_every_ack_once(
    standalone: Standalone, wal: Wal, tmp_path: Path
) -> None:
    """readStream on the standalone cluster's executors into a Parquet sink: what was there
    before the query started, and what is produced while it runs, each row exactly once."""
    standalone.wait_ready()
    driver, log_path = _run_stream_driver(
        standalone, {"endpoints": ",".join(wal.local.endpoints)}, tmp_path
    )
    try:
        _wait_file(tmp_path / "stream-started", driver, log_path, DRIVER_TIMEOUT_S)
        # Produced while the query runs: read from the open segments' committed prefixes
        # and from segments sealed meanwhile.
        wal.produce("orders", 15)
        wal.produce("payments", 10)
        expected = {
            (vchannel, a.lsn, a.payload)
            for vchannel, history in wal.history.items()
            for a in history.acked
        }
        (tmp_path / "stream-expect.json").write_text(json.dumps({"rows": len(expected)}))
        _wait_file(tmp_path / "stream-result.json", driver, log_path, DRIVER_TIMEOUT_S)
        assert driver.wait(timeout=DRIVER_TIMEOUT_S) == 0, _tail(log_path, 60)
    finally:
        if driver.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=STOP_GRACE_S)
    result = json.loads((tmp_path / "stream-result.json").read_text())
    assert len(result["block_managers"]) == 1 + WORKERS, result["block_managers"]
    assert result["batches_with_rows"] >= 2, result
    rows = [(v, lsn, bytes.fromhex(payload)) for v, lsn, payload in result["rows"]]
    assert len(set(rows)) == len(rows), "duplicate rows"
    assert set(rows) == expected, (
        f"{len(set(rows) - expected)} unexpected, {len(expected - set(rows))} missing"
    )


# -- the driver (run as a script by _run_driver) ----------------------------------------------


def _where(rows: Iterator[Any]) -> Iterator[tuple[int, str, int]]:
    """In the executor's Python worker: (partition, working directory, rows)."""
    from pyspark import TaskContext

    count = sum(1 for _ in rows)
    context = TaskContext.get()
    assert context is not None
    yield context.partitionId(), os.getcwd(), count


def _driver(arguments: dict[str, Any]) -> None:
    import spark_connector
    from tests.spark.conftest import start_test_session

    started = time.monotonic()
    session = start_test_session(
        arguments["master"],
        "raftwal-standalone",
        {
            "spark.executor.cores": "1",
            "spark.executor.memory": "1g",
            "spark.cores.max": str(WORKERS),
            "spark.executorEnv.PYTHONPATH": str(REPO_ROOT),
        },
        jvm_log=Path(arguments["jvm_log"]),
    )
    try:
        context = session.sparkContext
        spark_connector.register(session)
        # The driver's block manager and one per executor.
        deadline = time.monotonic() + scaled(READY_TIMEOUT_S)
        memory = context._jsc.sc().getExecutorMemoryStatus()
        while memory.size() < 1 + WORKERS and time.monotonic() < deadline:
            time.sleep(0.2)
            memory = context._jsc.sc().getExecutorMemoryStatus()
        ready = time.monotonic()
        df = (
            session.read.format("raftwal")
            .option("endpoints", arguments["endpoints"])
            .option("asOfRevision", str(arguments["revision"]))
            .load()
        )
        rows = [
            (r.vchannel, r.lsn, bytes(r.payload).hex())
            for r in df.select("vchannel", "lsn", "payload").collect()
        ]
        placement = df.rdd.mapPartitions(_where).collect()
        result = {
            "master": context.master,
            "application_id": context.applicationId,
            "block_managers": sorted(memory.keys().mkString(",").split(",")),
            "partitions": df.rdd.getNumPartitions(),
            "rows": rows,
            "placement": placement,
            "seconds": {
                "session_and_executors": round(ready - started, 1),
                "reads": round(time.monotonic() - ready, 1),
            },
        }
    finally:
        session.stop()
    Path(arguments["result"]).write_text(json.dumps(result))


def _stream_driver(arguments: dict[str, Any]) -> None:
    """A streaming query on the standalone master into a Parquet sink: writes
    `stream-started` after its first batch, waits for `stream-expect.json` and until the
    sink holds that many rows (bounded), then writes the sink's rows."""
    import spark_connector
    from spark_connector.datasource import SCHEMA_DDL
    from tests.spark.conftest import start_test_session

    directory = Path(arguments["directory"])
    session = start_test_session(
        arguments["master"],
        "raftwal-standalone-stream",
        {
            "spark.executor.cores": "1",
            "spark.executor.memory": "1g",
            "spark.cores.max": str(WORKERS),
            "spark.executorEnv.PYTHONPATH": str(REPO_ROOT),
        },
        jvm_log=Path(arguments["jvm_log"]),
    )
    try:
        context = session.sparkContext
        spark_connector.register(session)
        deadline = time.monotonic() + scaled(READY_TIMEOUT_S)
        memory = context._jsc.sc().getExecutorMemoryStatus()
        while memory.size() < 1 + WORKERS and time.monotonic() < deadline:
            time.sleep(0.2)
            memory = context._jsc.sc().getExecutorMemoryStatus()
        sink = directory / "stream-sink"
        query = (
            session.readStream.format("raftwal")
            .option("endpoints", arguments["endpoints"])
            .load()
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(directory / "stream-checkpoint"))
            .start()
        )

        def sink_rows() -> list[Any]:
            if not any((sink / "_spark_metadata").glob("[0-9]*")):
                return []
            df = session.read.schema(SCHEMA_DDL).parquet(str(sink))
            return df.where("msg_type = 'message'").select("vchannel", "lsn", "payload").collect()

        try:
            deadline = time.monotonic() + DRIVER_TIMEOUT_S
            while not sink_rows() and time.monotonic() < deadline:
                assert query.exception() is None, query.exception()
                time.sleep(0.5)
            (directory / "stream-started").write_text("")
            expect_path = directory / "stream-expect.json"
            while not expect_path.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            want = json.loads(expect_path.read_text())["rows"]
            rows = sink_rows()
            while len(rows) < want and time.monotonic() < deadline:
                assert query.exception() is None, query.exception()
                time.sleep(0.5)
                rows = sink_rows()
            batches = sum(1 for p in query.recentProgress if p.numInputRows)
        finally:
            query.stop()
        result = {
            "block_managers": sorted(memory.keys().mkString(",").split(",")),
            "batches_with_rows": batches,
            "rows": [(r.vchannel, r.lsn, bytes(r.payload).hex()) for r in rows],
        }
    finally:
        session.stop()
    (directory / "stream-result.json").write_text(json.dumps(result))


def _export_driver(arguments: dict[str, Any]) -> None:
    """The export's driver on the standalone cluster: its executors write the Parquet
    files (into the shared local file system), the driver commits them."""
    import spark_connector
    from spark_connector.export import export, result_json
    from tests.spark.conftest import start_test_session

    session = start_test_session(
        arguments["master"],
        "raftwal-standalone-export",
        {
            "spark.executor.cores": "1",
            "spark.executor.memory": "1g",
            "spark.cores.max": str(WORKERS),
            "spark.executorEnv.PYTHONPATH": str(REPO_ROOT),
        },
        jvm_log=Path(arguments["jvm_log"]),
    )
    try:
        spark_connector.register(session)
        result = result_json(
            export(session, arguments["to"], {"endpoints": arguments["endpoints"]})
        )
        df = session.read.parquet(arguments["to"])
        result["exported_rows"] = result.pop("rows")
        result["rows"] = [
            (r.vchannel, r.lsn, bytes(r.payload).hex())
            for r in df.select("vchannel", "lsn", "payload").collect()
        ]
        result["master"] = session.sparkContext.master
    finally:
        session.stop()
    Path(arguments["result"]).write_text(json.dumps(result))


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_export_on_a_standalone_cluster_lands_exactly_the_acknowledged_messages(
    standalone: Standalone, wal: Wal, tmp_path: Path
) -> None:
    standalone.wait_ready()
    target = tmp_path / "export"
    result = _run_driver(
        standalone,
        {"mode": "export", "endpoints": ",".join(wal.local.endpoints), "to": str(target)},
        tmp_path,
        timeout_s=EXPORT_DRIVER_TIMEOUT_S,
    )
    assert result["master"] == standalone.master_url
    # The export seals the open segments first: every acknowledged message is in.
    expected = {
        (vchannel, a.lsn, a.payload) for vchannel, h in wal.history.items() for a in h.acked
    }
    rows = [(v, lsn, bytes.fromhex(payload)) for v, lsn, payload in result["rows"]]
    assert len(rows) == len(set(rows)) == result["exported_rows"], "duplicate rows"
    assert set(rows) == expected, (
        f"{len(set(rows) - expected)} unexpected, {len(expected - set(rows))} missing"
    )
    manifest = json.loads((target / "_manifest").read_text())
    assert manifest["revision"] == result["revision"] and manifest["pending_moves"] == []


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    if request.get("mode") == "export":
        _export_driver(request)
    else:
        _driver(request)
