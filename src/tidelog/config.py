"""Configuration with Kafka's own key names, types and defaults.

Two levels, as in Kafka: broker keys (`log.segment.bytes`, `log.dirs`, ...) and per-topic overrides
(`segment.bytes`, `retention.ms`, ...). A broker key that sets a topic default maps to its topic key
(`log.roll.hours` -> `segment.ms`). Values may be Python values or the strings of a properties file.
An unknown key, a value of the wrong type or out of range raises ConfigError naming the key, and for a key read
from a properties file (load_properties, through the javaproperties library) its file and line.

Every key is declared once, as a Key in one of the tables below (TOPIC_KEYS, TOPIC_DEFAULT_KEYS, ENGINE_KEYS,
ROCKETMQ_KEYS; the broker's own in tidelog.broker.config.SERVER_KEYS) with its checks, default, engines and a
one-line description; `python -m tidelog.tools.config_reference` renders the tables as docs/configuration.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import javaproperties

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


def parse_optional_list(key: str, raw: Any) -> list[str]:
    """A comma-separated list that may be empty (`""`)."""
    if isinstance(raw, str) and not raw.strip():
        return []
    if isinstance(raw, list | tuple) and not raw:
        return []
    return parse_list(key, raw)


_THROTTLED_REPLICA = re.compile(r"[0-9]+:[0-9]+")


def parse_throttled_replicas(key: str, raw: Any) -> list[str]:
    """Kafka's ThrottledReplicaListValidator: empty, `*`, or `partition:broker` pairs."""
    items = parse_optional_list(key, raw)
    if items == ["*"] or all(_THROTTLED_REPLICA.fullmatch(item) for item in items):
        return items
    raise ConfigError(
        f"config {key}: {','.join(items)!r} must be the literal '*' or a list of replicas in the form "
        "partitionId:brokerId (0:101,1:102)"
    )


def _level_parser(codec: str, low: int, high: int, also: int | None = None) -> Callable[[str, Any], int]:
    """A compression level: an int in [low, high] (or `also`, gzip's -1 for the codec's default)."""

    def parse_level(key: str, raw: Any) -> int:
        value = parse_int(key, raw)
        if value != also and not low <= value <= high:
            extra = f" or {also}" if also is not None else ""
            raise ConfigError(f"config {key}: {value} is not a {codec} level (from {low} to {high}{extra})")
        return value

    parse_level.__name__ = f"parse_{codec}_level"
    return parse_level


parse_gzip_level = _level_parser("gzip", 1, 9, also=-1)
parse_lz4_level = _level_parser("lz4", 1, 17)
parse_zstd_level = _level_parser("zstd", -131072, 22)
_METADATA_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?(-IV[0-9]+)?")


def parse_message_format_version(key: str, raw: Any) -> str:
    """A Kafka MetadataVersion string (`2.8`, `3.0-IV1`, `0.10.2`); ignored since Kafka 3.0, as here."""
    value = parse_str(key, raw)
    if not _METADATA_VERSION.fullmatch(value):
        raise ConfigError(f"config {key}: {value!r} is not a Kafka version such as 3.0-IV1")
    return value


ENGINES = ("kafka", "rocketmq")  # the storage engines (tidelog.storage.engine)


@dataclass(frozen=True)
class Key:
    """One config key: how its value is parsed and checked, and what docs/configuration.md says about it.

    `default` is the value as a properties file would spell it (None: unset, with the effect `doc` gives);
    `engines` are the storage engines the key has an effect on; `valid` describes the accepted values where
    `minimum`/`maximum`/`choices` do not say it all.
    """

    name: str
    parse: Callable[[str, Any], Any]
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    doc: str = ""
    default: str | None = None
    engines: tuple[str, ...] = ENGINES
    valid: str = ""

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


# The value types of docs/configuration.md, by parser (tidelog.broker.config adds its own parsers).
VALUE_TYPES: dict[Callable[[str, Any], Any], str] = {
    parse_int: "long",
    parse_bool: "boolean",
    parse_float: "double",
    parse_str: "string",
    parse_list: "list",
    parse_optional_list: "list",
    parse_throttled_replicas: "list",
    parse_gzip_level: "int",
    parse_lz4_level: "int",
    parse_zstd_level: "int",
    parse_message_format_version: "string",
}


def _keys(*keys: Key) -> dict[str, Key]:
    return {key.name: key for key in keys}


# --- per-topic keys (Kafka's TopicConfig names) ---------------------------------------------------------------

KAFKA = ("kafka",)
# compression.type: Kafka's BrokerCompressionType names
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
ROCKETMQ = ("rocketmq",)

