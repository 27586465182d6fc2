"""Shared by the crash suites: `start_broker`, a real `tidelog serve` subprocess (tests/broker_process.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_process import BrokerFactory, StartBroker


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[StartBroker]:
    """`start_broker({"log.flush.interval.messages": 1})`: a broker of the test's own, stopped at teardown."""
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()
