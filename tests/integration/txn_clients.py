"""What the transaction suites of tests/integration share: a topic, everything a fresh consumer reads with an isolation
level, and the log end offsets, each through confluent-kafka against one broker."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker_process import BrokerProcess

TIMEOUT_S = 15


def create_topic(broker: BrokerProcess, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT_S)


def read_all(broker: BrokerProcess, topic: str, isolation: str, partitions: int = 1) -> list[bytes]:
    """Every value a fresh consumer gets from the start up to the end it may read (EOF on every partition)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    at_eof: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(at_eof) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(message.partition())
                    continue
                raise KafkaException(message.error())
            values.append(message.value())
    finally:
        consumer.close()
    assert len(at_eof) == partitions, "the consumer never reached the end"
    return values


def end_offsets(broker: BrokerProcess, topic: str, partitions: int = 1) -> list[int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), TIMEOUT_S)[1] for p in range(partitions)]
    finally:
        consumer.close()
