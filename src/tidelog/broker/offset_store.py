"""Committed offsets and group metadata, kept durably in the internal topic `__consumer_offsets`.

Records use Kafka's key/value formats (codec/group_records.py); each group lives in partition
`abs(hash(groupId)) % offsets.topic.num.partitions`. On start every partition is replayed (last
value per key wins, a null value deletes). Writes are appended like produced batches and, when the
flush policy asks for it, wait for the group commit before the client is answered.

Kafka compacts this topic; tidelog has no log cleaner yet, so the store compacts itself: when a
partition has grown past `COMPACT_AFTER_BYTES`, the live entries of its groups are written again
and the log start offset is moved past the old copies, which retention then deletes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidelog.codec import group_records as records
from tidelog.codec.record_batch import Record, build_batch
from tidelog.errors import TidelogError
from tidelog.storage.api import StorageEngine

if TYPE_CHECKING:
    from tidelog.broker.produce import Flusher

log = logging.getLogger("tidelog.broker")

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_CONFIGS = {"retention.ms": "-1", "segment.bytes": str(100 * 1024 * 1024)}
COMPACT_AFTER_BYTES = 64 * 1024 * 1024


@dataclass
class StoredGroup:
    """What the topic says about one group: its committed offsets and its last generation."""

    offsets: dict[tuple[str, int], records.OffsetValue] = field(default_factory=dict)
    metadata: records.GroupValue | None = None


class OffsetStore:
    def __init__(self, engine: StorageEngine, partitions: int, flusher: Flusher) -> None:
        self.engine = engine
        self.partitions = partitions
        self.flusher = flusher
        self.groups: dict[str, StoredGroup] = {}

    def open(self) -> None:
        """Create the topic on first start, then replay it."""
        description = self.engine.topics().get(OFFSETS_TOPIC)
        if description is None:
            self.engine.create_topic(OFFSETS_TOPIC, self.partitions, OFFSETS_TOPIC_CONFIGS)
        elif description.partitions != self.partitions:
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
            for record in self.engine.consume(OFFSETS_TOPIC, partition):
                count += 1
                self._apply(record.key, record.value)
        if count:
            log.info(
                "loaded %d group(s) from %d record(s) of %s in %.2f s",
                len(self.groups),
                count,
                OFFSETS_TOPIC,
                time.monotonic() - started,
            )

    def _apply(self, key_bytes: bytes | None, value: bytes | None) -> None:
        if key_bytes is None:
            return
        try:
            key = records.decode_key(key_bytes)
            group = self.groups.setdefault(key.group, StoredGroup())
            if isinstance(key, records.OffsetKey):
                if value is None:
                    group.offsets.pop((key.topic, key.partition), None)
                else:
                    group.offsets[(key.topic, key.partition)] = records.decode_offset_value(value)
            else:
                group.metadata = None if value is None else records.decode_group_value(value)
            if not group.offsets and group.metadata is None:
                del self.groups[key.group]
        except TidelogError as exc:
            log.warning("skipping an unreadable %s record: %s", OFFSETS_TOPIC, exc)

    def partition_of(self, group: str) -> int:
        return records.partition_for_group(group, self.partitions)

    async def write(
        self, group: str, entries: Iterable[tuple[records.OffsetKey | records.GroupKey, bytes | None]]
    ) -> None:
        """Append the entries as one batch, wait for durability if the flush policy asks, then apply them."""
        encoded = [(records.encode_key(key), value) for key, value in entries]
        if not encoded:
            return
        partition = self.partition_of(group)
        partition_log = self.engine.partition(OFFSETS_TOPIC, partition)
        batch = build_batch([Record(value=value, key=key) for key, value in encoded])
        partition_log.append(batch, from_client=False)
        if partition_log.flush_due():
            await self.flusher.wait_durable(partition_log, partition_log.log_end_offset)
        for key, value in encoded:
            self._apply(key, value)
        if partition_log.size_in_bytes > COMPACT_AFTER_BYTES:
            await self._compact(partition)

    async def _compact(self, partition: int) -> None:
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
        first_live = partition_log.log_end_offset
        for start in range(0, len(live), 500):
            partition_log.append(build_batch(live[start : start + 500]), from_client=False)
        await self.flusher.wait_durable(partition_log, partition_log.log_end_offset)
        partition_log.delete_records(first_live)
        log.info(
            "compacted %s-%d: %d live entries rewritten, log start now %d",
            OFFSETS_TOPIC,
            partition,
            len(live),
            first_live,
        )
