"""DescribeLogDirs, DescribeProducers and DescribeCluster through a real `tidelog serve`: kafka-python's
KafkaAdminClient (describe_log_dirs, describe_producers, describe_cluster), confluent-kafka's describe_cluster, and
raw requests for the versions and errors the clients do not show. One broker for the module."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire
from tidelog.protocol.messages import ApiKey

with warnings.catch_warnings():  # kafka-python's import trips importlib.resources deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

TIMEOUT_S = 30.0
UNKNOWN_TOPIC_OR_PARTITION, MISMATCHED_ENDPOINT_TYPE, UNSUPPORTED_ENDPOINT_TYPE = 3, 114, 115


@pytest.fixture(scope="module")
def admin(broker) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for name, partitions in (("dirs-a", 2), ("producers", 1)):
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=TIMEOUT_S)
    return admin


@pytest.fixture(scope="module")
def kp_admin(broker, admin):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    yield client
    client.close()


def produce(broker, topic: str, count: int, **config) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, **config})
    for i in range(count):
        producer.produce(topic, f"value-{i}".encode(), partition=0)
        producer.flush(TIMEOUT_S)  # one batch each: the sequence moves on per record


def log_dirs(broker, topics, version: int):
    body = {"topics": topics}
    return kafka_wire.request(broker.bootstrap, ApiKey.DESCRIBE_LOG_DIRS, version, body)


def test_describe_log_dirs_sizes_each_partition(broker, admin, kp_admin) -> None:
    produce(broker, "dirs-a", 5)
    [result] = log_dirs(broker, [{"topic": "dirs-a", "partitions": [0, 1, 7]}], 4).results
    assert result.error_code == 0 and Path(result.log_dir) == broker.log_dir.resolve()
    [topic] = result.topics
    sizes = {p.partition_index: (p.partition_size, p.offset_lag, p.is_future_key) for p in topic.partitions}
    on_disk = (broker.log_dir / "dirs-a-0" / "00000000000000000000.log").stat().st_size
    assert sizes == {0: (on_disk, 0, False), 1: (0, 0, False)}  # partition 7 does not exist: left out
    assert on_disk > 0 and result.total_bytes >= result.usable_bytes > 0

    every = log_dirs(broker, None, 1).results[0]  # v1: every partition, no disk figures
    assert {"dirs-a", "producers"} <= {t.name for t in every.topics}

    [described] = kp_admin.describe_log_dirs({"dirs-a": [0]})  # kafka-python
    [log_dir] = described["log_dirs"]
    assert described["broker"] == 1 and log_dir["log_dir"] == result.log_dir
    assert [t["name"] for t in log_dir["topics"]] == ["dirs-a"]
    assert log_dir["topics"][0]["partitions"][0]["partition_size"] == on_disk


def test_describe_producers_lists_idempotent_producers(broker, admin, kp_admin) -> None:
    produce(broker, "producers", 3, **{"enable.idempotence": True})
    body = {
        "topics": [{"name": "producers", "partition_indexes": [0, 5]}, {"name": "nowhere", "partition_indexes": [0]}]
    }
    response = kafka_wire.request(broker.bootstrap, ApiKey.DESCRIBE_PRODUCERS, 0, body)
    found, missing = response.topics[0].partitions
    [producer] = found.active_producers
    assert found.error_code == 0 and producer.producer_id >= 0 and producer.producer_epoch == 0
    assert producer.last_sequence == 2 and producer.last_timestamp > 0
    assert producer.coordinator_epoch == -1 and producer.current_txn_start_offset == -1
    assert missing.error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert response.topics[1].partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION

    states = kp_admin.describe_producers([KpTopicPartition("producers", 0)])
    [state] = states[KpTopicPartition("producers", 0)].active_producers
    assert (state.producer_id, state.last_sequence) == (producer.producer_id, 2)


def test_every_engine_describes_producers_and_log_dirs(engine_broker) -> None:
    admin = AdminClient({"bootstrap.servers": engine_broker.bootstrap})
    admin.create_topics([NewTopic("engine-producers", 1, 1)])["engine-producers"].result(timeout=TIMEOUT_S)
    produce(engine_broker, "engine-producers", 2, **{"enable.idempotence": True})
    body = {"topics": [{"name": "engine-producers", "partition_indexes": [0]}]}
    response = kafka_wire.request(engine_broker.bootstrap, ApiKey.DESCRIBE_PRODUCERS, 0, body)
    [producer] = response.topics[0].partitions[0].active_producers
    assert producer.last_sequence == 1 and producer.producer_epoch == 0
    [result] = log_dirs(engine_broker, [{"topic": "engine-producers", "partitions": [0]}], 4).results
    [partition] = result.topics[0].partitions
    assert partition.partition_size > 0 and partition.offset_lag == 0


def test_describe_cluster(broker, admin, kp_admin) -> None:
    cluster = admin.describe_cluster(request_timeout=15, include_authorized_operations=True).result(TIMEOUT_S)
    assert cluster.controller.id == 1 and [n.id for n in cluster.nodes] == [1]
    assert cluster.cluster_id and cluster.authorized_operations
    assert f"{cluster.nodes[0].host}:{cluster.nodes[0].port}" == broker.bootstrap
    kp = kp_admin.describe_cluster()
    assert kp["cluster_id"] == cluster.cluster_id and kp["controller_id"] == 1

    for version in (0, 1):
        body = {"include_cluster_authorized_operations": False, "endpoint_type": 1}
        answer = kafka_wire.request(broker.bootstrap, ApiKey.DESCRIBE_CLUSTER, version, body)
        assert answer.error_code == 0 and answer.cluster_authorized_operations == -(1 << 31)
        assert [b.broker_id for b in answer.brokers] == [1]
    for endpoint_type, code in ((2, MISMATCHED_ENDPOINT_TYPE), (9, UNSUPPORTED_ENDPOINT_TYPE)):
        body = {"include_cluster_authorized_operations": False, "endpoint_type": endpoint_type}
        answer = kafka_wire.request(broker.bootstrap, ApiKey.DESCRIBE_CLUSTER, 1, body)
        assert answer.error_code == code and answer.brokers == ()
