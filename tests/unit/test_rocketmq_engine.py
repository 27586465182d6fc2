"""The RocketMQ engine's own behaviour: what a Kafka batch becomes on disk, read back
field by field with struct; the dispatcher building ConsumeQueues in the background and catching up after a restart
or from nothing; SYNC_FLUSH group commit; the abort file and checkpoint; deleted topics staying deleted."""

from __future__ import annotations

import errno
import os
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import tidelog
from broker_process import ROCKETMQ_IGNORE_DISK_USAGE
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.errors import ConfigError, CrcMismatchError, KafkaStorageError, RecordTooLargeError
from tidelog.storage.api import MAX_TIMESTAMP
from tidelog.storage.common import filesystem_sync
from tidelog.storage.rocketmq import engine as rocketmq_engine
from tidelog.storage.rocketmq import message_queue
from tidelog.storage.rocketmq.checkpoint import read_checkpoint
from tidelog.storage.rocketmq.consume_queue import ConsumeQueue, PlannedRun
from tidelog.storage.rocketmq.engine import RocketMQEngine

TS = 1_700_000_000_000
SMALL = {"tidelog.rocketmq.mapedFileSizeCommitLog": 8192, "tidelog.rocketmq.mapedFileSizeConsumeQueue": 200}


def open_store(path: Path, *, background: bool = False, **config: object) -> RocketMQEngine:
    engine = tidelog.open(path, engine="rocketmq", config={**SMALL, **config}, background=background)
    assert isinstance(engine, RocketMQEngine)
    return engine


def parse_properties(raw: bytes) -> dict[str, str]:
    return dict(item.split("\x01", 1) for item in raw.decode().split("\x02") if item)


