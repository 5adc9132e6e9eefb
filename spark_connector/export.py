"""Incremental, exactly-once export of committed WAL entries to Parquet (driver side).

What lives here: `export`, a Spark job that reads with the `raftwal` source's plan and
reader (only committed transactions; the WAL's control entries - term starts, seals and
transaction markers - left out) and lands the rows as Parquet under one directory,
partitioned by pchannel, vchannel and the UTC date of the time tick. Each Spark task reads
one input partition of the source and writes its Arrow batches with pyarrow, in the Python
worker: the rows never cross into the JVM. The files are what Spark's own writer would
produce for `partitionBy("pchannel", "vchannel", "date")`:

    DIR/_manifest                                   the commit point (JSON)
    DIR/pchannel=P/vchannel=V/date=YYYY-MM-DD/part-rNNNNNN-....parquet
    DIR/_staging/run-NNNNNN/...                     a run's files before they are committed
    DIR/_lock                                       held (flock) while an export runs

`spark.read.parquet(DIR)` reads it natively (column pruning, partition pruning on the three
directory columns, Parquet statistics for the others); Spark skips names starting with `_`
or `.`, so the manifest, the staging area and the lock never reach a reader.

Exactly once: `_manifest` is the only commit point. A run (1) finishes or discards what an
interrupted run left, (2) takes a snapshot of the cluster at one revision (sealing the open
segments, so everything acknowledged before it is in), (3) reads the LSNs after the
bookmark up to that snapshot's committed end with Spark, into its own staging directory
(each file fsynced, under a name a retried task writes again rather than beside),
(4) writes the new manifest atomically (temp file, fsync, rename, fsync of the directory):
it names every committed file, the new bookmark (per pchannel: the last exported LSN and
the segments exported) and the moves still to do, (5) moves the staged files into place
and (6) writes the manifest again without the moves. A crash before (4) leaves only
staging files, which the next run deletes; a crash after (4) leaves moves the next run
redoes. So the directory tree holds only committed files, never one twice, and a re-run
reads exactly the LSNs after the committed bookmark.

What must never happen here: a row exported twice or skipped, a file in the data tree that
the manifest does not name, or two exports writing one directory at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_connector.options import ReadOptions, parse_options
from spark_connector.plan import ConnectorError, snapshot
from wal_segments.format import PRODUCIBLE_MSG_TYPES

log = logging.getLogger(__name__)

MANIFEST = "_manifest"
MANIFEST_TMP = "_manifest.tmp"
STAGING = "_staging"
LOCK = "_lock"
FORMAT_VERSION = 1
PARTITION_COLUMNS = ("pchannel", "vchannel", "date")
#: Bits of a hybrid time tick below its physical milliseconds (`wal_segments.owner`).
TICK_LOGICAL_BITS = 18
MS_PER_DAY = 86_400_000
EPOCH = datetime.date(1970, 1, 1)
#: Options the export sets itself; a caller passing them would change what a bookmark means.
OWN_OPTIONS = frozenset(
    {"fromlsn", "tolsn", "asofrevision", "msgtypes", "sealopensegments", "pchannels", "vchannels"}
)
#: The points where `pause_at` can stop a run (tests kill the process there).
PAUSE_POINTS = (
    "before-write",
    "mid-write",
    "before-commit",
    "after-commit",
    "mid-move",
    "before-cleanup",
)
#: How long a run waits at a pause point before it goes on.
PAUSE_MAX_S = 300.0
#: Rows a task writes into its first Parquet file before a `mid-write` pause.
MID_WRITE_PAUSE_AFTER_ROWS = 50
#: Parquet codecs by the `compression` names the export takes.
CODECS = {"snappy": "snappy", "zstd": "zstd", "gzip": "gzip", "lz4": "lz4", "none": "none"}
#: Columns not dictionary-encoded: random payloads only fill a dictionary page in vain.
PLAIN_COLUMNS = frozenset({"payload"})
_RUN_NAME = re.compile(r"^run-\d{6}$")


class ExportError(RuntimeError):
    """An export that cannot run as asked (one sentence: what and why)."""


@dataclass(frozen=True)
class ExportResult:
    directory: str
    #: the manifest's version after this run (one per committed run)
    version: int
    #: the raftwal revision the export reflects
    revision: int
    rows: int
    files: int
    #: pchannel -> [first LSN read, last LSN read] by this run (pchannels with new entries)
    read_lsns: Mapping[str, tuple[int, int]]
    #: pchannel -> last exported LSN (the bookmark after this run)
    through_lsn: Mapping[str, int]
    seconds: float
    recovered: str


# -- manifest -------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir(path: Path) -> None:
    """`path` and its missing parents, 0700 (data directories stay private)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
        _fsync_dir(directory.parent)


