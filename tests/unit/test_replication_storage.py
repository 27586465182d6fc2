"""The storage half of replication (storage/api.py's replica calls), on real files: a follower's log built with
append_replica from a leader's reads is the leader's byte for byte; the checks that refuse batches that do not
continue the log; the high watermark a replicated log leaves to the broker (reads clipped at it, ListOffsets LATEST,
replication-offset-checkpoint); follower truncation (truncate_to, truncate_fully_and_start_at) with its indexes,
leader epochs, producer state, key index and reopening; and the RocketMQ engine refusing the replica calls.

Batch headers are read with `struct`, independently of the engine's readers.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.codec.record_set import decode_batch, iter_batches
from tidelog.config import EngineConfig, LogConfig
from tidelog.errors import (
    ConfigError,
    CrcMismatchError,
    OffsetOutOfRangeError,
    ReplicationUnsupportedError,
    UnexpectedAppendOffsetError,
)
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.api import LATEST_TIMESTAMP
from tidelog.storage.kafka.engine import KafkaEngine
from tidelog.storage.kafka.partition_log import PartitionLog

TS = 1_700_000_000_000
HEADER = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2 header, 61 bytes
PRODUCER = 4242
SMALL = LogConfig(segment_bytes=1500, index_interval_bytes=200)
TOPIC_ID = new_kafka_uuid()


# --- helpers ------------------------------------------------------------------------------------------------------


def headers(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(position, size, base offset, last offset, partition leader epoch) of each whole batch in `data`."""
    found = []
    position = 0
    while position + HEADER.size <= len(data):
        base, length, epoch, _magic, _crc, _attributes, last_delta, *_rest = HEADER.unpack_from(data, position)
        if position + 12 + length > len(data):
            break
        found.append((position, 12 + length, base, base + last_delta, epoch))
        position += 12 + length
    return found


def whole_batches(data: bytes) -> bytes:
    """The complete batches of a read (its last batch may be cut short by max_bytes), as a fetcher keeps them."""
    batches = headers(data)
    return data[: batches[-1][0] + batches[-1][1]] if batches else b""


def producer_batch(sequence: int, count: int = 3, *, tag: str = "v") -> bytes:
    records = [
        Record(f"{tag}{sequence}-{i}".encode().ljust(40, b"."), key=f"k{sequence}-{i}".encode(), timestamp_ms=TS + i)
        for i in range(count)
    ]
    return build_batch(records, producer_id=PRODUCER, producer_epoch=0, base_sequence=sequence)


def open_log(
    directory: Path,
    config: LogConfig = SMALL,
    *,
    replicated: bool = False,
    recovery_point: int = 0,
    log_start_offset: int = 0,
    had_clean_shutdown: bool = True,
) -> PartitionLog:
    """The partition `t-0` in `directory`, without a scheduler (deletions and checkpoint writes happen at once)."""
    return PartitionLog(
        directory,
        "t",
        0,
        TOPIC_ID,
        config,
        replicated=replicated,
        recovery_point=recovery_point,
        log_start_offset=log_start_offset,
        had_clean_shutdown=had_clean_shutdown,
    )


def leader_with_epochs(directory: Path, batches: int = 24) -> PartitionLog:
    """A leader of `batches` producer batches of 3 records: the first third in epoch 0, the rest in epoch 3."""
    leader = open_log(directory, replicated=True)
    for sequence in range(batches):
        leader.leader_epoch = 0 if sequence < batches // 3 else 3
        leader.append(producer_batch(sequence * 3))
    return leader


def replicate(leader: PartitionLog, follower: PartitionLog, chunk_bytes: int = 700) -> int:
    """Fetch from the leader (up to its log end) into the follower as a replica fetcher would; returns the fetches."""
    fetches = 0
    while follower.log_end_offset < leader.log_end_offset:
        data = leader.read(follower.log_end_offset, chunk_bytes, up_to_log_end=True).read_bytes()
        follower.append_replica(whole_batches(data))
        fetches += 1
    return fetches


def files(directory: Path, *suffixes: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name.endswith(suffixes)}


