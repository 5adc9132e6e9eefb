"""One time scale for the whole suite: every deadline, timeout and wait in the tests derives
from ``RAFTWAL_TEST_TIME_SCALE`` (default 1), the factor the dev-cluster helpers
(``raftwal.cli.dev``) stretch their own waits by. A slow or busy machine sets that one
number (3 on a loaded 2-core runner) and the same tests pass, only later.

Scale the bound of a wait, never a poll interval, and never the length of a workload (how
long a test floods or watches): that would only make the test longer, not steadier. Wait
for a condition (``wait_for``) rather than sleeping for a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from raftwal.cli.dev import scaled, time_scale

__all__ = ["SCALE", "scaled", "time_scale", "wait_for"]

T = TypeVar("T")

#: The factor, read once (pytest-timeout's per-test limit is stretched by it in conftest).
SCALE = time_scale()


def wait_for(
    what: str, check: Callable[[], T | None], timeout_s: float = 20.0, interval_s: float = 0.2
) -> T:
    """Call `check` every `interval_s` until it returns something truthy and return that;
    AssertionError naming `what` (and the last value) after ``scaled(timeout_s)``."""
    limit_s = scaled(timeout_s)
    deadline = time.monotonic() + limit_s
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {limit_s:.0f} s (last: {last!r})")
        time.sleep(interval_s)
