"""The replica side of WAL replication: the ``Replication`` service (the Append stream from
a pchannel's owner, Fence, Fetch, AppendBroadcast from the coordinator).

The owner's Append stream comes either as the gRPC ``Append`` call or, after
``OpenAppend`` handed it a ticket, as a framed connection to the transfer port
(``rpc.append_stream``, served by ``serve_append_connection``); one function answers both.

Only nodes call it (role ``node``). It validates every request against the replica's log
and the coordination state (log matching, fenced terms, pending broadcasts) and never
writes what fails a check. A node whose disk filled up (past its hard watermark, Raft's
disk reserve in use) refuses appends with entries (``DiskGuard``). Depends on
``ReplicationBackend`` and ``DiskGuard``, never on the node itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from raftwal.services.backend import DiskGuard, ReplicationBackend
from raftwal.services.common import fail
from raftwal.services.segment_transfer import SegmentTransfers
from rpc import append_stream
from rpc.errors import RaftwalError, error_info, to_status
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from statemachine.types import DEFAULT_LIMITS as LIMITS
from statemachine.validation import check_name
from wal_segments import buggify, mutations
from wal_segments.format import (
    EntryFlags,
    MsgType,
    msg_type_code,
)
from wal_segments.log import BadBatch, Fenced, LogError, Mismatch
from wal_segments.owner import Message, WalError
from wal_segments.plane import DataPlane
from wal_segments.segment import SegmentCorrupted

log = logging.getLogger(__name__)
E = errors_pb2

#: The gRPC port's default message limit (config `grpc_max_message_bytes`).
DEFAULT_MAX_FRAME_BYTES = 32 * 1024 * 1024

# Deliberate bugs for the simulation's mutation suite (`wal_segments.mutations`).
REPLICA_EARLY_DURABLE = mutations.declare(
    "replica-early-durable", "a replica reports an append durable before its fsync"
)
REPLICA_COMMIT_UNMATCHED = mutations.declare(
    "replica-commit-unmatched", "a replica takes the owner's commit point beyond what it holds"
)


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    """Resolve `future` unless it is done already: the handler awaiting it is cancelled when
    the owner's stream goes away (a failover), which cancels the future too, and a late
    set_result would then raise InvalidStateError in a task nobody awaits."""
    if not future.done():
        future.set_result(result)


def _log_failure(task: asyncio.Future[Any]) -> None:
    # A background step of a stream whose handler is gone: nobody awaits it, so its error
    # is logged here rather than as "Task exception was never retrieved" at exit.
    if not task.cancelled() and task.exception() is not None:
        log.error("replication step failed", exc_info=task.exception())


def _broadcast_mismatch(
    state: pb.CoordinationState, request: wire.AppendBroadcastRequest
) -> str | None:
    """Why `request` is not the append of a pending broadcast to one of its vchannels (the
    only thing AppendBroadcast may write), or None."""
    task = state.broadcasts.get(request.broadcast_id)
    if task is None or task.state != pb.BROADCAST_STATE_PENDING:
        return f"broadcast {request.broadcast_id} is not pending (expected a pending broadcast)"
    if request.vchannel not in {target.vchannel for target in task.vchannels}:
        return (
            f"broadcast {request.broadcast_id} does not target vchannel {request.vchannel!r} "
            f"(expected one of {[t.vchannel for t in task.vchannels][:8]})"
        )
    if request.message != task.message or request.msg_type != task.msg_type:
        return (
            f"message of broadcast {request.broadcast_id} differs from the broadcast's "
            f"({len(request.message)} bytes of {request.msg_type[:32]!r}; expected "
            f"{len(task.message)} bytes of {task.msg_type[:32]!r})"
        )
    return None


# -- replica side ----------------------------------------------------------------------------


class ReplicationServicer(streaming_pb2_grpc.ReplicationServicer):
    def __init__(
        self,
        node: ReplicationBackend,
        plane: DataPlane,
        transfers: SegmentTransfers | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        disk: DiskGuard | None = None,
    ) -> None:
        self._node = node
        self._plane = plane
        # The disk watermarks: a disk that filled up takes no replica appends (None: none).
        self._disk = disk
        # The transfer port, for Append connections (None: the gRPC Append call only).
        self._transfers = transfers
        # The largest AppendRequest read from a connection: the gRPC port's message limit,
        # which bounds the Append call the same way.
        self._max_frame_bytes = max_frame_bytes

    def _check_pchannel(self, pchannel: str) -> None:
        bad = check_name("pchannel", pchannel, LIMITS)
        if bad is not None:
            raise fail(E.INVALID_ARGUMENT, bad.message)

    def _check_assigned(self, pchannel: str, term: int, owner_node_id: str | None) -> None:
        """Only what the coordination state assigned may fence, append or fetch: a term
        above the pchannel's assigned term (or the assigned term from another node) would
        fence the real owner out for good, and an unknown pchannel would get a directory."""
        view = self._node.data_view
        for attempt in range(2):
            assignment = view.view.assignments.get(pchannel)
            if (
                assignment is not None
                and term <= assignment.term
                and (
                    owner_node_id is None
                    or term < assignment.term
                    or owner_node_id == assignment.owner_node_id
                )
            ):
                return
            if attempt == 0:
                view.refresh()  # this node may not have applied the assignment yet
        if assignment is None:
            raise fail(E.CHANNEL_NOT_EXIST, f"pchannel {pchannel!r} is not assigned")
        raise fail(
            E.UNMATCHED_CHANNEL_TERM,
            f"pchannel {pchannel} term {term} from {owner_node_id!r} was not assigned "
            f"(expected term <= {assignment.term}, from {assignment.owner_node_id!r} at that "
            "term)",
            current_term=assignment.term,
        )

    async def Fence(self, request, context):
        try:
            self._check_pchannel(request.pchannel)
            if request.term < 1:
                raise fail(E.INVALID_ARGUMENT, f"invalid term ({request.term}; expected >= 1)")
            self._check_assigned(request.pchannel, request.term, request.owner_node_id)
            wal = await self._plane.log(request.pchannel)
            position = await wal.fence(request.term)
            await buggify.point("replica.fence_answer")
        except Fenced as error:
            await context.abort_with_status(
                to_status(error_info(E.CHANNEL_FENCED, str(error), current_term=error.fenced_term))
            )
        except RaftwalError as error:
            await context.abort_with_status(to_status(error.info))
        except (LogError, SegmentCorrupted, OSError) as error:
            await context.abort_with_status(to_status(error_info(E.INNER, str(error))))
        return wire.FenceResponse(
            fenced_term=wal.fenced_term,
            last_lsn=position.last_lsn,
            last_term=position.last_term,
            last_time_tick=position.last_time_tick,
            node_id=self._node.me.id,
            batch_frames=True,
        )

    async def AppendBroadcast(self, request, context):
        try:
            bad = check_name("pchannel", request.pchannel, LIMITS) or check_name(
                "vchannel", request.vchannel, LIMITS
            )
            if bad is not None:
                raise fail(E.INVALID_ARGUMENT, bad.message)
            if request.broadcast_id < 1:
                raise fail(E.INVALID_ARGUMENT, f"invalid broadcast_id ({request.broadcast_id})")
            vchannel = self._node.data_view.view.vchannels.get(request.vchannel)
            if vchannel is None or vchannel.pchannel != request.pchannel:
                raise fail(
                    E.CHANNEL_NOT_EXIST,
                    f"vchannel {request.vchannel!r} is not on pchannel {request.pchannel!r}",
                )
            owner = self._plane.owner(request.pchannel)
            if owner is None or not owner.serving:
                hint, term = self._node.data_view.owner_hint(request.pchannel)
                raise fail(
                    E.NOT_OWNER,
                    f"node {self._node.me.id} does not serve {request.pchannel}",
                    owner_hint=hint,
                    current_term=term,
                )
            problem = self._node.replica.read(lambda state: _broadcast_mismatch(state, request))
            if problem is not None:
                # Maybe not applied here yet: the coordinator sends once it applied it.
                await self._node.wait_change(0.5)
                problem = self._node.replica.read(lambda state: _broadcast_mismatch(state, request))
            if problem is not None:
                raise fail(E.INVALID_ARGUMENT, problem)
            properties = {}
            try:
                code = msg_type_code(request.msg_type or "ddl")
            except ValueError:
                code = int(MsgType.DDL)
                properties["rw.msg_type"] = request.msg_type[:128]
            message = Message(
                vchannel_id=vchannel.id,
                msg_type=code,
                payload=request.message,
                properties=properties,
                flags=int(EntryFlags.BROADCAST),
                broadcast_id=request.broadcast_id,
            )
            positions, duplicate = await owner.write(
                [message],
                producer_id=f"rw.broadcast.{request.broadcast_id}.{request.vchannel}",
                sequence=1,
            )
        except (RaftwalError, WalError) as error:
            await context.abort_with_status(to_status(error.info))
        except (LogError, OSError) as error:
            await context.abort_with_status(to_status(error_info(E.INNER, str(error)[:300])))
        lsn, tick = positions[0]
        return wire.AppendBroadcastResponse(
            position=wire.Position(lsn=lsn, time_tick=tick), duplicate=duplicate
        )

    async def Fetch(self, request, context):
        try:
            self._check_pchannel(request.pchannel)
            self._check_assigned(request.pchannel, request.term, None)
            wal = await self._plane.log(request.pchannel)
        except RaftwalError as error:
            await context.abort_with_status(to_status(error.info))
        except (LogError, SegmentCorrupted, OSError) as error:
            await context.abort_with_status(to_status(error_info(E.INNER, str(error))))
        if request.term < wal.fenced_term:
            return wire.FetchResponse(status=wire.APPEND_STATUS_FENCED, fenced_term=wal.fenced_term)
        if request.prev_lsn < 0 or request.prev_term < 0:
            await context.abort_with_status(
                to_status(error_info(E.INVALID_ARGUMENT, "negative prev_lsn or prev_term"))
            )
        max_bytes = min(max(request.max_bytes, 1 << 16), 16 << 20)
        try:
            frames, start, from_log_start = wal.fetch_from(
                request.prev_lsn, request.prev_term, max_bytes
            )
        except Mismatch as error:
            return wire.FetchResponse(
                status=wire.APPEND_STATUS_MISMATCH,
                last_lsn=wal.last_lsn,
                last_term=wal.last_term,
                conflict_term=error.conflict_term,
                conflict_first_lsn=error.conflict_first_lsn,
            )
        return wire.FetchResponse(
            status=wire.APPEND_STATUS_OK,
            frames=frames,
            last_lsn=wal.last_lsn,
            last_term=wal.last_term,
            log_start_lsn=start if from_log_start else 0,
        )

    async def Append(self, request_iterator, context):
        """The owner's Append stream over gRPC (the fallback of the transfer port's, see
        `serve_append_connection`)."""
        owner_ids: set[str] = set()
        try:
            async with contextlib.aclosing(self._answer(request_iterator, owner_ids)) as answers:
                async for response in answers:
                    yield response
        except asyncio.CancelledError:
            # The owner's end went away: a crash looks like this (a deliberate close does
            # too, but then the owner's heartbeats stay on time and nothing happens).
            for owner_id in owner_ids:
                self._node.suspect(owner_id)
            raise

    async def OpenAppend(self, request, context):
        """A ticket for one Append connection to this node's transfer port, or none (the
        owner then calls Append)."""
        bad = check_name("node_id", request.owner_node_id, LIMITS)
        if bad is not None:
            await context.abort_with_status(to_status(error_info(E.INVALID_ARGUMENT, bad.message)))
        ticket = (
            self._transfers.offer_append(request.owner_node_id)
            if self._transfers is not None
            else None
        )
        if ticket is None:
            return wire.OpenAppendResponse()
        assert self._transfers is not None
        return wire.OpenAppendResponse(
            ticket=ticket, port=self._transfers.port, max_frame_bytes=self._max_frame_bytes
        )

    async def serve_append_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, owner_node_id: str
    ) -> None:
        """The owner's Append stream over the transfer port (`rpc.append_stream`), after its
        ticket matched: the same requests and answers as `Append`, framed. Returns when
        the owner closed, reset or stalled the connection, or sent a frame over the cap
        or one that is no AppendRequest (the port then closes the connection)."""
        peer = writer.get_extra_info("peername")
        owner_ids = {owner_node_id[:64]}
        ended = "not started"
        try:
            ended = await append_stream.serve_messages(
                reader,
                writer,
                self._max_frame_bytes,
                append_stream.IDLE_TIMEOUT_S,
                wire.AppendRequest,
                lambda requests: self._answer(requests, owner_ids),
                budget=self._transfers.frame_budget if self._transfers is not None else None,
            )
        finally:
            log.debug("append connection from %s (%s) ended: %s", peer, owner_node_id, ended)
            # As for the gRPC stream: the owner may have crashed; its heartbeats say.
            for owner_id in owner_ids:
                self._node.suspect(owner_id)

    async def _answer(
        self, request_iterator: AsyncIterator[wire.AppendRequest], owner_ids: set[str]
    ) -> AsyncIterator[wire.AppendResponse]:
        """The answers to an owner's Append stream (gRPC or framed): requests are written
        in order; durability is awaited concurrently and answers go back in request order
        (pipelining). At most 256 answers wait; past that the requests are not read (the
        owner's sends block on the transport's flow control). Adds each owner node id
        the requests name (up to 8) to `owner_ids`."""
        answers: asyncio.Queue[asyncio.Future[wire.AppendResponse] | None] = asyncio.Queue(
            maxsize=256
        )

        async def handle(request: wire.AppendRequest) -> asyncio.Future[wire.AppendResponse]:
            future: asyncio.Future[wire.AppendResponse] = asyncio.get_running_loop().create_future()
            try:
                bad = check_name("pchannel", request.pchannel, LIMITS)
                if bad is not None:
                    raise BadBatch(bad.message)
                self._check_assigned(request.pchannel, request.term, request.owner_node_id)
                if request.frames and self._disk is not None:
                    refusal = self._disk.replica_refusal()
                    if refusal is not None:
                        raise RaftwalError(refusal)
                wal = await self._plane.log(request.pchannel)
                if request.frames:
                    result = await wal.append(
                        request.term,
                        request.prev_lsn,
                        request.prev_term,
                        request.frames,
                        batch_crc=request.frames_crc if request.HasField("frames_crc") else None,
                        from_log_start=request.from_log_start,
                    )
                else:
                    # A heartbeat: the fence and log matching.
                    prev = request.prev_lsn
                    await wal.heartbeat(request.term, prev, request.prev_term)
                    result = None
                    matched = prev
            except Fenced as error:
                future.set_result(
                    wire.AppendResponse(
                        request_id=request.request_id,
                        status=wire.APPEND_STATUS_FENCED,
                        fenced_term=error.fenced_term,
                    )
                )
                return future
            except Mismatch as error:
                future.set_result(
                    wire.AppendResponse(
                        request_id=request.request_id,
                        status=wire.APPEND_STATUS_MISMATCH,
                        last_lsn=wal.last_lsn,
                        last_term=wal.last_term,
                        conflict_term=error.conflict_term,
                        conflict_first_lsn=error.conflict_first_lsn,
                    )
                )
                return future
            except RaftwalError as error:
                future.set_result(
                    wire.AppendResponse(
                        request_id=request.request_id,
                        status=wire.APPEND_STATUS_ERROR,
                        error=error.info,
                    )
                )
                return future
            except (BadBatch, ValueError) as error:
                # What the request got wrong (a bad name, frames that do not verify or
                # break the log's rules): never written, and the caller's error.
                future.set_result(
                    wire.AppendResponse(
                        request_id=request.request_id,
                        status=wire.APPEND_STATUS_ERROR,
                        error=error_info(E.INVALID_ARGUMENT, str(error)[:500]),
                    )
                )
                return future
            except (LogError, SegmentCorrupted, OSError) as error:
                # This node's own trouble (its disk, its log).
                future.set_result(
                    wire.AppendResponse(
                        request_id=request.request_id,
                        status=wire.APPEND_STATUS_ERROR,
                        error=error_info(E.INNER, str(error)[:500]),
                    )
                )
                return future

            async def durable() -> None:
                try:
                    if result is not None:
                        if not mutations.active(REPLICA_EARLY_DURABLE):
                            await wal.wait_durable(result)
                        await buggify.point("replica.append_answer")
                        durable_lsn = result.last_lsn
                    else:
                        durable_lsn = matched
                    # (The mutation declared beside PChannelLog.append breaks this too.)
                    if wal.fenced_term > request.term and not mutations.active("accept-stale-term"):
                        # A newer owner fenced this log meanwhile: never confirm to the old.
                        _settle(
                            future,
                            wire.AppendResponse(
                                request_id=request.request_id,
                                status=wire.APPEND_STATUS_FENCED,
                                fenced_term=wal.fenced_term,
                            ),
                        )
                        return
                    wal.advance_committed(
                        request.committed_lsn
                        if mutations.active(REPLICA_COMMIT_UNMATCHED)
                        else min(request.committed_lsn, durable_lsn)
                    )
                    _settle(
                        future,
                        wire.AppendResponse(
                            request_id=request.request_id,
                            status=wire.APPEND_STATUS_OK,
                            durable_lsn=durable_lsn,
                            last_lsn=wal.last_lsn,
                            last_term=wal.last_term,
                        ),
                    )
                except (LogError, OSError, ValueError) as error:
                    _settle(
                        future,
                        wire.AppendResponse(
                            request_id=request.request_id,
                            status=wire.APPEND_STATUS_ERROR,
                            error=error_info(E.INNER, str(error)[:500]),
                        ),
                    )

            asyncio.ensure_future(durable()).add_done_callback(_log_failure)
            return future

        async def reader() -> None:
            try:
                async for request in request_iterator:
                    if request.owner_node_id and len(owner_ids) < 8:
                        owner_ids.add(request.owner_node_id[:64])
                    await answers.put(await handle(request))
            finally:
                await answers.put(None)

        task = asyncio.create_task(reader())
        try:
            while True:
                future = await answers.get()
                if future is None:
                    break
                response = await future
                # Answers that are ready already are folded into one: the newest OK stands
                # for every request before it (the owner frees its window by request id).
                while response.status == wire.APPEND_STATUS_OK and not answers.empty():
                    following = answers._queue[0]  # noqa: SLF001 - peek, asyncio has no API
                    if following is None or not following.done():
                        break
                    answers.get_nowait()
                    response = following.result()
                yield response
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
