"""How the RocketMQ engine stores transactions in its own files (the engine-independent behaviour is in
test_engine_contract.py): each message of a transactional batch carries Kafka's transactional bit in its FLAG and
no RocketMQ transaction type in its SYSFLAG (so it is dispatched at once), the batch's last message names the
producer; a marker is one message whose FLAG says control, its body the control record's value; the aborted
transactions go into `aborted.txnindex` (Kafka's 34-byte entries) beside the producer snapshots, created before the
first transactional batch and repaired from the CommitLog at load; retention copies only committed values."""

from __future__ import annotations

import struct
from pathlib import Path

import tidelog
from broker_process import ROCKETMQ_IGNORE_DISK_USAGE
from tidelog import Record
from tidelog.codec import rocketmq_message as rm
from tidelog.codec.record_batch import build_batch
from tidelog.codec.record_set import decode_batch, iter_batches
from tidelog.storage.api import AbortedTransaction
from tidelog.storage.rocketmq.engine import RocketMQEngine
from tidelog.storage.rocketmq.message_queue import MessageQueue

TS = 1_700_000_000_000
TXN_ENTRY = struct.Struct(">hqqqq")


def open_store(path: Path, **config: object) -> RocketMQEngine:
    settings = {
        "tidelog.rocketmq.mapedFileSizeCommitLog": 4096,
        "tidelog.rocketmq.mapedFileSizeConsumeQueue": 400,
        "tidelog.rocketmq.deleteCommitLogFilesInterval": 0,
        **ROCKETMQ_IGNORE_DISK_USAGE,
        **config,
    }
    engine = tidelog.open(path, engine="rocketmq", config=settings, background=False)
    assert isinstance(engine, RocketMQEngine)
    return engine


def txn_batch(producer_id: int, sequence: int, count: int = 2, key: bytes | None = None) -> bytes:
    records = [Record(b"p%d-s%d" % (producer_id, sequence + i), key=key, timestamp_ms=TS) for i in range(count)]
    return build_batch(
        records, producer_id=producer_id, producer_epoch=0, base_sequence=sequence, is_transactional=True
    )


def queue_of(engine: RocketMQEngine, topic: str = "t") -> MessageQueue:
    queue = engine.partition(topic, 0)
    assert isinstance(queue, MessageQueue)
    return queue


def messages(engine: RocketMQEngine, queue: MessageQueue) -> list[rm.Message]:
    return [engine.read_message(at, size) for _offset, at, size in queue.units(0, queue.high_watermark)]


def aborted_file(store: Path) -> Path:
    return store / "tidelog-producer-snapshots" / "t-0" / "aborted.txnindex"


