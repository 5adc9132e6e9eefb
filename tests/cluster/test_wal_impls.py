"""Pchannels on each WAL implementation in a real three-node cluster, with a real
nats-server for `jetstream`: the implementation is recorded in Raft (ClusterStatus shows
it), what was acknowledged is consumed back once in LSN order, a killed owner's
pchannel recovers with all of it (`jetstream`: on another node, from the stream), and the
committed segments are listed and readable as for `segments`.

A bad implementation name or configuration is refused with INVALID_ARGUMENT and an
ErrorInfo that says what was got and what was expected."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2 as E
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import (
    History,
    Producer,
    consume_all,
    list_segments,
    wait_assigned,
    wait_nodes_up,
)
from tests.natsserver import NatsServer, nats_binary
from tests.timing import scaled


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory) -> Iterator[NatsServer]:
    if nats_binary() is None:
        pytest.skip("nats-server is not installed (scripts/install-nats.sh)")
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory, nats_server) -> Iterator[tuple[dev.LocalCluster, Api, NatsServer]]:
    with running_cluster(tmp_path_factory.mktemp("impls")) as (local, client):
        wait_nodes_up(client)
        yield local, client, nats_server


def _create(client: Api, name: str, wal: str, config: dict[str, str]) -> str:
    client.call(
        "CreateChannels", api.CreateChannelsRequest(names=[name], wal=wal, wal_config=config)
    )
    client.call("CreateVChannel", api.CreateVChannelRequest(name=f"{name}_v", pchannel=name))
    return name


def _produce(producer: Producer, vchannel: str, tag: str, batches: int, history: History):
    for k in range(batches):
        assert producer.send(vchannel, [f"{tag}-{k}-{j}".encode() for j in range(5)], history)


@pytest.mark.parametrize("wal", ["local", "jetstream"])
def test_a_pchannel_on_an_implementation_survives_its_owners_kill(env, wal: str) -> None:
    local, client, nats = env
    config = {"url": nats.url, "stream_prefix": "CT"} if wal == "jetstream" else {}
    pchannel = _create(client, f"impl_{wal}", wal, config)
    vchannel = f"{pchannel}_v"
    owner, term, _ = wait_assigned(client, pchannel)
    status = client.status()
    [channel] = [c for c in status.pchannels if c.name == pchannel]
    assert channel.wal == wal
    assert dict(channel.wal_config).get("url", "") == config.get("url", "")
    history = History()
    producer = Producer(client, pchannel, f"prod-{wal}")
    try:
        _produce(producer, vchannel, "a", 20, history)
        local.kill(owner)
        if wal == "local":
            # One copy: the pchannel comes back when its node does (whichever node then
            # owns it adopts that copy).
            local.start_node(owner)
        _produce(producer, vchannel, "b", 20, history)
    finally:
        producer.close()
        if wal == "jetstream":
            local.start_node(owner)
    new_owner, _, _ = wait_assigned(client, pchannel, min_term=term + 1)
    if wal == "jetstream":
        # The killed node was down while the pchannel moved: another node recovered it
        # from the stream.
        assert new_owner != owner
    acked = sorted(history.acked, key=lambda a: a.lsn)
    assert len(acked) == 200
    entries = consume_all(client, vchannel, pchannel, expect=len(acked), timeout_s=60)
    got = [(e.lsn, e.payload) for e in entries]
    assert got == [(a.lsn, a.payload) for a in acked], "each acknowledged once, in LSN order"
    # The new owner sealed the inherited segment; it is committed into the manifest as for
    # segments, held by the node that wrote it.
    deadline = time.monotonic() + scaled(30)
    segments = []
    while time.monotonic() < deadline and not segments:
        segments = list(list_segments(client, pchannel).segments)
        time.sleep(0.2)
    assert segments and segments[0].first_lsn == 1
    assert all(len(s.replica_node_ids) == 1 for s in segments)


def test_a_bad_implementation_or_config_is_refused(env) -> None:
    _, client, _ = env
    cases = [
        (api.CreateChannelsRequest(names=["bad_a"], wal="kafka"), "unknown WAL implementation"),
        (api.CreateChannelsRequest(names=["bad_b"], wal="jetstream"), "jetstream needs url"),
        (
            api.CreateChannelsRequest(
                names=["bad_c"], wal="jetstream", wal_config={"url": "http://x"}
            ),
            "invalid jetstream url",
        ),
        (
            api.CreateChannelsRequest(names=["bad_d"], wal="local", wal_config={"a": "b"}),
            "expected none",
        ),
    ]
    for request, text in cases:
        with pytest.raises(grpc.RpcError) as raised:
            client.call("CreateChannels", request)
        info = from_rpc_error(raised.value)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.code == E.INVALID_ARGUMENT and text in info.message, info.message


def test_dev_up_with_nats_names_its_server_and_down_stops_it(tmp_path) -> None:
    """`dev up --with-nats` starts a nats-server beside the nodes and names its URL in
    cluster.json, where the CLI finds it for `channel create --wal jetstream`; `dev down`
    stops it by its pid."""
    if nats_binary() is None:
        pytest.skip("nats-server is not installed (scripts/install-nats.sh)")
    from raftwal.cli.client import resolve_target

    cluster = dev.up(tmp_path / "dev", 1, timeout_s=60, with_nats=True)
    try:
        assert cluster.nats is not None
        pid = cluster.nats["pid"]
        assert isinstance(pid, int) and dev._alive(pid)
        target = resolve_target(None, tmp_path / "dev")
        assert target.dev_nats_url == cluster.nats["url"]
        client = Api(cluster.endpoints)
        try:
            wait_nodes_up(client, count=1)
            client.call(
                "CreateChannels",
                api.CreateChannelsRequest(
                    names=["devjs"], wal="jetstream", wal_config={"url": target.dev_nats_url}
                ),
            )
            wait_assigned(client, "devjs")
        finally:
            client.close()
    finally:
        stopped = dev.down(tmp_path / "dev")
    assert pid in stopped and not dev._alive(pid)
    assert resolve_target(None, tmp_path / "dev").dev_nats_url == ""
