"""What a node leaves on disk and in its log, as another local user or an operator sees it.

- Everything a node writes (segments, catalog.db, events.db, the Raft journal, snapshots,
  SQLite's side files, its log) is 0600 in 0700 directories; an existing data directory
  open to the group or others is reported at start, as PostgreSQL does.
- A SIGTERM is a clean stop, also with client streams open (a lease keeper, a consumer, a
  watch, a producer): exit code 0, no ERROR, no traceback, no "never retrieved" task.
- `raftwal dev down` returns only once every node process has exited.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftwal.cli import dev
from rpc.client import CoordinatorClient
from rpc.streaming_client import Consumer, Producer, StreamingClient
from tests.timing import scaled

pytestmark = pytest.mark.cluster

RAFTWAL = str(Path(sys.executable).with_name("raftwal"))
STOP_TIMEOUT_S = 15.0
BAD_LOG_MARKERS = ("ERROR", "CRITICAL", "Traceback", "never retrieved")


def _modes(root: Path) -> list[tuple[str, str]]:
    """(path, mode) of everything under `root` that is not 0600 (files) / 0700 (dirs)."""
    wrong = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        expected = 0o700 if path.is_dir() else 0o600
        if mode != expected:
            wrong.append((str(path.relative_to(root.parent)), f"{mode:04o}"))
    return wrong


async def _traffic(cluster: dev.LocalCluster) -> None:
    async with StreamingClient(cluster.endpoints) as client:
        await client.coordinator.create_channels(1, prefix="hyg")
        await client.coordinator.create_vchannel("hygv", "hyg_0")
        async with Producer(client) as producer:
            await producer.send_batch("hygv", [b"m%d" % i for i in range(200)])


def test_everything_a_node_writes_is_its_own(tmp_path: Path) -> None:
    local = dev.up(tmp_path / "modes", 3, timeout_s=60)
    try:
        asyncio.run(_traffic(local))
        for node in local.config.nodes:
            assert not _modes(node.data_dir), _modes(node.data_dir)
            log_mode = stat.S_IMODE((local.directory / f"{node.id}.log").stat().st_mode)
            assert log_mode == 0o600, f"{node.id}.log is {log_mode:04o}"
        assert stat.S_IMODE(local.directory.stat().st_mode) == 0o700
    finally:
        local.stop_all()


def test_an_open_data_dir_is_reported_at_start(tmp_path: Path) -> None:
    directory = (tmp_path / "open").resolve()
    config = dev.make_config(directory, 1)
    config.nodes[0].data_dir.mkdir(parents=True, mode=0o755)
    os.chmod(config.nodes[0].data_dir, 0o755)
    local = dev.up(directory, 1, timeout_s=60, config=config)
    try:
        text = (directory / "n1.log").read_text()
    finally:
        local.stop_all()
    assert "has mode 0755" in text and "chmod 700" in text, text[-2000:]


def _stop_streams_then_sigterm(local: dev.LocalCluster) -> dict[str, int | None]:
    async def run() -> dict[str, int | None]:
        client = CoordinatorClient(local.endpoints)
        streaming = StreamingClient(client)
        lease = await client.grant_lease(10_000, holder="hygiene")
        keeper = await client.lease_keeper(lease.lease_id, interval_s=0.2).start()
        events = asyncio.create_task(_drain(client.watch_events(from_revision=1)))
        consumer = Consumer(streaming, "hygv")
        consuming = asyncio.create_task(_drain(consumer))
        producer = Producer(streaming)
        await producer.send("hygv", b"before stop")
        await asyncio.sleep(1.0)  # every stream open and in use
        codes: dict[str, int | None] = {}
        for node in local.config.nodes:
            process = local.processes[node.id]
            assert process is not None
            process.send_signal(signal.SIGTERM)
        for node in local.config.nodes:
            process = local.processes[node.id]
            assert process is not None
            try:
                codes[node.id] = await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                codes[node.id] = None
        for task in (events, consuming):
            task.cancel()
        await asyncio.gather(events, consuming, return_exceptions=True)
        await keeper.stop()
        await producer.close(timeout_s=1)
        await consumer.close()
        await streaming.close()
        await client.close()
        return codes

    return asyncio.run(run())


async def _drain(iterator) -> None:
    async for _ in iterator:
        pass


def test_sigterm_is_a_clean_stop_with_streams_open(tmp_path: Path) -> None:
    local = dev.up(tmp_path / "stop", 3, timeout_s=60)
    try:
        asyncio.run(_traffic(local))
        marks = {n.id: (local.directory / f"{n.id}.log").stat().st_size for n in local.config.nodes}
        codes = _stop_streams_then_sigterm(local)
    finally:
        local.stop_all()
    assert codes == {n.id: 0 for n in local.config.nodes}, codes
    for node in local.config.nodes:
        with open(local.directory / f"{node.id}.log") as log:
            log.seek(marks[node.id])
            tail = log.read()
        assert f"node {node.id} stopping" in tail
        bad = [line for line in tail.splitlines() if any(m in line for m in BAD_LOG_MARKERS)]
        assert not bad, f"{node.id}: {bad[:5]}"


def test_dev_down_returns_once_every_node_has_exited(tmp_path: Path) -> None:
    directory = tmp_path / "down"
    subprocess.run([RAFTWAL, "dev", "up", "--dir", str(directory)], check=True, timeout=scaled(120))
    pids = [m["pid"] for m in json.loads((directory / dev.CLUSTER_FILE).read_text())["nodes"]]
    # One node ignores the SIGTERM for now (stopped): down must wait, SIGKILL it, and still
    # return only once it is gone.
    os.kill(pids[0], signal.SIGSTOP)
    started = time.monotonic()
    assert dev.down(directory, grace_s=1.0) == pids
    took = time.monotonic() - started
    alive = [pid for pid in pids if dev._alive(pid)]
    assert not alive, f"dev down returned with {alive} still running"
    assert took < 10.0
