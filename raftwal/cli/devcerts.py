"""Key material for ``raftwal dev up --secure``: a throw-away local CA, one certificate per
node (for its gRPC port and, with mutual TLS, for calling its peers), one client
certificate, and a bearer token per role, written into the dev directory.

Everything is EC P-256, valid for one year, and names only 127.0.0.1, ::1 and localhost.
The CA's private key is never written: nothing more can be signed with it once ``generate``
returns, and a new ``dev up --secure`` makes a new CA. Private keys and tokens are written
with mode 0600 before any byte of them is. This is for trying raftwal on one machine; it
must never be used for a cluster that other hosts reach.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftwal.node.security import ADMIN, CONSUMER, NODE, PRODUCER, READER

VALIDITY = datetime.timedelta(days=365)
# Tolerates a clock that is a little behind on the machine that checks the certificate.
BACKDATE = datetime.timedelta(minutes=5)
TLS_DIR = "tls"
TOKENS_DIR = "tokens"
TOKENS_FILE = "auth_tokens"
USER_ROLES = (ADMIN, PRODUCER, CONSUMER, READER)
LOCAL_NAMES = ("localhost",)
LOCAL_ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class DevSecurity:
    """Where ``generate`` put everything (absolute paths)."""

    ca_file: Path
    node_certs: dict[str, tuple[Path, Path]]  # node id -> (cert, key)
    client_cert_file: Path
    client_key_file: Path
    auth_tokens_file: Path
    token_files: dict[str, Path]  # role -> file holding one token of that role


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path`, readable by the owner only (also when `path` existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "raftwal dev"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _certificate(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )


def _issue(
    common_name: str,
    ca_name: x509.Name,
    ca_key: ec.EllipticCurvePrivateKey,
    usages: Sequence[x509.ObjectIdentifier],
    now: datetime.datetime,
) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in LOCAL_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(address)) for address in LOCAL_ADDRESSES]
    cert = (
        _certificate(_name(common_name), key.public_key(), ca_name, ca_key, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def generate(directory: Path, node_ids: Sequence[str]) -> DevSecurity:
    """A new CA, node and client certificates, and tokens for every role in `directory`."""
    tls_dir = directory / TLS_DIR
    tokens_dir = directory / TOKENS_DIR
    for path in (tls_dir, tokens_dir):
        path.mkdir(mode=0o700, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("raftwal dev CA")
    ca_cert = (
        _certificate(ca_name, ca_key.public_key(), ca_name, ca_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = tls_dir / "ca.pem"
    ca_file.write_bytes(_cert_pem(ca_cert))
    server_and_client = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
    node_certs: dict[str, tuple[Path, Path]] = {}
    for node_id in node_ids:
        cert_pem, key_pem = _issue(
            f"raftwal node {node_id}", ca_name, ca_key, server_and_client, now
        )
        cert_file, key_file = tls_dir / f"{node_id}.pem", tls_dir / f"{node_id}.key"
        cert_file.write_bytes(cert_pem)
        write_private(key_file, key_pem)
        node_certs[node_id] = (cert_file, key_file)
    cert_pem, key_pem = _issue(
        "raftwal dev client", ca_name, ca_key, (ExtendedKeyUsageOID.CLIENT_AUTH,), now
    )
    client_cert_file, client_key_file = tls_dir / "client.pem", tls_dir / "client.key"
    client_cert_file.write_bytes(cert_pem)
    write_private(client_key_file, key_pem)
    tokens = {role: secrets.token_urlsafe(32) for role in (*USER_ROLES, NODE)}
    auth_tokens_file = directory / TOKENS_FILE
    write_private(
        auth_tokens_file,
        "".join(f"{role} {token}\n" for role, token in tokens.items()).encode(),
    )
    token_files: dict[str, Path] = {}
    for role in USER_ROLES:
        token_files[role] = tokens_dir / role
        write_private(token_files[role], f"{tokens[role]}\n".encode())
    return DevSecurity(
        ca_file=ca_file,
        node_certs=node_certs,
        client_cert_file=client_cert_file,
        client_key_file=client_key_file,
        auth_tokens_file=auth_tokens_file,
        token_files=token_files,
    )
