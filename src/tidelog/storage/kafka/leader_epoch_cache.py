"""`leader-epoch-checkpoint`: the offset at which each leader epoch of a partition began (Kafka's LeaderEpochFileCache).

File, text, in the framing of storage/common/offset_checkpoint.py (read and written by checkpoints.py, replaced
atomically, as Kafka's LeaderEpochCheckpointFile):

    0                      version (only 0 exists)
    2                      entry count
    0 0                    an entry: epoch startOffset
    3 1500

An entry (E, S) means "the records from offset S up to the next entry's start (or the log end) were written by the
leader of epoch E". Epochs strictly increase from entry to entry, start offsets never decrease.

Contract:
- The cache in memory is the truth; the file follows it. A change (an append in a new epoch, a new log start)
  marks the file unwritten and has it rewritten off the caller's thread, by the scheduler's (without a scheduler,
  at once by the changing thread); `write_checkpoint()`, which the partition's flush calls before it moves the
  recovery point, writes it at once (a crash rescans only from the recovery point, so the epochs of the offsets
  below it must be on disk). Writers take turns: the file never goes back to an older list. After `close()`
  nothing is written.
- Loading (`load`): the file, or when it is missing or unreadable, the epochs read from every batch header of the
  log; epochs found in the segments that recovery rescanned are added; the entries are cut to [log start, log end)
  and the file is rewritten at once when that differs from what it held.
- `epoch_for_offset(o)` is the epoch of the last entry starting at or below o (None below the first entry);
  `end_offset_for(e)` answers OffsetForLeaderEpoch as Kafka's endOffsetFor (see there).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from tidelog.errors import CorruptCheckpointError
from tidelog.storage.common.scheduler import Scheduler
from tidelog.storage.kafka import checkpoints

log = logging.getLogger("tidelog.storage")

# Kafka's OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET: no epoch, no end offset known
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class EpochEndOffset(NamedTuple):
    """An answer to OffsetForLeaderEpoch: the epoch found and the offset where it ended."""

    leader_epoch: int
    end_offset: int


class LeaderEpochCache:
    def __init__(
        self, directory: Path, entries: Iterable[tuple[int, int]], *, name: str, scheduler: Scheduler | None = None
    ) -> None:
        """The cache of the partition `name` in `directory` holding `entries`, which its file already holds."""
        self.path = directory / checkpoints.LEADER_EPOCH_CHECKPOINT
        self._name = name
        self._scheduler = scheduler
        self._entries = [EpochEntry(*entry) for entry in entries]
        self._latest_epoch = self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH  # read without the lock
        self._lock = threading.Lock()  # _entries, _unwritten, _closed
        self._write_lock = threading.Lock()  # file writers take turns
        self._unwritten = False  # _entries changed since the file was last written
        self._closed = False

    @classmethod
    def load(
        cls,
        directory: Path,
        *,
        name: str,
        scheduler: Scheduler | None,
        recovered: list[tuple[int, int]],
        scan: Callable[[], list[tuple[int, int]]],
        log_start_offset: int,
        log_end_offset: int,
    ) -> LeaderEpochCache:
        """The cache of a loaded log: the file's entries, with the epochs `recovered` (in log order) found by the
        rescan of segments added; `scan()` (every batch header's epoch) instead when the file is missing or
        unreadable. Cut to [log start, log end); the file is rewritten now when it held something else."""
        path = directory / checkpoints.LEADER_EPOCH_CHECKPOINT
        stored = _read(path, name)
        entries = [EpochEntry(*entry) for entry in (scan() if stored is None else stored)]
        if stored is not None:
            for epoch, start in recovered:
                if not entries or epoch > entries[-1].epoch:
                    entries.append(EpochEntry(epoch, start))
        entries = _truncated_from_start(_truncated_from_end(entries, log_end_offset), log_start_offset)
        if entries != stored:
            checkpoints.write_leader_epoch_checkpoint(path, entries)
        return cls(directory, entries, name=name, scheduler=scheduler)

    # --- reads ------------------------------------------------------------------------------------------------

    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The epoch of the latest entry, UNDEFINED_EPOCH when there is none."""
        return self._latest_epoch

    @property
    def unwritten(self) -> bool:
        """Has the cache changed since the file was last written?"""
        return self._unwritten

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch of the last entry that starts at or below `offset`; None when there is none."""
        epoch = None
        with self._lock:
            for entry in self._entries:
                if entry.start_offset > offset:
                    break
                epoch = entry.epoch
        return epoch

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Where `epoch` ended, as Kafka's LeaderEpochFileCache.endOffsetFor answers OffsetForLeaderEpoch:

        - UNDEFINED_EPOCH requested, an empty cache, or an epoch above every entry's:
          (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        - the latest entry's epoch: (epoch, log end), the epoch still being written;
        - otherwise the start offset of the first entry above `epoch`, with the epoch of the last entry at or
          below it, or `epoch` itself when it is below the first entry (that entry's start is then where the
          log's data begins: Kafka answers so since 2.0, so that a follower truncates to the leader's start; its
          javadoc's UNDEFINED for this case is left from 1.x)."""
        with self._lock:
            if epoch == UNDEFINED_EPOCH or not self._entries:
                return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
            if self._entries[-1].epoch == epoch:
                return EpochEndOffset(epoch, log_end_offset)
            slot = bisect.bisect_right(self._entries, epoch, key=lambda entry: entry.epoch)
            if slot == len(self._entries):
                return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
            found = self._entries[slot - 1].epoch if slot else epoch
            return EpochEndOffset(found, self._entries[slot].start_offset)

    # --- changes ----------------------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> None:
        """Records of `epoch` were appended from `start_offset` on: a new entry when `epoch` is above the latest
        entry's (a later append in a known epoch changes nothing)."""
        if self._latest_epoch >= epoch:  # every append but the first of an epoch: no lock taken
            return
        with self._lock:
            if self._entries and self._entries[-1].epoch >= epoch:
                return
            self._entries.append(EpochEntry(epoch, start_offset))
            self._latest_epoch = epoch
            due = self._mark_unwritten()
        if due:
            self._write_later()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved up to `start_offset` (Kafka's truncateFromStart): entries below it go, and the
        last of them, the epoch in force there, now starts at it."""
        self._replace(lambda entries: _truncated_from_start(entries, start_offset))

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut back to end at `end_offset` (Kafka's truncateFromEnd): entries starting at or above it
        go."""
        self._replace(lambda entries: _truncated_from_end(entries, end_offset))

    def clear(self) -> None:
        """The log starts over empty (Kafka's clearAndFlush): no entries."""
        self._replace(lambda _entries: [])

    def _replace(self, change: Callable[[list[EpochEntry]], list[EpochEntry]]) -> None:
        with self._lock:
            entries = change(self._entries)
            if entries == self._entries:
                return
            self._entries = entries
            self._latest_epoch = entries[-1].epoch if entries else UNDEFINED_EPOCH
            due = self._mark_unwritten()
        if due:
            self._write_later()

    def _mark_unwritten(self) -> bool:
        """Under the lock: True when no write is due yet (the caller then arranges one)."""
        if self._unwritten:
            return False
        self._unwritten = True
        return True

    def _write_later(self) -> None:
        if self._scheduler is not None:
            self._scheduler.schedule(f"leader-epoch checkpoint of {self._name}", self.write_checkpoint)
        else:
            self.write_checkpoint()

    # --- the file ---------------------------------------------------------------------------------------------

    def write_checkpoint(self) -> None:
        """Write the file now if it is behind the cache. A failed write leaves it due: the next call tries again."""
        with self._write_lock:
            with self._lock:
                if self._closed or not self._unwritten:
                    return
                self._unwritten = False
                entries = list(self._entries)
            try:
                checkpoints.write_leader_epoch_checkpoint(self.path, entries)
            except BaseException:
                with self._lock:
                    self._unwritten = True
                raise

    def close(self) -> None:
        """Write nothing more (the partition is closed; its directory may be on its way out). Waits for a write in
        progress."""
        with self._write_lock, self._lock:
            self._closed = True


def _read(path: Path, name: str) -> list[tuple[int, int]] | None:
    """The checkpointed entries, or None when the file is missing or unreadable."""
    try:
        return checkpoints.read_leader_epoch_checkpoint(path)
    except CorruptCheckpointError as exc:
        log.warning("%s: %s; rebuilding leader epochs from the log", name, exc)
        return None


def _truncated_from_start(entries: list[EpochEntry], start_offset: int) -> list[EpochEntry]:
    below = [entry for entry in entries if entry.start_offset <= start_offset]
    later = [entry for entry in entries if entry.start_offset > start_offset]
    return ([EpochEntry(below[-1].epoch, start_offset)] if below else []) + later


def _truncated_from_end(entries: list[EpochEntry], end_offset: int) -> list[EpochEntry]:
    return [entry for entry in entries if entry.start_offset < end_offset]
