"""The `tidelog` sink: Spark's Kafka sink columns, written to a log directory or through a broker.

Columns (as Spark's Kafka sink): `value` (binary or string, required), `key` (binary or string; absent = null
key), `topic` (string; required unless the `topic` option is set, which overrides it), `partition` (int; absent or
null = Kafka's murmur2 partitioner on the key, sticky round-robin for null keys), `headers`
(array<struct<key string, value binary>>). Other columns are ignored.

Where to: `kafka.bootstrap.servers` = each task runs its own idempotent producer (acks=all,
enable.idempotence=true, Java-compatible murmur2 partitioning); `path` = each task encodes record batches and
appends them to the log directory itself, holding the directory's lock only while it appends (so it cannot write
while a broker serves that directory; write through the broker then).

Delivery guarantee by default: at-least-once. Within one task attempt nothing is written twice (the idempotent
producer drops its own retries; a local append happens once or raises). A task Spark retries, a failed job Spark
re-runs, or a micro-batch replayed after a crash writes its records again; readers that need exactly-once must
de-duplicate, for example on a key. Nothing is rolled back on abort.

`tidelog.sink.exactlyOnce=true` (through a broker): each task writes in a Kafka transaction that the driver
commits when Spark commits the batch (or the job), and a replayed micro-batch skips the tasks whose transaction
was committed before; read_committed readers see each batch once (transactions.py has the protocol).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import KafkaClientError, KafkaStorageError, OptionError, UnknownTopicOrPartitionError
from tidelog.partitioner import partition_for_key
from tidelog.spark.options import WriteOptions, parse_write_options
from tidelog.spark.transactions import MARKER_METADATA, CoordinatorClient, OpenTransaction

log = logging.getLogger("tidelog.spark")
FLUSH_BYTES = 16 << 20  # path writes: encoded bytes a task buffers before it takes the lock and appends
LOCK_RETRY_S = 0.05
TRANSACTION_CALL_TIMEOUT_S = 60.0
# What Spark's stream execution sets on the tasks of a micro-batch (StreamExecution, MicroBatchExecution).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True, slots=True)
class SinkSpec:
    options: WriteOptions
    has_key: bool
    has_topic: bool
    has_partition: bool
    has_headers: bool
    write_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # names a batch write's transactions


def check_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError(
            "the tidelog sink appends to a log and cannot overwrite it; use mode 'append' (or the default)"
        )


def _is_header_type(data_type: Any) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], BinaryType | StringType)
    )


def parse_sink(options: Any, schema: StructType) -> SinkSpec:
    """Check the DataFrame's columns and the options on the driver, before any task runs."""
    opts = parse_write_options(options)
    columns = {f.name: f.dataType for f in schema.fields}
    if "value" not in columns:
        raise OptionError(
            f"the tidelog sink needs a 'value' column (binary or string); the columns are {list(columns)}"
        )
    for name in ("key", "value"):
        if name in columns and not isinstance(columns[name], BinaryType | StringType):
            raise OptionError(f"column '{name}' must be binary or string, not {columns[name].simpleString()}")
    if "topic" in columns and not isinstance(columns["topic"], StringType):
        raise OptionError(f"column 'topic' must be a string, not {columns['topic'].simpleString()}")
    if "topic" not in columns and opts.topic is None:
        raise OptionError("set the option 'topic' or give the DataFrame a 'topic' column (which topic to write to)")
    if "partition" in columns and not isinstance(columns["partition"], IntegerType):
        raise OptionError(f"column 'partition' must be an int, not {columns['partition'].simpleString()}")
    if "headers" in columns and not _is_header_type(columns["headers"]):
        raise OptionError(
            "column 'headers' must be array<struct<key: string, value: binary>>, "
            f"not {columns['headers'].simpleString()}"
        )
    if opts.paths and opts.topic is not None:
        from tidelog.spark.logfiles import LogFiles

        if opts.topic not in LogFiles(opts.paths).topics():
            raise UnknownTopicOrPartitionError(
                f"option 'topic': topic {opts.topic!r} does not exist in {opts.location}; create it first "
                "(tidelog.open(...).create_topic, or write through a broker that auto-creates topics)"
            )
    if opts.bootstrap_servers and opts.topic is not None:
        _check_broker_topic(opts, opts.topic)
    return SinkSpec(opts, "key" in columns, "topic" in columns, "partition" in columns, "headers" in columns)


