"""Byte compatibility with two independent client codecs: kafka-python 3.0 and aiokafka 0.14.

Batches their builders write must decode identically with ours, and ours must decode identically with
their readers (CRC included). kafka-python's LegacyRecordBatchBuilder covers magic 0/1, including the
magic-0 lz4 frames with Kafka 0.8's broken header checksum.
"""

from __future__ import annotations

import io
import random
import struct
import types

import aiokafka.codec as aiokafka_codec
import aiokafka.record.control_record as aiokafka_control
import aiokafka.record.default_records as aiokafka_default
import aiokafka.record.legacy_records as aiokafka_legacy
import aiokafka.record.memory_records as aiokafka_memory
import aiokafka.record.util as aiokafka_util
import kafka.codec as kafka_codec
import kafka.record.default_records as kafka_default
import kafka.record.legacy_records as kafka_legacy
import kafka.record.memory_records as kafka_memory
import kafka.record.util as kafka_util
import lz4.frame as lz4_frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.codec import legacy, record_set
from tidelog.codec.compression import Compression, compress, decompress, xxh32_short
from tidelog.codec.control_record import ControlRecordType, build_control_batch
from tidelog.codec.record_batch import (
    Record,
    TimestampType,
    build_batch,
    check_batch,
    decode_records,
)
from tidelog.codec.varint import decode_varint, decode_varlong, encode_varint, encode_varlong
from tidelog.errors import CorruptRecordError

try:  # aiokafka's Cython extension: a third implementation when it is built
    from aiokafka.record import _crecords as aiokafka_c
except ImportError:  # pragma: no cover
    aiokafka_c = None

TS = 1_700_000_000_000
FILLER = Record(value=b"compressible " * 60, key=b"filler", timestamp_ms=TS)  # makes compression pay off

BUILDERS = {
    "kafka-python": kafka_default.DefaultRecordBatchBuilder,
    "aiokafka-py": aiokafka_default._DefaultRecordBatchBuilderPy,
}
READERS = {
    "kafka-python": kafka_default.DefaultRecordBatch,
    "aiokafka-py": aiokafka_default._DefaultRecordBatchPy,
}
if aiokafka_c is not None:
    BUILDERS["aiokafka-c"] = aiokafka_c.DefaultRecordBatchBuilder
    READERS["aiokafka-c"] = aiokafka_c.DefaultRecordBatch


def normalized(records) -> list[tuple]:
    """Ours and theirs side by side: (offset, timestamp, key, value, headers)."""
    return [
        (
            r.offset,
            r.timestamp_ms if isinstance(r, Record) else r.timestamp,
            r.key,
            r.value,
            [tuple(h) for h in r.headers],
        )
        for r in records
    ]


def expected_from(records: list[Record], base_offset: int = 0, log_append_time: int | None = None) -> list[tuple]:
    return [
        (
            base_offset + i,
            r.timestamp_ms if log_append_time is None else log_append_time,
            r.key,
            r.value,
            [tuple(h) for h in r.headers],
        )
        for i, r in enumerate(records)
    ]


records_strategy = st.lists(
    st.builds(
        Record,
        value=st.none() | st.binary(max_size=100),
        key=st.none() | st.binary(max_size=20),
        timestamp_ms=st.integers(1, 2**45),  # >= 1: both clients write `first_timestamp or 0`
        headers=st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=16)), max_size=3),
    ),
    min_size=1,
    max_size=8,
)
codecs = st.sampled_from(list(Compression))


# --- their builders -> our reader ----------------------------------------------------------------------------


