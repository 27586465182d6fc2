"""The client matrix cells of the Python clients and kcat that tests/integration and tests/security leave open.

kafka-python's KafkaAdminClient and aiokafka's AIOKafkaAdminClient (topics with configs, configs described and
altered, partitions added, records deleted, groups listed and described, topics deleted, bad names refused), their
producers refused an oversize message and made idempotent, their consumers at an out-of-range offset; aiokafka
members joining and leaving a group; kcat reading one partition from an offset and a kcat group resuming from its
commit; a confluent-kafka consumer resuming from its commit. One broker for the module (tests/clients/conftest.py);
every test uses its own topic and group names, and each is the cell its `matrix` marks name (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin import NewPartitions as AioNewPartitions
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

import kafka_wire
from broker_process import BrokerProcess
from tidelog.protocol.messages import ApiKey

with warnings.catch_warnings():  # kafka-python's import trips importlib.resources deprecations
    import kafka.errors
    from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewPartitions as KpNewPartitions
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

TIMEOUT_S = 30.0
KCAT = shutil.which("kcat")
T = TypeVar("T")

KP, AIO, CK, KC = "kafka-python", "aiokafka", "confluent", "kcat"


def create_topic(broker: BrokerProcess, name: str, partitions: int = 1) -> None:
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = client.create_topics([NewTopic(name, partitions, 1)], request_timeout=15)
    futures[name].result(timeout=TIMEOUT_S)


def topics(broker: BrokerProcess) -> dict[str, int]:
    """topic -> partition count, from a fresh Metadata request."""
    listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics
    return {name: len(topic.partitions) for name, topic in listed.items()}


def produce(broker: BrokerProcess, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=b"k", value=f"{topic}-{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


def watermarks(broker: BrokerProcess, topic: str, partition: int = 0) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"wm-{topic}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        consumer.close()


def committed(broker: BrokerProcess, group: str, topic: str, partitions: int = 1) -> list[int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return [tp.offset for tp in sorted(found, key=lambda tp: tp.partition)]


def active_producers(broker: BrokerProcess, topic: str) -> list[Any]:
    """DescribeProducers for partition 0: the idempotent producers whose state the partition keeps."""
    body = {"topics": [{"name": topic, "partition_indexes": [0]}]}
    [partition] = kafka_wire.request(broker.bootstrap, ApiKey.DESCRIBE_PRODUCERS, 0, body).topics[0].partitions
    assert partition.error_code == 0
    return list(partition.active_producers)


def wait_for(check: Callable[[], T], what: str, timeout: float = TIMEOUT_S) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# --- kafka-python ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kp_admin(broker: BrokerProcess) -> Iterator[Any]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    yield client
    client.close()


def kp_topic_config(kp_admin: Any, topic: str, name: str) -> tuple[str, str]:
    """(value, source) of one of a topic's configs."""
    entry = kp_admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic, [name])])["topic"][topic][name]
    return entry["value"], entry["config_source"]


@pytest.mark.matrix("admin: create topics with configs", client=KP)
@pytest.mark.matrix("admin: describe topics and configs", client=KP)
def test_kafka_python_creates_and_describes_a_topic_with_configs(broker: BrokerProcess, kp_admin: Any) -> None:
    spec = {"kp-configs": {"num_partitions": 3, "replication_factor": 1, "configs": {"retention.ms": "3600000"}}}
    [created] = kp_admin.create_topics(spec)["topics"]
    assert (created["name"], created["error_code"], created["num_partitions"]) == ("kp-configs", 0, 3)
    assert topics(broker)["kp-configs"] == 3
    assert kp_topic_config(kp_admin, "kp-configs", "retention.ms") == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    [described] = kp_admin.describe_topics(["kp-configs"])
    assert described["error_code"] == 0
    assert [(p["partition_index"], p["leader_id"]) for p in described["partitions"]] == [(0, 1), (1, 1), (2, 1)]


