"""Transactions in a cluster of three `tidelog serve` brokers and a real ZooKeeper, with confluent-kafka's
transactional producer and read_committed consumers: `__transaction_state` is created replicated at the first
FindCoordinator and the coordinator is the leader of the id's partition (the others answer NOT_COORDINATOR);
markers reach partitions led by other brokers (WriteTxnMarkers) and replicate, also when a data partition's leader
is killed between produce and commit, and offsets sent to a group coordinated elsewhere commit with the
transaction; a killed coordinator's successor aborts the open transaction and a new producer of the id fences the
old one; the Spark sink's coordinator requests wait while a coordinator has no live leader."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_checks import registered, wait_for
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

import kafka_wire
from broker_process import BrokerProcess
from tidelog.codec.group_records import partition_for_group
from tidelog.protocol.messages import ApiKey
from zookeeper_process import SESSION_TIMEOUT_MS, ClusterBroker

FAILOVER_S = SESSION_TIMEOUT_MS / 1000 + 30  # ZooKeeper notices the death, the controller acts; two busy cores
TXN_TOPIC = "__transaction_state"
NONE, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 0, 15, 16
SETTINGS = {
    "transaction.state.log.num.partitions": 1,
    "offsets.topic.num.partitions": 3,
    "replica.lag.time.max.ms": 4000,
    "group.initial.rebalance.delay.ms": 0,
}


def start_cluster(cluster_broker: ClusterBroker, zk: KazooClient) -> dict[int, BrokerProcess]:
    brokers = cluster_broker.all((1, 2, 3), SETTINGS)
    wait_for(lambda: registered(zk) == [1, 2, 3], what="three registrations")
    return brokers


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic], operation_timeout=30)[name].result(timeout=60)


def state(zk: KazooClient, topic: str, partition: int) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


def transaction_coordinator(bootstrap: str, transactional_id: str) -> tuple[int, int]:
    """(error code, node id) of FindCoordinator v3 with key type TRANSACTION."""
    answer = kafka_wire.request(bootstrap, ApiKey.FIND_COORDINATOR, 3, {"key": transactional_id, "key_type": 1})
    return int(answer.error_code), int(answer.node_id)


def group_led_elsewhere(zk: KazooClient, bootstrap: str, coordinator: int) -> str:
    """A group whose coordinator (the leader of its __consumer_offsets partition) is not the broker `coordinator`."""
    kafka_wire.find_coordinator(bootstrap, "any")  # creates __consumer_offsets
    wait_for(lambda: zk.exists("/brokers/topics/__consumer_offsets/partitions/2/state"), what="__consumer_offsets")
    for name in (f"offsets-{i}" for i in range(20)):
        if state(zk, "__consumer_offsets", partition_for_group(name, 3))["leader"] != coordinator:
            return name
    raise AssertionError("every __consumer_offsets partition is led by the transaction coordinator")


def init_producer_id_error(bootstrap: str, transactional_id: str) -> int:
    body = {"transactional_id": transactional_id, "transaction_timeout": 60_000, "producer_id": -1}
    body["producer_epoch"] = -1
    return int(kafka_wire.request(bootstrap, ApiKey.INIT_PRODUCER_ID, 4, body).error_code)


def producer(bootstrap: str, transactional_id: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5})


def produce(txn: Producer, topic: str, prefix: str, partitions: int, per_partition: int) -> list[str]:
    values = [f"{prefix}-{p}-{i}" for p in range(partitions) for i in range(per_partition)]
    for value in values:
        txn.produce(topic, value.encode(), partition=int(value.split("-")[1]))
    assert txn.flush(60) == 0, "records left undelivered"
    return values


def read_committed(bootstrap: str, topic: str, partitions: int, expected: int) -> list[str]:
    """What a read_committed consumer reads from the start: until `expected` values came, then one more second."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[str] = []
    deadline = time.monotonic() + FAILOVER_S
    settle: float | None = None
    try:
        while time.monotonic() < deadline and (settle is None or time.monotonic() < settle):
            message = consumer.poll(0.3)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            values.append(message.value().decode())
            if len(values) >= expected and settle is None:
                settle = time.monotonic() + 1.0  # anything past what is expected shows up now
    finally:
        consumer.close()
    return values


