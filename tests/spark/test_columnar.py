"""The columnar decoder (codec/batch_chain.py's batch_table, codec/batch_columns.py, codec/record_columns.py) and
its Arrow form (spark/arrow.py) against the row decoder.

Pure tests, no JVM: random batch runs (sizes, codecs, null keys and values, headers, offset gaps, negative
timestamp deltas, LogAppendTime) must decode to exactly what `record_set.decode_batch` gives; framing errors
must raise CorruptRecordError naming the batch.
"""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.codec.batch_chain import ChainEnd, Stop, Window, batch_table, scan_chain
from tidelog.codec.batch_columns import decode_v2
from tidelog.codec.batch_table import BatchTable
from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import Record, TimestampType, build_batch
from tidelog.codec.record_columns import RecordColumns, from_records
from tidelog.codec.record_set import decode_batch, iter_batches
from tidelog.errors import CorruptRecordError

pa = pytest.importorskip("pyarrow")
from tidelog.spark.arrow import SCHEMA_WITH_HEADERS, to_record_batch  # noqa: E402


def table_of(data: bytes) -> BatchTable:
    """The entries of `data` as the Spark source's table (batch_chain's walk); a damaged chain is a
    CorruptRecordError."""
    chain = scan_chain(data)
    if chain.end.stop.is_damage:
        raise CorruptRecordError(str(chain.end))
    return batch_table(Window(data, 0, chain.positions, chain.sizes))


def row_decode(data: bytes) -> list[Record]:
    return [r for info in iter_batches(data) if not info.is_control for r in decode_batch(data, info)]


def as_records(cols: RecordColumns) -> list[Record]:
    data = bytes(cols.data)

    def blob(start: int, length: int) -> bytes | None:
        return None if length < 0 else data[start : start + length]

    out = []
    h = 0
    for i in range(len(cols)):
        headers = []
        for _ in range(int(cols.header_count[i])):
            key = blob(int(cols.header_key_start[h]), int(cols.header_key_length[h]))
            assert key is not None
            headers.append(
                (
                    key.decode("utf-8", "surrogateescape"),
                    blob(int(cols.header_value_start[h]), int(cols.header_value_length[h])),
                )
            )
            h += 1
        out.append(
            Record(
                blob(int(cols.value_start[i]), int(cols.value_length[i])),
                blob(int(cols.key_start[i]), int(cols.key_length[i])),
                int(cols.timestamp[i]),
                headers,
                int(cols.offset[i]),
            )
        )
    return out


