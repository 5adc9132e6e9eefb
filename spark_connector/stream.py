"""Structured Streaming for the `raftwal` source: `spark.readStream.format("raftwal")`.

What lives here: `RaftwalStreamReader` (PySpark's `DataSourceStreamReader`, pyspark >= 4.0)
and `TailPartition`, the part of a micro-batch above the committed manifest.

Offsets are JSON objects {pchannel: LSN}: everything at or below the LSN has been read. The
latest offset of a pchannel is its owner's committed LSN, so a micro-batch never reads an
entry that could still be lost. A micro-batch (start, end] is planned on the driver into
  - one `SlicePartition` per committed segment it overlaps, read through `ReadSegment`
    from any replica (`fetch.read_slice`, as a batch read), and
  - one `TailPartition` per pchannel for the LSNs above the manifest, read from the owner
    with `Consume` (START_FROM, control entries included so that every LSN is seen) and
    stopped at the end offset; the owner only ever sends committed entries.

Exactly once: the entries of a range (start, end] are fixed once `end` is committed (they
are majority-durable and a new owner keeps them), so a batch Spark replays after a crash or
restart from its checkpoint gets the same rows, and an idempotent sink stores each once. A
transaction belongs to the batch holding its begin entry; that batch reads past its end
offset until the commit entry (as a split batch partition does), and the next batch skips
the rest of it.

What must never happen here: a silent gap. A start offset below what retention kept fails
with one sentence naming the first available LSN (COMPACTED); an owner that goes away
mid-read is followed to the next owner within `timeoutSeconds`, else the batch fails.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from rpc.errors import from_rpc_error
from rpc.placement import address_for
from rpc.protos import coordination_pb2 as pb
from rpc.protos import coordinator_pb2 as api
from rpc.protos import errors_pb2, streaming_pb2_grpc
from rpc.protos import streaming_pb2 as wire
from spark_connector.fetch import SPARK_SCHEMA, RowFilter, read_slice
from spark_connector.options import HIDDEN_MSG_TYPES, ReadOptions
from spark_connector.plan import (
    ConnectorError,
    SegmentSlice,
    Snapshot,
    _on_any,
    _read_pchannels,
    _retryable,
    channel,
    describe,
    plan,
    snapshot,
)
from wal_segments.format import CONTROL_FLAGS, MSG_TYPE_CODES, TXN_FLAGS, EntryFlags

log = logging.getLogger(__name__)
E = errors_pb2

#: Entries per Consume response for a tail read (the server's maximum is 10,000).
TAIL_BATCH_ENTRIES = 5_000
#: Rows per RecordBatch a tail read yields.
TAIL_ROWS_PER_BATCH = 8_192
#: Per-call deadline of the small driver calls that find the latest offsets (a pchannel
#: whose owner does not answer in time keeps its previous offset this trigger).
LATEST_CALL_TIMEOUT_S = 2.0
#: Pause before a tail read retries at the (next) owner.
RETRY_PAUSE_S = 0.2
#: Spark asks for the latest offset again ~10 ms after an empty trigger: at most one round
#: of calls per this interval, so an idle query does not spin on the cluster.
MIN_POLL_INTERVAL_S = 0.1
#: How long the driver reuses the list of covered pchannels and their owners (a failed
#: call refreshes the owners at once).
REFRESH_S = 5.0

STARTING_EARLIEST = "earliest"
STARTING_LATEST = "latest"
#: Batch-only options: a stream follows the log, so these have no meaning in it.
BATCH_ONLY_OPTIONS = ("asOfRevision", "fromLsn", "toLsn")


@dataclass(frozen=True)
class StreamOptions:
    read: ReadOptions
    #: "earliest", "latest", or {pchannel: LSN already read}
    starting: str | Mapping[str, int]


def parse_starting_offsets(value: str | None) -> str | dict[str, int]:
    """`startingOffsets`: earliest (the default), latest, or a JSON object
    {"pchannel": lsn} meaning "everything through lsn was read"."""
    if value is None or value.strip().lower() == STARTING_EARLIEST:
        return STARTING_EARLIEST
    if value.strip().lower() == STARTING_LATEST:
        return STARTING_LATEST
    expected = 'earliest, latest or a JSON object {"pchannel": lsn, ...} with lsn >= 0'
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ValueError(
            f"raftwal option startingOffsets: got {value!r}, expected {expected}"
        ) from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in parsed.items()
    ):
        raise ValueError(f"raftwal option startingOffsets: got {value!r}, expected {expected}")
    return dict(parsed)


def stream_options(options: Mapping[str, str], read: ReadOptions) -> StreamOptions:
    """The stream's options: `read` (parsed as for a batch read) plus startingOffsets;
    batch-only options are refused in one sentence."""
    lowered = {key.lower(): value for key, value in options.items()}
    for name in BATCH_ONLY_OPTIONS:
        if name.lower() in lowered:
            raise ValueError(
                f"raftwal option {name}: not supported by readStream (a stream follows the "
                "log); use startingOffsets to choose where it starts"
            )
    return StreamOptions(read=read, starting=parse_starting_offsets(lowered.get("startingoffsets")))


class SlicePartition(InputPartition):
    """One task: the part of a committed segment inside the micro-batch, read as a batch
    read reads it (`fetch.read_slice`)."""

    def __init__(self, part: SegmentSlice, row_filter: RowFilter, names: dict[int, str]) -> None:
        super().__init__(part.label)
        self.part = part
        self.row_filter = row_filter
        self.names = names


class TailPartition(InputPartition):
    """One task: LSNs [from_lsn, to_lsn] of a pchannel above its committed manifest, read
    from the owner."""

    def __init__(
        self,
        pchannel: str,
        from_lsn: int,
        to_lsn: int,
        row_filter: RowFilter,
        vchannel_names: frozenset[str] | None,
    ) -> None:
        self.label = f"pchannel {pchannel} lsn {from_lsn}..{to_lsn} (tail)"
        super().__init__(self.label)
        self.pchannel = pchannel
        self.from_lsn = from_lsn
        self.to_lsn = to_lsn
        self.row_filter = row_filter
        #: the read's vchannels by name (None: all)
        self.vchannel_names = vchannel_names


# -- the driver: offsets and planning --------------------------------------------------------


def _owners(options: ReadOptions, pchannels: Sequence[str]) -> dict[str, str]:
    """pchannel -> its owner's gRPC address, for the ASSIGNED ones."""
    status = _on_any(
        options,
        lambda stub: stub.ClusterStatus(api.ClusterStatusRequest(), timeout=options.timeout_s),
    )
    nodes = {n.node_id: n for n in status.nodes}
    found: dict[str, str] = {}
    for p in status.pchannels:
        if p.name in pchannels and p.state == pb.PCHANNEL_STATE_ASSIGNED:
            owner = nodes.get(p.owner_node_id)
            # The owner's data worker for the pchannel (rpc.placement).
            address = (
                address_for(owner.address, owner.worker_addresses, p.name)
                if owner is not None and owner.address
                else ""
            )
            if address:
                found[p.name] = address
    return found


