"""A replica's verification of a replicated batch, single process, no I/O: what
`PChannelLog.append` does to the bytes before it writes them, timed per batch.

The batch is what an owner forwards under `bench/wal_tail.py`'s load: `--entries` (100)
messages of `--payload-bytes` (100) on one vchannel, the last one carrying the producer's
deduplication properties (`encode_rows`, as `ChannelOwner.write` builds it). Timed:

- scan: `scan_batch(frames, expected_first_lsn=..., batch_crc=...)`, the replicated path
  (one crc32c over the buffer instead of one per frame);
- seal: `PChannelLog._check_seal_positions` on that metadata (every seal marker must be
  the batch's last entry);
- scan+seal: both, as `append` runs them;
- scan, frame crcs: `scan_batch` without a batch crc (a sender that sends none).

    ./run bench replica_append [--entries 100] [--payload-bytes 100] [--mixed-sizes]
                               [--repeat 15] [--json]

`--mixed-sizes` varies the payloads (100, 108, ..., 148 bytes, cycling), so that no two
frames in a row have the same size: the frame-by-frame case of `scan_batch`.

Prints the median over `--repeat` rounds of the per-batch time (each round the best of
5 timings of `--number` calls), in microseconds. Runs against whatever tree is first on
PYTHONPATH, so the same script times an A and a B checkout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

from wal_segments.format import MsgType, crc32c, encode_rows, scan_batch
from wal_segments.log import PChannelLog


def replicated_batch(
    entries: int, payload_bytes: int, first_lsn: int = 1_000_000, mixed_sizes: bool = False
) -> bytes:
    payload = bytes(range(256)) * ((payload_bytes + 64) // 256 + 1)
    rows = []
    tick = 1 << 40
    for index in range(entries):
        properties = (
            {"rw.producer": "bench-producer-0", "rw.seq": "123456", "rw.count": str(entries)}
            if index == entries - 1
            else {}
        )
        rows.append(
            (
                first_lsn + index,
                7,
                tick + index,
                int(MsgType.MESSAGE),
                3,
                0,
                0,
                0,
                b"",
                payload[: payload_bytes + (8 * (index % 7) if mixed_sizes else 0)],
                properties,
            )
        )
    return encode_rows(rows).data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--mixed-sizes", action="store_true")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    first_lsn = 1_000_000
    frames = replicated_batch(args.entries, args.payload_bytes, first_lsn, args.mixed_sizes)
    batch_crc = crc32c(frames)
    log = PChannelLog.__new__(PChannelLog)  # the check reads nothing of the log
    meta = scan_batch(frames, expected_first_lsn=first_lsn, batch_crc=batch_crc)
    assert meta.count == args.entries

    def scan() -> None:
        scan_batch(frames, expected_first_lsn=first_lsn, batch_crc=batch_crc)

    def seal() -> None:
        log._check_seal_positions(frames, meta)

    def scan_and_seal() -> None:
        log._check_seal_positions(
            frames, scan_batch(frames, expected_first_lsn=first_lsn, batch_crc=batch_crc)
        )

    def scan_frame_crcs() -> None:
        scan_batch(frames, expected_first_lsn=first_lsn)

    cases = {
        "scan": scan,
        "seal": seal,
        "scan+seal": scan_and_seal,
        "scan, frame crcs": scan_frame_crcs,
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeat):
        for name, call in cases.items():  # interleaved, so drift hits every case alike
            best = min(timeit.repeat(call, number=args.number, repeat=5))
            samples[name].append(best / args.number * 1e6)
    medians = {name: round(statistics.median(values), 2) for name, values in samples.items()}
    if args.json:
        print(
            json.dumps(
                {
                    "entries": args.entries,
                    "payload_bytes": args.payload_bytes,
                    "mixed_sizes": args.mixed_sizes,
                    "batch_bytes": len(frames),
                    "median_us_per_batch": medians,
                }
            )
        )
        return
    print(f"batch: {args.entries} entries, {len(frames)} bytes; median us per batch:")
    for name, value in medians.items():
        print(f"  {name:<18} {value:8.2f}")


if __name__ == "__main__":
    main()
