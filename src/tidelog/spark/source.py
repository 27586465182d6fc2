"""The `tidelog` data source: Spark's Kafka source and sink in PySpark's Python Data Source API.

    spark.read.format("tidelog").option("subscribe", "page_visits").load("/data/tidelog")       # log files
    spark.readStream.format("tidelog").option("kafka.bootstrap.servers", "host:9092")...       # any broker
    df.write.format("tidelog").option("topic", "out").save("/data/tidelog")

Same schema, option names and offset JSON as Spark's Kafka integration (see options.py). Planning (which
partitions, offset ranges, pushed filters) runs on the driver; each task gets a small `TidelogPartition`
(topic, partition, offset range) and reads it itself: from the segment files (`path`; executors on several
machines read in parallel from a shared filesystem), or through a Kafka consumer. Tasks hand Spark Arrow record
batches (arrow.py): decoded column-wise from the segment files on the path (codec/batch_columns.py), built from
librdkafka's messages one by one on the broker path.

Streaming: offsets per partition in Spark's checkpoint (Kafka's JSON), so a restarted query resumes exactly where
it stopped; partitions that appear later are read from their start; `maxOffsetsPerTrigger`,
`minOffsetsPerTrigger` + `maxTriggerDelay` and `Trigger.AvailableNow` behave as in Kafka's source; offsets that
retention removed follow `failOnDataLoss`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from crc32c import crc32c
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidelog.codec import legacy
from tidelog.codec.batch_columns import decode_v2
from tidelog.codec.batch_table import BatchTable
from tidelog.codec.record_batch import ATTRIBUTES_OFFSET
from tidelog.codec.record_columns import RecordColumns, from_records
from tidelog.codec.record_set import decode_batch, read_batch_info
from tidelog.errors import CrcMismatchError, DataLossError
from tidelog.spark import arrow
from tidelog.spark.committed import aborted_mask, aborted_transactions
from tidelog.spark.logfiles import data_loss_message, locate
from tidelog.spark.offsets import (
    Bound,
    OffsetRange,
    PushedFilters,
    TopicPartition,
    offsets_from_json,
    offsets_to_json,
    push_filter,
    rate_limit,
    split_ranges,
)
from tidelog.spark.options import ReadOptions, parse_read_options
from tidelog.spark.planning import (
    Backend,
    check_data_loss,
    check_within_log,
    open_backend,
    plan_batch,
    resolve_start,
    subscribed,
)

NAME = "tidelog"
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
HEADERS_COLUMN = "headers array<struct<key: string, value: binary>>"
MAX_ROWS_PER_ARROW_BATCH = 1 << 15  # measured: 32 Ki rows per batch suits Spark's Arrow reader best


def source_schema(include_headers: bool) -> str:
    return f"{KAFKA_SCHEMA}, {HEADERS_COLUMN}" if include_headers else KAFKA_SCHEMA


@dataclass(frozen=True)
class TidelogPartition(InputPartition):
    """What one task reads: offsets [start, end) of one topic partition (plus row filters pushed by Spark)."""

    topic: str
    partition: int
    start: int
    end: int
    timestamps: Bound = field(default_factory=Bound)

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.start, self.end)


# --- reading one partition range (runs in tasks) ------------------------------------------------------------


@dataclass(slots=True)
class ReadStats:
    batches: int = 0
    records_decoded: int = 0
    rows: int = 0
    bytes_read: int = 0
    decode_s: float = 0.0  # reading and decoding (the source's own work)
    arrow_s: float = 0.0  # building Arrow batches
    total_s: float = 0.0  # first to last record, including the time Spark spends between batches

    def write(self, options: ReadOptions, part: TidelogPartition) -> None:
        if not options.stats_dir:
            return
        os.makedirs(options.stats_dir, exist_ok=True)
        line = {
            "topic": part.topic,
            "partition": part.partition,
            "start": part.start,
            "end": part.end,
            "batches": self.batches,
            "records_decoded": self.records_decoded,
            "rows": self.rows,
            "bytes_read": self.bytes_read,
            "decode_s": round(self.decode_s, 4),
            "arrow_s": round(self.arrow_s, 4),
            "total_s": round(self.total_s, 4),
        }
        path = os.path.join(options.stats_dir, f"{os.getpid()}-{uuid.uuid4().hex}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(line, handle)


def read_partition(options: ReadOptions, part: TidelogPartition) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records of `part`, in offset order."""
    if part.end <= part.start:
        return
    stats = ReadStats()
    if options.paths:
        chunks = _file_columns(options, part, stats)
    else:
        from tidelog.spark.kafka_client import read_columns

        chunks = read_columns(options, part.range)
    started = time.perf_counter()
    mark = started
    for cols in chunks:
        now = time.perf_counter()
        stats.decode_s += now - mark
        stats.records_decoded += len(cols)
        mask = (cols.offset >= part.start) & (cols.offset < part.end)
        if part.timestamps.low is not None:
            mask &= cols.timestamp >= part.timestamps.low
        if part.timestamps.high is not None:
            mask &= cols.timestamp <= part.timestamps.high
        cols = cols.select(mask)
        if len(cols) == 0:
            continue
        stats.rows += len(cols)
        # Arrow batches built at their final size: a slice of a bigger batch costs Spark's serializer extra work
        for start in range(0, len(cols), MAX_ROWS_PER_ARROW_BATCH):
            piece = cols.rows(start, start + MAX_ROWS_PER_ARROW_BATCH)
            batch = arrow.to_record_batch(piece, part.topic, part.partition, options.include_headers)
            stats.arrow_s += time.perf_counter() - now
            yield batch
            now = time.perf_counter()
        mark = time.perf_counter()
    stats.total_s = time.perf_counter() - started
    stats.write(options, part)


