"""read_committed against a real broker, on a log built with the engine's transactional calls (storage/api.py):
producer 1000's transaction committed, producer 2000's aborted, producer 3000's still open, plain records between.
confluent-kafka (librdkafka) and kafka-python consumers in read_committed see only the committed and plain records
and stop at the last stable offset; in read_uncommitted they see every data record. ListOffsets answers the last
stable offset for read_committed, and a raw Fetch v12 shows the last stable offset and the aborted list (null for
read_uncommitted).

    offset  0-1 P1000 txn   2-3 P2000 txn   4 plain   5 COMMIT P1000   6 ABORT P2000   7 plain
            8-9 P3000 txn (open)   10 plain                  last stable offset 8, high watermark 11
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

import kafka_wire
from broker_process import BrokerProcess, StartBroker
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.codec.record_set import iter_records
from tidelog.config import EngineConfig
from tidelog.protocol.messages import ApiKey
from tidelog.storage import open_engine

TOPIC = "txn-log"
TS = 1_700_000_000_000
COMMITTED = [b"c0", b"c1", b"plain0", b"plain1"]
EVERYTHING = [b"c0", b"c1", b"a0", b"a1", b"plain0", b"plain1", b"o0", b"o1", b"plain2"]
LAST_STABLE = 8
HIGH_WATERMARK = 11


def txn_batch(producer_id: int, *values: bytes) -> bytes:
    records = [Record(value, timestamp_ms=TS) for value in values]
    return build_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=0, is_transactional=True)


def plain(value: bytes) -> bytes:
    return build_batch([Record(value, timestamp_ms=TS)])


def write_transactions(log_dir: Path) -> None:
    engine = open_engine(EngineConfig.from_mapping({"log.dirs": str(log_dir)}))
    try:
        engine.create_topic(TOPIC, 1)
        partition = engine.partition(TOPIC, 0)
        partition.append(txn_batch(1000, b"c0", b"c1"))
        partition.append(txn_batch(2000, b"a0", b"a1"))
        partition.append(plain(b"plain0"))
        partition.append_marker(1000, 0, coordinator_epoch=0, commit=True)
        partition.append_marker(2000, 0, coordinator_epoch=0, commit=False)
        partition.append(plain(b"plain1"))
        partition.append(txn_batch(3000, b"o0", b"o1"))
        partition.append(plain(b"plain2"))
        assert (partition.last_stable_offset, partition.high_watermark) == (LAST_STABLE, HIGH_WATERMARK)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def txn_broker(start_module_broker: StartBroker) -> BrokerProcess:
    return start_module_broker(before_start=write_transactions)


def confluent_values(bootstrap: str, isolation: str) -> tuple[list[bytes], int]:
    """Every value a confluent consumer in `isolation` reads from offset 0 until it stops, and its position."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"rc-{isolation}", "isolation.level": isolation,
         "enable.auto.commit": False, "fetch.wait.max.ms": 50}
    )  # fmt: skip
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        found: list[bytes] = []
        quiet_until = time.monotonic() + 3
        while time.monotonic() < quiet_until:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            found.append(message.value())
            quiet_until = time.monotonic() + 1.5
        [position] = consumer.position([TopicPartition(TOPIC, 0)])
        return found, position.offset
    finally:
        consumer.close()


@pytest.mark.parametrize(("isolation", "expected"), [("read_committed", COMMITTED), ("read_uncommitted", EVERYTHING)])
def test_a_confluent_consumer_sees_only_committed_records_in_read_committed(
    txn_broker: BrokerProcess, isolation: str, expected: list[bytes]
) -> None:
    values, position = confluent_values(txn_broker.bootstrap, isolation)
    assert values == expected
    if isolation == "read_committed":  # the aborted records and the markers are skipped, up to the LSO
        assert position == LAST_STABLE


@pytest.mark.parametrize(
    ("isolation", "expected", "end"),
    [("read_committed", COMMITTED, LAST_STABLE), ("read_uncommitted", EVERYTHING, HIGH_WATERMARK)],
)
def test_kafka_python_reads_and_lists_offsets_by_isolation_level(
    txn_broker: BrokerProcess, isolation: str, expected: list[bytes], end: int
) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=txn_broker.bootstrap, isolation_level=isolation, enable_auto_commit=False,
        consumer_timeout_ms=2000, fetch_max_wait_ms=50,
    )  # fmt: skip
    try:
        partition = KafkaTopicPartition(TOPIC, 0)
        assert consumer.end_offsets([partition]) == {partition: end}  # ListOffsets with the isolation level
        consumer.assign([partition])
        consumer.seek(partition, 0)
        assert [message.value for message in consumer] == expected
    finally:
        consumer.close()


def raw_fetch(bootstrap: str, isolation_level: int) -> Any:
    [topic] = kafka_wire.metadata(bootstrap, [TOPIC]).topics
    body = {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": isolation_level,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": topic.name, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
    }  # fmt: skip
    [answer] = kafka_wire.request(bootstrap, ApiKey.FETCH, kafka_wire.FETCH_VERSION, body).responses
    return answer.partitions[0]


def test_a_fetch_carries_the_last_stable_offset_and_the_aborted_transactions(txn_broker: BrokerProcess) -> None:
    committed = raw_fetch(txn_broker.bootstrap, 1)
    assert (committed.high_watermark, committed.last_stable_offset) == (HIGH_WATERMARK, LAST_STABLE)
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(2000, 2)]
    offsets = [record.offset for record in iter_records(committed.records or b"", include_control=True)]
    assert max(offsets) < LAST_STABLE
    uncommitted = raw_fetch(txn_broker.bootstrap, 0)
    assert uncommitted.last_stable_offset == LAST_STABLE and uncommitted.aborted_transactions is None
    assert max(record.offset for record in iter_records(uncommitted.records or b"")) == HIGH_WATERMARK - 1
