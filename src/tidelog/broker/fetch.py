"""Fetch (with long polling) and ListOffsets.

A Fetch reads file slices from each requested partition (at most `partition_max_bytes` each and
`max_bytes` in all, but always one whole batch for the first partition that has data, KIP-74). If
fewer than `min_bytes` are available it waits up to `max_wait_ms` for an append to one of its
partitions - woken by the producer path, never by polling - then reads again. Record bytes go out
with sendfile straight from the segment files.

ListOffsets answers Kafka's special targets: -2 earliest (log start), -1 latest (log end), -3 the record with the
largest timestamp, and -4 (EARLIEST_LOCAL_TIMESTAMP, v8+) which, with no tiered storage, is the log start too.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, LeaderCheck, RawResponse, Response
from tidelog.errors import ErrorCode, TidelogError
from tidelog.protocol.fetch_response import PartitionData, TopicData, encode_fetch_response
from tidelog.protocol.messages import ApiKey, Request, millis, response_header
from tidelog.storage.api import EARLIEST_TIMESTAMP, StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.metrics import Metrics

INT_MAX = (1 << 31) - 1
EARLIEST_LOCAL_TIMESTAMP = -4  # ListOffsets v8+ (KIP-405): the first offset kept on local disk
PartitionKey = tuple[str, int]


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
    ) -> None:
        self.engine = engine
        self.check_leader = check_leader  # a cluster's: only the leader serves a partition
        self.authorizer = authorizer
        self.metrics = metrics
        self.is_stopping = is_stopping
        self.notifier = AppendNotifier()

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.FETCH: ApiHandler(4, 12, self.handle_fetch),
            ApiKey.LIST_OFFSETS: ApiHandler(1, 8, self.handle_list_offsets),
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
        while True:
            topics, total, failed = self._read(body, max_bytes, denied)
            remaining = deadline - loop.time()
            if total >= min_bytes or failed or not keys or remaining <= 0 or self.is_stopping():
                break  # (nothing to wait for without partitions: answered at once, as Kafka does)
            await self.notifier.wait(keys, remaining)
        for topic in topics:
            sent = sum(p.records_size for p in topic.partitions)
            if sent:
                self.metrics.of_topic(topic.name)[2].inc(sent)
        header = response_header(ApiKey.FETCH, request.api_version, request.correlation_id)
        parts, size = encode_fetch_response(request.api_version, header, topics)
        return RawResponse(parts, size)

    def _read(self, body: Any, max_bytes: int, denied: set[str]) -> tuple[list[TopicData], int, bool]:
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
                    data.high_watermark = data.last_stable_offset = partition_log.high_watermark
                    data.log_start_offset = partition_log.log_start_offset
                    limit = min(fetch_partition.partition_max_bytes, remaining)
                    if limit <= 0 and total > 0:
                        continue
                    slices = partition_log.read(fetch_partition.fetch_offset, max(limit, 0), min_one_message=total == 0)
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
