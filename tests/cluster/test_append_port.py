"""Replication over the transfer port (rpc.append_stream) on a real three-node cluster.

The owner's Append streams go to each replica's transfer port after Replication.OpenAppend
handed out a ticket. These tests check that they do, that the port refuses what it must
(an unknown or used ticket, a frame over the cap, a frame that is no AppendRequest) while
the replica keeps serving, that the owner's stream comes back after a replica is killed
and restarted or paused and resumed while messages are produced, without losing an
acknowledged message, and that with ``transfer_port = -1`` replication runs over the gRPC
Append call as before. Producers' Produce connections to the same port (rpc.produce_stream)
are answered, and a frame over the cap or one that is no ProduceRequest gets an
INVALID_ARGUMENT result before the connection closes.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.chaos.net import ProxyNet
from raftwal.cli import dev
from rpc import append_stream, produce_stream, segment_transfer
from rpc.protos import errors_pb2 as E
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import History, Producer, consume_all, setup_channels, wait_assigned
from tests.timing import scaled

pytestmark = pytest.mark.cluster
SEED = int(os.environ.get("RAFTWAL_TEST_SEED", random.randrange(1 << 30)))
CALL_TIMEOUT_S = scaled(5.0)
# The gRPC port's default message limit, which caps an Append frame too.
MAX_FRAME_BYTES = 32 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster_and_client(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dev.LocalCluster, Api]]:
    print(f"seed {SEED}")
    env = dict(os.environ)
    env["RAFTWAL_SEGMENT_MAX_BYTES"] = str(256 * 1024)
    env["RAFTWAL_NODE_TIMEOUT_MS"] = "2000"
    with running_cluster(tmp_path_factory.mktemp("appendport"), env) as running:
        yield running


def _metrics(cluster: dev.LocalCluster, node_id: str) -> dict[tuple[str, frozenset], float]:
    node = cluster.node(node_id)
    url = f"http://{node.host}:{node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=scaled(10)) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _port_count(cluster: dev.LocalCluster, node_id: str, outcome: str) -> float:
    return _metrics(cluster, node_id).get(
        ("raftwal_segment_transfers_total", frozenset({("outcome", outcome)})), 0.0
    )


def _replica_caught_up(cluster: dev.LocalCluster, owner: str, pchannel: str, replica: str) -> bool:
    """The owner counts `replica` durable up to its own last LSN."""
    samples = _metrics(cluster, owner)
    last = samples.get(("raftwal_wal_last_lsn", frozenset({("pchannel", pchannel)})))
    durable = samples.get(
        (
            "raftwal_wal_replica_durable_lsn",
            frozenset({("pchannel", pchannel), ("replica", replica)}),
        )
    )
    return last is not None and durable is not None and durable >= last > 0


def _catches_up(
    cluster: dev.LocalCluster, owner: str, pchannel: str, replica: str
) -> Callable[[], bool]:
    """A check for `_wait` while writes go on: `replica` is durable up to the owner's last
    LSN as it stood at the first check. The owner's last LSN keeps moving under a running
    producer, so on a loaded host the replica may never be seen exactly level with it."""
    target: list[float] = []

    def check() -> bool:
        samples = _metrics(cluster, owner)
        if not target:
            last = samples.get(("raftwal_wal_last_lsn", frozenset({("pchannel", pchannel)})))
            if not last:
                return False
            target.append(last)
        durable = samples.get(
            (
                "raftwal_wal_replica_durable_lsn",
                frozenset({("pchannel", pchannel), ("replica", replica)}),
            )
        )
        return durable is not None and durable >= target[0]

    return check


def _wait(what: str, check, timeout_s: float = 40.0, detail=None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if check():
                return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s" + (f" ({detail()})" if detail else ""))


def _positions(cluster: dev.LocalCluster, owner: str, pchannel: str) -> str:
    """The owner's last LSN and each replica's durable LSN, as its metrics say."""
    with contextlib.suppress(OSError):
        samples = _metrics(cluster, owner)
        return ", ".join(
            f"{name} {dict(labels).get('replica', '')}={value:g}".replace(" =", "=")
            for (name, labels), value in sorted(samples.items(), key=str)
            if name in ("raftwal_wal_last_lsn", "raftwal_wal_replica_durable_lsn")
            and dict(labels).get("pchannel") == pchannel
        )
    return f"no metrics from {owner}"


_runs = iter(range(1_000_000))


def _replicas(client: Api, pchannel: str, owner: str) -> list[str]:
    for channel in client.status().pchannels:
        if channel.name == pchannel:
            return [n for n in channel.replica_node_ids if n != owner]
    raise AssertionError(f"{pchannel} not in the status")


def _offer(address: str) -> wire.OpenAppendResponse:
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.ReplicationStub(channel)
        return stub.OpenAppend(wire.OpenAppendRequest(owner_node_id="n9"), timeout=CALL_TIMEOUT_S)


def _exchange(address: str, port: int, data: bytes) -> bytes:
    """Send `data` to the transfer port; everything the node answers until it closes."""
    host = segment_transfer.transfer_host(address)
    received = b""
    with socket.create_connection((host, port), timeout=scaled(15)) as sock:
        sock.sendall(data)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    return received


def _check_history(history: History, entries: list[wire.WalEntry]) -> None:
    by_payload: dict[bytes, list[int]] = {}
    for entry in entries:
        by_payload.setdefault(entry.payload, []).append(entry.lsn)
    assert [e.lsn for e in entries] == sorted({e.lsn for e in entries})
    for acked in history.acked:
        assert by_payload.get(acked.payload) == [acked.lsn], (
            f"acknowledged {acked.payload!r} at lsn {acked.lsn}, consumed at "
            f"{by_payload.get(acked.payload)}"
        )


def test_replication_goes_over_the_transfer_port(cluster_and_client) -> None:
    cluster, client = cluster_and_client
    (pchannel,) = setup_channels(client, "apport", {"ap_v": 0})
    owner, _, _ = wait_assigned(client, pchannel)
    producer = Producer(client, pchannel, "apport")
    history = History()
    try:
        for k in range(20):
            assert producer.send("ap_v", [b"ap-%d-%d" % (k, i) for i in range(50)], history)
    finally:
        producer.close()
    replicas = _replicas(client, pchannel, owner)
    assert len(replicas) == 2
    for replica in replicas:
        _wait(
            f"{replica} caught up",
            lambda r=replica: _replica_caught_up(cluster, owner, pchannel, r),
        )
        assert _port_count(cluster, replica, "appends") >= 1, f"{replica}: no append connection"
    entries = consume_all(client, "ap_v", pchannel, expect=len(history.acked))
    _check_history(history, entries)


def test_unknown_and_used_tickets_are_refused(cluster_and_client) -> None:
    cluster, client = cluster_and_client
    node = cluster.config.nodes[1]
    # Its data worker serves Replication (and its transfer port is the node's).
    address = cluster.worker_addresses(node.id)[0]
    offer = _offer(address)
    assert len(offer.ticket) == segment_transfer.TICKET_BYTES
    assert offer.port == node.transfer_port and offer.max_frame_bytes == MAX_FRAME_BYTES
    refused = _port_count(cluster, node.id, "refused")
    appends = _port_count(cluster, node.id, "appends")
    # A request that would be written if it were parsed follows the hello each time.
    request = wire.AppendRequest(pchannel="nope", term=1, request_id=1, owner_node_id="n9")
    frame = append_stream.frame(request.SerializeToString())
    unknown = append_stream.HELLO + secrets.token_bytes(segment_transfer.TICKET_BYTES)
    assert _exchange(address, offer.port, unknown + frame) == segment_transfer.REFUSED
    # Used once (accepted), then refused.
    answer = _exchange(address, offer.port, append_stream.HELLO + offer.ticket)
    assert answer == segment_transfer.ACCEPTED
    again = append_stream.HELLO + offer.ticket + frame
    assert _exchange(address, offer.port, again) == segment_transfer.REFUSED
    assert _port_count(cluster, node.id, "refused") == refused + 2
    assert _port_count(cluster, node.id, "appends") == appends + 1


def test_a_frame_over_the_cap_or_not_a_request_closes_the_connection(cluster_and_client) -> None:
    cluster, client = cluster_and_client
    node = cluster.config.nodes[2]
    address = cluster.worker_addresses(node.id)[0]
    for body in (append_stream.LENGTH.pack(MAX_FRAME_BYTES + 1), append_stream.frame(b"\xff" * 9)):
        offer = _offer(address)
        started = time.monotonic()
        answer = _exchange(address, offer.port, append_stream.HELLO + offer.ticket + body)
        # Accepted, then closed without an answer, long before the idle timeout.
        assert answer == segment_transfer.ACCEPTED
        assert time.monotonic() - started < append_stream.IDLE_TIMEOUT_S / 2
    # The node still serves.
    assert _offer(address).ticket


def test_owner_stream_recovers_from_a_killed_and_a_paused_replica(cluster_and_client) -> None:
    cluster, client = cluster_and_client
    # Names of their own, so that `./run test --repeat N` can run it again on the cluster.
    run = next(_runs)
    vchannel = f"af{run}_v"
    (pchannel,) = setup_channels(client, f"apfault{run}", {vchannel: 0})
    owner, term, _ = wait_assigned(client, pchannel)
    replicas = _replicas(client, pchannel, owner)
    rng = random.Random(SEED + run)
    killed = rng.choice(replicas)
    paused = next(r for r in replicas if r != killed)
    producer = Producer(client, pchannel, f"apfault{run}")
    history = History()
    stop = threading.Event()
    counter = iter(range(10_000_000))

    def produce() -> None:
        deadline = time.monotonic() + scaled(180)
        while not stop.is_set() and time.monotonic() < deadline:
            producer.send(vchannel, [b"af-%07d" % next(counter) for _ in range(20)], history)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        _wait("first acknowledgements", lambda: len(history.acked) >= 100)
        # kill -9 a replica mid-stream, then restart it.
        cluster.kill(killed)
        acked = len(history.acked)
        _wait("writes go on without the killed replica", lambda: len(history.acked) > acked + 200)
        cluster.start_node(killed)
        killed_caught_up = _catches_up(cluster, owner, pchannel, killed)
        _wait(
            f"the restarted {killed} caught up over the port",
            lambda: _port_count(cluster, killed, "appends") >= 1 and killed_caught_up(),
            timeout_s=60,
            detail=lambda: _positions(cluster, owner, pchannel),
        )
        # Pause the other replica past both sides' idle timeout, then resume it.
        pid = cluster.pid(paused)
        assert pid is not None
        appends_before = _port_count(cluster, paused, "appends")
        dev.signal_node(pid, signal.SIGSTOP)
        try:
            acked = len(history.acked)
            time.sleep(append_stream.IDLE_TIMEOUT_S + 2)
            assert len(history.acked) > acked + 200, "writes stopped with one replica paused"
        finally:
            dev.signal_node(pid, signal.SIGCONT)
        acked = len(history.acked)
        paused_caught_up = _catches_up(cluster, owner, pchannel, paused)
        _wait(
            f"the resumed {paused} caught up",
            lambda: len(history.acked) > acked and paused_caught_up(),
            timeout_s=60,
            detail=lambda: (
                f"{len(history.acked) - acked} acknowledged since the resume; "
                + _positions(cluster, owner, pchannel)
            ),
        )
        # The owner gave the silent connection up after the idle timeout and opened a new
        # one over the port once the replica answered again.
        assert _port_count(cluster, paused, "appends") > appends_before
    finally:
        stop.set()
        thread.join(timeout=scaled(120))
        producer.close()
    assert not thread.is_alive()
    assert wait_assigned(client, pchannel)[:2] == (owner, term), "the owner changed"
    entries = consume_all(client, vchannel, pchannel, expect=len(history.acked), timeout_s=60)
    print(f"{len(history.acked)} acknowledged, {len(entries)} consumed")
    _check_history(history, entries)


def test_replication_over_grpc_when_the_port_is_off(tmp_path: Path) -> None:
    config = dev.make_config(tmp_path, 3)
    config = replace(config, nodes=tuple(replace(n, transfer_port=-1) for n in config.nodes))
    local = dev.up(tmp_path, 3, timeout_s=60, config=config)
    client = Api(local.endpoints)
    try:
        (pchannel,) = setup_channels(client, "apoff", {"ao_v": 0})
        owner, _, _ = wait_assigned(client, pchannel)
        assert not _offer(local.worker_addresses(owner)[0]).ticket
        producer = Producer(client, pchannel, "apoff")
        history = History()
        try:
            for k in range(10):
                assert producer.send("ao_v", [b"ao-%d-%d" % (k, i) for i in range(20)], history)
        finally:
            producer.close()
        for replica in _replicas(client, pchannel, owner):
            _wait(
                f"{replica} caught up over gRPC",
                lambda r=replica: _replica_caught_up(local, owner, pchannel, r),
            )
            # No transfer port: no such metric at all.
            assert _port_count(local, replica, "appends") == 0
        _check_history(history, consume_all(client, "ao_v", pchannel, expect=len(history.acked)))
    finally:
        client.close()
        local.stop_all()


def _durable(cluster: dev.LocalCluster, owner: str, pchannel: str, replica: str) -> float:
    return _metrics(cluster, owner).get(
        (
            "raftwal_wal_replica_durable_lsn",
            frozenset({("pchannel", pchannel), ("replica", replica)}),
        ),
        0.0,
    )


def test_streams_through_per_link_proxies_are_cut_by_a_partition(tmp_path: Path) -> None:
    """With every link through a proxy (the chaos suite's network), Append streams go
    through the proxy of the transfer port, so a partition cuts them: a replica cut off
    from the owner gets nothing while the other acknowledges, and catches up when healed."""
    config = dev.make_config(tmp_path, 3)
    net = ProxyNet(config.nodes)
    net.start()
    local: dev.LocalCluster | None = None
    client: Api | None = None
    try:
        config = replace(config, nodes=net.configure(config.nodes))
        local = dev.up(tmp_path, 3, timeout_s=60, config=config)
        client = Api(local.endpoints)
        (pchannel,) = setup_channels(client, "approxy", {"apx_v": 0})
        owner, _, _ = wait_assigned(client, pchannel)
        producer = Producer(client, pchannel, "approxy")
        history = History()
        try:
            for k in range(5):
                assert producer.send("apx_v", [b"apx-%d-%d" % (k, i) for i in range(20)], history)
            cut, other = _replicas(client, pchannel, owner)
            for replica in (cut, other):
                _wait(
                    f"{replica} caught up",
                    lambda r=replica: _replica_caught_up(local, owner, pchannel, r),
                )
                assert _port_count(local, replica, "appends") >= 1, f"{replica}: not over the port"
            net.cut(owner, cut, "drop")
            before = _durable(local, owner, pchannel, cut)
            for k in range(5, 15):
                assert producer.send("apx_v", [b"apx-%d-%d" % (k, i) for i in range(20)], history)
            _wait(
                f"{other} caught up while {cut} is cut off",
                lambda: _replica_caught_up(local, owner, pchannel, other),
            )
            assert _durable(local, owner, pchannel, cut) == before, f"{cut} got appends"
            net.heal_all()
            _wait(
                f"{cut} caught up after the heal",
                lambda: _replica_caught_up(local, owner, pchannel, cut),
                timeout_s=60.0,
            )
        finally:
            producer.close()
        _check_history(history, consume_all(client, "apx_v", pchannel, expect=len(history.acked)))
    finally:
        if client is not None:
            client.close()
        if local is not None:
            local.stop_all()
        net.close()


def _produce_over_port(
    address: str, request: wire.ProduceRequest
) -> tuple[wire.ProduceResult, int]:
    """`request` over a Produce connection to the node at `address` (a ticket from its
    OpenProduce): its result, and the port."""
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        offer = stub.OpenProduce(wire.OpenProduceRequest(), timeout=CALL_TIMEOUT_S)
    assert len(offer.ticket) == segment_transfer.TICKET_BYTES
    assert offer.max_frame_bytes == MAX_FRAME_BYTES
    host = segment_transfer.transfer_host(address)
    with socket.create_connection((host, offer.port), timeout=scaled(15)) as sock:
        sock.sendall(
            produce_stream.HELLO + offer.ticket + append_stream.frame(request.SerializeToString())
        )
        received = b""
        while (
            len(received) < 5 or len(received) < 5 + append_stream.LENGTH.unpack(received[1:5])[0]
        ):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {received!r}"
            received += chunk
    assert received[:1] == segment_transfer.ACCEPTED
    return wire.ProduceResult.FromString(received[5:]), offer.port


def test_produce_connections_refuse_bad_frames_and_answer_good_ones(cluster_and_client) -> None:
    """A Produce connection (rpc.produce_stream) on a ticket from OpenProduce: a valid
    request is answered framed, with its positions; a frame over the cap or one that is no
    ProduceRequest gets a last result with INVALID_ARGUMENT saying so, the connection
    closes, and the node still serves."""
    cluster, client = cluster_and_client
    (pchannel,) = setup_channels(client, "ppbad", {"ppbad_v": 0})
    request = wire.ProduceRequest(
        request_id=7,
        pchannel=pchannel,
        producer_id="ppbad",
        sequence=1,
        messages=[wire.Message(vchannel="ppbad_v", payload=b"framed %d" % k) for k in range(5)],
    )
    # Bounded: the balancer may move a new pchannel once (the request is idempotent).
    for _ in range(5):
        owner, _, address = wait_assigned(client, pchannel)
        result, port = _produce_over_port(address, request)
        if result.error.code not in (E.NOT_OWNER, E.CHANNEL_FENCED):
            break
    assert result.request_id == 7 and not result.HasField("error"), result
    assert len(result.positions) == 5
    node = cluster.node(owner)
    assert port == node.transfer_port

    def offer() -> wire.OpenProduceResponse:
        with grpc.insecure_channel(address) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            return stub.OpenProduce(wire.OpenProduceRequest(), timeout=CALL_TIMEOUT_S)

    bad = {
        "over the cap": (
            append_stream.LENGTH.pack(MAX_FRAME_BYTES + 1),
            f"frame of {MAX_FRAME_BYTES + 1:,} bytes (expected at most {MAX_FRAME_BYTES:,})",
        ),
        "not a request": (
            append_stream.frame(b"\xff" * 9),
            "a frame of 9 bytes does not parse as raftwal.v1.ProduceRequest",
        ),
    }
    for what, (body, message) in bad.items():
        ticket = offer().ticket
        started = time.monotonic()
        answer = _exchange(address, port, produce_stream.HELLO + ticket + body)
        # Accepted, then one result saying what was wrong (request id 0: no request's),
        # and closed, long before the idle timeout.
        assert answer[:1] == segment_transfer.ACCEPTED, what
        (length,) = append_stream.LENGTH.unpack(answer[1:5])
        assert len(answer) == 5 + length, (what, answer)
        refused = wire.ProduceResult.FromString(answer[5:])
        assert refused.request_id == 0 and refused.error.code == E.INVALID_ARGUMENT, refused
        assert message in refused.error.message, (what, refused.error.message)
        assert time.monotonic() - started < produce_stream.IDLE_TIMEOUT_S / 10
    assert _port_count(cluster, owner, "produces") >= 3
    # The node still serves, and wrote the five messages once.
    assert offer().ticket
    entries = consume_all(client, "ppbad_v", pchannel, expect=5)
    assert [e.payload for e in entries] == [b"framed %d" % k for k in range(5)]
