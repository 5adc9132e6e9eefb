"""The role file and the role a node takes from the leader's voter set
(raftwal/node/membership.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from raftwal.node.membership import ROLE_FILE, RoleFileError, load_role, store_role, wanted_role


def test_the_configured_role_until_one_is_stored(tmp_path: Path) -> None:
    assert load_role(tmp_path, "data") == "data"
    store_role(tmp_path, "voter")
    assert load_role(tmp_path, "data") == "voter"
    assert stat.S_IMODE((tmp_path / ROLE_FILE).stat().st_mode) == 0o600
    store_role(tmp_path, "data")
    assert load_role(tmp_path, "voter") == "data"
    with pytest.raises(ValueError, match="expected one of"):
        store_role(tmp_path, "leader")


@pytest.mark.parametrize("content", [b"", b"{", b'{"rol": "voter"}', b'{"role": "boss"}', b"[]"])
def test_a_bad_role_file_refuses_to_start_with_what_it_found(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / ROLE_FILE).write_bytes(content)
    with pytest.raises(RoleFileError, match="role.json"):
        load_role(tmp_path, "voter")


def test_only_a_settled_voter_set_gives_a_role() -> None:
    assert wanted_role("n4", ["n1", "n2", "n3", "n4"], settled=True) == "voter"
    assert wanted_role("n1", ["n2", "n3", "n4"], settled=True) == "data"
    assert wanted_role("n1", ["n2", "n3", "n4"], settled=False) is None
    # No set (a leader that sent none): no answer, no switch.
    assert wanted_role("n1", [], settled=True) is None
