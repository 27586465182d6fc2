"""Old client generations against one broker: the API versions Kafka 3.9 accepts below what kio carries.

Produce v0-v2 and Fetch v0-v3 through real clients forced to old protocol versions (kafka-python's `api_version`,
librdkafka's `api.version.request=false` + `broker.version.fallback`): round trips with keys, null keys, null
values and codecs, so the broker's up-conversion (produce) and down-conversion (fetch) meet the clients' own
legacy codecs. The other old versions (OffsetCommit v1 as Sarama sends it, OffsetFetch v0, DescribeConfigs v0,
ListOffsets v0), a topic with `message.downconversion.enable=false` and an unserved version are spoken by hand,
big-endian, so nothing of the broker's own schemas is trusted.
"""

from __future__ import annotations

import socket
import struct
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from broker_process import BrokerProcess
from tidelog.tools import api_versions

UNSUPPORTED_VERSION = 35
COUNT = 12


def _records(i: int) -> tuple[bytes | None, bytes | None]:
    """Keys and values with nulls (never both: kafka-python refuses that)."""
    key = None if i % 4 == 0 else f"key-{i}".encode()
    value = None if i % 5 == 3 and key is not None else f"value-{i}".encode() * (i + 1)
    return key, value


def _consume_kafka_python(
    bootstrap: str, topic: str, api_version: tuple[int, ...], count: int = COUNT
) -> list[tuple[int, object, object]]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        api_version=api_version,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        got = []
        for message in consumer:
            got.append((message.offset, message.key, message.value))
            if len(got) == count:
                break
        return got
    finally:
        consumer.close()


@pytest.mark.matrix("old protocol versions (a 0.9 or 0.10 client)", client="kafka-python")
@pytest.mark.parametrize(
    ("api_version", "codec"),
    [((0, 9), None), ((0, 9), "gzip"), ((0, 10, 0), "snappy"), ((0, 10, 1), "lz4"), ((0, 10, 1), None)],
)
def test_kafka_python_old_generations_round_trip(
    broker: BrokerProcess, api_version: tuple[int, ...], codec: str | None
) -> None:
    """(0, 9): Produce v1 / Fetch v1 with magic 0; (0, 10, x): Produce v2 / Fetch v2-v3 with magic 1 and timestamps."""
    topic = f"old-kp-{'-'.join(map(str, api_version))}-{codec}"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=api_version, compression_type=codec)
    for i in range(COUNT):
        key, value = _records(i)
        producer.send(topic, key=key, value=value, timestamp_ms=1_700_000_000_000 + i if api_version > (0, 9) else None)
    producer.flush()
    producer.close()
    got = _consume_kafka_python(broker.bootstrap, topic, api_version)
    assert got == [(i, *_records(i)) for i in range(COUNT)]


@pytest.mark.matrix("old protocol versions (a 0.9 or 0.10 client)", client="confluent")
@pytest.mark.parametrize("fallback", ["0.9.0.1", "0.10.0.0"])
def test_librdkafka_without_api_version_request_round_trips(broker: BrokerProcess, fallback: str) -> None:
    topic = f"old-rdkafka-{fallback}"
    legacy = {"bootstrap.servers": broker.bootstrap, "api.version.request": False, "broker.version.fallback": fallback}
    producer = Producer({**legacy, "compression.codec": "gzip", "linger.ms": 5})
    for i in range(COUNT):
        key, value = _records(i)
        producer.produce(topic, key=key, value=value)
    assert producer.flush(10) == 0
    consumer = Consumer({**legacy, "group.id": f"g-{fallback}", "auto.offset.reset": "earliest"})
    try:
        consumer.assign([ConfluentPartition(topic, 0, 0)])
        got = []
        while len(got) < COUNT:
            message = consumer.poll(5)
            assert message is not None, f"only {len(got)} records came back"
            assert message.error() is None, message.error()
            got.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()
    assert got == [(i, *_records(i)) for i in range(COUNT)]


# --- by hand ---------------------------------------------------------------------------------------------------


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


class Wire:
    """One connection; requests with header v1 (client id `old-versions`), responses read whole."""

    def __init__(self, broker: BrokerProcess, client_id: str = "old-versions") -> None:
        assert broker.port is not None
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        self.client_id = client_id
        self.correlation_id = 0

    def call(self, api_key: int, version: int, body: bytes) -> bytes | None:
        """The response body after the correlation id, or None when the broker closed the connection."""
        self.correlation_id += 1
        payload = struct.pack(">hhi", api_key, version, self.correlation_id) + _string(self.client_id) + body
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = self._exactly(4)
        if size is None:
            return None
        data = self._exactly(struct.unpack(">i", size)[0])
        assert data is not None
        assert struct.unpack_from(">i", data)[0] == self.correlation_id
        return data[4:]

    def _exactly(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def _produce_modern(broker: BrokerProcess, topic: str, count: int, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=config or {})])[topic].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(count):
        producer.produce(topic, key=b"k", value=f"v{i}".encode())
    assert producer.flush(10) == 0


