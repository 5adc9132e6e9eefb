"""Disks that fill up, slow down and fail, on a real three-node cluster whose data dirs are
small filesystems of the test's own making (PowerFS, `raftwal.chaos.powerfs`: a FUSE mount
with a byte budget, a slow fsync, or failing fsyncs; see docs/operations.md, "Disks"):

- a node filled past its hard watermark refuses Produce and transactions with
  RESOURCE_EXHAUSTED and an ErrorInfo naming the node, the directory, the free bytes and
  the mark, keeps serving consumes, segment reads and lock and lease writes, and takes
  writes again by itself within 5 s of space returning;
- a disk that fills up between two watermark samples (ENOSPC in the middle of writes):
  the writes fail with a typed, retryable error, Raft keeps working on its reserve, every
  node stays up, and afterwards every segment, catalog, events.db and journal file is
  readable;
- a follower whose every fsync takes 2 s costs no election over 60 s; writes only slow
  down, none fails, and its replica is reported lagging;
- fsyncs that fail with EIO on a replica: it stops taking writes for that log, recovers it
  from its files and its peers, nothing acknowledged is lost.

Each test checks what was acknowledged against what is read back. Skips only where FUSE
cannot be mounted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sqlite3
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raft.journal import DurableJournal
from raftwal.chaos.powerfs import PowerMount, fuse_unavailable
from raftwal.cli import dev
from rpc.errors import RaftwalError, ResourceExhaustedError, from_rpc_error
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.streaming_client import StreamingClient
from tests.cluster.conftest import Api, converged, leader_id
from tests.cluster.wal_helpers import (
    Acked,
    History,
    Producer,
    list_segments,
    setup_channels,
    wait_assigned,
)
from tests.timing import scaled, wait_for
from wal_segments.segment import SegmentReader, list_segment_files, open_segment

_UNAVAILABLE = fuse_unavailable()
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(_UNAVAILABLE), reason=f"FUSE cannot mount: {_UNAVAILABLE}"),
]
E = errors_pb2
BUDGET_BYTES = 64 << 20
FILLER = "disk-filler.bin"


@dataclass
class DiskCluster:
    cluster: dev.LocalCluster
    client: Api
    mounts: dict[str, PowerMount]

    def data_dir(self, node_id: str) -> Path:
        return self.cluster.node(node_id).data_dir

    def address(self, node_id: str) -> str:
        return self.cluster.node(node_id).grpc_address


@contextlib.contextmanager
def powered_cluster(
    directory: Path, env: dict[str, str], budget_bytes: int = BUDGET_BYTES
) -> Iterator[DiskCluster]:
    """Three nodes, each data dir a PowerFS mount of `budget_bytes`; all stopped and
    unmounted on exit (the nodes first: a mount in use cannot be unmounted cleanly)."""
    config = dev.make_config(directory, 3)
    mounts = {
        node.id: PowerMount(
            directory / "power" / node.id, node.data_dir, directory / f"powerfs-{node.id}.log"
        )
        for node in config.nodes
    }
    cluster: dev.LocalCluster | None = None
    client: Api | None = None
    try:
        for mount in mounts.values():
            mount.start()
            mount.set_faults(budget_bytes=budget_bytes)
        cluster = dev.up(directory, 3, timeout_s=60, env=env, config=config)
        client = Api(cluster.endpoints)
        yield DiskCluster(cluster, client, mounts)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop_all()
        for mount in mounts.values():
            mount.close()


def _term(client: Api, pchannel: str) -> int:
    """`pchannel`'s term in the cluster's status (0 when it is not listed)."""
    return max((c.term for c in client.status().pchannels if c.name == pchannel), default=0)


def _print_log_tail(cluster: dev.LocalCluster, node_id: str, needle: str, lines: int = 60) -> None:
    """Print the last `lines` lines of `node_id`'s log that mention `needle` (a failing
    test's evidence of what the node did)."""
    path = cluster.directory / f"{node_id}.log"
    found = [line for line in path.read_text(errors="replace").splitlines() if needle in line]
    print(f"--- {path.name}, lines with {needle!r} (last {lines}):")
    print("\n".join(found[-lines:]))


def _env(**settings: int) -> dict[str, str]:
    env = {**os.environ, "RAFTWAL_SEGMENT_MAX_BYTES": str(64 * 1024)}
    env.update({f"RAFTWAL_{name.upper()}": str(value) for name, value in settings.items()})
    return env


