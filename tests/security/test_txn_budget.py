"""Open transactions are bounded by bytes, not only by count.

An attacker with a producer token opens many transactions and fills each close to its
16 MiB limit without ever committing. Before the budgets, sixty transactions of 12 MiB
raised the owner's memory by about 740 MB. With the default settings:

- a node holds at most ``txn_buffer_budget_bytes`` (64 MiB) of uncommitted transaction
  data, and one producer at most ``txn_buffer_producer_budget_bytes`` (32 MiB);
- past either, an append gets RESOURCE_EXHAUSTED with an ErrorInfo naming the budget and
  how full it is;
- sixty open transactions of 12 MiB each grow the owner by less than 256 MB;
- what was acknowledged before stays readable, and a transaction that fit still commits.

Talks to the nodes only through the generated stubs, as a client in any language would.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from raftwal.cli import dev
from rpc.errors import from_rpc_error
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from tests.cluster.conftest import Api, running_cluster
from tests.cluster.wal_helpers import consume_all, setup_channels, wait_assigned
from tests.processes import node_rss_bytes
from tests.timing import scaled

pytestmark = pytest.mark.cluster
E = errors_pb2
CALL_TIMEOUT_S = scaled(30.0)
CHUNK = 4 << 20  # one AppendTxn: a 4 MiB payload (the payload limit is 8 MiB)
CHUNKS_PER_TXN = 3  # 12 MiB per transaction
TRANSACTIONS = 60
MAX_GROWTH_BYTES = 256 << 20


def _rss_bytes(pid: int) -> int:
    # The whole node: supervisor, control process and data workers.
    return node_rss_bytes(pid)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dev.LocalCluster, Api]]:
    with running_cluster(tmp_path_factory.mktemp("txnbudget")) as running:
        yield running


def _append(stub, txn_id: int, payload: bytes, producer_id: str) -> grpc.RpcError | None:  # type: ignore[no-untyped-def]
    try:
        stub.AppendTxn(
            wire.AppendTxnRequest(
                vchannel="budget_v",
                txn_id=txn_id,
                messages=[wire.Message(payload=payload)],
                # A transaction answers only the producer_id that began it.
                producer_id=producer_id,
            ),
            timeout=CALL_TIMEOUT_S,
        )
    except grpc.RpcError as error:
        return error
    return None


def test_open_transactions_are_bounded_by_bytes(env) -> None:
    cluster, client = env
    (pchannel,) = setup_channels(client, "budget", {"budget_v": 0})
    owner, _, address = wait_assigned(client, pchannel)
    pid = cluster.pid(owner)
    assert pid is not None
    payload = b"x" * CHUNK
    with grpc.insecure_channel(
        address,
        options=[("grpc.max_send_message_length", 32 << 20)],
    ) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        # Acknowledged before the flood: must stay readable.
        (before,) = stub.Produce(
            iter(
                [
                    wire.ProduceRequest(
                        request_id=1,
                        pchannel=pchannel,
                        messages=[wire.Message(vchannel="budget_v", payload=b"ok")],
                    )
                ]
            ),
            timeout=CALL_TIMEOUT_S,
        )
        assert before.positions, before
        baseline = _rss_bytes(pid)

        # One producer's budget: 32 MiB of its own, whatever the node has left.
        mine = [
            stub.BeginTxn(
                wire.BeginTxnRequest(vchannel="budget_v", producer_id="one-app"),
                timeout=CALL_TIMEOUT_S,
            ).txn_id
            for _ in range(3)
        ]
        refusals = [_append(stub, txn_id, payload, "one-app") for txn_id in mine for _ in range(3)]
        assert refusals[:7] == [None] * 7, [r and r.details() for r in refusals[:7]]
        assert refusals[7] is not None and refusals[8] is not None
        info = from_rpc_error(refusals[7])
        assert refusals[7].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.code == E.RESOURCE_EXHAUSTED, info
        assert "producer 'one-app'" in info.message, info.message
        assert "txn_buffer_producer_budget_bytes" in info.message
        assert "of 32.0 MiB held by 3 open transaction(s)" in info.message, info.message
        for txn_id in mine:
            stub.RollbackTxn(
                wire.RollbackTxnRequest(vchannel="budget_v", txn_id=txn_id, producer_id="one-app"),
                timeout=CALL_TIMEOUT_S,
            )

        # Many producers: the node's budget (64 MiB) holds, whatever the count.
        accepted = 0
        node_refusals: list[errors_pb2.ErrorInfo] = []
        opened: list[int] = []
        for index in range(TRANSACTIONS):
            txn_id = stub.BeginTxn(
                # Kept alive through the whole loop: on a slow machine the default 10 s
                # let the first ones expire, and their bytes went back to the budget.
                wire.BeginTxnRequest(
                    vchannel="budget_v", producer_id=f"app-{index}", keepalive_ms=600_000
                ),
                timeout=CALL_TIMEOUT_S,
            ).txn_id
            opened.append(txn_id)
            for _ in range(CHUNKS_PER_TXN):
                error = _append(stub, txn_id, payload, f"app-{index}")
                if error is None:
                    accepted += 1
                else:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
                    node_refusals.append(from_rpc_error(error))
                    break
        grown = _rss_bytes(pid) - baseline
        print(f"owner grew {grown / (1 << 20):.0f} MiB; {accepted} chunks of 4 MiB accepted")
        assert grown < MAX_GROWTH_BYTES, f"owner grew by {grown / (1 << 20):.0f} MiB"
        assert accepted * CHUNK <= 64 << 20
        assert len(node_refusals) == TRANSACTIONS - accepted // CHUNKS_PER_TXN
        for info in node_refusals:
            assert info.code == E.RESOURCE_EXHAUSTED
            assert "txn_buffer_budget_bytes" in info.message, info.message
            assert "of 64.0 MiB" in info.message, info.message

        # A transaction that fit still commits; the rest roll back and free the budget.
        first = opened[0]
        committed = stub.CommitTxn(
            wire.CommitTxnRequest(vchannel="budget_v", txn_id=first, producer_id="app-0"),
            timeout=CALL_TIMEOUT_S,
        )
        assert len(committed.positions) == CHUNKS_PER_TXN + 2
        for index, txn_id in enumerate(opened[1:], start=1):
            stub.RollbackTxn(
                wire.RollbackTxnRequest(
                    vchannel="budget_v", txn_id=txn_id, producer_id=f"app-{index}"
                ),
                timeout=CALL_TIMEOUT_S,
            )
        again = stub.BeginTxn(
            wire.BeginTxnRequest(vchannel="budget_v", producer_id="app-0"),
            timeout=CALL_TIMEOUT_S,
        ).txn_id
        assert _append(stub, again, payload, "app-0") is None
        stub.RollbackTxn(
            wire.RollbackTxnRequest(vchannel="budget_v", txn_id=again, producer_id="app-0"),
            timeout=CALL_TIMEOUT_S,
        )

    acknowledged_lsn = before.positions[0].lsn
    entries = consume_all(client, "budget_v", pchannel, expect=1)
    assert entries[0].lsn == acknowledged_lsn and entries[0].payload == b"ok"
    # The committed transaction, read back with room for its 4 MiB entries.
    _, _, address = wait_assigned(client, pchannel)
    body: list[wire.WalEntry] = []
    with grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        stream = streaming_pb2_grpc.StreamingNodeStub(channel).Consume(
            wire.ConsumeRequest(
                vchannel="budget_v",
                policy=wire.DELIVER_POLICY_START_FROM,
                lsn=committed.positions[0].lsn,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        for response in stream:
            body.extend(response.entries)
            if len(body) >= CHUNKS_PER_TXN + 2:
                stream.cancel()
                break
    assert [e.txn_id for e in body] == [first] * (CHUNKS_PER_TXN + 2)
    assert [len(e.payload) for e in body[1:-1]] == [CHUNK] * CHUNKS_PER_TXN
