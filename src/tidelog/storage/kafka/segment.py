"""One segment of a partition log: `<base>.log` with its `<base>.index`, `<base>.timeindex` and, once it holds an
ABORT marker, `<base>.txnindex` (Kafka's LogSegment; txn_index.py).

The `.log` holds record batches back to back exactly as they were appended; file names carry the
segment's base offset as 20 zero-padded digits. Appends add a sparse index entry (last offset of the
appended set -> its start position, plus a time-index attempt) once more than `index.interval.bytes`
were written since the previous entry. Reads translate an offset to a position through the index and
a short forward scan of batch headers, and hand out file slices. The segment also remembers where its last
RECENT_APPEND_ENDS appends ended (the offset after each, and the byte its batch starts at): a read from one of those
offsets - a follower's fetch from its log end, a consumer at the tail - costs one header read, no index lookup and
no scan. Any truncation forgets them.

A read whose slice is sure to end within READ_AHEAD_BYTES of its start reads it with the first batch's header, in
one pread, and the slice carries those bytes (`FileSlice.head`): reading it costs no further system call. Sure, because
the read must stop that soon (the high watermark, the segment's end: a consumer or a follower at the tail), or
because the offset index names a batch that starts that soon after the first one, and the read asks for no more
bytes than lie before it (a read of one record: the first batch ends there at the latest). A read that may be longer
reads the header alone: reading ahead would copy bytes the slice may not need (a large one is sent with sendfile).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from tidelog.codec.batch_chain import ChainEnd, ChainReader, Stop, Window, check_stored
from tidelog.codec.record_batch import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    BatchHeader,
)
from tidelog.codec.record_set import decode_batch, peek_batch, read_batch_info
from tidelog.config import INT_MAX, LogConfig
from tidelog.errors import CorruptIndexError, CorruptRecordError, KafkaStorageError, TidelogError
from tidelog.storage.api import FileSlice
from tidelog.storage.common.file_handles import FileHandles, LazyFile, StoreFile
from tidelog.storage.kafka.index_block_cache import IndexBlockCache
from tidelog.storage.kafka.index_tails import IndexTails
from tidelog.storage.kafka.offset_index import OffsetIndex
from tidelog.storage.kafka.time_index import NO_TIMESTAMP, TimeIndex, TimestampOffset
from tidelog.storage.kafka.txn_index import SUFFIX as TXN_INDEX_SUFFIX
from tidelog.storage.kafka.txn_index import TransactionIndex

log = logging.getLogger("tidelog.storage")

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"  # the log cleaner's output, still being written
SWAP_SUFFIX = ".swap"  # a finished replacement waiting to be renamed into place
SCAN_CHUNK_BYTES = 64 * 1024
RECOVERY_CHUNK_BYTES = 8 * 1024 * 1024


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def offset_from_file_name(name: str) -> int:
    return int(name[: name.index(".")])


RECENT_APPEND_ENDS = 16  # append ends remembered for reads at the tail
READ_AHEAD_BYTES = 64 * 1024  # a slice sure to be this small is read with its first batch's header


class BatchLocation(NamedTuple):
    position: int
    size: int
    last_offset: int
    max_timestamp: int
    header: BatchHeader | None  # v2 batches only


class RecoveryResult(NamedTuple):
    truncated_bytes: int
    leader_epochs: list[tuple[int, int]]  # (epoch, first offset) in the order they appear
    reason: str | None


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        *,
        now_ms: int,
        file_suffix: str = "",
        handles: FileHandles | None = None,
        index_blocks: IndexBlockCache | None = None,
        index_tails: IndexTails | None = None,
    ) -> None:
        """`file_suffix` (CLEANED_SUFFIX) is appended to the file names of a segment being written aside. `handles`:
        the engine's open segment files; the segment's files join them while they are open (file_handles.py).
        `index_blocks`: the engine's cache of the index blocks lookups read (index_block_cache.py); `index_tails`: its
        writer of index entries kept in memory (index_tails.py)."""
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.handles = handles
        self.index_blocks = index_blocks
        self.index_tails = index_tails
        self._log = LazyFile(directory / (segment_file_name(base_offset, LOG_SUFFIX) + file_suffix), handles)
        try:
            self.size = os.stat(self._log.path).st_size
        except FileNotFoundError:  # a new segment: its .log exists from now on
            self.size = os.fstat(self._log.get().fileno()).st_size
        self.index = OffsetIndex(
            directory / (segment_file_name(base_offset, INDEX_SUFFIX) + file_suffix),
            base_offset,
            config.segment_index_bytes,
            handles=handles,
            blocks=index_blocks,
            tails=index_tails,
        )
        self.time_index = TimeIndex(
            directory / (segment_file_name(base_offset, TIME_INDEX_SUFFIX) + file_suffix),
            base_offset,
            config.segment_index_bytes,
            handles=handles,
            blocks=index_blocks,
            tails=index_tails,
        )
        self.txn_index = TransactionIndex(
            directory / (segment_file_name(base_offset, TXN_INDEX_SUFFIX) + file_suffix), handles
        )
        self.bytes_since_last_index_entry = 0
        self.max_timestamp_so_far = self.time_index.last_entry
        self.created_ms = now_ms
        self._rolling_based_timestamp: int | None = None
        self._append_ends: dict[int, int] = {}  # the offset after a recent append -> the byte its batch starts at
        jitter = config.segment_jitter_ms
        self.roll_jitter_ms = 0 if jitter == 0 else random.randrange(min(jitter, config.max_segment_ms))

    @property
    def log_path(self) -> Path:
        return self._log.path

    @property
    def file(self) -> StoreFile:
        """The open `.log` (opened now if it was let go): hold it for as long as its descriptor is used."""
        return self._log.get()

    # --- appending -------------------------------------------------------------------------------------------

    def append(
        self,
        chunks: Sequence[bytes | bytearray | memoryview],
        size: int,
        largest_offset: int,
        largest_timestamp: int,
        offset_of_largest_timestamp: int,
        first_batch_max_timestamp: int,
        verify: Callable[[], None] | None = None,
    ) -> None:
        """Write `chunks` (one or more whole batches, `size` bytes) at the end; all or nothing.

        `verify`, if given, runs after the write; if it raises, the bytes are cut off again and nothing
        counts (readers never saw them: `size` moves only after)."""
        position = self.size
        file = self._log.get()
        fd = file.fileno()
        try:
            written = os.pwritev(fd, chunks, position)
            while written < size:  # short writes are legal; finish from a flat copy (rare)
                flat = b"".join(bytes(c) for c in chunks)
                written += os.pwrite(fd, flat[written:], position + written)
            if verify is not None:
                verify()
        except OSError as exc:
            with contextlib.suppress(OSError):  # leave no partial batch behind if the disk allows it
                os.ftruncate(fd, position)
            raise KafkaStorageError(f"cannot append {size} bytes to {self.log_path}: {exc.strerror}") from exc
        except BaseException:
            os.ftruncate(fd, position)
            raise
        if position == 0:
            self._rolling_based_timestamp = first_batch_max_timestamp
        self.size = position + size
        self._append_ends[largest_offset + 1] = self.size
        if len(self._append_ends) > RECENT_APPEND_ENDS:
            del self._append_ends[next(iter(self._append_ends))]
        if largest_timestamp > self.max_timestamp_so_far.timestamp:
            self.max_timestamp_so_far = TimestampOffset(largest_timestamp, offset_of_largest_timestamp)
        if self.bytes_since_last_index_entry > self.config.index_interval_bytes:
            self.index.append(largest_offset, position)  # written now or with the tail (abstract_index.py)
            self.time_index.maybe_append(*self.max_timestamp_so_far)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size

    def should_roll(
        self, messages_size: int, max_timestamp_in_messages: int, max_offset_in_messages: int, now_ms: int
    ) -> bool:
        config = self.config
        reached_roll_ms = (
            self.time_waited_for_roll(now_ms, max_timestamp_in_messages) > config.max_segment_ms - self.roll_jitter_ms
        )
        return (
            self.size > config.segment_bytes - messages_size
            or (self.size > 0 and reached_roll_ms)
            or self.index.is_full()
            or self.time_index.is_full()
            or not self.can_convert_to_relative_offset(max_offset_in_messages)
        )

    def time_waited_for_roll(self, now_ms: int, max_timestamp_in_messages: int) -> int:
        """Record time since the segment's first batch when it has one, else wall-clock age (as Kafka)."""
        first = self.rolling_based_timestamp()
        if first is not None and first >= 0:
            return max_timestamp_in_messages - first
        return now_ms - self.created_ms

    def rolling_based_timestamp(self) -> int | None:
        if self._rolling_based_timestamp is None and self.size > 0:
            first = next(self.batch_locations(0), None)
            self._rolling_based_timestamp = first.max_timestamp if first else None
        return self._rolling_based_timestamp

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT_MAX

    # --- reading ---------------------------------------------------------------------------------------------

    def batch_locations(self, position: int, end: int | None = None) -> Iterator[BatchLocation]:
        """Headers of the batches from `position` (a batch start) to `end`; stops quietly at a partial tail and
        raises CorruptRecordError where the chain is damaged (batch_chain.py)."""
        file = self._log.get()  # held while the walk reads it
        chain = self._header_walk(file, position, end)
        for window in chain:
            for slot in range(len(window.positions)):
                yield _location(window, slot)
        self._raise_if_damaged(chain)

    def _header_walk(self, file: StoreFile, position: int, end: int | None = None) -> ChainReader:
        """The chain of `file` (the open .log, held by the caller for the walk) from `position` to `end` (default:
        the segment's size), walked over headers. The first read covers one index interval (a lookup expects its
        batch within it), each later one twice the one before, up to SCAN_CHUNK_BYTES; bodies that reach past a
        read are skipped unread."""
        first = self.config.index_interval_bytes + HEADER_SIZE
        end = self.size if end is None else end
        return ChainReader(file.fileno(), position, end, window=SCAN_CHUNK_BYTES, first_window=first, whole=False)

    def _raise_if_damaged(self, chain: ChainReader) -> None:
        assert chain.stopped is not None
        if chain.stopped.stop.is_damage:
            raise CorruptRecordError(f"{self.log_path}: {chain.stopped}")

    def translate_offset(self, target_offset: int, starting_position: int = 0) -> BatchLocation | None:
        """The first batch whose last offset >= target: an index lookup, then one header read when the entry after
        the lookup's names a batch that starts at or below the target (each index entry names the batch that ends at
        its offset), else a short walk over headers from the lookup's entry.

        An index entry that does not name a batch at or before its offset (the index file was damaged after it
        was trusted at open) is not followed: the lookup scans from `starting_position` instead."""
        return self._locate(target_offset, starting_position)[0]

    def _locate(
        self, target_offset: int, starting_position: int = 0, read_limit: int = 0, max_size: int = 0
    ) -> tuple[BatchLocation | None, bytes]:
        """`translate_offset`, and the bytes read from the batch's start with its header: all of the slice a read of
        `max_size` bytes that may not pass byte `read_limit` gives, when it is sure to end within READ_AHEAD_BYTES
        (b"" when a walk found the batch)."""
        position = self._append_ends.get(target_offset, -1)
        if starting_position <= position < self.size:  # the batch after a recent append: its header says the rest
            found, head = self._header_at(position, read_limit)
            if found is not None and found.last_offset >= target_offset:
                return found, head
        entry_offset, entry_position, indexed_offset, indexed_position, later_position = self.index.lookup_for_read(
            target_offset
        )
        if indexed_offset >= 0 and starting_position <= indexed_position < self.size:
            # the batch an entry names ends at its offset: if it also starts at or below the target, it holds it
            if max_size <= later_position - indexed_position < read_limit - indexed_position:
                read_limit = later_position  # the slice ends there at the latest: its batch ends there or before
            try:
                found, head = self._header_at(indexed_position, read_limit)
            except TidelogError:  # not a batch header: the walk below says what is wrong
                found = None
            if (
                found is not None
                and found.header is not None
                and found.last_offset == indexed_offset
                and found.header.base_offset <= target_offset
            ):
                return found, head
        position = max(entry_position, starting_position)
        if position > starting_position:
            try:
                return self._first_batch_to(target_offset, position, entry_offset), b""
            except TidelogError:
                log.warning(
                    "%s: entry (%d at byte %d) does not name a batch of the log; scanning the segment instead",
                    self.index.path,
                    entry_offset,
                    entry_position,
                )
        return self._first_batch_to(target_offset, starting_position), b""

    def _header_at(self, position: int, read_limit: int = 0) -> tuple[BatchLocation | None, bytes]:
        """The batch whose header is at `position`, if the segment holds all of it, and the bytes read from
        `position`: all up to `read_limit` when that is READ_AHEAD_BYTES away or less, else the header."""
        size = read_limit - position
        if size < HEADER_SIZE or size > READ_AHEAD_BYTES:
            size = HEADER_SIZE
        data = os.pread(self._log.get().fileno(), size, position)
        if len(data) >= HEADER_SIZE and data[MAGIC_OFFSET] == MAGIC_V2:  # the common case, without peek_batch's tuple
            header = BatchHeader._make(HEADER.unpack_from(data))
            size = header.batch_length + LOG_OVERHEAD
            if header.batch_length >= MIN_BATCH_LENGTH:
                if position + size > self.size:
                    return None, b""
                last_offset = header.base_offset + header.last_offset_delta
                return BatchLocation(position, size, last_offset, header.max_timestamp, header), data
        peeked = peek_batch(data, 0)
        if peeked is None or position + peeked.size > self.size:
            return None, b""
        return BatchLocation(position, peeked.size, peeked.last_offset, peeked.max_timestamp, peeked.header), data

    def _first_batch_to(
        self, target_offset: int, position: int, indexed_offset: int | None = None
    ) -> BatchLocation | None:
        """The first batch from `position` whose last offset >= target, or None. Given `indexed_offset`, the batch at
        `position` must end at or before it, else CorruptIndexError."""
        file = self._log.get()  # held while the walk reads it
        chain = self._header_walk(file, position)
        for window in chain:
            first = _location(window, 0)
            if indexed_offset is not None and first.last_offset > indexed_offset:
                raise CorruptIndexError(f"{self.log_path}: the batch at byte {position} ends after {indexed_offset}")
            indexed_offset = None
            found = _first_ending_at_or_after(window, first, target_offset)
            if found is not None:
                return found
        self._raise_if_damaged(chain)
        if indexed_offset is not None:
            raise CorruptIndexError(f"{self.log_path}: no batch starts at byte {position}")
        return None

    def read(
        self, start_offset: int, max_size: int, max_position: int | None = None, min_one_message: bool = True
    ) -> FileSlice | None:
        """A slice from the batch holding `start_offset`, at most `max_size` bytes (or one whole batch)."""
        limit = self.size if max_position is None else max_position
        location, head = self._locate(start_offset, 0, limit, max_size)
        if location is None:
            return None
        position = location.position
        length = location.size if min_one_message and location.size > max_size else max_size
        if length > limit - position:
            length = limit - position
        if length <= 0:
            return None
        log_file = self._log
        if len(head) < length:
            return FileSlice(log_file.get(), log_file.path, position, length)
        return FileSlice(log_file.get(), log_file.path, position, length, head[:length])

    def end_offset(self) -> int:
        """The offset after the last batch (the base offset when there is none): a walk from the last index entry."""
        last = self.base_offset - 1
        position = self.index.lookup(self.index.last_offset).position if self.index.entries else 0
        for location in self.batch_locations(position):
            last = location.last_offset
        return last + 1

    def read_batch_bytes(self, location: BatchLocation) -> bytes:
        return self.read_bytes(location.position, location.size)

    def read_bytes(self, position: int, size: int) -> bytes:
        file = self._log.get()
        return os.pread(file.fileno(), size, position)

    def find_offset_by_timestamp(self, target_timestamp: int, starting_offset: int) -> TimestampOffset | None:
        """First record with timestamp >= target and offset >= starting_offset, via the time index."""
        indexed = self.time_index.lookup(target_timestamp)
        start = self.translate_offset(max(indexed.offset, starting_offset))
        if start is None:
            return None
        for location in self.batch_locations(start.position):
            if location.max_timestamp < target_timestamp or location.last_offset < starting_offset:
                continue
            data = self.read_batch_bytes(location)
            info = read_batch_info(data, 0)
            if info is None:
                return None
            for record in decode_batch(data, info):
                if (
                    record.timestamp_ms is not None
                    and record.timestamp_ms >= target_timestamp
                    and record.offset >= starting_offset
                ):
                    return TimestampOffset(record.timestamp_ms, record.offset)
        return None

    def read_max_timestamp_record(self) -> TimestampOffset | None:
        """The first record carrying the segment's max timestamp (ListOffsets MAX_TIMESTAMP)."""
        target = self.max_timestamp_so_far
        if target.timestamp < 0:
            return None
        found = self.find_offset_by_timestamp(target.timestamp, self.base_offset)
        return found if found is not None and found.timestamp == target.timestamp else None

    @property
    def largest_timestamp(self) -> int:
        """Max record timestamp, or the file's mtime when the segment holds none (as Kafka's retention uses)."""
        if self.max_timestamp_so_far.timestamp >= 0:
            return self.max_timestamp_so_far.timestamp
        return self.last_modified_ms()

    # --- recovery --------------------------------------------------------------------------------------------

    def recover(self, previous_last_offset: int = -1) -> RecoveryResult:
        """Rescan the whole `.log`: check every batch (layout, CRC, offsets), rebuild both indexes,
        and truncate at the first invalid byte. Returns what was cut and the leader epochs seen. The transaction
        index is emptied: it needs the producers' state, so the loader rebuilds it (log_loader.py)."""
        self.index.reset()
        self.time_index.reset()
        self.txn_index.reset()
        interval = self.config.index_interval_bytes
        file = self._log.get()  # held while the scan reads it
        file_size = os.fstat(file.fileno()).st_size
        max_ts, max_ts_offset = NO_TIMESTAMP, self.base_offset
        indexed_ts = NO_TIMESTAMP
        offset_entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        epochs: list[tuple[int, int]] = []
        last_index_entry_position = 0
        last_offset = max(previous_last_offset, self.base_offset - 1)
        chain = ChainReader(file.fileno(), 0, file_size, window=RECOVERY_CHUNK_BYTES)
        failure: ChainEnd | None = None
        for window in chain:
            batches, failure = check_stored(window, last_offset, self.base_offset)
            for batch in batches:
                if batch.max_timestamp > max_ts:
                    max_ts, max_ts_offset = batch.max_timestamp, batch.last_offset
                if batch.position - last_index_entry_position > interval:
                    offset_entries.append((batch.last_offset, batch.position))
                    if max_ts > indexed_ts:
                        time_entries.append((max_ts, max_ts_offset))
                        indexed_ts = max_ts
                    last_index_entry_position = batch.position
                if batch.partition_leader_epoch >= 0 and (not epochs or batch.partition_leader_epoch > epochs[-1][0]):
                    epochs.append((batch.partition_leader_epoch, batch.base_offset))
            if batches:
                last_offset = batches[-1].last_offset
            if failure is not None:
                break
        stopped = failure or chain.stopped
        assert stopped is not None
        valid_bytes = stopped.position
        self.index.append_entries(offset_entries)
        self.time_index.append_entries(time_entries)
        truncated = file_size - valid_bytes
        if truncated:
            self.truncate_log_file(valid_bytes)
        self.max_timestamp_so_far = TimestampOffset(max_ts, max_ts_offset)
        self.time_index.maybe_append(max_ts, max_ts_offset, skip_full_check=True)
        self.bytes_since_last_index_entry = valid_bytes - last_index_entry_position
        self._rolling_based_timestamp = None
        return RecoveryResult(truncated, epochs, str(stopped) if stopped.stop is not Stop.END else None)

    def truncate_log_file(self, size: int) -> None:
        file = self._log.get()
        os.ftruncate(file.fileno(), size)
        self.size = size
        self._append_ends.clear()

    def truncate_to(self, offset: int) -> int:
        """Remove every batch from the one holding `offset` on; returns bytes removed."""
        location = self.translate_offset(offset)
        if location is None:
            return 0
        self.index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        removed = self.size - location.position
        self.truncate_log_file(location.position)
        self.bytes_since_last_index_entry = 0
        self._rolling_based_timestamp = None
        if self.max_timestamp_so_far.offset >= offset:
            self.max_timestamp_so_far = self.time_index.last_entry
        return removed

    # --- lifecycle -------------------------------------------------------------------------------------------

    def sanity_check(self) -> int | None:
        """Run before the indexes of a segment are trusted at open; raises CorruptIndexError (then both are rebuilt).
        Returns the last offset the segment holds (None when it holds no batch), which the walk finds anyway.

        Beyond each index's own checks: the offset index's last entry names a batch that starts at its position
        and ends at or before its offset, and the time index ends within the segment with an entry at least as
        late as the batches after the last offset-index entry (a cut time index loses its final max entry)."""
        self.index.sanity_check(self.size)
        self.time_index.sanity_check()
        self.txn_index.sanity_check()
        entry = self.index.entry_at(self.index.entries - 1) if self.index.entries else None
        last_offset: int | None = None
        tail_max_timestamp = NO_TIMESTAMP
        try:
            for location in self.batch_locations(0 if entry is None else entry.position):  # one walk over the tail
                if last_offset is None and entry is not None and location.last_offset > entry.offset:
                    break
                last_offset = location.last_offset
                tail_max_timestamp = max(tail_max_timestamp, location.max_timestamp)
        except TidelogError as exc:
            raise CorruptIndexError(f"{self.index.path}: its last entry leads to unreadable bytes ({exc})") from exc
        if entry is not None and last_offset is None:
            raise CorruptIndexError(
                f"{self.index.path}: last entry ({entry.offset} at byte {entry.position}) "
                "does not name a batch of the log"
            )
        checked_last = self.base_offset - 1 if last_offset is None else last_offset
        if self.time_index.entries and self.time_index.last_entry.offset > checked_last:
            raise CorruptIndexError(
                f"{self.time_index.path}: last entry names offset {self.time_index.last_entry.offset}, "
                f"beyond the segment's last offset {checked_last}"
            )
        if self.time_index.last_entry.timestamp < tail_max_timestamp:  # its final (max timestamp) entry is gone
            raise CorruptIndexError(
                f"{self.time_index.path}: ends at timestamp {self.time_index.last_entry.timestamp}, "
                f"below the timestamp {tail_max_timestamp} of a batch at the end of the segment"
            )
        return last_offset

    def on_become_inactive(self) -> None:
        """On roll: record the final max timestamp and trim both indexes to their entries."""
        self.time_index.maybe_append(*self.max_timestamp_so_far, skip_full_check=True)
        self.index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()

    def become_active(self) -> None:
        self.index.expand()
        self.time_index.expand()

    def flush(self, *, indexes: bool = True) -> None:
        try:
            file = self._log.get()
            os.fdatasync(file.fileno())
        except OSError as exc:
            raise KafkaStorageError(f"cannot flush {self.log_path}: {exc.strerror}") from exc
        if indexes:
            self.index.flush()
            self.time_index.flush()
            self.txn_index.flush()
        else:  # not synced, but in the files for tools that read them (dump-log, the Spark path reader)
            self.index.write_tail()
            self.time_index.write_tail()

    def last_modified_ms(self) -> int:
        file = self._log.get()
        return int(os.fstat(file.fileno()).st_mtime * 1000)

    def close(self) -> None:
        try:
            self.time_index.maybe_append(*self.max_timestamp_so_far, skip_full_check=True)
        except KafkaStorageError as exc:  # the next open's sanity check sees the final entry missing and rebuilds
            log.warning("%s; the time index is rebuilt at the next open", exc)
        self.index.close()
        self.time_index.close()
        self.txn_index.close()
        self._log.close()

    def rename_to_deleted(self) -> None:
        """First step of deletion: readers holding slices keep the open file; the name says it is going."""
        self.change_file_suffix(DELETED_SUFFIX)

    def change_file_suffix(self, suffix: str) -> None:
        """Rename the .log and its indexes to `<base>.<kind><suffix>` ("" = the final names); open files stay
        open, so readers holding slices are unaffected. The .log goes last: it is what loading looks at."""
        for index, kind in (
            (self.index, INDEX_SUFFIX),
            (self.time_index, TIME_INDEX_SUFFIX),
            (self.txn_index, TXN_INDEX_SUFFIX),
        ):
            index.rename(self.directory / (segment_file_name(self.base_offset, kind) + suffix))
        self._log.rename(self.directory / (segment_file_name(self.base_offset, LOG_SUFFIX) + suffix))

    def set_last_modified_ms(self, mtime_ms: int) -> None:
        os.utime(self.log_path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))

    def delete_files(self) -> None:
        self.index.delete()
        self.time_index.delete()
        self.txn_index.delete()
        self._log.close()
        self.log_path.unlink(missing_ok=True)


