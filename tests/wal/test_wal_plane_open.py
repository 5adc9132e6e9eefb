"""DataPlane.log: a caller cancelled while the pchannel's log is being opened (an RPC whose
client went away, a deadline) neither marks the pchannel broken nor leaves it unopened.

Before the fix the cancellation ran inside the open and was recorded as "cannot open the
log" with an empty message; reconcile then skipped the pchannel, so an assignment to this
node stayed ASSIGNING until the coordinator's assign timeout (15 s) moved it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from wal_segments.fsync_policy import parse_fsync_policy
from wal_segments.owner import OwnerConfig
from wal_segments.plane import Assignment, DataPlane


class _View:
    def assignments(self) -> dict[str, Assignment]:
        return {}

    async def reassign_to_self(self, pchannel: str, term: int) -> None:
        return None


def _plane(tmp_path: Path) -> DataPlane:
    nothing: Any = None
    return DataPlane(
        node_id="n1",
        data_dir=tmp_path,
        policy=parse_fsync_policy("always"),
        owner_config=OwnerConfig(),
        transport=nothing,
        proposer=nothing,
        view=_View(),
    )


async def test_a_cancelled_caller_leaves_the_log_opening_and_not_broken(tmp_path: Path) -> None:
    plane = _plane(tmp_path)
    try:
        caller = asyncio.create_task(plane.log("p"))
        await asyncio.sleep(0)  # the open has started (it waits for its thread)
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        # The open goes on by itself (bounded wait) and nothing is marked broken.
        for _ in range(300):
            if "p" in plane.logs or plane.broken:
                break
            await asyncio.sleep(0.1)
        assert plane.broken == {}
        log = plane.logs["p"]
        assert await plane.log("p") is log  # opened once
    finally:
        await plane.close()
