"""Pure parts of the source, no JVM: option parsing, offset arithmetic as Spark's Kafka source does it, pushed
filters, and the lock-free log-file reader against the storage engine's own answers."""

from __future__ import annotations

import datetime as dt
import itertools
import os
from pathlib import Path

import pytest
from spark_helpers import TS0, make_records

import tidelog
from tidelog.codec.record_batch import build_batch
from tidelog.errors import DataLossError, OptionError
from tidelog.spark.logfiles import LogFiles
from tidelog.spark.offsets import (
    Bound,
    OffsetRange,
    PushedFilters,
    offsets_to_json,
    push_filter,
    rate_limit,
    split_ranges,
)
from tidelog.spark.options import Subscription, parse_read_options, parse_write_options

# --- options ----------------------------------------------------------------------------------------------


def test_options_arrive_lower_cased_and_are_still_found() -> None:
    datasource = pytest.importorskip("pyspark.sql.datasource")
    CaseInsensitiveDict = datasource.CaseInsensitiveDict

    options = CaseInsensitiveDict(
        {"path": "/d", "subscribe": "a, b", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "10"}
    )
    assert "startingoffsets" in dict(options)  # the trap: a plain dict has lower-cased keys
    parsed = parse_read_options(options, streaming=True)
    assert parsed.topics == ("a", "b") and parsed.starting.kind == "earliest"
    assert parsed.max_offsets_per_trigger == 10 and parsed.paths == ("/d",)


def test_defaults_differ_for_batch_and_stream() -> None:
    base = {"path": "/d", "subscribe": "t"}
    assert parse_read_options(base, streaming=False).starting.kind == "earliest"
    assert parse_read_options(base, streaming=True).starting.kind == "latest"
    assert parse_read_options(base, streaming=True).ending.kind == "latest"


def test_timestamp_options_take_precedence_as_in_spark() -> None:
    opts = parse_read_options(
        {
            "path": "/d",
            "subscribe": "t",
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"t": {"0": 5}}',
            "startingTimestamp": "7",
        },
        streaming=False,
    )
    assert opts.starting.kind == "timestamp" and opts.starting.timestamp == 7


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t", "assign": '{"t": [0]}'}, "only one of"),
        ({"assign": '{"t": "0"}'}, "option 'assign'"),
        ({"subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, "use -2 earliest, -1 latest"),
        ({"subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "-2 \\(earliest\\) is not allowed"),
        ({"subscribe": "t", "maxTriggerDelay": "soon"}, "option 'maxTriggerDelay'"),
        ({"subscribe": "t", "startingTimestamp": "yesterday"}, "option 'startingTimestamp'"),
        ({"subscribe": "t", "startingOffsetsByTimestampStrategy": "skip"}, "'error' or 'latest'"),
        ({"assign": '{"t": [0, 1]}', "startingOffsets": '{"t": {"0": 1}}'}, "missing t-1"),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "-1"}, "option 'maxOffsetsPerTrigger' must be at least 1"),
    ],
)
def test_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_read_options({"path": "/d", **options}, streaming=False)


def test_broker_options_and_rejected_consumer_settings() -> None:
    opts = parse_read_options(
        {"kafka.bootstrap.servers": "h:1", "subscribePattern": "t.*", "kafka.security.protocol": "PLAINTEXT"},
        streaming=True,
    )
    assert opts.subscription is Subscription.PATTERN and opts.kafka_params == {"security.protocol": "PLAINTEXT"}
    assert opts.topic_matches("t1") and not opts.topic_matches("xt1")
    with pytest.raises(OptionError, match=r"kafka\.auto\.offset\.reset"):
        parse_read_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.auto.offset.reset": "x"}, streaming=True
        )


def test_write_options() -> None:
    opts = parse_write_options({"path": "/d", "topic": "out", "checkpointLocation": "/c"})
    assert opts.topic == "out" and opts.paths == ("/d",)
    with pytest.raises(OptionError, match=r"kafka\.value\.serializer"):
        parse_write_options({"kafka.bootstrap.servers": "h:1", "kafka.value.serializer": "x"})
    with pytest.raises(OptionError, match=r"tidelog\.compression"):
        parse_write_options({"path": "/d", "tidelog.compression": "brotli"})


# --- offsets ----------------------------------------------------------------------------------------------


def test_offset_json_is_kafkas_with_numeric_partition_order() -> None:
    assert list(offsets_to_json({("t", 10): 1, ("t", 2): 5, ("a", 0): 0})) == ["a", "t"]
    assert list(offsets_to_json({("t", 10): 1, ("t", 2): 5})["t"]) == ["2", "10"]


