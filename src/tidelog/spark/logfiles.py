"""Read-only access to Kafka-layout log directories, for readers that must not disturb a writer.

The storage engine takes an exclusive lock on its log directory and keeps writable memory maps of the index
files; a Spark executor reading segments while `tidelog serve` (or Kafka) appends to them can do neither. This
module only lists directories and reads files with `pread`:

- partitions are the `<topic>-<n>` directories (deleted and future ones skipped), segments the `<20 digits>.log`
  files in them; the log start offset is the larger of the first segment's base and the log-dir level
  `log-start-offset-checkpoint` entry;
- `.index` and `.timeindex` files are opened read-only with the storage engine's own OffsetIndex and TimeIndex
  (formats in offset_index.py, time_index.py) and their valid entries taken as numpy arrays: the active segment's
  index files are preallocated and zero-filled past the last entry, so only the written entries that keep the
  order appends keep are trusted; an index only narrows where a scan starts, so a short or damaged index costs
  time, never records;
- batches are walked with codec/batch_chain.py's ChainReader, in windows of whole batches read into numpy
  buffers; the log end offset is found by walking from the last index entry of the last segment to the last
  *complete* batch (a batch being written shows up as a partial tail and is not counted);
- a replica of a cluster's partition is read only up to its high watermark, from the log dir's
  `replication-offset-checkpoint` (written by a broker of a cluster, tidelog's or Kafka's): records above it may
  still be truncated away by a leader change, and a consumer of the broker never sees them either. The file is
  written every few seconds (replica.high.watermark.checkpoint.interval.ms), so the path lags the broker by as much;
  a log dir without the file (a single broker, where the log end is the high watermark) is read to its end;
- `PartitionFiles.read(start, end)` yields chunks of whole batches holding offsets [start, end), planned on the
  driver: bytes a writer appends later are never looked at, and a segment removed by retention in between
  raises DataLossError or is skipped, as `failOnDataLoss` says.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidelog.codec.batch_chain import ChainReader, batch_table
from tidelog.codec.batch_table import BatchTable
from tidelog.codec.record_framing import PADDING
from tidelog.codec.record_set import decode_batch, read_batch_info
from tidelog.errors import (
    CorruptCheckpointError,
    DataLossError,
    LogFilesError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.common.offset_checkpoint import read_offset_checkpoint
from tidelog.storage.kafka.checkpoints import LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT
from tidelog.storage.kafka.offset_index import OffsetIndex
from tidelog.storage.kafka.time_index import TimeIndex

PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
SEGMENT_LOG = re.compile(r"^(\d{20})\.log$")
FOREIGN_PARTITION_DIRS = {"__cluster_metadata-0"}
TAIL_SCAN_BYTES = 1 << 20


def data_loss_message(what: str) -> str:
    return (
        f"{what}. Some data may have been lost because it is not in the log any more: it was aged out by "
        "retention, or the topic was deleted before all its data was processed. If you don't want your query "
        'to fail in such cases, set the source option "failOnDataLoss" to "false".'
    )


@dataclass(frozen=True, slots=True)
class IndexEntries:
    """Trusted entries of one segment's offset index (absolute offsets) and time index."""

    offsets: np.ndarray  # int64, absolute last offset of the batch starting at `positions`
    positions: np.ndarray  # int64
    timestamps: np.ndarray  # int64
    time_offsets: np.ndarray  # int64, absolute


@dataclass(frozen=True, slots=True)
class Chunk:
    """Whole batches read from `path` at `file_position`, with their parsed table."""

    data: bytes | memoryview  # the batches, then spare bytes (the decoder's padding)
    table: BatchTable
    path: Path
    file_position: int

    def describe(self, position: int) -> str:
        """Names the batch at `position` of `data` by file and file byte, for error messages."""
        return f"{self.path}: batch at file byte {self.file_position + position}"


def _open_segment(path: Path) -> int | None:
    """A read-only descriptor of segment file `path`; None when it is gone (retention removed it since it was
    listed). Anything else that keeps it from being read is a LogFilesError naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LogFilesError(f"{path}: the segment file cannot be opened: {exc.strerror}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LogFilesError(f"{path}: not a regular file (a segment file was expected)")
    return fd


def _valid_arrays(index_class: type[OffsetIndex | TimeIndex], path: Path, base: int) -> tuple[np.ndarray, np.ndarray]:
    """An index file's valid entries (none when it is missing), opened read-only."""
    try:
        with index_class(path, base, writable=False) as index:
            return index.valid_arrays()
    except OSError as exc:
        raise LogFilesError(f"{path}: the index file cannot be read: {exc.strerror}") from exc


