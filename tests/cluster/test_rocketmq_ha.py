"""RocketMQ master/slave groups in a cluster (broker/rocketmq_groups.py): `tidelog serve` brokers of the RocketMQ
engine sharing a brokerName, a real ZooKeeper, librdkafka clients.

One cluster serves the module (module-scoped fixtures, the tests run in file order and each leaves every broker up):
a group of three - broker 1 SYNC_MASTER, brokers 2 and 3 SLAVE, racks r1-r3, reads from slaves enabled on 1 and 3.
The tests: topics placed on the whole group with partition states mirroring it; the slave refuses Produce (and
Fetch without slaveReadEnable); KIP-392 reads from the slave in the consumer's rack; ElectLeaders and
CreatePartitions on group partitions; the master killed with SIGKILL KILLS times under acks=all idempotent
producers while each killed broker restarts in the background - no acknowledged record lost or doubled, offsets
committed and transactions before and after, the three CommitLogs identical up to the shortest end; a slave killed
mid-file and one whose store was wiped catch up; a returning old master with records its slaves never received
cuts them; the tools (ha-status, dump-commitlog, switch-role). Last, a lone SYNC_MASTER of its own group refuses
acks=all with NOT_ENOUGH_REPLICAS."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from cluster_checks import registered, wait_for
from confluent_kafka import Consumer, ElectionType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from delivery_check import assert_delivery, make_value
from kazoo.client import KazooClient

import kafka_wire
from broker_process import ROCKETMQ_IGNORE_DISK_USAGE, BrokerFactory, BrokerProcess, tidelog_command
from tidelog.broker.read_replicas import RACK_AWARE_SELECTOR
from tidelog.codec.record_batch import Record, build_batch
from tidelog.protocol.messages import ApiKey
from zookeeper_process import SESSION_TIMEOUT_MS, ZooKeeperProcess, zookeeper_missing

# the cluster suites' 4 s less one: a killed master is replaced a second sooner, and ten kills fit in ~50 s
SESSION_MS = SESSION_TIMEOUT_MS - 1000
FAILOVER_S = SESSION_MS / 1000 + 30
NOT_LEADER_OR_FOLLOWER = 6
NOT_ENOUGH_REPLICAS = 19
PREFERRED_LEADER_NOT_AVAILABLE = 80
ELECTION_NOT_NEEDED = 84
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
    # a slave stopped (SIGSTOP) for a few seconds stays in the SyncStateSet (test_old_master_...)
    "tidelog.rocketmq.haHousekeepingInterval": 6000,
    "tidelog.rocketmq.brokerName": GROUP,
    # the machine's disk is shared: other users' files must not make retention delete this module's CommitLog
    # files (a slave would then need offsets its master no longer holds)
    **ROCKETMQ_IGNORE_DISK_USAGE,
    "offsets.topic.num.partitions": 2,
    "transaction.state.log.num.partitions": 2,
    "group.initial.rebalance.delay.ms": 0,
    "replica.selector.class": RACK_AWARE_SELECTOR,
    "zookeeper.session.timeout.ms": SESSION_MS,
    "controlled.shutdown.retry.backoff.ms": 500,
}
READS = {"tidelog.rocketmq.slaveReadEnable": "true"}
KILLS = 10  # kill -9 of the master in `make test`
LONG_KILLS = int(os.environ.get("TIDELOG_ROCKETMQ_HA_KILLS", "100"))  # make test-rocketmq-ha-long


class Cluster:
    """The module's ZooKeeper and group of three; `brokers` by id."""

    def __init__(self, zookeeper: ZooKeeperProcess, zk: KazooClient, factory: BrokerFactory) -> None:
        self.zookeeper = zookeeper
        self.zk = zk
        self.factory = factory
        self.brokers: dict[int, BrokerProcess] = {}
        # restarts in the background run on this one long-lived thread: a broker dies with the thread that started
        # it (PR_SET_PDEATHSIG is per thread), so never from a thread that ends while the broker should live
        self.launcher = ThreadPoolExecutor(1, thread_name_prefix="broker-launcher")

    def start(self, broker_id: int, overrides: dict[str, Any]) -> BrokerProcess:
        broker = self.factory({**HA, "broker.id": broker_id, "zookeeper.connect": self.zookeeper.connect, **overrides})
        self.brokers[broker_id] = broker
        return broker

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.running)

    def group(self, name: str = GROUP) -> dict[str, Any]:
        return json.loads(self.zk.get(f"/tidelog/rocketmq/{name}")[0])

    def state(self, topic: str, partition: int) -> dict[str, Any]:
        return json.loads(self.zk.get(f"/brokers/topics/{topic}/partitions/{partition}/state")[0])

    def replicas(self, topic: str) -> dict[str, list[int]]:
        return dict(json.loads(self.zk.get(f"/brokers/topics/{topic}")[0])["partitions"])

    def in_sync(self) -> None:
        wait_for(
            lambda: all(b.running for b in self.members()) and sorted(self.group()["sync_state_set"]) == [1, 2, 3],
            timeout_s=FAILOVER_S,
            what="the whole group in the SyncStateSet",
        )

    def members(self) -> list[BrokerProcess]:
        return [self.brokers[b] for b in (1, 2, 3)]

    def master(self) -> int:
        return int(self.group()["master"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = zookeeper_missing()
    if missing:
        pytest.skip(missing)
    base = tmp_path_factory.mktemp("rocketmq-ha")
    server = ZooKeeperProcess(base / "zookeeper").start()
    zk = KazooClient(hosts=server.connect, connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2})
    zk.start(timeout=30)
    factory = BrokerFactory(base / "brokers")
    cluster = Cluster(server, zk, factory)
    try:
        cluster.start(1, {"tidelog.rocketmq.brokerRole": "SYNC_MASTER", "broker.rack": "r1", **READS})
        wait_for(lambda: zk.exists(f"/tidelog/rocketmq/{GROUP}") and cluster.master() == 1, what="master 1")
        cluster.start(2, {"tidelog.rocketmq.brokerRole": "SLAVE", "broker.rack": "r2"})
        cluster.start(3, {"tidelog.rocketmq.brokerRole": "SLAVE", "broker.rack": "r3", **READS})
        wait_for(lambda: registered(zk) == [1, 2, 3], what="three registrations")
        cluster.in_sync()
        yield cluster
    finally:
        factory.close_all()
        cluster.launcher.shutdown(wait=True)
        zk.stop()
        zk.close()
        server.stop()


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


class SteadyProducer:
    """An acks=all idempotent producer writing `make_value(name, n)` to `topic` at a steady pace on a thread of
    its own until `stop()`, which flushes; `acked` as delivery_check wants it, `count` the acknowledgements."""

    def __init__(self, bootstrap: str, topic: str, name: str, per_tick: int = 20, tick_s: float = 0.05) -> None:
        self.acked: dict[int, list[tuple[int, bytes]]] = {}
        self.count = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
             "message.timeout.ms": 300_000}
        )  # fmt: skip
        self._args = (topic, name, per_tick, tick_s)
        self._unflushed = -1
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _report(self, err: Any, msg: Any) -> None:
        if err is None:
            with self._lock:
                self.acked.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))
                self.count += 1
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        topic, name, per_tick, tick_s = self._args
        sequence = 0
        while not self._stop.is_set():
            if len(self._producer) < 20 * per_tick:
                for _ in range(per_tick):
                    self._producer.produce(topic, make_value(name, sequence, 100), on_delivery=self._report)
                    sequence += 1
            self._producer.poll(tick_s)
        self._unflushed = self._producer.flush(300)

    def wait_progress(self, records: int, what: str) -> None:
        start = self.count
        wait_for(lambda: self.count >= start + records, timeout_s=FAILOVER_S, what=what)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(330)
        assert self._unflushed == 0 and not self.errors, f"unacknowledged: {self._unflushed}, {self.errors[:3]}"


