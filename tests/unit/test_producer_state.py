"""Idempotent producers: duplicates answered with their original offsets, sequence and epoch rules, snapshots."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from crc32c import crc32c

import tidelog
from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from tidelog.storage.kafka.engine import KafkaEngine

TS = 1_700_000_000_000


def batch(producer_id: int, epoch: int, sequence: int, count: int = 3) -> bytes:
    records = [Record(value=b"v%d" % (sequence + i), timestamp_ms=TS + sequence + i) for i in range(count)]
    return build_batch(records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def open_log(path: Path, **config: object) -> KafkaEngine:
    engine = tidelog.open(path, config=config, background=False)
    assert isinstance(engine, KafkaEngine)
    return engine


def test_a_retried_batch_gets_its_original_offsets_and_is_not_written_twice(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        first = log.append("t", 0, batch(7, 0, 0))
        second = log.append("t", 0, batch(7, 0, 3))
        retry = log.append("t", 0, batch(7, 0, 0))
        assert (retry.base_offset, retry.last_offset) == (first.base_offset, first.last_offset) == (0, 2)
        assert second.base_offset == 3
        assert log.log_end_offset("t", 0) == 6
        assert [r.value for r in log.consume("t", 0)] == [b"v%d" % i for i in range(6)]


def test_only_the_last_five_batches_are_recognised(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        for n in range(6):
            log.append("t", 0, batch(7, 0, n * 3))
        assert log.append("t", 0, batch(7, 0, 3)).base_offset == 3  # second batch: still in the window
        with pytest.raises(OutOfOrderSequenceError):
            log.append("t", 0, batch(7, 0, 0))  # the first one fell out of the window


def test_a_sequence_gap_is_out_of_order_and_nothing_is_written(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, batch(7, 0, 0))
        with pytest.raises(OutOfOrderSequenceError) as error:
            log.append("t", 0, batch(7, 0, 5))
        assert error.value.kafka_error_code == 45
        assert log.log_end_offset("t", 0) == 3


def test_epochs_fence_old_producers_and_restart_sequences(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, batch(7, 1, 0))
        with pytest.raises(InvalidProducerEpochError) as error:
            log.append("t", 0, batch(7, 0, 3))
        assert error.value.kafka_error_code == 47
        with pytest.raises(OutOfOrderSequenceError):
            log.append("t", 0, batch(7, 2, 3))  # a new epoch starts at 0
        assert log.append("t", 0, batch(7, 2, 0)).base_offset == 3


def test_an_unknown_producer_may_start_at_any_sequence(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        assert log.append("t", 0, batch(9, 0, 42)).base_offset == 0


@pytest.mark.parametrize("clean", [True, False])
def test_state_survives_a_restart(tmp_path: Path, clean: bool) -> None:
    log = open_log(tmp_path, **{"log.segment.bytes": 400})
    log.create_topic("t", 1)
    for n in range(8):
        log.append("t", 0, batch(7, 0, n * 3))
    if clean:
        log.close()
        assert (tmp_path / "t-0" / f"{24:020d}.snapshot").exists()
    else:  # a crash: no close, no clean-shutdown marker; the snapshot taken at the last roll plus a log replay
        log._release_dir_locks()
    with open_log(tmp_path) as reopened:
        assert reopened.append("t", 0, batch(7, 0, 21)).base_offset == 21  # duplicate of the last batch
        assert reopened.append("t", 0, batch(7, 0, 24)).base_offset == 24
        with pytest.raises(OutOfOrderSequenceError):
            reopened.append("t", 0, batch(7, 0, 30))


def test_snapshot_file_layout(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, batch(7, 2, 0, count=4))
    data = (tmp_path / "t-0" / f"{4:020d}.snapshot").read_bytes()
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count) == (1, 1)
    assert crc == crc32c(data[6:])
    entry = struct.unpack_from(">qhiqiqiq", data, 10)
    assert entry == (7, 2, 3, 3, 3, TS + 3, -1, -1)


def test_a_corrupt_snapshot_is_replaced_by_a_log_replay(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.create_topic("t", 1)
        log.append("t", 0, batch(7, 0, 0))
    snapshot = tmp_path / "t-0" / f"{3:020d}.snapshot"
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    os.remove(tmp_path / ".kafka_cleanshutdown")
    with open_log(tmp_path) as reopened:
        assert reopened.append("t", 0, batch(7, 0, 0)).base_offset == 0  # still recognised as a duplicate
        assert reopened.log_end_offset("t", 0) == 3


def test_a_roll_snapshot_a_crash_tore_is_replaced_by_an_older_one_and_a_replay(tmp_path: Path) -> None:
    """A roll writes its snapshot without fsync (the flush of the rolled segment makes it durable). A crash before
    that may leave it empty or torn: it is deleted at the next start and the state is rebuilt from the snapshot
    before it plus the log after that."""
    log = open_log(tmp_path, **{"log.segment.bytes": 400})
    log.create_topic("t", 1)
    for n in range(12):
        log.append("t", 0, batch(7, 0, n * 3))
    partition_log = log.partition_log("t", 0)
    assert partition_log.producer_state.unsynced == {}  # background=False: each roll's flush ran at once
    snapshots = partition_log.producer_state.snapshot_files()
    assert len(snapshots) == 2
    log._release_dir_locks()  # a crash: no close
    newest = snapshots[-1][1]
    newest.write_bytes(newest.read_bytes()[:7])  # torn, as an unsynced file may be
    with open_log(tmp_path) as reopened:
        assert not newest.exists()
        assert reopened.append("t", 0, batch(7, 0, 33)).base_offset == 33  # duplicate of the last batch
        assert reopened.append("t", 0, batch(7, 0, 36)).base_offset == 36
        with pytest.raises(OutOfOrderSequenceError):
            reopened.append("t", 0, batch(7, 0, 42))
