"""Index entries waiting in memory, written within a bound: one `IndexTails` per Kafka engine with background threads.

An offset or time index given one keeps its new entries in memory (its tail, abstract_index.py) and adds itself here
when its tail gets a first entry; the engine's scheduler calls `write()` every WRITE_INTERVAL_MS, which writes the
tail of every index added since the last call (without a sync). So a running broker's index files lag its log by at
most about that long, for the readers of its files in other processes (the dump-log tool, the Spark path reader,
whose splits start at index entries), while an append of a busy partition pays one `pwrite` per round or per 4 KiB
of entries instead of one per entry. An index given none (an engine without background threads, the tools) writes
each entry when it is made.

Contract: `add()` from any thread, cheap (a set insert under a lock); `write()` writes and forgets every index added
before it began; an index added again while being written is written again at the next round.
"""

from __future__ import annotations

import threading
from typing import Protocol

WRITE_INTERVAL_MS = 100


class HasTail(Protocol):
    def write_tail(self) -> None: ...


class IndexTails:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[HasTail] = set()

    def add(self, index: HasTail) -> None:
        with self._lock:
            self._pending.add(index)

    def write(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, set()
        for index in pending:
            index.write_tail()
