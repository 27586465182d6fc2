"""Committed offsets and group metadata, kept durably in the internal topic `__consumer_offsets`.

Records use Kafka's key/value formats (codec/group_records.py); each group lives in partition
`abs(hash(groupId)) % offsets.topic.num.partitions`. On start every partition is replayed (last
value per key wins, a null value deletes). In a cluster the topic is the cluster's (cluster_groups.py): a broker
replays a partition when it becomes its leader (`load_partition`) and forgets its groups when it stops being one.
Writes are appended like produced batches and, when the flush policy asks for it, wait for the group commit before
the client is answered; in a cluster they also wait until the partition's in-sync replicas have them (Kafka's
offsets.commit.required.acks=-1, within offsets.commit.timeout.ms: 5 s), so a committed offset survives a
failover. A write that does not get there fails with COORDINATOR_NOT_AVAILABLE (NOT_COORDINATOR when leadership
moved), as Kafka answers, and is not applied.

The topic is created as Kafka creates it: `cleanup.policy=compact`, `segment.bytes=offsets.topic.segment.bytes`
(and `retention.ms=-1`: nothing goes by age). On the Kafka engine with `log.cleaner.enable=true` (the default) the
log cleaner compacts it, as Kafka's does: the latest value per key stays, tombstones go after
`delete.retention.ms`. Where no cleaner runs (the RocketMQ engine, or the cleaner turned off) the store compacts
itself: when a partition has grown past one segment's worth, the live entries of its groups are written again and
the log start offset is moved past the old copies (DeleteRecords), which retention then deletes. Either way a
restart replays at most about a segment of history per partition beyond the live entries.
A topic made by an older tidelog (cleanup.policy=delete) is switched to compact at start.

Transactional offset commits (TxnOffsetCommit) are written as Kafka writes them: a transactional batch carrying the
producer's id and epoch. They stay pending - kept per producer, invisible to OffsetFetch - until the transaction's
marker reaches the partition (`complete_transaction`): COMMIT applies them, ABORT drops them. Replaying a partition
does the same with the markers it meets, so pending offsets survive a restart and aborted ones never appear. The
store's own compaction keeps what is pending in place: it moves the log start no further than the first pending
transactional batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidelog.codec import consumer_group_records as consumer_records
from tidelog.codec import group_records as records
from tidelog.codec.control_record import ControlRecordType, parse_control_record
from tidelog.codec.record_batch import Record, build_batch
from tidelog.codec.record_set import decode_batch, iter_batches
from tidelog.errors import (
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    TidelogError,
)
from tidelog.storage.api import StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.produce import Flusher
    from tidelog.broker.replica_manager import ReplicaManager

log = logging.getLogger("tidelog.broker")

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_COMMIT_TIMEOUT_S = 5.0  # Kafka's offsets.commit.timeout.ms
REPLAY_CHUNK_BYTES = 1 << 20


@dataclass
class StoredGroup:
    """What the topic says about one group: its committed offsets and its last generation (a classic group), or
    the records of the consumer group protocol, last value per key (their values are decoded by
    broker/consumer_groups.py, which writes them)."""

    offsets: dict[tuple[str, int], records.OffsetValue] = field(default_factory=dict)
    metadata: records.GroupValue | None = None
    consumer_records: dict[consumer_records.ConsumerGroupKey, bytes] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.offsets and self.metadata is None and not self.consumer_records


StoreKey = records.OffsetKey | records.GroupKey | consumer_records.ConsumerGroupKey


def encode_store_key(key: StoreKey) -> bytes:
    if isinstance(key, consumer_records.ConsumerGroupKey):
        return consumer_records.encode_key(key)
    return records.encode_key(key)


class OffsetStore:
    def __init__(
        self,
        engine: StorageEngine,
        partitions: int,
        segment_bytes: int,
        flusher: Flusher,
        *,
        engine_compacts: bool,
        replication: ReplicaManager | None = None,
    ) -> None:
        """`engine_compacts`: the engine's log cleaner compacts the topic; otherwise the store does (see above).
        `replication`: a cluster's replica manager, which writes wait for."""
        self.engine = engine
        self.replication = replication
        self.partitions = partitions
        self.segment_bytes = segment_bytes
        self.flusher = flusher
        self.engine_compacts = engine_compacts
        self.groups: dict[str, StoredGroup] = {}
        # producer id -> partition -> (first offset of its pending batches there, group -> (topic, partition) -> value)
        self.pending: dict[int, dict[int, tuple[int, dict[str, dict[tuple[str, int], records.OffsetValue]]]]] = {}
        # a partition is compacted by the store above this size: one segment, or twice what its last compaction
        # left (so live entries larger than a segment are not rewritten on every commit)
        self._compact_above: dict[int, int] = {}

    @property
    def topic_configs(self) -> dict[str, str]:
        return {"cleanup.policy": "compact", "retention.ms": "-1", "segment.bytes": str(self.segment_bytes)}

    def open(self) -> None:
        """Create the topic on first start, then replay it."""
        description = self.engine.topics().get(OFFSETS_TOPIC)
        if description is None:
            self.engine.create_topic(OFFSETS_TOPIC, self.partitions, self.topic_configs)
        elif description.configs.get("cleanup.policy") != "compact":
            log.info("%s: cleanup.policy is now compact, as in Kafka", OFFSETS_TOPIC)
            self.engine.alter_topic_configs(OFFSETS_TOPIC, {**description.configs, "cleanup.policy": "compact"})
        if description is not None and description.partitions != self.partitions:
            log.warning(
                "%s has %d partitions but offsets.topic.num.partitions is %d; keeping %d",
                OFFSETS_TOPIC,
                description.partitions,
                self.partitions,
                description.partitions,
            )
            self.partitions = description.partitions
        started = time.monotonic()
        count = 0
        for partition in range(self.partitions):
            count += self.load_partition(partition)
        if count:
            log.info(
                "loaded %d group(s) from %d record(s) of %s in %.2f s",
                len(self.groups),
                count,
                OFFSETS_TOPIC,
                time.monotonic() - started,
            )

    def load_partition(self, partition: int) -> int:
        """Replay one partition (its groups' offsets and metadata) to its log end, as Kafka's group coordinator
        loads it (a new leader's high watermark may still be below records its ISR already holds); transactional
        offsets wait for their marker. The number of records read."""
        handle = self.engine.partition(OFFSETS_TOPIC, partition)
        offset, count = handle.log_start_offset, 0
        while offset < handle.log_end_offset:
            data = handle.read(offset, REPLAY_CHUNK_BYTES, up_to_log_end=True).read_bytes()
            progressed = False
            for info in iter_batches(data):
                progressed = True
                if info.last_offset >= offset:
                    count += self._replay_batch(partition, data, info)
                offset = max(offset, info.last_offset + 1)
            if not progressed:
                break
        return count

    def _replay_batch(self, partition: int, data: bytes, info: Any) -> int:
        header = info.header
        transactional = getattr(header, "is_transactional", False)
        try:
            batch = decode_batch(data, info)
        except TidelogError as exc:
            log.warning("skipping an unreadable %s batch at offset %d: %s", OFFSETS_TOPIC, info.base_offset, exc)
            return 0
        if getattr(header, "is_control", False):
            for record in batch:
                try:
                    marker, _epoch = parse_control_record(record)
                except TidelogError:
                    continue
                if marker in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
                    self.complete_transaction(header.producer_id, partition, marker is ControlRecordType.COMMIT)
            return 0
        for record in batch:
            if transactional:
                self._hold(header.producer_id, partition, info.base_offset, record.key, record.value)
            else:
                self._apply(record.key, record.value)
        return len(batch)

    def _hold(
        self, producer_id: int, partition: int, offset: int, key_bytes: bytes | None, value: bytes | None
    ) -> None:
        """A transactional offset commit: pending until its producer's marker."""
        if key_bytes is None or value is None:
            return
        try:
            key = records.decode_key(key_bytes)
            if not isinstance(key, records.OffsetKey):
                return
            decoded = records.decode_offset_value(value)
        except TidelogError as exc:
            log.warning("skipping an unreadable transactional %s record: %s", OFFSETS_TOPIC, exc)
            return
        _first, held = self.pending.setdefault(producer_id, {}).setdefault(partition, (offset, {}))
        held.setdefault(key.group, {})[(key.topic, key.partition)] = decoded

    def complete_transaction(self, producer_id: int, partition: int, commit: bool) -> set[str]:
        """The marker of `producer_id`'s transaction reached `partition`: its pending offsets there become the
        committed ones (commit) or are dropped; the groups they belonged to."""
        by_partition = self.pending.get(producer_id)
        if by_partition is None or partition not in by_partition:
            return set()
        _first, held = by_partition.pop(partition)
        if not by_partition:
            del self.pending[producer_id]
        if commit:
            for group_id, offsets in held.items():
                self.groups.setdefault(group_id, StoredGroup()).offsets.update(offsets)
        return set(held)

    def pending_offsets(self, group: str) -> dict[int, dict[tuple[str, int], records.OffsetValue]]:
        """The group's offsets waiting for a transaction to end, per producer id."""
        partition = self.partition_of(group)
        return {
            producer_id: by_partition[partition][1][group]
            for producer_id, by_partition in self.pending.items()
            if partition in by_partition and group in by_partition[partition][1]
        }

    def unload_partition(self, partition: int) -> set[str]:
        """Forget the groups of one partition (this broker no longer coordinates them); their ids."""
        gone = {group for group in self.groups if self.partition_of(group) == partition}
        for group in gone:
            del self.groups[group]
        for producer_id in list(self.pending):
            self.pending[producer_id].pop(partition, None)
            if not self.pending[producer_id]:
                del self.pending[producer_id]
        self._compact_above.pop(partition, None)
        return gone

    def _apply(self, key_bytes: bytes | None, value: bytes | None) -> None:
        if key_bytes is None:
            return
        try:
            if consumer_records.is_consumer_group_key(key_bytes):
                consumer_key = consumer_records.decode_key(key_bytes)
                stored = self.groups.setdefault(consumer_key.group, StoredGroup())
                if value is None:
                    stored.consumer_records.pop(consumer_key, None)
                else:
                    stored.consumer_records[consumer_key] = value
                if stored.empty:
                    del self.groups[consumer_key.group]
                return
            key = records.decode_key(key_bytes)
            group = self.groups.setdefault(key.group, StoredGroup())
            if isinstance(key, records.OffsetKey):
                if value is None:
                    group.offsets.pop((key.topic, key.partition), None)
                else:
                    group.offsets[(key.topic, key.partition)] = records.decode_offset_value(value)
            else:
                group.metadata = None if value is None else records.decode_group_value(value)
            if group.empty:
                del self.groups[key.group]
        except TidelogError as exc:
            log.warning("skipping an unreadable %s record: %s", OFFSETS_TOPIC, exc)

    def partition_of(self, group: str) -> int:
        return records.partition_for_group(group, self.partitions)

    async def write(
        self,
        group: str,
        entries: Iterable[tuple[StoreKey, bytes | None]],
        producer: tuple[int, int] | None = None,
    ) -> None:
        """Append the entries as one batch, wait for durability if the flush policy asks, then apply them; with
        `producer` (id, epoch: a TxnOffsetCommit) as a transactional batch whose offsets stay pending until the
        transaction's marker."""
        encoded = [(encode_store_key(key), value) for key, value in entries]
        if not encoded:
            return
        partition = self.partition_of(group)
        partition_log = self.engine.partition(OFFSETS_TOPIC, partition)
        built = [Record(value=value, key=key) for key, value in encoded]
        if producer is None:
            batch = build_batch(built)
        else:
            batch = build_batch(built, producer_id=producer[0], producer_epoch=producer[1], is_transactional=True)
        result = partition_log.append(batch, from_client=False)
        if partition_log.flush_due():
            await self.flusher.wait_durable(partition_log, partition_log.log_end_offset)
        if self.replication is not None:
            await self._wait_replicated(partition, result.last_offset + 1)
        for key, value in encoded:
            if producer is None:
                self._apply(key, value)
            else:
                self._hold(producer[0], partition, result.base_offset, key, value)
        if not self.engine_compacts and partition_log.size_in_bytes > self._compact_above.get(
            partition, self.segment_bytes
        ):
            await self._compact(partition)

    async def _wait_replicated(self, partition: int, end_offset: int) -> None:
        assert self.replication is not None
        self.replication.after_leader_append(OFFSETS_TOPIC, partition)
        try:
            await self.replication.wait_replicated(OFFSETS_TOPIC, partition, end_offset, OFFSETS_COMMIT_TIMEOUT_S)
        except NotLeaderOrFollowerError as exc:
            raise NotCoordinatorError(str(exc)) from exc
        except (NotEnoughReplicasAfterAppendError, RequestTimedOutError) as exc:
            raise CoordinatorNotAvailableError(str(exc)) from exc

    async def _compact(self, partition: int) -> None:
        """Write the partition's live entries again and move its log start past everything before them."""
        partition_log = self.engine.partition(OFFSETS_TOPIC, partition)
        live: list[Record] = []
        for group_id, group in self.groups.items():
            if self.partition_of(group_id) != partition:
                continue
            for (topic, p), value in group.offsets.items():
                key = records.encode_key(records.OffsetKey(group_id, topic, p))
                live.append(Record(value=records.encode_offset_value(value), key=key))
            if group.metadata is not None:
                key = records.encode_key(records.GroupKey(group_id))
                live.append(Record(value=records.encode_group_value(group.metadata), key=key))
            for consumer_key, consumer_value in group.consumer_records.items():
                live.append(Record(value=consumer_value, key=consumer_records.encode_key(consumer_key)))
        first_live = partition_log.log_end_offset
        for start in range(0, len(live), 500):
            partition_log.append(build_batch(live[start : start + 500]), from_client=False)
        await asyncio.to_thread(partition_log.flush)  # on disk before the old copies go
        pending_from = [by_p[partition][0] for by_p in self.pending.values() if partition in by_p]
        partition_log.delete_records(min([first_live, *pending_from]))
        self._compact_above[partition] = max(self.segment_bytes, 2 * partition_log.size_in_bytes)
        log.info(
            "compacted %s-%d: %d live entries rewritten, log start now %d",
            OFFSETS_TOPIC,
            partition,
            len(live),
            first_live,
        )
