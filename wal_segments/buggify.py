"""Buggify points (FoundationDB's name): places in the WAL's rare paths where the
simulation (``raftwal simulate``) may slow the code down or crash its node, so that the
rare interleavings happen in every run of a few hundred seeds rather than once a year.

The code marks a point with one line::

    await buggify.point("replica.fence_answer")

With no hook installed (production, and every test but the simulation's) a point costs
one global load, a None test and the await of a finished coroutine. The simulation
installs a hook for the length of one seed: per seed it picks which points are on and
what each does when hit (wait a while on the virtual clock, or crash the node there:
``raftwal.sim.world``). A hook may raise (a crashed node's code gets CancelledError at
its next await, as any task of a killed process would).

The points (`POINTS`), and what they stand for:
- ``replica.fence_answer``: a replica's Fence answer is slow (after its fence is durable);
- ``replica.append_answer``: a replica is slow to confirm an append it made durable;
- ``log.seal``: a background seal is late (between the entries' sync and the footer);
- ``log.truncate``: a truncation of a divergent suffix is slow or interrupted;
- ``owner.recovery.fenced``, ``owner.recovery.adopted``, ``owner.recovery.trimmed``,
  ``owner.recovery.term_start``, ``owner.recovery.ready``: a tail recovery interrupted
  (or slowed) after each of its steps: the fence quorum, the adoption of the best log,
  the drop of a partial transaction, the term-start entry, and right before
  PChannelReady;
- ``owner.commit_segment``: a segment's CommitSegment proposal is late;
- ``owner.catchup``: an owner catching a replica up from its log (entries it no longer
  holds in memory: an older term's tail after a failover, a replica far behind) is slow
  between two requests, so the replica makes the older entries durable before the
  owner's newer ones (its term start) reach it: the state Raft's figure 8 needs.

Must never: import anything of ours, do anything when no hook is installed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

#: name -> None, awaited at the point (may sleep, crash the node, raise)
BuggifyHook = Callable[[str], Awaitable[None]]

POINTS = frozenset(
    {
        "replica.fence_answer",
        "replica.append_answer",
        "log.seal",
        "log.truncate",
        "owner.recovery.fenced",
        "owner.recovery.adopted",
        "owner.recovery.trimmed",
        "owner.recovery.term_start",
        "owner.recovery.ready",
        "owner.commit_segment",
        "owner.catchup",
    }
)

_hook: BuggifyHook | None = None


def install(hook: BuggifyHook | None) -> None:
    """Route every buggify point through `hook` (None: every point does nothing)."""
    global _hook
    _hook = hook


async def point(name: str) -> None:
    """A buggify point: nothing at all unless the simulation installed a hook."""
    hook = _hook
    if hook is not None:
        await hook(name)
