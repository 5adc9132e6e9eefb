"""Import direction: wal_segments (its walimpls subpackage included) never imports raft or raftwal,
and of our packages only rpc.protos (wire records) and rpc.aio (asyncio helpers that import
nothing of ours, shared with the SDK rather than copied)."""

from __future__ import annotations

import ast
from pathlib import Path

import wal_segments

OURS = {"raft", "raftwal", "rpc", "statemachine", "spark_connector"}
ALLOWED = {"rpc.protos", "rpc.aio"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_wal_segments_imports_only_allowed_packages():
    package = Path(wal_segments.__file__).parent
    modules = sorted(package.rglob("*.py"))
    assert len(modules) >= 5
    for module in modules:
        for name in _imports(module):
            top = name.split(".")[0]
            if top in OURS:
                assert name in ALLOWED or name.startswith("rpc.protos."), (module, name)


def test_rpc_aio_imports_nothing_of_ours():
    path = Path(wal_segments.__file__).parent.parent / "rpc" / "aio.py"
    assert not {n for n in _imports(path) if n.split(".")[0] in OURS}
