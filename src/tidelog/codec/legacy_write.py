"""Legacy message sets (magic 0 and 1), written: the conversions Produce v0-v2 and Fetch v0-v3 need.

The entry format is codec/legacy.py's:

    offset i64 | size i32 | crc u32 | magic i8 | attributes i8 | [timestamp i64, magic 1 only]
    | keyLength i32 | key | valueLength i32 | value

`crc` is zlib's CRC-32 of magic..end; attribute bits 0-2 name the codec, bit 3 (magic 1) says LOG_APPEND_TIME.

Up-conversion (`upconvert`, Kafka's LogValidator on append): every record of an old producer's message set goes into
one v2 batch, compressed with the codec its wrappers used (none if it had none); offsets are the broker's to assign
(the batch counts from 0), a magic 0 record has no timestamp (NO_TIMESTAMP, -1), a magic 1 record keeps its own, or
its wrapper's when the wrapper says LOG_APPEND_TIME. Headers do not exist before v2.

Down-conversion (`downconvert`, Kafka's LazyDownConversionRecords for Fetch v0-v3), per stored v2 batch: an
uncompressed batch becomes one message per record, a compressed one a single wrapper of the same codec around its
records (snappy in xerial framing, as Kafka's Java codec writes it; magic 0 LZ4 with the frame header checksum
Kafka 0.8-0.9 computed wrongly, which magic 0 readers expect). Offsets stay absolute; inside a magic 1
wrapper the inner offsets are relative (0..n-1) and the wrapper carries the absolute offset of its last record, in
magic 0 every offset is absolute. Magic 1 keeps each record's timestamp (a wrapper carries the batch's max
timestamp and its timestamp type); magic 0 has none. Headers are dropped and control batches (transaction markers)
skipped, as Kafka does; a partial batch at the end of a read is left out (a client would skip it too).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from tidelog.codec.compression import Compression, break_lz4_header_checksum, compress, xerial_compress
from tidelog.codec.legacy import check_legacy_message, decode_legacy_records
from tidelog.codec.record_batch import (
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    Record,
    TimestampType,
    build_batch,
    decode_records,
    read_header,
)

_MAGIC_ATTRIBUTES = struct.Struct(">bb")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OFFSET_SIZE = struct.Struct(">qi")
LOG_APPEND_TIME_FLAG = 0x08


def upconvert(message_set: bytes | memoryview) -> bytes:
    """The v2 batch holding every record of a legacy message set (`message_set` is what a Produce v0-v2 carries).
    Raises CorruptRecordError (a bad CRC, size or codec), as Kafka answers CORRUPT_MESSAGE."""
    records: list[Record] = []
    codec = Compression.NONE
    pos = 0
    while pos < len(message_set):
        entry = check_legacy_message(message_set, pos)
        if entry.compression is not Compression.NONE:
            codec = entry.compression
        for record in decode_legacy_records(message_set, pos):
            records.append(Record(record.value, record.key, record.timestamp_ms, (), -1))
        pos += entry.size_in_bytes
    return build_batch(records, compression=codec, now_ms=NO_TIMESTAMP)


def downconvert(batches: bytes | memoryview, magic: int) -> bytes:
    """The stored v2 batches in `batches` (whole batches, as a fetch reads them) as a magic 0 or 1 message set."""
    out = bytearray()
    pos = 0
    while pos + LOG_OVERHEAD <= len(batches):
        header = read_header(batches, pos)
        if pos + header.size_in_bytes > len(batches):
            break  # a partial batch at the end of a read: clients skip it, so it is not converted
        if not header.is_control:
            records = decode_records(batches, pos, header)
            if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
                records = [Record(r.value, r.key, header.max_timestamp, (), r.offset) for r in records]
            if header.compression is Compression.NONE:
                for record in records:
                    out += _message(record.offset, magic, 0, record)
            elif records:
                out += _wrapper(records, magic, header.compression, header.timestamp_type, header.max_timestamp)
        pos += header.size_in_bytes
    return bytes(out)


def _wrapper(
    records: Sequence[Record], magic: int, codec: Compression, timestamp_type: TimestampType, max_timestamp: int
) -> bytes:
    inner = bytearray()
    for index, record in enumerate(records):
        inner += _message(index if magic == 1 else record.offset, magic, 0, record)
    raw = bytes(inner)
    payload = xerial_compress(raw) if codec is Compression.SNAPPY else compress(codec, raw)
    if magic == 0 and codec is Compression.LZ4:
        payload = break_lz4_header_checksum(payload)
    attributes = int(codec)
    if magic == 1 and timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= LOG_APPEND_TIME_FLAG
    wrapper = Record(payload, None, max_timestamp, (), records[-1].offset)
    return _message(records[-1].offset, magic, attributes, wrapper)


def _message(offset: int, magic: int, attributes: int, record: Record) -> bytes:
    body = bytearray(_MAGIC_ATTRIBUTES.pack(magic, attributes))
    if magic == 1:
        body += _I64.pack(NO_TIMESTAMP if record.timestamp_ms is None else record.timestamp_ms)
    for part in (record.key, record.value):
        if part is None:
            body += _I32.pack(-1)
        else:
            body += _I32.pack(len(part)) + part
    crc = zlib.crc32(body)
    return _OFFSET_SIZE.pack(offset, 4 + len(body)) + struct.pack(">I", crc) + body
