"""Transaction verification across brokers (KIP-890 part 1): a partition leader that is not the transactional id's
coordinator asks it (AddPartitionsToTxn v4 verify_only) before appending a producer's first transactional batch to
the partition. One cluster for the module: three `tidelog serve` brokers and a real ZooKeeper; brokers 1 and 2
verify (the default), broker 3 has `transaction.partition.verification.enable=false`. Topics have one replica per
partition placed explicitly, so which broker leads which partition is known."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cluster_checks import registered, wait_for
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from test_cluster_transactions import produce, producer, read_committed

import kafka_wire
from broker_process import BrokerFactory, BrokerProcess
from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import ErrorCode
from tidelog.protocol.messages import ApiKey
from zookeeper_process import SESSION_TIMEOUT_MS, ZooKeeperProcess, zookeeper_missing

NOT_VERIFYING = 3  # the broker with transaction.partition.verification.enable=false
SETTINGS = {
    "transaction.state.log.num.partitions": 3,
    "transaction.state.log.replication.factor": 1,
    "offsets.topic.num.partitions": 1,
    "group.initial.rebalance.delay.ms": 0,
}
PRODUCE_VERSION = 9


@dataclass
class Cluster:
    brokers: dict[int, BrokerProcess]
    zk: KazooClient

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = zookeeper_missing()
    if missing:
        pytest.skip(missing)
    base = tmp_path_factory.mktemp("txn-verification")
    zookeeper = ZooKeeperProcess(base / "zookeeper").start()
    factory = BrokerFactory(base / "brokers")
    zk = KazooClient(hosts=zookeeper.connect, connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2})
    try:
        zk.start(timeout=30)
        brokers = {
            broker_id: factory(
                {
                    **SETTINGS,
                    "broker.id": broker_id,
                    "zookeeper.connect": zookeeper.connect,
                    "zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
                    "controlled.shutdown.retry.backoff.ms": 500,
                    "transaction.partition.verification.enable": str(broker_id != NOT_VERIFYING).lower(),
                }
            )
            for broker_id in (1, 2, 3)
        }
        wait_for(lambda: registered(zk) == [1, 2, 3], what="three registrations")
        yield Cluster(brokers, zk)
    finally:
        factory.close_all()
        zk.stop()
        zk.close()
        zookeeper.stop()


def create_topic(cluster: Cluster, name: str, leaders: list[int]) -> None:
    """Partition p has one replica, on broker `leaders[p]`."""
    admin = AdminClient({"bootstrap.servers": cluster.brokers[1].bootstrap})
    topic = NewTopic(name, len(leaders), replica_assignment=[[leader] for leader in leaders])
    admin.create_topics([topic], operation_timeout=30)[name].result(timeout=60)
    for partition, leader in enumerate(leaders):
        wait_for(
            lambda p=partition, b=cluster.brokers[leader]: (
                kafka_wire.partitions(b.bootstrap, name).get(p, (-1,))[0] == 0
            ),
            what=f"{name}-{partition} led by broker {leader}",
        )


def coordinator_of(cluster: Cluster, transactional_id: str) -> int:
    """The broker FindCoordinator names (creating __transaction_state first if needed)."""

    def found() -> int | None:
        answer = kafka_wire.request(
            cluster.brokers[1].bootstrap, ApiKey.FIND_COORDINATOR, 3, {"key": transactional_id, "key_type": 1}
        )
        return int(answer.node_id) if answer.error_code == 0 else None

    return int(wait_for(found, what=f"the coordinator of {transactional_id}"))  # type: ignore[arg-type]


def verified_id(cluster: Cluster) -> tuple[str, int]:
    """A transactional id coordinated by a verifying broker, and that broker."""
    for transactional_id in (f"verify-{i}" for i in range(30)):
        coordinator = coordinator_of(cluster, transactional_id)
        if coordinator != NOT_VERIFYING:
            return transactional_id, coordinator
    raise AssertionError("every transactional id is coordinated by the broker that does not verify")


class RawProducer:
    """A transactional producer spoken to over the wire, one request at a time, so each answer is seen."""

    def __init__(self, cluster: Cluster, transactional_id: str, coordinator: int) -> None:
        self.transactional_id = transactional_id
        self.coordinator = cluster.brokers[coordinator].bootstrap
        body = {"transactional_id": transactional_id, "transaction_timeout": 60_000, "producer_id": -1}
        body["producer_epoch"] = -1
        for _ in range(100):  # CONCURRENT_TRANSACTIONS while an earlier transaction's markers are written
            answer = kafka_wire.request(self.coordinator, ApiKey.INIT_PRODUCER_ID, 4, body)
            if answer.error_code != ErrorCode.CONCURRENT_TRANSACTIONS:
                break
            time.sleep(0.1)
        assert answer.error_code == 0, answer
        self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
        self.sequence = 0

    def add(self, topic: str, partition: int) -> int:
        body = {
            "v3_and_below_transactional_id": self.transactional_id,
            "v3_and_below_producer_id": self.producer_id,
            "v3_and_below_producer_epoch": self.epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": [partition]}],
        }
        answer = kafka_wire.request(self.coordinator, ApiKey.ADD_PARTITIONS_TO_TXN, 3, body)
        return int(answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)

    def end(self, committed: bool) -> int:
        body = {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.epoch,
            "committed": committed,
        }
        return int(kafka_wire.request(self.coordinator, ApiKey.END_TXN, 3, body).error_code)

    def produce(self, leader: BrokerProcess, topic: str, partition: int, value: bytes) -> int:
        """One transactional record to `topic`-`partition` at its leader: the partition's error code."""
        batch = build_batch(
            [Record(value)],
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=self.sequence,
            is_transactional=True,
        )
        body = {
            "transactional_id": self.transactional_id,
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}],
        }
        answer = kafka_wire.request(leader.bootstrap, ApiKey.PRODUCE, PRODUCE_VERSION, body)
        code = int(answer.responses[0].partition_responses[0].error_code)
        if code == 0:
            self.sequence += 1
        return code


