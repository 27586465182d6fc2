"""`kafka.isolation.level=read_committed` on the path reader: a log of committed, aborted and open transactions
written through the Kafka engine (markers by `Partition.append_marker`), read from its files. The last stable
offset and the aborted transactions the files give are checked against the engine's own answers while it is open
(the walk from a snapshot over the active segment), and Spark's rows against what a read_committed consumer must
see, batch and streaming; read_uncommitted (the default) still returns everything."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import tidelog
from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import OptionError
from tidelog.spark.committed import StableOffsets, aborted_transactions
from tidelog.spark.local_broker import LocalBroker
from tidelog.spark.logfiles import LogFiles
from tidelog.spark.options import parse_read_options

TOPIC = "txn"


class Writer:
    """Transactional and plain batches into one partition of an open engine, as producers would send them; keeps
    each data record's offset, value and fate (plain, open, commit, abort) to say what a reader must get."""

    def __init__(self, log: tidelog.StorageEngine, partition: int) -> None:
        self.log = log
        self.partition = partition
        self.sequences: dict[int, int] = {}
        self.records: list[list[Any]] = []  # [offset, value, producer id or None, fate]

    def _append(self, batch: bytes, values: tuple[str, ...], pid: int | None) -> None:
        base = self.log.append(TOPIC, self.partition, batch).base_offset
        fate = "plain" if pid is None else "open"
        self.records += [[base + i, v.encode(), pid, fate] for i, v in enumerate(values)]

    def plain(self, *values: str) -> None:
        self._append(build_batch([Record(v.encode()) for v in values]), values, None)

    def txn(self, pid: int, *values: str) -> None:
        sequence = self.sequences.get(pid, 0)
        batch = build_batch(
            [Record(v.encode()) for v in values],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=sequence,
            is_transactional=True,
        )
        self.sequences[pid] = sequence + len(values)
        self._append(batch, values, pid)

    def end(self, pid: int, commit: bool) -> None:
        self.log.partition(TOPIC, self.partition).append_marker(pid, 0, 0, commit)
        for record in self.records:
            if record[2] == pid and record[3] == "open":
                record[3] = "commit" if commit else "abort"

    @property
    def committed(self) -> list[bytes]:
        """What read_committed returns: below the first open record, the plain and committed records."""
        first_open = min((r[0] for r in self.records if r[3] == "open"), default=1 << 62)
        return [r[1] for r in self.records if r[0] < first_open and r[3] in ("plain", "commit")]

    @property
    def everything(self) -> list[bytes]:
        return [r[1] for r in self.records]


def fill(log: tidelog.StorageEngine) -> list[Writer]:
    """Partition 0: interleaved commit and abort, then an open transaction with a plain batch after it.
    Partition 1: 40 transactions over small segments (rolls write snapshots), every third aborted, none open."""
    log.create_topic(TOPIC, partitions=2)
    first, second = Writer(log, 0), Writer(log, 1)
    first.plain("v0", "v1")
    first.txn(10, "a0", "a1")
    first.txn(11, "b0")
    first.txn(10, "a2")
    first.end(10, commit=True)
    first.plain("v2")
    first.end(11, commit=False)
    first.txn(12, "d0", "d1")  # open: the last stable offset stops here
    first.plain("e0")
    for n in range(40):
        pid = 100 + n % 3
        second.txn(pid, *(f"t{n}-{i}" for i in range(5)))
        second.plain(f"p{n}")
        second.end(pid, commit=n % 3 != 0)
    return [first, second]


@pytest.fixture(scope="module")
def txn_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, tidelog.StorageEngine, list[Writer]]]:
    """The log, with its engine left open (no snapshot at the log end: the reader walks the active segment)."""
    root = tmp_path_factory.mktemp("txn-log") / "data"
    log = tidelog.open(root, config={"log.segment.bytes": 2048}, background=False)
    writers = fill(log)
    log.flush()
    try:
        yield root, log, writers
    finally:
        log.close()


def test_last_stable_offset_and_aborted_transactions_match_the_engine(
    txn_log: tuple[Path, tidelog.StorageEngine, list[Writer]],
) -> None:
    root, log, _ = txn_log
    files = LogFiles([str(root)])
    stable = StableOffsets()
    for partition in (0, 1):
        engine_partition = log.partition(TOPIC, partition)
        lso = engine_partition.last_stable_offset
        assert stable.last_stable_offset(files.partition(TOPIC, partition)) == lso
        assert stable.last_stable_offset(files.partition(TOPIC, partition)) == lso  # again, from the kept state
        end = engine_partition.log_end_offset if partition else lso
        for start in range(0, end, 7):
            ours = [
                (t.producer_id, t.first_offset)
                for t in aborted_transactions(files.partition(TOPIC, partition), start, lso)
            ]
            theirs = [(t.producer_id, t.first_offset) for t in engine_partition.aborted_transactions(start, lso)]
            assert ours == theirs
    assert log.partition(TOPIC, 0).last_stable_offset < log.log_end_offset(TOPIC, 0)  # the open transaction
    assert log.partition(TOPIC, 1).last_stable_offset == log.log_end_offset(TOPIC, 1)


