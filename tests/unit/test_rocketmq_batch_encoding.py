"""The RocketMQ engine's batch-at-a-time paths against the record-at-a-time definitions they replace:

- codec/rocketmq_message.py's encode_records (over rocketmq_columns.decode_batch) makes the same bytes as
  encode_message of record_properties for each record of decode_records - keys null, empty, binary, text, with spaces,
  non-ASCII or looking like base64; headers plain, reserved, repeated, null or binary; null values; long topics (v2
  magic); idempotent batches; LogAppendTime, compressed and single-record batches; an id counter wrapping - and the
  same IndexFile keys (String.hashCode and UTF-16 length) as message_index_keys reads back from those bytes;
- the ConsumeQueues and IndexFiles the dispatcher builds from what the appender offers are byte for byte those it
  builds by reading the CommitLog back (a store re-dispatched from its CommitLog alone);
- IndexFile.put_keys, one batch at a time, writes the entries and chains of IndexFile.putKey called per key.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import Record
from tidelog.codec import rocketmq_message as rm
from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import (
    TimestampType,
    assemble_batch,
    build_batch,
    decode_records,
    encode_record,
    read_header,
)
from tidelog.codec.rocketmq_columns import DECODE_WALK_RECORDS, FRAME_WALK_RECORDS, decode_batch
from tidelog.codec.varint import encode_varint
from tidelog.config import EngineConfig
from tidelog.errors import CorruptRecordError
from tidelog.storage.common.index_file import ENTRY, HEADER_SIZE, IndexFile
from tidelog.storage.rocketmq.consume_queue import CONSUME_QUEUE_DIR
from tidelog.storage.rocketmq.engine import RocketMQEngine
from tidelog.storage.rocketmq.index_builder import INDEX_DIR, message_index_keys

TS = 1_700_000_000_000
PREFIX = "7F00000100013A2B4C5D0000ABCD"  # 28 hex digits: a UniqueIdGenerator block's common part
HOST = rm.HostAddress(bytes([10, 1, 2, 3]), 10911)
KEYS = [None, b"", b"k1", b"user-42", b"a b", b"\x00\x01", b"\xff\xfe", "ü-key".encode(), "😀".encode(), b"base64:x",
        b"xbase64:", b"\x7f~!", b"K" * 300, b"\x01", b"tab\tkey"]  # fmt: skip
HEADERS: list[list[tuple[str, bytes | None]]] = [
    [], [("trace", b"abc")], [("h", None)], [("a", b"1"), ("a", b"2")], [("KEYS", b"x")], [("é", b"\xff")],
    [("e", b"")], [("x\x01y", b"v")],
]  # fmt: skip


def reference(batch: bytes, topic: str, queue_id: int, uniq_first: int, log_append_now: int | None) -> bytes:
    """The record-at-a-time encoding: encode_message(record_properties(record, id, extra)) for each record."""
    header = read_header(batch, 0)
    records = decode_records(batch, 0, header)
    count = len(records)
    idempotent = header.producer_id >= 0 and header.base_sequence >= 0
    parts = []
    for index, record in enumerate(records):
        extra = f"KAFKA_BATCH\x01{index}/{count}\x02" if count > 1 else ""
        if idempotent and index == count - 1:
            extra += (
                f"KAFKA_PRODUCER\x01{header.producer_id}/{header.producer_epoch}/{header.base_sequence}/{count}\x02"
            )
        parts.append(
            rm.encode_message(
                topic=topic,
                queue_id=queue_id,
                body=record.value or b"",
                properties=rm.record_properties(record, rm.unique_id(PREFIX, uniq_first + index), extra),
                born_timestamp=log_append_now if log_append_now is not None else record.timestamp_ms or 0,
                store_host=HOST,
            )
        )
    return b"".join(parts)


def encode(batch: bytes, topic: str, queue_id: int, uniq_first: int, log_append_now: int | None) -> rm.EncodedMessages:
    header = read_header(batch, 0)
    records = decode_batch(batch, 0, header)
    idempotent = header.producer_id >= 0 and header.base_sequence >= 0
    return rm.encode_records(
        records,
        topic=topic,
        queue_id=queue_id,
        born_timestamps=records.timestamp if log_append_now is None else np.full(len(records), log_append_now),
        uniq_prefix=PREFIX,
        uniq_first=uniq_first,
        producer=(
            f"{header.producer_id}/{header.producer_epoch}/{header.base_sequence}/{len(records)}" if idempotent else ""
        ),
        store_host=HOST,
    )


def check_same(batch: bytes, topic: str = "t", queue_id: int = 3, uniq_first: int = 7, now: int | None = None) -> None:
    expected = reference(batch, topic, queue_id, uniq_first, now)
    encoded = encode(batch, topic, queue_id, uniq_first, now)
    assert bytes(encoded.data) == expected
    starts, keys = [], []
    position = 0
    while position < len(expected):
        message = rm.decode_message(expected, position)
        assert isinstance(message, rm.Message)
        starts.append(position)
        keys.append([rm.java_hash_and_units(key) for key in message_index_keys(message.properties_bytes)])
        position += message.total_size
    assert encoded.starts.tolist() == starts
    assert encoded.keys is not None
    hashes, units, counts = encoded.keys.hashed()
    pairs = list(zip(hashes.tolist(), units.tolist(), strict=True))
    ends = np.cumsum(counts).tolist()
    assert [pairs[end - count : end] for end, count in zip(ends, counts.tolist(), strict=True)] == keys
    middle = len(starts) // 2  # a dispatcher may take the messages of a put in two parts
    halves = rm.IndexKeys.concatenate([encoded.keys.rows(0, middle), encoded.keys.rows(middle, len(starts))])
    assert all(np.array_equal(a, b) for a, b in zip(halves.hashed(), (hashes, units, counts), strict=True))


record_strategy = st.builds(
    Record,
    value=st.none() | st.binary(max_size=64),
    key=st.sampled_from(KEYS) | st.binary(max_size=12) | st.text(max_size=10).map(str.encode),
    timestamp_ms=st.integers(TS - 10**6, TS + 10**6),
    headers=st.sampled_from(HEADERS)
    | st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(record_strategy, min_size=1, max_size=40),
    topic=st.sampled_from(["t", "orders.v1", "T" * 200]),
    uniq_first=st.sampled_from([0, 7, 0xFFF0, 0xFFFF]),
    idempotent=st.booleans(),
)
def test_any_batch_encodes_as_record_by_record(
    records: list[Record], topic: str, uniq_first: int, idempotent: bool
) -> None:
    producer = {"producer_id": 7, "producer_epoch": 1, "base_sequence": 10} if idempotent else {}
    check_same(build_batch(records, **producer), topic=topic, uniq_first=uniq_first)  # type: ignore[arg-type]


def test_named_cases_encode_as_record_by_record() -> None:
    plain = [Record(value=b"v" * 1024, key=f"k{i}".encode(), timestamp_ms=TS + i) for i in range(16)]
    check_same(build_batch(plain))  # the common case: plain keys, no headers
    check_same(build_batch([Record(value=b"v", timestamp_ms=TS) for _ in range(3)]))  # no keys at all
    check_same(build_batch([Record(value=None, key=b"gone", timestamp_ms=TS)]))  # a single tombstone
    check_same(build_batch([Record(value=b"x", key=key, timestamp_ms=TS) for key in KEYS]))
    check_same(build_batch([Record(value=b"x", key=b"k", timestamp_ms=TS, headers=h) for h in HEADERS]))
    check_same(build_batch(plain, compression=Compression.GZIP))
    check_same(build_batch(plain, timestamp_type=TimestampType.LOG_APPEND_TIME, now_ms=TS), now=TS + 5)
    check_same(build_batch(plain), now=TS + 5)  # a LogAppendTime topic: the broker's clock
    check_same(build_batch(plain, producer_id=9, producer_epoch=2, base_sequence=100))
    check_same(build_batch([Record(value=b"v", key=b"k", timestamp_ms=TS)] * 120), uniq_first=0xFFC0)  # wraps
    check_same(build_batch(plain), topic="x" * 200)  # v2 magic, 2-byte topic length
    assert len(plain) <= DECODE_WALK_RECORDS < 40 < FRAME_WALK_RECORDS < 300  # every decode path
    check_same(build_batch([Record(value=b"v" * (i % 7), key=b"k%d" % i, timestamp_ms=TS) for i in range(40)]))
    check_same(build_batch([Record(value=b"v" * (i % 7), key=b"k%d" % i, timestamp_ms=TS) for i in range(300)]))


def framed(bodies: list[bytes], *, extra: bytes = b"") -> bytes:
    """A batch of records given as their bodies (each framed by its length varint), `extra` bytes after them."""
    records = b"".join(encode_varint(len(body)) + body for body in bodies) + extra
    return assemble_batch(
        records, records_count=len(bodies), attributes=0, base_offset=0, last_offset_delta=len(bodies) - 1,
        base_timestamp=TS, max_timestamp=TS, producer_id=-1, producer_epoch=-1, base_sequence=-1,
        partition_leader_epoch=-1,
    )  # fmt: skip


@pytest.mark.parametrize("count", [3, 40, 300])  # walked, decoded column-wise, framed by predictions
def test_records_that_do_not_add_up_are_refused(count: int) -> None:
    good = [encode_record(i, 0, Record(value=b"v", key=b"k")) for i in range(count)]
    bodies = [record[1:] for record in good]  # each without its 1-byte length
    decode_batch(framed(bodies), 0, read_header(framed(bodies), 0))
    key_below_minus_one = b"\x00\x00" + encode_varint(count - 1) + encode_varint(-5) + b"\x02v\x00"
    null_header_key = b"\x00\x00" + encode_varint(count - 1) + b"\x01\x01\x02" + encode_varint(-1) + b"\x01"
    cases = {
        "bytes left after": framed(bodies, extra=b"\x00"),
        "past the end": framed([*bodies[:-1], bodies[-1] + b"\x00"])[:-1],
        "key length below -1": framed([*bodies[:-1], key_below_minus_one]),
        "add up": framed([*bodies[:-1], bodies[-1] + b"\x00"]),
        "null key": framed([*bodies[:-1], null_header_key]),
    }
    for what, damaged in cases.items():
        batch = damaged[:8] + struct.pack(">i", len(damaged) - 12) + damaged[12:]  # the length of what is there
        with pytest.raises(CorruptRecordError, match="batch at byte 0") as caught:
            decode_batch(batch, 0, read_header(batch, 0))
        assert caught.value, what


def test_too_large_records_are_named() -> None:
    records = [Record(value=b"v", key=b"k", timestamp_ms=TS), Record(value=b"v", key=b"\xff" * 25_000)]
    batch = build_batch(records)
    with pytest.raises(rm.PropertiesTooLargeError) as caught:
        encode(batch, "t", 0, 0, None)
    assert caught.value.record == 1 and caught.value.size > rm.MAX_PROPERTIES_SIZE
    header = read_header(batch, 0)
    with pytest.raises(rm.BodyTooLargeError) as too_big:
        rm.encode_records(
            decode_batch(batch, 0, header), topic="t", queue_id=0, born_timestamps=np.zeros(2, np.int64),
            uniq_prefix=PREFIX, uniq_first=0, max_body=0,
        )  # fmt: skip
    assert too_big.value.record == 0  # the first record in order, whichever limit it breaks


def store_files(root: Path) -> dict[str, bytes]:
    """ConsumeQueue files by path, IndexFile contents in creation order (names carry the creation time)."""
    files = {
        str(p.relative_to(root)): p.read_bytes() for p in sorted((root / CONSUME_QUEUE_DIR).rglob("*")) if p.is_file()
    }
    for number, path in enumerate(sorted((root / INDEX_DIR).iterdir())):
        files[f"index #{number}"] = path.read_bytes()
    return files


def open_engine(root: Path, **settings: str) -> RocketMQEngine:
    config = {
        "tidelog.rocketmq.mapedFileSizeCommitLog": "8192",
        "tidelog.rocketmq.maxHashSlotNum": "64",
        "tidelog.rocketmq.maxIndexNum": "100",
        "tidelog.rocketmq.mapedFileSizeConsumeQueue": "400",
        **settings,
    }
    return RocketMQEngine(EngineConfig.from_mapping(config, log_dir=root), background=False)


def test_dispatching_what_the_appender_offers_builds_the_files_reading_the_commitlog_does(tmp_path: Path) -> None:
    """Small CommitLog files (BLANK markers, batches moving to the next file), small ConsumeQueue and IndexFiles
    (rolling over), several topics and queues, keys of every kind."""
    engine = open_engine(tmp_path / "appended")
    engine.create_topic("a", partitions=3)
    engine.create_topic("b" * 150, partitions=1)
    for n in range(60):
        records = [
            Record(value=bytes(n * 7 % 300), key=KEYS[(n + i) % len(KEYS)], timestamp_ms=TS + n, headers=HEADERS[i % 3])
            for i in range(1 + n % 5)
        ]
        topic, partition = ("a", n % 3) if n % 4 else ("b" * 150, 0)
        engine.append(topic, partition, build_batch(records, producer_id=n, producer_epoch=0, base_sequence=0))
    assert engine.dispatcher.behind_bytes == 0
    engine.close()
    assert len(list((tmp_path / "appended" / "commitlog").iterdir())) > 2
    assert len(list((tmp_path / "appended" / INDEX_DIR).iterdir())) > 2
    shutil.copytree(
        tmp_path / "appended", tmp_path / "read", ignore=shutil.ignore_patterns(CONSUME_QUEUE_DIR, INDEX_DIR)
    )
    reread = open_engine(tmp_path / "read")  # the queues and the index are rebuilt from the CommitLog
    assert reread.recovery.messages == 60 + sum(n % 5 for n in range(60))
    reread.close()
    assert store_files(tmp_path / "read") == store_files(tmp_path / "appended")


def put_key_by_key(index_file: IndexFile, keys: list[tuple[int, int, int]]) -> None:
    """IndexFile.putKey (RocketMQ), one key at a time, on the file's bytes."""
    header = index_file.header
    slot_at = HEADER_SIZE
    entries_at = HEADER_SIZE + index_file.hash_slot_num * 4
    for key_hash, phy_offset, timestamp in keys:
        count = header.index_count
        slot_position = slot_at + key_hash % index_file.hash_slot_num * 4
        (slot_value,) = struct.unpack_from(">i", index_file.map, slot_position)
        if slot_value <= 0 or slot_value > count:
            slot_value = 0
        time_diff = (
            0
            if header.begin_timestamp <= 0
            else min(max(int((timestamp - header.begin_timestamp) / 1000), 0), 0x7FFFFFFF)
        )
        index_file.map[entries_at + count * 20 : entries_at + count * 20 + 20] = ENTRY.pack(
            key_hash, phy_offset, time_diff, slot_value
        )
        struct.pack_into(">i", index_file.map, slot_position, count)
        if count <= 1:
            header.begin_phy_offset, header.begin_timestamp = phy_offset, timestamp
        header.hash_slot_count += slot_value == 0
        header.index_count = count + 1
        header.end_phy_offset, header.end_timestamp = phy_offset, timestamp
    index_file.map[:HEADER_SIZE] = header.pack()


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 10**6), st.integers(TS - 5000, TS + 50_000)),
        min_size=1,
        max_size=60,
    ),
    split=st.integers(0, 60),
)
def test_put_keys_batch_writes_what_putkey_per_key_writes(
    tmp_path_factory: pytest.TempPathFactory, keys: list[tuple[int, int, int]], split: int
) -> None:
    directory = tmp_path_factory.mktemp("index")
    batched = IndexFile(directory / "a", 8, 50, create=True)
    one_by_one = IndexFile(directory / "b", 8, 50, create=True)
    for part in (keys[:split], keys[split:]):  # two batches: the second meets the first's chains and begin time
        columns = np.array(part, dtype=np.int64).reshape(-1, 3)
        written = batched.put_keys(columns[:, 0], columns[:, 1], columns[:, 2])
        fitting = part[: max(0, 50 - one_by_one.header.index_count)]
        put_key_by_key(one_by_one, fitting)
        assert written == len(fitting)
    assert batched.map[:] == one_by_one.map[:]
    batched.close()
    one_by_one.close()
