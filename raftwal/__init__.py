"""raftwal's process and tools, one subpackage per concern (imports point down this list):

- ``raftwal.cli``: the ``raftwal`` command line, the local dev cluster, dev certificates and
  the demo. May import everything below.
- ``raftwal.chaos``: the nemesis, its network proxies, the workload and the checker. Talks
  to a cluster only through the public SDK (``rpc``) and the dev-cluster helpers
  (``raftwal.cli.dev``), like any other client.
- ``raftwal.node``: one node process: the composition root (``raftwal.node.process``),
  configuration, security, metrics, fault points, proposal batching and the coordinator
  loop. The only place that wires every plane together.
- ``raftwal.services``: the gRPC servicers, one module per service. Each depends on a narrow
  ``typing.Protocol`` (``raftwal.services.backend`` and the coordinator servicer's own
  ``CoordinationBackend``) that the node implements, never on the node itself; below them
  are ``wal_segments``, ``raft``, ``statemachine`` and ``rpc.protos``.

``tests/unit/test_layering.py`` enforces these directions, with no import cycles.
"""

__version__ = "0.1.0"
