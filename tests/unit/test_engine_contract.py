"""The storage contract (storage/api.py) that every engine keeps: the same tests, run against the Kafka engine and the
RocketMQ engine. Appends, reads by offset and by timestamp, log start/end and high watermark, DeleteRecords,
idempotent retries, topics that survive a reopen, recovery after an unclean exit (a child process that never
closes), and retention - each engine configured with small files so that retention has whole files to delete."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tidelog
from broker_process import ROCKETMQ_IGNORE_DISK_USAGE
from tidelog import Record
from tidelog.codec.compression import Compression
from tidelog.codec.control_record import ControlRecordType, build_control_batch, parse_control_record
from tidelog.codec.record_batch import build_batch
from tidelog.codec.record_set import decode_batch, iter_batches
from tidelog.errors import (
    InvalidPartitionsError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidReplicaAssignmentError,
    InvalidTxnStateError,
    OffsetOutOfRangeError,
    TopicExistsError,
    TransactionCoordinatorFencedError,
    UnknownTopicOrPartitionError,
)
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.api import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    AbortedTransaction,
    Partition,
    StorageEngine,
)

TS = 1_700_000_000_000
SRC = Path(__file__).resolve().parents[2] / "src"
ENGINE_CONFIGS = {
    "kafka": {"log.segment.bytes": 2048, "log.retention.ms": 86_400_000},
    "rocketmq": {
        "tidelog.rocketmq.mapedFileSizeCommitLog": 4096,
        "tidelog.rocketmq.mapedFileSizeConsumeQueue": 400,
        "tidelog.rocketmq.fileReservedTime": 0,
        "tidelog.rocketmq.deleteCommitLogFilesInterval": 0,
        **ROCKETMQ_IGNORE_DISK_USAGE,
    },
}

Opener = Callable[..., StorageEngine]


@pytest.fixture(params=sorted(ENGINE_CONFIGS))
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def open_log(tmp_path: Path, engine_name: str) -> Iterator[Opener]:
    """Opens the test's log directory with its engine; every engine opened is closed at the end."""
    opened: list[StorageEngine] = []

    def opener(**config: object) -> StorageEngine:
        engine = tidelog.open(
            tmp_path / "data", engine=engine_name, config={**ENGINE_CONFIGS[engine_name], **config}, background=False
        )
        opened.append(engine)
        return engine

    yield opener
    for engine in opened:
        engine.close()


def expire_old_files(engine: StorageEngine) -> int:
    """One retention round: Kafka's retention.ms check, RocketMQ's CleanCommitLogService run by hand."""
    if hasattr(engine, "delete_old_segments"):
        return engine.delete_old_segments()
    return engine.retention.run(manual=True)


def records_for(batch: int, count: int) -> list[Record]:
    return [
        Record(
            value=f"value {batch}.{i} ".encode() * (1 + i % 4),
            key=f"key-{batch}-{i}".encode(),
            timestamp_ms=TS + 10 * batch + i,
            headers=[("batch", str(batch).encode()), ("i", str(i).encode())],
        )
        for i in range(count)
    ]


def as_tuples(records: list[Record]) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp_ms, r.key, r.value, [tuple(h) for h in r.headers]) for r in records]


def fill(engine: StorageEngine, topic: str = "t", batches: int = 40) -> list[Record]:
    if topic not in engine.topics():
        engine.create_topic(topic, 2)
    written: list[Record] = []
    for b in range(batches):
        batch = records_for(b, 1 + b % 3)
        base = engine.produce(topic, 0, batch, compression="gzip" if b % 5 == 0 else "none")
        for i, record in enumerate(batch):
            written.append(Record(record.value, record.key, record.timestamp_ms, list(record.headers), base + i))
    return written


def read_records(engine: StorageEngine, topic: str, offset: int, max_bytes: int = 1 << 20) -> list[Record]:
    data = engine.read(topic, 0, offset, max_bytes).read_bytes()
    return [r for info in iter_batches(data) for r in decode_batch(data, info)]


