"""The StreamingNode API on a real three-node cluster: deliver policies and filters,
optimistic concurrency, idempotent retries, routing errors with hints, bad input answered
with an ErrorInfo (never a crash), GetLatestTimeTick, and ListSegments as of a revision."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from raftwal.services.segment_transfer import MAX_CONNECTIONS, MAX_CONNECTIONS_PER_SOURCE
from rpc import segment_transfer
from rpc.errors import from_rpc_error
from rpc.placement import serving_address
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from spark_connector import fetch
from spark_connector.options import parse_options
from spark_connector.plan import plan, snapshot
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import list_segments, setup_channels, wait_assigned
from tests.timing import scaled
from wal_segments.format import crc32c
from wal_segments.segment import SegmentReader, segment_file_name

pytestmark = pytest.mark.cluster
E = errors_pb2


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dev.LocalCluster, Api, str, str]]:
    directory: Path = tmp_path_factory.mktemp("walapi")
    environ = dict(os.environ)
    environ["RAFTWAL_SEGMENT_MAX_BYTES"] = str(16 * 1024)
    local = dev.up(directory, 3, timeout_s=60, env=environ)
    client = Api(local.endpoints)
    try:
        (pchannel,) = setup_channels(client, "api", {"api_a": 0, "api_b": 0})
        _, _, address = wait_assigned(client, pchannel)
        yield local, client, pchannel, address
    finally:
        client.close()
        local.stop_all()


def _produce(address: str, request: wire.ProduceRequest) -> wire.ProduceResult:
    with grpc.insecure_channel(address) as channel:
        results = list(
            streaming_pb2_grpc.StreamingNodeStub(channel).Produce(
                iter([request]), timeout=scaled(10)
            )
        )
    assert len(results) == 1
    return results[0]


def _consume(address: str, request: wire.ConsumeRequest, expect: int) -> list[wire.WalEntry]:
    entries: list[wire.WalEntry] = []
    with grpc.insecure_channel(address) as channel:
        stream = streaming_pb2_grpc.StreamingNodeStub(channel).Consume(request, timeout=scaled(5))
        try:
            for response in stream:
                entries.extend(response.entries)
                if len(entries) >= expect:
                    break
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        finally:
            stream.cancel()
    return entries


def _message(vchannel: str, payload: bytes, msg_type: str = "") -> wire.Message:
    return wire.Message(vchannel=vchannel, payload=payload, msg_type=msg_type)


def test_policies_filters_and_positions(env) -> None:
    _, _, pchannel, address = env
    first = _produce(
        address,
        wire.ProduceRequest(
            pchannel=pchannel,
            messages=[
                _message("api_a", b"a1"),
                _message("api_b", b"b1", "insert"),
                _message("api_a", b"a2", "delete"),
                _message("api_a", b"a3"),
            ],
        ),
    )
    assert not first.HasField("error")
    lsns = [p.lsn for p in first.positions]
    ticks = [p.time_tick for p in first.positions]
    assert lsns == list(range(lsns[0], lsns[0] + 4)) and ticks == sorted(set(ticks))
    all_a = _consume(address, wire.ConsumeRequest(vchannel="api_a"), 3)
    assert [e.payload for e in all_a][-3:] == [b"a1", b"a2", b"a3"]
    assert all(e.vchannel == "api_a" for e in all_a)
    start_from = _consume(
        address,
        wire.ConsumeRequest(vchannel="api_a", policy=wire.DELIVER_POLICY_START_FROM, lsn=lsns[2]),
        2,
    )
    assert [e.lsn for e in start_from] == [lsns[2], lsns[3]]
    start_after = _consume(
        address,
        wire.ConsumeRequest(vchannel="api_a", policy=wire.DELIVER_POLICY_START_AFTER, lsn=lsns[2]),
        1,
    )
    assert [e.lsn for e in start_after] == [lsns[3]]
    by_type = _consume(address, wire.ConsumeRequest(pchannel=pchannel, msg_types=["insert"]), 1)
    assert [e.payload for e in by_type] == [b"b1"]
    after_tick = _consume(
        address, wire.ConsumeRequest(vchannel="api_a", after_time_tick=ticks[2]), 1
    )
    assert [e.payload for e in after_tick] == [b"a3"]
    from_tick = _consume(address, wire.ConsumeRequest(vchannel="api_a", from_time_tick=ticks[2]), 2)
    assert [e.payload for e in from_tick] == [b"a2", b"a3"]
    # LATEST sees only what is committed after it connects: nothing here within the wait.
    assert (
        _consume(
            address, wire.ConsumeRequest(vchannel="api_a", policy=wire.DELIVER_POLICY_LATEST), 1
        )
        == []
    )
    with grpc.insecure_channel(address) as channel:
        latest = streaming_pb2_grpc.StreamingNodeStub(channel).GetLatestTimeTick(
            wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=scaled(5)
        )
    assert latest.last_lsn >= lsns[-1] and latest.time_tick >= ticks[-1]
    assert latest.committed_lsn >= lsns[-1]


def test_expected_last_lsn_and_idempotent_retry(env) -> None:
    _, _, pchannel, address = env
    with grpc.insecure_channel(address) as channel:
        latest = streaming_pb2_grpc.StreamingNodeStub(channel).GetLatestTimeTick(
            wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=scaled(5)
        )
    ok = _produce(
        address,
        wire.ProduceRequest(
            pchannel=pchannel,
            messages=[_message("api_a", b"cas")],
            expected_last_lsn=latest.last_lsn,
        ),
    )
    assert not ok.HasField("error") and ok.positions[0].lsn == latest.last_lsn + 1
    stale = _produce(
        address,
        wire.ProduceRequest(
            pchannel=pchannel,
            messages=[_message("api_a", b"cas-stale")],
            expected_last_lsn=latest.last_lsn,
        ),
    )
    assert stale.error.code == E.UNMATCHED_CHANNEL_TERM
    request = wire.ProduceRequest(
        pchannel=pchannel,
        messages=[_message("api_a", b"once-1"), _message("api_a", b"once-2")],
        producer_id="api-test",
        sequence=7,
    )
    original = _produce(address, request)
    again = _produce(address, request)
    assert not original.duplicate and again.duplicate
    assert [p.lsn for p in again.positions] == [p.lsn for p in original.positions]
    assert [p.time_tick for p in again.positions] == [p.time_tick for p in original.positions]
    older = wire.ProduceRequest()
    older.CopyFrom(request)
    older.sequence = 3
    # An older sequence outside the retained window: refused, never written.
    result = _produce(address, older)
    assert result.error.code == E.INVALID_REQUEST_SEQ
    entries = _consume(address, wire.ConsumeRequest(vchannel="api_a"), 100)
    assert [e.payload for e in entries].count(b"once-1") == 1


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (wire.ProduceRequest(pchannel="api_0", messages=[]), E.INVALID_ARGUMENT),
        (
            wire.ProduceRequest(pchannel="api_0", messages=[_message("nope", b"x")]),
            E.CHANNEL_NOT_EXIST,
        ),
        (
            wire.ProduceRequest(pchannel="api_0", messages=[_message("api_a", b"x", "term_start")]),
            E.INVALID_ARGUMENT,
        ),
        (
            wire.ProduceRequest(
                pchannel="api_0", messages=[_message("api_a", b"x", "no-such-type")]
            ),
            E.INVALID_ARGUMENT,
        ),
        (
            wire.ProduceRequest(pchannel="bad name!", messages=[_message("api_a", b"x")]),
            E.INVALID_ARGUMENT,
        ),
        (
            wire.ProduceRequest(pchannel="api_0", messages=[_message("api_a", b"x")] * 10_001),
            E.INVALID_ARGUMENT,
        ),
        (
            wire.ProduceRequest(
                pchannel="api_0", messages=[_message("api_a", b"x")], expected_last_lsn=-7
            ),
            E.INVALID_ARGUMENT,
        ),
        (
            wire.ProduceRequest(pchannel="missing_9", messages=[_message("api_a", b"x")]),
            E.CHANNEL_NOT_EXIST,
        ),
    ],
)
def test_bad_produce_requests_get_an_error_info(env, request_, code) -> None:
    cluster, client, pchannel, address = env
    result = _produce(address, request_)
    assert result.error.code == code, result.error
    assert result.error.message
    health = client.status()
    assert all(m.reachable for m in health.members)


@pytest.mark.parametrize("msg_type", ["seal", "term_start", "nosuch"])
def test_a_bad_msg_type_lists_only_what_a_producer_may_send(env, msg_type: str) -> None:
    _, _, _, address = env
    result = _produce(
        address,
        wire.ProduceRequest(
            pchannel="api_0", messages=[wire.Message(vchannel="api_a", msg_type=msg_type)]
        ),
    )
    assert result.error.code == E.INVALID_ARGUMENT, result.error
    expected = result.error.message.split("expected one of ", 1)[1]
    assert "message" in expected and "insert" in expected
    for internal in ("term_start", "seal", "txn_begin", "txn_commit", "txn_rollback"):
        assert internal not in expected, result.error.message


def test_routing_errors_carry_hints_and_bad_streams_fail_cleanly(env) -> None:
    cluster, client, pchannel, address = env
    owner, _, _ = wait_assigned(client, pchannel)
    nodes = client.status().nodes
    other = next(
        serving_address(nodes, n.id, pchannel) for n in cluster.config.nodes if n.id != owner
    )
    result = _produce(
        other, wire.ProduceRequest(pchannel=pchannel, messages=[_message("api_a", b"x")])
    )
    assert result.error.code == E.NOT_OWNER and result.error.owner_hint == address
    for request in (
        wire.ConsumeRequest(),
        wire.ConsumeRequest(vchannel="api_a", pchannel=pchannel),
        wire.ConsumeRequest(vchannel="api_a", msg_types=["bogus"]),
        wire.ConsumeRequest(vchannel="api_a", max_batch_entries=100_000),
        wire.ConsumeRequest(vchannel="api_a", lsn=-1),
    ):
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
            list(streaming_pb2_grpc.StreamingNodeStub(channel).Consume(request, timeout=scaled(5)))
        assert from_rpc_error(raised.value).code == E.INVALID_ARGUMENT
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
        streaming_pb2_grpc.StreamingNodeStub(channel).CommitTxn(
            wire.CommitTxnRequest(vchannel="api_a", txn_id=12345), timeout=scaled(5)
        )
    assert from_rpc_error(raised.value).code == E.TRANSACTION_EXPIRED
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
        list(
            streaming_pb2_grpc.StreamingNodeStub(channel).ReadSegment(
                wire.ReadSegmentRequest(pchannel=pchannel, segment_id=999_999), timeout=scaled(5)
            )
        )
    assert from_rpc_error(raised.value).code == E.NOT_FOUND


def test_list_segments_as_of_revision_is_repeatable(env) -> None:
    _, client, pchannel, address = env
    for index in range(40):
        _produce(
            address,
            wire.ProduceRequest(
                pchannel=pchannel, messages=[_message("api_a", b"s" * 1000 + b"%d" % index)]
            ),
        )
    # Segments are committed through Raft shortly after their seal marker commits.
    deadline = time.monotonic() + scaled(15)
    first = list_segments(client, pchannel)
    while not first.segments and time.monotonic() < deadline:
        time.sleep(0.2)
        first = list_segments(client, pchannel)
    assert first.segments, "16 KiB segments should have been sealed and committed"
    for index in range(40):
        _produce(
            address,
            wire.ProduceRequest(
                pchannel=pchannel, messages=[_message("api_b", b"t" * 1000 + b"%d" % index)]
            ),
        )
    repeat = list_segments(client, pchannel, as_of_revision=first.revision)
    assert repeat.revision == first.revision
    assert [s.SerializeToString() for s in repeat.segments] == [
        s.SerializeToString() for s in first.segments
    ]
    with pytest.raises(grpc.RpcError) as raised:
        list_segments(client, pchannel, as_of_revision=10**12)
    assert from_rpc_error(raised.value).code == E.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as raised:
        client.call("ListSegments", api.ListSegmentsRequest(pchannels=["no_such_pchannel"]))
    assert from_rpc_error(raised.value).code == E.CHANNEL_NOT_EXIST


def test_read_segment_chunks_at_frame_boundaries_with_crcs_and_offsets(env) -> None:
    _, client, pchannel, _ = env
    deadline = time.monotonic() + scaled(15)
    listed = list_segments(client, pchannel)
    while not listed.segments and time.monotonic() < deadline:
        time.sleep(0.2)
        listed = list_segments(client, pchannel)
    segment = listed.segments[0]
    nodes = client.status().nodes
    node_addresses = {n: serving_address(nodes, n, pchannel) for n in segment.replica_node_ids}
    for node_id in segment.replica_node_ids:
        for low, high, chunk_bytes in (
            (0, 0, 4096),
            (segment.first_lsn + 1, segment.last_lsn - 1, 5000),
        ):
            with grpc.insecure_channel(node_addresses[node_id]) as channel:
                chunks = list(
                    streaming_pb2_grpc.StreamingNodeStub(channel).ReadSegment(
                        wire.ReadSegmentRequest(
                            pchannel=pchannel,
                            segment_id=segment.segment_id,
                            from_lsn=low,
                            to_lsn=high,
                            max_chunk_bytes=chunk_bytes,
                            with_offsets=True,
                        ),
                        timeout=scaled(10),
                    )
                )
            assert len(chunks) > 1, "small chunks should split the segment"
            assert chunks[0].segment_digest == segment.digest
            assert chunks[0].first_lsn == (low or segment.first_lsn)
            assert chunks[-1].last_lsn == (high or segment.last_lsn)
            running = 0
            for previous, chunk in zip([None, *chunks], chunks, strict=False):
                if previous is not None:
                    assert chunk.first_lsn == previous.last_lsn + 1
                count = chunk.last_lsn - chunk.first_lsn + 1
                assert crc32c(chunk.frames) == chunk.frames_crc
                offsets = struct.unpack(f"<{count}Q", chunk.frame_offsets)
                assert offsets[0] == 0 and list(offsets) == sorted(set(offsets))
                assert offsets[-1] < len(chunk.frames)
                # A chunk exceeds the bound only when it is a single frame.
                assert len(chunk.frames) <= chunk_bytes or count == 1
                running = crc32c(chunk.frames, running)
            if not low:
                assert running == segment.digest


def _committed_segments(env) -> list:  # type: ignore[no-untyped-def]
    """The env pchannel's committed segments, producing enough to seal some if there are
    none yet (so that a test also runs alone)."""
    _, client, pchannel, address = env
    listed = list_segments(client, pchannel)
    if not listed.segments:
        for index in range(40):
            _produce(
                address,
                wire.ProduceRequest(
                    pchannel=pchannel, messages=[_message("api_a", b"b" * 1000 + b"%d" % index)]
                ),
            )
    deadline = time.monotonic() + scaled(15)
    while not listed.segments and time.monotonic() < deadline:
        time.sleep(0.2)
        listed = list_segments(client, pchannel)
    assert listed.segments, "16 KiB segments should have been sealed and committed"
    return list(listed.segments)


def _bulk_offer(address: str, request: wire.ReadSegmentRequest) -> wire.ReadSegmentResponse:
    with grpc.insecure_channel(address) as channel:
        (offer,) = list(
            streaming_pb2_grpc.StreamingNodeStub(channel).ReadSegment(request, timeout=scaled(10))
        )
    return offer


def test_read_segment_bulk_transfer_matches_the_stream_and_tickets_work_once(env) -> None:
    """A bulk ReadSegment answers one offer without frames; the transfer port then sends
    the same bytes the gRPC stream does, once per ticket. A bad hello, a used or an unknown
    ticket are refused, and the node keeps serving."""
    _, client, pchannel, _ = env
    segment = _committed_segments(env)[0]
    nodes = client.status().nodes
    node_addresses = {n: serving_address(nodes, n, pchannel) for n in segment.replica_node_ids}
    for node_id in segment.replica_node_ids:
        address = node_addresses[node_id]
        host = segment_transfer.transfer_host(address)
        for low, high in ((0, 0), (segment.first_lsn + 1, segment.last_lsn - 1)):
            request = wire.ReadSegmentRequest(
                pchannel=pchannel,
                segment_id=segment.segment_id,
                from_lsn=low,
                to_lsn=high,
                with_offsets=True,
            )
            with grpc.insecure_channel(address) as channel:
                streamed = list(
                    streaming_pb2_grpc.StreamingNodeStub(channel).ReadSegment(
                        request, timeout=scaled(10)
                    )
                )
            request.bulk = True
            offer = _bulk_offer(address, request)
            assert offer.frames == b"" and len(offer.transfer_ticket) == 32
            assert (offer.first_lsn, offer.last_lsn) == (
                streamed[0].first_lsn,
                streamed[-1].last_lsn,
            )
            assert offer.segment_digest == segment.digest
            frames = b"".join(chunk.frames for chunk in streamed)
            assert offer.transfer_bytes == len(frames)
            target = bytearray(offer.transfer_bytes)
            segment_transfer.receive(
                host, offer.transfer_port, offer.transfer_ticket, memoryview(target), 10.0
            )
            assert bytes(target) == frames
            assert crc32c(target) == offer.frames_crc
            if not low:
                assert offer.frames_crc == segment.digest
            # The offsets index the transferred bytes as the stream's index its chunks.
            offsets = struct.unpack(
                f"<{offer.last_lsn - offer.first_lsn + 1}Q", offer.frame_offsets
            )
            starts, base = [], 0
            for chunk in streamed:
                count = chunk.last_lsn - chunk.first_lsn + 1
                starts += [base + o for o in struct.unpack(f"<{count}Q", chunk.frame_offsets)]
                base += len(chunk.frames)
            assert list(offsets) == starts
            # A ticket works once.
            with pytest.raises(segment_transfer.TransferError, match="refused"):
                segment_transfer.receive(
                    host, offer.transfer_port, offer.transfer_ticket, memoryview(target), 10.0
                )
        port = offer.transfer_port
        # An unknown ticket and a wrong hello are refused with one byte; a connection that
        # sends part of a hello and goes away is dropped.
        with pytest.raises(segment_transfer.TransferError, match="refused"):
            segment_transfer.receive(host, port, b"\x07" * 32, memoryview(bytearray(10)), 10.0)
        with socket.create_connection((host, port), timeout=scaled(10)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n" + b"x" * 60)
            assert sock.recv(1) == segment_transfer.REFUSED
        with socket.create_connection((host, port), timeout=scaled(10)) as sock:
            sock.sendall(segment_transfer.HELLO[:3])
        # Still serving: a fresh offer transfers.
        request = wire.ReadSegmentRequest(
            pchannel=pchannel, segment_id=segment.segment_id, bulk=True, with_offsets=True
        )
        offer = _bulk_offer(address, request)
        target = bytearray(offer.transfer_bytes)
        segment_transfer.receive(host, port, offer.transfer_ticket, memoryview(target), 10.0)
        assert crc32c(target) == segment.digest


def test_connector_fetch_uses_the_transfer_port_and_streams_when_it_fails(
    env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Spark connector's fetch of a committed segment: by bulk transfer, the same bytes
    as the segment file; when the transfer fails in transit, the same replica streams them
    over gRPC instead, with a warning, and the read still succeeds."""
    local, client, pchannel, _ = env
    _committed_segments(env)
    options = parse_options({"endpoints": ",".join(local.endpoints), "pchannels": pchannel})
    part = next(p for p in plan(options, snapshot(options)) if p.pchannel == pchannel)
    node_id = part.replicas[part.segment_id % len(part.replicas)][0]
    data_dir = next(n.data_dir for n in local.config.nodes if n.id == node_id)
    with SegmentReader.open(
        data_dir / "wal" / pchannel / segment_file_name(part.segment_id)
    ) as on_disk:
        expected = bytes(memoryview(on_disk._buffer)[on_disk.header_len : on_disk.data_end])
    transfers: list[int] = []
    real_receive = fetch.receive

    def counted(*args: object, **kwargs: object) -> None:
        transfers.append(1)
        real_receive(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fetch, "receive", counted)
    frames = fetch._frames(part, options, part.first_lsn, part.last_lsn)
    assert transfers == [1]
    assert bytes(memoryview(frames.buffer)[: frames.end_offset]) == expected
    assert len(frames.offsets) == part.last_lsn - part.first_lsn + 1

    def broken(*_args: object, **_kwargs: object) -> None:
        raise segment_transfer.TransferError("closed the transfer after 0 of 1 bytes")

    monkeypatch.setattr(fetch, "receive", broken)
    with caplog.at_level("WARNING", logger="spark_connector.fetch"):
        frames = fetch._frames(part, options, part.first_lsn, part.last_lsn)
    assert bytes(memoryview(frames.buffer)[: frames.end_offset]) == expected
    assert "bulk transfer" in caplog.text and "streaming" in caplog.text
    # bulkTransfer=false: the gRPC stream only, no transfer tried.
    caplog.clear()
    streamed_only = parse_options(
        {"endpoints": ",".join(local.endpoints), "pchannels": pchannel, "bulkTransfer": "false"}
    )
    with caplog.at_level("WARNING", logger="spark_connector.fetch"):
        frames = fetch._frames(part, streamed_only, part.first_lsn, part.last_lsn)
    assert bytes(memoryview(frames.buffer)[: frames.end_offset]) == expected
    assert "bulk transfer" not in caplog.text


