"""Bad requests on every method of every service, as an attacker sends them: raw bytes over
grpc's generic API, no client library of ours.

- A body that is not the request message, and a request whose string field holds invalid
  UTF-8, get INVALID_ARGUMENT with an ErrorInfo on every method (enumerated from the
  service descriptors), the streaming ones included; the nodes stay SERVING.
- Names that could become paths ('.', '..', hidden names, separators) are refused with
  the rule in the message, and nothing appears in the data directories.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2
from tests.timing import scaled

pytestmark = pytest.mark.cluster

CALL_TIMEOUT_S = scaled(5.0)
SERVICES = [
    api.DESCRIPTOR.services_by_name[name] for name in ("Coordinator", "NodeManager", "Cluster")
] + [streaming_pb2.DESCRIPTOR.services_by_name[name] for name in ("StreamingNode", "Replication")]
METHODS = [method for service in SERVICES for method in service.methods]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _bad_bodies(method: MethodDescriptor) -> dict[str, bytes]:
    bodies = {"not a message": b"\xff\xff\xff\xff\x0f\x08"}
    strings = [f for f in method.input_type.fields if f.type == FieldDescriptor.TYPE_STRING]
    if strings:
        tag = _varint(strings[0].number << 3 | 2)
        bodies["invalid utf-8"] = tag + _varint(2) + b"\xff\xfe"
    return bodies


def _call(channel: grpc.Channel, method: MethodDescriptor, body: bytes) -> grpc.RpcError:
    path = f"/{method.containing_service.full_name}/{method.name}"
    kind = (method.client_streaming, method.server_streaming)
    with pytest.raises(grpc.RpcError) as raised:
        if kind == (False, False):
            channel.unary_unary(path)(body, timeout=CALL_TIMEOUT_S)
        elif kind == (False, True):
            list(channel.unary_stream(path)(body, timeout=CALL_TIMEOUT_S))
        elif kind == (True, False):
            channel.stream_unary(path)(iter([body]), timeout=CALL_TIMEOUT_S)
        else:
            list(channel.stream_stream(path)(iter([body]), timeout=CALL_TIMEOUT_S))
    return raised.value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    local = dev.up(tmp_path_factory.mktemp("badrequests"), 3, timeout_s=60)
    try:
        yield local
    finally:
        local.stop_all()


def test_every_method_answers_an_unparsable_body_with_invalid_argument(
    cluster: dev.LocalCluster,
) -> None:
    assert len(METHODS) >= 35
    wrong: list[str] = []
    # The node's control port (which answers the data services' calls with where to go)
    # and its data worker's port (which serves them): every method, either way.
    for endpoint in (cluster.endpoints[0], cluster.worker_addresses(cluster.config.nodes[0].id)[0]):
        with grpc.insecure_channel(endpoint) as channel:
            for method in METHODS:
                for what, body in _bad_bodies(method).items():
                    error = _call(channel, method, body)
                    info = from_rpc_error(error)
                    if (
                        error.code() != grpc.StatusCode.INVALID_ARGUMENT
                        or info.code != errors_pb2.INVALID_ARGUMENT
                        or method.input_type.full_name not in info.message
                    ) and not _not_served_here(error, method):
                        wrong.append(
                            f"{endpoint} {method.full_name} ({what}): {error.code().name} {info}"
                        )
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S
            )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert not wrong, "\n".join(wrong[:10])


def _not_served_here(error: grpc.RpcError, method) -> bool:  # type: ignore[no-untyped-def]
    """A data worker serves only StreamingNode and Replication: the coordination services
    are UNIMPLEMENTED on its port."""
    return error.code() == grpc.StatusCode.UNIMPLEMENTED and method.containing_service.name not in (
        "StreamingNode",
        "Replication",
    )


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "../../etc", "-rf"])
def test_names_that_could_become_paths_are_refused(cluster: dev.LocalCluster, name: str) -> None:
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.CreateChannels(api.CreateChannelsRequest(names=[name]), timeout=CALL_TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as vraised:
            stub.CreateVChannel(
                api.CreateVChannelRequest(name=name, pchannel="nosuch"), timeout=CALL_TIMEOUT_S
            )
    for error in (raised.value, vraised.value):
        info = from_rpc_error(error)
        assert info.code == errors_pb2.INVALID_ARGUMENT, info
        assert "a letter or digit, then letters, digits" in info.message, info.message
    for node in cluster.config.nodes:
        wal = Path(node.data_dir) / "wal"
        assert all(p.name[0].isalnum() for p in wal.iterdir()), list(wal.iterdir())
        assert not (Path(node.data_dir).parent / "etc").exists()
