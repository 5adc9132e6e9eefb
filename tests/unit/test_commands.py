"""Table tests: the accept path and every reject path of every command in the Command oneof.

Each row is (setup steps, the command under test, expected outcome): the outcome is either
the list of event kinds the command emits (``[]`` for an idempotent repeat) or the exact
ErrorCode it is rejected with, optionally with a substring its message must contain. Every
row runs through ``apply_command`` with serialized ``Command`` bytes, as Raft does, and is
cross-checked against calling ``decide`` directly. Behaviour that a list of event kinds
cannot show (ids, tokens, history, replies, apply-level deduplication and the clock) has
its own tests below the table.
"""

from __future__ import annotations

import hashlib

import pytest
from helpers import (
    ASSIGNED,
    EXCLUSIVE,
    NODES,
    NOW,
    PCHANNEL,
    SHARED,
    VCHANNELS,
    E,
    Harness,
    Step,
    assign,
    broadcast,
    cmd,
    code_name,
    create_pchannels,
    domain_bytes,
    grant,
    kinds,
    ready,
    register,
    segment,
    vchannel,
)

from rpc.protos import coordination_pb2 as pb
from statemachine import Context, Limits, Rejection, copy_state, decide, state_digest
from statemachine.invariants import violations
from statemachine.state import restore_state, snapshot_state

# --------------------------------------------------------------------------------------
# Shorthands for the rows
# --------------------------------------------------------------------------------------


def down(node_id: str, at: int = NOW) -> pb.Command:
    return cmd(mark_node_down=pb.MarkNodeDown(node_id=node_id), at=at)


def up(node_id: str) -> pb.Command:
    return cmd(mark_node_up=pb.MarkNodeUp(node_id=node_id))


def forget(node_id: str, at: int = NOW) -> pb.Command:
    return cmd(remove_node=pb.RemoveNode(node_id=node_id), at=at)


def rejoin(node_id: str, incarnation_ms: int) -> pb.Command:
    return cmd(
        register_node=pb.RegisterNode(
            node_id=node_id, address="h:9", joined_incarnation_ms=incarnation_ms
        ),
        at=incarnation_ms + 1,
    )


def freeze(node_id: str) -> pb.Command:
    return cmd(freeze_node=pb.FreezeNode(node_id=node_id))


def unfreeze(node_id: str) -> pb.Command:
    return cmd(unfreeze_node=pb.UnfreezeNode(node_id=node_id))


def unavailable(pchannel: str, term: int) -> pb.Command:
    return cmd(mark_pchannel_unavailable=pb.MarkPChannelUnavailable(pchannel=pchannel, term=term))


def drop_p(pchannel: str) -> pb.Command:
    return cmd(drop_pchannel=pb.DropPChannel(pchannel=pchannel))


def drop_v(name: str) -> pb.Command:
    return cmd(drop_vchannel=pb.DropVChannel(name=name))


def delete_before(pchannel: str, before_lsn: int) -> pb.Command:
    return cmd(
        delete_segments_before=pb.DeleteSegmentsBefore(pchannel=pchannel, before_lsn=before_lsn)
    )


def _broadcast_id(h: Harness, broadcast_id: int | None, index: int) -> int:
    return h.broadcast(index) if broadcast_id is None else broadcast_id


def appended(
    name: str, lsn: int = 5, time_tick: int = 7, broadcast_id: int | None = None, index: int = -1
) -> Step:
    return lambda h: cmd(
        record_broadcast_appended=pb.RecordBroadcastAppended(
            broadcast_id=_broadcast_id(h, broadcast_id, index),
            vchannel=name,
            lsn=lsn,
            time_tick=time_tick,
        )
    )


def ack(
    name: str,
    checkpoint: int = 1,
    broadcast_id: int | None = None,
    index: int = -1,
    at: int = NOW,
) -> Step:
    return lambda h: cmd(
        ack_broadcast=pb.AckBroadcast(
            broadcast_id=_broadcast_id(h, broadcast_id, index),
            vchannel=name,
            checkpoint=checkpoint,
        ),
        at=at,
    )


def clear(retention_ms: int, at: int = NOW) -> pb.Command:
    return cmd(clear_broadcasts=pb.ClearBroadcasts(retention_ms=retention_ms), at=at)


def _lease_id(h: Harness, lease_id: int | None, index: int) -> int:
    return h.lease(index) if lease_id is None else lease_id


def keep_alive(lease_id: int | None = None, index: int = -1, at: int = NOW) -> Step:
    return lambda h: cmd(
        keep_alive_lease=pb.KeepAliveLease(lease_id=_lease_id(h, lease_id, index)), at=at
    )


def revoke(lease_id: int | None = None, index: int = -1, at: int = NOW) -> Step:
    return lambda h: cmd(revoke_lease=pb.RevokeLease(lease_id=_lease_id(h, lease_id, index)), at=at)


def expire(at: int) -> pb.Command:
    return cmd(expire_leases=pb.ExpireLeases(), at=at)


def extend(at: int) -> pb.Command:
    return cmd(extend_leases=pb.ExtendLeases(), at=at)


def lock(
    key: str, mode: int = EXCLUSIVE, lease_id: int | None = None, index: int = -1, at: int = NOW
) -> Step:
    return lambda h: cmd(
        lock=pb.Lock(key=key, mode=mode, lease_id=_lease_id(h, lease_id, index)), at=at
    )


def unlock(key: str, lease_id: int | None = None, index: int = -1) -> Step:
    return lambda h: cmd(unlock=pb.Unlock(key=key, lease_id=_lease_id(h, lease_id, index)))


def position(group: str, name: str, lsn: int, fence: int = 0) -> pb.Command:
    return cmd(
        commit_consumer_position=pb.CommitConsumerPosition(
            group=group, vchannel=name, lsn=lsn, fence=fence
        )
    )


def bump(group: str, name: str) -> pb.Command:
    return cmd(bump_consumer_fence=pb.BumpConsumerFence(group=group, vchannel=name))


def subscribe(name: str, *vchannels: str, **fields: object) -> pb.Command:
    return cmd(
        create_subscription=pb.CreateSubscription(name=name, vchannels=list(vchannels), **fields)
    )


def sub_commit(name: str, vchannel: str, lsn: int, time_tick: int = 0) -> pb.Command:
    return cmd(
        commit_subscription_position=pb.CommitSubscriptionPosition(
            name=name, vchannel=vchannel, lsn=lsn, time_tick=time_tick
        )
    )


def sub_seek(name: str, vchannel: str = "", lsn: int = 0, from_time_tick: int = 0) -> pb.Command:
    return cmd(
        seek_subscription=pb.SeekSubscription(
            name=name, vchannel=vchannel, lsn=lsn, from_time_tick=from_time_tick
        )
    )


def sub_join(name: str, member: str, lease_id: int) -> pb.Command:
    return cmd(
        join_subscription=pb.JoinSubscription(name=name, member_id=member, lease_id=lease_id)
    )


def sub_leave(name: str, member: str) -> pb.Command:
    return cmd(leave_subscription=pb.LeaveSubscription(name=name, member_id=member))


def sub_assign(name: str, **held: list[str]) -> pb.Command:
    return cmd(
        assign_subscription=pb.AssignSubscription(
            name=name,
            assignments=[
                pb.SubscriptionAssignment(member_id=m, vchannels=v) for m, v in held.items()
            ],
        )
    )


def sub_drop(name: str) -> pb.Command:
    return cmd(drop_subscription=pb.DropSubscription(name=name))


def policy(allow_rebalance: bool, max_moves_per_round: int = 0) -> pb.Command:
    return cmd(
        set_balance_policy=pb.SetBalancePolicy(
            allow_rebalance=allow_rebalance, max_moves_per_round=max_moves_per_round
        )
    )


def barrier(at: int = NOW) -> pb.Command:
    return cmd(barrier=pb.Barrier(), at=at)


def replicate(*edges: tuple[str, str], local: str = "east", west=("q1", "q2")) -> pb.Command:
    """east (this cluster, pchannels p1 p2) and west, with the given edges."""
    configuration = pb.ReplicateConfiguration(
        clusters=[
            pb.ReplicateCluster(
                cluster_id="east", endpoints=["127.0.0.1:7201"], pchannels=["p1", "p2"]
            ),
            pb.ReplicateCluster(
                cluster_id="west",
                endpoints=["10.0.0.1:7201"],
                pchannels=list(west),
                credentials=pb.ReplicateCredentials(token="west-token-0123456789"),
            ),
        ],
        topology=[
            pb.ReplicateTopologyEdge(source_cluster_id=s, target_cluster_id=t) for s, t in edges
        ],
    )
    return cmd(
        update_replicate_configuration=pb.UpdateReplicateConfiguration(
            configuration=configuration, local_cluster_id=local
        )
    )


def record(pchannel: str, target: str, source_lsn: int, claims: int = 0) -> pb.Command:
    return cmd(
        record_replicate_checkpoint=pb.RecordReplicateCheckpoint(
            pchannel=pchannel,
            target_cluster_id=target,
            source_lsn=source_lsn,
            target_claims_lsn=claims,
        )
    )


def replicate_clear() -> pb.Command:
    return cmd(
        update_replicate_configuration=pb.UpdateReplicateConfiguration(local_cluster_id="east")
    )


def alter(target: str, **config: str) -> pb.Command:
    return cmd(alter_wal=pb.AlterWal(target=target, target_config=config))


def flushed(epoch: int, term: int, lsn: int) -> pb.Command:
    return cmd(
        wal_flushed=pb.WalFlushed(
            pchannel="p1",
            epoch=epoch,
            term=term,
            node_id="n1",
            checkpoint_lsn=lsn,
            checkpoint_term=1,
            checkpoint_time_tick=lsn,
        )
    )


# Setups used by several rows.
ASSIGNING: list[Step] = [*PCHANNEL, assign("p1", 1, "n1", ["n2"])]
SEGMENTS: list[Step] = [*VCHANNELS, segment(1, 10), segment(11, 20), segment(21, 30)]
ALTERING: list[Step] = [*ASSIGNED, segment(1, 10), alter("local")]
BCAST: list[Step] = [*VCHANNELS, broadcast("v1", "v2", keys=[("k1", EXCLUSIVE)])]
TOMB: list[Step] = [*BCAST, ack("v1"), ack("v2")]
LEASED: list[Step] = [grant(10_000)]
TWO_LEASES: list[Step] = [grant(10_000), grant(10_000)]


def _saved(*steps: Step) -> bytes:
    """The snapshot bytes of a state built by `steps` (what `raftwal snapshot save` gets)."""
    harness = Harness()
    harness.ok(*steps)
    return snapshot_state(harness.state)


def restore(data: bytes, digest: str | None = None) -> pb.Command:
    return cmd(
        restore_state=pb.RestoreState(
            state=data, state_digest=hashlib.sha256(data).hexdigest() if digest is None else digest
        )
    )


SAVED = _saved(*SEGMENTS, subscribe("s1", "v1"), grant(10_000))


INVALID = E.INVALID_ARGUMENT
RESOURCE_ACQUIRED = E.RESOURCE_ACQUIRED
UNMATCHED = E.UNMATCHED_CHANNEL_TERM
NAMES_1025 = [f"c{k}" for k in range(1025)]


def row(
    name: str, setup: list[Step], command: Step, expect: list[str] | int, contains: str = ""
) -> object:
    return pytest.param(name, setup, command, expect, contains, id=name)