def test_split_ranges_follows_sparks_range_calculator() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None, None) == ranges[:2]  # empty ranges dropped
    assert split_ranges(ranges, 2, None) == ranges[:2]  # already enough
    split = split_ranges(ranges, 4, None)
    # Spark: the small range stays whole, the big one takes the other 3 parts
    assert split == [
        OffsetRange("t", 0, 0, 33),
        OffsetRange("t", 0, 33, 66),
        OffsetRange("t", 0, 66, 100),
        OffsetRange("t", 1, 0, 10),
    ]
    capped = split_ranges([OffsetRange("t", 0, 0, 100)], None, 30)
    assert [r.size for r in capped] == [25, 25, 25, 25]


def test_split_boundaries_move_to_batch_starts() -> None:
    whole = [OffsetRange("t", 0, 0, 300)]
    # the audit's case: even boundaries 75/150/225, batches known to start at 100, 150, 200, 250
    split = split_ranges(whole, 4, None, lambda r: [100, 150, 200, 250])
    assert [(r.start, r.end) for r in split] == [(0, 100), (100, 150), (150, 200), (200, 300)]
    far = split_ranges([OffsetRange("t", 0, 0, 100)], 2, None, lambda r: [5])
    assert far == [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 100)]  # however far: a batch start
    # no batch start between a boundary's neighbours: the boundary goes, its pieces merge
    sparse = split_ranges(whole, 6, None, lambda r: [120])
    assert [(r.start, r.end) for r in sparse] == [(0, 120), (120, 300)]
    assert split_ranges(whole, 3, None, lambda r: []) == whole
    # a broker cannot tell where batches start: the even split stays
    assert [r.size for r in split_ranges(whole, 3, None, lambda r: None)] == [100, 100, 100]
    # maxRecordsPerPartition is a cap: a boundary moves only as far as keeps both neighbours under it
    capped = split_ranges(whole, None, 70, lambda r: [100, 150, 200, 250])
    assert all(r.size <= 70 for r in capped) and sum(r.size for r in capped) == 300
    assert [r.start for r in capped] == [0, 60, 120, 180, 250]  # 250 is within reach; 60/120/180 have none
    # boundaries stay strictly increasing and every piece non-empty whatever the points
    for points in ([1, 2, 3], [299], list(range(0, 300, 7)), [150] * 3):
        pieces = split_ranges(whole, 5, None, lambda r, points=points: points)
        assert pieces[0].start == 0 and pieces[-1].end == 300
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
        assert all(r.size > 0 for r in pieces)


def test_rate_limit_prorates_and_never_starves() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 10}
    until = {("t", 0): 1000, ("t", 1): 1, ("t", 2): 10, ("t", 3): 7}
    limited = rate_limit(100, start, until)
    assert limited[("t", 0)] == 99  # floor(100 * 1000/1001)
    assert limited[("t", 1)] == 1  # ceil(0.0999): a small partition still moves
    assert limited[("t", 2)] == 10 and limited[("t", 3)] == 7


def test_pushed_filters() -> None:
    state = PushedFilters()
    state = push_filter(state, "in", "partition", [0, 2])
    state = push_filter(state, "ge", "offset", 10)
    state = push_filter(state, "lt", "offset", 20)
    assert state is not None and state.offsets == Bound(10, 19) and state.partitions == frozenset({0, 2})
    assert state.clip(OffsetRange("t", 0, 0, 100)) == OffsetRange("t", 0, 10, 20)
    assert not state.allows("t", 1)
    ts = dt.datetime(2023, 11, 14, 22, 13, 20, 500, tzinfo=dt.UTC)  # 0.5 ms past TS0
    after = push_filter(PushedFilters(), "ge", "timestamp", ts)
    assert after is not None and after.timestamps.low == TS0 + 1  # whole milliseconds
    before = push_filter(PushedFilters(), "lt", "timestamp", ts)
    assert before is not None and before.timestamps.high == TS0
    assert push_filter(PushedFilters(), "in", "offset", [1, 5]) is None  # left to Spark
    assert push_filter(PushedFilters(), "eq", "value", b"x") is None
    impossible = push_filter(push_filter(PushedFilters(), "gt", "offset", 5), "lt", "offset", 3)  # type: ignore[arg-type]
    assert impossible is not None and impossible.impossible


# --- log files ----------------------------------------------------------------------------------------------


