"""Data written by a real Kafka client (confluent-kafka / librdkafka) into a running `tidelog serve`, read by Spark
from the broker's segment files while the broker keeps running (no lock taken, nothing disturbed), and through
the Kafka protocol with `kafka.bootstrap.servers`. Both paths must return exactly what the producer sent."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from spark_helpers import fails_before_any_task

from tidelog.partitioner import partition_for_key
from tidelog.spark.local_broker import LocalBroker
from tidelog.spark.logfiles import LogFiles

pytestmark = pytest.mark.spark
TS0 = 1_700_000_000_000


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        future.result(timeout=30)


def produce(bootstrap: str, topic: str, n: int, *, codec: str = "none", start: int = 0) -> list[dict[str, Any]]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 5,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
        }
    )
    sent = []
    for i in range(start, start + n):
        key = f"user-{i % 17}".encode()
        value = f"{topic}|{i}|{'x' * (i % 40)}".encode()
        headers = [("seq", str(i).encode())] if i % 2 else []
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=TS0 + i)
        sent.append({"key": key, "value": value, "timestamp_ms": TS0 + i, "headers": headers})
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return sent


def by_partition(rows: list[Any]) -> dict[int, list[Any]]:
    result: dict[int, list[Any]] = {}
    for row in sorted(rows, key=lambda r: (r.partition, r.offset)):
        result.setdefault(row.partition, []).append(row)
    return result


def check_rows(rows: list[Any], sent: list[dict[str, Any]], partitions: int) -> None:
    grouped = by_partition(rows)
    expected: dict[int, list[dict[str, Any]]] = {}
    for record in sent:
        expected.setdefault(partition_for_key(record["key"], partitions), []).append(record)
    assert sorted(grouped) == sorted(expected)
    for partition, got in grouped.items():
        want = expected[partition]
        assert [r.offset for r in got] == list(range(len(want)))  # dense offsets from 0, in production order
        assert [(r.key, r.value) for r in got] == [(w["key"], w["value"]) for w in want]
        assert [r.timestamp.replace(tzinfo=dt.UTC).timestamp() * 1000 for r in got] == [w["timestamp_ms"] for w in want]
        assert [[(h.key, h.value) for h in r.headers] for r in got] == [w["headers"] for w in want]


@pytest.fixture(scope="module")
def written(broker: LocalBroker) -> list[dict[str, Any]]:
    create_topic(broker.bootstrap, "clicks", 3)
    sent = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        sent += produce(broker.bootstrap, "clicks", 400, codec=codec, start=len(sent))
    return sent


def test_files_of_a_running_broker(spark: Any, broker: LocalBroker, written: list[dict[str, Any]]) -> None:
    df = spark.read.format("tidelog").option("subscribe", "clicks").option("includeHeaders", "true")
    check_rows(df.load(str(broker.log_dir)).collect(), written, 3)


def test_through_the_kafka_protocol(spark: Any, broker: LocalBroker, written: list[dict[str, Any]]) -> None:
    df = (
        spark.read.format("tidelog")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", "clicks")
        .option("includeHeaders", "true")
        .load()
    )
    check_rows(df.collect(), written, 3)


def test_kafka_protocol_offsets_timestamps_and_pushdown(spark: Any, broker: LocalBroker, written: Any) -> None:
    def reader() -> Any:
        return spark.read.format("tidelog").option("kafka.bootstrap.servers", broker.bootstrap)

    df = reader().option("assign", '{"clicks": [1]}').option("startingTimestamp", str(TS0 + 1000)).load()
    timestamps = [r.timestamp for r in df.select("timestamp").collect()]
    assert timestamps and min(timestamps) >= dt.datetime(2023, 11, 14, 22, 13, 21)
    narrowed = reader().option("subscribe", "clicks").load().where("partition = 2 and offset between 5 and 9")
    assert sorted(r.offset for r in narrowed.select("offset").collect()) == [5, 6, 7, 8, 9]
    with pytest.raises(Exception, match="option 'subscribe': topic 'missing' does not exist"):
        reader().option("subscribe", "missing").load().count()


ACCESS_PATHS = ["files", "broker"]


def reader(spark: Any, broker: LocalBroker, access: str, **options: str) -> Any:
    """A batch read of the broker's data, from its log files or through the Kafka protocol."""
    df = spark.read.format("tidelog")
    if access == "broker":
        df = df.option("kafka.bootstrap.servers", broker.bootstrap)
    for key, value in options.items():
        df = df.option(key, value)
    return df.load(str(broker.log_dir)) if access == "files" else df.load()


@pytest.mark.parametrize("access", ACCESS_PATHS)
def test_pattern_and_ending_offsets(spark: Any, broker: LocalBroker, written: Any, access: str) -> None:
    create_topic(broker.bootstrap, f"clicks-{access}-later", 1)  # matched by the pattern's start, not the whole
    check_rows(reader(spark, broker, access, subscribePattern="cl.*s", includeHeaders="true").collect(), written, 3)
    ending = '{"clicks": {"0": 50, "1": -1, "2": 7}}'
    got = by_partition(reader(spark, broker, access, subscribe="clicks", endingOffsets=ending).collect())
    everything = by_partition(reader(spark, broker, access, subscribe="clicks").collect())
    assert [r.offset for r in got[0]] == list(range(50)) and [r.offset for r in got[2]] == list(range(7))
    for partition, rows in got.items():
        assert [(r.key, r.value) for r in rows] == [(r.key, r.value) for r in everything[partition][: len(rows)]]
    assert len(got[1]) == len(everything[1]) > 0


