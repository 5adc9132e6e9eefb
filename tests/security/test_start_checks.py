"""What a node says or refuses at start (issue 40, items 5 and 7), on real processes.

- A cluster secret_file readable by group or others is warned about in the node's log
  (the secret guards the Raft port; the tokens file already got such a warning).
- ``RAFTWAL_RAFT_MAX_TIMEOUT_MS=4000``, a plausible setting, used to stop every node with a
  ValueError traceback about ``connection_timeout_s``; the connection timeout now follows
  the election timeout, and the node starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftwal.cli import dev
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import wait_nodes_up

pytestmark = pytest.mark.cluster


def test_a_secret_file_open_to_others_is_warned_about_at_start(tmp_path: Path) -> None:
    directory = (tmp_path / "open-secret").resolve()
    directory.mkdir(mode=0o700)
    secret = directory / dev.SECRET_FILE
    secret.write_text("0123456789abcdef" * 4)
    secret.chmod(0o644)
    local = dev.up(directory, 1, timeout_s=60)
    try:
        text = (directory / "n1.log").read_text()
    finally:
        local.stop_all()
    assert "secret_file" in text and "mode 0644" in text, text[-2000:]
    assert "0123456789abcdef" not in text


def test_a_long_election_timeout_starts(tmp_path: Path) -> None:
    env = {**os.environ, "RAFTWAL_RAFT_MAX_TIMEOUT_MS": "4000"}
    local = dev.up(tmp_path / "slow-raft", 1, timeout_s=60, env=env)
    client = Api(local.endpoints)
    try:
        wait_nodes_up(client, 1)
        assert client.status().nodes
    finally:
        client.close()
        local.stop_all()
    text = (local.directory / "n1.log").read_text()
    assert "Traceback" not in text, text[-2000:]