class PartitionFiles:
    """One partition directory, read without locks. Cheap to build; file contents are read on demand."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        checkpointed_start: int = 0,
        high_watermark: int | None = None,
    ) -> None:
        """`high_watermark`: the replica's checkpointed high watermark, when it is a cluster's replica."""
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.checkpointed_start = checkpointed_start
        self.high_watermark = high_watermark
        self._indexes: dict[int, IndexEntries] = {}

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    # --- files ---------------------------------------------------------------------------------------------

    def segment_bases(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            raise UnknownTopicOrPartitionError(
                f"partition directory {self.directory} is gone (the topic was deleted?)"
            ) from None
        return sorted(int(m.group(1)) for name in names if (m := SEGMENT_LOG.match(name)))

    def log_path(self, base: int) -> Path:
        return self.directory / f"{base:020d}.log"

    def index(self, base: int) -> IndexEntries:
        entries = self._indexes.get(base)
        if entries is None:
            entries = self._load_index(base)
            self._indexes[base] = entries
        return entries

    def _load_index(self, base: int) -> IndexEntries:
        offsets, positions = _valid_arrays(OffsetIndex, self.directory / f"{base:020d}.index", base)
        timestamps, time_offsets = _valid_arrays(TimeIndex, self.directory / f"{base:020d}.timeindex", base)
        return IndexEntries(offsets, positions, timestamps, time_offsets)

    def position_for(self, base: int, target_offset: int, file_size: int | None = None) -> int:
        """Byte position in segment `base` from which a scan reaches the batch holding `target_offset`."""
        entries = self.index(base)
        slot = int(np.searchsorted(entries.offsets, target_offset, side="right")) - 1
        while slot >= 0 and file_size is not None and entries.positions[slot] >= file_size:
            slot -= 1
        return int(entries.positions[slot]) if slot >= 0 else 0

    def end_position_for(self, base: int, end_offset: int, file_size: int) -> int:
        """A byte position in segment `base` at or after the end of the batch holding `end_offset - 1`.

        Entry (O, P) says the batch at P ends at O, so the second entry with O >= end_offset - 1 starts after it."""
        entries = self.index(base)
        slot = int(np.searchsorted(entries.offsets, end_offset - 1, side="left")) + 1
        if slot < len(entries.positions) and entries.positions[slot] <= file_size:
            return int(entries.positions[slot])
        return file_size

    # --- offsets -------------------------------------------------------------------------------------------

    def log_start_offset(self, bases: Sequence[int] | None = None) -> int:
        bases = self.segment_bases() if bases is None else bases
        if not bases:
            return self.checkpointed_start
        return max(bases[0], self.checkpointed_start)

    def readable_end_offset(self) -> int:
        """Where a reader stops: the log end, or the checkpointed high watermark of a cluster's replica if lower."""
        end = self.log_end_offset()
        return end if self.high_watermark is None else max(min(end, self.high_watermark), self.log_start_offset())

    def log_end_offset(self, bases: Sequence[int] | None = None) -> int:
        """One past the last offset of the last complete batch (Kafka's high watermark on a single node)."""
        bases = self.segment_bases() if bases is None else bases
        if not bases:
            return self.checkpointed_start
        for base in reversed(bases):  # an empty newest segment: its base is the end
            path = self.log_path(base)
            fd = _open_segment(path)
            if fd is None:
                continue
            try:
                size = os.fstat(fd).st_size
                position = self.position_for(base, 1 << 62, size)
                last = -1
                for _chunk, table, _position in _chunks(fd, path, position, size, TAIL_SCAN_BYTES):
                    last = int(table.last_offset[-1])  # a partial batch being written is not counted
                return max(last + 1, base)
            finally:
                os.close(fd)
        return bases[-1]

    def offset_for_timestamp(self, timestamp_ms: int, start_offset: int | None = None) -> int | None:
        """The first offset whose record timestamp is >= `timestamp_ms` (ListOffsets semantics), or None."""
        bases = self.segment_bases()
        log_start = self.log_start_offset(bases)
        start_offset = log_start if start_offset is None else max(start_offset, log_start)
        for slot, base in enumerate(bases):
            next_base = bases[slot + 1] if slot + 1 < len(bases) else None
            if next_base is not None and next_base <= start_offset:
                continue
            entries = self.index(base)
            if next_base is not None and len(entries.timestamps) and entries.timestamps[-1] < timestamp_ms:
                continue  # a rolled segment's last time-index entry is its largest timestamp
            found = self._find_in_segment(base, timestamp_ms, start_offset, entries)
            if found is not None:
                return found
        return None

    def _find_in_segment(self, base: int, timestamp_ms: int, start_offset: int, entries: IndexEntries) -> int | None:
        slot = int(np.searchsorted(entries.timestamps, timestamp_ms, side="right")) - 1
        indexed_offset = int(entries.time_offsets[slot]) if slot >= 0 else base
        path = self.log_path(base)
        fd = _open_segment(path)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            position = self.position_for(base, max(indexed_offset, start_offset), size)
            for chunk, table, _ in _chunks(fd, path, position, size, TAIL_SCAN_BYTES):
                last = table.last_offset
                hit = np.nonzero((table.max_timestamp >= timestamp_ms) & (last >= start_offset) & ~table.is_control)[0]
                for i in hit.tolist():
                    pos = int(table.position[i])
                    info = read_batch_info(chunk, pos)
                    if info is None:
                        continue
                    for record in decode_batch(chunk, info):
                        if (
                            record.offset >= start_offset
                            and record.timestamp_ms is not None
                            and record.timestamp_ms >= timestamp_ms
                        ):
                            return record.offset
            return None
        finally:
            os.close(fd)

    def split_points(self, start: int, end: int) -> list[int]:
        """Offsets in (start, end) at which a batch starts, known from index entries (cheap split boundaries)."""
        points: list[int] = []
        bases = self.segment_bases()
        for slot, base in enumerate(bases):
            next_base = bases[slot + 1] if slot + 1 < len(bases) else None
            if (next_base is not None and next_base <= start) or base >= end:
                continue
            if start < base:
                points.append(base)
            nexts = self.index(base).offsets + 1  # entry (O, P): the batch at P ends at O, the next starts after
            points += nexts[(nexts > start) & (nexts < end)].tolist()
        return sorted(set(points))

    # --- reading -------------------------------------------------------------------------------------------

    def read(self, start: int, end: int, *, fail_on_data_loss: bool, chunk_bytes: int = 16 << 20) -> Iterator[Chunk]:
        """Chunks of whole batches overlapping [start, end), in offset order (the caller filters records)."""
        bases = self.segment_bases()
        log_start = self.log_start_offset(bases)
        if start < log_start:
            if fail_on_data_loss:
                raise DataLossError(
                    data_loss_message(
                        f"{self.name}: offsets {start} to {min(end, log_start) - 1} planned for reading are below the "
                        f"log start offset {log_start}"
                    )
                )
            start = log_start
        if start >= end:
            return
        last_seen = start - 1
        for slot, base in enumerate(bases):
            next_base = bases[slot + 1] if slot + 1 < len(bases) else None
            if next_base is not None and next_base <= start:
                continue
            if base >= end:
                break
            path = self.log_path(base)
            fd = _open_segment(path)
            if fd is None:  # removed by retention since it was listed
                if fail_on_data_loss:
                    raise DataLossError(
                        data_loss_message(f"{self.name}: segment {path.name} was deleted while it was being read")
                    )
                continue
            try:
                size = os.fstat(fd).st_size
                position = self.position_for(base, max(start, base), size) if start > base else 0
                limit = self.end_position_for(base, end, size)
                for chunk, table, chunk_position in _chunks(fd, path, position, limit, chunk_bytes):
                    last = table.last_offset
                    yield Chunk(chunk, table, path, chunk_position)
                    last_seen = max(last_seen, int(last[-1]))
                    if last_seen >= end - 1:
                        return
            finally:
                os.close(fd)
        if last_seen < end - 1 and fail_on_data_loss:
            raise DataLossError(
                data_loss_message(
                    f"{self.name}: offsets up to {end - 1} were planned but the log ends at {last_seen} "
                    "(it was truncated or deleted since)"
                )
            )


