"""Data builders and checks shared by the Spark tests (imported by module name: pytest puts this directory on
sys.path)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

import tidelog
from tidelog.codec.record_batch import Record

TS0 = 1_700_000_000_000


def make_records(
    topic: str, partition: int, n: int, *, start: int = 0, ts0: int = TS0, step_ms: int = 10, headers: bool = True
) -> list[Record]:
    """Records whose content names their position: value `topic/partition/i`, key `k<i % 7>` (or None every 5th)."""
    return [
        Record(
            value=f"{topic}/{partition}/{i}".encode(),
            key=None if i % 5 == 4 else f"k{i % 7}".encode(),
            timestamp_ms=ts0 + i * step_ms,
            headers=[("i", str(i).encode()), ("none", None)] if headers and i % 3 == 0 else [],
        )
        for i in range(start, start + n)
    ]


def write_topic(
    log: tidelog.StorageEngine,
    topic: str,
    partitions: int,
    per_partition: int,
    *,
    batch: int = 50,
    compression_cycle: tuple[str, ...] = ("none", "lz4", "gzip", "snappy", "zstd"),
    **record_args: Any,
) -> None:
    if topic not in log.topics():
        log.create_topic(topic, partitions=partitions)
    for p in range(partitions):
        records = make_records(topic, p, per_partition, **record_args)
        for i in range(0, len(records), batch):
            codec = compression_cycle[(i // batch) % len(compression_cycle)]
            log.produce(topic, p, records[i : i + batch], compression=codec)


def fails_before_any_task(spark: Any, action: Callable[[], Any], message: str) -> str:
    """Runs `action` (a Spark action) and checks it fails with an error matching `message` while the query is
    planned: no Spark job was started. Returns the error text."""
    context = spark.sparkContext
    group = f"planning-{uuid.uuid4().hex}"
    context.setJobGroup(group, "expected to fail at planning")
    try:
        with pytest.raises(Exception, match=message) as caught:
            action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert context.statusTracker().getJobIdsForGroup(group) == [], "a Spark job (tasks) ran before the error"
    return str(caught.value)
