"""Event-loop stall watch for benchmark processes (loaded by `bench/wal_tail.py
--stall-watch-ms`, never by a deployment).

Python imports `sitecustomize` at start-up from the path; `bench/wal_tail.py` puts this
directory on the nodes' PYTHONPATH and sets `RAFTWAL_STALL_WATCH` (a file prefix) and
`RAFTWAL_STALL_WATCH_MS`. The main thread's event loop then bumps a timestamp every
millisecond, and a watcher thread checking every 2 ms writes one JSON line per stall
longer than the threshold: when, how long so far, and what the main thread was running
(its stack, innermost last) plus the innermost frame of every other thread. A stall whose
stack is ordinary short work means the process was starved of CPU (descheduled, or
waiting for the GIL); one long operation shows up as the same frame every time.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any


def _frames(frame: Any, limit: int = 16) -> list[str]:
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return out[::-1]


def install(loop: asyncio.AbstractEventLoop, prefix: str, threshold_s: float) -> None:
    """Watch `loop`, which runs on the calling thread."""
    beat = [time.monotonic()]
    watched = threading.get_ident()

    def tick() -> None:
        beat[0] = time.monotonic()
        loop.call_later(0.001, tick)

    loop.call_soon(tick)

    def watch() -> None:
        path = f"{prefix}.{os.getpid()}.jsonl"
        name = sys.argv[sys.argv.index("--id") + 1] if "--id" in sys.argv else "bench"
        reported = 0.0
        with open(path, "a", encoding="utf-8") as out:
            while True:
                time.sleep(0.002)
                seen = beat[0]
                lag = time.monotonic() - seen
                if lag < threshold_s or seen == reported:
                    continue
                reported = seen
                frames = sys._current_frames()
                others = [
                    _frames(frame, 1)[0]
                    for ident, frame in frames.items()
                    if ident not in (watched, threading.get_ident())
                ]
                record = {
                    "process": name,
                    "pid": os.getpid(),
                    "at": time.time(),
                    "lag_ms": round(lag * 1000, 1),
                    "stack": _frames(frames.get(watched)),
                    "other_threads": others,
                }
                out.write(json.dumps(record) + "\n")
                out.flush()

    threading.Thread(target=watch, name="stall-watch", daemon=True).start()


_PREFIX = os.environ.get("RAFTWAL_STALL_WATCH")
if _PREFIX:
    _THRESHOLD_S = float(os.environ.get("RAFTWAL_STALL_WATCH_MS", "12")) / 1000
    _run_forever = asyncio.BaseEventLoop.run_forever

    def _watched_run_forever(self: asyncio.BaseEventLoop) -> None:
        if threading.current_thread() is threading.main_thread() and not getattr(
            self, "_raftwal_stall_watched", False
        ):
            self._raftwal_stall_watched = True  # type: ignore[attr-defined]
            install(self, _PREFIX, _THRESHOLD_S)
        _run_forever(self)

    asyncio.BaseEventLoop.run_forever = _watched_run_forever  # type: ignore[method-assign]
