"""A replicated batch forged against a standby (issue 53, item 4; docs/replication.md).

Two real one-node clusters: east (the source, plain) replicates to west, a standby with
TLS and tokens (no client certificates: a source's replicator presents none). West's
replication configuration stores the token east's replicator presents to it (west's admin
token here, since the replicator also creates west's vchannels).

- The audit's probe: with only west's **producer** token, a Produce that claims to come
  from east's replicator (`cluster_id = east`, its producer id, the standby's real
  checkpoint as `previous_sequence`, a source LSN a million ahead) is refused with
  PERMISSION_DENIED, over the gRPC call and over the transfer port's Produce stream; the
  standby's checkpoint does not move, and east's next entries still arrive. On the old
  code it was accepted, the checkpoint jumped, and nothing east wrote after it arrived.
- A target whose checkpoint is above what the source committed (here sent with the
  replication credential itself: the shape of a target that holds what this source never
  committed) is refused by the source: its recorded checkpoint (the retention hold) stays
  where the target really was, and `replicate status`, `raftwal status`'s warnings and
  `raftwal_replicate_checkpoint_mismatch` say so. On the old code the source recorded the
  claimed LSN and reported a lag of 0.

History check: every batch east acknowledged is in west's log once, in order, and
nothing the forger sent is.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftwal.cli import dev
from rpc import produce_stream
from rpc.credentials import ClientSecurity
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2 as E
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, consume_all, wait_assigned
from tests.timing import scaled, wait_for

pytestmark = pytest.mark.cluster

PCHANNEL = "fg_0"
VCHANNEL = "orders"
AHEAD = 1_000_000


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, ...]]:
    east = dev.up(tmp_path_factory.mktemp("east"), 1, timeout_s=90, cluster_id="east")
    try:
        west = dev.up(
            tmp_path_factory.mktemp("west"),
            1,
            timeout_s=90,
            cluster_id="west",
            secure=True,
            mutual_tls=False,
        )
        try:
            yield east, west
        finally:
            west.stop_all()
    finally:
        east.stop_all()


def _token(cluster: dev.LocalCluster, role: str) -> str:
    assert cluster.security is not None
    return cluster.security.token_files[role].read_text().strip()


def _as(cluster: dev.LocalCluster, role: str) -> Api:
    """A client of `cluster` holding only `role`'s token (and the CA; no certificate)."""
    assert cluster.security is not None
    return Api(
        cluster.endpoints,
        ClientSecurity(
            token=_token(cluster, role),
            tls=True,
            root_certificates=cluster.security.ca_file.read_bytes(),
        ),
    )


@pytest.fixture(scope="module")
def replicating(pair: tuple[dev.LocalCluster, ...]) -> Iterator[tuple[Api, Api]]:
    """east -> west configured on both, with a vchannel on east; (east, west admin)."""
    east, west = pair
    assert west.security is not None
    east_api, west_api = Api(east.endpoints), _as(west, "admin")
    east_api.call("CreateChannels", api.CreateChannelsRequest(names=[PCHANNEL]))
    east_api.call("CreateVChannel", api.CreateVChannelRequest(name=VCHANNEL, pchannel=PCHANNEL))
    west_api.call("CreateChannels", api.CreateChannelsRequest(names=[PCHANNEL]))
    configuration = pb.ReplicateConfiguration(
        clusters=[
            pb.ReplicateCluster(cluster_id="east", endpoints=east.endpoints, pchannels=[PCHANNEL]),
            pb.ReplicateCluster(
                cluster_id="west",
                endpoints=west.endpoints,
                pchannels=[PCHANNEL],
                credentials=pb.ReplicateCredentials(
                    token=_token(west, "admin"),
                    ca_certificate_pem=west.security.ca_file.read_text(),
                ),
            ),
        ],
        topology=[pb.ReplicateTopologyEdge(source_cluster_id="east", target_cluster_id="west")],
    )
    for client in (east_api, west_api):
        client.call(
            "UpdateReplicateConfiguration",
            api.UpdateReplicateConfigurationRequest(configuration=configuration),
        )
    try:
        yield east_api, west_api
    finally:
        east_api.close()
        west_api.close()


def _checkpoint(west_api: Api) -> int:
    """The last source LSN of east's pchannel west holds (GetReplicateCheckpoint)."""
    _, _, address = wait_assigned(west_api, PCHANNEL)
    channel = west_api.security.channel(address)
    try:
        answer = streaming_pb2_grpc.StreamingNodeStub(channel).GetReplicateCheckpoint(
            wire.GetReplicateCheckpointRequest(
                pchannel=PCHANNEL, source_cluster_id="east", source_pchannel=PCHANNEL
            ),
            timeout=scaled(10),
        )
        return int(answer.source_lsn)
    finally:
        channel.close()


