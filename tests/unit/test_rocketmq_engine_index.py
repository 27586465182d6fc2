"""The key index of both engines: the RocketMQ engine's IndexFiles built by the dispatcher (decoded here with struct),
rebuilt after a crash and after a torn CommitLog tail, read by the offline tools; and `lookup_key` answering the same
on both engines (the Kafka engine with tidelog.index.keys=true)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import tidelog
from tidelog import Record
from tidelog.cli import main
from tidelog.codec import rocketmq_message as rm
from tidelog.errors import KafkaStorageError, KeyIndexDisabledError, UnknownTopicOrPartitionError
from tidelog.storage.api import KeyLocation, StorageEngine
from tidelog.storage.rocketmq.checkpoint import read_checkpoint
from tidelog.storage.rocketmq.engine import RocketMQEngine

TS = 1_700_000_000_000
SLOTS, ENTRIES = 16, 12  # 11 entries per file: files roll over
ENGINE_CONFIGS: dict[str, dict[str, object]] = {
    "kafka": {
        "log.segment.bytes": 4096,
        "tidelog.index.keys": "true",
        "tidelog.index.keys.maxHashSlotNum": SLOTS,
        "tidelog.index.keys.maxIndexNum": ENTRIES,
    },
    "rocketmq": {
        "tidelog.rocketmq.mapedFileSizeCommitLog": 8192,
        "tidelog.rocketmq.mapedFileSizeConsumeQueue": 200,
        "tidelog.rocketmq.maxHashSlotNum": SLOTS,
        "tidelog.rocketmq.maxIndexNum": ENTRIES,
    },
}


def open_store(path: Path, engine: str = "rocketmq", **config: object) -> StorageEngine:
    return tidelog.open(path, engine=engine, config={**ENGINE_CONFIGS[engine], **config}, background=False)


def java_hash(text: str) -> int:
    value = sum(ord(c) * pow(31, len(text) - 1 - i, 1 << 32) for i, c in enumerate(text)) % (1 << 32)
    return value - (1 << 32) if value >= 1 << 31 else value


KEYS: list[bytes | None] = [b"Aa", b"BB", b"order-1", b"\x00\xffbinary", None, b"two words"]


def fill(engine: StorageEngine, rounds: int = 4) -> dict[bytes | None, list[KeyLocation]]:
    """Three partitions, keyed records in batches; where each key went, newest first."""
    engine.create_topic("orders", partitions=3)
    where: dict[bytes | None, list[KeyLocation]] = {}
    n = 0
    for _ in range(rounds):
        for partition in range(3):
            records = [
                Record(value=b"v%d" % (n + i), key=KEYS[(n + i) % len(KEYS)], timestamp_ms=TS + n + i) for i in range(3)
            ]
            n += 3
            base = engine.produce("orders", partition, records)
            for i, record in enumerate(records):
                where.setdefault(record.key, []).insert(0, KeyLocation(partition, base + i, record.timestamp_ms or 0))
    return where


@pytest.mark.parametrize("engine_name", sorted(ENGINE_CONFIGS))
def test_lookup_key_on_both_engines(tmp_path: Path, engine_name: str) -> None:
    assert java_hash("orders#Aa") == java_hash("orders#BB")
    with open_store(tmp_path / "data", engine_name) as engine:
        where = fill(engine)
        for key in (b"Aa", b"BB", b"order-1", b"\x00\xffbinary", b"two words"):
            assert engine.lookup_key("orders", key) == where[key], key
        assert engine.lookup_key("orders", b"order-1", max_results=2) == where[b"order-1"][:2]
        assert engine.lookup_key("orders", b"absent") == []
        with pytest.raises(UnknownTopicOrPartitionError):
            engine.lookup_key("nope", b"Aa")
        engine.delete_records("orders", 1, 6)  # deleted records are not found any more
        assert engine.lookup_key("orders", b"Aa") == [w for w in where[b"Aa"] if w.partition != 1 or w.offset >= 6]
    with open_store(tmp_path / "data", engine_name) as engine:  # and after a reopen
        assert engine.lookup_key("orders", b"order-1") == [
            w for w in where[b"order-1"] if w.partition != 1 or w.offset >= 6
        ]


def index_entries(store: Path) -> list[tuple[int, int]]:
    """(keyHash, phyOffset) of every entry of every index file, oldest first, read with struct."""
    entries = []
    for path in sorted((store / "index").iterdir()):
        data = path.read_bytes()
        assert len(path.name) == 17 and len(data) == 40 + SLOTS * 4 + ENTRIES * 20
        *_, index_count = struct.unpack_from(">qqqqii", data, 0)
        for number in range(1, index_count):
            key_hash, offset, _diff, _prev = struct.unpack_from(">iqii", data, 40 + SLOTS * 4 + number * 20)
            entries.append((key_hash, offset))
    return entries


def test_dispatcher_writes_an_entry_per_key(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store) as engine:
        assert isinstance(engine, RocketMQEngine)
        fill(engine)
        messages = list(engine.commitlog.iter_messages(engine.commitlog.min_offset, engine.commitlog.max_offset))
    expected = []
    for message in messages:
        keys = [message.uniq_key, *message.keys]
        if "KAFKA_KEY64" in message.properties:
            keys.append("base64:" + message.properties["KAFKA_KEY64"])
        expected += [(abs(java_hash(f"orders#{key}")), message.physical_offset) for key in keys]
    assert index_entries(store) == expected
    assert len(list((store / "index").iterdir())) >= 5  # 36 messages, 66 entries, 11 per file


def test_index_rebuilt_after_a_crash_and_a_torn_tail(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store) as engine:
        where = fill(engine)
    entries = index_entries(store)
    checkpoint = read_checkpoint(store / "checkpoint")
    assert checkpoint["indexMsgTimestamp"] > 0  # full files were flushed and counted
    # a crash: the abort file stays; the files past the checkpoint are dropped and rebuilt from the CommitLog
    (store / "abort").write_text("1\n")
    with open_store(store) as engine:
        assert engine.lookup_key("orders", b"Aa") == where[b"Aa"]
    assert index_entries(store) == entries
    # every index file lost: all rebuilt
    for path in (store / "index").iterdir():
        path.unlink()
    (store / "abort").write_text("1\n")
    with open_store(store) as engine:
        assert engine.lookup_key("orders", b"order-1") == where[b"order-1"]
    assert index_entries(store) == entries
    # a torn CommitLog tail: the last message goes, and so does what the index said about it
    with open_store(store) as engine:
        assert isinstance(engine, RocketMQEngine)
        engine.produce("orders", 2, [Record(b"last", key=b"the-end", timestamp_ms=TS + 99)])
        assert engine.lookup_key("orders", b"the-end") == [KeyLocation(2, 12, TS + 99)]
        end = engine.commitlog.max_offset
        start = [m.physical_offset for m in engine.commitlog.iter_messages(engine.commitlog.min_offset, end)][-1]
    path = store / "commitlog" / f"{start // 8192 * 8192:020d}"
    data = bytearray(path.read_bytes())
    data[start % 8192 + 4 : end - start + start % 8192] = bytes(end - start - 4)  # torn: only its size made it
    path.write_bytes(bytes(data))
    (store / "abort").write_text("1\n")
    with open_store(store) as engine:
        assert engine.lookup_key("orders", b"the-end") == []
        engine.produce("orders", 2, [Record(b"again", key=b"new-key", timestamp_ms=TS + 100)])
        assert engine.lookup_key("orders", b"new-key") == [KeyLocation(2, 12, TS + 100)]
        assert engine.lookup_key("orders", b"Aa") == where[b"Aa"]


def test_offline_tools_on_an_engine_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    with open_store(store) as engine:
        where = fill(engine)
        assert isinstance(engine, RocketMQEngine)
        messages = list(engine.commitlog.iter_messages(engine.commitlog.min_offset, engine.commitlog.max_offset))
    query = ["query-message", "--store", str(store), "--topic", "orders", "--key", "order-1"]
    assert main(query) == 2  # 16 slots and 12 entries are not RocketMQ's 1:4: the sizes must be given
    assert "--max-hash-slot-num" in capsys.readouterr().err
    assert main([*query, "--max-hash-slot-num", str(SLOTS)]) == 0  # the entry count follows from the file size
    out = capsys.readouterr().out
    queue_offsets = [int(v) for v in __import__("re").findall(r"^Queue Offset:\s+(\d+)$", out, flags=8)]
    assert queue_offsets == [w.offset for w in where[b"order-1"]]
    target = messages[7]
    assert main(["query-message", "--store", str(store), "--msg-id", target.msg_id()]) == 0
    assert f"Body:                {target.body.decode()}" in capsys.readouterr().out
    assert main(["dump-consumequeue", "--store", str(store), "--topic", "orders", "--queue", "2"]) == 0
    assert capsys.readouterr().out.count("valid: true") == 12


def test_message_index_disabled(tmp_path: Path) -> None:
    with open_store(tmp_path / "store", **{"tidelog.rocketmq.messageIndexEnable": "false"}) as engine:
        engine.create_topic("t", partitions=1)
        engine.produce("t", 0, [Record(b"v", key=b"k")])
        with pytest.raises(KeyIndexDisabledError, match="messageIndexEnable"):
            engine.lookup_key("t", b"k")
    assert not (tmp_path / "store" / "index").exists()
    assert rm.index_key(b"k") == "k"


def test_an_index_that_cannot_be_written_fails_no_produce_and_catches_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The IndexFile is written after the message is stored (the dispatcher's second step): when it cannot be
    written - here a file stands where the index directory goes, on a full disk its creation fails - the produce
    still succeeds (a retry would store the message twice), the failure is logged once at ERROR, reads go on, a key
    lookup says the index is behind, and the index catches up from the CommitLog once it can be written - at a
    lookup, or at the next start, which the failure does not stop either."""
    store = tmp_path / "store"
    blocker = store / "index"
    where: dict[bytes, KeyLocation] = {}
    with open_store(store) as engine:
        engine.create_topic("t", partitions=1)
        blocker.write_text("not a directory")
        for i in range(5):
            offset = engine.produce("t", 0, [Record(b"v%d" % i, key=b"k%d" % i, timestamp_ms=TS + i)])
            where[b"k%d" % i] = KeyLocation(0, offset, TS + i)
        errors = [r for r in caplog.records if r.levelname == "ERROR" and "key index cannot be written" in r.message]
        assert len(errors) == 1 and "CommitLog offset 0 on" in errors[0].message
        assert [r.value for r in engine.consume("t", 0)] == [b"v%d" % i for i in range(5)]
        with pytest.raises(KafkaStorageError, match="the key index misses the messages from CommitLog offset 0"):
            engine.lookup_key("t", b"k1")
    with open_store(store) as engine:  # still blocked: the start re-indexes, fails, and goes on
        engine.produce("t", 0, [Record(b"v5", key=b"k5", timestamp_ms=TS + 5)])
        where[b"k5"] = KeyLocation(0, 5, TS + 5)
        assert [r.value for r in engine.consume("t", 0)] == [b"v%d" % i for i in range(6)]
        blocker.unlink()
        caplog.clear()
        assert engine.lookup_key("t", b"k1") == [where[b"k1"]]
        assert any("key index caught up" in r.message for r in caplog.records)
        engine.produce("t", 0, [Record(b"v6", key=b"k6", timestamp_ms=TS + 6)])
        where[b"k6"] = KeyLocation(0, 6, TS + 6)
        for key, location in where.items():
            assert engine.lookup_key("t", key) == [location]
