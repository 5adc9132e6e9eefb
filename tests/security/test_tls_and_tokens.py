"""Security on real clusters.

One cluster from ``raftwal dev up --secure`` (TLS on every gRPC port, client certificates
required, bearer tokens per role, node-to-node calls with the node token and node
certificates): calls without a token are UNAUTHENTICATED, roles are enforced with
PERMISSION_DENIED, each with an ErrorInfo; plaintext clients, clients that trust another CA
and clients without a certificate cannot connect; the write path (owner -> replicas over
mutual TLS with the node token) acknowledges produced messages, a consumer reads them back,
and the CLI and the Spark connector's planning work against the secure dev cluster.
The Raft transport secret is tested in test_raft_secret.py and test_raft_port.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev, devcerts
from rpc import append_stream, produce_stream, segment_transfer
from rpc.client import CoordinatorClient, PermissionDeniedError, UnauthenticatedError
from rpc.credentials import ClientSecurity
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.streaming_client import Consumer, Producer, StreamingClient
from spark_connector import fetch
from spark_connector.options import parse_options
from spark_connector.plan import ConnectorError, plan, snapshot
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import setup_channels, wait_assigned
from tests.timing import scaled
from wal_segments.format import crc32c

pytestmark = pytest.mark.cluster
E = errors_pb2
CALL_TIMEOUT_S = scaled(5.0)
CLI_TIMEOUT_S = scaled(60.0)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    directory: Path = tmp_path_factory.mktemp("secure")
    local = dev.up(directory, 3, timeout_s=60, secure=True)
    admin = Api(local.endpoints, local.client_security("admin"))
    try:
        yield local, admin
    finally:
        admin.close()
        local.stop_all()


def _security(local: dev.LocalCluster, **changes: object) -> ClientSecurity:
    """The admin's credentials with some fields replaced (a missing token, another CA...)."""
    base = local.client_security("admin")
    fields = {
        "token": base.token,
        "tls": True,
        "root_certificates": base.root_certificates,
        "certificate_chain": base.certificate_chain,
        "private_key": base.private_key,
    }
    fields.update(changes)
    return ClientSecurity(**fields)  # type: ignore[arg-type]


def _status_error(security: ClientSecurity, endpoint: str) -> grpc.RpcError:
    with security.channel(endpoint) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ClusterStatus(api.ClusterStatusRequest(), timeout=CALL_TIMEOUT_S)
    return raised.value


def test_no_token_is_unauthenticated_with_error_info(secure) -> None:
    local, _ = secure
    error = _status_error(_security(local, token=None), local.endpoints[0])
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    info = from_rpc_error(error)
    assert info.code == E.UNAUTHENTICATED
    assert "no bearer token for /raftwal.v1.Coordinator/ClusterStatus" in info.message
    unknown = _status_error(_security(local, token="x" * 32), local.endpoints[1])
    assert from_rpc_error(unknown).code == E.UNAUTHENTICATED
    assert "unknown bearer token" in from_rpc_error(unknown).message

    async def sdk() -> float:
        started = time.monotonic()
        security = _security(local, token=None)
        async with CoordinatorClient(local.endpoints, security=security) as client:
            with pytest.raises(UnauthenticatedError):
                await client.list_channels()
        return time.monotonic() - started

    # Raised at once: retrying with the same missing token cannot help.
    assert asyncio.run(sdk()) < CALL_TIMEOUT_S


def test_an_empty_bearer_token_is_named_as_such(secure) -> None:
    local, _ = secure
    security = _security(local, token=None)
    for header in ("Bearer", "Bearer   ", "bearer"):
        with security.channel(local.endpoints[0]) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                stub.ClusterStatus(
                    api.ClusterStatusRequest(),
                    timeout=CALL_TIMEOUT_S,
                    metadata=(("authorization", header),),
                )
        info = from_rpc_error(raised.value)
        assert info.code == E.UNAUTHENTICATED, header
        assert "an empty bearer token" in info.message, (header, info.message)