@pytest.mark.matrix("admin: create partitions", client=KP)
def test_kafka_python_creates_partitions(broker: BrokerProcess, kp_admin: Any) -> None:
    create_topic(broker, "kp-grows", 2)
    kp_admin.create_partitions({"kp-grows": KpNewPartitions(total_count=5)})
    assert topics(broker)["kp-grows"] == 5
    with pytest.raises(kafka.errors.InvalidPartitionsError):  # fewer than it has
        kp_admin.create_partitions({"kp-grows": KpNewPartitions(total_count=3)})
    assert topics(broker)["kp-grows"] == 5


@pytest.mark.matrix("admin: delete records", client=KP)
def test_kafka_python_deletes_records(broker: BrokerProcess, kp_admin: Any) -> None:
    create_topic(broker, "kp-delete-records")
    produce(broker, "kp-delete-records", 10)
    answer = kp_admin.delete_records({KpTopicPartition("kp-delete-records", 0): 6})
    assert answer[KpTopicPartition("kp-delete-records", 0)] == {
        "partition_index": 0,
        "low_watermark": 6,
        "error_code": 0,
    }
    assert watermarks(broker, "kp-delete-records") == (6, 10)


@pytest.mark.matrix("admin: list and describe groups", client=KP)
def test_kafka_python_lists_and_describes_groups(broker: BrokerProcess, kp_admin: Any) -> None:
    create_topic(broker, "kp-group-topic", 2)
    consumer = KafkaConsumer("kp-group-topic", bootstrap_servers=broker.bootstrap, group_id="kp-described")
    try:
        wait_for(lambda: consumer.poll(timeout_ms=100) == {} and consumer.assignment(), "the member's assignment")
        listed = {group["group_id"]: group["group_state"] for group in kp_admin.list_groups()}
        assert listed["kp-described"] == "Stable"
        group = kp_admin.describe_groups(["kp-described"])["kp-described"]
        assert (group["group_state"], group["protocol_type"], group["protocol_data"]) == ("Stable", "consumer", "range")
        [member] = group["members"]
        assert member["member_assignment"]["assigned_partitions"] == [{"topic": "kp-group-topic", "partitions": [0, 1]}]
    finally:
        consumer.close()


@pytest.mark.matrix("admin: delete topics", client=KP)
def test_kafka_python_deletes_a_topic(broker: BrokerProcess, kp_admin: Any) -> None:
    create_topic(broker, "kp-doomed")
    kp_admin.delete_topics(["kp-doomed"])
    assert "kp-doomed" not in topics(broker)
    with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):
        kp_admin.delete_topics(["kp-doomed"])


@pytest.mark.matrix("bad input: invalid topic names", client=KP)
def test_kafka_python_is_refused_invalid_topic_names(broker: BrokerProcess, kp_admin: Any) -> None:
    for name in ["bad name", "bad/name", "..", "x" * 250]:
        with pytest.raises(kafka.errors.InvalidTopicError):
            kp_admin.create_topics({name: {"num_partitions": 1, "replication_factor": 1}})
    assert not {"bad name", "bad/name", "..", "x" * 250} & set(topics(broker))


@pytest.mark.matrix("bad input: oversize message", client=KP)
def test_kafka_python_oversize_message_is_refused(broker: BrokerProcess) -> None:
    create_topic(broker, "kp-oversize")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=10_000_000, retries=0)
    try:
        with pytest.raises(kafka.errors.MessageSizeTooLargeError):
            producer.send("kp-oversize", bytes(1_200_000)).get(timeout=TIMEOUT_S)  # over max.message.bytes
        assert producer.send("kp-oversize", b"small").get(timeout=TIMEOUT_S).offset == 0
    finally:
        producer.close()
    assert watermarks(broker, "kp-oversize") == (0, 1)


@pytest.mark.matrix("bad input: out-of-range offset", client=KP)
def test_kafka_python_out_of_range_offset(broker: BrokerProcess) -> None:
    create_topic(broker, "kp-out-of-range")
    produce(broker, "kp-out-of-range", 5)
    tp = KpTopicPartition("kp-out-of-range", 0)
    for reset in ("earliest", "none"):
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset=reset
        )
        try:
            consumer.assign([tp])
            consumer.seek(tp, 1000)
            if reset == "none":
                with pytest.raises(kafka.errors.OffsetOutOfRangeError):
                    wait_for(lambda c=consumer: c.poll(timeout_ms=200), "an out-of-range error")
            else:
                records = wait_for(lambda c=consumer: c.poll(timeout_ms=200).get(tp), "records after the reset")
                assert records[0].offset == 0
        finally:
            consumer.close()


