"""The Kafka engine end to end on real files: layout, sparse indexes, rolls, appends, reads, timestamps, retention,
flushing, configuration, topics, stray files and data written by a real Kafka broker.

Everything on disk is checked with `struct` and the text of the files, independently of the engine's own readers;
producer bytes come from kafka-python's batch builder where a real client's bytes matter.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from crc32c import crc32c

import tidelog
from tidelog import Record
from tidelog.codec.compression import Compression, compress, decompress
from tidelog.codec.control_record import ControlRecordType, build_control_batch
from tidelog.codec.record_batch import build_batch
from tidelog.errors import (
    ConfigError,
    CorruptRecordError,
    CrcMismatchError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.api import StorageEngine
from tidelog.storage.kafka.batch_check import CRC_IN_PARALLEL_BYTES

with warnings.catch_warnings():  # kafka-python's import trips importlib.resources deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

TS = 1_700_000_000_000
HEADER = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2 header, 61 bytes
OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
LOG_NAME = re.compile(r"^\d{20}\.log$")
TOPIC_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")


# --- independent readers of the files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DiskBatch:
    position: int
    size: int
    base_offset: int
    last_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    count: int
    raw: bytes


def walk_batches(data: bytes) -> list[DiskBatch]:
    """Complete entries back to back (v2 batches; legacy entries get last offset = their offset field)."""
    batches = []
    pos = 0
    while pos + 17 <= len(data):
        offset, length = struct.unpack_from(">qi", data, pos)
        size = length + 12
        if pos + size > len(data):
            break
        magic = data[pos + 16]
        if magic == 2:
            fields = HEADER.unpack_from(data, pos)
            batch = DiskBatch(
                pos,
                size,
                offset,
                offset + fields[6],
                fields[2],
                magic,
                fields[4],
                fields[5],
                fields[7],
                fields[8],
                fields[12],
                data[pos : pos + size],
            )
        else:
            batch = DiskBatch(pos, size, offset, offset, -1, magic, 0, 0, -1, -1, 1, data[pos : pos + size])
        batches.append(batch)
        pos += size
    return batches


def read_index(path: Path) -> list[tuple[int, int]]:
    """(absolute offset, position) entries of a .index file."""
    base = int(path.name[:20])
    data = path.read_bytes()
    assert len(data) % 8 == 0, f"{path.name} is {len(data)} bytes"
    return [(base + rel, pos) for rel, pos in (OFFSET_ENTRY.unpack_from(data, i) for i in range(0, len(data), 8))]


def read_time_index(path: Path) -> list[tuple[int, int]]:
    """(timestamp, absolute offset) entries of a .timeindex file."""
    base = int(path.name[:20])
    data = path.read_bytes()
    assert len(data) % 12 == 0, f"{path.name} is {len(data)} bytes"
    return [(ts, base + rel) for ts, rel in (TIME_ENTRY.unpack_from(data, i) for i in range(0, len(data), 12))]


def segment_logs(partition_dir: Path) -> list[Path]:
    return sorted(p for p in partition_dir.iterdir() if LOG_NAME.match(p.name))


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Kafka's offset checkpoint text: version 0, a count, then `topic partition offset` lines."""
    text = path.read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines[0] == "0"
    assert int(lines[1]) == len(lines) - 2
    entries = {}
    for line in lines[2:]:
        topic, partition, offset = line.split(" ")
        entries[(topic, int(partition))] = int(offset)
    return entries


def kafka_python_batch(records: list[tuple[bytes | None, bytes | None, int, list]], codec: int = 0) -> bytes:
    """A batch as the kafka-python producer builds it (baseOffset 0, partitionLeaderEpoch 0)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 22,
    )
    for i, (key, value, timestamp, headers) in enumerate(records):
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=headers)
    return bytes(builder.build())


# --- engine helpers -----------------------------------------------------------------------------------------------


def open_engine(path: Path, *, background: bool = False, **config: object) -> StorageEngine:
    return tidelog.open(path, config=config, background=background)


def values(n: int, prefix: str = "v", size: int = 20) -> list[Record]:
    return [
        Record(f"{prefix}{i}".encode().ljust(size, b"."), key=f"k{i}".encode(), timestamp_ms=TS + i) for i in range(n)
    ]


def as_tuples(records: Iterator[Record] | list[Record]) -> list[tuple]:
    return [(r.offset, r.timestamp_ms, r.key, r.value, [tuple(h) for h in r.headers]) for r in records]


def log_snapshot(partition_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(partition_dir.iterdir()) if p.name.endswith(".log")}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


# =================================================================================================================
# layout
# =================================================================================================================


def test_layout_of_a_new_log(data_dir: Path) -> None:
    engine = open_engine(data_dir)
    description = engine.create_topic("orders", 3)
    assert TOPIC_ID.match(description.topic_id)
    assert len(base64.urlsafe_b64decode(description.topic_id + "==")) == 16

    for p in range(3):
        partition_dir = data_dir / f"orders-{p}"
        assert partition_dir.is_dir()
        assert (partition_dir / "partition.metadata").read_text() == f"version: 0\ntopic_id: {description.topic_id}\n"
        for suffix in (".log", ".index", ".timeindex"):
            assert (partition_dir / f"{0:020d}{suffix}").exists()

    engine.produce("orders", 1, values(3))
    epoch_checkpoint = data_dir / "orders-1" / "leader-epoch-checkpoint"
    assert epoch_checkpoint.read_text() == "0\n1\n0 0\n"
    engine.produce("orders", 1, values(2))
    assert epoch_checkpoint.read_text() == "0\n1\n0 0\n"  # same epoch: no new entry

    properties = {}
    for line in (data_dir / "meta.properties").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            properties[key] = value
    assert set(properties) == {"version", "cluster.id", "node.id", "directory.id"}
    assert properties["version"] == "1"
    assert properties["node.id"] == "1"
    assert TOPIC_ID.match(properties["cluster.id"])
    assert TOPIC_ID.match(properties["directory.id"])

    assert not (data_dir / ".kafka_cleanshutdown").exists()
    engine.close()

    assert (data_dir / ".kafka_cleanshutdown").exists()
    assert read_checkpoint(data_dir / "recovery-point-offset-checkpoint") == {
        ("orders", 0): 0,
        ("orders", 1): 5,
        ("orders", 2): 0,
    }
    assert read_checkpoint(data_dir / "log-start-offset-checkpoint") == {
        ("orders", 0): 0,
        ("orders", 1): 0,
        ("orders", 2): 0,
    }
    assert sorted(os.listdir(data_dir / "orders-1")) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
        "00000000000000000005.snapshot",  # producer state at the log end, written by the clean close
        "leader-epoch-checkpoint",
        "partition.metadata",
    ]
    # the closed segment's indexes are trimmed to their entries (here: none, plus the final time entry)
    assert (data_dir / "orders-1" / f"{0:020d}.index").stat().st_size == 0
    assert read_time_index(data_dir / "orders-1" / f"{0:020d}.timeindex") == [(TS + 2, 2)]

    reopened = open_engine(data_dir)
    try:
        assert not (data_dir / ".kafka_cleanshutdown").exists()
        assert reopened.topics()["orders"].topic_id == description.topic_id
        assert reopened.log_end_offset("orders", 1) == 5
    finally:
        reopened.close()
    assert (data_dir / ".kafka_cleanshutdown").exists()
    # meta.properties keeps its identity across opens
    assert (data_dir / "meta.properties").read_text().count(properties["cluster.id"]) == 1


def test_checkpoint_text_framing(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("b", 1)
        engine.create_topic("a", 2)
        engine.produce("a", 1, values(4))
        engine.produce("b", 0, values(1))
        engine.delete_records("a", 1, 2)
    text = (data_dir / "recovery-point-offset-checkpoint").read_text()
    assert text.startswith("0\n3\n")
    assert sorted(text.splitlines()[2:]) == ["a 0 0", "a 1 4", "b 0 1"]
    assert read_checkpoint(data_dir / "log-start-offset-checkpoint") == {("a", 0): 0, ("a", 1): 2, ("b", 0): 0}


# =================================================================================================================
# sparse index rule
# =================================================================================================================


def expected_index_entries(batches: list[DiskBatch], interval: int) -> tuple[list, list]:
    """Kafka's LogSegment.append rule, followed by the final time-index entry written on close."""
    offset_entries, time_entries = [], []
    since_last = 0
    max_ts, offset_of_max = -1, -1
    for batch in batches:
        if batch.max_timestamp > max_ts:
            max_ts, offset_of_max = batch.max_timestamp, batch.last_offset
        if since_last > interval:
            offset_entries.append((batch.last_offset, batch.position))
            if not time_entries or max_ts > time_entries[-1][0]:
                time_entries.append((max_ts, offset_of_max))
            since_last = 0
        since_last += batch.size
    if max_ts >= 0 and (not time_entries or max_ts > time_entries[-1][0]):
        time_entries.append((max_ts, offset_of_max))
    return offset_entries, time_entries


@pytest.mark.parametrize("interval", [0, 1, 150, 299, 300, 301, 1000, 4096])
def test_sparse_index_entries(data_dir: Path, interval: int) -> None:
    rng = random.Random(interval)
    with open_engine(data_dir, **{"log.index.interval.bytes": interval}) as engine:
        engine.create_topic("t", 1)
        for i in range(60):
            count = rng.randrange(1, 5)
            records = [
                Record(b"x" * rng.randrange(0, 120), key=b"k", timestamp_ms=TS + 10 * i + j) for j in range(count)
            ]
            engine.produce("t", 0, records)
    segment = data_dir / "t-0" / f"{0:020d}.log"
    batches = walk_batches(segment.read_bytes())
    assert len(batches) == 60
    offsets, times = expected_index_entries(batches, interval)
    assert read_index(segment.with_suffix(".index")) == offsets
    assert read_time_index(segment.with_suffix(".timeindex")) == times
    if interval < 4096:
        assert offsets, "the test should produce index entries"


def test_index_interval_is_strictly_greater(data_dir: Path) -> None:
    """Equal-size batches: with interval = 2 batches, the entry comes after 3 batches' worth of bytes."""
    batch = build_batch(values(1), now_ms=TS)
    size = len(batch)
    with open_engine(data_dir, **{"log.index.interval.bytes": 2 * size}) as engine:
        engine.create_topic("t", 1)
        for _ in range(10):
            engine.append("t", 0, batch)
    # bytes since the last entry before each append: 0, s, 2s, 3s (entry; the counter restarts with this
    # batch's own size) s, 2s, 3s (entry) ...: equal to the interval is not enough
    assert read_index(data_dir / "t-0" / f"{0:020d}.index") == [(3, 3 * size), (6, 6 * size), (9, 9 * size)]


