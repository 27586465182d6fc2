"""Authorization end to end: Kafka's ACLs on topics, groups and the cluster, with librdkafka and kafka-python
against a real `tidelog serve` (authorizer.class.name set, super.users=User:admin).

A user without an ACL cannot produce, fetch, describe, commit or join a group, and gets TOPIC_ or
GROUP_AUTHORIZATION_FAILED; the same user can once the super user grants ACLs through CreateAcls
(confluent-kafka's AdminClient) or `tidelog acls --add` (a running broker picks the file change up); DescribeAcls
lists them, DeleteAcls or `tidelog acls --remove` takes the access away again. CreateTopics, DeleteTopics,
CreatePartitions, DeleteRecords, DescribeConfigs and DeleteGroups each need their own ACL (CREATE, DELETE, ALTER,
DESCRIBE_CONFIGS). DENY beats ALLOW; only a principal with ALTER on the cluster may change ACLs;
`allow.everyone.if.no.acl.found=true` opens resources without ACLs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import kafka
import kafka.errors
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from security_clients import (
    Certificates,
    add_users,
    confluent_config,
    kafka_python_config,
    make_client_certificate,
    secure_settings,
    tidelog,
)

from broker_process import BrokerProcess, StartBroker

LISTENER = "SASL_SSL"
MECHANISM = "SCRAM-SHA-256"
BROKER_NODE_ID = 1  # node.id of a broker started without one
CLUSTER = "kafka-cluster"  # the CLUSTER resource (confluent-kafka calls its type BROKER: 4, as Kafka's CLUSTER)
ACL_PROPAGATION_S = 0.3  # the broker re-reads tidelog-acls.json when it changes (checked every 0.1 s)


def _config(broker: BrokerProcess, certificates: Certificates, user: str, **extra: Any) -> dict[str, Any]:
    return confluent_config(broker, LISTENER, certificates, MECHANISM, user, **extra)


def _admin(broker: BrokerProcess, certificates: Certificates, user: str = "admin") -> AdminClient:
    return AdminClient(_config(broker, certificates, user))


def _create_topic(broker: BrokerProcess, certificates: Certificates, topic: str, records: int = 2) -> None:
    """As the super user: create the topic and store a few records in it."""
    admin = _admin(broker, certificates)  # (kept referenced: a collected AdminClient fails its futures)
    admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
    producer = Producer(_config(broker, certificates, "admin"))
    for i in range(records):
        producer.produce(topic, f"r{i}".encode())
    assert producer.flush(30) == 0


def _produce_error(config: dict[str, Any], topic: str) -> KafkaError | None:
    """Produce one record; the delivery error (None if it was stored)."""
    outcome: list[KafkaError | None] = []
    producer = Producer({"message.timeout.ms": 10_000, "allow.auto.create.topics": False, **config})
    producer.produce(topic, b"x", on_delivery=lambda error, message: outcome.append(error))
    producer.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def _consume(config: dict[str, Any], topic: str, group: str, want: int, timeout_s: float = 30) -> list[Any]:
    """Subscribe in `group` and return messages (or the first error) until `want` values or an error arrive."""
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                return [message.error()]
            got.append(message)
        if got:
            consumer.commit(message=got[-1], asynchronous=False)
    finally:
        consumer.close()
    return got


def _until(check: Callable[[], bool], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_a_user_without_acls_can_neither_produce_nor_fetch_describe_commit_or_join(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    topic = f"locked-{uuid.uuid4().hex[:8]}"
    _create_topic(secure_broker, certificates, topic)
    alice = _config(secure_broker, certificates, "alice")

    error = _produce_error(alice, topic)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    metadata = AdminClient(alice).list_topics(topic, timeout=15)
    assert metadata.topics[topic].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert topic not in AdminClient(alice).list_topics(timeout=15).topics  # a full listing leaves it out

    errors = _consume(alice, topic, f"g-{topic}", want=1, timeout_s=15)
    assert errors and isinstance(errors[0], KafkaError), errors
    assert errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    # With DESCRIBE on the topic (clients fetch only what Metadata shows them) and the group (FindCoordinator)
    # but no READ, the Fetch and the OffsetCommit themselves are refused.
    admin = _admin(secure_broker, certificates)
    describe = [
        AclBinding(
            resource_type, name, ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.DESCRIBE,
            AclPermissionType.ALLOW,
        )
        for resource_type, name in [(ResourceType.TOPIC, topic), (ResourceType.GROUP, f"g-{topic}")]
    ]  # fmt: skip
    for future in admin.create_acls(describe).values():
        future.result(30)
    time.sleep(ACL_PROPAGATION_S)
    error = _produce_error(alice, topic)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert f"Principal = User:alice is Denied operation = WRITE from host = 127.0.0.1 on resource = TOPIC:{topic}" in (
        secure_broker.stderr_text()
    )  # refused by Produce itself, not only by Metadata
    consumer = Consumer({**alice, "group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        codes: set[int] = set()  # the group's FindCoordinator fails too; the Fetch must fail on the topic
        deadline = time.monotonic() + 15
        while KafkaError.TOPIC_AUTHORIZATION_FAILED not in codes and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is not None, "a record was fetched without READ on the topic"
                codes.add(message.error().code())
        assert KafkaError.TOPIC_AUTHORIZATION_FAILED in codes, codes
        with pytest.raises(KafkaException) as commit:
            consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        assert commit.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()


@pytest.mark.matrix("security: ACLs", client="confluent")
def test_acls_created_over_the_protocol_grant_access_and_deleting_them_takes_it_away(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    prefix = f"orders-{uuid.uuid4().hex[:6]}-"
    topic, group = prefix + "eu", prefix + "app"
    _create_topic(secure_broker, certificates, topic, records=2)
    admin = _admin(secure_broker, certificates)
    bindings = [
        AclBinding(
            ResourceType.TOPIC, prefix, ResourcePatternType.PREFIXED, "User:alice", "*", op, AclPermissionType.ALLOW
        )
        for op in (AclOperation.WRITE, AclOperation.READ)
    ] + [
        AclBinding(
            ResourceType.GROUP, group, ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
            AclPermissionType.ALLOW,
        )
    ]  # fmt: skip
    for future in admin.create_acls(bindings).values():
        assert future.result(30) is None

    mine = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None, AclOperation.ANY, AclPermissionType.ANY
    )
    described = admin.describe_acls(mine).result(30)
    assert sorted(b for b in map(str, described) if prefix in b) == sorted(map(str, bindings))

    alice = _config(secure_broker, certificates, "alice", **{"enable.idempotence": True})
    assert _produce_error(alice, topic) is None  # InitProducerId (WRITE on some topic) and Produce (WRITE)
    values = [m.value() for m in _consume(alice, topic, group, want=3)]
    assert values == [b"r0", b"r1", b"x"]  # JoinGroup/SyncGroup (READ group), Fetch (READ topic), OffsetCommit
    assert AdminClient(alice).list_topics(topic, timeout=15).topics[topic].error is None  # READ implies DESCRIBE
    other_group = _consume(alice, topic, prefix + "other", want=1, timeout_s=15)
    assert other_group[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED  # only the one group

    exact = [
        AclBindingFilter(
            b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type
        )
        for b in bindings
    ]
    for future in admin.delete_acls(exact).values():
        assert len(future.result(30)) == 1
    time.sleep(ACL_PROPAGATION_S)
    assert not [b for b in admin.describe_acls(mine).result(30) if prefix in str(b)]
    error = _produce_error(_config(secure_broker, certificates, "alice"), topic)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_only_a_principal_with_alter_on_the_cluster_may_change_acls(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    binding = AclBinding(
        ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.ALL,
        AclPermissionType.ALLOW,
    )  # fmt: skip
    alice = _admin(secure_broker, certificates, "alice")
    with pytest.raises(KafkaException) as created:
        alice.create_acls([binding])[binding].result(30)
    assert created.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # DescribeAcls: confluent-kafka 2.16 drops the response's top-level error (it returns []); kafka-python raises it
    kafka_admin = kafka.KafkaAdminClient(
        **kafka_python_config(secure_broker, LISTENER, certificates, MECHANISM, "alice")
    )
    everything = kafka.admin.ACLFilter(
        principal=None,
        host=None,
        operation=kafka.admin.ACLOperation.ANY,
        permission_type=kafka.admin.ACLPermissionType.ANY,
        resource_pattern=kafka.admin.ResourcePatternFilter(
            kafka.admin.ResourceType.ANY, None, kafka.admin.ACLResourcePatternType.ANY
        ),
    )
    try:
        with pytest.raises(kafka.errors.ClusterAuthorizationFailedError):
            kafka_admin.describe_acls(everything)
    finally:
        kafka_admin.close()


def test_tidelog_acls_cli_on_a_running_broker_with_kafka_python(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    group = f"{topic}-group"
    _create_topic(secure_broker, certificates, topic, records=1)
    bob = kafka_python_config(secure_broker, LISTENER, certificates, MECHANISM, "bob")
    log_dir = str(secure_broker.log_dir)

    producer = kafka.KafkaProducer(**bob, enable_idempotence=False)
    with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
        producer.send(topic, b"denied").get(timeout=30)
    consumer = kafka.KafkaConsumer(topic, **bob, group_id=group, auto_offset_reset="earliest")
    with pytest.raises(kafka.errors.GroupAuthorizationFailedError):
        consumer.poll(timeout_ms=10_000)
    consumer.close()

    added = tidelog(
        "acls", "--log-dir", log_dir, "--add", "--allow-principal", "User:bob", "--producer", "--consumer",
        "--topic", topic, "--group", group,
    ).stdout  # fmt: skip
    assert f"ResourcePattern(resourceType=TOPIC, name={topic}, patternType=LITERAL)" in added
    listed = tidelog("acls", "--log-dir", log_dir, "--list", "--principal", "User:bob").stdout
    for operation in ("WRITE", "READ", "DESCRIBE", "CREATE"):
        assert f"(principal=User:bob, host=*, operation={operation}, permissionType=ALLOW)" in listed
    time.sleep(ACL_PROPAGATION_S)

    assert producer.send(topic, b"allowed").get(timeout=30).offset == 1
    producer.close()
    consumer = kafka.KafkaConsumer(
        topic, **bob, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=15_000
    )
    assert [next(consumer).value, next(consumer).value] == [b"r0", b"allowed"]
    consumer.commit()
    assert consumer.committed(kafka.TopicPartition(topic, 0)) == 2
    consumer.close()

    tidelog("acls", "--log-dir", log_dir, "--remove", "--allow-principal", "User:bob", "--producer", "--topic", topic)
    time.sleep(ACL_PROPAGATION_S)
    producer = kafka.KafkaProducer(**bob, enable_idempotence=False)
    with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
        producer.send(topic, b"denied again").get(timeout=30)
    producer.close()


def test_deny_beats_allow_and_super_users_bypass_acls(secure_broker: BrokerProcess, certificates: Certificates) -> None:
    topic = f"deny-{uuid.uuid4().hex[:8]}"
    _create_topic(secure_broker, certificates, topic, records=0)
    admin = _admin(secure_broker, certificates)
    everyone_writes = AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:*", "*", AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )  # fmt: skip
    alice_denied = AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.ALL,
        AclPermissionType.DENY,
    )  # fmt: skip
    admin_denied = AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:admin", "*", AclOperation.ALL,
        AclPermissionType.DENY,
    )  # fmt: skip
    for future in admin.create_acls([everyone_writes, alice_denied, admin_denied]).values():
        future.result(30)
    assert _produce_error(_config(secure_broker, certificates, "bob"), topic) is None
    error = _produce_error(_config(secure_broker, certificates, "alice"), topic)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce_error(_config(secure_broker, certificates, "admin"), topic) is None  # super.users


def _grant(admin: AdminClient, principal: str, *grants: tuple[ResourceType, str, AclOperation]) -> None:
    """As the super user: ALLOW `principal` each (resource type, literal name, operation)."""
    bindings = [
        AclBinding(kind, name, ResourcePatternType.LITERAL, principal, "*", operation, AclPermissionType.ALLOW)
        for kind, name, operation in grants
    ]
    for future in admin.create_acls(bindings).values():
        future.result(30)
    time.sleep(ACL_PROPAGATION_S)


def _admin_error(future: Any) -> int:
    """The error code an AdminClient future fails with, 0 if it succeeds."""
    try:
        future.result(30)
    except KafkaException as exc:
        return exc.args[0].code()
    return 0


def test_create_delete_alter_and_describe_configs_need_their_acls(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    """CreateTopics (CREATE on the topic or the cluster), DeleteTopics and DeleteRecords (DELETE on the topic),
    CreatePartitions (ALTER on the topic), DescribeConfigs (DESCRIBE_CONFIGS on the topic, or on the cluster for
    a broker) and DeleteGroups (DELETE on the group), with librdkafka and kafka-python: refused with TOPIC_,
    CLUSTER_ or GROUP_AUTHORIZATION_FAILED by the request itself (the user may DESCRIBE the topic and the group,
    so the clients get as far as sending it), and done once the one ACL each needs is granted."""
    suffix = uuid.uuid4().hex[:8]
    user, password = f"dana-{suffix}", "dana-secret"  # a user of this test alone: it gets CREATE on the cluster
    principal = f"User:{user}"
    topic, group = f"ops-{suffix}", f"ops-{suffix}-group"
    new_topic, new_topic_by_cluster_acl = f"ops-{suffix}-new", f"ops-{suffix}-new-by-cluster-acl"
    tidelog("users", "--log-dir", str(secure_broker.log_dir), "--add", user, "--password", password)
    _create_topic(secure_broker, certificates, topic, records=3)
    committer = Consumer({**_config(secure_broker, certificates, "admin"), "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)  # the group exists, empty
    committer.close()
    admin = _admin(secure_broker, certificates)
    _grant(admin, principal, (ResourceType.TOPIC, topic, AclOperation.DESCRIBE),
           (ResourceType.GROUP, group, AclOperation.DESCRIBE))  # fmt: skip

    dana = AdminClient(confluent_config(secure_broker, LISTENER, certificates, MECHANISM, user, password))
    first_record = TopicPartition(topic, 0, 1)
    topic_configs = ConfigResource(ConfigResource.Type.TOPIC, topic)
    broker_configs = ConfigResource(ConfigResource.Type.BROKER, str(BROKER_NODE_ID))
    refused = {
        "CreateTopics": _admin_error(dana.create_topics([NewTopic(new_topic, 1)])[new_topic]),
        "DeleteTopics": _admin_error(dana.delete_topics([topic])[topic]),
        "CreatePartitions": _admin_error(dana.create_partitions([NewPartitions(topic, 2)])[topic]),
        "DeleteRecords": _admin_error(dana.delete_records([first_record])[first_record]),
        "DescribeConfigs(topic)": _admin_error(dana.describe_configs([topic_configs])[topic_configs]),
        "DescribeConfigs(broker)": _admin_error(dana.describe_configs([broker_configs])[broker_configs]),
        "DeleteGroups": _admin_error(dana.delete_consumer_groups([group])[group]),
    }
    topic_denied, cluster_denied = KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert refused == {
        "CreateTopics": topic_denied,
        "DeleteTopics": topic_denied,
        "CreatePartitions": topic_denied,
        "DeleteRecords": topic_denied,
        "DescribeConfigs(topic)": topic_denied,
        "DescribeConfigs(broker)": cluster_denied,
        "DeleteGroups": KafkaError.GROUP_AUTHORIZATION_FAILED,
    }
    log = secure_broker.stderr_text()
    for operation, resource in [
        ("CREATE", f"TOPIC:{new_topic}"),
        ("DELETE", f"TOPIC:{topic}"),
        ("ALTER", f"TOPIC:{topic}"),
        ("DESCRIBE_CONFIGS", f"TOPIC:{topic}"),
        ("DESCRIBE_CONFIGS", f"CLUSTER:{CLUSTER}"),
        ("DELETE", f"GROUP:{group}"),
    ]:
        assert f"{principal} is Denied operation = {operation} from host = 127.0.0.1 on resource = {resource}" in log

    kafka_admin = kafka.KafkaAdminClient(
        **kafka_python_config(secure_broker, LISTENER, certificates, MECHANISM, user, password)
    )
    try:
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            kafka_admin.create_topics([kafka.admin.NewTopic(new_topic, 1, 1)])
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            kafka_admin.delete_topics([topic])
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            kafka_admin.create_partitions({topic: kafka.admin.NewPartitions(2)})
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            kafka_admin.delete_records({kafka.TopicPartition(topic, 0): 1})
        assert kafka_admin.delete_groups([group]) == {group: kafka.errors.GroupAuthorizationFailedError.__name__}

        _grant(admin, principal, (ResourceType.TOPIC, new_topic, AclOperation.CREATE),
               (ResourceType.TOPIC, topic, AclOperation.ALTER), (ResourceType.TOPIC, topic, AclOperation.DELETE),
               (ResourceType.TOPIC, topic, AclOperation.DESCRIBE_CONFIGS),
               (ResourceType.BROKER, CLUSTER, AclOperation.DESCRIBE_CONFIGS),
               (ResourceType.GROUP, group, AclOperation.DELETE))  # fmt: skip
        assert _admin_error(dana.create_topics([NewTopic(new_topic, 1)])[new_topic]) == 0
        assert _admin_error(dana.create_topics([NewTopic(new_topic_by_cluster_acl, 1)])[new_topic_by_cluster_acl]) == (
            topic_denied
        )  # CREATE on one topic is not CREATE on another
        _grant(admin, principal, (ResourceType.BROKER, CLUSTER, AclOperation.CREATE))
        assert _admin_error(dana.create_topics([NewTopic(new_topic_by_cluster_acl, 1)])[new_topic_by_cluster_acl]) == 0

        dana.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        assert len(admin.list_topics(topic, timeout=15).topics[topic].partitions) == 2
        assert dana.delete_records([first_record])[first_record].result(30).low_watermark == 1
        described = dana.describe_configs([topic_configs])[topic_configs].result(30)
        assert described["cleanup.policy"].value == "delete"
        assert dana.describe_configs([broker_configs])[broker_configs].result(30)
        assert kafka_admin.delete_groups([group]) == {group: "OK"}
        assert kafka_admin.delete_groups([group]) == {group: kafka.errors.GroupIdNotFoundError.__name__}
        dana.delete_topics([topic])[topic].result(30)
        assert topic not in admin.list_topics(timeout=15).topics
    finally:
        kafka_admin.close()


@pytest.mark.matrix("security: ACLs", client="kafka-python")
def test_kafka_python_without_acls_cannot_describe_or_commit(
    secure_broker: BrokerProcess, certificates: Certificates
) -> None:
    """kafka-python as a user without ACLs: Metadata answers TOPIC_AUTHORIZATION_FAILED for the topic (a listing
    leaves it out), and an OffsetCommit is refused step by step as Kafka does: FindCoordinator without DESCRIBE
    on the group, then OffsetCommit without READ on the group (GROUP_AUTHORIZATION_FAILED), then without READ on
    the topic (TOPIC_AUTHORIZATION_FAILED); with both the commit is stored."""
    suffix = uuid.uuid4().hex[:8]
    user, password = f"erin-{suffix}", "erin-secret"
    principal = f"User:{user}"
    topic, group = f"kp-locked-{suffix}", f"kp-locked-{suffix}-group"
    tidelog("users", "--log-dir", str(secure_broker.log_dir), "--add", user, "--password", password)
    _create_topic(secure_broker, certificates, topic)
    erin = kafka_python_config(secure_broker, LISTENER, certificates, MECHANISM, user, password)

    kafka_admin = kafka.KafkaAdminClient(**erin)
    try:
        (described,) = kafka_admin.describe_topics([topic])
        assert described["error_code"] == kafka.errors.TopicAuthorizationFailedError.errno
        assert described["partitions"] == []
        assert topic not in kafka_admin.list_topics()
    finally:
        kafka_admin.close()

    partition = kafka.TopicPartition(topic, 0)

    def commit() -> None:
        consumer = kafka.KafkaConsumer(**erin, group_id=group, enable_auto_commit=False)
        try:
            consumer.assign([partition])
            consumer.commit({partition: kafka.OffsetAndMetadata(1, "", -1)})
        finally:
            consumer.close()

    admin = _admin(secure_broker, certificates)
    denied = f"{principal} is Denied operation = %s from host = 127.0.0.1 on resource = %s"
    for grant, error, operation, resource in [
        (None, kafka.errors.GroupAuthorizationFailedError, "DESCRIBE", f"GROUP:{group}"),  # FindCoordinator
        (AclOperation.DESCRIBE, kafka.errors.GroupAuthorizationFailedError, "READ", f"GROUP:{group}"),
        (AclOperation.READ, kafka.errors.TopicAuthorizationFailedError, "READ", f"TOPIC:{topic}"),
    ]:
        if grant is not None:
            _grant(admin, principal, (ResourceType.GROUP, group, grant))
        with pytest.raises(error):
            commit()
        assert denied % (operation, resource) in secure_broker.stderr_text()
    _grant(admin, principal, (ResourceType.TOPIC, topic, AclOperation.READ))
    commit()
    consumer = kafka.KafkaConsumer(**erin, group_id=group, enable_auto_commit=False)
    assert consumer.committed(partition) == 1
    consumer.close()


def test_allow_everyone_if_no_acl_found(start_module_broker: StartBroker, certificates: Certificates) -> None:
    broker = start_module_broker(
        secure_settings(certificates, **{"allow.everyone.if.no.acl.found": "true"}),
        listeners=(LISTENER,),
        before_start=add_users,
    )
    open_topic = f"open-{uuid.uuid4().hex[:8]}"
    alice = _config(broker, certificates, "alice")
    assert _produce_error({**alice, "allow.auto.create.topics": True}, open_topic) is None  # no ACL at all
    tidelog(
        "acls", "--log-dir", str(broker.log_dir), "--add", "--allow-principal", "User:bob", "--operation", "Write",
        "--topic", open_topic,
    )  # fmt: skip
    assert _until(
        lambda: (
            (e := _produce_error(alice, open_topic)) is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        )
    )
    assert _produce_error(_config(broker, certificates, "bob"), open_topic) is None


@pytest.mark.matrix("security: TLS", client="confluent")
def test_client_certificates_on_a_listener_named_through_the_protocol_map(
    start_module_broker: StartBroker, certificates: Certificates
) -> None:
    """`listener.security.protocol.map=MTLS:SSL` with `ssl.client.auth=required`: a client is the principal of its
    certificate's subject DN (`User:CN=...,O=tidelog`, as Kafka prints it), ACLs apply to it, and a client
    without a certificate fails the TLS handshake."""
    topic = f"mtls-{uuid.uuid4().hex[:8]}"

    def grant(log_dir: Any) -> None:
        tidelog(
            "acls", "--log-dir", str(log_dir), "--add", "--allow-principal", "User:CN=writer,O=tidelog",
            "--producer", "--topic", topic,
        )  # fmt: skip

    broker = start_module_broker(
        secure_settings(
            certificates,
            **{
                "listener.security.protocol.map": "MTLS:SSL",
                "ssl.client.auth": "required",
                "ssl.truststore.location": str(certificates.ca),
            },
        ),
        listeners=("MTLS",),
        before_start=grant,
    )
    base = {"bootstrap.servers": broker.bootstrap_for("MTLS"), "security.protocol": "SSL"}
    base["ssl.ca.location"] = str(certificates.ca)
    for name, allowed in [("writer", True), ("reader", False)]:
        certificate, key = make_client_certificate(certificates, name)
        config = {**base, "ssl.certificate.location": str(certificate), "ssl.key.location": str(key)}
        error = _produce_error({**config, "allow.auto.create.topics": True}, topic)
        if allowed:
            assert error is None
        else:
            assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "Principal = User:CN=reader,O=tidelog is Denied operation = DESCRIBE" in broker.stderr_text()
    with pytest.raises(KafkaException):  # no client certificate: the TLS handshake is refused, nothing is served
        AdminClient({**base, "socket.timeout.ms": 3000}).list_topics(timeout=5)