def read_all(partition: PartitionLog, offset: int, *, up_to_log_end: bool = False) -> bytes:
    return partition.read(offset, 1 << 30, up_to_log_end=up_to_log_end).read_bytes()


def offsets_in(data: bytes) -> list[int]:
    return [record.offset for info in iter_batches(data) for record in decode_batch(data, info)]


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[PartitionLog]:
    partition = leader_with_epochs(tmp_path / "leader" / "t-0")
    yield partition
    partition.close()


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[PartitionLog]:
    partition = open_log(tmp_path / "follower" / "t-0", replicated=True)
    yield partition
    partition.close()


# =================================================================================================================
# append_replica
# =================================================================================================================


def test_a_follower_log_is_the_leaders_byte_for_byte(leader: PartitionLog, follower: PartitionLog) -> None:
    assert len(leader.segments) >= 4  # the leader rolled on segment.bytes
    assert replicate(leader, follower) > 3  # in several fetches, each of several batches
    assert follower.log_end_offset == leader.log_end_offset == 72
    assert files(follower.directory, ".log", ".index", ".timeindex") == files(
        leader.directory, ".log", ".index", ".timeindex"
    )
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries() == [(0, 0), (3, 24)]
    epochs = "leader-epoch-checkpoint"
    assert (follower.directory / epochs).read_text() == (leader.directory / epochs).read_text() == "0\n2\n0 0\n3 24\n"
    assert {h[4] for h in headers(read_all(follower, 0, up_to_log_end=True))} == {0, 3}  # the leader's epochs kept
    assert follower.high_watermark == 0  # a replicated log's high watermark is the broker's to move


def test_a_follower_made_leader_answers_a_producers_retry_as_a_duplicate(
    leader: PartitionLog, follower: PartitionLog
) -> None:
    replicate(leader, follower)
    follower.leader_epoch = 4
    retry = follower.append(producer_batch(23 * 3))  # the last batch the producer sent to the old leader
    assert (retry.base_offset, retry.last_offset, retry.size_in_bytes) == (69, 71, 0)
    assert follower.log_end_offset == 72


def test_append_replica_returns_the_leaders_offsets_and_keeps_the_high_watermark(
    leader: PartitionLog, follower: PartitionLog
) -> None:
    data = whole_batches(leader.read(0, 400, up_to_log_end=True).read_bytes())
    result = follower.append_replica(data)
    batches = headers(data)
    assert (result.base_offset, result.last_offset) == (0, batches[-1][3])
    assert result.record_count == 3 * len(batches)
    assert result.size_in_bytes == len(data)
    assert (follower.log_end_offset, follower.high_watermark) == (batches[-1][3] + 1, 0)


def test_on_a_single_node_append_replica_moves_the_high_watermark_with_the_end(tmp_path: Path) -> None:
    single = open_log(tmp_path / "t-0")
    single.append_replica(build_batch([Record(b"x", timestamp_ms=TS)], base_offset=0, partition_leader_epoch=2))
    assert (single.log_end_offset, single.high_watermark, single.latest_epoch) == (1, 1, 2)
    single.close()


REFUSALS = ["a gap at the log end", "a gap between two batches", "below the log end", "a bad CRC"]


@pytest.mark.parametrize("case", REFUSALS)
def test_append_replica_refuses_batches_that_do_not_continue_the_log(
    leader: PartitionLog, follower: PartitionLog, case: str
) -> None:
    """The follower holds the leader's first two batches; each refused append leaves its log as it was."""
    data = read_all(leader, 0, up_to_log_end=True)
    first, second, third, fourth, fifth = (data[b[0] : b[0] + b[1]] for b in headers(data)[:5])
    follower.append_replica(first + second)
    damaged = bytearray(third + fourth)
    damaged[-1] ^= 0xFF  # the last byte of the fourth batch: its CRC fails
    data, error = {
        "a gap at the log end": (fourth, UnexpectedAppendOffsetError),
        "a gap between two batches": (third + fifth, UnexpectedAppendOffsetError),
        "below the log end": (second + third, UnexpectedAppendOffsetError),
        "a bad CRC": (bytes(damaged), CrcMismatchError),
    }[case]
    before = (files(follower.directory, ".log"), follower.log_end_offset, follower.leader_epoch_cache.entries())
    with pytest.raises(error):
        follower.append_replica(data)
    assert (files(follower.directory, ".log"), follower.log_end_offset, follower.leader_epoch_cache.entries()) == before
    assert follower.producer_state.producers.keys() <= {PRODUCER}


