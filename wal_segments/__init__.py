"""The data WAL: segment files, catalog, append/replicate/fence/recover, scanner, txn buffer.

Never imports ``raft``: what it needs from the coordination plane arrives as small
``typing.Protocol`` objects wired by the composition root in ``raftwal/``.

Modules so far:

- ``format``: the segment file format (file header, 72-byte entry frames with crc32c,
  seal footer with offset index, per-block crc32c and digest, trailer) as pure
  encode/decode functions, the ``Entry`` record and the message-type registry.
- ``segment``: ``SegmentWriter`` (create, append encoded batches, sync, truncate a
  divergent suffix, seal), ``open_segment`` (crash recovery: torn tails truncated and
  reported, mid-file corruption raised as ``SegmentCorrupted(path, offset, reason)``),
  ``SegmentReader`` (sealed segments: verified once, read through the index, ``to_arrow``)
  and ``read_unsealed`` (the open tail, frame by frame).
- ``columnar``: the Spark Arrow schema and the vectorized (pyarrow-only) decoding of a
  sealed segment into a RecordBatch.
- ``fsync_policy``: ``always | interval:<ms> | never`` (``never`` is unsafe) and the
  asyncio ``GroupCommit`` that lets concurrent appenders share one fdatasync.
"""
