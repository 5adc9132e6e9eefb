"""raftwal's wire contract and client SDK, nothing else: ``rpc/protos`` (the .proto files
and the code generated from them, committed and never edited by hand) and the Python SDK
(``rpc.client``, ``rpc.streaming_client``, ``rpc.sync_client`` and the modules they
re-export). Servicers live in ``raftwal.services``; nothing here imports raftwal's other
packages.
"""