def test_sarama_offset_commit_v1_and_offset_fetch_v0(broker: BrokerProcess) -> None:
    """Sarama's default OffsetCommit v1 (generation -1: a simple commit, with a per-partition commit timestamp),
    read back with OffsetFetch v0 (ZooKeeper-stored offsets in Kafka: here the same store)."""
    topic, group = "old-commit", "old-commit-group"
    _produce_modern(broker, topic, 3)
    wire = Wire(broker)
    commit = (
        _string(group)
        + struct.pack(">i", -1)
        + _string("")
        + struct.pack(">i", 1)
        + _string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">iqq", 0, 2, -1)
        + _string("sarama-metadata")
    )
    answer = wire.call(8, 1, commit)
    assert answer is not None
    # topics[1] name partitions[1] index error
    assert answer == struct.pack(">i", 1) + _string(topic) + struct.pack(">iih", 1, 0, 0)
    answer = wire.call(9, 0, _string(group) + struct.pack(">i", 1) + _string(topic) + struct.pack(">ii", 1, 0))
    assert answer == (
        struct.pack(">i", 1) + _string(topic) + struct.pack(">iiq", 1, 0, 2) + _string("sarama-metadata") + b"\x00\x00"
    )
    wire.close()


def test_describe_configs_v0_has_is_default(broker: BrokerProcess) -> None:
    topic = "old-describe"
    _produce_modern(broker, topic, 1, {"retention.ms": "123456"})
    wire = Wire(broker)
    request = struct.pack(">i", 1) + struct.pack(">b", 2) + _string(topic) + struct.pack(">i", 2)
    request += _string("retention.ms") + _string("cleanup.policy")
    answer = wire.call(32, 0, request)
    wire.close()
    assert answer is not None
    expected = struct.pack(">ii", 0, 1) + struct.pack(">h", 0) + _string(None) + struct.pack(">b", 2) + _string(topic)
    expected += struct.pack(">i", 2)
    # name, value, read_only, is_default, is_sensitive (configs come back sorted by name)
    expected += _string("cleanup.policy") + _string("delete") + bytes([0, 1, 0])
    expected += _string("retention.ms") + _string("123456") + bytes([0, 0, 0])
    assert answer == expected


def test_list_offsets_v0_answers_old_style_offsets(broker: BrokerProcess) -> None:
    topic = "old-list-offsets"
    _produce_modern(broker, topic, 5)
    wire = Wire(broker)
    answers = []
    for target in (-1, -2):
        request = struct.pack(">ii", -1, 1) + _string(topic) + struct.pack(">iiqi", 1, 0, target, 1)
        answers.append(wire.call(2, 0, request))
    wire.close()
    prefix = struct.pack(">i", 1) + _string(topic) + struct.pack(">iih", 1, 0, 0)
    assert answers == [prefix + struct.pack(">iq", 1, 5), prefix + struct.pack(">iq", 1, 0)]


def test_downconversion_disabled_refuses_old_fetches_only(broker: BrokerProcess) -> None:
    topic = "old-no-downconversion"
    _produce_modern(broker, topic, 2, {"message.downconversion.enable": "false"})
    wire = Wire(broker)
    fetch = (
        struct.pack(">iii", -1, 0, 0) + struct.pack(">i", 1) + _string(topic) + struct.pack(">iiqi", 1, 0, 0, 1 << 20)
    )
    answer = wire.call(1, 2, fetch)  # v2: throttle | topics[name, partitions[index, error, hw, records]]
    assert answer is not None
    assert answer == struct.pack(">ii", 0, 1) + _string(topic) + struct.pack(">iihqi", 1, 0, UNSUPPORTED_VERSION, 2, 0)
    wire.close()
    modern = _consume_kafka_python(broker.bootstrap, topic, (2, 0), count=2)  # Fetch v4+: no conversion, no refusal
    assert [value for _, _, value in modern] == [b"v0", b"v1"]


def test_unserved_version_closes_and_is_logged_once(broker: BrokerProcess) -> None:
    client_id = f"too-new-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        wire = Wire(broker, client_id)
        assert wire.call(3, 99, b"") is None  # Metadata v99: the connection closes, as Kafka closes it
        wire.close()
    wire = Wire(broker, client_id)
    assert wire.call(18, 0, b"") is not None  # the broker still serves the client's next connection
    wire.close()
    assert broker.stderr_text().count(client_id) == 1


def test_api_versions_tells_what_the_handler_table_serves(broker: BrokerProcess) -> None:
    """ApiVersions v0 (error, [key, min, max]) is docs/compatibility.md's tidelog column, less the cluster's APIs."""
    wire = Wire(broker)
    answer = wire.call(18, 0, b"")
    wire.close()
    assert answer is not None
    (error, count), pos, advertised = struct.unpack_from(">hi", answer), 6, {}
    for _ in range(count):
        key, low, high = struct.unpack_from(">hhh", answer, pos)
        advertised[key] = (low, high)
        pos += 6
    assert error == 0
    expected = {k: v for k, v in api_versions.served().items() if k not in api_versions.CLUSTER_ONLY}
    assert advertised == expected
