"""The pure parts of `tidelog topics|produce|consume`: Kafka's line reader and record formatter, property parsing,
the kafka-topics.sh describe layout, the console consumer's option rules, and the CLI's one-line usage errors."""

from __future__ import annotations

import re
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

from tidelog.cli import build_parser
from tidelog.protocol.messages import uuid_to_kafka
from tidelog.tools.console import (
    ConsumedRecord,
    ConsumeOptions,
    LineFormat,
    LineRecord,
    PartitionInfo,
    ProduceOptions,
    RecordFormat,
    ToolError,
    TopicsOptions,
    describe_lines,
    format_record,
    kafka_uuid,
    parse_key_values,
    parse_line,
    parse_offset,
    unescape,
)

# --- properties ---------------------------------------------------------------------------------------------------


def test_unescape_turns_backslash_sequences_into_characters() -> None:
    assert unescape(r"\t") == "\t"
    assert unescape(r"a\nb\rc\\d") == "a\nb\rc\\d"
    assert unescape(r"\x|:") == r"\x|:"


def test_parse_key_values_splits_at_the_first_equals_sign() -> None:
    assert parse_key_values(["a=1", "b=x=y", "c=", " d =2"], "--property") == {"a": "1", "b": "x=y", "c": "", "d": "2"}


@pytest.mark.parametrize("item", ["parse.key", "=true", " =x"])
def test_parse_key_values_rejects_an_item_without_key_or_equals_sign(item: str) -> None:
    with pytest.raises(ToolError, match="expected KEY=VALUE") as caught:
        parse_key_values([item], "--property")
    assert caught.value.exit_code == 2


# --- lines -> records (kafka-console-producer) -------------------------------------------------------------------


def line_format(**properties: str) -> LineFormat:
    return LineFormat.from_properties({k.replace("_", "."): v for k, v in properties.items()})


def test_a_line_is_the_value_by_default() -> None:
    assert parse_line("hello\tworld", LineFormat(), 1) == LineRecord(None, b"hello\tworld", [])
    assert parse_line("", LineFormat(), 1) == LineRecord(None, b"", [])


def test_parse_key_splits_at_the_first_key_separator() -> None:
    fmt = line_format(parse_key="true", key_separator=":")
    assert parse_line("k1:v:1", fmt, 1) == LineRecord(b"k1", b"v:1", [])
    assert parse_line(":v", fmt, 1) == LineRecord(b"", b"v", [])


def test_separators_accept_escapes_and_strings_longer_than_one_character() -> None:
    assert parse_line("k\tv", line_format(parse_key="true", key_separator=r"\t"), 1) == LineRecord(b"k", b"v", [])
    assert parse_line("k::v", line_format(parse_key="true", key_separator="::"), 1) == LineRecord(b"k", b"v", [])


def test_headers_then_key_then_value() -> None:
    fmt = line_format(parse_key="true", key_separator=":", parse_headers="true")
    record = parse_line("h1:v1,h2:v2\tkey:value", fmt, 1)
    assert record == LineRecord(b"key", b"value", [("h1", b"v1"), ("h2", b"v2")])


def test_header_values_keep_later_key_separators_and_trailing_header_separators_are_dropped() -> None:
    fmt = line_format(parse_headers="true")
    assert parse_line("a:1:2,b:,\tv", fmt, 1) == LineRecord(None, b"v", [("a", b"1:2"), ("b", b"")])


def test_custom_header_separators() -> None:
    fmt = line_format(parse_headers="true", headers_delimiter="|", headers_separator=";", headers_key_separator="=")
    assert parse_line("a=1;b=2|v", fmt, 1) == LineRecord(None, b"v", [("a", b"1"), ("b", b"2")])


def test_a_missing_key_separator_is_reported_as_kafka_reports_it() -> None:
    fmt = line_format(parse_key="true")
    with pytest.raises(ToolError) as caught:
        parse_line("no separator here", fmt, 7)
    assert str(caught.value) == "No key separator found on line number 7: 'no separator here'"
    assert caught.value.exit_code == 1