def message_at(store: Path, physical_offset: int, file_size: int = 8192) -> dict[str, object]:
    """The message at a CommitLog offset, decoded here with struct alone."""
    start = physical_offset - physical_offset % file_size
    data = (store / "commitlog" / f"{start:020d}").read_bytes()
    pos = physical_offset - start
    (total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = struct.unpack_from(
        ">iIiiiqqiq", data, pos
    )
    (store_ts,) = struct.unpack_from(">q", data, pos + 56)
    (body_length,) = struct.unpack_from(">i", data, pos + 84)
    body = data[pos + 88 : pos + 88 + body_length]
    topic_length = data[pos + 88 + body_length]
    topic_at = pos + 89 + body_length
    topic = data[topic_at : topic_at + topic_length].decode()
    (properties_length,) = struct.unpack_from(">h", data, topic_at + topic_length)
    properties = data[topic_at + topic_length + 2 : topic_at + topic_length + 2 + properties_length]
    assert total == 91 + body_length + topic_length + properties_length
    return {
        "magic": magic, "queue_id": queue_id, "queue_offset": queue_offset, "physical_offset": phys,
        "sys_flag": sys_flag, "born": born_ts, "store": store_ts, "body": body, "topic": topic, "flag": flag,
        "properties": parse_properties(properties), "crc_ok": crc == (__import__("zlib").crc32(body) & 0x7FFFFFFF),
    }  # fmt: skip


def consume_queue_units(store: Path, topic: str, queue_id: int) -> list[tuple[int, int, int]]:
    units = []
    directory = store / "consumequeue" / topic / str(queue_id)
    for path in sorted(directory.iterdir()) if directory.exists() else []:
        data = path.read_bytes()
        assert len(data) == 200 and len(path.name) == 20
        units += [u for u in struct.iter_unpack(">qiq", data) if u[1] > 0]
    return units


def test_a_kafka_batch_on_disk_field_by_field(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store) as engine:
        engine.create_topic("orders", 2)
        records = [
            Record(b"body %d" % i, key=b"order-%d" % i, timestamp_ms=TS + i, headers=[("source", b"web")])
            for i in range(25)
        ]
        for start in range(0, 25, 5):
            engine.append("orders", 1, build_batch(records[start : start + 5]))
    units = consume_queue_units(store, "orders", 1)
    assert len(units) == 25 and consume_queue_units(store, "orders", 0) == []
    uniq_keys = set()
    for queue_offset, (physical_offset, _size, tags) in enumerate(units):
        message = message_at(store, physical_offset)
        assert message["magic"] == 0xDAA320A7 and message["crc_ok"] and tags == 0
        assert (message["topic"], message["queue_id"], message["queue_offset"]) == ("orders", 1, queue_offset)
        assert message["physical_offset"] == physical_offset
        assert message["body"] == b"body %d" % queue_offset and message["born"] == TS + queue_offset
        properties = message["properties"]
        assert properties["KEYS"] == f"order-{queue_offset}" and properties["source"] == "web"
        assert properties["KAFKA_BATCH"] == f"{queue_offset % 5}/5"
        assert len(properties["UNIQ_KEY"]) == 32
        uniq_keys.add(properties["UNIQ_KEY"])
    assert len(uniq_keys) == 25
    stores = [message_at(store, u[0])["store"] for u in units]
    assert stores == sorted(stores)
    names = sorted(p.name for p in (store / "commitlog").iterdir())
    assert names[0] == "00000000000000000000" and all(len(n) == 20 for n in names)
    assert not (store / "abort").exists()
    checkpoint = read_checkpoint(store / "checkpoint")
    assert checkpoint["physicMsgTimestamp"] >= max(stores) and checkpoint["logicsMsgTimestamp"] >= max(stores)


def test_abort_file_while_open(tmp_path: Path) -> None:
    engine = open_store(tmp_path / "store")
    assert (tmp_path / "store" / "abort").read_text().strip() == str(os.getpid())
    engine.close()
    assert not (tmp_path / "store" / "abort").exists()


def test_background_dispatcher_makes_appends_readable(tmp_path: Path) -> None:
    with open_store(tmp_path / "store", background=True) as engine:
        engine.create_topic("t", 3)
        for i in range(300):
            engine.produce("t", i % 3, [Record(b"%d" % i, timestamp_ms=TS + i)])
        for partition in range(3):  # a read waits for nothing: it dispatches what it needs inline
            assert [r.value for r in engine.consume("t", partition)] == [b"%d" % i for i in range(partition, 300, 3)]


def test_consume_queues_are_rebuilt_from_the_commitlog(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store) as engine:
        engine.create_topic("t", 2)
        for i in range(200):
            engine.produce("t", i % 2, [Record(b"m%d" % i, key=b"k", timestamp_ms=TS + i)])
    before = consume_queue_units(store, "t", 0)
    for path in (store / "consumequeue" / "t" / "0").iterdir():
        path.unlink()  # lose one queue entirely...
    (store / "abort").write_text("1\n")  # ...in a crash
    with open_store(store) as engine:
        assert engine.recovery.reason is None
        assert [r.value for r in engine.consume("t", 0)] == [b"m%d" % i for i in range(0, 200, 2)]
        assert engine.log_end_offset("t", 1) == 100
    assert consume_queue_units(store, "t", 0) == before


def test_sync_flush_group_commit(tmp_path: Path) -> None:
    with open_store(tmp_path / "store", background=True, **{"tidelog.rocketmq.flushDiskType": "SYNC_FLUSH"}) as engine:
        engine.create_topic("t", 4)
        errors: list[BaseException] = []

        def producer(partition: int) -> None:
            try:
                for i in range(60):
                    result = engine.append("t", partition, build_batch([Record(b"%d" % i)]))
                    queue = engine.partition("t", partition)
                    assert queue.flushed_offset > result.base_offset  # acknowledged = on disk
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=producer, args=(p,)) for p in range(4) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        assert engine.commitlog.flushed_where == engine.commitlog.max_offset
        assert engine.flusher.flush_count < 480  # fsyncs were shared between waiting producers
        for partition in range(4):
            assert engine.high_watermark("t", partition) == 120
            assert not engine.partition("t", partition).flush_due()


def test_sync_flush_dispatches_only_what_is_on_disk(tmp_path: Path) -> None:
    with open_store(tmp_path / "store", **{"tidelog.rocketmq.flushDiskType": "SYNC_FLUSH"}) as engine:
        engine.create_topic("t", 1)
        queue = engine.partition("t", 0)
        queue.append(build_batch([Record(b"a"), Record(b"b")]))  # the broker's path: the flush comes later
        assert queue.log_end_offset == 2 and queue.flush_due()
        assert queue.high_watermark == 0 and queue.flushed_offset == 0
        queue.flush(2)
        assert queue.flushed_offset == 2 and queue.high_watermark == 2


