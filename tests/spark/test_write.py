"""Batch and streaming writes with `df.write.format("tidelog")` / `writeStream.format("tidelog")`, to a log
directory and through a broker, read back by confluent-kafka (a log directory written by Spark is then served
by `tidelog serve`, so a real Kafka client checks that the files are what Kafka would have written)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from spark_helpers import fails_before_any_task, make_records

import tidelog
from tidelog.partitioner import partition_for_key
from tidelog.spark.local_broker import LocalBroker

pytestmark = pytest.mark.spark


def consume_all(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30) -> list[dict[str, Any]]:
    """Every record of `topic`, read with confluent-kafka from offset 0 of each partition to its end."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False, "enable.partition.eof": True}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    done: set[int] = set()
    out = []
    try:
        while len(done) < partitions:
            message = consumer.poll(timeout_s)
            assert message is not None, f"no record or end of partition within {timeout_s} s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                done.add(message.partition())
                continue
            out.append(
                {
                    "partition": message.partition(),
                    "offset": message.offset(),
                    "key": message.key(),
                    "value": message.value(),
                    "headers": message.headers() or [],
                }
            )
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r["partition"], r["offset"]))


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        future.result(timeout=30)


def frame(spark: Any, n: int, *, with_partition: bool = False) -> Any:
    rows = [
        (
            f"user-{i % 13}",
            f"event {i}".encode(),
            [("i", str(i).encode())] if i % 2 else [],
            (i % 2) if with_partition else None,
        )
        for i in range(n)
    ]
    schema = "key string, value binary, headers array<struct<key: string, value: binary>>, partition int"
    df = spark.createDataFrame(rows, schema)
    return df if with_partition else df.drop("partition")


def check_keyed(records: list[dict[str, Any]], n: int, partitions: int) -> None:
    assert len(records) == n
    for record in records:
        assert record["partition"] == partition_for_key(record["key"], partitions)  # Kafka's murmur2
    assert sorted(int(r["value"].split()[1]) for r in records) == list(range(n))
    with_headers = [r for r in records if r["headers"]]
    assert len(with_headers) == n // 2
    assert all(r["headers"] == [("i", r["value"].split()[1])] for r in with_headers)


def test_batch_write_to_a_log_directory_then_served(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "out"
    with tidelog.open(root, background=False) as log:
        log.create_topic("written", partitions=3)
    frame(spark, 500).repartition(3).write.format("tidelog").option("topic", "written").mode("append").save(str(root))
    with LocalBroker(root) as broker:  # the directory Spark wrote, served to a real client
        check_keyed(consume_all(broker.bootstrap, "written", 3), 500, 3)
    again = spark.read.format("tidelog").option("subscribe", "written").load(str(root))
    assert again.count() == 500


def test_batch_write_through_the_broker_with_topic_and_partition_columns(spark: Any, broker: LocalBroker) -> None:
    create_topic(broker.bootstrap, "routed", 2)
    create_topic(broker.bootstrap, "keyed", 4)
    routed = frame(spark, 100, with_partition=True).selectExpr("'routed' as topic", "*")
    routed.write.format("tidelog").mode("append").option("kafka.bootstrap.servers", broker.bootstrap).save()
    records = consume_all(broker.bootstrap, "routed", 2)
    assert all(r["partition"] == int(r["value"].split()[1]) % 2 for r in records) and len(records) == 100
    frame(spark, 300).write.format("tidelog").mode("append").option("kafka.bootstrap.servers", broker.bootstrap).option(
        "topic", "keyed"
    ).save()
    check_keyed(consume_all(broker.bootstrap, "keyed", 4), 300, 4)


def test_a_missing_topic_on_the_broker_fails_before_any_task(spark: Any, broker: LocalBroker, tmp_path: Path) -> None:
    df = spark.createDataFrame([("k", b"v")], "key string, value binary")
    # auto-creation on (the shared broker): the driver's lookup creates the topic, the write goes through
    df.write.format("tidelog").mode("append").option("kafka.bootstrap.servers", broker.bootstrap).option(
        "topic", "created-on-write"
    ).save()
    assert [r["value"] for r in consume_all(broker.bootstrap, "created-on-write", 3)] == [b"v"]
    with LocalBroker(tmp_path / "strict", {"auto.create.topics.enable": "false"}) as strict:
        writer = df.write.format("tidelog").mode("append").option("kafka.bootstrap.servers", strict.bootstrap)
        started = time.monotonic()
        fails_before_any_task(
            spark,
            writer.option("topic", "nowhere").save,
            "option 'topic': topic 'nowhere' does not exist on kafka.bootstrap.servers=127.0.0.1:",
        )
        assert time.monotonic() - started < 20  # not after librdkafka's metadata timeout in every task


def test_streaming_write_from_files_to_the_broker(spark: Any, broker: LocalBroker, tmp_path: Path) -> None:
    source = tmp_path / "source"
    with tidelog.open(source, background=False) as log:
        log.create_topic("in", partitions=2)
        for p in range(2):
            log.produce("in", p, make_records("in", p, 60, headers=False))
    create_topic(broker.bootstrap, "copied", 3)

    def run() -> None:
        query = (
            spark.readStream.format("tidelog")
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "50")
            .load(str(source))
            .select("key", "value")
            .writeStream.format("tidelog")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("topic", "copied")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None

    run()
    assert len(consume_all(broker.bootstrap, "copied", 3)) == 120
    with tidelog.open(source, background=False) as log:
        log.produce("in", 0, make_records("in", 0, 7, start=60, headers=False))
    run()  # the restarted query copies only the 7 new records
    copied = consume_all(broker.bootstrap, "copied", 3)
    values = sorted(r["value"] for r in copied)
    assert len(values) == len(set(values)) == 127


def test_exactly_once_streaming_write_replayed(spark: Any, broker: LocalBroker, tmp_path: Path) -> None:
    """writeStream with tidelog.sink.exactlyOnce: every micro-batch in transactions the driver commits; the last
    batch replayed as after a crash between the sink's commit and Spark's commit log is not written again."""
    source = tmp_path / "source"
    with tidelog.open(source, background=False) as log:
        log.create_topic("in", partitions=2)
        for p in range(2):
            log.produce("in", p, make_records("in", p, 60, headers=False))
    create_topic(broker.bootstrap, "copied-once", 2)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        query = (
            spark.readStream.format("tidelog")
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "50")
            .load(str(source))
            .select("key", "value")
            .writeStream.format("tidelog")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("topic", "copied-once")
            .option("tidelog.sink.exactlyOnce", "true")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None

    run()
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):  # the batch is replayed at the restart
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    run()
    assert (checkpoint / "commits" / str(last)).exists()
    consumer_config = {"bootstrap.servers": broker.bootstrap, "group.id": "check", "isolation.level": "read_committed"}
    consumer = Consumer(consumer_config)
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition("copied-once", p), cached=False)[1] for p in (0, 1)]
    finally:
        consumer.close()
    values = sorted(r["value"] for r in consume_all(broker.bootstrap, "copied-once", 2))
    assert len(values) == len(set(values)) == 120
    assert sum(ends) > 120  # the last stable offsets are the log ends, markers included: nothing left open


