"""Configuration with Kafka's own key names, types and defaults.

Two levels, as in Kafka: broker keys (`log.segment.bytes`, `log.dirs`, ...) and per-topic overrides
(`segment.bytes`, `retention.ms`, ...). A broker key that sets a topic default maps to its topic key
(`log.roll.hours` -> `segment.ms`). Values may be Python values or the strings of a properties file.
An unknown key, a value of the wrong type or out of range raises ConfigError naming the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tidelog.errors import ConfigError

LONG_MAX = (1 << 63) - 1
LONG_MIN = -(1 << 63)
INT_MAX = (1 << 31) - 1
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the line terminators of java.util.Properties


def parse_int(key: str, raw: Any) -> int:
    """A Java long: decimal digits with an optional sign (no `1_000`, no other scripts' digits), in range."""
    if isinstance(raw, bool):
        raise ConfigError(f"config {key}: expected a 64-bit integer, got {raw!r}")
    if isinstance(raw, str) and _JAVA_INTEGER.fullmatch(raw.strip()):
        raw = int(raw.strip())
    if not isinstance(raw, int) or not LONG_MIN <= raw <= LONG_MAX:
        raise ConfigError(f"config {key}: expected a 64-bit integer, got {raw!r}")
    return raw


def parse_bool(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ConfigError(f"config {key}: expected true or false, got {raw!r}")


def parse_float(key: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise ConfigError(f"config {key}: expected a number, got {raw!r}")
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            pass
    raise ConfigError(f"config {key}: expected a number, got {raw!r}")


def parse_str(key: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"config {key}: expected a string, got {raw!r}")
    return raw.strip()


def parse_list(key: str, raw: Any) -> list[str]:
    if isinstance(raw, str):
        items = [item.strip() for item in raw.split(",")]
    elif isinstance(raw, list | tuple):
        items = [str(item).strip() for item in raw]
    else:
        raise ConfigError(f"config {key}: expected a comma-separated list, got {raw!r}")
    items = [item for item in items if item]
    if not items:
        raise ConfigError(f"config {key}: the list is empty")
    return items


@dataclass(frozen=True)
class Key:
    name: str
    parse: Callable[[str, Any], Any]
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None

    def convert(self, raw: Any) -> Any:
        value = self.parse(self.name, raw)
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"config {self.name}: {value} is below the minimum {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"config {self.name}: {value} is above the maximum {self.maximum}")
        if self.choices is not None:
            values = value if isinstance(value, list) else [value]
            for item in values:
                if item not in self.choices:
                    raise ConfigError(f"config {self.name}: {item!r} is not one of {', '.join(self.choices)}")
        return value


# --- per-topic keys (Kafka's TopicConfig names) ---------------------------------------------------------------

TOPIC_KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        Key("segment.bytes", parse_int, minimum=14, maximum=INT_MAX),
        Key("segment.ms", parse_int, minimum=1),
        Key("segment.jitter.ms", parse_int, minimum=0),
        Key("segment.index.bytes", parse_int, minimum=4, maximum=INT_MAX),
        Key("index.interval.bytes", parse_int, minimum=0, maximum=INT_MAX),
        Key("flush.messages", parse_int, minimum=1),
        Key("flush.ms", parse_int, minimum=0),
        Key("retention.ms", parse_int, minimum=-1),
        Key("retention.bytes", parse_int, minimum=-1),
        Key("file.delete.delay.ms", parse_int, minimum=0),
        Key("max.message.bytes", parse_int, minimum=0, maximum=INT_MAX),
        Key("message.timestamp.type", parse_str, choices=("CreateTime", "LogAppendTime")),
        Key("cleanup.policy", parse_list, choices=("delete", "compact")),
        Key("min.cleanable.dirty.ratio", parse_float, minimum=0, maximum=1),
        Key("min.compaction.lag.ms", parse_int, minimum=0),
        Key("max.compaction.lag.ms", parse_int, minimum=1),
        Key("delete.retention.ms", parse_int, minimum=0),
    ]
}

# Broker keys that set a topic default: broker name -> (topic name, unit multiplier).
# Where Kafka has several spellings (ms / minutes / hours) the finer one wins, as in KafkaConfig.
BROKER_TO_TOPIC: dict[str, tuple[str, int]] = {
    "log.segment.bytes": ("segment.bytes", 1),
    "log.roll.hours": ("segment.ms", 3_600_000),
    "log.roll.ms": ("segment.ms", 1),
    "log.roll.jitter.hours": ("segment.jitter.ms", 3_600_000),
    "log.roll.jitter.ms": ("segment.jitter.ms", 1),
    "log.index.size.max.bytes": ("segment.index.bytes", 1),
    "log.index.interval.bytes": ("index.interval.bytes", 1),
    "log.flush.interval.messages": ("flush.messages", 1),
    "log.flush.interval.ms": ("flush.ms", 1),
    "log.retention.hours": ("retention.ms", 3_600_000),
    "log.retention.minutes": ("retention.ms", 60_000),
    "log.retention.ms": ("retention.ms", 1),
    "log.retention.bytes": ("retention.bytes", 1),
    "log.segment.delete.delay.ms": ("file.delete.delay.ms", 1),
    "message.max.bytes": ("max.message.bytes", 1),
    "log.message.timestamp.type": ("message.timestamp.type", 1),
    "log.cleanup.policy": ("cleanup.policy", 1),
    "log.cleaner.min.cleanable.ratio": ("min.cleanable.dirty.ratio", 1),
    "log.cleaner.delete.retention.ms": ("delete.retention.ms", 1),
    "log.cleaner.min.compaction.lag.ms": ("min.compaction.lag.ms", 1),
    "log.cleaner.max.compaction.lag.ms": ("max.compaction.lag.ms", 1),
}

BROKER_KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        Key("log.dirs", parse_list),
        Key("log.dir", parse_list),
        Key("num.partitions", parse_int, minimum=1),
        Key("node.id", parse_int, minimum=0),
        Key("broker.id", parse_int, minimum=0),
        Key("log.retention.check.interval.ms", parse_int, minimum=1),
        Key("log.flush.scheduler.interval.ms", parse_int, minimum=1),
        Key("log.flush.offset.checkpoint.interval.ms", parse_int, minimum=1),
        Key("log.flush.start.offset.checkpoint.interval.ms", parse_int, minimum=1),
        Key("log.cleaner.enable", parse_bool),
        Key("log.cleaner.backoff.ms", parse_int, minimum=0),
        Key("log.cleaner.dedupe.buffer.size", parse_int, minimum=24),
        Key("tidelog.storage.engine", parse_str, choices=("kafka", "rocketmq")),
        Key("tidelog.index.keys", parse_bool),
        Key("tidelog.index.keys.maxHashSlotNum", parse_int, minimum=1, maximum=INT_MAX // 4),
        Key("tidelog.index.keys.maxIndexNum", parse_int, minimum=2, maximum=INT_MAX // 20),
        *(
            replace(TOPIC_KEYS[topic], name=broker)
            if multiplier == 1
            else Key(broker, parse_int, minimum=TOPIC_KEYS[topic].minimum, maximum=INT_MAX)  # Kafka: type INT
            for broker, (topic, multiplier) in BROKER_TO_TOPIC.items()
        ),
    ]
}


# --- the RocketMQ engine's store keys: `tidelog.rocketmq.` + the MessageStoreConfig field name ------------------------
# (spelled as RocketMQ's broker.conf spells them, `maped` included). Defaults are RocketMQ's.

ROCKETMQ_PREFIX = "tidelog.rocketmq."


@dataclass(frozen=True)
class RocketMQStoreConfig:
    maped_file_size_commit_log: int = 1024 * 1024 * 1024
    maped_file_size_consume_queue: int = 300_000 * 20
    flush_disk_type: str = "ASYNC_FLUSH"
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    sync_flush_timeout: int = 5_000
    flush_interval_consume_queue: int = 1_000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    flush_checkpoint_interval: int = 1_000
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    disk_space_clean_forcibly_ratio: int = 85
    disk_space_warning_level_ratio: int = 90
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_file_batch_max: int = 10
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 5_000_000 * 4
    message_index_enable: bool = True
    check_crc_on_recover: bool = True
    max_message_size: int = 1024 * 1024 * 4
    store_host: str = "127.0.0.1:10911"  # STOREHOSTADDRESS of messages (BrokerConfig's brokerIP1:listenPort)

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == "SYNC_FLUSH"


def _camel_to_snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


ROCKETMQ_KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        Key(ROCKETMQ_PREFIX + "mapedFileSizeCommitLog", parse_int, minimum=4096, maximum=INT_MAX),
        Key(ROCKETMQ_PREFIX + "mapedFileSizeConsumeQueue", parse_int, minimum=20 * 2, maximum=INT_MAX),
        Key(ROCKETMQ_PREFIX + "flushDiskType", parse_str, choices=("ASYNC_FLUSH", "SYNC_FLUSH")),
        Key(ROCKETMQ_PREFIX + "flushIntervalCommitLog", parse_int, minimum=1),
        Key(ROCKETMQ_PREFIX + "flushCommitLogLeastPages", parse_int, minimum=0),
        Key(ROCKETMQ_PREFIX + "flushCommitLogThoroughInterval", parse_int, minimum=0),
        Key(ROCKETMQ_PREFIX + "syncFlushTimeout", parse_int, minimum=1),
        Key(ROCKETMQ_PREFIX + "flushIntervalConsumeQueue", parse_int, minimum=1),
        Key(ROCKETMQ_PREFIX + "flushConsumeQueueLeastPages", parse_int, minimum=0),
        Key(ROCKETMQ_PREFIX + "flushConsumeQueueThoroughInterval", parse_int, minimum=0),
        Key(ROCKETMQ_PREFIX + "flushCheckpointInterval", parse_int, minimum=1),
        Key(ROCKETMQ_PREFIX + "fileReservedTime", parse_int, minimum=0),
        Key(ROCKETMQ_PREFIX + "deleteWhen", parse_str),
        Key(ROCKETMQ_PREFIX + "diskMaxUsedSpaceRatio", parse_int, minimum=10, maximum=95),
        Key(ROCKETMQ_PREFIX + "diskSpaceCleanForciblyRatio", parse_int, minimum=10, maximum=95),
        Key(ROCKETMQ_PREFIX + "diskSpaceWarningLevelRatio", parse_int, minimum=10, maximum=99),
        Key(ROCKETMQ_PREFIX + "cleanResourceInterval", parse_int, minimum=1),
        Key(ROCKETMQ_PREFIX + "deleteCommitLogFilesInterval", parse_int, minimum=0),
        Key(ROCKETMQ_PREFIX + "deleteFileBatchMax", parse_int, minimum=1),
        Key(ROCKETMQ_PREFIX + "maxHashSlotNum", parse_int, minimum=1, maximum=INT_MAX // 4),
        Key(ROCKETMQ_PREFIX + "maxIndexNum", parse_int, minimum=2, maximum=INT_MAX // 20),
        Key(ROCKETMQ_PREFIX + "messageIndexEnable", parse_bool),
        Key(ROCKETMQ_PREFIX + "checkCRCOnRecover", parse_bool),
        Key(ROCKETMQ_PREFIX + "maxMessageSize", parse_int, minimum=1, maximum=INT_MAX),
        Key(ROCKETMQ_PREFIX + "storeHost", parse_str),
    ]
}


BROKER_KEYS.update(ROCKETMQ_KEYS)


def _rocketmq_field(key_name: str) -> str:
    name = key_name[len(ROCKETMQ_PREFIX) :].replace("CRC", "Crc")
    return _camel_to_snake(name)


@dataclass(frozen=True)
class LogConfig:
    """The settings of one partition log: broker defaults with its topic's overrides applied."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3_600_000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    retention_ms: int = 7 * 24 * 3_600_000
    retention_bytes: int = -1
    file_delete_delay_ms: int = 60_000
    max_message_bytes: int = 1_048_588
    message_timestamp_type: str = "CreateTime"
    cleanup_policy: tuple[str, ...] = ("delete",)
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86_400_000

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """When the active segment rolls by time: segment.ms, or max.compaction.lag.ms if that is shorter on a
        compacted topic (KIP-354), so that records become cleanable in time (the active segment never is)."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact else self.segment_ms

    def with_overrides(self, overrides: Mapping[str, Any]) -> LogConfig:
        """Apply topic-level keys (`segment.bytes`, ...); unknown keys raise ConfigError."""
        changes: dict[str, Any] = {}
        for name, raw in overrides.items():
            key = TOPIC_KEYS.get(name)
            if key is None:
                raise ConfigError(f"unknown topic config {name!r}")
            value = key.convert(raw)
            changes[name.replace(".", "_")] = tuple(value) if isinstance(value, list) else value
        return replace(self, **changes)


@dataclass(frozen=True)
class KeyIndexConfig:
    """The Kafka engine's optional per-partition key index (`tidelog.index.keys*`; storage/kafka/key_index.py).
    Smaller files than RocketMQ's store-wide index, as there is one set per partition."""

    enabled: bool = False
    max_hash_slot_num: int = 1 << 16
    max_index_num: int = 1 << 18


@dataclass(frozen=True)
class CleanerConfig:
    """The log cleaner's broker settings (Kafka's CleanerConfig; one cleaner thread)."""

    enabled: bool = True  # log.cleaner.enable
    backoff_ms: int = 15_000  # log.cleaner.backoff.ms
    dedupe_buffer_size: int = 128 * 1024 * 1024  # log.cleaner.dedupe.buffer.size


@dataclass(frozen=True)
class EngineConfig:
    """Broker-level storage settings plus the default LogConfig for every topic."""

    engine: str = "kafka"  # tidelog.storage.engine
    log_dirs: tuple[str, ...] = ("./tidelog-data",)
    num_partitions: int = 1
    node_id: int = 1
    retention_check_interval_ms: int = 300_000
    flush_scheduler_interval_ms: int = LONG_MAX
    recovery_point_checkpoint_interval_ms: int = 60_000
    log_start_offset_checkpoint_interval_ms: int = 60_000
    log_defaults: LogConfig = field(default_factory=LogConfig)
    key_index: KeyIndexConfig = field(default_factory=KeyIndexConfig)
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)
    rocketmq: RocketMQStoreConfig = field(default_factory=RocketMQStoreConfig)

    @classmethod
    def from_mapping(
        cls, settings: Mapping[str, Any], *, log_dir: str | os.PathLike[str] | None = None
    ) -> EngineConfig:
        """Build from broker keys. `log_dir`, if given, is the log directory unless `log.dirs` says otherwise."""
        values: dict[str, Any] = {}
        for name, raw in settings.items():
            key = BROKER_KEYS.get(name)
            if key is None:
                hint = " (a topic-level key; pass it as a topic config)" if name in TOPIC_KEYS else ""
                raise ConfigError(f"unknown config key {name!r}{hint}")
            values[name] = key.convert(raw)

        topic_defaults: dict[str, Any] = {}
        # Coarse units first so the finer spelling (ms) overrides, as Kafka resolves them.
        for broker_name, (topic_name, multiplier) in sorted(BROKER_TO_TOPIC.items(), key=lambda kv: -kv[1][1]):
            if broker_name in values:
                value = values[broker_name]
                if multiplier != 1 and not (topic_name == "retention.ms" and value < 0):
                    value *= multiplier
                topic_defaults[topic_name] = value

        dirs = values.get("log.dirs") or values.get("log.dir")
        if dirs is None:
            dirs = [os.fspath(log_dir)] if log_dir is not None else list(cls.log_dirs)
        return cls(
            engine=values.get("tidelog.storage.engine", cls.engine),
            log_dirs=tuple(dirs),
            num_partitions=values.get("num.partitions", cls.num_partitions),
            node_id=values.get("node.id", values.get("broker.id", cls.node_id)),
            retention_check_interval_ms=values.get("log.retention.check.interval.ms", cls.retention_check_interval_ms),
            flush_scheduler_interval_ms=values.get("log.flush.scheduler.interval.ms", cls.flush_scheduler_interval_ms),
            recovery_point_checkpoint_interval_ms=values.get(
                "log.flush.offset.checkpoint.interval.ms", cls.recovery_point_checkpoint_interval_ms
            ),
            log_start_offset_checkpoint_interval_ms=values.get(
                "log.flush.start.offset.checkpoint.interval.ms", cls.log_start_offset_checkpoint_interval_ms
            ),
            log_defaults=LogConfig().with_overrides(topic_defaults),
            key_index=KeyIndexConfig(
                enabled=values.get("tidelog.index.keys", KeyIndexConfig.enabled),
                max_hash_slot_num=values.get("tidelog.index.keys.maxHashSlotNum", KeyIndexConfig.max_hash_slot_num),
                max_index_num=values.get("tidelog.index.keys.maxIndexNum", KeyIndexConfig.max_index_num),
            ),
            cleaner=CleanerConfig(
                enabled=values.get("log.cleaner.enable", CleanerConfig.enabled),
                backoff_ms=values.get("log.cleaner.backoff.ms", CleanerConfig.backoff_ms),
                dedupe_buffer_size=values.get("log.cleaner.dedupe.buffer.size", CleanerConfig.dedupe_buffer_size),
            ),
            rocketmq=RocketMQStoreConfig(
                **{_rocketmq_field(name): value for name, value in values.items() if name in ROCKETMQ_KEYS}
            ),
        )


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a Java-style `.properties` file (see parse_properties)."""
    with open(path, "rb") as handle:
        return parse_properties(handle.read(), os.fspath(path))


def parse_properties(data: bytes | str, source: str) -> dict[str, str]:
    """key=value or key: value lines, # and ! comments, UTF-8; `source` names the file in errors."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ConfigError(f"{source}:{line}: not UTF-8 text (byte {exc.start})") from None
    settings: dict[str, str] = {}
    for number, raw_line in enumerate(_LINE_BREAK.split(data), start=1):
        line = raw_line.strip()
        if not line or line[0] in "#!":
            continue
        separator = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if separator <= 0:
            raise ConfigError(f"{source}:{number}: expected key=value, got {line!r}")
        settings[line[:separator].strip()] = line[separator + 1 :].strip()
    return settings
