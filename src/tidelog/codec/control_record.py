"""Control records, and the end-transaction marker a transaction coordinator writes (Kafka's ControlRecordType,
EndTransactionMarker and MemoryRecords.withEndTransactionMarker).

A control batch is a RecordBatch v2 with the control (0x20) attribute bit; it holds one control record, which
consumers never see. Its key names the control type, big-endian:

    version i16 = 0 | type i16      ABORT = 0, COMMIT = 1 (2-6: KRaft's own records)

and an end-transaction marker (ABORT or COMMIT) has the value

    version i16 = 0 | coordinatorEpoch i32

The marker batch is built as Kafka builds it: magic 2, uncompressed, CreateTime, attributes control +
transactional (0x30), the producer's id and epoch, baseSequence -1, the one record at offset and timestamp delta 0
with no headers, the batch's timestamps the record's, CRC-32C. Keys or values shorter than their fields are a
CorruptRecordError (Kafka's InvalidRecordException); later versions' extra bytes are ignored, as Kafka reads them.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from tidelog.codec.record_batch import (
    NO_PARTITION_LEADER_EPOCH,
    BatchHeader,
    Record,
    build_batch,
    decode_records,
)
from tidelog.errors import CorruptRecordError

_KEY = struct.Struct(">hh")  # version, type
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0


class ControlRecordType(IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


class EndTransactionMarker(NamedTuple):
    commit: bool
    coordinator_epoch: int

    @property
    def control_type(self) -> ControlRecordType:
        return ControlRecordType.COMMIT if self.commit else ControlRecordType.ABORT


def parse_control_record(record: Record) -> tuple[ControlRecordType | int, int | None]:
    """(type, coordinator epoch) of a control record; the epoch only for COMMIT/ABORT markers. An unknown type is
    returned as its number."""
    key = record.key or b""
    if len(key) < _KEY.size:
        raise CorruptRecordError(f"control record key has {len(key)} bytes, expected {_KEY.size}")
    _version, type_id = _KEY.unpack_from(key)
    try:
        control_type: ControlRecordType | int = ControlRecordType(type_id)
    except ValueError:
        control_type = type_id
    epoch = None
    if control_type in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        value = record.value or b""
        if len(value) < _MARKER_VALUE.size:
            raise CorruptRecordError(f"transaction marker value has {len(value)} bytes, expected {_MARKER_VALUE.size}")
        _marker_version, epoch = _MARKER_VALUE.unpack_from(value)
    return control_type, epoch


def read_end_txn_marker(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> EndTransactionMarker | None:
    """The marker of the control batch at `pos` (Kafka's EndTransactionMarker.deserialize of its first record);
    None for an empty control batch (the cleaner emptied it) or a control record that is no marker."""
    records = decode_records(buf, pos, header)
    if not records:
        return None
    control_type, epoch = parse_control_record(records[0])
    if epoch is None:
        return None
    return EndTransactionMarker(control_type is ControlRecordType.COMMIT, epoch)


def build_control_batch(
    control_type: ControlRecordType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """An end-transaction marker batch as MemoryRecords.withEndTransactionMarker builds it (see the module's
    docstring); `timestamp_ms` None: now."""
    key = _KEY.pack(CONTROL_KEY_VERSION, int(control_type))
    value = _MARKER_VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch)
    return build_batch(
        [Record(value=value, key=key, timestamp_ms=timestamp_ms)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=True,
        is_control=True,
    )
