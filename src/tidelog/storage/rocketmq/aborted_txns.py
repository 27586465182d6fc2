"""`aborted.txnindex`: the aborted transactions of one queue of the RocketMQ engine, beside its producer snapshots
(`tidelog-producer-snapshots/<topic>-<queue>/`). RocketMQ has no segments of a queue, so one file holds the whole
queue's entries, in Kafka's `.txnindex` entry layout (storage/common/aborted_txn.py): `firstOffset` is the
transaction's first queue offset, `lastOffset` the queue offset of its ABORT marker,
`lastStableOffset` the queue's last stable offset once the marker was written. Entries are in marker order, so
lastOffset increases strictly.

The file's presence says the queue holds transactions: it is created empty, and made durable (file and directory
fsynced), before the queue's first transactional batch or marker is put in the CommitLog. A queue without it never
held one, so its last stable offset is its high watermark without reading anything.

Durability: an entry is appended (not synced) when its marker is put; the queue calls `sync` before it writes a
producer snapshot, so every entry whose marker is below a snapshot's offset is on disk. Loading after a restart keeps
the entries below the offset the CommitLog replay starts from (the snapshot's); the replay derives the later ones
again (a torn last entry, or an entry of a marker a crash lost, goes with them), and `replace` writes the result
back whole (tmp + fsync + rename). `drop_before` forgets the entries whose marker retention or DeleteRecords took
below the log start.
"""

from __future__ import annotations

import bisect
import logging
import os
from pathlib import Path

from tidelog.atomic_files import TEMP_SUFFIX, fsync_directory
from tidelog.errors import KafkaStorageError
from tidelog.storage.common.aborted_txn import AbortedTxn, parse_entries

log = logging.getLogger("tidelog.storage.rocketmq")

ABORTED_TXNS_FILE = "aborted.txnindex"


class AbortedTxnFile:
    def __init__(self, directory: Path) -> None:
        self.path = directory / ABORTED_TXNS_FILE
        self.entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []  # entries' lastOffset, for bisect
        self.stale = False  # an append could not be written: the file must be replaced before the next snapshot

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def create(self) -> None:
        """Make the (empty) file durable: from now on the queue is known to hold transactions."""
        if self.exists:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(self.path.parent)
            fsync_directory(self.path.parent.parent)
        except OSError as exc:
            raise KafkaStorageError(f"cannot create {self.path}: {exc.strerror or exc}") from exc

    def load(self) -> list[AbortedTxn]:
        """The file's whole entries (a torn last one is left out); an unknown version is a CorruptIndexError."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return parse_entries(data, self.path)

    def hold(self, entries: list[AbortedTxn]) -> None:
        """Take `entries` (in marker order) as the queue's, the file left as it is."""
        self.entries = list(entries)
        self._last_offsets = [entry.last_offset for entry in entries]

    def replace(self, entries: list[AbortedTxn]) -> None:
        """Hold `entries` and write them as the whole file, crash-safely."""
        tmp = self.path.with_name(self.path.name + TEMP_SUFFIX)
        with open(tmp, "wb") as handle:
            handle.write(b"".join(entry.encode() for entry in entries))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
        self.hold(entries)
        self.stale = False

    def append(self, entry: AbortedTxn) -> None:
        """An ABORT marker was put: hold the entry and append it to the file (synced by the next `sync`). The
        marker is stored whatever happens here: a write that fails leaves the file `stale`, to be replaced."""
        if self._last_offsets and entry.last_offset <= self._last_offsets[-1]:
            raise ValueError(f"aborted transaction ending at {entry.last_offset} is not after {self._last_offsets[-1]}")
        self.entries.append(entry)
        self._last_offsets.append(entry.last_offset)
        try:
            with open(self.path, "ab") as handle:
                handle.write(entry.encode())
        except OSError as exc:
            log.warning("%s: cannot append an aborted transaction (%s); the file is written again later", self.path,
                        exc.strerror or exc)  # fmt: skip
            self.stale = True

    def repair(self) -> None:
        """Write a `stale` file again from the entries held (the caller keeps appends out meanwhile)."""
        if self.stale:
            self.replace(self.entries)

    def sync(self) -> None:
        """Make the appended entries durable."""
        if self.entries:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def collect(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The transactions a read_committed fetch of [start_offset, end_offset) must be told about: marker at or
        after `start_offset`, first offset below `end_offset`."""
        at = bisect.bisect_left(self._last_offsets, start_offset)
        return [entry for entry in self.entries[at:] if entry.first_offset < end_offset]

    def drop_before(self, offset: int) -> None:
        """Forget (and rewrite the file without) the entries whose marker is below `offset`."""
        at = bisect.bisect_left(self._last_offsets, offset)
        if at:
            self.replace(self.entries[at:])
