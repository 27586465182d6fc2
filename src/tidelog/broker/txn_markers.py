"""Transaction markers on the data side: WriteTxnMarkers (API 27), which a transaction coordinator sends to the
leader of each partition of a transaction it ends.

For each partition named, the leader appends one control batch (`Partition.append_marker`: COMMIT or ABORT, the
producer id and epoch, the coordinator epoch) and answers per partition; a request's markers are appended in its
order, then waited for together. A marker of a `__consumer_offsets` partition also ends the producer's pending
transactional offset commits there: the group coordinator makes them visible (commit) or drops them (abort), through
`on_offsets_marker`; every marker also ends the producer's verifications of the partition (`on_marker`,
txn_verification.py). Markers are written as Kafka writes them, acks=-1: the
answer waits for the group commit when the flush policy asks, and in a cluster for the in-sync replicas.

Only brokers send it: CLUSTER_ACTION on the cluster is required (else CLUSTER_AUTHORIZATION_FAILED per partition).
A partition this broker does not lead answers NOT_LEADER_OR_FOLLOWER, an unknown one UNKNOWN_TOPIC_OR_PARTITION; a
marker whose epoch is older than the producer's answers INVALID_PRODUCER_EPOCH (the storage engine's check), and a
coordinator epoch older than the partition last saw TRANSACTION_COORDINATOR_FENCED. The coordinator of this broker
writes its own partitions' markers through `write_marker` directly, not over the network; txn_marker_channel.py
sends the others'.

Version 1 only (flexible), what Kafka 3.x brokers send; v0 is not offered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, LeaderCheck, Response
from tidelog.broker.offset_store import OFFSETS_TOPIC
from tidelog.errors import ErrorCode, TidelogError
from tidelog.protocol.messages import ApiKey, Request
from tidelog.storage.api import StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.fetch import AppendNotifier
    from tidelog.broker.produce import Flusher
    from tidelog.broker.replica_manager import ReplicaManager

log = logging.getLogger("tidelog.broker")

MARKER_TIMEOUT_S = 30.0  # Kafka's request.timeout.ms for the marker requests it sends

# (producer id, partition of __consumer_offsets, committed) -> None
OffsetsMarkerListener = Callable[[int, int, bool], None]
# (topic, partition, producer id) -> None, as soon as a marker is appended
MarkerListener = Callable[[str, int, int], None]


class TxnMarkerApis:
    def __init__(
        self,
        engine: StorageEngine,
        authorizer: Authorizer,
        flusher: Flusher,
        notifier: AppendNotifier,
        check_leader: LeaderCheck | None = None,
        replication: ReplicaManager | None = None,
    ) -> None:
        self.engine = engine
        self.authorizer = authorizer
        self.flusher = flusher
        self.notifier = notifier
        self.check_leader = check_leader
        self.replication = replication
        self.on_offsets_marker: OffsetsMarkerListener | None = None  # the group coordinator's, set by the broker
        self.on_marker: MarkerListener | None = None  # txn_verification.py's: the partition's verifications end

    def handlers(self) -> HandlerTable:
        return {ApiKey.WRITE_TXN_MARKERS: ApiHandler(1, 1, self.handle_write_txn_markers)}

    async def handle_write_txn_markers(self, request: Request, connection: Connection) -> Response:
        allowed = self.authorizer.authorize(connection, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
        writes = [
            self.write_marker(
                marker.producer_id,
                marker.producer_epoch,
                marker.coordinator_epoch,
                marker.transaction_result,
                topic.name,
                partition,
            )
            if allowed
            else _refused()
            for marker in request.body.markers
            for topic in marker.topics
            for partition in topic.partition_indexes
        ]
        codes = iter(await asyncio.gather(*writes))  # appended in order, replicated together
        return {
            "markers": [
                {
                    "producer_id": marker.producer_id,
                    "topics": [
                        {
                            "name": topic.name,
                            "partitions": [
                                {"partition_index": partition, "error_code": next(codes)}
                                for partition in topic.partition_indexes
                            ],
                        }
                        for topic in marker.topics
                    ],
                }
                for marker in request.body.markers
            ]
        }

    async def write_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool, topic: str, partition: int
    ) -> ErrorCode:
        """Append one marker and wait until it is durable (and replicated in a cluster); the error code."""
        try:
            if self.check_leader is not None:
                self.check_leader(topic, partition, -1)
            partition_log = self.engine.partition(topic, partition)
            result = partition_log.append_marker(producer_id, producer_epoch, coordinator_epoch, commit)
            if self.on_marker is not None:
                self.on_marker(topic, partition, producer_id)
            end = result.last_offset + 1
            if self.replication is not None:
                self.replication.after_leader_append(topic, partition)
            if partition_log.flush_due():
                await self.flusher.wait_durable(partition_log, end)
            if self.replication is not None:
                await self.replication.wait_replicated(topic, partition, end, MARKER_TIMEOUT_S)
        except TidelogError as exc:
            log.debug("marker for producer %d on %s-%d: %s", producer_id, topic, partition, exc)
            return ErrorCode(exc.kafka_error_code)
        self.notifier.notify((topic, partition))  # read_committed fetches wait for the stable offset to move
        if topic == OFFSETS_TOPIC and self.on_offsets_marker is not None:
            self.on_offsets_marker(producer_id, partition, commit)
        return ErrorCode.NONE

    @staticmethod
    def marker_request(
        producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool, partitions: list[tuple[str, int]]
    ) -> dict[str, Any]:
        """The body of a WriteTxnMarkers request for one transaction's partitions on one broker."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        return {
            "markers": [
                {
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    "transaction_result": commit,
                    "coordinator_epoch": coordinator_epoch,
                    "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()],
                }
            ]
        }


async def _refused() -> ErrorCode:
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
