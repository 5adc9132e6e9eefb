"""An append stream to a replica that ends before its first answer does not send the
replica the whole log again.

A new term's owner knows where each replica's log ends from the fence answers, and starts
each replica's stream there; but it has heard no append answer yet at this term, so its
match for the replica is 0. The owner used to restart every broken stream from the match
+ 1: a stream cut before its first answer (a connection reset, a replica's restart, a lost
packet on a lossy link) sent that replica the whole retained log again from lsn 1. On a
lossy network every new term then spent its assign timeout re-sending the log and never
became ready, term after term (the simulation's seeds 4697 and 8500 stalled that way).

The logs are real `PChannelLog`s behind the loopback transport of
test_wal_owner_recovery.py; the transport cuts the first streams to one replica before
they answer, and records where every stream to it started."""

from __future__ import annotations

import asyncio
from typing import Any

from rpc.protos import streaming_pb2 as wire
from tests.timing import scaled
from tests.wal.test_wal_owner_recovery import (
    NODES,
    PCHANNEL,
    Loopback,
    _Stream,
    entry,
    logs,  # noqa: F401 (fixture)
    terms,
    write,
)
from wal_segments.log import PChannelLog
from wal_segments.owner import ChannelOwner, OwnerConfig

#: entries every log holds before the new term
HELD = 200
#: streams to the cut replica that end before their first answer
CUT_STREAMS = 3


class _CutStream(_Stream):
    """A stream whose connection is gone at once: it takes the requests and answers none."""

    async def write(self, request: wire.AppendRequest) -> None:
        return None

    def __init__(self, log: PChannelLog) -> None:
        super().__init__(log)
        self.cancel()  # the answers end: the owner sees the stream end


class CuttingLoopback(Loopback):
    def __init__(self, opened: dict[str, PChannelLog], cut: str) -> None:
        super().__init__(opened)
        self.cut = cut
        self.cuts_left = CUT_STREAMS
        #: streams opened to `cut`
        self.opened = 0
        #: the prev_lsn of every request sent to `cut`
        self.starts: list[int] = []

    def open_append(self, node_id: str) -> _Stream:
        log = self._reach(node_id)
        if node_id != self.cut:
            return _Stream(log)
        stream = _CutStream(log) if self.cuts_left > 0 else _Stream(log)
        self.cuts_left -= 1
        self.opened += 1
        write = stream.write

        async def recording(request: wire.AppendRequest) -> None:
            self.starts.append(request.prev_lsn)
            await write(request)

        stream.write = recording  # type: ignore[method-assign]
        return stream


async def test_a_stream_cut_before_its_first_answer_resumes_where_it_started(logs) -> None:  # noqa: F811
    for log in logs.values():
        await log.fence(1)
        await write(log, 1, [entry(lsn, 1) for lsn in range(1, HELD + 1)])
        log.committed_lsn = HELD
    transport: Any = CuttingLoopback(logs, cut="n3")
    owner = ChannelOwner(
        pchannel=PCHANNEL,
        term=2,
        node_id="n1",
        replica_node_ids=[n for n in NODES if n != "n1"],
        log=logs["n1"],
        transport=transport,
        proposer=transport,
        config=OwnerConfig(retry_min_s=0.01, retry_max_s=0.05, rpc_timeout_s=2.0),
    )
    owner.start()
    try:
        await asyncio.wait_for(owner.ready.wait(), scaled(20))

        async def caught_up() -> None:
            while terms(logs["n3"]) != terms(logs["n1"]):
                await asyncio.sleep(0.02)

        await asyncio.wait_for(caught_up(), scaled(20))
    finally:
        await owner.close()
    assert transport.opened > CUT_STREAMS
    # Every request to n3 followed where its log ends (the fence answer said so): none
    # sent the log again from its start.
    assert transport.starts and min(transport.starts) >= HELD, sorted(set(transport.starts))[:5]
