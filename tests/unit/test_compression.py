"""The five codecs as a batch's records section carries them, in the forms every Kafka client accepts."""

from __future__ import annotations

import gzip
import random
import struct

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.codec.compression import (
    XERIAL_MAGIC,
    Compression,
    compress,
    decompress,
    xerial_compress,
    xxh32_short,
)
from tidelog.codec.varint import decode_unsigned_varint
from tidelog.errors import CorruptRecordError, TidelogError, UnsupportedCompressionError

ALL_CODECS = list(Compression)
REAL_CODECS = [c for c in Compression if c is not Compression.NONE]
LZ4_MAGIC = b"\x04\x22\x4d\x18"
SNAPPY_FRAMING_MAGIC = b"\xff\x06\x00\x00sNaPpY"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def sample(size: int, seed: int) -> bytes:
    """Half random, half repetitive: compresses a little, so codecs emit real (non-stored) blocks."""
    rnd = random.Random(seed)
    noise = rnd.randbytes(size // 2)
    pattern = rnd.randbytes(rnd.randint(1, 64)) or b"x"
    return (noise + pattern * (size // len(pattern) + 1))[:size]


small_payloads = st.binary(max_size=3000)
# Sizes around and well past the 64 KiB lz4 block and the 32 KiB xerial block.
large_payloads = st.builds(sample, st.integers(32 * 1024 - 2, 300_000), st.integers(0, 2**32))
payloads = st.one_of(small_payloads, small_payloads, large_payloads)


# --- round trips ---------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ALL_CODECS), payloads)
def test_round_trip(codec: Compression, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", ALL_CODECS)
@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 3 * 65536 + 17])
def test_round_trip_at_block_edges(codec: Compression, size: int) -> None:
    data = sample(size, size)
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("container", [bytearray, memoryview])
@pytest.mark.parametrize("codec", ALL_CODECS)
def test_compress_accepts_buffers(codec: Compression, container: type) -> None:
    data = sample(5000, 1)
    packed = compress(codec, container(data))
    assert isinstance(packed, bytes)
    assert decompress(codec, packed) == data


@pytest.mark.parametrize("container", [bytearray, memoryview])
@pytest.mark.parametrize("codec", ALL_CODECS)
def test_decompress_accepts_buffers(codec: Compression, container: type) -> None:
    data = sample(5000, 2)
    out = decompress(codec, container(compress(codec, data)))
    assert isinstance(out, bytes)
    assert out == data


def test_none_is_the_identity() -> None:
    assert compress(Compression.NONE, b"abc") == b"abc"
    assert decompress(Compression.NONE, memoryview(b"abc")) == b"abc"


# --- what each codec writes ----------------------------------------------------------------------------------


def lz4_frame_blocks(frame: bytes) -> tuple[int, int, list[tuple[bool, bytes]]]:
    """(FLG, BD, [(stored uncompressed?, block bytes)]) of an LZ4 frame, parsed by hand."""
    assert frame[:4] == LZ4_MAGIC
    flg, bd = frame[4], frame[5]
    pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0) + 1  # descriptor + HC
    blocks = []
    while True:
        (word,) = struct.unpack_from("<I", frame, pos)
        pos += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        blocks.append((bool(word & 0x80000000), frame[pos : pos + size]))
        pos += size + (4 if flg & 0x10 else 0)
    pos += 4 if flg & 0x04 else 0
    assert pos == len(frame), "bytes after the lz4 end mark"
    return flg, bd, blocks


@settings(max_examples=60, deadline=None)
@given(payloads)
def test_lz4_frame_flags_are_what_java_accepts(data: bytes) -> None:
    frame = compress(Compression.LZ4, data)
    flg, bd, blocks = lz4_frame_blocks(frame)
    assert flg >> 6 == 0b01, "frame version must be 01"
    assert flg & 0x20, "block-independence flag must be set (Java rejects linked blocks)"
    assert not flg & 0x04, "no content checksum"
    assert not flg & 0x01, "no dictionary id"
    assert not flg & 0x02, "reserved bit"
    assert not bd & 0x8F and 4 <= bd >> 4 <= 7, f"BD {bd:#04x}: Java accepts block sizes 64K-4M only"
    max_block = 1 << (8 + 2 * (bd >> 4))
    assert frame[6] == (xxh32_short(frame[4:6]) >> 8) & 0xFF, "header checksum over FLG|BD"
    assert len(blocks) >= -(-len(data) // max_block)
    assert sum(len(b) for stored, b in blocks if stored) <= len(data)


def test_large_lz4_input_is_split_into_independent_blocks() -> None:
    """> 64 KiB: several blocks, each of which decodes on its own (no back-references across blocks)."""
    lz4_block = pytest.importorskip("lz4.block")
    data = sample(300_000, 7)
    _flg, bd, blocks = lz4_frame_blocks(compress(Compression.LZ4, data))
    max_block = 1 << (8 + 2 * (bd >> 4))
    assert len(blocks) >= 2
    decoded = [b if stored else lz4_block.decompress(b, uncompressed_size=max_block) for stored, b in blocks]
    assert b"".join(decoded) == data


@settings(max_examples=60, deadline=None)
@given(payloads)
def test_snappy_output_is_raw_not_framed(data: bytes) -> None:
    packed = compress(Compression.SNAPPY, data)
    assert not packed.startswith(SNAPPY_FRAMING_MAGIC)
    assert not packed.startswith(XERIAL_MAGIC)
    # A raw snappy block starts with the uncompressed length as an unsigned varint.
    assert decode_unsigned_varint(packed, 0)[0] == len(data)
    assert bytes(cramjam.snappy.decompress_raw(packed)) == data


@settings(max_examples=60, deadline=None)
@given(payloads)
def test_gzip_output_is_a_real_gzip_member(data: bytes) -> None:
    packed = compress(Compression.GZIP, data)
    assert packed[:3] == b"\x1f\x8b\x08"  # gzip magic, deflate
    assert gzip.decompress(packed) == data  # stdlib, independent of cramjam


def test_gzip_from_the_stdlib_and_multi_member_streams_decode() -> None:
    assert decompress(Compression.GZIP, gzip.compress(b"hello " * 100, compresslevel=1)) == b"hello " * 100
    assert decompress(Compression.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"


def test_zstd_output_is_a_zstd_frame() -> None:
    assert compress(Compression.ZSTD, b"abc" * 100).startswith(ZSTD_MAGIC)


# --- xerial snappy (what Java producers send) ----------------------------------------------------------------


def hand_made_xerial(data: bytes, chunk: int) -> bytes:
    out = [XERIAL_MAGIC, struct.pack(">ii", 1, 1)]
    for start in range(0, len(data), chunk):
        block = bytes(cramjam.snappy.compress_raw(data[start : start + chunk]))
        out += [struct.pack(">i", len(block)), block]
    return b"".join(out)


@settings(max_examples=80, deadline=None)
@given(payloads, st.integers(1, 70_000))
def test_xerial_stream_decodes(data: bytes, chunk: int) -> None:
    chunk = max(chunk, len(data) // 300)  # at most ~300 blocks keeps this fast
    assert decompress(Compression.SNAPPY, hand_made_xerial(data, chunk)) == data


@settings(max_examples=40, deadline=None)
@given(payloads)
def test_xerial_compress_writes_the_java_header(data: bytes) -> None:
    packed = xerial_compress(data)
    assert packed[:16] == b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" * 2
    assert decompress(Compression.SNAPPY, packed) == data
    # blocks of at most 32 KiB of input each
    pos, blocks = 16, 0
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        block = packed[pos + 4 : pos + 4 + length]
        assert decode_unsigned_varint(block, 0)[0] <= 32 * 1024
        pos += 4 + length
        blocks += 1
    assert pos == len(packed)
    assert blocks == -(-len(data) // (32 * 1024))


def test_xerial_header_only_is_empty() -> None:
    assert decompress(Compression.SNAPPY, XERIAL_MAGIC + struct.pack(">ii", 1, 1)) == b""


@pytest.mark.parametrize(
    "stream",
    [
        XERIAL_MAGIC + b"\x00\x00\x00\x01",  # header cut short
        XERIAL_MAGIC + struct.pack(">ii", 1, 1) + b"\x00\x00",  # block length cut short
        XERIAL_MAGIC + struct.pack(">iii", 1, 1, 50) + b"\x00" * 10,  # block runs past the end
        XERIAL_MAGIC + struct.pack(">iii", 1, 1, -5) + b"\x00" * 10,  # negative block length
        XERIAL_MAGIC + struct.pack(">iii", 1, 1, 3) + b"\x7f\x00\x00",  # block is not snappy
    ],
)
def test_bad_xerial_stream_is_corrupt(stream: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="snappy"):
        decompress(Compression.SNAPPY, stream)


# --- lz4 with the magic-0 broken header checksum -------------------------------------------------------------


def with_broken_header_checksum(frame: bytes) -> bytes:
    """Kafka 0.8/0.9 hashed magic + descriptor instead of the descriptor alone."""
    descriptor_end = 6 + (8 if frame[4] & 0x08 else 0)
    broken = (xxh32_short(frame[:descriptor_end]) >> 8) & 0xFF
    return frame[:descriptor_end] + bytes([broken]) + frame[descriptor_end + 1 :]


@pytest.mark.parametrize("size", [0, 100, 70_000])
def test_broken_lz4_header_checksum_needs_the_legacy_flag(size: int) -> None:
    data = sample(size, size)
    frame = compress(Compression.LZ4, data)
    broken = with_broken_header_checksum(frame)
    assert broken != frame, "precondition: the broken checksum differs from the right one"
    with pytest.raises(CorruptRecordError, match="lz4"):
        decompress(Compression.LZ4, broken)
    assert decompress(Compression.LZ4, broken, legacy_lz4_checksum=True) == data
    # A correct frame still decodes with the flag on (magic-0 readers see both in the wild).
    assert decompress(Compression.LZ4, frame, legacy_lz4_checksum=True) == data


def test_legacy_flag_does_not_hide_other_damage() -> None:
    frame = bytearray(with_broken_header_checksum(compress(Compression.LZ4, b"x" * 1000)))
    frame[-6] ^= 0xFF  # inside the last block
    with pytest.raises(CorruptRecordError):
        decompress(Compression.LZ4, bytes(frame), legacy_lz4_checksum=True)
    for short in (b"", b"\x04\x22", LZ4_MAGIC + b"\x60"):
        with pytest.raises(CorruptRecordError):
            decompress(Compression.LZ4, short, legacy_lz4_checksum=True)


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0x02CC5D05), (b"a", 0x550D7456), (b"abc", 0x32D153FF)],  # published xxHash32 test vectors
)
def test_xxh32_known_values(data: bytes, expected: int) -> None:
    assert xxh32_short(data) == expected


def test_xxh32_short_refuses_long_input() -> None:
    xxh32_short(b"x" * 15)
    with pytest.raises(ValueError):
        xxh32_short(b"x" * 16)


# --- bad input -----------------------------------------------------------------------------------------------

GARBAGE = b"this is definitely not a compressed stream \x00\x01\x02\xff" * 3


@pytest.mark.parametrize("codec", REAL_CODECS)
def test_garbage_is_corrupt_and_names_the_codec(codec: Compression) -> None:
    with pytest.raises(CorruptRecordError) as info:
        decompress(codec, GARBAGE)
    assert codec.kafka_name in str(info.value)
    assert info.value.kafka_error_code == 2


@pytest.mark.parametrize("codec", REAL_CODECS)
def test_truncated_streams_are_corrupt(codec: Compression) -> None:
    packed = compress(codec, sample(20_000, 3))
    for cut in (1, 5, len(packed) // 2, len(packed) - 1):
        with pytest.raises(CorruptRecordError, match=codec.kafka_name):
            decompress(codec, packed[:cut])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(REAL_CODECS), st.binary(max_size=200), st.booleans())
def test_arbitrary_bytes_decompress_or_raise_corrupt(codec: Compression, data: bytes, legacy: bool) -> None:
    try:
        out = decompress(codec, data, legacy_lz4_checksum=legacy)
    except CorruptRecordError as exc:
        assert codec.kafka_name in str(exc)
    else:
        assert isinstance(out, bytes)


@pytest.mark.parametrize("codec_id", [5, 6, 7, 8, -1, 255])
def test_unknown_codec_id(codec_id: int) -> None:
    with pytest.raises(UnsupportedCompressionError, match=str(codec_id)) as info:
        Compression.from_id(codec_id)
    assert info.value.kafka_error_code == 76
    assert isinstance(info.value, CorruptRecordError)  # in stored bytes an impossible codec id is damage


@pytest.mark.parametrize("name", ["brotli", "lz4hc", "", "snappy-java", "0"])
def test_unknown_codec_name(name: str) -> None:
    with pytest.raises(UnsupportedCompressionError) as info:
        Compression.from_name(name)
    assert "gzip" in str(info.value)  # lists what is accepted


def test_codec_ids_names_and_lookup() -> None:
    assert [(int(c), c.kafka_name) for c in Compression] == [
        (0, "none"),
        (1, "gzip"),
        (2, "snappy"),
        (3, "lz4"),
        (4, "zstd"),
    ]
    for codec in Compression:
        assert Compression.from_id(int(codec)) is codec
        assert Compression.from_name(codec.kafka_name) is codec
    assert Compression.from_name(" ZStd ") is Compression.ZSTD


@pytest.mark.parametrize("codec_id", [5, 7])
def test_compress_and_decompress_refuse_unknown_codecs(codec_id: int) -> None:
    with pytest.raises(UnsupportedCompressionError):
        compress(codec_id, b"x")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedCompressionError):
        decompress(codec_id, b"x")  # type: ignore[arg-type]


def test_errors_are_tidelog_errors() -> None:
    assert issubclass(UnsupportedCompressionError, TidelogError)
    assert issubclass(CorruptRecordError, TidelogError)
