"""One message queue of the RocketMQ engine as a Kafka partition: queue id = partition, queue offset = Kafka offset.

No file of its own: an append turns the Kafka batch into CommitLog messages (codec/rocketmq_message.py), a read
turns ConsumeQueue units back into Kafka v2 batches built in memory. The contract is storage/api.py's `Partition`:

- log end offset = the next queue offset to assign (RocketMQ's topicQueueTable); high watermark = the ConsumeQueue's
  end, i.e. what the dispatcher has made readable (under SYNC_FLUSH only flushed messages are dispatched);
- log start offset = the ConsumeQueue's minimum, raised by DeleteRecords (kept in `tidelog-log-start-offsets`);
- `flushed_offset` = the queue offset below which the CommitLog is on disk, `flush_due` says whether an acks=all
  producer must wait for a group commit (SYNC_FLUSH) or not (ASYNC_FLUSH);
- a retried idempotent batch is answered with its first offsets, as Kafka's ProducerStateManager does; the state
  is rebuilt after a restart from the `KAFKA_PRODUCER` property of the queue's last messages.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from typing import TYPE_CHECKING

from tidelog.codec import rocketmq_message as rm
from tidelog.codec.record_batch import (
    NO_SEQUENCE,
    BatchHeader,
    Record,
    build_batch,
    check_crc,
    check_header_fields,
    check_producer_batch,
    compute_crc,
    decode_records,
    read_header,
)
from tidelog.config import LogConfig
from tidelog.errors import (
    InvalidRecordError,
    KafkaStorageError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from tidelog.storage.api import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    AppendResult,
    FileSlices,
    MemorySlice,
    Partition,
    TimestampAndOffset,
)
from tidelog.storage.kafka.producer_state import ProducerStateManager
from tidelog.storage.rocketmq.consume_queue import ConsumeQueue

if TYPE_CHECKING:
    from tidelog.storage.rocketmq.engine import RocketMQEngine

_I64 = struct.Struct(">q")
READ_UNITS = 1024  # ConsumeQueue units read per round of a fetch
PRODUCER_REPLAY_UNITS = 4096  # units at the end of a queue replayed for the idempotent-producer state
BLANK_UNIT_SIZE = 0x7FFFFFFF


class _Encoded:
    """A Kafka batch encoded as CommitLog messages, waiting for its offsets (patched in under the put lock)."""

    __slots__ = ("count", "data", "header", "kafka_bytes", "starts")

    def __init__(self, header: BatchHeader, data: bytearray, starts: list[int], kafka_bytes: int) -> None:
        self.header = header
        self.data = data
        self.starts = starts
        self.count = len(starts)
        self.kafka_bytes = kafka_bytes


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
        self.producer_state = ProducerStateManager(consume_queue.directory)
        self._producer_state_loaded = False
        self._lock = threading.Lock()
        self._pending_flush: deque[tuple[int, int]] = deque()  # (CommitLog end, queue offset after it)
        self._flushed = self.next_offset
        self._size: int | None = None
        self.closed = False

    # --- offsets ----------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:  # type: ignore[override]
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
        """Validate the batch(es), encode every record as a CommitLog message and put them in one go."""
        if from_client:  # internal writes (committed offsets, retention's copies of compacted keys) still go
            self.engine.check_writable()
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        batches = [self._encode(view, position, header) for position, header in self._validate(view, from_client)]
        engine = self.engine
        commitlog = engine.commitlog
        total_messages = sum(b.count for b in batches)
        size = sum(len(b.data) for b in batches)
        with commitlog.put_lock:
            if self.closed:
                raise LogClosedError(f"{self.name} is closed")
            first = batches[0].header
            if from_client and first.producer_id >= 0:
                self._load_producer_state()
                duplicate = self.producer_state.check(first)
                if duplicate is not None:
                    return AppendResult(
                        duplicate.first_offset, duplicate.last_offset, first.records_count, -1,
                        self.log_start_offset, 0,
                    )  # fmt: skip
            now = max(engine.clock(), commitlog.last_store_timestamp)
            base_offset = self.next_offset

            def encode(physical_offset: int) -> bytes | bytearray:
                buffer = batches[0].data if len(batches) == 1 else bytearray(b"".join(b.data for b in batches))
                queue_offset = base_offset
                at = 0
                for batch in batches:
                    for start in batch.starts:
                        position = at + start
                        rm.QUEUE_AND_PHYSICAL_OFFSET.pack_into(
                            buffer, position + rm.QUEUE_OFFSET_POSITION, queue_offset, physical_offset + position
                        )
                        _I64.pack_into(buffer, position + rm.STORE_TIMESTAMP_POSITION, now)
                        queue_offset += 1
                    at += len(batch.data)
                return buffer

            try:
                physical_offset = commitlog.put(size, encode, now)
            except OSError as exc:
                raise KafkaStorageError(f"{self.name}: cannot append: {exc.strerror or exc}") from exc
            self.next_offset = base_offset + total_messages
            with self._lock:
                self._pending_flush.append((physical_offset + size, self.next_offset))
            first_offset = base_offset
            for batch in batches:
                self.producer_state.update(batch.header, first_offset, now)
                first_offset += batch.count
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
                check_producer_batch(header)
            if header.is_transactional or header.is_control:
                raise InvalidRecordError(f"{self.name}: the RocketMQ engine stores no transactional or control batches")
            if header.size_in_bytes > self.config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch of {header.size_in_bytes} bytes exceeds max.message.bytes "
                    f"({self.config.max_message_bytes}) of {self.name}"
                )
            headers.append((position, header))
            position += header.size_in_bytes
        if not headers:
            raise InvalidRecordError("an append needs at least one record batch")
        if from_client and len(headers) > 1:
            raise InvalidRecordError(f"a producer must send exactly one batch per partition, got {len(headers)}")
        return headers

    def _encode(self, view: memoryview, position: int, header: BatchHeader) -> _Encoded:
        engine = self.engine
        records = decode_records(view, position, header)
        count = len(records)
        now = engine.clock()
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        uniq_keys = engine.unique_ids.next_ids(count, now)
        max_body = engine.store_config.max_message_size
        parts: list[bytes] = []
        starts: list[int] = []
        at = 0
        idempotent = header.producer_id >= 0 and header.base_sequence != NO_SEQUENCE
        for index, record in enumerate(records):
            extra = f"{rm.PROPERTY_BATCH}\x01{index}/{count}\x02" if count > 1 else ""
            if idempotent and index == count - 1:
                extra += (
                    f"{rm.PROPERTY_PRODUCER}\x01{header.producer_id}/{header.producer_epoch}/"
                    f"{header.base_sequence}/{count}\x02"
                )
            body = record.value or b""
            if len(body) > max_body:
                raise RecordTooLargeError(
                    f"a record value of {len(body)} bytes exceeds tidelog.rocketmq.maxMessageSize ({max_body})"
                )
            try:
                message = rm.encode_message(
                    topic=self.topic,
                    queue_id=self.queue_id,
                    body=body,
                    properties=rm.record_properties(record, uniq_keys[index], extra),
                    born_timestamp=now if log_append_time or record.timestamp_ms is None else record.timestamp_ms,
                    store_host=engine.store_host,
                )
            except ValueError as exc:  # properties over 32767 bytes
                raise RecordTooLargeError(f"record {index} of a batch for {self.name}: {exc}") from None
            starts.append(at)
            parts.append(message)
            at += len(message)
        return _Encoded(header, bytearray(b"".join(parts)), starts, header.size_in_bytes)

    def _load_producer_state(self) -> None:
        """After a restart: replay the `KAFKA_PRODUCER` properties of the queue's last messages."""
        if self._producer_state_loaded:
            return
        self._producer_state_loaded = True
        end = self.consume_queue.max_offset
        start = max(self.log_start_offset, end - PRODUCER_REPLAY_UNITS)
        for queue_offset, physical_offset, size in self.units(start, end):
            message = self.engine.read_message(physical_offset, size)
            info = rm.producer_info(message.properties_bytes)
            if info is None:
                continue
            header = BatchHeader(
                queue_offset - info.count + 1, 0, -1, 2, 0, 0, info.count - 1, message.born_timestamp,
                message.born_timestamp, info.producer_id, info.epoch, info.base_sequence, info.count,
            )  # fmt: skip
            self.producer_state.update(header, queue_offset - info.count + 1, message.store_timestamp)

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

    def read(self, offset: int, max_bytes: int, *, min_one_message: bool = True) -> FileSlices:
        """Kafka batches re-encoded from the messages at `offset` on: one batch per original producer batch (or
        the part of it at or after `offset`); whole batches only, the first even when it exceeds `max_bytes`."""
        if self.closed:
            raise LogClosedError(f"{self.name} is closed")
        high_watermark = self.high_watermark
        start = self.log_start_offset
        if offset < start or offset > self.next_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is outside {self.name}'s range [{start}, {self.next_offset}]")
        slices: list[MemorySlice] = []
        remaining = max_bytes
        group: list[Record] = []
        position = offset
        while position < high_watermark and (remaining > 0 or (min_one_message and not slices)):
            units = self.units(position, min(high_watermark, position + READ_UNITS))
            if not units:
                break
            for queue_offset, physical_offset, size in units:
                message = self.engine.read_message(physical_offset, size)
                if message.queue_offset != queue_offset:
                    raise KafkaStorageError(
                        f"{self.name}: the ConsumeQueue unit for offset {queue_offset} points at a message of "
                        f"offset {message.queue_offset} (CommitLog offset {physical_offset})"
                    )
                group.append(rm.message_to_record(message))
                if rm.ends_batch(message.properties):
                    batch = MemorySlice(build_batch(group, base_offset=group[0].offset))
                    group = []
                    if slices and len(batch) > remaining:
                        return FileSlices(tuple(slices), start, high_watermark)
                    if not slices and len(batch) > remaining and not min_one_message:
                        return FileSlices((), start, high_watermark)
                    slices.append(batch)
                    remaining -= len(batch)
                    if remaining <= 0:
                        return FileSlices(tuple(slices), start, high_watermark)
                position = queue_offset + 1
        if group:  # a batch whose end is not dispatched yet: hand out what is
            batch = MemorySlice(build_batch(group, base_offset=group[0].offset))
            if not slices or len(batch) <= remaining:
                slices.append(batch)
        return FileSlices(tuple(slices), start, high_watermark)

    def offset_for_timestamp(self, timestamp_ms: int) -> TimestampAndOffset | None:
        """ListOffsets. A time lookup is a binary search over the record (born) timestamps of the queue, as
        RocketMQ's getOffsetInQueueByTime searches store times: exact when timestamps grow with the offsets."""
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return TimestampAndOffset(-1, self.log_start_offset)
        if timestamp_ms == LATEST_TIMESTAMP:
            return TimestampAndOffset(-1, self.log_end_offset)
        low, high = self.log_start_offset, self.high_watermark
        if timestamp_ms == MAX_TIMESTAMP:
            best: TimestampAndOffset | None = None
            for queue_offset, physical_offset, _size in self.units(low, high):
                timestamp = self.engine.commitlog.read_born_timestamp(physical_offset)
                if best is None or timestamp > best.timestamp:
                    best = TimestampAndOffset(timestamp, queue_offset)
            return best
        if timestamp_ms < 0:
            raise OffsetOutOfRangeError(f"{timestamp_ms} is neither a timestamp nor a special ListOffsets target")
        end = high
        while low < high:
            middle = (low + high) // 2
            if self._born_timestamp(middle) >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        if low >= end:
            return None
        return TimestampAndOffset(self._born_timestamp(low), low)

    def _born_timestamp(self, queue_offset: int) -> int:
        unit = self.consume_queue.unit_at(queue_offset)
        if unit is None:
            raise KafkaStorageError(f"{self.name}: no ConsumeQueue unit for offset {queue_offset}")
        return self.engine.commitlog.read_born_timestamp(unit[0])

    # --- durability and deletion -------------------------------------------------------------------------------

    def flush_due(self) -> bool:
        """SYNC_FLUSH: an acks=all producer waits for the group commit that covers its messages."""
        return self.engine.store_config.sync_flush and self.flushed_offset < self.next_offset

    def flush(self, up_to_offset: int | None = None) -> None:
        """Flush the CommitLog (one sync covers every queue) until this queue is on disk up to `up_to_offset`."""
        target = self.next_offset if up_to_offset is None else min(up_to_offset, self.next_offset)
        if self.flushed_offset >= target:
            return
        self.engine.flusher.wait_flushed(self.engine.commitlog.max_offset)

    def delete_records(self, before_offset: int) -> int:
        """DeleteRecords: raise the log start offset. The messages stay in the CommitLog until retention."""
        high_watermark = self.high_watermark
        if before_offset > high_watermark or before_offset < 0:
            raise OffsetOutOfRangeError(
                f"cannot delete records before {before_offset}: {self.name}'s high watermark is {high_watermark}"
            )
        if before_offset > self.log_start_offset:
            self.start_floor = before_offset
            self._size = None
            self.engine.save_start_offsets()
        return self.log_start_offset