# fmt: off
ROWS = [
    # ---- register_node
    row("register_node/new", [], register("n1"), ["node_registered"]),
    row("register_node/repeat", [register("n1", "h:1")], register("n1", "h:1"), []),
    row("register_node/new-address", [register("n1", "h:1")], register("n1", "h:2"),
        ["node_registered"]),
    row("register_node/down-node-returns", [register("n1", "h:1"), down("n1")],
        register("n1", "h:1"), ["node_registered"]),
    row("register_node/empty-id", [], register("", "h:1"), INVALID, "missing node_id"),
    row("register_node/no-port", [], register("n1", "localhost"), INVALID, "expected host:port"),
    row("register_node/empty-address", [], register("n1", ""), INVALID, "address"),
    row("register_node/removed", [*NODES, forget("n3")], register("n3"), E.IGNORED_OPERATION,
        "was removed from the cluster"),
    row("register_node/removed-joined-before", [*NODES, forget("n3")], rejoin("n3", NOW - 1),
        E.IGNORED_OPERATION, "expected one started with --join after the removal"),
    row("register_node/rejoined", [*NODES, forget("n3")], rejoin("n3", NOW + 5),
        ["node_registered"]),
    # ---- remove_node
    row("remove_node/accept", NODES, forget("n3"), ["node_removed"]),
    row("remove_node/never-registered", NODES, forget("n9"), ["node_removed"]),
    row("remove_node/repeat", [*NODES, forget("n3")], forget("n3"), []),
    row("remove_node/owner", ASSIGNED, forget("n1"), E.IGNORED_OPERATION,
        "still holds pchannel 'p1'"),
    row("remove_node/replica", ASSIGNED, forget("n2"), E.IGNORED_OPERATION, "holds pchannel"),
    row("remove_node/bad-id", NODES, forget("n 1"), INVALID, "node_id"),
    # ---- mark_node_down / mark_node_up
    row("mark_node_down/up-node", NODES, down("n1"), ["node_marked_down"]),
    row("mark_node_down/repeat", [*NODES, down("n1")], down("n1"), []),
    row("mark_node_down/unknown", NODES, down("n9"), E.NOT_FOUND, "'n9' is not registered"),
    row("mark_node_down/bad-id", NODES, down("n 1"), INVALID, "node_id"),
    row("mark_node_up/down-node", [*NODES, down("n1")], up("n1"), ["node_marked_up"]),
    row("mark_node_up/repeat", NODES, up("n1"), []),
    row("mark_node_up/unknown", NODES, up("n9"), E.NOT_FOUND),
    # ---- freeze_node / unfreeze_node
    row("freeze_node/accept", NODES, freeze("n1"), ["node_frozen"]),
    row("freeze_node/repeat", [*NODES, freeze("n1")], freeze("n1"), []),
    row("freeze_node/unknown", NODES, freeze("n9"), E.NOT_FOUND),
    row("unfreeze_node/accept", [*NODES, freeze("n1")], unfreeze("n1"), ["node_unfrozen"]),
    row("unfreeze_node/not-frozen", NODES, unfreeze("n1"), []),
    row("unfreeze_node/unknown", NODES, unfreeze("n9"), E.NOT_FOUND),
    # ---- create_pchannels
    row("create_pchannels/names", [], create_pchannels("a", "b"), ["pchannel_created"] * 2),
    row("create_pchannels/prefix-count", [], create_pchannels(prefix="p", count=3),
        ["pchannel_created"] * 3),
    row("create_pchannels/max-replicas", [], create_pchannels("a", replica_count=7),
        ["pchannel_created"]),
    row("create_pchannels/exists", PCHANNEL, create_pchannels("x", "p1"), E.ALREADY_EXISTS,
        "'p1' already exists"),
    row("create_pchannels/dropped-name", [*PCHANNEL, drop_p("p2")], create_pchannels("p2"),
        E.ALREADY_EXISTS),
    row("create_pchannels/names-and-prefix", [], create_pchannels("a", prefix="p"), INVALID,
        "not both"),
    row("create_pchannels/names-and-count", [], create_pchannels("a", count=2), INVALID,
        "not both"),
    row("create_pchannels/replicas-too-many", [], create_pchannels("a", replica_count=8),
        INVALID, "replica_count (8; expected 1..7)"),
    row("create_pchannels/replicas-negative", [], create_pchannels("a", replica_count=-1),
        INVALID, "replica_count (-1"),
    row("create_pchannels/replicas-above-nodes", NODES, create_pchannels("a", replica_count=5),
        INVALID, "replica_count (5; the cluster has 3 node(s): expected 1..3)"),
    row("create_pchannels/replicas-equal-nodes", NODES, create_pchannels("a", replica_count=3),
        ["pchannel_created"]),
    row("create_pchannels/duplicate-names", [], create_pchannels("a", "b", "a"), INVALID,
        "duplicate"),
    row("create_pchannels/nothing", [], create_pchannels(), INVALID, "missing prefix"),
    row("create_pchannels/count-zero", [], create_pchannels(prefix="p"), INVALID,
        "count (0; expected 1..1024)"),
    row("create_pchannels/count-too-big", [], create_pchannels(prefix="p", count=1025), INVALID,
        "1025"),
    row("create_pchannels/too-many-names", [], create_pchannels(*NAMES_1025), INVALID, "1025"),
    row("create_pchannels/prefix-no-room", [], create_pchannels(prefix="p" * 127, count=1),
        INVALID, "room for _<k>"),
    row("create_pchannels/one-bad-name", [], create_pchannels("ok", "not ok"), INVALID,
        "'not ok'"),
    row("create_pchannels/bad-owner", [],
        create_pchannels("a", owner=pb.OwnerDescription(role="\x07")), INVALID, "owner.role"),
    # ---- assign_pchannel
    row("assign_pchannel/first", PCHANNEL, assign("p1", 1, "n1"), ["pchannel_assigned"]),
    row("assign_pchannel/with-replicas", PCHANNEL, assign("p1", 1, "n1", ["n2", "n3"]),
        ["pchannel_assigned"]),
    row("assign_pchannel/readonly", PCHANNEL,
        assign("p1", 1, "n1", access_mode=pb.ACCESS_MODE_READONLY), ["pchannel_assigned"]),
    row("assign_pchannel/move", ASSIGNED, assign("p1", 2, "n2"), ["pchannel_assigned"]),
    row("assign_pchannel/recover-unavailable", [*ASSIGNED, unavailable("p1", 1)],
        assign("p1", 2, "n2"), ["pchannel_assigned"]),
    row("assign_pchannel/term-skips", PCHANNEL, assign("p1", 2, "n1"),
        E.UNMATCHED_CHANNEL_TERM, "at term 2; expected term 1"),
    row("assign_pchannel/term-zero", PCHANNEL, assign("p1", 0, "n1"), E.UNMATCHED_CHANNEL_TERM),
    row("assign_pchannel/term-repeat", ASSIGNED, assign("p1", 1, "n2"),
        E.UNMATCHED_CHANNEL_TERM, "expected term 2"),
    row("assign_pchannel/unknown-pchannel", PCHANNEL, assign("p9", 1, "n1"),
        E.CHANNEL_NOT_EXIST, "'p9' does not exist"),
    row("assign_pchannel/dropped-pchannel", [*PCHANNEL, drop_p("p2")], assign("p2", 1, "n1"),
        E.CHANNEL_NOT_EXIST, "dropped"),
    row("assign_pchannel/unknown-node", PCHANNEL, assign("p1", 1, "n9"), E.NOT_FOUND, "n9"),
    row("assign_pchannel/down-node", [*PCHANNEL, down("n1")], assign("p1", 1, "n1"), INVALID,
        "DOWN"),
    row("assign_pchannel/unknown-replica", PCHANNEL, assign("p1", 1, "n1", ["n2", "n9"]),
        E.NOT_FOUND, "n9"),
    row("assign_pchannel/duplicate-replicas", PCHANNEL, assign("p1", 1, "n1", ["n2", "n2"]),
        INVALID, "duplicate replica node id"),
    row("assign_pchannel/owner-twice", PCHANNEL, assign("p1", 1, "n1", ["n1", "n2", "n1"]),
        INVALID, "duplicate"),
    row("assign_pchannel/too-many-replicas", PCHANNEL,
        assign("p1", 1, "n1", [f"n{k}" for k in range(1, 9)]), INVALID,
        "replica set size (8; expected 1..7)"),
    row("assign_pchannel/bad-access-mode", PCHANNEL, assign("p1", 1, "n1", access_mode=9),
        INVALID, "access_mode (9"),
    # ---- pchannel_ready
    row("pchannel_ready/accept", ASSIGNING, ready("p1", 1, "n1", 5), ["pchannel_became_ready"]),
    row("pchannel_ready/repeat", [*ASSIGNING, ready("p1", 1, "n1", 5)], ready("p1", 1, "n1", 5),
        []),
    row("pchannel_ready/repeat-other-lsn", [*ASSIGNING, ready("p1", 1, "n1", 5)],
        ready("p1", 1, "n1", 6), INVALID, "already ready"),
    row("pchannel_ready/wrong-term", ASSIGNING, ready("p1", 2, "n1", 5),
        E.UNMATCHED_CHANNEL_TERM, "at term 1 owned by 'n1'"),
    row("pchannel_ready/wrong-node", ASSIGNING, ready("p1", 1, "n2", 5),
        E.UNMATCHED_CHANNEL_TERM, "by 'n2'"),
    row("pchannel_ready/old-term", [*ASSIGNED, assign("p1", 2, "n2")], ready("p1", 1, "n1", 1),
        E.UNMATCHED_CHANNEL_TERM),
    row("pchannel_ready/new-owner", [*ASSIGNED, assign("p1", 2, "n2")],
        ready("p1", 2, "n2", 50), ["pchannel_became_ready"]),
    row("pchannel_ready/uninitialized", PCHANNEL, ready("p1", 0, "n1", 1),
        E.UNMATCHED_CHANNEL_TERM),
    row("pchannel_ready/unavailable", [*ASSIGNING, unavailable("p1", 1)],
        ready("p1", 1, "n1", 5), E.UNMATCHED_CHANNEL_TERM, "expected ASSIGNING"),
    row("pchannel_ready/start-lsn-zero", ASSIGNING, ready("p1", 1, "n1", 0), INVALID,
        "start_lsn (0; expected >= 1)"),
    row("pchannel_ready/start-lsn-negative", ASSIGNING, ready("p1", 1, "n1", -3), INVALID,
        "-3"),
    row("pchannel_ready/unknown", PCHANNEL, ready("p9", 1, "n1", 1), E.CHANNEL_NOT_EXIST),
    row("pchannel_ready/dropped", [*PCHANNEL, drop_p("p2")], ready("p2", 0, "n1", 1),
        E.CHANNEL_NOT_EXIST),
    row("pchannel_ready/empty-node", ASSIGNING, ready("p1", 1, "", 5), INVALID, "node_id"),
    # ---- mark_pchannel_unavailable
    row("mark_pchannel_unavailable/accept", ASSIGNED, unavailable("p1", 1),
        ["pchannel_marked_unavailable"]),
    row("mark_pchannel_unavailable/repeat", [*ASSIGNED, unavailable("p1", 1)],
        unavailable("p1", 1), []),
    row("mark_pchannel_unavailable/wrong-term", ASSIGNED, unavailable("p1", 2),
        E.UNMATCHED_CHANNEL_TERM, "current term is 1"),
    row("mark_pchannel_unavailable/unknown", PCHANNEL, unavailable("p9", 0), E.CHANNEL_NOT_EXIST),
    row("mark_pchannel_unavailable/dropped", [*PCHANNEL, drop_p("p2")], unavailable("p2", 0),
        E.CHANNEL_NOT_EXIST),
    # ---- drop_pchannel
    row("drop_pchannel/accept", PCHANNEL, drop_p("p2"), ["pchannel_dropped"]),
    row("drop_pchannel/assigned", ASSIGNED, drop_p("p1"), ["pchannel_dropped"]),
    row("drop_pchannel/live-vchannels", VCHANNELS, drop_p("p1"), INVALID,
        "2 live vchannels (v1, v2)"),
    row("drop_pchannel/after-vchannels-dropped", [*VCHANNELS, drop_v("v3")], drop_p("p2"),
        ["pchannel_dropped"]),
    row("drop_pchannel/repeat", [*PCHANNEL, drop_p("p2")], drop_p("p2"), []),
    row("drop_pchannel/unknown", PCHANNEL, drop_p("p9"), E.CHANNEL_NOT_EXIST),
    # ---- create_vchannel / drop_vchannel
    row("create_vchannel/accept", ASSIGNED, vchannel("v1"), ["vchannel_created"]),
    row("create_vchannel/on-uninitialized", PCHANNEL, vchannel("v1", "p2"),
        ["vchannel_created"]),
    row("create_vchannel/exists", VCHANNELS, vchannel("v1"), E.ALREADY_EXISTS, "'v1'"),
    row("create_vchannel/dropped-name", [*VCHANNELS, drop_v("v1")], vchannel("v1"),
        E.ALREADY_EXISTS),
    row("create_vchannel/unknown-pchannel", ASSIGNED, vchannel("v1", "p9"), E.CHANNEL_NOT_EXIST),
    row("create_vchannel/dropped-pchannel", [*PCHANNEL, drop_p("p2")], vchannel("v1", "p2"),
        E.CHANNEL_NOT_EXIST),
    row("create_vchannel/empty-name", ASSIGNED, vchannel(""), INVALID, "vchannel name"),
    row("drop_vchannel/accept", VCHANNELS, drop_v("v1"), ["vchannel_dropped"]),
    row("drop_vchannel/repeat", [*VCHANNELS, drop_v("v1")], drop_v("v1"), []),
    row("drop_vchannel/unknown", VCHANNELS, drop_v("v9"), E.CHANNEL_NOT_EXIST),
    # ---- commit_segment
    row("commit_segment/first", ASSIGNED, segment(1, 10), ["segment_committed"]),
    row("commit_segment/next", [*ASSIGNED, segment(1, 10)], segment(11, 20),
        ["segment_committed"]),
    row("commit_segment/exact-repeat", [*ASSIGNED, segment(1, 10), segment(11, 20)],
        segment(1, 10), []),
    row("commit_segment/repeat-other-digest", [*ASSIGNED, segment(1, 10)],
        segment(1, 10, digest=12345), INVALID, "overlaps"),
    row("commit_segment/overlap", [*ASSIGNED, segment(1, 10)], segment(5, 15), INVALID,
        "overlaps the committed range ending at 10; expected first_lsn 11"),
    row("commit_segment/overlap-same-start", [*ASSIGNED, segment(1, 10)], segment(1, 12),
        INVALID, "overlaps"),
    row("commit_segment/gap", [*ASSIGNED, segment(1, 10)], segment(12, 20), INVALID,
        "leaves a gap after 10; expected first_lsn 11"),
    row("commit_segment/gap-at-start", ASSIGNED, segment(2, 10), INVALID, "gap"),
    row("commit_segment/count-mismatch", ASSIGNED, segment(1, 10, count=9), INVALID,
        "count (9; expected 10"),
    row("commit_segment/stale-term", [*ASSIGNED, assign("p1", 2, "n2")], segment(1, 10, term=1),
        E.UNMATCHED_CHANNEL_TERM, "current term is 2"),
    row("commit_segment/future-term", ASSIGNED, segment(1, 10, term=2),
        E.UNMATCHED_CHANNEL_TERM),
    row("commit_segment/new-term", [*ASSIGNED, segment(1, 10), assign("p1", 2, "n2")],
        segment(11, 20, term=2), ["segment_committed"]),
    row("commit_segment/first-lsn-zero", ASSIGNED, segment(0, 10), INVALID, "[0, 10]"),
    row("commit_segment/reversed-range", ASSIGNED, segment(10, 5), INVALID,
        "expected 1 <= first <= last"),
    row("commit_segment/first-term-zero", ASSIGNED, segment(1, 10, first_term=0), INVALID,
        "term range"),
    row("commit_segment/last-term-after-term", ASSIGNED, segment(1, 10, last_term=2), INVALID,
        "last_term <= 1"),
    row("commit_segment/negative-tick", ASSIGNED, segment(1, 10, first_time_tick=-1), INVALID,
        "time tick"),
    row("commit_segment/reversed-ticks", ASSIGNED,
        segment(1, 10, first_time_tick=9, last_time_tick=3), INVALID, "time tick"),
    row("commit_segment/negative-bytes", ASSIGNED, segment(1, 10, bytes=-1), INVALID, "bytes"),
    row("commit_segment/no-replicas", ASSIGNED, segment(1, 10, replica_node_ids=[]), INVALID,
        "replica count (0"),
    row("commit_segment/unknown-replica", ASSIGNED, segment(1, 10, replica_node_ids=["n9"]),
        E.NOT_FOUND),
    row("commit_segment/duplicate-replica", ASSIGNED,
        segment(1, 10, replica_node_ids=["n1", "n1"]), INVALID, "duplicate"),
    row("commit_segment/unknown-pchannel", ASSIGNED, segment(1, 10, pchannel="p9"),
        E.CHANNEL_NOT_EXIST),
    row("commit_segment/uninitialized", PCHANNEL, segment(1, 10, term=0, pchannel="p2"),
        INVALID, "term range"),
    # ---- delete_segments_before
    row("delete_segments_before/two", SEGMENTS, delete_before("p1", 21), ["segments_deleted"]),
    row("delete_segments_before/all", SEGMENTS, delete_before("p1", 31), ["segments_deleted"]),
    row("delete_segments_before/inside-first", SEGMENTS, delete_before("p1", 10), []),
    row("delete_segments_before/nothing-committed", VCHANNELS, delete_before("p1", 10), []),
    row("delete_segments_before/zero", SEGMENTS, delete_before("p1", 0), INVALID,
        "before_lsn (0; expected >= 1)"),
    row("delete_segments_before/unknown", SEGMENTS, delete_before("p9", 5), E.CHANNEL_NOT_EXIST),
    row("delete_segments_before/held-by-consumer", [*SEGMENTS, position("g1", "v1", 9)],
        delete_before("p1", 31), []),
    row("delete_segments_before/partly-held", [*SEGMENTS, position("g1", "v2", 15)],
        delete_before("p1", 31), ["segments_deleted"]),
    row("delete_segments_before/consumer-other-pchannel", [*SEGMENTS, position("g1", "v3", 0)],
        delete_before("p1", 31), ["segments_deleted"]),
    row("delete_segments_before/consumer-dropped-vchannel",
        [*SEGMENTS, position("g1", "v1", 0), drop_v("v1")], delete_before("p1", 31),
        ["segments_deleted"]),
    row("delete_segments_before/held-by-earliest-subscription",
        [*SEGMENTS, subscribe("s1", "v1")], delete_before("p1", 31), []),
    row("delete_segments_before/subscription-not-holding",
        [*SEGMENTS, subscribe("s1", "v1", no_retention_hold=True)], delete_before("p1", 31),
        ["segments_deleted"]),
    row("delete_segments_before/latest-subscription",
        [*SEGMENTS, subscribe("s1", "v1", start=pb.SUBSCRIPTION_START_LATEST)],
        delete_before("p1", 31), ["segments_deleted"]),
    row("delete_segments_before/held-by-lsn-start",
        [*SEGMENTS, subscribe("s1", "v1", start=pb.SUBSCRIPTION_START_LSN, start_lsn=5)],
        delete_before("p1", 31), []),
    row("delete_segments_before/held-by-tick-seek",
        [*SEGMENTS, subscribe("s1", "v1"), sub_seek("s1", "v1", from_time_tick=3)],
        delete_before("p1", 31), []),
    row("delete_segments_before/subscription-consumed",
        [*SEGMENTS, subscribe("s1", "v1"), sub_commit("s1", "v1", 30)], delete_before("p1", 31),
        ["segments_deleted"]),
    row("delete_segments_before/subscription-other-pchannel",
        [*SEGMENTS, subscribe("s1", "v3")], delete_before("p1", 31), ["segments_deleted"]),
    row("delete_segments_before/held-by-unacked-broadcast",
        [*SEGMENTS, broadcast("v1"), appended("v1", lsn=4)], delete_before("p1", 31), []),
    row("delete_segments_before/broadcast-acked",
        [*SEGMENTS, broadcast("v1"), appended("v1", lsn=4), ack("v1")], delete_before("p1", 31),
        ["segments_deleted"]),
    row("seek_subscription/below-retention-floor",
        [*SEGMENTS, subscribe("s1", "v1", no_retention_hold=True), delete_before("p1", 21)],
        sub_seek("s1", "v1", lsn=20), E.COMPACTED, "expected >= 21"),
    row("seek_subscription/at-retention-floor",
        [*SEGMENTS, subscribe("s1", "v1", no_retention_hold=True), delete_before("p1", 21)],
        sub_seek("s1", "v1", lsn=21), ["subscription_position_committed"]),
    # ---- restore_state
    row("restore_state/fresh-cluster", NODES, restore(SAVED), ["state_restored"]),
    row("restore_state/not-fresh", VCHANNELS, restore(SAVED), E.ALREADY_EXISTS, "not fresh"),
    row("restore_state/digest-mismatch", NODES, restore(SAVED, "00" * 32), INVALID,
        "digest mismatch"),
    row("restore_state/undecodable", NODES, restore(b"\xff\xff\xff"), INVALID, "undecodable"),
    row("restore_state/not-later", [*NODES, *[register(f"m{i}") for i in range(40)]],
        restore(_saved(*NODES)), INVALID, "revisions never go back"),
    # ---- create_broadcast
    row("create_broadcast/no-keys", VCHANNELS, broadcast("v1", "v2"), ["broadcast_created"]),
    row("create_broadcast/keys", VCHANNELS,
        broadcast("v1", keys=[("k2", SHARED), ("k1", EXCLUSIVE)]),
        ["broadcast_created", "lock_acquired", "lock_acquired"]),
    row("create_broadcast/unknown-vchannel", VCHANNELS, broadcast("v1", "v9"),
        E.CHANNEL_NOT_EXIST, "'v9'"),
    row("create_broadcast/dropped-vchannel", [*VCHANNELS, drop_v("v2")], broadcast("v1", "v2"),
        E.CHANNEL_NOT_EXIST),
    row("create_broadcast/exclusive-vs-exclusive", BCAST, broadcast("v3", keys=[("k1", EXCLUSIVE)]),
        E.RESOURCE_ACQUIRED, "'k1' is held EXCLUSIVE by broadcast"),
    row("create_broadcast/shared-vs-exclusive", BCAST, broadcast("v3", keys=[("k1", SHARED)]),
        E.RESOURCE_ACQUIRED, "requested SHARED"),
    row("create_broadcast/exclusive-vs-shared",
        [*VCHANNELS, broadcast("v1", keys=[("k1", SHARED)])],
        broadcast("v2", keys=[("k1", EXCLUSIVE)]), E.RESOURCE_ACQUIRED, "held SHARED"),
    row("create_broadcast/shared-and-shared", [*VCHANNELS, broadcast("v1", keys=[("k1", SHARED)])],
        broadcast("v2", keys=[("k1", SHARED)]), ["broadcast_created", "lock_acquired"]),
    row("create_broadcast/second-key-conflicts", BCAST,
        broadcast("v3", keys=[("k0", EXCLUSIVE), ("k1", EXCLUSIVE)]), E.RESOURCE_ACQUIRED, "'k1'"),
    row("create_broadcast/lease-holds-exclusive", [*VCHANNELS, grant(), lock("k1", EXCLUSIVE)],
        broadcast("v1", keys=[("k1", SHARED)]), E.RESOURCE_ACQUIRED, "by lease"),
    row("create_broadcast/lease-holds-shared", [*VCHANNELS, grant(), lock("k1", SHARED)],
        broadcast("v1", keys=[("k1", EXCLUSIVE)]), E.RESOURCE_ACQUIRED, "held SHARED by lease"),
    row("create_broadcast/lease-shares", [*VCHANNELS, grant(), lock("k1", SHARED)],
        broadcast("v1", keys=[("k1", SHARED)]), ["broadcast_created", "lock_acquired"]),
    row("create_broadcast/tombstone-frees-keys", TOMB, broadcast("v3", keys=[("k1", EXCLUSIVE)]),
        ["broadcast_created", "lock_acquired"]),
    row("create_broadcast/idempotent-repeat",
        [*VCHANNELS, broadcast("v1", keys=[("k1", EXCLUSIVE)], idempotency_key="i1")],
        broadcast("v1", keys=[("k1", EXCLUSIVE)], idempotency_key="i1"), []),
    row("create_broadcast/idempotent-other-vchannels",
        [*VCHANNELS, broadcast("v1", idempotency_key="i1")],
        broadcast("v2", idempotency_key="i1"), E.ALREADY_EXISTS, "'i1' belongs to broadcast"),
    row("create_broadcast/idempotent-other-message",
        [*VCHANNELS, broadcast("v1", idempotency_key="i1")],
        broadcast("v1", message=b"other", idempotency_key="i1"), E.ALREADY_EXISTS),
    row("create_broadcast/idempotent-other-mode",
        [*VCHANNELS, broadcast("v1", keys=[("k1", SHARED)], idempotency_key="i1")],
        broadcast("v1", keys=[("k1", EXCLUSIVE)], idempotency_key="i1"), E.ALREADY_EXISTS),
    row("create_broadcast/no-vchannels", VCHANNELS, broadcast(), INVALID,
        "number of vchannels (0; expected 1..1024)"),
    row("create_broadcast/duplicate-vchannels", VCHANNELS, broadcast("v1", "v1"), INVALID,
        "duplicate vchannel"),
    row("create_broadcast/duplicate-keys", VCHANNELS,
        broadcast("v1", keys=[("k1", SHARED), ("k1", SHARED)]), INVALID, "duplicate resource key"),
    row("create_broadcast/mode-unspecified", VCHANNELS, broadcast("v1", keys=[("k1", 0)]),
        INVALID, "mode (0"),
    row("create_broadcast/bad-msg-type", VCHANNELS, broadcast("v1", msg_type="drop table"),
        INVALID, "msg_type"),
    row("create_broadcast/bad-idempotency-key", VCHANNELS,
        broadcast("v1", idempotency_key="a key"), INVALID, "idempotency_key"),
    # ---- record_broadcast_appended
    row("record_broadcast_appended/accept", BCAST, appended("v1"), ["broadcast_appended"]),
    row("record_broadcast_appended/repeat", [*BCAST, appended("v1")], appended("v1"), []),
    row("record_broadcast_appended/other-position", [*BCAST, appended("v1", lsn=5)],
        appended("v1", lsn=6), E.IGNORED_OPERATION, "already appended to v1 at lsn 5"),
    row("record_broadcast_appended/unknown", BCAST, appended("v1", broadcast_id=9999),
        E.NOT_FOUND, "broadcast 9999"),
    row("record_broadcast_appended/not-a-target", BCAST, appended("v3"), INVALID,
        "not a target"),
    row("record_broadcast_appended/lsn-zero", BCAST, appended("v1", lsn=0), INVALID, "lsn 0"),
    row("record_broadcast_appended/negative-tick", BCAST, appended("v1", time_tick=-1), INVALID,
        "time tick -1"),
    # ---- ack_broadcast
    row("ack_broadcast/first", BCAST, ack("v1"), ["broadcast_acked"]),
    row("ack_broadcast/last", [*BCAST, ack("v1")], ack("v2"),
        ["broadcast_acked", "lock_released", "broadcast_tombstoned"]),
    row("ack_broadcast/last-no-keys", [*VCHANNELS, broadcast("v1")], ack("v1"),
        ["broadcast_acked", "broadcast_tombstoned"]),
    row("ack_broadcast/repeat", [*BCAST, ack("v1")], ack("v1"), []),
    row("ack_broadcast/repeat-after-tombstone", TOMB, ack("v2"), []),
    row("ack_broadcast/unknown", BCAST, ack("v1", broadcast_id=9999), E.NOT_FOUND),
    row("ack_broadcast/negative-checkpoint", BCAST, ack("v1", checkpoint=-1), INVALID,
        "checkpoint (-1"),
    row("ack_broadcast/not-a-target", BCAST, ack("v3"), INVALID, "'v3' is not a target"),
    # ---- clear_broadcasts (tombstoned at NOW)
    row("clear_broadcasts/due", TOMB, clear(1000, at=NOW + 1000), ["broadcast_cleared"]),
    row("clear_broadcasts/not-due", TOMB, clear(1000, at=NOW + 999), []),
    row("clear_broadcasts/zero-retention", TOMB, clear(0), ["broadcast_cleared"]),
    row("clear_broadcasts/clamped-clock", [*TOMB, barrier(at=NOW + 5000)], clear(1000, at=NOW),
        ["broadcast_cleared"]),
    row("clear_broadcasts/pending-kept", BCAST, clear(0, at=NOW + 10**9), []),
    row("clear_broadcasts/negative", TOMB, clear(-1), INVALID, "retention_ms (-1"),
    row("clear_broadcasts/too-long", TOMB, clear(30 * 24 * 3_600_000 + 1), INVALID,
        "retention_ms"),
    # ---- grant_lease
    row("grant_lease/accept", [], grant(10_000), ["lease_granted"]),
    row("grant_lease/min-ttl", [], grant(1), ["lease_granted"]),
    row("grant_lease/max-ttl", [], grant(3_600_000), ["lease_granted"]),
    row("grant_lease/zero-ttl", [], grant(0), INVALID, "ttl_ms (0; expected 1..3600000)"),
    row("grant_lease/negative-ttl", [], grant(-5), INVALID, "ttl_ms (-5; expected 1..3600000)"),
    row("grant_lease/huge-ttl", [], grant(3_600_001), INVALID, "3600001"),
    row("grant_lease/bad-holder", [], grant(holder="a\x00b"), INVALID, "holder"),
    # ---- keep_alive_lease (lease granted at NOW with ttl 10 s)
    row("keep_alive_lease/accept", LEASED, keep_alive(at=NOW + 5000), ["lease_renewed"]),
    row("keep_alive_lease/no-change", LEASED, keep_alive(at=NOW), []),
    row("keep_alive_lease/expired", LEASED, keep_alive(at=NOW + 10_000), E.NOT_FOUND,
        "expired at"),
    row("keep_alive_lease/expired-by-clamped-clock", [*LEASED, barrier(at=NOW + 20_000)],
        keep_alive(at=NOW), E.NOT_FOUND, "expired"),
    row("keep_alive_lease/unknown", LEASED, keep_alive(lease_id=9999), E.NOT_FOUND,
        "lease 9999 does not exist"),
    row("keep_alive_lease/revoked", [*LEASED, revoke()], keep_alive(), E.NOT_FOUND),
    row("keep_alive_lease/zero-id", LEASED, keep_alive(lease_id=0), INVALID, "lease_id (0"),
    # ---- revoke_lease
    row("revoke_lease/accept", LEASED, revoke(), ["lease_revoked"]),
    row("revoke_lease/with-locks", [*LEASED, lock("k2", SHARED), lock("k1")], revoke(),
        ["lock_released", "lock_released", "lease_revoked"]),
    row("revoke_lease/expired-not-swept", LEASED, revoke(at=NOW + 50_000), ["lease_revoked"]),
    row("revoke_lease/twice", [*LEASED, revoke()], revoke(), E.NOT_FOUND),
    row("revoke_lease/unknown", LEASED, revoke(lease_id=9999), E.NOT_FOUND),
    row("revoke_lease/zero-id", LEASED, revoke(lease_id=0), INVALID),
    # ---- expire_leases
    row("expire_leases/none-due", LEASED, expire(NOW + 9_999), []),
    row("expire_leases/due", LEASED, expire(NOW + 10_000), ["lease_expired"]),
    row("expire_leases/releases-locks", [grant(10_000), lock("k1"), grant(50_000)],
        expire(NOW + 10_000), ["lock_released", "lease_expired"]),
    row("expire_leases/empty", [], expire(NOW), []),
    # ---- extend_leases
    row("extend_leases/later", LEASED, extend(NOW + 1), ["lease_renewed"]),
    row("extend_leases/same-time", LEASED, extend(NOW), []),
    row("extend_leases/all", [grant(10_000), grant(20_000)], extend(NOW + 15_000),
        ["lease_renewed", "lease_renewed"]),
    row("extend_leases/empty", [], extend(NOW), []),
    # ---- lock
    row("lock/exclusive", LEASED, lock("k1", EXCLUSIVE), ["lock_acquired"]),
    row("lock/hierarchical-key", LEASED, lock("db/coll:1"), ["lock_acquired"]),
    row("lock/repeat", [*LEASED, lock("k1")], lock("k1"), []),
    row("lock/other-mode-same-lease", [*LEASED, lock("k1")], lock("k1", SHARED), INVALID,
        "unlock first"),
    row("lock/exclusive-conflict", [*TWO_LEASES, lock("k1", index=0)], lock("k1"),
        E.RESOURCE_ACQUIRED, "held EXCLUSIVE by lease"),
    row("lock/shared-vs-exclusive", [*TWO_LEASES, lock("k1", index=0)], lock("k1", SHARED),
        E.RESOURCE_ACQUIRED),
    row("lock/exclusive-vs-shared", [*TWO_LEASES, lock("k1", SHARED, index=0)], lock("k1"),
        E.RESOURCE_ACQUIRED, "requested EXCLUSIVE"),
    row("lock/shared-and-shared", [*TWO_LEASES, lock("k1", SHARED, index=0)],
        lock("k1", SHARED), ["lock_acquired"]),
    row("lock/held-by-broadcast", [*BCAST, grant()], lock("k1", SHARED), E.RESOURCE_ACQUIRED,
        "by broadcast"),
    row("lock/expired-lease", LEASED, lock("k1", at=NOW + 10_000), E.NOT_FOUND, "expired"),
    row("lock/unknown-lease", LEASED, lock("k1", lease_id=9999), E.NOT_FOUND),
    row("lock/zero-lease", LEASED, lock("k1", lease_id=0), INVALID, "lease_id"),
    row("lock/mode-unspecified", LEASED, lock("k1", 0), INVALID, "mode (0"),
    row("lock/empty-key", LEASED, lock(""), INVALID, "missing key"),
    # ---- unlock
    row("unlock/held", [*LEASED, lock("k1")], unlock("k1"), ["lock_released"]),
    row("unlock/not-held", LEASED, unlock("k1"), []),
    row("unlock/unknown-lease", LEASED, unlock("k1", lease_id=9999), E.NOT_FOUND),
    row("unlock/revoked-lease", [*LEASED, lock("k1"), revoke()], unlock("k1"), E.NOT_FOUND),
    row("unlock/empty-key", LEASED, unlock(""), INVALID),
    # ---- commit_consumer_position
    row("commit_consumer_position/accept", VCHANNELS, position("g1", "v1", 5),
        ["consumer_position_committed"]),
    row("commit_consumer_position/current-fence", [*VCHANNELS, bump("g1", "v1")],
        position("g1", "v1", 5, fence=1), ["consumer_position_committed"]),
    row("commit_consumer_position/older-fence", [*VCHANNELS, bump("g1", "v1"), bump("g1", "v1")],
        position("g1", "v1", 5, fence=1), E.CHANNEL_FENCED, "fence 1 was superseded by 2"),
    row("commit_consumer_position/never-issued", VCHANNELS, position("g1", "v1", 5, fence=1),
        INVALID, "never issued; expected 0"),
    row("commit_consumer_position/unknown-vchannel", VCHANNELS, position("g1", "v9", 5),
        E.CHANNEL_NOT_EXIST),
    row("commit_consumer_position/negative-lsn", VCHANNELS, position("g1", "v1", -1), INVALID,
        "lsn -1"),
    row("commit_consumer_position/negative-fence", VCHANNELS, position("g1", "v1", 1, fence=-1),
        INVALID, "fence -1"),
    row("commit_consumer_position/empty-group", VCHANNELS, position("", "v1", 1), INVALID,
        "group"),
    # ---- bump_consumer_fence
    row("bump_consumer_fence/first", VCHANNELS, bump("g1", "v1"), ["consumer_fence_bumped"]),
    row("bump_consumer_fence/again", [*VCHANNELS, bump("g1", "v1")], bump("g1", "v1"),
        ["consumer_fence_bumped"]),
    row("bump_consumer_fence/unknown-vchannel", VCHANNELS, bump("g1", "v9"), E.CHANNEL_NOT_EXIST),
    row("bump_consumer_fence/empty-group", VCHANNELS, bump("", "v1"), INVALID),
    # ---- subscriptions
    row("create_subscription/new", VCHANNELS, subscribe("s1", "v2", "v1"),
        ["subscription_created"]),
    row("create_subscription/same-again", [*VCHANNELS, subscribe("s1", "v1")],
        subscribe("s1", "v1"), []),
    row("create_subscription/other-settings", [*VCHANNELS, subscribe("s1", "v1")],
        subscribe("s1", "v2"), E.ALREADY_EXISTS, "already exists with other settings"),
    row("create_subscription/unknown-vchannel", VCHANNELS, subscribe("s1", "v9"),
        E.CHANNEL_NOT_EXIST, "'v9'"),
    row("create_subscription/no-vchannels", VCHANNELS, subscribe("s1"), INVALID,
        "number of vchannels"),
    row("create_subscription/duplicate-vchannel", VCHANNELS, subscribe("s1", "v1", "v1"), INVALID,
        "duplicate"),
    row("create_subscription/bad-name", VCHANNELS, subscribe("../s", "v1"), INVALID,
        "subscription"),
    row("create_subscription/lsn-start", VCHANNELS,
        subscribe("s1", "v1", start=pb.SUBSCRIPTION_START_LSN, start_lsn=7),
        ["subscription_created"]),
    row("create_subscription/lsn-start-missing", VCHANNELS,
        subscribe("s1", "v1", start=pb.SUBSCRIPTION_START_LSN), INVALID, "start_lsn (0"),
    row("create_subscription/lsn-with-latest", VCHANNELS,
        subscribe("s1", "v1", start=pb.SUBSCRIPTION_START_LATEST, start_lsn=7), INVALID,
        "given with start LATEST"),
    row("create_subscription/bad-start", VCHANNELS, subscribe("s1", "v1", start=99), INVALID,
        "start"),
    row("drop_subscription/existing", [*VCHANNELS, subscribe("s1", "v1")], sub_drop("s1"),
        ["subscription_dropped"]),
    row("drop_subscription/unknown", VCHANNELS, sub_drop("s9"), E.NOT_FOUND, "'s9'"),
    row("commit_subscription_position/first", [*VCHANNELS, subscribe("s1", "v1")],
        sub_commit("s1", "v1", 5, 77), ["subscription_position_committed"]),
    row("commit_subscription_position/forward",
        [*VCHANNELS, subscribe("s1", "v1"), sub_commit("s1", "v1", 5)], sub_commit("s1", "v1", 9),
        ["subscription_position_committed"]),
    row("commit_subscription_position/same", [*VCHANNELS, subscribe("s1", "v1"),
        sub_commit("s1", "v1", 5)], sub_commit("s1", "v1", 5), []),
    row("commit_subscription_position/backwards",
        [*VCHANNELS, subscribe("s1", "v1"), sub_commit("s1", "v1", 5)], sub_commit("s1", "v1", 4),
        INVALID, "moves forward only (got lsn 4; expected >= 5"),
    row("commit_subscription_position/foreign-vchannel", [*VCHANNELS, subscribe("s1", "v1")],
        sub_commit("s1", "v2", 5), INVALID, "not in subscription"),
    row("commit_subscription_position/unknown", VCHANNELS, sub_commit("s9", "v1", 5), E.NOT_FOUND),
    row("commit_subscription_position/zero", [*VCHANNELS, subscribe("s1", "v1")],
        sub_commit("s1", "v1", 0), INVALID, "expected lsn >= 1"),
    row("seek_subscription/back", [*VCHANNELS, subscribe("s1", "v1"), sub_commit("s1", "v1", 9)],
        sub_seek("s1", "v1", lsn=3), ["subscription_position_committed"]),
    row("seek_subscription/all-vchannels", [*VCHANNELS, subscribe("s1", "v1", "v2")],
        sub_seek("s1", lsn=1), ["subscription_position_committed"] * 2),
    row("seek_subscription/time-tick", [*VCHANNELS, subscribe("s1", "v1")],
        sub_seek("s1", "v1", from_time_tick=1000), ["subscription_position_committed"]),
    row("seek_subscription/both", [*VCHANNELS, subscribe("s1", "v1")],
        sub_seek("s1", "v1", lsn=3, from_time_tick=1000), INVALID, "either an lsn"),
    row("seek_subscription/neither", [*VCHANNELS, subscribe("s1", "v1")], sub_seek("s1", "v1"),
        INVALID, "either an lsn"),
    row("seek_subscription/earliest-after-retention",
        [*SEGMENTS, subscribe("s1", "v1", no_retention_hold=True), delete_before("p1", 21)],
        sub_seek("s1", lsn=1), ["subscription_position_committed"]),
    # ---- subscription members
    row("join_subscription/new", [*VCHANNELS, subscribe("s1", "v1"), grant(10_000)],
        lambda h: sub_join("s1", "m1", h.lease()), ["subscription_member_joined"]),
    row("join_subscription/no-lease", [*VCHANNELS, subscribe("s1", "v1")],
        sub_join("s1", "m1", 424242), E.NOT_FOUND, "lease 424242"),
    row("join_subscription/unknown", VCHANNELS, sub_join("s9", "m1", 1), E.NOT_FOUND),
    row("join_subscription/bad-member", [*VCHANNELS, subscribe("s1", "v1"), grant(10_000)],
        lambda h: sub_join("s1", "m 1", h.lease()), INVALID, "member_id"),
    row("leave_subscription/member",
        [*VCHANNELS, subscribe("s1", "v1"), grant(10_000), lambda h: sub_join("s1", "m1", h.lease())],
        sub_leave("s1", "m1"), ["subscription_member_left"]),
    row("leave_subscription/not-a-member", [*VCHANNELS, subscribe("s1", "v1")],
        sub_leave("s1", "m1"), []),
    row("leave_subscription/unknown", VCHANNELS, sub_leave("s9", "m1"), E.NOT_FOUND),
    row("assign_subscription/split",
        [*VCHANNELS, subscribe("s1", "v1", "v2"), grant(10_000),
         lambda h: sub_join("s1", "m1", h.lease())],
        sub_assign("s1", m1=["v1", "v2"]), ["subscription_member_assigned"]),
    row("assign_subscription/unchanged",
        [*VCHANNELS, subscribe("s1", "v1"), grant(10_000),
         lambda h: sub_join("s1", "m1", h.lease())],
        sub_assign("s1", m1=[]), []),
    row("assign_subscription/missing-member",
        [*VCHANNELS, subscribe("s1", "v1"), grant(10_000),
         lambda h: sub_join("s1", "m1", h.lease())],
        sub_assign("s1"), INVALID, "every member exactly once"),
    row("assign_subscription/twice",
        [*VCHANNELS, subscribe("s1", "v1"), grant(10_000), grant(10_000),
         lambda h: sub_join("s1", "m1", h.lease(0)), lambda h: sub_join("s1", "m2", h.lease(1))],
        sub_assign("s1", m1=["v1"], m2=["v1"]), INVALID, "assigned twice"),
    row("assign_subscription/unknown", VCHANNELS, sub_assign("s9"), E.NOT_FOUND),
    # ---- set_balance_policy
    row("set_balance_policy/change", [], policy(True, 4), ["balance_policy_set"]),
    row("set_balance_policy/max", [], policy(False, 1024), ["balance_policy_set"]),
    row("set_balance_policy/same", [policy(True, 4)], policy(True, 4), []),
    row("set_balance_policy/negative", [], policy(True, -1), INVALID,
        "max_moves_per_round (-1; expected 0..1024)"),
    row("set_balance_policy/too-many", [], policy(True, 1025), INVALID, "1025"),
    # ---- update_replicate_configuration (statemachine/replicate.py; more in
    # test_replicate_configuration.py)
    row("update_replicate_configuration/set", PCHANNEL, replicate(("east", "west")),
        ["replicate_configuration_updated"]),
    row("update_replicate_configuration/same", [*PCHANNEL, replicate(("east", "west"))],
        replicate(("east", "west")), []),
    row("update_replicate_configuration/reverse", [*PCHANNEL, replicate(("east", "west"))],
        replicate(("west", "east")), ["replicate_configuration_updated"]),
    row("update_replicate_configuration/clear", [*PCHANNEL, replicate(("east", "west"))],
        replicate_clear(), ["replicate_configuration_updated"]),
    row("update_replicate_configuration/clear-empty", PCHANNEL, replicate_clear(), []),
    row("update_replicate_configuration/not-this-cluster", PCHANNEL,
        replicate(("east", "west"), local="north"), INVALID,
        "this cluster ('north') is not in the configuration"),
    row("update_replicate_configuration/no-cluster-id", PCHANNEL,
        replicate(("east", "west"), local=""), INVALID, "this cluster has no cluster_id"),
    row("update_replicate_configuration/cycle", PCHANNEL,
        replicate(("east", "west"), ("west", "east")), INVALID, "cycle"),
    row("update_replicate_configuration/counts", PCHANNEL,
        replicate(("east", "west"), west=("q1",)), INVALID,
        "has 1 pchannels (got 1; expected 2 as cluster 'east'"),
    row("update_replicate_configuration/missing-pchannel", NODES, replicate(("east", "west")),
        E.CHANNEL_NOT_EXIST, "listed for cluster 'east', this cluster"),
    # ---- record_replicate_checkpoint
    row("record_replicate_checkpoint/first", [*PCHANNEL, replicate(("east", "west"))],
        record("p2", "west", 5), ["replicate_checkpoint_recorded"]),
    row("record_replicate_checkpoint/older",
        [*PCHANNEL, replicate(("east", "west")), record("p2", "west", 5)],
        record("p2", "west", 4), []),
    row("record_replicate_checkpoint/not-a-target", [*PCHANNEL, replicate(("west", "east"))],
        record("p1", "west", 5), E.NOT_FOUND, "no replication of pchannel 'p1' to cluster 'west'"),
    row("record_replicate_checkpoint/no-configuration", PCHANNEL, record("p1", "west", 5),
        E.NOT_FOUND, "expected an edge from this cluster"),
    row("record_replicate_checkpoint/negative", [*PCHANNEL, replicate(("east", "west"))],
        record("p1", "west", -1), INVALID, "invalid source_lsn (-1; expected >= 0)"),
    row("record_replicate_checkpoint/mismatch",
        [*PCHANNEL, replicate(("east", "west")), record("p2", "west", 5)],
        record("p2", "west", 0, claims=1_000_201), ["replicate_checkpoint_recorded"]),
    row("record_replicate_checkpoint/mismatch-repeat",
        [*PCHANNEL, replicate(("east", "west")), record("p2", "west", 0, claims=9)],
        record("p2", "west", 0, claims=9), []),
    row("record_replicate_checkpoint/mismatch-cleared",
        [*PCHANNEL, replicate(("east", "west")), record("p2", "west", 0, claims=9)],
        record("p2", "west", 0), ["replicate_checkpoint_recorded"]),
    row("record_replicate_checkpoint/negative-claim", [*PCHANNEL, replicate(("east", "west"))],
        record("p1", "west", 0, claims=-1), INVALID, "invalid target_claims_lsn (-1;"),
    # ---- barrier
    row("barrier/accept", VCHANNELS, barrier(), []),
    # ---- alter_wal (p1 is assigned: it goes through FLUSHING; p2 never was: it moves at once)
    row("alter_wal/accept", ASSIGNED, alter("jetstream", url="nats://h:1"),
        ["wal_alter_started", "wal_checkpoint_advanced"]),
    row("alter_wal/all-there-already", ASSIGNED, alter("segments"), []),
    row("alter_wal/in-progress", [*ASSIGNED, alter("local")], alter("jetstream", url="nats://h:1"),
        RESOURCE_ACQUIRED, "an AlterWAL to local is in progress (epoch 8"),
    row("alter_wal/unknown", ASSIGNED, alter("kafka"), INVALID, "invalid wal ('kafka';"),
    row("alter_wal/no-target", ASSIGNED, alter(""), INVALID, "invalid target (got ''"),
    row("alter_wal/config-for-local", ASSIGNED, alter("local", a="b"), INVALID,
        "expected none for local"),
    # ---- wal_flushed (ALTERING: p1's manifest ends at 10, the alter's epoch is 9)
    row("wal_flushed/accept", ALTERING, flushed(9, 1, 10),
        ["wal_checkpoint_advanced", "pchannel_assigned"]),
    row("wal_flushed/repeat", [*ALTERING, flushed(9, 1, 10)], flushed(9, 1, 10), []),
    row("wal_flushed/wrong-epoch", ALTERING, flushed(7, 1, 10), UNMATCHED,
        "no AlterWAL of epoch 7 is in progress (epoch 9 is)"),
    row("wal_flushed/wrong-term", ALTERING, flushed(9, 2, 10), UNMATCHED, "at term 2 by 'n1'"),
    row("wal_flushed/not-the-manifest-end", ALTERING, flushed(9, 1, 9), INVALID,
        "expected the manifest's end, 10"),
    row("wal_flushed/no-checkpoint", ALTERING, flushed(9, 1, 0), INVALID, "invalid checkpoint"),
    row("wal_flushed/no-alter", [*ASSIGNED, segment(1, 10)], flushed(9, 1, 10), UNMATCHED,
        "no AlterWAL of epoch 9 is in progress"),
]

