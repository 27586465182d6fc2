"""One message queue of the RocketMQ engine as a Kafka partition: queue id = partition, queue offset = Kafka offset.

No file of its own: an append turns the Kafka batch into CommitLog messages a batch at a time
(codec/rocketmq_message.py's encode_records), puts them with one write, their QUEUEOFFSET, PHYSICALOFFSET and
STORETIMESTAMP set by one numpy scatter under the put lock, and offers the dispatcher their DispatchRequest columns;
a read turns ConsumeQueue units back into Kafka v2 batches built in memory. The contract is storage/api.py's
`Partition`:

- log end offset = the next queue offset to assign (RocketMQ's topicQueueTable); high watermark = the ConsumeQueue's
  end, i.e. what the dispatcher has made readable (under SYNC_FLUSH only flushed messages are dispatched);
- log start offset = the ConsumeQueue's minimum, raised by DeleteRecords (kept in `tidelog-log-start-offsets`);
- `flushed_offset` = the queue offset below which the CommitLog is on disk, `flush_due` says whether an acks=all
  producer must wait for a group commit (SYNC_FLUSH) or not (ASYNC_FLUSH);
- a retried idempotent batch is answered with its first offsets, as Kafka's ProducerStateManager does, however long
  ago it was stored; the state is snapshotted in Kafka's format (`<queue offset>.snapshot` in the engine's
  `tidelog-producer-snapshots/<topic>-<queue>/`) once PRODUCER_SNAPSHOT_UNITS offsets were appended since the last
  one (the engine's scheduler asks every second) and at a clean close, and rebuilt after a restart from the newest
  snapshot plus the `KAFKA_PRODUCER` property of the messages after it (from the log start when there is none);
- replication: the engine keeps one replica per queue. `append_replica`, `truncate_to` and
  `truncate_fully_and_start_at` raise ReplicationUnsupportedError (a replication factor above 1 needs the Kafka
  engine); `set_high_watermark` changes nothing (the high watermark stays the dispatched end), `read`'s
  `up_to_log_end` reads what it reads anyway (up to the dispatched end), and `end_offset_for_epoch` / `latest_epoch`
  answer as Kafka does for a log without leader epochs: (-1, -1) and -1. `EngineConfig.replicated` changes nothing;
- RocketMQ's own replication (the engine's brokerRole, ha_master.py / ha_client.py) is the CommitLog's: on a SLAVE
  every append is refused (NotLeaderOrFollowerError) and the queue's end follows what the dispatcher made of the
  master's messages; under SYNC_MASTER `wait_replicated` waits for a slave to hold the queue's messages;
- transactions (KIP-98): each message of a transactional batch has Kafka's transactional attribute bit in its FLAG
  (its SYSFLAG transaction type stays 0: RocketMQ would not dispatch a PREPARED or ROLLBACK message, and Kafka
  readers see an open transaction's records at once), the batch's last message names the producer
  (`KAFKA_PRODUCER`, also without a sequence); an end-transaction marker is the control batch's one record as a
  message with FLAG 0x30. Reads rebuild such batches with their producer and attribute bits. The producer state
  (open transactions) and `aborted_txns` (aborted.txnindex) give the last stable offset and the aborted list; a
  queue without that file never held a transaction (last stable offset = high watermark, nothing loaded). The state
  is loaded, and the file's entries after the snapshot derived again from the CommitLog, before the first use after
  a start;
- a time lookup has Kafka's meaning (the earliest offset whose record timestamp is at least the target, in whatever
  order timestamps come) through an in-memory summary: the largest timestamp of each block of offsets.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from tidelog.codec import rocketmq_message as rm
from tidelog.codec.control_record import (
    ControlRecordType,
    EndTransactionMarker,
    build_control_batch,
    parse_control_record,
    read_end_txn_marker,
)
from tidelog.codec.record_batch import (
    CONTROL_MASK,
    NO_SEQUENCE,
    BatchHeader,
    check_crc,
    check_header_fields,
    check_producer_batch,
    compute_crc,
    read_header,
)
from tidelog.codec.record_check import check_timestamps_within
from tidelog.codec.rocketmq_batches import TXN_ATTRIBUTES, CorruptMessageError, rebuild_batches
from tidelog.codec.rocketmq_columns import decode_batch
from tidelog.config import LogConfig
from tidelog.errors import (
    InvalidRecordError,
    KafkaStorageError,
    LogClosedError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    ReplicationUnsupportedError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.api import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    AbortedTransaction,
    AppendResult,
    FileSlices,
    MemorySlice,
    Partition,
    ProducerSummary,
    TimestampAndOffset,
)
from tidelog.storage.common.aborted_txn import AbortedTxn
from tidelog.storage.common.producer_state import CompletedTxn, ProducerStateManager
from tidelog.storage.rocketmq.aborted_txns import AbortedTxnFile
from tidelog.storage.rocketmq.consume_queue import ConsumeQueue
from tidelog.storage.rocketmq.dispatcher import DispatchBatch, QueueRun
from tidelog.storage.rocketmq.ha_protocol import SLAVE, SYNC_MASTER
from tidelog.storage.rocketmq.read_ahead import ReadKey, ReadResult

if TYPE_CHECKING:
    from tidelog.storage.rocketmq.engine import RocketMQEngine

# the bytes of a message set under the put lock: QUEUEOFFSET and PHYSICALOFFSET (20..36), STORETIMESTAMP (56..64)
_PATCHED_BYTES = np.concatenate(
    [np.arange(rm.QUEUE_OFFSET_POSITION, rm.QUEUE_OFFSET_POSITION + 16), np.arange(rm.STORE_TIMESTAMP_POSITION, 64)]
)
READ_UNITS = 1024  # ConsumeQueue units read per round of a scan (retention, producer state)
MAX_READ_UNITS = 32768  # at most this many ConsumeQueue units per round of a fetch, unless one batch has more
MIN_MESSAGE_BYTES = 128  # no stored message is smaller (header, topic, UNIQ_KEY): bounds the units a fetch reads
# A fetch reads the messages whose stored bytes may fill its budget: the budget times the stored bytes per byte of
# batch its queue's last read saw (a record takes fewer bytes in a batch than as a message: from nearly the same
# for large values to a third for small ones) times STORED_BYTES_MARGIN, 3 before a first read. Reading too few costs
# another round, too many a larger copy and decode of what is left out.
STORED_BYTES_MARGIN = 1.25
TIME_BLOCK_UNITS = 1024  # queue offsets per block of the time summary (offset_for_timestamp)
PRODUCER_SNAPSHOT_UNITS = 2048  # offsets appended since a queue's last producer snapshot before it takes another
BLANK_UNIT_SIZE = 0x7FFFFFFF
_FLAG_BYTES = np.arange(rm.FLAG_POSITION, rm.FLAG_POSITION + 4)
SEQUENCE_MODULUS = 1 << 31  # a producer's sequence wraps from Integer.MAX_VALUE to 0


class _Encoded:
    """A Kafka batch encoded as CommitLog messages, waiting for their offsets (patched in under the put lock);
    `marker` is the end-transaction marker of a control batch."""

    __slots__ = ("header", "kafka_bytes", "marker", "messages")

    def __init__(
        self,
        header: BatchHeader,
        messages: rm.EncodedMessages,
        kafka_bytes: int,
        marker: EndTransactionMarker | None = None,
    ) -> None:
        self.header = header
        self.messages = messages
        self.kafka_bytes = kafka_bytes
        self.marker = marker

    @property
    def count(self) -> int:
        return len(self.messages.starts)


class TimeBlocks:
    """The largest record timestamp of each block of TIME_BLOCK_UNITS queue offsets (block k holds [k*B, (k+1)*B)),
    in memory, from `first_block` on, covering the offsets below `end`. Built from the ConsumeQueue and the
    CommitLog the first time a queue is searched by time, then extended by what was dispatched since; a block's
    maximum may come from offsets below a log start that moved later (callers read that block exactly)."""

    def __init__(self) -> None:
        self.maxima = np.empty(0, dtype=np.int64)
        self.first_block = 0
        self.end = -1  # nothing covered yet

    def extend(self, queue: MessageQueue, start: int, end: int) -> np.ndarray:
        """Cover the offsets up to `end` (the queue's high watermark); returns the maxima."""
        if self.end < 0:
            self.first_block, self.end = start // TIME_BLOCK_UNITS, start
        while self.end < end:
            block = self.end // TIME_BLOCK_UNITS
            chunk_end = min(end, (block + 64) * TIME_BLOCK_UNITS)
            stamps = queue.born_timestamps(self.end, chunk_end)
            block_ids = np.arange(self.end, chunk_end) // TIME_BLOCK_UNITS - self.first_block
            count = int(block_ids[-1]) + 1
            if count > len(self.maxima):
                self.maxima = np.concatenate([self.maxima, np.full(count - len(self.maxima), -1, dtype=np.int64)])
            np.maximum.at(self.maxima, block_ids, stamps)
            self.end = chunk_end
        return self.maxima


def _join(parts: list[rm.EncodedMessages]) -> rm.EncodedMessages:
    """The messages of several batches of one append, back to back."""
    if len(parts) == 1:
        return parts[0]
    at = itertools.accumulate([0] + [len(part.data) for part in parts[:-1]])
    return rm.EncodedMessages(
        bytearray().join(part.data for part in parts),
        np.concatenate([part.starts + offset for part, offset in zip(parts, at, strict=True)]),
        np.concatenate([part.sizes for part in parts]),
        None if parts[0].keys is None else rm.IndexKeys.concatenate([part.keys for part in parts]),  # type: ignore[misc]
    )


class MessageQueue(Partition):
    def __init__(
        self,
        engine: RocketMQEngine,
        topic: str,
        queue_id: int,
        consume_queue: ConsumeQueue,
        config: LogConfig,
        *,
        start_floor: int = 0,
    ) -> None:
        self.engine = engine
        self.topic = topic
        self.queue_id = queue_id
        self.consume_queue = consume_queue
        self.config = config
        self.next_offset = consume_queue.max_offset
        self.start_floor = start_floor
        self._stored_per_kafka_byte = 3.0  # see STORED_BYTES_MARGIN
        self.read_generation = 0  # moves when records change other than by an append (read_ahead.py)
        self.producer_state = ProducerStateManager(engine.producer_snapshot_dir(topic, queue_id))
        self.aborted_txns = AbortedTxnFile(self.producer_state.directory)
        self.has_transactions = self.aborted_txns.exists  # see aborted_txns.py: the file says the queue holds some
        self._producer_state_loaded = False
        self._snapshot_offset = 0  # the queue offset of the newest producer snapshot (once the state is loaded)
        self._state_end = 0  # the loaded producer state covers the queue's messages below this offset
        self._lock = threading.Lock()
        self._pending_flush: deque[tuple[int, int]] = deque()  # (CommitLog end, queue offset after it)
        self._pending_replication: deque[tuple[int, int]] = deque()  # the same, kept under SYNC_MASTER
        self._flushed = self.next_offset
        self._size: int | None = None
        self._time_blocks = TimeBlocks()
        self._time_lock = threading.Lock()
        self.closed = False
        self.leader_epoch = 0  # kept for the interface: RocketMQ messages carry no leader epoch
        self.deleted = False  # closed because its topic was deleted: readers are told the queue is gone

    # --- offsets ----------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.queue_id}"

    @property
    def log_start_offset(self) -> int:  # type: ignore[override]
        return max(self.start_floor, self.consume_queue.min_offset)

    @property
    def log_end_offset(self) -> int:  # type: ignore[override]
        return self.next_offset

    @property
    def high_watermark(self) -> int:  # type: ignore[override]
        if self.consume_queue.max_offset < self.next_offset:
            self.engine.catch_up()
        return self.consume_queue.max_offset

    @property
    def last_stable_offset(self) -> int:
        """min(first unstable offset, high watermark), the first unstable offset raised to the log start, as the
        Kafka engine keeps it; a queue that never held a transaction: the high watermark."""
        high_watermark = self.high_watermark
        if not self.has_transactions:
            return high_watermark
        self._ensure_producer_state()
        with self._lock:
            first = self.producer_state.first_unstable_offset(high_watermark)
        if first is None:
            return high_watermark
        return min(max(first, self.log_start_offset), high_watermark)

    @property
    def flushed_offset(self) -> int:
        flushed_where = self.engine.commitlog.flushed_where
        with self._lock:
            pending = self._pending_flush
            while pending and pending[0][0] <= flushed_where:
                self._flushed = pending.popleft()[1]
            return self._flushed

    @property
    def size_in_bytes(self) -> int:
        """CommitLog bytes of the messages from the log start to the high watermark."""
        if self._size is None:
            self._size = self._sum_sizes(self.log_start_offset, self.consume_queue.max_offset)
        return self._size

    def _sum_sizes(self, start: int, end: int) -> int:
        total = 0
        while start < end:
            units = self.consume_queue.units(start, min(READ_UNITS * 16, end - start))
            if not units:
                break
            total += sum(size for _offset, size, _tags in units if size != BLANK_UNIT_SIZE)
            start += len(units)
        return total

    def dispatched(self, message_bytes: int) -> None:
        """The dispatcher wrote units of this queue covering `message_bytes` of CommitLog."""
        if self._size is not None:
            self._size += message_bytes

    def forget_size(self) -> None:
        self._size = None

    # --- append -----------------------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview, *, from_client: bool = True) -> AppendResult:
        """Validate the batch(es), encode every record as a CommitLog message and put them in one go. A
        transactional batch opens its producer's transaction, an end-transaction marker (a control batch, never a
        client's) closes it, an aborted one is added to `aborted_txns`; the queue's first transactional batch
        creates that file before it is put."""
        if from_client:  # internal writes (committed offsets, retention's copies of compacted keys) still go
            self.engine.check_writable()
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        batches = [self._encode(view, position, header) for position, header in self._validate(view, from_client)]
        engine = self.engine
        commitlog = engine.commitlog
        messages = _join([b.messages for b in batches])
        buffer, starts = messages.data, messages.starts
        total_messages = len(starts)
        size = len(buffer)
        step = np.arange(total_messages)
        patched_at = starts[:, None] + _PATCHED_BYTES  # QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP of each
        with commitlog.put_lock:
            if self.closed:
                raise self._closed_error()
            if engine.role == SLAVE:
                raise NotLeaderOrFollowerError(
                    f"{self.name}: this RocketMQ store is a SLAVE (tidelog.rocketmq.brokerRole); puts go to its master"
                )
            first = batches[0].header
            if self.has_transactions or any(b.header.producer_id >= 0 for b in batches):
                self._load_producer_state()
            if from_client and first.producer_id >= 0:
                duplicate = self.producer_state.check(first)
                if duplicate is not None:
                    return AppendResult(
                        duplicate.first_offset, duplicate.last_offset, first.records_count, -1,
                        self.log_start_offset, 0,
                    )  # fmt: skip
            for batch in batches:
                if batch.marker is not None:
                    self.producer_state.check_marker(
                        batch.header.producer_id, batch.header.producer_epoch, batch.marker.coordinator_epoch
                    )
            if not self.has_transactions and any(b.header.is_transactional for b in batches):
                self.aborted_txns.create()
                self.has_transactions = True
            now = max(engine.clock(), commitlog.last_store_timestamp)
            base_offset = self.next_offset
            queue_offsets = base_offset + step

            def encode(physical_offset: int) -> bytearray:
                values = np.empty((total_messages, 3), dtype=">i8")
                values[:, 0] = queue_offsets
                values[:, 1] = physical_offset + starts
                values[:, 2] = now
                np.frombuffer(buffer, dtype=np.uint8)[patched_at] = values.view(np.uint8).reshape(-1, 24)
                return buffer

            try:
                physical_offset = commitlog.put(size, encode, now)
            except OSError as exc:
                raise KafkaStorageError(f"{self.name}: cannot append: {exc.strerror or exc}") from exc
            except KafkaStorageError as exc:  # a CommitLog file could not be created (a full disk): nothing stored
                raise KafkaStorageError(f"{self.name}: cannot append: {exc}") from exc
            self.next_offset = base_offset + total_messages
            if total_messages:
                zeros = np.zeros(total_messages, dtype=np.int64)
                engine.dispatcher.offer(
                    DispatchBatch(
                        physical_offset + starts, messages.sizes, queue_offsets, np.full(total_messages, now), zeros,
                        zeros,
                        [QueueRun(self.topic, self.queue_id, 0, total_messages)],
                        messages.keys,
                    )
                )  # fmt: skip
            with self._lock:
                self._pending_flush.append((physical_offset + size, self.next_offset))
                if engine.role == SYNC_MASTER:
                    self._pending_replication.append((physical_offset + size, self.next_offset))
            first_offset = base_offset
            with self._lock:
                for batch in batches:
                    header = batch.header
                    if batch.marker is not None:
                        self._complete_txn(header.producer_id, header.producer_epoch, batch.marker, first_offset, now)
                    elif not header.is_control:
                        self.producer_state.update(header, first_offset, now)
                    first_offset += batch.count
                self._state_end = self.next_offset
        engine.appended()
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        return AppendResult(
            base_offset=base_offset,
            last_offset=base_offset + total_messages - 1,
            record_count=total_messages,
            log_append_time_ms=now if log_append_time else -1,
            log_start_offset=self.log_start_offset,
            size_in_bytes=sum(b.kafka_bytes for b in batches),
        )

    def _validate(self, view: memoryview, from_client: bool) -> list[tuple[int, BatchHeader]]:
        """The checks Kafka's engine applies (layout, CRC, attribute bits, producer rules, max.message.bytes)."""
        headers: list[tuple[int, BatchHeader]] = []
        position = 0
        while position < len(view):
            header = read_header(view, position)
            check_crc(header, compute_crc(view, position, header.size_in_bytes), position)
            check_header_fields(header, position)
            if from_client:
                check_producer_batch(header)  # a client's control batch is refused
            if header.size_in_bytes > self.config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch of {header.size_in_bytes} bytes exceeds max.message.bytes "
                    f"({self.config.max_message_bytes}) of {self.name}"
                )
            bounds = self.config.timestamp_bounds(self.engine.clock()) if from_client else None
            if bounds is not None:
                check_timestamps_within(view, position, header, *bounds)
            headers.append((position, header))
            position += header.size_in_bytes
        if not headers:
            raise InvalidRecordError("an append needs at least one record batch")
        if from_client and len(headers) > 1:
            raise InvalidRecordError(f"a producer must send exactly one batch per partition, got {len(headers)}")
        return headers

    def _encode(self, view: memoryview, position: int, header: BatchHeader) -> _Encoded:
        """The batch's records as messages (codec/rocketmq_message.py's encode_records), a batch at a time."""
        engine = self.engine
        records = decode_batch(view, position, header)
        count = len(records)
        now = engine.clock()
        if self.config.message_timestamp_type == "LogAppendTime":
            born_timestamps = np.full(count, now, dtype=np.int64)
        else:
            born_timestamps = records.timestamp
        uniq_prefix, uniq_first = engine.unique_ids.next_block(count, now)
        # the producer of an idempotent or transactional batch (a marker's: sequence -1) on its last message
        carries_producer = header.producer_id >= 0 and (header.base_sequence != NO_SEQUENCE or header.is_transactional)
        max_body = engine.store_config.max_message_size
        try:
            messages = rm.encode_records(
                records,
                topic=self.topic,
                queue_id=self.queue_id,
                born_timestamps=born_timestamps,
                uniq_prefix=uniq_prefix,
                uniq_first=uniq_first,
                producer=(
                    f"{header.producer_id}/{header.producer_epoch}/{header.base_sequence}/{count}"
                    if carries_producer
                    else ""
                ),
                store_host=engine.store_host,
                max_body=max_body,
                index_keys=engine.index is not None,
            )
        except rm.BodyTooLargeError as exc:
            raise RecordTooLargeError(
                f"a record value of {exc.size} bytes exceeds tidelog.rocketmq.maxMessageSize ({max_body})"
            ) from None
        except rm.PropertiesTooLargeError as exc:
            raise RecordTooLargeError(
                f"record {exc.record} of a batch for {self.name}: its RocketMQ PROPERTIES (its key, headers and the "
                f"engine's own properties) would be {exc.size:,} bytes, over RocketMQ's limit of "
                f"{rm.MAX_PROPERTIES_SIZE:,} (Short.MAX_VALUE); a key that is not plain text is stored base64-"
                "encoded, so it may have about 24 KB"
            ) from None
        attributes = header.attributes & TXN_ATTRIBUTES
        if attributes:  # every message of a transactional batch (or a marker) says so in its FLAG
            flags = np.frombuffer(messages.data, dtype=np.uint8)
            flags[messages.starts[:, None] + _FLAG_BYTES] = np.frombuffer(attributes.to_bytes(4, "big"), np.uint8)
        marker = read_end_txn_marker(view, position, header) if header.is_control else None
        return _Encoded(header, messages, header.size_in_bytes, marker)

    def _complete_txn(
        self, producer_id: int, producer_epoch: int, marker: EndTransactionMarker, offset: int, timestamp: int
    ) -> CompletedTxn | None:
        """Apply the marker at `offset` to the producer state; an aborted transaction goes into `aborted_txns`."""
        completed = self.producer_state.complete_txn(
            producer_id, producer_epoch, marker.coordinator_epoch, marker.commit, offset, timestamp
        )
        if completed is not None and completed.aborted:
            self.aborted_txns.append(
                AbortedTxn(completed.producer_id, completed.first_offset, offset, completed.last_stable_offset)
            )
        return completed

    def _ensure_producer_state(self) -> None:
        if not self._producer_state_loaded or self.engine.replica is not None:
            with self.engine.commitlog.put_lock:
                self._load_producer_state()

    def _load_producer_state(self) -> None:
        """After a restart (under the put lock, before anything else touches the state): the newest producer
        snapshot, then the `KAFKA_PRODUCER` properties of the messages after it (of the whole queue when there is
        no snapshot: a batch stored long ago may still be retried), the FLAG of each saying whether its batch was
        transactional or an end-transaction marker. The aborted transactions: the file's entries below where the
        replay starts, the replay's after it; an ABORT marker whose transaction began below the log start (the
        replay cannot see its start) keeps the file's entry.

        On a slave the messages come from the master's CommitLog, not through `append`: once loaded, the state
        follows them here, replaying what the dispatcher added since (under the queue's lock: readers that already
        caught up may be reading the state)."""
        if self._producer_state_loaded:
            end = self.consume_queue.max_offset
            if self.engine.replica is not None and self._state_end < end:
                with self._lock:
                    self._replay_units(self._state_end, end, {})
                    self._state_end = end
            return
        try:
            self._replay_producers()
        finally:
            self._producer_state_loaded = True  # set last: a reader outside the put lock sees a finished state

    def _replay_producers(self) -> None:
        end = self.consume_queue.max_offset
        self._snapshot_offset = self.producer_state.load_latest_snapshot(end)
        start = max(self.log_start_offset, self._snapshot_offset)
        replayed: dict[int, AbortedTxn] = {}
        if self.has_transactions:
            stored = self.aborted_txns.load()
            kept = [entry for entry in stored if entry.last_offset < start]
            replayed = {entry.last_offset: entry for entry in stored[len(kept) :]}
            if replayed:
                self.aborted_txns.replace(kept)
            else:
                self.aborted_txns.hold(kept)
        self._replay_units(start, end, replayed)
        self._state_end = end

    def _replay_units(self, start: int, end: int, replayed: dict[int, AbortedTxn]) -> None:
        """Apply the producer properties and FLAGs of the messages [start, end) to the state (`_load_producer_state`);
        `replayed`: aborted-transaction entries the file held for markers in that range."""
        for queue_offset, physical_offset, size in self.units(start, end):
            message = self.engine.read_message(physical_offset, size)
            info = rm.producer_info(message.properties_bytes)
            if info is None:
                continue
            first_offset = queue_offset - info.count + 1
            attributes = message.flag & TXN_ATTRIBUTES
            if not attributes & CONTROL_MASK:
                header = BatchHeader(
                    first_offset, 0, -1, 2, 0, attributes, info.count - 1, message.born_timestamp,
                    message.born_timestamp, info.producer_id, info.epoch, info.base_sequence, info.count,
                )  # fmt: skip
                self.producer_state.update(header, first_offset, message.store_timestamp)
                continue
            control_type, coordinator_epoch = parse_control_record(rm.message_to_record(message))
            if coordinator_epoch is None:
                continue
            marker = EndTransactionMarker(control_type is ControlRecordType.COMMIT, coordinator_epoch)
            completed = self._complete_txn(info.producer_id, info.epoch, marker, queue_offset, message.store_timestamp)
            earlier = replayed.get(queue_offset)
            if completed is None and earlier is not None and earlier.producer_id == info.producer_id:
                self.aborted_txns.append(earlier)

    def snapshot_producer_state(self, *, force: bool = False) -> bool:
        """Write the producer state as `<log end offset>.snapshot` when PRODUCER_SNAPSHOT_UNITS offsets were
        appended since the last one, or (`force`, a clean close) when anything was; returns whether it wrote. The
        state is copied under the put lock, the file written (and fsynced) outside it."""
        if not self._producer_state_loaded:
            return False  # no idempotent producer wrote since the start: the files on disk still hold
        with self.engine.commitlog.put_lock:
            self._load_producer_state()  # on a slave: what arrived since it last followed
            end = self._state_end
            appended = end - self._snapshot_offset
            if not self.producer_state.producers or appended <= 0 or (not force and appended < PRODUCER_SNAPSHOT_UNITS):
                return False
            data = self.producer_state.snapshot_bytes()
            if self.has_transactions:
                with self._lock:  # readers of the entries take this lock
                    self.aborted_txns.repair()
                    self.aborted_txns.drop_before(self.log_start_offset)
        self.producer_state.directory.mkdir(parents=True, exist_ok=True)
        if self.has_transactions:
            self.aborted_txns.sync()  # the aborts of markers below `end` on disk before the snapshot says so
        self.producer_state.write_snapshot(end, data)
        self._snapshot_offset = end
        return True

    # --- reads ------------------------------------------------------------------------------------------------

    def units(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(queue offset, CommitLog offset, size) of the units in [start, end)."""
        found: list[tuple[int, int, int]] = []
        while start < end:
            units = self.consume_queue.units(start, min(READ_UNITS, end - start))
            if not units:
                break
            found += [(start + i, offset, size) for i, (offset, size, _tags) in enumerate(units)]
            start += len(units)
        return found

    def _closed_error(self) -> LogClosedError | UnknownTopicOrPartitionError:
        if self.deleted:
            return UnknownTopicOrPartitionError(f"{self.name} was deleted")
        return LogClosedError(f"{self.name} is closed")

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        min_one_message: bool = True,
        up_to_log_end: bool = False,
        max_offset: int | None = None,
    ) -> FileSlices:
        """Kafka batches re-encoded from the messages at `offset` on: one batch per original producer batch (or
        the part of it at or after `offset`); whole batches only, the first even when it exceeds `max_bytes`.
        `max_offset` (the last stable offset of a read_committed fetch) is the high watermark here, or below it.
        A read that its budget stopped offers the next one to the engine's read-ahead (read_ahead.py)."""
        if self.closed:
            raise self._closed_error()
        high_watermark = self.high_watermark
        if max_offset is not None and max_offset < high_watermark:
            high_watermark = max(max_offset, offset)
        start = self.log_start_offset
        if offset < start or offset > self.next_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is outside {self.name}'s range [{start}, {self.next_offset}]")
        key = ReadKey(offset, max_bytes, self.read_generation)
        done = self.engine.read_ahead.take(self, key, high_watermark, min_one_message)
        if done is None:
            done = self._read(key, min_one_message, high_watermark)
        if done.budget_bound and done.next_offset < high_watermark:
            following = ReadKey(done.next_offset, max_bytes, key.generation)
            read = functools.partial(self._read, following, True, high_watermark)  # True: see ReadAhead.take
            self.engine.read_ahead.offer(self, following, read)
        return FileSlices(done.batches, start, high_watermark)

    def _read(self, key: ReadKey, min_one_message: bool, high_watermark: int) -> ReadResult:
        """read()'s work (also the read-ahead worker's): the batches from `key.offset` within `key.max_bytes`, up
        to `high_watermark`."""
        offset, max_bytes = key.offset, key.max_bytes
        slices: list[MemorySlice] = []
        remaining = max_bytes
        position = offset
        wanted = 0  # the messages of a batch that the last round read only part of
        budget_bound = False
        while position < high_watermark and (remaining > 0 or (min_one_message and not slices)):
            reach = int(self._stored_per_kafka_byte * max(remaining, 0)) + 1  # stored bytes that may fit
            count = max(wanted, min(MAX_READ_UNITS, reach // MIN_MESSAGE_BYTES + 1))  # a whole batch, however long
            units = self.consume_queue.unit_array(position, min(count, high_watermark - position))
            if not len(units):
                break
            stored = np.cumsum(units["size"], dtype=np.int64)
            units = units[: max(wanted, int(np.searchsorted(stored, reach)) + 1)]
            data, positions, covered = self.engine.read_runs(units["offset"].astype(np.int64), units["size"])
            at_end = covered == len(units) and position + covered >= high_watermark
            try:
                rebuilt = rebuild_batches(
                    data,
                    positions,
                    units["size"][:covered],
                    position,
                    remaining,
                    min_one_message=min_one_message and not slices,
                    at_end=at_end,
                )
            except CorruptMessageError as exc:
                unit = units[exc.index]
                raise KafkaStorageError(
                    f"{self.name}: the ConsumeQueue unit for offset {position + exc.index} (CommitLog offset "
                    f"{int(unit['offset'])}, {int(unit['size'])} bytes) points at a bad message: {exc.reason}"
                ) from None
            slices += [MemorySlice(batch) for batch in rebuilt.batches]
            made = sum(len(batch) for batch in rebuilt.batches)
            remaining -= made
            if made:  # how many stored bytes the next read should take for a byte of batches
                taken = rebuilt.next_offset - position
                self._stored_per_kafka_byte = STORED_BYTES_MARGIN * int(stored[taken - 1]) / made
            if rebuilt.full:
                budget_bound = True
                position = rebuilt.next_offset
                break
            if not rebuilt.batches and (not rebuilt.missing or at_end or covered < len(units)):
                break  # an open batch whose end is not dispatched yet
            position, wanted = rebuilt.next_offset, rebuilt.missing
        budget_bound = budget_bound or (remaining <= 0 and position < high_watermark)
        first_fits = not slices or slices[0].length <= max_bytes
        return ReadResult(
            tuple(slices),
            position,
            high_watermark,
            budget_bound,
            min_one_message,
            first_fits,
        )

    # --- replication: one replica per queue (see the module's docstring) --------------------------------------

    def _no_replication(self, call: str) -> ReplicationUnsupportedError:
        return ReplicationUnsupportedError(
            f"{self.name}: {call} is a replica's call, and the RocketMQ engine keeps one replica per queue "
            f"(a replication factor above 1 needs the Kafka engine)"
        )

    def append_replica(self, data: bytes | bytearray | memoryview) -> AppendResult:
        raise self._no_replication("append_replica")

    def truncate_to(self, offset: int) -> None:
        raise self._no_replication("truncate_to")

    def truncate_fully_and_start_at(self, offset: int) -> None:
        raise self._no_replication("truncate_fully_and_start_at")

    def set_high_watermark(self, offset: int) -> None:
        """Nothing to do: the high watermark is what the dispatcher has made readable."""

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return (-1, -1)

    @property
    def latest_epoch(self) -> int:
        return -1

    def active_producers(self) -> list[ProducerSummary]:
        if self.has_transactions:
            self._ensure_producer_state()
        with self._lock:
            return self.producer_state.summaries()

    # --- transactions -----------------------------------------------------------------------------------------

    def append_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool
    ) -> AppendResult:
        """Write the COMMIT or ABORT marker at the log end: the control batch Kafka's leader writes
        (control_record.py), stored as one message whose FLAG says control; `append` checks its epochs against
        the producer state under the put lock and applies it."""
        batch = build_control_batch(
            ControlRecordType.COMMIT if commit else ControlRecordType.ABORT,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp_ms=self.engine.clock(),
        )
        return self.append(batch, from_client=False)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTransaction]:
        """The aborted transactions whose marker is at or after `start_offset` and which began below
        `end_offset` (aborted_txns.py)."""
        if not self.has_transactions:
            return []
        self._ensure_producer_state()
        with self._lock:
            found = self.aborted_txns.collect(start_offset, end_offset)
        return [AbortedTransaction(entry.producer_id, entry.first_offset) for entry in found]

    def is_committed(self, last: rm.Message) -> bool:
        """Is the transactional batch whose last message is `last` committed? False for a marker and for a batch
        of a transaction aborted or still open (retention keeps only committed values). Under the put lock."""
        info = rm.producer_info(last.properties_bytes)
        if last.flag & CONTROL_MASK or info is None:
            return False
        self._load_producer_state()
        offset = last.queue_offset
        with self._lock:
            open_from = self.producer_state.ongoing.get(info.producer_id)
            if open_from is not None and offset >= open_from:
                return False
            aborted = self.aborted_txns.collect(offset, offset + 1)
        return not any(entry.producer_id == info.producer_id for entry in aborted)

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampAndOffset | None:
        """ListOffsets, with Kafka's meaning whatever order the record (born) timestamps come in: the earliest
        offset whose timestamp is at least the target; MAX_TIMESTAMP: the first record with the largest timestamp.
        Whole blocks of offsets are skipped by their maximum timestamp (`_time_blocks`), so a lookup reads the
        timestamps of at most two blocks."""
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return TimestampAndOffset(-1, self.log_start_offset)
        if timestamp_ms == LATEST_TIMESTAMP:
            return TimestampAndOffset(-1, self.log_end_offset)
        if timestamp_ms < 0 and timestamp_ms != MAX_TIMESTAMP:
            raise OffsetOutOfRangeError(f"{timestamp_ms} is neither a timestamp nor a special ListOffsets target")
        with self._time_lock:
            start, end = self.log_start_offset, self.high_watermark
            if start >= end:
                return None
            maxima = self._time_blocks.extend(self, start, end)
            first_block = start // TIME_BLOCK_UNITS
            if timestamp_ms == MAX_TIMESTAMP:
                # the first block may hold offsets below the log start: its visible part is read
                head = self.born_timestamps(start, min(end, (first_block + 1) * TIME_BLOCK_UNITS))
                later = maxima[first_block + 1 - self._time_blocks.first_block :]
                timestamp_ms = max(int(head.max()), int(later.max()) if len(later) else -1)
                if timestamp_ms < 0:
                    return None
            block = first_block
            while block * TIME_BLOCK_UNITS < end:
                candidates = np.flatnonzero(maxima[block - self._time_blocks.first_block :] >= timestamp_ms)
                if not len(candidates):
                    return None
                block += int(candidates[0])
                low = max(start, block * TIME_BLOCK_UNITS)
                stamps = self.born_timestamps(low, min(end, (block + 1) * TIME_BLOCK_UNITS))
                hits = np.flatnonzero(stamps >= timestamp_ms)
                if len(hits):  # else the block's maximum is below the log start: go on with the next
                    return TimestampAndOffset(int(stamps[hits[0]]), low + int(hits[0]))
                block += 1
            return None

    def born_timestamps(self, start: int, end: int) -> np.ndarray:
        """The record timestamps of the queue offsets [start, end), -1 where no message is (a gap, a blank unit)."""
        units = self.consume_queue.unit_array(start, end - start)
        if len(units) != end - start:
            raise KafkaStorageError(f"{self.name}: ConsumeQueue units {start}..{end} are not all there")
        stamps = self.engine.commitlog.read_born_timestamps(units["offset"].astype(np.int64))
        stamps[(units["size"] <= 0) | (units["size"] == BLANK_UNIT_SIZE)] = -1
        return stamps

    # --- durability and deletion -------------------------------------------------------------------------------

    def flush_due(self) -> bool:
        """SYNC_FLUSH: an acks=all producer waits for the group commit that covers its messages."""
        return self.engine.store_config.sync_flush and self.flushed_offset < self.next_offset

    def flush(self, up_to_offset: int | None = None) -> None:
        """Flush the CommitLog (one sync covers every queue) until this queue is on disk up to `up_to_offset`: wait
        for the CommitLog end of this queue's messages below it, not for what other queues appended since."""
        target = self.next_offset if up_to_offset is None else min(up_to_offset, self.next_offset)
        if self.flushed_offset >= target:
            return
        with self._lock:
            needed = next((end for end, after in self._pending_flush if after >= target), None)
        self.engine.flusher.wait_flushed(self.engine.commitlog.max_offset if needed is None else needed)

    def wait_replicated(self, up_to_offset: int | None = None) -> None:
        """SYNC_MASTER (GroupTransferService): wait until a slave holds this queue's messages below `up_to_offset`
        (all appended so far: None), up to syncFlushTimeout. Raises SlaveNotAvailableError at once without a slave
        near enough, FlushSlaveTimeoutError after the timeout; the messages stay stored either way. Other roles
        return at once. Blocks: not for the event loop."""
        engine = self.engine
        target = self.next_offset if up_to_offset is None else min(up_to_offset, self.next_offset)
        reported = engine.replicated_offset()
        with self._lock:
            pending = self._pending_replication
            while pending and pending[0][0] <= reported:
                pending.popleft()
            needed = next((end for end, after in pending if after >= target), None)
        if needed is not None:
            engine.wait_replicated(needed)

    def holds_transactions(self) -> None:
        """On a slave: the dispatcher saw a transactional message or a marker of this queue (its FLAG). As the
        queue's first transactional batch does on the master, this creates `aborted.txnindex`: from now on the last
        stable offset and the aborted transactions come from the producer state, which follows the CommitLog."""
        with self.engine.commitlog.put_lock:
            if not self.has_transactions:
                self.aborted_txns.create()
                self.has_transactions = True

    def follow_dispatched_end(self) -> None:
        """On a slave, after the dispatcher wrote units: the queue's end is what the master's messages made it."""
        self.next_offset = max(self.next_offset, self.consume_queue.max_offset, self.start_floor)

    def take_over(self) -> None:
        """A slave becomes master (under the put lock, everything dispatched): appends continue at the queue's end,
        and the producer state is rebuilt from the CommitLog at its next use."""
        self.next_offset = self._flushed = max(self.consume_queue.max_offset, self.start_floor)
        self.read_generation += 1
        with self._lock:
            self._pending_flush.clear()
            self._pending_replication.clear()
        self.producer_state = ProducerStateManager(self.engine.producer_snapshot_dir(self.topic, self.queue_id))
        self._producer_state_loaded = False
        self._state_end = 0

    def truncated(self) -> None:
        """The engine cut the CommitLog and this queue's units past it (under the put lock): the queue ends where
        its units end, and what was derived from the records cut away is dropped."""
        self.take_over()
        self._size = None
        with self._time_lock:
            self._time_blocks = TimeBlocks()

    def delete_records(self, before_offset: int) -> int:
        """DeleteRecords: raise the log start offset. The messages stay in the CommitLog until retention."""
        high_watermark = self.high_watermark
        if before_offset > high_watermark or before_offset < 0:
            raise OffsetOutOfRangeError(
                f"cannot delete records before {before_offset}: {self.name}'s high watermark is {high_watermark}"
            )
        if before_offset > self.log_start_offset:
            self.start_floor = before_offset
            self.read_generation += 1
            self._size = None
            self.engine.save_start_offsets()
        return self.log_start_offset
