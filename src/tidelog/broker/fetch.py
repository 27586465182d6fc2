"""Fetch (with long polling) and ListOffsets.

A Fetch reads file slices from each requested partition (at most `partition_max_bytes` each and
`max_bytes` in all, but always one whole batch for the first partition that has data, KIP-74). If
fewer than `min_bytes` are available it waits up to `max_wait_ms` for an append to one of its
partitions - woken by the producer path, never by polling - then reads again. Record bytes go out
with sendfile straight from the segment files.

ListOffsets answers Kafka's special targets: -2 earliest (log start), -1 latest (the high watermark: the log end on
a single broker; a follower asking its leader gets the log end), -3 the record with the largest timestamp, and -4
(EARLIEST_LOCAL_TIMESTAMP, v8+) which, with no tiered storage, is the log start too.

In a cluster a Fetch with `replica_id` set comes from a follower (replica_fetcher.py): it reads up to the log end,
not the high watermark, and its fetch offset is the follower's log end, which the replica manager records
(`record_follower_fetch`) before the answer gives the follower the leader's high watermark. OffsetForLeaderEpoch
answers (v2-v4) where a leader epoch ends in this leader's log (`Partition.end_offset_for_epoch`), what a follower
truncates to (KIP-101/279) and what a consumer checks after a leader change (KIP-320).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, LeaderCheck, RawResponse, Response
from tidelog.broker.quotas import QuotaKind
from tidelog.errors import ErrorCode, TidelogError
from tidelog.protocol.fetch_response import PartitionData, TopicData, encode_fetch_response
from tidelog.protocol.messages import ApiKey, Request, millis, response_header
from tidelog.storage.api import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, StorageEngine, TimestampAndOffset

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.metrics import Metrics
    from tidelog.broker.quotas import ClientQuotaManager

INT_MAX = (1 << 31) - 1
EARLIEST_LOCAL_TIMESTAMP = -4  # ListOffsets v8+ (KIP-405): the first offset kept on local disk
PartitionKey = tuple[str, int]
# (topic, partition, follower broker id, its fetch offset) -> None; raises NotLeaderOrFollowerError (replica_manager.py)
FollowerFetchRecorder = Callable[[str, int, int, int], None]


class AppendNotifier:
    """Wakes long-polling fetches when one of their partitions receives data."""

    def __init__(self) -> None:
        self._waiters: dict[PartitionKey, set[asyncio.Future[None]]] = defaultdict(set)

    def notify(self, key: PartitionKey) -> None:
        for waiter in self._waiters.pop(key, ()):
            if not waiter.done():
                waiter.set_result(None)

    def notify_all(self) -> None:
        for key in list(self._waiters):
            self.notify(key)

    async def wait(self, keys: Iterable[PartitionKey], timeout: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for key in keys:
            self._waiters[key].add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            for key in keys:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del self._waiters[key]


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
        quotas: ClientQuotaManager | None = None,
    ) -> None:
        self.engine = engine
        self.quotas = quotas  # consumer_byte_rate: a throttled fetch answers no data, its connection muted
        self.check_leader = check_leader  # a cluster's: only the leader serves a partition
        self.record_follower_fetch = record_follower_fetch  # a cluster's: followers' progress to the replica manager
        self.authorizer = authorizer
        self.metrics = metrics
        self.is_stopping = is_stopping
        self.notifier = AppendNotifier()

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.FETCH: ApiHandler(4, 12, self.handle_fetch),
            ApiKey.LIST_OFFSETS: ApiHandler(1, 8, self.handle_list_offsets),
            ApiKey.OFFSET_FOR_LEADER_EPOCH: ApiHandler(2, 4, self.handle_offset_for_leader_epoch),  # kio has v2+
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
        denied = {
            t.topic for t in body.topics if not authorize(connection, Operation.READ, ResourceType.TOPIC, t.topic)
        }
        keys = [(t.topic, p.partition) for t in body.topics for p in t.partitions if t.topic not in denied]
        replica_id = getattr(body, "replica_id", -1)
        if replica_id >= 0 and self.record_follower_fetch is None:
            replica_id = -1  # a single broker has no followers: read as any consumer does
        quotas = self.quotas if replica_id < 0 else None
        if quotas is not None:  # never more than the quota's windows allow at once
            max_bytes = min(max_bytes, quotas.max_fetch_bytes(connection.principal, request.client_id) or max_bytes)
        while True:
            topics, total, failed = self._read(body, max_bytes, denied, replica_id)
            remaining = deadline - loop.time()
            if total >= min_bytes or failed or not keys or remaining <= 0 or self.is_stopping():
                break  # (nothing to wait for without partitions: answered at once, as Kafka does)
            await self.notifier.wait(keys, remaining)
        throttle_ms = 0
        if quotas is not None:
            throttle_ms = quotas.record(QuotaKind.FETCH, connection.principal, request.client_id, total)
            if throttle_ms:  # answered without data (taken back out of the rate), fetched again later
                quotas.unrecord(QuotaKind.FETCH, connection.principal, request.client_id, total)
                connection.throttle(throttle_ms)
                topics = []
        for topic in topics:
            sent = sum(p.records_size for p in topic.partitions)
            if sent:
                self.metrics.of_topic(topic.name)[2].inc(sent)
        header = response_header(ApiKey.FETCH, request.api_version, request.correlation_id)
        parts, size = encode_fetch_response(request.api_version, header, topics, throttle_time_ms=throttle_ms)
        return RawResponse(parts, size)

    def _read(self, body: Any, max_bytes: int, denied: set[str], replica_id: int) -> tuple[list[TopicData], int, bool]:
        engine = self.engine
        remaining = max_bytes
        total = 0
        failed = False
        topics = []
        for fetch_topic in body.topics:
            topic = TopicData(fetch_topic.topic)
            for fetch_partition in fetch_topic.partitions:
                data = PartitionData(fetch_partition.partition)
                topic.partitions.append(data)
                if fetch_topic.topic in denied:  # answered with the others, after the wait, as Kafka does
                    data.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                try:
                    if self.check_leader is not None:
                        self.check_leader(
                            fetch_topic.topic,
                            fetch_partition.partition,
                            getattr(fetch_partition, "current_leader_epoch", -1),
                        )
                    partition_log = engine.partition(fetch_topic.topic, fetch_partition.partition)
                    if replica_id >= 0:
                        assert self.record_follower_fetch is not None
                        self.record_follower_fetch(
                            fetch_topic.topic, fetch_partition.partition, replica_id, fetch_partition.fetch_offset
                        )
                    data.high_watermark = data.last_stable_offset = partition_log.high_watermark
                    data.log_start_offset = partition_log.log_start_offset
                    limit = min(fetch_partition.partition_max_bytes, remaining)
                    if limit <= 0 and total > 0:
                        continue
                    slices = partition_log.read(
                        fetch_partition.fetch_offset,
                        max(limit, 0),
                        min_one_message=total == 0,
                        up_to_log_end=replica_id >= 0,
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

    # --- ListOffsets ------------------------------------------------------------------------------------------

    async def handle_list_offsets(self, request: Request, connection: Connection) -> Response:
        engine = self.engine
        from_follower = getattr(request.body, "replica_id", -1) >= 0 and self.record_follower_fetch is not None
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
                    if from_follower and target == LATEST_TIMESTAMP:  # a follower's question: the log end
                        handle = engine.partition(list_topic.name, list_partition.partition_index)
                        found = TimestampAndOffset(-1, handle.log_end_offset, handle.latest_epoch)
                    else:
                        found = engine.offset_for_timestamp(list_topic.name, list_partition.partition_index, target)
                    if found is not None:  # no record at or after the timestamp: offset -1, as Kafka answers
                        answer.update(
                            timestamp=found.timestamp,
                            offset=found.offset,
                            leader_epoch=found.leader_epoch if found.leader_epoch is not None else -1,
                        )
                except TidelogError as exc:
                    answer["error_code"] = exc.kafka_error_code
            topics.append({"name": list_topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    # --- OffsetForLeaderEpoch ---------------------------------------------------------------------------------

    async def handle_offset_for_leader_epoch(self, request: Request, connection: Connection) -> Response:
        """Where each asked leader epoch ends in this leader's log: (the epoch, its end offset), or (-1, -1) when the
        log knows no epoch at or below it (Kafka's OffsetsForLeaderEpoch; v0-v1, which kio does not carry, are not
        served yet)."""
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