def test_a_compacted_topics_replica_takes_the_gaps_the_cleaner_left(tmp_path: Path) -> None:
    compacted = open_log(tmp_path / "t-0", dataclasses.replace(SMALL, cleanup_policy=("compact",)), replicated=True)
    records = [Record(b"v", key=b"k", timestamp_ms=TS)]
    compacted.append_replica(build_batch(records, base_offset=5) + build_batch(records, base_offset=9))
    assert compacted.log_end_offset == 10
    with pytest.raises(UnexpectedAppendOffsetError):  # never below the log end, compacted or not
        compacted.append_replica(build_batch(records, base_offset=8))
    compacted.close()


# =================================================================================================================
# the high watermark of a replicated log
# =================================================================================================================


def test_reads_stop_below_the_high_watermark(leader: PartitionLog) -> None:
    everything = read_all(leader, 0, up_to_log_end=True)
    batches = headers(everything)
    assert (leader.high_watermark, leader.log_end_offset) == (0, 72)
    assert leader.read(0, 1 << 20).slices == ()  # nothing is readable below a high watermark of 0
    assert offsets_in(everything) == list(range(72))

    boundary = batches[9]  # in the second or a later segment
    leader.set_high_watermark(boundary[2])
    assert offsets_in(read_all(leader, 0)) == list(range(boundary[2]))
    assert read_all(leader, 0) == everything[: boundary[0]]  # whole batches, clipped at the batch holding it

    leader.set_high_watermark(boundary[2] + 4)  # mid-batch: that batch stays out
    assert offsets_in(read_all(leader, 0)) == list(range(boundary[2] + 3))
    assert offsets_in(read_all(leader, boundary[2] + 3)) == []  # between the high watermark and the end: nothing
    assert offsets_in(read_all(leader, 60)) == []

    leader.set_high_watermark(5)  # lower: ignored
    assert leader.high_watermark == boundary[2] + 4
    assert offsets_in(read_all(leader, 0, up_to_log_end=True)) == list(range(72))
    leader.set_high_watermark(1000)  # at most the log end
    assert leader.high_watermark == 72
    assert read_all(leader, 0) == everything


def test_the_high_watermark_clip_follows_appends(leader: PartitionLog) -> None:
    leader.set_high_watermark(30)
    assert offsets_in(read_all(leader, 0))[-1] == 29
    leader.append(producer_batch(24 * 3))
    assert offsets_in(read_all(leader, 0))[-1] == 29
    leader.set_high_watermark(75)
    assert offsets_in(read_all(leader, 0)) == list(range(75))


def test_list_offsets_answers_the_high_watermark(leader: PartitionLog) -> None:
    leader.set_high_watermark(30)
    latest = leader.offset_for_timestamp(LATEST_TIMESTAMP)
    assert latest is not None and (latest.offset, latest.leader_epoch) == (30, 3)
    assert leader.offset_for_timestamp(TS + 2) is not None  # below the high watermark
    leader.set_high_watermark(72)
    assert leader.offset_for_timestamp(LATEST_TIMESTAMP) == (-1, 72, 3)


def test_a_single_node_log_ignores_set_high_watermark(tmp_path: Path) -> None:
    single = open_log(tmp_path / "t-0")
    single.append(producer_batch(0))
    single.set_high_watermark(1)
    assert (single.high_watermark, offsets_in(read_all(single, 0))) == (3, [0, 1, 2])
    single.close()


