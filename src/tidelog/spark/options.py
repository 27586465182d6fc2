"""Options of the `tidelog` Spark source and sink, with the names and meanings of Spark's Kafka integration.

Pure: a mapping of strings in, frozen dataclasses out, or OptionError naming the option and what is wrong.
Spark hands a data source its options as a case-insensitive map whose keys arrive lower-cased; a plain dict of
it loses `startingOffsets` to `startingoffsets`, so every lookup here goes through one lower-casing view and
the canonical (camelCase) name is only used in messages.

Where the data is: exactly one of `path` (one or more log directories, comma-separated, read from the segment
files) or `kafka.bootstrap.servers` (any Kafka-protocol broker). What to read: exactly one of `subscribe`,
`subscribePattern` (a regex that must match the whole topic name, as Java's `Pattern.matches`) or `assign`.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tidelog.errors import OptionError

EARLIEST = -2  # in offset JSON, as Kafka's source spells them
LATEST = -1

TopicPartition = tuple[str, int]


class Subscription(Enum):
    SUBSCRIBE = "subscribe"
    PATTERN = "subscribePattern"
    ASSIGN = "assign"


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where reading starts or ends: `kind` is earliest, latest, offsets (per partition) or timestamp(s)."""

    kind: str  # "earliest" | "latest" | "offsets" | "timestamp" | "timestamps"
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)  # offsets: -2/-1 allowed; timestamps: ms
    timestamp: int | None = None  # kind "timestamp": one timestamp for every partition


@dataclass(frozen=True, slots=True)
class ReadOptions:
    paths: tuple[str, ...]  # log directories (the file path), empty when reading through a broker
    bootstrap_servers: str | None
    subscription: Subscription
    topics: tuple[str, ...] = ()  # subscribe
    pattern: str | None = None  # subscribePattern
    assigned: tuple[TopicPartition, ...] = ()  # assign
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy: "error" | "latest"
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    kafka_params: Mapping[str, str] = field(default_factory=dict)  # `kafka.` stripped; for the client
    group_id_prefix: str = "spark-kafka-source"
    poll_timeout_ms: int = 120_000
    check_crcs: bool = True
    chunk_bytes: int = 16 << 20
    push_filters: bool = True
    stats_dir: str | None = None  # a JSON line per task with what it read (tests and benchmarks)
    read_committed: bool = False  # kafka.isolation.level=read_committed: up to the last stable offset, no aborts

    @property
    def location(self) -> str:
        return ",".join(self.paths) if self.paths else f"kafka.bootstrap.servers={self.bootstrap_servers}"

    def topic_matches(self, topic: str) -> bool:
        if self.subscription is Subscription.SUBSCRIBE:
            return topic in self.topics
        if self.subscription is Subscription.PATTERN:
            assert self.pattern is not None
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)


@dataclass(frozen=True, slots=True)
class WriteOptions:
    paths: tuple[str, ...]
    bootstrap_servers: str | None
    topic: str | None  # the `topic` option overrides a `topic` column
    kafka_params: Mapping[str, str] = field(default_factory=dict)
    lock_timeout_ms: int = 120_000  # path writes: how long a task waits for the log directory's lock
    batch_records: int = 1000  # path writes: records per stored batch
    compression: str = "none"  # path writes (broker writes use kafka.compression.type)
    exactly_once: bool = False  # tidelog.sink.exactlyOnce: tasks write in transactions the driver commits
    transactional_id_prefix: str = "tidelog-spark-"  # tidelog.sink.transactionalIdPrefix

    @property
    def location(self) -> str:
        return ",".join(self.paths) if self.paths else f"kafka.bootstrap.servers={self.bootstrap_servers}"


READ_OPTIONS = [
    "path",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "failOnDataLoss",
    "includeHeaders",
    "minPartitions",
    "maxRecordsPerPartition",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "groupIdPrefix",
    "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "pushFilters",
    "tidelog.checkCrcs",
    "tidelog.chunkBytes",
    "tidelog.statsDir",
]
WRITE_OPTIONS = [
    "path",
    "topic",
    "includeHeaders",
    "checkpointLocation",
    "tidelog.lockTimeoutMs",
    "tidelog.batchRecords",
    "tidelog.compression",
    "tidelog.sink.exactlyOnce",
    "tidelog.sink.transactionalIdPrefix",
]
# Consumer settings the source decides itself (Spark's Kafka source rejects the same ones).
REJECTED_CONSUMER_PARAMS = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "key.deserializer": "keys are always returned as binary",
    "value.deserializer": "values are always returned as binary",
    "enable.auto.commit": "the source commits no offsets; Spark's checkpoint holds them",
    "interceptor.classes": "interceptors would see records out of order",
}
REJECTED_PRODUCER_PARAMS = {
    "key.serializer": "keys are always written as binary (cast the column)",
    "value.serializer": "values are always written as binary (cast the column)",
}


