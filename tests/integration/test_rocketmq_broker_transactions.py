"""Transactions on a broker whose storage is the RocketMQ engine (one broker for the module): a confluent-kafka
transactional producer commits and aborts, a read_committed consumer sees only the committed records (a
read_uncommitted one all of them, never the markers), an open transaction holds read_committed readers back at its
first offset, send_offsets_to_transaction commits offsets only with the transaction, and a kill -9 mid-transaction
keeps it open until the next producer of the id aborts it. How the engine stores them: docs/storage.md."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from txn_clients import TIMEOUT_S, create_topic, end_offsets, read_all

from broker_process import BrokerFactory, BrokerProcess

OVERRIDES = {
    "transaction.state.log.num.partitions": 3,
    "offsets.topic.num.partitions": 3,
    "group.initial.rebalance.delay.ms": 0,
    "tidelog.rocketmq.mapedFileSizeCommitLog": 4 << 20,
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("rocketmq-txn-broker"))
    try:
        yield factory(OVERRIDES, engine="rocketmq")
    finally:
        factory.close_all()


def transactional(broker: BrokerProcess, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(TIMEOUT_S)
    return producer


def test_read_committed_consumers_see_only_committed_records(broker: BrokerProcess) -> None:
    create_topic(broker, "rq-tx", 2)
    producer = transactional(broker, "rq-tx-id")
    producer.begin_transaction()
    for i in range(4):
        producer.produce("rq-tx", f"committed-{i}".encode(), partition=i % 2)
    producer.commit_transaction(TIMEOUT_S)
    producer.begin_transaction()
    for i in range(4):
        producer.produce("rq-tx", f"aborted-{i}".encode(), partition=i % 2)
    producer.flush(TIMEOUT_S)
    producer.abort_transaction(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce("rq-tx", b"committed-last", partition=0)
    producer.commit_transaction(TIMEOUT_S)
    # partition 0: 2 records + COMMIT, 2 + ABORT, 1 + COMMIT; partition 1: 2 + COMMIT, 2 + ABORT
    assert end_offsets(broker, "rq-tx", 2) == [8, 6]
    committed = [f"committed-{i}".encode() for i in range(4)] + [b"committed-last"]
    assert sorted(read_all(broker, "rq-tx", "read_committed", 2)) == sorted(committed)
    everything = committed + [f"aborted-{i}".encode() for i in range(4)]
    assert sorted(read_all(broker, "rq-tx", "read_uncommitted", 2)) == sorted(everything)


def test_an_open_transaction_holds_read_committed_readers_back(broker: BrokerProcess) -> None:
    create_topic(broker, "rq-tx-open")
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce("rq-tx-open", b"before")
    plain.flush(TIMEOUT_S)
    producer = transactional(broker, "rq-tx-open-id")
    producer.begin_transaction()
    producer.produce("rq-tx-open", b"pending")
    producer.flush(TIMEOUT_S)
    plain.produce("rq-tx-open", b"after")  # beyond the last stable offset until the transaction ends
    plain.flush(TIMEOUT_S)
    assert read_all(broker, "rq-tx-open", "read_committed") == [b"before"]
    assert read_all(broker, "rq-tx-open", "read_uncommitted") == [b"before", b"pending", b"after"]
    producer.commit_transaction(TIMEOUT_S)
    assert read_all(broker, "rq-tx-open", "read_committed") == [b"before", b"pending", b"after"]


def test_send_offsets_to_transaction(broker: BrokerProcess) -> None:
    """The offsets go to __consumer_offsets (a topic of the same CommitLog) as a transactional batch."""
    create_topic(broker, "rq-tx-in")
    create_topic(broker, "rq-tx-out")
    group = "rq-tx-group"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    producer = transactional(broker, "rq-tx-offsets")

    def committed() -> int:
        return consumer.committed([TopicPartition("rq-tx-in", 0)], TIMEOUT_S)[0].offset

    try:
        for offset, commit in ((7, False), (5, True)):
            producer.begin_transaction()
            producer.produce("rq-tx-out", b"x")
            producer.send_offsets_to_transaction(
                [TopicPartition("rq-tx-in", 0, offset)], consumer.consumer_group_metadata(), TIMEOUT_S
            )
            if commit:
                producer.commit_transaction(TIMEOUT_S)
                assert committed() == 5
            else:
                producer.abort_transaction(TIMEOUT_S)
                assert committed() < 0  # an aborted transaction's offsets never become visible
    finally:
        consumer.close()


def test_a_kill_mid_transaction_keeps_it_open_until_the_next_producer_aborts_it(broker: BrokerProcess) -> None:
    """kill -9 with a transaction open: the restarted engine has it open again (read_committed readers stop before
    it), and the next producer of the id gets it aborted. Last in the module: it restarts the broker."""
    create_topic(broker, "rq-tx-kill")
    producer = transactional(broker, "rq-tx-kill-id")
    producer.begin_transaction()
    producer.produce("rq-tx-kill", b"in-flight")
    producer.flush(TIMEOUT_S)
    broker.kill()
    broker.restart()
    assert read_all(broker, "rq-tx-kill", "read_committed") == []
    fresh = transactional(broker, "rq-tx-kill-id")
    fresh.begin_transaction()
    fresh.produce("rq-tx-kill", b"after")
    fresh.commit_transaction(TIMEOUT_S)
    assert end_offsets(broker, "rq-tx-kill") == [4]  # in-flight, ABORT, after, COMMIT
    assert read_all(broker, "rq-tx-kill", "read_committed") == [b"after"]
    assert read_all(broker, "rq-tx-kill", "read_uncommitted") == [b"in-flight", b"after"]
