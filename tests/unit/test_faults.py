"""The fault injector (`raftwal.node.faults`): refused without RAFTWAL_ENABLE_FAULTS=1, rules
validated with what was got and what was expected, re-read from the file while running so a
test switches faults on and off, filtered by node and subject, and routed to the fault
points of both planes."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raft import _faults as raft_faults
from raftwal.node import faults
from raftwal.node.config import ConfigError
from wal_segments import faults as wal_faults


@pytest.fixture(autouse=True)
def no_faults_after() -> Iterator[None]:
    yield
    faults.install(None)


def write_rules(path: Path, rules: list[dict[str, object]]) -> None:
    """Atomically, as the module doc asks tests to do."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"faults": rules}))
    os.replace(temporary, path)
    # The injector checks the file at most every CHECK_INTERVAL_S.
    time.sleep(faults.CHECK_INTERVAL_S * 1.5)


def test_a_faults_file_without_the_enable_flag_is_refused(tmp_path: Path) -> None:
    environ = {faults.FILE_ENV: str(tmp_path / "faults.json")}
    with pytest.raises(ConfigError, match="RAFTWAL_ENABLE_FAULTS is ''"):
        faults.install_from_environment("n1", environ)
    with pytest.raises(ConfigError, match="RAFTWAL_ENABLE_FAULTS is 'yes'"):
        faults.install_from_environment("n1", {**environ, faults.ENABLE_ENV: "yes"})
    assert faults.active() is None
    assert faults.install_from_environment("n1", {faults.ENABLE_ENV: "1"}) is None
    assert faults.active() is None


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"point": "wal.apend", "action": "error"}, "invalid fault point ('wal.apend'"),
        ({"point": "wal.append", "action": "drop"}, "invalid action for wal.append ('drop'"),
        ({"point": "replication.send", "action": "error"}, "invalid action for replication"),
        ({"point": "wal.fsync", "action": "error", "errno": "ENOPE"}, "invalid errno ('ENOPE'"),
        ({"point": "wal.fsync", "action": "delay", "delay_ms": 0}, "invalid delay_ms (0;"),
        ({"point": "wal.fsync", "action": "delay", "delay_ms": True}, "invalid delay_ms (True;"),
        ({"point": "wal.fsync", "action": "error", "probability": 0}, "invalid probability (0;"),
        ({"point": "wal.fsync", "action": "error", "nodes": "n1"}, "invalid nodes ('n1';"),
        ({"point": "wal.fsync", "action": "error", "when": 1}, "invalid fault rule keys"),
        ("wal.fsync", "invalid fault rule ('wal.fsync'; expected an object)"),
    ],
)
def test_invalid_rules_say_what_was_got_and_expected(rule: object, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        faults.parse_rules({"faults": [rule]})
    assert message in str(raised.value)


def test_rules_are_switched_at_runtime_and_reach_both_planes(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    injector = faults.install_from_environment(
        "n2", {faults.FILE_ENV: str(path), faults.ENABLE_ENV: "1"}
    )
    assert injector is not None and faults.active() is injector
    # No file yet: no faults.
    wal_faults.fault("wal.append", "/data/wal/p_0/1.seg")
    raft_faults.io_fault("raft.journal.fsync", "/data/raft/journal.log")

    write_rules(
        path,
        [
            {"point": "wal.append", "action": "error", "errno": "ENOSPC", "match": "/p_0/"},
            {"point": "raft.journal.fsync", "action": "error", "nodes": ["n2"]},
            {"point": "wal.fsync", "action": "error", "nodes": ["n1"]},
        ],
    )
    with pytest.raises(OSError) as raised:
        wal_faults.fault("wal.append", "/data/wal/p_0/1.seg")
    assert raised.value.errno == errno.ENOSPC
    assert "injected fault at wal.append" in str(raised.value)
    wal_faults.fault("wal.append", "/data/wal/p_1/1.seg")  # another pchannel: no match
    wal_faults.fault("wal.fsync", "/data/wal/p_0/1.seg")  # a rule for another node
    with pytest.raises(OSError) as raised:
        raft_faults.io_fault("raft.journal.fsync", "/data/raft/journal.log")
    assert raised.value.errno == errno.EIO

    # An invalid file keeps the previous rules (and says so in the log).
    path.write_text("{not json")
    time.sleep(faults.CHECK_INTERVAL_S * 1.5)
    with pytest.raises(OSError):
        wal_faults.fault("wal.append", "/data/wal/p_0/1.seg")

    write_rules(path, [{"point": "wal.fsync", "action": "delay", "delay_ms": 80}])
    wal_faults.fault("wal.append", "/data/wal/p_0/1.seg")
    started = time.monotonic()
    wal_faults.fault("wal.fsync", "/data/wal/p_0/1.seg")
    assert time.monotonic() - started >= 0.08

    path.unlink()
    time.sleep(faults.CHECK_INTERVAL_S * 1.5)
    started = time.monotonic()
    wal_faults.fault("wal.fsync", "/data/wal/p_0/1.seg")
    assert time.monotonic() - started < 0.05


async def test_network_points_drop_a_fraction(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    injector = faults.FaultInjector(path, "n1", seed=7)
    write_rules(path, [{"point": "replication.send", "action": "drop", "probability": 0.25}])
    dropped = [await injector.network_fault("replication.send", "p_0") for _ in range(2000)]
    assert 350 < sum(dropped) < 650
    assert injector.injected == {"replication.send:drop": sum(dropped)}