def test_deleted_topic_stays_deleted_after_a_redispatch(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"old %d" % i) for i in range(20)])
        engine.delete_topic("t")
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"new")])
    (store / "abort").write_text("1\n")
    os.truncate(store / "checkpoint", 0)  # no checkpoint: re-dispatch the whole CommitLog
    with open_store(store) as engine:
        assert [r.value for r in engine.consume("t", 0)] == [b"new"]


def test_bad_input_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    with open_store(tmp_path / "store", **{"tidelog.rocketmq.maxMessageSize": 100}) as engine:
        engine.create_topic("t", 1)
        batch = bytearray(build_batch([Record(b"x")]))
        batch[-1] ^= 0xFF
        with pytest.raises(CrcMismatchError):
            engine.append("t", 0, bytes(batch))
        with pytest.raises(RecordTooLargeError, match="maxMessageSize"):
            engine.append("t", 0, build_batch([Record(b"y" * 101)]))
        with pytest.raises(RecordTooLargeError, match="mapedFileSizeCommitLog"):
            engine.append("t", 0, build_batch([Record(b"z" * 90) for _ in range(100)]))
        assert engine.log_end_offset("t", 0) == 0 and engine.commitlog.max_offset == 0


def test_one_store_directory_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"log\.dirs"):
        tidelog.open(tmp_path / "a", engine="rocketmq", config={"log.dirs": f"{tmp_path}/a,{tmp_path}/b"})


def test_a_directory_of_the_other_engine_is_refused(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as engine:
        engine.create_topic("t", 1)
    with pytest.raises(ConfigError, match=r"tidelog\.storage\.engine=rocketmq"):
        tidelog.open(tmp_path / "store")
    tidelog.open(tmp_path / "kafka").close()
    with pytest.raises(ConfigError, match=r"tidelog\.storage\.engine=kafka"):
        open_store(tmp_path / "kafka")


def test_the_spark_path_reader_names_the_engine(tmp_path: Path) -> None:
    from tidelog.errors import LogFilesError
    from tidelog.spark.logfiles import LogFiles

    with open_store(tmp_path / "store") as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"x")])
    with pytest.raises(LogFilesError, match="RocketMQ engine"):
        LogFiles([str(tmp_path / "store")])


def test_consume_queue_flush_rounds(tmp_path: Path) -> None:
    """A round syncs queues with flushConsumeQueueLeastPages dirty pages; a thorough round all, and the checkpoint."""
    settings = {
        "tidelog.rocketmq.mapedFileSizeConsumeQueue": 200_000,
        "tidelog.rocketmq.flushConsumeQueueLeastPages": 1,
        "tidelog.rocketmq.flushConsumeQueueThoroughInterval": 3_600_000,
    }
    with open_store(tmp_path / "store", **settings) as engine:
        engine.create_topic("t", 2)
        for i in range(300):  # 6,000 bytes of units in queue 0: more than a page; 20 bytes in queue 1
            engine.produce("t", 0, [Record(b"%d" % i, timestamp_ms=TS)])
        engine.produce("t", 1, [Record(b"one", timestamp_ms=TS)])
        busy, quiet = (engine.partition("t", p).consume_queue for p in (0, 1))
        assert busy.unflushed_bytes == 6000 and quiet.unflushed_bytes == 20
        engine._scheduled_consume_queue_flush()
        assert busy.unflushed_bytes == 0 and quiet.unflushed_bytes == 20
        assert engine.checkpoint.logics_msg_timestamp == 0  # only a thorough round moves it
        engine._last_thorough_cq_flush -= 3601
        engine._scheduled_consume_queue_flush()
        assert quiet.unflushed_bytes == 0
        assert engine.checkpoint.logics_msg_timestamp == engine.dispatcher.last_store_timestamp > 0


