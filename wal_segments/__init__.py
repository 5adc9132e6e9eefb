"""The data WAL: segment files, catalog, append/replicate/fence/recover, scanner, txn buffer.

Never imports ``raft``: what it needs from the coordination plane arrives as small
``typing.Protocol`` objects wired by the composition root in ``raftwal/``.
"""