@pytest.mark.matrix("producer: idempotence", client=KP)
def test_kafka_python_idempotent_producer(broker: BrokerProcess) -> None:
    create_topic(broker, "kp-idempotent")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True, acks="all", linger_ms=0)
    try:
        offsets = [producer.send("kp-idempotent", f"{i}".encode(), partition=0).get(TIMEOUT_S).offset for i in range(5)]
    finally:
        producer.close()
    assert offsets == list(range(5))
    [state] = active_producers(broker, "kp-idempotent")
    assert state.producer_id >= 0 and state.last_sequence == 4


# --- aiokafka --------------------------------------------------------------------------------------------------


def aio_admin(broker: BrokerProcess, use: Callable[[AIOKafkaAdminClient], Awaitable[T]]) -> T:
    async def session() -> T:
        client = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
        await client.start()
        try:
            return await use(client)
        finally:
            await client.close()

    return asyncio.run(session())


async def aio_topic_config(client: AIOKafkaAdminClient, topic: str, name: str) -> str:
    resource = AioConfigResource(AioConfigResourceType.TOPIC, topic, {name: None})
    [response] = await client.describe_configs([resource])
    [(error_code, _, _, _, entries)] = response.resources
    assert error_code == 0
    return {entry[0]: entry[1] for entry in entries}[name]


@pytest.mark.matrix("admin: create topics with configs", client=AIO)
@pytest.mark.matrix("admin: describe topics and configs", client=AIO)
@pytest.mark.matrix("admin: alter configs", client=AIO)
def test_aiokafka_creates_describes_and_alters_topic_configs(broker: BrokerProcess) -> None:
    async def use(client: AIOKafkaAdminClient) -> None:
        new = AioNewTopic("aio-configs", 3, 1, topic_configs={"retention.ms": "3600000"})
        response = await client.create_topics([new])
        assert [tuple(t[:2]) for t in response.topic_errors] == [("aio-configs", 0)]
        assert await aio_topic_config(client, "aio-configs", "retention.ms") == "3600000"
        [described] = await client.describe_topics(["aio-configs"])
        assert described["error_code"] == 0
        assert [(p["partition"], p["leader"]) for p in described["partitions"]] == [(0, 1), (1, 1), (2, 1)]
        altered = AioConfigResource(AioConfigResourceType.TOPIC, "aio-configs", {"retention.ms": "7200000"})
        [response] = await client.alter_configs([altered])
        assert [tuple(r) for r in response.resources] == [(0, None, 2, "aio-configs")]
        assert await aio_topic_config(client, "aio-configs", "retention.ms") == "7200000"

    aio_admin(broker, use)
    assert topics(broker)["aio-configs"] == 3


@pytest.mark.matrix("admin: create partitions", client=AIO)
def test_aiokafka_creates_partitions(broker: BrokerProcess) -> None:
    create_topic(broker, "aio-grows", 2)

    async def use(client: AIOKafkaAdminClient) -> Any:
        return await client.create_partitions({"aio-grows": AioNewPartitions(total_count=4)})

    response = aio_admin(broker, use)
    assert [tuple(t[:2]) for t in response.topic_errors] == [("aio-grows", 0)]
    assert topics(broker)["aio-grows"] == 4


@pytest.mark.matrix("admin: delete records", client=AIO)
def test_aiokafka_deletes_records(broker: BrokerProcess) -> None:
    create_topic(broker, "aio-delete-records")
    produce(broker, "aio-delete-records", 10)

    async def use(client: AIOKafkaAdminClient) -> dict[AioTopicPartition, int]:
        return await client.delete_records({AioTopicPartition("aio-delete-records", 0): RecordsToDelete(7)})

    assert aio_admin(broker, use) == {AioTopicPartition("aio-delete-records", 0): 7}
    assert watermarks(broker, "aio-delete-records") == (7, 10)


