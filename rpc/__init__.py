"""raftwal's wire contract and gRPC edge: ``rpc/protos`` (the .proto files and the code
generated from them, committed and never edited by hand), and later the servicers and the
Python client SDK. Must never contain business logic: servicers validate, propose and map
outcomes to gRPC statuses.
"""