def test_append_assigns_offsets_and_reads_back(open_log: Opener) -> None:
    engine = open_log()
    written = fill(engine)
    assert [r.offset for r in written] == list(range(len(written)))
    assert engine.log_start_offset("t", 0) == 0
    assert engine.log_end_offset("t", 0) == engine.high_watermark("t", 0) == len(written)
    assert as_tuples(list(engine.consume("t", 0))) == as_tuples(written)
    assert engine.high_watermark("t", 1) == 0 and list(engine.consume("t", 1)) == []


def test_read_from_any_offset_returns_whole_batches_from_there(open_log: Opener) -> None:
    engine = open_log()
    written = fill(engine)
    for offset in (0, 1, 7, len(written) - 1):
        got = read_records(engine, "t", offset)
        assert got, offset
        assert got[0].offset <= offset  # a batch may start before the offset asked for (Kafka hands whole batches)
        assert as_tuples([r for r in got if r.offset >= offset]) == as_tuples(written[offset:])
    small = engine.read("t", 0, 5, 1)  # less than one batch: the first batch still comes whole
    assert len(small.slices) == 1 and small.high_watermark == len(written)
    assert engine.read("t", 0, len(written), 1 << 20).size_in_bytes == 0
    with pytest.raises(OffsetOutOfRangeError):
        engine.read("t", 0, len(written) + 1, 1 << 20)
    with pytest.raises(UnknownTopicOrPartitionError):
        engine.read("t", 2, 0, 100)


def test_keys_headers_nulls_and_compression_round_trip(open_log: Opener) -> None:
    engine = open_log()
    engine.create_topic("odd", 1)
    records = [
        Record(value=None, key=b"tombstone"),
        Record(value=b"", key=b""),
        Record(value=b"\x00\xffbinary", key=b"\x00\x01\x02 not text"),
        Record(value=b"v", key=None, headers=[("dup", b"1"), ("dup", None), ("KEYS", b"reserved name")]),
        Record(value=b"w", key="ключ with space".encode(), headers=[("empty", b""), ("bin", b"\x01\x02")]),
    ]
    for codec in (Compression.NONE, Compression.ZSTD):
        engine.append("odd", 0, build_batch(records, compression=codec, now_ms=TS))
    got = list(engine.consume("odd", 0))
    assert [(r.key, r.value, [tuple(h) for h in r.headers]) for r in got] == 2 * [
        (r.key, r.value, [tuple(h) for h in r.headers]) for r in records
    ]
    assert [r.timestamp_ms for r in got] == [TS] * 10


def test_offset_for_timestamp(open_log: Opener) -> None:
    engine = open_log()
    written = fill(engine)
    assert engine.offset_for_timestamp("t", 0, EARLIEST_TIMESTAMP).offset == 0
    assert engine.offset_for_timestamp("t", 0, LATEST_TIMESTAMP).offset == len(written)
    for record in written[::5]:
        found = engine.offset_for_timestamp("t", 0, record.timestamp_ms)
        assert (found.timestamp, found.offset) == (record.timestamp_ms, record.offset)
    between = engine.offset_for_timestamp("t", 0, written[3].timestamp_ms + 5)  # between two batches
    assert between.offset == next(r.offset for r in written if r.timestamp_ms >= written[3].timestamp_ms + 5)
    assert engine.offset_for_timestamp("t", 0, 0).offset == 0
    assert engine.offset_for_timestamp("t", 0, written[-1].timestamp_ms + 1) is None
    newest = engine.offset_for_timestamp("t", 0, MAX_TIMESTAMP)
    assert (newest.timestamp, newest.offset) == (written[-1].timestamp_ms, written[-1].offset)
    assert engine.offset_for_timestamp("t", 1, 0) is None