def _free(path: Path) -> tuple[int, int]:
    """(available bytes, used + available bytes) of the filesystem at `path`."""
    st = os.statvfs(path)
    available = st.f_bavail * st.f_frsize
    return available, (st.f_blocks - st.f_bfree) * st.f_frsize + available


def _fill(path: Path, leave_bytes: int) -> int:
    """Take all but `leave_bytes` of the filesystem at `path` with one preallocated file
    (another program filling the disk). Returns the bytes taken."""
    taken = 0
    fd = os.open(path / FILLER, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        # One take, as another program would: the nodes write meanwhile, so what statvfs
        # said may be gone by the fallocate (then ask again), but space that comes free
        # afterwards (Raft's reserve) is left alone.
        for _ in range(50):
            available, _ = _free(path)
            size = max(0, available - leave_bytes)
            if size < 4096:
                break
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, size)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                continue
            taken += size
            break
        if leave_bytes == 0:
            # The last bytes statvfs rounds away (it counts in blocks).
            with contextlib.suppress(OSError):
                taken += os.write(fd, bytes(max(0, _free(path)[0]) + 4096))
    finally:
        os.close(fd)
    return taken


def _produce_raw(
    address: str, pchannel: str, vchannel: str, payload: bytes, timeout_s: float = 15.0
) -> wire.ProduceResult:
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        request = wire.ProduceRequest(
            request_id=1,
            pchannel=pchannel,
            messages=[wire.Message(vchannel=vchannel, payload=payload)],
        )
        (result,) = list(stub.Produce(iter([request]), timeout=scaled(timeout_s)))
    return result


def _healthy(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=scaled(5))
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _metrics(node: dev.NodeConfig) -> str:
    url = f"http://{node.host}:{node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=scaled(10)) as response:
        return str(response.read().decode())


def _coordinate(client: Api, key: str) -> None:
    """Lease and lock writes through Raft: grant, lock, keep alive, unlock, revoke."""
    lease = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=30_000, holder=key)).lease_id
    locked = client.call(
        "Lock", api.LockRequest(key=key, mode=pb.LOCK_MODE_EXCLUSIVE, lease_id=lease)
    )
    assert locked.fencing_token > 0
    for _ in range(3):
        kept = _keep_alive(client, lease)
        assert kept.ttl_ms > 0, kept
    client.call("Unlock", api.UnlockRequest(key=key, lease_id=lease))
    client.call("RevokeLease", api.RevokeLeaseRequest(lease_id=lease))


def _keep_alive(client: Api, lease_id: int) -> api.KeepAliveResponse:
    last: grpc.RpcError | None = None
    for endpoint in client.endpoints * 3:
        try:
            replies = client.stub(endpoint).KeepAlive(
                iter([api.KeepAliveRequest(lease_id=lease_id)]), timeout=scaled(10)
            )
            return next(iter(replies))
        except grpc.RpcError as error:
            last = error
            time.sleep(0.1)
    assert last is not None
    raise last


def _consume_through(
    client: Api, vchannel: str, pchannel: str, history: History, timeout_s: float = 60.0
) -> list[wire.WalEntry]:
    """Every committed entry of `vchannel` up to the highest LSN acknowledged at least: a
    write the test saw no answer for may be in the log too (it was written, then
    committed by the next owner's recovery), so a count of acknowledgements is no end.
    Resumes after the last entry read when a stream ends (a new owner, a deadline)."""
    target = max((a.lsn for a in history.acked), default=0)
    deadline = time.monotonic() + scaled(timeout_s)
    entries: list[wire.WalEntry] = []
    while time.monotonic() < deadline and (not entries or entries[-1].lsn < target):
        _, _, address = wait_assigned(
            client, pchannel, timeout_s=max(1.0, deadline - time.monotonic())
        )
        request = wire.ConsumeRequest(
            vchannel=vchannel,
            policy=wire.DELIVER_POLICY_START_AFTER if entries else wire.DELIVER_POLICY_ALL,
            lsn=entries[-1].lsn if entries else 0,
        )
        with grpc.insecure_channel(address) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            try:
                stream = stub.Consume(
                    request, timeout=max(1.0, min(scaled(10), deadline - time.monotonic()))
                )
                for response in stream:
                    entries.extend(response.entries)
                    if entries and entries[-1].lsn >= target:
                        stream.cancel()
                        break
            except grpc.RpcError:
                time.sleep(0.2)
    return entries


