"""The alert rules in deploy/prometheus/ are valid and behave as their unit tests say:
`promtool check rules` on alerts.yml and `promtool test rules` on rules_test.yml (which
covers at least the no-leader and under-replicated alerts). promtool comes from Debian's
`prometheus` package (scripts/install-promtool.sh, which `./run test` calls); without it
these tests fail rather than skip, so CI cannot pass with the rules unchecked.

The check that every metric the rules and the dashboard name exists on a live node is
tests/cluster/test_deploy_metrics.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "raftwal.json"
PROMTOOL_TIMEOUT_S = scaled(60)


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: run scripts/install-promtool.sh (Debian's prometheus)"
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )


def test_promtool_check_rules_is_clean() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rule_unit_tests_pass() -> None:
    text = RULE_TESTS.read_text()
    for alert in ("RaftwalNoLeader", "RaftwalPChannelUnderReplicated"):
        assert f"alertname: {alert}" in text, f"rules_test.yml does not test {alert}"
    result = run_promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: with the no-leader alert's `for` stretched past the test's
    window, the expected alert does not fire and promtool says so."""
    rules = RULES.read_text()
    broken = rules.replace(
        "expr: raftwal_raft_has_leader == 0\n        for: 1m",
        "expr: raftwal_raft_has_leader == 0\n        for: 10m",
    )
    assert broken != rules
    (tmp_path / "alerts.yml").write_text(broken)
    (tmp_path / "rules_test.yml").write_text(RULE_TESTS.read_text())
    result = subprocess.run(
        [promtool(), "test", "rules", "rules_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )
    assert result.returncode != 0
    assert "RaftwalNoLeader" in result.stdout + result.stderr


def test_the_dashboard_is_grafana_json_with_the_promised_rows() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert {
        "Raft",
        "Coordination",
        "WAL",
        "Replication, retention and disk",
        "Subscriptions",
    } <= rows
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"