def test_offset_for_timestamp_with_timestamps_out_of_order(open_log: Opener) -> None:
    """Kafka's meaning: the earliest offset whose timestamp is at least the target, however the timestamps are
    ordered; MAX_TIMESTAMP names the first record carrying the largest one."""
    engine = open_log()
    engine.create_topic("late", 1)
    stamps = [TS + 100, TS + 300, TS + 200, TS + 400, TS + 150, TS + 400, TS + 50]
    for i, stamp in enumerate(stamps):  # one batch per record: batch timestamps go back in time, too
        engine.produce("late", 0, [Record(b"v%d" % i, timestamp_ms=stamp)])
        if i == 3:  # 100, 300, 200, 400: a binary search for 250 lands on 400
            assert engine.offset_for_timestamp("late", 0, TS + 250).offset == 1
    for target in (0, TS + 50, TS + 100, TS + 101, TS + 200, TS + 250, TS + 300, TS + 301, TS + 400, TS + 401):
        expected = next((o for o, stamp in enumerate(stamps) if stamp >= target), None)
        found = engine.offset_for_timestamp("late", 0, target)
        got = None if found is None else (found.timestamp, found.offset)
        assert got == (None if expected is None else (stamps[expected], expected)), target
    newest = engine.offset_for_timestamp("late", 0, MAX_TIMESTAMP)
    assert (newest.timestamp, newest.offset) == (TS + 400, 3)
    engine.produce("late", 0, [Record(b"in one batch", timestamp_ms=TS + 500), Record(b"x", timestamp_ms=TS + 10)])
    assert engine.offset_for_timestamp("late", 0, TS + 450).offset == 7
    assert engine.offset_for_timestamp("late", 0, TS + 350).offset == 3
    assert (engine.offset_for_timestamp("late", 0, MAX_TIMESTAMP).offset) == 7


def test_delete_records_moves_the_log_start_and_survives_a_reopen(open_log: Opener) -> None:
    engine = open_log()
    written = fill(engine)
    assert engine.delete_records("t", 0, 10) == 10
    assert engine.log_start_offset("t", 0) == 10
    with pytest.raises(OffsetOutOfRangeError):
        engine.read("t", 0, 9, 1 << 20)
    assert as_tuples(list(engine.consume("t", 0))) == as_tuples(written[10:])
    with pytest.raises(OffsetOutOfRangeError):
        engine.delete_records("t", 0, len(written) + 1)
    engine.close()
    engine = open_log()
    assert engine.log_start_offset("t", 0) == 10
    assert engine.log_end_offset("t", 0) == len(written)


def test_idempotent_retry_gets_the_original_offsets(open_log: Opener) -> None:
    engine = open_log()
    engine.create_topic("idem", 1)
    first = build_batch(records_for(0, 3), producer_id=7, producer_epoch=0, base_sequence=0)
    second = build_batch(records_for(1, 2), producer_id=7, producer_epoch=0, base_sequence=3)
    assert engine.append("idem", 0, first).base_offset == 0
    assert engine.append("idem", 0, second).base_offset == 3
    retried = engine.append("idem", 0, first)
    assert (retried.base_offset, retried.last_offset) == (0, 2)
    assert engine.log_end_offset("idem", 0) == 5
    engine.close()
    engine = open_log()  # the producer state comes back after a reopen
    retried = engine.append("idem", 0, second)
    assert (retried.base_offset, retried.last_offset) == (3, 4)
    assert engine.log_end_offset("idem", 0) == 5


def test_topics_survive_a_reopen(open_log: Opener) -> None:
    engine = open_log()
    engine.create_topic("a", 3, {"retention.ms": 1000})
    engine.create_topic("b", 1)
    with pytest.raises(TopicExistsError):
        engine.create_topic("a", 1)
    engine.create_partitions("b", 4)
    engine.produce("a", 2, [Record(b"x", timestamp_ms=TS)])
    engine.delete_topic("b")
    engine.close()
    engine = open_log()
    topics = engine.topics()
    assert sorted(topics) == ["a"]
    assert topics["a"].partitions == 3 and topics["a"].configs == {"retention.ms": "1000"}
    assert [r.value for r in engine.consume("a", 2)] == [b"x"]
    engine.create_topic("b", 2)  # a new topic of the old name starts empty
    assert engine.log_end_offset("b", 0) == 0 and list(engine.consume("b", 0)) == []


