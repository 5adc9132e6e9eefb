"""Security of a node's gRPC port: TLS, mutual TLS and bearer tokens
with roles. The Raft transport has its own secret (``raftwal.node.config.check_transport_security``).

- ``TokenTable``: the ``auth_tokens_file``, one ``<role> <token>`` per line (``#`` starts a
  comment); a line may give ``sha256:<64 hex digits>``, the token's SHA-256, instead of
  the token, so that a host need not hold the tokens it only checks. Tokens are kept as
  SHA-256 digests only, so a lookup compares digests and a token never sits in memory
  longer than the file read. Nodes call each other with the first ``node`` token given in
  clear.
- ``METHOD_ROLES``: which roles may call each method. A method that is not listed is
  refused (a unit test checks that every method of every raftwal service is listed);
  health checking is open to anyone, server reflection to any valid token.
- ``AuthInterceptor``: the server interceptor that answers UNAUTHENTICATED (no token, a
  malformed one, an unknown one) or PERMISSION_DENIED (a role the method does not allow),
  each with an ErrorInfo detail, before the servicer sees the call.
- ``NodeSecurity``: what a node needs, loaded once at start from the config: its server
  credentials, its interceptors and the ``ClientSecurity`` of its node-to-node channels.

This module must never log, echo or return a token (only roles and method names), never
let a call through to a servicer when a token table is configured and the check fails,
and never send a node token in cleartext off loopback (such a config refuses to start).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from raftwal.node.config import ClusterConfig, ConfigError, NodeConfig, is_loopback
from rpc.credentials import ClientSecurity, CredentialsError, check_token, read_pem
from rpc.errors import error_info, to_status
from rpc.protos import errors_pb2

log = logging.getLogger(__name__)
E = errors_pb2

ADMIN, PRODUCER, CONSUMER, READER, NODE = "admin", "producer", "consumer", "reader", "node"
ROLES = (ADMIN, PRODUCER, CONSUMER, READER, NODE)
# Short enough to read in a log line, long enough not to be guessed.
MIN_TOKEN_CHARS = 16
# A tokens file line may name a token by its SHA-256 (hex) instead of holding it.
DIGEST_PREFIX = "sha256:"
MAX_TOKENS = 10_000
MAX_TOKENS_FILE_BYTES = 4 << 20
# How long a refused streaming call waits for its first request (see _refusal).
REFUSAL_READ_S = 1.0

# Who may do what. `admin` runs the cluster (channels, balance policy) and may call every
# public method; `producer` writes (produce, transactions, broadcasts); `consumer` reads
# and acknowledges; `reader` reads everything (metadata, Consume, ReadSegment) and changes
# nothing, so it may Consume: consuming without a group changes no state. Leases and locks
# are for the applications that write or consume. `node` is for node-to-node calls only.
_READ = frozenset({ADMIN, PRODUCER, CONSUMER, READER})
_READ_DATA = frozenset({ADMIN, CONSUMER, READER})
_WRITE = frozenset({ADMIN, PRODUCER})
_COORDINATE = frozenset({ADMIN, PRODUCER, CONSUMER})
_ACK = frozenset({ADMIN, CONSUMER})
_ADMIN = frozenset({ADMIN})
_NODE = frozenset({NODE})


def _methods(service: str, roles: frozenset[str], *names: str) -> dict[str, frozenset[str]]:
    return {f"/raftwal.v1.{service}/{name}": roles for name in names}


METHOD_ROLES: Mapping[str, frozenset[str]] = {
    **_methods(
        "Coordinator",
        _ADMIN,
        "CreateChannels",
        "DropChannels",
        "CreateVChannel",
        "DropVChannel",
        "SetBalancePolicy",
        "SaveSnapshot",
        "ChangeMembership",
        "UpdateReplicateConfiguration",
        "GetReplicateConfiguration",
        "AlterWal",
    ),
    **_methods(
        "Coordinator",
        _READ,
        "DescribeChannels",
        "ListChannels",
        "WatchAssignments",
        "ListSegments",
        "ListMembers",
    ),
    # Nodes backfill their event history from each other, and a joining node learns the
    # cluster's members from its status (raftwal/node/join.py).
    **_methods("Coordinator", _READ | _NODE, "WatchEvents", "ClusterStatus"),
    **_methods(
        "Coordinator",
        _COORDINATE,
        "GrantLease",
        "KeepAlive",
        "RevokeLease",
        "Lock",
        "Unlock",
        "WaitResourceKey",
        "BatchWrite",
    ),
    **_methods("Coordinator", _WRITE, "Broadcast"),
    **_methods("Coordinator", _ACK, "Ack"),
    **_methods(
        "StreamingNode",
        _WRITE,
        "Produce",
        "OpenProduce",
        "BeginTxn",
        "AppendTxn",
        "CommitTxn",
        "RollbackTxn",
        "KeepAliveTxn",
    ),
    # Nodes ask a pchannel's owner where its log ends (a subscription's lag, a seek).
    **_methods("StreamingNode", _READ | _NODE, "GetLatestTimeTick"),
    # Sealing changes no data, only where a segment ends: every reader may ask (a Spark
    # read seals first so that it sees everything acknowledged).
    **_methods("StreamingNode", _READ, "Seal"),
    **_methods(
        "Coordinator",
        _ACK,
        "CreateSubscription",
        "DropSubscription",
        "CommitSubscription",
        "SeekSubscription",
        "JoinSubscription",
        "LeaveSubscription",
    ),
    **_methods("Coordinator", _READ, "ListSubscriptions", "DescribeSubscription"),
    **_methods("StreamingNode", _READ_DATA, "Consume", "ReadSegment"),
    # Where a replication target stands (docs/replication.md): what a source's replicator
    # asks with the target's credentials, and what an operator reads.
    **_methods("StreamingNode", _READ, "GetReplicateCheckpoint"),
    **_methods("NodeManager", _NODE, "Assign", "Remove", "CollectStatus"),
    **_methods("Cluster", _NODE, "Heartbeat", "Propose", "ProposeBatch", "ReadIndex"),
    **_methods("Replication", _NODE, "Append", "OpenAppend", "AppendBroadcast", "Fence", "Fetch"),
}
# Load balancers and orchestrators probe health without credentials.
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
# The schema is public (the .proto files), but listing it still takes a valid token.
ANY_ROLE_PREFIXES = ("/grpc.reflection.",)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("ascii")).digest()


def token_digest_line(role: str, token: str) -> str:
    """The tokens file line that names `token` of `role` by its digest only."""
    return f"{role} {DIGEST_PREFIX}{_digest(token).hex()}"


def _parse_digest(text: str, where: str) -> bytes:
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text.lower()):
        raise ConfigError(
            f"invalid digest in {where} ({len(text)} characters after {DIGEST_PREFIX!r}; "
            "expected the token's SHA-256 as 64 hex digits, e.g. printf %s TOKEN | sha256sum)"
        )
    return bytes.fromhex(text)


@dataclass(frozen=True)
class TokenTable:
    """Token digests -> role, and the token this node presents to its peers."""

    roles: Mapping[bytes, str]
    node_token: str | None

    @classmethod
    def parse(cls, text: str, source: str) -> TokenTable:
        roles: dict[bytes, str] = {}
        node_token = None
        for number, line in enumerate(text.splitlines(), start=1):
            content = line.split("#", 1)[0].strip()
            if not content:
                continue
            where = f"{source} line {number}"
            parts = content.split()
            if len(parts) != 2:
                raise ConfigError(
                    f"invalid {where} ({len(parts)} fields; expected `<role> <token>`)"
                )
            role, token = parts
            if role not in ROLES:
                # Not echoed: a line written `<token> <role>` would put the token here.
                raise ConfigError(
                    f"invalid role in {where} (an unknown role of {len(role)} characters; "
                    f"expected one of {', '.join(ROLES)} first, then the token)"
                )
            given_digest = token.startswith(DIGEST_PREFIX)
            if given_digest:
                digest = _parse_digest(token[len(DIGEST_PREFIX) :], where)
            else:
                try:
                    check_token(token, where)
                except CredentialsError as error:
                    raise ConfigError(str(error)) from None
                if len(token) < MIN_TOKEN_CHARS:
                    raise ConfigError(
                        f"token too short in {where} ({len(token)} characters; expected at "
                        f"least {MIN_TOKEN_CHARS}, e.g. python -c 'import secrets; "
                        "print(secrets.token_urlsafe(32))')"
                    )
                digest = _digest(token)
            if roles.get(digest, role) != role:
                raise ConfigError(
                    f"token of {where} is listed again with another role ({role} and "
                    f"{roles[digest]}; expected one role per token)"
                )
            roles[digest] = role
            # A node presents a token it holds: a digest line is checked, never presented.
            if role == NODE and node_token is None and not given_digest:
                node_token = token
            if len(roles) > MAX_TOKENS:
                raise ConfigError(f"too many tokens in {source} (expected at most {MAX_TOKENS})")
        if not roles:
            raise ConfigError(f"no tokens in {source} (expected lines `<role> <token>`)")
        return cls(roles, node_token)

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        try:
            mode = path.stat().st_mode
            with open(path, "rb") as handle:
                data = handle.read(MAX_TOKENS_FILE_BYTES + 1)
        except OSError as error:
            raise ConfigError(f"cannot read cluster.auth_tokens_file {path}: {error}") from None
        if len(data) > MAX_TOKENS_FILE_BYTES:
            raise ConfigError(
                f"cluster.auth_tokens_file {path} too large (expected at most "
                f"{MAX_TOKENS_FILE_BYTES} bytes)"
            )
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "auth_tokens_file %s is accessible to group or others (mode %o; expected 600)",
                path,
                stat.S_IMODE(mode),
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"cluster.auth_tokens_file {path} is not UTF-8 text") from None
        return cls.parse(text, str(path))

    def role_of(self, token: str) -> str | None:
        return self.roles.get(_digest(token))


def _bearer_token(metadata: Iterable[Any] | None) -> tuple[str | None, str]:
    """(token, problem): the bearer token of the call, or None and what is wrong."""
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    if not values:
        return None, "no bearer token"
    if len(values) > 1:
        return None, f"{len(values)} authorization headers (expected one)"
    value = values[0]
    if isinstance(value, bytes):
        return None, "a binary authorization header (expected `Bearer <token>`)"
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        # The scheme is not echoed: a header holding the bare token has it there.
        return None, (
            f"an authorization header without the Bearer scheme (a value of {len(value)} "
            "characters; expected `Bearer <token>`)"
        )
    if not token.strip():
        return None, "an empty bearer token (`Bearer` with nothing after it)"
    return token.strip(), ""


def check_call(
    table: TokenTable, method: str, metadata: Iterable[Any] | None
) -> errors_pb2.ErrorInfo | None:
    """None when the call may proceed, else the ErrorInfo to answer with."""
    if method.startswith(OPEN_PREFIXES):
        return None
    token, problem = _bearer_token(metadata)
    if token is None:
        return error_info(
            E.UNAUTHENTICATED,
            f"{problem} for {method} (expected metadata `authorization: Bearer <token>` "
            "with a token of the cluster's auth_tokens_file)",
        )
    role = table.role_of(token)
    if role is None:
        return error_info(
            E.UNAUTHENTICATED,
            f"unknown bearer token for {method} (expected a token of the cluster's "
            "auth_tokens_file)",
        )
    if method.startswith(ANY_ROLE_PREFIXES):
        return None
    allowed = METHOD_ROLES.get(method, frozenset())
    if role in allowed:
        return None
    return error_info(
        E.PERMISSION_DENIED,
        f"role {role} may not call {method} (expected role "
        f"{' or '.join(sorted(allowed)) if allowed else 'none: the method is not listed'})",
    )


# Not gRPC: the web console's state on the metrics port (raftwal.node.console) shows what
# ClusterStatus and ListSubscriptions show, to the same roles.
CONSOLE_ROLES = _READ


def check_console(table: TokenTable, authorization: str | None) -> errors_pb2.ErrorInfo | None:
    """None when the HTTP `Authorization` header value carries a token of a role in
    CONSOLE_ROLES, else the ErrorInfo (UNAUTHENTICATED or PERMISSION_DENIED) to refuse with."""
    metadata = [("authorization", authorization)] if authorization is not None else []
    token, problem = _bearer_token(metadata)
    where = "the console (expected header `Authorization: Bearer <token>` of a read role)"
    if token is None:
        return error_info(E.UNAUTHENTICATED, f"{problem} for {where}")
    role = table.role_of(token)
    if role is None:
        return error_info(E.UNAUTHENTICATED, f"unknown bearer token for {where}")
    if role in CONSOLE_ROLES:
        return None
    return error_info(
        E.PERMISSION_DENIED,
        f"role {role} may not read the console (expected role {' or '.join(sorted(CONSOLE_ROLES))})",
    )


def _refusal(handler: grpc.RpcMethodHandler, info: errors_pb2.ErrorInfo) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only answers `info`."""
    status = to_status(info)

    async def refuse(_request: object, context: grpc.aio.ServicerContext) -> None:
        # Dropped at once: the abort below raises, and its traceback keeps this frame
        # (a refused request of up to grpc_max_message_bytes) alive until the cyclic GC.
        del _request
        if handler.request_streaming:
            # grpc-python's asyncio client reports INTERNAL instead of the server's status
            # when its write meets a stream the server already ended (grpc/grpc#36066):
            # take the client's first request (never parsed, bounded in time) first.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(context.read(), REFUSAL_READ_S)
        await context.abort_with_status(status)

    factory: Callable[..., grpc.RpcMethodHandler]
    if handler.request_streaming and handler.response_streaming:
        factory = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        factory = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        factory = grpc.unary_stream_rpc_method_handler
    else:
        factory = grpc.unary_unary_rpc_method_handler
    # No request deserializer: a refused call's request is never parsed.
    return factory(refuse, response_serializer=handler.response_serializer)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call's bearer token against ``METHOD_ROLES`` (see ``check_call``)."""

    def __init__(self, table: TokenTable) -> None:
        self._table = table

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        info = check_call(self._table, method, handler_call_details.invocation_metadata)
        if info is None:
            return handler
        log.debug("refused %s: %s", method, info.message)
        return _refusal(handler, info)


