"""The StreamingNode API on a real three-node cluster: deliver policies and filters,
optimistic concurrency, idempotent retries, routing errors with hints, bad input answered
with an ErrorInfo (never a crash), GetLatestTimeTick, and ListSegments as of a revision."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import list_segments, setup_channels, wait_assigned
from wal_segments.format import crc32c

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
            streaming_pb2_grpc.StreamingNodeStub(channel).Produce(iter([request]), timeout=10)
        )
    assert len(results) == 1
    return results[0]


def _consume(address: str, request: wire.ConsumeRequest, expect: int) -> list[wire.WalEntry]:
    entries: list[wire.WalEntry] = []
    with grpc.insecure_channel(address) as channel:
        stream = streaming_pb2_grpc.StreamingNodeStub(channel).Consume(request, timeout=5)
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
            wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=5
        )
    assert latest.last_lsn >= lsns[-1] and latest.time_tick >= ticks[-1]
    assert latest.committed_lsn >= lsns[-1]


def test_expected_last_lsn_and_idempotent_retry(env) -> None:
    _, _, pchannel, address = env
    with grpc.insecure_channel(address) as channel:
        latest = streaming_pb2_grpc.StreamingNodeStub(channel).GetLatestTimeTick(
            wire.GetLatestTimeTickRequest(pchannel=pchannel), timeout=5
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
    other = next(e for e in cluster.endpoints if e != address)
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
            list(streaming_pb2_grpc.StreamingNodeStub(channel).Consume(request, timeout=5))
        assert from_rpc_error(raised.value).code == E.INVALID_ARGUMENT
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
        streaming_pb2_grpc.StreamingNodeStub(channel).CommitTxn(
            wire.CommitTxnRequest(vchannel="api_a", txn_id=12345), timeout=5
        )
    assert from_rpc_error(raised.value).code == E.TRANSACTION_EXPIRED
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
        list(
            streaming_pb2_grpc.StreamingNodeStub(channel).ReadSegment(
                wire.ReadSegmentRequest(pchannel=pchannel, segment_id=999_999), timeout=5
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
    deadline = time.monotonic() + 15
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
    deadline = time.monotonic() + 15
    listed = list_segments(client, pchannel)
    while not listed.segments and time.monotonic() < deadline:
        time.sleep(0.2)
        listed = list_segments(client, pchannel)
    segment = listed.segments[0]
    node_addresses = {n.node_id: n.address for n in client.status().nodes}
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
                        timeout=10,
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
