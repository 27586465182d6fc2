"""Zig-zag varints and varlongs exactly as Kafka's ByteUtils writes them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.codec.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_unsigned_varint,
    decode_varint,
    decode_varlong,
    encode_unsigned_varint,
    encode_varint,
    encode_varlong,
    unzigzag,
    zigzag,
)
from tidelog.errors import CorruptRecordError, TruncatedBatchError

int32s = st.integers(INT32_MIN, INT32_MAX)
int64s = st.integers(INT64_MIN, INT64_MAX)


def reference_unsigned(value: int) -> bytes:
    """Protobuf base-128, written independently of the module under test."""
    out = bytearray()
    while True:
        group, value = value & 0x7F, value >> 7
        if value:
            out.append(group | 0x80)
        else:
            out.append(group)
            return bytes(out)


def reference_varint(value: int) -> bytes:
    """Java: writeUnsignedVarint((v << 1) ^ (v >> 31)), on a 32-bit int."""
    return reference_unsigned(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def reference_varlong(value: int) -> bytes:
    return reference_unsigned(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


# value, varint encoding: the doc's examples, the table-cache edges (±8192) and the int32 extremes
KNOWN_VARINTS = [
    (0, "00"),
    (1, "02"),
    (-1, "01"),
    (8, "10"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (300, "d804"),
    (8191, "fe7f"),
    (-8192, "ff7f"),
    (8192, "808001"),
    (-8193, "818001"),
    (INT32_MAX, "feffffff0f"),
    (INT32_MIN, "ffffffff0f"),
]

KNOWN_VARLONGS = [
    *KNOWN_VARINTS,
    (1700000000000, "80a0abfef962"),
    (INT32_MAX + 1, "8080808010"),
    (INT64_MAX, "feffffffffffffffff01"),
    (INT64_MIN, "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "encoded"), KNOWN_VARINTS)
def test_known_varint_encodings(value: int, encoded: str) -> None:
    raw = bytes.fromhex(encoded)
    assert encode_varint(value) == raw
    assert decode_varint(raw, 0) == (value, len(raw))


@pytest.mark.parametrize(("value", "encoded"), KNOWN_VARLONGS)
def test_known_varlong_encodings(value: int, encoded: str) -> None:
    raw = bytes.fromhex(encoded)
    assert encode_varlong(value) == raw
    assert decode_varlong(raw, 0) == (value, len(raw))


def test_known_unsigned_encodings() -> None:
    assert encode_unsigned_varint(0) == b"\x00"
    assert encode_unsigned_varint(127) == b"\x7f"
    assert encode_unsigned_varint(128) == b"\x80\x01"
    assert encode_unsigned_varint(16384) == b"\x80\x80\x01"
    assert encode_unsigned_varint(0xFFFFFFFF) == b"\xff\xff\xff\xff\x0f"
    assert decode_unsigned_varint(b"\x80\x01", 0) == (128, 2)


def test_zigzag_maps_small_magnitudes_to_small_codes() -> None:
    assert [zigzag(v) for v in (0, -1, 1, -2, 2)] == [0, 1, 2, 3, 4]
    assert zigzag(INT64_MIN) == 2**64 - 1
    assert zigzag(INT64_MAX) == 2**64 - 2
    assert [unzigzag(z) for z in range(5)] == [0, -1, 1, -2, 2]


@settings(max_examples=300)
@given(int32s)
def test_varint_matches_reference_and_round_trips(value: int) -> None:
    encoded = encode_varint(value)
    assert encoded == reference_varint(value)
    assert 1 <= len(encoded) <= 5
    assert decode_varint(encoded, 0) == (value, len(encoded))


@settings(max_examples=300)
@given(int64s)
def test_varlong_matches_reference_and_round_trips(value: int) -> None:
    encoded = encode_varlong(value)
    assert encoded == reference_varlong(value)
    assert 1 <= len(encoded) <= 10
    assert decode_varlong(encoded, 0) == (value, len(encoded))


@settings(max_examples=200)
@given(st.integers(0, 2**64 - 1))
def test_unsigned_round_trips(value: int) -> None:
    encoded = encode_unsigned_varint(value)
    assert encoded == reference_unsigned(value)
    assert decode_unsigned_varint(encoded, 0, max_bytes=10) == (value, len(encoded))
    if value < 2**35:
        assert decode_unsigned_varint(encoded, 0) == (value, len(encoded))


@settings(max_examples=200)
@given(st.lists(int64s, min_size=1, max_size=20), st.binary(max_size=8), st.binary(max_size=8))
def test_decoding_a_sequence_at_positions(values: list[int], prefix: bytes, suffix: bytes) -> None:
    """Values back to back, after unrelated bytes and followed by more: each decodes from its position."""
    buf = prefix + b"".join(encode_varlong(v) for v in values) + suffix
    pos = len(prefix)
    for value in values:
        decoded, pos = decode_varlong(buf, pos)
        assert decoded == value
    assert pos == len(buf) - len(suffix)


@pytest.mark.parametrize("container", [bytes, bytearray, memoryview])
def test_decoders_accept_every_buffer_type(container: type) -> None:
    buf = container(b"\x00" + encode_varint(-300) + encode_varlong(2**40))
    value, pos = decode_varint(buf, 1)
    assert value == -300
    assert decode_varlong(buf, pos) == (2**40, len(buf))


def test_non_minimal_encodings_decode() -> None:
    """Kafka's reader accepts redundant continuation groups; so do we (within the byte limit)."""
    assert decode_varint(b"\x82\x00", 0) == (1, 2)
    assert decode_varint(b"\x80\x80\x80\x80\x00", 0) == (0, 5)
    assert decode_varlong(b"\x81" + b"\x80" * 8 + b"\x00", 0) == (-1, 10)


