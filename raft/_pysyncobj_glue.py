"""Every touch of pysyncobj internals, in one place, for exactly pysyncobj 0.3.17.

Lives here: the `SyncObj` subclass with the single replicated method (bytes in, bytes out),
the transport subclass that holds back AppendEntries acknowledgements until the journal is
synced, and the accessors for the name-mangled `SyncObj` attributes the peer needs. Line
numbers quoted refer to pysyncobj 0.3.17 `syncobj.py`; `raft/DURABILITY.md` explains the
route. `check_pysyncobj_version()` refuses any other version, because these hooks depend on
its private structure.

Must never: contain application logic, pickle anything of ours (pysyncobj pickles its own
wire messages and the `(method id, (command_bytes,))` tuple of each entry; our payload stays
opaque bytes), or be imported by anything but `raft/peer.py`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import socket
import struct
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.monotonic import monotonic as monotonicTime
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.tcp_server import TcpServer
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from raft.journal import DurableJournal

logger = logging.getLogger(__name__)

SUPPORTED_PYSYNCOBJ_VERSION = "0.3.17"

# pysyncobj's command type byte of a no-op entry (syncobj.py _COMMAND_TYPE.NO_OP).
NO_OP_COMMAND = b"\x01"
# ... and of a membership change (_COMMAND_TYPE.MEMBERSHIP, lines 384 and 400): the byte,
# then pysyncobj's pickle of ["add" | "rem", address, TCPNode(address)].
MEMBERSHIP_COMMAND_TYPE = 2


def membership_request(command: bytes) -> tuple[str, str] | None:
    """("add" | "rem", address) of a pysyncobj membership entry; None for any other entry.

    The entry is pysyncobj's own pickle, and it only ever comes from this peer's journal or
    an authenticated peer (the same bytes pysyncobj unpickles itself, line 1418)."""
    if not command or command[0] != MEMBERSHIP_COMMAND_TYPE:
        return None
    request = pysyncobj_pickle.loads(command[1:])
    kind, address = str(request[0]), str(request[1])
    if kind not in ("add", "rem"):
        return None
    return kind, address


# pysyncobj's raft states (syncobj.py _RAFT_STATE).
STATE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}

# A follower flushes held-back acknowledgements inline past this many, so the queue is
# bounded even if one poll delivers an unusual number of AppendEntries messages.
MAX_DEFERRED_ACKS = 4096


class _OverlappingResendFilter(logging.Filter):
    """Demotes pysyncobj's "truncating already-applied log entries" CRITICAL to DEBUG.

    pysyncobj logs it (syncobj.py line 1000) whenever a resend overlaps applied entries,
    which its own pipelining does routinely (a late `next_node_idx` reply moves nextIndex
    back, line 1082), even when the resent entries are identical. `DurableJournal` detects
    the real case (a *different* entry at an applied index) and the peer stops on it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(
            "truncating already-applied log entries"
        ):
            record.levelno = logging.DEBUG
            record.levelname = "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def install_log_filter() -> None:
    pysyncobj_logger = logging.getLogger("pysyncobj.syncobj")
    if not any(isinstance(f, _OverlappingResendFilter) for f in pysyncobj_logger.filters):
        pysyncobj_logger.addFilter(_OverlappingResendFilter())


def check_pysyncobj_version() -> None:
    if PYSYNCOBJ_VERSION != SUPPORTED_PYSYNCOBJ_VERSION:
        raise RuntimeError(
            f"raft needs pysyncobj {SUPPORTED_PYSYNCOBJ_VERSION} exactly (got "
            f"{PYSYNCOBJ_VERSION}): its durability hooks depend on that version's internals"
        )


class AckGate:
    """Holds a follower's AppendEntries acknowledgements until the journal is durable.

    pysyncobj acknowledges an AppendEntries batch with a `next_node_idx` message sent from
    inside its message handler (syncobj.py line 1019, `__sendNextNodeIdx`), right after it
    appended the entries (line 1006). The transport routes that message here; it leaves
    only after `flush()` has synced the journal. The peer calls `flush()` once after every
    poll, so a whole batch of received messages costs one fdatasync (group commit).
    """

    def __init__(self, *, durable: bool, on_ack_sent: Callable[[int], None] | None) -> None:
        self._durable = durable
        self._on_ack_sent = on_ack_sent
        self._journal: DurableJournal | None = None
        self._transport: DurableTransport | None = None
        self._deferred: collections.deque[tuple[Any, dict[str, Any]]] = collections.deque()

    def attach(self, journal: DurableJournal, transport: DurableTransport) -> None:
        self._journal = journal
        self._transport = transport

    def maybe_defer(self, node: Any, message: Any) -> bool:
        if not self._durable or self._journal is None:
            return False
        if not (isinstance(message, dict) and message.get("type") == "next_node_idx"):
            return False
        # Keep acknowledgements in order: once one waits, the later ones wait behind it.
        if not self._deferred and not self._journal.has_unsynced():
            return False
        self._deferred.append((node, message))
        if len(self._deferred) >= MAX_DEFERRED_ACKS:
            self.flush()
        return True

    def flush(self) -> None:
        if not self._deferred:
            return
        assert self._journal is not None and self._transport is not None
        self._journal.sync()
        while self._deferred:
            node, message = self._deferred.popleft()
            self._transport.send_now(node, message)

    def before_send(self, message: Any) -> None:
        if (
            self._on_ack_sent is not None
            and isinstance(message, dict)
            and message.get("type") == "next_node_idx"
            and message.get("success")
        ):
            self._on_ack_sent(int(message["next_node_idx"]) - 1)


# ---------------------------------------------------------------------------------------
# The Raft port before authentication
# ---------------------------------------------------------------------------------------

# pysyncobj's frame header: a native signed int length (tcp_connection.py line 272).
_FRAME_HEADER = struct.Struct("i")

# Refusal reasons, as counted in PortGuard.refusals (and the node's metrics).
REFUSED_FRAME_TOO_LARGE = "frame_too_large"
REFUSED_AUTH_TIMEOUT = "auth_timeout"
REFUSED_TOO_MANY_UNAUTHENTICATED = "too_many_unauthenticated"
REFUSED_BAD_FRAME = "bad_frame"
# The Raft port's listen backlog, and how many queued connections one poll event accepts.
LISTEN_BACKLOG = 128
ACCEPTS_PER_EVENT = 64


@dataclass(frozen=True)
class PortLimits:
    """What a Raft connection may make this node hold.

    A connection is *authenticated* once it delivered a frame that decrypted with the
    cluster secret and carried this connection's fresh random key (pysyncobj's handshake:
    a replayed frame carries an old key). Before that its frames are capped at
    `max_unauthenticated_frame_bytes` (the handshake's frames are a few hundred bytes),
    it must authenticate within `auth_timeout_s`, and at most
    `max_unauthenticated_connections` such connections are open at once. After that, a
    frame is capped at `max_frame_bytes` (the largest AppendEntries batch or snapshot
    chunk the peer sends, encrypted)."""

    max_frame_bytes: int
    max_unauthenticated_frame_bytes: int = 64 << 10
    auth_timeout_s: float = 2.0
    max_unauthenticated_connections: int = 32