def _file_columns(options: ReadOptions, part: TidelogPartition, stats: ReadStats) -> Iterator[RecordColumns]:
    files = locate(options.paths, part.topic, part.partition)
    low = part.timestamps.low
    aborted = aborted_transactions(files, part.start, part.end) if options.read_committed else []
    for chunk in files.read(
        part.start, part.end, fail_on_data_loss=options.fail_on_data_loss, chunk_bytes=options.chunk_bytes
    ):
        table = chunk.table
        stats.bytes_read += table.end
        last = table.last_offset
        wanted = (last >= part.start) & ~table.is_control
        if low is not None:  # batches whose largest timestamp is below the bound hold no wanted row
            wanted &= table.max_timestamp >= low
        if aborted:
            wanted &= ~aborted_mask(table, aborted)
        v2 = wanted & (table.magic == 2)
        base = table.header["base_offset"].astype(np.int64)
        v2 &= base < part.end
        if v2.any():
            selected = table.take(v2)
            if options.check_crcs:
                _check_crcs(chunk.data, selected, chunk.describe)
            stats.batches += len(selected)
            yield decode_v2(chunk.data, selected, with_headers=options.include_headers)
        old = wanted & (table.magic < 2)
        if old.any():
            yield _legacy_columns(chunk.data, table.take(old), options.check_crcs, chunk.describe)


def _check_crcs(data: bytes | bytearray | memoryview, table: BatchTable, describe: Any) -> None:
    view = memoryview(data)
    crcs = table.header["crc"].tolist()
    for pos, size, expected in zip(table.position.tolist(), table.size.tolist(), crcs, strict=True):
        actual = crc32c(view[pos + ATTRIBUTES_OFFSET : pos + size])
        if actual != expected:
            raise CrcMismatchError(
                f"{describe(pos)} fails its CRC check (stored {expected:#010x}, computed {actual:#010x}); "
                "set tidelog.checkCrcs=false to read it anyway"
            )


