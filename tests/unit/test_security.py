"""Security pieces without a cluster: the role table covers every method, the tokens file
and TLS settings are validated with clear errors, ``check_call`` decides as documented,
client credentials never leak a token or send it in cleartext off loopback, the dev key
material is private and valid, and the interceptor refuses calls on a real in-process
gRPC server over (mutual) TLS for every call shape raftwal uses."""

from __future__ import annotations

import hashlib
import ipaddress
import pickle
import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from google.protobuf import descriptor_pool

from raftwal.cli import devcerts
from raftwal.node.config import ConfigError, load_config, parse_config, render_config
from raftwal.node.process import SERVICE_NAMES
from raftwal.node.security import (
    METHOD_ROLES,
    ROLES,
    AuthInterceptor,
    NodeSecurity,
    TokenTable,
    check_call,
)
from rpc.credentials import ClientSecurity, CredentialsError, is_loopback_target
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2, streaming_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from spark_connector.options import parse_options
from tests.timing import scaled

E = errors_pb2
NODES = [
    {"id": "n1", "host": "127.0.0.1", "grpc_port": 7201, "raft_port": 7301},
    {"id": "n2", "host": "127.0.0.1", "grpc_port": 7202, "raft_port": 7302},
]
TOKENS = {role: f"{role}-token-0123456789abcdef" for role in ROLES}
TABLE = TokenTable.parse("".join(f"{r} {t}\n" for r, t in TOKENS.items()), "tokens")


def _bearer(role: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[role]}"),)


def _method(service: str, name: str) -> str:
    return f"/raftwal.v1.{service}/{name}"


# -- the role table -------------------------------------------------------------------


def test_every_method_of_every_service_has_roles() -> None:
    served = set()
    for full_name in SERVICE_NAMES:
        descriptor = descriptor_pool.Default().FindServiceByName(full_name)
        served |= {f"/{full_name}/{method.name}" for method in descriptor.methods}
    assert served == set(METHOD_ROLES)
    assert all(roles and roles <= set(ROLES) for roles in METHOD_ROLES.values())


@pytest.mark.parametrize(
    ("role", "method", "allowed"),
    [
        ("admin", _method("Coordinator", "CreateChannels"), True),
        ("producer", _method("Coordinator", "CreateChannels"), False),
        ("reader", _method("StreamingNode", "Produce"), False),
        ("consumer", _method("StreamingNode", "Produce"), False),
        ("producer", _method("StreamingNode", "Produce"), True),
        ("producer", _method("StreamingNode", "CommitTxn"), True),
        ("reader", _method("StreamingNode", "Consume"), True),
        ("reader", _method("StreamingNode", "ReadSegment"), True),
        ("producer", _method("StreamingNode", "Consume"), False),
        ("consumer", _method("Coordinator", "Ack"), True),
        ("reader", _method("Coordinator", "Ack"), False),
        ("reader", _method("Coordinator", "Lock"), False),
        ("consumer", _method("Coordinator", "GrantLease"), True),
        ("reader", _method("Coordinator", "ClusterStatus"), True),
        ("admin", _method("Replication", "Append"), False),
        ("admin", _method("Cluster", "Propose"), False),
        ("node", _method("Cluster", "Propose"), True),
        ("node", _method("Coordinator", "WatchEvents"), True),
        ("node", _method("StreamingNode", "Produce"), False),
        ("node", _method("Coordinator", "CreateChannels"), False),
    ],
)
def test_roles_decide(role: str, method: str, allowed: bool) -> None:
    info = check_call(TABLE, method, _bearer(role))
    if allowed:
        assert info is None
    else:
        assert info is not None and info.code == E.PERMISSION_DENIED
        assert f"role {role} may not call {method}" in info.message
        assert TOKENS[role] not in info.message


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "no bearer token"),
        ((("authorization", "Basic dXNlcjpwdw=="),), "without the Bearer scheme"),
        ((("authorization", "Bearer "),), "an empty bearer token"),
        ((("authorization", "Bearer x"), ("authorization", "Bearer y")), "2 authorization"),
        ((("authorization", "Bearer not-a-known-token-at-all"),), "unknown bearer token"),
    ],
)
def test_missing_or_unknown_tokens_are_unauthenticated(metadata, message: str) -> None:
    info = check_call(TABLE, _method("Coordinator", "ClusterStatus"), metadata)
    assert info is not None and info.code == E.UNAUTHENTICATED
    assert message in info.message and "not-a-known-token" not in info.message


