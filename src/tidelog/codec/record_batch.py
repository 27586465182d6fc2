"""RecordBatch v2 (magic 2): the unit Kafka stores, sends and checksums.

Header, 61 bytes, big-endian (Kafka's DefaultRecordBatch):

    off size field                    off size field
      0   8  baseOffset                 27   8  baseTimestamp (deleteHorizonMs if attributes bit 6)
      8   4  batchLength = size - 12    35   8  maxTimestamp
     12   4  partitionLeaderEpoch       43   8  producerId
     16   1  magic = 2                  51   2  producerEpoch
     17   4  crc (CRC-32C of 21..end)   53   4  baseSequence
     21   2  attributes                 57   4  recordsCount
     23   4  lastOffsetDelta            61      records (compressed as one block when codec != none)

attributes: bits 0-2 codec, 3 LogAppendTime, 4 transactional, 5 control, 6 hasDeleteHorizonMs.
The CRC starts at attributes, so a broker rewrites baseOffset and partitionLeaderEpoch without
recomputing it. Each record inside is

    length varint | attributes int8 (0) | timestampDelta varlong | offsetDelta varint
    | keyLength varint | key | valueLength varint | value | headerCount varint
    | headers: keyLength varint, key (UTF-8), valueLength varint, value

with -1 as the length of a null key, value or header value.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from crc32c import crc32c

from tidelog.codec.compression import Compression, compress, decompress
from tidelog.codec.varint import decode_varint, decode_varlong, encode_varint, encode_varlong
from tidelog.errors import (
    CorruptRecordError,
    CrcMismatchError,
    InvalidRecordError,
    TruncatedBatchError,
    UnsupportedMagicError,
)

MAGIC_V2 = 2
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength, the prefix every message format shares
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
PARTITION_LEADER_EPOCH_OFFSET = 12
MAX_TIMESTAMP_OFFSET = 35
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40
KNOWN_ATTRIBUTE_BITS = 0x7F

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")


class TimestampType(IntEnum):
    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @property
    def kafka_name(self) -> str:
        """The spelling Kafka uses in configs and tool output."""
        return {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}[self.value]

    @classmethod
    def from_name(cls, name: str) -> TimestampType:
        for member in cls:
            if member.kafka_name == name:
                return member
        raise ValueError(f"unknown timestamp type {name!r} (expected CreateTime or LogAppendTime)")


@dataclass(slots=True)
class Record:
    """One record as a producer hands it in or a consumer gets it back.

    `timestamp_ms=None` on produce means "now". `offset` is -1 until the log assigns one.
    Header keys are text; a header key that is not valid UTF-8 round-trips through surrogate escapes.
    """

    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    offset: int = -1


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> Compression:
        return Compression.from_id(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.attributes & DELETE_HORIZON_MASK else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF  # wraps past Int.MAX to 0


# --- reading -------------------------------------------------------------------------------------------------


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the 61-byte header at `pos`; check the magic and that the whole batch is in `buf`."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise TruncatedBatchError(f"record batch header needs {HEADER_SIZE} bytes, only {available} left at byte {pos}")
    header = BatchHeader._make(HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC_V2:
        raise UnsupportedMagicError(f"batch at byte {pos} has magic {header.magic}, expected {MAGIC_V2}")
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch at byte {pos} declares batchLength {header.batch_length}, below the minimum {MIN_BATCH_LENGTH}"
        )
    if header.size_in_bytes > available:
        raise TruncatedBatchError(
            f"batch at byte {pos} declares {header.size_in_bytes} bytes but only {available} are present"
        )
    return header


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """CRC-32C of the batch at `pos` from its attributes to its end."""
    return crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size])


def check_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """read_header plus the CRC: the test Kafka's ensureValid() applies to every stored batch."""
    header = read_header(buf, pos)
    check_crc(header, compute_crc(buf, pos, header.size_in_bytes), pos)
    check_header_fields(header, pos)
    return header


def check_crc(header: BatchHeader, actual: int, pos: int) -> None:
    if actual != header.crc:
        raise CrcMismatchError(
            f"batch at byte {pos} (baseOffset {header.base_offset}) has CRC {header.crc:#010x} "
            f"but its bytes hash to {actual:#010x}"
        )


def check_header_fields(header: BatchHeader, pos: int) -> None:
    """The checks of check_batch that do not need the CRC: count, attribute bits, codec."""
    if header.records_count < 0:
        raise CorruptRecordError(f"batch at byte {pos} declares a negative record count {header.records_count}")
    if header.attributes & ~KNOWN_ATTRIBUTE_BITS:
        raise CorruptRecordError(f"batch at byte {pos} sets unknown attribute bits {header.attributes:#06x}")
    Compression.from_id(header.attributes & COMPRESSION_MASK)  # raises for codec ids 5-7


