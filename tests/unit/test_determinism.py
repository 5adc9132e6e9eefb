"""Determinism: the same commands give byte-identical events and states everywhere.

Every replica applies the same command bytes and must compute the same events, byte for
byte, and the same state; a replica restored from a snapshot must continue exactly like
one that never snapshotted; and the events alone must fold into the same domain state
(they are the durable history). Command sequences come from ``random.Random(seed)``; the
seed is in every assertion message so that a failure replays.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import EXCLUSIVE, NOW, SHARED, Harness, domain_bytes, kinds

from rpc.protos import coordination_pb2 as pb
from statemachine import (
    STATE_FORMAT_VERSION,
    apply_command,
    apply_events,
    new_state,
    restore_state,
    snapshot_state,
    state_digest,
)
from tests.timing import scaled

SEEDS = [1, 7, 42, 20_240_607]
COUNT = 400
NODES = ["n1", "n2", "n3"]
PCHANNELS = ["p1", "p2", "q_0"]
VCHANNELS = ["v1", "v2", "v3"]
KEYS = ["k1", "k2", "db/c:1"]


def _random_body(rng: random.Random, state: pb.CoordinationState) -> dict[str, object]:
    """One command body drawn from small pools, with ids taken from `state`."""
    pchannel = rng.choice(PCHANNELS)
    channel = state.pchannels.get(pchannel)
    term = channel.term if channel is not None else 0
    manifest = state.manifests.get(pchannel)
    through = manifest.committed_through_lsn if manifest is not None else 0
    leases = sorted(state.leases) or [1]
    broadcasts = sorted(state.broadcasts) or [1]
    vchannel = rng.choice(VCHANNELS)
    node = rng.choice(NODES)
    choices: list[Callable[[], dict[str, object]]] = [
        lambda: {"register_node": pb.RegisterNode(node_id=node, address=f"h:{rng.randint(1, 2)}")},
        lambda: {"mark_node_down": pb.MarkNodeDown(node_id=node)},
        lambda: {"mark_node_up": pb.MarkNodeUp(node_id=node)},
        lambda: {"freeze_node": pb.FreezeNode(node_id=node)},
        lambda: {"unfreeze_node": pb.UnfreezeNode(node_id=node)},
        lambda: {"create_pchannels": pb.CreatePChannels(names=[pchannel])},
        lambda: {"create_pchannels": pb.CreatePChannels(prefix="q", count=rng.randint(1, 2))},
        lambda: {
            "assign_pchannel": pb.AssignPChannel(
                pchannel=pchannel,
                term=term + rng.choice([1, 1, 0]),
                node_id=node,
                replica_node_ids=rng.sample(NODES, rng.randint(0, 2)),
            )
        },
        lambda: {
            "pchannel_ready": pb.PChannelReady(
                pchannel=pchannel,
                term=term,
                node_id=channel.owner_node_id if channel is not None else node,
                start_lsn=through + 1,
            )
        },
        lambda: {
            "mark_pchannel_unavailable": pb.MarkPChannelUnavailable(pchannel=pchannel, term=term)
        },
        lambda: {"drop_pchannel": pb.DropPChannel(pchannel=pchannel)},
        lambda: {"create_vchannel": pb.CreateVChannel(name=vchannel, pchannel=pchannel)},
        lambda: {"drop_vchannel": pb.DropVChannel(name=vchannel)},
        lambda: {
            "commit_segment": pb.CommitSegment(
                pchannel=pchannel,
                term=term,
                first_lsn=through + 1,
                last_lsn=through + 3,
                first_term=1,
                last_term=max(term, 1),
                count=3,
                bytes=rng.randint(0, 1000),
                digest=rng.getrandbits(32),
                replica_node_ids=[node],
            )
        },
        lambda: {
            "delete_segments_before": pb.DeleteSegmentsBefore(
                pchannel=pchannel, before_lsn=max(1, through + 1 - rng.randint(0, 4))
            )
        },
        lambda: {
            "create_broadcast": pb.CreateBroadcast(
                message=rng.randbytes(rng.randint(0, 16)),
                msg_type="Ddl",
                vchannels=rng.sample(VCHANNELS, rng.randint(1, 2)),
                resource_keys=[
                    pb.ResourceKey(key=key, mode=rng.choice([EXCLUSIVE, SHARED]))
                    for key in rng.sample(KEYS, rng.randint(0, 2))
                ],
                idempotency_key=rng.choice(["", "", "i1", "i2"]),
            )
        },
        lambda: {
            "record_broadcast_appended": pb.RecordBroadcastAppended(
                broadcast_id=rng.choice(broadcasts), vchannel=vchannel, lsn=rng.randint(1, 9)
            )
        },
        lambda: {
            "ack_broadcast": pb.AckBroadcast(
                broadcast_id=rng.choice(broadcasts), vchannel=vchannel, checkpoint=1
            )
        },
        lambda: {"clear_broadcasts": pb.ClearBroadcasts(retention_ms=rng.choice([0, 5_000]))},
        lambda: {"grant_lease": pb.GrantLease(ttl_ms=rng.choice([1, 2_000, 60_000]), holder="h")},
        lambda: {"keep_alive_lease": pb.KeepAliveLease(lease_id=rng.choice(leases))},
        lambda: {"revoke_lease": pb.RevokeLease(lease_id=rng.choice(leases))},
        lambda: {"expire_leases": pb.ExpireLeases()},
        lambda: {"extend_leases": pb.ExtendLeases()},
        lambda: {
            "lock": pb.Lock(
                key=rng.choice(KEYS),
                mode=rng.choice([EXCLUSIVE, SHARED]),
                lease_id=rng.choice(leases),
            )
        },
        lambda: {"unlock": pb.Unlock(key=rng.choice(KEYS), lease_id=rng.choice(leases))},
        lambda: {
            "commit_consumer_position": pb.CommitConsumerPosition(
                group=rng.choice(["g1", "g2"]), vchannel=vchannel, lsn=rng.randint(0, 30)
            )
        },
        lambda: {"bump_consumer_fence": pb.BumpConsumerFence(group="g1", vchannel=vchannel)},
        lambda: {
            "set_balance_policy": pb.SetBalancePolicy(
                allow_rebalance=rng.random() < 0.5, max_moves_per_round=rng.randint(0, 4)
            )
        },
        lambda: {"barrier": pb.Barrier()},
        lambda: {"remove_node": pb.RemoveNode(node_id=node)},
        lambda: {
            "register_node": pb.RegisterNode(
                node_id=node, address="h:1", joined_incarnation_ms=10**15
            )
        },
    ]
    return rng.choices(choices, weights=WEIGHTS)[0]()


# Per builder above, in order: fewer drops and node failures, more of the deep flows.
WEIGHTS = [1, 0.5, 1, 0.5, 0.5, 0.5, 0.5, 2, 3, 0.5, 0.2, 1.5, 0.5, 4, 1.5, 3, 2, 3, 1]
WEIGHTS += [2, 1, 1, 1, 1, 3, 1.5, 1.5, 1, 0.5, 0.5]
# A node removed (RemoveNode), and one started with --join registering again.
WEIGHTS += [0.2, 0.3]
PREAMBLE = [{"register_node": pb.RegisterNode(node_id=node, address="h:1")} for node in NODES] + [
    {"create_pchannels": pb.CreatePChannels(names=["p1", "p2"])},
    {"assign_pchannel": pb.AssignPChannel(pchannel="p1", term=1, node_id="n1")},
    {"pchannel_ready": pb.PChannelReady(pchannel="p1", term=1, node_id="n1", start_lsn=1)},
    {"create_vchannel": pb.CreateVChannel(name="v1", pchannel="p1")},
    {"create_vchannel": pb.CreateVChannel(name="v2", pchannel="p1")},
]


def generate(seed: int, count: int = COUNT) -> list[bytes]:
    """`count` command byte strings from `seed` (ids are picked from a scratch replica)."""
    rng = random.Random(seed)
    scratch = Harness()
    clock = NOW
    commands: list[bytes] = []
    for step in range(count):
        clock += rng.choice([0, 0, 1, 500, 5_000, -1_000])
        if step < len(PREAMBLE):
            data = pb.Command(proposed_at_ms=clock, **PREAMBLE[step]).SerializeToString()
        elif rng.random() < 0.02:
            # Garbage (0xff is an invalid wire type): rejected identically everywhere.
            data = b"\xff" + rng.randbytes(rng.randint(0, 12))
        else:
            command = pb.Command(proposed_at_ms=clock, **_random_body(rng, scratch.state))
            if rng.random() < 0.1:
                command.request_id = f"r{rng.randrange(10)}"
            data = command.SerializeToString()
        scratch.apply_bytes(data)
        commands.append(data)
    return commands


def run(
    commands: list[bytes], state: pb.CoordinationState | None = None, first_index: int = 1
) -> tuple[pb.CoordinationState, list[bytes]]:
    """Apply `commands` from Raft index `first_index`; return the state and result bytes."""
    state = new_state() if state is None else state
    results = []
    for offset, data in enumerate(commands):
        result = apply_command(state, data, first_index + offset)
        results.append(result.SerializeToString(deterministic=True))
    return state, results


def events_of(results: list[bytes]) -> list[pb.Event]:
    return [e for data in results for e in pb.CommandResult.FromString(data).events]


@pytest.fixture(scope="module", params=SEEDS, ids=lambda seed: f"seed={seed}")
def history(
    request: pytest.FixtureRequest,
) -> tuple[int, list[bytes], pb.CoordinationState, list[bytes]]:
    seed = request.param
    commands = generate(seed)
    state, results = run(commands)
    return seed, commands, state, results


def test_generated_histories_are_not_trivial(history) -> None:
    seed, _, state, results = history
    events = events_of(results)
    assert len(events) > COUNT // 4, f"seed {seed}: only {len(events)} events"
    assert len(set(kinds(events))) >= 25, f"seed {seed}: kinds {sorted(set(kinds(events)))}"
    assert state.revision == len(events)


def test_three_replicas_compute_identical_events_and_states(history) -> None:
    seed, commands, state, results = history
    for replica in range(2):
        other_state, other_results = run(commands)
        for index, (mine, theirs) in enumerate(zip(results, other_results, strict=True)):
            assert mine == theirs, f"seed {seed}: replica {replica + 2} differs at command {index}"
        assert [e.SerializeToString(deterministic=True) for e in events_of(other_results)] == [
            e.SerializeToString(deterministic=True) for e in events_of(results)
        ], f"seed {seed}"
        assert state_digest(other_state) == state_digest(state), f"seed {seed}"
        assert snapshot_state(other_state) == snapshot_state(state), f"seed {seed}"


def test_snapshot_and_restore_continue_identically(history) -> None:
    seed, commands, state, results = history
    for cut in sorted({0, 1, 17, len(commands) // 3, len(commands) // 2, len(commands) - 1}):
        before, _ = run(commands[:cut])
        snapshot = snapshot_state(before)
        restored = restore_state(snapshot)
        assert state_digest(restored) == state_digest(before), f"seed {seed} cut {cut}"
        # Restoring twice from the same bytes is harmless.
        assert snapshot_state(restore_state(snapshot)) == snapshot, f"seed {seed} cut {cut}"
        continued, rest = run(commands[cut:], restored, first_index=cut + 1)
        assert rest == results[cut:], f"seed {seed}: results differ after a snapshot at {cut}"
        assert state_digest(continued) == state_digest(state), f"seed {seed} cut {cut}"


def test_events_alone_fold_into_the_same_domain_state(history) -> None:
    seed, _, state, results = history
    folded = apply_events(new_state(), events_of(results))
    assert folded.revision == state.revision, f"seed {seed}"
    assert domain_bytes(folded) == domain_bytes(state), f"seed {seed}"
    # The apply metadata really was there to clear (the comparison is not vacuous).
    assert state.last_raft_index == COUNT and state.last_time_ms > 0, f"seed {seed}"


def test_folding_events_one_by_one_matches_every_intermediate_state() -> None:
    seed = 99
    commands = generate(seed, 150)
    replica = new_state()
    folded = new_state()
    for index, data in enumerate(commands, start=1):
        result = apply_command(replica, data, index)
        apply_events(folded, result.events)
        assert domain_bytes(folded) == domain_bytes(replica), f"seed {seed} command {index}"


_CHILD = """
import hashlib, sys
from test_determinism import generate, run
state, results = run(generate(int(sys.argv[1])))
print(hashlib.sha256(b"".join(results)).hexdigest(), hashlib.sha256(
    state.SerializeToString(deterministic=True)).hexdigest())
"""


def test_replicas_in_other_processes_agree_whatever_the_hash_seed() -> None:
    """Python's str hashing is randomized per process: set/dict order must not leak in."""
    seed = SEEDS[1]
    state, results = run(generate(seed))
    expected = (
        f"{hashlib.sha256(b''.join(results)).hexdigest()} "
        f"{hashlib.sha256(snapshot_state(state)).hexdigest()}"
    )
    root = Path(__file__).resolve().parents[2]
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        env["PYTHONPATH"] = os.pathsep.join([str(root / "tests" / "unit"), str(root)])
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(seed)],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=scaled(120),
            check=False,
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == expected, f"seed {seed} PYTHONHASHSEED={hash_seed}"


@pytest.mark.parametrize("version", [0, STATE_FORMAT_VERSION + 1, 99, -1])
def test_restore_rejects_an_unknown_format_version(version: int) -> None:
    state = new_state()
    state.format_version = version
    with pytest.raises(ValueError, match=f"unsupported coordination snapshot format {version}"):
        restore_state(state.SerializeToString(deterministic=True))


def test_snapshot_of_a_fresh_state_round_trips() -> None:
    state = new_state()
    assert state.format_version == STATE_FORMAT_VERSION
    assert restore_state(snapshot_state(state)) == state