def test_transfer_port_caps_connections_before_any_ticket(env) -> None:
    """Connections that send no ticket hold at most MAX_CONNECTIONS slots, and at most
    MAX_CONNECTIONS_PER_SOURCE from one address: the next one is closed at once, and once
    they go the port serves again."""
    local, client, pchannel, _ = env
    segment = _committed_segments(env)[0]
    replica = segment.replica_node_ids[0]
    address = serving_address(client.status().nodes, replica, pchannel)
    request = wire.ReadSegmentRequest(pchannel=pchannel, segment_id=segment.segment_id, bulk=True)
    offer = _bulk_offer(address, request)
    host, port = segment_transfer.transfer_host(address), offer.transfer_port
    # Every address of 127/8 is loopback: spread the idle connections over enough of them
    # to fill the port's cap without reaching any one address's.
    sources = [
        f"127.0.0.{1 + index // MAX_CONNECTIONS_PER_SOURCE}" for index in range(MAX_CONNECTIONS)
    ]
    idle = [
        socket.create_connection((host, port), timeout=scaled(10), source_address=(source, 0))
        for source in sources
    ]

    def turned_away(source: str) -> None:
        with socket.create_connection(
            (host, port), timeout=scaled(10), source_address=(source, 0)
        ) as extra:
            extra.sendall(segment_transfer.HELLO + offer.transfer_ticket)
            try:
                answer = extra.recv(1)
            except ConnectionResetError:
                answer = b""
            assert answer == b"", f"a connection from {source} past a cap must be closed unanswered"

    try:
        time.sleep(0.5)  # the node has accepted them all
        turned_away("127.0.0.200")  # the port's cap
        # Room in the port again, none for an address that holds its share.
        idle.pop().close()
        time.sleep(0.5)
        turned_away("127.0.0.1")  # the address's cap
    finally:
        for sock in idle:
            sock.close()
    # The turned-away connection did not use the ticket: it still transfers.
    deadline = time.monotonic() + scaled(10)
    target = bytearray(offer.transfer_bytes)
    while True:
        try:
            segment_transfer.receive(host, port, offer.transfer_ticket, memoryview(target), 10.0)
            break
        except segment_transfer.TransferError:
            # The node may not have seen every idle connection close yet.
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert crc32c(target) == segment.digest
    # Operators see it: the node counts the connections it turned away.
    node = local.config.node(replica)
    with urllib.request.urlopen(
        f"http://{node.host}:{node.metrics_port}/metrics", timeout=scaled(10)
    ) as r:
        text = r.read().decode()
    counts = {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "raftwal_segment_transfers"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert counts["turned_away"] >= 1 and counts["served"] >= 1, counts
    assert counts["turned_away_source"] >= 1, counts


def test_transfer_port_drops_a_silent_connection(env) -> None:
    """A connection that never sends its ticket is closed after HELLO_TIMEOUT_S."""
    _, client, pchannel, _ = env
    segment = _committed_segments(env)[0]
    replica = segment.replica_node_ids[0]
    address = serving_address(client.status().nodes, replica, pchannel)
    request = wire.ReadSegmentRequest(pchannel=pchannel, segment_id=segment.segment_id, bulk=True)
    port = _bulk_offer(address, request).transfer_port
    host = segment_transfer.transfer_host(address)
    started = time.monotonic()
    with socket.create_connection(
        (host, port), timeout=segment_transfer.HELLO_TIMEOUT_S + 5
    ) as sock:
        sock.sendall(segment_transfer.HELLO)  # and no ticket
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1) == b""
    waited = time.monotonic() - started
    assert segment_transfer.HELLO_TIMEOUT_S - 0.5 <= waited < segment_transfer.HELLO_TIMEOUT_S + 5


