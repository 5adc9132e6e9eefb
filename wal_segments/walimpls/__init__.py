"""WAL implementations behind one contract (builder -> opener -> WAL -> scanner), looked
up by name: ``segments`` (default), ``local``, ``jetstream``. See `api` for the contract,
`registry` for the names, docs/architecture.md section 12 for the design.

What must never happen here: an import of `raft` or `raftwal`."""

from wal_segments.walimpls.api import (
    DEFAULT_WAL,
    WAL,
    ConfigError,
    Corrupt,
    FencedByTerm,
    Opener,
    OpenerBuilder,
    Record,
    Scanner,
    Tail,
    Unavailable,
    WalImplError,
)

__all__ = [
    "DEFAULT_WAL",
    "WAL",
    "ConfigError",
    "Corrupt",
    "FencedByTerm",
    "Opener",
    "OpenerBuilder",
    "Record",
    "Scanner",
    "Tail",
    "Unavailable",
    "WalImplError",
]
