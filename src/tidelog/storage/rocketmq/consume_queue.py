"""A ConsumeQueue: the index of one queue (= one Kafka partition) into the CommitLog (RocketMQ's ConsumeQueue).

Files `consumequeue/<topic>/<queueId>/<20-digit start byte>`, each `mapedFileSizeConsumeQueue` bytes (300,000 units by
default), holding 20-byte units, big-endian:

    commitLogOffset i64 | size i32 | tagsCode i64

Queue offset N (= Kafka offset N) is the unit at byte N*20: file = byte // fileSize, position = byte % fileSize.
Derived data: the dispatcher writes it from the CommitLog, recovery cuts it back to what the CommitLog holds, and a
re-dispatched message whose CommitLog end is not beyond the queue's `max_physic_offset` is skipped, so dispatching
twice is harmless. The minimum queue offset moves up when retention deletes the CommitLog files its first units
point into. A queue whose first file starts past offset 0 has its leading units filled with {0, INT_MAX, 0}
(fillPreBlank).

A dispatch round over many queues writes their units together: `plan_run` says where a queue's units go without
moving anything, the engine writes every planned run in one call (storage/common/positioned_writes.py), then
`commit_run` moves each queue's end past its units - a reader never sees units that are not on file.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tidelog.errors import KafkaStorageError
from tidelog.storage.common.file_handles import FileHandles
from tidelog.storage.rocketmq.mapped_file import MappedFile, MappedFileQueue

log = logging.getLogger("tidelog.storage.rocketmq")

CONSUME_QUEUE_DIR = "consumequeue"
CQ_STORE_UNIT_SIZE = 20
UNIT = struct.Struct(">qiq")
UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])  # the same unit, for numpy
BLANK_UNIT = UNIT.pack(0, 0x7FFFFFFF, 0)
RECOVERY_CHECK_UNITS = 4096  # units at the tail of the last file checked one by one when loading


class UnflushedUnits(NamedTuple):
    files: list[tuple[MappedFile, int]]  # each file written past its flushed position, and where it was written to
    end: int  # the queue's end (a byte offset) when they were taken


class PlannedRun(NamedTuple):
    """Units of one queue to be written into its last file at `position` (ConsumeQueue.plan_run)."""

    consume_queue: ConsumeQueue
    mapped_file: MappedFile
    position: int
    units: memoryview
    last_end: int  # the CommitLog end of the last unit's message


def consume_queue_file_size(configured: int) -> int:
    """MessageStoreConfig.getMappedFileSizeConsumeQueue: rounded up to whole units."""
    return -(-configured // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


class ConsumeQueue:
    def __init__(
        self, root: Path, topic: str, queue_id: int, file_size: int, handles: FileHandles | None = None
    ) -> None:
        """`handles`: the engine's open ConsumeQueue files, which bound how many stay open (file_handles.py)."""
        self.topic = topic
        self.queue_id = queue_id
        self.directory = root / CONSUME_QUEUE_DIR / topic / str(queue_id)
        self.file_size = file_size
        self.queue = MappedFileQueue(self.directory, file_size, mapped=False, handles=handles)
        self.max_physic_offset = -1  # CommitLog end (offset + size) of the last unit
        self.min_logic_offset = 0  # in bytes, as RocketMQ keeps it
        self.dirty = False  # written since the last flush began
        self.unflushed_bytes = 0  # bytes written since then: what the least-pages rule of a scheduled flush reads
        self.torn = False  # a file was found short at load: the units after its cut are dispatched again

    # --- loading and recovery ---------------------------------------------------------------------------------

    def load(self) -> None:
        self.queue.load()
        self.recover()

    def recover(self) -> None:
        """Find the last valid unit: files before the last are full; the last is read up to its first hole. A file
        found short (and extended with zeros) before the last ends the queue where its units end: the later files
        go, and the dispatcher writes their units again from the CommitLog."""
        files = self.queue.files
        self.torn = bool(self.queue.extended)
        for index, mapped_file in enumerate(files[:-1]):
            if mapped_file.extended_from is None:
                continue
            valid_units = self._valid_units(mapped_file)
            if valid_units * CQ_STORE_UNIT_SIZE < self.file_size:
                log.warning(
                    "%s: %s was cut short: the queue ends after its %d units; %d later file(s) dropped",
                    self.directory,
                    mapped_file.path.name,
                    valid_units,
                    len(files) - index - 1,
                )
                for doomed in files[index + 1 :]:
                    doomed.close()
                    doomed.destroy()
                del files[index + 1 :]
                break
        while files:
            last = files[-1]
            valid_units = self._valid_units(last)
            last.wrote_position = last.flushed_position = valid_units * CQ_STORE_UNIT_SIZE
            if valid_units or len(files) == 1:
                break
            # an empty last file: the previous one is the end of the queue
            last.close()
            last.destroy()
            files.pop()
        self.queue.flushed_where = self.queue.max_offset
        self.min_logic_offset = self.queue.min_offset
        last_unit = self.unit_at(self.max_offset - 1) if self.max_offset > self.min_offset else None
        self.max_physic_offset = last_unit[0] + last_unit[1] if last_unit is not None else -1

    def _valid_units(self, mapped_file: MappedFile) -> int:
        data = mapped_file.read(0, mapped_file.data_end())
        written = len(data.rstrip(b"\0"))
        units = -(-written // CQ_STORE_UNIT_SIZE)
        first_checked = max(0, units - RECOVERY_CHECK_UNITS)
        for index in range(first_checked, units):
            offset, size, _tags = UNIT.unpack_from(data, index * CQ_STORE_UNIT_SIZE)
            if offset < 0 or size <= 0:
                log.warning(
                    "%s: unit %d of %s is invalid (offset %d, size %d); the queue ends before it",
                    self.directory,
                    index,
                    mapped_file.path.name,
                    offset,
                    size,
                )
                return index
        return units

    # --- offsets ----------------------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """The first queue offset (getMinOffsetInQueue)."""
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    @property
    def max_offset(self) -> int:
        """The next queue offset to be written (getMaxOffsetInQueue)."""
        return self.queue.max_offset // CQ_STORE_UNIT_SIZE

    # --- writing ----------------------------------------------------------------------------------------------

    def put(self, offsets: np.ndarray, sizes: np.ndarray, tags_codes: np.ndarray, queue_offsets: np.ndarray) -> int:
        """Write units (commitLogOffset, size, tagsCode for queueOffset; int64 arrays) in queue order; returns the
        CommitLog bytes of the new ones. Units the queue already covers (by CommitLog offset) are skipped; a run
        that goes on from the queue's end is written with one write, anything else (a gap, logged and filled by
        position, or units behind the end) unit by unit. A failed write leaves the queue ending at its last unit
        written, so dispatching the same units again goes on from there."""
        count = len(offsets)
        if int(offsets[0]) + int(sizes[0]) <= self.max_physic_offset:  # dispatched before, in part (ends only grow)
            fresh = int((offsets + sizes).searchsorted(self.max_physic_offset, "right"))
            if fresh == count:
                return 0
            offsets, sizes, tags_codes, queue_offsets = (
                offsets[fresh:],
                sizes[fresh:],
                tags_codes[fresh:],
                queue_offsets[fresh:],
            )
            count -= fresh
        try:
            first = int(queue_offsets[0])
            at = first * CQ_STORE_UNIT_SIZE
            in_order = int(queue_offsets[-1]) - first == count - 1 and (
                count < 3 or not np.count_nonzero(queue_offsets[1:] - queue_offsets[:-1] != 1)
            )
            if in_order and (not self.queue.files or at == self.queue.max_offset):
                units = np.empty(count, dtype=UNIT_DTYPE)
                units["offset"] = offsets
                units["size"] = sizes
                units["tags"] = tags_codes
                self._write(at, units.tobytes())
                self.max_physic_offset = int(offsets[-1]) + int(sizes[-1])
                return int(sizes.sum())
            rows = zip(offsets.tolist(), sizes.tolist(), tags_codes.tolist(), queue_offsets.tolist(), strict=True)
            return self._put(rows)
        except (KafkaStorageError, OSError):
            self._end_at_last_unit()
            raise

    def plan_run(self, first_queue_offset: int, units: memoryview, first_end: int, last_end: int) -> PlannedRun | None:
        """put's common case with the unit bytes made for the whole dispatch round, planned for one write with the
        other queues' of the round (storage/common/positioned_writes.py) and moving nothing yet: units for
        consecutive queue offsets from `first_queue_offset` (their messages' CommitLog ends: the first's
        `first_end`, the last's `last_end`), none of which the queue has yet, going on from its end inside its last
        file. None when the run is not that case (the caller then uses `put`). Once the units are written,
        `commit_run` moves the queue's end past them; until then readers see the queue as it was."""
        at = first_queue_offset * CQ_STORE_UNIT_SIZE
        if first_end <= self.max_physic_offset or (self.queue.files and at != self.queue.max_offset):
            return None
        if not self.queue.files:
            self._create_first_file(at)
        last = self.queue.files[-1]
        position = at - last.file_from_offset  # its wrote position: the queue ends there
        if position + len(units) > self.file_size:
            return None  # the run starts a file: put creates it
        return PlannedRun(self, last, position, units, last_end)

    def commit_run(self, run: PlannedRun) -> None:
        """The units of `run` (plan_run) are written: the queue ends after them."""
        run.mapped_file.wrote_position = run.position + len(run.units)
        self.max_physic_offset = run.last_end
        self.dirty = True
        self.unflushed_bytes += len(run.units)

    def _end_at_last_unit(self) -> None:
        """After a failed write: the queue's dispatched CommitLog end is that of its last unit written."""
        last_unit = self.unit_at(self.max_offset - 1) if self.max_offset > self.min_offset else None
        self.max_physic_offset = last_unit[0] + last_unit[1] if last_unit is not None else -1

    def _put(self, units: Iterable[tuple[int, int, int, int]]) -> int:
        """put's unit by unit path."""
        written = 0
        pending = bytearray()
        pending_at = -1
        for physical_offset, size, tags_code, queue_offset in units:
            if physical_offset + size <= self.max_physic_offset:
                continue  # dispatched before (recovery re-dispatches from a safe point)
            expected = queue_offset * CQ_STORE_UNIT_SIZE
            current = self.queue.max_offset if self.queue.files else -1
            if pending:
                current = pending_at + len(pending)
            if current >= 0 and expected != current:
                if expected < current:
                    log.warning(
                        "%s: unit for queue offset %d arrives behind the queue end %d; ignored",
                        self.directory,
                        queue_offset,
                        current // CQ_STORE_UNIT_SIZE,
                    )
                    continue
                log.warning(
                    "%s: queue offsets %d..%d are missing; writing %d at its own position",
                    self.directory,
                    current // CQ_STORE_UNIT_SIZE,
                    queue_offset - 1,
                    queue_offset,
                )
                self._write(pending_at, pending)
                pending = bytearray()
            if not pending:
                pending_at = expected
            pending += UNIT.pack(physical_offset, size, tags_code)
            self.max_physic_offset = physical_offset + size
            written += size
            if (pending_at + len(pending)) % self.file_size == 0:  # a file is full: write it out
                self._write(pending_at, pending)
                pending = bytearray()
        if pending:
            self._write(pending_at, pending)
        return written

    def _write(self, at: int, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self.queue.files:
            self._create_first_file(at)
        position = at
        view = memoryview(data)
        while view:
            mapped_file = self.queue.last_file_for_append(position)
            if mapped_file.end_offset != position:
                if position < mapped_file.file_from_offset or position > mapped_file.file_from_offset + self.file_size:
                    raise AssertionError(f"{self.directory}: cannot write at {position} into {mapped_file}")
                mapped_file.wrote_position = position - mapped_file.file_from_offset
            room = min(len(view), mapped_file.remaining)
            mapped_file.append(view[:room])
            view = view[room:]
            position += room
        self.dirty = True
        self.unflushed_bytes += len(data)

    def _create_first_file(self, at: int) -> None:
        start = at - at % self.file_size
        mapped_file = self.queue.last_file_for_append(start)
        if at > start:
            mapped_file.append(BLANK_UNIT * ((at - start) // CQ_STORE_UNIT_SIZE))
        self.min_logic_offset = at

    # --- reading ----------------------------------------------------------------------------------------------

    def unit_at(self, queue_offset: int) -> tuple[int, int, int] | None:
        units = self.units(queue_offset, 1)
        return units[0] if units else None

    def units(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        """Up to `count` units from `queue_offset` (fewer at the end of a file or of the queue)."""
        if queue_offset < self.min_offset or queue_offset >= self.max_offset or count <= 0:
            return []
        start = queue_offset * CQ_STORE_UNIT_SIZE
        end = min(self.queue.max_offset, start + count * CQ_STORE_UNIT_SIZE)
        data = self.queue.read(start, end - start)
        return list(UNIT.iter_unpack(data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE]))

    def unit_array(self, queue_offset: int, count: int) -> np.ndarray:
        """The units in [queue_offset, queue_offset + count) as a UNIT_DTYPE array, across files; empty outside
        the queue."""
        start = max(queue_offset, self.min_offset) * CQ_STORE_UNIT_SIZE
        end = min(queue_offset + count, self.max_offset) * CQ_STORE_UNIT_SIZE
        parts = []
        while start < end:
            data = self.queue.read(start, end - start)
            data = data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE]
            if not data:
                break
            parts.append(data)
            start += len(data)
        return np.frombuffer(b"".join(parts), dtype=UNIT_DTYPE)

    # --- truncation, retention, flushing ----------------------------------------------------------------------

    def truncate_dirty_logic_files(self, physical_end: int) -> int:
        """Drop the units that point at or past `physical_end` (CommitLog truncated there); returns how many."""
        dropped = 0
        while self.max_offset > self.min_offset:
            last = self.unit_at(self.max_offset - 1)
            if last is None or last[0] + last[1] <= physical_end:
                break
            low, high = self.min_offset, self.max_offset - 1  # first unit whose end is past physical_end
            while low < high:
                middle = (low + high) // 2
                unit = self.unit_at(middle)
                if unit is not None and unit[0] + unit[1] > physical_end:
                    high = middle
                else:
                    low = middle + 1
            dropped = self.max_offset - low
            self._cut_at(low * CQ_STORE_UNIT_SIZE)
        if dropped:
            log.info("%s: dropped %d unit(s) beyond CommitLog offset %d", self.directory, dropped, physical_end)
        last_unit = self.unit_at(self.max_offset - 1) if self.max_offset > self.min_offset else None
        self.max_physic_offset = last_unit[0] + last_unit[1] if last_unit is not None else -1
        return dropped

    def _cut_at(self, byte_offset: int) -> None:
        files = self.queue.files
        while files and files[-1].file_from_offset > byte_offset:
            doomed = files.pop()
            doomed.close()
            doomed.destroy()
        if files:
            last = files[-1]
            position = byte_offset - last.file_from_offset
            if last.wrote_position > position:  # zeros, so the cut units do not come back on the next load
                last.write_at(position, bytes(last.wrote_position - position))
            last.wrote_position = min(last.wrote_position, position)
            last.flushed_position = min(last.flushed_position, position)
        self.queue.flushed_where = min(self.queue.flushed_where, byte_offset)

    def cut_to(self, queue_offset: int) -> None:
        """Drop the units from `queue_offset` on."""
        self._cut_at(max(queue_offset, self.min_offset) * CQ_STORE_UNIT_SIZE)
        last_unit = self.unit_at(self.max_offset - 1) if self.max_offset > self.min_offset else None
        self.max_physic_offset = last_unit[0] + last_unit[1] if last_unit is not None else -1

    def restart_at(self, queue_offset: int) -> None:
        """Drop every file (they hold only units below `queue_offset`); the next unit written creates the file
        holding `queue_offset`, which is then the queue's first offset."""
        files = self.queue.files
        while files:
            doomed = files.pop()
            doomed.close()
            doomed.destroy()
        self.min_logic_offset = queue_offset * CQ_STORE_UNIT_SIZE
        self.max_physic_offset = -1
        self.queue.flushed_where = 0

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Move the minimum to the first unit still in the CommitLog (correctMinOffset)."""
        low, high = self.min_offset, self.max_offset
        while low < high:
            middle = (low + high) // 2
            unit = self.unit_at(middle)
            if unit is not None and unit[0] >= commitlog_min_offset:
                high = middle
            else:
                low = middle + 1
        self.min_logic_offset = max(self.min_logic_offset, low * CQ_STORE_UNIT_SIZE)

    def delete_expired_files(self, commitlog_min_offset: int) -> int:
        """Delete files whose last unit points below the CommitLog's minimum (never the last file)."""
        count = 0
        for mapped_file in self.queue.files[:-1]:
            data = mapped_file.read(self.file_size - CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE)
            last_offset = UNIT.unpack(data)[0] if len(data) == CQ_STORE_UNIT_SIZE else -1
            if last_offset < commitlog_min_offset:
                count += 1
            else:
                break
        if count:
            self.queue.delete_first_files(count)
            self.min_logic_offset = max(self.min_logic_offset, self.queue.min_offset)
        self.correct_min_offset(commitlog_min_offset)
        return count

    def flush(self) -> None:
        """fdatasync every file written past its flushed position; a failure leaves the queue dirty."""
        if not self.dirty:
            return
        self.dirty = False
        self.unflushed_bytes = 0
        try:
            for mapped_file in self.queue.files:
                if mapped_file.flushed_position < mapped_file.wrote_position:
                    mapped_file.flush()
        except BaseException:
            self.dirty = True
            raise
        self.queue.flushed_where = self.queue.max_offset

    def unflushed(self) -> UnflushedUnits | None:
        """For a flush made by other means (one sync of the whole filesystem): what this queue has not flushed
        yet, taken now, or None when nothing. The queue counts as clean from here; `flushed` records the result, and
        a failed sync must mark it dirty again."""
        if not self.dirty:
            return None
        self.dirty = False
        self.unflushed_bytes = 0
        files = [(f, f.wrote_position) for f in self.queue.files if f.flushed_position < f.wrote_position]
        return UnflushedUnits(files, self.queue.max_offset)

    def flushed(self, unflushed: UnflushedUnits) -> None:
        """What `unflushed` took is durable."""
        for mapped_file, position in unflushed.files:
            mapped_file.flushed_position = max(mapped_file.flushed_position, position)
        self.queue.flushed_where = max(self.queue.flushed_where, unflushed.end)

    def close(self) -> None:
        self.queue.close()

    def destroy(self) -> None:
        """Delete the queue's files and directory (topic deletion)."""
        self.queue.close()
        for mapped_file in self.queue.files:
            mapped_file.destroy()
        self.queue.files = []
        with contextlib.suppress(OSError):
            self.directory.rmdir()