def test_index_entries_point_at_batch_starts_with_multi_record_batches(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.index.interval.bytes": 0}) as engine:
        engine.create_topic("t", 1)
        for i in range(10):
            engine.produce("t", 0, values(5, prefix=f"b{i}-"))
    segment = data_dir / "t-0" / f"{0:020d}.log"
    batches = walk_batches(segment.read_bytes())
    # every batch but the first gets an entry: its LAST offset and its START position
    assert read_index(segment.with_suffix(".index")) == [(b.last_offset, b.position) for b in batches[1:]]
    assert [o for o, _ in read_index(segment.with_suffix(".index"))] == [9, 14, 19, 24, 29, 34, 39, 44, 49]


# =================================================================================================================
# rolls
# =================================================================================================================


def test_roll_on_segment_bytes(data_dir: Path) -> None:
    segment_bytes = 1000
    rng = random.Random(7)
    batches = [build_batch(values(rng.randrange(1, 4), size=rng.randrange(10, 150)), now_ms=TS) for _ in range(40)]
    # Kafka: roll when size > segment.bytes - incoming size
    expected_bases, expected_sizes = [0], [0]
    next_offset = 0
    for batch in batches:
        count = struct.unpack_from(">i", batch, 57)[0]
        if expected_sizes[-1] > segment_bytes - len(batch):
            expected_bases.append(next_offset)
            expected_sizes.append(0)
        expected_sizes[-1] += len(batch)
        next_offset += count
    with open_engine(data_dir, **{"log.segment.bytes": segment_bytes}) as engine:
        engine.create_topic("t", 1)
        for batch in batches:
            engine.append("t", 0, batch)
        partition_log = engine.partition_log("t", 0)
        assert [s.base_offset for s in partition_log.segments] == expected_bases
    logs = segment_logs(data_dir / "t-0")
    assert [p.name for p in logs] == [f"{b:020d}.log" for b in expected_bases]
    assert [p.stat().st_size for p in logs] == expected_sizes
    assert all(size <= segment_bytes for size in expected_sizes)
    for path in logs:  # each segment starts at its base offset
        assert walk_batches(path.read_bytes())[0].base_offset == int(path.name[:20])


def test_batch_larger_than_segment_bytes_gets_its_own_segment(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.segment.bytes": 200}) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, values(1))
        engine.produce("t", 0, [Record(b"x" * 500, timestamp_ms=TS)])
        engine.produce("t", 0, values(1))
        assert [s.base_offset for s in engine.partition_log("t", 0).segments] == [0, 1, 2]
        assert [r.value for r in engine.consume("t", 0)][1] == b"x" * 500


def test_roll_on_segment_ms_uses_record_timestamps(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.roll.ms": 1000}) as engine:
        engine.create_topic("t", 1)

        def produce_at(timestamp: int) -> None:
            engine.produce("t", 0, [Record(b"v", timestamp_ms=timestamp)])

        partition_log = engine.partition_log("t", 0)
        produce_at(TS)  # offset 0
        produce_at(TS + 500)
        produce_at(TS + 1000)  # 1000 is not > 1000: same segment
        produce_at(TS - 50_000)  # older timestamps never roll
        assert [s.base_offset for s in partition_log.segments] == [0]
        produce_at(TS + 1001)  # offset 4: 1001 ms after the segment's first batch
        assert [s.base_offset for s in partition_log.segments] == [0, 4]
        produce_at(TS + 1500)
        produce_at(TS + 2001)
        assert [s.base_offset for s in partition_log.segments] == [0, 4]
        produce_at(TS + 2002)  # offset 7: 1001 after TS+1001
        assert [s.base_offset for s in partition_log.segments] == [0, 4, 7]
        time.sleep(0.01)
        produce_at(TS + 2100)  # wall-clock age does not matter while records carry timestamps
        assert [s.base_offset for s in partition_log.segments] == [0, 4, 7]


def test_roll_on_segment_ms_topic_override(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1, configs={"segment.ms": 60_000})
        for ts in (TS, TS + 30_000, TS + 120_000, TS + 121_000):
            engine.produce("t", 0, [Record(b"v", timestamp_ms=ts)])
        assert [s.base_offset for s in engine.partition_log("t", 0).segments] == [0, 2]


def test_close_timestamps_do_not_roll(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.roll.ms": 10_000}) as engine:
        engine.create_topic("t", 1)
        for i in range(50):
            engine.produce("t", 0, [Record(b"v", timestamp_ms=TS + i * 100)])
        assert len(engine.partition_log("t", 0).segments) == 1


def test_roll_when_time_index_is_full(data_dir: Path) -> None:
    # 48 bytes: 6 offset-index entries, 4 time-index slots of which one is reserved -> full at 3 entries
    config = {"log.index.size.max.bytes": 48, "log.index.interval.bytes": 0}
    with open_engine(data_dir, **config) as engine:
        engine.create_topic("t", 1)
        size = len(build_batch([Record(b"v", timestamp_ms=TS)]))
        for i in range(9):
            engine.produce("t", 0, [Record(b"v", timestamp_ms=TS + i)])  # growing timestamps
        partition_log = engine.partition_log("t", 0)
        # appends 2, 3, 4 add entries (none for the first batch); the 5th finds the time index full
        assert [s.base_offset for s in partition_log.segments] == [0, 4, 8]
        partition_dir = data_dir / "t-0"
        first = partition_dir / f"{0:020d}.log"
        # the rolled segment's indexes are trimmed to their entries at once
        assert first.with_suffix(".index").stat().st_size == 3 * 8
        assert first.with_suffix(".timeindex").stat().st_size == 3 * 12
        assert read_index(first.with_suffix(".index")) == [(1, size), (2, 2 * size), (3, 3 * size)]
        assert read_time_index(first.with_suffix(".timeindex")) == [(TS + 1, 1), (TS + 2, 2), (TS + 3, 3)]
        # the active segment's indexes stay preallocated
        active = partition_dir / f"{8:020d}.index"
        assert active.stat().st_size == 48
        assert active.with_suffix(".timeindex").stat().st_size == 48


def test_roll_when_offset_index_is_full(data_dir: Path) -> None:
    config = {"log.index.size.max.bytes": 48, "log.index.interval.bytes": 0}
    with open_engine(data_dir, **config) as engine:
        engine.create_topic("t", 1)
        for _ in range(16):
            engine.produce("t", 0, [Record(b"v", timestamp_ms=TS)])  # one timestamp: one time-index entry
        partition_log = engine.partition_log("t", 0)
        # entries for appends 2..7 fill 6 slots; the 8th append rolls
        assert [s.base_offset for s in partition_log.segments] == [0, 7, 14]
        rolled = data_dir / "t-0" / f"{7:020d}.index"
        assert rolled.stat().st_size == 6 * 8
        assert [o for o, _ in read_index(rolled)] == [8, 9, 10, 11, 12, 13]
        # (max timestamp so far, offset of the batch that first reached it): the segment's first batch
        assert read_time_index(rolled.with_suffix(".timeindex")) == [(TS, 7)]


def test_roll_on_relative_offset_overflow(data_dir: Path) -> None:
    """Index entries hold offsets relative to the segment's base as int32: an append whose last offset lies more than
    2^31-1 past the base rolls first. Offsets jump that far only through a batch standing for a range larger than
    its records (a compacted copy: empty, lastOffsetDelta 2^31-1), which only the broker itself appends."""
    int_max = 2**31 - 1
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"first", timestamp_ms=TS)])
        partition_log = engine.partition_log("t", 0)
        gap = build_batch([], last_offset_delta=int_max)
        result = partition_log.append(gap, from_client=False)
        assert (result.base_offset, result.last_offset) == (1, 2**31)  # 2^31 past base 0: rolled at 1 first
        assert engine.produce("t", 0, [Record(b"after", timestamp_ms=TS)]) == 2**31 + 1  # 2^31 past 1: rolled
        assert [s.base_offset for s in partition_log.segments] == [0, 1, 2**31 + 1]
        assert [(r.offset, r.value) for r in engine.consume("t", 0)] == [(0, b"first"), (2**31 + 1, b"after")]
    assert sorted(p.name for p in (data_dir / "t-0").glob("*.log")) == [
        f"{0:020d}.log",
        f"{1:020d}.log",
        f"{2**31 + 1:020d}.log",
    ]
    with open_engine(data_dir) as engine:  # and the indexes of each segment load and sanity-check
        assert [r.offset for r in engine.consume("t", 0, 2**31 + 1)] == [2**31 + 1]


def dirty_page_count(path: Path) -> int:
    """Pages of `path` the page cache holds but has not written to the disk (KPF_DIRTY in /proc/kpageflags for each
    page of a read-only mapping): what an fsync leaves at 0. Skips the test where the kernel does not tell."""
    import mmap

    import numpy as np

    try:
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
        page_flags = os.open("/proc/kpageflags", os.O_RDONLY)
    except OSError as exc:
        pytest.skip(f"page flags are not readable here: {exc}")
    try:
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ)
        pages = np.frombuffer(mapped, dtype=np.uint8)
        first_page = pages.ctypes.data // mmap.PAGESIZE
        dirty = 0
        for page in range(-(-len(pages) // mmap.PAGESIZE)):
            int(pages[page * mmap.PAGESIZE])  # map it in
            entry = int.from_bytes(os.pread(pagemap, 8, (first_page + page) * 8), "little")
            frame = entry & ((1 << 55) - 1)
            if not frame:
                pytest.skip("page frame numbers are hidden (no CAP_SYS_ADMIN)")
            dirty += (int.from_bytes(os.pread(page_flags, 8, frame * 8), "little") >> 4) & 1
        del pages
        mapped.close()
        return dirty
    finally:
        os.close(pagemap)
        os.close(page_flags)


def test_a_roll_fsyncs_the_old_segment(data_dir: Path) -> None:
    """Kafka flushes a segment when it rolls (in the background): its pages in the page cache are written out, and
    the recovery point, then its checkpoint, move to the new segment's base."""
    config = {"log.segment.bytes": 4000, "log.flush.offset.checkpoint.interval.ms": 50}
    with open_engine(data_dir, background=True, **config) as engine:
        engine.create_topic("t", 1)
        partition_log = engine.partition_log("t", 0)
        engine.produce("t", 0, values(20))
        first = partition_log.active_segment.log_path
        assert dirty_page_count(first) > 0  # appends alone leave the pages to the OS
        assert partition_log.recovery_point == 0
        while len(partition_log.segments) == 1:
            engine.produce("t", 0, values(20))
        rolled_at = partition_log.segments[1].base_offset
        deadline = time.monotonic() + 10
        while read_checkpoint_or_none(data_dir / "recovery-point-offset-checkpoint") != {("t", 0): rolled_at}:
            assert time.monotonic() < deadline, "the rolled segment was not flushed"
            time.sleep(0.02)
        assert partition_log.recovery_point == rolled_at
        assert dirty_page_count(first) == 0
        assert dirty_page_count(partition_log.active_segment.log_path) > 0  # the new segment is left to the OS


def test_appends_leave_their_fsyncs_to_the_background(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first append to a partition (a new leader epoch for the leader-epoch checkpoint) and appends that roll
    (a producer snapshot at the new base) fsync nothing on the appending thread, the broker's event loop: the
    scheduler's thread makes both durable, each before the recovery point passes the offsets it covers. Observed
    with a wrapper around the real os.fsync and os.fdatasync that records the thread, the file and the recovery
    point of each call."""
    calls: list[tuple[str, str, int]] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def recorded(real: Callable[[int], None]) -> Callable[[int], None]:
        def call(fd: int) -> None:
            calls.append(
                (threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}"), partition_log.recovery_point)
            )
            real(fd)

        return call

    with open_engine(data_dir, background=True, **{"log.segment.bytes": 4000}) as engine:
        engine.create_topic("t", 1)
        partition_log = engine.partition_log("t", 0)
        monkeypatch.setattr(os, "fsync", recorded(real_fsync))
        monkeypatch.setattr(os, "fdatasync", recorded(real_fdatasync))
        producer = 7
        sequence = 0
        while len(partition_log.segments) < 3:
            records = values(20)
            engine.append("t", 0, build_batch(records, producer_id=producer, producer_epoch=0, base_sequence=sequence))
            sequence += len(records)
        appending_thread = threading.current_thread().name
        assert [c for c in calls if c[0] == appending_thread] == []
        rolled_at = partition_log.segments[2].base_offset
        deadline = time.monotonic() + 10
        while partition_log.recovery_point < rolled_at:
            assert time.monotonic() < deadline, "the rolled segments were not flushed"
            time.sleep(0.01)
        partition_dir = str(data_dir / "t-0")
        for base in (s.base_offset for s in partition_log.segments[1:]):
            snapshot = f"{partition_dir}/{base:020d}.snapshot"
            assert os.path.exists(snapshot)
            first = next(c for c in calls if c[1] == snapshot)
            assert first[0] != appending_thread and first[2] < base  # durable before the recovery point passed it
        epochs = next(c for c in calls if c[1] == f"{partition_dir}/leader-epoch-checkpoint.tmp")
        assert epochs[0] != appending_thread and epochs[2] == 0
        assert (data_dir / "t-0" / "leader-epoch-checkpoint").read_text() == "0\n1\n0 0\n"


def read_checkpoint_or_none(path: Path) -> dict[tuple[str, int], int] | None:
    return read_checkpoint(path) if path.exists() else None


def test_rolled_segment_indexes_trimmed_and_named_by_base_offset(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.segment.bytes": 600, "log.index.interval.bytes": 100}) as engine:
        engine.create_topic("t", 1)
        for i in range(30):
            engine.produce("t", 0, values(2, prefix=f"r{i}-"))
        partition_log = engine.partition_log("t", 0)
        bases = [s.base_offset for s in partition_log.segments]
        assert len(bases) > 3
        partition_dir = data_dir / "t-0"
        for base in bases[:-1]:
            log_path = partition_dir / f"{base:020d}.log"
            batches = walk_batches(log_path.read_bytes())
            assert batches[0].base_offset == base
            index = read_index(log_path.with_suffix(".index"))
            assert log_path.with_suffix(".index").stat().st_size == len(index) * 8
            starts = {b.position: b.last_offset for b in batches}
            assert all(starts.get(position) == offset for offset, position in index)
            times = read_time_index(log_path.with_suffix(".timeindex"))
            assert times[-1][0] == max(b.max_timestamp for b in batches)  # the final entry of the roll
        assert bases[1:] == [int(p.name[:20]) for p in segment_logs(partition_dir)][1:]


def test_manual_roll_of_empty_active_segment_is_a_no_op(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        partition_log = engine.partition_log("t", 0)
        partition_log.roll()
        assert [s.base_offset for s in partition_log.segments] == [0]
        engine.produce("t", 0, values(3))
        partition_log.roll()
        partition_log.roll()
        assert [s.base_offset for s in partition_log.segments] == [0, 3]


# =================================================================================================================
# append
# =================================================================================================================


def test_append_rewrites_only_base_offset_and_leader_epoch(data_dir: Path) -> None:
    produced = [
        kafka_python_batch([(b"k1", b"v1", TS, []), (None, b"v2", TS + 1, [("h", b"x")])]),
        kafka_python_batch([(b"k3", None, TS + 2, [("a", None), ("b", b"")])], codec=1),
        kafka_python_batch([(b"k%d" % i, b"v" * i, TS + 3 + i, []) for i in range(5)], codec=2),
    ]
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        results = [engine.append("t", 0, batch) for batch in produced]
    assert [(r.base_offset, r.last_offset, r.record_count) for r in results] == [(0, 1, 2), (2, 2, 1), (3, 7, 5)]
    assert all(r.log_append_time_ms == -1 for r in results)
    on_disk = walk_batches((data_dir / "t-0" / f"{0:020d}.log").read_bytes())
    assert len(on_disk) == 3
    for batch, sent, result in zip(on_disk, produced, results, strict=True):
        assert batch.size == len(sent) == result.size_in_bytes
        assert batch.raw[:8] == struct.pack(">q", result.base_offset)
        assert batch.raw[12:16] == struct.pack(">i", 0)  # the leader's epoch
        assert batch.raw[8:12] == sent[8:12]
        assert batch.raw[16:] == sent[16:]
        assert crc32c(batch.raw[21:]) == batch.crc  # the CRC is still valid


def test_append_from_java_style_producer_with_leader_epoch_minus_one(data_dir: Path) -> None:
    sent = build_batch(values(3), now_ms=TS)  # PLE -1 as the Java producer sends it
    assert sent[12:16] == b"\xff\xff\xff\xff"
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, values(2))
        engine.append("t", 0, sent)
    stored = walk_batches((data_dir / "t-0" / f"{0:020d}.log").read_bytes())[1]
    assert stored.base_offset == 2
    assert stored.partition_leader_epoch == 0
    assert stored.raw[16:] == sent[16:]


def test_log_append_time_topic(data_dir: Path) -> None:
    old = TS - 10**9
    sent = kafka_python_batch([(b"a", b"1", old, []), (b"b", b"2", old + 5, [])])
    with open_engine(data_dir) as engine:
        engine.create_topic("lat", 1, configs={"message.timestamp.type": "LogAppendTime"})
        before = int(time.time() * 1000)
        result = engine.append("lat", 0, sent)
        after = int(time.time() * 1000)
        assert before <= result.log_append_time_ms <= after
        records = list(engine.consume("lat", 0))
        assert [r.timestamp_ms for r in records] == [result.log_append_time_ms] * 2
        assert [r.value for r in records] == [b"1", b"2"]
        found = engine.offset_for_timestamp("lat", 0, result.log_append_time_ms)
        assert found is not None
        assert found.offset == 0
    stored = walk_batches((data_dir / "lat-0" / f"{0:020d}.log").read_bytes())[0]
    assert stored.attributes & 0x08  # timestamp type bit
    assert stored.max_timestamp == result.log_append_time_ms
    assert stored.base_timestamp == old  # only maxTimestamp is stamped
    assert crc32c(stored.raw[21:]) == stored.crc  # recomputed: maxTimestamp lies inside the CRC


def test_create_time_topic_keeps_producer_timestamps(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"x", timestamp_ms=TS - 123), Record(b"y", timestamp_ms=TS + 77)])
        assert [r.timestamp_ms for r in engine.consume("t", 0)] == [TS - 123, TS + 77]
    stored = walk_batches((data_dir / "t-0" / f"{0:020d}.log").read_bytes())[0]
    assert not stored.attributes & 0x08
    assert stored.max_timestamp == TS + 77


def test_max_message_bytes(data_dir: Path) -> None:
    batch = build_batch(values(4), now_ms=TS)
    with open_engine(data_dir) as engine:
        engine.create_topic("exact", 1, configs={"max.message.bytes": len(batch)})
        engine.create_topic("small", 1, configs={"max.message.bytes": len(batch) - 1})
        assert engine.append("exact", 0, batch).base_offset == 0  # a batch of exactly the limit fits
        with pytest.raises(RecordTooLargeError):
            engine.append("small", 0, batch)
        assert engine.log_end_offset("small", 0) == 0
        assert (data_dir / "small-0" / f"{0:020d}.log").stat().st_size == 0
        engine.append("small", 0, build_batch(values(1), now_ms=TS))  # smaller batches still go in
        assert engine.log_end_offset("small", 0) == 1


def test_broker_message_max_bytes(data_dir: Path) -> None:
    with open_engine(data_dir, **{"message.max.bytes": 200}) as engine:
        engine.create_topic("t", 1)
        with pytest.raises(RecordTooLargeError):
            engine.produce("t", 0, [Record(b"x" * 300)])
        assert engine.log_end_offset("t", 0) == 0


def _bad_inputs() -> dict[str, tuple[bytes, type[Exception]]]:
    good = build_batch(values(3), now_ms=TS)
    flipped = bytearray(good)
    flipped[70] ^= 0x40
    flipped_header = bytearray(good)
    flipped_header[30] ^= 0x01  # baseTimestamp lies inside the CRC too
    return {
        "crc-flipped-body": (bytes(flipped), CrcMismatchError),
        "crc-flipped-header": (bytes(flipped_header), CrcMismatchError),
        "truncated-body": (good[:-5], CorruptRecordError),
        "truncated-header": (good[:40], CorruptRecordError),
        "empty": (b"", InvalidRecordError),
        "two-batches": (good + build_batch(values(1), now_ms=TS), InvalidRecordError),
        "trailing-garbage": (good + b"\x00" * 7, CorruptRecordError),
        "control-batch": (
            build_control_batch(ControlRecordType.COMMIT, producer_id=7, producer_epoch=0, timestamp_ms=TS),
            InvalidRecordError,
        ),
        "no-records": (build_batch([], last_offset_delta=0), InvalidRecordError),
        "offset-gap": (build_batch(values(2), offset_deltas=[0, 2], now_ms=TS), InvalidRecordError),
        "delete-horizon": (build_batch(values(1), delete_horizon_ms=TS, now_ms=TS), InvalidRecordError),
    }


@pytest.mark.parametrize("case", sorted(_bad_inputs()))
def test_bad_appends_leave_the_log_unchanged(data_dir: Path, case: str) -> None:
    data, error = _bad_inputs()[case]
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, values(2))
        before = log_snapshot(data_dir / "t-0")
        with pytest.raises(error):
            engine.append("t", 0, data)
        assert engine.log_end_offset("t", 0) == 2
        assert log_snapshot(data_dir / "t-0") == before
        assert engine.produce("t", 0, values(1)) == 2  # the log still takes good batches
        assert [r.offset for r in engine.consume("t", 0)] == [0, 1, 2]


def test_append_to_unknown_topic_or_partition(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        with pytest.raises(UnknownTopicOrPartitionError):
            engine.produce("nope", 0, values(1))
        with pytest.raises(UnknownTopicOrPartitionError):
            engine.produce("t", 1, values(1))


# =================================================================================================================
# reads
# --- every record of a producer's batch is checked (Kafka's LogValidator) --------------------------------------


def with_section(
    batch: bytes,
    section: bytes,
    *,
    records_count: int | None = None,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """`batch` with its records section (as sent: compressed when the batch is) replaced and header fields changed,
    the batch length and the CRC made to fit: damage a CRC check alone cannot see."""
    header = bytearray(batch[:61])
    struct.pack_into(">i", header, 8, 49 + len(section))
    if records_count is not None:
        struct.pack_into(">i", header, 57, records_count)
    if last_offset_delta is not None:
        struct.pack_into(">i", header, 23, last_offset_delta)
    if max_timestamp is not None:
        struct.pack_into(">q", header, 35, max_timestamp)
    body = bytes(header[21:]) + section
    return bytes(header[:17]) + struct.pack(">I", crc32c(body)) + body


def raw_record(offset_delta: int, key: bytes, *, header_key_length: int = 1, key_length: int | None = None) -> bytes:
    """One encoded record with one header, fields as given (lengths may lie)."""
    from tidelog.codec.varint import encode_varint

    body = (
        b"\x00\x00"  # attributes, timestampDelta 0
        + encode_varint(offset_delta)
        + encode_varint(len(key) if key_length is None else key_length)
        + key
        + encode_varint(1)
        + b"v"
        + encode_varint(1)
        + encode_varint(header_key_length)
        + b"h" * max(header_key_length, 0)
        + encode_varint(-1)
    )
    return encode_varint(len(body)) + body


def _damaged_records(n: int) -> dict[str, bytes]:
    """Batches of `n` records whose header and CRC are right but whose records are not."""
    good = build_batch(values(n), now_ms=TS)
    section = good[61:]
    gzip = build_batch(values(n), compression=Compression.GZIP, now_ms=TS)
    junk = random.Random(n).randbytes(len(section))
    records = [raw_record(i, b"k%d" % i) for i in range(n)]
    return {
        "junk-records": with_section(good, junk),
        "junk-gzip-data": with_section(gzip, junk[:200]),
        "gzip-holding-junk": with_section(gzip, compress(Compression.GZIP, junk)),
        "count-one-more": with_section(good, section, records_count=n + 1, last_offset_delta=n),
        "count-one-less": with_section(good, section, records_count=n - 1, last_offset_delta=n - 2),
        "bytes-after-the-records": with_section(good, section + b"\x00\x00"),
        "gzip-bytes-after-the-records": with_section(
            gzip, compress(Compression.GZIP, bytes(decompress(Compression.GZIP, gzip[61:])) + b"\x00")
        ),
        "offset-deltas-not-0-to-n-1": build_batch(
            values(n), offset_deltas=[*range(n - 2), n - 1, n - 1], last_offset_delta=n - 1, now_ms=TS
        ),
        "record-length-not-its-fields": with_section(
            good, b"".join(records[:-1]) + records[-1][:1] + raw_record(n - 1, b"k")[1:]
        ),
        "null-header-key": with_section(good, b"".join(records[:-1]) + raw_record(n - 1, b"x", header_key_length=-1)),
        "key-length-below-minus-one": with_section(
            good, b"".join(records[:-1]) + raw_record(n - 1, b"", key_length=-2)
        ),
    }


@pytest.mark.parametrize("n", [3, 200])  # a plain loop walks small batches, numpy the others
@pytest.mark.parametrize("case", sorted(_damaged_records(3)))
def test_records_that_do_not_decode_are_refused_and_the_log_stays_readable(data_dir: Path, case: str, n: int) -> None:
    data = _damaged_records(n)[case]
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, values(2))
        before = log_snapshot(data_dir / "t-0")
        with pytest.raises(CorruptRecordError) as refused:
            engine.append("t", 0, data)
        assert refused.value.kafka_error_code == 2  # CORRUPT_MESSAGE
        assert engine.log_end_offset("t", 0) == 2
        assert log_snapshot(data_dir / "t-0") == before
        engine.produce("t", 0, values(1))
        assert [r.offset for r in engine.consume("t", 0)] == [0, 1, 2]


def test_every_record_check_also_holds_for_the_batches_checked_while_written(data_dir: Path) -> None:
    """A batch of CRC_IN_PARALLEL_BYTES or more is checked on a worker thread during its write: damaged records are
    refused all the same, with nothing left in the file."""
    records = [Record(random.Random(i).randbytes(1000), key=b"k%d" % i, timestamp_ms=TS + i) for i in range(400)]
    good = build_batch(records)
    assert len(good) >= CRC_IN_PARALLEL_BYTES
    section = good[61:]
    damaged = {
        "junk": with_section(good, random.Random(1).randbytes(len(section))),
        "count-one-more": with_section(good, section, records_count=401, last_offset_delta=400),
        "bytes-after": with_section(good, section + b"\x00"),
    }
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.append("t", 0, good)
        before = log_snapshot(data_dir / "t-0")
        for name, data in damaged.items():
            with pytest.raises(CorruptRecordError):
                engine.append("t", 0, data)
            assert log_snapshot(data_dir / "t-0") == before, name
        assert engine.append("t", 0, good).base_offset == 400
        assert len(list(engine.consume("t", 0))) == 800


def test_whatever_append_accepts_every_reader_decodes(data_dir: Path) -> None:
    """Flipped bytes in the records of good batches, CRC made to fit: each append is refused or, if taken, the
    batch decodes through consume(), the columnar decoder and the cleaner's record layout."""
    from tidelog.codec.batch_chain import Window, batch_table, scan_chain
    from tidelog.codec.batch_columns import decode_v2
    from tidelog.codec.record_layout import record_layout

    rng = random.Random(5)
    originals = [
        build_batch(
            [Record(b"v" * rng.randrange(0, 30), key=b"k%d" % i, headers=[("h", b"x")]) for i in range(n)], now_ms=TS
        )
        for n in (2, 100)
    ]
    accepted = refused = 0
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        for trial in range(300):
            good = originals[trial % 2]
            section = bytearray(good[61:])
            for _ in range(rng.randrange(1, 3)):
                section[rng.randrange(len(section))] = rng.randrange(256)
            try:
                result = engine.append("t", 0, with_section(good, bytes(section)))
            except CorruptRecordError:
                refused += 1
                continue
            accepted += 1
            stored = engine.read("t", 0, result.base_offset, 1 << 20).read_bytes()
            chain = scan_chain(stored)
            table = batch_table(Window(stored, 0, chain.positions, chain.sizes))
            assert len(decode_v2(stored, table)) == len(record_layout(stored, table)) == result.record_count
            assert [r.offset for r in engine.consume("t", 0, result.base_offset)] == list(
                range(result.base_offset, result.last_offset + 1)
            )
    assert accepted > 10 and refused > 100  # both outcomes were exercised


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP])
@pytest.mark.parametrize("n", [3, 200, 400])  # loop, numpy, and on the worker thread while written (>= 256 KiB)
def test_create_time_max_timestamp_is_the_records_largest(data_dir: Path, n: int, codec: Compression) -> None:
    """A producer's maxTimestamp is not trusted: Kafka's validator stores the records' largest timestamp (and a
    CRC to match), which the time index, roll by time and retention then use."""
    size = 1000 if n == 400 else 10  # random values: even gzipped, 400 of them make a batch checked while written
    records = [Record(random.Random(i).randbytes(size), timestamp_ms=TS + 1000 * (i % 3)) for i in range(n)]
    sent = build_batch(records, compression=codec)
    lying = with_section(sent, sent[61:], max_timestamp=TS)
    assert (len(lying) >= CRC_IN_PARALLEL_BYTES) == (n == 400)
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.append("t", 0, lying)
        assert engine.offset_for_timestamp("t", 0, TS + 2000) == (TS + 2000, 2, 0)
        assert engine.offset_for_timestamp("t", 0, -3) == (TS + 2000, 2, 0)
        assert [r.timestamp_ms for r in engine.consume("t", 0)] == [r.timestamp_ms for r in records]
        engine.append("t", 0, sent)  # a truthful header is stored as sent
    stored = walk_batches((data_dir / "t-0" / f"{0:020d}.log").read_bytes())
    assert [b.max_timestamp for b in stored] == [TS + 2000, TS + 2000]
    assert all(crc32c(b.raw[21:]) == b.crc for b in stored)
    assert stored[0].raw[21:35] == lying[21:35] and stored[0].raw[43:] == lying[43:]  # only maxTimestamp and CRC
    assert stored[1].raw[16:] == sent[16:]


def test_a_larger_max_timestamp_than_the_records_is_corrected_too(data_dir: Path) -> None:
    records = [Record(b"a", timestamp_ms=TS), Record(b"b", timestamp_ms=TS + 5)]
    sent = build_batch(records)
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.append("t", 0, with_section(sent, sent[61:], max_timestamp=TS + 10**9))
        assert engine.offset_for_timestamp("t", 0, TS + 6) is None  # not a record at TS + 10^9
        assert engine.offset_for_timestamp("t", 0, -3) == (TS + 5, 1, 0)
    assert walk_batches((data_dir / "t-0" / f"{0:020d}.log").read_bytes())[0].max_timestamp == TS + 5


# =================================================================================================================


def produce_batches(engine: StorageEngine, topic: str, batches: int, per_batch: int) -> list[list[Record]]:
    produced = []
    for b in range(batches):
        records = values(per_batch, prefix=f"b{b}r")
        for i, record in enumerate(records):
            record.timestamp_ms = TS + b * per_batch + i
        engine.produce(topic, 0, records)
        produced.append(records)
    return produced


def test_read_starts_at_the_batch_holding_the_offset(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.index.interval.bytes": 100}) as engine:
        engine.create_topic("t", 1)
        produce_batches(engine, "t", 20, 5)
        for offset in (0, 4, 5, 7, 9, 53, 99):
            slices = engine.read("t", 0, offset, 10**6)
            batches = walk_batches(slices.read_bytes())
            assert batches[0].base_offset == offset - offset % 5
            assert batches[-1].last_offset == 99
            assert slices.high_watermark == 100
            assert slices.log_start_offset == 0
        assert engine.read("t", 0, 100, 10**6).slices == ()  # at the log end: nothing, no error


def test_read_respects_max_bytes_and_min_one_message(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"x" * 1000, timestamp_ms=TS)])
        engine.produce("t", 0, values(3))
        big = walk_batches(engine.read("t", 0, 0, 10**6).read_bytes())[0]
        slices = engine.read("t", 0, 0, 10)
        assert slices.size_in_bytes == big.size  # one whole batch even though it is larger than max_bytes
        assert walk_batches(slices.read_bytes()) == [big]
        limited = engine.read("t", 0, 0, big.size + 20)
        assert limited.size_in_bytes <= big.size + 20
        assert walk_batches(limited.read_bytes())[0] == big


