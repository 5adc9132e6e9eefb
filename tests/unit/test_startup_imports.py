"""What a freshly started node imports before it answers Raft and gRPC (issue 35, "start in
seconds"): the node's start-up path (``raftwal.node.process``) must not import modules that
only some requests need. Checked in a fresh interpreter, so that nothing imported by other
tests counts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.timing import scaled

# Imported by no start-up path today; a top-level import of any of these fails the test.
NEVER_AT_START = (
    "pyspark",
    "pandas",
    "rpc.shards.store",
    "raftwal.cli.spark",
    "raftwal.cli.demo",
    "spark_connector",
)
# Still imported at start-up (wal_segments.segment and .columnar import pyarrow at module
# level, reached through raftwal.node.metrics -> wal_segments.plane; raft.events imports
# sqlite_utils, which pulls cryptography in through its plugins). Strict xfail: the test
# turns red as soon as one of them is deferred, so that the module moves to NEVER_AT_START.
STILL_AT_START = ("pyarrow", "sqlite_utils")


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


@pytest.mark.xfail(strict=True, reason="issue 35 item 4: pyarrow/sqlite_utils not yet deferred")
@pytest.mark.parametrize("name", STILL_AT_START)
def test_node_start_up_defers_heavy_module(name: str):
    assert _imported_by_node_start((name,)) == []
