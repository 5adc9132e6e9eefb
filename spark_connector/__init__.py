"""PySpark Python Data Source ``raftwal`` reading committed WAL segments.

Imports only ``rpc`` (client) and ``wal_segments`` (segment reader).
"""
