"""The pure coordination core of raftwal.

Everything the Raft-replicated coordination service decides lives here, as two pure
functions over protobuf values:

- ``decide(state, command, ctx) -> list[Event] | Rejection``: validation and what happened;
- ``evolve(state, event) -> state``: the only way the state changes.

``apply_command`` wraps them for the Raft layer (decode, request-id deduplication, replies),
``balancer.plan`` is the pure placement policy, ``invariants.check`` states what must always
hold. This package must never read a clock, randomness, the environment, files or the
network, start threads, or import anything of ours but ``rpc.protos`` generated messages:
every node applies the same commands and must compute byte-identical events
(``tests/unit/test_purity.py`` enforces the imports).
"""

from statemachine.apply import apply_command, apply_events, apply_log_entry
from statemachine.decider import decide
from statemachine.evolve import evolve
from statemachine.state import (
    STATE_FORMAT_VERSION,
    copy_state,
    new_state,
    restore_state,
    snapshot_state,
    state_digest,
)
from statemachine.types import DEFAULT_LIMITS, Context, Limits, Rejection

__all__ = [
    "DEFAULT_LIMITS",
    "STATE_FORMAT_VERSION",
    "Context",
    "Limits",
    "Rejection",
    "apply_command",
    "apply_events",
    "apply_log_entry",
    "copy_state",
    "decide",
    "evolve",
    "new_state",
    "restore_state",
    "snapshot_state",
    "state_digest",
]
