"""Failover under load, proven with real processes: the leader of a partition is killed with SIGKILL again and
again while an idempotent acks=all producer writes and a consumer group reads (replication factor 3,
min.insync.replicas 2). Afterwards every acknowledged record is in the log exactly once, at the offset its
acknowledgement named, in the order it was produced; the group has read every one of them; and the three replicas of
each partition are identical batch for batch up to the high watermark (tests/cluster/delivery_check.py and
replica_files.py say how each is checked).

`make test` runs 10 kills; `make test-cluster-faults` runs the long variant (100 kills)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from cluster_checks import registered, wait_for
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from delivery_check import assert_delivery, make_value
from kazoo.client import KazooClient
from replica_files import assert_replicas_identical

from broker_process import BrokerProcess
from zookeeper_process import SESSION_TIMEOUT_MS, ClusterBroker

TOPIC = "faults"
PARTITIONS = 2
FAILOVER_S = SESSION_TIMEOUT_MS / 1000 + 30
SETTINGS = {
    "replica.lag.time.max.ms": 4000,
    "offsets.topic.num.partitions": 2,
    "offsets.topic.replication.factor": 3,
    "group.initial.rebalance.delay.ms": 0,
}


def state(zk: KazooClient, partition: int, topic: str = TOPIC) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


class LoadProducer:
    """An idempotent acks=all producer writing `<name>:<sequence>` values round-robin until stopped; it keeps what
    was acknowledged (partition -> [(offset, value)]) and the errors it was told of."""

    def __init__(self, bootstrap: str, name: str = "p") -> None:
        self.name = name
        self.acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 300_000,
            }
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LoadProducer:
        self._thread.start()
        return self

    def _delivered(self, err: Any, message: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked[message.partition()].append((message.offset(), message.value()))

    def _run(self) -> None:
        while not self._stop.is_set():
            value = make_value(self.name, self.sent)
            try:
                self._producer.produce(TOPIC, value, partition=self.sent % PARTITIONS, on_delivery=self._delivered)
            except BufferError:
                self._producer.poll(0.1)
                continue
            self.sent += 1
            self._producer.poll(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        remaining = self._producer.flush(300)
        assert remaining == 0, f"{remaining} records never acknowledged nor failed"

    @property
    def acked_count(self) -> int:
        return sum(len(records) for records in self.acked.values())


class GroupReader:
    """A consumer group member reading the topic until stopped; the values it saw (with repeats: a group is
    at-least-once across rebalances)."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 500,
                "session.timeout.ms": 10_000,
            }
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> GroupReader:
        self._consumer.subscribe([TOPIC])
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.2)
            if message is not None and message.error() is None:
                self.seen.add(message.value())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._consumer.close()


def read_back(bootstrap: str, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of each partition from offset 0 to `ends[partition]`, in the order read."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}", "enable.auto.commit": False}
    )
    read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in ends])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any((read[p][-1][0] + 1 if read[p] else 0) < ends[p] for p in ends):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read[message.partition()].append((message.offset(), message.value()))
        return read
    finally:
        consumer.close()


