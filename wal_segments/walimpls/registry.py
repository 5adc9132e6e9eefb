"""WAL implementations by name: ``segments`` (the default), ``local`` and ``jetstream``.

An implementation registers its `OpenerBuilder` under its name (`register`); the data
plane looks builders up by the name the coordination state records for each pchannel
(`PChannel.wal`), and `raftwal wal alter` validates its target and configuration here
first. ``jetstream`` is imported on first use, so a node that never uses it never imports
nats-py.

What must never happen here: two builders under one name, or an import of `raft` or
`raftwal`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping

from wal_segments.walimpls.api import DEFAULT_WAL, ConfigError, OpenerBuilder
from wal_segments.walimpls.files import LOCAL, SEGMENTS

_BUILDERS: dict[str, OpenerBuilder] = {}
# name -> module that registers it when imported
_LAZY = {"jetstream": "wal_segments.walimpls.jetstream"}
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


def register(builder: OpenerBuilder) -> None:
    if not NAME_RE.fullmatch(builder.name):
        raise ValueError(f"invalid WAL implementation name {builder.name!r}")
    existing = _BUILDERS.get(builder.name)
    if existing is not None and existing is not builder:
        raise ValueError(f"a WAL implementation named {builder.name!r} is registered already")
    _BUILDERS[builder.name] = builder


def names() -> list[str]:
    return sorted({*_BUILDERS, *_LAZY})


def builder(name: str) -> OpenerBuilder:
    """The builder registered as `name` (an empty name is the default); ConfigError for an
    unknown one."""
    name = name or DEFAULT_WAL
    if name not in _BUILDERS and name in _LAZY:
        try:
            importlib.import_module(_LAZY[name])
        except ImportError as error:
            raise ConfigError(
                f"the {name} WAL implementation cannot load ({error.name or error}; expected "
                "its client library installed)"
            ) from None
    found = _BUILDERS.get(name)
    if found is None:
        raise ConfigError(
            f"unknown WAL implementation {name[:64]!r} (expected one of {', '.join(names())})"
        )
    return found


def validate(name: str, config: Mapping[str, str]) -> dict[str, str]:
    """`name`'s configuration with its defaults; ConfigError for a bad name or config."""
    return builder(name).validate(config)


register(SEGMENTS)
register(LOCAL)
