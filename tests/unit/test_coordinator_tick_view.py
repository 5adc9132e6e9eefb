"""The coordinator tick's view of the state: everything but the deduplication window."""

from __future__ import annotations

from helpers import NODES, Harness, assign, broadcast, create_pchannels, grant, segment, vchannel

from raftwal.node.coordinator import TICK_SKIPPED_FIELDS, tick_view
from rpc.protos import coordination_pb2 as pb


def _full_state() -> pb.CoordinationState:
    """A state with every field of CoordinationState set."""
    harness = Harness()
    harness.ok(
        *NODES,
        create_pchannels("p1", "p2"),
        assign("p1", 1, "n1", ["n1", "n2", "n3"]),
        vchannel("v1"),
        segment(1, 10),
        broadcast("v1", idempotency_key="drop-1"),
    )
    for number in range(40):
        harness.ok(grant(holder=f"client-{number}", owner="id:app" if number % 2 else ""))
    for number in range(10):
        command = grant(holder=f"retried-{number}")
        command.request_id = f"request-{number}"
        harness.ok(command)
    state = harness.state
    state.locks["db/1"].key = "db/1"
    state.locks["db/1"].holders.add(id=1, fencing_token=7)
    state.consumer_groups["g"].positions["v1"].lsn = 5
    state.subscriptions["s"].name = "s"
    state.subscriptions["s"].vchannels.append("v1")
    state.balance_policy.SetInParent()
    state.replicate_configuration.clusters.add(cluster_id="east")
    state.replicate_cluster_id = "east"
    state.replicate_checkpoints["p1"].source_lsns["west"] = 3
    state.removed_nodes["n9"].removed_revision = 2
    state.wal_alter.epoch = 4
    state.format_version = state.format_version or 1
    state.recent_cursor = 3
    return state


def test_tick_view_copies_everything_but_the_deduplication_window() -> None:
    state = _full_state()
    present = {field.name for field, _ in state.ListFields()}
    every = {field.name for field in pb.CoordinationState.DESCRIPTOR.fields}
    assert present == every, every - present
    assert len(state.recent_results) == 10

    view = tick_view(state)

    expected = pb.CoordinationState()
    expected.CopyFrom(state)
    for name in TICK_SKIPPED_FIELDS:
        expected.ClearField(name)
    assert view == expected
    assert not view.recent_results and not view.recent_request_ids
    # A copy, not a view: the tick may not change the applied state.
    view.nodes["n1"].address = "elsewhere:1"
    view.leases.clear()
    assert state.nodes["n1"].address != "elsewhere:1"
    assert len(state.leases) == 50