def empty_manifest() -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "version": 0,
        "revision": 0,
        "selection": None,
        "pchannels": {},
        "files": [],
        "runs": [],
        "pending_moves": [],
    }


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The committed manifest of an export directory (an empty one when none was committed);
    ExportError when it is unreadable."""
    path = Path(directory) / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return empty_manifest()
    except OSError as error:
        raise ExportError(f"cannot read {path}: {error.strerror}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as error:
        raise ExportError(f"{path} is not valid JSON ({error.msg} at {error.pos})") from None
    expected = set(empty_manifest())
    if not isinstance(manifest, dict) or not expected <= set(manifest):
        raise ExportError(f"{path} is not a raftwal export manifest (keys {sorted(expected)})")
    if manifest["format"] != FORMAT_VERSION:
        raise ExportError(f"{path} has format {manifest['format']!r}, expected {FORMAT_VERSION}")
    return manifest


def _write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    """Atomically: a reader or a crash sees the old manifest or the new one, never a mix."""
    temporary = directory / MANIFEST_TMP
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, directory / MANIFEST)
    _fsync_dir(directory)


def committed_files(directory: str | Path) -> list[Path]:
    """The data files the committed manifest names (what a strict reader should read)."""
    root = Path(directory)
    manifest = read_manifest(root)
    if manifest["pending_moves"]:
        raise ExportError(
            f"{root}: an interrupted export left {len(manifest['pending_moves'])} committed "
            "file(s) to move into place; run the export again to finish it"
        )
    return [root / entry["path"] for entry in manifest["files"]]


def read_export(spark: Any, directory: str | Path) -> Any:
    """A DataFrame of exactly the files the committed manifest names, with the partition
    columns (`spark.read.parquet(directory)` reads the same once no run is interrupted)."""
    files = committed_files(directory)
    if not files:
        raise ExportError(f"{directory}: nothing exported yet")
    return spark.read.option("basePath", str(directory)).parquet(*map(str, files))


# -- one run --------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise ExportError(
                f"another export into {directory} is running (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; a killed process releases it too


def _pause(pause_at: tuple[str, Path] | None, point: str) -> None:
    """Fault injection for tests: at `point`, write the marker file and wait (bounded) so
    that the test can kill the process exactly here."""
    if pause_at is None or pause_at[0] != point:
        return
    marker = pause_at[1]
    marker.write_text(f"{point} {os.getpid()}\n")
    log.warning("export paused at %s (marker %s)", point, marker)
    time.sleep(PAUSE_MAX_S)


def _recover(root: Path, manifest: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Finish the moves a committed run left, then delete every uncommitted staging file."""
    notes: list[str] = []
    pending = manifest["pending_moves"]
    if pending:
        moved = 0
        for staged_name, final_name in pending:
            staged, final = root / staged_name, root / final_name
            if staged.exists():
                _mkdir(final.parent)
                os.replace(staged, final)
                _fsync_dir(final.parent)
                moved += 1
            elif not final.exists():
                raise ExportError(
                    f"{root}: committed file {final_name} is neither in place nor staged "
                    f"({staged_name}); the export directory was changed by hand"
                )
        manifest = {**manifest, "pending_moves": []}
        _write_manifest(root, manifest)
        notes.append(f"finished version {manifest['version']}: moved {moved} file(s)")
    staging = root / STAGING
    if staging.exists():
        runs = [p for p in staging.iterdir() if _RUN_NAME.match(p.name)]
        for run in runs:
            shutil.rmtree(run)
        if runs:
            notes.append(f"deleted {len(runs)} uncommitted staging run(s)")
    with contextlib.suppress(FileNotFoundError):
        (root / MANIFEST_TMP).unlink()
    return manifest, "; ".join(notes)