# fmt: on

# Commands that have no way to be rejected once decoded with a proposer time.
NEVER_REJECTED = {"expire_leases", "extend_leases", "barrier"}


def _run_row(setup: list[Step], step: Step) -> tuple[Harness, pb.CoordinationState, pb.Command]:
    harness = Harness()
    harness.ok(*setup)
    return harness, copy_state(harness.state), harness.resolve(step)


@pytest.mark.parametrize(("name", "setup", "command", "expect", "contains"), ROWS)
def test_command_table(
    name: str, setup: list[Step], command: Step, expect: list[str] | int, contains: str
) -> None:
    harness, before, command_message = _run_row(setup, command)
    assert command_message.WhichOneof("body") == name.split("/")[0]

    # decide() directly, on a copy, with the context apply_command will use.
    ctx = Context(
        time_ms=max(command_message.proposed_at_ms, before.last_time_ms),
        raft_index=harness.raft_index + 1,
    )
    probe = copy_state(before)
    direct = decide(probe, command_message, ctx)
    assert state_digest(probe) == state_digest(before), "decide() changed the state"

    result = harness.apply(command_message)
    events = list(result.events)
    assert violations(harness.state, before, events) == []
    assert result.revision == harness.state.revision
    assert not result.deduplicated

    if isinstance(expect, list):
        assert result.rejection.code == E.OK, (
            f"rejected {code_name(result.rejection.code)}: {result.rejection.message}"
        )
        assert kinds(events) == expect
        assert not isinstance(direct, Rejection)
        assert [e.SerializeToString(deterministic=True) for e in direct] == [
            e.SerializeToString(deterministic=True) for e in events
        ]
        if expect == ["state_restored"]:
            # A restore continues from the saved revision.
            assert harness.state.revision == events[0].state_restored.restored_revision
        else:
            assert harness.state.revision == before.revision + len(expect)
        if not expect:
            assert domain_bytes(harness.state) == domain_bytes(before)
    else:
        assert result.rejection.code == expect, (
            f"expected {code_name(expect)}, got {code_name(result.rejection.code)} "
            f"{result.rejection.message!r} events={kinds(events)}"
        )
        assert result.rejection.message, "a rejection must say why"
        assert contains in result.rejection.message
        assert events == []
        assert isinstance(direct, Rejection)
        assert (direct.code, direct.message) == (expect, result.rejection.message)
        assert domain_bytes(harness.state) == domain_bytes(before)


