"""Deliberate bugs that the simulation's mutation suite switches on, one at a time
(``raftwal simulate --mutation NAME``), to show that the simulated world finds them.

A mutation is declared beside the code it breaks, at module level::

    SELF_FENCE_MAJORITY = mutations.declare(
        "self-fence-majority", "the owner takes its own fence answer as a majority"
    )

and that code asks for it at the exact point it breaks::

    if mutations.active(SELF_FENCE_MAJORITY):
        ...  # the broken rule

So a refactor that moves or deletes the code moves or deletes the switch with it, and
``tests/sim/test_mutations.py`` checks that every declared name is still asked for in the
module that declared it and is caught within its seed budget.

Production never turns a mutation on: only ``enabled`` does, and only the simulation
(``raftwal.sim``) calls it. ``active`` is a membership test of an empty frozenset then.

What must never happen here: an import of anything of ours, any I/O.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    # What the mutation breaks, in one sentence.
    description: str
    # The module that declared it (where `active(name)` must be asked).
    module: str


_DECLARED: dict[str, Mutation] = {}
_ACTIVE: frozenset[str] = frozenset()


def declare(name: str, description: str) -> str:
    """Declare mutation `name` in the calling module; returns `name` for `active`."""
    module = sys._getframe(1).f_globals.get("__name__", "?")  # noqa: SLF001
    known = _DECLARED.get(name)
    if known is not None and known.module != module:
        raise AssertionError(f"mutation {name!r} declared in {known.module} and in {module}")
    _DECLARED[name] = Mutation(name, description, module)
    return name


def active(name: str) -> bool:
    """Whether mutation `name` is switched on (never, outside the simulation)."""
    return name in _ACTIVE


def declared() -> dict[str, Mutation]:
    """Every declared mutation by name (the modules that declare them must be imported)."""
    return dict(_DECLARED)


@contextlib.contextmanager
def enabled(names: Iterable[str]) -> Iterator[None]:
    """Switch `names` on for the duration (the simulation only); unknown names raise
    ValueError."""
    global _ACTIVE
    wanted = frozenset(names)
    unknown = sorted(wanted - set(_DECLARED))
    if unknown:
        raise ValueError(f"unknown mutation(s) {unknown} (expected some of {sorted(_DECLARED)})")
    saved = _ACTIVE
    _ACTIVE = saved | wanted
    try:
        yield
    finally:
        _ACTIVE = saved
