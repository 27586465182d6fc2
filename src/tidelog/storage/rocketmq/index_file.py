"""The message-key index: `index/<yyyyMMddHHmmssSSS>` files, an on-disk hash map from `topic#key` to CommitLog offsets
(RocketMQ's IndexFile, IndexHeader and IndexService, same layout and hashing).

One file, big-endian, sizes from tidelog.rocketmq.maxHashSlotNum / maxIndexNum (RocketMQ's defaults: 5,000,000 and
20,000,000, so 420,000,040 bytes):

    header   40 B   beginTimestamp i64 | endTimestamp i64 | beginPhyOffset i64 | endPhyOffset i64 |
                    hashSlotCount i32 | indexCount i32
    slots    maxHashSlotNum x 4 B     entry number of the newest entry of the bucket (0: empty)
    entries  maxIndexNum x 20 B       keyHash i32 | phyOffset i64 | timeDiff i32 | prevIndex i32

keyHash = abs(Java String.hashCode(key)) (0 for Integer.MIN_VALUE); bucket = keyHash % maxHashSlotNum. Entry numbers
start at 1 (indexCount starts at 1, entry 0 is never used), so a file holds maxIndexNum - 1 entries. A new entry
points at the bucket's previous head (prevIndex), and the slot points at the new entry: a query walks newest to
oldest. timeDiff is in seconds since the header's beginTimestamp (computed before the first entry sets it, as
RocketMQ does). Only the 4-byte hash is stored, so a query returns candidates; the caller reads each message and
keeps those whose topic and key really match (RocketMQ's client does the same, "maybe hash duplicate").

A file is named after the local time of its creation; a new file starts when the last one is full and inherits its
end timestamp and offset as its begin. Files are sparse: header and slots are allocated and written through the
mapping, entries are appended with one pwrite per dispatched batch (a full disk reports ENOSPC, not SIGBUS). A batch
is hashed and inserted at once (numpy): what putKey does key by key, chains included, gives the same bytes.
Derived data: after a crash, files whose end is past the checkpoint's indexMsgTimestamp are dropped and rebuilt
from the CommitLog (IndexService#load), and so is a file found shorter than its size (torn) with those after it;
`rebuild_from` says where re-indexing starts.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import mul
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tidelog.codec.rocketmq_message import (
    HASH_MASK,
    KEY_SEPARATOR,
    POW31,
    PROPERTY_KEY64,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_ROLLBACK,
    java_hash_and_units,
    java_string_hash,
    property_value,
)
from tidelog.errors import KafkaStorageError
from tidelog.storage.rocketmq.dispatcher import DispatchBatch

log = logging.getLogger("tidelog.storage.rocketmq")

INDEX_DIR = "index"
HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size  # 40
HASH_SLOT = struct.Struct(">i")
HASH_SLOT_SIZE = HASH_SLOT.size  # 4
ENTRY = struct.Struct(">iqii")
INDEX_SIZE = ENTRY.size  # 20
ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")])
INVALID_INDEX = 0
MAX_MSGS_NUM_BATCH = 64  # maxMsgsNumBatch: the most offsets one query returns
FILE_NAME = re.compile(r"^\d{17}$")
_INT_MAX = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
_FAST_UNITS = 512  # keys up to this many UTF-16 units are hashed with the table below
_POWERS = [pow(31, i, 1 << 32) for i in range(_FAST_UNITS, -1, -1)]  # 31^512 .. 31^0 (mod 2^32)


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: abs(String.hashCode()), and 0 where abs overflows (Integer.MIN_VALUE)."""
    return _positive(java_string_hash(key) & _MASK)


def _positive(unsigned_hash: int) -> int:
    """abs() of the int32 that `unsigned_hash` (mod 2^32) stands for, with Java's Integer.MIN_VALUE case."""
    if unsigned_hash & 0x80000000:
        return 0 if unsigned_hash == 0x80000000 else (1 << 32) - unsigned_hash
    return unsigned_hash


def index_key_hashes(prefix_hashes: np.ndarray | int, key_hashes: np.ndarray, key_units: np.ndarray) -> np.ndarray:
    """index_key_hash(prefix + key) of many keys at once, from String.hashCode mod 2^32 of each prefix and each key
    and the key's UTF-16 length: hash(prefix + key) = hash(prefix) * 31^len(key) + hash(key) (mod 2^32)."""
    signed = ((prefix_hashes * POW31[key_units] + key_hashes) & HASH_MASK).astype(np.uint32).view(np.int32)
    positive = np.abs(signed).astype(np.int64)  # Math.abs: Integer.MIN_VALUE stays negative, and becomes 0
    positive[positive < 0] = 0
    return positive


