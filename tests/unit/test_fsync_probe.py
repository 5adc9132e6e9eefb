"""The disk probe behind raftwal_disk_fsync_probe_seconds (the RaftwalSlowFsync alert): one
probe times a real write + fdatasync and keeps one block on disk; a probe that cannot
write counts a failure (the RaftwalDiskProbeFailing alert) and does not raise."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Histogram

from raftwal.node.metrics import FSYNC_LATENCY_BUCKETS_S, FSYNC_PROBE_BYTES, _FsyncProbe


def _metrics() -> SimpleNamespace:
    registry = CollectorRegistry()
    return SimpleNamespace(
        registry=registry,
        fsync_probe=Histogram(
            "probe_seconds", "", buckets=FSYNC_LATENCY_BUCKETS_S, registry=registry
        ),
        fsync_probe_failures=Counter("probe_failures", "", registry=registry),
    )


def test_a_probe_is_timed_and_stays_one_block(tmp_path: Path) -> None:
    metrics = _metrics()
    probe = _FsyncProbe(tmp_path / ".fsync-probe", metrics)  # type: ignore[arg-type]
    for _ in range(3):
        probe.probe_once()
    assert metrics.registry.get_sample_value("probe_seconds_count") == 3
    assert metrics.registry.get_sample_value("probe_seconds_sum") > 0
    assert metrics.registry.get_sample_value("probe_failures_total") == 0
    assert (tmp_path / ".fsync-probe").stat().st_size == FSYNC_PROBE_BYTES


def test_a_failed_probe_is_counted_not_raised(tmp_path: Path) -> None:
    metrics = _metrics()
    probe = _FsyncProbe(tmp_path / "missing-dir" / ".fsync-probe", metrics)  # type: ignore[arg-type]
    probe.probe_once()
    assert metrics.registry.get_sample_value("probe_failures_total") == 1
    assert metrics.registry.get_sample_value("probe_seconds_count") == 0
