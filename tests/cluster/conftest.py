"""Fixtures of the cluster suites: a real ZooKeeper (tests/zookeeper_process.py) and brokers that join it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_proxy import ProxyRegistry
from kazoo.client import KazooClient

from broker_process import BrokerFactory, BrokerProcess
from zookeeper_process import SESSION_TIMEOUT_MS, ClusterBroker, ZooKeeperProcess, zookeeper_missing


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeperProcess]:
    missing = zookeeper_missing()
    if missing:
        pytest.skip(missing)
    server = ZooKeeperProcess(tmp_path / "zookeeper").start()
    yield server
    server.stop()


@pytest.fixture
def zk_client(zookeeper: ZooKeeperProcess) -> Iterator[KazooClient]:
    """A client of the test's own, to inspect the znodes as an operator would with zkCli.sh."""
    # patient: a ZooKeeper just started on two busy cores may answer `ruok` before it completes a session's handshake
    client = KazooClient(hosts=zookeeper.connect, connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2})
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def cluster_broker(tmp_path: Path, zookeeper: ZooKeeperProcess) -> Iterator[ClusterBroker]:
    """Starts a broker with `broker.id` that joins the test's ZooKeeper."""
    factory = BrokerFactory(tmp_path / "brokers")

    def start(broker_id: int, overrides: dict[str, Any] | None = None) -> BrokerProcess:
        settings = {
            "broker.id": broker_id,
            "zookeeper.connect": zookeeper.connect,
            "zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
            # the last broker of a test to stop has nowhere to move its leadership: it retries its controlled
            # shutdown (3 times) half a second apart instead of Kafka's 5 s, so the test's teardown is quick
            "controlled.shutdown.retry.backoff.ms": 500,
            **(overrides or {}),
        }
        return factory(settings)

    yield start
    factory.close_all()


@pytest.fixture
def fault_proxies() -> Iterator[ProxyRegistry]:
    """Fault-injecting TCP proxies (tests/cluster/fault_proxy.py), made by name with `.add(name, host, port)`; all
    are closed after the test. Needs no ZooKeeper."""
    with ProxyRegistry() as registry:
        yield registry