def test_a_topic_held_in_part_keeps_its_given_id(open_log: Opener, engine_name: str, tmp_path: Path) -> None:
    """A broker of a cluster holds only the replicas assigned to it, under the topic id the cluster gave the topic."""
    topic_id = new_kafka_uuid()
    engine = open_log()
    description = engine.create_topic("part", 4, {"retention.ms": 1000}, topic_id=topic_id, local_partitions=[3, 1])
    assert (description.topic_id, description.partitions, description.local_partitions) == (topic_id, 4, (1, 3))
    assert list(description.held) == [1, 3]
    assert engine.produce("part", 3, [Record(b"x", timestamp_ms=TS)]) == 0
    with pytest.raises(UnknownTopicOrPartitionError, match="no replica of part-0 is held here"):
        engine.partition("part", 0)
    with pytest.raises(UnknownTopicOrPartitionError, match="has no partition 4"):
        engine.partition("part", 4)
    with pytest.raises(InvalidPartitionsError, match=r"not all within 0\.\.3"):
        engine.create_topic("other", 4, local_partitions=[4])
    assert sorted(key for key in engine.partitions() if key[0] == "part") == [("part", 1), ("part", 3)]
    engine.create_partitions("part", 6, local_partitions=[5])
    engine.close()
    engine = open_log()
    described = engine.topics()["part"]
    assert (described.topic_id, described.partitions, described.local_partitions) == (topic_id, 6, (1, 3, 5))
    assert [r.value for r in engine.consume("part", 3)] == [b"x"]
    if engine_name == "kafka":
        assert sorted(p.name for p in (tmp_path / "data").glob("part-*")) == ["part-1", "part-3", "part-5"]
        assert f"topic_id: {topic_id}" in (tmp_path / "data" / "part-5" / "partition.metadata").read_text()
    engine.create_partitions("part", 7)  # partitions added without saying which: all of the new ones
    assert engine.topics()["part"].local_partitions == (1, 3, 5, 6)
    engine.delete_topic("part")
    assert "part" not in engine.topics()
    assert not [key for key in engine.partitions() if key[0] == "part"]
    whole = engine.create_topic("whole", 2)
    assert whole.local_partitions is None and list(whole.held) == [0, 1]


def test_a_reassignment_adds_and_drops_replicas_of_a_held_topic(
    open_log: Opener, engine_name: str, tmp_path: Path
) -> None:
    """`hold_partitions`: a cluster broker gains an empty replica of a partition moved here and drops the one moved
    away (renamed for deletion at once, like a deleted topic's); the RocketMQ engine refuses to move replicas."""
    engine = open_log()
    engine.create_topic("moved", 3, local_partitions=[0, 1])
    engine.produce("moved", 1, [Record(b"x", timestamp_ms=TS)])
    if engine_name != "kafka":
        with pytest.raises(InvalidReplicaAssignmentError, match="Kafka engine"):
            engine.hold_partitions("moved", [1, 2])
        engine.hold_partitions("moved", [1, 0])  # what it holds already: nothing to do
        return
    with pytest.raises(InvalidPartitionsError):
        engine.hold_partitions("moved", [3])
    engine.hold_partitions("moved", [1, 2])
    assert engine.topics()["moved"].local_partitions == (1, 2)
    assert engine.log_end_offset("moved", 2) == 0 and [r.value for r in engine.consume("moved", 1)] == [b"x"]
    with pytest.raises(UnknownTopicOrPartitionError, match="no replica of moved-0"):
        engine.partition("moved", 0)
    engine.hold_partitions("moved", [])
    engine.close()
    assert not (tmp_path / "data" / "moved-1").exists() and not deletion_leftovers(tmp_path / "data")
    engine = open_log()
    assert engine.topics()["moved"].local_partitions == ()
    assert not [key for key in engine.partitions() if key[0] == "moved"]


def deletion_leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_dir() and p.name.endswith("-delete")]


def test_a_topic_with_the_longest_name_is_deleted_for_good(open_log: Opener, tmp_path: Path) -> None:
    """249 characters, the most Kafka allows: `<topic>-<partition>` plus the deletion suffix is longer than a file
    name may be, so the deletion name is shortened (as Kafka's logDeleteDirName does)."""
    name = "t" * 249
    engine = open_log()
    engine.create_topic(name, 2)
    engine.create_topic("kept", 1)
    engine.produce(name, 1, [Record(b"doomed", timestamp_ms=TS)])
    engine.delete_topic(name)
    assert sorted(engine.topics()) == ["kept"]
    with pytest.raises(UnknownTopicOrPartitionError):
        engine.log_end_offset(name, 0)
    engine.close()
    assert not deletion_leftovers(tmp_path / "data")
    assert not [p for p in (tmp_path / "data").rglob(f"{name}*")]
    engine = open_log()
    assert sorted(engine.topics()) == ["kept"]
    engine.create_topic(name, 1)
    assert list(engine.consume(name, 0)) == []