def _produce_on_east(east_api: Api, history: History, count: int, tag: str) -> int:
    """`count` acknowledged entries on east; the last acknowledged LSN."""
    producer = Producer(east_api, PCHANNEL, f"app-{tag}")
    try:
        for number in range(count):
            assert producer.send(VCHANNEL, [f"{tag}.{number}".encode()], history, budget_s=60), (
                history.failed[-3:]
            )
    finally:
        producer.close()
    return history.acked[-1].lsn


def _caught_up(west_api: Api, lsn: int) -> int:
    return wait_for(
        f"west holds east's LSN {lsn}",
        lambda: (held := _checkpoint(west_api)) >= lsn and held,
        timeout_s=60,
    )


def _forged(previous: int, payload: bytes = b"forged") -> wire.ProduceRequest:
    """The audit's request: east's replicator's producer id and cluster id, the standby's
    real checkpoint as previous_sequence, a source LSN a million ahead."""
    claimed = previous + AHEAD
    return wire.ProduceRequest(
        request_id=7,
        pchannel=PCHANNEL,
        messages=[wire.Message(vchannel=VCHANNEL, payload=payload)],
        producer_id=f"rw.replicate/east/{PCHANNEL}",
        sequence=claimed,
        previous_sequence=previous,
        replicate_source=wire.ReplicateSource(
            cluster_id="east", pchannel=PCHANNEL, lsns=[claimed], time_ticks=[1]
        ),
    )


def _produce_call(client: Api, request: wire.ProduceRequest) -> wire.ProduceResult:
    _, _, address = wait_assigned(client, PCHANNEL)
    channel = client.security.channel(address)
    try:
        call = streaming_pb2_grpc.StreamingNodeStub(channel).Produce(
            iter([request]), timeout=scaled(10)
        )
        for result in call:
            return result  # type: ignore[no-any-return]
        raise AssertionError("Produce ended without a result")
    finally:
        channel.close()


def _produce_over_port(client: Api, ca_file: Path, request: wire.ProduceRequest):
    """`request` on a Produce stream of the owner's transfer port, with a ticket that
    OpenProduce gave `client`'s token: the ProduceResult, or None when no ticket."""
    _, _, address = wait_assigned(client, PCHANNEL)
    channel = client.security.channel(address)
    try:
        opened = streaming_pb2_grpc.StreamingNodeStub(channel).OpenProduce(
            wire.OpenProduceRequest(), timeout=scaled(10)
        )
    finally:
        channel.close()
    if not opened.ticket:
        return None
    host = address.rsplit(":", 1)[0]
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection((host, opened.port), timeout=scaled(10)) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(produce_stream.HELLO + opened.ticket)
        assert tls.recv(1), "the port closed the connection at the ticket"
        body = request.SerializeToString()
        tls.sendall(struct.pack(">I", len(body)) + body)
        header = b""
        while len(header) < 4:
            chunk = tls.recv(4 - len(header))
            assert chunk, "the port closed the stream without a result"
            header += chunk
        (length,) = struct.unpack(">I", header)
        data = b""
        while len(data) < length:
            chunk = tls.recv(length - len(data))
            assert chunk
            data += chunk
    return wire.ProduceResult.FromString(data)


def _west_entries(west_api: Api) -> list[wire.Entry]:
    return consume_all(west_api, VCHANNEL, PCHANNEL, expect=1_000_000, timeout_s=3)