def _utf16_units(text: str) -> bytes | list[int]:
    if text.isascii():
        return text.encode("ascii")
    raw = text.encode("utf-16-be", "surrogatepass")
    return [(raw[i] << 8) | raw[i + 1] for i in range(0, len(raw), 2)]


class KeyHasher:
    """index_key_hash(topic + "#" + key) for many keys, faster: String.hashCode is a polynomial, so
    hash(prefix + key) = hash(prefix) * 31^len(key) + hash(key) (mod 2^32); the prefix's hash is computed once
    per topic, and each key's in C (a sum of products with precomputed powers of 31) rather than a Python loop."""

    def __init__(self) -> None:
        self._prefixes: dict[str, int] = {}

    def prefix(self, topic: str) -> int:
        """String.hashCode of `topic#`, mod 2^32."""
        prefix = self._prefixes.get(topic)
        if prefix is None:
            prefix = self._prefixes[topic] = java_string_hash(f"{topic}#") & _MASK
        return prefix

    def hash(self, topic: str, key: str) -> int:
        prefix = self.prefix(topic)
        units = _utf16_units(key)
        count = len(units)
        if count > _FAST_UNITS:
            return index_key_hash(f"{topic}#{key}")
        key_hash = sum(map(mul, units, _POWERS[_FAST_UNITS + 1 - count :]))  # 31^(count-1) .. 31^0
        return _positive((prefix * _POWERS[_FAST_UNITS - count] + key_hash) & _MASK)


def build_key(topic: str, key: str) -> str:
    """IndexService.buildKey."""
    return f"{topic}#{key}"


def message_index_keys(properties: bytes | bytearray | memoryview) -> list[str]:
    """The keys a message is indexed under (without the topic): UNIQ_KEY, then each space-separated KEYS entry; a
    Kafka key that is not plain text (KAFKA_KEY64) under the `base64:` form of codec.rocketmq_message.index_key."""
    keys: list[str] = []
    uniq_key = property_value(properties, PROPERTY_UNIQ_KEY)
    if uniq_key:
        keys.append(uniq_key)
    text = property_value(properties, PROPERTY_KEYS)
    if text:
        keys.extend(key for key in text.split(KEY_SEPARATOR) if key)
    key64 = property_value(properties, PROPERTY_KEY64)
    if key64:
        keys.append("base64:" + ("" if key64 == "-" else key64))
    return keys


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE


