"""`<base>.timeindex`: sparse map from timestamp to offset in a segment (Kafka's TimeIndex).

Entry, 12 bytes big-endian: timestamp int64 | relativeOffset int32. (T, O) means "the largest
timestamp in the segment up to and including the batch whose last offset is O is T", so any record
with a timestamp above T lies after O. Entries are added only when the timestamp grows, so
timestamps in the file strictly increase. One slot is kept free for the final entry written when
the segment is rolled or closed, which always records the segment's max timestamp.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from tidelog.errors import CorruptIndexError
from tidelog.storage.kafka.mapped_index import MappedIndex

SUFFIX = ".timeindex"
NO_TIMESTAMP = -1


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex(MappedIndex):
    entry = struct.Struct(">qi")

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        super().__init__(path, base_offset, max_index_size)
        self.last_entry = self._read_last_entry()

    def _timestamp(self, slot: int) -> int:
        assert self._map is not None
        return self.entry.unpack_from(self._map, slot * 12)[0]

    def _read_last_entry(self) -> TimestampOffset:
        if self.entries == 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry_at(self.entries - 1)

    def entry_at(self, slot: int) -> TimestampOffset:
        timestamp, relative = self.read_entry(slot)
        return TimestampOffset(timestamp, self.base_offset + relative)

    def is_full(self) -> bool:
        return self.entries >= self.max_entries - 1

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        if not skip_full_check and self.is_full():
            raise CorruptIndexError(f"{self.path}: time index is full ({self.entries} entries)")
        if self.entries and offset < self.last_entry.offset:
            raise CorruptIndexError(
                f"{self.path}: entry for offset {offset} is below the last entry's offset {self.last_entry.offset}"
            )
        if timestamp <= self.last_entry.timestamp or self.entries >= self.max_entries:
            return
        self._write_entry(timestamp, offset - self.base_offset)
        self.last_entry = TimestampOffset(timestamp, offset)

    def append_entries(self, entries: list[tuple[int, int]]) -> None:
        """Bulk append of (timestamp, offset) pairs with growing timestamps (recovery); keeps the last slot free."""
        entries = entries[: max(0, self.max_entries - 1 - self.entries)]
        if entries:
            self._write_entries([v for timestamp, offset in entries for v in (timestamp, offset - self.base_offset)])
            self.last_entry = TimestampOffset(*entries[-1])

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """Greatest entry with timestamp <= target, or (-1, base offset)."""
        slot = self._largest_lower_bound(target_timestamp, self._timestamp)
        if slot < 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry_at(slot)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry for an offset >= `offset` (a linear walk back from the end; truncation is rare)."""
        keep = self.entries
        while keep and self.entry_at(keep - 1).offset >= offset:
            keep -= 1
        self.truncate_entries(keep)
        self.last_entry = self._read_last_entry()

    def reset(self) -> None:
        super().reset()
        self.last_entry = TimestampOffset(NO_TIMESTAMP, self.base_offset)

    def sanity_check(self) -> None:
        if self._length % self.entry.size:
            raise CorruptIndexError(f"{self.path}: length {self._length} is not a multiple of {self.entry.size}")
        if self.entries and self.last_entry.offset < self.base_offset:
            raise CorruptIndexError(
                f"{self.path}: last offset {self.last_entry.offset} is below the segment base {self.base_offset}"
            )
        if self.entries and self.last_entry.timestamp < self._timestamp(0):
            raise CorruptIndexError(f"{self.path}: last timestamp is below the first one")
        # timestamps strictly increase and offsets never go back (maybe_append's rules)
        previous_timestamp, previous_offset = NO_TIMESTAMP, 0
        for slot, (timestamp, relative) in enumerate(self.entry.iter_unpack(self.entry_bytes())):
            if timestamp <= previous_timestamp or relative < previous_offset:
                raise CorruptIndexError(
                    f"{self.path}: entry {slot} ({timestamp}, {self.base_offset + relative}) does not follow "
                    f"the entry before it"
                )
            previous_timestamp, previous_offset = timestamp, relative