def test_roles_are_enforced(secure) -> None:
    local, admin = secure
    created = admin.call("CreateChannels", api.CreateChannelsRequest(prefix="sec_admin", count=1))
    assert list(created.pchannels) == ["sec_admin_0"]
    producer = Api(local.endpoints, local.client_security("producer"))
    try:
        with pytest.raises(grpc.RpcError) as raised:
            producer.call("CreateChannels", api.CreateChannelsRequest(prefix="sec_p", count=1))
    finally:
        producer.close()
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    info = from_rpc_error(raised.value)
    assert info.code == E.PERMISSION_DENIED
    assert "role producer may not call /raftwal.v1.Coordinator/CreateChannels" in info.message
    assert "expected role admin" in info.message


def test_reader_cannot_produce_producer_and_consumer_can(secure) -> None:
    local, admin = secure
    (pchannel,) = setup_channels(admin, "sec_data", {"sec_v": 0})
    _, _, owner = wait_assigned(admin, pchannel)
    with local.client_security("reader").channel(owner) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        request = wire.ProduceRequest(
            request_id=1,
            pchannel=pchannel,
            messages=[wire.Message(vchannel="sec_v", payload=b"from a reader")],
        )
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Produce(iter([request]), timeout=CALL_TIMEOUT_S))
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    info = from_rpc_error(raised.value)
    assert info.code == E.PERMISSION_DENIED
    assert "role reader may not call /raftwal.v1.StreamingNode/Produce" in info.message

    payloads = [f"secure-{k}".encode() for k in range(50)]

    async def produce_then_consume() -> tuple[list[int], list[bytes]]:
        reader = StreamingClient(local.endpoints, security=local.client_security("reader"))
        async with reader, Producer(reader, retry_timeout_s=10) as denied:
            with pytest.raises(PermissionDeniedError):
                await denied.send("sec_v", b"denied")
        writer = StreamingClient(local.endpoints, security=local.client_security("producer"))
        async with writer, Producer(writer, retry_timeout_s=30) as producer:
            # Acknowledged means durable on a majority: replicas got it over mutual TLS
            # from the owner, with the node token.
            positions = await asyncio.gather(*(producer.send("sec_v", p) for p in payloads))
        consumed: list[bytes] = []
        reading = StreamingClient(local.endpoints, security=local.client_security("consumer"))
        async with reading, Consumer(reading, "sec_v", retry_timeout_s=30) as consumer:
            async with asyncio.timeout(30):
                async for entry in consumer:
                    consumed.append(entry.payload)
                    if len(consumed) >= len(payloads):
                        break
        return [p.lsn for p in positions], consumed

    lsns, consumed = asyncio.run(produce_then_consume())
    assert lsns == sorted(lsns) and len(set(lsns)) == len(payloads)
    assert consumed == payloads
    status = admin.status()
    assert not [w for w in status.warnings if "unreachable" in w], status.warnings
    owners = [o for m in status.members for o in m.owners if o.pchannel == pchannel]
    assert owners and owners[0].committed_lsn >= max(lsns)
    replicated = [r for r in owners[0].replicas if r.durable_lsn >= max(lsns)]
    assert replicated, owners[0]


