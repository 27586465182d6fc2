"""The demo's pipeline (examples/page_visits_pipeline.py: visits per page per 10-second window, written to
`page_visits_per_window`) with the exactly-once sink, crashed and restarted from its checkpoint: a read_committed
read of `page_visits_per_window` has every window exactly once, with the counts of the events produced.

The query stopped mid-stream, a driver process killed with SIGKILL mid-stream (wherever it was; marked slow: it
starts a second JVM), and the one crash that makes Spark replay a micro-batch whose output was already committed:
after the sink's commit, before Spark logged the batch as done. That one is made exactly, by taking the batch's
entries off the checkpoint's logs as such a crash leaves them; the at-least-once sink writes that batch's windows
twice, the exactly-once sink once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tidelog.spark import demo
from tidelog.spark.local_broker import LocalBroker

pytestmark = pytest.mark.spark
T0 = 1_700_000_000_000  # a multiple of the 10 s window
EVENTS = 1200
STEP_MS = 50  # 60 s of event time: 6 windows
WAIT_S = 120.0


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker per test: the pipeline's topic names are fixed."""
    with LocalBroker(tmp_path / "logs", {"num.partitions": str(demo.EVENTS_PARTITIONS)}) as running:
        demo.create_topics(running.bootstrap)
        yield running


def produce_events(bootstrap: str) -> Counter[tuple[str, str]]:
    """The events (and the heartbeat that closes the last window); the count per (window start, page)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    expected: Counter[tuple[str, str]] = Counter()
    for i in range(EVENTS):
        ts = T0 + i * STEP_MS
        user = f"user-{(i * 7919) % 301}"
        page = demo.PAGES[(i * 31) % len(demo.PAGES)]
        producer.produce(
            "page_visits", key=user.encode(), value=json.dumps({"user": user, "page": page, "ts": ts}), timestamp=ts
        )
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((ts - ts % 10_000) / 1000))
        expected[(start, page)] += 1
    heartbeat = T0 + EVENTS * STEP_MS + demo.HEARTBEAT_AHEAD_MS
    producer.produce("page_visits", key=b"heartbeat", value=b'{"ts": %d}' % heartbeat, timestamp=heartbeat)
    assert producer.flush(30) == 0
    return expected


def windows(bootstrap: str, isolation: str = "read_committed") -> list[tuple[str, str, int]]:
    """Every (window start, page, count) record of page_visits_per_window."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "check",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("page_visits_per_window", 0, 0)])
    found = []
    try:
        while True:
            message = consumer.poll(10)
            assert message is not None, "no end of partition within 10 s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return found
            value = json.loads(message.value())
            found.append((value["window_start"], value["page"], value["count"]))
    finally:
        consumer.close()


def start(
    spark: Any, bootstrap: str, checkpoint: Path, exactly_once: bool, written: Path, per_batch: int | None = None
) -> Any:
    """The demo's query (`per_batch`: maxOffsetsPerTrigger); a file in `written` names each micro-batch that wrote
    windows (foreachBatch may run in a process of its own)."""
    written.mkdir(exist_ok=True)
    pipeline = demo.load_pipeline()
    sink = {"kafka.bootstrap.servers": bootstrap}
    if exactly_once:
        sink["tidelog.sink.exactlyOnce"] = "true"

    def on_batch(batch: Any, batch_id: int) -> None:
        if batch.count():
            (written / str(batch_id)).touch()

    source = {"kafka.bootstrap.servers": bootstrap}
    if per_batch is not None:
        source["maxOffsetsPerTrigger"] = str(per_batch)
    return pipeline.start_pipeline(
        spark,
        source,
        sink,
        str(checkpoint.parent / "windows.parquet"),
        str(checkpoint),
        trigger={"processingTime": "500 milliseconds"},
        on_batch=on_batch,
    )


