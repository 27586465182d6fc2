"""Fixtures of the cluster suites: a real ZooKeeper (tests/zookeeper_process.py) and brokers that join it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import ProxyRegistry
from kazoo.client import KazooClient

from broker_process import BrokerFactory
from zookeeper_process import (
    ClusterBroker,
    ZooKeeperChroot,
    ZooKeeperProcess,
    zookeeper_missing,
)


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperProcess]:
    """One ZooKeeper server for the whole session; each test gets a chroot of its own on it (`zookeeper`)."""
    missing = zookeeper_missing()
    if missing:
        pytest.skip(missing)
    server = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


_CHROOTS = itertools.count(1)


@pytest.fixture
def zookeeper(zookeeper_server: ZooKeeperProcess) -> ZooKeeperChroot:
    """This test's ZooKeeper: an empty chroot on the shared server (made here: kazoo wants it to exist)."""
    chroot = f"/test-{next(_CHROOTS)}"
    client = KazooClient(hosts=zookeeper_server.connect, connection_retry={"max_tries": -1, "delay": 0.2})
    client.start(timeout=30)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return ZooKeeperChroot(zookeeper_server, chroot)


@pytest.fixture
def zk_client(zookeeper: ZooKeeperChroot) -> Iterator[KazooClient]:
    """A client of the test's own, to inspect the znodes as an operator would with zkCli.sh."""
    # patient: a ZooKeeper just started on two busy cores may answer `ruok` before it completes a session's handshake
    client = KazooClient(hosts=zookeeper.connect, connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2})
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def cluster_broker(tmp_path: Path, zookeeper: ZooKeeperChroot) -> Iterator[ClusterBroker]:
    """Starts brokers with `broker.id` that join the test's ZooKeeper (one, or several side by side: `.all`)."""
    factory = BrokerFactory(tmp_path / "brokers")
    yield ClusterBroker(factory, zookeeper.connect)
    factory.close_all()


@pytest.fixture
def fault_proxies() -> Iterator[ProxyRegistry]:
    """Fault-injecting TCP proxies (tests/cluster/fault_proxy.py), made by name with `.add(name, host, port)`; all
    are closed after the test. Needs no ZooKeeper."""
    with ProxyRegistry() as registry:
        yield registry
