"""bench/wal.py's common-rate phase in the report: targets and table rows, from synthetic
reports (no servers)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def wal() -> ModuleType:
    # bench/wal.py imports its sibling `_harness` as a top-level module.
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_wal", BENCH / "wal.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _system(label: str, summary: dict[str, float]) -> dict[str, Any]:
    return {
        "label": label,
        "version": "1",
        "durability": "fsync",
        "error": None,
        "summary": summary,
    }


def _common(p50: float, kept_up: bool = True, acked: float = 30_000.0) -> dict[str, float]:
    return {
        "common_rate_msgs_per_s": 30_000.0,
        "common_rate_p50_ms": p50,
        "common_rate_p99_ms": p50 * 4,
        "common_rate_errors": 0.0 if kept_up else 12.0,
        "common_rate_acked_msgs_per_s": acked,
        "common_rate_kept_up": 1.0 if kept_up else 0.0,
    }


def _report(
    raftwal: dict[str, float], jetstream: dict[str, float], common_rate: float | None
) -> dict[str, Any]:
    base = {
        "small_pn_msgs_per_s": 120_000.0,
        "large_pn_msgs_per_s": 10_000.0,
        "half_load_msgs_per_s": 60_000.0,
        "half_load_p50_ms": 5.0,
        "half_load_p99_ms": 30.0,
    }
    return {
        "settings": {
            "producers": 8,
            "small_batch": 100,
            "large_batch": 10,
            "in_flight": 8,
            "repeats": 1,
            "duration_s": 2.0,
            "common_rate": common_rate,
        },
        "systems": {
            "raftwal": _system("raftwal R3", {**base, **raftwal}),
            "jetstream_sync_always": _system("JetStream R3 sync always", {**base, **jetstream}),
        },
        "not_available": {},
    }


def _common_target(wal: ModuleType, report: dict[str, Any]) -> dict[str, object] | None:
    found = [t for t in wal.targets(report) if "common rate" in str(t["target"])]
    assert len(found) <= 1
    return found[0] if found else None


def _rows(wal: ModuleType, report: dict[str, Any]) -> dict[str, list[str]]:
    _header, rows = wal.table_rows(report)
    return {row[0]: row[1:] for row in rows}


def test_without_the_phase_no_target_and_no_rows(wal: ModuleType) -> None:
    report = _report({}, {}, None)
    assert _common_target(wal, report) is None
    assert any("half load" in str(t["target"]) for t in wal.targets(report))
    assert not [label for label in _rows(wal, report) if "common rate" in label]
    assert not [n for n in wal._notes(report) if "common rate" in n]


def test_common_rate_ratio_and_rows(wal: ModuleType) -> None:
    report = _report(_common(4.0), _common(5.0), 30_000.0)
    target = _common_target(wal, report)
    assert target is not None
    assert target["target"] == (
        "produce p50 <= 1.0x JetStream sync always at a common rate of 30,000 msgs/s"
    )
    assert target["value"] == 0.8
    assert target["met"] is True
    assert target["shown"] == "0.80x"
    rows = _rows(wal, report)
    assert rows["common rate, 100 B x 8 (msgs/s)"] == ["30,000", "30,000", "1.00x"]
    assert rows["produce->ack p50 at the common rate (ms)"] == ["4.00", "5.00", "0.80x"]
    assert rows["produce->ack p99 at the common rate (ms)"] == ["16.00", "20.00", "0.80x"]
    # The half-load rows are still there, unchanged.
    assert rows["produce->ack p50 at half load (ms)"] == ["5.00", "5.00", "1.00x"]

    slower = _report(_common(6.0), _common(5.0), 30_000.0)
    target = _common_target(wal, slower)
    assert target is not None and target["met"] is False and target["value"] == 1.2


def test_a_system_that_falls_behind_gets_a_note_not_a_ratio(wal: ModuleType) -> None:
    report = _report(_common(4.0), _common(900.0, kept_up=False, acked=21_500.0), 30_000.0)
    target = _common_target(wal, report)
    assert target is not None
    assert target["value"] is None and target["met"] is None and target["shown"] == "-"
    assert target["note"] == (
        "JetStream R3 sync always did not keep up with 30,000 msgs/s "
        "(21,500 msgs/s acknowledged, 12 errors)"
    )
    assert "not evaluated" in wal._target_text(target)
    rows = _rows(wal, report)
    assert rows["produce->ack p50 at the common rate (ms)"] == ["4.00", "900.00 (fell behind)", "-"]
    assert target["note"] in wal._notes(report)
    assert "(fell behind)" in wal.render_markdown({**report, "targets": wal.targets(report)})


def test_jetstream_missing_is_a_note(wal: ModuleType) -> None:
    report = _report(_common(4.0), {}, 30_000.0)
    del report["systems"]["jetstream_sync_always"]
    target = _common_target(wal, report)
    assert target is not None and target["value"] is None
    assert target["note"] == "JetStream R3 sync always not measured"


def test_kept_up(wal: ModuleType) -> None:
    def paced(timeline: list[tuple[float, float]], errors: int = 0) -> Any:
        latencies = wal.Latencies(samples_s=[lat for _t, lat in timeline])
        if errors:
            latencies.errors = Counter({"overload": errors})
        return wal.PacedResult(1000.0, 10.0, 30, latencies, 100 * len(timeline), timeline)

    on_time = [(k / 10, 0.01) for k in range(30)]
    assert paced(on_time).kept_up
    assert not paced(on_time[:-1], errors=1).kept_up
    # Every batch acknowledged, but the last one 2 s late: 3,000 messages in 4.9 s.
    late = [(k / 10, 0.01 + k * 2 / 29) for k in range(30)]
    assert not paced(late).kept_up
    assert paced(late).acked_msgs_per_s == pytest.approx(3000 / 4.91)