TOPIC_KEYS: dict[str, Key] = _keys(
    Key(
        "segment.bytes",
        parse_int,
        minimum=14,
        maximum=INT_MAX,
        default="1073741824",
        engines=KAFKA,
        doc="Size at which the active segment is closed and a new one started.",
    ),
    Key(
        "segment.ms",
        parse_int,
        minimum=1,
        default="604800000",
        engines=KAFKA,
        doc="Age after which the active segment rolls even if not full (on a compacted topic `max.compaction.lag.ms` "
        "if that is shorter).",
    ),
    Key(
        "segment.jitter.ms",
        parse_int,
        minimum=0,
        default="0",
        engines=KAFKA,
        doc="Up to this much random time is taken off `segment.ms`, so that partitions do not all roll at once.",
    ),
    Key(
        "segment.index.bytes",
        parse_int,
        minimum=4,
        maximum=INT_MAX,
        default="10485760",
        engines=KAFKA,
        doc="Size preallocated for a segment's offset and time index; a segment whose index is full rolls.",
    ),
    Key(
        "index.interval.bytes",
        parse_int,
        minimum=0,
        maximum=INT_MAX,
        default="4096",
        engines=KAFKA,
        doc="Bytes of batches between two entries of the offset and time indexes.",
    ),
    Key(
        "flush.messages",
        parse_int,
        minimum=1,
        default=str(LONG_MAX),
        engines=KAFKA,
        doc="fsync the log every this many messages (`1`: an `acks=all` producer waits for an fsync, shared by a "
        "group commit); the default leaves flushing to the OS.",
    ),
    Key(
        "flush.ms",
        parse_int,
        minimum=0,
        default=str(LONG_MAX),
        engines=KAFKA,
        doc="fsync the log when its last flush is this old (checked every `log.flush.scheduler.interval.ms`).",
    ),
    Key(
        "retention.ms",
        parse_int,
        minimum=-1,
        default="604800000",
        doc="Delete segments whose newest record is older than this; `-1`: no time limit. The RocketMQ engine only "
        "reads `-1`, which keeps the newest record of every key when its CommitLog file goes.",
    ),
    Key(
        "retention.bytes",
        parse_int,
        minimum=-1,
        default="-1",
        engines=KAFKA,
        doc="Delete the oldest segments while the partition is larger than this; `-1`: no size limit.",
    ),
    Key(
        "file.delete.delay.ms",
        parse_int,
        minimum=0,
        default="60000",
        engines=KAFKA,
        doc="How long a deleted segment's files stay on disk (renamed `.deleted`) before they are removed.",
    ),
    Key(
        "max.message.bytes",
        parse_int,
        minimum=0,
        maximum=INT_MAX,
        default="1048588",
        doc="Largest record batch (as sent, compressed) a producer may append; larger ones get `MESSAGE_TOO_LARGE`.",
    ),
    Key(
        "message.timestamp.type",
        parse_str,
        choices=("CreateTime", "LogAppendTime"),
        default="CreateTime",
        doc="`CreateTime` keeps the producer's timestamps; `LogAppendTime` stamps records with the broker's clock.",
    ),
    Key(
        "cleanup.policy",
        parse_list,
        choices=("delete", "compact"),
        default="delete",
        engines=KAFKA,
        doc="`delete`: retention by time and size; `compact`: the log cleaner keeps the newest record of each key; "
        "`compact,delete`: both.",
    ),
    Key(
        "min.cleanable.dirty.ratio",
        parse_float,
        minimum=0,
        maximum=1,
        default="0.5",
        engines=KAFKA,
        doc="A compacted log is cleaned once its not yet cleaned part is at least this fraction of it.",
    ),
    Key(
        "min.compaction.lag.ms",
        parse_int,
        minimum=0,
        default="0",
        engines=KAFKA,
        doc="A record stays uncompacted for at least this long after it is written.",
    ),
    Key(
        "max.compaction.lag.ms",
        parse_int,
        minimum=1,
        default=str(LONG_MAX),
        engines=KAFKA,
        doc="A record becomes cleanable at most this long after it is written, whatever the dirty ratio.",
    ),
    Key(
        "delete.retention.ms",
        parse_int,
        minimum=0,
        default="86400000",
        engines=KAFKA,
        doc="How long a tombstone (null value) stays after the first cleaning pass that sees it.",
    ),
    Key(
        "unclean.leader.election.enable",
        parse_bool,
        default="false",
        doc="In a cluster: when no in-sync replica of a partition is alive, make another live replica its leader "
        "(and lose what it lacks) instead of leaving the partition without one.",
    ),
    Key(
        "min.insync.replicas",
        parse_int,
        minimum=1,
        maximum=INT_MAX,
        default="1",
        doc="In a cluster: an `acks=all` produce needs at least this many in-sync replicas (else "
        "`NOT_ENOUGH_REPLICAS`); the broker enforces it, the storage engines ignore it.",
    ),
    Key(
        "compression.type",
        parse_str,
        choices=COMPRESSION_TYPES,
        default="producer",
        engines=KAFKA,
        doc="`producer` stores each batch with the producer's codec; a codec name recompresses every batch a "
        "producer sends in another codec (or uncompressed) with that one before it is stored, as Kafka's broker does.",
    ),
    Key(
        "compression.gzip.level",
        parse_gzip_level,
        default="-1",
        engines=KAFKA,
        valid="`1` to `9`, or `-1` (the codec's default)",
        doc="Level of the broker's gzip recompression (`compression.type=gzip`).",
    ),
    Key(
        "compression.lz4.level",
        parse_lz4_level,
        default="9",
        engines=KAFKA,
        valid="`1` to `17`",
        doc="Level of the broker's lz4 recompression (`compression.type=lz4`).",
    ),
    Key(
        "compression.zstd.level",
        parse_zstd_level,
        default="3",
        engines=KAFKA,
        valid="`-131072` to `22`",
        doc="Level of the broker's zstd recompression (`compression.type=zstd`).",
    ),
    Key(
        "message.timestamp.before.max.ms",
        parse_int,
        minimum=0,
        default=str(LONG_MAX),
        doc="A `CreateTime` record whose timestamp is more than this before the broker's clock is refused "
        "(`INVALID_TIMESTAMP`); the default accepts any.",
    ),
    Key(
        "message.timestamp.after.max.ms",
        parse_int,
        minimum=0,
        default=str(LONG_MAX),
        doc="A `CreateTime` record whose timestamp is more than this after the broker's clock is refused "
        "(`INVALID_TIMESTAMP`); the default accepts any.",
    ),
    Key(
        "message.timestamp.difference.max.ms",
        parse_int,
        minimum=0,
        default=str(LONG_MAX),
        doc="Deprecated in Kafka 3.6: the bound on both sides where `message.timestamp.before.max.ms` / "
        "`message.timestamp.after.max.ms` keep their default.",
    ),
    Key(
        "message.downconversion.enable",
        parse_bool,
        default="true",
        doc="Whether Fetch v0-v3 (clients older than Kafka 0.11) get the topic's batches converted to their message "
        "format; `false` answers them `UNSUPPORTED_VERSION`, as Kafka does.",
    ),
    Key(
        "message.format.version",
        parse_message_format_version,
        default="3.0-IV1",
        valid="a Kafka version (`2.8`, `3.0-IV1`)",
        doc="Accepted for compatibility and ignored, as Kafka 3.x ignores it: batches are stored as sent.",
    ),
    Key(
        "preallocate",
        parse_bool,
        default="false",
        doc="Accepted and ignored: segment files grow as they are written.",
    ),
    Key(
        "leader.replication.throttled.replicas",
        parse_throttled_replicas,
        default="",
        valid="`*`, or `partition:broker` pairs, comma-separated",
        doc="Accepted and ignored: tidelog does not throttle replication.",
    ),
    Key(
        "follower.replication.throttled.replicas",
        parse_throttled_replicas,
        default="",
        valid="`*`, or `partition:broker` pairs, comma-separated",
        doc="Accepted and ignored: tidelog does not throttle replication.",
    ),
    Key(
        "remote.storage.enable",
        parse_bool,
        default="false",
        doc="Tiered storage: tidelog has no remote log storage, so `true` is refused (`INVALID_CONFIG`), as Kafka "
        "refuses it when its remote log storage system is disabled.",
    ),
    Key(
        "local.retention.ms",
        parse_int,
        minimum=-2,
        default="-2",
        doc="Tiered storage's local retention; accepted and ignored (no remote storage).",
    ),
    Key(
        "local.retention.bytes",
        parse_int,
        minimum=-2,
        default="-2",
        doc="Tiered storage's local retention; accepted and ignored (no remote storage).",
    ),
    Key(
        "remote.log.copy.disable",
        parse_bool,
        default="false",
        doc="Tiered storage; accepted and ignored (no remote storage).",
    ),
    Key(
        "remote.log.delete.on.disable",
        parse_bool,
        default="false",
        doc="Tiered storage; accepted and ignored (no remote storage).",
    ),
)

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
    "unclean.leader.election.enable": ("unclean.leader.election.enable", 1),
    "min.insync.replicas": ("min.insync.replicas", 1),
    "compression.type": ("compression.type", 1),
    "compression.gzip.level": ("compression.gzip.level", 1),
    "compression.lz4.level": ("compression.lz4.level", 1),
    "compression.zstd.level": ("compression.zstd.level", 1),
    "log.message.timestamp.before.max.ms": ("message.timestamp.before.max.ms", 1),
    "log.message.timestamp.after.max.ms": ("message.timestamp.after.max.ms", 1),
    "log.message.timestamp.difference.max.ms": ("message.timestamp.difference.max.ms", 1),
    "log.message.downconversion.enable": ("message.downconversion.enable", 1),
    "log.message.format.version": ("message.format.version", 1),
    "log.preallocate": ("preallocate", 1),
    "log.local.retention.ms": ("local.retention.ms", 1),
    "log.local.retention.bytes": ("local.retention.bytes", 1),
}
_UNITS = {1: "", 60_000: "minutes", 3_600_000: "hours"}


