"""Client quotas through a real `tidelog serve`: AlterClientQuotas and DescribeClientQuotas (v0 and v1, raw requests:
neither confluent-kafka nor kafka-python has the calls), their errors, the file they persist in, and their effect on
real clients: a confluent-kafka producer held to its producer_byte_rate with throttle times reported, a consumer
held to its consumer_byte_rate, and request_percentage throttling Metadata requests.

One broker for the module, with 2 quota windows of 1 s (Kafka's 11 let a new client send 10 windows' worth at once,
which a 4 s measurement cannot average away); each test uses its own client ids and removes its quotas.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire
from tidelog.protocol.messages import ApiKey

TIMEOUT_S = 30.0
RATE = 100 * 1024  # bytes per second
EXACT, DEFAULT, ANY = 0, 1, 2


@pytest.fixture(scope="module")
def broker(start_module_broker):
    return start_module_broker({"quota.window.num": "2", "quota.window.size.seconds": "1"})


def alter(broker, entity: dict[str, str | None], ops: dict[str, float | None], *, validate_only=False, version=1):
    """One AlterClientQuotas entry: a None value removes the key. Returns (error code, message)."""
    body = {
        "entries": [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
                "ops": [{"key": k, "value": v or 0.0, "remove": v is None} for k, v in ops.items()],
            }
        ],
        "validate_only": validate_only,
    }
    response = kafka_wire.request(broker.bootstrap, ApiKey.ALTER_CLIENT_QUOTAS, version, body)
    [entry] = response.entries
    return int(entry.error_code), entry.error_message


def describe(broker, components: list[tuple[str, int, str | None]], *, strict=False, version=1) -> Any:
    body = {
        "components": [{"entity_type": t, "match_type": m, "match": n} for t, m, n in components],
        "strict": strict,
    }
    return kafka_wire.request(broker.bootstrap, ApiKey.DESCRIBE_CLIENT_QUOTAS, version, body)


def entries(response: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    assert response.error_code == 0, response.error_message
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
        for entry in response.entries
    }


def test_alter_and_describe_with_every_match_type(broker) -> None:
    assert alter(broker, {"user": "alice"}, {"producer_byte_rate": 2048, "request_percentage": 12.5}) == (0, None)
    assert alter(broker, {"user": "alice", "client-id": None}, {"consumer_byte_rate": 4096}) == (0, None)
    assert alter(broker, {"client-id": "app-1"}, {"producer_byte_rate": 1024}, version=0) == (0, None)
    assert alter(broker, {"user": None}, {"controller_mutation_rate": 5.0}) == (0, None)

    alice = (("user", "alice"),)
    alice_default_client = (("client-id", None), ("user", "alice"))
    app = (("client-id", "app-1"),)
    default_user = (("user", None),)
    everything = entries(describe(broker, []))
    assert everything == {
        alice: {"producer_byte_rate": 2048.0, "request_percentage": 12.5},
        alice_default_client: {"consumer_byte_rate": 4096.0},
        app: {"producer_byte_rate": 1024.0},
        default_user: {"controller_mutation_rate": 5.0},
    }
    assert entries(describe(broker, [], strict=True)) == {}
    assert set(entries(describe(broker, [("user", EXACT, "alice")]))) == {alice, alice_default_client}
    assert set(entries(describe(broker, [("user", EXACT, "alice")], strict=True))) == {alice}
    assert set(entries(describe(broker, [("user", DEFAULT, None)], strict=True))) == {default_user}
    assert set(entries(describe(broker, [("user", ANY, None)], strict=True))) == {alice, default_user}
    assert set(entries(describe(broker, [("client-id", ANY, None)], strict=False))) == {alice_default_client, app}
    both = [("user", ANY, None), ("client-id", DEFAULT, None)]
    assert set(entries(describe(broker, both, strict=True, version=0))) == {alice_default_client}

    # validate_only stores nothing; a removal takes the key away, the last one the entity
    assert alter(broker, {"client-id": "app-1"}, {"producer_byte_rate": 9999}, validate_only=True) == (0, None)
    assert entries(describe(broker, [("client-id", EXACT, "app-1")]))[app] == {"producer_byte_rate": 1024.0}
    assert alter(broker, {"user": "alice"}, {"request_percentage": None}) == (0, None)
    assert alter(broker, {"client-id": "app-1"}, {"producer_byte_rate": None}) == (0, None)
    described = entries(describe(broker, []))
    assert described[alice] == {"producer_byte_rate": 2048.0} and app not in described

    # persisted in the log dir, as the file's format says, and read back at start
    stored = json.loads((broker.log_dir / "tidelog-client-quotas.json").read_text())
    assert {"entity": [["user", "alice"]], "config": {"producer_byte_rate": "2048"}} in stored["entities"]
    broker.restart()
    assert entries(describe(broker, [])) == described
    keys = ("producer_byte_rate", "consumer_byte_rate", "controller_mutation_rate")
    for entity in ({"user": "alice"}, {"user": "alice", "client-id": None}, {"user": None}):
        alter(broker, entity, dict.fromkeys(keys))
    assert entries(describe(broker, [])) == {}


def test_bad_requests_get_kafka_errors(broker) -> None:
    invalid_request, unsupported_version = 42, 35
    code, message = alter(broker, {"user": "bob"}, {"no_such_quota": 1.0})
    assert code == invalid_request and "no_such_quota" in message
    code, message = alter(broker, {"user": "bob"}, {"producer_byte_rate": 10.5})
    assert code == invalid_request and "LONG" in message
    assert alter(broker, {"user": "bob"}, {"producer_byte_rate": -1})[0] == invalid_request
    assert alter(broker, {}, {"producer_byte_rate": 1})[0] == invalid_request
    assert alter(broker, {"user": ""}, {"producer_byte_rate": 1})[0] == invalid_request
    assert alter(broker, {"group": "g"}, {"producer_byte_rate": 1})[0] == invalid_request
    assert describe(broker, [("user", EXACT, None)]).error_code == invalid_request
    assert describe(broker, [("user", DEFAULT, "x")]).error_code == invalid_request
    assert describe(broker, [("user", ANY, None), ("user", ANY, None)]).error_code == invalid_request
    assert describe(broker, [("user", 7, None)]).error_code == invalid_request
    response = describe(broker, [("group", ANY, None)])
    assert response.error_code == unsupported_version and "group" in response.error_message
    assert entries(describe(broker, [])) == {}  # nothing was stored by any of them


def produce_flat_out(broker, topic: str, client_id: str, seconds: float) -> tuple[float, list[int]]:
    """Bytes per second delivered after the first second (the burst one window allows), and the throttle times."""
    throttles: list[int] = []
    delivered: list[tuple[float, int]] = []
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "queue.buffering.max.kbytes": 64,  # flat out, but not a backlog that takes long to flush
            "throttle_cb": lambda event: throttles.append(int(event.throttle_time * 1000)),
        }
    )

    def on_delivery(error, message) -> None:
        if error is None:
            delivered.append((time.monotonic(), len(message.value())))

    value = b"x" * 1024
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            producer.produce(topic, value, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(TIMEOUT_S)
    warm = started + 1.0
    ends = [t for t, _ in delivered if t >= warm]
    steady = sum(size for t, size in delivered if t >= warm)
    return steady / (max(ends) - warm), throttles


def create_topic(broker, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=TIMEOUT_S)


@pytest.mark.matrix("quotas: produce and fetch held to a byte rate", client="confluent")
def test_producer_held_to_its_byte_rate(broker) -> None:
    create_topic(broker, "quota-produce")
    assert alter(broker, {"client-id": "slow-producer"}, {"producer_byte_rate": RATE}) == (0, None)
    rate, throttles = produce_flat_out(broker, "quota-produce", "slow-producer", 4.0)
    print(f"throttled producer: {rate / 1024:.0f} KiB/s against {RATE / 1024:.0f}, {len(throttles)} throttles")
    assert 0.7 * RATE <= rate <= 1.3 * RATE
    assert throttles and max(throttles) > 0
    # an unthrottled client id beside it goes faster than the quota by far
    unthrottled, none = produce_flat_out(broker, "quota-produce", "fast-producer", 1.5)
    assert unthrottled > 3 * RATE and not none
    alter(broker, {"client-id": "slow-producer"}, {"producer_byte_rate": None})


@pytest.mark.matrix("quotas: produce and fetch held to a byte rate", client="confluent")
def test_consumer_held_to_its_byte_rate(broker) -> None:
    create_topic(broker, "quota-fetch")
    # batches of 16 KiB: a fetch returns at least one whole batch, which must fit the quota's window (100 KiB here)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.size": 16384})
    for _ in range(300):
        producer.produce("quota-fetch", b"y" * 1024)
    producer.flush(TIMEOUT_S)
    assert alter(broker, {"client-id": "slow-consumer"}, {"consumer_byte_rate": RATE}) == (0, None)
    throttles: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "client.id": "slow-consumer",
            "group.id": "quota-fetch-group",
            "max.partition.fetch.bytes": 65536,
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    consumer.assign([TopicPartition("quota-fetch", 0, 0)])
    received = 0
    first = None
    deadline = time.monotonic() + TIMEOUT_S
    while received < 300 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            first = first or time.monotonic()
            received += 1
    elapsed = time.monotonic() - (first or 0)
    consumer.close()
    alter(broker, {"client-id": "slow-consumer"}, {"consumer_byte_rate": None})
    print(f"throttled consumer: 300 KiB in {elapsed:.1f} s, {len(throttles)} throttles")
    assert received == 300
    assert elapsed >= 1.5  # 300 KiB at 100 KiB/s, the first window's worth at once
    assert throttles


def test_request_percentage_throttles_requests(broker) -> None:
    # kafka_wire's requests carry client id "test"; a tiny share of one handler's time throttles the second
    assert alter(broker, {"client-id": "test"}, {"request_percentage": 0.001}) == (0, None)
    throttles = [metadata_throttle_s(broker) for _ in range(3)]
    assert alter(broker, {"client-id": "test"}, {"request_percentage": None}) == (0, None)
    assert max(throttles) > 0.5 and max(throttles) <= 1.0  # at most one window, as Kafka bounds request quotas
    assert metadata_throttle_s(broker) == 0


def metadata_throttle_s(broker) -> float:
    body = {"topics": [], "allow_auto_topic_creation": False}
    return kafka_wire.request(broker.bootstrap, ApiKey.METADATA, 12, body).throttle_time.total_seconds()