def _legacy_columns(
    data: bytes | bytearray | memoryview, table: BatchTable, check_crcs: bool, describe: Any
) -> RecordColumns:
    """Magic 0/1 entries (old segments) through the row decoder: rare, so simplicity wins."""
    records = []
    types = []
    for pos in table.position.tolist():
        info = read_batch_info(data, pos)
        assert info is not None
        if check_crcs and legacy.legacy_crc(data, info.header) != info.crc:  # type: ignore[arg-type]
            raise CrcMismatchError(f"{describe(pos)} fails its CRC check")
        decoded = decode_batch(data, info)
        records += decoded
        types += [int(info.timestamp_type)] * len(decoded)
    return from_records(records, types)


# --- pushed filters -------------------------------------------------------------------------------------------

_FILTER_KINDS: dict[type, str] = {
    EqualTo: "eq",
    EqualNullSafe: "eq",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
    In: "in",
    IsNotNull: "notnull",
}


def apply_filters(filters: Sequence[Filter]) -> tuple[PushedFilters, list[Filter]]:
    """The filters we evaluate exactly, folded into one PushedFilters; the rest are left to Spark."""
    state = PushedFilters()
    rejected: list[Filter] = []
    for f in filters:
        kind = _FILTER_KINDS.get(type(f))
        attribute: tuple[str, ...] = getattr(f, "attribute", ())  # a column's name path
        if kind is None or len(attribute) != 1:
            rejected.append(f)
            continue
        value = getattr(f, "value", None)
        if kind == "eq" and value is None:  # `col = NULL` is never true; `<=> NULL` on a non-null column neither
            rejected.append(f)
            continue
        narrowed = push_filter(state, kind, attribute[0], value)
        if narrowed is None:
            rejected.append(f)
        else:
            state = narrowed
    return state, rejected


# --- batch ----------------------------------------------------------------------------------------------------


class TidelogBatchReaderNoPushdown(DataSourceReader):
    """The batch reader for sessions without `spark.sql.python.filterPushdown.enabled` (option pushFilters=false)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.filters = PushedFilters()

    def partitions(self) -> list[InputPartition]:
        backend = open_backend(self.options)
        try:
            ranges = plan_batch(self.options, self.filters, backend)
        finally:
            backend.close()
        return [TidelogPartition(r.topic, r.partition, r.start, r.end, self.filters.timestamps) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TidelogPartition):  # Spark's stand-in when there is nothing to read
            return iter(())
        return read_partition(self.options, partition)


class TidelogBatchReader(TidelogBatchReaderNoPushdown):
    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Predicates on topic, partition, offset and timestamp become offset ranges (index and time-index
        lookups at planning) and an exact row filter in the task; everything else is returned to Spark."""
        state, rejected = apply_filters(filters)
        self.filters = state
        yield from rejected