def test_a_seek_below_retention_names_the_first_available_lsn() -> None:
    setup = [*SEGMENTS, subscribe("s1", "v1", no_retention_hold=True), delete_before("p1", 21)]
    harness, _, command_message = _run_row(setup, sub_seek("s1", "v1", lsn=3))
    result = harness.apply(command_message)
    assert result.rejection.code == E.COMPACTED
    assert result.rejection.first_available == 21


def test_table_covers_every_command_accept_and_reject() -> None:
    command_kinds = {f.name for f in pb.Command.DESCRIPTOR.oneofs_by_name["body"].fields}
    accepted: set[str] = set()
    rejected: set[str] = set()
    for param in ROWS:
        name, _, _, expect, _ = param.values
        kind = name.split("/")[0]
        assert kind in command_kinds, f"row {name} names no command"
        (accepted if isinstance(expect, list) else rejected).add(kind)
    assert accepted == command_kinds
    assert rejected == command_kinds - NEVER_REJECTED


# --------------------------------------------------------------------------------------
# Nodes and pchannels
# --------------------------------------------------------------------------------------


def test_register_node_fields_and_down_node_keeps_frozen_flag() -> None:
    h = Harness()
    result = h.ok(register("n1", "10.0.0.1:7201"))
    node = h.state.nodes["n1"]
    assert (node.address, node.state, node.registered_revision) == (
        "10.0.0.1:7201",
        pb.NODE_STATE_UP,
        result.events[0].revision,
    )
    h.ok(freeze("n1"), down("n1"))
    assert (h.state.nodes["n1"].state, h.state.nodes["n1"].frozen) == (pb.NODE_STATE_DOWN, True)
    h.ok(register("n1", "10.0.0.1:7201"))
    assert h.state.nodes["n1"].state == pb.NODE_STATE_UP


