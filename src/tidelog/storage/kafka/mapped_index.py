"""What Kafka's offset and time indexes share (AbstractIndex): a file of fixed-size entries, no header, no checksum.

Opened writable (the storage engine's own segments), the file is memory-mapped. A new file is preallocated to
`segment.index.bytes` rounded down to whole entries; an existing file is trusted as it is (entries = length /
entry size), which is why an index must be trimmed to its real size on roll and on close, and re-expanded when
its segment becomes active again. Lookups search the last 8 KiB ("warm" section) first: tail reads then touch
only pages that are already in the page cache.

Opened read-only (`writable=False`, as Kafka's DumpLogSegments opens its indexes; the Spark path reader, the
dump-log tool), nothing is created, written or mapped: entries are read with pread, since a mapped file that its
writer trims (on roll) is a SIGBUS. The length found at open counts the entries, as Kafka does; bytes past a
shorter file's end read as zeros, which is what the preallocated tail held. A lookup in a live broker's
preallocated file may land on that tail, whose entries name position 0: a safe, slower place to scan from.
`valid_entries()` gives what a reader can rely on in such a file: the entries before the zero-filled tail, up to
the first that breaks the order appends keep.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np

from tidelog.errors import CorruptIndexError, KafkaStorageError

WARM_SECTION_BYTES = 8192


class MappedIndex:
    entry: struct.Struct  # set by subclasses
    entry_dtype: np.dtype  # the same entry as a numpy record, for reading many at once

    def __init__(self, path: Path, base_offset: int, max_index_size: int = 0, *, writable: bool = True) -> None:
        """`max_index_size` is the size a new writable file is preallocated to; read-only it is the length found."""
        self.path = path
        self.base_offset = base_offset
        self.writable = writable
        self._guard = threading.Lock()  # remapping vs. a concurrent flush from the flusher thread
        size = self.entry.size
        self._map: mmap.mmap | None = None
        if not writable:
            try:
                self._fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # no index: no entries
                self._fd = -1
            self._length = os.fstat(self._fd).st_size if self._fd >= 0 else 0
            self.entries = self._length // size
            self.max_index_size = self._length - self._length % size
            return
        self.max_index_size = max(size, max_index_size - max_index_size % size)
        existed = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if existed:
            length = os.fstat(self._fd).st_size
            self.entries = length // size
            self._length = length
        else:
            os.ftruncate(self._fd, self.max_index_size)
            self.entries = 0
            self._length = self.max_index_size
        if self._length:
            self._map = mmap.mmap(self._fd, self._length)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # --- size management ----------------------------------------------------------------------------------------

    @property
    def max_entries(self) -> int:
        return self._length // self.entry.size

    @property
    def size_in_bytes(self) -> int:
        return self.entries * self.entry.size

    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def resize(self, new_size: int) -> None:
        """Set the file (and mapping) length, keeping the entries that fit; the file is never left partial."""
        size = self.entry.size
        new_length = max(0, new_size - new_size % size)
        with self._guard:
            if new_length == self._length:
                return
            if self._map is not None:
                self._map.flush()
                self._map.close()
                self._map = None
            os.ftruncate(self._fd, new_length)
            self._length = new_length
            self.entries = min(self.entries, new_length // size)
            if new_length:
                self._map = mmap.mmap(self._fd, new_length)

    def trim_to_valid_size(self) -> None:
        self.resize(self.entries * self.entry.size)

    def expand(self) -> None:
        """Re-grow to the preallocated size so the (active) segment can append again."""
        self.resize(self.max_index_size)

    def truncate_entries(self, entries: int) -> None:
        """Forget entries from slot `entries` on (the bytes stay until overwritten or trimmed, as in Kafka)."""
        self.entries = max(0, min(self.entries, entries))

    def reset(self) -> None:
        """Forget every entry and grow back to the preallocated size (a rebuild may need all of it)."""
        self.truncate_entries(0)
        self.expand()

    # --- entries ------------------------------------------------------------------------------------------------

    def read_entry(self, n: int) -> tuple[int, ...]:
        if self._map is not None:
            return self.entry.unpack_from(self._map, n * self.entry.size)
        return self.entry.unpack(self._read_entries(n, 1))

    def _read_entries(self, first: int, count: int) -> bytes:
        """Entries [first, first + count) as bytes: from the mapping, or read from the file (zeros past its end)."""
        size = self.entry.size
        if self._map is not None:
            return self._map[first * size : (first + count) * size]
        if count <= 0 or self._fd < 0:
            return b""
        data = os.pread(self._fd, count * size, first * size)
        return data.ljust(count * size, b"\0")

    def entry_array(self, count: int | None = None) -> np.ndarray:
        """The first `count` entries (default all) as a structured numpy array of `entry_dtype` (a copy)."""
        count = self.entries if count is None else count
        return np.frombuffer(self._read_entries(0, count), dtype=self.entry_dtype)

    def _written_entries(self) -> int:
        """Entries before the zero-filled preallocated tail (a binary search: written entries are not all zero)."""
        zero = bytes(self.entry.size)
        lo, hi = 0, self.entries
        while lo < hi:
            mid = (lo + hi) // 2
            if self._read_entries(mid, 1) == zero:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _rules_kept(self, entries: np.ndarray) -> int:
        """How many leading `entries` keep the order appends keep (set by subclasses)."""
        raise NotImplementedError

    def valid_entries(self) -> np.ndarray:
        """What a reader can rely on, as `entry_array`: the written entries up to the first that breaks the order
        appends keep (a live writer's index is preallocated, and one damaged or torn may hold anything)."""
        entries = self.entry_array(self._written_entries())
        return entries[: self._rules_kept(entries)]

    def check_entries(self) -> None:
        """Every entry keeps the order appends keep (the zero-filled tail an untrimmed file has does not)."""
        entries = self.entry_array()
        kept = self._rules_kept(entries)
        if kept < len(entries):
            raise CorruptIndexError(
                f"{self.path}: entry {kept} {tuple(entries[kept].tolist())} does not follow the entry before it"
            )

    def _write_entries(self, flat_fields: list[int]) -> None:
        """Append many entries at once (recovery); `flat_fields` holds each entry's fields in a row."""
        count = len(flat_fields) // len(self.entry.format.lstrip(">"))
        if not count:
            return
        packed = struct.pack(">" + self.entry.format.lstrip(">") * count, *flat_fields)
        with self._guard:
            self._pwrite(packed, self.entries * self.entry.size)
            self.entries += count

    def _write_entry(self, *fields: int) -> None:
        with self._guard:
            self._pwrite(self.entry.pack(*fields), self.entries * self.entry.size)
            self.entries += 1

    def _pwrite(self, data: bytes, position: int) -> None:
        """Entries are written with pwrite, not through the mapping: the preallocated file is sparse, and a
        store into a hole on a full disk is a SIGBUS that kills the process, where pwrite reports ENOSPC.
        The mapping shares the page cache, so lookups see the entry at once."""
        try:
            os.pwrite(self._fd, data, position)
        except OSError as exc:
            raise KafkaStorageError(f"cannot write index entry to {self.path}: {exc.strerror}") from exc

    def _largest_lower_bound(self, target: int) -> int:
        """Slot of the greatest entry whose key (its first field: relative offset, timestamp) <= target, or -1:
        Kafka's warm-then-cold binary search."""
        entries = self.entries
        if entries == 0:
            return -1
        key = self._key()
        warm = WARM_SECTION_BYTES // self.entry.size
        first_hot = max(0, entries - 1 - warm)
        if key(first_hot) < target:
            return self._binary_search(target, key, first_hot, entries - 1)
        if key(0) > target:
            return -1
        return self._binary_search(target, key, 0, first_hot)

    def _key(self) -> Callable[[int], int]:
        """Slot -> its entry's first field; straight from the mapping when there is one (the lookups of every read)."""
        buf = self._map
        if buf is None:
            return lambda slot: self.read_entry(slot)[0]
        unpack, size = self.entry.unpack_from, self.entry.size
        return lambda slot: unpack(buf, slot * size)[0]

    @staticmethod
    def _binary_search(target: int, key: Callable[[int], int], lo: int, hi: int) -> int:
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            found = key(mid)
            if found > target:
                hi = mid - 1
            elif found < target:
                lo = mid
            else:
                return mid
        return lo

    # --- durability and lifetime --------------------------------------------------------------------------------

    def flush(self) -> None:
        with self._guard:
            if self._map is not None:
                self._map.flush()

    def close(self) -> None:
        """Trim to the valid entries (so Kafka and a later open trust the length), make them durable (a clean
        shutdown means no rebuild on the next start), and release the file. Read-only: only release it."""
        if self.writable:
            self.trim_to_valid_size()
        with self._guard:
            if self._map is not None:
                self._map.flush()
                self._map.close()
                self._map = None
            if self._fd >= 0:
                if self.writable:
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def rename(self, new_path: Path) -> None:
        os.rename(self.path, new_path)
        self.path = new_path

    def delete(self) -> None:
        with self._guard:
            if self._map is not None:
                self._map.close()
                self._map = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self.path.unlink(missing_ok=True)
