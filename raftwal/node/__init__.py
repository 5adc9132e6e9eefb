"""One raftwal node (``raftwal node``): a supervisor of a control process and data workers
(DESIGN.md section 2; docs/architecture.md section 11).

- ``supervisor``: ``run_node``, the process that forks the others, restarts dead data
  workers, passes signals on and takes its children with it when it dies;
- ``process``: ``Node``, the control process's composition root (the Raft peer, the
  coordination replica, the gRPC server with the Coordinator, Cluster and NodeManager
  services, the coordinator loop, the metrics endpoint and the console) and
  ``run_control``; its concerns in ``proposing`` (proposals and linearizable reads),
  ``reporting`` (member and cluster status), ``liveness`` (heartbeats, suspicions),
  ``handover`` (planned stops) and ``voters`` (Raft membership changes);
- ``worker``: ``WorkerNode``, a data worker's composition root (StreamingNode and
  Replication services, the transfer port, the data plane of the pchannels placed on it,
  the replicators) and ``run_worker``;
- ``planes``: the links between the control process and its workers (the state down,
  proposals and status up); ``notify``: the applied notifier; ``cluster_view``: the
  cluster's nodes as a process sees them; ``status``: processes' CPU and memory;
  ``trim``: memory trimming;
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
through Protocols that ``Node`` and ``WorkerNode`` implement.
"""
