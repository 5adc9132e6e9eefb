"""ShardStore on a real SQLite file: the application's writes and the checkpoint commit in
one transaction, a rollback drops both, and replaying the recovery records of one store
into an empty file rebuilds the same tables and checkpoint (what a new owner does after
the old disk was lost)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rpc.shards.store import (
    CHECKPOINT_TABLE,
    Checkpoint,
    Record,
    ShardStore,
    StoreError,
    decode_record,
    encode_record,
)


def _tables(store: ShardStore) -> dict[str, list[tuple[object, ...]]]:
    names = [
        row[0]
        for row in store.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        )
    ]
    return {
        name: sorted(store.conn.execute(f"SELECT * FROM [{name}]").fetchall(), key=repr)
        for name in names
    }


def _transaction(store: ShardStore, lsn: int, rows: list[tuple[str, bytes]]) -> Record:
    store.begin()
    store.execute("CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, n INTEGER)")
    store.executemany(
        "INSERT INTO counters (key, n) VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET n = n + 1",
        [(key,) for key, _ in rows],
    )
    # sqlite-utils writes are recorded through the tracer.
    store.db["blobs"].insert_all(
        [{"lsn": lsn, "key": key, "payload": payload} for key, payload in rows]
    )
    return store.prepare(Checkpoint(lsn, lsn * 10, 7, "m1", 0))


def test_writes_and_checkpoint_commit_together_and_roll_back_together(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "s" / "shard.sqlite")
    assert stat.S_IMODE(os.stat(tmp_path / "s").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "s" / "shard.sqlite").st_mode) == 0o600
    _transaction(store, 5, [("a", b"\x00\x01"), ("b", b"x"), ("a", b"y")])
    store.commit(rlog_lsn=3)
    assert store.checkpoint() == Checkpoint(5, 50, 7, "m1", 3)
    assert dict(store.conn.execute("SELECT key, n FROM counters")) == {"a": 2, "b": 1}
    _transaction(store, 9, [("a", b"z")])
    store.rollback()
    assert store.checkpoint() == Checkpoint(5, 50, 7, "m1", 3)
    assert dict(store.conn.execute("SELECT key, n FROM counters")) == {"a": 2, "b": 1}
    # A reopened file resumes from the committed checkpoint.
    store.close()
    again = ShardStore(tmp_path / "s" / "shard.sqlite")
    assert again.checkpoint() == Checkpoint(5, 50, 7, "m1", 3)
    again.close()


def test_replaying_the_records_rebuilds_the_same_store(tmp_path: Path) -> None:
    original = ShardStore(tmp_path / "a.sqlite")
    log: list[tuple[int, bytes]] = []
    rlog_lsn = 0
    for lsn, rows in [(3, [("a", b"1"), ("b", b"2")]), (8, [("b", b"3")]), (12, [("c", b"")])]:
        record = _transaction(original, lsn, rows)
        rlog_lsn += 2  # control entries may sit between records
        log.append((rlog_lsn, encode_record(record)))
        original.commit(rlog_lsn)
    rebuilt = ShardStore(tmp_path / "b.sqlite")
    for at, payload in log:
        rebuilt.apply_record(decode_record(payload), at)
    # A record replayed twice (a replay that restarted) takes effect once.
    rebuilt.apply_record(decode_record(log[-1][1]), log[-1][0])
    assert _tables(rebuilt) == _tables(original)
    assert rebuilt.checkpoint() == original.checkpoint() == Checkpoint(12, 120, 7, "m1", 6)
    # A fence record moves the token, not the source position.
    fence = Record(kind="fence", token=9, member_id="m2")
    rebuilt.apply_record(fence, 7)
    assert rebuilt.checkpoint() == Checkpoint(12, 120, 9, "m2", 7)


def test_misuse_and_foreign_payloads_are_refused(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "c.sqlite")
    with pytest.raises(StoreError, match="no store transaction"):
        store.execute("INSERT INTO x VALUES (1)")
    store.begin()
    with pytest.raises(StoreError, match="already open"):
        store.begin()
    with pytest.raises(StoreError, match="inside an open store transaction"):
        store.apply_record(Record(kind="fence", token=1, member_id="m"), 1)
    with pytest.raises(StoreError, match="unsupported SQL parameter"):
        store.execute("CREATE TABLE t (v)")
        store.execute("INSERT INTO t VALUES (?)", (object(),))
    store.rollback()
    for payload in (b"not zlib", encode_record(Record(kind="txn", token=1, member_id="m"))[:5]):
        with pytest.raises(StoreError, match="not a recovery record"):
            decode_record(payload)
    assert CHECKPOINT_TABLE in _tables(store)
    with pytest.raises(ValueError, match="invalid synchronous"):
        ShardStore(tmp_path / "d.sqlite", synchronous="sometimes")


def test_load_application_names_what_is_wrong() -> None:
    from rpc.shards_client import load_application

    app = load_application("tests.cluster.shard_app:Counters")
    assert type(app).__name__ == "Counters"
    with pytest.raises(ValueError, match="expected MODULE:APP"):
        load_application("justamodule")
    with pytest.raises(ImportError, match="no_such_module"):
        load_application("no_such_module:App")
    with pytest.raises(ValueError, match="has no 'Nope'"):
        load_application("tests.cluster.shard_app:Nope")
    with pytest.raises(ValueError, match="is not an Application"):
        load_application("tests.cluster.shard_app:Counter")  # collections.Counter


def test_shard_store_paths_are_plain_names(tmp_path: Path) -> None:
    from rpc.shards_client import shard_store_path

    assert shard_store_path(tmp_path, "s", "v") == tmp_path / "s" / "v.sqlite"
    for bad in ("", "..", "a/b", "x\x00"):
        with pytest.raises(ValueError, match="plain name"):
            shard_store_path(tmp_path, bad, "v")
