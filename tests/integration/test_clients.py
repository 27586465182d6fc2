"""Real Kafka clients against a real `tidelog serve`: confluent-kafka (librdkafka), kafka-python, aiokafka and kcat.

Every round trip checks the whole log a consumer sees: each record's key, value and headers, that it sits in
the partition Kafka's murmur2 partitioner picks for its key (`tidelog.partitioner.partition_for_key` must agree
with the clients), that per-partition order is the production order and that offsets are dense from 0.
Most consumers use `assign()` (manual assignment, no consumer group, no commits); `test_group_consume_and_commit`
has each client (kcat as `-G`) consume every codec as a group member and commit, and checks the committed offsets.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
import shutil
import socket
import string
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from tidelog.partitioner import partition_for_key

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
ENGINES = ["kafka", "rocketmq"]  # storage engines under the broker for the tests every engine must pass
ROCKETMQ_CODECS = ["none", "zstd"]  # the RocketMQ engine stores records decompressed: two codecs show it
PARTITIONS = 3
N_RECORDS = 400
TIMEOUT_S = 30.0
TS = 1_700_000_000_000

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Rec:
    key: bytes
    value: bytes
    headers: Headers = ()


@dataclass(frozen=True)
class Got:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None  # None: this consumer cannot tell us the headers


def make_records(tag: str, n: int = N_RECORDS, *, seed: int = 0) -> list[Rec]:
    """Keyed records with headers; ASCII only (no ':', tabs or newlines) so kcat can carry them too."""
    rng = random.Random(f"{tag}/{seed}")
    records = []
    for i in range(n):
        key = f"{tag}-k{i % 53}".encode()  # repeated keys: per-key order matters
        filler = "".join(rng.choices(string.ascii_letters, k=rng.randrange(0, 40)))
        value = f"{tag}|{i}|{filler}|{'compressible ' * rng.randrange(1, 30)}".encode()
        headers: Headers = (("seq", str(i).encode()), ("tag", tag.encode()))
        if i % 3 == 0:
            headers += (("seq", b"again"),)  # header keys may repeat; order is kept
        records.append(Rec(key, value, headers))
    return records


# --- topics --------------------------------------------------------------------------------------------------


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS, config: dict[str, str] | None = None) -> None:
    client = admin(bootstrap)  # keep a reference: a collected AdminClient fails its futures with _DESTROY
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=10,
        request_timeout=15,
    )
    futures[name].result(timeout=TIMEOUT_S)


def watermarks(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> list[tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{topic}", "enable.auto.commit": False})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)]
    finally:
        consumer.close()


# --- confluent-kafka -----------------------------------------------------------------------------------------


def ck_produce(bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", **conf: Any) -> list[Any]:
    """Produce all records; returns each one's delivery report (error, partition, offset), in order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "partitioner": "murmur2_random",  # Java's (and tidelog's) partitioner, not librdkafka's CRC32 default
            "linger.ms": 5,
            **conf,
        }
    )
    reports: list[Any] = [None] * len(records)

    def report(index: int) -> Callable[[KafkaError | None, Any], None]:
        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            reports[index] = (err, msg.partition(), msg.offset())

        return on_delivery

    for index, record in enumerate(records):
        while True:
            try:
                producer.produce(
                    topic, key=record.key, value=record.value, headers=list(record.headers), on_delivery=report(index)
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, "records still undelivered after the flush timeout"
    return reports


def ck_produce_ok(bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", **conf: Any) -> list[Any]:
    reports = ck_produce(bootstrap, topic, records, codec, **conf)
    failed = [(i, r) for i, r in enumerate(reports) if r is None or r[0] is not None]
    assert not failed, f"{len(failed)} failed delivery reports, first: {failed[:3]}"
    return [(partition, offset) for _, partition, offset in reports]


def ck_consumer(bootstrap: str, name: str, **conf: Any) -> Consumer:
    # confluent-kafka insists on a group.id; with assign() and no commits the group is never joined.
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"assign-only-{name}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **conf,
        }
    )


def ck_consume(bootstrap: str, topic: str, expected: int, partitions: int = PARTITIONS, **conf: Any) -> list[Got]:
    consumer = ck_consumer(bootstrap, topic, **conf)
    got: list[Got] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=expected - len(got), timeout=0.5):
                if msg.error():
                    raise AssertionError(f"consumer error: {msg.error()}")
                headers = tuple(msg.headers() or ())
                got.append(Got(msg.partition(), msg.offset(), msg.key(), msg.value(), headers))
    finally:
        consumer.close()
    return got


# --- kafka-python --------------------------------------------------------------------------------------------


def kp_produce(bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", **conf: Any) -> list[Any]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=5, **conf
    )
    try:
        futures = [
            producer.send(topic, key=r.key, value=r.value, headers=[(k, v) for k, v in r.headers]) for r in records
        ]
        producer.flush(timeout=TIMEOUT_S)
        metadata = [future.get(timeout=TIMEOUT_S) for future in futures]
    finally:
        producer.close(timeout=10)
    return [(m.partition, m.offset) for m in metadata]


