r"""`tidelog topics|produce|consume`: Kafka's console tools, for any broker that speaks the Kafka protocol.

They behave like kafka-topics.sh, kafka-console-producer.sh and kafka-console-consumer.sh, on confluent-kafka
(librdkafka), so they work against tidelog and Apache Kafka alike:

- topics: --create, --list, --describe, --delete print what kafka-topics.sh prints (`Created topic T.`, the
  `Topic: T\tTopicId: ...\tConfigs: ...` line and one `\tTopic: T\tPartition: 0\tLeader: ...` line per partition).
  Topic ids and configs are best effort: a broker without DescribeTopics/DescribeConfigs gets what it can answer.
- produce: one record per stdin line, split as Kafka's LineMessageReader does (parse.key, key.separator,
  parse.headers, headers.delimiter, headers.separator, headers.key.separator, ignore.error, null.marker); keys
  are placed by `murmur2_random` (the Java client's partition for a key). It waits for every delivery report;
  any failed record is reported on stderr and makes the exit code 1.
- consume: prints records as Kafka's DefaultMessageFormatter does (the value alone unless print.* properties
  ask for more). With --group it subscribes and auto-commits; without, it subscribes under a random group that
  never commits, or assigns the one --partition. It stops after --max-messages, after --timeout-ms without a
  record, or on SIGINT/SIGTERM; it always closes the consumer and prints `Processed a total of N messages`.

Every failure is a ToolError: one line on stderr, exit code 1 (2 for bad usage), never a traceback. Separator
properties accept the escapes \t, \n, \r and \\ (shells pass them through literally). The parsing and
formatting helpers come first and are pure; the I/O lives in `topics`, `produce` and `consume`.
"""

from __future__ import annotations

import base64
import collections
import functools
import itertools
import os
import random
import re
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, BinaryIO, TypeVar, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, NewTopic, ResourceType

from tidelog.errors import ToolError

DEFAULT_CONNECT_TIMEOUT_MS = 10_000
REQUEST_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.2
USAGE = 2  # exit code for bad usage, as argparse uses


# --- properties (pure) ------------------------------------------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    r"""`\t`, `\n`, `\r` and `\\` become the characters they name; anything else is kept as typed."""
    return re.sub(r"\\([tnr\\])", lambda match: _ESCAPES[match.group(1)], text)


def parse_key_values(items: Sequence[str], option: str) -> dict[str, str]:
    """`["a=1", "b=x=y"]` -> `{"a": "1", "b": "x=y"}` (split at the first `=`; later items win)."""
    settings: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ToolError(f"{option} {item!r}: expected KEY=VALUE", USAGE)
        settings[key.strip()] = value
    return settings


def _check_known(properties: Mapping[str, str], known: Sequence[str]) -> None:
    unknown = sorted(set(properties) - set(known))
    if unknown:
        raise ToolError(f"unknown --property {unknown[0]!r} (known: {', '.join(known)})", USAGE)


def _flag(properties: Mapping[str, str], key: str, default: bool) -> bool:
    text = properties.get(key)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ToolError(f"--property {key}={text}: expected true or false", USAGE)
    return text.strip().lower() == "true"


def _separator(properties: Mapping[str, str], key: str, default: str) -> str:
    text = properties.get(key)
    if text is None:
        return default
    if not text:
        raise ToolError(f"--property {key}: the separator may not be empty", USAGE)
    return unescape(text)


# --- lines -> records (pure): Kafka's LineMessageReader -----------------------------------------------------------

