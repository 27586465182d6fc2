"""`__consumer_offsets` as Kafka keeps it: a compacted topic (DescribeConfigs says cleanup.policy=compact), compacted
by the log cleaner on the Kafka engine and by the offset store itself where no cleaner runs (the RocketMQ engine, or
log.cleaner.enable=false); either way a group's committed offset survives a restart.

Each broker here has one offsets partition with small segments (offsets.topic.segment.bytes), so a few hundred
commits of one group fill several segments.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tidelog.config import EngineConfig
from tidelog.storage import open_engine

OFFSETS = "__consumer_offsets"
TOPIC, GROUP = "committed", "committing-group"
COMMITS = 300
SEGMENT_BYTES = 2048
TIMEOUT_S = 30.0


def describe_offsets_topic(bootstrap: str) -> dict[str, str]:
    client = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, OFFSETS)
    described = client.describe_configs([resource], request_timeout=15)[resource].result(timeout=TIMEOUT_S)
    return {name: entry.value for name, entry in described.items()}


def commit_many(bootstrap: str) -> None:
    """COMMITS commits of one partition's offset, one request each: 0, 1, ..., COMMITS - 1."""
    client = AdminClient({"bootstrap.servers": bootstrap})
    client.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(timeout=TIMEOUT_S)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        for offset in range(COMMITS):
            consumer.commit(offsets=[TopicPartition(TOPIC, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def committed(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        [found] = consumer.committed([TopicPartition(TOPIC, 0)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return found.offset


def records_in_offsets_topic(bootstrap: str) -> tuple[int, int]:
    """(log start offset, records from there to the end) of the one offsets partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets-reader", "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(OFFSETS, 0), timeout=10)
        consumer.assign([TopicPartition(OFFSETS, 0, low)])
        count, position = 0, low
        deadline = time.monotonic() + TIMEOUT_S
        while position < high and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                count += 1
                position = message.offset() + 1
        assert position >= high, "could not read the offsets topic to its end"
    finally:
        consumer.close()
    return low, count


def test_the_log_cleaner_compacts_the_offsets_topic(start_broker) -> None:
    broker = start_broker(
        offsets_topic_num_partitions=1, offsets_topic_segment_bytes=SEGMENT_BYTES, log_cleaner_backoff_ms=50
    )
    configs = describe_offsets_topic(broker.bootstrap)
    assert (configs["cleanup.policy"], configs["segment.bytes"]) == ("compact", str(SEGMENT_BYTES))
    commit_many(broker.bootstrap)
    deadline = time.monotonic() + TIMEOUT_S
    while (count := records_in_offsets_topic(broker.bootstrap)[1]) >= COMMITS // 3:
        assert time.monotonic() < deadline, f"the cleaner left {count} of {COMMITS} offset records"
        time.sleep(0.2)
    assert committed(broker.bootstrap) == COMMITS - 1
    broker.restart()
    assert committed(broker.bootstrap) == COMMITS - 1, "the compacted topic lost the latest commit"
    broker.stop()


@pytest.mark.parametrize("engine", ["kafka", "rocketmq"])
def test_without_a_cleaner_the_offset_store_compacts_the_topic_itself(start_broker, engine: str) -> None:
    overrides = {"offsets.topic.num.partitions": "1", "offsets.topic.segment.bytes": str(SEGMENT_BYTES)}
    if engine == "kafka":
        overrides["log.cleaner.enable"] = "false"
    broker = start_broker(overrides, engine=engine)
    assert describe_offsets_topic(broker.bootstrap)["cleanup.policy"] == "compact"
    commit_many(broker.bootstrap)
    log_start, count = records_in_offsets_topic(broker.bootstrap)
    assert log_start > 0 and count < COMMITS // 3, f"log start {log_start}, {count} records: not compacted"
    broker.restart()
    assert committed(broker.bootstrap) == COMMITS - 1, "compaction lost the latest commit"
    broker.stop()


def test_an_offsets_topic_made_with_the_delete_policy_becomes_compacted(start_broker) -> None:
    """A log dir whose __consumer_offsets an older tidelog created with cleanup.policy=delete (the default)."""

    def old_offsets_topic(log_dir: Path) -> None:
        engine = open_engine(EngineConfig.from_mapping({"log.dirs": str(log_dir)}))
        try:
            engine.create_topic(OFFSETS, 1, {"retention.ms": "-1"})
        finally:
            engine.close()

    broker = start_broker(offsets_topic_num_partitions=1, before_start=old_offsets_topic)
    configs = describe_offsets_topic(broker.bootstrap)
    assert (configs["cleanup.policy"], configs["retention.ms"]) == ("compact", "-1")
    commit_many(broker.bootstrap)
    assert committed(broker.bootstrap) == COMMITS - 1
    broker.stop()
