"""The exactly-once application the shard tests run (``raftwal consumer run
tests.cluster.shard_app:Counters``): per-key counters, plus one row per applied entry so a
test can see that every LSN took effect exactly once.

A payload is ``<key>:<anything>``. With ``SHARD_APP_PAUSE_FILE`` set and that file present,
``consume`` touches ``<file>.entered`` and sleeps a moment inside the open transaction, so
a test can SIGSTOP the process in the middle of one.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence

from rpc.protos import streaming_pb2 as wire
from rpc.shards_client import ShardStore


class Counters:
    def init_store(self, store: ShardStore) -> None:
        store.execute("CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, n INTEGER)")
        # No primary key on purpose: an entry applied twice would show as two rows.
        store.execute("CREATE TABLE IF NOT EXISTS applied (vchannel TEXT, lsn INTEGER)")

    def consume(self, store: ShardStore, entries: Sequence[wire.WalEntry]) -> None:
        pause = os.environ.get("SHARD_APP_PAUSE_FILE", "")
        if pause and os.path.exists(pause):
            with open(f"{pause}.entered", "w") as marker:
                marker.write(str(entries[0].lsn))
            time.sleep(0.5)
        counts = Counter(entry.payload.split(b":", 1)[0].decode() for entry in entries)
        store.executemany(
            "INSERT INTO counters (key, n) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET n = n + excluded.n",
            sorted(counts.items()),
        )
        store.executemany(
            "INSERT INTO applied (vchannel, lsn) VALUES (?, ?)",
            [(entry.vchannel, entry.lsn) for entry in entries],
        )

    def finalize(self, store: ShardStore) -> None:
        pass