def _location(window: Window, slot: int) -> BatchLocation:
    """The `slot`th batch of a read of a header walk."""
    position = window.positions[slot]
    peeked = peek_batch(window.data, position)
    assert peeked is not None  # the walk holds its header
    return BatchLocation(
        window.position + position, window.sizes[slot], peeked.last_offset, peeked.max_timestamp, peeked.header
    )


def _first_ending_at_or_after(window: Window, first: BatchLocation, target_offset: int) -> BatchLocation | None:
    """The first batch of the read (`first` is its batch 0) whose last offset >= target, or None. Last offsets
    increase along the chain: batches 0, 1, 3, 7, ... are decoded until one ends at or after the target, then the
    last gap is halved, so a target near the start costs about as many header decodes as a walk would, one far off
    a logarithmic number."""
    last = len(window.positions) - 1
    before, probe = -1, 0  # batch `before` ends below the target (-1: none yet)
    found = first
    while found.last_offset < target_offset:
        if probe == last:
            return None
        before, probe = probe, min(last, 2 * probe + 1)
        found = _location(window, probe)
    while probe - before > 1:
        middle = (before + probe) // 2
        location = _location(window, middle)
        if location.last_offset < target_offset:
            before = middle
        else:
            probe, found = middle, location
    return found


def now_ms() -> int:
    return int(time.time() * 1000)