def _check_history(history: History, entries: list[wire.WalEntry]) -> None:
    """Every acknowledged message was consumed once, at the LSN it was acknowledged with
    (messages are named by their first 24 bytes in what a failure prints)."""
    lsns = [e.lsn for e in entries]
    assert lsns == sorted(set(lsns)), "consumed LSNs are not strictly increasing"
    by_payload: dict[bytes, list[int]] = {}
    for entry in entries:
        by_payload.setdefault(entry.payload, []).append(entry.lsn)
    duplicates = [(p[:24], found) for p, found in by_payload.items() if len(found) > 1]
    assert not duplicates, f"duplicated messages: {duplicates[:5]}"
    lost = [(a.payload[:24], a.lsn) for a in history.acked if a.payload not in by_payload]
    assert not lost, (
        f"acknowledged and lost: {lost[:10]} ({len(lost)} of {len(history.acked)}); "
        f"consumed lsns {lsns[:3]}..{lsns[-3:]} ({len(lsns)})"
    )
    moved = [
        (a.payload[:24], a.lsn, by_payload[a.payload])
        for a in history.acked
        if by_payload[a.payload] != [a.lsn]
    ]
    assert not moved, f"acknowledged at one lsn, consumed at another: {moved[:5]}"


async def _sdk_send(endpoints: list[str], vchannel: str) -> BaseException | None:
    """One message through the SDK's producer: the error it raised, or None."""
    async with StreamingClient(endpoints) as client:
        producer = client.producer(retry_timeout_s=scaled(10))
        try:
            await producer.send(vchannel, b"sdk-" + uuid.uuid4().hex.encode())
        except RaftwalError as error:
            return error
        finally:
            await producer.close(timeout_s=2.0)
    return None


def _check_files(data_dirs: list[Path]) -> dict[str, int]:
    """Every file the nodes left is readable: each segment opens without a torn tail (a
    sealed one verifies block by block), catalog.db and events.db pass SQLite's integrity
    check, the Raft journal opens. Returns what was checked, by kind."""
    checked = {"segments": 0, "sqlite": 0, "journals": 0}
    for data_dir in data_dirs:
        wal_dir = data_dir / "wal"
        for directory in sorted(p for p in wal_dir.iterdir() if p.is_dir()):
            for _, path in list_segment_files(directory):
                recovered = open_segment(path, repair=False, verify_blocks=True)
                assert recovered.truncated is None, f"{path}: {recovered.truncated}"
                if recovered.sealed:
                    SegmentReader.open(path).close()
                checked["segments"] += 1
        for name in ("catalog.db", "events.db"):
            connection = sqlite3.connect(str(data_dir / name))
            try:
                (result,) = connection.execute("PRAGMA integrity_check").fetchone()
            finally:
                connection.close()
            assert result == "ok", f"{data_dir / name}: {result}"
            checked["sqlite"] += 1
        journal = DurableJournal(data_dir / "raft", durable=False)
        try:
            assert journal.last_index > 0, f"{data_dir}: empty Raft journal"
        finally:
            journal.close()
        checked["journals"] += 1
    return checked