def test_many_dirty_queues_are_flushed_by_one_sync_of_the_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From SYNC_FILESYSTEM_MIN_FILES dirty ConsumeQueues a flush is one syncfs (the real call, counted here), after
    which every queue is clean and flushed to its end; fewer go file by file. A failed sync (EIO, injected) fails
    the flush, moves no checkpoint and leaves every queue dirty: the next flush syncs them. The units stay readable
    after a reopen."""
    calls: list[Path] = []

    def counted(directory: Path) -> bool:
        calls.append(directory)
        return filesystem_sync.sync_filesystem(directory)

    monkeypatch.setattr(rocketmq_engine, "sync_filesystem", counted)
    many = filesystem_sync.SYNC_FILESYSTEM_MIN_FILES
    with open_store(tmp_path / "store") as engine:
        engine.create_topic("few", 3)
        engine.create_topic("many", many)
        for partition in range(3):
            engine.produce("few", partition, [Record(b"x", timestamp_ms=TS)])
        engine.flush()
        assert calls == []  # three dirty queues: file by file
        queues = [engine.partition("many", p).consume_queue for p in range(many)]
        for partition in range(many):
            engine.produce("many", partition, [Record(b"%d" % partition, timestamp_ms=TS)])
        assert all(queue.dirty for queue in queues)

        def failing(directory: Path) -> bool:
            raise OSError(errno.EIO, "injected")

        monkeypatch.setattr(rocketmq_engine, "sync_filesystem", failing)
        before = engine.checkpoint.logics_msg_timestamp
        with pytest.raises(KafkaStorageError, match=f"cannot flush {many} ConsumeQueues"):
            engine.flush()
        assert all(queue.dirty for queue in queues)
        assert engine.checkpoint.logics_msg_timestamp == before
        monkeypatch.setattr(rocketmq_engine, "sync_filesystem", counted)
        engine.flush()
        assert calls == [engine.root]
        for queue in queues:
            assert not queue.dirty and queue.unflushed_bytes == 0
            assert all(f.flushed_position == f.wrote_position > 0 for f in queue.queue.files)
            assert queue.queue.flushed_where == queue.queue.max_offset
        assert engine.checkpoint.logics_msg_timestamp > before
    with open_store(tmp_path / "store") as engine:
        for partition in range(many):
            assert [r.value for r in engine.consume("many", partition, 0)] == [b"%d" % partition]


def test_a_failed_queue_flush_leaves_the_queue_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ConsumeQueue whose fdatasync fails (EIO, injected into that one file) stays dirty, so the next flush
    syncs it again instead of counting it done."""
    with open_store(tmp_path / "store") as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
        engine.dispatcher.catch_up()
        queue = engine.partition("t", 0).consume_queue
        (mapped_file,) = queue.queue.files

        def failing() -> int:
            raise KafkaStorageError("cannot flush: injected EIO")

        monkeypatch.setattr(mapped_file, "flush", failing)
        with pytest.raises(KafkaStorageError, match="injected"):
            queue.flush()
        assert queue.dirty
        monkeypatch.undo()
        queue.flush()
        assert not queue.dirty and mapped_file.flushed_position == mapped_file.wrote_position


def test_time_lookup_over_many_blocks_with_timestamps_out_of_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """offset_for_timestamp against a brute-force answer, with timestamps in random order over many blocks of the
    time summary, after more appends and after a DeleteRecords inside a block; once the summary is built a lookup
    (MAX_TIMESTAMP included) reads the timestamps of at most two blocks, not of the whole queue."""
    monkeypatch.setattr(message_queue, "TIME_BLOCK_UNITS", 8)
    rng = random.Random(3)
    stamps: list[int] = []

    def expected(target: int) -> tuple[int, int] | None:
        offset = next((o for o in range(start, len(stamps)) if stamps[o] >= target), None)
        return None if offset is None else (stamps[offset], offset)

    def lookup(target: int) -> tuple[int, int] | None:
        found = engine.offset_for_timestamp("t", 0, target)
        return None if found is None else (found.timestamp, found.offset)

    with open_store(tmp_path / "store") as engine:
        engine.create_topic("t", 1)
        read = []
        gather = engine.commitlog.read_born_timestamps
        monkeypatch.setattr(engine.commitlog, "read_born_timestamps", lambda o: read.append(len(o)) or gather(o))
        start = 0
        for round_ in range(3):
            for _ in range(40):
                batch = [TS + rng.randrange(10_000) for _ in range(rng.randint(1, 4))]
                engine.produce("t", 0, [Record(b"x", timestamp_ms=s) for s in batch])
                stamps += batch
            if round_ == 2:
                start = engine.delete_records("t", 0, len(stamps) - 37)  # inside a block
            for target in [0, TS, TS + 10_000, *(TS + rng.randrange(10_000) for _ in range(40))]:
                assert lookup(target) == expected(target), (round_, target)
            read.clear()
            newest = max(stamps[start:])
            assert lookup(MAX_TIMESTAMP) == (newest, stamps.index(newest, start))
            assert sum(read) <= 2 * 8