def test_a_missing_headers_delimiter_and_header_key_separator_are_errors() -> None:
    with pytest.raises(ToolError, match="No headers delimiter found on line number 2"):
        parse_line("value only", line_format(parse_headers="true"), 2)
    with pytest.raises(ToolError, match="No header key separator found in pair 'h1' on line number 3"):
        parse_line("h1\tvalue", line_format(parse_headers="true"), 3)


def test_ignore_error_keeps_the_whole_line_as_value_and_headers_without_value() -> None:
    assert parse_line("no key", line_format(parse_key="true", ignore_error="true"), 1) == LineRecord(None, b"no key")
    fmt = line_format(parse_headers="true", ignore_error="true")
    assert parse_line("h1,h2:x\tv", fmt, 1) == LineRecord(None, b"v", [("h1", None), ("h2", b"x")])


def test_null_marker_makes_key_value_headers_and_header_values_null() -> None:
    fmt = line_format(parse_key="true", parse_headers="true", null_marker="<null>")
    assert parse_line("<null>\t<null>\t<null>", fmt, 1) == LineRecord(None, None, [])
    assert parse_line("h:<null>\tk\tv", fmt, 1) == LineRecord(b"k", b"v", [("h", None)])
    with pytest.raises(ToolError, match="Header keys should not be equal to the null marker"):
        parse_line("<null>:x\tk\tv", fmt, 1)


def test_values_are_utf8() -> None:
    assert parse_line("clé:été", line_format(parse_key="true", key_separator=":"), 1) == LineRecord(
        "clé".encode(), "été".encode()
    )


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"parse.keys": "true"}, "unknown --property 'parse.keys'"),
        ({"parse.key": "yes"}, "parse.key=yes: expected true or false"),
        ({"key.separator": ""}, "may not be empty"),
        ({"headers.delimiter": ","}, "headers.delimiter and headers.separator may not be equal"),
        ({"headers.separator": ":"}, "headers.separator and headers.key.separator may not be equal"),
        ({"null.marker": "\\t"}, "null.marker and key.separator may not be equal"),
    ],
)
def test_bad_line_properties_are_usage_errors(properties: dict[str, str], message: str) -> None:
    with pytest.raises(ToolError, match=re.escape(message)) as caught:
        LineFormat.from_properties(properties)
    assert caught.value.exit_code == 2


def test_boolean_properties_ignore_case_and_spaces() -> None:
    assert LineFormat.from_properties({"parse.key": " TRUE "}).parse_key
    assert not LineFormat.from_properties({"parse.key": "False"}).parse_key


# --- records -> lines (kafka-console-consumer) -------------------------------------------------------------------

RECORD = ConsumedRecord(
    partition=2,
    offset=5,
    timestamp_type=TIMESTAMP_CREATE_TIME,
    timestamp=1_700_000_000_000,
    key=b"key",
    value=b"value",
    headers=[("h1", b"v1"), ("h2", b"v2")],
)


def record_format(**properties: str) -> RecordFormat:
    return RecordFormat.from_properties({k.replace("_", "."): v for k, v in properties.items()})


def test_the_value_alone_by_default() -> None:
    assert format_record(RECORD, RecordFormat()) == b"value\n"


def test_every_field_in_kafkas_order() -> None:
    fmt = record_format(
        print_timestamp="true", print_partition="true", print_offset="true", print_headers="true", print_key="true"
    )
    assert format_record(RECORD, fmt) == b"CreateTime:1700000000000\tPartition:2\tOffset:5\th1:v1,h2:v2\tkey\tvalue\n"


def test_key_and_value_with_custom_separators() -> None:
    fmt = record_format(print_key="true", key_separator=" => ", line_separator=r"\r\n")
    assert format_record(RECORD, fmt) == b"key => value\r\n"


