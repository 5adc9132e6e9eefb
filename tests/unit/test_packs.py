"""The pure time-tick pack assembly (rpc.streaming.packs.PackAssembler, pack_begin)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from rpc.protos import streaming_pb2 as wire
from rpc.streaming.packs import PackAssembler, PackOrderError, pack_begin


def entry(vchannel: str, lsn: int, tick: int) -> wire.WalEntry:
    return wire.WalEntry(vchannel=vchannel, pchannel=f"p-{vchannel}", lsn=lsn, time_tick=tick)


def keys(pack) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return [(m.vchannel, m.lsn) for m in pack.messages]


def test_pack_waits_for_every_vchannel_watermark() -> None:
    assembler = PackAssembler(["a", "b"])
    assembler.add("a", [entry("a", 1, 10), entry("a", 2, 20)], 20)
    assert assembler.next_pack() is None  # b has said nothing yet
    assembler.add("b", [entry("b", 1, 15)], 15)
    pack = assembler.next_pack()
    assert pack is not None
    assert (pack.begin_time_tick, pack.end_time_tick) == (0, 15)
    assert keys(pack) == [("a", 1), ("b", 1)]
    assert pack.start_positions == {"a": (0, 0), "b": (0, 0)}
    assert pack.end_positions == {"a": (1, 15), "b": (1, 15)}
    assert assembler.next_pack() is None
    assembler.add("b", [], 30)  # b idle: only its watermark moves
    pack = assembler.next_pack()
    assert pack is not None
    assert (pack.begin_time_tick, pack.end_time_tick) == (15, 20)
    assert keys(pack) == [("a", 2)]
    assert pack.start_positions == {"a": (1, 15), "b": (1, 15)}
    assert pack.end_positions == {"a": (2, 20), "b": (1, 20)}


def test_messages_in_time_tick_order_across_vchannels() -> None:
    assembler = PackAssembler(["a", "b"])
    assembler.add("a", [entry("a", 5, 3), entry("a", 6, 9)], 9)
    assembler.add("b", [entry("b", 7, 1), entry("b", 8, 4), entry("b", 9, 9)], 12)
    pack = assembler.next_pack()
    assert pack is not None
    assert [(m.time_tick, m.vchannel) for m in pack.messages] == [
        (1, "b"),
        (3, "a"),
        (4, "b"),
        (9, "a"),
        (9, "b"),
    ]


def test_empty_ranges_merge_unless_emit_empty() -> None:
    merged = PackAssembler(["a"])
    merged.add("a", [], 10)
    assert merged.next_pack() is None
    merged.add("a", [entry("a", 1, 12)], 14)
    pack = merged.next_pack()
    assert pack is not None and (pack.begin_time_tick, pack.end_time_tick) == (0, 14)
    every = PackAssembler(["a"], emit_empty=True)
    every.add("a", [], 10)
    pack = every.next_pack()
    assert pack is not None and len(pack) == 0 and pack.end_time_tick == 10


def test_resume_skips_entries_of_finished_packs() -> None:
    # A commit cut short: a's position is past the pack that ended at 50, b's is not.
    assembler = PackAssembler(["a", "b"], begin_time_tick=50, positions={"a": 7, "b": 3})
    assembler.add("b", [entry("b", 4, 40), entry("b", 5, 60)], 60)
    assembler.add("a", [entry("a", 8, 55)], 70)
    assert assembler.skipped == 1
    pack = assembler.next_pack()
    assert pack is not None
    assert (pack.begin_time_tick, pack.end_time_tick) == (50, 60)
    assert keys(pack) == [("a", 8), ("b", 5)]
    assert pack.start_positions == {"a": (7, 50), "b": (3, 50)}


@pytest.mark.parametrize(
    "entries",
    [
        [entry("a", 2, 10), entry("a", 2, 11)],  # lsn repeated
        [entry("a", 2, 10), entry("a", 3, 10)],  # tick repeated
        [entry("a", 3, 10), entry("a", 2, 11)],  # lsn back
    ],
)
def test_out_of_order_entries_are_refused(entries: list[wire.WalEntry]) -> None:
    assembler = PackAssembler(["a"])
    with pytest.raises(PackOrderError):
        assembler.add("a", entries, 20)


def test_entry_below_a_cut_pack_is_refused() -> None:
    assembler = PackAssembler(["a", "b"])
    assembler.add("a", [], 10)
    assembler.add("b", [entry("b", 1, 5)], 10)
    assert assembler.next_pack() is not None
    with pytest.raises(PackOrderError, match="watermark lied"):
        assembler.add("a", [entry("a", 1, 9)], 11)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one vchannel"):
        PackAssembler([])
    with pytest.raises(ValueError, match="begin_time_tick"):
        PackAssembler(["a"], begin_time_tick=-1)
    with pytest.raises(ValueError, match="unknown vchannel"):
        PackAssembler(["a"]).add("z", [], 1)


def test_watermark_never_goes_back() -> None:
    assembler = PackAssembler(["a"])
    assembler.add("a", [entry("a", 1, 5)], 9)
    assembler.add("a", [], 3)
    assert assembler.watermark("a") == 9
    assert assembler.buffered() == 1 and assembler.buffered("a") == 1


def test_random_interleavings_give_complete_contiguous_packs() -> None:
    """Whatever order streams report in, the packs partition the history: contiguous
    ranges, each holding exactly the messages of its range, sorted."""
    rng = random.Random(7)
    for _ in range(200):
        vchannels = ["a", "b", "c"][: rng.randint(1, 3)]
        history: dict[str, list[wire.WalEntry]] = {}
        for vchannel in vchannels:
            tick, lsn, entries = 0, 0, []
            for _ in range(rng.randint(0, 20)):
                tick += rng.randint(1, 5)
                lsn += rng.randint(1, 3)
                entries.append(entry(vchannel, lsn, tick))
            history[vchannel] = entries
        horizon = 200
        assembler = PackAssembler(vchannels, emit_empty=rng.random() < 0.5)
        cursor = dict.fromkeys(vchannels, 0)
        packs = []
        while any(cursor[v] < len(history[v]) for v in vchannels) or (
            assembler.watermark() < horizon
        ):
            vchannel = rng.choice(vchannels)
            take = rng.randint(0, 3)
            chunk = history[vchannel][cursor[vchannel] : cursor[vchannel] + take]
            cursor[vchannel] += len(chunk)
            rest = history[vchannel][cursor[vchannel] :]
            # A truthful watermark: below the next undelivered entry.
            watermark = rest[0].time_tick - 1 if rest else horizon
            assembler.add(vchannel, chunk, rng.randint(0, watermark))
            pack = assembler.next_pack()
            if pack is not None:
                packs.append(pack)
            if not rest:
                assembler.add(vchannel, [], horizon)
        while (pack := assembler.next_pack()) is not None:
            packs.append(pack)
        end = 0
        seen = []
        for pack in packs:
            assert pack.begin_time_tick == end < pack.end_time_tick
            ticks = [m.time_tick for m in pack.messages]
            assert all(pack.begin_time_tick < t <= pack.end_time_tick for t in ticks)
            assert ticks == sorted(ticks)
            end = pack.end_time_tick
            seen.extend((m.vchannel, m.lsn) for m in pack.messages)
        expected = sorted((v, e.lsn) for v in vchannels for e in history[v])
        assert sorted(seen) == expected and len(seen) == len(set(seen))


@dataclass
class Position:
    lsn: int = 0
    time_tick: int = 0
    from_time_tick: int = 0
    revision: int = 0


@pytest.mark.parametrize(
    ("positions", "begin"),
    [
        ({}, 0),
        ({"a": Position(lsn=4, time_tick=90, revision=3)}, 90),
        # A commit cut short: the highest end tick is where finished packs end.
        (
            {
                "a": Position(lsn=4, time_tick=90, revision=3),
                "b": Position(lsn=2, time_tick=60, revision=2),
            },
            90,
        ),
        # A seek after the commits: they no longer count.
        (
            {
                "a": Position(lsn=4, time_tick=90, revision=3),
                "b": Position(lsn=1, time_tick=0, revision=5),
            },
            0,
        ),
        (
            {
                "a": Position(from_time_tick=70, revision=5),
                "b": Position(from_time_tick=70, revision=5),
            },
            69,
        ),
        # Commits after a seek count again.
        (
            {
                "a": Position(lsn=9, time_tick=120, revision=8),
                "b": Position(from_time_tick=70, revision=5),
            },
            120,
        ),
    ],
)
def test_pack_begin(positions: dict[str, Position], begin: int) -> None:
    assert pack_begin(positions) == begin
