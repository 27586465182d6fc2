"""One partition: the directory `<topic>-<partition>` and its segments (Kafka's UnifiedLog + LocalLog).

Offsets: log start offset (first readable) <= recovery point (known fsynced) <= log end offset (next to assign), and
log start offset <= high watermark (readable) <= log end offset. On a single node (not `replicated`) the high
watermark is the log end after every change. A replicated log (a broker of a cluster) leaves it to the broker
(`set_high_watermark`): appends do not move it, reads stop at the batch holding it (its file position is cached),
except a follower's (`up_to_log_end`); it starts from replication-offset-checkpoint (the engine's) at open.
A follower appends the leader's batches unchanged (`append_replica`: same offsets, epochs and bytes, and the same
rolls, so its segment files are the leader's), and cuts its log back where it diverged (`truncate_to`,
`truncate_fully_and_start_at`).
Transactions: a producer's transactional batches open its transaction, an end-transaction marker (`append_marker`,
or a leader's marker a follower appends) completes it, an aborted one goes into the transaction index of the
segment holding its marker (txn_index.py); the last stable offset is min(first unstable offset of the producer
state, high watermark), and a read with `max_offset` stops there as at the high watermark.
Appends take batches as a producer sent them, check layout and CRC and (for a producer's batch) decode every
record as Kafka's LogValidator does, assign offsets by rewriting baseOffset (outside the CRC) and write them with
one pwritev, without copying the payload; a CreateTime batch whose maxTimestamp is not its records' largest
timestamp is corrected (and its CRC recomputed), as is a LogAppendTime batch's. Batches of CRC_IN_PARALLEL_BYTES
or more are checked on the engine's check worker (batch_check.py) while they are written, and count only once the
check passed. An append does no fsync (unless flush.messages asks): the producer snapshot of a roll and a changed
leader-epoch checkpoint (leader_epoch_cache.py) are made durable by the scheduler's thread, and by every flush
before it moves the recovery point. Opening loads the directory with log_loader.py: leftovers of interrupted
operations go, missing or corrupt indexes are rebuilt, and after an unclean shutdown every segment from the
recovery point is rescanned, truncated at the first invalid byte, and the segments after it deleted.
"""

from __future__ import annotations

import bisect
import logging
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tidelog.atomic_files import fsync_directory, fsync_file
from tidelog.codec.compression import Compression
from tidelog.codec.control_record import ControlRecordType, build_control_batch
from tidelog.codec.record_batch import (
    BatchHeader,
    check_crc,
    check_header_fields,
    check_producer_batch,
    compute_crc,
    read_header,
    recompress_batch,
    set_log_append_time,
    set_max_timestamp,
)
from tidelog.codec.record_check import RecordsCheck, check_batch_records, check_timestamps_within
from tidelog.config import LogConfig
from tidelog.errors import (
    InvalidRecordError,
    KafkaStorageError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.api import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    AbortedTransaction,
    AppendResult,
    FileSlice,
    FileSlices,
    Partition,
    ProducerSummary,
    TimestampAndOffset,
)
from tidelog.storage.common.file_handles import FileHandles
from tidelog.storage.common.scheduler import Scheduler
from tidelog.storage.kafka.batch_check import CRC_IN_PARALLEL_BYTES, BatchCheckWorker, PendingCheck
from tidelog.storage.kafka.index_block_cache import IndexBlockCache
from tidelog.storage.kafka.index_tails import IndexTails
from tidelog.storage.kafka.leader_epoch_cache import EpochEndOffset
from tidelog.storage.kafka.log_loader import LogLoader, apply_batch, rebuild_producer_state
from tidelog.storage.kafka.segment import SWAP_SUFFIX, LogSegment, now_ms

log = logging.getLogger("tidelog.storage")

PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
DEFAULT_LEADER_EPOCH = 0


@dataclass(slots=True)
class _AppendedBatch:
    """One batch of an append: where it lies in the input, its header, and the maxTimestamp it is stored with
    under CreateTime (its records' largest timestamp once they were checked)."""

    position: int
    header: BatchHeader
    max_timestamp: int
    check_on_worker: bool = False  # a large batch: CRC and records checked on the worker while it is written
    from_client: bool = True
    pending: PendingCheck | None = None  # that check, once started (_start_checks)


class ProducerLastRecord(NamedTuple):
    """What the log cleaner keeps of a producer (Kafka's LastRecord): the last offset of its last data batch (None
    when it has none at its current epoch, its last entry a marker) and its epoch."""

    last_data_offset: int | None
    epoch: int


@dataclass(frozen=True, slots=True)
class _Clip:
    """Where reads below an offset (the high watermark, the last stable offset) stop: the start of the batch holding
    `offset` in `segment`."""

    offset: int
    segment: LogSegment
    position: int


class _MaxTimestampDiffers(Exception):
    """A large batch's check found another largest record timestamp than its header claims, after the batch was
    written as it came: the write is undone and made again with the corrected header."""


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


