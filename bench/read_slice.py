"""Where `read_slice` of one local segment spends its time, single process, no cluster, no
Spark: the `preferLocal` read of a Spark task (`bench/spark_read.py`'s variant (b)) on a
segment shaped like that benchmark's.

Writes one sealed segment into a temp dir: a term-start entry, `--rows` messages of
`--payload-bytes` random bytes (no key, no properties, one vchannel) and a seal marker, as
the owner seals them in `bench/spark_read.py` (250,000 rows, 42 MiB by default). Then times,
`--repeat` times each, interleaved, with the file in the page cache:

- open: `SegmentReader.open` and close (mmap, trailer, footer crc, every block crc);
- decode: `columnar.decode_headers` over the whole segment (header gathers and checks);
- build: `columnar.to_record_batch` from those headers (payload, key and name columns);
- read_slice: `spark_connector.fetch.read_slice` with `preferLocal`, end to end (open,
  digest check, decode, filter, build, internal properties hidden), every batch consumed.

and prints the median of each, in ms. The rows read are checked against the rows written
(count, sum of lsn, sum of payload lengths) once before timing.

    ./run bench read_slice [--rows N] [--payload-bytes B] [--repeat R] [--json]

It imports the code it measures from `sys.path`, so the same script measures another tree:
`PYTHONPATH=/path/to/other/tree python bench/read_slice.py`. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from spark_connector.fetch import RowFilter, read_slice
from spark_connector.options import parse_options
from spark_connector.plan import SegmentSlice
from wal_segments import columnar
from wal_segments.format import Entry, EntryFlags, MsgType, encode_batch
from wal_segments.segment import SegmentReader, SegmentWriter

PCHANNEL = "bench_p0"
NODE_ID = "n1"
VCHANNEL_ID = 1
VCHANNEL_NAMES = {VCHANNEL_ID: "bench_p0_v0"}
#: A hybrid time tick of 2026 (milliseconds << 18), as the owner stamps them.
FIRST_TIME_TICK = 1_795_000_000_000 << 18
ENCODE_BATCH_ROWS = 1000
STAGES = ("open", "decode", "build", "read_slice")


def write_segment(directory: Path, rows: int, payload_bytes: int) -> Path:
    """One sealed segment: term start, `rows` random messages, seal marker."""
    wal = directory / "wal" / PCHANNEL
    wal.mkdir(parents=True)
    writer = SegmentWriter.create(wal, PCHANNEL, 1, 1)

    def entry(lsn: int, **fields: object) -> Entry:
        return Entry(lsn=lsn, term=1, time_tick=FIRST_TIME_TICK + lsn, **fields)

    writer.append([entry(1, msg_type=int(MsgType.TERM_START), flags=int(EntryFlags.TERM_START))])
    lsn = 2
    last = 1 + rows
    while lsn <= last:
        count = min(ENCODE_BATCH_ROWS, last - lsn + 1)
        block = os.urandom(count * payload_bytes)
        batch = [
            entry(
                lsn + k,
                msg_type=int(MsgType.MESSAGE),
                vchannel_id=VCHANNEL_ID,
                payload=block[k * payload_bytes : (k + 1) * payload_bytes],
            )
            for k in range(count)
        ]
        encoded = encode_batch(batch)
        writer.append_encoded(encoded.data, encoded.meta)
        lsn += count
    writer.append([entry(lsn, msg_type=int(MsgType.SEAL), flags=int(EntryFlags.SEAL_MARKER))])
    path = writer.seal().path
    writer.close()
    return path


def measure(directory: Path, path: Path, rows: int, payload_bytes: int, repeat: int) -> dict:
    with SegmentReader.open(path) as reader:
        part = SegmentSlice(
            PCHANNEL,
            reader.first_lsn,
            reader.first_lsn,
            reader.last_lsn,
            reader.digest,
            reader.first_lsn,
            reader.last_lsn,
            ((NODE_ID, "127.0.0.1:1"),),
        )
        entries = reader.entry_count
        size_bytes = reader.size_bytes
    options = parse_options(
        {
            "endpoints": "127.0.0.1:1",
            "preferLocal": "true",
            "localDataDirs": f"{NODE_ID}={directory}",
        }
    )
    row_filter = RowFilter()

    def read() -> list[pa.RecordBatch]:
        return list(read_slice(part, options, VCHANNEL_NAMES, row_filter))

    table = pa.Table.from_batches(read())
    want = (rows, sum(range(2, 2 + rows)), rows * payload_bytes)
    got = (
        table.num_rows,
        pc.sum(table.column("lsn")).as_py(),
        pc.sum(pc.binary_length(table.column("payload"))).as_py(),
    )
    if got != want:
        raise SystemExit(f"read_slice gave (rows, sum lsn, payload bytes) {got}, expected {want}")

    reader = SegmentReader.open(path)
    try:

        def decode() -> columnar.HeaderColumns:
            return columnar.decode_headers(
                reader.buffer,
                reader.index,
                first_lsn=reader.first_lsn,
                lower_bound=reader.header_len,
                end_offset=reader.data_end,
                start_offset=reader.header_len,
            )

        headers = decode()

        def build() -> pa.RecordBatch:
            return columnar.to_record_batch(
                reader.buffer,
                headers,
                pchannel=PCHANNEL,
                segment_id=part.segment_id,
                vchannel_names=VCHANNEL_NAMES,
                source=str(path),
            )

        functions: dict[str, Callable[[], object]] = {
            "open": lambda: SegmentReader.open(path).close(),
            "decode": decode,
            "build": build,
            "read_slice": read,
        }
        samples: dict[str, list[float]] = {name: [] for name in STAGES}
        for _ in range(repeat):
            for name in STAGES:
                started = time.perf_counter()
                functions[name]()
                samples[name].append(time.perf_counter() - started)
    finally:
        reader.close()
    return {
        "rows": rows,
        "entries": entries,
        "segment_bytes": size_bytes,
        "repeat": repeat,
        "median_ms": {name: round(statistics.median(samples[name]) * 1000, 2) for name in STAGES},
        "runs_ms": {name: [round(s * 1000, 2) for s in samples[name]] for name in STAGES},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=250_000, help="messages (250,000)")
    parser.add_argument("--payload-bytes", type=int, default=100, help="(100)")
    parser.add_argument("--repeat", type=int, default=25, help="timings per stage (25)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= 5_000_000 or not 0 <= args.payload_bytes <= 65_536:
        parser.error("expected --rows 1..5,000,000 and --payload-bytes 0..65,536")
    if not 1 <= args.repeat <= 1000:
        parser.error("expected --repeat 1..1000")
    directory = Path(tempfile.mkdtemp(prefix="raftwal-read-slice-"))
    try:
        path = write_segment(directory, args.rows, args.payload_bytes)
        result = measure(directory, path, args.rows, args.payload_bytes, args.repeat)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    result["code"] = str(Path(columnar.__file__).resolve().parent.parent)
    result["load_average"] = [round(value, 2) for value in os.getloadavg()]
    result["utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    result["python"] = platform.python_version()
    result["pyarrow"] = pa.__version__
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['rows']:,} rows ({result['entries']:,} entries), "
        f"{result['segment_bytes'] / 2**20:.1f} MiB; code from {result['code']}; "
        f"medians of {args.repeat}, ms; {result['utc']} UTC, load {result['load_average']}"
    )
    for name in STAGES:
        print(f"  {name:<11} {result['median_ms'][name]:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
