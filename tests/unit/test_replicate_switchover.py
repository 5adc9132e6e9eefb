"""A planned switchover in the pure core (statemachine/replicate.py, decider.py): the
configuration's `switchover` and `start_after_lsns` validated, the write pause refusing
new broadcasts and waiting for pending ones, the drain recorded only during a switchover
and cleared by the next configuration, and the retention hold of a reversed edge. The
cluster side is tests/cluster/test_replicate_two_clusters.py."""

from __future__ import annotations

import pytest
from helpers import VCHANNELS, E, Harness, broadcast, cmd, kinds

from rpc.protos import coordination_pb2 as pb
from statemachine import DEFAULT_LIMITS
from statemachine.replicate import (
    check_configuration,
    replication_hold,
    start_after,
    switching_to,
    write_refusal,
)


def configuration(
    *edges: str,
    switchover: str = "",
    start: tuple[int, ...] = (),
) -> pb.ReplicateConfiguration:
    """east (pchannels p1 p2, this cluster in the Harness rows), west and north; `edges`
    and `switchover` as "a>b" strings, `start` the start_after_lsns of every edge."""
    answer = pb.ReplicateConfiguration(
        clusters=[
            pb.ReplicateCluster(cluster_id="east", endpoints=["e:1"], pchannels=["p1", "p2"]),
            pb.ReplicateCluster(cluster_id="west", endpoints=["w:1"], pchannels=["q1", "q2"]),
            pb.ReplicateCluster(cluster_id="north", endpoints=["n:1"], pchannels=["r1", "r2"]),
        ],
        topology=[
            pb.ReplicateTopologyEdge(
                source_cluster_id=e.split(">")[0],
                target_cluster_id=e.split(">")[1],
                start_after_lsns=list(start),
            )
            for e in edges
        ],
    )
    if switchover:
        source, target = switchover.split(">")
        answer.switchover.CopyFrom(
            pb.ReplicateSwitchover(source_cluster_id=source, target_cluster_id=target)
        )
    return answer


CASES = [
    ("a pause on the edge", configuration("east>west", switchover="east>west"), None),
    ("a reversed edge with its start", configuration("west>east", start=(7, 9)), None),
    ("a switchover against the edge", configuration("east>west", switchover="west>east"),
     "invalid switchover ('west' -> 'east'; expected an edge of the topology: east -> west)"),
    ("a switchover without edges", configuration(switchover="east>west"),
     "expected an edge of the topology: none"),
    ("a source with a second target", configuration("east>west", "east>north", switchover="east>west"),
     "invalid switchover east -> west (got other edges of east: east -> north; expected"),
    ("a source that is a target", configuration("north>east", "east>west", switchover="east>west"),
     "got other edges of east: north -> east"),
    ("start_after of the wrong length", configuration("east>west", start=(1,)),
     "invalid topology[0].start_after_lsns (1 LSNs; expected none or 2, one per pchannel)"),
    ("a negative start_after", configuration("east>west", start=(1, -1)),
     "invalid topology[0].start_after_lsns (-1; expected LSNs >= 0)"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "expected"), CASES)
def test_check_configuration(name: str, value: pb.ReplicateConfiguration, expected: str) -> None:
    rejection = check_configuration(value, "east", DEFAULT_LIMITS)
    if expected is None:
        assert rejection is None, rejection
        return
    assert rejection is not None, f"{name}: accepted"
    assert rejection.code == E.INVALID_ARGUMENT
    assert expected in rejection.message, rejection.message


def test_write_refusal_names_the_source_or_the_switchover() -> None:
    paused = configuration("east>west", switchover="east>west")
    assert switching_to(paused, "east") == "west"
    assert switching_to(paused, "west") == ""
    assert switching_to(configuration("east>west"), "east") == ""
    refusal = write_refusal(paused, "east", "p1", "a Produce")
    assert "cluster east is switching over to cluster west: writes are paused" in refusal
    assert "(got a Produce for pchannel p1; expected it on cluster west" in refusal
    # A pchannel of the source that the configuration does not list is not paused.
    assert write_refusal(paused, "east", "p9", "a Produce") == ""
    # The target of the switchover stays a target: its refusal names the source.
    assert "replication target of cluster east (got a BeginTxn" in write_refusal(
        paused, "west", "q2", "a BeginTxn"
    )
    assert write_refusal(configuration("east>west"), "east", "p1", "a Produce") == ""


