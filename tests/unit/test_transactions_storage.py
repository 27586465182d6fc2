"""Transactions in the Kafka engine (storage/api.py's transactional calls) on real files: transactional batches
open a producer's transaction, markers (append_marker) close it, the last stable offset and reads below it, the
aborted transactions a read_committed fetch gets, the `.txnindex` files, Kafka's refusals (older producer or
coordinator epoch, a non-transactional batch inside a transaction, a client's control batch), and the state coming
back after a clean close, a crash with and without the producer snapshot, recovery, truncation, replication and
retention."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tidelog import Record
from tidelog.codec.control_record import ControlRecordType, build_control_batch
from tidelog.codec.record_batch import build_batch
from tidelog.codec.record_set import iter_batches
from tidelog.config import LogConfig
from tidelog.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.api import AbortedTransaction
from tidelog.storage.kafka.partition_log import PartitionLog

TS = 1_700_000_000_000
SMALL = LogConfig(segment_bytes=600, index_interval_bytes=100)
TOPIC_ID = new_kafka_uuid()
TXN_ENTRY = struct.Struct(">hqqqq")


def txn_batch(producer_id: int, sequence: int, *, epoch: int = 0, count: int = 2, transactional: bool = True) -> bytes:
    records = [Record(b"p%d-s%d" % (producer_id, sequence + i), timestamp_ms=TS + i) for i in range(count)]
    return build_batch(
        records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, is_transactional=transactional
    )


def open_log(directory: Path, *, replicated: bool = False, clean: bool = True) -> PartitionLog:
    return PartitionLog(directory, "t", 0, TOPIC_ID, SMALL, replicated=replicated, had_clean_shutdown=clean)


def txn_index_files(directory: Path) -> dict[str, list[tuple[int, ...]]]:
    """Each `.txnindex` file's entries, read with `struct`."""
    return {
        p.name: [entry for entry in TXN_ENTRY.iter_unpack(p.read_bytes())] for p in sorted(directory.glob("*.txnindex"))
    }


def all_entries(directory: Path) -> list[tuple[int, ...]]:
    return [entry for entries in txn_index_files(directory).values() for entry in entries]


def three_producers(log: PartitionLog) -> None:
    """Producer 1 committed (offsets 0-1, marker 6), 2 aborted (2-3, marker 7), 3 still open from offset 4."""
    log.append(txn_batch(1, 0))
    log.append(txn_batch(2, 0))
    log.append(txn_batch(3, 0))
    assert log.last_stable_offset == 0
    log.append_marker(1, 0, coordinator_epoch=5, commit=True)
    assert log.last_stable_offset == 2
    log.append_marker(2, 0, coordinator_epoch=5, commit=False)


def test_markers_close_transactions_and_move_the_last_stable_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    three_producers(log)
    assert (log.log_end_offset, log.high_watermark, log.last_stable_offset) == (8, 8, 4)
    assert log.aborted_transactions(0, 8) == [AbortedTransaction(2, 2)]
    assert log.aborted_transactions(8, 9) == []  # its marker is below the fetch offset
    assert log.aborted_transactions(0, 2) == []  # it starts at the upper bound
    summaries = {p.producer_id: p for p in log.active_producers()}
    assert (summaries[1].coordinator_epoch, summaries[1].current_txn_start_offset) == (5, -1)
    assert (summaries[3].coordinator_epoch, summaries[3].current_txn_start_offset) == (-1, 4)
    # the abort is in the transaction index of the segment holding its marker, Kafka's 34-byte entry:
    # version 0, producer 2, first offset 2, marker 7, last stable offset 4 (producer 3's open transaction)
    assert list(txn_index_files(tmp_path).values()) == [[(0, 2, 2, 7, 4)]]

    log.append_marker(3, 0, coordinator_epoch=5, commit=False)
    assert log.last_stable_offset == 9
    assert log.aborted_transactions(0, 9) == [AbortedTransaction(2, 2), AbortedTransaction(3, 4)]
    assert all_entries(tmp_path) == [
        (0, 2, 2, 7, 4),
        (0, 3, 4, 8, 9),
    ]
    log.close()


