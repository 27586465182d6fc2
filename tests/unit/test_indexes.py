"""OffsetIndex and TimeIndex on real files (Kafka's layout: 8-byte and 12-byte entries, preallocation,
lookups through the block directory, truncation, trim on close, reopen by length, the time index's reserved slot,
sanity checks, read-only opening next to a live writer), and the lookups a segment makes with them.

Expected values are computed here independently (struct, bisect), never through the classes under test.
"""

from __future__ import annotations

import bisect
import struct
from pathlib import Path

import pytest

from tidelog.errors import CorruptIndexError, TidelogError
from tidelog.storage.kafka.abstract_index import TAIL_BYTES
from tidelog.storage.kafka.index_block_cache import IndexBlockCache
from tidelog.storage.kafka.index_tails import IndexTails
from tidelog.storage.kafka.offset_index import OffsetIndex, OffsetPosition
from tidelog.storage.kafka.time_index import TimeIndex, TimestampOffset

OFFSET_ENTRY = struct.Struct(">ii")  # relativeOffset, position
TIME_ENTRY = struct.Struct(">qi")  # timestamp, relativeOffset
BASE = 1000
TS = 1_700_000_000_000
MANY = 3000  # entries: 24 blocks of the lookup directory (abstract_index.BLOCK_ENTRIES = 128), the last partial


def offset_entries(count: int) -> list[tuple[int, int]]:
    """(absolute offset, position) with gaps, as a sparse index has."""
    return [(BASE + 3 * i + 1, 100 * i + 7) for i in range(count)]


def time_entries(count: int) -> list[tuple[int, int]]:
    """(timestamp, absolute offset), both strictly growing, with gaps."""
    return [(TS + 5 * i + 2, BASE + 3 * i + 1) for i in range(count)]


def largest_lower_bound(entries: list[tuple[int, int]], target: int, missing: tuple[int, int]) -> tuple[int, int]:
    """The last entry whose first field is <= target (entries sorted by it), or `missing`."""
    slot = bisect.bisect_right(entries, (target, float("inf"))) - 1
    return missing if slot < 0 else entries[slot]


def expected_offset_lookup(entries: list[tuple[int, int]], target: int) -> tuple[int, int]:
    return largest_lower_bound(entries, target, (BASE, 0))


def expected_time_lookup(entries: list[tuple[int, int]], target: int) -> tuple[int, int]:
    return largest_lower_bound(entries, target, (-1, BASE))


def file_entries(path: Path, entry: struct.Struct) -> list[tuple[int, ...]]:
    data = path.read_bytes()
    assert len(data) % entry.size == 0
    return [entry.unpack_from(data, i) for i in range(0, len(data), entry.size)]


@pytest.fixture
def index_path(tmp_path: Path) -> Path:
    return tmp_path / f"{BASE:020d}.index"


@pytest.fixture
def time_index_path(tmp_path: Path) -> Path:
    return tmp_path / f"{BASE:020d}.timeindex"


# --- preallocation ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("max_size", "expected_length"), [(1001, 1000), (1000, 1000), (10 * 1024 * 1024, 10485760)])
def test_offset_index_preallocated_to_whole_entries(index_path: Path, max_size: int, expected_length: int) -> None:
    index = OffsetIndex(index_path, BASE, max_size)
    try:
        assert index_path.stat().st_size == expected_length
        assert index.entries == 0
        assert index.max_entries == expected_length // 8
        assert index_path.read_bytes()[:64] == bytes(64)
    finally:
        index.close()


@pytest.mark.parametrize(("max_size", "expected_length"), [(1001, 996), (1008, 1008), (10 * 1024 * 1024, 10485756)])
def test_time_index_preallocated_to_whole_entries(time_index_path: Path, max_size: int, expected_length: int) -> None:
    index = TimeIndex(time_index_path, BASE, max_size)
    try:
        assert time_index_path.stat().st_size == expected_length
        assert index.entries == 0
        assert index.max_entries == expected_length // 12
    finally:
        index.close()


def test_empty_index_closes_to_zero_bytes(index_path: Path, time_index_path: Path) -> None:
    OffsetIndex(index_path, BASE, 4096).close()
    TimeIndex(time_index_path, BASE, 4096).close()
    assert index_path.stat().st_size == 0
    assert time_index_path.stat().st_size == 0


# --- offset index: append and lookup -------------------------------------------------------------------------------


