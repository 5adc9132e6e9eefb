"""Cross-cluster replication configuration: the pure validation of a whole configuration.

``check_configuration`` says whether a ``ReplicateConfiguration`` may replace the current
one: well-formed cluster ids, endpoints and pchannel names, one source per target, no
cycle, the same number of pchannels in every cluster (matched by position), and the
proposing cluster among the clusters. ``redacted`` is the copy that answers carry: tokens
emptied, ``token_set`` marking where one is stored; ``with_kept_tokens`` lets such an
answer be applied again (the stored tokens are kept). No message here ever contains a
token (a rejected token is described by its length only).

Pure: no clock, randomness, I/O or iteration over protobuf maps.
"""

from __future__ import annotations

from collections.abc import Callable

from rpc.protos import coordination_pb2 as pb
from statemachine.types import Limits, Rejection
from statemachine.validation import (
    check_address,
    check_name,
    check_unique,
    first_error,
    invalid,
    show,
)

PEM_CERTIFICATE_HEADER = "-----BEGIN CERTIFICATE-----"


def is_empty(configuration: pb.ReplicateConfiguration) -> bool:
    return (
        not configuration.clusters
        and not configuration.topology
        and not configuration.HasField("switchover")
    )


def _check_credentials(
    where: str, credentials: pb.ReplicateCredentials, limits: Limits
) -> Rejection | None:
    token = credentials.token
    if len(token) > limits.replicate_token_max_chars:
        return invalid(
            f"{where} credentials.token too long ({len(token)} chars; expected "
            f"0..{limits.replicate_token_max_chars})"
        )
    if token and (not token.isprintable() or any(c.isspace() for c in token)):
        # Described, never shown: the value is a secret.
        return invalid(
            f"invalid {where} credentials.token (a value of {len(token)} chars with spaces "
            "or unprintable characters; expected a bearer token of printable characters)"
        )
    pem = credentials.ca_certificate_pem
    if len(pem) > limits.replicate_ca_max_chars:
        return invalid(
            f"{where} credentials.ca_certificate_pem too long ({len(pem)} chars; expected "
            f"0..{limits.replicate_ca_max_chars})"
        )
    if pem and PEM_CERTIFICATE_HEADER not in pem:
        return invalid(
            f"invalid {where} credentials.ca_certificate_pem ({show(pem)}; expected PEM "
            f"certificates, {PEM_CERTIFICATE_HEADER!r} ...)"
        )
    return None


def _check_list(
    field: str,
    where: str,
    values: list[str],
    most: int,
    check: Callable[[str, str, Limits], Rejection | None],
    limits: Limits,
) -> Rejection | None:
    """1..`most` values, each passing `check`, none twice."""
    if not 1 <= len(values) <= most:
        return invalid(f"invalid number of {field}s of {where} ({len(values)}; expected 1..{most})")
    for value in values:
        bad = check(f"{field} of {where}", value, limits)
        if bad:
            return bad
    return check_unique(f"{field} of {where}", values)


def _check_cluster(index: int, cluster: pb.ReplicateCluster, limits: Limits) -> Rejection | None:
    where = f"cluster {cluster.cluster_id!r}"
    return first_error(
        check_name(f"clusters[{index}].cluster_id", cluster.cluster_id, limits),
        _check_list(
            "endpoint",
            where,
            list(cluster.endpoints),
            limits.max_replicate_endpoints,
            check_address,
            limits,
        ),
        _check_list(
            "pchannel",
            where,
            list(cluster.pchannels),
            limits.max_pchannels_per_request,
            check_name,
            limits,
        ),
        _check_credentials(where, cluster.credentials, limits),
    )