def test_start_after_and_the_retention_hold_of_a_reversed_edge() -> None:
    reversed_edge = configuration("east>west", start=(40, 70))
    assert start_after(reversed_edge, "east", "west", "p2") == 70
    assert start_after(reversed_edge, "east", "north", "p2") == 0
    assert start_after(configuration("east>west"), "east", "west", "p1") == 0
    state = pb.CoordinationState(replicate_cluster_id="east")
    state.replicate_configuration.CopyFrom(reversed_edge)
    # Nothing reported yet: what west wrote itself before the reversal is not held.
    assert replication_hold(state, "p1") == 41
    state.replicate_checkpoints["p1"].source_lsns["west"] = 55
    assert replication_hold(state, "p1") == 56


def update(value: pb.ReplicateConfiguration) -> pb.Command:
    return cmd(
        update_replicate_configuration=pb.UpdateReplicateConfiguration(
            configuration=value, local_cluster_id="east"
        )
    )


def record(pchannel: str, source_lsn: int, drained: int = 0) -> pb.Command:
    return cmd(
        record_replicate_checkpoint=pb.RecordReplicateCheckpoint(
            pchannel=pchannel,
            target_cluster_id="west",
            source_lsn=source_lsn,
            drained_through_lsn=drained,
        )
    )


def test_the_pause_refuses_broadcasts_and_a_drain_is_recorded_only_during_it() -> None:
    harness = Harness()
    harness.ok(*VCHANNELS, update(configuration("east>west")), record("p1", 5))
    # A drain outside a switchover is refused.
    refused = harness.reject(record("p1", 6, drained=9), E.IGNORED_OPERATION)
    assert (
        "without a switchover to it (got none; expected this cluster switching over to west)"
        in (refused.rejection.message)
    )
    paused = configuration("east>west", switchover="east>west")
    harness.ok(update(paused))
    refused = harness.reject(broadcast("v1", "v3"), E.IGNORED_OPERATION)
    assert "cluster east is switching over to cluster west" in refused.rejection.message
    assert "got a broadcast to v1" in refused.rejection.message
    bad = harness.reject(record("p1", 8, drained=7), E.INVALID_ARGUMENT)
    assert "invalid drained_through_lsn (7; expected 0, or at least source_lsn 8)" in (
        bad.rejection.message
    )
    result = harness.ok(record("p1", 8, drained=12))
    assert kinds(result.events) == ["replicate_checkpoint_recorded"]
    checkpoints = harness.state.replicate_checkpoints["p1"]
    assert (checkpoints.source_lsns["west"], checkpoints.drained_through_lsns["west"]) == (8, 12)
    # The same drain again changes nothing; the checkpoint never goes back.
    assert kinds(harness.ok(record("p1", 8, drained=12)).events) == []
    assert kinds(harness.ok(record("p1", 3, drained=12)).events) == []
    assert harness.state.replicate_checkpoints["p1"].source_lsns["west"] == 8
    # Re-applying the same paused configuration (a rerun) keeps the drain ...
    assert kinds(harness.ok(update(paused)).events) == []
    assert harness.state.replicate_checkpoints["p1"].drained_through_lsns["west"] == 12
    # ... any other configuration (undoing the pause) clears it; broadcasts are taken again.
    harness.ok(update(configuration("east>west")))
    assert dict(harness.state.replicate_checkpoints["p1"].drained_through_lsns) == {}
    assert harness.state.replicate_checkpoints["p1"].source_lsns["west"] == 8
    assert kinds(harness.ok(broadcast("v1")).events)[0] == "broadcast_created"


def test_a_target_refuses_broadcasts_naming_its_source() -> None:
    harness = Harness()
    harness.ok(*VCHANNELS, update(configuration("west>east")))
    refused = harness.reject(broadcast("v3"), E.IGNORED_OPERATION)
    assert "pchannel p2 is a replication target of cluster west (got a broadcast to v3" in (
        refused.rejection.message
    )


def test_the_pause_waits_for_a_broadcast_being_appended() -> None:
    harness = Harness()
    harness.ok(*VCHANNELS, update(configuration("east>west")), broadcast("v1", "v3"))
    refused = harness.reject(
        update(configuration("east>west", switchover="east>west")), E.UNAVAILABLE
    )
    assert "are still being appended to pchannels of cluster east (got 1; expected none" in (
        refused.rejection.message
    )
    assert not harness.state.replicate_configuration.HasField("switchover")


