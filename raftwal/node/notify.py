"""``AppliedNotifier``: the asyncio view of how far a process has applied the coordination
state, for whoever waits for the next applied command (watches, proposals that wait until
their own entry is applied here, the data plane's reconcile loop).

The control process advances it from its Raft replica (through the event loop's mailbox),
a data worker from the events its control process sends (``raftwal.node.planes``). Must
never block: it only wakes waiters.
"""

from __future__ import annotations

import asyncio
import time

from rpc.aio import wait_event


class AppliedNotifier:
    """asyncio view of the applied state's progress: who waits for the next applied
    command."""

    def __init__(self) -> None:
        self.revision = 0
        self.raft_index = 0
        self._changed = asyncio.Event()

    def advance(self, revision: int, raft_index: int) -> None:
        self.revision = max(self.revision, revision)
        self.raft_index = max(self.raft_index, raft_index)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_change(self, timeout_s: float) -> None:
        await wait_event(self._changed, timeout_s)

    async def wait_index(self, raft_index: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.raft_index < raft_index:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self.wait_change(remaining)
        return True