def test_hard_watermark_refuses_produce_keeps_reads_and_coordination(tmp_path: Path) -> None:
    """Done-when of the disks issue: filled past the hard mark, a node refuses produce with
    RESOURCE_EXHAUSTED, serves consumes and lock and lease writes, and resumes produce
    within 5 s after space is freed, with no restart."""
    env = _env(disk_check_ms=200, disk_soft_min_free_bytes=0, disk_hard_min_free_bytes=0)
    with powered_cluster(tmp_path, env) as disks:
        client, cluster = disks.client, disks.cluster
        (pchannel,) = setup_channels(client, "hardmark", {"hm_v": 0})
        owner, term, address = wait_assigned(client, pchannel)
        pids = {n.id: cluster.pid(n.id) for n in cluster.config.nodes}
        history = History()
        producer = Producer(client, pchannel, f"p-{uuid.uuid4().hex[:8]}")
        try:
            for index in range(12):
                payloads = [b"before-%03d-%d-" % (index, i) + b"x" * 2000 for i in range(10)]
                assert producer.send("hm_v", payloads, history, budget_s=30)
            # Another program fills every node's disk to 95% (the hard mark is 90%).
            for node in cluster.config.nodes:
                _, capacity = _free(node.data_dir)
                _fill(node.data_dir, leave_bytes=capacity * 5 // 100)

            def refused() -> wire.ProduceResult | None:
                payload = b"early-%s" % uuid.uuid4().hex.encode()
                result = _produce_raw(address, pchannel, "hm_v", payload)
                if result.HasField("error"):
                    assert result.error.code == E.RESOURCE_EXHAUSTED, result.error
                    return result
                # Taken before the watermark sample saw the filler: acknowledged like any.
                position = result.positions[0]
                history.acked.append(Acked(position.lsn, position.time_tick, payload))
                return None

            info = wait_for("produce refused at the hard mark", refused, timeout_s=10).error
            print(f"refusal: {info.message}")
            assert info.disk.node_id == owner
            assert info.disk.dir == str(disks.data_dir(owner))
            assert info.disk.mark == "hard"
            assert 0 < info.disk.free_bytes < info.disk.mark_free_bytes < info.disk.total_bytes
            assert f"node {owner}" in info.message and "hard disk watermark" in info.message
            for _ in range(3):
                again = _produce_raw(address, pchannel, "hm_v", b"refused-" + b"r" * 100)
                assert again.error.code == E.RESOURCE_EXHAUSTED, again
            # The SDK's producer raises the typed error, with the detail, for the caller
            # to retry later (it does not retry a full disk on its own).
            sdk_error = asyncio.run(_sdk_send(cluster.endpoints, "hm_v"))
            assert isinstance(sdk_error, ResourceExhaustedError), sdk_error
            assert sdk_error.info.disk.node_id == owner and sdk_error.info.disk.mark == "hard"
            # A transaction is refused the same way (a gRPC status with the ErrorInfo).
            with grpc.insecure_channel(address) as channel:
                stub = streaming_pb2_grpc.StreamingNodeStub(channel)
                with pytest.raises(grpc.RpcError) as raised:
                    stub.BeginTxn(wire.BeginTxnRequest(vchannel="hm_v"), timeout=scaled(10))
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert from_rpc_error(raised.value).disk.mark == "hard"

            # Reads go on: every acknowledged message, and the committed segments' bytes.
            entries = _consume_through(client, "hm_v", pchannel, history)
            _check_history(history, entries)
            segments = [s for s in list_segments(client, pchannel).segments]
            assert segments, "no committed segment to read"
            with grpc.insecure_channel(address) as channel:
                stub = streaming_pb2_grpc.StreamingNodeStub(channel)
                chunks = list(
                    stub.ReadSegment(
                        wire.ReadSegmentRequest(
                            pchannel=pchannel, segment_id=segments[0].segment_id
                        ),
                        timeout=scaled(10),
                    )
                )
            assert sum(len(c.frames) for c in chunks) > 0
            # Coordination goes on: leases and locks on every node's Raft journal.
            for round_ in range(3):
                _coordinate(client, f"disk-lock-{round_}")
            # Reported: status, warnings, metric; and retention ran at once.
            status = client.status()
            levels = {m.node_id: [d.level for d in m.disks] for m in status.members}
            assert all("hard" in found for found in levels.values()), levels
            assert any(
                f"node {owner}:" in w and "hard disk watermark" in w for w in status.warnings
            ), status.warnings
            assert f'raftwal_disk_watermark_level{{dir="{disks.data_dir(owner)}"}} 2.0' in (
                _metrics(cluster.node(owner))
            )
            leader_log = (cluster.directory / f"{status.leader_node_id}.log").read_text()
            assert "soft disk watermark: running retention now" in leader_log

            # Space returns: writes resume by themselves.
            for node in cluster.config.nodes:
                (node.data_dir / FILLER).unlink()
            freed_at = time.monotonic()

            def taken() -> wire.ProduceResult | None:
                result = _produce_raw(address, pchannel, "hm_v", b"after-free")
                return None if result.HasField("error") else result

            accepted = wait_for("produce taken again", taken, timeout_s=10, interval_s=0.05)
            resumed_s = time.monotonic() - freed_at
            position = accepted.positions[0]
            history.acked.append(Acked(position.lsn, position.time_tick, b"after-free"))
            print(f"produce resumed {resumed_s:.2f} s after space was freed")
            assert resumed_s < 5.0
            for index in range(5):
                payloads = [b"after-%03d-%d" % (index, i) for i in range(10)]
                assert producer.send("hm_v", payloads, history, budget_s=30)
        finally:
            producer.close()
        # No restart, no failover: the same processes, the same owner and term.
        assert {n.id: cluster.pid(n.id) for n in cluster.config.nodes} == pids
        assert wait_assigned(client, pchannel)[:2] == (owner, term)
        entries = _consume_through(client, "hm_v", pchannel, history)
        _check_history(history, entries)
        assert not [e for e in entries if e.payload.startswith(b"refused-")]
        converged(client, expect_members=3, timeout_s=30)


class _Flow:
    """A background loop (produce or keep a lease alive) recording every outcome."""

    def __init__(self, name: str, step, interval_s: float) -> None:  # type: ignore[no-untyped-def]
        self.name = name
        self.outcomes: list[tuple[float, str]] = []
        self._step = step
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                outcome = self._step()
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    outcome = "DEADLINE: no answer in time"
                else:
                    info = from_rpc_error(error)
                    outcome = f"{E.ErrorCode.Name(info.code)}: {info.message[:200]}"
            self.outcomes.append((time.monotonic(), outcome))
            self._stop.wait(self._interval_s)

    def __enter__(self) -> _Flow:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=scaled(30))

    def since(self, moment: float) -> list[str]:
        return [outcome for at, outcome in self.outcomes if at >= moment]