@pytest.mark.parametrize("segment_bytes", [1 << 30, 9000], ids=["one-segment", "small-segments"])
def test_small_reads_carry_their_bytes_and_every_read_gives_what_the_file_holds(
    data_dir: Path, segment_bytes: int
) -> None:
    """A read sure to end within READ_AHEAD_BYTES (64 KiB) of its start reads its bytes with the first batch's
    header and carries them (FileSlice.head): one record (max_bytes=1, 150) when the offset index names the batch
    after it, and any read that must stop that soon (a segment's end). Reads whose batch a walk over headers finds
    (the first two batches of a segment, the first batch after a block of the index) carry none, nor does a read
    that may be longer. Whatever the read, its bytes - whole or a range of them - are the file's at its place."""
    with open_engine(data_dir, **{"log.index.interval.bytes": 100, "log.segment.bytes": segment_bytes}) as engine:
        engine.create_topic("t", 1)
        produce_batches(engine, "t", 400, 5)  # 82 KB of 206-byte batches, every one indexed
        end = engine.log_end_offset("t", 0)
        carried: dict[int, list[bool]] = {1: [], 150: [], 10**6: []}
        far_from_the_end = []  # a read of 10**6 bytes from here may take more than 64 KiB
        for offset in range(end):
            for max_bytes, heads in carried.items():
                slices = engine.read("t", 0, offset, max_bytes)
                for piece in slices.slices:
                    in_file = os.pread(piece.file.fileno(), piece.length, piece.position)
                    assert piece.read() == in_file, (offset, max_bytes)
                    assert piece.read_range(5, 100) == in_file[5:105]
                first = slices.slices[0]
                heads.append(first.head is not None)
                if max_bytes == 10**6:
                    far_from_the_end.append(os.fstat(first.file.fileno()).st_size - first.position > 65536)
                assert walk_batches(slices.read_bytes())[0].base_offset == offset - offset % 5
        long_reads = list(zip(carried[10**6], far_from_the_end, strict=True))
        for heads in (carried[1], carried[150], [head for head, far in long_reads if not far]):
            assert sum(heads) >= 0.9 * len(heads)  # all but the batches found by a walk
        assert not any(head for head, far in long_reads if far)
        assert any(far_from_the_end) == (segment_bytes > 65536)


