"""Segment files on disk: writer, recovery (torn tail vs mid-file corruption), truncation,
sealing and the sealed reader, including the vectorized Arrow path."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from tests.wal.segment_helpers import (
    PCHANNEL,
    VCHANNEL_NAMES,
    simple_entries,
    varied_entries,
    write_segment,
)
from wal_segments import columnar
from wal_segments.columnar import SCHEMA
from wal_segments.format import (
    ENTRY_HEADER,
    ENTRY_HEADER_SIZE,
    FOOTER_FIXED,
    MSG_TYPE_NAMES,
    TRAILER_SIZE,
    Entry,
    EntryFlags,
    MsgType,
    SegmentSummary,
    block_checksums,
    crc32c,
    encode_batch,
    encode_footer,
    scan_batch,
)
from wal_segments.segment import (
    SegmentCorrupted,
    SegmentReader,
    SegmentStateError,
    SegmentWriter,
    list_segment_files,
    open_segment,
    read_unsealed,
    segment_file_name,
)

# -- writer and recovery --------------------------------------------------------------------


def test_create_is_atomic_and_named_by_first_lsn(tmp_path: Path):
    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1001, 4)
    assert writer.path == tmp_path / "00000000000000001001.seg"
    assert writer.path.name == segment_file_name(1001)
    assert [p.name for p in tmp_path.iterdir()] == [writer.path.name]  # no temporary left
    assert (writer.last_lsn, writer.last_term, writer.entry_count) == (1000, 0, 0)
    writer.close()
    with pytest.raises(FileExistsError):
        SegmentWriter.create(tmp_path, PCHANNEL, 1001, 4)
    SegmentWriter.create(tmp_path, PCHANNEL, 7, 4).close()
    assert [lsn for lsn, _ in list_segment_files(tmp_path)] == [7, 1001]
    recovered = open_segment(writer.path)
    assert (recovered.entry_count, recovered.last_lsn, recovered.truncated) == (0, 1000, None)
    assert recovered.header.created_term == 4


def test_append_sync_reopen_and_read_unsealed(tmp_path: Path):
    calls = []

    def counting_fdatasync(fd: int) -> None:
        calls.append(fd)
        os.fdatasync(fd)

    entries = varied_entries(30)
    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1, fdatasync=counting_fdatasync)
    end = writer.append(entries[:10])
    assert writer.durable_offset < end == writer.end_offset
    assert writer.sync() == end and writer.durable_offset == end
    assert writer.sync() == end  # nothing new: no second fdatasync
    writer.append(entries[10:])
    assert len(calls) == 2  # header, one sync
    writer.close()
    recovered = open_segment(writer.path)
    assert (recovered.entry_count, recovered.last_lsn, recovered.truncated) == (30, 30, None)
    assert list(read_unsealed(writer.path)) == entries
    assert list(read_unsealed(writer.path, from_lsn=25)) == entries[24:]
    resumed, _ = SegmentWriter.resume(writer.path)
    with pytest.raises(ValueError, match=r"non-contiguous append .* \(lsn 1; expected 31\)"):
        resumed.append(simple_entries(1, first_tick=10**6))
    resumed.append(simple_entries(2, first_lsn=31, first_tick=10**6))
    resumed.close()
    assert [e.lsn for e in read_unsealed(writer.path)] == list(range(1, 33))


def test_append_rejects_lower_term_and_time_tick(tmp_path: Path):
    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1)
    writer.append(simple_entries(3, term=5, first_tick=100))
    with pytest.raises(ValueError, match="term 4 below the last term 5"):
        writer.append(simple_entries(1, first_lsn=4, term=4, first_tick=200))
    with pytest.raises(ValueError, match="time_tick 102 not above 102"):
        writer.append(simple_entries(1, first_lsn=4, term=5, first_tick=102))
    writer.close()


def _frames(path: Path) -> list[int]:
    return list(open_segment(path, repair=False).frame_offsets)


def test_torn_tail_every_byte_offset_of_the_last_frame(tmp_path: Path):
    entries = simple_entries(6, size=150)
    path = write_segment(tmp_path, entries, seal=False)
    original = path.read_bytes()
    last_start = _frames(path)[-1]
    assert len(original) - last_start > 150
    for cut in range(last_start, len(original)):
        path.write_bytes(original[:cut])
        recovered = open_segment(path)
        assert recovered.entry_count == 5 and recovered.last_lsn == 5
        assert recovered.data_end == last_start == path.stat().st_size
        if cut == last_start:
            assert recovered.truncated is None  # a clean frame boundary
        else:
            assert recovered.truncated is not None
            assert recovered.truncated.offset == last_start
            assert recovered.truncated.discarded_bytes == cut - last_start
        assert list(read_unsealed(path)) == entries[:5]
    # The truncated segment accepts the lost entry again.
    writer, report = SegmentWriter.resume(path)
    assert report.truncated is None
    writer.append(entries[5:])
    writer.close()
    assert list(read_unsealed(path)) == entries


def test_torn_multi_frame_write_keeps_the_complete_frames(tmp_path: Path):
    path = write_segment(tmp_path, simple_entries(2), seal=False)
    batch = encode_batch(simple_entries(5, first_lsn=3, first_tick=10))
    with open(path, "ab") as file:
        file.write(batch.data[: batch.meta.frame_offsets[3] + 80])  # 3 frames and a bit
    recovered = open_segment(path)
    assert recovered.last_lsn == 5 and recovered.truncated.discarded_bytes == 80
    assert recovered.truncated.reason.startswith("frame extends past the end")


@pytest.mark.parametrize(
    "tail",
    [b"\x00" * 4096, b"\x00" * 3, bytes(range(256)) * 3],
    ids=["zero-filled", "few-zeros", "garbage"],
)
def test_junk_without_a_valid_frame_after_it_is_a_torn_tail(tmp_path: Path, tail: bytes):
    entries = simple_entries(4)
    path = write_segment(tmp_path, entries, seal=False)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(tail)
    recovered = open_segment(path)
    assert recovered.truncated.offset == size and path.stat().st_size == size
    assert list(read_unsealed(path)) == entries


def test_last_frame_with_bad_crc_is_truncated(tmp_path: Path):
    entries = simple_entries(4)
    path = write_segment(tmp_path, entries, seal=False)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10
    path.write_bytes(bytes(data))
    recovered = open_segment(path, repair=False)
    assert recovered.truncated.reason == "frame crc mismatch"
    assert path.stat().st_size == len(data)  # repair=False leaves the file alone
    assert open_segment(path).last_lsn == 3


@pytest.mark.parametrize("where", ["payload", "crc", "lsn", "key_len", "padding"])
def test_mid_file_corruption_names_file_and_offset(tmp_path: Path, where: str):
    entries = simple_entries(10, size=21)  # frame 4: 72 + 2 + 21 = 95, one byte of padding
    path = write_segment(tmp_path, entries, seal=False)
    target = _frames(path)[4]
    data = bytearray(path.read_bytes())
    position = {
        "payload": target + ENTRY_HEADER_SIZE + 5,
        "crc": target,
        "lsn": target + 8,
        "key_len": target + 64 + 2,  # key_len becomes huge: the frame claims past EOF
        "padding": target + ENTRY_HEADER_SIZE + 2 + 21,
    }[where]
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(SegmentCorrupted) as caught:
        open_segment(path)
    assert caught.value.path == str(path) and caught.value.offset == target
    assert f"corrupt segment {path} at offset {target}" in str(caught.value)
    assert "a valid frame follows" in caught.value.reason
    assert path.read_bytes() == bytes(data)  # nothing truncated
    with pytest.raises(SegmentCorrupted):
        list(read_unsealed(path))
    with pytest.raises(SegmentCorrupted):
        SegmentWriter.resume(path)


def test_corrupt_file_header_is_reported(tmp_path: Path):
    path = write_segment(tmp_path, simple_entries(3), seal=False)
    data = bytearray(path.read_bytes())
    data[9] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SegmentCorrupted, match="at offset 8: unsupported format version"):
        open_segment(path)


def test_read_unsealed_with_end_offset_is_strict(tmp_path: Path):
    entries = simple_entries(4)
    path = write_segment(tmp_path, entries, seal=False)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(b"\x07" * 40)  # a write in progress
    assert list(read_unsealed(path)) == entries
    assert list(read_unsealed(path, end_offset=size)) == entries
    with pytest.raises(SegmentCorrupted, match=f"at offset {size}"):
        list(read_unsealed(path, end_offset=size + 40))


# -- truncation -----------------------------------------------------------------------------


def test_truncate_after_drops_the_divergent_suffix(tmp_path: Path):
    entries = simple_entries(10, term=1)
    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1)
    writer.append(entries[:6])
    writer.append(entries[6:])
    offsets = list(_frames(writer.path))
    writer.truncate_after(6)
    assert (writer.last_lsn, writer.last_term, writer.last_time_tick) == (6, 1, 6)
    assert writer.end_offset == writer.durable_offset == offsets[6] == writer.path.stat().st_size
    writer.truncate_after(6)  # no-op
    # The new owner's suffix at a higher term, with higher ticks.
    replacement = simple_entries(3, first_lsn=7, term=2, first_tick=50)
    writer.append(replacement)
    with pytest.raises(ValueError, match=r"invalid truncate_after lsn \(11; expected 0\.\.9\)"):
        writer.truncate_after(11)
    writer.close()
    assert list(read_unsealed(writer.path)) == entries[:6] + replacement
    writer, _ = SegmentWriter.resume(writer.path)
    writer.truncate_after(0)  # empty the segment
    assert (writer.entry_count, writer.last_lsn, writer.last_term) == (0, 0, 0)
    writer.append(simple_entries(1, term=3))
    sealed = writer.seal()
    assert (sealed.summary.first_term, sealed.summary.last_lsn) == (3, 1)
    with SegmentReader.open(sealed.path) as reader:
        assert [e.term for e in reader] == [3]


def test_sealed_writer_refuses_writes(tmp_path: Path):
    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1)
    with pytest.raises(SegmentStateError, match="empty"):
        writer.seal()
    writer.append(simple_entries(2))
    writer.seal()
    with pytest.raises(SegmentStateError, match="sealed"):
        writer.append(simple_entries(1, first_lsn=3, first_tick=10))
    with pytest.raises(SegmentStateError, match="sealed"):
        SegmentWriter.resume(writer.path)


def test_failed_fdatasync_poisons_the_writer(tmp_path: Path):
    fail = {"on": False}

    def flaky(fd: int) -> None:
        if fail["on"]:
            raise OSError(5, "Input/output error")
        os.fdatasync(fd)

    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1, fdatasync=flaky)
    writer.append(simple_entries(2))
    fail["on"] = True
    with pytest.raises(OSError, match="Input/output"):
        writer.sync()
    fail["on"] = False
    with pytest.raises(SegmentStateError, match="failed earlier"):
        writer.sync()
    with pytest.raises(SegmentStateError, match="reopen it"):
        writer.append(simple_entries(1, first_lsn=3, first_tick=10))
    writer.close()


# -- sealing --------------------------------------------------------------------------------


def test_seal_digest_and_replica_equivalence(tmp_path: Path):
    owner_dir, replica_dir = tmp_path / "owner", tmp_path / "replica"
    owner_dir.mkdir()
    replica_dir.mkdir()
    entries = varied_entries(50, first_lsn=101)
    owner = SegmentWriter.create(owner_dir, PCHANNEL, 101, 1)
    replica = SegmentWriter.create(replica_dir, PCHANNEL, 101, 2)  # another created term
    for start in range(0, 50, 7):
        batch = encode_batch(entries[start : start + 7])
        owner.append_encoded(batch.data, batch.meta)
        # The replica verifies the forwarded bytes, then appends them verbatim.
        meta = scan_batch(
            batch.data,
            expected_first_lsn=replica.last_lsn + 1,
            last_term=replica.last_term,
            last_time_tick=replica.last_time_tick,
        )
        assert meta == batch.meta
        replica.append_encoded(batch.data, meta)
    header_len = owner.header_len
    sealed_owner, sealed_replica = owner.seal(), replica.seal()
    data = sealed_owner.path.read_bytes()
    expected = SegmentSummary(
        entry_count=50,
        first_lsn=101,
        last_lsn=150,
        first_term=1,
        last_term=1,
        first_time_tick=1000,
        last_time_tick=1000 + 7 * 49,
        data_end=sealed_owner.summary.data_end,
        digest=crc32c(data[header_len : sealed_owner.summary.data_end]),
    )
    assert sealed_owner.summary == expected == sealed_replica.summary
    assert sealed_owner.size_bytes == len(data)
    recovered = open_segment(sealed_owner.path, verify_blocks=True)
    assert recovered.sealed and recovered.summary == expected


def test_unseal_resume_and_reseal(tmp_path: Path):
    entries = simple_entries(8)
    path = write_segment(tmp_path, entries[:5], seal=True)
    writer, recovered = SegmentWriter.resume(path, unseal=True)
    assert recovered.sealed and writer.last_lsn == 5
    writer.truncate_after(4)
    writer.append(simple_entries(4, first_lsn=5, term=2, first_tick=100))
    sealed = writer.seal()
    assert (sealed.summary.last_lsn, sealed.summary.last_term) == (8, 2)
    with SegmentReader.open(path) as reader:
        assert [(e.lsn, e.term) for e in reader][3:] == [(4, 1), (5, 2), (6, 2), (7, 2), (8, 2)]


def test_crash_during_seal_recovers_an_unsealed_segment(tmp_path: Path):
    entries = simple_entries(5)
    path = write_segment(tmp_path, entries, seal=True)
    original = path.read_bytes()
    data_end = open_segment(path).data_end
    for cut in range(data_end, len(original)):
        path.write_bytes(original[:cut])
        recovered = open_segment(path)
        assert not recovered.sealed and recovered.last_lsn == 5
        if cut > data_end:
            assert recovered.truncated.reason == "incomplete seal footer"
        assert path.stat().st_size == data_end
        assert list(read_unsealed(path)) == entries


def test_every_flipped_byte_of_a_sealed_segment_is_detected(tmp_path: Path):
    path = write_segment(tmp_path, varied_entries(4), seal=True)
    original = path.read_bytes()
    with SegmentReader.from_buffer(original, "good") as reader:
        assert reader.entry_count == 4
    for offset in range(len(original)):
        damaged = bytearray(original)
        damaged[offset] ^= 0xFF
        with pytest.raises(SegmentCorrupted) as caught:
            SegmentReader.from_buffer(bytes(damaged), "damaged.seg")
        assert caught.value.path == "damaged.seg"


def test_sealed_reader_rejects_an_index_that_does_not_chain(tmp_path: Path, decode_tuning: None):
    # A writer bug (not bit rot): block crcs are right but the index lies.
    entries = simple_entries(4)
    path = write_segment(tmp_path, entries, seal=False)
    recovered = open_segment(path)
    data = path.read_bytes()
    offsets = list(recovered.frame_offsets)
    summary = SegmentSummary(4, 1, 4, 1, 1, 1, 4, len(data), crc32c(data[recovered.header_len :]))
    for bad_index in (
        [offsets[0], offsets[2], offsets[1], offsets[3]],
        [*offsets[:3], 8],
        [offsets[1], offsets[1], offsets[2], offsets[3]],
    ):
        footer = encode_footer(summary, 4096, block_checksums(data, len(data), 4096), bad_index)
        with SegmentReader.from_buffer(data + footer, "lying-index") as reader:
            with pytest.raises(SegmentCorrupted):
                reader.to_arrow(PCHANNEL, VCHANNEL_NAMES)
            with pytest.raises(SegmentCorrupted):
                list(reader)


def test_unsealed_file_is_not_a_sealed_segment(tmp_path: Path):
    path = write_segment(tmp_path, simple_entries(3), seal=False)
    with pytest.raises(SegmentCorrupted, match="not sealed"):
        SegmentReader.open(path)


# -- sealed reads and Arrow -----------------------------------------------------------------


def test_declared_arrow_schema():
    expected = pa.schema(
        [
            pa.field("pchannel", pa.string(), nullable=False),
            pa.field("vchannel", pa.string(), nullable=False),
            pa.field("segment_id", pa.int64(), nullable=False),
            pa.field("lsn", pa.int64(), nullable=False),
            pa.field("term", pa.int64(), nullable=False),
            pa.field("time_tick", pa.int64(), nullable=False),
            pa.field("msg_type", pa.string(), nullable=False),
            pa.field("key", pa.binary(), nullable=False),
            pa.field("payload", pa.binary(), nullable=False),
            pa.field("txn_id", pa.int64(), nullable=True),
            pa.field("broadcast_id", pa.int64(), nullable=True),
            pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
        ]
    )
    assert SCHEMA.equals(expected, check_metadata=True)


def _expected_columns(entries: list[Entry], segment_id: int) -> dict[str, list]:
    return {
        "pchannel": [PCHANNEL] * len(entries),
        "vchannel": [VCHANNEL_NAMES.get(e.vchannel_id, "") for e in entries],
        "segment_id": [segment_id] * len(entries),
        "lsn": [e.lsn for e in entries],
        "term": [e.term for e in entries],
        "time_tick": [e.time_tick for e in entries],
        "msg_type": [MSG_TYPE_NAMES[e.msg_type] for e in entries],
        "key": [e.key for e in entries],
        "payload": [e.payload for e in entries],
        "txn_id": [e.txn_id or None for e in entries],
        "broadcast_id": [e.broadcast_id or None for e in entries],
        "properties": [list(e.properties.items()) for e in entries],
    }


@pytest.fixture(params=["default", "small blocks and caches"])
def decode_tuning(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The columnar decoder as shipped, and with header-gather blocks of 7 frames and a
    sequence cache of 50 elements, so that 200 entries span many blocks, the cached
    index sequences grow, and the longest ones are built uncached."""
    monkeypatch.setattr(columnar, "_sequences", {})
    if request.param != "default":
        monkeypatch.setattr(columnar, "GATHER_BLOCK_FRAMES", 7)
        monkeypatch.setattr(columnar, "_SEQUENCE_CACHE_MAX", 50)


