"""The `kafka.bootstrap.servers` path: planning and reading through the Kafka protocol with confluent-kafka.

Works against `tidelog serve` and against a real Kafka cluster alike. Planning (driver) asks a consumer for
metadata, watermarks and offsets-for-times (ListOffsets); a task reads its range with a consumer of its own that
is assigned the one partition at the range's start offset (no group membership, no offset commits: progress lives
in Spark's checkpoint, as with Spark's Kafka source). Other `kafka.*` options pass through to librdkafka, except
those the source must decide itself (options.py). A leader change in a cluster is waited out, as the Java consumer
under Spark's source waits it out: planning retries an offset lookup that fails with a retriable error
(NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, a lost connection) every RETRY_INTERVAL_S until METADATA_TIMEOUT_S
has passed, and a task's consumer skips such error events while it waits for its records (librdkafka fetches from
the new leader by itself). Records are read uncommitted, as Spark's Kafka source reads
them (and as the path reader does): `kafka.isolation.level=read_committed` asks for committed ones only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tidelog.codec.record_batch import Record
from tidelog.codec.record_columns import RecordColumns, from_records
from tidelog.errors import DataLossError, KafkaClientError
from tidelog.spark.logfiles import data_loss_message
from tidelog.spark.offsets import OffsetRange
from tidelog.spark.offsets import TopicPartition as TP
from tidelog.spark.options import ReadOptions

METADATA_TIMEOUT_S = 30.0
RECORDS_PER_CHUNK = 20_000
MAX_MESSAGES_PER_POLL = 10_000
POLL_INTERVAL_S = 1.0
RETRY_INTERVAL_S = 0.5
T = TypeVar("T")
_TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}  # librdkafka's NOT_AVAILABLE/CREATE_TIME/LOG_APPEND_TIME -> Kafka's ids


def consumer_config(options: ReadOptions, **extra: Any) -> dict[str, Any]:
    group = options.kafka_params.get("group.id") or f"{options.group_id_prefix}-{uuid.uuid4()}"
    config: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap_servers,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "client.id": "tidelog-spark",
        # Spark's Kafka source (the Java consumer's default) and the path reader return the records of aborted
        # transactions too; librdkafka alone would default to read_committed
        "isolation.level": "read_uncommitted",
    }
    config.update(options.kafka_params)
    config.update(extra)
    return config


class KafkaBackend:
    """Planning answers from a broker (any Kafka-protocol server)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(consumer_config(self.options))
        return self._consumer

    def _fail(self, what: str, exc: KafkaException | KafkaError) -> KafkaClientError:
        return KafkaClientError(f"kafka.bootstrap.servers={self.options.bootstrap_servers}: {what} failed: {exc}")

    def _retrying(self, call: Callable[[], T]) -> T:
        """`call()`, again after a retriable error (a leader moving) until METADATA_TIMEOUT_S has passed."""
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while True:
            try:
                return call()
            except KafkaException as exc:
                if not _transient(exc.args[0] if exc.args else None) or time.monotonic() > deadline:
                    raise
            time.sleep(RETRY_INTERVAL_S)

    def topic_partitions(self) -> dict[str, list[int]]:
        try:
            metadata = self.consumer.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise self._fail("listing topics", exc) from None
        return {
            name: sorted(topic.partitions)
            for name, topic in sorted(metadata.topics.items())
            if topic.error is None and topic.partitions
        }

    def _watermarks(self, partitions: Iterable[TP]) -> dict[TP, tuple[int, int]]:
        result = {}
        for topic, partition in partitions:
            wanted = TopicPartition(topic, partition)
            try:
                low, high = self._retrying(
                    partial(self.consumer.get_watermark_offsets, wanted, timeout=METADATA_TIMEOUT_S, cached=False)
                )
            except KafkaException as exc:
                raise self._fail(f"fetching the offsets of {topic}-{partition}", exc) from None
            result[(topic, partition)] = (low, high)
        return result

    def earliest(self, partitions: Iterable[TP]) -> dict[TP, int]:
        return {tp: low for tp, (low, _) in self._watermarks(partitions).items()}

    def latest(self, partitions: Iterable[TP]) -> dict[TP, int]:
        return {tp: high for tp, (_, high) in self._watermarks(partitions).items()}

    def offset_for_timestamp(self, tp: TP, timestamp_ms: int) -> int | None:
        try:
            (found,) = self._retrying(
                lambda: self.consumer.offsets_for_times(
                    [TopicPartition(tp[0], tp[1], timestamp_ms)], timeout=METADATA_TIMEOUT_S
                )
            )
        except KafkaException as exc:
            raise self._fail(f"looking up timestamp {timestamp_ms} in {tp[0]}-{tp[1]}", exc) from None
        if found.error is not None:
            raise self._fail(f"looking up timestamp {timestamp_ms} in {tp[0]}-{tp[1]}", found.error)
        return None if found.offset < 0 else found.offset

    def batch_starts(self, r: OffsetRange) -> Sequence[int] | None:
        return None  # a broker does not tell where batches start; ranges are split evenly

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _transient(error: Any) -> bool:
    """An error a leader change causes, which the next attempt (or librdkafka itself) gets past."""
    if not isinstance(error, KafkaError):
        return False
    return bool(error.retriable()) or error.code() in _TRANSIENT_CODES