@pytest.mark.parametrize(
    ("encoder", "value"),
    [
        (encode_varint, INT32_MAX + 1),
        (encode_varint, INT32_MIN - 1),
        (encode_varlong, INT64_MAX + 1),
        (encode_varlong, INT64_MIN - 1),
        (encode_unsigned_varint, -1),
    ],
)
def test_out_of_range_values_are_refused(encoder, value: int) -> None:
    with pytest.raises(ValueError):
        encoder(value)


# --- truncated and overlong input: TruncatedBatchError, never IndexError --------------------------------------


@settings(max_examples=200)
@given(int32s, st.data())
def test_every_truncated_varint_raises(value: int, data: st.DataObject) -> None:
    encoded = encode_varint(value)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(TruncatedBatchError):
        decode_varint(encoded[:cut], 0)


@settings(max_examples=200)
@given(int64s, st.data())
def test_every_truncated_varlong_raises(value: int, data: st.DataObject) -> None:
    encoded = encode_varlong(value)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(TruncatedBatchError):
        decode_varlong(b"\x05" + encoded[:cut], 1)


@pytest.mark.parametrize("decoder", [decode_varint, decode_varlong, decode_unsigned_varint])
@pytest.mark.parametrize("buf", [b"", b"\x05", b"\x01\x02"])
def test_decoding_at_or_past_the_end_raises(decoder, buf: bytes) -> None:
    with pytest.raises(TruncatedBatchError):
        decoder(buf, len(buf))
    with pytest.raises(TruncatedBatchError):
        decoder(buf, len(buf) + 3)


@pytest.mark.parametrize("decoder", [decode_varint, decode_varlong, decode_unsigned_varint])
@pytest.mark.parametrize(("buf", "pos"), [(b"\x80", 0), (b"\xff\xff", 0), (b"\x01\x02\x80", 2), (b"\x01\x81\x80", 1)])
def test_buffer_ending_inside_a_varint_raises(decoder, buf: bytes, pos: int) -> None:
    with pytest.raises(TruncatedBatchError):
        decoder(buf, pos)


@pytest.mark.parametrize(
    ("decoder", "buf"),
    [
        (decode_varint, b"\x80" * 5 + b"\x00"),  # 6 bytes: one more than an int32 can need
        (decode_varint, b"\xff" * 5 + b"\x01"),
        (decode_varint, b"\xff" * 64),
        (decode_varlong, b"\x80" * 10 + b"\x00"),  # 11 bytes
        (decode_varlong, b"\xff" * 64),
        (decode_unsigned_varint, b"\x80" * 5 + b"\x01"),
    ],
)
def test_overlong_input_raises_truncated(decoder, buf: bytes) -> None:
    with pytest.raises(TruncatedBatchError) as info:
        decoder(buf, 0)
    assert isinstance(info.value, CorruptRecordError)


@settings(max_examples=300)
@given(st.binary(max_size=16), st.integers(0, 20))
def test_arbitrary_bytes_decode_or_raise_truncated(buf: bytes, pos: int) -> None:
    for decoder, limit in ((decode_varint, 5), (decode_varlong, 10)):
        try:
            _value, end = decoder(buf, pos)
        except TruncatedBatchError:
            continue
        assert pos < end <= min(len(buf), pos + limit)
        assert buf[end - 1] < 0x80
        assert all(b >= 0x80 for b in buf[pos : end - 1])
