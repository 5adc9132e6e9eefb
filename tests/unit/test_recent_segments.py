"""ReadSegment keeps recently opened segments open for the next call (a reader fetches a
segment in pieces): one open and verification per segment, closed when unused, and never
a stale file behind a name."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from raftwal.services.streaming_node import _RecentSegments
from wal_segments.format import Entry, MsgType
from wal_segments.segment import SegmentReader, SegmentWriter


def _segment(directory: Path, payload: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    writer = SegmentWriter.create(directory, "p0", 1, 1)
    writer.append(
        [Entry(lsn=1, term=1, time_tick=1, msg_type=int(MsgType.MESSAGE), payload=payload)]
    )
    writer.seal()
    writer.close()
    (path,) = directory.iterdir()
    return path


def test_one_open_per_segment_closed_when_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _segment(tmp_path / "a", b"first")
    opened: list[Path] = []
    real_open = SegmentReader.open

    def counting(p: Path) -> SegmentReader:
        opened.append(p)
        return real_open(p)

    monkeypatch.setattr(SegmentReader, "open", counting)
    monkeypatch.setattr(_RecentSegments, "KEEP_S", 0.2)

    async def scenario() -> None:
        recent = _RecentSegments()
        first = await recent.acquire(path)
        second = await recent.acquire(path)  # while the first is in use
        assert second is first and len(opened) == 1
        recent.release(first)
        recent.release(second)
        third = await recent.acquire(path)  # within KEEP_S: still open
        assert third is first and len(opened) == 1
        recent.release(third)
        await asyncio.sleep(0.5)  # unused for longer than KEEP_S: closed by the sweep
        assert third.reader._mapped is None
        fourth = await recent.acquire(path)
        assert fourth is not first and len(opened) == 2
        # The same name, another file (a segment written again): opened anew.
        replacement = _segment(tmp_path / "b", b"second, and longer")
        shutil.copy(replacement, tmp_path / "copy")
        (tmp_path / "copy").replace(path)
        fifth = await recent.acquire(path)
        assert fifth is not fourth and len(opened) == 3
        assert fifth.reader.digest != fourth.reader.digest
        recent.release(fourth)
        recent.release(fifth)

    asyncio.run(scenario())


def test_at_most_most_open_and_an_evicted_one_in_use_closes_on_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_RecentSegments, "MOST", 2)
    paths = [_segment(tmp_path / str(k), b"x%d" % k) for k in range(4)]

    async def scenario() -> None:
        recent = _RecentSegments()
        busy = await recent.acquire(paths[0])
        for path in paths[1:]:
            held = await recent.acquire(path)
            recent.release(held)
        # paths[0] was evicted while in use: still open for its user...
        assert busy.reader._mapped is not None
        assert len(recent._held) <= 2
        recent.release(busy)
        # ...and closed once released.
        assert busy.reader._mapped is None

    asyncio.run(scenario())