LINE_PROPERTIES = (
    "parse.key",
    "key.separator",
    "parse.headers",
    "headers.delimiter",
    "headers.separator",
    "headers.key.separator",
    "ignore.error",
    "null.marker",
)

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class LineFormat:
    """How a stdin line splits into `headers<delimiter>key<separator>value` (Kafka's property names)."""

    parse_key: bool = False
    key_separator: str = "\t"
    parse_headers: bool = False
    headers_delimiter: str = "\t"
    headers_separator: str = ","
    headers_key_separator: str = ":"
    ignore_error: bool = False
    null_marker: str | None = None

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> LineFormat:
        _check_known(properties, LINE_PROPERTIES)
        line_format = cls(
            parse_key=_flag(properties, "parse.key", False),
            key_separator=_separator(properties, "key.separator", "\t"),
            parse_headers=_flag(properties, "parse.headers", False),
            headers_delimiter=_separator(properties, "headers.delimiter", "\t"),
            headers_separator=_separator(properties, "headers.separator", ","),
            headers_key_separator=_separator(properties, "headers.key.separator", ":"),
            ignore_error=_flag(properties, "ignore.error", False),
            null_marker=unescape(properties["null.marker"]) if "null.marker" in properties else None,
        )
        line_format._check_distinct()
        return line_format

    def _check_distinct(self) -> None:
        """The pairs Kafka refuses to have equal, because a line could not be split back apart."""
        pairs = [
            ("headers.delimiter", self.headers_delimiter, "headers.separator", self.headers_separator),
            ("headers.delimiter", self.headers_delimiter, "headers.key.separator", self.headers_key_separator),
            ("headers.separator", self.headers_separator, "headers.key.separator", self.headers_key_separator),
            ("null.marker", self.null_marker, "key.separator", self.key_separator),
            ("null.marker", self.null_marker, "headers.separator", self.headers_separator),
            ("null.marker", self.null_marker, "headers.delimiter", self.headers_delimiter),
            ("null.marker", self.null_marker, "headers.key.separator", self.headers_key_separator),
        ]
        for name_a, a, name_b, b in pairs:
            if a == b:
                raise ToolError(f"{name_a} and {name_b} may not be equal", USAGE)


@dataclass(frozen=True)
class LineRecord:
    key: bytes | None
    value: bytes | None
    headers: list[Header] = field(default_factory=list)


def parse_line(line: str, line_format: LineFormat, line_number: int) -> LineRecord:
    """One record from one line (without its line break), or a ToolError worded as Kafka words it."""
    fmt = line_format
    headers = _leading_field(fmt.parse_headers, line, 0, fmt.headers_delimiter, "headers delimiter", fmt, line_number)
    start = 0 if headers is None else len(headers) + len(fmt.headers_delimiter)
    key = _leading_field(fmt.parse_key, line, start, fmt.key_separator, "key separator", fmt, line_number)
    if key is not None:
        start += len(key) + len(fmt.key_separator)
    value = line[start:]
    parsed_headers = [] if headers is None or headers == fmt.null_marker else _split_headers(headers, fmt, line_number)
    return LineRecord(_text_bytes(key, fmt), _text_bytes(value, fmt), parsed_headers)


def _leading_field(
    enabled: bool, line: str, start: int, separator: str, name: str, fmt: LineFormat, line_number: int
) -> str | None:
    if not enabled:
        return None
    end = line.find(separator, start)
    if end == -1:
        if fmt.ignore_error:
            return None
        raise ToolError(f"No {name} found on line number {line_number}: '{line}'")
    return line[start:end]


def _split_headers(text: str, fmt: LineFormat, line_number: int) -> list[Header]:
    pairs = text.split(fmt.headers_separator)
    while len(pairs) > 1 and pairs[-1] == "":  # Java's String.split drops trailing empty strings
        pairs.pop()
    headers: list[Header] = []
    for pair in pairs:
        key, sep, value = pair.partition(fmt.headers_key_separator)
        if not sep:
            if not fmt.ignore_error:
                raise ToolError(f"No header key separator found in pair '{pair}' on line number {line_number}")
            headers.append((pair, None))
            continue
        if key == fmt.null_marker:
            raise ToolError(f"Header keys should not be equal to the null marker '{key}' as they can't be null")
        headers.append((key, _text_bytes(value, fmt)))
    return headers


def _text_bytes(text: str | None, fmt: LineFormat) -> bytes | None:
    return None if text is None or text == fmt.null_marker else text.encode("utf-8")


