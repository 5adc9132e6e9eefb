"""The vectorized header checks of `wal_segments.columnar.decode_headers`, one damaged
field at a time: every check rejects what it must, with its own reason, at the offset of
the first bad frame, and the first failing check in the documented order wins.

The damage is written into the verified buffer directly (no crcs to fix up): these checks
are the decoder's own, for an index or header that a buggy writer got wrong while the
block crcs still match."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from tests.wal.segment_helpers import PCHANNEL, VCHANNEL_NAMES, varied_entries, write_segment
from wal_segments import columnar
from wal_segments.format import ENTRY_HEADER, MSG_TYPE_NAMES, EntryFlags, FormatError
from wal_segments.segment import SegmentReader

# ENTRY_HEADER's fields, in order.
FIELDS = (
    "crc",
    "properties_len",
    "lsn",
    "term",
    "time_tick",
    "vchannel_id",
    "txn_id",
    "broadcast_id",
    "msg_type",
    "reserved",
    "flags",
    "key_len",
    "payload_len",
)
COUNT = 40
# varied_entries' kinds: frame % 8 == 7 is a plain insert, 1 a transaction's begin, 4 a
# broadcast.
PLAIN, TXN, BROADCAST = 15, 17, 20

Patch = dict[int, dict[str, Callable[[int], int]]]


@pytest.fixture(params=["default", "small blocks"])
def block_frames(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """As shipped, and with header gathers in blocks of 7 frames (40 frames: 6 blocks)."""
    if request.param != "default":
        monkeypatch.setattr(columnar, "GATHER_BLOCK_FRAMES", 7)


@pytest.fixture(scope="module")
def segment(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[int], int, int, int]:
    """(file bytes, frame offsets, header length, data end, first lsn) of a sealed segment."""
    path: Path = write_segment(
        tmp_path_factory.mktemp("columnar"), varied_entries(COUNT, first_lsn=100), seal=True
    )
    with SegmentReader.open(path) as reader:
        offsets = list(reader.frame_offsets())
        return path.read_bytes(), offsets, reader.header_len, reader.data_end, reader.first_lsn


def _decode(
    segment: tuple[bytes, list[int], int, int, int],
    patch: Patch,
    offsets: list[int] | None = None,
    rows: tuple[int, int] = (0, COUNT),
) -> columnar.HeaderColumns:
    data, good_offsets, header_len, data_end, first_lsn = segment
    offsets = good_offsets if offsets is None else offsets
    damaged = bytearray(data)
    for frame, changes in patch.items():
        values = dict(
            zip(FIELDS, ENTRY_HEADER.unpack_from(damaged, good_offsets[frame]), strict=True)
        )
        for name, change in changes.items():
            values[name] = change(values[name])
        ENTRY_HEADER.pack_into(damaged, good_offsets[frame], *values.values())
    buffer = pa.allocate_buffer(len(damaged))  # 64-byte aligned, as a mapped file is
    memoryview(buffer).cast("B")[:] = damaged
    start, stop = rows
    return columnar.decode_headers(
        buffer,
        pa.array(offsets[start:stop], pa.uint64()),
        first_lsn=first_lsn + start,
        lower_bound=header_len,
        end_offset=data_end if stop == COUNT else good_offsets[stop],
        start_offset=header_len if start == 0 else None,
    )


def _set(value: int) -> Callable[[int], int]:
    return lambda _: value


def _add(value: int) -> Callable[[int], int]:
    return lambda old: old + value


def _or(bits: int) -> Callable[[int], int]:
    return lambda old: old | bits


TXN_BODY = int(EntryFlags.TXN_BODY)
BROADCAST_BIT = int(EntryFlags.BROADCAST)

# (name, damage, frame whose offset the error names, reason)
CASES: list[tuple[str, Patch, int, str]] = [
    ("key length", {PLAIN: {"key_len": _add(8)}}, PLAIN, "frame length disagrees with the index"),
    (
        "properties length",
        {PLAIN: {"properties_len": _add(8)}},
        PLAIN,
        "frame length disagrees with the index",
    ),
    ("reserved", {PLAIN: {"reserved": _set(1)}}, PLAIN, "nonzero reserved header field"),
    ("unknown flag", {PLAIN: {"flags": _or(1 << 20)}}, PLAIN, "unknown flags"),
    ("msg_type past the table", {PLAIN: {"msg_type": _set(999)}}, PLAIN, "unknown msg_type"),
    ("msg_type 0", {PLAIN: {"msg_type": _set(0)}}, PLAIN, "unknown msg_type"),
    ("lsn", {PLAIN: {"lsn": _add(1)}}, PLAIN, "lsn is not contiguous with the index"),
    ("term 0", {PLAIN: {"term": _set(0)}}, PLAIN, "bad term"),
    ("term 0 first", {0: {"term": _set(0)}}, 0, "bad term"),
    ("term went back", {PLAIN: {"term": _add(1)}}, PLAIN + 1, "term went back"),
    ("negative time tick", {PLAIN: {"time_tick": _set(-1)}}, PLAIN, "bad time_tick"),
    ("negative first time tick", {0: {"time_tick": _set(-5)}}, 0, "bad time_tick"),
    ("time tick repeated", {PLAIN: {"time_tick": _add(-7)}}, PLAIN, "time_tick not increasing"),
    ("negative vchannel", {PLAIN: {"vchannel_id": _set(-3)}}, PLAIN, "negative id"),
    ("negative txn_id", {TXN: {"txn_id": _set(-3)}}, TXN, "negative id"),
    ("negative broadcast_id", {BROADCAST: {"broadcast_id": _set(-3)}}, BROADCAST, "negative id"),
    ("txn_id without flag", {PLAIN: {"txn_id": _set(77)}}, PLAIN, "txn flags disagree with txn_id"),
    (
        "txn flag without id",
        {PLAIN: {"flags": _or(TXN_BODY)}},
        PLAIN,
        "txn flags disagree with txn_id",
    ),
    ("txn frame without id", {TXN: {"txn_id": _set(0)}}, TXN, "txn flags disagree with txn_id"),
    (
        "broadcast_id without flag",
        {PLAIN: {"broadcast_id": _set(5)}},
        PLAIN,
        "broadcast flag disagrees with broadcast_id",
    ),
    (
        "broadcast flag without id",
        {PLAIN: {"flags": _or(BROADCAST_BIT)}},
        PLAIN,
        "broadcast flag disagrees with broadcast_id",
    ),
    (
        "broadcast frame without id",
        {BROADCAST: {"broadcast_id": _set(0)}},
        BROADCAST,
        "broadcast flag disagrees with broadcast_id",
    ),
    # Two damaged frames: the first check in order wins, then its first bad frame.
    (
        "reserved before lsn",
        {30: {"reserved": _set(2)}, 3: {"lsn": _add(5)}},
        30,
        "nonzero reserved header field",
    ),
    ("lsn, first frame", {30: {"lsn": _add(1)}, 9: {"lsn": _add(1)}}, 9, "lsn is not contiguous"),
    ("unknown flags, then txn", {9: {"flags": _or(TXN_BODY | 1 << 12)}}, 9, "unknown flags"),
]


@pytest.mark.parametrize(("name", "patch", "frame", "reason"), CASES, ids=[c[0] for c in CASES])
def test_each_header_check_names_the_first_bad_frame(
    segment, block_frames: None, name: str, patch: Patch, frame: int, reason: str
) -> None:
    offsets = segment[1]
    assert len(_decode(segment, {})) == COUNT
    with pytest.raises(FormatError) as caught:
        _decode(segment, patch)
    assert caught.value.reason.startswith(reason), name
    assert caught.value.offset == offsets[frame], name
    # A slice that holds the damaged frame (and the one before it) reports the same; one
    # that does not, nothing.
    first = max(0, min(patch) - 1)
    with pytest.raises(FormatError) as caught:
        _decode(segment, patch, rows=(first, COUNT))
    assert caught.value.reason.startswith(reason), name
    if max(patch) + 2 < COUNT:
        assert len(_decode(segment, patch, rows=(max(patch) + 2, COUNT))) == COUNT - max(patch) - 2


@pytest.mark.parametrize(
    ("name", "change", "offset_of", "reason"),
    [
        ("unaligned", lambda o: [*o[:5], o[5] + 4, *o[6:]], 5, "unaligned frame"),
        ("overlap", lambda o: [*o[:5], o[4] + 8, *o[6:]], 5, "index offsets overlap"),
        ("skips a frame", lambda o: [*o[:5], *o[6:]], 4, "frame length disagrees"),
        ("last too short", lambda o: [*o[:-1], o[-2]], COUNT - 1, "index offsets overlap"),
    ],
)
def test_an_index_that_does_not_chain_is_named(
    segment, name: str, change: Callable[[list[int]], list[int]], offset_of: int, reason: str
) -> None:
    offsets = change(list(segment[1]))
    with pytest.raises(FormatError) as caught:
        _decode(segment, {}, offsets=offsets)
    assert caught.value.reason.startswith(reason), name
    assert caught.value.offset == offsets[offset_of], name


def test_valid_headers_decode_to_the_entries(segment, block_frames: None) -> None:
    entries = varied_entries(COUNT, first_lsn=100)
    headers = _decode(segment, {})
    assert headers.lsn.to_pylist() == [e.lsn for e in entries]
    assert headers.flags.to_pylist() == [e.flags for e in entries]
    assert headers.txn_id.to_pylist() == [e.txn_id for e in entries]
    assert headers.key_len.to_pylist() == [len(e.key) for e in entries]
    batch = columnar.to_record_batch(
        pa.py_buffer(segment[0]),
        headers,
        pchannel=PCHANNEL,
        segment_id=100,
        vchannel_names=VCHANNEL_NAMES,
        source="test",
    )
    assert batch.column("payload").to_pylist() == [e.payload for e in entries]


def test_valid_headers_take_the_fast_checks(
    segment, block_frames: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid frames (transactions, broadcasts, a second term, one frame alone) pass the
    fast form of the checks; the in-order form runs only for a damaged header."""

    def in_order(*args: object, **kwargs: object) -> None:
        raise AssertionError("the in-order checks ran for valid headers")

    monkeypatch.setattr(columnar, "_check_in_order", in_order)
    assert len(_decode(segment, {})) == COUNT
    second_term = {frame: {"term": _add(1)} for frame in range(25, COUNT)}
    assert _decode(segment, second_term).term.to_pylist() == [1] * 25 + [2] * (COUNT - 25)
    for frame in (0, PLAIN, TXN, BROADCAST, COUNT - 1):
        assert len(_decode(segment, {}, rows=(frame, frame + 1))) == 1
    with pytest.raises(AssertionError, match="in-order checks ran"):
        _decode(segment, {PLAIN: {"reserved": _set(1)}})


