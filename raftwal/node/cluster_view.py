"""The cluster's nodes as a process of a node sees them: those of its config file, and
every node that joined without being in it (``raftwal/node/join.py``), at the gRPC and
Raft addresses it announced in its heartbeats (registered in the replicated state),
without the nodes ``raftwal member remove`` forgot (``RemoveNode``), except this node
itself. The control process reads it from its Raft replica, a data worker from its copy of
the state (``raftwal.node.planes.StateMirror``).

Must never write anything: it only reads the applied state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

from raftwal.node.config import ClusterConfig, NodeConfig
from rpc.protos import coordination_pb2 as pb

T = TypeVar("T")

_Announced = tuple[tuple[tuple[str, str, str], ...], tuple[str, ...]]


class _StateReader(Protocol):
    def read(self, reader: Callable[[pb.CoordinationState], T]) -> T: ...


def announced_nodes(state: pb.CoordinationState) -> _Announced:
    """(id, gRPC address, Raft address) of every node the state has both addresses of,
    and the ids of the nodes `raftwal member remove` forgot."""
    return (
        tuple(
            (node_id, node.address, node.raft_address)
            for node_id, node in sorted(state.nodes.items())
            if node.address and node.raft_address
        ),
        tuple(sorted(state.removed_nodes)),
    )


def removed_node(state: pb.CoordinationState, node_id: str) -> pb.RemovedNode | None:
    """`node_id`'s removal (a copy), or None when it was not removed (or rejoined since)."""
    if node_id not in state.removed_nodes:
        return None
    copy = pb.RemovedNode()
    copy.CopyFrom(state.removed_nodes[node_id])
    return copy


class ClusterView:
    """``current(replica)``: the cluster's nodes (see the module doc), cached until the
    announced nodes change."""

    def __init__(self, static: ClusterConfig, me_id: str) -> None:
        self.static = static
        self._me_id = me_id
        self._cache: tuple[_Announced, ClusterConfig] = (((), ()), static)

    def current(self, replica: _StateReader | None) -> ClusterConfig:
        static = self.static
        if replica is None:
            return static
        seen_state = replica.read(announced_nodes)
        seen, view = self._cache
        if seen_state == seen:
            return view
        announced, removed_ids = seen_state
        removed = set(removed_ids) - {self._me_id}
        known = {n.id for n in static.nodes}
        kept = tuple(n for n in static.nodes if n.id not in removed)
        added = []
        for node_id, address, raft_address in announced:
            if node_id in known:
                continue
            host, _, grpc_port = address.rpartition(":")
            _, _, raft_port = raft_address.rpartition(":")
            if not host or not grpc_port.isdigit() or not raft_port.isdigit():
                continue
            added.append(
                NodeConfig(
                    id=node_id,
                    host=host,
                    grpc_port=int(grpc_port),
                    raft_port=int(raft_port),
                    data_dir=Path("/nonexistent") / node_id,
                    role="data",
                )
            )
        view = (
            replace(static, nodes=kept + tuple(added))
            if added or len(kept) != len(static.nodes)
            else static
        )
        self._cache = (seen_state, view)
        return view
