"""Fetch (with long polling) and ListOffsets.

A Fetch reads file slices from each requested partition (at most `partition_max_bytes` each and
`max_bytes` in all, but always one whole batch for the first partition that has data, KIP-74). If
fewer than `min_bytes` are available it waits up to `max_wait_ms` for an append to one of its
partitions - woken by the producer path, never by polling - then reads again (a consumer's fetch only when the high
watermark moved, a follower's when the log end did: `AppendNotifier`). Record bytes go out with sendfile straight
from the segment files, except for Fetch v0-v3 (clients older than Kafka 0.11): their batches are read and
down-converted to magic 0 (v0-v1) or magic 1 (v2-v3) message sets (codec/legacy_write.py), or refused per partition
with UNSUPPORTED_VERSION where the topic sets `message.downconversion.enable=false`.

Fetch v13+ (KIP-516) names topics by topic id, in the request and in the answer: an id is resolved against the
topics clients see (the engine's on a single broker, the cluster's in a cluster, as Kafka's metadata cache does);
each partition of an id that names no topic is answered UNKNOWN_TOPIC_ID under that id, beside the others, and
is not waited on (nor is a partition whose topic the client may not read). v15 (KIP-903) moves the follower's id
into `replica_state` (with its broker epoch, which Kafka checks in KRaft mode only); v16 (KIP-951) answers a
partition refused with NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH with its current leader and epoch, and the
response with that leader's endpoint for the client's listener, so the client can go there at once; v17 (KIP-853)
adds the follower's log directory id, which is read and ignored. Fetch sessions (v7+, KIP-227; fetch_sessions.py):
a full request with session epoch 0 opens one, an incremental request reads every partition of its session and is
answered with only the partitions that have something new; epoch -1 (what librdkafka sends) is a full request
without a session.

Transactions: every Fetch answer carries the partition's last stable offset (v4+). A read_committed Fetch
(`isolation_level` 1, v4+) reads only below it (`Partition.read(max_offset=)`) and gets the aborted transactions of
what it read (`aborted_transactions`, from the fetch offset to the last stable offset), which the client drops along
with the control batches; a read_uncommitted one gets null there, as Kafka answers. ListOffsets with read_committed
(v2+) answers the last stable offset for -1 (latest), and a timestamp lookup only below it.

ListOffsets answers Kafka's special targets: -2 earliest (log start), -1 latest (the high watermark: the log end on
a single broker; a follower asking its leader gets the log end), -3 the record with the largest timestamp, -4
(EARLIEST_LOCAL_TIMESTAMP, v8+) which, with no tiered storage, is the log start too, and -5
(LATEST_TIERED_TIMESTAMP, v9+, KIP-1005): with no tiered storage nothing is tiered, so offset, timestamp and leader
epoch -1, as Kafka answers without remote storage. v0 answers a list of offsets (`old_style_offsets`, at most
`max_num_offsets`): the one offset later versions answer, none where they answer -1 (Kafka's v0 lists segment base
offsets older than the timestamp; a latest or earliest lookup, what v0 clients send, gets the same single offset
from both).

In a cluster a Fetch with `replica_id` set (from v15 inside `replica_state`) comes from a follower: it reads up to
the log end, not the high watermark, and its fetch offset is the follower's log end, which the replica manager
records (`record_follower_fetch`) before the answer gives the follower the leader's high watermark.
OffsetForLeaderEpoch answers (v0-v4; v0 without the epoch in the answer) where a leader epoch ends in this leader's
log (`Partition.end_offset_for_epoch`), what a follower truncates to (KIP-101/279) and what a consumer checks after
a leader change (KIP-320).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    CachedPartition,
    FetchSession,
    FetchSessionCache,
    FetchSessionError,
)
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, LeaderCheck, RawResponse, Response
from tidelog.broker.quotas import QuotaKind
from tidelog.codec.legacy_write import downconvert
from tidelog.config import LogConfig
from tidelog.errors import ErrorCode, NotLeaderOrFollowerError, TidelogError
from tidelog.protocol.fetch_response import (
    NODE_ENDPOINTS_FROM,
    TOPIC_IDS_FROM,
    NodeEndpoint,
    PartitionData,
    TopicData,
    encode_fetch_response,
)
from tidelog.protocol.messages import ApiKey, Request, millis, response_header, uuid_to_kafka
from tidelog.storage.api import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, StorageEngine, TimestampAndOffset

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.cluster_topics import ClusterTopics
    from tidelog.broker.metrics import Metrics
    from tidelog.broker.quotas import ClientQuotaManager

log = logging.getLogger("tidelog.broker")

INT_MAX = (1 << 31) - 1
DEFAULT_LOG_CONFIG = LogConfig()
LAST_LEGACY_FETCH_VERSION = 3  # v0-v3 want magic 0/1 message sets; v4 brought the v2 record batch
EARLIEST_LOCAL_TIMESTAMP = -4  # ListOffsets v8+ (KIP-405): the first offset kept on local disk
READ_COMMITTED = 1  # isolation_level of Fetch v4+ and ListOffsets v2+
LATEST_TIERED_TIMESTAMP = -5  # ListOffsets v9+ (KIP-1005): the last offset copied to tiered storage
REPLICA_STATE_FROM = 15  # Fetch v15+ (KIP-903): the follower's id inside replica_state
SESSIONS_FROM = 7  # Fetch v7+ (KIP-227): session id and epoch
LEADER_HINT_ERRORS = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH})  # KIP-951
PartitionKey = tuple[str, int]


class ReadReplicas(Protocol):
    """KIP-392 (read_replicas.py): where a consumer should read, and which non-led partitions this broker serves."""

    def serves_consumers(self, topic: str, partition: int) -> bool: ...

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str) -> int: ...


# (topic, partition, follower broker id, its fetch offset) -> None; raises NotLeaderOrFollowerError (replica_manager.py)
FollowerFetchRecorder = Callable[[str, int, int, int], None]


class FetchTopic(NamedTuple):
    """A requested topic with its name resolved: None when a v13+ request's topic id names no topic."""

    name: str | None
    topic_id: uuid.UUID | None  # v13+: as asked, and answered
    partitions: Sequence[Any]  # the request's FetchPartition entities


