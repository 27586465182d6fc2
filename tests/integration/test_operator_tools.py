"""`tidelog consumer-groups`, `tidelog configs` and `tidelog perf` against a real `tidelog serve`.

The tools run in this process (`tidelog.cli.main`, output captured) against one broker for the module, with
`group.initial.rebalance.delay.ms=0` so that a group forms in milliseconds, `log.retention.hours=168` set statically
as Kafka's shipped server.properties sets it, and a SASL_PLAINTEXT listener (SCRAM) beside the PLAINTEXT one the
tools use, where a user the tool created logs in; each test uses its own topics, groups, users and clients.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.cli import main

TIMEOUT_S = 20.0


class BrokerProcess(Protocol):  # what these tests use of conftest's BrokerProcess
    @property
    def bootstrap(self) -> str: ...

    def bootstrap_for(self, listener: str) -> str: ...


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def broker(start_module_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    return start_module_broker(
        {"sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512", "connection.failed.authentication.delay.ms": 0},
        listeners=("PLAINTEXT", "SASL_PLAINTEXT"),
        group_initial_rebalance_delay_ms=0,
        log_retention_hours=168,
    )


@pytest.fixture
def run(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> Run:
    """`run("consumer-groups", "--list")` -> (exit code, stdout, stderr), against the module's broker."""

    def tool(command: str, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        if command == "perf":
            code = main([command, args[0], "--bootstrap-server", broker.bootstrap, *args[1:]])
        else:
            code = main([command, "--bootstrap-server", broker.bootstrap, *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return tool


def create_topic(broker: BrokerProcess, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(TIMEOUT_S)


def produce(broker: BrokerProcess, topic: str, partitions: int, per_partition: int, base_ms: int) -> None:
    """`per_partition` records to each partition, record i stamped base_ms + i seconds."""
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, b"v%d" % i, partition=p, timestamp=base_ms + i * 1000)
    assert producer.flush(TIMEOUT_S) == 0


def rows(table: str) -> list[list[str]]:
    """A Kafka table's lines split at runs of spaces, the header left out."""
    lines = [line.split() for line in table.splitlines() if line.strip()]
    return lines[1:]


def committed(broker: BrokerProcess, group: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    answer = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(TIMEOUT_S)
    return {tp.partition: tp.offset for tp in answer.topic_partitions if tp.offset >= 0}


# --- consumer-groups ---------------------------------------------------------------------------------------------


def test_describe_reset_and_delete_a_group(broker: BrokerProcess, run: Run) -> None:
    topic, group = "ops-orders", "ops-readers"
    base_ms = 1_700_000_000_000
    create_topic(broker, topic, 3)
    produce(broker, topic, 3, 10, base_ms)

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "client.id": "lag-reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while len(consumer.assignment()) < 3 and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert len(consumer.assignment()) == 3
    consumer.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 2)], asynchronous=False)

    # the offsets view: committed, log end and lag per partition, with the member holding it
    code, out, _ = run("consumer-groups", "--describe", "--group", group)
    assert code == 0
    assert out.startswith("\nGROUP ")
    assert out.splitlines()[1].split() == [
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"
    ]  # fmt: skip
    described = rows(out)
    assert [r[:6] for r in described] == [
        [group, topic, "0", "4", "10", "6"],
        [group, topic, "1", "2", "10", "8"],
        [group, topic, "2", "-", "10", "-"],
    ]
    for r in described:
        assert r[6].startswith("lag-reader-") and r[7] == "/127.0.0.1" and r[8] == "lag-reader"

    code, out, _ = run("consumer-groups", "--describe", "--group", group, "--members")
    assert code == 0
    (member,) = rows(out)
    assert (
        member[0] == group and member[1].startswith("lag-reader-") and member[2:] == ["/127.0.0.1", "lag-reader", "3"]
    )

    code, out, _ = run("consumer-groups", "--describe", "--group", group, "--state")
    assert code == 0
    assert rows(out) == [[group, broker.bootstrap, "(1)", "range", "Stable", "1"]]

    code, out, _ = run("consumer-groups", "--list", "--state", "stable")
    assert code == 0 and [group, "Stable"] in rows(out)
    code, out, _ = run("consumer-groups", "--list", "--state", "Empty")
    assert code == 0 and group not in out

    # a group with members is refused, --execute or not, and keeps its offsets
    code, out, err = run("consumer-groups", "--reset-offsets", "--group", group, "--all-topics", "--to-earliest")
    assert code == 1
    assert f"Assignments can only be reset if the group '{group}' is inactive, but the current state is Stable." in err
    code, out, err = run(
        "consumer-groups", "--reset-offsets", "--group", group, "--all-topics", "--to-offset", "1", "--execute"
    )
    assert code == 1 and "inactive" in err
    assert committed(broker, group) == {0: 4, 1: 2}

    consumer.close()  # the group is Empty now
    code, out, err = run("consumer-groups", "--describe", "--group", group)
    assert code == 0 and f"Consumer group '{group}' has no active members." in err
    assert [r[:9] for r in rows(out)] == [
        [group, topic, "0", "4", "10", "6", "-", "-", "-"],
        [group, topic, "1", "2", "10", "8", "-", "-", "-"],
    ]

    def plan(*args: str) -> tuple[list[list[str]], str]:
        code, out, err = run("consumer-groups", "--reset-offsets", "--group", group, *args)
        assert code == 0, err
        assert out.splitlines()[1].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
        return rows(out), err

    def new_offsets(*args: str) -> list[tuple[int, int]]:
        found, _ = plan(*args)
        assert all(r[:2] == [group, topic] for r in found)
        return [(int(r[2]), int(r[3])) for r in found]

    assert new_offsets("--all-topics", "--to-earliest") == [(0, 0), (1, 0)]
    assert new_offsets("--all-topics", "--to-earliest", "--dry-run") == [(0, 0), (1, 0)]
    assert new_offsets("--topic", topic, "--to-latest") == [(0, 10), (1, 10), (2, 10)]
    assert new_offsets("--topic", f"{topic}:0,2", "--to-offset", "7") == [(0, 7), (2, 7)]
    assert new_offsets("--topic", f"{topic}:1", "--shift-by", "3") == [(1, 5)]
    found, err = plan("--all-topics", "--shift-by", "-3")
    assert [(int(r[2]), int(r[3])) for r in found] == [(0, 1), (1, 0)]  # 2 - 3 is below the log start: 0
    assert f"New offset (-1) is lower than earliest offset for topic partition {topic}-1." in err
    found, err = plan("--topic", f"{topic}:0", "--to-offset", "99")
    assert [r[3] for r in found] == ["10"] and "Value will be set to 10." in err
    at = datetime.fromtimestamp((base_ms + 5500) / 1000, UTC).isoformat(timespec="milliseconds")
    assert new_offsets("--topic", topic, "--to-datetime", at) == [(0, 6), (1, 6), (2, 6)]
    code, out, _ = run("consumer-groups", "--reset-offsets", "--group", group, "--topic", f"{topic}:2",
                       "--to-datetime", "2099-01-01T00:00:00.000Z")  # fmt: skip
    assert code == 0 and "Partition 2 from topic ops-orders is empty. Falling back to latest known offset." in out
    assert rows(out)[-1] == [group, topic, "2", "10"]
    code, _, err = run("consumer-groups", "--reset-offsets", "--group", group, "--topic", topic, "--shift-by", "1")
    assert code == 1 and f"Cannot shift offset for partition {topic}-2 since there is no current committed" in err
    code, _, err = run("consumer-groups", "--reset-offsets", "--group", group, "--topic", f"{topic}:5", "--to-latest")
    assert code == 1 and f'The partitions "{topic}-5" do not exist' in err
    assert committed(broker, group) == {0: 4, 1: 2}  # dry runs change nothing

    assert new_offsets("--topic", topic, "--to-offset", "3", "--execute") == [(0, 3), (1, 3), (2, 3)]
    assert committed(broker, group) == {0: 3, 1: 3, 2: 3}
    code, out, _ = run("consumer-groups", "--describe", "--group", group)
    assert [r[3:6] for r in rows(out)] == [["3", "10", "7"]] * 3

    # delete offsets, then the group
    code, out, _ = run("consumer-groups", "--delete-offsets", "--group", group, "--topic", f"{topic}:1")
    assert code == 0
    assert out.startswith(f"Request succeeded for deleting offsets from group {group}.\n")
    assert rows(out.split("\n", 1)[1]) == [[topic, "1", "Successful"]]
    assert committed(broker, group) == {0: 3, 2: 3}
    code, out, _ = run("consumer-groups", "--delete", "--group", group)
    assert code == 0 and out == f"Deletion of requested consumer groups ('{group}') was successful.\n"
    code, out, _ = run("consumer-groups", "--list")
    assert group not in out.splitlines()
    code, _, err = run("consumer-groups", "--describe", "--group", group)
    assert code == 1 and f"Consumer group '{group}' does not exist." in err


def test_offsets_of_a_subscribed_topic_are_not_deleted(broker: BrokerProcess, run: Run) -> None:
    topic, group = "ops-live", "ops-live-readers"
    create_topic(broker, topic, 1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    try:
        code, out, err = run("consumer-groups", "--delete-offsets", "--group", group, "--topic", topic)
        assert code == 1 and "Encountered some partition-level error" in err
        assert out.splitlines()[-1].split(maxsplit=2) == [
            topic,
            "0",
            "Error: The consumer group is actively subscribed to the topic.",
        ]
        code, out, err = run("consumer-groups", "--delete", "--group", group)
        assert code == 1 and f"* Group '{group}' could not be deleted due to:" in out
    finally:
        consumer.close()


def test_bad_usage_is_one_line(run: Run) -> None:
    code, _, err = run("consumer-groups", "--list", "--state", "Sleeping")
    assert code == 2 and "Invalid state list 'Sleeping'. Valid states are:" in err
    code, _, err = run("consumer-groups", "--reset-offsets", "--group", "g", "--all-topics")
    assert code == 2 and "--reset-offsets needs one of --to-earliest" in err
    code, _, err = run("consumer-groups", "--describe")
    assert code == 2 and err.count("\n") == 1


# --- configs -----------------------------------------------------------------------------------------------------


def test_topic_and_broker_configs(broker: BrokerProcess, run: Run) -> None:
    topic = "ops-configured"
    create_topic(broker, topic, 1)
    code, out, _ = run("configs", "--describe", "--entity-type", "topics", "--entity-name", topic)
    assert code == 0 and out == f"Dynamic configs for topic {topic} are:\n"

    code, out, _ = run("configs", "--alter", "--entity-type", "topics", "--entity-name", topic,
                       "--add-config", "retention.ms=3600000,cleanup.policy=[compact,delete]")  # fmt: skip
    assert code == 0 and out == f"Completed updating config for topic {topic}.\n"
    code, out, _ = run("configs", "--describe", "--entity-type", "topics", "--entity-name", topic)
    assert out.splitlines() == [
        f"Dynamic configs for topic {topic} are:",
        "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,delete, "
        "DEFAULT_CONFIG:log.cleanup.policy=delete}",
        "  retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000}",
    ]
    code, out, _ = run("configs", "--describe", "--entity-type", "topics", "--entity-name", topic, "--all")
    assert out.startswith(f"All configs for topic {topic} are:\n")
    assert "\n  segment.bytes=" in out and "DEFAULT_CONFIG:log.segment.bytes=" in out

    code, out, _ = run("configs", "--alter", "--entity-type", "topics", "--entity-name", topic,
                       "--delete-config", "cleanup.policy")  # fmt: skip
    assert code == 0
    code, out, _ = run("configs", "--describe", "--entity-type", "topics", "--entity-name", topic)
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["retention.ms=3600000"]
    code, _, err = run("configs", "--alter", "--entity-type", "topics", "--entity-name", topic,
                       "--delete-config", "cleanup.policy")  # fmt: skip
    assert code == 1 and err == "tidelog configs: error: Invalid config(s): cleanup.policy\n"
    code, _, err = run("configs", "--alter", "--entity-type", "topics", "--entity-name", topic,
                       "--add-config", "retention.ms=soon")  # fmt: skip
    assert code == 1 and "INVALID_CONFIG" in err

    # a broker's own config, and the cluster's default, each with its source
    plain = "ops-unconfigured"
    create_topic(broker, plain, 1)
    code, out, _ = run("configs", "--alter", "--entity-type", "brokers", "--entity-default",
                       "--add-config", "log.retention.ms=9000000")  # fmt: skip
    assert code == 0 and out == "Completed updating default config for brokers in the cluster.\n"
    code, out, _ = run("configs", "--alter", "--entity-type", "brokers", "--entity-name", "1",
                       "--add-config", "log.retention.ms=7200000")  # fmt: skip
    assert code == 0 and out == "Completed updating config for broker 1.\n"
    try:
        code, out, _ = run("configs", "--describe", "--entity-type", "brokers")
        assert code == 0
        assert out.splitlines() == [
            "Dynamic configs for broker 1 are:",
            "  log.retention.ms=7200000 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.retention.ms=7200000, "
            "DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=9000000, STATIC_BROKER_CONFIG:log.retention.hours=168, "
            "DEFAULT_CONFIG:log.retention.hours=168}",
            "Default configs for brokers in the cluster are:",
            "  log.retention.ms=9000000 sensitive=false "
            "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=9000000}",
        ]
        # a topic without its own retention.ms takes this broker's log.retention.ms, with its synonyms
        assert config_line(run, "topics", plain, "retention.ms") == (
            "  retention.ms=7200000 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.retention.ms=7200000, "
            "DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=9000000, STATIC_BROKER_CONFIG:log.retention.hours=168, "
            "DEFAULT_CONFIG:log.retention.hours=168}"
        )
    finally:
        run(
            "configs",
            "--alter",
            "--entity-type",
            "brokers",
            "--entity-name",
            "1",
            "--delete-config",
            "log.retention.ms",
        )
        run("configs", "--alter", "--entity-type", "brokers", "--entity-default", "--delete-config", "log.retention.ms")
    code, out, _ = run("configs", "--describe", "--entity-type", "brokers", "--entity-name", "1")
    assert out == "Dynamic configs for broker 1 are:\n"
    code, _, err = run("configs", "--describe", "--entity-type", "brokers", "--entity-name", "one")
    assert code == 2 and "must be a valid integer broker id" in err


def config_line(run: Run, entity_type: str, name: str, key: str) -> str:
    """The line of `key` in `--describe --all` of one topic or broker."""
    code, out, err = run("configs", "--describe", "--entity-type", entity_type, "--entity-name", name, "--all")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith(f"  {key}=")]
    return line


def test_retention_ms_synonyms_as_kafka_lists_them(broker: BrokerProcess, run: Run) -> None:
    """Kafka's ConfigHelper.configSynonyms lists a topic key's broker synonyms (log.retention.ms, .minutes, .hours)
    from the first entry for log.retention.ms itself: with only log.retention.hours set (statically here, as in
    Kafka's server.properties, and by default) a topic's retention.ms has no synonyms and the source
    DEFAULT_CONFIG; the hours key lists its own static and default values."""
    create_topic(broker, "ops-retention", 1)
    assert config_line(run, "topics", "ops-retention", "retention.ms") == (
        "  retention.ms=604800000 sensitive=false synonyms={}"
    )
    assert config_line(run, "brokers", "1", "log.retention.ms") == "  log.retention.ms=null sensitive=false synonyms={}"
    assert config_line(run, "brokers", "1", "log.retention.hours") == (
        "  log.retention.hours=168 sensitive=false "
        "synonyms={STATIC_BROKER_CONFIG:log.retention.hours=168, DEFAULT_CONFIG:log.retention.hours=168}"
    )


# --- users and clients: quotas and SCRAM credentials --------------------------------------------------------------


def quota_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("Quota configs for ")]


