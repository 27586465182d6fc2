"""Fixtures of the security tests: certificates made once per session, and `secure_broker`, one broker per test
module with the four listeners (PLAINTEXT, SASL_PLAINTEXT, SSL, SASL_SSL), every SASL mechanism enabled,
Kafka's ACL authorizer on, `super.users=User:admin`, and the users admin, alice and bob added before start by the
real `tidelog users` command (security_clients.py has the helpers).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from security_clients import LISTENERS, Certificates, add_users, make_certificates, secure_settings

from broker_process import BrokerFactory, BrokerProcess, StartBroker

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def start_module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartBroker]:
    factory = BrokerFactory(tmp_path_factory.mktemp("secure-broker"))
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture(scope="module")
def secure_broker(start_module_broker: StartBroker, certificates: Certificates) -> BrokerProcess:
    return start_module_broker(secure_settings(certificates), listeners=LISTENERS, before_start=add_users)


# --- pytest hooks ---------------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "security: a secured `tidelog serve` with real clients (tests/security)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.security)
