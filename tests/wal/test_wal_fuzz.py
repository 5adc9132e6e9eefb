"""Fuzz: flipped bytes and truncations of sealed and unsealed segment files.

Whatever the damage, readers raise SegmentCorrupted or (unsealed files, and sealed files
whose footer was cut) recover a clean prefix by torn-tail truncation; they never raise
anything else and never return an entry whose bytes differ from what was written.
Deterministic (derandomized, bounded examples) so a failure replays.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.wal.segment_helpers import PCHANNEL, VCHANNEL_NAMES, varied_entries, write_segment
from wal_segments.segment import SegmentCorrupted, SegmentReader, open_segment, read_unsealed

FUZZ = settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

damage = st.fixed_dictionaries(
    {
        "count": st.integers(min_value=1, max_value=12),
        "flips": st.lists(
            st.tuples(st.floats(min_value=0, max_value=1), st.integers(1, 255)),
            max_size=3,
        ),
        "cut": st.none() | st.floats(min_value=0, max_value=1),
    }
)


def _damaged(original: bytes, flips, cut) -> bytes:
    data = bytearray(original)
    for fraction, mask in flips:
        data[min(int(fraction * len(data)), len(data) - 1)] ^= mask
    if cut is not None:
        del data[int(cut * len(data)) :]
    return bytes(data)


def _check_prefix(path: Path, entries) -> None:
    """open_segment recovers (or raises SegmentCorrupted); what it keeps is a prefix."""
    try:
        recovered = open_segment(path)
    except SegmentCorrupted:
        return
    if recovered.sealed:
        # The trailer and footer held; the sealed reader checks every block.
        try:
            with SegmentReader.open(path) as reader:
                assert list(reader) == entries[: reader.entry_count]
                batch = reader.to_arrow(PCHANNEL, VCHANNEL_NAMES)
                assert batch.column("payload").to_pylist() == [
                    e.payload for e in entries[: reader.entry_count]
                ]
        except SegmentCorrupted:
            pass
        return
    kept = list(read_unsealed(path))
    assert kept == entries[: len(kept)]
    assert len(kept) == recovered.entry_count
    again = open_segment(path)  # repair is idempotent
    assert again.truncated is None and again.entry_count == len(kept)


@FUZZ
@given(damage)
def test_damaged_unsealed_segment(params):
    entries = varied_entries(params["count"])
    with tempfile.TemporaryDirectory() as directory:
        path = write_segment(Path(directory), entries, seal=False, batch_size=3)
        original = path.read_bytes()
        path.write_bytes(_damaged(original, params["flips"], params["cut"]))
        _check_prefix(path, entries)


@FUZZ
@given(damage)
def test_damaged_sealed_segment(params):
    entries = varied_entries(params["count"])
    with tempfile.TemporaryDirectory() as directory:
        path = write_segment(Path(directory), entries, seal=True, batch_size=3)
        original = path.read_bytes()
        damaged = _damaged(original, params["flips"], params["cut"])
        try:
            with SegmentReader.from_buffer(damaged, "fuzz.seg") as reader:
                # Only an undamaged file (all flips cancelled out) may verify.
                assert damaged == original
                assert list(reader) == entries
        except SegmentCorrupted as error:
            assert damaged != original
            assert error.path == "fuzz.seg"
        path.write_bytes(damaged)
        _check_prefix(path, entries)
