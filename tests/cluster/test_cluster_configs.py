"""Config changes in a cluster: a topic config altered through one broker is written as Kafka writes it
(`/config/topics/<t>` and a `/config/changes` notification) and reaches the other broker's replica; the cluster's
default broker configs (`/config/brokers/<default>`) set through one broker apply on the other."""

from __future__ import annotations

import json

from cluster_checks import registered, wait_for
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kazoo.client import KazooClient

import kafka_wire
from zookeeper_process import ClusterBroker


def described(bootstrap: str, topic: str) -> dict[str, tuple[str, int]]:
    body = {
        "resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None}],
        "include_synonyms": True,
        "include_documentation": False,
    }
    (result,) = kafka_wire.request(bootstrap, 32, 4, body).results
    return {c.name: (c.value, c.config_source) for c in result.configs}


def test_configs_altered_through_one_broker_reach_the_other(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = cluster_broker.all((1, 2))
    wait_for(lambda: registered(zk_client) == [1, 2], what="two registrations")
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic("tuned", 1, 2)], operation_timeout=20)["tuned"].result(timeout=30)

    entry = ConfigEntry("max.message.bytes", "4000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "tuned", incremental_configs=[entry])
    admin.incremental_alter_configs([resource], request_timeout=15)[resource].result(timeout=30)
    assert json.loads(zk_client.get("/config/topics/tuned")[0]) == {
        "version": 1,
        "config": {"max.message.bytes": "4000"},
    }
    changes = [json.loads(zk_client.get(f"/config/changes/{c}")[0]) for c in zk_client.get_children("/config/changes")]
    assert {"version": 2, "entity_path": "topics/tuned"} in changes

    def stored_on_broker_2() -> dict[str, str]:
        registry = json.loads((brokers[2].log_dir / "tidelog-topics.json").read_text())
        return registry["topics"]["tuned"]["configs"]

    wait_for(lambda: stored_on_broker_2() == {"max.message.bytes": "4000"}, what="broker 2's replica's config")
    assert described(brokers[2].bootstrap, "tuned")["max.message.bytes"] == ("4000", 1)  # TOPIC_CONFIG

    change = {"name": "log.retention.ms", "config_operation": 0, "value": "7200000"}
    body = {"resources": [{"resource_type": 4, "resource_name": "", "configs": [change]}], "validate_only": False}
    response = kafka_wire.request(brokers[1].bootstrap, 44, 1, body)
    assert [r.error_code for r in response.responses] == [0]
    assert json.loads(zk_client.get("/config/brokers/<default>")[0])["config"] == {"log.retention.ms": "7200000"}
    wait_for(
        lambda: described(brokers[2].bootstrap, "tuned")["retention.ms"] == ("7200000", 3),  # DYNAMIC_DEFAULT_BROKER
        what="broker 2 following the cluster's default",
    )