@pytest.mark.matrix("admin: list and describe groups", client=AIO)
@pytest.mark.matrix("group: two members join, rebalance, leave", client=AIO)
def test_aiokafka_members_join_and_leave_and_the_group_is_described(broker: BrokerProcess) -> None:
    """Two aiokafka members split four partitions, the admin client lists and describes the group, and when one
    leaves the other owns all four."""
    topic, group = "aio-members", "aio-members"
    create_topic(broker, topic, 4)

    async def scenario() -> None:
        def member() -> AIOKafkaConsumer:
            return AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group, client_id=group)

        async def until(check: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + TIMEOUT_S
            while not check():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.1)

        first, second = member(), member()
        await first.start()
        try:
            await until(lambda: len(first.assignment()) == 4, "the first member to own every partition")
            await second.start()
            await until(lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2, "a two and two split")
            assert first.assignment() | second.assignment() == {AioTopicPartition(topic, p) for p in range(4)}
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
            await admin.start()
            try:
                assert group in {listed[0] for listed in await admin.list_consumer_groups()}
                [response] = await admin.describe_consumer_groups([group])
                [described] = response.groups
                assert described[0] == 0 and described[1] == group and described[2] == "Stable", described[:5]
                assert len(described[5]) == 2
            finally:
                await admin.close()
            await second.stop()
            await until(lambda: len(first.assignment()) == 4, "the first member to own every partition again")
        finally:
            await first.stop()
            await second.stop()

    asyncio.run(scenario())


@pytest.mark.matrix("admin: delete topics", client=AIO)
def test_aiokafka_deletes_a_topic(broker: BrokerProcess) -> None:
    create_topic(broker, "aio-doomed")

    async def use(client: AIOKafkaAdminClient) -> Any:
        return await client.delete_topics(["aio-doomed"])

    assert [tuple(t[:2]) for t in aio_admin(broker, use).topic_error_codes] == [("aio-doomed", 0)]
    assert "aio-doomed" not in topics(broker)
    assert [tuple(t[:2]) for t in aio_admin(broker, use).topic_error_codes] == [("aio-doomed", 3)]


@pytest.mark.matrix("bad input: invalid topic names", client=AIO)
def test_aiokafka_is_refused_invalid_topic_names(broker: BrokerProcess) -> None:
    names = ["bad name", "bad/name", "..", "x" * 250]

    async def use(client: AIOKafkaAdminClient) -> Any:
        return await client.create_topics([AioNewTopic(name, 1, 1) for name in names])

    assert {t[0]: t[1] for t in aio_admin(broker, use).topic_errors} == dict.fromkeys(names, 17)  # INVALID_TOPIC
    assert not set(names) & set(topics(broker))


@pytest.mark.matrix("bad input: oversize message", client=AIO)
def test_aiokafka_oversize_message_is_refused(broker: BrokerProcess) -> None:
    create_topic(broker, "aio-oversize")

    async def scenario() -> int:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=10_000_000)
        await producer.start()
        try:
            with pytest.raises(kafka_errors_of_aiokafka().MessageSizeTooLargeError):
                await producer.send_and_wait("aio-oversize", bytes(1_200_000))
            return (await producer.send_and_wait("aio-oversize", b"small")).offset
        finally:
            await producer.stop()

    assert asyncio.run(scenario()) == 0
    assert watermarks(broker, "aio-oversize") == (0, 1)


def kafka_errors_of_aiokafka() -> Any:
    import aiokafka.errors

    return aiokafka.errors


@pytest.mark.matrix("bad input: out-of-range offset", client=AIO)
def test_aiokafka_out_of_range_offset(broker: BrokerProcess) -> None:
    create_topic(broker, "aio-out-of-range")
    produce(broker, "aio-out-of-range", 5)
    tp = AioTopicPartition("aio-out-of-range", 0)

    async def first_offset(reset: str) -> int:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset=reset
        )
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, 1000)
            return (await asyncio.wait_for(consumer.getone(), TIMEOUT_S)).offset
        finally:
            await consumer.stop()

    assert asyncio.run(first_offset("earliest")) == 0
    with pytest.raises(kafka_errors_of_aiokafka().OffsetOutOfRangeError):
        asyncio.run(first_offset("none"))


