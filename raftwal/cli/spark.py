"""`raftwal spark-read`: read committed segments with Spark and print a per-vchannel summary;
`raftwal export`: land committed entries as Parquet (`spark_connector.export`).

A one-line way to try the connector against `raftwal dev up`: it starts a local
SparkSession (UI off, bound to 127.0.0.1), registers the `raftwal` source and runs one
aggregate. Against the dev cluster it passes the nodes' data directories, so
`--prefer-local` reads the segment files directly, and against a `dev up --secure` cluster
it passes the credentials (admin token, CA, client certificate) as the connector's options.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from raftwal.cli.client import (
    CLUSTER_FILE,
    CliError,
    add_security_arguments,
    resolve_target,
    security_settings,
)


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "spark-read",
        help="read committed segments with Spark and print a per-vchannel summary",
    )
    parser.add_argument("--endpoints", help="host:port,... (default: the dev cluster)")
    parser.add_argument(
        "--dev-dir",
        type=Path,
        default=Path(".raftwal-dev"),
        help="directory of `raftwal dev up` (default: .raftwal-dev)",
    )
    parser.add_argument("--vchannels", default="", help="comma-separated (default: all)")
    parser.add_argument("--pchannels", default="", help="comma-separated (default: all)")
    parser.add_argument("--msg-types", default="", help="comma-separated (default: all data)")
    parser.add_argument("--as-of-revision", type=int, default=0, help="repeat an earlier read")
    parser.add_argument(
        "--prefer-local",
        action="store_true",
        help="read segment files of the dev cluster's data dirs directly",
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=30.0,
        help="how long planning waits for the cluster (default: 30)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per vchannel")
    add_security_arguments(parser)
    parser.set_defaults(handler=run)
    register_export(commands)


def _local_dirs(dev_dir: Path) -> str:
    try:
        nodes = json.loads((dev_dir / CLUSTER_FILE).read_text())["nodes"]
        return ",".join(f"{n['id']}={n['data_dir']}" for n in nodes)
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def session(master: str, app: str = "raftwal spark-read") -> Any:
    """A SparkSession for the connector (see `spark_connector.session.base_settings`);
    raises `spark_connector.session.SparkStartError`, quoting the JVM, when it cannot start."""
    from spark_connector.session import start_session

    return start_session(master, app, {"spark.sql.shuffle.partitions": "4"})


def run(args: argparse.Namespace) -> int:
    try:
        target = resolve_target(args.endpoints, args.dev_dir)
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from pyspark.sql import functions as F

    import spark_connector
    from spark_connector.plan import connector_message
    from spark_connector.session import SparkStartError

    settings = security_settings(args, target)
    options = {"endpoints": ",".join(target.endpoints)}
    for option, value in (
        ("token", settings.get("token", "")),
        ("tokenFile", settings.get("token_file", "")),
        ("tlsCaFile", settings.get("tls_ca_file", "")),
        ("tlsCertFile", settings.get("tls_cert_file", "")),
        ("tlsKeyFile", settings.get("tls_key_file", "")),
        ("vchannels", args.vchannels),
        ("pchannels", args.pchannels),
        ("msgTypes", args.msg_types),
        ("asOfRevision", str(args.as_of_revision) if args.as_of_revision else ""),
        ("timeoutSeconds", f"{args.timeout_s:g}"),
    ):
        if value:
            options[option] = value
    if args.prefer_local:
        dirs = _local_dirs(args.dev_dir)
        if dirs:
            options["preferLocal"] = "true"
            options["localDataDirs"] = dirs
    # A cluster that does not answer is reported before a JVM starts, which takes tens of
    # seconds on a busy host (options the connector refuses are left to it: same words).
    from spark_connector.options import parse_options
    from spark_connector.plan import ConnectorError, probe

    try:
        parsed = parse_options(options)
    except ValueError:
        parsed = None
    if parsed is not None:
        try:
            probe(parsed)
        except ConnectorError as error:
            print(f"error: {str(error)[:2000]}", file=sys.stderr)
            return 1
    try:
        spark = session(args.master)
    except SparkStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        spark_connector.register(spark)
        reader = spark.read.format("raftwal")
        for option, value in options.items():
            reader = reader.option(option, value)
        started = time.monotonic()
        try:
            rows = (
                reader.load()
                .groupBy("vchannel")
                .agg(
                    F.count(F.lit(1)).alias("rows"),
                    F.min("lsn").alias("first_lsn"),
                    F.max("lsn").alias("last_lsn"),
                    F.countDistinct("segment_id").alias("segments"),
                    F.sum(F.length("payload")).alias("payload_bytes"),
                )
                .orderBy("vchannel")
                .collect()
            )
        except Exception as error:  # noqa: BLE001 (Spark wraps the connector's error)
            # One sentence: the connector's own message, not the first line of a JVM trace.
            message = connector_message(error) or str(error).strip().splitlines()[0]
            print(f"error: {message[:2000]}", file=sys.stderr)
            return 1
        elapsed = time.monotonic() - started
        if args.json:
            for row in rows:
                print(json.dumps(row.asDict()))
            return 0
        print(f"{'vchannel':<20} {'rows':>10} {'lsns':>21} {'segments':>8} {'payload MB':>10}")
        for row in rows:
            lsns = f"{row.first_lsn}..{row.last_lsn}"
            megabytes = (row.payload_bytes or 0) / 1e6
            print(
                f"{row.vchannel:<20} {row.rows:>10,} {lsns:>21} {row.segments:>8} "
                f"{megabytes:>10.2f}"
            )
        total = sum(row.rows for row in rows)
        print(f"{total:,} row(s) of committed segments in {elapsed:.1f} s")
        return 0
    finally:
        spark.stop()


# -- raftwal export -------------------------------------------------------------------------

#: Test hook (fault injection): `POINT:MARKER_FILE` makes the export stop at POINT (one of
#: `spark_connector.export.PAUSE_POINTS`) after writing MARKER_FILE, so that a test can
#: kill the process exactly there.
EXPORT_PAUSE_ENV = "RAFTWAL_EXPORT_PAUSE_AT"


def register_export(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        help="export committed entries to Parquet, incrementally and exactly once",
        description="Land the entries committed since the last run as Parquet under --to, "
        "partitioned by pchannel, vchannel and date (UTC, of the time tick); the directory's "
        "_manifest names the files, the raftwal revision and the LSN bookmark per pchannel. "
        "Read it with spark.read.parquet(DIR).",
    )
    parser.add_argument("--to", required=True, type=Path, help="export directory (required)")
    parser.add_argument("--endpoints", help="host:port,... (default: the dev cluster)")
    parser.add_argument(
        "--dev-dir",
        type=Path,
        default=Path(".raftwal-dev"),
        help="directory of `raftwal dev up` (default: .raftwal-dev)",
    )
    parser.add_argument("--vchannels", default="", help="comma-separated (default: all)")
    parser.add_argument("--pchannels", default="", help="comma-separated (default: all)")
    parser.add_argument(
        "--prefer-local",
        action="store_true",
        help="read segment files of the dev cluster's data dirs directly (default: off)",
    )
    parser.add_argument(
        "--compression",
        default="snappy",
        choices=("snappy", "zstd", "gzip", "lz4", "none"),
        help="Parquet compression (default: snappy)",
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=30.0,
        help="how long planning waits for the cluster (default: 30)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_security_arguments(parser)
    parser.set_defaults(handler=run_export)


def _names(text: str) -> list[str] | None:
    names = [part.strip() for part in text.split(",") if part.strip()]
    return names or None


def _pause_at(value: str) -> tuple[str, Path] | None:
    if not value:
        return None
    point, _, marker = value.partition(":")
    return point, Path(marker)


def run_export(args: argparse.Namespace) -> int:
    import os

    try:
        target = resolve_target(args.endpoints, args.dev_dir)
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import spark_connector
    from spark_connector.export import ExportError, export, preflight, result_json
    from spark_connector.plan import ConnectorError, connector_message
    from spark_connector.session import SparkStartError

    settings = security_settings(args, target)
    options = {"endpoints": ",".join(target.endpoints), "timeoutSeconds": f"{args.timeout_s:g}"}
    for option, key in (
        ("token", "token"),
        ("tokenFile", "token_file"),
        ("tlsCaFile", "tls_ca_file"),
        ("tlsCertFile", "tls_cert_file"),
        ("tlsKeyFile", "tls_key_file"),
    ):
        if settings.get(key):
            options[option] = settings[key]
    if args.prefer_local:
        dirs = _local_dirs(args.dev_dir)
        if dirs:
            options.update(preferLocal="true", localDataDirs=dirs)
    from raftwal.cli.progress import Progress

    # Stages, not rows: Spark counts the rows; a terminal sees which stage runs and for how
    # long (starting the JVM alone takes seconds).
    progress = Progress.for_args("export", args)
    try:
        with progress:
            progress.update("checking the options and the cluster")
            # The mistakes one can see without Spark (options, directory, cluster, names),
            # said before a JVM starts.
            preflight(
                args.to,
                options,
                pchannels=_names(args.pchannels),
                vchannels=_names(args.vchannels),
            )
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        with progress:
            progress.update("starting Spark")
            spark = session(args.master, "raftwal export")
    except SparkStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        spark_connector.register(spark)
        try:
            with progress:
                progress.update(f"exporting to {args.to}")
                result = export(
                    spark,
                    args.to,
                    options,
                    pchannels=_names(args.pchannels),
                    vchannels=_names(args.vchannels),
                    compression=args.compression,
                    pause_at=_pause_at(os.environ.get(EXPORT_PAUSE_ENV, "")),
                )
        except (ExportError, ConnectorError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        except Exception as error:  # noqa: BLE001 (Spark wraps the connector's error)
            message = connector_message(error) or str(error).strip().splitlines()[0]
            print(f"error: {message[:2000]}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(result_json(result)))
            return 0
        if result.recovered:
            print(f"recovered an interrupted export: {result.recovered}")
        lsns = ", ".join(f"{p} {low}..{high}" for p, (low, high) in result.read_lsns.items())
        print(
            f"exported {result.rows:,} row(s) in {result.files} file(s) to {result.directory} "
            f"in {result.seconds:.1f} s (version {result.version}, revision {result.revision}"
            f"{'; lsns ' + lsns if lsns else '; nothing new'})"
        )
        return 0
    finally:
        spark.stop()
