"""What Kafka's offset and time indexes share (AbstractIndex): a file of fixed-size entries, no header, no checksum.

Opened writable (the storage engine's own segments), a new file is preallocated to `segment.index.bytes` rounded
down to whole entries; an existing file is trusted as it is (entries = length / entry size), which is why an index
must be trimmed to its real size on roll and on close, and re-expanded when its segment becomes active again.

The file is not memory-mapped: entries are written with pwrite and read with pread through a LazyFile
(file_handles.py), which opens the file at its first use and lets the engine close it while the index is idle. A
Python mmap keeps a duplicate descriptor of its own, so a mapped index would hold two descriptors and a mapping for
as long as it is open; a store into a hole of the sparse preallocated file on a full disk would be a SIGBUS, and a
reader's mapping of a file its writer trims too.

An index given the engine's IndexTails (index_tails.py) keeps its new entries in memory, in its tail, until the
engine's scheduler writes them (every WRITE_INTERVAL_MS), TAIL_BYTES of them are there (one pwrite then, not one per
entry: a system call per entry was 4 % of a 1 MiB append), or the index is flushed (its segment's flush writes the
tail even when it does not sync the index), resized, trimmed or closed; one given none writes each entry at once.
Lookups read the tail from memory and the entries before it from the file. A tail that cannot be written (a full
disk) is dropped with a warning: the index is sparser, never wrong (a lookup lands on an earlier entry and scans
further). A process killed before it wrote its tail leaves zeros (or older entries) there: only entries after the
recovery point can be in a tail (a flush writes it first), and recovery rebuilds the indexes of the segments after
that point.

Lookups go through a block directory kept in memory: the key (relative offset, timestamp) of the first entry of
each block of BLOCK_ENTRIES entries (1 KiB of an offset index), built by one read of the entries at the first
lookup and kept up to date by every append, truncation and resize made through this object. A lookup bisects the
directory, reads the one block that holds its answer with one pread and searches it in memory: a few microseconds
wherever the entry is, and, like Kafka's warm section, a tail lookup touches only the index's last page. Should the
block not agree with the directory (the file was changed behind a read-only reader), the lookup answers "no entry"
(callers then scan from the segment start, which is always safe) and the directory is read again at the next one.
An index the engine writes keeps the whole blocks its lookups read in the engine's IndexBlockCache
(index_block_cache.py), with their keys decoded: a lookup in such a block reads nothing and bisects in C.

Opened read-only (`writable=False`, as Kafka's DumpLogSegments opens its indexes; the Spark path reader, the
dump-log tool), nothing is created or written. The length found at open counts the entries, as Kafka does; bytes
past a shorter file's end read as zeros, which is what the preallocated tail held. A lookup in a live broker's
preallocated file may land on that tail, whose entries name position 0: a safe, slower place to scan from.
`valid_entries()` gives what a reader can rely on in such a file: the entries before the zero-filled tail, up to
the first that breaks the order appends keep.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from array import array
from bisect import bisect_right
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np

from tidelog.errors import CorruptIndexError, KafkaStorageError
from tidelog.storage.common.file_handles import FileHandles, LazyFile
from tidelog.storage.kafka.index_block_cache import CachedBlock, IndexBlockCache
from tidelog.storage.kafka.index_tails import IndexTails

log = logging.getLogger("tidelog.storage")

BLOCK_ENTRIES = 128  # entries per block of the lookup directory (1 KiB of an offset index)
TAIL_BYTES = 4096  # entries kept in memory before they are written (see above)


class AbstractIndex:
    entry: struct.Struct  # set by subclasses
    entry_dtype: np.dtype  # the same entry as a numpy record, for reading many at once
    key_field: str  # the entry's first field, which lookups search by

    def __init__(
        self,
        path: Path,
        base_offset: int,
        max_index_size: int = 0,
        *,
        writable: bool = True,
        handles: FileHandles | None = None,
        blocks: IndexBlockCache | None = None,
        tails: IndexTails | None = None,
    ) -> None:
        """`max_index_size` is the size a new writable file is preallocated to; read-only it is the length found.
        `handles`: the engine's open segment files, which this one joins while it is open. `blocks`: the engine's
        cache of index blocks, which a writable index keeps the blocks its lookups read in. `tails`: the engine's
        writer of index tails, without which each entry is written when made (see above)."""
        self.base_offset = base_offset
        self.writable = writable
        self._blocks = blocks if writable else None
        self._tails = tails
        self._generation = self._blocks.new_generation() if self._blocks is not None else 0  # index_block_cache.py
        self._guard = threading.Lock()  # entries and length vs. a concurrent resize or flush
        self._dirty = False  # written or resized since the last sync
        self._block_keys: array[int] | None = None  # first key of each block of written entries; see lookups
        size = self.entry.size
        self._file = LazyFile(path, handles, writable=writable)
        try:
            length = os.stat(path).st_size
            existed = True
        except FileNotFoundError:  # read-only: no index, no entries
            length, existed = 0, False
        if not writable:
            self._length = length
            self.entries = length // size
            self.max_index_size = length - length % size
        else:
            self.max_index_size = max(size, max_index_size - max_index_size % size)
            if existed:
                self.entries = length // size
                self._length = length
            else:
                os.ftruncate(self._file.get().fileno(), self.max_index_size)
                self.entries = 0
                self._length = self.max_index_size
                self._dirty = True
        # (first slot, its entries and the following ones): the entries not written yet. Replaced, never changed,
        # so that a reader takes both halves at once without the guard; always ends at `entries`.
        self._tail: tuple[int, bytes] = (self.entries, b"")
        self._opened()

    def _opened(self) -> None:
        """Called once the file is open and its entries counted: a subclass reads what it keeps of its last entry."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    @property
    def path(self) -> Path:
        return self._file.path

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
        """Set the file length, keeping the entries that fit; the file is never left partial."""
        size = self.entry.size
        new_length = max(0, new_size - new_size % size)
        with self._guard:
            self._write_tail()  # written (and counted) whatever the length, as closing trims to it
            if new_length == self._length:
                return
            file = self._file.get()
            os.ftruncate(file.fileno(), new_length)
            self._dirty = True
            self._length = new_length
            self._set_entries(min(self.entries, new_length // size))

    def trim_to_valid_size(self) -> None:
        self.resize(self.entries * self.entry.size)

    def expand(self) -> None:
        """Re-grow to the preallocated size so the (active) segment can append again."""
        self.resize(self.max_index_size)

    def truncate_entries(self, entries: int) -> None:
        """Forget entries from slot `entries` on (the bytes stay until overwritten or trimmed, as in Kafka)."""
        with self._guard:
            self._set_entries(max(0, min(self.entries, entries)))

    def _set_entries(self, entries: int) -> None:
        """Under the guard: `entries` written entries, never more than before; the tail and the directory forget
        later ones, and fewer entries than before make the blocks cached so far unreachable (a new generation)."""
        size = self.entry.size
        if entries < self.entries and self._blocks is not None:
            self._generation = self._blocks.new_generation()
        tail_first, tail = self._tail
        self._tail = (entries, b"") if entries <= tail_first else (tail_first, tail[: (entries - tail_first) * size])
        self.entries = entries
        if self._block_keys is not None:
            del self._block_keys[-(-entries // BLOCK_ENTRIES) :]

    def reset(self) -> None:
        """Forget every entry and grow back to the preallocated size (a rebuild may need all of it)."""
        self.truncate_entries(0)
        self.expand()

    # --- entries ------------------------------------------------------------------------------------------------

    def read_entry(self, n: int) -> tuple[int, ...]:
        return self.entry.unpack(self._read_entries(n, 1))

    def _read_entries(self, first: int, count: int) -> bytes:
        """Entries [first, first + count) as bytes: those in the tail from memory, the others read from the file
        (zeros past its end)."""
        size = self.entry.size
        if count <= 0:
            return b""
        tail_first, tail = self._tail  # what is not in the tail was written before the tail started
        end = first + count
        if tail and first >= tail_first:
            return tail[(first - tail_first) * size : (end - tail_first) * size].ljust(count * size, b"\0")
        if not self._length:  # no file (read-only), or an empty one
            return bytes(count * size)
        file = self._file.get()
        from_file = min(end, tail_first) - first if tail else count
        data = os.pread(file.fileno(), from_file * size, first * size).ljust(from_file * size, b"\0")
        if from_file < count:
            data += tail[: (end - tail_first) * size]
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
        """Every entry keeps the order appends keep (the zero-filled tail an untrimmed file has does not: two zero
        entries in a row never do, so a tail of them, found by a binary search, fails without reading it all)."""
        written = self._written_entries()
        if written + 1 < self.entries:
            raise CorruptIndexError(
                f"{self.path}: entries {written} to {self.entries - 1} are zeros (the preallocated tail of an index "
                f"that was not trimmed)"
            )
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
        fields = len(flat_fields) // count
        with self._guard:
            first = self.entries
            if self._block_keys is not None:
                block_starts = range(-(-first // BLOCK_ENTRIES) * BLOCK_ENTRIES, first + count, BLOCK_ENTRIES)
                self._block_keys.extend(flat_fields[(slot - first) * fields] for slot in block_starts)
            self._add_to_tail(packed, count)

    def _write_entry(self, *fields: int) -> None:
        with self._guard:
            slot = self.entries
            if self._block_keys is not None and slot % BLOCK_ENTRIES == 0:
                self._block_keys.append(fields[0])
            self._add_to_tail(self.entry.pack(*fields), 1)

    def _add_to_tail(self, packed: bytes, count: int) -> None:
        """Under the guard (the block directory already told): `count` entries after the last, written at once
        without IndexTails, else once the tail holds TAIL_BYTES (a tail's first entry registers it for the next
        round of the engine's scheduler)."""
        tail_first, tail = self._tail
        self._tail = (tail_first, tail + packed)
        self.entries += count
        self._dirty = True
        if self._tails is None or len(tail) + len(packed) >= TAIL_BYTES:
            self._write_tail()
        elif not tail:
            self._tails.add(self)

    def _write_tail(self) -> None:
        """Under the guard: write the tail's entries, or drop them when they cannot be written (see above). Entries
        are written with pwrite: the preallocated file is sparse, and a store into a hole of a mapping on a full
        disk would be a SIGBUS that kills the process, where pwrite reports ENOSPC."""
        tail_first, tail = self._tail
        if not tail:
            return
        try:
            file = self._file.get()
            written = os.pwrite(file.fileno(), tail, tail_first * self.entry.size)
            while written < len(tail):  # a short write is legal: finish it
                written += os.pwrite(file.fileno(), tail[written:], tail_first * self.entry.size + written)
        except (OSError, KafkaStorageError) as exc:  # KafkaStorageError: no descriptor to open the file with
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            log.warning(
                "cannot write %d index entries to %s (%s); the index goes on without them (lookups scan further)",
                self.entries - tail_first,
                self.path,
                reason,
            )
            self._set_entries(tail_first)
            return
        self._tail = (self.entries, b"")

    def _largest_lower_bound(self, target: int) -> int:
        """Slot of the greatest entry whose key (its first field: relative offset, timestamp) <= target, or -1."""
        return self._floor(target)[0]

    def _floor(self, target: int) -> tuple[int, bytes, int]:
        """(`_largest_lower_bound(target)`, the block it was found in, the block's first slot): the block directory
        bisected, then one block read and searched in memory. The block is b"" when the slot is -1."""
        entries = self.entries
        if entries == 0:
            return -1, b"", 0
        directory = self._block_keys
        if directory is None:
            directory = self._block_directory()
        block = bisect_right(directory, target) - 1
        if block < 0:
            return -1, b"", 0
        first = block * BLOCK_ENTRIES
        cache = self._blocks
        if cache is not None:
            generation = self._generation  # before the read: a truncation during it makes what it read unreachable
            cached = cache.get(generation, block)
            if cached is None and entries - first >= BLOCK_ENTRIES:  # a whole block: kept
                data = self._read_entries(first, BLOCK_ENTRIES)
                cached = CachedBlock(self._keys_of(data), data)
                cache.put(generation, block, cached)
            if cached is not None:
                slot = bisect_right(cached.keys, target) - 1  # >= 0: the directory holds the block's first key
                return (first + slot, cached.data, first) if slot >= 0 else (-1, b"", 0)
        data = self._read_entries(first, min(BLOCK_ENTRIES, entries - first))
        unpack, size = self.entry.unpack_from, self.entry.size
        lo, hi = 0, len(data) // size - 1  # inlined binary search: this runs for every fetch of an older offset
        while lo < hi:
            middle = (lo + hi + 1) >> 1
            key = unpack(data, middle * size)[0]
            if key > target:
                hi = middle - 1
            elif key < target:
                lo = middle
            else:
                lo = hi = middle
        if unpack(data, lo * size)[0] > target:  # the file changed behind the directory
            self._block_keys = None
            return -1, b"", 0
        return first + lo, data, first

    def _keys_of(self, data: bytes) -> array[int]:
        """The key of each entry in `data` (subclasses may do it faster for their layout)."""
        return array("q", np.frombuffer(data, self.entry_dtype)[self.key_field].tolist())

    def _block_directory(self) -> array[int]:
        """The first key of each block of BLOCK_ENTRIES written entries, read from the file the first time."""
        keys = self._block_keys
        if keys is None:
            with self._guard:
                firsts = self.entry_array()[::BLOCK_ENTRIES]
                keys = self._block_keys = array("q", firsts[self.key_field].tolist())
        return keys

    # --- durability and lifetime --------------------------------------------------------------------------------

    def write_tail(self) -> None:
        """Write the entries still in memory, without a sync."""
        with self._guard:
            self._write_tail()

    def flush(self) -> None:
        """Write the tail, make what was written (and the length) durable; nothing to do when nothing changed since
        the last."""
        if self._dirty:
            self._dirty = False  # before the sync: a write racing it sets it again
            try:
                with self._guard:
                    self._write_tail()
                file = self._file.get()
                os.fdatasync(file.fileno())
            except KafkaStorageError:  # no descriptor to open the file with
                self._dirty = True
                raise
            except OSError as exc:
                self._dirty = True
                raise KafkaStorageError(f"cannot flush {self.path}: {exc.strerror}") from exc

    def close(self) -> None:
        """Trim to the valid entries (so Kafka and a later open trust the length), make them durable (a clean
        shutdown means no rebuild on the next start), and close the file. Read-only: only close it."""
        if self.writable:
            self.trim_to_valid_size()
            if self._dirty:
                self._dirty = False
                os.fsync(self._file.get().fileno())
        self._file.close()

    def rename(self, new_path: Path) -> None:
        self._file.rename(new_path)

    def delete(self) -> None:
        self._tail = (self.entries, b"")
        self._file.close()
        self.path.unlink(missing_ok=True)
