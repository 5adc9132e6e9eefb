"""Batches replicated from another cluster (docs/replication.md): the producer id and the
entry properties that carry a source position, and the validation of a ProduceRequest
that claims to be such a batch.

A replicated batch is an idempotent, contiguous producer's batch: producer_id
``rw.replicate/<source cluster>/<source pchannel>``, sequence = the source LSN of its last
message, previous_sequence = the source LSN the target held before it. The owner records
(producer, sequence) with the batch's last entry, so the target's checkpoint is written
atomically with the append. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence

from raftwal.services.callers import token_digest
from raftwal.services.common import fail
from rpc.protos import coordination_pb2 as pb
from rpc.protos import errors_pb2
from rpc.protos import streaming_pb2 as wire
from statemachine.replicate import local_cluster, replication_sources
from statemachine.types import DEFAULT_LIMITS as LIMITS
from statemachine.validation import check_name
from wal_segments.format import EntryFlags, MsgType
from wal_segments.owner import TXN_COUNT_PROPERTY, Message

E = errors_pb2

#: Properties under this prefix are the WAL's own bookkeeping (producers, transactions,
#: source positions): never copied from a source entry to a target one.
RESERVED_PREFIX = "rw."
PRODUCER_PREFIX = "rw.replicate/"
SOURCE_CLUSTER_PROPERTY = "rw.src.cluster"
SOURCE_PCHANNEL_PROPERTY = "rw.src.pchannel"
SOURCE_LSN_PROPERTY = "rw.src.lsn"
SOURCE_TICK_PROPERTY = "rw.src.tick"
#: A replicated batch carries a committed transaction's markers as messages of these types
#: (the names of MsgType.TXN_BEGIN and TXN_COMMIT); the target writes them as its own.
TXN_BEGIN_TYPE = "txn_begin"
TXN_COMMIT_TYPE = "txn_commit"
TXN_MARKER_TYPES = frozenset({TXN_BEGIN_TYPE, TXN_COMMIT_TYPE})


def producer_id(source_cluster_id: str, source_pchannel: str) -> str:
    return f"{PRODUCER_PREFIX}{source_cluster_id}/{source_pchannel}"


def check_source_names(cluster_id: str, pchannel: str) -> None:
    """Raise INVALID_ARGUMENT unless both are names."""
    for field, value in (("source cluster_id", cluster_id), ("source pchannel", pchannel)):
        bad = check_name(field, value, LIMITS)
        if bad is not None:
            raise fail(E.INVALID_ARGUMENT, bad.message)


def check_replicated_batch(request: wire.ProduceRequest, count: int) -> None:
    """Raise INVALID_ARGUMENT unless `request` (of `count` messages) is a well-formed
    replicated batch, or a plain one that does not use the replicated producer ids."""
    if not request.HasField("replicate_source"):
        if request.producer_id.startswith(PRODUCER_PREFIX):
            raise fail(
                E.INVALID_ARGUMENT,
                f"producer_id {request.producer_id[:64]!r} is reserved for replicated "
                "batches (got no replicate_source; expected one, or another producer_id)",
            )
        return
    source = request.replicate_source
    check_source_names(source.cluster_id, source.pchannel)
    expected_id = producer_id(source.cluster_id, source.pchannel)
    if request.producer_id != expected_id:
        raise fail(
            E.INVALID_ARGUMENT,
            f"invalid producer_id of a replicated batch ({request.producer_id[:64]!r}; "
            f"expected {expected_id!r})",
        )
    if len(request.payloads) or len(source.lsns) != count or len(source.time_ticks) != count:
        raise fail(
            E.INVALID_ARGUMENT,
            f"invalid replicate_source ({len(source.lsns)} lsns and {len(source.time_ticks)} "
            f"time ticks for {count} messages; expected one of each per message, in "
            "`messages`)",
        )
    lsns: Sequence[int] = source.lsns
    if not request.HasField("previous_sequence") or request.previous_sequence < 0:
        raise fail(
            E.INVALID_ARGUMENT,
            "a replicated batch without previous_sequence (expected the last source LSN "
            "the target holds, 0 for none)",
        )
    previous = request.previous_sequence
    for lsn in lsns:
        if lsn <= previous:
            raise fail(
                E.INVALID_ARGUMENT,
                f"invalid replicate_source lsns (got {lsn} after {previous}; expected "
                "strictly increasing source LSNs after previous_sequence)",
            )
        previous = lsn
    if request.sequence != lsns[-1]:
        raise fail(
            E.INVALID_ARGUMENT,
            f"invalid sequence of a replicated batch ({request.sequence}; expected "
            f"{lsns[-1]}, the source LSN of its last message)",
        )


def _sha256_hex(token: str) -> str:
    # Not cached: no second copy of a token is kept anywhere.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest() if token else ""


def replicator_digest(configuration: pb.ReplicateConfiguration, cluster_id: str) -> str:
    """The SHA-256 (hex) of the token the replication configuration stores for this
    cluster, `cluster_id`: what its one source cluster's replicator presents here ("" when
    the configuration stores none)."""
    local = local_cluster(configuration, cluster_id) if cluster_id else None
    return _sha256_hex(local.credentials.token) if local is not None else ""


def check_replicator(
    configuration: pb.ReplicateConfiguration,
    cluster_id: str,
    pchannel: str,
    claimed_cluster_id: str,
    identity: str,
) -> None:
    """Raise unless a replicated batch for `pchannel` of this cluster (`cluster_id`), that
    claims to come from `claimed_cluster_id`, comes from the replicator of the pchannel's
    configured source, by who the caller is (`identity`, ``callers.caller_identity``):

    - IGNORED_OPERATION when `pchannel` is no replication target;
    - PERMISSION_DENIED unless the caller presents the token the configuration stores for
      this cluster, the credential only the source's replicator is given (a producer
      token, the role that may call Produce, must not be able to write here, let alone
      move the checkpoint);
    - IGNORED_OPERATION when the claimed cluster is not that source.

    The source cluster is thus the one the caller's credential is bound to; what the
    request claims only has to agree with it."""
    source, _ = replication_sources(configuration, cluster_id).get(pchannel, ("", ""))
    if not source:
        raise fail(
            E.IGNORED_OPERATION,
            f"a replicated batch from cluster {claimed_cluster_id} for pchannel {pchannel} "
            "(got one; expected batches from no cluster: it is not a replication target)",
        )
    expected = replicator_digest(configuration, cluster_id)
    presented = token_digest(identity)
    if not hmac.compare_digest(presented, expected):
        got = "another token" if presented else "no token"
        wanted = (
            "the token the replication configuration stores for cluster "
            f"{cluster_id}, which only cluster {source}'s replicator presents"
            if expected
            else f"no token: the replication configuration stores none for cluster {cluster_id}"
        )
        raise fail(
            E.PERMISSION_DENIED,
            f"a replicated batch for pchannel {pchannel} from a caller that is not the "
            f"replicator of cluster {source} (got {got}; expected {wanted})",
        )
    if claimed_cluster_id != source:
        raise fail(
            E.IGNORED_OPERATION,
            f"a replicated batch from cluster {claimed_cluster_id} for pchannel {pchannel} "
            f"(got one; expected batches from {source})",
        )


def with_source_positions(messages: list[Message], source: wire.ReplicateSource) -> list[Message]:
    """`messages` with their source position added to their properties."""
    out = []
    for message, lsn, tick in zip(messages, source.lsns, source.time_ticks, strict=True):
        properties = {
            **message.properties,
            SOURCE_CLUSTER_PROPERTY: source.cluster_id,
            SOURCE_PCHANNEL_PROPERTY: source.pchannel,
            SOURCE_LSN_PROPERTY: str(lsn),
            SOURCE_TICK_PROPERTY: str(tick),
        }
        out.append(message._replace(properties=properties))
    return out


def with_transactions(
    messages: list[Message], msg_types: Sequence[str], new_txn_id: Callable[[], int]
) -> list[Message]:
    """`messages` of a replicated batch (their wire `msg_types` given apart) with each
    transaction the source committed written as one here: its begin and commit markers
    and, between them, its body flagged as such, under a transaction id of this node's.
    Raises INVALID_ARGUMENT for markers that do not frame whole transactions."""
    if not TXN_MARKER_TYPES.intersection(msg_types):
        return messages
    out: list[Message] = []
    txn_id, begin = 0, 0
    for message, msg_type in zip(messages, msg_types, strict=True):
        if msg_type == TXN_BEGIN_TYPE:
            if txn_id:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"a replicated transaction begins inside another (got {TXN_BEGIN_TYPE} "
                    f"at message {len(out)}; expected {TXN_COMMIT_TYPE} first)",
                )
            txn_id, begin = new_txn_id(), len(out)
            out.append(
                message._replace(
                    msg_type=int(MsgType.TXN_BEGIN),
                    flags=int(EntryFlags.TXN_BEGIN),
                    txn_id=txn_id,
                    properties={},
                )
            )
        elif msg_type == TXN_COMMIT_TYPE:
            if not txn_id:
                raise fail(
                    E.INVALID_ARGUMENT,
                    f"a replicated transaction commits without a begin (got {TXN_COMMIT_TYPE} "
                    f"at message {len(out)}; expected {TXN_BEGIN_TYPE} before it)",
                )
            out.append(
                message._replace(
                    msg_type=int(MsgType.TXN_COMMIT),
                    flags=int(EntryFlags.TXN_COMMIT),
                    txn_id=txn_id,
                    # As CommitTxn writes it: a later owner answers from its log.
                    properties={TXN_COUNT_PROPERTY: str(len(out) - begin + 1)},
                )
            )
            txn_id = 0
        elif txn_id:
            out.append(message._replace(flags=int(EntryFlags.TXN_BODY), txn_id=txn_id))
        else:
            out.append(message)
    if txn_id:
        raise fail(
            E.INVALID_ARGUMENT,
            f"a replicated transaction without its commit (got {TXN_BEGIN_TYPE} and no "
            f"{TXN_COMMIT_TYPE}; expected whole transactions in one batch)",
        )
    return out
