"""``StreamingClient``: the data-plane client callers hold, with its factories.

It is ``StreamingClientBase`` (``rpc.streaming.routing``: a ``CoordinatorClient``, the
routing table, one channel per node) plus ``producer()``, ``consumer()`` and ``txn()``. Those
build a ``Producer``, a ``Consumer`` or a ``Txn`` that shares the client; each of them needs
only the base, which is how this module can import them without an import cycle. This module
must never hold behaviour of its own beyond the factories, nor be imported by the modules
it builds.
"""

from __future__ import annotations

from typing import Any

from rpc.streaming.consumer import Consumer
from rpc.streaming.producer import Producer
from rpc.streaming.routing import StreamingClientBase
from rpc.streaming.txn import Txn


class StreamingClient(StreamingClientBase):
    """A ``CoordinatorClient``, the routing table and one channel per node, shared by the
    producers, consumers and transactions made from it. ``close()`` it when done; it closes
    the ``CoordinatorClient`` only when it created it (from endpoints)."""

    def producer(self, **options: Any) -> Producer:
        return Producer(self, **options)

    def consumer(self, vchannel: str, **options: Any) -> Consumer:
        return Consumer(self, vchannel, **options)

    def txn(self, vchannel: str, **options: Any) -> Txn:
        """``async with client.txn("v") as txn: await txn.append(b"a", b"b")``."""
        return Txn(self, vchannel, **options)
