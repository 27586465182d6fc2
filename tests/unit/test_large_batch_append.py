"""Large batches have their CRC checked on a worker thread while they are written: a bad one must still
leave the log exactly as it was. The engine owns that thread (storage/kafka/batch_check.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog.codec.record_batch import Record, build_batch, read_header
from tidelog.config import LogConfig
from tidelog.errors import CrcMismatchError
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.kafka.batch_check import CRC_IN_PARALLEL_BYTES, BatchCheckWorker, PendingCheck
from tidelog.storage.kafka.engine import KafkaEngine
from tidelog.storage.kafka.partition_log import PartitionLog
from tidelog.storage.kafka.segment import LogSegment


def big_batch(seed: int) -> bytes:
    records = [Record(value=os.urandom(1000), timestamp_ms=1_700_000_000_000 + seed) for _ in range(400)]
    data = build_batch(records)
    assert len(data) >= CRC_IN_PARALLEL_BYTES
    return data


def test_a_large_batch_with_a_bad_crc_leaves_nothing_behind(tmp_path: Path) -> None:
    with tidelog.open(tmp_path, background=False) as log:
        assert isinstance(log, KafkaEngine)
        log.create_topic("t", 1)
        good = big_batch(1)
        log.append("t", 0, good)
        segment = tmp_path / "t-0" / "00000000000000000000.log"
        size_before = segment.stat().st_size
        damaged = bytearray(big_batch(2))
        damaged[len(damaged) // 2] ^= 0x55
        with pytest.raises(CrcMismatchError):
            log.append("t", 0, bytes(damaged))
        assert segment.stat().st_size == size_before
        assert log.log_end_offset("t", 0) == 400
        result = log.append("t", 0, big_batch(3))
        assert result.base_offset == 400
        assert [r.offset for r in log.consume("t", 0)] == list(range(800))


def test_a_retried_large_batch_is_checked_again_before_its_offsets_are_answered(tmp_path: Path) -> None:
    """A retry of a large batch already in the log gets its original offsets once its own check passed on the
    worker; a retry whose bytes were damaged on the way is refused, and nothing is written either way."""
    records = [Record(value=os.urandom(1000), timestamp_ms=1_700_000_000_000) for _ in range(400)]
    first = build_batch(records, producer_id=9, producer_epoch=0, base_sequence=0)
    assert len(first) >= CRC_IN_PARALLEL_BYTES
    with tidelog.open(tmp_path, background=False) as log:
        assert isinstance(log, KafkaEngine)
        log.create_topic("t", 1)
        assert log.append("t", 0, first).base_offset == 0
        segment = tmp_path / "t-0" / "00000000000000000000.log"
        size = segment.stat().st_size
        retry = log.append("t", 0, first)
        assert (retry.base_offset, retry.last_offset) == (0, 399)
        damaged = bytearray(first)
        damaged[len(damaged) // 2] ^= 0x55
        with pytest.raises(CrcMismatchError):
            log.append("t", 0, bytes(damaged))
        assert segment.stat().st_size == size
        assert log.log_end_offset("t", 0) == 400


def test_a_check_the_worker_has_not_started_runs_on_the_appending_thread() -> None:
    """When the worker has not picked a check up by the end of the write (other processes hold the CPUs), the
    appending thread claims and runs it instead of waiting; the worker then skips it. Either way a damaged batch is
    refused."""
    good = big_batch(4)
    pending = PendingCheck(memoryview(good), 0, read_header(good), True)  # never queued: no worker takes it
    check = pending.result()
    assert check.max_timestamp == 1_700_000_000_004 and check.keyless == 400
    pending.run_if_unclaimed()  # the worker's turn comes too late: nothing runs twice, nothing is queued
    assert pending._outcome.empty()
    damaged = bytearray(good)
    damaged[len(damaged) // 3] ^= 0x01
    with pytest.raises(CrcMismatchError):
        PendingCheck(memoryview(damaged), 0, read_header(bytes(damaged)), True).result()


def check_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "tidelog-check")


def test_the_engine_owns_one_check_worker_and_stops_it_when_it_closes(tmp_path: Path) -> None:
    before = check_threads()
    with tidelog.open(tmp_path, background=False) as log:
        assert isinstance(log, KafkaEngine)
        log.create_topic("t", 3)
        assert check_threads() == before + 1
        assert {log.partition_log("t", p).check_worker for p in range(3)} == {log.check_worker}
        for partition in range(3):
            log.append("t", partition, big_batch(partition))
    assert check_threads() == before


def test_a_check_submitted_after_the_worker_stopped_runs_on_the_appending_thread() -> None:
    worker = BatchCheckWorker()
    worker.start()
    worker.stop()
    worker.stop()  # a second stop finds nothing to do
    good = big_batch(5)
    assert worker.submit(memoryview(good), 0, read_header(good), True).result().keyless == 400
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0x55
    with pytest.raises(CrcMismatchError):
        worker.submit(memoryview(damaged), 0, read_header(bytes(damaged)), True).result()


def test_a_partition_log_without_a_worker_checks_large_batches_before_writing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[tuple[int, bool]] = []  # (size, checked during the write)
    real_append = LogSegment.append

    def recorded(segment: LogSegment, *args: Any, **kwargs: Any) -> None:
        writes.append((args[1], kwargs.get("verify") is not None))
        real_append(segment, *args, **kwargs)

    monkeypatch.setattr(LogSegment, "append", recorded)
    partition_log = PartitionLog(tmp_path / "t-0", "t", 0, new_kafka_uuid(), LogConfig())
    try:
        damaged = bytearray(big_batch(6))
        damaged[len(damaged) // 2] ^= 0x55
        with pytest.raises(CrcMismatchError):
            partition_log.append(bytes(damaged))
        assert writes == [] and partition_log.log_end_offset == 0
        good = big_batch(7)
        assert partition_log.append(good).last_offset == 399
        assert writes == [(len(good), False)]
    finally:
        partition_log.close()