def test_user_and_client_quotas(run: Run) -> None:
    def alter(*args: str) -> str:
        code, out, err = run("configs", "--alter", *args)
        assert code == 0, err
        return out

    def describe(*args: str) -> list[str]:
        code, out, err = run("configs", "--describe", *args)
        assert code == 0, err
        return quota_lines(out)

    user, client = (
        ["--entity-type", "users", "--entity-name", "alice"],
        ["--entity-type", "clients", "--entity-name", "app"],
    )
    default_user = ["--entity-type", "users", "--entity-default"]
    default_client = ["--entity-type", "clients", "--entity-default"]
    assert alter(*user, "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048") == (
        "Completed updating config for user alice.\n"
    )
    try:  # the defaults apply to every client of the module's broker: large, and removed at the end
        assert alter(*default_user, "--add-config", "producer_byte_rate=20000000") == (
            "Completed updating default config for users in the cluster.\n"
        )
        assert alter(*client, "--add-config", "request_percentage=50") == "Completed updating config for client app.\n"
        assert alter(*default_client, "--add-config", "consumer_byte_rate=30000000") == (
            "Completed updating default config for clients in the cluster.\n"
        )
        assert alter(*user, *client, "--add-config", "producer_byte_rate=512") == (
            "Completed updating config for user alice.\n"
        )
        assert alter(*default_user, *default_client, "--add-config", "producer_byte_rate=40000000") == (
            "Completed updating default config for users in the cluster.\n"
        )

        assert describe("--entity-type", "users") == [
            "Quota configs for the default user-principal are producer_byte_rate=2.0E7",
            "Quota configs for user-principal 'alice' are consumer_byte_rate=2048.0, producer_byte_rate=1024.0",
        ]
        assert describe(*user) == [
            "Quota configs for user-principal 'alice' are consumer_byte_rate=2048.0, producer_byte_rate=1024.0"
        ]
        assert describe(*default_user) == ["Quota configs for the default user-principal are producer_byte_rate=2.0E7"]
        assert describe("--entity-type", "clients") == [
            "Quota configs for client-id 'app' are request_percentage=50.0",
            "Quota configs for the default client-id are consumer_byte_rate=3.0E7",
        ]
        assert describe(*default_client) == ["Quota configs for the default client-id are consumer_byte_rate=3.0E7"]
        assert describe("--entity-type", "users", "--entity-type", "clients") == [
            "Quota configs for the default user-principal, the default client-id are producer_byte_rate=4.0E7",
            "Quota configs for user-principal 'alice', client-id 'app' are producer_byte_rate=512.0",
        ]
        assert describe(*user, *client) == [
            "Quota configs for user-principal 'alice', client-id 'app' are producer_byte_rate=512.0"
        ]
        assert describe(*user, "--entity-type", "clients") == [
            "Quota configs for user-principal 'alice', client-id 'app' are producer_byte_rate=512.0"
        ]

        # --delete-config removes one key; deleting a key that is not set is refused
        assert alter(*user, "--delete-config", "consumer_byte_rate") == "Completed updating config for user alice.\n"
        assert describe(*user) == ["Quota configs for user-principal 'alice' are producer_byte_rate=1024.0"]
        code, _, err = run("configs", "--alter", *user, "--delete-config", "consumer_byte_rate")
        assert code == 1 and err == "tidelog configs: error: Invalid config(s): consumer_byte_rate\n"
        alter(*user, *client, "--delete-config", "producer_byte_rate")
        assert describe(*user, *client) == []
        code, _, err = run("configs", "--alter", *client, "--add-config", "SCRAM-SHA-256=[password=x]")
        assert code == 2 and "Only quota configs can be changed for 'clients'" in err
        code, _, err = run("configs", "--alter", *user, "--add-config", "producer_byte_rate=fast")
        assert code == 2 and "Cannot parse quota configuration value for producer_byte_rate: fast" in err
    finally:
        for entity in (user, client, default_user, default_client, [*default_user, *default_client]):
            code, out, _ = run("configs", "--describe", *entity)
            for line in quota_lines(out):
                keys = ",".join(item.split("=")[0] for item in line.split(" are ")[1].split(", "))
                alter(*entity, "--delete-config", keys)
    assert describe("--entity-type", "users") == [] and describe("--entity-type", "clients") == []


