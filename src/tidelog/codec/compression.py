"""The four Kafka compression codecs, as the records section of a batch carries them.

Codec ids are the low three bits of a batch's attributes: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
What we write is what every Kafka client accepts (measured by pushing one batch recompressed by each library
through Produce and reading it back with librdkafka, kafka-python and aiokafka; Java's rules read from its source):
- gzip: a real RFC 1952 gzip member (not a bare zlib stream).
- snappy: raw snappy blocks, as librdkafka sends. Never snappy's "framing format" (all clients reject it).
  On read we also accept the xerial snappy-java stream Java producers send: the 16-byte header
  `82 'SNAPPY' 00`, version, compatible version, then `[int32 BE length][raw block]` repeated.
- lz4: an LZ4 frame with independent blocks (Java rejects linked blocks) and no content checksum.
  On read we also accept magic-0 messages whose frame header checksum was computed Kafka 0.8's broken way.
- zstd: a standard zstd frame; on read, frames without a content size too.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import cramjam

from tidelog.errors import CorruptRecordError, UnsupportedCompressionError


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def kafka_name(self) -> str:
        """The name Kafka prints and accepts in `compression.type`."""
        return self.name.lower()

    @classmethod
    def from_name(cls, name: str) -> Compression:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            names = ", ".join(c.kafka_name for c in cls)
            raise UnsupportedCompressionError(f"unknown compression type {name!r} (expected one of {names})") from None

    @classmethod
    def from_id(cls, codec_id: int) -> Compression:
        if 0 <= codec_id < len(_BY_ID):
            return _BY_ID[codec_id]
        raise UnsupportedCompressionError(f"unknown compression codec id {codec_id} in batch attributes")


_BY_ID = tuple(Compression)  # ids are 0..4 in order: a tuple lookup is ~30x cheaper than an enum call
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")
_LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"


def compress(codec: Compression, data: bytes | memoryview, level: int | None = None) -> bytes:
    """Compress a records section; `level` is the codec's level (None: gzip 6, lz4 1, zstd 3; snappy has none)."""
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        return bytes(cramjam.gzip.compress(data, level=6 if level is None or level < 0 else level))
    if codec is Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec is Compression.LZ4:
        compressor = cramjam.lz4.Compressor(level=level or 1, content_checksum=False, block_linked=False)
        compressor.compress(bytes(data))
        return bytes(compressor.finish())
    if codec is Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=3 if level is None else level))
    raise UnsupportedCompressionError(f"cannot compress with codec {codec!r}")


def decompress(codec: Compression, data: bytes | memoryview, *, legacy_lz4_checksum: bool = False) -> bytes:
    """Decompress a records section. Raises CorruptRecordError naming the codec when the bytes are bad."""
    try:
        if codec is Compression.NONE:
            return bytes(data)
        if codec is Compression.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec is Compression.SNAPPY:
            if bytes(data[:8]) == XERIAL_MAGIC:
                return _xerial_decompress(data)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec is Compression.LZ4:
            if legacy_lz4_checksum:
                data = _fix_broken_lz4_header_checksum(data)
            return bytes(cramjam.lz4.decompress(data))
        if codec is Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except CorruptRecordError:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError and ValueError variants
        raise CorruptRecordError(f"{codec.kafka_name} data does not decompress: {exc}") from exc
    raise UnsupportedCompressionError(f"cannot decompress codec {codec!r}")


def _xerial_decompress(data: bytes | memoryview) -> bytes:
    view = memoryview(data)
    if len(view) < _XERIAL_HEADER.size:
        raise CorruptRecordError("xerial snappy stream shorter than its 16-byte header")
    pos = _XERIAL_HEADER.size
    out = []
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecordError(f"xerial snappy block length truncated at byte {pos}")
        (length,) = _XERIAL_BLOCK_LENGTH.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > len(view):
            raise CorruptRecordError(f"xerial snappy block of {length} bytes at byte {pos} runs past the end")
        out.append(bytes(cramjam.snappy.decompress_raw(view[pos : pos + length])))
        pos += length
    return b"".join(out)


def xerial_compress(data: bytes | memoryview, block_size: int = 32 * 1024) -> bytes:
    """The xerial snappy-java stream format Java producers write (for tests and interop, never the hot path)."""
    view = memoryview(data)
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(view), block_size):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + block_size]))
        parts.append(_XERIAL_BLOCK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _fix_broken_lz4_header_checksum(data: bytes | memoryview) -> bytes:
    """Kafka 0.8-0.9 (magic 0) hashed magic+descriptor for the frame header checksum; rewrite it correctly."""
    raw = bytearray(data)
    if len(raw) < 7 or raw[:4] != _LZ4_FRAME_MAGIC:
        return bytes(raw)
    flags = raw[4]
    descriptor_end = 6 + (8 if flags & 0x08 else 0)  # FLG, BD, optional content size
    if len(raw) <= descriptor_end:
        return bytes(raw)
    raw[descriptor_end] = (xxh32_short(bytes(raw[4:descriptor_end])) >> 8) & 0xFF
    return bytes(raw)


def break_lz4_header_checksum(data: bytes) -> bytes:
    """An LZ4 frame with the header checksum Kafka 0.8-0.9 wrote and magic 0 readers expect (over magic+descriptor):
    what a magic 0 message set (Fetch v0-v1) carries, as Kafka writes it."""
    raw = bytearray(data)
    if len(raw) < 7 or raw[:4] != _LZ4_FRAME_MAGIC:
        return bytes(raw)
    descriptor_end = 6 + (8 if raw[4] & 0x08 else 0)
    if len(raw) <= descriptor_end:
        return bytes(raw)
    raw[descriptor_end] = (xxh32_short(bytes(raw[:descriptor_end])) >> 8) & 0xFF
    return bytes(raw)


_PRIME32_1, _PRIME32_2, _PRIME32_3 = 2654435761, 2246822519, 3266489917
_PRIME32_4, _PRIME32_5 = 668265263, 374761393
_MASK32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def xxh32_short(data: bytes, seed: int = 0) -> int:
    """xxHash32 of fewer than 16 bytes: all an LZ4 frame descriptor needs (no library exposes it)."""
    if len(data) >= 16:
        raise ValueError("xxh32_short hashes at most 15 bytes")
    h = (seed + _PRIME32_5 + len(data)) & _MASK32
    pos = 0
    while pos + 4 <= len(data):
        (lane,) = struct.unpack_from("<I", data, pos)
        h = (_rotl32((h + lane * _PRIME32_3) & _MASK32, 17) * _PRIME32_4) & _MASK32
        pos += 4
    for byte in data[pos:]:
        h = (_rotl32((h + byte * _PRIME32_5) & _MASK32, 11) * _PRIME32_1) & _MASK32
    h ^= h >> 15
    h = (h * _PRIME32_2) & _MASK32
    h ^= h >> 13
    h = (h * _PRIME32_3) & _MASK32
    h ^= h >> 16
    return h
