"""The fetch session cache (broker/fetch_sessions.py): epochs, capacity and Kafka's eviction rules."""

from __future__ import annotations

import pytest

from tidelog.broker.fetch_sessions import (
    EVICTION_MS,
    INT32_MAX,
    CachedPartition,
    FetchSessionCache,
    FetchSessionError,
    next_epoch,
)
from tidelog.errors import ErrorCode


def partitions(count: int) -> dict[tuple[str, int], CachedPartition]:
    return {("t", p): CachedPartition(None, 0, 1 << 20, -1, -1) for p in range(count)}


def test_epochs_go_up_and_wrap_to_one() -> None:
    assert [next_epoch(e) for e in (0, 1, 41, INT32_MAX, -1)] == [1, 2, 42, 1, -1]


def test_an_incremental_request_must_carry_the_next_epoch() -> None:
    cache = FetchSessionCache(10)
    session_id = cache.create(False, partitions(2), now_ms=0)
    assert session_id != 0
    assert cache.incremental(session_id, 1, now_ms=1).epoch == 2
    with pytest.raises(FetchSessionError) as repeated:
        cache.incremental(session_id, 1, now_ms=2)
    assert repeated.value.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    with pytest.raises(FetchSessionError) as unknown:
        cache.incremental(session_id ^ 1, 1, now_ms=2)
    assert unknown.value.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_no_slots_or_no_partitions_means_no_session() -> None:
    assert FetchSessionCache(0).create(True, partitions(3), now_ms=0) == 0
    assert FetchSessionCache(5).create(True, {}, now_ms=0) == 0


def test_a_full_cache_evicts_a_stale_session_first() -> None:
    cache = FetchSessionCache(2)
    stale = cache.create(True, partitions(50), now_ms=0)
    fresh = cache.create(True, partitions(50), now_ms=EVICTION_MS)
    newcomer = cache.create(False, partitions(1), now_ms=EVICTION_MS + 1)  # stale: unused for > EVICTION_MS
    assert newcomer != 0 and len(cache) == 2
    with pytest.raises(FetchSessionError):
        cache.incremental(stale, 1, now_ms=EVICTION_MS + 2)
    assert cache.incremental(fresh, 1, now_ms=EVICTION_MS + 2).epoch == 2
    assert cache.evictions == 1


def test_a_follower_may_evict_a_consumer_but_not_the_other_way_round() -> None:
    cache = FetchSessionCache(1)
    consumer = cache.create(False, partitions(5), now_ms=0)
    assert cache.create(False, partitions(9), now_ms=10) == 0  # young sessions stay for consumers
    follower = cache.create(True, partitions(1), now_ms=20)
    assert follower != 0
    with pytest.raises(FetchSessionError):
        cache.incremental(consumer, 1, now_ms=30)
    assert cache.create(False, partitions(100), now_ms=40) == 0  # nor may a consumer evict a follower


def test_among_old_sessions_the_smaller_one_goes_for_a_bigger_newcomer() -> None:
    cache = FetchSessionCache(2)
    small = cache.create(False, partitions(2), now_ms=0)
    big = cache.create(False, partitions(20), now_ms=0)
    later = EVICTION_MS // 2
    cache.incremental(small, 1, now_ms=later)  # both used recently: neither is stale
    cache.incremental(big, 1, now_ms=later)
    now = EVICTION_MS + 10  # both older than the eviction time
    assert cache.create(False, partitions(1), now_ms=now) == 0  # worth less than either
    assert cache.create(False, partitions(10), now_ms=now) != 0
    with pytest.raises(FetchSessionError):
        cache.incremental(small, 2, now_ms=now)
    assert cache.incremental(big, 2, now_ms=now).epoch == 3
