"""`spark_connector.export.partition_rows`: how a task cuts its rows into Parquet files."""

from __future__ import annotations

import datetime

import pyarrow as pa

from spark_connector.export import TICK_LOGICAL_BITS, partition_rows
from spark_connector.fetch import SPARK_SCHEMA


def _tick(when: datetime.datetime, logical: int = 0) -> int:
    return (int(when.timestamp() * 1000) << TICK_LOGICAL_BITS) | logical


def _table(rows: list[tuple[str, int, int]]) -> pa.Table:
    """Rows of (vchannel, lsn, time tick) on pchannel p1."""
    n = len(rows)
    return pa.Table.from_batches(
        [
            pa.RecordBatch.from_arrays(
                [
                    pa.array(["p1"] * n),
                    pa.array([v for v, _, _ in rows]),
                    pa.array([7] * n, pa.int64()),
                    pa.array([lsn for _, lsn, _ in rows], pa.int64()),
                    pa.array([2] * n, pa.int64()),
                    pa.array([tick for _, _, tick in rows], pa.int64()),
                    pa.array(["message"] * n),
                    pa.array([b"k"] * n, pa.binary()),
                    pa.array([f"payload {lsn}".encode() for _, lsn, _ in rows], pa.binary()),
                    pa.nulls(n, pa.int64()),
                    pa.nulls(n, pa.int64()),
                    pa.array([[]] * n, pa.map_(pa.string(), pa.string())),
                ],
                schema=SPARK_SCHEMA,
            )
        ]
    )


def test_one_vchannel_one_day_is_the_table_itself_without_the_directory_columns() -> None:
    noon = datetime.datetime(2026, 11, 25, 12, tzinfo=datetime.UTC)
    table = _table([("orders", lsn, _tick(noon, lsn)) for lsn in range(1, 6)])
    [(vchannel, date, rows)] = partition_rows(table)
    assert (vchannel, date) == ("orders", "2026-11-25")
    assert rows.column_names == [n for n in SPARK_SCHEMA.names if n not in ("pchannel", "vchannel")]
    assert rows.column("lsn").to_pylist() == [1, 2, 3, 4, 5]


def test_interleaved_vchannels_across_midnight_keep_each_files_rows_in_lsn_order() -> None:
    before = datetime.datetime(2026, 11, 25, 23, 59, 59, 999_000, tzinfo=datetime.UTC)
    after = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)
    table = _table(
        [
            ("orders", 1, _tick(before, 1)),
            ("payments", 2, _tick(before, 2)),
            ("orders", 3, _tick(before, (1 << TICK_LOGICAL_BITS) - 1)),
            ("payments", 4, _tick(after)),
            ("orders", 5, _tick(after, 1)),
            ("orders", 6, _tick(after, 2)),
        ]
    )
    cut = {(v, d): rows.column("lsn").to_pylist() for v, d, rows in partition_rows(table)}
    assert cut == {
        ("orders", "2026-11-25"): [1, 3],
        ("orders", "2026-11-26"): [5, 6],
        ("payments", "2026-11-25"): [2],
        ("payments", "2026-11-26"): [4],
    }
    assert [(v, d) for v, d, _ in partition_rows(table)] == sorted(cut)
