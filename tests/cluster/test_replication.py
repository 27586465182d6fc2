"""Replication between three `tidelog serve` brokers and a real ZooKeeper, with librdkafka producers and consumers:
followers copy their leaders byte for byte, the high watermark and the ISR move as followers catch up and fall
behind, acks=all waits for the ISR and min.insync.replicas refuses writes the ISR cannot hold, a leader killed with
SIGKILL loses no acknowledged record, and a follower whose data directory is wiped copies everything again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from typing import Any

from cluster_checks import registered, wait_for
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

import kafka_wire
from broker_process import BrokerProcess
from tidelog.codec.record_batch import Record, build_batch
from tidelog.protocol.messages import ApiKey
from zookeeper_process import SESSION_TIMEOUT_MS, ClusterBroker

FAILOVER_S = SESSION_TIMEOUT_MS / 1000 + 30  # ZooKeeper notices the death, the controller acts; two busy cores
NONE = 0
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
REPLICATION = {
    "replica.lag.time.max.ms": 4000,
    "offsets.topic.num.partitions": 2,
    "group.initial.rebalance.delay.ms": 0,
}


def state(zk: KazooClient, topic: str, partition: int) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


def log_bytes(broker: BrokerProcess, topic: str, partition: int) -> bytes:
    """Every `.log` segment of the broker's replica, in offset order, concatenated."""
    directory = broker.log_dir / f"{topic}-{partition}"
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def start_cluster(cluster_broker: ClusterBroker, zk: KazooClient, **overrides: Any) -> dict[int, BrokerProcess]:
    brokers = cluster_broker.all((1, 2, 3), {**REPLICATION, **overrides})
    wait_for(lambda: registered(zk) == [1, 2, 3], what="three registrations")
    return brokers


def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 3, config=config)], operation_timeout=30).values():
        future.result(timeout=60)


