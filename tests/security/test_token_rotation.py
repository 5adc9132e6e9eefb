"""Rotating tokens as SECURITY.md says, on a running secure cluster (issue 40, item 9).

Three rounds of rolling restarts of a three-node `dev up --secure` cluster:
1. a new admin token and a new node token are added (the new node token listed second:
   nodes present the first and accept all): old and new admin tokens both work;
2. the new node token is listed first, the old one second, the old admin token removed:
   the old admin token is UNAUTHENTICATED, the new one works;
3. the old node token is removed.
After every round each node answers, and a write sent to every node (followers forward it
to the leader with the node token) is applied: the cluster never stopped talking to itself.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from rpc.credentials import ClientSecurity
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from tests.timing import scaled

pytestmark = pytest.mark.cluster
E = errors_pb2

# A restarted node must rejoin within this (the wait ends as soon as it has): generous, so
# that a loaded machine makes the test slower, not red (it timed out at 60 s once under a
# load average of 6 on 2 cores).
READY_TIMEOUT_S = scaled(180.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    local = dev.up(tmp_path_factory.mktemp("rotation"), 3, timeout_s=60, secure=True)
    try:
        yield local
    finally:
        local.stop_all()


def _with_token(local: dev.LocalCluster, token: str) -> ClientSecurity:
    base = local.client_security("admin")
    return ClientSecurity(
        token=token,
        tls=True,
        root_certificates=base.root_certificates,
        certificate_chain=base.certificate_chain,
        private_key=base.private_key,
    )


def _write_everywhere(local: dev.LocalCluster, token: str, round_: int) -> None:
    """A proposal through every node (forwarded by followers with the node token). Right
    after a rolling restart a node may not know the new leader yet (NOT_LEADER): a client
    retries that, with its request id, as the SDK does; any other error fails at once."""
    with_token = _with_token(local, token)
    for index, endpoint in enumerate(local.endpoints):
        request = api.CreateChannelsRequest(
            request_id=f"rot{round_}n{index}-{secrets.token_hex(8)}",
            prefix=f"rot{round_}n{index}",
            count=1,
        )
        deadline = time.monotonic() + scaled(15)
        with with_token.channel(endpoint) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            while True:
                try:
                    created = stub.CreateChannels(request, timeout=scaled(15))
                    break
                except grpc.RpcError as error:
                    if from_rpc_error(error).code != E.NOT_LEADER or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            assert created.pchannels, (endpoint, created)


def _unauthenticated(local: dev.LocalCluster, token: str) -> None:
    for endpoint in local.endpoints:
        with (
            _with_token(local, token).channel(endpoint) as channel,
            pytest.raises(grpc.RpcError) as raised,
        ):
            coordinator_pb2_grpc.CoordinatorStub(channel).ClusterStatus(
                api.ClusterStatusRequest(), timeout=scaled(5)
            )
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert from_rpc_error(raised.value).code == E.UNAUTHENTICATED


def _lines(path: Path) -> dict[str, list[str]]:
    roles: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        role, _, token = line.partition(" ")
        roles.setdefault(role, []).append(token.strip())
    return roles


def _write_tokens(path: Path, lines: list[tuple[str, str]]) -> None:
    path.write_text("".join(f"{role} {token}\n" for role, token in lines))


def test_admin_and_node_tokens_rotate_without_downtime(cluster) -> None:
    local = cluster
    assert local.security is not None
    tokens_file = Path(local.security.auth_tokens_file)
    original = _lines(tokens_file)
    old_admin, (old_node,) = original["admin"][0], original["node"]
    new_admin, new_node = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    others = [
        (role, t) for role, ts in original.items() if role not in ("admin", "node") for t in ts
    ]

    # Round 1: add the new tokens; nodes still present the old node token (listed first).
    _write_tokens(
        tokens_file,
        [
            ("admin", old_admin),
            ("admin", new_admin),
            ("node", old_node),
            ("node", new_node),
            *others,
        ],
    )
    dev.rolling_restart(local, ready_timeout_s=READY_TIMEOUT_S)
    _write_everywhere(local, old_admin, 1)
    _write_everywhere(local, new_admin, 1)
    # Clients move to the new token (the dev cluster's own admin client too).
    local.security.token_files["admin"].write_text(f"{new_admin}\n")

    # Round 2: nodes present the new node token, still accept the old; the old admin goes.
    _write_tokens(
        tokens_file, [("admin", new_admin), ("node", new_node), ("node", old_node), *others]
    )
    dev.rolling_restart(local, ready_timeout_s=READY_TIMEOUT_S)
    _unauthenticated(local, old_admin)
    _write_everywhere(local, new_admin, 2)

    # Round 3: the old node token goes.
    _write_tokens(tokens_file, [("admin", new_admin), ("node", new_node), *others])
    dev.rolling_restart(local, ready_timeout_s=READY_TIMEOUT_S)
    _unauthenticated(local, old_node)
    _write_everywhere(local, new_admin, 3)
