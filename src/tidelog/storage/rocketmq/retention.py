"""Retention (RocketMQ's CleanCommitLogService, then CleanConsumeQueueService). No file format of its own.

CommitLog files go whole, oldest first, never the last (active) one, never one the dispatcher has not finished, and
never past the first file that must stay:
- when the local hour is one of `deleteWhen` (`04`, or `01;13`), files last modified more than `fileReservedTime`
  hours ago;
- at any hour while the store's disk is more than `diskMaxUsedSpaceRatio` % used, the same expired files;
- above `diskSpaceCleanForciblyRatio` %, files regardless of age (cleanImmediately);
- above `diskSpaceWarningLevelRatio` %, appends are refused (disk full) until usage falls again.
At most `deleteFileBatchMax` files per round, `deleteCommitLogFilesInterval` ms apart. Then each ConsumeQueue
drops its files whose last unit points below the new CommitLog minimum and moves its minimum offset to the first
unit still in the CommitLog (the Kafka log start offset follows); the engine's other derived files (IndexFiles) are
cut the same way.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidelog.storage.rocketmq.engine import RocketMQEngine

log = logging.getLogger("tidelog.storage.rocketmq")

HOUR_MS = 3600 * 1000


def is_time_to_delete(delete_when: str, now_ms: int) -> bool:
    """UtilAll.isItTimeToDo: is the local hour of `now_ms` one of the `;`-separated hours?"""
    hour = time.localtime(now_ms / 1000).tm_hour
    return any(part.strip().isdigit() and int(part) == hour for part in delete_when.split(";"))


class CleanCommitLogService:
    def __init__(self, engine: RocketMQEngine) -> None:
        self.engine = engine
        self.disk_usage_ratio = 0.0
        self.disk_full = False

    def measure_disk(self) -> float:
        usage = shutil.disk_usage(self.engine.root)
        self.disk_usage_ratio = 100.0 * (usage.total - usage.free) / usage.total if usage.total else 0.0
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
        deleted = 0
        while deleted < config.delete_file_batch_max:
            if deleted and config.delete_commit_log_files_interval:  # spread the unlinks (RocketMQ's 04:00 spikes)
                time.sleep(config.delete_commit_log_files_interval / 1000)
            if not engine.commitlog.queue.delete_expired_by_time(
                config.file_reserved_time * HOUR_MS,
                now,
                clean_immediately=clean_immediately,
                delete_file_batch_max=1,
                max_end_offset=engine.dispatcher.reput_from_offset,
            ):
                break
            deleted += 1
        if deleted:
            log.info(
                "%s: deleted %d CommitLog file(s) (%s); the CommitLog now starts at %d",
                engine.root,
                deleted,
                "disk over the forced-clean ratio" if clean_immediately else "expired",
                engine.commitlog.min_offset,
            )
            engine.delete_derived_files(engine.commitlog.min_offset)
        return deleted
