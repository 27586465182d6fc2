"""Topics replicated over a cluster of three `tidelog serve` brokers and a real ZooKeeper: creation through one
broker in Kafka's znode layout, every broker's replicas on disk under the cluster's topic id, Metadata that agrees
from every broker, leaders that alone serve produce and fetch (librdkafka), a consumer group coordinated by the
leader of its `__consumer_offsets` partition, the controller moving leadership when a broker is killed (kill -9)
and back to an offline partition's last in-sync replica when it returns, and deletion across the brokers.

Followers copy their leaders (test_replication.py covers replication itself): after the failover the new leaders
serve what the old ones had, and go on from there."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

import pytest
from cluster_checks import controller, controller_epoch, registered, wait_for
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kazoo.client import KazooClient

import kafka_wire
from broker_process import BrokerProcess
from tidelog.codec.group_records import partition_for_group
from tidelog.codec.record_set import iter_batches
from zookeeper_process import SESSION_TIMEOUT_MS, ClusterBroker

FAILOVER_S = SESSION_TIMEOUT_MS / 1000 + 20  # ZooKeeper notices the death, then the controller acts; busy cores
NOT_LEADER_OR_FOLLOWER = 6
LEADER_NOT_AVAILABLE = 5
FENCED_LEADER_EPOCH = 74


def state(zk: KazooClient, topic: str, partition: int) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


def stamped_epochs(broker: BrokerProcess, topic: str, partition: int) -> set[int]:
    """The partitionLeaderEpoch of every batch in the broker's replica of `topic`-`partition`."""
    epochs = set()
    for segment in sorted((broker.log_dir / f"{topic}-{partition}").glob("*.log")):
        epochs |= {info.partition_leader_epoch for info in iter_batches(segment.read_bytes())}
    return epochs


def replicas_on_disk(broker: BrokerProcess, topic: str) -> dict[int, str]:
    """partition -> its partition.metadata, for each `<topic>-<p>` directory in the broker's log dir."""
    found = {}
    for path in broker.log_dir.glob(f"{topic}-*"):
        match = re.fullmatch(rf"{re.escape(topic)}-(\d+)", path.name)
        if match and path.is_dir():
            metadata = path / "partition.metadata"
            found[int(match[1])] = metadata.read_text() if metadata.exists() else ""
    return found


def consume(bootstrap: str, topic: str, partitions: range, count: int) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[str] = []
        deadline = time.monotonic() + 60
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value().decode())
        return values
    finally:
        consumer.close()


def produce(producer: Producer, topic: str, values: dict[int, list[str]]) -> None:
    failures: list[Any] = []
    for partition, texts in values.items():
        for text in texts:
            producer.produce(
                topic, text.encode(), partition=partition, on_delivery=lambda err, _msg: err and failures.append(err)
            )
    assert producer.flush(90) == 0, "messages left undelivered"
    assert not failures, failures


def committed(bootstrap: str, group: str, topic: str, partitions: range) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {
            tp.partition: tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in partitions], 30)
        }
    finally:
        consumer.close()