def committed_lsns(
    options: ReadOptions, pchannels: Sequence[str], owners: Mapping[str, str] | None = None
) -> dict[str, int]:
    """{pchannel: its owner's committed LSN} for the pchannels whose owner answered now
    (`owners`: known addresses, else looked up); one missing from the answer is between
    owners (a failover) or unreachable."""
    result: dict[str, int] = {}
    if owners is None:
        owners = _owners(options, pchannels)
    for pchannel in pchannels:
        address = owners.get(pchannel)
        if address is None:
            continue
        with channel(address, options) as chan:
            try:
                answer = streaming_pb2_grpc.StreamingNodeStub(chan).GetLatestTimeTick(
                    wire.GetLatestTimeTickRequest(pchannel=pchannel),
                    timeout=min(LATEST_CALL_TIMEOUT_S, options.timeout_s),
                )
            except grpc.RpcError as error:
                log.info("latest offset of %s from %s: %s", pchannel, address, describe(error))
                continue
        result[pchannel] = answer.committed_lsn
    return result


def _manifest_bounds(snap: Snapshot) -> dict[str, tuple[int, int]]:
    """pchannel -> (first retained LSN, last committed LSN) of its committed segments."""
    bounds: dict[str, tuple[int, int]] = {}
    for segment in snap.segments:
        first, last = bounds.get(segment.pchannel, (segment.first_lsn, segment.last_lsn))
        bounds[segment.pchannel] = (
            min(first, segment.first_lsn),
            max(last, segment.last_lsn),
        )
    return bounds