def _producer_config(options: WriteOptions) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",  # the Java client's partitioning of keyed records
        "linger.ms": 5,
        "client.id": "tidelog-spark-sink",
    }
    config.update(options.kafka_params)
    return config


def _check_broker_topic(options: WriteOptions, topic: str) -> None:
    """Asks the broker for `topic` as the tasks' producers will (a broker that auto-creates topics creates it now);
    a topic that is not there and will not be created fails here, on the driver, instead of in every task after
    the producer's metadata timeout."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    from tidelog.spark.kafka_client import METADATA_TIMEOUT_S

    producer = Producer(_producer_config(options))
    try:
        metadata = producer.list_topics(topic=topic, timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaClientError(
            f"{options.location}: looking up topic {topic!r} (option 'topic') failed: {exc}"
        ) from None
    finally:
        producer.close()
    found = metadata.topics.get(topic)
    error = None if found is None else found.error
    if found is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise UnknownTopicOrPartitionError(
            f"option 'topic': topic {topic!r} does not exist on {options.location} and the broker does not create "
            "topics automatically; create it first"
        )
    if error is not None and error.code() != KafkaError.LEADER_NOT_AVAILABLE:  # that one: being auto-created
        raise KafkaClientError(f"option 'topic': topic {topic!r} cannot be written on {options.location}: {error}")


@dataclass
class WriteSummary(WriterCommitMessage):
    records: int = 0
    per_partition: dict[str, int] = field(default_factory=dict)
    transaction: OpenTransaction | None = None  # exactly-once: the task's open transaction, for the driver to end
    skipped: int = 0  # exactly-once: rows not written again, their batch being committed already


def _column(batch: pa.RecordBatch, name: str, binary: bool = False) -> list[Any]:
    array = batch.column(batch.schema.get_field_index(name))
    if binary and pa.types.is_string(array.type):
        array = array.cast(pa.binary())
    return array.to_pylist()


def _rows(spec: SinkSpec, batch: pa.RecordBatch) -> Iterator[tuple[str, int | None, Record]]:
    n = batch.num_rows
    values = _column(batch, "value", binary=True)
    keys = _column(batch, "key", binary=True) if spec.has_key else [None] * n
    topics = [spec.options.topic] * n if spec.options.topic else _column(batch, "topic")
    partitions = _column(batch, "partition") if spec.has_partition else [None] * n
    headers = _column(batch, "headers") if spec.has_headers else [None] * n
    for i in range(n):
        topic = topics[i]
        if topic is None:
            raise OptionError("a row has a null 'topic' and the option 'topic' is not set")
        row_headers = [
            (h["key"], h["value"].encode() if isinstance(h["value"], str) else h["value"]) for h in headers[i] or ()
        ]
        yield topic, partitions[i], Record(values[i], keys[i], None, row_headers)


class _Partitioner:
    """Kafka's default: murmur2 of the key; null keys stick to one partition per batch, then move on."""

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, count: int, key: bytes | None, given: int | None) -> int:
        if given is not None:
            if not 0 <= given < count:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {given} (it has {count})")
            return given
        if key is not None:
            return partition_for_key(key, count)
        if topic not in self._sticky:
            self._sticky[topic] = random.randrange(count)
        return self._sticky[topic] % count

    def next_batch(self, topic: str) -> None:
        if topic in self._sticky:
            self._sticky[topic] += 1


# --- writing to a log directory ---------------------------------------------------------------------------------