def test_enospc_mid_write_fails_cleanly_and_leaves_every_file_readable(tmp_path: Path) -> None:
    """Done-when of the disks issue: every disk fills up at once, faster than the
    watermark check, while a producer writes and a lease is kept alive. Writes fail with a
    typed, retryable error (RESOURCE_EXHAUSTED), the lease keeps being renewed (Raft lives
    on its reserve), every node stays up; once space returns, writes resume by themselves,
    and every segment, catalog, events.db and journal file is readable."""
    env = _env(
        disk_check_ms=1000,
        disk_soft_min_free_bytes=0,
        disk_hard_min_free_bytes=0,
        raft_reserve_bytes=4 << 20,
    )
    with powered_cluster(tmp_path, env) as disks:
        client, cluster = disks.client, disks.cluster
        (pchannel,) = setup_channels(client, "enospc", {"en_v": 0})
        owner, _, address = wait_assigned(client, pchannel)
        pids = {n.id: cluster.pid(n.id) for n in cluster.config.nodes}
        history = History()
        producer = Producer(client, pchannel, f"p-{uuid.uuid4().hex[:8]}")
        lease = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=10_000, holder="full"))
        counter = iter(range(1_000_000))

        def produce() -> str:
            payload = b"w-%06d-" % next(counter) + b"p" * 30_000
            # Short: a batch caught in flight by the full disk waits for its commit until
            # space returns (the SDK resends it with the same sequence; here it is only
            # recorded as unanswered).
            result = _produce_raw(address, pchannel, "en_v", payload, timeout_s=3)
            if not result.HasField("error"):
                position = result.positions[0]
                history.acked.append(Acked(position.lsn, position.time_tick, payload))
                return "ok"
            error = result.error
            mark = f" ({error.disk.mark})" if error.HasField("disk") else ""
            return f"{E.ErrorCode.Name(error.code)}{mark}: {error.message[:200]}"

        def keep_alive() -> str:
            reply = _keep_alive(client, lease.lease_id)
            return "ok" if reply.ttl_ms > 0 else f"expired: {reply}"

        try:
            for index in range(5):
                payloads = [b"before-%03d-%d-" % (index, i) + b"x" * 2000 for i in range(10)]
                assert producer.send("en_v", payloads, history, budget_s=30)
            with (
                _Flow("produce", produce, 0.02) as writes,
                _Flow("lease", keep_alive, 0.2) as lease_flow,
            ):
                wait_for("writes flowing", lambda: "ok" in writes.since(0), timeout_s=20)
                filled_at = time.monotonic()
                for node in cluster.config.nodes:
                    _fill(node.data_dir, leave_bytes=0)
                # Full for a while: writes refused, coordination and every node alive.
                wait_for(
                    "a write not taken",
                    lambda: any(o != "ok" for o in writes.since(filled_at)),
                    timeout_s=20,
                )
                time.sleep(5)
                full_writes = writes.since(filled_at)
                full_renewals = lease_flow.since(filled_at)
                status = client.status()
                usage = {node_id: mount.usage() for node_id, mount in disks.mounts.items()}
                for node in cluster.config.nodes:
                    assert cluster.processes[node.id].poll() is None, f"{node.id} exited"
                    assert _healthy(node.grpc_address)
                for node in cluster.config.nodes:
                    (node.data_dir / FILLER).unlink()
                freed_at = time.monotonic()
                wait_for(
                    "writes taken again",
                    lambda: "ok" in writes.since(freed_at),
                    timeout_s=60,
                    interval_s=0.1,
                )
                resumed_s = time.monotonic() - freed_at
        finally:
            producer.close()
        for at, outcome in writes.outcomes:
            print(f"  write {at - filled_at:+8.2f} s  {outcome[:160]}")
        print(f"while full: writes {sorted(set(w.split(':')[0] for w in full_writes))}")
        print(f"while full: {len(full_renewals)} lease renewals {set(full_renewals)}")
        print(f"PowerFS: {usage}")
        print(f"writes resumed {resumed_s:.1f} s after space was freed")
        # The disks really filled up (writes met ENOSPC), and every write not taken was
        # answered with a typed, retryable error (RESOURCE_EXHAUSTED with the disk detail;
        # NOT_OWNER or ON_SHUTDOWN where a seal that met the full disk stopped the owner,
        # and its successor cannot recover before space returns), or left unanswered
        # while its commit waits for space; never INNER or UNKNOWN.
        assert sum(u["enospc"] for u in usage.values()) > 0, usage
        typed = ("RESOURCE_EXHAUSTED", "NOT_OWNER", "ON_SHUTDOWN", "CHANNEL_FENCED")
        unexpected = [
            w for w in full_writes if w != "ok" and not w.startswith((*typed, "DEADLINE"))
        ]
        assert not unexpected, unexpected
        refusals = [w for w in full_writes if w.startswith("RESOURCE_EXHAUSTED")]
        assert all("(full)" in w or "(hard)" in w for w in refusals), refusals
        # Raft kept working on its reserve: every renewal while the disks were full passed.
        assert full_renewals and set(full_renewals) == {"ok"}, full_renewals
        released = [m.node_id for m in status.members if m.raft_reserve_bytes == 0]
        assert released, "no node had to use its Raft disk reserve"
        assert any("Raft disk reserve" in w for w in status.warnings), status.warnings
        # No restart; the reserve is taken again once space returned.
        assert {n.id: cluster.pid(n.id) for n in cluster.config.nodes} == pids

        def reserves_back() -> bool:
            members = client.status().members
            return all(m.raft_reserve_bytes == m.raft_reserve_wanted_bytes > 0 for m in members)

        wait_for("every Raft reserve taken again", reserves_back, timeout_s=30)
        entries = _consume_through(client, "en_v", pchannel, history)
        _check_history(history, entries)
        converged(client, expect_members=3, timeout_s=60)
        data_dirs = [n.data_dir for n in cluster.config.nodes]
    # Every node stopped, every mount closed (keeping what it held): read it all back.
    checked = _check_files([tmp_path / "power" / d.name for d in data_dirs])
    print(f"checked {checked}")
    assert checked["segments"] >= 3 and checked["sqlite"] == 6 and checked["journals"] == 3


