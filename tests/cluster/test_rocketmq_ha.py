"""RocketMQ master/slave groups in a cluster (broker/rocketmq_groups.py): two `tidelog serve` brokers of the RocketMQ
engine sharing a brokerName, a real ZooKeeper, librdkafka clients. The group znode names the master and the
SyncStateSet; a topic with replication factor 2 is placed on the group and its partition states mirror it; the slave
refuses Produce; a SYNC_MASTER without a slave refuses acks=all with NOT_ENOUGH_REPLICAS; the master killed with
SIGKILL under acks=all idempotent producers is replaced by the slave with no acknowledged record lost or doubled,
and comes back as the new master's slave; the two CommitLogs are identical up to the shorter end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest
from cluster_checks import registered, wait_for
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from delivery_check import assert_delivery, make_value
from kazoo.client import KazooClient

import kafka_wire
from broker_process import BrokerProcess, tidelog_command
from tidelog.broker.read_replicas import RACK_AWARE_SELECTOR
from tidelog.codec.record_batch import Record, build_batch
from tidelog.protocol.messages import ApiKey
from zookeeper_process import SESSION_TIMEOUT_MS, ClusterBroker, ZooKeeperProcess

FAILOVER_S = SESSION_TIMEOUT_MS / 1000 + 30
NOT_LEADER_OR_FOLLOWER = 6
NOT_ENOUGH_REPLICAS = 19
FILE_SIZE = 1 << 20
GROUP = "g1"
HA = {
    "tidelog.storage.engine": "rocketmq",
    "tidelog.rocketmq.mapedFileSizeCommitLog": FILE_SIZE,
    "tidelog.rocketmq.mapedFileSizeConsumeQueue": 60_000,
    "tidelog.rocketmq.haEnable": "true",
    "tidelog.rocketmq.haListenHost": "127.0.0.1",
    "tidelog.rocketmq.haListenPort": 0,
    "tidelog.rocketmq.haSendHeartbeatInterval": 200,
    "tidelog.rocketmq.haHousekeepingInterval": 3000,
    "tidelog.rocketmq.brokerName": GROUP,
    "offsets.topic.num.partitions": 2,
    "group.initial.rebalance.delay.ms": 0,
}
KILLS = 2  # kill -9 of the master in `make test`, each followed by a promotion and the old master's return
LONG_KILLS = 100  # make test-rocketmq-ha-long


def group(zk: KazooClient) -> dict[str, Any]:
    return json.loads(zk.get(f"/tidelog/rocketmq/{GROUP}")[0])


def state(zk: KazooClient, topic: str, partition: int) -> dict[str, Any]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])


def start_group(
    cluster_broker: ClusterBroker,
    zk: KazooClient,
    role: str = "SYNC_MASTER",
    housekeeping_ms: int = 3000,
    extra: dict[int, dict[str, Any]] | None = None,
) -> dict[int, BrokerProcess]:
    config = {**HA, "tidelog.rocketmq.haHousekeepingInterval": housekeeping_ms}
    extra = extra or {}
    brokers = {1: cluster_broker(1, {**config, "tidelog.rocketmq.brokerRole": role, **extra.get(1, {})})}
    wait_for(lambda: zk.exists(f"/tidelog/rocketmq/{GROUP}") and group(zk)["master"] == 1, what="group with master 1")
    brokers[2] = cluster_broker(2, {**config, "tidelog.rocketmq.brokerRole": "SLAVE", **extra.get(2, {})})
    wait_for(lambda: registered(zk) == [1, 2], what="two registrations")
    wait_for(lambda: sorted(group(zk)["sync_state_set"]) == [1, 2], what="the slave in the SyncStateSet")
    return brokers


def create_topic(bootstrap: str, name: str, partitions: int, factor: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, factor)], operation_timeout=30).values():
        future.result(timeout=60)


def commitlog_bytes(broker: BrokerProcess) -> bytes:
    return b"".join(path.read_bytes() for path in sorted((broker.log_dir / "commitlog").iterdir()))


def written_end(data: bytes) -> int:
    """Where the messages end: RocketMQ's files are preallocated with zeros (TOTALSIZE 0 ends the walk)."""
    position = 0
    while position + 4 <= len(data):
        size = int.from_bytes(data[position : position + 4], "big")
        if size <= 0:
            file_end = (position // FILE_SIZE + 1) * FILE_SIZE
            if size == 0 or file_end >= len(data):
                break
            position = file_end  # a BLANK marker: the next file
            continue
        position += size
    return position


def produce(bootstrap: str, topic: str, values: list[bytes], acked: dict[int, list[tuple[int, bytes]]]) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
         "message.timeout.ms": 120_000}
    )  # fmt: skip

    def report(err: Any, msg: Any) -> None:
        if err is None:
            acked.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))

    for value in values:
        producer.produce(topic, value, on_delivery=report)
        producer.poll(0)
    assert producer.flush(150) == 0


