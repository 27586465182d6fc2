"""Retention of the RocketMQ engine (RocketMQ's CleanCommitLogService): whole CommitLog files by age
(`fileReservedTime`, file mtime) at the `deleteWhen` hours, at any hour above `diskMaxUsedSpaceRatio`, regardless
of age above `diskSpaceCleanForciblyRatio`, writes refused above `diskSpaceWarningLevelRatio`; then the ConsumeQueue
files below the new CommitLog minimum. The disk ratios are set around the real usage of the disk the test runs on."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import tidelog
from broker_process import ROCKETMQ_IGNORE_DISK_USAGE
from tidelog import Record
from tidelog.errors import KafkaStorageError, OffsetOutOfRangeError
from tidelog.storage.rocketmq.engine import RocketMQEngine
from tidelog.storage.rocketmq.retention import disk_used_percent, is_time_to_delete

TS = 1_700_000_000_000
FILE_SIZE = 4096
HOUR_S = 3600


def open_store(path: Path, **config: object) -> RocketMQEngine:
    settings = {
        "tidelog.rocketmq.mapedFileSizeCommitLog": FILE_SIZE,
        "tidelog.rocketmq.mapedFileSizeConsumeQueue": 200,
        "tidelog.rocketmq.deleteFileBatchMax": 100,
        "tidelog.rocketmq.deleteCommitLogFilesInterval": 0,
        **ROCKETMQ_IGNORE_DISK_USAGE,
        **config,
    }
    engine = tidelog.open(path, engine="rocketmq", config=settings, background=False)
    assert isinstance(engine, RocketMQEngine)
    return engine


def fill(engine: RocketMQEngine, count: int = 300) -> list[bytes]:
    engine.create_topic("t", 1)
    values = [b"message %04d " % i + b"x" * 40 for i in range(count)]
    for value in values:
        engine.produce("t", 0, [Record(value, timestamp_ms=TS)])
    return values


def commitlog_files(store: Path) -> list[Path]:
    return sorted((store / "commitlog").iterdir())


def age_files(files: list[Path], hours: float) -> None:
    then = time.time() - hours * HOUR_S
    for path in files:
        os.utime(path, (then, then))


def other_hour() -> str:
    return str((time.localtime().tm_hour + 12) % 24)


def test_delete_when_hours() -> None:
    now = int(time.mktime((2026, 11, 22, 4, 30, 0, 0, 0, -1)) * 1000)
    assert is_time_to_delete("04", now)
    assert is_time_to_delete("01;04;13", now)
    assert not is_time_to_delete("05", now)
    assert not is_time_to_delete("", now)


def test_expired_files_go_at_the_delete_when_hour_only(tmp_path: Path) -> None:
    store = tmp_path / "store"
    settings = {"tidelog.rocketmq.fileReservedTime": 1, "tidelog.rocketmq.deleteWhen": other_hour()}
    with open_store(store, **settings) as engine:
        values = fill(engine)
        files = commitlog_files(store)
        assert len(files) >= 5
        age_files(files[:3], hours=2)  # the three oldest files are past fileReservedTime
        assert engine.retention.run() == 0  # not the hour, disk not full: nothing
    hour = str(time.localtime().tm_hour)
    with open_store(store, **{**settings, "tidelog.rocketmq.deleteWhen": f"{other_hour()};{hour}"}) as engine:
        assert engine.retention.run() == 3
        assert commitlog_files(store) == files[3:]
        start = engine.log_start_offset("t", 0)
        assert start > 0 and engine.commitlog.min_offset == 3 * FILE_SIZE
        assert [r.value for r in engine.consume("t", 0)] == values[start:]
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, start - 1, 1 << 20)
        assert engine.retention.run() == 0  # the next file is not expired: deletion stops there


def test_unexpired_file_stops_the_deletion_even_if_later_ones_are_old(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store, **{"tidelog.rocketmq.fileReservedTime": 1}) as engine:
        fill(engine)
        files = commitlog_files(store)
        age_files(files[:1] + files[2:4], hours=2)
        assert engine.retention.run(manual=True) == 1
        assert commitlog_files(store) == files[1:]


def test_consume_queue_files_below_the_new_minimum_go(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store, **{"tidelog.rocketmq.fileReservedTime": 0}) as engine:
        values = fill(engine, 400)
        queue_dir = store / "consumequeue" / "t" / "0"
        before = sorted(queue_dir.iterdir())
        assert len(before) >= 30  # 10 units per 200-byte file
        assert engine.retention.run(manual=True) > 0
        assert len(commitlog_files(store)) == 1  # all but the active file
        after = sorted(queue_dir.iterdir())
        assert after and len(after) < len(before) and after == before[len(before) - len(after) :]
        start = engine.log_start_offset("t", 0)
        assert int(after[0].name) // 20 <= start  # the first file left holds the log start
        assert [r.value for r in engine.consume("t", 0)] == values[start:]
    with open_store(store) as engine:  # and the same after a restart
        assert engine.log_start_offset("t", 0) == start
        assert [r.value for r in engine.consume("t", 0)] == values[start:]


def test_disk_usage_is_measured_as_df_measures_it(tmp_path: Path) -> None:
    """Reserved blocks count as neither used nor available (RocketMQ's getDiskPartitionSpaceUsedPercent, df's Use%):
    on a file system that reserves much, free-over-total would call a three-quarters-full disk full."""
    df = subprocess.run(["df", "--output=pcent", str(tmp_path)], capture_output=True, text=True, check=True)
    df_percent = int(df.stdout.splitlines()[-1].strip().rstrip("%"))
    assert abs(disk_used_percent(tmp_path) - df_percent) <= 1  # other processes write meanwhile


def test_disk_usage_ratios(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    used = disk_used_percent(store)
    if not 15 <= used <= 85:
        pytest.skip(f"the disk is {used:.0f}% used; the ratios cannot be set around it")
    below = int(used) - 5  # a margin: other processes may free a few GB meanwhile
    delete_when = {"tidelog.rocketmq.deleteWhen": other_hour(), "tidelog.rocketmq.fileReservedTime": 1}
    with open_store(store, **delete_when, **{"tidelog.rocketmq.diskMaxUsedSpaceRatio": below}) as engine:
        fill(engine)
        files = commitlog_files(store)
        age_files(files[:2], hours=2)
        assert engine.retention.run() == 2  # over diskMaxUsedSpaceRatio: expired files go at any hour
        assert not engine.retention.disk_full
    forcibly = {"tidelog.rocketmq.diskMaxUsedSpaceRatio": below, "tidelog.rocketmq.diskSpaceCleanForciblyRatio": below}
    with open_store(store, **delete_when, **forcibly) as engine:
        remaining = len(commitlog_files(store))
        assert engine.retention.run() == remaining - 1  # over the forced ratio: unexpired files go too
    with open_store(store, **{"tidelog.rocketmq.diskSpaceWarningLevelRatio": below}) as engine:
        engine.retention.run()
        assert engine.retention.disk_full
        with pytest.raises(KafkaStorageError, match="diskSpaceWarningLevelRatio"):
            engine.produce("t", 0, [Record(b"refused")])
        end = engine.log_end_offset("t", 0)
    with open_store(store) as engine:
        engine.retention.run()
        assert not engine.retention.disk_full
        assert engine.produce("t", 0, [Record(b"accepted")]) == end


def test_topics_kept_forever_keep_the_newest_value_of_every_key(tmp_path: Path) -> None:
    """__consumer_offsets (retention.ms=-1) lives in the CommitLog: deleting old files must not lose a key's value."""
    store = tmp_path / "store"
    with open_store(store, **{"tidelog.rocketmq.fileReservedTime": 0}) as engine:
        engine.create_topic("offsets", 1, {"retention.ms": "-1"})
        engine.create_topic("filler", 1)
        newest: dict[bytes, bytes | None] = {}
        for round_ in range(6):
            for k in range(8):
                key, value = b"group-%d" % k, b"offset %d" % (round_ * 100 + k)
                if k == 3 and round_ == 5:
                    value = None  # the key was deleted
                engine.produce("offsets", 0, [Record(value, key=key, timestamp_ms=TS)])
                newest[key] = value
            for _ in range(20):
                engine.produce("filler", 0, [Record(b"f" * 100, timestamp_ms=TS)])
        assert engine.retention.run(manual=True) > 0
        assert len(commitlog_files(store)) == 1
        assert engine.log_start_offset("filler", 0) > 0
        kept = {r.key: r.value for r in engine.consume("offsets", 0)}
        assert kept == {k: v for k, v in newest.items() if v is not None}
    with open_store(store) as engine:  # the copies are ordinary messages: they survive a restart
        assert {r.key: r.value for r in engine.consume("offsets", 0)} == {k: v for k, v in newest.items() if v}
