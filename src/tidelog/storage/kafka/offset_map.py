"""The log cleaner's offset map: record key -> offset of its latest occurrence in the dirty range
(Kafka's SkimpyOffsetMap).

Kafka keeps MD5(key) -> offset in an open-addressing table of 24-byte entries inside
`log.cleaner.dedupe.buffer.size` bytes, filled up to a load factor of 0.9. Here a dict keyed by a 16-byte digest
of the key (codec/record_layout.key_digests, computed for a chunk of records at once) holds the same mapping, and the
same memory accounting bounds it: at most `0.9 * dedupe_buffer_size / 24` keys per pass. When it is full the pass
ends after the batch that filled it, at `latest_offset + 1`, as in Kafka. Keys go in many at a time
(`put_many`), offsets ascending; then `freeze()` turns the map into sorted arrays, so the recopy phase looks up
a chunk of keys with one vectorised binary search (`get_many`).
"""

from __future__ import annotations

from collections.abc import Sequence

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
        self._high = self._low = np.zeros(0, dtype=np.uint64)
        self._values = np.zeros(0, dtype=np.int64)

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

    def freeze(self) -> None:
        """End of the map phase: the entries as arrays sorted by digest, for get_many."""
        digests = np.frombuffer(b"".join(self.offsets), dtype=np.uint64).reshape(-1, 2)
        values = np.fromiter(self.offsets.values(), dtype=np.int64, count=len(self.offsets))
        order = np.lexsort((digests[:, 1], digests[:, 0]))
        self._high, self._low, self._values = digests[order, 0], digests[order, 1], values[order]

    def get_many(self, digests: np.ndarray) -> np.ndarray:
        """The latest offset of each key (digests as key_digest_array rows), NOT_FOUND for keys the map lacks."""
        found = np.full(len(digests), NOT_FOUND, dtype=np.int64)
        size = len(self._high)
        if size == 0 or len(digests) == 0:
            return found
        high, low = digests[:, 0], digests[:, 1]
        slot = np.searchsorted(self._high, high)
        pending = np.arange(len(digests))
        while len(pending):  # entries sharing the first half of a digest are next to each other (almost never)
            at = np.minimum(slot[pending], size - 1)
            same_high = (slot[pending] < size) & (self._high[at] == high[pending])
            hit = same_high & (self._low[at] == low[pending])
            found[pending[hit]] = self._values[at[hit]]
            pending = pending[same_high & ~hit]
            slot[pending] += 1
        return found