def time_to_file_name(ms: int) -> str:
    """UtilAll.timeMillisToHumanString: local time as yyyyMMddHHmmssSSS."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms / 1000)) + f"{ms % 1000:03d}"


@dataclass
class IndexHeader:
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def pack(self) -> bytes:
        return HEADER.pack(
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> IndexHeader:
        header = cls(*HEADER.unpack_from(data, 0))
        header.index_count = max(header.index_count, 1)  # IndexHeader.load
        return header


class IndexEntry(NamedTuple):
    key_hash: int
    phy_offset: int
    time_diff: int
    prev_index: int


class IndexFile:
    def __init__(
        self,
        path: Path,
        hash_slot_num: int,
        index_num: int,
        *,
        create: bool = False,
        end_phy_offset: int = 0,
        end_timestamp: int = 0,
        read_only: bool = False,
    ) -> None:
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self._entries_at = HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        if create:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.ftruncate(fd, self.file_size)
                _allocate(fd, self._entries_at)
            except OSError as exc:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise KafkaStorageError(f"cannot create index file {path}: {exc}") from exc
            self.header = IndexHeader()
            if end_phy_offset > 0:
                self.header.begin_phy_offset = self.header.end_phy_offset = end_phy_offset
            if end_timestamp > 0:
                self.header.begin_timestamp = self.header.end_timestamp = end_timestamp
        else:
            fd = os.open(path, os.O_RDONLY if read_only else os.O_RDWR)
            actual = os.fstat(fd).st_size
            if actual != self.file_size:
                os.close(fd)
                raise KafkaStorageError(
                    f"index file {path} is {actual} bytes long, but {hash_slot_num} hash slots and {index_num} "
                    f"entries make {self.file_size} (were tidelog.rocketmq.maxHashSlotNum or maxIndexNum changed?)"
                )
            self.header = IndexHeader.unpack(os.pread(fd, HEADER_SIZE, 0))
        self.fd = fd
        self.map = mmap.mmap(fd, self.file_size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE)
        if create:
            self._write_header()
        self._flushed_count = self.header.index_count if not create else 0
        self._closed = False

    def __repr__(self) -> str:
        return f"IndexFile({self.path.name}, entries={self.header.index_count - 1})"

    # --- writing ----------------------------------------------------------------------------------------------

    @property
    def is_write_full(self) -> bool:
        return self.header.index_count >= self.index_num

    def put_keys(self, key_hashes: np.ndarray, phy_offsets: np.ndarray, store_timestamps: np.ndarray) -> int:
        """Add entries (keyHash from index_key_hash, phyOffset, storeTimestamp; int64 arrays) in order, as
        IndexFile.putKey for each would; returns how many fit. Per batch: the slots the entries hash to are read at
        once, each entry's prevIndex is the entry before it in the batch with the same slot (a stable sort by slot),
        else the slot's head; the entries go to disk in one write, then the slots each group's last entry heads,
        then the header."""
        header = self.header
        count = header.index_count
        todo = max(0, min(len(key_hashes), self.index_num - count))
        if not todo:
            return 0
        key_hashes, phy_offsets, store_timestamps = key_hashes[:todo], phy_offsets[:todo], store_timestamps[:todo]
        numbers = np.arange(count, count + todo)
        slots = key_hashes % self.hash_slot_num
        heads = np.frombuffer(self.map, dtype=">i4", count=self.hash_slot_num, offset=HEADER_SIZE)
        previous = heads[slots].astype(np.int64)
        stale = (previous <= INVALID_INDEX) | (previous > count)
        if np.count_nonzero(stale):
            previous[stale] = INVALID_INDEX
        order = slots.argsort(kind="stable")
        sorted_slots = slots[order]
        follows = (sorted_slots[1:] == sorted_slots[:-1]).nonzero()[0] + 1  # same slot as the entry before it
        if len(follows):
            previous[order[follows]] = numbers[order[follows - 1]]
        entries = np.empty(todo, dtype=ENTRY_DTYPE)
        entries["key_hash"] = key_hashes
        entries["phy_offset"] = phy_offsets
        entries["prev_index"] = previous
        # timeDiff: seconds since beginTimestamp (Java's long division, clamped to [0, INT_MAX]); 0 while there is
        # none. The file's first entry sets beginTimestamp after its own timeDiff is computed.
        begin = header.begin_timestamp
        time_diff = np.zeros(todo, dtype=np.int64)
        if count <= 1:
            time_diff[0] = min(max((int(store_timestamps[0]) - begin) // 1000, 0), _INT_MAX) if begin > 0 else 0
            begin = int(store_timestamps[0])
            rest = slice(1, None)
        else:
            rest = slice(None)
        if begin > 0:
            time_diff[rest] = np.minimum(np.maximum((store_timestamps[rest] - begin) // 1000, 0), _INT_MAX)
        entries["time_diff"] = time_diff
        try:
            _pwrite_all(self.fd, entries.tobytes(), self._entries_at + count * INDEX_SIZE)
        except OSError as exc:
            raise KafkaStorageError(f"cannot write index file {self.path}: {exc}") from exc
        if len(follows):  # in sorted order, the last entry of each run of equal slots heads its slot
            ends_run = np.ones(todo, dtype=bool)
            ends_run[follows - 1] = False
            heads[sorted_slots[ends_run]] = numbers[order[ends_run]]
        else:
            heads[slots] = numbers
        del heads  # release the mapping's buffer export at once
        if count <= 1:
            header.begin_phy_offset = int(phy_offsets[0])
            header.begin_timestamp = int(store_timestamps[0])
        header.hash_slot_count += int(np.count_nonzero(previous == INVALID_INDEX))
        header.end_phy_offset = int(phy_offsets[-1])
        header.end_timestamp = int(store_timestamps[-1])
        header.index_count = count + todo
        self._write_header()
        return todo

    def _write_header(self) -> None:
        self.map[:HEADER_SIZE] = self.header.pack()

    def flush(self) -> bool:
        """fdatasync entries, slots and header; False when nothing was new."""
        if self._flushed_count == self.header.index_count:
            return False
        count = self.header.index_count
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise KafkaStorageError(f"cannot flush index file {self.path}: {exc}") from exc
        self._flushed_count = count
        return True

    # --- reading ----------------------------------------------------------------------------------------------

    def slot(self, slot_position: int) -> int:
        return HASH_SLOT.unpack_from(self.map, HEADER_SIZE + slot_position * HASH_SLOT_SIZE)[0]

    def entry(self, number: int) -> IndexEntry:
        return IndexEntry(*ENTRY.unpack_from(self.map, self._entries_at + number * INDEX_SIZE))

    def is_time_matched(self, begin: int, end: int) -> bool:
        """Does [begin, end] overlap [beginTimestamp, endTimestamp]? (IndexFile.isTimeMatched)"""
        b, e = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < b and end > e) or b <= begin <= e or b <= end <= e

    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int, found: list[int]) -> None:
        """Append to `found` (up to `max_num` in all) the offsets of entries whose hash is the key's and whose time
        (beginTimestamp + timeDiff seconds) is in [begin, end], newest first (IndexFile.selectPhyOffset)."""
        header = self.header
        count = header.index_count
        key_hash = index_key_hash(key)
        number = self.slot(key_hash % self.hash_slot_num)
        if number <= INVALID_INDEX or number > count or count <= 1:
            return
        while len(found) < max_num:
            key_hash_read, phy_offset, time_diff, prev_index = self.entry(number)
            if time_diff < 0:
                break
            time_read = header.begin_timestamp + time_diff * 1000
            if key_hash_read == key_hash and begin <= time_read <= end:
                found.append(phy_offset)
            if prev_index <= INVALID_INDEX or prev_index > count or prev_index == number or time_read < begin:
                break
            number = prev_index

    # --- life cycle -------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BufferError):
            self.map.close()
        os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _java_div(a: int, b: int) -> int:
    """Java's long division truncates toward zero."""
    q = abs(a) // b
    return q if a >= 0 else -q


