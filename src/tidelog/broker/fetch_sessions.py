"""Incremental fetch sessions (KIP-227): a fetcher names only what changed, the leader answers only what changed.

A Fetch (v7+) carries `session_id` and `session_epoch`:

    session_epoch -1 (FINAL)    a full request without a session (what librdkafka and most consumers send); a
                                non-zero session_id is closed first
    session_epoch 0 (INITIAL)   a full request that opens a session: every partition it names is remembered with
                                its fetch offset, max bytes, leader epoch and the fetcher's log start; the response
                                carries the new session id (0 when the cache has no room: the fetcher stays on full
                                requests)
    session_epoch N > 0         an incremental request in session `session_id`, whose epoch must be N (the epoch
                                goes 1, 2, ... INT32_MAX, 1, ...): its partitions are added or updated, its
                                forgotten_topics_data removed, and the fetch reads every partition of the session

An incremental response leaves out each partition with nothing to say: no records, no error, and the same high
watermark, last stable offset and log start offset as the last response that carried it (a partition answered with
an error is always answered again once the error goes). Errors are the response's own: FETCH_SESSION_ID_NOT_FOUND
for an unknown id (evicted, or the broker restarted), INVALID_FETCH_SESSION_EPOCH for a repeated or skipped epoch;
the fetcher then starts over with a full request. A session whose last partition is forgotten is closed.

The cache holds at most `max.incremental.fetch.session.cache.slots` sessions (Kafka's default 1000). A new session
needs a free slot, or evicts one: any session unused for EVICTION_MS (Kafka's 120 s), else the least valuable of
those older than that - by (privileged, size): a follower's session is privileged, and a consumer's may only evict
consumers' - if the new one is worth more. A follower names every partition it copies from that leader, so a session
saves it, per append, a request naming all of them and a response carrying all of them (a broker following 17
`__consumer_offsets` partitions and one data partition from one leader sends one partition per round, not 18).

Kafka: core/src/main/scala/kafka/server/FetchSession.scala (CachedPartition, FetchSession, FetchSessionCache).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidelog.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INT32_MAX = (1 << 31) - 1
EVICTION_MS = 120_000  # Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS
PartitionKey = tuple[str, int]


def next_epoch(epoch: int) -> int:
    """The session epoch after `epoch`: 1 after INITIAL, wrapping from INT32_MAX to 1; FINAL stays FINAL."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == INT32_MAX else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """What the session remembers of one partition: the fetcher's last request for it, and what the last response
    that carried it said (-1 before any)."""

    topic_id: uuid.UUID | None
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    fetcher_log_start_offset: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1

    def must_answer(
        self, has_records: bool, error_code: int, high_watermark: int, last_stable_offset: int, log_start_offset: int
    ) -> bool:
        """Whether an incremental response carries the partition; remembers what it then says."""
        changed = (high_watermark, last_stable_offset, log_start_offset) != (
            self.high_watermark,
            self.last_stable_offset,
            self.log_start_offset,
        )
        if error_code != ErrorCode.NONE:
            self.high_watermark = -1  # answered again once the error is gone
            return True
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        return has_records or changed


@dataclass(slots=True)
class FetchSession:
    id: int
    privileged: bool  # a follower's
    created_ms: int
    last_used_ms: int
    epoch: int = 1  # the epoch the next incremental request must carry
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)

    def update(
        self, requested: Iterable[tuple[PartitionKey, CachedPartition]], forgotten: Iterable[PartitionKey]
    ) -> None:
        for key, asked in requested:
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = asked
            else:
                cached.topic_id = asked.topic_id
                cached.fetch_offset = asked.fetch_offset
                cached.partition_max_bytes = asked.partition_max_bytes
                cached.current_leader_epoch = asked.current_leader_epoch
                cached.fetcher_log_start_offset = asked.fetcher_log_start_offset
        for key in forgotten:
            self.partitions.pop(key, None)


class FetchSessionError(Exception):
    """A session request that cannot be served: answered with `error_code` and no partitions."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class FetchSessionCache:
    """The broker's sessions (see the module docstring). Used from the event loop only."""

    def __init__(self, max_entries: int, eviction_ms: int = EVICTION_MS) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self._sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def remove(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)

    def incremental(self, session_id: int, epoch: int, now_ms: int) -> FetchSession:
        """The session an incremental request (epoch > 0) names, its epoch moved on; FetchSessionError if there is
        none or the epoch is not the one expected."""
        session = self._sessions.get(session_id)
        if session is None:
            raise FetchSessionError(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, f"no fetch session {session_id}")
        if session.epoch != epoch:
            raise FetchSessionError(
                ErrorCode.INVALID_FETCH_SESSION_EPOCH,
                f"fetch session {session_id} expected epoch {session.epoch}, got {epoch}",
            )
        session.epoch = next_epoch(session.epoch)
        session.last_used_ms = now_ms
        return session

    def create(self, privileged: bool, partitions: dict[PartitionKey, CachedPartition], now_ms: int) -> int:
        """A new session holding `partitions`, if there is room (or a session to evict); its id, else 0."""
        if not partitions or self.max_entries <= 0:
            return INVALID_SESSION_ID
        if len(self._sessions) >= self.max_entries and not self._evict(privileged, len(partitions), now_ms):
            return INVALID_SESSION_ID
        session_id = random.randint(1, INT32_MAX)
        while session_id in self._sessions:
            session_id = random.randint(1, INT32_MAX)
        self._sessions[session_id] = FetchSession(session_id, privileged, now_ms, now_ms, partitions=partitions)
        return session_id

    def _evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        stale = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - stale.last_used_ms > self.eviction_ms:
            del self._sessions[stale.id]
            self.evictions += 1
            return True
        # older than the eviction time: any newcomer may evict it; a consumer's session: also a follower's newcomer
        old = now_ms - self.eviction_ms
        candidates = [s for s in self._sessions.values() if s.created_ms < old or (privileged and not s.privileged)]
        if not candidates:
            return False
        weakest = min(candidates, key=lambda s: (s.privileged, len(s.partitions), s.id))
        if (privileged, size) < (weakest.privileged, len(weakest.partitions)):
            return False
        del self._sessions[weakest.id]
        self.evictions += 1
        return True