NAME_PATHS = [(16, 4096), (1, 4096), (1, 1)]


@pytest.mark.parametrize(("runs_max", "table_max"), NAME_PATHS, ids=["runs", "table", "dict"])
def test_vchannel_names_by_runs_table_and_dictionary(
    monkeypatch: pytest.MonkeyPatch, runs_max: int, table_max: int
) -> None:
    """Names come run by run for few runs of equal ids, from a table indexed by id for a
    narrow id range, from a dictionary of the distinct ids otherwise: the same column,
    and the same KeyError for an id without a name (the first such id in row order)."""
    monkeypatch.setattr(columnar, "NAME_RUNS_MAX", runs_max)
    monkeypatch.setattr(columnar, "VCHANNEL_TABLE_MAX", table_max)
    ids = pa.array([0, 7, 7, 9, 0, 8, 7], pa.int64())
    names = {7: "seven", 8: "eight", 9: "nine"}
    assert columnar._vchannel_column(ids, names, "s").to_pylist() == [
        "",
        "seven",
        "seven",
        "nine",
        "",
        "eight",
        "seven",
    ]
    assert columnar._vchannel_column(ids, {**names, 0: "p"}, "s").to_pylist()[0] == "p"
    assert columnar._vchannel_column(pa.array([8, 8], pa.int64()), names, "s").to_pylist() == [
        "eight",
        "eight",
    ]
    with pytest.raises(KeyError, match="vchannel id 9 is not in vchannel_names"):
        columnar._vchannel_column(ids, {7: "seven", 8: "eight"}, "s")
    with pytest.raises(KeyError, match="vchannel id 7 is not in vchannel_names"):
        columnar._vchannel_column(ids, {9: "nine"}, "s")


