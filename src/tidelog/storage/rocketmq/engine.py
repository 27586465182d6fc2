"""The RocketMQ storage engine: one CommitLog for every topic, a ConsumeQueue per queue, built by the dispatcher
(RocketMQ's DefaultMessageStore). A Kafka partition is a queue; a Kafka offset is the queue offset.

The store directory (`log.dirs`, exactly one) holds RocketMQ's layout - `commitlog/`, `consumequeue/<topic>/<id>/`,
`index/` (the key index, with `messageIndexEnable`), `checkpoint`, `abort`, `lock` - plus what Kafka clients need
and RocketMQ keeps elsewhere or not at all: `tidelog-topics.json` (topic ids, partition counts, configs and the
CommitLog offset each topic was created at, so messages of a deleted namesake are never dispatched into it),
`tidelog-log-start-offsets` (DeleteRecords, in Kafka's offset-checkpoint format) and
`tidelog-producer-snapshots/<topic>-<queue>/` (producer state, Kafka's `<offset>.snapshot` files, and the queue's
aborted transactions, `aborted.txnindex`: aborted_txns.py).

Start-up (DefaultMessageStore.load/recover): take the lock, note whether `abort` was left by a crash and create it;
load CommitLog and ConsumeQueue files; normal recovery starts at the file holding the dispatched end, abnormal
recovery at the last file whose first message is older than the checkpoint's min timestamp; both check every
message (body CRC with `checkCRCOnRecover`), cut the CommitLog at the first invalid one, cut the ConsumeQueues
beyond it, then re-dispatch what is not in the queues. The IndexFiles follow RocketMQ's rule (after a crash, files
that end past the checkpoint's indexMsgTimestamp are dropped), files indexing offsets past the new CommitLog end go
too, and what the remaining files miss is indexed again from the CommitLog before dispatching resumes. A CommitLog
or ConsumeQueue file found shorter than its size (a crash while it was made, a copy cut short; RocketMQ refuses to
start) is extended with zeros and recovery takes the abnormal path, scanning from the first such CommitLog file and
dispatching again what the ConsumeQueues lost; a short IndexFile is dropped with those after it and rebuilt. A clean
close flushes, dispatches everything, writes the checkpoint and removes `abort`.

Master/slave replication (RocketMQ's HAService, with tidelog.rocketmq.haEnable): a master (ASYNC_MASTER or
SYNC_MASTER) runs ha_master.py's HAService on haListenPort, woken by every put; a SLAVE runs ha_client.py's HAClient
towards haMasterAddress, appends the master's CommitLog bytes at the same offsets, refuses puts, and dispatches its
own ConsumeQueues and IndexFiles from what it received (up to the end of the last whole Kafka batch). Topics are not
replicated: each store's topics file says which queues it builds. `become_master` and `become_slave` switch roles
while the store is open (RocketMQ 4's manual switch, RocketMQ 5's controller promotion); `ha_status` reports the
connections.

The key index is derived data built after a message is stored: when it cannot be written (a full disk) the message
is still stored - its produce succeeded - and the index catches up from the CommitLog later.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tidelog.codec import rocketmq_message as rm
from tidelog.config import EngineConfig, LogConfig
from tidelog.errors import (
    ConfigError,
    CorruptCheckpointError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    KafkaStorageError,
    KeyIndexDisabledError,
    LogClosedError,
    OffsetOutOfRangeError,
    SlaveNotAvailableError,
)
from tidelog.kafka_uuid import new_kafka_uuid
from tidelog.storage.api import (
    KeyLocation,
    StorageEngine,
    TopicDescription,
)
from tidelog.storage.common.clock import now_ms
from tidelog.storage.common.deletion import DirectoryDeleter, finish_deletions
from tidelog.storage.common.file_handles import (
    FileHandles,
    StoreFile,
    capacity_for_limit,
    check_partition_budget,
    open_file_limit_error,
)
from tidelog.storage.common.filesystem_sync import SYNC_FILESYSTEM_MIN_FILES, sync_filesystem
from tidelog.storage.common.index_file import IndexService
from tidelog.storage.common.offset_checkpoint import read_offset_checkpoint, write_offset_checkpoint
from tidelog.storage.common.positioned_writes import Piece, write_pieces
from tidelog.storage.common.scheduler import Scheduler
from tidelog.storage.common.topic_registry import TOPICS_FILE, TopicRegistry, check_local_partitions
from tidelog.storage.rocketmq.checkpoint import (
    CHECKPOINT_FILE,
    StoreCheckpoint,
    lock_store,
    remove_abort_file,
    take_abort_file,
)
from tidelog.storage.rocketmq.commitlog import CommitLog, RecoveryResult
from tidelog.storage.rocketmq.consume_queue import (
    CONSUME_QUEUE_DIR,
    CQ_STORE_UNIT_SIZE,
    UNIT_DTYPE,
    ConsumeQueue,
    PlannedRun,
    consume_queue_file_size,
)
from tidelog.storage.rocketmq.dispatcher import DispatchBatch, Dispatcher, ReputMessageService
from tidelog.storage.rocketmq.flush import CommitLogFlusher
from tidelog.storage.rocketmq.ha_client import HAClient, ReplicaLog, SlaveHAStatus
from tidelog.storage.rocketmq.ha_master import HAService, SlaveStatus
from tidelog.storage.rocketmq.ha_protocol import MASTER_ROLES, SLAVE, SYNC_MASTER
from tidelog.storage.rocketmq.index_builder import INDEX_DIR, build_index, message_index_keys
from tidelog.storage.rocketmq.mapped_file import OS_PAGE_SIZE, AllocateMappedFileService
from tidelog.storage.rocketmq.message_queue import TXN_ATTRIBUTES, MessageQueue
from tidelog.storage.rocketmq.read_ahead import ReadAhead
from tidelog.storage.rocketmq.retention import CleanCommitLogService

log = logging.getLogger("tidelog.storage.rocketmq")

START_OFFSETS_FILE = "tidelog-log-start-offsets"
PRODUCER_SNAPSHOTS_DIR = "tidelog-producer-snapshots"
PRODUCER_SNAPSHOT_INTERVAL_MS = 1000  # how often the queues are asked whether their producer state needs a snapshot
REINDEX_BATCH = 2048  # messages per IndexFile batch when recovery re-indexes from the CommitLog
INDEX_RETRY_SECONDS = 1.0  # an index that could not be written is tried again after this long
LONG_MAX = (1 << 63) - 1
FLUSH_THREADS = 8  # threads syncing ConsumeQueue files when many are dirty
_UNIT_CHECK = struct.Struct(">i8xi4xq")  # a message's TOTALSIZE, QUEUEID and QUEUEOFFSET


def _flush_queues(consume_queues: list[ConsumeQueue], root: Path) -> None:
    """Sync ConsumeQueues: from SYNC_FILESYSTEM_MIN_FILES of them with one sync of the filesystem holding the store
    `root` (filesystem_sync.py: 20,000 small files 0.2 s, against 1.0-1.2 s file by file); fewer, or where that sync
    is not available, file by file, on up to FLUSH_THREADS threads when there are many: an fdatasync leaves the GIL,
    and the filesystem commits concurrent syncs together (1,000 small files: 0.36 s one by one, 0.06 s on 8
    threads). A failed sync leaves every queue it covered dirty, to be flushed again."""
    if len(consume_queues) >= SYNC_FILESYSTEM_MIN_FILES:
        taken = [(queue, queue.unflushed()) for queue in consume_queues]
        try:
            synced = sync_filesystem(root)
        except OSError as exc:
            for queue, _ in taken:
                queue.dirty = True
            raise KafkaStorageError(f"cannot flush {len(taken)} ConsumeQueues: {exc}") from exc
        if synced:
            for queue, unflushed in taken:
                if unflushed is not None:
                    queue.flushed(unflushed)
            return
        for queue, _ in taken:
            queue.dirty = True
    if len(consume_queues) < FLUSH_THREADS:
        for consume_queue in consume_queues:
            consume_queue.flush()
        return
    with ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="tidelog-flush-cq") as pool:
        for _ in pool.map(ConsumeQueue.flush, consume_queues):
            pass  # the first failure is raised here


def _parse_store_host(text: str) -> rm.HostAddress:
    """tidelog.rocketmq.storeHost: the IPv4 address and port written into every message (and so into its id)."""
    try:
        host = rm.HostAddress.parse(text)
    except (OSError, ValueError):
        host = None
    if host is None or len(host.ip) != 4 or not 0 <= host.port <= 0xFFFF:
        raise ConfigError(
            f"config tidelog.rocketmq.storeHost: {text!r} is not an IPv4 address and port such as 10.0.0.5:10911 "
            "(messages here keep IPv4 hosts)"
        )
    return host


@dataclass(frozen=True)
class HAStatus:
    """`RocketMQEngine.ha_status`: a master's port and slaves, or a slave's master and offsets."""

    role: str
    listen_port: int | None  # a master's HA port
    slaves: list[SlaveStatus]  # a master's connected slaves
    master: SlaveHAStatus | None  # a slave's connection


class _RoundUnits:
    """A dispatch round's ConsumeQueue units as bytes, with what deciding each queue's run needs, made once."""

    __slots__ = ("batch", "breaks", "ends", "size_sums", "units")

    def __init__(self, batch: DispatchBatch) -> None:
        units = np.empty(len(batch), dtype=UNIT_DTYPE)
        units["offset"] = batch.offsets
        units["size"] = batch.sizes
        units["tags"] = batch.tags_codes
        self.batch = batch
        self.units = memoryview(units.tobytes())
        self.ends = (batch.offsets + batch.sizes).tolist()
        self.size_sums = np.concatenate([[0], np.cumsum(batch.sizes)]).tolist()
        # breaks[i]: how many of the steps up to message i are not +1 in queue offset
        self.breaks = np.concatenate([[0], np.cumsum(np.diff(batch.queue_offsets) != 1)]).tolist()

    def plan_run(self, queue: MessageQueue, start: int, stop: int, since: int) -> PlannedRun | None:
        """Messages [start, stop) of one queue, planned for the round's write (ConsumeQueue.plan_run) when they are
        consecutive queue offsets from the queue's end, none of them dispatched before nor older than the topic;
        None otherwise."""
        batch = self.batch
        if self.breaks[stop - 1] != self.breaks[start] or int(batch.offsets[start]) < since:
            return None
        unit = CQ_STORE_UNIT_SIZE
        ends = self.ends
        return queue.consume_queue.plan_run(
            int(batch.queue_offsets[start]), self.units[start * unit : stop * unit], ends[start], ends[stop - 1]
        )

    def message_bytes(self, start: int, stop: int) -> int:
        """The CommitLog bytes of messages [start, stop)."""
        return self.size_sums[stop] - self.size_sums[start]


def _write_planned_runs(planned: list[tuple[MessageQueue, PlannedRun, int]], file_handles: FileHandles) -> None:
    """Write a round's planned ConsumeQueue runs together, without the GIL where compiled (positioned_writes.py),
    then move each queue's end past its run. A run that cannot be written ends the round there: the queues before it
    keep their units, it and the later ones get theirs when the batch is dispatched again. When a path finds no
    descriptor left, half the open files are let go (as LazyFile does) and the rest is tried once more, the files
    let go written by path."""
    pieces, held = _pieces_of(planned)
    written, error = write_pieces(pieces)
    if error in (errno.EMFILE, errno.ENFILE):
        file_handles.shrink()
        pieces, held = _pieces_of(planned[written:])  # the descriptors let go close here
        more, error = write_pieces(pieces)
        written += more
    del held
    for queue, run, message_bytes in planned[:written]:
        run.consume_queue.commit_run(run)
        queue.dispatched(message_bytes)
    if error:
        path = planned[written][1].mapped_file.path
        failure = OSError(error, os.strerror(error), str(path))
        if error in (errno.EMFILE, errno.ENFILE):
            raise open_file_limit_error(path, failure) from failure
        raise KafkaStorageError(f"cannot write {path}: {failure}") from failure


def _pieces_of(planned: list[tuple[MessageQueue, PlannedRun, int]]) -> tuple[list[Piece], list[StoreFile | None]]:
    """The positioned writes of planned runs, and the open files they write through (held until written)."""
    pieces: list[Piece] = []
    held: list[StoreFile | None] = []
    for _queue, run, _message_bytes in planned:
        target, holder = run.mapped_file.write_target()
        held.append(holder)
        pieces.append((target, run.position, run.units))
    return pieces, held


class RocketMQEngine(StorageEngine):
    def __init__(
        self,
        config: EngineConfig,
        *,
        background: bool = True,
        clock: Callable[[], int] = now_ms,
        cluster_id: str | None = None,
    ) -> None:
        if len(config.log_dirs) != 1:
            raise ConfigError(
                f"config log.dirs: the RocketMQ engine keeps one store directory, got {len(config.log_dirs)}"
            )
        self.config = config
        self.store_config = config.rocketmq
        self.clock = clock
        self.root = Path(config.log_dirs[0]).resolve()
        self.log_dirs = [self.root]
        self.store_host = _parse_store_host(self.store_config.store_host)
        self.unique_ids = rm.UniqueIdGenerator(self.store_host.ip)
        self._lock = threading.RLock()  # topics and queues
        self._closed = False
        self.read_ahead = ReadAhead(self.store_config.read_ahead_queues)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_store(self.root)
        try:
            self._open(background, cluster_id)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open(self, background: bool, expected_cluster_id: str | None) -> None:
        store = self.store_config
        self.clean_start = take_abort_file(self.root)
        self.checkpoint = StoreCheckpoint(self.root / CHECKPOINT_FILE)
        self.allocator = AllocateMappedFileService(background=background)
        self.commitlog = CommitLog(self.root, store.maped_file_size_commit_log, allocator=self.allocator)
        self.commitlog.load()
        for directory in (self.commitlog.directory, self.root / CONSUME_QUEUE_DIR):
            directory.mkdir(exist_ok=True)  # created at start, as RocketMQ does: they mark the store
        self.queues: dict[tuple[str, int], MessageQueue] = {}
        self.file_handles = FileHandles(capacity_for_limit())  # the open ConsumeQueue files (file_handles.py)
        self.registry = TopicRegistry([self.root])
        self.registry.load(damaged_is_fatal=True, check_configs=self._log_config_for)
        self.cluster_id = self.registry.cluster_id or expected_cluster_id or new_kafka_uuid()
        if expected_cluster_id is not None and self.cluster_id != expected_cluster_id:
            raise KafkaStorageError(
                f"the store belongs to cluster {self.cluster_id} ({TOPICS_FILE}), but ZooKeeper's cluster is "
                f"{expected_cluster_id}: zookeeper.connect names another cluster, or log.dirs another broker's data"
            )
        self.registry.publish()
        for directory in (self.root / CONSUME_QUEUE_DIR, self.root / PRODUCER_SNAPSHOTS_DIR):
            if directory.is_dir():
                finish_deletions(directory)
        start_offsets = self._read_start_offsets()
        for topic, record in self.registry.topics.items():
            for queue_id in record.held():
                self._open_queue(topic, queue_id, start_floor=start_offsets.get((topic, queue_id), 0))
        self._report_foreign_queues()
        if not self.clean_start:
            log.warning("%s: the abort file is present - the last run did not shut down cleanly", self.root)
        torn = len(self.commitlog.queue.extended) + sum(q.consume_queue.torn for q in self.queues.values())
        if torn:
            log.warning("%s: %d store file(s) were found short; recovering as after a crash", self.root, torn)
            self.clean_start = False
        self.index: IndexService | None = None
        self._index_behind_from: int | None = None  # re-index from this CommitLog offset before the next batch
        self._index_error: BaseException | None = None  # why the index could not be written, while it cannot
        self._index_retry_at = 0.0
        if store.message_index_enable:
            self.index = IndexService(
                self.root / INDEX_DIR,
                store.max_hash_slot_num,
                store.max_index_num,
                on_file_full=self._index_file_flushed,
                clock=self.clock,
            )
            self.index.load(
                clean_shutdown=self.clean_start, index_checkpoint_timestamp=self.checkpoint.index_msg_timestamp
            )
        self.dispatcher = ReputMessageService(
            self.commitlog, self._reput_end_offset, self._dispatch_targets(), background=background
        )
        self.role = store.broker_role
        if self.role != MASTER_ROLES[0] and not store.ha_enable:
            raise ConfigError(f"config tidelog.rocketmq.brokerRole: {self.role} needs tidelog.rocketmq.haEnable=true")
        self.replica: ReplicaLog | None = None
        self.ha_service: HAService | None = None
        self.ha_client: HAClient | None = None
        self.recovery = self._recover()
        self.flusher = CommitLogFlusher(
            self.commitlog,
            sync_flush=store.sync_flush,
            background=background,
            interval_ms=store.flush_interval_commit_log,
            least_pages=store.flush_commit_log_least_pages,
            thorough_interval_ms=store.flush_commit_log_thorough_interval,
            sync_flush_timeout_ms=store.sync_flush_timeout,
            on_flushed=self._commitlog_flushed,
        )
        self.retention = CleanCommitLogService(self)
        self._last_thorough_cq_flush = time.monotonic()
        self.flusher.start()
        self.dispatcher.start()
        if store.ha_enable:
            if self.role != SLAVE:
                self._serve_slaves()
            elif store.ha_master_address or not self.config.replicated:
                self._follow(store.ha_master_address)
            # else: a slave in a cluster, whose broker calls become_slave once ZooKeeper names its master
        self.scheduler = Scheduler("tidelog-rocketmq-scheduler") if background else None
        self.deleter = DirectoryDeleter(self.scheduler, self.config.log_defaults.file_delete_delay_ms)
        if self.scheduler is not None:
            self.scheduler.schedule(
                "flush consume queues", self._scheduled_consume_queue_flush, store.flush_interval_consume_queue,
                store.flush_interval_consume_queue,
            )  # fmt: skip
            self.scheduler.schedule(
                "flush checkpoint", self.checkpoint.flush, store.flush_checkpoint_interval,
                store.flush_checkpoint_interval,
            )  # fmt: skip
            self.scheduler.schedule(
                "clean expired files", self.retention.run, store.clean_resource_interval,
                store.clean_resource_interval,
            )  # fmt: skip
            self.scheduler.schedule(
                "snapshot producer state", self._snapshot_producer_states, PRODUCER_SNAPSHOT_INTERVAL_MS,
                PRODUCER_SNAPSHOT_INTERVAL_MS,
            )  # fmt: skip

    @property
    def compacts_topics(self) -> bool:
        return False  # the CommitLog holds every topic; nothing rewrites it

    def producer_snapshot_dir(self, topic: str, queue_id: int) -> Path:
        return self.root / PRODUCER_SNAPSHOTS_DIR / f"{topic}-{queue_id}"

    def _snapshot_producer_states(self, *, force: bool = False) -> None:
        """Snapshot the idempotent-producer state of the queues that moved on enough (all that moved: `force`)."""
        for queue in list(self.queues.values()):
            try:
                queue.snapshot_producer_state(force=force)
            except OSError as exc:  # the log still has it all: a restart replays from an older snapshot
                log.warning("%s: cannot snapshot the producer state: %s", queue.name, exc.strerror or exc)

    def _dispatch_targets(self) -> list[Dispatcher]:
        """The dispatch chain (CommitLogDispatcher list): each gets every dispatched batch of messages, in order.
        The IndexFile builder is the second (CommitLogDispatcherBuildIndex), with messageIndexEnable."""
        targets: list[Dispatcher] = [self._build_consume_queues]
        return targets + ([self._build_index] if self.index is not None else [])

    # --- topics file and start offsets ----------------------------------------------------------------------------

    def _save_topics_file(self) -> None:
        self.registry.cluster_id = self.cluster_id
        self.registry.save()

    def _read_start_offsets(self) -> dict[tuple[str, int], int]:
        try:
            return read_offset_checkpoint(self.root / START_OFFSETS_FILE)
        except CorruptCheckpointError as exc:
            log.warning("%s; log start offsets fall back to the ConsumeQueues' minimums", exc)
            return {}

    def save_start_offsets(self) -> None:
        with self._lock:
            floors = {key: q.start_floor for key, q in self.queues.items() if q.start_floor > 0}
        write_offset_checkpoint(self.root / START_OFFSETS_FILE, floors)

    def _report_foreign_queues(self) -> None:
        directory = self.root / CONSUME_QUEUE_DIR
        if directory.is_dir():
            for topic_dir in directory.iterdir():
                if topic_dir.name not in self.registry:
                    log.warning("%s: topic %s is not in %s; leaving it alone", directory, topic_dir.name, TOPICS_FILE)

    def _open_queue(self, topic: str, queue_id: int, *, start_floor: int = 0) -> MessageQueue:
        consume_queue = ConsumeQueue(
            self.root,
            topic,
            queue_id,
            consume_queue_file_size(self.store_config.maped_file_size_consume_queue),
            self.file_handles,
        )
        consume_queue.load()
        queue = MessageQueue(
            self, topic, queue_id, consume_queue, self._log_config_for(self.registry.topics[topic].configs),
            start_floor=start_floor,
        )  # fmt: skip
        self.queues[(topic, queue_id)] = queue
        return queue

    def _log_config_for(self, overrides: Mapping[str, Any]) -> LogConfig:
        return self.config.log_defaults.with_overrides(overrides)

    # --- recovery ---------------------------------------------------------------------------------------------

    def _recover(self) -> RecoveryResult:
        commitlog = self.commitlog
        dispatched_end = max((q.consume_queue.max_physic_offset for q in self.queues.values()), default=-1)
        if self.clean_start:
            start = commitlog.start_for_normal_recovery(max(dispatched_end, 0))
        else:
            start = commitlog.start_for_abnormal_recovery(self.checkpoint.min_timestamp())
            # a CommitLog file found short is scanned whatever the checkpoint says
            start = min([start] + [f.file_from_offset for f in commitlog.queue.extended])
        result = commitlog.recover(start, check_crc=self.store_config.check_crc_on_recover)
        redispatch_from = result.end
        for queue in self.queues.values():
            consume_queue = queue.consume_queue
            consume_queue.truncate_dirty_logic_files(result.end)
            consume_queue.correct_min_offset(commitlog.min_offset)
            if not self.clean_start and (self._drop_units_not_in_commitlog(queue) or consume_queue.torn):
                # units were lost: dispatch again from the end of the last one kept
                redispatch_from = min(redispatch_from, max(consume_queue.max_physic_offset, commitlog.min_offset))
        if self.clean_start:
            dispatched_end = max((q.consume_queue.max_physic_offset for q in self.queues.values()), default=-1)
            reput_from = min(max(dispatched_end, start), result.end)
        else:
            reput_from = min(start, redispatch_from)
        self.dispatcher.reput_from_offset = max(reput_from, commitlog.min_offset)
        if self.index is not None:
            self.index.drop_beyond(result.end)
            # from the last message the kept files index (a message boundary; it is skipped as already indexed)
            self._index_behind_from = self.index.last_indexed_offset
            with self.index.lock:
                self._index_up_to(self.dispatcher.reput_from_offset, None)
        redispatched = self.dispatcher.catch_up()
        for queue in self.queues.values():
            if queue.consume_queue.max_offset < queue.start_floor:
                # the CommitLog was cut below the queue's DeleteRecords floor: the queue goes on, empty, at the
                # floor (as a Kafka log does); offsets below it were handed out before and are never reused
                queue.consume_queue.restart_at(queue.start_floor)
            queue.next_offset = queue._flushed = max(queue.consume_queue.max_offset, queue.start_floor)
            queue.producer_state.delete_snapshots_after(queue.consume_queue.max_offset)
        log.info(
            "%s: %s recovery scanned CommitLog %d..%d (%d messages), re-dispatched %d%s",
            self.root,
            "normal" if self.clean_start else "abnormal",
            result.start,
            result.end,
            result.messages,
            redispatched,
            f"; cut {result.truncated_bytes} bytes: {result.reason}" if result.truncated_bytes else "",
        )
        return result

    def _drop_units_not_in_commitlog(self, queue: MessageQueue) -> bool:
        """After a crash: drop the queue's last units while they do not name the message at their CommitLog offset
        (size, queue id and queue offset) - a unit torn in its size field still looks valid. Returns whether any
        went."""
        consume_queue = queue.consume_queue
        dropped = 0
        while consume_queue.max_offset > consume_queue.min_offset:
            queue_offset = consume_queue.max_offset - 1
            unit = consume_queue.unit_at(queue_offset)
            if unit is not None:
                head = self.commitlog.read(unit[0], _UNIT_CHECK.size)
                if len(head) == _UNIT_CHECK.size:
                    total_size, queue_id, message_queue_offset = _UNIT_CHECK.unpack(head)
                    if (total_size, queue_id, message_queue_offset) == (unit[1], queue.queue_id, queue_offset):
                        break
            consume_queue.cut_to(queue_offset)
            dropped += 1
        if dropped:
            log.warning(
                "%s: dropped %d unit(s) at the end of %s that do not name their message", self.root, dropped, queue.name
            )
        return dropped > 0

    def _reindex(self, start: int, end: int) -> None:
        """Index the messages in [start, end) that dispatching will not see again (IndexFiles dropped at load)."""
        assert self.index is not None
        batch = []
        for item in self.commitlog.iter_dispatch(max(start, self.commitlog.min_offset), end):
            batch.append(item)
            if len(batch) >= REINDEX_BATCH:
                build_index(self.index, DispatchBatch.from_infos(batch))
                batch = []
        if batch:
            build_index(self.index, DispatchBatch.from_infos(batch))

    # --- the dispatch chain -------------------------------------------------------------------------------------

    def _build_index(self, batch: DispatchBatch) -> None:
        """CommitLogDispatcherBuildIndex. The index is derived data, built after the message is stored: when it
        cannot be written (a full disk) the message stays stored and readable - its produce succeeded, and a
        retry would store it twice - the failure is logged at ERROR, and the index catches up from the CommitLog
        on a batch at least INDEX_RETRY_SECONDS later, on a key lookup, or at the next start."""
        assert self.index is not None
        with self.index.lock:
            if self._index_error is not None and time.monotonic() < self._index_retry_at:
                return
            self._index_up_to(int(batch.offsets[0]), batch)

    def _index_up_to(self, end: int, batch: DispatchBatch | None) -> None:
        """Index what the index misses below `end` (when behind), then `batch`, which starts at `end`. The caller
        holds the index lock."""
        assert self.index is not None
        try:
            if self._index_behind_from is not None:
                self._reindex(self._index_behind_from, end)
            if batch is not None:
                build_index(self.index, batch)
        except (KafkaStorageError, OSError) as exc:
            if self._index_error is None:
                log.error(
                    "%s: the key index cannot be written (%s); messages from CommitLog offset %d on are stored and "
                    "readable but not yet indexed - indexing catches up once the index can be written again",
                    self.root, getattr(exc, "strerror", None) or exc, self.index.rebuild_from,
                )  # fmt: skip
            self._index_error = exc
            self._index_behind_from = self.index.last_indexed_offset  # a message boundary, skipped as indexed
            self._index_retry_at = time.monotonic() + INDEX_RETRY_SECONDS
            return
        if self._index_error is not None:
            log.warning("%s: the key index caught up with the CommitLog", self.root)
        self._index_error = None
        self._index_behind_from = None

    def _catch_up_index(self) -> None:
        """A key lookup needs the whole index now: index what it misses of the dispatched messages, or raise."""
        assert self.index is not None
        with self.index.lock:
            if self._index_behind_from is None:
                return
            self._index_up_to(self.dispatcher.reput_from_offset, None)
            if self._index_error is not None:
                raise KafkaStorageError(
                    f"{self.root}: the key index misses the messages from CommitLog offset {self.index.rebuild_from} "
                    f"on and cannot be written: {self._index_error}"
                )

    def _reput_end_offset(self) -> int:
        """Where the dispatcher may read to: under SYNC_FLUSH only what is on disk (confirmOffset); on a slave only
        up to the last whole Kafka batch received."""
        end = self.commitlog.flushed_where if self.store_config.sync_flush else self.commitlog.max_offset
        replica = self.replica
        return end if replica is None else min(end, replica.complete_end)

    def _build_consume_queues(self, batch: DispatchBatch) -> None:
        """CommitLogDispatcherBuildConsumeQueue: one unit per message, the units of each queue written in order in
        one put (prepared and rolled-back transactions are not dispatched). A round with many queues (one append
        each at 1,000 partitions) makes the unit bytes, run sizes and order checks once for all of them, and writes
        their units in one call after planning them (_write_planned_runs)."""
        runs: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for run in batch.runs:
            runs.setdefault((run.topic, run.queue_id), []).append((run.start, run.stop))
        dispatched = None
        if np.count_nonzero(batch.sys_flags):
            transaction = batch.sys_flags & rm.SYSFLAG_TRANSACTION_MASK
            dispatched = (transaction != rm.SYSFLAG_TRANSACTION_PREPARED) & (
                transaction != rm.SYSFLAG_TRANSACTION_ROLLBACK
            )
        round_units = _RoundUnits(batch) if dispatched is None and len(runs) > 1 else None
        planned: list[tuple[MessageQueue, PlannedRun, int]] = []  # written together after the loop
        with self._lock:
            for key, spans in runs.items():
                queue = self.queues.get(key)
                if queue is None:
                    continue  # a deleted topic
                since = self.registry.topics[key[0]].since
                try:
                    if round_units is not None and len(spans) == 1:
                        planned_run = round_units.plan_run(queue, *spans[0], since)
                        if planned_run is not None:
                            planned.append((queue, planned_run, round_units.message_bytes(*spans[0])))
                            continue
                    rows: slice | np.ndarray = (
                        slice(*spans[0]) if len(spans) == 1 else np.concatenate([np.arange(*span) for span in spans])
                    )
                    columns = [
                        batch.offsets[rows], batch.sizes[rows], batch.tags_codes[rows], batch.queue_offsets[rows]
                    ]  # fmt: skip
                    # a message of a topic deleted and created again after it is not the new topic's
                    if dispatched is not None or columns[0][0] < since:
                        chosen = columns[0] >= since
                        if dispatched is not None:
                            chosen &= dispatched[rows]
                        if not np.count_nonzero(chosen):
                            continue
                        columns = [column[chosen] for column in columns]
                    queue.dispatched(queue.consume_queue.put(*columns))
                except (KafkaStorageError, OSError):
                    queue.forget_size()  # some units may be in: count again when asked
                    raise
            if planned:
                _write_planned_runs(planned, self.file_handles)
            if self.replica is not None:
                transactional = None if batch.flags is None else (batch.flags & TXN_ATTRIBUTES) != 0
                for key, spans in runs.items():
                    following = self.queues.get(key)
                    if following is not None:
                        if (
                            transactional is not None
                            and not following.has_transactions
                            and any(transactional[start:stop].any() for start, stop in spans)
                        ):
                            following.holds_transactions()
                        following.follow_dispatched_end()

    def catch_up(self) -> int:
        """Dispatch what the CommitLog holds beyond the queues now (a reader wants its own writes)."""
        return self.dispatcher.catch_up()

    def appended(self) -> None:
        """An append is in the CommitLog: under ASYNC_FLUSH it may be dispatched now."""
        if not self.store_config.sync_flush:
            self._dispatch_soon()
        if self.ha_service is not None:
            self.ha_service.notify_appended()

    def _commitlog_flushed(self, store_timestamp: int) -> None:
        """A flush moved: under SYNC_FLUSH what it covers may be dispatched now."""
        if store_timestamp:
            self.checkpoint.physic_msg_timestamp = store_timestamp
        if self.store_config.sync_flush:
            self._dispatch_soon()

    def _dispatch_soon(self) -> None:
        """Wake the dispatcher thread, or dispatch inline without threads."""
        if self.dispatcher.threaded:
            self.dispatcher.wakeup()
        else:
            self.dispatcher.catch_up()

    def _index_file_flushed(self, end_timestamp: int) -> None:
        """A full IndexFile is on disk: recovery after a crash keeps the files up to it (indexMsgTimestamp)."""
        self.checkpoint.index_msg_timestamp = max(self.checkpoint.index_msg_timestamp, end_timestamp)

    def flush_consume_queues(self) -> None:
        """A full FlushConsumeQueueService round: sync every ConsumeQueue, then move the checkpoint's logics
        timestamp to the last message dispatched before the sync started."""
        timestamp = self.dispatcher.last_store_timestamp
        dispatched = self.dispatcher.reput_from_offset
        with self._lock:
            queues = list(self.queues.values())
        _flush_queues([queue.consume_queue for queue in queues if queue.consume_queue.dirty], self.root)
        self._last_thorough_cq_flush = time.monotonic()
        if timestamp:
            self.checkpoint.logics_msg_timestamp = timestamp
        self.checkpoint.confirm_phy_offset = dispatched

    def _scheduled_consume_queue_flush(self) -> None:
        """Every flushIntervalConsumeQueue: sync the queues with at least flushConsumeQueueLeastPages dirty pages;
        every flushConsumeQueueThoroughInterval all of them (only a full round may move the checkpoint)."""
        store = self.store_config
        if (time.monotonic() - self._last_thorough_cq_flush) * 1000 >= store.flush_consume_queue_thorough_interval:
            self.flush_consume_queues()
            return
        least_bytes = max(1, store.flush_consume_queue_least_pages * OS_PAGE_SIZE)
        with self._lock:
            queues = list(self.queues.values())
        _flush_queues([q.consume_queue for q in queues if q.consume_queue.unflushed_bytes >= least_bytes], self.root)

    def delete_derived_files(self, commitlog_min_offset: int) -> None:
        """CleanConsumeQueueService: after CommitLog files went, cut what points into them (the IndexFile's
        deletion joins here)."""
        with self._lock:
            queues = list(self.queues.values())
        for queue in queues:
            queue.consume_queue.delete_expired_files(commitlog_min_offset)
            queue.forget_size()
        if self.index is not None:
            self.index.delete_expired_files(commitlog_min_offset)

    def read_runs(self, physical_offsets: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """CommitLog.read_runs for a queue's units: the messages of the first one's file."""
        try:
            found = self.commitlog.read_runs(physical_offsets, sizes)
        except (ValueError, OSError):  # the file was closed or deleted under us
            found = None
        if found is None:
            raise OffsetOutOfRangeError(f"CommitLog offset {int(physical_offsets[0])} was deleted by retention")
        return found

    def read_message(self, physical_offset: int, size: int) -> rm.Message:
        """The message at a CommitLog offset (a ConsumeQueue unit), without a CRC check."""
        mapped_file = self.commitlog.queue.find(physical_offset)
        if mapped_file is None or mapped_file.map is None:
            raise OffsetOutOfRangeError(f"CommitLog offset {physical_offset} was deleted by retention")
        position = physical_offset - mapped_file.file_from_offset
        try:
            message = rm.decode_message(mapped_file.map, position, check_crc=False)
        except rm.InvalidMessage as exc:
            raise KafkaStorageError(f"CommitLog offset {physical_offset}: {exc.reason}") from None
        if isinstance(message, rm.Blank) or message.total_size != size:
            raise KafkaStorageError(f"CommitLog offset {physical_offset} holds no message of {size} bytes")
        return message

    # --- key lookup ---------------------------------------------------------------------------------------------

    def lookup_key(self, topic: str, key: bytes, *, max_results: int = 64) -> list[KeyLocation]:
        """Records of `topic` whose Kafka key (or RocketMQ KEYS entry) is `key`, newest first, through the
        IndexFile (IndexService.queryOffset); each candidate is read from the CommitLog and kept only when its
        topic and key match and it is still readable in its queue (the index keeps 4-byte hashes)."""
        if self.index is None:
            raise KeyIndexDisabledError(
                "the RocketMQ engine keeps no index with tidelog.rocketmq.messageIndexEnable=false"
            )
        since = self.registry.get(topic).since
        self.catch_up()
        self._catch_up_index()
        indexed = rm.index_key(key)
        candidates = self.index.query_offsets(
            topic, indexed, max_results, 0, LONG_MAX, max_msgs_num_batch=max_results
        ).phy_offsets
        found: list[KeyLocation] = []
        for offset in dict.fromkeys(candidates):
            message = self._message_at(offset)
            if message is None or message.topic != topic or offset < since:
                continue
            if indexed not in message_index_keys(message.properties_bytes):
                continue
            queue = self.queues.get((topic, message.queue_id))
            if queue is None or not queue.log_start_offset <= message.queue_offset < queue.high_watermark:
                continue
            found.append(KeyLocation(message.queue_id, message.queue_offset, message.born_timestamp))
        found.sort(key=lambda location: (location.timestamp, location.offset), reverse=True)
        return found[:max_results]

    def _message_at(self, physical_offset: int) -> rm.Message | None:
        if not self.commitlog.min_offset <= physical_offset < self.commitlog.max_offset:
            return None
        head = self.commitlog.read(physical_offset, 4)
        if len(head) < 4:
            return None
        try:
            return self.read_message(physical_offset, int.from_bytes(head, "big", signed=True))
        except (KafkaStorageError, OffsetOutOfRangeError):
            return None

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
            check_partition_budget(name, count if held is None else len(held), len(self.queues), "queues")
            since = self.commitlog.max_offset  # no message of the new topic can be older
            stale = self.root / CONSUME_QUEUE_DIR / name
            self.deleter.delete_later(stale)  # queues of a topic not in the topics file (reported at start)
            for queue_id in range(count):
                self.deleter.delete_later(self.producer_snapshot_dir(name, queue_id))
            record = self.registry.add(name, count, overrides, since=since, topic_id=topic_id, local=held)
            for queue_id in record.held():
                self._open_queue(name, queue_id)
            self._save_topics_file()
            return self.registry.describe(name)

    def delete_topic(self, name: str) -> None:
        """The topic's ConsumeQueues go; its messages stay in the CommitLog until retention (as in RocketMQ)."""
        with self._lock:
            self._check_open()
            record = self.registry.remove(name)
            for queue_id in record.held():
                queue = self.queues.pop((name, queue_id))
                queue.closed = queue.deleted = True
                self.read_ahead.forget(queue)
                queue.consume_queue.close()
                self.deleter.delete_later(queue.producer_state.directory)
            self.deleter.delete_later(self.root / CONSUME_QUEUE_DIR / name)
            self._save_topics_file()
            self.save_start_offsets()

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
            check_partition_budget(
                name, total - record.partitions if held is None else len(held), len(self.queues), "queues"
            )
            for queue_id in range(record.partitions, total) if held is None else held:
                self._open_queue(name, queue_id)
            if held is not None:
                record.local = [*record.held(), *held]
            record.partitions = total
            self._save_topics_file()

    def hold_partitions(self, name: str, local_partitions: Collection[int]) -> None:
        with self._lock:
            record = self.registry.get(name)
            if sorted(set(local_partitions)) == list(record.held()):
                return
        raise InvalidReplicaAssignmentError(
            f"topic {name}: the RocketMQ engine cannot move partition replicas between brokers (each queue has one "
            "replica, whose records live in this broker's CommitLog); use the Kafka engine to reassign partitions"
        )

    def alter_topic_configs(self, name: str, configs: Mapping[str, Any]) -> None:
        with self._lock:
            record = self.registry.get(name)
            new_config = self._log_config_for(configs)
            record.configs = {k: str(v) for k, v in configs.items()}
            for queue_id in record.held():
                self.queues[(name, queue_id)].config = new_config
            self._save_topics_file()

    def set_log_defaults(self, defaults: LogConfig) -> None:
        with self._lock:
            records = {name: self.registry.get(name) for name in self.registry.descriptions()}
            configs = {name: defaults.with_overrides(record.configs) for name, record in records.items()}
            self.config = replace(self.config, log_defaults=defaults)
            for name, record in records.items():
                for queue_id in record.held():
                    self.queues[(name, queue_id)].config = configs[name]

    def topics(self) -> dict[str, TopicDescription]:
        return self.registry.descriptions()

    # --- data -------------------------------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> MessageQueue:
        try:
            return self.queues[(topic, partition)]
        except KeyError:
            self._check_open()
            raise self.registry.unknown_partition(topic, partition) from None

    def partitions(self) -> dict[tuple[str, int], MessageQueue]:
        return dict(self.queues)

    def check_writable(self) -> None:
        """Refuse appends while the disk is over diskSpaceWarningLevelRatio (RocketMQ's 'disk full')."""
        if self.retention.disk_full:
            raise KafkaStorageError(
                f"{self.root}: the disk is {self.retention.disk_usage_ratio:.0f}% full, above "
                f"tidelog.rocketmq.diskSpaceWarningLevelRatio={self.store_config.disk_space_warning_level_ratio}; "
                "writes are refused until retention frees space"
            )

    def flush(self, topic: str | None = None, partition: int | None = None) -> None:
        """Flush the CommitLog (it holds every queue); a whole-store flush also syncs the ConsumeQueues."""
        self._check_open()
        self.flusher.flush_now()
        if topic is None:
            self.dispatcher.catch_up()
            self.flush_consume_queues()
            if self.index is not None:
                self.index.flush()
            self.checkpoint.flush()

    # --- master/slave replication -------------------------------------------------------------------------------

    def _serve_slaves(self) -> None:
        store = self.store_config
        try:
            self.ha_service = HAService(
                self.commitlog,
                host=store.ha_listen_host,
                port=store.ha_listen_port,
                heartbeat_interval_ms=store.ha_send_heartbeat_interval,
                housekeeping_interval_ms=store.ha_housekeeping_interval,
                transfer_batch_size=store.ha_transfer_batch_size,
                slave_fallbehind_max=store.ha_slave_fallbehind_max,
            )
        except OSError as exc:
            raise ConfigError(
                f"config tidelog.rocketmq.haListenPort: cannot listen on {store.ha_listen_host}:{store.ha_listen_port}"
                f" ({exc.strerror or exc})"
            ) from exc
        self.ha_service.start()

    def _cut_half_received(self, replica: ReplicaLog, why: str) -> None:
        """A transfer can end inside a message: a store that stops following its master (promoted, or following
        another) keeps its CommitLog only up to the end of the last whole Kafka batch received, as recovery after a
        crash does; what follows was never dispatched."""
        with self.commitlog.put_lock:
            if self.commitlog.max_offset > replica.complete_end:
                log.warning(
                    "%s: %s with a Kafka batch half received: the CommitLog is cut from %d to %d",
                    self.root, why, self.commitlog.max_offset, replica.complete_end,
                )  # fmt: skip
                self.commitlog.queue.truncate_dirty_files(replica.complete_end)

    def _follow(self, master_address: str) -> None:
        store = self.store_config
        if not master_address:
            raise ConfigError("config tidelog.rocketmq.haMasterAddress: a SLAVE needs its master's host:port")
        self.replica = ReplicaLog(self.commitlog, self._dispatch_soon)
        self.ha_client = HAClient(
            master_address,
            self.replica,
            transfer_batch_size=store.ha_transfer_batch_size,
            heartbeat_interval_ms=store.ha_send_heartbeat_interval,
            housekeeping_interval_ms=store.ha_housekeeping_interval,
        )
        self.ha_client.start()

    def master_slave(self) -> RocketMQEngine | None:
        return self if self.store_config.ha_enable else None

    @property
    def commitlog_end(self) -> int:
        return self.commitlog.max_offset

    def slave_available(self) -> bool:
        service = self.ha_service
        return service is not None and service.is_slave_ok(self.commitlog.max_offset)

    def wait_queue_replicated(self, topic: str, partition: int, end_offset: int) -> None:
        self.partition(topic, partition).wait_replicated(end_offset)

    @property
    def ha_port(self) -> int | None:
        """The port a master listens on for slaves (haListenPort, or the one chosen for 0)."""
        return self.ha_service.port if self.ha_service is not None else None

    def replicated_offset(self) -> int:
        """The highest CommitLog offset a slave reported (a master's push2SlaveMaxOffset; 0 without HA)."""
        return self.ha_service.push_to_slave_max_offset if self.ha_service is not None else 0

    def wait_replicated(self, commitlog_offset: int) -> None:
        """SYNC_MASTER: wait until a slave holds the CommitLog up to `commitlog_offset` (ha_master.HAService);
        other roles return at once."""
        if self.role != SYNC_MASTER:
            return
        service = self.ha_service
        if service is None:
            raise SlaveNotAvailableError("the HA service is stopped")
        service.wait_replicated(commitlog_offset, self.store_config.sync_flush_timeout)

    def ha_status(self) -> HAStatus:
        service, client = self.ha_service, self.ha_client
        return HAStatus(
            self.role,
            service.port if service is not None else None,
            service.status() if service is not None else [],
            client.status() if client is not None else None,
        )

    def _check_ha(self) -> None:
        self._check_open()
        if not self.store_config.ha_enable:
            raise ConfigError("config tidelog.rocketmq.haEnable: role switches need master/slave replication on")

    def become_master(self, role: str = MASTER_ROLES[0]) -> None:
        """Promote (or re-role) this store: stop following, cut a half-received Kafka batch at the CommitLog's end
        (nothing a whole batch wrote goes), dispatch everything received, continue every queue from its end, and
        listen for slaves."""
        if role not in MASTER_ROLES:
            raise ConfigError(f"become_master: {role!r} is not one of {', '.join(MASTER_ROLES)}")
        self._check_ha()
        if self.ha_client is not None:
            self.ha_client.shutdown()
            self.ha_client = None
        replica = self.replica
        if replica is not None:
            self._cut_half_received(replica, "promoted")
            self.flusher.flush_now()
            self.dispatcher.catch_up()
            self.replica = None
        with self.commitlog.put_lock:
            if replica is not None:
                with self._lock:
                    for queue in self.queues.values():
                        queue.take_over()
            self.role = role
        if self.ha_service is None:
            self._serve_slaves()
        log.info("%s: now %s at CommitLog offset %d", self.root, role, self.commitlog.max_offset)

    def become_slave(self, master_address: str, truncate_to: int | None = None) -> None:
        """Demote this store (or point a slave at another master): refuse puts from now on, stop serving slaves
        (puts waiting for one fail), stop following, cut a half-received Kafka batch at the CommitLog's end (the
        next master sends it again from the last whole one), cut the CommitLog at `truncate_to` when it goes past it
        (`truncate`), and follow `master_address` from its end."""
        self._check_ha()
        with self.commitlog.put_lock:
            self.role = SLAVE
        if self.ha_service is not None:
            self.ha_service.shutdown()
            self.ha_service = None
        if self.ha_client is not None:
            self.ha_client.shutdown()
            self.ha_client = None
        if self.replica is not None:
            self._cut_half_received(self.replica, "following another master")
        if truncate_to is not None and truncate_to < self.commitlog.max_offset:
            self.truncate(truncate_to)
        self._follow(master_address)
        log.info("%s: now SLAVE of %s from CommitLog offset %d", self.root, master_address, self.commitlog.max_offset)

    def topic_creation_offsets(self) -> dict[str, tuple[str, int]]:
        """Each topic's id and the CommitLog offset it was created at in this store."""
        with self._lock:
            return {name: (record.topic_id, record.since) for name, record in self.registry.topics.items()}

    def dispatch_topic_from(self, name: str, since: int) -> int:
        """A topic this SLAVE created after its master's messages of it arrived (the master created it at CommitLog
        offset `since`, below this store's own creation offset): lower its creation offset to `since` and dispatch
        its messages already received into its queues again, with dispatching held; returns how many."""
        with self._lock:
            record = self.registry.topics.get(name)
            if record is None or since >= record.since:
                return 0
        dispatched = 0

        def redispatch() -> None:
            nonlocal dispatched
            with self.commitlog.put_lock, self._lock:
                record.since = since
                self._save_topics_file()
                for queue_id in record.held():  # units dispatched since this store created it go, to come again
                    queue = self.queues[(name, queue_id)]
                    queue.consume_queue.restart_at(0)
                    queue.truncated()
            end = self.dispatcher.reput_from_offset
            items = [
                item for item in self.commitlog.iter_dispatch(max(since, self.commitlog.min_offset), end)
                if item[1].topic == name
            ]  # fmt: skip
            if items:
                self._build_consume_queues(DispatchBatch.from_infos(items))
            dispatched = len(items)

        self.dispatcher.hold(redispatch)
        if dispatched:
            log.info("%s: topic %s: dispatched %d messages received before it was created here", self.root, name,
                     dispatched)  # fmt: skip
        return dispatched

    def truncate(self, offset: int) -> None:
        """Cut a SLAVE's CommitLog at `offset` (a message boundary: where its new master's epoch began, which this
        store's extra records never reached) as recovery cuts it: every file after it goes, the one holding it is
        zeroed after it and synced, ConsumeQueue units pointing at or past it are dropped, producer snapshots past
        each queue's new end deleted and the state rebuilt at its next use, IndexFiles indexing past it dropped
        and what they held below it indexed again, and dispatching resumes at `offset`."""
        if self.role != SLAVE or self.ha_client is not None:
            raise ConfigError("truncate: only a SLAVE that is not following a master may be cut")
        self.dispatcher.catch_up()

        def cut() -> None:
            with self.commitlog.put_lock, self._lock:
                dropped = self.commitlog.max_offset - offset
                self.commitlog.queue.truncate_dirty_files(offset)
                last = self.commitlog.queue.last_file
                if last is not None:
                    os.fdatasync(last.fd)  # the zeroed tail must not come back after a crash
                for queue in self.queues.values():
                    queue.consume_queue.truncate_dirty_logic_files(offset)
                    queue.producer_state.delete_snapshots_after(queue.consume_queue.max_offset)
                    queue.truncated()
                if self.index is not None:
                    with self.index.lock:
                        self.index.drop_beyond(offset)
                        self._index_behind_from = self.index.last_indexed_offset
                        self._index_up_to(offset, None)
                log.warning(
                    "%s: CommitLog cut from %d to %d (%d bytes the new master does not hold)",
                    self.root, offset + dropped, offset, dropped,
                )  # fmt: skip

        self.dispatcher.hold(cut, rewind_to=offset)

    # --- shutdown ---------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("the store is closed")

    def close(self) -> None:
        """A clean shutdown: flush the CommitLog, dispatch all of it, sync the queues and the checkpoint, then
        remove `abort` (kept if something could not be flushed or dispatched)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for queue in self.queues.values():
                queue.closed = True
        self.read_ahead.close()
        clean = True
        try:
            if self.ha_client is not None:
                self.ha_client.shutdown()
            if self.ha_service is not None:
                self.ha_service.shutdown()
            if self.scheduler is not None:
                self.scheduler.shutdown(run_pending_one_shots=False)
            self.deleter.close()
            self.flusher.shutdown()
            self.dispatcher.shutdown()
            self.dispatcher.catch_up()
            self.flush_consume_queues()
            self._snapshot_producer_states(force=True)
            if self.index is not None:
                self.index.flush()
            self.checkpoint.physic_msg_timestamp = self.commitlog.last_store_timestamp or (
                self.checkpoint.physic_msg_timestamp
            )
            self.checkpoint.flush()
            if self.dispatcher.behind_bytes:
                log.error(
                    "%s: %d bytes not dispatched; keeping the abort file", self.root, self.dispatcher.behind_bytes
                )
                clean = False
        except KafkaStorageError as exc:
            log.error("%s: shutdown could not flush (%s); keeping the abort file", self.root, exc)
            clean = False
        finally:
            self.allocator.shutdown()
            for queue in self.queues.values():
                queue.consume_queue.close()
            if self.index is not None:
                self.index.close()
            self.commitlog.close()
            self.checkpoint.close()
            if clean:
                remove_abort_file(self.root)
            os.close(self._lock_fd)