@pytest.mark.matrix("producer: idempotence", client=AIO)
def test_aiokafka_idempotent_producer(broker: BrokerProcess) -> None:
    create_topic(broker, "aio-idempotent")

    async def scenario() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            return [
                (await producer.send_and_wait("aio-idempotent", f"{i}".encode(), partition=0)).offset for i in range(5)
            ]
        finally:
            await producer.stop()

    assert asyncio.run(scenario()) == list(range(5))
    [state] = active_producers(broker, "aio-idempotent")
    assert state.producer_id >= 0 and state.last_sequence == 4


# --- kcat and confluent-kafka ----------------------------------------------------------------------------------


def kcat(*args: str, stdin: str | None = None) -> str:
    if KCAT is None:
        pytest.fail("kcat is not installed (apt-get install -y kcat)")
    done = subprocess.run([KCAT, *args], input=stdin, capture_output=True, timeout=TIMEOUT_S, check=False, text=True)
    assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.matrix("consumer: read a partition from an offset", client=KC)
def test_kcat_reads_a_partition_from_an_offset(broker: BrokerProcess) -> None:
    create_topic(broker, "kcat-from-offset", 2)
    produce(broker, "kcat-from-offset", 20, partition=1)
    output = kcat("-C", "-b", broker.bootstrap, "-t", "kcat-from-offset", "-p", "1", "-o", "13", "-e", "-f", "%o %s\n")
    assert output.splitlines() == [f"{i} kcat-from-offset-{i}" for i in range(13, 20)]


@pytest.mark.matrix("consumer: commit, restart, resume from the committed offset", client=KC)
def test_kcat_group_resumes_from_its_commit(broker: BrokerProcess) -> None:
    topic, group = "kcat-resume", "kcat-resume"
    create_topic(broker, topic)

    def consume() -> list[str]:
        args = ["-b", broker.bootstrap, "-G", group, "-X", "auto.offset.reset=earliest", "-e", "-f", "%s\n", topic]
        return kcat(*args).splitlines()

    produce(broker, topic, 6)
    assert consume() == [f"{topic}-{i}" for i in range(6)]
    assert committed(broker, group, topic) == [6]
    produce(broker, topic, 4)
    assert consume() == [f"{topic}-{i}" for i in range(4)]  # the second batch of produce() counts from 0 again
    assert committed(broker, group, topic) == [10]


@pytest.mark.matrix("consumer: commit, restart, resume from the committed offset", client=CK)
def test_confluent_consumer_resumes_from_its_commit(broker: BrokerProcess) -> None:
    topic, group = "ck-resume", "ck-resume"
    create_topic(broker, topic)
    produce(broker, topic, 10)
    config = {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}

    def consume(count: int) -> list[Any]:
        consumer = Consumer({**config, "auto.offset.reset": "earliest"})
        got: list[Any] = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < count and time.monotonic() < deadline:
                got += [m for m in consumer.consume(count - len(got), 0.5) if m.error() is None]
            if got:
                consumer.commit(offsets=[TopicPartition(topic, 0, got[3].offset() + 1)], asynchronous=False)
        finally:
            consumer.close()
        return [m.offset() for m in got]

    assert consume(10) == list(range(10))  # and commits offset 4
    assert committed(broker, group, topic) == [4]
    assert consume(6) == list(range(4, 10))  # resumes at the commit; commits offset 8
    assert committed(broker, group, topic) == [8]


@pytest.mark.matrix("admin: create partitions", client=CK)
def test_confluent_creates_partitions(broker: BrokerProcess) -> None:
    create_topic(broker, "ck-grows", 2)
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    client.create_partitions([NewPartitions("ck-grows", 6)], request_timeout=15)["ck-grows"].result(TIMEOUT_S)
    assert topics(broker)["ck-grows"] == 6
    with pytest.raises(KafkaException) as raised:  # fewer than it has
        client.create_partitions([NewPartitions("ck-grows", 3)], request_timeout=15)["ck-grows"].result(TIMEOUT_S)
    assert raised.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    assert topics(broker)["ck-grows"] == 6


