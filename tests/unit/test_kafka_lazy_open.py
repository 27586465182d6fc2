"""The Kafka engine after a clean shutdown: partitions open on first use or on the opener thread (engine.py).

Whatever has not opened yet must behave as if it had: served on first use, its checkpointed offsets kept by every
checkpoint written meanwhile (a log start moved by DeleteRecords must not move back), deleted with its topic.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.errors import OffsetOutOfRangeError
from tidelog.storage.kafka.engine import KafkaEngine

TOPICS = [f"lazy-{n}" for n in range(6)]
PARTITIONS = 50  # 300 partitions: the opener is still busy when the test closes the engine right after opening it
RECORDS = 10
DELETED_BELOW = 4


def open_engine(path: Path, *, background: bool) -> KafkaEngine:
    engine = tidelog.open(path, background=background)
    assert isinstance(engine, KafkaEngine)
    return engine


def value(topic: str, partition: int, offset: int) -> bytes:
    return f"{topic}/{partition}/{offset}".encode()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """300 partitions of 10 records each, the first DELETED_BELOW deleted, closed cleanly."""
    path = tmp_path / "store"
    with open_engine(path, background=False) as engine:
        for topic in TOPICS:
            engine.create_topic(topic, PARTITIONS)
            for partition in range(PARTITIONS):
                engine.produce(topic, partition, [Record(value(topic, partition, n)) for n in range(RECORDS)])
                engine.partition(topic, partition).delete_records(DELETED_BELOW)
    return path


def check_partition(engine: KafkaEngine, topic: str, partition: int) -> None:
    assert engine.log_start_offset(topic, partition) == DELETED_BELOW
    assert engine.log_end_offset(topic, partition) == RECORDS
    assert [r.value for r in engine.consume(topic, partition)] == [
        value(topic, partition, n) for n in range(DELETED_BELOW, RECORDS)
    ]
    with pytest.raises(OffsetOutOfRangeError):
        engine.read(topic, partition, DELETED_BELOW - 1, 1 << 20)


def test_every_partition_is_served_while_the_opener_is_still_at_work(store: Path) -> None:
    with open_engine(store, background=True) as engine:
        for topic in reversed(TOPICS):  # the opener goes in name order: these open on first use
            for partition in reversed(range(PARTITIONS)):
                check_partition(engine, topic, partition)
        engine.produce(TOPICS[0], 0, [Record(b"after")])
    with open_engine(store, background=False) as engine:
        assert engine.log_end_offset(TOPICS[0], 0) == RECORDS + 1


def test_a_close_before_the_opener_is_done_keeps_the_checkpointed_offsets(store: Path) -> None:
    engine = open_engine(store, background=True)
    unopened_at_close = len(engine.topics()) * PARTITIONS - len(engine.logs)
    engine.close()
    assert unopened_at_close > 0, "every partition opened before the close: the test proves nothing"
    with open_engine(store, background=False) as engine:  # every partition opened and checked at once
        for topic in TOPICS:
            for partition in range(PARTITIONS):
                check_partition(engine, topic, partition)


def test_a_topic_whose_partitions_have_not_opened_is_deleted_whole(store: Path) -> None:
    with open_engine(store, background=True) as engine:
        engine.delete_topic(TOPICS[-1])
        assert TOPICS[-1] not in engine.topics()
    with open_engine(store, background=False) as engine:
        assert TOPICS[-1] not in engine.topics()
        assert not list(store.glob(f"{TOPICS[-1]}-*"))
        check_partition(engine, TOPICS[0], PARTITIONS - 1)