def produce_all(bootstrap: str, topic: str, values: list[str], partitions: int) -> dict[str, int]:
    """Produce `values` round-robin with an idempotent acks=all producer; value -> the partition it was acked on."""
    acked: dict[str, int] = {}
    failures: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "batch.num.messages": 100,  # many batches, so segments roll
        }
    )

    def delivered(err: Any, message: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            acked[message.value().decode()] = message.partition()

    for index, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=index % partitions, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(120) == 0, "messages left undelivered"
    assert not failures, failures[:5]
    return acked


def read_all(bootstrap: str, topic: str, partitions: int, count: int, timeout_s: float = 90) -> list[tuple[int, str]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        read: list[tuple[int, str]] = []
        deadline = time.monotonic() + timeout_s
        while len(read) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read.append((message.partition(), message.value().decode()))
        return read
    finally:
        consumer.close()


def replicas_identical(brokers: dict[int, BrokerProcess], topic: str, partition: int) -> bool:
    copies = {log_bytes(broker, topic, partition) for broker in brokers.values() if broker.running}
    return len(copies) == 1 and len(next(iter(copies))) > 0


def test_followers_copy_their_leader_byte_for_byte(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    brokers = start_cluster(cluster_broker, zk_client)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "copied", 3, {"min.insync.replicas": "2", "segment.bytes": "4000"})
    values = [f"record-{i:05d}" for i in range(3000)]
    acked = produce_all(bootstrap, "copied", values, 3)
    assert len(acked) == len(values)

    for partition in range(3):
        wait_for(
            lambda p=partition: replicas_identical(brokers, "copied", p), what=f"identical replicas of {partition}"
        )
        leader = state(zk_client, "copied", partition)["leader"]
        assert sorted(state(zk_client, "copied", partition)["isr"]) == [1, 2, 3]
        segments = sorted(p.name for p in (brokers[leader].log_dir / f"copied-{partition}").glob("*.log"))
        assert len(segments) > 1, "the test means to cover segment rolls"
        for broker in brokers.values():  # the same segments, and the same leader-epoch checkpoint
            directory = broker.log_dir / f"copied-{partition}"
            assert sorted(p.name for p in directory.glob("*.log")) == segments
    read = read_all(bootstrap, "copied", 3, len(values))
    assert sorted(value for _p, value in read) == values


def test_acks_all_waits_for_the_isr_and_min_insync_replicas_refuses(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    """ZooKeeper's partition state is written before the leader applies it (by the controller before its
    LeaderAndIsr, by the leader itself before its event loop takes the new ISR), so each acks=all answer is awaited
    through the codes a client retries in that window, and no other."""
    brokers = start_cluster(cluster_broker, zk_client)
    create_topic(brokers[1].bootstrap, "strict", 1, {"min.insync.replicas": "3"})
    wait_for(lambda: sorted(state(zk_client, "strict", 0)["isr"]) == [1, 2, 3], what="the full ISR")
    leader = state(zk_client, "strict", 0)["leader"]
    follower = next(b for b in (1, 2, 3) if b != leader)
    acks_all_answers(brokers[leader].bootstrap, "strict", NONE, passing=(NOT_LEADER_OR_FOLLOWER,))

    brokers[follower].kill()  # SIGKILL: its session lasts until it times out, its fetches stop at once
    wait_for(
        lambda: follower not in state(zk_client, "strict", 0)["isr"],
        timeout_s=FAILOVER_S,
        what="the ISR to shrink",
    )
    acks_all_answers(
        brokers[leader].bootstrap,
        "strict",
        NOT_ENOUGH_REPLICAS,
        passing=(REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND),  # appended, never acknowledged
    )
    assert wire_produce(brokers[leader].bootstrap, "strict", acks=1) == NONE  # acks=1 does not need the ISR

    brokers[follower].restart()
    wait_for(
        lambda: sorted(state(zk_client, "strict", 0)["isr"]) == [1, 2, 3],
        timeout_s=FAILOVER_S,
        what="the follower to rejoin the ISR",
    )
    acks_all_answers(brokers[leader].bootstrap, "strict", NONE, passing=(NOT_ENOUGH_REPLICAS,))
    wait_for(lambda: replicas_identical(brokers, "strict", 0), what="identical replicas")


def acks_all_answers(bootstrap: str, topic: str, expected: int, *, passing: tuple[int, ...]) -> None:
    """Produce with acks=all until the answer is `expected`; an answer in `passing` is tried again (the leader has
    not applied the partition state ZooKeeper already shows), any other fails the test."""

    def answered() -> bool:
        code = wire_produce(bootstrap, topic, acks=-1)
        assert code in (expected, *passing), f"acks=all answered {code}, expected {expected} (or {passing} first)"
        return code == expected

    wait_for(answered, timeout_s=30, what=f"acks=all to be answered {expected}")


def test_a_killed_leader_loses_no_acknowledged_record(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    brokers = start_cluster(cluster_broker, zk_client)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "durable", 2, {"min.insync.replicas": "2"})
    before = produce_all(bootstrap, "durable", [f"before-{i:05d}" for i in range(2000)], 2)

    old = state(zk_client, "durable", 0)
    brokers[old["leader"]].kill()
    wait_for(
        lambda: state(zk_client, "durable", 0)["leader"] not in (old["leader"], -1),
        timeout_s=FAILOVER_S,
        what="a new leader",
    )
    new = state(zk_client, "durable", 0)
    assert new["leader_epoch"] > old["leader_epoch"]
    after = produce_all(bootstrap, "durable", [f"after-{i:05d}" for i in range(1000)], 2)

    brokers[old["leader"]].restart()
    wait_for(
        lambda: sorted(state(zk_client, "durable", 0)["isr"]) == [1, 2, 3],
        timeout_s=FAILOVER_S,
        what="the old leader to rejoin the ISR",
    )
    acked = {**before, **after}
    read = read_all(bootstrap, "durable", 2, len(acked))
    values = [value for _p, value in read]
    assert len(values) == len(set(values)), "a record was read twice"
    assert {value: p for p, value in read} == acked
    for partition in range(2):
        wait_for(lambda p=partition: replicas_identical(brokers, "durable", p), what="identical replicas")


def wire_produce(bootstrap: str, topic: str, *, acks: int) -> int:
    """The error code of a one-record Produce to partition 0 with `acks`."""
    body = {
        "transactional_id": None,
        "acks": acks,
        "timeout": 10_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": build_batch([Record(b"w")])}]}],
    }
    response = kafka_wire.request(bootstrap, ApiKey.PRODUCE, kafka_wire.PRODUCE_VERSION, body)
    return int(response.responses[0].partition_responses[0].error_code)


def test_producer_ids_are_unique_across_the_cluster(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    """Every broker reserves its blocks of producer ids in /latest_producer_id_block (red before: each broker counted
    from 0 in a file of its own, and a second idempotent producer was fenced as out of order by a leader that knew the
    first one's sequence numbers under the same id)."""
    brokers = start_cluster(cluster_broker, zk_client)
    ids = [init_producer_id(broker.bootstrap) for broker in brokers.values() for _ in range(2)]
    assert len(set(ids)) == len(ids), ids
    block = json.loads(zk_client.get("/latest_producer_id_block")[0])
    assert block["version"] == 1 and int(block["block_end"]) - int(block["block_start"]) == 999
    assert block["broker"] in brokers and max(ids) <= int(block["block_end"])


def init_producer_id(bootstrap: str) -> int:
    body = {"transactional_id": None, "transaction_timeout": 60_000}
    response = kafka_wire.request(bootstrap, ApiKey.INIT_PRODUCER_ID, 2, body)
    assert response.error_code == 0
    return int(response.producer_id)


def test_a_follower_whose_data_is_wiped_copies_everything_again(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = start_cluster(cluster_broker, zk_client)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "wiped", 1, {"min.insync.replicas": "2", "segment.bytes": "4000"})
    values = [f"record-{i:05d}" for i in range(1500)]
    produce_all(bootstrap, "wiped", values, 1)
    leader = state(zk_client, "wiped", 0)["leader"]
    follower = next(b for b in (1, 2, 3) if b != leader)
    wait_for(lambda: replicas_identical(brokers, "wiped", 0), what="identical replicas")

    brokers[follower].kill()
    shutil.rmtree(brokers[follower].log_dir)  # the disk was replaced
    brokers[follower].log_dir.mkdir()
    wait_for(lambda: follower not in state(zk_client, "wiped", 0)["isr"], timeout_s=FAILOVER_S, what="ISR shrink")
    brokers[follower].restart()
    wait_for(
        lambda: sorted(state(zk_client, "wiped", 0)["isr"]) == [1, 2, 3],
        timeout_s=FAILOVER_S,
        what="the wiped follower back in the ISR",
    )
    wait_for(lambda: replicas_identical(brokers, "wiped", 0), what="its replica identical to the leader's again")
    copied = sorted(p.name for p in (brokers[follower].log_dir / "wiped-0").glob("*.log"))
    assert len(copied) > 1 and copied == sorted(p.name for p in (brokers[leader].log_dir / "wiped-0").glob("*.log"))


def fetch_v15_plus(bootstrap: str, version: int, topic_id: Any, offset: int, replica_id: int) -> Any:
    """Fetch v15+ (topic by id, the replica id in replica_state) of partition 0 from `offset`; its one partition."""
    body = {
        "replica_state": {"replica_id": replica_id, "replica_epoch": -1},
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [{"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    response = kafka_wire.request(bootstrap, ApiKey.FETCH, version, body)
    [topic] = response.responses
    assert topic.topic_id == topic_id
    return response, topic.partitions[0]


def latest_offset(bootstrap: str, topic: str) -> int:
    """ListOffsets v9 latest (a consumer's): the high watermark."""
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    }
    [answer] = kafka_wire.request(bootstrap, ApiKey.LIST_OFFSETS, 9, body).topics[0].partitions
    assert answer.error_code == 0
    return int(answer.offset)


def test_a_v15_follower_fetch_moves_the_high_watermark_and_v16_names_the_leader(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    """The follower's id inside Fetch v15's replica_state reaches the leader's replica manager: with the real follower
    paused (SIGSTOP; its session and its ISR seat outlast the test), a v15 fetch as that follower from the log end
    moves the high watermark. A consumer's Fetch v16 at the follower is refused NOT_LEADER_OR_FOLLOWER with the
    leader, its epoch and its endpoint (KIP-951)."""
    patient = {**REPLICATION, "replica.lag.time.max.ms": 60_000, "zookeeper.session.timeout.ms": 30_000}
    brokers = cluster_broker.all((1, 2), patient)
    wait_for(lambda: registered(zk_client) == [1, 2], what="two registrations")
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    [future] = admin.create_topics([NewTopic("by-id", 1, replica_assignment=[[1, 2]])], operation_timeout=30).values()
    future.result(timeout=60)
    wait_for(lambda: sorted(state(zk_client, "by-id", 0)["isr"]) == [1, 2], what="the full ISR")
    leader, follower = brokers[1], brokers[2]
    [described] = kafka_wire.metadata(leader.bootstrap, ["by-id"]).topics
    topic_id = described.topic_id
    assert wire_produce(leader.bootstrap, "by-id", acks=-1) == 0  # both replicas hold offset 0
    wait_for(lambda: latest_offset(leader.bootstrap, "by-id") == 1, what="the high watermark at 1")

    os.kill(follower.pid, signal.SIGSTOP)
    try:
        assert wire_produce(leader.bootstrap, "by-id", acks=1) == 0
        time.sleep(0.5)
        assert latest_offset(leader.bootstrap, "by-id") == 1, "the high watermark moved without the follower"
        _response, answer = fetch_v15_plus(leader.bootstrap, 15, topic_id, 2, replica_id=2)
        assert (answer.error_code, answer.high_watermark) == (0, 2)
        assert latest_offset(leader.bootstrap, "by-id") == 2
    finally:
        os.kill(follower.pid, signal.SIGCONT)

    response, answer = fetch_v15_plus(follower.bootstrap, 16, topic_id, 0, replica_id=-1)
    epoch = state(zk_client, "by-id", 0)["leader_epoch"]
    assert answer.error_code == NOT_LEADER_OR_FOLLOWER
    assert (answer.current_leader.leader_id, answer.current_leader.leader_epoch) == (1, epoch)
    assert [(n.node_id, n.host, n.port) for n in response.node_endpoints] == [(1, "127.0.0.1", leader.port)]
