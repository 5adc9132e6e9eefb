"""The link between a node's control process and a data worker (raftwal/node/planes.py),
over a real socketpair with the real replica and state machine on the control side.

- a worker's copy of the state equals the control process's (as a fold of the events:
  the apply metadata aside; without leases and locks, which no data plane reads) at the
  same revision and Raft index after every applied entry, across a whole-state resend (a
  snapshot restore) and for a worker that attaches in the middle of the history;
- a worker's proposal is answered once the worker's copy has applied it;
- a link without the supervisor's secret, with an oversized or undecodable first frame,
  is dropped and gets no state;
- a worker whose control process goes away fails its pending proposal with ON_SHUTDOWN
  and its link loop ends with ControlGone.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest

from raft.replica import CoordinationReplica
from raftwal.node.planes import (
    MIRROR_SKIPPED_FIELDS,
    ControlGone,
    ControlLink,
    DataWorkers,
    StateMirror,
    encode,
    open_link,
    worker_state,
)
from rpc.errors import RaftwalError
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import planes_pb2 as planes
from statemachine import snapshot_state
from tests.unit.helpers import (
    assign,
    cmd,
    create_pchannels,
    domain_state,
    grant,
    ready,
    register,
    vchannel,
)

E = errors_pb2
TOKEN = b"t" * 32
WAIT_S = 10.0


class _Control:
    """The control process's side: a real replica (no Raft: entries applied in order)
    and DataWorkers over it."""

    def __init__(self, data_dir: Path) -> None:
        self.replica = CoordinationReplica(data_dir)
        self.index = 0
        self.workers = DataWorkers(self, TOKEN, 1)
        self.suspected: list[str] = []
        self.loop = asyncio.get_running_loop()
        self.replica.add_event_listener(
            lambda events, revision, index, last_time_ms, restored: self.loop.call_soon(
                self.workers.applied, events, revision, index, last_time_ms, restored
            )
        )

    def apply(self, command: pb.Command) -> pb.CommandResult:
        self.index += 1
        entry = pb.LogEntry(command=command.SerializeToString()).SerializeToString()
        reply = pb.LogEntryResult.FromString(self.replica.apply(entry, self.index))
        return pb.CommandResult.FromString(reply.results[0])

    # planes.WorkersHost
    async def propose(self, command: pb.Command) -> pb.CommandResult:
        return self.apply(command)

    def suspect(self, node_id: str) -> None:
        self.suspected.append(node_id)

    def state_bytes(self) -> bytes:
        return self.replica.read(worker_state)

    def serving_changed(self) -> None:
        pass


class _Requests:
    def status(self) -> planes.PlaneStatus:
        return planes.PlaneStatus(logs=7)

    def metrics_text(self) -> bytes:
        return b"# nothing\n"

    def reconcile_now(self) -> None:
        pass

    def request_stop(self) -> None:
        pass

    def admit(self) -> None:
        pass

    def raft_reserve(self, released: bool) -> None:
        pass


async def _worker(control: _Control, token: bytes = TOKEN) -> tuple[ControlLink, StateMirror]:
    control_end, worker_end = socket.socketpair()
    control.workers.attach(0, control_end, restarts=0)
    reader, writer = await open_link(worker_end)
    mirror = StateMirror()
    link = ControlLink(reader, writer, mirror, _Requests())
    link.hello(planes.PlaneHello(token=token, worker_index=0, pid=1, grpc_address="h:1"))
    return link, mirror


async def _until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


def _mirrored(state: pb.CoordinationState) -> bytes:
    """What a worker's copy holds of `state`: a fold of its events (no apply metadata),
    without what the data plane never reads (leases, locks)."""
    domain = domain_state(state)
    for name in MIRROR_SKIPPED_FIELDS:
        domain.ClearField(name)
    return snapshot_state(domain)


def _same(control: _Control, mirror: StateMirror) -> bool:
    mine = control.replica.read(_mirrored)
    return (
        mirror.ready
        and mirror.read(_mirrored) == mine
        and mirror.applied() == control.replica.applied()
    )


HISTORY = [
    register("n1"),
    register("n2"),
    register("n3"),
    create_pchannels("p1", "p2"),
    assign("p1", 1, "n1", ("n1", "n2", "n3")),
    grant(),
    ready("p1", 1, "n1", 1),
    grant(holder="other"),
    # Leases and locks never reach a worker: the revision steps over them. (The lock is
    # taken under the first lease, whose id is its grant's revision.)
    "lock",
    vchannel("v1", "p1"),
]


def _apply_all(control: _Control, commands: list) -> None:  # type: ignore[type-arg]
    for command in commands:
        if command == "lock":
            lease_id = control.replica.read(lambda s: min(s.leases))
            command = cmd(lock=pb.Lock(key="k", mode=pb.LOCK_MODE_EXCLUSIVE, lease_id=lease_id))
        result = control.apply(command)
        assert result.rejection.code == E.OK, result.rejection


def test_a_worker_copy_follows_every_applied_event(tmp_path: Path) -> None:
    async def main() -> None:
        control = _Control(tmp_path)
        _apply_all(control, HISTORY[:1])
        link, mirror = await _worker(control)
        follow = asyncio.create_task(link.run())
        await _until(lambda: _same(control, mirror), "first whole state")
        for command in HISTORY[1:]:
            _apply_all(control, [command])
            await _until(lambda: _same(control, mirror), f"after {command}")
        assert mirror.applied() == control.replica.applied()
        assert control.replica.read(lambda s: len(s.locks)) == 1
        assert mirror.read(lambda s: (len(s.leases), len(s.locks))) == (0, 0)
        # A whole-state replacement (a snapshot installed by the leader) is sent whole.
        other = _Control(tmp_path / "other")
        _apply_all(other, HISTORY[:5])
        control.replica.restore_snapshot(other.replica.read(snapshot_state))
        await _until(lambda: _same(control, mirror), "after a restore")
        assert mirror.read(lambda s: sorted(s.pchannels)) == ["p1", "p2"]
        assert not mirror.read(lambda s: list(s.vchannels))
        follow.cancel()

    asyncio.run(main())


def test_a_worker_that_attaches_late_gets_the_whole_state_then_the_rest(tmp_path: Path) -> None:
    async def main() -> None:
        control = _Control(tmp_path)
        _apply_all(control, HISTORY[:6])
        link, mirror = await _worker(control)
        follow = asyncio.create_task(link.run())
        # Applied while the hello is on its way: whole state first, these after.
        _apply_all(control, HISTORY[6:])
        await _until(lambda: _same(control, mirror), "late attach")
        follow.cancel()

    asyncio.run(main())


def test_a_proposal_is_answered_once_the_worker_applied_it(tmp_path: Path) -> None:
    async def main() -> None:
        control = _Control(tmp_path)
        _apply_all(control, HISTORY[:4])
        link, mirror = await _worker(control)
        follow = asyncio.create_task(link.run())
        await _until(lambda: mirror.ready, "first state")
        result = await link.propose(assign("p2", 1, "n2", ("n1", "n2", "n3")))
        assert result.rejection.code == E.OK
        # Answered after the worker's copy has the assignment, not only the control's.
        assert mirror.read(lambda s: s.pchannels["p2"].owner_node_id) == "n2"
        rejected = await link.propose(assign("p2", 1, "n3", ("n1", "n2", "n3")))
        assert rejected.rejection.code != E.OK
        link.suspect("n3")
        await _until(lambda: control.suspected == ["n3"], "suspect reaches the control side")
        # The control side asks, the worker answers.
        await control.workers.refresh_status(WAIT_S)
        assert control.workers.links[0].status.logs == 7
        pages = await control.workers.metrics_pages(WAIT_S)
        assert pages == {0: b"# nothing\n"}
        follow.cancel()

    asyncio.run(main())


@pytest.mark.parametrize(
    "first_frame",
    [
        encode(planes.PlaneMessage(hello=planes.PlaneHello(token=b"x" * 32, worker_index=0))),
        encode(planes.PlaneMessage(hello=planes.PlaneHello(token=TOKEN, worker_index=3))),
        encode(planes.PlaneMessage(stop=planes.PlaneStop())),
        struct.pack(">I", 1 << 20) + b"\0" * 64,
        struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff",
    ],
    ids=["wrong secret", "wrong index", "not a hello", "oversized", "undecodable"],
)
def test_a_link_without_a_valid_hello_is_dropped_and_gets_no_state(
    tmp_path: Path, first_frame: bytes
) -> None:
    async def main() -> None:
        control = _Control(tmp_path)
        _apply_all(control, HISTORY[:1])
        control_end, worker_end = socket.socketpair()
        control.workers.attach(0, control_end, restarts=0)
        reader, writer = await open_link(worker_end)
        writer.write(first_frame)
        data = await asyncio.wait_for(reader.read(), WAIT_S)
        assert data == b"", "the control side closed the link without a word"
        assert not control.workers.links[0].up
        assert control.workers.worker_addresses() == []

    asyncio.run(main())


def test_a_worker_whose_control_process_is_gone_stops_and_fails_its_proposals(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        control_end, worker_end = socket.socketpair()
        reader, writer = await open_link(worker_end)
        mirror = StateMirror()
        link = ControlLink(reader, writer, mirror, _Requests())
        follow = asyncio.create_task(link.run())
        proposal = asyncio.create_task(link.propose(cmd(register_node=pb.RegisterNode())))
        await asyncio.sleep(0.05)
        control_end.close()
        with pytest.raises(ControlGone):
            await asyncio.wait_for(follow, WAIT_S)
        with pytest.raises(RaftwalError) as raised:
            await asyncio.wait_for(proposal, WAIT_S)
        assert raised.value.info.code == E.ON_SHUTDOWN

    asyncio.run(main())