def replicated_engine(directory: Path, *, background: bool = False, **settings: object) -> KafkaEngine:
    config = EngineConfig.from_mapping({"log.segment.bytes": 1500, **settings}, log_dir=directory)
    return KafkaEngine(dataclasses.replace(config, replicated=True), background=background)


def checkpoint_text(log_dir: Path) -> str:
    return (log_dir / "replication-offset-checkpoint").read_text()


def test_the_high_watermark_is_checkpointed_and_restored(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = replicated_engine(data)
    engine.create_topic("t", 2)
    for sequence in range(4):
        engine.partition("t", 0).append(producer_batch(sequence * 3))
    engine.partition("t", 0).set_high_watermark(9)
    engine.close()
    assert checkpoint_text(data) == "0\n2\nt 0 9\nt 1 0\n"

    engine = replicated_engine(data)
    assert (engine.partition("t", 0).high_watermark, engine.partition("t", 0).log_end_offset) == (9, 12)
    assert offsets_in(engine.read("t", 0, 0, 1 << 20).read_bytes()) == list(range(9))
    engine.close()


def test_after_an_unclean_shutdown_the_high_watermark_is_at_most_the_log_end(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = replicated_engine(data)
    engine.create_topic("t", 1)
    for sequence in range(3):
        engine.partition("t", 0).append(producer_batch(sequence * 3))
    engine.partition("t", 0).set_high_watermark(9)
    engine.checkpoint_high_watermarks()
    engine.flush()
    engine.checkpoint_recovery_points()
    segment = engine.partition("t", 0).active_segment.log_path
    cut = headers(segment.read_bytes())[-1][0]
    engine.close()
    (data / ".kafka_cleanshutdown").unlink()
    with open(segment, "r+b") as handle:  # the last batch was lost with the machine
        handle.truncate(cut + 10)

    engine = replicated_engine(data)
    partition = engine.partition("t", 0)
    assert (partition.log_end_offset, partition.high_watermark) == (6, 6)
    engine.close()


def test_the_high_watermark_checkpoint_is_written_by_the_scheduler(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = replicated_engine(data, background=True, **{"replica.high.watermark.checkpoint.interval.ms": 20})
    try:
        engine.create_topic("t", 1)
        engine.partition("t", 0).append(producer_batch(0))
        engine.partition("t", 0).set_high_watermark(2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            (data / "replication-offset-checkpoint").exists() and checkpoint_text(data).endswith("t 0 2\n")
        ):
            time.sleep(0.02)
        assert checkpoint_text(data) == "0\n1\nt 0 2\n"
    finally:
        engine.close()


def test_a_single_node_engine_writes_no_high_watermark_checkpoint(tmp_path: Path) -> None:
    engine = tidelog.open(tmp_path / "data", background=False)
    engine.create_topic("t", 1)
    engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
    engine.close()
    assert not (tmp_path / "data" / "replication-offset-checkpoint").exists()


# =================================================================================================================
# truncation
# =================================================================================================================


def test_truncate_to_mid_log_across_segments(leader: PartitionLog) -> None:
    leader.set_high_watermark(72)
    everything = read_all(leader, 0)
    batches = headers(everything)
    segments_before = [s.base_offset for s in leader.segments]
    target = 40  # mid-batch (39..41): that batch goes whole
    kept = [b for b in batches if b[3] < target]
    leader.truncate_to(target)

    assert (leader.log_end_offset, leader.high_watermark) == (39, 39)
    assert leader.recovery_point <= 39
    assert read_all(leader, 0) == everything[: kept[-1][0] + kept[-1][1]]
    assert [s.base_offset for s in leader.segments] == [b for b in segments_before if b <= target]
    assert sum(p.stat().st_size for p in leader.directory.glob("*.log")) == sum(b[1] for b in kept)
    assert not list(leader.directory.glob("*.deleted"))  # no scheduler: the files went at once
    assert leader.leader_epoch_cache.entries() == [(0, 0), (3, 24)]
    assert leader.end_offset_for_epoch(3) == (3, 39)
    for offset in (0, 24, 36, 38):  # every remaining offset reads (the cut indexes lead to the batches)
        assert offsets_in(leader.read(offset, 1).read_bytes())[-1] >= offset

    # The producer's batch 39..41 (sequence 39) is gone: sent again, it is new, not a duplicate.
    again = leader.append(producer_batch(39))
    assert (again.base_offset, again.last_offset, again.size_in_bytes > 0) == (39, 41, True)
    # Its batch at 36..38 (sequence 36) is still there: a retry of it is a duplicate.
    retry = leader.append(producer_batch(36))
    assert (retry.base_offset, retry.size_in_bytes) == (36, 0)
    assert leader.log_end_offset == 42
    leader.set_high_watermark(42)
    assert offsets_in(read_all(leader, 0)) == list(range(42))


def test_truncate_to_a_segment_boundary_and_past_the_end(leader: PartitionLog) -> None:
    second = leader.segments[1].base_offset
    log_before = files(leader.directory, ".log")
    leader.truncate_to(72)
    leader.truncate_to(500)
    assert files(leader.directory, ".log") == log_before
    leader.truncate_to(second)
    assert leader.log_end_offset == second
    assert leader.active_segment.base_offset == second and leader.active_segment.size == 0
    leader.append(producer_batch(second))
    assert leader.log_end_offset == second + 3


def test_truncation_survives_a_reopen_clean_or_not(leader: PartitionLog) -> None:
    old_recovery_point = leader.log_end_offset
    leader.flush()
    leader.truncate_to(40)
    leader.leader_epoch = 5
    leader.append(producer_batch(39, tag="new"))  # the producer's truncated batch, sent to a new leader
    expected = read_all(leader, 0, up_to_log_end=True)
    # Unclean: opened again beside the running one, with the recovery point the checkpoint held before the cut.
    crashed = open_log(leader.directory, replicated=True, recovery_point=old_recovery_point, had_clean_shutdown=False)
    assert (crashed.log_end_offset, read_all(crashed, 0, up_to_log_end=True)) == (42, expected)
    assert crashed.leader_epoch_cache.entries() == [(0, 0), (3, 24), (5, 39)]
    assert crashed.recovery_point <= 42
    crashed.close(flush=False)
    leader.close()
    reopened = open_log(leader.directory, replicated=True)
    assert (reopened.log_end_offset, read_all(reopened, 0, up_to_log_end=True)) == (42, expected)
    assert reopened.leader_epoch_cache.entries() == [(0, 0), (3, 24), (5, 39)]
    reopened.close()


def test_truncate_fully_and_start_at(leader: PartitionLog) -> None:
    leader.set_high_watermark(72)
    leader.truncate_fully_and_start_at(100)
    assert (leader.log_start_offset, leader.log_end_offset, leader.high_watermark, leader.recovery_point) == (
        100,
        100,
        100,
        100,
    )
    assert [p.name for p in sorted(leader.directory.glob("*.log"))] == [f"{100:020d}.log"]
    assert not list(leader.directory.glob("*.snapshot"))
    assert leader.leader_epoch_cache.entries() == [] and leader.latest_epoch == -1
    assert (leader.directory / "leader-epoch-checkpoint").read_text() == "0\n0\n"
    assert leader.producer_state.producers == {}
    with pytest.raises(OffsetOutOfRangeError):
        leader.read(0, 100)
    leader.append_replica(build_batch([Record(b"x", timestamp_ms=TS)], base_offset=100, partition_leader_epoch=7))
    assert (leader.log_end_offset, leader.latest_epoch) == (101, 7)
    leader.close()
    reopened = open_log(leader.directory, replicated=True, log_start_offset=100)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (100, 101)
    reopened.close()


def test_truncate_to_below_the_first_segment_starts_over(tmp_path: Path) -> None:
    follower = open_log(tmp_path / "t-0", replicated=True)
    follower.truncate_fully_and_start_at(50)
    follower.append_replica(build_batch([Record(b"x", timestamp_ms=TS)], base_offset=50))
    follower.truncate_to(20)
    assert (follower.log_start_offset, follower.log_end_offset) == (20, 20)
    follower.close()


def test_end_offset_for_epoch(leader: PartitionLog) -> None:
    assert leader.latest_epoch == 3
    assert leader.end_offset_for_epoch(0) == (0, 24)
    assert leader.end_offset_for_epoch(1) == (0, 24)
    assert leader.end_offset_for_epoch(3) == (3, 72)
    assert leader.end_offset_for_epoch(4) == (-1, -1)


def test_the_key_index_follows_a_truncation(tmp_path: Path) -> None:
    engine = tidelog.open(tmp_path / "data", config={"tidelog.index.keys": True}, background=False)
    engine.create_topic("t", 1)
    for i in range(6):
        engine.produce("t", 0, [Record(b"old", key=f"k{i}".encode(), timestamp_ms=TS)])
    assert [loc.offset for loc in engine.lookup_key("t", b"k5")] == [5]
    partition = engine.partition("t", 0)
    partition.truncate_to(3)
    for i in range(3):
        engine.produce("t", 0, [Record(b"new", key=f"n{i}".encode(), timestamp_ms=TS)])
    assert [loc.offset for loc in engine.lookup_key("t", b"n2")] == [5]
    assert engine.lookup_key("t", b"k5") == []
    assert [loc.offset for loc in engine.lookup_key("t", b"k2")] == [2]
    engine.close()


# =================================================================================================================
# the RocketMQ engine: one replica per queue
# =================================================================================================================


def test_the_rocketmq_engine_refuses_the_replica_calls(tmp_path: Path) -> None:
    engine = tidelog.open(tmp_path / "data", engine="rocketmq", background=False)
    engine.create_topic("t", 1)
    engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
    queue = engine.partition("t", 0)
    batch = build_batch([Record(b"y", timestamp_ms=TS)], base_offset=1)
    for call in (lambda: queue.append_replica(batch), lambda: queue.truncate_to(0)):
        with pytest.raises(ReplicationUnsupportedError, match="one replica per queue"):
            call()
    with pytest.raises(ReplicationUnsupportedError):
        queue.truncate_fully_and_start_at(5)
    queue.set_high_watermark(0)
    assert (queue.high_watermark, queue.end_offset_for_epoch(0), queue.latest_epoch) == (1, (-1, -1), -1)
    assert len(queue.read(0, 1 << 20, up_to_log_end=True).read_bytes()) > 0
    engine.close()


def test_min_insync_replicas_is_a_topic_key_with_a_broker_default() -> None:
    assert LogConfig().min_insync_replicas == 1
    assert LogConfig().with_overrides({"min.insync.replicas": "2"}).min_insync_replicas == 2
    config = EngineConfig.from_mapping(
        {"min.insync.replicas": "3", "replica.high.watermark.checkpoint.interval.ms": "250"}
    )
    assert (config.log_defaults.min_insync_replicas, config.high_watermark_checkpoint_interval_ms) == (3, 250)
    assert (EngineConfig().high_watermark_checkpoint_interval_ms, EngineConfig().replicated) == (5000, False)
    with pytest.raises(ConfigError, match=r"min\.insync\.replicas"):
        LogConfig().with_overrides({"min.insync.replicas": "0"})


def test_consume_stops_at_the_high_watermark_unless_asked_for_the_log_end(tmp_path: Path) -> None:
    """A new leader replays its internal topics (`__consumer_offsets`) to the log end, as Kafka's group coordinator
    loads them: its high watermark may still be below records its ISR already holds (red before: the replay stopped
    at the high watermark and lost the newest committed offsets)."""
    with replicated_engine(tmp_path / "log") as engine:
        engine.create_topic("t", 1)
        for i in range(4):
            engine.partition("t", 0).append(build_batch([Record(f"v{i}".encode())]))
        engine.partition("t", 0).set_high_watermark(2)
        assert [r.value for r in engine.consume("t", 0)] == [b"v0", b"v1"]
        assert [r.value for r in engine.consume("t", 0, up_to_log_end=True)] == [b"v0", b"v1", b"v2", b"v3"]
