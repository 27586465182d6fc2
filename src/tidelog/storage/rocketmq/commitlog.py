"""The CommitLog: every message of every topic and queue, appended to one sequence of fixed-size files
(`commitlog/<20-digit start offset>`), in the layout of codec/rocketmq_message.py (RocketMQ's CommitLog).

Rules it keeps:
- a message never spans two files: when `size + 8 > remaining`, the 8-byte BLANK marker `[remaining][0xCBD43194]`
  ends the file and the message goes to the start of the next one; the messages of one put (one Kafka batch) are
  written together, so they also stay in one file;
- PHYSICALOFFSET, QUEUEOFFSET and STORETIMESTAMP are filled inside the put lock, which also orders the queues'
  offsets, so store timestamps never go backwards in log order;
- recovery scans from a chosen file, checking sizes, magic, the body CRC and that PHYSICALOFFSET is where the
  message lies, and cuts the log at the first message that fails (and at a Kafka batch whose last message is
  missing); whatever followed is zeroed and later files are deleted;
- a slave (ha_client.py) appends the master's bytes unchanged at its own max offset (`append_at`), so its files are
  the master's byte for byte; a transfer may end inside a message, so only `complete_end` - the end of the last whole
  Kafka batch - is dispatched, and the recovery above cuts a half-received one after a crash.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidelog.codec.rocketmq_batches import PADDING
from tidelog.codec.rocketmq_message import (
    BLANK_MAGIC,
    BORN_TIMESTAMP_POSITION,
    END_FILE_MIN_BLANK_LENGTH,
    MAGIC_POSITION,
    MAGIC_V1,
    MAGIC_V2,
    STORE_TIMESTAMP_POSITION,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_POSITION,
    Blank,
    DispatchInfo,
    InvalidMessage,
    Message,
    batch_position,
    blank_marker,
    decode_dispatch_info,
    decode_message,
)
from tidelog.errors import KafkaStorageError, RecordTooLargeError, UnexpectedAppendOffsetError
from tidelog.storage.rocketmq.mapped_file import AllocateMappedFileService, MappedFile, MappedFileQueue

log = logging.getLogger("tidelog.storage.rocketmq")

COMMITLOG_DIR = "commitlog"
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I64_BYTES = np.arange(8)


@dataclass(frozen=True)
class RecoveryResult:
    start: int  # where the scan began
    end: int  # the first byte after the last valid message (the new max offset)
    truncated_bytes: int  # non-zero bytes found invalid at the end (0 when the scan met zeros)
    reason: str | None  # why the scan stopped, when it met something other than the end of the data
    messages: int


class CommitLog:
    def __init__(
        self,
        root: Path,
        file_size: int,
        *,
        allocator: AllocateMappedFileService | None,
    ) -> None:
        self.directory = root / COMMITLOG_DIR
        self.file_size = file_size
        self.queue = MappedFileQueue(self.directory, file_size, mapped=True, allocator=allocator)
        self.put_lock = threading.RLock()
        self.last_store_timestamp = 0  # of the newest message in the log

    def load(self) -> None:
        self.queue.load()

    # --- positions --------------------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """The first offset still in the log (the start of the first file, or of a BLANK-ended first file's
        successor, as RocketMQ's getMinOffset)."""
        first = self.queue.first_file
        return first.file_from_offset if first is not None else 0

    @property
    def max_offset(self) -> int:
        return self.queue.max_offset

    @property
    def flushed_where(self) -> int:
        return self.queue.flushed_where

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    # --- appending --------------------------------------------------------------------------------------------

    def put(self, size: int, encode: Callable[[int], bytes | bytearray], store_timestamp: int) -> int:
        """Append `size` bytes made by `encode(physical_offset)` (called under the put lock, which the caller may
        already hold); returns the physical offset. A BLANK marker ends the current file if they do not fit."""
        if size + END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise RecordTooLargeError(
                f"{size} bytes of messages cannot fit in a CommitLog file of {self.file_size} bytes "
                "(tidelog.rocketmq.mapedFileSizeCommitLog)"
            )
        with self.put_lock:
            mapped_file = self.queue.last_file_for_append(self.queue.max_offset)
            if size + END_FILE_MIN_BLANK_LENGTH > mapped_file.remaining:
                remaining = mapped_file.remaining
                mapped_file.write_at(mapped_file.wrote_position, blank_marker(remaining))
                mapped_file.wrote_position = self.file_size
                mapped_file = self.queue.last_file_for_append()
            physical_offset = mapped_file.end_offset
            data = encode(physical_offset)
            if len(data) != size:
                raise AssertionError(f"encoded {len(data)} bytes, {size} were announced")
            mapped_file.append(data)
            mapped_file.last_store_timestamp = store_timestamp
            self.last_store_timestamp = store_timestamp
            return physical_offset

    def append_at(self, offset: int, data: bytes) -> None:
        """A slave's append of the master's CommitLog bytes (an HA transfer): `offset` must be this log's max offset,
        or, in an empty log, the start of a file (the master's first file); `data` stays within one file."""
        if offset % self.file_size + len(data) > self.file_size:
            raise UnexpectedAppendOffsetError(
                f"{len(data)} bytes at CommitLog offset {offset} would cross the end of a {self.file_size}-byte file"
            )
        with self.put_lock:
            max_offset = self.queue.max_offset
            empty = not self.queue.files
            if offset != max_offset and not (empty and offset % self.file_size == 0):
                raise UnexpectedAppendOffsetError(
                    f"a transfer at CommitLog offset {offset} does not continue this CommitLog, which ends at "
                    f"{max_offset}"
                )
            mapped_file = self.queue.last_file_for_append(offset)
            if mapped_file.end_offset != offset:  # cannot happen after the checks above: never write elsewhere
                raise AssertionError(f"file {mapped_file.path} ends at {mapped_file.end_offset}, not {offset}")
            mapped_file.append(data)

    def complete_end(self, start: int, end: int, scan_from: int | None = None) -> tuple[int, int, int]:
        """From `start` (the end of a whole Kafka batch), the end of the last whole Kafka batch before `end`,
        following BLANK markers into the next file, the store timestamp of its last message (0 if none), and where
        the walk stopped (the start of the first message not whole before `end`). `scan_from`: a message start at
        or after `start` up to which an earlier walk found no batch's end (the walk resumes there, so a Kafka batch
        received in many pieces is walked once, not once per piece)."""
        complete, timestamp = start, 0
        offset = start if scan_from is None else max(start, scan_from)
        while offset < end:
            mapped_file = self.queue.find(offset)
            if mapped_file is None or mapped_file.map is None:
                break
            base = mapped_file.file_from_offset
            limit = min(end - base, mapped_file.wrote_position)
            position = offset - base
            try:
                item = decode_dispatch_info(mapped_file.map, position, limit)
            except InvalidMessage:  # the rest of the message has not come yet
                break
            if isinstance(item, Blank):
                offset = base + self.file_size
                if offset <= end:
                    complete = offset
                continue
            offset += item.total_size
            index, count = batch_position(item.properties)
            if index == count - 1:
                complete, timestamp = offset, item.store_timestamp
        return complete, timestamp, offset

    # --- reading ----------------------------------------------------------------------------------------------

    def read(self, offset: int, size: int) -> bytes:
        return self.queue.read(offset, size)

    def read_message(self, offset: int, size: int, *, check_crc: bool = False) -> Message:
        data = self.read(offset, size)
        item = decode_message(data, 0, check_crc=check_crc)
        if isinstance(item, Blank):
            raise InvalidMessage(f"BLANK marker at {offset}, not a message")
        return item

    def read_runs(self, offsets: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
        """The messages at CommitLog `offsets` (ascending, `sizes` long) that lie in the file of the first, read
        with one copy per run of adjacent messages: (their bytes back to back and rocketmq_batches.PADDING zero
        bytes, where each starts in them, how many of the offsets that covers). None when that file is gone
        (retention)."""
        mapped_file = self.queue.find(int(offsets[0]))
        if mapped_file is None:
            return None
        start = mapped_file.file_from_offset
        count = int(np.searchsorted(offsets, start + self.file_size))
        offsets, sizes = offsets[:count] - start, sizes[:count]
        ends = offsets + sizes
        if int(ends[-1]) > mapped_file.wrote_position:
            raise KafkaStorageError(f"{mapped_file.path}: a ConsumeQueue unit points past the written end")
        breaks = np.flatnonzero(offsets[1:] != ends[:-1]) + 1
        run_starts = offsets[np.concatenate([[0], breaks])].tolist()
        run_ends = ends[np.concatenate([breaks - 1, [count - 1]])].tolist()
        positions = np.cumsum(sizes) - sizes
        length = int(positions[-1] + sizes[-1])
        data = np.empty(length + PADDING, dtype=np.uint8)  # every byte but the padding is read into
        data[length:] = 0
        with memoryview(data) as target:  # type: ignore[arg-type]
            for a, b, at in zip(run_starts, run_ends, positions[np.concatenate([[0], breaks])].tolist(), strict=True):
                mapped_file.read_into(a, target[at : at + b - a])
        return data, positions, count

    def read_born_timestamps(self, offsets: np.ndarray) -> np.ndarray:
        """The record timestamps of the messages at `offsets` (int64 array), gathered with numpy from each file's
        mapping; -1 for an offset whose file is gone (retention)."""
        stamps = np.full(len(offsets), -1, dtype=np.int64)
        file_starts = offsets - offsets % self.file_size
        for file_start in np.unique(file_starts):
            mapped_file = self.queue.find(int(file_start))
            if mapped_file is None or mapped_file.map is None:
                continue
            chosen = file_starts == file_start
            positions = offsets[chosen] - file_start + BORN_TIMESTAMP_POSITION
            if positions.max() + 8 > mapped_file.wrote_position:
                raise KafkaStorageError(f"{mapped_file.path}: a ConsumeQueue unit points past the written end")
            try:
                data = np.frombuffer(mapped_file.map, dtype=np.uint8)
            except ValueError:  # the mapping was closed under us (the store is closing)
                continue
            stamps[chosen] = data[positions[:, None] + _I64_BYTES].view(">i8")[:, 0]
            del data  # release the mapping's buffer export at once
        return stamps

    def read_store_timestamp(self, offset: int) -> int:
        head = self.read(offset, STORE_TIMESTAMP_POSITION + 20)
        (sys_flag,) = _I32.unpack_from(head, SYSFLAG_POSITION)
        position = STORE_TIMESTAMP_POSITION + (12 if sys_flag & SYSFLAG_BORNHOST_V6 else 0)
        return _I64.unpack_from(head, position)[0]

    def iter_dispatch(self, start: int, end: int) -> Iterator[tuple[int, DispatchInfo]]:
        """(offset, DispatchInfo) of each message in [start, end), jumping over BLANK markers. Stops quietly at bytes
        that do not decode (only recovery judges them)."""
        offset = start
        while offset < end:
            mapped_file = self.queue.find(offset)
            if mapped_file is None or mapped_file.map is None:
                return
            base = mapped_file.file_from_offset
            position = offset - base
            limit = min(end - base, mapped_file.wrote_position)
            ended_by_blank = False
            while position < limit:
                try:
                    item = decode_dispatch_info(mapped_file.map, position, limit)
                except InvalidMessage as exc:
                    log.warning("commitlog: cannot dispatch at %d: %s", base + position, exc)
                    return
                if isinstance(item, Blank):
                    ended_by_blank = True
                    break
                yield base + position, item
                position += item.total_size
            if not ended_by_blank:
                return
            offset = base + self.file_size

    def iter_messages(self, start: int, end: int, *, check_crc: bool = False) -> Iterator[Message]:
        """Whole messages in [start, end) (tools, producer-state replay)."""
        for offset, info in self.iter_dispatch(start, end):
            yield self.read_message(offset, info.total_size, check_crc=check_crc)

    # --- recovery ---------------------------------------------------------------------------------------------

    def start_for_normal_recovery(self, dispatched_max: int) -> int:
        """Start of the last file whose start is at or before what the ConsumeQueues already hold."""
        files = self.queue.files
        index = len(files) - 1
        while index > 0 and files[index].file_from_offset > dispatched_max:
            index -= 1
        return files[index].file_from_offset if files else 0

    def start_for_abnormal_recovery(self, min_timestamp: int) -> int:
        """Start of the last file whose first message was stored at or before `min_timestamp`
        (isMappedFileMatchedRecover), else of the first file."""
        files = self.queue.files
        for mapped_file in reversed(files):
            head = mapped_file.read(0, STORE_TIMESTAMP_POSITION + 20)
            if len(head) < STORE_TIMESTAMP_POSITION + 8:
                continue
            (magic,) = _I32.unpack_from(head, MAGIC_POSITION)
            if magic not in (MAGIC_V1, MAGIC_V2):
                continue
            (sys_flag,) = _I32.unpack_from(head, SYSFLAG_POSITION)
            position = STORE_TIMESTAMP_POSITION + (12 if sys_flag & SYSFLAG_BORNHOST_V6 else 0)
            (store_timestamp,) = _I64.unpack_from(head, position)
            if store_timestamp != 0 and store_timestamp <= min_timestamp:
                return mapped_file.file_from_offset
        return files[0].file_from_offset if files else 0

    def recover(self, start: int, *, check_crc: bool) -> RecoveryResult:
        """Scan from `start` (a file start) and cut the log after the last valid message."""
        offset = start
        reason: str | None = None
        messages = 0
        open_batch_start: int | None = None  # offset of the first message of a Kafka batch not yet complete
        messages_before_batch = 0
        expected_index = 0
        last_timestamp = 0
        while True:
            mapped_file = self.queue.find(offset)
            if mapped_file is None or mapped_file.map is None:
                break
            position = offset - mapped_file.file_from_offset
            try:
                item = decode_message(mapped_file.map, position, check_crc=check_crc, read_body=False)
            except InvalidMessage as exc:
                reason = exc.reason
                break
            if isinstance(item, Blank):
                if item.remaining != self.file_size - position:
                    left = self.file_size - position
                    reason = f"BLANK marker at {offset} declares {item.remaining} bytes, the file has {left} left"
                    break
                if open_batch_start is not None:
                    reason = f"a Kafka batch starting at {open_batch_start} is cut by the end of its file"
                    break
                offset = mapped_file.file_from_offset + self.file_size
                continue
            if item.physical_offset != offset:
                reason = f"message at {offset} says it belongs at {item.physical_offset}"
                break
            index, count = batch_position(item.properties_bytes)
            if index != expected_index or count < 1 or index >= count:
                reason = f"message at {offset} is record {index}/{count} of a Kafka batch; expected {expected_index}"
                break
            if index == 0:
                open_batch_start, messages_before_batch = offset, messages
            if index == count - 1:
                open_batch_start, expected_index = None, 0
            else:
                expected_index = index + 1
            messages += 1
            last_timestamp = item.store_timestamp
            offset += item.total_size
        end = offset
        if open_batch_start is not None:
            reason = f"the Kafka batch starting at {open_batch_start} is incomplete ({reason or 'end of the log'})"
            end, messages = open_batch_start, messages_before_batch
        truncated = self._nonzero_bytes_after(end)
        if truncated:
            log.warning("commitlog: truncating at %d (%s); %d bytes after it are dropped", end, reason, truncated)
        self.queue.truncate_dirty_files(end)
        self.queue.flushed_where = end
        self.last_store_timestamp = last_timestamp or self.last_store_timestamp
        return RecoveryResult(start, end, truncated, reason if truncated else None, messages)

    def _nonzero_bytes_after(self, offset: int) -> int:
        """About how many bytes the truncation at `offset` drops (non-zero data up to the first zero megabyte)."""
        dropped = 0
        for mapped_file in self.queue.files:
            if mapped_file.file_from_offset + self.file_size <= offset:
                continue
            position = max(0, offset - mapped_file.file_from_offset)
            dropped += mapped_file.data_extent(position)
        return dropped

    def last_file(self) -> MappedFile | None:
        return self.queue.last_file

    # --- flushing and retention -------------------------------------------------------------------------------

    def flush(self, least_pages: int = 0) -> bool:
        return self.queue.flush(least_pages)

    def close(self) -> None:
        self.queue.close()


def blank_magic_at(data: bytes, position: int) -> bool:
    return len(data) >= position + 8 and _I32.unpack_from(data, position + 4)[0] == BLANK_MAGIC
