"""What a joining node's config and a joining heartbeat may be (raftwal/node/join.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftwal.node.config import ConfigError, parse_config, render_config, with_join
from raftwal.node.join import PEERS_FILE, _read_peers, _write_peers, discover
from raftwal.services.cluster import ID_IN_USE_MARK, _joiner_refusal
from rpc.credentials import ClientSecurity
from rpc.protos import coordinator_pb2 as api

ME = {"id": "n4", "host": "10.0.0.4", "grpc_port": 7201, "raft_port": 7301, "role": "data"}


def test_a_config_with_join_may_name_only_a_data_node(tmp_path: Path) -> None:
    data = {"cluster": {"join": ["10.0.0.1:7201", "10.0.0.2:7201"]}, "nodes": [ME]}
    config = parse_config(data, tmp_path, environ={})
    assert config.join == ("10.0.0.1:7201", "10.0.0.2:7201")
    assert 'join = ["10.0.0.1:7201", "10.0.0.2:7201"]' in render_config(config)
    with pytest.raises(ConfigError, match="no voting node"):
        parse_config({"nodes": [ME]}, tmp_path, environ={})
    with pytest.raises(ConfigError, match=r"invalid cluster.join endpoint \('nope'"):
        parse_config({"cluster": {"join": ["nope"]}, "nodes": [ME]}, tmp_path, environ={})
    assert with_join(config, "a:1,b:2").join == ("a:1", "b:2")


async def test_a_joining_heartbeat_is_refused_unless_it_says_so_and_is_well_formed(
    tmp_path: Path,
) -> None:
    config = parse_config(
        {"nodes": [{"id": "n1", "host": "10.0.0.1", "grpc_port": 7201, "raft_port": 7301}]},
        tmp_path,
        environ={},
    )

    def beat(**fields: object) -> api.HeartbeatRequest:
        base: dict[str, object] = {
            "node_id": "n4",
            "address": "10.0.0.4:7201",
            "raft_address": "10.0.0.4:7301",
            "joined": True,
        }
        return api.HeartbeatRequest(**{**base, **fields})

    assert await _joiner_refusal(beat(), config) is None
    for request, message in (
        (beat(joined=False), "unknown node id 'n4'"),
        (beat(node_id="n 4"), "invalid node id"),
        (beat(raft_address="10.0.0.4"), "invalid raft_address of joining node n4"),
        (beat(address="10.0.0.1:7201"), "announces an address of node n1"),
    ):
        refusal = await _joiner_refusal(request, config)
        assert refusal is not None and message in refusal.message, (request, refusal)


async def test_a_joiner_announcing_another_name_of_a_members_address_is_refused(
    tmp_path: Path,
) -> None:
    """Issue 53, item 7: `localhost:7201` is n1's `127.0.0.1:7201` under another name; the
    check compared strings and let it through. Its process must stop (ID_IN_USE_MARK)."""
    config = parse_config(
        {"nodes": [{"id": "n1", "host": "127.0.0.1", "grpc_port": 7201, "raft_port": 7301}]},
        tmp_path,
        environ={},
    )
    for address, raft_address in (
        ("localhost:7201", "127.0.0.1:7304"),
        ("127.0.0.1:7204", "localhost:7301"),
    ):
        refusal = await _joiner_refusal(
            api.HeartbeatRequest(
                node_id="n4", address=address, raft_address=raft_address, joined=True
            ),
            config,
        )
        assert refusal is not None, (address, raft_address)
        assert "announces an address of node n1" in refusal.message
        assert ID_IN_USE_MARK in refusal.message


def test_without_an_answer_a_joined_node_finds_its_peers_in_peers_json(tmp_path: Path) -> None:
    me = dict(ME, data_dir=str(tmp_path / "n4"))
    config = parse_config({"cluster": {"join": ["127.0.0.1:1"]}, "nodes": [me]}, tmp_path, {})
    with pytest.raises(ConfigError, match="cannot join: no answer from 127.0.0.1:1"):
        discover(config, "n4", config.join, ClientSecurity(), timeout_s=0)
    peers = parse_config(
        {"nodes": [{"id": "n1", "host": "10.0.0.1", "grpc_port": 7201, "raft_port": 7301}]},
        tmp_path,
        {},
    ).nodes
    _write_peers(tmp_path / "n4" / PEERS_FILE, peers)
    assert [n.raft_address for n in _read_peers(tmp_path / "n4" / PEERS_FILE)] == ["10.0.0.1:7301"]
    joined = discover(config, "n4", config.join, ClientSecurity(), timeout_s=0)
    assert [(n.id, n.role) for n in joined.nodes] == [("n4", "data"), ("n1", "voter")]
    assert [n.id for n in joined.voters] == ["n1"]


class _Aborted(Exception):
    def __init__(self, status: object) -> None:
        super().__init__(getattr(status, "details", ""))
        self.status = status


class _Context:
    async def abort_with_status(self, status: object) -> None:
        raise _Aborted(status)


class _Leader:
    """The ClusterBackend of a leader whose config names n1..n3 (no join)."""

    def __init__(self, config: object) -> None:
        self.config = config
        self.me = config.nodes[0]  # type: ignore[attr-defined]
        self.recorded: list[api.HeartbeatRequest] = []
        self.coordinator = self

    def is_leader(self) -> bool:
        return True

    def removed_node(self, node_id: str) -> None:
        return None

    def record_heartbeat(self, request: api.HeartbeatRequest) -> None:
        self.recorded.append(request)

    def joiner_conflict(self, request: api.HeartbeatRequest) -> None:
        return None

    def membership(self) -> tuple[list[str], bool]:
        return ["n1", "n2", "n3"], True

    def applied_revision(self) -> int:
        return 1

    def handover_targets(self, node_id: str) -> int:
        return 2


async def test_a_heartbeat_for_a_known_node_from_a_forged_raft_address_is_refused(
    tmp_path: Path,
) -> None:
    """Issue 53, item 7: n3's real gRPC address with a forged Raft address was accepted,
    and n3's recorded Raft address then flipped. It is refused now, with the words its
    sender stops on (another process under that id), and nothing is recorded."""
    from raftwal.services.cluster import ClusterServicer

    config = parse_config(
        {
            "nodes": [
                {"id": f"n{k}", "host": "127.0.0.1", "grpc_port": 7200 + k, "raft_port": 7300 + k}
                for k in (1, 2, 3)
            ]
        },
        tmp_path,
        environ={},
    )
    leader = _Leader(config)
    servicer = ClusterServicer(leader)  # type: ignore[arg-type]
    genuine = api.HeartbeatRequest(
        node_id="n3", address="127.0.0.1:7203", raft_address="127.0.0.1:7303", incarnation=1
    )
    await servicer.Heartbeat(genuine, _Context())
    assert leader.recorded == [genuine]
    forged = api.HeartbeatRequest(
        node_id="n3", address="127.0.0.1:7203", raft_address="10.6.6.6:7303", incarnation=2
    )
    with pytest.raises(_Aborted) as refused:
        await servicer.Heartbeat(forged, _Context())
    message = str(refused.value)
    assert ID_IN_USE_MARK in message and "10.6.6.6:7303" in message, message
    assert "127.0.0.1:7303" in message
    assert leader.recorded == [genuine]