def test_a_removed_node_loses_its_addresses_and_a_rejoin_brings_it_back() -> None:
    h = Harness()
    h.ok(*NODES, register("n4", "10.0.0.4:7201"))
    assert h.state.nodes["n4"].address == "10.0.0.4:7201"
    result = h.ok(forget("n4", at=NOW + 10))
    assert "n4" not in h.state.nodes
    removed = h.state.removed_nodes["n4"]
    assert (removed.removed_revision, removed.removed_at_ms) == (
        result.events[0].revision,
        NOW + 10,
    )
    # Durable as state: a snapshot keeps the removal.
    assert restore_state(snapshot_state(h.state)).removed_nodes["n4"] == removed
    # Nothing can be placed on it any more.
    h.ok(create_pchannels("p1"))
    assert h.apply(assign("p1", 1, "n4", ["n1"])).rejection.code != E.OK
    # Its heartbeats register it no more; a process started with --join later does.
    assert h.apply(register("n4", "10.0.0.4:7201")).rejection.code == E.IGNORED_OPERATION
    h.ok(rejoin("n4", NOW + 11))
    assert "n4" not in h.state.removed_nodes
    assert h.state.nodes["n4"].state == pb.NODE_STATE_UP


def test_create_pchannels_prefix_takes_smallest_unused_suffix() -> None:
    h = Harness()
    h.ok(create_pchannels("p_0", "p_2"))
    h.ok(drop_p("p_0"))
    result = h.ok(create_pchannels(prefix="p", count=3, replica_count=2))
    assert list(result.pchannel_names) == ["p_1", "p_3", "p_4"]
    assert kinds(result.events) == ["pchannel_created"] * 3
    assert [h.state.pchannels[n].replica_count for n in result.pchannel_names] == [2, 2, 2]
    assert h.state.pchannels["p_1"].state == pb.PCHANNEL_STATE_UNINITIALIZED
    # Default replica count.
    assert h.ok(create_pchannels("q")).events[0].pchannel_created.replica_count == 3