def test_offset_index_entry_bytes(index_path: Path) -> None:
    index = OffsetIndex(index_path, BASE, 4096)
    index.append(BASE + 5, 0)
    index.append(BASE + 9, 4200)
    index.flush()
    raw = index_path.read_bytes()
    assert raw[:16] == OFFSET_ENTRY.pack(5, 0) + OFFSET_ENTRY.pack(9, 4200)
    index.close()
    assert index_path.read_bytes() == OFFSET_ENTRY.pack(5, 0) + OFFSET_ENTRY.pack(9, 4200)


def test_offset_index_lookup_largest_lower_bound(index_path: Path) -> None:
    entries = offset_entries(MANY)
    index = OffsetIndex(index_path, BASE, MANY * 8)
    try:
        for offset, position in entries:
            index.append(offset, position)
        assert index.entries == MANY
        assert index.is_full()
        assert index.last_offset == entries[-1][0]
        # every offset from below the base to past the last entry: every block and both sides of its boundaries
        for target in range(BASE - 3, entries[-1][0] + 5):
            assert index.lookup(target) == expected_offset_lookup(entries, target), target
        for slot in (0, 1, 511, 512, 513, 1023, 1024, MANY - 1):
            offset, position = entries[slot]
            assert index.lookup(offset) == OffsetPosition(offset, position)
            assert index.entry_at(slot) == OffsetPosition(offset, position)
    finally:
        index.close()


def test_offset_index_rejects_non_increasing_offsets(index_path: Path) -> None:
    index = OffsetIndex(index_path, BASE, 4096)
    try:
        index.append(BASE + 10, 0)
        with pytest.raises(CorruptIndexError):
            index.append(BASE + 10, 100)
        with pytest.raises(CorruptIndexError):
            index.append(BASE + 3, 100)
        assert index.entries == 1
    finally:
        index.close()


def test_offset_index_full_refuses_appends(index_path: Path) -> None:
    index = OffsetIndex(index_path, BASE, 80)  # 10 entries
    try:
        for i in range(10):
            assert not index.is_full()
            index.append(BASE + i, i * 10)
        assert index.is_full()
        with pytest.raises(CorruptIndexError):
            index.append(BASE + 10, 100)
        assert index.entries == 10
    finally:
        index.close()


# --- offset index: truncation, trim, reopen ------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 500, 1980, 2500, MANY - 1, MANY])
def test_offset_index_truncate_to(index_path: Path, cut: int) -> None:
    entries = offset_entries(MANY)
    index = OffsetIndex(index_path, BASE, MANY * 8 + 80)
    try:
        for offset, position in entries:
            index.append(offset, position)
        truncate_offset = entries[cut][0] if cut < MANY else entries[-1][0] + 1
        index.truncate_to(truncate_offset)
        assert index.entries == cut
        kept = entries[:cut]
        assert index.last_offset == (kept[-1][0] if kept else BASE)
        for target in (BASE, *(o for o, _ in entries[max(0, cut - 3) : cut + 3])):
            assert index.lookup(target) == expected_offset_lookup(kept, target)
        # an offset between two entries keeps the lower one
        index.truncate_to(kept[-1][0] + 1 if kept else BASE)
        assert index.entries == cut
        index.append(truncate_offset, 10**6)  # appends resume right after the cut
        assert index.entries == cut + 1
        index.close()
        assert file_entries(index_path, OFFSET_ENTRY) == [(o - BASE, p) for o, p in [*kept, (truncate_offset, 10**6)]]
    finally:
        index.close()