def kp_consume(bootstrap: str, topic: str, expected: int, partitions: int = PARTITIONS, **conf: Any) -> list[Got]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest", **conf
    )
    got: list[Got] = []
    try:
        consumer.assign([KpTopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < expected and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                for m in messages:
                    got.append(Got(m.partition, m.offset, m.key, m.value, tuple((k, v) for k, v in m.headers)))
    finally:
        consumer.close()
    return got


# --- aiokafka ------------------------------------------------------------------------------------------------


def aio_produce(bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none", **conf: Any) -> list[Any]:
    from aiokafka import AIOKafkaProducer

    async def run() -> list[Any]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=5, **conf
        )
        await producer.start()
        try:
            futures = [await producer.send(topic, key=r.key, value=r.value, headers=list(r.headers)) for r in records]
            metadata = await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT_S)
        finally:
            await producer.stop()
        return [(m.partition, m.offset) for m in metadata]

    return asyncio.run(run())


def aio_consume(bootstrap: str, topic: str, expected: int, partitions: int = PARTITIONS) -> list[Got]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    async def run() -> list[Got]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        got: list[Got] = []
        try:
            consumer.assign([AioTopicPartition(topic, p) for p in range(partitions)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < expected and time.monotonic() < deadline:
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    for m in messages:
                        got.append(Got(m.partition, m.offset, m.key, m.value, tuple((k, v) for k, v in m.headers)))
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


# --- kcat ----------------------------------------------------------------------------------------------------

KCAT = shutil.which("kcat")
needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install -y kcat)")


def kcat(*args: str, stdin: bytes | None = None, timeout: float = TIMEOUT_S) -> str:
    assert KCAT is not None
    done = subprocess.run([KCAT, *args], input=stdin, capture_output=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}: {done.stderr.decode()[-2000:]}"
    return done.stdout.decode()


def kcat_produce(bootstrap: str, topic: str, records: Sequence[Rec], codec: str = "none") -> None:
    """kcat -P -K: reads `key:value` lines; one -H header for every record (kcat cannot vary them per line)."""
    lines = b"".join(r.key + b":" + r.value + b"\n" for r in records)
    args = ["-P", "-b", bootstrap, "-t", topic, "-K:", "-X", "topic.partitioner=murmur2_random"]
    if codec != "none":
        args += ["-z", codec]
    kcat(*args, "-H", "via=kcat", stdin=lines)


def kcat_consume(bootstrap: str, topic: str, expected: int, partitions: int = PARTITIONS) -> list[Got]:
    output = kcat("-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-f", "%p\t%o\t%k\t%s\t%h\n")
    return parse_kcat_lines(output)


def parse_kcat_lines(output: str) -> list[Got]:
    """kcat's `-f '%p\\t%o\\t%k\\t%s\\t%h\\n'` lines."""
    got = []
    for line in output.splitlines():
        partition, offset, key, value, headers = line.split("\t")
        parsed: Headers = tuple(
            (name, val.encode()) for name, _, val in (h.partition("=") for h in headers.split(",") if h)
        )
        got.append(Got(int(partition), int(offset), key.encode(), value.encode(), parsed))
    return got


PRODUCERS: dict[str, Callable[..., Any]] = {
    "confluent": ck_produce_ok,
    "kafka-python": kp_produce,
    "aiokafka": aio_produce,
    "kcat": kcat_produce,
}
CONSUMERS: dict[str, Callable[..., list[Got]]] = {
    "confluent": ck_consume,
    "kafka-python": kp_consume,
    "aiokafka": aio_consume,
    "kcat": kcat_consume,
}


# --- checks --------------------------------------------------------------------------------------------------


def assert_log_matches(
    records: Sequence[Rec],
    got: Sequence[Got],
    *,
    partitions: int = PARTITIONS,
    placed: Sequence[tuple[int, int]] | None = None,
    headers: bool = True,
) -> None:
    """`got` is exactly `records`: right partition for the key, production order, dense offsets from 0."""
    assert len(got) == len(records), f"consumed {len(got)} records, produced {len(records)}"
    for p in range(partitions):
        expected = [r for r in records if partition_for_key(r.key, partitions) == p]
        actual = sorted((g for g in got if g.partition == p), key=lambda g: g.offset)
        assert [g.offset for g in actual] == list(range(len(actual))), f"partition {p}: offsets are not 0..n-1"
        assert [(g.key, g.value) for g in actual] == [(r.key, r.value) for r in expected], f"partition {p} differs"
        if headers:
            assert [g.headers for g in actual] == [r.headers for r in expected], f"partition {p}: headers differ"
    if placed is not None:  # the producer's own delivery reports name the same partition and offset
        by_position = {(g.partition, g.offset): g for g in got}
        for record, position in zip(records, placed, strict=True):
            assert position[0] == partition_for_key(record.key, partitions), f"{record.key!r} went to {position[0]}"
            assert by_position[position].value == record.value


# --- each client with itself, every codec ---------------------------------------------------------------------


def codec_cell(codec: str, client: str) -> list[pytest.MarkDecorator]:
    """The client matrix cell (tests/client_matrix.py) of a round trip with this codec: none for "none"."""
    return [] if codec == "none" else [pytest.mark.matrix("producer: {codec}", client=client)]


def codec_params(client: str) -> list[Any]:
    return [pytest.param(codec, marks=codec_cell(codec, client)) for codec in CODECS]


@pytest.mark.matrix("producer: keys", client="confluent")
@pytest.mark.matrix("producer: headers", client="confluent")
@pytest.mark.parametrize(
    ("engine_broker", "codec", "idempotence"),
    [
        pytest.param(
            engine,
            codec,
            idempotence,
            id=f"{engine}-{'idempotent' if idempotence else 'plain'}-{codec}",
            marks=[
                *codec_cell(codec, "confluent"),
                *([pytest.mark.matrix("producer: idempotence", client="confluent")] if idempotence else []),
            ],
        )
        for engine in ENGINES
        for idempotence in (False, True)
        for codec in (CODECS if engine == "kafka" else ROCKETMQ_CODECS)
    ],
    indirect=["engine_broker"],
)
def test_confluent_kafka_roundtrip(engine_broker, codec: str, idempotence: bool) -> None:
    topic = f"ck-{codec}-{'idem' if idempotence else 'plain'}"
    create_topic(engine_broker.bootstrap, topic)
    records = make_records(topic)
    placed = ck_produce_ok(engine_broker.bootstrap, topic, records, codec, **{"enable.idempotence": idempotence})
    assert_log_matches(records, ck_consume(engine_broker.bootstrap, topic, len(records)), placed=placed)
    assert sum(high for _, high in watermarks(engine_broker.bootstrap, topic)) == len(records)


@pytest.mark.matrix("producer: keys", client="kafka-python")
@pytest.mark.matrix("producer: headers", client="kafka-python")
@pytest.mark.parametrize("codec", codec_params("kafka-python"))
def test_kafka_python_roundtrip(broker, codec: str) -> None:
    topic = f"kp-{codec}"
    create_topic(broker.bootstrap, topic)
    records = make_records(topic)
    placed = kp_produce(broker.bootstrap, topic, records, codec)  # idempotent by default in kafka-python 3
    assert_log_matches(records, kp_consume(broker.bootstrap, topic, len(records)), placed=placed)


@pytest.mark.matrix("producer: keys", client="aiokafka")
@pytest.mark.matrix("producer: headers", client="aiokafka")
@pytest.mark.parametrize("codec", codec_params("aiokafka"))
def test_aiokafka_roundtrip(broker, codec: str) -> None:
    topic = f"aio-{codec}"
    create_topic(broker.bootstrap, topic)
    records = make_records(topic)
    placed = aio_produce(broker.bootstrap, topic, records, codec)
    assert_log_matches(records, aio_consume(broker.bootstrap, topic, len(records)), placed=placed)


@pytest.mark.matrix("producer: keys", client="kcat")
@pytest.mark.matrix("producer: headers", client="kcat")
@needs_kcat
@pytest.mark.parametrize(
    ("engine_broker", "codec"),
    [
        pytest.param(engine, codec, id=f"{engine}-{codec}", marks=codec_cell(codec, "kcat"))
        for engine in ENGINES
        for codec in (CODECS if engine == "kafka" else ROCKETMQ_CODECS)
    ],
    indirect=["engine_broker"],
)
def test_kcat_roundtrip(engine_broker, codec: str) -> None:
    topic = f"kcat-{codec}"
    create_topic(engine_broker.bootstrap, topic)
    records = [Rec(r.key, r.value, (("via", b"kcat"),)) for r in make_records(topic, 200)]
    kcat_produce(engine_broker.bootstrap, topic, records, codec)
    assert_log_matches(records, kcat_consume(engine_broker.bootstrap, topic, len(records)))
    # the same records as librdkafka's Python binding sees them
    assert_log_matches(records, ck_consume(engine_broker.bootstrap, topic, len(records)))


@needs_kcat
def test_kcat_metadata_lists_topics(broker) -> None:
    create_topic(broker.bootstrap, "kcat-listed", partitions=4)
    listing = kcat("-L", "-b", broker.bootstrap)
    assert f"broker 1 at {broker.bootstrap}" in listing
    assert 'topic "kcat-listed" with 4 partitions:' in listing
    one = kcat("-L", "-b", broker.bootstrap, "-t", "kcat-listed")
    assert all(f"partition {p}, leader 1, replicas: 1, isrs: 1" in one for p in range(4))


# --- each client in a consumer group, every codec: subscribe, consume, commit ----------------------------------

GROUP_RECORDS = 60  # a small log per case: 20 cases share one broker, each joins its own group


def ck_group_consume(bootstrap: str, topic: str, group: str, expected: int) -> list[Got]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    got: list[Got] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=expected - len(got), timeout=0.5):
                assert msg.error() is None, msg.error()
                got.append(Got(msg.partition(), msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ())))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def kp_group_consume(bootstrap: str, topic: str, group: str, expected: int) -> list[Got]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    got: list[Got] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < expected and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                got += [Got(m.partition, m.offset, m.key, m.value, tuple(m.headers)) for m in messages]
        consumer.commit()
    finally:
        consumer.close()
    return got