# --- records -> lines (pure): Kafka's DefaultMessageFormatter -----------------------------------------------------

RECORD_PROPERTIES = (
    "print.timestamp",
    "print.partition",
    "print.offset",
    "print.headers",
    "print.key",
    "print.value",
    "key.separator",
    "line.separator",
    "headers.separator",
    "null.literal",
)

TIMESTAMP_TYPE_NAMES = {TIMESTAMP_CREATE_TIME: "CreateTime", TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}


@dataclass(frozen=True)
class RecordFormat:
    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    null_literal: bytes = b"null"

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> RecordFormat:
        _check_known(properties, RECORD_PROPERTIES)
        return cls(
            print_timestamp=_flag(properties, "print.timestamp", False),
            print_partition=_flag(properties, "print.partition", False),
            print_offset=_flag(properties, "print.offset", False),
            print_headers=_flag(properties, "print.headers", False),
            print_key=_flag(properties, "print.key", False),
            print_value=_flag(properties, "print.value", True),
            key_separator=_separator(properties, "key.separator", "\t").encode(),
            line_separator=_separator(properties, "line.separator", "\n").encode(),
            headers_separator=_separator(properties, "headers.separator", ",").encode(),
            null_literal=unescape(properties.get("null.literal", "null")).encode(),
        )


@dataclass(frozen=True)
class ConsumedRecord:
    partition: int
    offset: int
    timestamp_type: int  # confluent_kafka's TIMESTAMP_* constants
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] = field(default_factory=list)

    @classmethod
    def from_message(cls, message: Message) -> ConsumedRecord:
        """A record poll() returned (not an error event: only those lack a partition and offset)."""
        partition, offset = message.partition(), message.offset()
        if partition is None or offset is None:
            raise ValueError(f"not a consumed record: {message.error()}")
        timestamp_type, timestamp = message.timestamp()
        # A consumed message's headers are (name, bytes | None) pairs; the stubs type all that produce() accepts.
        headers = cast("list[Header] | None", message.headers())
        return cls(
            partition=partition,
            offset=offset,
            timestamp_type=timestamp_type,
            timestamp=timestamp,
            key=message.key(),
            value=message.value(),
            headers=list(headers or []),
        )


def format_record(record: ConsumedRecord, fmt: RecordFormat) -> bytes:
    """The bytes kafka-console-consumer prints for a record: chosen fields joined by key.separator, then
    line.separator after the last one (no line at all when every field is turned off)."""
    fields: list[bytes] = []
    if fmt.print_timestamp:
        name = TIMESTAMP_TYPE_NAMES.get(record.timestamp_type)
        fields.append(f"{name}:{record.timestamp}".encode() if name else b"NO_TIMESTAMP")
    if fmt.print_partition:
        fields.append(f"Partition:{record.partition}".encode())
    if fmt.print_offset:
        fields.append(f"Offset:{record.offset}".encode())
    if fmt.print_headers:
        pairs = [key.encode() + b":" + _or_null(value, fmt) for key, value in record.headers]
        fields.append(fmt.headers_separator.join(pairs) if pairs else b"NO_HEADERS")
    if fmt.print_key:
        fields.append(_or_null(record.key, fmt))
    if fmt.print_value:
        fields.append(_or_null(record.value, fmt))
    return fmt.key_separator.join(fields) + fmt.line_separator if fields else b""


def _or_null(data: bytes | None, fmt: RecordFormat) -> bytes:
    return fmt.null_literal if data is None else data


# --- topic descriptions (pure): kafka-topics.sh --describe --------------------------------------------------------


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    leader: int  # -1: no leader
    replicas: list[int]
    isr: list[int]


