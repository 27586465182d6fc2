"""Deleting a directory in two steps, as Kafka's LogManager.asyncDelete does.

First the directory is renamed to its deletion name, `<name>.<32 hex digits>-delete` (UnifiedLog.logDeleteDirName),
and the parent fsynced: from then on it is gone for every reader, and a restart finishes the deletion
(`is_deletion_name`). The files are removed `delay_ms` later on the engine's scheduler (Kafka's
file.delete.delay.ms, broker key log.segment.delete.delay.ms), so the caller - a DeleteTopics request - only pays
for the rename, and readers still holding open files finish with them. The name part is shortened so the whole
name fits in 255 bytes: a 249-character topic's partition directory `<topic>-<n>` plus the 40-character suffix
would not fit in a file name.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from pathlib import Path

from tidelog.atomic_files import fsync_directory
from tidelog.storage.common.scheduler import Scheduler

log = logging.getLogger("tidelog.storage")

DELETE_DIR_SUFFIX = "-delete"
MAX_FILE_NAME_LENGTH = 255


def deletion_name(name: str) -> str:
    """`name` shortened as needed, a unique id, and the `-delete` suffix: at most 255 characters."""
    suffix = f".{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    return name[: MAX_FILE_NAME_LENGTH - len(suffix)] + suffix


def is_deletion_name(name: str) -> bool:
    return name.endswith(DELETE_DIR_SUFFIX)


def remove_tree(path: Path) -> None:
    """Remove a directory renamed for deletion; what cannot be removed is logged and left for the next start."""

    def report(_function: object, failed: str, exc_info: object) -> None:
        log.warning("cannot remove %s (%s); the next start tries again", failed, exc_info)

    if path.exists():
        shutil.rmtree(path, onerror=report)


class DirectoryDeleter:
    """Renames directories out of the way at once and removes them `delay_ms` later on `scheduler` (at once when
    there is no scheduler or no delay). `close` removes what is still pending."""

    def __init__(self, scheduler: Scheduler | None, delay_ms: int) -> None:
        self._scheduler = scheduler
        self._delay_ms = delay_ms
        self._pending: set[Path] = set()
        self._lock = threading.Lock()

    def delete_later(self, directory: Path) -> Path:
        """Rename `directory` to its deletion name (fsyncing the parent) and schedule its removal; returns the new
        path. A directory that does not exist is ignored."""
        if not directory.exists():
            return directory
        target = directory.with_name(deletion_name(directory.name))
        directory.rename(target)
        fsync_directory(target.parent)
        if self._scheduler is None or self._delay_ms <= 0:
            remove_tree(target)
            return target
        with self._lock:
            self._pending.add(target)
        self._scheduler.schedule(f"delete {target.name}", lambda: self._remove(target), self._delay_ms)
        return target

    def _remove(self, target: Path) -> None:
        with self._lock:
            if target not in self._pending:
                return
            self._pending.discard(target)
        remove_tree(target)

    def close(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, set()
        for target in sorted(pending):
            remove_tree(target)


def finish_deletions(parent: Path) -> None:
    """Remove the directories under `parent` that a deletion renamed but did not remove before a stop."""
    for name in sorted(os.listdir(parent)):  # names first: a stat only for a deletion's name (many partitions)
        path = parent / name
        if is_deletion_name(name) and path.is_dir():
            log.info("%s: finishing the deletion of %s", parent, name)
            remove_tree(path)
