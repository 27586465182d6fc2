"""`<base>.txnindex`: the aborted transactions whose ABORT marker lies in a segment (Kafka's TransactionIndex).

Entries are Kafka's AbortedTxn, 34 bytes big-endian (storage/common/aborted_txn.py); `firstOffset` may lie in an
earlier segment. Entries are appended in marker order, so lastOffset increases strictly. The file exists only once a
segment gets its first entry (as Kafka creates it lazily); the entries are also kept in memory, the file is only
appended to, cut (`truncate_to`, with the segment) and emptied (`reset`, before recovery rebuilds it).

A read_committed Fetch of [fetch offset, upper bound) needs every aborted transaction whose marker is at or after
the fetch offset and whose first offset is below the bound: `collect` walks a segment's entries and says the search
is complete at the first entry whose lastStableOffset reaches the bound (every transaction aborted after it began
at or above that offset), else the next segment's index is searched too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from tidelog.errors import CorruptIndexError, KafkaStorageError
from tidelog.storage.common.aborted_txn import ENTRY, AbortedTxn, parse_entries
from tidelog.storage.common.file_handles import FileHandles, LazyFile

SUFFIX = ".txnindex"


class TxnIndexSearch(NamedTuple):
    aborted: list[AbortedTxn]
    complete: bool  # no later segment can hold more of them


class TransactionIndex:
    def __init__(self, path: Path, handles: FileHandles | None = None) -> None:
        """`handles`: the engine's open segment files, which this one joins while it is open (file_handles.py)."""
        self._file = LazyFile(path, handles)
        self._dirty = False  # written since the last sync
        self.entries: list[AbortedTxn] = []
        self._torn = 0  # bytes after the last whole entry (a torn append), found at open
        if path.exists():
            data = path.read_bytes()
            self._torn = len(data) % ENTRY.size
            self.entries = parse_entries(data, path)

    @property
    def path(self) -> Path:
        return self._file.path

    def _exists(self) -> bool:
        return self._file.is_open or self.path.exists()

    @property
    def last_offset(self) -> int | None:
        return self.entries[-1].last_offset if self.entries else None

    def append(self, entry: AbortedTxn) -> None:
        """Add an aborted transaction; its marker must come after the last one's."""
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            raise CorruptIndexError(
                f"{self.path}: aborted transaction ending at {entry.last_offset} does not follow the last one, "
                f"ending at {self.entries[-1].last_offset}"
            )
        position = len(self.entries) * ENTRY.size
        try:
            file = self._file.get()
            os.pwrite(file.fileno(), entry.encode(), position)
        except OSError as exc:
            raise KafkaStorageError(f"cannot append to {self.path}: {exc.strerror}") from exc
        self._dirty = True
        self.entries.append(entry)

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearch:
        found = []
        for entry in self.entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper_bound_offset:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearch(found, True)
        return TxnIndexSearch(found, False)

    def truncate_to(self, offset: int) -> None:
        """Drop the transactions whose marker is at or after `offset` (the segment is cut there)."""
        kept = next((slot for slot, entry in enumerate(self.entries) if entry.last_offset >= offset), len(self.entries))
        if kept < len(self.entries) or self._torn:
            del self.entries[kept:]
            self._cut(kept * ENTRY.size)

    def reset(self) -> None:
        """Forget every entry (recovery rebuilds them from the log); an existing file is emptied."""
        self.entries = []
        if self._exists():
            self._cut(0)

    def _cut(self, size: int) -> None:
        os.ftruncate(self._file.get().fileno(), size)
        self._dirty = True
        self._torn = 0

    def sanity_check(self) -> None:
        """Kafka's check at open: whole entries only, markers in increasing order; else CorruptIndexError."""
        if self._torn:
            raise CorruptIndexError(f"{self.path}: ends with {self._torn} bytes of a partial entry")
        for before, after in zip(self.entries, self.entries[1:], strict=False):
            if after.last_offset <= before.last_offset:
                raise CorruptIndexError(f"{self.path}: entry ending at {after.last_offset} is out of order")

    def flush(self) -> None:
        if self._dirty:
            self._dirty = False  # before the sync: a write racing it sets it again
            try:
                os.fsync(self._file.get().fileno())
            except OSError as exc:
                self._dirty = True
                raise KafkaStorageError(f"cannot flush {self.path}: {exc.strerror}") from exc

    def rename(self, path: Path) -> None:
        if self._exists():
            self._file.rename(path)
        else:
            self._file.path = path

    def close(self) -> None:
        self._file.close()

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
