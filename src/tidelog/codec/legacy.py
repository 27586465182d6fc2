"""Legacy message sets (magic 0 and 1), read-only: old segments still hold them, Kafka 4 no longer writes them.

Each entry, big-endian:

    offset i64 | size i32 | crc u32 | magic i8 | attributes i8 | [timestamp i64, magic 1 only]
    | keyLength i32 | key | valueLength i32 | value

`size` counts the bytes after it; the CRC is zlib's CRC-32 over magic..end. Attribute bits 0-2 are the
codec (none/gzip/snappy/lz4), bit 3 the timestamp type (magic 1). A compressed entry is a wrapper whose
value is a compressed inner message set. Magic 0 inner offsets are absolute; magic 1 inner offsets are
relative (0..n-1) and the wrapper carries the absolute offset of the last inner message.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from tidelog.codec.compression import Compression, decompress
from tidelog.codec.record_batch import LOG_OVERHEAD, NO_TIMESTAMP, Record, TimestampType
from tidelog.errors import CorruptRecordError, CrcMismatchError, TruncatedBatchError, UnsupportedMagicError

_PREFIX_V0 = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_TIMESTAMP = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
RECORD_OVERHEAD_V0 = 14  # crc + magic + attributes + key length + value length
RECORD_OVERHEAD_V1 = 22  # ... + timestamp
CRC_START = LOG_OVERHEAD + 4  # magic onwards


class LegacyMessage(NamedTuple):
    position: int
    offset: int
    size: int  # the size field: bytes after it
    crc: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None

    @property
    def size_in_bytes(self) -> int:
        return self.size + LOG_OVERHEAD

    @property
    def compression(self) -> Compression:
        codec = self.attributes & 0x07
        if codec > Compression.LZ4:
            raise CorruptRecordError(f"legacy message at byte {self.position} uses codec id {codec}")
        return Compression(codec)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.magic == 0:
            return TimestampType.NO_TIMESTAMP_TYPE
        return TimestampType.LOG_APPEND_TIME if self.attributes & 0x08 else TimestampType.CREATE_TIME


def read_legacy_message(buf: bytes | bytearray | memoryview, pos: int = 0) -> LegacyMessage:
    available = len(buf) - pos
    if available < LOG_OVERHEAD + RECORD_OVERHEAD_V0:
        raise TruncatedBatchError(f"legacy message at byte {pos} needs at least 26 bytes, {available} left")
    offset, size, crc, magic, attributes = _PREFIX_V0.unpack_from(buf, pos)
    if magic not in (0, 1):
        raise UnsupportedMagicError(f"message at byte {pos} has magic {magic}, expected 0 or 1")
    overhead = RECORD_OVERHEAD_V0 if magic == 0 else RECORD_OVERHEAD_V1
    if size < overhead:
        raise CorruptRecordError(f"legacy message at byte {pos} declares size {size}, below the minimum {overhead}")
    if size + LOG_OVERHEAD > available:
        raise TruncatedBatchError(
            f"legacy message at byte {pos} declares {size + LOG_OVERHEAD} bytes, {available} left"
        )
    end = pos + LOG_OVERHEAD + size
    cursor = pos + _PREFIX_V0.size
    timestamp = NO_TIMESTAMP
    if magic == 1:
        (timestamp,) = _TIMESTAMP.unpack_from(buf, cursor)
        cursor += 8
    key, cursor = _read_bytes(buf, cursor, end, pos, "key")
    value, cursor = _read_bytes(buf, cursor, end, pos, "value")
    if cursor != end:
        raise CorruptRecordError(f"legacy message at byte {pos} has {end - cursor} bytes beyond its value")
    return LegacyMessage(pos, offset, size, crc, magic, attributes, timestamp, key, value)


def _read_bytes(
    buf: bytes | bytearray | memoryview, cursor: int, end: int, pos: int, what: str
) -> tuple[bytes | None, int]:
    if cursor + 4 > end:
        raise CorruptRecordError(f"legacy message at byte {pos}: {what} length runs past the message end")
    (length,) = _LENGTH.unpack_from(buf, cursor)
    cursor += 4
    if length < 0:
        return None, cursor
    if cursor + length > end:
        raise CorruptRecordError(f"legacy message at byte {pos}: {what} of {length} bytes runs past the message end")
    return bytes(buf[cursor : cursor + length]), cursor + length


def legacy_crc(buf: bytes | bytearray | memoryview, message: LegacyMessage) -> int:
    return zlib.crc32(memoryview(buf)[message.position + CRC_START : message.position + message.size_in_bytes])


def check_legacy_message(buf: bytes | bytearray | memoryview, pos: int = 0) -> LegacyMessage:
    message = read_legacy_message(buf, pos)
    actual = legacy_crc(buf, message)
    if actual != message.crc:
        raise CrcMismatchError(
            f"legacy message at byte {pos} (offset {message.offset}) has CRC {message.crc} "
            f"but its bytes hash to {actual}"
        )
    return message


def decompress_wrapper(wrapper: LegacyMessage) -> bytes:
    """The inner message set of a compressed wrapper."""
    if wrapper.value is None:
        raise CorruptRecordError(f"compressed legacy message at byte {wrapper.position} has a null value")
    return decompress(wrapper.compression, wrapper.value, legacy_lz4_checksum=wrapper.magic == 0)


def inner_messages(wrapper: LegacyMessage, data: bytes | None = None) -> list[LegacyMessage]:
    """The messages inside a compressed wrapper, with absolute offsets; positions index into `data`,
    the decompressed inner set (decompressed here when not given)."""
    if data is None:
        data = decompress_wrapper(wrapper)
    inner: list[LegacyMessage] = []
    pos = 0
    while pos < len(data):
        message = read_legacy_message(data, pos)
        if message.compression is not Compression.NONE:
            raise CorruptRecordError(
                f"compressed legacy message at byte {wrapper.position} nests another compressed one"
            )
        inner.append(message)
        pos += message.size_in_bytes
    if wrapper.magic == 1 and inner:
        absolute_base = wrapper.offset - inner[-1].offset
        if absolute_base >= 0:  # a producer's wrapper (offset 0, before a broker assigned one) keeps inner offsets
            inner = [m._replace(offset=absolute_base + m.offset) for m in inner]
    return inner


def decode_legacy_records(buf: bytes | bytearray | memoryview, pos: int = 0) -> list[Record]:
    """The records of the (possibly compressed) legacy entry at `pos`."""
    message = read_legacy_message(buf, pos)
    if message.compression is Compression.NONE:
        return [Record(message.value, message.key, message.timestamp, (), message.offset)]
    log_append_time = message.timestamp_type is TimestampType.LOG_APPEND_TIME
    return [
        Record(m.value, m.key, message.timestamp if log_append_time else m.timestamp, (), m.offset)
        for m in inner_messages(message)
    ]
