"""The Kafka storage engine: every partition log under `log.dirs` (Kafka's LogManager).

Each log directory holds `<topic>-<partition>` directories plus the log-dir level files
(meta.properties, recovery-point-offset-checkpoint, log-start-offset-checkpoint,
.kafka_cleanshutdown, .lock). In a cluster (EngineConfig.replicated) also replication-offset-checkpoint:
every partition's high watermark, where it starts at the next open (at most the log end; the log start
without an entry), written every replica.high.watermark.checkpoint.interval.ms and at close, as Kafka's
ReplicaManager does. Topic settings that Kafka keeps in its metadata quorum live in
`tidelog-topics.json` at the top of each log dir - a plain file, which Kafka's own loader ignores.
Opening takes an exclusive lock on every dir, reads and removes the clean-shutdown marker, and
loads each partition (recovering it if the marker was absent). After a clean shutdown an engine with background
threads lists its partitions and opens each when it is first used, while a thread of its own opens the rest in
the background (a broker with many partitions serves sooner; Kafka's LazyIndex defers its indexes the same way):
until then a partition's offsets are the checkpointed ones, which the clean shutdown wrote and nothing has moved
since. Without background threads, or after an unclean shutdown (recovery first), every partition opens at once.
Closing flushes, checkpoints and writes the marker last. The engine owns the thread that checks large batches while
they are written (batch_check.py), shared by its partitions and stopped when it closes.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from tidelog.config import LONG_MAX, EngineConfig, LogConfig
from tidelog.errors import (
    CorruptCheckpointError,
    InvalidPartitionsError,
    KafkaStorageError,
    KeyIndexDisabledError,
    LogClosedError,
)
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.api import (
    KeyLocation,
    StorageEngine,
    TopicDescription,
)
from tidelog.storage.common.clock import now_ms
from tidelog.storage.common.deletion import DirectoryDeleter, finish_deletions
from tidelog.storage.common.file_handles import FileHandles, capacity_for_limit, check_partition_budget
from tidelog.storage.common.offset_checkpoint import read_offset_checkpoint, write_offset_checkpoint
from tidelog.storage.common.scheduler import Scheduler
from tidelog.storage.common.topic_registry import TOPICS_FILE, TopicRecord, TopicRegistry, check_local_partitions
from tidelog.storage.kafka import checkpoints
from tidelog.storage.kafka.batch_check import BatchCheckWorker
from tidelog.storage.kafka.cleaner import CLEANER_OFFSET_CHECKPOINT, CleaningAborted, CleanStats, LogCleaner
from tidelog.storage.kafka.index_block_cache import IndexBlockCache
from tidelog.storage.kafka.index_tails import WRITE_INTERVAL_MS as INDEX_TAILS_INTERVAL_MS
from tidelog.storage.kafka.index_tails import IndexTails
from tidelog.storage.kafka.key_index import PartitionKeyIndex, record_at
from tidelog.storage.kafka.partition_log import PARTITION_DIR, PartitionLog, partition_dir_name

log = logging.getLogger("tidelog.storage")

LOCK_FILE = ".lock"
KNOWN_LOG_DIR_FILES = {
    checkpoints.META_PROPERTIES,
    checkpoints.RECOVERY_POINT_CHECKPOINT,
    checkpoints.LOG_START_OFFSET_CHECKPOINT,
    checkpoints.CLEAN_SHUTDOWN_FILE,
    checkpoints.REPLICATION_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
    LOCK_FILE,
    TOPICS_FILE,
    "tidelog-users.json",  # SCRAM credentials and ACLs, which the broker keeps in the first log dir
    "tidelog-acls.json",  # (broker/security_store.py)
    "tidelog-producer-id-block",  # the broker's reservation of producer ids (broker/produce.py)
    "tidelog-dynamic-configs.json",  # dynamic broker configs (broker/dynamic_config.py)
    "tidelog-client-quotas.json",  # client quotas (broker/quota_store.py)
}
KEY_INDEX_INTERVAL_MS = 1000  # how often the key indexes follow the logs (tidelog.index.keys=true)
FOREIGN_PARTITION_DIRS = {"__cluster_metadata-0"}  # KRaft's metadata log: not a topic of ours
FLUSH_THREADS = 8  # threads syncing partitions when many are dirty
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class UnopenedLog:
    """A partition found at a clean start and not opened yet: where it is, and its checkpointed offsets (what the
    checkpoints keep saying for it until it opens)."""

    log_dir: Path
    recovery_point: int
    log_start_offset: int
    high_watermark: int | None


class KafkaEngine(StorageEngine):
    def __init__(
        self,
        config: EngineConfig,
        *,
        background: bool = True,
        clock: Callable[[], int] = now_ms,
        cluster_id: str | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.log_dirs = [Path(d).resolve() for d in config.log_dirs]
        self._lock = threading.RLock()
        self._closed = False
        self._dir_locks: list[int] = []
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._unopened: dict[tuple[str, int], UnopenedLog] = {}  # opened on first use or by the opener thread
        self._opener: threading.Thread | None = None
        self.key_indexes: dict[tuple[str, int], PartitionKeyIndex] = {}  # tidelog.index.keys=true
        self._log_dir_of: dict[tuple[str, int], Path] = {}
        self.registry = TopicRegistry(self.log_dirs)
        # The segment files of every partition: opened when used, at most half the open-file limit kept open.
        self.file_handles = FileHandles(capacity_for_limit())
        self.index_blocks = IndexBlockCache()
        self.index_tails = IndexTails() if background else None  # written by the scheduler (index_tails.py)
        self._flush_check_ms = LONG_MAX  # the interval of the running chain of time-based flush checks
        self._flush_check_chain = 0
        # Checks the large batches of every partition while they are written (stopped by close()).
        self.check_worker = BatchCheckWorker()
        self.check_worker.start()
        try:
            for log_dir in self.log_dirs:
                log_dir.mkdir(parents=True, exist_ok=True)
                self._dir_locks.append(self._lock_dir(log_dir))
            self._check_meta_properties(cluster_id)
            self.scheduler = Scheduler() if background else None
            self.cleaner = LogCleaner(config.cleaner, clock)
            # The cleaner has a thread of its own (as Kafka's CleanerThread): a long pass must not hold up flushes,
            # retention or checkpoints.
            self.cleaner_scheduler = Scheduler("tidelog-log-cleaner") if background and config.cleaner.enabled else None
            for log_dir in self.log_dirs:
                self.cleaner.load_checkpoint(log_dir)
            self.registry.load(damaged_is_fatal=False, check_configs=self._log_config_for)
            self.deleter = DirectoryDeleter(self.scheduler, config.log_defaults.file_delete_delay_ms)
            for log_dir in self.log_dirs:
                self._load_log_dir(log_dir)
            self._create_missing_partitions()
            self.registry.publish()
        except BaseException:
            self.check_worker.stop()
            self._release_dir_locks()
            raise
        self._schedule_background_tasks()
        if self._unopened:
            self._opener = threading.Thread(target=self._open_the_rest, name="tidelog-log-opener", daemon=True)
            self._opener.start()

    @property
    def compacts_topics(self) -> bool:
        return self.config.cleaner.enabled

    # --- opening ----------------------------------------------------------------------------------------------

    @staticmethod
    def _lock_dir(log_dir: Path) -> int:
        fd = os.open(log_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise KafkaStorageError(f"log directory {log_dir} is in use by another process") from None
        return fd

    def _release_dir_locks(self) -> None:
        for fd in self._dir_locks:
            os.close(fd)
        self._dir_locks = []

    def _check_meta_properties(self, expected_cluster_id: str | None) -> None:
        existing = {}
        for log_dir in self.log_dirs:
            try:
                existing[log_dir] = checkpoints.read_meta_properties(log_dir / checkpoints.META_PROPERTIES)
            except CorruptCheckpointError as exc:
                log.warning("%s; rewriting it", exc)
                existing[log_dir] = {}
        cluster_ids = {p["cluster.id"] for p in existing.values() if "cluster.id" in p}
        if len(cluster_ids) > 1:
            raise KafkaStorageError(f"log directories belong to different clusters: {', '.join(sorted(cluster_ids))}")
        cluster_id = cluster_ids.pop() if cluster_ids else expected_cluster_id or new_kafka_uuid()
        if expected_cluster_id is not None and cluster_id != expected_cluster_id:
            raise KafkaStorageError(
                f"the log directories belong to cluster {cluster_id} (meta.properties), but ZooKeeper's cluster is "
                f"{expected_cluster_id}: zookeeper.connect names another cluster, or log.dirs another broker's data"
            )
        for log_dir, properties in existing.items():
            stored_node = properties.get("node.id", properties.get("broker.id"))
            if stored_node is not None and stored_node != str(self.config.node_id):
                log.warning(
                    "%s: meta.properties says node %s, config says %d; keeping the stored identity",
                    log_dir,
                    stored_node,
                    self.config.node_id,
                )
            if "cluster.id" not in properties:
                checkpoints.write_meta_properties(
                    log_dir / checkpoints.META_PROPERTIES,
                    {
                        "version": "1",
                        "cluster.id": cluster_id,
                        "node.id": str(self.config.node_id),
                        "directory.id": new_kafka_uuid(),
                    },
                )
        self.cluster_id = cluster_id

    def _read_checkpoint(self, path: Path) -> dict[tuple[str, int], int]:
        try:
            return read_offset_checkpoint(path)
        except CorruptCheckpointError as exc:
            log.warning("%s; falling back to full recovery", exc)
            return {}

    def _load_log_dir(self, log_dir: Path) -> None:
        clean = checkpoints.take_clean_shutdown_marker(log_dir)
        if not clean and any(PARTITION_DIR.match(p.name) for p in log_dir.iterdir() if p.is_dir()):
            log.info("%s: no clean-shutdown marker; recovering unflushed segments", log_dir)
        recovery_points = self._read_checkpoint(log_dir / checkpoints.RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_checkpoint(log_dir / checkpoints.LOG_START_OFFSET_CHECKPOINT)
        high_watermarks = (
            self._read_checkpoint(log_dir / checkpoints.REPLICATION_OFFSET_CHECKPOINT) if self.config.replicated else {}
        )
        finish_deletions(log_dir)
        with os.scandir(log_dir) as entries:  # the kind of each entry comes with the listing: no stat per partition
            listing = sorted((entry.name, entry.is_dir()) for entry in entries)
        for name, is_dir in listing:
            match = PARTITION_DIR.match(name) if is_dir else None
            if match is None or name in FOREIGN_PARTITION_DIRS:
                if name not in KNOWN_LOG_DIR_FILES and name.removesuffix(".tmp") not in KNOWN_LOG_DIR_FILES:
                    log.warning("%s: %s is not a partition of ours; leaving it alone", log_dir, name)
                continue
            topic, partition = match["topic"], int(match["partition"])
            if (topic, partition) in self._log_dir_of:
                raise KafkaStorageError(
                    f"partition {name} exists in two log directories: "
                    f"{self._log_dir_of[(topic, partition)]} and {log_dir}"
                )
            record = self.registry.topics.get(topic)
            if record is None:
                record = self.registry.topics[topic] = TopicRecord(self._topic_id_on_disk(topic), 0)
                log.info("%s: adopting topic %s found on disk", log_dir, topic)
            record.partitions = max(record.partitions, partition + 1)
            if record.local is not None and partition not in record.local:  # held after all: its directory is here
                record.local = sorted({*record.local, partition})
                self.registry.dirty = True
            unopened = UnopenedLog(
                log_dir,
                recovery_points.get((topic, partition), 0),
                start_offsets.get((topic, partition), 0),
                high_watermarks.get((topic, partition)),
            )
            if clean and self.scheduler is not None:
                self._unopened[(topic, partition)] = unopened
                self._log_dir_of[(topic, partition)] = log_dir
            else:
                self._open_unopened(topic, partition, unopened, had_clean_shutdown=clean)

    def _open_unopened(
        self, topic: str, partition: int, unopened: UnopenedLog, *, had_clean_shutdown: bool = True
    ) -> PartitionLog:
        return self._open_partition(
            unopened.log_dir,
            topic,
            partition,
            recovery_point=unopened.recovery_point,
            log_start_offset=unopened.log_start_offset,
            had_clean_shutdown=had_clean_shutdown,
            high_watermark=unopened.high_watermark,
        )

    def _opened(self, key: tuple[str, int]) -> PartitionLog | None:
        """The partition's log, opened now if it has not been yet; None for a partition this engine does not hold."""
        partition_log = self.logs.get(key)
        if partition_log is not None:
            return partition_log
        if key not in self._unopened:  # never was, or opened since the first look (logs gets it before this loses it)
            return self.logs.get(key)
        with self._lock:
            self._check_open()
            unopened = self._unopened.get(key)
            if unopened is None:  # opened meanwhile (or deleted)
                return self.logs.get(key)
            partition_log = self._open_unopened(*key, unopened)
            del self._unopened[key]
            return partition_log

    def _open_the_rest(self) -> None:
        """The opener thread: every partition not opened yet, one at a time, until none is left or the engine closes."""
        started = self.clock()
        count = 0
        with self._lock:
            keys = sorted(self._unopened)
        for key in keys:
            with self._lock:
                if self._closed:
                    return
            try:
                if key in self._unopened:
                    self._opened(key)
                    count += 1
            except LogClosedError:
                return
            except Exception:  # the partition stays unopened; its first use opens it again and reports the error
                log.exception("%s-%d: cannot open the partition", *key)
        log.info("opened %d partitions in the background in %d ms", count, self.clock() - started)
        self._schedule_flush_check()  # their flush.ms now counts

    def _open_all(self) -> None:
        with self._lock:
            keys = sorted(self._unopened)
        for key in keys:
            self._opened(key)

    def _topic_id_on_disk(self, topic: str) -> str:
        """The id most of the topic's partition.metadata files agree on (a new one if none is readable)."""
        votes: dict[str, int] = {}
        for log_dir in self.log_dirs:
            for partition_dir in log_dir.glob(f"{topic}-*"):
                if PARTITION_DIR.match(partition_dir.name) and partition_dir.name.rsplit("-", 1)[0] == topic:
                    try:
                        found = checkpoints.read_partition_metadata(partition_dir / checkpoints.PARTITION_METADATA)
                    except CorruptCheckpointError:
                        found = None
                    if found is not None:
                        votes[found] = votes.get(found, 0) + 1
        return max(votes, key=lambda topic_id: votes[topic_id]) if votes else new_kafka_uuid()

    def _create_missing_partitions(self) -> None:
        changed = False
        for topic, record in self.registry.topics.items():
            for partition in record.held():
                if (topic, partition) not in self._log_dir_of:
                    self._open_partition(self._least_loaded_dir(), topic, partition)
                    changed = True
        missing_file = self.registry.topics and self.registry.copies_missing()
        if changed or missing_file or self.registry.dirty:
            self.registry.save()

    def _open_partition(
        self,
        log_dir: Path,
        topic: str,
        partition: int,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        had_clean_shutdown: bool = True,
        high_watermark: int | None = None,
    ) -> PartitionLog:
        record = self.registry.topics[topic]
        partition_log = PartitionLog(
            log_dir / partition_dir_name(topic, partition),
            topic,
            partition,
            record.topic_id,
            self._log_config_for(record.configs),
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            had_clean_shutdown=had_clean_shutdown,
            scheduler=self.scheduler,
            check_worker=self.check_worker,
            clock=self.clock,
            replicated=self.config.replicated,
            high_watermark=high_watermark,
            handles=self.file_handles,
            index_blocks=self.index_blocks,
            index_tails=self.index_tails,
        )
        self.logs[(topic, partition)] = partition_log
        self._log_dir_of[(topic, partition)] = log_dir
        if self.config.key_index.enabled:
            key_index = self.key_indexes[(topic, partition)] = PartitionKeyIndex(
                partition_log.directory,
                topic,
                self.config.key_index,
                had_clean_shutdown=had_clean_shutdown,
                log_start_offset=partition_log.log_start_offset,
                log_end_offset=partition_log.log_end_offset,
            )
            partition_log.truncation_listeners.append(key_index.truncated)
        return partition_log

    def _log_config_for(self, overrides: Mapping[str, Any]) -> LogConfig:
        return self.config.log_defaults.with_overrides(overrides)

    def _least_loaded_dir(self) -> Path:
        counts = {d: 0 for d in self.log_dirs}
        for log_dir in self._log_dir_of.values():
            counts[log_dir] += 1
        return min(self.log_dirs, key=lambda d: counts[d])

    # --- background work --------------------------------------------------------------------------------------

    def _schedule_background_tasks(self) -> None:
        if self.scheduler is None:
            return
        config = self.config
        self.scheduler.schedule(
            "retention",
            self.delete_old_segments,
            config.retention_check_interval_ms,
            config.retention_check_interval_ms,
        )
        self.scheduler.schedule(
            "recovery-point checkpoint",
            self.checkpoint_recovery_points,
            config.recovery_point_checkpoint_interval_ms,
            config.recovery_point_checkpoint_interval_ms,
        )
        self.scheduler.schedule(
            "log-start-offset checkpoint",
            self.checkpoint_log_start_offsets,
            config.log_start_offset_checkpoint_interval_ms,
            config.log_start_offset_checkpoint_interval_ms,
        )
        if config.replicated:
            self.scheduler.schedule(
                "high-watermark checkpoint",
                self.checkpoint_high_watermarks,
                config.high_watermark_checkpoint_interval_ms,
                config.high_watermark_checkpoint_interval_ms,
            )
        if self.index_tails is not None:
            self.scheduler.schedule(
                "index tails", self.index_tails.write, INDEX_TAILS_INTERVAL_MS, INDEX_TAILS_INTERVAL_MS
            )
        self._schedule_flush_check()
        if self.cleaner_scheduler is not None:
            self.cleaner_scheduler.schedule(
                "log cleaner", self.clean_logs, config.cleaner.backoff_ms, max(config.cleaner.backoff_ms, 1)
            )
        if config.key_index.enabled:
            self.scheduler.schedule(
                "key index catch-up", self.catch_up_key_indexes, KEY_INDEX_INTERVAL_MS, KEY_INDEX_INTERVAL_MS
            )

    def catch_up_key_indexes(self) -> None:
        """Index what was appended since the last round; drop index files below each log start offset."""
        for key, key_index in list(self.key_indexes.items()):
            partition_log = self.logs.get(key)
            if partition_log is not None:
                key_index.catch_up(partition_log)
                key_index.delete_expired(partition_log.log_start_offset)

    def clean_logs(self) -> list[CleanStats]:
        """One round of the log cleaner: the filthiest compacted log over its dirty ratio (or overdue) is cleaned,
        then the next, each log at most once; the first dirty offsets go to `cleaner-offset-checkpoint`."""
        done: list[CleanStats] = []
        cleaned: set[tuple[str, int]] = set()
        while True:
            with self._lock:
                if self._closed:
                    return done
                candidates = [lg for key, lg in self.logs.items() if key not in cleaned]
            to_clean = self.cleaner.filthiest(candidates)
            if to_clean is None:
                return done
            key = (to_clean.log.topic, to_clean.log.partition)
            cleaned.add(key)
            try:
                done.append(self.cleaner.clean(to_clean))
            except CleaningAborted:
                log.info("%s: cleaning stopped: the log is closing", to_clean.log.name)
                return done
            with self._lock:
                log_dir = self._log_dir_of.get(key)
                keys = [k for k, d in self._log_dir_of.items() if d == log_dir]
            if log_dir is not None:
                self.cleaner.write_checkpoint(log_dir, keys)

    def _schedule_flush_check(self) -> None:
        """Run the time-based flush check as often as the shortest `flush.ms` (broker default or topic override)
        or `log.flush.scheduler.interval.ms` asks; called at open and whenever a topic's configs appear or change.
        A new interval starts a new chain of checks, and the previous chain ends at its next run."""
        if self.scheduler is None:
            return
        with self._lock:
            interval = min(
                [
                    self.config.flush_scheduler_interval_ms,
                    *(lg.config.flush_ms for lg in self.logs.values()),
                    self.config.log_defaults.flush_ms,
                ]
            )
            if interval == self._flush_check_ms:
                return
            self._flush_check_ms = interval
            self._flush_check_chain += 1
            chain = self._flush_check_chain
        scheduler = self.scheduler

        def check() -> None:
            if chain != self._flush_check_chain or self._closed:  # replaced, or the engine is closing
                return
            try:
                self._flush_due_logs()
            finally:
                scheduler.schedule("time-based flush", check, interval)

        if interval < LONG_MAX:
            scheduler.schedule("time-based flush", check, interval)

    def _flush_due_logs(self) -> None:
        now = self.clock()
        dirty = [lg for lg in list(self.logs.values()) if lg.has_unflushed()]
        _in_parallel(lambda partition_log: partition_log.flush_if_due(now), dirty)

    def delete_old_segments(self) -> int:
        return sum(partition_log.delete_old_segments() for partition_log in list(self.logs.values()))

    def checkpoint_recovery_points(self) -> None:
        self._write_offset_checkpoints(
            checkpoints.RECOVERY_POINT_CHECKPOINT, lambda lg: lg.recovery_point, lambda un: un.recovery_point
        )

    def checkpoint_log_start_offsets(self) -> None:
        self._write_offset_checkpoints(
            checkpoints.LOG_START_OFFSET_CHECKPOINT, lambda lg: lg.log_start_offset, lambda un: un.log_start_offset
        )

    def checkpoint_high_watermarks(self) -> None:
        """replication-offset-checkpoint: every partition's high watermark (a replicated engine only)."""
        if self.config.replicated:
            self._write_offset_checkpoints(
                checkpoints.REPLICATION_OFFSET_CHECKPOINT, lambda lg: lg.high_watermark, lambda un: un.high_watermark
            )

    def _write_offset_checkpoints(
        self,
        file_name: str,
        value: Callable[[PartitionLog], int],
        unopened_value: Callable[[UnopenedLog], int | None],
    ) -> None:
        """Every partition's `value`; a partition not opened yet keeps the one its checkpoint held (none: left out)."""
        with self._lock:
            by_dir: dict[Path, dict[tuple[str, int], int]] = {d: {} for d in self.log_dirs}
            for key, partition_log in self.logs.items():
                by_dir[self._log_dir_of[key]][key] = value(partition_log)
            for key, unopened in self._unopened.items():
                kept = unopened_value(unopened)
                if kept is not None:
                    by_dir[unopened.log_dir][key] = kept
        for log_dir, offsets in by_dir.items():
            write_offset_checkpoint(log_dir / file_name, offsets)

    # --- topics -----------------------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        configs: Mapping[str, Any] | None = None,
        *,
        topic_id: str | None = None,
        local_partitions: Collection[int] | None = None,
    ) -> TopicDescription:
        count = self.config.num_partitions if partitions is None else partitions
        if count < 1:
            raise InvalidPartitionsError(f"topic {name}: the partition count must be at least 1, got {count}")
        overrides = dict(configs or {})
        self._log_config_for(overrides)  # raises ConfigError naming a bad key before anything is created
        with self._lock:
            self._check_open()
            self.registry.check_new(name)
            held = check_local_partitions(name, 0, count, local_partitions)
            self._check_partition_budget(name, count if held is None else len(held))
            record = self.registry.add(name, count, overrides, topic_id=topic_id, local=held)
            for partition in record.held():
                self._open_partition(self._least_loaded_dir(), name, partition)
            self.registry.save()
            self._schedule_flush_check()
            return self.registry.describe(name)

    def _check_partition_budget(self, topic: str, new_partitions: int) -> None:
        check_partition_budget(topic, new_partitions, len(self._log_dir_of))

    def delete_topic(self, name: str) -> None:
        with self._lock:
            self._check_open()
            record = self.registry.remove(name)
            for partition in record.held():
                self._delete_partition(name, partition)
            self.registry.save()

    def _delete_partition(self, name: str, partition: int) -> None:
        unopened = self._unopened.pop((name, partition), None)
        if unopened is not None:  # nothing open to close: its directory goes as it is
            self._log_dir_of.pop((name, partition))
            self.cleaner.forget((name, partition))
            self.deleter.delete_later(unopened.log_dir / partition_dir_name(name, partition))
            return
        partition_log = self.logs.pop((name, partition))
        self._log_dir_of.pop((name, partition))
        self.cleaner.forget((name, partition))
        key_index = self.key_indexes.pop((name, partition), None)
        if key_index is not None:
            key_index.close()
        partition_log.close(flush=False)
        self.deleter.delete_later(partition_log.directory)

    def hold_partitions(self, name: str, local_partitions: Collection[int]) -> None:
        with self._lock:
            self._check_open()
            record = self.registry.get(name)
            wanted = check_local_partitions(name, 0, record.partitions, local_partitions) or []
            held = set(record.held())
            added = [p for p in wanted if p not in held]
            self._check_partition_budget(name, len(added))
            for partition in added:
                self._open_partition(self._least_loaded_dir(), name, partition)
            for partition in sorted(held - set(wanted)):
                self._delete_partition(name, partition)
            record.local = wanted
            self.registry.save()

    def create_partitions(self, name: str, total: int, *, local_partitions: Collection[int] | None = None) -> None:
        with self._lock:
            self._check_open()
            record = self.registry.get(name)
            if total <= record.partitions:
                raise InvalidPartitionsError(
                    f"topic {name} has {record.partitions} partitions; the new count {total} must be larger"
                )
            held = check_local_partitions(name, record.partitions, total, local_partitions)
            if held is None and record.local is not None:
                held = list(range(record.partitions, total))
            new = range(record.partitions, total) if held is None else held
            self._check_partition_budget(name, len(new))
            for partition in new:
                self._open_partition(self._least_loaded_dir(), name, partition)
            if held is not None:
                record.local = [*record.held(), *held]
            record.partitions = total
            self.registry.save()

    def alter_topic_configs(self, name: str, configs: Mapping[str, Any]) -> None:
        """Replace a topic's overrides (as IncrementalAlterConfigs would leave them)."""
        with self._lock:
            record = self.registry.get(name)
            new_config = self._log_config_for(configs)
            record.configs = {k: str(v) for k, v in configs.items()}
            for partition in record.held():
                self._opened_log(name, partition).update_config(new_config)
            self.registry.save()
            self._schedule_flush_check()

    def set_log_defaults(self, defaults: LogConfig) -> None:
        with self._lock:
            self._check_open()
            records = {name: self.registry.get(name) for name in self.registry.descriptions()}
            configs = {name: defaults.with_overrides(record.configs) for name, record in records.items()}
            self.config = replace(self.config, log_defaults=defaults)
            for name, record in records.items():
                for partition in record.held():
                    self._opened_log(name, partition).update_config(configs[name])
            self._schedule_flush_check()

    def topics(self) -> dict[str, TopicDescription]:
        return self.registry.descriptions()

    # --- data -------------------------------------------------------------------------------------------------

    def partition_log(self, topic: str, partition: int) -> PartitionLog:
        partition_log = self._opened((topic, partition))
        if partition_log is None:
            self._check_open()
            raise self.registry.unknown_partition(topic, partition)
        return partition_log

    def _opened_log(self, topic: str, partition: int) -> PartitionLog:
        """A partition the engine holds, opened now if it was not yet."""
        partition_log = self._opened((topic, partition))
        assert partition_log is not None, f"{topic}-{partition} is held but has no log"
        return partition_log

    def partition(self, topic: str, partition: int) -> PartitionLog:
        return self.partition_log(topic, partition)

    def partitions(self) -> dict[tuple[str, int], PartitionLog]:
        """Every partition, those not opened yet opened now."""
        self._open_all()
        return dict(self.logs)

    def log_dir_of(self, topic: str, partition: int) -> Path:
        self.partition_log(topic, partition)  # UnknownTopicOrPartitionError
        return self._log_dir_of.get((topic, partition), self.log_dirs[0])

    def flush(self, topic: str | None = None, partition: int | None = None) -> None:
        if topic is not None and partition is not None:
            self.partition_log(topic, partition).flush()
            return
        _in_parallel(
            PartitionLog.flush,
            [
                lg
                for (log_topic, _), lg in list(self.logs.items())
                if (topic is None or log_topic == topic) and lg.has_unflushed()
            ],
        )

    def lookup_key(self, topic: str, key: bytes, *, max_results: int = 64) -> list[KeyLocation]:
        """Records of `topic` whose key is `key`, newest first (by timestamp, then offset), through the
        per-partition key index; each candidate is read back and its key compared (the index keeps hashes)."""
        if not self.config.key_index.enabled:
            raise KeyIndexDisabledError("the Kafka engine answers key lookups only with tidelog.index.keys=true")
        found: list[KeyLocation] = []
        for partition in self.registry.get(topic).held():
            partition_log = self.partition_log(topic, partition)
            key_index = self.key_indexes[(topic, partition)]
            key_index.catch_up(partition_log)
            for offset in key_index.candidates(key, max_results):
                record = record_at(partition_log, offset)
                if record is not None and record.key == key:
                    found.append(KeyLocation(partition, offset, record.timestamp_ms or 0))
        found.sort(key=lambda location: (location.timestamp, location.offset), reverse=True)
        return found[:max_results]

    # --- shutdown ---------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("the log is closed")

    def close(self) -> None:
        """A clean shutdown: flush and close every partition, checkpoint, then write the marker in each dir.

        When the disk refuses a write (a full disk), every file is still closed and every lock released; the
        marker is left out, so the next start recovers from the logs instead of trusting what is missing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._opener is not None:
            self._opener.join()  # stops before its next partition; the unopened ones stay as they are on disk
        if self.cleaner_scheduler is not None:
            self.cleaner.abort()  # a pass in progress stops at its next chunk and leaves the log as it was
            self.cleaner_scheduler.shutdown()
        try:  # on FLUSH_THREADS threads, before the scheduler runs what it still holds one task at a time (with
            # many partitions, a leader-epoch checkpoint and a flush each): those then find nothing left to do
            self.flush()
        except (KafkaStorageError, OSError) as exc:  # each partition's close tries again and reports its own failure
            log.warning("flushing the logs before the shutdown failed: %s", exc)
        if self.scheduler is not None:
            self.scheduler.shutdown()
        self.deleter.close()
        clean = True
        try:
            for key, key_index in self.key_indexes.items():
                key_index.catch_up(self.logs[key])
                try:
                    key_index.flush()
                except OSError as exc:  # the next start treats the key index as after a crash
                    log.error("%s-%d: cannot flush the key index at shutdown: %s", *key, exc.strerror or exc)
                    clean = False
                key_index.close()
            clean = all(_in_parallel(PartitionLog.close, list(self.logs.values()))) and clean
            try:
                self.checkpoint_recovery_points()
                self.checkpoint_log_start_offsets()
                self.checkpoint_high_watermarks()
            except OSError as exc:
                log.error("cannot write the offset checkpoints at shutdown: %s", exc.strerror or exc)
                clean = False
            if not clean:
                log.error("the shutdown was not clean; the next start recovers the logs from the last recovery point")
                return
            for log_dir in self.log_dirs:
                try:
                    checkpoints.write_clean_shutdown_marker(log_dir)
                except OSError as exc:
                    log.error("%s: cannot write the clean-shutdown marker: %s", log_dir, exc.strerror or exc)
        finally:
            self.check_worker.stop()
            self._release_dir_locks()


def _in_parallel(work: Callable[[PartitionLog], _T], logs: list[PartitionLog]) -> list[_T]:
    """`work` for each of `logs` (flushing or closing them), on up to FLUSH_THREADS threads when there are many: an
    fsync leaves the GIL, and the filesystem commits concurrent syncs together (one journal commit covers the files
    of many partitions). The first failure is raised once every call has ended."""
    if len(logs) < FLUSH_THREADS:
        return [work(partition_log) for partition_log in logs]
    with ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="tidelog-flush") as pool:
        return list(pool.map(work, logs))
