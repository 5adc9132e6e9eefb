"""Loading a state saved before ``stable_replica_node_ids`` existed: a pchannel that went
ready then has it empty, and its first replica set change would have fenced only the new
set (whose majority need not meet the old set's, where the acknowledged entries are).
`restore_state` (snapshots) and `StateRestored` (backups) fill it in for ASSIGNED
pchannels; after that the state machine refuses a second change while the first is not
ready, as for any pchannel."""

from __future__ import annotations

from rpc.protos import coordination_pb2 as pb
from statemachine.apply import apply_command
from statemachine.state import new_state, restore_state, snapshot_state, upgrade_state


def _state_before_the_field() -> pb.CoordinationState:
    state = new_state()
    for index, command in enumerate(
        (
            *(
                pb.Command(register_node=pb.RegisterNode(node_id=n, address=f"{n}:1"))
                for n in ("n1", "n2", "n3", "n4")
            ),
            pb.Command(create_pchannels=pb.CreatePChannels(prefix="p", count=1, replica_count=3)),
            pb.Command(
                assign_pchannel=pb.AssignPChannel(
                    pchannel="p_0", term=1, node_id="n1", replica_node_ids=["n1", "n2", "n3"]
                )
            ),
            pb.Command(
                pchannel_ready=pb.PChannelReady(pchannel="p_0", term=1, node_id="n1", start_lsn=1)
            ),
        ),
        start=1,
    ):
        command.proposed_at_ms = 1_000 + index
        result = apply_command(state, command.SerializeToString(), index)
        assert result.rejection.code == 0, result.rejection
    # As an older version saved it: ready, but without the last ready set.
    del state.pchannels["p_0"].stable_replica_node_ids[:]
    return state


def test_a_snapshot_from_before_the_field_gets_the_last_ready_set() -> None:
    restored = restore_state(snapshot_state(_state_before_the_field()))
    assert list(restored.pchannels["p_0"].stable_replica_node_ids) == ["n1", "n2", "n3"]


def test_after_the_upgrade_a_second_set_change_waits_for_the_first() -> None:
    state = restore_state(snapshot_state(_state_before_the_field()))
    change = pb.Command(
        assign_pchannel=pb.AssignPChannel(
            pchannel="p_0", term=2, node_id="n1", replica_node_ids=["n1", "n2", "n4"]
        ),
        proposed_at_ms=5_000,
    )
    assert apply_command(state, change.SerializeToString(), 100).rejection.code == 0
    another = pb.Command(
        assign_pchannel=pb.AssignPChannel(
            pchannel="p_0", term=3, node_id="n1", replica_node_ids=["n1", "n3", "n4"]
        ),
        proposed_at_ms=5_001,
    )
    rejection = apply_command(state, another.SerializeToString(), 101).rejection
    assert rejection.code != 0 and "is not ready" in rejection.message


def test_the_upgrade_is_idempotent_and_leaves_a_current_state_alone() -> None:
    state = _state_before_the_field()
    upgrade_state(state)
    once = snapshot_state(state)
    upgrade_state(state)
    assert snapshot_state(state) == once
    fresh = new_state()
    before = snapshot_state(fresh)
    upgrade_state(fresh)
    assert snapshot_state(fresh) == before
