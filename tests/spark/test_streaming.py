"""Structured Streaming reads: checkpointed offsets and restart (no gaps, no duplicates), new partitions,
maxOffsetsPerTrigger / minOffsetsPerTrigger, a timestamp start, failOnDataLoss, and the same through a broker.

Queries use a foreachBatch sink (it runs in this process and, unlike the memory sink, restarts from a checkpoint)
and `trigger(availableNow=True)` so each run is deterministic and ends by itself."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from spark_helpers import TS0, make_records

import tidelog
from tidelog.spark.local_broker import LocalBroker

pytestmark = pytest.mark.spark


class Collector:
    """A foreachBatch sink remembering every (topic, partition, offset) and the size of each micro-batch."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int]] = []
        self.batches: list[int] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [(r.topic, r.partition, r.offset) for r in df.select("topic", "partition", "offset").collect()]
        self.batches.append(len(rows))
        self.rows += rows


def run_available_now(spark: Any, source: dict[str, str], checkpoint: Path, sink: Collector, path: str = "") -> None:
    reader = spark.readStream.format("tidelog")
    for key, value in source.items():
        reader = reader.option(key, value)
    df = reader.load(path) if path else reader.load()
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    started = query.trigger(availableNow=True).start()
    assert started.awaitTermination(120), "the availableNow query did not finish"
    if started.exception() is not None:
        raise started.exception()


def last_checkpointed_offsets(checkpoint: Path) -> dict[str, Any]:
    files = sorted((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return json.loads(files[-1].read_text().splitlines()[-1])


def test_restart_resumes_exactly_and_picks_up_new_partitions(spark: Any, tmp_path: Path, stream_cleanup: None) -> None:
    root = tmp_path / "log"
    with tidelog.open(root, background=False) as log:
        log.create_topic("s", partitions=2)
        for p in range(2):
            log.produce("s", p, make_records("s", p, 100))
    sink = Collector()
    source = {"subscribe": "s", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "60"}
    run_available_now(spark, source, tmp_path / "ck", sink, str(root))
    assert sink.batches == [60, 60, 60, 20]  # prorated over both partitions, 30 each
    assert last_checkpointed_offsets(tmp_path / "ck") == {"s": {"0": 100, "1": 100}}

    with tidelog.open(root, background=False) as log:  # more data, and a partition added while the query is down
        for p in range(2):
            log.produce("s", p, make_records("s", p, 25, start=100))
        log.create_partitions("s", 3)
        log.produce("s", 2, make_records("s", 2, 10))
    sink.batches.clear()
    run_available_now(spark, source, tmp_path / "ck", sink, str(root))
    assert sink.batches == [60]
    assert len(sink.rows) == len(set(sink.rows)) == 260  # no duplicates across the restart
    assert sorted(sink.rows) == sorted(
        [("s", p, o) for p in range(2) for o in range(125)] + [("s", 2, o) for o in range(10)]
    )
    assert last_checkpointed_offsets(tmp_path / "ck") == {"s": {"0": 125, "1": 125, "2": 10}}


def test_starting_latest_and_timestamp(spark: Any, tmp_path: Path, stream_cleanup: None) -> None:
    root = tmp_path / "log"
    with tidelog.open(root, background=False) as log:
        log.create_topic("ts", partitions=1)
        log.produce("ts", 0, make_records("ts", 0, 50))  # record i at TS0 + 10 i
    latest = Collector()
    run_available_now(spark, {"subscribe": "ts"}, tmp_path / "ck1", latest, str(root))  # default: latest
    assert latest.rows == []
    since = Collector()
    run_available_now(
        spark, {"subscribe": "ts", "startingTimestamp": str(TS0 + 305)}, tmp_path / "ck2", since, str(root)
    )
    assert sorted(o for _, _, o in since.rows) == list(range(31, 50))
    with tidelog.open(root, background=False) as log:
        log.produce("ts", 0, make_records("ts", 0, 5, start=50))
    run_available_now(spark, {"subscribe": "ts"}, tmp_path / "ck1", latest, str(root))  # from where it stood
    assert sorted(o for _, _, o in latest.rows) == list(range(50, 55))


def test_min_offsets_per_trigger_waits_for_enough_data(spark: Any, tmp_path: Path, stream_cleanup: None) -> None:
    root = tmp_path / "log"
    with tidelog.open(root, background=False) as log:
        log.create_topic("m", partitions=1)
        log.produce("m", 0, make_records("m", 0, 20))
    sink = Collector()
    query = (
        spark.readStream.format("tidelog")
        .option("subscribe", "m")
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "30")
        .option("maxTriggerDelay", "1h")
        .load(str(root))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        time.sleep(3)
        assert sink.rows == []  # 20 < 30: no batch yet
        with tidelog.open(root, background=False) as log:
            log.produce("m", 0, make_records("m", 0, 15, start=20))
        deadline = time.monotonic() + 60
        while len(sink.rows) < 35 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(o for _, _, o in sink.rows) == list(range(35))
    finally:
        query.stop()


def test_data_removed_by_retention_follows_fail_on_data_loss(spark: Any, tmp_path: Path, stream_cleanup: None) -> None:
    root = tmp_path / "log"
    with tidelog.open(root, config={"log.segment.bytes": 2048}, background=False) as log:
        log.create_topic("r", partitions=1)
        log.produce("r", 0, make_records("r", 0, 10))
    first = Collector()
    source = {"subscribe": "r", "startingOffsets": "earliest"}
    run_available_now(spark, source, tmp_path / "ck", first, str(root))
    assert len(first.rows) == 10
    with tidelog.open(root, config={"log.segment.bytes": 2048}, background=False) as log:
        for i in range(10, 200, 10):
            log.produce("r", 0, make_records("r", 0, 10, start=i))
        log.delete_records("r", 0, 150)  # offsets 10..149 are gone before the query saw them
    with pytest.raises(Exception, match="failOnDataLoss"):
        run_available_now(spark, source, tmp_path / "ck", Collector(), str(root))
    tolerant = Collector()
    run_available_now(spark, {**source, "failOnDataLoss": "false"}, tmp_path / "ck", tolerant, str(root))
    offsets = sorted(o for _, _, o in tolerant.rows)
    assert offsets and offsets[0] >= 150 and offsets[-1] == 199


def test_streaming_through_the_broker(spark: Any, broker: LocalBroker, tmp_path: Path, stream_cleanup: None) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2})
    for i in range(90):
        producer.produce("bstream", value=b"v%d" % i, key=b"k%d" % (i % 5))
    assert producer.flush(30) == 0  # auto-created with the broker's num.partitions=3
    source = {
        "kafka.bootstrap.servers": broker.bootstrap,
        "subscribe": "bstream",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "40",
    }
    sink = Collector()
    run_available_now(spark, source, tmp_path / "ck", sink)
    assert len(sink.rows) == 90 and max(sink.batches) <= 42
    for i in range(90, 120):
        producer.produce("bstream", value=b"v%d" % i, key=b"k%d" % (i % 5))
    assert producer.flush(30) == 0
    run_available_now(spark, source, tmp_path / "ck", sink)
    assert len(sink.rows) == len(set(sink.rows)) == 120