def kafka_uuid(most_significant: int, least_significant: int) -> str | None:
    """Kafka's text form of a Uuid (22 chars of URL-safe base64), or None for the zero Uuid ("no id")."""
    if most_significant == 0 and least_significant == 0:
        return None
    raw = struct.pack(">qq", most_significant, least_significant)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def describe_lines(
    topic: str, topic_id: str | None, partitions: Sequence[PartitionInfo], configs: Mapping[str, str | None]
) -> list[str]:
    """kafka-topics.sh --describe for one topic: the topic line, then one line per partition."""
    ordered = sorted(partitions, key=lambda p: p.partition)
    replication_factor = len(ordered[0].replicas) if ordered else 0
    config_text = ",".join(f"{name}={'null' if value is None else value}" for name, value in configs.items())
    head = f"Topic: {topic}" + (f"\tTopicId: {topic_id}" if topic_id else "")
    lines = [f"{head}\tPartitionCount: {len(ordered)}\tReplicationFactor: {replication_factor}\tConfigs: {config_text}"]
    for p in ordered:
        leader = str(p.leader) if p.leader >= 0 else "none"
        lines.append(
            f"\tTopic: {topic}\tPartition: {p.partition}\tLeader: {leader}"
            f"\tReplicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}"
        )
    return lines


# --- consumer start (pure): kafka-console-consumer's option rules -------------------------------------------------


def parse_offset(text: str) -> int:
    """--offset: `earliest`, `latest` or a non-negative offset, as librdkafka's start offset."""
    lowered = text.strip().lower()
    if lowered == "earliest":
        return OFFSET_BEGINNING
    if lowered == "latest":
        return OFFSET_END
    if lowered.isdigit():
        return int(lowered)
    raise ToolError(
        f"The provided offset value '{text}' is incorrect. "
        "Valid values are 'earliest', 'latest', or a non-negative long.",
        USAGE,
    )


# --- clients -----------------------------------------------------------------------------------------------------


class ClientErrors:
    """librdkafka's error_cb (served by poll()): recent errors explain a failed connection; a fatal one stops."""

    def __init__(self) -> None:
        self.recent: collections.deque[KafkaError] = collections.deque(maxlen=16)
        self.fatal: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        self.recent.append(error)
        if error.fatal():
            self.fatal = error

    def reason(self) -> str | None:
        """The most telling recent error: a broker's own failure rather than 'all brokers are down'."""
        specific = [e for e in self.recent if e.code() != KafkaError._ALL_BROKERS_DOWN]
        chosen = specific or list(self.recent)
        return chosen[-1].str() if chosen else None


def base_config(bootstrap_server: str, errors: ClientErrors, client_id: str) -> dict[str, Any]:
    # librdkafka logs every failed connection attempt to stderr; errors reach the user through error_cb and
    # results instead. `log_level` (or `debug`) in the user's properties turns logging back on.
    return {"bootstrap.servers": bootstrap_server, "client.id": client_id, "error_cb": errors, "log_level": 0}


ClientT = TypeVar("ClientT", AdminClient, Producer, Consumer)


def new_client(kind: type[ClientT], config: dict[str, Any]) -> ClientT:
    try:
        return kind(config)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ToolError(f"invalid client configuration: {error_message(exc)}", USAGE) from None


