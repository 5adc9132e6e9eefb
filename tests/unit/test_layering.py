"""The layering of raftwal's packages, checked on the source (docs/development.md, "Layout"):

    raftwal.cli  ->  raftwal.node  ->  raftwal.services  ->  {wal_segments, raft, statemachine}
                                                          ->  rpc.protos
    raftwal.chaos -> the public SDK (rpc) and the dev-cluster helpers (raftwal.cli.dev)
    raftwal.sim   -> raftwal.node's data-plane glue and raftwal.services (the code it
                     simulates), and the lower layers
    rpc (SDK)     -> rpc only;   spark_connector -> rpc, wal_segments

Every import counts: at module level, inside functions, and under ``if TYPE_CHECKING:``.
There must be no import cycle among our modules at all. statemachine's purity and
wal_segments' own rules have their tests (test_purity.py, tests/wal/test_wal_imports.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("raftwal", "rpc", "raft", "wal_segments", "statemachine", "spark_connector")

# What each layer may import, besides itself (prefixes of module names).
_LOWER = (
    "wal_segments",
    "raft",
    "statemachine",
    "rpc.protos",
    "rpc.errors",
    "rpc.aio",
    # which data worker of a node holds a pchannel (the SDK and Spark compute it too)
    "rpc.placement",
    # the segment transfer protocol's constants (the reader's side lives there too)
    "rpc.segment_transfer",
    # the Append stream's framing over the same port (the owner's side lives there too)
    "rpc.append_stream",
    # the Produce stream's constants over the same port (the producer's side is the SDK's)
    "rpc.produce_stream",
)
ALLOWED: dict[str, tuple[str, ...]] = {
    "raftwal.services": ("raftwal.services", *_LOWER),
    "raftwal.node": (
        "raftwal.node",
        "raftwal.services",
        "rpc.credentials",
        # The replicator is a client of another cluster: it finds the target pchannel's
        # owner as any SDK client does (raftwal/node/replicator.py).
        "rpc.streaming.routing",
        # ... and sends its batches over a Produce stream as producers do.
        "rpc.streaming.producer",
        *_LOWER,
    ),
    "raftwal.chaos": (
        "raftwal.chaos",
        "raftwal.cli.dev",
        "rpc",
        "spark_connector",
        # The checker reads the segment files the nodes wrote, as any reader could.
        "wal_segments.segment",
        # ... and tells the WAL's own control entries from produced ones by their flags.
        "wal_segments.format",
    ),
    "raftwal.cli": ("raftwal", "rpc", "raft", "wal_segments", "statemachine", "spark_connector"),
    # The simulation runs the node's real data plane and Replication servicer.
    "raftwal.sim": (
        "raftwal.sim",
        "raftwal.node.data_plane",
        "raftwal.services",
        *_LOWER,
    ),
    "rpc": ("rpc",),
    "spark_connector": ("spark_connector", "rpc", "wal_segments"),
    "raft": ("raft", "statemachine", "rpc.protos", "rpc.aio"),
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "protos" in path.relative_to(ROOT).parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _resolve(name: str) -> str:
    """The module of ours that `name` denotes (rpc.protos.* count as rpc.protos)."""
    if name.startswith("rpc.protos"):
        return "rpc.protos"
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _absolute(module: str, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    package = module.split(".")
    if MODULES[module].name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str, source: str | None = None) -> set[str]:
    """Every module of ours that `module` imports, anywhere in its file."""
    text = source if source is not None else MODULES[module].read_text()
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name) for alias in node.names if _ours(alias.name))
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            if not target or not _ours(target):
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in MODULES else _resolve(target))
    found.discard(module)
    found.discard("")
    return found


def _graph() -> dict[str, set[str]]:
    return {module: imports_of(module) for module in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (as a path that starts and ends on the same module)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def _layer(module: str) -> str | None:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or module.startswith(f"{layer}."):
            return layer
    return None


def violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in sorted(graph.items()):
        layer = _layer(module)
        if layer is None:
            continue
        for target in sorted(targets):
            if target == "raftwal" and module.startswith("raftwal."):
                continue  # the version string
            if not any(target == p or target.startswith(f"{p}.") for p in ALLOWED[layer]):
                wrong.append(
                    f"{module} imports {target} (a {layer} module may import only {ALLOWED[layer]})"
                )
    return wrong


def test_the_tree_has_the_subpackages_the_readme_describes() -> None:
    for package in ("raftwal.cli", "raftwal.node", "raftwal.services", "raftwal.chaos"):
        assert package in MODULES, package
    servicers = {m for m in MODULES if m.startswith("raftwal.services.")}
    assert {
        "raftwal.services.coordinator",
        "raftwal.services.streaming_node",
        "raftwal.services.replication",
        "raftwal.services.cluster",
        "raftwal.services.node_manager",
    } <= servicers
    # rpc/ holds the wire contract and the client SDK only: no servicer.
    rpc_sources = "\n".join(p.read_text() for m, p in MODULES.items() if m.split(".")[0] == "rpc")
    assert "Servicer)" not in rpc_sources


def test_every_layer_imports_only_what_it_may() -> None:
    wrong = violations(_graph())
    assert not wrong, "\n".join(wrong)


def test_there_is_no_import_cycle() -> None:
    cycle = find_cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


def _graph_with(module: str, extra_source: str) -> dict[str, set[str]]:
    graph = _graph()
    graph[module] = graph[module] | imports_of(module, extra_source)
    return graph


@pytest.mark.parametrize(
    ("module", "source"),
    [
        # A servicer reaching up to the node, as they did before they had Protocols.
        (
            "raftwal.services.streaming_node",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from raftwal.node.process import Node\n",
        ),
        # The SDK importing a servicer, a function-level import counts too.
        ("rpc.credentials", "def f():\n    from raftwal.services import coordinator\n"),
        # chaos using the node's modules instead of the dev helpers.
        ("raftwal.chaos.net", "from raftwal.node.config import NodeConfig\n"),
    ],
)
def test_the_checks_catch_a_wrong_import(module: str, source: str) -> None:
    assert violations(_graph_with(module, source))


def test_the_cycle_check_catches_a_type_checking_cycle() -> None:
    graph = _graph_with(
        "raftwal.node.coordinator",
        "if TYPE_CHECKING:\n    from raftwal.node.process import Node\n",
    )
    assert find_cycle(graph) is not None


def test_relative_imports_are_resolved() -> None:
    found = imports_of("raftwal.services.cluster", "from .backend import ClusterBackend\n")
    assert found == {"raftwal.services.backend"}
    found = imports_of("raftwal.node", "from ..services import common\n")
    assert found == {"raftwal.services.common"}
