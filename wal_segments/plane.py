"""The node's data plane: every pchannel log this node holds, the owners it runs, and the
reconciliation that keeps them in line with the coordination state.

What lives here: `DataPlane` (one per node process). It opens `data_dir/wal/<pchannel>/`
logs on demand, answers the replica side of replication (append, fence, fetch), starts a
`ChannelOwner` when the coordination state assigns a pchannel to this node at a new term
(ASSIGNING), stops owners whose term was superseded, and re-runs recovery at a new term
when this node is recorded as the owner but does not serve (a restart, or an owner that
stopped after a local I/O failure): it asks the coordination plane to reassign the
pchannel to itself at term + 1. **Recovery never runs twice at one term on a node**: an
assignment at term T whose log here is already fenced at T (an earlier incarnation began
recovery at T) also goes to term + 1, since what that incarnation wrote at T may survive on
other replicas but not here. A log left unusable by a local I/O failure is closed and
opened again (recovered from the files) the next time anything needs it.

The coordination plane is reached only through `CoordinationView` and `Proposer`
(`typing.Protocol`s wired by the composition root in `raftwal/`).

What must never happen here: an import of `raft` or `raftwal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from wal_segments import mutations
from wal_segments.catalog import Catalog
from wal_segments.fsync_policy import FsyncPolicy
from wal_segments.log import LogError, PChannelLog
from wal_segments.owner import (
    SAME_TERM_RECOVERY,
    ChannelOwner,
    OwnerConfig,
    Proposer,
    ReplicaTransport,
    WriteObserver,
)
from wal_segments.segment import make_durable_directory
from wal_segments.walimpls import registry as wal_registry
from wal_segments.walimpls.api import WAL, Opener, WalImplError
from wal_segments.walimpls.files import check_fsync_policy

logger = logging.getLogger(__name__)

#: pchannel state names as in the coordination protos (kept as strings here)
ASSIGNING = "ASSIGNING"
ASSIGNED = "ASSIGNED"

#: A rejected request for the next term of a pchannel (`DataPlane._reassign`) is asked
#: again after this backoff (seconds, doubling from the first to the last), not on the
#: next reconcile: each rejection is itself a Raft entry whose apply wakes the reconcile
#: loop at once, so without it a node the state still calls DOWN asked again as fast as
#: Raft commits (19 proposals in 150 ms after a restore).
REASSIGN_BACKOFF_S = (0.05, 1.0)


# The names the coordination state accepts (statemachine.validation.NAME_RULE), checked
# again here where a name becomes a directory: one plain path component, never '.', '..',
# a hidden name or anything with a separator.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


class UnsafePath(LogError):
    """A name that would not be one plain path component under its root."""


class NotHere(LogError):
    """A pchannel this data plane does not hold (another data worker of the node does)."""


class LogLocked(LogError):
    """A pchannel's log is open in another process."""


#: The file in a pchannel's directory whose exclusive flock the process that has the log
#: open holds (``DataPlane(exclusive=True)``).
LOCK_FILE = ".lock"


def _lock_directory(directory: Path) -> int:
    """Create `directory` if needed and take its lock file's exclusive flock, without
    waiting; the descriptor holds it (released when it is closed, also by the process's
    death). Raises LogLocked when another process holds it."""
    make_durable_directory(directory)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogLocked(
            f"the log in {directory} is open in another process (its {LOCK_FILE} is locked)"
        ) from None
    except OSError:
        os.close(fd)
        raise
    return fd


def path_under(root: Path, name: str) -> Path:
    """``root / name`` for a plain `name`, checked to resolve directly under `root`; raises
    UnsafePath otherwise (nothing is created)."""
    if not _PLAIN_NAME.fullmatch(name):
        raise UnsafePath(f"refusing {name[:64]!r} as a directory name under {root}")
    path = root / name
    if path.resolve().parent != root.resolve():
        raise UnsafePath(f"{path} resolves outside {root}")
    return path


