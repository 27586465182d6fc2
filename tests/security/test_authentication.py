"""Authentication end to end: SASL PLAIN and SCRAM-SHA-256/512 on SASL_PLAINTEXT and SASL_SSL, TLS on SSL, with
librdkafka (confluent-kafka) and kafka-python against a real `tidelog serve`.

The right password authenticates (the super user then produces, fetches and commits); a wrong password or an
unknown user gets SASL_AUTHENTICATION_FAILED; a client (librdkafka or kafka-python) that sends no credentials to
a SASL listener has its connection closed at its first request after ApiVersions, as Kafka does; a client that
does not trust the server's CA fails the TLS handshake. `tidelog users --add/--remove` take effect on the running
broker.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import kafka
import kafka.errors
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from security_clients import (
    MECHANISMS,
    Certificates,
    confluent_config,
    kafka_python_config,
    tidelog,
)

from broker_process import BrokerProcess

SASL_LISTENERS = ("SASL_PLAINTEXT", "SASL_SSL")
AUTH_TIMEOUT_S = 20.0
KAFKA_PYTHON_BOOTSTRAP_MS = 1000  # each kafka-python client gives up bootstrapping after this


def _errors_until(config: dict[str, Any], wanted: int, timeout_s: float = AUTH_TIMEOUT_S) -> list[KafkaError]:
    """Start a librdkafka producer and collect its error_cb errors until one has code `wanted`."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not any(e.code() == wanted for e in errors):
        producer.poll(0.1)
    return errors


def _round_trip(broker: BrokerProcess, config: dict[str, Any], topic: str) -> None:
    """Produce 3 records, fetch them back and commit the offset with these settings."""
    producer = Producer({**config, "acks": "all"})
    for i in range(3):
        producer.produce(topic, f"v{i}".encode(), key=b"k")
    assert producer.flush(30) == 0
    group = f"g-{topic}"
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values = []
        deadline = time.monotonic() + 30
        while len(values) < 3 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())
        assert values == [b"v0", b"v1", b"v2"]
        consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        assert consumer.committed([TopicPartition(topic, 0)], timeout=15)[0].offset == 3
    finally:
        consumer.close()


