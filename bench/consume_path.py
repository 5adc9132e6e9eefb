"""Where the Consume path's time goes, per entry, in this process (no gRPC, no Spark).

A `PChannelLog` (fsync `always`) in a temporary directory holds `--entries` entries of
`--payload-bytes` each, written in batches of 1,000. Then, over the whole log, one step at
a time, each the median of `--repeat` passes:

- read: `read_frames_range` in 4 MiB chunks (what Consume reads per response);
- decode, full: `iter_batch` (every structural check of `check_frame`, an `Entry` per
  entry): what Consume did before 0cc1ba5;
- decode, fast: `frame_headers` (bounds and crc only, no object per entry): what it does;
- build: a `WalEntry` per entry from the header fields (decoded beforehand, untimed) and
  slices of the read buffer;
- serialize: `ConsumeResponse` of 1,000 entries (100 B) or 400 (10 KiB: 4 MiB), then
  `SerializeToString`;
- prebuilt: what Consume does instead of build + serialize since consume_wire: each
  entry's protobuf bytes written from the header fields and buffer slices, joined into
  responses of the same size (one copy of each payload).

    ./run bench consume_path [--entries N] [--payload-bytes B] [--repeat R] [--json]

Prints microseconds per entry for each step. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from raftwal.services import consume_wire
from rpc.protos import streaming_pb2 as wire
from wal_segments.catalog import Catalog
from wal_segments.format import (
    ENTRY_HEADER_SIZE,
    Entry,
    MsgType,
    encode_batch,
    frame_headers,
    iter_batch,
)
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import PChannelLog

CHUNK_BYTES = 4 << 20


async def _fill(log: PChannelLog, entries: int, payload: bytes) -> None:
    await log.fence(1)
    lsn = 1
    while lsn <= entries:
        last = min(entries, lsn + 999)
        batch = [
            Entry(
                lsn=n,
                term=1,
                time_tick=10 * n,
                msg_type=int(MsgType.MESSAGE),
                vchannel_id=1,
                payload=payload,
            )
            for n in range(lsn, last + 1)
        ]
        result = await log.append(1, lsn - 1, 1 if lsn > 1 else 0, encode_batch(batch).data)
        await log.wait_durable(result)
        lsn = last + 1


def _chunks(log: PChannelLog, entries: int) -> list[bytes]:
    out, lsn = [], 1
    while lsn <= entries:
        data, last = log.read_frames_range(lsn, CHUNK_BYTES, entries)
        out.append(data)
        lsn = last + 1
    return out


def _build(data: bytes, frames: list) -> list[wire.WalEntry]:  # type: ignore[type-arg]
    out = []
    for offset, fields in frames:
        key_start = offset + ENTRY_HEADER_SIZE
        payload_start = key_start + fields[11]
        payload_end = payload_start + fields[12]
        out.append(
            wire.WalEntry(
                pchannel="p",
                vchannel="v",
                lsn=fields[2],
                term=fields[3],
                time_tick=fields[4],
                msg_type="message",
                key=data[key_start:payload_start],
                payload=data[payload_start:payload_end],
                txn_id=fields[6],
                broadcast_id=fields[7],
                flags=fields[10],
            )
        )
    return out


def _prebuilt(data: bytes, frames: list, per_response: int) -> list[bytes]:  # type: ignore[type-arg]
    encoder = consume_wire.EntryEncoder("p", lambda _code: "message")
    view = memoryview(data)
    parts = [encoder.entry(view, offset, fields, "v") for offset, fields in frames]
    return [
        consume_wire.response(parts[i : i + per_response], len(parts), 1, 0)
        for i in range(0, len(parts), per_response)
    ]


def _timed(step, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def run(entries: int, payload_bytes: int, repeat: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="consume-path-"))
    try:
        (root / "node").mkdir(mode=0o700)
        catalog = Catalog(root / "node" / "catalog.db")
        log = await PChannelLog.open(
            root / "node" / "segments", "p", catalog, parse_fsync_policy("always")
        )
        try:
            await _fill(log, entries, b"x" * payload_bytes)
            chunks = _chunks(log, entries)
            headers = [frame_headers(data) for data in chunks]
            built = [e for data, f in zip(chunks, headers, strict=True) for e in _build(data, f)]
            per_response = 1000 if payload_bytes <= 1024 else max(1, CHUNK_BYTES // payload_bytes)
            steps = {
                "read": lambda: _chunks(log, entries),
                "decode_full": lambda: [list(iter_batch(data)) for data in chunks],
                "decode_fast": lambda: [frame_headers(data) for data in chunks],
                "build": lambda: [_build(data, f) for data, f in zip(chunks, headers, strict=True)],
                "serialize": lambda: [
                    wire.ConsumeResponse(
                        entries=built[i : i + per_response], committed_lsn=entries, term=1
                    ).SerializeToString()
                    for i in range(0, len(built), per_response)
                ],
                "prebuilt": lambda: [
                    _prebuilt(data, f, per_response)
                    for data, f in zip(chunks, headers, strict=True)
                ],
            }
            return {
                name: round(_timed(step, repeat) * 1e6 / entries, 2) for name, step in steps.items()
            }
        finally:
            await log.close()
            catalog.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000, help="default: 100000")
    parser.add_argument("--payload-bytes", type=int, default=100, help="default: 100")
    parser.add_argument("--repeat", type=int, default=3, help="default: 3")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    figures = asyncio.run(run(args.entries, args.payload_bytes, args.repeat))
    if args.json:
        print(json.dumps({"payload_bytes": args.payload_bytes, "us_per_entry": figures}))
    else:
        for name, value in figures.items():
            print(f"{name:12s} {value:8.2f} us/entry ({args.payload_bytes} B payloads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