@dataclass(frozen=True, slots=True)
class Assignment:
    pchannel: str
    term: int
    owner_node_id: str
    state: str
    replica_node_ids: tuple[str, ...]
    # The replica set at the last ready term (empty: none yet, or the same set).
    stable_replica_node_ids: tuple[str, ...] = ()
    # The WAL implementation (wal_segments.walimpls; "" = segments), its configuration as
    # sorted (key, value) pairs, and the epoch of its storage.
    wal: str = ""
    wal_config: tuple[tuple[str, str], ...] = ()
    wal_epoch: int = 0
    # The owner at the last ready term before this one ("" if none, or this owner): where
    # a `local` pchannel's one copy is.
    previous_owner_node_id: str = ""
    # Where `wal` took over the log (an AlterWAL's checkpoint: (lsn, term); (0, 0) when the
    # pchannel was created on it).
    wal_checkpoint: tuple[int, int] = (0, 0)
    # The last LSN earlier terms are known to have written and committed
    # (`statemachine.decider.ready_floor`): a new owner's log must hold it.
    ready_floor: int = 0
    # An AlterWAL in FLUSHING for this pchannel: its epoch and target (0 and "" otherwise).
    flushing_epoch: int = 0
    flushing_target: str = ""


class CoordinationView(Protocol):
    """What the data plane reads of the coordination state (this node's applied copy)."""

    def assignments(self) -> dict[str, Assignment]: ...

    async def reassign_to_self(self, pchannel: str, term: int) -> None:
        """Propose AssignPChannel(pchannel, term + 1, this node, same replicas)."""
        ...


