"""The assignment cache's owner hints and held-back owners (`AssignmentCache.report_failure`),
which every producer, consumer and pack consumer calls when an owner fails them."""

from __future__ import annotations

from rpc.coordinator_client import CoordinatorClient
from rpc.protos import errors_pb2
from rpc.streaming.routing import AssignmentCache


async def test_a_failure_with_no_address_and_no_hint_is_taken_in_stride() -> None:
    """A failure reported before any owner was known (no address) and without an owner
    hint: nothing to hold back and no hint to drop. It raised KeyError, which ended a pack
    consumer of `raftwal chaos --wal jetstream --seed 5101` ("workload task packs failed:
    KeyError('chaos552304_1')")."""
    coordinator = CoordinatorClient("127.0.0.1:1")
    try:
        cache = AssignmentCache(coordinator)
        cache.report_failure("p_0", "", 3, errors_pb2.ErrorInfo(code=errors_pb2.NOT_OWNER))
        cache.report_failure("p_0", "", 3, None)
        # A hint is kept, and a failure of the hinted address drops it.
        hinted = errors_pb2.ErrorInfo(code=errors_pb2.NOT_OWNER, owner_hint="n2:1", current_term=4)
        cache.report_failure("p_0", "n1:1", 3, hinted)
        assert cache._hints == {"p_0": ("n2:1", 4)}  # noqa: SLF001
        cache.report_failure("p_0", "n2:1", 4, None)
        assert cache._hints == {}  # noqa: SLF001
    finally:
        await coordinator.close()
