"""SCRAM credentials over the protocol (DescribeUserScramCredentials, AlterUserScramCredentials) against the secure
broker: confluent-kafka's AdminClient as the super user creates a user, which then authenticates with SCRAM on the
SASL_PLAINTEXT listener; the credentials land in the same users file `tidelog users` edits; Kafka's per-user errors
(raw requests where librdkafka checks them itself first) and the cluster authorization."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from security_clients import Certificates, confluent_config, tidelog

import kafka_wire
from broker_process import BrokerProcess
from tidelog.broker.scram import MECHANISMS as SCRAM
from tidelog.protocol.messages import ApiKey

TIMEOUT_S = 30.0
RESOURCE_NOT_FOUND, DUPLICATE_RESOURCE, UNACCEPTABLE_CREDENTIAL = 91, 92, 93
UNSUPPORTED_SASL_MECHANISM, CLUSTER_AUTHORIZATION_FAILED = 33, 31


def admin_as(broker: BrokerProcess, certificates: Certificates, user: str) -> AdminClient:
    return AdminClient(confluent_config(broker, "SASL_PLAINTEXT", certificates, "SCRAM-SHA-256", user))


def carol(broker: BrokerProcess, certificates: Certificates, mechanism: str, password: str) -> AdminClient:
    config = confluent_config(broker, "SASL_PLAINTEXT", certificates, mechanism, "admin", password)
    return AdminClient({**config, "sasl.username": "carol"})


def test_a_user_created_over_the_protocol_logs_in_with_scram(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    admin = admin_as(secure_broker, certificates, "admin")
    upsertions = [
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"carol-pw"),
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"carol-pw"),
    ]
    admin.alter_user_scram_credentials(upsertions, request_timeout=15)["carol"].result(timeout=TIMEOUT_S)

    described = admin.describe_user_scram_credentials(["carol"], request_timeout=15)["carol"].result(TIMEOUT_S)
    infos = sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos)
    assert infos == [(ScramMechanism.SCRAM_SHA_256, 8192), (ScramMechanism.SCRAM_SHA_512, 4096)]
    every = admin.describe_user_scram_credentials(request_timeout=15).result(TIMEOUT_S)
    assert {"admin", "alice", "bob", "carol"} <= set(every)

    stored = json.loads((secure_broker.log_dir / "tidelog-users.json").read_text())["users"]["carol"]
    assert set(stored) == set(SCRAM) and stored["SCRAM-SHA-256"]["iterations"] == 8192
    assert "carol" in tidelog("users", "--log-dir", str(secure_broker.log_dir), "--list").stdout

    for mechanism in SCRAM:  # carol logs in with either mechanism
        assert carol(secure_broker, certificates, mechanism, "carol-pw").list_topics(timeout=TIMEOUT_S).brokers
    with pytest.raises(KafkaException):  # and only with her password
        carol(secure_broker, certificates, "SCRAM-SHA-256", "not-hers").list_topics(timeout=5)

    deletion = [UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)]
    admin.alter_user_scram_credentials(deletion, request_timeout=15)["carol"].result(timeout=TIMEOUT_S)
    described = admin.describe_user_scram_credentials(["carol"], request_timeout=15)["carol"].result(TIMEOUT_S)
    assert [i.mechanism for i in described.scram_credential_infos] == [ScramMechanism.SCRAM_SHA_256]


def alter(broker: BrokerProcess, deletions: list[tuple[str, int]], upsertions: list[tuple[str, int, int]]) -> Any:
    body = {
        "deletions": [{"name": n, "mechanism": m} for n, m in deletions],
        "upsertions": [
            {"name": n, "mechanism": m, "iterations": i, "salt": b"salt", "salted_password": b"s" * 32}
            for n, m, i in upsertions
        ],
    }
    response = kafka_wire.request(broker.bootstrap, ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, body)
    return {r.user: (int(r.error_code), r.error_message) for r in response.results}


def test_kafkas_per_user_errors(secure_broker: BrokerProcess) -> None:
    # the PLAINTEXT listener's anonymous principal is refused: ALTER and DESCRIBE need the cluster
    results = alter(secure_broker, [], [("dave", 1, 4096)])
    assert results == {"dave": (CLUSTER_AUTHORIZATION_FAILED, None)}
    described = kafka_wire.request(secure_broker.bootstrap, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": None})
    assert described.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert "dave" not in tidelog("users", "--log-dir", str(secure_broker.log_dir), "--list").stdout


@pytest.fixture(scope="module")
def open_broker(start_module_broker) -> BrokerProcess:
    """A broker without an authorizer, where raw requests over PLAINTEXT may alter credentials."""
    return start_module_broker()


def test_invalid_changes_fail_per_user(open_broker: BrokerProcess) -> None:
    results = alter(
        open_broker,
        [("erin", 1), ("frank", 9)],
        [("gina", 1, 1000), ("hal", 2, 20000), ("ivan", 3, 4096), ("", 1, 4096), ("judy", 1, 4096), ("judy", 1, 8192)],
    )
    assert results["erin"][0] == RESOURCE_NOT_FOUND  # nothing to delete
    assert results["frank"][0] == UNSUPPORTED_SASL_MECHANISM
    assert results["gina"] == (UNACCEPTABLE_CREDENTIAL, "Too few iterations")
    assert results["hal"] == (UNACCEPTABLE_CREDENTIAL, "Too many iterations")
    assert results["ivan"][0] == UNSUPPORTED_SASL_MECHANISM
    assert results[""][0] == UNACCEPTABLE_CREDENTIAL
    assert results["judy"][0] == DUPLICATE_RESOURCE
    assert alter(open_broker, [], [("kim", 1, 4096), ("kim", 2, 4096)]) == {"kim": (0, None)}

    body = {"users": [{"name": "kim"}, {"name": "nobody"}, {"name": ""}, {"name": "kim"}, {"name": "erin"}]}
    response = kafka_wire.request(open_broker.bootstrap, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, body)
    by_user = {r.user: r for r in response.results}
    assert [r.user for r in response.results] == ["kim", "nobody", "", "erin"]
    assert by_user["kim"].error_code == DUPLICATE_RESOURCE
    assert by_user["nobody"].error_code == RESOURCE_NOT_FOUND and by_user[""].error_code == RESOURCE_NOT_FOUND
    body = {"users": [{"name": "kim"}]}
    [kim] = kafka_wire.request(open_broker.bootstrap, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, body).results
    assert sorted((c.mechanism, c.iterations) for c in kim.credential_infos) == [(1, 4096), (2, 4096)]
