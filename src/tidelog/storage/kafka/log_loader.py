"""Opening a partition directory (Kafka's LogLoader): what a clean or an interrupted run left becomes a log.

`LogLoader.load()` takes these steps, in order, and returns a LoadedLog for PartitionLog to take over:
1. partition.metadata is rewritten when missing, unreadable or naming another topic id.
2. Interrupted file operations are finished or undone: `.deleted` files and our own interrupted writes
   (OWN_TEMP_FILE) go; every `.cleaned` file goes, and so does every `.swap` at or above the lowest `.cleaned`
   offset (an unfinished replacement); an index `.swap` goes (it is rebuilt); a `.log.swap` replaces the normal
   segments within its offset range and takes its final name. Indexes without a `.log` go; files that are not part
   of a Kafka log are reported and left alone.
3. Every `.log` is opened as a segment; one whose indexes are missing or fail their sanity check is recovered.
4. After an unclean shutdown every segment from the one holding the recovery point is recovered too. Recovery
   rescans the whole segment and rebuilds its indexes; at the first invalid byte the segment is truncated and the
   segments after it are deleted. The transaction indexes of the recovered segments are rebuilt by replaying the
   producers' batches and markers from the newest snapshot at or below the first of them (Kafka's recoverSegment).
5. Offsets: the log end follows the last batch. A log end below the checkpointed log start means the data is gone:
   the log starts empty there. A log without segments gets an empty one. The log start is the checkpointed one or
   the first segment's base if higher; the recovery point is the log end after a clean shutdown, else the
   checkpointed one if lower.
6. Producer state: the newest snapshot at or below the log end, then the batches after it (after a clean shutdown
   there is nothing to replay): the producers, their open transactions, the markers that closed some.
7. Leader epochs: LeaderEpochCache.load, with the epochs step 4 found and, if the checkpoint is unusable, the
   epochs of every batch header.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tidelog.atomic_files import fsync_directory
from tidelog.codec.batch_chain import ChainReader, batch_table
from tidelog.codec.control_record import read_end_txn_marker
from tidelog.codec.record_batch import BatchHeader
from tidelog.config import LogConfig
from tidelog.errors import CorruptCheckpointError, CorruptRecordError, TidelogError
from tidelog.storage.common.aborted_txn import AbortedTxn
from tidelog.storage.common.file_handles import FileHandles
from tidelog.storage.common.producer_state import ProducerStateManager
from tidelog.storage.common.scheduler import Scheduler
from tidelog.storage.kafka import checkpoints
from tidelog.storage.kafka.index_block_cache import IndexBlockCache
from tidelog.storage.kafka.index_tails import IndexTails
from tidelog.storage.kafka.key_index import KEY_INDEX_DIR
from tidelog.storage.kafka.leader_epoch_cache import LeaderEpochCache
from tidelog.storage.kafka.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SCAN_CHUNK_BYTES,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    offset_from_file_name,
    segment_file_name,
)
from tidelog.storage.kafka.txn_index import SUFFIX as TXN_INDEX_SUFFIX
from tidelog.storage.kafka.txn_index import TransactionIndex

log = logging.getLogger("tidelog.storage")

SEGMENT_FILE = re.compile(r"^\d{20}\.(log|index|timeindex|txnindex|snapshot)$")
# `<name>.tmp` of a file this log owns (written there first, then renamed): a leftover is an interrupted write of
# ours. Any other `.tmp` file is someone else's, reported and left alone.
OWN_TEMP_FILE = re.compile(
    r"^(partition\.metadata|leader-epoch-checkpoint|\d{20}\.(log|index|timeindex|txnindex|snapshot))\.tmp$"
)


@dataclass(frozen=True, slots=True)
class LoadedLog:
    segments: list[LogSegment]  # at least one, by base offset; the last is the active segment
    log_start_offset: int
    recovery_point: int
    log_end_offset: int
    producer_state: ProducerStateManager
    leader_epoch_cache: LeaderEpochCache


class LogLoader:
    def __init__(
        self,
        directory: Path,
        name: str,
        topic_id: str,
        config: LogConfig,
        *,
        scheduler: Scheduler | None,
        clock: Callable[[], int],
        handles: FileHandles | None = None,
        index_blocks: IndexBlockCache | None = None,
        index_tails: IndexTails | None = None,
    ) -> None:
        self.directory = directory
        self.handles = handles  # the engine's open segment files (file_handles.py)
        self.index_blocks = index_blocks  # the engine's cache of index blocks (index_block_cache.py)
        self.index_tails = index_tails  # the engine's writer of index entries kept in memory (index_tails.py)
        self.name = name  # of the partition, in log messages
        self.topic_id = topic_id
        self.config = config
        self.scheduler = scheduler  # for the leader-epoch cache's deferred writes
        self.clock = clock

    def load(self, recovery_point: int, log_start_offset: int, had_clean_shutdown: bool) -> LoadedLog:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_partition_metadata()
        needs_recovery, names = self._clean_up_files()
        now = self.clock()
        segments: list[LogSegment] = []
        last_offsets: dict[int, int | None] = {}  # base -> last offset held (None: none), from the sanity checks
        for name in sorted(n for n in names if n.endswith(LOG_SUFFIX) and SEGMENT_FILE.match(n)):
            base = offset_from_file_name(name)
            index_missing = segment_file_name(base, INDEX_SUFFIX) not in names
            time_index_missing = segment_file_name(base, TIME_INDEX_SUFFIX) not in names
            segment = LogSegment(
                self.directory,
                base,
                self.config,
                now_ms=now,
                handles=self.handles,
                index_blocks=self.index_blocks,
                index_tails=self.index_tails,
            )
            if index_missing or time_index_missing:
                log.warning("%s: index files for segment %d are missing; rebuilding them", self.name, base)
                needs_recovery.add(base)
            else:
                try:
                    last_offsets[base] = segment.sanity_check()
                except TidelogError as exc:
                    log.warning("%s: %s; rebuilding the indexes of segment %d", self.name, exc, base)
                    needs_recovery.add(base)
            segments.append(segment)

        recovered_epochs, recovered = self._recover(
            segments, needs_recovery, None if had_clean_shutdown else recovery_point, last_offsets
        )

        log_end_offset = _log_end_offset(segments, {b: last_offsets[b] for b in last_offsets.keys() - recovered})
        if segments and log_end_offset < log_start_offset:
            log.warning(
                "%s: log end %d is below the checkpointed log start %d; starting empty at %d",
                self.name,
                log_end_offset,
                log_start_offset,
                log_start_offset,
            )
            for segment in segments:
                segment.delete_files()
            segments = []
        if not segments:
            segments.append(
                LogSegment(
                    self.directory,
                    max(log_start_offset, 0),
                    self.config,
                    now_ms=now,
                    handles=self.handles,
                    index_blocks=self.index_blocks,
                    index_tails=self.index_tails,
                )
            )
            log_end_offset = segments[0].base_offset
        for segment in segments[:-1]:
            segment.on_become_inactive()
        segments[-1].become_active()

        log_start_offset = max(log_start_offset, segments[0].base_offset)
        recovery_point = log_end_offset if had_clean_shutdown else min(recovery_point, log_end_offset)
        self._rebuild_txn_indexes(segments, recovered, log_start_offset)
        producer_state = ProducerStateManager(self.directory)
        rebuild_producer_state(producer_state, segments, log_start_offset, log_end_offset)
        epochs = LeaderEpochCache.load(
            self.directory,
            name=self.name,
            scheduler=self.scheduler,
            recovered=recovered_epochs,
            scan=lambda: _scan_leader_epochs(segments),
            log_start_offset=log_start_offset,
            log_end_offset=log_end_offset,
        )
        return LoadedLog(segments, log_start_offset, recovery_point, log_end_offset, producer_state, epochs)

    def _recover(
        self,
        segments: list[LogSegment],
        needs_recovery: set[int],
        recovery_point: int | None,
        last_offsets: dict[int, int | None],
    ) -> tuple[list[tuple[int, int]], set[int]]:
        """Recover the segments in `needs_recovery` and, after an unclean shutdown (a `recovery_point`), every one
        from the segment holding it; at a truncation the later segments are deleted (and dropped from `segments`).
        `last_offsets`: what the sanity checks found, so that a segment kept is not walked again.
        Returns the leader epochs the recovered segments hold, in log order, and their base offsets."""
        recovered: set[int] = set()
        if not segments:
            return [], recovered
        first_to_recover = len(segments) if recovery_point is None else _segment_slot(segments, recovery_point)
        epochs: list[tuple[int, int]] = []
        previous_last = -1
        for slot, segment in enumerate(list(segments)):
            if slot < first_to_recover and segment.base_offset not in needs_recovery:
                previous_last = _last_offset_in(segment, previous_last, last_offsets)
                continue
            result = segment.recover(previous_last)
            recovered.add(segment.base_offset)
            epochs += result.leader_epochs
            previous_last = _last_offset_in(segment, previous_last, {})
            if result.truncated_bytes:
                log.warning(
                    "%s: recovery truncated %d bytes of segment %d (%s)",
                    self.name,
                    result.truncated_bytes,
                    segment.base_offset,
                    result.reason,
                )
                for later in segments[slot + 1 :]:
                    log.warning("%s: deleting segment %d after the truncation point", self.name, later.base_offset)
                    later.delete_files()
                del segments[slot + 1 :]
                break
        return epochs, recovered

    def _rebuild_txn_indexes(self, segments: list[LogSegment], recovered: set[int], log_start_offset: int) -> None:
        """Step 4's end: recovery emptied the transaction indexes of the `recovered` segments; a replay of the
        producers' batches from the newest snapshot at or below the first of them to the log end (later snapshots
        are left alone) writes their aborted transactions again."""
        first = next((segment for segment in segments if segment.base_offset in recovered), None)
        if first is None:
            return
        state = ProducerStateManager(self.directory)
        start = max(state.load_snapshot_at_or_below(first.base_offset), log_start_offset)
        rebuilt = sum(
            1 for _ in _replay(state, segments, start, {s.base_offset for s in segments if s.base_offset in recovered})
        )
        log.info(
            "%s: rebuilt the transaction indexes of %d segment(s) (%d aborted)", self.name, len(recovered), rebuilt
        )

    def _check_partition_metadata(self) -> None:
        path = self.directory / checkpoints.PARTITION_METADATA
        try:
            found = checkpoints.read_partition_metadata(path)
        except CorruptCheckpointError as exc:
            log.warning("%s: %s; rewriting it", self.name, exc)
            found = None
        if found != self.topic_id:
            if found is not None:
                log.warning(
                    "%s: partition.metadata names topic id %s but the topic's id is %s; rewriting it",
                    self.name,
                    found,
                    self.topic_id,
                )
            checkpoints.write_partition_metadata(path, self.topic_id)

    def _clean_up_files(self) -> tuple[set[int], set[str]]:
        """Step 2: finish or undo interrupted file operations; report stray files. Returns the base offsets of the
        segments that need recovery (those a swap put in place) and the names the directory holds afterwards.
        Names are listed, never stat'ed, and paths are made only for the files acted on: a broker opens many
        partitions."""
        names = sorted(os.listdir(self.directory))
        cleaned_bases = [offset_from_file_name(n) for n in names if n.endswith(CLEANED_SUFFIX) and n[:20].isdigit()]
        min_cleaned = min(cleaned_bases, default=None)
        swaps: list[str] = []
        changed = False
        for name in names:
            if name.endswith((DELETED_SUFFIX, CLEANED_SUFFIX)) or OWN_TEMP_FILE.match(name):
                log.info("%s: removing leftover %s", self.name, name)
                (self.directory / name).unlink(missing_ok=True)
                changed = True
            elif name.endswith(SWAP_SUFFIX):
                final = name[: -len(SWAP_SUFFIX)]
                if not SEGMENT_FILE.match(final):
                    log.warning("%s: stray file %s is not part of a Kafka log; leaving it alone", self.name, name)
                elif (min_cleaned is not None and offset_from_file_name(name) >= min_cleaned) or not final.endswith(
                    LOG_SUFFIX
                ):
                    log.info("%s: removing %s of an unfinished replacement", self.name, name)
                    (self.directory / name).unlink()
                    changed = True
                else:
                    swaps.append(name)
        needs_recovery: set[int] = set()
        for name in swaps:
            needs_recovery.add(self._complete_swap(name))
        present = set(os.listdir(self.directory)) if changed or swaps else set(names)  # leftovers went, swaps moved
        for name in sorted(present):
            if name in (checkpoints.PARTITION_METADATA, checkpoints.LEADER_EPOCH_CHECKPOINT, KEY_INDEX_DIR):
                continue
            if not SEGMENT_FILE.match(name):
                log.warning("%s: stray file %s is not part of a Kafka log; leaving it alone", self.name, name)
                continue
            is_index = name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX))
            if is_index and segment_file_name(offset_from_file_name(name), LOG_SUFFIX) not in present:
                log.info("%s: removing index %s that has no .log", self.name, name)
                (self.directory / name).unlink()
                present.discard(name)
        return needs_recovery, present

    def _complete_swap(self, swap_name: str) -> int:
        """Put a finished `.log.swap` in place of the segments its offsets cover; returns its base offset. The covered
        offsets are read from the batch headers (batch_chain's walk, bodies skipped unread): up to a partial tail,
        and a chain damaged before it is a CorruptRecordError."""
        base = offset_from_file_name(swap_name)
        swap_path = self.directory / swap_name
        next_offset = base + 1
        with open(swap_path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            chain = ChainReader(handle.fileno(), 0, size, window=SCAN_CHUNK_BYTES, whole=False)
            for window in chain:
                next_offset = max(next_offset, int(batch_table(window).last_offset.max()) + 1)
        assert chain.stopped is not None
        if chain.stopped.stop.is_damage:
            raise CorruptRecordError(f"{swap_path}: {chain.stopped}")
        for path in list(self.directory.iterdir()):
            name = path.name
            covered = SEGMENT_FILE.match(name) and base <= offset_from_file_name(name) < next_offset
            if covered and not name.endswith(".snapshot"):
                log.info("%s: %s is replaced by %s", self.name, name, swap_name)
                path.unlink()
        log.info("%s: completing the interrupted swap of %s", self.name, swap_name)
        os.replace(swap_path, self.directory / swap_name[: -len(SWAP_SUFFIX)])
        fsync_directory(self.directory)
        return base


def _segment_slot(segments: list[LogSegment], offset: int) -> int:
    """Slot of the segment that holds `offset` (the last with base <= offset), at least 0."""
    return max(0, bisect.bisect_right(segments, offset, key=lambda segment: segment.base_offset) - 1)


def _last_offset_in(segment: LogSegment, previous_last: int, known: dict[int, int | None]) -> int:
    """The last offset `segment` holds (`previous_last` when it holds none); `known`: found earlier, by base."""
    if segment.base_offset in known:
        found = known[segment.base_offset]
        return previous_last if found is None else found
    last = previous_last
    position = segment.index.lookup(segment.index.last_offset).position if segment.index.entries else 0
    for location in segment.batch_locations(position):
        last = location.last_offset
    return last


def _log_end_offset(segments: list[LogSegment], known: dict[int, int | None]) -> int:
    """The offset after the last batch; `known`: the last offsets of unchanged segments, found earlier, by base."""
    if not segments:
        return 0
    last = segments[-1]
    if last.base_offset in known:
        found = known[last.base_offset]
        return last.base_offset if found is None else found + 1
    return last.end_offset()


def rebuild_producer_state(
    producer_state: ProducerStateManager, segments: list[LogSegment], log_start_offset: int, log_end_offset: int
) -> None:
    """Newest snapshot at or below the log end (later ones are deleted), then the batches after it (after a clean
    shutdown there is nothing to replay). Loading calls it, and a truncation (partition_log.py)."""
    start = max(producer_state.load_latest_snapshot(log_end_offset), log_start_offset)
    if start < log_end_offset:
        for _ in _replay(producer_state, segments, start):
            pass


def _replay(
    producer_state: ProducerStateManager, segments: list[LogSegment], start: int, index_bases: set[int] | None = None
) -> Iterator[AbortedTxn]:
    """Apply the batches from `start` to the log end to the producer state; the aborted transactions whose marker is
    in a segment of `index_bases` are appended to its transaction index, and yielded."""
    for segment in segments[_segment_slot(segments, start) :]:
        position = 0
        if segment.base_offset <= start:
            found = segment.translate_offset(start)
            position = found.position if found is not None else segment.size
        index = segment.txn_index if index_bases is not None and segment.base_offset in index_bases else None
        for location in segment.batch_locations(position):
            header = location.header
            if header is None or location.last_offset < start:
                continue
            data = segment.read_batch_bytes(location) if header.is_control else b""
            aborted = apply_batch(producer_state, header, data, 0, index)
            if aborted is not None:
                yield aborted


def apply_batch(
    producer_state: ProducerStateManager,
    header: BatchHeader,
    buf: bytes | bytearray | memoryview,
    pos: int,
    txn_index: TransactionIndex | None,
) -> AbortedTxn | None:
    """Apply one stored batch to the producer state (Kafka's updateProducers): a data batch is recorded, an
    end-transaction marker (the control batch at `pos` of `buf`; for a data batch `buf` is not read) completes
    its producer's transaction; an aborted one is appended to `txn_index` if given, and returned."""
    if header.producer_id < 0:
        return None
    if not header.is_control:
        producer_state.update(header, header.base_offset, header.max_timestamp)
        return None
    marker = read_end_txn_marker(buf, pos, header)
    if marker is None:
        return None
    completed = producer_state.complete_txn(
        header.producer_id,
        header.producer_epoch,
        marker.coordinator_epoch,
        marker.commit,
        header.base_offset,
        header.max_timestamp,
    )
    if completed is None or not completed.aborted:
        return None
    aborted = AbortedTxn(
        completed.producer_id, completed.first_offset, completed.last_offset, completed.last_stable_offset
    )
    if txn_index is not None:
        txn_index.append(aborted)
    return aborted


def _scan_leader_epochs(segments: list[LogSegment]) -> list[tuple[int, int]]:
    """Leader epochs from the partitionLeaderEpoch of every batch header (first offset of each new epoch)."""
    epochs: list[tuple[int, int]] = []
    for segment in segments:
        next_offset = segment.base_offset
        for location in segment.batch_locations(0):
            epoch = location.header.partition_leader_epoch if location.header is not None else -1
            if epoch >= 0 and (not epochs or epoch > epochs[-1][0]):
                epochs.append((epoch, next_offset))
            next_offset = location.last_offset + 1
    return epochs
