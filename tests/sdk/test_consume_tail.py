"""A tailing consumer gets the end of a burst as soon as it is committed, against a real
three-node cluster.

A Consume stream that has sent everything committed waits for more. Its entries may be
appended already and only waiting for a majority's fsync; the owner's commit point then
moves without an append. A stream that waited for the next append (not for the commit
point) held a burst's last entries back until a later write came, or until its poll
(CONSUME_POLL_S, 1 s) ran out: at the end of every burst a tailing reader, a Structured
Streaming query and a standby's measuring consumer saw the tail a second late.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator

import pytest

from raftwal.cli import dev
from rpc.streaming_client import Consumer, Producer, StreamingClient
from tests.sdk.test_streaming_client import _replicated_vchannel
from tests.timing import scaled

pytestmark = pytest.mark.cluster

TEST_TIMEOUT_S = 60.0
BURSTS = 12
BURST_MESSAGES = 200
#: The server's poll when nothing wakes a waiting stream
#: (raftwal/services/streaming_node.py, CONSUME_POLL_S).
SERVER_POLL_S = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCluster]:
    directory = tmp_path_factory.mktemp("consume-tail")
    local = dev.up(directory, 3, timeout_s=60, config=dev.make_config(directory.resolve(), 3))
    try:
        yield local
    finally:
        local.stop_all()


async def test_the_end_of_a_burst_reaches_a_tailing_consumer_once_committed(
    cluster: dev.LocalCluster,
) -> None:
    async with StreamingClient(cluster.endpoints) as client:
        _, vchannel = await _replicated_vchannel(client, "tail")
        seen: dict[bytes, float] = {}
        arrived = asyncio.Event()

        async def tail() -> None:
            async for entry in Consumer(client, vchannel):
                seen[bytes(entry.payload)] = time.monotonic()
                arrived.set()

        reader = asyncio.create_task(tail())
        delays: list[float] = []
        try:
            async with Producer(
                client, linger_ms=0, max_batch_messages=20, max_in_flight=8
            ) as producer:
                for burst in range(BURSTS):
                    payloads = [b"t%02d-%04d" % (burst, i) for i in range(BURST_MESSAGES)]
                    # Pipelined, so the owner appends the burst's end while the reader is
                    # still sending its start; then nothing more is written.
                    futures = [await producer.submit(vchannel, p) for p in payloads]
                    positions = await asyncio.wait_for(
                        asyncio.gather(*futures), scaled(TEST_TIMEOUT_S)
                    )
                    assert len(positions) == BURST_MESSAGES
                    acked_at = time.monotonic()
                    last = payloads[-1]
                    deadline = acked_at + scaled(TEST_TIMEOUT_S)
                    while last not in seen:
                        assert not reader.done(), reader
                        assert time.monotonic() < deadline, f"burst {burst} never arrived"
                        arrived.clear()
                        with_timeout = max(0.0, deadline - time.monotonic())
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(arrived.wait(), with_timeout)
                    delays.append(max(0.0, seen[last] - acked_at))
                    assert all(p in seen for p in payloads), f"burst {burst} has a gap"
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    # Every burst reaches the reader, whole; the tail of each no later than a fraction of
    # the server's idle poll after its last ack (a reader that waited for another append
    # got it only when the poll ran out, about SERVER_POLL_S later).
    median = statistics.median(delays)
    print(f"tail delay after the last ack, s: median {median:.3f}, max {max(delays):.3f}")
    assert median < SERVER_POLL_S / 2, [round(d, 3) for d in delays]
