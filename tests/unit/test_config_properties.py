"""Reading `.properties` files (tidelog.config.parse_properties, on the javaproperties library) and the key tables.

A file is read as java.util.Properties reads it; a bad value is a ConfigError naming the key and, for a key read from
a file, its `file:line`. Every key declares a description and a default that matches the config classes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.broker.config import SERVER_KEYS, BrokerConfig
from tidelog.config import (
    BROKER_KEYS,
    ENGINES,
    TOPIC_DEFAULT_KEYS,
    TOPIC_KEYS,
    VALUE_TYPES,
    EngineConfig,
    LogConfig,
    load_properties,
    parse_properties,
    select,
    where,
)
from tidelog.errors import ConfigError, CorruptCheckpointError
from tidelog.storage.kafka import checkpoints

# --- the file format ------------------------------------------------------------------------------------------


def test_separators_comments_and_blank_lines() -> None:
    text = "# a comment\n! another\n\na=1\nb : 2\nc 3\n  d=4\ne=\n"
    assert parse_properties(text, "x") == {"a": "1", "b": "2", "c": "3", "d": "4", "e": ""}


def test_continuations_escapes_and_unicode() -> None:
    text = "log.dirs=/a,\\\n    /b\nkey\\ with\\ space=v\\tw\nname=caf\\u00e9 \u00fcber\nx\\=y=z\n"
    assert parse_properties(text.encode(), "x") == {
        "log.dirs": "/a,/b",
        "key with space": "v\tw",
        "name": "café über",
        "x=y": "z",
    }


def test_line_ends_and_a_repeated_key() -> None:
    assert parse_properties(b"a=1\rb=2\r\nc=3\na=4", "x") == {"a": "4", "b": "2", "c": "3"}


def test_values_are_stripped_as_kafka_does() -> None:
    assert parse_properties("num.partitions = 3  \t\n", "x") == {"num.partitions": "3"}


def test_not_utf8_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"^server.properties:3: not UTF-8 text \(byte 10\)$"):
        parse_properties(b"a=1\rb=2\nc=\xff\n", "server.properties")


def test_a_bad_unicode_escape_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"^f:4: Invalid \\u escape sequence"):
        parse_properties("a=1\nb=2\\\n  more\nc=\\uzz\n", "f")


def test_escapes_make_surrogate_pairs_but_not_lone_surrogates() -> None:
    assert parse_properties("smile=\\ud83d\\ude00\n", "f") == {"smile": "\U0001f600"}
    with pytest.raises(ConfigError, match=r"^f:2: a \\u escape makes a lone surrogate$"):
        parse_properties("a=1\nlog.dirs=/tmp/\\ud800\n", "f")


def test_load_properties_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("# tidelog\nnum.partitions=3\nlog.dirs=/data\n")
    settings = load_properties(path)
    assert settings == {"num.partitions": "3", "log.dirs": "/data"}
    assert where(settings, "log.dirs") == f"{path}:3"


# --- errors name the key and the line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num.partitions=3\nlog.retention.ms=soon\n", r"^s.properties:2: config log.retention.ms: expected a 64-bit"),
        ("\n\nnum.partitions=0\n", r"^s.properties:3: config num.partitions: 0 is below the minimum 1$"),
        ("tidelog.storage.engine=kafka\nno.such.key=1\n", r"^s.properties:2: unknown config key 'no.such.key'$"),
        ("listeners=PLAINTEXT://h:99999\n", r"^s.properties:1: config listeners: port 99999"),
        ("auto.create.topics.enable=maybe\n", r"^s.properties:1: config auto.create.topics.enable: expected true or"),
        ("ssl.client.auth=none\na=1\n", r"^s.properties:2: unknown config key 'a'$"),
        ("ssl.truststore.password=x\n", r"^s.properties:1: config ssl.truststore.password: a PEM store has no"),
        ("listeners=SSL://h:1\nssl.keystore.location=\n", r"^s.properties:2: config ssl.keystore.location: listener"),
        ("tidelog.rocketmq.flushDiskType=SOMETIMES\n", r"^s.properties:1: config tidelog.rocketmq.flushDiskType: "),
        ("num.partitions\n", r"^s.properties:1: config num.partitions: expected a 64-bit integer, got ''$"),
    ],
)
def test_broker_config_errors_name_the_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.from_mapping(parse_properties(text, "s.properties"))


def test_engine_config_errors_name_the_file_and_line() -> None:
    with pytest.raises(ConfigError, match=r"^e.properties:2: config log.segment.bytes: 10 is below the minimum 14$"):
        EngineConfig.from_mapping(parse_properties("num.partitions=2\nlog.segment.bytes=10\n", "e.properties"))
    with pytest.raises(ConfigError, match=r"^e.properties:1: unknown config key 'segment.bytes' \(a topic-level key"):
        EngineConfig.from_mapping(parse_properties("segment.bytes=100\n", "e.properties"))


def test_an_override_has_no_line() -> None:
    settings = parse_properties("num.partitions=3\n", "s.properties")
    settings.update({"num.partitions": "x"})  # what `tidelog serve --override` does
    assert where(settings, "num.partitions") is None
    with pytest.raises(ConfigError, match=r"^config num.partitions: expected a 64-bit integer, got 'x'$"):
        BrokerConfig.from_mapping(settings)


def test_a_plain_mapping_gives_the_old_messages() -> None:
    with pytest.raises(ConfigError, match=r"^config num.partitions: expected a 64-bit integer, got 'x'$"):
        BrokerConfig.from_mapping({"num.partitions": "x"})
    with pytest.raises(ConfigError, match=r"^unknown config key 'nope'$"):
        EngineConfig.from_mapping({"nope": 1})


def test_select_keeps_the_lines() -> None:
    settings = parse_properties("a=1\nb=2\n", "f")
    subset = select(settings, ["b"])
    assert subset == {"b": "2"} and where(subset, "b") == "f:2"
    assert select({"a": 1, "b": 2}, ["a"]) == {"a": 1}


def test_a_good_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(
        "listeners=PLAINTEXT://127.0.0.1:0\n"
        f"log.dirs={tmp_path / 'data'}\n"
        "log.retention.hours 24\n"
        "log.cleanup.policy=compact,\\\n  delete\n"
        "tidelog.storage.engine: kafka\n"
    )
    config = BrokerConfig.from_mapping(load_properties(path))
    assert config.engine.log_dirs == (str(tmp_path / "data"),)
    assert config.engine.log_defaults.retention_ms == 24 * 3_600_000
    assert config.engine.log_defaults.cleanup_policy == ("compact", "delete")


# --- meta.properties goes through the same reader ----------------------------------------------------------------


def test_meta_properties_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "meta.properties"
    stored = {"version": "1", "cluster.id": "AAAAAAAAAAAAAAAAAAAAAA", "node.id": "1", "directory.id": "x"}
    checkpoints.write_meta_properties(path, stored)
    assert checkpoints.read_meta_properties(path) == stored


@pytest.mark.parametrize("text", ["version=1\ncluster.id\n", "cluster.id=\\u12\n"])
def test_a_damaged_meta_properties_is_corrupt(tmp_path: Path, text: str) -> None:
    path = tmp_path / "meta.properties"
    path.write_text(text)
    with pytest.raises(CorruptCheckpointError, match=r"meta\.properties"):
        checkpoints.read_meta_properties(path)


# --- the key tables ------------------------------------------------------------------------------------------


ALL_KEYS = {**SERVER_KEYS, **BROKER_KEYS, **TOPIC_KEYS}


@pytest.mark.parametrize("name", sorted(ALL_KEYS))
def test_every_key_is_documented(name: str) -> None:
    key = ALL_KEYS[name]
    assert key.doc and "\n" not in key.doc and key.doc.endswith("."), name
    assert key.parse in VALUE_TYPES, f"{name}: no type name for {key.parse.__name__}"
    assert key.engines and set(key.engines) <= set(ENGINES), name


@pytest.mark.parametrize("name", sorted(name for name, key in SERVER_KEYS.items() if key.default is not None))
def test_broker_key_defaults_are_the_config_defaults(name: str) -> None:
    assert BrokerConfig.from_mapping({name: SERVER_KEYS[name].default}) == BrokerConfig.from_mapping({})


@pytest.mark.parametrize("name", sorted(name for name, key in BROKER_KEYS.items() if key.default is not None))
def test_storage_key_defaults_are_the_config_defaults(name: str) -> None:
    assert EngineConfig.from_mapping({name: BROKER_KEYS[name].default}) == EngineConfig.from_mapping({})


@pytest.mark.parametrize("name", sorted(TOPIC_KEYS))
def test_topic_key_defaults_are_the_config_defaults(name: str) -> None:
    default = TOPIC_KEYS[name].default
    assert default is not None
    assert LogConfig().with_overrides({name: default}) == LogConfig()


def test_only_the_coarsest_spelling_of_a_topic_default_has_a_default() -> None:
    assert TOPIC_DEFAULT_KEYS["log.retention.hours"].default == "168"
    assert TOPIC_DEFAULT_KEYS["log.retention.minutes"].default is None
    assert TOPIC_DEFAULT_KEYS["log.retention.ms"].default is None
    assert TOPIC_DEFAULT_KEYS["log.segment.bytes"].default == TOPIC_KEYS["segment.bytes"].default