def wait_identical(members: list[BrokerProcess]) -> None:
    """Every member's CommitLog written to the same end, and identical up to it."""
    wait_for(
        lambda: len({written_end(commitlog_bytes(b)) for b in members}) == 1,
        timeout_s=FAILOVER_S,
        what="the members' CommitLogs at one end",
    )
    files = [commitlog_bytes(b) for b in members]
    end = min(written_end(f) for f in files)
    assert end > 0 and all(f[:end] == files[0][:end] for f in files)


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
        producer.produce(topic, value, partition=0)
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


def read_committed(bootstrap: str, topic: str) -> list[bytes]:
    """Partition 0 of `topic` read to its end with isolation.level read_committed."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"rc-{time.monotonic_ns()}", "isolation.level": "read_committed",
         "enable.auto.commit": False, "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        messages = consumer.consume(500, timeout=0.5)
        if any(m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF for m in messages):
            values += [m.value() for m in messages if m.error() is None]
            break
        values += [m.value() for m in messages if m.error() is None]
    consumer.close()
    return values


def produce_unreplicated(bootstrap: str, topic: str, requests: int) -> None:
    """`requests` acks=1 Produce requests of ~0.5 MB to partition 0 (a SYNC_MASTER answers them after its own
    write)."""
    for request in range(requests):
        records = [Record(make_value("u", request * 500 + n, 1000)) for n in range(500)]
        body = {
            "transactional_id": None, "acks": 1, "timeout": 5_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": build_batch(records)}]}],
        }  # fmt: skip
        response = kafka_wire.request(bootstrap, ApiKey.PRODUCE, kafka_wire.PRODUCE_VERSION, body)
        assert response.responses[0].partition_responses[0].error_code == 0


def tidelog(*args: str, code: int = 0) -> str:
    """Run a tidelog command; its stdout (stderr when it is expected to fail)."""
    result = subprocess.run([*tidelog_command(), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stderr
    return result.stdout if code == 0 else result.stderr


def test_placement_slave_refuses_and_reads(cluster: Cluster) -> None:
    """A topic is placed on the whole group (factor 2 raised to the group's 3), master first, and its partition
    states mirror the group; the slave without slaveReadEnable refuses Produce and Fetch, slave 3 (slaveReadEnable)
    serves consumers; KIP-392 on the wire: the master sends a Fetch from rack r3 to slave 3 (no records), serves one
    from r1 itself, and one from r2 too (slave 2 does not serve consumers); `ha-status` shows the slaves in sync,
    `dump-commitlog` the same messages in every store."""
    described = cluster.group()
    assert described["brokers"] == [1, 2, 3] and described["master"] == 1 and described["master_role"] == "SYNC_MASTER"
    brokers = cluster.brokers
    create_topic(brokers[1].bootstrap, "near", 1)
    assert cluster.replicas("near") == {"0": [1, 2, 3]}
    wait_for(lambda: cluster.zk.exists(f"/tidelog/rocketmq/{GROUP}/topics/near"), what="the topic's creation offset")
    wait_for(  # the controller mirrors the group into the new partition's state
        lambda: (state := cluster.state("near", 0))["leader"] == 1 and sorted(state["isr"]) == [1, 2, 3],
        what="the partition state mirroring the group",
    )
    assert kafka_wire.produce_error(brokers[2].bootstrap, "near", 0) == NOT_LEADER_OR_FOLLOWER
    assert kafka_wire.produce_error(brokers[3].bootstrap, "near", 0) == NOT_LEADER_OR_FOLLOWER
    assert kafka_wire.fetch_error(brokers[2].bootstrap, "near", 0) == NOT_LEADER_OR_FOLLOWER  # no slaveReadEnable
    acked: dict[int, list[tuple[int, bytes]]] = {}
    produce(brokers[1].bootstrap, "near", [make_value("p", n, 100) for n in range(500)], acked)
    assert kafka_wire.fetch_error(brokers[3].bootstrap, "near", 0) == 0  # slaveReadEnable: it serves consumers

    def status() -> dict[int, dict[str, Any]]:
        out = tidelog("rocketmq", "ha-status", "--zookeeper", cluster.zookeeper.connect, "--json")
        return {row["broker"]: row for row in json.loads(out)}

    # the master sends a consumer to a slave in its rack only while that slave is in sync (a loaded machine can keep
    # one behind for a while, and the master then serves the records itself)
    wait_for(
        lambda: (rows := status())[2]["lag_bytes"] == 0 and rows[3]["lag_bytes"] == 0 and rows[1]["commitlog_end"] > 0,
        what="ha-status: no lag",
    )
    wait_for(lambda: 3 in cluster.group()["sync_state_set"], what="slave 3 in the SyncStateSet")

    def answer(bootstrap: str, rack: str) -> tuple[int, int, int]:
        """(error, preferred read replica, records' bytes) of a Fetch from offset 0 by a consumer in `rack`."""
        partition = kafka_wire.fetch_partition(bootstrap, "near", 0, rack=rack)
        return partition.error_code, partition.preferred_read_replica, len(partition.records or b"")

    # the master's view of the ISR (its metadata cache) follows the partition state: wait for it to send r3 away
    wait_for(lambda: answer(brokers[1].bootstrap, "r3")[1] == 3, what="the master sending rack r3 to slave 3")
    assert answer(brokers[1].bootstrap, "r3") == (0, 3, 0)
    for rack in ("r1", "r2", ""):
        error, preferred, size = answer(brokers[1].bootstrap, rack)
        assert (error, preferred) == (0, -1) and size > 0, rack
    error, preferred, size = answer(brokers[3].bootstrap, "r3")
    assert (error, preferred) == (0, -1) and size > 0  # the slave serves it

    rows = status()
    assert [rows[b]["role"] for b in (1, 2, 3)] == ["master", "slave", "slave"]
    assert all(rows[b]["in_sync"] and rows[b]["live"] for b in (2, 3))
    dumps = [
        [line for line in tidelog("dump-commitlog", "--store", str(b.log_dir)).splitlines() if "Dumping" not in line]
        for b in cluster.members()
    ]
    assert len(dumps[0]) > 500 and dumps[0] == dumps[1] == dumps[2]


def test_a_consumer_in_a_slaves_rack_reads_from_that_slave(cluster: Cluster) -> None:
    """KIP-392: the master sends a consumer in rack r3 to slave 3 (slaveReadEnable), which serves it every record, and
    one in rack r1 reads from the master (librdkafka end to end; the placement test checks the choice on the wire)."""
    brokers = cluster.brokers
    create_topic(brokers[1].bootstrap, "near-rack", 1)
    wait_for(
        lambda: (state := cluster.state("near-rack", 0))["leader"] == 1 and sorted(state["isr"]) == [1, 2, 3],
        what="the partition state mirroring the group",
    )
    acked: dict[int, list[tuple[int, bytes]]] = {}
    produce(brokers[1].bootstrap, "near-rack", [make_value("p", n, 100) for n in range(500)], acked)

    def read_near(rack: str, attempt: int) -> list[int]:
        """A fresh consumer in `rack` reads the partition whole; the brokers its statistics say it fetched from."""
        fetched_from: list[int] = []

        def stats(text: str) -> None:
            partition = json.loads(text)["topics"].get("near-rack", {}).get("partitions", {}).get("0")
            if partition is not None:
                fetched_from.append(partition["broker"])

        consumer = Consumer(
            {"bootstrap.servers": brokers[1].bootstrap, "group.id": f"near-{rack}-{attempt}", "client.rack": rack,
             "auto.offset.reset": "earliest", "statistics.interval.ms": 200, "stats_cb": stats}
        )  # fmt: skip
        consumer.assign([TopicPartition("near-rack", 0, 0)])
        read: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(read) < 500 and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    read.append((message.offset(), message.value()))
        # a statistics sample is made every 200 ms and handed over at a later poll, so the samples seen while
        # reading may predate the move to the preferred replica: the second one from here on was made after the
        # read (a stale last sample made this test fail in about two runs of three)
        fetched_from.clear()
        deadline = time.monotonic() + 5
        while len(fetched_from) < 2 and time.monotonic() < deadline:
            consumer.poll(0.2)
        consumer.close()
        assert read == acked[0]
        return fetched_from

    # the master's choice follows its own view of the partition's ISR (the SyncStateSet mirrored into the partition
    # state, then into each broker's metadata cache): a consumer that came before that view caught up was served by
    # the master; a later one must be sent to the slave in its rack
    for rack, reader in (("r3", 3), ("r1", 1)):
        deadline = time.monotonic() + 30
        attempt = 0
        while (fetched_from := read_near(rack, attempt))[-1:] != [reader] and time.monotonic() < deadline:
            attempt += 1
        assert fetched_from and fetched_from[-1] == reader, f"rack {rack}: fetched from {fetched_from} ({attempt})"


def test_elect_leaders_and_create_partitions_on_group_partitions(cluster: Cluster) -> None:
    """ElectLeaders never moves a group partition's leadership behind the group's back: PREFERRED answers
    ELECTION_NOT_NEEDED where the master is the first replica, PREFERRED_LEADER_NOT_AVAILABLE where it is not, and
    the states stay as the group makes them. CreateTopics and CreatePartitions with an explicit assignment that is
    not a group's brokers are INVALID_REPLICA_ASSIGNMENT; one that is a group's brokers (in any order) is taken."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    master = cluster.master()
    others = [b for b in (1, 2, 3) if b != master]
    topics = [
        NewTopic("led", 1, replica_assignment=[[master, *others]]),
        NewTopic("elsewhere", 1, replica_assignment=[[others[0], master, others[1]]]),
    ]
    for future in admin.create_topics(topics, operation_timeout=30).values():
        future.result(60)
    refused = admin.create_topics([NewTopic("stray", 1, replica_assignment=[[master]])], operation_timeout=30)
    with pytest.raises(KafkaException) as error:
        refused["stray"].result(60)
    assert error.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    wait_for(lambda: cluster.state("elsewhere", 0)["leader"] == master, what="the master leading")
    before = cluster.state("elsewhere", 0)
    wanted = [TopicPartition("led", 0), TopicPartition("elsewhere", 0)]
    answer = {tp.topic: e for tp, e in admin.elect_leaders(ElectionType.PREFERRED, wanted).result(30).items()}
    assert answer["led"] is not None and answer["led"].code() == ELECTION_NOT_NEEDED
    assert answer["elsewhere"] is not None and answer["elsewhere"].code() == PREFERRED_LEADER_NOT_AVAILABLE
    assert cluster.state("elsewhere", 0) == before

    grown = admin.create_partitions([NewPartitions("led", 2, replica_assignment=[[others[0]]])])
    with pytest.raises(KafkaException) as error:
        grown["led"].result(60)
    assert error.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    admin.create_partitions([NewPartitions("led", 2, replica_assignment=[[*others, master]])])["led"].result(60)
    admin.create_partitions([NewPartitions("led", 3)])["led"].result(60)
    replicas = cluster.replicas("led")
    assert replicas["1"] == [*others, master] and sorted(replicas["2"]) == [1, 2, 3]
    wait_for(lambda: all(cluster.state("led", p)["leader"] == master for p in (1, 2)), what="new partitions led")


def test_master_killed_under_load(cluster: Cluster) -> None:
    """KILLS times: kill -9 of the master while an acks=all idempotent producer writes; the controller elects a
    slave of the SyncStateSet, produce goes on there while the killed broker restarts in the background (it comes
    back as a slave and cuts what it alone held), and the next kill needs only another member in the SyncStateSet,
    not the restarted one. Offsets committed and a transaction before the kills are there after them, and both work
    on the last master. No acknowledged record lost or doubled; the CommitLogs identical."""
    run_failovers(cluster, KILLS)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # ~5 s a kill: 100 do not fit the suite's 300 s per test
def test_master_killed_under_load_long(cluster: Cluster) -> None:
    run_failovers(cluster, LONG_KILLS)


def run_failovers(cluster: Cluster, kills: int) -> None:
    create_topic(cluster.bootstrap, "orders", 2)
    assert all(sorted(replicas) == [1, 2, 3] for replicas in cluster.replicas("orders").values())
    commit_offset(cluster.bootstrap, "orders", "members", 7)
    transactional_produce(cluster.bootstrap, "orders", [make_value("t", 0), make_value("t", 1)], commit=True)
    producer = SteadyProducer(cluster.bootstrap, "orders", "p")
    restarts: dict[int, Future[None]] = {}
    started = time.monotonic()
    try:
        for kill in range(kills):
            producer.wait_progress(100, f"acknowledgements before kill {kill + 1}")
            before = cluster.group()
            master = before["master"]
            wait_for(
                lambda m=master: any(b != m and b in registered(cluster.zk) for b in cluster.group()["sync_state_set"]),
                timeout_s=FAILOVER_S,
                what=f"a live slave in the SyncStateSet before kill {kill + 1}",
            )
            epoch = cluster.group()["master_epoch"]
            if master in restarts:
                restarts.pop(master).result()
            cluster.brokers[master].kill()
            wait_for(
                lambda m=master: cluster.group()["master"] not in (m, -1), timeout_s=FAILOVER_S, what="a new master"
            )
            after = cluster.group()
            # elected with a SyncStateSet of itself; the slaves in sync may have rejoined it by the time this reads
            assert after["master_epoch"] == epoch + 1 and after["master"] in after["sync_state_set"]
            assert master not in after["sync_state_set"]
            restarts[master] = cluster.launcher.submit(cluster.brokers[master].restart)
            producer.wait_progress(100, f"acknowledgements from the new master {after['master']}")
        print(f"{kills} kills in {time.monotonic() - started:.1f} s")
    finally:
        producer.stop()
        for restart in restarts.values():
            restart.result()
    cluster.in_sync()
    wait_for(lambda: cluster.state("orders", 0)["leader"] == cluster.master(), what="the partition state mirrored")
    read = consume_all(cluster.bootstrap, "orders", 2)
    assert_delivery(producer.acked, {p: [r for r in records if r[1].startswith(b"p:")] for p, records in read.items()})
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "members"})
    wait_for(lambda: committed(consumer, "orders") == 7, timeout_s=FAILOVER_S, what="the commit kept")
    consumer.close()
    commit_offset(cluster.bootstrap, "orders", "members", 9)
    transactional_produce(cluster.bootstrap, "orders", [make_value("t", 2)], commit=True)
    committed_values = [v for v in read_committed(cluster.bootstrap, "orders") if v.startswith(b"t:")]
    assert committed_values == [make_value("t", n) for n in range(3)]
    wait_identical(cluster.members())


def test_slave_killed_mid_file_catches_up(cluster: Cluster) -> None:
    """A slave killed with SIGKILL (its CommitLog ends inside a file) and restarted once the master has gone on to
    later files continues from where it stopped: files identical."""
    cluster.in_sync()
    master = cluster.master()
    slave = cluster.brokers[max(b for b in (1, 2, 3) if b != master)]
    create_topic(cluster.bootstrap, "bulk", 1)
    produce_unreplicated(cluster.brokers[master].bootstrap, "bulk", 3)
    wait_for(
        lambda: written_end(commitlog_bytes(slave)) == written_end(commitlog_bytes(cluster.brokers[master])),
        what="the slave level with its master",
    )
    slave.kill()
    held = written_end(commitlog_bytes(slave))
    assert held % FILE_SIZE != 0, "the slave should have stopped inside a file"
    produce_unreplicated(cluster.brokers[master].bootstrap, "bulk", 5)
    assert written_end(commitlog_bytes(cluster.brokers[master])) // FILE_SIZE > held // FILE_SIZE
    slave.restart()
    wait_identical(cluster.members())
    assert f"from CommitLog offset {held}" in slave.stderr_text()


def test_wiped_slave_copies_everything_again(cluster: Cluster) -> None:
    """A slave stopped, its log dir emptied and started again copies the master's whole CommitLog: files
    identical, and it serves the topics' records as before (it rejoins the SyncStateSet)."""
    cluster.in_sync()
    master = cluster.master()
    slave = cluster.brokers[min(b for b in (1, 2, 3) if b != master)]
    slave.stop()
    shutil.rmtree(slave.log_dir)
    slave.log_dir.mkdir()
    slave.restart()
    cluster.in_sync()
    wait_identical(cluster.members())
    assert written_end(commitlog_bytes(slave)) > FILE_SIZE


def test_old_master_with_extra_records_is_cut_and_follows(cluster: Cluster) -> None:
    """The master takes records its slaves never receive (both processes stopped, for less than their ZooKeeper
    session and haHousekeepingInterval, so they stay electable) - acks=1 writes, answered, and an acks=all one, not
    answered while no slave can copy it (SYNC_MASTER) - is killed, a slave is promoted; the old master comes back,
    cuts its CommitLog at the new epoch's start and follows: files identical, every acks=all record acknowledged
    under SYNC_MASTER read back once."""
    cluster.in_sync()
    master = cluster.master()
    slaves = [cluster.brokers[b] for b in (1, 2, 3) if b != master]
    old = cluster.brokers[master]
    create_topic(cluster.bootstrap, "extra", 1)
    acked: dict[int, list[tuple[int, bytes]]] = {}
    produce(cluster.bootstrap, "extra", [make_value("p", n, 200) for n in range(300)], acked)
    unanswered = build_batch([Record(make_value("w", 0))])
    waiting = {
        "transactional_id": None, "acks": -1, "timeout": 30_000,
        "topic_data": [{"name": "extra", "partition_data": [{"index": 0, "records": unanswered}]}],
    }  # fmt: skip
    for slave in slaves:
        os.kill(slave.pid, signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError):  # no answer: the acknowledgement waits for a slave to have the record
            kafka_wire.request(old.bootstrap, ApiKey.PRODUCE, kafka_wire.PRODUCE_VERSION, waiting, timeout_s=0.8)
        produce_unreplicated(old.bootstrap, "extra", 2)
        old.kill()
    finally:
        for slave in slaves:
            os.kill(slave.pid, signal.SIGCONT)
    old_end = written_end(commitlog_bytes(old))
    wait_for(lambda: cluster.group()["master"] not in (master, -1), timeout_s=FAILOVER_S, what="a new master")
    wait_for(lambda: cluster.group()["epoch_start_offset"] >= 0, what="the new epoch's start offset")
    start = cluster.group()["epoch_start_offset"]
    assert start < old_end, "the old master must hold records its slaves never received"
    old.restart()
    cluster.in_sync()
    produce(cluster.bootstrap, "extra", [make_value("p", 300 + n, 200) for n in range(300)], acked)
    assert f"cut from {old_end}" in old.stderr_text()
    assert_delivery(acked, consume_all(cluster.bootstrap, "extra", 1))
    wait_identical(cluster.members())


def test_switch_role(cluster: Cluster) -> None:
    """`tidelog rocketmq switch-role` makes a slave of the SyncStateSet master (refusing a broker that is not a
    member), with every acknowledged record kept and the old master following it."""
    cluster.in_sync()
    connect = cluster.zookeeper.connect
    assert "not a member" in tidelog(
        "rocketmq", "switch-role", "--zookeeper", connect, "--broker-name", GROUP, "--master", "7", code=2
    )
    before = cluster.group()
    target = next(b for b in (1, 2, 3) if b != before["master"])
    tidelog("rocketmq", "switch-role", "--zookeeper", connect, "--broker-name", GROUP, "--master", str(target))
    assert cluster.master() == target and cluster.group()["master_epoch"] == before["master_epoch"] + 1
    wait_for(lambda: cluster.state("near", 0)["leader"] == target, what="the partition led by the new master")
    acked: dict[int, list[tuple[int, bytes]]] = {}
    produce(cluster.bootstrap, "near", [make_value("s", n, 100) for n in range(200)], acked)
    cluster.in_sync()
    read = consume_all(cluster.bootstrap, "near", 1)
    assert_delivery(acked, {0: [r for r in read[0] if r[1].startswith(b"s:")]})


def test_lone_sync_master_refuses_acks_all(cluster: Cluster) -> None:
    """A SYNC_MASTER alone in its group (broker 9 of group `lone`) answers acks=all NOT_ENOUGH_REPLICAS before
    the append, acks=1 after its write. (Last: its group has no master once the module's brokers stop.)"""
    lone = cluster.start(9, {"tidelog.rocketmq.brokerName": "lone", "tidelog.rocketmq.brokerRole": "SYNC_MASTER"})
    wait_for(lambda: cluster.zk.exists("/tidelog/rocketmq/lone") and cluster.group("lone")["master"] == 9, what="lone")
    admin = AdminClient({"bootstrap.servers": lone.bootstrap})
    admin.create_topics([NewTopic("lonely", 1, replica_assignment=[[9]])], operation_timeout=30)["lonely"].result(60)
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5_000,
        "topic_data": [{"name": "lonely", "partition_data": [{"index": 0, "records": build_batch([Record(b"x")])}]}],
    }
    response = kafka_wire.request(lone.bootstrap, ApiKey.PRODUCE, kafka_wire.PRODUCE_VERSION, body)
    assert response.responses[0].partition_responses[0].error_code == NOT_ENOUGH_REPLICAS
    assert kafka_wire.produce_error(lone.bootstrap, "lonely", 0) == 0  # acks=1 is answered after the write