def test_assign_adds_owner_to_replicas_and_appends_history() -> None:
    h = Harness()
    h.ok(*PCHANNEL)
    result = h.ok(assign("p1", 1, "n1", ["n2", "n3"]))
    assert list(result.events[0].pchannel_assigned.replica_node_ids) == ["n1", "n2", "n3"]
    channel = h.state.pchannels["p1"]
    assert (channel.term, channel.owner_node_id, channel.state, channel.access_mode) == (
        1,
        "n1",
        pb.PCHANNEL_STATE_ASSIGNING,
        pb.ACCESS_MODE_READWRITE,
    )
    assert list(channel.replica_node_ids) == ["n1", "n2", "n3"]
    # An owner already in the list keeps its place.
    h.ok(assign("p1", 2, "n2", ["n3", "n2"], access_mode=pb.ACCESS_MODE_READONLY))
    channel = h.state.pchannels["p1"]
    assert list(channel.replica_node_ids) == ["n3", "n2"]
    assert channel.access_mode == pb.ACCESS_MODE_READONLY
    assert [(e.term, e.node_id, e.start_lsn, e.end_lsn) for e in channel.history] == [
        (1, "n1", 0, 0),
        (2, "n2", 0, 0),
    ]


def test_ready_sets_start_lsn_and_closes_previous_written_term() -> None:
    h = Harness()
    rs = ["n1", "n2", "n3"]
    h.ok(*PCHANNEL, assign("p1", 1, "n1", rs), ready("p1", 1, "n1", 1))
    h.ok(assign("p1", 2, "n2", rs), ready("p1", 2, "n2", 101))
    # Term 3 never becomes ready: term 4 closes term 2 (the last one that wrote).
    h.ok(assign("p1", 3, "n3", rs), assign("p1", 4, "n1", rs), ready("p1", 4, "n1", 251))
    channel = h.state.pchannels["p1"]
    assert channel.state == pb.PCHANNEL_STATE_ASSIGNED
    assert [(e.term, e.node_id, e.start_lsn, e.end_lsn) for e in channel.history] == [
        (1, "n1", 1, 100),
        (2, "n2", 101, 250),
        (3, "n3", 0, 0),
        (4, "n1", 251, 0),
    ]


def test_history_is_bounded_to_the_newest_entries() -> None:
    h = Harness()
    h.ok(*PCHANNEL)
    for term in range(1, 71):
        h.ok(assign("p1", term, f"n{term % 3 + 1}"))
    history = h.state.pchannels["p1"].history
    assert len(history) == h.limits.max_history_entries == 64
    assert [e.term for e in history] == list(range(7, 71))


def test_history_bound_follows_the_given_limits() -> None:
    h = Harness(Limits(max_history_entries=2))
    h.ok(*PCHANNEL)
    for term in range(1, 5):
        h.ok(assign("p1", term, "n1"))
    assert [e.term for e in h.state.pchannels["p1"].history] == [3, 4]


def test_ready_rejects_start_lsn_that_goes_backwards() -> None:
    h = Harness()
    h.ok(*PCHANNEL, assign("p1", 1, "n1", ["n2"]), ready("p1", 1, "n1", 100))
    h.ok(segment(1, 150))
    h.ok(assign("p1", 2, "n2"))
    result = h.apply(ready("p1", 2, "n2", 50))
    history = h.state.pchannels["p1"].history
    assert result.rejection.code == E.INVALID_ARGUMENT, (
        f"accepted; history is now {[(e.term, e.start_lsn, e.end_lsn) for e in history]}"
    )


def test_dropped_pchannel_is_kept_as_tombstone() -> None:
    h = Harness()
    h.ok(*ASSIGNED, vchannel("v1"), segment(1, 10))
    h.reject(drop_p("p1"), E.INVALID_ARGUMENT)
    h.ok(drop_v("v1"), drop_p("p1"))
    channel = h.state.pchannels["p1"]
    assert (channel.state, channel.term, channel.owner_node_id) == (
        pb.PCHANNEL_STATE_DROPPED,
        1,
        "",
    )
    # The name can never come back with a term starting from zero.
    h.reject(create_pchannels("p1"), E.ALREADY_EXISTS)
    h.reject(assign("p1", 2, "n1"), E.CHANNEL_NOT_EXIST)
    h.reject(vchannel("v2", "p1"), E.CHANNEL_NOT_EXIST)
    h.reject(segment(11, 20), E.CHANNEL_NOT_EXIST)
    assert "p1" in h.state.pchannels and h.state.pchannels["p1"].term == 1


def test_vchannel_ids_increase_and_are_never_reused() -> None:
    h = Harness()
    h.ok(*ASSIGNED)
    ids = [h.ok(vchannel(f"v{k}")).events[0].vchannel_created.id for k in range(1, 4)]
    assert ids == [1, 2, 3]
    h.ok(drop_v("v3"))
    assert h.ok(vchannel("v4")).events[0].vchannel_created.id == 4
    assert h.state.next_vchannel_id == 5
    created = h.state.vchannels["v4"]
    assert (created.pchannel, created.state) == ("p1", pb.VCHANNEL_STATE_NORMAL)
    assert h.state.vchannels["v3"].state == pb.VCHANNEL_STATE_DROPPED


# --------------------------------------------------------------------------------------
# Segments
# --------------------------------------------------------------------------------------


def test_commit_segment_records_the_segment() -> None:
    h = Harness()
    h.ok(*ASSIGNED)
    result = h.ok(segment(1, 10, digest=0xDEADBEEF))
    event = result.events[0]
    stored = h.state.manifests["p1"].segments[0]
    assert stored == event.segment_committed.segment
    assert (stored.segment_id, stored.commit_term, stored.committed_revision) == (
        1,
        1,
        event.revision,
    )
    assert stored.digest == 0xDEADBEEF
    assert h.state.manifests["p1"].committed_through_lsn == 10
    # An exact repeat changes nothing and still answers OK.
    repeat = h.ok(segment(1, 10, digest=0xDEADBEEF))
    assert list(repeat.events) == [] and repeat.revision == result.revision


def test_delete_segments_before_respects_consumer_positions() -> None:
    h = Harness()
    h.ok(*SEGMENTS, position("g1", "v1", 15), position("g2", "v2", 25))
    # g1 (at lsn 15) still needs [11, 20]: only [1, 10] goes.
    first = h.ok(delete_before("p1", 31)).events[0].segments_deleted
    assert (list(first.segment_ids), first.deleted_before_lsn) == ([1], 11)
    manifest = h.state.manifests["p1"]
    assert [s.segment_id for s in manifest.segments] == [11, 21]
    assert manifest.deleted_before_lsn == 11
    h.ok(position("g1", "v1", 30))
    # Now g2 (at lsn 25) bounds it.
    second = h.ok(delete_before("p1", 31)).events[0].segments_deleted
    assert (list(second.segment_ids), second.deleted_before_lsn) == ([11], 21)
    h.ok(position("g2", "v2", 30))
    h.ok(delete_before("p1", 31))
    assert list(h.state.manifests["p1"].segments) == []
    # Deletion does not reopen the LSN range.
    assert h.state.manifests["p1"].committed_through_lsn == 30
    h.reject(segment(1, 10), E.INVALID_ARGUMENT)
    h.ok(segment(31, 40))


# --------------------------------------------------------------------------------------
# Broadcasts
# --------------------------------------------------------------------------------------


def test_broadcast_idempotency_key_returns_the_same_id() -> None:
    h = Harness()
    h.ok(*VCHANNELS)
    command = broadcast("v1", "v2", keys=[("k1", EXCLUSIVE)], idempotency_key="ddl-1")
    created = h.ok(command)
    broadcast_id = created.broadcast_id
    assert broadcast_id == created.events[0].revision == created.events[0].broadcast_created.task.id
    repeat = h.ok(command)
    assert (list(repeat.events), repeat.broadcast_id, repeat.revision) == (
        [],
        broadcast_id,
        created.revision,
    )
    # Still deduplicated once the task is a tombstone...
    h.ok(ack("v1"), ack("v2"))
    assert h.ok(command).broadcast_id == broadcast_id
    # ...and a new task once it was cleared.
    h.ok(clear(0))
    assert broadcast_id not in h.state.broadcasts
    assert "ddl-1" not in h.state.broadcast_idempotency
    again = h.ok(command)
    assert again.broadcast_id > broadcast_id
    assert kinds(again.events) == ["broadcast_created", "lock_acquired"]


