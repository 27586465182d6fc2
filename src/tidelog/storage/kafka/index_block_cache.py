"""The blocks of index entries an engine's lookups read, kept in memory with their keys decoded (IndexBlockCache).

An index lookup (abstract_index.py) bisects an in-memory directory of block keys, reads the one block of
BLOCK_ENTRIES entries that holds its answer with a pread and searches it in Python. Kafka maps its indexes, so a
lookup in a part of an index read before costs it neither a system call nor a copy. This cache gives tidelog the
same for the blocks lookups read: each kept as its bytes and the key of every entry (an `array` that `bisect`
searches in C), shared by every index of one engine, at most `max_blocks` of them, the least recently used let go
first. DEFAULT_MAX_BLOCKS (4,096) keeps about 9 MiB: the offset-index blocks covering 16 GiB of log at the default
`index.interval.bytes`.

Only whole blocks of an index the engine itself writes are kept. The entries of a whole block change only when the
index is truncated below them, and a truncation gives the index a new generation (`new_generation`): blocks are
keyed by (generation, block number), so a block of an older generation is never found again and ages out. An
index read-only (another process's files, which may change behind it) keeps nothing here.
"""

from __future__ import annotations

import itertools
import threading
from array import array
from collections import OrderedDict
from typing import NamedTuple

DEFAULT_MAX_BLOCKS = 4096


class CachedBlock(NamedTuple):
    keys: array[int]  # the key of each entry (relative offset, timestamp), in order
    data: bytes  # the entries as the file holds them


class IndexBlockCache:
    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[tuple[int, int], CachedBlock] = OrderedDict()
        self._lock = threading.Lock()
        self._generations = itertools.count()

    def new_generation(self) -> int:
        """A number no index had: an index takes one when it opens and whenever it is truncated."""
        return next(self._generations)

    def get(self, generation: int, block: int) -> CachedBlock | None:
        """The block, marked used; without the lock (each OrderedDict call is atomic): a block let go by another
        thread between the two calls is simply not marked."""
        key = (generation, block)
        found = self._blocks.get(key)
        if found is not None:
            try:  # noqa: SIM105 - a hot path: contextlib.suppress would cost a context manager per lookup
                self._blocks.move_to_end(key)
            except KeyError:
                pass
        return found

    def put(self, generation: int, block: int, found: CachedBlock) -> None:
        with self._lock:  # writers one at a time: the length check and the eviction go together
            self._blocks[(generation, block)] = found
            if len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)