def test_health_is_open_and_reflection_takes_any_token() -> None:
    assert check_call(TABLE, "/grpc.health.v1.Health/Check", ()) is None
    reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    assert check_call(TABLE, reflection, _bearer("reader")) is None
    refused = check_call(TABLE, reflection, ())
    assert refused is not None and refused.code == E.UNAUTHENTICATED
    unlisted = check_call(TABLE, "/raftwal.v1.Coordinator/NoSuchMethod", _bearer("admin"))
    assert unlisted is not None and unlisted.code == E.PERMISSION_DENIED


# -- the tokens file ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no tokens"),
        ("# only a comment\n", "no tokens"),
        (
            "root abcdefghijklmnopqrstuvwxyz\n",
            "invalid role in t line 1 \\(an unknown role of 4 characters",
        ),
        ("admin\n", "1 fields; expected `<role> <token>`"),
        ("admin short\n", "token too short in t line 1 \\(5 characters"),
        (
            "admin abcdefghijklmnopqrstuvwxyz\nreader abcdefghijklmnopqrstuvwxyz\n",
            "listed again with another role",
        ),
    ],
)
def test_bad_tokens_files_say_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        TokenTable.parse(text, "t")
    assert "abcdefghijklmnopqrstuvwxyz" not in str(raised.value)


def test_tokens_file_comments_and_node_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(
        "# ops\nadmin aaaaaaaaaaaaaaaaaaaa  # alice\n\nnode nnnnnnnnnnnnnnnnnnnn1\n"
        "node nnnnnnnnnnnnnnnnnnnn2\n"
    )
    table = TokenTable.load(path)
    assert table.role_of("aaaaaaaaaaaaaaaaaaaa") == "admin"
    assert table.role_of("nnnnnnnnnnnnnnnnnnnn2") == "node"
    assert table.role_of("unknown") is None
    # The first node token is the one this node presents (rotation: add, roll, remove).
    assert table.node_token == "nnnnnnnnnnnnnnnnnnnn1"


def test_a_tokens_file_may_name_tokens_by_their_digest(tmp_path: Path) -> None:
    """What `raftwal init --secure` writes on each host: the node token in clear (it is
    presented), every other role's token as its SHA-256 (only checked)."""
    admin = "a-client-token-no-host-holds"
    digest = hashlib.sha256(admin.encode()).hexdigest()
    table = TokenTable.parse(
        f"node sha256:{'0' * 64}\nnode nnnnnnnnnnnnnnnnnnnn1\nadmin sha256:{digest.upper()}\n", "t"
    )
    assert table.role_of(admin) == "admin"
    assert table.role_of(f"sha256:{digest}") is None
    # A digest line is never what a node presents: the first node token given in clear.
    assert table.node_token == "nnnnnnnnnnnnnnnnnnnn1"
    assert TokenTable.parse(f"node sha256:{digest}\n", "t").node_token is None
    for bad in ("sha256:abc", f"sha256:{'g' * 64}"):
        with pytest.raises(ConfigError, match="expected the token's SHA-256 as 64 hex digits"):
            TokenTable.parse(f"admin {bad}\n", "t")


# -- TLS and auth settings --------------------------------------------------------------


def test_tls_settings_parse_render_and_env_override(tmp_path: Path) -> None:
    nodes = [
        dict(NODES[0], tls_cert_file="n1.pem", tls_key_file="n1.key"),
        dict(NODES[1], tls_cert_file="n2.pem", tls_key_file="n2.key"),
    ]
    cluster = {"tls_ca_file": "ca.pem", "tls_client_auth": "require", "auth_tokens_file": "tok"}
    config = parse_config({"nodes": nodes, "cluster": cluster}, tmp_path, environ={})
    assert config.tls and config.tls_client_auth == "require"
    assert config.node("n2").tls_cert_file == (tmp_path / "n2.pem").resolve()
    assert config.auth_tokens_file == (tmp_path / "tok").resolve()
    path = tmp_path / "raftwal.toml"
    path.write_text(render_config(config))
    loaded = load_config(path, environ={})
    assert (loaded.nodes, loaded.tls_ca_file, loaded.tls_client_auth) == (
        config.nodes,
        config.tls_ca_file,
        "require",
    )
    environ = {
        "RAFTWAL_TLS_CERT_FILE": "/x/me.pem",
        "RAFTWAL_TLS_KEY_FILE": "/x/me.key",
        "RAFTWAL_AUTH_TOKENS_FILE": "/x/tokens",
        "RAFTWAL_TLS_CLIENT_AUTH": "none",
    }
    overridden = parse_config({"nodes": nodes, "cluster": cluster}, tmp_path, environ)
    assert overridden.node("n1").tls_cert_file == Path("/x/me.pem")
    assert overridden.auth_tokens_file == Path("/x/tokens")
    assert overridden.tls_client_auth == "none"
    shared = parse_config(
        {"nodes": NODES, "cluster": {"tls_cert_file": "all.pem", "tls_key_file": "all.key"}},
        tmp_path,
        environ={},
    )
    assert {n.tls_key_file for n in shared.nodes} == {(tmp_path / "all.key").resolve()}


