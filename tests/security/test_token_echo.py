"""No part of a token appears in any error or log line (issue 40, item 4).

The audit sent ``authorization: <token>`` without the ``Bearer`` scheme and got back "an
authorization header with scheme '<first 16 characters of the token>'", which the
interceptor also logged at DEBUG. Here a node logging at DEBUG gets every malformed
header the audit tried, with real tokens and unknown ones, and neither the answers
(status details and ErrorInfo) nor the node's log hold any 8 characters of a token. The
tokens file's own errors do not echo a token either (a line written `<token> <role>`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftwal.cli import dev
from raftwal.node.config import ConfigError
from raftwal.node.security import TokenTable
from rpc.credentials import ClientSecurity
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc
from tests.timing import scaled

pytestmark = pytest.mark.cluster
UNKNOWN = "UnknownTokenAbCdEfGh0123456789xyz"
PIECE = 8


def _pieces(token: str) -> set[str]:
    return {token[i : i + PIECE] for i in range(len(token) - PIECE + 1)}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    env = {**os.environ, "RAFTWAL_LOG_LEVEL": "DEBUG"}
    local = dev.up(tmp_path_factory.mktemp("echo"), 1, timeout_s=60, env=env, secure=True)
    try:
        yield local
    finally:
        local.stop_all()


def _headers(tokens: list[str]) -> list[str]:
    """Authorization values the audit tried, each holding a token."""
    out = []
    for token in tokens:
        out += [
            token,
            f"Basic {token}",
            f"{token} {token}",
            f"Token {token}",
            f"bearer{token}",
            f"Bearer {token}x",
            f"Bearer  {token[:-1]}",
            f"  {token}  ",
        ]
    return out


def test_no_part_of_a_token_is_echoed_or_logged(node) -> None:
    local = node
    assert local.security is not None
    real = [local.security.token_files[role].read_text().strip() for role in ("admin", "reader")]
    base = local.client_security("admin")
    security = ClientSecurity(
        token=None,
        tls=True,
        root_certificates=base.root_certificates,
        certificate_chain=base.certificate_chain,
        private_key=base.private_key,
    )
    answers = []
    with security.channel(local.endpoints[0]) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        for value in _headers([*real, UNKNOWN]):
            with pytest.raises(grpc.RpcError) as raised:
                stub.ClusterStatus(
                    api.ClusterStatusRequest(),
                    metadata=(("authorization", value),),
                    timeout=scaled(5),
                )
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, value
            answers.append(raised.value.details() or "")
            answers.append(from_rpc_error(raised.value).message)
        # Two headers at once, and one as a stream.
        with pytest.raises(grpc.RpcError) as raised:
            stub.ClusterStatus(
                api.ClusterStatusRequest(),
                metadata=(("authorization", real[0]), ("authorization", f"Basic {real[1]}")),
                timeout=scaled(5),
            )
        answers.append(raised.value.details() or "")
        with pytest.raises(grpc.RpcError) as raised:
            next(
                stub.WatchEvents(
                    api.WatchEventsRequest(),
                    metadata=(("authorization", real[0]),),
                    timeout=scaled(5),
                )
            )
        answers.append(raised.value.details() or "")
    log_text = Path(local.directory / "n1.log").read_text()
    assert "refused" in log_text  # the interceptor did log at DEBUG
    for token in [*real, UNKNOWN]:
        for piece in _pieces(token):
            for answer in answers:
                assert piece not in answer, (piece, answer)
            assert piece not in log_text, piece


def test_the_tokens_file_does_not_echo_a_token() -> None:
    token = "Sw4ppedTokenFirst0123456789abcdef"
    with pytest.raises(ConfigError) as raised:
        TokenTable.parse(f"{token} admin\n", "tokens")
    for piece in _pieces(token):
        assert piece not in str(raised.value), str(raised.value)