def scram_login_errors(broker: BrokerProcess, user: str, password: str) -> list[KafkaError]:
    """Log in as `user` with SCRAM-SHA-256 on the SASL_PLAINTEXT listener (a librdkafka client): the errors until
    the cluster's metadata arrives or authentication fails."""
    errors: list[KafkaError] = []
    client = Producer(
        {
            "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": password,
            "error_cb": errors.append,
        }
    )
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            client.list_topics(timeout=0.5)
            return errors
        except KafkaException:
            client.poll(0.1)  # serves error_cb
            if any(e.code() == KafkaError._AUTHENTICATION for e in errors):
                return errors
    raise AssertionError(f"neither logged in nor refused within {TIMEOUT_S} s: {errors}")


def test_scram_credentials(broker: BrokerProcess, run: Run) -> None:
    bob = ["--entity-type", "users", "--entity-name", "bob"]
    code, out, err = run("configs", "--alter", *bob, "--add-config", "SCRAM-SHA-256=[iterations=8192,password=secret]")
    assert code == 0 and out == "Completed updating config for user bob.\n", err
    code, out, _ = run("configs", "--describe", *bob)
    assert code == 0 and out == "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-256=iterations=8192\n"
    code, out, _ = run("configs", "--describe", "--entity-type", "users")
    assert "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-256=iterations=8192\n" in out

    assert scram_login_errors(broker, "bob", "secret") == []  # bob logs in with the tool's salted password
    wrong = scram_login_errors(broker, "bob", "not-his")
    assert any(e.code() == KafkaError._AUTHENTICATION for e in wrong), wrong

    code, out, err = run("configs", "--alter", *bob, "--delete-config", "SCRAM-SHA-256")
    assert code == 0 and out == "Completed updating config for user bob.\n", err
    refused = scram_login_errors(broker, "bob", "secret")  # a new login fails
    assert any(e.code() == KafkaError._AUTHENTICATION for e in refused), refused

    # a user without credentials: Kafka's line, the Java exception named as kafka-configs.sh prints it
    code, out, _ = run("configs", "--describe", *bob)
    assert code == 0 and out == (
        "Error retrieving SCRAM credential configs for user-principal 'bob': ExecutionException: "
        "org.apache.kafka.common.errors.ResourceNotFoundException: "
        "Attempt to describe a user credential that does not exist: bob\n"
    )
    code, _, err = run("configs", "--alter", *bob, "--delete-config", "SCRAM-SHA-256")
    assert code == 1 and err == (
        "tidelog configs: error: user bob: RESOURCE_NOT_FOUND: "
        "Attempt to delete a user credential that does not exist\n"
    )
    code, _, err = run("configs", "--alter", *bob, "--add-config", "SCRAM-SHA-256=[iterations=100,password=x]")
    assert code == 2 and "Iterations 100 is less than the minimum 4096 required for SCRAM-SHA-256" in err
    code, _, err = run("configs", "--alter", "--entity-type", "users", "--entity-default",
                       "--add-config", "SCRAM-SHA-256=[password=x]")  # fmt: skip
    assert code == 2 and "The use of --entity-default is not allowed with User SCRAM Credentials" in err


