"""Fetch v13-v17 and ListOffsets v9 against one broker, spoken by hand (kio's schemas, tests/kafka_wire.py).

Fetch v13+ names topics by topic id (KIP-516): the batches a producer wrote come back under the id Metadata gives;
an id that names no topic is answered UNKNOWN_TOPIC_ID beside the others and is not waited on. v15 carries the
replica id inside `replica_state` (a single broker has no followers: it reads as a consumer), v17 a directory id
that is ignored. ListOffsets v9's LATEST_TIERED_TIMESTAMP (-5) answers -1s: no tiered storage. librdkafka then
negotiates the highest Fetch both know (v16 for librdkafka 2.16): a confluent-kafka consumer reads through it.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import kafka_wire
from broker_process import BrokerProcess
from tidelog.codec.record_set import iter_records
from tidelog.protocol.messages import ApiKey

UNKNOWN_TOPIC_OR_PARTITION = 3
UNKNOWN_TOPIC_ID = 100
COUNT = 20


def fetch_body(
    version: int, topics: list[tuple[uuid.UUID, list[tuple[int, int]]]], *, replica_id: int = -1, max_wait: int = 0
) -> dict[str, Any]:
    """A Fetch v13+ of (topic id, [(partition, fetch offset)]) from a consumer (or `replica_id`)."""
    partition_extra = {"replica_directory_id": uuid.uuid4()} if version >= 17 else {}
    body: dict[str, Any] = {
        "max_wait": max_wait,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                        **partition_extra,
                    }
                    for partition, offset in partitions
                ],
            }
            for topic_id, partitions in topics
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    if version >= 15:
        body["replica_state"] = {"replica_id": replica_id, "replica_epoch": -1}
    else:
        body["replica_id"] = replica_id
    return body


def values(records: bytes | None) -> list[bytes | None]:
    return [record.value for record in iter_records(records or b"")]


@pytest.fixture(scope="module")
def written(broker: BrokerProcess) -> tuple[str, uuid.UUID]:
    """A topic (auto-created: one partition) with COUNT records, one per batch; (name, topic id)."""
    topic = "fetch-by-id"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(COUNT):
        producer.produce(topic, f"value-{i}".encode(), partition=0)
        producer.flush(10)
    assert producer.flush(10) == 0
    [answer] = kafka_wire.metadata(broker.bootstrap, [topic]).topics
    assert answer.error_code == 0 and len(answer.partitions) >= 1
    return topic, answer.topic_id


@pytest.mark.parametrize("version", range(13, 18))
def test_fetch_by_topic_id_returns_the_batches(
    broker: BrokerProcess, written: tuple[str, uuid.UUID], version: int
) -> None:
    _topic, topic_id = written
    response = kafka_wire.request(broker.bootstrap, ApiKey.FETCH, version, fetch_body(version, [(topic_id, [(0, 5)])]))
    assert (response.error_code, response.session_id) == (0, 0)
    [answer] = response.responses
    assert answer.topic_id == topic_id
    [partition] = answer.partitions
    assert (partition.partition_index, partition.error_code) == (0, 0)
    assert (partition.high_watermark, partition.last_stable_offset, partition.log_start_offset) == (COUNT, COUNT, 0)
    assert values(partition.records) == [f"value-{i}".encode() for i in range(5, COUNT)]
    if version >= 16:  # no leader to point at: every partition was served
        assert response.node_endpoints == ()


def test_an_unknown_topic_id_is_answered_beside_the_known_one_at_once(
    broker: BrokerProcess, written: tuple[str, uuid.UUID]
) -> None:
    _topic, topic_id = written
    unknown = uuid.uuid4()
    body = fetch_body(13, [(unknown, [(0, 0), (3, 0)]), (topic_id, [(0, COUNT - 1)])])
    response = kafka_wire.request(broker.bootstrap, ApiKey.FETCH, 13, body)
    assert [(t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions]) for t in response.responses] == [
        (unknown, [(0, UNKNOWN_TOPIC_ID), (3, UNKNOWN_TOPIC_ID)]),
        (topic_id, [(0, 0)]),
    ]
    assert values(response.responses[0].partitions[0].records) == []
    assert response.responses[0].partitions[0].high_watermark == -1
    assert values(response.responses[1].partitions[0].records) == [f"value-{COUNT - 1}".encode()]
    # only unknown ids: nothing to wait for, answered at once though the client would wait 5 s
    started = time.monotonic()
    alone = kafka_wire.request(broker.bootstrap, ApiKey.FETCH, 17, fetch_body(17, [(unknown, [(0, 0)])], max_wait=5000))
    assert time.monotonic() - started < 3
    assert alone.responses[0].partitions[0].error_code == UNKNOWN_TOPIC_ID


def test_a_v15_fetch_with_a_replica_id_reads_as_a_consumer_on_a_single_broker(
    broker: BrokerProcess, written: tuple[str, uuid.UUID]
) -> None:
    _topic, topic_id = written
    body = fetch_body(15, [(topic_id, [(0, 0), (1, 0)])], replica_id=7)
    [answer] = kafka_wire.request(broker.bootstrap, ApiKey.FETCH, 15, body).responses
    got = [(p.partition_index, p.error_code, p.high_watermark) for p in answer.partitions]
    assert got == [(0, 0, COUNT), (1, UNKNOWN_TOPIC_OR_PARTITION, -1)]
    assert len(values(answer.partitions[0].records)) == COUNT


class RequestLog(logging.Handler):
    """librdkafka's protocol debug lines, through the Python logger confluent-kafka hands them to."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"librdkafka-{id(self)}")
        self.logger.addHandler(self)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def list_offsets(
    broker: BrokerProcess, topic: str, version: int, targets: list[int]
) -> list[tuple[int, int, int, int]]:
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {
                "name": topic,
                "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": t} for t in targets],
            }
        ],
    }
    [answer] = kafka_wire.request(broker.bootstrap, ApiKey.LIST_OFFSETS, version, body).topics
    return [(p.error_code, p.timestamp, p.offset, p.leader_epoch) for p in answer.partitions]


def test_list_offsets_v9_latest_tiered_is_nothing_without_tiered_storage(
    broker: BrokerProcess, written: tuple[str, uuid.UUID]
) -> None:
    topic, _topic_id = written
    earliest, latest, tiered = list_offsets(broker, topic, 9, [-2, -1, -5])
    assert earliest[:3] == (0, -1, 0)
    assert latest[:3] == (0, -1, COUNT)
    assert tiered == (0, -1, -1, -1)
    assert list_offsets(broker, "no-such-topic-v9", 9, [-5]) == [(UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1)]


def test_a_confluent_consumer_reads_through_the_newest_fetch(
    broker: BrokerProcess, written: tuple[str, uuid.UUID]
) -> None:
    topic, _topic_id = written
    sent = RequestLog()
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "fetch-newest",
            "enable.auto.commit": False,
            "debug": "protocol",
            "logger": sent.logger,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < COUNT and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        assert got == [f"value-{i}".encode() for i in range(COUNT)]
        versions = {int(v) for line in sent.lines for v in re.findall(r"Sent FetchRequest \(v(\d+)", line)}
        assert versions and min(versions) >= 13, versions  # librdkafka 2.16 knows up to v16: by topic id
    finally:
        consumer.close()