def _check_topology(
    configuration: pb.ReplicateConfiguration, ids: list[str], limits: Limits
) -> Rejection | None:
    known = set(ids)
    source_of: dict[str, str] = {}
    for index, edge in enumerate(configuration.topology):
        source, target = edge.source_cluster_id, edge.target_cluster_id
        for field, value in (("source_cluster_id", source), ("target_cluster_id", target)):
            if value not in known:
                return invalid(
                    f"unknown topology[{index}].{field} ({show(value)}; expected one of the "
                    f"clusters: {', '.join(ids)})"
                )
        if source == target:
            return invalid(
                f"invalid topology[{index}] ({source} -> {target}; expected a source and a "
                "target that are different clusters)"
            )
        if target in source_of:
            return invalid(
                f"cluster {target!r} has two sources (got {source_of[target]} -> {target} and "
                f"{source} -> {target}; expected one source per target)"
            )
        source_of[target] = source
    # One source per target: from any cluster, following sources either ends or loops.
    for start in ids:
        path = [start]
        current = start
        while current in source_of:
            current = source_of[current]
            if current == start:
                cycle = " -> ".join(reversed([*path, start]))
                return invalid(
                    f"the topology has a cycle ({cycle}; expected no cluster to replicate, "
                    "directly or not, from itself)"
                )
            if current in path:
                break  # a cycle that does not pass through `start`: found from its members
            path.append(current)
    return None


def _check_start_after(configuration: pb.ReplicateConfiguration) -> Rejection | None:
    """An edge's start_after_lsns: none, or one LSN >= 0 per pchannel."""
    count = len(configuration.clusters[0].pchannels)
    for index, edge in enumerate(configuration.topology):
        lsns = list(edge.start_after_lsns)
        if lsns and len(lsns) != count:
            return invalid(
                f"invalid topology[{index}].start_after_lsns ({len(lsns)} LSNs; expected "
                f"none or {count}, one per pchannel)"
            )
        for lsn in lsns:
            if lsn < 0:
                return invalid(
                    f"invalid topology[{index}].start_after_lsns ({lsn}; expected LSNs >= 0)"
                )
    return None


def _check_switchover(configuration: pb.ReplicateConfiguration) -> Rejection | None:
    """A switchover names an edge of the topology whose source has no other edge: the
    swap reverses that edge only, so the source may neither feed another target nor be a
    target itself."""
    if not configuration.HasField("switchover"):
        return None
    switchover = configuration.switchover
    source, target = switchover.source_cluster_id, switchover.target_cluster_id
    edges = [(e.source_cluster_id, e.target_cluster_id) for e in configuration.topology]
    if (source, target) not in edges:
        listed = ", ".join(f"{s} -> {t}" for s, t in edges) or "none"
        return invalid(
            f"invalid switchover ({show(source)} -> {show(target)}; expected an edge of the "
            f"topology: {listed})"
        )
    others = [f"{s} -> {t}" for s, t in edges if source in (s, t) and (s, t) != (source, target)]
    if others:
        return invalid(
            f"invalid switchover {source} -> {target} (got other edges of {source}: "
            f"{', '.join(others)}; expected {source} -> {target} to be its only edge)"
        )
    return None


def check_configuration(
    configuration: pb.ReplicateConfiguration, local_cluster_id: str, limits: Limits
) -> Rejection | None:
    """None when `configuration` may replace the current one on the cluster whose id is
    `local_cluster_id`; else an INVALID_ARGUMENT Rejection saying what was got and what was
    expected. An empty configuration (no clusters, no edges, no switchover) is always
    valid: it clears."""
    if is_empty(configuration):
        return None
    count = len(configuration.clusters)
    if count > limits.max_replicate_clusters:
        return invalid(
            f"invalid number of clusters ({count}; expected 1..{limits.max_replicate_clusters})"
        )
    if not configuration.clusters:
        return invalid(
            f"a topology without clusters (got {len(configuration.topology)} edges and 0 "
            "clusters; expected the clusters the edges name, or nothing to clear the "
            "configuration)"
        )
    for index, cluster in enumerate(configuration.clusters):
        bad = _check_cluster(index, cluster, limits)
        if bad:
            return bad
    ids = [cluster.cluster_id for cluster in configuration.clusters]
    bad = check_unique("cluster_id", ids)
    if bad:
        return bad
    first = configuration.clusters[0]
    for cluster in configuration.clusters[1:]:
        if len(cluster.pchannels) != len(first.pchannels):
            return invalid(
                f"cluster {cluster.cluster_id!r} has {len(cluster.pchannels)} pchannels (got "
                f"{len(cluster.pchannels)}; expected {len(first.pchannels)} as cluster "
                f"{first.cluster_id!r}: pchannels are matched by position)"
            )
    if len(configuration.topology) > limits.max_replicate_clusters:
        return invalid(
            f"invalid number of topology edges ({len(configuration.topology)}; expected "
            f"0..{limits.max_replicate_clusters})"
        )
    bad = _check_topology(configuration, ids, limits) or _check_start_after(configuration)
    if bad:
        return bad
    bad = _check_switchover(configuration)
    if bad:
        return bad
    if not local_cluster_id:
        return invalid(
            "this cluster has no cluster_id (got ''; expected [cluster] cluster_id in the "
            "nodes' config, or RAFTWAL_CLUSTER_ID, naming one of the clusters)"
        )
    if local_cluster_id not in ids:
        return invalid(
            f"this cluster ({local_cluster_id!r}) is not in the configuration (got clusters "
            f"{', '.join(ids)}; expected it among them)"
        )
    return None


