"""The public ``StreamingNode`` service: Produce, Consume, transactions, GetLatestTimeTick
and ReadSegment, served by a pchannel's owner.

The servicer validates, calls the data plane (``wal_segments``), and maps outcomes to gRPC
statuses with an ErrorInfo; a bad request never reaches a file. Transactions are buffered
here (bounded by count, size and the node's and each producer's byte budgets) and written
as one replicated batch at commit; each answers only the caller that began it (its token or
client certificate and its producer_id, ``callers.check_owner``) and has a random id. A Consume that asks for time-tick watermarks gets the
committed time tick it has read past, also while its pchannel is idle (the owner appends
time-tick entries). Produce and transaction writes are refused with RESOURCE_EXHAUSTED
while a data directory is past its hard disk watermark (``DiskGuard``), and a write the
filesystem refused (ENOSPC) is answered the same way; reads are never refused for
space. Depends on ``StreamingBackend``, ``DataView`` and ``DiskGuard``, never on the node
itself.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import errno
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftwal.services import consume_wire
from raftwal.services.backend import DataView, DiskGuard, StreamingBackend, VChannelInfo
from raftwal.services.callers import TxnOwner, caller_identity, check_owner
from raftwal.services.common import fail
from raftwal.services.replicated import (
    TXN_MARKER_TYPES,
    check_replicated_batch,
    check_replicator,
    check_source_names,
    with_source_positions,
    with_transactions,
)
from raftwal.services.replicated import producer_id as replicated_producer_id
from raftwal.services.segment_transfer import SegmentTransfers
from rpc import append_stream, produce_stream
from rpc.errors import RaftwalError, error_info, to_status
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from statemachine.replicate import write_refusal
from statemachine.types import DEFAULT_LIMITS as LIMITS
from statemachine.validation import check_name
from wal_segments.format import (
    CONTROL_FLAGS,
    CONTROL_MSG_TYPES,
    ENTRY_HEADER_SIZE,
    MAX_KEY_BYTES,
    PRODUCIBLE_MSG_TYPES,
    TXN_FLAGS,
    EntryFlags,
    FormatError,
    MsgType,
    crc32c,
    decode_properties,
    frame_headers,
    msg_type_code,
    msg_type_name,
)
from wal_segments.log import LogError
from wal_segments.owner import DISK_FULL_MARK, TXN_COUNT_PROPERTY, Message, WalError
from wal_segments.plane import DataPlane
from wal_segments.segment import SegmentCorrupted, SegmentReader

log = logging.getLogger(__name__)
E = errors_pb2

MAX_MESSAGES_PER_BATCH = 10_000
_EMPTY: dict[str, str] = {}
MAX_PAYLOAD_BYTES = 8 << 20
MAX_PRODUCER_ID_CHARS = 128
MAX_INFLIGHT_PER_STREAM = 64
CONSUME_POLL_S = 1.0
DEFAULT_CONSUME_BATCH = 1000
MAX_CONSUME_BATCH = 10_000
# Bytes of log read per Consume reply. Replies of 4 MiB stalled the stream on HTTP/2 flow
# control (about 24,000 10 KiB entries/s); 512 KiB ones keep it moving (60,000-86,000).
CONSUME_CHUNK_BYTES = 1 << 19
#: ConsumeRequest.time_tick_interval_ms upper bound
MAX_TIME_TICK_INTERVAL_MS = 60_000
DEFAULT_TXN_KEEPALIVE_MS = 10_000
MAX_TXN_KEEPALIVE_MS = 600_000
MAX_TXN_BYTES = 16 << 20
# One Consume read of a whole transaction bigger than a chunk (its begin and commit entries
# and frame headers fit in the slack).
CONSUME_TXN_BYTES = MAX_TXN_BYTES + (1 << 20)
MAX_OPEN_TXNS = 10_000
# Seal: how long it waits for the sealed segments to be committed to the manifest.
DEFAULT_SEAL_WAIT_MS = 10_000
MAX_SEAL_WAIT_MS = 60_000
SEAL_POLL_S = 0.05
# Ended transactions whose outcome a node remembers for retries (see _Ended), oldest first.
MAX_ENDED_TXNS = 10_000
RESERVED_PROPERTY_PREFIX = "rw."
#: message types a producer may not write (the WAL writes them itself)


def _producible(name: str) -> int:
    """The code of a message type a producer may send; INVALID_ARGUMENT listing those types
    otherwise (the WAL's own control types are not offered)."""
    expected = f"expected one of {', '.join(PRODUCIBLE_MSG_TYPES)}"
    try:
        code = msg_type_code(name)
    except ValueError:
        raise fail(E.INVALID_ARGUMENT, f"unknown msg_type {name[:64]!r} ({expected})") from None
    if code in CONTROL_MSG_TYPES:
        raise fail(
            E.INVALID_ARGUMENT, f"msg_type {name!r} is reserved for the WAL itself ({expected})"
        )
    return code


def _compacted(lsn: int, first_lsn: int) -> RaftwalError:
    """COMPACTED for a read at `lsn`, below the first LSN retention kept."""
    return fail(
        E.COMPACTED,
        f"lsn {lsn} was deleted by retention (expected >= {first_lsn}, the first lsn retained)",
        first_available=first_lsn,
    )


def _complete_prefix(entry_flags: list[int]) -> int:
    """How many entries (given by their flags) to deliver: all but an incomplete
    transaction at the end."""
    cut = len(entry_flags)
    for index in range(len(entry_flags) - 1, -1, -1):
        flags = entry_flags[index]
        if not flags & TXN_FLAGS or flags & (EntryFlags.TXN_COMMIT | EntryFlags.TXN_ROLLBACK):
            break
        cut = index
    return cut


def _txn_bytes(message: wire.Message | Message) -> int:
    """What one message of a transaction counts against its limits (payload, key and a
    fixed allowance for the header and properties)."""
    return len(message.payload) + len(message.key) + 100


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


def _peer_host(peer: str) -> str:
    """The host part of grpc's peer string ("ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1")."""
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() else peer


def _count(table: dict[str, int], key: str, change: int) -> None:
    """Add `change` to `table[key]`, forgetting a key that falls to zero."""
    left = table.get(key, 0) + change
    if left > 0:
        table[key] = left
    else:
        table.pop(key, None)


def _retrieve_quietly(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("produce stream reader ended: %r", task.exception())


# -- transactions ----------------------------------------------------------------------------


def _caller(request: Any, context: Any) -> TxnOwner:
    """The caller of a transaction call, to compare with the transaction's opener."""
    return TxnOwner(caller_identity(context), request.producer_id)


@dataclass
class _Txn:
    txn_id: int
    vchannel: str
    vchannel_id: int
    pchannel: str
    term: int
    keepalive_ms: int
    deadline: float
    messages: list[Message] = field(default_factory=list)
    bytes: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: whose budget it draws on: the BeginTxn producer_id, else the client's address
    producer: str = ""
    #: who began it; every later call must be the same caller (``callers.check_owner``)
    owner: TxnOwner = TxnOwner("", "")


@dataclass
class _Ended:
    """How a transaction ended, for a retry of its CommitTxn or RollbackTxn (Kafka's EndTxn
    answers a retry with the original outcome): "committed" with the positions (a future:
    a retry that arrives while the commit is replicating waits for the same answer), or
    "rolled_back"."""

    state: str
    vchannel: str
    positions: asyncio.Future[list[tuple[int, int]]] | None = None
    owner: TxnOwner = TxnOwner("", "")


# -- the public service ----------------------------------------------------------------------


class _OwnerSource:
    """What Consume reads on the owner: every committed entry of its term and before."""

    replica = False

    def __init__(self, servicer: StreamingNodeServicer, pchannel: str, owner: Any) -> None:
        self._servicer = servicer
        self.pchannel = pchannel
        self.owner = owner
        self.log = owner.log

    @property
    def committed(self) -> int:
        return int(self.owner.committed_lsn)

    @property
    def term(self) -> int:
        return int(self.owner.term)

    def stopped(self) -> RaftwalError | None:
        owner = self.owner
        if owner.serving:
            return None
        hint = self._servicer._view.owner_hint(self.pchannel)[0]
        if owner.state == "fenced":
            return fail(
                E.CHANNEL_FENCED,
                f"pchannel {self.pchannel} moved on from term {owner.term}",
                current_term=owner.fenced_by,
                owner_hint=hint,
            )
        return fail(
            E.NOT_OWNER,
            f"node {self._servicer._node.me.id} stopped serving {self.pchannel}",
            owner_hint=hint,
        )

    async def wait_commit_change(self, timeout_s: float) -> None:
        await self.owner.wait_commit_change(timeout_s)

    async def wait_beyond(self, lsn: int, timeout_s: float) -> None:
        """Wait (bounded) for `lsn` to be appended and then committed. An entry appended
        already waits for the commit point only: the owner's commit point moves without
        waking the log's append waiters, and at the end of a burst no later append comes,
        so a wait for one held the burst's last entries back for the whole timeout."""
        if self.log.last_lsn < lsn:
            await self.log.wait_appended(timeout_s)
        # The commit point moves after the append: give it a moment.
        if self.owner.committed_lsn < lsn:
            await self.owner.wait_commit_change(timeout_s)


class _ReplicaSource:
    """What Consume reads on a replica that does not own the pchannel: the entries its log
    holds durably and knows to be committed (the owner's commit point arrives with every
    append and heartbeat). Committed entries are never truncated, so nothing served here
    can be taken back, whoever owns the pchannel later."""

    replica = True

    def __init__(self, servicer: StreamingNodeServicer, pchannel: str, log: Any) -> None:
        self._servicer = servicer
        self.pchannel = pchannel
        self.log = log

    @property
    def committed(self) -> int:
        return min(int(self.log.committed_lsn), int(self.log.last_lsn))

    @property
    def term(self) -> int:
        return int(self.log.fenced_term)

    def stopped(self) -> RaftwalError | None:
        servicer = self._servicer
        assignment = servicer._view.view.assignments.get(self.pchannel)
        me = servicer._node.me.id
        if self.log.closed or assignment is None or me not in assignment.replica_node_ids:
            return fail(
                E.NOT_OWNER,
                f"node {me} no longer holds a replica of pchannel {self.pchannel}",
                owner_hint=servicer._view.owner_hint(self.pchannel)[0],
            )
        if self.log.failure is not None:
            # A local I/O failure (a failed fdatasync, a truncation cut short): the log is
            # reopened from its files by the next call that asks for it (a retry).
            return fail(
                E.ON_SHUTDOWN,
                f"node {me}'s replica of pchannel {self.pchannel} failed and is being "
                "reopened; retry",
            )
        return None

    async def wait_commit_change(self, timeout_s: float) -> None:
        await self.log.wait_appended(timeout_s)

    async def wait_beyond(self, lsn: int, timeout_s: float) -> None:
        await self.log.wait_appended(timeout_s)


class StreamingNodeServicer(streaming_pb2_grpc.StreamingNodeServicer):
    def __init__(
        self,
        node: StreamingBackend,
        plane: DataPlane,
        view: DataView,
        transfers: SegmentTransfers | None = None,
        max_frame_bytes: int = 32 << 20,
        disk: DiskGuard | None = None,
    ) -> None:
        self._node = node
        self._plane = plane
        self._view = view
        # The disk watermarks (None: no refusal for space, e.g. a servicer under test).
        self._disk = disk
        # The segment transfer port, for ReadSegment's bulk requests and Produce streams
        # (None: gRPC only).
        self._transfers = transfers
        # The largest Produce request read from a Produce connection (the gRPC message
        # size limit, which bounds the Produce call the same way).
        self._max_frame_bytes = max_frame_bytes
        self._segments = _RecentSegments()
        self._txns: dict[int, _Txn] = {}
        self._ended: OrderedDict[int, _Ended] = OrderedDict()
        # Bytes buffered by open transactions, in all, per producer and per caller identity
        # (the budgets; a caller without an identity has no identity budget).
        self._txn_bytes = 0
        self._producer_txn_bytes: dict[str, int] = {}
        self._identity_txn_bytes: dict[str, int] = {}

    # plumbing

    async def _abort(self, context: grpc.aio.ServicerContext, error: BaseException) -> None:
        if isinstance(error, (RaftwalError, WalError)):
            info = error.info
        else:
            log.exception("internal error in StreamingNode", exc_info=error)
            info = error_info(E.INNER, f"internal error: {error!r}"[:300])
        await context.abort_with_status(to_status(info))

    def _check_writable(self, pchannel: str, what: str, refresh: bool = False) -> None:
        """Refuse a client's write to a pchannel that is a replication target, or of a
        cluster whose writes a switchover paused (docs/replication.md). With `refresh`,
        against the node's newest applied state (the check the owner runs under its write
        lock, so that no write admitted before a pause lands after it)."""
        if refresh:
            self._view.refresh()
        view = self._view.view
        refusal = write_refusal(
            view.replicate_configuration, view.replicate_cluster_id, pchannel, what
        )
        if refusal:
            raise fail(E.IGNORED_OPERATION, refusal)

    def _check_disk(self, what: str) -> None:
        """Refuse a client write while a data directory is past its hard watermark."""
        if self._disk is not None:
            refusal = self._disk.write_refusal(what)
            if refusal is not None:
                raise RaftwalError(refusal)

    def _with_disk(self, info: errors_pb2.ErrorInfo) -> errors_pb2.ErrorInfo:
        """`info` with the disk detail when it is a write the filesystem refused (ENOSPC,
        answered RESOURCE_EXHAUSTED by the owner) and has none yet."""
        if (
            info.code == E.RESOURCE_EXHAUSTED
            and DISK_FULL_MARK in info.message
            and not info.HasField("disk")
            and self._disk is not None
        ):
            detailed = errors_pb2.ErrorInfo()
            detailed.CopyFrom(info)
            detailed.disk.CopyFrom(self._disk.full_detail())
            return detailed
        return info

    def _os_error(self, error: BaseException) -> RaftwalError:
        """A local I/O error as an answer: RESOURCE_EXHAUSTED for a full disk (retry once
        space returns), INNER otherwise."""
        if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            message = f"{DISK_FULL_MARK} on node {self._node.me.id} ({error})"
            info = error_info(E.RESOURCE_EXHAUSTED, message[:300] + "; retry once space returns")
            return RaftwalError(self._with_disk(info))
        return fail(E.INNER, str(error)[:300])

    def _check_replicated_from(self, pchannel: str, cluster_id: str, identity: str) -> None:
        """Refuse a replicated batch unless `pchannel` is a target of `cluster_id` and the
        caller (`identity`) holds that source's replication credential
        (`replicated.check_replicator`)."""
        view = self._view.view
        check_replicator(
            view.replicate_configuration, view.replicate_cluster_id, pchannel, cluster_id, identity
        )

    def _owner(self, pchannel: str):  # type: ignore[no-untyped-def]
        owner = self._plane.owner(pchannel)
        if owner is None or not owner.serving:
            if owner is not None and owner.state == "fenced":
                raise fail(
                    E.CHANNEL_FENCED,
                    f"pchannel {pchannel} was fenced at term {owner.term}",
                    current_term=owner.fenced_by,
                    owner_hint=self._view.owner_hint(pchannel)[0],
                )
            if pchannel not in self._view.view.pchannels:
                raise fail(E.CHANNEL_NOT_EXIST, f"pchannel {pchannel!r} does not exist")
            hint, term = self._view.owner_hint(pchannel)
            if hint == self._node.me.grpc_address:
                hint = ""
            raise fail(
                E.NOT_OWNER,
                f"node {self._node.me.id} does not serve pchannel {pchannel} now"
                + (f" (owner {hint} at term {term})" if hint else " (recovering or unassigned)"),
                owner_hint=hint,
                current_term=term,
            )
        return owner

    async def _read_source(
        self, pchannel: str, from_replica: bool
    ) -> _OwnerSource | _ReplicaSource:
        """The owner when this node serves `pchannel`; else, with `from_replica`, this node's
        replica of it; else the owner's NOT_OWNER / CHANNEL_FENCED answer."""
        try:
            return _OwnerSource(self, pchannel, self._owner(pchannel))
        except RaftwalError as error:
            if not from_replica or error.info.code not in (E.NOT_OWNER, E.CHANNEL_FENCED):
                raise
            assignment = self._view.view.assignments.get(pchannel)
            if assignment is None or self._node.me.id not in assignment.replica_node_ids:
                raise
        return _ReplicaSource(self, pchannel, await self._plane.log(pchannel))

    def _vchannel(self, name: str, pchannel: str | None = None) -> VChannelInfo:
        bad = check_name("vchannel", name, LIMITS)
        if bad is not None:
            raise fail(E.INVALID_ARGUMENT, bad.message)
        vchannel = self._view.view.vchannels.get(name)
        if vchannel is None or not vchannel.normal:
            raise fail(E.CHANNEL_NOT_EXIST, f"vchannel {name!r} does not exist or was dropped")
        if pchannel is not None and vchannel.pchannel != pchannel:
            raise fail(
                E.INVALID_ARGUMENT,
                f"vchannel {name!r} is on pchannel {vchannel.pchannel!r} (got {pchannel!r})",
            )
        return vchannel

    def _message(self, message: wire.Message, pchannel: str | None) -> tuple[Message, str]:
        vchannel = self._vchannel(message.vchannel, pchannel)
        code = _producible(message.msg_type or "message")
        if len(message.payload) > MAX_PAYLOAD_BYTES:
            raise fail(
                E.INVALID_ARGUMENT,
                f"payload too large ({len(message.payload)} bytes; expected <= {MAX_PAYLOAD_BYTES})",
            )
        if len(message.key) > MAX_KEY_BYTES:
            raise fail(
                E.INVALID_ARGUMENT,
                f"key too large ({len(message.key)} bytes; expected <= {MAX_KEY_BYTES})",
            )
        for key, value in message.properties.items():
            if "\x00" in key or "\x00" in value or key.startswith(RESERVED_PROPERTY_PREFIX):
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid property {key[:64]!r} (expected no NUL and no "
                    f"{RESERVED_PROPERTY_PREFIX!r} prefix)",
                )
        return (
            Message(
                vchannel_id=vchannel.id,
                msg_type=code,
                key=message.key,
                payload=message.payload,
                properties=dict(message.properties),
            ),
            vchannel.pchannel,
        )

    def _compact_messages(self, request: wire.ProduceRequest) -> list[Message]:
        vchannel_id = self._vchannel(request.batch_vchannel, request.pchannel).id
        code = _producible(request.batch_msg_type or "message")
        payloads = list(request.payloads)
        largest = max(map(len, payloads))
        if largest > MAX_PAYLOAD_BYTES:
            raise fail(
                E.INVALID_ARGUMENT,
                f"payload too large ({largest} bytes; expected <= {MAX_PAYLOAD_BYTES})",
            )
        return [(vchannel_id, code, b"", payload, _EMPTY, 0, 0, 0) for payload in payloads]  # type: ignore[misc]

    def _messages(self, batch, pchannel: str) -> list[Message]:  # type: ignore[no-untyped-def]
        """`_message` for a whole batch, validating each vchannel and type name once."""
        vchannel_ids: dict[str, int] = {}
        type_codes: dict[str, int] = {}
        out = []
        empty: dict[str, str] = {}
        for message in batch:
            vchannel_id = vchannel_ids.get(message.vchannel)
            if vchannel_id is None:
                vchannel_id = vchannel_ids[message.vchannel] = self._vchannel(
                    message.vchannel, pchannel
                ).id
            code = type_codes.get(message.msg_type)
            if code is None:
                code = _producible(message.msg_type or "message")
                type_codes[message.msg_type] = code
            payload, key = message.payload, message.key
            if len(payload) > MAX_PAYLOAD_BYTES or len(key) > MAX_KEY_BYTES:
                self._message(message, pchannel)  # raises with the precise message
            properties = empty
            if len(message.properties):
                properties = dict(message.properties)
                for name, value in properties.items():
                    if (
                        "\x00" in name
                        or "\x00" in value
                        or name.startswith(RESERVED_PROPERTY_PREFIX)
                    ):
                        raise fail(
                            E.INVALID_ARGUMENT,
                            f"invalid property {name[:64]!r} (expected no NUL and no "
                            f"{RESERVED_PROPERTY_PREFIX!r} prefix)",
                        )
            out.append(Message(vchannel_id, code, key, payload, properties))
        return out

    # Produce

    async def _produce_one(self, request: wire.ProduceRequest, identity: str) -> wire.ProduceResult:
        """Write one Produce request for a caller whose ``caller_identity`` is `identity`."""
        try:
            bad = check_name("pchannel", request.pchannel, LIMITS)
            if bad is not None:
                raise fail(E.INVALID_ARGUMENT, bad.message)
            compact = len(request.payloads) > 0
            count = len(request.payloads) if compact else len(request.messages)
            if compact and len(request.messages):
                raise fail(
                    E.INVALID_ARGUMENT,
                    "both messages and payloads set (expected exactly one of them)",
                )
            if not 1 <= count <= MAX_MESSAGES_PER_BATCH:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid batch size ({count}; expected 1..{MAX_MESSAGES_PER_BATCH})",
                )
            if len(request.producer_id) > MAX_PRODUCER_ID_CHARS or request.sequence < 0:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid producer ({request.producer_id[:32]!r}, sequence "
                    f"{request.sequence}; expected <= {MAX_PRODUCER_ID_CHARS} chars and "
                    "sequence >= 0)",
                )
            if request.expected_last_lsn < -1:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid expected_last_lsn ({request.expected_last_lsn}; expected >= -1)",
                )
            check_replicated_batch(request, count)
            if not request.HasField("replicate_source"):
                self._check_writable(request.pchannel, "a Produce")
            else:
                self._check_replicated_from(
                    request.pchannel, request.replicate_source.cluster_id, identity
                )
            previous_sequence = None
            if request.HasField("previous_sequence"):
                if (
                    request.previous_sequence < 0
                    or not request.producer_id
                    or request.sequence <= 0
                ):
                    raise fail(
                        E.INVALID_ARGUMENT,
                        f"invalid previous_sequence ({request.previous_sequence} with producer "
                        f"{request.producer_id[:32]!r} sequence {request.sequence}; expected >= 0, "
                        "with a producer_id and a sequence > 0)",
                    )
                previous_sequence = request.previous_sequence
            try:
                owner = self._owner(request.pchannel)
            except RaftwalError as error:
                if error.info.code == E.NOT_OWNER and not error.info.owner_hint:
                    # The pchannel recovers here (or is unassigned): when this node's disk
                    # is full, that is the answer worth giving (recovery needs the space).
                    self._check_disk("a Produce")
                raise
            self._check_disk("a Produce")
            if compact:
                messages = self._compact_messages(request)
            elif request.HasField("replicate_source"):
                # A replicated transaction's markers are written as this node's own.
                types = [m.msg_type for m in request.messages]
                plain = [
                    wire.Message(vchannel=m.vchannel) if m.msg_type in TXN_MARKER_TYPES else m
                    for m in request.messages
                ]
                messages = with_transactions(
                    self._messages(plain, request.pchannel), types, self._new_txn_id
                )
            else:
                messages = self._messages(request.messages, request.pchannel)
            if request.HasField("replicate_source"):
                messages = with_source_positions(messages, request.replicate_source)
            admit = None
            if not request.HasField("replicate_source"):
                pchannel = request.pchannel

                def admit() -> None:
                    self._check_writable(pchannel, "a Produce", refresh=True)

            positions, duplicate = await owner.write(
                messages,
                producer_id=request.producer_id,
                sequence=request.sequence if request.producer_id else 0,
                expected_last_lsn=request.expected_last_lsn,
                previous_sequence=previous_sequence,
                admit=admit,
            )
            result = wire.ProduceResult(
                request_id=request.request_id,
                term=owner.term,
                duplicate=duplicate,
                first_lsn=positions[0][0],
                time_ticks=[tick for _, tick in positions],
            )
            if not compact:
                result.positions.extend(
                    [wire.Position(lsn=lsn, time_tick=tick) for lsn, tick in positions]
                )
            return result
        except (RaftwalError, WalError) as error:
            return wire.ProduceResult(
                request_id=request.request_id, error=self._with_disk(error.info)
            )
        except (LogError, OSError, ValueError) as error:
            return wire.ProduceResult(
                request_id=request.request_id, error=self._os_error(error).info
            )
        except Exception as error:  # noqa: BLE001 - logged and answered, never left pending
            # Anything else is a bug, but the producer must still get an answer: a request
            # without a result would hang its stream.
            log.exception("internal error in Produce")
            return wire.ProduceResult(
                request_id=request.request_id,
                error=error_info(E.INNER, f"internal error: {error!r}"[:300]),
            )

    async def Produce(self, request_iterator, context):
        produced = self._produce_results(request_iterator, caller_identity(context))
        async with contextlib.aclosing(produced) as results:
            async for result in results:
                yield result

    async def OpenProduce(self, request, context):
        """A ticket for one Produce connection to this node's transfer port, or none (the
        producer then calls Produce)."""
        ticket = (
            self._transfers.offer_produce(caller_identity(context))
            if self._transfers is not None
            else None
        )
        if ticket is None:
            return wire.OpenProduceResponse()
        assert self._transfers is not None
        return wire.OpenProduceResponse(
            ticket=ticket, port=self._transfers.port, max_frame_bytes=self._max_frame_bytes
        )

    async def serve_produce_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, asked_by: str
    ) -> None:
        """A producer's Produce stream over the transfer port (`rpc.produce_stream`), after
        its ticket matched: the same requests and results as `Produce`, framed, for the
        caller who asked for the ticket (`asked_by`, its ``caller_identity``). Returns
        when the producer closed, reset or stalled the connection, sent nothing for
        `produce_stream.IDLE_TIMEOUT_S`, or sent a frame over the cap or one that is no
        ProduceRequest (the port then closes the connection)."""
        ended = await append_stream.serve_messages(
            reader,
            writer,
            self._max_frame_bytes,
            produce_stream.IDLE_TIMEOUT_S,
            wire.ProduceRequest,
            lambda requests: self._produce_results(requests, asked_by),
            # A bad frame gets a clear answer before the connection closes (request id 0:
            # no request of the stream matches it).
            lambda reason, code: wire.ProduceResult(
                request_id=0, error=error_info(code, reason[:500])
            ),
            self._transfers.frame_budget if self._transfers is not None else None,
        )
        log.debug("produce connection from %s ended: %s", writer.get_extra_info("peername"), ended)

    async def _produce_results(
        self, request_iterator: AsyncIterator[wire.ProduceRequest], identity: str
    ) -> AsyncIterator[wire.ProduceResult]:
        """The results of a Produce stream (gRPC or framed): each request is written in
        the order it came, its result comes back when it is acknowledged or failed (not
        necessarily in request order; the request id matches them)."""
        results: asyncio.Queue[wire.ProduceResult | None] = asyncio.Queue()
        slots = asyncio.Semaphore(MAX_INFLIGHT_PER_STREAM)
        tasks: set[asyncio.Task[None]] = set()

        async def run(request: wire.ProduceRequest) -> None:
            try:
                results.put_nowait(await self._produce_one(request, identity))
            finally:
                slots.release()

        async def reader() -> None:
            try:
                async for request in request_iterator:
                    await slots.acquire()
                    task = asyncio.create_task(run(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    # Let the task take its place in the owner's write order now.
                    await asyncio.sleep(0)
                while tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                results.put_nowait(None)

        reading = asyncio.create_task(reader())
        try:
            while True:
                result = await results.get()
                if result is None:
                    break
                yield result
        finally:
            reading.cancel()
            for task in list(tasks):
                task.cancel()
            # Retrieved: the client going away (its stream cancelled or reset) is how a
            # Produce stream normally ends, not an error of this node.
            reading.add_done_callback(_retrieve_quietly)

    # Consume

    async def Consume(self, request, context):
        try:
            if bool(request.vchannel) == bool(request.pchannel):
                raise fail(E.INVALID_ARGUMENT, "expected exactly one of vchannel or pchannel")
            vchannel_id = 0
            if request.vchannel:
                vchannel = self._vchannel(request.vchannel)
                pchannel, vchannel_id = vchannel.pchannel, vchannel.id
            else:
                pchannel = request.pchannel
                bad = check_name("pchannel", pchannel, LIMITS)
                if bad is not None:
                    raise fail(E.INVALID_ARGUMENT, bad.message)
            if request.policy not in (
                wire.DELIVER_POLICY_UNSPECIFIED,
                wire.DELIVER_POLICY_ALL,
                wire.DELIVER_POLICY_LATEST,
                wire.DELIVER_POLICY_START_FROM,
                wire.DELIVER_POLICY_START_AFTER,
            ):
                raise fail(E.INVALID_ARGUMENT, f"invalid deliver policy ({request.policy})")
            if request.lsn < 0:
                raise fail(E.INVALID_ARGUMENT, f"invalid lsn ({request.lsn}; expected >= 0)")
            types = set()
            for name in request.msg_types:
                try:
                    types.add(msg_type_code(name))
                except ValueError as error:
                    raise fail(E.INVALID_ARGUMENT, str(error)) from None
            batch_limit = request.max_batch_entries or DEFAULT_CONSUME_BATCH
            if not 1 <= batch_limit <= MAX_CONSUME_BATCH:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid max_batch_entries ({batch_limit}; expected 1..{MAX_CONSUME_BATCH})",
                )
            tick_interval_ms = request.time_tick_interval_ms
            if not 0 <= tick_interval_ms <= MAX_TIME_TICK_INTERVAL_MS:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid time_tick_interval_ms ({tick_interval_ms}; expected "
                    f"0..{MAX_TIME_TICK_INTERVAL_MS})",
                )
            source = await self._read_source(
                pchannel, request.from_replica and not tick_interval_ms
            )
        except (RaftwalError, WalError) as error:
            await self._abort(context, error)
            return
        wal = source.log
        policy = request.policy or wire.DELIVER_POLICY_ALL
        if policy == wire.DELIVER_POLICY_ALL:
            next_lsn = wal.first_lsn
        elif policy == wire.DELIVER_POLICY_LATEST:
            next_lsn = source.committed + 1
        elif policy == wire.DELIVER_POLICY_START_FROM:
            next_lsn = max(request.lsn, 1)
        else:
            next_lsn = request.lsn + 1
        if next_lsn < wal.first_lsn:
            await self._abort(context, _compacted(next_lsn, wal.first_lsn))
            return
        after = request.after_time_tick if request.HasField("after_time_tick") else None
        from_tick = request.from_time_tick if request.HasField("from_time_tick") else None
        include_control = request.include_control
        with_segment_id = request.with_segment_id
        names = self._view.view.vchannel_names
        encoder = consume_wire.EntryEncoder(pchannel, msg_type_name)
        # Time-tick watermark (see ConsumeResponse.committed_time_tick): the tick of the
        # last committed entry this stream read past; 0 until known.
        ticking = tick_interval_ms > 0
        tick_interval_s = tick_interval_ms / 1000
        watermark = sent_watermark = 0
        if ticking and wal.first_lsn <= next_lsn - 1 <= source.committed:
            try:
                before = wal.entries(next_lsn - 1, CONSUME_CHUNK_BYTES, next_lsn - 1)
            except (LogError, OSError, KeyError, SegmentCorrupted) as error:
                await self._abort(context, fail(E.INNER, f"read failed: {error}"))
                return
            if before:
                watermark = before[-1].time_tick
        while True:
            stopped = source.stopped()
            if stopped is not None:
                await self._abort(context, stopped)
                return
            if next_lsn < wal.first_lsn:
                # Retention deleted what this reader had not reached yet.
                await self._abort(context, _compacted(next_lsn, wal.first_lsn))
                return
            committed = source.committed
            if ticking and watermark > sent_watermark:
                # Read past entries of other vchannels (or control entries) only: say so.
                sent_watermark = watermark
                yield wire.ConsumeResponse(
                    committed_lsn=committed, term=source.term, committed_time_tick=watermark
                )
            if committed < next_lsn <= source.committed:
                # The commit point moved while this stream was sending (a yield): read on
                # rather than wait for a later change that may not come.
                continue
            if next_lsn > committed and isinstance(source, _OwnerSource) and ticking:
                # Idle: keep time moving with a committed time-tick entry once the pchannel
                # has had no write for the interval (shared by every stream of it).
                source.owner.advance_time_tick(tick_interval_s)
                await source.wait_commit_change(min(CONSUME_POLL_S, tick_interval_s / 4))
                continue
            if next_lsn > committed:
                await source.wait_beyond(next_lsn, CONSUME_POLL_S)
                continue
            # Frames as they lie on disk, crc-checked, turned straight into WalEntry
            # replies: no Entry object per entry on this path.
            try:
                data = wal.read_frames(next_lsn, CONSUME_CHUNK_BYTES, committed)
                frames = frame_headers(data)
            except (LogError, OSError, KeyError, SegmentCorrupted, FormatError) as error:
                await self._abort(context, fail(E.INNER, f"read failed: {error}"))
                return
            if not frames:
                await source.wait_commit_change(CONSUME_POLL_S)
                continue
            # A transaction is delivered whole: hold back an incomplete one at the end.
            cut = _complete_prefix([fields[10] for _, fields in frames])
            if cut == 0 and frames[-1][1][2] < committed:
                # A transaction larger than one chunk, committed whole: read all of it (a
                # txn is at most MAX_TXN_BYTES and never spans a segment).
                try:
                    data = wal.read_frames(next_lsn, CONSUME_TXN_BYTES, committed)
                    frames = frame_headers(data)
                except (LogError, OSError, KeyError, SegmentCorrupted, FormatError) as error:
                    await self._abort(context, fail(E.INNER, f"read failed: {error}"))
                    return
                cut = _complete_prefix([fields[10] for _, fields in frames])
            if cut == 0:
                # Only an incomplete txn is committed so far: wait for the rest.
                await source.wait_commit_change(CONSUME_POLL_S)
                if source.committed == committed:
                    await wal.wait_appended(CONSUME_POLL_S)
                continue
            del frames[cut:]
            # Each entry's reply bytes (consume_wire), and its time tick.
            out: list[tuple[object, ...]] = []
            ticks: list[int] = []
            # (first, last) LSN of the segment of the entry at hand, looked up once per
            # segment, not per entry.
            segment = (0, -1)
            for offset, fields in frames:
                properties_len, lsn, time_tick, entry_vchannel = (
                    fields[1],
                    fields[2],
                    fields[4],
                    fields[5],
                )
                msg_type, flags = fields[8], fields[10]
                if flags & CONTROL_FLAGS and not include_control:
                    continue
                if vchannel_id and entry_vchannel != vchannel_id:
                    continue
                if after is not None and time_tick <= after:
                    continue
                if from_tick is not None and time_tick < from_tick:
                    continue
                if types and msg_type not in types:
                    continue
                if with_segment_id and not segment[0] <= lsn <= segment[1]:
                    try:
                        segment = wal.segment_range(lsn)
                    except KeyError as error:
                        await self._abort(context, fail(E.INNER, f"read failed: {error}"))
                        return
                properties = None
                if properties_len:
                    properties_start = offset + ENTRY_HEADER_SIZE + fields[11] + fields[12]
                    try:
                        properties = _visible(
                            decode_properties(
                                data[properties_start : properties_start + properties_len]
                            )
                        )
                    except ValueError as error:
                        await self._abort(
                            context,
                            fail(E.INNER, f"read failed: lsn {lsn}: bad properties ({error})"),
                        )
                        return
                out.append(
                    encoder.entry(
                        data,
                        offset,
                        fields,
                        names.get(entry_vchannel, ""),
                        segment[0] if with_segment_id else 0,
                        properties,
                    )
                )
                ticks.append(time_tick)
            last_fields = frames[-1][1]
            next_lsn = last_fields[2] + 1
            for start in range(0, len(out), batch_limit):
                end = min(start + batch_limit, len(out))
                # Pre-built bytes (consume_wire.serialize_prebuilt passes them through).
                yield consume_wire.response(  # type: ignore[misc]
                    out[start:end],
                    committed,
                    source.term,
                    # A chunk before the last one covers only up to its own last entry.
                    (last_fields[4] if end == len(out) else ticks[end - 1]) if ticking else 0,
                )
            if ticking:
                watermark = last_fields[4]
                if out:
                    sent_watermark = watermark

    # Transactions

    def _drop_txn(self, txn_id: int) -> _Txn | None:
        """Forget an open transaction and give its bytes back to the budgets."""
        txn = self._txns.pop(txn_id, None)
        if txn is not None and txn.bytes:
            self._txn_bytes -= txn.bytes
            _count(self._producer_txn_bytes, txn.producer, -txn.bytes)
            if txn.owner.identity:
                _count(self._identity_txn_bytes, txn.owner.identity, -txn.bytes)
        return txn

    def _expire_txns(self) -> None:
        now = time.monotonic()
        for txn_id, txn in list(self._txns.items()):
            owner = self._plane.owner(txn.pchannel)
            # Expired, or begun under an owner term this node no longer serves (a
            # failover): either way it can never commit here, so its bytes go back now.
            if txn.deadline < now or owner is None or owner.term != txn.term:
                self._drop_txn(txn_id)

    def _remember_end(self, txn_id: int, ended: _Ended) -> None:
        self._ended[txn_id] = ended
        while len(self._ended) > MAX_ENDED_TXNS:
            self._ended.popitem(last=False)

    def _txn(self, vchannel: str, txn_id: int, caller: TxnOwner, method: str) -> _Txn:
        self._expire_txns()
        txn = self._txns.get(txn_id)
        if txn is None or txn.vchannel != vchannel:
            raise fail(
                E.TRANSACTION_EXPIRED,
                f"transaction {txn_id} on {vchannel!r} is unknown or expired",
            )
        # Checked before anything else is touched (not even the keepalive deadline).
        denied = check_owner(txn.owner, caller, txn_id, method)
        if denied is not None:
            raise denied
        owner = self._owner(txn.pchannel)
        if owner.term != txn.term:
            self._drop_txn(txn_id)
            raise fail(
                E.TRANSACTION_EXPIRED,
                f"transaction {txn_id} began at term {txn.term}; the pchannel moved to term "
                f"{owner.term}",
            )
        txn.deadline = time.monotonic() + txn.keepalive_ms / 1000
        return txn

    def _check_budget(self, txn: _Txn, size: int) -> None:
        config = self._node.config
        budgets = (
            (
                f"node {self._node.me.id}'s transaction buffer (txn_buffer_budget_bytes)",
                self._txn_bytes,
                config.txn_buffer_budget_bytes,
                len(self._txns),
            ),
            (
                f"producer {txn.producer!r}'s transaction buffer "
                "(txn_buffer_producer_budget_bytes)",
                self._producer_txn_bytes.get(txn.producer, 0),
                config.txn_buffer_producer_budget_bytes,
                sum(1 for t in self._txns.values() if t.producer == txn.producer),
            ),
        )
        if txn.owner.identity:
            # Whatever producer ids one caller picks, its open transactions share this.
            identity = txn.owner.identity
            budgets += (
                (
                    "this caller's transaction buffer, over all its producer ids "
                    "(txn_buffer_identity_budget_bytes)",
                    self._identity_txn_bytes.get(identity, 0),
                    config.txn_buffer_identity_budget_bytes,
                    sum(1 for t in self._txns.values() if t.owner.identity == identity),
                ),
            )
        for name, used, budget, count in budgets:
            if used + size > budget:
                raise fail(
                    E.RESOURCE_EXHAUSTED,
                    f"{name} is full: {_mib(used)} of {_mib(budget)} held by {count} open "
                    f"transaction(s), and this append needs {_mib(size)} more (commit or roll "
                    "back open transactions, or retry later)",
                )

    async def _ended_outcome(
        self, vchannel: str, txn_id: int, caller: TxnOwner, method: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """("committed", positions) / ("rolled_back", []) for an ended transaction this
        node knows, or ("", []). A commit answered by a previous owner is found in this
        owner's log (its commit entry records the transaction's size; who began it is not
        recorded there)."""
        ended = self._ended.get(txn_id)
        if ended is not None and ended.vchannel == vchannel:
            denied = check_owner(ended.owner, caller, txn_id, method)
            if denied is not None:
                raise denied
            if ended.positions is None:
                return ended.state, []
            return ended.state, list(await asyncio.shield(ended.positions))
        pchannel = self._vchannel(vchannel).pchannel
        owner = self._owner(pchannel)
        positions = await owner.committed_txn(txn_id)
        if positions is not None:
            return "committed", positions
        return "", []

    def _new_txn_id(self) -> int:
        """A random positive 63-bit id, unused by any transaction this node knows: an id
        tells nothing about its neighbours (the binding to its opener is what protects a
        transaction; this is defence in depth)."""
        while True:
            txn_id = secrets.randbits(63)
            if txn_id and txn_id not in self._txns and txn_id not in self._ended:
                return txn_id

    async def _unary(self, context, work):  # type: ignore[no-untyped-def]
        try:
            return await work
        except (RaftwalError, WalError) as error:
            info = self._with_disk(error.info)
            await self._abort(context, error if info is error.info else RaftwalError(info))
        except (LogError, OSError) as error:
            await self._abort(context, self._os_error(error))

    async def BeginTxn(self, request, context):
        async def work() -> wire.BeginTxnResponse:
            vchannel = self._vchannel(request.vchannel)
            self._check_writable(vchannel.pchannel, "a BeginTxn")
            keepalive = request.keepalive_ms or DEFAULT_TXN_KEEPALIVE_MS
            if not 1 <= keepalive <= MAX_TXN_KEEPALIVE_MS:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid keepalive_ms ({keepalive}; expected 1..{MAX_TXN_KEEPALIVE_MS})",
                )
            owner = self._owner(vchannel.pchannel)
            self._check_disk("a BeginTxn")
            self._expire_txns()
            if len(self._txns) >= MAX_OPEN_TXNS:
                raise fail(
                    E.RESOURCE_EXHAUSTED,
                    f"too many open transactions on node {self._node.me.id} "
                    f"({len(self._txns)}; expected < {MAX_OPEN_TXNS})",
                )
            if len(request.producer_id) > MAX_PRODUCER_ID_CHARS:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid producer_id ({len(request.producer_id)} chars; expected "
                    f"0..{MAX_PRODUCER_ID_CHARS})",
                )
            producer = request.producer_id or _peer_host(context.peer())
            txn_id = self._new_txn_id()
            self._txns[txn_id] = _Txn(
                txn_id=txn_id,
                vchannel=vchannel.name,
                vchannel_id=vchannel.id,
                pchannel=vchannel.pchannel,
                term=owner.term,
                keepalive_ms=keepalive,
                deadline=time.monotonic() + keepalive / 1000,
                producer=producer,
                owner=TxnOwner(caller_identity(context), request.producer_id),
            )
            return wire.BeginTxnResponse(txn_id=txn_id, pchannel=vchannel.pchannel, term=owner.term)

        return await self._unary(context, work())

    async def AppendTxn(self, request, context):
        async def work() -> wire.AppendTxnResponse:
            txn = self._txn(
                request.vchannel, request.txn_id, _caller(request, context), "AppendTxn"
            )
            if not 1 <= len(request.messages) <= MAX_MESSAGES_PER_BATCH:
                raise fail(E.INVALID_ARGUMENT, f"invalid message count ({len(request.messages)})")
            self._check_disk("an AppendTxn")
            # Refuse before copying anything: a full budget must cost no more memory.
            self._check_budget(txn, sum(_txn_bytes(m) for m in request.messages))
            messages = []
            for message in request.messages:
                if message.vchannel and message.vchannel != txn.vchannel:
                    raise fail(
                        E.INVALID_ARGUMENT,
                        f"message for {message.vchannel!r} in a txn on {txn.vchannel!r}",
                    )
                copy = wire.Message()
                copy.CopyFrom(message)
                copy.vchannel = txn.vchannel
                messages.append(self._message(copy, txn.pchannel)[0])
            size = sum(_txn_bytes(m) for m in messages)
            if txn.bytes + size > MAX_TXN_BYTES:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"transaction too large ({txn.bytes + size} bytes; expected <= {MAX_TXN_BYTES})",
                )
            async with txn.lock:
                if self._txns.get(txn.txn_id) is not txn:
                    raise fail(E.TRANSACTION_EXPIRED, f"transaction {txn.txn_id} ended meanwhile")
                self._check_budget(txn, size)
                txn.messages.extend(messages)
                txn.bytes += size
                self._txn_bytes += size
                _count(self._producer_txn_bytes, txn.producer, size)
                if txn.owner.identity:
                    _count(self._identity_txn_bytes, txn.owner.identity, size)
            return wire.AppendTxnResponse(
                buffered_messages=len(txn.messages), buffered_bytes=txn.bytes
            )

        return await self._unary(context, work())

    async def CommitTxn(self, request, context):
        async def work() -> wire.CommitTxnResponse:
            self._expire_txns()
            if request.txn_id not in self._txns:
                # A retry of a commit whose answer was lost gets the original positions.
                state, positions = await self._ended_outcome(
                    request.vchannel, request.txn_id, _caller(request, context), "CommitTxn"
                )
                if state == "committed":
                    return wire.CommitTxnResponse(
                        positions=[wire.Position(lsn=lsn, time_tick=t) for lsn, t in positions]
                    )
                if state == "rolled_back":
                    raise fail(
                        E.INVALID_TRANSACTION_STATE,
                        f"transaction {request.txn_id} was rolled back (got CommitTxn; expected "
                        "a new transaction: a rolled back one never commits)",
                    )
            txn = self._txn(
                request.vchannel, request.txn_id, _caller(request, context), "CommitTxn"
            )
            # Before the transaction is dropped: refused for space, it stays open (within its
            # keepalive) and the commit can be retried once space returns.
            self._check_disk("a CommitTxn")
            async with txn.lock:
                self._drop_txn(txn.txn_id)
            owner = self._owner(txn.pchannel)
            body = [
                Message(
                    vchannel_id=m.vchannel_id,
                    msg_type=m.msg_type,
                    key=m.key,
                    payload=m.payload,
                    properties=m.properties,
                    flags=int(EntryFlags.TXN_BODY),
                    txn_id=txn.txn_id,
                )
                for m in txn.messages
            ]
            count = len(body) + 2
            batch = [
                Message(
                    vchannel_id=txn.vchannel_id,
                    msg_type=int(MsgType.TXN_BEGIN),
                    flags=int(EntryFlags.TXN_BEGIN),
                    txn_id=txn.txn_id,
                ),
                *body,
                Message(
                    vchannel_id=txn.vchannel_id,
                    msg_type=int(MsgType.TXN_COMMIT),
                    flags=int(EntryFlags.TXN_COMMIT),
                    txn_id=txn.txn_id,
                    # Lets a later owner answer a retried commit from its log.
                    properties={TXN_COUNT_PROPERTY: str(count)},
                ),
            ]
            ended = _Ended(
                "committed", txn.vchannel, asyncio.get_running_loop().create_future(), txn.owner
            )
            assert ended.positions is not None
            self._remember_end(txn.txn_id, ended)
            try:
                pchannel = txn.pchannel
                positions, _ = await owner.write(
                    batch,
                    admit=lambda: self._check_writable(pchannel, "a CommitTxn", refresh=True),
                )
            except BaseException as error:
                # Not known to be written: a retry must not wait on this failure but ask
                # the log (here, or at a new owner) whether the commit landed.
                self._ended.pop(txn.txn_id, None)
                ended.positions.set_exception(error)
                ended.positions.exception()
                raise
            ended.positions.set_result(positions)
            owner.remember_txn(txn.txn_id, positions[0][0], positions[-1][0])
            return wire.CommitTxnResponse(
                positions=[wire.Position(lsn=lsn, time_tick=tick) for lsn, tick in positions]
            )

        return await self._unary(context, work())

    async def RollbackTxn(self, request, context):
        async def work() -> wire.RollbackTxnResponse:
            self._expire_txns()
            if request.txn_id not in self._txns:
                state, positions = await self._ended_outcome(
                    request.vchannel, request.txn_id, _caller(request, context), "RollbackTxn"
                )
                if state == "rolled_back":
                    return wire.RollbackTxnResponse()  # a retry: the same outcome
                if state == "committed":
                    raise fail(
                        E.INVALID_TRANSACTION_STATE,
                        f"transaction {request.txn_id} was committed at lsn "
                        f"{positions[0][0]}..{positions[-1][0]} (got RollbackTxn; expected "
                        "none after a commit)",
                    )
            txn = self._txn(
                request.vchannel, request.txn_id, _caller(request, context), "RollbackTxn"
            )
            async with txn.lock:
                self._drop_txn(txn.txn_id)
            self._remember_end(txn.txn_id, _Ended("rolled_back", txn.vchannel, None, txn.owner))
            return wire.RollbackTxnResponse()

        return await self._unary(context, work())

    async def KeepAliveTxn(self, request, context):
        async def work() -> wire.KeepAliveTxnResponse:
            txn = self._txn(
                request.vchannel, request.txn_id, _caller(request, context), "KeepAliveTxn"
            )
            return wire.KeepAliveTxnResponse(expires_in_ms=txn.keepalive_ms)

        return await self._unary(context, work())

    async def GetLatestTimeTick(self, request, context):
        async def work() -> wire.GetLatestTimeTickResponse:
            bad = check_name("pchannel", request.pchannel, LIMITS)
            if bad is not None:
                raise fail(E.INVALID_ARGUMENT, bad.message)
            source = await self._read_source(request.pchannel, request.from_replica)
            return wire.GetLatestTimeTickResponse(
                time_tick=source.log.last_time_tick,
                last_lsn=source.log.last_lsn,
                committed_lsn=source.committed,
                term=source.term,
            )

        return await self._unary(context, work())

    async def GetReplicateCheckpoint(self, request, context):
        async def work() -> wire.GetReplicateCheckpointResponse:
            bad = check_name("pchannel", request.pchannel, LIMITS)
            if bad is not None:
                raise fail(E.INVALID_ARGUMENT, bad.message)
            check_source_names(request.source_cluster_id, request.source_pchannel)
            # Only the configured pair: an unknown producer costs the owner a scan of the
            # whole log, which a reader must not be able to repeat at will.
            configured = self._view.view.replicated_from.get(request.pchannel)
            if configured != (request.source_cluster_id, request.source_pchannel):
                raise fail(
                    E.IGNORED_OPERATION,
                    f"pchannel {request.pchannel} does not replicate "
                    f"{request.source_cluster_id}/{request.source_pchannel} (got that pair; "
                    "expected "
                    + (
                        "/".join(configured)
                        if configured
                        else "none: it is not a replication target"
                    )
                    + ")",
                )
            owner = self._owner(request.pchannel)
            source_lsn, target_lsn = await owner.producer_checkpoint(
                replicated_producer_id(request.source_cluster_id, request.source_pchannel)
            )
            return wire.GetReplicateCheckpointResponse(
                source_lsn=source_lsn, target_lsn=target_lsn, term=owner.term
            )

        return await self._unary(context, work())

    async def Seal(self, request, context):
        async def work() -> wire.SealResponse:
            bad = check_name("pchannel", request.pchannel, LIMITS)
            if bad is not None:
                raise fail(E.INVALID_ARGUMENT, bad.message)
            if not 0 <= request.timeout_ms <= MAX_SEAL_WAIT_MS:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid timeout_ms ({request.timeout_ms}; expected 0..{MAX_SEAL_WAIT_MS})",
                )
            owner = self._owner(request.pchannel)
            sealed = owner.log.open_segment_first_lsn() is not None
            if sealed:
                await owner.seal_now()
            # Everything up to here, the seal marker included, must reach the manifest.
            target = owner.log.last_lsn
            deadline = time.monotonic() + (request.timeout_ms or DEFAULT_SEAL_WAIT_MS) / 1000
            while self._view.committed_through(request.pchannel) < target:
                if owner.term != self._owner(request.pchannel).term:
                    raise fail(E.NOT_OWNER, f"pchannel {request.pchannel} moved while sealing")
                if time.monotonic() >= deadline:
                    raise fail(
                        E.UNAVAILABLE,
                        f"segments of {request.pchannel} through lsn {target} not committed "
                        f"in time (committed through {self._view.committed_through(request.pchannel)};"
                        " a majority of its replicas may be down)",
                    )
                await asyncio.sleep(SEAL_POLL_S)
            return wire.SealResponse(
                committed_through_lsn=self._view.committed_through(request.pchannel),
                term=owner.term,
                sealed=sealed,
            )

        return await self._unary(context, work())

    # Segment reads

    async def ReadSegment(self, request, context):
        try:
            bad = check_name("pchannel", request.pchannel, LIMITS)
            if bad is not None:
                raise fail(E.INVALID_ARGUMENT, bad.message)
            if request.segment_id < 1 or request.from_lsn < 0 or request.to_lsn < 0:
                raise fail(E.INVALID_ARGUMENT, "invalid segment_id or lsn range (expected >= 1)")
            chunk = request.max_chunk_bytes or (4 << 20)
            if not 4096 <= chunk <= (16 << 20):
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"invalid max_chunk_bytes ({chunk}; expected 4096..16777216)",
                )
            if request.pchannel not in self._view.view.pchannels:
                # Checked before the log is opened: an unknown name must not get a directory.
                raise fail(E.CHANNEL_NOT_EXIST, f"pchannel {request.pchannel!r} does not exist")
            wal = await self._plane.log(request.pchannel)
            path = wal.segment_path(request.segment_id)
            committed = self._view.committed_through(request.pchannel)
            floor = max(wal.first_lsn, self._view.retention_floor(request.pchannel))
            if path is None and request.segment_id < floor:
                raise _compacted(request.segment_id, floor)
            if path is None or not any(
                s.first_lsn == request.segment_id and s.last_lsn <= committed
                for s in wal.sealed_segments()
            ):
                raise fail(
                    E.NOT_FOUND,
                    f"node {self._node.me.id} holds no committed segment {request.segment_id} "
                    f"of {request.pchannel}",
                )
            held = await self._segments.acquire(path)
            reader = held.reader
        except (RaftwalError, WalError) as error:
            await self._abort(context, error)
            return
        except SegmentCorrupted as error:
            await self._abort(context, fail(E.UNRECOVERABLE, f"node {self._node.me.id}: {error}"))
            return
        except (LogError, OSError) as error:
            await self._abort(context, fail(E.INNER, f"node {self._node.me.id}: {error}"[:300]))
            return
        try:
            low = request.from_lsn or reader.first_lsn
            high = request.to_lsn or reader.last_lsn
            low, high = max(low, reader.first_lsn), min(high, reader.last_lsn)
            offsets = reader.frame_offsets()
            count = reader.entry_count

            def frame_start(row: int) -> int:
                return reader.data_end if row >= count else int(offsets[row])

            row, stop_row = low - reader.first_lsn, high - reader.first_lsn + 1
            if request.bulk and self._transfers is not None:
                offer = self._bulk_offer(request, reader, path, row, stop_row, frame_start)
                if offer is not None:
                    yield offer
                    return
            first = True
            view = memoryview(reader._buffer)  # noqa: SLF001
            while row < stop_row:
                # Split at frame boundaries: the most frames whose bytes fit in `chunk` (at
                # least one), found by bisecting the footer index.
                begin = frame_start(row)
                limit = begin + chunk
                following = bisect.bisect_right(offsets, limit, row + 1, stop_row)
                end_row = following
                if following == stop_row and frame_start(stop_row) > limit:
                    end_row = stop_row - 1
                elif following < stop_row:
                    end_row = following - 1
                end_row = max(end_row, row + 1)
                end = frame_start(end_row)
                data = view[begin:end]
                # The small fields through protobuf; the frames appended as they lie in
                # the file (one copy, by the join), sent as they are by the serializer.
                head = wire.ReadSegmentResponse(
                    first_lsn=reader.first_lsn + row,
                    last_lsn=reader.first_lsn + end_row - 1,
                    node_id=self._node.me.id,
                    frames_crc=crc32c(data),
                )
                if request.with_offsets:
                    head.frame_offsets = reader.row_offsets(row, end_row, begin)
                if first:
                    head.segment_digest = reader.digest
                    head.segment_count = reader.entry_count
                    first = False
                yield consume_wire.read_segment_response(head, data)
                row = end_row
        finally:
            self._segments.release(held)

    def _bulk_offer(
        self,
        request: wire.ReadSegmentRequest,
        reader: SegmentReader,
        path: Any,
        row: int,
        stop_row: int,
        frame_start: Any,
    ) -> bytes | None:
        """ReadSegment's one reply for a bulk transfer of rows [row, stop_row), or None when
        the transfer port takes no ticket now (the caller streams chunks instead)."""
        assert self._transfers is not None
        begin, end = frame_start(row), frame_start(stop_row)
        try:
            ticket = self._transfers.offer(path, begin, end - begin)
        except OSError as error:
            log.warning("no bulk transfer of %s: %s; streaming it", path, error)
            return None
        if ticket is None:
            return None
        whole = row == 0 and stop_row == reader.entry_count
        head = wire.ReadSegmentResponse(
            first_lsn=reader.first_lsn + row,
            last_lsn=reader.first_lsn + stop_row - 1,
            node_id=self._node.me.id,
            segment_digest=reader.digest,
            segment_count=reader.entry_count,
            # The digest is the crc32c of the whole segment's frames; a part is hashed
            # here, from the file that SegmentReader.open verified.
            frames_crc=reader.digest if whole else crc32c(memoryview(reader._buffer)[begin:end]),  # noqa: SLF001
            frame_offsets=reader.row_offsets(row, stop_row, begin) if request.with_offsets else b"",
            transfer_ticket=ticket,
            transfer_port=self._transfers.port,
            transfer_bytes=end - begin,
        )
        return head.SerializeToString()


