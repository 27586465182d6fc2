"""A record set: batches back to back, as they lie in a `.log` file or in a Fetch response.

Every message format starts with `offset i64 | size i32` and keeps its magic byte at offset 16, so a
reader peeks 17 bytes, then dispatches: magic 2 is a RecordBatch, magic 0/1 a legacy entry. Like
Kafka's FileLogInputStream, iteration stops quietly at a partial tail (fewer than 17 bytes, or fewer
than the declared size) - a fetch may end mid-batch, a crash may leave half a batch - and raises
CorruptRecordError for a size field that no message format allows. (Walking the chain of a `.log` file, and
recovery's checks of it, are batch_chain.py's.)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from tidelog.codec import legacy
from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    NO_PARTITION_LEADER_EPOCH,
    NO_TIMESTAMP,
    BatchHeader,
    Record,
    TimestampType,
    compute_crc,
    decode_records,
    peek_offset_and_length,
    read_header,
)
from tidelog.errors import CorruptRecordError, UnsupportedMagicError

HEADER_SIZE_UP_TO_MAGIC = MAGIC_OFFSET + 1  # 17
_INT64 = struct.Struct(">q")


@dataclass(slots=True)
class BatchInfo:
    """What a reader needs to know about one stored batch without decoding its records."""

    position: int
    size: int
    magic: int
    base_offset: int  # -1 for a compressed legacy wrapper (known only after decompression)
    last_offset: int
    count: int | None  # None for legacy entries (Kafka's countOrNull)
    max_timestamp: int
    timestamp_type: TimestampType
    compression: Compression
    crc: int
    partition_leader_epoch: int
    header: BatchHeader | legacy.LegacyMessage

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def is_control(self) -> bool:
        return isinstance(self.header, BatchHeader) and self.header.is_control


class BatchPeek(NamedTuple):
    size: int
    magic: int
    last_offset: int
    max_timestamp: int
    header: BatchHeader | None  # the whole v2 header; None for legacy entries

    @property
    def partition_leader_epoch(self) -> int:
        return self.header.partition_leader_epoch if self.header is not None else NO_PARTITION_LEADER_EPOCH


_LEGACY_TIMESTAMP_END = 26  # offset, size, crc, magic, attributes, timestamp (magic 1)


def peek_batch(buf: bytes | bytearray | memoryview, pos: int) -> BatchPeek | None:
    """Size, last offset and max timestamp from the header bytes alone (the batch body may be absent).

    None when `buf` holds too little of the header. Checks neither the CRC nor that the body is present.
    """
    remaining = len(buf) - pos
    if remaining >= HEADER_SIZE and buf[pos + MAGIC_OFFSET] == MAGIC_V2:  # the common case, in one unpack
        header = BatchHeader._make(HEADER.unpack_from(buf, pos))
        if header.batch_length >= legacy.RECORD_OVERHEAD_V0:
            last_offset = header.base_offset + header.last_offset_delta
            return BatchPeek(header.batch_length + LOG_OVERHEAD, MAGIC_V2, last_offset, header.max_timestamp, header)
    if remaining < HEADER_SIZE_UP_TO_MAGIC:
        return None
    offset, size = peek_offset_and_length(buf, pos)
    if size < legacy.RECORD_OVERHEAD_V0:
        raise CorruptRecordError(f"entry at byte {pos} declares size {size}, smaller than any message format allows")
    magic = buf[pos + MAGIC_OFFSET]
    if magic == MAGIC_V2:
        if remaining < HEADER_SIZE:
            return None
        header = BatchHeader._make(HEADER.unpack_from(buf, pos))
        return BatchPeek(size + LOG_OVERHEAD, magic, header.last_offset, header.max_timestamp, header)
    if magic == 1:
        if remaining < _LEGACY_TIMESTAMP_END:
            return None
        (timestamp,) = _INT64.unpack_from(buf, pos + _LEGACY_TIMESTAMP_END - 8)
        return BatchPeek(size + LOG_OVERHEAD, magic, offset, timestamp, None)
    if magic == 0:
        return BatchPeek(size + LOG_OVERHEAD, magic, offset, NO_TIMESTAMP, None)
    raise UnsupportedMagicError(f"entry at byte {pos} has unknown magic {magic}")


def read_batch_info(buf: bytes | bytearray | memoryview, pos: int) -> BatchInfo | None:
    """The batch at `pos`, or None when only a partial batch is left. Raises CorruptRecordError."""
    remaining = len(buf) - pos
    if remaining < HEADER_SIZE_UP_TO_MAGIC:
        return None
    offset, size = peek_offset_and_length(buf, pos)
    if size < legacy.RECORD_OVERHEAD_V0:
        raise CorruptRecordError(f"entry at byte {pos} declares size {size}, smaller than any message format allows")
    if remaining < size + LOG_OVERHEAD:
        return None
    magic = buf[pos + MAGIC_OFFSET]
    if magic == MAGIC_V2:
        if size < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at byte {pos} declares batchLength {size}, below the v2 minimum {MIN_BATCH_LENGTH}"
            )
        header = read_header(buf, pos)
        return BatchInfo(
            pos,
            header.size_in_bytes,
            MAGIC_V2,
            header.base_offset,
            header.last_offset,
            header.records_count,
            header.max_timestamp,
            header.timestamp_type,
            Compression.from_id(header.attributes & 0x07),
            header.crc,
            header.partition_leader_epoch,
            header,
        )
    if magic in (0, 1):
        message = legacy.read_legacy_message(buf, pos)
        compression = message.compression
        return BatchInfo(
            pos,
            message.size_in_bytes,
            magic,
            offset if compression is Compression.NONE else -1,
            offset,
            None,
            message.timestamp,
            message.timestamp_type,
            compression,
            message.crc,
            NO_PARTITION_LEADER_EPOCH,
            message,
        )
    raise UnsupportedMagicError(f"entry at byte {pos} has unknown magic {magic}")


def iter_batches(buf: bytes | bytearray | memoryview, start: int = 0) -> Iterator[BatchInfo]:
    pos = start
    while (info := read_batch_info(buf, pos)) is not None:
        yield info
        pos += info.size


def is_valid(buf: bytes | bytearray | memoryview, info: BatchInfo) -> bool:
    """Does the stored CRC match? (CRC-32C for v2, zlib CRC-32 for legacy.)"""
    if info.magic == MAGIC_V2:
        return compute_crc(buf, info.position, info.size) == info.crc
    assert isinstance(info.header, legacy.LegacyMessage)
    return legacy.legacy_crc(buf, info.header) == info.crc


def decode_batch(buf: bytes | bytearray | memoryview, info: BatchInfo) -> list[Record]:
    if info.magic == MAGIC_V2:
        assert isinstance(info.header, BatchHeader)
        return decode_records(buf, info.position, info.header)
    return legacy.decode_legacy_records(buf, info.position)


def iter_records(
    buf: bytes | bytearray | memoryview, start: int = 0, *, min_offset: int = 0, include_control: bool = False
) -> Iterator[Record]:
    """Records of every complete batch in `buf` with offset >= min_offset; control records only on request."""
    for info in iter_batches(buf, start):
        if info.last_offset < min_offset or (info.is_control and not include_control):
            continue
        for record in decode_batch(buf, info):
            if record.offset >= min_offset:
                yield record
