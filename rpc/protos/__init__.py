"""Generated protobuf and gRPC modules (package ``raftwal.v1``). Regenerate with
``./run proto``; CI fails when they are stale. Never edit the ``*_pb2*`` files by hand.
"""
