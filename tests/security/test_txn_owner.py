"""A transaction answers only the caller that began it (issue 40, item 1).

The audit opened a transaction under ``producer_id="tenant-A"`` and appended to it, then
rolled it back, from another connection holding only the producer token, with and without
TLS and tokens. Now the owner binds every transaction to its opener's identity (the
SHA-256 of its bearer token, and its client certificate's subject under mutual TLS) and to
its ``producer_id``; AppendTxn, CommitTxn, RollbackTxn and KeepAliveTxn from anyone else
get PERMISSION_DENIED with an ErrorInfo, and the transaction is untouched: its opener
still commits it whole. Transaction ids are random, not ``(term << 32) | counter``.

Real clusters (one node each, to spare the CPU): one from ``dev up --secure`` (mutual TLS,
tokens per role), one with neither. Talks to the node through the generated stubs only.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from rpc.credentials import ClientSecurity
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import consume_all, wait_assigned, wait_nodes_up
from tests.timing import scaled

pytestmark = pytest.mark.cluster
E = errors_pb2
CALL_TIMEOUT_S = scaled(10.0)


@pytest.fixture(scope="module", params=["tokens", "open"])
def env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dev.LocalCluster, str, str]]:
    secure = request.param == "tokens"
    local = dev.up(
        tmp_path_factory.mktemp(f"txnowner-{request.param}"), 1, timeout_s=60, secure=secure
    )
    admin = Api(local.endpoints, local.client_security("admin"))
    try:
        wait_nodes_up(admin, 1)
        (pchannel,) = admin.call(
            "CreateChannels", api.CreateChannelsRequest(prefix="own", count=1)
        ).pchannels
        admin.call("CreateVChannel", api.CreateVChannelRequest(name="own_v", pchannel=pchannel))
        _, _, address = wait_assigned(admin, pchannel)
        yield local, pchannel, address
    finally:
        admin.close()
        local.stop_all()


def _stub(
    security: ClientSecurity, address: str
) -> tuple[grpc.Channel, streaming_pb2_grpc.StreamingNodeStub]:
    channel = security.channel(address)
    return channel, streaming_pb2_grpc.StreamingNodeStub(channel)


def _denied(call, request) -> errors_pb2.ErrorInfo:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as raised:
        call(request, timeout=CALL_TIMEOUT_S)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED, raised.value.details()
    info = from_rpc_error(raised.value)
    assert info.code == E.PERMISSION_DENIED, info
    assert "did not begin it" in info.message, info.message
    return info


def _intruders(local: dev.LocalCluster) -> list[tuple[str, ClientSecurity, str]]:
    """(what, credentials, producer_id) of callers that did not begin the transaction."""
    producer = local.client_security("producer")
    callers = [
        ("same credentials, no producer_id", producer, ""),
        ("same credentials, another producer_id", producer, "tenant-B"),
    ]
    if local.security is not None:
        # Another token (admin may call AppendTxn too), claiming the same producer_id.
        callers.append(
            ("another token, same producer_id", local.client_security("admin"), "tenant-A")
        )
    return callers


def test_another_caller_cannot_append_commit_or_roll_back(env) -> None:
    local, pchannel, address = env
    owner_channel, owner = _stub(local.client_security("producer"), address)
    with owner_channel:
        begun = owner.BeginTxn(
            wire.BeginTxnRequest(vchannel="own_v", producer_id="tenant-A"), timeout=CALL_TIMEOUT_S
        )
        txn_id = begun.txn_id
        owner.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="own_v",
                txn_id=txn_id,
                producer_id="tenant-A",
                messages=[wire.Message(payload=b"mine-1")],
            ),
            timeout=CALL_TIMEOUT_S,
        )
        for what, security, producer_id in _intruders(local):
            channel, intruder = _stub(security, address)
            with channel:
                _denied(
                    intruder.AppendTxn,
                    wire.AppendTxnRequest(
                        vchannel="own_v",
                        txn_id=txn_id,
                        producer_id=producer_id,
                        messages=[wire.Message(payload=f"injected by {what}".encode())],
                    ),
                )
                _denied(
                    intruder.KeepAliveTxn,
                    wire.KeepAliveTxnRequest(
                        vchannel="own_v", txn_id=txn_id, producer_id=producer_id
                    ),
                )
                _denied(
                    intruder.RollbackTxn,
                    wire.RollbackTxnRequest(
                        vchannel="own_v", txn_id=txn_id, producer_id=producer_id
                    ),
                )
                _denied(
                    intruder.CommitTxn,
                    wire.CommitTxnRequest(vchannel="own_v", txn_id=txn_id, producer_id=producer_id),
                )
        # The opener's transaction is untouched: it holds its one message and commits.
        appended = owner.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="own_v",
                txn_id=txn_id,
                producer_id="tenant-A",
                messages=[wire.Message(payload=b"mine-2")],
            ),
            timeout=CALL_TIMEOUT_S,
        )
        assert appended.buffered_messages == 2
        committed = owner.CommitTxn(
            wire.CommitTxnRequest(vchannel="own_v", txn_id=txn_id, producer_id="tenant-A"),
            timeout=CALL_TIMEOUT_S,
        )
        assert len(committed.positions) == 4  # begin, two messages, commit
        # A retried commit by someone else learns nothing either.
        channel, intruder = _stub(local.client_security("producer"), address)
        with channel:
            _denied(
                intruder.CommitTxn,
                wire.CommitTxnRequest(vchannel="own_v", txn_id=txn_id, producer_id="tenant-B"),
            )
    admin = Api(local.endpoints, local.client_security("admin"))
    try:
        payloads = [e.payload for e in consume_all(admin, "own_v", pchannel, expect=2)]
    finally:
        admin.close()
    assert b"mine-1" in payloads and b"mine-2" in payloads
    assert not any(p.startswith(b"injected") for p in payloads), payloads


def test_a_transaction_without_producer_id_is_bound_to_its_token(env) -> None:
    local, pchannel, address = env
    if local.security is None:
        pytest.skip("without tokens or certificates a caller has no identity to bind to")
    owner_channel, owner = _stub(local.client_security("producer"), address)
    with owner_channel:
        txn_id = owner.BeginTxn(
            wire.BeginTxnRequest(vchannel="own_v"), timeout=CALL_TIMEOUT_S
        ).txn_id
        channel, intruder = _stub(local.client_security("admin"), address)
        with channel:
            _denied(intruder.RollbackTxn, wire.RollbackTxnRequest(vchannel="own_v", txn_id=txn_id))
        owner.RollbackTxn(
            wire.RollbackTxnRequest(vchannel="own_v", txn_id=txn_id), timeout=CALL_TIMEOUT_S
        )


def test_transaction_ids_are_not_sequential(env) -> None:
    local, pchannel, address = env
    channel, stub = _stub(local.client_security("producer"), address)
    with channel:
        ids = [
            stub.BeginTxn(wire.BeginTxnRequest(vchannel="own_v"), timeout=CALL_TIMEOUT_S).txn_id
            for _ in range(8)
        ]
        for txn_id in ids:
            stub.RollbackTxn(
                wire.RollbackTxnRequest(vchannel="own_v", txn_id=txn_id), timeout=CALL_TIMEOUT_S
            )
    assert len(set(ids)) == len(ids)
    assert all(txn_id > 0 for txn_id in ids)
    # (term << 32) | counter gave ids one apart; random 63-bit ids are nowhere near.
    gaps = [abs(b - a) for a, b in zip(ids, ids[1:], strict=False)]
    assert min(gaps) > 1 << 20, ids
