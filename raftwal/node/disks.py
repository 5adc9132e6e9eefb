"""Disk watermarks: every data directory's free space against a soft and a hard mark.

What lives here: `Watermarks` (the four limits of ``ClusterConfig``: a used share and a
free-bytes floor per mark, Milvus Woodpecker's defaults), `level_of` (pure: which mark a
directory's free space is past), and `DiskWatch`, which samples ``os.statvfs`` of the
node's data directories (``data_dir`` and its ``wal/`` and ``raft/``, one sample per
filesystem) every ``disk_check_ms`` and acts on what it sees:

- past the **soft** mark: a warning in the log (again every `REPEAT_WARNING_S` while it
  lasts), the ``raftwal_disk_watermark_level`` metric and its alert, the member status
  and the console (``MemberStatus.disks``), and ``pressure``, which the node's heartbeat
  carries so that the leader runs WAL retention at once;
- past the **hard** mark: `write_refusal()` answers RESOURCE_EXHAUSTED with an ErrorInfo
  naming the node, the directory, its free bytes and the mark. The streaming servicer asks
  it before every Produce and transaction write (``DiskGuard`` in
  ``raftwal.services.backend``); reads, replication, seals, recoveries and coordination
  are never refused, and writes resume by themselves at the first sample under the mark;
- **full** (a Raft write met ENOSPC and Raft released its disk reserve,
  ``raft.reserve.DiskReserve``, whatever the last sample said): client writes are refused
  as past the hard mark, and `replica_refusal()` refuses the owners' Append requests too,
  so that the space the reserve gave back stays Raft's (the owners acknowledge with
  their other replicas). At the first sample under the hard mark the reserve is taken
  again, and writes resume.

A directory is past a mark when its used share, as ``df`` computes it (used / (used +
available), where available excludes the blocks reserved for root), reaches the mark's
percentage, or its available bytes fall below the mark's floor.

Must never: block the event loop on the filesystem (samples run in a worker thread), let a
failing ``statvfs`` refuse writes (an unreadable directory is logged and keeps its last
level), or refuse anything but client writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from raft.reserve import DiskReserve
from raftwal.node.config import ClusterConfig
from rpc.errors import error_info
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2

log = logging.getLogger(__name__)
E = errors_pb2

OK, SOFT, HARD = "ok", "soft", "hard"
LEVELS = (OK, SOFT, HARD)
#: While a directory stays past a mark, its warning is logged again this often.
REPEAT_WARNING_S = 60.0


@dataclass(frozen=True, slots=True)
class Watermarks:
    soft_used_percent: int = 80
    hard_used_percent: int = 90
    soft_min_free_bytes: int = 2 << 30
    hard_min_free_bytes: int = 1 << 30

    @classmethod
    def of(cls, config: ClusterConfig) -> Watermarks:
        return cls(
            soft_used_percent=config.disk_soft_used_percent,
            hard_used_percent=config.disk_hard_used_percent,
            soft_min_free_bytes=config.disk_soft_min_free_bytes,
            hard_min_free_bytes=config.disk_hard_min_free_bytes,
        )

    def describe(self, level: str) -> str:
        """The mark in words: "90% used or under 1.0 GiB free"."""
        percent, floor = self._limits(level)
        return f"{percent}% used" + (f" or under {_size(floor)} free" if floor else "")

    def _limits(self, level: str) -> tuple[int, int]:
        if level == HARD:
            return self.hard_used_percent, self.hard_min_free_bytes
        return self.soft_used_percent, self.soft_min_free_bytes

    def mark_free_bytes(self, level: str, capacity_bytes: int) -> int:
        """The mark as free bytes on a filesystem of `capacity_bytes` (used + available):
        below this much available space the directory is past the mark."""
        percent, floor = self._limits(level)
        return max(capacity_bytes * (100 - percent) // 100, floor)


@dataclass(frozen=True, slots=True)
class DiskSample:
    """One directory's filesystem as ``statvfs`` saw it."""

    dir: str
    total_bytes: int
    free_bytes: int
    #: used + available (what df's Use% is a share of)
    capacity_bytes: int

    @property
    def used_percent(self) -> float:
        if self.capacity_bytes <= 0:
            return 100.0
        return 100.0 * (self.capacity_bytes - self.free_bytes) / self.capacity_bytes