def error_message(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def cluster_metadata(
    client: AdminClient | Producer | Consumer,
    bootstrap_server: str,
    timeout_ms: int,
    errors: ClientErrors,
    topic: str | None = None,
) -> ClusterMetadata:
    """The cluster's metadata (one topic's, or every topic's), or a ToolError if no broker answers in time."""
    try:
        return client.list_topics(topic, timeout=timeout_ms / 1000)
    except KafkaException as exc:
        client.poll(0)  # serve error_cb, which knows why: refused, unresolvable, TLS, ...
        reason = errors.reason() or error_message(exc)
        raise ToolError(f"cannot reach a broker at {bootstrap_server} within {timeout_ms} ms: {reason}") from None


_MISSING_TOPIC_CODES = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


def _existing_partitions(metadata: ClusterMetadata, topic: str) -> list[int]:
    described = metadata.topics.get(topic)
    if described is None or (described.error is not None and described.error.code() in _MISSING_TOPIC_CODES):
        raise ToolError(f"Topic '{topic}' does not exist")
    return sorted(described.partitions)


def _check_partition(partition: int | None, partitions: Sequence[int], topic: str) -> None:
    if partition is not None and partition not in partitions:
        raise ToolError(f"Partition {partition} of topic '{topic}' does not exist (it has {len(partitions)})")


F = TypeVar("F", bound=Callable[..., int])


def reports_kafka_errors(command: F) -> F:
    """A KafkaException the command did not expect still ends as one line, not a traceback."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> int:
        try:
            return command(*args, **kwargs)
        except KafkaException as exc:
            raise ToolError(error_message(exc)) from None

    return run  # type: ignore[return-value]


# --- topics ------------------------------------------------------------------------------------------------------

_ONLY_WITH = {  # option -> the actions it belongs to (kafka-topics.sh refuses the others)
    "--partitions": ("create",),
    "--replication-factor": ("create",),
    "--config": ("create",),
    "--if-not-exists": ("create",),
    "--if-exists": ("describe", "delete"),
}


@dataclass(frozen=True)
class TopicsOptions:
    bootstrap_server: str
    action: str  # create, list, describe or delete
    topic: str | None = None
    partitions: int | None = None
    replication_factor: int | None = None
    configs: dict[str, str] = field(default_factory=dict)
    if_not_exists: bool = False
    if_exists: bool = False
    client_config: dict[str, str] = field(default_factory=dict)  # --command-config
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS

    def __post_init__(self) -> None:
        given = {
            "--partitions": self.partitions is not None,
            "--replication-factor": self.replication_factor is not None,
            "--config": bool(self.configs),
            "--if-not-exists": self.if_not_exists,
            "--if-exists": self.if_exists,
        }
        for option, actions in _ONLY_WITH.items():
            if given[option] and self.action not in actions:
                raise ToolError(f"option {option} can't be used with --{self.action}", USAGE)
        if self.action in ("create", "delete") and not self.topic:
            raise ToolError(f"--{self.action} needs --topic", USAGE)
        if self.partitions is not None and self.partitions < 1:
            raise ToolError("The partitions must be greater than 0", USAGE)
        if self.replication_factor is not None and not 1 <= self.replication_factor <= 32767:
            raise ToolError("The replication factor must be between 1 and 32767 inclusive", USAGE)
        check_timeout(self.connect_timeout_ms)


def check_timeout(connect_timeout_ms: int) -> None:
    if connect_timeout_ms <= 0:
        raise ToolError("--connect-timeout-ms must be positive", USAGE)


@reports_kafka_errors
def topics(options: TopicsOptions) -> int:
    errors = ClientErrors()
    config = {**base_config(options.bootstrap_server, errors, "tidelog-topics"), **options.client_config}
    admin = new_client(AdminClient, config)
    metadata = cluster_metadata(admin, options.bootstrap_server, options.connect_timeout_ms, errors)
    if options.action == "create":
        _create_topic(admin, options)
    elif options.action == "list":
        for name in sorted(metadata.topics):
            print(name)
    else:
        names = _named_topics(metadata, options)
        if options.action == "describe":
            _describe_topics(admin, metadata, names)
        elif names:
            futures = admin.delete_topics(names, operation_timeout=REQUEST_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S)
            for future in futures.values():
                future.result()
    return 0


def _create_topic(admin: AdminClient, options: TopicsOptions) -> None:
    assert options.topic is not None
    if "." in options.topic or "_" in options.topic:
        print(
            "WARNING: Due to limitations in metric names, topics with a period ('.') or underscore ('_') could "
            "collide. To avoid issues it is best to use either, but not both."
        )
    new_topic = NewTopic(
        options.topic,
        num_partitions=options.partitions if options.partitions is not None else -1,
        replication_factor=options.replication_factor if options.replication_factor is not None else -1,
        config={key: value.strip() for key, value in options.configs.items()},
    )
    futures = admin.create_topics([new_topic], operation_timeout=REQUEST_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S)
    try:
        futures[options.topic].result()
    except KafkaException as exc:
        error = exc.args[0]
        if options.if_not_exists and isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise
    print(f"Created topic {options.topic}.")


def _named_topics(metadata: ClusterMetadata, options: TopicsOptions) -> list[str]:
    """--topic T if it exists (else an error, or nothing with --if-exists); without --topic, every topic."""
    if not options.topic:
        return sorted(metadata.topics)
    if options.topic in metadata.topics:
        return [options.topic]
    if options.if_exists:
        return []
    raise ToolError(f"Topic '{options.topic}' does not exist as expected")


def _describe_topics(admin: AdminClient, metadata: ClusterMetadata, names: list[str]) -> None:
    if not names:
        return
    topic_ids = _topic_ids(admin, names)
    configs, unavailable = _topic_configs(admin, names)
    if unavailable:
        print(f"(topic configs are not shown: {unavailable})", file=sys.stderr)
    for name in names:
        partitions = [
            PartitionInfo(p.id, p.leader, list(p.replicas), list(p.isrs))
            for p in metadata.topics[name].partitions.values()
        ]
        for line in describe_lines(name, topic_ids.get(name), partitions, configs.get(name, {})):
            print(line)


def _topic_ids(admin: AdminClient, names: list[str]) -> dict[str, str | None]:
    """Topic ids from DescribeTopics; a broker or client that cannot tell leaves them out, as Kafka does."""
    try:
        futures = admin.describe_topics(TopicCollection(names), request_timeout=REQUEST_TIMEOUT_S)
    except KafkaException:
        return {}
    ids: dict[str, str | None] = {}
    for name, future in futures.items():
        try:
            uuid = future.result().topic_id
        except KafkaException:
            continue
        if uuid is not None:
            ids[name] = kafka_uuid(uuid.get_most_significant_bits(), uuid.get_least_significant_bits())
    return ids


def _topic_configs(admin: AdminClient, names: list[str]) -> tuple[dict[str, dict[str, str | None]], str | None]:
    """Each topic's non-default configs from DescribeConfigs, and why they are missing if the broker can't say."""
    resources = {name: ConfigResource(ResourceType.TOPIC, name) for name in names}
    try:
        futures = admin.describe_configs(list(resources.values()), request_timeout=REQUEST_TIMEOUT_S)
    except KafkaException as exc:
        return {}, error_message(exc)
    configs: dict[str, dict[str, str | None]] = {}
    unavailable = None
    for name, resource in resources.items():
        try:
            entries = futures[resource].result()
        except KafkaException as exc:
            unavailable = error_message(exc)
            continue
        configs[name] = {key: entry.value for key, entry in entries.items() if not entry.is_default}
    return configs, unavailable


# --- produce -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProduceOptions:
    bootstrap_server: str
    topic: str
    line_format: LineFormat = field(default_factory=LineFormat)
    partition: int | None = None
    acks: str | None = None
    compression_type: str | None = None
    producer_config: dict[str, str] = field(default_factory=dict)  # --producer-property
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS

    def __post_init__(self) -> None:
        check_timeout(self.connect_timeout_ms)

    def client_config(
        self, errors: ClientErrors, on_delivery: Callable[[KafkaError | None, Message], None]
    ) -> dict[str, Any]:
        """--acks and --compression-type win over --producer-property, as kafka-console-producer merges them."""
        config: dict[str, Any] = {
            **base_config(self.bootstrap_server, errors, "console-producer"),
            "partitioner": "murmur2_random",
            **self.producer_config,
            "on_delivery": on_delivery,
        }
        if self.acks is not None:
            config["acks"] = self.acks
        if self.compression_type is not None:
            config["compression.type"] = self.compression_type
        return config


class _Deliveries:
    """Delivery reports: counts failures and reports each as kafka-console-producer's ErrorLoggingCallback does."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.failed = 0

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.report(message.key(), message.value(), error.str())

    def report(self, key: bytes | None, value: bytes | None, reason: str) -> None:
        self.failed += 1
        print(
            f"Error when sending message to topic {self.topic} with key: {_size(key)}, value: {_size(value)} "
            f"with error: {reason}",
            file=sys.stderr,
        )


def _size(data: bytes | None) -> str:
    return "null" if data is None else f"{len(data)} bytes"


def read_lines(stream: BinaryIO) -> Iterator[str]:
    """Lines without their line break, decoded as UTF-8 the way Java's reader does (bad bytes become U+FFFD)."""
    for raw in stream:
        yield raw.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")


@reports_kafka_errors
def produce(options: ProduceOptions) -> int:
    errors = ClientErrors()
    deliveries = _Deliveries(options.topic)
    producer = new_client(Producer, options.client_config(errors, deliveries))
    metadata = cluster_metadata(producer, options.bootstrap_server, options.connect_timeout_ms, errors, options.topic)
    _check_partition(options.partition, _existing_partitions(metadata, options.topic), options.topic)
    prompt = sys.stdin.isatty() and sys.stdout.isatty()
    interrupted = False
    try:
        for number, line in enumerate(_prompted(read_lines(sys.stdin.buffer), prompt), start=1):
            _send(producer, options, parse_line(line, options.line_format, number), deliveries)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        producer.flush()  # every delivery report arrives before we return (or raise a parse error)
    if errors.fatal is not None:
        raise ToolError(errors.fatal.str())
    if interrupted:
        return 128 + signal.SIGINT
    return 1 if deliveries.failed else 0


def _prompted(lines: Iterator[str], prompt: bool) -> Iterator[str]:
    """kafka-console-producer's `>` before each line, when a person is typing."""
    while True:
        if prompt:
            print(">", end="", flush=True)
        line = next(lines, None)
        if line is None:
            return
        yield line


def _produce_headers(record: LineRecord) -> list[tuple[str, str | bytes | None]] | None:
    """The record's headers as produce() takes them (None for none). The stubs declare a list of the wider pair type,
    and list is invariant: the cast only widens."""
    return cast("list[tuple[str, str | bytes | None]]", record.headers) or None


def _send(producer: Producer, options: ProduceOptions, record: LineRecord, deliveries: _Deliveries) -> None:
    extra: dict[str, Any] = {"partition": options.partition} if options.partition is not None else {}
    while True:
        try:
            producer.produce(options.topic, record.value, record.key, headers=_produce_headers(record), **extra)
            break
        except BufferError:  # the local queue is full: serve delivery reports until there is room
            producer.poll(POLL_INTERVAL_S)
        except KafkaException as exc:  # refused before sending (too large, unknown partition, ...)
            deliveries.report(record.key, record.value, error_message(exc))
            break
    producer.poll(0)


# --- consume -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumeOptions:
    bootstrap_server: str
    topic: str
    record_format: RecordFormat = field(default_factory=RecordFormat)
    group: str | None = None
    from_beginning: bool = False
    partition: int | None = None
    offset: str | None = None
    max_messages: int | None = None
    timeout_ms: int | None = None
    consumer_config: dict[str, str] = field(default_factory=dict)  # --consumer-property
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.offset is not None:
            if self.partition is None:
                raise ToolError("The partition is required when offset is specified.", USAGE)
            if self.from_beginning:
                raise ToolError("Options from-beginning and offset cannot be specified together.", USAGE)
            parse_offset(self.offset)
        if self.max_messages is not None and self.max_messages < 0:
            raise ToolError("--max-messages must not be negative", USAGE)
        if self.timeout_ms is not None and self.timeout_ms < 0:
            raise ToolError("--timeout-ms must not be negative", USAGE)
        check_timeout(self.connect_timeout_ms)
        self.group_id()  # the group rules below raise here, before anything connects

    def group_id(self) -> str | None:
        """The one group the user named (--group or group.id), or None; naming two differs is an error."""
        named = {g for g in (self.group, self.consumer_config.get("group.id")) if g is not None}
        if len(named) > 1:
            detected = ", ".join(f"'{g}'" for g in sorted(named))
            raise ToolError(
                f"The group ids provided in different places do not match. Detected group ids: {detected}", USAGE
            )
        if named and self.partition is not None:
            raise ToolError("Options group and partition cannot be specified together.", USAGE)
        return named.pop() if named else None

    def client_config(self, errors: ClientErrors) -> dict[str, Any]:
        """kafka-console-consumer's consumer properties: a named group auto-commits; a random one never commits;
        --from-beginning means auto.offset.reset=earliest and may not contradict an explicit one."""
        config: dict[str, Any] = {
            **base_config(self.bootstrap_server, errors, "console-consumer"),
            "allow.auto.create.topics": True,  # the Java consumer's default: the topic may appear as we wait
            **self.consumer_config,
        }
        reset = self.consumer_config.get("auto.offset.reset")
        if reset is None:
            config["auto.offset.reset"] = "earliest" if self.from_beginning else "latest"
        elif self.from_beginning and reset.strip().lower() not in ("earliest", "smallest", "beginning"):
            raise ToolError(
                f"Can't simultaneously specify --from-beginning and 'auto.offset.reset={reset}', "
                "please remove one option",
                USAGE,
            )
        group = self.group_id()
        if group is None:
            config["group.id"] = f"console-consumer-{random.randrange(100_000)}"
            config.setdefault("enable.auto.commit", False)
        else:
            config["group.id"] = group
        return config

    def start_offset(self) -> int:
        """Where an assigned --partition starts: --offset, else the beginning or the end."""
        if self.offset is not None:
            return parse_offset(self.offset)
        return OFFSET_BEGINNING if self.from_beginning else OFFSET_END


class _StopSignals:
    """SIGINT and SIGTERM ask the poll loop to stop (it closes the consumer cleanly); restores the old handlers."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


@reports_kafka_errors
def consume(options: ConsumeOptions) -> int:
    errors = ClientErrors()
    consumer = new_client(Consumer, options.client_config(errors))
    try:
        metadata = cluster_metadata(
            consumer, options.bootstrap_server, options.connect_timeout_ms, errors, options.topic
        )
        partitions = _existing_partitions(metadata, options.topic)
        _check_partition(options.partition, partitions, options.topic)
    except ToolError:
        consumer.close()
        raise
    if options.partition is not None:
        consumer.assign([TopicPartition(options.topic, options.partition, options.start_offset())])
    else:
        consumer.subscribe([options.topic])
    count = 0
    with _StopSignals() as stop:
        try:
            for message in itertools.islice(
                _messages(consumer, options.timeout_ms, errors, stop), options.max_messages
            ):
                if not _write(format_record(ConsumedRecord.from_message(message), options.record_format)):
                    break
                count += 1
        finally:
            consumer.close()  # leaves the group; with auto-commit on, commits what was printed
            print(f"Processed a total of {count} messages", file=sys.stderr, flush=True)
    return 128 + stop.received if stop.received is not None else 0


def _messages(
    consumer: Consumer, timeout_ms: int | None, errors: ClientErrors, stop: _StopSignals
) -> Iterator[Message]:
    """Records as they arrive, until a stop signal or `timeout_ms` without a record; a fatal error raises."""
    idle_deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    while stop.received is None:
        if errors.fatal is not None:
            raise ToolError(errors.fatal.str())
        wait = POLL_INTERVAL_S if idle_deadline is None else min(POLL_INTERVAL_S, idle_deadline - time.monotonic())
        message = consumer.poll(max(wait, 0.0))
        if message is None:
            if idle_deadline is not None and time.monotonic() >= idle_deadline:
                return
            continue
        error = message.error()
        if error is not None:
            if error.fatal() or error.code() in _MISSING_TOPIC_CODES:
                raise ToolError(error.str())
            continue  # librdkafka recovers from the others (a leader moved, a broker restarted) by itself
        yield message
        if timeout_ms is not None:
            idle_deadline = time.monotonic() + timeout_ms / 1000


def _write(data: bytes) -> bool:
    """Write to stdout; False once the reader has gone (`tidelog consume ... | head`), which ends the run."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        _silence_stdout()
        return False
    return True


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