@pytest.mark.matrix("producer: idempotence", client=KC)
def test_kcat_idempotent_producer(broker: BrokerProcess) -> None:
    create_topic(broker, "kcat-idempotent")
    lines = "".join(f"v{i}\n" for i in range(8))
    kcat("-P", "-b", broker.bootstrap, "-t", "kcat-idempotent", "-p", "0", "-X", "enable.idempotence=true", stdin=lines)
    assert watermarks(broker, "kcat-idempotent") == (0, 8)
    [state] = active_producers(broker, "kcat-idempotent")
    assert state.producer_id >= 0 and state.last_sequence == 7


@pytest.mark.matrix("old protocol versions (a 0.9 or 0.10 client)", client=KC)
def test_kcat_without_api_version_request(broker: BrokerProcess) -> None:
    """kcat as a 0.9 client (no ApiVersions request): Produce v1 with magic 0 messages, Fetch v1."""
    old = ["-b", broker.bootstrap, "-t", "kcat-old", "-X", "api.version.request=false"]
    old += ["-X", "broker.version.fallback=0.9.0.1"]
    kcat("-P", *old, "-p", "0", "-z", "gzip", stdin="".join(f"old-{i}\n" for i in range(5)))
    assert kcat("-C", *old, "-p", "0", "-o", "beginning", "-e", "-f", "%o %s\n").splitlines() == [
        f"{i} old-{i}" for i in range(5)
    ]


@pytest.mark.matrix("producer: transactions (commit and abort)", client=KP)
def test_kafka_python_transactional_producer(broker: BrokerProcess) -> None:
    create_topic(broker, "kp-transactional")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-tx")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("kp-transactional", b"committed")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("kp-transactional", b"aborted")
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        tp = KpTopicPartition("kp-transactional", 0)
        assert consumer.end_offsets([tp]) == {tp: 4}  # two records, a COMMIT and an ABORT marker
    finally:
        consumer.close()


@pytest.mark.matrix("producer: transactions (commit and abort)", client=AIO)
def test_aiokafka_transactional_producer(broker: BrokerProcess) -> None:
    create_topic(broker, "aio-transactional")

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-tx")
        await asyncio.wait_for(producer.start(), 10.0)
        try:
            async with producer.transaction():
                await producer.send_and_wait("aio-transactional", b"committed")
            await producer.begin_transaction()
            await producer.send_and_wait("aio-transactional", b"aborted")
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(scenario())
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        tp = KpTopicPartition("aio-transactional", 0)
        assert consumer.end_offsets([tp]) == {tp: 4}
    finally:
        consumer.close()


def test_aiokafka_consume_transform_produce(broker: BrokerProcess) -> None:
    """aiokafka's read-process-write loop: a transaction carrying the output and the consumed offsets is aborted
    (neither shows: no committed offset, nothing for read_committed), the loop seeks back and commits the next one
    (every record once in the output, the offset committed)."""
    source, sink, group = "aio-ctp-in", "aio-ctp-out", "aio-ctp"
    create_topic(broker, source)
    create_topic(broker, sink)
    produce(broker, source, 10)
    tp = AioTopicPartition(source, 0)

    async def process(producer: AIOKafkaProducer, consumer: AIOKafkaConsumer, commit: bool) -> None:
        batch = (await consumer.getmany(tp, timeout_ms=5000, max_records=10))[tp]
        assert len(batch) == 10
        await producer.begin_transaction()
        for message in batch:
            await producer.send(sink, b"out:" + message.value, partition=0)
        await producer.send_offsets_to_transaction({tp: batch[-1].offset + 1}, group)
        await (producer.commit_transaction() if commit else producer.abort_transaction())

    async def scenario() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-ctp-tx")
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False,
                                    isolation_level="read_committed", auto_offset_reset="earliest")  # fmt: skip
        reader = AIOKafkaConsumer(sink, bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                                  auto_offset_reset="earliest")  # fmt: skip
        await asyncio.wait_for(producer.start(), 10.0)
        await consumer.start()
        try:
            consumer.assign([tp])
            await process(producer, consumer, commit=False)
            assert committed(broker, group, source) == [-1001]  # the aborted offsets never show
            consumer.seek(tp, 0)  # back to the committed position, as the loop's restart would be
            await process(producer, consumer, commit=True)
        finally:
            await producer.stop()
            await consumer.stop()
        await reader.start()
        try:
            got: list[bytes] = []
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < 10 and time.monotonic() < deadline:
                for messages in (await reader.getmany(timeout_ms=500)).values():
                    got += [m.value for m in messages]
            got += [m.value for ms in (await reader.getmany(timeout_ms=500)).values() for m in ms]  # nothing more
            return got
        finally:
            await reader.stop()

    assert asyncio.run(scenario()) == [f"out:{source}-{i}".encode() for i in range(10)]
    assert committed(broker, group, source) == [10]
    assert watermarks(broker, sink) == (0, 22)  # twice ten records, an ABORT and a COMMIT marker


