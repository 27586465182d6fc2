"""A group of the consumer group protocol (KIP-848) in a cluster: its coordinator is the leader of the group's
`__consumer_offsets` partition (other brokers answer NOT_COORDINATOR), the subscribed topics are the cluster's, and
after a coordinator failover the next leader of that partition rebuilds the group from its records: the members go
on heartbeating there at their epochs with their partitions."""

from __future__ import annotations

import uuid
from typing import Any

from cluster_checks import registered, wait_for
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

import kafka_wire
from tidelog.protocol.messages import ApiKey
from zookeeper_process import ClusterBroker

GROUP, TOPIC = "kip848-failover", "kip848-failover-topic"
NONE, NOT_COORDINATOR = 0, 16


def heartbeat(bootstrap: str, member_id: str, epoch: int, owned: dict[Any, list[int]] | None) -> Any:
    body = {
        "group_id": GROUP,
        "member_id": member_id,
        "member_epoch": epoch,
        "rebalance_timeout": 5000 if epoch == 0 else -1,
        "subscribed_topic_names": [TOPIC] if epoch == 0 else None,
        "topic_partitions": [] if owned is None else [{"topic_id": t, "partitions": p} for t, p in owned.items()],
    }
    return kafka_wire.request(bootstrap, ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, body)


def coordinator_of(bootstrap: str) -> int | None:
    error, node = kafka_wire.find_coordinator(bootstrap, GROUP)
    return node if error == NONE else None


def test_a_consumer_group_survives_a_coordinator_failover(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    settings = {"offsets.topic.num.partitions": 1, "group.consumer.min.session.timeout.ms": 1000}
    brokers = cluster_broker.all((1, 2, 3), settings)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic(TOPIC, 4, 3)])[TOPIC].result(timeout=30)
    first = wait_for(lambda: coordinator_of(brokers[1].bootstrap), what="a coordinator")
    assert isinstance(first, int)
    at = brokers[first].bootstrap
    elsewhere = next(b for broker_id, b in brokers.items() if broker_id != first)
    assert heartbeat(elsewhere.bootstrap, "x", 0, None).error_code == NOT_COORDINATOR

    members: dict[str, tuple[int, dict[Any, list[int]]]] = {}
    for name in ("a", "b"):
        member_id = f"{name}-{uuid.uuid4()}"
        answer = wait_for(
            lambda member_id=member_id: (a := heartbeat(at, member_id, 0, None)).error_code == NONE and a,
            what=f"member {name} joined",
        )
        members[member_id] = (answer.member_epoch, {})
    for _ in range(6):  # heartbeat until both hold their partitions at the same epoch
        for member_id, (epoch, owned) in list(members.items()):
            answer = heartbeat(at, member_id, epoch, owned)
            assert answer.error_code == NONE
            if answer.assignment is not None:
                owned = {tp.topic_id: sorted(tp.partitions) for tp in answer.assignment.topic_partitions}
            members[member_id] = (answer.member_epoch, owned)
    epochs = {epoch for epoch, _ in members.values()}
    assert len(epochs) == 1 and sorted(len(p) for _, o in members.values() for p in o.values()) == [2, 2]

    brokers[first].stop()  # a controlled shutdown: another replica of the offsets partition leads it
    survivors = [b for broker_id, b in brokers.items() if broker_id != first]
    second = wait_for(
        lambda: (found := coordinator_of(survivors[0].bootstrap)) not in (None, first) and found,
        what="a new coordinator",
    )
    assert isinstance(second, int)
    now = brokers[second].bootstrap

    def described() -> Any:
        body = {"group_ids": [GROUP], "include_authorized_operations": False}
        answer = kafka_wire.request(now, ApiKey.CONSUMER_GROUP_DESCRIBE, 1, body).groups[0]
        return answer if answer.error_code == NONE else None

    group = wait_for(described, what="the group loaded on the new coordinator")
    assert group.group_state == "Stable"
    assert {m.member_id: m.member_epoch for m in group.members} == {m: e for m, (e, _) in members.items()}
    for member_id, (epoch, owned) in members.items():
        answer = heartbeat(now, member_id, epoch, owned)
        assert (answer.error_code, answer.member_epoch) == (NONE, epoch)
