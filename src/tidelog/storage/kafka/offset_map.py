"""The log cleaner's offset map: record key -> offset of its latest occurrence in the dirty range
(Kafka's SkimpyOffsetMap).

Kafka keeps MD5(key) -> offset in an open-addressing table of 24-byte entries inside
`log.cleaner.dedupe.buffer.size` bytes, filled up to a load factor of 0.9. Here a dict keyed by a 16-byte digest
of the key (codec/columnar.key_digests, computed for a chunk of records at once) holds the same mapping, and the
same memory accounting bounds it: at most `0.9 * dedupe_buffer_size / 24` keys per pass. When it is full the pass
ends after the batch that filled it, at `latest_offset + 1`, as in Kafka. Keys go in many at a time
(`put_many`), offsets ascending.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np

ENTRY_BYTES = 24  # MD5 (16) + offset (8)
LOAD_FACTOR = 0.9
NOT_FOUND = -1


class OffsetMap:
    def __init__(self, memory_bytes: int) -> None:
        slots = memory_bytes // ENTRY_BYTES
        self.max_entries = max(1, int(slots * LOAD_FACTOR))
        self.offsets: dict[bytes, int] = {}  # key digest -> offset
        self.latest_offset = -1  # the last offset covered (every batch read, with or without keys)

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def is_full(self) -> bool:
        return len(self.offsets) >= self.max_entries

    def room_for(self, new_keys: int) -> bool:
        """Can `new_keys` more entries (an upper bound: some may be updates) go in without passing the limit?"""
        return len(self.offsets) + new_keys <= self.max_entries

    def put_many(self, keys: Sequence[bytes], offsets: Sequence[int]) -> None:
        """Record keys at ascending offsets: a later occurrence of a key replaces an earlier one."""
        self.offsets.update(zip(keys, offsets, strict=True))

    def get_many(self, keys: Sequence[bytes]) -> np.ndarray:
        """The latest offset of each key, NOT_FOUND for keys the dirty range does not hold."""
        return np.fromiter(map(self.offsets.get, keys, repeat(NOT_FOUND)), dtype=np.int64, count=len(keys))
