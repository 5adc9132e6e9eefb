"""Shared builders for the WAL segment tests: entries with every field exercised."""

from __future__ import annotations

from pathlib import Path

from wal_segments.format import Entry, EntryFlags, MsgType
from wal_segments.segment import SegmentWriter

PCHANNEL = "p_0"
VCHANNEL_NAMES = {1: "by-dev-v1", 2: "by-dev-v2", 3: "ünïcødé-v3"}


def varied_entries(count: int, *, first_lsn: int = 1, term: int = 1, first_tick: int = 1000):
    """Entries cycling through every flag combination, empty and non-empty keys, payloads
    and properties, and unicode."""
    entries = []
    for number in range(count):
        lsn = first_lsn + number
        kind = number % 8
        flags, txn_id, broadcast_id, msg_type = 0, 0, 0, MsgType.INSERT
        if kind == 1:
            flags, txn_id, msg_type = EntryFlags.TXN_BEGIN, 40 + number, MsgType.TXN_BEGIN
        elif kind == 2:
            flags, txn_id = EntryFlags.TXN_BODY, 40 + number
        elif kind == 3:
            flags, txn_id, msg_type = EntryFlags.TXN_COMMIT, 40 + number, MsgType.TXN_COMMIT
        elif kind == 4:
            flags, broadcast_id, msg_type = EntryFlags.BROADCAST, 9_000 + number, MsgType.DDL
        elif kind == 5:
            flags, msg_type = EntryFlags.TERM_START, MsgType.TERM_START
        elif kind == 6:
            flags, txn_id, msg_type = EntryFlags.TXN_ROLLBACK, 40 + number, MsgType.TXN_ROLLBACK
        properties = {}
        if number % 3 == 0:
            properties = {"trace": f"t-{number}", "名前": "値 ✓", "": "", "emoji": "🚀" * number}
        entries.append(
            Entry(
                lsn=lsn,
                term=term,
                time_tick=first_tick + 7 * number,
                msg_type=int(msg_type),
                vchannel_id=0 if kind == 5 else 1 + number % 3,
                flags=int(flags),
                txn_id=txn_id,
                broadcast_id=broadcast_id,
                key=b"" if number % 4 == 0 else f"key-{number}".encode(),
                payload=b""
                if number % 5 == 0
                else bytes((number + i) % 256 for i in range(number * 13)),
                properties=properties,
            )
        )
    return entries


def simple_entries(
    count: int, *, first_lsn: int = 1, term: int = 1, first_tick: int = 1, size: int = 24
):
    return [
        Entry(
            lsn=first_lsn + number,
            term=term,
            time_tick=first_tick + number,
            msg_type=int(MsgType.INSERT),
            vchannel_id=1,
            key=b"k%d" % (first_lsn + number),
            payload=bytes([(first_lsn + number) % 251]) * size,
        )
        for number in range(count)
    ]


def write_segment(
    directory: Path, entries, *, seal: bool, batch_size: int = 4, first_lsn: int | None = None
) -> Path:
    writer = SegmentWriter.create(
        directory, PCHANNEL, entries[0].lsn if first_lsn is None else first_lsn, entries[0].term
    )
    for start in range(0, len(entries), batch_size):
        writer.append(entries[start : start + batch_size])
    writer.sync()
    path = writer.path
    if seal:
        writer.seal()
    else:
        writer.close()
    return path
