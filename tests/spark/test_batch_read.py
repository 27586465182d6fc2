"""Batch reads with `spark.read.format("tidelog")` from log directories: every Kafka-source option, pushdown,
minPartitions, Kafka-written (legacy) segments, a log written by a real Kafka client through the broker, and the
errors a user gets for a missing topic, a bad option value or a damaged file."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import TS0, fails_before_any_task, make_records

import tidelog
from tidelog.codec.record_batch import Record

pytestmark = pytest.mark.spark
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kafka-written"


def rows(df: Any) -> list[dict[str, Any]]:
    out = [r.asDict(recursive=True) for r in df.collect()]
    return sorted(out, key=lambda r: (r["topic"], r["partition"], r["offset"]))


def expected(topic: str, partition: int, offsets: range, headers: bool = False) -> list[dict[str, Any]]:
    result = []
    for i, record in zip(offsets, make_records(topic, partition, len(offsets), start=offsets.start), strict=True):
        row = {
            "key": record.key,
            "value": record.value,
            "topic": topic,
            "partition": partition,
            "offset": i,
            "timestamp": dt.datetime.fromtimestamp(record.timestamp_ms / 1000, dt.UTC).replace(tzinfo=None),
            "timestampType": 0,
        }
        if headers:
            row["headers"] = [{"key": k, "value": v} for k, v in record.headers]
        result.append(row)
    return result


def read(spark: Any, path: Path | str, **options: Any) -> Any:
    reader = spark.read.format("tidelog")
    for key, value in options.items():
        reader = reader.option(key, value if isinstance(value, str) else json.dumps(value))
    return reader.load(str(path))


def test_schema_matches_sparks_kafka_source(spark: Any, small_log: Path) -> None:
    df = read(spark, small_log, subscribe="visits")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,timestampType:int>"
    )
    with_headers = read(spark, small_log, subscribe="visits", includeHeaders="true")
    assert with_headers.schema.simpleString().endswith(",headers:array<struct<key:string,value:binary>>>")


def test_every_record_of_every_codec_comes_back(spark: Any, small_log: Path) -> None:
    got = rows(read(spark, small_log, subscribe="visits", includeHeaders="true"))
    want = [r for p in range(3) for r in expected("visits", p, range(300), headers=True)]
    assert got == want


def test_subscribe_pattern_and_assign(spark: Any, small_log: Path) -> None:
    both = read(spark, small_log, subscribe="visits,other")
    assert both.groupBy("topic").count().orderBy("topic").collect() == [("other", 80), ("visits", 900)]
    pattern = read(spark, small_log, subscribePattern="o.*")  # the whole name must match: not "visits"
    assert {r.topic for r in pattern.select("topic").distinct().collect()} == {"other"}
    assert read(spark, small_log, subscribePattern="vis").count() == 0  # `vis` does not match all of `visits`
    assigned = read(spark, small_log, assign={"visits": [2], "other": [0]})
    assert sorted(assigned.groupBy("topic", "partition").count().collect()) == [("other", 0, 40), ("visits", 2, 300)]
    assert read(spark, small_log, subscribe="empty").count() == 0


def test_starting_and_ending_offsets(spark: Any, small_log: Path) -> None:
    df = read(
        spark,
        small_log,
        subscribe="visits",
        startingOffsets={"visits": {"0": 10, "1": -2, "2": 295}},
        endingOffsets={"visits": {"0": 20, "1": 5, "2": -1}},
    )
    got = rows(df)
    assert got == expected("visits", 0, range(10, 20)) + expected("visits", 1, range(5)) + expected(
        "visits", 2, range(295, 300)
    )
    assert read(spark, small_log, subscribe="visits", startingOffsets="earliest", endingOffsets="latest").count() == 900


def test_timestamps_resolve_through_the_time_index(spark: Any, small_log: Path) -> None:
    # record i has timestamp TS0 + 10 * i: timestamp TS0 + 1005 -> first offset 101
    df = read(spark, small_log, subscribe="visits", startingTimestamp=str(TS0 + 1005))
    assert df.groupBy("partition").agg({"offset": "min"}).orderBy("partition").collect() == [
        (0, 101),
        (1, 101),
        (2, 101),
    ]
    by_partition = read(
        spark,
        small_log,
        subscribe="visits",
        startingOffsetsByTimestamp={"visits": {"0": TS0, "1": TS0 + 2000, "2": TS0 + 2990}},
        endingOffsetsByTimestamp={"visits": {"0": TS0 + 30, "1": TS0 + 2050, "2": TS0 + 10**9}},
    )
    got = rows(by_partition)
    assert [(r["partition"], r["offset"]) for r in got] == [(0, 0), (0, 1), (0, 2)] + [
        (1, o) for o in range(200, 205)
    ] + [(2, 299)]
    # no record at or after the timestamp: an error naming the option, or (strategy latest) nothing
    with pytest.raises(Exception, match="startingTimestamp"):
        read(spark, small_log, subscribe="visits", startingTimestamp=str(TS0 + 10**9)).count()
    late = read(
        spark,
        small_log,
        subscribe="visits",
        startingTimestamp=str(TS0 + 10**9),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert late.count() == 0
    assert read(spark, small_log, subscribe="visits", endingTimestamp=str(TS0 + 100)).count() == 30


def test_min_partitions_splits_a_partition_at_index_entries(
    spark: Any, small_log: Path, stats_dir: Callable[[], Any]
) -> None:
    stats = {"tidelog.statsDir": stats_dir.path}  # type: ignore[attr-defined]
    df = read(spark, small_log, assign={"visits": [0]}, minPartitions="4", **stats)
    assert df.rdd.getNumPartitions() == 4
    assert rows(df) == expected("visits", 0, range(300))
    tasks = sorted(stats_dir(), key=lambda s: s["start"])
    batch_starts = set(range(0, 300, 50))  # write_topic writes batches of 50 records
    assert len(tasks) == 4 and all(t["start"] in batch_starts for t in tasks), tasks
    assert tasks[0]["start"] == 0 and tasks[-1]["end"] == 300
    assert all(a["end"] == b["start"] for a, b in itertools.pairwise(tasks))
    # no batch is decoded by two tasks: every record decoded is a row returned
    assert sum(t["records_decoded"] for t in tasks) == sum(t["rows"] for t in tasks) == 300
    capped = read(spark, small_log, assign={"visits": [1]}, maxRecordsPerPartition="70")
    assert capped.rdd.getNumPartitions() == 5
    assert capped.count() == 300


def test_pushdown_narrows_what_is_decoded(spark: Any, small_log: Path, stats_dir: Callable[[], Any]) -> None:
    df = read(spark, small_log, subscribe="visits,other", **{"tidelog.statsDir": stats_dir.path})  # type: ignore[attr-defined]
    narrow = df.where("topic = 'visits' and partition in (0, 2) and offset >= 250 and offset < 260")
    got = rows(narrow)
    assert got == expected("visits", 0, range(250, 260)) + expected("visits", 2, range(250, 260))
    stats = stats_dir()
    assert {(s["topic"], s["partition"]) for s in stats} == {("visits", 0), ("visits", 2)}
    assert all(s["start"] == 250 and s["end"] == 260 for s in stats)
    # whole batches are decoded (50 records each), never the partition's 300 records
    assert sum(s["records_decoded"] for s in stats) <= 2 * 100
    assert sum(s["rows"] for s in stats) == 20


def test_timestamp_pushdown_uses_the_time_index(spark: Any, small_log: Path, stats_dir: Callable[[], Any]) -> None:
    df = read(spark, small_log, assign={"visits": [1]}, **{"tidelog.statsDir": stats_dir.path})  # type: ignore[attr-defined]
    since = dt.datetime.fromtimestamp((TS0 + 2805) / 1000, dt.UTC)
    got = df.where(df.timestamp >= since).select("offset").collect()
    assert [r.offset for r in got] == list(range(281, 300))
    (stats,) = stats_dir()
    assert stats["start"] >= 250  # the planner started near offset 281, not at 0
    assert stats["records_decoded"] <= 50


def test_a_filter_spark_must_apply_still_applies(spark: Any, small_log: Path) -> None:
    df = read(spark, small_log, subscribe="visits")
    got = df.where("(offset = 3 or key = X'6B30') and partition = 0").select("offset").collect()
    assert sorted(r.offset for r in got) == sorted({3} | {i for i in range(300) if i % 7 == 0 and i % 5 != 4})


def test_without_pushdown_option(spark: Any, small_log: Path) -> None:
    df = read(spark, small_log, subscribe="visits", pushFilters="false")
    assert df.where("partition = 1").count() == 300


def test_log_append_time_topic(spark: Any, tmp_path: Path) -> None:
    with tidelog.open(tmp_path / "lat", background=False) as log:
        log.create_topic("stamped", partitions=1, configs={"message.timestamp.type": "LogAppendTime"})
        log.produce("stamped", 0, [Record(value=b"a", timestamp_ms=5), Record(value=b"b", timestamp_ms=6)])
    got = rows(read(spark, tmp_path / "lat", subscribe="stamped"))
    assert [r["timestampType"] for r in got] == [1, 1]
    assert all(r["timestamp"].year >= 2024 for r in got)  # the append time, not the producer's 5 ms


def test_segments_written_by_kafka_including_legacy_formats(spark: Any, tmp_path: Path) -> None:
    name = "v1-v1c-v2-v2c-v2b-v2b-v2b-v2bc-v1b-v1bc.records"
    partition_dir = tmp_path / "kafka-logs" / "legacy-0"
    partition_dir.mkdir(parents=True)
    shutil.copy(FIXTURES / name, partition_dir / "00000000000000000000.log")
    want = json.loads((FIXTURES / "expected.json").read_text())[name]
    got = rows(read(spark, tmp_path / "kafka-logs", subscribe="legacy"))
    assert [(r["offset"], r["key"].decode(), r["value"].decode()) for r in got] == [
        (w["offset"], w["key"], w["value"]) for w in want
    ]
    assert [int(r["timestamp"].replace(tzinfo=dt.UTC).timestamp() * 1000) for r in got] == [
        w["timestamp_ms"] for w in want
    ]


def test_data_loss_follows_fail_on_data_loss(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "retained"
    with tidelog.open(root, config={"log.segment.bytes": 2048}, background=False) as log:
        log.create_topic("t", partitions=1)
        for i in range(0, 200, 10):
            log.produce("t", 0, make_records("t", 0, 10, start=i))
        log.delete_records("t", 0, 100)
        log_start = log.log_start_offset("t", 0)
    assert log_start >= 100
    with pytest.raises(Exception, match="failOnDataLoss"):
        read(spark, root, subscribe="t", startingOffsets={"t": {"0": 5}}).count()
    tolerant = read(spark, root, subscribe="t", startingOffsets={"t": {"0": 5}}, failOnDataLoss="false")
    assert min(r.offset for r in tolerant.select("offset").collect()) >= 100


# --- errors, raised when the query is planned (before any task) -------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "nope"}, "option 'subscribe': topic 'nope' does not exist"),
        ({"assign": {"visits": [7]}}, "option 'assign': partition visits-7 does not exist"),
        ({}, "'subscribe', 'subscribePattern' or 'assign'"),
        ({"subscribe": "visits", "assign": {"visits": [0]}}, "only one of"),
        ({"subscribe": "visits", "startingOffsets": "latest"}, "startingOffsets"),
        ({"subscribe": "visits", "startingOffsets": "{bad json"}, "option 'startingOffsets' is not valid JSON"),
        ({"subscribe": "visits", "startingOffsets": {"visits": {"0": 1}}}, "missing visits-1, visits-2"),
        ({"subscribe": "visits", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"subscribe": "visits", "minPartitions": "0"}, "option 'minPartitions' must be at least 1"),
        ({"subscribe": "visits", "failOnDataLoss": "maybe"}, "option 'failOnDataLoss' must be true or false"),
        ({"subscribe": "visits", "startingoffset": "earliest"}, "did you mean 'startingOffsets'"),
        ({"subscribe": "visits", "kafka.group.id": "g"}, "'path' reads the log files directly"),
        ({"subscribePattern": "("}, "option 'subscribePattern' is not a valid regular expression"),
    ],
)
def test_bad_options_name_the_option(spark: Any, small_log: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace("'", ".")):
        read(spark, small_log, **options).count()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"endingOffsets": {"visits": {"0": 1000, "1": -1, "2": -1}}},
            "option 'endingOffsets': visits-0 at 1000 (the log ends at 300): past the end",
        ),
        (
            {"endingOffsets": {"visits": {"0": 1000, "1": -1, "2": -1}}, "failOnDataLoss": "false"},
            "option 'endingOffsets': visits-0 at 1000",
        ),
        (
            {"startingOffsets": {"visits": {"0": 10, "1": 301, "2": -2}}},
            "option 'startingOffsets': visits-1 at 301 (the log ends at 300): past the end",
        ),
        (
            {
                "startingOffsets": {"visits": {"0": 20, "1": -2, "2": -2}},
                "endingOffsets": {"visits": {"0": 10, "1": -1, "2": -1}},
            },
            "visits-0: the ending offset 10 (endingOffsets) is before the starting offset 20 (startingOffsets)",
        ),
    ],
)
def test_offsets_past_the_log_end_fail_at_planning(
    spark: Any, small_log: Path, options: dict[str, Any], message: str
) -> None:
    df = read(spark, small_log, subscribe="visits", **options)
    fails_before_any_task(spark, df.count, re.escape(message))


def test_missing_path_and_both_locations(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="is not a directory"):
        read(spark, tmp_path / "missing", subscribe="t").count()
    with pytest.raises(Exception, match="not both"):
        spark.read.format("tidelog").option("subscribe", "t").option("kafka.bootstrap.servers", "x:1").load(
            str(tmp_path)
        ).count()
    with pytest.raises(Exception, match="needs 'path'"):
        spark.read.format("tidelog").option("subscribe", "t").load().count()


def test_a_damaged_segment_names_the_file(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "damaged"
    with tidelog.open(root, background=False) as log:
        log.create_topic("t", partitions=1)
        log.produce("t", 0, make_records("t", 0, 20))
    segment = root / "t-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[100] ^= 0xFF  # inside the first batch's records: the CRC no longer matches
    segment.write_bytes(bytes(data))
    with pytest.raises(Exception, match=r"00000000000000000000\.log: batch at file byte 0 fails its CRC check"):
        read(spark, root, subscribe="t").count()


@pytest.mark.parametrize("which", ["first", "last"])
def test_an_unreadable_segment_names_the_file(spark: Any, tmp_path: Path, which: str) -> None:
    """A directory where a segment file should be cannot be read, whoever runs the test (root included). The last
    segment is read when the query is planned; an earlier one only by the task that reads its offsets."""
    root = tmp_path / "unreadable"
    with tidelog.open(root, config={"log.segment.bytes": 2048}, background=False) as log:
        log.create_topic("t", partitions=1)
        for i in range(0, 100, 10):
            log.produce("t", 0, make_records("t", 0, 10, start=i))
    segments = sorted((root / "t-0").glob("*.log"))
    assert len(segments) >= 2
    segment = segments[0] if which == "first" else segments[-1]
    segment.unlink()
    segment.mkdir()
    with pytest.raises(Exception, match=re.escape(f"{segment}: not a regular file")):
        read(spark, root, subscribe="t").count()