def test_a_handle_to_a_deleted_partition_says_the_partition_is_gone(open_log: Opener) -> None:
    """A server may hold a partition's handle while an admin thread deletes its topic: the next call on it answers
    UNKNOWN_TOPIC_OR_PARTITION (what a client then sees), not a storage error."""
    engine = open_log()
    engine.create_topic("t", 1)
    engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
    handle = engine.partition("t", 0)
    engine.delete_topic("t")
    with pytest.raises(UnknownTopicOrPartitionError):
        handle.read(0, 1024)
    with pytest.raises(UnknownTopicOrPartitionError):
        handle.append(build_batch([Record(b"y", timestamp_ms=TS)]))


def test_a_deleted_topic_is_renamed_at_once_and_its_files_removed_later(engine_name: str, tmp_path: Path) -> None:
    """log.segment.delete.delay.ms (Kafka's file.delete.delay.ms): the deletion renames; the files go after the
    delay, at close, or - after a crash - at the next start."""
    config = {**ENGINE_CONFIGS[engine_name], "log.segment.delete.delay.ms": 60_000}
    engine = tidelog.open(tmp_path / "data", engine=engine_name, config=config)
    try:
        engine.create_topic("doomed", 3)
        engine.produce("doomed", 0, [Record(b"x", timestamp_ms=TS)])
        engine.flush()  # the RocketMQ engine writes a queue's files when it dispatches to it
        engine.delete_topic("doomed")
        assert "doomed" not in engine.topics()
        renamed = deletion_leftovers(tmp_path / "data")
        assert renamed and all(p.name.startswith("doomed") for p in renamed)
        engine.create_topic("doomed", 1)  # the name is free at once
        assert engine.log_end_offset("doomed", 0) == 0
    finally:
        engine.close()
    assert not deletion_leftovers(tmp_path / "data")
    stale = tmp_path / "data" / ("consumequeue" if engine_name == "rocketmq" else "") / "left.0123-delete"
    stale.mkdir()
    (stale / "00000000000000000000.log").write_bytes(b"x" * 100)
    tidelog.open(tmp_path / "data", engine=engine_name, config=config, background=False).close()
    assert not stale.exists()


UNCLEAN_CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[3])
    import tidelog
    from tidelog import Record
    config = {**eval(sys.argv[4])}
    engine = tidelog.open(sys.argv[1], engine=sys.argv[2], config=config, background=False)
    engine.create_topic("t", 1)
    for b in range(30):
        engine.produce("t", 0, [Record(b"v%d.%d" % (b, i), key=b"k", timestamp_ms=1_700_000_000_000 + b)
                                for i in range(1 + b % 3)])
    engine.flush("t", 0)
    os._exit(0)  # no close: no clean-shutdown marker, the abort file stays
    """
)


def test_recovery_after_an_unclean_exit(open_log: Opener, engine_name: str, tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(UNCLEAN_CHILD)
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data"), engine_name, str(SRC), repr(ENGINE_CONFIGS[engine_name])],
        check=True,
        timeout=60,
    )
    engine = open_log()
    expected = [(b"v%d.%d" % (b, i), TS + b) for b in range(30) for i in range(1 + b % 3)]
    assert [(r.value, r.timestamp_ms) for r in engine.consume("t", 0)] == expected
    assert engine.log_end_offset("t", 0) == len(expected)
    assert engine.produce("t", 0, [Record(b"after")]) == len(expected)
    engine.close()
    engine = open_log()
    assert [r.value for r in engine.consume("t", 0, len(expected))] == [b"after"]


RETRY_CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[3])
    import tidelog
    from tidelog import Record
    from tidelog.codec.record_batch import build_batch
    background = sys.argv[5] == "background"
    engine = tidelog.open(sys.argv[1], engine=sys.argv[2], config=eval(sys.argv[4]), background=background)
    engine.create_topic("t", 1)
    records = [Record(b"idempotent-%d" % i, timestamp_ms=1_700_000_000_000) for i in range(3)]
    engine.append("t", 0, build_batch(records, producer_id=7, producer_epoch=0, base_sequence=0))
    def others(batches):
        for b in range(batches):
            engine.produce("t", 0, [Record(b"other", timestamp_ms=1_700_000_000_000) for _ in range(100)])
    others(50)  # 5,000 offsets from another writer after the idempotent batch
    if background:
        time.sleep(2.5)  # the engine's own rounds (a RocketMQ producer snapshot), then more
        others(10)
    engine.flush("t", 0)
    os._exit(0)  # no close
    """
)


