"""The replication configuration's pure validation (statemachine/replicate.py), its
redaction in answers and history, its place in snapshots, and `raftwal replicate set`'s
file parser. The command's accept and reject paths through apply are rows of
test_commands.py; the gRPC surface is tests/cluster/test_replicate_config.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftwal.cli.replicate import ReplicateFileError, load_replicate_file
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from statemachine import DEFAULT_LIMITS, new_state, restore_state, snapshot_state
from statemachine.replicate import (
    check_configuration,
    redacted,
    redacted_event,
    with_kept_tokens,
)
from statemachine.types import Rejection

TOKEN = "s3cret-token-never-shown"
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def cluster(cluster_id: str, *pchannels: str, **fields: object) -> pb.ReplicateCluster:
    fields.setdefault("endpoints", [f"{cluster_id}.example:7201"])
    return pb.ReplicateCluster(
        cluster_id=cluster_id,
        pchannels=list(pchannels or ("p1", "p2")),
        **fields,  # type: ignore[arg-type]
    )


def config(
    *clusters: pb.ReplicateCluster, edges: tuple[str, ...] = ()
) -> pb.ReplicateConfiguration:
    """`edges` as "a>b" strings."""
    return pb.ReplicateConfiguration(
        clusters=list(clusters),
        topology=[
            pb.ReplicateTopologyEdge(
                source_cluster_id=e.split(">")[0], target_cluster_id=e.split(">")[1]
            )
            for e in edges
        ],
    )


def secret(token: str = TOKEN, pem: str = "") -> pb.ReplicateCredentials:
    return pb.ReplicateCredentials(token=token, ca_certificate_pem=pem)


A, B, C, D = (cluster(n) for n in "abcd")

# (name, configuration, local cluster id, expected message part or None for accepted)
CASES = [
    ("empty clears", pb.ReplicateConfiguration(), "", None),
    ("two clusters, one edge", config(A, B, edges=("a>b",)), "a", None),
    ("a chain", config(A, B, C, edges=("a>b", "b>c")), "c", None),
    ("a fan-out", config(A, B, C, edges=("a>b", "a>c")), "b", None),
    ("clusters without edges", config(A, B), "a", None),
    ("credentials", config(cluster("a", credentials=secret(pem=CA)), B), "a", None),
    ("no local id", config(A, B, edges=("a>b",)), "", "this cluster has no cluster_id (got ''"),
    ("local not listed", config(A, B), "z", "this cluster ('z') is not in the configuration"),
    ("edges only", config(edges=("a>b",)), "a", "a topology without clusters"),
    ("unknown source", config(A, B, edges=("x>b",)), "a", "unknown topology[0].source_cluster_id ('x'"),
    ("unknown target", config(A, B, edges=("a>x",)), "a", "unknown topology[0].target_cluster_id"),
    ("self edge", config(A, B, edges=("a>a",)), "a", "invalid topology[0] (a -> a"),
    ("two sources", config(A, B, C, edges=("a>c", "b>c")), "a", "cluster 'c' has two sources"),
    ("two-cycle", config(A, B, edges=("a>b", "b>a")), "a", "the topology has a cycle (a -> b -> a"),
    ("three-cycle", config(A, B, C, edges=("a>b", "b>c", "c>a")), "a", "cycle"),
    ("cycle off the start", config(A, B, C, D, edges=("a>b", "b>c", "c>b")), "a", "two sources"),
    ("duplicate id", config(A, cluster("a")), "a", "duplicate cluster_id ('a'"),
    ("bad id", config(cluster("../x"), A), "a", "invalid clusters[0].cluster_id ('../x'"),
    ("empty id", config(cluster(""), A), "a", "missing clusters[0].cluster_id (got ''"),
    ("no endpoints", config(cluster("a", endpoints=[]), B), "a", "invalid number of endpoints of cluster 'a' (0; expected 1..16)"),
    ("bad endpoint", config(cluster("a", endpoints=["no-port"]), B), "a", "invalid endpoint of cluster 'a' ('no-port'; expected host:port)"),
    ("duplicate endpoint", config(cluster("a", endpoints=["h:1", "h:1"]), B), "a", "duplicate endpoint of cluster 'a'"),
    ("pchannel counts", config(A, cluster("b", "q1")), "a", "cluster 'b' has 1 pchannels (got 1; expected 2 as cluster 'a'"),
    ("bad pchannel", config(cluster("a", "p1", "/etc"), B), "a", "invalid pchannel of cluster 'a' ('/etc'"),
    ("duplicate pchannel", config(cluster("a", "p1", "p1"), B), "a", "duplicate pchannel of cluster 'a' ('p1'"),
    ("token with space", config(cluster("a", credentials=secret("two words")), B), "a", "a value of 9 chars with spaces"),
    ("token too long", config(cluster("a", credentials=secret("x" * 4097)), B), "a", "credentials.token too long (4097 chars; expected 0..4096)"),
    ("not a PEM", config(cluster("a", credentials=secret(pem="hello")), B), "a", "invalid cluster 'a' credentials.ca_certificate_pem ('hello'; expected PEM"),
    ("too many clusters", config(*(cluster(f"c{k}") for k in range(17))), "c0", "invalid number of clusters (17; expected 1..16)"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "configuration", "local", "expected"), CASES)
def test_check_configuration(
    name: str, configuration: pb.ReplicateConfiguration, local: str, expected: str | None
) -> None:
    rejection = check_configuration(configuration, local, DEFAULT_LIMITS)
    if expected is None:
        assert rejection is None, rejection
        return
    assert rejection is not None, f"{name}: accepted"
    assert rejection.code == errors_pb2.INVALID_ARGUMENT
    assert expected in rejection.message
    assert "expected" in rejection.message


def test_no_rejection_shows_a_token() -> None:
    for token in ("bad token here", "y" * 5000):
        configuration = config(cluster("a", credentials=secret(token)), B)
        rejection = check_configuration(configuration, "a", DEFAULT_LIMITS)
        assert rejection is not None
        assert token[:8] not in rejection.message


def test_redacted_hides_tokens_and_keeps_the_rest() -> None:
    configuration = config(cluster("a", credentials=secret(pem=CA)), B, edges=("a>b",))
    answer = redacted(configuration)
    assert answer.clusters[0].credentials.token == ""
    assert answer.clusters[0].credentials.token_set
    assert answer.clusters[0].credentials.ca_certificate_pem == CA
    assert not answer.clusters[1].credentials.token_set
    assert TOKEN.encode() not in answer.SerializeToString()
    # The original is untouched.
    assert configuration.clusters[0].credentials.token == TOKEN
    assert answer.topology == configuration.topology


def test_redacted_event_hides_tokens_in_updates_and_restores() -> None:
    configuration = config(cluster("a", credentials=secret()), B)
    update = pb.Event(
        revision=5,
        replicate_configuration_updated=pb.ReplicateConfigurationUpdated(
            configuration=configuration, local_cluster_id="a"
        ),
    )
    shown = redacted_event(update)
    assert TOKEN.encode() not in shown.SerializeToString()
    assert shown.replicate_configuration_updated.configuration.clusters[0].credentials.token_set
    assert update.replicate_configuration_updated.configuration.clusters[0].credentials.token

    saved = new_state()
    saved.replicate_configuration.CopyFrom(configuration)
    restore = pb.Event(revision=6, state_restored=pb.StateRestored(state=snapshot_state(saved)))
    shown = redacted_event(restore)
    assert TOKEN.encode() not in shown.SerializeToString()
    assert TOKEN.encode() in restore.SerializeToString()

    other = pb.Event(revision=7, node_registered=pb.NodeRegistered(node_id="n1"))
    assert redacted_event(other) is other


def test_a_snapshot_keeps_the_configuration_and_an_old_one_has_none() -> None:
    state = new_state()
    state.replicate_configuration.CopyFrom(config(cluster("a", credentials=secret()), B))
    assert restore_state(snapshot_state(state)).replicate_configuration == (
        state.replicate_configuration
    )
    # A state saved before the field existed decodes with an empty configuration:
    # no replication, which is what that cluster had.
    old = new_state()
    assert not restore_state(snapshot_state(old)).HasField("replicate_configuration")


def test_replicate_file(tmp_path: Path) -> None:
    (tmp_path / "west.token").write_text(TOKEN + "\n")
    (tmp_path / "west-ca.pem").write_text(CA)
    (tmp_path / "r.toml").write_text(
        """
