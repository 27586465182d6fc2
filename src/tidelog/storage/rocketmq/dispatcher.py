"""The dispatcher (RocketMQ's ReputMessageService): follows the CommitLog from `reput_from_offset` and hands every
message to the dispatch chain (build ConsumeQueue, build IndexFile), then tells listeners which queues grew.

It reads up to `end_offset()`: the written end under ASYNC_FLUSH, the flushed end under SYNC_FLUSH (RocketMQ 5's
confirmOffset rule: a consumer never sees what a crash could still take back). A background thread runs it, woken by
every append and every flush; a reader that needs entries not yet dispatched runs it inline instead of waiting
(`catch_up`), so reading your own write costs no thread hand-off. Without the thread appends dispatch inline.
A batch that cannot be written (a full disk) is logged and dispatched again on the next round: the messages are
stored, and neither the append nor a reader that caught up inline sees the error.

What it hands on is a DispatchBatch: the messages' DispatchRequest fields as numpy columns. The appender, which
knows every field of the messages it put, offers them (`offer`, in CommitLog order, under the put lock); the
dispatcher takes an offered batch when it starts exactly where dispatching is and lies below the end offset (the
part below it, when the end cuts it), and reads the CommitLog - the format of codec/rocketmq_message.py, message by
message - for everything else: after a restart (recovery re-dispatches from the checkpoint), after a failed round,
or when offers were dropped (at most MAX_OFFERED_MESSAGES wait; older ones are dropped and read back instead). What
is dispatched, when, and in which order is the same either way. It writes nothing itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tidelog.codec.rocketmq_message import (
    PROPERTY_TAGS,
    Blank,
    DispatchInfo,
    IndexKeys,
    InvalidMessage,
    decode_dispatch_info,
    property_value,
    tags_code,
)
from tidelog.errors import KafkaStorageError
from tidelog.storage.rocketmq.commitlog import CommitLog

log = logging.getLogger("tidelog.storage.rocketmq")

BATCH_MESSAGES = 2048
IDLE_WAIT_SECONDS = 0.1
ROUND_INTERVAL_SECONDS = 0.001  # RocketMQ's reput loop sleeps 1 ms a round: the appends of that time go together
MAX_OFFERED_MESSAGES = 1 << 16  # offered messages kept for the dispatcher; older offers are dropped (read back)


@dataclass(frozen=True, slots=True)
class QueueRun:
    """Messages [start, stop) of a DispatchBatch, consecutive in the CommitLog, all of one queue."""

    topic: str
    queue_id: int
    start: int
    stop: int


@dataclass(slots=True)
class DispatchBatch:
    """Messages in CommitLog order, as columns of what the dispatch chain needs (RocketMQ's DispatchRequest).

    The index keys come as `keys` from the appender, or, for a batch read back from the CommitLog, from the
    messages' `properties`, which the IndexFile builder reads them from."""

    offsets: np.ndarray  # int64 CommitLog offsets
    sizes: np.ndarray  # int64 TOTALSIZE
    queue_offsets: np.ndarray  # int64
    store_timestamps: np.ndarray  # int64
    sys_flags: np.ndarray  # int64
    tags_codes: np.ndarray  # int64
    runs: list[QueueRun]
    keys: IndexKeys | None = None
    properties: Sequence[bytes] | None = None
    # int64 FLAG of each message (a Kafka batch's transactional and control attributes), for a batch read back from
    # the CommitLog; None for a batch the appender offered (it applied the attributes itself). A slave reads back.
    flags: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def end(self) -> int:
        """The CommitLog offset after the last message."""
        return int(self.offsets[-1] + self.sizes[-1])

    @classmethod
    def from_infos(cls, items: Sequence[tuple[int, DispatchInfo]]) -> DispatchBatch:
        """A batch of messages read back from the CommitLog (decode_dispatch_info)."""
        runs: list[QueueRun] = []
        for index, (_offset, info) in enumerate(items):
            if runs and (runs[-1].topic, runs[-1].queue_id) == (info.topic, info.queue_id):
                runs[-1] = QueueRun(info.topic, info.queue_id, runs[-1].start, index + 1)
            else:
                runs.append(QueueRun(info.topic, info.queue_id, index, index + 1))
        columns = np.array(
            [
                (offset, i.total_size, i.queue_offset, i.store_timestamp, i.sys_flag, _tags_code(i), i.flag)
                for offset, i in items
            ],
            dtype=np.int64,
        ).reshape(-1, 7)
        offsets, sizes, queue_offsets, store_timestamps, sys_flags, tags_codes, flags = columns.T.copy()
        return cls(
            offsets, sizes, queue_offsets, store_timestamps, sys_flags, tags_codes, runs,
            properties=[info.properties for _offset, info in items], flags=flags,
        )  # fmt: skip

    def head(self, count: int) -> DispatchBatch:
        """The first `count` messages."""
        return self._rows(slice(0, count), 0, count)

    def tail(self, start: int) -> DispatchBatch:
        """The messages from `start` on."""
        return self._rows(slice(start, None), start, len(self))

    def _rows(self, rows: slice, start: int, stop: int) -> DispatchBatch:
        runs = [
            QueueRun(r.topic, r.queue_id, max(r.start, start) - start, min(r.stop, stop) - start)
            for r in self.runs
            if r.stop > start and r.start < stop
        ]
        return DispatchBatch(
            self.offsets[rows], self.sizes[rows], self.queue_offsets[rows], self.store_timestamps[rows],
            self.sys_flags[rows], self.tags_codes[rows], runs,
            None if self.keys is None else self.keys.rows(start, stop),
            None if self.properties is None else self.properties[rows],
            None if self.flags is None else self.flags[rows],
        )  # fmt: skip

    @classmethod
    def concatenate(cls, batches: Sequence[DispatchBatch]) -> DispatchBatch:
        """Several offered batches (consecutive, all with their keys or all without) as one."""
        if len(batches) == 1:
            return batches[0]
        runs: list[QueueRun] = []
        at = 0
        for batch in batches:
            runs += [QueueRun(r.topic, r.queue_id, r.start + at, r.stop + at) for r in batch.runs]
            at += len(batch)
        keyed = batches[0].keys is not None

        def join(name: str) -> np.ndarray:
            return np.concatenate([getattr(b, name) for b in batches])

        return cls(
            join("offsets"), join("sizes"), join("queue_offsets"), join("store_timestamps"), join("sys_flags"),
            join("tags_codes"), runs, IndexKeys.concatenate([b.keys for b in batches]) if keyed else None,  # type: ignore[misc]
        )  # fmt: skip


def _tags_code(info: DispatchInfo) -> int:
    return tags_code(property_value(info.properties, PROPERTY_TAGS)) if b"TAGS\x01" in info.properties else 0


Dispatcher = Callable[[DispatchBatch], None]


class ReputMessageService:
    def __init__(
        self,
        commitlog: CommitLog,
        end_offset: Callable[[], int],
        dispatchers: list[Dispatcher],
        *,
        background: bool,
    ) -> None:
        self.commitlog = commitlog
        self.end_offset = end_offset
        self.dispatchers = dispatchers
        self.reput_from_offset = 0
        self.last_store_timestamp = 0  # of the last message dispatched (the checkpoint's logics timestamp)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._running = background
        self._stuck_at = -1
        self._failed_at = -1  # where a dispatch failed to write (a full disk), until one succeeds
        self._thread: threading.Thread | None = None
        self._offered: deque[DispatchBatch] = deque()
        self._offered_messages = 0
        self._offer_lock = threading.Lock()

    def start(self) -> None:
        if self._running and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tidelog-reput", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        """Is a background thread dispatching? (Else appends dispatch inline.)"""
        return self._thread is not None

    def wakeup(self) -> None:
        self._wake.set()

    @property
    def behind_bytes(self) -> int:
        """dispatchBehindBytes: what the CommitLog holds that the queues do not yet."""
        return max(0, self.end_offset() - self.reput_from_offset)

    def offer(self, batch: DispatchBatch) -> None:
        """The dispatch columns of messages just put (called in CommitLog order, under the put lock)."""
        with self._offer_lock:
            self._offered.append(batch)
            self._offered_messages += len(batch)
            while self._offered_messages > MAX_OFFERED_MESSAGES and len(self._offered) > 1:
                self._offered_messages -= len(self._offered.popleft())

    def catch_up(self) -> int:
        """Dispatch everything up to the current end, in the calling thread."""
        return self.do_reput()

    def do_reput(self) -> int:
        dispatched = 0
        with self._lock:
            end = self.end_offset()
            while self.reput_from_offset < end:
                batch, next_offset = self._take_offered(self.reput_from_offset, end)
                if batch is None:
                    batch, next_offset = self._read_batch(self.reput_from_offset, next_offset)
                if not len(batch):
                    if next_offset == self.reput_from_offset:
                        if self._stuck_at != next_offset:
                            self._stuck_at = next_offset
                            log.error("dispatcher: cannot read a message at CommitLog offset %d", next_offset)
                        break
                    self.reput_from_offset = next_offset
                    continue
                try:
                    for dispatch in self.dispatchers:
                        dispatch(batch)
                except (KafkaStorageError, OSError) as exc:  # the batch goes again next round (idempotent)
                    if self._failed_at != self.reput_from_offset:
                        self._failed_at = self.reput_from_offset
                        log.error(
                            "dispatcher: cannot dispatch from CommitLog offset %d (%s); the messages are stored and "
                            "become readable once their ConsumeQueues can be written",
                            self.reput_from_offset,
                            exc,
                        )
                    break
                if self._failed_at >= 0:
                    log.warning("dispatcher: dispatching again from CommitLog offset %d", self.reput_from_offset)
                    self._failed_at = -1
                self.last_store_timestamp = int(batch.store_timestamps[-1])
                self.reput_from_offset = next_offset
                dispatched += len(batch)
        return dispatched

    def hold(self, action: Callable[[], None], *, rewind_to: int | None = None) -> None:
        """Run `action` with dispatching held. `rewind_to`: the action cut the CommitLog there; offers are dropped
        and dispatching goes on from it."""
        with self._lock:
            action()
            if rewind_to is not None:
                with self._offer_lock:
                    self._offered.clear()
                    self._offered_messages = 0
                self.reput_from_offset = min(self.reput_from_offset, rewind_to)

    def _take_offered(self, start: int, end: int) -> tuple[DispatchBatch | None, int]:
        """Offered messages from `start` on that end by `end` (up to BATCH_MESSAGES, at least one offer), and where
        dispatching goes on after them; or None and where to read the CommitLog up to (the next offer's start, or
        `end`). Offers below `start` (dispatched by reading) are dropped."""
        taken: list[DispatchBatch] = []
        count = 0
        offered = self._offered
        with self._offer_lock:
            while offered and offered[0].end <= start:
                self._offered_messages -= len(offered.popleft())
            if offered and offered[0].offsets[0] < start:  # partly dispatched by reading
                head = offered[0]
                offered[0] = head.tail(int(head.offsets.searchsorted(start)))
                self._offered_messages -= len(head) - len(offered[0])
            cursor = start
            while offered and int(offered[0].offsets[0]) == cursor and count < BATCH_MESSAGES:
                head = offered[0]
                fitting = len(head) if head.end <= end else int((head.offsets + head.sizes).searchsorted(end, "right"))
                fitting = min(fitting, BATCH_MESSAGES - count) if taken else fitting
                if fitting == 0:
                    break
                if fitting < len(head):
                    offered[0] = head.tail(fitting)
                    head = head.head(fitting)
                else:
                    offered.popleft()
                self._offered_messages -= len(head)
                taken.append(head)
                count += len(head)
                cursor = head.end
            if not taken:
                next_start = int(offered[0].offsets[0]) if offered else end
                return None, min(end, next_start) if next_start > start else end
        return DispatchBatch.concatenate(taken), cursor

    def _read_batch(self, start: int, end: int) -> tuple[DispatchBatch, int]:
        batch: list[tuple[int, DispatchInfo]] = []
        offset = start
        file_size = self.commitlog.file_size
        while offset < end and len(batch) < BATCH_MESSAGES:
            mapped_file = self.commitlog.queue.find(offset)
            if mapped_file is None or mapped_file.map is None:
                if offset < self.commitlog.min_offset:  # retention deleted what was never dispatched
                    log.warning("dispatcher: skipping to %d, the CommitLog's new start", self.commitlog.min_offset)
                    offset = self.commitlog.min_offset
                    continue
                break
            base = mapped_file.file_from_offset
            position = offset - base
            limit = min(end - base, mapped_file.wrote_position)
            if position >= limit:
                if mapped_file.is_full:
                    offset = base + file_size
                    continue
                break
            try:
                item = decode_dispatch_info(mapped_file.map, position, limit)
            except InvalidMessage as exc:
                if self._stuck_at != offset:
                    log.error("dispatcher: %s", exc)
                break
            if isinstance(item, Blank):
                offset = base + file_size
                continue
            batch.append((offset, item))
            offset += item.total_size
        return DispatchBatch.from_infos(batch), offset

    def _run(self) -> None:
        while self._running:
            self._wake.wait(IDLE_WAIT_SECONDS)
            time.sleep(ROUND_INTERVAL_SECONDS)
            self._wake.clear()
            if not self._running:
                return
            try:
                self.do_reput()
            except Exception:
                log.exception("dispatcher round failed; retrying")
                time.sleep(0.1)

    def shutdown(self) -> None:
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