record_strategy = st.builds(
    Record,
    value=st.one_of(st.none(), st.binary(max_size=300)),
    key=st.one_of(st.none(), st.binary(max_size=20)),
    timestamp_ms=st.integers(min_value=0, max_value=1 << 44),
    headers=st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))), max_size=3),
)
batch_strategy = st.tuples(
    st.lists(record_strategy, min_size=1, max_size=40),
    st.sampled_from(list(Compression)),
    st.booleans(),  # LogAppendTime
    st.integers(min_value=0, max_value=3),  # offset gap per record (compaction)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batch_strategy, min_size=1, max_size=12))
def test_random_batches_match_the_row_decoder(batches: list[tuple[list[Record], Compression, bool, int]]) -> None:
    parts = []
    offset = 0
    for records, codec, log_append, gap in batches:
        deltas = [i * (gap + 1) for i in range(len(records))]
        parts.append(
            build_batch(
                records,
                base_offset=offset,
                compression=codec,
                timestamp_type=TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME,
                offset_deltas=deltas,
            )
        )
        offset += deltas[-1] + 1
    data = b"".join(parts)
    table = table_of(data)
    assert len(table) == len(batches)
    decoded = as_records(decode_v2(data, table))
    assert decoded == row_decode(data)


@pytest.mark.parametrize("per_batch", [1, 3, 64, 1000, 9000])
@pytest.mark.parametrize("value_size", ["fixed", "variable"])
def test_framing_paths_agree(per_batch: int, value_size: str) -> None:
    """Equal-sized runs, lockstep and the Python walk all frame the same records."""
    rng = random.Random(per_batch)
    parts = []
    offset = 0
    total = 0
    batches = max(1, 20_000 // per_batch)
    for _ in range(min(batches, 200)):
        records = [
            Record(
                value=os.urandom(100 if value_size == "fixed" else rng.randrange(0, 200)),
                key=b"key-%06d" % i,
                timestamp_ms=1_700_000_000_000 + i * rng.choice([1, 3, 1000]),
            )
            for i in range(per_batch)
        ]
        parts.append(build_batch(records, base_offset=offset))
        offset += per_batch
        total += per_batch
    data = b"".join(parts)
    cols = decode_v2(data, table_of(data))
    assert len(cols) == total
    assert as_records(cols) == row_decode(data)


def test_partial_tail_is_not_a_batch() -> None:
    one = build_batch([Record(value=b"a")])
    two = build_batch([Record(value=b"b")], base_offset=1)
    data = one + two[:-3]
    table = table_of(data)
    assert len(table) == 1 and table.end == len(one)
    assert len(table_of(one[:30])) == 0


def test_corrupt_framing_raises_naming_the_batch() -> None:
    good = build_batch([Record(value=b"x" * 10, key=b"k") for _ in range(3)])
    data = bytearray(good * 2)
    second = len(good)
    data[second + 61] = 0x7E  # first record of the second batch claims 63 bytes
    with pytest.raises(CorruptRecordError, match=f"batch at byte {second}"):
        decode_v2(bytes(data), table_of(bytes(data)))
    struct.pack_into(">i", data, 8, 5)  # a size no message format allows
    detail = "entry declares size 5, smaller than any message format allows"
    assert scan_chain(bytes(data)).end == ChainEnd(0, Stop.BAD_SIZE, detail)


def test_select_keeps_headers_with_their_records() -> None:
    records = [
        Record(value=b"%d" % i, timestamp_ms=i, headers=[("h", b"%d" % i)] * (i % 3), offset=i) for i in range(9)
    ]
    cols = from_records(records)
    picked = cols.select(np.array([i % 2 == 0 for i in range(9)]))
    assert as_records(picked) == [r for r in records if int(r.value) % 2 == 0]


def test_arrow_batch_matches_sparks_schema_and_values() -> None:
    records = [
        Record(value=None, key=b"k", timestamp_ms=1_000, headers=[("a", b"1"), ("b", None)]),
        Record(value=b"v", key=None, timestamp_ms=2_000),
    ]
    data = build_batch(records, base_offset=40)
    batch = to_record_batch(decode_v2(data, table_of(data)), "t", 3, include_headers=True)
    assert batch.schema.equals(SCHEMA_WITH_HEADERS)
    got = batch.to_pylist()
    assert [(r["key"], r["value"], r["offset"], r["partition"], r["topic"]) for r in got] == [
        (b"k", None, 40, 3, "t"),
        (None, b"v", 41, 3, "t"),
    ]
    assert got[0]["headers"] == [{"key": "a", "value": b"1"}, {"key": "b", "value": None}]
    assert got[0]["timestamp"].timestamp() == 1.0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(batch_strategy, min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), min_size=1, max_size=6),
)
def test_damaged_bytes_raise_corrupt_record_or_decode_like_the_row_decoder(
    batches: list[tuple[list[Record], Compression, bool, int]], flips: list[tuple[int, int]]
) -> None:
    """Bytes damaged after the CRC check (or with checks off): a clear CorruptRecordError, never another
    exception, and when it does decode, the row decoder agrees."""
    data = bytearray(b"".join(build_batch(records, compression=codec) for records, codec, _, _ in batches))
    for where, value in flips:
        position = 61 + where % max(1, len(data) - 61)  # leave the first header alone: the chain stays walkable
        data[position] = value
    raw = bytes(data)
    try:
        table = table_of(raw)
        v2 = table.take((table.magic == 2) & ~table.is_control)  # decode_v2's contract, as the source calls it
        cols = decode_v2(raw, v2)
    except CorruptRecordError:
        return
    try:
        expected = row_decode(raw)
    except CorruptRecordError:
        return  # the row decoder checks more (e.g. control records), so it may refuse what columns accepted
    assert as_records(cols) == [r for r in expected]


def test_impossible_counts_fail_fast() -> None:
    """A damaged record or header count must not size an allocation or a loop (it would hang or exhaust memory)."""
    batch = bytearray(build_batch([Record(value=b"v", key=b"k", headers=[("h", b"1")]) for _ in range(3)]))
    struct.pack_into(">i", batch, 57, 1 << 30)  # recordsCount
    with pytest.raises(CorruptRecordError, match="declares 1073741824 records"):
        decode_v2(bytes(batch), table_of(bytes(batch)))
    batch = bytearray(build_batch([Record(value=b"v", key=b"k", headers=[("h", b"1")])]))
    header_count_at = len(batch) - 1 - 1 - 1 - 1 - 1  # ... | headerCount | keyLen 'h' | valLen '1'
    assert batch[header_count_at] == 2  # zig-zag 1
    batch[header_count_at] = 0x7E  # 63 headers in a 10-byte record
    with pytest.raises(CorruptRecordError, match="more headers than it has bytes for"):
        decode_v2(bytes(batch), table_of(bytes(batch)))
