"""A compacted topic through a real `tidelog serve` and confluent-kafka (librdkafka): CreateTopics and DescribeConfigs
with the cleaner's keys, keyless produce refused, and the background cleaner leaving the latest value per key."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

TOPIC = "compacted"
KEYS = 5
ROUNDS = 120
DEADLINE_S = 60.0


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    return {(t, int(p)): int(o) for t, p, o in (line.split() for line in lines[2:])}


def consume_all(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-check", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        records: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and (not records or records[-1][0] < end - 1):
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.offset(), message.key(), message.value()))
        return records
    finally:
        consumer.close()


def test_compacted_topic_keeps_the_latest_value_per_key(start_broker) -> None:
    broker = start_broker({"log.cleaner.backoff.ms": 200})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"}
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)], request_timeout=15)[TOPIC].result(timeout=30)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, TOPIC)])
    entries = next(iter(described.values())).result(timeout=30)
    assert entries["cleanup.policy"].value == "compact"
    assert entries["min.cleanable.dirty.ratio"].value == "0.01"
    assert entries["delete.retention.ms"].value == "86400000"
    assert entries["max.compaction.lag.ms"].value == str((1 << 63) - 1)

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    errors: list[KafkaError] = []

    def report(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            errors.append(error)

    for r in range(ROUNDS):
        for k in range(KEYS):
            producer.produce(TOPIC, key=f"key-{k}".encode(), value=f"round-{r}-key-{k}".encode(), on_delivery=report)
        producer.flush(30)  # one batch per round: many small batches over many segments
    assert errors == []

    keyless = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, "retries": 0})
    keyless.produce(TOPIC, value=b"no key", on_delivery=report)
    keyless.flush(30)
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]
    errors.clear()

    checkpoint = broker.log_dir / "cleaner-offset-checkpoint"
    deadline = time.monotonic() + DEADLINE_S
    while read_checkpoint(checkpoint).get((TOPIC, 0), 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    first_dirty = read_checkpoint(checkpoint).get((TOPIC, 0), 0)
    assert first_dirty > 0, broker.stderr_tail()

    produced = ROUNDS * KEYS
    records = consume_all(broker.bootstrap, produced)
    offsets = [offset for offset, _k, _v in records]
    assert offsets == sorted(set(offsets)) and offsets[-1] == produced - 1
    assert len(records) < produced
    cleaned_keys = [key for offset, key, _v in records if offset < first_dirty]
    assert len(cleaned_keys) == len(set(cleaned_keys))  # below the first dirty offset: one record per key at most
    latest = {key: value for _o, key, value in records}
    assert latest == {f"key-{k}".encode(): f"round-{ROUNDS - 1}-key-{k}".encode() for k in range(KEYS)}
    by_offset = {offset: (key, value) for offset, key, value in records}
    for offset, (key, value) in by_offset.items():  # every record kept is the one that was produced there
        r, k = divmod(offset, KEYS)
        assert (key, value) == (f"key-{k}".encode(), f"round-{r}-key-{k}".encode())

    # the idempotent producer carries on after its batches were cleaned away (no OUT_OF_ORDER_SEQUENCE)
    producer.produce(TOPIC, key=b"key-0", value=b"after cleaning", on_delivery=report)
    producer.flush(30)
    assert errors == []
