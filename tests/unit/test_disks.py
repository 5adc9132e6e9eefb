"""Disk watermarks (raftwal/node/disks.py): which mark a directory is past, what the watch
refuses and reports, and the config that sets the marks. Samples come from a table here
(the sampler is the watch's only I/O besides Raft's reserve, which uses tmp_path); the
cluster tests (tests/cluster/test_disks.py) fill real, small filesystems."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from raft.reserve import DiskReserve
from raftwal.node.config import ConfigError, parse_config
from raftwal.node.disks import (
    HARD,
    OK,
    SOFT,
    DiskCollector,
    DiskSample,
    DiskWatch,
    Watermarks,
    disk_warnings,
    level_of,
)
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2

GIB = 1 << 30
MARKS = Watermarks()  # Woodpecker's: 80% / 90% used, 2 GiB / 1 GiB free


def _sample(free: int, capacity: int = 100 * GIB, directory: str = "/data/n1") -> DiskSample:
    return DiskSample(dir=directory, total_bytes=capacity, free_bytes=free, capacity_bytes=capacity)


@pytest.mark.parametrize(
    ("free", "capacity", "marks", "expected"),
    [
        (50 * GIB, 100 * GIB, MARKS, OK),
        (21 * GIB, 100 * GIB, MARKS, OK),
        (20 * GIB, 100 * GIB, MARKS, SOFT),  # 80% used: the soft mark reached
        (11 * GIB, 100 * GIB, MARKS, SOFT),
        (10 * GIB, 100 * GIB, MARKS, HARD),  # 90% used
        (0, 100 * GIB, MARKS, HARD),
        # A small disk: the free-bytes floors decide before the shares do.
        (int(1.5 * GIB), 4 * GIB, MARKS, SOFT),
        (GIB - 1, 4 * GIB, MARKS, HARD),
        # No floors (0): only the shares.
        (GIB - 1, 4 * GIB, Watermarks(80, 90, 0, 0), OK),
        # 100%: no share limit; only a full disk (or a floor) is past it.
        (1, 100 * GIB, Watermarks(100, 100, 0, 0), OK),
        (0, 100 * GIB, Watermarks(100, 100, 0, 0), HARD),
    ],
)
def test_level_of(free: int, capacity: int, marks: Watermarks, expected: str) -> None:
    assert level_of(_sample(free, capacity), marks) == expected


def test_marks_as_free_bytes() -> None:
    assert MARKS.mark_free_bytes(SOFT, 100 * GIB) == 20 * GIB
    assert MARKS.mark_free_bytes(HARD, 100 * GIB) == 10 * GIB
    assert MARKS.mark_free_bytes(HARD, 4 * GIB) == GIB  # the floor
    assert MARKS.describe(HARD) == "90% used or under 1.0 GiB free"
    assert Watermarks(80, 90, 0, 0).describe(SOFT) == "80% used"


class _Disk:
    """The sampler of a watch under test: whatever `free` says now."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, path: Path) -> DiskSample:
        return _sample(self.free, directory=str(path))


def _watch(tmp_path: Path, disk: _Disk, **options) -> DiskWatch:  # type: ignore[no-untyped-def]
    return DiskWatch("n1", [tmp_path], MARKS, sampler=disk, **options)


def test_refuses_client_writes_past_the_hard_mark_and_resumes(tmp_path: Path) -> None:
    disk = _Disk(50 * GIB)
    pressure: list[bool] = []
    watch = _watch(tmp_path, disk, on_pressure=lambda: pressure.append(True))
    assert watch.level == OK and not watch.pressure
    assert watch.write_refusal() is None
    disk.free = 15 * GIB
    watch.check_once()
    assert watch.level == SOFT and watch.pressure and pressure == [True]
    assert watch.write_refusal() is None  # soft: warned, not refused
    disk.free = 5 * GIB
    watch.check_once()
    refusal = watch.write_refusal("a CommitTxn")
    assert refusal is not None and refusal.code == errors_pb2.RESOURCE_EXHAUSTED
    assert refusal.message.startswith("a CommitTxn refused: node n1 is past its hard disk")
    assert refusal.disk.node_id == "n1"
    assert refusal.disk.dir == str(tmp_path)
    assert refusal.disk.mark == HARD
    assert refusal.disk.free_bytes == 5 * GIB
    assert refusal.disk.total_bytes == 100 * GIB
    assert refusal.disk.mark_free_bytes == 10 * GIB
    assert watch.refused == 1
    assert pressure == [True]  # told once, at the transition
    # Replicas go on taking appends while Raft's reserve is held (none here).
    assert watch.replica_refusal() is None
    disk.free = 50 * GIB
    watch.check_once()
    assert watch.level == OK and watch.write_refusal() is None