def with_kept_tokens(
    configuration: pb.ReplicateConfiguration, current: pb.ReplicateConfiguration
) -> pb.ReplicateConfiguration | Rejection:
    """`configuration` with every cluster marked `token_set` without a token given the
    token `current` stores for that cluster id: a GetReplicateConfiguration answer (tokens
    hidden) edited and applied again keeps the stored tokens, as the switchover and
    promote commands do. A Rejection when no token is stored for such a cluster."""
    if not any(c.credentials.token_set and not c.credentials.token for c in configuration.clusters):
        return configuration
    stored = {c.cluster_id: c.credentials.token for c in current.clusters if c.credentials.token}
    resolved = pb.ReplicateConfiguration()
    resolved.CopyFrom(configuration)
    for index, cluster in enumerate(resolved.clusters):
        credentials = cluster.credentials
        if not credentials.token_set or credentials.token:
            continue
        token = stored.get(cluster.cluster_id)
        if token is None:
            return invalid(
                f"clusters[{index}] ({show(cluster.cluster_id)}) credentials.token_set is set "
                "without a token, and no token is stored for that cluster (got token_set "
                "true; expected a token, or token_set only for a cluster whose token the "
                "current configuration stores: it is then kept)"
            )
        # Stored as any given token is: the token, token_set false (redacted sets it).
        credentials.token = token
        credentials.token_set = False
    return resolved


def local_cluster(
    configuration: pb.ReplicateConfiguration, cluster_id: str
) -> pb.ReplicateCluster | None:
    for cluster in configuration.clusters:
        if cluster.cluster_id == cluster_id:
            return cluster
    return None


def redacted(configuration: pb.ReplicateConfiguration) -> pb.ReplicateConfiguration:
    """A copy of `configuration` fit for an answer: every token emptied, `token_set` true
    where one is stored. The CA certificates are public and stay."""
    copy = pb.ReplicateConfiguration()
    copy.CopyFrom(configuration)
    for cluster in copy.clusters:
        if cluster.credentials.token:
            cluster.credentials.token = ""
            cluster.credentials.token_set = True
    return copy


def _has_token(configuration: pb.ReplicateConfiguration) -> bool:
    return any(cluster.credentials.token for cluster in configuration.clusters)


def redacted_event(event: pb.Event) -> pb.Event:
    """`event` as history answers (WatchEvents) carry it: a replication configuration's
    tokens emptied, in the event that set it and in the saved state a restore carries
    (whose `state_digest` then describes the stored bytes, not the answered ones). Any
    other event is returned as it is, never changed in place."""
    kind = event.WhichOneof("body")
    if kind == "replicate_configuration_updated":
        configuration = event.replicate_configuration_updated.configuration
        if not _has_token(configuration):
            return event
        copy = pb.Event()
        copy.CopyFrom(event)
        copy.replicate_configuration_updated.configuration.CopyFrom(redacted(configuration))
        return copy
    if kind == "state_restored":
        saved = pb.CoordinationState.FromString(event.state_restored.state)
        if not _has_token(saved.replicate_configuration):
            return event
        saved.replicate_configuration.CopyFrom(redacted(saved.replicate_configuration))
        copy = pb.Event()
        copy.CopyFrom(event)
        copy.state_restored.state = saved.SerializeToString(deterministic=True)
        return copy
    return event


def replicated_pairs(
    configuration: pb.ReplicateConfiguration, cluster_id: str
) -> list[tuple[str, str]]:
    """(local pchannel, target cluster id) for every pchannel this cluster replicates, in
    configuration order."""
    local = local_cluster(configuration, cluster_id) if cluster_id else None
    if local is None:
        return []
    targets = [
        e.target_cluster_id for e in configuration.topology if e.source_cluster_id == cluster_id
    ]
    return [(pchannel, target) for target in targets for pchannel in local.pchannels]