@pytest.mark.parametrize("runs_max", [16, 1])
@pytest.mark.parametrize(
    "codes",
    [[4], [4] * 5, [1, 4, 4, 4, 2], [4, 0, 4], [4, 4, 999], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 3],
)
def test_msg_type_names_by_runs_equal_the_table(
    monkeypatch: pytest.MonkeyPatch, runs_max: int, codes: list[int]
) -> None:
    """Built run by run or taken from the table: the same names, and a null for an
    unregistered code (which decode_headers reports)."""
    monkeypatch.setattr(columnar, "NAME_RUNS_MAX", runs_max)
    column = columnar._msg_type_names(pa.array(codes, pa.uint64()))
    column.validate(full=True)
    assert column.type == pa.string()
    assert column.to_pylist() == [MSG_TYPE_NAMES.get(code) for code in codes]


@pytest.mark.parametrize("value", ["", "p", "pchannel-ünï"])
@pytest.mark.parametrize("count", [1, 2, 1000])
def test_constant_columns(value: str, count: int) -> None:
    strings = columnar._constant_string(value, count)
    strings.validate(full=True)
    assert strings.to_pylist() == [value] * count
    numbers = columnar._constant_int64(-5 if value else 2**40, count)
    assert numbers.to_pylist() == [-5 if value else 2**40] * count
