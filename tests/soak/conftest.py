"""Fixtures of the soak suite: `start_broker`, a real `tidelog serve` of the test's own (tests/broker_process.py).

When a soak test fails, the tail of the broker's stderr is attached to its report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_process import BrokerFactory, StartBroker


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[StartBroker]:
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()