def test_the_walk_follows_new_markers(tmp_path: Path) -> None:
    with tidelog.open(tmp_path / "data", background=False) as log:
        writer = fill(log)[0]
        files = LogFiles([str(tmp_path / "data")])
        stable = StableOffsets()
        before = stable.last_stable_offset(files.partition(TOPIC, 0))
        assert before == log.partition(TOPIC, 0).last_stable_offset
        writer.end(12, commit=False)
        after = stable.last_stable_offset(files.partition(TOPIC, 0))
        assert after == log.log_end_offset(TOPIC, 0) > before


def test_the_option_is_checked() -> None:
    options = parse_read_options(
        {"path": "/x", "subscribe": "t", "kafka.isolation.level": "read_committed"}, streaming=False
    )
    assert options.read_committed and not options.kafka_params
    assert not parse_read_options({"path": "/x", "subscribe": "t"}, streaming=False).read_committed
    with pytest.raises(OptionError, match="read_uncommitted or read_committed"):
        parse_read_options({"path": "/x", "subscribe": "t", "kafka.isolation.level": "committed"}, streaming=False)
    with pytest.raises(OptionError, match=r"takes only kafka\.isolation\.level"):
        parse_read_options({"path": "/x", "subscribe": "t", "kafka.group.id": "g"}, streaming=False)


def values(df: Any) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {0: [], 1: []}
    for row in sorted(df.collect(), key=lambda r: (r["partition"], r["offset"])):
        out[row["partition"]].append(bytes(row["value"]))
    return out


@pytest.mark.spark
def test_spark_reads_committed_records_only(
    spark: Any, txn_log: tuple[Path, tidelog.StorageEngine, list[Writer]]
) -> None:
    root, _, writers = txn_log
    reader = spark.read.format("tidelog").option("subscribe", TOPIC)
    committed = values(reader.option("kafka.isolation.level", "read_committed").load(str(root)))
    assert committed == {0: writers[0].committed, 1: writers[1].committed}
    assert b"e0" not in committed[0]  # after the open transaction: beyond the last stable offset
    everything = values(spark.read.format("tidelog").option("subscribe", TOPIC).load(str(root)))
    assert everything == {0: writers[0].everything, 1: writers[1].everything}
    split = values(
        spark.read.format("tidelog")
        .option("subscribe", TOPIC)
        .option("kafka.isolation.level", "read_committed")
        .option("minPartitions", 12)
        .load(str(root))
    )
    assert split == committed  # tasks starting inside transactions drop the same records


@pytest.mark.spark
def test_a_stream_waits_for_the_open_transaction(spark: Any, tmp_path: Path, stream_cleanup: None) -> None:
    root = tmp_path / "data"
    seen: list[bytes] = []
    log = tidelog.open(root, background=False)
    try:
        writer = fill(log)[0]
        query = (
            spark.readStream.format("tidelog")
            .option("assign", json.dumps({TOPIC: [0]}))
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .load(str(root))
            .writeStream.foreachBatch(lambda df, _id: seen.extend(bytes(r["value"]) for r in df.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        query.processAllAvailable()
        assert seen == writer.committed
        writer.txn(13, "f0")
        writer.end(13, commit=True)  # committed, but still behind the open transaction 12
        query.processAllAvailable()
        assert seen == writer.committed and b"f0" not in seen
        writer.end(12, commit=True)
        query.processAllAvailable()
        assert seen == writer.committed
        assert list(itertools.dropwhile(lambda v: v != b"d0", seen))[:4] == [b"d0", b"d1", b"e0", b"f0"]
        query.stop()
    finally:
        log.close()


@pytest.mark.spark
def test_both_paths_against_a_live_broker(spark: Any, broker: LocalBroker) -> None:
    """confluent-kafka transactional producers write committed, aborted and open transactions through a running
    broker; Spark in read_committed reads the same records through it and from its files (no snapshot at the log
    end while it runs: the path reader walks the active segment)."""
    topic = "txn-live"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        future.result(timeout=30)

    def producer(name: str) -> Producer:
        made = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": name})
        made.init_transactions(30)
        made.begin_transaction()
        return made

    committed, aborted, still_open = producer("live-c"), producer("live-a"), producer("live-o")
    for i in range(3):
        committed.produce(topic, f"c{i}".encode())
        aborted.produce(topic, f"a{i}".encode())
    committed.flush()
    aborted.flush()
    committed.commit_transaction(30)
    aborted.abort_transaction(30)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"p0")
    plain.flush()
    still_open.produce(topic, b"o0")
    still_open.flush()
    plain.produce(topic, b"p1")  # after the open transaction: beyond the last stable offset
    plain.flush()

    def read(**where: str) -> list[bytes]:
        reader = spark.read.format("tidelog").option("subscribe", topic)
        for key, value in where.items():
            if key != "path":
                reader = reader.option(key, value)
        df = reader.load(*([where["path"]] if "path" in where else []))
        return [bytes(r["value"]) for r in df.orderBy("offset").collect()]

    isolation = {"kafka.isolation.level": "read_committed"}
    assert read(**{"kafka.bootstrap.servers": broker.bootstrap}, **isolation) == [b"c0", b"c1", b"c2", b"p0"]
    assert read(path=str(broker.log_dir), **isolation) == [b"c0", b"c1", b"c2", b"p0"]
    everything = [b"c0", b"a0", b"c1", b"a1", b"c2", b"a2", b"p0", b"o0", b"p1"]
    assert sorted(read(path=str(broker.log_dir))) == sorted(everything)
    still_open.abort_transaction(30)
