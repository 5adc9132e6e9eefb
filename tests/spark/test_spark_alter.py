"""A real Spark read (`spark.read.format("raftwal")`) of a pchannel that moved from
`segments` to `jetstream` and back with `AlterWal` while a producer wrote: the rows are
exactly the acknowledged messages, each once, across both switches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftwal.cli import dev
from rpc.protos import coordinator_pb2 as api
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import History, Producer, wait_assigned, wait_nodes_up
from tests.natsserver import NatsServer, nats_binary
from tests.timing import scaled

PCHANNEL = "spalter_p"
VCHANNEL = "spalter_v"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[dev.LocalCluster, Api, NatsServer]]:
    if nats_binary() is None:
        pytest.skip("nats-server is not installed (scripts/install-nats.sh)")
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    local = dev.up(tmp_path_factory.mktemp("spark_alter"), 3, timeout_s=60)
    client = Api(local.endpoints)
    try:
        wait_nodes_up(client)
        yield local, client, server
    finally:
        client.close()
        local.stop_all()
        server.stop()


def _alter_and_wait(client: Api, target: str, config: dict[str, str]) -> None:
    response = client.call("AlterWal", api.AlterWalRequest(target=target, config=config))
    assert response.epoch > 0
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        status = client.status()
        if not status.HasField("wal_alter") or status.wal_alter.epoch != response.epoch:
            [channel] = [c for c in status.pchannels if c.name == PCHANNEL]
            assert channel.wal == ("" if target == "segments" else target)
            return
        time.sleep(0.1)
    raise AssertionError(f"AlterWAL to {target} did not finish")


def test_a_spark_read_across_two_switches_returns_exactly_the_acknowledged_rows(
    spark: Any, cluster
) -> None:
    local, client, nats = cluster
    client.call("CreateChannels", api.CreateChannelsRequest(names=[PCHANNEL]))
    client.call("CreateVChannel", api.CreateVChannelRequest(name=VCHANNEL, pchannel=PCHANNEL))
    wait_assigned(client, PCHANNEL)
    history = History()
    producer = Producer(client, PCHANNEL, "spark-alter")
    try:

        def produce(tag: str) -> None:
            for k in range(30):
                payloads = [f"{tag}{k}-{j}".encode() for j in range(20)]
                assert producer.send(VCHANNEL, payloads, history)

        produce("a")
        _alter_and_wait(client, "jetstream", {"url": nats.url, "stream_prefix": "SPALTER"})
        produce("b")
        _alter_and_wait(client, "segments", {})
        produce("c")
    finally:
        producer.close()
    expected = sorted((a.lsn, a.payload) for a in history.acked)
    assert len(expected) == 3 * 30 * 20
    frame = (
        spark.read.format("raftwal")
        .option("endpoints", ",".join(local.endpoints))
        .option("vchannels", VCHANNEL)
        .load()
    )
    rows = sorted((r.lsn, bytes(r.payload)) for r in frame.select("lsn", "payload").collect())
    assert rows == expected