def test_slow_follower_fsync_costs_no_election(tmp_path: Path) -> None:
    """Done-when of the disks issue: every fsync of a follower (a replica of the pchannel,
    neither its owner nor the Raft leader) takes 2 s for 60 s. No election (the Raft terms
    and the leader stay), no write or lease renewal fails, and the replica is reported
    lagging (status, warning, metric) while the majority acknowledges without it."""
    env = _env(
        replica_lag_warn_ms=1000,
        disk_soft_min_free_bytes=0,
        disk_hard_min_free_bytes=0,
    )
    with powered_cluster(tmp_path, env) as disks:
        client, cluster = disks.client, disks.cluster
        (pchannel,) = setup_channels(client, "slowdisk", {"sd_v": 0})
        owner, term, _ = wait_assigned(client, pchannel)
        leader = leader_id(client)
        slow = next(n.id for n in cluster.config.nodes if n.id not in (owner, leader))
        terms_before = {m.node_id: m.raft_term for m in client.status().members}
        history = History()
        producer = Producer(client, pchannel, f"p-{uuid.uuid4().hex[:8]}")
        lease = client.call("GrantLease", api.GrantLeaseRequest(ttl_ms=10_000, holder="slow"))
        counter = iter(range(1_000_000))
        latencies: list[float] = []

        def produce() -> str:
            index = next(counter)
            # 100-byte messages: the fault is in the fsyncs, whose number the batches set;
            # 60 s of 10 KiB batches at full speed would fill the mount past its hard mark.
            payloads = [b"s-%06d-%d-" % (index, i) + b"x" * 100 for i in range(10)]
            started = time.monotonic()
            taken = producer.send("sd_v", payloads, history, budget_s=30)
            latencies.append(time.monotonic() - started)
            return "ok" if taken else "failed"

        def keep_alive() -> str:
            reply = _keep_alive(client, lease.lease_id)
            return "ok" if reply.ttl_ms > 0 else f"expired: {reply}"

        seen_lagging: list[api.ReplicaPosition] = []
        leaders: set[str] = set()
        downs: set[str] = set()
        terms: dict[str, set[int]] = {}
        try:
            disks.mounts[slow].set_faults(budget_bytes=BUDGET_BYTES, fsync_delay_ms=2000)
            started = time.monotonic()
            with _Flow("produce", produce, 0.0) as writes, _Flow("lease", keep_alive, 0.3) as kept:
                # Watched for a fixed 60 s (the length of the fault, not a wait).
                while time.monotonic() - started < 60:
                    status = client.status()
                    leaders.add(status.leader_node_id)
                    for member in status.members:
                        if member.reachable:
                            terms.setdefault(member.node_id, set()).add(member.raft_term)
                        for owned in member.owners:
                            seen_lagging.extend(
                                r for r in owned.replicas if r.node_id == slow and r.lagging
                            )
                    downs.update(n.node_id for n in status.nodes if n.state == pb.NODE_STATE_DOWN)
                    time.sleep(1.0)
                metrics = _metrics(cluster.node(owner))
                lag_warnings = [w for w in client.status().warnings if "is lagging" in w]
            disks.mounts[slow].set_faults(budget_bytes=BUDGET_BYTES)
        finally:
            producer.close()
        usage = disks.mounts[slow].usage()
        latencies.sort()
        print(
            f"slow {slow} (owner {owner}, leader {leader}): {usage['delayed_fsyncs']} fsyncs "
            f"delayed 2 s; {len(latencies)} batches, median {latencies[len(latencies) // 2]:.3f} "
            f"s, max {latencies[-1]:.3f} s; lagging seen {len(seen_lagging)} times, max lag "
            f"{max((r.lag_ms for r in seen_lagging), default=0)} ms; warnings {lag_warnings[:1]}"
        )
        assert usage["delayed_fsyncs"] >= 10, usage
        # No election: the same leader throughout, and no node's term moved. (Nodes marked
        # DOWN are printed, not asserted: a node whose event loop a loaded machine holds
        # back misses heartbeats whatever its disk does.)
        print(f"nodes seen DOWN: {sorted(downs) or 'none'}")
        assert leaders == {leader}, leaders
        assert all(found == {terms_before[n]} for n, found in terms.items()), terms
        # Nothing failed: every batch was taken (the majority without the slow replica),
        # every lease renewal passed.
        assert set(writes.since(0)) == {"ok"}, (set(writes.since(0)), history.failed[:5])
        assert not history.failed, history.failed[:3]
        assert set(kept.since(0)) == {"ok"}, set(kept.since(0))
        # The slow replica was reported: status, warning, metric.
        assert seen_lagging and max(r.lag_ms for r in seen_lagging) > 1000, seen_lagging[:3]
        assert any(slow in w for w in lag_warnings) or seen_lagging, lag_warnings
        assert f'raftwal_wal_replica_lagging{{pchannel="{pchannel}",replica="{slow}"}}' in metrics
        assert wait_assigned(client, pchannel)[:2] == (owner, term)
        entries = _consume_through(client, "sd_v", pchannel, history)
        _check_history(history, entries)


