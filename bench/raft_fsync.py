"""fdatasync of a small append: into a growing file (raftwal's journal today) or into a
file pre-sized with posix_fallocate (as etcd preallocates its WAL segments), by one
process or by three at once (a leader and two followers on one disk).

    .venv/bin/python bench/raft_fsync.py [--dir DIR] [--syncs 500] [--rounds 3]

DIR (default: a temporary directory under the current one, removed afterwards) must be on
the disk the nodes use.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time

RECORD = b"x" * 200


def _syncs(path: str, presized: bool, count: int, start: object, out: object) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if presized:
            os.posix_fallocate(fd, 0, 64 << 20)
            os.fsync(fd)
        start.wait()  # type: ignore[attr-defined]
        latencies = []
        offset = 0
        for _ in range(count):
            os.pwrite(fd, RECORD, offset)
            offset += len(RECORD)
            begin = time.perf_counter()
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - begin) * 1000)
        out.put(latencies)  # type: ignore[attr-defined]
    finally:
        os.close(fd)
        os.unlink(path)


def run(directory: str, presized: bool, processes: int, count: int) -> list[float]:
    context = multiprocessing.get_context("fork")
    start, out = context.Event(), context.Queue()
    workers = [
        context.Process(target=_syncs, args=(f"{directory}/f{n}", presized, count, start, out))
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(0.3)
    start.set()
    latencies = sorted(x for _ in workers for x in out.get(timeout=120))
    for worker in workers:
        worker.join(30)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--syncs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftwal-fsync-", dir=args.dir or ".") as directory:
        for round_ in range(1, args.rounds + 1):
            for processes in (1, 3):
                for presized in (False, True):
                    lat = run(directory, presized, processes, args.syncs)
                    print(
                        f"round {round_}  {processes} process(es)  "
                        f"{'pre-sized' if presized else 'growing  '}  "
                        f"p50 {statistics.median(lat):.3f}  "
                        f"p90 {lat[int(len(lat) * 0.9)]:.3f}  "
                        f"p99 {lat[int(len(lat) * 0.99)]:.3f} ms"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
