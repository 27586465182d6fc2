"""Controller epoch fencing with a real ZooKeeper: two brokers' cluster parts in this process (membership, metadata
cache, controller, each over its own engine and ZooKeeper session). A controller deposed by a newer election cannot
write any more - every write is a transaction that checks /controller_epoch's version - and one that finds itself
fenced stops acting and gives the role up, so the cluster elects a controller that can."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_checks import controller, controller_epoch, wait_for
from kazoo.client import KazooClient

from tidelog.broker import zk_layout as zk
from tidelog.broker.admin import AdminExecutor
from tidelog.broker.cluster_membership import ClusterMembership
from tidelog.broker.cluster_metadata import MetadataCache
from tidelog.broker.controller import Controller, ControllerMovedError
from tidelog.config import EngineConfig, LogConfig
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage import open_engine
from zookeeper_process import SESSION_TIMEOUT_MS, ZooKeeperChroot


class ClusterParts:
    """What broker.py builds for a broker of a cluster, minus the network server."""

    def __init__(self, zookeeper: ZooKeeperChroot, broker_id: int, log_dir: Path) -> None:
        self.membership = ClusterMembership(
            zookeeper.connect, broker_id, session_timeout_ms=SESSION_TIMEOUT_MS, connection_timeout_ms=10_000
        )
        cluster_id = self.membership.connect()
        self.engine = open_engine(EngineConfig(log_dirs=(str(log_dir),), node_id=broker_id), cluster_id=cluster_id)
        self.admin = AdminExecutor()
        self.cache = MetadataCache(self.membership.client, broker_id, self.engine, self.admin)
        self.controller = Controller(self.membership, self.cache, LogConfig())
        asyncio.run(self.cache.start())
        self.controller.start()
        self.membership.register((zk.Endpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id, "PLAINTEXT"),))

    def close(self) -> None:
        self.controller.close()
        self.cache.close()
        self.membership.close()
        self.admin.close()
        self.engine.close()


@pytest.fixture
def parts(zookeeper: ZooKeeperChroot, tmp_path: Path) -> Iterator[dict[int, ClusterParts]]:
    started: dict[int, ClusterParts] = {}
    yield started
    for broker in started.values():
        broker.close()


def create_topic(zk_client: KazooClient, name: str, replicas: dict[int, tuple[int, ...]]) -> None:
    """A topic znode as CreateTopics writes it (cluster_topics.py)."""
    zk_client.create(zk.topic_config_path(name), zk.encode_topic_config({}), makepath=True)
    zk_client.create(zk.topic_path(name), zk.TopicAssignment(name, new_kafka_uuid(), replicas).encode())


def state(zk_client: KazooClient, topic: str, partition: int) -> dict[str, int] | None:
    path = zk.partition_state_path(topic, partition)
    return json.loads(zk_client.get(path)[0]) if zk_client.exists(path) else None


def expire_session(zookeeper: ZooKeeperChroot, client: KazooClient) -> None:
    """End a client's ZooKeeper session from outside, as a long pause or a partition would: a second client joins
    the session with its id and password and closes it (ZooKeeper then drops the session's ephemeral nodes)."""
    session_id, password = client.client_id
    thief = KazooClient(hosts=zookeeper.connect, client_id=(session_id, password))
    thief.start(timeout=10)
    thief.stop()
    thief.close()


def test_a_deposed_controllers_write_fails(
    zookeeper: ZooKeeperChroot, zk_client: KazooClient, parts: dict[int, ClusterParts], tmp_path: Path
) -> None:
    parts[1] = ClusterParts(zookeeper, 1, tmp_path / "b1")
    wait_for(lambda: parts[1].controller.active, what="broker 1 acting as controller")
    parts[2] = ClusterParts(zookeeper, 2, tmp_path / "b2")
    create_topic(zk_client, "fenced", {0: (1, 2)})
    wait_for(lambda: state(zk_client, "fenced", 0) is not None, what="the partition's first state")
    assert state(zk_client, "fenced", 0) == {
        "controller_epoch": 1,
        "leader": 1,
        "version": 1,
        "leader_epoch": 0,
        "isr": [1, 2],
    }
    old_writer = parts[1].controller.writer
    assert old_writer is not None and old_writer.role.epoch == 1

    expire_session(zookeeper, parts[1].membership.client)  # broker 1 loses its session: broker 2 is elected
    wait_for(lambda: controller(zk_client) == 2 and controller_epoch(zk_client) == 2, what="broker 2 elected")
    wait_for(lambda: not parts[1].controller.active, what="broker 1 to stop acting")
    wait_for(lambda: parts[1].membership.client.connected, what="broker 1's new session")

    current = state(zk_client, "fenced", 0)
    _data, stat = zk_client.get(zk.partition_state_path("fenced", 0))
    with pytest.raises(ControllerMovedError, match="controller epoch 1 is no longer current"):
        old_writer.set_state("fenced", 0, zk.PartitionState(1, 99, (1,), 1), stat.version)
    with pytest.raises(ControllerMovedError):
        old_writer.create_state("fenced", 1, zk.PartitionState(1, 0, (1,), 1))
    assert state(zk_client, "fenced", 0) == current
    assert not zk_client.exists(zk.partition_state_path("fenced", 1))


def test_a_controller_that_finds_itself_fenced_stops_acting_and_the_cluster_elects_again(
    zookeeper: ZooKeeperChroot, zk_client: KazooClient, parts: dict[int, ClusterParts], tmp_path: Path
) -> None:
    parts[1] = ClusterParts(zookeeper, 1, tmp_path / "b1")
    wait_for(lambda: parts[1].controller.active, what="broker 1 acting as controller")
    parts[2] = ClusterParts(zookeeper, 2, tmp_path / "b2")
    # another election has raised the epoch behind broker 1's back (its session and /controller are intact)
    zk_client.set(zk.CONTROLLER_EPOCH_PATH, zk.encode_controller_epoch(2))
    create_topic(zk_client, "after", {0: (2, 1)})  # broker 1's next pass writes, and is refused
    wait_for(lambda: parts[1].controller.fenced_epoch == 1, what="broker 1 to find itself fenced")
    wait_for(lambda: controller_epoch(zk_client) == 3, what="a new election")
    elected = wait_for(lambda: controller(zk_client), what="a controller")
    wait_for(
        lambda: (state(zk_client, "after", 0) or {}).get("controller_epoch") == 3, what="the new controller's write"
    )
    assert state(zk_client, "after", 0) == {
        "controller_epoch": 3,
        "leader": 2,
        "version": 1,
        "leader_epoch": 0,
        "isr": [2, 1],
    }
    assert parts[elected].controller.active and not parts[3 - elected].controller.active