def _topic_default_key(broker: str, topic: str, multiplier: int) -> Key:
    """The broker key `broker` as a Key: the topic key's checks, its default in the coarsest spelling only (the
    finer ones are unset, as in Kafka), and a description saying which topic key it sets."""
    spellings = sorted((m, b) for b, (t, m) in BROKER_TO_TOPIC.items() if t == topic)
    target = TOPIC_KEYS[topic]
    default = target.default
    if multiplier != spellings[-1][0]:
        default = None  # a finer spelling: unset unless given
    elif default is not None and multiplier != 1:
        default = str(int(default) // multiplier)
    doc = f"Default of the topic key `{topic}`"
    if multiplier != 1:
        doc += f", in {_UNITS[multiplier]}"
    finer = [b for m, b in spellings if m < multiplier]
    if finer:
        doc += f"; {' and '.join(f'`{b}`' for b in finer)} take{'s' if len(finer) == 1 else ''} precedence"
    doc += "."
    if multiplier == 1:
        return replace(target, name=broker, default=default, doc=doc)
    # Kafka types the hour and minute spellings as INT
    return replace(target, name=broker, maximum=INT_MAX, default=default, doc=doc)


TOPIC_DEFAULT_KEYS: dict[str, Key] = _keys(
    *(_topic_default_key(broker, topic, multiplier) for broker, (topic, multiplier) in BROKER_TO_TOPIC.items())
)

# The broker keys AlterConfigs and IncrementalAlterConfigs may change while the broker runs, per broker or as the
# cluster's default (tidelog.broker.dynamic_config): those of Kafka's dynamic log configs that tidelog has, which are
# every topic default but `log.message.format.version` (as Kafka's DynamicLogConfig).
DYNAMIC_BROKER_KEYS = frozenset(TOPIC_DEFAULT_KEYS) - {"log.message.format.version"}

# Storage keys of the broker (EngineConfig) that are not topic defaults.
ENGINE_KEYS: dict[str, Key] = _keys(
    Key(
        "log.dirs",
        parse_list,
        default="./tidelog-data",
        valid="comma-separated paths",
        doc="Directories of the log (`tidelog.open(dir)` gives its own); the RocketMQ engine takes exactly one.",
    ),
    Key(
        "log.dir", parse_list, valid="comma-separated paths", doc="Older spelling of `log.dirs`, read if that is unset."
    ),
    Key(
        "num.partitions",
        parse_int,
        minimum=1,
        default="1",
        doc="Partitions of a topic created without a count (auto-created topics among them).",
    ),
    Key(
        "node.id",
        parse_int,
        minimum=0,
        default="1",
        doc="This broker's id: in metadata answers, and in `meta.properties` on the Kafka engine.",
    ),
    Key("broker.id", parse_int, minimum=0, doc="Older spelling of `node.id`, read if that is unset."),
    Key(
        "log.retention.check.interval.ms",
        parse_int,
        minimum=1,
        default="300000",
        engines=KAFKA,
        doc="How often segments past `retention.ms` or `retention.bytes` are deleted.",
    ),
    Key(
        "log.flush.scheduler.interval.ms",
        parse_int,
        minimum=1,
        default=str(LONG_MAX),
        engines=KAFKA,
        doc="How often logs are checked against `flush.ms`.",
    ),
    Key(
        "log.flush.offset.checkpoint.interval.ms",
        parse_int,
        minimum=1,
        default="60000",
        engines=KAFKA,
        doc="How often `recovery-point-offset-checkpoint` (where recovery after a crash starts) is written.",
    ),
    Key(
        "log.flush.start.offset.checkpoint.interval.ms",
        parse_int,
        minimum=1,
        default="60000",
        engines=KAFKA,
        doc="How often `log-start-offset-checkpoint` is written.",
    ),
    Key(
        "replica.high.watermark.checkpoint.interval.ms",
        parse_int,
        minimum=1,
        default="5000",
        engines=KAFKA,
        doc="In a cluster: how often every partition's high watermark is written to `replication-offset-checkpoint` "
        "(where it starts after a restart).",
    ),
    Key(
        "log.cleaner.enable",
        parse_bool,
        default="true",
        engines=KAFKA,
        doc="Run the log cleaner for topics with `cleanup.policy=compact`; without it the broker compacts "
        "`__consumer_offsets` itself.",
    ),
    Key(
        "log.cleaner.backoff.ms",
        parse_int,
        minimum=0,
        default="15000",
        engines=KAFKA,
        doc="Pause of the log cleaner between two rounds.",
    ),
    Key(
        "log.cleaner.dedupe.buffer.size",
        parse_int,
        minimum=24,
        default="134217728",
        engines=KAFKA,
        doc="Memory of the cleaner's key map: at most 0.9 x size / 24 keys per cleaning pass.",
    ),
    Key(
        "tidelog.storage.engine",
        parse_str,
        choices=ENGINES,
        default="kafka",
        doc="The on-disk layout: `kafka` (Kafka's log directories) or `rocketmq` (RocketMQ's CommitLog and "
        "ConsumeQueues).",
    ),
    Key(
        "tidelog.index.keys",
        parse_bool,
        default="false",
        engines=KAFKA,
        doc="Keep a key index per partition (RocketMQ's IndexFile format, in `tidelog-keyindex/`) for `lookup_key`.",
    ),
    Key(
        "tidelog.index.keys.maxHashSlotNum",
        parse_int,
        minimum=1,
        maximum=INT_MAX // 4,
        default="65536",
        engines=KAFKA,
        doc="Hash slots of each key-index file of the Kafka engine.",
    ),
    Key(
        "tidelog.index.keys.maxIndexNum",
        parse_int,
        minimum=2,
        maximum=INT_MAX // 20,
        default="262144",
        engines=KAFKA,
        doc="Entries of each key-index file of the Kafka engine.",
    ),
)


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
    read_ahead_queues: int = 64  # tidelog's: queues whose next read is rebuilt ahead (storage/rocketmq/read_ahead.py)
    check_crc_on_recover: bool = True
    max_message_size: int = 1024 * 1024 * 4
    store_host: str = "127.0.0.1:10911"  # STOREHOSTADDRESS of messages (BrokerConfig's brokerIP1:listenPort)
    broker_role: str = "ASYNC_MASTER"
    broker_name: str = "broker-a"  # BrokerConfig.brokerName: the master/slave group in a cluster
    ha_enable: bool = False  # tidelog's: whether the store takes part in master/slave replication at all
    ha_listen_host: str = "0.0.0.0"  # tidelog's: where a master listens for slaves (RocketMQ: every interface)
    ha_listen_port: int = 10912
    ha_master_address: str = ""
    ha_send_heartbeat_interval: int = 5_000
    ha_housekeeping_interval: int = 20_000
    ha_transfer_batch_size: int = 32 * 1024
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    slave_read_enable: bool = False

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == "SYNC_FLUSH"


def _camel_to_snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _rocketmq_key(name: str, parse: Callable[[str, Any], Any], doc: str, **checks: Any) -> Key:
    """A store key; its default is the RocketMQStoreConfig field's."""
    default = getattr(RocketMQStoreConfig, _rocketmq_field(ROCKETMQ_PREFIX + name))
    text = str(default).lower() if isinstance(default, bool) else str(default)
    return Key(ROCKETMQ_PREFIX + name, parse, doc=doc, default=text, engines=ROCKETMQ, **checks)


def _rocketmq_field(key_name: str) -> str:
    name = key_name[len(ROCKETMQ_PREFIX) :].replace("CRC", "Crc")
    return _camel_to_snake(name)


ROCKETMQ_KEYS: dict[str, Key] = _keys(
    _rocketmq_key("mapedFileSizeCommitLog", parse_int, "Size of each CommitLog file.", minimum=4096, maximum=INT_MAX),
    _rocketmq_key(
        "mapedFileSizeConsumeQueue",
        parse_int,
        "Size of each ConsumeQueue file (20 bytes per message).",
        minimum=20 * 2,
        maximum=INT_MAX,
    ),
    _rocketmq_key(
        "flushDiskType",
        parse_str,
        "`ASYNC_FLUSH`: the CommitLog is flushed every `flushIntervalCommitLog` ms; `SYNC_FLUSH`: a group commit that "
        "`acks=all` producers wait for (and only flushed messages are dispatched).",
        choices=("ASYNC_FLUSH", "SYNC_FLUSH"),
    ),
    _rocketmq_key(
        "flushIntervalCommitLog", parse_int, "Milliseconds between two CommitLog flushes (`ASYNC_FLUSH`).", minimum=1
    ),
    _rocketmq_key(
        "flushCommitLogLeastPages",
        parse_int,
        "A CommitLog flush waits for at least this many dirty 4 KiB pages (`0`: flushes whatever there is).",
        minimum=0,
    ),
    _rocketmq_key(
        "flushCommitLogThoroughInterval",
        parse_int,
        "Milliseconds after which a CommitLog flush writes everything, whatever `flushCommitLogLeastPages` says.",
        minimum=0,
    ),
    _rocketmq_key(
        "syncFlushTimeout",
        parse_int,
        "Milliseconds a producer waits for its flush under `SYNC_FLUSH` before it gets an error.",
        minimum=1,
    ),
    _rocketmq_key("flushIntervalConsumeQueue", parse_int, "Milliseconds between two ConsumeQueue flushes.", minimum=1),
    _rocketmq_key(
        "flushConsumeQueueLeastPages",
        parse_int,
        "A ConsumeQueue flush waits for at least this many dirty 4 KiB pages.",
        minimum=0,
    ),
    _rocketmq_key(
        "flushConsumeQueueThoroughInterval",
        parse_int,
        "Milliseconds after which a ConsumeQueue flush writes everything, whatever `flushConsumeQueueLeastPages` says.",
        minimum=0,
    ),
    _rocketmq_key(
        "flushCheckpointInterval", parse_int, "Milliseconds between two writes of the checkpoint file.", minimum=1
    ),
    _rocketmq_key(
        "fileReservedTime",
        parse_int,
        "Hours a CommitLog file is kept after its last write; retention deletes older ones at `deleteWhen`.",
        minimum=0,
    ),
    _rocketmq_key(
        "deleteWhen",
        parse_str,
        "Hours of the day (local time) at which expired CommitLog files are deleted.",
        valid="hours `0`-`23` separated by `;` (`04;16`)",
    ),
    _rocketmq_key(
        "diskMaxUsedSpaceRatio",
        parse_int,
        "Disk usage (percent) above which expired CommitLog files are deleted at any hour.",
        minimum=10,
        maximum=95,
    ),
    _rocketmq_key(
        "diskSpaceCleanForciblyRatio",
        parse_int,
        "Disk usage (percent) above which the oldest CommitLog files are deleted even before `fileReservedTime`.",
        minimum=10,
        maximum=95,
    ),
    _rocketmq_key(
        "diskSpaceWarningLevelRatio",
        parse_int,
        "Disk usage (percent) above which appends are refused until retention frees space.",
        minimum=10,
        maximum=99,
    ),
    _rocketmq_key("cleanResourceInterval", parse_int, "Milliseconds between two retention rounds.", minimum=1),
    _rocketmq_key(
        "deleteCommitLogFilesInterval",
        parse_int,
        "Pause in milliseconds between deleting two CommitLog files in one round.",
        minimum=0,
    ),
    _rocketmq_key("deleteFileBatchMax", parse_int, "Most CommitLog files one retention round deletes.", minimum=1),
    _rocketmq_key(
        "maxHashSlotNum",
        parse_int,
        "Hash slots of each IndexFile (the store-wide key index).",
        minimum=1,
        maximum=INT_MAX // 4,
    ),
    _rocketmq_key("maxIndexNum", parse_int, "Entries of each IndexFile.", minimum=2, maximum=INT_MAX // 20),
    _rocketmq_key("messageIndexEnable", parse_bool, "Build the IndexFiles that `lookup_key` answers from."),
    _rocketmq_key(
        "readAheadQueues",
        parse_int,
        "tidelog's: how many queues may have their next read rebuilt ahead, while the reader takes the last one "
        "(a read its byte budget stopped); 0 turns read-ahead off.",
        minimum=0,
        maximum=1_000_000,
    ),
    _rocketmq_key("checkCRCOnRecover", parse_bool, "Check every message body's CRC when recovering after a crash."),
    _rocketmq_key(
        "maxMessageSize",
        parse_int,
        "Largest message body the CommitLog takes.",
        minimum=1,
        maximum=INT_MAX,
    ),
    _rocketmq_key(
        "storeHost",
        parse_str,
        "The store host written into every message, and so into its message id (RocketMQ's `brokerIP1:listenPort`).",
        valid="IPv4 `address:port`",
    ),
    _rocketmq_key(
        "haEnable",
        parse_bool,
        "Take part in master/slave replication of the CommitLog (tidelog's key: RocketMQ always does). With `false` "
        "no HA port is opened and `brokerRole` must be `ASYNC_MASTER`.",
    ),
    _rocketmq_key(
        "brokerRole",
        parse_str,
        "`ASYNC_MASTER`: puts are answered after the local write and slaves follow; `SYNC_MASTER`: a put that waits "
        "for replication waits until a slave holds it (up to `syncFlushTimeout`); `SLAVE`: follows "
        "`haMasterAddress` and refuses puts.",
        choices=("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"),
    ),
    _rocketmq_key(
        "brokerName",
        parse_str,
        "The master/slave group this broker belongs to in a cluster (RocketMQ's BrokerConfig key; RocketMQ defaults "
        "to the host name, tidelog to `broker-a`, so that the brokers of a cluster form one group unless told "
        "otherwise). Its master and slaves share the name.",
        valid="1-64 characters of `[a-zA-Z0-9_-]`",
    ),
    _rocketmq_key(
        "haListenHost", parse_str, "Address a master listens on for slaves (tidelog's key; RocketMQ binds every one)."
    ),
    _rocketmq_key(
        "haListenPort", parse_int, "Port a master listens on for slaves (`0`: any free port).", minimum=0, maximum=65535
    ),
    _rocketmq_key(
        "haMasterAddress",
        parse_str,
        "The master a `SLAVE` follows, as `host:port` (its `haListenPort`).",
    ),
    _rocketmq_key(
        "haSendHeartbeatInterval",
        parse_int,
        "Milliseconds after which a slave reports its offset, and a master with nothing to send sends a heartbeat.",
        minimum=1,
    ),
    _rocketmq_key(
        "haHousekeepingInterval",
        parse_int,
        "Milliseconds of silence after which either side closes an HA connection.",
        minimum=1,
    ),
    _rocketmq_key(
        "haTransferBatchSize",
        parse_int,
        "Largest CommitLog body of one transfer to a slave; a slave refuses larger ones, so keep it the same on both.",
        minimum=1,
        maximum=INT_MAX,
    ),
    _rocketmq_key(
        "haSlaveFallbehindMax",
        parse_int,
        "Bytes a slave may be behind before a `SYNC_MASTER` stops waiting for it (`SLAVE_NOT_AVAILABLE` at once).",
        minimum=1,
    ),
    _rocketmq_key(
        "slaveReadEnable",
        parse_bool,
        "Whether consumers may be sent to a slave to read (RocketMQ's meaning; the store itself reads either way).",
    ),
)

# Every key of EngineConfig.from_mapping.
BROKER_KEYS: dict[str, Key] = {**ENGINE_KEYS, **TOPIC_DEFAULT_KEYS, **ROCKETMQ_KEYS}


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
    unclean_leader_election_enable: bool = False
    min_insync_replicas: int = 1
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = LONG_MAX
    message_timestamp_difference_max_ms: int = LONG_MAX
    message_downconversion_enable: bool = True
    message_format_version: str = "3.0-IV1"
    preallocate: bool = False
    leader_replication_throttled_replicas: tuple[str, ...] = ()
    follower_replication_throttled_replicas: tuple[str, ...] = ()
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def timestamp_before_max_ms(self) -> int:
        """How far before the broker's clock a CreateTime record may be: message.timestamp.before.max.ms, or the
        deprecated message.timestamp.difference.max.ms while the former keeps its default (as Kafka 3.9)."""
        if self.message_timestamp_before_max_ms != LONG_MAX:
            return self.message_timestamp_before_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def timestamp_after_max_ms(self) -> int:
        """How far after the broker's clock a CreateTime record may be (see timestamp_before_max_ms)."""
        if self.message_timestamp_after_max_ms != LONG_MAX:
            return self.message_timestamp_after_max_ms
        return self.message_timestamp_difference_max_ms

    def timestamp_bounds(self, now_ms: int) -> tuple[int, int] | None:
        """[low, high] a producer's CreateTime record timestamps must be in at `now_ms`, or None when any goes
        (LogAppendTime, or neither bound set)."""
        before, after = self.timestamp_before_max_ms, self.timestamp_after_max_ms
        if self.message_timestamp_type != "CreateTime" or (before == LONG_MAX and after == LONG_MAX):
            return None
        return now_ms - before, now_ms + after

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
        if not changes:  # most topics: no copy (a broker opening many partitions asks once per partition)
            return self
        config = replace(self, **changes)
        config.check()
        return config

    def check(self) -> None:
        """The rules between keys Kafka's LogConfig checks (validateValues, and remote storage only with a remote
        log storage system, which tidelog does not have); ConfigError names the keys."""
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise ConfigError(
                f"conflict topic config setting min.compaction.lag.ms ({self.min_compaction_lag_ms}) > "
                f"max.compaction.lag.ms ({self.max_compaction_lag_ms})"
            )
        if self.remote_storage_enable:
            raise ConfigError(
                "config remote.storage.enable: Tiered Storage functionality is disabled in the broker. Topic cannot "
                "be configured with remote log storage."
            )


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
    high_watermark_checkpoint_interval_ms: int = 5_000
    # Set by the broker of a cluster (not a config key): the broker moves each partition's high watermark, and the
    # Kafka engine keeps it in replication-offset-checkpoint. False: the high watermark is the log end.
    replicated: bool = False
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
                raise located(settings, name, ConfigError(f"unknown config key {name!r}{hint}"))
            try:
                values[name] = key.convert(raw)
            except ConfigError as exc:
                raise located(settings, name, exc) from None

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
            high_watermark_checkpoint_interval_ms=values.get(
                "replica.high.watermark.checkpoint.interval.ms", cls.high_watermark_checkpoint_interval_ms
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


def load_properties(path: str | os.PathLike[str]) -> Properties:
    """Read a `.properties` file (see parse_properties)."""
    with open(path, "rb") as handle:
        return parse_properties(handle.read(), os.fspath(path))


def parse_properties(data: bytes | str, source: str) -> Properties:
    """A `.properties` file as java.util.Properties reads it (the javaproperties library): `key=value`,
    `key: value` or `key value` entries, `#` and `!` comments, `\\` line continuations and escapes (`\\uXXXX`),
    LF, CR or CRLF line ends, the last of a repeated key winning. Bytes must be UTF-8 (Java's
    Properties.load(InputStream) reads ISO-8859-1; Kafka's files are ASCII). Values are stripped of surrounding
    blanks, as Kafka's ConfigDef does. `source` names the file in errors, which give its line."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = len(_LINE_BREAK.findall(data[: exc.start].decode("latin-1"))) + 1
            raise ConfigError(f"{source}:{line}: not UTF-8 text (byte {exc.start})") from None
    else:
        text = data
    settings = Properties(source)
    line = 1  # where the next element starts
    elements = javaproperties.parse(text)
    while True:
        try:
            element = next(elements, None)
        except javaproperties.InvalidUEscapeError as exc:
            raise ConfigError(f"{source}:{line}: {exc}") from None
        if element is None:
            return settings
        if isinstance(element, javaproperties.KeyValue):
            try:  # a \uD800 escape alone makes a string no file name or socket call can take
                (element.key + element.value).encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{source}:{line}: a \\u escape makes a lone surrogate") from None
            settings.set_from_line(element.key, element.value.strip(), line)
        line += len(_LINE_BREAK.findall(element.source))


class Properties(dict[str, str]):
    """The entries of a `.properties` file, which remember the line that set each one, so that an error about a
    key's value can say `file:line` (see where). A key set or changed afterwards (an --override) has no line."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source
        self.origins: dict[str, tuple[int, str]] = {}  # key -> (line, the value read there)

    def set_from_line(self, key: str, value: str, line: int) -> None:
        self[key] = value
        self.origins[key] = (line, value)

    def line_of(self, key: str) -> int | None:
        origin = self.origins.get(key)
        return origin[0] if origin is not None and key in self and self[key] == origin[1] else None


def where(settings: Mapping[str, Any], key: str) -> str | None:
    """`file:line` of `key` if `settings` came from a properties file and still holds the value read there."""
    if isinstance(settings, Properties):
        line = settings.line_of(key)
        if line is not None:
            return f"{settings.source}:{line}"
    return None


def located(settings: Mapping[str, Any], key: str, error: ConfigError) -> ConfigError:
    """`error` (about `key`) prefixed with the file and line that set the key, when known."""
    place = where(settings, key)
    return ConfigError(f"{place}: {error}") if place is not None else error


def select(settings: Mapping[str, Any], keys: Collection[str]) -> dict[str, Any]:
    """The entries of `settings` named in `keys`, keeping their file and line if `settings` has them."""
    if not isinstance(settings, Properties):
        return {key: settings[key] for key in keys}
    subset = Properties(settings.source)
    for key in keys:
        subset[key] = settings[key]
        line = settings.line_of(key)
        if line is not None:
            subset.origins[key] = (line, settings[key])
    return subset
