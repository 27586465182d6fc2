"""Retention (RocketMQ's CleanCommitLogService, then CleanConsumeQueueService). No file format of its own.

CommitLog files go whole, oldest first, never the last (active) one, never one the dispatcher has not finished, and
never past the first file that must stay:
- when the local hour is one of `deleteWhen` (`04`, or `01;13`), files last modified more than `fileReservedTime`
  hours ago;
- at any hour while the store's disk is more than `diskMaxUsedSpaceRatio` % used, the same expired files;
- above `diskSpaceCleanForciblyRatio` %, files regardless of age (cleanImmediately);
- above `diskSpaceWarningLevelRatio` %, appends are refused (disk full) until usage falls again.
Usage is measured as RocketMQ's UtilAll.getDiskPartitionSpaceUsedPercent and `df` do: the blocks in use over the
blocks in use plus those this process may still take, so a file system's reserved blocks count as neither.
At most `deleteFileBatchMax` files per round, `deleteCommitLogFilesInterval` ms apart. Then each ConsumeQueue
drops its files whose last unit points below the new CommitLog minimum and moves its minimum offset to the first
unit still in the CommitLog (the Kafka log start offset follows); the engine's other derived files (IndexFiles) are
cut the same way. Topics with retention.ms=-1 keep the newest committed value of each key (see keep_compacted_records).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import TYPE_CHECKING

from tidelog.codec.record_batch import Record, build_batch
from tidelog.codec.rocketmq_message import ends_batch, message_to_record
from tidelog.storage.rocketmq.message_queue import TXN_ATTRIBUTES

if TYPE_CHECKING:
    from tidelog.storage.rocketmq.engine import RocketMQEngine
    from tidelog.storage.rocketmq.message_queue import MessageQueue

log = logging.getLogger("tidelog.storage.rocketmq")

HOUR_MS = 3600 * 1000
COPY_BATCH_RECORDS = 500


def is_time_to_delete(delete_when: str, now_ms: int) -> bool:
    """UtilAll.isItTimeToDo: is the local hour of `now_ms` one of the `;`-separated hours?"""
    hour = time.localtime(now_ms / 1000).tm_hour
    return any(part.strip().isdigit() and int(part) == hour for part in delete_when.split(";"))


def disk_used_percent(path: str | os.PathLike[str]) -> float:
    """How full the file system holding `path` is, in whole percent rounded up (as RocketMQ rounds it)."""
    stats = os.statvfs(path)
    used = stats.f_blocks - stats.f_bfree
    entire = used + stats.f_bavail
    return math.ceil(100 * used / entire) if entire else 0.0


class CleanCommitLogService:
    def __init__(self, engine: RocketMQEngine) -> None:
        self.engine = engine
        self.disk_usage_ratio = 0.0
        self.disk_full = False

    def measure_disk(self) -> float:
        self.disk_usage_ratio = disk_used_percent(self.engine.root)
        self.disk_full = self.disk_usage_ratio > self.engine.store_config.disk_space_warning_level_ratio
        return self.disk_usage_ratio

    def run(self, *, manual: bool = False) -> int:
        """One cleaning round; `manual` deletes expired files whatever the hour (executeDeleteFilesManually).
        Returns the number of CommitLog files deleted."""
        engine = self.engine
        config = engine.store_config
        now = engine.clock()
        ratio = self.measure_disk()
        space_to_delete = ratio > config.disk_max_used_space_ratio
        clean_immediately = ratio > config.disk_space_clean_forcibly_ratio
        if not (manual or space_to_delete or is_time_to_delete(config.delete_when, now)):
            return 0
        commitlog = engine.commitlog
        deleted = 0
        while deleted < config.delete_file_batch_max:
            if deleted and config.delete_commit_log_files_interval:  # spread the unlinks (RocketMQ's 04:00 spikes)
                time.sleep(config.delete_commit_log_files_interval / 1000)
            expired = commitlog.queue.expired_prefix(
                config.file_reserved_time * HOUR_MS,
                now,
                clean_immediately=clean_immediately,
                limit=1,
                max_end_offset=engine.dispatcher.reput_from_offset,
            )
            if not expired:
                break
            doomed = commitlog.queue.files[0]
            keep_compacted_records(engine, doomed.file_from_offset + commitlog.file_size)
            commitlog.queue.delete_first_files(1)
            log.info("%s: deleted CommitLog file %s", engine.root, doomed.path.name)
            engine.delete_derived_files(commitlog.min_offset)
            deleted += 1
        if deleted:
            log.info(
                "%s: deleted %d CommitLog file(s) (%s); the CommitLog now starts at %d",
                engine.root,
                deleted,
                "disk over the forced-clean ratio" if clean_immediately else "expired",
                engine.commitlog.min_offset,
            )
        return deleted


def keep_compacted_records(engine: RocketMQEngine, below: int) -> int:
    """Before the CommitLog below `below` goes: for each queue of a topic that asks to be kept forever
    (retention.ms=-1, as the broker's __consumer_offsets does), append again the newest record of every key that
    has no newer record after `below` and is not a tombstone. One CommitLog cannot keep one topic's files forever,
    so such a topic is kept the way a compacted one is: every key's latest value survives (RocketMQ keeps its
    consumer offsets outside the CommitLog; here they live in that topic). Records without a key are not kept.
    Returns the records copied."""
    kept_forever = [q for q in engine.partitions().values() if q.config.retention_ms < 0]
    if not kept_forever:
        return 0
    with engine.commitlog.put_lock:  # no append may slip a newer value of a key in between the look and the copy
        if engine.store_config.sync_flush:
            engine.flusher.flush_now()  # only flushed messages are dispatched
        engine.catch_up()
        return sum(_copy_newest_values(engine, queue, below) for queue in kept_forever)


def _copy_newest_values(engine: RocketMQEngine, queue: MessageQueue, below: int) -> int:
    """The newest committed value of each key: transaction markers, and records of aborted or still open
    transactions, are not values (a batch's messages are judged together, at its last one)."""
    units = queue.units(queue.log_start_offset, queue.high_watermark)
    if not units or units[0][1] >= below:
        return 0
    newest: dict[bytes | None, Record] = {}
    batch: list[tuple[Record, int]] = []
    for _queue_offset, physical_offset, size in units:
        message = engine.read_message(physical_offset, size)
        batch.append((message_to_record(message), physical_offset))
        if not ends_batch(message.properties):
            continue
        if not message.flag & TXN_ATTRIBUTES or queue.is_committed(message):
            for record, at in batch:
                if at < below:
                    newest[record.key] = record
                else:
                    newest.pop(record.key, None)  # a newer record of the key stays anyway
        batch = []
    live = [
        Record(r.value, r.key, r.timestamp_ms, r.headers)
        for r in newest.values()
        if r.key is not None and r.value is not None  # a tombstone deleted its key
    ]
    for start in range(0, len(live), COPY_BATCH_RECORDS):
        queue.append(build_batch(live[start : start + COPY_BATCH_RECORDS]), from_client=False)
    if live:
        log.info("%s: kept %d live record(s) of %s ahead of retention", engine.root, len(live), queue.name)
    return len(live)