def read_in_group(bootstrap: str, group: str, topic: str, count: int) -> list[str]:
    """Subscribe as a member of `group`, read `count` records, commit their offsets."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        values: list[str] = []
        deadline = time.monotonic() + 60
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value().decode())
        consumer.commit(asynchronous=False)
        return values
    finally:
        consumer.close()


def test_a_topic_replicated_over_three_brokers(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    settings = {"offsets.topic.num.partitions": 3, "group.initial.rebalance.delay.ms": 0}
    brokers = cluster_broker.all((1, 2, 3), settings)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    victim = wait_for(lambda: controller(zk_client), what="a controller")
    assert isinstance(victim, int)
    epoch = controller_epoch(zk_client)
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})

    # more replicas than live brokers: refused, nothing written
    refused = admin.create_topics([NewTopic("wide", 1, 4)], operation_timeout=20)["wide"]
    with pytest.raises(KafkaException) as raised:
        refused.result(timeout=30)
    assert raised.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "Replication factor: 4 larger than available brokers: 3" in raised.value.args[0].str()
    assert not zk_client.exists("/brokers/topics/wide")

    # six partitions on all three brokers through broker 1; one partition placed by hand on the controller
    created = admin.create_topics(
        [
            NewTopic("orders", 6, 3, config={"retention.ms": "3600000"}),
            NewTopic("solo", 1, replica_assignment=[[victim]]),
        ],
        operation_timeout=30,
    )
    for future in created.values():
        future.result(timeout=60)

    # the znodes, as Kafka 3.x writes them
    assignment = json.loads(zk_client.get("/brokers/topics/orders")[0])
    assert list(assignment) == ["version", "partitions", "topic_id", "adding_replicas", "removing_replicas"]
    assert (assignment["version"], assignment["adding_replicas"], assignment["removing_replicas"]) == (3, {}, {})
    replicas = {int(p): r for p, r in assignment["partitions"].items()}
    assert sorted(replicas) == list(range(6))
    assert all(sorted(r) == [1, 2, 3] for r in replicas.values())
    assert Counter(r[0] for r in replicas.values()) == {1: 2, 2: 2, 3: 2}  # preferred leaders spread evenly
    topic_id = assignment["topic_id"]
    assert json.loads(zk_client.get("/config/topics/orders")[0]) == {
        "version": 1,
        "config": {"retention.ms": "3600000"},
    }
    for p in range(6):
        assert state(zk_client, "orders", p) == {
            "controller_epoch": epoch,
            "leader": replicas[p][0],
            "version": 1,
            "leader_epoch": 0,
            "isr": replicas[p],
        }
    assert json.loads(zk_client.get("/brokers/topics/solo")[0])["partitions"] == {"0": [victim]}

    # every broker holds its replicas under the cluster's topic id
    for broker_id, broker in brokers.items():
        wait_for(lambda b=broker: sorted(replicas_on_disk(b, "orders")) == list(range(6)), what="replicas on disk")
        assert all(f"topic_id: {topic_id}" in text for text in replicas_on_disk(broker, "orders").values())
        assert sorted(replicas_on_disk(broker, "solo")) == ([0] if broker_id == victim else [])
        assert not list(broker.log_dir.glob("*-delete")), "a replica was deleted since the topic was created"

    # Metadata agrees from every broker
    expected = {p: (0, replicas[p][0], 0, [1, 2, 3], [1, 2, 3], []) for p in range(6)}
    for broker in brokers.values():
        wait_for(lambda b=broker: kafka_wire.partitions(b.bootstrap, "orders") == expected, what="Metadata")
        listed = {t.name: t for t in kafka_wire.metadata(broker.bootstrap).topics}
        assert sorted(listed) == ["orders", "solo"]  # __consumer_offsets comes with the first group

    # a topic a client's Metadata asks for is auto-created (default.replication.factor, 1): LEADER_NOT_AVAILABLE
    # until the controller has chosen its leader
    [auto] = kafka_wire.metadata(brokers[3].bootstrap, ["auto"], auto_create=True).topics
    assert auto.error_code == LEADER_NOT_AVAILABLE
    wait_for(lambda: kafka_wire.partitions(brokers[1].bootstrap, "auto").get(0, (-1,))[0] == 0, what="its leader")
    assert len(json.loads(zk_client.get("/brokers/topics/auto")[0])["partitions"]["0"]) == 1

    # producing to every partition and reading back: only leaders serve
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5})
    first = {p: [f"first-{p}-{i}" for i in range(5)] for p in range(6)}
    produce(producer, "orders", first)
    assert sorted(consume(bootstrap, "orders", range(6), 30)) == sorted(v for vs in first.values() for v in vs)
    for p in range(6):
        for follower in replicas[p][1:]:
            assert kafka_wire.produce_error(brokers[follower].bootstrap, "orders", p) == NOT_LEADER_OR_FOLLOWER
            assert kafka_wire.fetch_error(brokers[follower].bootstrap, "orders", p) == NOT_LEADER_OR_FOLLOWER
            assert kafka_wire.list_offsets_error(brokers[follower].bootstrap, "orders", p) == NOT_LEADER_OR_FOLLOWER
        assert kafka_wire.list_offsets_error(brokers[replicas[p][0]].bootstrap, "orders", p) == 0

    # a consumer group: the first FindCoordinator creates __consumer_offsets over the three brokers; every broker
    # then names the same coordinator, the leader of the group's partition, which keeps the committed offsets
    wait_for(lambda: kafka_wire.find_coordinator(brokers[2].bootstrap, "readers")[0] == 0, what="a coordinator")
    offsets_topic = json.loads(zk_client.get("/brokers/topics/__consumer_offsets")[0])
    assert len(offsets_topic["partitions"]) == 3 and all(len(r) == 3 for r in offsets_topic["partitions"].values())
    assert json.loads(zk_client.get("/config/topics/__consumer_offsets")[0])["config"]["cleanup.policy"] == "compact"
    group_partition = partition_for_group("readers", 3)
    coordinator = state(zk_client, "__consumer_offsets", group_partition)["leader"]
    for broker in brokers.values():
        assert kafka_wire.find_coordinator(broker.bootstrap, "readers") == (0, coordinator)
    assert len(read_in_group(bootstrap, "readers", "orders", 30)) == 30
    assert committed(brokers[3].bootstrap, "readers", "orders", range(6)) == {p: 5 for p in range(6)}

    # kill -9 the controller, which leads two partitions: another broker is elected, and it moves their leadership
    # to the first live ISR member, each partition's leader epoch one up
    led = [p for p in range(6) if replicas[p][0] == victim]
    before = {p: state(zk_client, "orders", p) for p in range(6)}
    survivors = {b: broker for b, broker in brokers.items() if b != victim}
    brokers[victim].kill()

    def moved() -> bool:
        return all(victim not in state(zk_client, "orders", p)["isr"] for p in range(6)) and all(
            state(zk_client, "orders", p)["leader"] not in (victim, -1) for p in led
        )

    wait_for(moved, timeout_s=FAILOVER_S, what="leadership to move")
    new_epoch = controller_epoch(zk_client)
    assert new_epoch == epoch + 1 and controller(zk_client) in survivors
    for p in range(6):
        now = state(zk_client, "orders", p)
        assert now["leader_epoch"] == before[p]["leader_epoch"] + 1
        assert now["controller_epoch"] == new_epoch
        assert now["isr"] == [b for b in before[p]["isr"] if b != victim]
        assert now["leader"] == (next(b for b in replicas[p] if b != victim) if p in led else replicas[p][0])
    # the partition whose only replica died is offline, its last in-sync replica kept for when it comes back
    assert state(zk_client, "solo", 0) == {
        "controller_epoch": new_epoch,
        "leader": -1,
        "version": 1,
        "leader_epoch": 1,
        "isr": [victim],
    }
    for broker in survivors.values():
        shown = {
            p: (0, state(zk_client, "orders", p)["leader"], 1, [1, 2, 3], sorted(set(survivors)), [victim])
            for p in range(6)
        }
        wait_for(lambda b=broker, s=shown: kafka_wire.partitions(b.bootstrap, "orders") == s, what="Metadata")
        assert kafka_wire.partitions(broker.bootstrap, "solo") == {
            0: (LEADER_NOT_AVAILABLE, -1, 1, [victim], [victim], [victim])
        }
    new_leader = state(zk_client, "orders", led[0])["leader"]
    assert (
        kafka_wire.fetch_error(brokers[new_leader].bootstrap, "orders", led[0], leader_epoch=0) == FENCED_LEADER_EPOCH
    )

    # producing goes on, to the new leaders, which hold what their old leader had (they were in its ISR)
    after = {p: [f"after-{p}-{i}" for i in range(5)] for p in range(6)}
    produce(producer, "orders", after)
    survivors_bootstrap = ",".join(b.bootstrap for b in survivors.values())
    read = consume(survivors_bootstrap, "orders", range(6), 60)
    assert sorted(read) == sorted(v for vs in (*first.values(), *after.values()) for v in vs)
    for p in led:  # a new leader stamps its leader epoch into what it appends (partitionLeaderEpoch)
        assert stamped_epochs(brokers[state(zk_client, "orders", p)["leader"]], "orders", p) == {0, 1}

    # the killed broker comes back: it registers again, leads its offline partition again, keeps its replicas
    brokers[victim].restart()  # on its old port if it is still free
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="the broker registering again")
    wait_for(lambda: state(zk_client, "solo", 0)["leader"] == victim, timeout_s=FAILOVER_S, what="solo's leader")
    assert state(zk_client, "solo", 0)["leader_epoch"] == 2 and state(zk_client, "solo", 0)["isr"] == [victim]
    assert sorted(replicas_on_disk(brokers[victim], "orders")) == list(range(6))
    agreed = kafka_wire.partitions(survivors[next(iter(survivors))].bootstrap, "orders")
    for broker in brokers.values():
        wait_for(
            lambda b=broker: (
                kafka_wire.partitions(b.bootstrap, "orders") == {p: (*v[:5], []) for p, v in agreed.items()}
            ),
            what="Metadata",
        )
    producer.flush(10)

    # two more partitions, placed over the three brokers as Kafka's addPartitions places them
    admin = AdminClient({"bootstrap.servers": survivors_bootstrap})  # the first one may know only the killed broker
    grown = admin.create_partitions([NewPartitions("orders", 8)], operation_timeout=30)["orders"]
    grown.result(timeout=60)
    added = {int(p): r for p, r in json.loads(zk_client.get("/brokers/topics/orders")[0])["partitions"].items()}
    assert sorted(added) == list(range(8)) and {p: added[p] for p in range(6)} == replicas
    for p in (6, 7):
        assert sorted(added[p]) == [1, 2, 3]
        assert state(zk_client, "orders", p)["leader"] == added[p][0]
    for broker in brokers.values():
        wait_for(lambda b=broker: sorted(replicas_on_disk(b, "orders")) == list(range(8)), what="the new replicas")
        wait_for(lambda b=broker: len(kafka_wire.partitions(b.bootstrap, "orders")) == 8, what="Metadata")

    # deletion through a survivor: the znodes go, and every broker deletes its replicas
    deleting = AdminClient({"bootstrap.servers": brokers[victim].bootstrap})
    for future in deleting.delete_topics(["orders", "solo", "auto"], operation_timeout=30).values():
        future.result(timeout=60)
    for path in (
        "/brokers/topics/orders",
        "/config/topics/orders",
        "/admin/delete_topics/orders",
        "/brokers/topics/solo",
    ):
        assert not zk_client.exists(path), path
    for broker in brokers.values():
        wait_for(
            lambda b=broker: not replicas_on_disk(b, "orders") and not replicas_on_disk(b, "solo"), what="deletion"
        )
        assert [t.name for t in kafka_wire.metadata(broker.bootstrap).topics] == ["__consumer_offsets"]
