"""The IndexFile on disk, in RocketMQ's layout: header, slots and entries decoded field by field with struct, Java's
key hash, collision chains, time-range queries, a full file rolling over, reopening after a clean and a crashed run."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from tidelog.codec import rocketmq_message as rm
from tidelog.errors import KafkaStorageError
from tidelog.storage.common.index_file import (
    IndexFile,
    IndexService,
    KeyHasher,
    index_file_size,
    index_key_hash,
    time_to_file_name,
)
from tidelog.storage.rocketmq.dispatcher import DispatchBatch
from tidelog.storage.rocketmq.index_builder import INDEX_DIR, build_index, message_index_keys

TS = 1_700_000_000_000
SLOTS = 16
ENTRIES = 8


def java_hash(text: str) -> int:
    """String.hashCode written out as the sum s[i]*31^(n-1-i) mod 2^32, independently of the code under test."""
    value = sum(ord(c) * pow(31, len(text) - 1 - i, 1 << 32) for i, c in enumerate(text)) % (1 << 32)
    return value - (1 << 32) if value >= 1 << 31 else value


def dispatch(offset: int, topic: str, properties: str, store_timestamp: int, sys_flag: int = 0) -> rm.DispatchInfo:
    return rm.DispatchInfo(100, 0, 0, 0, offset, sys_flag, store_timestamp, topic, properties.encode())


def batch_of(items: list[tuple[int, rm.DispatchInfo]]) -> DispatchBatch:
    return DispatchBatch.from_infos(items)


def service(root: Path, slots: int = SLOTS, entries: int = ENTRIES, **kwargs: object) -> IndexService:
    clock = iter(range(TS, TS + 1_000_000, 1000))
    return IndexService(root / INDEX_DIR, slots, entries, clock=lambda: next(clock), **kwargs)  # type: ignore[arg-type]


def test_key_hash_is_javas_abs_hash_code() -> None:
    assert index_key_hash("Aa") == index_key_hash("BB") == 2112
    assert index_key_hash("t#Hello") == java_hash("t#Hello")
    negative = next(k for k in (f"key-{i}" for i in range(100)) if java_hash(k) < 0)
    assert index_key_hash(negative) == -java_hash(negative)
    assert java_hash("polygenelubricants") == -(1 << 31)  # abs() overflows in Java: RocketMQ uses 0
    assert index_key_hash("polygenelubricants") == 0
    assert index_key_hash("t#é€😀") == abs(java_hash_utf16("t#é€😀"))  # UTF-16 code units, surrogate pairs
    hasher = KeyHasher()  # the fast path computes the same hashes
    for topic, key in [("t", "Hello"), ("t", ""), ("", "polygenelubricants"), ("t", "é€😀"), ("topic", "x" * 600)]:
        assert hasher.hash(topic, key) == index_key_hash(f"{topic}#{key}"), (topic, key)
    assert hasher.hash("polygenelubrican", "ts") == index_key_hash("polygenelubrican#ts")
    minimum = next(k for k in ("polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES") if java_hash(k) == -(1 << 31))
    assert hasher.hash(minimum[:3], minimum[4:]) == index_key_hash(f"{minimum[:3]}#{minimum[4:]}")


def java_hash_utf16(text: str) -> int:
    units = text.encode("utf-16-be", "surrogatepass")
    chars = "".join(chr(int.from_bytes(units[i : i + 2], "big")) for i in range(0, len(units), 2))
    return java_hash(chars)


def test_file_bytes_field_by_field(tmp_path: Path) -> None:
    index = service(tmp_path)
    batch = [
        (0, dispatch(0, "t", "UNIQ_KEY\x01U0\x02KEYS\x01k1 k2\x02", TS)),
        (150, dispatch(150, "t", "UNIQ_KEY\x01U1\x02", TS + 2500)),
    ]
    assert build_index(index, batch_of(batch)) == 4
    index.flush()
    (path,) = (tmp_path / INDEX_DIR).iterdir()
    assert re.fullmatch(r"\d{17}", path.name) and path.name == time_to_file_name(TS)
    data = path.read_bytes()
    assert len(data) == 40 + SLOTS * 4 + ENTRIES * 20 == index_file_size(SLOTS, ENTRIES)
    begin_ts, end_ts, begin_off, end_off, slot_count, index_count = struct.unpack_from(">qqqqii", data, 0)
    assert (begin_ts, end_ts, begin_off, end_off, index_count) == (TS, TS + 2500, 0, 150, 5)
    keys = [("t#U0", 0, 0), ("t#k1", 0, 0), ("t#k2", 0, 0), ("t#U1", 150, 2)]
    entries_at = 40 + SLOTS * 4
    assert data[entries_at : entries_at + 20] == bytes(20)  # entry 0 is never used
    heads: dict[int, int] = {}
    for number, (key, offset, seconds) in enumerate(keys, start=1):
        key_hash, phy, diff, prev = struct.unpack_from(">iqii", data, entries_at + number * 20)
        assert (key_hash, phy, diff) == (abs(java_hash(key)), offset, seconds)
        slot = key_hash % SLOTS
        assert prev == heads.get(slot, 0)
        heads[slot] = number
    for slot in range(SLOTS):
        assert struct.unpack_from(">i", data, 40 + slot * 4)[0] == heads.get(slot, 0)
    assert slot_count == len(heads)
    index.close()


def test_colliding_keys_share_a_chain_and_queries_filter_by_hash(tmp_path: Path) -> None:
    index = service(tmp_path, slots=4, entries=64)
    # "Aa" and "BB" have the same Java hash, so t#Aa and t#BB do too; "x"/"y"... land in slots by hash % 4
    names = ["Aa", "BB", "k0", "k1", "k2", "k3", "k4", "k5"]
    batch = [(i * 100, dispatch(i * 100, "t", f"KEYS\x01{name}\x02", TS + i * 1000)) for i, name in enumerate(names)]
    build_index(index, batch_of(batch))
    assert index.query_offsets("t", "Aa", 64, 0, TS * 2).phy_offsets == [100, 0]  # hash duplicates, newest first
    assert index.query_offsets("t", "BB", 64, 0, TS * 2).phy_offsets == [100, 0]
    for i, name in enumerate(names[2:], start=2):
        assert index.query_offsets("t", name, 64, 0, TS * 2).phy_offsets == [i * 100]  # same slot, other hash
    assert index.query_offsets("other", "k0", 64, 0, TS * 2).phy_offsets == []
    index_file = index.files[0]
    slot_of_k = {name: index_key_hash(f"t#{name}") % 4 for name in names}
    assert len(set(slot_of_k.values())) < len(names)  # the chains really share slots
    for name in names:  # walking a slot's chain visits every key put in that slot, newest first
        number, seen = index_file.slot(slot_of_k[name]), []
        while number:
            entry = index_file.entry(number)
            seen.append(entry.phy_offset)
            number = entry.prev_index
        expected = [i * 100 for i, other in enumerate(names) if slot_of_k[other] == slot_of_k[name]]
        assert seen == expected[::-1]
    index.close()


def test_time_range_and_max_count(tmp_path: Path) -> None:
    index = service(tmp_path, entries=64)
    batch = [(i * 10, dispatch(i * 10, "t", "KEYS\x01same\x02", TS + i * 1000)) for i in range(10)]
    build_index(index, batch_of(batch))
    query = index.query_offsets
    assert query("t", "same", 64, TS, TS + 9000).phy_offsets == [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]
    assert query("t", "same", 64, TS + 3000, TS + 5000).phy_offsets == [50, 40, 30]
    assert query("t", "same", 3, TS, TS + 9000).phy_offsets == [90, 80, 70]
    assert query("t", "same", 100, TS, TS + 9000, max_msgs_num_batch=4).phy_offsets == [90, 80, 70, 60]
    assert query("t", "same", 64, TS + 20_000, TS + 30_000).phy_offsets == []
    result = query("t", "same", 64, 0, TS * 2)
    assert (result.index_last_update_timestamp, result.index_last_update_phy_offset) == (TS + 9000, 90)
    index.close()


def test_full_file_rolls_to_a_new_file_that_inherits_its_end(tmp_path: Path) -> None:
    full_at: list[int] = []
    index = service(tmp_path, entries=4, on_file_full=full_at.append)  # 3 entries per file
    batch = [(i * 10, dispatch(i * 10, "t", f"KEYS\x01k{i % 2}\x02", TS + i * 1000)) for i in range(7)]
    assert build_index(index, batch_of(batch)) == 7
    names = sorted(p.name for p in (tmp_path / INDEX_DIR).iterdir())
    assert names == [time_to_file_name(TS), time_to_file_name(TS + 1000), time_to_file_name(TS + 2000)]
    headers = [f.header for f in index.files]
    assert [h.index_count for h in headers] == [4, 4, 2]
    assert (headers[0].begin_phy_offset, headers[0].end_phy_offset) == (0, 20)
    assert (headers[1].begin_phy_offset, headers[1].end_phy_offset) == (30, 50)  # the first entry sets begin
    assert headers[1].begin_timestamp == TS + 3000
    assert full_at == [TS + 2000, TS + 5000]
    second = (tmp_path / INDEX_DIR / names[1]).read_bytes()
    first_entry = struct.unpack_from(">iqii", second, 40 + 4 * SLOTS + 20)
    assert first_entry[1:] == (30, 1, 0)  # timeDiff from the inherited begin (TS+2000): Java computes it first
    assert index.query_offsets("t", "k0", 64, 0, TS * 2).phy_offsets == [60, 40, 20, 0]
    assert index.query_offsets("t", "k1", 2, 0, TS * 2).phy_offsets == [50, 30]
    # a query whose window starts inside the newest file stops there (files that begin earlier are not read)
    assert index.query_offsets("t", "k0", 64, TS + 6000, TS * 2).phy_offsets == [60]
    assert index.delete_expired_files(commitlog_min_offset=30) == 1  # the first file ends at 20
    assert index.query_offsets("t", "k0", 64, 0, TS * 2).phy_offsets == [60, 40]
    index.close()


def test_reopen_after_clean_and_crashed_runs(tmp_path: Path) -> None:
    index = service(tmp_path, entries=4)
    batch = [(i * 10, dispatch(i * 10, "t", f"UNIQ_KEY\x01U{i}\x02", TS + i * 1000)) for i in range(5)]
    build_index(index, batch_of(batch))
    index.flush()
    index.close()
    reopened = service(tmp_path, entries=4)
    reopened.load(clean_shutdown=True, index_checkpoint_timestamp=0)
    assert [f.header.index_count for f in reopened.files] == [4, 3]
    assert reopened.query_offsets("t", "U1", 64, 0, TS * 2).phy_offsets == [10]
    assert reopened.rebuild_from == 41
    assert build_index(reopened, batch_of(batch)) == 0  # everything is indexed already
    assert build_index(reopened, batch_of([*batch, (50, dispatch(50, "t", "UNIQ_KEY\x01U5\x02", TS + 5000))])) == 1
    reopened.close()
    crashed = service(tmp_path, entries=4)
    crashed.load(clean_shutdown=False, index_checkpoint_timestamp=TS + 2000)  # the first file was full and flushed
    assert len(crashed.files) == 1 and len(list((tmp_path / INDEX_DIR).iterdir())) == 1
    assert crashed.rebuild_from == 21
    assert build_index(crashed, batch_of(batch)) == 2
    assert crashed.query_offsets("t", "U4", 64, 0, TS * 2).phy_offsets == [40]
    crashed.drop_beyond(30)  # the CommitLog was cut at 30: the file holding 30 and 40 goes
    assert crashed.rebuild_from == 21
    crashed.close()


def test_keys_of_a_message_and_skipped_messages(tmp_path: Path) -> None:
    properties = "UNIQ_KEY\x01ABC\x02KEYS\x01a  b\x02other\x01x\x02"
    assert message_index_keys(properties.encode()) == ["ABC", "a", "b"]
    assert message_index_keys(b"KAFKA_KEY64\x01AAE=\x02") == ["base64:AAE="]
    assert message_index_keys(b"KAFKA_KEY64\x01-\x02") == ["base64:"]
    record = rm.Record(value=b"v", key=b"\x00\x01", timestamp_ms=0, headers=[], offset=0)
    stored = rm.record_properties(record, "U").encode()
    assert message_index_keys(stored) == ["U", rm.index_key(b"\x00\x01")]
    index = service(tmp_path)
    rollback = dispatch(0, "t", "KEYS\x01gone\x02", TS, sys_flag=rm.SYSFLAG_TRANSACTION_ROLLBACK)
    assert build_index(index, batch_of([(0, rollback)])) == 0
    assert index.files == []
    index.close()


def test_a_short_file_is_rebuilt_a_long_one_refused(tmp_path: Path) -> None:
    """A file shorter than its sizes make was cut (or written with smaller sizes): it and the files after it are
    dropped, to be rebuilt from the CommitLog; read-only (the offline tools) it is skipped and nothing is deleted.
    A longer file was written with larger sizes: a clear error."""
    index = service(tmp_path)
    for n in range(3 * (ENTRIES - 1)):  # three full files
        build_index(index, batch_of([(100 * n, dispatch(100 * n, "t", f"KEYS\x01k{n}\x02", TS + 1000 * n))]))
    index.close()
    names = sorted(p.name for p in (tmp_path / INDEX_DIR).iterdir())
    assert len(names) == 3
    with pytest.raises(KafkaStorageError, match="maxHashSlotNum"):
        IndexService(tmp_path / INDEX_DIR, SLOTS // 2, ENTRIES).load(clean_shutdown=True, index_checkpoint_timestamp=0)
    os.truncate(tmp_path / INDEX_DIR / names[1], 77)
    reader = service(tmp_path, read_only=True)
    reader.load(clean_shutdown=True, index_checkpoint_timestamp=0)
    assert [f.path.name for f in reader.files] == [names[0], *names[2:]]
    reader.close()
    index = service(tmp_path)
    index.load(clean_shutdown=True, index_checkpoint_timestamp=0)
    assert [f.path.name for f in index.files] == names[:1]
    assert sorted(p.name for p in (tmp_path / INDEX_DIR).iterdir()) == names[:1]
    assert index.rebuild_from == 100 * (ENTRIES - 2) + 1  # re-indexing starts after the first file's last message
    index.close()


def test_default_size_file_is_sparse(tmp_path: Path) -> None:
    path = tmp_path / time_to_file_name(TS)
    index_file = IndexFile(path, 5_000_000, 20_000_000, create=True)
    assert index_file.put_keys(np.array([index_key_hash("t#k")]), np.array([0]), np.array([TS])) == 1
    index_file.flush()
    stat = os.stat(path)
    assert stat.st_size == 420_000_040
    assert stat.st_blocks * 512 < 64 * 1024 * 1024  # header and slots allocated, entries sparse
    assert struct.unpack_from(">iqii", os.pread(index_file.fd, 20, 40 + 20_000_000 + 20)) == (
        abs(java_hash("t#k")),
        0,
        0,
        0,
    )
    index_file.close()
