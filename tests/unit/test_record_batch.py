"""RecordBatch v2: layout, round trips, broker rewrites, and what bad bytes do."""

from __future__ import annotations

import contextlib
import random
import struct
import time

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.codec import record_check, record_set
from tidelog.codec.compression import Compression, compress, decompress
from tidelog.codec.control_record import ControlRecordType, build_control_batch, parse_control_record
from tidelog.codec.record_batch import (
    BatchHeader,
    Record,
    TimestampType,
    build_batch,
    check_batch,
    check_producer_batch,
    decode_records,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
)
from tidelog.codec.varint import decode_varint, encode_varint, encode_varlong
from tidelog.errors import (
    CorruptRecordError,
    CrcMismatchError,
    InvalidRecordError,
    TidelogError,
    TruncatedBatchError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)

INT32_MAX = 2**31 - 1
HEADER_FORMAT = ">qiibIhiqqqhii"  # written out again here, independently of the module
HEADER_SIZE = struct.calcsize(HEADER_FORMAT)
TS = 1_700_000_000_000

# a worked example of Kafka's format, written out by hand: key "k", value "v", ts 1700000000000, PLE -1, not idempotent.
WORKED_EXAMPLE = bytes.fromhex(
    "0000000000000000 0000003a ffffffff 02 e99b8dd8 0000 00000000 0000018bcfe56800 0000018bcfe56800"
    "ffffffffffffffff ffff ffffffff 00000001"
    "10 00 00 00 02 6b 02 76 00"
)


def normalized(records: list[Record]) -> list[tuple]:
    return [(r.offset, r.timestamp_ms, r.key, r.value, [tuple(h) for h in r.headers]) for r in records]


def assemble(
    body: bytes,
    count: int,
    *,
    attributes: int = 0,
    last_offset_delta: int | None = None,
    base_offset: int = 0,
    base_timestamp: int = TS,
    max_timestamp: int = TS,
    magic: int = 2,
    crc: int | None = None,
) -> bytes:
    """A v2 batch around an arbitrary (already compressed, if at all) records section, with a correct CRC."""
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    header = bytearray(
        struct.pack(
            HEADER_FORMAT,
            base_offset,
            HEADER_SIZE - 12 + len(body),
            -1,
            magic,
            0,
            attributes,
            lod,
            base_timestamp,
            max_timestamp,
            -1,
            -1,
            -1,
            count,
        )
    )
    batch = bytearray(header + body)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])) if crc is None else crc)
    return bytes(batch)


def raw_record(
    offset_delta: int = 0,
    ts_delta: int = 0,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: list[tuple[bytes | None, bytes | None]] | tuple = (),
    *,
    length_adjust: int = 0,
    header_count: int | None = None,
) -> bytes:
    """One record encoded by hand, with knobs to break it."""

    def field(b: bytes | None) -> bytes:
        return b"\x01" if b is None else encode_varint(len(b)) + b

    body = b"\x00" + encode_varlong(ts_delta) + encode_varint(offset_delta) + field(key) + field(value)
    body += encode_varint(len(headers) if header_count is None else header_count)
    for hk, hv in headers:
        body += field(hk) + field(hv)
    return encode_varint(len(body) + length_adjust) + body


def rebuild_crc(batch: bytes | bytearray) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


# --- the worked example, byte for byte -----------------------------------------------------------------------


def test_worked_example_byte_for_byte() -> None:
    batch = build_batch([Record(value=b"v", key=b"k", timestamp_ms=TS)])
    assert len(WORKED_EXAMPLE) == 70
    assert batch == WORKED_EXAMPLE


def test_worked_example_crc_does_not_cover_the_leader_epoch() -> None:
    batch = build_batch([Record(value=b"v", key=b"k", timestamp_ms=TS)], partition_leader_epoch=0)
    assert batch[:12] == WORKED_EXAMPLE[:12]
    assert batch[12:16] == b"\x00\x00\x00\x00"
    assert batch[16:] == WORKED_EXAMPLE[16:]
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value: the right algorithm is in use


def test_worked_example_decodes() -> None:
    header = check_batch(WORKED_EXAMPLE)
    assert tuple(header) == struct.unpack(HEADER_FORMAT, WORKED_EXAMPLE[:HEADER_SIZE])
    assert header.crc == 0xE99B8DD8
    assert header.size_in_bytes == 70
    assert normalized(decode_records(WORKED_EXAMPLE, 0, header)) == [(0, TS, b"k", b"v", [])]


# --- round trips ---------------------------------------------------------------------------------------------

header_keys = st.text(max_size=12)  # includes non-ASCII; never lone surrogates
header_values = st.none() | st.binary(max_size=20)
records_strategy = st.lists(
    st.builds(
        Record,
        value=st.none() | st.binary(max_size=120),
        key=st.none() | st.binary(max_size=30),
        timestamp_ms=st.integers(0, 2**45),
        headers=st.lists(st.tuples(header_keys, header_values), max_size=4),
    ),
    min_size=1,
    max_size=12,
)


