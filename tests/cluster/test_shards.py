"""Exactly-once consumer shards (``rpc.shards``, ``raftwal consumer run``) on a real
three-node cluster, with real SQLite files and real consumer processes.

- A consumer process is killed with SIGKILL at random points (seed printed) while messages
  are produced, once with its SQLite files deleted as well: every acknowledged message
  takes effect exactly once (the per-key counters equal the messages per key, every LSN is
  applied once), rebuilt from the recovery log where the disk was lost.
- A zombie: a consumer is SIGSTOPped, its shard moves to another process on another disk
  (which rebuilds the store from the recovery log), and after SIGCONT the zombie's next
  transaction is refused; the recovery log never has a record of the old token after the
  new owner's fence.
- In process: an older token's transaction is refused after a newer owner fenced the log
  (the store stays as it was), and bad requests get typed errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftwal.cli import dev
from rpc.client import ChannelFencedError, NotFoundError
from rpc.shards.store import decode_record
from rpc.shards_client import (
    ConsumerService,
    RecoveryLog,
    Shard,
    recovery_names,
    shard_store_path,
)
from rpc.streaming_client import Producer, StreamingClient, SubscriptionMember
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.shard_app import Counters
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.processes import start_in_own_session
from tests.timing import scaled

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RAFTWAL = str(Path(sys.executable).with_name("raftwal"))
TIMEOUT_S = scaled(90.0)
KEYS = [f"k{i}" for i in range(10)]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    settings = dict(os.environ)
    settings["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(tmp_path_factory.mktemp("shards"), settings) as running:
        yield running


async def _produce(client: StreamingClient, vchannel: str, count: int, rng: random.Random):
    """Send `count` messages `<key>:<i>`; the acknowledged (lsn, key) pairs."""
    payloads = [f"{rng.choice(KEYS)}:{i}".encode() for i in range(count)]
    async with Producer(client, retry_timeout_s=TIMEOUT_S) as producer:
        positions = await asyncio.gather(*(producer.send(vchannel, p) for p in payloads))
    return [
        (pos.lsn, p.split(b":")[0].decode()) for pos, p in zip(positions, payloads, strict=True)
    ]


def _read_store(path: Path) -> tuple[dict[str, int], list[int]] | None:
    """(counters, applied lsns) of a shard's SQLite file, read-only (None before it has
    its tables)."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=scaled(5))
        try:
            counters = dict(conn.execute("SELECT key, n FROM counters"))
            applied = [row[0] for row in conn.execute("SELECT lsn FROM applied ORDER BY lsn")]
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        # Not created yet, or being created by the consumer at this moment.
        return None
    return counters, applied


def _expected(acked: list[tuple[int, str]]) -> dict[str, int]:
    return dict(Counter(key for _, key in acked))


async def _wait_applied(
    path: Path,
    count: int,
    process: subprocess.Popen | None = None,
    service_task: asyncio.Task[None] | None = None,
) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    seen = None
    while time.monotonic() < deadline:
        seen = _read_store(path)
        if seen is not None and len(seen[1]) >= count:
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"consumer exited with {process.returncode} early")
        if service_task is not None and service_task.done():
            raise AssertionError(f"the consumer service ended early: {service_task.exception()!r}")
        await asyncio.sleep(0.2)
    raise AssertionError(
        f"{path} applied {len(seen[1]) if seen else 0} of {count} within {TIMEOUT_S} s"
    )


async def _wait_log(path: Path, text: str, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count(text) >= count:
            return
        if process.poll() is not None:
            raise AssertionError(f"consumer exited with {process.returncode}: {path.read_text()}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} has not {count} x {text!r} within {TIMEOUT_S} s")


def _consumer(
    tmp: Path, subscription: str, member: str, data_dir: Path, endpoints, pause_file: str = ""
) -> subprocess.Popen:
    environ = dict(os.environ)
    environ["PYTHONPATH"] = str(ROOT)
    environ["SHARD_APP_PAUSE_FILE"] = pause_file
    return start_in_own_session(
        [
            RAFTWAL,
            "consumer",
            "run",
            "tests.cluster.shard_app:Counters",
            "--subscription",
            subscription,
            "--member-id",
            member,
            "--data-dir",
            str(data_dir),
            "--lease-ttl-ms",
            "2000",
            "--endpoints",
            ",".join(endpoints),
            "--max-batch-messages",
            "200",
        ],
        cwd=tmp,
        env=environ,
        log_path=tmp / f"{member}.log",
    )


def _stop(process: subprocess.Popen, signum: int = signal.SIGTERM, timeout_s: float = 30) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signum)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=scaled(10))
        raise


