"""Log compaction for the Kafka engine (Kafka's LogCleaner, LogCleanerManager and Cleaner; one cleaner thread).

Choosing a log (LogCleanerManager): only logs whose `cleanup.policy` holds `compact`. The dirty range is
[firstDirtyOffset, firstUncleanableOffset): the first comes from `cleaner-offset-checkpoint` (reset to the log
start when out of range), the second is min(active segment base, high watermark, last stable offset, base of the
first segment younger than `min.compaction.lag.ms`) - the active segment is never cleaned. A log qualifies when
cleanableBytes / (cleanBytes + cleanableBytes) >= `min.cleanable.dirty.ratio`, or when it must be cleaned now
(its first dirty batch is older than `max.compaction.lag.ms`, or a delete horizon it carries has passed); the
filthiest qualifying log goes first.

A pass (Cleaner.doClean):
1. An OffsetMap of key -> latest offset over the dirty range; when it fills, the pass ends after that batch.
2. Every segment below that end (clean ones too) is grouped so a group's log and index bytes fit one segment
   and its offsets fit 32-bit relative offsets (groupSegmentsBySize).
3. Each group is recopied into one `<base>.log.cleaned` segment (indexes rebuilt by the appends), flushed, given
   the last source segment's mtime, and swapped in crash-safely by PartitionLog.replace_segments.
4. The new first dirty offset is checkpointed by the caller.

Keeping a record (LogCleaner.shouldRetainRecord): offset > the map's latest offset; or it has a key, its offset
is >= the map's offset for that key, and it has a value or is a tombstone whose batch's delete horizon has not
passed. Keyless records are dropped (produce to a compacted topic rejects them). A batch whose records all stay
is copied byte for byte; otherwise it is re-encoded with the same codec and header fields (baseOffset,
lastOffsetDelta even if its last record went, producer id, epoch, base sequence, leader epoch), timestamp deltas
re-based. The first pass that keeps a tombstone of a batch sets attribute bit 6 and baseTimestamp = now +
`delete.retention.ms` (KIP-534); a later pass after that time drops the tombstones. A batch emptied entirely is
dropped - unless it is the last batch of a producer the log still tracks (or, for a producer whose last entry is a
marker of a newer epoch, that marker): then a header-only batch (count 0, same offsets and sequence) stays
(RETAIN_EMPTY), so the producer's sequence and epoch continue after cleaning. Legacy (v0/v1) entries are copied.

Transactions (Kafka's CleanedTransactionMetadata, `CleanedTransactions` here), followed batch by batch in offset
order with the aborted transactions of the range from the `.txnindex` files:
- the dirty range ends at the last stable offset too, so no batch of an open transaction is ever mapped, and the
  ones a recopied segment holds beyond the range stay (their offsets are past the map's);
- a data batch of an aborted transaction (its producer's, from the transaction's first offset up to its ABORT
  marker) loses all its records, and its keys are not mapped (an aborted record never hides a committed one); a
  committed transaction's records are compacted like any others;
- an ABORT marker stays, with its `.txnindex` entry, while the pass met a batch of its transaction; a COMMIT
  marker while the pass met a batch of its transaction. A marker with no batch left is kept one more
  `delete.retention.ms`: the pass stamps its batch with a delete horizon as it stamps tombstones, and the first
  pass after the horizon removes it. The cleaned segment's `.txnindex` holds only the entries of the ABORT markers
  kept for their data (read_committed readers need no entry for a transaction with no record left).
  Control records other than markers stay; an empty control batch (a RETAIN_EMPTY left) goes when it is not the
  last of its producer.

Per-record work is vectorised (record_layout decodes a chunk of batches at once, key_digests hashes their keys);
Python steps run per batch, plus one C-level dict operation per keyed record and an encode per record kept in a
re-encoded batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tidelog.codec.batch_chain import ChainReader, batch_table
from tidelog.codec.batch_table import BatchTable
from tidelog.codec.control_record import read_end_txn_marker
from tidelog.codec.record_batch import (
    COMPRESSION_MASK,
    DELETE_HORIZON_MASK,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    assemble_batch,
    check_crc,
    compute_crc,
    decode_records,
    encode_record,
    read_header,
)
from tidelog.codec.record_framing import PADDING
from tidelog.codec.record_layout import RecordLayout, key_digest_array, key_digests, record_layout
from tidelog.codec.varint import encode_varint, encode_varlong
from tidelog.config import INT_MAX, CleanerConfig
from tidelog.errors import CorruptCheckpointError, CorruptRecordError
from tidelog.storage.common.aborted_txn import AbortedTxn
from tidelog.storage.common.offset_checkpoint import read_offset_checkpoint, write_offset_checkpoint
from tidelog.storage.kafka.offset_map import NOT_FOUND, OffsetMap
from tidelog.storage.kafka.segment import (
    CLEANED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    segment_file_name,
)
from tidelog.storage.kafka.txn_index import SUFFIX as TXN_INDEX_SUFFIX

if TYPE_CHECKING:
    from tidelog.storage.kafka.partition_log import PartitionLog, ProducerLastRecord

log = logging.getLogger("tidelog.storage")

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
READ_CHUNK_BYTES = 4 * 1024 * 1024


@dataclass
class CleanStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    batches_rewritten: int = 0
    segments_cleaned: int = 0
    end_offset: int = 0  # the new first dirty offset
    delete_horizons: list[int] = field(default_factory=list)  # horizons of batches that still hold tombstones


@dataclass(frozen=True)
class LogToClean:
    log: PartitionLog
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    must_clean: bool

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


def segment_chunks(segment: LogSegment, position: int = 0) -> Iterator[tuple[bytes | memoryview, BatchTable]]:
    """The segment's complete batches from `position` (a batch start), a few MiB at a time (a larger batch in a read
    of its own), walked by batch_chain's ChainReader. Each read has record_framing's spare bytes after it, so
    record_layout frames it without a copy. Stops quietly at a partial tail; damage is a CorruptRecordError."""
    file = segment.file  # held while the walk reads it
    chain = ChainReader(file.fileno(), position, segment.size, window=READ_CHUNK_BYTES, padding=PADDING)
    for window in chain:
        yield window.data, batch_table(window)
    assert chain.stopped is not None
    if chain.stopped.stop.is_damage:
        raise CorruptRecordError(f"{segment.log_path}: {chain.stopped}")


class CleanedTransactions:
    """Kafka's CleanedTransactionMetadata: the transactions a pass meets, batch by batch in offset order.

    Built from the aborted transactions (`.txnindex` entries) whose ABORT marker is at or after the first offset
    the pass reads. A transaction is under way from its first offset; a transactional data batch of its producer
    then belongs to it (aborted: its records go), any other transactional data batch to a committed transaction.
    A marker ends its producer's transaction; whether it may go depends on whether this pass met a batch of that
    transaction (in any group of segments: one instance follows the whole pass). `take_retained` gives the aborted
    transactions whose marker stays for their data, in marker order, since it was last called (the cleaned
    segment's `.txnindex`)."""

    def __init__(self, aborted: list[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda txn: txn.first_offset, reverse=True)  # next one last
        self._aborting: dict[int, tuple[AbortedTxn, list[bool]]] = {}  # producer -> (txn, [met a batch])
        self._committing: set[int] = set()  # producers whose committed transaction this pass met a batch of
        self._retained: list[AbortedTxn] = []

    def take_retained(self) -> list[AbortedTxn]:
        retained, self._retained = self._retained, []
        return retained

    def _start_up_to(self, offset: int) -> None:
        while self._pending and self._pending[-1].first_offset <= offset:
            txn = self._pending.pop()
            self._aborting.setdefault(txn.producer_id, (txn, [False]))

    def data_batch(self, producer_id: int, last_offset: int) -> bool:
        """A transactional data batch: True if it belongs to an aborted transaction."""
        self._start_up_to(last_offset)
        aborting = self._aborting.get(producer_id)
        if aborting is not None:
            aborting[1][0] = True
            return True
        self._committing.add(producer_id)
        return False

    def control_batch(self, chunk: bytes | memoryview, position: int, producer_id: int, last_offset: int) -> bool:
        """The control batch at `position`: True if it may go (once its delete horizon has passed)."""
        self._start_up_to(last_offset)
        header = read_header(chunk, position)
        if header.records_count <= 0:
            return True  # emptied by an earlier pass
        marker = read_end_txn_marker(chunk, position, header)
        if marker is None:
            return False  # a control record that is no transaction marker
        if marker.commit:
            met = producer_id in self._committing
            self._committing.discard(producer_id)
            return not met
        txn, met_batch = self._aborting.pop(producer_id, (None, [False]))
        if txn is not None and met_batch[0]:
            self._retained.append(txn)
            return False
        return True


def aborted_since(segments: list[LogSegment], offset: int) -> list[AbortedTxn]:
    """The aborted transactions of the segments' `.txnindex` files whose ABORT marker is at or after `offset`."""
    return [txn for segment in segments for txn in list(segment.txn_index.entries) if txn.last_offset >= offset]


def transaction_rows(
    chunk: bytes | memoryview, table: BatchTable, transactions: CleanedTransactions
) -> tuple[np.ndarray, np.ndarray]:
    """Feed the chunk's transactional batches to `transactions` in offset order: (rows of aborted data, rows of
    control batches that may go)."""
    aborted = np.zeros(len(table), dtype=bool)
    may_go = np.zeros(len(table), dtype=bool)
    is_control = table.is_control
    producer_ids = table.header["producer_id"].tolist()
    positions = table.position.tolist()
    last_offsets = table.last_offset.tolist()
    for row in np.nonzero(table.is_transactional | is_control)[0].tolist():
        if is_control[row]:
            may_go[row] = transactions.control_batch(chunk, positions[row], producer_ids[row], last_offsets[row])
        else:
            aborted[row] = transactions.data_batch(producer_ids[row], last_offsets[row])
    return aborted, may_go


class CleaningAborted(Exception):
    """The engine is closing: the pass stops where it is (what was swapped in stays, the rest is untouched)."""


class Cleaner:
    """One pass over one log at a time (Kafka's Cleaner)."""

    def __init__(self, dedupe_buffer_size: int, clock: Callable[[], int]) -> None:
        self.dedupe_buffer_size = dedupe_buffer_size
        self.clock = clock
        self.aborted = threading.Event()

    def _check_aborted(self) -> None:
        if self.aborted.is_set():
            raise CleaningAborted

    def clean(self, to_clean: LogToClean) -> CleanStats:
        partition_log = to_clean.log
        now = self.clock()
        segments, _log_start, _high_watermark = partition_log.cleaning_view()
        stats = CleanStats()
        offset_map = OffsetMap(self.dedupe_buffer_size)
        offset_map.latest_offset = to_clean.first_dirty_offset - 1  # an empty dirty range keeps nothing beyond it
        end_offset = self._build_offset_map(
            segments, to_clean.first_dirty_offset, to_clean.first_uncleanable_offset, offset_map, stats
        )
        stats.end_offset = end_offset
        offset_map.freeze()
        config = partition_log.config
        to_recopy = [s for s in segments[:-1] if s.base_offset < end_offset]
        producer_last = partition_log.producer_last_records()
        transactions = CleanedTransactions(aborted_since(segments, 0))  # carried from group to group
        for group in group_segments_by_size(to_recopy, config.segment_bytes, config.segment_index_bytes, end_offset):
            cleaned = self._clean_group(partition_log.directory, group, partition_log, offset_map, now,
                                        producer_last, transactions, stats)  # fmt: skip
            if not partition_log.replace_segments(group, cleaned):
                log.info("%s: the log changed while it was cleaned; this pass stops here", partition_log.name)
                break
            stats.segments_cleaned += len(group)
        log.info(
            "%s: cleaned %d segment(s) up to offset %d: %d of %d records kept, %d -> %d bytes (%d keys mapped)",
            partition_log.name,
            stats.segments_cleaned,
            end_offset,
            stats.records_kept,
            stats.records_read,
            stats.bytes_read,
            stats.bytes_written,
            len(offset_map),
        )
        return stats

    # --- 1. the offset map ------------------------------------------------------------------------------------

    def _build_offset_map(
        self, segments: list[LogSegment], first_dirty: int, first_uncleanable: int, offset_map: OffsetMap,
        stats: CleanStats,
    ) -> int:  # fmt: skip
        """Map the dirty range; returns where the pass ends (first_uncleanable, or sooner if the map filled)."""
        transactions = CleanedTransactions(aborted_since(segments, first_dirty))
        for slot, segment in enumerate(segments):
            upper = segments[slot + 1].base_offset if slot + 1 < len(segments) else None
            if segment.base_offset >= first_uncleanable:
                break
            if upper is not None and upper <= first_dirty:
                continue
            start = segment.index.lookup(first_dirty).position if segment.base_offset <= first_dirty else 0
            for chunk, table in segment_chunks(segment, start):
                self._check_aborted()
                last_offsets = table.last_offset
                wanted = (last_offsets >= first_dirty) & (table.base_offset < first_uncleanable)
                if not wanted.any():
                    if (table.base_offset >= first_uncleanable).any():
                        break
                    continue
                table = table.take(np.nonzero(wanted)[0])
                if self._map_chunk(chunk, table, offset_map, transactions):
                    return offset_map.latest_offset + 1
        return first_uncleanable

    def _map_chunk(
        self, chunk: bytes | memoryview, table: BatchTable, offset_map: OffsetMap, transactions: CleanedTransactions
    ) -> bool:
        """Put the keys of the chunk's data batches (not aborted ones) in the map; True when the map filled (after a
        whole batch)."""
        aborted, _ = transaction_rows(chunk, table, transactions)
        data_rows = np.nonzero((table.magic == 2) & ~table.is_control & ~aborted)[0]
        layout = record_layout(chunk, table.take(data_rows))
        keyed = np.nonzero(layout.key_length >= 0)[0]
        last_offsets = table.last_offset
        if offset_map.room_for(len(keyed)):
            offset_map.put_many(key_digests(layout, keyed), layout.offset[keyed].tolist())
            offset_map.latest_offset = int(last_offsets[-1])
            return False
        record_batch = data_rows[layout.batch[keyed]]  # row in `table` of each keyed record
        bounds = np.searchsorted(record_batch, np.arange(len(table) + 1))
        for row in range(len(table)):
            rows = keyed[bounds[row] : bounds[row + 1]]
            offset_map.put_many(key_digests(layout, rows), layout.offset[rows].tolist())
            offset_map.latest_offset = int(last_offsets[row])
            if offset_map.is_full:
                return True
        return False

    # --- 3. recopying a group ---------------------------------------------------------------------------------

    def _clean_group(
        self,
        directory: Path,
        group: list[LogSegment],
        partition_log: PartitionLog,
        offset_map: OffsetMap,
        now: int,
        producer_last: dict[int, ProducerLastRecord],
        transactions: CleanedTransactions,
        stats: CleanStats,
    ) -> LogSegment:
        # leftovers of an earlier pass that failed
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            (directory / (segment_file_name(group[0].base_offset, suffix) + CLEANED_SUFFIX)).unlink(missing_ok=True)
        cleaned = LogSegment(directory, group[0].base_offset, partition_log.config, now_ms=now,
                             file_suffix=CLEANED_SUFFIX, handles=group[0].handles,
                             index_blocks=group[0].index_blocks, index_tails=group[0].index_tails)  # fmt: skip
        try:
            for segment in group:
                for chunk, table in segment_chunks(segment):
                    self._check_aborted()
                    stats.bytes_read += table.end
                    self._clean_chunk(chunk, table, cleaned, partition_log, offset_map, now,
                                      producer_last, transactions, stats)  # fmt: skip
            for aborted in transactions.take_retained():
                cleaned.txn_index.append(aborted)
            cleaned.on_become_inactive()
            cleaned.flush()
            cleaned.set_last_modified_ms(group[-1].last_modified_ms())
        except BaseException:
            cleaned.delete_files()
            raise
        stats.bytes_written += cleaned.size
        return cleaned

    def _clean_chunk(
        self,
        chunk: bytes | memoryview,
        table: BatchTable,
        cleaned: LogSegment,
        partition_log: PartitionLog,
        offset_map: OffsetMap,
        now: int,
        producer_last: dict[int, ProducerLastRecord],
        transactions: CleanedTransactions,
        stats: CleanStats,
    ) -> None:
        header = table.header
        attributes = header["attributes"].astype(np.int64)
        aborted, marker_may_go = transaction_rows(chunk, table, transactions)
        is_control = table.is_control
        is_data = (table.magic == 2) & ~is_control
        data_rows = np.nonzero(is_data)[0]
        layout = record_layout(chunk, table.take(data_rows))
        record_row = data_rows[layout.batch]  # row in `table` of each record
        has_horizon = (attributes & DELETE_HORIZON_MASK) != 0
        base_timestamps = header["base_timestamp"].astype(np.int64)
        tombstones_stay = ~has_horizon | (now < base_timestamps)
        keyed = layout.key_length >= 0
        found = np.full(len(layout), NOT_FOUND, dtype=np.int64)
        keyed_rows = np.nonzero(keyed)[0]
        found[keyed_rows] = offset_map.get_many(key_digest_array(layout, keyed_rows))
        is_tombstone = layout.value_length < 0
        keep = ~aborted[record_row] & (
            (layout.offset > offset_map.latest_offset)
            | (keyed & (layout.offset >= found) & (~is_tombstone | tombstones_stay[record_row]))
        )
        kept_count = np.bincount(record_row[keep], minlength=len(table))
        kept_tombstones = np.bincount(record_row[keep & is_tombstone], minlength=len(table))
        first_record = np.searchsorted(record_row, np.arange(len(table) + 1))
        stats.records_read += len(layout)
        stats.records_kept += int(keep.sum())
        counts = header["records_count"].astype(np.int64)
        positions = table.position.tolist()
        sizes = table.size.tolist()
        last_offsets = table.last_offset.tolist()
        producer_ids = header["producer_id"].tolist()
        producer_epochs = header["producer_epoch"].tolist()

        def last_of_producer(row: int) -> bool:
            """Kafka's isBatchLastRecordOfProducer: the batch holding the producer's last sequence, or (its last
            entry a marker of a newer epoch) that marker; such a batch stays, if only as its header."""
            last = producer_last.get(producer_ids[row])
            if last is None:
                return False
            if last.last_data_offset is not None:
                return bool(last_offsets[row] == last.last_data_offset)
            return bool(is_control[row]) and producer_epochs[row] == last.epoch

        for row in range(len(table)):
            position, size = positions[row], sizes[row]
            original = memoryview(chunk)[position : position + size]
            if is_control[row]:
                self._clean_control(cleaned, chunk, position, original, bool(marker_may_go[row]), last_of_producer(row),
                                    now, partition_log.config.delete_retention_ms, stats)  # fmt: skip
                continue
            if not is_data[row]:
                self._append(cleaned, original, last_offsets[row], int(header["max_timestamp"][row]))
                continue
            needs_horizon = kept_tombstones[row] > 0 and not has_horizon[row]
            if kept_count[row] == counts[row] and not needs_horizon:
                batch: bytes | memoryview = original
                if has_horizon[row] and kept_tombstones[row] > 0:
                    stats.delete_horizons.append(int(base_timestamps[row]))
            elif kept_count[row] > 0:
                horizon = now + partition_log.config.delete_retention_ms if needs_horizon else None
                if horizon is not None or (has_horizon[row] and kept_tombstones[row] > 0):
                    stats.delete_horizons.append(horizon if horizon is not None else int(base_timestamps[row]))
                rows = np.nonzero(keep[first_record[row] : first_record[row + 1]])[0] + first_record[row]
                batch = self._rebuild(chunk, position, layout, rows, horizon)
                stats.batches_rewritten += 1
            else:
                if not last_of_producer(row):
                    continue  # nothing left and no producer state to keep: the batch goes
                batch = self._empty_batch(chunk, position)
                stats.batches_rewritten += 1
            self._append(cleaned, batch, last_offsets[row], read_header(batch).max_timestamp)

    def _clean_control(
        self,
        cleaned: LogSegment,
        chunk: bytes | memoryview,
        position: int,
        original: memoryview,
        may_go: bool,
        last_of_producer: bool,
        now: int,
        delete_retention_ms: int,
        stats: CleanStats,
    ) -> None:
        """A control batch: kept; or stamped with a delete horizon (the first pass that finds it may go); or, once
        that horizon has passed, removed - or emptied, when it is its producer's last entry (RETAIN_EMPTY)."""
        header = read_header(chunk, position)
        has_horizon = bool(header.attributes & DELETE_HORIZON_MASK)
        batch: bytes | memoryview = original
        if header.records_count <= 0:
            if not last_of_producer:
                return
        elif may_go and has_horizon and header.base_timestamp <= now:
            if not last_of_producer:
                return
            batch = self._empty_batch(chunk, position)
            stats.batches_rewritten += 1
        elif may_go and not has_horizon:
            horizon = now + delete_retention_ms
            batch = self._stamp_horizon(chunk, position, horizon)
            stats.delete_horizons.append(horizon)
            stats.batches_rewritten += 1
        elif may_go:
            stats.delete_horizons.append(header.base_timestamp)
        self._append(cleaned, batch, header.base_offset + header.last_offset_delta, read_header(batch).max_timestamp)

    @staticmethod
    def _stamp_horizon(chunk: bytes | memoryview, position: int, horizon: int) -> bytes:
        """The control batch at `position` with its delete horizon set (attribute bit 6, baseTimestamp = horizon,
        the records' timestamp deltas re-based), as Kafka rewrites a batch whose marker may go."""
        original = read_header(chunk, position)
        check_crc(original, compute_crc(chunk, position, original.size_in_bytes), position)
        records = decode_records(chunk, position, original)
        body = b"".join(
            encode_record(record.offset - original.base_offset, (record.timestamp_ms or 0) - horizon, record)
            for record in records
        )
        return assemble_batch(
            body,
            records_count=len(records),
            attributes=original.attributes | DELETE_HORIZON_MASK,
            base_offset=original.base_offset,
            last_offset_delta=original.last_offset_delta,
            base_timestamp=horizon,
            max_timestamp=original.max_timestamp,
            producer_id=original.producer_id,
            producer_epoch=original.producer_epoch,
            base_sequence=original.base_sequence,
            partition_leader_epoch=original.partition_leader_epoch,
        )

    @staticmethod
    def _append(cleaned: LogSegment, batch: bytes | memoryview, last_offset: int, max_timestamp: int) -> None:
        cleaned.append([batch], len(batch), last_offset, max_timestamp, last_offset, max_timestamp)

    @staticmethod
    def _rebuild(
        chunk: bytes | memoryview, position: int, layout: RecordLayout, rows: np.ndarray, horizon: int | None
    ) -> bytes:
        """The batch at `position` holding only the records `rows`, re-encoded with its codec and header fields."""
        original = read_header(chunk, position)
        check_crc(original, compute_crc(chunk, position, original.size_in_bytes), position)
        timestamps = layout.timestamp[rows]
        attributes = original.attributes
        if horizon is not None:
            base_timestamp = horizon
            attributes |= DELETE_HORIZON_MASK
        elif attributes & DELETE_HORIZON_MASK:
            base_timestamp = original.base_timestamp
        else:
            base_timestamp = int(timestamps[0])
        log_append_time = attributes & TIMESTAMP_TYPE_MASK
        max_timestamp = original.max_timestamp if log_append_time else int(timestamps.max())
        data = layout.data
        parts = []
        for timestamp, offset_delta, tail, end in zip(
            (timestamps - base_timestamp).tolist(),
            layout.offset_delta[rows].tolist(),
            layout.tail_start[rows].tolist(),
            layout.record_end[rows].tolist(),
            strict=True,
        ):
            body = b"\x00" + encode_varlong(timestamp) + encode_varint(offset_delta) + data[tail:end]
            parts.append(encode_varint(len(body)))
            parts.append(body)
        return assemble_batch(
            b"".join(parts),
            records_count=len(rows),
            attributes=attributes,
            base_offset=original.base_offset,
            last_offset_delta=original.last_offset_delta,
            base_timestamp=base_timestamp,
            max_timestamp=max_timestamp,
            producer_id=original.producer_id,
            producer_epoch=original.producer_epoch,
            base_sequence=original.base_sequence,
            partition_leader_epoch=original.partition_leader_epoch,
        )

    @staticmethod
    def _empty_batch(chunk: bytes | memoryview, position: int) -> bytes:
        """RETAIN_EMPTY: the header alone, count 0, uncompressed (Kafka's DefaultRecordBatch.writeEmptyHeader)."""
        original = read_header(chunk, position)
        return assemble_batch(
            b"",
            records_count=0,
            attributes=original.attributes & ~(COMPRESSION_MASK | DELETE_HORIZON_MASK),
            base_offset=original.base_offset,
            last_offset_delta=original.last_offset_delta,
            base_timestamp=NO_TIMESTAMP,
            max_timestamp=original.max_timestamp,
            producer_id=original.producer_id,
            producer_epoch=original.producer_epoch,
            base_sequence=original.base_sequence,
            partition_leader_epoch=original.partition_leader_epoch,
        )


def group_segments_by_size(
    segments: list[LogSegment], max_size: int, max_index_size: int, first_uncleanable: int
) -> list[list[LogSegment]]:
    """Consecutive segments merged while the log bytes fit `segment.bytes`, each index fits `segment.index.bytes`
    and the offsets stay within 32-bit relative offsets of the group's base (Kafka's groupSegmentsBySize)."""
    groups: list[list[LogSegment]] = []
    slot = 0
    while slot < len(segments):
        group = [segments[slot]]
        log_size = group[0].size
        index_size = group[0].index.size_in_bytes
        time_index_size = group[0].time_index.size_in_bytes
        slot += 1
        while slot < len(segments):
            candidate = segments[slot]
            upper = segments[slot + 1].base_offset - 1 if slot + 1 < len(segments) else first_uncleanable - 1
            if not (
                log_size + candidate.size <= max_size
                and index_size + candidate.index.size_in_bytes <= max_index_size
                and time_index_size + candidate.time_index.size_in_bytes <= max_index_size
                and (candidate.size == 0 or upper - group[0].base_offset <= INT_MAX)
            ):
                break
            group.append(candidate)
            log_size += candidate.size
            index_size += candidate.index.size_in_bytes
            time_index_size += candidate.time_index.size_in_bytes
            slot += 1
        groups.append(group)
    return groups


class LogCleaner:
    """Picks the filthiest compacted log and cleans it; keeps the first dirty offsets (LogCleanerManager)."""

    def __init__(self, config: CleanerConfig, clock: Callable[[], int]) -> None:
        self.config = config
        self.clock = clock
        self.cleaner = Cleaner(config.dedupe_buffer_size, clock)
        self.first_dirty: dict[tuple[str, int], int] = {}
        self.delete_horizons: dict[tuple[str, int], int] = {}  # earliest horizon still holding tombstones

    def load_checkpoint(self, log_dir: Path) -> None:
        path = log_dir / CLEANER_OFFSET_CHECKPOINT
        try:
            self.first_dirty.update(read_offset_checkpoint(path))
        except CorruptCheckpointError as exc:
            log.warning("%s; compacted logs are cleaned from their start", exc)

    def write_checkpoint(self, log_dir: Path, keys: list[tuple[str, int]]) -> None:
        offsets = {key: self.first_dirty[key] for key in keys if key in self.first_dirty}
        write_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT, offsets)

    def log_to_clean(self, partition_log: PartitionLog) -> LogToClean:
        now = self.clock()
        config = partition_log.config
        segments, log_start, high_watermark = partition_log.cleaning_view()
        key = (partition_log.topic, partition_log.partition)
        first_dirty = self.first_dirty.get(key, log_start)
        log_end = partition_log.log_end_offset
        if not log_start <= first_dirty <= log_end:
            if key in self.first_dirty:
                log.warning("%s: checkpointed first dirty offset %d is outside [%d, %d]; cleaning from the start",
                            partition_log.name, first_dirty, log_start, log_end)  # fmt: skip
            first_dirty = log_start
        first_uncleanable = min(segments[-1].base_offset, high_watermark, partition_log.last_stable_offset)
        if config.min_compaction_lag_ms > 0:
            too_young = now - config.min_compaction_lag_ms
            for segment in segments[:-1]:
                if segment.base_offset >= first_dirty and segment.largest_timestamp > too_young:
                    first_uncleanable = min(first_uncleanable, segment.base_offset)
                    break
        first_uncleanable = max(first_uncleanable, first_dirty)
        clean_bytes = cleanable_bytes = 0
        first_dirty_timestamp: int | None = None
        for slot, segment in enumerate(segments):
            upper = segments[slot + 1].base_offset if slot + 1 < len(segments) else log_end + 1
            if upper <= first_dirty:
                clean_bytes += segment.size
            elif segment.base_offset < first_uncleanable:
                cleanable_bytes += segment.size
                if first_dirty_timestamp is None:
                    first_dirty_timestamp = segment.rolling_based_timestamp()
        must_clean = bool(
            cleanable_bytes
            and first_dirty_timestamp is not None
            and first_dirty_timestamp >= 0
            and now - first_dirty_timestamp > config.max_compaction_lag_ms
        )
        horizon = self.delete_horizons.get(key)
        if horizon is not None and now >= horizon:
            must_clean = True
        return LogToClean(partition_log, first_dirty, first_uncleanable, clean_bytes, cleanable_bytes, must_clean)

    def filthiest(self, logs: list[PartitionLog]) -> LogToClean | None:
        candidates = []
        for partition_log in logs:
            if not partition_log.config.compact or partition_log.closed:
                continue
            to_clean = self.log_to_clean(partition_log)
            if to_clean.must_clean or (
                to_clean.cleanable_bytes > 0
                and to_clean.cleanable_ratio >= partition_log.config.min_cleanable_dirty_ratio
            ):
                candidates.append(to_clean)
        return max(candidates, key=lambda c: (c.must_clean, c.cleanable_ratio), default=None)

    def forget(self, key: tuple[str, int]) -> None:
        """A deleted partition: its first dirty offset goes (a topic created again under its name starts afresh)."""
        self.first_dirty.pop(key, None)
        self.delete_horizons.pop(key, None)

    def abort(self) -> None:
        self.cleaner.aborted.set()

    def clean(self, to_clean: LogToClean) -> CleanStats:
        stats = self.cleaner.clean(to_clean)
        key = (to_clean.log.topic, to_clean.log.partition)
        self.first_dirty[key] = stats.end_offset
        if stats.delete_horizons:
            self.delete_horizons[key] = min(stats.delete_horizons)
        else:
            self.delete_horizons.pop(key, None)
        return stats
