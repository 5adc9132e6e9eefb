"""The PySpark Python Data Source `raftwal` (pyspark >= 4.0).

What lives here: `RaftwalDataSource` and its reader. The reader is built on the driver: it
reads the committed manifest once, at one revision (a consistent snapshot that
`asOfRevision` repeats), and cuts it into one input partition per committed segment (large
segments split by LSN range). Executors run `fetch.read_slice` per partition and yield
Arrow RecordBatches of `SCHEMA`.

Filter pushdown (`pushFilters`, Spark 4.1+) exists only on `RaftwalPushdownDataSource`:
Spark refuses a reader that defines `pushFilters` unless
`spark.sql.python.filterPushdown.enabled` is true, so `spark_connector.register` picks the
class by that setting. Pushed: equality / IN on pchannel, vchannel, msg_type, segment_id,
and ranges on lsn and time_tick; every other filter is handed back to Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from spark_connector.fetch import RowFilter, read_slice
from spark_connector.options import ReadOptions, parse_options
from spark_connector.plan import ConnectorError, SegmentSlice, Snapshot, plan, snapshot
from spark_connector.stream import RaftwalStreamReader, stream_options
from wal_segments.format import MSG_TYPE_CODES

NAME = "raftwal"

SCHEMA_DDL = (
    "pchannel string, vchannel string, segment_id long, lsn long, term long, "
    "time_tick long, msg_type string, key binary, payload binary, txn_id long, "
    "broadcast_id long, properties map<string,string>"
)


class SlicePartition(InputPartition):
    """One task: the slice, the row filter and the names of its pchannel's vchannels.
    Spark pickles the reader before it calls `partitions()`, so everything a task needs
    from the snapshot travels here."""

    def __init__(self, part: SegmentSlice, row_filter: RowFilter, names: dict[int, str]) -> None:
        super().__init__(part.label)
        self.part = part
        self.row_filter = row_filter
        self.names = names


@dataclass
class _Pushed:
    """What pushed filters narrowed (None = not narrowed)."""

    pchannels: frozenset[str] | None = None
    vchannels: frozenset[str] | None = None
    msg_types: frozenset[int] | None = None
    segment_ids: frozenset[int] | None = None
    min_lsn: int | None = None  # inclusive
    max_lsn: int | None = None  # exclusive
    min_tick: int | None = None  # inclusive
    max_tick: int | None = None  # exclusive
    empty: bool = False


def _narrow(current: frozenset[Any] | None, values: Iterable[Any]) -> frozenset[Any]:
    values = frozenset(values)
    return values if current is None else current & values


def _max(a: int | None, b: int) -> int:
    return b if a is None else max(a, b)


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


class RaftwalReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.pushed = _Pushed()
        self._snapshot: Snapshot | None = None

    # The snapshot is taken lazily and once, on the driver (partitions() runs there).
    def _snap(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = snapshot(self.options)
        return self._snapshot

    def _effective(self) -> tuple[ReadOptions, RowFilter, list[SegmentSlice]]:
        snap = self._snap()
        options = self.options
        pushed = self.pushed
        if pushed.pchannels is not None:
            options = replace(options, pchannels=_narrow(options.pchannels, pushed.pchannels))
        if pushed.vchannels is not None:
            known = pushed.vchannels & set(snap.vchannel_ids)
            options = replace(options, vchannels=_narrow(options.vchannels, known))
        if pushed.msg_types is not None:
            options = replace(options, msg_types=_narrow(options.msg_types, pushed.msg_types))
        low_tick = options.from_time_tick
        high_tick = options.to_time_tick
        if pushed.min_tick is not None:
            low_tick = _max(low_tick, pushed.min_tick)
        if pushed.max_tick is not None:
            high_tick = _min(high_tick, pushed.max_tick)
        options = replace(options, from_time_tick=low_tick, to_time_tick=high_tick)
        if (
            pushed.empty
            or options.pchannels == frozenset()
            or options.vchannels == frozenset()
            or options.msg_types == frozenset()
            or (low_tick is not None and high_tick is not None and high_tick <= low_tick)
        ):
            return options, RowFilter.from_options(options, snap.vchannel_ids), []

        def lsn_bounds(pchannel: str) -> tuple[int | None, int | None]:
            low, high = options.lsn_bounds(pchannel)
            if pushed.min_lsn is not None:
                low = _max(low, pushed.min_lsn)
            if pushed.max_lsn is not None:
                high = _min(high, pushed.max_lsn)
            return low, high

        slices = plan(options, snap, lsn_bounds=lsn_bounds, tick_bounds=(low_tick, high_tick))
        if pushed.segment_ids is not None:
            slices = [s for s in slices if s.segment_id in pushed.segment_ids]
        return options, RowFilter.from_options(options, snap.vchannel_ids), slices

    def partitions(self) -> Sequence[InputPartition]:
        _, row_filter, slices = self._effective()
        if not slices:
            # Spark calls read(InputPartition(None)) for an empty list; say so explicitly.
            return [InputPartition(None)]
        snap = self._snap()
        names: dict[str, dict[int, str]] = {}
        for vchannel_id, name in snap.vchannel_names.items():
            names.setdefault(snap.vchannel_pchannels[name], {})[vchannel_id] = name
        return [SlicePartition(part, row_filter, names.get(part.pchannel, {})) for part in slices]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SlicePartition):
            return iter(())
        return read_slice(partition.part, self.options, partition.names, partition.row_filter)


def _column(filter_: Filter) -> str | None:
    attribute = getattr(filter_, "attribute", ())
    return attribute[0] if len(attribute) == 1 else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class RaftwalPushdownReader(RaftwalReader):
    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 (Spark API)
        for filter_ in filters:
            if not self._push(filter_):
                yield filter_

    def _push(self, filter_: Filter) -> bool:
        """Record `filter_` if the reader applies it exactly; False hands it back."""
        column = _column(filter_)
        pushed = self.pushed
        if isinstance(filter_, (EqualTo, In)):
            values = [filter_.value] if isinstance(filter_, EqualTo) else list(filter_.value)
            if column in ("pchannel", "vchannel", "msg_type") and all(
                isinstance(v, str) for v in values
            ):
                if column == "pchannel":
                    pushed.pchannels = _narrow(pushed.pchannels, values)
                elif column == "vchannel":
                    pushed.vchannels = _narrow(pushed.vchannels, values)
                else:
                    codes = [MSG_TYPE_CODES[v] for v in values if v in MSG_TYPE_CODES]
                    pushed.msg_types = _narrow(pushed.msg_types, codes)
                return True
            if column in ("segment_id", "lsn", "time_tick") and all(_is_int(v) for v in values):
                if column == "segment_id":
                    pushed.segment_ids = _narrow(pushed.segment_ids, values)
                    return True
                if not values:
                    pushed.empty = True
                    return True
                if len(values) == 1:
                    self._range(column, values[0], values[0] + 1)
                    return True
                return False
            return False
        if isinstance(filter_, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
            if column not in ("lsn", "time_tick") or not _is_int(filter_.value):
                return False
            value = filter_.value
            if isinstance(filter_, GreaterThan):
                self._range(column, value + 1, None)
            elif isinstance(filter_, GreaterThanOrEqual):
                self._range(column, value, None)
            elif isinstance(filter_, LessThan):
                self._range(column, None, value)
            else:
                self._range(column, None, value + 1)
            return True
        return False

    def _range(self, column: str, low: int | None, high: int | None) -> None:
        pushed = self.pushed
        if column == "lsn":
            if low is not None:
                pushed.min_lsn = _max(pushed.min_lsn, max(low, 1))
            if high is not None:
                pushed.max_lsn = _min(pushed.max_lsn, high)
                if high <= 1:
                    pushed.empty = True
        else:
            if low is not None:
                pushed.min_tick = _max(pushed.min_tick, low)
            if high is not None:
                pushed.max_tick = _min(pushed.max_tick, high)
        if (
            pushed.min_lsn is not None
            and pushed.max_lsn is not None
            and pushed.max_lsn <= pushed.min_lsn
        ):
            pushed.empty = True


class RaftwalDataSource(DataSource):
    """`spark.read.format("raftwal").option("endpoints", ...).load()`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def _options(self) -> ReadOptions:
        try:
            return parse_options(dict(self.options))
        except ValueError as error:
            raise ConnectorError(str(error)) from None

    def _batch_options(self) -> ReadOptions:
        if "startingoffsets" in {key.lower() for key in self.options}:
            raise ConnectorError(
                "raftwal option startingOffsets: only readStream takes it; a batch read "
                "chooses its range with fromLsn/toLsn"
            )
        return self._options()

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftwalReader(self._batch_options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """`spark.readStream.format("raftwal")` (spark_connector.stream)."""
        read = self._options()
        try:
            return RaftwalStreamReader(stream_options(dict(self.options), read))
        except ValueError as error:
            raise ConnectorError(str(error)) from None


class RaftwalPushdownDataSource(RaftwalDataSource):
    """The same source with `pushFilters` (needs spark.sql.python.filterPushdown.enabled)."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftwalPushdownReader(self._batch_options())