def check_producer_batch(header: BatchHeader) -> None:
    """Rules Kafka's LogValidator applies to a batch that comes from a client (not from the log itself)."""
    if header.records_count <= 0:
        raise InvalidRecordError(f"batch declares {header.records_count} records; a produced batch needs at least one")
    if header.last_offset_delta != header.records_count - 1:
        raise InvalidRecordError(
            f"inconsistent batch offset range: lastOffsetDelta {header.last_offset_delta} "
            f"for {header.records_count} records"
        )
    if header.is_control:
        raise InvalidRecordError("clients may not produce control batches")
    if header.attributes & DELETE_HORIZON_MASK:
        raise InvalidRecordError("clients may not produce batches with a delete horizon")


def records_section(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bytes:
    """The records of a batch, decompressed: `records_count` records back to back."""
    raw = memoryview(buf)[pos + HEADER_SIZE : pos + header.size_in_bytes]
    return decompress(header.compression, raw)


def decode_records(
    buf: bytes | bytearray | memoryview, pos: int = 0, header: BatchHeader | None = None
) -> list[Record]:
    """Every record of the v2 batch at `pos`, with absolute offsets and timestamps."""
    if header is None:
        header = read_header(buf, pos)
    if header.records_count <= 0:  # an empty batch (left by compaction) has nothing to decompress
        return []
    data = records_section(buf, pos, header)
    log_append_time = header.max_timestamp if header.timestamp_type is TimestampType.LOG_APPEND_TIME else None
    try:
        return _parse_records(data, header, log_append_time)
    except (IndexError, struct.error) as exc:
        raise TruncatedBatchError(f"batch at byte {pos}: a record runs past the end of the records section") from exc


def _parse_records(data: bytes, header: BatchHeader, log_append_time: int | None) -> list[Record]:
    # The hot loop of every consumer: one-byte varints (most lengths, deltas and counts) are decoded inline,
    # longer ones by decode_varint/decode_varlong. IndexError at the end of `data` is turned into
    # TruncatedBatchError by the caller.
    records: list[Record] = []
    append = records.append
    varint = decode_varint
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    end = len(data)
    pos = 0
    for index in range(header.records_count):
        b = data[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            length, pos = varint(data, pos)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise CorruptRecordError(f"record {index} declares length {length}, which does not fit the batch")
        b = data[pos + 1]  # after the unused attributes byte
        if b < 0x80:
            timestamp_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            timestamp_delta, pos = decode_varlong(data, pos + 1)
        b = data[pos]
        if b < 0x80:
            offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            offset_delta, pos = varint(data, pos)
        b = data[pos]
        if b < 0x80:
            key_length, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            key_length, pos = varint(data, pos)
        if key_length < 0:
            key = None
        else:
            key = data[pos : pos + key_length]
            pos += key_length
        b = data[pos]
        if b < 0x80:
            value_length, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            value_length, pos = varint(data, pos)
        if value_length < 0:
            value = None
        else:
            value = data[pos : pos + value_length]
            pos += value_length
        if data[pos] == 0:  # no headers: the common case
            headers: list[tuple[str, bytes | None]] = []
            pos += 1
        else:
            headers, pos = _parse_headers(data, pos, index)
        if pos != record_end:
            raise CorruptRecordError(
                f"record {index} declares {length} bytes but its fields take {length + pos - record_end}"
            )
        timestamp = log_append_time if log_append_time is not None else base_timestamp + timestamp_delta
        append(Record(value, key, timestamp, headers, base_offset + offset_delta))
    if pos != end:
        raise CorruptRecordError(
            f"incorrect declared batch size: {end - pos} bytes left after {header.records_count} records"
        )
    return records


def _parse_headers(data: bytes, pos: int, index: int) -> tuple[list[tuple[str, bytes | None]], int]:
    header_count, pos = decode_varint(data, pos)
    if header_count < 0:
        raise CorruptRecordError(f"record {index} declares a negative header count {header_count}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(header_count):
        header_key_length, pos = decode_varint(data, pos)
        if header_key_length < 0:
            raise CorruptRecordError(f"record {index} has a header with a null key")
        header_key = data[pos : pos + header_key_length].decode("utf-8", "surrogateescape")
        pos += header_key_length
        header_value_length, pos = decode_varint(data, pos)
        if header_value_length < 0:
            header_value = None
        else:
            header_value = data[pos : pos + header_value_length]
            pos += header_value_length
        headers.append((header_key, header_value))
    return headers, pos


# --- writing -------------------------------------------------------------------------------------------------


def encode_record(offset_delta: int, timestamp_delta: int, record: Record) -> bytes:
    key, value = record.key, record.value
    parts = [b"\x00", encode_varlong(timestamp_delta), encode_varint(offset_delta)]
    if key is None:
        parts.append(b"\x01")
    else:
        parts.append(encode_varint(len(key)))
        parts.append(key)
    if value is None:
        parts.append(b"\x01")
    else:
        parts.append(encode_varint(len(value)))
        parts.append(value)
    parts.append(encode_varint(len(record.headers)))
    for header_key, header_value in record.headers:
        encoded_key = header_key.encode("utf-8", "surrogateescape")
        parts.append(encode_varint(len(encoded_key)))
        parts.append(encoded_key)
        if header_value is None:
            parts.append(b"\x01")
        else:
            parts.append(encode_varint(len(header_value)))
            parts.append(header_value)
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    is_transactional: bool = False,
    is_control: bool = False,
    delete_horizon_ms: int | None = None,
    offset_deltas: Iterable[int] | None = None,
    last_offset_delta: int | None = None,
    now_ms: int | None = None,
) -> bytes:
    """Encode `records` as one v2 batch. Records without a timestamp get `now_ms` (default: the clock).

    `offset_deltas` lets a rewriter (compaction) keep gaps; otherwise record i gets delta i.
    An empty batch needs an explicit `last_offset_delta` (the range it stands for).
    """
    if now_ms is None:  # the clock only if some record needs it (NO_TIMESTAMP goes unused otherwise)
        now_ms = int(time.time() * 1000) if any(r.timestamp_ms is None for r in records) else NO_TIMESTAMP
    timestamps = [now_ms if r.timestamp_ms is None else r.timestamp_ms for r in records]
    deltas = list(range(len(records))) if offset_deltas is None else list(offset_deltas)
    if len(deltas) != len(records):
        raise ValueError(f"{len(deltas)} offset deltas for {len(records)} records")
    if records:
        first_timestamp = timestamps[0]
        max_timestamp = max(timestamps)
        if last_offset_delta is None:
            last_offset_delta = deltas[-1]
    else:
        if last_offset_delta is None:
            raise ValueError("an empty batch needs last_offset_delta")
        first_timestamp = max_timestamp = NO_TIMESTAMP
    base_timestamp = first_timestamp if delete_horizon_ms is None else delete_horizon_ms

    body = b"".join(
        encode_record(delta, ts - base_timestamp, record)
        for delta, ts, record in zip(deltas, timestamps, records, strict=True)
    )
    attributes = int(compression)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    if is_control:
        attributes |= CONTROL_MASK
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_MASK
    return assemble_batch(
        body,
        records_count=len(records),
        attributes=attributes,
        base_offset=base_offset,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
    )


def recompress_batch(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, codec: Compression, level: int | None = None
) -> bytes:
    """The v2 batch at `pos` with its records section compressed with `codec` instead (a broker's
    compression.type): the records' bytes, every header field and the producer's ids kept, the CRC recomputed."""
    records = records_section(buf, pos, header) if header.records_count > 0 else b""
    attributes = (header.attributes & ~COMPRESSION_MASK) | int(codec)
    return assemble_batch(
        records,
        records_count=header.records_count,
        attributes=attributes,
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
        level=level,
    )


def assemble_batch(
    records: bytes,
    *,
    records_count: int,
    attributes: int,
    base_offset: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    partition_leader_epoch: int,
    level: int | None = None,
) -> bytes:
    """A v2 batch around already encoded `records` (uncompressed, back to back): compressed with the codec of
    `attributes` (at `level`, None: the codec's default; an empty batch stays uncompressed, as Kafka writes it),
    header packed, CRC computed."""
    codec = Compression.from_id(attributes & COMPRESSION_MASK)
    body = compress(codec, records, level) if codec is not Compression.NONE and records_count else records
    header = bytearray(
        HEADER.pack(
            base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(body),
            partition_leader_epoch,
            MAGIC_V2,
            0,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            records_count,
        )
    )
    crc = crc32c(body, crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    _UINT32.pack_into(header, CRC_OFFSET, crc)
    return bytes(header) + body


# --- in-place rewrites a broker makes (outside or inside the CRC) --------------------------------------------


def set_base_offset(batch: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Assign offsets: baseOffset lies outside the CRC, so this needs no re-checksum."""
    _INT64.pack_into(batch, pos, base_offset)


def set_partition_leader_epoch(batch: bytearray | memoryview, pos: int, epoch: int) -> None:
    _INT32.pack_into(batch, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(batch: bytearray | memoryview, pos: int, size: int, timestamp_ms: int) -> None:
    """Stamp a batch with the broker's clock: timestamp-type bit and maxTimestamp lie inside the CRC."""
    (attributes,) = _INT16.unpack_from(batch, pos + ATTRIBUTES_OFFSET)
    _INT16.pack_into(batch, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(batch, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    _UINT32.pack_into(batch, pos + CRC_OFFSET, compute_crc(batch, pos, size))


def set_max_timestamp(batch: bytearray | memoryview, pos: int, size: int, timestamp_ms: int) -> None:
    """Correct a CreateTime batch's maxTimestamp to its records' largest timestamp (inside the CRC)."""
    _INT64.pack_into(batch, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    _UINT32.pack_into(batch, pos + CRC_OFFSET, compute_crc(batch, pos, size))


def peek_offset_and_length(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """(offset field, size field) of the entry at `pos`: the 12-byte prefix all message formats share."""
    return _OFFSET_AND_LENGTH.unpack_from(buf, pos)