@st.composite
def batch_params(draw: st.DrawFn) -> dict:
    producer_id = draw(st.sampled_from([-1, 0, 1, 2**63 - 1]) | st.integers(0, 2**63 - 1))
    return {
        "base_offset": draw(st.integers(0, 2**62)),
        "compression": draw(st.sampled_from(list(Compression))),
        "timestamp_type": draw(st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME])),
        "producer_id": producer_id,
        "producer_epoch": draw(st.integers(-1, 2**15 - 1)),
        "base_sequence": draw(st.integers(-1, INT32_MAX)),
        "partition_leader_epoch": draw(st.integers(-1, INT32_MAX)),
        "is_transactional": draw(st.booleans()),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records_strategy, batch_params())
def test_build_check_decode_round_trip(records: list[Record], params: dict) -> None:
    batch = build_batch(records, **params)
    header = check_batch(batch)

    timestamps = [r.timestamp_ms for r in records]
    expected_attributes = int(params["compression"])
    if params["timestamp_type"] is TimestampType.LOG_APPEND_TIME:
        expected_attributes |= 0x08
    if params["is_transactional"]:
        expected_attributes |= 0x10
    # every header field, against the raw bytes and against what went in
    assert tuple(header) == struct.unpack(HEADER_FORMAT, batch[:HEADER_SIZE])
    assert header.base_offset == params["base_offset"]
    assert header.batch_length == len(batch) - 12
    assert header.size_in_bytes == len(batch)
    assert header.partition_leader_epoch == params["partition_leader_epoch"]
    assert header.magic == 2
    assert header.crc == crc32c(batch[21:])
    assert header.attributes == expected_attributes
    assert header.compression is params["compression"]
    assert header.timestamp_type is params["timestamp_type"]
    assert header.is_transactional is params["is_transactional"]
    assert header.is_control is False
    assert header.delete_horizon_ms is None
    assert header.last_offset_delta == len(records) - 1
    assert header.last_offset == params["base_offset"] + len(records) - 1
    assert header.base_timestamp == timestamps[0]
    assert header.max_timestamp == max(timestamps)
    assert header.producer_id == params["producer_id"]
    assert header.producer_epoch == params["producer_epoch"]
    assert header.base_sequence == params["base_sequence"]
    assert header.records_count == len(records)
    check_producer_batch(header)  # a well-formed produced batch passes

    # the records section, byte for byte, against the hand-written encoder above
    expected_body = b"".join(
        raw_record(i, r.timestamp_ms - timestamps[0], r.key, r.value, [(k.encode(), v) for k, v in r.headers])
        for i, r in enumerate(records)
    )
    assert decompress(params["compression"], batch[HEADER_SIZE:]) == expected_body

    decoded = decode_records(batch, 0, header)
    assert decode_records(batch) == decoded  # header=None path reads it itself
    log_append = params["timestamp_type"] is TimestampType.LOG_APPEND_TIME
    expected = [
        (
            params["base_offset"] + i,
            max(timestamps) if log_append else r.timestamp_ms,
            r.key,
            r.value,
            [tuple(h) for h in r.headers],
        )
        for i, r in enumerate(records)
    ]
    assert normalized(decoded) == expected
    assert all(isinstance(r.key, bytes | None) and isinstance(r.value, bytes | None) for r in decoded)

    # the same batch read as a record set
    info = next(record_set.iter_batches(batch))
    assert (info.position, info.size, info.magic, info.count) == (0, len(batch), 2, len(records))
    assert (info.base_offset, info.last_offset, info.max_timestamp) == (
        header.base_offset,
        header.last_offset,
        header.max_timestamp,
    )
    assert info.compression is params["compression"]
    assert info.partition_leader_epoch == params["partition_leader_epoch"]
    assert record_set.is_valid(batch, info)
    assert normalized(list(record_set.iter_records(batch))) == expected


@pytest.mark.parametrize("codec", list(Compression))
def test_large_records_round_trip(codec: Compression) -> None:
    """Records section far beyond one 64 KiB lz4 block / 32 KiB snappy block."""
    records = [
        Record(value=bytes([i]) * 40_000 + bytes(range(256)) * 50, key=b"%d" % i, timestamp_ms=TS + i) for i in range(6)
    ]
    batch = build_batch(records, compression=codec)
    header = check_batch(batch)
    assert header.compression is codec
    if codec is not Compression.NONE:
        assert len(batch) < 100_000
    assert normalized(decode_records(batch, 0, header)) == [
        (i, TS + i, b"%d" % i, r.value, []) for i, r in enumerate(records)
    ]


def test_negative_and_out_of_order_timestamps() -> None:
    records = [Record(b"a", timestamp_ms=TS), Record(b"b", timestamp_ms=TS - 5000), Record(b"c", timestamp_ms=-1)]
    header = check_batch(batch := build_batch(records))
    assert (header.base_timestamp, header.max_timestamp) == (TS, TS)
    assert [r.timestamp_ms for r in decode_records(batch)] == [TS, TS - 5000, -1]


def test_missing_timestamps_take_now() -> None:
    batch = build_batch([Record(b"a"), Record(b"b", timestamp_ms=5)], now_ms=1234)
    assert [r.timestamp_ms for r in decode_records(batch)] == [1234, 5]
    before = int(time.time() * 1000)
    stamped = decode_records(build_batch([Record(b"a")]))[0].timestamp_ms
    assert before <= stamped <= int(time.time() * 1000)


