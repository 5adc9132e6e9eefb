"""What a freshly started node imports before it answers Raft and gRPC (issue 35, "start in
seconds"): the node's start-up path (``raftwal.node.process``) must not import modules that
only some requests need. Checked in a fresh interpreter, so that nothing imported by other
tests counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.timing import scaled

# Imported by no start-up path; a top-level import of any of these fails the test. pyarrow
# is imported by the sealed-segment readers only (wal_segments.segment's SegmentReader and
# wal_segments.columnar), and the event store creates its tables with plain SQL.
NEVER_AT_START = (
    "pyarrow",
    "sqlite_utils",
    "pyspark",
    "pandas",
    "rpc.shards.store",
    "raftwal.cli.spark",
    "raftwal.cli.demo",
    "spark_connector",
)
# ... nor by the node's command line: `raftwal node` registers none of the other commands,
# whose modules import these (the chaos runner alone took about 1 s of CPU).
NEVER_FOR_THE_NODE_COMMAND = (*NEVER_AT_START, "raftwal.chaos", "raftwal.cli.client", "rich")


def _imported_by_node_start(names: tuple[str, ...]) -> list[str]:
    code = (
        "import json, sys\n"
        "import raftwal.node.process\n"
        f"print(json.dumps([n for n in {list(names)!r} if n in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=scaled(60),
    )
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def test_node_start_up_imports_no_request_only_module():
    assert _imported_by_node_start(NEVER_AT_START) == []


def test_the_node_command_imports_no_request_only_module(tmp_path: Path):
    # The command line `raftwal dev up` starts each node with (raftwal.cli.dev), with a
    # config file that does not exist: it stops at the config load, after the node's whole
    # start-up path (raftwal.node.process) was imported. -X importtime lists every module.
    result = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "raftwal.cli",
            "--log-level",
            "INFO",
            "node",
            "--config",
            str(tmp_path / "missing.toml"),
            "--id",
            "n1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=scaled(60),
    )
    assert result.returncode == 2, result.stderr[-2000:]
    imported = {
        line.rpartition("|")[2].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "raftwal.node.process" in imported
    found = sorted(
        module
        for module in imported
        if any(module == n or module.startswith(f"{n}.") for n in NEVER_FOR_THE_NODE_COMMAND)
    )
    assert found == []