def test_reads_span_segments(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.segment.bytes": 500}) as engine:
        engine.create_topic("t", 1)
        produced = produce_batches(engine, "t", 12, 3)
        segments = engine.partition_log("t", 0).segments
        assert len(segments) >= 4
        slices = engine.read("t", 0, 1, 10**6)
        assert len({s.path for s in slices.slices}) == len(segments)
        batches = walk_batches(slices.read_bytes())
        assert [b.base_offset for b in batches] == list(range(0, 36, 3))
        expected = [r for batch in produced for r in batch]
        assert [r.value for r in engine.consume("t", 0)] == [r.value for r in expected]


@pytest.mark.parametrize("background", [False, True])
def test_read_out_of_range(data_dir: Path, background: bool) -> None:
    with open_engine(data_dir, background=background, **{"log.segment.bytes": 300}) as engine:
        engine.create_topic("t", 1)
        produce_batches(engine, "t", 10, 2)
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 21, 1000)
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, -1, 1000)
        engine.delete_records("t", 0, 9)
        assert engine.log_start_offset("t", 0) == 9
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 8, 1000)
        first = walk_batches(engine.read("t", 0, 9, 1000).read_bytes())[0]
        assert first.base_offset <= 9 <= first.last_offset


def test_consume_out_of_range_raises_as_read_does(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.segment.bytes": 300}) as engine:
        engine.create_topic("t", 1)
        produce_batches(engine, "t", 10, 2)
        engine.delete_records("t", 0, 9)
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 8 is outside t-0's range \[9, 20\]"):
            engine.consume("t", 0, 8)  # raised by the call, before any iteration
        with pytest.raises(OffsetOutOfRangeError):
            engine.consume("t", 0, 21)
        with pytest.raises(OffsetOutOfRangeError):
            engine.consume("t", 0, -1)
        assert list(engine.consume("t", 0, 20)) == []  # the log end: nothing yet, not an error
        assert [r.offset for r in engine.consume("t", 0)] == list(range(9, 20))  # default: from the log start
        assert [r.offset for r in engine.consume("t", 0, 9, max_records=2)] == [9, 10]
        engine.produce("t", 0, values(1))
        assert [r.offset for r in engine.consume("t", 0, 20)] == [20]


def test_consume_returns_exactly_what_was_produced(data_dir: Path) -> None:
    rng = random.Random(3)
    produced: list[Record] = []
    with open_engine(data_dir, **{"log.segment.bytes": 2000, "log.index.interval.bytes": 200}) as engine:
        engine.create_topic("t", 1)
        for b in range(40):
            records = []
            for _ in range(rng.randrange(1, 6)):
                key = None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 10))
                value = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 200))
                headers = [(f"h{j}", None if j == 2 else rng.randbytes(3)) for j in range(rng.randrange(0, 4))]
                records.append(Record(value, key=key, timestamp_ms=TS + rng.randrange(-5000, 5000), headers=headers))
            codec = ["none", "gzip", "snappy", "lz4", "zstd"][b % 5]
            base = engine.produce("t", 0, records, compression=codec)
            for i, record in enumerate(records):
                record.offset = base + i
            produced += records
        assert as_tuples(engine.consume("t", 0)) == as_tuples(produced)
        for start in (0, 1, 2, 17, 50, len(produced) - 1):  # including from the middle of a batch
            assert as_tuples(engine.consume("t", 0, start)) == as_tuples(produced[start:])
        assert as_tuples(engine.consume("t", 0, 5, max_records=3)) == as_tuples(produced[5:8])
        assert list(engine.consume("t", 0, len(produced))) == []
    with open_engine(data_dir) as engine:  # and after a reopen
        assert as_tuples(engine.consume("t", 0)) == as_tuples(produced)


