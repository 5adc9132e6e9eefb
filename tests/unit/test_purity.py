"""The pure core stays pure: ``statemachine/`` imports no clock, randomness, I/O or our packages.

Every replica must compute byte-identical events from the same commands, so nothing under
``statemachine/`` may read a clock, draw randomness, touch files, sockets, threads or the
environment, or import another of our packages (only ``rpc.protos`` generated messages and
``statemachine`` itself). The check parses the source with ``ast``, so it also sees imports
inside functions and ``if TYPE_CHECKING`` blocks, and dynamic imports (``__import__``,
``importlib``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "statemachine"

FORBIDDEN_MODULES = {
    "time",
    "random",
    "uuid",
    "threading",
    "asyncio",
    "socket",
    "os",
    "grpc",
    "pysyncobj",
    "subprocess",
    "datetime",
    "secrets",
    "multiprocessing",
    "sqlite3",
    "pathlib",
    "io",
    # Not in the brief's list but the same kind of thing: other routes to the outside world.
    "importlib",
    "signal",
    "shutil",
    "tempfile",
    "concurrent",
    "selectors",
    "urllib",
    "http",
}
# Our top-level packages (every directory of the repository with an __init__.py, plus the
# ones the design names even if absent); statemachine may import only these two of ours.
OUR_PACKAGES = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {
    "raft",
    "raftwal",
    "rpc",
    "spark_connector",
    "statemachine",
    "tests",
    "wal_segments",
    "bench",
}
ALLOWED_OURS = ("rpc.protos", "statemachine")
FORBIDDEN_CALLS = {"__import__", "open", "input", "eval", "exec", "compile", "breakpoint"}


def _is_allowed_ours(module: str) -> bool:
    return any(module == allowed or module.startswith(allowed + ".") for allowed in ALLOWED_OURS)


def _check_module(module: str, line: int, problems: list[str]) -> None:
    top = module.split(".")[0]
    if top in FORBIDDEN_MODULES:
        problems.append(f"line {line}: imports {module} (forbidden in the pure core)")
    elif top in OUR_PACKAGES and not _is_allowed_ours(module):
        problems.append(f"line {line}: imports {module} (only rpc.protos and statemachine)")


def forbidden_imports(source: str, package: str = "statemachine") -> list[str]:
    """Problems in `source` (a module of `package`): forbidden imports and dynamic ones."""
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _check_module(alias.name, node.lineno, problems)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative: level 1 is the package itself, anything higher leaves it.
                if node.level > 1:
                    problems.append(f"line {node.lineno}: relative import leaves {package}")
                    continue
                base = package + (f".{node.module}" if node.module else "")
            else:
                base = node.module or ""
            if base == "rpc":
                # `from rpc import protos` is fine, `from rpc import errors` is not.
                for alias in node.names:
                    _check_module(f"rpc.{alias.name}", node.lineno, problems)
            else:
                _check_module(base, node.lineno, problems)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            problems.append(f"line {node.lineno}: calls {node.func.id}()")
    return problems


def core_files() -> list[Path]:
    return sorted(CORE.glob("*.py"))


def test_the_core_has_the_expected_modules() -> None:
    names = {path.name for path in core_files()}
    assert {"__init__.py", "apply.py", "decider.py", "evolve.py", "state.py"} <= names


@pytest.mark.parametrize("path", core_files(), ids=lambda path: path.name)
def test_core_module_imports_nothing_impure(path: Path) -> None:
    problems = forbidden_imports(path.read_text(encoding="utf-8"))
    assert problems == [], f"{path.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize(
    "snippet",
    [
        "import time",
        "import os.path",
        "from datetime import datetime",
        "from random import Random",
        "import uuid as u",
        "def f():\n    import threading",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio",
        "import pysyncobj",
        "from grpc import aio",
        "from pathlib import Path",
        "import io",
        "import sqlite3",
        "import secrets",
        "import multiprocessing.pool",
        "import subprocess",
        "import socket",
        "import raft",
        "from raft.node import Peer",
        "from wal_segments import store",
        "import raftwal.cli",
        "from spark_connector import source",
        "from rpc import errors",
        "import raftwal.services.coordinator",
        "from rpc.errors import to_status",
        "from .. import raft",
        "importlib = __import__('importlib')",
        "x = open('f')",
    ],
)
def test_checker_catches_forbidden_imports(snippet: str) -> None:
    assert forbidden_imports(snippet) != [], snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "from rpc.protos import coordination_pb2 as pb",
        "import rpc.protos.errors_pb2",
        "from rpc import protos",
        "from statemachine.types import Limits",
        "from . import decider",
        "from .validation import invalid",
        "import hashlib, re",
        "from collections.abc import Iterable",
        "from dataclasses import dataclass",
        "from __future__ import annotations",
        "from google.protobuf.message import DecodeError",
    ],
)
def test_checker_allows_pure_imports(snippet: str) -> None:
    assert forbidden_imports(snippet) == [], snippet