def test_a_read_up_to_the_last_stable_offset_stops_before_the_open_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(build_batch([Record(b"plain", timestamp_ms=TS)]))
    log.append(txn_batch(1, 0))
    log.append(build_batch([Record(b"plain", timestamp_ms=TS)]))
    assert log.last_stable_offset == 1
    data = log.read(0, 1 << 20, max_offset=log.last_stable_offset).read_bytes()
    assert [info.last_offset for info in iter_batches(data)] == [0]
    assert log.read(1, 1 << 20, max_offset=1).slices == ()
    everything = log.read(0, 1 << 20).read_bytes()
    assert [info.last_offset for info in iter_batches(everything)] == [0, 2, 3]
    log.append_marker(1, 0, 0, commit=True)
    data = log.read(0, 1 << 20, max_offset=log.last_stable_offset).read_bytes()
    assert [info.last_offset for info in iter_batches(data)] == [0, 2, 3, 4]
    log.close()


def test_kafkas_refusals_leave_the_log_unchanged(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(1, 0, epoch=2))
    log.append_marker(1, 2, coordinator_epoch=4, commit=True)
    log.append(txn_batch(1, 2, epoch=2))
    end = log.log_end_offset
    with pytest.raises(InvalidProducerEpochError):
        log.append(txn_batch(1, 0, epoch=1))
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(1, 4, epoch=2, transactional=False))
    with pytest.raises(InvalidProducerEpochError):
        log.append_marker(1, 1, coordinator_epoch=4, commit=False)
    with pytest.raises(TransactionCoordinatorFencedError) as fenced:
        log.append_marker(1, 2, coordinator_epoch=3, commit=False)
    assert fenced.value.kafka_error_code == 52
    control = build_control_batch(ControlRecordType.COMMIT, producer_id=1, producer_epoch=2, timestamp_ms=TS)
    with pytest.raises(InvalidRecordError, match="control"):
        log.append(control)
    assert log.log_end_offset == end and log.last_stable_offset == 3
    log.close()