@pytest.mark.parametrize("builder_name", list(BUILDERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=records_strategy,
    codec=codecs,
    transactional=st.booleans(),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
)
def test_their_batches_decode_with_ours(
    builder_name: str,
    records: list[Record],
    codec: Compression,
    transactional: bool,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> None:
    records = [*records, FILLER]
    builder = BUILDERS[builder_name](2, int(codec), transactional, producer_id, producer_epoch, base_sequence, 1 << 22)
    for i, r in enumerate(records):
        assert builder.append(i, r.timestamp_ms, r.key, r.value, list(r.headers)) is not None
    buf = bytes(builder.build())

    header = check_batch(buf)  # their CRC is right by our reckoning
    assert header.compression is codec
    assert header.is_transactional is transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert (header.records_count, header.last_offset_delta) == (len(records), len(records) - 1)
    assert header.base_timestamp == records[0].timestamp_ms
    assert header.max_timestamp == max(r.timestamp_ms for r in records)
    assert header.timestamp_type is TimestampType.CREATE_TIME

    ours = normalized(decode_records(buf, 0, header))
    assert ours == expected_from(records)
    assert ours == normalized(READERS["kafka-python"](buf))
    assert normalized(record_set.iter_records(buf)) == ours


@pytest.mark.parametrize("builder_name", list(BUILDERS))
@pytest.mark.parametrize("codec", list(Compression))
def test_their_large_batches_decode_with_ours(builder_name: str, codec: Compression) -> None:
    """> 64 KiB of records: multi-block lz4, multi-block xerial snappy (kafka-python and aiokafka write xerial)."""
    rnd = random.Random(int(codec))
    records = [
        Record(value=rnd.randbytes(3000) + b"z" * 20_000, key=None if i % 3 == 0 else b"%d" % i, timestamp_ms=TS + i)
        for i in range(8)
    ]
    builder = BUILDERS[builder_name](2, int(codec), False, -1, -1, -1, 1 << 24)
    for i, r in enumerate(records):
        builder.append(i, r.timestamp_ms, r.key, r.value, [("i", b"%d" % i), ("nul", None)])
    buf = bytes(builder.build())
    header = check_batch(buf)
    assert header.compression is codec
    if codec is Compression.SNAPPY:
        assert buf[61:69] == b"\x82SNAPPY\x00"  # the xerial stream, as Java producers write it
    decoded = decode_records(buf, 0, header)
    assert [(r.offset, r.key, r.value) for r in decoded] == [(i, r.key, r.value) for i, r in enumerate(records)]
    assert decoded[2].headers == [("i", b"2"), ("nul", None)]


# --- our builder -> their readers ----------------------------------------------------------------------------


@pytest.mark.parametrize("reader_name", list(READERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=records_strategy,
    codec=codecs,
    log_append_time=st.booleans(),
    transactional=st.booleans(),
    base_offset=st.integers(0, 2**40),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
)
def test_our_batches_decode_with_theirs(
    reader_name: str,
    records: list[Record],
    codec: Compression,
    log_append_time: bool,
    transactional: bool,
    base_offset: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> None:
    buf = build_batch(
        records,
        base_offset=base_offset,
        compression=codec,
        timestamp_type=TimestampType.LOG_APPEND_TIME if log_append_time else TimestampType.CREATE_TIME,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=transactional,
    )
    batch = READERS[reader_name](buf)
    assert batch.validate_crc()
    assert batch.magic == 2
    assert batch.base_offset == base_offset
    assert batch.compression_type == int(codec)
    assert batch.timestamp_type == int(log_append_time)
    assert batch.is_transactional is transactional
    assert batch.is_control_batch is False
    assert batch.last_offset_delta == len(records) - 1
    assert batch.first_timestamp == records[0].timestamp_ms
    assert batch.max_timestamp == max(r.timestamp_ms for r in records)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert batch.next_offset == base_offset + len(records)

    theirs = normalized(batch)
    max_ts = max(r.timestamp_ms for r in records)
    assert theirs == expected_from(records, base_offset, max_ts if log_append_time else None)
    assert theirs == normalized(decode_records(buf))


@pytest.mark.parametrize("reader_name", list(READERS))
def test_their_crc_check_is_real(reader_name: str) -> None:
    damaged = bytearray(build_batch([Record(b"v", b"k", TS)]))
    damaged[-1] ^= 1
    assert not READERS[reader_name](bytes(damaged)).validate_crc()


@pytest.mark.parametrize("control_type", [ControlRecordType.ABORT, ControlRecordType.COMMIT])
def test_our_control_batches_read_as_markers(control_type: ControlRecordType) -> None:
    buf = build_control_batch(
        control_type, producer_id=77, producer_epoch=4, coordinator_epoch=9, base_offset=30, timestamp_ms=TS
    )

    batch = kafka_default.DefaultRecordBatch(buf)
    assert batch.validate_crc()
    assert (batch.is_control_batch, batch.is_transactional, batch.producer_id) == (True, True, 77)
    [marker] = list(batch)
    assert (marker.offset, marker.version, marker.type) == (30, 0, int(control_type))
    assert marker.commit is (control_type is ControlRecordType.COMMIT)

    for reader_name in ("aiokafka-py", "aiokafka-c"):
        if reader_name not in READERS:
            continue
        batch = READERS[reader_name](buf)
        assert batch.validate_crc()
        assert batch.is_control_batch
        [record] = list(batch)
        expected = (
            aiokafka_control.COMMIT_MARKER
            if control_type is ControlRecordType.COMMIT
            else aiokafka_control.ABORT_MARKER
        )
        assert aiokafka_control.ControlRecord.parse(record.key) == expected


def test_our_record_sets_read_with_their_memory_records() -> None:
    buf = (
        build_batch([Record(b"a", None, TS), Record(None, b"k", TS + 1)], base_offset=0, compression=Compression.LZ4)
        + build_control_batch(ControlRecordType.COMMIT, producer_id=1, producer_epoch=0, base_offset=2, timestamp_ms=TS)
        + build_batch([Record(b"c", b"k", TS + 2, [("h", b"v")])], base_offset=3, compression=Compression.SNAPPY)
    )
    ours = normalized(record_set.iter_records(buf, include_control=True))
    for memory_records in (kafka_memory.MemoryRecords, aiokafka_memory.MemoryRecords):
        records = memory_records(buf)
        theirs = []
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc()
            theirs += normalized(batch)
        assert theirs == ours
    assert [r[0] for r in ours] == [0, 1, 2, 3]


# --- legacy (magic 0 and 1) ----------------------------------------------------------------------------------


def reference_xxh32(data: bytes, seed: int = 0) -> int:
    """Full xxHash32 (any length), to stand in for the `xxhash` package kafka-python's old-lz4 path imports."""
    p1, p2, p3, p4, p5, mask = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def step(acc: int, lane: int) -> int:
        return (rotl((acc + lane * p2) & mask, 13) * p1) & mask

    n, pos = len(data), 0
    if n >= 16:
        v = [(seed + p1 + p2) & mask, (seed + p2) & mask, seed & mask, (seed - p1) & mask]
        while pos + 16 <= n:
            v = [step(acc, lane) for acc, lane in zip(v, struct.unpack_from("<4I", data, pos), strict=True)]
            pos += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & mask
    else:
        h = (seed + p5) & mask
    h = (h + n) & mask
    while pos + 4 <= n:
        h = (rotl((h + struct.unpack_from("<I", data, pos)[0] * p3) & mask, 17) * p4) & mask
        pos += 4
    for byte in data[pos:]:
        h = (rotl((h + byte * p5) & mask, 11) * p1) & mask
    h = ((h ^ (h >> 15)) * p2) & mask
    h = ((h ^ (h >> 13)) * p3) & mask
    return h ^ (h >> 16)


class _XXH32:
    def __init__(self, data: bytes = b"", seed: int = 0) -> None:
        self._value = reference_xxh32(bytes(data), seed)

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")


@pytest.fixture
def kafka_python_xxhash(monkeypatch: pytest.MonkeyPatch):
    """kafka-python needs `xxhash` for magic-0 lz4; use the real package if installed, else the reference."""
    try:
        import xxhash
    except ImportError:
        xxhash = types.SimpleNamespace(xxh32=_XXH32)
    monkeypatch.setattr(kafka_codec, "xxhash", xxhash)
    return xxhash


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x02CC5D05),
        (b"a", 0x550D7456),
        (b"abc", 0x32D153FF),
        (b"Nobody inspects the spammish repetition", 0xE2293B2F),  # > 16 bytes: the striped path
    ],
)
def test_reference_xxh32_vectors(data: bytes, expected: int) -> None:
    assert reference_xxh32(data) == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 5000), st.sampled_from([0, 4, 5, 6, 7]), st.booleans(), st.booleans(), st.booleans())