@pytest.mark.parametrize(
    ("nodes", "cluster", "message"),
    [
        ([dict(NODES[0], tls_cert_file="a.pem"), NODES[1]], {}, "expected both or neither"),
        (
            [dict(NODES[0], tls_cert_file="a.pem", tls_key_file="a.key"), NODES[1]],
            {},
            "TLS configured for some nodes only \\(n1 of n1, n2",
        ),
        (NODES, {"tls_ca_file": "ca.pem"}, "without node certificates"),
        (
            NODES,
            {"tls_cert_file": "a.pem", "tls_key_file": "a.key", "tls_client_auth": "optional"},
            "invalid cluster.tls_client_auth \\('optional'; expected one of none, require",
        ),
        (
            NODES,
            {"tls_cert_file": "a.pem", "tls_key_file": "a.key", "tls_client_auth": "require"},
            '"require" without tls_ca_file',
        ),
        (NODES, {"auth_tokens_file": 7}, "invalid cluster.auth_tokens_file \\(7"),
    ],
)
def test_bad_tls_settings_say_what_was_expected(tmp_path: Path, nodes, cluster, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"nodes": nodes, "cluster": cluster}, tmp_path, environ={})


def test_node_security_refuses_cleartext_tokens_and_a_missing_node_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    devcerts.write_private(tokens, b"admin aaaaaaaaaaaaaaaaaaaa\n")
    remote = [dict(NODES[0], host="10.1.2.3"), NODES[1]]
    config = parse_config(
        {"nodes": remote, "cluster": {"auth_tokens_file": "tokens"}}, tmp_path, environ={}
    )
    with pytest.raises(ConfigError, match="no token of role node"):
        NodeSecurity.load(config, config.node("n2"))
    devcerts.write_private(tokens, b"node nnnnnnnnnnnnnnnnnnnn\n")
    with pytest.raises(ConfigError, match="tokens would cross the network in cleartext"):
        NodeSecurity.load(config, config.node("n2"))
    local = parse_config(
        {"nodes": NODES, "cluster": {"auth_tokens_file": "tokens"}}, tmp_path, environ={}
    )
    security = NodeSecurity.load(local, local.node("n1"))
    assert security.server_credentials is None and len(security.interceptors) == 1
    assert security.client.token == "nnnnnnnnnnnnnnnnnnnn"
    assert security.summary == "TLS off, token auth on"


# -- client credentials -----------------------------------------------------------------


