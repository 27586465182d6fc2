"""`__consumer_offsets` records in Kafka's formats, and Kafka's group-to-partition mapping."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.codec import group_records as records
from tidelog.errors import CorruptRecordError


@pytest.mark.parametrize(
    ("group", "java_hash", "partition"),
    [  # String.hashCode and Utils.abs(hash) % 50, computed with Java 17
        ("", 0, 0),
        ("G", 71, 21),
        ("my-group", -1906497762, 12),
        ("console-consumer-12345", 158455506, 6),
        ("äöü-grüppe", 1338630103, 3),
        ("a-very-long-group-id-that-overflows", 257496489, 39),
    ],
)
def test_group_partition_matches_kafka(group: str, java_hash: int, partition: int) -> None:
    assert records.java_string_hash(group) == java_hash
    assert records.partition_for_group(group, 50) == partition


def test_offset_commit_key_and_value_bytes() -> None:
    key = records.encode_key(records.OffsetKey("g", "t", 3))
    assert key == struct.pack(">hh", 1, 1) + b"g" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 3)
    value = records.encode_offset_value(records.OffsetValue(42, 7, "meta", 1_700_000_000_000))
    assert value == struct.pack(">hqih", 3, 42, 7, 4) + b"meta" + struct.pack(">q", 1_700_000_000_000)


def test_older_offset_value_versions_decode() -> None:
    v1 = struct.pack(">hqh", 1, 9, 1) + b"m" + struct.pack(">qq", 5, 99)
    assert records.decode_offset_value(v1) == records.OffsetValue(9, -1, "m", 5)
    v0 = struct.pack(">hqh", 0, 9, -1) + struct.pack(">q", 5)
    assert records.decode_offset_value(v0) == records.OffsetValue(9, -1, "", 5)


@given(
    group=st.text(max_size=30),
    generation=st.integers(0, 1 << 30),
    members=st.lists(
        st.tuples(
            st.text(min_size=1, max_size=20),
            st.none() | st.text(max_size=10),
            st.binary(max_size=50),
            st.binary(max_size=50),
        ),
        max_size=5,
    ),
)
def test_group_metadata_round_trip(
    group: str, generation: int, members: list[tuple[str, str | None, bytes, bytes]]
) -> None:
    value = records.GroupValue(
        "consumer",
        generation,
        "range",
        members[0][0] if members else None,
        123,
        tuple(records.MemberValue(m, i, "client", "/127.0.0.1", 300000, 45000, s, a) for m, i, s, a in members),
    )
    assert records.decode_group_value(records.encode_group_value(value)) == value
    assert records.decode_key(records.encode_key(records.GroupKey(group))) == records.GroupKey(group)


@pytest.mark.parametrize("data", [b"", b"\x00", struct.pack(">h", 9) + b"x", struct.pack(">hh", 1, 50) + b"short"])
def test_damaged_keys_are_corrupt_records(data: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        records.decode_key(data)
