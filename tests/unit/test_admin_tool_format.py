"""The pure parts of `tidelog configs` and `tidelog consumer-groups`: Kafka's argument syntax and printed forms."""

from __future__ import annotations

import pytest

from tidelog.broker.scram import MECHANISMS
from tidelog.errors import ToolError
from tidelog.tools.configs import (
    java_double,
    java_exception_text,
    parse_add_config,
    quota_entity_text,
    scram_upsertion,
)
from tidelog.tools.consumer_groups import PartitionRow, offsets_table, parse_topic_arg, reset_plan_table


@pytest.mark.parametrize(
    ("value", "text"),
    [(1024, "1024.0"), (0.5, "0.5"), (0, "0.0"), (2e7, "2.0E7"), (12345678, "1.2345678E7"), (1e-4, "1.0E-4"),
     (9999999, "9999999.0"), (-3e8, "-3.0E8")],
)  # fmt: skip
def test_quota_values_print_as_java_doubles(value: float, text: str) -> None:
    assert java_double(value) == text


def test_add_config_splits_outside_brackets() -> None:
    assert parse_add_config("retention.ms=1000, cleanup.policy=[compact,delete],x=") == {
        "retention.ms": "1000",
        "cleanup.policy": "compact,delete",
        "x": "",
    }
    assert parse_add_config("SCRAM-SHA-256=[iterations=8192,password=a=b]") == {
        "SCRAM-SHA-256": "iterations=8192,password=a=b"
    }
    with pytest.raises(ToolError, match="key=val"):
        parse_add_config("retention.ms")
    with pytest.raises(ToolError, match="Invalid character"):
        parse_add_config("bad key!=1")


def test_scram_upsertion_salts_the_password_as_the_java_client_does() -> None:
    upsertion = scram_upsertion("alice", "SCRAM-SHA-512", "iterations=8192,password=s3cret")
    assert upsertion["mechanism"] == 2 and upsertion["iterations"] == 8192 and len(upsertion["salt"]) == 32
    expected = MECHANISMS["SCRAM-SHA-512"].salted_password("s3cret", upsertion["salt"], 8192)
    assert upsertion["salted_password"] == expected
    assert scram_upsertion("alice", "SCRAM-SHA-256", "password=x")["iterations"] == 4096
    with pytest.raises(ToolError, match="less than the minimum 4096"):
        scram_upsertion("alice", "SCRAM-SHA-256", "iterations=100,password=x")


def test_quota_entities_are_named_as_kafka_configs_names_them() -> None:
    assert quota_entity_text([("client-id", "app"), ("user", "alice")]) == "user-principal 'alice', client-id 'app'"
    assert quota_entity_text([("user", None)]) == "the default user-principal"


def test_per_user_errors_print_as_the_java_exception() -> None:
    assert java_exception_text(91, "no such user") == (
        "ExecutionException: org.apache.kafka.common.errors.ResourceNotFoundException: no such user"
    )
    assert (
        java_exception_text(92, None) == "ExecutionException: org.apache.kafka.common.errors.DuplicateResourceException"
    )
    assert java_exception_text(31, "denied") == "CLUSTER_AUTHORIZATION_FAILED: denied"  # no Java name kept: by name


def test_tables_have_kafkas_widths() -> None:
    table = offsets_table([PartitionRow("g", "orders", 0, 4, 10)])
    assert table == (
        "\nGROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG             CONSUMER-ID     "
        "HOST            CLIENT-ID\n"
        "g               orders          0          4               10              6               -               "
        "-               -\n"
    )
    plan = reset_plan_table({"a-rather-long-group-name": {("t", 1): 5, ("t", 0): 3}})
    assert plan.splitlines()[1:] == [
        "GROUP                    TOPIC           PARTITION  NEW-OFFSET",
        "a-rather-long-group-name t               0          3",
        "a-rather-long-group-name t               1          5",
    ]
    assert parse_topic_arg("t:0,2") == ("t", [0, 2]) and parse_topic_arg("t") == ("t", None)
    with pytest.raises(ToolError, match="Invalid partitions"):
        parse_topic_arg("t:x")