# =================================================================================================================
# offset_for_timestamp
# =================================================================================================================


def test_offset_for_timestamp(data_dir: Path) -> None:
    # offsets 0..29 with timestamps TS, TS+10, ..., except offset 12, which carries the maximum
    timestamps = [TS + 10 * i for i in range(30)]
    timestamps[12] = TS + 10_000
    with open_engine(data_dir, **{"log.segment.bytes": 400, "log.index.interval.bytes": 50}) as engine:
        engine.create_topic("t", 1)
        for start in range(0, 30, 3):
            engine.produce("t", 0, [Record(b"v%d" % i, timestamp_ms=timestamps[i]) for i in range(start, start + 3)])
        assert len(engine.partition_log("t", 0).segments) > 2

        def lookup(target: int) -> tuple[int, int] | None:
            found = engine.offset_for_timestamp("t", 0, target)
            return None if found is None else (found.offset, found.timestamp)

        assert lookup(TS + 50) == (5, TS + 50)  # exact
        assert lookup(TS + 55) == (6, TS + 60)  # between two records
        assert lookup(TS + 115) == (12, TS + 10_000)  # the first record at or after the target, in offset order
        assert lookup(TS + 125) == (12, TS + 10_000)
        assert lookup(TS + 290) == (12, TS + 10_000)
        assert lookup(TS - 10**6) == (0, TS)  # before the first
        assert lookup(TS) == (0, TS)
        assert lookup(TS + 10_000) == (12, TS + 10_000)
        assert lookup(TS + 10_001) is None  # after the last
        assert lookup(-2) == (0, -1)  # EARLIEST
        assert lookup(-1) == (30, -1)  # LATEST
        assert lookup(-3) == (12, TS + 10_000)  # MAX_TIMESTAMP: the record holding it
        assert engine.offset_for_timestamp("t", 0, -1).leader_epoch == 0

        engine.delete_records("t", 0, 7)
        assert lookup(-2) == (7, -1)
        assert lookup(TS) == (7, TS + 70)  # never below the log start offset


def test_offset_for_timestamp_matches_brute_force(data_dir: Path) -> None:
    rng = random.Random(11)
    timestamps: list[int] = []
    config = {"log.segment.bytes": 1500, "log.index.interval.bytes": 100}
    with open_engine(data_dir, **config) as engine:
        engine.create_topic("t", 1)
        for _ in range(80):
            records = [
                Record(b"x" * rng.randrange(5, 60), timestamp_ms=TS + rng.randrange(0, 5000))
                for _ in range(rng.randrange(1, 4))
            ]
            engine.produce("t", 0, records)
            timestamps += [r.timestamp_ms for r in records]
    with open_engine(data_dir, **config) as engine:  # from indexes loaded from disk
        assert len(engine.partition_log("t", 0).segments) > 3
        for target in range(TS - 10, TS + 5010, 13):
            expected = next((i for i, ts in enumerate(timestamps) if ts >= target), None)
            found = engine.offset_for_timestamp("t", 0, target)
            assert (found.offset if found else None) == expected, target
        max_ts = max(timestamps)
        found = engine.offset_for_timestamp("t", 0, -3)
        assert (found.offset, found.timestamp) == (timestamps.index(max_ts), max_ts)


