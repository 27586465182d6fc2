"""Client quotas in a cluster: a quota altered through one broker is written as Kafka writes it (`/config/users/...`,
`/config/clients/...` and a `/config/changes` notification) and the other broker applies it; a quota znode written
straight into ZooKeeper with its notification, as Kafka's own tools do, reaches every broker too."""

from __future__ import annotations

import json
from typing import Any

from cluster_checks import registered, wait_for
from kazoo.client import KazooClient

import kafka_wire
from tidelog.protocol.messages import ApiKey
from zookeeper_process import ClusterBroker


def alter(bootstrap: str, entity: dict[str, str | None], key: str, value: float) -> int:
    body = {
        "entries": [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
                "ops": [{"key": key, "value": value, "remove": False}],
            }
        ],
        "validate_only": False,
    }
    return int(kafka_wire.request(bootstrap, ApiKey.ALTER_CLIENT_QUOTAS, 1, body).entries[0].error_code)


def quotas(bootstrap: str) -> dict[Any, dict[str, float]]:
    body = {"components": [], "strict": False}
    response = kafka_wire.request(bootstrap, ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, body)
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
        for entry in response.entries
    }


def test_quotas_altered_through_one_broker_reach_the_other(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = cluster_broker.all((1, 2))
    wait_for(lambda: registered(zk_client) == [1, 2], what="two registrations")

    assert alter(brokers[1].bootstrap, {"user": "alice", "client-id": None}, "producer_byte_rate", 1024) == 0
    assert alter(brokers[1].bootstrap, {"client-id": "app one"}, "request_percentage", 25.5) == 0
    assert json.loads(zk_client.get("/config/users/alice/clients/<default>")[0]) == {
        "version": 1,
        "config": {"producer_byte_rate": "1024"},
    }
    assert json.loads(zk_client.get("/config/users/alice")[0]) == {"version": 1, "config": {}}  # no quota of its own
    assert json.loads(zk_client.get("/config/clients/app%20one")[0])["config"] == {"request_percentage": "25.5"}
    changes = [json.loads(zk_client.get(f"/config/changes/{c}")[0]) for c in zk_client.get_children("/config/changes")]
    assert {"version": 2, "entity_path": "users/alice/clients/<default>"} in changes

    expected = {
        (("client-id", None), ("user", "alice")): {"producer_byte_rate": 1024.0},
        (("client-id", "app one"),): {"request_percentage": 25.5},
    }
    wait_for(lambda: quotas(brokers[2].bootstrap) == expected, what="broker 2 following the quota changes")

    # as kafka-configs.sh --zookeeper writes one: the znode, then its notification
    zk_client.create("/config/users/bob", json.dumps({"version": 1, "config": {"consumer_byte_rate": "2048"}}).encode())
    notification = json.dumps({"version": 2, "entity_path": "users/bob"}).encode()
    zk_client.create("/config/changes/config_change_", notification, sequence=True)
    for broker in brokers.values():
        wait_for(
            lambda broker=broker: quotas(broker.bootstrap).get((("user", "bob"),)) == {"consumer_byte_rate": 2048.0},
            what="a quota written by another tool",
        )