def test_plaintext_wrong_ca_and_missing_client_cert_cannot_connect(secure, tmp_path) -> None:
    local, _ = secure
    endpoint = local.endpoints[0]
    admin_token = local.client_security("admin").token
    # Plaintext, even with a valid token in the metadata: the TLS port does not speak it.
    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as raised:
        coordinator_pb2_grpc.CoordinatorStub(channel).ClusterStatus(
            api.ClusterStatusRequest(),
            timeout=CALL_TIMEOUT_S,
            metadata=(("authorization", f"Bearer {admin_token}"),),
        )
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    # Trusting another CA: the node's certificate does not verify.
    other = devcerts.generate(tmp_path, ["n1"])
    wrong_ca = _status_error(
        _security(local, root_certificates=other.ca_file.read_bytes()), endpoint
    )
    assert wrong_ca.code() == grpc.StatusCode.UNAVAILABLE
    # Mutual TLS is required: no client certificate, or one from another CA, is refused.
    no_cert = _status_error(_security(local, certificate_chain=None, private_key=None), endpoint)
    assert no_cert.code() == grpc.StatusCode.UNAVAILABLE
    foreign_cert = _status_error(
        _security(
            local,
            certificate_chain=other.client_cert_file.read_bytes(),
            private_key=other.client_key_file.read_bytes(),
        ),
        endpoint,
    )
    assert foreign_cert.code() == grpc.StatusCode.UNAVAILABLE
    # The same call with the right credentials works, so the refusals were about them.
    with local.client_security("reader").channel(endpoint) as channel:
        coordinator_pb2_grpc.CoordinatorStub(channel).ClusterStatus(
            api.ClusterStatusRequest(), timeout=CALL_TIMEOUT_S
        )


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAFTWAL_")}
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
        env={**environ, **(env or {})},
    )


def test_cli_against_the_secure_dev_cluster(secure) -> None:
    local, _ = secure
    done = _cli("status", "--json", "--dev-dir", str(local.directory))
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    # Every member answered CollectStatus: node-to-node calls work over mutual TLS.
    assert [m["reachable"] for m in status["members"]] == [True, True, True]
    assert status["leader_node_id"]
    reader_token = local.security.token_files["reader"]  # type: ignore[union-attr]
    denied = _cli(
        "channel",
        "create",
        "--count",
        "1",
        "--prefix",
        "sec_cli",
        "--dev-dir",
        str(local.directory),
        env={"RAFTWAL_TOKEN_FILE": str(reader_token)},
    )
    assert denied.returncode == 1
    assert "PERMISSION_DENIED: role reader may not call" in denied.stderr
    plain = _cli("status", "--endpoints", ",".join(local.endpoints), "--timeout-s", "2")
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr, plain.stderr


def test_spark_connector_plans_with_credentials(secure) -> None:
    local, admin = secure
    setup_channels(admin, "sec_spark", {"sec_spark_v": 0})
    files = local.security
    assert files is not None
    credentials = {
        "tlsCaFile": str(files.ca_file),
        "tlsCertFile": str(files.client_cert_file),
        "tlsKeyFile": str(files.client_key_file),
    }
    endpoints = ",".join(local.endpoints)
    planned = snapshot(
        parse_options(
            {"endpoints": endpoints, "tokenFile": str(files.token_files["reader"]), **credentials}
        )
    )
    assert "sec_spark_v" in planned.vchannel_ids
    with pytest.raises(ConnectorError, match="UNAUTHENTICATED: no bearer token"):
        snapshot(parse_options({"endpoints": endpoints, **credentials}))


def test_replication_goes_over_the_transfer_port_with_tls(secure) -> None:
    """Owners replicate over their replicas' transfer ports with TLS, mutual TLS and a
    ticket from the token-checked OpenAppend; a plaintext hello gets nothing."""
    local, admin = secure
    (pchannel,) = setup_channels(admin, "sec_repl", {"sec_repl_v": 0})
    owner_id, _, _ = wait_assigned(admin, pchannel)
    payloads = [f"replicated-{k}".encode() for k in range(200)]

    async def produce() -> list[int]:
        writer = StreamingClient(local.endpoints, security=local.client_security("producer"))
        async with writer, Producer(writer, retry_timeout_s=30) as producer:
            positions = await asyncio.gather(*(producer.send("sec_repl_v", p) for p in payloads))
        return [p.lsn for p in positions]

    last = max(asyncio.run(produce()))
    replicas = [
        n
        for c in admin.status().pchannels
        if c.name == pchannel
        for n in c.replica_node_ids
        if n != owner_id
    ]
    assert len(replicas) == 2
    deadline = time.monotonic() + scaled(30)
    while True:
        owners = [o for m in admin.status().members for o in m.owners if o.pchannel == pchannel]
        durable = {r.node_id: r.durable_lsn for r in owners[0].replicas} if owners else {}
        if all(durable.get(r, 0) >= last for r in replicas):
            break
        assert time.monotonic() < deadline, f"replicas at {durable}, expected >= {last}"
        time.sleep(0.2)
    for replica in replicas:
        node = local.node(replica)
        url = f"http://{node.host}:{node.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=scaled(10)) as response:
            text = response.read().decode()
        assert 'raftwal_segment_transfers_total{outcome="appends"}' in text
        appends = next(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith('raftwal_segment_transfers_total{outcome="appends"}')
        )
        assert appends >= 1, f"{replica}: no append connection over TLS"
        # Plaintext: the node expects a TLS handshake and answers no status byte.
        host = segment_transfer.transfer_host(node.grpc_address)
        with socket.create_connection((host, node.transfer_port), timeout=scaled(10)) as sock:
            sock.sendall(append_stream.HELLO + os.urandom(segment_transfer.TICKET_BYTES))
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                answer = sock.recv(16)
                assert answer not in (segment_transfer.ACCEPTED, segment_transfer.REFUSED)