def test_header_keys_that_are_not_utf8_round_trip_through_surrogate_escapes() -> None:
    records = [Record(b"v", headers=[("\udcff\udcfe", b"x"), ("ключ", None), ("", b"")], timestamp_ms=TS)]
    batch = build_batch(records)
    assert b"\x04\xff\xfe\x02x" in batch  # the raw key bytes are on the wire
    assert decode_records(batch)[0].headers == [("\udcff\udcfe", b"x"), ("ключ", None), ("", b"")]


def test_null_versus_empty_key_value_and_header_value() -> None:
    records = [
        Record(value=None, key=None, timestamp_ms=TS, headers=[("h", None)]),
        Record(value=b"", key=b"", timestamp_ms=TS, headers=[("h", b"")]),
    ]
    decoded = decode_records(build_batch(records))
    assert [(r.key, r.value, r.headers) for r in decoded] == [(None, None, [("h", None)]), (b"", b"", [("h", b"")])]


def test_offset_deltas_keep_gaps() -> None:
    records = [Record(b"a", timestamp_ms=TS), Record(b"b", timestamp_ms=TS), Record(b"c", timestamp_ms=TS)]
    batch = build_batch(records, base_offset=100, offset_deltas=[0, 3, 7])
    header = check_batch(batch)
    assert (header.last_offset_delta, header.last_offset, header.records_count) == (7, 107, 3)
    assert [r.offset for r in decode_records(batch)] == [100, 103, 107]
    with pytest.raises(ValueError):
        build_batch(records, offset_deltas=[0, 1])


# --- control batches -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("control_type", [ControlRecordType.COMMIT, ControlRecordType.ABORT])
def test_control_batch(control_type: ControlRecordType) -> None:
    batch = build_control_batch(
        control_type, producer_id=42, producer_epoch=3, coordinator_epoch=7, base_offset=500, timestamp_ms=TS
    )
    header = check_batch(batch)
    assert header.attributes == 0x30  # control + transactional, uncompressed, CreateTime
    assert (header.is_control, header.is_transactional) == (True, True)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, -1)
    assert (header.base_offset, header.records_count, header.last_offset_delta) == (500, 1, 0)
    [record] = decode_records(batch, 0, header)
    assert record.key == struct.pack(">hh", 0, int(control_type))
    assert record.value == struct.pack(">hi", 0, 7)
    assert (record.offset, record.timestamp_ms) == (500, TS)
    assert parse_control_record(record) == (control_type, 7)
    with pytest.raises(InvalidRecordError, match="control"):
        check_producer_batch(header)

    info = next(record_set.iter_batches(batch))
    assert info.is_control
    assert list(record_set.iter_records(batch)) == []  # consumers never see control records
    assert normalized(list(record_set.iter_records(batch, include_control=True))) == normalized([record])


def test_parse_control_record_other_types() -> None:
    def control(type_id: int, value: bytes | None = None) -> Record:
        return Record(value=value, key=struct.pack(">hh", 0, type_id))

    assert parse_control_record(control(2, b"anything")) == (ControlRecordType.LEADER_CHANGE, None)
    assert parse_control_record(control(6)) == (ControlRecordType.KRAFT_VOTERS, None)
    assert parse_control_record(control(99)) == (99, None)  # unknown types are reported, not rejected
    assert parse_control_record(control(-1)) == (-1, None)
    assert parse_control_record(control(1, struct.pack(">hi", 0, -5) + b"extra")) == (ControlRecordType.COMMIT, -5)


@pytest.mark.parametrize(
    "record",
    [
        Record(value=None, key=None),
        Record(value=None, key=b"\x00\x00\x00"),
        Record(value=b"\x00\x00\x00\x00\x00", key=struct.pack(">hh", 0, 1)),  # marker value too short
        Record(value=None, key=struct.pack(">hh", 0, 0)),
    ],
)
def test_parse_control_record_rejects_short_fields(record: Record) -> None:
    with pytest.raises(CorruptRecordError):
        parse_control_record(record)


# --- empty batches and the delete horizon --------------------------------------------------------------------


def test_empty_batch_with_explicit_last_offset_delta() -> None:
    batch = build_batch(
        [],
        last_offset_delta=4,
        base_offset=10,
        producer_id=9,
        producer_epoch=2,
        base_sequence=20,
        is_transactional=True,
    )
    header = check_batch(batch)
    assert len(batch) == HEADER_SIZE
    assert (header.records_count, header.last_offset_delta, header.last_offset) == (0, 4, 14)
    assert (header.base_timestamp, header.max_timestamp) == (-1, -1)
    assert (header.base_sequence, header.last_sequence) == (20, 24)
    assert decode_records(batch, 0, header) == []
    with pytest.raises(InvalidRecordError):
        check_producer_batch(header)
    with pytest.raises(ValueError):
        build_batch([])

    # in a record set, the empty batch is skipped and the next batch still reads
    after = build_batch([Record(b"x", timestamp_ms=TS)], base_offset=15)
    infos = list(record_set.iter_batches(batch + after))
    assert [(i.count, i.base_offset, i.last_offset) for i in infos] == [(0, 10, 14), (1, 15, 15)]
    assert [r.offset for r in record_set.iter_records(batch + after)] == [15]