def test_to_arrow_equals_the_entries_column_by_column(tmp_path: Path, decode_tuning: None):
    entries = varied_entries(200, first_lsn=5000, term=3)
    path = write_segment(tmp_path, entries, seal=True, batch_size=17)
    with SegmentReader.open(path) as reader:
        assert list(reader) == entries
        batch = reader.to_arrow(PCHANNEL, VCHANNEL_NAMES)
        batch.validate(full=True)
        assert batch.schema.equals(SCHEMA)
        assert batch.num_rows == 200
        for name, values in _expected_columns(entries, 5000).items():
            assert batch.column(name).type == SCHEMA.field(name).type
            assert batch.column(name).to_pylist() == values, name
        assert batch.column("txn_id").null_count == sum(1 for e in entries if not e.txn_id)
        # Inclusive, clipped LSN ranges, as Spark splits large segments.
        for low, high in [(5000, 5000), (5013, 5099), (5150, 10**9), (0, 5003)]:
            part = reader.to_arrow(PCHANNEL, VCHANNEL_NAMES, (low, high), segment_id=77)
            chosen = [e for e in entries if low <= e.lsn <= high]
            assert part.to_pydict() == _expected_columns(chosen, 77)
            assert list(reader.entries((low, high))) == chosen
            assert reader.header_columns((low, high)).column("lsn").to_pylist() == [
                e.lsn for e in chosen
            ]
        empty = reader.to_arrow(PCHANNEL, VCHANNEL_NAMES, (1, 10))
        assert empty.num_rows == 0 and empty.schema.equals(SCHEMA)
        no_control = reader.to_arrow(PCHANNEL, VCHANNEL_NAMES, include_control=False)
        assert no_control.column("lsn").to_pylist() == [
            e.lsn for e in entries if not e.flags & EntryFlags.TERM_START
        ]
        start, end = reader.byte_range((5010, 5019))
        raw = path.read_bytes()[start:end]
        assert [e.lsn for e in scan_and_decode(raw)] == list(range(5010, 5020))


