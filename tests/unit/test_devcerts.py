"""`dev up --secure`'s key material can be renewed (issue 40, item 9).

The CA key is kept (tls/ca.key, 0600) so that `raftwal dev renew-certs` issues new node
and client certificates under the same CA, a second `generate` in the same directory keeps
the CA, and a CA of one's own can be supplied instead (its key is not copied). A
certificate valid for a negative time is expired: what the audit could not make to test
with.
"""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from raftwal.cli import devcerts


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    try:
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
    except Exception:  # noqa: BLE001 (InvalidSignature and friends: not signed by it)
        return False
    return cert.issuer == ca.subject


def test_the_ca_key_is_kept_private_and_renewal_uses_it(tmp_path: Path) -> None:
    security = devcerts.generate(tmp_path, ["n1", "n2"])
    ca_key = tmp_path / devcerts.TLS_DIR / devcerts.CA_KEY_FILE
    assert stat.S_IMODE(ca_key.stat().st_mode) == 0o600
    ca = _cert(security.ca_file)
    old = _cert(security.node_certs["n1"][0])
    devcerts.renew(tmp_path, ["n1", "n2"], datetime.timedelta(days=30))
    new = _cert(security.node_certs["n1"][0])
    assert new.serial_number != old.serial_number
    assert _signed_by(new, ca) and _signed_by(_cert(security.client_cert_file), ca)
    assert new.not_valid_after_utc < old.not_valid_after_utc  # 30 days instead of a year
    assert stat.S_IMODE(security.node_certs["n1"][1].stat().st_mode) == 0o600
    # An expired certificate, to test a node or client with.
    devcerts.renew(tmp_path, ["n1", "n2"], datetime.timedelta(days=-1))
    expired = _cert(security.node_certs["n2"][0])
    assert expired.not_valid_after_utc < datetime.datetime.now(datetime.UTC)
    assert expired.not_valid_before_utc < expired.not_valid_after_utc
    # A second generate in the same directory keeps the CA (clients keep trusting it).
    again = devcerts.generate(tmp_path, ["n1", "n2"])
    assert _cert(again.ca_file) == ca
    assert _signed_by(_cert(again.node_certs["n2"][0]), ca)


def test_a_ca_of_ones_own_signs_and_is_not_copied(tmp_path: Path) -> None:
    for name in ("own", "dev", "bad"):
        (tmp_path / name).mkdir(mode=0o700)
    own = devcerts.generate(tmp_path / "own", ["x"])
    own_cert = own.ca_file
    own_key = tmp_path / "own" / devcerts.TLS_DIR / devcerts.CA_KEY_FILE
    security = devcerts.generate(tmp_path / "dev", ["n1"], own_cert, own_key)
    assert _cert(security.ca_file) == _cert(own_cert)
    assert _signed_by(_cert(security.node_certs["n1"][0]), _cert(own_cert))
    assert not (tmp_path / "dev" / devcerts.TLS_DIR / devcerts.CA_KEY_FILE).exists()
    devcerts.renew(tmp_path / "dev", ["n1"], ca_cert_file=own_cert, ca_key_file=own_key)
    with pytest.raises(devcerts.CertificateError, match="cannot load the CA"):
        devcerts.renew(tmp_path / "dev", ["n1"])  # no kept key: say so
    with pytest.raises(devcerts.CertificateError, match="is no CA certificate"):
        devcerts.generate(tmp_path / "bad", ["n1"], own.node_certs["x"][0], own.node_certs["x"][1])
