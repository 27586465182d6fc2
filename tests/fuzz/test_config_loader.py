"""The config loader against hostile input: properties files, --override strings and topic configs.

Whatever the bytes, loading either raises ConfigError naming the key or line, or gives a config whose every number
is one Kafka could hold (a Java long; INT keys an int) and whose listeners can be bound. The fixed cases below are
what fuzzing found; each failed before its fix.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tidelog.broker.config import SERVER_KEYS, BrokerConfig, Listener
from tidelog.config import BROKER_KEYS, INT_MAX, LONG_MAX, TOPIC_KEYS, LogConfig, load_properties, parse_properties
from tidelog.errors import ConfigError

ALL_KEYS = sorted({*BROKER_KEYS, *SERVER_KEYS})
LONG_MIN = -(1 << 63)

numbers = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([INT_MAX, INT_MAX + 1, LONG_MAX, LONG_MAX + 1, LONG_MIN, LONG_MIN - 1, 10**30]),
    st.integers(),
).map(str)
odd_numbers = st.sampled_from(["1_000", "+7", "0x10", "1e3", " 12 ", "١٢", "12 34", "-", "", "9" * 5000])
listeners = st.builds(
    lambda name, host, port: f"{name}://{host}:{port}",
    st.sampled_from(["PLAINTEXT", "SSL", "plaintext", "X"]),
    st.sampled_from(["127.0.0.1", "", "[::1]", "localhost", "host:1"]),
    st.one_of(st.integers(0, 70000), st.just(10**40)),
)
values = st.one_of(
    numbers,
    odd_numbers,
    st.sampled_from(["true", "false", "TRUE", "yes", "delete", "compact", "CreateTime", "kafka", "rocketmq"]),
    listeners,
    st.lists(listeners, min_size=1, max_size=3).map(",".join),
    st.text(max_size=30),
)
settings_maps = st.dictionaries(st.sampled_from(ALL_KEYS) | st.text(max_size=12), values, max_size=8)


def java_sized(value: Any, path: str = "config") -> None:
    """Every integer inside a loaded config fits a Java long."""
    if dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            java_sized(getattr(value, field.name), f"{path}.{field.name}")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            java_sized(item, f"{path}[{i}]")
    elif isinstance(value, int) and not isinstance(value, bool):
        assert LONG_MIN <= value <= LONG_MAX, f"{path} = {value} does not fit a Java long"


def names_a_key(message: str, keys: dict[str, str]) -> bool:
    return any(key in message or repr(key) in message for key in keys)


@settings(max_examples=400, deadline=None)
@given(settings_maps)
@example({"listeners": "SSL://:0"})  # a TLS listener without a keystore: the error names both keys
def test_broker_settings_load_or_name_the_key(settings_map: dict[str, str]) -> None:
    try:
        config = BrokerConfig.from_mapping(settings_map)
    except ConfigError as exc:
        assert names_a_key(str(exc), settings_map), f"the error names no key: {exc}"
        return
    java_sized(config)
    for listener in (*config.listeners, *(config.advertised_listeners or ())):
        assert 0 <= listener.port <= 65535


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(TOPIC_KEYS)) | st.text(max_size=12), values, max_size=5))
def test_topic_configs_load_or_name_the_key(configs: dict[str, str]) -> None:
    try:
        java_sized(LogConfig().with_overrides(configs))
    except ConfigError as exc:
        assert names_a_key(str(exc), configs), f"the error names no key: {exc}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ALL_KEYS) | st.text(max_size=10), values), max_size=6), st.binary(max_size=8))
def test_properties_files_load_or_name_the_line(lines: list[tuple[str, str]], junk: bytes) -> None:
    text = "\n".join(f"{k}={v}" for k, v in lines).encode("utf-8", "surrogatepass") + junk
    try:
        config = BrokerConfig.from_mapping(parse_properties(text, "server.properties"))
    except ConfigError as exc:
        assert "server.properties" in str(exc) or "config" in str(exc), exc
        return
    java_sized(config)


# --- what fuzzing found ----------------------------------------------------------------------------------------


def test_a_properties_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_bytes(b"num.partitions=3\nlog.dirs=/tmp/\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"server.properties:2: not UTF-8"):
        load_properties(path)


def test_tidelog_serve_reports_a_non_utf8_config_and_exits_2(tmp_path: Path) -> None:
    """Before the fix: a UnicodeDecodeError traceback from `tidelog serve`."""
    path = tmp_path / "server.properties"
    path.write_bytes(b"listeners=PLAINTEXT://127.0.0.1:0\nlog.dirs=" + str(tmp_path).encode() + b"/\xc3\x28\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_carriage_returns_end_lines_as_in_java_properties() -> None:
    assert parse_properties(b"a=1\rb=2\r\nc=3\n", "x") == {"a": "1", "b": "2", "c": "3"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("log.retention.ms", str(LONG_MAX + 1)),  # beyond a Java long
        ("log.retention.ms", str(LONG_MIN - 1)),
        ("log.roll.hours", str(INT_MAX + 1)),  # an INT key in Kafka; times 3.6e6 it overflowed a long
        ("num.partitions", "1_000"),  # Python's int() took these; Java's parser does not
        ("num.partitions", "١٢"),  # Arabic-Indic digits
        ("num.partitions", "9" * 5000),  # past int()'s 4300-digit limit
        ("listeners", "PLAINTEXT://127.0.0.1:99999"),  # a port no socket can bind
        ("listeners", "PLAINTEXT://127.0.0.1:" + "9" * 5000),  # int() raised ValueError past 4300 digits
        ("listeners", "PLAINTEXT://127.0.0.1:١٢"),
        ("listeners", "PLAINTEXT://" + "a" * 64 + ".example:9092"),  # was a UnicodeError traceback at bind
        ("advertised.listeners", "PLAINTEXT://a..b:9092"),  # an empty label
    ],
)
def test_numbers_kafka_would_refuse_are_config_errors(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        BrokerConfig.from_mapping({key: value})


def test_the_largest_values_kafka_accepts_still_load() -> None:
    config = BrokerConfig.from_mapping(
        {"log.retention.ms": str(LONG_MAX), "log.roll.hours": str(INT_MAX), "listeners": "PLAINTEXT://[::1]:65535"}
    )
    assert config.engine.log_defaults.retention_ms == LONG_MAX
    assert config.engine.log_defaults.segment_ms == INT_MAX * 3_600_000
    assert config.listeners == (Listener("PLAINTEXT", "::1", 65535),)
    java_sized(config)