def test_index_sequences_from_the_cache_equal_fresh_ones(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(columnar, "_sequences", {})
    monkeypatch.setattr(columnar, "_SEQUENCE_CACHE_MAX", 40)
    for count in (1, 5, 3, 17, 40, 41, 100, 2):  # grows, is sliced, and overflows the cap
        for type_ in (pa.int32(), pa.int64()):
            assert columnar.arange(count, type_).to_pylist() == list(range(count))
            assert columnar.arange(count, type_).type == type_
        for width in (2, 3, 4):
            columns = [
                pa.array([100 * number + row for row in range(count)], pa.int32())
                for number in range(width)
            ]
            assert columnar._interleave(columns).to_pylist() == [
                100 * number + row for row in range(count) for number in range(width)
            ]
    assert columnar.arange(0, pa.int32()).to_pylist() == []


def scan_and_decode(raw: bytes) -> list[Entry]:
    from wal_segments.format import decode_batch

    scan_batch(raw)
    return decode_batch(raw)


def test_to_arrow_large_payloads_and_no_properties(tmp_path: Path):
    big = bytes(range(256)) * 4096
    entries = [
        Entry(lsn=1, term=1, time_tick=1, msg_type=MsgType.INSERT, vchannel_id=2, payload=big),
        Entry(lsn=2, term=1, time_tick=2, msg_type=MsgType.INSERT, vchannel_id=2, key=b"x"),
        Entry(lsn=3, term=1, time_tick=3, msg_type=MsgType.INSERT, vchannel_id=1, payload=big[:7]),
    ]
    path = write_segment(tmp_path, entries, seal=True)
    with SegmentReader.open(path) as reader:
        assert reader.footer.block_crcs and len(reader.footer.block_crcs) == 2
        batch = reader.to_arrow(PCHANNEL, VCHANNEL_NAMES)
        assert batch.to_pydict() == _expected_columns(entries, 1)
        assert batch.column("properties").to_pylist() == [[], [], []]


def test_to_arrow_errors(tmp_path: Path):
    entries = varied_entries(10)
    path = write_segment(tmp_path, entries, seal=True)
    with SegmentReader.open(path) as reader:
        with pytest.raises(KeyError, match="vchannel id 3 is not in vchannel_names"):
            reader.to_arrow(PCHANNEL, {1: "a", 2: "b"})
        with pytest.raises(ValueError, match="belongs to pchannel 'p_0', not 'p_9'"):
            reader.to_arrow("p_9", VCHANNEL_NAMES)


def test_footer_trailer_sizes_are_bounded(tmp_path: Path):
    path = write_segment(tmp_path, simple_entries(100), seal=True)
    recovered = open_segment(path)
    footer_bytes = path.stat().st_size - recovered.data_end
    assert footer_bytes == FOOTER_FIXED.size + 8 * 100 + 8 + TRAILER_SIZE  # 1 block crc + pad


def test_index_pointing_into_a_payload_is_rejected(tmp_path: Path):
    # A crafted index (block crcs recomputed) skips to a fake frame header embedded in a
    # payload whose lsn, term, tick and length all look right; only the frame chain can
    # tell that the previous frame does not end there.
    def build(fake_payload_len: int) -> list[Entry]:
        fake = ENTRY_HEADER.pack(0, 0, 3, 1, 50, 1, 0, 0, MsgType.INSERT, 0, 0, 0, fake_payload_len)
        base = simple_entries(3)
        middle = Entry(
            **{
                **_entry_fields(base[1]),
                "key": b"8 bytes!",
                "payload": b"\x00" * 8 + fake + b"\x00" * 16,
            }
        )
        return [base[0], middle, Entry(**{**_entry_fields(base[2]), "time_tick": 60})]

    draft = encode_batch(build(0))
    header_len = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1).header_len
    data_end = header_len + draft.meta.size_bytes
    fake_offset = header_len + draft.meta.frame_offsets[1] + ENTRY_HEADER_SIZE + 8 + 8
    entries = build(data_end - fake_offset - ENTRY_HEADER_SIZE)
    for path in tmp_path.iterdir():
        path.unlink()
    path = write_segment(tmp_path, entries, seal=False)
    data = path.read_bytes()
    assert len(data) == data_end
    real = [header_len + offset for offset in draft.meta.frame_offsets]
    summary = SegmentSummary(3, 1, 3, 1, 1, 1, 50, data_end, crc32c(data[header_len:]))
    footer = encode_footer(
        summary, 4096, block_checksums(data, data_end, 4096), [real[0], real[1], fake_offset]
    )
    reader = SegmentReader.from_buffer(data + footer, "crafted")
    with pytest.raises(SegmentCorrupted, match="frame length disagrees with the index"):
        reader.to_arrow(PCHANNEL, VCHANNEL_NAMES)