@dataclass(eq=False)
class _HeldSegment:
    key: tuple[str, int, int, int]
    reader: SegmentReader
    users: int = 0
    last_used: float = 0.0


class _RecentSegments:
    """Sealed segments ReadSegment opened (and verified: every block crc) in the last
    KEEP_S seconds, kept open for the next call. The Spark connector fetches a segment in
    pieces, one call each; without this the node would verify the whole file per piece.

    An entry is keyed by the file's path, inode, size and mtime, so a file replaced under
    the same name is opened anew; it is closed once unused for KEEP_S (a deleted segment's
    space comes back then) or when more than MOST are open."""

    KEEP_S = 5.0
    MOST = 8

    def __init__(self) -> None:
        self._held: dict[tuple[str, int, int, int], _HeldSegment] = {}
        self._sweep_handle: asyncio.TimerHandle | None = None

    async def acquire(self, path: Any) -> _HeldSegment:
        st = os.stat(path)
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        held = self._held.get(key)
        if held is None:
            reader = await asyncio.to_thread(SegmentReader.open, path)
            held = self._held.get(key)  # opened meanwhile by another call?
            if held is None:
                held = self._held[key] = _HeldSegment(key, reader)
            else:
                reader.close()
        held.users += 1
        held.last_used = asyncio.get_running_loop().time()
        return held

    def release(self, held: _HeldSegment) -> None:
        held.users -= 1
        held.last_used = asyncio.get_running_loop().time()
        if self._held.get(held.key) is not held:  # evicted while in use: ours to close
            if held.users == 0:
                held.reader.close()
            return
        self._sweep()

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        by_age = sorted(self._held.values(), key=lambda h: h.last_used)
        excess = len(by_age) - self.MOST
        for held in by_age:
            if now - held.last_used >= self.KEEP_S or excess > 0:
                del self._held[held.key]
                excess -= 1
                if held.users == 0:
                    held.reader.close()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        if self._held:
            self._sweep_handle = loop.call_later(self.KEEP_S, self._sweep)


_INTERNAL_PROPERTIES = ("rw.producer", "rw.seq", "rw.count")


def _visible(properties: Mapping[str, str]) -> Mapping[str, str]:
    """A message's properties without the WAL's own idempotent-producer bookkeeping."""
    if not any(name in properties for name in _INTERNAL_PROPERTIES):
        return properties
    return {k: v for k, v in properties.items() if k not in _INTERNAL_PROPERTIES}
