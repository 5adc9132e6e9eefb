"""Raw-gRPC helpers for WAL cluster tests: find the owner, produce with an idempotent
producer id, consume everything committed, and record what was acknowledged.

Every loop is bounded in attempts and time. The history (`History`) is what the checks
compare against: a message counts as acknowledged only when a ProduceResult with its
positions came back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc

from rpc.errors import from_rpc_error
from rpc.placement import serving_address
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api
from tests.timing import scaled

E = errors_pb2


def wait_assigned(
    client: Api, pchannel: str, *, min_term: int = 0, timeout_s: float = 40.0
) -> tuple[str, int, str]:
    """(owner node id, term, the address serving `pchannel` on its owner: the owner's
    data worker for it) once `pchannel` is ASSIGNED at >= min_term."""
    deadline = time.monotonic() + scaled(timeout_s)
    last: object = None
    attempt = 0
    while time.monotonic() < deadline:
        # One short call per endpoint in turn: a stopped node must not eat the budget.
        endpoint = client.endpoints[attempt % len(client.endpoints)]
        attempt += 1
        try:
            status = client.stub(endpoint).ClusterStatus(
                api.ClusterStatusRequest(consistency=api.CONSISTENCY_LINEARIZABLE),
                timeout=scaled(3),
            )
        except grpc.RpcError as error:
            last = error.code()
            time.sleep(0.1)
            continue
        for channel in status.pchannels:
            if (
                channel.name == pchannel
                and channel.state == pb.PCHANNEL_STATE_ASSIGNED
                and channel.term >= min_term
            ):
                address = serving_address(status.nodes, channel.owner_node_id, pchannel)
                return channel.owner_node_id, channel.term, address
            if channel.name == pchannel:
                last = (channel.state, channel.term, channel.owner_node_id)
        time.sleep(0.2)
    raise AssertionError(
        f"{pchannel} not ASSIGNED at term >= {min_term} within {timeout_s} s: {last}"
    )


def wait_nodes_up(client: Api, count: int = 3, timeout_s: float = 40.0) -> None:
    """Until `count` nodes are UP in the coordination state (a pchannel created while a
    node is DOWN gets a smaller replica set)."""
    deadline = time.monotonic() + scaled(timeout_s)
    attempt = 0
    up = 0
    while time.monotonic() < deadline:
        endpoint = client.endpoints[attempt % len(client.endpoints)]
        attempt += 1
        try:
            status = client.stub(endpoint).ClusterStatus(
                api.ClusterStatusRequest(), timeout=scaled(3)
            )
        except grpc.RpcError:
            time.sleep(0.1)
            continue
        up = sum(1 for n in status.nodes if n.state == pb.NODE_STATE_UP)
        if up >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"only {up} nodes UP after {timeout_s} s (expected {count})")


def setup_channels(client: Api, pchannel_prefix: str, vchannels: dict[str, int]) -> list[str]:
    """Create pchannels `<prefix>_<k>` and vchannels {name: pchannel index}."""
    wait_nodes_up(client)
    count = max(vchannels.values()) + 1
    created = client.call(
        "CreateChannels", api.CreateChannelsRequest(prefix=pchannel_prefix, count=count)
    )
    names = list(created.pchannels)
    for vchannel, index in vchannels.items():
        client.call(
            "CreateVChannel", api.CreateVChannelRequest(name=vchannel, pchannel=names[index])
        )
    return names


@dataclass
class Acked:
    lsn: int
    time_tick: int
    payload: bytes


@dataclass
class History:
    acked: list[Acked] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)

    def payloads(self) -> set[bytes]:
        return {a.payload for a in self.acked}


class Producer:
    """One idempotent producer on one pchannel: each batch is retried with the same
    sequence (at the current owner) until acknowledged or the time budget runs out."""

    def __init__(self, client: Api, pchannel: str, producer_id: str) -> None:
        self.client = client
        self.pchannel = pchannel
        self.producer_id = producer_id
        self.sequence = 0
        self.owner_address = ""
        self._channels: dict[str, grpc.Channel] = {}

    def _stub(self, address: str) -> streaming_pb2_grpc.StreamingNodeStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self.client.security.channel(address)
        return streaming_pb2_grpc.StreamingNodeStub(channel)

    def produce_once(
        self, request: wire.ProduceRequest, address: str, timeout_s: float
    ) -> wire.ProduceResult:
        results = list(self._stub(address).Produce(iter([request]), timeout=timeout_s))
        assert len(results) == 1, results
        return results[0]

    def send(
        self, vchannel: str, payloads: list[bytes], history: History, *, budget_s: float = 30.0
    ) -> bool:
        self.sequence += 1
        request = wire.ProduceRequest(
            request_id=self.sequence,
            pchannel=self.pchannel,
            messages=[wire.Message(vchannel=vchannel, payload=p) for p in payloads],
            producer_id=self.producer_id,
            sequence=self.sequence,
        )
        deadline = time.monotonic() + scaled(budget_s)
        attempts = 0
        while time.monotonic() < deadline and attempts < 500:
            attempts += 1
            if not self.owner_address:
                try:
                    _, _, self.owner_address = wait_assigned(
                        self.client, self.pchannel, timeout_s=max(1.0, deadline - time.monotonic())
                    )
                except AssertionError:
                    break
            try:
                result = self.produce_once(request, self.owner_address, timeout_s=10)
            except grpc.RpcError as error:
                info = from_rpc_error(error)
                history.failed.append((self.sequence, f"{error.code()}: {info.message}"))
                self.owner_address = ""
                time.sleep(0.1)
                continue
            if result.HasField("error") and result.error.code != E.OK:
                history.failed.append((self.sequence, result.error.message))
                self.owner_address = result.error.owner_hint or ""
                time.sleep(0.05)
                continue
            assert len(result.positions) == len(payloads)
            for position, payload in zip(result.positions, payloads, strict=True):
                history.acked.append(Acked(position.lsn, position.time_tick, payload))
            return True
        return False

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def consume_all(
    client: Api, vchannel: str, pchannel: str, *, expect: int, timeout_s: float = 30.0
) -> list[wire.WalEntry]:
    """Every committed entry of `vchannel` from the beginning, once at least `expect`
    arrived (or the time budget ends): re-routes to the current owner on errors."""
    deadline = time.monotonic() + scaled(timeout_s)
    entries: list[wire.WalEntry] = []
    while time.monotonic() < deadline and len(entries) < expect:
        _, _, address = wait_assigned(
            client, pchannel, timeout_s=max(1.0, deadline - time.monotonic())
        )
        request = wire.ConsumeRequest(
            vchannel=vchannel,
            policy=wire.DELIVER_POLICY_START_AFTER if entries else wire.DELIVER_POLICY_ALL,
            lsn=entries[-1].lsn if entries else 0,
        )
        channel = client.security.channel(address)
        try:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            stream = stub.Consume(request, timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            for response in stream:
                entries.extend(response.entries)
                if len(entries) >= expect:
                    stream.cancel()
                    break
        except grpc.RpcError:
            time.sleep(0.2)
        finally:
            channel.close()
    return entries


def list_segments(client: Api, pchannel: str, as_of_revision: int = 0) -> api.ListSegmentsResponse:
    return client.call(
        "ListSegments", api.ListSegmentsRequest(pchannels=[pchannel], as_of_revision=as_of_revision)
    )
