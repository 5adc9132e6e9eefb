"""Which data worker of a node holds a pchannel: one rule that every node, the SDK and the
Spark connector compute alike, so that nobody has to ask.

A node runs ``data_workers`` processes for its data plane (DESIGN.md section 2) and
announces their gRPC addresses through Raft (``Node.worker_addresses``, by index). Every
pchannel a node holds, as owner or replica, lives on worker
``worker_index(pchannel, len(worker_addresses))`` of that node: rendezvous hashing
(highest random weight), so the pchannels spread evenly over the workers, the choice
depends on nothing but the name and the count, and it stays put while the count does.

A node that announced no workers yet serves at its own address (``address_for``), whose
answer then names the worker once it is known.

What must never happen here: an import of anything of ours, any I/O, anything that
differs between two processes (Python's ``hash`` is salted per process: never use it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Protocol


def _weight(pchannel: str, index: int) -> bytes:
    return hashlib.blake2b(
        f"{index}\x00{pchannel}".encode(), digest_size=8, person=b"raftwal-wk"
    ).digest()


def worker_index(pchannel: str, workers: int) -> int:
    """The worker (0..workers-1) that holds `pchannel` on a node with `workers` workers."""
    if workers <= 1:
        return 0
    return max(range(workers), key=lambda index: _weight(pchannel, index))


def address_for(node_address: str, worker_addresses: Sequence[str], pchannel: str) -> str:
    """The gRPC address serving `pchannel` on a node: its worker's, or the node's own while
    it announced no workers (or an empty one)."""
    if not worker_addresses:
        return node_address
    address = worker_addresses[worker_index(pchannel, len(worker_addresses))]
    return address or node_address


class _Node(Protocol):
    node_id: str
    address: str

    @property
    def worker_addresses(self) -> Sequence[str]: ...


def serving_address(nodes: Iterable[_Node], node_id: str, pchannel: str) -> str:
    """Where `node_id` serves `pchannel`, from a list of nodes as ``ClusterStatus`` (or
    ``WatchAssignments``) returns them: its data worker for it, or its own address while
    it announced none; "" for a node not in `nodes`."""
    for node in nodes:
        if node.node_id == node_id:
            return address_for(node.address, list(node.worker_addresses), pchannel)
    return ""


__all__ = ["address_for", "serving_address", "worker_index"]
