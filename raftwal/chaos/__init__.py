"""``raftwal chaos``: a Jepsen-style run against a real three-node cluster.

- ``runner``: the options, the nemesis (kill -9, SIGSTOP, restart, partitions) and the run;
- ``net``: the TCP proxies that every link goes through, so the nemesis can cut them;
- ``workload``: the clients (producers, consumers, broadcasts, leases and locks) and the
  history of what they were told;
- ``checker``: the properties checked against that history.

It talks to the cluster only through the public SDK (``rpc``) and the dev-cluster helpers
(``raftwal.cli.dev``), and reads segment files with ``wal_segments.segment`` to check them:
never through the node's own modules.
"""