def test_producers_stream_over_the_transfer_port_with_tls(secure) -> None:
    """A producer's batches go to the owner's transfer port with TLS and mutual TLS, on a
    ticket from OpenProduce, which takes a producer's credentials: a reader's token is
    refused one, and a plaintext hello with a made-up ticket gets nothing."""
    local, admin = secure
    (pchannel,) = setup_channels(admin, "sec_pport", {"sec_pport_v": 0})
    owner_id, _, owner = wait_assigned(admin, pchannel)
    with (
        local.client_security("reader").channel(owner) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        streaming_pb2_grpc.StreamingNodeStub(channel).OpenProduce(
            wire.OpenProduceRequest(), timeout=CALL_TIMEOUT_S
        )
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (
        "may not call /raftwal.v1.StreamingNode/OpenProduce" in from_rpc_error(raised.value).message
    )
    payloads = [f"over-the-port-{k}".encode() for k in range(300)]

    async def produce_then_consume() -> tuple[list[int], list[bytes], tuple[int, int]]:
        writer = StreamingClient(local.endpoints, security=local.client_security("producer"))
        async with writer, Producer(writer, retry_timeout_s=30) as producer:
            positions = await asyncio.gather(*(producer.send("sec_pport_v", p) for p in payloads))
            streams = (producer.stats.port_streams, producer.stats.grpc_streams)
        consumed: list[bytes] = []
        reading = StreamingClient(local.endpoints, security=local.client_security("consumer"))
        async with reading, Consumer(reading, "sec_pport_v", retry_timeout_s=30) as consumer:
            async with asyncio.timeout(30):
                async for entry in consumer:
                    consumed.append(entry.payload)
                    if len(consumed) >= len(payloads):
                        break
        return [p.lsn for p in positions], consumed, streams

    lsns, consumed, (port_streams, grpc_streams) = asyncio.run(produce_then_consume())
    assert port_streams >= 1 and grpc_streams == 0, (port_streams, grpc_streams)
    assert lsns == sorted(lsns) and len(set(lsns)) == len(payloads)
    assert consumed == payloads
    node = local.node(owner_id)
    url = f"http://{node.host}:{node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=scaled(10)) as response:
        text = response.read().decode()
    produces = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith('raftwal_segment_transfers_total{outcome="produces"}')
    )
    assert produces >= 1, "no Produce connection over TLS"
    # Plaintext: the node expects a TLS handshake and answers no status byte.
    host = segment_transfer.transfer_host(node.grpc_address)
    with socket.create_connection((host, node.transfer_port), timeout=scaled(10)) as sock:
        sock.sendall(produce_stream.HELLO + os.urandom(segment_transfer.TICKET_BYTES))
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            answer = sock.recv(16)
            assert answer not in (segment_transfer.ACCEPTED, segment_transfer.REFUSED)