def test_xxh32_against_liblz4_header_checksums(
    size: int, block_size: int, checksum: bool, linked: bool, store_size: bool
) -> None:
    """liblz4 computes the frame header checksum itself: an oracle for 2- and 10-byte xxh32 inputs."""
    frame = lz4_frame.compress(
        b"x" * size, block_size=block_size, content_checksum=checksum, block_linked=linked, store_size=store_size
    )
    end = 6 + (8 if frame[4] & 0x08 else 0)
    assert frame[end] == (xxh32_short(frame[4:end]) >> 8) & 0xFF
    assert frame[end] == (reference_xxh32(frame[4:end]) >> 8) & 0xFF


@settings(max_examples=200)
@given(st.binary(max_size=15), st.integers(0, 2**32 - 1))
def test_our_short_xxh32_matches_the_reference(data: bytes, seed: int) -> None:
    assert xxh32_short(data, seed) == reference_xxh32(data, seed)


LEGACY_RECORDS = [
    (b"k0", b"v" * 60),
    (None, b"null key " * 8),
    (b"k2", None),
    (b"", b""),
    (b"k4", bytes(range(256)) * 3),
]


def their_legacy_records(buf: bytes) -> list[tuple]:
    records = kafka_memory.MemoryRecords(buf)
    out = []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        out += [(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch]
    return out


def our_legacy_records(buf: bytes) -> list[tuple]:
    out = []
    for info in record_set.iter_batches(buf):
        assert record_set.is_valid(buf, info)
        out += [(r.offset, r.timestamp_ms, r.key, r.value) for r in record_set.decode_batch(buf, info)]
    return out


def build_legacy(builder_class, magic: int, codec: int, base_offset: int, records=LEGACY_RECORDS) -> bytes:
    builder = builder_class(magic, codec, 1 << 20)
    relative = codec != 0 and magic == 1  # magic-1 producers number inner messages 0..n-1
    for i, (key, value) in enumerate(records):
        builder.append(i if relative else base_offset + i, TS + i, key, value)
    buf = bytearray(builder.build())
    if codec:
        # The broker assigns offsets: a wrapper carries the absolute offset of its last inner message.
        struct.pack_into(">q", buf, 0, base_offset + len(records) - 1)
    return bytes(buf)


@pytest.mark.usefixtures("kafka_python_xxhash")
@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [0, 1, 2, 3])
def test_kafka_python_legacy_batches_decode_with_ours(magic: int, codec: int) -> None:
    buf = build_legacy(kafka_legacy.LegacyRecordBatchBuilder, magic, codec, 1000)
    ours = our_legacy_records(buf)
    assert ours == their_legacy_records(buf)
    timestamps = [TS + i for i in range(len(LEGACY_RECORDS))] if magic == 1 else [-1] * len(LEGACY_RECORDS)
    assert ours == [(1000 + i, ts, k, v) for i, ((k, v), ts) in enumerate(zip(LEGACY_RECORDS, timestamps, strict=True))]
    infos = list(record_set.iter_batches(buf))
    assert {(i.magic, int(i.compression)) for i in infos} == {(magic, codec)}
    assert len(infos) == (1 if codec else len(LEGACY_RECORDS))


