"""WAL fault tests on a real three-node cluster: kill -9 of the owner mid-produce, a
SIGSTOPped owner that loses its term, all three nodes killed at once, and a transaction cut
by a failover. Each test checks what was acknowledged against what a consumer reads back
(and what ListSegments/ReadSegment say), never just that nothing crashed.

Segments are kept small (`RAFTWAL_SEGMENT_MAX_BYTES`) so that seal, commit and segment
reads happen within a test.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.placement import serving_address
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import (
    History,
    Producer,
    consume_all,
    list_segments,
    setup_channels,
    wait_assigned,
)
from tests.timing import scaled, wait_for
from wal_segments.format import iter_batch

pytestmark = pytest.mark.cluster
E = errors_pb2
SEED = int(os.environ.get("RAFTWAL_TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture()
def wal_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    print(f"seed {SEED}")
    # A fresh cluster per test: each test's faults start from a healthy cluster.
    directory: Path = tmp_path_factory.mktemp("walcluster")
    env = dict(os.environ)
    env["RAFTWAL_SEGMENT_MAX_BYTES"] = str(64 * 1024)
    env["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(directory, env) as running:
        yield running


def _restart(cluster: dev.LocalCluster, node_id: str) -> None:
    cluster.start_node(node_id)


def _check_history(history: History, entries: list[wire.WalEntry]) -> None:
    lsns = [e.lsn for e in entries]
    assert lsns == sorted(set(lsns)), "consumed LSNs are not strictly increasing"
    by_payload: dict[bytes, list[int]] = {}
    for entry in entries:
        by_payload.setdefault(entry.payload, []).append(entry.lsn)
    duplicates = {p: found for p, found in by_payload.items() if len(found) > 1}
    assert not duplicates, f"duplicated messages: {list(duplicates.items())[:5]}"
    for acked in history.acked:
        assert acked.payload in by_payload, f"acknowledged {acked.payload!r} at {acked.lsn} lost"
        assert by_payload[acked.payload] == [acked.lsn], (
            f"{acked.payload!r} acknowledged at lsn {acked.lsn}, consumed at "
            f"{by_payload[acked.payload]}"
        )


def _check_segments(client: Api, pchannel: str, entries: list[wire.WalEntry]) -> int:
    """Committed segments are contiguous from LSN 1, and ReadSegment of each returns the
    same entries a consumer saw. Returns the number of committed segments."""
    response = list_segments(client, pchannel)
    segments = [s for s in response.segments if s.pchannel == pchannel]
    consumed = {e.lsn: e.payload for e in entries}
    expected_first = 1
    for segment in segments:
        assert segment.first_lsn == expected_first
        expected_first = segment.last_lsn + 1
    for segment in segments[-3:]:
        address = None
        status = client.status()
        frames = b""
        for node_id in segment.replica_node_ids:
            address = serving_address(status.nodes, node_id, pchannel)
            channel = grpc.insecure_channel(address)
            try:
                stub = streaming_pb2_grpc.StreamingNodeStub(channel)
                frames = b"".join(
                    r.frames
                    for r in stub.ReadSegment(
                        wire.ReadSegmentRequest(pchannel=pchannel, segment_id=segment.segment_id),
                        timeout=scaled(10),
                    )
                )
                break
            except grpc.RpcError:
                continue
            finally:
                channel.close()
        read = list(iter_batch(frames))
        assert [e.lsn for e in read] == list(range(segment.first_lsn, segment.last_lsn + 1))
        for entry in read:
            if entry.lsn in consumed:
                assert entry.payload == consumed[entry.lsn]
    return len(segments)


def test_kill_owner_mid_produce_loses_nothing_acknowledged(wal_cluster) -> None:
    cluster, client = wal_cluster
    (pchannel,) = setup_channels(client, "killowner", {"ko_v": 0})
    owner, term, _ = wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, f"p-{uuid.uuid4().hex[:8]}")
    history = History()
    stop = threading.Event()
    counter = iter(range(1_000_000))

    def loop() -> None:
        deadline = time.monotonic() + scaled(60)
        while not stop.is_set() and time.monotonic() < deadline:
            batch = [b"m-%06d-" % next(counter) + b"x" * 200 for _ in range(20)]
            producer.send("ko_v", batch, history, budget_s=30)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        wait_for("acknowledgements before the kill", lambda: len(history.acked) >= 40, timeout_s=30)
        acked_before = len(history.acked)
        cluster.kill(owner)
        new_owner, new_term, _ = wait_assigned(client, pchannel, min_term=term + 1)
        # Keep producing at the new owner for a while.
        target = len(history.acked) + 400
        wait_until = time.monotonic() + scaled(30)
        while len(history.acked) < target and time.monotonic() < wait_until:
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(timeout=scaled(60))
        producer.close()
    assert acked_before > 0, "nothing was acknowledged before the kill"
    assert new_owner != owner and new_term > term
    assert len(history.acked) > acked_before, "nothing acknowledged after the failover"
    entries = consume_all(client, "ko_v", pchannel, expect=len(history.acked))
    _check_history(history, entries)
    _restart(cluster, owner)
    assert _check_segments(client, pchannel, entries) >= 1


def test_sigstopped_owner_is_fenced_and_never_acknowledges(wal_cluster) -> None:
    cluster, client = wal_cluster
    (pchannel,) = setup_channels(client, "stopowner", {"so_v": 0})
    owner, term, address = wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, "stopper")
    history = History()
    assert producer.send("so_v", [b"before-%d" % i for i in range(10)], history)
    pid = cluster.pid(owner)
    assert pid is not None
    dev.signal_node(pid, signal.SIGSTOP)
    stale_results: list[wire.ProduceResult] = []
    stale_errors: list[str] = []

    def stale_producer() -> None:
        # Sent to the stopped owner: pending in its socket until SIGCONT.
        channel = grpc.insecure_channel(address)
        try:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            requests = [
                wire.ProduceRequest(
                    request_id=i,
                    pchannel=pchannel,
                    messages=[wire.Message(vchannel="so_v", payload=b"stale-%d" % i)],
                )
                for i in range(5)
            ]
            for result in stub.Produce(iter(requests), timeout=scaled(60)):
                stale_results.append(result)
        except grpc.RpcError as error:
            stale_errors.append(f"{error.code()}: {from_rpc_error(error).message}")
        finally:
            channel.close()

    thread = threading.Thread(target=stale_producer)
    thread.start()
    try:
        new_owner, new_term, _ = wait_assigned(client, pchannel, min_term=term + 1, timeout_s=60)
        assert new_owner != owner
        assert producer.send("so_v", [b"after-%d" % i for i in range(10)], history)
    finally:
        dev.signal_node(pid, signal.SIGCONT)
    thread.join(timeout=scaled(90))
    assert not thread.is_alive()
    acknowledged_stale = [r for r in stale_results if not r.HasField("error")]
    assert not acknowledged_stale, f"a fenced owner acknowledged: {acknowledged_stale}"
    assert len(stale_results) == 5 or stale_errors
    for result in stale_results:
        assert result.error.code in (E.CHANNEL_FENCED, E.NOT_OWNER, E.ON_SHUTDOWN), result
    # Writing to the old owner after SIGCONT is refused too.
    time.sleep(1.0)
    late = History()
    stale = Producer(client, pchannel, "late")
    stale.owner_address = address
    request = wire.ProduceRequest(
        request_id=1, pchannel=pchannel, messages=[wire.Message(vchannel="so_v", payload=b"late")]
    )
    result = stale.produce_once(request, address, timeout_s=10)
    stale.close()
    assert result.HasField("error") and result.error.code in (E.NOT_OWNER, E.CHANNEL_FENCED)
    assert not late.acked
    entries = consume_all(client, "so_v", pchannel, expect=len(history.acked))
    _check_history(history, entries)
    assert not [e for e in entries if e.payload.startswith(b"stale-")]


def test_kill_all_nodes_and_restart_keeps_everything_acknowledged(wal_cluster) -> None:
    cluster, client = wal_cluster
    (pchannel,) = setup_channels(client, "killall", {"ka_v": 0})
    _, term, _ = wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, "killall")
    history = History()
    for index in range(30):
        assert producer.send("ka_v", [b"k-%d-%d" % (index, i) for i in range(20)], history)
    producer.close()
    for node in cluster.config.nodes:
        cluster.kill(node.id)
    for node in cluster.config.nodes:
        cluster.start_node(node.id)
    _, new_term, _ = wait_assigned(client, pchannel, min_term=term + 1, timeout_s=90)
    assert new_term > term
    entries = consume_all(client, "ka_v", pchannel, expect=len(history.acked), timeout_s=60)
    _check_history(history, entries)
    assert len(entries) == len(history.acked)


def _stub(address: str) -> tuple[grpc.Channel, streaming_pb2_grpc.StreamingNodeStub]:
    channel = grpc.insecure_channel(address)
    return channel, streaming_pb2_grpc.StreamingNodeStub(channel)


def test_transaction_all_or_nothing_across_owner_failover(wal_cluster) -> None:
    cluster, client = wal_cluster
    (pchannel,) = setup_channels(client, "txn", {"tx_v": 0})
    owner, term, address = wait_assigned(client, pchannel)
    channel, stub = _stub(address)
    try:
        begin = stub.BeginTxn(wire.BeginTxnRequest(vchannel="tx_v"), timeout=scaled(10))
        for index in range(3):
            stub.AppendTxn(
                wire.AppendTxnRequest(
                    vchannel="tx_v",
                    txn_id=begin.txn_id,
                    messages=[
                        wire.Message(payload=b"committed-%d-%d" % (index, i)) for i in range(5)
                    ],
                ),
                timeout=scaled(10),
            )
        committed = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="tx_v", txn_id=begin.txn_id), timeout=scaled(10)
        )
        assert len(committed.positions) == 17  # begin + 15 + commit
        # A client whose answer was lost retries: it gets the original positions (Kafka's
        # EndTxn), and a rollback after the commit is refused with a clear error.
        again = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="tx_v", txn_id=begin.txn_id), timeout=scaled(10)
        )
        assert list(again.positions) == list(committed.positions)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RollbackTxn(
                wire.RollbackTxnRequest(vchannel="tx_v", txn_id=begin.txn_id), timeout=scaled(10)
            )
        info = from_rpc_error(refused.value)
        assert info.code == E.INVALID_TRANSACTION_STATE, info
        assert "was committed at lsn" in info.message
        rolled = stub.BeginTxn(wire.BeginTxnRequest(vchannel="tx_v"), timeout=scaled(10))
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="tx_v", txn_id=rolled.txn_id, messages=[wire.Message(payload=b"rolled")]
            ),
            timeout=scaled(10),
        )
        stub.RollbackTxn(
            wire.RollbackTxnRequest(vchannel="tx_v", txn_id=rolled.txn_id), timeout=scaled(10)
        )
        # A retried rollback answers the same; a commit after it is refused.
        stub.RollbackTxn(
            wire.RollbackTxnRequest(vchannel="tx_v", txn_id=rolled.txn_id), timeout=scaled(10)
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.CommitTxn(
                wire.CommitTxnRequest(vchannel="tx_v", txn_id=rolled.txn_id), timeout=scaled(10)
            )
        info = from_rpc_error(refused.value)
        assert info.code == E.INVALID_TRANSACTION_STATE, info
        assert "was rolled back" in info.message
        cut = stub.BeginTxn(wire.BeginTxnRequest(vchannel="tx_v"), timeout=scaled(10))
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="tx_v",
                txn_id=cut.txn_id,
                messages=[wire.Message(payload=b"cut-%d" % i) for i in range(5)],
            ),
            timeout=scaled(10),
        )
    finally:
        channel.close()
    cluster.kill(owner)
    _, _, new_address = wait_assigned(client, pchannel, min_term=term + 1)
    channel, stub = _stub(new_address)
    try:
        with pytest.raises(grpc.RpcError) as raised:
            stub.CommitTxn(
                wire.CommitTxnRequest(vchannel="tx_v", txn_id=cut.txn_id), timeout=scaled(10)
            )
        assert from_rpc_error(raised.value).code == E.TRANSACTION_EXPIRED
        # The new owner never saw the commit's answer, yet a retry gets the same positions:
        # it finds the commit entry in the log it recovered.
        retried = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="tx_v", txn_id=begin.txn_id), timeout=scaled(10)
        )
        assert list(retried.positions) == list(committed.positions)
    finally:
        channel.close()
    _restart(cluster, owner)
    entries = consume_all(client, "tx_v", pchannel, expect=17)
    payloads = [e.payload for e in entries if e.txn_id]
    body = [p for p in payloads if p]
    assert body == [b"committed-%d-%d" % (i, j) for i in range(3) for j in range(5)]
    txn_entries = [e for e in entries if e.txn_id == begin.txn_id]
    lsns = [e.lsn for e in txn_entries]
    assert lsns == list(range(lsns[0], lsns[0] + 17)), "a txn is written contiguously"
    assert txn_entries[0].msg_type == "txn_begin" and txn_entries[-1].msg_type == "txn_commit"
    assert not [e for e in entries if e.payload in (b"rolled",) or e.payload.startswith(b"cut-")]
