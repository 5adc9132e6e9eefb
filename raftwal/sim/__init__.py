"""``raftwal simulate``: the WAL replication protocol (the real owner, log and replication
handlers) on a simulated clock, network and disk, one seed one history. See
``raftwal.sim.world`` (the history and its checks) and ``raftwal.sim.runtime`` (the
deterministic loop and the disk that loses unsynced writes)."""