class PartitionLog(Partition):
    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        topic_id: str,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        had_clean_shutdown: bool = True,
        scheduler: Scheduler | None = None,
        check_worker: BatchCheckWorker | None = None,
        clock: Callable[[], int] = now_ms,
        replicated: bool = False,
        high_watermark: int | None = None,
        handles: FileHandles | None = None,
        index_blocks: IndexBlockCache | None = None,
        index_tails: IndexTails | None = None,
    ) -> None:
        """Open (load, recovering if need be) the partition in `directory`, creating it if missing. Large batches
        are checked on `check_worker` (the engine's) while they are written; without one, before, like the
        others. `replicated`: the broker moves the high watermark, which starts at `high_watermark` (the
        checkpointed one; None: the log start) kept within [log start, log end]. `handles`: the engine's open segment
        files, which bound how many of them stay open (file_handles.py); `index_blocks`: the engine's cache of the
        index blocks lookups read (index_block_cache.py)."""
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.config = config
        self.scheduler = scheduler
        self.check_worker = check_worker
        self.clock = clock
        self.handles = handles
        self.index_blocks = index_blocks
        self.index_tails = index_tails
        self.leader_epoch = DEFAULT_LEADER_EPOCH
        self._lock = threading.RLock()  # state: segments, offsets
        self._flush_lock = threading.Lock()  # fsync and file close never overlap
        self._closed = False
        self._deleted = False  # closed because its topic was deleted: readers are told the partition is gone
        self.last_flush_ms = clock()
        self._new_files = True  # directory entries not yet known durable
        loader = LogLoader(
            directory,
            self.name,
            topic_id,
            config,
            scheduler=scheduler,
            clock=clock,
            handles=handles,
            index_blocks=index_blocks,
            index_tails=index_tails,
        )
        loaded = loader.load(recovery_point, log_start_offset, had_clean_shutdown)
        self.segments = loaded.segments
        self._bases = [segment.base_offset for segment in self.segments]
        self.log_start_offset = loaded.log_start_offset
        self.recovery_point = loaded.recovery_point
        self.log_end_offset = loaded.log_end_offset
        self.replicated = replicated
        self.high_watermark = self.log_end_offset
        if replicated:
            start = self.log_start_offset if high_watermark is None else high_watermark
            self.high_watermark = min(max(start, self.log_start_offset), self.log_end_offset)
        # where reads below the high watermark and the last stable offset stop (when below the end), newest last
        self._clips: dict[int, _Clip] = {}
        self.producer_state = loaded.producer_state
        self.leader_epoch_cache = loaded.leader_epoch_cache
        # Called with the new log end after a truncation, outside the lock (the engine's key index follows the log).
        self.truncation_listeners: list[Callable[[int], None]] = []

    # --- segments ---------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return partition_dir_name(self.topic, self.partition)

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    def _new_segment(self, base_offset: int) -> LogSegment:
        """An empty segment at `base_offset`, its files among the engine's open ones, its index blocks cached."""
        return LogSegment(
            self.directory,
            base_offset,
            self.config,
            now_ms=self.clock(),
            handles=self.handles,
            index_blocks=self.index_blocks,
            index_tails=self.index_tails,
        )

    def _add_segment(self, segment: LogSegment) -> None:
        self.segments.append(segment)
        self._bases.append(segment.base_offset)

    def _segment_slot(self, offset: int) -> int:
        """Slot of the segment that holds `offset` (the last with base <= offset), at least 0."""
        return max(0, bisect.bisect_right(self._bases, offset) - 1)

    @property
    def flushed_offset(self) -> int:
        return self.recovery_point

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def update_config(self, config: LogConfig) -> None:
        """New settings (the topic's overrides changed): the segments roll and retain by them from now on (indexes
        already allocated keep their size)."""
        with self._lock:
            self.config = config
            for segment in self.segments:
                segment.config = config

    def _check_open(self) -> None:
        if self._closed:
            if self._deleted:
                raise UnknownTopicOrPartitionError(f"{self.name} was deleted")
            raise LogClosedError(f"{self.name} is closed")

    def roll(self, expected_next_offset: int = 0) -> LogSegment:
        with self._lock:
            self._check_open()
            new_base = max(expected_next_offset, self.log_end_offset)
            active = self.active_segment
            if active.base_offset == new_base and active.size == 0:
                return active
            active.on_become_inactive()
            try:  # fsynced by the flush of the rolled segment, off the appending thread (as Kafka's roll)
                self.producer_state.take_snapshot(new_base, sync=False)
            except OSError as exc:  # an optimisation only: recovery replays the log instead
                log.warning("%s: cannot write the producer snapshot at %d: %s", self.name, new_base, exc.strerror)
            segment = self._new_segment(new_base)
            self._add_segment(segment)
            self._new_files = True
            log.debug("%s: rolled new segment at offset %d", self.name, new_base)
        self._after_roll(new_base)
        return segment

    def _after_roll(self, new_base: int) -> None:
        """The rolled segment is flushed in the background (synchronously without a scheduler), as Kafka does."""
        if self.scheduler is not None:
            self.scheduler.schedule(f"flush {self.name} to {new_base}", lambda: self.flush(new_base))
        else:
            self.flush(new_base)

    # --- append -----------------------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview, *, from_client: bool = True) -> AppendResult:
        """Validate and append one or more v2 batches as received; returns the offsets they got.

        Any I/O failure (a full disk, a vanished directory) is a KafkaStorageError naming the partition;
        the log is left as it was before the call."""
        try:
            return self._append(data, from_client)
        except OSError as exc:
            raise KafkaStorageError(f"{self.name}: cannot append: {exc.strerror or exc}") from exc

    def _append(self, data: bytes | bytearray | memoryview, from_client: bool) -> AppendResult:
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        batches = self._validate(view, from_client)
        if from_client and self._needs_recompression(batches):
            view = memoryview(self._recompress(view, batches))
            batches = self._validate(view, from_client)
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        with self._lock:
            self._check_open()
            now = self.clock()
            first = batches[0].header
            if from_client and first.producer_id >= 0:
                duplicate = self.producer_state.check(first)
                if duplicate is not None:  # a retry of a batch already in the log: answer with its offsets
                    self._start_checks(view, batches)
                    self._finish_checks(batches, log_append_time)  # once it proved as valid as the first time
                    return AppendResult(
                        duplicate.first_offset, duplicate.last_offset, first.records_count, -1, self.log_start_offset, 0
                    )
            try:
                return self._write(view, batches, now, log_append_time)
            except _MaxTimestampDiffers:  # nothing was kept; the batches now carry their records' true maxima
                return self._write(view, batches, now, log_append_time)

    def _write(self, view: memoryview, batches: list[_AppendedBatch], now: int, log_append_time: bool) -> AppendResult:
        base_offset = self.log_end_offset
        total_size = count = record_count = 0
        for batch in batches:
            total_size += batch.header.size_in_bytes
            count += batch.header.last_offset_delta + 1
            record_count += batch.header.records_count
        last_offset = base_offset + count - 1
        if log_append_time:
            max_timestamp, offset_of_max = now, last_offset
        else:
            max_timestamp, offset_of_max = -1, base_offset
            next_offset = base_offset
            for batch in batches:
                if batch.max_timestamp > max_timestamp:
                    max_timestamp, offset_of_max = batch.max_timestamp, next_offset + batch.header.last_offset_delta
                next_offset += batch.header.last_offset_delta + 1
        first_batch_timestamp = now if log_append_time else batches[0].max_timestamp

        if self.active_segment.should_roll(total_size, max_timestamp, last_offset, now):
            self.roll(base_offset)

        chunks: list[bytes | memoryview] = []
        next_offset = base_offset
        for batch in batches:
            position, header = batch.position, batch.header
            size = header.size_in_bytes
            if log_append_time or batch.max_timestamp != header.max_timestamp:
                rewritten = bytearray(view[position : position + size])
                _INT64.pack_into(rewritten, 0, next_offset)
                _INT32.pack_into(rewritten, 12, self.leader_epoch)
                if log_append_time:
                    set_log_append_time(rewritten, 0, size, now)
                else:
                    set_max_timestamp(rewritten, 0, size, batch.max_timestamp)
                chunks.append(bytes(rewritten))
            else:
                chunks += (
                    _INT64.pack(next_offset),
                    view[position + 8 : position + 12],
                    _INT32.pack(self.leader_epoch),
                    view[position + 16 : position + size],
                )
            next_offset += header.last_offset_delta + 1

        def verify() -> None:
            if self._finish_checks(batches, log_append_time):
                raise _MaxTimestampDiffers

        segment = self.active_segment
        checked_while_written = self._start_checks(view, batches)
        segment.append(
            chunks,
            total_size,
            last_offset,
            max_timestamp,
            offset_of_max,
            first_batch_timestamp,
            verify=verify if checked_while_written else None,
        )
        self._advance_log_end(last_offset + 1)
        next_offset = base_offset
        for batch in batches:
            if batch.header.producer_id >= 0:  # the producer state knows only producers' batches (apply_batch)
                stored = batch.header._replace(
                    base_offset=next_offset, max_timestamp=now if log_append_time else batch.max_timestamp
                )
                apply_batch(self.producer_state, stored, view, batch.position, segment.txn_index)
            next_offset += batch.header.last_offset_delta + 1
        self.leader_epoch_cache.assign(self.leader_epoch, base_offset)
        return AppendResult(
            base_offset=base_offset,
            last_offset=last_offset,
            record_count=record_count,
            log_append_time_ms=now if log_append_time else -1,
            log_start_offset=self.log_start_offset,
            size_in_bytes=total_size,
        )

    def _advance_log_end(self, end: int) -> None:
        """Under the lock, after a write: the log ends at `end`; outside a cluster the high watermark follows."""
        self.log_end_offset = end
        if not self.replicated:
            self.high_watermark = end

    def flush_due(self) -> bool:
        """Has `flush.messages` worth of records been appended since the last flush? (The caller flushes.)"""
        return self.log_end_offset - self.recovery_point >= self.config.flush_messages

    def _validate(self, view: memoryview, from_client: bool) -> list[_AppendedBatch]:
        """The batches in `view`, checked: header, CRC, and for a producer's batch every record (Kafka's
        LogValidator; CorruptRecordError when one does not decode). Large batches are checked on the worker
        thread while they are written (`_finish_checks`), if there is one; the others here."""
        batches: list[_AppendedBatch] = []
        position = 0
        while position < len(view):
            header = read_header(view, position)
            if not self._checked_on_worker(header):
                check_crc(header, compute_crc(view, position, header.size_in_bytes), position)
            check_header_fields(header, position)
            if from_client:
                check_producer_batch(header)
            if header.size_in_bytes > self.config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch of {header.size_in_bytes} bytes exceeds max.message.bytes "
                    f"({self.config.max_message_bytes}) of {self.name}"
                )
            bounds = self.config.timestamp_bounds(self.clock()) if from_client else None
            if bounds is not None:
                check_timestamps_within(view, position, header, *bounds)
            batches.append(_AppendedBatch(position, header, header.max_timestamp))
            position += header.size_in_bytes
        if not batches:
            raise InvalidRecordError("an append needs at least one record batch")
        if from_client and len(batches) > 1:
            raise InvalidRecordError(f"a producer must send exactly one batch per partition, got {len(batches)}")
        for batch in batches:
            if self._checked_on_worker(batch.header):
                batch.check_on_worker, batch.from_client = True, from_client
            elif from_client:
                self._take_check(batch, check_batch_records(view, batch.position, batch.header))
        return batches

    def _needs_recompression(self, batches: list[_AppendedBatch]) -> bool:
        """Does compression.type name a codec some batch is not in? (`producer` keeps the producer's.)"""
        target = self.config.compression_type
        if target == "producer":
            return False
        codec = Compression.NONE if target == "uncompressed" else Compression.from_name(target)
        return any(batch.header.compression is not codec for batch in batches)

    def _recompress(self, view: memoryview, batches: list[_AppendedBatch]) -> bytes:
        """The batches with their records in the topic's codec (Kafka's LogValidator with a compression.type
        other than the producer's): the CRC of each checked first, so that damaged bytes are refused, not
        rewritten with a valid CRC."""
        config = self.config
        codec = (
            Compression.NONE
            if config.compression_type == "uncompressed"
            else Compression.from_name(config.compression_type)
        )
        level = {
            Compression.GZIP: config.compression_gzip_level,
            Compression.LZ4: config.compression_lz4_level,
            Compression.ZSTD: config.compression_zstd_level,
        }.get(codec)
        out = []
        for batch in batches:
            header = batch.header
            check_crc(header, compute_crc(view, batch.position, header.size_in_bytes), batch.position)
            if header.compression is codec:
                out.append(bytes(view[batch.position : batch.position + header.size_in_bytes]))
            else:
                out.append(recompress_batch(view, batch.position, header, codec, level))
        return b"".join(out)

    def _checked_on_worker(self, header: BatchHeader) -> bool:
        return header.size_in_bytes >= CRC_IN_PARALLEL_BYTES and self.check_worker is not None

    def _start_checks(self, view: memoryview, batches: list[_AppendedBatch]) -> bool:
        """Hand the large batches' checks to the worker. Called just before the write: then the worker wakes while
        the appending thread is already in the write, without the GIL (woken earlier, it would wait for the GIL,
        and the appending thread would pay for waking it a second time when it lets the GIL go for the write).
        True when it started any."""
        started = False
        for batch in batches:
            if batch.check_on_worker:
                assert self.check_worker is not None  # _validate leaves a batch to the worker only if there is one
                batch.check_on_worker, started = False, True
                batch.pending = self.check_worker.submit(view, batch.position, batch.header, batch.from_client)
        return started

    def _take_check(self, batch: _AppendedBatch, check: RecordsCheck) -> None:
        """A compacted topic keeps the latest record per key: a record without a key is refused (as Kafka's
        LogValidator). Otherwise the batch is stored with its records' largest timestamp."""
        if check.keyless and self.config.compact:
            raise InvalidRecordError(
                f"Compacted topic cannot accept message without key in topic partition {self.name} "
                f"({check.keyless} of {batch.header.records_count} records have no key)"
            )
        batch.max_timestamp = check.max_timestamp

    def _finish_checks(self, batches: list[_AppendedBatch], log_append_time: bool) -> bool:
        """Wait for the large batches' checks (raising what they found); True when one found a largest record
        timestamp other than the header's (CreateTime), now recorded in its _AppendedBatch."""
        differs = False
        for batch in batches:
            if batch.pending is None:
                continue
            check = batch.pending.result()
            batch.pending = None
            claimed = batch.max_timestamp
            self._take_check(batch, check)
            differs |= not log_append_time and batch.max_timestamp != claimed
        return differs

    # --- replication ------------------------------------------------------------------------------------------

    def append_replica(self, data: bytes | bytearray | memoryview) -> AppendResult:
        """Append a leader's batches exactly as its log holds them (Kafka's appendAsFollower): baseOffset,
        partitionLeaderEpoch, timestamps and every other byte kept, so this log's files are the leader's.

        Each batch is checked as a stored one (layout, header fields, CRC-32C; its records were the leader's to
        check, and its size too: a follower takes what the leader took). The first must start at the log end and
        each next one right after the one before; on a compacted topic a batch may start further on (the cleaner
        removes whole batches from the leader's log, leaving gaps), never before. Else UnexpectedAppendOffsetError;
        any refusal leaves the log unchanged. Each batch is written on its own and rolls the segment as a client
        append of it would, so the segments split where the leader's do. The leader-epoch cache gets each batch's
        epoch and the producer state each batch (a follower made leader recognises a producer's retry); the high
        watermark of a replicated log does not move. An I/O failure is a KafkaStorageError; the batches written
        before it stay, the log consistent up to them."""
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        batches = self._replica_batches(view)
        try:
            with self._lock:
                self._check_open()
                self._check_replica_offsets(batches)
                now = self.clock()
                for position, header in batches:
                    size, last_offset = header.size_in_bytes, header.last_offset
                    if self.active_segment.should_roll(size, header.max_timestamp, last_offset, now):
                        self.roll(header.base_offset)
                    self.active_segment.append(
                        (view[position : position + size],),
                        size,
                        last_offset,
                        header.max_timestamp,
                        last_offset,
                        header.max_timestamp,
                    )
                    self._advance_log_end(last_offset + 1)
                    apply_batch(self.producer_state, header, view, position, self.active_segment.txn_index)
                    if header.partition_leader_epoch >= 0:
                        self.leader_epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
                log_start_offset = self.log_start_offset
        except OSError as exc:
            raise KafkaStorageError(f"{self.name}: cannot append a replica's batches: {exc.strerror or exc}") from exc
        first, last = batches[0][1], batches[-1][1]
        return AppendResult(
            base_offset=first.base_offset,
            last_offset=last.last_offset,
            record_count=sum(header.records_count for _, header in batches),
            log_append_time_ms=-1,
            log_start_offset=log_start_offset,
            size_in_bytes=len(view),
        )

    def _replica_batches(self, view: memoryview) -> list[tuple[int, BatchHeader]]:
        """(position, header) of every batch in `view`, each checked as a stored batch (CRC inline, whatever its
        size)."""
        batches: list[tuple[int, BatchHeader]] = []
        position = 0
        while position < len(view):
            header = read_header(view, position)
            check_crc(header, compute_crc(view, position, header.size_in_bytes), position)
            check_header_fields(header, position)
            if header.last_offset_delta < 0:
                raise InvalidRecordError(
                    f"batch at byte {position} declares lastOffsetDelta {header.last_offset_delta}, below 0"
                )
            batches.append((position, header))
            position += header.size_in_bytes
        if not batches:
            raise InvalidRecordError("an append needs at least one record batch")
        return batches

    def _check_replica_offsets(self, batches: list[tuple[int, BatchHeader]]) -> None:
        """Under the lock: the batches continue the log (see append_replica)."""
        expected = self.log_end_offset
        for slot, (position, header) in enumerate(batches):
            base = header.base_offset
            if base < expected or (base > expected and not self.config.compact):
                after = f"the log end of {self.name}" if slot == 0 else "the offset after the batch before it"
                raise UnexpectedAppendOffsetError(
                    f"a replica's batch at byte {position} starts at offset {base}, but {after} is {expected}"
                    + ("" if base < expected else " (only a compacted topic's log has gaps)")
                )
            expected = header.last_offset + 1

    def set_high_watermark(self, offset: int) -> None:
        """Raise the high watermark to min(offset, log end). Lower values are ignored: only a truncation below it
        lowers it. Outside a cluster it is the log end already, so nothing changes."""
        with self._lock:
            self._check_open()
            self.high_watermark = max(self.high_watermark, min(offset, self.log_end_offset))

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        with self._lock:
            self._check_open()
            return self.leader_epoch_cache.end_offset_for(epoch, self.log_end_offset)

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    # --- reads ------------------------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        min_one_message: bool = True,
        up_to_log_end: bool = False,
        max_offset: int | None = None,
    ) -> FileSlices:
        """Whole batches from the one holding `offset`, the last possibly cut short by `max_bytes` (min_one_message:
        the first whole whatever its size). They stop before the batch holding the high watermark, or with
        `up_to_log_end` (a follower's fetch) at the log end; with `max_offset` (a read_committed fetch: the last
        stable offset) before the batch holding it too, if that is lower."""
        with self._lock:
            self._check_open()
            if offset < self.log_start_offset or offset > self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is outside {self.name}'s range [{self.log_start_offset}, {self.log_end_offset}]"
                )
            slices: list[FileSlice] = []
            remaining = max_bytes
            end = self.log_end_offset if up_to_log_end else self.high_watermark
            if max_offset is not None:
                end = min(end, max_offset)
            if offset < end:
                clip = self._clip(end) if end < self.log_end_offset else None
                segments = self.segments
                first = bisect.bisect_right(self._bases, offset) - 1  # _segment_slot, inlined: this runs per read
                for slot in range(first if first > 0 else 0, len(segments)):
                    segment = segments[slot]
                    start = offset if offset > segment.base_offset else segment.base_offset
                    stop = clip.position if clip is not None and segment is clip.segment else None
                    piece = segment.read(start, remaining, stop, min_one_message=min_one_message and not slices)
                    if piece is not None:
                        slices.append(piece)
                        remaining -= piece.length
                    if remaining <= 0 or stop is not None:
                        break
            return FileSlices(tuple(slices), self.log_start_offset, self.high_watermark)

    def _clip(self, offset: int) -> _Clip | None:
        """Under the lock, `offset` below the log end: the start of the batch holding it, looked up once per offset
        (appends only add bytes after it; truncations and segment replacements forget it). The two latest are kept:
        the high watermark's and the last stable offset's."""
        clip = self._clips.get(offset)
        if clip is not None:
            return clip
        for segment in self.segments[self._segment_slot(offset) :]:
            location = segment.translate_offset(offset)
            if location is not None:
                if len(self._clips) >= 2:
                    del self._clips[next(iter(self._clips))]
                clip = self._clips[offset] = _Clip(offset, segment, location.position)
                return clip
        return None

    # --- transactions -----------------------------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """min(first unstable offset, high watermark), the first unstable offset raised to the log start (a
        transaction whose start was deleted by retention or DeleteRecords), as Kafka's UnifiedLog keeps it."""
        with self._lock:
            first = self.producer_state.first_unstable_offset(self.high_watermark)
            if first is None:
                return self.high_watermark
            return min(max(first, self.log_start_offset), self.high_watermark)

    def append_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool
    ) -> AppendResult:
        """Write the COMMIT or ABORT marker at the log end, as Kafka's leader writes a WriteTxnMarkers entry (the
        batch built by control_record.py, stamped with the leader epoch and now); `append` applies it to the
        producer state and the transaction index. The epoch checks run under the same lock as the write."""
        control_type = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
        with self._lock:
            self._check_open()
            self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
            batch = build_control_batch(
                control_type,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                coordinator_epoch=coordinator_epoch,
                timestamp_ms=self.clock(),
                partition_leader_epoch=self.leader_epoch,
            )
            return self.append(batch, from_client=False)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTransaction]:
        """Kafka's collectAbortedTransactions: the transaction indexes from the segment holding `start_offset` on,
        until one says no later segment can add to the answer."""
        found: list[AbortedTransaction] = []
        with self._lock:
            self._check_open()
            for segment in self.segments[self._segment_slot(start_offset) :]:
                search = segment.txn_index.collect(start_offset, end_offset)
                found += (AbortedTransaction(txn.producer_id, txn.first_offset) for txn in search.aborted)
                if search.complete:
                    break
        return found

    def active_producers(self) -> list[ProducerSummary]:
        with self._lock:
            return self.producer_state.summaries()

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampAndOffset | None:
        with self._lock:
            self._check_open()
            epoch_for = self.leader_epoch_cache.epoch_for_offset
            if timestamp_ms == EARLIEST_TIMESTAMP:
                return TimestampAndOffset(-1, self.log_start_offset, epoch_for(self.log_start_offset))
            if timestamp_ms == LATEST_TIMESTAMP:  # what a consumer may read up to (Kafka's ListOffsets)
                return TimestampAndOffset(-1, self.high_watermark, epoch_for(self.high_watermark))
            if timestamp_ms == MAX_TIMESTAMP:
                with_timestamps = [s for s in self.segments if s.max_timestamp_so_far.timestamp >= 0]
                if not with_timestamps:
                    return None
                latest = max(with_timestamps, key=lambda s: s.max_timestamp_so_far.timestamp)  # first of equals
                found = latest.read_max_timestamp_record()
            elif timestamp_ms < 0:
                raise OffsetOutOfRangeError(f"{timestamp_ms} is neither a timestamp nor a special ListOffsets target")
            else:
                found = None
                for segment in self.segments:
                    if segment.largest_timestamp >= timestamp_ms:
                        found = segment.find_offset_by_timestamp(timestamp_ms, self.log_start_offset)
                        if found is not None:
                            break
            if found is None or found.offset >= self.high_watermark:  # not readable yet: none (as Kafka answers)
                return None
            return TimestampAndOffset(found.timestamp, found.offset, epoch_for(found.offset))

    # --- durability -------------------------------------------------------------------------------------------

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync segments holding offsets below `up_to_offset` (default: log end); advance the recovery point.

        First the producer snapshots that rolls wrote at or below the target (recovery replays from the newest
        snapshot, so one must be durable before the recovery point passes its roll) and a changed leader-epoch
        checkpoint (a crash rescans only from the recovery point, so the epochs of the offsets below it must be
        in the file)."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
                target = self.log_end_offset if up_to_offset is None else min(up_to_offset, self.log_end_offset)
                snapshots = self.producer_state.unsynced_snapshots(target)
                if target <= self.recovery_point and not snapshots and not self.leader_epoch_cache.unwritten:
                    return
                first = self._segment_slot(self.recovery_point)
                dirty = (
                    [s for s in self.segments[first:] if s.base_offset < target] if target > self.recovery_point else []
                )
                active = self.active_segment
                new_files, self._new_files = self._new_files, False
            try:
                for _offset, path in snapshots:
                    fsync_file(path)
                self.leader_epoch_cache.write_checkpoint()
                for segment in dirty:
                    # The segment holding the recovery point is always rescanned after a crash, indexes included,
                    # so the active segment's indexes need no msync here; rolled segments' indexes do.
                    segment.flush(indexes=segment is not active)
                if new_files:  # a segment or snapshot was created since the last flush: make its entry durable
                    fsync_directory(self.directory)
            except BaseException:
                with self._lock:  # nothing was promised: the next flush does it all again
                    self._new_files |= new_files
                raise
            with self._lock:
                self.producer_state.mark_synced(offset for offset, _path in snapshots)
                self.recovery_point = max(self.recovery_point, target)
                self.last_flush_ms = self.clock()

    def has_unflushed(self) -> bool:
        """Would `flush()` have work: records past the recovery point, producer snapshots or leader epochs not yet
        durable? (Read without the lock: the engine skips the logs that answer no before it starts its threads.)"""
        return (
            self.log_end_offset > self.recovery_point
            or bool(self.producer_state.unsynced)
            or self.leader_epoch_cache.unwritten
        )

    def flush_if_due(self, now: int) -> None:
        """Time-based flush (`flush.ms`), called by the log manager's periodic task."""
        if now - self.last_flush_ms >= self.config.flush_ms and self.log_end_offset > self.recovery_point:
            self.flush()

    # --- retention --------------------------------------------------------------------------------------------

    def delete_old_segments(self) -> int:
        """Apply log-start-offset, retention.bytes and retention.ms; returns the number of segments deleted."""
        deleted = self._delete_segments_while(self._start_offset_breached, "log start offset")
        if "delete" in self.config.cleanup_policy:
            deleted += self._delete_segments_while(self._size_breached(), "retention.bytes")
            deleted += self._delete_segments_while(self._time_breached(self.clock()), "retention.ms")
        return deleted

    def _start_offset_breached(self, segment: LogSegment, next_segment: LogSegment | None) -> bool:
        return next_segment is not None and next_segment.base_offset <= self.log_start_offset

    def _size_breached(self) -> Callable[[LogSegment, LogSegment | None], bool]:
        limit = self.config.retention_bytes
        excess = [self.size_in_bytes - limit]

        def breached(segment: LogSegment, _next: LogSegment | None) -> bool:
            if limit < 0 or excess[0] - segment.size < 0:
                return False
            excess[0] -= segment.size
            return True

        return breached

    def _time_breached(self, now: int) -> Callable[[LogSegment, LogSegment | None], bool]:
        limit = self.config.retention_ms

        def breached(segment: LogSegment, _next: LogSegment | None) -> bool:
            return limit >= 0 and now - segment.largest_timestamp > limit

        return breached

    def _delete_segments_while(self, predicate: Callable[[LogSegment, LogSegment | None], bool], reason: str) -> int:
        with self._lock:
            if self._closed:
                return 0
            doomed: list[LogSegment] = []
            for slot, segment in enumerate(self.segments):
                next_segment = self.segments[slot + 1] if slot + 1 < len(self.segments) else None
                upper = next_segment.base_offset if next_segment else self.log_end_offset
                if self.high_watermark < upper or (next_segment is None and segment.size == 0):
                    break
                if not predicate(segment, next_segment):
                    break
                doomed.append(segment)
            if not doomed:
                return 0
            if len(doomed) == len(self.segments):
                self.roll()  # never delete the active segment: give the log a new, empty one first
            del self.segments[: len(doomed)]
            del self._bases[: len(doomed)]
            self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
            self.recovery_point = max(self.recovery_point, self.log_start_offset)
            self._cut_leader_epochs()
            for segment in doomed:
                segment.rename_to_deleted()
            log.info(
                "%s: deleting %d segment(s) (%s); log start is now %d",
                self.name,
                len(doomed),
                reason,
                self.log_start_offset,
            )
        self._schedule_file_deletion(doomed)
        return len(doomed)

    def _schedule_file_deletion(self, doomed: list[LogSegment]) -> None:
        def delete_files() -> None:
            with self._flush_lock:
                for segment in doomed:
                    segment.delete_files()

        delay = self.config.file_delete_delay_ms
        if self.scheduler is not None and delay > 0:
            self.scheduler.schedule(f"delete segments of {self.name}", delete_files, delay)
        else:
            delete_files()

    def _cut_leader_epochs(self) -> None:
        """Under the lock, after the log start moved: cut the leader epochs to [log start, log end), as loading
        does. An entry moved up to a log start equal to the log end is dropped by the next cut."""
        self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
        self.leader_epoch_cache.truncate_from_start(self.log_start_offset)

    # --- truncation (a follower cutting back to its leader's log) -----------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch from the one holding `offset` on (Kafka's UnifiedLog.truncateTo): segments whose base
        is above it go (renamed `.deleted` now, their files removed file.delete.delay.ms later, as retention does,
        so a reader holding a slice of one keeps reading it); the segment holding it is cut at that batch, indexes
        too, and becomes the active one. The log end is then where the remaining batches end (the batch holding a
        mid-batch `offset` goes whole); the high watermark and the recovery point come down to it, the leader
        epochs from it on go, the producer state is rebuilt from the newest snapshot at or below it (later
        snapshots are deleted) and the batches after that, and the truncation listeners are told. An `offset` at or
        past the log end changes nothing; one below the first segment starts the log over there
        (truncate_fully_and_start_at).

        Durable before it returns: the cut `.log` and indexes are fsynced, the renames and snapshot deletions made
        durable (directory fsync) and the leader-epoch checkpoint rewritten, so a crash cannot bring truncated
        batches back, however far the recovery-point checkpoint on disk still reaches (loading takes
        min(recovery point, log end)). A slice of the cut segment handed out before, reaching past the cut, reads
        short."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate {self.name} to the negative offset {offset}")
        with self._flush_lock, self._lock:  # a flush in progress cannot move the recovery point past the new end
            self._check_open()
            if offset >= self.log_end_offset:
                return
            below_every_segment = offset < self.segments[0].base_offset
            doomed = self._start_over_at(offset) if below_every_segment else self._cut_at(offset)
            end = self.log_end_offset
            log.info("%s: truncated to offset %d; the log ends at %d", self.name, offset, end)
        self._after_truncation(doomed, end)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Remove every segment and start empty at `offset` (Kafka's truncateFullyAndStartAt: the leader's log
        starts past this replica's end): log start = log end = high watermark = recovery point = `offset`, no
        leader epochs, no producers, no snapshots. Durable before it returns, as truncate_to."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot start {self.name} at the negative offset {offset}")
        with self._flush_lock, self._lock:
            self._check_open()
            doomed = self._start_over_at(offset)
            log.info("%s: truncated fully; the log starts at %d", self.name, offset)
        self._after_truncation(doomed, offset)

    def _cut_at(self, offset: int) -> list[LogSegment]:
        """Under both locks: truncate_to's work for an `offset` within the log; returns the segments to delete."""
        slot = self._segment_slot(offset)
        doomed = self.segments[slot + 1 :]
        for segment in doomed:
            segment.rename_to_deleted()
        del self.segments[slot + 1 :]
        del self._bases[slot + 1 :]
        kept = self.segments[slot]
        kept.truncate_to(offset)
        if doomed:
            kept.become_active()  # its indexes were trimmed when it rolled
        self.log_end_offset = kept.end_offset()
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self._clips.clear()
        self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
        rebuild_producer_state(self.producer_state, self.segments, self.log_start_offset, self.log_end_offset)
        kept.flush()
        self._make_truncation_durable()
        return doomed

    def _start_over_at(self, offset: int) -> list[LogSegment]:
        """Under both locks: replace every segment by an empty one at `offset`; returns the segments to delete."""
        doomed = list(self.segments)
        for segment in doomed:
            segment.rename_to_deleted()  # first: the new segment may take the name of one of them
        self.segments = [self._new_segment(offset)]
        self._bases = [offset]
        self.log_start_offset = self.log_end_offset = self.high_watermark = self.recovery_point = offset
        self._clips.clear()
        self.leader_epoch_cache.clear()
        self.producer_state.truncate_fully()
        self._make_truncation_durable()
        return doomed

    def _make_truncation_durable(self) -> None:
        self.leader_epoch_cache.write_checkpoint()
        fsync_directory(self.directory)

    def _after_truncation(self, doomed: list[LogSegment], end: int) -> None:
        """Outside the locks: delete the removed segments' files (later) and tell the listeners."""
        if doomed:
            self._schedule_file_deletion(doomed)
        for listener in self.truncation_listeners:
            listener(end)

    # --- compaction (the log cleaner's side of the log: storage/kafka/cleaner.py) --------------------------------

    def cleaning_view(self) -> tuple[list[LogSegment], int, int]:
        """A consistent copy of (segments, log start offset, high watermark) for the cleaner to plan a pass."""
        with self._lock:
            return list(self.segments), self.log_start_offset, self.high_watermark

    def producer_last_records(self) -> dict[int, ProducerLastRecord]:
        """Producer id -> its last data offset and epoch, for every producer the log tracks (RETAIN_EMPTY)."""
        with self._lock:
            return {
                pid: ProducerLastRecord(entry.batches[-1].last_offset if entry.batches else None, entry.epoch)
                for pid, entry in self.producer_state.producers.items()
            }

    def replace_segments(self, old: list[LogSegment], new: LogSegment) -> bool:
        """Swap the cleaner's `new` segment (written as `.cleaned`, flushed) in for the consecutive `old` ones,
        crash-safely (Kafka's LocalLog.replaceSegments): `.cleaned` -> `.swap`, directory fsync; old files ->
        `.deleted`; `.swap` -> final names, directory fsync. Loading finishes or undoes a swap a crash interrupted.
        Readers holding slices of the old segments keep their open files until the delayed deletion.
        Returns False (and deletes `new`) when the log changed meanwhile (retention, closing)."""
        with self._lock:
            slot = next((i for i, s in enumerate(self.segments) if s is old[0]), None)
            unchanged = slot is not None and self.segments[slot : slot + len(old)] == old
            if self._closed or slot is None or not unchanged or old[-1] is self.active_segment:
                new.delete_files()
                return False
            new.change_file_suffix(SWAP_SUFFIX)
            fsync_directory(self.directory)
            for segment in old:
                segment.rename_to_deleted()
            new.change_file_suffix("")
            fsync_directory(self.directory)
            self.segments[slot : slot + len(old)] = [new]
            self._bases = [s.base_offset for s in self.segments]
            self._clips.clear()
        self._schedule_file_deletion(old)
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def delete_records(self, before_offset: int) -> int:
        """Move the log start offset up to `before_offset` (DeleteRecords); whole segments below it go."""
        with self._lock:
            self._check_open()
            if before_offset > self.high_watermark or before_offset < 0:
                raise OffsetOutOfRangeError(
                    f"cannot delete records before {before_offset}: "
                    f"{self.name}'s high watermark is {self.high_watermark}"
                )
            self.log_start_offset = max(self.log_start_offset, before_offset)
            self._cut_leader_epochs()
        self._delete_segments_while(self._start_offset_breached, "delete records")
        return self.log_start_offset

    # --- shutdown ---------------------------------------------------------------------------------------------

    def close(self, *, flush: bool = True) -> bool:
        """Flush (unless the log is being deleted), trim the indexes and close the files. Returns False when the
        flush failed (the files are closed all the same): then the next start must recover this log."""
        flushed = not flush
        if flush:
            try:
                self.flush()
                flushed = True
            except KafkaStorageError as exc:
                log.error("%s: %s", self.name, exc)
        with self._flush_lock, self._lock:
            if self._closed:
                return flushed
            self._closed = True
            self._deleted = not flush
            self.leader_epoch_cache.close()
            if flush and flushed:
                try:
                    self.producer_state.take_snapshot(self.log_end_offset)
                except OSError as exc:  # an optimisation only: the next start replays the log after an older one
                    log.warning("%s: cannot write the producer snapshot at close: %s", self.name, exc.strerror)
            for segment in self.segments:
                segment.close()
        return flushed
