"""A scriptable ``Coordinator`` servicer on real ``grpc.aio`` servers, for SDK and CLI tests.

Servers run on 127.0.0.1 (port 0) inside one event loop in a background thread, so both the
asyncio client (in the test's loop) and the synchronous wrapper talk to them over real
sockets. Each ``FakeCoordinator`` records what it received (method, request id, watch
start revisions) and answers from a small script: errors to return first, an error to
return always, a delay, when to kill a stream. Nothing here mocks gRPC.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc

from rpc.errors import error_info, to_status
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc, errors_pb2
from tests.timing import scaled

E = errors_pb2
T = TypeVar("T")


def not_leader(hint: str) -> errors_pb2.ErrorInfo:
    return error_info(E.NOT_LEADER, "not the Raft leader", leader_hint=hint)


def on_shutdown() -> errors_pb2.ErrorInfo:
    return error_info(E.ON_SHUTDOWN, "node is stopping")


def make_events(count: int) -> list[pb.Event]:
    return [
        pb.Event(
            revision=revision,
            raft_index=revision + 10,
            time_ms=1_700_000_000_000 + revision,
            node_registered=pb.NodeRegistered(node_id=f"n{revision}", address="127.0.0.1:1"),
        )
        for revision in range(1, count + 1)
    ]


class FakeCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """One fake node. Behaviour per method name: ``errors[method]`` (answered first, one per
    call), ``always[method]`` (answered every time after that), ``delay_s[method]``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.address = ""
        self.calls: list[str] = []
        self.request_ids: list[str] = []
        self.errors: dict[str, collections.deque[errors_pb2.ErrorInfo | grpc.StatusCode]] = (
            collections.defaultdict(collections.deque)
        )
        self.always: dict[str, errors_pb2.ErrorInfo | grpc.StatusCode] = {}
        self.delay_s: dict[str, float] = {}
        # WatchEvents: the history served, the from_revision of every stream opened, and
        # how many events a stream sends before the server kills it (None: never).
        self.events: list[pb.Event] = []
        self.watch_starts: list[int] = []
        self.kill_watch_after: int | None = None
        # WatchAssignments: versions sent, then the stream is killed (kill) or kept open.
        self.assignment_versions: list[int] = []
        self.kill_assignments = True
        # Live phase of both watches: a progress notification this often, as real nodes
        # send; None = silence (a node stopped with SIGSTOP).
        self.progress_every_s: float | None = None
        self.progress_sent = 0
        # KeepAlive: leases this node knows; the stream dies after this many answers.
        self.leases: dict[int, int] = {}
        self.keepalive_count = 0
        self.kill_keepalive_after: int | None = None
        self.status = api.ClusterStatusResponse()
        self.channels = api.ListChannelsResponse(revision=len(self.events))

    # -- scripting ------------------------------------------------------------------

    async def _script(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.calls.append(method)
        request_id = getattr(request, "request_id", None)
        if request_id is not None:
            self.request_ids.append(request_id)
        delay = self.delay_s.get(method)
        if delay:
            await asyncio.sleep(delay)
        failure = self.errors[method].popleft() if self.errors[method] else self.always.get(method)
        if failure is not None:
            await self._abort(context, failure)

    @staticmethod
    async def _abort(
        context: grpc.aio.ServicerContext, failure: errors_pb2.ErrorInfo | grpc.StatusCode
    ) -> None:
        if isinstance(failure, grpc.StatusCode):
            # A failure without ErrorInfo, as a proxy or a dying transport would give.
            await context.abort(failure, f"plain {failure.name}")
        await context.abort_with_status(to_status(failure))

    def count(self, method: str) -> int:
        return self.calls.count(method)

    # -- unary methods --------------------------------------------------------------

    async def CreateChannels(self, request, context):
        await self._script("CreateChannels", request, context)
        names = list(request.names) or [f"{request.prefix}_{k}" for k in range(request.count)]
        return api.CreateChannelsResponse(pchannels=names, revision=7)

    async def DropChannels(self, request, context):
        await self._script("DropChannels", request, context)
        return api.DropChannelsResponse(revision=8)

    async def ListChannels(self, request, context):
        await self._script("ListChannels", request, context)
        response = api.ListChannelsResponse()
        response.CopyFrom(self.channels)
        return response

    async def CreateVChannel(self, request, context):
        await self._script("CreateVChannel", request, context)
        return api.CreateVChannelResponse(
            vchannel=pb.VChannel(name=request.name, pchannel=request.pchannel, id=1), revision=9
        )

    async def GrantLease(self, request, context):
        await self._script("GrantLease", request, context)
        lease_id = 100 + len(self.leases)
        self.leases[lease_id] = request.ttl_ms
        return api.GrantLeaseResponse(lease_id=lease_id, ttl_ms=request.ttl_ms, revision=lease_id)

    async def RevokeLease(self, request, context):
        await self._script("RevokeLease", request, context)
        self.leases.pop(request.lease_id, None)
        return api.RevokeLeaseResponse(revision=200)

    async def Lock(self, request, context):
        await self._script("Lock", request, context)
        return api.LockResponse(key=request.key, fencing_token=42, revision=42)

    async def Unlock(self, request, context):
        await self._script("Unlock", request, context)
        return api.UnlockResponse(revision=43)

    async def ClusterStatus(self, request, context):
        await self._script("ClusterStatus", request, context)
        return self.status

    # -- streams --------------------------------------------------------------------

    async def KeepAlive(self, request_iterator, context):
        self.calls.append("KeepAlive")
        async for request in request_iterator:
            if request.lease_id not in self.leases:
                await self._abort(
                    context, error_info(E.NOT_FOUND, f"lease {request.lease_id} does not exist")
                )
            if (
                self.kill_keepalive_after is not None
                and self.keepalive_count >= self.kill_keepalive_after
            ):
                await self._abort(context, on_shutdown())
            self.keepalive_count += 1
            ttl_ms = self.leases[request.lease_id]
            yield api.KeepAliveResponse(lease_id=request.lease_id, ttl_ms=ttl_ms, revision=1)

    async def WatchEvents(self, request, context):
        await self._script("WatchEvents", request, context)
        self.watch_starts.append(request.from_revision)
        sent = 0
        for event in self.events:
            if event.revision < request.from_revision:
                continue
            if request.kinds and event.WhichOneof("body") not in request.kinds:
                continue
            if self.kill_watch_after is not None and sent >= self.kill_watch_after:
                await self._abort(context, on_shutdown())
            sent += 1
            yield api.WatchEventsResponse(events=[event], applied_revision=len(self.events))
        # Live phase: nothing new ever happens on a fake node.
        next_revision = max(request.from_revision, len(self.events) + 1)
        async for _ in self._live():
            yield api.WatchEventsResponse(
                applied_revision=len(self.events), next_revision=next_revision
            )

    async def WatchAssignments(self, request, context):
        await self._script("WatchAssignments", request, context)
        for version in self.assignment_versions:
            yield api.AssignmentDiscovery(version=version)
        if self.kill_assignments:
            await self._abort(context, grpc.StatusCode.UNAVAILABLE)
        last = self.assignment_versions[-1] if self.assignment_versions else 0
        async for _ in self._live():
            yield api.AssignmentDiscovery(version=last, progress=True)

    async def _live(self) -> Any:
        """Ticks of a watch's live phase: one per progress notification to send, or none
        at all (silence until the client cancels)."""
        if self.progress_every_s is None:
            await asyncio.sleep(3600)
            return
        for _ in range(100_000):
            await asyncio.sleep(self.progress_every_s)
            self.progress_sent += 1
            yield


class FakeCluster:
    """Fake nodes served by real grpc.aio servers from one background event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: dict[str, grpc.aio.Server] = {}
        self.nodes: list[FakeCoordinator] = []

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=scaled(10))

    def add(self, name: str) -> FakeCoordinator:
        node = FakeCoordinator(name)

        async def start() -> str:
            server = grpc.aio.server()
            coordinator_pb2_grpc.add_CoordinatorServicer_to_server(node, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            address = f"127.0.0.1:{port}"
            self._servers[address] = server
            return address

        node.address = self._run(start())
        self.nodes.append(node)
        return node

    def stop_node(self, node: FakeCoordinator) -> None:
        server = self._servers.pop(node.address, None)
        if server is not None:
            self._run(server.stop(grace=None))

    def close(self) -> None:
        for node in list(self.nodes):
            self.stop_node(node)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=scaled(10))
        self._loop.close()