def test_without_the_value_the_last_field_ends_the_line() -> None:
    fmt = record_format(print_offset="true", print_key="true", print_value="false")
    assert format_record(RECORD, fmt) == b"Offset:5\tkey\n"
    assert format_record(RECORD, record_format(print_value="false")) == b""


def test_no_headers_no_timestamp_log_append_time_and_nulls() -> None:
    bare = ConsumedRecord(0, 0, 0, -1, None, None, [])
    fmt = record_format(print_timestamp="true", print_headers="true", print_key="true")
    assert format_record(bare, fmt) == b"NO_TIMESTAMP\tNO_HEADERS\tnull\tnull\n"
    appended = ConsumedRecord(0, 0, TIMESTAMP_LOG_APPEND_TIME, 42, b"k", b"v", [("h", None)])
    fmt = record_format(print_timestamp="true", print_headers="true", headers_separator="|", null_literal="<nil>")
    assert format_record(appended, fmt) == b"LogAppendTime:42\th:<nil>\tv\n"


def test_unknown_record_property_is_a_usage_error() -> None:
    with pytest.raises(ToolError, match=re.escape("unknown --property 'print.keys'")):
        RecordFormat.from_properties({"print.keys": "true"})


# --- kafka-topics.sh --describe ----------------------------------------------------------------------------------


def test_kafka_uuid_is_kafkas_url_safe_base64_text() -> None:
    for value in [uuid.UUID("f0e1d2c3-b4a5-9687-7869-5a4b3c2d1e0f"), uuid.UUID(int=1), uuid.uuid4()]:
        msb, lsb = value.int >> 64, value.int & (1 << 64) - 1
        signed = [n - (1 << 64) if n >= 1 << 63 else n for n in (msb, lsb)]
        assert kafka_uuid(*signed) == uuid_to_kafka(value)
    assert kafka_uuid(0, 0) is None


def test_describe_lines_are_kafka_topics_lines() -> None:
    partitions = [PartitionInfo(1, 1, [1], [1]), PartitionInfo(0, 1, [1], [1])]
    lines = describe_lines("orders", "AAAAAAAAAAAAAAAAAAAAAQ", partitions, {"retention.ms": "1000", "x": None})
    assert lines == [
        "Topic: orders\tTopicId: AAAAAAAAAAAAAAAAAAAAAQ\tPartitionCount: 2\tReplicationFactor: 1"
        "\tConfigs: retention.ms=1000,x=null",
        "\tTopic: orders\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1",
        "\tTopic: orders\tPartition: 1\tLeader: 1\tReplicas: 1\tIsr: 1",
    ]


def test_describe_without_topic_id_configs_or_leader() -> None:
    lines = describe_lines("t", None, [PartitionInfo(0, -1, [2, 3], [3])], {})
    assert lines == [
        "Topic: t\tPartitionCount: 1\tReplicationFactor: 2\tConfigs: ",
        "\tTopic: t\tPartition: 0\tLeader: none\tReplicas: 2,3\tIsr: 3",
    ]


# --- option rules ------------------------------------------------------------------------------------------------


def test_parse_offset() -> None:
    assert parse_offset("earliest") == OFFSET_BEGINNING
    assert parse_offset("LATEST") == OFFSET_END
    assert parse_offset("42") == 42
    for bad in ["-1", "x", ""]:
        with pytest.raises(ToolError, match="Valid values are 'earliest', 'latest', or a non-negative long"):
            parse_offset(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"offset": "3"}, "The partition is required when offset is specified."),
        ({"partition": 0, "offset": "3", "from_beginning": True}, "from-beginning and offset cannot be specified"),
        ({"partition": 0, "group": "g"}, "Options group and partition cannot be specified together."),
        ({"group": "a", "consumer_config": {"group.id": "b"}}, "Detected group ids: 'a', 'b'"),
        ({"max_messages": -1}, "--max-messages must not be negative"),
        ({"connect_timeout_ms": 0}, "--connect-timeout-ms must be positive"),
    ],
)
def test_consume_option_rules(kwargs: dict, message: str) -> None:
    with pytest.raises(ToolError, match=re.escape(message)) as caught:
        ConsumeOptions("h:1", "t", **kwargs)
    assert caught.value.exit_code == 2


