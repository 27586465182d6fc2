"""The broker on the RocketMQ engine, beyond what the engine-parametrised client tests cover: committed offsets
(kept in __consumer_offsets, a topic of the one CommitLog) survive RocketMQ's file retention and a restart."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 30.0


def test_committed_offsets_survive_commitlog_retention_and_a_restart(start_broker) -> None:
    broker = start_broker(
        {
            "group.initial.rebalance.delay.ms": 0,
            "tidelog.rocketmq.mapedFileSizeCommitLog": 256 * 1024,
            "tidelog.rocketmq.fileReservedTime": 0,
            "tidelog.rocketmq.deleteWhen": ";".join(str(h) for h in range(24)),
            "tidelog.rocketmq.cleanResourceInterval": 200,
            "tidelog.rocketmq.deleteCommitLogFilesInterval": 0,
        },
        engine="rocketmq",
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("events", 2, 1)])["events"].result(timeout=TIMEOUT_S)
    committed = {0: 7, 1: 11}
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "keeper", "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("events", p, o) for p, o in committed.items()], asynchronous=False)
    finally:
        consumer.close()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.size": 16384})
    failures: list[object] = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures.append(error)

    first_file = broker.log_dir / "commitlog" / f"{0:020d}"
    deadline = time.monotonic() + TIMEOUT_S
    while first_file.exists() and time.monotonic() < deadline:  # fill files until retention deletes the first
        for i in range(200):
            producer.produce("events", value=b"x" * 500, partition=i % 2, on_delivery=on_delivery)
        assert producer.flush(TIMEOUT_S) == 0
        assert not failures, failures[:3]
        time.sleep(0.1)
    assert not first_file.exists(), "retention never deleted the first CommitLog file"

    broker.restart()  # the offsets are loaded again from __consumer_offsets
    checker = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "keeper"})
    try:
        answer = checker.committed([TopicPartition("events", p) for p in committed], timeout=TIMEOUT_S)
    finally:
        checker.close()
    assert {tp.partition: tp.offset for tp in answer} == committed
