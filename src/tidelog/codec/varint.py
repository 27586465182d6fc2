"""Variable-length integers as Kafka's ByteUtils writes them.

Unsigned: 7 bits per byte, least significant group first, high bit set on every byte but the last
(Protobuf base-128). Signed ("varint", "varlong"): zig-zag first, `(v << 1) ^ (v >> 63)`, so small
magnitudes of either sign stay short: 0 -> 00, -1 -> 01, 1 -> 02. A varint holds an int32 in at most
5 bytes, a varlong an int64 in at most 10. Record batches use the signed forms for every length and
count; the protocol's compact types (KIP-482) use the unsigned form.
"""

from __future__ import annotations

from tidelog.errors import TruncatedBatchError

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def encode_unsigned_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"unsigned varint cannot hold {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


# Most lengths, deltas and counts in a batch are small: encode them by table lookup.
_CACHE_LIMIT = 1 << 13
_SMALL = [encode_unsigned_varint(zigzag(v)) for v in range(-_CACHE_LIMIT, _CACHE_LIMIT)]


def encode_varint(value: int) -> bytes:
    """Signed 32-bit zig-zag varint."""
    if -_CACHE_LIMIT <= value < _CACHE_LIMIT:
        return _SMALL[value + _CACHE_LIMIT]
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint out of int32 range: {value}")
    return encode_unsigned_varint(zigzag(value))


def encode_varlong(value: int) -> bytes:
    """Signed 64-bit zig-zag varlong."""
    if -_CACHE_LIMIT <= value < _CACHE_LIMIT:
        return _SMALL[value + _CACHE_LIMIT]
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong out of int64 range: {value}")
    return encode_unsigned_varint(zigzag(value))


def decode_unsigned_varint(buf: bytes | bytearray | memoryview, pos: int, max_bytes: int = 5) -> tuple[int, int]:
    """Return (value, position after it). Raises TruncatedBatchError on a short buffer or overlong value."""
    result = 0
    shift = 0
    end = len(buf)
    for _ in range(max_bytes):
        if pos >= end:
            raise TruncatedBatchError(f"varint runs past the end of the buffer at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise TruncatedBatchError(f"varint longer than {max_bytes} bytes ending at byte {pos}")


def decode_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    value, pos = decode_unsigned_varint(buf, pos, 5)
    return unzigzag(value), pos


def decode_varlong(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    value, pos = decode_unsigned_varint(buf, pos, 10)
    return unzigzag(value), pos
