"""The effects of Kafka 3.9's topic keys on the engines, and broker defaults changed while a log is open.

compression.type recompresses a producer's batch into the topic's codec (its records, offsets and producer ids
unchanged); message.timestamp.before/after.max.ms (and the deprecated difference key) refuse records outside the
window with InvalidTimestampError; `set_log_defaults` makes topics without an override follow new broker defaults at
once. Every stored batch is read back from the segment file's bytes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import build_batch, decode_records, read_header
from tidelog.config import LogConfig
from tidelog.errors import ConfigError, InvalidTimestampError, RecordTooLargeError


def stored_batches(engine: tidelog.StorageEngine, topic: str) -> list[bytes]:
    data = b"".join(s.read() for s in engine.read(topic, 0, 0, 1 << 20).slices)
    batches, position = [], 0
    while position < len(data):
        header = read_header(data, position)
        batches.append(data[position : position + header.size_in_bytes])
        position += header.size_in_bytes
    return batches


@pytest.mark.parametrize(("target", "sent"), [("zstd", "lz4"), ("gzip", "none"), ("uncompressed", "snappy")])
def test_compression_type_recompresses_each_batch(tmp_path: Path, target: str, sent: str) -> None:
    with tidelog.open(tmp_path, background=False) as engine:
        engine.create_topic("t", 1, {"compression.type": target})
        records = [Record(b"value-%d" % i, key=b"k%d" % i, timestamp_ms=1_700_000_000_000 + i) for i in range(5)]
        batch = build_batch(records, compression=Compression.from_name(sent), producer_id=7, base_sequence=0)
        assert engine.append("t", 0, batch).base_offset == 0
        (stored,) = stored_batches(engine, "t")
        header = read_header(stored)
        expected = Compression.NONE if target == "uncompressed" else Compression.from_name(target)
        assert header.compression is expected
        assert (header.producer_id, header.base_sequence, header.records_count) == (7, 0, 5)
        assert [(r.key, r.value, r.timestamp_ms) for r in decode_records(stored)] == [
            (r.key, r.value, r.timestamp_ms) for r in records
        ]


def test_compression_type_producer_keeps_the_producers_codec(tmp_path: Path) -> None:
    with tidelog.open(tmp_path, background=False) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"x" * 100)], compression="lz4")
        assert read_header(stored_batches(engine, "t")[0]).compression is Compression.LZ4


@pytest.mark.parametrize(
    ("configs", "offset_ms"),
    [
        ({"message.timestamp.before.max.ms": "60000"}, -3_600_000),
        ({"message.timestamp.after.max.ms": "60000"}, 3_600_000),
        ({"message.timestamp.difference.max.ms": "60000"}, -3_600_000),
    ],
)
def test_timestamp_window_refuses_records_outside_it(tmp_path: Path, configs: dict[str, str], offset_ms: int) -> None:
    with tidelog.open(tmp_path, background=False) as engine:
        engine.create_topic("t", 1, configs)
        now = int(time.time() * 1000)
        engine.produce("t", 0, [Record(b"now", timestamp_ms=now)])
        with pytest.raises(InvalidTimestampError, match="out of range"):
            engine.produce("t", 0, [Record(b"ok", timestamp_ms=now), Record(b"far", timestamp_ms=now + offset_ms)])
        assert engine.log_end_offset("t", 0) == 1  # nothing of the refused batch was kept


def test_log_append_time_ignores_the_window(tmp_path: Path) -> None:
    with tidelog.open(tmp_path, background=False) as engine:
        engine.create_topic("t", 1, {"message.timestamp.type": "LogAppendTime", "message.timestamp.before.max.ms": "0"})
        engine.produce("t", 0, [Record(b"old", timestamp_ms=1)])
        assert engine.log_end_offset("t", 0) == 1


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"compression.type": "brotli"}, "compression.type"),
        ({"compression.gzip.level": "0"}, "gzip level"),
        ({"compression.zstd.level": "23"}, "zstd level"),
        ({"leader.replication.throttled.replicas": "0-101"}, "partitionId:brokerId"),
        ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms"),
        ({"remote.storage.enable": "true"}, "Tiered Storage"),
        ({"local.retention.ms": "-3"}, "local.retention.ms"),
    ],
)
def test_bad_topic_values_are_refused(tmp_path: Path, configs: dict[str, str], message: str) -> None:
    with tidelog.open(tmp_path, background=False) as engine, pytest.raises(ConfigError, match=message):
        engine.create_topic("t", 1, configs)


def test_every_kafka_topic_key_is_accepted(tmp_path: Path) -> None:
    accepted = {
        "compression.gzip.level": "9",
        "compression.lz4.level": "17",
        "compression.zstd.level": "-5",
        "message.downconversion.enable": "false",
        "message.format.version": "2.8",
        "preallocate": "true",
        "leader.replication.throttled.replicas": "*",
        "follower.replication.throttled.replicas": "0:1,1:2",
        "remote.storage.enable": "false",
        "local.retention.ms": "-2",
        "local.retention.bytes": "1000",
        "remote.log.copy.disable": "true",
        "remote.log.delete.on.disable": "true",
    }
    with tidelog.open(tmp_path, background=False) as engine:
        assert engine.create_topic("t", 1, accepted).configs == accepted


def test_new_broker_defaults_reach_topics_without_an_override(tmp_path: Path) -> None:
    with tidelog.open(tmp_path, background=False) as engine:
        engine.create_topic("plain", 1)
        engine.create_topic("own", 1, {"max.message.bytes": "100000"})
        engine.set_log_defaults(LogConfig().with_overrides({"max.message.bytes": "200"}))
        with pytest.raises(RecordTooLargeError):
            engine.produce("plain", 0, [Record(b"x" * 500)])
        engine.produce("own", 0, [Record(b"x" * 500)])  # its own override still holds
        engine.set_log_defaults(LogConfig())
        engine.produce("plain", 0, [Record(b"x" * 500)])
