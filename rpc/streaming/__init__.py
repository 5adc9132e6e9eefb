"""raftwal's asyncio SDK for the data plane (``raftwal.v1.StreamingNode``), one module per
part: ``routing`` (the assignment cache, routes, and ``StreamingClientBase``, which owns the
node channels), ``producer``, ``consumer``, ``txn``, and ``client`` (``StreamingClient``:
the base plus the factories that build the other three). Callers import these names from
``rpc.streaming_client``.

This file must never import anything: importing any module of the package runs it first,
so an import here would load the whole package (and could close an import cycle).
"""