def consume_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + 60
    while any((read[p][-1][0] + 1 if read[p] else 0) < ends[p] for p in read) and time.monotonic() < deadline:
        for message in consumer.consume(500, timeout=1):
            if message.error() is None:
                read[message.partition()].append((message.offset(), message.value()))
            else:
                assert message.error().code() == KafkaError._PARTITION_EOF or message.error().retriable()
    consumer.close()
    return read


def test_group_topic_slave_refuses_and_failover(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    run_failovers(cluster_broker, zk_client, KILLS)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # ~9 s a kill: 100 do not fit the suite's 300 s per test
def test_failover_long(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    run_failovers(cluster_broker, zk_client, LONG_KILLS)


def run_failovers(cluster_broker: ClusterBroker, zk_client: KazooClient, kills: int) -> None:
    brokers = start_group(cluster_broker, zk_client)
    described = group(zk_client)
    assert described["brokers"] == [1, 2] and described["master"] == 1 and described["master_role"] == "SYNC_MASTER"
    assert described["epoch_start_offset"] >= 0
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "orders", 2)
    topic = json.loads(zk_client.get("/brokers/topics/orders")[0])
    assert topic["partitions"] == {"0": [1, 2], "1": [1, 2]}  # the group's brokers, master first
    wait_for(lambda: zk_client.exists(f"/tidelog/rocketmq/{GROUP}/topics/orders"), what="the topic's creation offset")
    first = state(zk_client, "orders", 0)
    assert first["leader"] == 1 and sorted(first["isr"]) == [1, 2]
    assert kafka_wire.produce_error(brokers[2].bootstrap, "orders", 0) == NOT_LEADER_OR_FOLLOWER
    assert kafka_wire.fetch_error(brokers[2].bootstrap, "orders", 0) == NOT_LEADER_OR_FOLLOWER  # no slaveReadEnable

    acked: dict[int, list[tuple[int, bytes]]] = {}
    sequence = 0
    master, slave = 1, 2
    for kill in range(kills):
        values = [make_value("p", sequence + n, 200) for n in range(300)]
        sequence += len(values)
        produce(bootstrap, "orders", values, acked)
        epoch = group(zk_client)["master_epoch"]
        brokers[master].kill()
        wait_for(lambda s=slave: group(zk_client)["master"] == s, timeout_s=FAILOVER_S, what=f"broker {slave} master")
        promoted = group(zk_client)
        assert promoted["master_epoch"] == epoch + 1 and promoted["sync_state_set"] == [slave]
        wait_for(lambda s=slave: state(zk_client, "orders", 0)["leader"] == s, what="the partition state mirrored")
        assert state(zk_client, "orders", 0)["leader_epoch"] > first["leader_epoch"] + kill
        values = [make_value("p", sequence + n, 200) for n in range(100)]
        sequence += len(values)
        brokers[master].restart()  # it comes back as the new master's slave
        produce(bootstrap, "orders", values, acked)  # SYNC_MASTER: acknowledged once the returned slave has them
        wait_for(
            lambda s=slave, m=master: sorted(group(zk_client)["sync_state_set"]) == sorted([s, m]),
            timeout_s=FAILOVER_S,
            what="the old master back in the SyncStateSet as a slave",
        )
        master, slave = slave, master
    assert_delivery(acked, consume_all(bootstrap, "orders", 2))
    one, two = commitlog_bytes(brokers[1]), commitlog_bytes(brokers[2])
    end = min(written_end(one), written_end(two))
    assert end > 0 and one[:end] == two[:end]


def produce_unreplicated(bootstrap: str, topic: str, budget_s: float) -> int:
    """acks=1 Produce requests of ~0.5 MB for `budget_s` (a SYNC_MASTER answers them after its own write); returns
    how many bytes of values were written."""
    written, sequence = 0, 0
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        records = [Record(make_value("u", sequence + n, 1000)) for n in range(500)]
        sequence += len(records)
        body = {
            "transactional_id": None, "acks": 1, "timeout": 5_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": build_batch(records)}]}],
        }  # fmt: skip
        response = kafka_wire.request(bootstrap, ApiKey.PRODUCE, kafka_wire.PRODUCE_VERSION, body)
        assert response.responses[0].partition_responses[0].error_code == 0
        written += 500 * 1000
    return written


def test_old_master_with_extra_records_is_cut_and_follows(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    """The master takes records its slave never receives (the slave process stopped, for less than its ZooKeeper
    session and haHousekeepingInterval, so it stays electable), is killed, the slave is promoted; the old master
    comes back, cuts its CommitLog at the new epoch's start and follows: files identical, every acks=all record
    acknowledged under SYNC_MASTER read back once."""
    brokers = start_group(cluster_broker, zk_client, housekeeping_ms=10_000)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "extra", 1)
    acked: dict[int, list[tuple[int, bytes]]] = {}
    produce(bootstrap, "extra", [make_value("p", n, 200) for n in range(300)], acked)
    os.kill(brokers[2].pid, signal.SIGSTOP)
    try:
        produce_unreplicated(brokers[1].bootstrap, "extra", 1.5)
        brokers[1].kill()
    finally:
        os.kill(brokers[2].pid, signal.SIGCONT)
    old_end = written_end(commitlog_bytes(brokers[1]))
    wait_for(lambda: group(zk_client)["master"] == 2, timeout_s=FAILOVER_S, what="broker 2 master")
    wait_for(lambda: group(zk_client)["epoch_start_offset"] >= 0, what="the new epoch's start offset")
    start = group(zk_client)["epoch_start_offset"]
    assert start < old_end, "the old master must hold records its slave never received"
    brokers[1].restart()
    wait_for(lambda: sorted(group(zk_client)["sync_state_set"]) == [1, 2], timeout_s=FAILOVER_S, what="rejoined")
    produce(bootstrap, "extra", [make_value("p", 300 + n, 200) for n in range(300)], acked)
    assert f"cut from {old_end}" in brokers[1].stderr_text()
    assert_delivery(acked, consume_all(bootstrap, "extra", 1))
    wait_for(
        lambda: written_end(commitlog_bytes(brokers[1])) == written_end(commitlog_bytes(brokers[2])),
        what="the old master caught up",
    )
    one, two = commitlog_bytes(brokers[1]), commitlog_bytes(brokers[2])
    end = written_end(two)
    assert end > start and one[:end] == two[:end]


def test_slave_reads_and_tools(
    cluster_broker: ClusterBroker, zk_client: KazooClient, zookeeper: ZooKeeperProcess
) -> None:
    """KIP-392 with slaveReadEnable: the master sends a consumer whose client.rack is the slave's broker.rack to
    the slave (preferred_read_replica), which serves it every record; a consumer in another rack reads from the
    master. Then `tidelog rocketmq ha-status` shows the slave in sync without lag, `tidelog dump-commitlog` prints
    the same messages from both stores, and `tidelog rocketmq switch-role` makes the slave master (refusing a
    broker that is not a member) with every acknowledged record kept."""
    reads = {"tidelog.rocketmq.slaveReadEnable": "true", "replica.selector.class": RACK_AWARE_SELECTOR}
    brokers = start_group(
        cluster_broker, zk_client, extra={1: {**reads, "broker.rack": "r1"}, 2: {**reads, "broker.rack": "r2"}}
    )
    create_topic(brokers[1].bootstrap, "near", 1)
    acked: dict[int, list[tuple[int, bytes]]] = {}
    produce(brokers[1].bootstrap, "near", [make_value("p", n, 100) for n in range(500)], acked)
    assert kafka_wire.fetch_error(brokers[2].bootstrap, "near", 0) == 0  # the slave serves consumers
    for rack, reader in (("r2", 2), ("r1", 1)):
        fetched_from: list[int] = []

        def stats(text: str, fetched_from: list[int] = fetched_from) -> None:
            partition = json.loads(text)["topics"].get("near", {}).get("partitions", {}).get("0")
            if partition is not None:
                fetched_from.append(partition["broker"])

        consumer = Consumer(
            {"bootstrap.servers": brokers[1].bootstrap, "group.id": f"near-{rack}", "client.rack": rack,
             "auto.offset.reset": "earliest", "statistics.interval.ms": 200, "stats_cb": stats}
        )  # fmt: skip
        consumer.assign([TopicPartition("near", 0, 0)])
        read: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(read) < 500 and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    read.append((message.offset(), message.value()))
        deadline = time.monotonic() + 5
        while not fetched_from and time.monotonic() < deadline:
            consumer.poll(0.2)
        consumer.close()
        assert read == acked[0]
        assert fetched_from and fetched_from[-1] == reader, f"rack {rack}: fetched from {fetched_from}"

    # the tools: ha-status, dump-commitlog on the slave's store, switch-role
    def status() -> dict[int, dict[str, Any]]:
        out = tidelog("rocketmq", "ha-status", "--zookeeper", zookeeper.connect, "--json")
        return {row["broker"]: row for row in json.loads(out)}

    wait_for(lambda: status()[2]["lag_bytes"] == 0 and status()[1]["commitlog_end"] > 0, what="ha-status: no lag")
    rows = status()
    assert (rows[1]["role"], rows[2]["role"], rows[2]["in_sync"], rows[2]["live"]) == ("master", "slave", True, True)
    dumps = [
        [line for line in tidelog("dump-commitlog", "--store", str(b.log_dir)).splitlines() if "Dumping" not in line]
        for b in brokers.values()
    ]
    assert len(dumps[0]) > 500 and dumps[0] == dumps[1]
    assert "not a member" in tidelog("rocketmq", "switch-role", "--zookeeper", zookeeper.connect, "--broker-name",
                                     GROUP, "--master", "3", code=2)  # fmt: skip
    epoch = group(zk_client)["master_epoch"]
    tidelog("rocketmq", "switch-role", "--zookeeper", zookeeper.connect, "--broker-name", GROUP, "--master", "2")
    assert group(zk_client)["master"] == 2 and group(zk_client)["master_epoch"] == epoch + 1
    wait_for(lambda: state(zk_client, "near", 0)["leader"] == 2, what="the partition led by the new master")
    produce(brokers[1].bootstrap, "near", [make_value("p", 500 + n, 100) for n in range(200)], acked)
    wait_for(lambda: sorted(group(zk_client)["sync_state_set"]) == [1, 2], what="the old master in sync again")
    assert_delivery(acked, consume_all(brokers[1].bootstrap, "near", 1))


def tidelog(*args: str, code: int = 0) -> str:
    """Run a tidelog command; its stdout (stderr when it is expected to fail)."""
    result = subprocess.run([*tidelog_command(), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stderr
    return result.stdout if code == 0 else result.stderr


def test_sync_master_without_slave_refuses_acks_all(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    brokers = {1: cluster_broker(1, {**HA, "tidelog.rocketmq.brokerRole": "SYNC_MASTER"})}
    wait_for(lambda: zk_client.exists(f"/tidelog/rocketmq/{GROUP}") and group(zk_client)["master"] == 1, what="group")
    create_topic(brokers[1].bootstrap, "lonely", 1, factor=1)
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5_000,
        "topic_data": [{"name": "lonely", "partition_data": [{"index": 0, "records": build_batch([Record(b"x")])}]}],
    }
    response = kafka_wire.request(brokers[1].bootstrap, ApiKey.PRODUCE, kafka_wire.PRODUCE_VERSION, body)
    assert response.responses[0].partition_responses[0].error_code == NOT_ENOUGH_REPLICAS
    assert kafka_wire.produce_error(brokers[1].bootstrap, "lonely", 0) == 0  # acks=1 is answered after the write


def commit_offset(bootstrap: str, topic: str, group_id: str, offset: int) -> None:
    """Commit `offset` of partition 0 for `group_id` (synchronously, as a member of the group) and read it back."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + FAILOVER_S
        while True:
            try:
                consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
                break
            except Exception as exc:  # the coordinator may be moving: librdkafka raises the retriable error
                if time.monotonic() > deadline:
                    raise AssertionError(f"commit of {group_id} failed: {exc}") from exc
                time.sleep(0.2)
        assert committed(consumer, topic) == offset
    finally:
        consumer.close()


def committed(consumer: Consumer, topic: str) -> int:
    return int(consumer.committed([TopicPartition(topic, 0)], timeout=30)[0].offset)


def transactional_produce(bootstrap: str, topic: str, values: list[bytes], commit: bool) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 2})
    producer.init_transactions(60)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value)
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


def read_committed(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"rc-{time.monotonic_ns()}", "isolation.level": "read_committed",
         "enable.auto.commit": False, "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error() is not None:
            if message.error().code() == KafkaError._PARTITION_EOF:
                break
            continue
        values.append(message.value())
    consumer.close()
    return values


def test_consumer_groups_and_transactions_on_a_group(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    """`__consumer_offsets` and `__transaction_state` are placed on the group (its master leads every partition):
    offsets are committed, transactions commit and abort, before and after the master's failover."""
    brokers = start_group(cluster_broker, zk_client)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    create_topic(brokers[1].bootstrap, "work", 1, factor=1)
    assert json.loads(zk_client.get("/brokers/topics/work")[0])["partitions"] == {"0": [1, 2]}  # the whole group
    commit_offset(bootstrap, "work", "members", 7)
    offsets = json.loads(zk_client.get("/brokers/topics/__consumer_offsets")[0])["partitions"]
    assert set(map(tuple, offsets.values())) == {(1, 2)}
    transactional_produce(bootstrap, "work", [b"c1", b"c2"], commit=True)
    transactional_produce(bootstrap, "work", [b"a1"], commit=False)
    states = json.loads(zk_client.get("/brokers/topics/__transaction_state")[0])["partitions"]
    assert set(map(tuple, states.values())) == {(1, 2)}
    assert read_committed(bootstrap, "work") == [b"c1", b"c2"]

    brokers[1].kill()
    wait_for(lambda: group(zk_client)["master"] == 2, timeout_s=FAILOVER_S, what="broker 2 master")
    consumer = Consumer({"bootstrap.servers": brokers[2].bootstrap, "group.id": "members"})
    wait_for(lambda: committed(consumer, "work") == 7, timeout_s=FAILOVER_S, what="the commit kept")
    consumer.close()
    brokers[1].restart()
    wait_for(lambda: sorted(group(zk_client)["sync_state_set"]) == [1, 2], timeout_s=FAILOVER_S, what="rejoined")
    commit_offset(bootstrap, "work", "members", 9)
    transactional_produce(bootstrap, "work", [b"c3"], commit=True)
    assert read_committed(bootstrap, "work") == [b"c1", b"c2", b"c3"]