class _LogDirWriter:
    def __init__(self, options: WriteOptions) -> None:
        from tidelog.spark.logfiles import LogFiles

        self.options = options
        self.partition_counts = {t: len(ps) for t, ps in LogFiles(options.paths).topics().items()}
        self.partitioner = _Partitioner()
        self.pending: dict[tuple[str, int], list[Record]] = defaultdict(list)
        self.encoded: list[tuple[str, int, bytes]] = []
        self.encoded_bytes = 0
        self.summary = WriteSummary()
        self.compression = Compression.from_name(options.compression)

    def add(self, topic: str, given: int | None, record: Record) -> None:
        count = self.partition_counts.get(topic)
        if count is None:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist in {self.options.location}; create it before writing to it"
            )
        partition = self.partitioner.partition(topic, count, record.key, given)
        records = self.pending[(topic, partition)]
        records.append(record)
        if len(records) >= self.options.batch_records:
            self._encode(topic, partition)

    def _encode(self, topic: str, partition: int) -> None:
        records = self.pending.pop((topic, partition), [])
        if not records:
            return
        batch = build_batch(records, compression=self.compression)
        self.encoded.append((topic, partition, batch))
        self.encoded_bytes += len(batch)
        self.partitioner.next_batch(topic)
        if self.encoded_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        for topic, partition in list(self.pending):
            self._encode(topic, partition)
        if not self.encoded:
            return
        log = self._open()
        try:
            for topic, partition, batch in self.encoded:
                result = log.append(topic, partition, batch)
                self.summary.records += result.record_count
                name = f"{topic}-{partition}"
                self.summary.per_partition[name] = self.summary.per_partition.get(name, 0) + result.record_count
        finally:
            log.close()
        self.encoded = []
        self.encoded_bytes = 0

    def _open(self) -> Any:
        import tidelog

        deadline = time.monotonic() + self.options.lock_timeout_ms / 1000
        while True:
            try:
                return tidelog.open(
                    self.options.paths[0], config={"log.dirs": ",".join(self.options.paths)}, background=False
                )
            except KafkaStorageError as exc:
                if "in use by another process" not in str(exc) or time.monotonic() > deadline:
                    raise KafkaStorageError(
                        f"{exc}; waited {self.options.lock_timeout_ms} ms (tidelog.lockTimeoutMs). If a broker "
                        "serves this directory, write through it with kafka.bootstrap.servers instead"
                    ) from None
                time.sleep(LOCK_RETRY_S * (1 + random.random()))


# --- writing through a broker -------------------------------------------------------------------------------


class _ProducerWriter:
    def __init__(self, options: WriteOptions, **extra: Any) -> None:
        from confluent_kafka import Producer

        self.options = options
        self.producer = Producer({**_producer_config(options), **extra})
        self.errors: list[str] = []
        self.summary = WriteSummary()

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(f"{message.topic()}: {error}")
            return
        self.summary.records += 1
        name = f"{message.topic()}-{message.partition()}"
        self.summary.per_partition[name] = self.summary.per_partition.get(name, 0) + 1

    def add(self, topic: str, given: int | None, record: Record) -> None:
        kwargs: dict[str, Any] = {"value": record.value, "key": record.key, "on_delivery": self._delivered}
        if given is not None:
            kwargs["partition"] = given
        if record.headers:
            kwargs["headers"] = list(record.headers)
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                self.producer.poll(0.1)
        self.producer.poll(0)
        if self.errors:
            self._raise()

    def flush(self) -> None:
        remaining = self.producer.flush(300)
        if remaining:
            self.errors.append(f"{remaining} records were not acknowledged within 300 s")
        if self.errors:
            self._raise()

    def _raise(self) -> None:
        raise KafkaClientError(
            f"writing to kafka.bootstrap.servers={self.options.bootstrap_servers} failed: {'; '.join(self.errors[:5])}"
        )


