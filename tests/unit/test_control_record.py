"""The end-transaction marker (codec/control_record.py) against bytes written out by hand from Kafka's format
(DefaultRecordBatch, DefaultRecord, ControlRecordType, EndTransactionMarker)."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from tidelog.codec.control_record import (
    ControlRecordType,
    EndTransactionMarker,
    build_control_batch,
    read_end_txn_marker,
)
from tidelog.codec.record_batch import Record, build_batch, check_batch
from tidelog.errors import CorruptRecordError

TS = 1_700_000_000_000


def hand_built_marker(commit: bool, *, base_offset: int, leader_epoch: int, producer_id: int, epoch: int,
                      coordinator_epoch: int) -> bytes:  # fmt: skip
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, coordinator_epoch)
    # attributes 0, timestampDelta 0, offsetDelta 0, keyLength 4 (zigzag 8), key, valueLength 6 (zigzag 12), value,
    # no headers; the record's length (16, zigzag 32) first
    body = b"\x00\x00\x00\x08" + key + b"\x0c" + value + b"\x00"
    record = b"\x20" + body
    after_crc = struct.pack(">hiqqqhii", 0x30, 0, TS, TS, producer_id, epoch, -1, 1) + record
    prefix = struct.pack(">qiib", base_offset, 4 + 1 + 4 + len(after_crc), leader_epoch, 2)
    return prefix + struct.pack(">I", crc32c(after_crc)) + after_crc


@pytest.mark.parametrize("commit", [True, False])
def test_the_marker_batch_is_kafkas_byte_for_byte(commit: bool) -> None:
    control_type = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    built = build_control_batch(
        control_type,
        producer_id=1 << 33,
        producer_epoch=4,
        coordinator_epoch=9,
        base_offset=120,
        timestamp_ms=TS,
        partition_leader_epoch=3,
    )
    expected = hand_built_marker(
        commit, base_offset=120, leader_epoch=3, producer_id=1 << 33, epoch=4, coordinator_epoch=9
    )
    assert built == expected
    assert len(built) == 61 + 17
    header = check_batch(built)
    assert read_end_txn_marker(built, 0, header) == EndTransactionMarker(commit, 9)
    assert EndTransactionMarker(commit, 9).control_type is control_type


def test_a_marker_is_read_where_it_lies_in_a_buffer() -> None:
    data = build_batch([Record(b"v", timestamp_ms=TS)]) + build_control_batch(
        ControlRecordType.ABORT, producer_id=5, producer_epoch=0, coordinator_epoch=2, base_offset=1, timestamp_ms=TS
    )
    position = len(data) - 78
    assert read_end_txn_marker(data, position, check_batch(data, position)) == EndTransactionMarker(False, 2)


def test_an_emptied_control_batch_or_another_control_type_is_no_marker() -> None:
    empty = build_batch([], producer_id=5, producer_epoch=0, is_transactional=True, is_control=True,
                        last_offset_delta=0)  # fmt: skip
    assert read_end_txn_marker(empty, 0, check_batch(empty)) is None
    leader_change = build_batch(
        [Record(value=b"\x00\x00", key=struct.pack(">hh", 0, 2), timestamp_ms=TS)], is_control=True
    )
    assert read_end_txn_marker(leader_change, 0, check_batch(leader_change)) is None


def test_a_marker_value_too_short_is_corrupt() -> None:
    bad = build_batch(
        [Record(value=b"\x00\x00\x00", key=struct.pack(">hh", 0, 1), timestamp_ms=TS)],
        producer_id=5,
        producer_epoch=0,
        is_transactional=True,
        is_control=True,
    )
    with pytest.raises(CorruptRecordError, match="marker value"):
        read_end_txn_marker(bad, 0, check_batch(bad))