def test_segment_transfers_speak_tls_with_the_grpc_ports_certificates(
    secure, caplog: pytest.LogCaptureFixture
) -> None:
    """A TLS node's transfer port speaks TLS with its gRPC certificates and mutual TLS: a
    reader with the cluster's credentials gets the stream's bytes; a plaintext connection
    and one without a client certificate get nothing, and their tickets still work; the
    connector's fetch goes over it."""
    local, admin = secure
    (pchannel,) = setup_channels(admin, "sec_bulk", {"sec_bulk_v": 0})
    _, _, owner = wait_assigned(admin, pchannel)
    with local.client_security("producer").channel(owner) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        request = wire.ProduceRequest(
            request_id=1,
            pchannel=pchannel,
            messages=[wire.Message(vchannel="sec_bulk_v", payload=b"p%d" % k) for k in range(20)],
        )
        (result,) = list(stub.Produce(iter([request]), timeout=CALL_TIMEOUT_S))
        assert len(result.positions) == 20, result
    last_lsn = result.positions[-1].lsn
    with local.client_security("admin").channel(owner) as channel:
        sealed = streaming_pb2_grpc.StreamingNodeStub(channel).Seal(
            wire.SealRequest(pchannel=pchannel), timeout=scaled(15)
        )
    assert sealed.committed_through_lsn >= last_lsn
    listed = admin.call("ListSegments", api.ListSegmentsRequest(pchannels=[pchannel]))
    segment = listed.segments[0]
    reader = local.client_security("reader")

    def read(bulk: bool) -> list[wire.ReadSegmentResponse]:
        with reader.channel(owner) as channel:
            return list(
                streaming_pb2_grpc.StreamingNodeStub(channel).ReadSegment(
                    wire.ReadSegmentRequest(
                        pchannel=pchannel, segment_id=segment.segment_id, bulk=bulk
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
            )

    frames = b"".join(chunk.frames for chunk in read(False))
    assert crc32c(frames) == segment.digest
    (offer,) = read(True)
    assert offer.frames == b"" and len(offer.transfer_ticket) == 32
    host, port = segment_transfer.transfer_host(owner), offer.transfer_port
    target = bytearray(offer.transfer_bytes)
    # Plaintext, and TLS without the client certificate: no bytes, and the ticket is
    # not used up.
    with pytest.raises(segment_transfer.TransferError):
        segment_transfer.receive(host, port, offer.transfer_ticket, memoryview(target), 5.0)
    no_client_cert = _security(local, certificate_chain=None, private_key=None)
    with pytest.raises(segment_transfer.TransferError):
        segment_transfer.receive(
            host,
            port,
            offer.transfer_ticket,
            memoryview(target),
            5.0,
            segment_transfer.client_tls(no_client_cert),
        )
    segment_transfer.receive(
        host,
        port,
        offer.transfer_ticket,
        memoryview(target),
        CALL_TIMEOUT_S,
        segment_transfer.client_tls(reader),
    )
    assert bytes(target) == frames
    # The Spark connector's fetch, with the reader's credentials as Spark options.
    files = local.security
    assert files is not None
    options = parse_options(
        {
            "endpoints": ",".join(local.endpoints),
            "pchannels": pchannel,
            "tokenFile": str(files.token_files["reader"]),
            "tlsCaFile": str(files.ca_file),
            "tlsCertFile": str(files.client_cert_file),
            "tlsKeyFile": str(files.client_key_file),
        }
    )
    part = next(p for p in plan(options, snapshot(options)) if p.segment_id == segment.segment_id)
    failures: list[str] = []
    with caplog.at_level("WARNING", logger="spark_connector.fetch"):
        fetched = fetch._remote_frames(part, options, part.first_lsn, part.last_lsn, failures)
    assert fetched is not None and not failures, failures
    assert "bulk transfer" not in caplog.text, "the fetch fell back to the gRPC stream"
    assert "replica" in fetched.source
    assert bytes(memoryview(fetched.buffer)[: fetched.end_offset]) == frames