class PortGuard:
    """The limits of one peer's Raft port and what they refused (read from any thread)."""

    def __init__(self, limits: PortLimits) -> None:
        self.limits = limits
        # Every key exists from the start: readers on other threads copy this dict while
        # the tick thread counts, which is safe as long as no key is ever added.
        self.refusals: dict[str, int] = dict.fromkeys(
            (
                REFUSED_FRAME_TOO_LARGE,
                REFUSED_BAD_FRAME,
                REFUSED_AUTH_TIMEOUT,
                REFUSED_TOO_MANY_UNAUTHENTICATED,
            ),
            0,
        )

    def refuse(self, reason: str, detail: str) -> None:
        self.refusals[reason] += 1
        # DEBUG: a flood must not turn into a flood of log lines; the metric counts it.
        logger.debug("raft port refused a connection (%s): %s", reason, detail)


class GuardedTcpConnection(TcpConnection):
    """pysyncobj's TcpConnection with its read path bounded.

    pysyncobj appends every received byte to one `bytes` buffer (copying it on each read)
    and waits for however many bytes a frame header declares, before it checks the secret:
    a connection declaring a 2 GiB frame would be buffered whole. Here the read buffer is a
    bytearray, a frame header is checked as soon as it arrives against the connection's
    cap (`PortLimits`), and a frame is decrypted (authenticated) before it is unpickled,
    exactly as pysyncobj does (tcp_connection.py lines 268-291), which this replaces.
    """

    def raftwal_guard(self, guard: PortGuard, accepted_at: float | None) -> None:
        """Attach the limits; `accepted_at` (monotonic) for an incoming connection, which
        must authenticate by then + auth_timeout_s."""
        self._raftwal_guard = guard
        self._raftwal_buffer = bytearray()
        self._raftwal_authenticated = False
        self._raftwal_deadline = (
            None if accepted_at is None else accepted_at + guard.limits.auth_timeout_s
        )

    @property
    def raftwal_authenticated(self) -> bool:
        return self._raftwal_authenticated

    def raftwal_check_deadline(self, now: float) -> None:
        deadline = self._raftwal_deadline
        if deadline is not None and not self._raftwal_authenticated and now > deadline:
            self._raftwal_guard.refuse(REFUSED_AUTH_TIMEOUT, "not authenticated in time")
            self.disconnect()

    def disconnect(self) -> None:
        # `hasattr`: pysyncobj may disconnect from inside TcpConnection.__init__.
        if hasattr(self, "_raftwal_buffer"):
            self._raftwal_reset()
            self._raftwal_deadline = None
        super().disconnect()

    def connect(self, host: str, port: int) -> bool:
        # An outgoing connection is reused for every reconnect: each new socket starts
        # unauthenticated, with an empty buffer.
        self._raftwal_reset()
        return bool(super().connect(host, port))

    def _raftwal_reset(self) -> None:
        self._raftwal_buffer = bytearray()
        self._raftwal_authenticated = False

    def _raftwal_frame_cap(self) -> int:
        limits = self._raftwal_guard.limits
        if self._raftwal_authenticated:
            return limits.max_frame_bytes
        return limits.max_unauthenticated_frame_bytes

    def _TcpConnection__processConnection(self, descr: int, event_type: int) -> None:  # noqa: N802
        """Bytes (or an EOF) waiting to be read mean the peer is not silent: count that as
        a read before pysyncobj's connection-timeout check, which it runs before reading
        (tcp_connection.py line 185). Two followers never talk between elections, so
        their link is idle for longer than connectionTimeout, and the check dropped the
        link with the first RequestVote that arrived on it: every failover after a quiet
        spell took a second election round. A silent peer still times out: it causes no
        read event."""
        connection: Any = self  # pysyncobj's private, untyped attributes
        if event_type & POLL_EVENT_TYPE.READ and connection.state == CONNECTION_STATE.CONNECTED:
            connection._TcpConnection__lastReadTime = max(
                connection._TcpConnection__lastReadTime, monotonicTime()
            )
        TcpConnection._TcpConnection__processConnection(self, descr, event_type)  # type: ignore[attr-defined]

    def _TcpConnection__processRead(self) -> bool:  # noqa: N802 (overrides a mangled name)
        sock = self._TcpConnection__socket
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except OSError as error:
            if error.errno not in (socket.errno.EAGAIN, socket.errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._raftwal_check_unparsed()
            self.disconnect()
            return False
        self._raftwal_buffer += incoming
        if len(self._raftwal_buffer) >= _FRAME_HEADER.size:
            (declared,) = _FRAME_HEADER.unpack_from(self._raftwal_buffer)
            cap = self._raftwal_frame_cap()
            if not 0 < declared <= cap:
                reason = REFUSED_FRAME_TOO_LARGE if declared > cap else REFUSED_BAD_FRAME
                self._raftwal_guard.refuse(reason, f"declared {declared} bytes (cap {cap})")
                self.disconnect()
                return False
            # Never read past the frame being assembled plus one receive: the buffer stays
            # bounded by the cap while the parser catches up.
            if len(self._raftwal_buffer) > cap + _FRAME_HEADER.size:
                return False
        return True

    def _raftwal_check_unparsed(self) -> None:
        """The peer closed (or reset) the connection with a whole frame read but not parsed
        yet: pysyncobj reads until the socket is drained before it parses, so a frame
        and the close that follows it, read in one go (a busy node reads late), were
        dropped unchecked, and a bad frame sent just before a close went uncounted. An
        unauthenticated connection's first frame is checked now, refused and counted as
        it would have been; whatever it holds is never delivered (the connection is
        closing, as pysyncobj drops an authenticated peer's last frames)."""
        if self._raftwal_authenticated or len(self._raftwal_buffer) < _FRAME_HEADER.size:
            return
        (length,) = _FRAME_HEADER.unpack_from(self._raftwal_buffer)
        if 0 < length <= self._raftwal_frame_cap() and len(self._raftwal_buffer) < (
            _FRAME_HEADER.size + length
        ):
            return  # cut short by the close: no frame to judge
        self._TcpConnection__processParseMessage()

    def _TcpConnection__processParseMessage(self) -> Any:  # noqa: N802 (mangled name)
        buffer = self._raftwal_buffer
        if len(buffer) < _FRAME_HEADER.size:
            return None
        (length,) = _FRAME_HEADER.unpack_from(buffer)
        cap = self._raftwal_frame_cap()
        if not 0 < length <= cap:
            self._raftwal_guard.refuse(
                REFUSED_FRAME_TOO_LARGE if length > cap else REFUSED_BAD_FRAME,
                f"declared {length} bytes (cap {cap})",
            )
            self.disconnect()
            return None
        end = _FRAME_HEADER.size + length
        if len(buffer) < end:
            return None
        data = bytes(buffer[_FRAME_HEADER.size : end])
        checked_key = False
        try:
            if self.encryptor:
                timestamp = self.encryptor.extract_timestamp(data)
                if timestamp < self.recvLastTimestamp:
                    raise ValueError("frame older than the last one")
                self.recvLastTimestamp = timestamp
                data = self.encryptor.decrypt(data)
            else:
                # No secret: nothing may be unpickled (raft/peer.py refuses to start
                # without one; this is the last line of defence).
                raise ValueError("no cluster secret")
            message = pysyncobj_pickle.loads(zlib.decompress(data))
            if self.recvRandKey:
                rand_key, message = message
                if rand_key != self.recvRandKey:
                    raise ValueError("frame for another connection (a replay?)")
                checked_key = True
        except Exception as error:  # noqa: BLE001 (counted, and the connection is closed)
            self._raftwal_guard.refuse(REFUSED_BAD_FRAME, f"{type(error).__name__}: {error}")
            self.disconnect()
            return None
        del buffer[:end]
        if checked_key and not self._raftwal_authenticated:
            self._raftwal_authenticated = True
            self._raftwal_deadline = None
        return message


class GuardedTcpServer(TcpServer):
    """pysyncobj's TcpServer handing out GuardedTcpConnections, refusing a connection at
    once while `max_unauthenticated_connections` are open."""

    def __init__(self, *args: Any, guard: PortGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._raftwal_guard = guard
        self._raftwal_pending: set[GuardedTcpConnection] = set()

    def raftwal_sweep(self, now: float) -> None:
        """Close connections past their authentication deadline; forget finished ones."""
        for connection in list(self._raftwal_pending):
            connection.raftwal_check_deadline(now)
            if (
                connection.raftwal_authenticated
                or connection.state == CONNECTION_STATE.DISCONNECTED
            ):
                self._raftwal_pending.discard(connection)

    def bind(self) -> None:
        super().bind()
        # pysyncobj listens with a backlog of 5: a handful of idle connections would make
        # the kernel drop the peers' own SYNs (each retried after 1 s, then 3 s).
        self._TcpServer__socket.listen(LISTEN_BACKLOG)

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:  # noqa: N802
        if event & POLL_EVENT_TYPE.READ:
            # Drain the backlog (bounded per event), rather than one accept per poll.
            for _ in range(ACCEPTS_PER_EVENT):
                try:
                    sock, _ = self._TcpServer__socket.accept()
                except OSError as error:
                    if error.errno not in (socket.errno.EAGAIN, socket.errno.EWOULDBLOCK):
                        self.unbind()
                        return
                    break
                self._raftwal_accept(sock)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()

    def _raftwal_accept(self, sock: socket.socket) -> None:
        self.raftwal_sweep(monotonicTime())
        limits = self._raftwal_guard.limits
        if len(self._raftwal_pending) >= limits.max_unauthenticated_connections:
            self._raftwal_guard.refuse(
                REFUSED_TOO_MANY_UNAUTHENTICATED,
                f"{len(self._raftwal_pending)} unauthenticated connections open",
            )
            sock.close()
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._TcpServer__sendBufferSize)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._TcpServer__recvBufferSize)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        connection = GuardedTcpConnection(
            poller=self._TcpServer__poller,
            socket=sock,
            timeout=self._TcpServer__connectionTimeout,
            sendBufferSize=self._TcpServer__sendBufferSize,
            recvBufferSize=self._TcpServer__recvBufferSize,
            keepalive=self._TcpServer__keepalive,
        )
        connection.raftwal_guard(self._raftwal_guard, monotonicTime())
        self._raftwal_pending.add(connection)
        self._TcpServer__onNewConnectionCallback(connection)


