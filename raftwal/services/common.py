"""Helpers shared by the servicers: the error a servicer raises (a ``RaftwalError`` that
``_unary``/``_abort`` map to a gRPC status with an ErrorInfo).

Must never import ``raftwal.node`` or hold state.
"""

from __future__ import annotations

from rpc.errors import RaftwalError, error_info


def fail(code: int, message: str, **hints: object) -> RaftwalError:
    """The error a servicer raises: `code` and `message` (what was got, what was expected),
    with optional hints (leader_hint, current_term, owner_hint)."""
    return RaftwalError(error_info(code, message, **hints))  # type: ignore[arg-type]