@pytest.mark.usefixtures("kafka_python_xxhash")
def test_kafka_python_magic0_lz4_has_the_broken_checksum() -> None:
    buf = build_legacy(kafka_legacy.LegacyRecordBatchBuilder, 0, 3, 0)
    frame = legacy.read_legacy_message(buf).value
    assert frame is not None
    correct = (reference_xxh32(frame[4:6]) >> 8) & 0xFF
    broken = (reference_xxh32(frame[:6]) >> 8) & 0xFF
    assert correct != broken
    assert frame[6] == broken, "kafka-python wrote Kafka 0.8's broken header checksum"
    with pytest.raises(CorruptRecordError, match="lz4"):
        decompress(Compression.LZ4, frame)  # only the legacy tolerance makes it readable
    assert [r.value for r in legacy.decode_legacy_records(buf)] == [v for _k, v in LEGACY_RECORDS]


@pytest.mark.parametrize(
    ("magic", "codec"),
    [(m, c) for m in (0, 1) for c in (0, 1, 2, 3) if (m, c) != (0, 3)],  # aiokafka refuses magic-0 lz4 (KAFKA-3160)
)
def test_aiokafka_legacy_batches_decode_with_ours(magic: int, codec: int) -> None:
    buf = build_legacy(aiokafka_legacy._LegacyRecordBatchBuilderPy, magic, codec, 5)
    assert our_legacy_records(buf) == their_legacy_records(buf)
    assert [r[0] for r in our_legacy_records(buf)] == list(range(5, 5 + len(LEGACY_RECORDS)))