class AppendNotifier:
    """Wakes long-polling fetches when there is more for them to read, keeping Kafka's two kinds apart: a follower's
    fetch (from replica_fetcher.py) reads up to the log end, so an append wakes it; a consumer's reads up to the high
    watermark, so only a high watermark that moved wakes it (on a single broker every append moves it). Waking a
    fetch that has nothing new to read only costs a read and a request round trip: in a cluster every acks=all batch
    would otherwise wake each consumer once for the append and once for the replication, and each follower once more
    for a high watermark it learns with its next fetch anyway."""

    def __init__(self) -> None:
        self._followers: dict[PartitionKey, set[asyncio.Future[None]]] = defaultdict(set)
        self._consumers: dict[PartitionKey, set[asyncio.Future[None]]] = defaultdict(set)

    def notify(self, key: PartitionKey) -> None:
        """New records that are visible at once: followers and consumers."""
        self.notify_followers(key)
        self.notify_consumers(key)

    def notify_followers(self, key: PartitionKey) -> None:
        """The log end moved (the leader appended, the high watermark not yet)."""
        _wake(self._followers.pop(key, ()))

    def notify_consumers(self, key: PartitionKey) -> None:
        """The high watermark moved."""
        _wake(self._consumers.pop(key, ()))

    def notify_all(self) -> None:
        for waiters in (self._followers, self._consumers):
            for key in list(waiters):
                _wake(waiters.pop(key, ()))

    async def wait(self, keys: Iterable[PartitionKey], timeout: float, follower: bool = False) -> None:
        waiters = self._followers if follower else self._consumers
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for key in keys:
            waiters[key].add(waiter)
        try:
            async with asyncio.timeout(timeout):  # woken by the future itself (wait_for adds two loop passes)
                await waiter
        except TimeoutError:
            pass
        finally:
            for key in keys:
                waiting = waiters.get(key)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del waiters[key]


