"""The demo scenario: what the coordination state machine decides, step by step.

It drives the real pure core (``statemachine.apply_command`` with serialized commands and
the real balancer) through the life of a small cluster: nodes join, pchannels are placed,
vchannels created, a lease takes a lock with a fencing token, a broadcast holds resource
keys until every vchannel acks, a node fails and its pchannels move with a term bump, and
the old owner's late segment commit is fenced. Every event is printed with its revision.
The cluster demo (three processes on loopback) replaces this as the Raft and WAL layers
land.
"""

from __future__ import annotations

import json

from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from statemachine import apply_command, new_state, state_digest
from statemachine.balancer import plan
from statemachine.invariants import check

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the demo's scripted clock.


class _Scenario:
    def __init__(self, console: Console, json_output: bool) -> None:
        self.state = new_state()
        self.index = 0
        self.now_ms = START_MS
        self.console = console
        self.json_output = json_output

    def step(self, title: str, **body: object) -> pb.CommandResult:
        self.index += 1
        self.now_ms += 250
        command = pb.Command(proposed_at_ms=self.now_ms, **body)  # type: ignore[arg-type]
        result = apply_command(self.state, command.SerializeToString(), self.index)
        check(self.state)
        self.show(title, result)
        return result

    def show(self, title: str, result: pb.CommandResult) -> None:
        if self.json_output:
            for event in result.events:
                print(json.dumps(json_format.MessageToDict(event), sort_keys=True))
            if result.rejection.code != errors_pb2.OK:
                print(json.dumps({"rejection": json_format.MessageToDict(result.rejection)}))
            return
        if result.rejection.code != errors_pb2.OK:
            code = errors_pb2.ErrorCode.Name(result.rejection.code)
            self.console.print(
                f"[bold]{title}[/bold]  [red]rejected {code}[/red]: {result.rejection.message}"
            )
            return
        self.console.print(f"[bold]{title}[/bold]  [green]ok[/green]")
        for event in result.events:
            kind = event.WhichOneof("body")
            body = json_format.MessageToDict(getattr(event, kind))
            self.console.print(f"   rev {event.revision:>3}  {kind:<28} {body}")


def run_demo(json_output: bool = False) -> int:
    console = Console(highlight=False)
    s = _Scenario(console, json_output)
    for k in (1, 2, 3):
        s.step(
            f"node n{k} joins",
            register_node=pb.RegisterNode(node_id=f"n{k}", address=f"127.0.0.1:{7200 + k}"),
        )
    s.step(
        "create 4 pchannels",
        create_pchannels=pb.CreatePChannels(
            prefix="wal", count=4, owner=pb.OwnerDescription(role="demo", text="quickstart")
        ),
    )
    for command in plan(s.state, ["n1", "n2", "n3"]):
        s.step(f"balancer places {command.assign_pchannel.pchannel}", **_body(command))
    for name in sorted(s.state.pchannels):
        channel = s.state.pchannels[name]
        s.step(
            f"{channel.owner_node_id} finished recovery of {name}",
            pchannel_ready=pb.PChannelReady(
                pchannel=name, term=channel.term, node_id=channel.owner_node_id, start_lsn=1
            ),
        )
    for vchannel, pchannel in (("orders", "wal_0"), ("payments", "wal_1"), ("audit", "wal_2")):
        s.step(
            f"create vchannel {vchannel}",
            create_vchannel=pb.CreateVChannel(name=vchannel, pchannel=pchannel),
        )
    lease = s.step("grant a 10 s lease", grant_lease=pb.GrantLease(ttl_ms=10_000, holder="etl"))
    s.step(
        "lease locks db/orders EXCLUSIVE",
        lock=pb.Lock(key="db/orders", mode=pb.LOCK_MODE_EXCLUSIVE, lease_id=lease.lease_id),
    )
    broadcast = pb.CreateBroadcast(
        message=b"CREATE INDEX ON orders",
        msg_type="ddl",
        vchannels=["orders", "payments"],
        resource_keys=[pb.ResourceKey(key="db/orders", mode=pb.LOCK_MODE_EXCLUSIVE)],
        idempotency_key="ddl-1",
    )
    s.step("broadcast DDL while the lease holds the key", create_broadcast=broadcast)
    s.step("revoke the lease", revoke_lease=pb.RevokeLease(lease_id=lease.lease_id))
    created = s.step("broadcast DDL again", create_broadcast=broadcast)
    s.step("same idempotency key: deduplicated", create_broadcast=broadcast)
    for vchannel in ("orders", "payments"):
        s.step(
            f"consumer of {vchannel} acks the DDL",
            ack_broadcast=pb.AckBroadcast(
                broadcast_id=created.broadcast_id, vchannel=vchannel, checkpoint=1
            ),
        )
    old = s.state.pchannels["wal_1"]
    old_owner, old_term = old.owner_node_id, old.term
    s.step(f"{old_owner} stops heartbeating", mark_node_down=pb.MarkNodeDown(node_id=old_owner))
    live = [n for n in ("n1", "n2", "n3") if n != old_owner]
    for command in plan(s.state, live):
        s.step(f"balancer moves {command.assign_pchannel.pchannel}", **_body(command))
    s.step(
        f"the old owner {old_owner} tries to commit a segment of wal_1 at term {old_term}",
        commit_segment=pb.CommitSegment(
            pchannel="wal_1",
            term=old_term,
            first_lsn=1,
            last_lsn=10,
            first_term=old_term,
            last_term=old_term,
            count=10,
            bytes=1000,
            replica_node_ids=list(old.replica_node_ids),
        ),
    )
    if not json_output:
        table = Table(title=f"pchannels at revision {s.state.revision}")
        for column in ("pchannel", "term", "owner", "replicas", "state"):
            table.add_column(column)
        for name in sorted(s.state.pchannels):
            channel = s.state.pchannels[name]
            table.add_row(
                name,
                str(channel.term),
                channel.owner_node_id,
                ",".join(channel.replica_node_ids),
                pb.PChannelState.Name(channel.state).removeprefix("PCHANNEL_STATE_"),
            )
        console.print(table)
        console.print(f"state digest {state_digest(s.state)[:16]}, invariants hold")
    return 0


def _body(command: pb.Command) -> dict[str, object]:
    kind = command.WhichOneof("body")
    assert kind is not None
    return {kind: getattr(command, kind)}