def _pem(path: Path, what: str) -> bytes:
    try:
        return read_pem(path, what)
    except CredentialsError as error:
        raise ConfigError(str(error)) from None


@dataclass(frozen=True)
class NodeSecurity:
    """A node's gRPC security, loaded from files at start (see the module docstring)."""

    server_credentials: grpc.ServerCredentials | None
    interceptors: tuple[grpc.aio.ServerInterceptor, ...]
    client: ClientSecurity
    #: The segment transfer port's TLS (the gRPC port's certificate, key, CA and client
    #: authentication), or None when gRPC is plaintext.
    transfer_tls: ssl.SSLContext | None = None
    #: The tokens of auth_tokens_file (None: token auth is off), for what the node serves
    #: outside gRPC that needs a role (the console's state on the metrics port).
    tokens: TokenTable | None = None

    @property
    def summary(self) -> str:
        tls = "off" if self.server_credentials is None else "on"
        return f"TLS {tls}, token auth {'on' if self.interceptors else 'off'}"

    @classmethod
    def load(cls, config: ClusterConfig, node: NodeConfig) -> NodeSecurity:
        table = TokenTable.load(config.auth_tokens_file) if config.auth_tokens_file else None
        if table is not None and table.node_token is None and len(config.nodes) > 1:
            raise ConfigError(
                f"no token of role node in {config.auth_tokens_file} (expected one, given "
                "in clear rather than as its sha256: digest: the nodes authenticate to each "
                "other with it)"
            )
        # A node that listens off loopback (listen_host "0.0.0.0", say) is reachable from
        # the network whatever address it advertises.
        off_loopback = [
            n.id for n in config.nodes if not (is_loopback(n.host) and is_loopback(n.bind_host))
        ]
        if table is not None and not config.tls and off_loopback:
            raise ConfigError(
                f"auth_tokens_file without TLS on nodes off loopback ({', '.join(off_loopback)}"
                "): tokens would cross the network in cleartext (expected tls_cert_file and "
                "tls_key_file for every node)"
            )
        if node.id in off_loopback:
            if not config.tls:
                log.warning(
                    "node %s serves gRPC on %s without TLS: calls and data travel in cleartext",
                    node.id,
                    node.bind_host,
                )
            if table is None:
                log.warning(
                    "node %s serves gRPC on %s without authentication (no auth_tokens_file): "
                    "anyone who reaches the port may call every method",
                    node.id,
                    node.bind_host,
                )
        ca = _pem(config.tls_ca_file, "cluster.tls_ca_file") if config.tls_ca_file else None
        credentials = None
        chain = key = None
        if node.tls_cert_file is not None and node.tls_key_file is not None:
            chain = _pem(node.tls_cert_file, f"tls_cert_file of node {node.id}")
            key = _pem(node.tls_key_file, f"tls_key_file of node {node.id}")
            credentials = grpc.ssl_server_credentials(
                [(key, chain)],
                root_certificates=ca,
                require_client_auth=config.tls_client_auth == "require",
            )
        # Towards its peers the node presents its own certificate (mutual TLS) and token.
        client = ClientSecurity(
            token=table.node_token if table is not None else None,
            tls=config.tls,
            root_certificates=ca,
            certificate_chain=chain,
            private_key=key,
        )
        interceptors = (AuthInterceptor(table),) if table is not None else ()
        transfer_tls = None
        if chain is not None and key is not None:
            assert node.tls_cert_file is not None and node.tls_key_file is not None
            transfer_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            transfer_tls.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                transfer_tls.load_cert_chain(node.tls_cert_file, node.tls_key_file)
                if config.tls_client_auth == "require":
                    transfer_tls.verify_mode = ssl.CERT_REQUIRED
                    if ca is None:
                        raise ConfigError(
                            'tls_client_auth = "require" without tls_ca_file (expected the CA '
                            "that signs the clients' certificates)"
                        )
                    transfer_tls.load_verify_locations(cadata=ca.decode("ascii"))
            except (ssl.SSLError, OSError, UnicodeDecodeError) as error:
                raise ConfigError(
                    f"invalid TLS files of node {node.id} for the segment transfer port "
                    f"({error}; expected the PEM certificate chain and key gRPC uses)"
                ) from None
        return cls(credentials, interceptors, client, transfer_tls, table)
