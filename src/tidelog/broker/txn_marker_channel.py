"""Transaction markers sent to the other brokers of a cluster (Kafka's TransactionMarkerChannelManager): the
transaction coordinator ends a transaction by having the current leader of each of its partitions append a COMMIT
or ABORT marker; for partitions led elsewhere that is a WriteTxnMarkers request (v1) over the inter-broker listener.

- `send(producer_id, epoch, coordinator_epoch, commit, partitions)` resolves each partition's leader in the
  metadata cache's current view and answers one error code per partition. A partition this broker leads (the view
  changed since the coordinator looked) is written here, through `TxnMarkerApis.write_marker`. A partition the
  cluster no longer has answers UNKNOWN_TOPIC_OR_PARTITION (the coordinator drops the partitions of deleted topics
  before sending, as Kafka's channel does, and sends the others again); one without a leader, or whose leader has
  no endpoint of the inter-broker listener, NOT_LEADER_OR_FOLLOWER.
- One queue and one connection per destination broker (`protocol/client.py`, one request in flight): the markers
  queued while a request is out go together in the next one, one entry per transaction, as Kafka drains its queue
  per node. Entries of the answer are matched to the request's by position.
- A connection that breaks, or an answer that does not come within `REQUEST_TIMEOUT_S` (the leader waits up to 30 s
  for its in-sync replicas), answers REQUEST_TIMED_OUT for each of its partitions.

Every code is the coordinator's to act on: it sends the retriable ones (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT,
NOT_ENOUGH_REPLICAS...) again after a pause, reading the leaders again, until each marker is written. Everything
runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tidelog.broker.broker_channels import BrokerChannels
from tidelog.broker.txn_markers import MARKER_TIMEOUT_S, TxnMarkerApis
from tidelog.errors import ErrorCode
from tidelog.protocol.client import BrokerConnection, BrokerConnectionError
from tidelog.protocol.messages import ApiKey

if TYPE_CHECKING:
    from tidelog.broker import zk_layout as zk
    from tidelog.broker.cluster_metadata import MetadataCache

log = logging.getLogger("tidelog.cluster")

TopicPartition = tuple[str, int]
WRITE_TXN_MARKERS_VERSION = 1
REQUEST_TIMEOUT_S = MARKER_TIMEOUT_S + 5.0

# a transaction's marker entry of the request, its partitions, and who waits for their codes
_Queued = tuple[dict[str, Any], list[TopicPartition], "asyncio.Future[dict[TopicPartition, ErrorCode]]"]


class TxnMarkerChannel:
    def __init__(
        self,
        broker_id: int,
        cache: MetadataCache,
        live_brokers: Callable[[], Mapping[int, zk.BrokerRegistration]],
        listener_name: str,
        local: TxnMarkerApis,
    ) -> None:
        self.broker_id = broker_id
        self.cache = cache
        self.local = local
        self._destinations = BrokerChannels(
            live_brokers, listener_name, f"tidelog-txn-markers-{broker_id}", _Destination
        )

    async def send(
        self, producer_id: int, epoch: int, coordinator_epoch: int, commit: bool, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """One transaction's markers to the current leaders of `partitions`: the error code of each."""
        codes: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        view = self.cache.view
        for tp in partitions:
            partition = view.partition(*tp)
            if partition is None:
                codes[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif partition.leader < 0:
                codes[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                by_leader.setdefault(partition.leader, []).append(tp)
        waits: list[asyncio.Future[dict[TopicPartition, ErrorCode]]] = []
        for leader, led in by_leader.items():
            if leader == self.broker_id:
                waits.append(
                    asyncio.ensure_future(self._write_here(producer_id, epoch, coordinator_epoch, commit, led))
                )
                continue
            destination = self._destinations.get(leader)
            if destination is None:  # no endpoint of the inter-broker listener registered: the markers wait
                codes.update(dict.fromkeys(led, ErrorCode.NOT_LEADER_OR_FOLLOWER))
                continue
            marker = TxnMarkerApis.marker_request(producer_id, epoch, coordinator_epoch, commit, led)
            waits.append(destination.enqueue(marker["markers"][0], led))
        for answer in await asyncio.gather(*waits):
            codes.update(answer)
        return codes

    async def _write_here(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        partitions: list[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        written = await asyncio.gather(
            *(self.local.write_marker(producer_id, producer_epoch, coordinator_epoch, commit, *tp) for tp in partitions)
        )
        return dict(zip(partitions, written, strict=True))

    async def close(self) -> None:
        await self._destinations.close()


class _Destination:
    """One broker's queue of markers and the task that sends them, a request at a time."""

    def __init__(self, connection: BrokerConnection) -> None:
        self.connection = connection
        self.host, self.port = connection.host, connection.port
        self._queue: list[_Queued] = []
        self._task: asyncio.Task[None] | None = None

    def enqueue(
        self, marker: dict[str, Any], partitions: list[TopicPartition]
    ) -> asyncio.Future[dict[TopicPartition, ErrorCode]]:
        future: asyncio.Future[dict[TopicPartition, ErrorCode]] = asyncio.get_running_loop().create_future()
        self._queue.append((marker, partitions, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name=f"tidelog-txn-markers-{self.host}:{self.port}")
        return future

    async def _drain(self) -> None:
        batch: list[_Queued] = []
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    response = await self.connection.request(
                        ApiKey.WRITE_TXN_MARKERS,
                        WRITE_TXN_MARKERS_VERSION,
                        {"markers": [marker for marker, _, _ in batch]},
                        REQUEST_TIMEOUT_S,
                    )
                    answers: list[Any] = list(response.markers)
                except BrokerConnectionError as exc:
                    log.info("transaction markers to %s: %s (sent again)", self.connection.address, exc)
                    answers = []
                for index, (marker, partitions, future) in enumerate(batch):
                    codes = dict.fromkeys(partitions, ErrorCode.REQUEST_TIMED_OUT)
                    if index < len(answers) and answers[index].producer_id == marker["producer_id"]:
                        for topic in answers[index].topics:
                            for partition in topic.partitions:
                                if (topic.name, partition.partition_index) in codes:
                                    codes[(topic.name, partition.partition_index)] = ErrorCode(partition.error_code)
                    if not future.done():
                        future.set_result(codes)
        finally:  # cancelled (retired) with a request out: its markers are sent again by the coordinator
            _time_out(batch)

    def retire(self) -> None:
        """Stop sending: the queued markers answer REQUEST_TIMED_OUT (the coordinator sends them again)."""
        if self._task is not None:
            self._task.cancel()
        _time_out(self._queue)
        self._queue = []

    async def closed(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.connection.close()


def _time_out(queued: list[_Queued]) -> None:
    for _, partitions, future in queued:
        if not future.done():
            future.set_result(dict.fromkeys(partitions, ErrorCode.REQUEST_TIMED_OUT))
