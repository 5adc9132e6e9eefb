"""Table tests of the pure parts of issue 40: who a caller is (callers), whether it may
act on a transaction (check_owner), and the stream caps' counting (StreamCaps)."""

from __future__ import annotations

import hashlib

import pytest

from raftwal.services.callers import TxnOwner, caller_identity, check_owner
from raftwal.services.stream_caps import StreamCaps
from rpc.protos import errors_pb2

E = errors_pb2
TOKEN = "a-token-of-at-least-sixteen-chars"


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...], auth: dict | None = None) -> None:
        self._metadata = metadata
        self._auth = auth or {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict:
        return self._auth


@pytest.mark.parametrize(
    ("metadata", "auth", "expected"),
    [
        ((), None, ""),
        (
            (("authorization", f"Bearer {TOKEN}"),),
            None,
            f"token:{hashlib.sha256(TOKEN.encode()).hexdigest()}",
        ),
        ((("authorization", TOKEN),), None, ""),  # no scheme: the interceptor refuses it
        ((), {"x509_subject": [b"CN=client,O=x"]}, "cert:CN=client,O=x"),
        ((), {"x509_common_name": [b"client"]}, "cert:client"),
        (
            (("authorization", f"bearer {TOKEN}"),),
            {"x509_subject": [b"CN=c"]},
            f"token:{hashlib.sha256(TOKEN.encode()).hexdigest()}|cert:CN=c",
        ),
    ],
)
def test_caller_identity(metadata, auth, expected: str) -> None:  # type: ignore[no-untyped-def]
    identity = caller_identity(_Context(metadata, auth))
    assert identity == expected
    assert TOKEN not in identity


@pytest.mark.parametrize(
    ("caller", "allowed", "named"),
    [
        (TxnOwner("token:a", "p"), True, ""),
        (TxnOwner("token:b", "p"), False, "another identity"),
        (TxnOwner("token:a", ""), False, "producer_id ''"),
        (TxnOwner("token:a", "q"), False, "producer_id 'q'"),
        (TxnOwner("", ""), False, "another identity"),
    ],
)
def test_check_owner(caller: TxnOwner, allowed: bool, named: str) -> None:
    refused = check_owner(TxnOwner("token:a", "p"), caller, 42, "AppendTxn")
    assert (refused is None) == allowed
    if refused is not None:
        assert refused.info.code == E.PERMISSION_DENIED
        assert named in refused.info.message
        assert "token:a" not in refused.info.message  # the owner's identity is not told
        assert "AppendTxn of transaction 42" in refused.info.message


def test_stream_caps_count_per_node_and_identity() -> None:
    caps = StreamCaps(max_node_streams=3, max_identity_streams=2)
    assert caps.take("Consume", "a") is None
    assert caps.take("Consume", "a") is None
    refused = caps.take("Consume", "a")
    assert refused is not None and "max_identity_streams" in refused.message
    assert refused.code == E.RESOURCE_EXHAUSTED
    assert caps.take("WatchEvents", "a") is None  # each method on its own
    assert caps.take("Consume", "b") is None
    refused = caps.take("Consume", "c")
    assert refused is not None and "max_node_streams" in refused.message
    assert caps.refused == {("Consume", "identity"): 1, ("Consume", "node"): 1}
    caps.give_back("Consume", "a")
    assert caps.take("Consume", "c") is None
    for identity in ("a", "b", "c"):
        caps.give_back("Consume", identity)
    caps.give_back("WatchEvents", "a")
    assert caps.open == dict.fromkeys(caps.open, 0)
    assert caps._by_identity == {}  # noqa: SLF001 (no entry for an identity with no stream)
    with pytest.raises(ValueError, match="expected 1 <= identity <= node"):
        StreamCaps(max_node_streams=1, max_identity_streams=2)
