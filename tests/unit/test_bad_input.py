"""Bad input: whatever bytes reach apply_command, it answers a rejection and never raises.

Each case runs against a populated state (nodes, pchannels, vchannels, a lease holding a
lock, a pending broadcast) so that a bad field is judged where a good one would have
changed something. The code is INVALID_ARGUMENT unless the command's contract names a more
specific one, the message is non-empty, and the state is unchanged except for the apply
metadata (Raft index, clock, request-id window).
"""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from helpers import (
    EXCLUSIVE,
    NOW,
    VCHANNELS,
    E,
    Harness,
    Step,
    broadcast,
    cmd,
    code_name,
    create_pchannels,
    domain_bytes,
    grant,
    register,
    vchannel,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpc.protos import coordination_pb2 as pb
from statemachine import Limits
from statemachine.invariants import violations
from statemachine.validation import check_name

INVALID = E.INVALID_ARGUMENT
BAD_NAMES = {
    "empty": "",
    "too-long": "n" * 129,
    "space": "a b",
    "slash": "a/b",
    "unicode": "nœud",
    "nul": "a\x00b",
    "newline": "a\n",
    "tab": "\tx",
    "colon": "a:b",
}
BAD_KEYS = {
    "empty": "",
    "too-long": "k" * 257,
    "space": "a key",
    "unicode": "clé",
    "nul": "k\x00",
    "backslash": "a\\b",
}


def _lease_step(body: str, **fields: object) -> Step:
    """A lease command on the populated state's lease (its id is a revision)."""

    def build(h: Harness) -> pb.Command:
        message = getattr(pb, body)(lease_id=h.lease(), **fields)
        return pb.Command(proposed_at_ms=NOW, **{_FIELD[body]: message})

    return build


_FIELD = {"Lock": "lock", "Unlock": "unlock", "KeepAliveLease": "keep_alive_lease"}


def _case(name: str, step: Step | bytes, code: int = INVALID, contains: str = "") -> object:
    return pytest.param(step, code, contains, id=name)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _field(number, 2, _varint(len(payload)) + payload)


TIME = _field(2, 0, _varint(NOW))  # Command.proposed_at_ms
# A RegisterNode whose node_id is not UTF-8 (proto3 strings must be).
BAD_UTF8_REGISTER = _length_delimited(10, _length_delimited(1, b"\xff\xfe"))

# fmt: off
CASES = [
    *[
        _case(f"register/node_id-{label}", register(value, "h:1"), contains="node_id")
        for label, value in BAD_NAMES.items()
        if label != "colon"
    ],
    _case("register/node_id-colon", register("a:b", "h:1"), contains="'a:b'"),
    _case("register/address-too-long", register("n9", "h" * 251 + ":12345"), contains="address"),
    _case("register/address-space", register("n9", "h ost:1"), contains="address"),
    _case("register/address-unicode", register("n9", "hôte:1"), contains="address"),
    *[
        _case(f"create_pchannels/name-{label}", create_pchannels(value), contains="pchannel name")
        for label, value in BAD_NAMES.items()
    ],
    _case("create_pchannels/prefix-slash", create_pchannels(prefix="a/b", count=1)),
    _case("create_pchannels/owner-too-long",
          create_pchannels("z", owner=pb.OwnerDescription(text="t" * 257)), contains="owner.text"),
    *[
        _case(f"create_vchannel/name-{label}", vchannel(value), contains="vchannel name")
        for label, value in BAD_NAMES.items()
    ],
    _case("assign/access-mode-9",
          cmd(assign_pchannel=pb.AssignPChannel(pchannel="p2", term=1, node_id="n1",
                                                access_mode=9)),
          contains="access_mode (9"),
    _case("assign/pchannel-too-long",
          cmd(assign_pchannel=pb.AssignPChannel(pchannel="p" * 129, term=1, node_id="n1")),
          contains="129 chars"),
    _case("grant/ttl-zero", grant(0), contains="ttl_ms (0; expected 1..3600000)"),
    _case("grant/ttl-negative", grant(-1), contains="ttl_ms (-1"),
    _case("grant/ttl-int64-min", grant(-(2**63)), contains="ttl_ms"),
    _case("grant/ttl-huge", grant(2**62), contains="ttl_ms"),
    _case("grant/ttl-int64-max", grant(2**63 - 1), contains="ttl_ms"),
    _case("grant/holder-too-long", grant(holder="h" * 257), contains="holder"),
    _case("grant/holder-control-char", grant(holder="a\x1bb"), contains="holder"),
    _case("lock/mode-7", _lease_step("Lock", key="k2", mode=7), contains="mode (7"),
    _case("lock/mode-negative", _lease_step("Lock", key="k2", mode=-1), contains="mode (-1"),
    *[
        _case(f"lock/key-{label}", _lease_step("Lock", key=value, mode=EXCLUSIVE),
              contains="key")
        for label, value in BAD_KEYS.items()
    ],
    _case("unlock/key-space", _lease_step("Unlock", key="k 1"), contains="key"),
    _case("lock/lease-negative",
          cmd(lock=pb.Lock(key="k2", mode=EXCLUSIVE, lease_id=-7)), contains="lease_id (-7"),
    _case("keep_alive/lease-negative", cmd(keep_alive_lease=pb.KeepAliveLease(lease_id=-1))),
    _case("broadcast/key-mode-7", broadcast("v1", keys=[("x", 7)]), contains="mode (7"),
    _case("broadcast/key-bad", broadcast("v1", keys=[("a b", EXCLUSIVE)]), contains="resource key"),
    _case("broadcast/vchannel-bad", broadcast("v 1"), contains="vchannel"),
    _case("broadcast/message-too-large",
          broadcast("v1", message=b"x" * (Limits().broadcast_message_max_bytes + 1)),
          contains=f"({Limits().broadcast_message_max_bytes + 1} bytes; expected at most"),
    _case("broadcast/too-many-keys",
          broadcast("v1", keys=[(f"k{i}", EXCLUSIVE) for i in range(65)]),
          contains="number of resource keys (65"),
    _case("position/group-unicode",
          cmd(commit_consumer_position=pb.CommitConsumerPosition(group="grüppe", vchannel="v1")),
          contains="group"),
    _case("bump/vchannel-empty",
          cmd(bump_consumer_fence=pb.BumpConsumerFence(group="g", vchannel="")),
          contains="vchannel"),
    _case("segment/lsn-negative",
          cmd(commit_segment=pb.CommitSegment(pchannel="p1", term=1, first_lsn=-5, last_lsn=-1))),
    _case("delete/before-negative",
          cmd(delete_segments_before=pb.DeleteSegmentsBefore(pchannel="p1", before_lsn=-(2**63)))),
    _case("policy/moves-int32-min",
          cmd(set_balance_policy=pb.SetBalancePolicy(max_moves_per_round=-(2**31)))),
    _case("clear/retention-int64-max",
          cmd(clear_broadcasts=pb.ClearBroadcasts(retention_ms=2**63 - 1))),
    # Apply-level input.
    _case("command/no-body", cmd(), contains="no body"),
    _case("command/no-time", pb.Command(barrier=pb.Barrier()), contains="proposed_at_ms"),
    _case("command/negative-time", cmd(barrier=pb.Barrier(), at=-(2**63)),
          contains="proposed_at_ms"),
    _case("command/request-id-too-long", cmd(request_id="r" * 10_000, barrier=pb.Barrier()),
          contains="request_id too long"),
    # Hand-crafted bytes.
    _case("bytes/empty", b"", contains="proposed_at_ms"),
    _case("bytes/garbage", b"\xff\xff\xff\xff\xff", contains="undecodable"),
    _case("bytes/truncated-varint", b"\x10\xff", contains="undecodable"),
    _case("bytes/truncated-length", _field(10, 2, _varint(50)) + b"abc", contains="undecodable"),
    _case("bytes/end-group-without-start", _field(5, 4, b""), contains="undecodable"),
    _case("bytes/bad-utf8-string", TIME + BAD_UTF8_REGISTER, contains="undecodable"),
    _case("bytes/unknown-oneof-field", TIME + _length_delimited(99, b""), contains="no body"),
    _case("bytes/unknown-oneof-varint", TIME + _field(1000, 0, _varint(1)), contains="no body"),
    _case("bytes/unknown-field-huge-number", TIME + _length_delimited(2**29 - 1, b"\x08\x01"),
          contains="no body"),
    _case("bytes/known-field-wrong-wire-type", TIME + _field(10, 0, _varint(1))),
]

# fmt: on


def populated() -> Harness:
    h = Harness()
    h.ok(
        *VCHANNELS,
        grant(60_000),
        lambda h: cmd(lock=pb.Lock(key="k1", mode=EXCLUSIVE, lease_id=h.lease())),
        broadcast("v1", "v2", keys=[("b1", EXCLUSIVE)], idempotency_key="i1"),
        cmd(request_id="seen", barrier=pb.Barrier()),
    )
    return h


@pytest.mark.parametrize(("step", "code", "contains"), CASES)
def test_bad_input_is_rejected_without_changing_state(
    step: Step | bytes, code: int, contains: str
) -> None:
    h = populated()
    before = domain_bytes(h.state)
    revision = h.state.revision
    if isinstance(step, bytes):
        result = h.apply_bytes(step)
    else:
        result = h.apply(step)
    assert result.rejection.code == code, (
        f"expected {code_name(code)}, got {code_name(result.rejection.code)} "
        f"{result.rejection.message!r}"
    )
    assert result.rejection.message
    assert contains in result.rejection.message, result.rejection.message
    assert list(result.events) == []
    assert result.revision == h.state.revision == revision
    assert domain_bytes(h.state) == before
    assert h.state.last_raft_index == h.raft_index


def test_unknown_fields_next_to_a_known_command_are_ignored() -> None:
    """Forward compatibility: a newer proposer's extra field does not change the decision."""
    h = Harness()
    data = register("n1", "h:1").SerializeToString() + _length_delimited(99, b"future")
    result = h.apply_bytes(data)
    assert result.rejection.code == E.OK
    assert list(h.state.nodes) == ["n1"]


def test_broadcast_message_at_the_limit_is_accepted() -> None:
    h = Harness(Limits(broadcast_message_max_bytes=16))
    h.ok(*VCHANNELS)
    h.ok(broadcast("v1", message=b"m" * 16))
    h.reject(broadcast("v2", message=b"m" * 17), INVALID)


def test_name_at_the_limit_is_accepted() -> None:
    h = Harness()
    h.ok(register("n" * 128, "h:1"), create_pchannels("p" * 128, "A-z_0.9"))
    h.reject(register("n" * 129, "h:1"), INVALID)


# Valid commands whose bytes get mutated below (the mutations must never crash apply).
SEEDS = [
    register("n1", "h:1"),
    create_pchannels("p1", "p2", replica_count=2),
    cmd(assign_pchannel=pb.AssignPChannel(pchannel="p2", term=1, node_id="n1")),
    broadcast("v1", "v2", keys=[("b2", 2)], idempotency_key="i2"),
    cmd(
        commit_segment=pb.CommitSegment(
            pchannel="p1",
            term=1,
            first_lsn=1,
            last_lsn=2,
            count=2,
            first_term=1,
            last_term=1,
            replica_node_ids=["n1"],
        )
    ),
    cmd(lock=pb.Lock(key="k2", mode=1, lease_id=22)),
    cmd(commit_consumer_position=pb.CommitConsumerPosition(group="g", vchannel="v1", lsn=3)),
    cmd(request_id="seen", barrier=pb.Barrier()),
]
SEED_BYTES = [c.SerializeToString() for c in SEEDS]
# Known bug (see test_huge_proposer_time_does_not_crash_apply): a proposer time near the
# int64 maximum overflows lease deadlines. The fuzzers stay below it so that they keep
# checking everything else.
SANE_TIME_MS = 2**62


def _apply_fuzzed(data: bytes) -> None:
    h = FUZZ_BASE.clone()
    before = h.state.SerializeToString(deterministic=True)
    previous = pb.CoordinationState.FromString(before)
    try:
        decoded: pb.Command | None = pb.Command.FromString(data)
    except DecodeError:
        decoded = None
    if decoded is not None and decoded.proposed_at_ms >= SANE_TIME_MS:
        return
    result = h.apply_bytes(data)
    events = list(result.events)
    assert violations(h.state, previous, events) == []
    if result.rejection.code != E.OK:
        assert result.rejection.message
        assert events == []
        assert domain_bytes(h.state) == domain_bytes(previous)


class _Base:
    """A populated harness that is cheap to clone (fuzzers run thousands of cases)."""

    def __init__(self) -> None:
        self.harness = populated()
        self.snapshot = self.harness.state.SerializeToString(deterministic=True)

    def clone(self) -> Harness:
        h = Harness()
        h.state = pb.CoordinationState.FromString(self.snapshot)
        h.raft_index = self.harness.raft_index
        h.results = list(self.harness.results)
        return h


FUZZ_BASE = _Base()
FUZZ_SETTINGS = settings(
    max_examples=1_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@FUZZ_SETTINGS
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_apply(data: bytes) -> None:
    _apply_fuzzed(data)


@FUZZ_SETTINGS
@given(
    seed=st.sampled_from(SEED_BYTES),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
    extra=st.binary(max_size=8),
)
def test_mutated_commands_never_crash_apply(
    seed: bytes, flips: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    data = bytearray(seed)
    for position, value in flips:
        data[position % len(data)] = value
    data = data[: max(1, cut % (len(data) + 1))] + extra
    _apply_fuzzed(bytes(data))


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(grant(1, at=2**63 - 1), id="grant"),
        pytest.param(cmd(barrier=pb.Barrier(), at=2**63 - 1), id="clock-poisoned-then-grant"),
    ],
)
def test_huge_proposer_time_does_not_crash_apply(command: pb.Command) -> None:
    h = Harness()
    first = h.apply(command)
    # A clock that high also makes every later lease command overflow: whatever the fix
    # (rejecting such a time, or bounding deadlines), apply must answer, not raise.
    later = h.apply(grant(1_000))
    for result in (first, later):
        assert result.rejection.code in (E.OK, E.INVALID_ARGUMENT)


@pytest.mark.parametrize(
    "name", [".", "..", ".hidden", "-x", "_x", "a/b", "../etc", "a\\b", "a b", "\u00e9t\u00e9"]
)
def test_names_that_could_become_paths_are_refused(name: str) -> None:
    # A pchannel's name is its WAL directory's name: one plain path component only.
    rejection = check_name("pchannel", name, Limits())
    assert rejection is not None, name
    assert rejection.code == INVALID
    assert "a letter or digit, then letters, digits" in rejection.message


@pytest.mark.parametrize("name", ["a", "wal_0", "A.b-c_d", "0", "x" * 128])
def test_plain_names_are_accepted(name: str) -> None:
    assert check_name("pchannel", name, Limits()) is None