def test_a_consume_queue_that_cannot_be_written_fails_no_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ConsumeQueue is derived data written after the message is stored: when it cannot be written (here a file
    stands where the queue's directory goes; on a full disk, a new page of a sparse file), appends still succeed
    and are not readable yet (dispatching waits there, for every queue, as it follows the CommitLog in order), the
    failure is logged once at ERROR, and the dispatcher writes the units once it can - nothing twice, nothing
    missing."""
    store = tmp_path / "store"
    with open_store(store) as engine:
        engine.create_topic("t", 2)
        engine.produce("t", 1, [Record(b"other 0", timestamp_ms=TS)])
        blocker = store / "consumequeue" / "t" / "0"
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_text("not a directory")
        for i in range(4):
            assert engine.produce("t", 0, [Record(b"m%d" % i, timestamp_ms=TS), Record(b"n%d" % i)]) == 2 * i
        assert engine.log_end_offset("t", 0) == 8 and engine.high_watermark("t", 0) == 0
        assert list(engine.consume("t", 0)) == []
        errors = [r for r in caplog.records if r.levelname == "ERROR" and "cannot dispatch" in r.getMessage()]
        assert len(errors) == 1
        blocker.unlink()
        assert engine.high_watermark("t", 0) == 8
        assert [r.value for r in engine.consume("t", 0)] == [v % i for i in range(4) for v in (b"m%d", b"n%d")]
        assert engine.produce("t", 1, [Record(b"other 1", timestamp_ms=TS)]) == 1
        assert [r.value for r in engine.consume("t", 1)] == [b"other 0", b"other 1"]
        assert engine.partition("t", 0).size_in_bytes == sum(size for _, size, _ in consume_queue_units(store, "t", 0))
    assert len(consume_queue_units(store, "t", 0)) == 8


def test_store_host_from_config(tmp_path: Path) -> None:
    """tidelog.rocketmq.storeHost is the STOREHOSTADDRESS of every message, so of its id (offsetMsgId), and the
    address part of its UNIQ_KEY; the default is RocketMQ's 127.0.0.1:10911. Only IPv4 fits the layout."""
    store = tmp_path / "store"
    with open_store(store, **{"tidelog.rocketmq.storeHost": "10.1.2.3:9876"}) as engine:
        engine.create_topic("t", 1)
        engine.produce("t", 0, [Record(b"x", timestamp_ms=TS)])
        [message] = engine.commitlog.iter_messages(0, engine.commitlog.max_offset)
        assert message.msg_id() == "0A010203000026940000000000000000"
    data = (store / "commitlog" / f"{0:020d}").read_bytes()
    assert data[64:72] == bytes([10, 1, 2, 3]) + (9876).to_bytes(4, "big")
    assert message_at(store, 0)["properties"]["UNIQ_KEY"].startswith("0A010203")
    with open_store(tmp_path / "default") as engine:
        assert str(engine.store_host) == "127.0.0.1:10911"
    for bad in ("10.1.2.3", "host:10911", "[::1]:10911", "10.1.2.3:70000"):
        with pytest.raises(ConfigError, match="storeHost"):
            open_store(tmp_path / "bad", **{"tidelog.rocketmq.storeHost": bad})


def test_a_queue_flush_waits_for_its_own_messages_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer of one queue waits for the group commit covering its messages, not for what other queues put
    into the CommitLog after them (a later round)."""
    with open_store(tmp_path / "store", **{"tidelog.rocketmq.flushDiskType": "SYNC_FLUSH"}) as engine:
        engine.create_topic("t", 2)
        mine, other = engine.partition("t", 0), engine.partition("t", 1)
        mine.append(build_batch([Record(b"a"), Record(b"b")]))  # the broker's path: the flush comes later
        my_end = engine.commitlog.max_offset
        other.append(build_batch([Record(b"c" * 500)]))
        waited_for: list[int] = []
        wait_flushed = engine.flusher.wait_flushed
        monkeypatch.setattr(
            engine.flusher, "wait_flushed", lambda offset: waited_for.append(offset) or wait_flushed(offset)
        )
        mine.flush(2)
        assert waited_for == [my_end] and my_end < engine.commitlog.max_offset
        assert mine.flushed_offset == 2


def test_a_record_whose_properties_exceed_rocketmqs_limit_is_refused(tmp_path: Path) -> None:
    """PROPERTIES has an i16 length in RocketMQ's layout: a record whose key, headers and the engine's own properties
    would take more than 32,767 bytes is refused with RecordTooLargeError saying so, and nothing of its batch is
    stored. A key that is not plain text is kept base64-encoded, so about 24 KB of it fit; plain text about 32 KB."""
    with open_store(tmp_path / "store", **{"tidelog.rocketmq.mapedFileSizeCommitLog": 1 << 20}) as engine:
        engine.create_topic("t", 1)
        fits = [Record(b"v", key=b"\xff" * 24_000), Record(b"w", key=b"k" * 32_000)]
        assert engine.produce("t", 0, fits) == 0
        assert [r.key for r in engine.consume("t", 0)] == [r.key for r in fits]
        for too_large in (
            Record(b"x", key=b"\xff" * 24_600),
            Record(b"y", key=b"k" * 32_760),
            Record(b"z", headers=[("h", b"\xff" * 25_000)]),
        ):
            with pytest.raises(RecordTooLargeError) as refused:
                engine.produce("t", 0, [Record(b"first"), too_large])
            message = str(refused.value)
            assert "record 1 of a batch for t-0: its RocketMQ PROPERTIES" in message
            assert "over RocketMQ's limit of 32,767 (Short.MAX_VALUE)" in message
            assert engine.log_end_offset("t", 0) == 2 and engine.commitlog.max_offset > 0
        assert [r.value for r in engine.consume("t", 0)] == [b"v", b"w"]


def test_many_dirty_consume_queues_are_synced_on_worker_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush syncs every dirty ConsumeQueue - on FLUSH_THREADS threads when there are at least that many (their
    fdatasyncs overlap) - and a queue that cannot be synced fails the flush."""
    from tidelog.errors import KafkaStorageError
    from tidelog.storage.rocketmq import engine as engine_module
    from tidelog.storage.rocketmq.consume_queue import ConsumeQueue

    synced: list[tuple[str, str]] = []
    flush = ConsumeQueue.flush

    def recording_flush(self: ConsumeQueue) -> None:
        if self.dirty:
            synced.append((f"{self.topic}-{self.queue_id}", threading.current_thread().name))
        flush(self)

    monkeypatch.setattr(ConsumeQueue, "flush", recording_flush)
    store = open_store(tmp_path)
    count = engine_module.FLUSH_THREADS + 2
    store.create_topic("many", partitions=count)
    store.create_topic("one", partitions=1)
    for partition in range(count):
        store.append("many", partition, build_batch([Record(value=b"v", timestamp_ms=TS)]))
    store.flush()
    assert sorted(name for name, _ in synced) == sorted(f"many-{p}" for p in range(count))
    assert all(thread.startswith("tidelog-flush-cq") for _, thread in synced)
    synced.clear()
    store.append("one", 0, build_batch([Record(value=b"v", timestamp_ms=TS)]))
    store.flush()
    assert synced == [("one-0", threading.current_thread().name)]  # one dirty queue: no threads

    def failing_flush(self: ConsumeQueue) -> None:
        raise KafkaStorageError(f"cannot flush {self.topic}-{self.queue_id}")

    for partition in range(count):
        store.append("many", partition, build_batch([Record(value=b"v", timestamp_ms=TS)]))
    store.catch_up()
    monkeypatch.setattr(ConsumeQueue, "flush", failing_flush)
    with pytest.raises(KafkaStorageError, match="cannot flush many-"):
        store.flush()
    monkeypatch.setattr(ConsumeQueue, "flush", flush)
    store.close()


def test_a_dispatch_round_over_many_queues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round that touches many queues (one append each at 1,000 partitions) writes each queue's units from bytes
    made once for the round, all in one call (positioned_writes.py): every unit names its message, sizes add up, a
    recreated topic takes none of its namesake's messages, and a reopen reads the same."""
    written_by_run: list[int] = []
    commit_run = ConsumeQueue.commit_run

    def counting(self: ConsumeQueue, run: PlannedRun) -> None:
        commit_run(self, run)
        written_by_run.append(len(run.units))

    monkeypatch.setattr(ConsumeQueue, "commit_run", counting)
    expected: dict[int, list[bytes]] = {p: [] for p in range(40)}
    config = {"tidelog.rocketmq.mapedFileSizeCommitLog": 1 << 16, "tidelog.rocketmq.flushDiskType": "SYNC_FLUSH"}
    with open_store(tmp_path / "store", **config) as engine:  # SYNC_FLUSH: dispatched only when flushed
        engine.create_topic("gone", 2)
        engine.produce("gone", 0, [Record(b"old")])  # not dispatched before the topic is deleted and recreated
        engine.delete_topic("gone")
        engine.create_topic("gone", 2)
        engine.create_topic("t", 40)
        sizes_before = {p: engine.partition("t", p).size_in_bytes for p in range(40)}
        for round_ in range(4):
            for i in range(120):
                partition = (i * 7 + round_) % 40
                records = [Record(b"%d-%d-%d" % (round_, i, j), key=b"k%d" % j) for j in range(1 + i % 3)]
                engine.partition("t", partition).append(build_batch(records))
                expected[partition] += [r.value for r in records]
            engine.partition("gone", round_ % 2).append(build_batch([Record(b"new-%d" % round_)]))
            engine.flush()
        assert any(written_by_run)
        for partition in range(40):
            queue = engine.partition("t", partition)
            assert [r.value for r in engine.consume("t", partition)] == expected[partition]
            units = queue.units(0, queue.log_end_offset)
            for queue_offset, physical_offset, size in units:
                message = engine.read_message(physical_offset, size)
                assert (message.queue_id, message.queue_offset, message.total_size) == (partition, queue_offset, size)
            assert queue.size_in_bytes - sizes_before[partition] == sum(size for *_, size in units)
        assert [r.value for p in (0, 1) for r in engine.consume("gone", p)] == [b"new-0", b"new-2", b"new-1", b"new-3"]
    with open_store(tmp_path / "store", **config) as engine:
        for partition in range(40):
            assert [r.value for r in engine.consume("t", partition)] == expected[partition]


QUEUES_CHILD = """
import os, resource, sys
from pathlib import Path
import tidelog
from tidelog import Record
from tidelog.codec.record_batch import build_batch
from tidelog.codec.record_set import iter_records
from tidelog.errors import InvalidPartitionsError
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
settings = dict(arg.split("=") for arg in sys.argv[2:])
engine = tidelog.open(Path(sys.argv[1]), engine="rocketmq", config=settings)
engine.create_topic("t", partitions=300)
for queue in range(300):
    engine.append("t", queue, build_batch([Record(b"v%d" % queue)]))
engine.flush()
engine.catch_up()
values = [[r.value for r in iter_records(engine.partition("t", q).read(0, 1 << 20).read_bytes())] for q in range(300)]
print("read:", sum(v == [b"v%d" % q] for q, v in enumerate(values)), "open files:", len(os.listdir("/proc/self/fd")))
try:
    engine.create_topic("too-many", partitions=800)
except InvalidPartitionsError as exc:
    print("refused:", exc)
engine.close()
engine = tidelog.open(Path(sys.argv[1]), engine="rocketmq", config=settings)
engine.catch_up()
print("after a restart:", sum(engine.partition("t", q).high_watermark for q in range(300)))
engine.close()
"""


def test_more_queues_than_the_open_file_limit_stay_writable_and_readable(tmp_path: Path) -> None:
    """ConsumeQueue files are opened on use and the idle ones let go, so a store under an open-file limit of 256
    holds 300 written queues: every one is dispatched and read back (no EMFILE in the dispatcher), with fewer than
    256 files open, and again after a restart. Queues are bounded at 4 per descriptor of the hard limit: a topic
    past that is refused, naming the limit and what fits. In a child process, whose limit is lowered."""
    settings = [f"{key}={value}" for key, value in ROCKETMQ_IGNORE_DISK_USAGE.items()]
    out = subprocess.run(
        [sys.executable, "-c", QUEUES_CHILD, str(tmp_path / "store"), *settings],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    read, open_files = lines[0].removeprefix("read: ").split(" open files: ")
    assert read == "300" and int(open_files) < 256, lines
    assert lines[1].startswith("refused: topic too-many: 800 more queues") and "(256," in lines[1], lines
    assert "724 more fit" in lines[1], lines
    assert lines[2] == "after a restart: 300", lines
    assert "Too many open files" not in out.stderr