def test_client_security_never_shows_or_leaks_a_token(tmp_path: Path) -> None:
    security = ClientSecurity(token="s3cret-token-value")
    assert "s3cret" not in repr(security) and "token=set" in repr(security)
    assert security.credentials("127.0.0.1:7201") is not None
    assert security.credentials("localhost:7201") is not None
    with pytest.raises(CredentialsError, match="refusing to send a bearer token in cleartext"):
        security.credentials("10.0.0.7:7201")
    assert ClientSecurity().credentials("10.0.0.7:7201") is None
    with pytest.raises(CredentialsError, match="printable ASCII without spaces"):
        ClientSecurity(token="two words")
    with pytest.raises(CredentialsError, match="expected both or neither"):
        ClientSecurity.load(tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(CredentialsError, match="cannot read TLS CA file"):
        ClientSecurity.load(tls_ca_file=tmp_path / "missing.pem")
    (tmp_path / "token").write_text("from-a-file-0123\n")
    environ = {"RAFTWAL_TOKEN_FILE": str(tmp_path / "token")}
    assert ClientSecurity.from_env(environ).token == "from-a-file-0123"
    environ["RAFTWAL_TOKEN"] = "from-the-env"
    assert ClientSecurity.from_env(environ).token == "from-the-env"
    assert ClientSecurity.from_env({}) == ClientSecurity()
    assert is_loopback_target("[::1]:7201") and not is_loopback_target("example.com:7201")


def test_dev_key_material_is_private_and_valid(tmp_path: Path) -> None:
    generated = devcerts.generate(tmp_path, ["n1", "n2"])
    private = [
        generated.auth_tokens_file,
        generated.client_key_file,
        *generated.token_files.values(),
        *(key for _, key in generated.node_certs.values()),
    ]
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # The CA key is kept (to renew certificates, SECURITY.md), private like the others.
    (ca_key,) = tmp_path.rglob("ca.key")
    assert stat.S_IMODE(ca_key.stat().st_mode) == 0o600
    table = TokenTable.load(generated.auth_tokens_file)
    assert set(table.roles.values()) == set(ROLES) and table.node_token
    ca = x509.load_pem_x509_certificate(generated.ca_file.read_bytes())
    node = x509.load_pem_x509_certificate(generated.node_certs["n1"][0].read_bytes())
    node.verify_directly_issued_by(ca)
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    usages = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert (node.not_valid_after_utc - node.not_valid_before_utc).days == 365


# -- the interceptor on a real gRPC server ---------------------------------------------


class _Coordinator(coordinator_pb2_grpc.CoordinatorServicer):
    async def CreateChannels(self, request, context):
        return api.CreateChannelsResponse(pchannels=["made"])


class _Streaming(streaming_pb2_grpc.StreamingNodeServicer):
    async def Consume(self, request, context):
        yield wire.ConsumeResponse()

    async def Produce(self, request_iterator, context):
        async for request in request_iterator:
            yield wire.ProduceResult(request_id=request.request_id)


async def test_interceptor_over_mutual_tls(tmp_path: Path) -> None:
    generated = devcerts.generate(tmp_path, ["n1"])
    cert, key = generated.node_certs["n1"]
    server = grpc.aio.server(
        interceptors=[AuthInterceptor(TokenTable.load(generated.auth_tokens_file))]
    )
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(_Coordinator(), server)
    streaming_pb2_grpc.add_StreamingNodeServicer_to_server(_Streaming(), server)
    credentials = grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=generated.ca_file.read_bytes(),
        require_client_auth=True,
    )
    target = f"127.0.0.1:{server.add_secure_port('127.0.0.1:0', credentials)}"
    await server.start()

    def security(role: str | None) -> ClientSecurity:
        return ClientSecurity.load(
            token_file=generated.token_files[role] if role else None,
            tls_ca_file=generated.ca_file,
            tls_cert_file=generated.client_cert_file,
            tls_key_file=generated.client_key_file,
        )

    async def outcome(role: str | None, shape: str) -> int:
        async with security(role).aio_channel(target) as channel:
            coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
            streaming = streaming_pb2_grpc.StreamingNodeStub(channel)
            try:
                if shape == "unary":
                    await coordinator.CreateChannels(api.CreateChannelsRequest(), timeout=scaled(5))
                elif shape == "server-stream":
                    [r async for r in streaming.Consume(wire.ConsumeRequest(), timeout=scaled(5))]
                else:
                    requests = iter([streaming_pb2.ProduceRequest(request_id=1)])
                    [r async for r in streaming.Produce(requests, timeout=scaled(5))]
            except grpc.aio.AioRpcError as error:
                info = from_rpc_error(error)
                assert error.code().name == E.ErrorCode.Name(info.code), (error, info)
                return info.code
            return E.OK

    try:
        assert await outcome("admin", "unary") == E.OK
        assert await outcome("producer", "unary") == E.PERMISSION_DENIED
        assert await outcome(None, "unary") == E.UNAUTHENTICATED
        assert await outcome("reader", "server-stream") == E.OK
        assert await outcome("producer", "server-stream") == E.PERMISSION_DENIED
        assert await outcome("producer", "bidi-stream") == E.OK
        assert await outcome("reader", "bidi-stream") == E.PERMISSION_DENIED
        assert await outcome(None, "bidi-stream") == E.UNAUTHENTICATED
    finally:
        await server.stop(None)


def test_spark_options_load_credentials_once_and_refuse_cleartext(tmp_path: Path) -> None:
    generated = devcerts.generate(tmp_path, ["n1"])
    options = parse_options(
        {
            "endpoints": "127.0.0.1:7201",
            "tokenFile": str(generated.token_files["reader"]),
            "tlsCaFile": str(generated.ca_file),
            "tlsCertFile": str(generated.client_cert_file),
            "tlsKeyFile": str(generated.client_key_file),
        }
    )
    token = generated.token_files["reader"].read_text().strip()
    assert options.security.token == token and options.security.certificate_chain
    # Executors get the bytes with the options; the repr (Spark logs it) hides the token.
    assert pickle.loads(pickle.dumps(options)) == options
    assert token not in repr(options)
    with pytest.raises(ValueError, match="refusing to send a bearer token in cleartext"):
        parse_options({"endpoints": "10.0.0.7:7201", "token": "t" * 20})
    with pytest.raises(ValueError, match="cannot read TLS CA file"):
        parse_options({"endpoints": "127.0.0.1:7201", "tlsCaFile": str(tmp_path / "none")})