def test_a_full_disk_refuses_until_the_reserve_is_taken_back(tmp_path: Path) -> None:
    disk = _Disk(50 * GIB)
    reserve = DiskReserve(tmp_path / "reserve", 64 << 10)
    watch = _watch(tmp_path, disk, reserve=reserve)
    assert reserve.held  # taken at the first sample
    # Raft met ENOSPC between two samples and lived on its reserve.
    assert reserve.release_for(OSError(errno.ENOSPC, "No space left on device"))
    assert watch.full
    refusal = watch.write_refusal()
    assert refusal is not None and refusal.disk.mark == "full"
    assert "Raft is using its disk reserve" in refusal.message
    replica = watch.replica_refusal()
    assert replica is not None and replica.code == errors_pb2.RESOURCE_EXHAUSTED
    # While past the hard mark the reserve stays released.
    disk.free = 5 * GIB
    watch.check_once()
    assert watch.full and not reserve.held
    # Space returns: the reserve is taken again, and writes resume.
    disk.free = 50 * GIB
    watch.check_once()
    assert reserve.held and not watch.full
    assert watch.write_refusal() is None and watch.replica_refusal() is None


def test_status_warnings_and_metrics(tmp_path: Path) -> None:
    disk = _Disk(5 * GIB)
    reserve = DiskReserve(tmp_path / "reserve", 64 << 10)
    watch = _watch(tmp_path, disk, reserve=reserve)
    (status,) = watch.statuses()
    assert (status.level, status.free_bytes, status.hard_mark_free_bytes) == (
        HARD,
        5 * GIB,
        10 * GIB,
    )
    member = api.MemberStatus(
        node_id="n1",
        disks=watch.statuses(),
        raft_reserve_bytes=reserve.held_bytes,
        raft_reserve_wanted_bytes=reserve.size_bytes,
    )
    (hard, unheld) = disk_warnings(member)
    assert "past its hard disk watermark" in hard and "refused" in hard
    assert "Raft disk reserve" in unheld  # no room to take it at this level
    watch.write_refusal()
    families = {family.name: family for family in DiskCollector(watch).collect()}
    level = families["raftwal_disk_watermark_level"].samples[0]
    assert level.labels == {"dir": str(tmp_path)} and level.value == 2
    assert families["raftwal_disk_writes_refused"].samples[0].value == 1
    assert families["raftwal_raft_reserve_bytes"].samples[0].value == 0


def _config(cluster: dict[str, object], environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    data = {
        "cluster": {"secret": "x" * 32, **cluster},
        "nodes": [{"id": "n1", "host": "127.0.0.1", "grpc_port": 7001, "raft_port": 7002}],
    }
    return parse_config(data, Path("/tmp"), environ or {})


def test_config_defaults_overrides_and_bad_values() -> None:
    config = _config({})
    assert (config.disk_soft_used_percent, config.disk_hard_used_percent) == (80, 90)
    assert (config.disk_soft_min_free_bytes, config.disk_hard_min_free_bytes) == (2 * GIB, GIB)
    assert config.raft_reserve_bytes == 64 << 20 and config.disk_check_ms == 1000
    assert config.replica_lag_warn_ms == 1000
    changed = _config(
        {"disk_hard_used_percent": 95, "raft_reserve_bytes": 0},
        {"RAFTWAL_DISK_HARD_MIN_FREE_BYTES": "0"},
    )
    assert changed.disk_hard_used_percent == 95 and changed.raft_reserve_bytes == 0
    assert changed.disk_hard_min_free_bytes == 0
    with pytest.raises(ConfigError, match="disk_hard_used_percent"):
        _config({"disk_hard_used_percent": 101})
    with pytest.raises(ConfigError, match="soft mark at or before the hard one"):
        _config({"disk_soft_used_percent": 95, "disk_hard_used_percent": 90})
    with pytest.raises(ConfigError, match="soft mark at or before the hard one"):
        _config({"disk_soft_min_free_bytes": 1, "disk_hard_min_free_bytes": 2})