def _wake(waiters: Iterable[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


class FetchApis:
    """Fetch and ListOffsets: reads of the engine's data calls, long polls woken by `notifier`."""

    def __init__(
        self,
        engine: StorageEngine,
        authorizer: Authorizer,
        metrics: Metrics,
        is_stopping: Callable[[], bool],
        check_leader: LeaderCheck | None = None,
        record_follower_fetch: FollowerFetchRecorder | None = None,
        log_defaults: LogConfig = DEFAULT_LOG_CONFIG,
        quotas: ClientQuotaManager | None = None,
        cluster: ClusterTopics | None = None,
        sessions: FetchSessionCache | None = None,
        read_replicas: ReadReplicas | None = None,
    ) -> None:
        self.engine = engine
        # incremental fetch sessions (KIP-227); without a cache every session request gets none
        self.sessions = sessions if sessions is not None else FetchSessionCache(0)
        self.cluster = cluster  # a cluster's: its topic ids, leaders and brokers' endpoints
        self.quotas = quotas  # consumer_byte_rate: a throttled fetch answers no data, its connection muted
        self.log_defaults = log_defaults  # the broker's topic defaults (message.downconversion.enable)
        self.check_leader = check_leader  # a cluster's: only the leader serves a partition
        self.record_follower_fetch = record_follower_fetch  # a cluster's: followers' progress to the replica manager
        self.read_replicas = read_replicas  # KIP-392 reads from RocketMQ slaves (read_replicas.py)
        self.authorizer = authorizer
        self.metrics = metrics
        self.is_stopping = is_stopping
        self.notifier = AppendNotifier()

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.FETCH: ApiHandler(0, 17, self.handle_fetch),
            ApiKey.LIST_OFFSETS: ApiHandler(0, 9, self.handle_list_offsets),
            ApiKey.OFFSET_FOR_LEADER_EPOCH: ApiHandler(0, 4, self.handle_offset_for_leader_epoch),
        }

    def wake_all(self) -> None:
        self.notifier.notify_all()

    # --- Fetch ------------------------------------------------------------------------------------------------

    async def handle_fetch(self, request: Request, connection: Connection) -> Response:
        body = request.body
        loop = asyncio.get_running_loop()
        deadline = loop.time() + millis(body.max_wait) / 1000
        min_bytes = body.min_bytes
        max_bytes = getattr(body, "max_bytes", INT_MAX)
        authorize = self.authorizer.authorize
        asked = self._resolve_topics(body.topics, request.api_version)
        if request.api_version >= REPLICA_STATE_FROM:
            replica_id = body.replica_state.replica_id
        else:
            replica_id = getattr(body, "replica_id", -1)
        if replica_id >= 0 and self.record_follower_fetch is None:
            replica_id = -1  # a single broker has no followers: read as any consumer does
        session: FetchSession | None = None
        open_session = False
        if request.api_version >= SESSIONS_FROM:
            try:
                session, open_session = self._session_of(body, request.api_version, asked)
            except FetchSessionError as exc:
                log.debug("fetch from %s: %s", connection.peer, exc)
                header = response_header(ApiKey.FETCH, request.api_version, request.correlation_id)
                return RawResponse(*encode_fetch_response(request.api_version, header, [], error_code=exc.error_code))
            if session is not None:  # the fetch reads every partition of the session
                asked = [t for t in asked if t.name is None] + _session_topics(session)
        denied = {
            t.name
            for t in asked
            if t.name is not None and not authorize(connection, Operation.READ, ResourceType.TOPIC, t.name)
        }
        keys = [
            (t.name, p.partition) for t in asked if t.name is not None and t.name not in denied for p in t.partitions
        ]
        quotas = self.quotas if replica_id < 0 else None
        if quotas is not None:  # never more than the quota's windows allow at once
            max_bytes = min(max_bytes, quotas.max_fetch_bytes(connection.principal, request.client_id) or max_bytes)
        read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED and replica_id < 0
        while True:
            topics, total, failed = self._read(
                asked, max_bytes, denied, replica_id, read_committed, getattr(body, "rack_id", "") or ""
            )
            remaining = deadline - loop.time()
            if total >= min_bytes or failed or not keys or remaining <= 0 or self.is_stopping():
                break  # (nothing to wait for without partitions: answered at once, as Kafka does)
            await self.notifier.wait(keys, remaining, follower=replica_id >= 0)
        throttle_ms = 0
        if quotas is not None:
            throttle_ms = quotas.record(QuotaKind.FETCH, connection.principal, request.client_id, total)
            if throttle_ms:  # answered without data (taken back out of the rate), fetched again later
                quotas.unrecord(QuotaKind.FETCH, connection.principal, request.client_id, total)
                connection.throttle(throttle_ms)
                topics = []
        session_id = INVALID_SESSION_ID
        if session is not None:
            session_id = session.id
            if not throttle_ms:
                topics = _changed_only(session, topics)
        elif open_session and not throttle_ms:
            session_id = self.sessions.create(replica_id >= 0, _cached_partitions(asked, topics), _now_ms())
        for topic in topics:
            sent = sum(p.records_size for p in topic.partitions)
            if sent:
                self.metrics.of_topic(topic.name)[2].inc(sent)
        if request.api_version <= LAST_LEGACY_FETCH_VERSION:
            self._down_convert(topics, magic=0 if request.api_version <= 1 else 1)
        node_endpoints: list[NodeEndpoint] = []
        if request.api_version >= NODE_ENDPOINTS_FROM:
            node_endpoints = self._current_leaders(topics, connection)
        header = response_header(ApiKey.FETCH, request.api_version, request.correlation_id)
        parts, size = encode_fetch_response(
            request.api_version,
            header,
            topics,
            session_id=session_id,
            throttle_time_ms=throttle_ms,
            node_endpoints=node_endpoints,
        )
        return RawResponse(parts, size)

    def _session_of(self, body: Any, version: int, asked: list[FetchTopic]) -> tuple[FetchSession | None, bool]:
        """(the incremental session the request continues, whether a full request opens one); sessions named by a
        full request are closed (see fetch_sessions.py)."""
        session_id, epoch = body.session_id, body.session_epoch
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.sessions.remove(session_id)
            return None, epoch == INITIAL_EPOCH
        session = self.sessions.incremental(session_id, epoch, _now_ms())
        forgotten = self._resolve_topics(body.forgotten_topics_data, version)  # same shape as the topics
        session.update(
            (
                ((t.name, p.partition), _cached(t.topic_id, p))
                for t in asked
                if t.name is not None
                for p in t.partitions
            ),
            ((t.name, p) for t in forgotten if t.name is not None for p in t.partitions),
        )
        if not session.partitions:  # the last partition forgotten: the session ends
            self.sessions.remove(session.id)
            return None, False
        return session, False

    def _resolve_topics(self, topics: Sequence[Any], version: int) -> list[FetchTopic]:
        """The request's topics by name; v13+ name them by id, resolved as Kafka's metadata cache resolves them."""
        if version < TOPIC_IDS_FROM:
            return [FetchTopic(t.topic, None, t.partitions) for t in topics]
        if self.cluster is not None:
            view = self.cluster.cache.view
            names = {t.topic_id: name for name, t in view.topics.items() if t.topic_id is not None}
        else:
            names = {d.topic_id: name for name, d in self.engine.topics().items()}
        return [FetchTopic(names.get(uuid_to_kafka(t.topic_id)), t.topic_id, t.partitions) for t in topics]

    def _current_leaders(self, topics: list[TopicData], connection: Connection) -> list[NodeEndpoint]:
        """KIP-951: each partition refused because this broker does not lead it (or at that epoch) gets the leader
        and leader epoch the cluster's metadata names; returned are those leaders' endpoints on the client's
        listener (a leader that is not alive gets none, as Kafka answers)."""
        cluster = self.cluster
        if cluster is None:  # a single broker leads everything it has: never refused so
            return []
        view = cluster.cache.view
        live = cluster.membership.live_brokers
        endpoints: dict[int, NodeEndpoint] = {}
        for topic in topics:
            for data in topic.partitions:
                if data.error_code not in LEADER_HINT_ERRORS:
                    continue
                partition = view.partition(topic.name, data.partition_index)
                leader = partition.leader if partition is not None else -1
                data.current_leader = (leader, partition.leader_epoch if partition is not None else -1)
                if leader == cluster.config.node_id:
                    endpoints[leader] = NodeEndpoint(
                        leader, connection.advertised_host, connection.advertised_port, cluster.config.broker_rack
                    )
                elif leader in live and (endpoint := live[leader].endpoint(connection.listener.name)) is not None:
                    endpoints[leader] = NodeEndpoint(leader, endpoint.host, endpoint.port, live[leader].rack)
        return [endpoints[node_id] for node_id in sorted(endpoints)]

    def _down_convert(self, topics: list[TopicData], magic: int) -> None:
        """Fetch v0-v3: each partition's batches as a magic 0 (v0-v1) or 1 (v2-v3) message set, unless its topic says
        `message.downconversion.enable=false` (UNSUPPORTED_VERSION, as Kafka answers)."""
        described = self.engine.topics()
        for topic in topics:
            overrides = described[topic.name].configs if topic.name in described else {}
            enabled = self.log_defaults.with_overrides(overrides).message_downconversion_enable
            for data in topic.partitions:
                if not enabled and data.error_code == ErrorCode.NONE:
                    data.error_code = ErrorCode.UNSUPPORTED_VERSION
                if not enabled or not data.slices:
                    data.slices = ()
                    continue
                data.records = downconvert(b"".join(part.read() for part in data.slices), magic)
                data.slices = ()

    def _read(
        self,
        asked: list[FetchTopic],
        max_bytes: int,
        denied: set[str],
        replica_id: int,
        read_committed: bool,
        client_rack: str = "",
    ) -> tuple[list[TopicData], int, bool]:
        engine = self.engine
        remaining = max_bytes
        total = 0
        failed = False
        topics = []
        for fetch_topic in asked:
            name = fetch_topic.name
            topic = TopicData(name or "", topic_id=fetch_topic.topic_id)
            for fetch_partition in fetch_topic.partitions:
                data = PartitionData(fetch_partition.partition)
                topic.partitions.append(data)
                if name is None:  # answered with the others, after the wait, as Kafka does (so is the next)
                    data.error_code = ErrorCode.UNKNOWN_TOPIC_ID
                    continue
                if name in denied:
                    data.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                try:
                    if self.check_leader is not None:
                        self._check_reader(
                            name,
                            fetch_partition.partition,
                            getattr(fetch_partition, "current_leader_epoch", -1),
                            replica_id,
                        )
                    partition_log = engine.partition(name, fetch_partition.partition)
                    if replica_id < 0 and client_rack and self.read_replicas is not None:
                        preferred = self.read_replicas.preferred_read_replica(
                            name, fetch_partition.partition, client_rack
                        )
                        if preferred >= 0:  # no records: the consumer reads from there (as Kafka's leader answers)
                            data.preferred_read_replica = preferred
                            data.high_watermark = partition_log.high_watermark
                            data.last_stable_offset = partition_log.last_stable_offset
                            data.log_start_offset = partition_log.log_start_offset
                            continue
                    if replica_id >= 0:
                        assert self.record_follower_fetch is not None
                        self.record_follower_fetch(
                            name, fetch_partition.partition, replica_id, fetch_partition.fetch_offset
                        )
                    data.high_watermark = partition_log.high_watermark
                    data.last_stable_offset = partition_log.last_stable_offset
                    data.log_start_offset = partition_log.log_start_offset
                    if read_committed:
                        data.aborted_transactions = []
                    limit = min(fetch_partition.partition_max_bytes, remaining)
                    if limit <= 0 and total > 0:
                        continue
                    slices = partition_log.read(
                        fetch_partition.fetch_offset,
                        max(limit, 0),
                        min_one_message=total == 0,
                        up_to_log_end=replica_id >= 0,
                        max_offset=data.last_stable_offset if read_committed else None,
                    )
                    if read_committed and slices.slices:
                        data.aborted_transactions = partition_log.aborted_transactions(
                            fetch_partition.fetch_offset, data.last_stable_offset
                        )
                except TidelogError as exc:
                    data.error_code = exc.kafka_error_code
                    failed = True
                    continue
                data.slices = slices.slices
                size = data.records_size
                total += size
                remaining -= size
            topics.append(topic)
        return topics, total, failed

    def _check_reader(self, topic: str, partition: int, leader_epoch: int, replica_id: int) -> None:
        """check_leader, except that a consumer may read a partition this broker serves as a read replica."""
        assert self.check_leader is not None
        try:
            self.check_leader(topic, partition, leader_epoch)
        except NotLeaderOrFollowerError:
            if (
                replica_id >= 0
                or self.read_replicas is None
                or not self.read_replicas.serves_consumers(topic, partition)
            ):
                raise

    # --- ListOffsets ------------------------------------------------------------------------------------------

    async def handle_list_offsets(self, request: Request, connection: Connection) -> Response:
        engine = self.engine
        from_follower = getattr(request.body, "replica_id", -1) >= 0 and self.record_follower_fetch is not None
        read_committed = getattr(request.body, "isolation_level", 0) == READ_COMMITTED
        topics = []
        for list_topic in request.body.topics:
            authorized = self.authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.TOPIC, list_topic.name)
            partitions = []
            for list_partition in list_topic.partitions:
                answer: dict[str, Any] = {
                    "partition_index": list_partition.partition_index,
                    "error_code": 0,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                }
                partitions.append(answer)
                if not authorized:
                    answer["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                target = list_partition.timestamp
                if target == EARLIEST_LOCAL_TIMESTAMP:  # no tiered storage: the local log starts at the log start
                    target = EARLIEST_TIMESTAMP
                try:
                    if self.check_leader is not None:
                        self.check_leader(
                            list_topic.name,
                            list_partition.partition_index,
                            getattr(list_partition, "current_leader_epoch", -1),
                        )
                    found: TimestampAndOffset | None
                    if target == LATEST_TIERED_TIMESTAMP:  # nothing is tiered: -1s, once the partition is known
                        engine.partition(list_topic.name, list_partition.partition_index)
                        found = None
                    elif from_follower and target == LATEST_TIMESTAMP:  # a follower's question: the log end
                        handle = engine.partition(list_topic.name, list_partition.partition_index)
                        found = TimestampAndOffset(-1, handle.log_end_offset, handle.latest_epoch)
                    else:
                        found = engine.offset_for_timestamp(list_topic.name, list_partition.partition_index, target)
                        if read_committed and target != EARLIEST_TIMESTAMP and found is not None:
                            stable = engine.partition(list_topic.name, list_partition.partition_index)
                            found = self._below_stable(found, target, stable.last_stable_offset)
                    if found is not None:  # no record at or after the timestamp: offset -1, as Kafka answers
                        answer.update(
                            timestamp=found.timestamp,
                            offset=found.offset,
                            leader_epoch=found.leader_epoch if found.leader_epoch is not None else -1,
                        )
                    if request.api_version == 0:  # a list of at most max_num_offsets offsets, newest first
                        found_offsets = [found.offset] if found is not None else []
                        answer["old_style_offsets"] = found_offsets[: max(list_partition.max_num_offsets, 0)]
                except TidelogError as exc:
                    answer["error_code"] = exc.kafka_error_code
            topics.append({"name": list_topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    @staticmethod
    def _below_stable(found: TimestampAndOffset, target: int, last_stable_offset: int) -> TimestampAndOffset | None:
        """A read_committed ListOffsets answer (Kafka's Partition.fetchOffsetForTimestamp): latest is the last stable
        offset, a record found by timestamp counts only below it."""
        if target == LATEST_TIMESTAMP:
            return found._replace(offset=last_stable_offset)
        return found if found.offset < last_stable_offset else None

    # --- OffsetForLeaderEpoch ---------------------------------------------------------------------------------

    async def handle_offset_for_leader_epoch(self, request: Request, connection: Connection) -> Response:
        """Where each asked leader epoch ends in this leader's log: (the epoch, its end offset), or (-1, -1) when the
        log knows no epoch at or below it (Kafka's OffsetsForLeaderEpoch)."""
        topics = []
        for request_topic in request.body.topics:
            authorized = self.authorizer.authorize(
                connection, Operation.DESCRIBE, ResourceType.TOPIC, request_topic.topic
            ) or self.authorizer.authorize(connection, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, log_denied=False)
            partitions = []
            for request_partition in request_topic.partitions:
                answer: dict[str, Any] = {
                    "partition": request_partition.partition,
                    "error_code": 0,
                    "leader_epoch": -1,
                    "end_offset": -1,
                }
                partitions.append(answer)
                if not authorized:
                    answer["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                try:
                    if self.check_leader is not None:
                        self.check_leader(
                            request_topic.topic,
                            request_partition.partition,
                            getattr(request_partition, "current_leader_epoch", -1),
                        )
                    handle = self.engine.partition(request_topic.topic, request_partition.partition)
                    epoch, end_offset = handle.end_offset_for_epoch(request_partition.leader_epoch)
                    answer.update(leader_epoch=epoch, end_offset=end_offset)
                except TidelogError as exc:
                    answer["error_code"] = exc.kafka_error_code
            topics.append({"topic": request_topic.topic, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}


class _SessionPartition(NamedTuple):
    """A partition of a session as the read loop takes it (the attributes of a request's FetchPartition)."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _cached(topic_id: uuid.UUID | None, asked: Any) -> CachedPartition:
    return CachedPartition(
        topic_id,
        asked.fetch_offset,
        asked.partition_max_bytes,
        getattr(asked, "current_leader_epoch", -1),
        getattr(asked, "log_start_offset", -1),
    )


def _session_topics(session: FetchSession) -> list[FetchTopic]:
    by_topic: dict[str, FetchTopic] = {}
    for (name, partition), cached in session.partitions.items():
        topic = by_topic.get(name)
        if topic is None:
            topic = by_topic[name] = FetchTopic(name, cached.topic_id, [])
        assert isinstance(topic.partitions, list)
        topic.partitions.append(
            _SessionPartition(partition, cached.fetch_offset, cached.partition_max_bytes, cached.current_leader_epoch)
        )
    return list(by_topic.values())


def _cached_partitions(asked: list[FetchTopic], topics: list[TopicData]) -> dict[PartitionKey, CachedPartition]:
    """A new session's partitions: each of a full request's, with what its response says."""
    answered = {(t.name, p.partition_index): p for t in topics for p in t.partitions}
    cached = {}
    for topic in asked:
        if topic.name is None:
            continue
        for asked_partition in topic.partitions:
            key = (topic.name, asked_partition.partition)
            entry = _cached(topic.topic_id, asked_partition)
            data = answered.get(key)
            if data is not None and data.error_code == ErrorCode.NONE:
                entry.high_watermark = data.high_watermark
                entry.last_stable_offset = data.last_stable_offset
                entry.log_start_offset = data.log_start_offset
            cached[key] = entry
    return cached


def _changed_only(session: FetchSession, topics: list[TopicData]) -> list[TopicData]:
    """An incremental response: the partitions with records, an error, or a changed offset (KIP-227)."""
    kept = []
    for topic in topics:
        partitions = []
        for data in topic.partitions:
            cached = session.partitions.get((topic.name, data.partition_index))
            if cached is None or cached.must_answer(
                data.records_size > 0,
                data.error_code,
                data.high_watermark,
                data.last_stable_offset,
                data.log_start_offset,
            ):
                partitions.append(data)
        if partitions:
            topic.partitions = partitions
            kept.append(topic)
    return kept
