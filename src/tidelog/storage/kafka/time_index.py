"""`<base>.timeindex`: sparse map from timestamp to offset in a segment (Kafka's TimeIndex).

Entry, 12 bytes big-endian: timestamp int64 | relativeOffset int32. (T, O) means "the largest
timestamp in the segment up to and including the batch whose last offset is O is T", so any record
with a timestamp above T lies after O. Entries are added only when the timestamp grows, so
timestamps in the file strictly increase. One slot is kept free for the final entry written when
the segment is rolled or closed, which always records the segment's max timestamp. The storage engine opens it
writable; the Spark path reader and the dump-log tool read-only (abstract_index.py).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from tidelog.errors import CorruptIndexError
from tidelog.storage.kafka.abstract_index import AbstractIndex

SUFFIX = ".timeindex"
NO_TIMESTAMP = -1


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex(AbstractIndex):
    entry = struct.Struct(">qi")
    entry_dtype = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
    key_field = "timestamp"

    last_entry: TimestampOffset

    def _opened(self) -> None:
        self.last_entry = self._read_last_entry()

    def _timestamp(self, slot: int) -> int:
        return self.read_entry(slot)[0]

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
        slot = self._largest_lower_bound(target_timestamp)
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

    def valid_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """`valid_entries()` as int64 arrays: (timestamps, absolute offsets)."""
        entries = self.valid_entries()
        return entries["timestamp"].astype(np.int64), entries["relative_offset"].astype(np.int64) + self.base_offset

    def _rules_kept(self, entries: np.ndarray) -> int:
        """Timestamps strictly increase (from above NO_TIMESTAMP) and offsets never go back (maybe_append's rules)."""
        timestamps = entries["timestamp"].astype(np.int64)
        offsets = entries["relative_offset"].astype(np.int64)
        broken = (timestamps <= np.append(NO_TIMESTAMP, timestamps[:-1])) | (offsets < np.append(0, offsets[:-1]))
        return int(np.argmax(broken)) if broken.any() else len(entries)

    def kafka_sanity_check(self) -> None:
        """Kafka's TimeIndex.sanityCheck, in its order and with its messages (what kafka-dump-log
        --index-sanity-check prints): a zero-filled preallocated tail fails the first."""
        if self.entries and self.last_entry.timestamp < self._timestamp(0):
            raise CorruptIndexError(
                f"Corrupt time index found, time index file ({self.path.resolve()}) has non-zero size but the last "
                f"timestamp is {self.last_entry.timestamp} which is less than the first entry {self._timestamp(0)}"
            )
        if self.entries and self.last_entry.offset < self.base_offset:
            raise CorruptIndexError(
                f"Corrupt time index found, time index file ({self.path.resolve()}) has non-zero size but the last "
                f"offset is {self.last_entry.offset} which is less than the first offset {self.base_offset}"
            )
        if self._length % self.entry.size:
            raise CorruptIndexError(
                f"Time index file {self.path.resolve()} is corrupt, found {self._length} bytes which is neither "
                f"positive nor a multiple of {self.entry.size}."
            )

    def sanity_check(self) -> None:
        """Kafka's check, plus: entries in the order maybe_append keeps. Run before trusting an index found on disk."""
        self.kafka_sanity_check()
        self.check_entries()
