"""The replication configuration over gRPC, on a real secure dev cluster (cluster_id east):
set, read back with tokens redacted (also in WatchEvents), an idempotent repeat, a clear,
bad input answered with an ErrorInfo in the "(got ...; expected ...)" form and nothing
changed, every role but admin refused, and `raftwal replicate set/show/clear`.

History check: after every call, the configuration read back is the last one a call
acknowledged as applied (never one that was refused)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status

from raftwal.cli import dev
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2
from tests.cluster.conftest import Api, converged

pytestmark = pytest.mark.cluster

TOKEN = "west-replicator-token-0123456789"
PCHANNELS = ["east_0", "east_1"]


def _configuration(*edges: tuple[str, str], west_pchannels: int = 2) -> pb.ReplicateConfiguration:
    return pb.ReplicateConfiguration(
        clusters=[
            pb.ReplicateCluster(
                cluster_id="east", endpoints=["127.0.0.1:7201"], pchannels=PCHANNELS
            ),
            pb.ReplicateCluster(
                cluster_id="west",
                endpoints=["127.0.0.1:8201", "127.0.0.1:8202"],
                pchannels=[f"west_{k}" for k in range(west_pchannels)],
                credentials=pb.ReplicateCredentials(token=TOKEN),
            ),
        ],
        topology=[
            pb.ReplicateTopologyEdge(source_cluster_id=s, target_cluster_id=t) for s, t in edges
        ],
    )


@pytest.fixture(scope="module")
def east(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    local = dev.up(tmp_path_factory.mktemp("east"), 3, timeout_s=90, secure=True, cluster_id="east")
    try:
        yield local
    finally:
        local.stop_all()


@pytest.fixture(scope="module")
def admin(east: dev.LocalCluster) -> Iterator[Api]:
    client = Api(east.endpoints, east.client_security("admin"))
    client.call("CreateChannels", api.CreateChannelsRequest(names=PCHANNELS))
    try:
        yield client
    finally:
        client.close()


def _detail(error: grpc.RpcError) -> errors_pb2.ErrorInfo:
    """The ErrorInfo the node attached (not one synthesized from the status)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, f"no rich status: {error}"
    for detail in status.details:
        if detail.Is(errors_pb2.ErrorInfo.DESCRIPTOR):
            info = errors_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo detail in {error}")


def _get(client: Api) -> api.GetReplicateConfigurationResponse:
    return client.call("GetReplicateConfiguration", api.GetReplicateConfigurationRequest())


def _update(client: Api, configuration: pb.ReplicateConfiguration):
    return client.call(
        "UpdateReplicateConfiguration",
        api.UpdateReplicateConfigurationRequest(configuration=configuration),
    )


def _redacted(configuration: pb.ReplicateConfiguration) -> pb.ReplicateConfiguration:
    copy = pb.ReplicateConfiguration()
    copy.CopyFrom(configuration)
    for cluster in copy.clusters:
        if cluster.credentials.token:
            cluster.credentials.token = ""
            cluster.credentials.token_set = True
    return copy


def test_set_read_back_repeat_and_clear(east: dev.LocalCluster, admin: Api) -> None:
    history: list[pb.ReplicateConfiguration] = [pb.ReplicateConfiguration()]
    first = _get(admin)
    assert first.cluster_id == "east"
    assert first.configuration == pb.ReplicateConfiguration()

    forward = _configuration(("east", "west"))
    applied = _update(admin, forward)
    assert applied.changed and applied.revision > first.revision
    history.append(forward)
    answer = _get(admin)
    assert answer.configuration == _redacted(history[-1])
    assert answer.configuration.clusters[1].credentials.token_set
    assert TOKEN.encode() not in answer.SerializeToString()

    # The Get answer sent back as it is: the stored token is kept, so nothing changes.
    assert not _update(admin, answer.configuration).changed
    repeat = _update(admin, forward)
    # A repeat changes nothing; the revision it answers is the state's, which any other
    # command (a lease, a node's registration) may have moved meanwhile.
    assert not repeat.changed and repeat.revision >= applied.revision
    assert _get(admin).configuration == _redacted(history[-1])

    reverse = _configuration(("west", "east"))
    assert _update(admin, reverse).changed
    history.append(reverse)
    # Every node answers the same (serializable reads on each: the state replicated).
    status = converged(admin)
    for endpoint in east.endpoints:
        on_node = admin.call(
            "GetReplicateConfiguration",
            api.GetReplicateConfigurationRequest(consistency=api.CONSISTENCY_SERIALIZABLE),
            endpoint=endpoint,
        )
        assert on_node.revision >= status.revision - 1
        assert on_node.configuration == _redacted(history[-1])

    # The history of the changes never carries the token either.
    stream = admin.stub(east.endpoints[0]).WatchEvents(
        api.WatchEventsRequest(from_revision=1, kinds=["replicate_configuration_updated"]),
        timeout=10,
    )
    seen: list[pb.ReplicateConfiguration] = []
    for batch in stream:
        assert TOKEN.encode() not in batch.SerializeToString()
        seen += [e.replicate_configuration_updated.configuration for e in batch.events]
        if len(seen) >= 2:
            break
    stream.cancel()
    assert seen == [_redacted(c) for c in history[1:]]

    cleared = _update(admin, pb.ReplicateConfiguration())
    assert cleared.changed
    assert _get(admin).configuration == pb.ReplicateConfiguration()
    assert not _update(admin, pb.ReplicateConfiguration()).changed