def aio_group_consume(bootstrap: str, topic: str, group: str, expected: int) -> list[Got]:
    from aiokafka import AIOKafkaConsumer

    async def run() -> list[Got]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        got: list[Got] = []
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < expected and time.monotonic() < deadline:
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    got += [Got(m.partition, m.offset, m.key, m.value, tuple(m.headers)) for m in messages]
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


def kcat_group_consume(bootstrap: str, topic: str, group: str, expected: int) -> list[Got]:
    """kcat -G: librdkafka's balanced consumer; -e exits once every assigned partition is at its end, and the
    close commits the offsets consumed (auto commit, librdkafka's default)."""
    output = kcat(
        "-b", bootstrap, "-G", group, "-X", "auto.offset.reset=earliest", "-e", "-f", "%p\t%o\t%k\t%s\t%h\n", topic
    )
    return parse_kcat_lines(output)


GROUP_CONSUMERS: dict[str, Callable[[str, str, str, int], list[Got]]] = {
    "confluent": ck_group_consume,
    "kafka-python": kp_group_consume,
    "aiokafka": aio_group_consume,
    "kcat": kcat_group_consume,
}


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> list[int]:
    """The group's committed offset per partition, as the broker answers OffsetFetch (-1001: none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return [tp.offset for tp in sorted(found, key=lambda tp: tp.partition)]


@pytest.fixture(scope="module")
def group_broker(start_module_broker):
    """A broker whose new groups rebalance at once (group.initial.rebalance.delay.ms=0: 20 groups join here)."""
    return start_module_broker(group_initial_rebalance_delay_ms=0)


@pytest.mark.matrix("group: subscribe, consume, commit", client="{client}")
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", list(GROUP_CONSUMERS))
def test_group_consume_and_commit(group_broker, client: str, codec: str) -> None:
    """Each client produces with the codec, then consumes the topic as a member of a consumer group (subscribe, not
    assign) and commits: the group sees the whole log, and the committed offsets are the partitions' ends."""
    if client == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    topic, group = f"group-{client}-{codec}", f"group-{client}-{codec}-members"
    create_topic(group_broker.bootstrap, topic)
    records = make_records(topic, GROUP_RECORDS)
    if client == "kcat":
        records = [Rec(r.key, r.value, (("via", b"kcat"),)) for r in records]
    PRODUCERS[client](group_broker.bootstrap, topic, records, codec)
    assert_log_matches(records, GROUP_CONSUMERS[client](group_broker.bootstrap, topic, group, len(records)))
    ends = [high for _, high in watermarks(group_broker.bootstrap, topic)]
    assert sum(ends) == len(records)
    assert committed_offsets(group_broker.bootstrap, group, topic) == ends


# --- cross-client: each producer, every other consumer ------------------------------------------------------


@pytest.fixture(scope="module")
def cross_topics(broker) -> Callable[[str], tuple[str, list[Rec]]]:
    """Produces once per producer (lazily) into its own topic; codecs vary across producers."""
    codecs = {"confluent": "zstd", "kafka-python": "snappy", "aiokafka": "lz4", "kcat": "gzip"}
    made: dict[str, tuple[str, list[Rec]]] = {}

    def get(producer: str) -> tuple[str, list[Rec]]:
        if producer not in made:
            topic = f"cross-from-{producer}"
            create_topic(broker.bootstrap, topic)
            records = make_records(topic, 300)
            if producer == "kcat":
                records = [Rec(r.key, r.value, (("via", b"kcat"),)) for r in records]
            PRODUCERS[producer](broker.bootstrap, topic, records, codecs[producer])
            made[producer] = (topic, records)
        return made[producer]

    return get