@pytest.fixture
def engine_log(tmp_path: Path) -> Path:
    root = tmp_path / "log"
    with tidelog.open(
        root, config={"log.segment.bytes": 4096, "log.index.interval.bytes": 256}, background=False
    ) as log:
        log.create_topic("t", partitions=2)
        for i in range(0, 500, 25):
            log.produce("t", 0, make_records("t", 0, 25, start=i, step_ms=7 if i % 50 else -3))
    return root


def test_log_files_agree_with_the_engine(engine_log: Path) -> None:
    files = LogFiles([str(engine_log)])
    assert files.topics() == {"t": [0, 1]}
    p0 = files.partition("t", 0)
    with tidelog.open(engine_log, background=False) as log:
        assert p0.log_end_offset() == log.log_end_offset("t", 0) == 500
        assert files.partition("t", 1).log_end_offset() == 0
        for target in [TS0 - 100, TS0, TS0 + 5, TS0 + 1000, TS0 + 3400, TS0 + 10**7]:
            found = log.offset_for_timestamp("t", 0, target)
            assert p0.offset_for_timestamp(target) == (None if found is None else found.offset), target


def test_an_open_engines_preallocated_index_and_a_partial_tail(engine_log: Path) -> None:
    with tidelog.open(engine_log, background=False) as log:  # the engine keeps the active index preallocated
        log.produce("t", 1, make_records("t", 1, 10))
        files = LogFiles([str(engine_log)])
        assert files.partition("t", 1).log_end_offset() == 10
        assert files.partition("t", 0).log_end_offset() == 500
    segment = sorted((engine_log / "t-1").glob("*.log"))[-1]
    batch = build_batch(make_records("t", 1, 5), base_offset=10)
    with open(segment, "ab") as handle:  # a batch being written: only half of it is there
        handle.write(batch[: len(batch) // 2])
    assert LogFiles([str(engine_log)]).partition("t", 1).log_end_offset() == 10


def test_a_cluster_replica_is_read_up_to_its_checkpointed_high_watermark(tmp_path: Path) -> None:
    """A broker of a cluster opens its engine `replicated` and checkpoints each replica's high watermark in
    `replication-offset-checkpoint`: the path reader plans up to it, never the records a leader change may still
    truncate (red before: it planned up to the log end, 500)."""
    from tidelog.config import EngineConfig
    from tidelog.errors import LogFilesError
    from tidelog.spark.planning import FileBackend
    from tidelog.storage import open_engine

    root = tmp_path / "replica"
    with open_engine(EngineConfig(log_dirs=(str(root),), replicated=True)) as engine:
        engine.create_topic("t", 2)
        for i in range(0, 500, 25):
            engine.append("t", 0, build_batch(make_records("t", 0, 25, start=i)))
        engine.partition("t", 0).set_high_watermark(200)  # what the leader said its ISR holds
    files = LogFiles([str(root)])
    assert files.partition("t", 0).log_end_offset() == 500
    assert files.partition("t", 0).readable_end_offset() == 200
    assert files.partition("t", 1).readable_end_offset() == 0
    backend = FileBackend([str(root)])
    assert backend.latest([("t", 0), ("t", 1)]) == {("t", 0): 200, ("t", 1): 0}  # type: ignore[list-item]

    (root / "replication-offset-checkpoint").write_text("0\n1\nt 0 notanumber\n")
    with pytest.raises(LogFilesError, match="high watermarks are unknown"):
        LogFiles([str(root)])


def test_reads_plan_whole_batches_and_report_data_loss(engine_log: Path) -> None:
    p0 = LogFiles([str(engine_log)]).partition("t", 0)
    points = p0.split_points(0, 500)
    assert points and all(0 < p < 500 for p in points)
    chunks = list(p0.read(200, 230, fail_on_data_loss=True, chunk_bytes=64 * 1024))
    offsets = [int(o) for c in chunks for o in c.table.last_offset]
    assert any(200 <= o < 225 for o in offsets) and 229 <= offsets[-1] < 300  # index entries bound the read
    first = sorted((engine_log / "t-0").glob("*.log"))[0]
    os.unlink(first)  # retention removed the oldest segment
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        list(p0.read(0, 500, fail_on_data_loss=True))
    assert list(p0.read(0, 500, fail_on_data_loss=False))


def test_the_broker_path_reads_uncommitted_as_sparks_kafka_source() -> None:
    """librdkafka defaults to read_committed; Spark's Kafka source (and the path reader) return aborted records."""
    from tidelog.spark.kafka_client import consumer_config

    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    assert consumer_config(parse_read_options(base, streaming=False))["isolation.level"] == "read_uncommitted"
    chosen = parse_read_options({**base, "kafka.isolation.level": "read_committed"}, streaming=False)
    assert consumer_config(chosen)["isolation.level"] == "read_committed"
