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
import logging
import os
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.monotonic import monotonic as monotonicTime
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from raft.journal import DurableJournal

logger = logging.getLogger(__name__)

SUPPORTED_PYSYNCOBJ_VERSION = "0.3.17"

# pysyncobj's command type byte of a no-op entry (syncobj.py _COMMAND_TYPE.NO_OP).
NO_OP_COMMAND = b"\x01"

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


class DurableTransport(TCPTransport):
    """pysyncobj's TCP transport with acknowledgements routed through an `AckGate`."""

    def __init__(self, sync_obj: SyncObj, self_node: Any, other_nodes: Any, gate: AckGate):
        self._raftwal_gate = gate
        super().__init__(sync_obj, self_node, other_nodes)

    def send(self, node: Any, message: Any) -> bool:
        if self._raftwal_gate.maybe_defer(node, message):
            return True
        return self.send_now(node, message)

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
        self_address: str,
        partner_addresses: list[str],
        conf: SyncObjConf,
        apply_entry: Callable[[bytes, int], bytes],
        gate: AckGate,
        dial_addresses: dict[str, str] | None = None,
    ) -> None:
        # Set before SyncObj.__init__, which scans dir(self) for replicated methods.
        self._raftwal_apply_entry = apply_entry

        def make_transport(sync_obj: SyncObj, self_node: Any, other_nodes: Any) -> TCPTransport:
            transport = DurableTransport(sync_obj, self_node, other_nodes, gate)
            self._raftwal_transport = transport
            return transport

        dial = dial_addresses or {}
        partners = [DialedNode(a, dial[a]) if a in dial else a for a in partner_addresses]
        super().__init__(self_address, partners, conf=conf, transportClass=make_transport)

    @replicated
    def raftwal_apply(self, command: bytes) -> bytes:
        # __applyLogEntries (line 708) applies entries in order starting at lastApplied + 1
        # and increments lastApplied after each (line 725): this entry's index is that.
        assert type(command) is bytes, f"replicated entry carries {type(command).__name__}"
        return self._raftwal_apply_entry(command, self.raftLastApplied + 1)

    # ---- private-state accessors (names mangled by SyncObj's double underscores)

    def raftwal_install_journal(self, journal: DurableJournal, min_commit_index: int) -> None:
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
        self._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
        self._SyncObj__votedForNodeId = journal.getVotedForNodeId()
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

    def raftwal_state(self) -> int:
        state = self._SyncObj__raftState
        assert isinstance(state, int)
        return state

    def raftwal_transport(self) -> DurableTransport:
        return self._raftwal_transport
