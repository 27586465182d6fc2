"""Fixtures of the client matrix modules (tests/clients): one broker per module.

Each test is a cell of docs/compatibility.md's client matrix (`@pytest.mark.matrix`, recorded by tests/conftest.py;
the column is the module's `CLIENT` unless the mark names another). When a test fails, the tail of the stderr of
every broker alive during the test is attached to the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_process import BrokerFactory, BrokerProcess

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by a test module; its tests use distinct topic and group names."""
    factory = BrokerFactory(tmp_path_factory.mktemp("broker"))
    try:
        yield factory(group_initial_rebalance_delay_ms=0)
    finally:
        factory.close_all()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "clients: the client matrix modules, against a real `tidelog serve` (tests/clients)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.clients)