class DataPlane:
    def __init__(
        self,
        *,
        node_id: str,
        data_dir: Path,
        policy: FsyncPolicy,
        owner_config: OwnerConfig,
        transport: ReplicaTransport,
        proposer: Proposer,
        view: CoordinationView,
        observer: WriteObserver | None = None,
        accepts: Callable[[str], bool] | None = None,
        exclusive: bool = False,
        admitted: asyncio.Event | None = None,
    ) -> None:
        self.node_id = node_id
        # Which pchannels this data plane may hold (a data worker holds those placed on it,
        # rpc.placement); None: every one. A log outside it is never opened here.
        self._accepts = accepts
        # Each open log holds an exclusive lock on its directory (`LOCK_FILE`), so that no
        # two processes sharing the data directory (two data workers of one node, or a
        # stray second node process) ever write one pchannel's files at once.
        self._exclusive = exclusive
        self._locks: dict[str, int] = {}
        self.wal_dir = data_dir / "wal"
        make_durable_directory(self.wal_dir)
        self.catalog = Catalog(data_dir / "catalog.db")
        self.policy = policy
        self.owner_config = owner_config
        self.transport = transport
        self.proposer = proposer
        self.view = view
        self.observer = observer
        self.logs: dict[str, PChannelLog] = {}
        self._opening: dict[str, asyncio.Future[PChannelLog]] = {}
        self.owners: dict[str, ChannelOwner] = {}
        self.broken: dict[str, str] = {}
        # Those of `broken` whose open failed on an I/O error (an fsync's EIO): the disk
        # may work again, so an assignment here tries the open again; a malformed log
        # does not heal by itself and is left alone.
        self._io_broken: set[str] = set()
        self._reassigning: dict[str, int] = {}
        # pchannel -> (term, loop time before which it is not asked again, last backoff)
        self._reassign_retry: dict[str, tuple[int, float, float]] = {}
        # pchannel -> the retention floor already applied to its log here
        self._retained: dict[str, int] = {}
        self._closed = False
        # Reconcile runs from the loop and from NodeManager.Assign: one at a time, or two
        # owners could start for the same assignment.
        self._reconcile_lock = asyncio.Lock()
        # Set by the node once the cluster accepted this process as the node (None:
        # always): until then no owner starts here, so that a second process under one
        # node id, which the cluster refuses, never recovers that node's pchannels.
        self._admitted = admitted
        # (implementation, configuration) -> its opener: one per data plane, shared by the
        # pchannels on it (a NATS connection).
        self._openers: dict[tuple[str, tuple[tuple[str, str], ...]], Opener] = {}
        #: pchannel -> why its implementation cannot be opened now ("" once it can)
        self.wal_problems: dict[str, str] = {}
        #: (pchannel, epoch, term) -> the task flushing it for an AlterWAL
        self._flushing: dict[tuple[str, int, int], asyncio.Task[None]] = {}

    def accepts(self, pchannel: str) -> bool:
        """Whether this data plane may hold `pchannel` (see ``accepts`` in the constructor)."""
        return self._accepts is None or self._accepts(pchannel)

    async def log(self, pchannel: str) -> PChannelLog:
        """The pchannel's log, opened (recovered from the files) on first use, and opened
        again when a local I/O failure left it unusable (`PChannelLog.failure`). Raises
        ``NotHere`` for a pchannel this data plane does not hold."""
        if not self.accepts(pchannel):
            raise NotHere(f"pchannel {pchannel[:128]} is not held by this data worker")
        log = self.logs.get(pchannel)
        if log is not None and log.failure is None:
            return log
        opening = self._opening.get(pchannel)
        if opening is None:
            # Its own task, shielded from the caller: a caller cancelled mid-open (an RPC
            # whose client went away, a deadline) must neither cut the recovery short nor
            # leave the pchannel marked broken, which would keep this node from ever
            # serving it.
            opening = asyncio.ensure_future(self._open(pchannel, log))
            self._opening[pchannel] = opening
            opening.add_done_callback(functools.partial(self._opened, pchannel))
        return await asyncio.shield(opening)

    def _opened(self, pchannel: str, opening: asyncio.Future[PChannelLog]) -> None:
        self._opening.pop(pchannel, None)
        if not opening.cancelled():
            opening.exception()  # retrieved: every caller may have gone away meanwhile

    async def _open(self, pchannel: str, log: PChannelLog | None) -> PChannelLog:
        try:
            if log is not None:
                logger.warning(
                    "%s: reopening the log after a local I/O failure: %s", pchannel, log.failure
                )
                del self.logs[pchannel]
                await log.close()
            directory = path_under(self.wal_dir, pchannel)
            if self._exclusive and pchannel not in self._locks:
                self._locks[pchannel] = await asyncio.to_thread(_lock_directory, directory)
            log = await PChannelLog.open(directory, pchannel, self.catalog, self.policy)
        except Exception as error:
            # A malformed segment is reported for this pchannel (logged once, and in
            # ClusterStatus); others keep working.
            if self.broken.get(pchannel) != str(error):
                logger.error("%s: cannot open the log: %r", pchannel, error)
            self.broken[pchannel] = str(error)
            if isinstance(error, OSError):
                self._io_broken.add(pchannel)
            else:
                self._io_broken.discard(pchannel)
            raise
        self.broken.pop(pchannel, None)
        self._io_broken.discard(pchannel)
        self.logs[pchannel] = log
        return log

    async def apply_retention(self, floors: dict[str, int]) -> int:
        """Delete, in each pchannel's log here, the segments below its retention floor
        (decided in Raft; pchannel -> deleted_before_lsn). Idempotent: a floor already
        applied costs nothing, and one a crash cut short is finished. Returns the number
        of segments deleted. A log that cannot be opened is reported by `log()`."""
        deleted = 0
        for pchannel, floor in sorted(floors.items()):
            if self._closed or self._retained.get(pchannel, 0) >= floor:
                continue
            try:
                log = await self.log(pchannel)
                deleted += await log.delete_before(floor)
            except (LogError, OSError) as error:
                logger.warning("%s: retention below lsn %d failed: %s", pchannel, floor, error)
                continue
            except Exception:  # noqa: BLE001 - reported by log(); the next round retries
                continue
            if not log.retained_below(floor):
                self._retained[pchannel] = floor  # else a segment was still being sealed
        return deleted

    def disk_usage(self) -> dict[str, tuple[int, int]]:
        """pchannel -> (bytes of its segment files here, first LSN retained here), for
        the logs this node has open."""
        return {
            name: (log.disk_bytes(), log.first_lsn)
            for name, log in sorted(self.logs.items())
            if not log.closed
        }

    def problems(self) -> dict[str, str]:
        """Problems worth a warning in ClusterStatus: unreadable logs, failing commits."""
        problems = {p: f"log cannot be opened: {e}" for p, e in self.broken.items()}
        problems.update(self.wal_problems)
        for pchannel, owner in self.owners.items():
            if owner.failure:
                problems[pchannel] = f"owner at term {owner.term} stopped: {owner.failure}"
            elif owner.commit_failures >= 3:
                problems[pchannel] = (
                    f"segment commit failing ({owner.commit_failures}): {owner.last_commit_error}"
                )
        return problems

    def serving_terms(self) -> dict[str, int]:
        return {p: o.term for p, o in self.owners.items() if o.serving}

    def owner(self, pchannel: str) -> ChannelOwner | None:
        return self.owners.get(pchannel)

    async def reconcile(self) -> None:
        """Bring owners in line with the applied coordination state (idempotent)."""
        async with self._reconcile_lock:
            await self._reconcile_locked()

    async def _reconcile_locked(self) -> None:
        if self._closed or (self._admitted is not None and not self._admitted.is_set()):
            return
        assignments = self.view.assignments()
        for pchannel, owner in list(self.owners.items()):
            current = assignments.get(pchannel)
            if (
                current is None
                or current.term != owner.term
                or current.owner_node_id != self.node_id
            ):
                logger.info(
                    "%s: stopping owner at term %d (state %s)", pchannel, owner.term, owner.state
                )
                del self.owners[pchannel]
                await owner.close("closed")
        for pchannel, assignment in sorted(assignments.items()):
            if assignment.owner_node_id != self.node_id or (
                pchannel in self.broken and pchannel not in self._io_broken
            ):
                continue
            existing = self.owners.get(pchannel)
            if existing is not None and existing.term == assignment.term:
                if assignment.flushing_epoch and existing.serving:
                    self._start_flush(existing, assignment)
                if existing.state in ("fenced", "closed") and assignment.state == ASSIGNED:
                    # Ready at this term but this owner stopped: take a new term. (One that
                    # stopped while still recovering stays stopped at its term, never
                    # recovering again at it; the coordinator moves a pchannel stuck in
                    # ASSIGNING, to another node if this one keeps failing.)
                    await self._reassign(pchannel, assignment.term)
                continue
            if assignment.state == ASSIGNING:
                await self._start_owner(assignment)
            elif assignment.state == ASSIGNED:
                # Recorded as the ready owner but not serving (restarted): new term.
                await self._reassign(pchannel, assignment.term)

    async def _start_owner(self, assignment: Assignment) -> None:
        try:
            log = await self.log(assignment.pchannel)
        except Exception:  # noqa: BLE001 - logged and reported by log(); others go on
            return
        if self._recovered_here_before(log, assignment):
            logger.info(
                "%s: recovery at term %d already ran on this node (fenced term %d); asking "
                "for term %d",
                assignment.pchannel,
                assignment.term,
                log.fenced_term,
                assignment.term + 1,
            )
            await self._reassign(assignment.pchannel, assignment.term)
            return
        wal = await self._open_wal(assignment)
        if wal is None:
            return  # reported; the next reconcile tries again
        stable = assignment.stable_replica_node_ids
        if not wal.replicated:
            # One copy (local) is on the last ready owner; an external log (jetstream) is
            # adopted from where it is stored.
            previous = assignment.previous_owner_node_id
            stable = (previous,) if previous and not wal.external else ()
        owner = ChannelOwner(
            pchannel=assignment.pchannel,
            term=assignment.term,
            node_id=self.node_id,
            replica_node_ids=assignment.replica_node_ids,
            stable_replica_node_ids=stable,
            wal=wal,
            checkpoint=assignment.wal_checkpoint,
            previous_owner_node_id=assignment.previous_owner_node_id,
            ready_floor=assignment.ready_floor,
            log=log,
            transport=self.transport,
            proposer=self.proposer,
            config=self.owner_config,
            observer=self.observer,
        )
        self.owners[assignment.pchannel] = owner
        logger.info("%s: recovering as owner at term %d", assignment.pchannel, assignment.term)
        owner.start()

    def _start_flush(self, owner: ChannelOwner, assignment: Assignment) -> None:
        """FLUSHING of an AlterWAL on a serving owner, once per (pchannel, epoch, term)."""
        key = (assignment.pchannel, assignment.flushing_epoch, owner.term)
        if key in self._flushing:
            return
        for old in [k for k in self._flushing if k[0] == assignment.pchannel]:
            self._flushing.pop(old).cancel()
        self._flushing[key] = asyncio.create_task(
            self._flush(owner, assignment.flushing_epoch, assignment.flushing_target),
            name=f"flush:{assignment.pchannel}",
        )

    async def _flush(self, owner: ChannelOwner, epoch: int, target: str) -> None:
        """Flush `owner` for AlterWAL `epoch` and propose WalFlushed, retrying while the
        owner serves (the proposal is idempotent: a repeat of an accepted one is a no-op)."""
        attempt = 0
        while owner.serving and not self._closed:
            try:
                checkpoint = await owner.flush_for_alter(epoch, target)
                code = await self.proposer.wal_flushed(
                    owner.pchannel, epoch, owner.term, checkpoint
                )
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - retried while the owner serves
                logger.info("%s: flush for AlterWAL epoch %d: %r", owner.pchannel, epoch, error)
                code = -1
            if code == 0:
                logger.info(
                    "%s: flushed for AlterWAL epoch %d at lsn %d",
                    owner.pchannel,
                    epoch,
                    checkpoint[0],
                )
                return
            if code > 0:
                logger.warning(
                    "%s: WalFlushed for AlterWAL epoch %d refused (code %d)",
                    owner.pchannel,
                    epoch,
                    code,
                )
            attempt += 1
            await asyncio.sleep(min(1.0, 0.05 * 2**attempt))

    async def _open_wal(self, assignment: Assignment) -> WAL | None:
        """The assignment's WAL implementation opened for its pchannel; None (logged once
        and kept in `wal_problems`, shown in ClusterStatus) when it cannot be now."""
        name = assignment.wal or "segments"
        key = (name, assignment.wal_config)
        try:
            opener = self._openers.get(key)
            if opener is None:
                check_fsync_policy(name, self.policy.kind)
                opener = wal_registry.builder(name).build(dict(assignment.wal_config))
                self._openers[key] = opener
            wal = await opener.open(assignment.pchannel, assignment.wal_epoch)
        except WalImplError as error:
            problem = f"{name} WAL cannot be opened: {error}"
            if self.wal_problems.get(assignment.pchannel) != problem:
                logger.error("%s: %s", assignment.pchannel, problem)
            self.wal_problems[assignment.pchannel] = problem
            return None
        self.wal_problems.pop(assignment.pchannel, None)
        return wal

    @staticmethod
    def _recovered_here_before(log: PChannelLog, assignment: Assignment) -> bool:
        """Whether a recovery at the assignment's term ran on this node before (an earlier
        incarnation fenced its own log at that term first thing, durably). It may have
        written entries at that term that reached other replicas but not this node's disk
        (a power cut), so a second recovery at the same term could write different entries
        at the same (lsn, term), which log matching cannot tell apart. Only the assigned
        owner may fence at the assigned term, so such a fence is this node's own."""
        return log.fenced_term >= assignment.term and not mutations.active(SAME_TERM_RECOVERY)

    async def _reassign(self, pchannel: str, term: int) -> None:
        if self._reassigning.get(pchannel) == term:
            return
        clock = asyncio.get_running_loop()
        retry = self._reassign_retry.get(pchannel)
        if retry is not None and retry[0] != term:
            retry = None  # the term moved on: a fresh start
        if retry is not None and clock.time() < retry[1]:
            return
        self._reassigning[pchannel] = term
        logger.info(
            "%s: owner at term %d is not serving here; asking for term %d", pchannel, term, term + 1
        )
        try:
            await self.view.reassign_to_self(pchannel, term)
        except Exception as error:  # noqa: BLE001 - asked again after the backoff
            first, last = REASSIGN_BACKOFF_S
            backoff = first if retry is None else min(last, retry[2] * 2)
            logger.info(
                "%s: reassign failed (asking again in %.1f s): %r", pchannel, backoff, error
            )
            self._reassign_retry[pchannel] = (term, clock.time() + backoff, backoff)
            self._reassigning.pop(pchannel, None)
        else:
            self._reassign_retry.pop(pchannel, None)

    async def close(self) -> None:
        self._closed = True
        for task in self._flushing.values():
            task.cancel()
        self._flushing.clear()
        for owner in list(self.owners.values()):
            await owner.close("closed")
        self.owners.clear()
        for log in list(self.logs.values()):
            with contextlib.suppress(Exception):
                await log.close()
        for opener in self._openers.values():
            with contextlib.suppress(Exception):
                await opener.close()
        self._openers.clear()
        self.catalog.close()
        for fd in self._locks.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor releases its flock
        self._locks.clear()