@pytest.mark.parametrize("cached_blocks", [None, 1000, 3], ids=["no-cache", "cache", "small-cache"])
def test_the_lookup_directory_follows_appends_truncations_and_resizes(
    index_path: Path, cached_blocks: int | None
) -> None:
    """The in-memory directory of block keys, built at the first lookup, stays right through everything that
    changes the entries: appends one by one and in bulk across block boundaries, truncations inside a block and at
    a boundary, and resizes that drop entries. So do the blocks an IndexBlockCache keeps (one that holds them all,
    one that lets most go): entries rewritten in the slots of a truncation are found, never the cached old ones."""
    entries = offset_entries(1500)
    cache = IndexBlockCache(cached_blocks) if cached_blocks is not None else None
    index = OffsetIndex(index_path, BASE, 4000 * 8, blocks=cache)

    def check(current: list[tuple[int, int]]) -> None:
        assert index.entries == len(current)
        for target in range(BASE - 2, BASE + 3 * 4000 + 5, 7):
            assert index.lookup(target) == expected_offset_lookup(current, target), target
        if cache is not None:  # whole blocks were kept (older generations too, until they age out), within the bound
            assert 0 < len(cache) <= cache.max_blocks

    try:
        for offset, position in entries:
            index.append(offset, position)
        check(entries)  # builds the directory
        for cut in (1300, 1024, 700):  # inside a block, at a boundary, inside an earlier block
            index.truncate_to(entries[cut][0])
            entries = entries[:cut]
            check(entries)
        more = [(BASE + 3 * i + 2, 100 * i + 9) for i in range(700, 1100)]
        for offset, position in more[:100]:  # one by one
            index.append(offset, position)
        index.append_entries(more[100:])  # in bulk, across the boundary at slot 1024
        entries = entries + more
        check(entries)
        index.resize(600 * 8)  # a resize that drops entries
        entries = entries[:600]
        check(entries)
        index.expand()
        index.append_entries([(BASE + 5000 + i, 10**6 + i) for i in range(1000)])
        entries = entries + [(BASE + 5000 + i, 10**6 + i) for i in range(1000)]
        check(entries)
    finally:
        index.close()
    with OffsetIndex(index_path, BASE, writable=False) as reopened:  # what was written is what was looked up
        assert [tuple(e) for e in reopened.entry_array().tolist()] == [(o - BASE, p) for o, p in entries]