@pytest.mark.parametrize("child", ["background", "foreground"])
def test_a_batch_stored_long_ago_is_recognised_when_retried_after_a_crash(
    open_log: Opener, engine_name: str, tmp_path: Path, child: str
) -> None:
    """The producer's last batch is 5,000 (or 6,000) offsets back when it is retried after an unclean exit: it is
    answered with its original offsets, not stored twice. RocketMQ engine: with its scheduler the state comes from
    a producer snapshot and the messages after it; without (no snapshot), from the whole queue."""
    script = tmp_path / "child.py"
    script.write_text(RETRY_CHILD)
    config = {**ENGINE_CONFIGS[engine_name], "tidelog.rocketmq.mapedFileSizeCommitLog": 1 << 20,
              "tidelog.rocketmq.mapedFileSizeConsumeQueue": 300_000 * 20, "log.segment.bytes": 1 << 20}  # fmt: skip
    config = {k: v for k, v in config.items() if k.startswith("tidelog.rocketmq.") == (engine_name == "rocketmq")}
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data"), engine_name, str(SRC), repr(config), child],
        check=True,
        timeout=60,
    )
    snapshots = sorted((tmp_path / "data" / "tidelog-producer-snapshots").glob("t-0/*.snapshot"))
    if engine_name == "rocketmq":
        assert [p.name for p in snapshots] == (["00000000000000005003.snapshot"] if child == "background" else [])
    engine = open_log(**config)
    end = engine.log_end_offset("t", 0)
    assert end == 3 + (6000 if child == "background" else 5000)
    records = [Record(b"idempotent-%d" % i, timestamp_ms=TS) for i in range(3)]
    retried = engine.append("t", 0, build_batch(records, producer_id=7, producer_epoch=0, base_sequence=0))
    assert (retried.base_offset, retried.last_offset) == (0, 2)
    assert engine.log_end_offset("t", 0) == end
    following = build_batch([Record(b"next", timestamp_ms=TS)], producer_id=7, producer_epoch=0, base_sequence=3)
    assert engine.append("t", 0, following).base_offset == end


def test_retention_deletes_whole_old_files_and_moves_the_log_start(open_log: Opener) -> None:
    engine = open_log()
    written = fill(engine, batches=120)
    assert expire_old_files(engine) > 0
    start = engine.log_start_offset("t", 0)
    assert 0 < start <= len(written)  # Kafka may delete the active segment too (it rolls a new one)
    assert engine.log_end_offset("t", 0) == len(written)
    with pytest.raises(OffsetOutOfRangeError):
        engine.read("t", 0, start - 1, 1 << 20)
    assert as_tuples(list(engine.consume("t", 0))) == as_tuples(written[start:])
    assert engine.produce("t", 0, [Record(b"new", timestamp_ms=TS + 10_000)]) == len(written)
    engine.close()
    engine = open_log()
    assert engine.log_start_offset("t", 0) == start
    assert engine.log_end_offset("t", 0) == len(written) + 1


def test_without_transactions_everything_readable_is_stable(open_log: Opener) -> None:
    """No transaction: the last stable offset is the high watermark and nothing is aborted; a marker for a
    producer without an open transaction is still written (as Kafka writes it)."""
    engine = open_log()
    written = fill(engine, batches=6)
    partition = engine.partition("t", 0)
    assert partition.last_stable_offset == partition.high_watermark == len(written)
    assert partition.aborted_transactions(0, len(written)) == []
    assert as_tuples(read_records(engine, "t", 0)) == as_tuples(written)
    data = partition.read(0, 1 << 20, max_offset=3).read_bytes()
    assert [r.offset for info in iter_batches(data) for r in decode_batch(data, info)][-1] < 3
    assert partition.append_marker(77, 0, 0, commit=True).base_offset == len(written)
    assert partition.last_stable_offset == len(written) + 1


