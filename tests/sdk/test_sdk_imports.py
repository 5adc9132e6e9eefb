"""The SDK's import graph: no cycle among the modules of ``rpc/`` (the generated wire
contract, ``rpc/protos``, aside), and the modules every client builds on import no client.

The check parses the source with ``ast``, so an import counts wherever it is written: at
module level, inside a function, under ``if TYPE_CHECKING:``; ``importlib.import_module``
and ``__import__`` with a literal name count too, and no module may define a module-level
``__getattr__`` (the lazy-import trick that once hid ``rpc.client`` -> ``rpc.sync_client``
-> ``rpc.client``). Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first,
so it counts as importing those packages too; ``from a.b import c`` counts as importing the
module ``a.b.c`` when there is one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RPC = ROOT / "rpc"
GENERATED = "rpc.protos"

#: Modules that are (or re-export) a client; the foundations below must import none of them.
FACADES = {"rpc.client", "rpc.streaming_client", "rpc.sync_client"}
CLIENT_IMPLEMENTATIONS = {
    "rpc.coordinator_client",
    "rpc.streaming.client",
    "rpc.streaming.consumer",
    "rpc.streaming.producer",
    "rpc.streaming.routing",
    "rpc.streaming.txn",
}
CLIENT_MODULES = FACADES | CLIENT_IMPLEMENTATIONS
#: What every client imports: typed errors, and failure classification, streams, retries.
FOUNDATIONS = ("rpc.errors", "rpc.routing")

# A source, and whether it is a package's __init__.py (relative imports start from it).
Sources = dict[str, tuple[str, bool]]


def rpc_sources(root: Path = ROOT) -> Sources:
    """Every module under ``root/rpc`` except the generated ``rpc/protos``."""
    sources: Sources = {}
    for path in sorted((root / "rpc").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        if name == GENERATED or name.startswith(GENERATED + "."):
            continue
        sources[name] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def _with_packages(name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``: importing it runs all three."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def _literal_import(node: ast.Call) -> str | None:
    """The module named by ``importlib.import_module("x")`` / ``__import__("x")``."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every module name that importing `module` may import, wherever the import is written
    (relative imports resolved; a ``from`` import's names included, in case they are
    submodules)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.update(_with_packages(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.update(_with_packages(base))
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            literal = _literal_import(node)
            if literal is not None:
                names.update(_with_packages(literal))
    return names


def import_graph(sources: Sources) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports."""
    return {
        module: {name for name in imported_names(source, module, is_package) if name in sources}
        - {module}
        for module, (source, is_package) in sources.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph[module]):
            if target in on_path:
                return path[path.index(target) :] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done:
            cycle = visit(module)
            if cycle is not None:
                return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing `start` imports, directly or not."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in graph[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


# ---------------------------------------------------------------------------------------
# The SDK as it is
# ---------------------------------------------------------------------------------------


def test_the_sdk_has_the_expected_modules() -> None:
    modules = set(rpc_sources())
    assert modules >= CLIENT_MODULES | set(FOUNDATIONS) | {"rpc", "rpc.streaming"}


def test_the_rpc_modules_import_no_cycle() -> None:
    cycle = find_cycle(import_graph(rpc_sources()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("foundation", FOUNDATIONS)
def test_errors_and_routing_import_no_client(foundation: str) -> None:
    graph = import_graph(rpc_sources())
    assert foundation in graph, f"{foundation} is missing"
    clients = reachable(graph, foundation) & CLIENT_MODULES
    assert clients == set(), f"{foundation} imports client modules: {sorted(clients)}"


def test_the_data_plane_parts_depend_only_on_the_base() -> None:
    """Producer, consumer and txn build on ``rpc.streaming.routing``, never on the module
    whose factories build them; the routing module on none of them."""
    graph = import_graph(rpc_sources())
    parts = {"rpc.streaming.producer", "rpc.streaming.consumer", "rpc.streaming.txn"}
    assert reachable(graph, "rpc.streaming.routing") & (parts | {"rpc.streaming.client"}) == set()
    for part in parts:
        assert "rpc.streaming.client" not in reachable(graph, part), part


def test_no_implementation_imports_a_facade() -> None:
    """The facades re-export; only another facade (``rpc.sync_client`` wraps
    ``rpc.client``) may import one."""
    graph = import_graph(rpc_sources())
    for module in sorted(set(graph) - FACADES):
        assert graph[module] & FACADES == set(), f"{module} imports {graph[module] & FACADES}"


def test_no_module_defines_a_module_getattr() -> None:
    for module, (source, _) in sorted(rpc_sources().items()):
        names = {
            node.name
            for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        assert "__getattr__" not in names, f"{module} defines a module-level __getattr__"


# ---------------------------------------------------------------------------------------
# The checker itself
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a_imports_b",
    [
        "import rpc.b",
        "from rpc import b",
        "from rpc.b import thing",
        "from . import b",
        "from .b import thing",
        "def f():\n    from rpc.b import thing",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rpc.b import Thing",
        "def __getattr__(name):\n    import rpc.b\n    return rpc.b",
        "import importlib\nb = importlib.import_module('rpc.b')",
        "b = __import__('rpc.b')",
    ],
)
def test_the_checker_sees_every_kind_of_import(a_imports_b: str) -> None:
    sources: Sources = {
        "rpc": ("", True),
        "rpc.a": (a_imports_b, False),
        "rpc.b": ("def g():\n    from rpc.a import other", False),
    }
    assert find_cycle(import_graph(sources)) is not None, a_imports_b


def test_the_checker_resolves_relative_imports_in_packages() -> None:
    sources: Sources = {
        "rpc": ("", True),
        "rpc.pkg": ("from . import mod\nfrom .. import top", True),
        "rpc.pkg.mod": ("from ..top import x\nfrom . import sibling", False),
        "rpc.pkg.sibling": ("", False),
        "rpc.top": ("", False),
    }
    graph = import_graph(sources)
    assert graph["rpc.pkg"] == {"rpc", "rpc.pkg.mod", "rpc.top"}
    assert graph["rpc.pkg.mod"] == {"rpc", "rpc.pkg", "rpc.pkg.sibling", "rpc.top"}
    # A submodule's package runs first: a package importing its own submodule that
    # imports the package back through it is a cycle.
    assert find_cycle(graph) == ["rpc.pkg", "rpc.pkg.mod", "rpc.pkg"]


def test_the_checker_accepts_a_layered_graph() -> None:
    sources: Sources = {
        "rpc": ("", True),
        "rpc.errors": ("from rpc.protos import errors_pb2", False),
        "rpc.routing": ("from rpc.errors import E", False),
        "rpc.client": ("from rpc.routing import r\nfrom rpc.errors import E", False),
    }
    graph = import_graph(sources)
    assert find_cycle(graph) is None
    assert reachable(graph, "rpc.client") == {"rpc", "rpc.errors", "rpc.routing"}
