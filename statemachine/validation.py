"""Input validation for commands: names, keys, addresses, texts and enum values.

Each check returns ``None`` when the value is acceptable or a ``Rejection`` with code
INVALID_ARGUMENT whose message says what was got and what was expected. Pure functions.
"""

from __future__ import annotations

import re

from rpc.protos import errors_pb2
from statemachine.types import Limits, Rejection

INVALID = errors_pb2.INVALID_ARGUMENT

NAME_CHARSET = "[A-Za-z0-9_.-]"
# Names become file names (a pchannel's WAL directory) and must be one plain path
# component: a letter or digit first, so '.', '..' and hidden names are impossible.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]*: a letter or digit, then letters, digits, '.', '_', '-'"
# Resource keys may also use '/' and ':' so that hierarchical keys ("db/coll:1") work.
_KEY_RE = re.compile(r"[A-Za-z0-9_.\-/:]+")
_ADDRESS_RE = re.compile(r"[A-Za-z0-9_.\-:\[\]]+")


def show(value: object, limit: int = 40) -> str:
    """A short, printable rendering of a bad value for an error message."""
    text = repr(value)
    if len(text) > limit:
        text = text[:limit] + f"...({len(str(value))} chars)"
    return text


def invalid(message: str) -> Rejection:
    return Rejection(INVALID, message)


def check_name(field: str, value: str, limits: Limits) -> Rejection | None:
    if not value:
        return invalid(f"missing {field} (got ''; expected 1..{limits.name_max_chars} chars)")
    if len(value) > limits.name_max_chars:
        return invalid(
            f"{field} too long ({len(value)} chars; expected 1..{limits.name_max_chars})"
        )
    if not _NAME_RE.fullmatch(value):
        return invalid(
            f"invalid {field} ({show(value)}; expected {NAME_RULE}, "
            f"1..{limits.name_max_chars} chars)"
        )
    return None


def is_plain_name(value: str) -> bool:
    """True for a name that can safely be one path component (see NAME_RULE)."""
    return bool(_NAME_RE.fullmatch(value))


def check_key(field: str, value: str, limits: Limits) -> Rejection | None:
    if not value:
        return invalid(
            f"missing {field} (got ''; expected 1..{limits.resource_key_max_chars} chars)"
        )
    if len(value) > limits.resource_key_max_chars:
        return invalid(
            f"{field} too long ({len(value)} chars; expected 1..{limits.resource_key_max_chars})"
        )
    if not _KEY_RE.fullmatch(value):
        return invalid(f"invalid {field} ({show(value)}; expected characters [A-Za-z0-9_.-/:])")
    return None


def check_address(field: str, value: str, limits: Limits) -> Rejection | None:
    if not value:
        return invalid(f"missing {field} (got ''; expected host:port)")
    if len(value) > limits.address_max_chars:
        return invalid(
            f"{field} too long ({len(value)} chars; expected 1..{limits.address_max_chars})"
        )
    if not _ADDRESS_RE.fullmatch(value) or ":" not in value:
        return invalid(f"invalid {field} ({show(value)}; expected host:port)")
    return None


def check_text(field: str, value: str, limits: Limits) -> Rejection | None:
    if len(value) > limits.text_max_chars:
        return invalid(
            f"{field} too long ({len(value)} chars; expected 0..{limits.text_max_chars})"
        )
    if not value.isprintable():
        return invalid(f"invalid {field} ({show(value)}; expected printable text)")
    return None


def check_range(field: str, value: int, low: int, high: int) -> Rejection | None:
    if value < low or value > high:
        return invalid(f"invalid {field} ({value}; expected {low}..{high})")
    return None


def check_enum(field: str, value: int, allowed: dict[int, str]) -> Rejection | None:
    if value not in allowed:
        names = "|".join(allowed.values())
        return invalid(f"invalid {field} ({value}; expected {names})")
    return None


def check_unique(field: str, values: list[str]) -> Rejection | None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            return invalid(f"duplicate {field} ({show(value)}; expected each at most once)")
        seen.add(value)
    return None


def first_error(*checks: Rejection | None) -> Rejection | None:
    for check in checks:
        if check is not None:
            return check
    return None
