"""The gRPC servicers, one module per service:

- ``coordinator``: the public Coordinator service (channels, watches, leases, locks,
  broadcasts) over ``CoordinationBackend``;
- ``streaming_node``: the public StreamingNode service (produce, consume, transactions,
  segments);
- ``replication``: the node-to-node Replication service (append, fence, fetch);
- ``cluster`` and ``node_manager``: the node-to-node Cluster (heartbeats, forwarded
  proposals) and NodeManager (assign, remove, status) services;
- ``decoding``: the interceptor that answers an unparsable request with INVALID_ARGUMENT;
- ``backend``: the Protocols the node implements for the servicers, and the view of the
  coordination state they read.

Servicers validate, call their backend, and map outcomes to gRPC statuses: no business
logic, and no import of ``raftwal.node`` (the node imports them).
"""
