"""Shared helpers for the pure state machine tests: command builders and a small harness.

Everything goes through ``apply_command`` with serialized ``Command`` bytes, which is what
the Raft layer does on every node. ``Harness`` keeps the state, the Raft index and the
results, so table rows can refer to ids that are revisions (lease ids, broadcast ids).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from statemachine import DEFAULT_LIMITS, Limits, apply_command, copy_state, snapshot_state

E = errors_pb2
NOW = 1_700_000_000_000
EXCLUSIVE = pb.LOCK_MODE_EXCLUSIVE
SHARED = pb.LOCK_MODE_SHARED

# The apply metadata: bookkeeping of apply_command that is not a fold of events.
APPLY_METADATA_FIELDS = (
    "recent_results",
    "recent_request_ids",
    "recent_cursor",
    "last_raft_index",
    "last_time_ms",
)


def cmd(*, request_id: str = "", at: int = NOW, **body: object) -> pb.Command:
    """One command: `cmd(register_node=pb.RegisterNode(...))`, proposed at `at` (ms)."""
    return pb.Command(request_id=request_id, proposed_at_ms=at, **body)


def kinds(events: Iterable[pb.Event]) -> list[str]:
    return [event.WhichOneof("body") for event in events]


def code_name(code: int) -> str:
    return errors_pb2.ErrorCode.Name(code)


def domain_state(state: pb.CoordinationState) -> pb.CoordinationState:
    """A copy of `state` without the apply metadata (what a fold of the events gives)."""
    domain = copy_state(state)
    for field in APPLY_METADATA_FIELDS:
        domain.ClearField(field)
    return domain


def domain_bytes(state: pb.CoordinationState) -> bytes:
    return snapshot_state(domain_state(state))


# --------------------------------------------------------------------------------------
# Command shorthands (the tables read better with them)
# --------------------------------------------------------------------------------------


def register(node_id: str, address: str | None = None, **kw: object) -> pb.Command:
    if address is None:
        address = f"127.0.0.1:{7200 + (sum(map(ord, node_id)) % 100)}"
    return cmd(register_node=pb.RegisterNode(node_id=node_id, address=address), **kw)


def create_pchannels(*names: str, **fields: object) -> pb.Command:
    return cmd(create_pchannels=pb.CreatePChannels(names=list(names), **fields))


def assign(pchannel: str, term: int, node_id: str, replicas=(), **fields: object) -> pb.Command:
    body = pb.AssignPChannel(
        pchannel=pchannel, term=term, node_id=node_id, replica_node_ids=list(replicas), **fields
    )
    return cmd(assign_pchannel=body)


def ready(pchannel: str, term: int, node_id: str, start_lsn: int) -> pb.Command:
    return cmd(
        pchannel_ready=pb.PChannelReady(
            pchannel=pchannel, term=term, node_id=node_id, start_lsn=start_lsn
        )
    )


def vchannel(name: str, pchannel: str = "p1") -> pb.Command:
    return cmd(create_vchannel=pb.CreateVChannel(name=name, pchannel=pchannel))


def segment(
    first: int, last: int, term: int = 1, pchannel: str = "p1", **fields: object
) -> pb.Command:
    values: dict[str, object] = {
        "pchannel": pchannel,
        "term": term,
        "first_lsn": first,
        "last_lsn": last,
        "first_term": 1,
        "last_term": term,
        "first_time_tick": first,
        "last_time_tick": last,
        "count": last - first + 1,
        "bytes": 100 * (last - first + 1),
        "digest": first * 7 + last,
        "replica_node_ids": ["n1", "n2"],
    }
    values.update(fields)
    return cmd(commit_segment=pb.CommitSegment(**values))


def broadcast(
    *vchannels: str,
    keys: Iterable[tuple[str, int]] = (),
    message: bytes = b"ddl",
    idempotency_key: str = "",
    **fields: object,
) -> pb.Command:
    return cmd(
        create_broadcast=pb.CreateBroadcast(
            message=message,
            msg_type=fields.pop("msg_type", "DropCollection"),
            vchannels=list(vchannels),
            resource_keys=[pb.ResourceKey(key=k, mode=m) for k, m in keys],
            idempotency_key=idempotency_key,
        ),
        **fields,
    )


def grant(
    ttl_ms: int = 10_000, holder: str = "client-1", at: int = NOW, owner: str = ""
) -> pb.Command:
    return cmd(grant_lease=pb.GrantLease(ttl_ms=ttl_ms, holder=holder, owner=owner), at=at)


# --------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------

Step = pb.Command | Callable[["Harness"], pb.Command]


class Harness:
    """A state plus the Raft index: applies commands the way the Raft layer does."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        from statemachine import new_state

        self.state = new_state()
        self.limits = limits
        self.raft_index = 0
        self.results: list[pb.CommandResult] = []

    def resolve(self, step: Step) -> pb.Command:
        return step(self) if callable(step) else step

    def apply_bytes(self, data: bytes) -> pb.CommandResult:
        self.raft_index += 1
        result = apply_command(self.state, data, self.raft_index, self.limits)
        self.results.append(result)
        return result

    def apply(self, step: Step) -> pb.CommandResult:
        return self.apply_bytes(self.resolve(step).SerializeToString())

    def ok(self, *steps: Step) -> pb.CommandResult:
        """Apply each step and assert it was accepted; return the last result."""
        result = pb.CommandResult()
        for step in steps:
            command = self.resolve(step)
            result = self.apply(command)
            assert result.rejection.code == E.OK, (
                f"setup command rejected: {code_name(result.rejection.code)} "
                f"{result.rejection.message!r} for {command}"
            )
        return result

    def reject(self, step: Step, code: int) -> pb.CommandResult:
        result = self.apply(step)
        assert result.rejection.code == code, (
            f"expected {code_name(code)}, got {code_name(result.rejection.code)} "
            f"{result.rejection.message!r}"
        )
        assert result.rejection.message
        assert not result.events
        return result

    # Ids that are revisions, in the order they were handed out.
    def lease(self, index: int = -1) -> int:
        return [r.lease_id for r in self.results if r.lease_id and not r.deduplicated][index]

    def broadcast(self, index: int = -1) -> int:
        ids: list[int] = []
        for result in self.results:
            for event in result.events:
                if event.HasField("broadcast_created"):
                    ids.append(event.broadcast_created.task.id)
        return ids[index]


# Common setups, as lists of steps.
NODES: list[Step] = [register("n1"), register("n2"), register("n3")]
PCHANNEL: list[Step] = [*NODES, create_pchannels("p1", "p2")]
ASSIGNED: list[Step] = [*PCHANNEL, assign("p1", 1, "n1", ["n2"]), ready("p1", 1, "n1", 1)]
VCHANNELS: list[Step] = [*ASSIGNED, vchannel("v1"), vchannel("v2"), vchannel("v3", "p2")]