def files(broker: BrokerProcess, topic: str, partition: int, suffix: str) -> dict[str, bytes]:
    directory = broker.log_dir / f"{topic}-{partition}"
    return {path.name: path.read_bytes() for path in sorted(Path(directory).glob(f"*{suffix}"))}


def replicas_identical(brokers: dict[int, BrokerProcess], topic: str, partition: int) -> bool:
    """Every broker's `.log` and `.txnindex` files of the partition: the same names and bytes."""
    logs = [files(b, topic, partition, ".log") for b in brokers.values()]
    indexes = [files(b, topic, partition, ".txnindex") for b in brokers.values()]
    return all(log == logs[0] for log in logs) and all(index == indexes[0] for index in indexes) and bool(logs[0])


def test_markers_reach_every_leader_and_survive_a_data_leader_kill(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = start_cluster(cluster_broker, zk_client)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "txn-data", 3)
    txn = producer(bootstrap, "cluster-txn")
    txn.init_transactions(60)  # creates __transaction_state (rf 3) and waits for its leader

    assignment = json.loads(zk_client.get(f"/brokers/topics/{TXN_TOPIC}")[0])["partitions"]
    assert len(assignment) == 1 and len(assignment["0"]) == 3  # replication factor min(3, live brokers)
    coordinator = state(zk_client, TXN_TOPIC, 0)["leader"]
    assert {transaction_coordinator(b.bootstrap, "cluster-txn") for b in brokers.values()} == {(NONE, coordinator)}
    others = [broker_id for broker_id in brokers if broker_id != coordinator]
    assert {init_producer_id_error(brokers[other].bootstrap, "cluster-txn") for other in others} == {NOT_COORDINATOR}
    leaders = {p: state(zk_client, "txn-data", p)["leader"] for p in range(3)}
    group = group_led_elsewhere(zk_client, brokers[1].bootstrap, coordinator)
    assert set(leaders.values()) - {coordinator}, "every data partition is led by the coordinator"

    txn.begin_transaction()
    committed = produce(txn, "txn-data", "c1", 3, 20)
    txn.commit_transaction(60)
    txn.begin_transaction()
    aborted = produce(txn, "txn-data", "a2", 3, 20)
    txn.abort_transaction(60)
    txn.begin_transaction()
    committed += produce(txn, "txn-data", "c3", 3, 20)  # acked by all in-sync replicas
    victim_partition = next(p for p, leader in leaders.items() if leader != coordinator)
    victim = leaders[victim_partition]
    brokers[victim].kill()  # SIGKILL between the produce and the commit
    txn.commit_transaction(FAILOVER_S)  # answered once PrepareCommit is replicated; markers follow the new leader
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    txn.begin_transaction()
    committed += produce(txn, "txn-data", "c4", 3, 10)
    offsets = [TopicPartition("txn-data", 0, 42)]  # TxnOffsetCommit to a group coordinator on another broker
    txn.send_offsets_to_transaction(offsets, member.consumer_group_metadata(), 60)
    txn.commit_transaction(60)
    assert [tp.offset for tp in member.committed([TopicPartition("txn-data", 0)], timeout=30)] == [42]
    member.close()
    assert state(zk_client, "txn-data", victim_partition)["leader"] not in (victim, -1)

    survivors = ",".join(b.bootstrap for broker_id, b in brokers.items() if broker_id != victim)
    read = read_committed(survivors, "txn-data", 3, len(committed))
    assert sorted(read) == sorted(committed), "read_committed saw an aborted record, or missed or repeated one"
    assert not set(read) & set(aborted)

    brokers[victim].restart()
    for partition in range(3):
        wait_for(
            lambda p=partition: sorted(state(zk_client, "txn-data", p)["isr"]) == [1, 2, 3],
            timeout_s=FAILOVER_S,
            what=f"the killed broker back in the ISR of txn-data-{partition}",
        )
        wait_for(lambda p=partition: replicas_identical(brokers, "txn-data", p), what=f"identical txn-data-{partition}")
    assert all(files(b, "txn-data", 0, ".txnindex") for b in brokers.values()), "the abort left no .txnindex"