def log_end(leader: BrokerProcess, topic: str, partition: int) -> int:
    """The partition's end at its leader (one replica: the high watermark is the log end)."""
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}]}
        ],
    }
    answer = kafka_wire.request(leader.bootstrap, ApiKey.LIST_OFFSETS, 7, body)
    return int(answer.topics[0].partitions[0].offset)


def test_a_leader_asks_the_coordinator_on_another_broker(cluster: Cluster) -> None:
    transactional_id, coordinator = verified_id(cluster)
    verifier = 3 - coordinator  # the other verifying broker (1 or 2)
    leaders = [1, 2, 3]
    create_topic(cluster, "verify-raw", leaders)
    here, elsewhere = coordinator - 1, verifier - 1  # the partitions the coordinator and the other broker lead
    leader = cluster.brokers[verifier]
    raw = RawProducer(cluster, transactional_id, coordinator)
    assert raw.add("verify-raw", here) == 0  # a transaction is open, without `elsewhere`

    before = log_end(leader, "verify-raw", elsewhere)
    assert raw.produce(leader, "verify-raw", elsewhere, b"unadded") == ErrorCode.INVALID_TXN_STATE
    assert log_end(leader, "verify-raw", elsewhere) == before, "a batch outside the transaction was appended"

    assert raw.add("verify-raw", elsewhere) == 0
    assert raw.produce(leader, "verify-raw", elsewhere, b"added") == 0
    assert raw.produce(leader, "verify-raw", elsewhere, b"added-again") == 0  # the open transaction: not asked again
    assert log_end(leader, "verify-raw", elsewhere) == before + 2
    assert raw.end(committed=False) == 0
    wait_for(lambda: log_end(leader, "verify-raw", elsewhere) == before + 3, what="the ABORT marker")

    # the marker ended the partition's transaction: the next batch is verified again, and refused
    assert raw.produce(leader, "verify-raw", elsewhere, b"after-abort") == ErrorCode.INVALID_TXN_STATE
    assert log_end(leader, "verify-raw", elsewhere) == before + 3


def test_a_leader_without_verification_appends_as_before(cluster: Cluster) -> None:
    """transaction.partition.verification.enable=false on the leader: Kafka's behaviour before 3.6."""
    transactional_id, coordinator = verified_id(cluster)
    create_topic(cluster, "verify-off", [NOT_VERIFYING, coordinator])
    leader = cluster.brokers[NOT_VERIFYING]
    raw = RawProducer(cluster, transactional_id, coordinator)
    assert raw.add("verify-off", 1) == 0
    before = log_end(leader, "verify-off", 0)
    assert raw.produce(leader, "verify-off", 0, b"unverified") == 0
    assert log_end(leader, "verify-off", 0) == before + 1
    assert raw.end(committed=False) == 0  # its marker goes to partition 1 only: partition 0's transaction hangs


def test_a_transactional_producer_across_leaders_commits_and_aborts(cluster: Cluster) -> None:
    transactional_id, _ = verified_id(cluster)
    create_topic(cluster, "verify-eos", [1, 2, 3])
    txn = producer(cluster.bootstrap, transactional_id)
    txn.init_transactions(60)
    txn.begin_transaction()
    committed = produce(txn, "verify-eos", "c1", 3, 10)
    txn.commit_transaction(60)
    txn.begin_transaction()
    aborted = produce(txn, "verify-eos", "a2", 3, 10)
    txn.abort_transaction(60)
    txn.begin_transaction()
    committed += produce(txn, "verify-eos", "c3", 3, 10)
    txn.commit_transaction(60)
    read = read_committed(cluster.bootstrap, "verify-eos", 3, len(committed))
    assert sorted(read) == sorted(committed)
    assert not set(read) & set(aborted)