class _Options:
    """A lower-casing view of Spark's options that remembers which keys were read (for typo detection)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._values: dict[str, str] = {}
        for key, value in options.items():
            self._values[str(key).lower()] = "" if value is None else str(value)

    def get(self, name: str) -> str | None:
        value = self._values.get(name.lower())
        if value is None:
            return None
        value = value.strip()
        return value

    def has(self, name: str) -> bool:
        return name.lower() in self._values

    def prefixed(self, prefix: str) -> dict[str, str]:
        lower = prefix.lower()
        return {k[len(lower) :]: v for k, v in self._values.items() if k.startswith(lower)}

    def check_typos(self, known: list[str]) -> None:
        """An option close to a known one but not equal is almost always a typo that would be silently ignored."""
        canonical = {name.lower(): name for name in known}
        for key in self._values:
            if key in canonical or key.startswith("kafka.") or key.startswith("spark."):
                continue
            close = difflib.get_close_matches(key, list(canonical), n=1, cutoff=0.85)
            if close:
                raise OptionError(f"unknown option '{key}': did you mean '{canonical[close[0]]}'?")


def _int(opts: _Options, name: str, *, minimum: int | None = None) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise OptionError(f"option '{name}' must be at least {minimum}, got {value}")
    return value


def _bool(opts: _Options, name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise OptionError(f"option '{name}' must be true or false, got {raw!r}")


_DURATION = re.compile(r"^(\d+)\s*([a-z]*)$", re.IGNORECASE)
_UNIT_MS = {
    **dict.fromkeys(("", "ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}


def parse_duration_ms(name: str, raw: str) -> int:
    """Spark's time strings: `15m`, `30s`, `500ms`, `1 hour`; a bare number means milliseconds."""
    match = _DURATION.match(raw.strip())
    if not match or match.group(2).lower() not in _UNIT_MS:
        raise OptionError(f"option '{name}' must be a duration such as 500ms, 30s or 15m, got {raw!r}")
    return int(match.group(1)) * _UNIT_MS[match.group(2).lower()]


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option '{name}' is not valid JSON ({exc.msg} at character {exc.pos}): {raw!r}") from None


def parse_partition_offsets(name: str, raw: str) -> dict[TopicPartition, int]:
    """Kafka's per-partition JSON: {"topicA": {"0": 23, "1": -1}, "topicB": {"0": -2}}."""
    data = _json(name, raw)
    if not isinstance(data, dict) or not data:
        raise OptionError(f'option \'{name}\' must be a JSON object such as {{"topic": {{"0": 23}}}}, got {raw!r}')
    result: dict[TopicPartition, int] = {}
    for topic, partitions in data.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option '{name}': topic {topic!r} must map partition numbers to values, got {raw!r}")
        for partition, value in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise OptionError(f"option '{name}': partition {partition!r} of {topic!r} is not a number") from None
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(f"option '{name}': the value for {topic}-{partition} must be an integer")
            result[(topic, number)] = value
    return result


