"""`raftwal dev`'s cluster config picks every port a node binds."""

from __future__ import annotations

from pathlib import Path

from raftwal.cli import dev


def test_every_port_of_every_node_is_picked_and_distinct(tmp_path: Path) -> None:
    # A node binding port 0 (the transfer port's default) takes a kernel-chosen port,
    # which could be one picked for another node that has not bound it yet.
    config = dev.make_config(tmp_path, 4, data_nodes=1)
    ports = [
        port
        for node in config.nodes
        for port in (node.grpc_port, node.raft_port, node.metrics_port, node.transfer_port)
    ]
    assert all(port > 0 for port in ports), ports
    assert len(set(ports)) == len(ports), ports