def test_connector_reads_a_segment_in_pieces_from_the_replicas(
    env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition read from the replicas in pieces (each a ReadSegment offer and a
    transfer, the next fetched while the last is decoded) gives the rows of the local
    file read in one piece."""
    local, _, pchannel, _ = env
    _committed_segments(env)
    endpoints = ",".join(local.endpoints)
    remote = parse_options({"endpoints": endpoints, "pchannels": pchannel})
    part = next(p for p in plan(remote, snapshot(remote)) if p.pchannel == pchannel)
    dirs = ",".join(f"{n.id}={n.data_dir}" for n in local.config.nodes)
    on_disk = parse_options(
        {
            "endpoints": endpoints,
            "pchannels": pchannel,
            "preferLocal": "true",
            "localDataDirs": dirs,
        }
    )
    names = {vchannel_id: name for name, vchannel_id in snapshot(remote).vchannel_ids.items()}
    expected = pa.Table.from_batches(
        list(fetch.read_slice(part, on_disk, names, fetch.RowFilter()))
    )
    assert expected.num_rows > 6
    monkeypatch.setattr(fetch, "PIECE_ROWS", 3)
    batches = list(fetch.read_slice(part, remote, names, fetch.RowFilter()))
    assert len(batches) >= 2
    assert pa.Table.from_batches(batches, schema=expected.schema).equals(expected)