def test_a_replicated_transaction_is_written_with_its_markers() -> None:
    from raftwal.services.replicated import with_transactions
    from rpc.errors import RaftwalError
    from wal_segments.format import EntryFlags, MsgType
    from wal_segments.owner import Message

    ids = iter([41, 42])
    plain = [Message(7, int(MsgType.MESSAGE), b"", f"m{k}".encode(), {}) for k in range(5)]
    types = ["message", "txn_begin", "insert", "txn_commit", "message"]
    out = with_transactions(plain, types, lambda: next(ids))
    assert [(m.msg_type, m.flags, m.txn_id) for m in out] == [
        (int(MsgType.MESSAGE), 0, 0),
        (int(MsgType.TXN_BEGIN), int(EntryFlags.TXN_BEGIN), 41),
        (int(MsgType.MESSAGE), int(EntryFlags.TXN_BODY), 41),
        (int(MsgType.TXN_COMMIT), int(EntryFlags.TXN_COMMIT), 41),
        (int(MsgType.MESSAGE), 0, 0),
    ]
    assert out[3].properties == {"rw.txn.count": "3"}
    assert with_transactions(plain, ["message"] * 5, lambda: 1) is plain
    for bad, expected in (
        (["txn_begin", "txn_begin", "message", "txn_commit", "message"], "begins inside another"),
        (["message", "txn_commit", "message", "message", "message"], "commits without a begin"),
        (["message", "txn_begin", "message", "message", "message"], "without its commit"),
    ):
        with pytest.raises(RaftwalError) as raised:
            with_transactions(plain, bad, lambda: 9)
        assert raised.value.info.code == E.INVALID_ARGUMENT
        assert expected in raised.value.info.message and "expected" in raised.value.info.message


def test_a_mismatched_target_checkpoint_is_reported_and_never_becomes_the_hold() -> None:
    """The replicator reports a target checkpoint above what the source committed
    (`target_claims_lsn`): state shows it, the retention hold stays where the target
    really was, and the next record without a claim clears it."""
    harness = Harness()
    harness.ok(*VCHANNELS, update(configuration("east>west")), record("p1", 201))
    claim = cmd(
        record_replicate_checkpoint=pb.RecordReplicateCheckpoint(
            pchannel="p1", target_cluster_id="west", target_claims_lsn=1_000_201
        )
    )
    assert kinds(harness.ok(claim).events) == ["replicate_checkpoint_recorded"]
    checkpoints = harness.state.replicate_checkpoints["p1"]
    assert dict(checkpoints.mismatched_lsns) == {"west": 1_000_201}
    assert checkpoints.source_lsns["west"] == 201
    assert replication_hold(harness.state, "p1") == 202
    # Reported again: nothing new.
    assert kinds(harness.ok(claim).events) == []
    # Matching again: the next record clears it (and may move the checkpoint).
    assert kinds(harness.ok(record("p1", 201)).events) == ["replicate_checkpoint_recorded"]
    assert dict(harness.state.replicate_checkpoints["p1"].mismatched_lsns) == {}
    assert harness.state.replicate_checkpoints["p1"].source_lsns["west"] == 201
    # A configuration without the pair drops a mismatch with the checkpoint.
    harness.ok(claim, update(configuration("east>north")))
    assert "p1" not in harness.state.replicate_checkpoints


def _target_configuration(token: str = "") -> pb.ReplicateConfiguration:
    """east -> west, west (this cluster) storing `token`: what east's replicator presents."""
    value = configuration("east>west")
    value.clusters[1].credentials.token = token
    return value


def test_a_replicated_batch_needs_the_sources_replication_credential() -> None:
    """On the target (west), a replicated batch is taken only from a caller presenting
    the token west's configuration stores for itself (the one east's replicator is given);
    the source cluster is the one that credential is bound to."""
    import hashlib

    from raftwal.services.replicated import check_replicator
    from rpc.errors import RaftwalError

    def digest(token: str) -> str:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()

    configured = _target_configuration("east-replicator-secret")

    def refusal(claimed: str, identity: str, value: pb.ReplicateConfiguration = configured):
        try:
            check_replicator(value, "west", "q1", claimed, identity)
        except RaftwalError as error:
            return error.info
        return None

    assert refusal("east", digest("east-replicator-secret")) is None
    # Also with a client certificate beside the token.
    assert refusal("east", digest("east-replicator-secret") + "|cert:CN=x") is None
    # A producer token of west, claiming to be east's replicator (the audit's forgery).
    forged = refusal("east", digest("west-producer-token"))
    assert forged is not None and forged.code == E.PERMISSION_DENIED
    assert "not the replicator of cluster east (got another token; expected the token" in (
        forged.message
    )
    assert "west-producer-token" not in forged.message
    no_token = refusal("east", "")
    assert no_token is not None and no_token.code == E.PERMISSION_DENIED
    assert "(got no token;" in no_token.message
    # The credential is bound to east: claiming another source is refused.
    other = refusal("north", digest("east-replicator-secret"))
    assert other is not None and other.code == E.IGNORED_OPERATION
    assert "expected batches from east" in other.message
    # Not a target at all.
    assert refusal("east", digest("east-replicator-secret"), configuration()) is not None
    # No token stored (a cluster without tokens): a caller presenting none is taken, one
    # presenting a token is not east's replicator.
    open_target = _target_configuration("")
    assert refusal("east", "", open_target) is None
    assert refusal("east", digest("x"), open_target) is not None