# --- perf --------------------------------------------------------------------------------------------------------

PRODUCE_SUMMARY = re.compile(
    r"20000 records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, ([\d.]+) ms max "
    r"latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\."
)


def test_perf_produce_then_consume(broker: BrokerProcess, run: Run) -> None:
    topic = "ops-perf"
    create_topic(broker, topic, 2)
    code, out, err = run("perf", "produce", "--topic", topic, "--num-records", "20000", "--record-size", "100",
                         "--throughput", "-1", "--producer-props", "linger.ms=5", "acks=1")  # fmt: skip
    assert code == 0, err
    match = PRODUCE_SUMMARY.fullmatch(out.splitlines()[-1])
    assert match, out
    rate, mb, avg, worst, p50, p95, p99, p999 = (float(g) for g in match.groups())
    assert rate > 500 and mb == pytest.approx(rate * 100 / 2**20, rel=0.02, abs=0.01)
    assert 0 < avg <= worst < 30_000
    assert p50 <= p95 <= p99 <= p999 <= worst

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ops-perf-count"})
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S) for p in range(2)]
    consumer.close()
    assert sum(high - low for low, high in ends) == 20000

    code, out, err = run("perf", "consume", "--topic", topic, "--messages", "20000", "--group", "ops-perf-reader")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.startswith("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec")
    fields = row.split(", ")
    assert len(fields) == 10
    assert float(fields[2]) == pytest.approx(20000 * 100 / 2**20, abs=1e-4)
    assert int(fields[4]) == 20000 and float(fields[5]) > 0
    assert int(fields[6]) >= 0 and int(fields[7]) >= 0

    code, out, _ = run("perf", "consume", "--topic", topic, "--messages", "20001", "--timeout", "1000",
                       "--hide-header")  # fmt: skip
    assert code == 0 and out.startswith("WARNING: Exiting before consuming the expected number of messages")
    assert out.splitlines()[-1].split(", ")[4] == "20000"
