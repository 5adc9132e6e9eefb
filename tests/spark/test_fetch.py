"""The executor's read path on crafted segment files (no cluster, no Spark): transaction
visibility across partition splits, control entries hidden, internal properties hidden,
and filters, against rows computed from the entries written."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from spark_connector import fetch
from spark_connector.fetch import RowFilter, read_slice
from spark_connector.options import ReadOptions, parse_options
from spark_connector.plan import SegmentSlice
from wal_segments.format import CONTROL_FLAGS, Entry, EntryFlags, MsgType
from wal_segments.segment import SegmentReader, SegmentWriter

PCHANNEL = "p0"
NAMES = {1: "a", 2: "b"}


def _entries(seed: int) -> list[Entry]:
    """Plain messages, complete transactions, one transaction with no commit (never
    visible), a term start, owners' time-tick entries and a trailing seal marker."""
    rng = random.Random(seed)
    entries: list[Entry] = []
    lsn = 1

    def add(**fields) -> None:
        nonlocal lsn
        entries.append(Entry(lsn=lsn, term=1, time_tick=1000 + lsn, **fields))
        lsn += 1

    add(msg_type=int(MsgType.TERM_START), flags=int(EntryFlags.TERM_START))
    for txn in range(1, 30):
        for _ in range(rng.randint(0, 4)):
            props = {"rw.seq": "7", "user": "u"} if rng.random() < 0.3 else {}
            add(msg_type=int(MsgType.MESSAGE), vchannel_id=rng.choice([1, 2]),
                payload=b"m%d" % lsn, properties=props)  # fmt: skip
        body = rng.randint(0, 5)
        add(msg_type=int(MsgType.TXN_BEGIN), vchannel_id=1, flags=int(EntryFlags.TXN_BEGIN),
            txn_id=txn)  # fmt: skip
        for _ in range(body):
            add(msg_type=int(MsgType.MESSAGE), vchannel_id=1, flags=int(EntryFlags.TXN_BODY),
                txn_id=txn, payload=b"t%d" % lsn)  # fmt: skip
        if txn != 17:  # txn 17 never commits
            add(msg_type=int(MsgType.TXN_COMMIT), vchannel_id=1,
                flags=int(EntryFlags.TXN_COMMIT), txn_id=txn)  # fmt: skip
        if txn % 7 == 0:  # an idle owner's time-tick entry (for pack consumers)
            add(msg_type=int(MsgType.TIME_TICK), flags=int(EntryFlags.TIME_TICK_MARKER))
    add(msg_type=int(MsgType.SEAL), flags=int(EntryFlags.SEAL_MARKER))
    return entries


def _write(directory: Path, entries: list[Entry]) -> SegmentReader:
    wal = directory / "wal" / PCHANNEL
    wal.mkdir(parents=True)
    writer = SegmentWriter.create(wal, PCHANNEL, 1, 1)
    writer.append(entries)
    writer.seal()
    writer.close()
    return SegmentReader.open(next(wal.iterdir()))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("split", [1, 2, 3, 7, 1000])
def test_transactions_visible_whole_across_splits(tmp_path: Path, seed: int, split: int) -> None:
    entries = _entries(seed)
    reader = _write(tmp_path, entries)
    options = parse_options(
        {"endpoints": "127.0.0.1:1", "preferLocal": "true", "localDataDirs": f"n1={tmp_path}"}
    )
    rows: list[dict] = []
    last = entries[-1].lsn
    for start in range(1, last + 1, split):
        part = SegmentSlice(PCHANNEL, 1, 1, last, reader.digest, start,
                            min(last, start + split - 1), (("n1", "127.0.0.1:1"),))  # fmt: skip
        for batch in read_slice(part, options, NAMES, RowFilter()):
            rows += pa.Table.from_batches([batch]).to_pylist()
    committed = {e.txn_id for e in entries if e.flags & EntryFlags.TXN_COMMIT}
    expected = [
        e.lsn
        for e in entries
        if not e.flags & CONTROL_FLAGS and (e.txn_id == 0 or e.txn_id in committed)
    ]
    assert [r["lsn"] for r in rows] == expected
    assert all(r["txn_id"] != 17 for r in rows)
    assert all("rw.seq" not in dict(r["properties"]) for r in rows)
    with_user = {e.lsn for e in entries if "user" in e.properties}
    assert {r["lsn"] for r in rows if dict(r["properties"]).get("user") == "u"} == with_user
    by_lsn = {e.lsn: e for e in entries}
    for row in rows:
        entry = by_lsn[row["lsn"]]
        assert row["payload"] == entry.payload
        assert row["vchannel"] == NAMES.get(entry.vchannel_id, "")
        assert row["txn_id"] == (entry.txn_id or None)