def _pwrite_all(fd: int, data: bytes | bytearray, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _allocate(fd: int, size: int) -> None:
    """Reserve the blocks of the header and the slots, which are written through the mapping."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (95, 22):  # EOPNOTSUPP / EINVAL: no fallocate on this filesystem
            raise


def _indexes_at_or_past(header: IndexHeader, physical_end: int) -> bool:
    """Does a file hold (or inherit) entries for CommitLog offsets at or past `physical_end`?"""
    return header.end_phy_offset >= physical_end and (header.index_count > 1 or header.end_phy_offset > 0)


class QueryOffsetResult(NamedTuple):
    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


class IndexService:
    """The index files of one directory (`index/` of a store), oldest first; builds entries from dispatched
    messages and answers key queries."""

    def __init__(
        self,
        directory: Path,
        hash_slot_num: int,
        index_num: int,
        *,
        on_file_full: Callable[[int], None] | None = None,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        read_only: bool = False,
    ) -> None:
        self.directory = directory
        self.read_only = read_only  # offline tools: files opened read-only, never dropped
        self.hasher = KeyHasher()
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.files: list[IndexFile] = []
        self.lock = threading.RLock()
        self._on_file_full = on_file_full  # gets the end timestamp of a full file once it is on disk
        self._clock = clock
        # after newer files were dropped: (offset of the last message the kept files index, how many of its keys
        # they hold) - a message's keys may have been split between the last kept file and a dropped one
        self._resume: tuple[int, int] | None = None

    def load(self, *, clean_shutdown: bool, index_checkpoint_timestamp: int) -> None:
        """Open the files; after a crash, drop those that end past the checkpoint (IndexService#load). A file
        shorter than the configured size was cut: it and the files after it are dropped and rebuilt (a longer one
        was written with other sizes: refused). Read-only, a short file is skipped."""
        if not self.directory.is_dir():
            return
        file_size = index_file_size(self.hash_slot_num, self.index_num)
        with self.lock:
            paths = sorted(self.directory.iterdir())
            for position, path in enumerate(paths):
                if not FILE_NAME.match(path.name):
                    log.warning("%s: stray file %s is not an index file; leaving it alone", self.directory, path.name)
                    continue
                actual = path.stat().st_size
                if actual < file_size:
                    if self.read_only:
                        log.warning("index: %s is %d bytes long, not %d: skipped", path.name, actual, file_size)
                        continue
                    later = [p for p in paths[position:] if FILE_NAME.match(p.name)]
                    log.warning(
                        "index: %s is %d bytes long, not %d (cut short, or written with smaller sizes): dropping it "
                        "and the %d file(s) after it; they are rebuilt from the CommitLog",
                        path.name, actual, file_size, len(later) - 1,
                    )  # fmt: skip
                    for doomed in later:
                        doomed.unlink()
                    self._files_dropped_after_last()
                    break
                index_file = IndexFile(path, self.hash_slot_num, self.index_num, read_only=self.read_only)
                if (
                    not clean_shutdown
                    and not self.read_only
                    and index_file.header.end_timestamp > index_checkpoint_timestamp
                ):
                    log.info("index: dropping %s (it ends after the checkpoint); it is rebuilt", path.name)
                    index_file.destroy()
                    self._files_dropped_after_last()
                    continue
                self.files.append(index_file)

    def drop_newest(self) -> None:
        """Drop the file being written (after a crash of a store that keeps no index checkpoint)."""
        with self.lock:
            if self.files:
                doomed = self.files.pop()
                log.info("index: dropping %s, written when the last run stopped; it is rebuilt", doomed.path.name)
                doomed.destroy()
                self._files_dropped_after_last()

    def _files_dropped_after_last(self) -> None:
        """Newer files than the last one were dropped: note how many keys of its last message it holds."""
        self._resume = None
        last = self.files[-1] if self.files else None
        if last is None or last.header.index_count <= 1:
            return
        held, number = 0, last.header.index_count - 1
        while number > INVALID_INDEX and last.entry(number).phy_offset == last.header.end_phy_offset:
            held, number = held + 1, number - 1
        self._resume = (last.header.end_phy_offset, held)

    @property
    def last_indexed_offset(self) -> int:
        """The offset of the last message indexed (0 when none): where re-indexing a log starts reading."""
        with self.lock:
            return self.files[-1].header.end_phy_offset if self.files else 0

    @property
    def rebuild_from(self) -> int:
        """The CommitLog offset from which messages may be missing from the index."""
        with self.lock:
            if not self.files:
                return 0
            header = self.files[-1].header
            return header.end_phy_offset + (1 if header.index_count > 1 or header.end_phy_offset > 0 else 0)

    def drop_beyond(self, physical_end: int) -> None:
        """The CommitLog was cut at `physical_end`: drop the files holding entries at or past it (newest first)."""
        with self.lock:
            while self.files and _indexes_at_or_past(self.files[-1].header, physical_end):
                doomed = self.files.pop()
                log.info("index: dropping %s (it indexes CommitLog offsets past %d)", doomed.path.name, physical_end)
                doomed.destroy()
                self._files_dropped_after_last()

    # --- building ---------------------------------------------------------------------------------------------

    def build_index(self, batch: DispatchBatch) -> int:
        """Index a dispatched batch: `topic#UNIQ_KEY` and `topic#key` for each key (IndexService.buildIndex), all
        keys of the batch hashed at once (index_key_hashes). Messages already indexed (by CommitLog offset) and
        rolled-back transactions are skipped. Returns the number of entries written."""
        if not len(batch):
            return 0
        with self.lock:
            indexed_until = self.rebuild_from
            resume = self._resume
            key_hashes, key_units, key_counts = self._key_columns(batch)
            offsets = batch.offsets
            topics = {run.topic for run in batch.runs}
            if len(topics) == 1:
                prefixes: np.ndarray | int = self.hasher.prefix(topics.pop())
            else:
                prefixes = np.repeat(
                    np.array([self.hasher.prefix(run.topic) for run in batch.runs], dtype=np.uint64),
                    [int(key_counts[run.start : run.stop].sum()) for run in batch.runs],
                )
            hashes = index_key_hashes(prefixes, key_hashes, key_units)
            key_offsets = offsets.repeat(key_counts)
            key_timestamps = batch.store_timestamps.repeat(key_counts)
            if offsets[0] < indexed_until or np.count_nonzero(batch.sys_flags):  # else every key is indexed
                rolled_back = batch.sys_flags & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_ROLLBACK
                wanted = ((offsets >= indexed_until) & ~rolled_back).repeat(key_counts)
                if resume is not None and resume[0] < indexed_until:
                    # the message whose first keys the kept files hold: the others
                    (partly,) = (offsets == resume[0]).nonzero()[0][:1].tolist() or (None,)
                    if partly is not None and not rolled_back[partly]:
                        first = int(key_counts[:partly].sum())
                        wanted[first + resume[1] : first + int(key_counts[partly])] = True
                hashes, key_offsets, key_timestamps = hashes[wanted], key_offsets[wanted], key_timestamps[wanted]
            written = self.put_key_arrays(hashes, key_offsets, key_timestamps)
            if resume is not None and int(offsets[-1]) >= resume[0]:
                self._resume = None
            return written

    def _key_columns(self, batch: DispatchBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hashes, UTF-16 lengths, count per message) of the batch's index keys: as the appender computed them, or
        from the properties of messages read back from the CommitLog."""
        if batch.keys is not None:
            return batch.keys.hashed()
        keys = [message_index_keys(properties) for properties in batch.properties or ()]
        pairs = [java_hash_and_units(key) for message_keys in keys for key in message_keys]
        columns = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        counts = np.array([len(message_keys) for message_keys in keys], dtype=np.int64)
        return columns[:, 0].astype(np.uint64), columns[:, 1].copy(), counts

    def put_keys(self, keys: Sequence[tuple[int, int, int]]) -> int:
        """Add (keyHash, offset, timestamp) entries in order, starting new files as they fill up."""
        columns = np.array(keys, dtype=np.int64).reshape(-1, 3)
        return self.put_key_arrays(columns[:, 0], columns[:, 1], columns[:, 2])

    def put_key_arrays(self, key_hashes: np.ndarray, phy_offsets: np.ndarray, store_timestamps: np.ndarray) -> int:
        """put_keys with the entries as three int64 arrays."""
        done = 0
        while done < len(key_hashes):
            index_file = self._last_file_for_write()
            done += index_file.put_keys(key_hashes[done:], phy_offsets[done:], store_timestamps[done:])
        return done

    def _last_file_for_write(self) -> IndexFile:
        """getAndCreateLastIndexFile: the last file, or a new one when it is full (the full one is flushed first)."""
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_write_full:
            return last
        end_phy_offset = last.header.end_phy_offset if last is not None else 0
        end_timestamp = last.header.end_timestamp if last is not None else 0
        if last is not None:
            last.flush()
            if self._on_file_full is not None:
                self._on_file_full(last.header.end_timestamp)
        self.directory.mkdir(parents=True, exist_ok=True)
        now = self._clock()
        while True:  # two files created in the same millisecond: the later one takes the next free name
            path = self.directory / time_to_file_name(now)
            if not path.exists() and (last is None or path.name > last.path.name):
                break
            now += 1
        created = IndexFile(
            path,
            self.hash_slot_num,
            self.index_num,
            create=True,
            end_phy_offset=end_phy_offset,
            end_timestamp=end_timestamp,
        )
        self.files.append(created)
        return created

    # --- querying ---------------------------------------------------------------------------------------------

    def query_offsets(
        self, topic: str, key: str, max_num: int, begin: int, end: int, *, max_msgs_num_batch: int = MAX_MSGS_NUM_BATCH
    ) -> QueryOffsetResult:
        """Candidate CommitLog offsets for `topic#key` stored in [begin, end] ms, newest first, at most
        min(max_num, max_msgs_num_batch) (IndexService.queryOffset). Hash matches only: callers check the message."""
        max_num = min(max_num, max_msgs_num_batch)
        found: list[int] = []
        full_key = build_key(topic, key)
        with self.lock:
            files = self.files
            last_timestamp = files[-1].header.end_timestamp if files else 0
            last_offset = files[-1].header.end_phy_offset if files else 0
            for index_file in reversed(files):
                if index_file.is_time_matched(begin, end):
                    index_file.select_phy_offsets(full_key, max_num, begin, end, found)
                if index_file.header.begin_timestamp < begin or len(found) >= max_num:
                    break
        return QueryOffsetResult(found, last_timestamp, last_offset)

    # --- retention, flushing ----------------------------------------------------------------------------------

    def delete_expired_files(self, commitlog_min_offset: int) -> int:
        """Delete files (oldest first, never the last) whose end offset is below the CommitLog's minimum."""
        with self.lock:
            doomed = 0
            while doomed < len(self.files) - 1 and self.files[doomed].header.end_phy_offset < commitlog_min_offset:
                doomed += 1
            for index_file in self.files[:doomed]:
                log.info("index: deleting expired %s", index_file.path.name)
                index_file.destroy()
            self.files = self.files[doomed:]
            return doomed

    def flush(self) -> None:
        with self.lock:
            for index_file in self.files:
                index_file.flush()

    def close(self) -> None:
        with self.lock:
            for index_file in self.files:
                index_file.close()
            self.files = []

    def destroy(self) -> None:
        """Delete every file and the directory."""
        with self.lock:
            for index_file in self.files:
                index_file.destroy()
            self.files = []
            with contextlib.suppress(OSError):
                self.directory.rmdir()
