"""The Kafka engine's optional key index (`tidelog.index.keys=true`): per partition, RocketMQ IndexFiles in the
subdirectory `<topic>-<partition>/tidelog-keyindex/` (format: storage/common/index_file.py), so the Kafka engine
answers "where are the records with key K" as the RocketMQ engine does.

Kafka has no such index. The directory stays out of Kafka's way: Kafka's LogLoader only looks at regular files of a
partition directory (`listFiles(File::isFile)`), and kafka-dump-log reads the files it is given, so a real Kafka
broker or tool sees the partition exactly as without the index; our own loader knows the name (no stray warning).

An entry maps `topic#<key>` (the key as codec.rocketmq_message.index_key spells it: the UTF-8 text, or `base64:...`)
to the record's Kafka offset (in the entry's phyOffset field), with the record timestamp as its time. Files hold
`tidelog.index.keys.maxIndexNum` - 1 entries and have `tidelog.index.keys.maxHashSlotNum` slots.

Derived data, built off the append path: the index follows the log (like RocketMQ's dispatcher), caught up by a
background task and before every lookup, reading batches back through the partition's own read path. Loading drops
what the log no longer holds (after a crash the file being written is dropped whole, after a truncation the files
past the new end; a follower's truncation of an open log does the same through `truncated`), retention drops files
below the log start offset, and the catch-up re-indexes the rest.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from tidelog.codec.record_batch import Record
from tidelog.codec.record_set import decode_batch, iter_batches
from tidelog.codec.rocketmq_message import index_key
from tidelog.config import KeyIndexConfig
from tidelog.errors import TidelogError
from tidelog.storage.api import Partition
from tidelog.storage.common.index_file import IndexService

log = logging.getLogger("tidelog.storage")

KEY_INDEX_DIR = "tidelog-keyindex"
CATCH_UP_CHUNK_BYTES = 1 << 20
LONG_MAX = (1 << 63) - 1


class PartitionKeyIndex:
    def __init__(
        self,
        partition_dir: Path,
        topic: str,
        config: KeyIndexConfig,
        *,
        had_clean_shutdown: bool,
        log_start_offset: int,
        log_end_offset: int,
    ) -> None:
        self.topic = topic
        self.service = IndexService(partition_dir / KEY_INDEX_DIR, config.max_hash_slot_num, config.max_index_num)
        self._lock = threading.Lock()
        self.service.load(clean_shutdown=True, index_checkpoint_timestamp=0)
        if not had_clean_shutdown:
            self.service.drop_newest()
        self.service.drop_beyond(log_end_offset)
        self.service.delete_expired_files(log_start_offset)
        self.next_offset = self.service.rebuild_from  # the first offset not yet looked at
        self._failed_at = -1

    def catch_up(self, partition: Partition) -> int:
        """Index the records appended since the last call (up to the high watermark); returns how many keys.
        A failure (a full disk) is logged and retried at the next call; the log is never affected."""
        with self._lock:
            try:
                return self._catch_up(partition)
            except (OSError, TidelogError) as exc:
                if self._failed_at != self.next_offset:
                    self._failed_at = self.next_offset
                    log.warning("%s: key index stays behind at offset %d: %s", partition.name, self.next_offset, exc)
                return 0

    def _catch_up(self, partition: Partition) -> int:
        indexed = 0
        offset = max(self.next_offset, partition.log_start_offset)
        end = partition.high_watermark
        while offset < end:
            data = partition.read(offset, CATCH_UP_CHUNK_BYTES).read_bytes()
            keys: list[tuple[int, int, int]] = []
            hash_key = self.service.hasher.hash
            next_offset = offset
            for info in iter_batches(data):
                if info.last_offset >= offset and not info.is_control:
                    for record in decode_batch(data, info):
                        if record.offset >= offset and record.key is not None:
                            keys.append((hash_key(self.topic, index_key(record.key)), record.offset, _time(record)))
                next_offset = max(next_offset, info.next_offset)
            if next_offset == offset:
                break  # nothing readable here (the log moved under us); the next call tries again
            indexed += self.service.put_keys(keys)
            offset = self.next_offset = next_offset
        return indexed

    def truncated(self, log_end_offset: int) -> None:
        """The log was cut back to end at `log_end_offset` (a follower's truncation): files indexing offsets at or
        past it go, and the catch-up re-indexes from where the remaining files end, as loading does."""
        with self._lock:
            self.service.drop_beyond(log_end_offset)
            self.next_offset = min(self.next_offset, self.service.rebuild_from)

    def candidates(self, key: bytes, max_num: int) -> list[int]:
        """Offsets whose entry hash matches `key`, newest first; the caller checks each record's key."""
        found = self.service.query_offsets(
            self.topic, index_key(key), max_num, 0, LONG_MAX, max_msgs_num_batch=max_num
        ).phy_offsets
        return list(dict.fromkeys(found))

    def delete_expired(self, log_start_offset: int) -> None:
        self.service.delete_expired_files(log_start_offset)

    def flush(self) -> None:
        self.service.flush()

    def close(self) -> None:
        with self._lock:
            self.service.close()


def _time(record: Record) -> int:
    return record.timestamp_ms if record.timestamp_ms is not None and record.timestamp_ms >= 0 else 0


def record_at(partition: Partition, offset: int) -> Record | None:
    """The record at `offset` (None when it is gone or was never there)."""
    if not partition.log_start_offset <= offset < partition.high_watermark:
        return None
    data = partition.read(offset, 1).read_bytes()
    for info in iter_batches(data):
        if info.base_offset <= offset <= info.last_offset or info.base_offset < 0:
            for record in decode_batch(data, info):
                if record.offset == offset:
                    return record
    return None