def test_a_marker_without_an_open_transaction_is_written_and_changes_nothing_else(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    result = log.append_marker(9, 0, coordinator_epoch=1, commit=False)
    assert (result.base_offset, log.log_end_offset, log.last_stable_offset) == (0, 1, 1)
    assert log.aborted_transactions(0, 1) == [] and txn_index_files(tmp_path) == {}
    [producer] = log.active_producers()
    assert (producer.producer_id, producer.coordinator_epoch, producer.current_txn_start_offset) == (9, 1, -1)
    log.close()


@pytest.mark.parametrize("how", ["clean", "crash", "crash-without-snapshot"])
def test_an_open_transaction_survives_a_reopen(tmp_path: Path, how: str) -> None:
    log = open_log(tmp_path)
    for n in range(6):  # rolls: snapshots at the rolls carry producer 1's open transaction
        log.append(build_batch([Record(b"x" * 120, timestamp_ms=TS)]))
        if n == 1:
            log.append(txn_batch(1, 0))
    log.append(txn_batch(2, 0))
    log.append_marker(2, 0, 3, commit=False)
    before = (log.last_stable_offset, log.aborted_transactions(0, 100), log.log_end_offset)
    assert before[0] == 2
    if how == "clean":
        log.close()
    else:  # killed mid-transaction: no close, nothing flushed since the last roll
        for snapshot in tmp_path.glob("*.snapshot") if how == "crash-without-snapshot" else ():
            snapshot.unlink()
    reopened = open_log(tmp_path, clean=how == "clean")
    assert (reopened.last_stable_offset, reopened.aborted_transactions(0, 100), reopened.log_end_offset) == before
    reopened.append(txn_batch(1, 2))  # the same transaction goes on
    reopened.append_marker(1, 0, 3, commit=False)
    assert reopened.aborted_transactions(0, 100)[-1] == AbortedTransaction(1, 2)
    assert reopened.last_stable_offset == reopened.log_end_offset
    reopened.close()


def test_recovery_rebuilds_the_transaction_indexes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for producer in range(1, 7):
        log.append(txn_batch(producer, 0, count=3))
        log.append(build_batch([Record(b"x" * 100, timestamp_ms=TS)]))
        if producer % 2 == 0:
            log.append_marker(producer - 1, 0, 1, commit=False)
            log.append_marker(producer, 0, 1, commit=producer % 4 == 0)
    aborted = log.aborted_transactions(0, log.log_end_offset)
    files = txn_index_files(tmp_path)
    assert len(files) >= 2, "the aborts should fall into several segments"
    for path in tmp_path.glob("*.txnindex"):
        path.unlink()
    for path in tmp_path.glob("*.snapshot"):
        path.unlink()
    recovered = open_log(tmp_path, clean=False)  # a crash: every segment from the recovery point (0) is rescanned
    assert recovered.aborted_transactions(0, recovered.log_end_offset) == aborted
    assert txn_index_files(tmp_path) == files
    recovered.close()


def test_truncation_inside_a_transaction_reopens_it(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(build_batch([Record(b"plain", timestamp_ms=TS)]))
    log.append(txn_batch(1, 0))  # offsets 1-2
    log.append(txn_batch(1, 2))  # 3-4
    log.append_marker(1, 0, 0, commit=False)  # 5
    log.truncate_to(5)  # the marker goes: the transaction is open again, its abort forgotten
    assert (log.log_end_offset, log.last_stable_offset, log.aborted_transactions(0, 5)) == (5, 1, [])
    assert all_entries(tmp_path) == []
    log.truncate_to(3)
    assert log.last_stable_offset == 1
    log.truncate_to(1)  # before the transaction began
    assert (log.log_end_offset, log.last_stable_offset) == (1, 1)
    assert log.active_producers() == [] or log.active_producers()[0].current_txn_start_offset == -1
    log.append(build_batch([Record(b"after", timestamp_ms=TS)]))
    assert log.last_stable_offset == 2
    log.close()


def test_a_followers_files_are_the_leaders_txnindex_included(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader", replicated=True)
    follower = open_log(tmp_path / "follower", replicated=True)
    for producer in range(1, 9):
        leader.append(txn_batch(producer, 0, count=2))
        leader.append_marker(producer, 0, 2, commit=producer % 3 == 0)
    leader.set_high_watermark(leader.log_end_offset)
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_replica(leader.read(follower.log_end_offset, 1 << 20, up_to_log_end=True).read_bytes())
    follower.set_high_watermark(leader.log_end_offset)
    assert follower.aborted_transactions(0, 100) == leader.aborted_transactions(0, 100) != []
    assert follower.last_stable_offset == leader.last_stable_offset == leader.log_end_offset
    leader.close()
    follower.close()

    def files(directory: Path) -> dict[str, bytes]:
        kinds = (".log", ".index", ".timeindex", ".txnindex")
        return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name.endswith(kinds)}

    assert files(tmp_path / "follower") == files(tmp_path / "leader")
    assert any(name.endswith(".txnindex") for name in files(tmp_path / "leader"))


def test_a_completed_transaction_stays_unstable_until_the_high_watermark_passes_its_marker(tmp_path: Path) -> None:
    log = open_log(tmp_path, replicated=True)
    log.append(txn_batch(1, 0))
    log.append_marker(1, 0, 0, commit=True)
    log.set_high_watermark(2)
    assert log.last_stable_offset == 0  # the commit is not replicated yet
    log.set_high_watermark(3)
    assert log.last_stable_offset == 3
    log.close()


def test_retention_deletes_a_segments_txnindex_with_it(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(1, 0))
    log.append_marker(1, 0, 0, commit=False)
    for _ in range(8):
        log.append(build_batch([Record(b"x" * 150, timestamp_ms=TS)]))
    assert txn_index_files(tmp_path)
    log.delete_records(log.segments[-1].base_offset)
    assert txn_index_files(tmp_path) == {}
    assert log.aborted_transactions(log.log_start_offset, log.log_end_offset) == []
    log.close()
