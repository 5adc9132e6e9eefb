"""One raftwal node = one process (``raftwal node``).

- ``process``: ``Node``, the composition root: the Raft peer, the coordination replica, the
  data plane, the gRPC server with every servicer, the coordinator loop and the metrics
  endpoint, wired together; ``run_node``;
- ``config``: the TOML configuration and its validation;
- ``security``: TLS, bearer tokens with roles, the authentication interceptor;
- ``metrics`` and ``metrics_http``: Prometheus metrics and their bounded HTTP endpoint;
- ``faults``: fault points for tests (off unless RAFTWAL_ENABLE_FAULTS=1);
- ``proposals``: coalescing of coordination proposals;
- ``coordinator``: the loop that runs on the Raft leader (liveness, balancing, failover,
  broadcasts);
- ``data_plane``: the glue between the coordination state and ``wal_segments`` (the view of
  assignments and terms, the proposer, the replication transport, the reconcile loop).

Servicers (``raftwal.services``) never import this package: they get what they need
through Protocols that ``Node`` implements.
"""