@pytest.mark.usefixtures("kafka_python_xxhash")
@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([0, 1]),
    st.sampled_from([0, 1, 2, 3]),
    st.lists(st.tuples(st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=60)), min_size=1, max_size=6),
    st.integers(0, 2**40),
)
def test_kafka_python_legacy_round_trips(magic: int, codec: int, records: list, base_offset: int) -> None:
    buf = build_legacy(kafka_legacy.LegacyRecordBatchBuilder, magic, codec, base_offset, records)
    assert our_legacy_records(buf) == their_legacy_records(buf)


# --- compressors and decompressors of the other libraries ----------------------------------------------------


def payload(size: int) -> bytes:
    rnd = random.Random(size)
    return (rnd.randbytes(size // 3) + b"abcdefgh" * size)[:size]


PAYLOAD_SIZES = [0, 1, 1000, 65_536, 300_000]


@pytest.mark.parametrize("size", PAYLOAD_SIZES)
def test_foreign_compressor_outputs_decode_with_ours(size: int) -> None:
    data = payload(size)
    foreign = {
        "gzip kafka-python": (Compression.GZIP, kafka_codec.gzip_encode(data)),
        "gzip aiokafka": (Compression.GZIP, aiokafka_codec.gzip_encode(data)),
        "snappy xerial kafka-python": (Compression.SNAPPY, kafka_codec.snappy_encode(data)),
        "snappy xerial aiokafka": (Compression.SNAPPY, aiokafka_codec.snappy_encode(data)),
        "snappy raw": (Compression.SNAPPY, kafka_codec.snappy_encode(data, xerial_compatible=False)),
        "lz4 kafka-python": (Compression.LZ4, kafka_codec.lz4_encode(data)),
        "lz4 aiokafka": (Compression.LZ4, aiokafka_codec.lz4_encode(data)),
        "lz4 linked blocks": (Compression.LZ4, lz4_frame.compress(data)),  # python-lz4's default
        "lz4 all checksums": (
            Compression.LZ4,
            lz4_frame.compress(data, block_linked=True, block_checksum=True, content_checksum=True),
        ),
        "zstd kafka-python": (Compression.ZSTD, kafka_codec.zstd_encode(data)),
        "zstd aiokafka": (Compression.ZSTD, aiokafka_codec.zstd_encode(data)),
        "zstd no content size": (Compression.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(data)),
    }
    stream = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(stream, closefd=False) as writer:
        writer.write(data)
    foreign["zstd streamed"] = (Compression.ZSTD, stream.getvalue())
    for name, (codec, packed) in foreign.items():
        assert decompress(codec, packed) == data, name


@pytest.mark.parametrize("size", PAYLOAD_SIZES)
def test_our_compressor_outputs_decode_with_theirs(size: int) -> None:
    data = payload(size)
    decoders = {
        Compression.GZIP: [kafka_codec.gzip_decode, aiokafka_codec.gzip_decode],
        Compression.SNAPPY: [kafka_codec.snappy_decode, aiokafka_codec.snappy_decode],
        Compression.LZ4: [kafka_codec.lz4_decode, aiokafka_codec.lz4_decode, lz4_frame.decompress],
        Compression.ZSTD: [kafka_codec.zstd_decode, aiokafka_codec.zstd_decode],
    }
    for codec, functions in decoders.items():
        packed = compress(codec, data)
        for function in functions:
            assert bytes(function(packed)) == data, (codec, function.__module__)


# --- varints -------------------------------------------------------------------------------------------------


def their_encoding(encode, value: int) -> bytes:
    out = bytearray()
    encode(value, out.append)
    return bytes(out)


@settings(max_examples=200)
@given(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1))
def test_varints_match_kafka_python_and_aiokafka(value32: int, value64: int) -> None:
    for encode, decode in (
        (kafka_util.encode_varint, kafka_util.decode_varint),
        (aiokafka_util.encode_varint_py, aiokafka_util.decode_varint_py),
    ):
        assert their_encoding(encode, value32) == encode_varint(value32)
        assert their_encoding(encode, value64) == encode_varlong(value64)
        assert decode(bytearray(encode_varint(value32)), 0) == decode_varint(encode_varint(value32), 0)
        assert decode(bytearray(encode_varlong(value64)), 0) == decode_varlong(encode_varlong(value64), 0)
