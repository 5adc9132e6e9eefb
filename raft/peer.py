"""RaftPeer: a durable pysyncobj peer that replicates opaque command bytes.

Lives here: `RaftPeer` (propose / propose_async, leadership transfer, leadership and index
queries, status, close), its tuning knobs (`RaftTuning`) and the durability events tests observe
(`DurabilityEvent`). The peer owns `data_dir/`: `journal.log`, `journal.meta` and
`snapshot.bin`. It drives pysyncobj's tick itself (autoTick off) so that it can sync the
journal at the right points:

- before every poll (after pysyncobj appended this tick's commands, and after it pushed them
  to the followers): the leader's group commit, so it never counts itself toward a commit
  index for an entry that is not durable;
- after every poll: the follower's group commit, then the held-back AppendEntries
  acknowledgements leave (see `AckGate`).

`raft/DURABILITY.md` gives the route with the pysyncobj source lines it relies on.

The tick runs on the peer's own tick thread, or (`RaftTuning.tick_on_event_loop`, an
experiment, off by default) on an asyncio event loop: the same tick with the same sync
points, woken by that loop instead of blocking in poll. "The tick thread" below is then the
loop's thread, and the fsyncs, applies and snapshots block that loop while they run.

Contract with the application (the three callables):
- `apply(command, raft_index) -> bytes` runs on the peer's tick thread (the recovery replay
  inside the constructor runs on the constructing thread), in log order, once per committed
  entry, and only after the entry is durable in this peer's journal. Indexes
  strictly increase but have gaps (pysyncobj's own no-op entries are not passed on). After a
  restart the peer first calls `restore_snapshot` (if there is a snapshot) and then `apply`
  for every committed entry after it: the application's state is rebuilt, not trusted.
- `take_snapshot() -> bytes` runs on the tick thread between two applies; its bytes must
  reflect exactly the entries applied so far. `restore_snapshot(bytes)` replaces the whole
  state (at start, or when a leader installs a snapshot on a lagging follower).
- None of them may block for long (heartbeats stop meanwhile), read clocks or randomness,
  or raise: an exception is a bug, and it stops the peer (`FatalPeerError`, `on_fatal`).

Must never: pickle application data, acknowledge an entry before it is durable on a
majority (leader included), forward proposals silently (a follower answers `NotLeader`),
run an unbounded queue, wait or retry, or start without a password (the cluster secret),
on any address: pysyncobj unpickles what an authenticated peer sends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import heapq
import ipaddress
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObjConf, SyncObjException
from pysyncobj.node import TCPNode

from raft._pysyncobj_glue import (
    STATE_NAMES,
    AckGate,
    LoopPoller,
    PortGuard,
    PortLimits,
    RaftwalSyncObj,
    Wakeup,
    check_pysyncobj_version,
    install_log_filter,
    lease_clock,
)
from raft.errors import (
    ChangeRefused,
    FatalPeerError,
    LeadershipUnconfirmed,
    NotLeader,
    Overloaded,
    PeerClosed,
    RaftError,
    UnknownOutcome,
)
from raft.journal import DurableJournal
from raft.reserve import DiskReserve
from raft.snapshot import (
    SNAPSHOT_FILE_NAME,
    align_journal_with_snapshot,
    encode_snapshot,
    read_snapshot_file,
    remove_stale_temp_files,
    write_snapshot_tmp,
)

logger = logging.getLogger(__name__)

_LEADER_STATE = 2
# The cluster secret keys the Raft transport's encryption and authentication (Fernet, via
# pysyncobj): anything shorter is guessable by brute force.
MIN_PASSWORD_CHARS = 16
# `RaftTuning.tick_on_event_loop`'s default: "1" ticks every peer on an event loop (an
# experiment, see docs/benchmarks-history.md); read here only.
TICK_ON_EVENT_LOOP_ENV = "RAFTWAL_RAFT_TICK_ON_LOOP"


def _tick_on_event_loop_default() -> bool:
    return os.environ.get(TICK_ON_EVENT_LOOP_ENV, "") == "1"


# A loop-ticked leader pushes a commit index that is all that changed this many loop
# iterations after the tick that advanced it (see RaftPeer._before_poll).
_COMMIT_PUSH_DEFER_ITERATIONS = 2

# After this many consecutive failed ticks (pysyncobj raised something unexpected) the
# peer stops instead of spinning on the same error.
_MAX_CONSECUTIVE_TICK_FAILURES = 50


@dataclass(frozen=True)
class RaftTuning:
    """Knobs, with defaults tuned for a three-node cluster on a low-latency network.

    Latency: a proposal wakes the tick thread at once and is pushed to the followers in the
    same tick, so an idle cluster answers in about one fsync plus one round trip; under load,
    everything proposed during one tick forms one batch, one fsync per node.
    """

    # Poll timeout of the tick loop: the granularity of timers (heartbeats, elections,
    # proposal timeouts). Network events and proposals wake it earlier.
    tick_period_s: float = 0.02
    # The longest poll of a follower with nothing pending (no proposal, read or membership
    # change of its own): it polls until its election deadline, at most this long. Its
    # leader's heartbeats and any request wake it earlier; the cap bounds how late its
    # connection retries and timeouts run. An idle follower then wakes for its leader's
    # heartbeats only instead of every tick period as well (about a third of the wakeups).
    idle_tick_period_s: float = 0.1
    # Leader heartbeat period; must be < election_timeout_min_s / 3 (pysyncobj checks).
    heartbeat_period_s: float = 0.05
    election_timeout_min_s: float = 0.4
    election_timeout_max_s: float = 1.2
    # A connection with no traffic for this long is dead; >= election_timeout_max_s.
    connection_timeout_s: float = 2.0
    connection_retry_s: float = 0.5
    # A leader that heard from no majority for this long steps down (pysyncobj default 30 s
    # would keep a partitioned leader accepting proposals that time out).
    leader_fallback_timeout_s: float = 2.0
    max_command_bytes: int = 1 << 20
    # Kept above max_command_bytes so pysyncobj never takes its chunked single-entry path
    # (syncobj.py lines 1275-1296), whose last-chunk test is wrong for some sizes.
    max_append_entries_bytes: int = 4 << 20
    max_pending_proposals: int = 10_000
    max_timeout_s: float = 300.0
    snapshot_every_entries: int = 10_000
    snapshot_max_interval_s: float = 600.0
    socket_buffer_bytes: int = 1 << 18
    # The Raft port before authentication (raft/_pysyncobj_glue.PortLimits): the largest
    # frame from an authenticated peer (0: derived from the two limits above, encrypted),
    # the largest one before (the handshake's are a few hundred bytes), the time a new
    # connection has to authenticate, and how many unauthenticated ones may be open.
    max_frame_bytes: int = 0
    max_unauthenticated_frame_bytes: int = 64 << 10
    auth_timeout_s: float = 2.0
    max_unauthenticated_connections: int = 32
    bind_retries: int = 10
    bind_retry_s: float = 0.1
    close_timeout_s: float = 10.0
    # The vote guard: a voter that heard from its leader less than this fraction of
    # election_timeout_min_s ago ignores RequestVote (except the election a leadership
    # transfer starts). Below 1, so it never delays the election after a leader died (no
    # follower times out sooner than election_timeout_min_s). The leader's lease relies
    # on it at every voter: keep it the same across the cluster. A leader that a majority
    # answered within the guard ignores RequestVote too (CheckQuorum), and the guard also
    # decides who refuses a pre-vote (`pre_vote`).
    vote_guard_fraction: float = 0.75
    # PreVote (Raft thesis 9.6): a follower whose election timeout passed asks for
    # pre-votes at term + 1 and raises its term only once a majority would vote for it;
    # a voter that heard from a live leader within the vote guard refuses (so does the
    # leader itself while a majority answers it). Every voter of a cluster must run the
    # same setting: a node without it never grants a pre-vote.
    pre_vote: bool = True
    # Lease reads (`RaftPeer.lease_read_index`): a leader that a majority answered within
    # the last vote_guard_s * (1 - max_clock_drift) serves linearizable reads without a
    # heartbeat round. max_clock_drift bounds how much faster or slower any voter's
    # clock (CLOCK_MONOTONIC_RAW, not slewed by NTP: `lease_clock`) may run than the
    # leader's over one guard window; oscillators differ by well under 0.1%.
    lease_reads: bool = True
    max_clock_drift: float = 0.1
    # Where pysyncobj's tick runs. False: on the peer's own tick thread, which blocks in
    # poll and hands results to the event loop (`LoopMailbox`). True (an experiment,
    # default from $RAFTWAL_RAFT_TICK_ON_LOOP=1): on the asyncio event loop running on the
    # constructing thread (or, without one, on a loop the peer runs on a thread of its
    # own), woken by its sockets (`LoopPoller`), by proposals and by a tick_period_s timer.
    # The same tick, the same journal syncs and AckGate flushes in the same order; the
    # fsyncs and applies then block that loop while they run.
    tick_on_event_loop: bool = field(default_factory=_tick_on_event_loop_default)

    def vote_guard_s(self) -> float:
        return self.vote_guard_fraction * self.election_timeout_min_s

    def lease_s(self) -> float:
        """How long after the send of an AppendEntries a majority answered the leader
        serves lease reads (0: lease reads are off)."""
        if not self.lease_reads:
            return 0.0
        return self.vote_guard_s() * (1 - self.max_clock_drift)

    def validate(self) -> None:
        def check(ok: bool, name: str, value: object, expected: str) -> None:
            if not ok:
                raise ValueError(f"invalid {name} ({value!r}; expected {expected})")

        check(0 < self.tick_period_s <= 1, "tick_period_s", self.tick_period_s, "0 < x <= 1")
        check(
            0 < self.idle_tick_period_s <= 1,
            "idle_tick_period_s",
            self.idle_tick_period_s,
            "0 < x <= 1; at most tick_period_s turns the longer idle polls off",
        )
        check(
            0 < self.heartbeat_period_s * 3 < self.election_timeout_min_s,
            "heartbeat_period_s",
            self.heartbeat_period_s,
            f"0 < x < election_timeout_min_s / 3 = {self.election_timeout_min_s / 3}",
        )
        check(
            self.election_timeout_max_s > self.election_timeout_min_s,
            "election_timeout_max_s",
            self.election_timeout_max_s,
            f"> election_timeout_min_s = {self.election_timeout_min_s}",
        )
        check(
            self.connection_timeout_s >= self.election_timeout_max_s,
            "connection_timeout_s",
            self.connection_timeout_s,
            f">= election_timeout_max_s = {self.election_timeout_max_s}",
        )
        check(
            self.leader_fallback_timeout_s > self.heartbeat_period_s,
            "leader_fallback_timeout_s",
            self.leader_fallback_timeout_s,
            f"> heartbeat_period_s = {self.heartbeat_period_s}",
        )
        check(self.connection_retry_s >= 0, "connection_retry_s", self.connection_retry_s, ">= 0")
        check(self.max_command_bytes > 0, "max_command_bytes", self.max_command_bytes, "> 0")
        check(
            self.max_append_entries_bytes > self.max_command_bytes + 1024,
            "max_append_entries_bytes",
            self.max_append_entries_bytes,
            f"> max_command_bytes + 1024 = {self.max_command_bytes + 1024}",
        )
        check(
            self.max_pending_proposals > 0,
            "max_pending_proposals",
            self.max_pending_proposals,
            "> 0",
        )
        check(self.max_timeout_s > 0, "max_timeout_s", self.max_timeout_s, "> 0")
        check(
            self.snapshot_every_entries >= 2,
            "snapshot_every_entries",
            self.snapshot_every_entries,
            ">= 2",
        )
        check(
            self.snapshot_max_interval_s > 0,
            "snapshot_max_interval_s",
            self.snapshot_max_interval_s,
            "> 0",
        )
        check(
            self.max_frame_bytes == 0 or self.max_frame_bytes >= self.derived_max_frame_bytes(),
            "max_frame_bytes",
            self.max_frame_bytes,
            f"0 (derived) or >= {self.derived_max_frame_bytes()} (the largest batch, encrypted)",
        )
        check(
            1024 <= self.max_unauthenticated_frame_bytes <= 1 << 20,
            "max_unauthenticated_frame_bytes",
            self.max_unauthenticated_frame_bytes,
            "1024..1048576",
        )
        check(0 < self.auth_timeout_s <= 60, "auth_timeout_s", self.auth_timeout_s, "0 < x <= 60")
        check(
            1 <= self.max_unauthenticated_connections <= 4096,
            "max_unauthenticated_connections",
            self.max_unauthenticated_connections,
            "1..4096",
        )
        check(self.bind_retries > 0, "bind_retries", self.bind_retries, "> 0")
        check(self.bind_retry_s > 0, "bind_retry_s", self.bind_retry_s, "> 0")
        check(self.close_timeout_s > 0, "close_timeout_s", self.close_timeout_s, "> 0")
        check(
            0 <= self.vote_guard_fraction < 1,
            "vote_guard_fraction",
            self.vote_guard_fraction,
            "0 <= x < 1",
        )
        check(0 < self.max_clock_drift < 1, "max_clock_drift", self.max_clock_drift, "0 < x < 1")
        check(
            not self.lease_reads or self.lease_s() > 2 * self.heartbeat_period_s,
            "lease_reads",
            self.lease_reads,
            f"False, or a lease (vote_guard_fraction * election_timeout_min_s * (1 - "
            f"max_clock_drift) = {self.lease_s():g} s) longer than two heartbeats "
            f"({2 * self.heartbeat_period_s:g} s)",
        )

    def derived_max_frame_bytes(self) -> int:
        """The largest frame an authenticated peer sends: an AppendEntries batch (or a
        snapshot chunk) fills up to max_append_entries_bytes and may overshoot by one
        command, plus pickling; zlib may grow incompressible data a little, and Fernet
        encodes in base64 (4/3) with a small envelope."""
        raw = self.max_append_entries_bytes + self.max_command_bytes + (64 << 10)
        return raw * 4 // 3 + (64 << 10)

    def port_limits(self) -> PortLimits:
        return PortLimits(
            max_frame_bytes=self.max_frame_bytes or self.derived_max_frame_bytes(),
            max_unauthenticated_frame_bytes=self.max_unauthenticated_frame_bytes,
            auth_timeout_s=self.auth_timeout_s,
            max_unauthenticated_connections=self.max_unauthenticated_connections,
        )


@dataclass(frozen=True)
class DurabilityEvent:
    """Emitted on the tick thread, in the order things happen (for ordering tests).

    kind: "synced" (every entry <= index is durable here), "ack_sent" (this follower is
    about to tell the leader it holds every entry <= index), "commit" (this leader just
    advanced its commit index to index).
    """

    node: str
    kind: str
    index: int


@dataclass
class _Pending:
    future: concurrent.futures.Future[bytes]
    timeout_s: float


@dataclass
class _ReadIndex:
    """A linearizable read waiting on the tick thread.

    Leader reads (`read_index`) go through: registered -> marked (term, commit index and
    the heartbeat counters noted, one AppendEntries round sent) -> confirmed (a majority,
    this peer included, answered a message sent after the mark, still in that term) ->
    applied (lastApplied >= index) -> resolved with the index. `wait_applied` requests
    start confirmed with a given index.
    """

    future: concurrent.futures.Future[int]
    deadline: float
    timeout_s: float
    index: int = -1
    term: int = -1
    mark: dict[str, int] | None = None
    confirmed: bool = False


class LoopMailbox:
    """Hands callables from other threads to one event loop, waking it once per batch.

    `loop.call_soon_threadsafe` writes to the loop's self-pipe on every call; the tick
    thread settles several things per tick (proposal outcomes, read indexes, the applied
    notifier), so each of them cost a wakeup and a pipe write. Posts made while a drain is
    already scheduled ride along with it: one wakeup per tick, whatever was settled in it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._scheduled = False
        self.wakeups = 0
        self.posts = 0

    def post(self, function: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._items.append((function, args))
            self.posts += 1
            if self._scheduled:
                return
            self._scheduled = True
            self.wakeups += 1
        try:
            if threading.get_ident() == getattr(self._loop, "_thread_id", None):
                # Posted on the loop's own thread (a peer ticked on the loop): no need to
                # write to its self-pipe.
                self._loop.call_soon(self._drain)
            else:
                self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            logger.debug("event loop closed; %d posted callbacks dropped", len(self._items))

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for function, args in items:
            try:
                function(*args)
            except Exception:  # noqa: BLE001 (one bad callback must not drop the others)
                logger.exception("posted callback failed")


_mailboxes: dict[asyncio.AbstractEventLoop, LoopMailbox] = {}
_mailboxes_lock = threading.Lock()


def loop_mailbox(loop: asyncio.AbstractEventLoop) -> LoopMailbox:
    """The mailbox of `loop` (one per loop, shared by every peer and listener)."""
    with _mailboxes_lock:
        mailbox = _mailboxes.get(loop)
        if mailbox is None:
            # Closed loops are dropped here, so the table stays as small as the live loops.
            for old in [old for old in _mailboxes if old.is_closed()]:
                del _mailboxes[old]
            mailbox = _mailboxes[loop] = LoopMailbox(loop)
        return mailbox


async def _awaited(future: concurrent.futures.Future[Any]) -> Any:
    """Await a future settled on the tick thread, delivered through the loop's mailbox.
    Cancelling the await leaves the future to settle unobserved."""
    loop = asyncio.get_running_loop()
    mailbox = loop_mailbox(loop)
    waiter: asyncio.Future[Any] = loop.create_future()
    loop_thread = threading.get_ident()

    def settle(done: concurrent.futures.Future[Any]) -> None:
        if waiter.done():
            return  # the awaiting task was cancelled
        exception = done.exception()
        if exception is not None:
            waiter.set_exception(exception)
        else:
            waiter.set_result(done.result())

    def deliver(done: concurrent.futures.Future[Any]) -> None:
        # Settled on this loop's own thread (a peer ticked on it, or already settled):
        # no hand-off needed.
        if threading.get_ident() == loop_thread:
            settle(done)
        else:
            mailbox.post(settle, done)

    future.add_done_callback(deliver)
    return await waiter


class _LoopTicker:
    """Schedules a loop-ticked peer's ticks (`RaftTuning.tick_on_event_loop`): at most one
    tick queued at a time, on a socket event (`LoopPoller`), a proposal or read from any
    thread (`notify`, the tick thread's `Wakeup` counterpart), or every `period_s`."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, tick: Callable[[], None], period_s: float
    ) -> None:
        self.loop = loop
        self._tick = tick
        self._period_s = period_s
        self._scheduled = False
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        # The loop's thread (None until a loop of the peer's own starts running).
        self.thread_id: int | None = None

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def notify(self) -> None:
        """Any thread: tick soon. A notify that sees a tick queued needs none of its own:
        that tick clears the flag before it drains pysyncobj's command queue."""
        if self._scheduled or self._closed:
            return
        self._scheduled = True
        try:
            if self.on_loop_thread():
                self.loop.call_soon(self._run)
            else:
                self.loop.call_soon_threadsafe(self._run)
        except RuntimeError:
            logger.debug("event loop closed; raft tick not scheduled")

    def notify_after(self, iterations: int) -> None:
        """On the loop's thread: tick after `iterations` (>= 1) loop iterations."""
        if iterations <= 1:
            self.notify()
        else:
            self.loop.call_soon(self.notify_after, iterations - 1)

    def _run(self) -> None:
        self._scheduled = False
        if not self._closed:
            self._tick()

    def start(self) -> None:
        """On the loop's thread, or before the loop runs."""
        self._timer = self.loop.call_later(self._period_s, self._on_timer)

    def _on_timer(self) -> None:
        if self._closed:
            return
        self._timer = self.loop.call_later(self._period_s, self._on_timer)
        self.notify()

    def close(self) -> None:
        """On the loop's thread (or with the loop stopped)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _host_of(address: str) -> str:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"invalid address {address!r} (expected host:port)")
    return host.strip("[]")


def is_loopback_address(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost (with any port)."""
    host = _host_of(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RaftPeer:
    """One member of a Raft cluster replicating opaque command bytes (see module doc)."""

    def __init__(
        self,
        self_address: str,
        partner_addresses: Sequence[str],
        data_dir: Path,
        apply: Callable[[bytes, int], bytes],
        take_snapshot: Callable[[], bytes],
        restore_snapshot: Callable[[bytes], None],
        *,
        password: str | None = None,
        tuning: RaftTuning | None = None,
        durable: bool = True,
        bind_address: str | None = None,
        partner_dial_addresses: Mapping[str, str] | None = None,
        on_fatal: Callable[[FatalPeerError], None] | None = None,
        durability_observer: Callable[[DurabilityEvent], None] | None = None,
        voter: bool = True,
        reserve: DiskReserve | None = None,
    ) -> None:
        """Open (or create) `data_dir`, recover, bind and start ticking.

        `voter=False` makes a non-voting member (pysyncobj's read-only node): it binds no
        port, dials the voters (`partner_addresses`), receives and durably applies the
        committed log like a follower, never votes, never counts toward a commit or a read
        quorum, and never leads; `propose` answers NotLeader with the leader's address.
        `self_address` is then only its name in logs and status.

        On return the peer has restored its snapshot and applied every entry its durable
        commit index covers. `durable=False` skips every fsync: unsafe, for benchmarks only.
        `partner_dial_addresses` maps a partner's address (its identity) to where this
        peer connects to it instead (a proxy in front of it); absent partners are dialled
        at their own address. `reserve` is the disk space the journal, its metadata and
        snapshots fall back on when the disk is full (`raft.reserve`). Raises ValueError
        for bad arguments (including a missing or short password), JournalCorrupted /
        SnapshotCorrupted for unreadable state, OSError when the port cannot be bound.
        """
        check_pysyncobj_version()
        install_log_filter()
        tuning = tuning or RaftTuning()
        tuning.validate()
        partners = [address for address in partner_addresses if address != self_address]
        # Any peer may be named, not only today's partners: a member added later is
        # dialled through this map too.
        dial_addresses = dict(partner_dial_addresses or {})
        if self_address in dial_addresses:
            raise ValueError(
                f"invalid partner_dial_addresses (names this peer, {self_address}; expected "
                "other peers only)"
            )
        for address in [self_address, *partners, *dial_addresses.values()]:
            _host_of(address)
        if not password:
            raise ValueError(
                "refusing to start without a cluster secret (password): pysyncobj unpickles "
                "what peers send, so an unauthenticated Raft port, loopback included, runs "
                "code for anyone who can reach it"
            )
        if len(password) < MIN_PASSWORD_CHARS:
            raise ValueError(
                f"invalid password (too short: {len(password)} chars; expected >= "
                f"{MIN_PASSWORD_CHARS}, e.g. 64 hex digits from `raftwal secret new`)"
            )

        self._self_address = self_address
        self._voter = voter
        self._data_dir = Path(data_dir)
        self._apply = apply
        self._take_snapshot = take_snapshot
        self._restore_snapshot = restore_snapshot
        self._tuning = tuning
        self._durable = durable
        self._reserve = reserve
        self._on_fatal = on_fatal
        self._observer = durability_observer

        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._proposal_ids = itertools.count(1)
        self._closed = False
        self._stop = threading.Event()
        self._fatal: FatalPeerError | None = None
        self._tick_failures = 0
        self._tick_errors_total = 0
        self._safety_net_syncs = 0
        self._snapshot_index = 0
        self._snapshots_written = 0
        self._sent_marker: tuple[int, int, int] = (-1, -1, -1)
        self._commit_push_due = False
        self._thread: threading.Thread | None = None
        # tick_on_event_loop: the ticker, whether the peer runs that loop itself (on
        # self._thread), and whether the loop's ticking has ended.
        self._ticker: _LoopTicker | None = None
        self._own_loop = False
        self._loop_done = False
        self._loop_poller: LoopPoller | None = None
        if tuning.tick_on_event_loop:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = asyncio.new_event_loop()
                self._own_loop = True
            self._ticker = _LoopTicker(loop, self._loop_tick, tuning.tick_period_s)
            if not self._own_loop:
                self._ticker.thread_id = threading.get_ident()
            self._loop_poller = LoopPoller(loop, self._ticker.notify)
        # At most one leadership transfer request waits for the tick thread.
        self._transfer: concurrent.futures.Future[bool] | None = None
        # While a transfer is under way the leader appends nothing new (monotonic time):
        # the target must hold the whole log when it calls its election, or the others
        # refuse their votes and this peer, whose election deadline ran out while it led,
        # starts an election of its own at once and takes the leadership back.
        self._proposals_paused_until = 0.0
        # Linearizable reads: new ones (any thread, under _lock) and those the tick thread
        # works on (tick thread only).
        self._new_reads: list[_ReadIndex] = []
        self._reads: list[_ReadIndex] = []
        self.read_rounds = 0
        # The leader's lease: (term, monotonic time it ends), published by the tick thread
        # and read by any thread in lease_read_index; None when there is none. A term in
        # which this peer started a leadership transfer has no lease any more, and
        # _lease_commit_term is the term whose own first entry is known committed.
        self._lease_s = tuning.lease_s()
        self._lease: tuple[int, float] | None = None
        self._lease_revoked_term = -1
        self._lease_commit_term = -1
        self.lease_reads = 0
        # The voter set (addresses, this peer's own included when it votes) and whether a
        # membership entry is uncommitted; written on the tick thread, read anywhere.
        self._voters: tuple[str, ...] = ()
        self._membership_pending = False
        self._membership_changed = False

        self._data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        remove_stale_temp_files(self._data_dir)
        snapshot_path = self._data_dir / SNAPSHOT_FILE_NAME
        # Verify the snapshot before pysyncobj sees it: pysyncobj swallows load failures
        # (syncobj.py line 1510) and would then stall with nothing applied.
        snapshot = read_snapshot_file(snapshot_path, durable=durable)
        self._journal = DurableJournal(
            self._data_dir,
            durable=durable,
            on_synced=self._on_synced,
            before_truncate=self._before_truncate,
            on_commit_index=self._on_commit_index,
            reserve=reserve,
        )
        self._started_syncobj: RaftwalSyncObj | None = None
        self._started_wakeup: Wakeup | None = None
        try:
            if snapshot is not None:
                align_journal_with_snapshot(self._journal, snapshot)
                self._snapshot_index = snapshot.raft_index
            self._gate = AckGate(durable=durable, on_ack_sent=self._on_ack_sent)
            self._port_guard = PortGuard(tuning.port_limits())
            conf = self._make_conf(tuning, password, bind_address or self_address, snapshot_path)
            try:
                syncobj = RaftwalSyncObj(
                    self_address if voter else None,
                    partners,
                    conf,
                    self._apply_entry,
                    self._gate,
                    self._port_guard,
                    dial_addresses,
                    own_address=self_address,
                    poller=self._loop_poller,
                )
            except SyncObjException as exc:
                raise OSError(f"cannot bind the raft port of {self_address}: {exc}") from exc
            self._syncobj = self._started_syncobj = syncobj
            syncobj.raftwal_install_journal(self._journal, self._snapshot_index, voter)
            self._gate.attach(self._journal, syncobj.raftwal_transport())
            self._rounds = syncobj.raftwal_transport().raftwal_rounds
            self._rounds.on_answer = self._on_answer
            syncobj.raftwal_transport().raftwal_vote_guard_s = tuning.vote_guard_s()
            syncobj.raftwal_pre_vote = tuning.pre_vote
            self._wakeup: Wakeup | _LoopTicker
            if self._ticker is None:
                self._wakeup = self._started_wakeup = Wakeup(syncobj._poller)
            else:
                self._wakeup = self._ticker
            syncobj.addOnTickCallback(self._before_poll)
            syncobj.addOnTickCallback(self._run_transfer)
            # The first tick loads the snapshot and applies the committed journal suffix;
            # run it here so a failure surfaces from the constructor, not on a thread.
            self._tick_once(0.0)
            if self._fatal is not None:
                raise self._fatal
            # The voter set is the last one in the log, committed or not (the replay
            # applied the committed changes).
            syncobj.raftwal_apply_uncommitted_membership()
            syncobj.raftwal_on_membership = self._on_membership
            self._refresh_membership()
        except BaseException:
            self._shutdown_syncobj()
            self._journal.close()
            if self._loop_poller is not None:
                self._loop_poller.close()
            if self._ticker is not None and self._own_loop:
                self._ticker.loop.close()
            raise
        if self._ticker is None:
            self._thread = threading.Thread(
                target=self._run, name=f"raft-tick-{self_address}", daemon=True
            )
            self._thread.start()
        else:
            self._ticker.start()
            if self._own_loop:
                self._thread = threading.Thread(
                    target=self._run_own_loop, name=f"raft-loop-{self_address}", daemon=True
                )
                self._thread.start()
        logger.info(
            "raft peer %s started (%s; partners %s, durable=%s, commit %d, applied %d%s)",
            self_address,
            "voter" if voter else "non-voting",
            ", ".join(partners) or "none",
            durable,
            self.commit_index(),
            self.last_applied_index(),
            "" if self._ticker is None else ", ticked on the event loop",
        )

    def _make_conf(
        self, tuning: RaftTuning, password: str | None, bind_address: str, snapshot_path: Path
    ) -> SyncObjConf:
        return SyncObjConf(
            autoTick=False,
            password=password,
            # pysyncobj binds 0.0.0.0 unless told otherwise (transport.py line 273), which
            # would expose a loopback-only peer to the network.
            bindAddress=bind_address,
            journalFile=None,  # replaced by DurableJournal right after construction
            fullDumpFile=str(snapshot_path),
            serializer=self._serialize,
            deserializer=self._deserialize,
            appendEntriesUseBatch=True,
            appendEntriesPeriod=tuning.heartbeat_period_s,
            appendEntriesBatchSizeBytes=tuning.max_append_entries_bytes,
            raftMinTimeout=tuning.election_timeout_min_s,
            raftMaxTimeout=tuning.election_timeout_max_s,
            connectionTimeout=tuning.connection_timeout_s,
            connectionRetryTime=tuning.connection_retry_s,
            leaderFallbackTimeout=tuning.leader_fallback_timeout_s,
            commandsWaitLeader=False,
            commandsQueueSize=tuning.max_pending_proposals,
            logCompactionMinEntries=tuning.snapshot_every_entries,
            logCompactionMinTime=tuning.snapshot_max_interval_s,
            sendBufferSize=tuning.socket_buffer_bytes,
            recvBufferSize=tuning.socket_buffer_bytes,
            bindRetryTime=tuning.bind_retry_s,
            maxBindRetries=tuning.bind_retries,
            onStateChanged=self._on_state_changed,
            # Voters are added and removed through the log (change_membership); the
            # overrides in raft/_pysyncobj_glue.py keep that durable and proxy-aware.
            dynamicMembershipChange=True,
        )

    # ---------------------------------------------------------------- proposing

    def propose(self, command: bytes, timeout_s: float) -> concurrent.futures.Future[bytes]:
        """Replicate `command`; the future resolves to what `apply` returned on this node.

        Fails (through the future) with NotLeader at once on a non-leader, Overloaded when
        the pending-proposal bound is hit, UnknownOutcome when no outcome is known within
        `timeout_s` or leadership is lost after the append (the command may still commit),
        PeerClosed after close() or a fatal error. Raises TypeError / ValueError for bad
        arguments. Done-callbacks run on the tick thread: keep them short.
        """
        if type(command) is not bytes:
            raise TypeError(f"command must be bytes (got {type(command).__name__})")
        if len(command) > self._tuning.max_command_bytes:
            raise ValueError(
                f"command too large ({len(command)} bytes; expected <= "
                f"{self._tuning.max_command_bytes})"
            )
        if not 0 < timeout_s <= self._tuning.max_timeout_s:
            raise ValueError(
                f"invalid timeout_s ({timeout_s!r}; expected 0 < x <= {self._tuning.max_timeout_s})"
            )
        return self._submit(
            timeout_s, lambda callback: self._syncobj.raftwal_apply(command, callback=callback)
        )

    def _submit(
        self, timeout_s: float, send: Callable[[Callable[[Any, int], None]], None]
    ) -> concurrent.futures.Future[bytes]:
        """Register a pending proposal and hand it to pysyncobj through `send(callback)`
        (a command or a membership change); the future settles like ``propose``'s."""
        future: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        # Running futures cannot be cancelled: a proposal cannot be taken back.
        future.set_running_or_notify_cancel()
        if self._closed or self._fatal is not None:
            future.set_exception(PeerClosed(f"raft peer {self._self_address} is not running"))
            return future
        if not self.is_leader():
            future.set_exception(NotLeader(self.leader_address()))
            return future
        with self._lock:
            # Checked again under the lock that _fail_all_pending takes: a proposal either
            # registers before close()/a fatal error fails everything pending, or sees it.
            if self._closed or self._fatal is not None:
                future.set_exception(PeerClosed(f"raft peer {self._self_address} is not running"))
                return future
            if time.monotonic() < self._proposals_paused_until:
                # Leadership is moving (transfer_leadership): ask the next leader.
                future.set_exception(NotLeader(None))
                return future
            if len(self._pending) >= self._tuning.max_pending_proposals:
                future.set_exception(
                    Overloaded(
                        f"{len(self._pending)} proposals pending (max_pending_proposals="
                        f"{self._tuning.max_pending_proposals})"
                    )
                )
                return future
            proposal_id = next(self._proposal_ids)
            self._pending[proposal_id] = _Pending(future, timeout_s)
            heapq.heappush(self._deadlines, (time.monotonic() + timeout_s, proposal_id))
        send(functools.partial(self._on_command_result, proposal_id))
        self._wakeup.notify()
        return future

    async def propose_async(self, command: bytes, timeout_s: float) -> bytes:
        """`propose`, awaited: the result crosses from the tick thread to the running loop
        through its `LoopMailbox` (one wakeup per tick for everything settled in it).
        Cancelling the await does not cancel the proposal."""
        result: bytes = await _awaited(self.propose(command, timeout_s))
        return result

    # ------------------------------------------------------------ linearizable reads

    def read_index(self, timeout_s: float) -> concurrent.futures.Future[int]:
        """ReadIndex (Raft thesis 6.4): the future resolves to an index such that this
        peer's applied state at that index reflects every entry committed before the call.

        The leader notes its commit index (once an entry of its own term is committed),
        sends one AppendEntries round and waits until a majority, itself included, answered
        a message of that round in the same term, then until it has applied the index.
        No log entry, no fsync. Reads arriving in the same tick share one round.
        Fails with NotLeader on a non-leader or when leadership is lost meanwhile,
        LeadershipUnconfirmed after `timeout_s`, PeerClosed after close().
        """
        return self._register_read(_ReadIndex(concurrent.futures.Future(), 0.0, timeout_s), True)

    def wait_applied(self, index: int, timeout_s: float) -> concurrent.futures.Future[int]:
        """Resolves (to `index`) once this peer has applied every entry up to `index`, e.g.
        a read index obtained from the leader; LeadershipUnconfirmed after `timeout_s`."""
        read = _ReadIndex(concurrent.futures.Future(), 0.0, timeout_s, index=index)
        read.confirmed = True
        return self._register_read(read, False)

    def _register_read(
        self, read: _ReadIndex, needs_leader: bool
    ) -> concurrent.futures.Future[int]:
        if not 0 < read.timeout_s <= self._tuning.max_timeout_s:
            raise ValueError(
                f"invalid timeout_s ({read.timeout_s!r}; expected 0 < x <= "
                f"{self._tuning.max_timeout_s})"
            )
        read.future.set_running_or_notify_cancel()
        read.deadline = time.monotonic() + read.timeout_s
        if needs_leader and not self.is_leader():
            read.future.set_exception(NotLeader(self.leader_address()))
            return read.future
        with self._lock:
            if self._closed or self._fatal is not None:
                read.future.set_exception(
                    PeerClosed(f"raft peer {self._self_address} is not running")
                )
                return read.future
            if len(self._new_reads) + len(self._reads) >= self._tuning.max_pending_proposals:
                read.future.set_exception(
                    Overloaded(f"{len(self._new_reads) + len(self._reads)} reads pending")
                )
                return read.future
            self._new_reads.append(read)
        self._wakeup.notify()
        return read.future

    async def read_index_async(self, timeout_s: float) -> int:
        """`read_index`, awaited on the running loop (through its `LoopMailbox`)."""
        index: int = await _awaited(self.read_index(timeout_s))
        return index

    async def wait_applied_async(self, index: int, timeout_s: float) -> int:
        applied: int = await _awaited(self.wait_applied(index, timeout_s))
        return applied

    def _mark_reads(self) -> None:
        """Tick thread, before the poll: take new reads, mark them, send one round."""
        with self._lock:
            new, self._new_reads = self._new_reads, []
        syncobj = self._syncobj
        leader = syncobj._isLeader()
        term = syncobj.raftCurrentTerm
        marked = False
        for read in new:
            if read.confirmed:
                self._reads.append(read)
                continue
            if not leader:
                read.future.set_exception(NotLeader(self.leader_address()))
                continue
            self._reads.append(read)
        if leader:
            # Raft's rule: a leader knows the commit index only once an entry of its own
            # term is committed (pysyncobj appends a no-op when it wins, line 1213).
            commit_term_current = syncobj.raftwal_commit_term() == term
            for read in self._reads:
                if read.mark is None and not read.confirmed and commit_term_current:
                    if not marked:
                        mark = self._rounds.mark()
                        marked = True
                    read.index = syncobj.raftCommitIndex
                    read.term = term
                    read.mark = mark
            if marked:
                self.read_rounds += 1
                syncobj.raftwal_send_append_entries()
        self._check_reads()

    def lease_read_index(self) -> int | None:
        """A read index without a heartbeat round, or None (then use `read_index`).

        Any thread. While this peer leads with a valid lease, no other leader can exist
        (a majority answered it within the lease and ignores RequestVote for the vote
        guard, which is longer; `RaftTuning.max_clock_drift` bounds the clocks), so its
        commit index covers every write acknowledged before the call, as ReadIndex's does.
        The caller serves the read once `last_applied_index()` reaches the index
        (`wait_applied`). None when lease reads are off, this peer does not lead, its lease
        ran out or was given up for a leadership transfer, or no entry of its term is
        committed yet.
        """
        lease = self._lease
        if lease is None:
            return None
        term, until = lease
        syncobj = self._syncobj
        if lease_clock() >= until or not syncobj._isLeader() or syncobj.raftCurrentTerm != term:
            return None
        self.lease_reads += 1
        return int(syncobj.raftCommitIndex)

    def _on_answer(self) -> None:
        """Tick thread: a follower answered an AppendEntries of this term."""
        self._renew_lease()
        self._check_reads()

    def _renew_lease(self) -> None:
        """Tick thread: publish the lease the answers received so far prove."""
        if not self._lease_s:
            return
        syncobj = self._syncobj
        term = syncobj.raftCurrentTerm
        if not syncobj._isLeader() or term == self._lease_revoked_term:
            self._lease = None
            return
        if self._lease_commit_term != term:
            # Raft's rule, as for ReadIndex: a leader knows the commit index only once an
            # entry of its own term is committed.
            if syncobj.raftwal_commit_term() != term:
                return
            self._lease_commit_term = term
        needed = syncobj.raftwal_cluster_size() // 2  # a majority, this peer aside
        if needed == 0:
            start: float | None = lease_clock()
        elif self._rounds.term != term:
            return
        else:
            start = self._rounds.confirmed_since(syncobj.raftwal_voter_ids(), needed)
        if start is None:
            return
        until = start + self._lease_s
        current = self._lease
        if current is None or current[0] != term or until > current[1]:
            self._lease = (term, until)

    def _check_reads(self) -> None:
        """Tick thread: resolve, fail or expire waiting reads."""
        if not self._reads:
            return
        syncobj = self._syncobj
        leader = syncobj._isLeader()
        term = syncobj.raftCurrentTerm
        applied = syncobj.raftLastApplied
        majority = syncobj.raftwal_cluster_size() // 2 + 1
        now = time.monotonic()
        waiting: list[_ReadIndex] = []
        confirmations: dict[int, bool] = {}
        for read in self._reads:
            if read.future.done():
                continue
            if not read.confirmed:
                if not leader or (read.mark is not None and term != read.term):
                    read.future.set_exception(
                        NotLeader(self.leader_address(), "leadership lost during a read")
                    )
                    continue
                if read.mark is None:
                    # Waiting for this term's first commit (a fresh leader).
                    if now < read.deadline:
                        waiting.append(read)
                    else:
                        read.future.set_exception(
                            LeadershipUnconfirmed(
                                f"no entry of term {term} committed within {read.timeout_s}s"
                            )
                        )
                    continue
                key = id(read.mark)
                if key not in confirmations:
                    answered = self._rounds.answered_since(read.mark, syncobj.raftwal_voter_ids())
                    confirmations[key] = 1 + answered >= majority
                read.confirmed = confirmations[key]
            if read.confirmed and applied >= read.index:
                read.future.set_result(read.index)
                continue
            if now >= read.deadline:
                read.future.set_exception(
                    LeadershipUnconfirmed(
                        f"read not served within {read.timeout_s}s (leadership "
                        f"{'confirmed' if read.confirmed else 'unconfirmed'}, applied "
                        f"{applied}, read index {read.index})"
                    )
                )
                continue
            waiting.append(read)
        self._reads = waiting

    def _on_command_result(self, proposal_id: int, result: Any, error: int) -> None:
        with self._lock:
            pending = self._pending.pop(proposal_id, None)
        if pending is None:
            return  # already timed out (UnknownOutcome) or failed at close
        if error == FAIL_REASON.SUCCESS:
            pending.future.set_result(result)
            return
        pending.future.set_exception(self._error_for(error))

    def _error_for(self, error: int) -> RaftError:
        leader = self.leader_address()
        if error == FAIL_REASON.QUEUE_FULL:
            return Overloaded("pysyncobj command queue is full")
        if error in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
            return NotLeader(leader)
        if error == FAIL_REASON.DISCARDED:
            # A new leader overwrote the entry: it is not and will never be applied.
            return NotLeader(leader, f"entry discarded by a new leader (leader hint: {leader})")
        if error in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
            return UnknownOutcome(f"outcome unknown (pysyncobj reason {error})")
        if error == FAIL_REASON.REQUEST_DENIED:
            return ChangeRefused(
                "membership change refused: another change is not committed yet, or this "
                "leader has not committed an entry of its term yet"
            )
        return RaftError(f"proposal refused (pysyncobj reason {error})")

    def _expire_proposals(self) -> None:
        now = time.monotonic()
        expired: list[_Pending] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _deadline, proposal_id = heapq.heappop(self._deadlines)
                pending = self._pending.pop(proposal_id, None)
                if pending is not None:
                    expired.append(pending)
            # Deadlines of answered proposals linger in the heap; rebuild before it grows
            # far beyond the pending bound.
            if len(self._deadlines) > 2 * self._tuning.max_pending_proposals:
                self._deadlines = [d for d in self._deadlines if d[1] in self._pending]
                heapq.heapify(self._deadlines)
        for pending in expired:
            pending.future.set_exception(
                UnknownOutcome(
                    f"no outcome within {pending.timeout_s}s; the command may still commit"
                )
            )

    def _fail_all_pending(self, error: RaftError) -> None:
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
            self._deadlines.clear()
            reads, self._new_reads = self._new_reads, []
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            # The tick thread has stopped: nobody else touches _reads any more.
            reads += self._reads
            self._reads = []
        for item in pending:
            item.future.set_exception(error)
        for read in reads:
            if not read.future.done():
                read.future.set_exception(PeerClosed(f"raft peer stopped: {error}"))

    # ------------------------------------------------------- leadership transfer

    def transfer_leadership(self) -> concurrent.futures.Future[bool]:
        """Ask the most caught-up connected follower to start an election now (Raft
        TimeoutNow, pysyncobj's ``transferLeadership``), for a planned stop of this peer.

        The future resolves on the tick thread: True when the request was sent, False when
        no connected follower holds every entry of this leader's log yet (retry a moment
        later); it fails with NotLeader when this peer does not lead and PeerClosed after
        close(). Sent is not done: the transfer is complete once ``is_leader()`` is False
        and another leader is known. One request at a time: a second call while one waits
        returns the same future.

        From the call on, for one maximum election timeout, this peer accepts no new
        proposal (they fail with NotLeader and no leader hint, as while an election runs),
        so that the target can catch up and hold the whole log when it calls its election.
        A later call after that window opens a new one.
        """
        with self._lock:
            if self._transfer is not None and not self._transfer.done():
                return self._transfer
            now = time.monotonic()
            if now >= self._proposals_paused_until:
                self._proposals_paused_until = now + self._tuning.election_timeout_max_s
            future: concurrent.futures.Future[bool] = concurrent.futures.Future()
            future.set_running_or_notify_cancel()
            if self._closed or self._fatal is not None:
                future.set_exception(PeerClosed(f"raft peer {self._self_address} is not running"))
                return future
            self._transfer = future
        self._wakeup.notify()
        return future

    def _run_transfer(self) -> None:
        """Tick thread: pysyncobj's state may only be touched here."""
        with self._lock:
            future, self._transfer = self._transfer, None
        if future is None:
            return
        # The target's election bypasses the other voters' vote guard, so the lease that
        # guard backs ends here, before TimeoutNow can leave, for the rest of this term.
        self._lease_revoked_term = self._syncobj.raftCurrentTerm
        self._lease = None
        outcome: list[int] = []
        # pysyncobj answers synchronously (transferLeadership never queues).
        self._syncobj.transferLeadership(None, lambda _result, error: outcome.append(error))
        error = outcome[0] if outcome else FAIL_REASON.REQUEST_DENIED
        if error == FAIL_REASON.SUCCESS:
            logger.info("raft peer %s: leadership transfer requested", self._self_address)
            future.set_result(True)
        elif error == FAIL_REASON.NOT_LEADER:
            future.set_exception(NotLeader(self.leader_address()))
        else:
            future.set_result(False)

    # ------------------------------------------------------------------ queries

    def is_leader(self) -> bool:
        return bool(self._syncobj._isLeader())

    def leader_address(self) -> str | None:
        leader = self._syncobj._getLeader()
        return None if leader is None else str(leader.id)

    def knows_leader(self) -> bool:
        """True while this peer leads, or is connected to the leader it knows. pysyncobj
        keeps the last leader of a follower that is connected to nobody (it starts no
        election then), so the leader address alone does not say the node is in touch."""
        syncobj = self._syncobj
        if syncobj._isLeader():
            return True
        leader = syncobj._getLeader()
        return leader is not None and bool(syncobj.isNodeConnected(leader))

    def raft_term(self) -> int:
        return int(self._syncobj.raftCurrentTerm)

    def commit_index(self) -> int:
        return int(self._syncobj.raftCommitIndex)

    def last_applied_index(self) -> int:
        return int(self._syncobj.raftLastApplied)

    def synced_index(self) -> int:
        """Every journal entry at or below this index is durable on this node."""
        return self._journal.synced_index

    def wait_for_leader(self, timeout_s: float) -> str | None:
        """Poll (bounded by `timeout_s`) until some leader is known; its address or None."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader_address()
            if leader is not None or time.monotonic() >= deadline or self._fatal is not None:
                return leader
            time.sleep(0.01)

    def port_refusals(self) -> dict[str, int]:
        """Connections the Raft port closed before (or for lack of) authentication, by
        reason: frame_too_large, bad_frame, auth_timeout, too_many_unauthenticated."""
        return dict(self._port_guard.refusals)

    # ------------------------------------------------------------ membership change

    def voters(self) -> tuple[str, ...]:
        """The voting members' addresses, sorted, as this peer's log has them (the last
        membership entry in it, committed or not; this peer's own address when it votes)."""
        return self._voters

    def membership_pending(self) -> bool:
        """A membership entry is in this peer's log but not committed yet."""
        return self._membership_pending

    def change_membership(
        self, kind: str, address: str, timeout_s: float
    ) -> concurrent.futures.Future[None]:
        """Add (`kind="add"`) or remove (`"remove"`) one voter, on the leader: Raft's
        single-server change through pysyncobj's membership entries. The future resolves
        once the entry commits (the new set counts from its append on).

        Refused at once (ChangeRefused, nothing appended) when the change would change
        nothing, when it would remove this leader (transfer leadership first), or on the
        tick thread when another change is uncommitted or this leader has not committed
        an entry of its own term (the known pitfall of single-server changes after a
        leader change). An added peer must already follow the log (a non-voting peer
        restarted as a voter, or about to be): until it answers, it counts as down.
        NotLeader, UnknownOutcome, Overloaded and PeerClosed as for `propose`.
        """
        if kind not in ("add", "remove"):
            raise ValueError(f"invalid kind ({kind!r}; expected 'add' or 'remove')")
        _host_of(address)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        voters = set(self._voters)
        refusal = None
        if kind == "add" and address in voters:
            refusal = f"{address} is a voter already"
        elif kind == "remove" and address not in voters:
            refusal = f"{address} is not a voter"
        elif kind == "remove" and address == self._self_address:
            refusal = f"{address} leads: transfer the leadership before removing it"
        elif kind == "remove" and len(voters) <= 1:
            refusal = "refusing to remove the last voter"
        if refusal is not None:
            future.set_exception(ChangeRefused(refusal))
            return future

        def settle(done: concurrent.futures.Future[bytes]) -> None:
            error = done.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(None)

        entry = "add" if kind == "add" else "rem"
        self._submit(
            timeout_s,
            lambda callback: self._syncobj.raftwal_change_membership(entry, address, callback),
        ).add_done_callback(settle)
        return future

    def _on_membership(self) -> None:
        """Tick thread: pysyncobj changed the voter set (possibly only for a moment: a
        follower undoes and redoes the entries of an overlapping resend)."""
        self._membership_changed = True

    def _refresh_membership(self) -> None:
        """Tick thread, once per tick after the poll's messages (and the constructor):
        publish the voter set and whether a change is uncommitted."""
        self._membership_changed = False
        syncobj = self._syncobj
        voters = syncobj.raftwal_voter_ids()
        if self._voter:
            voters.add(self._self_address)
        self._membership_pending = syncobj.raftwal_membership_pending()
        previous, self._voters = self._voters, tuple(sorted(voters))
        if previous and previous != self._voters:
            logger.warning(
                "raft peer %s: voters now %s (were %s)",
                self._self_address,
                ", ".join(self._voters),
                ", ".join(previous),
            )

    def request_snapshot(self) -> None:
        """Ask for a snapshot + journal compaction at the next tick."""
        self._syncobj.forceLogCompaction()
        self._wakeup.notify()

    def quorum_in_reach(self) -> bool:
        """A majority of the voters is this peer (when it votes) and the partners it is
        connected to. False: nothing can commit, and no leader be elected, until others
        come back (the rest of the cluster stopped, or this peer is cut off)."""
        syncobj = self._syncobj
        voters = set(self._voters)
        if not voters:
            return True
        # Called off the tick thread: pysyncobj's otherNodes is a copy (set.copy(), one step
        # under the GIL), so a membership change on the tick thread cannot break the loop.
        reachable = {str(node.id) for node in syncobj.otherNodes if syncobj.isNodeConnected(node)}
        reachable.add(self._self_address)
        return len(voters & reachable) * 2 > len(voters)

    def journal_sync_times(self) -> tuple[list[int], float]:
        """How long this peer's journal fdatasyncs took: (count per bucket of
        `raft.journal.SYNC_BUCKETS_S`, the last past every bound; sum of seconds)."""
        return self._journal.sync_times.snapshot()

    def status(self) -> dict[str, Any]:
        """A point-in-time view for health checks and tests (plain JSON-able values)."""
        syncobj = self._syncobj
        partners: dict[str, bool] = {}
        for node in syncobj.otherNodes:
            partners[str(node.id)] = bool(syncobj.isNodeConnected(node))
        with self._lock:
            pending = len(self._pending)
        return {
            "self_address": self._self_address,
            "voter": self._voter,
            "state": STATE_NAMES.get(syncobj.raftwal_state(), "unknown"),
            "leader": self.leader_address(),
            "term": self.raft_term(),
            "commit_index": self.commit_index(),
            "last_applied": self.last_applied_index(),
            "journal_first_index": self._journal.first_index,
            "journal_last_index": self._journal.last_index,
            "synced_index": self._journal.synced_index,
            # Same value under the name the node's ClusterStatus uses (MemberStatus).
            "durable_index": self._journal.synced_index,
            "journal_syncs": self._journal.sync_count,
            "snapshot_index": self._snapshot_index,
            "snapshots_written": self._snapshots_written,
            "pending_proposals": pending,
            "partners_connected": partners,
            "voters": list(self._voters),
            "membership_pending": self._membership_pending,
            "durable": self._durable,
            "safety_net_syncs": self._safety_net_syncs,
            "tick_errors": self._tick_errors_total,
            "lease_reads": self.lease_reads,
            "read_rounds": self.read_rounds,
            "votes_ignored": syncobj.raftwal_transport().raftwal_votes_ignored,
            "pre_vote_rounds": syncobj.raftwal_pre_vote_rounds,
            "pre_votes_refused": syncobj.raftwal_transport().raftwal_pre_votes_refused,
            "fatal_error": None if self._fatal is None else str(self._fatal),
            "closed": self._closed,
        }

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop ticking, flush and close the journal. Pending proposals fail with
        UnknownOutcome (they may still commit through the other peers). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._ticker is not None:
            self._stop_loop_ticks()
        else:
            self._wakeup.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._tuning.close_timeout_s)
            if thread.is_alive():
                logger.error(
                    "raft tick thread of %s did not stop within %.1fs",
                    self._self_address,
                    self._tuning.close_timeout_s,
                )
        self._fail_all_pending(UnknownOutcome("raft peer closed; the command may still commit"))
        with self._lock:
            transfer, self._transfer = self._transfer, None
        if transfer is not None and not transfer.done():
            transfer.set_exception(PeerClosed(f"raft peer {self._self_address} closed"))

    def __enter__(self) -> RaftPeer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ tick thread

    def _run(self) -> None:
        while not self._stop.is_set() and self._fatal is None:
            self._tick_once(None)
        self._shutdown_syncobj()
        if self._fatal is not None:
            self._fail_all_pending(PeerClosed(f"raft peer stopped: {self._fatal}"))
            if self._on_fatal is not None:
                self._on_fatal(self._fatal)

    def _poll_timeout_s(self) -> float:
        """The tick period; for an idle follower, up to its election deadline (capped by
        `idle_tick_period_s`). Read racily on purpose: a proposal, read or membership change
        added after this wakes the poll at once (`_wakeup`), and the next tick sees it."""
        tick_s = self._tuning.tick_period_s
        idle_cap_s = self._tuning.idle_tick_period_s
        if idle_cap_s <= tick_s:
            return tick_s
        if (
            self._pending
            or self._new_reads
            or self._reads
            or self._transfer is not None
            or self._membership_pending
            or self._membership_changed
        ):
            return tick_s
        idle_s = self._syncobj.raftwal_follower_idle_s()
        if idle_s is None:
            return tick_s
        return max(tick_s, min(idle_cap_s, idle_s))

    # ------------------------------------------------- ticks on an event loop

    def _run_own_loop(self) -> None:
        """The thread of a loop-ticked peer constructed without a running loop."""
        ticker = self._ticker
        assert ticker is not None
        ticker.thread_id = threading.get_ident()
        asyncio.set_event_loop(ticker.loop)
        try:
            ticker.loop.run_forever()
        finally:
            ticker.loop.close()

    def _loop_tick(self) -> None:
        """One tick on the event loop; `_run`'s body, one iteration at a time."""
        if self._loop_done:
            return
        if not self._stop.is_set() and self._fatal is None:
            self._tick_once(0.0)
            poller = self._loop_poller
            assert poller is not None and self._ticker is not None
            if poller.last_events:
                # The tick thread polls again at once after a poll that did something:
                # the follower's group commit and its acks, the leader's commit of what
                # its followers answered, are the next tick's first steps.
                self._ticker.notify()
        if self._stop.is_set() or self._fatal is not None:
            self._finish_loop()

    def _finish_loop(self) -> None:
        """On the loop's thread (or with the loop stopped): `_run`'s ending."""
        if self._loop_done:
            return
        self._loop_done = True
        ticker, poller = self._ticker, self._loop_poller
        assert ticker is not None and poller is not None
        ticker.close()
        self._shutdown_syncobj()
        poller.close()
        if self._fatal is not None:
            self._fail_all_pending(PeerClosed(f"raft peer stopped: {self._fatal}"))
            if self._on_fatal is not None:
                self._on_fatal(self._fatal)
        if self._own_loop:
            ticker.loop.stop()

    def _stop_loop_ticks(self) -> None:
        """close() of a loop-ticked peer: end the ticking on the loop's thread, and wait."""
        ticker = self._ticker
        assert ticker is not None
        loop = ticker.loop
        if ticker.on_loop_thread() or loop.is_closed() or not loop.is_running():
            self._finish_loop()
            return
        if self._own_loop:
            # The loop stops in _finish_loop, whoever runs it (a tick that saw _stop may
            # have already); close() then joins the loop's thread.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._finish_loop)
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def finish() -> None:
            try:
                self._finish_loop()
            finally:
                done.set_result(None)

        try:
            loop.call_soon_threadsafe(finish)
            done.result(self._tuning.close_timeout_s)
        except (RuntimeError, TimeoutError):
            logger.error(
                "raft ticks of %s on the event loop did not stop within %.1fs",
                self._self_address,
                self._tuning.close_timeout_s,
            )

    def _tick_once(self, poll_timeout_s: float | None) -> None:
        """One tick; None polls for `_poll_timeout_s()`."""
        try:
            if poll_timeout_s is None:
                poll_timeout_s = self._poll_timeout_s()
            # Follower group commit: everything appended during the last poll becomes
            # durable with one sync, then the held-back acknowledgements leave.
            started = time.monotonic()
            self._gate.flush()
            self._journal.sync()
            # A slow disk's sync does not count toward this node's election timeout.
            self._syncobj.raftwal_excuse(time.monotonic() - started)
            self._expire_proposals()
            self._syncobj.doTick(poll_timeout_s)
            self._tick_failures = 0
        except FatalPeerError as exc:
            self._set_fatal(exc)
        except AssertionError as exc:
            # A broken invariant (ours or pysyncobj's): stop loudly, never limp on.
            logger.exception("raft invariant broken")
            self._set_fatal(FatalPeerError(f"invariant broken: {exc}"))
        except Exception as exc:
            # pysyncobj's own tick loop logs and retries too (syncobj.py line 594); bounded
            # here, and visible in status()["tick_errors"].
            self._tick_failures += 1
            self._tick_errors_total += 1
            logger.exception("raft tick failed (%d in a row)", self._tick_failures)
            if self._tick_failures >= _MAX_CONSECUTIVE_TICK_FAILURES:
                self._set_fatal(
                    FatalPeerError(f"{self._tick_failures} consecutive tick failures: {exc}")
                )
            else:
                time.sleep(min(self._tuning.tick_period_s, 0.05))

    def _before_poll(self) -> None:
        """Runs inside pysyncobj's tick after _checkCommandsToApply, before the poll."""
        syncobj = self._syncobj
        if syncobj._isLeader():
            # Push what this tick appended (or a raised commit index) now instead of at the
            # next heartbeat; followers write while the leader fsyncs below.
            marker = (syncobj.raftCurrentTerm, self._journal.last_index, syncobj.raftCommitIndex)
            if marker != self._sent_marker:
                if (
                    self._ticker is not None
                    and marker[:2] == self._sent_marker[:2]
                    and not self._commit_push_due
                ):
                    # Ticked on the event loop, and only the commit index moved: the
                    # callers this tick answered resume first (the node's servicer waits
                    # on its ProposalBatcher, which waits here: two loop iterations), and
                    # a tick queued behind them pushes it. Followers learn it a little
                    # later; nothing waits on that but their applies.
                    self._commit_push_due = True
                    self._ticker.notify_after(_COMMIT_PUSH_DEFER_ITERATIONS)
                else:
                    self._commit_push_due = False
                    self._sent_marker = marker
                    syncobj.raftwal_send_append_entries()
        # Leader group commit: the commit index is computed at the start of the next tick
        # (syncobj.py line 653), where the leader counts itself for every entry it holds.
        self._journal.sync()
        self._gate.flush()
        self._renew_lease()
        if self._new_reads or self._reads:
            self._mark_reads()
        if self._membership_changed or self._membership_pending:
            self._refresh_membership()

    def _shutdown_syncobj(self) -> None:
        if self._started_syncobj is not None:
            try:
                self._started_syncobj._doDestroy()  # transport.destroy(), journal._destroy()
            except (OSError, RaftError) as exc:
                logger.error("error while closing raft peer %s: %s", self._self_address, exc)
        if self._started_wakeup is not None:
            self._started_wakeup.close()

    def _set_fatal(self, error: FatalPeerError) -> None:
        if self._fatal is None:
            self._fatal = error
            logger.critical("raft peer %s stops: %s", self._self_address, error)

    # ------------------------------------------------- pysyncobj callbacks

    def _apply_entry(self, command: bytes, raft_index: int) -> bytes:
        if self._durable and raft_index > self._journal.synced_index:
            # Not expected: every path that appends syncs before the next apply. Kept as a
            # safety net so "applied => durable here" holds regardless; counted in status.
            self._safety_net_syncs += 1
            logger.warning("entry %d applied before its journal sync; syncing now", raft_index)
            self._journal.sync()
        try:
            result = self._apply(command, raft_index)
        except Exception as exc:
            error = FatalPeerError(f"apply failed at raft index {raft_index}: {exc!r}")
            self._set_fatal(error)
            raise error from exc
        if type(result) is not bytes:
            error = FatalPeerError(
                f"apply returned {type(result).__name__} at raft index {raft_index} "
                "(expected bytes)"
            )
            self._set_fatal(error)
            raise error
        return result

    def _serialize(self, tmp_file_name: str, data: tuple[Any, Any, Any]) -> None:
        last_entry, prev_entry, cluster = data
        try:
            app_state = self._take_snapshot()
        except Exception as exc:
            error = FatalPeerError(f"take_snapshot failed: {exc!r}")
            self._set_fatal(error)
            raise error from exc
        last = (bytes(last_entry[0]), int(last_entry[1]), int(last_entry[2]))
        # The voters as of the snapshot's index, not today's: a membership entry after it
        # may still be truncated by a new leader, and a restart from this snapshot must not
        # count a voter that never was (pysyncobj passes today's set, line 1469). A
        # non-voting peer is not in its own set.
        del cluster
        cluster_addresses = tuple(sorted(self._syncobj.raftwal_membership_at(last[1])))
        prev = (bytes(prev_entry[0]), int(prev_entry[1]), int(prev_entry[2]))
        blob = encode_snapshot(last, prev, cluster_addresses, app_state)
        try:
            try:
                write_snapshot_tmp(Path(tmp_file_name), blob, durable=self._durable)
            except OSError as error:
                # A full disk: Raft's reserve gives the snapshot its room (raft/reserve.py).
                if self._reserve is None or not self._reserve.release_for(error):
                    raise
                write_snapshot_tmp(Path(tmp_file_name), blob, durable=self._durable)
        except OSError:
            # pysyncobj swallows serializer errors silently (serializer.py line 98); log
            # here, and it retries at the next compaction trigger.
            logger.exception("writing snapshot at index %d failed", last[1])
            raise
        self._snapshot_index = last[1]
        self._snapshots_written += 1
        logger.info("snapshot at raft index %d written (%d bytes)", last[1], len(blob))

    def _deserialize(self, file_name: str) -> tuple[Any, Any, Any]:
        # pysyncobj catches everything raised here (syncobj.py line 1510) and carries on
        # with an empty state: mark the peer fatal first so the tick loop stops.
        try:
            snapshot = read_snapshot_file(Path(file_name), durable=self._durable)
            if snapshot is None:
                raise FatalPeerError(f"snapshot {file_name} vanished before it was loaded")
            self._restore_snapshot(snapshot.app_state)
        except Exception as exc:
            error = FatalPeerError(f"loading snapshot {file_name} failed: {exc!r}")
            self._set_fatal(error)
            raise error from exc
        self._snapshot_index = snapshot.raft_index
        logger.info("snapshot at raft index %d restored", snapshot.raft_index)
        return (
            snapshot.last_entry,
            snapshot.prev_entry,
            {TCPNode(address) for address in snapshot.cluster},
        )

    def _before_truncate(self, first_removed_index: int) -> None:
        applied = self._syncobj.raftLastApplied
        if first_removed_index <= applied:
            # pysyncobj would only log CRITICAL here (syncobj.py line 1000) and continue with
            # a state machine that has diverged from the cluster. Stop instead.
            error = FatalPeerError(
                f"leader asked to truncate from index {first_removed_index}, at or below the "
                f"last applied index {applied}: committed entries would be lost"
            )
            self._set_fatal(error)
            raise error

    def _on_state_changed(self, old_state: int, new_state: int) -> None:
        # pysyncobj calls this before it bumps the term of a new candidacy, so the term is
        # only meaningful (and only logged) once leadership is won.
        if new_state == _LEADER_STATE:
            logger.info(
                "raft peer %s: became leader (term %d)",
                self._self_address,
                self._syncobj.raftCurrentTerm,
            )
        else:
            logger.info(
                "raft peer %s: %s -> %s",
                self._self_address,
                STATE_NAMES.get(old_state, old_state),
                STATE_NAMES.get(new_state, new_state),
            )

    def _emit(self, kind: str, index: int) -> None:
        if self._observer is not None:
            self._observer(DurabilityEvent(self._self_address, kind, index))

    def _on_synced(self, index: int) -> None:
        self._emit("synced", index)

    def _on_ack_sent(self, index: int) -> None:
        self._emit("ack_sent", index)

    def _on_commit_index(self, index: int) -> None:
        if hasattr(self, "_syncobj") and self._syncobj._isLeader():
            self._emit("commit", index)