#: Key this transport adds to a follower's `next_node_idx` answer: the term it answers in.
ANSWER_TERM_KEY = "raftwal_term"


def syncobj_clock() -> float:
    """The clock SyncObj stamps its own times with (election deadline, last response
    times), read where SyncObj reads it: compare those stamps with this only."""
    return float(pysyncobj_syncobj.monotonicTime())


def lease_clock() -> float:
    """The clock of the vote guard and the leader's lease, on every node: pysyncobj's
    (CLOCK_MONOTONIC_RAW, which NTP does not slew). Never mix it with `time.monotonic()`
    (CLOCK_MONOTONIC): the two have drifted apart by a quarter of a second on a host up
    for a day, more than a whole lease."""
    return float(monotonicTime())


# Set on a RequestVote of the election a TimeoutNow started (leadership transfer): the
# vote guard lets it through.
TRANSFER_VOTE_KEY = "raftwal_transfer"
# pysyncobj's _RAFT_STATE.LEADER.
_RAFT_LEADER_STATE = 2
_RAFT_FOLLOWER_STATE = 0
_RAFT_CANDIDATE_STATE = 1

# PreVote (Raft thesis 9.6, etcd raft's MsgPreVote): the message kinds this transport adds.
# They travel like pysyncobj's own messages (pickled dicts, over a connection that has
# authenticated with the cluster secret and encrypts every frame), are handled here and
# never reach SyncObj. A pre-vote asks "would you vote for me at `term`?" and changes
# nothing on either side: no term, no vote, no leader.
PRE_VOTE = "raftwal_pre_vote"
PRE_VOTE_RESPONSE = "raftwal_pre_vote_response"
# A voter's answer to an AppendEntries of a term below its own (pysyncobj ignores those,
# line 955): "my term is T". With PreVote a node can still be left above its live leader's
# term (it won a pre-vote, then lost the election); the leader ignores its RequestVotes
# while a majority answers it and the others refuse its pre-votes, so without this answer
# it would never rejoin. The leader steps down to that term and one election follows
# (etcd raft `Step`: a MsgApp of a lower term is answered with the higher term).
HIGHER_TERM = "raftwal_higher_term"