def high_watermarks(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{time.monotonic_ns()}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def full_isr(zk: KazooClient) -> bool:
    return all(sorted(state(zk, p)["isr"]) == [1, 2, 3] for p in range(PARTITIONS))


def kill_leaders(kills: int, cluster_broker: ClusterBroker, zk: KazooClient) -> None:
    brokers: dict[int, BrokerProcess] = cluster_broker.all((1, 2, 3), SETTINGS)
    wait_for(lambda: registered(zk) == [1, 2, 3], what="three registrations")
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})])
    created[TOPIC].result(timeout=60)
    wait_for(lambda: full_isr(zk), what="the full ISR")

    producer = LoadProducer(bootstrap).start()
    reader = GroupReader(bootstrap, "fault-readers").start()
    timings = []
    try:
        for kill in range(kills):
            partition = kill % PARTITIONS
            before = state(zk, partition)
            victim = before["leader"]
            acked_before = producer.acked_count
            wait_for(lambda n=acked_before: producer.acked_count > n + 20, what="acknowledgements before the kill")
            killed_at = time.monotonic()
            brokers[victim].kill()
            wait_for(
                lambda p=partition, v=victim: state(zk, p)["leader"] not in (v, -1),
                timeout_s=FAILOVER_S,
                what=f"a new leader after kill {kill + 1}",
            )
            acked_at_kill = producer.acked_count
            wait_for(
                lambda n=acked_at_kill: producer.acked_count > n,
                timeout_s=FAILOVER_S,
                what="an acknowledgement after the failover",
            )
            timings.append(time.monotonic() - killed_at)
            brokers[victim].restart()
            wait_for(lambda: full_isr(zk), timeout_s=FAILOVER_S * 2, what=f"the full ISR after kill {kill + 1}")
    finally:
        producer.stop()
    timings.sort()
    print(
        f"\n{kills} kills, {producer.acked_count:,} records acknowledged: kill -9 to the next acknowledgement "
        f"{min(timings):.1f}-{max(timings):.1f} s, median {timings[len(timings) // 2]:.1f} s"
    )

    assert not producer.errors, f"{len(producer.errors)} produce errors, first: {producer.errors[:3]}"
    ends = high_watermarks(bootstrap)
    acked = {p: sorted(records) for p, records in producer.acked.items()}
    assert_delivery(acked, read_back(bootstrap, ends))

    everything = {value for records in acked.values() for _offset, value in records}
    wait_for(lambda: everything <= reader.seen, timeout_s=120, what="the group to read every acknowledged record")
    reader.stop()

    wait_for(lambda: full_isr(zk), timeout_s=FAILOVER_S, what="the full ISR at the end")
    log_dirs = {f"broker{b}": broker.log_dir for b, broker in brokers.items()}
    for partition in range(PARTITIONS):
        wait_for(
            lambda p=partition: all(
                sum(1 for _ in (broker.log_dir / f"{TOPIC}-{p}").glob("*.log")) for broker in brokers.values()
            ),
            what="segments",
        )
        assert_replicas_identical(log_dirs, TOPIC, partition, up_to=ends[partition])


@pytest.mark.timeout(900)  # about 10 s a kill; pyproject's 300 s is for ordinary tests
def test_kill_the_leader_again_and_again(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    kill_leaders(10, cluster_broker, zk_client)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_kill_the_leader_a_hundred_times(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    kill_leaders(100, cluster_broker, zk_client)


@pytest.mark.parametrize("flush", ["default", "fsync"])
def test_every_replica_killed_at_once(flush: str, cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    """All three brokers killed with SIGKILL at the same moment under load, then started again: the partitions go
    offline and come back led by their last in-sync replica, and no acknowledged record is lost, with the default
    flush policy (the records were in every ISR member's page cache, which a process kill does not lose) and with
    flush.messages=1 (each acknowledged batch fsynced by the leader and by every follower before the next fetch).
    A power loss of every machine at once is what separates the two (docs/cluster.md): only the second survives it."""
    settings = {**SETTINGS, **({"log.flush.interval.messages": 1} if flush == "fsync" else {})}
    brokers: dict[int, BrokerProcess] = cluster_broker.all((1, 2, 3), settings)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(60)
    wait_for(lambda: full_isr(zk_client), what="the full ISR")

    producer = LoadProducer(bootstrap).start()
    try:
        wait_for(lambda: producer.acked_count > 500, what="acknowledgements before the kill")
        for broker in brokers.values():  # as close to at once as three signals can be
            os.kill(broker.pid, signal.SIGKILL)
        for broker in brokers.values():
            assert broker.proc is not None
            broker.proc.wait(timeout=30)
        acked_at_kill = producer.acked_count
        for broker in brokers.values():
            broker.restart()
        wait_for(lambda: registered(zk_client) == [1, 2, 3], timeout_s=FAILOVER_S, what="three registrations again")
        wait_for(
            lambda: producer.acked_count > acked_at_kill + 100,
            timeout_s=FAILOVER_S * 2,
            what="acknowledgements after the restart",
        )
    finally:
        producer.stop()
    assert not producer.errors, f"{len(producer.errors)} produce errors, first: {producer.errors[:3]}"
    ends = high_watermarks(bootstrap)
    acked = {p: sorted(records) for p, records in producer.acked.items()}
    assert_delivery(acked, read_back(bootstrap, ends))
    wait_for(lambda: full_isr(zk_client), timeout_s=FAILOVER_S, what="the full ISR at the end")
    log_dirs = {f"broker{b}": broker.log_dir for b, broker in brokers.items()}
    for partition in range(PARTITIONS):
        assert_replicas_identical(log_dirs, TOPIC, partition, up_to=ends[partition])