def test_a_producer_token_cannot_forge_a_replicated_batch(
    pair: tuple[dev.LocalCluster, ...], replicating: tuple[Api, Api]
) -> None:
    east, west = pair
    assert west.security is not None
    east_api, west_api = replicating
    history = History()
    last = _produce_on_east(east_api, history, 20, "before")
    checkpoint = _caught_up(west_api, last)
    before = _west_entries(west_api)

    producer = _as(west, "producer")
    try:
        # A plain Produce with that token is refused: west is a target.
        plain = _produce_call(
            producer,
            wire.ProduceRequest(
                request_id=1,
                pchannel=PCHANNEL,
                messages=[wire.Message(vchannel=VCHANNEL, payload=b"plain")],
            ),
        )
        assert plain.error.code == E.IGNORED_OPERATION, plain
        # The forgery, over the gRPC call ...
        forged = _produce_call(producer, _forged(checkpoint))
        assert forged.error.code == E.PERMISSION_DENIED, forged
        assert "not the replicator of cluster east (got another token" in forged.error.message
        assert _token(west, "producer") not in forged.error.message
        # ... and over the transfer port (the ticket is the producer's).
        streamed = _produce_over_port(producer, west.security.ca_file, _forged(checkpoint))
        assert streamed is not None, "the transfer port gave no ticket"
        assert streamed.error.code == E.PERMISSION_DENIED, streamed
    finally:
        producer.close()
    assert _checkpoint(west_api) == checkpoint, "the standby's checkpoint moved"
    assert [e.lsn for e in _west_entries(west_api)] == [e.lsn for e in before]

    # East's next 50 entries still arrive, once each, in order.
    last = _produce_on_east(east_api, history, 50, "after")
    assert _caught_up(west_api, last) == last
    target = _west_entries(west_api)
    assert [e.payload for e in target] == [a.payload for a in history.acked]
    assert [int(e.properties["rw.src.lsn"]) for e in target] == [a.lsn for a in history.acked]
    assert all(b"forged" not in e.payload for e in target)

    status = subprocess.run(
        [sys.executable, "-m", "raftwal.cli", "replicate", "status", "--json",
         "--endpoints", ",".join(east.endpoints)],
        capture_output=True, text=True, timeout=scaled(60),
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)["pchannels"]
    assert not row["checkpoint_mismatch"], row


def _mismatch_samples(cluster: dev.LocalCluster) -> dict[tuple[str, str], float]:
    port = cluster.config.nodes[0].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(10)) as page:
        return {
            (s.labels["pchannel"], s.labels["target"]): s.value
            for family in text_string_to_metric_families(page.read().decode())
            for s in family.samples
            if s.name == "raftwal_replicate_checkpoint_mismatch"
        }


def test_the_source_refuses_a_target_checkpoint_above_what_it_committed(
    pair: tuple[dev.LocalCluster, ...], replicating: tuple[Api, Api]
) -> None:
    """Runs last: west ends up holding a checkpoint east never committed."""
    east, west = pair
    east_api, west_api = replicating
    history = History()
    last = _produce_on_east(east_api, history, 5, "mismatch")
    checkpoint = _caught_up(west_api, last)
    assert _mismatch_samples(east) == {(PCHANNEL, "west"): 0.0}
    # Sent with the replication credential itself: a target holding what this source
    # never committed (the shape of a source restored from an older copy).
    accepted = _produce_call(west_api, _forged(checkpoint, b"ahead"))
    assert accepted.error.code == E.OK, accepted
    claimed = checkpoint + AHEAD
    assert _checkpoint(west_api) == claimed

    def reported() -> dict[str, object] | None:
        done = subprocess.run(
            [sys.executable, "-m", "raftwal.cli", "replicate", "status", "--json",
             "--endpoints", ",".join(east.endpoints)],
            capture_output=True, text=True, timeout=scaled(60),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (row,) = json.loads(done.stdout)["pchannels"]
        return row if row["checkpoint_mismatch"] else None  # type: ignore[no-any-return]

    row = wait_for("east reports the mismatch", reported, timeout_s=30, interval_s=0.5)
    assert row["target_claims_lsn"] == claimed, row
    # The recorded checkpoint, east's retention hold, is not the claim.
    assert row["target_checkpoint_lsn"] <= row["source_committed_lsn"] < claimed, row
    recorded = east_api.call("GetReplicateConfiguration", api.GetReplicateConfigurationRequest())
    assert 0 < recorded.checkpoints[PCHANNEL].source_lsns["west"] <= checkpoint
    assert recorded.checkpoints[PCHANNEL].mismatched_lsns["west"] == claimed
    warnings = list(east_api.status().warnings)
    assert any(
        f"replication of pchannel {PCHANNEL} to cluster west is stopped: the target claims "
        f"to hold source LSN {claimed}" in w
        for w in warnings
    ), warnings
    assert _mismatch_samples(east) == {(PCHANNEL, "west"): 1.0}
    human = subprocess.run(
        [sys.executable, "-m", "raftwal.cli", "replicate", "status",
         "--endpoints", ",".join(east.endpoints)],
        capture_output=True, text=True, timeout=scaled(60),
    )  # fmt: skip
    assert human.returncode == 0, human.stderr
    assert "MISMATCH" in human.stdout and "is stopped" in human.stdout, human.stdout
