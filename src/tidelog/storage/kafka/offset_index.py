"""`<base>.index`: sparse map from offset to file position in a segment's `.log` (Kafka's OffsetIndex).

Entry, 8 bytes big-endian: relativeOffset int32 (offset - segment base) | position int32.
An entry (O, P) means "the batch whose last offset is O starts at byte P"; appends are strictly
increasing. `lookup(t)` gives the greatest entry with offset <= t, or (base, 0); scanning batches
forward from there reaches the batch holding t.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from tidelog.errors import CorruptIndexError
from tidelog.storage.kafka.mapped_index import MappedIndex

SUFFIX = ".index"


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class OffsetIndex(MappedIndex):
    entry = struct.Struct(">ii")

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        super().__init__(path, base_offset, max_index_size)
        self.last_offset = self._read_last_offset()

    def _relative_offset(self, slot: int) -> int:
        assert self._map is not None
        return self.entry.unpack_from(self._map, slot * 8)[0]

    def _read_last_offset(self) -> int:
        return self.base_offset + (self._relative_offset(self.entries - 1) if self.entries else 0)

    def entry_at(self, slot: int) -> OffsetPosition:
        relative, position = self.read_entry(slot)
        return OffsetPosition(self.base_offset + relative, position)

    def append(self, offset: int, position: int) -> None:
        if self.entries and offset <= self.last_offset:
            raise CorruptIndexError(
                f"{self.path}: entry for offset {offset} is not larger than the last entry {self.last_offset}"
            )
        if self.is_full():
            raise CorruptIndexError(f"{self.path}: index is full ({self.entries} entries)")
        self._write_entry(offset - self.base_offset, position)
        self.last_offset = offset

    def append_entries(self, entries: list[tuple[int, int]]) -> None:
        """Bulk append of (offset, position) pairs already known to increase and to fit (recovery)."""
        entries = entries[: self.max_entries - self.entries]
        if entries:
            self._write_entries([v for offset, position in entries for v in (offset - self.base_offset, position)])
            self.last_offset = entries[-1][0]

    def lookup(self, target_offset: int) -> OffsetPosition:
        slot = self._largest_lower_bound(target_offset - self.base_offset, self._relative_offset)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return self.entry_at(slot)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry for an offset >= `offset`."""
        relative = offset - self.base_offset
        slot = self._largest_lower_bound(relative, self._relative_offset)
        if slot < 0:
            keep = 0
        elif self._relative_offset(slot) == relative:
            keep = slot
        else:
            keep = slot + 1
        self.truncate_entries(keep)
        self.last_offset = self._read_last_offset()

    def reset(self) -> None:
        super().reset()
        self.last_offset = self.base_offset

    def sanity_check(self, log_size: int) -> None:
        """Kafka's check (plus: positions inside the log), run before trusting an index found on disk."""
        if self._length % self.entry.size:
            raise CorruptIndexError(f"{self.path}: length {self._length} is not a multiple of {self.entry.size}")
        if self.entries and self.last_offset < self.base_offset:
            raise CorruptIndexError(
                f"{self.path}: last offset {self.last_offset} is below the segment base {self.base_offset}"
            )
        if self.entries and self.entry_at(self.entries - 1).position >= max(log_size, 1):
            raise CorruptIndexError(f"{self.path}: last entry points beyond the end of the log ({log_size} bytes)")
        # appends only ever add larger offsets at larger positions: anything else is damage (or the zero-filled
        # preallocated tail a crash leaves behind)
        previous_offset = previous_position = -1
        for slot, (relative, position) in enumerate(self.entry.iter_unpack(self.entry_bytes())):
            if relative <= previous_offset or position <= previous_position:
                raise CorruptIndexError(
                    f"{self.path}: entry {slot} ({self.base_offset + relative} at byte {position}) does not follow "
                    f"the entry before it"
                )
            previous_offset, previous_position = relative, position
