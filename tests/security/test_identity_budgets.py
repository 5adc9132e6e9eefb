"""Budgets per identity: one token cannot take what the others need (issue 53, items 5
and 6; SECURITY.md).

A one-node secure cluster (TLS, tokens per role). The greedy application holds the
consumer token (leases) or the producer token (transactions); another application holds
another token.

- **Leases**: with BatchWrite the consumer token takes leases until refused. It gets
  `max_leases_per_owner` (8,192) of them, then RESOURCE_EXHAUSTED naming that budget;
  another token's GrantLease and Lock still succeed. On the old code the token went on to
  the cluster's 65,536 (the audit's run), after which every other application's
  GrantLease was refused with INVALID_ARGUMENT.
- **Transactions**: the producer token opens transactions under six producer ids and
  fills them with 4 MiB appends until refused. It holds at most
  `txn_buffer_identity_budget_bytes` (32 MiB), is refused naming that budget, and another
  token's transaction of 12 MiB still buffers and commits. On the old code the six ids
  held 60 of the node's 64 MiB (each under its own 32 MiB), and the other application's
  appends got RESOURCE_EXHAUSTED.

Talks to the node only through the generated stubs, as a client in any language would.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2 as E
from rpc.protos import streaming_pb2 as wire
from rpc.protos import streaming_pb2_grpc
from statemachine import DEFAULT_LIMITS
from tests.cluster.conftest import Api
from tests.cluster.wal_helpers import wait_assigned
from tests.timing import scaled

pytestmark = pytest.mark.cluster

PCHANNEL = "budget_0"
VCHANNEL = "budget_v"
CHUNK = 4 << 20
BATCH = 1024  # grants per BatchWrite (its maximum)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    local = dev.up(tmp_path_factory.mktemp("budgets"), 1, timeout_s=90, secure=True)
    try:
        admin = Api(local.endpoints, local.client_security("admin"))
        try:
            admin.call("CreateChannels", api.CreateChannelsRequest(names=[PCHANNEL]))
            admin.call(
                "CreateVChannel", api.CreateVChannelRequest(name=VCHANNEL, pchannel=PCHANNEL)
            )
        finally:
            admin.close()
        yield local
    finally:
        local.stop_all()


def _grants(client: Api, count: int, holder: str) -> list[api.BatchWriteResult]:
    request = api.BatchWriteRequest(
        ops=[
            api.BatchWriteOp(grant_lease=api.GrantLeaseRequest(ttl_ms=600_000, holder=holder))
            for _ in range(count)
        ]
    )
    return list(client.call("BatchWrite", request, timeout_s=60).results)


def test_one_token_cannot_take_every_lease(cluster: dev.LocalCluster) -> None:
    greedy = Api(cluster.endpoints, cluster.client_security("consumer"))
    other = Api(cluster.endpoints, cluster.client_security("producer"))
    try:
        budget = DEFAULT_LIMITS.max_leases_per_owner
        granted: list[int] = []
        refused: list[E.ErrorInfo] = []
        # Past its budget, and well past it: every grant beyond is refused.
        for _ in range(budget // BATCH + 2):
            for result in _grants(greedy, BATCH, "greedy"):
                if result.error.code == E.OK:
                    granted.append(result.grant_lease.lease_id)
                else:
                    refused.append(result.error)
        print(f"granted {len(granted)}, refused {len(refused)}")
        assert len(granted) == budget, (len(granted), refused[:1])
        assert len(refused) == 2 * BATCH
        assert {r.code for r in refused} == {E.RESOURCE_EXHAUSTED}, refused[:1]
        assert "the per-identity lease budget max_leases_per_owner" in refused[0].message
        assert f"({budget}; expected fewer than {budget}" in refused[0].message
        # Over the gRPC call too, with the matching status code.
        with pytest.raises(grpc.RpcError) as raised:
            greedy.call("GrantLease", api.GrantLeaseRequest(ttl_ms=60_000, holder="greedy"))
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert from_rpc_error(raised.value).code == E.RESOURCE_EXHAUSTED

        # Another application is not affected.
        lease = other.call("GrantLease", api.GrantLeaseRequest(ttl_ms=60_000, holder="other"))
        assert lease.lease_id > 0
        locked = other.call("Lock", api.LockRequest(key="other/k", mode=1, lease_id=lease.lease_id))
        assert locked.fencing_token > 0
        assert all(r.error.code == E.OK for r in _grants(other, 16, "other"))

        # A revoked lease gives the greedy token one grant back, and no more.
        greedy.call("RevokeLease", api.RevokeLeaseRequest(lease_id=granted[0]))
        assert [r.error.code for r in _grants(greedy, 2, "greedy")] == [
            E.OK,
            E.RESOURCE_EXHAUSTED,
        ]
    finally:
        greedy.close()
        other.close()


def _stub(client: Api, address: str) -> tuple[grpc.Channel, streaming_pb2_grpc.StreamingNodeStub]:
    channel = client.security.channel(address, [("grpc.max_send_message_length", 32 << 20)])
    return channel, streaming_pb2_grpc.StreamingNodeStub(channel)


def test_one_token_cannot_fill_the_transaction_buffer(cluster: dev.LocalCluster) -> None:
    greedy = Api(cluster.endpoints, cluster.client_security("producer"))
    other = Api(cluster.endpoints, cluster.client_security("admin"))
    _, _, address = wait_assigned(greedy, PCHANNEL)
    greedy_channel, greedy_stub = _stub(greedy, address)
    other_channel, other_stub = _stub(other, address)
    payload = b"x" * CHUNK
    timeout = scaled(30)
    try:
        accepted = 0
        refusals: list[E.ErrorInfo] = []
        for index in range(6):
            producer_id = f"greedy-{index}"
            txn_id = greedy_stub.BeginTxn(
                wire.BeginTxnRequest(vchannel=VCHANNEL, producer_id=producer_id), timeout=timeout
            ).txn_id
            for _ in range(3):  # 12 MiB per producer id: under its own 32 MiB
                try:
                    greedy_stub.AppendTxn(
                        wire.AppendTxnRequest(
                            vchannel=VCHANNEL,
                            txn_id=txn_id,
                            producer_id=producer_id,
                            messages=[wire.Message(payload=payload)],
                        ),
                        timeout=timeout,
                    )
                    accepted += 1
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
                    refusals.append(from_rpc_error(error))
                    break
        print(f"greedy token: {accepted} chunks of 4 MiB buffered, {len(refusals)} refused")
        assert accepted * (CHUNK + 100) <= 32 << 20
        assert refusals, "the greedy token was never refused"
        assert "txn_buffer_identity_budget_bytes" in refusals[0].message, refusals[0]
        assert "this caller's transaction buffer, over all its producer ids" in (
            refusals[0].message
        )

        # Another application's 12 MiB transaction buffers and commits.
        txn_id = other_stub.BeginTxn(
            wire.BeginTxnRequest(vchannel=VCHANNEL, producer_id="other"), timeout=timeout
        ).txn_id
        for _ in range(3):
            other_stub.AppendTxn(
                wire.AppendTxnRequest(
                    vchannel=VCHANNEL,
                    txn_id=txn_id,
                    producer_id="other",
                    messages=[wire.Message(payload=payload)],
                ),
                timeout=timeout,
            )
        committed = other_stub.CommitTxn(
            wire.CommitTxnRequest(vchannel=VCHANNEL, txn_id=txn_id, producer_id="other"),
            timeout=timeout,
        )
        assert len(committed.positions) == 3 + 2
    finally:
        greedy_channel.close()
        other_channel.close()
        greedy.close()
        other.close()