def test_max_timestamp_tie_across_segments_returns_the_earliest_offset(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"a", timestamp_ms=TS + 5), Record(b"b", timestamp_ms=TS)])
        engine.partition_log("t", 0).roll()
        engine.produce("t", 0, [Record(b"c", timestamp_ms=TS + 5)])
        found = engine.offset_for_timestamp("t", 0, -3)
        assert found is not None
        # Kafka (UnifiedLog.fetchOffsetByTimestamp) keeps the first segment whose maxTimestampSoFar is largest
        # (strictly greater replaces it), then the first record with that timestamp: offset 0
        assert (found.offset, found.timestamp) == (0, TS + 5)


def test_max_timestamp_tie_within_a_segment_returns_the_earliest_offset(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"a", timestamp_ms=TS), Record(b"b", timestamp_ms=TS + 5)])
        engine.produce("t", 0, [Record(b"c", timestamp_ms=TS + 5), Record(b"d", timestamp_ms=TS + 1)])
        found = engine.offset_for_timestamp("t", 0, -3)
        assert (found.offset, found.timestamp) == (1, TS + 5)


def test_offset_for_timestamp_on_empty_log(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        assert engine.offset_for_timestamp("t", 0, TS) is None
        assert engine.offset_for_timestamp("t", 0, -3) is None
        assert engine.offset_for_timestamp("t", 0, -2).offset == 0
        assert engine.offset_for_timestamp("t", 0, -1).offset == 0


# =================================================================================================================
# retention
# =================================================================================================================

NOW = int(time.time() * 1000)
DAY = 24 * 3600 * 1000


def fill_segments(engine: StorageEngine, topic: str, timestamps: list[int]) -> None:
    """One 2-record batch per timestamp; with segment.bytes 300 each batch gets its own segment."""
    for ts in timestamps:
        engine.produce(topic, 0, [Record(b"x" * 60, timestamp_ms=ts), Record(b"y" * 60, timestamp_ms=ts)])


RETENTION_CONFIG = {"log.segment.bytes": 300, "log.segment.delete.delay.ms": 0}


def bases(engine: StorageEngine, topic: str) -> list[int]:
    return [s.base_offset for s in engine.partition_log(topic, 0).segments]


def test_retention_ms_deletes_expired_segments_oldest_first(data_dir: Path) -> None:
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        engine.create_topic("t", 1, configs={"retention.ms": DAY})
        # segments: old, old, new, old, new(active)
        fill_segments(engine, "t", [NOW - 10 * DAY, NOW - 9 * DAY, NOW, NOW - 8 * DAY, NOW])
        assert bases(engine, "t") == [0, 2, 4, 6, 8]
        assert engine.delete_old_segments() == 2
        # the expired segment after a live one stays: deletion stops at the first segment to keep
        assert bases(engine, "t") == [4, 6, 8]
        assert engine.log_start_offset("t", 0) == 4
        assert [p.name for p in segment_logs(data_dir / "t-0")] == [f"{b:020d}.log" for b in (4, 6, 8)]
        assert not any(p.name.endswith(".deleted") for p in (data_dir / "t-0").iterdir())
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 3, 1000)
        assert [r.offset for r in engine.consume("t", 0)] == [4, 5, 6, 7, 8, 9]
        assert engine.delete_old_segments() == 0
    assert read_checkpoint(data_dir / "log-start-offset-checkpoint") == {("t", 0): 4}
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        assert engine.log_start_offset("t", 0) == 4
        assert bases(engine, "t") == [4, 6, 8]


def test_retention_never_deletes_the_active_segment_it_rolls_first(data_dir: Path) -> None:
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        engine.create_topic("t", 1, configs={"retention.ms": DAY})
        fill_segments(engine, "t", [NOW - 10 * DAY] * 3)
        assert bases(engine, "t") == [0, 2, 4]
        assert engine.delete_old_segments() == 3
        assert bases(engine, "t") == [6]  # a new, empty active segment at the log end
        assert engine.log_start_offset("t", 0) == 6
        assert engine.log_end_offset("t", 0) == 6
        assert list(engine.consume("t", 0)) == []
        assert [p.name for p in segment_logs(data_dir / "t-0")] == [f"{6:020d}.log"]
        assert engine.produce("t", 0, [Record(b"live", timestamp_ms=NOW)]) == 6
        assert engine.delete_old_segments() == 0  # the live active segment stays
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        assert engine.log_start_offset("t", 0) == 6
        assert [r.offset for r in engine.consume("t", 0)] == [6]


def test_retention_ms_minus_one_keeps_everything(data_dir: Path) -> None:
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        engine.create_topic("t", 1, configs={"retention.ms": -1})
        fill_segments(engine, "t", [NOW - 1000 * DAY] * 3)
        assert engine.delete_old_segments() == 0
        assert bases(engine, "t") == [0, 2, 4]


def test_a_changed_segment_size_rolls_the_active_segment(data_dir: Path) -> None:
    """segment.bytes set after the topic was created applies to the segment already open (red before: the active
    segment kept the settings it was created with and grew past the new size)."""
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.alter_topic_configs("t", {"segment.bytes": 4000})
        partition = engine.partition_log("t", 0)
        for _ in range(50):
            partition.append(build_batch([Record(b"x" * 100)] * 3))
        assert len(partition.segments) > 1
        assert all(segment.size <= 4000 for segment in partition.segments)


def test_retention_bytes(data_dir: Path) -> None:
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        engine.create_topic("t", 1)
        fill_segments(engine, "t", [NOW] * 5)
        sizes = [s.size for s in engine.partition_log("t", 0).segments]
        total = sum(sizes)
        # keep at least retention.bytes: only whole segments that fit in the excess go, oldest first
        engine.alter_topic_configs("t", {"retention.bytes": total - sizes[0] - 1})
        assert engine.delete_old_segments() == 1
        assert bases(engine, "t") == [2, 4, 6, 8]
        engine.alter_topic_configs("t", {"retention.bytes": total - sizes[0] - sizes[1] - sizes[2]})
        assert engine.delete_old_segments() == 2
        assert bases(engine, "t") == [6, 8]
        assert engine.log_start_offset("t", 0) == 6
        engine.alter_topic_configs("t", {"retention.bytes": 0})
        assert engine.delete_old_segments() == 2
        assert bases(engine, "t") == [10]
        assert engine.log_start_offset("t", 0) == 10


def test_delete_records_moves_log_start_offset(data_dir: Path) -> None:
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        engine.create_topic("t", 1)
        fill_segments(engine, "t", [NOW] * 5)
        assert engine.delete_records("t", 0, 5) == 5  # inside the segment based at 4
        assert engine.log_start_offset("t", 0) == 5
        assert bases(engine, "t") == [4, 6, 8]
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 4, 1000)
        assert [r.offset for r in engine.consume("t", 0)] == [5, 6, 7, 8, 9]
        assert engine.offset_for_timestamp("t", 0, -2).offset == 5
        assert engine.delete_records("t", 0, 3) == 5  # never moves back
        with pytest.raises(OffsetOutOfRangeError):
            engine.delete_records("t", 0, 11)  # beyond the high watermark
        assert engine.delete_records("t", 0, 10) == 10  # all of it
        assert bases(engine, "t") == [8]  # the last segment has no successor at or below the start: it stays
        assert list(engine.consume("t", 0)) == []
    assert read_checkpoint(data_dir / "log-start-offset-checkpoint") == {("t", 0): 10}
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        assert engine.log_start_offset("t", 0) == 10
        assert engine.produce("t", 0, values(1)) == 10


def test_log_start_offset_inside_a_segment_survives_reopen(data_dir: Path) -> None:
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        engine.create_topic("t", 1)
        fill_segments(engine, "t", [NOW] * 3)
        engine.delete_records("t", 0, 3)
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        assert engine.log_start_offset("t", 0) == 3
        assert bases(engine, "t") == [2, 4]
        assert [r.offset for r in engine.consume("t", 0)] == [3, 4, 5]
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 2, 1000)


def test_log_start_offset_truncates_leader_epoch_checkpoint(data_dir: Path) -> None:
    with open_engine(data_dir, **RETENTION_CONFIG) as engine:
        engine.create_topic("t", 1)
        fill_segments(engine, "t", [NOW] * 3)
        engine.delete_records("t", 0, 3)
        assert engine.partition_log("t", 0).leader_epoch_cache.entries() == [(0, 3)]
    assert (data_dir / "t-0" / "leader-epoch-checkpoint").read_text() == "0\n1\n0 3\n"


def test_deleted_files_wait_for_file_delete_delay(data_dir: Path) -> None:
    config = {"log.segment.bytes": 300, "log.segment.delete.delay.ms": 60_000}
    engine = open_engine(data_dir, background=True, **config)
    try:
        engine.create_topic("t", 1, configs={"retention.ms": DAY})
        fill_segments(engine, "t", [NOW - 10 * DAY, NOW - 10 * DAY, NOW])
        slices_before = engine.read("t", 0, 0, 10**6)  # a reader holding slices of doomed segments
        assert engine.delete_old_segments() == 2
        names = sorted(os.listdir(data_dir / "t-0"))
        for base in (0, 2):
            for suffix in (".log", ".index", ".timeindex"):
                assert f"{base:020d}{suffix}.deleted" in names
                assert f"{base:020d}{suffix}" not in names
        assert f"{4:020d}.log" in names
        assert len(walk_batches(slices_before.read_bytes())) == 3  # renamed files stay readable
        assert [r.offset for r in engine.consume("t", 0)] == [4, 5]
    finally:
        engine.close()
    with open_engine(data_dir, **config) as engine:
        assert not any(p.name.endswith(".deleted") for p in (data_dir / "t-0").iterdir())
        assert [r.offset for r in engine.consume("t", 0)] == [4, 5]


def test_leftover_deleted_files_are_removed_on_open(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, values(2))
    leftover = data_dir / "t-0" / f"{0:020d}.log.deleted"
    leftover.write_bytes(b"stale")
    with open_engine(data_dir) as engine:
        assert not leftover.exists()
        assert engine.log_end_offset("t", 0) == 2


# =================================================================================================================
# flush
# =================================================================================================================