class _TransactionalWriter(_ProducerWriter):
    """One task's transaction (transactions.py): fence earlier producers of the id, skip a batch already
    committed, write, learn the producer id and epoch, add the batch marker, and leave the transaction open for
    the driver."""

    def __init__(self, options: WriteOptions, name: str, batch_id: int | None) -> None:
        assert options.bootstrap_servers is not None
        self.transactional_id = f"{options.transactional_id_prefix}{name}"
        super().__init__(options, **{"transactional.id": self.transactional_id})
        self.batch_id = batch_id
        self.control = CoordinatorClient(options.bootstrap_servers)
        self.producer.init_transactions(TRANSACTION_CALL_TIMEOUT_S)  # fences and aborts earlier producers of the id
        done = None if batch_id is None else self.control.committed_batch(self.transactional_id)
        self.already_committed = done is not None and batch_id is not None and done >= batch_id
        self.first_topic: str | None = None

    def add(self, topic: str, given: int | None, record: Record) -> None:
        if self.already_committed:
            self.summary.skipped += 1
            return
        if self.first_topic is None:
            self.first_topic = topic
            self.producer.begin_transaction()
        super().add(topic, given, record)

    def flush(self) -> None:
        if self.first_topic is None:
            return  # no row, or the batch is in already: no transaction
        super().flush()
        # The id's producer id and epoch, read while the transaction is open. Should a newer attempt fence this
        # producer before this point, the marker below fails (it carries our epoch), so the driver is never
        # handed the newer attempt's transaction; after it, the driver's EndTxn with our epoch is refused.
        txn = self.control.describe(self.transactional_id)
        self._add_marker(self.first_topic)
        self.summary.transaction = txn

    def _add_marker(self, topic: str) -> None:
        """The batch marker (offset batch id + 1 of the id's group; 0 for a batch write, which is not replayed),
        committed with the rows."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        group = Consumer({"bootstrap.servers": self.options.bootstrap_servers, "group.id": self.transactional_id})
        try:
            batch = -1 if self.batch_id is None else self.batch_id
            marker = TopicPartition(topic, 0, batch + 1, metadata=f"{MARKER_METADATA}{batch}")
            self.producer.send_offsets_to_transaction(
                [marker], group.consumer_group_metadata(), TRANSACTION_CALL_TIMEOUT_S
            )
        except KafkaException as exc:
            raise KafkaClientError(f"{self.transactional_id}: adding the batch marker failed: {exc}") from None
        finally:
            group.close()


def _task_writer(spec: SinkSpec) -> _LogDirWriter | _ProducerWriter:
    options = spec.options
    if options.paths:
        return _LogDirWriter(options)
    if not options.exactly_once:
        return _ProducerWriter(options)
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "a sink task runs in a Spark task"
    query = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    topic = f"{options.topic}-" if options.topic else ""  # two writes of one micro-batch, to two topics
    if query is None or batch is None:  # a batch write: one job, ended by the driver's commit or abort
        return _TransactionalWriter(options, f"{spec.write_id}-{topic}{context.partitionId()}", None)
    return _TransactionalWriter(options, f"{query}-{topic}{context.partitionId()}", int(batch))


def write_task(spec: SinkSpec, batches: Iterator[pa.RecordBatch]) -> WriteSummary:
    writer = _task_writer(spec)
    for batch in batches:
        for topic, partition, record in _rows(spec, batch):
            writer.add(topic, partition, record)
    writer.flush()
    return writer.summary


def end_transactions(spec: SinkSpec, messages: list[WriterCommitMessage | None], commit: bool) -> None:
    """The driver's half of exactly-once: end every task's open transaction (at-least-once: nothing to do, the
    records are in the log and cannot be taken back). A refused commit raises (the batch fails and is replayed);
    a refused abort is left to the next producer of the id or the transaction timeout."""
    if not spec.options.exactly_once:
        return
    assert spec.options.bootstrap_servers is not None
    txns = [m.transaction for m in messages if isinstance(m, WriteSummary) and m.transaction is not None]
    if not txns:
        return
    refused = CoordinatorClient(spec.options.bootstrap_servers).end(txns, commit)
    if refused and commit:
        raise KafkaClientError("; ".join(str(error) for error in refused))
    for error in refused:
        log.warning("tidelog sink: %s; the transaction timeout or the next attempt aborts it", error)


class TidelogBatchWriter(DataSourceArrowWriter):
    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteSummary:
        return write_task(self.spec, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        end_transactions(self.spec, messages, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        end_transactions(self.spec, messages, commit=False)


class TidelogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteSummary:
        return write_task(self.spec, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        end_transactions(self.spec, messages, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        end_transactions(self.spec, messages, commit=False)
