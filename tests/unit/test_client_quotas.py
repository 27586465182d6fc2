"""The client quota manager (broker/quotas.py) on a fake clock: Kafka's precedence order of quota entities, the rate
shared by the clients an entity covers, the sampled rate's window, and the throttle time formula."""

from __future__ import annotations

import pytest

from tidelog.broker.config import QuotaConfig
from tidelog.broker.quota_store import entity_of_path, entity_path, sanitize
from tidelog.broker.quotas import CLIENT_ID, USER, ClientQuotaManager, QuotaKind

PRODUCE = QuotaKind.PRODUCE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def manager(num: int = 11, size: int = 1) -> tuple[ClientQuotaManager, Clock]:
    clock = Clock()
    return ClientQuotaManager(QuotaConfig(num, size), clock), clock


def test_the_most_specific_entity_wins_in_kafkas_order() -> None:
    quotas, _ = manager()
    levels = [
        (((CLIENT_ID, None),), 8.0),
        (((CLIENT_ID, "app"),), 7.0),
        (((USER, None),), 6.0),
        (((CLIENT_ID, None), (USER, None)), 5.0),
        (((CLIENT_ID, "app"), (USER, None)), 4.0),
        (((USER, "alice"),), 3.0),
        (((CLIENT_ID, None), (USER, "alice")), 2.0),
        (((CLIENT_ID, "app"), (USER, "alice")), 1.0),
    ]
    for level, (entity, bound) in enumerate(levels):
        quotas.set_entity(entity, {PRODUCE.value: bound})
        found = quotas.quota(PRODUCE, "alice", "app")
        assert found is not None and found[0] == bound, level
    assert quotas.quota(QuotaKind.FETCH, "alice", "app") is None  # each key has its own entities
    quotas.set_entity(levels[-1][0], {})
    assert quotas.quota(PRODUCE, "alice", "app") == (2.0, ("alice", "app"))
    assert quotas.quota(PRODUCE, "bob", "other") == (5.0, ("bob", "other"))
    quotas.set_entity(levels[3][0], {})
    assert quotas.quota(PRODUCE, "bob", "other") == (6.0, ("bob", ""))  # a user quota: the rate is the user's


def test_throttle_time_brings_the_rate_back_to_the_bound() -> None:
    quotas, clock = manager(num=11, size=1)
    quotas.set_entity(((CLIENT_ID, "app"),), {PRODUCE.value: 1000.0})
    # a new client's rate counts 10 whole windows: 10,000 bytes at once are within 1,000 B/s
    assert quotas.record(PRODUCE, "User:ANONYMOUS", "app", 10_000) == 0
    # 5,000 more: 15,000 B over 10 s = 1,500 B/s; back to 1,000 B/s after (1500 - 1000) / 1000 * 10 s = 5 s
    assert quotas.record(PRODUCE, "User:ANONYMOUS", "app", 5_000) == 5_000
    # another client id shares nothing with it
    assert quotas.record(PRODUCE, "User:ANONYMOUS", "other", 5_000) == 0
    # 20 s later the samples have expired: the client starts afresh
    clock.now += 20
    assert quotas.record(PRODUCE, "User:ANONYMOUS", "app", 9_000) == 0


def test_user_quota_rate_is_shared_by_the_users_clients() -> None:
    quotas, _ = manager(num=2, size=1)
    quotas.set_entity(((USER, "alice"),), {PRODUCE.value: 1000.0})
    assert quotas.record(PRODUCE, "User:alice", "one", 800) == 0
    assert quotas.record(PRODUCE, "User:alice", "two", 800) > 0  # 1,600 B in one window: over, for both
    assert quotas.record(PRODUCE, "User:bob", "two", 800) == 0


def test_request_throttle_is_bounded_by_one_window() -> None:
    quotas, _ = manager(num=2, size=1)
    quotas.set_entity(((CLIENT_ID, None),), {QuotaKind.REQUEST.value: 1.0})
    assert quotas.record(QuotaKind.REQUEST, "User:ANONYMOUS", "any", 50.0) == 1000


@pytest.mark.parametrize(
    ("entity", "path"),
    [
        (((USER, "alice"),), "users/alice"),
        (((CLIENT_ID, None), (USER, "a b*")), "users/a%20b%2A/clients/<default>"),
        (((CLIENT_ID, "app.1"),), "clients/app.1"),
        (((USER, None),), "users/<default>"),
    ],
)
def test_entity_paths_as_kafka_writes_them(entity, path) -> None:
    assert entity_path(entity) == path
    assert entity_of_path(path) == entity


def test_sanitize_as_javas_url_encoder() -> None:
    assert sanitize("user@example.com") == "user%40example.com"
    assert sanitize("a-b_c.d~") == "a-b_c.d%7E"
