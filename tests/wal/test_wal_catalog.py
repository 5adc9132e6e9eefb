"""`catalog.db` (wal_segments/catalog.py): a catalog written by the sqlite-utils version
opens and keeps working; upserts change only the columns they name; the fenced term and
the retention floor never go down."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import sqlite_utils

from wal_segments.catalog import Catalog, SegmentRow


def _row(first_lsn: int, state: str = "open", last_lsn: int = 0) -> SegmentRow:
    return SegmentRow("p_0", first_lsn, last_lsn or first_lsn + 9, 1, 1, 1, 2, 10, 800, 7, state)


def _old_catalog(path: Path) -> None:
    """The tables as the sqlite-utils version created them, with a row in each."""
    db = sqlite_utils.Database(sqlite3.connect(str(path)))
    db["pchannels"].create(
        {"name": str, "fenced_term": int, "committed_lsn": int}, pk="name", if_not_exists=True
    )
    db["segments"].create(
        {
            "pchannel": str,
            "first_lsn": int,
            "last_lsn": int,
            "first_term": int,
            "last_term": int,
            "first_time_tick": int,
            "last_time_tick": int,
            "count": int,
            "bytes": int,
            "digest": int,
            "state": str,
        },
        pk=("pchannel", "first_lsn"),
        if_not_exists=True,
    )
    db["retention"].create(
        {"pchannel": str, "deleted_before_lsn": int}, pk="pchannel", if_not_exists=True
    )
    db["replica_positions"].create(
        {"pchannel": str, "node_id": str, "term": int, "durable_lsn": int},
        pk=("pchannel", "node_id"),
        if_not_exists=True,
    )
    db["pchannels"].insert({"name": "p_0", "fenced_term": 3, "committed_lsn": 42})
    db["segments"].insert(dataclasses.asdict(_row(1, "sealed")))
    db["retention"].insert({"pchannel": "p_0", "deleted_before_lsn": 5})
    db["replica_positions"].insert(
        {"pchannel": "p_0", "node_id": "n1", "term": 3, "durable_lsn": 9}
    )
    db.conn.commit()
    db.conn.close()


def test_a_catalog_of_the_sqlite_utils_version_opens_and_upserts(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    _old_catalog(path)
    catalog = Catalog(path)
    assert catalog.fenced_term("p_0") == 3
    assert catalog.segments("p_0") == [_row(1, "sealed")]
    assert catalog.retention_floor("p_0") == 5
    assert catalog.replica_positions("p_0") == {"n1": 9}

    assert catalog.raise_fenced_term("p_0", 4) == 4
    catalog.upsert_segment(_row(1, "open", last_lsn=30))
    catalog.upsert_segment(_row(31))
    catalog.mark_committed("p_0", 1)
    catalog.record_replica_positions("p_0", 4, {"n1": 12, "n2": 8})
    catalog.close()

    again = Catalog(path)
    assert again.fenced_term("p_0") == 4
    assert again.segments("p_0") == [_row(1, "committed", last_lsn=30), _row(31)]
    assert again.committed_first_lsns("p_0") == {1}
    assert again.replica_positions("p_0") == {"n1": 12, "n2": 8}
    # The fenced-term upsert leaves the other columns of the row alone.
    raw = sqlite3.connect(str(path))
    assert raw.execute("select committed_lsn from pchannels where name = 'p_0'").fetchone() == (42,)
    raw.close()
    again.close()


def test_the_fenced_term_and_the_retention_floor_never_go_down(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path / "catalog.db")
    assert catalog.fenced_term("p_0") == 0 and catalog.fenced_terms() == {}
    assert catalog.raise_fenced_term("p_0", 5) == 5
    assert catalog.raise_fenced_term("p_0", 3) == 5
    assert catalog.fenced_terms() == {"p_0": 5}
    assert catalog.raise_retention_floor("p_0", 10) == 10
    assert catalog.raise_retention_floor("p_0", 4) == 10
    assert catalog.retention_floor("p_0") == 10
    catalog.upsert_segment(_row(1))
    catalog.upsert_segment(_row(11))
    catalog.delete_segments_before("p_0", 11)
    assert [row.first_lsn for row in catalog.segments()] == [11]
    catalog.delete_segments_from("p_0", 0)
    assert catalog.segments("p_0") == []
    catalog.close()