# --- transactions (both engines: the RocketMQ engine keeps them in its own files, docs/storage.md) -----------------


def txn_batch(producer_id: int, sequence: int, *, epoch: int = 0, count: int = 2, transactional: bool = True) -> bytes:
    records = [Record(b"p%d-s%d" % (producer_id, sequence + i), timestamp_ms=TS + i) for i in range(count)]
    return build_batch(
        records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, is_transactional=transactional
    )


def batch_kinds(partition: Partition, offset: int = 0, max_offset: int | None = None) -> list[tuple[int, ...]]:
    """(base offset, last offset, producer id, transactional, control) of each batch read from `offset`."""
    data = partition.read(offset, 1 << 20, max_offset=max_offset).read_bytes()
    return [
        (info.base_offset, info.last_offset, info.header.producer_id, info.header.is_transactional,
         info.header.is_control)
        for info in iter_batches(data)
    ]  # fmt: skip


def test_markers_close_transactions_and_move_the_last_stable_offset(open_log: Opener) -> None:
    """Producer 1 commits (offsets 0-1, marker 6), 2 aborts (2-3, marker 7), 3 stays open from 4: the last stable
    offset, the aborted list a read_committed fetch gets, the producers, and what a read returns (the producer and
    attribute bits of each batch, the markers as control batches) are the same in both engines."""
    engine = open_log()
    engine.create_topic("t", 1)
    partition = engine.partition("t", 0)
    for producer in (1, 2, 3):
        partition.append(txn_batch(producer, 0))
    assert partition.last_stable_offset == 0
    assert partition.append_marker(1, 0, coordinator_epoch=5, commit=True).base_offset == 6
    assert partition.last_stable_offset == 2
    partition.append_marker(2, 0, coordinator_epoch=5, commit=False)
    assert (partition.log_end_offset, partition.high_watermark, partition.last_stable_offset) == (8, 8, 4)
    assert partition.aborted_transactions(0, 8) == [AbortedTransaction(2, 2)]
    assert partition.aborted_transactions(8, 9) == []  # its marker is below the fetch offset
    assert partition.aborted_transactions(0, 2) == []  # it starts at the upper bound
    producers = {p.producer_id: (p.coordinator_epoch, p.current_txn_start_offset) for p in partition.active_producers()}
    assert producers == {1: (5, -1), 2: (5, -1), 3: (-1, 4)}
    assert batch_kinds(partition) == [
        (0, 1, 1, True, False), (2, 3, 2, True, False), (4, 5, 3, True, False), (6, 6, 1, True, True),
        (7, 7, 2, True, True),
    ]  # fmt: skip
    assert batch_kinds(partition, 0, max_offset=partition.last_stable_offset) == batch_kinds(partition)[:2]
    data = partition.read(6, 1 << 20).read_bytes()
    [marker] = decode_batch(data, next(iter_batches(data)))
    assert parse_control_record(marker) == (ControlRecordType.COMMIT, 5)
    partition.append_marker(3, 0, coordinator_epoch=5, commit=False)
    assert partition.last_stable_offset == partition.high_watermark == 9
    assert partition.aborted_transactions(0, 9) == [AbortedTransaction(2, 2), AbortedTransaction(3, 4)]


def test_kafkas_transaction_refusals_leave_the_log_unchanged(open_log: Opener) -> None:
    engine = open_log()
    engine.create_topic("t", 1)
    partition = engine.partition("t", 0)
    partition.append(txn_batch(1, 0, epoch=2))
    partition.append_marker(1, 2, coordinator_epoch=4, commit=True)
    partition.append(txn_batch(1, 2, epoch=2))
    end = partition.log_end_offset
    with pytest.raises(InvalidProducerEpochError):
        partition.append(txn_batch(1, 0, epoch=1))
    with pytest.raises(InvalidTxnStateError):
        partition.append(txn_batch(1, 4, epoch=2, transactional=False))
    with pytest.raises(InvalidProducerEpochError):
        partition.append_marker(1, 1, coordinator_epoch=4, commit=False)
    with pytest.raises(TransactionCoordinatorFencedError):
        partition.append_marker(1, 2, coordinator_epoch=3, commit=False)
    control = build_control_batch(ControlRecordType.COMMIT, producer_id=1, producer_epoch=2, timestamp_ms=TS)
    with pytest.raises(InvalidRecordError, match="control"):
        partition.append(control)
    assert partition.log_end_offset == end and partition.last_stable_offset == 3


