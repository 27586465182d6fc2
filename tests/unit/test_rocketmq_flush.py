"""The RocketMQ engine's ASYNC_FLUSH policy (RocketMQ's FlushRealTimeService): a round every
flushIntervalCommitLog ms syncs the CommitLog only when at least flushCommitLogLeastPages 4 KiB pages are dirty, and
everything once flushCommitLogThoroughInterval ms have passed since the last thorough round. The rounds are driven
with a given clock; the interval is checked on the engine's own thread."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.storage.rocketmq.commitlog import CommitLog
from tidelog.storage.rocketmq.engine import RocketMQEngine
from tidelog.storage.rocketmq.flush import CommitLogFlusher
from tidelog.storage.rocketmq.mapped_file import OS_PAGE_SIZE

FILE_SIZE = 64 * OS_PAGE_SIZE
TS = 1_700_000_000_000


@pytest.fixture
def commitlog(tmp_path: Path) -> Iterator[CommitLog]:
    log = CommitLog(tmp_path, FILE_SIZE, allocator=None)
    log.load()
    yield log
    log.close()


def make_flusher(commitlog: CommitLog, *, least_pages: int = 4, thorough_interval_ms: int = 10_000) -> CommitLogFlusher:
    return CommitLogFlusher(
        commitlog,
        sync_flush=False,
        background=False,
        interval_ms=500,
        least_pages=least_pages,
        thorough_interval_ms=thorough_interval_ms,
        sync_flush_timeout_ms=5000,
        on_flushed=lambda _timestamp: None,
    )


def write(commitlog: CommitLog, size: int) -> None:
    commitlog.put(size, lambda _offset: b"m" * size, TS)


def test_a_round_flushes_only_at_least_pages_dirty(commitlog: CommitLog) -> None:
    flusher = make_flusher(commitlog, least_pages=4)
    started = time.monotonic()
    write(commitlog, 3 * OS_PAGE_SIZE + 100)  # 3 pages dirty (the 4th is begun, not full)
    assert not flusher.real_time_round(started + 0.5)
    assert commitlog.flushed_where == 0
    write(commitlog, OS_PAGE_SIZE)  # now 4
    assert flusher.real_time_round(started + 1.0)
    assert commitlog.flushed_where == commitlog.max_offset == 4 * OS_PAGE_SIZE + 100
    write(commitlog, 100)
    assert not flusher.real_time_round(started + 1.5)  # less than a page again
    assert commitlog.flushed_where == 4 * OS_PAGE_SIZE + 100


def test_a_thorough_round_flushes_everything(commitlog: CommitLog) -> None:
    flusher = make_flusher(commitlog, least_pages=4, thorough_interval_ms=10_000)
    started = flusher._last_thorough
    write(commitlog, 100)
    assert not flusher.real_time_round(started + 9.9)
    assert commitlog.flushed_where == 0
    assert flusher.real_time_round(started + 10.0)  # flushCommitLogThoroughInterval passed: a page is not needed
    assert commitlog.flushed_where == 100
    write(commitlog, 100)
    assert not flusher.real_time_round(started + 19.9)  # the next thorough round is 10 s after that one
    assert flusher.real_time_round(started + 20.0)
    assert commitlog.flushed_where == 200
    assert flusher.flush_count == 2


def test_least_pages_zero_flushes_every_round(commitlog: CommitLog) -> None:
    flusher = make_flusher(commitlog, least_pages=0, thorough_interval_ms=3_600_000)
    started = time.monotonic()
    for round_ in range(3):
        write(commitlog, 10)
        assert flusher.real_time_round(started + round_)
        assert commitlog.flushed_where == commitlog.max_offset


def open_store(path: Path, interval_ms: int) -> RocketMQEngine:
    config = {
        "tidelog.rocketmq.flushIntervalCommitLog": interval_ms,
        "tidelog.rocketmq.flushCommitLogLeastPages": 0,
        "tidelog.rocketmq.flushCommitLogThoroughInterval": 3_600_000,
    }
    engine = tidelog.open(path, engine="rocketmq", config=config, background=True)
    assert isinstance(engine, RocketMQEngine)
    engine.create_topic("t", 1)
    return engine


def test_the_flush_thread_runs_every_flush_interval(tmp_path: Path) -> None:
    with open_store(tmp_path / "hourly", 3_600_000) as engine:
        engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
        time.sleep(0.3)
        assert engine.commitlog.flushed_where == 0 < engine.commitlog.max_offset  # the first round is an hour away
    with open_store(tmp_path / "often", 20) as engine:
        engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
        deadline = time.monotonic() + 10
        while engine.commitlog.flushed_where < engine.commitlog.max_offset and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.commitlog.flushed_where == engine.commitlog.max_offset > 0
        assert engine.checkpoint.physic_msg_timestamp == engine.commitlog.last_store_timestamp
        flushes = engine.flusher.flush_count
        for i in range(3):  # every write is flushed by a later round of the thread
            engine.produce("t", 0, [Record(b"y%d" % i, timestamp_ms=TS)])
            deadline = time.monotonic() + 10
            while engine.commitlog.flushed_where < engine.commitlog.max_offset and time.monotonic() < deadline:
                time.sleep(0.005)
            assert engine.commitlog.flushed_where == engine.commitlog.max_offset
        assert engine.flusher.flush_count >= flushes + 3


def test_an_explicit_flush_does_not_wait_for_the_flush_thread(tmp_path: Path) -> None:
    """A partition's flush() under ASYNC_FLUSH (the broker's committed offsets, a client's explicit flush) syncs in
    the caller: the thread would wait for its dirty pages or its thorough round, for longer than syncFlushTimeout."""
    config = {"tidelog.rocketmq.flushCommitLogThoroughInterval": 3_600_000}  # 4 dirty pages for a round
    with tidelog.open(tmp_path / "store", engine="rocketmq", config=config, background=True) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
        assert engine.commitlog.flushed_where == 0
        started = time.monotonic()
        engine.partition("t", 0).flush()
        assert time.monotonic() - started < 2.0
        assert engine.commitlog.flushed_where == engine.commitlog.max_offset > 0
        assert engine.partition("t", 0).flushed_offset == 1
