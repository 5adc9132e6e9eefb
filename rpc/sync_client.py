"""A thin synchronous wrapper over the asyncio SDK (``rpc.client.CoordinatorClient``).

``Client`` runs a private event loop in one background daemon thread and submits every call
to it, so scripts, notebooks and threads that are not asyncio can use raftwal. Methods have
the same names, arguments, errors and bounds as the async client; async iterators become
blocking generators (closing one cancels its stream), and ``lease_keeper`` returns a plain
context manager. Must never run blocking work on the private loop, nor wait without a bound
on a call (only stream generators wait for the next item as long as the stream lives).

Credentials are the async client's: ``Client(endpoints, security=ClientSecurity.load(...))``
(``rpc.credentials``), else the RAFTWAL_TOKEN... environment variables; a refused token
raises ``UnauthenticatedError`` or ``PermissionDeniedError`` from the calling thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from rpc.client import CoordinatorClient, LeaseKeeper
from rpc.errors import RaftwalError
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api

T = TypeVar("T")

# Slack on top of a call's own bound (timeout_s + server-side wait) before the calling
# thread stops waiting: the async client always finishes first unless the loop is stuck.
RESULT_SLACK_S = 5.0
# Bound on closing a stream generator or the client.
CLOSE_TIMEOUT_S = 10.0


class Client:
    """Synchronous raftwal client; see ``CoordinatorClient`` for the arguments."""

    def __init__(self, endpoints: str | Sequence[str], **options: Any) -> None:
        # Validate first, so that a bad argument does not leave a thread behind.
        self._async = CoordinatorClient(endpoints, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftwal-client", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def async_client(self) -> CoordinatorClient:
        """The wrapped asyncio client (only for use on this wrapper's loop)."""
        return self._async

    @property
    def leader(self) -> str | None:
        return self._async.leader

    # -- plumbing -------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T], extra_wait_s: float = 0.0) -> T:
        if self._closed:
            coroutine.close()
            raise RuntimeError("Client is closed")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        bound_s = self._async.timeout_s + extra_wait_s + RESULT_SLACK_S
        try:
            return future.result(timeout=bound_s)
        except BaseException:
            # Timed out or interrupted (Ctrl-C): do not leave the call running.
            future.cancel()
            raise

    def _iterate(self, stream: AsyncIterator[T]) -> Iterator[T]:
        current: dict[str, asyncio.Task[Any] | None] = {"task": None}

        async def step() -> tuple[bool, T | None]:
            current["task"] = asyncio.current_task()
            try:
                return True, await stream.__anext__()
            except StopAsyncIteration:
                return False, None

        async def close() -> None:
            task = current["task"]
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RaftwalError):
                    await task
            await stream.aclose()  # type: ignore[attr-defined]

        try:
            while True:
                # A watch waits for the next item as long as the stream lives: that wait is
                # the point of a watch, and the stream itself bounds its reconnections.
                has_item, item = asyncio.run_coroutine_threadsafe(step(), self._loop).result()
                if not has_item:
                    return
                yield item  # type: ignore[misc]
        finally:
            if not self._closed:
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(CLOSE_TIMEOUT_S)

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        """Close the async client, stop the loop and join its thread (idempotent)."""
        if self._closed:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._async.close(), self._loop).result(
                CLOSE_TIMEOUT_S
            )
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- channels -------------------------------------------------------------------

    def create_channels(
        self,
        count: int = 0,
        prefix: str = "",
        names: Sequence[str] = (),
        replica_count: int = 0,
        owner: pb.OwnerDescription | None = None,
        *,
        request_id: str = "",
    ) -> api.CreateChannelsResponse:
        return self._run(
            self._async.create_channels(
                count, prefix, names, replica_count, owner, request_id=request_id
            )
        )

    def drop_channels(
        self, names: Sequence[str], *, request_id: str = ""
    ) -> api.DropChannelsResponse:
        return self._run(self._async.drop_channels(names, request_id=request_id))

    def describe_channels(
        self, names: Sequence[str] = (), linearizable: bool = True
    ) -> api.DescribeChannelsResponse:
        return self._run(self._async.describe_channels(names, linearizable))

    def list_channels(
        self, linearizable: bool = True, include_dropped: bool = False
    ) -> api.ListChannelsResponse:
        return self._run(self._async.list_channels(linearizable, include_dropped))

    def create_vchannel(
        self,
        name: str,
        pchannel: str,
        owner: pb.OwnerDescription | None = None,
        *,
        request_id: str = "",
    ) -> api.CreateVChannelResponse:
        return self._run(self._async.create_vchannel(name, pchannel, owner, request_id=request_id))

    def drop_vchannel(self, name: str, *, request_id: str = "") -> api.DropVChannelResponse:
        return self._run(self._async.drop_vchannel(name, request_id=request_id))

    def watch_assignments(self) -> Iterator[api.AssignmentDiscovery]:
        return self._iterate(self._async.watch_assignments())

    # -- leases and locks -----------------------------------------------------------

    def grant_lease(
        self, ttl_ms: int, holder: str = "", *, request_id: str = ""
    ) -> api.GrantLeaseResponse:
        return self._run(self._async.grant_lease(ttl_ms, holder, request_id=request_id))

    def keep_alive(self, lease_id: int) -> api.KeepAliveResponse:
        return self._run(self._async.keep_alive(lease_id))

    def lease_keeper(self, lease_id: int, interval_s: float | None = None) -> SyncLeaseKeeper:
        return SyncLeaseKeeper(self, self._async.lease_keeper(lease_id, interval_s))

    def revoke_lease(self, lease_id: int, *, request_id: str = "") -> api.RevokeLeaseResponse:
        return self._run(self._async.revoke_lease(lease_id, request_id=request_id))

    def lock(
        self,
        key: str,
        lease_id: int,
        mode: str | int = "exclusive",
        wait_timeout_ms: int = 0,
        *,
        request_id: str = "",
    ) -> api.LockResponse:
        return self._run(
            self._async.lock(key, lease_id, mode, wait_timeout_ms, request_id=request_id),
            extra_wait_s=max(0, wait_timeout_ms) / 1000,
        )

    def unlock(self, key: str, lease_id: int, *, request_id: str = "") -> api.UnlockResponse:
        return self._run(self._async.unlock(key, lease_id, request_id=request_id))

    # -- broadcasts -----------------------------------------------------------------

    def broadcast(
        self,
        message: bytes | str,
        vchannels: Sequence[str],
        resource_keys: Iterable[tuple[str, str | int] | pb.ResourceKey] = (),
        msg_type: str = "",
        idempotency_key: str = "",
        lock_timeout_ms: int = 0,
        *,
        request_id: str = "",
    ) -> api.BroadcastResponse:
        return self._run(
            self._async.broadcast(
                message,
                vchannels,
                resource_keys,
                msg_type,
                idempotency_key,
                lock_timeout_ms,
                request_id=request_id,
            ),
            extra_wait_s=max(0, lock_timeout_ms) / 1000,
        )

    def ack(
        self, broadcast_id: int, vchannel: str, checkpoint: int, *, request_id: str = ""
    ) -> api.AckResponse:
        return self._run(self._async.ack(broadcast_id, vchannel, checkpoint, request_id=request_id))

    def wait_resource_key(
        self, key: str, mode: str | int = "once", timeout_ms: int = 0
    ) -> api.WaitResourceKeyResponse:
        return self._run(
            self._async.wait_resource_key(key, mode, timeout_ms),
            extra_wait_s=max(0, timeout_ms) / 1000,
        )

    # -- history, status, policy ----------------------------------------------------

    def watch_events(self, from_revision: int = 1, kinds: Sequence[str] = ()) -> Iterator[pb.Event]:
        return self._iterate(self._async.watch_events(from_revision, kinds))

    def cluster_status(self, linearizable: bool = True) -> api.ClusterStatusResponse:
        return self._run(self._async.cluster_status(linearizable))

    def set_balance_policy(
        self,
        allow_rebalance: bool,
        max_moves_per_round: int = 0,
        freeze: Sequence[str] = (),
        unfreeze: Sequence[str] = (),
        *,
        request_id: str = "",
    ) -> api.SetBalancePolicyResponse:
        return self._run(
            self._async.set_balance_policy(
                allow_rebalance, max_moves_per_round, freeze, unfreeze, request_id=request_id
            )
        )

    def update_replicate_configuration(
        self, configuration: pb.ReplicateConfiguration, *, request_id: str = ""
    ) -> api.UpdateReplicateConfigurationResponse:
        return self._run(
            self._async.update_replicate_configuration(configuration, request_id=request_id)
        )

    def get_replicate_configuration(
        self, linearizable: bool = True
    ) -> api.GetReplicateConfigurationResponse:
        return self._run(self._async.get_replicate_configuration(linearizable))

    def change_membership(
        self, node_id: str, add: bool, *, timeout_ms: int = 0
    ) -> api.ChangeMembershipResponse:
        return self._run(
            self._async.change_membership(node_id, add, timeout_ms=timeout_ms),
            extra_wait_s=(timeout_ms or 10_000) / 1000,
        )

    def forget_node(self, node_id: str) -> api.ChangeMembershipResponse:
        return self._run(self._async.forget_node(node_id))

    def list_members(self) -> api.ListMembersResponse:
        return self._run(self._async.list_members())


class SyncLeaseKeeper:
    """Context manager keeping a lease alive on the client's loop; ``alive`` and
    ``lost_error`` read the keeper's state from any thread."""

    def __init__(self, client: Client, keeper: LeaseKeeper) -> None:
        self._client = client
        self._keeper = keeper

    @property
    def lease_id(self) -> int:
        return self._keeper.lease_id

    @property
    def alive(self) -> bool:
        return self._keeper.alive

    @property
    def lost_error(self) -> RaftwalError | None:
        return self._keeper.lost_error

    @property
    def remaining_s(self) -> float:
        return self._keeper.remaining_s

    def start(self) -> SyncLeaseKeeper:
        self._client._run(self._keeper.start())
        return self

    def stop(self) -> None:
        self._client._run(self._keeper.stop())

    def wait_lost(self, timeout_s: float) -> bool:
        """Block until the lease is lost (True) or `timeout_s` passes (False)."""
        return self._client._run(self._keeper.wait_lost(timeout_s), extra_wait_s=timeout_s)

    def __enter__(self) -> SyncLeaseKeeper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
