"""DataPlane.log: a caller cancelled while the pchannel's log is being opened (an RPC whose
client went away, a deadline) neither marks the pchannel broken nor leaves it unopened.

Before the fix the cancellation ran inside the open and was recorded as "cannot open the
log" with an empty message; reconcile then skipped the pchannel, so an assignment to this
node stayed ASSIGNING until the coordinator's assign timeout (15 s) moved it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from pathlib import Path
from typing import Any

import pytest

from tests.timing import scaled
from tests.wal.test_wal_owner_recovery import Loopback
from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.log import PChannelLog
from wal_segments.owner import OwnerConfig
from wal_segments.plane import REASSIGN_BACKOFF_S, Assignment, DataPlane
from wal_segments.segment import SegmentCorrupted


class _View:
    def assignments(self) -> dict[str, Assignment]:
        return {}

    async def reassign_to_self(self, pchannel: str, term: int) -> None:
        return None


def _plane(tmp_path: Path, view: Any = None) -> DataPlane:
    """A data plane of node n1 whose coordination view (and proposer) is `view`."""
    nothing: Any = None
    view = view if view is not None else _View()
    return DataPlane(
        node_id="n1",
        data_dir=tmp_path,
        policy=parse_fsync_policy("always"),
        owner_config=OwnerConfig(),
        transport=nothing,
        proposer=view,
        view=view,
    )


async def test_a_cancelled_caller_leaves_the_log_opening_and_not_broken(tmp_path: Path) -> None:
    plane = _plane(tmp_path)
    try:
        caller = asyncio.create_task(plane.log("p"))
        await asyncio.sleep(0)  # the open has started (it waits for its thread)
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        # The open goes on by itself (bounded wait) and nothing is marked broken.
        for _ in range(300):
            if "p" in plane.logs or plane.broken:
                break
            await asyncio.sleep(0.1)
        assert plane.broken == {}
        log = plane.logs["p"]
        assert await plane.log("p") is log  # opened once
    finally:
        await plane.close()


class _Assigned(Loopback):
    """A view with one pchannel assigned to n1 alone, recovering at term 1; the proposer
    its owner asks to be ready records (term, start_lsn) in `ready`."""

    def __init__(self) -> None:
        super().__init__({})

    def assignments(self) -> dict[str, Assignment]:
        return {"p": Assignment("p", 1, "n1", "ASSIGNING", ("n1",))}

    async def reassign_to_self(self, pchannel: str, term: int) -> None:
        return None


def _failing_opens(monkeypatch: pytest.MonkeyPatch, error: Exception, times: int) -> list[str]:
    """`PChannelLog.open` raises `error` for its first `times` calls (a disk answering
    EIO for a while, or a malformed log), then opens; returns the pchannels it was
    called for."""
    calls: list[str] = []
    real = PChannelLog.open.__func__  # type: ignore[attr-defined]

    async def open_(cls: type[PChannelLog], directory: Path, pchannel: str, *args: Any) -> Any:
        calls.append(pchannel)
        if len(calls) <= times:
            raise error
        return await real(cls, directory, pchannel, *args)

    monkeypatch.setattr(PChannelLog, "open", classmethod(open_))
    return calls


async def test_a_log_whose_open_failed_on_an_io_error_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that failed with EIO for a moment (a brown-out) works again: the next
    reconcile opens the log and the assignment here is served. It used to stay broken for
    the process's life, and an owner assigned to this node never started (the coordinator
    moved the pchannel away on its assign timeout, and back again when the balancer
    picked this node: the simulation's seed 8517 stalled that way)."""
    calls = _failing_opens(monkeypatch, OSError(errno.EIO, "Input/output error"), times=1)
    view = _Assigned()
    plane = _plane(tmp_path, view)
    try:
        await plane.reconcile()
        assert "p" in plane.broken and "p" not in plane.owners
        await plane.reconcile()
        assert calls == ["p", "p"]
        assert plane.broken == {}
        owner = plane.owners["p"]
        await asyncio.wait_for(owner.ready.wait(), scaled(10))
        assert [term for term, _ in view.ready] == [1]
    finally:
        await plane.close()


async def test_a_malformed_log_is_not_opened_again_by_every_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed segment does not heal by itself: the pchannel stays reported broken
    and is not opened again at every reconcile."""
    corrupted = SegmentCorrupted(tmp_path / "p" / "x.seg", 0, "block 0 crc mismatch")
    calls = _failing_opens(monkeypatch, corrupted, times=5)
    plane = _plane(tmp_path, _Assigned())
    try:
        for _ in range(3):
            await plane.reconcile()
        assert calls == ["p"]
        assert "p" in plane.broken and "p" not in plane.owners
    finally:
        await plane.close()


class _RecordedOwnerDown:
    """A view whose state names n1 the ready (ASSIGNED) owner of "p" at `term`, which n1
    does not serve (it restarted): the plane asks for the next term, and the state
    rejects the first `rejections` requests (n1 still DOWN in it)."""

    def __init__(self, rejections: int) -> None:
        self.term = 3
        self.rejections = rejections
        self.asked: list[tuple[int, float]] = []

    def assignments(self) -> dict[str, Assignment]:
        return {"p": Assignment("p", self.term, "n1", "ASSIGNED", ("n1",))}

    async def reassign_to_self(self, pchannel: str, term: int) -> None:
        self.asked.append((term, asyncio.get_running_loop().time()))
        if len(self.asked) <= self.rejections:
            raise RuntimeError("FAILED_PRECONDITION: node n1 is DOWN")


async def _reconcile_until(plane: DataPlane, done: Any, within_s: float) -> None:
    """Reconcile back to back, as the reconcile loop does when every rejection's apply
    wakes it, until `done()` or `within_s` (scaled) has passed."""
    deadline = asyncio.get_running_loop().time() + scaled(within_s)
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await plane.reconcile()
        await asyncio.sleep(0.002)


async def test_a_rejected_reassign_is_asked_again_after_a_backoff_not_at_every_reconcile(
    tmp_path: Path,
) -> None:
    """Each rejected request for the next term is a Raft entry whose apply wakes the
    reconcile loop, which asked again at once: "reassign failed: node n1 is DOWN" came 19
    times in about 150 ms after a restore, a Raft proposal each. Now a rejection is asked
    again after a backoff that doubles (REASSIGN_BACKOFF_S), and a new term starts over."""
    view = _RecordedOwnerDown(rejections=3)
    plane = _plane(tmp_path, view)
    try:
        for _ in range(50):  # a storm of wake-ups right after the first rejection
            await plane.reconcile()
        assert [term for term, _ in view.asked] == [3]
        await _reconcile_until(plane, lambda: len(view.asked) == 4, within_s=10)
        gaps = [b - a for (_, a), (_, b) in zip(view.asked, view.asked[1:], strict=False)]
        first, _last = REASSIGN_BACKOFF_S
        assert gaps[0] >= first and gaps[1] >= 2 * first and gaps[2] >= 4 * first, gaps
        # Accepted: nothing more is asked at that term.
        for _ in range(20):
            await plane.reconcile()
        assert len(view.asked) == 4
        # A new term (the state moved on) is asked at once, whatever the last backoff.
        view.term, view.rejections = 7, 10
        await plane.reconcile()
        assert view.asked[-1][0] == 7
        for _ in range(20):
            await plane.reconcile()
        assert [term for term, _ in view.asked].count(7) == 1
    finally:
        await plane.close()