@pytest.mark.parametrize(
    "codec",
    [c for c in Compression if c is not Compression.NONE],
)
def test_empty_batch_with_a_codec_decodes_to_nothing(codec: Compression) -> None:
    batch = build_batch([], compression=codec, last_offset_delta=0)
    assert decode_records(batch, 0, check_batch(batch)) == []


def test_delete_horizon() -> None:
    horizon = TS + 86_400_000
    records = [
        Record(b"a", timestamp_ms=TS),
        Record(None, b"k", timestamp_ms=TS + 10),
        Record(b"c", timestamp_ms=TS - 3),
    ]
    for codec in (Compression.NONE, Compression.ZSTD):
        batch = build_batch(records, delete_horizon_ms=horizon, compression=codec)
        header = check_batch(batch)
        assert header.attributes == 0x40 | int(codec)
        assert header.base_timestamp == horizon  # the horizon replaces the first timestamp
        assert header.delete_horizon_ms == horizon
        assert header.max_timestamp == TS + 10
        assert [r.timestamp_ms for r in decode_records(batch)] == [TS, TS + 10, TS - 3]
        with pytest.raises(InvalidRecordError, match="horizon"):
            check_producer_batch(header)
    low = check_batch(build_batch(records, delete_horizon_ms=0))
    assert low.delete_horizon_ms == 0  # 0 is a horizon, not "absent"


# --- broker rewrites -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(Compression))
def test_set_log_append_time(codec: Compression) -> None:
    records = [Record(b"a", timestamp_ms=TS), Record(b"b", timestamp_ms=TS + 50)]
    first = build_batch([Record(b"z", timestamp_ms=1)], base_offset=0)
    batch = bytearray(first + build_batch(records, compression=codec, base_offset=1, is_transactional=True))
    original = bytes(batch)
    append_time = TS + 999_999
    pos = len(first)
    set_log_append_time(batch, pos, len(batch) - pos, append_time)

    assert batch[:pos] == original[:pos]  # the batch before it is untouched
    header = check_batch(batch, pos)  # CRC recomputed
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.attributes == 0x08 | 0x10 | int(codec)
    assert header.max_timestamp == append_time
    assert header.base_timestamp == TS
    assert [r.timestamp_ms for r in decode_records(batch, pos, header)] == [append_time, append_time]
    assert [r.timestamp_ms for r in record_set.iter_records(batch)] == [1, append_time, append_time]
    changed = [i for i in range(len(batch)) if batch[i] != original[i]]
    assert all(pos + 17 <= i < pos + 43 for i in changed)  # only crc, attributes, maxTimestamp


def test_set_log_append_time_works_on_a_memoryview() -> None:
    batch = bytearray(build_batch([Record(b"a", timestamp_ms=TS)]))
    set_log_append_time(memoryview(batch), 0, len(batch), 5)
    assert decode_records(batch, 0, check_batch(batch))[0].timestamp_ms == 5


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**63 - 1), st.integers(-1, INT32_MAX), st.sampled_from(list(Compression)))
def test_set_base_offset_and_leader_epoch_keep_the_crc(new_base: int, epoch: int, codec: Compression) -> None:
    records = [Record(b"a", timestamp_ms=TS), Record(b"b", timestamp_ms=TS)]
    first = build_batch(records)
    batch = bytearray(first + build_batch(records, compression=codec))
    crc_before = bytes(batch[len(first) + 17 : len(first) + 21])
    set_base_offset(batch, len(first), new_base)
    set_partition_leader_epoch(batch, len(first), epoch)
    header = check_batch(batch, len(first))
    assert bytes(batch[len(first) + 17 : len(first) + 21]) == crc_before
    assert (header.base_offset, header.partition_leader_epoch) == (new_base, epoch)
    assert [r.offset for r in decode_records(batch, len(first), header)] == [new_base, new_base + 1]
    assert check_batch(batch, 0).base_offset == 0  # the neighbour is untouched