@pytest.mark.matrix("group: cooperative rebalancing", client=KP)
def test_kafka_python_cooperative_members_revoke_only_what_moves(broker: BrokerProcess) -> None:
    """kafka-python's cooperative-sticky assignor: the second member takes two of four partitions from the first,
    which gives up only those two; when it leaves, the first gets them back and loses nothing."""
    topic, group = "kp-cooperative", "kp-cooperative"
    create_topic(broker, topic, 4)

    class Recorder(ConsumerRebalanceListener):
        def __init__(self) -> None:
            self.revoked: list[set[int]] = []

        def on_partitions_revoked(self, revoked: Any) -> None:
            if revoked:
                self.revoked.append({tp.partition for tp in revoked})

        def on_partitions_assigned(self, assigned: Any) -> None:
            pass

    def member(recorder: Recorder) -> Any:
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            partition_assignment_strategy=[CooperativeStickyAssignor],
            heartbeat_interval_ms=200,
        )
        consumer.subscribe([topic], listener=recorder)
        return consumer

    def owned(consumers: list[Any], sizes: list[int]) -> bool:
        for consumer in consumers:
            consumer.poll(timeout_ms=50)
        return [len(c.assignment()) for c in consumers] == sizes

    first_log, second_log = Recorder(), Recorder()
    first = member(first_log)
    try:
        wait_for(lambda: owned([first], [4]), "the first member to own every partition")
        second = member(second_log)
        try:
            wait_for(lambda: owned([first, second], [2, 2]), "a two and two split")
            kept = {tp.partition for tp in first.assignment()}
            assert first_log.revoked == [set(range(4)) - kept]  # only what moved, once
        finally:
            second.close()
        wait_for(lambda: owned([first], [4]), "the first member to own every partition again")
        assert len(first_log.revoked) == 1 and second_log.revoked in ([], [{*range(4)} - kept])
    finally:
        first.close()


@pytest.mark.matrix("group: static membership", client=AIO)
def test_aiokafka_static_member_stays_and_comes_back(broker: BrokerProcess, kp_admin: Any) -> None:
    """An aiokafka member with a group.instance.id leaves no LeaveGroup when it stops: the group keeps it; started
    again, it takes its place (a new member id, the same instance) and its partitions."""
    topic, group = "aio-static", "aio-static"
    create_topic(broker, topic, 2)

    def members() -> list[tuple[str, str]]:
        described = kp_admin.describe_groups([group])[group]
        assert described["group_state"] == "Stable"
        return [(m["member_id"], m["group_instance_id"]) for m in described["members"]]

    async def run_member() -> frozenset[AioTopicPartition]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=broker.bootstrap, group_id=group, group_instance_id="aio-static-1"
        )
        await consumer.start()
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while not consumer.assignment():
                assert time.monotonic() < deadline, "no assignment"
                await asyncio.sleep(0.1)
            return consumer.assignment()
        finally:
            await consumer.stop()

    everything = frozenset(AioTopicPartition(topic, p) for p in range(2))
    assert asyncio.run(run_member()) == everything
    [(member_id, instance)] = members()  # stopped, and still a member
    assert instance == "aio-static-1"
    assert asyncio.run(run_member()) == everything
    [(new_member_id, instance)] = members()
    assert instance == "aio-static-1" and new_member_id != member_id