def test_the_messages_a_transaction_is_stored_as(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as engine:
        engine.create_topic("t", 1)
        queue = queue_of(engine)
        queue.append(build_batch([Record(b"plain", timestamp_ms=TS)]))
        queue.append(txn_batch(4, 10, count=3))
        queue.append_marker(4, 0, coordinator_epoch=9, commit=False)
        stored = messages(engine, queue)
    assert [(m.flag, m.sys_flag & rm.SYSFLAG_TRANSACTION_MASK) for m in stored] == [
        (0, 0), (0x10, 0), (0x10, 0), (0x10, 0), (0x30, 0)
    ]  # fmt: skip
    assert [rm.producer_info(m.properties_bytes) for m in stored] == [
        None, None, None, rm.ProducerInfo(4, 0, 10, 3), rm.ProducerInfo(4, 0, -1, 1)
    ]  # fmt: skip
    marker = stored[-1]
    assert marker.body == struct.pack(">hi", 0, 9)  # the control record's value: version 0, coordinator epoch
    assert rm.message_to_record(marker).key == struct.pack(">hh", 0, 0)  # version 0, ABORT


def test_aborted_txnindex_is_made_before_the_first_transaction_and_holds_kafkas_entries(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store) as engine:
        engine.create_topic("t", 1)
        queue = queue_of(engine)
        idempotent = build_batch([Record(b"i", timestamp_ms=TS)], producer_id=1, producer_epoch=0, base_sequence=0)
        queue.append(idempotent)
        assert not queue.has_transactions and not aborted_file(store).exists()
        queue.append(txn_batch(2, 0))  # 1-2
        assert aborted_file(store).read_bytes() == b""
        queue.append(txn_batch(3, 0))  # 3-4, still open at the abort
        queue.append_marker(2, 0, coordinator_epoch=1, commit=False)  # 5
        assert [TXN_ENTRY.unpack(aborted_file(store).read_bytes())] == [(0, 2, 1, 5, 3)]
        data = queue.read(2, 1 << 20).read_bytes()  # from inside producer 2's batch: its second record's sequence
        first = next(iter_batches(data))
        assert (first.base_offset, first.header.producer_id, first.header.base_sequence) == (2, 2, 1)
        assert [r.value for r in decode_batch(data, first)] == [b"p2-s1"]


def test_load_keeps_the_entries_the_commitlog_confirms(tmp_path: Path) -> None:
    """An entry the CommitLog does not hold (a marker a crash lost) and a torn last entry go at load; the aborts
    after the producer snapshot come back from the CommitLog."""
    store = tmp_path / "store"
    with open_store(store) as engine:
        engine.create_topic("t", 1)
        queue = queue_of(engine)
        queue.append(txn_batch(2, 0))
        queue.append_marker(2, 0, 1, commit=False)  # 2
        queue.append(txn_batch(3, 0))
        queue.append_marker(3, 0, 1, commit=False)  # 5
    for snapshot in aborted_file(store).parent.glob("*.snapshot"):
        snapshot.unlink()
    with open(aborted_file(store), "r+b") as handle:  # the second entry lost, a made-up one, a torn one
        handle.truncate(TXN_ENTRY.size)
        handle.seek(0, 2)
        handle.write(TXN_ENTRY.pack(0, 7, 6, 40, 41) + b"\x00\x00\x00")
    with open_store(store) as engine:
        queue = queue_of(engine)
        assert queue.aborted_transactions(0, 6) == [AbortedTransaction(2, 0), AbortedTransaction(3, 3)]
        assert queue.last_stable_offset == 6
    assert list(TXN_ENTRY.iter_unpack(aborted_file(store).read_bytes())) == [(0, 2, 0, 2, 3), (0, 3, 3, 5, 6)]


def test_retention_copies_only_committed_values_of_a_topic_kept_forever(tmp_path: Path) -> None:
    """A retention.ms=-1 topic (as __consumer_offsets, where TxnOffsetCommit writes transactionally) keeps the newest
    committed value of each key: markers, aborted records and records of an open transaction are not copied."""
    store = tmp_path / "store"
    with open_store(store, **{"tidelog.rocketmq.fileReservedTime": 0}) as engine:
        engine.create_topic("t", 1, {"retention.ms": "-1"})
        engine.create_topic("filler", 1)
        queue = queue_of(engine)
        queue.append(txn_batch(1, 0, count=1, key=b"committed"))
        queue.append_marker(1, 0, 0, commit=True)
        queue.append(txn_batch(2, 0, count=1, key=b"aborted"))
        queue.append_marker(2, 0, 0, commit=False)
        queue.append(txn_batch(3, 0, count=1, key=b"open"))
        queue.append(build_batch([Record(b"plain", key=b"plain", timestamp_ms=TS)]))
        for _ in range(40):
            engine.produce("filler", 0, [Record(b"f" * 100, timestamp_ms=TS)])
        assert engine.retention.run(manual=True) > 0
        start = queue.log_start_offset
        assert start > 5
        data = queue.read(start, 1 << 20).read_bytes()
        copies = [(r.key, r.value) for info in iter_batches(data) for r in decode_batch(data, info)]
        assert sorted(copies) == [(b"committed", b"p1-s0"), (b"plain", b"plain")]
