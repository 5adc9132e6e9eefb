"""WAL retention policy (`statemachine.retention`) and the exact floors the decider keeps.

The policy is a pure function of the state and the proposer's clock: segments go by age
(their newest entry's time tick) or by the pchannel's committed bytes, oldest first, and
never past what a holding subscription, a consumer group or an unacknowledged broadcast
still needs. Only plans that delete something are proposed.
"""

from __future__ import annotations

from helpers import VCHANNELS, E, Harness, cmd, segment
from test_commands import delete_before, sub_commit, sub_seek, subscribe

from rpc.protos import coordination_pb2 as pb
from statemachine.retention import RetentionPolicy, plan_retention

BITS = 18
MINUTE_MS = 60_000


def _segment_at(first: int, last: int, wall_ms: int, size: int = 1000) -> pb.Command:
    """A committed segment whose newest entry was written at `wall_ms`."""
    return segment(
        first,
        last,
        first_time_tick=(wall_ms - 1) << BITS,
        last_time_tick=wall_ms << BITS,
        bytes=size,
    )


def _harness(*steps: object) -> Harness:
    h = Harness()
    h.ok(*VCHANNELS)
    h.ok(
        _segment_at(1, 10, 1 * MINUTE_MS),
        _segment_at(11, 20, 2 * MINUTE_MS),
        _segment_at(21, 30, 3 * MINUTE_MS),
        *steps,
    )
    return h


def _policy(retention_ms: int = 0, retention_bytes: int = 0) -> RetentionPolicy:
    return RetentionPolicy(retention_ms, retention_bytes, BITS)


def _plan(h: Harness, now_ms: int, policy: RetentionPolicy) -> list[tuple[str, int]]:
    return [(c.pchannel, c.before_lsn) for c in plan_retention(h.state, now_ms, policy)]


def test_age_deletes_segments_whose_newest_entry_is_older_than_the_limit() -> None:
    h = _harness()
    # At 3.5 min with a 1-minute limit: the segments ending at 1 and 2 min are due.
    assert _plan(h, 3 * MINUTE_MS + 30_000, _policy(retention_ms=MINUTE_MS)) == [("p1", 21)]
    assert _plan(h, 1 * MINUTE_MS + 59_999, _policy(retention_ms=MINUTE_MS)) == []
    assert _plan(h, 10 * MINUTE_MS, _policy(retention_ms=0)) == []


def test_bytes_delete_oldest_first_down_to_the_limit() -> None:
    h = _harness()
    assert _plan(h, 0, _policy(retention_bytes=3000)) == []
    assert _plan(h, 0, _policy(retention_bytes=2999)) == [("p1", 11)]
    assert _plan(h, 0, _policy(retention_bytes=1000)) == [("p1", 21)]
    # Both limits: the one that deletes more wins.
    assert _plan(h, 2 * MINUTE_MS, _policy(MINUTE_MS, 2500)) == [("p1", 11)]
    assert _plan(h, 4 * MINUTE_MS, _policy(MINUTE_MS, 2500)) == [("p1", 31)]


def test_a_plan_is_made_only_when_it_deletes_something() -> None:
    # A subscription from the earliest entry that never committed holds everything.
    h = _harness(subscribe("s1", "v1"))
    assert _plan(h, 10 * MINUTE_MS, _policy(retention_ms=MINUTE_MS)) == []
    h.ok(sub_commit("s1", "v1", 12))
    assert _plan(h, 10 * MINUTE_MS, _policy(retention_ms=MINUTE_MS)) == [("p1", 31)]
    result = h.ok(cmd(delete_segments_before=pb.DeleteSegmentsBefore(pchannel="p1", before_lsn=31)))
    deleted = result.events[0].segments_deleted
    # Cut at the subscription's position: [11, 20] is still needed.
    assert (list(deleted.segment_ids), deleted.deleted_before_lsn) == ([1], 11)
    # A dropped pchannel is never planned.
    h.ok(sub_commit("s1", "v1", 30))
    for name in ("v1", "v2"):
        h.ok(cmd(drop_vchannel=pb.DropVChannel(name=name)))
    h.ok(cmd(drop_pchannel=pb.DropPChannel(pchannel="p1")))
    assert _plan(h, 10 * MINUTE_MS, _policy(retention_ms=MINUTE_MS)) == []


def test_a_time_tick_seek_holds_from_the_segment_holding_that_tick() -> None:
    h = _harness(
        subscribe("s1", "v1"), sub_seek("s1", "v1", from_time_tick=(2 * MINUTE_MS) << BITS)
    )
    h.ok(delete_before("p1", 31))
    assert h.state.manifests["p1"].deleted_before_lsn == 11


def test_the_floor_never_moves_backwards_and_answers_compacted_below_it() -> None:
    h = _harness(subscribe("s1", "v1", no_retention_hold=True))
    h.ok(delete_before("p1", 21))
    assert h.state.manifests["p1"].deleted_before_lsn == 21
    repeat = h.ok(delete_before("p1", 11))
    assert list(repeat.events) == [] and h.state.manifests["p1"].deleted_before_lsn == 21
    rejection = h.reject(sub_seek("s1", "v1", lsn=5), E.COMPACTED)
    assert rejection.rejection.first_available == 21


def test_status_table_shows_the_floor_and_each_members_disk_use() -> None:
    from rich.console import Console

    from raftwal.cli.client import _retention_table
    from rpc.protos import coordinator_pb2 as api

    status = api.ClusterStatusResponse(
        members=[
            api.MemberStatus(
                node_id="n1",
                reachable=True,
                data_dir_bytes=5 << 20,
                wal_disk=[api.WalDiskUsage(pchannel="p1", bytes=3 << 20, first_lsn=21)],
            ),
            api.MemberStatus(node_id="n2", reachable=False),
        ],
        retention=[
            api.RetentionStatus(
                pchannel="p1",
                deleted_before_lsn=21,
                committed_segments=2,
                committed_bytes=2 << 20,
                committed_through_lsn=40,
            ),
            api.RetentionStatus(pchannel="p2"),
        ],
    )
    console = Console(width=200, record=True)
    console.print(_retention_table(status))
    text = console.export_text()
    assert "n1 5.0 MiB" in text and "n2" not in text
    p1 = next(line for line in text.splitlines() if " p1 " in line)
    assert "21" in p1 and "40" in p1 and "2.0 MiB" in p1 and "3.0 MiB (21)" in p1
    p2 = next(line for line in text.splitlines() if " p2 " in line)
    assert " - " in p2  # nothing deleted, no files on n1
