"""Half-sent frames on the transfer port are bounded per node (issue 40, item 2).

The audit opened six Produce streams, declared a 32 MiB frame on each and sent 29 MiB of
it: the owner grew from 124 MB to 302 MB and kept the memory until the streams closed
(the only limit was the 120 s idle cut-off *between* frames). Now every partly received
frame of every Produce and Append connection reserves its declared length in the node's
``frame_buffer_budget_bytes`` (64 MiB) when its header arrives; a frame past the budget
is refused with RESOURCE_EXHAUSTED (a last ProduceResult of request id 0) before its
bytes are read, and a frame whose body does not follow within 5 s + 1 s per 4 MiB of its
header is cut.

One node, plain sockets and the generated stubs, as the audit's probe did.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from rpc.segment_transfer import ACCEPTED
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import wait_nodes_up
from tests.processes import node_rss_bytes
from tests.timing import scaled

pytestmark = pytest.mark.cluster
E = errors_pb2
STREAMS = 6
DECLARED = 32 << 20  # the gRPC message size limit: the largest frame the node reads
SENT = 29 << 20
BUDGET = 64 << 20  # frame_buffer_budget_bytes' default
# What the node may grow by beyond the budget: the allocator's rounding of the buffers and
# the read-ahead of the refused connections (each at most 2 MiB before it is closed).
SLACK = 24 << 20


def _rss_bytes(pid: int) -> int:
    # The whole node: supervisor, control process and data workers.
    return node_rss_bytes(pid)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, str]]:
    local = dev.up(tmp_path_factory.mktemp("framebudget"), 1, timeout_s=60)
    client = Api(local.endpoints)
    try:
        wait_nodes_up(client, 1)
        # The node's data worker: it serves OpenProduce and OpenAppend, and its transfer port.
        yield local, local.worker_addresses(local.config.nodes[0].id)[0]
    finally:
        client.close()
        local.stop_all()


def _tickets(address: str) -> list[tuple[bytes, bytes, int]]:
    """(hello, ticket, port) for STREAMS connections: Produce and Append alternately (one
    budget covers both)."""
    out = []
    with grpc.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        replication = streaming_pb2_grpc.ReplicationStub(channel)
        for index in range(STREAMS):
            if index % 2:
                opened = replication.OpenAppend(
                    wire.OpenAppendRequest(owner_node_id="n9"), timeout=scaled(5)
                )
                out.append((b"RWAPPND1", opened.ticket, opened.port))
            else:
                produce = stub.OpenProduce(wire.OpenProduceRequest(), timeout=scaled(5))
                out.append((b"RWPRODC1", produce.ticket, produce.port))
    for _, ticket, port in out:
        assert len(ticket) == 32 and port > 0
    return out


def _half_send(host: str, hello: bytes, ticket: bytes, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=scaled(10))
    sock.sendall(hello + ticket)
    assert sock.recv(1) == ACCEPTED
    sock.sendall(struct.pack(">I", DECLARED))
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(SENT // len(chunk)):
            sock.sendall(chunk)
    except OSError:
        pass  # refused: the node closed the connection at the header
    return sock


def _closed_by_node(sock: socket.socket, timeout_s: float) -> tuple[bool, bytes]:
    """(whether the node closed the connection within `timeout_s`, what it sent)."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True, received
            received += data
    except TimeoutError:
        return False, received
    except OSError:
        return True, received


def test_six_half_sent_frames_stay_within_the_budget_and_are_cut(node) -> None:
    local, address = node
    pid = local.pid(local.config.nodes[0].id)
    assert pid is not None
    host = address.rpartition(":")[0]
    tickets = _tickets(address)
    time.sleep(1.0)
    before = _rss_bytes(pid)
    sockets: list[socket.socket] = []
    threads = []
    for hello, ticket, port in tickets:
        # One after the other, as the budget fills (each connection's bytes are in the
        # node once sendall returned).
        holder: list[socket.socket] = []
        thread = threading.Thread(
            target=lambda h=hello, t=ticket, p=port, out=holder: out.append(
                _half_send(host, h, t, p)
            )
        )
        thread.start()
        thread.join(60)
        threads.append(thread)
        sockets.extend(holder)
    time.sleep(1.0)
    grown = _rss_bytes(pid) - before
    print(f"node grew {grown / (1 << 20):.1f} MiB for {STREAMS} half-sent frames of 29 MiB")
    assert len(sockets) == STREAMS
    assert grown <= BUDGET + SLACK, f"node grew {grown / (1 << 20):.1f} MiB"

    # Past the budget: refused at the header, a Produce connection with RESOURCE_EXHAUSTED.
    refused = [(i, _closed_by_node(s, 2.0)) for i, s in enumerate(sockets)]
    closed_early = [i for i, (closed, _) in refused if closed]
    assert len(closed_early) == STREAMS - BUDGET // DECLARED, refused
    for index in closed_early:
        if tickets[index][0] == b"RWPRODC1":
            received = refused[index][1][1]
            (length,) = struct.unpack(">I", received[:4])
            result = wire.ProduceResult.FromString(received[4 : 4 + length])
            assert result.request_id == 0 and result.error.code == E.RESOURCE_EXHAUSTED, result
            assert "frame_buffer_budget_bytes" in result.error.message
    # The ones that fit stall mid-frame: cut within 5 s + 32 MiB at 4 MiB/s = 13 s.
    stalled = [s for i, s in enumerate(sockets) if i not in closed_early]
    started = time.monotonic()
    for sock in stalled:
        closed, _ = _closed_by_node(sock, max(0.1, 20.0 - (time.monotonic() - started)))
        assert closed, "a stalled frame was not cut within 20 s"
    for sock in sockets:
        sock.close()