[[clusters]]
id = "east"
endpoints = ["127.0.0.1:7201"]
pchannels = ["p1", "p2"]

[[clusters]]
id = "west"
endpoints = ["127.0.0.1:8201", "127.0.0.1:8202"]
pchannels = ["q1", "q2"]
token_file = "west.token"
ca_file = "west-ca.pem"

[[topology]]
source = "east"
target = "west"
"""
    )
    configuration = load_replicate_file(tmp_path / "r.toml")
    assert [c.cluster_id for c in configuration.clusters] == ["east", "west"]
    assert list(configuration.clusters[1].endpoints) == ["127.0.0.1:8201", "127.0.0.1:8202"]
    assert configuration.clusters[1].credentials.token == TOKEN
    assert configuration.clusters[1].credentials.ca_certificate_pem == CA.strip()
    assert (
        configuration.topology[0].source_cluster_id,
        configuration.topology[0].target_cluster_id,
    ) == (
        "east",
        "west",
    )
    assert check_configuration(configuration, "east", DEFAULT_LIMITS) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[clusters]]\nid = 1\n", "invalid clusters[0].id (1; expected a string)"),
        ('[[clusters]]\nid = "a"\nendpoints = "h:1"\n', "invalid clusters[0].endpoints"),
        ('[[clusters]]\nid = "a"\ntoken = "x"\n', "unknown keys ['token'] in clusters[0]"),
        ('[[topology]]\nsource = "a"\n', "invalid topology[0] (['source']"),
        ("clusterz = 1\n", "unknown top-level keys ['clusterz']"),
        ("[[clusters]\n", "invalid TOML"),
        (
            '[[clusters]]\nid = "a"\nendpoints = []\npchannels = []\ntoken_file = "nope"\n',
            "cannot read clusters[0].token_file",
        ),
    ],
)
def test_replicate_file_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(ReplicateFileError) as raised:
        load_replicate_file(path)
    assert expected in str(raised.value)


def test_status_warns_about_a_lagging_target() -> None:
    from types import SimpleNamespace

    from raftwal.node.process import Node
    from rpc.protos import coordinator_pb2 as api

    response = api.ClusterStatusResponse(
        members=[
            api.MemberStatus(
                node_id="n1",
                owners=[
                    api.OwnerStatus(pchannel="p1", state="serving", committed_lsn=500),
                    api.OwnerStatus(pchannel="p2", state="serving", committed_lsn=500),
                ],
            )
        ]
    )
    node = SimpleNamespace(config=SimpleNamespace(replicate_lag_warn_entries=100))
    warnings = Node._replication_warnings(
        node, response, [("p1", "west", 350, 0), ("p2", "west", 450, 0)]
    )  # type: ignore[arg-type]
    assert warnings == [
        "replication of pchannel p1 to cluster west is lagging: 150 entries behind committed "
        "lsn 500 (target checkpoint 350; warning above 100; see `raftwal replicate status`)"
    ]
    # A target whose checkpoint is above what the source committed (its replicator
    # refused it) is named, whatever its lag.
    warnings = Node._replication_warnings(node, response, [("p2", "west", 450, 1_000_201)])  # type: ignore[arg-type]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "replication of pchannel p2 to cluster west is stopped: the target claims to hold "
        "source LSN 1000201, above what this pchannel committed"
    )


def test_a_get_answer_sent_back_keeps_the_stored_tokens() -> None:
    stored = config(cluster("a", credentials=secret(pem=CA)), B, edges=("a>b",))
    answer = redacted(stored)
    assert with_kept_tokens(answer, stored) == stored
    # Edited (the edge reversed) and sent back: the token stays, the edit applies.
    edited = redacted(stored)
    edited.topology[0].source_cluster_id, edited.topology[0].target_cluster_id = "b", "a"
    resolved = with_kept_tokens(edited, stored)
    assert not isinstance(resolved, Rejection)
    assert resolved.clusters[0].credentials.token == TOKEN
    assert resolved.clusters[0] == stored.clusters[0]
    assert [(e.source_cluster_id, e.target_cluster_id) for e in resolved.topology] == [("b", "a")]
    # A configuration that gives its tokens is taken as it is.
    given = config(cluster("a", credentials=secret("other-token")), B)
    assert with_kept_tokens(given, stored) is given


def test_token_set_for_a_cluster_without_a_stored_token_is_refused() -> None:
    stored = config(cluster("a", credentials=secret()), B)
    for current in (stored, pb.ReplicateConfiguration()):
        asked = config(A, cluster("b", credentials=pb.ReplicateCredentials(token_set=True)))
        rejection = with_kept_tokens(asked, current)
        assert isinstance(rejection, Rejection)
        assert rejection.code == errors_pb2.INVALID_ARGUMENT
        assert "clusters[1] ('b') credentials.token_set is set without a token" in rejection.message
        assert "expected" in rejection.message
        assert TOKEN not in rejection.message
