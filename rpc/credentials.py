"""Client-side transport security: TLS (with a client certificate for mutual TLS, when the
cluster requires one) and the bearer token that every call carries, as one value,
``ClientSecurity``, from which every raftwal client opens its gRPC channels: the SDK
(``CoordinatorClient``, ``StreamingClient``, ``Client``), the CLI, the Spark connector and
the nodes themselves (node-to-node calls, with the node token).

The token travels as gRPC call credentials (``authorization: Bearer <token>``) that gRPC's
core attaches to every call on the channel. It is sent over TLS, or in cleartext only to a
loopback address (a process on this host, through gRPC's local credentials). This module
must never put a token on an unencrypted connection to another host, nor show a token in
a repr, a log line or an error message.

Where the values come from when the caller passes none (``ClientSecurity.from_env``):

====================================  ==================================================
``RAFTWAL_TOKEN``                     the bearer token itself
``RAFTWAL_TOKEN_FILE``                a file holding it (used when RAFTWAL_TOKEN is unset)
``RAFTWAL_CLIENT_TLS_CA_FILE``        PEM CA bundle to verify the nodes' certificates (TLS)
``RAFTWAL_CLIENT_TLS_CERT_FILE``      PEM client certificate chain (mutual TLS)
``RAFTWAL_CLIENT_TLS_KEY_FILE``       its PEM private key
====================================  ==================================================

With none of them set, channels are plaintext and calls carry no token (a dev cluster
without ``--secure``).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "RAFTWAL_TOKEN"
TOKEN_FILE_ENV = "RAFTWAL_TOKEN_FILE"
CA_FILE_ENV = "RAFTWAL_CLIENT_TLS_CA_FILE"
CERT_FILE_ENV = "RAFTWAL_CLIENT_TLS_CERT_FILE"
KEY_FILE_ENV = "RAFTWAL_CLIENT_TLS_KEY_FILE"
# Tokens are HTTP/2 header values: bounded, printable ASCII, no whitespace.
MAX_TOKEN_CHARS = 4096
# A PEM file larger than this is not a certificate bundle or key.
MAX_PEM_BYTES = 1 << 20


class CredentialsError(ValueError):
    """Client credentials that cannot be used; the message says what was got and what was
    expected (never the token itself)."""


def check_token(token: str, where: str) -> str:
    """`token` if it can travel as a bearer token, else CredentialsError naming `where`."""
    if not 1 <= len(token) <= MAX_TOKEN_CHARS:
        raise CredentialsError(
            f"invalid token from {where} ({len(token)} characters; expected 1..{MAX_TOKEN_CHARS})"
        )
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise CredentialsError(
            f"invalid token from {where} (expected printable ASCII without spaces)"
        )
    return token


def read_token_file(path: str | Path, where: str) -> str:
    """The token in `path` (surrounding whitespace and a final newline stripped)."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise CredentialsError(f"cannot read {where} {path}: {error}") from None
    return check_token(text, f"{where} {path}")


def read_pem(path: str | Path, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_PEM_BYTES + 1)
    except OSError as error:
        raise CredentialsError(f"cannot read {what} {path}: {error}") from None
    if len(data) > MAX_PEM_BYTES or b"-----BEGIN " not in data:
        raise CredentialsError(
            f"invalid {what} {path} ({len(data)} bytes; expected a PEM file of at most "
            f"{MAX_PEM_BYTES} bytes)"
        )
    return data


def is_loopback_target(target: str) -> bool:
    """True when `target` (``host:port``) names this host: localhost or a loopback IP."""
    host = target.rpartition(":")[0].strip("[]") if ":" in target else target
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, repr=False)
class ClientSecurity:
    """How a client connects: plaintext or TLS (``tls``; ``root_certificates`` None means
    the system's trust store), an optional client certificate (mutual TLS) and an optional
    bearer token. Immutable and picklable (the Spark connector ships it to executors).
    Build it with ``load`` (from files) or ``from_env``; ``ClientSecurity()`` is plaintext
    without a token."""

    token: str | None = None
    tls: bool = False
    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token(self.token, "the token argument")
        if (self.certificate_chain is None) != (self.private_key is None):
            raise CredentialsError(
                "invalid client certificate (got only one of the certificate chain and the "
                "private key; expected both or neither)"
            )
        if not self.tls and (self.root_certificates or self.certificate_chain):
            raise CredentialsError(
                "invalid ClientSecurity (certificates given with tls=False; expected tls=True)"
            )

    def __repr__(self) -> str:
        return (
            f"ClientSecurity(tls={self.tls}, ca={'custom' if self.root_certificates else 'system'}"
            f", client_cert={self.certificate_chain is not None}, token="
            f"{'set' if self.token else 'none'})"
        )

    @classmethod
    def load(
        cls,
        *,
        token: str | None = None,
        token_file: str | Path | None = None,
        tls_ca_file: str | Path | None = None,
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        tls: bool = False,
    ) -> ClientSecurity:
        """Read the files now. TLS is on when `tls` is true or any TLS file is given; a
        token argument wins over `token_file`."""
        if token is None and token_file:
            token = read_token_file(token_file, "token file")
        if bool(tls_cert_file) != bool(tls_key_file):
            raise CredentialsError(
                f"invalid client certificate (got cert file {tls_cert_file or '-'} and key "
                f"file {tls_key_file or '-'}; expected both or neither)"
            )
        return cls(
            token=token,
            tls=bool(tls or tls_ca_file or tls_cert_file),
            root_certificates=read_pem(tls_ca_file, "TLS CA file") if tls_ca_file else None,
            certificate_chain=(
                read_pem(tls_cert_file, "TLS certificate file") if tls_cert_file else None
            ),
            private_key=read_pem(tls_key_file, "TLS key file") if tls_key_file else None,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """From the RAFTWAL_TOKEN... variables (see the module docstring)."""
        environ = os.environ if environ is None else environ
        token = environ.get(TOKEN_ENV) or None
        if token is not None:
            check_token(token, TOKEN_ENV)
        return cls.load(
            token=token,
            token_file=environ.get(TOKEN_FILE_ENV) or None,
            tls_ca_file=environ.get(CA_FILE_ENV) or None,
            tls_cert_file=environ.get(CERT_FILE_ENV) or None,
            tls_key_file=environ.get(KEY_FILE_ENV) or None,
        )

    def credentials(self, target: str) -> grpc.ChannelCredentials | None:
        """Channel credentials for `target`, or None for a plaintext channel."""
        if self.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.root_certificates,
                private_key=self.private_key,
                certificate_chain=self.certificate_chain,
            )
        elif self.token is None:
            return None
        elif is_loopback_target(target):
            # gRPC attaches call credentials only to connections it considers private;
            # local credentials say so for a loopback TCP connection, which never leaves
            # this host.
            credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
        else:
            raise CredentialsError(
                f"refusing to send a bearer token in cleartext to {target} (expected TLS: a CA "
                f"file such as {CA_FILE_ENV}, or a loopback address)"
            )
        if self.token is None:
            return credentials
        return grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(self.token)
        )

    def aio_channel(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A ``grpc.aio`` channel to `target` with these credentials."""
        credentials = self.credentials(target)
        if credentials is None:
            return grpc.aio.insecure_channel(target, options=list(options))
        return grpc.aio.secure_channel(target, credentials, options=list(options))

    def channel(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking ``grpc`` channel to `target` with these credentials."""
        credentials = self.credentials(target)
        if credentials is None:
            return grpc.insecure_channel(target, options=list(options))
        return grpc.secure_channel(target, credentials, options=list(options))
