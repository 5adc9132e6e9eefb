"""Fsync policy parsing and the group commit (fdatasyncs counted through the writer's hook,
on a real file)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from tests.wal.segment_helpers import PCHANNEL, simple_entries
from wal_segments.fsync_policy import FsyncPolicy, GroupCommit, parse_fsync_policy
from wal_segments.segment import SegmentStateError, SegmentWriter


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("always", FsyncPolicy("always")),
        ("never", FsyncPolicy("never")),
        ("interval:1", FsyncPolicy("interval", 1)),
        ("interval:250", FsyncPolicy("interval", 250)),
        ("interval:60000", FsyncPolicy("interval", 60000)),
        (" always ", FsyncPolicy("always")),
    ],
)
def test_parse_valid(text, policy):
    parsed = parse_fsync_policy(text)
    assert parsed == policy
    assert parse_fsync_policy(str(parsed)) == parsed
    assert parsed.unsafe == (policy.kind == "never")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x", "invalid fsync policy 'x' (expected always|interval:<ms>|never)"),
        ("", "invalid fsync policy '' (expected always|interval:<ms>|never)"),
        ("ALWAYS", "invalid fsync policy 'ALWAYS' (expected always|interval:<ms>|never)"),
        ("interval", "invalid fsync policy 'interval' (expected always|interval:<ms>|never)"),
        ("interval:", "invalid fsync policy 'interval:' (expected always|interval:<ms>|never)"),
        (
            "interval:10ms",
            "invalid fsync policy 'interval:10ms' (expected always|interval:<ms>|never)",
        ),
        ("interval:0", "invalid fsync policy 'interval:0' (interval 0 ms; expected 1..60000)"),
        ("interval:-5", "invalid fsync policy 'interval:-5' (interval -5 ms; expected 1..60000)"),
        (
            "interval:60001",
            "invalid fsync policy 'interval:60001' (interval 60001 ms; expected 1..60000)",
        ),
    ],
)
def test_parse_invalid(text, message):
    with pytest.raises(ValueError) as caught:
        parse_fsync_policy(text)
    assert str(caught.value) == message


class CountingFdatasync:
    """The writer's fdatasync hook: a real fdatasync, counted, optionally slowed down so
    that appenders pile up behind it as they do behind a slow disk."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls = 0
        self.fail = False
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.calls += 1
        if self.fail:
            raise OSError(5, "Input/output error")
        time.sleep(self.delay_s)
        os.fdatasync(fd)


def _writer(tmp_path: Path, hook: CountingFdatasync) -> SegmentWriter:
    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1, fdatasync=hook)
    hook.calls = 0  # the header sync of create() is not the group's
    return writer


async def test_concurrent_appenders_share_fdatasyncs(tmp_path: Path):
    hook = CountingFdatasync(delay_s=0.02)
    writer = _writer(tmp_path, hook)
    group = GroupCommit(writer, parse_fsync_policy("always"))
    lsn = iter(range(1, 10**6))

    async def appender(rounds: int) -> None:
        for _ in range(rounds):
            number = next(lsn)
            end = writer.append(simple_entries(1, first_lsn=number, first_tick=number))
            await group.sync_through(end)
            assert writer.durable_offset >= end

    await asyncio.gather(*(appender(5) for _ in range(40)))  # 200 acknowledged appends
    assert writer.last_lsn == 200 and writer.durable_offset == writer.end_offset
    # One sync in flight at a time, and each round of 40 appenders shares about one.
    assert 5 <= hook.calls <= 15, hook.calls
    assert group.sync_count == hook.calls
    await group.close()
    writer.close()


async def test_sequential_appends_sync_each_time(tmp_path: Path):
    hook = CountingFdatasync()
    writer = _writer(tmp_path, hook)
    group = GroupCommit(writer, parse_fsync_policy("always"))
    for number in range(1, 6):
        end = writer.append(simple_entries(1, first_lsn=number, first_tick=number))
        await group.sync_through(end)
        await group.sync_through(end)  # already durable: no new sync
    assert hook.calls == 5
    with pytest.raises(ValueError, match="beyond the written end"):
        await group.sync_through(writer.end_offset + 1)
    writer.close()