def test_streaming_write_to_a_log_directory(spark: Any, tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    with tidelog.open(source, background=False) as log:
        log.create_topic("in", partitions=2)
        for p in range(2):
            log.produce("in", p, make_records("in", p, 40))
    with tidelog.open(target, background=False) as log:
        log.create_topic("out", partitions=2)
    query = (
        spark.readStream.format("tidelog")
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .load(str(source))
        .selectExpr("key", "value", "partition")
        .writeStream.format("tidelog")
        .option("topic", "out")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(str(target))
    )
    assert query.awaitTermination(120) and query.exception() is None
    with LocalBroker(target) as served:  # the directory the stream wrote, read by a real Kafka client
        records = consume_all(served.bootstrap, "out", 2)
    for p in range(2):  # partition column kept: same partition, same order, dense offsets from 0
        written = [r for r in records if r["partition"] == p]
        assert [r["offset"] for r in written] == list(range(40))
        assert [(r["key"], r["value"]) for r in written] == [(w.key, w.value) for w in make_records("in", p, 40)]


@pytest.mark.parametrize(
    ("select", "options", "message"),
    [
        ("key", {"topic": "t"}, "needs a 'value' column"),
        ("value", {}, "set the option 'topic' or give the DataFrame a 'topic' column"),
        ("value, 1 as partition", {"topic": "t"}, "column 'partition' must be an int"),
        ("value", {"topic": "missing"}, "topic 'missing' does not exist"),
        ("value", {"topic": "t", "kafka.acks": "1"}, "'path' writes the log files directly"),
    ],
)
def test_write_errors(spark: Any, tmp_path: Path, select: str, options: dict[str, str], message: str) -> None:
    root = tmp_path / "log"
    with tidelog.open(root, background=False) as log:
        log.create_topic("t", partitions=1)
    df = spark.createDataFrame([("k", b"v")], "key string, value binary").selectExpr(
        *(c.strip() for c in select.split(","))
    )
    if "partition" in select:
        df = df.selectExpr("value", "cast(partition as long) as partition")
    writer = df.write.format("tidelog").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception, match=message):
        writer.save(str(root))


def test_save_modes(spark: Any, tmp_path: Path) -> None:
    """Python data sources take Append and Overwrite only (Spark's rule); overwriting a log is refused."""
    root = tmp_path / "log"
    with tidelog.open(root, background=False) as log:
        log.create_topic("t", partitions=1)
    df = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="cannot overwrite"):
        df.write.format("tidelog").option("topic", "t").mode("overwrite").save(str(root))
    with pytest.raises(Exception, match="ErrorIfExists"):  # Spark's default mode: users write .mode("append")
        df.write.format("tidelog").option("topic", "t").save(str(root))