def test_a_killed_coordinator_hands_the_open_transaction_to_the_next_leader(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = start_cluster(cluster_broker, zk_client)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "fenced-data", 2)
    old = producer(bootstrap, "failover-txn")
    old.init_transactions(60)
    old.begin_transaction()
    zombie = produce(old, "fenced-data", "open", 2, 20)
    before = state(zk_client, TXN_TOPIC, 0)
    brokers[before["leader"]].kill()  # the coordinator dies with the transaction open
    wait_for(
        lambda: state(zk_client, TXN_TOPIC, 0)["leader"] not in (before["leader"], -1),
        timeout_s=FAILOVER_S,
        what="a new leader of __transaction_state-0",
    )
    survivors = ",".join(b.bootstrap for broker_id, b in brokers.items() if broker_id != before["leader"])
    new = producer(survivors, "failover-txn")
    new.init_transactions(FAILOVER_S)  # the new coordinator aborts the open transaction, fencing its producer
    new.begin_transaction()
    fresh = produce(new, "fenced-data", "fresh", 2, 20)
    new.commit_transaction(60)

    with pytest.raises(KafkaException) as raised:
        old.commit_transaction(FAILOVER_S)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error

    read = read_committed(survivors, "fenced-data", 2, len(fresh))
    assert sorted(read) == sorted(fresh)
    assert not set(read) & set(zombie)


def test_the_spark_sinks_coordinator_requests_wait_out_a_missing_coordinator(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    """The exactly-once Spark sink asks a task's group coordinator for its batch marker (OffsetFetch) and the
    transaction coordinator for its transaction. While a coordinator's partition has no live leader (here: its only
    replica is killed, and comes back a few seconds later), FindCoordinator answers COORDINATOR_NOT_AVAILABLE; the
    sink's client waits for a coordinator instead of failing the micro-batch (tidelog/spark/transactions.py)."""
    from tidelog.spark.transactions import CoordinatorClient

    brokers = cluster_broker.all((1, 2, 3), {**SETTINGS, "offsets.topic.replication.factor": 1})
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    group = "sink-marker"
    wait_for(lambda: kafka_wire.find_coordinator(brokers[1].bootstrap, group)[0] == NONE, what="the coordinator")
    leader = state(zk_client, "__consumer_offsets", partition_for_group(group, 3))["leader"]
    brokers[leader].kill()
    survivor = next(b for broker_id, b in brokers.items() if broker_id != leader)
    wait_for(
        lambda: kafka_wire.find_coordinator(survivor.bootstrap, group)[0] == COORDINATOR_NOT_AVAILABLE,
        timeout_s=FAILOVER_S,
        what="FindCoordinator answering COORDINATOR_NOT_AVAILABLE",
    )
    answers: list[object] = []
    client = CoordinatorClient(survivor.bootstrap)
    # the request in a thread, the restart here (a broker started from a thread dies with it: PR_SET_PDEATHSIG)
    asking = threading.Thread(target=lambda: answers.append(_outcome(lambda: client.committed_batch(group))))
    started = time.monotonic()
    asking.start()
    time.sleep(3.0)
    assert asking.is_alive(), f"the request did not wait for a coordinator: {answers}"
    brokers[leader].restart()
    asking.join(timeout=FAILOVER_S)
    assert answers == [None], answers  # no marker yet, and no error
    assert time.monotonic() - started >= 3.0


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as exc:  # the test asserts on it
        return exc
