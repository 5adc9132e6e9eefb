"""Suite-wide settings that make the tests safe and steady on parallel workers and on slow
machines.

- Ports: every port a test picks (``raftwal.cli.dev.free_ports``) comes from a range of
  this worker's own (``RAFTWAL_PORT_RANGE``), below the kernel's ephemeral range, so that
  neither another worker's picks nor a socket bound to port 0 nor an outgoing connection
  takes a port between the pick and the node's bind.
- Time: pytest-timeout's per-test limit (pyproject's ``timeout`` and every
  ``@pytest.mark.timeout``) is stretched by ``RAFTWAL_TEST_TIME_SCALE`` like every wait in
  the tests (``tests/timing.py``).
- Order: test files run heaviest directories first, so that ``--dist loadfile`` does not
  leave one worker with a long cluster module at the end while the others are idle.
- Nodes: a worker forks the nodes of its local clusters from a fork server
  (``raftwal.cli.forkserver``) that imported a node's modules once: a node then starts
  with about 0.2 CPU-seconds instead of 1.1, and the suite starts about 300 of them.
  ``RAFTWAL_TEST_FORK_SERVER=0`` starts each in a fresh interpreter instead.
- Spark: the files under ``tests/spark`` are one unit of work for ``--dist loadfile``, run
  on one worker in their serial order. Some of them start and stop a SparkSession of
  their own, which stops the worker's shared one (``getOrCreate`` hands back the same
  JVM context): spread over workers, a later file then found a dead session.
- Spark's class archive: ``./run test`` builds it (``scripts/spark-class-archive.py``)
  while the tests run and names, in ``RAFTWAL_TEST_SPARK_JVM_OPTIONS``, the file its JVM
  options will appear in. On parallel workers, the files that mark tests ``spark`` (the
  Spark unit, the demo, the docs' snippets, the short chaos run) go out once that file
  exists, the others meanwhile; a test marked ``spark`` also waits for it before its first
  JVM starts (bounded: without it a JVM only starts slower).
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from raftwal.cli import dev
from raftwal.cli.dev import PORT_RANGE_ENV
from tests.timing import SCALE, scaled

#: Worker k of pytest-xdist gets ports PORT_BASE + k * PORT_SPAN .. + PORT_SPAN - 1 (modulo
#: PORT_SLOTS); the whole span stays below the ephemeral range (32768 on Linux) and leaves
#: 32000-32767 to tests that need a range of their own (tests/unit/test_dev_ports.py).
PORT_BASE = 20000
PORT_SPAN = 1000
PORT_SLOTS = 12
PORT_SLOT_ENV = "RAFTWAL_TEST_PORT_SLOT"

#: Raft's disk reserve in the tests' nodes (see pytest_configure).
RESERVE_ENV = "RAFTWAL_RAFT_RESERVE_BYTES"
RESERVE_TEST_BYTES = 1 << 20

#: "0": start every node in a fresh interpreter instead of forking it from the fork server.
FORK_SERVER_ENV = "RAFTWAL_TEST_FORK_SERVER"

#: Directories by how long their files take, heaviest first (the order files are handed to
#: workers in); a directory not named here comes last.
DIRECTORY_ORDER = ("spark", "cluster", "chaos", "security", "raft", "wal", "sdk", "sim", "unit")

#: Files that take 40 s or more outside the directories handed out first, measured with
#: ``./run test --junitxml=FILE``: they go out before the heaviest directory, so that none
#: of them starts near the end of a run while the other workers run out of files (the
#: SDK's long-lived loops once started 90 s before the end and ran 88 s of it alone).
HEAVY_FILES = (
    "tests/sdk/test_long_lived_loops.py",
    "tests/raft/test_raft_prevote.py",
)

#: The file ``./run test`` writes the Spark JVM options of its class archive to, once built
#: (empty: none could be built).
SPARK_JVM_OPTIONS_ENV = "RAFTWAL_TEST_SPARK_JVM_OPTIONS"

#: How long a Spark test waits for that file. The archive takes about 80 s on a 2-core
#: machine; past this the JVMs start without it (slower, the same results), well inside
#: the per-test timeout that also covers this wait.
SPARK_JVM_OPTIONS_WAIT_S = 180.0


def _worker_index() -> int:
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(match.group(1)) if match else 0


def pytest_configure(config: pytest.Config) -> None:
    # Two suites on one machine (two checkouts, or a suite beside someone's hunt for a
    # flake) give each other room with RAFTWAL_TEST_PORT_SLOT: the first slot this run's
    # workers take (default 0), so that their ranges do not overlap.
    first_slot = os.environ.get(PORT_SLOT_ENV, "0")
    if not first_slot.isdigit():
        raise pytest.UsageError(
            f"invalid {PORT_SLOT_ENV} ({first_slot!r}; expected 0..{PORT_SLOTS - 1})"
        )
    slot = (int(first_slot) + _worker_index()) % PORT_SLOTS
    low = PORT_BASE + slot * PORT_SPAN
    # Node processes and CLI subprocesses inherit it, so their picks stay in the range too.
    os.environ[PORT_RANGE_ENV] = f"{low}-{low + PORT_SPAN - 1}"
    # Raft's disk reserve (raft/reserve.py) is preallocated in every node's data dir: 64 MiB
    # by default, which over the suite's ~300 nodes (kept by pytest's tmp_path retention)
    # would hold tens of GB of disk. The tests of the reserve set their own size.
    os.environ.setdefault(RESERVE_ENV, str(RESERVE_TEST_BYTES))
    # xdist's controller runs no test: only the workers (or a run without xdist) need one.
    global _runs_tests
    runs_tests = hasattr(config, "workerinput") or not config.getoption("numprocesses", None)
    _runs_tests = runs_tests
    if runs_tests and os.environ.get(FORK_SERVER_ENV, "1") != "0":
        dev.use_fork_server()


def pytest_unconfigure(config: pytest.Config) -> None:
    # Also stops any node a failed teardown left running.
    dev.stop_fork_server()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # pytest-timeout has read pyproject's limit in its pytest_configure by now.
    env_timeout = getattr(session.config, "_env_timeout", None)
    if env_timeout:
        session.config._env_timeout = env_timeout * SCALE  # type: ignore[attr-defined]


@functools.cache
def _spark_jvm_options() -> str:
    """Wait for the class archive's JVM options, once per worker; put them in
    SPARK_SUBMIT_OPTS, which every Spark JVM this worker or its children start reads."""
    path = os.environ.get(SPARK_JVM_OPTIONS_ENV)
    if not path:
        return ""
    deadline = time.monotonic() + scaled(SPARK_JVM_OPTIONS_WAIT_S)
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            warnings.warn(
                f"no Spark class archive within {scaled(SPARK_JVM_OPTIONS_WAIT_S):.0f} s "
                f"({path} absent): Spark JVMs start without one",
                stacklevel=1,
            )
            return ""
        time.sleep(0.5)
    options = Path(path).read_text().strip()
    if options:
        current = os.environ.get("SPARK_SUBMIT_OPTS", "")
        os.environ["SPARK_SUBMIT_OPTS"] = f"{current} {options}".strip()
    return options


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the item's fixtures, which may start the worker's shared SparkSession.
    if item.get_closest_marker("spark") is not None:
        _spark_jvm_options()


#: A file to append one JSON line per test to (worker, node id, start and end on the wall
#: clock): where each worker spent the run, to balance the order files go out in.
TIMELINE_ENV = "RAFTWAL_TEST_TIMELINE"

_test_started: dict[str, float] = {}
#: False in xdist's controller, which sees every worker's tests reported too.
_runs_tests = True


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if _runs_tests and os.environ.get(TIMELINE_ENV):
        _test_started[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    path = os.environ.get(TIMELINE_ENV)
    started = _test_started.pop(nodeid, None)
    if not path or started is None:
        return
    line = json.dumps(
        {
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
            "test": nodeid,
            "start": round(started, 3),
            "end": round(time.time(), 3),
        }
    )
    # One short line per O_APPEND write: workers' lines do not interleave.
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


#: What marks a test file as one that starts Spark JVMs, for the scheduler (which sees file
#: names, not markers).
SPARK_MARK = "mark.spark"

#: Test files under this directory form one work unit on parallel workers (see above).
SPARK_DIR = "tests/spark/"


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile``, with every Spark file in one work unit; other modes untouched."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    started = time.monotonic()
    root = Path(str(config.rootpath))

    def archive_settled() -> bool:
        path = os.environ.get(SPARK_JVM_OPTIONS_ENV)
        return (
            not path
            or os.path.exists(path)
            or time.monotonic() - started >= scaled(SPARK_JVM_OPTIONS_WAIT_S)
        )

    @functools.cache
    def starts_spark(scope: str) -> bool:
        if scope == SPARK_DIR:
            return True
        try:
            return SPARK_MARK in (root / scope).read_text(encoding="utf-8")
        except (OSError, ValueError):
            return False

    class SparkTogetherScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SPARK_DIR):
                return SPARK_DIR
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # While the class archive builds, files that start Spark JVMs keep their place
            # in line and the first other file goes out: their tests would otherwise hold
            # a worker idle until the archive is there.
            queue = self.workqueue
            if not archive_settled():
                other = next((scope for scope in queue if not starts_spark(scope)), None)
                if other is not None:
                    queue.move_to_end(other, last=False)
            super()._assign_work_unit(node)

    return SparkTogetherScheduling(config, log)  # type: ignore[arg-type]


def _directory_rank(item: pytest.Item) -> float:
    if item.nodeid.split("::")[0] in HEAVY_FILES:
        return 0.5  # after the Spark unit (which waits for its archive), before the rest
    parts = item.nodeid.split("/")
    name = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return DIRECTORY_ORDER.index(name) if name in DIRECTORY_ORDER else len(DIRECTORY_ORDER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: the files of one directory, and the tests of one file, keep their order.
    items.sort(key=_directory_rank)
    if SCALE != 1:
        for item in items:
            marker = item.get_closest_marker("timeout")
            if marker is not None and marker.args:
                item.add_marker(pytest.mark.timeout(marker.args[0] * SCALE), append=False)
