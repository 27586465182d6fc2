"""The Kafka engine's optional key index (tidelog.index.keys=true): IndexFiles in <topic>-<p>/tidelog-keyindex/,
lookups across partitions, hash collisions, reopening after clean and crashed runs, a torn log tail, retention, and
no trace of it where Kafka looks (segment files, stray-file warnings)."""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.errors import KeyIndexDisabledError
from tidelog.storage.api import KeyLocation, StorageEngine
from tidelog.storage.kafka.key_index import KEY_INDEX_DIR

TS = 1_700_000_000_000
SLOTS, ENTRIES = 8, 6  # tiny files: 5 entries each, so files roll over


def open_engine(path: Path, **extra: str) -> StorageEngine:
    config = {
        "tidelog.index.keys": "true",
        "tidelog.index.keys.maxHashSlotNum": str(SLOTS),
        "tidelog.index.keys.maxIndexNum": str(ENTRIES),
        **extra,
    }
    return tidelog.open(path, config=config, background=False)


def java_hash(text: str) -> int:
    value = sum(ord(c) * pow(31, len(text) - 1 - i, 1 << 32) for i, c in enumerate(text)) % (1 << 32)
    return value - (1 << 32) if value >= 1 << 31 else value


def fill(engine: StorageEngine) -> dict[bytes | None, list[KeyLocation]]:
    """Three partitions, keys in several batches; returns where each key went, newest first."""
    engine.create_topic("orders", partitions=3)
    keys: list[bytes | None] = [b"Aa", b"BB", b"order-1", b"\x00\xffbinary", None, b"has space"]
    where: dict[bytes | None, list[KeyLocation]] = {}
    n = 0
    for round_ in range(4):
        for partition in range(3):
            records = []
            for _ in range(3):
                key = keys[n % len(keys)]
                records.append(Record(value=f"v{n}".encode(), key=key, timestamp_ms=TS + n))
                n += 1
            base = engine.produce("orders", partition, records, compression="zstd" if round_ % 2 else "none")
            for i, record in enumerate(records):
                where.setdefault(record.key, []).insert(0, KeyLocation(partition, base + i, record.timestamp_ms or 0))
    return where


def test_lookup_across_partitions_with_collisions(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert java_hash("orders#Aa") == java_hash("orders#BB")  # the collision is real
    with open_engine(tmp_path) as engine:
        where = fill(engine)
        for key in (b"Aa", b"BB", b"order-1", b"\x00\xffbinary", b"has space"):
            assert engine.lookup_key("orders", key) == where[key], key
        assert engine.lookup_key("orders", b"order-1", max_results=2) == where[b"order-1"][:2]
        assert engine.lookup_key("orders", b"nothing") == []
        engine.create_topic("other", partitions=1)
        assert engine.lookup_key("other", b"Aa") == []

    # on disk: RocketMQ IndexFiles, whose entries hold Kafka offsets; nothing else in the partition dirs changed
    directory = tmp_path / "orders-1" / KEY_INDEX_DIR
    files = sorted(directory.iterdir())
    assert len(files) >= 2 and all(len(p.name) == 17 and p.name.isdigit() for p in files)
    offsets = []
    for path in files:
        data = path.read_bytes()
        assert len(data) == 40 + SLOTS * 4 + ENTRIES * 20
        *_, index_count = struct.unpack_from(">qqqqii", data, 0)
        for number in range(1, index_count):
            key_hash, offset, _diff, _prev = struct.unpack_from(">iqii", data, 40 + SLOTS * 4 + number * 20)
            offsets.append(offset)
            assert key_hash >= 0
    assert offsets == sorted(offsets) and len(offsets) == 10  # 12 records in partition 1, 2 without a key
    assert {p.name for p in (tmp_path / "orders-1").iterdir() if p.is_dir()} == {KEY_INDEX_DIR}

    caplog.set_level(logging.WARNING)
    with open_engine(tmp_path) as engine:
        assert engine.lookup_key("orders", b"Aa") == where[b"Aa"]
    assert "stray" not in caplog.text


def test_disabled_by_default(tmp_path: Path) -> None:
    with tidelog.open(tmp_path, background=False) as engine:
        engine.create_topic("t", partitions=1)
        engine.produce("t", 0, [Record(value=b"v", key=b"k")])
        with pytest.raises(KeyIndexDisabledError, match=r"tidelog\.index\.keys=true"):
            engine.lookup_key("t", b"k")
    assert not (tmp_path / "t-0" / KEY_INDEX_DIR).exists()


def test_crash_and_torn_tail_rebuild(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        where = fill(engine)
        engine.produce("orders", 2, [Record(value=b"last", key=b"the-end", timestamp_ms=TS + 99)])
        assert engine.lookup_key("orders", b"the-end") == [KeyLocation(2, 12, TS + 99)]
    # a crash that tore the last batch: no clean-shutdown marker, the tail of the log cut short
    (tmp_path / ".kafka_cleanshutdown").unlink()
    segment = tmp_path / "orders-2" / f"{0:020d}.log"
    os.truncate(segment, segment.stat().st_size - 3)
    with open_engine(tmp_path) as engine:
        assert engine.log_end_offset("orders", 2) == 12
        assert engine.lookup_key("orders", b"the-end") == []
        for key in (b"Aa", b"order-1", b"\x00\xffbinary"):
            assert engine.lookup_key("orders", key) == where[key]
        engine.produce("orders", 2, [Record(value=b"again", key=b"new-key", timestamp_ms=TS + 100)])
        assert engine.lookup_key("orders", b"new-key") == [KeyLocation(2, 12, TS + 100)]
        assert engine.lookup_key("orders", b"the-end") == []


def test_retention_drops_index_files(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        where = fill(engine)
        directory = tmp_path / "orders-0" / KEY_INDEX_DIR
        engine.lookup_key("orders", b"Aa")  # catches the index up
        before = sorted(directory.iterdir())
        engine.delete_records("orders", 0, 9)
        engine.catch_up_key_indexes()  # type: ignore[attr-defined]  # the scheduler's task
        assert len(sorted(directory.iterdir())) < len(before)
        for key in (b"Aa", b"BB", b"order-1"):
            expected = [w for w in where[key] if w.partition != 0 or w.offset >= 9]
            assert engine.lookup_key("orders", key) == expected
        engine.delete_topic("orders")
    assert not any(p.name.startswith("orders-") for p in tmp_path.iterdir())
