"""Key material for ``raftwal dev up --secure``: a throw-away local CA, one certificate per
node (for its gRPC port and, with mutual TLS, for calling its peers), one client
certificate, and a bearer token per role, written into the dev directory.

Everything is EC P-256, valid for one year, and names 127.0.0.1, ::1 and localhost, and
each node's certificate its advertised host too (``raftwal init --secure`` issues them
for other machines' addresses).
The CA's key is kept beside its certificate (``tls/ca.key``, mode 0600) so that
``renew`` (``raftwal dev renew-certs``) can issue new node and client certificates under
the same CA before the old ones expire, and a later ``dev up --secure`` in the same
directory keeps the CA (clients that trust it keep working). Instead, ``generate`` takes
a CA of your own (``dev up --secure --ca-cert FILE --ca-key FILE``), whose key is read
and never copied. Private keys and tokens are written with mode 0600 before any byte of
them is. ``raftwal init --secure`` issues a deployment's material with the same code: its
CA key then belongs offline, with whoever issues the next certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
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
CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
#: The CA keys ``generate`` accepts (its own are EC; one supplied may be RSA or EC).
CAKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


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
    issuer_key: CAKey,
    now: datetime.datetime,
    validity: datetime.timedelta = VALIDITY,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(min(now - BACKDATE, now + validity - BACKDATE))
        .not_valid_after(now + validity)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )


def _issue(
    common_name: str,
    ca_name: x509.Name,
    ca_key: CAKey,
    usages: Sequence[x509.ObjectIdentifier],
    now: datetime.datetime,
    validity: datetime.timedelta = VALIDITY,
    hosts: Sequence[str] = (),
) -> tuple[bytes, bytes]:
    """A certificate for the local names and `hosts` (each an IP address or a DNS name)."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in (*LOCAL_NAMES, *LOCAL_ADDRESSES, *hosts):
        try:
            name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            name = x509.DNSName(host)
        if name not in sans:
            sans.append(name)
    cert = (
        _certificate(_name(common_name), key.public_key(), ca_name, ca_key, now, validity)
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


class CertificateError(Exception):
    """A CA that cannot sign (files missing, unreadable, not a CA, key and certificate
    that do not match)."""


def _new_ca(now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
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
    return ca_cert, ca_key


def load_ca(cert_file: Path, key_file: Path) -> tuple[x509.Certificate, CAKey]:
    """A CA certificate and its key from PEM files; CertificateError when they are not a
    usable pair."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as error:
        raise CertificateError(
            f"cannot load the CA from {cert_file} and {key_file} ({error}; expected a PEM "
            "certificate and its unencrypted PEM private key)"
        ) from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise CertificateError(
            f"unsupported CA key in {key_file} ({type(key).__name__}; expected EC or RSA)"
        )
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        raise CertificateError(
            f"the key in {key_file} does not belong to the certificate in {cert_file} "
            "(expected the CA's own key)"
        )
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CertificateError(
            f"{cert_file} is no CA certificate (expected basicConstraints CA:TRUE)"
        )
    return cert, key


def _issue_all(
    directory: Path,
    node_ids: Sequence[str],
    ca_cert: x509.Certificate,
    ca_key: CAKey,
    now: datetime.datetime,
    validity: datetime.timedelta,
    hosts: Mapping[str, str] | None = None,
) -> tuple[dict[str, tuple[Path, Path]], Path, Path]:
    """Node and client certificates under `ca_cert`, written into `directory`/tls; a node's
    certificate also names its advertised host in `hosts` (node id -> host)."""
    tls_dir = directory / TLS_DIR
    ca_name = ca_cert.subject
    server_and_client = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
    node_certs: dict[str, tuple[Path, Path]] = {}
    for node_id in node_ids:
        cert_pem, key_pem = _issue(
            f"raftwal node {node_id}",
            ca_name,
            ca_key,
            server_and_client,
            now,
            validity,
            [hosts[node_id]] if hosts and node_id in hosts else (),
        )
        cert_file, key_file = tls_dir / f"{node_id}.pem", tls_dir / f"{node_id}.key"
        # The key first: a certificate never sits beside a key it does not match for
        # longer than this.
        write_private(key_file, key_pem)
        cert_file.write_bytes(cert_pem)
        node_certs[node_id] = (cert_file, key_file)
    cert_pem, key_pem = _issue(
        "raftwal dev client",
        ca_name,
        ca_key,
        (ExtendedKeyUsageOID.CLIENT_AUTH,),
        now,
        validity,
    )
    client_cert_file, client_key_file = tls_dir / "client.pem", tls_dir / "client.key"
    write_private(client_key_file, key_pem)
    client_cert_file.write_bytes(cert_pem)
    return node_certs, client_cert_file, client_key_file


def issue_node(directory: Path, node_id: str, host: str) -> tuple[Path, Path]:
    """A certificate and key for one more node (`host` among its names) under the CA kept
    in `directory`/tls; nothing else is touched."""
    tls_dir = directory / TLS_DIR
    ca_cert, ca_key = load_ca(tls_dir / CA_CERT_FILE, tls_dir / CA_KEY_FILE)
    cert_pem, key_pem = _issue(
        f"raftwal node {node_id}",
        ca_cert.subject,
        ca_key,
        (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
        datetime.datetime.now(datetime.UTC),
        VALIDITY,
        [host],
    )
    cert_file, key_file = tls_dir / f"{node_id}.pem", tls_dir / f"{node_id}.key"
    write_private(key_file, key_pem)
    cert_file.write_bytes(cert_pem)
    return cert_file, key_file


def renew(
    directory: Path,
    node_ids: Sequence[str],
    validity: datetime.timedelta = VALIDITY,
    ca_cert_file: Path | None = None,
    ca_key_file: Path | None = None,
    hosts: Mapping[str, str] | None = None,
) -> None:
    """New node and client certificates (and keys) under the CA kept in `directory`/tls
    (or the one of `ca_cert_file`/`ca_key_file`, for a CA of your own), valid for
    `validity` from now; tokens are left as they are. The nodes load their certificate at
    start: restart them one at a time (``raftwal dev restart --rolling``)."""
    tls_dir = directory / TLS_DIR
    ca_cert, ca_key = load_ca(
        ca_cert_file or tls_dir / CA_CERT_FILE, ca_key_file or tls_dir / CA_KEY_FILE
    )
    _issue_all(
        directory, node_ids, ca_cert, ca_key, datetime.datetime.now(datetime.UTC), validity, hosts
    )


def generate(
    directory: Path,
    node_ids: Sequence[str],
    ca_cert_file: Path | None = None,
    ca_key_file: Path | None = None,
    hosts: Mapping[str, str] | None = None,
) -> DevSecurity:
    """Node and client certificates, and tokens for every role, in `directory`, under the
    CA of `ca_cert_file`/`ca_key_file` when given (its key is not copied), else under the
    CA kept in `directory` from an earlier run, else under a new one (kept: ca.key, 0600).
    Every certificate names 127.0.0.1, ::1 and localhost; a node's also names its host in
    `hosts` (node id -> advertised IP or DNS name)."""
    tls_dir = directory / TLS_DIR
    tokens_dir = directory / TOKENS_DIR
    for path in (tls_dir, tokens_dir):
        path.mkdir(mode=0o700, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    kept_cert, kept_key = tls_dir / CA_CERT_FILE, tls_dir / CA_KEY_FILE
    if (ca_cert_file is None) != (ca_key_file is None):
        raise CertificateError(
            "a CA certificate without its key or the other way round (expected both "
            "--ca-cert and --ca-key, or neither)"
        )
    if ca_cert_file is not None and ca_key_file is not None:
        ca_cert, ca_key = load_ca(ca_cert_file, ca_key_file)
        if kept_key.exists():
            kept_key.unlink()  # a CA of our own must not linger beside another's
        kept_cert.write_bytes(_cert_pem(ca_cert))
    elif kept_cert.exists() and kept_key.exists():
        ca_cert, ca_key = load_ca(kept_cert, kept_key)
    else:
        ca_cert, new_key = _new_ca(now)
        ca_key = new_key
        write_private(kept_key, _key_pem(new_key))
        kept_cert.write_bytes(_cert_pem(ca_cert))
    node_certs, client_cert_file, client_key_file = _issue_all(
        directory, node_ids, ca_cert, ca_key, now, VALIDITY, hosts
    )
    ca_file = kept_cert
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
