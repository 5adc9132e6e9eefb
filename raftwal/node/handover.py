"""A node's planned stop (DESIGN.md section 8b: SIGTERM = planned handover): its control
process moves the pchannels the node owns to other nodes and waits until each is ASSIGNED
there, then transfers its Raft leadership, all within ``handover_timeout_ms``
(docs/architecture.md, section 6).

``HandoverMixin`` is part of ``raftwal.node.process.Node`` (the control process); it reads
the node's applied state, its data workers' serving pchannels and its Raft peer. It must
never stop the node itself: ``Node.run_until_stopped`` does, after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TypeVar

from raft.errors import (
    NotLeader,
    PeerClosed,
)
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2

log = logging.getLogger(__name__)
E = errors_pb2
T = TypeVar("T")

# A handover gives up waiting for its pchannels to move once the leader has reported no
# other node to move them to for this long (the whole cluster is stopping), or once no
# majority of the voters has been in reach for this long (the others stopped first, so no
# leader is left to report). Two heartbeat intervals (300 ms): a leader that just took over
# has heard nobody yet.
HANDOVER_NO_TARGET_S = 0.6
# The share of handover_timeout_ms kept for the leadership transfer (at most 2 s of it).
HANDOVER_LEADERSHIP_SHARE = 0.2
HANDOVER_LEADERSHIP_MAX_S = 2.0
# How often the leadership transfer is polled and retried (a follower not caught up yet
# is refused by pysyncobj; a moment later it usually is).
HANDOVER_POLL_S = 0.05


class HandoverMixin:
    """Planned stops: hand the pchannels and the Raft leadership over. (a part of the control process's ``Node``.)"""

    async def handover_or_abort(self) -> None:
        """``handover``, cut short by a second stop signal; never longer than the handover
        timeout (plus a second for the last answers)."""
        if self._stopping.is_set() or self._handover_abort.is_set():
            return
        if len(self.config.nodes) < 2:
            return  # nobody to hand over to
        work = asyncio.create_task(self.handover(), name="handover")
        abort = asyncio.create_task(self._handover_abort.wait(), name="handover-abort")
        try:
            await asyncio.wait(
                {work, abort},
                timeout=self.config.handover_timeout_ms / 1000 + 1.0,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for task in (work, abort):
                task.cancel()
            for task in (work, abort):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if work.done() and not work.cancelled() and work.exception() is not None:
                log.error("node %s: handover failed: %r", self.me.id, work.exception())

    async def handover(self) -> bool:
        """Hand over before a planned stop (see the module docstring): move the pchannels
        this node owns to other nodes and wait until each is ASSIGNED there, then transfer
        the Raft leadership if this node leads. Bounded by ``handover_timeout_ms``; True
        when both finished in time. The node keeps serving throughout: replicas keep
        acknowledging, watches keep answering, and late batches on an owner that lost its
        pchannel are answered NOT_OWNER / CHANNEL_FENCED, so their producers resend them."""
        started = time.monotonic()
        timeout_s = self.config.handover_timeout_ms / 1000
        deadline = started + timeout_s
        leadership_s = min(HANDOVER_LEADERSHIP_MAX_S, timeout_s * HANDOVER_LEADERSHIP_SHARE)
        self.draining = True
        self._handover_targets = None
        self._no_target_since = None
        self._heartbeat_now.set()
        log.info("node %s handing over before it stops (within %.1f s)", self.me.id, timeout_s)
        moved = await self._hand_over_pchannels(deadline - leadership_s)
        moved_at = time.monotonic()
        led = self.is_leader()
        # With nobody to hand over to (the whole cluster is stopping), keep the leadership.
        nobody = self._handover_targets == 0 or (
            self.peer is not None and not self.peer.quorum_in_reach()
        )
        transferred = await self._hand_over_leadership(deadline) if led and not nobody else True
        log.info(
            "node %s handover %s: pchannels %s in %.3f s, leadership %s in %.3f s",
            self.me.id,
            "done" if moved and transferred else "incomplete",
            "moved" if moved else "NOT all moved",
            moved_at - started,
            ("transferred" if transferred and not nobody else "NOT transferred")
            if led
            else "not held",
            time.monotonic() - moved_at,
        )
        return moved and transferred

    def _pchannels_to_hand_over(self, watched: set[str]) -> list[str]:
        """Pchannels this node still owns, or that it owned (`watched`) and are not yet
        ASSIGNED to another node (read from the applied state)."""
        me = self.me.id

        def reader(state: pb.CoordinationState) -> list[str]:
            waiting = []
            for name, channel in state.pchannels.items():
                if channel.state == pb.PCHANNEL_STATE_DROPPED:
                    continue
                if channel.owner_node_id == me:
                    waiting.append(name)
                    watched.add(name)
                elif name in watched and channel.state != pb.PCHANNEL_STATE_ASSIGNED:
                    waiting.append(name)
            return sorted(waiting)

        return self.replica.read(reader)

    async def _hand_over_pchannels(self, deadline: float) -> bool:
        watched: set[str] = set(self.serving_terms())
        no_quorum_since: float | None = None
        while True:
            waiting = self._pchannels_to_hand_over(watched)
            if not waiting and not self.serving_terms():
                return True
            now = time.monotonic()
            # No majority of the voters in reach: no move can commit, and no leader is left
            # to report targets (the rest of the cluster stopped first).
            peer = self.peer
            if peer is not None and not peer.quorum_in_reach():
                no_quorum_since = now if no_quorum_since is None else no_quorum_since
                if now - no_quorum_since >= HANDOVER_NO_TARGET_S:
                    log.warning(
                        "node %s: no majority of the voters in reach; stopping without moving %s",
                        self.me.id,
                        ", ".join(waiting[:8]) or "its pchannels",
                    )
                    return False
            else:
                no_quorum_since = None
            if self._no_target_since is not None and now - self._no_target_since >= (
                HANDOVER_NO_TARGET_S
            ):
                log.warning(
                    "node %s: no other node can take over %s (the cluster is stopping?); "
                    "stopping without moving them",
                    self.me.id,
                    ", ".join(waiting[:8]) or "its pchannels",
                )
                return False
            if now >= deadline:
                log.warning(
                    "node %s: handover timed out with %d pchannel(s) not moved: %s",
                    self.me.id,
                    len(waiting),
                    ", ".join(waiting[:8]),
                )
                return False
            await self.notifier.wait_change(min(0.2, deadline - now))

    async def _hand_over_leadership(self, deadline: float) -> bool:
        """Transfer the Raft leadership (TimeoutNow) to the most caught-up follower and wait
        until another node leads. True when this node does not lead (any more)."""
        peer = self.peer
        if peer is None:
            return True
        election_s = self.config.raft_max_timeout_ms / 1000
        while True:
            if not peer.is_leader():
                return True
            now = time.monotonic()
            if now >= deadline:
                log.warning("node %s: leadership transfer timed out", self.me.id)
                return False
            try:
                sent = await asyncio.wait_for(
                    asyncio.wrap_future(peer.transfer_leadership()), deadline - now
                )
            except NotLeader:
                return True
            except (PeerClosed, TimeoutError) as error:
                log.warning("node %s: leadership transfer failed: %r", self.me.id, error)
                return False
            # Sent: the target calls an election at once; denied (no follower holds the
            # whole log yet): ask again shortly.
            wait_until = min(deadline, time.monotonic() + (election_s if sent else 0.0))
            while True:
                await asyncio.sleep(HANDOVER_POLL_S)
                if not peer.is_leader() or time.monotonic() >= wait_until:
                    break

    def _note_handover_targets(self, targets: int) -> None:
        self._handover_targets = targets
        if targets > 0:
            self._no_target_since = None
        elif self._no_target_since is None:
            self._no_target_since = time.monotonic()
