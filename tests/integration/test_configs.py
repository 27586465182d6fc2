"""Config changes through a real `tidelog serve`: AlterConfigs, IncrementalAlterConfigs and DescribeConfigs with
confluent-kafka's AdminClient (librdkafka) and kafka-python's KafkaAdminClient, and their effects seen by producers
and on disk (a zstd topic's stored batches, a refused oversize message, retention shrunk live, a dynamic broker
config surviving a restart).

One broker for the module (retention checked every 200 ms); each test uses its own topics.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

import kafka_wire
from tidelog.codec.compression import Compression
from tidelog.codec.record_batch import read_header

with warnings.catch_warnings():  # kafka-python's import trips importlib.resources deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

TIMEOUT_S = 30.0
TOPIC = ConfigResource.Type.TOPIC
BROKER = ConfigResource.Type.BROKER


@pytest.fixture(scope="module")
def broker(start_module_broker):
    return start_module_broker({"log.retention.check.interval.ms": "200", "log.segment.delete.delay.ms": "0"})


@pytest.fixture(scope="module")
def admin(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create(admin: AdminClient, name: str, config: dict[str, str] | None = None) -> None:
    futures = admin.create_topics([NewTopic(name, 1, 1, config=config or {})], request_timeout=15)
    futures[name].result(timeout=TIMEOUT_S)


def describe(admin: AdminClient, kind: ConfigResource.Type, name: str) -> dict:
    resource = ConfigResource(kind, name)
    return admin.describe_configs([resource], request_timeout=15)[resource].result(timeout=TIMEOUT_S)


def incremental(admin: AdminClient, kind: ConfigResource.Type, name: str, *ops, validate_only: bool = False) -> None:
    entries = [ConfigEntry(key, value, incremental_operation=op) for key, value, op in ops]
    resource = ConfigResource(kind, name, incremental_configs=entries)
    futures = admin.incremental_alter_configs([resource], request_timeout=15, validate_only=validate_only)
    futures[resource].result(timeout=TIMEOUT_S)


def alter_error(admin: AdminClient, kind: ConfigResource.Type, name: str, *ops) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        incremental(admin, kind, name, *ops)
    return raised.value.args[0]


SET, DELETE, APPEND, SUBTRACT = (
    AlterConfigOpType.SET,
    AlterConfigOpType.DELETE,
    AlterConfigOpType.APPEND,
    AlterConfigOpType.SUBTRACT,
)


@pytest.mark.matrix("admin: alter configs", client="confluent")
def test_incremental_alter_topic_configs(admin) -> None:
    create(admin, "inc-topic", {"segment.bytes": "1048576"})
    incremental(admin, TOPIC, "inc-topic", ("retention.ms", "3600000", SET), ("cleanup.policy", "compact", APPEND))
    described = describe(admin, TOPIC, "inc-topic")
    assert described["retention.ms"].value == "3600000"
    assert described["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert described["cleanup.policy"].value == "delete,compact"
    assert described["segment.bytes"].value == "1048576"  # the incremental change kept the other override

    incremental(admin, TOPIC, "inc-topic", ("retention.ms", "", DELETE), ("cleanup.policy", "delete", SUBTRACT))
    described = describe(admin, TOPIC, "inc-topic")
    assert (described["retention.ms"].value, described["retention.ms"].source) == (
        "604800000",
        ConfigSource.DEFAULT_CONFIG.value,
    )
    assert described["cleanup.policy"].value == "compact"

    incremental(admin, TOPIC, "inc-topic", ("retention.ms", "1000", SET), validate_only=True)
    assert describe(admin, TOPIC, "inc-topic")["retention.ms"].value == "604800000"


def test_alter_errors_name_the_problem(admin) -> None:
    create(admin, "inc-errors")
    error = alter_error(admin, TOPIC, "inc-errors", ("retention.ms", "soon", SET))
    assert error.code() == KafkaError.INVALID_CONFIG and "retention.ms" in error.str()
    error = alter_error(admin, TOPIC, "inc-errors", ("no.such.key", "1", SET))
    assert error.code() == KafkaError.INVALID_CONFIG and "no.such.key" in error.str()
    error = alter_error(admin, TOPIC, "inc-errors", ("retention.ms", "5", APPEND))
    assert error.code() == KafkaError.INVALID_CONFIG and "append" in error.str()
    error = alter_error(admin, TOPIC, "no-such-topic", ("retention.ms", "5", SET))
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    error = alter_error(admin, BROKER, "1", ("num.partitions", "3", SET))
    assert error.code() == KafkaError.INVALID_REQUEST and "Cannot update these configs dynamically" in error.str()
    assert describe(admin, TOPIC, "inc-errors")["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


@pytest.mark.matrix("admin: alter configs", client="kafka-python")
@pytest.mark.matrix("admin: alter configs", client="confluent")
def test_alter_configs_replaces_the_whole_set(broker, admin) -> None:
    create(admin, "legacy-alter", {"retention.ms": "3600000", "segment.bytes": "1048576"})
    # kafka-python's AlterConfigs (v0-v2): it sends the other overrides along, which are kept
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        resource = KpConfigResource(ConfigResourceType.TOPIC, "legacy-alter", {"flush.ms": "500"})
        assert client.alter_configs([resource], incremental=False, raise_on_unknown=False) == {
            "topic": {"legacy-alter": "OK"}
        }
    finally:
        client.close()
    described = describe(admin, TOPIC, "legacy-alter")
    assert (described["flush.ms"].value, described["retention.ms"].value) == ("500", "3600000")
    # librdkafka's AlterConfigs with one key: the set is replaced, the other overrides go back to their defaults
    resource = ConfigResource(TOPIC, "legacy-alter", set_config={"flush.ms": "700"})
    with pytest.warns(DeprecationWarning):  # as Kafka's own AdminClient, for AlterConfigs
        futures = admin.alter_configs([resource], request_timeout=15)
    futures[resource].result(timeout=TIMEOUT_S)
    described = describe(admin, TOPIC, "legacy-alter")
    assert described["flush.ms"].value == "700"
    assert described["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert described["segment.bytes"].value == "1073741824"


def test_zstd_topic_stores_zstd_batches(broker, admin) -> None:
    create(admin, "zstd-topic", {"compression.type": "zstd"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4", "linger.ms": 0})
    for i in range(3):
        producer.produce("zstd-topic", value=b"payload %d " % i * 50)
        producer.flush(TIMEOUT_S)
    data = (Path(broker.log_dir) / "zstd-topic-0" / f"{0:020d}.log").read_bytes()
    codecs, position = [], 0
    while position < len(data):
        header = read_header(data, position)
        codecs.append(header.compression)
        position += header.size_in_bytes
    assert codecs == [Compression.ZSTD] * 3


def test_max_message_bytes_altered_refuses_larger_messages(broker, admin) -> None:
    create(admin, "small-messages")
    incremental(admin, TOPIC, "small-messages", ("max.message.bytes", "1000", SET))
    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "retries": 0})
    producer.produce("small-messages", value=b"x" * 5000, on_delivery=lambda error, _m: errors.append(error))
    producer.flush(TIMEOUT_S)
    producer.produce("small-messages", value=b"x" * 100, on_delivery=lambda error, _m: errors.append(error))
    producer.flush(TIMEOUT_S)
    assert [e.code() if e else None for e in errors] == [KafkaError.MSG_SIZE_TOO_LARGE, None]


def test_retention_altered_live_deletes_old_segments(broker, admin) -> None:
    create(admin, "shrinking", {"segment.bytes": "2000"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(20):
        producer.produce("shrinking", value=b"%03d" % i * 100)
        producer.flush(TIMEOUT_S)
    directory = Path(broker.log_dir) / "shrinking-0"
    assert len(list(directory.glob("*.log"))) >= 4
    incremental(admin, TOPIC, "shrinking", ("retention.bytes", "2500", SET))
    deadline = time.monotonic() + 10
    while len(list(directory.glob("*.log"))) > 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list(directory.glob("*.log"))) <= 2


def set_cluster_default(broker, configs: dict[str, str | None]) -> None:
    """IncrementalAlterConfigs v1 of the cluster's default broker configs (resource name ""), which librdkafka and
    kafka-python refuse to send: SET each key, DELETE those given None."""
    changes = [
        {"name": name, "config_operation": 1 if value is None else 0, "value": value} for name, value in configs.items()
    ]
    body = {"resources": [{"resource_type": 4, "resource_name": "", "configs": changes}], "validate_only": False}
    response = kafka_wire.request(broker.bootstrap, 44, 1, body)
    assert [(r.error_code, r.error_message) for r in response.responses] == [(0, None)]


def default_broker_configs(broker) -> dict[str, tuple[str | None, int]]:
    """DescribeConfigs v4 of the "" broker resource: name -> (value, source)."""
    body = {
        "resources": [{"resource_type": 4, "resource_name": "", "configuration_keys": None}],
        "include_synonyms": True,
        "include_documentation": True,
    }
    (result,) = kafka_wire.request(broker.bootstrap, 32, 4, body).results
    assert result.error_code == 0, result.error_message
    assert all(c.documentation for c in result.configs)
    return {c.name: (c.value, c.config_source) for c in result.configs}


def test_dynamic_broker_config_applies_and_survives_a_restart(broker, admin) -> None:
    create(admin, "follows-broker")
    create(admin, "own-retention", {"retention.ms": "1000000"})
    incremental(admin, BROKER, "1", ("log.retention.ms", "7200000", SET))
    set_cluster_default(broker, {"log.segment.bytes": "5000000"})  # librdkafka refuses the "" broker resource

    def check() -> None:
        topic = describe(admin, TOPIC, "follows-broker")
        assert topic["retention.ms"].value == "7200000"
        assert topic["retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert [(s.name, s.source) for s in topic["retention.ms"].synonyms.values()][:1] == [
            ("log.retention.ms", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        ]
        assert topic["segment.bytes"].value == "5000000"
        assert topic["segment.bytes"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        assert describe(admin, TOPIC, "own-retention")["retention.ms"].value == "1000000"
        mine = describe(admin, BROKER, "1")
        assert (mine["log.retention.ms"].value, mine["log.retention.ms"].is_read_only) == ("7200000", False)
        assert mine["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert mine["num.partitions"].is_read_only
        assert default_broker_configs(broker) == {"log.segment.bytes": ("5000000", 3)}  # DYNAMIC_DEFAULT_BROKER

    check()
    broker.restart()
    check()
    incremental(admin, BROKER, "1", ("log.retention.ms", "", DELETE))
    set_cluster_default(broker, {"log.segment.bytes": None})
    assert default_broker_configs(broker) == {}
    assert describe(admin, TOPIC, "follows-broker")["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert describe(admin, TOPIC, "follows-broker")["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
