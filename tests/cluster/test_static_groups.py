"""Static group members (KIP-345) across a coordinator failover: the group metadata record carries each member's
`group.instance.id`, so the broker that comes to lead the group's `__consumer_offsets` partition knows the members,
their member ids and the generation; they carry on heartbeating there, and a returning instance is recognised
(a new member id in the same generation, its old id fenced) without a rebalance."""

from __future__ import annotations

import struct
import threading
from typing import Any

from cluster_checks import registered, wait_for
from kazoo.client import KazooClient

import kafka_wire
from tidelog.protocol.messages import ApiKey
from zookeeper_process import ClusterBroker

GROUP, TOPIC = "static-failover", "static-failover-topic"
NONE, FENCED_INSTANCE_ID = 0, 82


def subscription() -> bytes:
    name = TOPIC.encode()
    return struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)


def join(bootstrap: str, instance: str, member_id: str = "") -> Any:
    body = {
        "group_id": GROUP,
        "session_timeout": 30_000,
        "rebalance_timeout": 5000,
        "member_id": member_id,
        "group_instance_id": instance,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription()}],
    }
    return kafka_wire.request(bootstrap, ApiKey.JOIN_GROUP, 5, body, timeout_s=30)


def heartbeat(bootstrap: str, generation: int, member_id: str, instance: str) -> int:
    body = {"group_id": GROUP, "generation_id": generation, "member_id": member_id, "group_instance_id": instance}
    return int(kafka_wire.request(bootstrap, ApiKey.HEARTBEAT, 4, body).error_code)


def coordinator_of(bootstrap: str) -> int | None:
    error, node = kafka_wire.find_coordinator(bootstrap, GROUP)
    return node if error == NONE else None


def test_static_members_survive_a_coordinator_failover(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    settings = {
        "offsets.topic.num.partitions": 1,
        "group.initial.rebalance.delay.ms": 500,  # the two members joining together form one generation
        "group.min.session.timeout.ms": 1000,
    }
    brokers = cluster_broker.all((1, 2, 3), settings)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    first = wait_for(lambda: coordinator_of(brokers[1].bootstrap), what="a coordinator")
    assert isinstance(first, int)
    at = brokers[first].bootstrap

    answers: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda i=i: answers.update({i: join(at, i)})) for i in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [answers[i].error_code for i in ("a", "b")] == [NONE, NONE]
    generation = answers["a"].generation_id
    ids = {i: answers[i].member_id for i in ("a", "b")}
    leader = next(i for i in ("a", "b") if answers[i].leader == ids[i])
    plan = [{"member_id": ids[i], "assignment": b"plan-" + i.encode()} for i in ("a", "b")]
    for instance in (leader, *(i for i in ("a", "b") if i != leader)):  # the leader's SyncGroup stores the group
        body = {
            "group_id": GROUP,
            "generation_id": generation,
            "member_id": ids[instance],
            "group_instance_id": instance,
            "assignments": plan if instance == leader else [],
        }
        synced = kafka_wire.request(at, ApiKey.SYNC_GROUP, 3, body)
        assert (synced.error_code, bytes(synced.assignment)) == (NONE, b"plan-" + instance.encode())

    brokers[first].stop()  # a controlled shutdown: another replica of the offsets partition leads it
    survivors = [b for broker_id, b in brokers.items() if broker_id != first]
    second = wait_for(
        lambda: (found := coordinator_of(survivors[0].bootstrap)) not in (None, first) and found,
        what="a new coordinator",
    )
    assert isinstance(second, int)
    now = brokers[second].bootstrap

    def described() -> Any:
        answer = kafka_wire.request(now, ApiKey.DESCRIBE_GROUPS, 5, {"groups": [GROUP]}).groups[0]
        return answer if answer.error_code == NONE and answer.group_state == "Stable" else None

    group = wait_for(described, what="the group loaded on the new coordinator")
    assert {(m.member_id, m.group_instance_id) for m in group.members} == {(ids["a"], "a"), (ids["b"], "b")}
    assert heartbeat(now, generation, ids["a"], "a") == NONE
    assert heartbeat(now, generation, ids["b"], "b") == NONE

    back = join(now, "b")  # instance b restarts
    assert (back.error_code, back.generation_id) == (NONE, generation)
    assert back.member_id != ids["b"]
    assert heartbeat(now, generation, ids["b"], "b") == FENCED_INSTANCE_ID
    assert heartbeat(now, generation, ids["a"], "a") == NONE  # no rebalance
