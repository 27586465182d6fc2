"""Legacy message sets (magic 0/1) and record sets a real Kafka broker wrote (tests/fixtures/kafka-written), and the
walk along their chain of entries (codec/batch_chain.py)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.codec import batch_chain, legacy, record_set
from tidelog.codec.batch_chain import ChainReader, Stop, check_stored, scan_chain
from tidelog.codec.compression import Compression, compress, xerial_compress, xxh32_short
from tidelog.codec.record_batch import BatchHeader, Record, TimestampType, build_batch, check_batch
from tidelog.errors import (
    CorruptRecordError,
    CrcMismatchError,
    TidelogError,
    TruncatedBatchError,
    UnsupportedMagicError,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kafka-written"
EXPECTED: dict[str, list[dict]] = json.loads((FIXTURES / "expected.json").read_text())
FIXTURE_NAMES = sorted(EXPECTED)
WITH_LEGACY = [name for name in FIXTURE_NAMES if any(e["magic"] < 2 for e in EXPECTED[name])]
TS = 1_700_000_000_000


def load(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def as_bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def expected_records(name: str) -> list[tuple]:
    return [(e["offset"], e["timestamp_ms"], as_bytes(e["key"]), as_bytes(e["value"])) for e in EXPECTED[name]]


# --- the fixtures themselves ---------------------------------------------------------------------------------


def test_fixture_copies_are_complete() -> None:
    files = sorted(p.name for p in FIXTURES.glob("*.records"))
    assert len(files) == 11
    assert files == FIXTURE_NAMES
    assert (FIXTURES / "README.md").read_text().startswith("# Record sets written by a real Apache Kafka broker")


# --- decoding them -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_decodes_to_expected(name: str) -> None:
    buf = load(name)
    got = [(r.offset, r.timestamp_ms, r.key, r.value) for r in record_set.iter_records(buf)]
    assert got == expected_records(name)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_magic_and_codec_per_record(name: str) -> None:
    buf = load(name)
    got = []
    for info in record_set.iter_batches(buf):
        for r in record_set.decode_batch(buf, info):
            got.append(
                {
                    "offset": r.offset,
                    "timestamp_ms": r.timestamp_ms,
                    "key": None if r.key is None else r.key.decode(),
                    "value": None if r.value is None else r.value.decode(),
                    "magic": info.magic,
                    "codec": int(info.compression),
                }
            )
    assert got == EXPECTED[name]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_batches_are_valid_and_consistent(name: str) -> None:
    buf = load(name)
    infos = list(record_set.iter_batches(buf))
    assert sum(i.size for i in infos) == len(buf)  # the batches tile the file
    for info in infos:
        assert record_set.is_valid(buf, info)
        records = record_set.decode_batch(buf, info)
        assert info.last_offset == records[-1].offset
        assert info.next_offset == records[-1].offset + 1
        assert info.timestamp_type is (TimestampType.CREATE_TIME if info.magic else TimestampType.NO_TIMESTAMP_TYPE)
        if info.magic == 2:
            assert isinstance(info.header, BatchHeader)
            check_batch(buf, info.position)
            assert info.base_offset == records[0].offset
            assert info.count == len(records)
            assert info.max_timestamp == max(r.timestamp_ms for r in records)
        else:
            assert isinstance(info.header, legacy.LegacyMessage)
            legacy.check_legacy_message(buf, info.position)
            assert info.count is None
            if info.compression is Compression.NONE:
                assert info.base_offset == info.last_offset == records[0].offset
                assert len(records) == 1
            else:
                assert info.base_offset == -1  # known only after decompression
                assert [r.offset for r in records] == list(range(records[0].offset, info.last_offset + 1))
                for inner in legacy.inner_messages(info.header):
                    assert inner.magic == info.magic
                    assert zlib.crc32(inner_bytes(inner)) == inner.crc  # Kafka's inner CRCs hold too


def inner_bytes(message: legacy.LegacyMessage) -> bytes:
    """Re-encode an inner message from its fields (magic .. end), to check its CRC independently."""
    out = struct.pack(">bb", message.magic, message.attributes)
    if message.magic == 1:
        out += struct.pack(">q", message.timestamp)
    for field in (message.key, message.value):
        out += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    return out


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_min_offset(name: str) -> None:
    buf = load(name)
    expected = expected_records(name)
    for min_offset in range(expected[-1][0] + 2):
        got = [(r.offset, r.timestamp_ms, r.key, r.value) for r in record_set.iter_records(buf, min_offset=min_offset)]
        assert got == [e for e in expected if e[0] >= min_offset]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_truncated_tail_yields_only_complete_batches(name: str) -> None:
    buf = load(name)
    infos = list(record_set.iter_batches(buf))
    ends = [i.position + i.size for i in infos]
    per_batch = [len(record_set.decode_batch(buf, i)) for i in infos]
    expected = expected_records(name)
    for cut in range(len(buf)):
        short = buf[:cut]
        complete = [e for e in ends if e <= cut]
        assert [i.position + i.size for i in record_set.iter_batches(short)] == complete
        records = [(r.offset, r.timestamp_ms, r.key, r.value) for r in record_set.iter_records(short)]
        assert records == expected[: sum(per_batch[: len(complete)])]


@pytest.mark.parametrize("name", WITH_LEGACY)
def test_fixture_flipped_bytes_in_legacy_messages(name: str) -> None:
    """Any flipped byte between the CRC and the end of a legacy message: an invalid CRC, or a read error."""
    buf = load(name)
    legacy_infos = [i for i in record_set.iter_batches(buf) if i.magic in (0, 1)]
    assert legacy_infos
    for info in legacy_infos:
        message = info.header
        assert isinstance(message, legacy.LegacyMessage)
        start, end = info.position, info.position + info.size
        value_start = end - len(message.value or b"")
        for pos in [*range(start + 12, start + 16), *range(start + 17, end)]:  # crc; attributes .. end
            damaged = bytearray(buf)
            damaged[pos] ^= 0x24
            try:
                damaged_info = next(i for i in record_set.iter_batches(damaged) if i.position == start)
            except CorruptRecordError:
                assert pos < value_start, "a flip inside the value must still parse"
                continue
            assert not record_set.is_valid(damaged, damaged_info)
            with pytest.raises(CrcMismatchError):
                legacy.check_legacy_message(damaged, start)


# --- the chain walk over the fixtures ------------------------------------------------------------------------


def entry_bounds(buf: bytes) -> list[tuple[int, int]]:
    """(position, size) of each entry, from the record-set decoder."""
    return [(i.position, i.size) for i in record_set.iter_batches(buf)]


def read_chain(path: Path, end: int, window: int, *, whole: bool = True) -> tuple[list[tuple[int, int]], object]:
    """The entries (file positions) and the stop a ChainReader finds in the first `end` bytes of `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chain = ChainReader(fd, 0, end, window=window, first_window=max(1, window // 3), whole=whole)
        found = [(w.position + p, s) for w in chain for p, s in zip(w.positions, w.sizes, strict=True)]
        return found, chain.stopped
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_chain_walk_finds_every_entry(name: str) -> None:
    buf = load(name)
    for whole in (True, False):
        chain = scan_chain(buf, whole=whole)
        assert list(zip(chain.positions, chain.sizes, strict=True)) == entry_bounds(buf)
        assert chain.end == batch_chain.ChainEnd(len(buf), Stop.END)
    batches, failure = check_stored(batch_chain.Window(buf, 0, chain.positions, chain.sizes), -1, 0)
    assert failure is None
    assert [(b.position, b.size) for b in batches] == entry_bounds(buf)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_chain_walk_of_every_truncation(name: str, tmp_path: Path) -> None:
    """A cut anywhere ends the chain quietly after the last whole entry: END on an entry boundary, TORN_TAIL when
    the size field itself is cut, BEYOND_END when the entry it declares runs past the end. A file read in windows
    (of any size, even smaller than one entry) gives the same; a walk over headers keeps an entry whose header is
    all there only when its body is too (the file ends there)."""
    buf = load(name)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(buf)
    bounds = entry_bounds(buf)
    for cut in range(len(buf) + 1):
        whole = [(p, s) for p, s in bounds if p + s <= cut]
        end = whole[-1][0] + whole[-1][1] if whole else 0
        expected = Stop.END if end == cut else Stop.TORN_TAIL if cut - end < 17 else Stop.BEYOND_END
        chain = scan_chain(buf[:cut])
        assert list(zip(chain.positions, chain.sizes, strict=True)) == whole, cut
        assert (chain.end.position, chain.end.stop) == (end, expected), cut
        for window in (7, 200):
            found, stopped = read_chain(path, cut, window)
            assert found == whole and stopped == chain.end, (cut, window)
            assert read_chain(path, cut, window, whole=False) == (found, stopped), (cut, window)


def test_chain_walk_says_where_and_why_it_stops() -> None:
    good = build_batch([Record(b"v", timestamp_ms=TS)], base_offset=0)
    legacy_entry = message(1, b"k", b"v")
    damaged_cases = [
        (struct.pack(">qi", 2, 13) + bytes(40), Stop.BAD_SIZE, "declares size 13"),
        (struct.pack(">qiib", 2, 40, 0, 2) + bytes(40), Stop.BAD_SIZE, "batchLength 40"),
        (struct.pack(">qiib", 2, 40, 0, 7) + bytes(40), Stop.BAD_MAGIC, "unknown magic 7"),
        (struct.pack(">qiib", 2, 40, 0, -1) + bytes(40), Stop.BAD_MAGIC, "unknown magic -1"),
    ]
    for tail, stop, detail in damaged_cases:
        chain = scan_chain(good + legacy_entry + tail)
        assert chain.positions == [0, len(good)]
        assert chain.end.position == len(good) + len(legacy_entry)
        assert chain.end.stop is stop and stop.is_damage and detail in chain.end.detail
        assert str(chain.end).startswith(f"at byte {chain.end.position}: ")
        with pytest.raises(CorruptRecordError):  # the record-set decoder refuses the same bytes
            list(record_set.iter_batches(good + legacy_entry + tail))
    # an entry being written: its declared size runs past the end, whatever its (not yet written) magic
    torn = struct.pack(">qiib", 2, 500, 0, 9) + bytes(40)
    assert scan_chain(good + torn).end == batch_chain.ChainEnd(
        len(good), Stop.BEYOND_END, f"entry declares 512 bytes, {len(torn)} are left"
    )


def test_recovery_checks_stop_at_the_first_bad_batch() -> None:
    batches = [build_batch([Record(b"v%d" % i, timestamp_ms=TS + i)], base_offset=10 + i) for i in range(3)]
    buf = b"".join(batches)
    chain = scan_chain(buf)
    window = batch_chain.Window(buf, 1000, chain.positions, chain.sizes)  # read at file byte 1000
    passed, failure = check_stored(window, 9, 10)
    assert [(b.position, b.last_offset) for b in passed] == [(1000 + p, 10 + n) for n, p in enumerate(chain.positions)]
    assert failure is None
    passed, failure = check_stored(window, 10, 10)  # offset 10 is already in the log
    assert passed == [] and failure is not None and failure.stop is Stop.BAD_OFFSETS and failure.position == 1000
    passed, failure = check_stored(window, -1, 11)  # offset 10 is below the segment's base
    assert passed == [] and failure is not None and "off the segment" in failure.detail
    flipped = bytearray(buf)
    flipped[len(batches[0]) + 65] ^= 1  # inside the second batch's records
    chain = scan_chain(flipped)
    passed, failure = check_stored(batch_chain.Window(bytes(flipped), 0, chain.positions, chain.sizes), 9, 10)
    assert len(passed) == 1 and failure == batch_chain.ChainEnd(
        len(batches[0]), Stop.BAD_CRC, "batch fails its CRC check"
    )


# --- hand-built legacy messages ------------------------------------------------------------------------------


def message(
    offset: int,
    key: bytes | None,
    value: bytes | None,
    *,
    magic: int = 1,
    attributes: int = 0,
    timestamp: int = TS,
    crc: int | None = None,
) -> bytes:
    """One legacy entry, encoded independently of the module under test."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body) if crc is None else crc) + body


def wrapper(
    offset: int, inner: bytes, codec: Compression, *, magic: int = 1, timestamp: int = TS, lat: bool = False
) -> bytes:
    packed = compress(codec, inner)
    if codec is Compression.LZ4 and magic == 0:  # Kafka 0.8's broken header checksum over magic + descriptor
        packed = packed[:6] + bytes([(xxh32_short(packed[:6]) >> 8) & 0xFF]) + packed[7:]
    return message(offset, None, packed, magic=magic, attributes=int(codec) | (0x08 if lat else 0), timestamp=timestamp)


def decoded(buf: bytes) -> list[tuple]:
    return [(r.offset, r.timestamp_ms, r.key, r.value, list(r.headers)) for r in record_set.iter_records(buf)]


@pytest.mark.parametrize("magic", [0, 1])
def test_uncompressed_legacy_messages(magic: int) -> None:
    buf = (
        message(10, b"k", b"v", magic=magic, timestamp=TS)
        + message(11, None, b"", magic=magic, timestamp=TS + 1)
        + message(12, b"", None, magic=magic, timestamp=TS + 2)
    )
    ts = [TS, TS + 1, TS + 2] if magic == 1 else [-1, -1, -1]
    assert decoded(buf) == [(10, ts[0], b"k", b"v", []), (11, ts[1], None, b"", []), (12, ts[2], b"", None, [])]
    infos = list(record_set.iter_batches(buf))
    assert [(i.magic, i.base_offset, i.last_offset, i.count, i.size) for i in infos] == [
        (magic, 10, 10, None, len(message(0, b"k", b"v", magic=magic))),
        (magic, 11, 11, None, len(message(0, None, b"", magic=magic))),
        (magic, 12, 12, None, len(message(0, b"", None, magic=magic))),
    ]
    assert all(record_set.is_valid(buf, i) for i in infos)
    expected_type = TimestampType.CREATE_TIME if magic == 1 else TimestampType.NO_TIMESTAMP_TYPE
    assert {i.timestamp_type for i in infos} == {expected_type}


CODECS_V0_V1 = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4]


@pytest.mark.parametrize("codec", CODECS_V0_V1)
def test_compressed_magic1_inner_offsets_are_relative(codec: Compression) -> None:
    inner = b"".join(message(i, b"k%d" % i, b"v" * 30, timestamp=TS + i) for i in range(3))
    buf = wrapper(102, inner, codec)  # the wrapper carries the absolute offset of the last inner message
    assert decoded(buf) == [(100 + i, TS + i, b"k%d" % i, b"v" * 30, []) for i in range(3)]
    [info] = record_set.iter_batches(buf)
    assert (info.base_offset, info.last_offset, info.compression) == (-1, 102, codec)


@pytest.mark.parametrize("codec", CODECS_V0_V1)
def test_compressed_magic0_inner_offsets_are_absolute(codec: Compression) -> None:
    """Magic 0 lz4 carries the broken header checksum: the reader must accept it."""
    inner = b"".join(message(50 + i, None, b"value-%d" % i * 5, magic=0) for i in range(3))
    buf = wrapper(52, inner, codec, magic=0)
    assert decoded(buf) == [(50 + i, -1, None, b"value-%d" % i * 5, []) for i in range(3)]


def test_magic1_lz4_with_the_broken_checksum_is_corrupt() -> None:
    """Only magic 0 gets the broken-checksum tolerance."""
    inner = message(0, None, b"x" * 100)
    packed = compress(Compression.LZ4, inner)
    packed = packed[:6] + bytes([(xxh32_short(packed[:6]) >> 8) & 0xFF]) + packed[7:]
    buf = message(0, None, packed, attributes=int(Compression.LZ4))
    with pytest.raises(CorruptRecordError, match="lz4"):
        list(record_set.iter_records(buf))


def test_xerial_snappy_wrapper() -> None:
    inner = b"".join(message(i, None, b"%d" % i * 40_000) for i in range(2))  # > one 32 KiB xerial block
    buf = message(1, None, xerial_compress(inner), attributes=int(Compression.SNAPPY))
    assert [(r.offset, r.value) for r in record_set.iter_records(buf)] == [(i, b"%d" % i * 40_000) for i in range(2)]


def test_log_append_time_wrapper_stamps_inner_records() -> None:
    inner = b"".join(message(i, None, b"v", timestamp=TS + i) for i in range(2))
    buf = wrapper(1, inner, Compression.GZIP, timestamp=TS + 777, lat=True)
    assert [r.timestamp_ms for r in record_set.iter_records(buf)] == [TS + 777, TS + 777]
    [info] = record_set.iter_batches(buf)
    assert info.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert info.max_timestamp == TS + 777
    plain = message(5, None, b"v", attributes=0x08, timestamp=TS + 9)
    [info] = record_set.iter_batches(plain)
    assert info.timestamp_type is TimestampType.LOG_APPEND_TIME


def test_mixed_magic_record_set() -> None:
    buf = (
        message(0, None, b"a", magic=0)
        + wrapper(2, message(0, None, b"b") + message(1, None, b"c"), Compression.GZIP)
        + build_batch([Record(b"d", timestamp_ms=TS)], base_offset=3)
    )
    assert [(r.offset, r.value) for r in record_set.iter_records(buf)] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert [i.magic for i in record_set.iter_batches(buf)] == [0, 1, 2]


def test_magic1_wrapper_with_unassigned_offset_keeps_relative_offsets() -> None:
    inner = b"".join(message(i, None, b"v%d" % i) for i in range(3))
    buf = wrapper(0, inner, Compression.GZIP)
    assert [r.offset for r in legacy.decode_legacy_records(buf)] == [0, 1, 2]
    assert [r.offset for r in record_set.iter_records(buf)] == [0, 1, 2]


# --- bad legacy bytes ----------------------------------------------------------------------------------------


def test_legacy_message_fields() -> None:
    buf = message(7, b"key", b"value", attributes=0x08, timestamp=TS)
    parsed = legacy.check_legacy_message(buf)
    assert parsed == legacy.LegacyMessage(0, 7, len(buf) - 12, zlib.crc32(buf[16:]), 1, 0x08, TS, b"key", b"value")
    assert parsed.size_in_bytes == len(buf)
    assert parsed.compression is Compression.NONE
    assert legacy.legacy_crc(buf, parsed) == parsed.crc


def test_legacy_crc_mismatch() -> None:
    buf = message(0, b"k", b"v", crc=12345)
    with pytest.raises(CrcMismatchError):
        legacy.check_legacy_message(buf)
    [info] = record_set.iter_batches(buf)
    assert not record_set.is_valid(buf, info)


@pytest.mark.parametrize("magic", [0, 1])
def test_every_truncation_of_a_legacy_message(magic: int) -> None:
    buf = message(3, b"key", b"value" * 10, magic=magic)
    for cut in range(len(buf)):
        with pytest.raises(TruncatedBatchError):
            legacy.read_legacy_message(buf[:cut])
        assert list(record_set.iter_batches(buf[:cut])) == []


def entry(offset: int, body: bytes) -> bytes:
    """offset | size | crc | body, with a correct CRC, for bodies that break the layout."""
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + body


@pytest.mark.parametrize(
    ("buf", "error"),
    [
        (entry(0, struct.pack(">bbii", 5, 0, -1, -1)), UnsupportedMagicError),
        (entry(0, struct.pack(">bbii", 1, 0, -1, -1)), CorruptRecordError),  # v1 without the timestamp: size 14 < 22
        (entry(0, struct.pack(">bbqii", 1, 0, TS, 5, -1)), CorruptRecordError),  # key runs past the end
        (entry(0, struct.pack(">bbqii", 1, 0, TS, -1, 9) + b"short"), CorruptRecordError),  # value too
        (entry(0, struct.pack(">bbqii", 1, 0, TS, -1, 1) + b"ab"), CorruptRecordError),  # a byte after the value
        (entry(0, struct.pack(">bbii", 0, 0, -1, -1) + b"\x00" * 4), CorruptRecordError),
        (entry(0, struct.pack(">bbqii", 1, 4, TS, -1, 3) + b"abc"), CorruptRecordError),  # no zstd in v0/v1
        (entry(0, struct.pack(">bbqii", 1, 7, TS, -1, 3) + b"abc"), CorruptRecordError),
        (entry(0, struct.pack(">bbqii", 1, 1, TS, -1, -1)), CorruptRecordError),  # compressed, null value
        (entry(0, struct.pack(">bbqii", 1, 1, TS, -1, 3) + b"abc"), CorruptRecordError),  # not gzip
    ],
)
def test_malformed_legacy_messages(buf: bytes, error: type) -> None:
    with pytest.raises(error):
        list(record_set.iter_records(buf))


def test_nested_compression_is_corrupt() -> None:
    inner_wrapper = wrapper(0, message(0, None, b"x"), Compression.GZIP)
    buf = wrapper(0, inner_wrapper, Compression.GZIP)
    with pytest.raises(CorruptRecordError, match="nests"):
        list(record_set.iter_records(buf))


def test_inner_garbage_is_corrupt() -> None:
    for inner in (message(0, None, b"x")[:-1], b"\x00" * 30, message(0, None, b"x") + b"\x01"):
        with pytest.raises(CorruptRecordError):
            list(record_set.iter_records(wrapper(0, inner, Compression.SNAPPY)))


def test_size_below_any_format_is_corrupt_not_a_tail() -> None:
    buf = struct.pack(">qi", 0, 13) + b"\x00" * 40
    with pytest.raises(CorruptRecordError) as info:
        list(record_set.iter_batches(buf))
    assert not isinstance(info.value, TruncatedBatchError)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([0, 1]),
    st.integers(0, 3),
    st.lists(st.tuples(st.none() | st.binary(max_size=10), st.none() | st.binary(max_size=30)), max_size=4),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
    st.booleans(),
)
def test_damaged_legacy_input_raises_only_tidelog_errors(
    magic: int, codec: int, fields: list, edits: list[tuple[int, int]], fix_crc: bool
) -> None:
    inner = bytearray(b"".join(message(i, k, v, magic=magic) for i, (k, v) in enumerate(fields)))
    for pos, value in edits:
        if pos < len(inner):
            inner[pos] = value
    buf = bytes(inner) if codec == 0 else wrapper(len(fields), bytes(inner), Compression(codec), magic=magic)
    if not fix_crc and edits and buf:  # also damage the outer message, behind a stale CRC
        damaged = bytearray(buf)
        pos, value = edits[0]
        damaged[pos % len(damaged)] = value
        buf = bytes(damaged)
    try:
        for info in record_set.iter_batches(buf):
            record_set.is_valid(buf, info)
            record_set.decode_batch(buf, info)
    except TidelogError:
        pass
