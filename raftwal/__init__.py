"""The raftwal process: configuration, composition root, coordinator loop and the CLI.

This is the only package allowed to import every plane (statemachine, raft, wal_segments,
rpc) and wire them together.
"""

__version__ = "0.1.0"