# --- streaming ------------------------------------------------------------------------------------------------


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are Kafka's JSON `{"topic": {"0": 42}}`; Spark checkpoints them and resumes from them."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._backend: Backend | None = None
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow: never read past this
        self._last_trigger_ms = time.time() * 1000
        self._known: set[TopicPartition] = set()

    def __getstate__(self) -> dict[str, Any]:  # the copy that runs read() needs no client
        state = self.__dict__.copy()
        state["_backend"] = None
        return state

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = open_backend(self.options)
        return self._backend

    def _partitions(self) -> list[TopicPartition]:
        return subscribed(self.options, self.backend, must_exist=False)

    def initialOffset(self) -> dict[str, Any]:
        partitions = subscribed(self.options, self.backend)
        earliest = self.backend.earliest(partitions)
        latest = self.backend.latest(partitions)
        start = resolve_start(self.options, self.backend, partitions, earliest, latest)
        check_within_log(self.options, start, latest, "starting")
        self._known = set(partitions)
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self._partitions()
        self._target = self.backend.latest(partitions)

    def _latest(self) -> dict[TopicPartition, int]:
        partitions = self._partitions()
        if self._target is not None:
            partitions = [tp for tp in partitions if tp in self._target]
        latest = self.backend.latest(partitions)
        if self._target is not None:
            latest = {tp: min(offset, self._target[tp]) for tp, offset in latest.items()}
        return latest

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return offsets_to_json(self._latest())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        current = offsets_from_json(start)
        latest = self._latest()
        vanished = sorted(tp for tp in current if tp not in latest)
        if vanished:  # the topic was deleted (or its partitions are not there any more)
            if self.options.fail_on_data_loss:
                names = ", ".join(f"{t}-{p}" for t, p in vanished)
                raise DataLossError(data_loss_message(f"partitions {names} were deleted"))
            current = {tp: offset for tp, offset in current.items() if tp in latest}
        new = [tp for tp in latest if tp not in current]
        begin = {**self.backend.earliest(new), **current}
        if isinstance(limit, ReadAllAvailable):
            return offsets_to_json(latest)
        if isinstance(limit, ReadMinRows):
            available = sum(max(0, latest[tp] - begin.get(tp, latest[tp])) for tp in latest)
            now = time.time() * 1000
            if available < limit.min_rows and now - self._last_trigger_ms < self.options.max_trigger_delay_ms:
                return offsets_to_json(current)
            self._last_trigger_ms = now
            if self.options.max_offsets_per_trigger is not None:
                return offsets_to_json(rate_limit(self.options.max_offsets_per_trigger, begin, latest))
            return offsets_to_json(latest)
        if isinstance(limit, ReadMaxRows):
            return offsets_to_json(rate_limit(limit.max_rows, begin, latest))
        return offsets_to_json(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = offsets_from_json(start)
        until = offsets_from_json(end)
        options = self.options
        gone = sorted(tp for tp in begin if tp not in until)
        if gone and options.fail_on_data_loss:
            raise DataLossError(data_loss_message(f"partitions {gone} were deleted"))
        new = [tp for tp in until if tp not in begin]
        earliest_new = self.backend.earliest(new)
        for tp, offset in earliest_new.items():
            if offset != 0 and options.fail_on_data_loss:
                raise DataLossError(
                    data_loss_message(f"added partition {tp[0]}-{tp[1]} starts from {offset} instead of 0")
                )
        ranges = []
        earliest_now: dict[TopicPartition, int] | None = None
        for tp in sorted(until):
            s = begin.get(tp, earliest_new.get(tp, 0))
            e = until[tp]
            if e < s:
                if options.fail_on_data_loss:
                    raise DataLossError(data_loss_message(f"{tp[0]}-{tp[1]}: the offset went back from {s} to {e}"))
                continue
            if e == s:
                continue
            if earliest_now is None:
                earliest_now = self.backend.earliest([t for t in until if t in begin])
            s = check_data_loss(options, tp, s, earliest_now.get(tp, s))
            if e > s:
                ranges.append(OffsetRange(tp[0], tp[1], s, e))
        ranges = split_ranges(
            ranges, options.min_partitions, options.max_records_per_partition, self.backend.batch_starts
        )
        return [TidelogPartition(r.topic, r.partition, r.start, r.end) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TidelogPartition)
        return read_partition(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # like Spark's Kafka source: progress lives in the checkpoint, not in a consumer group

    def stop(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


# --- the data source --------------------------------------------------------------------------------------------


class TidelogDataSource(DataSource):
    """`format("tidelog")`: Spark's Kafka source and sink over a tidelog/Kafka log directory or any broker."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        """Called by `load()`: a read's options are checked here already, so mistakes fail before any query."""
        if any(self.options.get(name) for name in ("subscribe", "subscribePattern", "assign")):
            parse_read_options(self.options, streaming=True)  # batch-only rules are checked at planning
        raw = str(self.options.get("includeHeaders", "false")).strip().lower()
        return source_schema(raw == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        if not options.push_filters:
            return TidelogBatchReaderNoPushdown(options)
        return TidelogBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidelogStreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from tidelog.spark.writer import TidelogBatchWriter, check_overwrite, parse_sink

        check_overwrite(overwrite)
        return TidelogBatchWriter(parse_sink(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from tidelog.spark.writer import TidelogStreamWriter, parse_sink

        return TidelogStreamWriter(parse_sink(self.options, schema))
