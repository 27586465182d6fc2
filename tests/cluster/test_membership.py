"""Brokers joining a ZooKeeper-coordinated cluster: registration in Kafka's layout, the controller election, and
what happens when the controller dies, stops, or is paused past its session (fencing by the controller epoch).
Real processes: a ZooKeeper server, `tidelog serve` brokers, librdkafka's Metadata, SIGKILL and SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from cluster_checks import controller, controller_epoch, registered, wait_for
from confluent_kafka.admin import AdminClient
from kazoo.client import KazooClient

from broker_process import BrokerFactory, BrokerStartError
from zookeeper_process import ClusterBroker, ZooKeeperChroot, ZooKeeperProcess


def metadata(bootstrap: str) -> tuple[list[int], int]:
    """(broker ids, controller id) as librdkafka sees the cluster through `bootstrap`."""
    cluster = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15)
    return sorted(cluster.brokers), cluster.controller_id


def test_brokers_register_as_kafka_does_and_metadata_lists_them(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = {broker_id: cluster_broker(broker_id, {"broker.rack": f"rack-{broker_id}"}) for broker_id in (1, 2, 3)}
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="three registrations")
    for broker_id, broker in brokers.items():
        registration = json.loads(zk_client.get(f"/brokers/ids/{broker_id}")[0])
        assert registration["version"] == 5
        assert registration["endpoints"] == [f"PLAINTEXT://127.0.0.1:{broker.port}"]
        assert registration["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
        assert (registration["host"], registration["port"], registration["rack"]) == (
            "127.0.0.1",
            broker.port,
            f"rack-{broker_id}",
        )
        assert zk_client.get(f"/brokers/ids/{broker_id}")[1].ephemeralOwner != 0
    cluster_id = json.loads(zk_client.get("/cluster/id")[0])["id"]
    for broker in brokers.values():
        assert f"cluster.id={cluster_id}" in (broker.log_dir / "meta.properties").read_text()
    elected = wait_for(lambda: controller(zk_client), what="a controller")
    assert elected in brokers and controller_epoch(zk_client) == 1
    for broker in brokers.values():  # every broker answers with the whole cluster and the same controller
        assert wait_for(lambda b=broker: metadata(b.bootstrap) == ([1, 2, 3], elected), what="metadata")


def test_a_killed_controller_is_replaced_and_leaves_the_broker_list(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = cluster_broker.all((1, 2, 3))
    first = wait_for(lambda: controller(zk_client), what="a controller")
    brokers[first].kill()  # SIGKILL: its session times out, ZooKeeper drops its ephemeral nodes
    second = wait_for(lambda: (c := controller(zk_client)) not in (None, first) and c, what="a new controller")
    assert controller_epoch(zk_client) == 2
    assert registered(zk_client) == sorted(set(brokers) - {first})
    survivor = brokers[second]
    assert wait_for(lambda: metadata(survivor.bootstrap) == (registered(zk_client), second), what="metadata")


def test_a_stopped_controller_hands_over_without_waiting_for_its_session(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    brokers = cluster_broker.all((1, 2), {"zookeeper.session.timeout.ms": 30_000})
    first = wait_for(lambda: controller(zk_client), what="a controller")
    started = time.monotonic()
    assert brokers[first].stop() == 0  # SIGTERM: it resigns and deregisters before it exits
    other = wait_for(lambda: (c := controller(zk_client)) not in (None, first) and c, timeout_s=10, what="handover")
    assert time.monotonic() - started < 10 < 30  # well inside the 30 s session timeout
    assert registered(zk_client) == [other]


def test_a_paused_controller_comes_back_fenced(cluster_broker: ClusterBroker, zk_client: KazooClient) -> None:
    """SIGSTOP past the session timeout: ZooKeeper expires the session, another broker is elected with a higher
    epoch; after SIGCONT the old controller finds its session gone, does not claim the role, and registers again."""
    brokers = cluster_broker.all((1, 2, 3))
    first = wait_for(lambda: controller(zk_client), what="a controller")
    os.kill(brokers[first].pid, signal.SIGSTOP)
    try:
        second = wait_for(lambda: (c := controller(zk_client)) not in (None, first) and c, what="a new controller")
        assert controller_epoch(zk_client) == 2
    finally:
        os.kill(brokers[first].pid, signal.SIGCONT)
    wait_for(lambda: registered(zk_client) == [1, 2, 3], what="the paused broker registering again")
    assert controller(zk_client) == second and controller_epoch(zk_client) == 2
    assert wait_for(lambda: metadata(brokers[first].bootstrap) == ([1, 2, 3], second), what="metadata")


def test_log_dirs_of_another_cluster_are_refused(tmp_path: Path, zookeeper: ZooKeeperChroot) -> None:
    factory = BrokerFactory(tmp_path / "brokers")
    try:
        broker = factory({"broker.id": 1, "zookeeper.connect": zookeeper.connect})
        assert broker.stop() == 0
        other = ZooKeeperProcess(tmp_path / "other-zookeeper").start()  # a second cluster: another /cluster/id
        try:
            broker.overrides["zookeeper.connect"] = other.connect
            with pytest.raises(BrokerStartError, match=r"belong to cluster .* but ZooKeeper's cluster is"):
                broker.start()
        finally:
            other.stop()
    finally:
        factory.close_all()


def test_an_unreachable_zookeeper_is_a_clear_start_error(tmp_path: Path) -> None:
    factory = BrokerFactory(tmp_path / "brokers")
    try:
        with pytest.raises(BrokerStartError, match=r"cannot connect to ZooKeeper at 127\.0\.0\.1:9 within 1500 ms"):
            factory({"broker.id": 1, "zookeeper.connect": "127.0.0.1:9", "zookeeper.connection.timeout.ms": 1500})
    finally:
        factory.close_all()


def test_a_second_live_broker_with_the_same_id_is_refused(
    cluster_broker: ClusterBroker, zk_client: KazooClient
) -> None:
    cluster_broker(1)
    with pytest.raises(BrokerStartError, match=r"another broker with the same broker\.id is running"):
        cluster_broker(1)
    assert registered(zk_client) == [1]
