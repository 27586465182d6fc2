"""`<base>.index`: sparse map from offset to file position in a segment's `.log` (Kafka's OffsetIndex).

Entry, 8 bytes big-endian: relativeOffset int32 (offset - segment base) | position int32.
An entry (O, P) means "the batch whose last offset is O starts at byte P"; appends are strictly
increasing. `lookup(t)` gives the greatest entry with offset <= t, or (base, 0); scanning batches
forward from there reaches the batch holding t. The storage engine opens it writable; the Spark path reader and
the dump-log tool read-only (abstract_index.py).
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import NamedTuple

import numpy as np

from tidelog.errors import CorruptIndexError
from tidelog.storage.kafka.abstract_index import AbstractIndex

SUFFIX = ".index"
_TWO_ENTRIES = struct.Struct(">iiii")
_THREE_ENTRIES = struct.Struct(">iiiiii")


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class OffsetIndex(AbstractIndex):
    entry = struct.Struct(">ii")
    entry_dtype = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
    key_field = "relative_offset"

    last_offset: int

    def _opened(self) -> None:
        self.last_offset = self._read_last_offset()

    def _relative_offset(self, slot: int) -> int:
        return self.read_entry(slot)[0]

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

    def _keys_of(self, data: bytes) -> array[int]:
        """Relative offsets: every other big-endian int32."""
        words = array("i", data)
        if sys.byteorder == "little":
            words.byteswap()
        return words[::2]

    def lookup(self, target_offset: int) -> OffsetPosition:
        offset, position, _, _, _ = self.lookup_for_read(target_offset)
        return OffsetPosition(offset, position)

    def lookup_for_read(self, target_offset: int) -> tuple[int, int, int, int, int]:
        """What a read needs of the index, from the one block a lookup reads, as plain integers (this runs for every
        read): `lookup(target)` as (offset, position); the candidate entry (offset, position): the floor entry when
        it is for the target, else the entry after it - each entry names the batch that ends at its offset, so the
        batch holding the target is the candidate's when that batch starts at or below the target; and the position
        of the entry after the candidate, where a later batch starts. Entries the block does not hold are -1."""
        base = self.base_offset
        slot, block, first = self._floor(target_offset - base)
        if slot < 0:
            return base, 0, -1, -1, -1
        at = (slot - first) * 8
        available = len(block) - at
        if available >= 24:
            relative, position, next_relative, next_position, _, later_position = _THREE_ENTRIES.unpack_from(block, at)
            if relative + base == target_offset:
                return target_offset, position, target_offset, position, next_position
            return relative + base, position, next_relative + base, next_position, later_position
        if available >= 16:
            relative, position, next_relative, next_position = _TWO_ENTRIES.unpack_from(block, at)
            if relative + base == target_offset:
                return target_offset, position, target_offset, position, next_position
            return relative + base, position, next_relative + base, next_position, -1
        relative, position = self.entry.unpack_from(block, at)
        if relative + base == target_offset:
            return target_offset, position, target_offset, position, -1
        return relative + base, position, -1, -1, -1

    def truncate_to(self, offset: int) -> None:
        """Drop every entry for an offset >= `offset`."""
        relative = offset - self.base_offset
        slot = self._largest_lower_bound(relative)
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

    def valid_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """`valid_entries()` as int64 arrays: (absolute offsets, positions)."""
        entries = self.valid_entries()
        return entries["relative_offset"].astype(np.int64) + self.base_offset, entries["position"].astype(np.int64)

    def _rules_kept(self, entries: np.ndarray) -> int:
        """Offsets and positions strictly increase (from above -1)."""
        offsets = entries["relative_offset"].astype(np.int64)
        positions = entries["position"].astype(np.int64)
        broken = (offsets <= np.append(-1, offsets[:-1])) | (positions <= np.append(-1, positions[:-1]))
        return int(np.argmax(broken)) if broken.any() else len(entries)

    def kafka_sanity_check(self) -> None:
        """Kafka's OffsetIndex.sanityCheck, with its messages (what kafka-dump-log --index-sanity-check prints)."""
        if self.entries and self.last_offset < self.base_offset:
            raise CorruptIndexError(
                f"Corrupt index found, index file ({self.path.resolve()}) has non-zero size but the last offset is "
                f"{self.last_offset} which is less than the base offset {self.base_offset}."
            )
        if self._length % self.entry.size:
            raise CorruptIndexError(
                f"Index file {self.path.resolve()} is corrupt, found {self._length} bytes which is neither positive "
                f"nor a multiple of {self.entry.size}."
            )

    def sanity_check(self, log_size: int) -> None:
        """Kafka's check, plus: entries in the order appends keep, and inside the log. Run before trusting an index
        found on disk (the zero-filled preallocated tail a crash leaves behind is not trusted)."""
        self.kafka_sanity_check()
        self.check_entries()
        if self.entries and self.entry_at(self.entries - 1).position >= max(log_size, 1):
            raise CorruptIndexError(f"{self.path}: last entry points beyond the end of the log ({log_size} bytes)")