def _check_exactly_once(path: Path, acked: list[tuple[int, str]]) -> None:
    found = _read_store(path)
    assert found is not None, f"{path} has no store"
    counters, applied = found
    assert applied == sorted(lsn for lsn, _ in acked), "every acknowledged lsn applied once"
    assert counters == _expected(acked)


def test_exactly_once_across_kill9_and_a_lost_disk(env, tmp_path: Path) -> None:
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "ek", {"ek_a": 0, "ek_b": 0})
    wait_assigned(api_client, pchannel)
    seed = int(os.environ.get("SHARD_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    paths = {v: shard_store_path(data_dir, "ek", v) for v in ("ek_a", "ek_b")}

    async def scenario() -> None:
        acked: dict[str, list[tuple[int, str]]] = {"ek_a": [], "ek_b": []}
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("ek", ["ek_a", "ek_b"])
            for round_number in range(3):
                process = _consumer(tmp_path, "ek", f"c{round_number}", data_dir, cluster.endpoints)
                sending = asyncio.gather(
                    *(_produce(client, vchannel, 300, rng) for vchannel in acked)
                )
                # Killed at a random point once it applies: mid-transaction, between the
                # recovery-log append and the SQLite commit, or idle.
                found = _read_store(paths["ek_a"])
                before = len(found[1]) if found else 0
                await _wait_applied(paths["ek_a"], before + rng.randint(1, 300), process)
                await asyncio.sleep(rng.uniform(0.0, 0.6))
                _stop(process, signal.SIGKILL)
                for vchannel, sent in zip(acked, await sending, strict=True):
                    acked[vchannel] += sent
                found = _read_store(paths["ek_a"])
                print(f"round {round_number}: killed at {len(found[1]) if found else 0} applied")
                if round_number == 1:
                    # The disk is lost: the next owner rebuilds from the recovery log.
                    for path in paths.values():
                        for suffix in ("", "-wal", "-shm"):
                            Path(f"{path}{suffix}").unlink(missing_ok=True)
            final = _consumer(tmp_path, "ek", "final", data_dir, cluster.endpoints)
            try:
                # Both shards taken (so SIGTERM meets a running consumer), then caught up.
                await _wait_log(tmp_path / "final.log", "RUNNING", 2, final)
                for vchannel, path in paths.items():
                    await _wait_applied(path, len(acked[vchannel]), final)
            except BaseException:
                _stop(final, signal.SIGKILL)
                raise
            assert _stop(final) == 0, (tmp_path / "final.log").read_text()[-3000:]
            for vchannel, path in paths.items():
                _check_exactly_once(path, acked[vchannel])
        log_text = (tmp_path / "final.log").read_text()
        assert "stopped" in log_text
        print(log_text[-2000:])
        # `raftwal shard list`: after the clean stop the shards are unassigned and the
        # positions in Raft caught up with the stores.
        listed = subprocess.run(
            [
                RAFTWAL,
                "shard",
                "list",
                "--subscription",
                "ek",
                "--json",
                "--endpoints",
                ",".join(cluster.endpoints),
            ],
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        assert listed.returncode == 0, listed.stderr
        rows = {r["vchannel"]: r for r in map(json.loads, listed.stdout.splitlines())}
        for vchannel, sent in acked.items():
            assert rows[vchannel]["state"] == "UNASSIGNED"
            assert rows[vchannel]["position_lsn"] == max(lsn for lsn, _ in sent), (rows, log_text)
            assert rows[vchannel]["recovery_log"] == f"ek.{vchannel}.rlog"
        rebuilt = (tmp_path / "c2.log").read_text()
        # The owner after the lost disk rebuilt its stores from the recovery log.
        assert "replayed 0 records" not in rebuilt.split("RUNNING", 1)[-1].splitlines()[0], rebuilt

    asyncio.run(scenario())


def test_a_rebalance_under_a_running_shard_does_not_stop_the_consumer(env, tmp_path: Path) -> None:
    """A member's generation moves when another member joins or leaves. A shard that
    commits its position with the generation before gets CHANNEL_FENCED; the service
    takes the shard again under the current generation (it still holds it), rather than
    the whole consumer exiting "fenced". The poll is long (5 s), so the shard's generation
    is almost always stale when it commits right after the rebalance."""
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "rb", {"rb_a": 0, "rb_b": 0})
    wait_assigned(api_client, pchannel)
    rng = random.Random(13)
    data_dir = tmp_path / "data"
    paths = {v: shard_store_path(data_dir, "rb", v) for v in ("rb_a", "rb_b")}

    async def generation_of(client: StreamingClient, member_id: str) -> int:
        described = await client.coordinator.describe_subscription("rb")
        member = described.subscription.members.get(member_id)
        return member.generation if member is not None else 0

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("rb", ["rb_a", "rb_b"])
            service = ConsumerService(
                client,
                Counters(),
                "rb",
                member_id="c1",
                data_dir=data_dir,
                poll_s=scaled(5),
                commit_interval_ms=50,
            )
            stop = asyncio.Event()
            running = asyncio.create_task(service.run(stop))
            try:
                acked = {v: await _produce(client, v, 100, rng) for v in paths}
                for vchannel, path in paths.items():
                    await _wait_applied(path, len(acked[vchannel]))
                before = await generation_of(client, "c1")
                # c2 joins (it takes a vchannel from c1) and leaves (c1 gets it back).
                async with SubscriptionMember(client, "rb", "c2", lease_ttl_ms=10_000) as other:
                    await other.wait_assignment(timeout_s=TIMEOUT_S)
                assert await generation_of(client, "c1") > before
                # The first round is applied, then its position commit is fenced; the
                # second is applied only if the shard was taken again.
                for _ in range(2):
                    for vchannel in paths:
                        acked[vchannel] += await _produce(client, vchannel, 100, rng)
                    for vchannel, path in paths.items():
                        await _wait_applied(path, len(acked[vchannel]), service_task=running)
            finally:
                stop.set()
                await asyncio.wait_for(running, TIMEOUT_S)
            for vchannel, path in paths.items():
                _check_exactly_once(path, acked[vchannel])

    asyncio.run(scenario())


def test_a_sigstopped_zombie_never_commits(env, tmp_path: Path) -> None:
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "zs", {"zs_v": 0})
    wait_assigned(api_client, pchannel)
    rng = random.Random(7)
    path_a = shard_store_path(tmp_path / "a", "zs", "zs_v")
    path_b = shard_store_path(tmp_path / "b", "zs", "zs_v")

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("zs", ["zs_v"])
            pause = tmp_path / "pause"
            zombie = _consumer(
                tmp_path, "zs", "za", tmp_path / "a", cluster.endpoints, pause_file=str(pause)
            )
            successor = None
            try:
                acked = await _produce(client, "zs_v", 400, rng)
                await _wait_applied(path_a, len(acked), zombie)
                # The next transaction pauses inside consume(): SIGSTOP it there, with the
                # SQLite transaction open.
                pause.write_text("pause")
                acked += await _produce(client, "zs_v", 300, rng)
                deadline = time.monotonic() + TIMEOUT_S
                while not Path(f"{pause}.entered").exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                os.killpg(zombie.pid, signal.SIGSTOP)
                assert Path(f"{pause}.entered").exists()
                # Another process on another disk takes the shard once the zombie's lease
                # ended; it rebuilds the store from the recovery log and goes on.
                successor = _consumer(tmp_path, "zs", "zb", tmp_path / "b", cluster.endpoints)
                await _wait_applied(path_b, len(acked), successor)
                os.killpg(zombie.pid, signal.SIGCONT)
                # Resumed, the zombie finishes consume() and tries to commit: refused.
                assert await asyncio.to_thread(zombie.wait, TIMEOUT_S) == 1
                zombie_log = (tmp_path / "za.log").read_text()
                assert "FENCED" in zombie_log and "another owner took the shard" in zombie_log, (
                    zombie_log[-3000:]
                )
                print("zombie said:", zombie_log.strip().splitlines()[-1])
                print("zombie shard:", [x for x in zombie_log.splitlines() if "FENCED" in x])
                found = _read_store(path_a)
                assert found is not None and sum(found[0].values()) == 400
                assert found[1] == sorted(lsn for lsn, _ in acked[:400])
                acked += await _produce(client, "zs_v", 100, rng)
                await _wait_applied(path_b, len(acked), successor)
                _check_exactly_once(path_b, acked)
                # The recovery log: tokens never go down, and nothing of the zombie's
                # token follows the successor's fence.
                rlog_p, rlog_v = recovery_names("zs", "zs_v")
                rlog = RecoveryLog(client, rlog_p, rlog_v)
                last_lsn, _ = await rlog.tail()
                tokens = [
                    decode_record(entry.payload).token
                    async for entry in rlog.read(0, last_lsn)
                    if entry.vchannel == rlog_v
                ]
                assert tokens == sorted(tokens) and len(set(tokens)) == 2, tokens
            finally:
                if zombie.poll() is None:
                    os.killpg(zombie.pid, signal.SIGCONT)
                    _stop(zombie, signal.SIGKILL)
                if successor is not None:
                    assert _stop(successor) == 0

    asyncio.run(scenario())


def test_an_older_token_cannot_commit_after_a_newer_owner_fenced(env, tmp_path: Path) -> None:
    cluster, api_client = env
    (pchannel,) = setup_channels(api_client, "ot", {"ot_v": 0})
    wait_assigned(api_client, pchannel)
    rng = random.Random(11)

    async def scenario() -> None:
        async with StreamingClient(cluster.endpoints) as client:
            await client.coordinator.create_subscription("ot", ["ot_v"])
            acked = await _produce(client, "ot_v", 1000, rng)
            old = Shard(
                client,
                Counters(),
                "ot",
                "ot_v",
                store_path=tmp_path / "old.sqlite",
                member_id="old",
                token=5,
                commit_as_member=False,
                max_batch_messages=300,
            )
            new = Shard(
                client,
                Counters(),
                "ot",
                "ot_v",
                store_path=tmp_path / "new.sqlite",
                member_id="new",
                token=9,
                commit_as_member=False,
            )
            try:
                await old.recover()
                applied = 0
                while applied < len(acked):
                    applied += await old.run_once()
                before = old.store.checkpoint() if old.store else None
                # The new owner rebuilds the store on another disk from the recovery log.
                started = time.monotonic()
                status = await new.recover()
                print(
                    f"recovery: {status.replayed_records} records "
                    f"({len(acked)} messages) replayed in {time.monotonic() - started:.3f} s"
                )
                assert status.replayed_records >= 4
                _check_exactly_once(tmp_path / "new.sqlite", acked)
                more = await _produce(client, "ot_v", 50, rng)
                with pytest.raises(ChannelFencedError, match="another owner took the shard"):
                    while True:
                        await old.run_once()
                assert old.store is not None and old.store.checkpoint() == before
                _check_exactly_once(tmp_path / "old.sqlite", acked)
                applied = 0
                while applied < len(more):
                    applied += await new.run_once()
                _check_exactly_once(tmp_path / "new.sqlite", acked + more)
                # A shard of a vchannel the subscription does not have: NOT_FOUND.
                stray = Shard(
                    client,
                    Counters(),
                    "ot",
                    "nope",
                    store_path=tmp_path / "stray.sqlite",
                    member_id="s",
                    token=3,
                    commit_as_member=False,
                )
                with pytest.raises(NotFoundError, match="not found"):
                    await stray.recover()
                await stray.close()
            finally:
                await old.close()
                await new.close()

    asyncio.run(scenario())


def test_consumer_run_and_shard_list_refuse_bad_input(env, tmp_path: Path) -> None:
    cluster, _ = env
    endpoints = ["--endpoints", ",".join(cluster.endpoints)]
    environ = dict(os.environ, PYTHONPATH=str(ROOT))

    def raftwal(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RAFTWAL, *argv, *endpoints],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            cwd=tmp_path,
            env=environ,
        )

    missing = raftwal(
        "consumer",
        "run",
        "tests.cluster.shard_app:Counters",
        "--subscription",
        "nosuch",
        "--data-dir",
        str(tmp_path / "d"),
    )
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr, missing.stderr
    listed = raftwal("shard", "list", "--subscription", "nosuch")
    assert listed.returncode == 1 and "NOT_FOUND" in listed.stderr
