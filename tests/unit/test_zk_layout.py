"""The znodes of a cluster in Kafka's ZooKeeper-mode layout (broker/zk_layout.py): the exact JSON Kafka 3.x writes
(kafka.zk.ZkData), decoding back, and MalformedZnodeError naming the path for data that is not Kafka's."""

from __future__ import annotations

import json

import pytest

from tidelog.broker import zk_layout as zk
from tidelog.kafka_uuid import new_kafka_uuid


def test_paths_are_kafkas() -> None:
    assert zk.topic_path("orders") == "/brokers/topics/orders"
    assert zk.topic_partitions_path("orders") == "/brokers/topics/orders/partitions"
    assert zk.partition_path("orders", 3) == "/brokers/topics/orders/partitions/3"
    assert zk.partition_state_path("orders", 3) == "/brokers/topics/orders/partitions/3/state"
    assert zk.topic_config_path("orders") == "/config/topics/orders"
    assert zk.delete_topic_path("orders") == "/admin/delete_topics/orders"
    assert {zk.TOPICS_PATH, zk.CONFIG_TOPICS_PATH, zk.DELETE_TOPICS_PATH} <= set(zk.PERSISTENT_PATHS)


def test_topic_assignment_json() -> None:
    topic_id = new_kafka_uuid()
    assignment = zk.TopicAssignment("orders", topic_id, {1: (2, 3, 1), 0: (1, 2, 3)})
    data = assignment.encode()
    assert data == (
        b'{"version":3,"partitions":{"0":[1,2,3],"1":[2,3,1]},"topic_id":"' + topic_id.encode() + b'",'
        b'"adding_replicas":{},"removing_replicas":{}}'
    )
    decoded = zk.TopicAssignment.decode("orders", data)
    assert decoded == assignment
    assert (decoded.partition_count, decoded.replication_factor) == (2, 3)


def test_topic_assignment_as_older_kafkas_wrote_it() -> None:
    """Version 1 (no topic id, no adding/removing replicas) still decodes."""
    decoded = zk.TopicAssignment.decode("t", b'{"version":1,"partitions":{"0":[5],"1":[6]}}')
    assert decoded.topic_id is None and decoded.partitions == {0: (5,), 1: (6,)}
    assert decoded.adding_replicas == {} and decoded.removing_replicas == {}
    reassigning = zk.TopicAssignment.decode(
        "t", b'{"version":2,"partitions":{"0":[1,2]},"adding_replicas":{"0":[2]},"removing_replicas":{}}'
    )
    assert reassigning.adding_replicas == {0: (2,)}


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[1]",
        b'{"version":4,"partitions":{"0":[1]}}',
        b'{"version":3,"partitions":{"x":[1]}}',
        b'{"version":3,"partitions":{"0":[1],"2":[1]}}',
        b'{"version":3,"partitions":{"0":["1"]}}',
        b'{"version":3,"partitions":{"0":[1]},"topic_id":"nope"}',
    ],
)
def test_a_topic_znode_that_is_not_kafkas_is_refused_naming_it(data: bytes) -> None:
    with pytest.raises(zk.MalformedZnodeError, match=r"znode /brokers/topics/t"):
        zk.TopicAssignment.decode("t", data)


def test_partition_state_json() -> None:
    state = zk.PartitionState(leader=2, leader_epoch=5, isr=(2, 3), controller_epoch=7)
    data = state.encode()
    assert data == b'{"controller_epoch":7,"leader":2,"version":1,"leader_epoch":5,"isr":[2,3]}'
    assert json.loads(data) == {"controller_epoch": 7, "leader": 2, "version": 1, "leader_epoch": 5, "isr": [2, 3]}
    assert zk.PartitionState.decode("t", 0, data) == state
    offline = zk.PartitionState(zk.NO_LEADER, 6, (3,), 8)
    assert json.loads(offline.encode())["leader"] == -1


@pytest.mark.parametrize(
    "data",
    [
        b"{}",
        b'{"leader":"1","leader_epoch":0,"controller_epoch":1,"isr":[1]}',
        b'{"leader":1,"leader_epoch":0,"controller_epoch":1,"isr":"1"}',
    ],
)
def test_a_partition_state_that_is_not_kafkas_is_refused_naming_it(data: bytes) -> None:
    with pytest.raises(zk.MalformedZnodeError, match=r"znode /brokers/topics/t/partitions/4/state"):
        zk.PartitionState.decode("t", 4, data)


def test_topic_config_json() -> None:
    data = zk.encode_topic_config({"retention.ms": 1000, "cleanup.policy": "compact"})
    assert data == b'{"version":1,"config":{"cleanup.policy":"compact","retention.ms":"1000"}}'
    assert zk.decode_topic_config("t", data) == {"cleanup.policy": "compact", "retention.ms": "1000"}
    assert zk.encode_topic_config({}) == b'{"version":1,"config":{}}'
    assert zk.decode_topic_config("t", b"") == {} and zk.decode_topic_config("t", None) == {}
    with pytest.raises(zk.MalformedZnodeError, match=r"znode /config/topics/t"):
        zk.decode_topic_config("t", b'{"version":1,"config":{"retention.ms":1000}}')


def test_the_first_slices_znodes() -> None:
    registration = zk.BrokerRegistration(
        1, (zk.Endpoint("PLAINTEXT", "h", 9092, "PLAINTEXT"),), rack="r1", timestamp_ms=12
    )
    assert json.loads(registration.encode()) == {
        "features": {},
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
        "endpoints": ["PLAINTEXT://h:9092"],
        "jmx_port": -1,
        "port": 9092,
        "host": "h",
        "version": 5,
        "timestamp": "12",
        "rack": "r1",
    }
    assert zk.BrokerRegistration.decode(1, registration.encode()) == registration
    assert zk.encode_controller(2, 5) == b'{"version":1,"brokerid":2,"timestamp":"5"}'
    assert zk.decode_controller(zk.encode_controller(2, 5)) == 2
    assert zk.decode_controller_epoch(zk.encode_controller_epoch(9)) == 9
    with pytest.raises(zk.MalformedZnodeError, match="/controller_epoch"):
        zk.decode_controller_epoch(b"x")