def replication_hold(state: pb.CoordinationState, pchannel: str) -> int:
    """The lowest LSN of `pchannel` some target of this cluster has not applied (1 while a
    target has reported nothing), or a value above every LSN when none replicates it.
    A target dropped from the configuration holds nothing."""
    hold = 1 << 62
    checkpoints = state.replicate_checkpoints.get(pchannel)
    configuration, cluster_id = state.replicate_configuration, state.replicate_cluster_id
    for local, target in replicated_pairs(configuration, cluster_id):
        if local != pchannel:
            continue
        applied = checkpoints.source_lsns.get(target, 0) if checkpoints is not None else 0
        start = start_after(configuration, cluster_id, target, pchannel)
        hold = min(hold, max(applied, start) + 1)
    return hold


def start_after(
    configuration: pb.ReplicateConfiguration, source_id: str, target_id: str, pchannel: str
) -> int:
    """The LSN of `pchannel` (of `source_id`) after which replication to `target_id`
    starts: the edge's start_after_lsns entry (set by a switchover), else 0."""
    source = local_cluster(configuration, source_id)
    if source is None or pchannel not in source.pchannels:
        return 0
    index = list(source.pchannels).index(pchannel)
    for edge in configuration.topology:
        if (edge.source_cluster_id, edge.target_cluster_id) == (source_id, target_id):
            return edge.start_after_lsns[index] if index < len(edge.start_after_lsns) else 0
    return 0


def switching_to(configuration: pb.ReplicateConfiguration, cluster_id: str) -> str:
    """The cluster `cluster_id` is switching over to (its writes are paused), or ""."""
    switchover = configuration.switchover
    if configuration.HasField("switchover") and switchover.source_cluster_id == cluster_id:
        return switchover.target_cluster_id
    return ""


def write_refusal(
    configuration: pb.ReplicateConfiguration, cluster_id: str, pchannel: str, what: str
) -> str:
    """Why a client's write (`what`: "a Produce", ...) to `pchannel` of this cluster is
    refused, or "" when it is taken: the pchannel is a replication target, or this
    cluster is the source of a switchover in progress."""
    source, _ = replication_sources(configuration, cluster_id).get(pchannel, ("", ""))
    if source:
        return (
            f"pchannel {pchannel} is a replication target of cluster {source} (got {what}; "
            f"expected it on cluster {source}, whose replicator copies it here, or this "
            "cluster taken out of the replication topology first)"
        )
    target = switching_to(configuration, cluster_id)
    local = local_cluster(configuration, cluster_id) if target else None
    if local is not None and pchannel in local.pchannels:
        return (
            f"cluster {cluster_id} is switching over to cluster {target}: writes are paused "
            f"until {target} holds every entry (got {what} for pchannel {pchannel}; "
            f"expected it on cluster {target} once the switchover ends, or the switchover "
            "undone with `raftwal replicate set`)"
        )
    return ""


def mismatch_warning(pchannel: str, target_cluster_id: str, claimed_lsn: object) -> str:
    """What status says of a target whose checkpoint does not match the source
    (ReplicateCheckpoints.mismatched_lsns)."""
    return (
        f"replication of pchannel {pchannel} to cluster {target_cluster_id} is stopped: the "
        f"target claims to hold source LSN {claimed_lsn}, above what this pchannel committed "
        "(its checkpoint does not match this cluster: a batch this cluster never sent, or "
        "this cluster restored from an older copy); see docs/replication.md, "
        '"A checkpoint that does not match"'
    )


def replication_sources(
    configuration: pb.ReplicateConfiguration, cluster_id: str
) -> dict[str, tuple[str, str]]:
    """pchannel of this cluster -> (the cluster it is a replication target of, the source
    pchannel matched to it by position)."""
    local = local_cluster(configuration, cluster_id) if cluster_id else None
    if local is None:
        return {}
    for edge in configuration.topology:
        source = local_cluster(configuration, edge.source_cluster_id)
        if edge.target_cluster_id == cluster_id and source is not None:
            return {
                pchannel: (source.cluster_id, source.pchannels[index])
                for index, pchannel in enumerate(local.pchannels)
                if index < len(source.pchannels)
            }
    return {}
