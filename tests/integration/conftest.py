"""A real `tidelog serve` subprocess for integration tests (tests/broker_process.py holds the process helpers).

`broker` is one broker per test module (tests share it through distinct topic names); `start_broker(...)` starts
a broker of the test's own, with config overrides, for tests that restart, kill or reconfigure it. When a test
fails, the tail of the stderr of every broker alive during the test is attached to the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_process import ENGINES, BrokerFactory, BrokerProcess, StartBroker

HERE = Path(__file__).resolve().parent


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[StartBroker]:
    """`start_broker({"log.flush.interval.messages": 1})` or `start_broker(log_flush_interval_messages=1)`;
    `start_broker(engine="rocketmq", sync_flush=True)` for another storage engine or acks=all on disk."""
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by a test module; its tests use distinct topic names and must not stop it."""
    factory = BrokerFactory(tmp_path_factory.mktemp("broker"))
    try:
        yield factory()
    finally:
        factory.close_all()


@pytest.fixture(scope="module")
def start_module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartBroker]:
    """Like `start_broker`, for a broker with overrides that a whole module shares."""
    factory = BrokerFactory(tmp_path_factory.mktemp("module-broker"))
    try:
        yield factory
    finally:
        factory.close_all()


# --- the storage engine under the broker ---------------------------------------------------------------------


@pytest.fixture(scope="module", params=ENGINES)
def engine_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> BrokerProcess:
    """A broker per storage engine, for the tests every engine must pass; the Kafka one is the module's `broker`."""
    if request.param == "kafka":
        return request.getfixturevalue("broker")
    factory = BrokerFactory(tmp_path_factory.mktemp(f"{request.param}-broker"))
    request.addfinalizer(factory.close_all)
    return factory(engine=request.param)


# --- pytest hooks ---------------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: runs a real `tidelog serve` subprocess (tests/integration)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)
