"""The exactly-once sink's transactions against a real `tidelog serve`, task and driver halves driven directly
(no Spark): a task's transaction stays open until the driver commits it, a replayed batch whose transaction was
committed writes nothing, a newer attempt of a task fences the older one (whose commit is then refused), and an
aborted batch leaves nothing for read_committed readers. The options that cannot work are refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.codec.record_batch import Record
from tidelog.errors import KafkaClientError, OptionError
from tidelog.spark.local_broker import LocalBroker
from tidelog.spark.options import parse_write_options
from tidelog.spark.writer import SinkSpec, WriteSummary, _TransactionalWriter, end_transactions

TOPIC = "eos-out"


@pytest.fixture(scope="module")
def bootstrap(broker: LocalBroker) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, num_partitions=2, replication_factor=1)]).values():
        future.result(timeout=30)
    yield broker.bootstrap


def spec_for(bootstrap: str) -> SinkSpec:
    options = parse_write_options(
        {"kafka.bootstrap.servers": bootstrap, "topic": TOPIC, "tidelog.sink.exactlyOnce": "true"}
    )
    return SinkSpec(options, has_key=False, has_topic=False, has_partition=False, has_headers=False)


def write(bootstrap: str, name: str, batch_id: int | None, values: list[str]) -> WriteSummary:
    """A task's half: its rows written in a transaction left open."""
    writer = _TransactionalWriter(spec_for(bootstrap).options, name, batch_id)
    for i, value in enumerate(values):
        writer.add(TOPIC, i % 2, Record(value.encode()))
    writer.flush()
    return writer.summary


def read(bootstrap: str, isolation: str = "read_committed") -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "eos-check",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in (0, 1)])
    found, ended = [], set()
    try:
        while len(ended) < 2:
            message = consumer.poll(10)
            assert message is not None, "no end of partition within 10 s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                ended.add(message.partition())
            else:
                found.append(message.value())
    finally:
        consumer.close()
    return sorted(found)


def test_the_driver_commits_what_the_tasks_wrote_and_a_replay_writes_nothing(bootstrap: str) -> None:
    before = read(bootstrap)
    first = write(bootstrap, "query-a-0", 0, ["a0", "a1", "a2"])
    second = write(bootstrap, "query-a-1", 0, ["b0"])
    assert first.transaction is not None and first.records == 3
    assert read(bootstrap) == before  # open: read_committed readers wait
    end_transactions(spec_for(bootstrap), [first, second, None], commit=True)
    assert read(bootstrap) == sorted([*before, b"a0", b"a1", b"a2", b"b0"])

    replayed = write(bootstrap, "query-a-0", 0, ["a0", "a1", "a2"])  # batch 0 again, after a driver crash
    assert replayed.transaction is None and replayed.skipped == 3 and replayed.records == 0
    following = write(bootstrap, "query-a-0", 1, ["c0"])
    end_transactions(spec_for(bootstrap), [replayed, following], commit=True)
    assert read(bootstrap) == sorted([*before, b"a0", b"a1", b"a2", b"b0", b"c0"])


def test_a_newer_attempt_fences_the_older_one(bootstrap: str) -> None:
    before = read(bootstrap)
    everything_before = read(bootstrap, "read_uncommitted")
    zombie = write(bootstrap, "query-b-0", 0, ["z0", "z1"])
    retry = write(bootstrap, "query-b-0", 0, ["r0", "r1"])  # its init_transactions aborted the zombie's
    with pytest.raises(KafkaClientError, match="fenced"):
        end_transactions(spec_for(bootstrap), [zombie], commit=True)
    end_transactions(spec_for(bootstrap), [retry], commit=True)
    assert read(bootstrap) == sorted([*before, b"r0", b"r1"])
    assert read(bootstrap, "read_uncommitted") == sorted([*everything_before, b"z0", b"z1", b"r0", b"r1"])


def test_an_aborted_batch_leaves_nothing(bootstrap: str) -> None:
    before = read(bootstrap)
    summary = write(bootstrap, "query-c-0", 0, ["x0"])
    end_transactions(spec_for(bootstrap), [summary], commit=False)
    assert read(bootstrap) == before
    again = write(bootstrap, "query-c-0", 0, ["x0"])  # the replay of an aborted batch writes it
    assert again.transaction is not None and again.skipped == 0
    end_transactions(spec_for(bootstrap), [again], commit=True)
    assert read(bootstrap) == sorted([*before, b"x0"])


def test_options_that_cannot_work_are_refused() -> None:
    with pytest.raises(OptionError, match=r"needs kafka\.bootstrap\.servers"):
        parse_write_options({"path": "/x", "topic": "t", "tidelog.sink.exactlyOnce": "true"})
    with pytest.raises(OptionError, match=r"tidelog\.sink\.exactlyOnce"):
        parse_write_options({"kafka.bootstrap.servers": "h:1", "kafka.transactional.id": "mine"})
    with pytest.raises(OptionError, match="PLAINTEXT"):
        parse_write_options(
            {"kafka.bootstrap.servers": "h:1", "tidelog.sink.exactlyOnce": "true", "kafka.security.protocol": "SSL"}
        )
    with pytest.raises(OptionError, match="true or false"):
        parse_write_options({"kafka.bootstrap.servers": "h:1", "tidelog.sink.exactlyOnce": "yes"})
