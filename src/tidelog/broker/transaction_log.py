"""The transaction coordinator's durable state: the internal topic `__transaction_state`.

One record per change of a transactional id's state, in Kafka's key and value formats
(codec/transaction_log_records.py); a transactional id lives in partition
`abs(javaHashCode(transactionalId)) % transaction.state.log.num.partitions`. Replaying a partition gives each
transactional id's latest state (last value per key wins, a tombstone forgets the id).

The topic is created as Kafka creates it: `cleanup.policy=compact`,
`segment.bytes=transaction.state.log.segment.bytes`, `retention.ms=-1`, and in a cluster
`min.insync.replicas=min(transaction.state.log.min.isr, replication factor)`. On a single broker it is created with
the first state written (as Kafka creates it at the first FindCoordinator for a transactional id: a broker that never
coordinates a transaction never makes its 50 partitions); in a cluster (cluster_transactions.py) at the first
FindCoordinator for a transactional id, and `partitions` is then the cluster topic's count. On the Kafka engine the
log cleaner compacts it; on an engine without a cleaner it only grows by the records of state changes (a few per
transaction) until retention by size is set.

A write is one batch appended like a produced one, in a cluster only while this broker leads the partition (else
NOT_COORDINATOR and nothing is appended); it waits for the group commit when the flush policy asks for
it, and in a cluster until the partition's in-sync replicas have it (Kafka writes with acks=-1), within 5 s
(`transaction.state.log...` has no timeout key in Kafka: its request.timeout.ms applies). A write that does not get
there fails with NOT_COORDINATOR (leadership moved) or COORDINATOR_NOT_AVAILABLE, and the change is not applied.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tidelog.broker.transaction_state import TransactionMetadata
from tidelog.codec import transaction_log_records as records
from tidelog.codec.group_records import partition_for_group
from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import (
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.api import StorageEngine, TopicDescription

if TYPE_CHECKING:
    from tidelog.broker.admin import AdminExecutor
    from tidelog.broker.config import TransactionConfig
    from tidelog.broker.handler import LeaderCheck
    from tidelog.broker.produce import Flusher
    from tidelog.broker.replica_manager import ReplicaManager

log = logging.getLogger("tidelog.broker")

TRANSACTION_STATE_TOPIC = "__transaction_state"
WRITE_TIMEOUT_S = 5.0


class TransactionLog:
    def __init__(
        self,
        engine: StorageEngine,
        config: TransactionConfig,
        flusher: Flusher,
        admin: AdminExecutor,
        replication: ReplicaManager | None = None,
        check_leader: LeaderCheck | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.flusher = flusher
        self.admin = admin  # where a single broker creates the topic, off the event loop
        self.replication = replication  # a cluster's: writes wait for the ISR
        self.check_leader = check_leader  # a cluster's: writes only while this broker leads the partition
        self.partitions = config.transaction_state_log_num_partitions
        self._creating: asyncio.Task[TopicDescription] | None = None  # a single broker's creation of the topic
        self._exists = False  # known to exist (an internal topic is never deleted)

    def topic_configs(self, replication_factor: int = 1) -> dict[str, str]:
        configs = {
            "cleanup.policy": "compact",
            "retention.ms": "-1",
            "segment.bytes": str(self.config.transaction_state_log_segment_bytes),
            "compression.type": "uncompressed",
            "unclean.leader.election.enable": "false",
        }
        if self.replication is not None:
            configs["min.insync.replicas"] = str(min(self.config.transaction_state_log_min_isr, replication_factor))
        return configs

    def open(self) -> bool:
        """A single broker's: does the topic exist (its partitions are then replayed one by one)?"""
        description = self.engine.topics().get(TRANSACTION_STATE_TOPIC)
        if description is None:
            return False
        self._exists = True
        if description.partitions != self.partitions:
            log.warning(
                "%s has %d partitions but transaction.state.log.num.partitions is %d; keeping %d",
                TRANSACTION_STATE_TOPIC,
                description.partitions,
                self.partitions,
                description.partitions,
            )
            self.partitions = description.partitions
        return True

    async def _ensure_topic(self) -> None:
        """A single broker's first write creates the topic (once, however many writes wait for it)."""
        if self._exists:
            return
        if TRANSACTION_STATE_TOPIC in self.engine.topics():
            self._exists = True
            return
        creating = self._creating
        if creating is None:
            creating = self._creating = asyncio.ensure_future(
                self.admin.run(self.engine.create_topic, TRANSACTION_STATE_TOPIC, self.partitions, self.topic_configs())
            )
            log.info("creating %s (%d partitions) for its first write", TRANSACTION_STATE_TOPIC, self.partitions)
        try:
            await asyncio.shield(creating)
        finally:
            failed = creating.done() and (creating.cancelled() or creating.exception() is not None)
            if failed and self._creating is creating:
                self._creating = None  # the next write tries again

    def partition_of(self, transactional_id: str) -> int:
        return partition_for_group(transactional_id, self.partitions)

    def coordinator_epoch(self, partition: int) -> int:
        """The epoch markers carry: the leader epoch of the partition (0 on a single broker)."""
        return max(0, self.engine.partition(TRANSACTION_STATE_TOPIC, partition).latest_epoch)

    def load_partition(self, partition: int) -> dict[str, TransactionMetadata]:
        """Replay one partition to its log end: each transactional id's latest state."""
        loaded: dict[str, TransactionMetadata] = {}
        for record in self.engine.consume(TRANSACTION_STATE_TOPIC, partition, up_to_log_end=True):
            if record.key is None:
                continue
            try:
                transactional_id = records.decode_key(record.key)
                if record.value is None:
                    loaded.pop(transactional_id, None)
                else:
                    value = records.decode_value(record.value)
                    loaded[transactional_id] = TransactionMetadata.from_log_value(transactional_id, value)
            except (TidelogError, ValueError) as exc:
                log.warning("skipping an unreadable %s record: %s", TRANSACTION_STATE_TOPIC, exc)
        return loaded

    async def write(self, transactional_id: str, value: records.TransactionLogValue | None) -> None:
        """Append one state (None: the tombstone) and wait until it is durable as the flush policy and, in a
        cluster, the ISR ask."""
        partition = self.partition_of(transactional_id)
        if self.check_leader is not None:
            try:
                self.check_leader(TRANSACTION_STATE_TOPIC, partition, -1)
            except (NotLeaderOrFollowerError, UnknownTopicOrPartitionError) as exc:
                raise NotCoordinatorError(str(exc)) from exc
        else:
            await self._ensure_topic()
        partition_log = self.engine.partition(TRANSACTION_STATE_TOPIC, partition)
        record = Record(
            key=records.encode_key(transactional_id), value=None if value is None else records.encode_value(value)
        )
        result = partition_log.append(build_batch([record]), from_client=False)
        if partition_log.flush_due():
            await self.flusher.wait_durable(partition_log, result.last_offset + 1)
        if self.replication is None:
            return
        self.replication.after_leader_append(TRANSACTION_STATE_TOPIC, partition)
        try:
            await self.replication.wait_replicated(
                TRANSACTION_STATE_TOPIC, partition, result.last_offset + 1, WRITE_TIMEOUT_S
            )
        except NotLeaderOrFollowerError as exc:
            raise NotCoordinatorError(str(exc)) from exc
        except (NotEnoughReplicasAfterAppendError, RequestTimedOutError) as exc:
            raise CoordinatorNotAvailableError(str(exc)) from exc