def test_broadcast_locks_and_last_ack_releases_them() -> None:
    h = Harness()
    h.ok(*VCHANNELS, grant())
    created = h.ok(broadcast("v1", "v2", keys=[("k2", SHARED), ("k1", EXCLUSIVE)]))
    broadcast_id = created.broadcast_id
    task = h.state.broadcasts[broadcast_id]
    assert task.state == pb.BROADCAST_STATE_PENDING
    # Lock events come in key order, each with its own revision as fencing token.
    acquired = [e for e in created.events if e.HasField("lock_acquired")]
    assert [e.lock_acquired.key for e in acquired] == ["k1", "k2"]
    assert all(e.lock_acquired.fencing_token == e.revision for e in acquired)
    assert h.state.locks["k1"].holders[0].id == broadcast_id
    h.reject(lock("k1", SHARED), E.RESOURCE_ACQUIRED)
    h.ok(lock("k2", SHARED))

    h.ok(appended("v1", lsn=3, time_tick=4))
    assert h.state.broadcasts[broadcast_id].vchannels[0].appended_lsn == 3
    h.ok(ack("v1", checkpoint=3, at=NOW + 10))
    assert "k1" in h.state.locks
    last = h.ok(ack("v2", checkpoint=9, at=NOW + 20))
    assert kinds(last.events) == [
        "broadcast_acked",
        "lock_released",
        "lock_released",
        "broadcast_tombstoned",
    ]
    assert [e.lock_released.key for e in last.events[1:3]] == ["k1", "k2"]
    task = h.state.broadcasts[broadcast_id]
    assert (task.state, task.tombstoned_at_ms) == (pb.BROADCAST_STATE_TOMBSTONE, NOW + 20)
    assert [(v.vchannel, v.acked, v.acked_checkpoint) for v in task.vchannels] == [
        ("v1", True, 3),
        ("v2", True, 9),
    ]
    # The keys are free again (k2 is still shared by the lease).
    assert "k1" not in h.state.locks
    assert [holder.kind for holder in h.state.locks["k2"].holders] == [pb.HOLDER_KIND_LEASE]
    h.ok(lock("k1", EXCLUSIVE))


def test_clear_broadcasts_measures_retention_with_proposer_time() -> None:
    h = Harness()
    h.ok(*VCHANNELS, broadcast("v1", idempotency_key="i1"))
    h.ok(ack("v1", at=NOW + 1_000))  # tombstoned at NOW + 1000 (proposer time)
    h.ok(broadcast("v2"))  # a PENDING task is never cleared
    assert list(h.ok(clear(60_000, at=NOW + 60_999)).events) == []
    result = h.ok(clear(60_000, at=NOW + 61_000))
    assert kinds(result.events) == ["broadcast_cleared"]
    assert result.events[0].time_ms == NOW + 61_000
    assert [t.state for t in h.state.broadcasts.values()] == [pb.BROADCAST_STATE_PENDING]
    assert dict(h.state.broadcast_idempotency) == {}


def test_clear_broadcasts_is_bounded_per_sweep() -> None:
    h = Harness(Limits(max_events_per_sweep=2))
    h.ok(*VCHANNELS)
    for _ in range(3):
        h.ok(broadcast("v1"), ack("v1"))
    assert kinds(h.ok(clear(0)).events) == ["broadcast_cleared"] * 2
    assert kinds(h.ok(clear(0)).events) == ["broadcast_cleared"]
    assert dict(h.state.broadcasts) == {}


# --------------------------------------------------------------------------------------
# Leases and locks
# --------------------------------------------------------------------------------------


def test_grant_and_keep_alive_replies() -> None:
    h = Harness()
    granted = h.ok(grant(10_000, holder="worker-7", at=NOW + 5))
    lease_id = granted.lease_id
    assert lease_id == granted.events[0].revision
    assert granted.lease_deadline_ms == NOW + 5 + 10_000
    lease = h.state.leases[lease_id]
    assert (lease.ttl_ms, lease.holder, lease.granted_revision) == (10_000, "worker-7", lease_id)
    renewed = h.ok(keep_alive(at=NOW + 4_000))
    assert (renewed.lease_id, renewed.lease_deadline_ms) == (lease_id, NOW + 14_000)
    assert h.state.leases[lease_id].deadline_ms == NOW + 14_000
    # A keep-alive that would not move the deadline still answers it.
    same = h.ok(keep_alive(at=NOW + 10))
    assert (list(same.events), same.lease_deadline_ms) == ([], NOW + 14_000)


def test_fencing_token_is_revision_of_lock_acquired() -> None:
    h = Harness()
    h.ok(grant(), grant())
    first = h.ok(lock("k1", SHARED, index=0))
    event = first.events[0]
    assert first.fencing_token == event.revision == event.lock_acquired.fencing_token
    assert first.fencing_token == h.state.revision
    h.ok(barrier())
    second = h.ok(lock("k1", SHARED, index=1))
    assert second.fencing_token == second.events[0].revision > first.fencing_token
    holders = h.state.locks["k1"].holders
    assert [x.fencing_token for x in holders] == [first.fencing_token, second.fencing_token]
    # An idempotent re-lock returns the same token and emits nothing.
    again = h.ok(lock("k1", SHARED, index=0))
    assert (list(again.events), again.fencing_token) == ([], first.fencing_token)


def test_revoke_releases_locks_for_others() -> None:
    h = Harness()
    h.ok(grant(), grant(), lock("k1", index=0), lock("k2", SHARED, index=0))
    h.reject(lock("k1", index=1), E.RESOURCE_ACQUIRED)
    revoked = h.ok(revoke(index=0))
    assert [e.lock_released.key for e in revoked.events[:2]] == ["k1", "k2"]
    assert h.lease(0) not in h.state.leases
    assert dict(h.state.locks) == {}
    h.ok(lock("k1", index=1))


def test_expire_leases_only_takes_due_leases_and_frees_their_locks() -> None:
    h = Harness()
    h.ok(grant(1_000), grant(2_000), grant(3_000))
    short, middle, long = h.lease(0), h.lease(1), h.lease(2)
    h.ok(lock("a", index=0), lock("b", SHARED, index=1), lock("b", SHARED, index=2))
    result = h.ok(expire(NOW + 2_000))
    assert kinds(result.events) == [
        "lock_released",
        "lease_expired",
        "lock_released",
        "lease_expired",
    ]
    assert [e.lease_expired.lease_id for e in result.events if e.HasField("lease_expired")] == [
        short,
        middle,
    ]
    assert sorted(h.state.leases) == [long]
    assert sorted(h.state.locks) == ["b"]
    assert [x.id for x in h.state.locks["b"].holders] == [long]
    h.reject(keep_alive(lease_id=short, at=NOW + 2_000), E.NOT_FOUND)
    h.reject(lock("c", lease_id=middle, at=NOW + 2_000), E.NOT_FOUND)


def test_expire_leases_is_bounded_per_sweep() -> None:
    h = Harness(Limits(max_events_per_sweep=2))
    h.ok(grant(1), grant(1), grant(1))
    assert kinds(h.ok(expire(NOW + 1)).events) == ["lease_expired"] * 2
    assert len(h.state.leases) == 1


def test_extend_leases_uses_the_clamped_clock_and_never_shortens() -> None:
    h = Harness()
    h.ok(grant(10_000), grant(100_000))
    h.ok(barrier(at=NOW + 20_000))
    # Proposed with an older clock: judged at NOW + 20000. The overdue, not yet expired
    # lease is kept (a leader change must not cost a holder its lease).
    result = h.ok(extend(NOW))
    assert [(e.lease_renewed.lease_id, e.lease_renewed.deadline_ms) for e in result.events] == [
        (h.lease(0), NOW + 30_000),
        (h.lease(1), NOW + 120_000),
    ]
    assert list(h.ok(extend(NOW + 20_000)).events) == []
    # decide() on its own never moves a deadline backwards, whatever time it is given.
    early = Context(time_ms=NOW, raft_index=h.raft_index + 1)
    assert decide(h.state, cmd(extend_leases=pb.ExtendLeases()), early) == []
    assert h.state.leases[h.lease(0)].deadline_ms == NOW + 30_000


def test_lock_limits_keys_per_lease() -> None:
    h = Harness(Limits(max_keys_per_lease=2))
    h.ok(grant(), lock("a"), lock("b"))
    rejected = h.reject(lock("c"), E.INVALID_ARGUMENT)
    assert "too many keys (2; expected at most 2)" in rejected.rejection.message


def test_grant_lease_limits_live_leases() -> None:
    h = Harness(Limits(max_leases=2))
    h.ok(grant(), grant())
    full = h.reject(grant(), E.RESOURCE_EXHAUSTED)
    assert "too many live leases in the cluster (2; expected fewer than 2, the cluster's" in (
        full.rejection.message
    )
    assert "max_leases" in full.rejection.message
    h.ok(revoke(index=0), grant())


def test_one_identity_cannot_take_every_lease() -> None:
    """Issue 53, item 5: per-identity lease and lock budgets. One owner filling its budget
    leaves the rest of the cluster's leases and keys to the others; a lease that ends
    gives its share back; callers without an identity (no tokens) have no such budget."""
    h = Harness(Limits(max_leases=6, max_leases_per_owner=3, max_lease_locks_per_owner=2))
    h.ok(*[grant(owner="id:greedy") for _ in range(3)])
    refused = h.reject(grant(owner="id:greedy"), E.RESOURCE_EXHAUSTED)
    assert (
        "too many live leases for this caller's identity (3; expected fewer than 3, the "
        "per-identity lease budget max_leases_per_owner" in refused.rejection.message
    )
    assert "greedy" not in refused.rejection.message
    # Another application still gets leases, up to the cluster's cap.
    h.ok(grant(owner="id:other"), grant(owner="id:other"))
    assert (h.state.owner_usage["id:greedy"].leases, h.state.owner_usage["id:other"].leases) == (
        3,
        2,
    )
    # Keys: at most 2 through all of an owner's leases.
    h.ok(lock("a", index=0), lock("b", index=1))
    locked = h.reject(lock("c", index=2), E.RESOURCE_EXHAUSTED)
    assert "the per-identity lock budget max_lease_locks_per_owner" in locked.rejection.message
    h.ok(lock("c", index=3))  # an "id:other" lease
    assert h.state.owner_usage["id:greedy"].locks == 2
    # Released keys and ended leases give their share back.
    h.ok(unlock("b", index=1), lock("c2", index=2))
    h.ok(revoke(index=0))
    assert (h.state.owner_usage["id:greedy"].leases, h.state.owner_usage["id:greedy"].locks) == (
        2,
        1,
    )
    h.ok(grant(owner="id:greedy"), grant(owner="id:third"))
    # The cluster's own cap still holds for everyone, and is named.
    full = h.reject(grant(owner="id:third"), E.RESOURCE_EXHAUSTED)
    assert "the cluster's lease budget max_leases" in full.rejection.message
    # Expiry frees the owner's budget too, and an owner with nothing left is forgotten.
    h.ok(expire(NOW + 20_000))
    assert dict(h.state.owner_usage) == {}
    # No identity (a cluster without tokens): only the cluster's cap.
    h.ok(*[grant() for _ in range(6)])
    assert dict(h.state.owner_usage) == {}


def test_unlock_keeps_other_shared_holders() -> None:
    h = Harness()
    h.ok(grant(), grant(), lock("k", SHARED, index=0), lock("k", SHARED, index=1))
    h.ok(unlock("k", index=0))
    assert [x.id for x in h.state.locks["k"].holders] == [h.lease(1)]
    assert list(h.state.leases[h.lease(0)].locked_keys) == []
    assert list(h.state.leases[h.lease(1)].locked_keys) == ["k"]


# --------------------------------------------------------------------------------------
# Consumers and balance policy
# --------------------------------------------------------------------------------------


def test_consumer_fence_reply_and_position() -> None:
    h = Harness()
    h.ok(*VCHANNELS)
    assert h.ok(bump("g1", "v1")).consumer_fence == 1
    assert h.ok(bump("g1", "v1")).consumer_fence == 2
    h.ok(position("g1", "v1", 42, fence=2))
    stored = h.state.consumer_groups["g1"].positions["v1"]
    assert (stored.group, stored.vchannel, stored.lsn, stored.fence) == ("g1", "v1", 42, 2)
    fenced = h.reject(position("g1", "v1", 43, fence=1), E.CHANNEL_FENCED)
    assert fenced.rejection.current_term == 2
    # Another vchannel of the same group has its own fence.
    h.ok(position("g1", "v2", 1, fence=0))


def test_set_balance_policy_is_stored() -> None:
    h = Harness()
    h.ok(policy(True, 8))
    assert (h.state.balance_policy.allow_rebalance, h.state.balance_policy.max_moves_per_round) == (
        True,
        8,
    )


# --------------------------------------------------------------------------------------
# apply_command: deduplication, clock, decoding
# --------------------------------------------------------------------------------------


