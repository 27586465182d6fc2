"""The follower's side of replication: fetchers that copy the leaders' logs (Kafka's ReplicaFetcherThread).

Each partition this broker follows is copied by one fetcher: the one of its leader broker and of index
hash(topic, partition) % num.replica.fetchers. A fetcher is an asyncio task with one connection
(protocol/client.py) to the leader's inter-broker listener, over which it repeats two steps:

1. Truncation, for the partitions it has just been given (a new leader or a new leader epoch): OffsetForLeaderEpoch
   with the latest epoch of the follower's log; the leader answers where that epoch ends in its own log (or, if it
   never had it, the largest epoch it has below it and where that ends), and the follower cuts its log there
   (KIP-101, and KIP-279's rounds when the answer names an older epoch: the follower then asks again with its new
   latest epoch until the two agree). Whatever the follower wrote that the leader does not have goes, so replicas
   never diverge.
2. Fetch (replica_id = this broker, leader epoch checked by the leader) from each partition's log end, in an
   incremental fetch session (KIP-227, broker/fetch_sessions.py): after the first request only the partitions whose
   log end (or log start, or leader epoch) moved are named, and the answer carries only those with something new;
   the batches
   come back as the leader wrote them and are appended unchanged (`Partition.append_replica`: same offsets, same
   leader epochs, byte-identical files); the follower's high watermark becomes min(the leader's, its own log end),
   and its log start follows the leader's (DeleteRecords and retention at the leader). A partial last batch (the
   leader's answer is cut at replica.fetch.max.bytes) is fetched again next time.

Errors: OFFSET_OUT_OF_RANGE (the follower's end is beyond the leader's, after an unclean election, or below the
leader's log start): ListOffsets at the leader, then truncate to its end, or start over at its log start.
FENCED_LEADER_EPOCH: the leader has moved on: the partition waits replica.fetch.backoff.ms and tries again, until
the next view reassigns it. UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER: the leader has not applied the view this
follower has (both read ZooKeeper, in either order): the partition tries again after 50 ms, not a full back-off.
A broken connection: reconnect after replica.fetch.backoff.ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tidelog.broker.config import ReplicationConfig
from tidelog.broker.fetch_sessions import INITIAL_EPOCH, INVALID_SESSION_ID, next_epoch
from tidelog.broker.zk_layout import BrokerRegistration
from tidelog.codec.record_batch import LOG_OVERHEAD, peek_offset_and_length
from tidelog.errors import ErrorCode, TidelogError, UnknownTopicOrPartitionError
from tidelog.protocol.client import BrokerConnection, BrokerConnectionError
from tidelog.protocol.messages import ApiKey
from tidelog.protocol.replica_fetch_request import VERSION as REPLICA_FETCH_VERSION
from tidelog.protocol.replica_fetch_request import encode_replica_fetch
from tidelog.storage.api import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Partition, StorageEngine

log = logging.getLogger("tidelog.replication")

PartitionKey = tuple[str, int]
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
LIST_OFFSETS_VERSION = 7
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
LEADER_CATCHING_UP_S = 0.05
# the leader does not know (yet) the leader epoch the follower was given: it is about to
LEADER_CATCHING_UP_ERRORS = frozenset({ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER})
SESSION_ERRORS = frozenset({ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH})
RETRIABLE_PARTITION_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)


class _Asked(NamedTuple):
    """What a fetch asks of one partition; sent again only when it changes (KIP-227)."""

    fetch_offset: int
    log_start_offset: int
    leader_epoch: int


class _FollowerSession:
    """This fetcher's incremental fetch session at its leader (Kafka's FetchSessionHandler): what the leader holds
    for each partition, the session id and the epoch of the next request. The first request is full (epoch 0) and
    opens the session; each next one names only the partitions whose fetch offset, log start or leader epoch
    changed, and forgets those no longer fetched (backing off, or followed no more)."""

    def __init__(self) -> None:
        self.id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.held: dict[PartitionKey, _Asked] = {}

    def changes(self, wanted: dict[PartitionKey, _Asked]) -> tuple[dict[PartitionKey, _Asked], list[PartitionKey]]:
        """(the partitions to name in the next request, the partitions to forget)."""
        if self.epoch == INITIAL_EPOCH:
            return wanted, []
        changed = {key: asked for key, asked in wanted.items() if self.held.get(key) != asked}
        return changed, [key for key in self.held if key not in wanted]

    def sent(self, changed: dict[PartitionKey, _Asked], forgotten: list[PartitionKey], session_id: int) -> None:
        """The leader answered the request without a session error."""
        if self.epoch == INITIAL_EPOCH:
            if session_id == INVALID_SESSION_ID:
                return  # no room at the leader: full requests again
            self.id, self.held = session_id, dict(changed)
        else:
            self.held.update(changed)
            for key in forgotten:
                self.held.pop(key, None)
        self.epoch = next_epoch(self.epoch)


@dataclass(slots=True)
class FetchState:
    leader_epoch: int
    truncated: bool = False  # the truncation step is done for this leader epoch
    retry_at: float = 0.0  # loop time before which the partition is not fetched (after an error)


def whole_batches_length(data: bytes | memoryview) -> int:
    """How many bytes at the start of `data` are whole batches (a Fetch answer may end inside one)."""
    position = 0
    while len(data) - position >= LOG_OVERHEAD:
        _offset, size = peek_offset_and_length(data, position)
        end = position + LOG_OVERHEAD + size
        if size <= 0 or end > len(data):
            break
        position = end
    return position


def divergence(follower: Partition, leader_epoch: int, end_offset: int) -> tuple[int, bool]:
    """Where the follower's log must be cut, given the leader's OffsetForLeaderEpoch answer (`leader_epoch`,
    `end_offset`) to the follower's latest epoch; and whether the logs then agree (False: ask again with the new
    latest epoch, KIP-279's next round).

    - The leader answered for the follower's own latest epoch, or for an older epoch the follower also has: cut at
      the smaller of the two ends of that epoch; done.
    - The leader answered an older epoch the follower never had: cut where the follower's largest epoch below it
      ends (and at most at the leader's end); ask again.
    - Nothing to compare (an empty log here, or the leader knows no epoch at or below the follower's): keep what the
      high watermark says is committed; a fetch beyond the leader's end is then out of range and truncates."""
    ours = follower.latest_epoch
    if ours == UNDEFINED_EPOCH or end_offset == UNDEFINED_OFFSET or leader_epoch == UNDEFINED_EPOCH:
        return min(follower.high_watermark, follower.log_end_offset), True
    our_epoch, our_end = follower.end_offset_for_epoch(leader_epoch)
    done = leader_epoch == ours or our_epoch == leader_epoch
    return min(end_offset, our_end if our_end != UNDEFINED_OFFSET else follower.log_end_offset), done


class ReplicaFetchers:
    """Every fetcher of this broker; `follow_only` (on the loop) says which partitions to follow from whom."""

    def __init__(
        self,
        broker_id: int,
        engine: StorageEngine,
        live_brokers: Callable[[], Mapping[int, BrokerRegistration]],
        listener_name: str,
        config: ReplicationConfig,
    ) -> None:
        self.broker_id = broker_id
        self.engine = engine
        self.live_brokers = live_brokers
        self.listener_name = listener_name
        self.config = config
        self._fetchers: dict[tuple[int, int], _Fetcher] = {}
        self._assigned: dict[PartitionKey, tuple[int, int]] = {}  # partition -> (leader, leader epoch)
        self._closed = False

    def follow_only(self, partitions: Mapping[PartitionKey, tuple[int, int]]) -> None:
        """Follow exactly `partitions` (partition -> (leader, leader epoch)); a partition whose leader or epoch
        changed starts again with the truncation step."""
        if self._closed:
            return
        for key, (leader, epoch) in partitions.items():
            if self._assigned.get(key) == (leader, epoch):
                continue
            self._remove(key)
            self._assigned[key] = (leader, epoch)
            fetcher_key = (leader, zlib.crc32(f"{key[0]}-{key[1]}".encode()) % self.config.num_replica_fetchers)
            fetcher = self._fetchers.get(fetcher_key)
            if fetcher is None or fetcher.stopped:
                fetcher = _Fetcher(self, leader, fetcher_key[1])
                self._fetchers[fetcher_key] = fetcher
            fetcher.add(key, epoch)
        for key in [key for key in self._assigned if key not in partitions]:
            self._remove(key)
        for fetcher_key in [k for k, f in self._fetchers.items() if not f.partitions]:
            self._fetchers.pop(fetcher_key).stop()

    def _remove(self, key: PartitionKey) -> None:
        assigned = self._assigned.pop(key, None)
        if assigned is None:
            return
        for fetcher in self._fetchers.values():
            fetcher.partitions.pop(key, None)

    @property
    def following(self) -> dict[PartitionKey, tuple[int, int]]:
        return dict(self._assigned)

    async def close(self) -> None:
        self._closed = True
        fetchers, self._fetchers = list(self._fetchers.values()), {}
        self._assigned.clear()
        for fetcher in fetchers:
            fetcher.stop()
        for fetcher in fetchers:
            await fetcher.wait_stopped()


class _Fetcher:
    """One connection to one leader, copying the partitions assigned to it (see the module docstring)."""

    def __init__(self, owner: ReplicaFetchers, leader: int, index: int) -> None:
        self.owner = owner
        self.leader = leader
        self.name = f"fetcher {index} of broker {leader}"
        self.partitions: dict[PartitionKey, FetchState] = {}
        self.stopped = False
        self._wake = asyncio.Event()
        self._connection: BrokerConnection | None = None
        self._session = _FollowerSession()
        self._task = asyncio.create_task(self._run(), name=f"tidelog-replica-fetcher-{leader}-{index}")

    def add(self, key: PartitionKey, leader_epoch: int) -> None:
        self.partitions[key] = FetchState(leader_epoch)
        self._wake.set()

    def stop(self) -> None:
        self.stopped = True
        self._task.cancel()

    async def wait_stopped(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # --- the loop ---------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        config = self.owner.config
        backoff_s = config.replica_fetch_backoff_ms / 1000
        try:
            while not self.stopped:
                if not self.partitions:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    connection = self._connect()
                    if connection is None:
                        await asyncio.sleep(backoff_s)
                        continue
                    await self._truncate(connection)
                    fetched = await self._fetch(connection)
                except BrokerConnectionError as exc:
                    log.warning("%s: %s; retrying in %d ms", self.name, exc, config.replica_fetch_backoff_ms)
                    await self._drop_connection()
                    await asyncio.sleep(backoff_s)
                    continue
                if not fetched:  # every partition is backing off
                    await asyncio.sleep(min(backoff_s, 0.1))
        finally:
            await self._drop_connection()

    def _connect(self) -> BrokerConnection | None:
        registration = self.owner.live_brokers().get(self.leader)
        endpoint = registration.endpoint(self.owner.listener_name) if registration is not None else None
        if endpoint is None:
            log.debug("%s: no %s endpoint of broker %d is registered", self.name, self.owner.listener_name, self.leader)
            return None
        connection = self._connection
        if connection is None or (connection.host, connection.port) != (endpoint.host, endpoint.port):
            connection = BrokerConnection(endpoint.host, endpoint.port, f"tidelog-replica-{self.owner.broker_id}")
            self._connection = connection
        return connection

    async def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        self._session = _FollowerSession()
        if connection is not None:
            await connection.close()

    def _timeout_s(self) -> float:
        config = self.owner.config
        return (config.replica_socket_timeout_ms + config.replica_fetch_wait_max_ms) / 1000

    def _handle(self, key: PartitionKey) -> Partition | None:
        try:
            return self.owner.engine.partition(*key)
        except UnknownTopicOrPartitionError:
            return None  # not created here yet (the admin thread creates it): tried again on the next round

    def _ready(self) -> list[tuple[PartitionKey, FetchState, Partition]]:
        now = asyncio.get_running_loop().time()
        ready = []
        for key, state in self.partitions.items():
            if state.retry_at > now:
                continue
            handle = self._handle(key)
            if handle is not None:
                ready.append((key, state, handle))
        return ready

    def _back_off(self, state: FetchState, error: int | None = None) -> None:
        """Leave the partition out for replica.fetch.backoff.ms; for only LEADER_CATCHING_UP_S when the leader has
        not applied the new leader epoch yet (it will within milliseconds: a full back-off would hold acks=all at
        the new leader for a second after every failover)."""
        delay = self.owner.config.replica_fetch_backoff_ms / 1000
        if error in LEADER_CATCHING_UP_ERRORS:
            delay = min(delay, LEADER_CATCHING_UP_S)
        state.retry_at = asyncio.get_running_loop().time() + delay

    # --- truncation -------------------------------------------------------------------------------------------

    async def _truncate(self, connection: BrokerConnection) -> None:
        pending = [(key, state, handle) for key, state, handle in self._ready() if not state.truncated]
        if not pending:
            return
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), state, handle in pending:
            topics.setdefault(topic, []).append(
                {
                    "partition": partition,
                    "current_leader_epoch": state.leader_epoch,
                    "leader_epoch": handle.latest_epoch,
                }
            )
        body = {
            "replica_id": self.owner.broker_id,
            "topics": [{"topic": topic, "partitions": partitions} for topic, partitions in topics.items()],
        }
        response = await connection.request(
            ApiKey.OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION, body, self._timeout_s()
        )
        answers = {(topic.topic, answer.partition): answer for topic in response.topics for answer in topic.partitions}
        for key, state, handle in pending:
            answer = answers.get(key)
            if answer is None or self.partitions.get(key) is not state:
                continue
            error = int(answer.error_code)
            if error != ErrorCode.NONE:
                log.info("%s: %s-%d: OffsetForLeaderEpoch answered %s", self.name, *key, _error_name(error))
                self._back_off(state, error)
                continue
            await self._truncate_to_leader(key, state, handle, int(answer.leader_epoch), int(answer.end_offset))

    async def _truncate_to_leader(
        self, key: PartitionKey, state: FetchState, handle: Partition, leader_epoch: int, end_offset: int
    ) -> None:
        """Cut the follower's log where the leader's answer says it diverges (see `divergence`)."""
        target, done = divergence(handle, leader_epoch, end_offset)
        if target < handle.log_end_offset:
            log.info(
                "%s-%d: truncating from %d to %d (leader epoch %d ends at %d at the leader)",
                *key,
                handle.log_end_offset,
                target,
                leader_epoch,
                end_offset,
            )
            await asyncio.to_thread(handle.truncate_to, target)
        state.truncated = done or handle.latest_epoch == UNDEFINED_EPOCH

    # --- fetching ---------------------------------------------------------------------------------------------

    async def _fetch(self, connection: BrokerConnection) -> bool:
        """One Fetch for the partitions that are ready; False when none was."""
        config = self.owner.config
        ready = [(key, state, handle) for key, state, handle in self._ready() if state.truncated]
        if not ready:
            return False
        wanted = {key: _Asked(h.log_end_offset, h.log_start_offset, state.leader_epoch) for key, state, h in ready}
        session = self._session
        changed, forgotten = session.changes(wanted)
        topics: dict[str, list[tuple[int, int, int, int]]] = {}
        for (topic, partition), asked in changed.items():
            topics.setdefault(topic, []).append(
                (partition, asked.leader_epoch, asked.fetch_offset, asked.log_start_offset)
            )
        dropped: dict[str, list[int]] = {}
        for topic, partition in forgotten:
            dropped.setdefault(topic, []).append(partition)
        body = encode_replica_fetch(
            self.owner.broker_id,
            max_wait_ms=config.replica_fetch_wait_max_ms,
            min_bytes=1,
            max_bytes=config.replica_fetch_response_max_bytes,
            partition_max_bytes=config.replica_fetch_max_bytes,
            session_id=session.id,
            session_epoch=session.epoch,
            topics=topics,
            forgotten=dropped,
        )
        response = await connection.request(ApiKey.FETCH, REPLICA_FETCH_VERSION, body, self._timeout_s())
        error = int(response.error_code)
        if error in SESSION_ERRORS:  # the leader lost the session (it restarted, or evicted it): start a new one
            log.info("%s: Fetch answered %s; starting a new fetch session", self.name, _error_name(error))
            self._session = _FollowerSession()
            return True
        if error != ErrorCode.NONE:
            log.warning("%s: Fetch answered %s", self.name, _error_name(error))
            self._session = _FollowerSession()
            for _key, state, _handle in ready:
                self._back_off(state)
            return True
        session.sent(changed, forgotten, int(response.session_id))
        answers = {
            (topic.topic, answer.partition_index): answer for topic in response.responses for answer in topic.partitions
        }
        for key, state, handle in ready:
            answer = answers.get(key)
            if answer is None or self.partitions.get(key) is not state:
                continue
            try:
                await self._take(connection, key, state, handle, answer)
            except TidelogError as exc:
                log.error("%s: %s-%d: cannot copy the leader's records: %s", self.name, *key, exc)
                self._back_off(state)
        return True

    async def _take(
        self, connection: BrokerConnection, key: PartitionKey, state: FetchState, handle: Partition, answer: Any
    ) -> None:
        error = int(answer.error_code)
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            await self._handle_out_of_range(connection, key, state, handle)
            return
        if error != ErrorCode.NONE:
            if error not in RETRIABLE_PARTITION_ERRORS:
                log.warning("%s: %s-%d: Fetch answered %s", self.name, *key, _error_name(error))
            else:
                log.debug("%s: %s-%d: Fetch answered %s", self.name, *key, _error_name(error))
            self._back_off(state, error)
            return
        records = answer.records
        if records:
            length = whole_batches_length(records)
            if length:
                handle.append_replica(memoryview(records)[:length])
                if handle.flush_due():
                    await asyncio.to_thread(handle.flush)
        high_watermark = min(int(answer.high_watermark), handle.log_end_offset)
        if high_watermark > handle.high_watermark:
            handle.set_high_watermark(high_watermark)
        leader_start = int(answer.log_start_offset)
        if leader_start > handle.log_start_offset and leader_start <= handle.high_watermark:
            handle.delete_records(leader_start)

    async def _handle_out_of_range(
        self, connection: BrokerConnection, key: PartitionKey, state: FetchState, handle: Partition
    ) -> None:
        """The follower's log end is outside the leader's log: cut back to the leader's end, or start over at
        the leader's log start (Kafka's handleOutOfRangeError)."""
        leader_end = await self._leader_offset(connection, key, state, LATEST_TIMESTAMP)
        if leader_end is None:
            self._back_off(state)
            return
        if leader_end < handle.log_end_offset:
            log.warning(
                "%s-%d: the leader's log ends at %d, below this replica's %d: truncating (records only an unclean "
                "leader election loses)",
                *key,
                leader_end,
                handle.log_end_offset,
            )
            await asyncio.to_thread(handle.truncate_to, leader_end)
            return
        leader_start = await self._leader_offset(connection, key, state, EARLIEST_TIMESTAMP)
        if leader_start is None:
            self._back_off(state)
            return
        log.info(
            "%s-%d: the leader's log starts at %d, beyond this replica's end %d: starting over there",
            *key,
            leader_start,
            handle.log_end_offset,
        )
        await asyncio.to_thread(handle.truncate_fully_and_start_at, leader_start)

    async def _leader_offset(
        self, connection: BrokerConnection, key: PartitionKey, state: FetchState, target: int
    ) -> int | None:
        body = {
            "replica_id": self.owner.broker_id,
            "isolation_level": 0,
            "topics": [
                {
                    "name": key[0],
                    "partitions": [
                        {"partition_index": key[1], "current_leader_epoch": state.leader_epoch, "timestamp": target}
                    ],
                }
            ],
        }
        response = await connection.request(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, body, self._timeout_s())
        for topic in response.topics:
            for answer in topic.partitions:
                if int(answer.error_code) == ErrorCode.NONE:
                    return int(answer.offset)
                log.info("%s: %s-%d: ListOffsets answered %s", self.name, *key, _error_name(int(answer.error_code)))
        return None


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"