_TRANSIENT_CODES = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._DESTROY_BROKER,  # a request to a broker that left the metadata (killed) while it was waiting
}


def _record(message: Any) -> tuple[Record, int]:
    kind, timestamp = message.timestamp()
    headers = message.headers() or []
    return (
        Record(message.value(), message.key(), timestamp if kind else -1, headers, message.offset()),
        _TIMESTAMP_TYPES.get(kind, -1),
    )


def read_columns(options: ReadOptions, r: OffsetRange) -> Iterator[RecordColumns]:
    """Records [r.start, r.end) of one partition, through a consumer assigned to it, in chunks of columns."""
    if r.size <= 0:
        return
    consumer = Consumer(consumer_config(options, **{"enable.partition.eof": True}))
    name = f"{r.topic}-{r.partition}"
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        records: list[Record] = []
        types: list[int] = []
        position = r.start
        deadline = time.monotonic() + options.poll_timeout_ms / 1000
        while position < r.end:
            # consume() waits until it has num_messages or the timeout passes: ask for no more than is left
            wanted = int(min(MAX_MESSAGES_PER_POLL, r.end - position))
            messages = consumer.consume(num_messages=wanted, timeout=POLL_INTERVAL_S)
            if not messages:
                if time.monotonic() > deadline:
                    raise KafkaClientError(
                        f"{name}: no record at offset {position} within kafkaConsumer.pollTimeoutMs "
                        f"({options.poll_timeout_ms} ms) from {options.bootstrap_servers}"
                    )
                continue
            deadline = time.monotonic() + options.poll_timeout_ms / 1000
            for message in messages:
                error = message.error()
                if error is not None:
                    position = _handle_error(consumer, options, r, position, error, message.offset())
                    continue
                offset = message.offset()
                assert offset is not None  # only error events have none
                if offset >= r.end:
                    position = r.end
                    break
                record, timestamp_type = _record(message)
                records.append(record)
                types.append(timestamp_type)
                position = offset + 1
            if len(records) >= RECORDS_PER_CHUNK:
                yield from_records(records, types)
                records, types = [], []
        if records:
            yield from_records(records, types)
    finally:
        consumer.close()


def _handle_error(
    consumer: Consumer, options: ReadOptions, r: OffsetRange, position: int, error: Any, eof: int | None
) -> int:
    """The position to continue from after an error event (end of partition, offset out of range), or raise."""
    name = f"{r.topic}-{r.partition}"
    code = error.code()
    if code == KafkaError._PARTITION_EOF:
        if eof is None or eof < 0 or eof >= r.end:
            return r.end  # everything below `end` was delivered (offsets may have gaps after compaction)
        return position  # the high watermark is still below `end`: keep waiting for the planned records
    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        low, _high = consumer.get_watermark_offsets(TopicPartition(r.topic, r.partition), timeout=METADATA_TIMEOUT_S)
        if options.fail_on_data_loss:
            raise DataLossError(
                data_loss_message(f"{name}: offset {position} is out of range (the log now starts at {low})")
            )
        target = max(position, low)
        consumer.assign([TopicPartition(r.topic, r.partition, target)])
        return target
    if _transient(error):
        return position  # librdkafka goes on fetching (from the new leader); kafkaConsumer.pollTimeoutMs still applies
    raise KafkaClientError(f"{name}: reading from {options.bootstrap_servers} failed: {error}")