def compacted_message(pchannel: str, offset: int, first_lsn: int) -> str:
    return (
        f"COMPACTED: pchannel {pchannel}: the stream's offset {offset} is below what retention "
        f"kept (the first available LSN is {first_lsn}); start a new query (new checkpoint) "
        f'with startingOffsets earliest or {{"{pchannel}": {first_lsn - 1}}}'
    )


class RaftwalStreamReader(DataSourceStreamReader):
    """Micro-batches of committed entries between two offsets {pchannel: LSN}."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        # The driver-side copy of the options a snapshot needs: never seal (a stream reads
        # the open segment's committed prefix from the owner instead) and always current.
        self._read = replace(options.read, seal_open_segments=False, as_of_revision=0)
        #: the last offset this reader returned (latestOffset() without arguments, Spark 4.0)
        self._last: dict[str, int] | None = None
        #: driver-side caches (monotonic time of the lookup, value)
        self._covered: tuple[float, list[str]] | None = None
        self._owner_cache: tuple[float, dict[str, str]] | None = None
        self._polled_at = 0.0

    def _pchannels(self) -> list[str]:
        now = time.monotonic()
        if self._covered is not None and now - self._covered[0] < REFRESH_S:
            return self._covered[1]
        covered = self._list_pchannels()
        self._covered = (now, covered)
        return covered

    def _owners_now(self, pchannels: Sequence[str], refresh: bool) -> dict[str, str]:
        now = time.monotonic()
        cached = self._owner_cache
        if refresh or cached is None or now - cached[0] >= REFRESH_S:
            cached = (now, _owners(self._read, pchannels))
            self._owner_cache = cached
        return cached[1]

    def _list_pchannels(self) -> list[str]:
        read = self._read
        channels = _on_any(
            read,
            lambda stub: stub.ListChannels(
                api.ListChannelsRequest(include_dropped=True), timeout=read.timeout_s
            ),
        )
        if read.vchannels:
            missing = sorted(read.vchannels - {v.name for v in channels.vchannels})
            if missing:
                raise ConnectorError(f"unknown vchannel(s) {', '.join(missing)}")
        if read.pchannels:
            missing = sorted(read.pchannels - {p.name for p in channels.pchannels})
            if missing:
                raise ConnectorError(f"unknown pchannel(s) {', '.join(missing)}")
        return _read_pchannels(read, channels)

    def initialOffset(self) -> dict:  # noqa: N802 (Spark API)
        pchannels = self._pchannels()
        starting = self.options.starting
        if isinstance(starting, Mapping):
            unknown = sorted(set(starting) - set(pchannels))
            if unknown:
                raise ConnectorError(
                    f"startingOffsets names pchannel(s) {', '.join(unknown)} that this read "
                    f"does not cover (it covers {', '.join(pchannels) or 'none'})"
                )
            offset = {p: int(starting.get(p, 0)) for p in pchannels}
        elif starting == STARTING_LATEST:
            latest = self._latest(pchannels, wait=True)
            offset = {p: latest.get(p, 0) for p in pchannels}
        else:
            bounds = _manifest_bounds(snapshot(self._read))
            offset = {p: bounds[p][0] - 1 if p in bounds else 0 for p in pchannels}
        self._last = dict(offset)
        return offset

    def _latest(self, pchannels: Sequence[str], *, wait: bool) -> dict[str, int]:
        """Committed LSNs; with `wait`, retried until every pchannel's owner answered or
        `timeoutSeconds` passed (then ConnectorError)."""
        deadline = time.monotonic() + self._read.timeout_s
        while True:
            latest = committed_lsns(self._read, pchannels)
            missing = [p for p in pchannels if p not in latest]
            if not wait or not missing:
                return latest
            if time.monotonic() >= deadline:
                raise ConnectorError(
                    f"no owner answered for pchannel(s) {', '.join(missing)} within "
                    f"{self._read.timeout_s:g} s (startingOffsets=latest needs their "
                    "committed LSN)"
                )
            time.sleep(RETRY_PAUSE_S)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:  # noqa: N802
        # Spark 4.2+ passes the start and a ReadLimit (always ReadAllAvailable here: the
        # source declares no limit of its own); Spark 4.0/4.1 pass nothing.
        previous = dict(start if start is not None else (self._last or {}))
        pause = self._polled_at + MIN_POLL_INTERVAL_S - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        self._polled_at = time.monotonic()
        pchannels = self._pchannels()
        latest = committed_lsns(self._read, pchannels, self._owners_now(pchannels, False))
        if len(latest) < len(pchannels):
            # An owner moved or did not answer: look the owners up again now.
            latest = committed_lsns(self._read, pchannels, self._owners_now(pchannels, True))
        offset = dict(previous)
        for pchannel in pchannels:
            # A new owner may briefly report less than its predecessor committed: an
            # offset never moves back.
            offset[pchannel] = max(previous.get(pchannel, 0), latest.get(pchannel, 0))
        self._last = offset
        return offset

    def reportLatestOffset(self) -> dict | None:  # noqa: N802 (Spark API)
        return self._last

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = {
            p: (int(start.get(p, 0)), int(lsn))
            for p, lsn in end.items()
            if int(lsn) > int(start.get(p, 0))
        }
        if not ranges:
            return []
        read = replace(self._read, pchannels=frozenset(ranges))
        snap = snapshot(read)
        bounds = _manifest_bounds(snap)
        for pchannel, (low, _) in sorted(ranges.items()):
            first = bounds.get(pchannel, (1, 0))[0]
            if low + 1 < first:
                raise ConnectorError(compacted_message(pchannel, low, first))

        def lsn_bounds(pchannel: str) -> tuple[int | None, int | None]:
            low, high = ranges.get(pchannel, (0, 0))
            return low + 1, high + 1

        row_filter = RowFilter.from_options(read, snap.vchannel_ids)
        names: dict[str, dict[int, str]] = {}
        for vchannel_id, name in snap.vchannel_names.items():
            names.setdefault(snap.vchannel_pchannels[name], {})[vchannel_id] = name
        partitions: list[InputPartition] = [
            SlicePartition(part, row_filter, names.get(part.pchannel, {}))
            for part in plan(read, snap, lsn_bounds=lsn_bounds)
        ]
        for pchannel, (low, high) in sorted(ranges.items()):
            manifest_last = bounds.get(pchannel, (1, 0))[1]
            if high > manifest_last:
                partitions.append(
                    TailPartition(
                        pchannel,
                        max(low, manifest_last) + 1,
                        high,
                        row_filter,
                        frozenset(read.vchannels) if read.vchannels else None,
                    )
                )
        return partitions

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, SlicePartition):
            return read_slice(partition.part, self._read, partition.names, partition.row_filter)
        if isinstance(partition, TailPartition):
            return read_tail(partition, self._read)
        return iter(())

    def commit(self, end: dict) -> None:
        # Nothing to release: the cluster keeps no per-query state (retention is governed
        # by subscriptions, not by readers).
        return None


# -- the executor: a tail read ----------------------------------------------------------------


class _Rows:
    """Column lists of the rows a tail read keeps, turned into RecordBatches."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {f.name: [] for f in SPARK_SCHEMA}

    def __len__(self) -> int:
        return len(self.columns["lsn"])

    def add(self, entry: wire.WalEntry) -> None:
        c = self.columns
        c["pchannel"].append(entry.pchannel)
        c["vchannel"].append(entry.vchannel)
        c["segment_id"].append(entry.segment_id)
        c["lsn"].append(entry.lsn)
        c["term"].append(entry.term)
        c["time_tick"].append(entry.time_tick)
        c["msg_type"].append(entry.msg_type)
        c["key"].append(entry.key)
        c["payload"].append(entry.payload)
        c["txn_id"].append(entry.txn_id or None)
        c["broadcast_id"].append(entry.broadcast_id or None)
        c["properties"].append(list(entry.properties.items()))

    def take(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.columns, schema=SPARK_SCHEMA)
        self.columns = {f.name: [] for f in SPARK_SCHEMA}
        return batch