def test_a_lookup_for_a_read_gives_the_floor_the_candidate_and_where_a_later_batch_starts(index_path: Path) -> None:
    """`lookup_for_read`: the floor entry; the candidate (the floor when it is for the target, else the entry after
    it); the position of the entry after the candidate; -1 for what the block read does not hold. Targets on and
    between entries, across block boundaries, below the first entry and past the last; cached and not."""
    entries = offset_entries(700)
    for cache in (None, IndexBlockCache()):
        with OffsetIndex(index_path, BASE, 700 * 8, blocks=cache) as index:
            if not index.entries:
                index.append_entries(entries)
            for target in range(BASE - 2, entries[-1][0] + 4):
                floor = bisect.bisect_right([o for o, _ in entries], target) - 1
                if floor < 0:
                    expected = (BASE, 0, -1, -1, -1)
                else:
                    candidate = floor if entries[floor][0] == target else floor + 1
                    block_end = (floor // 128 + 1) * 128  # the block read holds the floor's block only
                    cand = entries[candidate] if candidate < min(block_end, len(entries)) else (-1, -1)
                    later = candidate + 1
                    later_position = entries[later][1] if cand[0] >= 0 and later < min(block_end, len(entries)) else -1
                    expected = (*entries[floor], *cand, later_position)
                assert index.lookup_for_read(target) == expected, target


def test_a_lookup_never_answers_an_entry_above_its_target_when_the_file_changed_behind_it(index_path: Path) -> None:
    """A read-only reader keeps its directory of block keys; when a writer rewrites the entries under it, a lookup
    answers the right entry or the segment start (a safe place to scan from), never an entry past its target."""
    with OffsetIndex(index_path, BASE, 1500 * 8) as writer:
        writer.append_entries(offset_entries(1500))
    reader = OffsetIndex(index_path, BASE, writable=False)
    try:
        assert reader.lookup(BASE + 3 * 512 + 1) == OffsetPosition(BASE + 3 * 512 + 1, 100 * 512 + 7)
        shifted = [(offset + 1, position) for offset, position in offset_entries(1500)]
        index_path.write_bytes(b"".join(OFFSET_ENTRY.pack(o - BASE, p) for o, p in shifted))
        # the directory says block 1 starts at this target; block 1 now starts above it
        assert reader.lookup(BASE + 3 * 512 + 1) == OffsetPosition(BASE, 0)
        for target in range(BASE, BASE + 3 * 1500):  # the directory was read again: right answers from then on
            assert reader.lookup(target) == expected_offset_lookup(shifted, target), target
    finally:
        reader.close()


def test_entries_reach_the_file_a_tail_at_a_time_and_lookups_read_both(index_path: Path) -> None:
    """With the engine's IndexTails, new entries wait in memory until TAIL_BYTES of them are there or the tails are
    written, then go to the file in one write; lookups and entry reads see them all the time, across the boundary
    between file and memory; a flush writes the rest. Without, each entry is written when made."""
    with OffsetIndex(index_path.with_name("direct.index"), BASE, 4096) as direct:
        direct.append(BASE + 1, 7)
        assert file_entries(direct.path, OFFSET_ENTRY)[0] == (1, 7)
    per_tail = TAIL_BYTES // OFFSET_ENTRY.size
    entries = offset_entries(3 * per_tail + 100)
    tails = IndexTails()
    index = OffsetIndex(index_path, BASE, 4096 * OFFSET_ENTRY.size, tails=tails)
    try:
        for count, (offset, position) in enumerate(entries[: 2 * per_tail + 100], start=1):
            index.append(offset, position)
            in_file = len(index_path.read_bytes().rstrip(b"\0")) // OFFSET_ENTRY.size
            assert in_file == count // per_tail * per_tail, count
            if count in (per_tail - 1, per_tail + 1, 2 * per_tail + 37):
                for target in range(BASE - 2, offset + 3):
                    assert index.lookup(target) == expected_offset_lookup(entries[:count], target), (count, target)
                assert [index.entry_at(slot) for slot in range(count)] == entries[:count]
        tails.write()  # the engine's scheduler: what waits in memory reaches the file
        assert len(index_path.read_bytes().rstrip(b"\0")) // OFFSET_ENTRY.size == 2 * per_tail + 100
        for offset, position in entries[2 * per_tail + 100 :]:
            index.append(offset, position)
        index.flush()
        assert file_entries(index_path, OFFSET_ENTRY)[: len(entries)] == [(o - BASE, p) for o, p in entries]
    finally:
        index.close()


def test_offset_index_truncate_between_entries(index_path: Path) -> None:
    index = OffsetIndex(index_path, BASE, 4096)
    for offset in (10, 20, 30):
        index.append(BASE + offset, offset * 100)
    index.truncate_to(BASE + 25)  # drops only entries >= 25
    assert index.entries == 2
    assert index.last_offset == BASE + 20
    index.close()
    assert file_entries(index_path, OFFSET_ENTRY) == [(10, 1000), (20, 2000)]


def test_offset_index_trim_on_close_and_reopen_trusts_length(index_path: Path) -> None:
    entries = offset_entries(MANY)
    index = OffsetIndex(index_path, BASE, 10 * 1024 * 1024)
    for offset, position in entries:
        index.append(offset, position)
    index.close()
    assert index_path.stat().st_size == MANY * 8
    assert file_entries(index_path, OFFSET_ENTRY) == [(o - BASE, p) for o, p in entries]

    reopened = OffsetIndex(index_path, BASE, 10 * 1024 * 1024)
    try:
        assert index_path.stat().st_size == MANY * 8  # an existing file is not re-preallocated
        assert reopened.entries == MANY
        assert reopened.last_offset == entries[-1][0]
        assert reopened.is_full()
        for target in range(entries[-1][0] - 5000, entries[-1][0] + 3, 7):
            assert reopened.lookup(target) == expected_offset_lookup(entries, target)
        reopened.sanity_check(entries[-1][1] + 1)
        reopened.expand()  # becoming the active segment again
        assert index_path.stat().st_size == 10 * 1024 * 1024
        assert reopened.entries == MANY
        reopened.append(entries[-1][0] + 1, entries[-1][1] + 50)
    finally:
        reopened.close()
    assert index_path.stat().st_size == (MANY + 1) * 8


def test_reopen_counts_whatever_length_it_finds(index_path: Path) -> None:
    """Kafka trusts the length: a preallocated file left untrimmed reads back as all its zero entries."""
    index = OffsetIndex(index_path, BASE, 800)
    index.append(BASE + 1, 10)
    index.flush()
    # the first instance is deliberately left open (not trimmed), as after a crash
    reopened = OffsetIndex(index_path, BASE, 800)
    try:
        assert reopened.entries == 100
    finally:
        reopened.close()
        index.delete()


# --- offset index: sanity check ------------------------------------------------------------------------------------


def test_offset_index_sanity_check_passes_for_good_index(index_path: Path) -> None:
    index = OffsetIndex(index_path, BASE, 4096)
    index.append(BASE + 3, 0)
    index.append(BASE + 8, 500)
    index.sanity_check(log_size=1000)
    index.close()
    reopened = OffsetIndex(index_path, BASE, 4096)
    reopened.sanity_check(log_size=1000)
    reopened.close()


def test_offset_index_sanity_length_not_multiple(index_path: Path) -> None:
    index_path.write_bytes(OFFSET_ENTRY.pack(1, 0) + b"\x00\x00\x00")
    index = OffsetIndex(index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError):
            index.sanity_check(log_size=10_000)
    finally:
        index.close()


def test_offset_index_sanity_last_offset_below_base(index_path: Path) -> None:
    index_path.write_bytes(OFFSET_ENTRY.pack(1, 0) + OFFSET_ENTRY.pack(-5, 100))
    index = OffsetIndex(index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError):
            index.sanity_check(log_size=10_000)
    finally:
        index.close()


def test_offset_index_sanity_position_beyond_log(index_path: Path) -> None:
    index_path.write_bytes(OFFSET_ENTRY.pack(1, 0) + OFFSET_ENTRY.pack(5, 20_000))
    index = OffsetIndex(index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError):
            index.sanity_check(log_size=10_000)
        index.sanity_check(log_size=20_001)
    finally:
        index.close()


# --- time index ----------------------------------------------------------------------------------------------------


def test_time_index_entry_bytes(time_index_path: Path) -> None:
    index = TimeIndex(time_index_path, BASE, 4096)
    index.maybe_append(TS, BASE + 4)
    index.maybe_append(TS + 10, BASE + 9)
    index.close()
    assert time_index_path.read_bytes() == TIME_ENTRY.pack(TS, 4) + TIME_ENTRY.pack(TS + 10, 9)


def test_time_index_lookup_largest_lower_bound(time_index_path: Path) -> None:
    entries = time_entries(MANY)
    index = TimeIndex(time_index_path, BASE, (MANY + 1) * 12)  # one slot stays free
    try:
        for timestamp, offset in entries:
            index.maybe_append(timestamp, offset)
        assert index.entries == MANY
        assert index.is_full()
        assert index.last_entry == TimestampOffset(*entries[-1])
        for target in range(TS - 3, entries[-1][0] + 5):
            assert index.lookup(target) == expected_time_lookup(entries, target), target
        assert index.lookup(0) == TimestampOffset(-1, BASE)
    finally:
        index.close()


def test_time_index_only_appends_growing_timestamps(time_index_path: Path) -> None:
    index = TimeIndex(time_index_path, BASE, 4096)
    try:
        index.maybe_append(-1, BASE)  # NO_TIMESTAMP never becomes an entry
        assert index.entries == 0
        index.maybe_append(TS, BASE + 1)
        index.maybe_append(TS, BASE + 2)  # same timestamp: nothing new
        assert index.entries == 1
        index.maybe_append(TS + 1, BASE + 2)
        assert index.entries == 2
        assert index.last_entry == TimestampOffset(TS + 1, BASE + 2)
        with pytest.raises(CorruptIndexError):
            index.maybe_append(TS + 5, BASE + 1)  # offsets must not go back
        assert index.entries == 2
    finally:
        index.close()
    assert file_entries(time_index_path, TIME_ENTRY) == [(TS, 1), (TS + 1, 2)]


def test_time_index_keeps_one_slot_free(time_index_path: Path) -> None:
    index = TimeIndex(time_index_path, BASE, 120)  # 10 slots: full at 9 entries
    try:
        for i in range(9):
            assert not index.is_full()
            index.maybe_append(TS + i, BASE + i)
        assert index.entries == 9
        assert index.is_full()
        with pytest.raises(CorruptIndexError):
            index.maybe_append(TS + 100, BASE + 100)
        # the reserved slot takes the final entry of a roll or close
        index.maybe_append(TS + 100, BASE + 100, skip_full_check=True)
        assert index.entries == 10
        index.maybe_append(TS + 200, BASE + 200, skip_full_check=True)  # no room at all: silently dropped
        assert index.entries == 10
    finally:
        index.close()
    assert time_index_path.stat().st_size == 120


@pytest.mark.parametrize("cut", [0, 1, 1000, 2400, MANY - 1, MANY])
def test_time_index_truncate_to(time_index_path: Path, cut: int) -> None:
    entries = time_entries(MANY)
    index = TimeIndex(time_index_path, BASE, (MANY + 10) * 12)
    try:
        for timestamp, offset in entries:
            index.maybe_append(timestamp, offset)
        truncate_offset = entries[cut][1] if cut < MANY else entries[-1][1] + 1
        index.truncate_to(truncate_offset)
        kept = entries[:cut]
        assert index.entries == cut
        assert index.last_entry == (TimestampOffset(*kept[-1]) if kept else TimestampOffset(-1, BASE))
        for target in (TS, *(t for t, _ in entries[max(0, cut - 2) : cut + 2])):
            assert index.lookup(target) == expected_time_lookup(kept, target)
    finally:
        index.close()
    assert time_index_path.stat().st_size == cut * 12
    assert file_entries(time_index_path, TIME_ENTRY) == [(t, o - BASE) for t, o in entries[:cut]]


def test_time_index_trim_on_close_and_reopen_trusts_length(time_index_path: Path) -> None:
    entries = time_entries(MANY)
    index = TimeIndex(time_index_path, BASE, 10 * 1024 * 1024)
    for timestamp, offset in entries:
        index.maybe_append(timestamp, offset)
    index.close()
    assert time_index_path.stat().st_size == MANY * 12
    reopened = TimeIndex(time_index_path, BASE, 10 * 1024 * 1024)
    try:
        assert reopened.entries == MANY
        assert reopened.last_entry == TimestampOffset(*entries[-1])
        reopened.sanity_check()
        for target in range(TS - 1, entries[-1][0] + 2, 11):
            assert reopened.lookup(target) == expected_time_lookup(entries, target)
    finally:
        reopened.close()
    assert file_entries(time_index_path, TIME_ENTRY) == [(t, o - BASE) for t, o in entries]


def test_time_index_sanity_length_not_multiple(time_index_path: Path) -> None:
    time_index_path.write_bytes(TIME_ENTRY.pack(TS, 1) + b"\x00" * 5)
    index = TimeIndex(time_index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError):
            index.sanity_check()
    finally:
        index.close()


def test_time_index_sanity_last_offset_below_base(time_index_path: Path) -> None:
    time_index_path.write_bytes(TIME_ENTRY.pack(TS, 1) + TIME_ENTRY.pack(TS + 1, -7))
    index = TimeIndex(time_index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError):
            index.sanity_check()
    finally:
        index.close()


def test_time_index_sanity_last_timestamp_below_first(time_index_path: Path) -> None:
    time_index_path.write_bytes(TIME_ENTRY.pack(TS, 1) + TIME_ENTRY.pack(TS - 100, 2))
    index = TimeIndex(time_index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError):
            index.sanity_check()
    finally:
        index.close()


def test_sanity_check_accepts_empty_indexes(index_path: Path, time_index_path: Path) -> None:
    index_path.write_bytes(b"")
    time_index_path.write_bytes(b"")
    index = OffsetIndex(index_path, BASE, 4096)
    time_index = TimeIndex(time_index_path, BASE, 4096)
    try:
        index.sanity_check(log_size=0)
        time_index.sanity_check()
        assert index.lookup(BASE + 50) == OffsetPosition(BASE, 0)
        assert time_index.lookup(TS) == TimestampOffset(-1, BASE)
    finally:
        index.close()
        time_index.close()


def test_offset_index_sanity_interior_entry_out_of_order(index_path: Path) -> None:
    """A damaged entry in the middle (the last one looks fine) is found too."""
    entries = [(1, 100), (9, 250), (5, 400), (12, 600)]
    index_path.write_bytes(b"".join(OFFSET_ENTRY.pack(*e) for e in entries))
    index = OffsetIndex(index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError, match="entry 2"):
            index.sanity_check(log_size=10_000)
    finally:
        index.close()


def test_offset_index_sanity_zero_filled_tail(index_path: Path) -> None:
    """The preallocated tail a crash leaves behind reads as entries (0, 0): not trusted."""
    index_path.write_bytes(OFFSET_ENTRY.pack(1, 100) + OFFSET_ENTRY.pack(4, 300) + b"\x00" * 800)
    index = OffsetIndex(index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError):
            index.sanity_check(log_size=10_000)
    finally:
        index.close()


def test_time_index_sanity_interior_entry_out_of_order(time_index_path: Path) -> None:
    entries = [(TS, 1), (TS + 50, 4), (TS + 20, 6), (TS + 90, 9)]
    time_index_path.write_bytes(b"".join(TIME_ENTRY.pack(*e) for e in entries))
    index = TimeIndex(time_index_path, BASE, 4096)
    try:
        with pytest.raises(CorruptIndexError, match="entry 2"):
            index.sanity_check()
    finally:
        index.close()


# --- damage the index checks alone cannot see: found against the log at open, or at lookup ---------------------


def _closed_log(path: Path) -> tuple[Path, list[int]]:
    """A cleanly closed one-partition log with a few segments; returns the partition dir and its segment bases."""
    import tidelog
    from tidelog import Record

    with tidelog.open(path, config={"log.segment.bytes": 2000, "log.index.interval.bytes": 100}) as engine:
        engine.create_topic("t", 1)
        for i in range(120):
            engine.produce("t", 0, [Record(b"v%03d" % i * 10, key=b"k", timestamp_ms=TS + i)])
    partition_dir = path / "t-0"
    bases = sorted(int(p.name[:20]) for p in partition_dir.glob("*.log"))
    assert len(bases) >= 3
    return partition_dir, bases


def _check_every_offset(path: Path) -> None:
    import tidelog

    with tidelog.open(path, background=False) as engine:
        assert [r.value for r in engine.consume("t", 0)] == [b"v%03d" % i * 10 for i in range(120)]
        for offset in range(120):
            found = engine.read("t", 0, offset, 1).read_bytes()
            base, _length, _epoch, _magic = struct.unpack_from(">qiib", found)
            assert base == offset  # one record per batch
            assert engine.offset_for_timestamp("t", 0, TS + offset).offset == offset


def test_last_index_entry_pointing_inside_a_batch_is_rebuilt_at_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    partition_dir, bases = _closed_log(tmp_path / "data")
    index = partition_dir / f"{bases[1]:020d}.index"
    data = bytearray(index.read_bytes())
    relative, position = OFFSET_ENTRY.unpack_from(data, len(data) - 8)
    OFFSET_ENTRY.pack_into(data, len(data) - 8, relative, position + 3)  # still increasing, inside the log
    index.write_bytes(bytes(data))
    _check_every_offset(tmp_path / "data")
    assert f"rebuilding the indexes of segment {bases[1]}" in caplog.text


def test_interior_index_entry_pointing_inside_a_batch_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    partition_dir, bases = _closed_log(tmp_path / "data")
    index = partition_dir / f"{bases[1]:020d}.index"
    data = bytearray(index.read_bytes())
    assert len(data) >= 24
    relative, position = OFFSET_ENTRY.unpack_from(data, 8)
    OFFSET_ENTRY.pack_into(data, 8, relative, position + 1)  # passes every check at open
    index.write_bytes(bytes(data))
    _check_every_offset(tmp_path / "data")
    assert "scanning the segment instead" in caplog.text


def test_time_index_cut_at_an_entry_boundary_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Losing the final (max timestamp) entry would make the segment look older than it is."""
    partition_dir, bases = _closed_log(tmp_path / "data")
    time_index = partition_dir / f"{bases[0]:020d}.timeindex"
    time_index.write_bytes(time_index.read_bytes()[:12])
    _check_every_offset(tmp_path / "data")
    assert "below the timestamp" in caplog.text


# --- read-only opening (the Spark path reader, dump-log), next to a live writer -----------------------------------


def test_read_only_open_of_a_missing_index_creates_nothing(index_path: Path, time_index_path: Path) -> None:
    with (
        OffsetIndex(index_path, BASE, writable=False) as index,
        TimeIndex(time_index_path, BASE, writable=False) as time_index,
    ):
        assert index.entries == time_index.entries == 0
        assert index.lookup(BASE + 5) == OffsetPosition(BASE, 0)
        assert [len(a) for a in (*index.valid_arrays(), *time_index.valid_arrays())] == [0, 0, 0, 0]
    assert not index_path.exists() and not time_index_path.exists()


def test_read_only_index_of_a_live_active_segment(index_path: Path) -> None:
    """The writer's file is preallocated and zero-filled past its entries: a reader counts its length as Kafka
    does, trusts only the written entries, sees entries appended later, never writes, and keeps working (zeros
    past the end, no SIGBUS) when the writer trims the file under it."""
    entries = offset_entries(300)
    writer = OffsetIndex(index_path, BASE, 4096)
    for offset, position in entries[:100]:
        writer.append(offset, position)
    before = index_path.read_bytes()
    reader = OffsetIndex(index_path, BASE, writable=False)
    assert reader.entries == 4096 // 8  # Kafka's count: the preallocated length
    offsets, positions = reader.valid_arrays()
    assert list(zip(offsets.tolist(), positions.tolist(), strict=True)) == entries[:100]
    with pytest.raises(TidelogError):  # the file's length counts as full, and the descriptor is O_RDONLY
        reader.append(entries[100][0], entries[100][1])
    with pytest.raises(OSError):
        reader.resize(80)
    assert index_path.read_bytes() == before
    for offset, position in entries[100:200]:
        writer.append(offset, position)
    assert len(reader.valid_arrays()[0]) == 200  # the file's bytes are read each time
    writer.close()  # trimmed to 200 entries while the reader still counts 512
    assert index_path.stat().st_size == 200 * 8
    assert reader.entry_at(511) == OffsetPosition(BASE, 0)  # past the end: the zeros the tail held
    assert len(reader.valid_arrays()[0]) == 200
    for offset, position in entries[:200]:  # a lookup over the zero slots lands on (base, 0) at worst: a safe start
        found = reader.lookup(offset)
        assert found in (OffsetPosition(offset, position), OffsetPosition(BASE, 0))
    reader.close()
    assert index_path.stat().st_size == 200 * 8


def test_read_only_time_index_trusts_written_entries_in_append_order(time_index_path: Path) -> None:
    entries = time_entries(50)
    raw = [TIME_ENTRY.pack(t, o - BASE) for t, o in entries]
    raw[30] = TIME_ENTRY.pack(entries[29][0], entries[30][1] - BASE)  # a timestamp that does not grow: damage
    time_index_path.write_bytes(b"".join(raw) + bytes(12 * 20))
    with TimeIndex(time_index_path, BASE, writable=False) as index:
        assert index.entries == 70
        timestamps, offsets = index.valid_arrays()
        assert list(zip(timestamps.tolist(), offsets.tolist(), strict=True)) == entries[:30]
        with pytest.raises(CorruptIndexError, match="last timestamp is 0"):  # Kafka's check sees the zero tail
            index.kafka_sanity_check()


def test_every_offset_is_found_whatever_the_batch_sizes(tmp_path: Path) -> None:
    """Lookups search each read of the log by halves: batches of 1 to 40 records, sparse and dense index entries."""
    import random

    import tidelog
    from tidelog import Record

    rnd = random.Random(5)
    for interval in (100, 4096):
        with tidelog.open(tmp_path / f"i{interval}", config={"log.index.interval.bytes": interval}) as engine:
            engine.create_topic("t", 1)
            ends = []
            for _ in range(300):
                count = rnd.choice([1, 1, 2, 5, 40])
                engine.produce("t", 0, [Record(b"x" * rnd.randrange(200), timestamp_ms=TS) for _ in range(count)])
                ends.append(engine.log_end_offset("t", 0))
            for offset in range(ends[-1]):
                found = engine.read("t", 0, offset, 1).read_bytes()
                base, _length, _epoch, _magic = struct.unpack_from(">qiib", found)
                assert base == ([0, *ends][bisect.bisect_right(ends, offset)]), offset


def test_an_index_entry_naming_an_earlier_batch_is_not_taken_for_the_target(tmp_path: Path) -> None:
    """Every batch is indexed (each is larger than the index interval), so a lookup reads only the header of the
    batch the entry after its floor names. One entry damaged to name the batch before its own (entries still
    increasing, so nothing notices at open): the header read there ends below the target and is not taken; the
    walk from the floor entry finds the right batch."""
    import tidelog
    from tidelog import Record

    data = tmp_path / "data"
    config = {"log.index.interval.bytes": 100}
    with tidelog.open(data, config=config) as engine:
        engine.create_topic("t", 1)
        for i in range(40):
            engine.produce("t", 0, [Record(b"%03d-%d" % (i, j) * 10, timestamp_ms=TS + i) for j in range(5)])
    index = data / "t-0" / f"{0:020d}.index"
    entries = [OFFSET_ENTRY.unpack_from(index.read_bytes(), at) for at in range(0, index.stat().st_size, 8)]
    # each batch's last offset, from the second batch on (Kafka indexes a batch once more than the interval's
    # bytes were appended since the last entry)
    assert [relative for relative, _ in entries] == [5 * i + 4 for i in range(1, 40)]
    # drop batch 20's entry and let batch 21's (offsets 105-109) name batch 20's start (offsets 100-104)
    damaged = [*entries[:19], (entries[20][0], entries[19][1]), *entries[21:]]
    index.write_bytes(b"".join(OFFSET_ENTRY.pack(*entry) for entry in damaged))
    with tidelog.open(data, config=config, background=False) as engine:
        for offset in range(200):
            found = engine.read("t", 0, offset, 1).read_bytes()
            base, _length = struct.unpack_from(">qi", found)
            assert base == offset - offset % 5, offset
    assert index.read_bytes() == b"".join(OFFSET_ENTRY.pack(*entry) for entry in damaged)  # not rebuilt at open
