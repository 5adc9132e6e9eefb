"""Health judgements computed from the applied coordination state, shared by ClusterStatus
(``raftwal.node.process``), the metrics (``raftwal.node.metrics``) and the console.

Pure functions of state messages: no I/O, no clock, nothing that could block a scrape.
"""

from __future__ import annotations

from collections.abc import Sequence

from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from statemachine.types import DEFAULT_LIMITS


def under_replicated(
    pchannels: Sequence[pb.PChannel], nodes: Sequence[pb.Node]
) -> list[api.UnderReplicated]:
    """The placed, not dropped pchannels whose replica set is smaller than it should be
    (its replica_count, capped by the nodes there are: a set placed while a node was DOWN,
    until replica repair widens it) or holds a node that is DOWN."""
    down = {n.node_id for n in nodes if n.state == pb.NODE_STATE_DOWN}
    out = []
    for channel in pchannels:
        replicas = list(channel.replica_node_ids)
        if not replicas or channel.state == pb.PCHANNEL_STATE_DROPPED:
            continue
        wanted = min(channel.replica_count or DEFAULT_LIMITS.default_replica_count, len(nodes))
        lost = [n for n in replicas if n in down]
        live = len(replicas) - len(lost)
        if live < wanted:
            out.append(
                api.UnderReplicated(
                    pchannel=channel.name,
                    replica_node_ids=replicas,
                    down_node_ids=lost,
                    wanted=wanted,
                    live=live,
                )
            )
    return out


__all__ = ["under_replicated"]