class HeartbeatRounds:
    """Counts, per partner, AppendEntries sent and `next_node_idx` answers received in this
    node's current leadership term: the leadership check of a ReadIndex read (raft/peer.py
    `_ReadIndex`).

    pysyncobj answers an AppendEntries with at most one `next_node_idx` (syncobj.py lines
    955-1040; none at all when the sender's term is stale, line 938) and sends that
    message for nothing else; this transport stamps each answer with the term the follower
    answered in, which is the AppendEntries' term. So once more answers of term T have
    arrived from a partner than AppendEntries of term T had been sent to it at some moment
    t, at least one answer is to an AppendEntries sent after t (pigeonhole; no ordering
    across reconnects is needed), and that partner accepted this leader's term after t.
    Only the tick thread touches the counters.

    What is never answered would hold a partner's answers below its sends for good: with k
    unanswered, every later read needs k + 1 answers after its mark, which the few
    heartbeats of a read's timeout never bring once a fault has eaten hundreds. That used
    to happen three ways, and after a healed partition or pause every linearizable read
    failed for as long as that leader lasted (chaos seeds 20261123 and 4242):

    - AppendEntries of an earlier term, which a follower that moved on never answers: the
      counters start afresh with each term (`begin_term`), and answers stamped with
      another term are not counted;
    - sends to a partner with no connection, which pysyncobj drops and says so: only what
      went into a live connection counts;
    - what was in flight when a connection closed: when the transport has no connection to
      a partner left, `connection_lost` sets its sends back to its answers. An answer that
      arrives later comes over a connection made afterwards, to an AppendEntries sent after
      the loss. A connection that closes while a newer one to the same partner is up
      (pysyncobj replaces an incoming connection without closing the old one) changes
      nothing: answers to what was sent before may still come over the newer one.

    The same counting dates the leader's lease (raft/peer.py, `RaftPeer.lease_read_index`):
    each send's time is taken before it leaves, and the n-th answer of a term from a
    partner proves that partner accepted this leader's term no earlier than the n-th send
    to it (n answers are to n distinct sends, since pysyncobj answers each AppendEntries at
    most once, so one of them is to the n-th send or a later one). `confirmed_at` keeps,
    per partner, the send time of that n-th send.
    """

    def __init__(self) -> None:
        self.term = 0
        self.sent_count: dict[str, int] = collections.defaultdict(int)
        self.answered_count: dict[str, int] = collections.defaultdict(int)
        # Send times of the sends not yet matched by an answer, oldest first, and the send
        # time each partner's latest answer proves (see the class docstring).
        self.unanswered_sent_at: dict[str, collections.deque[float]] = collections.defaultdict(
            collections.deque
        )
        self.confirmed_at: dict[str, float] = {}
        self.on_answer: Callable[[], None] | None = None

    def begin_term(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.sent_count.clear()
            self.answered_count.clear()
            self.unanswered_sent_at.clear()
            self.confirmed_at.clear()

    def sent(self, node_id: str, term: int, at: float | None = None) -> None:
        """An AppendEntries of `term` went to `node_id`; `at` is a time taken before it was
        handed to the connection (None: not dated, it never extends a lease)."""
        self.begin_term(term)
        self.sent_count[node_id] += 1
        self.unanswered_sent_at[node_id].append(-1.0 if at is None else at)

    def answered(self, node_id: str, term: int | None) -> None:
        """An answer from `node_id` in `term` (None: an unstamped answer, from a node
        without this transport: taken as one of the current term)."""
        if term is not None and term != self.term:
            return
        self.answered_count[node_id] += 1
        pending = self.unanswered_sent_at.get(node_id)
        if pending:
            at = pending.popleft()
            if at > self.confirmed_at.get(node_id, -1.0):
                self.confirmed_at[node_id] = at
        if self.on_answer is not None:
            self.on_answer()

    def connection_lost(self, node_id: str) -> None:
        """No connection to `node_id` is left: its unanswered AppendEntries never will be."""
        self.sent_count[node_id] = self.answered_count[node_id]
        self.unanswered_sent_at.pop(node_id, None)

    def confirmed_since(self, voters: Collection[str], needed: int) -> float | None:
        """The latest time t such that `needed` of `voters` each answered an AppendEntries
        of this term sent at or after t; None when fewer than `needed` answered any."""
        if needed <= 0:
            return None
        times = sorted(
            (at for node_id, at in self.confirmed_at.items() if node_id in voters and at >= 0),
            reverse=True,
        )
        return times[needed - 1] if len(times) >= needed else None

    def mark(self) -> dict[str, int]:
        """The send counters now: a later check asks who answered past them."""
        return dict(self.sent_count)

    def answered_since(self, mark: dict[str, int], voters: Collection[str] | None = None) -> int:
        """Partners that answered past `mark`; only those in `voters` when given (a
        read-only node, which pysyncobj also sends AppendEntries to, never counts)."""
        return sum(
            1
            for node_id, count in self.answered_count.items()
            if count > mark.get(node_id, 0) and (voters is None or node_id in voters)
        )


class DurableTransport(TCPTransport):
    """pysyncobj's TCP transport with acknowledgements routed through an `AckGate` and its
    port guarded by a `PortGuard` (incoming and outgoing connections alike)."""

    def __init__(
        self,
        sync_obj: SyncObj,
        self_node: Any,
        other_nodes: Any,
        gate: AckGate,
        guard: PortGuard,
    ):
        self._raftwal_gate = gate
        self._raftwal_guard = guard
        self.raftwal_rounds = HeartbeatRounds()
        # The vote guard (`_raftwal_vote_guard`; 0: off). A node counts its own start as
        # contact: a voter restarted inside its leader's lease must not vote it away.
        self.raftwal_vote_guard_s = 0.0
        self.raftwal_leader_contact = lease_clock()
        self.raftwal_votes_ignored = 0
        self.raftwal_pre_votes_refused = 0
        self.raftwal_transfer_vote_term = -1
        super().__init__(sync_obj, self_node, other_nodes)

    def _createServer(self) -> None:  # noqa: N802 (pysyncobj's name)
        super()._createServer()
        conf = self._syncObj.conf
        host, port = self._server._TcpServer__host, self._server._TcpServer__port
        self._server = GuardedTcpServer(
            self._syncObj._poller,
            host,
            port,
            onNewConnection=self._onNewIncomingConnection,
            sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            connectionTimeout=conf.connectionTimeout,
            guard=self._raftwal_guard,
        )

    def addNode(self, node: Any) -> None:  # noqa: N802 (pysyncobj's name)
        super().addNode(node)
        connection = self._connections.get(node)
        if type(connection) is TcpConnection:
            # pysyncobj builds the outgoing connection itself (transport.py line 523); give
            # it the guarded read path too: a process listening at a peer's address without
            # the secret must not make this node buffer anything either. The subclass adds
            # methods only, so switching the class of the fresh object is safe.
            connection.__class__ = GuardedTcpConnection
            connection.raftwal_guard(self._raftwal_guard, None)

    def _onNodeDisconnected(self, node: Any) -> None:  # noqa: N802 (pysyncobj's name)
        current = self._connections.get(node)
        if current is None or current.state != CONNECTION_STATE.CONNECTED:
            self.raftwal_rounds.connection_lost(str(node.id))
        super()._onNodeDisconnected(node)

    def _onTick(self) -> None:  # noqa: N802 (pysyncobj's name)
        super()._onTick()
        if isinstance(self._server, GuardedTcpServer):
            self._server.raftwal_sweep(monotonicTime())

    def send(self, node: Any, message: Any) -> bool:
        kind = message.get("type") if type(message) is dict else None
        if kind == "next_node_idx":
            # The term this answer is given in (the AppendEntries' term): the leader counts
            # it only for reads of that term. Stamped before any deferral.
            message[ANSWER_TERM_KEY] = self._syncObj.raftCurrentTerm
        elif kind == "request_vote" and message.get("term") == self.raftwal_transfer_vote_term:
            # The election a TimeoutNow from our leader started (the leader gave up its
            # lease first): voters grant it inside their vote guard too.
            message[TRANSFER_VOTE_KEY] = True
        if self._raftwal_gate.maybe_defer(node, message):
            return True
        # Taken before the message can reach the partner: the lease counts from here.
        at = lease_clock()
        sent = self.send_now(node, message)
        # Only what went into a live connection can be answered (pysyncobj drops a message
        # for a partner it is not connected to, and says so).
        if sent and kind == "append_entries":
            self.raftwal_rounds.sent(str(node.id), int(message["term"]), at)
        return sent

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj's)
        kind = message.get("type") if type(message) is dict else None
        if kind == PRE_VOTE:
            self._raftwal_answer_pre_vote(node, message)
            return
        if kind == PRE_VOTE_RESPONSE:
            sync = self._syncObj
            if isinstance(sync, RaftwalSyncObj):
                sync.raftwal_on_pre_vote_response(node, message)
            return
        if kind == HIGHER_TERM:
            sync = self._syncObj
            if isinstance(sync, RaftwalSyncObj):
                sync.raftwal_on_higher_term(node, message)
            return
        if kind == "append_entries":
            self._raftwal_answer_stale_leader(node, message)
        if type(message) is dict and not self._raftwal_vote_guard(node, message):
            return
        # SyncObj handles the message first (term, match index, lastResponseTime), then the
        # read rounds see the answer with the leader's state already updated.
        super()._onMessageReceived(node, message)
        if type(message) is dict and message.get("type") == "next_node_idx":
            term = message.get(ANSWER_TERM_KEY)
            self.raftwal_rounds.answered(str(node.id), term if type(term) is int else None)

    def raftwal_in_leader_lease(self) -> bool:
        """Whether this node heard from a live leader within the vote guard: as a follower,
        an AppendEntries of its leader's term less than `raftwal_vote_guard_s` ago; as the
        leader, answers from a majority of the voters within that time (CheckQuorum).
        Such a node refuses pre-votes and votes (Raft thesis 9.6)."""
        guard_s = self.raftwal_vote_guard_s
        if guard_s <= 0:
            return False
        sync = self._syncObj
        if sync._SyncObj__raftState == _RAFT_LEADER_STATE:
            # SyncObj's own stamps (next_node_idx answers, line 1080), on its clock.
            now = syncobj_clock()
            others = list(sync._SyncObj__otherNodes)
            answered = sync._SyncObj__lastResponseTime
            live = 1 + sum(1 for n in others if now - answered.get(n, float("-inf")) < guard_s)
            return live > (len(others) + 1) / 2
        return lease_clock() - self.raftwal_leader_contact < guard_s

    def _raftwal_answer_stale_leader(self, node: Any, message: dict[str, Any]) -> None:
        """Tell a leader of a lower term this voter's term (see HIGHER_TERM)."""
        sync = self._syncObj
        term = message.get("term")
        if (
            isinstance(sync, RaftwalSyncObj)
            and sync.raftwal_pre_vote
            and sync._SyncObj__selfNode is not None
            and type(term) is int
            and term < sync.raftCurrentTerm
        ):
            self.send(node, {"type": HIGHER_TERM, "term": sync.raftCurrentTerm})

    def _raftwal_answer_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        """Grant a pre-vote when this node would vote for the sender at the term it names
        (a term above ours, a log at least as up to date as ours) and has not heard from a
        live leader within the vote guard; else refuse. Either way nothing of ours changes
        (etcd raft `Step`, MsgPreVote)."""
        sync = self._syncObj
        term = message.get("term")
        last_log_term = message.get("last_log_term")
        last_log_index = message.get("last_log_index")
        if sync._SyncObj__selfNode is None or not all(
            type(v) is int for v in (term, last_log_term, last_log_index)
        ):
            return  # a read-only node never votes; a malformed request gets no answer
        own = (sync._SyncObj__getCurrentLogTerm(), sync._SyncObj__getCurrentLogIndex())
        # A leader refuses: while it leads it believes it is live (pysyncobj steps it
        # down once no majority answered for leader_fallback_timeout_s).
        granted = (
            sync._SyncObj__raftState != _RAFT_LEADER_STATE
            and term > sync.raftCurrentTerm
            and (last_log_term, last_log_index) >= own
            and not self.raftwal_in_leader_lease()
        )
        if not granted:
            self.raftwal_pre_votes_refused += 1
        self.send(
            node,
            {
                "type": PRE_VOTE_RESPONSE,
                "term": term,
                "granted": granted,
                "current_term": sync.raftCurrentTerm,
            },
        )

    def _raftwal_vote_guard(self, node: Any, message: dict[str, Any]) -> bool:
        """False for a RequestVote this node must ignore: it heard from its leader less
        than `raftwal_vote_guard_s` ago (Raft thesis 4.2.3, etcd's CheckQuorum lease). The
        leader's lease relies on it (raft/peer.py `lease_read_index`): while a majority
        guards, no other leader can be elected. Also notes when the leader's AppendEntries
        and TimeoutNow arrive (the same tests pysyncobj applies, syncobj.py lines 911-952)."""
        kind = message.get("type")
        sync = self._syncObj
        if kind == "append_entries":
            term = message.get("term")
            if type(term) is int and term >= sync.raftCurrentTerm:
                self.raftwal_leader_contact = lease_clock()
        elif kind == "timeout_now":
            term = message.get("term")
            if (
                type(term) is int
                and term >= sync.raftCurrentTerm
                and node == sync._SyncObj__raftLeader
            ):
                # pysyncobj starts an election at the next tick, one term up.
                self.raftwal_transfer_vote_term = sync.raftCurrentTerm + 1
        elif (
            kind == "request_vote"
            and message.get(TRANSFER_VOTE_KEY) is not True
            and self.raftwal_in_leader_lease()
        ):
            # A follower that hears its leader, and a leader that hears a majority,
            # ignore it: the sender only missed heartbeats (or was cut off), and voting
            # would depose a live leader. The election of a leadership transfer passes.
            self.raftwal_votes_ignored += 1
            return False
        return True

    def send_now(self, node: Any, message: Any) -> bool:
        self._raftwal_gate.before_send(message)
        self._refresh_idle_connection(node)
        return bool(super().send(node, message))

    def _refresh_idle_connection(self, node: Any) -> None:
        """Count a send as activity on a connection that only ever sends.

        pysyncobj drops a connection whose last *read* is older than connectionTimeout,
        and checks that inside send (tcp_connection.py lines 227-233, called from
        __trySendBuffer), discarding the message. Two followers never talk until an
        election, so the first RequestVote between them was always dropped and every
        failover needed a second election round (about one election timeout more). A
        dead peer is still detected: its RST disconnects at once, and a silent one shows
        up as no reply within connectionTimeout of this send.
        """
        connection = self._connections.get(node)
        if connection is None or connection.state != CONNECTION_STATE.CONNECTED:
            return
        connection._TcpConnection__lastReadTime = max(  # noqa: SLF001 (pysyncobj private)
            connection._TcpConnection__lastReadTime, monotonicTime()
        )


class Wakeup:
    """A self-pipe on pysyncobj's poller, so a proposal wakes the tick thread at once.

    pysyncobj only wires its own PipeNotifier when `appendEntriesUseBatch` is off (syncobj.py
    line 263), and its `notify()` raises when the pipe is full. This one writes at most one
    byte per wakeup and treats a full pipe as "already woken".
    """

    def __init__(self, poller: Any) -> None:
        self._poller = poller
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._armed = False
        self._closed = False
        poller.subscribe(self._read_fd, self._on_readable, POLL_EVENT_TYPE.READ)

    def notify(self) -> None:
        if self._armed or self._closed:
            return
        self._armed = True
        try:
            os.write(self._write_fd, b"\0")
        except BlockingIOError:
            pass  # the pipe already holds wakeups: the poll will return anyway
        except OSError as exc:
            logger.debug("wakeup pipe closed: %s", exc)

    def _on_readable(self, _fd: int, _event: int) -> None:
        # Drain first, then disarm. The other order loses wakeups for good: a notify()
        # between disarm and drain would write a byte the drain swallows, leaving the
        # notifier armed over an empty pipe. In this order a notify() that sees the flag
        # still armed queued its command before the disarm, so the tick that follows this
        # poll (which drains the command queue) picks it up.
        while True:
            try:
                if not os.read(self._read_fd, 4096):
                    break
            except BlockingIOError:
                break
        self._armed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._poller.unsubscribe(self._read_fd)
        os.close(self._read_fd)
        os.close(self._write_fd)


class LoopPoller:
    """pysyncobj's poller for a peer ticked on an asyncio event loop (`RaftTuning.
    tick_on_event_loop`).

    Every subscription is kept twice: in a `select.poll` object, which `poll()` queries
    with no wait and dispatches exactly as pysyncobj's `PollPoller` does, and in the event
    loop (`add_reader` / `add_writer`), whose callbacks only call `wake` (the peer schedules
    a tick). The event loop is thus only an alarm clock: what a tick reads and writes is
    decided by the same level-triggered poll as in the tick thread, so a stale loop event
    costs one empty tick, never a wrong dispatch. `poll()` must never be given a timeout
    other than 0 (it would block the loop), and everything here runs on the loop's thread.
    """

    def __init__(self, loop: Any, wake: Callable[[], None]) -> None:
        self._loop = loop
        self._wake = wake
        self._poll = select.poll()
        self._callbacks: dict[int, Callable[[int, int], None]] = {}
        self._in_loop: dict[int, int] = {}
        # Events dispatched by the last poll(): the peer ticks again at once after a poll
        # that did something, as the tick thread does.
        self.last_events = 0

    def subscribe(self, descr: int, callback: Callable[[int, int], None], mask: int) -> None:
        poll_mask = 0
        if mask & POLL_EVENT_TYPE.READ:
            poll_mask |= select.POLLIN
        if mask & POLL_EVENT_TYPE.WRITE:
            poll_mask |= select.POLLOUT
        if mask & POLL_EVENT_TYPE.ERROR:
            poll_mask |= select.POLLERR
        self._callbacks[descr] = callback
        self._poll.register(descr, poll_mask)
        # Writes are watched only while a send buffer is not empty; a read (or an error,
        # which the selector reports as readable) is always watched.
        wanted = POLL_EVENT_TYPE.READ | (mask & POLL_EVENT_TYPE.WRITE)
        if self._in_loop.get(descr) == wanted:
            return
        # Removed first, whatever the loop holds: pysyncobj closes a socket before it
        # unsubscribes (tcp_connection.py lines 162-166), so the descriptor number may
        # be a new socket's by now.
        self._remove_from_loop(descr)
        self._loop.add_reader(descr, self._wake)
        if wanted & POLL_EVENT_TYPE.WRITE:
            self._loop.add_writer(descr, self._wake)
        self._in_loop[descr] = wanted

    def unsubscribe(self, descr: int) -> None:
        self._callbacks.pop(descr, None)
        with contextlib.suppress(KeyError):
            self._poll.unregister(descr)
        self._remove_from_loop(descr)

    def _remove_from_loop(self, descr: int) -> None:
        if self._in_loop.pop(descr, None) is None or self._loop.is_closed():
            return
        # With the socket closed already, the selector's epoll_ctl fails (EBADF); it has
        # then dropped the descriptor from its map, which is all that is needed.
        with contextlib.suppress(OSError):
            self._loop.remove_reader(descr)
        with contextlib.suppress(OSError):
            self._loop.remove_writer(descr)

    def close(self) -> None:
        for descr in list(self._in_loop):
            self._remove_from_loop(descr)

    def poll(self, timeout: float) -> None:
        assert timeout == 0, "a loop-ticked peer never waits in poll"
        events = self._poll.poll(0)
        self.last_events = len(events)
        for descr, event in events:
            mask = 0
            if event & select.POLLIN:
                mask |= POLL_EVENT_TYPE.READ
            if event & select.POLLOUT:
                mask |= POLL_EVENT_TYPE.WRITE
            if event & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                mask |= POLL_EVENT_TYPE.ERROR
            callback = self._callbacks.get(descr)
            if callback is not None:
                callback(descr, mask)
            elif event & select.POLLNVAL:
                self.unsubscribe(descr)


class DialedNode(TCPNode):
    """A partner known by its address (its Raft identity: what it announces, what
    equality and leadership use) but connected to at another address, e.g. a proxy.
    pysyncobj dials `node.ip:node.port` (transport.py line 427) and nothing else reads
    them."""

    def __init__(self, address: str, dial_address: str) -> None:
        super().__init__(address)
        host, _, port = dial_address.rpartition(":")
        self._raftwal_dial_host = host.strip("[]")
        self._raftwal_dial_port = int(port)

    @property
    def ip(self) -> str:
        return str(globalDnsResolver().resolve(self._raftwal_dial_host))

    @property
    def port(self) -> int:
        return self._raftwal_dial_port


class RaftwalSyncObj(SyncObj):
    """The pysyncobj node: one replicated method that takes command bytes."""

    def __init__(
        self,
        self_address: str | None,
        partner_addresses: list[str],
        conf: SyncObjConf,
        apply_entry: Callable[[bytes, int], bytes],
        gate: AckGate,
        guard: PortGuard,
        dial_addresses: dict[str, str] | None = None,
        own_address: str | None = None,
        poller: LoopPoller | None = None,
    ) -> None:
        # Set before SyncObj.__init__, which scans dir(self) for replicated methods.
        self._raftwal_apply_entry = apply_entry

        def make_transport(sync_obj: SyncObj, self_node: Any, other_nodes: Any) -> TCPTransport:
            if poller is not None:
                # SyncObj.__init__ made its own poller just before (line 205); nothing
                # subscribed to it yet.
                sync_obj._poller = poller
            transport = DurableTransport(sync_obj, self_node, other_nodes, gate, guard)
            self._raftwal_transport = transport
            return transport

        # This peer's address, also on a read-only peer (whose pysyncobj self is None).
        self._raftwal_own_address = own_address or str(self_address)
        self._raftwal_dial = dict(dial_addresses or {})
        # Called on the tick thread after the voter set changed (a membership entry was
        # appended, received, rolled back, or a snapshot replaced the set).
        self.raftwal_on_membership: Callable[[], None] | None = None
        # PreVote (`_raftwal_pre_election`): on unless the peer turns it off; the round in
        # progress (the term it asks for, who granted) and the term it won, if any.
        self.raftwal_pre_vote = True
        self._raftwal_pre_vote_term = -1
        self._raftwal_pre_vote_grants: set[str] = set()
        self._raftwal_pre_vote_won_term = -1
        self.raftwal_pre_vote_rounds = 0
        partners = [self._raftwal_node(a) for a in partner_addresses]
        super().__init__(self_address, partners, conf=conf, transportClass=make_transport)

    # ---- PreVote (Raft thesis 9.6; etcd raft `campaignPreElection`)
    #
    # pysyncobj starts an election as soon as a follower's election deadline passes (line
    # 635): it raises its term at once, and the leader, on the RequestVote of that higher
    # term (line 918), steps down, even when the follower only missed a few heartbeats
    # (a paused or starved process, a partition that heals). Here the deadline first starts
    # a pre-vote round at term + 1, which changes nothing anywhere; only a majority of
    # grants (this node's own included) lets pysyncobj's election run, at the next check.
    # Voters refuse while they hear a live leader (`DurableTransport.
    # raftwal_in_leader_lease`), so a node cut off from the leader never raises its term
    # and rejoins without an election. A leadership transfer (TimeoutNow) skips the round,
    # as etcd's `campaignTransfer` does: the leader has given up its lease.

    #
    # A slow disk (issue: disks that fill up, slow down and fail): pysyncobj's one-second
    # timer, the journal's metadata store with its fsyncs, runs inside its tick between the
    # pre-vote gate above and its election check. When those fsyncs took longer than the
    # election timeout, the deadline the gate had just moved was past by the check, and a
    # follower with a slow disk started a real election without any pre-vote, deposing a
    # live leader every few seconds. The timer runs here, before the gate; and the time a
    # node spends in its own fsyncs, unable to read what its leader sent, does not count
    # toward its election timeout (`raftwal_excuse`), as etcd's ticks do not advance while
    # its raft loop waits on the disk.

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802 (pysyncobj's name)
        self._raftwal_one_second_timer()
        self._raftwal_pre_election()
        super()._onTick(timeToWait)

    def _raftwal_one_second_timer(self) -> None:
        """pysyncobj's one-second timer (line 629), run ahead of its tick, which then finds
        nothing due."""
        work = monotonicTime() - self._SyncObj__startTime
        if work <= self._SyncObj__numOneSecondDumps:
            return
        self._SyncObj__numOneSecondDumps = int(work) + 1
        started = syncobj_clock()
        self._SyncObj__raftLog.onOneSecondTimer()
        self.raftwal_excuse(syncobj_clock() - started)

    def raftwal_excuse(self, busy_s: float) -> None:
        """This node spent `busy_s` in its own disk work (a journal sync or metadata store)
        without reading its sockets: a follower or candidate moves its election deadline
        that much later, so that what its leader sent meanwhile is read before it judges
        the leader gone. Only a slow disk makes this noticeable; it delays the slow node's
        own detection of a dead leader, never anyone else's."""
        if busy_s <= 0.05 or self._SyncObj__selfNode is None:
            return
        if self._SyncObj__raftState in (_RAFT_FOLLOWER_STATE, _RAFT_CANDIDATE_STATE):
            self._SyncObj__raftElectionDeadline += busy_s

    def raftwal_follower_idle_s(self) -> float | None:
        """For a follower that no timer of its own is due on before its election deadline
        (no leadership transfer under way): the seconds until that deadline (at least 0).
        None for a leader, a candidate, or a node outside the voters: their ticks run
        timers (heartbeats, lease and commit checks, vote retries) at the tick period."""
        if self._SyncObj__selfNode is None or self._SyncObj__transferInProgress:
            return None
        if self._SyncObj__raftState != _RAFT_FOLLOWER_STATE:
            return None
        deadline: float = getattr(self, "_SyncObj__raftElectionDeadline")  # noqa: B009
        return max(0.0, deadline - syncobj_clock())

    def _raftwal_pre_election(self) -> None:
        if not self.raftwal_pre_vote or self._SyncObj__selfNode is None:
            return
        if self._SyncObj__raftState not in (_RAFT_FOLLOWER_STATE, _RAFT_CANDIDATE_STATE):
            return
        if self._SyncObj__transferInProgress:
            return
        now = syncobj_clock()  # the election deadline is SyncObj's stamp
        deadline: float = getattr(self, "_SyncObj__raftElectionDeadline")  # noqa: B009
        if deadline >= now:
            # A leader was heard since any round was won (its AppendEntries moved the
            # deadline): a later timeout asks again.
            self._raftwal_pre_vote_won_term = -1
            return
        if not self._SyncObj__connectedToAnyone():
            return  # pysyncobj would not elect either
        term = self._SyncObj__raftCurrentTerm + 1
        if self._raftwal_pre_vote_won_term == term:
            return  # won: pysyncobj's election runs in this tick, at exactly that term
        # A new round; the deadline moves as an election's would, so a round nobody
        # answers is retried after another randomized election timeout.
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        if self._SyncObj__raftLeader is not None:
            # No leader heard for an election timeout: forget it, as pysyncobj's own
            # election does (line 638) and etcd's becomePreCandidate does (`r.lead =
            # None`). Else a node cut off from everyone would keep naming its old leader
            # for as long as the cut lasts (its pre-votes win nothing), and what asks
            # "is there a leader?" (watches, forwarding, ClusterStatus) would be told yes.
            self._SyncObj__raftLeader = None
            self._SyncObj__onLeaderChanged()
        self._raftwal_pre_vote_term = term
        self._raftwal_pre_vote_grants = set()
        self.raftwal_pre_vote_rounds += 1
        request = {
            "type": PRE_VOTE,
            "term": term,
            "last_log_index": self._SyncObj__getCurrentLogIndex(),
            "last_log_term": self._SyncObj__getCurrentLogTerm(),
        }
        for node in list(self._SyncObj__otherNodes):
            self._raftwal_transport.send(node, dict(request))
        self._raftwal_count_pre_votes()

    def raftwal_on_pre_vote_response(self, node: Any, message: dict[str, Any]) -> None:
        term = message.get("term")
        current_term = message.get("current_term")
        if (
            message.get("granted") is not True
            and type(current_term) is int
            and current_term > self._SyncObj__raftCurrentTerm
            and node in self._SyncObj__otherNodes
            and self._SyncObj__raftState != _RAFT_LEADER_STATE
        ):
            # Refused by a voter already at a higher term: take that term, as etcd does
            # for a rejected MsgPreVoteResp. Else a node whose log is the most up to date
            # but whose term is behind would ask forever at a term nobody grants, while
            # the others (at the higher term) refuse it and it refuses their less up to
            # date logs.
            self._SyncObj__setCurrentTerm(current_term, None)
            self._SyncObj__setState(_RAFT_FOLLOWER_STATE)
            return
        if (
            term != self._raftwal_pre_vote_term
            or term != self._SyncObj__raftCurrentTerm + 1
            or self._SyncObj__raftState == _RAFT_LEADER_STATE
            or message.get("granted") is not True
            or node not in self._SyncObj__otherNodes
        ):
            return
        self._raftwal_pre_vote_grants.add(str(node.id))
        self._raftwal_count_pre_votes()

    def raftwal_on_higher_term(self, node: Any, message: dict[str, Any]) -> None:
        """A voter answered our AppendEntries with a higher term (HIGHER_TERM): follow
        that term, as pysyncobj does on any message of a higher term (line 918); an
        election follows."""
        term = message.get("term")
        if (
            type(term) is int
            and term > self._SyncObj__raftCurrentTerm
            and node in self._SyncObj__otherNodes
        ):
            self._SyncObj__setCurrentTerm(term, None)
            self._SyncObj__setState(_RAFT_FOLLOWER_STATE)
            self._SyncObj__raftLeader = None

    def _raftwal_count_pre_votes(self) -> None:
        voters = len(self._SyncObj__otherNodes) + 1
        if 1 + len(self._raftwal_pre_vote_grants) > voters / 2:
            self._raftwal_pre_vote_won_term = self._raftwal_pre_vote_term
            # pysyncobj's election check runs at the start of the next tick (or of this
            # one, when the round was won inside `_raftwal_pre_election`).
            self._SyncObj__raftElectionDeadline = 0

    def _raftwal_node(self, address: str) -> TCPNode:
        dial = self._raftwal_dial.get(address)
        return (
            DialedNode(address, dial) if dial is not None and dial != address else TCPNode(address)
        )

    # ---- membership change (dynamicMembershipChange=True)
    #
    # pysyncobj applies a membership entry to its voter set as soon as it is in the log
    # (appended by the leader, line 526; received by a follower, line 1009), undoes it when
    # a conflicting leader truncates it (line 993), and re-applies it, as a no-op, when it
    # commits (line 887). Two overrides keep our node objects (a partner may be dialled
    # through a proxy: DialedNode) and keep a peer from ever adding itself (pysyncobj
    # compares with its self node, which is None on a read-only peer).

    def _SyncObj__doChangeCluster(  # noqa: N802 (overrides a mangled name)
        self, request: Any, reverse: bool = False
    ) -> bool:
        kind, address = str(request[0]), str(request[1])
        if address == self._raftwal_own_address:
            # This peer itself: a voter is its own member already (and never removes
            # itself: pysyncobj refuses that too), and a read-only peer being promoted
            # restarts as a voter rather than dial itself.
            return False
        changed = bool(
            SyncObj._SyncObj__doChangeCluster(  # type: ignore[attr-defined]
                self, [kind, address, self._raftwal_node(address)], reverse
            )
        )
        if changed and self.raftwal_on_membership is not None:
            self.raftwal_on_membership()
        return changed

    def _SyncObj__changeCluster(self, request: Any) -> bool:  # noqa: N802 (mangled name)
        # The leader, about to append a membership entry (line 526). pysyncobj means to
        # allow one change at a time (line 1361) but never sets __changeClusterIDx, so it
        # would append a second change before the first commits; check the log instead.
        # It does refuse until the no-op of the leader's term is applied (line 1357), the
        # known pitfall of single-server changes after a leader change.
        noop_index = self._SyncObj__noopIDx
        if noop_index is None or self._SyncObj__raftLastApplied < noop_index:
            return False
        if self.raftwal_membership_pending():
            return False
        return bool(self._SyncObj__doChangeCluster(request))

    def _SyncObj__updateClusterConfiguration(  # noqa: N802 (overrides a mangled name)
        self, new_nodes: Any
    ) -> None:
        # A snapshot's member list (line 1508): addresses, this peer's own among them.
        addresses = {str(getattr(node, "id", node)) for node in new_nodes if node is not None}
        addresses.discard(self._raftwal_own_address)
        SyncObj._SyncObj__updateClusterConfiguration(  # type: ignore[attr-defined]
            self, [self._raftwal_node(a) for a in sorted(addresses)]
        )
        if self.raftwal_on_membership is not None:
            self.raftwal_on_membership()

    def raftwal_apply_uncommitted_membership(self) -> None:
        """At start, after the committed log was replayed: a membership entry takes effect
        once it is in the log (Raft's single-server change), committed or not. pysyncobj
        replays only the committed ones (line 887); apply the rest, in order."""
        commit = self._SyncObj__raftCommitIndex
        for command, _index, _term in self._SyncObj__getEntries(commit + 1):
            request = membership_request(bytes(command))
            if request is not None:
                self._SyncObj__doChangeCluster(list(request))

    def raftwal_membership_at(self, index: int) -> set[str]:
        """The voter addresses as of raft index `index` (this peer's own included when it is
        a voter): today's set with every membership entry after `index` undone. A snapshot
        at `index` records this set, not today's, which may hold changes a new leader
        truncates later."""
        members = {str(node.id) for node in self._SyncObj__otherNodes}
        if self._SyncObj__selfNode is not None:
            members.add(self._raftwal_own_address)
        for command, _index, _term in reversed(self._SyncObj__getEntries(index + 1)):
            request = membership_request(bytes(command))
            if request is None:
                continue
            kind, address = request
            if kind == "add":
                members.discard(address)
            else:
                members.add(address)
        return members

    def raftwal_membership_pending(self) -> bool:
        """A membership entry is in the log but not committed: another change is refused,
        and the voter set may still move back."""
        commit = self._SyncObj__raftCommitIndex
        return any(
            membership_request(bytes(command)) is not None
            for command, _index, _term in self._SyncObj__getEntries(commit + 1)
        )

    def raftwal_change_membership(
        self, kind: str, address: str, callback: Callable[[Any, int], None]
    ) -> None:
        """Queue a membership change; pysyncobj appends it on the leader's next tick if the
        leader committed an entry of its own term (its no-op) and no other change is
        uncommitted (`__changeCluster`, line 1356), else the callback gets REQUEST_DENIED.
        The entry carries a plain TCPNode: the peers' own node objects are made on
        receipt (`_SyncObj__doChangeCluster`)."""
        if kind == "add":
            self.addNodeToCluster(address, callback)
        else:
            self.removeNodeFromCluster(address, callback)

    @replicated
    def raftwal_apply(self, command: bytes) -> bytes:
        # __applyLogEntries (line 708) applies entries in order starting at lastApplied + 1
        # and increments lastApplied after each (line 725): this entry's index is that.
        assert type(command) is bytes, f"replicated entry carries {type(command).__name__}"
        return self._raftwal_apply_entry(command, self.raftLastApplied + 1)

    # ---- private-state accessors (names mangled by SyncObj's double underscores)

    def raftwal_install_journal(
        self, journal: DurableJournal, min_commit_index: int, voter: bool = True
    ) -> None:
        """Swap the MemoryJournal SyncObj.__init__ made (conf.journalFile=None) for ours.

        Repeats what SyncObj.__init__ does with a fresh journal (lines 166-176): a no-op
        first entry if empty, then term, vote and commit index restored from it. Only valid
        before the first tick (autoTick is off, so no thread has touched the journal yet).
        """
        for name in (
            "_SyncObj__raftLog",
            "_SyncObj__raftCurrentTerm",
            "_SyncObj__votedForNodeId",
            "_SyncObj__raftCommitIndex",
        ):
            assert hasattr(self, name), f"pysyncobj internals changed: no {name}"
        if len(journal) == 0:
            journal.add(NO_OP_COMMAND, 1, 0)
            journal.sync()
        self._SyncObj__raftLog = journal
        if voter:
            self._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
            self._SyncObj__votedForNodeId = journal.getVotedForNodeId()
        else:
            # A read-only peer never votes, so the term it stored only keeps it from
            # following a leader of a lower term: the last entry's term is enough. A voter
            # removed from the set may have stored a term far above the cluster's (it
            # called elections nobody answered); restarted as a data node with that term it
            # would ignore the real leader's AppendEntries for good. Whatever it follows
            # from a lower term is still only applied once committed.
            self._SyncObj__raftCurrentTerm = journal[-1][2]
            self._SyncObj__votedForNodeId = None
        commit_index = journal.getRaftCommitIndex()
        ceiling = max(journal.last_index, min_commit_index)
        if commit_index > ceiling:
            logger.warning(
                "stored commit index %d is past the durable log (%d); clamping",
                commit_index,
                ceiling,
            )
            commit_index = ceiling
        self._SyncObj__raftCommitIndex = commit_index

    def raftwal_send_append_entries(self) -> None:
        """Send AppendEntries to every follower now (syncobj.py line 1251)."""
        self._SyncObj__sendAppendEntries()

    def raftwal_commit_term(self) -> int:
        """The term of the entry at the commit index (0 if it is compacted away)."""
        entries = self._SyncObj__getEntries(self._SyncObj__raftCommitIndex, 1)
        return int(entries[0][2]) if entries else 0

    def raftwal_cluster_size(self) -> int:
        return len(self._SyncObj__otherNodes) + 1

    def raftwal_voter_ids(self) -> set[str]:
        """The other voting members' ids (their addresses; read-only nodes are not)."""
        return {str(node.id) for node in list(self._SyncObj__otherNodes)}

    def raftwal_state(self) -> int:
        state = self._SyncObj__raftState
        assert isinstance(state, int)
        return state

    def raftwal_transport(self) -> DurableTransport:
        return self._raftwal_transport
