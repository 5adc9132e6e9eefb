"""Names become directories only as one plain path component under the WAL's root: the
storage layer checks again what the coordination state already validated."""

from __future__ import annotations

from pathlib import Path

import pytest

from wal_segments.plane import UnsafePath, path_under


@pytest.mark.parametrize("name", [".", "..", "", "a/b", "../x", ".hidden", "-x", "a\x00b"])
def test_names_that_are_not_one_plain_component_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafePath):
        path_under(tmp_path, name)
    assert list(tmp_path.iterdir()) == []


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "wal", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "wal_0").symlink_to(outside)
    with pytest.raises(UnsafePath, match="resolves outside"):
        path_under(root, "wal_0")


def test_plain_names_stay_under_the_root(tmp_path: Path) -> None:
    assert path_under(tmp_path, "wal_0") == tmp_path / "wal_0"
    assert path_under(tmp_path, "a.b-c_d") == tmp_path / "a.b-c_d"
