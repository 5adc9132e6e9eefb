"""Keeping a node process's memory to what it holds: large blocks go back to the system
when freed, and a process that grew far past its smallest size (refused large requests
held by reference cycles) collects cycles and trims its heap.

Each process of a node (control, data workers) runs ``trim_memory_loop``; the supervisor
does nothing here. Must never block the event loop (the trim runs in a thread).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


# glibc's malloc serves large blocks with mmap and gives them back on free, but after the
# first such free it raises its threshold (up to 32 MiB) and serves later large blocks from
# the heap, which it rarely returns. Requests of a few MiB that a node refuses (a budget
# full, a bad batch) would then grow it for good. A fixed threshold keeps mmap for every
# block of 1 MiB or more, so memory follows what the node holds, not what it was sent.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_blocks_to_the_system() -> None:
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return  # not glibc: nothing to tune
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        log.debug("mallopt(M_MMAP_THRESHOLD) refused; keeping malloc's defaults")


# A refused large request (a 30 MiB CreateChannels without a token, or one over a limit)
# stays in memory after its answer: the exception that ended its call holds the handler's
# frame, and with it the request, in a reference cycle that only the cyclic GC frees; an
# idle node allocates too few objects to run it soon. Measured: 11 refused 30 MiB
# requests from one client left a node 363 MiB (and at times over 1 GiB) larger until
# then. So when the resident size is TRIM_ABOVE_BYTES above the smallest seen, the node
# collects cycles and gives free heap pages back (malloc_trim), at once when it grew by
# that much since the last time, else at most every TRIM_RECHECK_S (memory that is in use
# stays, and is not collected for again and again). Checked every TRIM_CHECK_S with a
# read of /proc/self/statm.
TRIM_CHECK_S = 2.0
TRIM_RECHECK_S = 10.0
TRIM_ABOVE_BYTES = 32 << 20


def resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


async def trim_memory_loop(stopping: asyncio.Event) -> None:
    malloc_trim: Callable[[int], int] | None = None
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
        malloc_trim.argtypes = (ctypes.c_size_t,)  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        malloc_trim = None  # not glibc: collect cycles only
    floor = last_after = resident_bytes()
    last_collect = time.monotonic()
    while not stopping.is_set():
        await asyncio.sleep(TRIM_CHECK_S)
        resident = resident_bytes()
        floor = min(floor, resident)
        if resident - floor <= TRIM_ABOVE_BYTES:
            continue
        if resident - last_after <= TRIM_ABOVE_BYTES and (
            time.monotonic() - last_collect < TRIM_RECHECK_S
        ):
            continue
        gc.collect()
        if malloc_trim is not None:
            await asyncio.to_thread(malloc_trim, 0)
        last_after, last_collect = resident_bytes(), time.monotonic()
        log.debug("memory: resident %d -> %d MiB", resident >> 20, last_after >> 20)
