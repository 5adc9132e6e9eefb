"""Segment read and append throughput of the WAL segment format, single process.

Writes `--entries` entries (default 2,000,000, `--payload-bytes` 100, 16-byte keys, no
properties) into sealed segments of `--segment-entries` each, then measures, with the
files in the page cache:

(a) walk: frames walked one by one in Python, crc32c checked per frame, header unpacked and
    key/payload sliced out per row (what a reader without the footer index has to do);
(b) to_arrow: `SegmentReader.open` (footer, every 1 MiB block crc) + `to_arrow`, building
    the full Spark RecordBatch vectorially through the footer index.

and append throughput: pre-encoded batches of 100 and of 1000 entries appended with one
fdatasync per batch (the `always` policy with no concurrency to share fsyncs), plus the
encode rate of `encode_batch` for reference.

    ./run bench segment_read [--entries N] [--repeat R] [--dir DIR] [--json]

Prints rows/s per phase (median of the repeats). Anchor from the issue: walking frames
with per-record crc caps near 1.5 M rows/s, an index plus block crc reaches ~2.1 M rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from wal_segments.format import (
    ENTRY_HEADER,
    ENTRY_HEADER_SIZE,
    FOOTER_MAGIC,
    Entry,
    MsgType,
    crc32c,
    decode_file_header,
    encode_batch,
)
from wal_segments.segment import SegmentReader, SegmentWriter

PCHANNEL = "bench-p0"
VCHANNELS = {1: "bench-v1", 2: "bench-v2", 3: "bench-v3", 4: "bench-v4"}


def make_batch(first_lsn: int, count: int, payload_bytes: int) -> list[Entry]:
    payload = b"p" * payload_bytes
    return [
        Entry(
            lsn=lsn,
            term=1,
            time_tick=lsn,
            msg_type=int(MsgType.INSERT),
            vchannel_id=1 + lsn % 4,
            key=b"key-%012d" % lsn,
            payload=payload,
        )
        for lsn in range(first_lsn, first_lsn + count)
    ]


def write_segments(
    directory: Path, entries: int, per_segment: int, payload_bytes: int
) -> tuple[list[Path], float]:
    """Sealed segments holding `entries` entries; returns (paths, encode seconds)."""
    paths = []
    encode_s = 0.0
    lsn = 1
    while lsn <= entries:
        writer = SegmentWriter.create(directory, PCHANNEL, lsn, 1)
        last = min(entries, lsn + per_segment - 1)
        while lsn <= last:
            count = min(1000, last - lsn + 1)
            batch_entries = make_batch(lsn, count, payload_bytes)
            started = time.perf_counter()
            batch = encode_batch(batch_entries)
            encode_s += time.perf_counter() - started
            writer.append_encoded(batch.data, batch.meta)
            lsn += count
        paths.append(writer.seal().path)
    return paths, encode_s


def walk_frames(path: Path) -> int:
    """(a): the frame-by-frame reader: per-row unpack, crc32c and key/payload copies."""
    data = path.read_bytes()
    view = memoryview(data)
    _, offset = decode_file_header(view[:512])
    unpack = ENTRY_HEADER.unpack_from
    rows = 0
    lsns, keys, payloads = [], [], []
    end = len(data)
    while offset + ENTRY_HEADER_SIZE <= end and view[offset : offset + 8] != FOOTER_MAGIC:
        crc, props_len, lsn, _, _, _, _, _, _, _, _, key_len, payload_len = unpack(view, offset)
        key_start = offset + ENTRY_HEADER_SIZE
        frame_end = (key_start + key_len + payload_len + props_len + 7) & ~7
        if crc32c(view[offset + 4 : frame_end]) != crc:
            raise RuntimeError(f"crc mismatch at {offset} in {path}")
        lsns.append(lsn)
        keys.append(data[key_start : key_start + key_len])
        payloads.append(data[key_start + key_len : key_start + key_len + payload_len])
        rows += 1
        offset = frame_end
    return rows


def read_arrow(path: Path) -> int:
    """(b): footer index + block crcs, vectorized RecordBatch."""
    with SegmentReader.open(path) as reader:
        batch = reader.to_arrow(PCHANNEL, VCHANNELS)
    return batch.num_rows


def measure_reads(paths: list[Path], repeat: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"walk": [], "to_arrow": []}
    for _ in range(repeat):
        for name, function in (("walk", walk_frames), ("to_arrow", read_arrow)):
            started = time.perf_counter()
            rows = sum(function(path) for path in paths)
            rates[name].append(rows / (time.perf_counter() - started))
    return rates


def measure_appends(directory: Path, batch_size: int, batches: int, payload_bytes: int) -> dict:
    directory = directory / f"append-{batch_size}"
    directory.mkdir()
    writer = SegmentWriter.create(directory, PCHANNEL, 1, 1)
    encoded = [
        encode_batch(make_batch(1 + k * batch_size, batch_size, payload_bytes))
        for k in range(batches)
    ]
    latencies = []
    started = time.perf_counter()
    for batch in encoded:
        began = time.perf_counter()
        writer.append_encoded(batch.data, batch.meta)
        writer.sync()
        latencies.append(time.perf_counter() - began)
    elapsed = time.perf_counter() - started
    writer.close()
    writer.path.unlink()
    return {
        "batch_size": batch_size,
        "batches": batches,
        "entries_per_s": batches * batch_size / elapsed,
        "batches_per_s": batches / elapsed,
        "append_fsync_p50_ms": statistics.median(latencies) * 1000,
        "mib_per_s": sum(len(b.data) for b in encoded) / elapsed / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--segment-entries", type=int, default=500_000)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--append-batches", type=int, default=300)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    directory = Path(tempfile.mkdtemp(prefix="raftwal-segbench-", dir=args.dir))
    try:
        started = time.perf_counter()
        paths, encode_s = write_segments(
            directory, args.entries, args.segment_entries, args.payload_bytes
        )
        write_s = time.perf_counter() - started
        total_bytes = sum(path.stat().st_size for path in paths)
        rates = measure_reads(paths, args.repeat)
        appends = [
            measure_appends(
                directory, size, max(20, args.append_batches * 100 // size), args.payload_bytes
            )
            for size in (100, 1000)
        ]
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    walk = statistics.median(rates["walk"])
    arrow = statistics.median(rates["to_arrow"])
    result = {
        "entries": args.entries,
        "segments": len(paths),
        "segment_bytes_total": total_bytes,
        "payload_bytes": args.payload_bytes,
        "encode_entries_per_s": args.entries / encode_s,
        "write_and_seal_s": write_s,
        "walk_rows_per_s": walk,
        "to_arrow_rows_per_s": arrow,
        "to_arrow_speedup": arrow / walk,
        "walk_runs": rates["walk"],
        "to_arrow_runs": rates["to_arrow"],
        "appends": appends,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.entries:,} entries ({args.payload_bytes}-byte payloads, 16-byte keys) in "
        f"{len(paths)} sealed segments, {total_bytes / 2**20:.0f} MiB; "
        f"written and sealed in {write_s:.1f} s"
    )
    print(
        f"encode_batch:                      {result['encode_entries_per_s'] / 1e6:6.2f} M entries/s"
    )
    print(f"(a) walk frames, per-entry crc:    {walk / 1e6:6.2f} M rows/s")
    print(f"(b) to_arrow, index + block crc:   {arrow / 1e6:6.2f} M rows/s  ({arrow / walk:.1f}x)")
    for row in appends:
        print(
            f"append + fdatasync per {row['batch_size']:>4}-entry batch: "
            f"{row['entries_per_s']:>9,.0f} entries/s, {row['batches_per_s']:7,.0f} batches/s, "
            f"p50 {row['append_fsync_p50_ms']:.2f} ms, {row['mib_per_s']:.1f} MiB/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