def _chunks(
    fd: int, path: Path, position: int, size: int, chunk_bytes: int
) -> Iterator[tuple[bytes | memoryview, BatchTable, int]]:
    """Whole batches from `position` to `size`, about `chunk_bytes` at a time (a larger batch in a read of its own),
    each read with PADDING spare bytes after it, which lets the columnar decoder read its varint windows without
    copying the chunk. Stops at a partial tail (a batch being written, or torn); damage is a LogFilesError."""
    chain = ChainReader(fd, position, size, window=chunk_bytes, padding=PADDING)
    try:
        for window in chain:
            yield window.data, batch_table(window), window.position
    except OSError as exc:
        raise LogFilesError(f"{path}: reading at file byte {chain.position} failed: {exc.strerror}") from exc
    assert chain.stopped is not None
    if chain.stopped.stop.is_damage:
        raise LogFilesError(f"{path}: {chain.stopped}")


class LogFiles:
    """The partitions of one or more log directories (Kafka's `log.dirs`)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = [Path(p) for p in paths]
        for path in self.paths:
            if not path.is_dir():
                raise LogFilesError(
                    f"path '{path}' is not a directory (expected a tidelog or Kafka log directory, log.dirs)"
                )
            if (path / "commitlog").is_dir() and (path / "consumequeue").is_dir():
                raise LogFilesError(
                    f"path '{path}' is a store of the RocketMQ engine (commitlog/, consumequeue/): the path reader "
                    "reads Kafka-layout segment files only. Serve it with `tidelog serve --override "
                    "tidelog.storage.engine=rocketmq` and read it with the option kafka.bootstrap.servers"
                )
        self._start_offsets: dict[tuple[str, int], int] = {}
        self._high_watermarks: dict[tuple[str, int], int] = {}
        for path in self.paths:
            checkpoint = path / LOG_START_OFFSET_CHECKPOINT
            # Only a hint (written every minute): the first segment's base offset still bounds the log start.
            if checkpoint.exists():
                with contextlib.suppress(CorruptCheckpointError, OSError):
                    self._start_offsets.update(read_offset_checkpoint(checkpoint))
            replicated = path / REPLICATION_OFFSET_CHECKPOINT
            if replicated.exists():  # a cluster's replicas: read up to the high watermark only
                try:
                    self._high_watermarks.update(read_offset_checkpoint(replicated))
                except (CorruptCheckpointError, OSError) as exc:
                    raise LogFilesError(
                        f"{replicated}: {exc}; without it the replicas' high watermarks are unknown and records a "
                        "leader change may still remove could be read"
                    ) from exc

    def _partition_dirs(self) -> dict[tuple[str, int], Path]:
        found: dict[tuple[str, int], Path] = {}
        for path in self.paths:
            for entry in os.scandir(path):
                match = PARTITION_DIR.match(entry.name)
                if match is None or entry.name in FOREIGN_PARTITION_DIRS or not entry.is_dir():
                    continue
                found.setdefault((match["topic"], int(match["partition"])), Path(entry.path))
        return found

    def topics(self, include_internal: bool = True) -> dict[str, list[int]]:
        topics: dict[str, list[int]] = {}
        for topic, partition in self._partition_dirs():
            if include_internal or not topic.startswith("__"):
                topics.setdefault(topic, []).append(partition)
        return {topic: sorted(partitions) for topic, partitions in sorted(topics.items())}

    def partition(self, topic: str, partition: int) -> PartitionFiles:
        for path in self.paths:
            directory = path / f"{topic}-{partition}"
            if directory.is_dir():
                return PartitionFiles(
                    directory,
                    topic,
                    partition,
                    self._start_offsets.get((topic, partition), 0),
                    self._high_watermarks.get((topic, partition), 0 if self._high_watermarks else None),
                )
        raise UnknownTopicOrPartitionError(
            f"no partition directory {topic}-{partition} in {', '.join(str(p) for p in self.paths)}"
        )


def locate(paths: Sequence[str], topic: str, partition: int) -> PartitionFiles:
    """The partition's files without listing the whole log directory (what a task needs)."""
    return LogFiles(paths).partition(topic, partition)