@pytest.mark.matrix("security: SASL PLAIN and SCRAM", client="confluent")
@pytest.mark.parametrize("listener", SASL_LISTENERS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_authenticates_and_round_trips(
    secure_broker: BrokerProcess, certificates: Certificates, listener: str, mechanism: str
) -> None:
    config = confluent_config(secure_broker, listener, certificates, mechanism, "admin")
    _round_trip(secure_broker, config, f"auth-{listener}-{mechanism}".lower())


@pytest.mark.parametrize("listener", SASL_LISTENERS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_wrong_password_fails_authentication(
    secure_broker: BrokerProcess, certificates: Certificates, listener: str, mechanism: str
) -> None:
    config = confluent_config(secure_broker, listener, certificates, mechanism, "alice", password="not-her-password")
    errors = _errors_until(config, KafkaError._AUTHENTICATION)
    failures = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert failures, f"no authentication error, got {errors}"
    text = failures[0].str()
    assert "SASL authentication error" in text
    expected = (
        "Invalid username or password"
        if mechanism == "PLAIN"
        else f"invalid credentials with SASL mechanism {mechanism}"
    )
    assert expected in text


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_unknown_user_fails_authentication(
    secure_broker: BrokerProcess, certificates: Certificates, mechanism: str
) -> None:
    config = confluent_config(secure_broker, "SASL_PLAINTEXT", certificates, mechanism, "admin")
    config["sasl.username"] = "nobody"
    errors = _errors_until(config, KafkaError._AUTHENTICATION)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


@pytest.mark.parametrize("listener", SASL_LISTENERS)
def test_no_credentials_on_a_sasl_listener_closes_the_connection(
    secure_broker: BrokerProcess, certificates: Certificates, listener: str
) -> None:
    """librdkafka speaking PLAINTEXT/SSL (no SASL) to a SASL listener: ApiVersions is answered, the Metadata
    request that follows closes the connection, so no metadata ever arrives."""
    config = confluent_config(secure_broker, listener, certificates)
    config["security.protocol"] = listener.removeprefix("SASL_") if listener == "SASL_SSL" else "PLAINTEXT"
    before = secure_broker.stderr_text().count("request before SASL authentication")
    admin = AdminClient({**config, "socket.timeout.ms": 3000})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=4)
    assert secure_broker.stderr_text().count("metadata request before SASL authentication") > before


@pytest.mark.parametrize("listener", SASL_LISTENERS)
def test_kafka_python_without_credentials_cannot_produce_consume_describe_or_commit(
    secure_broker: BrokerProcess, certificates: Certificates, listener: str
) -> None:
    """kafka-python speaking PLAINTEXT/SSL to a SASL listener: the broker answers ApiVersions and closes the
    connection at the bootstrap Metadata request, so no producer, consumer (group member or committer) or admin
    client ever starts; each raises KafkaTimeoutError('Unable to bootstrap ...') and nothing is served."""
    config = kafka_python_config(secure_broker, listener, certificates)
    config.update(security_protocol=listener.removeprefix("SASL_"), bootstrap_timeout_ms=KAFKA_PYTHON_BOOTSTRAP_MS)
    refusals_before = secure_broker.stderr_text().count("metadata request before SASL authentication")
    clients: dict[str, Callable[[], object]] = {
        "produce": lambda: kafka.KafkaProducer(**config),
        "consume and commit": lambda: kafka.KafkaConsumer(f"kp-no-credentials-{listener}", **config, group_id="g"),
        "describe": lambda: kafka.KafkaAdminClient(**config),
    }
    for purpose, start_client in clients.items():
        with pytest.raises(kafka.errors.KafkaTimeoutError, match="Unable to bootstrap"):
            start_client()
            pytest.fail(f"a client without credentials started ({purpose})")
    refusals = secure_broker.stderr_text().count("metadata request before SASL authentication") - refusals_before
    assert refusals >= len(clients)


@pytest.mark.matrix("security: SASL PLAIN and SCRAM", client="kafka-python")
@pytest.mark.matrix("security: TLS", client="kafka-python")
def test_kafka_python_authenticates_with_each_mechanism(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    topic = f"kp-auth-{uuid.uuid4().hex[:8]}"
    for listener, mechanism in [
        ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
        ("SASL_SSL", "SCRAM-SHA-512"),
        ("SASL_SSL", "PLAIN"),
    ]:
        config = kafka_python_config(secure_broker, listener, certificates, mechanism, "admin")
        producer = kafka.KafkaProducer(**config, acks="all")
        offset = producer.send(topic, f"{listener}/{mechanism}".encode()).get(timeout=30).offset
        producer.close()
        consumer = kafka.KafkaConsumer(**config, enable_auto_commit=False, consumer_timeout_ms=10_000)
        partition = kafka.TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, offset)
        record = next(iter(consumer))
        assert record.value == f"{listener}/{mechanism}".encode()
        consumer.close()


@pytest.mark.parametrize(
    ("listener", "mechanism"),
    [("SASL_SSL", mechanism) for mechanism in MECHANISMS]
    + [("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "SCRAM-SHA-512")],
)
def test_kafka_python_wrong_password_fails_authentication(
    secure_broker: BrokerProcess,
    certificates: Certificates,
    listener: str,
    mechanism: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = kafka_python_config(secure_broker, listener, certificates, mechanism, "bob", password="guess")
    caplog.set_level(logging.ERROR, logger="kafka")
    failures: list[str] = []
    deadline = time.monotonic() + AUTH_TIMEOUT_S
    while not failures and time.monotonic() < deadline:  # kafka-python retries until its bootstrap timeout
        with pytest.raises(kafka.errors.KafkaTimeoutError):
            kafka.KafkaProducer(**config, bootstrap_timeout_ms=KAFKA_PYTHON_BOOTSTRAP_MS)
        failures = [r.getMessage() for r in caplog.records if "SaslAuthenticationFailedError" in r.getMessage()]
    assert failures, [r.getMessage() for r in caplog.records]
    assert "Authentication failed" in failures[0]


@pytest.mark.matrix("security: TLS", client="confluent")
def test_ssl_listener_needs_a_trusted_certificate(secure_broker: BrokerProcess, certificates: Certificates) -> None:
    trusted = confluent_config(secure_broker, "SSL", certificates)
    assert AdminClient(trusted).list_topics(timeout=15).cluster_id
    untrusted = {**trusted, "ssl.ca.location": str(certificates.other_ca)}
    errors = _errors_until(untrusted, KafkaError._SSL, timeout_s=10)
    assert any(e.code() == KafkaError._SSL for e in errors), errors
    assert any("certificate verify failed" in e.str() for e in errors), errors


def test_users_added_and_removed_take_effect_on_the_running_broker(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    user, password = f"carol{uuid.uuid4().hex[:6]}", "carol-secret"
    log_dir = str(secure_broker.log_dir)
    tidelog("users", "--log-dir", log_dir, "--add", user, "--password", password, "--mechanism", "SCRAM-SHA-512")
    listed = tidelog("users", "--log-dir", log_dir, "--list").stdout
    assert f"'{user}' are SCRAM-SHA-512=iterations=4096" in listed
    stored = (secure_broker.log_dir / "tidelog-users.json").read_text()
    assert password not in stored and user in stored
    config = confluent_config(secure_broker, "SASL_PLAINTEXT", certificates, "SCRAM-SHA-512", "admin")
    config.update({"sasl.username": user, "sasl.password": password})
    assert AdminClient(config).list_topics(timeout=15).cluster_id  # authenticated (describing needs no ACL)
    sha256 = {**config, "sasl.mechanisms": "SCRAM-SHA-256"}  # no SHA-256 credential for this user
    assert any(e.code() == KafkaError._AUTHENTICATION for e in _errors_until(sha256, KafkaError._AUTHENTICATION))
    tidelog("users", "--log-dir", log_dir, "--remove", user)
    assert user not in tidelog("users", "--log-dir", log_dir, "--list").stdout
    time.sleep(0.3)  # the broker re-reads the users file when it changes (checked every 0.1 s)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in _errors_until(config, KafkaError._AUTHENTICATION))


def test_plaintext_listener_is_anonymous_and_still_serves(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    """The PLAINTEXT listener of the same broker needs no authentication: its clients are User:ANONYMOUS, who
    has no ACLs here, so producing is refused with TOPIC_AUTHORIZATION_FAILED."""
    config = confluent_config(secure_broker, "PLAINTEXT", certificates)
    delivered: list[Any] = []
    done = threading.Event()

    def on_delivery(error: KafkaError | None, message: Any) -> None:
        delivered.append(error)
        done.set()

    producer = Producer({**config, "allow.auto.create.topics": False})
    producer.produce("anonymous-topic", b"x", on_delivery=on_delivery)
    producer.flush(30)
    assert done.is_set()
    assert delivered[0] is not None and delivered[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