def _entry_fields(entry: Entry) -> dict:
    return {name: getattr(entry, name) for name in Entry.__slots__}


def test_seal_makes_the_footer_durable_before_the_trailer_exists(tmp_path: Path):
    sizes_at_sync: list[int] = []

    def recording_fdatasync(fd: int) -> None:
        sizes_at_sync.append(os.fstat(fd).st_size)
        os.fdatasync(fd)

    writer = SegmentWriter.create(tmp_path, PCHANNEL, 1, 1, fdatasync=recording_fdatasync)
    writer.append(simple_entries(5))
    data_end = writer.end_offset
    sealed = writer.seal()
    # header, entries, footer body (no trailer yet), then the trailer.
    assert sizes_at_sync[-3:] == [data_end, sealed.size_bytes - TRAILER_SIZE, sealed.size_bytes]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_running_checksums_equal_the_file_read_back(tmp_path: Path, seed: int):
    """Seal uses checksums kept by every append; they must equal what reading the file back
    gives, for batches that straddle block boundaries in every way."""
    import random

    rng = random.Random(seed)
    entries = varied_entries(400, first_lsn=1)
    dirs = [tmp_path / "running", tmp_path / "read_back"]
    writers = []
    for directory in dirs:
        directory.mkdir()
        writers.append(SegmentWriter.create(directory, PCHANNEL, 1, 1, block_size_bytes=4096))
    writers[1]._checksums = None  # noqa: SLF001 (force the read-back path)
    start = 0
    while start < len(entries):
        size = rng.randint(1, 40)
        batch = encode_batch(entries[start : start + size])
        for writer in writers:
            writer.append_encoded(batch.data, batch.meta)
        start += size
    running, read_back = (writer.seal() for writer in writers)
    assert running.summary == read_back.summary
    assert running.path.read_bytes() == read_back.path.read_bytes()
    assert running.summary.data_end > 10 * 4096
    open_segment(running.path, verify_blocks=True)