def _bad_cases() -> list[tuple[str, pb.ReplicateConfiguration, int, str]]:
    not_east = _configuration(("east", "west"))
    not_east.clusters[0].cluster_id = "north"
    not_east.topology[0].source_cluster_id = "north"
    missing = _configuration(("east", "west"))
    missing.clusters[0].pchannels[1] = "east_9"
    # token_set on east, for which no token is stored (only west has one).
    from_answer = _redacted(_configuration(("east", "west")))
    from_answer.clusters[0].credentials.token_set = True
    bad_endpoint = _configuration()
    bad_endpoint.clusters[1].endpoints.append("no port here")
    return [
        ("cycle", _configuration(("east", "west"), ("west", "east")), errors_pb2.INVALID_ARGUMENT, "cycle (east -> west -> east"),
        ("counts", _configuration(("east", "west"), west_pchannels=3), errors_pb2.INVALID_ARGUMENT, "cluster 'west' has 3 pchannels (got 3; expected 2"),
        ("not this cluster", not_east, errors_pb2.INVALID_ARGUMENT, "this cluster ('east') is not in the configuration (got clusters north, west"),
        ("missing pchannel", missing, errors_pb2.CHANNEL_NOT_EXIST, "'east_9' does not exist"),
        ("a token not stored", from_answer, errors_pb2.INVALID_ARGUMENT, "credentials.token_set is set without a token, and no token is stored"),
        ("bad endpoint", bad_endpoint, errors_pb2.INVALID_ARGUMENT, "invalid endpoint of cluster 'west' ('no port here'; expected host:port)"),
    ]  # fmt: skip


def test_bad_configurations_get_an_error_info_and_change_nothing(admin: Api) -> None:
    acknowledged = _configuration(("east", "west"))
    _update(admin, acknowledged)
    for name, configuration, code, message in _bad_cases():
        with pytest.raises(grpc.RpcError) as raised:
            _update(admin, configuration)
        info = _detail(raised.value)
        assert raised.value.code() != grpc.StatusCode.OK
        assert info.code == code, (name, info)
        assert message in info.message, (name, info.message)
        assert TOKEN not in info.message
        assert _get(admin).configuration == _redacted(acknowledged), name
    with pytest.raises(grpc.RpcError) as raised:
        admin.call("GetReplicateConfiguration", api.GetReplicateConfigurationRequest(consistency=7))
    assert _detail(raised.value).code == errors_pb2.INVALID_ARGUMENT
    assert "invalid consistency (7; expected" in _detail(raised.value).message


@pytest.mark.parametrize("role", ["producer", "consumer", "reader"])
def test_only_admin_may_set_or_read_it(east: dev.LocalCluster, admin: Api, role: str) -> None:
    before = _get(admin)
    client = Api(east.endpoints, east.client_security(role))
    try:
        for method, request in (
            (
                "UpdateReplicateConfiguration",
                api.UpdateReplicateConfigurationRequest(configuration=pb.ReplicateConfiguration()),
            ),
            ("GetReplicateConfiguration", api.GetReplicateConfigurationRequest()),
        ):
            with pytest.raises(grpc.RpcError) as raised:
                client.call(method, request)
            assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
            info = _detail(raised.value)
            assert info.code == errors_pb2.PERMISSION_DENIED
            assert f"role {role} may not call /raftwal.v1.Coordinator/{method}" in info.message
    finally:
        client.close()
    after = _get(admin)
    assert after.configuration == before.configuration


def _cli(east: dev.LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftwal.cli", "replicate", *args, "--dev-dir", str(east.directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_sets_shows_and_clears(east: dev.LocalCluster, admin: Api, tmp_path: Path) -> None:
    token_file = tmp_path / "west.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    (tmp_path / "replicate.toml").write_text(
        f"""
[[clusters]]
id = "east"
endpoints = ["127.0.0.1:7201"]
pchannels = {json.dumps(PCHANNELS)}

[[clusters]]
id = "west"
endpoints = ["127.0.0.1:8201"]
pchannels = ["west_0", "west_1"]
token_file = "west.token"

[[topology]]
source = "east"
target = "west"
"""
    )
    done = _cli(east, "set", "--here", str(tmp_path / "replicate.toml"))
    assert done.returncode == 0, done.stderr
    shown = _cli(east, "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert TOKEN not in shown.stdout + shown.stderr
    answer = json.loads(shown.stdout)
    assert answer["cluster_id"] == "east"
    west = answer["configuration"]["clusters"][1]
    assert (west["cluster_id"], west["credentials"]["token_set"]) == ("west", True)
    assert answer["configuration"]["topology"] == [
        {"source_cluster_id": "east", "target_cluster_id": "west", "start_after_lsns": []}
    ]
    server_side = _get(admin).configuration
    assert [c.cluster_id for c in server_side.clusters] == ["east", "west"]

    (tmp_path / "bad.toml").write_text(
        (tmp_path / "replicate.toml").read_text()
        + '\n[[topology]]\nsource = "west"\ntarget = "east"\n'
    )
    refused = _cli(east, "set", "--here", str(tmp_path / "bad.toml"))
    assert refused.returncode == 1
    assert "INVALID_ARGUMENT" in refused.stderr and "cycle" in refused.stderr
    assert _get(admin).configuration == server_side

    cleared = _cli(east, "clear")
    assert cleared.returncode == 0, cleared.stderr
    assert _get(admin).configuration == pb.ReplicateConfiguration()