def level_of(sample: DiskSample, marks: Watermarks) -> str:
    """Which mark `sample` is past: HARD, SOFT or OK (pure)."""
    for level in (HARD, SOFT):
        percent, floor = marks._limits(level)
        past_share = sample.free_bytes * 100 <= sample.capacity_bytes * (100 - percent)
        if past_share or sample.free_bytes < floor:
            return level
    return OK


def sample_dir(path: Path) -> DiskSample:
    """``statvfs`` of `path` (raises OSError)."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    available = st.f_bavail * st.f_frsize
    return DiskSample(
        dir=str(path),
        total_bytes=st.f_blocks * st.f_frsize,
        free_bytes=available,
        capacity_bytes=used + available,
    )


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


class DiskWatch:
    """The watermarks of one node's data directories (see the module doc).

    `dirs` are sampled in order and one sample is kept per filesystem (the first directory
    named on it); `on_pressure` is called (on the event loop) when a directory goes past
    the soft mark. Created with one sample taken at once, so that a node starting on a
    full disk refuses from its first request."""

    def __init__(
        self,
        node_id: str,
        dirs: Sequence[Path],
        marks: Watermarks,
        *,
        check_s: float = 1.0,
        reserve: DiskReserve | None = None,
        on_pressure: Callable[[], None] | None = None,
        sampler: Callable[[Path], DiskSample] = sample_dir,
    ) -> None:
        self.node_id = node_id
        self.dirs = list(dirs)
        self.marks = marks
        self.check_s = check_s
        self.reserve = reserve
        self.on_pressure = on_pressure
        self._sampler = sampler
        #: dir -> (its newest sample, its level)
        self._levels: dict[str, tuple[DiskSample, str]] = {}
        self._warned_at: dict[str, float] = {}
        self._reserve_retry_at = 0.0
        #: Produce and transaction writes refused since the start
        self.refused = 0
        self._wake = asyncio.Event()
        self.check_once()

    # -- sampling ---------------------------------------------------------------------------

    def _sample_all(self) -> list[DiskSample]:
        """One sample per filesystem among `dirs` (blocking; a worker thread's job)."""
        seen: set[int] = set()
        samples = []
        for path in self.dirs:
            try:
                device = os.stat(path).st_dev
            except FileNotFoundError:
                continue  # not created yet (raft/ and wal/ appear as the node starts)
            except OSError as error:
                log.warning("disk watch: cannot sample %s: %s", path, error)
                continue
            try:
                if device in seen:
                    continue
                seen.add(device)
                samples.append(self._sampler(path))
            except OSError as error:
                log.warning("disk watch: cannot sample %s: %s", path, error)
        return samples

    def check_once(self) -> None:
        """Sample now and act on the levels (blocking)."""
        self._apply(self._sample_all())
        if self._reserve_wanted():
            self._take_reserve()

    def _apply(self, samples: list[DiskSample]) -> None:
        now = time.monotonic()
        pressure_before = self.pressure
        for sample in samples:
            level = level_of(sample, self.marks)
            previous = self._levels.get(sample.dir, (sample, OK))[1]
            self._levels[sample.dir] = (sample, level)
            # Every change is logged, and a mark still passed again every REPEAT_WARNING_S.
            repeat = level != OK and now - self._warned_at.get(sample.dir, 0.0) >= REPEAT_WARNING_S
            if level != previous or repeat:
                self._log_change(sample, previous, level)
                self._warned_at[sample.dir] = now
        if self.pressure and not pressure_before and self.on_pressure is not None:
            self.on_pressure()

    def _reserve_wanted(self) -> bool:
        """Raft's reserve is not held, the disk is under the hard mark, and no recent
        attempt to take it failed."""
        reserve = self.reserve
        return (
            reserve is not None
            and self.level != HARD
            and not reserve.held
            and time.monotonic() >= self._reserve_retry_at
        )

    def _take_reserve(self) -> None:
        """Take Raft's reserve again (blocking: fallocate and fsyncs)."""
        if self.reserve is not None and not self.reserve.ensure():
            # No room, or no permission: tried again later, logged each time.
            self._reserve_retry_at = time.monotonic() + REPEAT_WARNING_S

    def _log_change(self, sample: DiskSample, previous: str, level: str) -> None:
        where = (
            f"node {self.node_id}: {sample.dir} has {_size(sample.free_bytes)} free of "
            f"{_size(sample.total_bytes)} ({sample.used_percent:.1f}% used)"
        )
        if level == HARD:
            log.error(
                "%s: past the hard disk watermark (%s); refusing produce and transaction "
                "writes until space returns (reads and coordination go on)",
                where,
                self.marks.describe(HARD),
            )
        elif level == SOFT:
            log.warning(
                "%s: past the soft disk watermark (%s); retention runs now; free space or "
                "lower retention before the hard mark (%s) refuses writes",
                where,
                self.marks.describe(SOFT),
                self.marks.describe(HARD),
            )
        else:
            log.info("%s: back under the disk watermarks (was %s)", where, previous)

    async def run(self, stopping: asyncio.Event) -> None:
        """Sample every `check_s` (sooner after `check_soon`) until `stopping`."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.check_s)
            self._wake.clear()
            samples = await asyncio.to_thread(self._sample_all)
            self._apply(samples)
            if self._reserve_wanted():
                await asyncio.to_thread(self._take_reserve)

    def check_soon(self) -> None:
        """Sample at once (a write met ENOSPC: the disk filled between two samples)."""
        self._wake.set()

    # -- what the node asks -----------------------------------------------------------------

    @property
    def level(self) -> str:
        """The worst level over the directories."""
        worst = OK
        for _, level in self._levels.values():
            if LEVELS.index(level) > LEVELS.index(worst):
                worst = level
        return worst

    @property
    def pressure(self) -> bool:
        """Some directory is past the soft mark (the heartbeat asks for retention)."""
        return self.level != OK

    def _worst(self) -> tuple[DiskSample, str] | None:
        worst = None
        for sample, level in self._levels.values():
            if worst is None or LEVELS.index(level) > LEVELS.index(worst[1]):
                worst = (sample, level)
        return worst

    def disk_space(self, mark: str) -> errors_pb2.DiskSpace:
        """The ErrorInfo detail for the worst directory, `mark` as the reason."""
        worst = self._worst()
        if worst is None:
            return errors_pb2.DiskSpace(node_id=self.node_id, mark=mark)
        sample, level = worst
        return errors_pb2.DiskSpace(
            node_id=self.node_id,
            dir=sample.dir,
            free_bytes=sample.free_bytes,
            total_bytes=sample.total_bytes,
            mark=mark,
            mark_free_bytes=self.marks.mark_free_bytes(
                HARD if mark == "full" else mark, sample.capacity_bytes
            ),
        )

    @property
    def full(self) -> bool:
        """Raft met a full disk and is living on its reserve (released, not taken back)."""
        return self.reserve is not None and self.reserve.released

    def write_refusal(self, what: str = "a Produce") -> errors_pb2.ErrorInfo | None:
        """RESOURCE_EXHAUSTED for a client write while a directory is past the hard mark
        or the disk filled up (`full`), else None (``raftwal.services.backend.DiskGuard``)."""
        worst = self._worst()
        full = self.full
        if worst is None or (worst[1] != HARD and not full):
            return None
        sample, _ = worst
        self.refused += 1
        if full:
            disk = self.disk_space("full")
            reason = (
                f"node {self.node_id}'s disk filled up and Raft is using its disk reserve "
                f"({sample.dir}: {sample.free_bytes} bytes free at the last sample)"
            )
        else:
            disk = self.disk_space(HARD)
            reason = (
                f"node {self.node_id} is past its hard disk watermark: {sample.dir} has "
                f"{sample.free_bytes} bytes free of {sample.total_bytes} "
                f"({sample.used_percent:.1f}% used; the hard mark is "
                f"{self.marks.describe(HARD)}: {disk.mark_free_bytes} bytes free)"
            )
        info = error_info(
            E.RESOURCE_EXHAUSTED,
            f"{what} refused: {reason}; writes resume by themselves once space returns",
        )
        info.disk.CopyFrom(disk)
        return info

    def replica_refusal(self) -> errors_pb2.ErrorInfo | None:
        """RESOURCE_EXHAUSTED for a replica append (an owner's Append with entries) while
        a directory is past the hard mark and Raft's reserve is released: the disk filled
        up, and the space the reserve gave back is Raft's, not the WAL's. The owner retries
        with backoff; its majority acknowledges without this replica meanwhile."""
        worst = self._worst()
        if worst is None or not self.full:
            return None
        info = error_info(
            E.RESOURCE_EXHAUSTED,
            f"replica append refused: node {self.node_id}'s disk filled up ({worst[0].dir} "
            f"has {worst[0].free_bytes} bytes free) and Raft is using its disk reserve; the "
            "replica takes appends again once space returns",
        )
        info.disk.CopyFrom(self.disk_space("full"))
        return info

    def full_detail(self) -> errors_pb2.DiskSpace:
        """The detail for a write the filesystem refused (ENOSPC); samples again soon."""
        self.check_soon()
        return self.disk_space("full")

    def statuses(self) -> list[api.DiskStatus]:
        """``MemberStatus.disks``."""
        return [
            api.DiskStatus(
                dir=sample.dir,
                total_bytes=sample.total_bytes,
                free_bytes=sample.free_bytes,
                level=level,
                soft_mark_free_bytes=self.marks.mark_free_bytes(SOFT, sample.capacity_bytes),
                hard_mark_free_bytes=self.marks.mark_free_bytes(HARD, sample.capacity_bytes),
            )
            for sample, level in self._levels.values()
        ]


def disk_warnings(member: api.MemberStatus) -> list[str]:
    """ClusterStatus warnings for a member's directories past a mark, and for its Raft
    reserve while a full disk keeps it released."""
    found = []
    for disk in member.disks:
        if disk.level == OK:
            continue
        mark = disk.hard_mark_free_bytes if disk.level == HARD else disk.soft_mark_free_bytes
        found.append(
            f"node {member.node_id}: {disk.dir} is past its {disk.level} disk watermark "
            f"({_size(disk.free_bytes)} free of {_size(disk.total_bytes)}; the mark is "
            f"{_size(mark)} free)"
            + (
                "; produce and transaction writes are refused until space returns"
                if disk.level == HARD
                else "; retention ran at once"
            )
        )
    if member.raft_reserve_wanted_bytes and member.raft_reserve_bytes < (
        member.raft_reserve_wanted_bytes
    ):
        found.append(
            f"node {member.node_id}: its Raft disk reserve "
            f"({_size(member.raft_reserve_wanted_bytes)}) is not held (a full disk made Raft "
            "use it, or there was no room to take it); it is taken again once the disk is "
            "under its soft watermark"
        )
    return found


class DiskCollector(Collector):
    """The watch's metrics, read at every scrape."""

    def __init__(self, watch: DiskWatch, refused: Callable[[], int] | None = None) -> None:
        self._watch = watch
        # The node's refusals, where another process counts them (a node's data workers
        # refuse the writes; its control process serves the page): else the watch's own.
        self._refused = refused

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        watch = self._watch
        level = GaugeMetricFamily(
            "raftwal_disk_watermark_level",
            "Each data directory against its disk watermarks: 0 under both, 1 past the soft "
            "mark (warned; retention runs at once), 2 past the hard mark (produce and "
            "transaction writes refused).",
            labels=["dir"],
        )
        free = GaugeMetricFamily(
            "raftwal_disk_dir_free_bytes",
            "Bytes available on the filesystem of each data directory (one per filesystem).",
            labels=["dir"],
        )
        marks = GaugeMetricFamily(
            "raftwal_disk_mark_free_bytes",
            "Each data directory's watermarks as free bytes: below this much free space it "
            "is past the mark (soft or hard).",
            labels=["dir", "mark"],
        )
        for status in watch.statuses():
            level.add_metric([status.dir], float(LEVELS.index(status.level)))
            free.add_metric([status.dir], float(status.free_bytes))
            marks.add_metric([status.dir, SOFT], float(status.soft_mark_free_bytes))
            marks.add_metric([status.dir, HARD], float(status.hard_mark_free_bytes))
        yield level
        yield free
        yield marks
        yield CounterMetricFamily(
            "raftwal_disk_writes_refused",
            "Produce and transaction writes refused with RESOURCE_EXHAUSTED because a data "
            "directory is past its hard disk watermark.",
            value=float(self._refused() if self._refused is not None else watch.refused),
        )
        reserve = watch.reserve
        if reserve is not None:
            yield GaugeMetricFamily(
                "raftwal_raft_reserve_bytes",
                "Bytes of Raft's disk reserve held now (raft_reserve_bytes while held; 0 "
                "after a full disk made Raft use it, until space returns).",
                value=float(reserve.held_bytes),
            )
            yield CounterMetricFamily(
                "raftwal_raft_reserve_releases",
                "Times a full disk made Raft release its disk reserve to keep writing.",
                value=float(reserve.releases),
            )