TXN_CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[3])
    import tidelog
    from tidelog import Record
    from tidelog.codec.record_batch import build_batch
    engine = tidelog.open(sys.argv[1], engine=sys.argv[2], config=eval(sys.argv[4]), background=False)
    engine.create_topic("t", 1)
    partition = engine.partition("t", 0)
    def txn(producer, sequence):
        records = [Record(b"p%d-s%d" % (producer, sequence + i), timestamp_ms=1_700_000_000_000) for i in range(2)]
        return build_batch(records, producer_id=producer, producer_epoch=0, base_sequence=sequence,
                           is_transactional=True)
    def plain(batches):
        for _ in range(batches):
            partition.append(build_batch([Record(b"x" * 200, timestamp_ms=1_700_000_000_000)]))
    plain(3)
    partition.append(txn(1, 0))                  # 3-4: stays open
    partition.append(txn(2, 0))                  # 5-6, aborted by marker 8
    plain(1)
    partition.append_marker(2, 0, 3, False)
    partition.append(txn(4, 0))                  # 9-10, committed by marker 11
    partition.append_marker(4, 0, 3, True)
    plain(8)                                     # the Kafka engine rolls (and snapshots) on the way
    if hasattr(partition, "snapshot_producer_state"):
        partition.snapshot_producer_state(force=True)  # what the RocketMQ engine's scheduler does every second
    partition.append(txn(5, 0))                  # 20-21, aborted by marker 22, after the snapshot
    partition.append_marker(5, 0, 3, False)
    plain(1)
    engine.flush("t", 0)
    os._exit(0)  # killed mid-transaction: no close
    """
)


@pytest.mark.parametrize("how", ["with-snapshot", "without-snapshot"])
def test_a_crash_mid_transaction_keeps_it_open_and_the_aborts(
    open_log: Opener, engine_name: str, tmp_path: Path, how: str
) -> None:
    """After a crash with producer 1's transaction open, the reopened log has the same last stable offset, aborted
    transactions and open transaction, from the producer snapshot and the log after it, or (its snapshots deleted)
    from the whole log; the transaction then goes on and is aborted."""
    script = tmp_path / "child.py"
    script.write_text(TXN_CHILD)
    config = ENGINE_CONFIGS[engine_name]
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data"), engine_name, str(SRC), repr(config)],
        check=True,
        timeout=60,
    )
    snapshots = list((tmp_path / "data").glob("**/*.snapshot"))
    assert snapshots
    if how == "without-snapshot":
        for snapshot in snapshots:
            snapshot.unlink()
    engine = open_log()
    partition = engine.partition("t", 0)
    assert (partition.log_end_offset, partition.last_stable_offset) == (24, 3)
    assert partition.aborted_transactions(0, 24) == [AbortedTransaction(2, 5), AbortedTransaction(5, 20)]
    assert {p.producer_id: p.current_txn_start_offset for p in partition.active_producers()} == {
        1: 3, 2: -1, 4: -1, 5: -1
    }  # fmt: skip
    partition.append(txn_batch(1, 2))  # the same transaction goes on
    partition.append_marker(1, 0, 3, commit=False)
    assert partition.aborted_transactions(0, 100)[-1] == AbortedTransaction(1, 3)
    assert partition.last_stable_offset == partition.log_end_offset == 27
    engine.close()
    engine = open_log()
    partition = engine.partition("t", 0)
    assert partition.last_stable_offset == 27
    assert partition.aborted_transactions(0, 27) == [
        AbortedTransaction(2, 5), AbortedTransaction(5, 20), AbortedTransaction(1, 3)
    ]  # fmt: skip