def wait_for(query: Any, done: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{what} within {WAIT_S:.0f} s"
        time.sleep(0.5)


def last_written(written: Path, checkpoint: Path) -> int | None:
    """The last micro-batch that wrote windows, once Spark has logged it as done."""
    batches = [int(p.name) for p in written.iterdir()]
    if not batches or not (checkpoint / "commits" / str(max(batches))).exists():
        return None
    return max(batches)


def replay_from(checkpoint: Path, batch_id: int) -> None:
    """The checkpoint as a crash after the sink committed `batch_id` and before Spark logged it leaves it: the
    batch's offsets are logged, its commit not, and nothing after it."""
    for log in ("offsets", "commits"):
        for entry in (checkpoint / log).iterdir():
            number = entry.name.removeprefix(".").removesuffix(".crc")  # N and Hadoop's checksum .N.crc
            if number.isdigit() and int(number) >= batch_id + (log == "offsets"):
                entry.unlink()


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_batch_replayed_after_its_commit(
    spark: Any, fresh_broker: LocalBroker, tmp_path: Path, stream_cleanup: None, exactly_once: bool
) -> None:
    bootstrap = fresh_broker.bootstrap
    expected = produce_events(bootstrap)
    checkpoint = tmp_path / "checkpoint"
    query = start(spark, bootstrap, checkpoint, exactly_once, tmp_path / "first")
    wait_for(query, lambda: len(windows(bootstrap)) >= len(expected), "every window written")
    wait_for(query, lambda: last_written(tmp_path / "first", checkpoint) is not None, "the batch logged as done")
    query.stop()
    last = last_written(tmp_path / "first", checkpoint)
    assert last is not None
    replay_from(checkpoint, last)
    query = start(spark, bootstrap, checkpoint, exactly_once, tmp_path / "again")
    wait_for(query, lambda: (checkpoint / "commits" / str(last)).exists(), f"batch {last} replayed")
    query.stop()
    assert (tmp_path / "again" / str(last)).exists()  # Spark did run the batch again, with its windows
    found = windows(bootstrap)
    counted = Counter((start, page) for start, page, _ in found)
    if exactly_once:
        assert {(s, p): c for s, p, c in found} == dict(expected)
        assert set(counted.values()) == {1}  # every window exactly once
    else:
        assert max(counted.values()) == 2  # the replayed batch's windows are there twice
        assert {(s, p) for s, p, _ in found} == set(expected)


def test_a_query_stopped_mid_stream(
    spark: Any, fresh_broker: LocalBroker, tmp_path: Path, stream_cleanup: None
) -> None:
    """Small micro-batches, the query stopped as soon as windows are in the log (its running batch interrupted),
    restarted from its checkpoint: every window once."""
    bootstrap = fresh_broker.bootstrap
    expected = produce_events(bootstrap)
    checkpoint = tmp_path / "checkpoint"
    query = start(spark, bootstrap, checkpoint, True, tmp_path / "first", per_batch=250)
    wait_for(query, lambda: windows(bootstrap, "read_uncommitted"), "a window written")
    query.stop()
    assert len(windows(bootstrap)) < len(expected)  # stopped mid-stream
    query = start(spark, bootstrap, checkpoint, True, tmp_path / "again")
    wait_for(query, lambda: len(windows(bootstrap)) >= len(expected), "every window written after the restart")
    query.stop()
    found = windows(bootstrap)
    assert {(s, p): c for s, p, c in found} == dict(expected)
    assert len(found) == len(expected)  # every window exactly once


KILLED_DRIVER = """
import sys
from pathlib import Path

import tidelog.spark
from tidelog.spark import demo

bootstrap, checkpoint = sys.argv[1], Path(sys.argv[2])
spark = tidelog.spark.local_session("killed-driver", fast_start=True)
query = demo.load_pipeline().start_pipeline(
    spark,
    {"kafka.bootstrap.servers": bootstrap, "maxOffsetsPerTrigger": "100"},  # many small micro-batches
    {"kafka.bootstrap.servers": bootstrap, "tidelog.sink.exactlyOnce": "true"},
    str(checkpoint.parent / "windows.parquet"),
    str(checkpoint),
    trigger={"processingTime": "0 seconds"},
)
query.awaitTermination()
"""


@pytest.mark.slow  # a second Spark driver (its own JVM): about a minute on 2 cores
def test_a_driver_killed_mid_stream(
    spark: Any, fresh_broker: LocalBroker, tmp_path: Path, stream_cleanup: None
) -> None:
    """The pipeline runs in a process of its own (its JVM a child of it), killed with SIGKILL once windows are in
    the log; the query restarted here from its checkpoint ends with every window once."""
    bootstrap = fresh_broker.bootstrap
    expected = produce_events(bootstrap)
    checkpoint = tmp_path / "checkpoint"
    driver = subprocess.Popen(
        [sys.executable, "-c", KILLED_DRIVER, bootstrap, str(checkpoint)],
        start_new_session=True,  # its own process group: the JVM goes with it
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "driver.log").open("w"),
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not windows(bootstrap, "read_uncommitted"):
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no window written by the first driver"
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert len(windows(bootstrap)) < len(expected)  # killed mid-stream
    query = start(spark, bootstrap, checkpoint, True, tmp_path / "restarted")
    wait_for(query, lambda: len(windows(bootstrap)) >= len(expected), "every window written after the restart")
    query.stop()
    found = windows(bootstrap)
    assert {(s, p): c for s, p, c in found} == dict(expected)
    assert len(found) == len(expected)  # every window exactly once