async def test_failed_fdatasync_fails_every_waiter_and_stays_failed(tmp_path: Path):
    hook = CountingFdatasync(delay_s=0.01)
    writer = _writer(tmp_path, hook)
    group = GroupCommit(writer, parse_fsync_policy("always"))
    hook.fail = True
    ends = [writer.append(simple_entries(1, first_lsn=n, first_tick=n)) for n in range(1, 4)]
    results = await asyncio.gather(
        *(group.sync_through(end) for end in ends), return_exceptions=True
    )
    assert all(isinstance(result, OSError) for result in results), results
    hook.fail = False
    with pytest.raises(OSError, match="Input/output"):
        await group.sync_through(ends[-1])
    assert isinstance(group.failure, OSError)
    with pytest.raises(SegmentStateError):
        writer.append(simple_entries(1, first_lsn=4, first_tick=4))
    writer.close()


async def test_a_cancelled_waiter_does_not_cancel_the_shared_sync(tmp_path: Path):
    hook = CountingFdatasync(delay_s=0.05)
    writer = _writer(tmp_path, hook)
    group = GroupCommit(writer, parse_fsync_policy("always"))
    end = writer.append(simple_entries(3))
    first = asyncio.create_task(group.sync_through(end))
    second = asyncio.create_task(group.sync_through(end))
    await asyncio.sleep(0.01)
    first.cancel()
    await second
    assert writer.durable_offset == end and hook.calls == 1
    writer.close()


async def test_interval_policy_acks_at_once_and_flushes_in_the_background(tmp_path: Path):
    hook = CountingFdatasync()
    writer = _writer(tmp_path, hook)
    group = GroupCommit(writer, parse_fsync_policy("interval:20"))
    group.start()
    end = writer.append(simple_entries(5))
    await group.sync_through(end)
    assert writer.durable_offset < end  # acknowledged before it is durable
    for _ in range(100):
        if writer.durable_offset == end:
            break
        await asyncio.sleep(0.01)
    assert writer.durable_offset == end and hook.calls >= 1
    await asyncio.sleep(0.1)
    calls = hook.calls
    await asyncio.sleep(0.1)
    assert hook.calls == calls  # nothing new written: no idle fsyncs
    tail = writer.append(simple_entries(1, first_lsn=6, first_tick=6))
    await group.close()  # a clean shutdown flushes the rest
    assert writer.durable_offset == tail
    writer.close()


async def test_never_policy_warns_and_never_syncs(tmp_path: Path, caplog):
    hook = CountingFdatasync()
    writer = _writer(tmp_path, hook)
    with caplog.at_level(logging.WARNING, logger="wal_segments.fsync_policy"):
        group = GroupCommit(writer, parse_fsync_policy("never"))
    assert "UNSAFE" in caplog.text
    end = writer.append(simple_entries(5))
    await group.sync_through(end)
    await group.close()
    assert hook.calls == 0 and writer.durable_offset < end
    writer.close()


async def test_close_syncs_the_rest_under_always(tmp_path: Path):
    hook = CountingFdatasync()
    writer = _writer(tmp_path, hook)
    group = GroupCommit(writer, parse_fsync_policy("always"))
    end = writer.append(simple_entries(2))
    await group.close()
    assert writer.durable_offset == end and hook.calls == 1
    await group.sync_through(end)  # durable through the close: nothing to wait for
    assert hook.calls == 1
    writer.close()


async def test_waiters_racing_a_close_see_their_entries_durable(tmp_path: Path):
    """A seal closes the group while appenders still wait on it: they must get their
    entries durable from the close's sync, not an error."""
    hook = CountingFdatasync(delay_s=0.05)
    writer = _writer(tmp_path, hook)
    group = GroupCommit(writer, parse_fsync_policy("always"))
    first = writer.append(simple_entries(2))
    waiter = asyncio.ensure_future(group.sync_through(first))
    await asyncio.sleep(0.01)  # the waiter's fdatasync is in flight
    second = writer.append(simple_entries(2, first_lsn=3, first_tick=10_000))
    closing = asyncio.ensure_future(group.close())
    await asyncio.sleep(0)
    late = asyncio.ensure_future(group.sync_through(second))  # after close() began
    await asyncio.gather(waiter, closing, late)
    assert writer.durable_offset == second
    writer.close()