@pytest.mark.parametrize(
    ("producer", "consumer"),
    [(p, c) for p in PRODUCERS for c in CONSUMERS if p != c],
)
def test_cross_client(broker, cross_topics, producer: str, consumer: str) -> None:
    if KCAT is None and "kcat" in (producer, consumer):
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    topic, records = cross_topics(producer)
    assert_log_matches(records, CONSUMERS[consumer](broker.bootstrap, topic, len(records)))


# --- offsets: by time, beginning and end ----------------------------------------------------------------------


@pytest.mark.matrix("consumer: offsets for times, beginning and end", client="confluent")
@pytest.mark.matrix("consumer: offsets for times, beginning and end", client="kafka-python")
@pytest.mark.matrix("consumer: offsets for times, beginning and end", client="aiokafka")
@pytest.mark.matrix("consumer: offsets for times, beginning and end", client="kcat")
def test_offsets_for_times_and_watermarks(engine_broker) -> None:
    topic = "times"
    create_topic(engine_broker.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": engine_broker.bootstrap, "linger.ms": 50})
    # 10 records 1 s apart: the first five share one batch, the rest go one batch each
    for i in range(10):
        producer.produce(topic, key=b"k", value=f"v{i}".encode(), timestamp=TS + i * 1000)
        if i >= 4:
            assert producer.flush(TIMEOUT_S) == 0

    cases = {
        TS - 5000: 0,  # before everything: the first record
        TS: 0,
        TS + 1: 1,  # between two records: the next one
        TS + 2500: 3,
        TS + 4000: 4,  # last record of the first batch
        TS + 4001: 5,  # first record of a later batch
        TS + 9000: 9,
        TS + 9001: -1,  # after the last record: none (librdkafka reports OFFSET_END, -1)
    }
    consumer = ck_consumer(engine_broker.bootstrap, topic)
    try:
        for ts, offset in cases.items():  # one at a time: a request may name a partition only once
            [found] = consumer.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert (found.offset, found.error) == (offset, None), f"timestamp {ts}"
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 10)
    finally:
        consumer.close()

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    tp = KpTopicPartition(topic, 0)
    kp = KafkaConsumer(bootstrap_servers=engine_broker.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        for ts, offset in cases.items():
            answer = kp.offsets_for_times({tp: ts})[tp]
            if offset < 0:
                assert answer is None
            else:
                assert (answer.offset, answer.timestamp) == (offset, TS + offset * 1000)
        assert kp.beginning_offsets([tp]) == {tp: 0}
        assert kp.end_offsets([tp]) == {tp: 10}
    finally:
        kp.close()

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    async def aio_lookups() -> tuple[dict[int, Any], Any, Any]:
        aio_tp = AioTopicPartition(topic, 0)
        aio = AIOKafkaConsumer(bootstrap_servers=engine_broker.bootstrap, group_id=None, enable_auto_commit=False)
        await aio.start()
        try:
            answers = {ts: (await aio.offsets_for_times({aio_tp: ts}))[aio_tp] for ts in cases}
            return answers, await aio.beginning_offsets([aio_tp]), await aio.end_offsets([aio_tp])
        finally:
            await aio.stop()

    answers, beginning, end = asyncio.run(aio_lookups())
    for ts, offset in cases.items():
        if offset < 0:
            assert answers[ts] is None, f"aiokafka, timestamp {ts}"
        else:
            assert (answers[ts].offset, answers[ts].timestamp) == (offset, TS + offset * 1000), f"aiokafka, {ts}"
    assert list(beginning.values()) == [0] and list(end.values()) == [10]

    if KCAT is not None:  # kcat -Q: "<topic> [<partition>]  offset <offset>" per topic:partition:timestamp
        for ts, offset in cases.items():
            answer = kcat("-Q", "-b", engine_broker.bootstrap, "-t", f"{topic}:0:{ts}")
            assert re.search(rf"^{topic} \[0\]\s+offset (-?\d+)$", answer, re.MULTILINE) is not None, answer
            found = int(re.search(r"offset (-?\d+)", answer)[1])
            assert found == offset, f"kcat -Q, timestamp {ts}: {answer}"


# --- admin ---------------------------------------------------------------------------------------------------


def _create_error(bootstrap: str, topic: NewTopic) -> KafkaError:
    client = admin(bootstrap)
    futures = client.create_topics([topic], operation_timeout=10, request_timeout=15)
    with pytest.raises(KafkaException) as raised:
        futures[topic.topic].result(timeout=TIMEOUT_S)
    return raised.value.args[0]


@pytest.mark.matrix("admin: create topics with configs", client="confluent")
@pytest.mark.matrix("admin: describe topics and configs", client="confluent")
def test_admin_create_topic_with_configs(broker) -> None:
    config = {"retention.ms": "3600000", "segment.bytes": "1048576"}
    create_topic(broker.bootstrap, "admin-configs", partitions=5, config=config)
    metadata = admin(broker.bootstrap).list_topics(timeout=10)
    assert len(metadata.topics["admin-configs"].partitions) == 5
    # DescribeConfigs: the overrides as the topic's own, the rest as defaults; and the stored topic record
    resource = ConfigResource(ConfigResource.Type.TOPIC, "admin-configs")
    client = admin(broker.bootstrap)  # kept referenced until the future is done
    described = client.describe_configs([resource], request_timeout=15)[resource].result(timeout=TIMEOUT_S)
    for name, value in config.items():
        assert (described[name].value, described[name].source) == (value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert described["cleanup.policy"].value == "delete"
    assert described["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    stored = json.loads((Path(broker.log_dir) / "tidelog-topics.json").read_text())["topics"]["admin-configs"]
    assert {k: str(v) for k, v in stored["configs"].items()} == config
    assert sorted(p.name for p in Path(broker.log_dir).glob("admin-configs-*")) == [
        f"admin-configs-{p}" for p in range(5)
    ]


@pytest.mark.matrix("bad input: invalid topic names", client="confluent")
def test_admin_create_topic_errors(broker) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "admin-dup")
    assert _create_error(bootstrap, NewTopic("admin-dup", 1, 1)).code() == KafkaError.TOPIC_ALREADY_EXISTS
    for bad_name in ["bad name", "bad/name", "..", "x" * 250]:
        assert _create_error(bootstrap, NewTopic(bad_name, 1, 1)).code() == KafkaError.TOPIC_EXCEPTION, bad_name
    error = _create_error(bootstrap, NewTopic("admin-rf3", 1, 3))
    assert error.code() == KafkaError.INVALID_REPLICATION_FACTOR
    error = _create_error(bootstrap, NewTopic("admin-badconf", 1, 1, config={"no.such.config": "1"}))
    assert error.code() == KafkaError.INVALID_CONFIG
    error = _create_error(bootstrap, NewTopic("admin-badvalue", 1, 1, config={"retention.ms": "soon"}))
    assert error.code() == KafkaError.INVALID_CONFIG
    topics = admin(bootstrap).list_topics(timeout=10).topics
    assert not {"admin-rf3", "admin-badconf", "admin-badvalue", "bad name"} & set(topics)


def test_admin_create_topic_zero_partitions(broker) -> None:
    error = _create_error(broker.bootstrap, NewTopic("admin-zero-partitions", 0, 1))
    assert error.code() == KafkaError.INVALID_PARTITIONS
    assert "admin-zero-partitions" not in admin(broker.bootstrap).list_topics(timeout=10).topics


def test_admin_validate_only_creates_nothing(broker) -> None:
    client = admin(broker.bootstrap)
    futures = client.create_topics([NewTopic("admin-dry-run", 2, 1)], validate_only=True, request_timeout=15)
    futures["admin-dry-run"].result(timeout=TIMEOUT_S)
    assert "admin-dry-run" not in client.list_topics(timeout=10).topics


@pytest.mark.matrix("admin: delete topics", client="confluent")
def test_admin_delete_topic(engine_broker) -> None:
    client = admin(engine_broker.bootstrap)
    create_topic(engine_broker.bootstrap, "admin-doomed")
    ck_produce_ok(engine_broker.bootstrap, "admin-doomed", make_records("admin-doomed", 30))
    assert "admin-doomed" in client.list_topics(timeout=10).topics
    client.delete_topics(["admin-doomed"], operation_timeout=10)["admin-doomed"].result(timeout=TIMEOUT_S)
    assert "admin-doomed" not in client.list_topics(timeout=10).topics
    with pytest.raises(KafkaException) as raised:
        client.delete_topics(["admin-doomed"], operation_timeout=10)["admin-doomed"].result(timeout=TIMEOUT_S)
    assert raised.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # A topic of the same name starts over, empty
    create_topic(engine_broker.bootstrap, "admin-doomed")
    assert all(wm == (0, 0) for wm in watermarks(engine_broker.bootstrap, "admin-doomed"))


@pytest.mark.matrix("admin: delete records", client="confluent")
def test_admin_delete_records(broker) -> None:
    """DeleteRecords moves the low watermark: the records before it are gone for every reader, the rest stay."""
    topic = "admin-delete-records"
    create_topic(broker.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for partition, count, prefix in ((0, 10, "v"), (1, 5, "w")):
        for i in range(count):
            producer.produce(topic, value=f"{prefix}{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    client = admin(broker.bootstrap)
    futures = client.delete_records(
        [TopicPartition(topic, 0, 4), TopicPartition(topic, 1, OFFSET_END)], operation_timeout=10, request_timeout=15
    )
    low = {tp.partition: future.result(timeout=TIMEOUT_S).low_watermark for tp, future in futures.items()}
    assert low == {0: 4, 1: 5}
    assert watermarks(broker.bootstrap, topic, 2) == [(4, 10), (5, 5)]
    got = ck_consume(broker.bootstrap, topic, 6, partitions=2)
    assert [(g.partition, g.offset, g.value) for g in got] == [(0, i, f"v{i}".encode()) for i in range(4, 10)]
    # beyond the high watermark: OFFSET_OUT_OF_RANGE, and nothing moves
    [future] = client.delete_records([TopicPartition(topic, 0, 11)], request_timeout=15).values()
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=TIMEOUT_S)
    assert raised.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert watermarks(broker.bootstrap, topic, 2) == [(4, 10), (5, 5)]


def test_delete_records_of_the_offsets_topic_is_refused(start_broker) -> None:
    """Kafka refuses DeleteRecords on an internal topic (INVALID_TOPIC_EXCEPTION, "Cannot delete records of
    internal topic"); committed offsets must survive any client's attempt, across a restart too."""
    broker = start_broker(offsets_topic_num_partitions=3)
    topic, group = "offsets-kept", "offsets-kept-group"
    create_topic(broker.bootstrap, topic, partitions=1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)  # offset 0 of an empty topic
    finally:
        consumer.close()
    client = admin(broker.bootstrap)
    futures = client.delete_records(
        [TopicPartition("__consumer_offsets", p, OFFSET_END) for p in range(3)], request_timeout=15
    )
    for tp, future in futures.items():
        with pytest.raises(KafkaException) as raised:
            future.result(timeout=TIMEOUT_S)
        assert raised.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, tp
    assert all(low == 0 for low, _ in watermarks(broker.bootstrap, "__consumer_offsets", 3))
    broker.restart()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    assert committed.offset == 0, "the committed offset was lost"
    broker.stop()


# --- idempotent producer, acks -------------------------------------------------------------------------------


@pytest.mark.matrix("producer: idempotence", client="confluent")
def test_idempotent_producer_exactly_once_in_order(engine_broker) -> None:
    topic = "idempotent-5000"
    create_topic(engine_broker.bootstrap, topic)
    records = [Rec(f"key-{i % 211}".encode(), f"{i}".encode()) for i in range(5000)]
    placed = ck_produce_ok(
        engine_broker.bootstrap,
        topic,
        records,
        "lz4",
        **{
            "enable.idempotence": True,
            "acks": "all",
            "retries": 1_000_000,
            "max.in.flight.requests.per.connection": 5,
            "linger.ms": 2,
            "batch.num.messages": 100,  # many small in-flight batches per partition
        },
    )
    got = ck_consume(engine_broker.bootstrap, topic, len(records))
    values = [int(g.value) for g in got]
    assert len(values) == 5000 and set(values) == set(range(5000)), "records lost or duplicated"
    assert_log_matches(records, got, placed=placed, headers=False)
    for p in range(PARTITIONS):
        sequence = [int(g.value) for g in sorted(got, key=lambda g: g.offset) if g.partition == p]
        assert sequence == sorted(sequence), f"partition {p} is out of order"


@pytest.fixture(scope="module", params=ENGINES)
def flush_broker(request, start_module_broker):
    """A broker that fsyncs every message (acks=all waits for the group commit), per storage engine."""
    return start_module_broker(engine=request.param, sync_flush=True)


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks_deliver(flush_broker, acks: str) -> None:
    topic = f"acks-{acks}"
    create_topic(flush_broker.bootstrap, topic)
    records = make_records(topic, 300)
    reports = ck_produce(flush_broker.bootstrap, topic, records, "none", acks=acks)
    assert all(r is not None and r[0] is None for r in reports), "a delivery failed"
    if acks != "0":  # acks=0 has no response, so no offsets
        assert all(offset >= 0 for _, _, offset in reports)
    assert_log_matches(records, ck_consume(flush_broker.bootstrap, topic, len(records)))


# --- restarts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_restart_clean_and_after_kill(start_broker, engine: str) -> None:
    broker = start_broker(engine=engine, sync_flush=True)
    topic = "restart"
    create_topic(broker.bootstrap, topic, partitions=2)
    first = make_records("restart-a", 300)
    ck_produce_ok(broker.bootstrap, topic, first, "zstd", acks="all")

    broker.stop()  # asserts exit code 0
    assert broker.shut_down_cleanly_on_disk(), "a clean shutdown must say so on disk"
    broker.restart()
    assert not broker.shut_down_cleanly_on_disk(), "a running broker's log dir must look crashed until it stops"
    assert_log_matches(first, ck_consume(broker.bootstrap, topic, len(first), partitions=2), partitions=2)

    # kill -9 in the middle of acks=all production: every acknowledged record survives, exactly once
    acked: set[int] = set()
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 1,
            "message.timeout.ms": 60_000,
        }
    )

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            acked.add(int(msg.value()))

    produced = 0
    killer: threading.Timer | None = None
    deadline = time.monotonic() + TIMEOUT_S
    while broker.running and time.monotonic() < deadline:
        for _ in range(50):  # bursts: production outpaces the fsync-per-batch acks, so some are always in flight
            key = f"k{produced % 17}".encode()
            producer.produce(topic, key=key, value=str(produced).encode(), on_delivery=on_delivery)
            produced += 1
        producer.poll(0.002)
        if killer is None and len(acked) >= 400:
            # the kill lands while this loop goes on producing, so the broker is busy with produce requests when it
            # dies (a kill after the loop found a fast broker idle, every record acknowledged)
            killer = threading.Timer(0.03, broker.kill)
            killer.start()
    assert killer is not None, "the broker did not acknowledge enough records"
    killer.join()
    assert not broker.running, "the broker survived its kill"
    producer.purge()  # what was acknowledged before the kill is reported now; the rest is dropped
    producer.flush(10)
    assert len(acked) < produced, "nothing was in flight at the kill; the test proves less than it should"
    assert not broker.shut_down_cleanly_on_disk()

    broker.restart()
    total = sum(high for _, high in watermarks(broker.bootstrap, topic, 2))
    got = ck_consume(broker.bootstrap, topic, total, partitions=2)
    assert len(got) == total
    assert sorted(g.value for g in got if g.value.startswith(b"restart-a|")) == sorted(r.value for r in first)
    after_kill = [int(g.value) for g in got if not g.value.startswith(b"restart-a|")]
    print(f"kill -9: {produced} produced, {len(acked)} acknowledged, {len(after_kill)} in the log after restart")
    assert len(after_kill) == len(set(after_kill)), "a record is in the log twice"
    assert acked <= set(after_kill), f"{len(acked - set(after_kill))} acknowledged records were lost"
    assert set(after_kill) <= set(range(produced))
    for p in range(2):
        in_partition = sorted((g for g in got if g.partition == p), key=lambda g: g.offset)
        assert [g.offset for g in in_partition] == list(range(len(in_partition)))
        later = [int(g.value) for g in in_partition if not g.value.startswith(b"restart-a|")]
        assert later == sorted(later), f"partition {p}: records after the kill are out of order"
    broker.stop()


# --- large records -------------------------------------------------------------------------------------------


@pytest.mark.matrix("bad input: oversize message", client="confluent")
def test_large_record_roundtrip_and_too_large(broker) -> None:
    topic = "large"
    create_topic(broker.bootstrap, topic, partitions=1)
    rng = random.Random(7)
    big = bytes(rng.getrandbits(8) for _ in range(900 * 1024))  # incompressible, under max.message.bytes
    too_big = bytes(1_200_000)  # over the default max.message.bytes (1048588)
    conf = {"message.max.bytes": 10_000_000, "enable.idempotence": False, "retries": 0}

    reports = ck_produce(broker.bootstrap, topic, [Rec(b"big", big)], **conf)
    assert reports[0][0] is None, reports
    reports = ck_produce(broker.bootstrap, topic, [Rec(b"too-big", too_big)], **conf)
    assert reports[0][0] is not None and reports[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE, reports

    got = ck_consume(broker.bootstrap, topic, 1, partitions=1)
    assert [(g.key, g.value == big) for g in got] == [(b"big", True)]
    assert watermarks(broker.bootstrap, topic, 1) == [(0, 1)], "the rejected record must not be stored"

    # the topic's own max.message.bytes applies
    create_topic(broker.bootstrap, "large-small-limit", partitions=1, config={"max.message.bytes": "100000"})
    reports = ck_produce(broker.bootstrap, "large-small-limit", [Rec(b"a", big[:90_000])], **conf)
    assert reports[0][0] is None, reports
    reports = ck_produce(broker.bootstrap, "large-small-limit", [Rec(b"b", big[:150_000])], **conf)
    assert reports[0][0] is not None and reports[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE, reports
    assert watermarks(broker.bootstrap, "large-small-limit", 1) == [(0, 1)]


# --- long polling --------------------------------------------------------------------------------------------


def test_long_poll_wakes_on_produce(broker) -> None:
    topic = "long-poll"
    create_topic(broker.bootstrap, topic, partitions=1)
    consumer = ck_consumer(broker.bootstrap, topic, **{"fetch.wait.max.ms": 5000, "fetch.min.bytes": 1})
    acked_at: list[float] = []

    def produce_later() -> None:
        time.sleep(1.0)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        producer.produce(topic, value=b"wake up", on_delivery=lambda err, msg: acked_at.append(time.monotonic()))
        producer.flush(TIMEOUT_S)

    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert consumer.poll(0.5) is None  # the consumer is now parked in a 5 s fetch on the empty partition
        thread = threading.Thread(target=produce_later)
        start = time.monotonic()
        thread.start()
        msg = None
        while msg is None and time.monotonic() - start < 10:
            msg = consumer.poll(0.1)
        received_at = time.monotonic()
        thread.join()
    finally:
        consumer.close()
    assert msg is not None and msg.error() is None and msg.value() == b"wake up"
    assert acked_at, "the produce was not acknowledged"
    waited, after_ack = received_at - start, received_at - acked_at[0]
    print(f"long poll: the record arrived {waited:.3f} s after the poll began, {after_ack:.3f} s after its ack")
    assert received_at - start < 3.0, f"record arrived {received_at - start:.2f} s after the poll started"
    assert received_at - acked_at[0] < 1.0, f"record reached the consumer {received_at - acked_at[0]:.2f} s after ack"


def test_idle_consumer_does_not_busy_loop_the_broker(broker) -> None:
    topic = "idle"
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    consumer = ck_consumer(broker.bootstrap, topic, **{"fetch.wait.max.ms": 500})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        consumer.poll(1.0)  # connected and fetching
        before = broker.cpu_seconds()
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            assert consumer.poll(0.2) is None
        used = broker.cpu_seconds() - before
    finally:
        consumer.close()
    print(f"broker CPU during 3 s of idle long polling: {used:.3f} s")
    assert used < 0.5, f"the broker used {used:.2f} s of CPU in 3 s of idle long polling"


# --- record details ------------------------------------------------------------------------------------------


def test_null_and_empty_keys_values_headers_and_timestamps(broker) -> None:
    """null is not empty: a tombstone (null value), a null key and a null header value survive as null."""
    topic = "nulls"
    create_topic(broker.bootstrap, topic, partitions=1)
    cases = [
        (b"k", None, [("h", None)]),
        (None, b"v", [("h", b"")]),
        (b"", b"", []),
        (None, None, [("a", b"1"), ("a", None), ("", b"x")]),
    ]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i, (key, value, headers) in enumerate(cases):
        producer.produce(topic, key=key, value=value, headers=headers, partition=0, timestamp=TS + i)
    assert producer.flush(TIMEOUT_S) == 0

    consumer = ck_consumer(broker.bootstrap, topic)
    got = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < len(cases) and time.monotonic() < deadline:
            got += [m for m in consumer.consume(len(cases), 0.5) if m.error() is None]
    finally:
        consumer.close()
    assert [(m.key(), m.value(), m.headers() or []) for m in got] == cases
    assert [m.timestamp()[1] for m in got] == [TS + i for i in range(len(cases))]

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    kp = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        kp.assign([KpTopicPartition(topic, 0)])
        kp.seek_to_beginning()
        records: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(records) < len(cases) and time.monotonic() < deadline:
            for batch in kp.poll(timeout_ms=500).values():
                records += batch
    finally:
        kp.close()
    assert [(r.key, r.value, list(r.headers)) for r in records] == cases
    assert [r.timestamp for r in records] == [TS + i for i in range(len(cases))]


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_log_append_time_topic(broker, codec: str) -> None:
    """message.timestamp.type=LogAppendTime: the broker's clock replaces the producer's timestamps."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    topic = f"log-append-time-{codec}"
    create_topic(broker.bootstrap, topic, partitions=1, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 20})
    reports: list[Any] = []
    for i in range(5):
        producer.produce(topic, value=f"v{i}".encode(), timestamp=TS + i, on_delivery=lambda e, m: reports.append(m))
    assert producer.flush(TIMEOUT_S) == 0
    after = int(time.time() * 1000)
    assert all(before - 1000 <= m.timestamp()[1] <= after + 1000 for m in reports), [m.timestamp() for m in reports]

    consumer = ck_consumer(broker.bootstrap, topic)
    got = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 5 and time.monotonic() < deadline:
            got += [m for m in consumer.consume(5, 0.5) if m.error() is None]
    finally:
        consumer.close()
    assert [m.value() for m in got] == [f"v{i}".encode() for i in range(5)]
    for m in got:
        kind, ts = m.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME and before - 1000 <= ts <= after + 1000, m.timestamp()


@pytest.mark.matrix("consumer: read a partition from an offset", client="{consumer}")
@pytest.mark.parametrize("consumer", ["confluent", "kafka-python", "aiokafka"])
def test_fetch_from_the_middle_of_a_compressed_batch(broker, consumer: str) -> None:
    topic = f"mid-batch-{consumer}"
    create_topic(broker.bootstrap, topic, partitions=1)
    records = [Rec(b"k", f"value {i:04d} ".encode() * 20) for i in range(300)]
    ck_produce_ok(broker.bootstrap, topic, records, "lz4", **{"linger.ms": 100, "partitioner": "consistent_random"})
    start = 137
    if consumer == "confluent":
        c = ck_consumer(broker.bootstrap, topic)
        got = []
        try:
            c.assign([TopicPartition(topic, 0, start)])
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < 300 - start and time.monotonic() < deadline:
                got += [(m.offset(), m.value()) for m in c.consume(300, 0.5) if m.error() is None]
        finally:
            c.close()
    elif consumer == "kafka-python":
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KpTopicPartition

        tp = KpTopicPartition(topic, 0)
        kp = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
        got = []
        try:
            kp.assign([tp])
            kp.seek(tp, start)
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < 300 - start and time.monotonic() < deadline:
                for batch in kp.poll(timeout_ms=500).values():
                    got += [(r.offset, r.value) for r in batch]
        finally:
            kp.close()
    else:
        from aiokafka import AIOKafkaConsumer
        from aiokafka import TopicPartition as AioTopicPartition

        async def run() -> list[tuple[int, bytes]]:
            tp = AioTopicPartition(topic, 0)
            aio = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
            await aio.start()
            out: list[tuple[int, bytes]] = []
            try:
                aio.assign([tp])
                aio.seek(tp, start)
                deadline = time.monotonic() + TIMEOUT_S
                while len(out) < 300 - start and time.monotonic() < deadline:
                    for batch in (await aio.getmany(timeout_ms=500)).values():
                        out += [(r.offset, r.value) for r in batch]
            finally:
                await aio.stop()
            return out

        got = asyncio.run(run())
    assert got == [(i, records[i].value) for i in range(start, 300)]


def test_tiny_fetch_sizes_still_make_progress(broker) -> None:
    """KIP-74: a batch larger than max.partition.fetch.bytes / fetch.max.bytes is still returned whole."""
    topic = "tiny-fetch"
    create_topic(broker.bootstrap, topic, partitions=2)
    records = make_records(topic, 200)
    ck_produce_ok(broker.bootstrap, topic, records, "none", **{"linger.ms": 50})
    got = ck_consume(
        broker.bootstrap,
        topic,
        len(records),
        partitions=2,
        **{"max.partition.fetch.bytes": 100, "fetch.max.bytes": 1000, "message.max.bytes": 1000},
    )
    assert_log_matches(records, got, partitions=2)
    got = kp_consume(
        broker.bootstrap, topic, len(records), partitions=2, max_partition_fetch_bytes=100, fetch_max_bytes=100
    )
    assert_log_matches(records, got, partitions=2)


@pytest.mark.matrix("bad input: out-of-range offset", client="confluent")
@pytest.mark.parametrize("reset", ["earliest", "latest", "error"])
def test_fetch_offset_out_of_range(broker, reset: str) -> None:
    topic = f"out-of-range-{reset}"
    create_topic(broker.bootstrap, topic, partitions=1)
    ck_produce_ok(broker.bootstrap, topic, [Rec(b"k", f"old-{i}".encode()) for i in range(10)])
    consumer = ck_consumer(broker.bootstrap, topic, **{"auto.offset.reset": reset})
    try:
        consumer.assign([TopicPartition(topic, 0, 1000)])
        if reset == "latest":  # nothing old; a record produced now arrives
            assert consumer.poll(1.0) is None
            ck_produce_ok(broker.bootstrap, topic, [Rec(b"k", b"new")])
        first = None
        deadline = time.monotonic() + TIMEOUT_S
        while first is None and time.monotonic() < deadline:
            first = consumer.poll(0.2)
    finally:
        consumer.close()
    assert first is not None
    if reset == "error":
        assert first.error() is not None and first.error().code() == KafkaError._AUTO_OFFSET_RESET
    else:
        assert first.error() is None
        assert (first.offset(), first.value()) == ((0, b"old-0") if reset == "earliest" else (10, b"new"))


def test_metadata_auto_creates_only_when_allowed(broker) -> None:
    bootstrap = broker.bootstrap
    consumer = ck_consumer(bootstrap, "no-create", **{"allow.auto.create.topics": False})
    try:
        metadata = consumer.list_topics(topic="never-created", timeout=10)
        assert metadata.topics["never-created"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        consumer.close()
    assert "never-created" not in admin(bootstrap).list_topics(timeout=10).topics

    ck_produce_ok(bootstrap, "auto-created", [Rec(b"k", b"v")])  # a producer's metadata request may create it
    topics = admin(bootstrap).list_topics(timeout=10).topics
    assert len(topics["auto-created"].partitions) == 1  # num.partitions defaults to 1


def test_concurrent_auto_creation_of_one_topic_answers_every_client(start_broker) -> None:
    """Topic creation runs on the broker's admin thread: several Metadata requests asking for the same new topic at
    once queue several creations; the ones after the first find the topic made and describe it, none is told
    TOPIC_ALREADY_EXISTS. Raw Metadata v4 requests (allow_auto_topic_creation), all sent before any is answered."""
    from kio.schema.metadata.v4.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.metadata.v4.response import MetadataResponse
    from kio.serial import entity_reader, entity_writer
    from kio.static.primitive import i32

    broker = start_broker({"num.partitions": 300})  # slow enough to create that the requests overlap
    body = MetadataRequest(topics=(MetadataRequestTopic(name="racy"),), allow_auto_topic_creation=True)
    header_cls = MetadataRequest.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_cls)(buffer, header_cls(request_api_key=body.__api_key__, request_api_version=body.__version__,
                                                 correlation_id=i32(7), client_id="racer"))  # fmt: skip
    entity_writer(MetadataRequest)(buffer, body)
    request = len(buffer.getvalue()).to_bytes(4, "big") + buffer.getvalue()
    sockets = [socket.create_connection(("127.0.0.1", broker.port), timeout=60) for _ in range(4)]
    try:
        for sock in sockets:
            sock.sendall(request)
        errors = []
        for sock in sockets:
            size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
            payload = sock.recv(size, socket.MSG_WAITALL)
            _header, offset = entity_reader(MetadataResponse.__header_schema__)(payload, 0)
            response, _ = entity_reader(MetadataResponse)(payload, offset)
            errors += [(topic.name, int(topic.error_code), len(topic.partitions)) for topic in response.topics]
    finally:
        for sock in sockets:
            sock.close()
    assert errors == [("racy", 0, 300)] * len(sockets)


# --- the harness itself --------------------------------------------------------------------------------------


def test_a_broker_that_cannot_start_is_reported_with_its_stderr(start_broker) -> None:
    with pytest.raises(RuntimeError, match=r"exited with code 2(.|\n)*no\.such\.key"):
        start_broker({"no.such.key": "1"})
