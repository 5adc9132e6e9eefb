"""Exactly-once consumer shards, one module per part: ``store`` (``ShardStore``, the SQLite
store and its checkpoint), ``recovery`` (``RecoveryLog``, the fenced recovery log) and
``service`` (``Application``, ``Shard``, ``ConsumerService``). Callers import these names
from ``rpc.shards_client``. Like all of ``rpc``, the package imports only ``rpc`` and
third-party libraries.

This file must never import anything: importing any module of the package runs it first,
so an import here would load the whole package (and could close an import cycle).
"""