def test_duplicate_request_id_applies_once() -> None:
    h = Harness()
    first = h.ok(cmd(request_id="req-1", grant_lease=pb.GrantLease(ttl_ms=10_000)))
    before = domain_bytes(h.state)
    revision = h.state.revision
    retry = h.apply(cmd(request_id="req-1", at=NOW + 5, grant_lease=pb.GrantLease(ttl_ms=10_000)))
    assert retry.deduplicated and not first.deduplicated
    assert (retry.revision, retry.lease_id, retry.lease_deadline_ms) == (
        first.revision,
        first.lease_id,
        first.lease_deadline_ms,
    )
    assert list(retry.events) == []
    assert h.state.revision == revision
    assert domain_bytes(h.state) == before
    assert len(h.state.leases) == 1
    # The Raft index still moves on: the entry was applied (as a no-op).
    assert h.state.last_raft_index == h.raft_index


def test_duplicate_request_id_repeats_a_rejection() -> None:
    h = Harness()
    h.ok(grant(), grant(), lock("k", index=0))
    conflicting = lambda h: cmd(  # noqa: E731
        request_id="r", lock=pb.Lock(key="k", mode=EXCLUSIVE, lease_id=h.lease(1))
    )
    first = h.reject(conflicting, E.RESOURCE_ACQUIRED)
    h.ok(unlock("k", index=0))
    # A retry with the same id gets the stored answer even though the key is free now.
    retry = h.apply(conflicting)
    assert retry.deduplicated
    assert retry.rejection == first.rejection
    assert "k" not in h.state.locks


def test_dedup_window_evicts_the_oldest_request_id() -> None:
    h = Harness(Limits(dedup_window=3))
    for k in range(1, 5):
        h.ok(cmd(request_id=f"r{k}", barrier=pb.Barrier()))
    assert sorted(h.state.recent_results) == ["r2", "r3", "r4"]
    assert len(h.state.recent_request_ids) == 3
    # r1 was evicted: it applies again (and evicts r2, now the oldest).
    again = h.ok(cmd(request_id="r1", grant_lease=pb.GrantLease(ttl_ms=5)))
    assert not again.deduplicated and kinds(again.events) == ["lease_granted"]
    assert sorted(h.state.recent_results) == ["r1", "r3", "r4"]
    assert h.apply(cmd(request_id="r3", barrier=pb.Barrier())).deduplicated
    assert h.apply(cmd(request_id="r4", barrier=pb.Barrier())).deduplicated
    assert not h.apply(cmd(request_id="r2", barrier=pb.Barrier())).deduplicated
    assert sorted(h.state.recent_results) == ["r1", "r2", "r4"]


def test_commands_without_request_id_are_not_remembered() -> None:
    h = Harness()
    h.ok(grant(), grant())
    assert len(h.state.leases) == 2
    assert list(h.state.recent_request_ids) == [] and dict(h.state.recent_results) == {}


def test_proposer_time_never_moves_backwards() -> None:
    h = Harness()
    h.ok(barrier(at=NOW + 10_000))
    assert h.state.last_time_ms == NOW + 10_000
    # A new leader whose clock is behind proposes an older time.
    granted = h.ok(grant(1_000, at=NOW))
    assert granted.lease_deadline_ms == NOW + 11_000
    assert granted.events[0].time_ms == NOW + 10_000
    assert h.state.last_time_ms == NOW + 10_000
    # Lease judged on the clamped clock: due at NOW + 11000 whatever the proposer says.
    assert list(h.ok(expire(NOW + 5_000)).events) == []
    assert kinds(h.ok(expire(NOW + 11_000)).events) == ["lease_expired"]
    # A rejected command moves the clock too (it was stamped and applied).
    h.reject(grant(0, at=NOW + 20_000), E.INVALID_ARGUMENT)
    assert h.state.last_time_ms == NOW + 20_000


@pytest.mark.parametrize("proposed_at_ms", [0, -1])
def test_missing_proposer_time_is_invalid(proposed_at_ms: int) -> None:
    h = Harness()
    result = h.reject(grant(at=proposed_at_ms), E.INVALID_ARGUMENT)
    assert "proposed_at_ms" in result.rejection.message
    assert dict(h.state.leases) == {} and h.state.revision == 0


def test_undecodable_bytes_are_invalid_argument() -> None:
    h = Harness()
    h.ok(*NODES)
    before = domain_bytes(h.state)
    result = h.apply_bytes(b"\xff\xff\xff\xff")
    assert result.rejection.code == E.INVALID_ARGUMENT
    assert "undecodable command (4 bytes" in result.rejection.message
    assert result.revision == h.state.revision
    assert domain_bytes(h.state) == before
    assert h.state.last_raft_index == h.raft_index


def test_too_long_request_id_is_invalid_and_not_remembered() -> None:
    h = Harness()
    result = h.reject(cmd(request_id="r" * 129, barrier=pb.Barrier()), E.INVALID_ARGUMENT)
    assert "request_id too long (129 chars" in result.rejection.message
    assert dict(h.state.recent_results) == {}
    h.ok(cmd(request_id="r" * 128, barrier=pb.Barrier()))
    assert list(h.state.recent_results) == ["r" * 128]


def test_zero_dedup_window_disables_deduplication() -> None:
    h = Harness(Limits(dedup_window=0))
    h.ok(cmd(request_id="r1", barrier=pb.Barrier()))
    assert not h.apply(cmd(request_id="r1", barrier=pb.Barrier())).deduplicated


def test_subscription_members_fence_commits_by_generation_and_lease() -> None:
    h = Harness()
    h.ok(*VCHANNELS, subscribe("s1", "v1", "v2"))
    lease_a = h.ok(grant(10_000)).lease_id
    lease_b = h.ok(grant(10_000)).lease_id

    def join(member: str, lease_id: int) -> pb.Command:
        return cmd(
            join_subscription=pb.JoinSubscription(name="s1", member_id=member, lease_id=lease_id)
        )

    def assign(**held: list[str]) -> pb.Command:
        return cmd(
            assign_subscription=pb.AssignSubscription(
                name="s1",
                assignments=[
                    pb.SubscriptionAssignment(member_id=m, vchannels=v) for m, v in held.items()
                ],
            )
        )

    def commit(member: str, generation: int, vchannel: str, lsn: int) -> pb.Command:
        return cmd(
            commit_subscription_position=pb.CommitSubscriptionPosition(
                name="s1", vchannel=vchannel, lsn=lsn, member_id=member, generation=generation
            )
        )

    h.ok(join("a", lease_a), join("b", lease_b))
    assert h.apply(join("a", lease_a)).events == []  # joined already
    h.reject(join("c", 999_999), E.NOT_FOUND)
    h.reject(assign(a=["v1", "v2"], b=["v2"]), INVALID)  # v2 twice
    h.reject(assign(a=["v1"]), INVALID)  # b not listed
    h.reject(assign(a=["v9"], b=[]), INVALID)  # not in the subscription
    h.ok(assign(a=["v1"], b=["v2"]))
    members = h.state.subscriptions["s1"].members
    gen_a, gen_b = members["a"].generation, members["b"].generation
    h.ok(commit("a", gen_a, "v1", 3))
    # Unfenced commits are refused while there are members.
    rejected = h.reject(sub_commit("s1", "v1", 4), E.CHANNEL_FENCED)
    assert "must name its member" in rejected.rejection.message
    # a does not hold v2.
    h.reject(commit("a", gen_a, "v2", 3), E.CHANNEL_FENCED)
    # b's lease ends: a gets v2 at a new generation; b (paused, then back) is fenced.
    h.ok(cmd(revoke_lease=pb.RevokeLease(lease_id=lease_b)))
    h.ok(assign(a=["v1", "v2"], b=[]))
    rejected = h.reject(commit("b", gen_b, "v2", 9), E.CHANNEL_FENCED)
    assert "generation" in rejected.rejection.message
    stale = h.reject(commit("a", gen_a, "v1", 4), E.CHANNEL_FENCED)
    assert stale.rejection.current_term == members["a"].generation
    h.ok(commit("a", members["a"].generation, "v2", 5))
    h.ok(cmd(leave_subscription=pb.LeaveSubscription(name="s1", member_id="b")))
    assert sorted(h.state.subscriptions["s1"].members) == ["a"]
    assert h.state.subscriptions["s1"].positions["v2"].lsn == 5
    assert violations(h.state) == []


def test_restore_keeps_the_saved_content_and_continues_its_revisions() -> None:
    source = Harness()
    source.ok(*SEGMENTS, subscribe("s1", "v1"), grant(10_000))
    saved = snapshot_state(source.state)
    h = Harness()
    h.ok(register("n1", "10.9.9.1:7201"), register("n9", "10.9.9.9:7201"))
    result = h.ok(restore(saved))
    state = h.state
    assert state.revision == source.state.revision == result.revision
    # Everything but the nodes and the apply metadata is the saved state, byte for byte.
    for field in ("pchannels", "vchannels", "manifests", "subscriptions", "leases"):
        assert getattr(state, field) == getattr(source.state, field), field
    assert state.next_vchannel_id == source.state.next_vchannel_id
    # n1 is registered here (new address, UP); n2 and n3 only in the saved state: DOWN.
    assert state.nodes["n1"].address == "10.9.9.1:7201"
    assert state.nodes["n1"].state == pb.NODE_STATE_UP
    assert state.nodes["n9"].state == pb.NODE_STATE_UP
    assert {n: state.nodes[n].state for n in ("n2", "n3")} == {
        "n2": pb.NODE_STATE_DOWN,
        "n3": pb.NODE_STATE_DOWN,
    }
    # ... and with no address: the saved ones are the source cluster's, which may still
    # run (a new owner here would fence its replicas and adopt their logs).
    assert all(source.state.nodes[n].address for n in ("n2", "n3"))
    for n in ("n2", "n3"):
        assert state.nodes[n].address == state.nodes[n].raft_address == ""
        assert list(state.nodes[n].worker_addresses) == []
    # The next revision (a lease id, a fencing token) is above every saved one.
    lease = h.ok(grant(10_000))
    assert lease.lease_id == source.state.revision + 1
    # A second restore is refused: the cluster is no longer fresh.
    h.reject(restore(saved), E.ALREADY_EXISTS)


def test_replica_set_changes_one_at_a_time_each_waiting_for_a_ready_term() -> None:
    """The last ready set is recorded (`stable_replica_node_ids`); while a change to the
    set is not ready, the set cannot change again (a new owner's recovery consults only
    the last ready set and the current one), but the pchannel can still move within it."""
    h = Harness()
    h.ok(*PCHANNEL, assign("p1", 1, "n1", ["n1", "n2"]))
    channel = h.state.pchannels["p1"]
    # Before any ready term, nothing was acknowledged: any set is allowed.
    h.ok(assign("p1", 2, "n1", ["n1", "n3"]))
    assert list(channel.stable_replica_node_ids) == []
    h.ok(ready("p1", 2, "n1", 1))
    assert list(channel.stable_replica_node_ids) == ["n1", "n3"]
    h.ok(assign("p1", 3, "n1", ["n1", "n2"]))
    assert list(channel.stable_replica_node_ids) == ["n1", "n3"]
    rejected = h.reject(assign("p1", 4, "n1", ["n1", "n2", "n3"]), INVALID)
    assert "while the change from n1,n3 is not ready" in rejected.rejection.message
    # Moving within the pending set is allowed, going back to the stable set is not
    # (owners of the unready terms with the pending set may still be recovering).
    h.ok(assign("p1", 4, "n2", ["n2", "n1"]))
    h.reject(assign("p1", 5, "n3", ["n3", "n1"]), INVALID)
    assert list(channel.stable_replica_node_ids) == ["n1", "n3"]
    h.ok(assign("p1", 5, "n1", ["n1", "n2"]), ready("p1", 5, "n1", 50))
    assert list(channel.stable_replica_node_ids) == ["n1", "n2"]
    h.ok(assign("p1", 6, "n1", ["n1", "n2", "n3"]))


def test_retention_keeps_what_a_replication_target_has_not_applied() -> None:
    harness = Harness()
    harness.ok(*SEGMENTS, replicate(("east", "west")))
    # West reported nothing: nothing of p1 may go.
    assert not list(harness.apply(delete_before("p1", 31)).events)
    harness.ok(record("p1", "west", 15))
    deleted = harness.apply(delete_before("p1", 31)).events
    assert [list(e.segments_deleted.segment_ids) for e in deleted] == [[1]]
    harness.ok(record("p1", "west", 30))
    deleted = harness.apply(delete_before("p1", 31)).events
    assert [list(e.segments_deleted.segment_ids) for e in deleted] == [[11, 21]]


def test_a_target_dropped_from_the_configuration_holds_nothing() -> None:
    harness = Harness()
    harness.ok(*SEGMENTS, replicate(("east", "west")), record("p1", "west", 5))
    assert harness.state.replicate_checkpoints["p1"].source_lsns["west"] == 5
    harness.ok(replicate())  # the same clusters, no edge
    assert "p1" not in harness.state.replicate_checkpoints
    deleted = harness.apply(delete_before("p1", 31)).events
    assert [list(e.segments_deleted.segment_ids) for e in deleted] == [[1, 11, 21]]