def test_a_named_group_auto_commits_and_a_random_one_never_commits() -> None:
    named = ConsumeOptions("h:1", "t", group="g").client_config(errors=None)  # type: ignore[arg-type]
    assert named["group.id"] == "g"
    assert "enable.auto.commit" not in named  # librdkafka's default: on
    assert named["auto.offset.reset"] == "latest"
    anonymous = ConsumeOptions("h:1", "t", from_beginning=True).client_config(errors=None)  # type: ignore[arg-type]
    assert anonymous["group.id"].startswith("console-consumer-")
    assert anonymous["enable.auto.commit"] is False
    assert anonymous["auto.offset.reset"] == "earliest"
    committing = ConsumeOptions("h:1", "t", consumer_config={"enable.auto.commit": "true"})
    assert committing.client_config(errors=None)["enable.auto.commit"] == "true"  # type: ignore[arg-type]


def test_from_beginning_may_not_contradict_auto_offset_reset() -> None:
    options = ConsumeOptions("h:1", "t", from_beginning=True, consumer_config={"auto.offset.reset": "latest"})
    with pytest.raises(
        ToolError, match=re.escape("Can't simultaneously specify --from-beginning and 'auto.offset.reset=latest'")
    ):
        options.client_config(errors=None)  # type: ignore[arg-type]


def test_start_offset_of_an_assigned_partition() -> None:
    assert ConsumeOptions("h:1", "t", partition=0).start_offset() == OFFSET_END
    assert ConsumeOptions("h:1", "t", partition=0, from_beginning=True).start_offset() == OFFSET_BEGINNING
    assert ConsumeOptions("h:1", "t", partition=0, offset="7").start_offset() == 7


def test_producer_defaults_to_murmur2_random_and_explicit_options_win() -> None:
    def on_delivery(error: object, message: object) -> None:
        pass

    config = ProduceOptions("h:1", "t").client_config(errors=None, on_delivery=on_delivery)  # type: ignore[arg-type]
    assert config["partitioner"] == "murmur2_random"
    options = ProduceOptions(
        "h:1", "t", acks="1", producer_config={"acks": "0", "partitioner": "consistent_random", "linger.ms": "50"}
    )
    config = options.client_config(errors=None, on_delivery=on_delivery)  # type: ignore[arg-type]
    assert (config["acks"], config["partitioner"], config["linger.ms"]) == ("1", "consistent_random", "50")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action": "list", "partitions": 3}, "option --partitions can't be used with --list"),
        ({"action": "delete", "topic": "t", "if_not_exists": True}, "--if-not-exists can't be used with --delete"),
        ({"action": "create", "if_exists": True, "topic": "t"}, "--if-exists can't be used with --create"),
        ({"action": "create"}, "--create needs --topic"),
        ({"action": "delete"}, "--delete needs --topic"),
        ({"action": "create", "topic": "t", "partitions": 0}, "The partitions must be greater than 0"),
        ({"action": "create", "topic": "t", "replication_factor": 0}, "between 1 and 32767"),
    ],
)
def test_topics_option_rules(kwargs: dict, message: str) -> None:
    with pytest.raises(ToolError, match=re.escape(message)) as caught:
        TopicsOptions("h:1", **kwargs)
    assert caught.value.exit_code == 2


# --- the CLI's usage errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["produce", "--bootstrap-server", "h:1", "--topic", "t", "--bogus"], "unrecognized arguments: --bogus"),
        (["topics", "--bootstrap-server", "h:1"], "one of the arguments --create --list --describe --delete"),
        (["consume", "--bootstrap-server", "h:1", "--topic", "t", "--partition", "x"], "invalid int value: 'x'"),
    ],
)
def test_a_usage_error_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"tidelog {argv[0]}: error: ")
    assert message in err