def _assign(raw: str) -> tuple[TopicPartition, ...]:
    data = _json("assign", raw)
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option 'assign' must be a JSON object such as {{\"topicA\": [0, 1]}}, got {raw!r}")
    assigned: list[TopicPartition] = []
    for topic, partitions in data.items():
        if not isinstance(partitions, list) or not all(isinstance(p, int) and p >= 0 for p in partitions):
            raise OptionError(f"option 'assign': topic {topic!r} must map to a list of partition numbers")
        assigned += [(topic, p) for p in partitions]
    return tuple(sorted(set(assigned)))


def _location(opts: _Options, what: str) -> tuple[tuple[str, ...], str | None]:
    path = opts.get("path")
    servers = opts.get("kafka.bootstrap.servers")
    if path and servers:
        raise OptionError(
            f"set either 'path' (a log directory) or 'kafka.bootstrap.servers' (a broker) for the {what}, not both"
        )
    if not path and not servers:
        raise OptionError(
            f"the {what} needs 'path' (a tidelog or Kafka log directory, e.g. .load('/data/tidelog')) "
            "or 'kafka.bootstrap.servers' (host:port of a Kafka-protocol broker)"
        )
    paths = tuple(p.strip() for p in path.split(",") if p.strip()) if path else ()
    return paths, servers


def _timestamp(opts: _Options, name: str) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option '{name}' must be a timestamp in milliseconds since the epoch, got {raw!r}") from None
    if value < 0:
        raise OptionError(f"option '{name}' must not be negative, got {value}")
    return value


def _offset_spec(opts: _Options, prefix: str, *, streaming: bool) -> OffsetSpec | None:
    """startingTimestamp > startingOffsetsByTimestamp > startingOffsets (and the same for ending), as Spark."""
    single = _timestamp(opts, f"{prefix}Timestamp")
    if single is not None:
        return OffsetSpec("timestamp", timestamp=single)
    by_timestamp = opts.get(f"{prefix}OffsetsByTimestamp")
    if by_timestamp is not None:
        spec = parse_partition_offsets(f"{prefix}OffsetsByTimestamp", by_timestamp)
        negative = [f"{t}-{p}" for (t, p), ts in spec.items() if ts < 0]
        if negative:
            raise OptionError(f"option '{prefix}OffsetsByTimestamp': negative timestamp for {', '.join(negative)}")
        return OffsetSpec("timestamps", offsets=spec)
    raw = opts.get(f"{prefix}Offsets")
    if raw is None:
        return None
    name = f"{prefix}Offsets"
    if raw.lower() == "earliest":
        if prefix == "ending":
            raise OptionError("option 'endingOffsets' cannot be 'earliest'; use 'latest' or per-partition JSON")
        return OffsetSpec("earliest")
    if raw.lower() == "latest":
        if prefix == "starting" and not streaming:
            raise OptionError(
                "option 'startingOffsets' cannot be 'latest' for a batch query (it would read nothing); "
                "use 'earliest' or per-partition JSON"
            )
        return OffsetSpec("latest")
    offsets = parse_partition_offsets(name, raw)
    for (topic, partition), value in offsets.items():
        if value < EARLIEST:
            raise OptionError(f"option '{name}': {topic}-{partition} has offset {value} (use -2 earliest, -1 latest)")
        if prefix == "ending" and value == EARLIEST:
            raise OptionError(f"option 'endingOffsets': -2 (earliest) is not allowed, found for {topic}-{partition}")
        if prefix == "starting" and value == LATEST and not streaming:
            raise OptionError(
                f"option 'startingOffsets': -1 (latest) is not allowed in a batch query ({topic}-{partition})"
            )
    return OffsetSpec("offsets", offsets=offsets)


def parse_read_options(options: Mapping[str, Any], *, streaming: bool) -> ReadOptions:
    opts = _Options(options)
    opts.check_typos(READ_OPTIONS)
    paths, servers = _location(opts, "tidelog source")
    given = [s for s in Subscription if opts.get(s.value)]
    if not given:
        raise OptionError("one of the options 'subscribe', 'subscribePattern' or 'assign' must be set")
    if len(given) > 1:
        names = ", ".join(f"'{s.value}'" for s in given)
        raise OptionError(f"only one of 'subscribe', 'subscribePattern' or 'assign' may be set, got {names}")
    subscription = given[0]
    topics: tuple[str, ...] = ()
    pattern = None
    assigned: tuple[TopicPartition, ...] = ()
    if subscription is Subscription.SUBSCRIBE:
        topics = tuple(t.strip() for t in (opts.get("subscribe") or "").split(",") if t.strip())
        if not topics:
            raise OptionError("option 'subscribe' must list at least one topic (comma-separated)")
    elif subscription is Subscription.PATTERN:
        pattern = opts.get("subscribePattern")
        try:
            re.compile(pattern or "")
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern' is not a valid regular expression: {exc}") from None
    else:
        assigned = _assign(opts.get("assign") or "")

    starting = _offset_spec(opts, "starting", streaming=streaming) or OffsetSpec("latest" if streaming else "earliest")
    ending = _offset_spec(opts, "ending", streaming=streaming) or OffsetSpec("latest")
    strategy = (opts.get("startingOffsetsByTimestampStrategy") or "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', got {strategy!r}")
    if subscription is Subscription.ASSIGN:
        _check_assigned(starting, assigned, "startingOffsets")
        _check_assigned(ending, assigned, "endingOffsets")

    kafka_params = opts.prefixed("kafka.")
    kafka_params.pop("bootstrap.servers", None)
    for key, why in REJECTED_CONSUMER_PARAMS.items():
        if key in kafka_params:
            raise OptionError(f"option 'kafka.{key}' is not supported: {why}")
    isolation = kafka_params.get("isolation.level", "read_uncommitted").strip().lower()
    if isolation not in ("read_uncommitted", "read_committed"):
        raise OptionError(
            f"option 'kafka.isolation.level' must be read_uncommitted or read_committed, got {isolation!r}"
        )
    client_params = {k: v for k, v in kafka_params.items() if k != "isolation.level"}
    if paths and client_params:
        raise OptionError(
            f"options {', '.join('kafka.' + k for k in sorted(client_params))} configure a Kafka client, "
            "but 'path' reads the log files directly (of the kafka.* options it takes only kafka.isolation.level)"
        )
    if paths:
        kafka_params = {}
    max_trigger_delay = opts.get("maxTriggerDelay")
    chunk_bytes = _int(opts, "tidelog.chunkBytes", minimum=64 * 1024)
    return ReadOptions(
        paths=paths,
        bootstrap_servers=servers,
        subscription=subscription,
        topics=topics,
        pattern=pattern,
        assigned=assigned,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        min_partitions=_int(opts, "minPartitions", minimum=1),
        max_records_per_partition=_int(opts, "maxRecordsPerPartition", minimum=1),
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", minimum=1),
        min_offsets_per_trigger=_int(opts, "minOffsetsPerTrigger", minimum=1),
        max_trigger_delay_ms=(
            parse_duration_ms("maxTriggerDelay", max_trigger_delay) if max_trigger_delay else 15 * 60 * 1000
        ),
        kafka_params=kafka_params,
        group_id_prefix=opts.get("groupIdPrefix") or "spark-kafka-source",
        poll_timeout_ms=_int(opts, "kafkaConsumer.pollTimeoutMs", minimum=1) or 120_000,
        check_crcs=_bool(opts, "tidelog.checkCrcs", True),
        chunk_bytes=chunk_bytes or 16 << 20,
        push_filters=_bool(opts, "pushFilters", True),
        stats_dir=opts.get("tidelog.statsDir") or None,
        read_committed=isolation == "read_committed",
    )


def _check_assigned(spec: OffsetSpec, assigned: tuple[TopicPartition, ...], name: str) -> None:
    """With `assign`, per-partition offsets must name exactly the assigned partitions (as Spark checks)."""
    if spec.kind not in ("offsets", "timestamps"):
        return
    if set(spec.offsets) != set(assigned):
        option = name if spec.kind == "offsets" else name.replace("Offsets", "OffsetsByTimestamp")
        missing = sorted(set(assigned) - set(spec.offsets))
        extra = sorted(set(spec.offsets) - set(assigned))
        detail = "; ".join(
            part
            for part in (
                f"missing {', '.join(f'{t}-{p}' for t, p in missing)}" if missing else "",
                f"not assigned {', '.join(f'{t}-{p}' for t, p in extra)}" if extra else "",
            )
            if part
        )
        raise OptionError(f"option '{option}' must name exactly the partitions of 'assign' ({detail})")


def parse_write_options(options: Mapping[str, Any]) -> WriteOptions:
    opts = _Options(options)
    opts.check_typos(WRITE_OPTIONS)
    paths, servers = _location(opts, "tidelog sink")
    kafka_params = opts.prefixed("kafka.")
    kafka_params.pop("bootstrap.servers", None)
    for key, why in REJECTED_PRODUCER_PARAMS.items():
        if key in kafka_params:
            raise OptionError(f"option 'kafka.{key}' is not supported: {why}")
    if paths and kafka_params:
        raise OptionError(
            f"options {', '.join('kafka.' + k for k in sorted(kafka_params))} configure a Kafka producer, "
            "but 'path' writes the log files directly"
        )
    compression = (opts.get("tidelog.compression") or "none").lower()
    if compression not in ("none", "gzip", "snappy", "lz4", "zstd"):
        raise OptionError(f"option 'tidelog.compression' must be none, gzip, snappy, lz4 or zstd, got {compression!r}")
    exactly_once = _bool(opts, "tidelog.sink.exactlyOnce", False)
    if exactly_once and paths:
        raise OptionError(
            "option 'tidelog.sink.exactlyOnce' needs kafka.bootstrap.servers: the transactions are a broker's "
            "(a task appending to the log files has none)"
        )
    protocol = kafka_params.get("security.protocol", "plaintext").lower()
    if exactly_once and protocol != "plaintext":
        raise OptionError(
            f"option 'tidelog.sink.exactlyOnce' needs a PLAINTEXT listener (kafka.security.protocol is {protocol}): "
            "the sink's driver ends the transactions with requests of its own, which speak neither TLS nor SASL"
        )
    if "transactional.id" in kafka_params:
        raise OptionError(
            "option 'kafka.transactional.id' is not supported: for transactional writes set "
            "'tidelog.sink.exactlyOnce' (the sink gives each task its own id; 'tidelog.sink.transactionalIdPrefix' "
            "names them)"
        )
    return WriteOptions(
        paths=paths,
        bootstrap_servers=servers,
        topic=opts.get("topic") or None,
        kafka_params=kafka_params,
        lock_timeout_ms=_int(opts, "tidelog.lockTimeoutMs", minimum=0) or 120_000,
        batch_records=_int(opts, "tidelog.batchRecords", minimum=1) or 1000,
        compression=compression,
        exactly_once=exactly_once,
        transactional_id_prefix=opts.get("tidelog.sink.transactionalIdPrefix") or "tidelog-spark-",
    )