def test_failed_fsyncs_never_acknowledge_what_they_covered(tmp_path: Path) -> None:
    """A segment fsync that fails with EIO loses the writes it covered (PowerFS drops them
    at once, as a disk that failed to write the dirty pages and a kernel that evicted
    them). On the owner, then on a replica, while a producer writes: the log that failed
    takes no more writes until it is reopened from its files (never a second fsync over
    the same pages), the owner moves to a new term, the replica catches up from its peers;
    no acknowledged message is lost, no node restarts, and every segment file is whole."""
    env = _env(disk_soft_min_free_bytes=0, disk_hard_min_free_bytes=0)
    with powered_cluster(tmp_path, env) as disks:
        client, cluster = disks.client, disks.cluster
        (pchannel,) = setup_channels(client, "eio", {"eio_v": 0})
        owner, term, _ = wait_assigned(client, pchannel)
        pids = {n.id: cluster.pid(n.id) for n in cluster.config.nodes}
        history = History()
        producer = Producer(client, pchannel, f"p-{uuid.uuid4().hex[:8]}")
        counter = iter(range(1_000_000))

        def produce() -> str:
            index = next(counter)
            payloads = [b"e-%06d-%d-" % (index, i) + b"x" * 1000 for i in range(10)]
            return "ok" if producer.send("eio_v", payloads, history, budget_s=60) else "failed"

        try:
            with _Flow("produce", produce, 0.01) as writes:
                wait_for("writes flowing", lambda: len(history.acked) >= 200, timeout_s=30)
                # The owner's next segment fsync fails. One that hits the creation of a
                # segment file (its header, fsynced under a temporary name before the file
                # is linked in) fails that write cleanly: nothing of it was acknowledged,
                # the owner goes on and the next write creates the file again. Only a
                # failed fsync of appended entries stops the owner, so the fault is armed
                # again until one does (most of a pchannel's fsyncs are of entries).
                for _ in range(6):
                    failed_before = disks.mounts[owner].usage()["failed_fsyncs"]
                    disks.mounts[owner].set_faults(
                        budget_bytes=BUDGET_BYTES, fsync_errors=1, match=f"/wal/{pchannel}/"
                    )
                    wait_for(
                        "the owner's fsync failed",
                        lambda before=failed_before: (
                            disks.mounts[owner].usage()["failed_fsyncs"] > before
                        ),
                        timeout_s=30,
                    )
                    acked = len(history.acked)
                    wait_for(
                        "a new term, or writes going on at the old one",
                        lambda acked=acked: (
                            _term(client, pchannel) > term or len(history.acked) > acked + 100
                        ),
                        timeout_s=40,
                    )
                    if _term(client, pchannel) > term:
                        break
                try:
                    new_owner, new_term, _ = wait_assigned(client, pchannel, min_term=term + 1)
                except AssertionError:
                    _print_log_tail(cluster, owner, pchannel)
                    print(f"failed sends: {history.failed[:5]}; status {client.status()}")
                    raise
                acked = len(history.acked)
                wait_for("writes at the new owner", lambda: len(history.acked) > acked + 200)
                # A replica's (neither the old nor the new owner's) next two fail. As on the
                # owner, two that hit the creation of a segment file (its header, then the
                # retried creation) fail those appends cleanly and leave the log usable; the
                # fault is armed again until one hits appended entries and stops the log.
                replica = next(n.id for n in cluster.config.nodes if n.id not in (owner, new_owner))
                replica_log = cluster.directory / f"{replica}.log"
                for _ in range(6):
                    failed_before = disks.mounts[replica].usage()["failed_fsyncs"]
                    disks.mounts[replica].set_faults(
                        budget_bytes=BUDGET_BYTES, fsync_errors=2, match=f"/wal/{pchannel}/"
                    )
                    wait_for(
                        "the replica's fsyncs failed",
                        lambda before=failed_before: (
                            disks.mounts[replica].usage()["failed_fsyncs"] >= before + 2
                        ),
                        timeout_s=30,
                    )
                    acked = len(history.acked)
                    wait_for(
                        "writes after the replica's failure",
                        lambda acked=acked: len(history.acked) > acked + 50,
                    )
                    if "must be reopened" in replica_log.read_text(errors="replace"):
                        break
                acked = len(history.acked)
                wait_for(
                    "writes after the replica's failure", lambda: len(history.acked) > acked + 200
                )
        finally:
            producer.close()
        failed = {n: m.usage()["failed_fsyncs"] for n, m in disks.mounts.items()}
        print(
            f"owner {owner} term {term} -> {new_owner} term {new_term}; replica {replica}; "
            f"failed fsyncs {failed}; {len(history.acked)} acknowledged"
        )
        assert failed[owner] >= 1 and failed[replica] >= 2, failed
        assert set(writes.since(0)) == {"ok"}, set(writes.since(0))
        # Each failed fsync stopped the log it hit ("must be reopened"), never retried.
        for node_id in (owner, replica):
            text = (cluster.directory / f"{node_id}.log").read_text(errors="replace")
            assert "must be reopened" in text, node_id
        # Nothing acknowledged lost, at the LSN it was acknowledged with.
        entries = _consume_through(client, "eio_v", pchannel, history)
        _check_history(history, entries)

        # The failed replica repaired itself from its peers: every replica durable up to the
        # committed LSN, no node restarted, every segment file whole.
        def caught_up() -> bool:
            status = client.status()
            owners = [o for m in status.members for o in m.owners if o.pchannel == pchannel]
            serving = [o for o in owners if o.state == "serving"]
            return bool(serving) and all(
                r.durable_lsn >= serving[0].committed_lsn for r in serving[0].replicas
            )

        wait_for("every replica caught up", caught_up, timeout_s=60)
        assert {n.id: cluster.pid(n.id) for n in cluster.config.nodes} == pids
        converged(client, expect_members=3, timeout_s=30)
        data_dirs = [n.data_dir for n in cluster.config.nodes]
    checked = _check_files([tmp_path / "power" / d.name for d in data_dirs])
    print(f"checked {checked}")