def java_increment_sequence(sequence: int, increment: int) -> int:
    """DefaultRecordBatch.incrementSequence."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def test_last_sequence_wraps() -> None:
    records = [Record(b"a", timestamp_ms=TS)] * 3
    header = check_batch(build_batch(records, producer_id=1, producer_epoch=0, base_sequence=INT32_MAX - 1))
    assert header.last_sequence == 0
    header = check_batch(build_batch(records, producer_id=1, producer_epoch=0, base_sequence=INT32_MAX - 2))
    assert header.last_sequence == INT32_MAX
    assert check_batch(build_batch(records)).last_sequence == -1  # no sequence


@settings(max_examples=200)
@given(st.integers(0, INT32_MAX), st.integers(0, INT32_MAX))
def test_last_sequence_matches_java(base_sequence: int, last_offset_delta: int) -> None:
    header = read_header(WORKED_EXAMPLE)._replace(base_sequence=base_sequence, last_offset_delta=last_offset_delta)
    assert header.last_sequence == java_increment_sequence(base_sequence, last_offset_delta)


# --- producer-side validation ---------------------------------------------------------------------------------


def test_check_producer_batch() -> None:
    good = check_batch(
        build_batch([Record(b"a", timestamp_ms=TS)] * 3, producer_id=7, producer_epoch=0, base_sequence=0)
    )
    assert check_producer_batch(good) is None
    with pytest.raises(InvalidRecordError, match="at least one"):
        check_producer_batch(check_batch(build_batch([], last_offset_delta=0)))
    with pytest.raises(InvalidRecordError, match="lastOffsetDelta"):
        check_producer_batch(check_batch(build_batch([Record(b"a", timestamp_ms=TS)] * 3, last_offset_delta=5)))
    with pytest.raises(InvalidRecordError, match="lastOffsetDelta"):
        check_producer_batch(check_batch(build_batch([Record(b"a", timestamp_ms=TS)] * 3, offset_deltas=[0, 1, 3])))
    with pytest.raises(InvalidRecordError, match="lastOffsetDelta"):  # too small, too
        check_producer_batch(check_batch(build_batch([Record(b"a", timestamp_ms=TS)] * 3, last_offset_delta=1)))
    with pytest.raises(InvalidRecordError):
        check_producer_batch(good._replace(records_count=-1))
    assert InvalidRecordError.kafka_error_code == 87


# --- bad bytes -----------------------------------------------------------------------------------------------

SAMPLE_RECORDS = [
    Record(b"value-%d" % i * 3, b"key" if i % 2 else None, TS + i, [("h", b"x"), ("n", None)]) for i in range(4)
]


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP, Compression.LZ4])
def test_any_flipped_byte_in_the_crc_range_is_a_crc_mismatch(codec: Compression) -> None:
    batch = build_batch(SAMPLE_RECORDS, compression=codec, producer_id=3, producer_epoch=1, base_sequence=5)
    for pos in range(17, len(batch)):  # the CRC itself, then attributes .. end
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(batch)
            damaged[pos] ^= mask
            if pos == 57 and mask & 0x80:
                continue  # a negative recordsCount: see test_negative_count_from_a_bit_flip_is_a_crc_mismatch
            with pytest.raises(CrcMismatchError):
                check_batch(damaged)
            if pos in (21, 22, 57):
                continue  # attributes / recordsCount: see test_record_set_reports_damaged_attributes_as_corrupt
            info = next(record_set.iter_batches(damaged))
            assert not record_set.is_valid(damaged, info)


def test_negative_count_from_a_bit_flip_is_a_crc_mismatch() -> None:
    damaged = bytearray(build_batch(SAMPLE_RECORDS))
    damaged[57] ^= 0x80
    with pytest.raises(CrcMismatchError):
        check_batch(damaged)


def test_record_set_reports_damaged_attributes_as_corrupt() -> None:
    damaged = bytearray(build_batch(SAMPLE_RECORDS))
    damaged[22] ^= 0x07  # codec bits 0 -> 7, CRC left stale
    try:
        infos = list(record_set.iter_batches(damaged))
    except CorruptRecordError:
        return
    assert not record_set.is_valid(damaged, infos[0])


def test_bytes_outside_the_crc() -> None:
    batch = build_batch(SAMPLE_RECORDS)
    for pos in [*range(0, 8), *range(12, 16)]:  # baseOffset and partitionLeaderEpoch are not covered
        damaged = bytearray(batch)
        damaged[pos] ^= 0x5A
        check_batch(damaged)
    damaged = bytearray(batch)
    damaged[16] = 3
    with pytest.raises(UnsupportedMagicError):
        check_batch(damaged)


@pytest.mark.parametrize("codec", list(Compression))
def test_every_truncation_is_reported_as_truncated(codec: Compression) -> None:
    batch = build_batch(SAMPLE_RECORDS, compression=codec)
    for cut in range(len(batch)):
        short = batch[:cut]
        with pytest.raises(TruncatedBatchError):
            check_batch(short)
        with pytest.raises(TruncatedBatchError):
            read_header(short)
        with pytest.raises(TruncatedBatchError):
            decode_records(short)
        assert list(record_set.iter_batches(short)) == []  # a partial tail, not an error


@pytest.mark.parametrize("codec", list(Compression))
def test_records_section_cut_short_with_a_consistent_header(codec: Compression) -> None:
    """batchLength and CRC agree with the bytes, but the records inside end early."""
    body = b"".join(raw_record(i, i, b"key", b"value" * 5, [(b"h", b"v")]) for i in range(4))
    for cut in range(len(body)):
        section = compress(codec, body[:cut]) if codec is not Compression.NONE else body[:cut]
        batch = assemble(section, 4, attributes=int(codec))
        header = check_batch(batch)
        with pytest.raises(CorruptRecordError):
            decode_records(batch, 0, header)


@pytest.mark.parametrize("magic", [3, 4, 127, -1])
def test_unknown_magic(magic: int) -> None:
    batch = assemble(raw_record(), 1, magic=magic)
    with pytest.raises(UnsupportedMagicError):
        check_batch(batch)
    with pytest.raises(UnsupportedMagicError):
        decode_records(batch)
    with pytest.raises(UnsupportedMagicError):
        list(record_set.iter_batches(batch))


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_in_attributes(codec_id: int) -> None:
    batch = assemble(raw_record(), 1, attributes=codec_id)
    with pytest.raises(UnsupportedCompressionError):
        check_batch(batch)
    with pytest.raises(UnsupportedCompressionError):
        decode_records(batch)
    with pytest.raises(UnsupportedCompressionError):
        list(record_set.iter_records(batch))


@pytest.mark.parametrize("attributes", [0x80, 0x100, 0x4000, -0x8000])
def test_unknown_attribute_bits(attributes: int) -> None:
    with pytest.raises(CorruptRecordError, match="attribute"):
        check_batch(assemble(raw_record(), 1, attributes=attributes))


@pytest.mark.parametrize("batch_length", [-1, 0, 13, 14, 48])
def test_batch_length_below_49(batch_length: int) -> None:
    batch = bytearray(assemble(raw_record(), 1))
    struct.pack_into(">i", batch, 8, batch_length)
    for read in (check_batch, read_header, lambda b: list(record_set.iter_batches(b))):
        with pytest.raises(CorruptRecordError) as info:
            read(batch)
        assert not isinstance(info.value, TruncatedBatchError), "a too-small size is corruption, not a partial tail"


def test_batch_length_of_exactly_49_is_an_empty_batch() -> None:
    batch = assemble(b"", 0)
    assert check_batch(batch).batch_length == 49
    assert decode_records(batch) == []


def test_negative_record_count() -> None:
    with pytest.raises(CorruptRecordError, match="negative"):
        check_batch(assemble(raw_record(), -1, last_offset_delta=0))


@pytest.mark.parametrize(
    ("body", "count"),
    [
        (raw_record() * 2, 1),  # trailing bytes after recordsCount records
        (raw_record() + b"\x00", 1),  # one stray byte
        (raw_record(), 2),  # fewer records than declared
        (raw_record(length_adjust=1), 1),  # length longer than the fields
        (raw_record(length_adjust=-1), 1),  # length shorter than the fields
        (raw_record(length_adjust=-1) + b"\x00", 1),
        # a length that swallows the next record: the fields end early, the next record looks fine
        (raw_record(key=b"a", length_adjust=len(raw_record(key=b"b"))) + raw_record(key=b"b"), 2),
        (encode_varint(-2) + raw_record()[1:], 1),  # negative record length
        (raw_record(header_count=-1), 1),  # negative header count
        (raw_record(headers=[(None, b"v")]), 1),  # null header key
        (raw_record(header_count=3, headers=[(b"a", b"b")]), 1),  # more headers declared than present
        (raw_record(key=b"k" * 10)[:-5], 1),
        (b"\x00", 1),  # zero-length record: no room for attributes
        (b"\xff" * 12, 1),  # overlong varint
    ],
)
def test_malformed_records_are_corrupt(body: bytes, count: int) -> None:
    for codec in (Compression.NONE, Compression.SNAPPY):
        section = body if codec is Compression.NONE else compress(codec, body)
        batch = assemble(section, count, attributes=int(codec))
        header = check_batch(batch)
        with pytest.raises(CorruptRecordError):
            decode_records(batch, 0, header)
        with pytest.raises(CorruptRecordError):
            list(record_set.iter_records(batch))


def test_garbage_instead_of_compressed_records() -> None:
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        batch = assemble(b"\x00garbage, not " + codec.kafka_name.encode(), 1, attributes=int(codec))
        header = check_batch(batch)  # the CRC is fine: it covers the compressed bytes
        with pytest.raises(CorruptRecordError, match=codec.kafka_name):
            decode_records(batch, 0, header)


# --- arbitrary bytes: only tidelog errors escape -------------------------------------------------------------


def decode_everything(buf: bytes) -> None:
    """Run every reader over `buf`; let only TidelogError subclasses out."""
    for read in (
        lambda: decode_records(buf, 0, check_batch(buf)),
        lambda: decode_records(buf),  # no CRC check: the record parser sees the damage
        lambda: list(record_set.iter_records(buf, include_control=True)),
        lambda: [record_set.is_valid(buf, info) for info in record_set.iter_batches(buf)],
    ):
        with contextlib.suppress(TidelogError):
            read()


@st.composite
def v2_shaped(draw: st.DrawFn) -> bytes:
    """A plausible batch: right magic, length and CRC, random attributes, count and (maybe compressed) records."""
    codec = draw(st.integers(0, 7))
    body = draw(st.binary(max_size=120) | st.lists(st.binary(max_size=20), max_size=6).map(b"".join))
    if draw(st.booleans()):
        body = b"".join(
            raw_record(i, i, None, b) for i, b in enumerate(draw(st.lists(st.binary(max_size=8), max_size=3)))
        )
        body = body[: draw(st.integers(0, len(body)))] + draw(st.binary(max_size=3))
    if 1 <= codec <= 4 and draw(st.booleans()):
        body = compress(Compression(codec), body)
    attributes = codec | draw(st.sampled_from([0, 0x08, 0x10, 0x20, 0x30, 0x40, 0x80]))
    return assemble(body, draw(st.integers(-2, 5)), attributes=attributes, last_offset_delta=draw(st.integers(-1, 5)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([None, 0, 1, 2, 3]))
def test_arbitrary_bytes_raise_only_tidelog_errors(buf: bytes, magic: int | None) -> None:
    if magic is not None and len(buf) > 16:
        buf = buf[:16] + bytes([magic]) + buf[17:]
    decode_everything(buf)


@settings(max_examples=300, deadline=None)
@given(v2_shaped())
def test_plausible_batches_raise_only_tidelog_errors(batch: bytes) -> None:
    decode_everything(batch)
    decode_everything(batch + batch[:30])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(Compression)), st.lists(st.tuples(st.integers(17, 500), st.integers(0, 255)), max_size=4))
def test_damaged_valid_batches_raise_only_tidelog_errors(codec: Compression, edits: list[tuple[int, int]]) -> None:
    batch = bytearray(build_batch(SAMPLE_RECORDS, compression=codec))
    for pos, value in edits:
        if pos < len(batch):
            batch[pos] = value
    decode_everything(bytes(batch))
    decode_everything(rebuild_crc(batch))  # same damage behind a valid CRC


# --- record sets of several batches --------------------------------------------------------------------------


def test_record_set_partial_tail_and_min_offset() -> None:
    batches = [
        build_batch([Record(b"a", timestamp_ms=TS), Record(b"b", timestamp_ms=TS)], base_offset=0),
        build_control_batch(ControlRecordType.COMMIT, producer_id=1, producer_epoch=0, base_offset=2, timestamp_ms=TS),
        build_batch([Record(b"c", timestamp_ms=TS)] * 3, base_offset=3, compression=Compression.GZIP),
    ]
    buf = b"".join(batches)
    ends = [sum(len(b) for b in batches[: i + 1]) for i in range(len(batches))]
    for cut in range(len(buf) + 1):
        infos = list(record_set.iter_batches(buf[:cut]))
        assert [i.position + i.size for i in infos] == [e for e in ends if e <= cut]
    assert [r.offset for r in record_set.iter_records(buf)] == [0, 1, 3, 4, 5]
    assert [r.offset for r in record_set.iter_records(buf, include_control=True)] == [0, 1, 2, 3, 4, 5]
    assert [r.offset for r in record_set.iter_records(buf, min_offset=1)] == [1, 3, 4, 5]
    assert [r.offset for r in record_set.iter_records(buf, min_offset=4)] == [4, 5]
    assert [r.offset for r in record_set.iter_records(buf, min_offset=6)] == []
    assert [r.offset for r in record_set.iter_records(buf, start=ends[0])] == [3, 4, 5]


def test_batch_header_properties() -> None:
    header = BatchHeader(0, 49, -1, 2, 0, 0x7B, 0, -1, -1, -1, -1, -1, 0)  # lz4 | LAT | txn | control | horizon
    assert header.compression is Compression.LZ4
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert (header.is_transactional, header.is_control, header.delete_horizon_ms) == (True, True, -1)
    assert TimestampType.from_name("LogAppendTime") is TimestampType.LOG_APPEND_TIME
    assert TimestampType.CREATE_TIME.kafka_name == "CreateTime"
    with pytest.raises(ValueError):
        TimestampType.from_name("logappendtime")


# --- the record check of a produced batch (record_check.check_batch_records, Kafka's LogValidator) --------------


def _random_batch(rng: random.Random, count: int, codec: Compression) -> bytes:
    def blob(limit: int) -> bytes | None:
        return None if rng.random() < 0.2 else rng.randbytes(rng.choice((rng.randrange(limit), limit)))

    # Records of one layout ("same", "keyed", "tiny", "clock") take the run path; "clock" has timestamp deltas
    # that grow past one byte (and sometimes past two, which runs leave to the general way); "varied" records
    # take the general way (a loop for few records, numpy for more).
    shape = rng.choice(("same", "keyed", "tiny", "clock", "varied"))
    if shape == "tiny":  # 7-byte records: several at the end of the batch, where the numpy path walks instead
        return build_batch([Record(value=None, timestamp_ms=TS) for _ in range(count)], compression=codec)
    if shape == "varied":
        records = [
            Record(
                value=blob(300),
                key=blob(20),
                timestamp_ms=TS + rng.randrange(-20_000, 20_000),
                headers=[] if rng.random() < 0.7 else [(f"h{j}", blob(5)) for j in range(rng.randrange(3))],
            )
            for _ in range(count)
        ]
    else:
        step = rng.choice((1, 3, 70)) if shape == "clock" else 0
        key = rng.randbytes(rng.choice((1, 5, 200))) if shape == "keyed" else None
        records = [Record(value=b"v" * 30, key=key, timestamp_ms=TS + i * step) for i in range(count)]
    return build_batch(records, compression=codec)


def _outcome(batch: bytes) -> object:
    try:
        return record_check.check_batch_records(batch, 0, read_header(batch))
    except CorruptRecordError:
        return "corrupt"


def _outcomes_of_each_way(batch: bytes, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """check_batch_records made to go each of its ways: every record walked by the loop; the general numpy path
    (the run path left out); runs for all records (none left to the final walk), checked with numpy, and with bytes
    operations wherever they apply (on a copy of the batch, and on strided slices of the caller's buffer); and as
    configured."""
    outcomes = {"as configured": _outcome(batch)}
    ways: dict[str, dict[str, object]] = {
        "loop": {"RUN_WALK_MAX": 10**9},
        "numpy": {"_check_runs": lambda *_args: None, "FEW_RECORDS": 0},
        "runs": {"RUN_WALK_MAX": 0, "RUN_BYTES_ROWS": 0},
        "runs by bytes": {"RUN_WALK_MAX": 0, "RUN_BYTES_ROWS": 10**9, "RUN_BYTES_MAX": 10**9},
        "runs by bytes, not copied": {"RUN_WALK_MAX": 0, "RUN_BYTES_MAX": 0, "RUN_VIEW_BYTES_ROWS": 10**9},
    }
    for way, knobs in ways.items():
        with monkeypatch.context() as patch:
            for name, value in knobs.items():
                patch.setattr(record_check, name, value)
            outcomes[way] = _outcome(batch)
    return outcomes


@pytest.mark.parametrize("seed", range(8))
def test_check_batch_records_ways_agree_with_the_decoders(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way of checking (a loop, numpy over all records, runs of records laid out alike) gives the same answer
    for good batches and for batches with flipped record bytes (CRC made to fit); a batch they accept decodes, with
    the maximum timestamp and the count of keyless records they report."""
    rng = random.Random(seed)
    accepted = set()
    for trial in range(40):
        count = rng.choice((1, 2, 7, 17, 40, 64, 65, 70, 150, 200, 300))
        codec = rng.choice((Compression.NONE, Compression.NONE, Compression.GZIP, Compression.ZSTD))
        good = _random_batch(rng, count, codec)
        section = bytearray(decompress(codec, good[HEADER_SIZE:]))
        if trial % 4:
            for _ in range(rng.randrange(1, 3)):
                section[rng.randrange(len(section))] = rng.randrange(256)
        header = read_header(good)
        batch = assemble(
            compress(codec, bytes(section)) if codec else bytes(section),
            count,
            attributes=header.attributes,
            base_timestamp=header.base_timestamp,
            max_timestamp=header.max_timestamp,
            last_offset_delta=count - 1,
        )
        outcomes = _outcomes_of_each_way(batch, monkeypatch)
        assert len(set(map(str, outcomes.values()))) == 1, (seed, trial, outcomes)
        outcome = outcomes["loop"]
        accepted.add(outcome != "corrupt")
        if outcome != "corrupt":
            assert isinstance(outcome, record_check.RecordsCheck)
            decoded = decode_records(batch)
            assert len(decoded) == count
            assert outcome.max_timestamp == max(r.timestamp_ms for r in decoded)
            assert outcome.keyless == sum(r.key is None for r in decoded)
            if trial % 4 == 0:
                assert normalized(decoded) == normalized(decode_records(good))
    assert accepted == {True, False}


@pytest.mark.parametrize("count", [8191, 8192, 8300])
def test_check_batch_records_runs_across_three_byte_offset_deltas(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offset deltas of 8192 and more take three bytes: runs read them with the byte after. A damaged delta in that
    range, a record made longer and a timestamp delta grown a byte are all found, as by the loop."""
    records = [Record(value=b"x" * 3, timestamp_ms=TS + i % 50) for i in range(count)]
    good = build_batch(records)
    assert _outcomes_of_each_way(good, monkeypatch)["runs"] == (TS + 49, count)
    section = good[HEADER_SIZE:]
    record_size = 1 + len(section) // count  # about: the records grow by a byte at 64 and 8192
    last = len(section) - 10  # inside the last record
    for at in (last - 3 * record_size, last - 2, len(section) // 2, 5):
        for value in (0x00, 0x7F, 0x80, 0xFF):
            damaged = bytearray(section)
            damaged[at] = value
            batch = assemble(bytes(damaged), count, max_timestamp=TS + 49)
            outcomes = _outcomes_of_each_way(batch, monkeypatch)
            assert len(set(map(str, outcomes.values()))) == 1, (at, value, outcomes)


@pytest.mark.parametrize("record", [0, 1, 40, 62, 63, 64, 65, 99])
def test_check_batch_records_refuses_a_negative_offset_delta(record: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """An offset delta whose zig-zag byte is odd is negative (-(n + 1) for byte 2n + 1), never record n's index:
    refused wherever the record stands (first of a run, alone before the delta grows a byte, walked at the end)."""
    count = 100
    section = bytearray(build_batch([Record(value=None, timestamp_ms=TS) for _ in range(count)])[HEADER_SIZE:])
    at = 0
    for _ in range(record):
        length, body = decode_varint(section, at)
        at = body + length
    delta_at = decode_varint(section, at)[1] + 2  # after the length, the attributes and a one-byte timestamp delta
    section[delta_at] |= 1
    outcomes = _outcomes_of_each_way(assemble(bytes(section), count), monkeypatch)
    assert set(outcomes.values()) == {"corrupt"}, outcomes


def test_check_batch_records_reports_what_is_wrong() -> None:
    good = build_batch([Record(b"value %d" % i, timestamp_ms=TS + i) for i in range(3)])
    header = read_header(good)
    too_many = bytearray(good)
    struct.pack_into(">i", too_many, 57, 4)
    with pytest.raises(CorruptRecordError, match="record 3"):
        record_check.check_batch_records(bytes(too_many), 0, header._replace(records_count=4))
    assert record_check.check_batch_records(good, 0, header) == (TS + 2, 3)
    stamped = bytearray(good)
    set_log_append_time(stamped, 0, len(stamped), TS + 99)  # LogAppendTime: every record has maxTimestamp
    assert record_check.check_batch_records(bytes(stamped), 0, read_header(bytes(stamped))).max_timestamp == TS + 99
