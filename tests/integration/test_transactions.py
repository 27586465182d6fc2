"""Transactions (KIP-98) against a real broker with real clients: confluent-kafka's transactional producer (commit,
abort, send_offsets_to_transaction, zombie fencing, a timed-out transaction), read_committed consumers (an expected
failure until the storage slice's Fetch), the coordinator's errors over the wire, and a kill -9 mid-transaction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from txn_clients import create_topic, end_offsets, read_all

import kafka_wire
from broker_process import BrokerFactory, BrokerProcess
from tidelog.errors import ErrorCode
from tidelog.protocol.client import BrokerConnection
from tidelog.protocol.messages import ApiKey

OVERRIDES = {
    "transaction.state.log.num.partitions": 3,
    "offsets.topic.num.partitions": 3,
    "group.initial.rebalance.delay.ms": 0,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,
}


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    factory = BrokerFactory(tmp_path_factory.mktemp("txn-broker"))
    try:
        yield factory(OVERRIDES)
    finally:
        factory.close_all()


def producer(broker: BrokerProcess, transactional_id: str, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id, **extra})


def commit_abort_commit(broker: BrokerProcess, topic: str) -> None:
    create_topic(broker, topic, 2)
    p = producer(broker, f"{topic}-id")
    p.init_transactions(10)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, f"committed-{i}".encode(), partition=i % 2)
    p.commit_transaction(10)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, f"aborted-{i}".encode(), partition=i % 2)
    p.flush(10)
    p.abort_transaction(10)
    p.begin_transaction()
    p.produce(topic, b"committed-last", partition=0)
    p.commit_transaction(10)


@pytest.mark.matrix("producer: transactions (commit and abort)", client="confluent")
def test_commit_and_abort_write_a_marker_to_every_partition(txn_broker: BrokerProcess) -> None:
    commit_abort_commit(txn_broker, "tx-data")
    # partition 0: 2 records + COMMIT, 2 + ABORT, 1 + COMMIT; partition 1: 2 + COMMIT, 2 + ABORT (not in the third)
    assert end_offsets(txn_broker, "tx-data", 2) == [8, 6]
    values = read_all(txn_broker, "tx-data", "read_uncommitted", 2)  # control records are never delivered
    assert sorted(values) == sorted(
        [f"committed-{i}".encode() for i in range(4)]
        + [f"aborted-{i}".encode() for i in range(4)]
        + [b"committed-last"]
    )


def test_read_committed_readers_skip_aborted_records(txn_broker: BrokerProcess) -> None:
    commit_abort_commit(txn_broker, "tx-read-committed")
    committed = read_all(txn_broker, "tx-read-committed", "read_committed", 2)
    assert sorted(committed) == sorted([f"committed-{i}".encode() for i in range(4)] + [b"committed-last"])


def test_send_offsets_to_transaction(txn_broker: BrokerProcess) -> None:
    create_topic(txn_broker, "tx-offsets-in")
    create_topic(txn_broker, "tx-offsets-out")
    group = "tx-offsets-group"
    consumer = Consumer({"bootstrap.servers": txn_broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    p = producer(txn_broker, "tx-offsets")
    p.init_transactions(10)

    def committed() -> int:
        return consumer.committed([TopicPartition("tx-offsets-in", 0)], 10)[0].offset

    p.begin_transaction()
    p.produce("tx-offsets-out", b"x")
    p.send_offsets_to_transaction([TopicPartition("tx-offsets-in", 0, 7)], consumer.consumer_group_metadata(), 10)
    p.abort_transaction(10)
    assert committed() < 0  # an aborted transaction's offsets never become visible
    p.begin_transaction()
    p.produce("tx-offsets-out", b"y")
    p.send_offsets_to_transaction([TopicPartition("tx-offsets-in", 0, 5)], consumer.consumer_group_metadata(), 10)
    p.commit_transaction(10)
    assert committed() == 5
    consumer.close()


def test_a_second_producer_fences_the_first(txn_broker: BrokerProcess) -> None:
    create_topic(txn_broker, "tx-zombie")
    old = producer(txn_broker, "tx-zombie-id")
    old.init_transactions(10)
    old.begin_transaction()
    old.produce("tx-zombie", b"zombie")
    old.flush(10)
    new = producer(txn_broker, "tx-zombie-id")
    new.init_transactions(15)  # aborts the old producer's open transaction
    new.begin_transaction()
    new.produce("tx-zombie", b"fresh")
    new.commit_transaction(10)
    with pytest.raises(KafkaException) as raised:
        old.commit_transaction(10)
    assert raised.value.args[0].fatal() or raised.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), raised.value
    # the zombie's record, its transaction's ABORT, the new producer's record and its COMMIT
    assert end_offsets(txn_broker, "tx-zombie") == [4]
    assert read_all(txn_broker, "tx-zombie", "read_uncommitted") == [b"zombie", b"fresh"]


def test_a_transaction_past_its_timeout_is_aborted(txn_broker: BrokerProcess) -> None:
    create_topic(txn_broker, "tx-timeout")
    p = producer(txn_broker, "tx-timeout-id", **{"transaction.timeout.ms": 1000})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("tx-timeout", b"never-committed")
    p.flush(10)
    time.sleep(3)  # the coordinator's check runs every 500 ms here
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
    assert end_offsets(txn_broker, "tx-timeout") == [2]  # the record and the ABORT marker
    assert read_all(txn_broker, "tx-timeout", "read_uncommitted") == [b"never-committed"]


def test_bad_requests_get_kafkas_error_codes(txn_broker: BrokerProcess) -> None:
    """Over the wire: EndTxn without a transaction, twice, an old epoch, AddPartitionsToTxn naming an unknown topic,
    TxnOffsetCommit outside a transaction - each answered as Kafka answers, nothing added."""
    create_topic(txn_broker, "tx-errors")

    async def scenario() -> None:
        conn = BrokerConnection("127.0.0.1", txn_broker.port or 0, "tx-errors-test")
        try:
            init = await conn.request(
                ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "tx-errors-id", "transaction_timeout": 60_000}, 10
            )
            assert init.error_code == 0
            pid, epoch = init.producer_id, init.producer_epoch
            ident = {"transactional_id": "tx-errors-id", "producer_id": pid}

            async def end(committed: bool, at_epoch: int = epoch) -> int:
                body = {**ident, "producer_epoch": at_epoch, "committed": committed}
                return int((await conn.request(ApiKey.END_TXN, 3, body, 10)).error_code)

            assert await end(True) == ErrorCode.INVALID_TXN_STATE  # nothing open
            added = await conn.request(
                ApiKey.ADD_PARTITIONS_TO_TXN,
                3,
                {
                    "v3_and_below_transactional_id": "tx-errors-id",
                    "v3_and_below_producer_id": pid,
                    "v3_and_below_producer_epoch": epoch,
                    "v3_and_below_topics": [
                        {"name": "tx-errors", "partitions": [0]},
                        {"name": "tx-no-such-topic", "partitions": [0]},
                    ],
                },
                10,
            )
            codes = {
                (t.name, r.partition_index): r.partition_error_code
                for t in added.results_by_topic_v3_and_below
                for r in t.results_by_partition
            }
            assert codes == {
                ("tx-errors", 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
                ("tx-no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            }
            assert await end(False) == ErrorCode.INVALID_TXN_STATE  # still nothing open: nothing was added
            offsets = await conn.request(
                ApiKey.TXN_OFFSET_COMMIT,
                3,
                {
                    **ident,
                    "producer_epoch": epoch,
                    "group_id": "tx-errors-group",
                    "topics": [
                        {
                            "name": "tx-errors",
                            "partitions": [{"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}],
                        }
                    ],
                },
                10,
            )
            assert offsets.topics[0].partitions[0].error_code == ErrorCode.INVALID_TXN_STATE
            body = {
                "v3_and_below_transactional_id": "tx-errors-id",
                "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": [{"name": "tx-errors", "partitions": [0]}],
            }
            added = await conn.request(ApiKey.ADD_PARTITIONS_TO_TXN, 3, body, 10)
            assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
            assert await end(True, epoch - 1) == ErrorCode.PRODUCER_FENCED
            assert await end(True) == 0
            assert await end(False) == ErrorCode.INVALID_TXN_STATE  # abort after commit
            await asyncio.sleep(0.5)  # the markers are written
            assert await end(True) == 0  # a retried commit
        finally:
            await conn.close()

    asyncio.run(scenario())


def test_a_restarted_broker_reloads_open_transactions(txn_broker: BrokerProcess) -> None:
    """kill -9 with a transaction open: the restarted coordinator replays __transaction_state, and the next producer
    of the id gets the open transaction aborted (its partition's ABORT marker) before it starts. Last in the module:
    it restarts the broker."""
    create_topic(txn_broker, "tx-restart")
    p = producer(txn_broker, "tx-restart-id")
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("tx-restart", b"in-flight")
    p.flush(10)
    txn_broker.kill()
    txn_broker.restart()
    fresh = producer(txn_broker, "tx-restart-id")
    fresh.init_transactions(20)
    fresh.begin_transaction()
    fresh.produce("tx-restart", b"after")
    fresh.commit_transaction(10)
    assert end_offsets(txn_broker, "tx-restart") == [4]  # in-flight, ABORT, after, COMMIT
    assert read_all(txn_broker, "tx-restart", "read_uncommitted") == [b"in-flight", b"after"]


def test_the_transaction_state_topic_is_the_brokers(txn_broker: BrokerProcess) -> None:
    """Metadata marks __transaction_state internal; clients may neither delete it nor add partitions to it."""
    create_topic(txn_broker, "tx-internal")
    p = producer(txn_broker, "tx-internal-id")
    p.init_transactions(10)  # the coordinator's topic exists from here on
    admin = AdminClient({"bootstrap.servers": txn_broker.bootstrap})
    [answer] = kafka_wire.metadata(txn_broker.bootstrap, ["__transaction_state"]).topics
    assert (answer.error_code, answer.is_internal) == (0, True)
    with pytest.raises(KafkaException, match="TOPIC_EXCEPTION"):
        admin.delete_topics(["__transaction_state"])["__transaction_state"].result(10)
    with pytest.raises(KafkaException, match="TOPIC_EXCEPTION"):
        admin.create_partitions([NewPartitions("__transaction_state", 60)])["__transaction_state"].result(10)
    assert kafka_wire.metadata(txn_broker.bootstrap, ["__transaction_state"]).topics[0].error_code == 0