def _visible(entry: wire.WalEntry, part: TailPartition) -> bool:
    """The row filters of a batch read (fetch.RowFilter), on one entry."""
    row_filter = part.row_filter
    if entry.flags & CONTROL_FLAGS:
        return False
    code = MSG_TYPE_CODES.get(entry.msg_type, -1)
    if row_filter.msg_types is not None:
        if code not in row_filter.msg_types:
            return False
    elif code in HIDDEN_MSG_TYPES:
        return False
    if part.vchannel_names is not None and entry.vchannel not in part.vchannel_names:
        return False
    if row_filter.min_time_tick is not None and entry.time_tick < row_filter.min_time_tick:
        return False
    return row_filter.max_time_tick is None or entry.time_tick < row_filter.max_time_tick


def read_tail(part: TailPartition, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """The partition's committed entries from the owner, filtered, as RecordBatches.

    Follows the owner across a failover (NOT_OWNER, CHANNEL_FENCED, a broken stream):
    resumes at the next LSN at whichever node owns the pchannel, for up to
    `timeoutSeconds` without progress."""
    started = time.monotonic()
    next_lsn = part.from_lsn
    #: transactions begun in range: their entries wait for the commit entry
    pending: dict[int, list[wire.WalEntry]] = {}
    rows = _Rows()
    last_problem = ""
    progress_at = time.monotonic()

    def done() -> bool:
        return next_lsn > part.to_lsn and not pending

    while not done():
        remaining = options.timeout_s - (time.monotonic() - progress_at)
        if remaining <= 0:
            raise ConnectorError(
                f"{part.label}: no progress at lsn {next_lsn} for {options.timeout_s:g} s "
                f"({last_problem or 'no owner'})"
            )
        address = _owners(options, [part.pchannel]).get(part.pchannel)
        if address is None:
            last_problem = "the pchannel has no owner (a failover)"
            time.sleep(RETRY_PAUSE_S)
            continue
        try:
            with channel(address, options) as chan:
                stream = streaming_pb2_grpc.StreamingNodeStub(chan).Consume(
                    wire.ConsumeRequest(
                        pchannel=part.pchannel,
                        policy=wire.DELIVER_POLICY_START_FROM,
                        lsn=next_lsn,
                        include_control=True,
                        max_batch_entries=TAIL_BATCH_ENTRIES,
                        with_segment_id=True,
                    ),
                    timeout=max(1.0, remaining),
                )
                for response in stream:
                    for entry in response.entries:
                        if entry.lsn < next_lsn:
                            continue
                        if entry.lsn > next_lsn:
                            raise ConnectorError(
                                f"{part.label}: owner {address} sent lsn {entry.lsn} where "
                                f"{next_lsn} was expected"
                            )
                        next_lsn += 1
                        _take(entry, part, pending, rows)
                        if done():
                            break
                    progress_at = time.monotonic()
                    if len(rows) >= TAIL_ROWS_PER_BATCH or (done() and len(rows)):
                        yield rows.take()
                    if done():
                        stream.cancel()
                        break
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and done():
                break
            info = from_rpc_error(error)
            if info.code == E.COMPACTED:
                raise ConnectorError(f"COMPACTED: {part.label}: {info.message}") from None
            if not _retryable(error) and info.code not in (
                E.NOT_OWNER,
                E.CHANNEL_FENCED,
                E.ON_SHUTDOWN,
                E.UNAVAILABLE,
            ):
                raise ConnectorError(f"{part.label} at {address}: {describe(error)}") from None
            last_problem = f"{address}: {describe(error)}"
            log.info("%s: %s; retrying at the owner", part.label, last_problem)
            time.sleep(RETRY_PAUSE_S)
    if len(rows):
        yield rows.take()
    log.debug("%s read in %.3f s", part.label, time.monotonic() - started)


def _take(
    entry: wire.WalEntry,
    part: TailPartition,
    pending: dict[int, list[wire.WalEntry]],
    rows: _Rows,
) -> None:
    """Route one entry: a plain one in range is kept if visible; a transaction's entries
    wait until its commit (dropped at a rollback); the rest of a transaction begun before
    the range belongs to an earlier batch."""
    txn_bits = entry.flags & TXN_FLAGS
    if not txn_bits:
        if entry.lsn <= part.to_lsn and _visible(entry, part):
            rows.add(entry)
        return
    if txn_bits & EntryFlags.TXN_BEGIN:
        if entry.lsn > part.to_lsn:
            return
        pending[entry.txn_id] = [entry]
        return
    held = pending.get(entry.txn_id)
    if held is None:
        return
    held.append(entry)
    if txn_bits & EntryFlags.TXN_ROLLBACK:
        del pending[entry.txn_id]
    elif txn_bits & EntryFlags.TXN_COMMIT:
        del pending[entry.txn_id]
        for member in held:
            if _visible(member, part):
                rows.add(member)
