"""Exactly-once consumer shards on SQLite (Gazette's consumer framework): the
``Application`` interface, ``ShardStore`` (the SQLite store and its checkpoint),
``RecoveryLog`` (the fenced recovery log), ``Shard`` and ``ConsumerService``.

Nothing is defined here: each part lives in its module of ``rpc.shards`` (``store``,
``recovery``, ``service``), and this module re-exports their public names, where callers
import them. It must never define behaviour of its own, nor be imported by the modules it
re-exports.
"""

from __future__ import annotations

from rpc.shards.recovery import RecoveryLog as RecoveryLog
from rpc.shards.recovery import recovery_names as recovery_names
from rpc.shards.service import Application as Application
from rpc.shards.service import ConsumerService as ConsumerService
from rpc.shards.service import Shard as Shard
from rpc.shards.service import ShardSource as ShardSource
from rpc.shards.service import ShardStatus as ShardStatus
from rpc.shards.service import VChannelSource as VChannelSource
from rpc.shards.service import load_application as load_application
from rpc.shards.service import shard_rows as shard_rows
from rpc.shards.service import shard_store_path as shard_store_path
from rpc.shards.store import Checkpoint as Checkpoint
from rpc.shards.store import Record as Record
from rpc.shards.store import ShardStore as ShardStore
from rpc.shards.store import StoreError as StoreError
