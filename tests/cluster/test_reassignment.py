"""Partition reassignment (KIP-455 in ZooKeeper mode) with a real ZooKeeper and three `tidelog serve` brokers: the
`tidelog reassign` command (src/tidelog/tools/reassign.py) starts moves through AlterPartitionReassignments, the
controller writes the topic znode's adding/removing replicas, the new replicas are created and catch up, and once
they are in the ISR the controller hands leadership over, shrinks the ISR and writes the target assignment; the
removed replicas are deleted from their brokers' disks. Checked against the znodes, the brokers' files
(replica_files.py) and an acks=all producer's acknowledgements; then the errors Kafka answers."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from cluster_checks import controller, registered, wait_for
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from replica_files import assert_replicas_identical, compare_replicas

import kafka_wire
from tidelog.cli import main
from tidelog.protocol.messages import ApiKey
from zookeeper_process import ClusterBroker

TOPIC = "moving"
SETTINGS = {
    "replica.lag.time.max.ms": 4000,
    "log.segment.delete.delay.ms": 200,  # a removed replica's files go soon after
    "offsets.topic.num.partitions": 1,
    "group.initial.rebalance.delay.ms": 0,
    "controlled.shutdown.retry.backoff.ms": 500,
}
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REPLICA_ASSIGNMENT = 39
NO_REASSIGNMENT_IN_PROGRESS = 85


def topic_znode(zk: KazooClient, topic: str) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}")[0])


def state(zk: KazooClient, topic: str, partition: int) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


def produce(bootstrap: str, count: int, start: int = 0, partitions: int = 2) -> dict[str, tuple[int, int]]:
    """acks=all, round-robin over the partitions; value -> (partition, offset) acknowledged."""
    acked: dict[str, tuple[int, int]] = {}
    failures: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2})

    def delivered(err: Any, message: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked[message.value().decode()] = (message.partition(), message.offset())

    for index in range(start, start + count):
        producer.produce(TOPIC, f"record-{index:05d}".encode(), partition=index % partitions, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(120) == 0, "messages left undelivered"
    assert not failures, failures[:5]
    return acked


def read_all(bootstrap: str, count: int, partitions: int = 2) -> dict[str, tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
        read: dict[str, tuple[int, int]] = {}
        wait_for(lambda: _poll_into(consumer, read) >= count, what=f"{count} records read back")
        return read
    finally:
        consumer.close()


def _poll_into(consumer: Consumer, read: dict[str, tuple[int, int]]) -> int:
    for message in consumer.consume(500, 0.5):
        if message.error() is None:
            read[message.value().decode()] = (message.partition(), message.offset())
    return len(read)


def reassign(capsys: pytest.CaptureFixture[str], bootstrap: str, *args: str) -> tuple[int, str]:
    code = main(["reassign", "--bootstrap-server", bootstrap, *args])
    return code, capsys.readouterr().out


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def test_replicas_move_between_brokers(
    cluster_broker: ClusterBroker, zk_client: KazooClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brokers = cluster_broker.all((1, 2, 3), SETTINGS)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new_topic = NewTopic(TOPIC, 2, replica_assignment=[[1, 2], [1, 2]], config={"segment.bytes": "20000"})
    admin.create_topics([new_topic])[TOPIC].result(60)
    wait_for(lambda: all(len(state(zk_client, TOPIC, p)["isr"]) == 2 for p in range(2)), what="both replicas in sync")
    acked = produce(bootstrap, 4000)

    topics_file = write_json(tmp_path / "topics.json", {"version": 1, "topics": [{"topic": TOPIC}]})
    code, out = reassign(
        capsys, bootstrap, "--generate", "--topics-to-move-json-file", topics_file, "--broker-list", "1,2,3"
    )
    assert code == 0, out
    current, proposed = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
    assert [p["replicas"] for p in current["partitions"]] == [[1, 2], [1, 2]]
    assert [(p["topic"], p["partition"]) for p in proposed["partitions"]] == [(TOPIC, 0), (TOPIC, 1)]
    assert all(len(set(p["replicas"])) == 2 and set(p["replicas"]) <= {1, 2, 3} for p in proposed["partitions"])

    plan = {
        "version": 1,
        "partitions": [
            {"topic": TOPIC, "partition": 0, "replicas": [2, 3]},
            {"topic": TOPIC, "partition": 1, "replicas": [3, 1]},
        ],
    }
    plan_file = write_json(tmp_path / "plan.json", plan)
    code, out = reassign(capsys, bootstrap, "--execute", "--reassignment-json-file", plan_file)
    assert code == 0, out
    assert f'{{"topic":"{TOPIC}","partition":0,"replicas":[1,2],"log_dirs":["any","any"]}}' in out  # the rollback
    assert f"Successfully started partition reassignments for {TOPIC}-0,{TOPIC}-1" in out

    # while it goes on (or once done) the writes keep being acknowledged
    acked |= produce(bootstrap, 1000, start=4000)

    def done() -> bool:
        code, out = reassign(capsys, bootstrap, "--verify", "--reassignment-json-file", plan_file)
        return code == 0 and out.count("is completed.") == 2

    wait_for(done, what="both reassignments completed")
    znode = topic_znode(zk_client, TOPIC)
    assert znode["partitions"] == {"0": [2, 3], "1": [3, 1]}
    assert znode["adding_replicas"] == {} and znode["removing_replicas"] == {}
    assert sorted(state(zk_client, TOPIC, 0)["isr"]) == [2, 3]
    assert sorted(state(zk_client, TOPIC, 1)["isr"]) == [1, 3]
    assert state(zk_client, TOPIC, 0)["leader"] in (2, 3)
    listed = kafka_wire.request(brokers[3].bootstrap, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, {"topics": None})
    assert listed.error_code == 0 and listed.topics == ()

    wait_for(lambda: not (brokers[1].log_dir / f"{TOPIC}-0").exists(), what="broker 1's replica of partition 0 gone")
    wait_for(lambda: not (brokers[2].log_dir / f"{TOPIC}-1").exists(), what="broker 2's replica of partition 1 gone")
    wait_for(lambda: not list(brokers[1].log_dir.glob(f"{TOPIC}-0.*-delete")), what="its files removed")
    for partition, holders in ((0, (2, 3)), (1, (3, 1))):
        replicas = {f"broker{b}": brokers[b].log_dir for b in holders}
        wait_for(
            lambda r=replicas, p=partition: compare_replicas(r, TOPIC, p).identical,  # type: ignore[misc]
            what=f"identical replicas of partition {partition}",
        )
        assert_replicas_identical(replicas, TOPIC, partition)

    read = read_all(bootstrap, len(acked))
    assert {value: read.get(value) for value in acked} == acked  # every acknowledged record, where it was acked


def test_reassignment_errors_listing_and_cancel(
    cluster_broker: ClusterBroker, zk_client: KazooClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brokers = cluster_broker.all((1, 2, 3), SETTINGS)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[1, 2]])])[TOPIC].result(60)
    wait_for(lambda: zk_client.exists(f"/brokers/topics/{TOPIC}/partitions/0/state"), what="the partition led")

    def alter(bootstrap: str, partitions: list[dict[str, Any]], topic: str = TOPIC) -> dict[int, tuple[int, str]]:
        body = {"timeout": 10_000, "topics": [{"name": topic, "partitions": partitions}]}
        answer = kafka_wire.request(bootstrap, ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, body)
        assert answer.error_code == 0, answer
        return {p.partition_index: (int(p.error_code), p.error_message) for t in answer.responses for p in t.partitions}

    for bootstrap in (brokers[1].bootstrap, brokers[2].bootstrap):  # the controller, and one that forwards
        results = alter(
            bootstrap,
            [
                {"partition_index": 0, "replicas": [1, 9]},  # not a live broker
                {"partition_index": 1, "replicas": [1, 2]},  # no such partition
            ],
        )
        assert results[0][0] == INVALID_REPLICA_ASSIGNMENT and "not alive" in results[0][1]
        assert results[1][0] == UNKNOWN_TOPIC_OR_PARTITION
        [(code, message)] = alter(bootstrap, [{"partition_index": 0, "replicas": [2, 2]}]).values()
        assert code == INVALID_REPLICA_ASSIGNMENT and "Duplicate" in message
        [(code, _message)] = alter(bootstrap, [{"partition_index": 0, "replicas": []}]).values()
        assert code == INVALID_REPLICA_ASSIGNMENT
        [(code, _message)] = alter(bootstrap, [{"partition_index": 0, "replicas": None}]).values()
        assert code == NO_REASSIGNMENT_IN_PROGRESS
        [(code, _message)] = alter(bootstrap, [{"partition_index": 0, "replicas": [1]}], topic="nope").values()
        assert code == UNKNOWN_TOPIC_OR_PARTITION
    assert topic_znode(zk_client, TOPIC)["partitions"] == {"0": [1, 2]}  # nothing was started

    # broker 3 paused: still registered (for its session's timeout), but it cannot catch up, so the move waits
    plan_file = write_json(
        tmp_path / "plan.json", {"version": 1, "partitions": [{"topic": TOPIC, "partition": 0, "replicas": [1, 3]}]}
    )
    os.kill(brokers[3].pid, signal.SIGSTOP)
    try:
        code, out = reassign(capsys, brokers[2].bootstrap, "--execute", "--reassignment-json-file", plan_file)
        assert code == 0, out
        listed = kafka_wire.request(brokers[2].bootstrap, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, {"topics": None})
        [ongoing] = [(t.name, p) for t in listed.topics for p in t.partitions]
        assert ongoing[0] == TOPIC
        assert (list(ongoing[1].replicas), list(ongoing[1].adding_replicas), list(ongoing[1].removing_replicas)) == (
            [1, 3, 2],
            [3],
            [2],
        )
        znode = topic_znode(zk_client, TOPIC)
        assert (znode["partitions"], znode["adding_replicas"], znode["removing_replicas"]) == (
            {"0": [1, 3, 2]},
            {"0": [3]},
            {"0": [2]},
        )
        code, out = reassign(capsys, brokers[1].bootstrap, "--verify", "--reassignment-json-file", plan_file)
        assert f"Reassignment of partition {TOPIC}-0 is still in progress." in out
        code, out = reassign(capsys, brokers[1].bootstrap, "--cancel", "--reassignment-json-file", plan_file)
        assert code == 0 and f"Successfully cancelled partition reassignments for: {TOPIC}-0" in out
        # the original replicas are all in the ISR: the cancel completes at once
        wait_for(lambda: topic_znode(zk_client, TOPIC)["partitions"] == {"0": [1, 2]}, what="the cancel completed")
        znode = topic_znode(zk_client, TOPIC)
        assert znode["adding_replicas"] == {} and znode["removing_replicas"] == {}
        assert sorted(state(zk_client, TOPIC, 0)["isr"]) == [1, 2]
    finally:
        os.kill(brokers[3].pid, signal.SIGCONT)
    code, out = reassign(capsys, brokers[1].bootstrap, "--cancel", "--reassignment-json-file", plan_file)
    assert code == 1 and "NO_REASSIGNMENT_IN_PROGRESS" in out

    # a reordering is done at once: both replicas are in the ISR already
    assert alter(brokers[2].bootstrap, [{"partition_index": 0, "replicas": [2, 1]}]) == {0: (0, None)}
    wait_for(lambda: topic_znode(zk_client, TOPIC)["partitions"] == {"0": [2, 1]}, what="the new order written")
    assert topic_znode(zk_client, TOPIC)["adding_replicas"] == {}


def test_a_reassignment_survives_a_controller_failover(
    cluster_broker: ClusterBroker, zk_client: KazooClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reassignment's state is the topic znode: a new controller completes what the stopped one started, and
    the stopped broker, removed meanwhile, deletes its replica when it starts again."""
    brokers = cluster_broker.all((1, 2, 3), SETTINGS)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    first = int(wait_for(lambda: controller(zk_client), what="a controller"))  # type: ignore[call-overload]
    kept, added = (b for b in (1, 2, 3) if b != first)
    admin = AdminClient({"bootstrap.servers": brokers[kept].bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[first, kept]])])[TOPIC].result(60)
    wait_for(lambda: len(state(zk_client, TOPIC, 0)["isr"]) == 2, what="both replicas in sync")
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    acked = produce(bootstrap, 1000, partitions=1)

    plan_file = write_json(
        tmp_path / "plan.json",
        {"version": 1, "partitions": [{"topic": TOPIC, "partition": 0, "replicas": [kept, added]}]},
    )
    os.kill(brokers[added].pid, signal.SIGSTOP)  # the new replica cannot catch up yet
    try:
        code, out = reassign(capsys, brokers[kept].bootstrap, "--execute", "--reassignment-json-file", plan_file)
        assert code == 0, out
        brokers[first].stop()  # the controller goes; `kept` is elected (`added` is paused)
        wait_for(lambda: controller(zk_client) == kept, what=f"broker {kept} elected controller")
        assert topic_znode(zk_client, TOPIC)["adding_replicas"] == {"0": [added]}
    finally:
        os.kill(brokers[added].pid, signal.SIGCONT)
    wait_for(lambda: topic_znode(zk_client, TOPIC)["partitions"] == {"0": [kept, added]}, what="the move completed")
    assert topic_znode(zk_client, TOPIC)["removing_replicas"] == {}
    assert sorted(state(zk_client, TOPIC, 0)["isr"]) == sorted([kept, added])
    brokers[first].restart()
    wait_for(lambda: not (brokers[first].log_dir / f"{TOPIC}-0").exists(), what="the stopped broker's replica gone")
    replicas = {f"broker{b}": brokers[b].log_dir for b in (kept, added)}
    wait_for(lambda: compare_replicas(replicas, TOPIC, 0).identical, what="identical replicas")
    read = read_all(brokers[kept].bootstrap, len(acked), partitions=1)
    assert {value: read.get(value) for value in acked} == acked