def _whole_segment(tmp_path: Path, entries: list[Entry]) -> tuple[SegmentSlice, ReadOptions]:
    """`entries` written as one sealed segment: its whole-segment partition, and options
    that read it from the file."""
    reader = _write(tmp_path, entries)
    last = entries[-1].lsn
    part = SegmentSlice(PCHANNEL, 1, 1, last, reader.digest, 1, last, (("n1", "127.0.0.1:1"),))
    local = parse_options(
        {"endpoints": "127.0.0.1:1", "preferLocal": "true", "localDataDirs": f"n1={tmp_path}"}
    )
    return part, local


@pytest.mark.parametrize("piece_rows", [1, 3, 8])
def test_a_remote_read_in_pieces_gives_the_rows_of_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece_rows: int
) -> None:
    """A partition fetched from a replica comes in pieces, the next fetched in a thread
    while the current one is decoded; transactions that span pieces appear whole and
    once, as in one read. (The frames come from the file here, through the same `_frames`
    seam the replicas' transfer uses.)"""
    part, local = _whole_segment(tmp_path, _entries(4))
    last = part.last_lsn
    whole = pa.Table.from_batches(list(read_slice(part, local, NAMES, RowFilter())))
    remote = parse_options({"endpoints": "127.0.0.1:1"})
    fetched: list[tuple[int, int]] = []
    threads: set[str] = set()
    real_frames = fetch._frames

    def from_the_file(piece: SegmentSlice, options: object, low: int, high: int) -> object:
        fetched.append((low, high))
        threads.add(threading.current_thread().name)
        return real_frames(piece, local, low, high)

    monkeypatch.setattr(fetch, "PIECE_ROWS", piece_rows)
    monkeypatch.setattr(fetch, "_frames", from_the_file)
    batches = list(read_slice(part, remote, NAMES, RowFilter()))
    assert len(fetched) >= last // piece_rows - 1
    assert fetched[0][0] == 1 and max(high for _, high in fetched) == last
    assert any(name.startswith("raftwal-fetch") for name in threads)
    assert pa.Table.from_batches(batches, schema=whole.schema).equals(whole)


def test_a_failed_piece_fails_the_read_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part, local = _whole_segment(tmp_path, _entries(5))
    real_frames = fetch._frames

    def second_fails(piece: SegmentSlice, options: object, low: int, high: int) -> object:
        if low > 1:
            raise fetch.SegmentUnreadable(f"{piece.label} (lsn {low}..{high}): every replica down")
        return real_frames(piece, local, low, high)

    monkeypatch.setattr(fetch, "PIECE_ROWS", 10)
    monkeypatch.setattr(fetch, "_frames", second_fails)
    reading = read_slice(part, parse_options({"endpoints": "127.0.0.1:1"}), NAMES, RowFilter())
    with pytest.raises(fetch.SegmentUnreadable, match="every replica down"):
        list(reading)


def test_row_filters(tmp_path: Path) -> None:
    entries = _entries(5)
    reader = _write(tmp_path, entries)
    options = parse_options(
        {"endpoints": "127.0.0.1:1", "preferLocal": "true", "localDataDirs": f"n1={tmp_path}"}
    )
    last = entries[-1].lsn
    part = SegmentSlice(PCHANNEL, 1, 1, last, reader.digest, 1, last, (("n1", "127.0.0.1:1"),))
    row_filter = RowFilter(
        vchannel_ids=frozenset({2}),
        msg_types=frozenset({int(MsgType.MESSAGE)}),
        min_time_tick=1010,
        max_time_tick=1080,
    )
    got = [
        r["lsn"]
        for batch in read_slice(part, options, NAMES, row_filter)
        for r in pa.Table.from_batches([batch]).to_pylist()
    ]
    expected = [
        e.lsn
        for e in entries
        if e.vchannel_id == 2 and e.msg_type == MsgType.MESSAGE and 1010 <= e.time_tick < 1080
    ]
    assert expected and got == expected


@pytest.mark.parametrize(
    "options, needle",
    [
        ({}, "endpoints"),
        ({"endpoints": "nohost"}, "endpoints"),
        ({"endpoints": "h:1", "fromLsn": "0"}, "fromLsn"),
        ({"endpoints": "h:1", "fromLsn": '{"p": "x"}'}, "fromLsn"),
        ({"endpoints": "h:1", "fromTimeTick": "5", "toTimeTick": "5"}, "toTimeTick"),
        ({"endpoints": "h:1", "msgTypes": "nope"}, "msgTypes"),
        ({"endpoints": "h:1", "preferLocal": "maybe"}, "preferLocal"),
        ({"endpoints": "h:1", "localDataDirs": "n1"}, "localDataDirs"),
        ({"endpoints": "h:1", "maxRecordsPerPartition": "0"}, "maxRecordsPerPartition"),
        ({"endpoints": "h:1", "asOfRevision": "-1"}, "asOfRevision"),
        ({"endpoints": "h:1", "colour": "blue"}, "colour"),
    ],
)
def test_bad_options_name_the_option(options: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_options(options)