@pytest.mark.parametrize("access", ACCESS_PATHS)
def test_min_partitions(
    spark: Any, broker: LocalBroker, written: Any, access: str, stats_dir: Callable[[], Any]
) -> None:
    stats = {"tidelog.statsDir": stats_dir.path}  # type: ignore[attr-defined]
    df = reader(spark, broker, access, subscribe="clicks", minPartitions="9", includeHeaders="true", **stats)
    check_rows(df.collect(), written, 3)
    tasks = stats_dir()
    if access == "broker":  # a broker does not tell where batches start: each partition is split evenly
        assert len(tasks) >= 9
        for partition in range(3):
            sizes = [t["end"] - t["start"] for t in tasks if t["partition"] == partition]
            assert max(sizes) - min(sizes) <= 1
        return
    # librdkafka's batches vary in size: boundaries at index entries still mean no batch is decoded twice
    assert len(tasks) > 3
    assert sum(t["records_decoded"] for t in tasks) == sum(t["rows"] for t in tasks) == len(written)


@pytest.mark.parametrize("access", ACCESS_PATHS)
def test_fail_on_data_loss_after_delete_records(spark: Any, broker: LocalBroker, access: str) -> None:
    topic = f"trimmed-{access}"
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, 100)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        assert future.result(timeout=30).low_watermark == 40
    # the path reader takes the log start from the broker's log-start-offset checkpoint (written every 200 ms here)
    deadline = time.monotonic() + 10
    while LogFiles([str(broker.log_dir)]).partition(topic, 0).log_start_offset() < 40:
        assert time.monotonic() < deadline, "the broker did not checkpoint its log start offset"
        time.sleep(0.1)
    start = json.dumps({topic: {"0": 10}})
    df = reader(spark, broker, access, subscribe=topic, startingOffsets=start)
    fails_before_any_task(spark, df.count, "the starting offset 10 is below the log start offset 40")
    tolerant = reader(spark, broker, access, subscribe=topic, startingOffsets=start, failOnDataLoss="false")
    assert [r.offset for r in tolerant.select("offset").orderBy("offset").collect()] == list(range(40, 100))
    assert reader(spark, broker, access, subscribe=topic).count() == 60  # earliest is the new log start


@pytest.mark.parametrize("access", ACCESS_PATHS)
def test_offsets_past_the_end_fail_at_planning(spark: Any, broker: LocalBroker, written: Any, access: str) -> None:
    """Not a task waiting kafkaConsumer.pollTimeoutMs (2 minutes) for records that will never come."""
    started = time.monotonic()
    ending = reader(
        spark, broker, access, subscribe="clicks", endingOffsets='{"clicks": {"0": 100000, "1": -1, "2": -1}}'
    )
    fails_before_any_task(spark, ending.count, r"option 'endingOffsets': clicks-0 at 100000 \(the log ends at \d+\)")
    starting = reader(
        spark, broker, access, subscribe="clicks", startingOffsets='{"clicks": {"0": -2, "1": 99999, "2": -2}}'
    )
    fails_before_any_task(spark, starting.count, "option 'startingOffsets': clicks-1 at 99999")
    assert time.monotonic() - started < 30


def test_reading_files_while_the_broker_appends(spark: Any, broker: LocalBroker) -> None:
    """Segment files are read while a producer keeps appending: each query sees a consistent prefix."""
    create_topic(broker.bootstrap, "busy", 2)
    stop = threading.Event()
    counts = []

    def keep_producing() -> None:
        i = 0
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
        while not stop.is_set():
            producer.produce("busy", value=f"v{i}".encode(), key=f"k{i % 11}".encode())
            i += 1
            if i % 100 == 0:
                producer.poll(0)
                time.sleep(0.01)
        producer.flush(30)

    thread = threading.Thread(target=keep_producing)
    thread.start()
    try:
        time.sleep(1.0)
        for _ in range(3):
            rows = spark.read.format("tidelog").option("subscribe", "busy").load(str(broker.log_dir)).collect()
            grouped = by_partition(rows)
            for got in grouped.values():  # a dense prefix of each partition, no torn or half-written batch
                assert [r.offset for r in got] == list(range(len(got)))
            counts.append(len(rows))
            time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
    assert counts == sorted(counts) and counts[-1] > 0


# --- the same through a broker on the RocketMQ engine ---------------------------------------------------------


@pytest.fixture(scope="module")
def rocketmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log_dir = tmp_path_factory.mktemp("rocketmq-broker") / "store"
    overrides = {
        "num.partitions": "3",
        "tidelog.storage.engine": "rocketmq",
        "tidelog.rocketmq.mapedFileSizeCommitLog": str(16 << 20),
    }
    with LocalBroker(log_dir, overrides) as running:
        yield running


def test_through_the_kafka_protocol_on_the_rocketmq_engine(spark: Any, rocketmq_broker: LocalBroker) -> None:
    create_topic(rocketmq_broker.bootstrap, "clicks", 3)
    sent = []
    for codec in ("none", "zstd"):
        sent += produce(rocketmq_broker.bootstrap, "clicks", 300, codec=codec, start=len(sent))
    df = (
        spark.read.format("tidelog")
        .option("kafka.bootstrap.servers", rocketmq_broker.bootstrap)
        .option("subscribe", "clicks")
        .option("includeHeaders", "true")
        .load()
    )
    check_rows(df.collect(), sent, 3)


def test_the_path_reader_names_the_rocketmq_engine(spark: Any, rocketmq_broker: LocalBroker) -> None:
    create_topic(rocketmq_broker.bootstrap, "by-path", 1)
    produce(rocketmq_broker.bootstrap, "by-path", 5)
    with pytest.raises(Exception, match="store of the RocketMQ engine"):
        spark.read.format("tidelog").option("subscribe", "by-path").load(str(rocketmq_broker.log_dir)).count()
