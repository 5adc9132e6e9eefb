"""Refused large requests leave no memory behind (issue 40, item 6).

The audit had 8 clients without a token send 30 MiB CreateChannels requests for 30 s; the
node went from 128 MB to 210 MB and stayed there. Measured here, the memory was held by
reference cycles (the exception that ended each refused call keeps its frame, and with it
the request) that an idle node's cyclic GC did not collect for a long time: hundreds of
MiB, at times over 1 GiB. The node now collects cycles and trims malloc's free pages once
its resident size is 32 MiB above the smallest it had (raftwal.node.process,
_trim_memory_loop); within TRIM_RECHECK_S plus a few seconds of the flood's end it is back
within 64 MiB of where it started.

One node with tokens (the requests are refused before they are parsed) and one without
(they are refused by the servicer: command too large), plain gRPC clients.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from rpc.credentials import ClientSecurity
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from tests.processes import node_rss_bytes
from tests.timing import scaled

pytestmark = pytest.mark.cluster
CLIENTS = 8
FLOOD_S = 8.0
REQUEST_BYTES = 30 << 20
SETTLE_S = 20.0  # TRIM_RECHECK_S (10 s) and a few checks
# What may stay: with tokens the requests are never parsed and the node returns to within
# a few tens of MiB; without, about four requests' worth (~120 MiB, measured, not growing
# with further floods) stays in use after the collection (SECURITY.md).
MAX_LEFT_BYTES = {"tokens": 64 << 20, "open": 160 << 20}


def _rss_bytes(pid: int) -> int:
    # The whole node: supervisor, control process and data workers.
    return node_rss_bytes(pid)


@pytest.fixture(scope="module", params=["tokens", "open"])
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dev.LocalCluster, ClientSecurity, str]]:
    secure = request.param == "tokens"
    local = dev.up(
        tmp_path_factory.mktemp(f"refused-{request.param}"),
        1,
        timeout_s=60,
        env=dict(os.environ),
        secure=secure,
    )
    try:
        if secure:
            base = local.client_security("admin")
            # TLS and a client certificate, but no token: refused before parsing.
            security = ClientSecurity(
                token=None,
                tls=True,
                root_certificates=base.root_certificates,
                certificate_chain=base.certificate_chain,
                private_key=base.private_key,
            )
        else:
            security = ClientSecurity()
        yield local, security, request.param
    finally:
        local.stop_all()


def test_refused_large_requests_leave_no_memory_behind(node) -> None:
    local, security, mode = node
    pid = local.pid(local.config.nodes[0].id)
    assert pid is not None
    time.sleep(2.0)
    before = _rss_bytes(pid)
    big = api.CreateChannelsRequest(prefix="x" * REQUEST_BYTES, count=1)
    stop = time.monotonic() + FLOOD_S
    codes: list[grpc.StatusCode] = []

    def flood() -> None:
        with security.channel(local.endpoints[0]) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            while time.monotonic() < stop:
                try:
                    stub.CreateChannels(big, timeout=scaled(10))
                except grpc.RpcError as error:
                    codes.append(error.code())

    threads = [threading.Thread(target=flood) for _ in range(CLIENTS)]
    peak = before
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        peak = max(peak, _rss_bytes(pid))
        time.sleep(0.25)
    # Every answer is a refusal. On a loaded host a 30 MiB upload among eight may outlast
    # its deadline before the node answers: the client gave up, nothing was accepted, and
    # it still loaded the node. Most calls must be answered, though.
    refused = [c for c in codes if c != grpc.StatusCode.DEADLINE_EXCEEDED]
    assert refused and set(refused) <= {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }, set(codes)
    assert len(refused) * 2 > len(codes), f"{len(codes) - len(refused)} of {len(codes)} timed out"
    deadline = time.monotonic() + scaled(SETTLE_S)
    left = _rss_bytes(pid) - before
    while left > MAX_LEFT_BYTES[mode] and time.monotonic() < deadline:
        time.sleep(1.0)
        left = _rss_bytes(pid) - before
    print(
        f"{len(codes)} refused; node {before >> 20} MiB before, peak {peak >> 20} MiB, "
        f"{left / (1 << 20):+.0f} MiB {SETTLE_S:.0f} s after"
    )
    assert left <= MAX_LEFT_BYTES[mode], f"{left / (1 << 20):.0f} MiB left behind"
