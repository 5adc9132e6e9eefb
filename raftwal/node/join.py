"""Joining a running cluster without touching the other nodes' config files.

A new node's config names only itself, plus the gRPC endpoints of an existing cluster
(``[cluster] join = ["10.0.0.1:7201", ...]`` or ``raftwal node --join``). Before it
starts, ``discover`` (in a child process, ``discover_apart``: the supervisor never
starts gRPC before it forks) asks one of them for ``ClusterStatus`` (with the node's own
credentials: its certificate and the node token), adds every member it reports to the
config (their gRPC and Raft addresses and roles) and keeps them in ``peers.json`` in the
data directory, so that a restart finds the cluster even when the endpoints it was given
have moved. The node then starts as a data node: it dials the voters' Raft ports (a
read-only peer, authenticated by the cluster secret) and heartbeats to the leader with
``joined`` set, which registers its addresses in the replicated state; every node then
routes to it from there (``Node.config``). ``raftwal member add`` makes it a voter.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import grpc

from raftwal.node.config import ClusterConfig, ConfigError, NodeConfig
from rpc.credentials import ClientSecurity
from rpc.protos import coordinator_pb2 as api
from rpc.protos import coordinator_pb2_grpc

log = logging.getLogger(__name__)

PEERS_FILE = "peers.json"
# Per endpoint and attempt; the whole discovery retries until `timeout_s`.
STATUS_TIMEOUT_S = 5.0


def _node_from(member_id: str, grpc_address: str, raft_address: str, role: str) -> NodeConfig:
    host, _, grpc_port = grpc_address.rpartition(":")
    raft_host, _, raft_port = raft_address.rpartition(":")
    if not host or not grpc_port.isdigit() or not raft_host or not raft_port.isdigit():
        raise ConfigError(
            f"member {member_id} of the cluster to join has addresses ({grpc_address!r}, "
            f"{raft_address!r}; expected host:port for gRPC and Raft)"
        )
    return NodeConfig(
        id=member_id,
        host=host,
        grpc_port=int(grpc_port),
        raft_port=int(raft_port),
        # Never opened: the data directory of a node is its own business.
        data_dir=Path("/nonexistent") / member_id,
        role=role if role in ("voter", "data") else "voter",
    )


def _ask(endpoints: Sequence[str], security: ClientSecurity) -> list[NodeConfig] | str:
    """The members one endpoint reports, or why none answered."""
    errors = []
    for endpoint in endpoints:
        try:
            with security.channel(endpoint) as channel:
                stub = coordinator_pb2_grpc.CoordinatorStub(channel)
                status = stub.ClusterStatus(api.ClusterStatusRequest(), timeout=STATUS_TIMEOUT_S)
        except grpc.RpcError as error:
            errors.append(f"{endpoint}: {error.code().name}")
            continue
        members = [
            _node_from(m.node_id, m.grpc_address, m.raft_address, m.role or "voter")
            for m in status.members
            if m.grpc_address and m.raft_address
        ]
        if any(m.voter for m in members):
            return members
        errors.append(f"{endpoint}: no voter in its answer")
    return "; ".join(errors) or "no endpoint"


def _write_peers(path: Path, members: Sequence[NodeConfig]) -> None:
    text = json.dumps(
        [
            {"id": m.id, "grpc": m.grpc_address, "raft": m.raft_address, "role": m.role}
            for m in members
        ],
        indent=2,
    )
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(descriptor, text.encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)


def _read_peers(path: Path) -> list[NodeConfig]:
    try:
        data = json.loads(path.read_text())
        return [_node_from(p["id"], p["grpc"], p["raft"], p.get("role", "voter")) for p in data]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot read {path} ({error})") from None


def discover(
    config: ClusterConfig,
    node_id: str,
    endpoints: Sequence[str],
    security: ClientSecurity,
    timeout_s: float = 60.0,
) -> ClusterConfig:
    """`config` with the members of the cluster behind `endpoints` added (see the module
    doc); `node_id` joins as a data node. Falls back to the members kept in peers.json
    when no endpoint answers within `timeout_s`."""
    me = config.node(node_id)
    me.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    peers_path = me.data_dir / PEERS_FILE
    deadline = time.monotonic() + timeout_s
    while True:
        answer = _ask(endpoints, security)
        if not isinstance(answer, str) or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if isinstance(answer, str):
        if not peers_path.exists():
            raise ConfigError(
                f"cannot join: no answer from {', '.join(endpoints)} ({answer}; expected "
                "the gRPC endpoints of a running cluster)"
            )
        log.warning("no answer from the join endpoints (%s): using %s", answer, peers_path)
        members = _read_peers(peers_path)
    else:
        members = answer
        _write_peers(peers_path, [m for m in members if m.id != node_id])
    for existing in members:
        if existing.id == node_id and (existing.grpc_address, existing.raft_address) != (
            me.grpc_address,
            me.raft_address,
        ):
            # Another process holds this id (or did, at other addresses): two processes
            # under one id could both recover its pchannels at one term.
            raise ConfigError(
                f"cannot join as {node_id}: the cluster has node {node_id} at grpc "
                f"{existing.grpc_address}, raft {existing.raft_address}, and this node is "
                f"configured at grpc {me.grpc_address}, raft {me.raft_address} (expected an "
                "id of its own; a node moves to new addresses with `raftwal member remove` "
                "and a rejoin)"
            )
    others = [m for m in members if m.id != node_id]
    for other in others:
        if other.grpc_address == me.grpc_address or other.raft_address == me.raft_address:
            raise ConfigError(
                f"cannot join as {node_id}: member {other.id} has its addresses "
                f"({other.grpc_address}, {other.raft_address}; expected addresses of its own)"
            )
    configured = {n.id for n in config.nodes}
    added = tuple(m for m in others if m.id not in configured)
    log.info(
        "node %s joins the cluster of %s",
        node_id,
        ", ".join(f"{m.id} ({m.role})" for m in others),
    )
    # A joining node starts as a data node (`raftwal member add` promotes it; role.json
    # then says so at its next start).
    nodes = tuple(replace(n, role="data") if n.id == node_id else n for n in config.nodes)
    return replace(config, nodes=nodes + added)


def discover_apart(config: ClusterConfig, node_id: str, endpoints: Sequence[str]) -> ClusterConfig:
    """`discover` with the node's own client credentials, in a child process of its own.

    The first gRPC channel starts gRPC's threads (its event engine, its timer), which
    outlive the channel. `raftwal node` forks the node's control process and data workers
    right after discovery, and a lock one of those threads held at the fork stays held in
    the child: a joining node's control process logged "raft peer started" and never
    served, stuck in its own gRPC server's start (twice in full test runs). The child here
    exits before the node forks anything, so the supervisor never runs gRPC itself.

    The answer comes back pickled over a pipe made here, from this process's own fork: no
    byte of it comes from the network (the child parsed the cluster's answer).
    """
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the discovery child: never returns
        status = 1
        try:
            os.close(read_end)
            from raftwal.node.security import NodeSecurity

            result: tuple[str, object]
            try:
                security = NodeSecurity.load(config, config.node(node_id)).client
                result = ("config", discover(config, node_id, endpoints, security))
            except ConfigError as error:
                result = ("error", str(error))
            except Exception as error:  # noqa: BLE001 - one line for the operator
                result = ("error", f"cannot join: {type(error).__name__}: {error}")
            with os.fdopen(write_end, "wb") as out:
                out.write(pickle.dumps(result))
            status = 0
        except BaseException:  # noqa: BLE001 - the parent reports a child without answer
            log.exception("the join discovery process failed")
        finally:
            logging.shutdown()
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answers:
        data = answers.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise ConfigError(
            f"cannot join: the discovery process ended without an answer (wait status {status})"
        )
    kind, value = pickle.loads(data)  # noqa: S301 - our own child's answer, see above
    if kind == "error":
        raise ConfigError(str(value))
    assert isinstance(value, ClusterConfig)
    return value
