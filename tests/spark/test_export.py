"""`raftwal export` against a real three-node cluster and a real SparkSession: the Parquet
rows are exactly the acknowledged messages (committed transactions only, no control
entries), runs are incremental, the layout is partitioned and natively readable with
column pruning and partition pushdown, and a run killed (SIGKILL, the real process) at any
point and then re-run neither loses nor duplicates a row."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow.parquet as pq
import pytest

from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from spark_connector.export import (
    MANIFEST,
    STAGING,
    ExportError,
    committed_files,
    export,
    read_export,
    read_manifest,
)
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import Acked, History, Producer, setup_channels, wait_assigned
from tests.processes import start_in_own_session
from tests.timing import scaled

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

REPO_ROOT = Path(__file__).resolve().parents[2]
SEGMENT_BYTES = 32 * 1024
VCHANNELS = {"orders": 0, "payments": 1}
#: A whole `raftwal export` process: JVM start, snapshot, write, commit (generous: the
#: machine is shared, and a JVM start under load takes minutes).
CLI_TIMEOUT_S = scaled(420.0)
#: The killed run reaches its pause point within this.
PAUSE_TIMEOUT_S = 420.0
TICK_LOGICAL_BITS = 18

Row = tuple[str, int, bytes]


class Env:
    def __init__(self, local: dev.LocalCluster, client: Api, pchannels: dict[str, str]) -> None:
        self.local = local
        self.client = client
        self.pchannels = pchannels
        self.history: dict[str, History] = {v: History() for v in VCHANNELS}
        self.producers: dict[str, Producer] = {}
        self.txn_payloads: list[bytes] = []

    @property
    def endpoints(self) -> str:
        return ",".join(self.local.endpoints)

    def produce(self, vchannel: str, batches: int, per_batch: int = 20) -> None:
        producer = self.producers.get(vchannel)
        if producer is None:
            producer = Producer(self.client, self.pchannels[vchannel], f"x-{vchannel}")
            self.producers[vchannel] = producer
        history = self.history[vchannel]
        for _ in range(batches):
            start = len(history.acked)
            payloads = [
                f"{vchannel}-{start + i:06d}-".encode() + b"y" * 80 for i in range(per_batch)
            ]
            assert producer.send(vchannel, payloads, history), "produce not acknowledged"

    def acked(self) -> list[Row]:
        rows = [(v, a.lsn, a.payload) for v, h in self.history.items() for a in h.acked]
        return sorted(rows)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    directory: Path = tmp_path_factory.mktemp("export-wal")
    environ = dict(os.environ)
    environ["RAFTWAL_SEGMENT_MAX_BYTES"] = str(SEGMENT_BYTES)
    local = dev.up(directory, 3, timeout_s=60, env=environ)
    client = Api(local.endpoints)
    state: Env | None = None
    try:
        names = setup_channels(client, "ex", VCHANNELS)
        for pchannel in names:
            wait_assigned(client, pchannel)
        state = Env(local, client, {v: names[i] for v, i in VCHANNELS.items()})
        state.produce("orders", 30)
        state.produce("payments", 20)
        yield state
    finally:
        for producer in state.producers.values() if state else ():
            producer.close()
        client.close()
        local.stop_all()


def _parquet_rows(spark: Any, directory: Path) -> list[Row]:
    df = spark.read.parquet(str(directory))
    return sorted(
        (r.vchannel, r.lsn, bytes(r.payload))
        for r in df.select("vchannel", "lsn", "payload").collect()
    )


def _assert_exactly(rows: list[Row], expected: list[Row]) -> None:
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicate row(s)"
    missing = sorted(set(expected) - set(rows))
    extra = sorted(set(rows) - set(expected))
    assert not missing and not extra, (
        f"{len(missing)} missing (e.g. {missing[:2]}), {len(extra)} unexpected (e.g. {extra[:2]})"
    )


def _transactions(env: Env) -> None:
    """One committed transaction (its messages exported) and one rolled back (not)."""
    _, _, address = wait_assigned(env.client, env.pchannels["payments"])
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        committed = stub.BeginTxn(wire.BeginTxnRequest(vchannel="payments"), timeout=scaled(10))
        payloads = [b"txn-%d-%d" % (committed.txn_id, i) for i in range(4)]
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="payments",
                txn_id=committed.txn_id,
                messages=[wire.Message(vchannel="payments", payload=p) for p in payloads],
            ),
            timeout=scaled(10),
        )
        done = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="payments", txn_id=committed.txn_id), timeout=scaled(10)
        )
        rolled = stub.BeginTxn(wire.BeginTxnRequest(vchannel="payments"), timeout=scaled(10))
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="payments",
                txn_id=rolled.txn_id,
                messages=[wire.Message(vchannel="payments", payload=b"rolled-back")],
            ),
            timeout=scaled(10),
        )
        stub.RollbackTxn(
            wire.RollbackTxnRequest(vchannel="payments", txn_id=rolled.txn_id), timeout=scaled(10)
        )
    # The commit answers the positions of [begin, body..., commit]: the body is the middle.
    body = list(done.positions)[1:-1]
    assert len(body) == len(payloads), done
    history = env.history["payments"]
    for position, payload in zip(body, payloads, strict=True):
        history.acked.append(Acked(position.lsn, position.time_tick, payload))


def test_export_is_incremental_exact_and_natively_readable(spark, env, tmp_path) -> None:
    target = tmp_path / "export"
    options = {"endpoints": env.endpoints}
    first = export(spark, target, options)
    assert first.version == 1 and first.rows > 0
    _assert_exactly(_parquet_rows(spark, target), env.acked())

    # The manifest: the revision, the bookmark per pchannel, every file it names.
    manifest = read_manifest(target)
    assert manifest["revision"] == first.revision > 0
    segments = env.client.call(
        "ListSegments", api.ListSegmentsRequest(as_of_revision=first.revision)
    )
    for vchannel, pchannel in env.pchannels.items():
        ours = [s for s in segments.segments if s.pchannel == pchannel]
        assert manifest["pchannels"][pchannel]["through_lsn"] == max(s.last_lsn for s in ours)
        assert manifest["pchannels"][pchannel]["segments"] == sorted(s.segment_id for s in ours)
        assert manifest["pchannels"][pchannel]["rows"] == len(env.history[vchannel].acked)
    assert manifest["pending_moves"] == []
    assert {str(p.relative_to(target)) for p in target.rglob("*.parquet")} == {
        f["path"] for f in manifest["files"]
    }
    assert not any((target / STAGING).iterdir())
    # Each file holds its rows in LSN order (no sort by partition columns reordered them),
    # so row-group statistics on lsn and time_tick are tight.
    for entry in manifest["files"]:
        lsns = pq.read_table(target / entry["path"], columns=["lsn"]).column("lsn").to_pylist()
        assert lsns == sorted(lsns) and len(lsns) == entry["rows"], entry["path"]
        assert ((target / entry["path"]).stat().st_mode & 0o777) == 0o600, entry["path"]
        assert ((target / entry["path"]).parent.stat().st_mode & 0o777) == 0o700
    assert (target.stat().st_mode & 0o777) == 0o700
    assert ((target / MANIFEST).stat().st_mode & 0o777) == 0o600

    # Second run: new messages and transactions (one committed, one rolled back).
    env.produce("orders", 8)
    _transactions(env)
    env.produce("payments", 3)
    second = export(spark, target, options)
    assert second.version == 2
    for pchannel, (low, _) in second.read_lsns.items():
        assert low == first.through_lsn[pchannel] + 1
    rows = _parquet_rows(spark, target)
    _assert_exactly(rows, env.acked())
    assert not any(payload == b"rolled-back" for _, _, payload in rows)
    assert sorted(r[1] for r in rows) == sorted(r[1] for r in _parquet_rows_strict(spark, target))

    # Nothing new: a run commits the new revision and no file.
    third = export(spark, target, options)
    assert (third.version, third.rows, third.files) == (3, 0, 0)
    assert third.revision >= second.revision
    assert read_manifest(target)["revision"] == third.revision

    # Only data: no term starts, seals or transaction markers.
    df = spark.read.parquet(str(target))
    assert {r.msg_type for r in df.select("msg_type").distinct().collect()} == {"message"}
    # Layout: pchannel / vchannel / date directories; the date is the time tick's UTC day.
    assert df.schema.simpleString() == (
        "struct<segment_id:bigint,lsn:bigint,term:bigint,time_tick:bigint,msg_type:string,"
        "key:binary,payload:binary,txn_id:bigint,broadcast_id:bigint,"
        "properties:map<string,string>,pchannel:string,vchannel:string,date:date>"
    )
    for row in df.select("time_tick", "date", "pchannel", "vchannel").limit(50).collect():
        ms = row.time_tick >> TICK_LOGICAL_BITS
        assert row.date == datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).date()
        assert row.pchannel == env.pchannels[row.vchannel]
    layout = {p.relative_to(target).parts[:-1] for p in target.rglob("*.parquet")}
    assert {(a.split("=")[0], b.split("=")[0], c.split("=")[0]) for a, b, c in layout} == {
        ("pchannel", "vchannel", "date")
    }

    # Natively readable: the partition filter prunes directories, only `lsn` is read.
    query = df.where(df.vchannel == "orders").select("lsn")
    plan = query._jdf.queryExecution().executedPlan().toString()
    assert "PartitionFilters: [isnotnull(vchannel" in plan and "(vchannel#" in plan, plan
    assert "ReadSchema: struct<lsn:bigint>" in plan, plan
    assert sorted(r.lsn for r in query.collect()) == sorted(
        a.lsn for a in env.history["orders"].acked
    )
    pushed = df.where(df.lsn > 100).select("lsn")
    assert "PushedFilters: [IsNotNull(lsn), GreaterThan(lsn,100)]" in (
        pushed._jdf.queryExecution().executedPlan().toString()
    )


def _parquet_rows_strict(spark: Any, directory: Path) -> list[Row]:
    df = read_export(spark, directory)
    return sorted(
        (r.vchannel, r.lsn, bytes(r.payload))
        for r in df.select("vchannel", "lsn", "payload").collect()
    )


def test_export_of_chosen_vchannels_and_clear_errors(spark, env, tmp_path) -> None:
    target = tmp_path / "orders-only"
    result = export(spark, target, {"endpoints": env.endpoints}, vchannels=["orders"])
    assert set(result.read_lsns) == {env.pchannels["orders"]}
    expected = [r for r in env.acked() if r[0] == "orders"]
    _assert_exactly(_parquet_rows(spark, target), expected)
    # A directory is bound to its selection: another one would make its bookmark lie.
    with pytest.raises(ExportError, match="exports vchannels orders, not every vchannel"):
        export(spark, target, {"endpoints": env.endpoints})
    with pytest.raises(ExportError, match="unknown vchannel"):
        export(spark, tmp_path / "nosuch", {"endpoints": env.endpoints}, vchannels=["nosuch"])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="holds files but no _manifest"):
        export(spark, foreign, {"endpoints": env.endpoints})
    with pytest.raises(ExportError, match="set by the export itself"):
        export(spark, tmp_path / "x", {"endpoints": env.endpoints, "fromLsn": "5"})
    with pytest.raises(ExportError, match="raftwal option endpoints"):
        export(spark, tmp_path / "x", {"endpoints": "nope"})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / MANIFEST).write_text("{")
    with pytest.raises(ExportError, match="is not valid JSON"):
        export(spark, broken, {"endpoints": env.endpoints})
    with pytest.raises(ExportError, match="compression 'brotli' is not one of"):
        export(spark, tmp_path / "x", {"endpoints": env.endpoints}, compression="brotli")


@pytest.mark.parametrize("codec", ["zstd", "gzip", "lz4", "none"])
def test_export_with_every_codec_reads_back_in_spark(spark, env, tmp_path, codec) -> None:
    target = tmp_path / codec
    result = export(spark, target, {"endpoints": env.endpoints}, compression=codec)
    assert result.files > 0
    suffix = ".parquet" if codec == "none" else f".{codec}.parquet"
    assert all(f["path"].endswith(suffix) for f in read_manifest(target)["files"])
    _assert_exactly(_parquet_rows(spark, target), env.acked())


# -- the real process, killed -----------------------------------------------------------------


def _cli(env: Env, target: Path, log_path: Path, pause: str = "") -> subprocess.Popen[bytes]:
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")])
    )
    environ.pop("RAFTWAL_EXPORT_PAUSE_AT", None)
    if pause:
        environ["RAFTWAL_EXPORT_PAUSE_AT"] = pause
    return start_in_own_session(
        [
            sys.executable,
            "-c",
            "import sys; from raftwal.cli.main import main; sys.exit(main())",
            "export",
            "--to",
            str(target),
            "--endpoints",
            env.endpoints,
            "--json",
        ],  # fmt: skip
        cwd=REPO_ROOT,
        env=environ,
        log_path=log_path,
    )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the export's process group (the Python driver, its JVM, the JVM's Python
    workers): they were started in their own session, by this test."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=scaled(30))


def _wait_gone(pgid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process group {pgid} still alive {timeout_s} s after SIGKILL")


def _run_cli(env: Env, target: Path, log_path: Path) -> dict[str, Any]:
    process = _cli(env, target, log_path)
    try:
        code = process.wait(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise AssertionError(
            f"export did not end in {CLI_TIMEOUT_S} s:\n{log_path.read_text()}"
        ) from None
    output = log_path.read_text()
    assert code == 0, output
    return json.loads(output.strip().splitlines()[-1])


def _kill_at(env: Env, target: Path, tmp_path: Path, point: str) -> None:
    marker = tmp_path / f"paused-{point}"
    log_path = tmp_path / f"killed-{point}.log"
    process = _cli(env, target, log_path, pause=f"{point}:{marker}")
    try:
        deadline = time.monotonic() + scaled(PAUSE_TIMEOUT_S)
        while not marker.exists():
            assert process.poll() is None, f"export ended early:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"no pause at {point}:\n{log_path.read_text()}"
            time.sleep(0.05)
    finally:
        _kill_group(process)
    _wait_gone(process.pid)
    assert process.returncode == -signal.SIGKILL


def _check_killed_then_rerun(
    spark: Any, env: Env, target: Path, tmp_path: Path, point: str, *, rerun_cli: bool
) -> None:
    before = env.acked()
    committed_before = read_manifest(target)["version"]
    _kill_at(env, target, tmp_path, point)
    # What a reader sees after the kill: never a duplicate, never a row not acknowledged;
    # before the commit point exactly the earlier runs' rows.
    if any(target.rglob("*.parquet")):
        seen = [r for r in _parquet_rows(spark, target)]
        assert len(seen) == len(set(seen)), f"{point}: duplicates visible after the kill"
        assert set(seen) <= set(before), f"{point}: rows never acknowledged"
    manifest = read_manifest(target)
    if point in ("before-write", "mid-write", "before-commit"):
        assert manifest["version"] == committed_before, point
        assert {str(p.relative_to(target)) for p in committed_parquet(target)} == {
            f["path"] for f in manifest["files"]
        }
    else:
        assert manifest["version"] == committed_before + 1, point
    if point == "mid-write":
        staged = list((target / STAGING).rglob("*"))
        assert staged, "the killed run was writing into its staging directory"
    # More acknowledged messages, then a normal run: exactly once.
    env.produce("orders", 3)
    env.produce("payments", 2)
    if rerun_cli:
        recovered = _run_cli(env, target, tmp_path / f"rerun-{point}.log")["recovered"]
    else:
        # The same run in this process (saves a JVM start in the default suite).
        recovered = export(spark, target, {"endpoints": env.endpoints}).recovered
    if point in ("after-commit", "mid-move"):
        assert recovered.startswith("finished version"), recovered
    if point in ("mid-write", "before-commit"):
        assert "deleted 1 uncommitted staging run" in recovered, recovered
    _assert_exactly(_parquet_rows(spark, target), env.acked())
    manifest = read_manifest(target)
    assert manifest["pending_moves"] == []
    assert not any((target / STAGING).iterdir())
    assert {str(p.relative_to(target)) for p in committed_parquet(target)} == {
        f["path"] for f in manifest["files"]
    }
    assert sorted(str(p) for p in committed_files(target)) == sorted(
        str(p) for p in committed_parquet(target)
    )


def committed_parquet(target: Path) -> list[Path]:
    return [
        p
        for p in target.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(target).parts)
    ]


@pytest.mark.timeout(900)
def test_export_killed_mid_write_then_rerun_is_exactly_once(spark, env, tmp_path) -> None:
    target = tmp_path / "killed"
    env.produce("orders", 4)
    _check_killed_then_rerun(spark, env, target, tmp_path, "mid-write", rerun_cli=False)


@pytest.mark.slow
@pytest.mark.timeout(4000)
def test_export_killed_at_every_point_then_rerun_is_exactly_once(spark, env, tmp_path) -> None:
    target = tmp_path / "sweep"
    first = _run_cli(env, target, tmp_path / "first.log")
    assert first["version"] == 1
    for point in (
        "before-write",
        "mid-write",
        "before-commit",
        "after-commit",
        "mid-move",
        "before-cleanup",
    ):
        env.produce("orders", 3)
        env.produce("payments", 3)
        _check_killed_then_rerun(spark, env, target, tmp_path, point, rerun_cli=True)


def _cli_error(*arguments: str) -> list[str]:
    """stderr lines of a `raftwal export` that fails before Spark starts (bounded)."""
    completed = subprocess.run(
        [sys.executable, "-c", "import sys; from raftwal.cli.main import main; sys.exit(main())"]
        + ["export", *arguments],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 1, (completed.stdout, completed.stderr)
    return [line for line in completed.stderr.splitlines() if line.strip()]


def test_cli_errors_are_one_sentence_before_spark_starts(env, tmp_path) -> None:
    lines = _cli_error(
        "--to", str(tmp_path / "a"), "--endpoints", env.endpoints, "--vchannels", "nosuch"
    )  # fmt: skip
    assert lines == ["error: unknown vchannel(s) nosuch"]
    (port,) = dev.free_ports(1)
    lines = _cli_error(
        "--to", str(tmp_path / "b"), "--endpoints", f"127.0.0.1:{port}", "--timeout-s", "1"
    )  # fmt: skip
    assert len(lines) == 1 and lines[0].startswith("error: no endpoint answered in 1 s"), lines
    assert f"127.0.0.1:{port}" in lines[0]
    (tmp_path / "file").write_text("x")
    lines = _cli_error("--to", str(tmp_path / "file"), "--endpoints", env.endpoints)
    assert lines == [f"error: --to {tmp_path / 'file'} is not a directory"]
