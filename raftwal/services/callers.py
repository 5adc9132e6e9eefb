"""Who is calling: the identity a servicer binds long-lived things (transactions) to.

``caller_identity(context)`` names the authenticated caller of a gRPC call without ever
holding on to its credentials: the SHA-256 digest of its bearer token (the token names its
role too) and, under mutual TLS, the subject of its client certificate. A call with
neither (auth off, plaintext) has the empty identity: it is bound by what it says about
itself (``producer_id``) and by the unguessable transaction id, nothing else.

``TxnOwner`` is what a transaction records of its opener; ``check_owner`` compares a later
caller with it and answers PERMISSION_DENIED with an ErrorInfo on any difference.

This module must never return, log or put into a message any part of a token, nor the
owner's identity or producer_id (a refused caller learns only that it is not the owner).
Must never import ``raftwal.node``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from raftwal.services.common import fail
from rpc.errors import RaftwalError
from rpc.protos import errors_pb2

E = errors_pb2


def _bearer_digest(metadata: Any) -> str:
    """The hex SHA-256 of the call's bearer token ("" without exactly one Bearer header).
    The interceptor already refused malformed headers when tokens are on."""
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return ""
    scheme, _, token = values[0].strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return ""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def _certificate_subject(context: Any) -> str:
    """The client certificate's subject under mutual TLS ("" without one)."""
    try:
        auth = context.auth_context() or {}
    except (AttributeError, RuntimeError):
        return ""
    for key in ("x509_subject", "x509_common_name"):
        values = auth.get(key) or ()
        if values:
            value = values[0]
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return ""


def caller_identity(context: Any) -> str:
    """ "token:<sha256>|cert:<subject>" for the authenticated parts of the call, or ""."""
    parts = []
    digest = _bearer_digest(context.invocation_metadata())
    if digest:
        parts.append(f"token:{digest}")
    subject = _certificate_subject(context)
    if subject:
        parts.append(f"cert:{subject}")
    return "|".join(parts)


def identity_name(identity: str, secret: str) -> str:
    """The name `identity` (``caller_identity``) is known by in the replicated coordination
    state (``Lease.owner``: the per-identity budgets): "id:" and 128 bits of an HMAC-SHA256
    keyed by the cluster secret, "" for the empty identity. Every node of a cluster shares
    the secret, so every node names a caller alike; the name is visible to every read role
    (WatchEvents), and without the secret it tells nothing about the token, however weak
    that is. A new cluster secret renames every caller (leases granted before keep the old
    name until they end)."""
    if not identity:
        return ""
    key = hashlib.sha256(b"raftwal caller identity name\0" + secret.encode()).digest()
    return "id:" + hmac.new(key, identity.encode(), hashlib.sha256).hexdigest()[:32]


def token_digest(identity: str) -> str:
    """The bearer token's digest within a ``caller_identity`` ("" when it has none)."""
    for part in identity.split("|"):
        if part.startswith("token:"):
            return part[len("token:") :]
    return ""


@dataclass(frozen=True)
class TxnOwner:
    """Whoever began a transaction: its identity (``caller_identity``) and its producer_id
    (empty when BeginTxn gave none)."""

    identity: str
    producer_id: str


def check_owner(owner: TxnOwner, caller: TxnOwner, txn_id: int, method: str) -> RaftwalError | None:
    """None when `caller` may act on the transaction `owner` began, else PERMISSION_DENIED.
    The producer_id must match exactly (a txn begun without one takes none later)."""
    if owner == caller:
        return None
    what = []
    if owner.identity != caller.identity:
        what.append("another identity (token or client certificate)")
    if owner.producer_id != caller.producer_id:
        what.append(f"producer_id {caller.producer_id[:64]!r}")
    return fail(
        E.PERMISSION_DENIED,
        f"{method} of transaction {txn_id} by a caller that did not begin it (got "
        f"{' and '.join(what)}; expected the token, client certificate and producer_id "
        "of the BeginTxn call)",
    )