def test_flush_interval_messages_one_advances_recovery_point_each_append(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.flush.interval.messages": 1}) as engine:
        engine.create_topic("t", 1)
        partition_log = engine.partition_log("t", 0)
        for i in range(5):
            engine.produce("t", 0, values(1 + i % 2))
            assert partition_log.recovery_point == engine.log_end_offset("t", 0)


def test_flush_interval_messages_three(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.flush.interval.messages": 3}) as engine:
        engine.create_topic("t", 1)
        partition_log = engine.partition_log("t", 0)
        points = []
        for _ in range(7):
            engine.produce("t", 0, values(1))
            points.append(partition_log.recovery_point)
        assert points == [0, 0, 3, 3, 3, 6, 6]


def test_default_flush_waits_for_roll_or_close(data_dir: Path) -> None:
    with open_engine(data_dir, **{"log.segment.bytes": 500}) as engine:
        engine.create_topic("t", 1)
        partition_log = engine.partition_log("t", 0)
        engine.produce("t", 0, values(2))
        engine.produce("t", 0, values(2))
        assert partition_log.recovery_point == 0
        while len(partition_log.segments) == 1:
            engine.produce("t", 0, values(2))
        # background=False: the rolled segment is flushed synchronously, up to the new segment's base
        assert partition_log.recovery_point == partition_log.segments[1].base_offset
        engine.produce("t", 0, values(2))
        assert partition_log.recovery_point < engine.log_end_offset("t", 0)
        end = engine.log_end_offset("t", 0)
        engine.flush("t", 0)
        assert partition_log.recovery_point == end
        engine.produce("t", 0, values(1))
    assert read_checkpoint(data_dir / "recovery-point-offset-checkpoint") == {("t", 0): end + 1}


@pytest.mark.parametrize("where", ["broker", "topic", "altered topic"])
def test_time_based_flush(data_dir: Path, where: str) -> None:
    """`log.flush.interval.ms` (broker) or `flush.ms` (topic, also set after the engine opened): the background
    check flushes a log whose last flush is that old, and the recovery point (then its checkpoint) follows."""
    config: dict[str, object] = {"log.flush.offset.checkpoint.interval.ms": 50}
    if where == "broker":
        config["log.flush.interval.ms"] = 100
    with open_engine(data_dir, background=True, **config) as engine:
        engine.create_topic("t", 1, configs={"flush.ms": 100} if where == "topic" else None)
        engine.create_topic("other", 1)  # with no flush.ms of its own, except under the broker key
        if where == "altered topic":
            engine.alter_topic_configs("t", {"flush.ms": 100})
        engine.produce("t", 0, values(3))
        engine.produce("other", 0, values(2))
        deadline = time.monotonic() + 10
        while read_checkpoint_or_none(data_dir / "recovery-point-offset-checkpoint") in (None, {}) or (
            read_checkpoint(data_dir / "recovery-point-offset-checkpoint")[("t", 0)] < 3
        ):
            assert time.monotonic() < deadline, "no time-based flush"
            time.sleep(0.02)
        assert engine.partition_log("t", 0).flushed_offset == 3
        time.sleep(0.3)  # three flush intervals: a log without flush.ms is still left to the OS
        assert engine.partition_log("other", 0).flushed_offset == (2 if where == "broker" else 0)


def test_time_based_flush_follows_a_shorter_topic_flush_ms(data_dir: Path) -> None:
    """A broker-level interval of an hour schedules hourly checks; a topic created later with flush.ms 100 is
    checked every 100 ms all the same."""
    with open_engine(data_dir, background=True, **{"log.flush.interval.ms": 3_600_000}) as engine:
        engine.create_topic("t", 1, configs={"flush.ms": 100})
        engine.produce("t", 0, values(3))
        deadline = time.monotonic() + 10
        while engine.partition_log("t", 0).flushed_offset < 3:
            assert time.monotonic() < deadline, "no time-based flush"
            time.sleep(0.02)


# =================================================================================================================
# configuration
# =================================================================================================================


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"log.segmnt.bytes": 1000}, "log.segmnt.bytes"),  # unknown
        ({"segment.bytes": 1000}, "segment.bytes"),  # a topic key at broker level
        ({"log.segment.bytes": "big"}, "log.segment.bytes"),  # wrong type
        ({"log.segment.bytes": 1.5}, "log.segment.bytes"),
        ({"log.segment.bytes": True}, "log.segment.bytes"),
        ({"log.flush.interval.messages": None}, "log.flush.interval.messages"),
        ({"log.segment.bytes": 13}, "log.segment.bytes"),  # below the minimum
        ({"log.segment.bytes": 2**31}, "log.segment.bytes"),  # above Int.MaxValue
        ({"log.index.interval.bytes": -1}, "log.index.interval.bytes"),
        ({"log.flush.interval.messages": 0}, "log.flush.interval.messages"),
        ({"log.retention.ms": -2}, "log.retention.ms"),
        ({"num.partitions": 0}, "num.partitions"),
        ({"log.message.timestamp.type": "WallClock"}, "log.message.timestamp.type"),
        ({"log.cleanup.policy": "compact,shrink"}, "log.cleanup.policy"),
        ({"log.preallocate": "sometimes"}, "log.preallocate"),  # known since Kafka 3.9 keys were added
    ],
)
def test_bad_broker_config_names_the_key(data_dir: Path, config: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        tidelog.open(data_dir, config=config, background=False)


def test_properties_strings_are_accepted(data_dir: Path) -> None:
    config = {"log.segment.bytes": "2048", "log.roll.hours": "1", "log.retention.minutes": "5", "num.partitions": "2"}
    with tidelog.open(data_dir, config=config, background=False) as engine:
        engine.create_topic("t")
        assert engine.topics()["t"].partitions == 2
        log_config = engine.partition_log("t", 0).config
        assert log_config.segment_bytes == 2048
        assert log_config.segment_ms == 3_600_000
        assert log_config.retention_ms == 300_000


def test_finer_unit_wins(data_dir: Path) -> None:
    config = {"log.retention.hours": 1, "log.retention.ms": 1234, "log.roll.hours": 2, "log.roll.ms": 999}
    with tidelog.open(data_dir, config=config, background=False) as engine:
        engine.create_topic("t", 1)
        assert engine.partition_log("t", 0).config.retention_ms == 1234
        assert engine.partition_log("t", 0).config.segment_ms == 999


@pytest.mark.parametrize(
    ("configs", "key"),
    [
        ({"segmnt.bytes": 1000}, "segmnt.bytes"),
        ({"log.segment.bytes": 1000}, "log.segment.bytes"),  # a broker key is not a topic config
        ({"segment.bytes": "x"}, "segment.bytes"),
        ({"segment.bytes": 10}, "segment.bytes"),
        ({"retention.ms": -2}, "retention.ms"),
        ({"message.timestamp.type": "Now"}, "message.timestamp.type"),
        ({"max.message.bytes": -1}, "max.message.bytes"),
    ],
)
def test_topic_overrides_validated_at_create_topic(data_dir: Path, configs: dict, key: str) -> None:
    with open_engine(data_dir) as engine:
        with pytest.raises(ConfigError, match=re.escape(key)):
            engine.create_topic("t", 2, configs=configs)
        assert "t" not in engine.topics()
        assert not (data_dir / "t-0").exists()
        engine.create_topic("t", 2)  # the name is still free


# =================================================================================================================
# topics
# =================================================================================================================


def test_create_duplicate_and_invalid_topics(data_dir: Path) -> None:
    with open_engine(data_dir, **{"num.partitions": 3}) as engine:
        description = engine.create_topic("events")
        assert description.partitions == 3
        assert sorted(p.name for p in data_dir.iterdir() if p.is_dir()) == ["events-0", "events-1", "events-2"]
        with pytest.raises(TopicExistsError):
            engine.create_topic("events", 1)
        for bad in ("", ".", "..", "a/b", "a b", "x" * 250, "tëst", "a:b"):
            with pytest.raises(InvalidTopicError):
                engine.create_topic(bad, 1)
        engine.create_topic("x" * 249, 1)
        engine.create_topic("my.topic", 1)
        with pytest.raises(InvalidTopicError):
            engine.create_topic("my_topic", 1)  # collides with my.topic in metric names
        assert sorted(engine.topics()) == sorted(["events", "x" * 249, "my.topic"])


def test_delete_topic_removes_its_directories(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("gone", 3)
        engine.create_topic("kept", 1)
        for p in range(3):
            engine.produce("gone", p, values(5))
        engine.delete_topic("gone")
        assert sorted(engine.topics()) == ["kept"]
        assert sorted(p.name for p in data_dir.iterdir() if p.is_dir()) == ["kept-0"]
        with pytest.raises(UnknownTopicOrPartitionError):
            engine.produce("gone", 0, values(1))
        with pytest.raises(UnknownTopicOrPartitionError):
            engine.delete_topic("gone")
        engine.create_topic("gone", 1)  # the name can be reused, as a new, empty topic
        assert engine.log_end_offset("gone", 0) == 0
        engine.delete_topic("gone")
    assert set(read_checkpoint(data_dir / "recovery-point-offset-checkpoint")) == {("kept", 0)}
    with open_engine(data_dir) as engine:
        assert sorted(engine.topics()) == ["kept"]
    assert sorted(p.name for p in data_dir.iterdir() if p.is_dir()) == ["kept-0"]


def test_create_partitions(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 2)
        engine.produce("t", 1, values(3))
        engine.create_partitions("t", 5)
        assert engine.topics()["t"].partitions == 5
        assert all((data_dir / f"t-{p}").is_dir() for p in range(5))
        topic_id = engine.topics()["t"].topic_id
        assert (data_dir / "t-4" / "partition.metadata").read_text() == f"version: 0\ntopic_id: {topic_id}\n"
        engine.produce("t", 4, values(1))
        for total in (5, 3):
            with pytest.raises(tidelog.errors.InvalidPartitionsError):
                engine.create_partitions("t", total)
        with pytest.raises(UnknownTopicOrPartitionError):
            engine.create_partitions("nope", 3)
    with open_engine(data_dir) as engine:
        assert engine.topics()["t"].partitions == 5
        assert engine.log_end_offset("t", 1) == 3
        assert engine.log_end_offset("t", 4) == 1


def test_topics_and_configs_survive_reopen(data_dir: Path) -> None:
    with open_engine(data_dir) as engine:
        first = engine.create_topic("a", 2, configs={"retention.ms": 12345, "segment.bytes": "4096"})
        second = engine.create_topic("b", 1)
        engine.produce("a", 1, values(4))
    with open_engine(data_dir) as engine:
        topics = engine.topics()
        assert sorted(topics) == ["a", "b"]
        assert topics["a"].topic_id == first.topic_id
        assert topics["b"].topic_id == second.topic_id
        assert topics["a"].partitions == 2
        assert topics["a"].configs == {"retention.ms": "12345", "segment.bytes": "4096"}
        assert engine.partition_log("a", 0).config.retention_ms == 12345
        assert engine.partition_log("a", 1).config.segment_bytes == 4096
        assert engine.partition_log("b", 0).config.retention_ms == 7 * DAY
        assert [r.value for r in engine.consume("a", 1)] == [r.value for r in values(4)]


def test_multiple_log_dirs_spread_partitions(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    config = {"log.dirs": ",".join(str(d) for d in dirs)}
    with tidelog.open(tmp_path / "ignored", config=config, background=False) as engine:
        engine.create_topic("t", 4)
        for p in range(4):
            engine.produce("t", p, values(p + 1))
        placement = {d.name: sorted(p.name for p in d.iterdir() if p.is_dir()) for d in dirs}
        assert sum(len(v) for v in placement.values()) == 4
        assert all(len(v) == 2 for v in placement.values())
    cluster_ids = set()
    for d in dirs:
        assert (d / ".kafka_cleanshutdown").exists()
        text = (d / "meta.properties").read_text()
        cluster_ids.add(re.search(r"^cluster\.id=(.*)$", text, re.M).group(1))
        here = {("t", int(p.name.rsplit("-", 1)[1])) for p in d.iterdir() if p.is_dir()}
        assert set(read_checkpoint(d / "recovery-point-offset-checkpoint")) == here
    assert len(cluster_ids) == 1
    with tidelog.open(tmp_path / "ignored", config=config, background=False) as engine:
        assert [engine.log_end_offset("t", p) for p in range(4)] == [1, 2, 3, 4]
        assert [r.offset for r in engine.consume("t", 3)] == [0, 1, 2, 3]


def test_second_open_of_an_open_dir_fails(data_dir: Path) -> None:
    engine = open_engine(data_dir)
    try:
        engine.create_topic("t", 1)
        with pytest.raises(KafkaStorageError):
            open_engine(data_dir)
        engine.produce("t", 0, values(1))  # the first engine is unaffected
    finally:
        engine.close()
    with open_engine(data_dir) as again:
        assert again.log_end_offset("t", 0) == 1


def test_closed_engine_refuses_calls(data_dir: Path) -> None:
    engine = open_engine(data_dir)
    engine.create_topic("t", 1)
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(tidelog.errors.LogClosedError):
        engine.produce("t", 0, values(1))
    with pytest.raises(tidelog.errors.LogClosedError):
        engine.create_topic("u", 1)


# =================================================================================================================
# stray and foreign files
# =================================================================================================================


def test_stray_files_are_reported_and_left_alone(data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, values(3))
    stray_file = data_dir / "t-0" / "notes.txt"
    stray_file.write_bytes(b"mine")
    stray_dir = data_dir / "backup"
    stray_dir.mkdir()
    (stray_dir / "inner.bin").write_bytes(b"\x00\x01")
    stray_top_file = data_dir / "README"
    stray_top_file.write_text("hello")
    foreign_temps = [data_dir / "t-0" / "notes.tmp", data_dir / "t-0" / "t-0.tar.tmp"]
    for path in foreign_temps:
        path.write_bytes(b"not ours")
    foreign_top_temp = data_dir / "notes.tmp"
    foreign_top_temp.write_bytes(b"not ours either")
    own_temps = [  # interrupted writes of ours (tmp, then rename): removed
        data_dir / "t-0" / "leader-epoch-checkpoint.tmp",
        data_dir / "t-0" / "partition.metadata.tmp",
        data_dir / "t-0" / f"{3:020d}.snapshot.tmp",
        data_dir / "t-0" / f"{0:020d}.index.tmp",
    ]
    for path in own_temps:
        path.write_bytes(b"half")
    own_top_temp = data_dir / "recovery-point-offset-checkpoint.tmp"
    own_top_temp.write_bytes(b"half")

    caplog.set_level(logging.WARNING, logger="tidelog.storage")
    with open_engine(data_dir) as engine:
        assert sorted(engine.topics()) == ["t"]
        assert engine.log_end_offset("t", 0) == 3
        engine.produce("t", 0, values(1))
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "notes.txt" in warnings
    assert "backup" in warnings
    assert "README" in warnings
    for path in [*foreign_temps, foreign_top_temp]:
        assert path.name in warnings
        assert path.read_bytes().startswith(b"not ours")
    assert not [path for path in own_temps if path.exists()]
    assert own_top_temp.name not in warnings  # ours: an interrupted checkpoint write, overwritten by the next one
    assert stray_file.read_bytes() == b"mine"
    assert (stray_dir / "inner.bin").read_bytes() == b"\x00\x01"
    assert stray_top_file.read_text() == "hello"
    assert not (data_dir / "backup-0").exists()


def test_kraft_metadata_log_is_not_a_topic(data_dir: Path) -> None:
    metadata_dir = data_dir / "__cluster_metadata-0"
    metadata_dir.mkdir(parents=True)
    (metadata_dir / f"{0:020d}.log").write_bytes(b"raft records")
    with open_engine(data_dir) as engine:
        assert engine.topics() == {}
    assert sorted(os.listdir(metadata_dir)) == [f"{0:020d}.log"]
    assert (metadata_dir / f"{0:020d}.log").read_bytes() == b"raft records"


# =================================================================================================================
# data written by a real Kafka broker
# =================================================================================================================


KAFKA_WRITTEN = Path(__file__).resolve().parents[1] / "fixtures" / "kafka-written"  # tracked in the repository
KAFKA_EXPECTED: dict[str, list[dict]] = json.loads((KAFKA_WRITTEN / "expected.json").read_text())


@pytest.fixture
def kafka_written() -> Path:
    return KAFKA_WRITTEN


@pytest.mark.parametrize("name", sorted(KAFKA_EXPECTED))
def test_kafka_written_segment_is_adopted(
    data_dir: Path, kafka_written: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    expected = KAFKA_EXPECTED[name]
    partition_dir = data_dir / "kwritten-0"
    partition_dir.mkdir(parents=True)
    segment = partition_dir / f"{0:020d}.log"
    shutil.copyfile(kafka_written / name, segment)
    original = segment.read_bytes()

    caplog.set_level(logging.INFO, logger="tidelog.storage")
    with open_engine(data_dir, **{"log.index.interval.bytes": 0}) as engine:
        assert "kwritten" in engine.topics()
        assert engine.topics()["kwritten"].partitions == 1
        assert engine.log_start_offset("kwritten", 0) == 0
        assert engine.log_end_offset("kwritten", 0) == expected[-1]["offset"] + 1
        got = [
            (r.offset, r.timestamp_ms, r.key.decode() if r.key is not None else None, r.value.decode())
            for r in engine.consume("kwritten", 0)
        ]
        assert got == [(e["offset"], e["timestamp_ms"], e["key"], e["value"]) for e in expected]
        for start in range(len(expected)):  # from inside compressed wrappers and batches too
            assert [r.offset for r in engine.consume("kwritten", 0, start)] == [e["offset"] for e in expected[start:]]
        first_ts = expected[0]["timestamp_ms"]
        found = engine.offset_for_timestamp("kwritten", 0, first_ts)
        assert found is not None
        assert found.offset == 0
    assert any("missing" in r.getMessage() or "rebuild" in r.getMessage() for r in caplog.records)

    assert segment.read_bytes() == original  # valid data written by Kafka is never rewritten
    entries = walk_batches(original)
    assert sum(len(b.raw) for b in entries) == len(original)
    # rebuilt indexes (interval 0): one entry per batch after the first, at its start, with its last offset
    assert read_index(segment.with_suffix(".index")) == [(b.last_offset, b.position) for b in entries[1:]]
    times = read_time_index(segment.with_suffix(".timeindex"))
    assert [t for t, _ in times] == sorted({t for t, _ in times})
    assert times[-1][0] == max(e["timestamp_ms"] for e in expected)
    assert (partition_dir / "partition.metadata").exists()

    caplog.clear()
    with open_engine(data_dir) as engine:  # second open: clean, nothing to rebuild
        assert len(list(engine.consume("kwritten", 0))) == len(expected)
        engine.produce("kwritten", 0, values(1))  # and it takes new appends after Kafka's data
        assert engine.log_end_offset("kwritten", 0) == expected[-1]["offset"] + 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_kafka_written_v2_batches_append_as_a_producer_sent_them(data_dir: Path, kafka_written: Path) -> None:
    """Every magic-2 data batch Kafka itself wrote passes the record checks unchanged (maxTimestamp included)."""
    from tidelog.codec.record_set import iter_batches

    appended = 0
    with open_engine(data_dir) as engine:
        engine.create_topic("t", 1)
        for name, expected in sorted(KAFKA_EXPECTED.items()):
            data = (kafka_written / name).read_bytes()
            for info in iter_batches(data):
                if info.magic != 2 or info.is_control:
                    continue
                batch = data[info.position : info.position + info.size]
                result = engine.append("t", 0, batch)
                appended += 1
                got = [(r.timestamp_ms, r.value.decode()) for r in engine.consume("t", 0, result.base_offset)]
                want = [(e["timestamp_ms"], e["value"]) for e in expected if info.base_offset <= e["offset"]]
                assert got == want[: len(got)] and len(got) == result.record_count, name
                stored = engine.read("t", 0, result.base_offset, 1 << 20).read_bytes()
                assert stored[16 : info.size] == batch[16:]
    assert appended >= 8


# =================================================================================================================
# reads at the tail
# =================================================================================================================


def slices_of(engine: StorageEngine, end: int) -> list[list[tuple[int, int]]]:
    """For every offset below `end`: the (position, length) of each slice a read from it returns."""
    return [[(s.position, s.length) for s in engine.read("t", 0, offset, 1 << 20).slices] for offset in range(end)]


def test_reads_from_recent_append_ends_match_the_index_path_also_after_a_truncation(data_dir: Path) -> None:
    """A read from where a recent append ended skips the index (segment.py's append ends); it must find what the
    index and the walk find, which a reopened log (no remembered ends) shows, also after a truncation rewrote
    the tail with differently sized batches."""
    with open_engine(data_dir, **{"log.index.interval.bytes": 4096}) as engine:
        engine.create_topic("t", 1)
        for i in range(40):
            engine.produce("t", 0, values(3, prefix=f"b{i}-"))
        remembered = slices_of(engine, 120)
    with open_engine(data_dir) as reopened:
        assert slices_of(reopened, 120) == remembered
        for i in range(10):
            reopened.produce("t", 0, values(3, prefix=f"d{i}-"))
        reopened.partition("t", 0).truncate_to(130)  # inside a batch: the one holding 130 goes, from 129
        for i in range(10):
            reopened.produce("t", 0, values(1 + i % 4, prefix=f"c{i}-", size=10 + 7 * i))
        end = reopened.log_end_offset("t", 0)
        after = slices_of(reopened, end)
    with open_engine(data_dir) as again:
        assert slices_of(again, end) == after