def _check_directory(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise ExportError(f"--to {root} is not a directory")
    if root.exists() and not (root / MANIFEST).exists():
        foreign = sorted(p.name for p in root.iterdir() if p.name not in (STAGING, LOCK))
        foreign = [n for n in foreign if n != MANIFEST_TMP]
        if foreign:
            raise ExportError(
                f"--to {root} holds files but no {MANIFEST} (e.g. {foreign[0]}): "
                "give an empty or new directory, or one an earlier export wrote"
            )
    _mkdir(root)


def export(
    spark: Any,
    to_dir: str | Path,
    source_options: Mapping[str, str],
    *,
    pchannels: list[str] | None = None,
    vchannels: list[str] | None = None,
    compression: str = "snappy",
    pause_at: tuple[str, Path] | None = None,
) -> ExportResult:
    """Export what was committed since the last run into `to_dir` (see the module doc).

    `source_options` are the `raftwal` source's options (endpoints, credentials,
    preferLocal...), except those the export sets itself (`OWN_OPTIONS`). A directory is
    bound to its first run's pchannels and vchannels: a later run with another selection
    fails, since its bookmark would not say what was exported. Raises ExportError (one
    sentence) when the run cannot start; a failed Spark job raises Spark's error."""
    started = time.monotonic()
    if compression not in CODECS:
        raise ExportError(f"compression {compression!r} is not one of {', '.join(CODECS)}")
    if pause_at is not None and pause_at[0] not in PAUSE_POINTS:
        raise ExportError(f"pause point {pause_at[0]!r} is not one of {', '.join(PAUSE_POINTS)}")
    selection, options_map, read_options = _source(source_options, pchannels, vchannels)
    root = Path(to_dir).absolute()
    _check_directory(root)
    with _locked(root):
        manifest, recovered = _recover(root, read_manifest(root))
        if recovered:
            log.info("export %s: %s", root, recovered)
        if manifest["selection"] is not None and manifest["selection"] != selection:
            raise ExportError(_selection_mismatch(root, manifest["selection"], selection))
        # Everything acknowledged before now: seal the open segments, then one revision.
        try:
            snap = snapshot(read_options)
        except ConnectorError as error:
            raise ExportError(str(error)) from None
        bookmark: dict[str, dict[str, Any]] = manifest["pchannels"]
        covered = _covered_pchannels(read_options, snap)
        new_segments: dict[str, list[Any]] = {}
        for segment in snap.segments:
            if segment.pchannel not in covered:
                continue
            through = int(bookmark.get(segment.pchannel, {}).get("through_lsn", 0))
            if segment.last_lsn > through:
                new_segments.setdefault(segment.pchannel, []).append(segment)
        read_lsns = {
            p: (int(bookmark.get(p, {}).get("through_lsn", 0)) + 1, max(s.last_lsn for s in segs))
            for p, segs in sorted(new_segments.items())
        }
        version = int(manifest["version"]) + 1
        run_name = f"run-{version:06d}"
        staged_root = root / STAGING / run_name
        new_files: list[dict[str, Any]] = []
        moves: list[list[str]] = []
        if read_lsns:
            _pause(pause_at, "before-write")
            _mkdir(root / STAGING)
            staged = _write_staged(
                spark,
                options_map,
                snap.revision,
                read_lsns,
                staged_root,
                compression,
                str(pause_at[1]) if pause_at is not None and pause_at[0] == "mid-write" else None,
            )
            new_files, moves = _committed_names(root, staged_root, staged, version)
        _pause(pause_at, "before-commit")
        for pchannel, segments in new_segments.items():
            entry = dict(bookmark.get(pchannel, {"through_lsn": 0, "segments": [], "rows": 0}))
            entry["through_lsn"] = read_lsns[pchannel][1]
            entry["segments"] = sorted({*entry["segments"], *(s.segment_id for s in segments)})
            entry["rows"] = int(entry["rows"]) + sum(
                f["rows"] for f in new_files if f["pchannel"] == pchannel
            )
            bookmark = {**bookmark, pchannel: entry}
        rows = sum(f["rows"] for f in new_files)
        committed = {
            **manifest,
            "version": version,
            "revision": snap.revision,
            "selection": selection,
            "pchannels": bookmark,
            "files": manifest["files"] + new_files,
            "runs": manifest["runs"]
            + [
                {
                    "version": version,
                    "revision": snap.revision,
                    "committed_at": datetime.datetime.now(datetime.UTC).isoformat(
                        timespec="seconds"
                    ),
                    "read_lsns": {p: list(b) for p, b in read_lsns.items()},
                    "rows": rows,
                    "files": len(new_files),
                }
            ],
            "pending_moves": moves,
        }
        _write_manifest(root, committed)
        _pause(pause_at, "after-commit")
        for index, (staged_name, final_name) in enumerate(moves):
            final = root / final_name
            _mkdir(final.parent)
            os.replace(root / staged_name, final)
            if index == 0:
                _pause(pause_at, "mid-move")
        for parent in sorted({(root / final).parent for _, final in moves}):
            _fsync_dir(parent)
        _pause(pause_at, "before-cleanup")
        if moves:
            _write_manifest(root, {**committed, "pending_moves": []})
        shutil.rmtree(staged_root, ignore_errors=True)
    return ExportResult(
        directory=str(root),
        version=version,
        revision=snap.revision,
        rows=rows,
        files=len(new_files),
        read_lsns=read_lsns,
        through_lsn={p: int(e["through_lsn"]) for p, e in bookmark.items()},
        seconds=time.monotonic() - started,
        recovered=recovered,
    )


def _source(
    source_options: Mapping[str, str], pchannels: list[str] | None, vchannels: list[str] | None
) -> tuple[dict[str, Any], dict[str, str], ReadOptions]:
    """(selection, the source's options with it, those options parsed)."""
    taken = sorted(k for k in source_options if k.lower() in OWN_OPTIONS)
    if taken:
        raise ExportError(f"option(s) {', '.join(taken)} are set by the export itself")
    selection = {
        "pchannels": sorted(set(pchannels)) if pchannels else None,
        "vchannels": sorted(set(vchannels)) if vchannels else None,
    }
    options_map = dict(source_options)
    if selection["pchannels"]:
        options_map["pchannels"] = ",".join(selection["pchannels"])
    if selection["vchannels"]:
        options_map["vchannels"] = ",".join(selection["vchannels"])
    try:
        return selection, options_map, parse_options(options_map)
    except ValueError as error:
        raise ExportError(str(error)) from None


def preflight(
    to_dir: str | Path,
    source_options: Mapping[str, str],
    *,
    pchannels: list[str] | None = None,
    vchannels: list[str] | None = None,
) -> None:
    """The checks an export makes before Spark starts, without starting it (the CLI runs
    them first, so a mistake costs no JVM start): the options, the directory, the
    selection against the directory's manifest, and the cluster's answer (reachable, the
    named pchannels and vchannels exist). ExportError with one sentence."""
    selection, _, read_options = _source(source_options, pchannels, vchannels)
    root = Path(to_dir).absolute()
    if root.exists():
        if not root.is_dir():
            raise ExportError(f"--to {root} is not a directory")
        manifest = read_manifest(root)
        if manifest["selection"] is not None and manifest["selection"] != selection:
            raise ExportError(_selection_mismatch(root, manifest["selection"], selection))
    try:
        snapshot(dataclasses.replace(read_options, seal_open_segments=False))
    except ConnectorError as error:
        raise ExportError(str(error)) from None


def _selection_mismatch(root: Path, had: Mapping[str, Any], asked: Mapping[str, Any]) -> str:
    return (
        f"{root} exports {_describe(had)}, not {_describe(asked)}: use another directory for "
        "another selection"
    )


def _describe(selection: Mapping[str, Any]) -> str:
    parts = [f"{k} {','.join(v)}" for k, v in sorted(selection.items()) if v]
    return " and ".join(parts) if parts else "every vchannel"


def _covered_pchannels(options: Any, snap: Any) -> set[str]:
    wanted = {s.pchannel for s in snap.segments}
    if options.pchannels:
        wanted &= set(options.pchannels)
    if options.vchannels:
        wanted &= {snap.vchannel_pchannels[v] for v in options.vchannels}
    return wanted


def _write_staged(
    spark: Any,
    options: Mapping[str, str],
    revision: int,
    read_lsns: Mapping[str, tuple[int, int]],
    staged_root: Path,
    compression: str,
    mid_write_marker: str | None,
) -> list[dict[str, Any]]:
    """Stage the rows of the LSN ranges at `revision` as Parquet under `staged_root`: one
    Spark task per input partition of the `raftwal` source (the connector's own plan at
    that revision), each reading its slice with the connector's reader and writing it with
    pyarrow. The files staged, as the tasks report them.

    Why not `DataFrame.write`: the rows are Arrow batches in the Python worker already, and
    Spark's writer would first hand every row to the JVM (the Python source path's main
    cost, see docs/benchmarks-history.md) to encode the same Parquet there."""
    from spark_connector.datasource import RaftwalReader, SlicePartition

    settings = {
        **options,
        "asOfRevision": str(revision),
        "fromLsn": json.dumps({p: low for p, (low, _) in read_lsns.items()}),
        "toLsn": json.dumps({p: high + 1 for p, (_, high) in read_lsns.items()}),
        # Data only: the WAL's control entries (term starts, seals, transaction markers)
        # stay out; the connector shows only committed transactions' entries anyway.
        "msgTypes": ",".join(PRODUCIBLE_MSG_TYPES),
    }
    try:
        reader = RaftwalReader(parse_options(settings))
        partitions = [p for p in reader.partitions() if isinstance(p, SlicePartition)]
    except (ValueError, ConnectorError) as error:
        raise ExportError(str(error)) from None
    if not partitions:
        return []
    task = _StageTask(str(staged_root), reader.options, CODECS[compression], mid_write_marker)
    rdd = spark.sparkContext.parallelize(list(enumerate(partitions)), len(partitions))
    staged: list[dict[str, Any]] = rdd.mapPartitions(task).collect()
    return staged


@dataclass(frozen=True)
class _StageTask:
    """What a Spark task runs (pickled to the executors): stage its slices' rows."""

    staged_root: str
    options: ReadOptions
    codec: str
    mid_write_marker: str | None

    def __call__(self, items: Iterator[tuple[int, Any]]) -> Iterator[dict[str, Any]]:
        for index, partition in items:
            yield from stage_slice(
                index,
                partition,
                Path(self.staged_root),
                self.options,
                self.codec,
                self.mid_write_marker,
            )


def stage_slice(
    index: int,
    partition: Any,
    staged_root: Path,
    options: ReadOptions,
    codec: str,
    mid_write_marker: str | None = None,
) -> list[dict[str, Any]]:
    """Write one input partition's rows (a `datasource.SlicePartition`) as Parquet, one
    file per (vchannel, date) under `staged_root/pchannel=P/vchannel=V/date=D/`, named
    `part-<index>.<codec>.parquet`: a retried task writes the same names again (through a
    hidden temporary file and a rename), so an attempt never leaves a second copy. Each
    file is fsynced with its directory before the task reports it: the manifest that names
    it is committed only after every task has reported."""
    import pyarrow as pa

    from spark_connector.fetch import read_slice

    batches = list(read_slice(partition.part, options, partition.names, partition.row_filter))
    table = pa.Table.from_batches(batches) if batches else None
    if table is None or table.num_rows == 0:
        return []
    staged: list[dict[str, Any]] = []
    for vchannel, date, rows in partition_rows(table):
        relative = (
            Path(f"pchannel={partition.part.pchannel}")
            / f"vchannel={vchannel}"
            / f"date={date}"
            / (
                f"part-{index:05d}.parquet"
                if codec == "none"
                else f"part-{index:05d}.{codec}.parquet"
            )
        )
        pause = mid_write_marker if not staged else None
        _write_parquet(rows, staged_root / relative, codec, pause)
        staged.append(
            {
                "staged": str(relative),
                "rows": rows.num_rows,
                "bytes": (staged_root / relative).stat().st_size,
                "pchannel": partition.part.pchannel,
                "vchannel": vchannel,
                "date": date,
            }
        )
    return staged


def partition_rows(table: Any) -> list[tuple[str, str, Any]]:
    """A table of the source's rows (one pchannel) cut by the export's partition columns:
    [(vchannel, date, rows without pchannel and vchannel)], sorted, each keeping the rows'
    order. The date is the UTC day of the time tick's physical milliseconds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    days = pc.divide(pc.shift_right(table["time_tick"], TICK_LOGICAL_BITS), MS_PER_DAY)
    keys = pa.table({"vchannel": table["vchannel"], "day": days})
    groups = sorted(
        zip(*keys.group_by(["vchannel", "day"]).aggregate([]).to_pydict().values(), strict=True)
    )
    data = table.drop_columns(["pchannel", "vchannel"])
    cut: list[tuple[str, str, Any]] = []
    for vchannel, day in groups:
        rows = data
        if len(groups) > 1:
            rows = data.filter(
                pc.and_(pc.equal(keys["vchannel"], vchannel), pc.equal(days, pa.scalar(day)))
            )
        cut.append((vchannel, (EPOCH + datetime.timedelta(days=day)).isoformat(), rows))
    return cut


def _write_parquet(table: Any, path: Path, codec: str, mid_write_marker: str | None) -> None:
    import pyarrow.parquet as pq

    _mkdir(path.parent)
    # One temporary file per attempt: two attempts of one task (speculation) never write
    # into the same file; whichever renames last leaves a whole file, with the same rows.
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    # Created 0600 before pyarrow opens it (pyarrow keeps an existing file's mode).
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    with pq.ParquetWriter(
        str(temporary),
        table.schema,
        compression=codec,
        use_dictionary=[n for n in table.schema.names if n not in PLAIN_COLUMNS],
    ) as writer:
        if mid_write_marker is None:
            writer.write_table(table)
        else:
            head = min(MID_WRITE_PAUSE_AFTER_ROWS, table.num_rows)
            writer.write_table(table.slice(0, head))
            with open(mid_write_marker, "w") as handle:
                handle.write(f"mid-write {os.getpid()}\n")
            time.sleep(PAUSE_MAX_S)
            writer.write_table(table.slice(head))
    fd = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    _fsync_dir(path.parent)


def _committed_names(
    root: Path, staged_root: Path, staged: list[dict[str, Any]], version: int
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """The staged files' manifest entries and [staged, final] moves."""
    files: list[dict[str, Any]] = []
    moves: list[list[str]] = []
    for entry in sorted(staged, key=lambda e: e["staged"]):
        relative = Path(entry["staged"])
        final = relative.parent / f"part-r{version:06d}-{relative.name.removeprefix('part-')}"
        files.append(
            {
                "path": str(final),
                "rows": entry["rows"],
                "bytes": entry["bytes"],
                "version": version,
                **{column: entry[column] for column in PARTITION_COLUMNS},
            }
        )
        moves.append([str((staged_root / relative).relative_to(root)), str(final)])
    if len({final for _, final in moves}) != len(moves):
        raise ExportError(f"{staged_root}: two tasks staged the same file")
    return files, moves


def result_json(result: ExportResult) -> dict[str, Any]:
    return {
        "directory": result.directory,
        "version": result.version,
        "revision": result.revision,
        "rows": result.rows,
        "files": result.files,
        "read_lsns": {p: list(b) for p, b in result.read_lsns.items()},
        "through_lsn": dict(result.through_lsn),
        "seconds": round(result.seconds, 3),
        "recovered": result.recovered,
    }


__all__ = [
    "MANIFEST",
    "PARTITION_COLUMNS",
    "PAUSE_POINTS",
    "ExportError",
    "ExportResult",
    "committed_files",
    "export",
    "preflight",
    "read_export",
    "read_manifest",
]
