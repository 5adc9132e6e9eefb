"""Milestones of a coordination write inside the nodes, for `bench/write_trace.py` (never
loaded by a deployment).

Python imports `sitecustomize` at start-up from the path; `bench/write_trace.py` puts this
directory on the nodes' PYTHONPATH and sets `RAFTWAL_WRITE_TRACE` (a directory). Each node
process then appends one line per milestone to `<dir>/<node id>.txt`: the CLOCK_MONOTONIC
time in ns (one clock for every process on the host), the node id and the milestone.
Wrapping costs a few microseconds per milestone, so the trace adds a little to every step.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Any

_DIRECTORY = os.environ.get("RAFTWAL_WRITE_TRACE")


def _install(directory: str) -> None:
    import raft._pysyncobj_glue as glue
    import raft.journal as journal
    import raft.peer as peer
    import raftwal.services.coordinator as coordinator

    node = sys.argv[sys.argv.index("--id") + 1]
    out = open(os.path.join(directory, f"{node}.txt"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    lock = threading.Lock()

    def mark(tag: str) -> None:
        now = time.monotonic_ns()
        with lock:
            out.write(f"{now} {node} {tag}\n")

    def wrap_async(cls: type, name: str, before: str, after: str) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            mark(before)
            try:
                return await original(*args, **kwargs)
            finally:
                mark(after)

        setattr(cls, name, wrapper)

    def wrap(cls: type, name: str, before: str, after: str = "", when: Any = None) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            traced = when is None or when(*args, **kwargs)
            if traced:
                mark(before)
            try:
                return original(*args, **kwargs)
            finally:
                if traced and after:
                    mark(after)

        setattr(cls, name, wrapper)

    def carries_entries(_self: Any, _node: Any, message: Any) -> bool:
        return (
            type(message) is dict
            and message.get("type") == "append_entries"
            and bool(message.get("entries"))
        )

    def is_answer(_self: Any, _node: Any, message: Any) -> bool:
        return type(message) is dict and message.get("type") == "next_node_idx"

    for method in ("Lock", "Unlock", "DescribeChannels"):
        wrap_async(coordinator.CoordinatorServicer, method, "rpc_start", "rpc_end")
    wrap_async(peer.RaftPeer, "propose_async", "propose_start", "propose_end")
    wrap(peer.RaftPeer, "_submit", "submit")
    wrap(peer.RaftPeer, "_apply_entry", "apply_start", "apply_end")
    wrap(peer.RaftPeer, "_on_command_result", "result")
    wrap(peer.LoopMailbox, "_drain", "loop_drain")
    wrap(glue.DurableTransport, "send", "entries_sent", when=carries_entries)
    wrap(glue.DurableTransport, "send_now", "answer_sent", when=is_answer)
    wrap(glue.DurableTransport, "_onMessageReceived", "entries_received", when=carries_entries)
    wrap(glue.DurableTransport, "_onMessageReceived", "answer_received", when=is_answer)
    wrap(
        journal.DurableJournal,
        "sync",
        "fsync_start",
        "fsync_end",
        when=lambda self: self.has_unsynced(),
    )


EXPERIMENTS = ("no-events-db", "switch-interval-0.5ms", "yield-before-sends")


def _experiment(name: str) -> None:
    """One change of the nodes' behaviour, to measure what it would save (never safe to
    run a cluster with: `no-events-db` drops the event history)."""
    if name == "no-events-db":
        import raft.events as events

        events.EventStore.append = lambda self, batch: None  # type: ignore[method-assign]
    elif name == "switch-interval-0.5ms":
        sys.setswitchinterval(0.0005)
    elif name == "yield-before-sends":
        # The tick thread gives the GIL away before it sends this tick's AppendEntries
        # (the commit index, after an apply), so the event loop can answer first.
        import raft.peer as peer

        original = peer.RaftPeer._before_poll

        def before_poll(self: Any) -> None:
            time.sleep(0)
            original(self)

        peer.RaftPeer._before_poll = before_poll  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown write-trace experiment {name!r} (expected one of {EXPERIMENTS})")


if _DIRECTORY and "node" in sys.argv and "--id" in sys.argv:
    _install(_DIRECTORY)
    _EXPERIMENT = os.environ.get("RAFTWAL_WRITE_TRACE_EXPERIMENT")
    if _EXPERIMENT:
        _experiment(_EXPERIMENT)
